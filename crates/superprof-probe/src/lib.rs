//! Exact counts in a running program, on three probe engines (engine.rs: in-process, uprobe,
//! ptrace): `stat`'s counters per function or address range ([`stat`], after Perforator), and
//! `blocks`' executions of each basic block ([`blocks`]). Regions are given as the user writes
//! them (region.rs: a function, an address range, source lines) and placed in the process; the
//! in-process engine (inprocess.rs) patches the program's code with jumps to counting
//! trampolines.
//!
//! Nothing here parses arguments or installs signal handlers: the caller (the `superprof`
//! binary) gives a config with a `stop` check, and writes what [`stat::render`] and
//! [`blocks::render`] make.
#![deny(missing_docs)]

pub mod blocks;
mod engine;
mod inprocess;
mod region;
mod shm;
pub mod stat;

pub use engine::{calibration_workload, EntryKind};
pub use region::RegionSpec;

use superprof_trace::ExitStatus;

/// What went wrong while probing, in one line with its cause.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// What cannot be done, said in full.
    #[error("{0}")]
    Message(String),
    /// The target ran to its end with nothing to show (a region never found): superprof
    /// says why and exits with the command's status.
    #[error("{why}")]
    NothingToShow {
        /// Why, in one line.
        why: String,
        /// How the command ended.
        status: ExitStatus,
    },
    /// The tracer (every engine traces the program) failed.
    #[error("{0}")]
    Trace(#[from] superprof_trace::TraceError),
    /// The command could not be run (the shell's 126 or 127).
    #[error("{0}")]
    CannotRun(#[from] superprof_trace::CannotRun),
    /// A counter could not be opened.
    #[error("{0}")]
    Sample(#[from] superprof_sample::SampleError),
    /// A uprobe group that could not be opened.
    #[error("{0}")]
    Probe(#[from] superprof_sample::ProbeError),
    /// Sample mode's recording failed.
    #[error("{0}")]
    Record(#[from] superprof_record::Error),
    /// Another system call failed.
    #[error("{0}")]
    Io(#[from] std::io::Error),
    /// `source`, with what was being done.
    #[error("{what}: {source}")]
    While {
        /// What was being done.
        what: String,
        /// What went wrong.
        #[source]
        source: Box<Error>,
    },
}

/// A result whose error is an [`Error`].
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// An error said with what was being done (as `anyhow::Context`, for this crate's [`Error`]).
pub(crate) trait Context<T> {
    fn context(self, what: impl Into<String>) -> Result<T>;
    fn with_context<S: Into<String>>(self, what: impl FnOnce() -> S) -> Result<T>;
}

impl<T, E: Into<Error>> Context<T> for std::result::Result<T, E> {
    fn context(self, what: impl Into<String>) -> Result<T> {
        self.map_err(|e| Error::While {
            what: what.into(),
            source: Box::new(e.into()),
        })
    }

    fn with_context<S: Into<String>>(self, what: impl FnOnce() -> S) -> Result<T> {
        self.map_err(|e| Error::While {
            what: what().into(),
            source: Box::new(e.into()),
        })
    }
}

impl<T> Context<T> for Option<T> {
    fn context(self, what: impl Into<String>) -> Result<T> {
        self.ok_or_else(|| Error::Message(what.into()))
    }

    fn with_context<S: Into<String>>(self, what: impl FnOnce() -> S) -> Result<T> {
        self.ok_or_else(|| Error::Message(what().into()))
    }
}

/// An [`Error::Message`] made with `format!`.
macro_rules! err {
    ($($arg:tt)*) => {
        $crate::Error::Message(format!($($arg)*))
    };
}

/// Returns an [`Error::Message`] made with `format!`.
macro_rules! bail {
    ($($arg:tt)*) => {
        return Err($crate::err!($($arg)*))
    };
}

pub(crate) use {bail, err};

/// Which engine probes (`--engine`; none: superprof chooses).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum EngineKind {
    /// Jumps to trampolines mapped into the program (x86_64, AArch64): no stop per call.
    InProcess,
    /// Kernel uprobes (root): a trap per probe, in the kernel, no stop.
    Uprobe,
    /// The coordinator's breakpoints: the program stops at each (any user who may trace it).
    Ptrace,
}

/// How results are written: an aligned table, CSV or JSON.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Format {
    /// Aligned columns, with notes.
    Table,
    /// Comma-separated values, a header line first.
    Csv,
    /// One JSON document.
    Json,
}
