//! superprof: a sampling profiler for Linux. This file maps arguments to the library crates and
//! errors to one line and an exit code; the work happens in `record` and the crates.

mod agent;
mod blocks;
mod cli;
mod demo;
mod preload;
mod qemu;
mod record;
mod report;
mod shell;
mod stat;
mod sys;
mod syscalls;
mod top;

use std::process::ExitCode;

use clap::Parser;

fn main() -> ExitCode {
    // What a launched command inherits from superprof: first, before anything changes it.
    superprof_trace::note_inherited_signals();
    // The ptrace engine waits for SIGCHLD; it must be blocked before any thread starts.
    superprof_trace::block_sigchld();
    // A mapped file cut by someone else reads as zeros, not a SIGBUS (issue 31).
    sys::guard_mapped_reads();
    let cli = match cli::Cli::try_parse() {
        Ok(cli) => cli,
        Err(e) => {
            use clap::error::ErrorKind;
            if matches!(e.kind(), ErrorKind::DisplayHelp | ErrorKind::DisplayVersion) {
                let _ = e.print();
                return ExitCode::SUCCESS;
            }
            if e.kind() == ErrorKind::DisplayHelpOnMissingArgumentOrSubcommand {
                let _ = e.print();
                return ExitCode::from(2);
            }
            // clap's errors span several lines; keep the first, which says what is wrong.
            let text = e.render().to_string();
            let mut lines = text.lines();
            let first = lines.next().unwrap_or("invalid arguments");
            let mut message = first.strip_prefix("error: ").unwrap_or(first).to_owned();
            // "...were not provided:" is followed by the missing arguments, indented.
            if message.ends_with(':') {
                let items: Vec<&str> = lines
                    .take_while(|l| l.starts_with("  "))
                    .map(str::trim)
                    .collect();
                message = format!("{} {}", message, items.join(", "));
            }
            superprof_unwind::say!("superprof: {} (see superprof --help)", message.trim_end());
            return ExitCode::from(2);
        }
    };
    // A panic unwinds through the tracers, which let every process go on (see
    // `superprof_trace::Tracer`'s Drop); the command is then waited for, as after an error.
    let result = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| run(cli.command)));
    if sys::zeroed_pages() > 0 {
        superprof_unwind::say!(
            "superprof: {} pages of files that another process cut while superprof had them \
             mapped were read as zeros: names and unwinding there may be wrong",
            sys::zeroed_pages()
        );
    }
    let result = match result {
        Ok(result) => result,
        Err(_) => {
            let _ = after_failure();
            return ExitCode::from(101);
        }
    };
    match result {
        Ok(code) => ExitCode::from(code.clamp(0, 255) as u8),
        Err(e) if e.downcast_ref::<NothingToShow>().is_some() => {
            let n = e.downcast_ref::<NothingToShow>().expect("checked");
            superprof_unwind::say!("superprof: {}", n.why);
            ExitCode::from(n.status.shell_code().clamp(0, 255) as u8)
        }
        Err(e) if e.downcast_ref::<FailedAfter>().is_some() => {
            let f = e.downcast_ref::<FailedAfter>().expect("checked");
            superprof_unwind::say!("superprof: {}", one_line(&f.error));
            ExitCode::from(f.code())
        }
        // A command that could not be run: the status a shell gives (127 not found, 126 not
        // executable).
        Err(e) if cannot_run(&e).is_some() => {
            let status = cannot_run(&e).map_or(1, |c| c.status);
            superprof_unwind::say!("superprof: {}", one_line(&e));
            let _ = after_failure();
            ExitCode::from(status)
        }
        // A closed pipe (`superprof report ... | head`) is not an error worth a message.
        Err(e) if is_broken_pipe(&e) => {
            let _ = after_failure();
            ExitCode::SUCCESS
        }
        Err(e) => {
            superprof_unwind::say!("superprof: {}", one_line(&e));
            let _ = after_failure();
            ExitCode::from(1)
        }
    }
}

/// After an error or a panic: a launched command that superprof let go runs to its end, with
/// Ctrl-C its own to take (as a shell waits for a command) and SIGTERM or SIGHUP sent to
/// superprof passed on to it, before superprof exits.
fn after_failure() -> Option<superprof_trace::ExitStatus> {
    let _ignore = sys::IgnoreInterrupts::new();
    superprof_trace::wait_launched(sys::pass_stop_signal_on)
}

