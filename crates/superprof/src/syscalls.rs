//! `superprof syscalls`: the strace-like log and summary, on the coordinator.

use std::collections::HashMap;
use std::io::Write;
use std::time::{Duration, Instant};

use anyhow::{Context, Result};
use serde_json::json;
use superprof_trace::sampler::Control;
use superprof_trace::syscalls::{self, SyscallEvent};
use superprof_trace::{TraceOptions, Tracer};

use crate::cli::{SyscallFormat, SyscallsArgs};
use crate::sys;

#[derive(Default, Clone)]
struct Totals {
    calls: u64,
    errors: u64,
    total_ns: u64,
}

/// (One function of 126 lines: one closure over the trace's events changes `sink`, `totals`,
/// `write_error`, `seen` and `stopped`, which the ending then reads; split, they would travel
/// between the pieces in a struct.)
pub fn run(args: &SyscallsArgs) -> Result<i32> {
    sys::install_stop_handler();
    // The log goes to -o as it comes (not kept in memory): a killed or failing run leaves
    // everything up to its last 50 ms in the file.
    // Stderr (a launched command's output owns stdout), stdout (attached), or the -o file
    // (buffered, flushed every tick).
    let mut sink = match &args.output {
        Some(out) => Sink::File(
            superprof_profile::output::create_log(out)
                .with_context(|| format!("cannot write output '{}'", out.display()))?,
        ),
        None => Sink::Console(args.target.console().writer()),
    };
    let opts = TraceOptions {
        follow_forks: args.follow_forks,
        syscalls: true,
        ..TraceOptions::default()
    };
    let traced = match args.target.pid {
        Some(pid) => Tracer::attach(pid, opts).map(|t| (t, false)),
        None => Tracer::spawn(&args.target.command, opts).map(|t| (t, true)),
    };
    let (mut tracer, launched) = match traced {
        Ok(t) => t,
        Err(e) => {
            // Nothing was traced: no empty log is left behind.
            sink.discard();
            return Err(e.into());
        }
    };
    let start = Instant::now();
    let start_ns = superprof_sample::monotonic_ns();
    let start_unix = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos() as u64);
    let duration = args.duration;
    let table = args.format == SyscallFormat::Table;
    // JSON is one document, `{"events":[...],"syscalls":[...]}` (serde_json's key order),
    // written as it goes like the table: the events first, the totals at the end.
    let json = args.format == SyscallFormat::Json;
    let mut write_error = None;
    if json {
        if let Err(e) = write!(sink, "{{\"events\":[") {
            write_error.get_or_insert(e);
        }
    }
    let mut totals: HashMap<String, Totals> = HashMap::new();
    let mut events = 0u64;
    let mut stopped = false;
    // A progress line where the log does not go to the terminal itself.
    let mut progress =
        superprof_resolve::progress::Progress::new(args.output.is_some() || args.summary_only);
    let mut seen = 0u64;
    let mut exit = syscalls::trace(&mut tracer, launched, |ev| {
        let Some(ev) = ev else {
            progress.update(|| format!("{seen} syscalls"));
            if let Err(e) = sink.flush() {
                write_error.get_or_insert(e);
            }
            if console_gone(&write_error) {
                if !launched {
                    // Attached, logging to stdout: the reader is gone (`| head`), as strace
                    // ends there, the process is let go.
                    stopped = true;
                    return Control::Stop;
                }
                // A launched command's log on a closed stderr: the command runs on unharmed,
                // its status is superprof's; the log is lost, nothing more is written.
                sink = Sink::Console(Box::new(std::io::sink()));
            }
            if sys::stop_requested() || duration.is_some_and(|d| start.elapsed() >= d) {
                stopped = true;
                return Control::Stop;
            }
            return Control::Continue;
        };
        seen += 1;
        let t = totals.entry(ev.name.clone()).or_default();
        t.calls += 1;
        t.errors += ev.errno.is_some() as u64;
        t.total_ns += ev.duration_ns;
        if !args.summary_only {
            let written = if table {
                writeln!(sink, "{}", table_line(&ev, start_ns, start_unix))
            } else {
                let sep = if events == 0 { "" } else { "," };
                write!(sink, "{sep}").and_then(|()| {
                    serde_json::to_writer(&mut sink, &event_json(&ev, start_ns))
                        .map_err(std::io::Error::from)
                })
            };
            events += 1;
            if let Err(e) = written {
                write_error.get_or_insert(e);
            }
        }
        Control::Continue
    })?;
    progress.clear();
    if launched && exit.is_none() && stopped {
        // Ctrl-C or --duration: end the command as strace's -p detach would not; we started it.
        exit = tracer.terminate(Duration::from_secs(5), |_| {})?;
    }
    let killed = tracer.finish();
    let exit = exit.or(killed);
    let code = exit.map_or(0, |e| e.shell_code());
    if console_gone(&write_error) {
        return Ok(code);
    }
    let finished = match write_error {
        Some(e) => Err(e),
        None => finish(&mut sink, args, table, totals, exit),
    };
    match finished {
        Ok(()) => Ok(code),
        Err(e) if e.kind() == std::io::ErrorKind::BrokenPipe && args.output.is_none() => Ok(code),
        Err(e) => {
            // A table log keeps its whole lines (cut back at the failed write); a JSON
            // document cut short is no document, and goes.
            if !table {
                sink.discard();
            }
            let e = anyhow::Error::from(e).context("cannot write the syscall log");
            crate::FailedAfter::wrap(Err(e), exit)
        }
    }
}

