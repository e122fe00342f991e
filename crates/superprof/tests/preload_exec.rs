//! `superprof preload` and programs that exec (issue 12, item 2): nothing of libsuperprof
//! outlives the image it was loaded into. A statically linked program run by a preloaded
//! shell, a program started with LD_PRELOAD removed, and a setuid program (the dynamic loader
//! ignores LD_PRELOAD for it) run to their end, with their output and exit status. With
//! ITIMER_PROF as the sampling clock each died of "Profiling timer expired" (status 155).

mod common;

use std::process::Output;

use common::*;

fn preload(dir: &TempDir, cmd: &[&std::ffi::OsStr]) -> Output {
    superprof()
        .args(["preload", "-q", "-o"])
        .arg(dir.path("p.folded"))
        .arg("--")
        .args(cmd)
        .output()
        .unwrap()
}

fn assert_ran(out: &Output, status: i32, runs: usize) {
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.code() == Some(status) && stdout.matches("exec_child ran").count() == runs,
        "{:?}\nstdout: {stdout}\nstderr: {}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
}

#[test]
fn a_static_program_run_by_a_preloaded_shell() {
    let _cpu = cpu_lock();
    let dir = TempDir::new("preload-static");
    let exe = compile(&dir, "child", &["exec_child.c"], &["-O2", "-static"]);
    let exe = exe.to_str().unwrap();
    // bash execs a single command in place; with two, it forks for the first.
    let out = preload(
        &dir,
        &[
            "bash".as_ref(),
            "-c".as_ref(),
            format!("{exe} 0.3 5").as_ref(),
        ],
    );
    assert_ran(&out, 5, 1);
    let script = format!("{exe} 0.2 0; {exe} 0.2 6");
    let out = preload(&dir, &["bash".as_ref(), "-c".as_ref(), script.as_ref()]);
    assert_ran(&out, 6, 2);
}

#[test]
fn a_program_started_without_ld_preload() {
    let _cpu = cpu_lock();
    let dir = TempDir::new("preload-unset");
    let exe = compile(&dir, "child", &["exec_child.c"], &["-O2"]);
    let out = preload(
        &dir,
        &[
            "env".as_ref(),
            "-u".as_ref(),
            "LD_PRELOAD".as_ref(),
            exe.as_os_str(),
            "0.3".as_ref(),
            "4".as_ref(),
        ],
    );
    assert_ran(&out, 4, 1);
    assert!(String::from_utf8_lossy(&out.stdout).contains("sigprof=dfl"));
}

#[test]
fn a_setuid_program_run_by_a_preloaded_shell() {
    use std::os::unix::fs::PermissionsExt;
    require_root("a setuid program of another user");
    let _cpu = cpu_lock();
    let dir = TempDir::new("preload-setuid");
    let exe = compile(&dir, "child", &["exec_child.c"], &["-O2"]);
    std::os::unix::fs::chown(&exe, Some(65534), Some(65534)).unwrap();
    std::fs::set_permissions(&exe, std::fs::Permissions::from_mode(0o4755)).unwrap();
    let script = format!("{} 0.3 3", exe.display());
    let out = preload(&dir, &["bash".as_ref(), "-c".as_ref(), script.as_ref()]);
    assert_ran(&out, 3, 1);
    assert!(String::from_utf8_lossy(&out.stdout).contains("euid=65534"));
}
