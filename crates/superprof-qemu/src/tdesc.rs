//! The registers of a gdbstub's target description (`qXfer:features:read`): names, sizes and
//! numbers, in the order of the `g` packet. The XML comes from the peer: only `<reg>` tags and
//! `<xi:include href=...>` are looked at, with caps on their number and the names' lengths.

/// The most registers taken from a description.
pub const MAX_REGS: usize = 8192;
/// The most files one description may include.
pub const MAX_INCLUDES: usize = 64;

/// One register: its name, size in bits and number (`p` packet).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Reg {
    /// The name the description gives it (`rip`, `cr3`, `TTBR0_EL1`).
    pub name: String,
    /// Its size in bits (1 to 4096).
    pub bits: u32,
    /// Its number for `p` packets: the file's `regnum`, else one past the register before.
    pub regnum: u32,
}

/// The value of attribute `name` in one tag's text (`name="value"` or `name='value'`).
fn attr<'a>(tag: &'a str, name: &str) -> Option<&'a str> {
    let mut rest = tag;
    while let Some(i) = rest.find(name) {
        let before = rest[..i].chars().last();
        let after = rest[i + name.len()..].trim_start();
        rest = &rest[i + name.len()..];
        if !before.is_some_and(char::is_whitespace) {
            continue;
        }
        let Some(v) = after.strip_prefix('=') else {
            continue;
        };
        let v = v.trim_start();
        let q = v.chars().next()?;
        if q != '"' && q != '\'' {
            return None;
        }
        let v = &v[1..];
        return Some(&v[..v.find(q)?]);
    }
    None
}

/// What one XML file holds, in document order.
#[derive(Debug, PartialEq, Eq)]
pub enum Item {
    /// A register; `regnum` when the file gives it.
    Reg {
        /// The `name` attribute (at most 64 bytes).
        name: String,
        /// The `bitsize` attribute (1 to 4096).
        bits: u32,
        /// The `regnum` attribute, where given.
        regnum: Option<u32>,
    },
    /// Another file of the description.
    Include(String),
}

/// Whether `href` is a plain file name (no path, nothing for the packet to act on).
fn plain_name(href: &str) -> bool {
    !href.is_empty()
        && href.len() <= 128
        && href
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.'))
        && !href.starts_with('.')
}

/// The `<reg>` and `<xi:include>` tags of one file, comments left out (QEMU's x86_64
/// description has registers commented out: counting them would shift every number after).
pub fn items(xml: &str) -> Vec<Item> {
    let mut out = Vec::new();
    let mut rest = xml;
    while let Some(i) = rest.find('<') {
        if rest[i..].starts_with("<!--") {
            rest = rest[i + 4..]
                .find("-->")
                .map_or("", |e| &rest[i + 4 + e + 3..]);
            continue;
        }
        rest = &rest[i + 1..];
        let end = rest.find('>').unwrap_or(rest.len());
        let tag = &rest[..end];
        rest = &rest[end..];
        if out.len() >= MAX_REGS {
            break;
        }
        if let Some(t) = tag
            .strip_prefix("reg")
            .filter(|t| t.starts_with(char::is_whitespace))
        {
            let (Some(name), Some(bits)) = (attr(t, "name"), attr(t, "bitsize")) else {
                continue;
            };
            let Ok(bits) = bits.parse::<u32>() else {
                continue;
            };
            if name.len() > 64 || bits == 0 || bits > 4096 {
                continue;
            }
            out.push(Item::Reg {
                name: name.to_owned(),
                bits,
                regnum: attr(t, "regnum").and_then(|n| n.parse().ok()),
            });
        } else if let Some(t) = tag
            .strip_prefix("xi:include")
            .filter(|t| t.starts_with(char::is_whitespace))
        {
            if let Some(href) = attr(t, "href").filter(|h| plain_name(h)) {
                out.push(Item::Include(href.to_owned()));
            }
        }
    }
    out
}

/// The registers of a description whose files `fetch` reads by name, starting at
/// `target.xml`; numbered as gdb does (a register without `regnum` follows the one before).
pub fn registers(fetch: &mut dyn FnMut(&str) -> crate::Result<String>) -> crate::Result<Vec<Reg>> {
    let mut regs = Vec::new();
    let mut next = 0u32;
    let mut files = 0;
    // Files to read, depth first (an include is read where it stands).
    let mut stack: Vec<std::vec::IntoIter<Item>> = vec![items(&fetch("target.xml")?).into_iter()];
    while let Some(top) = stack.last_mut() {
        let Some(item) = top.next() else {
            stack.pop();
            continue;
        };
        match item {
            Item::Reg { name, bits, regnum } => {
                let regnum = regnum.unwrap_or(next);
                next = regnum.saturating_add(1);
                if regs.len() < MAX_REGS {
                    regs.push(Reg { name, bits, regnum });
                }
            }
            Item::Include(href) => {
                files += 1;
                if files > MAX_INCLUDES || stack.len() > 8 {
                    return Err(crate::QemuError::Protocol(
                        "the gdbstub's target description includes too many files".into(),
                    ));
                }
                stack.push(items(&fetch(&href)?).into_iter());
            }
        }
    }
    Ok(regs)
}

