//! superprof: a sampling profiler for Linux. This file maps arguments to the library crates and
//! errors to one line and an exit code; the work happens in `record` and the crates.

mod blocks;
mod cli;
mod collect;
mod demo;
mod preload;
mod qemu;
mod record;
mod region;
mod report;
mod stat;
mod sys;
mod syscalls;

use std::process::ExitCode;

use clap::Parser;

fn main() -> ExitCode {
    // The ptrace engine waits for SIGCHLD; it must be blocked before any thread starts.
    superprof_trace::block_sigchld();
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
            eprintln!("superprof: {} (see superprof --help)", message.trim_end());
            return ExitCode::from(2);
        }
    };
    let result = match cli.command {
        cli::Command::Record(args) => record::run(&record::RecordConfig::from_args(args)),
        cli::Command::Syscalls(args) => syscalls::run(&args),
        cli::Command::Stat(args) => stat::run(&args),
        cli::Command::Blocks(args) => blocks::run(&args),
        cli::Command::Qemu(args) => qemu::run(&args),
        cli::Command::Preload(args) => preload::run(&args),
        cli::Command::Report(args) => report::run(&report::ReportConfig::from_args(args)),
        cli::Command::Demo(args) => demo::run(&args),
        cli::Command::DemoWorkload { seconds } => {
            demo::workload(seconds);
            Ok(0)
        }
    };
    match result {
        Ok(code) => ExitCode::from(code.clamp(0, 255) as u8),
        // A closed pipe (`superprof report ... | head`) is not an error worth a message.
        Err(e) if is_broken_pipe(&e) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("superprof: {}", one_line(&e));
            ExitCode::from(1)
        }
    }
}

/// The error and its causes on one line.
fn one_line(e: &anyhow::Error) -> String {
    let mut parts: Vec<String> = Vec::new();
    for cause in e.chain() {
        let s = cause.to_string();
        if !parts.iter().any(|p| p.contains(&s)) {
            parts.push(s);
        }
    }
    parts.join(": ").replace('\n', " ")
}

fn is_broken_pipe(e: &anyhow::Error) -> bool {
    e.chain().any(|c| {
        c.downcast_ref::<std::io::Error>()
            .is_some_and(|io| io.kind() == std::io::ErrorKind::BrokenPipe)
    })
}