/// Where the log goes: the console, or the `-o` file.
enum Sink {
    Console(Box<dyn Write + Send>),
    File(superprof_profile::output::LogFile),
}

impl Sink {
    /// Removes an `-o` log that is not whole (one this run created).
    fn discard(self) {
        if let Sink::File(f) = self {
            let _ = f.discard();
        }
    }
}

impl Write for Sink {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        match self {
            Sink::Console(w) => w.write(buf),
            Sink::File(f) => f.write(buf),
        }
    }

    fn flush(&mut self) -> std::io::Result<()> {
        match self {
            Sink::Console(w) => w.flush(),
            Sink::File(f) => f.flush(),
        }
    }
}

/// The end of the log: the command's fate and the summary.
fn finish(
    sink: &mut Sink,
    args: &SyscallsArgs,
    table: bool,
    totals: HashMap<String, Totals>,
    exit: Option<superprof_trace::ExitStatus>,
) -> std::io::Result<()> {
    let mut rows: Vec<(String, Totals)> = totals.into_iter().collect();
    rows.sort_by(|a, b| b.1.total_ns.cmp(&a.1.total_ns).then(a.0.cmp(&b.0)));
    if table {
        if let Some(status @ superprof_trace::ExitStatus::Signal(_)) = exit {
            writeln!(sink, "+++ {status} +++")?;
        }
        if !args.summary_only {
            writeln!(sink)?;
        }
        write_summary(sink, &rows)?;
    } else {
        let summary: Vec<_> = rows
            .iter()
            .map(|(name, t)| {
                json!({
                    "name": name, "calls": t.calls, "errors": t.errors, "total_ns": t.total_ns,
                })
            })
            .collect();
        write!(sink, "],\"syscalls\":")?;
        serde_json::to_writer(&mut *sink, &summary)?;
        writeln!(sink, "}}")?;
    }
    sink.flush()
}

/// The console's reader is gone (a broken pipe, which `-o FILE` never gives).
fn console_gone(write_error: &Option<std::io::Error>) -> bool {
    write_error
        .as_ref()
        .is_some_and(|e| e.kind() == std::io::ErrorKind::BrokenPipe)
}

fn event_json(e: &SyscallEvent, start_ns: u64) -> serde_json::Value {
    json!({
        "time_ns": e.time_ns.saturating_sub(start_ns),
        "pid": e.pid,
        "tid": e.tid,
        "name": e.name,
        "args": e.args,
        "ret": e.ret,
        "errno": e.errno,
        "duration_ns": e.duration_ns,
    })
}

fn table_line(ev: &SyscallEvent, start_ns: u64, start_unix: u64) -> String {
    let unix = start_unix + ev.time_ns.saturating_sub(start_ns);
    let secs = unix / 1_000_000_000;
    let (h, m, s) = ((secs / 3600) % 24, (secs / 60) % 60, secs % 60);
    let us = (unix % 1_000_000_000) / 1000;
    let ret = match (ev.ret, &ev.errno) {
        (None, _) => "?".to_owned(),
        (Some(_), Some(errno)) => format!("-1 {errno}"),
        (Some(r), None) if ev.returns_address => format!("{r:#x}"),
        (Some(r), None) => r.to_string(),
    };
    format!(
        "{h:02}:{m:02}:{s:02}.{us:06} [{} {}] {}({}) = {ret} <{:.6}>",
        ev.pid,
        ev.tid,
        superprof_profile::escape(&ev.name),
        ev.args.join(", "),
        ev.duration_ns as f64 / 1e9
    )
}

fn write_summary(w: &mut dyn Write, rows: &[(String, Totals)]) -> std::io::Result<()> {
    let total_ns: u64 = rows.iter().map(|r| r.1.total_ns).sum();
    let line = "------ ----------- ----------- --------- --------- ----------------";
    writeln!(
        w,
        "% time     seconds  usecs/call     calls    errors syscall"
    )?;
    writeln!(w, "{line}")?;
    for (name, t) in rows {
        let pct = if total_ns > 0 {
            100.0 * t.total_ns as f64 / total_ns as f64
        } else {
            0.0
        };
        let errors = if t.errors > 0 {
            t.errors.to_string()
        } else {
            String::new()
        };
        writeln!(
            w,
            "{pct:6.2} {:11.6} {:11} {:9} {errors:>9} {}",
            t.total_ns as f64 / 1e9,
            t.total_ns / 1000 / t.calls.max(1),
            t.calls,
            superprof_profile::escape(name)
        )?;
    }
    writeln!(w, "{line}")?;
    let calls: u64 = rows.iter().map(|r| r.1.calls).sum();
    let errors: u64 = rows.iter().map(|r| r.1.errors).sum();
    let errors = if errors > 0 {
        errors.to_string()
    } else {
        String::new()
    };
    writeln!(
        w,
        "100.00 {:11.6} {:11} {calls:9} {errors:>9} total",
        total_ns as f64 / 1e9,
        total_ns / 1000 / calls.max(1)
    )
}
