//! Regions of a program, as `stat` and `blocks` take them: a function, an address range of the
//! executable, or a range of source lines.

use crate::{bail, err, Context, Result};

/// A region the user asked for.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RegionSpec {
    /// A function by name (exact, else a unique substring).
    Function(String),
    /// ELF virtual addresses of the executable, END exclusive.
    Range(u64, u64),
    /// Source lines: from the first code of FILE1:LINE1 to the end of the code of FILE2:LINE2.
    Lines(String, u32, String, u32),
}

impl RegionSpec {
    /// Reads `0xSTART-0xEND`, `FILE:LINE-LINE`, `FILE:LINE-FILE:LINE`, else a function name.
    pub fn parse(s: &str) -> Result<RegionSpec> {
        if let Some((a, b)) = s.split_once('-') {
            if let (Some(a), Some(b)) = (a.strip_prefix("0x"), b.strip_prefix("0x")) {
                let a = u64::from_str_radix(a, 16)
                    .map_err(|_| err!("bad range '{s}': use 0xSTART-0xEND"))?;
                let b = u64::from_str_radix(b, 16)
                    .map_err(|_| err!("bad range '{s}': use 0xSTART-0xEND"))?;
                if a >= b {
                    bail!("bad range '{s}': the start must be below the end");
                }
                return Ok(RegionSpec::Range(a, b));
            }
            if a.starts_with("0x") || b.starts_with("0x") {
                bail!("bad range '{s}': use 0xSTART-0xEND");
            }
        }
        if s.is_empty() {
            bail!("empty region name");
        }
        if let Some(lines) = parse_lines(s) {
            return lines;
        }
        Ok(RegionSpec::Function(s.to_owned()))
    }

    /// The region as the user wrote it (a canonical spelling).
    pub fn label(&self) -> String {
        match self {
            RegionSpec::Function(f) => f.clone(),
            RegionSpec::Range(a, b) => format!("{a:#x}-{b:#x}"),
            RegionSpec::Lines(f1, l1, f2, l2) if f1 == f2 => format!("{f1}:{l1}-{l2}"),
            RegionSpec::Lines(f1, l1, f2, l2) => format!("{f1}:{l1}-{f2}:{l2}"),
        }
    }
}

/// `FILE:LINE-LINE` or `FILE:LINE-FILE:LINE` (a C++ name such as `ns::f` is not one).
fn parse_lines(s: &str) -> Option<Result<RegionSpec>> {
    let (first, second) = s.split_once('-')?;
    let (f1, l1) = first.rsplit_once(':')?;
    if f1.is_empty()
        || f1.ends_with(':')
        || !l1.chars().all(|c| c.is_ascii_digit())
        || l1.is_empty()
    {
        return None;
    }
    let (f2, l2) = match second.rsplit_once(':') {
        Some((f, l)) => (f, l),
        None => (f1, second),
    };
    let bad = || {
        Some(Err(err!(
            "bad range '{s}': use FILE:LINE-LINE or FILE:LINE-FILE:LINE"
        )))
    };
    let (Ok(l1), Ok(l2)) = (l1.parse::<u32>(), l2.parse::<u32>()) else {
        return bad();
    };
    if f1 == f2 && l1 > l2 {
        return bad();
    }
    Some(Ok(RegionSpec::Lines(f1.to_owned(), l1, f2.to_owned(), l2)))
}

/// ELF addresses [start, end) of a source range in one file (`path`, readable at `open_path`):
/// all the code its lines compile to, from the lowest address to the end of the highest (in
/// one source file: every line of the range that has code; across two: the first line's code
/// to the last line's).
pub fn line_range_in(
    symbolizer: &mut superprof_symbols::Symbolizer,
    path: &std::path::Path,
    open_path: &std::path::Path,
    (f1, l1): (&str, u32),
    (f2, l2): (&str, u32),
) -> Option<(u64, u64)> {
    let mut rows = |f: &str, lines| symbolizer.line_rows(path, open_path, f, lines);
    let (first, last) = if f1 == f2 {
        let all = rows(f1, l1..=l2);
        (all.clone(), all)
    } else {
        (rows(f1, l1..=l1), rows(f2, l2..=l2))
    };
    let start = first.first()?.0;
    let end = last.iter().map(|(a, n)| a + n).max()?;
    (end > start).then_some((start, end))
}

