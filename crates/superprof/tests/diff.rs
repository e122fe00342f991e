//! `superprof report AFTER --diff BEFORE` (issue 17): two runs of the split fixture whose
//! functions trade known shares (50/30/20 before, 20/30/50 after), compared in the top table
//! (shares, and counts with --absolute), as folded `stack BEFORE AFTER` lines, as a
//! differential SVG, and with a filter applied to both.

mod common;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::OnceLock;

use common::*;

struct Runs {
    _dir: TempDir,
    before: PathBuf,
    after: PathBuf,
    /// Each run's shares as the fixture measured them.
    truth_before: BTreeMap<String, f64>,
    truth_after: BTreeMap<String, f64>,
}

fn runs() -> &'static Runs {
    static RUNS: OnceLock<Runs> = OnceLock::new();
    RUNS.get_or_init(|| {
        let _cpu = cpu_lock();
        let dir = TempDir::new("diff");
        let exe = compile(&dir, "split", &["split.c"], &["-O2", "-g"]);
        let record = |name: &str, split: [&str; 3]| {
            let out = dir.path(name);
            let run = run_ok(
                superprof()
                    .args(["record", "-q", "-o"])
                    .arg(&out)
                    .arg("--")
                    .arg(&exe)
                    .arg("1.5")
                    .args(split),
            );
            (out, fixture_values(&String::from_utf8_lossy(&run.stdout)))
        };
        let (before, truth_before) = record("before.parquet", ["50", "30", "20"]);
        let (after, truth_after) = record("after.parquet", ["20", "30", "50"]);
        Runs {
            _dir: dir,
            before,
            after,
            truth_before,
            truth_after,
        }
    })
}

