//! Nothing of libsuperprof outlives the program image (issue 12, item 2): a program that calls
//! exec while sampling (directly, from a fork child, into a statically linked program, into a
//! setuid program, through setpriv to another user) runs the new program to its end with its
//! exit status; stop puts SIGPROF's disposition back; a program's own SIGPROF handler and
//! ITIMER_PROF keep working after stop. With ITIMER_PROF as the sampling clock, the timer
//! survived exec while the handler did not, and each of these programs died of SIGPROF.

mod common;

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use common::*;

/// The parent (linked with libsuperprof.so) and the child it execs, static and dynamic.
struct Programs {
    dir: TempDir,
    parent: PathBuf,
    child_static: PathBuf,
    child_dynamic: PathBuf,
}

fn programs(tag: &str) -> Programs {
    let dir = TempDir::new(&format!("lib-{tag}"));
    let flags = ["-O2", "-g"];
    Programs {
        parent: compile(&dir, "parent", "exec_after_start.c", Link::Shared, &flags),
        child_static: compile(
            &dir,
            "child-static",
            "exec_child.c",
            Link::FullyStatic,
            &flags,
        ),
        child_dynamic: compile(&dir, "child-dynamic", "exec_child.c", Link::None, &flags),
        dir,
    }
}

fn run(parent: &Path, args: &[&std::ffi::OsStr]) -> Output {
    let _cpu = cpu_lock();
    Command::new(parent).args(args).output().unwrap()
}

/// The exec'd child ran to its end, with the status it was given.
fn assert_child_ran(out: &Output, status: i32) {
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        stdout.contains("exec_child ran") && stdout.contains(&format!("status={status}")),
        "{:?}\nstdout: {stdout}\nstderr: {}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
}

#[test]
fn exec_after_perf_start_runs_the_new_program_to_its_end() {
    let p = programs("exec");
    for child in [&p.child_static, &p.child_dynamic] {
        let out = run(
            &p.parent,
            &[
                "exec".as_ref(),
                child.as_os_str(),
                "0.3".as_ref(),
                "5".as_ref(),
            ],
        );
        assert_eq!(out.status.code(), Some(5), "{}", child.display());
        assert_child_ran(&out, 5);
        // The new image starts with SIGPROF's default action, as it would have alone.
        assert!(
            String::from_utf8_lossy(&out.stdout).contains("sigprof=dfl"),
            "{:?}",
            out
        );
    }
}

#[test]
fn a_fork_child_that_execs_while_the_parent_samples() {
    let p = programs("fork");
    let out = run(
        &p.parent,
        &[
            "fork".as_ref(),
            p.child_static.as_os_str(),
            "0.3".as_ref(),
            "6".as_ref(),
        ],
    );
    assert!(out.status.success(), "{out:?}");
    assert_child_ran(&out, 6);
    assert!(
        String::from_utf8_lossy(&out.stdout).contains("child status=6"),
        "{out:?}"
    );
}

#[test]
fn stop_puts_sigprof_back_for_the_programs_exec_runs_later() {
    let p = programs("stop");
    let out = run(
        &p.parent,
        &[
            "stop".as_ref(),
            p.child_dynamic.as_os_str(),
            "0.05".as_ref(),
            "3".as_ref(),
        ],
    );
    assert_eq!(out.status.code(), Some(3), "{out:?}");
    // Not SIG_IGN left behind by the sampler.
    assert!(
        String::from_utf8_lossy(&out.stdout).contains("sigprof=dfl"),
        "{out:?}"
    );
}

#[test]
fn the_programs_own_sigprof_handler_and_itimer_outlive_stop() {
    let p = programs("own");
    let out = run(&p.parent, &["own".as_ref()]);
    assert!(out.status.success(), "{out:?}");
    let v = fixture_values(&String::from_utf8_lossy(&out.stdout));
    assert_eq!(v.get("own_handler_kept"), Some(&1.0), "{out:?}");
    assert_eq!(v.get("hits_after_stop"), Some(&1.0), "{out:?}");
}

/// A copy of the child owned by nobody with the setuid bit: run by root, it gets AT_SECURE
/// (the dynamic loader then ignores LD_PRELOAD), euid nobody.
fn setuid_copy(p: &Programs) -> PathBuf {
    use std::os::unix::fs::PermissionsExt;
    // SAFETY: geteuid has no arguments and cannot fail.
    assert_eq!(
        unsafe { libc::geteuid() },
        0,
        "a setuid program of another user needs root; the suite runs as root (scripts/test)"
    );
    let exe = p.dir.join("child-setuid");
    std::fs::copy(&p.child_dynamic, &exe).unwrap();
    std::os::unix::fs::chown(&exe, Some(65534), Some(65534)).unwrap();
    std::fs::set_permissions(&exe, std::fs::Permissions::from_mode(0o4755)).unwrap();
    exe
}

#[test]
fn setuid_and_setpriv_children_after_perf_start() {
    let p = programs("setuid");
    let setuid = setuid_copy(&p);
    let out = run(
        &p.parent,
        &[
            "exec".as_ref(),
            setuid.as_os_str(),
            "0.3".as_ref(),
            "4".as_ref(),
        ],
    );
    assert_eq!(out.status.code(), Some(4), "{out:?}");
    assert_child_ran(&out, 4);
    assert!(
        String::from_utf8_lossy(&out.stdout).contains("euid=65534"),
        "{out:?}"
    );
    // setpriv to another user, which then execs the child.
    let setpriv = Path::new("/usr/bin/setpriv");
    assert!(setpriv.exists(), "no /usr/bin/setpriv (util-linux)");
    let out = run(
        &p.parent,
        &[
            "exec".as_ref(),
            setpriv.as_os_str(),
            "--reuid=65534".as_ref(),
            "--regid=65534".as_ref(),
            "--clear-groups".as_ref(),
            p.child_dynamic.as_os_str(),
            "0.3".as_ref(),
            "2".as_ref(),
        ],
    );
    assert_eq!(out.status.code(), Some(2), "{out:?}");
    assert_child_ran(&out, 2);
    assert!(
        String::from_utf8_lossy(&out.stdout).contains("uid=65534 euid=65534"),
        "{out:?}"
    );
}