/// Where register `name` (any case) is: its number, and its byte offset in the `g` packet when
/// every register before it has a number below it and a whole number of bytes.
pub fn locate(regs: &[Reg], name: &str) -> Option<(u32, Option<usize>)> {
    let r = regs.iter().find(|r| r.name.eq_ignore_ascii_case(name))?;
    let mut before: Vec<&Reg> = regs.iter().filter(|x| x.regnum < r.regnum).collect();
    before.sort_by_key(|x| x.regnum);
    let contiguous = before.iter().enumerate().all(|(i, x)| x.regnum == i as u32)
        && before.len() == r.regnum as usize
        && before.iter().all(|x| x.bits % 8 == 0);
    let offset = contiguous.then(|| before.iter().map(|x| (x.bits / 8) as usize).sum());
    Some((r.regnum, offset))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn registers_follow_includes_and_numbering() {
        let files = |name: &str| -> crate::Result<String> {
            Ok(match name {
                "target.xml" => {
                    r#"<?xml version="1.0"?><target><architecture>i386:x86-64</architecture>
                    <xi:include href="core.xml"/><xi:include href="sys.xml"/></target>"#
                }
                "core.xml" => {
                    r#"<feature name="org.gnu.gdb.i386.core">
                    <reg name="rax" bitsize="64"/><reg name='rbx' bitsize='64'/>
                    <reg name="eflags" bitsize="32" type="i386_eflags"/>
                    <!--reg name="cs_base" bitsize="64"/--><!-- <reg name="x" bitsize="8"/> -->
                    <reg name="st0" bitsize="80"/></feature>"#
                }
                "sys.xml" => {
                    r#"<feature><reg name="cr0" bitsize="64" regnum="10"/>
                    <reg name="cr3" bitsize="64"/></feature>"#
                }
                _ => "",
            }
            .to_owned())
        };
        let regs = registers(&mut { files }).unwrap();
        let names: Vec<_> = regs.iter().map(|r| (r.name.as_str(), r.regnum)).collect();
        assert_eq!(
            names,
            [
                ("rax", 0),
                ("rbx", 1),
                ("eflags", 2),
                ("st0", 3),
                ("cr0", 10),
                ("cr3", 11)
            ]
        );
        assert_eq!(locate(&regs, "RBX"), Some((1, Some(8))));
        assert_eq!(locate(&regs, "eflags"), Some((2, Some(16))));
        // 80-bit st0 is 10 bytes; the numbers 4..9 are missing: no offset for cr3.
        assert_eq!(locate(&regs, "cr3"), Some((11, None)));
        assert_eq!(locate(&regs, "ttbr0_el1"), None);
    }

    #[test]
    fn hostile_descriptions() {
        // Includes that name paths, or loop, are refused or cut.
        assert_eq!(items(r#"<xi:include href="../../etc/passwd"/>"#), vec![]);
        assert_eq!(items(r#"<xi:include href="a$b.xml"/>"#), vec![]);
        let mut looping = |_: &str| -> crate::Result<String> {
            Ok(r#"<xi:include href="target.xml"/>"#.to_owned())
        };
        assert!(registers(&mut looping).is_err());
        // Broken tags, absurd sizes, unterminated quotes: skipped.
        let v = items(r#"<reg name="a" bitsize="0"/><reg name="b" bitsize="99999"/><reg name="c"#);
        assert!(v.is_empty());
        let v = items(
            r#"<reg name="x" bitsize="64" regnum="4294967295"/><reg name="y" bitsize="64"/>"#,
        );
        assert_eq!(v.len(), 2);
        let mut one =
            |_: &str| -> crate::Result<String> {
                Ok(r#"<reg name="x" bitsize="64" regnum="4294967295"/><reg name="y" bitsize="64"/>"#
                .to_owned())
            };
        let regs = registers(&mut one).unwrap();
        assert_eq!(regs[1].regnum, u32::MAX);
        // Too many registers: capped.
        let many = "<reg name=\"r\" bitsize=\"8\"/>".repeat(MAX_REGS + 10);
        assert_eq!(items(&many).len(), MAX_REGS);
    }
}
