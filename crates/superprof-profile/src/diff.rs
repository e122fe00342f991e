//! Two profiles compared (`superprof report AFTER --diff BEFORE`): a top table with before,
//! after and change columns, folded lines `stack BEFORE AFTER` (the differential input of
//! inferno and FlameGraph's difffolded.pl), and a differential flamegraph (widths from AFTER,
//! grown red, shrunk blue).
//!
//! By default each profile is measured in shares of its own total, so that runs of different
//! lengths compare: the folded BEFORE counts are scaled to AFTER's total (as inferno-diff-folded
//! `--normalize` does). `absolute` keeps sample counts (weights) as they are.

use std::collections::{BTreeMap, HashMap};
use std::io::{self, Write};

use crate::{escape, OutputFormat, Profile};

/// How two profiles are compared.
#[derive(Debug, Clone, Copy)]
pub struct DiffOptions {
    /// Sample counts instead of shares.
    pub absolute: bool,
    /// The top table's rows, names and width.
    pub style: crate::top::TableStyle,
}

/// One function in both profiles: its self and total weights before and after.
#[derive(Debug, Clone, PartialEq)]
pub struct DiffRow {
    /// The function's name.
    pub function: String,
    /// The module it is in, as the profiles name it.
    pub module: String,
    /// BEFORE's weight of samples whose leaf is this function (0 when it is not in BEFORE).
    pub self_before: u64,
    /// AFTER's weight of samples whose leaf is this function.
    pub self_after: u64,
    /// BEFORE's weight of samples with this function anywhere in the stack.
    pub total_before: u64,
    /// AFTER's weight of samples with this function anywhere in the stack.
    pub total_after: u64,
}

/// The formats a comparison can be written in.
pub fn supports(format: OutputFormat) -> bool {
    matches!(
        format,
        OutputFormat::Top | OutputFormat::Folded | OutputFormat::Svg
    )
}

/// Writes the comparison of `before` and `after` in `format` (one that [`supports`]).
pub fn write(
    before: &Profile,
    after: &Profile,
    format: OutputFormat,
    opts: DiffOptions,
    title: &str,
    w: &mut dyn Write,
) -> io::Result<()> {
    match format {
        OutputFormat::Top => write_top(before, after, opts, w),
        OutputFormat::Folded => {
            for (stack, (b, a)) in folded(before, after, opts.absolute) {
                writeln!(w, "{stack} {b} {a}")?;
            }
            Ok(())
        }
        OutputFormat::Svg => write_svg(before, after, opts, title, w),
        _ => Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            "a comparison is written as top, folded or svg",
        )),
    }
}

/// Every function of either profile, as the top table orders them: by the larger of its two
/// self shares, then of its total shares (by counts with `absolute`), as `perf diff` keeps
/// the baseline's order. (Ordered by change, a table cut at N rows would show sampling
/// noise in small functions before an unchanged hot one.)
pub fn rows(before: &Profile, after: &Profile, absolute: bool) -> Vec<DiffRow> {
    let mut by_key: HashMap<(String, String), DiffRow> = HashMap::new();
    for (profile, is_after) in [(before, false), (after, true)] {
        for r in crate::top::rows(profile) {
            let row = by_key
                .entry((r.function.clone(), r.module.clone()))
                .or_insert_with(|| DiffRow {
                    function: r.function,
                    module: r.module,
                    self_before: 0,
                    self_after: 0,
                    total_before: 0,
                    total_after: 0,
                });
            if is_after {
                row.self_after = r.self_weight;
                row.total_after = r.total_weight;
            } else {
                row.self_before = r.self_weight;
                row.total_before = r.total_weight;
            }
        }
    }
    let (tb, ta) = (before.total_weight(), after.total_weight());
    let size = |b: u64, a: u64| -> f64 {
        if absolute {
            b.max(a) as f64
        } else {
            share(b, tb).max(share(a, ta))
        }
    };
    let mut out: Vec<DiffRow> = by_key.into_values().collect();
    out.sort_by(|x, y| {
        let key = |r: &DiffRow| {
            (
                size(r.self_before, r.self_after),
                size(r.total_before, r.total_after),
            )
        };
        let (kx, ky) = (key(x), key(y));
        ky.0.total_cmp(&kx.0)
            .then(ky.1.total_cmp(&kx.1))
            .then_with(|| x.function.cmp(&y.function))
            .then_with(|| x.module.cmp(&y.module))
    });
    out
}

