//! The top table: functions by self and total share (like `perf report --no-children`, with
//! both columns).

use std::collections::HashMap;
use std::io::{self, Write};

use crate::{escape, Profile, StrId};

/// One function of the table: its weights, where they go, and how it was seen.
#[derive(Debug, Clone, PartialEq)]
pub struct TopRow {
    /// The function's name.
    pub function: String,
    /// The module it is in, as the profile names it.
    pub module: String,
    /// Weight of samples whose leaf frame is this function.
    pub self_weight: u64,
    /// Weight of samples with this function anywhere in the stack (counted once per sample).
    pub total_weight: u64,
    /// The part of `total_weight` that is off-CPU time (waits and preemptions).
    pub total_off_cpu: u64,
    /// The source line of this function that the most samples pass through (`file:line`).
    pub hottest_line: Option<String>,
    /// The function appears only inlined into others.
    pub inlined: bool,
}

/// Every function that appears in the profile, by self weight, then total weight.
pub fn rows(profile: &Profile) -> Vec<TopRow> {
    let per_stack = profile.weight_per_stack();
    // The off-CPU part of each stack's weight.
    let mut off_per_stack = vec![0u64; per_stack.len()];
    for s in profile.samples.iter().filter(|s| s.kind.is_off_cpu()) {
        if let Some(id) = s.stack {
            let w = &mut off_per_stack[id.0 as usize];
            *w = w.saturating_add(s.weight);
        }
    }
    let mut acc: HashMap<(StrId, StrId), (u64, u64, u64)> = HashMap::new();
    // Per function: weight through each (file, line), and whether it was ever not inlined.
    let mut lines: HashMap<(StrId, StrId), HashMap<(StrId, u32), u64>> = HashMap::new();
    let mut outlined: std::collections::HashSet<(StrId, StrId)> = Default::default();
    let mut seen: Vec<(StrId, StrId)> = Vec::new();
    for (i, &w) in per_stack.iter().enumerate().take(profile.stacks().len()) {
        if w == 0 {
            continue;
        }
        seen.clear();
        let off = off_per_stack[i];
        let leaf = Some(crate::StackId(i as u32));
        for (depth, fid) in profile.stack_frames(leaf).enumerate() {
            let f = profile.frame(fid);
            let key = (f.function, f.module);
            let e = acc.entry(key).or_default();
            if depth == 0 {
                e.0 = e.0.saturating_add(w);
            }
            if !seen.contains(&key) {
                seen.push(key);
                e.1 = e.1.saturating_add(w);
                e.2 = e.2.saturating_add(off);
                if let Some(file) = f.file.filter(|_| f.line > 0) {
                    *lines
                        .entry(key)
                        .or_default()
                        .entry((file, f.line))
                        .or_default() += w;
                }
            }
            if !f.inlined {
                outlined.insert(key);
            }
        }
    }
    let mut out: Vec<TopRow> = acc
        .into_iter()
        .map(|((f, m), (s, t, off))| TopRow {
            function: profile.str(f).to_owned(),
            module: profile.str(m).to_owned(),
            self_weight: s,
            total_weight: t,
            total_off_cpu: off,
            hottest_line: lines.get(&(f, m)).and_then(|l| {
                let ((file, line), _) = l
                    .iter()
                    .max_by_key(|(k, w)| (**w, std::cmp::Reverse(**k)))?;
                let file = profile.str(*file);
                Some(format!(
                    "{}:{}",
                    file.rsplit('/').next().unwrap_or(file),
                    line
                ))
            }),
            inlined: !outlined.contains(&(f, m)),
        })
        .collect();
    out.sort_by(|a, b| {
        b.self_weight
            .cmp(&a.self_weight)
            .then(b.total_weight.cmp(&a.total_weight))
            .then(a.function.cmp(&b.function))
    });
    out
}

/// How a table is laid out: how many rows, full names or shortened ones, and the width of the
/// terminal it is shown on (None: not a terminal, no width to fit).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TableStyle {
    /// The most functions shown.
    pub rows: usize,
    /// Full function names (templates and argument lists kept).
    pub verbose: bool,
    /// The terminal's width in columns, to fit the name columns to; None off a terminal.
    pub width: Option<usize>,
}

impl TableStyle {
    /// `rows` rows, names shortened, no terminal.
    pub fn rows(rows: usize) -> TableStyle {
        TableStyle {
            rows,
            verbose: false,
            width: None,
        }
    }
}

