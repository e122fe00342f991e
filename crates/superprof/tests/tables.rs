//! Tables that read well (issue 17): long C++ names shortened in the top table (templates and
//! argument lists elided), whole with -v; columns aligned; the module by its file name; and on
//! a terminal, lines that fit its width.

mod common;

use std::process::Command;
use std::sync::OnceLock;

use common::*;

/// A recording of the templates fixture: (its folder, the profile).
fn profile() -> &'static (TempDir, std::path::PathBuf) {
    static P: OnceLock<(TempDir, std::path::PathBuf)> = OnceLock::new();
    P.get_or_init(|| {
        let _cpu = cpu_lock();
        let dir = TempDir::new("tables");
        let exe = dir.path("templates");
        run_ok(
            Command::new("g++")
                .args(["-O2", "-g", "-o"])
                .arg(&exe)
                .arg(fixtures_dir().join("templates.cpp")),
        );
        let parquet = dir.path("t.parquet");
        run_ok(
            superprof()
                .args(["record", "-q", "-o"])
                .arg(&parquet)
                .arg("--")
                .arg(&exe)
                .arg("0.6"),
        );
        (dir, parquet)
    })
}

fn report(args: &[&str]) -> String {
    let out = run_ok(superprof().arg("report").arg(&profile().1).args(args));
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// The whole demangled name of the hot member, from the folded stacks.
fn full_name() -> String {
    let folded = Folded::parse(&report(&["--format", "folded"]));
    let (stack, _) = folded.0.iter().max_by_key(|(_, n)| *n).unwrap();
    let name = stack
        .iter()
        .find(|f| f.contains("::refresh("))
        .unwrap_or_else(|| panic!("no refresh in {stack:?}"));
    assert!(name.len() > 150, "{name}");
    name.clone()
}

#[test]
fn long_names_are_shortened_and_whole_with_v() {
    let table = report(&[]);
    let row = table
        .lines()
        .find(|l| l.contains("engine::Cache<…>::refresh(…)"))
        .unwrap_or_else(|| panic!("no shortened row in\n{table}"));
    // The module by its file name.
    assert!(row.split_whitespace().any(|w| w == "templates"), "{row}");
    // Every row's module starts under the header's.
    let header = table.lines().find(|l| l.contains("Module")).unwrap();
    let col = header.find("Module").unwrap();
    for line in table.lines().skip_while(|l| !l.contains("Module")).skip(1) {
        let chars: Vec<char> = line.chars().collect();
        assert!(
            chars.len() > col && chars[col - 1] == ' ' && chars[col] != ' ',
            "misaligned:\n{table}"
        );
    }
    let verbose = report(&["-v"]);
    assert!(verbose.contains(&full_name()), "{verbose}");
}

#[test]
fn on_a_terminal_the_table_fits_its_width() {
    profile();
    for cols in [72usize, 100] {
        let cmd = format!(
            "{} report {}",
            env!("CARGO_BIN_EXE_superprof"),
            profile().1.display()
        );
        // script(1) runs the command on a pseudo-terminal.
        let out = run_ok(
            Command::new("script")
                .args(["-qc", &cmd, "/dev/null"])
                .env("COLUMNS", cols.to_string()),
        );
        let text = String::from_utf8_lossy(&out.stdout).replace('\r', "");
        assert!(text.contains("refresh"), "{text}");
        // The table's lines (the summary above it is prose, wrapped by the terminal).
        for line in text.lines().skip_while(|l| !l.contains("Module")) {
            assert!(line.chars().count() <= cols, "{cols}: {line:?}\n{text}");
        }
    }
}
