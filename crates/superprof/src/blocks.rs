//! `superprof blocks`: the arguments made a [`superprof_probe::blocks::BlocksConfig`]; the
//! blocks written as a table, CSV, JSON or an annotated listing.

use anyhow::Result;
use superprof_probe::blocks::{self, BlocksConfig};
use superprof_trace::ExitStatus;

use crate::cli::BlocksArgs;
use crate::sys;

pub fn run(args: &BlocksArgs) -> Result<i32> {
    sys::install_stop_handler();
    if let Some(out) = &args.output {
        superprof_resolve::check_text_output(out)?;
    }
    let (report, exit) = blocks::measure(&BlocksConfig {
        regions: args.regions.clone(),
        mode: args.mode.into(),
        analyzer: args.analyzer.into(),
        step_branches: args.step_branches,
        engine: args.engine.map(Into::into),
        frequency: args.frequency,
        duration: args.duration,
        target: args.target.target(),
        stop: sys::stop_requested,
    })
    .map_err(crate::probe_error)?;
    let text = blocks::render(&report, args.format.into(), args.annotate)?;
    let written =
        superprof_resolve::write_text(args.output.as_deref(), args.target.console(), &text);
    crate::FailedAfter::wrap(written.map_err(anyhow::Error::from), exit)?;
    if let Some(status @ ExitStatus::Signal(_)) = exit {
        superprof_unwind::say!("superprof: the command {status}");
    }
    Ok(exit.map_or(0, |e| e.shell_code()))
}
