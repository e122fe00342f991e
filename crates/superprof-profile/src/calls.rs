//! Exact call counts beside the samples (`record --precise`), and the time per call that the
//! two give together.
//!
//! Samples say how much CPU time passed inside a function; a counter at its entry says how
//! often it was entered. Their quotient is the time per call, known as well as the samples
//! know the time: a share `p` of `n` samples has σ = √(p(1−p)/n), which is the time's relative
//! error too (the count has none). Both cover the same interval: from when the counter was
//! placed (`since_ns`) to the end.

use crate::Profile;

/// One block of a counted function: its ELF addresses, how often it ran, and its first
/// instruction's source line where the DWARF says.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct BlockCount {
    /// Its first instruction's address in its file.
    pub start: u64,
    /// The address after its last instruction.
    pub end: u64,
    /// Executions.
    pub count: u64,
    /// Its source file, where known.
    pub file: String,
    /// Its source line (0: not known).
    pub line: u32,
}

/// A source line of a counted function and how often its code ran (`record --precise-lines`):
/// the executions of its most-run block (a line whose code is split between blocks, as a
/// loop's header, counts its most-run part).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct LineCount {
    /// The source file, as the DWARF names it.
    pub file: String,
    /// The line.
    pub line: u32,
    /// Executions.
    pub count: u64,
}

/// A function whose calls were counted exactly while it was sampled.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct FunctionCalls {
    /// Its name as the profile's frames name it.
    pub function: String,
    /// The file it is in, as the profile's frames name it.
    pub module: String,
    /// Its address in that file.
    pub address: u64,
    /// Whether its calls were counted (else `note` says why not, and the counts are 0).
    pub counted: bool,
    /// Its calls: entries of its first instruction less those from inside itself (its own
    /// direct recursive calls, and jumps back to its start): outermost calls, where its
    /// recursion is direct.
    pub calls: u64,
    /// Every entry of its first instruction (each level of a recursion too).
    pub entries: u64,
    /// When counting began, nanoseconds since the recording's start.
    pub since_ns: u64,
    /// Whether `calls` is exact; where not, `note` says why.
    pub exact: bool,
    /// Why it was not counted, or what keeps `calls` from being exact.
    pub note: String,
    /// Its blocks' counts, in address order.
    pub blocks: Vec<BlockCount>,
    /// Its source lines' executions, in file and line order (`record --precise-lines`, which
    /// counts every block; empty otherwise).
    pub lines: Vec<LineCount>,
}

/// What a counted function's samples and calls give: its time per call.
#[derive(Debug, Clone, PartialEq)]
pub struct CallTime {
    /// The function, as counted.
    pub function: String,
    /// Its module.
    pub module: String,
    /// Its calls (see [`FunctionCalls::calls`]).
    pub calls: u64,
    /// On-CPU samples with it on the stack, taken while it was counted.
    pub samples: u64,
    /// Their share of all on-CPU samples of that interval.
    pub share: f64,
    /// CPU time per call, in nanoseconds (None: no calls, or no time to divide).
    pub ns_per_call: Option<f64>,
    /// Its standard error, from the sample count.
    pub ns_per_call_error: Option<f64>,
    /// Whether `calls` is exact.
    pub exact: bool,
    /// Whether it was counted at all (see [`FunctionCalls::counted`]).
    pub counted: bool,
    /// As [`FunctionCalls::note`].
    pub note: String,
}

