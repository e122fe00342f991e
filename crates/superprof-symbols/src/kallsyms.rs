//! Kernel symbols from /proc/kallsyms, or from a file in its format (a copy of a guest's
//! /proc/kallsyms, or a System.map: `ADDRESS TYPE NAME [MODULE]` per line).

/// The largest symbols file read.
pub const MAX_FILE: u64 = 256 << 20;
/// The longest name kept (longer ones are cut).
const MAX_NAME: usize = 512;

/// Sorted kernel text symbols. Empty (all addresses zero) when kptr_restrict hides them.
///
/// The names live in one buffer (a kernel has some 150,000 symbols: one allocation each
/// cost more than reading them).
#[derive(Clone)]
pub struct Kallsyms {
    /// Address, the name's range in `names`, and the module's index in `modules` plus one (0:
    /// the kernel's own).
    symbols: Vec<(u64, u32, u32, u32)>,
    names: String,
    /// Module names (`ext4` for `[ext4]`), each once.
    modules: Vec<String>,
}

impl Kallsyms {
    /// The running kernel's text symbols from /proc/kallsyms; empty when it cannot be read or
    /// kptr_restrict hides the addresses.
    pub fn load() -> Kallsyms {
        let text = std::fs::read_to_string("/proc/kallsyms").unwrap_or_default();
        Self::parse(&text)
    }

    /// A symbols file (kallsyms or System.map format), at most `MAX_FILE` (256 MiB) bytes.
    pub fn from_file(path: &std::path::Path) -> std::io::Result<Kallsyms> {
        use std::io::Read;
        let f = superprof_unwind::open_input(path)?;
        let mut bytes = Vec::new();
        f.take(MAX_FILE + 1).read_to_end(&mut bytes)?;
        if bytes.len() as u64 > MAX_FILE {
            return Err(std::io::Error::other(format!(
                "more than {} MiB",
                MAX_FILE >> 20
            )));
        }
        let k = Self::parse(&String::from_utf8_lossy(&bytes));
        if k.symbols.is_empty() {
            return Err(std::io::Error::other(
                "no text symbols in it (lines of ADDRESS TYPE NAME, as /proc/kallsyms or \
                 System.map; addresses all zero when kptr_restrict hid them)",
            ));
        }
        Ok(k)
    }

    /// Parses kallsyms or System.map text: text symbols only (types `t`, `T`, `w`, `W`) with a
    /// nonzero address, names cut at 512 bytes; other lines are skipped.
    pub fn parse(text: &str) -> Kallsyms {
        let mut k = Kallsyms {
            symbols: Vec::new(),
            names: String::with_capacity(text.len() / 2),
            modules: Vec::new(),
        };
        let mut module_index: std::collections::HashMap<&str, u32> = Default::default();
        for line in text.lines() {
            let mut parts = line.split_ascii_whitespace();
            let (Some(addr), Some(kind), Some(name)) = (parts.next(), parts.next(), parts.next())
            else {
                continue;
            };
            if !matches!(kind, "t" | "T" | "w" | "W") {
                continue;
            }
            let Ok(addr) = u64::from_str_radix(addr, 16) else {
                continue;
            };
            if addr == 0 {
                continue;
            }
            let module = match parts
                .next()
                .and_then(|m| m.strip_prefix('[')?.strip_suffix(']'))
            {
                Some(m) => {
                    let m = cut(m);
                    *module_index.entry(m).or_insert_with(|| {
                        k.modules.push(m.to_owned());
                        k.modules.len() as u32
                    })
                }
                None => 0,
            };
            // (Past 4 GiB of names, a file no kernel writes: the rest is left out.)
            let (Ok(at), Ok(len)) = (u32::try_from(k.names.len()), u32::try_from(cut(name).len()))
            else {
                break;
            };
            k.names.push_str(cut(name));
            k.symbols.push((addr, at, len, module));
        }
        k.symbols.sort_unstable_by_key(|s| s.0);
        k
    }

    fn name(&self, at: u32, len: u32) -> &str {
        self.names
            .get(at as usize..at as usize + len as usize)
            .unwrap_or("")
    }

    /// The function that contains `addr`, if kernel symbols are readable.
    pub fn lookup(&self, addr: u64) -> Option<&str> {
        self.lookup_with_module(addr).map(|(name, _)| name)
    }

    /// The function that contains `addr`, and its module when it is a module's.
    pub fn lookup_with_module(&self, addr: u64) -> Option<(&str, Option<&str>)> {
        let i = self.symbols.partition_point(|s| s.0 <= addr);
        let &(_, at, len, module) = self.symbols.get(i.checked_sub(1)?)?;
        let module = module
            .checked_sub(1)
            .and_then(|m| self.modules.get(m as usize))
            .map(String::as_str);
        Some((self.name(at, len), module))
    }

    /// The address of the first text symbol called `name` (of the kernel, not a module).
    pub fn address_of(&self, name: &str) -> Option<u64> {
        self.symbols
            .iter()
            .find(|&&(_, at, len, m)| m == 0 && self.name(at, len) == name)
            .map(|s| s.0)
    }

    /// The same symbols `offset` higher (wrapping): a System.map's link addresses moved to
    /// where a relocated (KASLR) kernel runs, or the reverse.
    pub fn shifted(&self, offset: u64) -> Kallsyms {
        let mut k = self.clone();
        for s in &mut k.symbols {
            s.0 = s.0.wrapping_add(offset);
        }
        k.symbols.sort_unstable_by_key(|s| s.0);
        k
    }

    /// Whether there is no symbol (nothing readable, or all addresses hidden).
    pub fn is_empty(&self) -> bool {
        self.symbols.is_empty()
    }
}

/// At most [`MAX_NAME`] bytes of `s`, cut at a character boundary.
fn cut(s: &str) -> &str {
    if s.len() <= MAX_NAME {
        return s;
    }
    let mut end = MAX_NAME;
    while !s.is_char_boundary(end) {
        end -= 1;
    }
    &s[..end]
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn kallsyms_and_system_map_lines() {
        let k = Kallsyms::parse(
            "ffffffff81000000 T _text\n\
             ffffffff81000000 T startup_64\n\
             ffffffff81001000 t helper\n\
             ffffffff82000000 D some_data\n\
             ffffffffc0001000 t ext4_read\t[ext4]\n\
             0000000000000000 T hidden\n\
             garbage line\n\
             ffffffffzz T bad_hex\n",
        );
        assert_eq!(k.lookup(0xffffffff81000010), Some("startup_64"));
        assert_eq!(k.lookup(0xffffffff81001234), Some("helper"));
        assert_eq!(
            k.lookup_with_module(0xffffffffc0001008),
            Some(("ext4_read", Some("ext4")))
        );
        assert_eq!(k.lookup(0xffffffff80000000), None);
        assert_eq!(k.address_of("_text"), Some(0xffffffff81000000));
        assert_eq!(k.address_of("ext4_read"), None);
        let moved = k.shifted(0xa800000);
        assert_eq!(moved.lookup(0xffffffff8b801234), Some("helper"));
        let long = format!("ffffffff81000000 T {}\n", "é".repeat(400));
        assert!(
            Kallsyms::parse(&long)
                .lookup(0xffffffff81000000)
                .unwrap()
                .len()
                <= MAX_NAME
        );
    }
}
