//! `superprof top`: record's sampling, shown live as perf top shows it: every `--delay`, the
//! table of the last `--window` seconds' samples, redrawn on the terminal's alternate screen;
//! `q` or Ctrl-C quits. Not on a terminal, each refresh is printed after the last.

use std::collections::VecDeque;
use std::io::{IsTerminal, Read, Write};

use anyhow::Result;
use superprof_profile::Profile;
use superprof_record::{Live, Target};
use superprof_sample::SamplerConfig;

use crate::cli::TopArgs;
use crate::sys;

/// The terminal's alternate screen, with the cursor hidden, until dropped (as `top` and
/// `perf top` leave the shell's screen as it was).
struct Screen;

impl Screen {
    fn enter() -> Screen {
        Screen::say(b"\x1b[?1049h\x1b[?25l");
        Screen
    }

    /// Control codes to the terminal (never a panic on a closed stdout).
    fn say(codes: &[u8]) {
        let mut out = std::io::stdout().lock();
        let _ = out.write_all(codes).and_then(|()| out.flush());
    }
}

impl Drop for Screen {
    fn drop(&mut self) {
        Screen::say(b"\x1b[?25h\x1b[?1049l");
    }
}

/// Reads keys from the terminal: `q` stops the run.
fn watch_keys() {
    let _ = std::thread::Builder::new().name("keys".into()).spawn(|| {
        let mut key = [0u8; 1];
        while let Ok(1) = std::io::stdin().read(&mut key) {
            if key[0] == b'q' || key[0] == b'Q' {
                sys::request_stop();
                return;
            }
        }
    });
}

fn what(target: &Target) -> String {
    match target {
        Target::Pid(pid) => format!("process {pid}"),
        Target::Thread(tid) => format!("thread {tid}"),
        Target::Command(c) => superprof_record::lossy(c).join(" "),
        Target::System { cpus: None, .. } => "every process".into(),
        Target::System { cpus: Some(c), .. } => format!(
            "every process on CPU {}",
            c.iter()
                .map(|c| c.to_string())
                .collect::<Vec<_>>()
                .join(",")
        ),
    }
}

pub fn run(a: &TopArgs) -> Result<i32> {
    let target = a.target()?;
    let title = what(&target);
    let sampler = SamplerConfig {
        frequency: a.frequency,
        events: crate::record::parse_events(&a.sampled.events)?,
        period: a.sampled.period,
        ..SamplerConfig::default()
    };
    let config = superprof_record::RecordConfig {
        duration: a.duration,
        ..crate::record::record_config(target, sampler, true)
    };
    if a.delay.is_zero() {
        anyhow::bail!("--delay must be more than 0 s");
    }
    let tty = std::io::stdout().is_terminal();
    // A launched command keeps the keyboard (its input, its echo): q is read only when top
    // watches a process, a thread or the machine (Ctrl-C stops it either way).
    let keys = if a.command.is_empty() {
        sys::KeyMode::new()
    } else {
        None
    };
    if keys.is_some() {
        watch_keys();
    }
    let screen = tty.then(Screen::enter);
    let keep = (a.window.as_secs_f64() / a.delay.as_secs_f64())
        .ceil()
        .max(1.0) as usize;
    let mut window: VecDeque<Profile> = VecDeque::new();
    let (delay, verbose) = (a.delay, a.verbose);
    let mut show = |p: Profile| -> bool {
        window.push_back(p);
        while window.len() > keep {
            window.pop_front();
        }
        let mut shown = window[0].clone();
        for p in window.iter().skip(1) {
            shown.merge(p);
        }
        let height = sys::console_height().unwrap_or(40);
        let style = superprof_profile::top::TableStyle {
            rows: height.saturating_sub(5).max(5),
            verbose,
            width: sys::console_width(superprof_resolve::Console::Stdout),
        };
        let mut text = Vec::new();
        let _ = writeln!(
            text,
            "superprof top: {title}; the last {:.0} s, refreshed every {:.1} s{}",
            shown.meta.duration_ns as f64 / 1e9,
            delay.as_secs_f64(),
            if keys.is_some() { "; q quits" } else { "" }
        );
        let _ = superprof_profile::top::write_styled(&shown, &style, &mut text);
        let mut out = std::io::stdout().lock();
        let drawn = if tty {
            out.write_all(b"\x1b[H\x1b[2J")
                .and_then(|()| out.write_all(&text))
        } else {
            out.write_all(&text).and_then(|()| out.write_all(b"\n"))
        };
        drawn.and_then(|()| out.flush()).is_ok() && !sys::stop_requested()
    };
    sys::install_stop_handler();
    superprof_sample::raise_fd_limit();
    let recorded = superprof_record::record_live(
        &config,
        Live {
            every: delay,
            show: &mut show,
        },
    );
    drop(screen);
    drop(keys);
    let recorded = recorded?;
    Ok(recorded.exit.map_or(0, |e| e.shell_code()))
}
