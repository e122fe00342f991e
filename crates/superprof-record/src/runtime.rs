//! Runtimes that name their JIT code only when asked (issue 34): when superprof launches one,
//! it asks for them, so that `record -- node app.js` comes out named with no flags.
//!
//! - node: `--perf-basic-prof` added to `NODE_OPTIONS` (kept by the worker threads and the
//!   node processes it starts): /tmp/perf-PID.map names its compiled JavaScript.
//! - java: `-XX:+PreserveFramePointer` (its compiled methods keep frame pointers, so stacks
//!   unwind through them to the thread's root) and `-XX:+DumpPerfMapAtExit` (the map of its
//!   compiled methods written at exit), put on its command line after the program name: a
//!   `JAVA_TOOL_OPTIONS` would make the JVM print "Picked up ..." on stderr, changing the
//!   program's output. An attached JVM writes its map when superprof asks (`jcmd PID
//!   Compiler.perfmap`, at the end of the recording).
//! - python: `PYTHONPERFSUPPORT=1` (Python 3.12 and later: perf trampolines, one perf map
//!   entry per Python function). Said where the program's name gives its version
//!   (`python3.12`, or a `python3` linked to it); set without a word where it does not (a pyenv
//!   shim: earlier versions ignore the variable); left out for a known earlier version.
//!
//! Each is said once on stderr, and none where the user set it already. When attaching, where
//! the runtime's flags cannot change any more, a one-line hint names the flag.

use std::ffi::{OsStr, OsString};
use std::path::Path;

/// A runtime superprof knows how to ask for names.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Runtime {
    /// Node.js (V8).
    Node,
    /// A JVM launched as `java`.
    Java,
    /// CPython.
    Python,
}

/// What launching a command with the runtime's setup changes.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Setup {
    /// The command line to run (the program and its arguments).
    pub command: Vec<OsString>,
    /// Environment variables set for it (on top of superprof's own environment).
    pub env: Vec<(OsString, OsString)>,
    /// What was changed, for the one line on stderr (None: nothing).
    pub notice: Option<String>,
}

/// The JVM options that name and unwind compiled methods.
const JAVA_OPTIONS: [&str; 2] = ["-XX:+PreserveFramePointer", "-XX:+DumpPerfMapAtExit"];
/// `-XX:+DumpPerfMapAtExit` is a diagnostic option in JDK 17: it needs this before it (and
/// it is harmless where the option is a product one).
const JAVA_UNLOCK: &str = "-XX:+UnlockDiagnosticVMOptions";

impl Runtime {
    /// The runtime whose program file is `program` (the command resolved: `/usr/bin/node`,
    /// `/usr/lib/jvm/.../bin/java`, a pyenv shim named `python3`), by its name and, for a
    /// link, the name of what it points to.
    pub fn of_program(program: &Path) -> Option<Runtime> {
        let by_name = |p: &Path| {
            p.file_name()
                .and_then(OsStr::to_str)
                .and_then(Runtime::of_name)
        };
        by_name(program).or_else(|| by_name(&std::fs::canonicalize(program).ok()?))
    }

    /// The runtime a program file name is (`node`, `nodejs`, `java`, `python`, `python3`,
    /// `python3.12`).
    pub fn of_name(name: &str) -> Option<Runtime> {
        match name {
            "node" | "nodejs" => Some(Runtime::Node),
            "java" => Some(Runtime::Java),
            _ if name == "python"
                || name.strip_prefix("python").is_some_and(|v| {
                    !v.is_empty() && v.chars().all(|c| c.is_ascii_digit() || c == '.')
                }) =>
            {
                Some(Runtime::Python)
            }
            _ => None,
        }
    }

    /// The runtime's name.
    pub fn name(self) -> &'static str {
        match self {
            Runtime::Node => "node",
            Runtime::Java => "java",
            Runtime::Python => "python",
        }
    }
}