/// CPU time per call of each counted function of `profile` (in `Meta::calls`' order):
/// on-CPU samples with the function on the stack (once per sample) over the interval it was
/// counted, scaled by the CPU time each sample stands for (the profile's CPU time over its
/// on-CPU samples, where known; else the sampling period), divided by its calls.
pub fn call_times(profile: &Profile) -> Vec<CallTime> {
    let calls = &profile.meta.calls;
    if calls.is_empty() {
        return Vec::new();
    }
    let all = profile.on_cpu_samples();
    let ns_per_sample = if profile.meta.cpu_time_ns > 0 && all > 0 {
        profile.meta.cpu_time_ns as f64 / all as f64
    } else {
        profile.meta.period_ns() as f64
    };
    // Per function: samples with it on the stack, samples of its interval, and samples with
    // it on the stack twice. Only its own frames count, not copies of it inlined elsewhere
    // (they never pass its entry: their time is not its calls'). Each distinct stack is
    // walked once.
    let mut with = vec![0u64; calls.len()];
    let mut during = vec![0u64; calls.len()];
    let mut twice = vec![0u64; calls.len()];
    let mut depth_of: std::collections::HashMap<Option<crate::StackId>, Vec<u32>> =
        Default::default();
    for s in profile
        .samples
        .iter()
        .filter(|s| s.kind == crate::SampleKind::OnCpu)
    {
        let depth = depth_of.entry(s.stack).or_insert_with(|| {
            let mut d = vec![0u32; calls.len()];
            for fid in profile.stack_frames(s.stack) {
                let f = profile.frame(fid);
                if f.inlined {
                    continue;
                }
                let (name, module) = (profile.str(f.function), profile.str(f.module));
                for (i, c) in calls.iter().enumerate() {
                    if c.function == name && module_matches(&c.module, module) {
                        d[i] = d[i].saturating_add(1);
                    }
                }
            }
            d
        });
        for (i, c) in calls.iter().enumerate() {
            if s.time_ns >= c.since_ns {
                during[i] = during[i].saturating_add(s.weight);
                if depth[i] > 0 {
                    with[i] = with[i].saturating_add(s.weight);
                }
                if depth[i] > 1 {
                    twice[i] = twice[i].saturating_add(s.weight);
                }
            }
        }
    }
    calls
        .iter()
        .enumerate()
        .map(|(i, c)| {
            let (k, n) = (with[i], during[i]);
            let share = if n > 0 { k as f64 / n as f64 } else { 0.0 };
            let (per_call, error) = per_call(k, n, ns_per_sample, c.calls);
            let (exact, note) = recursion_unseen(c, twice[i]);
            CallTime {
                function: c.function.clone(),
                module: c.module.clone(),
                calls: c.calls,
                samples: k,
                share,
                ns_per_call: per_call,
                ns_per_call_error: error,
                exact,
                counted: c.counted,
                note,
            }
        })
        .collect()
}

/// A counted function's exactness and note, given the samples with it on the stack twice: a
/// recursion its counters never saw (no entry from inside it: through a PLT entry, a
/// pointer, another function) makes each level a call, and says so.
fn recursion_unseen(c: &FunctionCalls, twice: u64) -> (bool, String) {
    if !c.counted || twice == 0 || c.entries > c.calls {
        return (c.exact, c.note.clone());
    }
    let said = format!(
        "it is on the stack twice in {twice} samples, a recursion through calls its counters \
         cannot tell from others (a PLT entry, a pointer, another function): its calls count \
         each level"
    );
    let note = if c.note.is_empty() {
        said
    } else {
        format!("{}; {said}", c.note)
    };
    (false, note)
}

/// Time per call and its standard error: `k` of `n` samples, each standing for
/// `ns_per_sample`, over `calls` calls. The error is the binomial one of the share,
/// √(p(1−p)/n)·n (in samples), at least one sample's worth where k is 0 or n (a share
/// measured as 0 or 1 is not known better than one sample).
fn per_call(k: u64, n: u64, ns_per_sample: f64, calls: u64) -> (Option<f64>, Option<f64>) {
    if calls == 0 || n == 0 {
        return (None, None);
    }
    let p = k as f64 / n as f64;
    let sd_samples = (p * (1.0 - p) * n as f64).sqrt().max(1.0);
    let per = k as f64 * ns_per_sample / calls as f64;
    let err = sd_samples * ns_per_sample / calls as f64;
    (Some(per), Some(err))
}

