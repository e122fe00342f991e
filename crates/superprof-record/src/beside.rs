//! What runs beside the sampling on the coordinator's events (`record --precise`).

use superprof_trace::{TraceEvent, TraceOptions, Tracer};

/// Code of the program that no file maps (a trampoline superprof wrote), and the function
/// its samples belong to.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CodeName {
    /// The process it is in.
    pub pid: u32,
    /// Its runtime addresses.
    pub lo: u64,
    /// (End, exclusive.)
    pub hi: u64,
    /// The function, as the profile names it.
    pub function: String,
    /// Its module (the file's path).
    pub module: String,
}

/// Work done on a launched command under the coordinator while perf_event_open samples it:
/// [`crate::record_beside`] launches the command traced (ptrace), samples it as
/// [`crate::record`] does, and hands every event of the tracer but the command's own exit to
/// this.
pub trait Beside {
    /// The tracer's options.
    fn options(&self) -> TraceOptions;

    /// The recording begins: the command released to its exec (`launched`), or a running
    /// process attached, `root` its pid.
    fn begin(&mut self, tracer: &mut Tracer, root: u32, launched: bool);

    /// One event of the tracer, `root` the command's pid: handled, and whatever it stopped
    /// resumed. An error ends the recording (the command is ended, as on Ctrl-C).
    fn event(&mut self, tracer: &mut Tracer, root: u32, ev: TraceEvent) -> Result<(), String>;

    /// Called about every 50 ms with the samples so far (`profile`: symbolized, its metadata
    /// empty; `now_ns` the time since the recording's start), while the command runs.
    fn tick(
        &mut self,
        tracer: &mut Tracer,
        root: u32,
        now_ns: u64,
        profile: &dyn Fn() -> superprof_profile::Profile,
    );

    /// The recording ends (the command has exited, or is about to be let go or ended), the
    /// tracer still attached: the last reading of what was counted. `start_ns`: the
    /// recording's start (CLOCK_MONOTONIC), which sample times count from.
    fn end(&mut self, tracer: &mut Tracer, root: u32, start_ns: u64);

    /// After [`Beside::end`]: code it wrote in the program, named after the function each
    /// piece belongs to (a sample taken inside one is that function's).
    fn code_names(&self) -> Vec<CodeName> {
        Vec::new()
    }
}