/// The widest a function column gets off a terminal.
const FUNCTION_MAX: usize = 60;
/// The widest a module column gets.
const MODULE_MAX: usize = 24;
/// The narrowest the name columns get on a narrow terminal.
const FUNCTION_MIN: usize = 20;
const MODULE_MIN: usize = 12;

/// The Function and Module columns of a table (top, and the comparison's): names escaped and
/// shortened ([`shorten`], unless verbose), the module by its file name, and widths that fit
/// the longest name shown (and the terminal, on one). A name longer than its column is cut,
/// the cut marked with `…`.
#[derive(Debug, Clone)]
pub struct Layout {
    function: usize,
    module: usize,
    /// The location's room on a terminal (0: left out).
    location: Option<usize>,
    verbose: bool,
}

impl Layout {
    /// The layout for `rows` (function, module) after `used` columns (the figures and the
    /// spaces before the function).
    pub fn new<'a>(
        rows: impl IntoIterator<Item = (&'a str, &'a str)>,
        used: usize,
        style: &TableStyle,
    ) -> Layout {
        let (mut f, mut m) = ("Function".len(), "Module".len());
        for (function, module) in rows {
            f = f.max(width(&name(function, style.verbose)));
            m = m.max(width(&escape(module_name(module))));
        }
        let mut module = m.min(MODULE_MAX);
        let mut location = None;
        let function = match style.width {
            // Each line fits the terminal: the location gives way first (cut, or left out
            // where only a few columns remain), then the module's column (to its minimum),
            // then the function's.
            Some(cols) => {
                let room = cols.saturating_sub(used + 4);
                let function = f.min(room.saturating_sub(MODULE_MIN).max(FUNCTION_MIN));
                module = module.min(room.saturating_sub(function).max(MODULE_MIN));
                let left = room.saturating_sub(function + module);
                location = Some(if left < 8 { 0 } else { left });
                function
            }
            None if style.verbose => f,
            None => f.min(FUNCTION_MAX),
        };
        Layout {
            function,
            module,
            location,
            verbose: style.verbose,
        }
    }

    /// The header of the name columns.
    pub fn header(&self) -> String {
        format!(
            "{:<fw$}  {:<mw$}",
            "Function",
            "Module",
            fw = self.function,
            mw = self.module
        )
        .trim_end()
        .to_owned()
    }

    /// A row's name columns: function, module and location.
    pub fn cells(&self, function: &str, module: &str, location: &str) -> String {
        let f = fit(&name(function, self.verbose), self.function);
        let m = fit(&escape(module_name(module)), self.module);
        let location = match self.location {
            Some(w) => fit(location, w),
            None => location.to_owned(),
        };
        format!(
            "{f}{}  {m}{}  {location}",
            " ".repeat(self.function.saturating_sub(width(&f))),
            " ".repeat(self.module.saturating_sub(width(&m))),
        )
        .trim_end()
        .to_owned()
    }
}

/// A module by its file name.
fn module_name(path: &str) -> &str {
    path.rsplit('/').next().unwrap_or(path)
}

/// A function's name as a table shows it: escaped, shortened unless `verbose`.
fn name(function: &str, verbose: bool) -> String {
    let e = escape(function);
    if verbose {
        e.into_owned()
    } else {
        shorten(&e)
    }
}

/// Columns a text takes (one per character: names are escaped to printable ASCII, and the
/// cut mark is one column).
fn width(s: &str) -> usize {
    s.chars().count()
}

/// `s` in at most `w` columns: cut, the cut marked with `…`.
fn fit(s: &str, w: usize) -> String {
    if width(s) <= w {
        return s.to_owned();
    }
    if w == 0 {
        return String::new();
    }
    let mut out: String = s.chars().take(w.saturating_sub(1)).collect();
    out.push('…');
    out
}