/// `report --calls`: each counted function's calls, time per call (± its standard error),
/// samples and share of the samples of its interval, and when its counting began (seconds
/// into the recording: the calls are those from then on).
pub fn write_table(profile: &Profile, w: &mut dyn std::io::Write) -> std::io::Result<()> {
    let times = call_times(profile);
    // Names as the top table shows them: template and argument lists shortened.
    let short = |f: &str| crate::top::shorten(&crate::escape(f));
    let name_w = times
        .iter()
        .map(|t| short(&t.function).chars().count())
        .max()
        .unwrap_or(0)
        .clamp("Function".len(), 60);
    writeln!(
        w,
        "{:<name_w$}  {:>14}  {:>20}  {:>9}  {:>7}  {:>8}  Module",
        "Function", "Calls", "Time/call", "Samples", "Share", "Since"
    )?;
    for (t, c) in times.iter().zip(&profile.meta.calls) {
        let name: String = short(&t.function).chars().take(name_w).collect();
        let per = match (t.ns_per_call, t.ns_per_call_error) {
            (Some(v), Some(e)) => format_per_call(v, e),
            _ => "-".to_owned(),
        };
        let module = t.module.rsplit('/').next().unwrap_or(&t.module);
        let calls = match (t.counted, t.exact) {
            (false, _) => "-".to_owned(),
            (true, true) => t.calls.to_string(),
            (true, false) => format!("{}~", t.calls),
        };
        let since = if c.counted {
            format!("{:.2} s", c.since_ns as f64 / 1e9)
        } else {
            "-".to_owned()
        };
        writeln!(
            w,
            "{name:<name_w$}  {calls:>14}  {per:>20}  {:>9}  {:>6.2}%  {since:>8}  {}",
            t.samples,
            100.0 * t.share,
            crate::escape(module)
        )?;
    }
    for t in times.iter().filter(|t| !t.note.is_empty()) {
        writeln!(
            w,
            "{}: {}",
            crate::escape(&t.function),
            crate::escape(&t.note)
        )?;
    }
    if times.iter().any(|t| t.counted && !t.exact) {
        writeln!(w, "(~: not exact, as said above)")?;
    }
    Ok(())
}

/// `report --calls --format json`: `{"functions": [{"name", "calls", "ns_per_call",
/// "ns_per_call_error", "samples", ...}]}` (a time per call is null where there are no calls).
pub fn to_json(profile: &Profile) -> serde_json::Value {
    let counted = &profile.meta.calls;
    let functions: Vec<serde_json::Value> = call_times(profile)
        .iter()
        .zip(counted)
        .map(|(t, c)| {
            serde_json::json!({
                "name": t.function,
                "module": t.module,
                "calls": t.calls,
                "entries": c.entries,
                "counted": c.counted,
                "exact": t.exact,
                "ns_per_call": t.ns_per_call,
                "ns_per_call_error": t.ns_per_call_error,
                "samples": t.samples,
                "share": t.share,
                "since_ns": c.since_ns,
                "note": t.note,
            })
        })
        .collect();
    serde_json::json!({ "functions": functions })
}

/// `report --lines FUNC`: the executions of each source line of counted function `function`
/// (a line of its source file beside each where the file can be read from `read`), or why
/// there are none.
pub fn write_lines(
    profile: &Profile,
    function: &str,
    read: &dyn Fn(&str) -> Option<String>,
    w: &mut dyn std::io::Write,
) -> std::io::Result<Result<(), String>> {
    let Some(c) = profile.meta.calls.iter().find(|c| c.function == function) else {
        let names: Vec<&str> = profile
            .meta
            .calls
            .iter()
            .map(|c| c.function.as_str())
            .collect();
        return Ok(Err(format!(
            "'{}' is not a counted function of the profile (counted: {})",
            crate::escape(function),
            crate::escape(&names.join(", "))
        )));
    };
    if c.lines.is_empty() {
        return Ok(Err(format!(
            "no line of '{}' was counted: record it with --precise-lines",
            crate::escape(function)
        )));
    }
    writeln!(
        w,
        "{}: {} calls{}",
        crate::escape(&c.function),
        c.calls,
        if c.exact { "" } else { " (not exact)" }
    )?;
    let mut file = "";
    let mut source: Vec<String> = Vec::new();
    for l in &c.lines {
        if l.file != file {
            file = &l.file;
            source = read(file)
                .map(|s| s.lines().map(str::to_owned).collect())
                .unwrap_or_default();
            writeln!(w, "{}", crate::escape(file))?;
            writeln!(w, "{:>14}  {:>6}  Source", "Executions", "Line")?;
        }
        let text = (l.line as usize)
            .checked_sub(1)
            .and_then(|i| source.get(i))
            .map(|s| crate::escape(s).into_owned())
            .unwrap_or_default();
        writeln!(w, "{:>14}  {:>6}  {}", l.count, l.line, text.trim_end())?;
    }
    Ok(Ok(()))
}