/// `part` of `total` in percent.
fn share(part: u64, total: u64) -> f64 {
    if total == 0 {
        0.0
    } else {
        100.0 * part as f64 / total as f64
    }
}

/// The line that says what a profile holds: the top table's, and its command.
fn describe(p: &Profile) -> String {
    let command = if p.meta.command.is_empty() {
        String::new()
    } else {
        format!(": {}", escape(&p.meta.command.join(" ")))
    };
    format!("{}{command}", crate::top::summary(p))
}

fn write_top(
    before: &Profile,
    after: &Profile,
    opts: DiffOptions,
    w: &mut dyn Write,
) -> io::Result<()> {
    writeln!(w, "before: {}", describe(before))?;
    writeln!(w, "after:  {}", describe(after))?;
    let (tb, ta) = (before.total_weight(), after.total_weight());
    if opts.absolute {
        writeln!(w, "sample counts; change = after - before")?;
    } else {
        writeln!(
            w,
            "shares of each profile's total; change = after - before, in points"
        )?;
    }
    let rows: Vec<DiffRow> = rows(before, after, opts.absolute)
        .into_iter()
        .take(opts.style.rows)
        .collect();
    let layout = crate::top::Layout::new(
        rows.iter()
            .map(|r| (r.function.as_str(), r.module.as_str())),
        58,
        &opts.style,
    );
    writeln!(w, "{:-^27}  {:-^27}", " Self ", " Total ")?;
    writeln!(
        w,
        "{:>8} {:>8} {:>9}  {:>8} {:>8} {:>9}  {}",
        "Before",
        "After",
        "Change",
        "Before",
        "After",
        "Change",
        layout.header()
    )?;
    let cell = |x: u64, total: u64| -> String {
        if opts.absolute {
            x.to_string()
        } else {
            format!("{:.2}%", share(x, total))
        }
    };
    let change = |b: u64, a: u64| -> String {
        if opts.absolute {
            format!("{:+}", a as i128 - b as i128)
        } else {
            format!("{:+.2}", share(a, ta) - share(b, tb))
        }
    };
    for r in &rows {
        writeln!(
            w,
            "{:>8} {:>8} {:>9}  {:>8} {:>8} {:>9}  {}",
            cell(r.self_before, tb),
            cell(r.self_after, ta),
            change(r.self_before, r.self_after),
            cell(r.total_before, tb),
            cell(r.total_after, ta),
            change(r.total_before, r.total_after),
            layout.cells(&r.function, &r.module, "")
        )?;
    }
    Ok(())
}

/// Every stack of either profile: (before, after) weights; before scaled to after's total
/// unless `absolute`.
pub fn folded(before: &Profile, after: &Profile, absolute: bool) -> BTreeMap<String, (u64, u64)> {
    let b = crate::folded::collapse(before);
    let a = crate::folded::collapse(after);
    let (tb, ta) = (before.total_weight(), after.total_weight());
    let scale = |x: u64| -> u64 {
        if absolute || tb == 0 {
            x
        } else {
            (x as f64 * ta as f64 / tb as f64).round() as u64
        }
    };
    let mut out: BTreeMap<String, (u64, u64)> = BTreeMap::new();
    for (stack, n) in b {
        out.entry(stack).or_default().0 = scale(n);
    }
    for (stack, n) in a {
        out.entry(stack).or_default().1 = n;
    }
    out
}