/// The command `command` (whose program resolved to `program`) as superprof launches it, with
/// what its runtime needs to name its code; `env` reads superprof's own environment (the
/// user's settings are kept and extended, never replaced).
pub fn setup(
    program: &Path,
    command: &[OsString],
    env: impl Fn(&str) -> Option<OsString>,
) -> Setup {
    let mut s = Setup {
        command: command.to_vec(),
        ..Setup::default()
    };
    let Some(runtime) = Runtime::of_program(program) else {
        return s;
    };
    let off = " (--no-runtime-setup leaves it as it is)";
    match runtime {
        Runtime::Node => {
            let current = env("NODE_OPTIONS").unwrap_or_default();
            let words = current.to_string_lossy();
            let given = words
                .split_whitespace()
                .any(|w| w.starts_with("--perf-basic-prof") || w.starts_with("--perf-prof"))
                || s.command.iter().skip(1).any(|a| {
                    let a = a.to_string_lossy();
                    a.starts_with("--perf-basic-prof") || a.starts_with("--perf-prof")
                });
            if !given {
                let mut value = current.clone();
                if !value.is_empty() {
                    value.push(" ");
                }
                value.push("--perf-basic-prof");
                s.env.push(("NODE_OPTIONS".into(), value));
                s.notice = Some(format!(
                    "superprof: node runs with --perf-basic-prof (NODE_OPTIONS), which names its \
                     JIT-compiled functions{off}"
                ));
            }
        }
        Runtime::Java => {
            let has = |o: &str| {
                let name = &o[5..]; // the option without its "-XX:+"
                s.command.iter().skip(1).any(|a| {
                    let a = a.to_string_lossy();
                    a.strip_prefix("-XX:+").or_else(|| a.strip_prefix("-XX:-")) == Some(name)
                })
            };
            let added: Vec<&str> = JAVA_OPTIONS.iter().copied().filter(|o| !has(o)).collect();
            if !added.is_empty() && s.command.len() > 1 {
                let mut options: Vec<OsString> = Vec::new();
                if added.contains(&"-XX:+DumpPerfMapAtExit") {
                    options.push(JAVA_UNLOCK.into());
                }
                options.extend(added.iter().map(OsString::from));
                s.command.splice(1..1, options);
                s.notice = Some(format!(
                    "superprof: java runs with {}: its compiled methods keep frame pointers and \
                     are named{off}",
                    added.join(" ")
                ));
            }
        }
        Runtime::Python => {
            let version = python_version(program);
            let given = env("PYTHONPERFSUPPORT").is_some()
                || s.command.windows(2).any(|w| w[0] == "-X" && w[1] == "perf")
                || s.command.iter().any(|a| a == "-Xperf");
            if !given && version.is_none_or(|v| v >= (3, 12)) {
                s.env.push(("PYTHONPERFSUPPORT".into(), "1".into()));
                if let Some((major, minor)) = version {
                    s.notice = Some(format!(
                        "superprof: python{major}.{minor} runs with PYTHONPERFSUPPORT=1, which \
                         names its Python functions{off}"
                    ));
                }
            }
        }
    }
    s
}

/// The version a Python program's file name gives (`python3.12`, or what `python3` links
/// to): None where it gives none.
fn python_version(program: &Path) -> Option<(u32, u32)> {
    let of = |p: &Path| {
        let v = p.file_name()?.to_str()?.strip_prefix("python")?;
        let (major, minor) = v.split_once('.')?;
        Some((major.parse().ok()?, minor.parse().ok()?))
    };
    of(program).or_else(|| of(&std::fs::canonicalize(program).ok()?))
}