/// Runtime addresses [start, end) of a source range ([`line_range_in`]), in the first file
/// of process `pid` whose DWARF has them.
pub fn line_range(
    symbolizer: &mut superprof_symbols::Symbolizer,
    pid: u32,
    first: (&str, u32),
    last: (&str, u32),
) -> Option<(u64, u64)> {
    superprof_symbols::mapped_files(pid)
        .ok()?
        .into_iter()
        .find_map(|file| {
            let (a, b) = line_range_in(symbolizer, &file.path, &file.open_path, first, last)?;
            Some((a.wrapping_add(file.bias), b.wrapping_add(file.bias)))
        })
}

/// The load bias of the main executable.
pub fn exe_bias(pid: u32) -> Option<u64> {
    let exe = std::fs::read_link(format!("/proc/{pid}/exe")).ok()?;
    superprof_symbols::mapped_files(pid)
        .ok()?
        .into_iter()
        .find(|f| f.path == exe)
        .map(|f| f.bias)
}

/// The one function a region name means (exact, else a unique substring of one of the
/// program's own functions): None when there is none, an error naming them when several.
/// `substrings`: substrings may be tried (not before ld.so has mapped the libraries: `malloc`
/// would be a program's `xmalloc` while libc's is still to come).
pub fn unique_function(
    pid: u32,
    name: &str,
    substrings: bool,
) -> Result<Option<superprof_symbols::FunctionAddress>> {
    let found = if substrings {
        superprof_symbols::find_functions_matching(pid, name)?
    } else {
        superprof_symbols::find_function(pid, name)?
    };
    let mut names: Vec<&str> = found.iter().map(|f| f.name.as_str()).collect();
    names.sort();
    names.dedup();
    if names.len() > 1 {
        bail!(
            "region '{name}' is ambiguous: it matches {}",
            names[..names.len().min(10)].join(", ")
        );
    }
    // (glibc's memcpy is two symbols: a compatibility version nobody calls, and the default,
    // an ifunc.)
    match found.iter().find(|f| f.ifunc).or(found.first()).cloned() {
        Some(f) if f.ifunc => bail!(
            "'{}' is an indirect function (GNU ifunc): its symbol is the resolver, which the \
             dynamic loader runs once to choose an implementation; give the implementation's \
             name where the symbol table has it (`superprof record` shows it, e.g. \
             __memmove_avx_unaligned_erms for memcpy), or its address range",
            f.name
        ),
        other => Ok(other),
    }
}

/// A region found in a process: runtime addresses `[lo, hi)` (a function without a size in its
/// symbol table: `hi == lo`).
#[derive(Debug, Clone)]
pub struct Found {
    /// The function's own name (a region given by a substring of it), else the spec's label.
    pub name: String,
    pub lo: u64,
    pub hi: u64,
    /// The function a function region is.
    pub function: Option<superprof_symbols::FunctionAddress>,
}

/// Where region `spec` is in process `pid`, the one turning of a spec into addresses that
/// `stat` and `blocks` share: a function by [`unique_function`] (`substrings` as there), source
/// lines by [`line_range`], an address range moved by the executable's load bias. Ok(None): a
/// function or source lines not found (yet: in a library not loaded).
pub fn find(
    pid: u32,
    spec: &RegionSpec,
    symbols: &mut superprof_symbols::Symbolizer,
    substrings: bool,
) -> Result<Option<Found>> {
    Ok(match spec {
        RegionSpec::Function(name) => unique_function(pid, name, substrings)?.map(|f| Found {
            name: f.name.clone(),
            lo: f.addr,
            hi: f.addr.saturating_add(f.size),
            function: Some(f),
        }),
        RegionSpec::Lines(f1, l1, f2, l2) => {
            line_range(symbols, pid, (f1, *l1), (f2, *l2)).map(|(lo, hi)| Found {
                name: spec.label(),
                lo,
                hi,
                function: None,
            })
        }
        RegionSpec::Range(a, b) => {
            let bias = exe_bias(pid).context("cannot find the executable's load address")?;
            Some(Found {
                name: spec.label(),
                lo: a.wrapping_add(bias),
                hi: b.wrapping_add(bias),
                function: None,
            })
        }
    })
}

/// The error for source lines with no code.
pub fn no_code(spec: &RegionSpec) -> crate::Error {
    err!(
        "no code for {} (is the program built with -g, and is the file name right?)",
        spec.label()
    )
}

