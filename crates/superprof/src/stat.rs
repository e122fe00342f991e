//! `superprof stat`: the arguments made a [`superprof_probe::stat::StatConfig`]; the figures
//! written as a table, CSV or JSON.

use std::io::Write;

use anyhow::Result;
use superprof_probe::stat::{self, StatConfig};
use superprof_record::Target;
use superprof_trace::ExitStatus;

use crate::cli::StatArgs;
use crate::sys;

pub fn run(args: &StatArgs) -> Result<i32> {
    if let Some(kind) = &args.list {
        // Written with `?`: a closed stdout (`--list | head`) is a broken pipe, not a panic.
        std::io::stdout().write_all(stat::list_events(kind)?.as_bytes())?;
        return Ok(0);
    }
    sys::install_stop_handler();
    if let Some(out) = &args.output {
        superprof_resolve::check_text_output(out)?;
    }
    let measured = stat::measure(&StatConfig {
        regions: args.regions.clone(),
        events: args.events.clone(),
        groups: args.groups.clone(),
        engine: args.engine.map(Into::into),
        target: match args.pid {
            Some(pid) => Target::Pid(pid),
            None => Target::Command(args.command.clone()),
        },
        duration: args.duration,
        stop: sys::stop_requested,
    })
    .map_err(crate::probe_error)?;
    let exit = measured.exit;
    let text = stat::render(&measured.results, args.format.into(), args.per_call)?;
    let written = superprof_resolve::write_text(
        args.output.as_deref(),
        superprof_resolve::Console::of_run(args.pid.is_none()),
        &text,
    );
    crate::FailedAfter::wrap(written.map_err(anyhow::Error::from), exit)?;
    if let Some(status @ ExitStatus::Signal(_)) = exit {
        superprof_unwind::say!(
            "superprof: the command {status}{}",
            if measured.signal_in_region {
                " inside a region; the counts above are those of the calls that returned"
            } else {
                ""
            }
        );
    }
    Ok(exit.map_or(0, |e| e.shell_code()))
}