fn write_svg(
    before: &Profile,
    after: &Profile,
    opts: DiffOptions,
    title: &str,
    w: &mut dyn Write,
) -> io::Result<()> {
    let lines: Vec<String> = folded(before, after, opts.absolute)
        .into_iter()
        .map(|(stack, (b, a))| format!("{stack} {b} {a}"))
        .collect();
    if after.total_weight() == 0 {
        return Err(io::Error::other(
            "the AFTER profile is empty: no samples to draw",
        ));
    }
    let mut options = inferno::flamegraph::Options::default();
    options.title = title.to_owned();
    options.subtitle = Some(if opts.absolute {
        "widths: after; red grew, blue shrank (sample counts)".to_owned()
    } else {
        "widths: after; red grew, blue shrank (shares of each profile)".to_owned()
    });
    options.count_name = "samples".to_owned();
    inferno::flamegraph::from_lines(&mut options, lines.iter().map(String::as_str), w)
        .map_err(io::Error::other)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A profile of `main` calling each (function, samples).
    fn profile(funcs: &[(&str, u64)]) -> Profile {
        let mut p = Profile::default();
        let t = p.add_thread(1, 1, "t");
        let main = p.intern_frame_named("main", "m", None, 0, 1, false);
        let root = p.intern_stack(None, main);
        let mut time = 0;
        for &(name, n) in funcs {
            let f = p.intern_frame_named(name, "m", None, 0, 2, false);
            let s = p.intern_stack(Some(root), f);
            for _ in 0..n {
                p.add_sample(time, t, 0, 1, Some(s));
                time += 1;
            }
        }
        p
    }

    #[test]
    fn rows_are_ordered_by_the_larger_share() {
        let before = profile(&[("a", 50), ("b", 30), ("c", 20)]);
        let after = profile(&[("a", 40), ("b", 60), ("d", 100)]);
        let rows = rows(&before, &after, false);
        let names: Vec<&str> = rows.iter().map(|r| r.function.as_str()).collect();
        // Self shares: a 50 -> 20, b 30 -> 30, c 20 -> 0, d 0 -> 50; main 0 self.
        assert_eq!(names, ["a", "d", "b", "c", "main"]);
        let c = rows.iter().find(|r| r.function == "c").unwrap();
        assert_eq!((c.self_before, c.self_after), (20, 0));
        let main = rows.iter().find(|r| r.function == "main").unwrap();
        assert_eq!((main.total_before, main.total_after), (100, 200));
        // In counts: d (100), b (60), a (50).
        let rows = super::rows(&before, &after, true);
        let names: Vec<&str> = rows.iter().map(|r| r.function.as_str()).collect();
        assert_eq!(names[..3], ["d", "b", "a"]);
    }

    #[test]
    fn folded_scales_before_to_afters_total() {
        let before = profile(&[("a", 50), ("b", 50)]);
        let after = profile(&[("a", 150), ("c", 50)]);
        let f = folded(&before, &after, false);
        assert_eq!(f["t;main;a"], (100, 150));
        assert_eq!(f["t;main;b"], (100, 0));
        assert_eq!(f["t;main;c"], (0, 50));
        let f = folded(&before, &after, true);
        assert_eq!(f["t;main;a"], (50, 150));
    }

    #[test]
    fn the_table_says_before_after_and_change() {
        let before = profile(&[("a", 75), ("b", 25)]);
        let after = profile(&[("a", 25), ("b", 75)]);
        let mut out = Vec::new();
        let opts = DiffOptions {
            absolute: false,
            style: crate::top::TableStyle::rows(10),
        };
        write(&before, &after, OutputFormat::Top, opts, "", &mut out).unwrap();
        let text = String::from_utf8(out).unwrap();
        let a = text.lines().find(|l| l.contains(" a ")).unwrap();
        let cells: Vec<&str> = a.split_whitespace().collect();
        assert_eq!(cells[..3], ["75.00%", "25.00%", "-50.00"], "{text}");
        let mut out = Vec::new();
        let opts = DiffOptions {
            absolute: true,
            style: crate::top::TableStyle::rows(10),
        };
        write(&before, &after, OutputFormat::Top, opts, "", &mut out).unwrap();
        let text = String::from_utf8(out).unwrap();
        let b = text.lines().find(|l| l.contains(" b ")).unwrap();
        let cells: Vec<&str> = b.split_whitespace().collect();
        assert_eq!(cells[..6], ["25", "75", "+50", "25", "75", "+50"], "{text}");
    }
}
