//! Shell completions and man pages (issue 17), tried in a real bash and a real `man`.

mod common;

use std::process::Command;

use common::*;

/// What bash completes `words` to (the last word is the one completed), with superprof's
/// completion script sourced.
fn bash_completes(words: &[&str]) -> Vec<String> {
    let script = run_ok(superprof().args(["completions", "bash"])).stdout;
    let dir = TempDir::new("completion");
    let path = dir.path("superprof.bash");
    std::fs::write(&path, script).unwrap();
    let line = words.join(" ");
    let quoted: Vec<String> = words.iter().map(|w| format!("'{w}'")).collect();
    let prog = format!(
        "source '{}'\n\
         COMP_WORDS=({})\n\
         COMP_CWORD={}\n\
         COMP_LINE='{line}'\n\
         COMP_POINT={}\n\
         _superprof superprof '{}' '{}'\n\
         printf '%s\\n' \"${{COMPREPLY[@]}}\"",
        path.display(),
        quoted.join(" "),
        words.len() - 1,
        line.len(),
        words[words.len() - 1],
        words[words.len().saturating_sub(2)],
    );
    let out = run_ok(Command::new("bash").arg("-c").arg(prog));
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .map(str::to_owned)
        .collect()
}

#[test]
fn bash_completes_subcommands_and_their_options() {
    let _cpu = cpu_share();
    let subs = bash_completes(&["superprof", "re"]);
    assert!(
        subs.contains(&"record".to_owned()) && subs.contains(&"report".to_owned()),
        "{subs:?}"
    );
    assert!(
        !subs.iter().any(|s| s.starts_with("__")),
        "hidden: {subs:?}"
    );
    let opts = bash_completes(&["superprof", "record", "--off"]);
    assert_eq!(opts, vec!["--off-cpu".to_owned()]);
    let values = bash_completes(&["superprof", "record", "--sampler", ""]);
    for v in ["auto", "perf", "ptrace"] {
        assert!(values.contains(&v.to_owned()), "{values:?}");
    }
}

#[test]
fn zsh_and_fish_scripts_name_every_subcommand() {
    let _cpu = cpu_share();
    for shell in ["zsh", "fish"] {
        let out = run_ok(superprof().args(["completions", shell]));
        let text = String::from_utf8_lossy(&out.stdout);
        for word in ["record", "report", "stat", "blocks", "syscalls", "off-cpu"] {
            assert!(text.contains(word), "{shell}: no {word}");
        }
        // Hidden subcommands (internal entry points) are never offered: fish names them
        // nowhere, zsh not in its list of subcommands (`'NAME:about'`).
        for hidden in ["__demo-workload", "__stat-calibration"] {
            let offered = match shell {
                "fish" => text.contains(hidden),
                _ => text.lines().any(|l| l.starts_with(&format!("'{hidden}:"))),
            };
            assert!(!offered, "{shell} offers {hidden}");
        }
    }
}

/// `superprof man ARGS` rendered by man(1), as text.
fn rendered(args: &[&str]) -> String {
    let page = run_ok(superprof().arg("man").args(args)).stdout;
    let dir = TempDir::new("man");
    let path = dir.path("page.1");
    std::fs::write(&path, page).unwrap();
    let out = run_ok(
        Command::new("man")
            .arg("-l")
            .arg(&path)
            .env("MANPAGER", "cat")
            .env("MANWIDTH", "100")
            .env("LC_ALL", "C"),
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

#[test]
fn man_renders_the_pages_of_superprof_and_its_subcommands() {
    let _cpu = cpu_share();
    let main = rendered(&[]);
    assert!(main.contains("superprof"), "{main}");
    for sub in [
        "record", "report", "stat", "blocks", "syscalls", "qemu", "preload",
    ] {
        assert!(main.contains(sub), "no {sub} in\n{main}");
    }
    assert!(!main.contains("__stat-calibration"), "{main}");
    let record = rendered(&["record"]);
    assert!(record.contains("superprof-record"), "{record}");
    assert!(record.contains("--off-cpu"), "{record}");
    // An unknown page: one line, the list of pages.
    let out = superprof().args(["man", "nosuch"]).output().unwrap();
    assert_one_line_error(&out, "no subcommand 'nosuch'");
}
