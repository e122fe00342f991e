//! The offline HTML report (issue 17): `record -o profile.html` and `report -o profile.html`
//! write one self-contained file (speedscope's viewer with the profile in it). Debian's
//! Chromium, headless, in a network namespace of its own (no network at all), loads it through
//! its DevTools pipe (tests/fixtures/html_check.js, run by node): the viewer shows the
//! profile, the page asks for nothing but itself and its inlined font, a click on a frame gives
//! its details, a double click zooms (the time axis changes), and the Time Order (timeline)
//! and Sandwich (top table) views open, the table naming the fixture's functions with the
//! shares the top table gives.

mod common;

use std::path::Path;
use std::process::Command;

use common::*;
use serde_json::Value;

/// What the browser check `script` (a fixture run by node) found in `page`, in Chromium.
fn in_chromium(dir: &TempDir, script: &str, page: &Path) -> Value {
    let chromium = ["/usr/bin/chromium", "/usr/bin/chromium-browser"]
        .into_iter()
        .find(|p| Path::new(p).exists())
        .expect("chromium (scripts/test installs it)");
    let profile_dir = dir.path(&format!(
        "chromium-{}",
        page.file_name().unwrap().to_string_lossy()
    ));
    // No network: a namespace of its own (root may make one).
    let mut cmd = if is_root() {
        let mut c = Command::new("unshare");
        c.args(["-n", "node"]);
        c
    } else {
        Command::new("node")
    };
    let out = run_ok(
        cmd.arg(fixtures_dir().join(script))
            .arg(chromium)
            .arg(page)
            .arg(&profile_dir),
    );
    let text = String::from_utf8_lossy(&out.stdout);
    serde_json::from_str(text.trim()).unwrap_or_else(|e| panic!("{e}: {text}"))
}

/// What html_check.js found in `page`.
fn check(dir: &TempDir, page: &Path) -> Value {
    in_chromium(dir, "html_check.js", page)
}

/// The Total% of `function` in the top table of `parquet`.
fn top_total(parquet: &Path, function: &str) -> f64 {
    let out = run_ok(superprof().arg("report").arg(parquet));
    let table = String::from_utf8_lossy(&out.stdout);
    let row = table
        .lines()
        .find(|l| l.split_whitespace().nth(3) == Some(function))
        .unwrap_or_else(|| panic!("no {function} in {table}"));
    row.split_whitespace()
        .nth(1)
        .unwrap()
        .trim_end_matches('%')
        .parse()
        .unwrap()
}

#[test]
fn the_html_report_works_offline_in_a_real_browser() {
    let _cpu = cpu_lock();
    let dir = TempDir::new("html");
    let exe = compile(&dir, "split", &["split.c"], &["-O2", "-g"]);
    let (recorded, parquet, reported) = (
        dir.path("recorded.html"),
        dir.path("p.parquet"),
        dir.path("reported.html"),
    );
    let rec = run_ok(
        superprof()
            .args(["record", "-q", "-o"])
            .arg(&recorded)
            .arg("-o")
            .arg(&parquet)
            .arg("--")
            .arg(&exe)
            .args(["1.0", "20", "30", "50"]),
    );
    run_ok(
        superprof()
            .arg("report")
            .arg(&parquet)
            .arg("-o")
            .arg(&reported),
    );
    let truth = fixture_values(&String::from_utf8_lossy(&rec.stdout));
    let samples: f64 = {
        let out = run_ok(
            superprof()
                .arg("report")
                .arg(&parquet)
                .args(["--format", "folded"]),
        );
        Folded::parse(&String::from_utf8_lossy(&out.stdout)).total() as f64
    };
    for page in [&recorded, &reported] {
        let found = check(&dir, page);
        let what = page.display();
        assert_eq!(found["loaded"], true, "{what}: {found}");
        assert!(
            found["initial"].as_str().unwrap().contains("split"),
            "{what}: the command names the profile: {found}"
        );
        // Nothing asked of the network, nor of the disk but the page itself.
        for url in found["requests"].as_array().unwrap() {
            let url = url.as_str().unwrap();
            assert!(
                url == format!("file://{}", page.display()) || url.starts_with("data:"),
                "{what}: requested {url}"
            );
        }
        assert!(found["details"].as_str().is_some(), "{what}: {found}");
        assert!(found["narrow"].as_str().is_some(), "{what}: {found}");
        assert_eq!(
            found["zoomed"], true,
            "{what}: a double click zooms: {found}"
        );
        assert_eq!(found["time_order_shot_differs"], true, "{what}: {found}");
        // The table: each function's total share as the top table gives it (speedscope
        // rounds to whole percents).
        let table = found["sandwich_text"].as_str().unwrap();
        let lines: Vec<&str> = table.lines().map(str::trim).collect();
        for f in ["work_alpha", "work_beta", "work_gamma"] {
            let at = lines
                .iter()
                .position(|l| *l == f)
                .unwrap_or_else(|| panic!("{what}: no {f} in the table: {table}"));
            let total: f64 = lines[at - 2]
                .rsplit('(')
                .next()
                .and_then(|s| s.trim_end_matches("%)").parse().ok())
                .unwrap_or_else(|| panic!("{what}: {f}'s total in {:?}", &lines[at - 2..=at]));
            let want = top_total(&parquet, f);
            // And against what the fixture measured of itself: within 4σ of its own share
            // (and speedscope's rounding).
            let p = truth[f];
            let sigma = 100.0 * (p * (1.0 - p) / samples).sqrt();
            assert!(
                (total - 100.0 * p).abs() < 4.0 * sigma + 1.0,
                "{what}: {f} {total}%, the program measured {p}"
            );
            assert!(
                (total - want).abs() <= 1.0,
                "{what}: {f} {total}% against {want}%"
            );
        }
    }
}

/// A flamegraph SVG taller than the window (a few deep stacks among shallow ones) opens on its
/// base, in a real browser: scrolled down to where its frames are, not on the empty top.
#[test]
fn a_tall_flamegraph_opens_on_its_frames() {
    let _cpu = cpu_lock();
    let dir = TempDir::new("tall-svg");
    let exe = compile(&dir, "deep", &["deep.c"], &["-O1", "-g"]);
    let svg = dir.path("deep.svg");
    run_ok(
        superprof()
            .args(["record", "-q", "-o"])
            .arg(&svg)
            .arg(&exe)
            .arg("0.6"),
    );
    let v = in_chromium(&dir, "svg_check.js", &svg);
    let (height, window) = (v["height"].as_f64().unwrap(), v["window"].as_f64().unwrap());
    // 150 nested calls: far taller than the 800-pixel window.
    assert!(height > 2.0 * window, "{v}");
    assert!(v["scrolled"].as_f64().unwrap() > 0.0, "{v}");
    // The window shows the base: main, and shallow_work beside the first nested call (not
    // only the narrow top of the deep stack).
    let names: Vec<&str> = v["names"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|n| n.as_str())
        .collect();
    for f in ["main", "shallow_work", "nest"] {
        assert!(names.contains(&f), "{f} not in the first screen: {v}");
    }
}