fn run(command: cli::Command) -> anyhow::Result<i32> {
    match command {
        cli::Command::Record(args) => record::Record::from_args(args).and_then(|r| r.run()),
        cli::Command::Top(args) => top::run(&args),
        cli::Command::Agent(args) => agent::run(&args),
        cli::Command::Syscalls(args) => syscalls::run(&args),
        cli::Command::Stat(args) => stat::run(&args),
        cli::Command::Blocks(args) => blocks::run(&args),
        cli::Command::Qemu(args) => qemu::run(&args),
        cli::Command::Preload(args) => preload::run(&args),
        cli::Command::Report(args) => report::run(&report::ReportConfig::from_args(args)),
        cli::Command::Diff(args) => report::run(&report::ReportConfig::from_diff(args)),
        cli::Command::Demo(args) => demo::run(&args),
        cli::Command::Completions { shell } => shell::completions(shell),
        cli::Command::Man { subcommand } => shell::man(subcommand.as_deref()),
        cli::Command::StatCalibration {
            calls,
            kind,
            gap_us,
        } => Ok(superprof_probe::calibration_workload(calls, &kind, gap_us)),
        cli::Command::DemoWorkload { seconds } => {
            demo::workload(seconds);
            Ok(0)
        }
    }
}

/// A probe engine's error, with the command's status kept where there was nothing to show.
fn probe_error(e: superprof_probe::Error) -> anyhow::Error {
    match e {
        superprof_probe::Error::NothingToShow { why, status } => {
            NothingToShow { why, status }.into()
        }
        e => e.into(),
    }
}

/// superprof had nothing to show (no samples, a region never found) for a command that ran to
/// its end: it says why on stderr and exits with the command's status, as it would have
/// with a profile.
#[derive(Debug)]
pub struct NothingToShow {
    pub why: String,
    pub status: superprof_trace::ExitStatus,
}

impl std::fmt::Display for NothingToShow {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.why)
    }
}

impl std::error::Error for NothingToShow {}

/// superprof failed after a launched command ran to its end (an output not written, a push
/// refused): it says why in one line and exits with the command's status where the command
/// failed (its status is never replaced), else 1, so that a script still sees the failure.
#[derive(Debug)]
pub struct FailedAfter {
    pub error: anyhow::Error,
    pub status: superprof_trace::ExitStatus,
}

impl FailedAfter {
    /// `result`, with an error turned into a [`FailedAfter`] where a command ran to `exit`.
    pub fn wrap<T>(
        result: anyhow::Result<T>,
        exit: Option<superprof_trace::ExitStatus>,
    ) -> anyhow::Result<T> {
        match (result, exit) {
            (Err(error), Some(status)) if !is_broken_pipe(&error) => {
                Err(FailedAfter { error, status }.into())
            }
            (r, _) => r,
        }
    }

    fn code(&self) -> u8 {
        match self.status.shell_code().clamp(0, 255) as u8 {
            0 => 1,
            code => code,
        }
    }
}

impl std::fmt::Display for FailedAfter {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&one_line(&self.error))
    }
}

impl std::error::Error for FailedAfter {}

/// The error and its causes on one line.
fn one_line(e: &anyhow::Error) -> String {
    superprof_unwind::one_line(e.as_ref())
}

/// The command superprof was to run and could not, if that is the error.
fn cannot_run(e: &anyhow::Error) -> Option<&superprof_trace::CannotRun> {
    e.chain().find_map(|c| {
        c.downcast_ref::<superprof_trace::CannotRun>()
            .or_else(|| match c.downcast_ref::<superprof_trace::TraceError>() {
                Some(superprof_trace::TraceError::CannotRun(r)) => Some(r),
                _ => None,
            })
    })
}

fn is_broken_pipe(e: &anyhow::Error) -> bool {
    e.chain().any(|c| {
        c.downcast_ref::<std::io::Error>()
            .is_some_and(|io| io.kind() == std::io::ErrorKind::BrokenPipe)
    })
}