/// The message for a function never found, with near names.
pub fn not_found(pid: u32, name: &str) -> String {
    // Names from the program are printed escaped (a hostile symbol cannot drive the terminal).
    let near: Vec<String> = suggestions(pid, name)
        .iter()
        .map(|n| superprof_profile::escape(n).into_owned())
        .collect();
    format!(
        "no function '{}' in the program or its libraries{}",
        superprof_profile::escape(name),
        if near.is_empty() {
            String::new()
        } else {
            format!("; did you mean {}?", near.join(", "))
        }
    )
}

/// Function names close to `name` (see [`superprof_profile::near_names`]), for an error
/// message.
pub fn suggestions(pid: u32, name: &str) -> Vec<String> {
    superprof_profile::near_names(
        name,
        superprof_symbols::function_names(pid).unwrap_or_default(),
    )
}

/// When the regions of a program are looked for, the same for `stat` and `blocks`: at exec
/// (the executable is mapped), at each change of ld.so's link map (`_dl_debug_state`: the
/// libraries it maps at start, before their constructors run; dlopen) and at the program's
/// entry point, until every region is placed. Its breakpoints are its own ("control"); one at an address the caller
/// probes too stays in place.
#[derive(Debug, Default)]
pub struct Placement {
    entry_bp: Option<u64>,
    dl_bp: Option<u64>,
    execs: u32,
    /// Between an exec and the entry point: the libraries are not mapped yet.
    early: bool,
}

impl Placement {
    /// The program called exec. True when it replaced an image already placed (a wrapper such
    /// as env running the program): the caller forgets what it placed and starts over.
    pub fn exec(&mut self) -> bool {
        self.execs += 1;
        // The old image's breakpoints went with it.
        self.entry_bp = None;
        self.dl_bp = None;
        self.early = true;
        self.execs > 1
    }

    /// After placing at exec (`all`: every region placed): a breakpoint at the entry point
    /// to look again. False when there is none to wait for (every region placed, or no entry
    /// point): what is missing then is missing for good.
    pub fn after_exec(
        &mut self,
        tracer: &mut superprof_trace::Tracer,
        pid: u32,
        all: bool,
    ) -> bool {
        if all {
            self.early = false;
            return false;
        }
        let Some(e) = superprof_symbols::entry_point(pid) else {
            self.early = false;
            return false;
        };
        // Found before either goes in: the breakpoints are written last, just before the
        // thread runs on. A stopped thread with an int3 ahead is at risk if superprof dies
        // (the kernel lets it go, and it may reach the int3 before the janitor puts the byte
        // back): parsing ld.so's symbols takes milliseconds, the thread's stop should not.
        let dl = self.link_map_function(pid);
        if tracer.set_breakpoint(pid, e).is_ok() {
            self.entry_bp = Some(e);
            // And at ld.so's link map changes from now on: the libraries it maps at start are
            // announced there before their constructors run (which call malloc and more:
            // bash's 16 calls before its entry point were missed).
            self.arm_link_map(tracer, pid, dl);
            return true;
        }
        self.early = false;
        false
    }

    /// Where ld.so's `_dl_debug_state` is, if there is an ld.so (and no breakpoint there yet).
    fn link_map_function(&self, pid: u32) -> Option<u64> {
        if self.dl_bp.is_some() {
            return None;
        }
        let found = superprof_symbols::find_function(pid, "_dl_debug_state").unwrap_or_default();
        found.first().map(|f| f.addr)
    }

    /// A breakpoint at ld.so's `_dl_debug_state` (`addr`), if there is an ld.so.
    fn arm_link_map(&mut self, tracer: &mut superprof_trace::Tracer, pid: u32, addr: Option<u64>) {
        if self.dl_bp.is_some() {
            return;
        }
        if let Some(a) = addr {
            if tracer.set_breakpoint(pid, a).is_ok() {
                self.dl_bp = Some(a);
            }
        }
    }

    /// Whether the libraries the program links are mapped (not between its exec and its entry
    /// point): a region name may then be matched as a substring.
    pub fn libraries_mapped(&self) -> bool {
        !self.early
    }

    /// Its breakpoints' addresses.
    pub fn controls(&self) -> impl Iterator<Item = u64> {
        [self.entry_bp, self.dl_bp].into_iter().flatten()
    }

    /// Whether `addr` is one of its breakpoints.
    pub fn is_control(&self, addr: u64) -> bool {
        Some(addr) == self.entry_bp || Some(addr) == self.dl_bp
    }