fn report(args: &[&str]) -> String {
    let r = runs();
    let out = run_ok(
        superprof()
            .arg("report")
            .arg(&r.after)
            .arg("--diff")
            .arg(&r.before)
            .args(args),
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// The figures of `function`'s row: self before, after, change, total before, after, change.
fn row(table: &str, function: &str) -> [f64; 6] {
    let line = table
        .lines()
        .find(|l| l.split_whitespace().nth(6) == Some(function))
        .unwrap_or_else(|| panic!("no row of {function} in\n{table}"));
    let cells: Vec<f64> = line
        .split_whitespace()
        .take(6)
        .map(|c| c.trim_end_matches('%').parse().unwrap())
        .collect();
    cells.try_into().unwrap()
}

/// Weight per leaf function and in all, from a profile's own folded lines.
fn leaf_counts(profile: &Path) -> (BTreeMap<String, u64>, u64) {
    let f = folded(profile);
    let mut leaves = BTreeMap::new();
    for (stack, n) in &f.0 {
        *leaves.entry(stack.last().unwrap().clone()).or_default() += n;
    }
    (leaves, f.total())
}

/// A profile's own folded lines.
fn folded(profile: &Path) -> Folded {
    let out = run_ok(
        superprof()
            .arg("report")
            .arg(profile)
            .args(["--format", "folded"]),
    );
    Folded::parse(&String::from_utf8_lossy(&out.stdout))
}

#[test]
fn the_table_shows_each_functions_shift() {
    let r = runs();
    let table = report(&[]);
    let (_, nb) = leaf_counts(&r.before);
    let (_, na) = leaf_counts(&r.after);
    // σ of a share p of n samples, in points.
    let sigma = |p: f64, n: u64| 100.0 * (p * (1.0 - p) / n as f64).sqrt();
    for f in ["work_alpha", "work_beta", "work_gamma"] {
        let [_, _, _, before, after, change] = row(&table, f);
        let (tb, ta) = (r.truth_before[f], r.truth_after[f]);
        let (sb, sa) = (sigma(tb, nb), sigma(ta, na));
        assert!(
            (before - 100.0 * tb).abs() < 4.0 * sb,
            "{f} before: {before} against {tb}\n{table}"
        );
        assert!(
            (after - 100.0 * ta).abs() < 4.0 * sa,
            "{f} after: {after} against {ta}\n{table}"
        );
        let want = 100.0 * (ta - tb);
        assert!(
            (change - want).abs() < 4.0 * (sb * sb + sa * sa).sqrt(),
            "{f} change: {change} against {want}\n{table}"
        );
        // The change is the difference of the two columns (rounded to 0.01).
        assert!((change - (after - before)).abs() < 0.015, "{f}\n{table}");
    }
    // In the top table's order: the largest share of either run first (alpha's and gamma's
    // 50% before beta's 30%).
    let order: Vec<&str> = table
        .lines()
        .filter_map(|l| l.split_whitespace().nth(6))
        .filter(|n| n.starts_with("work_"))
        .collect();
    assert_eq!(order.last(), Some(&"work_beta"), "{table}");
}

#[test]
fn absolute_counts_are_each_profiles_samples() {
    let r = runs();
    let table = report(&["--absolute"]);
    let (b, _) = leaf_counts(&r.before);
    let (a, _) = leaf_counts(&r.after);
    for f in ["work_alpha", "work_beta", "work_gamma"] {
        let [sb, sa, change, ..] = row(&table, f);
        assert_eq!(sb as u64, b[f], "{f}\n{table}");
        assert_eq!(sa as u64, a[f], "{f}\n{table}");
        assert_eq!(change as i64, a[f] as i64 - b[f] as i64, "{f}\n{table}");
    }
}

#[test]
fn folded_lines_carry_both_counts() {
    let r = runs();
    let (_, nb) = leaf_counts(&r.before);
    let (_, na) = leaf_counts(&r.after);
    let sums = |text: &str| -> (u64, u64, usize) {
        let mut s = (0, 0, 0);
        for line in text.lines() {
            let mut w = line.rsplitn(3, ' ');
            let a: u64 = w.next().unwrap().parse().unwrap();
            let b: u64 = w.next().unwrap().parse().unwrap();
            assert!(!w.next().unwrap().is_empty(), "{line}");
            s = (s.0 + b, s.1 + a, s.2 + 1);
        }
        s
    };
    let (b, a, _) = sums(&report(&["--format", "folded", "--absolute"]));
    assert_eq!((b, a), (nb, na));
    // Without --absolute, BEFORE is scaled to AFTER's total (each line rounded).
    let (b, a, lines) = sums(&report(&["--format", "folded"]));
    assert_eq!(a, na);
    assert!(b.abs_diff(na) <= lines as u64, "{b} against {na}");
}

#[test]
fn the_svg_draws_growth_red_and_shrinkage_blue() {
    let r = runs();
    let svg = r._dir.path("diff.svg");
    run_ok(
        superprof()
            .arg("report")
            .arg(&r.after)
            .arg("--diff")
            .arg(&r.before)
            .arg("-o")
            .arg(&svg),
    );
    let text = std::fs::read_to_string(&svg).unwrap();
    let fill = |f: &str| -> (u8, u8, u8) {
        let at = text
            .find(&format!("<title>{f} ("))
            .unwrap_or_else(|| panic!("no frame of {f}"));
        let rest = &text[at..];
        let rgb = &rest[rest.find("fill=\"rgb(").unwrap() + 10..];
        let rgb = &rgb[..rgb.find(')').unwrap()];
        let v: Vec<u8> = rgb.split(',').map(|x| x.parse().unwrap()).collect();
        (v[0], v[1], v[2])
    };
    let (red, green, blue) = fill("work_gamma");
    assert!(
        red == 255 && green < 200 && blue < 200,
        "gamma grew: {red},{green},{blue}"
    );
    let (red, green, blue) = fill("work_alpha");
    assert!(
        blue == 255 && red < 200 && green < 200,
        "alpha shrank: {red},{green},{blue}"
    );
}

#[test]
fn filters_apply_to_both_profiles() {
    let r = runs();
    let table = report(&["--exclude", "work_beta"]);
    assert!(!table.contains("work_beta"), "{table}");
    // Shares of what is left of each profile: gamma's total over the stacks not through beta.
    let share = |p: &Path| {
        let f = folded(p);
        let through = |name: &str| -> u64 {
            f.0.iter()
                .filter(|(s, _)| s.iter().any(|x| x == name))
                .map(|(_, n)| n)
                .sum()
        };
        100.0 * through("work_gamma") as f64 / (f.total() - through("work_beta")) as f64
    };
    let [.., tb, ta, _] = row(&table, "work_gamma");
    let (want_b, want_a) = (share(&r.before), share(&r.after));
    assert!(
        (tb - want_b).abs() < 0.006,
        "{tb} against {want_b}\n{table}"
    );
    assert!(
        (ta - want_a).abs() < 0.006,
        "{ta} against {want_a}\n{table}"
    );
}

#[test]
fn a_comparison_is_top_folded_or_svg() {
    let r = runs();
    let out = superprof()
        .arg("report")
        .arg(&r.after)
        .arg("--diff")
        .arg(&r.before)
        .args(["--format", "pprof", "-o"])
        .arg(r._dir.path("d.pb.gz"))
        .output()
        .unwrap();
    assert_one_line_error(&out, "--diff");
    assert!(!r._dir.path("d.pb.gz").exists());
}

/// perf diff's order: `superprof diff BEFORE AFTER` is `report AFTER --diff BEFORE`, byte for
/// byte; `--absolute` without a comparison is refused.
#[test]
fn diff_takes_the_baseline_first_as_perf_diff() {
    let r = runs();
    for args in [&[][..], &["--format", "folded", "--absolute"][..]] {
        let perf_order = run_ok(
            superprof()
                .arg("diff")
                .arg(&r.before)
                .arg(&r.after)
                .args(args),
        );
        assert_eq!(
            String::from_utf8_lossy(&perf_order.stdout),
            report(args),
            "{args:?}"
        );
    }
    let out = superprof()
        .arg("report")
        .arg(&r.after)
        .arg("--absolute")
        .output()
        .unwrap();
    assert_one_line_error(&out, "--absolute goes with --diff");
}
