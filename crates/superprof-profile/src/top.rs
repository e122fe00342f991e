//! The top table: functions by self and total share (like `perf report --no-children`, with
//! both columns).

use std::collections::HashMap;
use std::io::{self, Write};

use crate::{escape, Profile, StrId};

#[derive(Debug, Clone, PartialEq)]
pub struct TopRow {
    pub function: String,
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

/// Writes the table, at most `limit` rows.
pub fn write(profile: &Profile, limit: usize, w: &mut dyn Write) -> io::Result<()> {
    let total = profile.total_weight();
    let threads: std::collections::HashSet<u32> =
        profile.samples.iter().map(|s| s.thread).collect();
    let on_cpu = profile.on_cpu_samples();
    let delivered = match profile.meta.delivered_frequency(on_cpu as usize) {
        0.0 => String::new(),
        hz => format!(" ({hz:.0} Hz delivered)"),
    };
    writeln!(
        w,
        "{} samples of {} at {} Hz{delivered}, {} threads, {} lost",
        on_cpu,
        if profile.meta.event.is_empty() {
            "?".into()
        } else {
            escape(&profile.meta.event)
        },
        profile.meta.frequency,
        threads.len(),
        profile.meta.lost_samples
    )?;
    if total == 0 {
        return Ok(());
    }
    // With off-CPU time: shares of wall-clock time, and each function's time on and off the
    // CPU (through it: its callees' too), in milliseconds.
    let off_cpu = profile.has_off_cpu();
    let period_ms = profile.meta.period_ns() as f64 / 1e6;
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
            "{:>8} {:>8} {:>11} {:>11}  {:<40} Module",
            "Self%", "Total%", "On-CPU ms", "Off-CPU ms", "Function"
        )?;
    } else {
        writeln!(
            w,
            "{:>8} {:>8} {:>9}  {:<40} Module",
            "Self%", "Total%", "Samples", "Function"
        )?;
    }
    let pct = |x: u64| 100.0 * x as f64 / total as f64;
    for row in rows(profile).into_iter().take(limit) {
        let module = row.module.rsplit('/').next().unwrap_or(&row.module);
        let location = match (row.hottest_line.as_deref().map(escape), row.inlined) {
            (Some(l), true) => format!("{l} [inlined]"),
            (Some(l), false) => l.into_owned(),
            (None, true) => "[inlined]".to_owned(),
            (None, false) => String::new(),
        };
        if off_cpu {
            let on = row.total_weight.saturating_sub(row.total_off_cpu);
            writeln!(
                w,
                "{:>7.2}% {:>7.2}% {:>11.1} {:>11.1}  {:<40} {:<20} {}",
                pct(row.self_weight),
                pct(row.total_weight),
                on as f64 * period_ms,
                row.total_off_cpu as f64 * period_ms,
                escape(&row.function),
                escape(module),
                location
            )?;
            continue;
        }
        writeln!(
            w,
            "{:>7.2}% {:>7.2}% {:>9}  {:<40} {:<20} {}",
            pct(row.self_weight),
            pct(row.total_weight),
            row.self_weight,
            escape(&row.function),
            escape(module),
            location
        )?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use crate::Profile;

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