/// Each source line's executions from a function's `blocks`: `lines_of(start, end)` gives the
/// (file, line) of each instruction of a block; a line counts its most-run block.
pub fn line_counts(
    blocks: &[BlockCount],
    lines_of: &mut dyn FnMut(u64, u64) -> Vec<(String, u32)>,
) -> Vec<LineCount> {
    let mut by_line: std::collections::BTreeMap<(String, u32), u64> = Default::default();
    for b in blocks {
        for key in lines_of(b.start, b.end) {
            let n = by_line.entry(key).or_default();
            *n = (*n).max(b.count);
        }
    }
    by_line
        .into_iter()
        .map(|((file, line), count)| LineCount { file, line, count })
        .collect()
}

/// The unit that suits a time of `ns` nanoseconds: its scale and name (a value that rounds to
/// 1000 of a unit reads in the next one).
fn unit_of(ns: f64) -> (f64, &'static str) {
    match ns {
        x if x >= 999.5e6 => (1e9, "s"),
        x if x >= 999.5e3 => (1e6, "ms"),
        x if x >= 999.5 => (1e3, "µs"),
        _ => (1.0, "ns"),
    }
}

/// Decimals that give a figure of this size three significant digits.
fn decimals_of(x: f64) -> usize {
    match x.abs() {
        x if x >= 100.0 => 0,
        x if x >= 10.0 => 1,
        _ => 2,
    }
}

/// A time per call and its error, in the unit that suits them: `2.41 µs ±0.05`; an error too
/// small for the value's decimals in its own unit (`3.33 ms ±2.2 µs`).
pub fn format_per_call(ns: f64, error: f64) -> String {
    let (scale, unit) = unit_of(ns.max(error));
    let (v, e) = (ns / scale, error / scale);
    let decimals = decimals_of(v.abs().max(e));
    if error > 0.0 && e < 0.5 * 10f64.powi(-(decimals as i32)) {
        let (es, eu) = unit_of(error);
        let ed = decimals_of(error / es).min(1);
        return format!("{v:.decimals$} {unit} ±{:.ed$} {eu}", error / es);
    }
    format!("{v:.decimals$} {unit} ±{e:.decimals$}")
}

/// The time per call of function `function` in `module` (as a table names them), from
/// `times`.
pub fn time_of<'a>(times: &'a [CallTime], function: &str, module: &str) -> Option<&'a CallTime> {
    times
        .iter()
        .find(|t| t.function == function && module_matches(&t.module, module))
}