/// A one-line hint for a process attached to, whose runtime was started without what names
/// its code (and superprof cannot change that now); None when there is nothing to say.
/// `cmdline` and `environ` are the process's, NUL-separated (/proc/PID/cmdline, environ).
pub fn attach_hint(exe: &Path, cmdline: &[u8], environ: &[u8]) -> Option<String> {
    let runtime = Runtime::of_program(exe)?;
    let words = |b: &[u8]| -> Vec<String> {
        b.split(|&c| c == 0)
            .filter(|w| !w.is_empty())
            .map(|w| String::from_utf8_lossy(w).into_owned())
            .collect()
    };
    let args = words(cmdline);
    let vars = words(environ);
    let var = |name: &str| {
        vars.iter()
            .find_map(|v| v.strip_prefix(name).and_then(|r| r.strip_prefix('=')))
            .map(str::to_owned)
    };
    match runtime {
        Runtime::Node => {
            let asked =
                |w: &str| w.starts_with("--perf-basic-prof") || w.starts_with("--perf-prof");
            let given = args.iter().any(|a| asked(a))
                || var("NODE_OPTIONS").is_some_and(|o| o.split_whitespace().any(asked));
            (!given).then(|| {
                "superprof: this node was started without --perf-basic-prof: its JIT-compiled \
                 functions stay unnamed (start it with --perf-basic-prof, or let superprof \
                 launch it)"
                    .to_owned()
            })
        }
        Runtime::Java => {
            let fp = args.iter().any(|a| a == "-XX:+PreserveFramePointer")
                || var("JAVA_TOOL_OPTIONS")
                    .is_some_and(|o| o.contains("-XX:+PreserveFramePointer"));
            (!fp).then(|| {
                "superprof: this JVM was started without -XX:+PreserveFramePointer: stacks stop \
                 at its compiled methods (start it with -XX:+PreserveFramePointer, or let \
                 superprof launch it); its methods are named through jcmd's Compiler.perfmap"
                    .to_owned()
            })
        }
        Runtime::Python => None,
    }
}

