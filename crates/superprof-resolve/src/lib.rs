//! superprof-resolve: the one place where `record`, `qemu`, `preload`, libsuperprof, `demo`
//! and `blocks` turn code addresses into the profile's frames and a profile into files, so
//! that they name the same code the same way and write the same files.
//!
//! - [`Namer`]: frames of code in an ELF file (functions, file:line, inlined calls; code
//!   without a name as `module+0xSTART`, the start of its function where the CFI tells it),
//!   of the kernel (`[kernel.kallsyms]`), and of code in no file (JIT code named from the
//!   process's `/tmp/perf-PID.map`, else `[unknown]+0xADDR`).
//! - [`stamp`]: the metadata every profile carries (superprof's version, the host).
//! - [`check_outputs`] and [`write_output`]: output paths checked before anything runs (format
//!   by extension, writable), and each file written whole (a temporary file renamed).
//! - [`Console`], [`check_text_output`] and [`write_text`]: where text results (tables, JSON,
//!   CSV) go without `-o`, and the same whole-file writing for them.
#![forbid(unsafe_code)]
#![deny(missing_docs)]

pub mod progress;

use std::collections::HashMap;
use std::path::{Path, PathBuf};

use superprof_profile::{FrameId, Meta, OutputFormat, Profile};
use superprof_symbols::{address_name, JitDump, PerfMap, SymFrame};

/// The module name of kernel frames (as perf shows it).
pub const KERNEL_MODULE: &str = "[kernel.kallsyms]";
/// The module name of code in no known file.
pub const UNKNOWN_MODULE: &str = "[unknown]";
/// The output written when none is given.
pub const DEFAULT_OUTPUT: &str = "superprof.parquet";

/// Names frames the same way everywhere; keeps the perf maps it has read.
#[derive(Default)]
pub struct Namer {
    perf_maps: HashMap<u32, Option<PerfMap>>,
    /// Each process's user (whose perf map may be trusted).
    owners: HashMap<u32, u32>,
    /// Where perf maps are (/tmp).
    map_dir: Option<PathBuf>,
    /// Each process's jitdump (found by its marker mapping), once read.
    jitdumps: HashMap<u32, (PathBuf, Option<Option<JitDump>>)>,
}

impl Namer {
    /// A namer that looks for perf maps in /tmp and knows no process's owner or jitdump yet.
    pub fn new() -> Namer {
        Namer::default()
    }

    /// Perf maps are looked for in `dir` instead of /tmp (tests).
    pub fn with_map_dir(dir: &Path) -> Namer {
        Namer {
            map_dir: Some(dir.to_owned()),
            ..Namer::default()
        }
    }

    /// Process `pid` runs as `uid`: its perf map may be owned by it.
    pub fn set_owner(&mut self, pid: u32, uid: u32) {
        self.owners.insert(pid, uid);
    }

    /// Process `pid` writes its JIT code's names into the jitdump at `path` (it mapped it).
    pub fn set_jitdump(&mut self, pid: u32, path: &Path) {
        self.jitdumps.insert(pid, (path.to_owned(), None));
    }

    /// Whether process `pid` writes a jitdump (its JIT code's names depend on the time).
    pub fn has_jitdump(&self, pid: u32) -> bool {
        self.jitdumps.contains_key(&pid)
    }

    /// The frames of ELF address `svma` of `module` (its path), outermost first, from what the
    /// symbolizer found there (`found`, outermost first; empty when nothing is known).
    pub fn elf_frames(
        &self,
        p: &mut Profile,
        module: &str,
        svma: u64,
        found: Vec<SymFrame>,
    ) -> Vec<FrameId> {
        if found.is_empty() {
            let name = address_name(module, svma);
            return vec![p.intern_frame_named(&name, module, None, 0, svma, false)];
        }
        found
            .into_iter()
            .map(|f| {
                let name = f.function.unwrap_or_else(|| address_name(module, svma));
                p.intern_frame_named(
                    &name,
                    module,
                    f.file.as_deref(),
                    f.line.unwrap_or(0),
                    svma,
                    f.inlined,
                )
            })
            .collect()
    }

    /// A frame of the kernel at `addr`, named `name` (from kallsyms) where it is known.
    pub fn kernel_frame(&self, p: &mut Profile, addr: u64, name: Option<&str>) -> FrameId {
        let name = name.map_or_else(|| address_name(KERNEL_MODULE, addr), str::to_owned);
        p.intern_frame_named(&name, KERNEL_MODULE, None, 0, addr, false)
    }