    /// Whether `addr` is the entry point's (the last look before dlopen: where a region still
    /// missing gets its error).
    pub fn is_entry(&self, addr: u64) -> bool {
        Some(addr) == self.entry_bp
    }

    /// At its breakpoint `addr`, before placing (which can take a while): its breakpoints
    /// come out of the code (those the caller probes too stay: `probed`), so that the stopped
    /// thread sits on the original instruction with no int3 just ahead: if superprof died
    /// meanwhile, the kernel would let the thread go, and it would reach the entry point from
    /// ld.so's `_dl_debug_state` in microseconds, before the janitor could put the byte back.
    /// [`Placement::after_control`] puts back what is still needed, just before it runs on.
    pub fn lift(
        &mut self,
        tracer: &mut superprof_trace::Tracer,
        pid: u32,
        addr: u64,
        probed: &dyn Fn(u64) -> bool,
    ) {
        if self.is_entry(addr) {
            self.early = false;
        }
        if self.is_control(addr) {
            for a in [self.entry_bp, self.dl_bp].into_iter().flatten() {
                if !probed(a) {
                    let _ = tracer.remove_breakpoint(pid, a);
                }
            }
        }
    }

    /// At its breakpoint `addr`, after placing (`all`: every region placed now; `probed`:
    /// the addresses the caller probes too): done with the entry point, it waits at ld.so's
    /// `_dl_debug_state` for libraries opened later; done with every region, it stops. The
    /// breakpoints still wanted go back in (call it just before the thread runs on).
    pub fn after_control(
        &mut self,
        tracer: &mut superprof_trace::Tracer,
        pid: u32,
        addr: u64,
        all: bool,
        probed: &dyn Fn(u64) -> bool,
    ) -> Result<()> {
        let before = [self.entry_bp, self.dl_bp];
        if Some(addr) == self.entry_bp {
            self.entry_bp = None;
            if all {
                self.dl_bp = None;
            } else if self.dl_bp.is_none() {
                // (Without ld.so, never: what is missing is said at the end.)
                self.dl_bp = self.link_map_function(pid);
            }
        } else if Some(addr) == self.dl_bp && all {
            self.dl_bp = None;
        }
        // Lifted (or never in): back where still wanted. No longer wanted: out, unless the
        // caller probes it (then it is the caller's).
        for a in [self.entry_bp, self.dl_bp].into_iter().flatten() {
            if tracer.set_breakpoint(pid, a).is_err() {
                if self.entry_bp == Some(a) {
                    self.entry_bp = None;
                }
                if self.dl_bp == Some(a) {
                    self.dl_bp = None;
                }
            }
        }
        for a in before.into_iter().flatten() {
            if !self.is_control(a) && !probed(a) {
                let _ = tracer.remove_breakpoint(pid, a);
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn regions_as_users_write_them() {
        let f = |s: &str| RegionSpec::Function(s.to_owned());
        let ok = |s: &str| RegionSpec::parse(s).unwrap();
        assert_eq!(ok("fib"), f("fib"));
        // C++ and Rust names are functions, not line ranges or address ranges.
        assert_eq!(ok("ns::f(int)"), f("ns::f(int)"));
        assert_eq!(ok("std::vec::Vec<T>::push"), f("std::vec::Vec<T>::push"));
        assert_eq!(ok("operator-"), f("operator-"));
        assert_eq!(ok("0x1000-0x1040"), RegionSpec::Range(0x1000, 0x1040));
        assert_eq!(
            ok("sum.c:10-20"),
            RegionSpec::Lines("sum.c".into(), 10, "sum.c".into(), 20)
        );
        assert_eq!(
            ok("a.h:5-b.c:7"),
            RegionSpec::Lines("a.h".into(), 5, "b.c".into(), 7)
        );
        for (s, label) in [
            ("fib", "fib"),
            ("0x1000-0x1040", "0x1000-0x1040"),
            ("sum.c:10-20", "sum.c:10-20"),
            ("a.h:5-b.c:7", "a.h:5-b.c:7"),
        ] {
            assert_eq!(ok(s).label(), label);
        }
    }

    #[test]
    fn bad_regions_are_refused() {
        for bad in [
            "",
            "0x2000-0x1000",
            "0x1000-0x1000",
            "0x10-1000",
            "0xzz-0x10",
            "sum.c:20-10",
            "sum.c:10-99999999999",
        ] {
            assert!(RegionSpec::parse(bad).is_err(), "{bad}");
        }
    }
}