/// Whether a counted function's module (a path) is a frame's module (a path, or the file's
/// name where the profile shortened it).
fn module_matches(counted: &str, frame: &str) -> bool {
    counted == frame
        || std::path::Path::new(counted)
            .file_name()
            .is_some_and(|n| n.to_string_lossy() == frame)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn time_per_call_divides_the_samples_time_by_the_calls() {
        // 300 of 1000 samples of 1 ms each, over 1000 calls: 0.3 ms per call, σ of the
        // share √(0.3·0.7/1000) = 0.01449: ±14.49 samples → ±14.49 µs per call.
        let (per, err) = per_call(300, 1000, 1e6, 1000);
        assert!((per.unwrap() - 300_000.0).abs() < 1e-6);
        assert!((err.unwrap() - 14_491.38).abs() < 0.1, "{err:?}");
    }

    #[test]
    fn no_calls_or_no_samples_give_no_time() {
        assert_eq!(per_call(5, 10, 1e6, 0), (None, None));
        assert_eq!(per_call(0, 0, 1e6, 10), (None, None));
        // None of the samples: 0 per call, give or take one sample's worth.
        let (per, err) = per_call(0, 100, 1e6, 10);
        assert_eq!(per, Some(0.0));
        assert_eq!(err, Some(1e5));
    }

    #[test]
    fn only_the_functions_own_frames_are_its_time_and_twice_is_said() {
        let mut p = Profile::default();
        let t = p.add_thread(1, 1, "t");
        let main = p.intern_frame_named("main", "/bin/p", None, 0, 0x10, false);
        let walk = p.intern_frame_named("walk", "/bin/p", None, 0, 0x20, false);
        // walk inlined into visit: it never passes walk's entry.
        let inl = p.intern_frame_named("walk", "/bin/p", None, 0, 0x30, true);
        let visit = p.intern_frame_named("visit", "/bin/p", None, 0, 0x30, false);
        let root = p.intern_stack(None, main);
        let once = p.intern_stack(Some(root), walk);
        let nested = p.intern_stack(Some(once), walk);
        let v = p.intern_stack(Some(root), visit);
        let copy = p.intern_stack(Some(v), inl);
        for (i, stack) in [once, once, nested, copy, root].into_iter().enumerate() {
            p.add_sample(i as u64, t, 0, 1, Some(stack));
        }
        p.meta.calls = vec![FunctionCalls {
            function: "walk".into(),
            module: "/bin/p".into(),
            counted: true,
            calls: 4,
            entries: 4,
            exact: true,
            ..Default::default()
        }];
        let t = &call_times(&p)[0];
        // 3 of 5 samples (not the inlined copy's), one with walk twice.
        assert_eq!((t.samples, t.share), (3, 0.6));
        assert!(!t.exact && t.note.contains("twice in 1 samples"), "{t:?}");
    }

    #[test]
    fn recursion_the_counters_never_saw_is_said() {
        let c = FunctionCalls {
            function: "walk".into(),
            counted: true,
            calls: 10,
            entries: 10,
            exact: true,
            ..Default::default()
        };
        assert_eq!(recursion_unseen(&c, 0), (true, String::new()));
        let (exact, note) = recursion_unseen(&c, 3);
        assert!(!exact && note.contains("twice in 3 samples"), "{note}");
        // Direct recursion counted: its outermost calls are known.
        let direct = FunctionCalls {
            entries: 50,
            ..c.clone()
        };
        assert_eq!(recursion_unseen(&direct, 3), (true, String::new()));
    }

    #[test]
    fn times_per_call_read_in_their_unit() {
        assert_eq!(format_per_call(2.4137, 0.05), "2.41 ns ±0.05");
        assert_eq!(format_per_call(2413.7, 51.0), "2.41 µs ±0.05");
        assert_eq!(format_per_call(24_137.0, 510.0), "24.1 µs ±0.5");
        assert_eq!(format_per_call(3.2e8, 1e7), "320 ms ±10");
        assert_eq!(format_per_call(999_960.0, 22_000.0), "1.00 ms ±0.02");
        assert_eq!(format_per_call(0.0, 1e5), "0 µs ±100");
        assert_eq!(format_per_call(0.0, 636.47), "0 ns ±636");
        // An error below the value's last decimal: in its own unit.
        assert_eq!(format_per_call(3.33e6, 2200.0), "3.33 ms ±2.2 µs");
    }

    #[test]
    fn a_line_counts_its_most_run_block() {
        let b = |start, end, count| BlockCount {
            start,
            end,
            count,
            ..Default::default()
        };
        // Line 5 is a loop's header: its set-up ran once, its test 10 times.
        let blocks = [b(0, 4, 1), b(4, 8, 10), b(8, 12, 10), b(12, 16, 1)];
        let lines = line_counts(&blocks, &mut |s, _| match s {
            0 => vec![("a.c".into(), 4), ("a.c".into(), 5)],
            4 => vec![("a.c".into(), 5)],
            8 => vec![("a.c".into(), 6), ("a.c".into(), 6)],
            _ => vec![("a.c".into(), 8)],
        });
        let got: Vec<(u32, u64)> = lines.iter().map(|l| (l.line, l.count)).collect();
        assert_eq!(got, [(4, 1), (5, 10), (6, 10), (8, 1)]);
    }

    #[test]
    fn modules_match_by_path_or_file_name() {
        assert!(module_matches("/usr/bin/xz", "/usr/bin/xz"));
        assert!(module_matches("/usr/bin/xz", "xz"));
        assert!(!module_matches("/usr/bin/xz", "bash"));
    }
}