/// A demangled name without what makes it long and rarely tells functions apart: template
/// and generic arguments become `<…>`, a non-empty argument list `(…)`.
/// `std::vector<int, std::allocator<int> >::push_back(int const&)` reads
/// `std::vector<…>::push_back(…)`; a Rust qualified path keeps its outer brackets
/// (`<alloc::vec::Vec<…> as core::ops::drop::Drop>::drop`), and `operator<`, `operator()`,
/// `(anonymous namespace)` and closures' `{{closure}}` stay as they are.
pub fn shorten(name: &str) -> String {
    let b = name.as_bytes();
    let mut out = String::with_capacity(name.len());
    let mut i = 0;
    while i < b.len() {
        let c = b[i];
        let prev = out.as_bytes().last().copied();
        let after_ident = prev.is_some_and(|p| p.is_ascii_alphanumeric() || p == b'_');
        if c == b'<' && after_ident && !out.ends_with("operator") && !out.ends_with("operator<") {
            // Template or generic arguments: skip to the matching '>'.
            if let Some(end) = matching(b, i, b'<', b'>') {
                out.push_str("<…>");
                i = end + 1;
                continue;
            }
        }
        // An operator's name ends in its symbol (`operator<`, `operator()`): a '(' after it
        // opens the argument list; right after `operator` it is the symbol.
        let segment = out.rsplit("::").next().unwrap_or("");
        let operator = segment.starts_with("operator") && segment != "operator";
        let params = after_ident || prev == Some(b'>') || operator;
        if c == b'(' && params && !out.ends_with("operator") {
            if let Some(end) = matching(b, i, b'(', b')') {
                out.push_str(if end == i + 1 { "()" } else { "(…)" });
                i = end + 1;
                continue;
            }
        }
        // Copy one character (names may hold any text).
        let ch = name[i..].chars().next().unwrap_or('?');
        out.push(ch);
        i += ch.len_utf8();
    }
    out
}

/// The index of the bracket that closes the one at `open` (nested ones counted), if any.
fn matching(b: &[u8], open: usize, l: u8, r: u8) -> Option<usize> {
    let mut depth = 0usize;
    for (k, &c) in b.iter().enumerate().skip(open) {
        if c == l {
            depth += 1;
        } else if c == r {
            // `->` inside a template argument list is not a closing bracket.
            if r == b'>' && k > 0 && b[k - 1] == b'-' {
                continue;
            }
            depth -= 1;
            if depth == 0 {
                return Some(k);
            }
        }
    }
    None
}

/// The line above a table: samples, event and rate, threads, lost samples.
pub fn summary(profile: &Profile) -> String {
    let threads: std::collections::HashSet<u32> =
        profile.samples.iter().map(|s| s.thread).collect();
    let on_cpu = profile.on_cpu_samples();
    let delivered = match profile.meta.delivered_frequency(on_cpu as usize) {
        0.0 => String::new(),
        hz => format!(" ({hz:.0} Hz delivered)"),
    };
    // A counted event's weights are its occurrences, not samples.
    let (samples, rate) = if profile.meta.counted() {
        (
            profile.samples.len() as u64,
            format!(" ({} events)", profile.total_weight()),
        )
    } else {
        (
            on_cpu,
            format!(" at {} Hz{delivered}", profile.meta.frequency),
        )
    };
    format!(
        "{} samples of {}{rate}, {} thread{}, {} lost",
        samples,
        if profile.meta.event.is_empty() {
            "?".into()
        } else {
            escape(&profile.meta.event)
        },
        threads.len(),
        if threads.len() == 1 { "" } else { "s" },
        profile.meta.lost_samples
    )
}

/// Writes the table, at most `limit` rows, names shortened.
pub fn write(profile: &Profile, limit: usize, w: &mut dyn Write) -> io::Result<()> {
    write_styled(profile, &TableStyle::rows(limit), w)
}

