//! `superprof agent --push DEST`: the arguments made a [`superprof_record::agent::AgentConfig`].

use anyhow::Result;
use superprof_push::PushArgs;
use superprof_record::agent::{self, AgentConfig};

use crate::cli::AgentArgs;
use crate::sys;

pub fn run(args: &AgentArgs) -> Result<i32> {
    sys::install_stop_handler();
    superprof_sample::raise_fd_limit();
    agent::run(&AgentConfig {
        push: PushArgs {
            dest: args.push.clone(),
            app: args.app.clone(),
            labels: args.labels.clone(),
            tenant: args.tenant.clone(),
        },
        interval: args.interval,
        frequency: args.frequency,
        pids: args.pids.clone(),
        buffer: args.buffer,
        duration: args.duration,
        stack_size: args.stack_size,
        stop: sys::stop_requested,
    })?;
    Ok(0)
}