    /// A frame of code in no file at `addr` of process `pid`: JIT code named from the
    /// process's jitdump or perf map (module `jit-PID.dump` or `perf-PID.map`, as perf shows
    /// it), else `[unknown]+0xADDR`.
    pub fn anonymous_frame(&mut self, p: &mut Profile, pid: Option<u32>, addr: u64) -> FrameId {
        self.anonymous_frame_at(p, pid, addr, None)
    }

    /// [`Namer::anonymous_frame`] for a sample taken at `time` (CLOCK_MONOTONIC): JIT code from
    /// a jitdump is named after the code loaded at `addr` at that time (a runtime reuses the
    /// memory of code it freed).
    pub fn anonymous_frame_at(
        &mut self,
        p: &mut Profile,
        pid: Option<u32>,
        addr: u64,
        time: Option<u64>,
    ) -> FrameId {
        if let Some(pid) = pid {
            let owner = self.owners.get(&pid).copied();
            // The jitdump first (names, and source lines where the runtime gave them).
            if let Some((path, dump)) = self.jitdumps.get_mut(&pid) {
                let dump = dump.get_or_insert_with(|| JitDump::load(path, owner));
                if let Some((name, line)) = dump.as_ref().and_then(|d| d.lookup_at(addr, time)) {
                    let module = path
                        .file_name()
                        .map_or_else(String::new, |n| n.to_string_lossy().into_owned());
                    let (file, line) = line.map_or((None, 0), |(f, l)| (Some(f), l));
                    return p.intern_frame_named(name, &module, file, line, addr, false);
                }
            }
            let dir = self
                .map_dir
                .clone()
                .unwrap_or_else(|| PathBuf::from("/tmp"));
            let map = self
                .perf_maps
                .entry(pid)
                .or_insert_with(|| PerfMap::load(&dir, pid, owner));
            if let Some(m) = map {
                if let Some(name) = m.lookup(addr) {
                    let module = m
                        .path
                        .file_name()
                        .map_or_else(String::new, |n| n.to_string_lossy().into_owned());
                    return p.intern_frame_named(name, &module, None, 0, addr, false);
                }
            }
        }
        p.intern_frame_named(
            &address_name(UNKNOWN_MODULE, addr),
            UNKNOWN_MODULE,
            None,
            0,
            addr,
            false,
        )
    }
}

/// Fills what every profile's metadata says of where it was made: superprof's version and
/// the host's name.
pub fn stamp(meta: &mut Meta) {
    meta.version = env!("CARGO_PKG_VERSION").to_owned();
    meta.host = std::fs::read_to_string("/proc/sys/kernel/hostname")
        .map(|h| h.trim().to_owned())
        .unwrap_or_default();
}

/// An output that cannot be written: one line.
#[derive(Debug)]
pub struct OutputError(pub String);

impl std::fmt::Display for OutputError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for OutputError {}

/// Checks output paths before anything runs (none given: [`DEFAULT_OUTPUT`]): each must have
/// a known extension and be writable.
pub fn check_outputs(outputs: &[PathBuf]) -> Result<Vec<(PathBuf, OutputFormat)>, OutputError> {
    let paths = if outputs.is_empty() {
        vec![PathBuf::from(DEFAULT_OUTPUT)]
    } else {
        outputs.to_vec()
    };
    paths
        .into_iter()
        .map(|path| {
            let format = OutputFormat::for_path(&path).map_err(|e| OutputError(e.to_string()))?;
            superprof_profile::output::check_writable(&path).map_err(|e| {
                OutputError(format!("cannot write output '{}': {e}", path.display()))
            })?;
            Ok((path, format))
        })
        .collect()
}

/// Checks a text output (a table, JSON, CSV of `stat`, `blocks`) before anything runs.
pub fn check_text_output(path: &Path) -> Result<(), OutputError> {
    superprof_profile::output::check_writable(path)
        .map_err(|e| OutputError(format!("cannot write output '{}': {e}", path.display())))
}

/// Where results go without `-o`: stdout, unless superprof launched the program, whose
/// output stdout is (then stderr, as perf stat, strace and time do).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Console {
    /// Standard output: superprof attached to a running process, or launched nothing.
    Stdout,
    /// Standard error: superprof launched the program, which keeps stdout to itself.
    Stderr,
}

impl Console {
    /// The console of a run that launched its program (`launched`) or attached to one.
    pub fn of_run(launched: bool) -> Console {
        if launched {
            Console::Stderr
        } else {
            Console::Stdout
        }
    }