/// Writes the table as `style` says.
pub fn write_styled(profile: &Profile, style: &TableStyle, w: &mut dyn Write) -> io::Result<()> {
    // A profile of several events: a table of each, in turn (as perf report shows them).
    let events = profile.meta.event_list();
    if events.len() > 1 {
        for (i, e) in events.into_iter().enumerate() {
            if i > 0 {
                writeln!(w)?;
            }
            let one = crate::Filter {
                event: Some(e.name),
                ..Default::default()
            }
            .apply(profile);
            write_styled(&one, style, w)?;
        }
        return Ok(());
    }
    let total = profile.total_weight();
    writeln!(w, "{}", summary(profile))?;
    if total == 0 {
        return Ok(());
    }
    // With off-CPU time: shares of wall-clock time, and each function's time on and off the
    // CPU (through it: its callees' too), in milliseconds.
    let off_cpu = profile.has_off_cpu();
    let period_ms = profile.meta.period_ns() as f64 / 1e6;
    let rows: Vec<(TopRow, String)> = rows(profile)
        .into_iter()
        .take(style.rows)
        .map(|row| {
            let location = match (row.hottest_line.as_deref().map(escape), row.inlined) {
                (Some(l), true) => format!("{l} [inlined]"),
                (Some(l), false) => l.into_owned(),
                (None, true) => "[inlined]".to_owned(),
                (None, false) => String::new(),
            };
            (row, location)
        })
        .collect();
    // Functions counted beside the samples (`record --precise`): their calls and time per
    // call.
    let times = crate::calls::call_times(profile);
    let calls = !times.is_empty() && !off_cpu;
    let used = if off_cpu {
        43
    } else if calls {
        29 + 13 + 19
    } else {
        29
    };
    let layout = Layout::new(
        rows.iter()
            .map(|(r, _)| (r.function.as_str(), r.module.as_str())),
        used,
        style,
    );
    if off_cpu {
        let [on, off, preempted] = profile.weight_by_kind();
        writeln!(
            w,
            "off-CPU time by {}: {:.3} s on CPU, {:.3} s off CPU ({:.3} s of it preempted)",
            escape(&profile.meta.off_cpu),
            on as f64 * period_ms / 1e3,
            (off + preempted) as f64 * period_ms / 1e3,
            preempted as f64 * period_ms / 1e3
        )?;
        writeln!(
            w,
            "{:>8} {:>8} {:>11} {:>11}  {}",
            "Self%",
            "Total%",
            "On-CPU ms",
            "Off-CPU ms",
            layout.header()
        )?;
    } else if calls {
        writeln!(
            w,
            "{:>8} {:>8} {:>9} {:>12} {:>18}  {}",
            "Self%",
            "Total%",
            "Samples",
            "Calls",
            "Time/call",
            layout.header()
        )?;
    } else {
        writeln!(
            w,
            "{:>8} {:>8} {:>9}  {}",
            "Self%",
            "Total%",
            if profile.meta.counted() {
                "Events"
            } else {
                "Samples"
            },
            layout.header()
        )?;
    }
    let pct = |x: u64| 100.0 * x as f64 / total as f64;
    for (row, location) in &rows {
        let names = layout.cells(&row.function, &row.module, location);
        if off_cpu {
            let on = row.total_weight.saturating_sub(row.total_off_cpu);
            writeln!(
                w,
                "{:>7.2}% {:>7.2}% {:>11.1} {:>11.1}  {names}",
                pct(row.self_weight),
                pct(row.total_weight),
                on as f64 * period_ms,
                row.total_off_cpu as f64 * period_ms,
            )?;
        } else if calls {
            let t = crate::calls::time_of(&times, &row.function, &row.module).filter(|t| t.counted);
            let count = t.map_or(String::new(), |t| {
                format!("{}{}", t.calls, if t.exact { "" } else { "~" })
            });
            let per = t
                .and_then(|t| Some((t.ns_per_call?, t.ns_per_call_error?)))
                .map_or(String::new(), |(v, e)| crate::calls::format_per_call(v, e));
            writeln!(
                w,
                "{:>7.2}% {:>7.2}% {:>9} {:>12} {:>18}  {names}",
                pct(row.self_weight),
                pct(row.total_weight),
                row.self_weight,
                count,
                per,
            )?;
        } else {
            writeln!(
                w,
                "{:>7.2}% {:>7.2}% {:>9}  {names}",
                pct(row.self_weight),
                pct(row.total_weight),
                row.self_weight,
            )?;
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use crate::Profile;

    #[test]
    fn long_names_are_shortened() {
        use super::shorten;
        for (long, short) in [
            (
                "std::vector<int, std::allocator<int> >::push_back(int const&)",
                "std::vector<…>::push_back(…)",
            ),
            ("main", "main"),
            ("f()", "f()"),
            ("A::f(int) const", "A::f(…) const"),
            (
                "<alloc::vec::Vec<T,A> as core::ops::drop::Drop>::drop",
                "<alloc::vec::Vec<…> as core::ops::drop::Drop>::drop",
            ),
            (
                "(anonymous namespace)::g(char*)",
                "(anonymous namespace)::g(…)",
            ),
            (
                "bool operator<< <int>(int, int)",
                "bool operator<< <int>(…)",
            ),
            ("operator<(A const&, A const&)", "operator<(…)"),
            ("Foo::operator()(int) const", "Foo::operator()(…) const"),
            (
                "std::function<void ()>::operator()() const",
                "std::function<…>::operator()() const",
            ),
            ("a::{{closure}}", "a::{{closure}}"),
            (
                "x::{lambda(int)#1}::operator()",
                "x::{lambda(…)#1}::operator()",
            ),
            ("f<a->b>(x)", "f<…>(…)"),
            ("unbalanced<(", "unbalanced<("),
            ("[off-cpu: futex]", "[off-cpu: futex]"),
        ] {
            assert_eq!(shorten(long), short, "{long}");
        }
    }

    #[test]
    fn columns_fit_the_names_and_the_terminal() {
        use super::{Layout, TableStyle};
        let long = "a_function_with_a_very_long_name_indeed_longer_than_sixty_columns_x";
        let rows = [
            ("short", "/usr/lib/libc.so.6"),
            (long, "/a/very/long/path/to/some_module_with_a_long_name.so"),
        ];
        // Off a terminal: the function column is capped, the module named by its file.
        let l = Layout::new(rows, 28, &TableStyle::rows(10));
        let cells = l.cells("short", "/usr/lib/libc.so.6", "c.c:1");
        assert!(cells.starts_with("short "), "{cells}");
        assert!(cells.contains("  libc.so.6 "), "{cells}");
        let cut = l.cells(long, "m", "");
        assert_eq!(cut.chars().take_while(|&c| c != ' ').count(), 60, "{cut}");
        assert!(cut.contains('…'));
        // Every row's module column starts at the same place.
        let at = |s: &str, m: &str| s.find(m).unwrap();
        assert_eq!(at(&cells, "libc"), at(&l.cells("x", "/b/libc", ""), "libc"));
        assert_eq!(l.header().find("Module"), Some(at(&cells, "libc")));
        // Verbose: the whole name.
        let full = TableStyle {
            verbose: true,
            ..TableStyle::rows(10)
        };
        let l = Layout::new(rows, 28, &full);
        assert!(l.cells(long, "m", "").starts_with(long));
        // On an 80-column terminal: the line fits.
        let narrow = TableStyle {
            width: Some(80),
            ..TableStyle::rows(10)
        };
        let l = Layout::new(rows, 28, &narrow);
        let line = format!("{}{}", " ".repeat(28), l.cells(long, rows[1].1, "x.c:10"));
        assert!(line.chars().count() <= 80, "{line}");
    }

    #[test]
    fn recursion_counts_once_in_total() {
        let mut p = Profile::default();
        let t = p.add_thread(1, 1, "t");
        let main = p.intern_frame_named("main", "m", None, 0, 1, false);
        let rec = p.intern_frame_named("rec", "m", Some("r.c"), 7, 2, false);
        let s0 = p.intern_stack(None, main);
        let s1 = p.intern_stack(Some(s0), rec);
        let s2 = p.intern_stack(Some(s1), rec);
        p.add_sample(0, t, 0, 1, Some(s2));
        p.add_sample(1, t, 0, 1, Some(s0));
        let rows = super::rows(&p);
        let r = rows.iter().find(|r| r.function == "rec").unwrap();
        assert_eq!((r.self_weight, r.total_weight), (1, 1));
        assert_eq!(r.hottest_line.as_deref(), Some("r.c:7"));
        let m = rows.iter().find(|r| r.function == "main").unwrap();
        assert_eq!((m.self_weight, m.total_weight), (1, 2));
    }

    #[test]
    fn names_are_printed_escaped() {
        let mut p = Profile::default();
        let t = p.add_thread(1, 1, "t\nu");
        let f = p.intern_frame_named(
            "evil\n\x1b[2Jname",
            "/lib/m\x07od",
            Some("a\tb.c"),
            3,
            1,
            false,
        );
        let s = p.intern_stack(None, f);
        p.add_sample(0, t, 0, 1, Some(s));
        let mut out = Vec::new();
        super::write(&p, 10, &mut out).unwrap();
        let text = String::from_utf8(out).unwrap();
        assert_eq!(text.lines().count(), 3, "{text}");
        assert!(!text.contains('\x1b') && !text.contains('\x07'), "{text}");
        let row = text.lines().nth(2).unwrap();
        assert!(row.contains("evil\\n\\e[2Jname"), "{row}");
        assert!(row.contains("m\\x07od"), "{row}");
        assert!(row.contains("a\\tb.c:3"), "{row}");
    }
}