/// Asks the JVM `pid` for its perf map now (`jcmd PID Compiler.perfmap`, which writes
/// /tmp/perf-PID.map), within 20 s; whether it was written. Where jcmd is missing or the JVM
/// does not answer, the methods stay unnamed.
pub fn java_perf_map(pid: u32) -> bool {
    let Ok(mut child) = std::process::Command::new("jcmd")
        .arg(pid.to_string())
        .arg("Compiler.perfmap")
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
    else {
        return false;
    };
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(20);
    loop {
        match child.try_wait() {
            Ok(Some(status)) => return status.success(),
            Ok(None) if std::time::Instant::now() < deadline => {
                std::thread::sleep(std::time::Duration::from_millis(20));
            }
            _ => {
                let _ = child.kill();
                let _ = child.wait();
                return false;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn os(v: &[&str]) -> Vec<OsString> {
        v.iter().map(OsString::from).collect()
    }

    #[test]
    fn runtimes_are_known_by_their_program_names() {
        assert_eq!(Runtime::of_name("node"), Some(Runtime::Node));
        assert_eq!(Runtime::of_name("nodejs"), Some(Runtime::Node));
        assert_eq!(Runtime::of_name("java"), Some(Runtime::Java));
        for p in ["python", "python3", "python3.12", "python3.13"] {
            assert_eq!(Runtime::of_name(p), Some(Runtime::Python), "{p}");
        }
        for p in ["python3-config", "pythonista", "javac", "nodemon", "bash"] {
            assert_eq!(Runtime::of_name(p), None, "{p}");
        }
    }

    #[test]
    fn node_gets_perf_maps_and_keeps_its_options() {
        let s = setup(Path::new("/usr/bin/node"), &os(&["node", "app.js"]), |_| {
            None
        });
        assert_eq!(s.command, os(&["node", "app.js"]));
        assert_eq!(
            s.env,
            vec![("NODE_OPTIONS".into(), "--perf-basic-prof".into())]
        );
        assert!(s.notice.is_some());
        // The user's options kept, ours after them.
        let s = setup(Path::new("/usr/bin/node"), &os(&["node", "app.js"]), |k| {
            (k == "NODE_OPTIONS").then(|| "--max-old-space-size=100".into())
        });
        assert_eq!(
            s.env,
            vec![(
                "NODE_OPTIONS".into(),
                "--max-old-space-size=100 --perf-basic-prof".into()
            )]
        );
        // Asked for already: nothing changes, nothing said.
        let given = os(&["node", "--perf-basic-prof-only-functions", "app.js"]);
        let s = setup(Path::new("/usr/bin/node"), &given, |_| None);
        assert_eq!((s.command, s.env, s.notice), (given, vec![], None));
    }

    #[test]
    fn java_gets_its_options_after_the_program_name() {
        let s = setup(
            Path::new("/usr/bin/java"),
            &os(&["java", "-cp", ".", "Main", "arg"]),
            |_| None,
        );
        assert_eq!(
            s.command,
            os(&[
                "java",
                "-XX:+UnlockDiagnosticVMOptions",
                "-XX:+PreserveFramePointer",
                "-XX:+DumpPerfMapAtExit",
                "-cp",
                ".",
                "Main",
                "arg"
            ])
        );
        assert!(s.env.is_empty());
        // One given (even switched off): only the other is added.
        let s = setup(
            Path::new("/usr/bin/java"),
            &os(&["java", "-XX:-PreserveFramePointer", "Main"]),
            |_| None,
        );
        assert_eq!(
            s.command,
            os(&[
                "java",
                "-XX:+UnlockDiagnosticVMOptions",
                "-XX:+DumpPerfMapAtExit",
                "-XX:-PreserveFramePointer",
                "Main"
            ])
        );
        // `java` alone (it prints its usage): left as it is.
        let s = setup(Path::new("/usr/bin/java"), &os(&["java"]), |_| None);
        assert_eq!(s.command, os(&["java"]));
    }

    #[test]
    fn python_gets_its_trampolines_where_they_exist_unless_set() {
        let on = vec![("PYTHONPERFSUPPORT".into(), "1".into())];
        let s = setup(
            Path::new("/x/python3.12"),
            &os(&["python3.12", "a.py"]),
            |_| None,
        );
        assert_eq!(s.env, on);
        assert!(s.notice.is_some_and(|n| n.contains("python3.12")));
        // A version without them: nothing; a version unknown (a shim): set, not said.
        let s = setup(
            Path::new("/x/python3.11"),
            &os(&["python3.11", "a.py"]),
            |_| None,
        );
        assert!(s.env.is_empty() && s.notice.is_none());
        let s = setup(
            Path::new("/x/no/such/python3"),
            &os(&["python3", "a.py"]),
            |_| None,
        );
        assert_eq!((s.env, s.notice), (on, None));
        // Asked already, or refused: left as it is.
        let s = setup(
            Path::new("/x/python3.13"),
            &os(&["python3.13", "a.py"]),
            |k| (k == "PYTHONPERFSUPPORT").then(|| "0".into()),
        );
        assert!(s.env.is_empty() && s.notice.is_none());
        let given = os(&["python3.13", "-X", "perf", "a.py"]);
        assert!(setup(Path::new("/x/python3.13"), &given, |_| None)
            .env
            .is_empty());
    }

    #[test]
    fn other_programs_are_left_alone() {
        let s = setup(Path::new("/bin/sh"), &os(&["sh", "-c", "node x"]), |_| None);
        assert_eq!(
            s,
            Setup {
                command: os(&["sh", "-c", "node x"]),
                ..Setup::default()
            }
        );
    }

    #[test]
    fn attached_runtimes_get_a_hint_only_without_their_flags() {
        let node = Path::new("/usr/bin/node");
        assert!(attach_hint(node, b"node\0app.js\0", b"HOME=/root\0").is_some());
        assert!(attach_hint(node, b"node\0--perf-basic-prof\0app.js\0", b"").is_none());
        assert!(
            attach_hint(node, b"node\0app.js\0", b"NODE_OPTIONS=--perf-basic-prof\0").is_none()
        );
        let java = Path::new("/usr/bin/java");
        assert!(attach_hint(java, b"java\0Main\0", b"").is_some());
        assert!(attach_hint(java, b"java\0-XX:+PreserveFramePointer\0Main\0", b"").is_none());
        assert!(attach_hint(Path::new("/bin/bash"), b"bash\0", b"").is_none());
    }
}