    /// This console, unbuffered (a log written as it comes).
    pub fn writer(self) -> Box<dyn std::io::Write + Send> {
        match self {
            Console::Stdout => Box::new(std::io::stdout()),
            Console::Stderr => Box::new(std::io::stderr()),
        }
    }

    /// Writes `what` to this console whole; a reader gone (stdout piped into `head`) is no
    /// error.
    pub fn write_with(
        self,
        what: impl FnOnce(&mut (dyn std::io::Write + Send)) -> std::io::Result<()>,
    ) -> std::io::Result<()> {
        let mut o = std::io::BufWriter::new(self.writer());
        let written = what(&mut o).and_then(|()| std::io::Write::flush(&mut o));
        match written {
            Err(e) if e.kind() == std::io::ErrorKind::BrokenPipe => Ok(()),
            r => r,
        }
    }
}

/// Writes a text output whole (a temporary file renamed over `output`), or to `console`.
pub fn write_text(output: Option<&Path>, console: Console, text: &str) -> std::io::Result<()> {
    match output {
        Some(out) => {
            superprof_profile::write_atomic(out, |w| std::io::Write::write_all(w, text.as_bytes()))
                .map_err(|e| {
                    std::io::Error::new(e.kind(), format!("cannot write '{}': {e}", out.display()))
                })
        }
        None => console.write_with(|w| w.write_all(text.as_bytes())),
    }
}

/// A profile that could not be written: where, and the system's reason (its errno kept).
#[derive(Debug)]
pub struct WriteError {
    /// The output file that could not be written.
    pub path: PathBuf,
    /// Why: the error of creating, filling, syncing or renaming the file (its errno kept).
    pub source: std::io::Error,
}

impl std::fmt::Display for WriteError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "cannot write '{}': {}", self.path.display(), self.source)
    }
}

impl std::error::Error for WriteError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        Some(&self.source)
    }
}

/// Writes `profile` to `path` in `format`, whole (a temporary file renamed over it); the title
/// (of a flamegraph, a viewer's tab) names the command.
pub fn write_output(
    profile: &Profile,
    path: &Path,
    format: OutputFormat,
) -> Result<(), WriteError> {
    let title = if profile.meta.command.is_empty() {
        "superprof".to_owned()
    } else {
        format!("superprof: {}", profile.meta.command.join(" "))
    };
    superprof_profile::write_atomic(path, |w| {
        superprof_profile::output::write(profile, format, &title, w)
    })
    .map_err(|source| WriteError {
        path: path.to_owned(),
        source,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_naming_for_unnamed_kernel_and_jit_code() {
        let mut p = Profile::default();
        let n = Namer::new();
        let f = n.elf_frames(&mut p, "/usr/lib/liblzma.so.5", 0x15ae0, Vec::new());
        assert_eq!(p.str(p.frame(f[0]).function), "liblzma.so.5+0x15ae0");
        assert_eq!(p.str(p.frame(f[0]).module), "/usr/lib/liblzma.so.5");
        let k = n.kernel_frame(&mut p, 0xffffffff81000000, None);
        assert_eq!(
            p.str(p.frame(k).function),
            "[kernel.kallsyms]+0xffffffff81000000"
        );
        let dir = std::env::temp_dir().join(format!("superprof-resolve-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::write(dir.join("perf-42.map"), "7f0000001000 100 JS:*hot x.js:1\n").unwrap();
        let mut n = Namer::with_map_dir(&dir);
        let j = n.anonymous_frame(&mut p, Some(42), 0x7f0000001010);
        assert_eq!(p.str(p.frame(j).function), "JS:*hot x.js:1");
        assert_eq!(p.str(p.frame(j).module), "perf-42.map");
        let u = n.anonymous_frame(&mut p, Some(42), 0x7f0000002000);
        assert_eq!(p.str(p.frame(u).function), "[unknown]+0x7f0000002000");
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn outputs_are_checked_before_anything_runs() {
        let e = check_outputs(&[PathBuf::from("/tmp/x.unknown")]).unwrap_err();
        assert!(e.0.contains("cannot tell the format"), "{e}");
        let e = check_outputs(&[PathBuf::from("/nonexistent-dir/x.folded")]).unwrap_err();
        assert!(e.0.contains("cannot write output"), "{e}");
        let ok = check_outputs(&[]).unwrap();
        assert_eq!(ok[0].0, PathBuf::from(DEFAULT_OUTPUT));
    }
}
