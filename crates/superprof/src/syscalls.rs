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

pub fn run(args: &SyscallsArgs) -> Result<i32> {
    sys::install_stop_handler();
    // The log goes to -o as it comes (not kept in memory): a killed or failing run leaves
    // everything up to its last 50 ms in the file.
    // Stderr (a launched command's output owns stdout), stdout (attached), or the -o file
    // (buffered, flushed every tick).
    let mut sink: Box<dyn Write + Send> = match &args.output {
        Some(out) => Box::new(std::io::BufWriter::new(
            superprof_profile::output::create_log(out)
                .with_context(|| format!("cannot write output '{}'", out.display()))?,
        )),
        None => args.target.console().writer(),
    };
    let opts = TraceOptions {
        follow_forks: args.follow_forks,
        syscalls: true,
        ..TraceOptions::default()
    };
    let (mut tracer, launched) = match args.target.pid {
        Some(pid) => (Tracer::attach(pid, opts)?, false),
        None => (Tracer::spawn(&args.target.command, opts)?, true),
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
    let mut progress = crate::progress::Progress::new(args.output.is_some() || args.summary_only);
    let mut seen = 0u64;
    let mut exit = syscalls::trace(&mut tracer, launched, |ev| {
        let Some(ev) = ev else {
            progress.update(|| format!("{seen} syscalls"));
            if let Err(e) = sink.flush() {
                write_error.get_or_insert(e);
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
    if let Some(e) = write_error {
        return Err(e).context("cannot write the syscall log");
    }
    let mut rows: Vec<(String, Totals)> = totals.into_iter().collect();
    rows.sort_by(|a, b| b.1.total_ns.cmp(&a.1.total_ns).then(a.0.cmp(&b.0)));
    if table {
        if let Some(status @ superprof_trace::ExitStatus::Signal(_)) = exit {
            writeln!(sink, "+++ {status} +++")?;
        }
        if !args.summary_only {
            writeln!(sink)?;
        }
        write_summary(&mut sink, &rows)?;
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
        serde_json::to_writer(&mut sink, &summary)?;
        writeln!(sink, "}}")?;
    }
    sink.flush().context("cannot write the syscall log")?;
    Ok(exit.map_or(0, |e| e.shell_code()))
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
