//! `superprof preload`: runs a program with libsuperprof preloaded (LD_PRELOAD). The library's
//! constructor starts sampling in every process that loads it (the command, the programs it
//! runs, its fork children), and each writes its profile into a folder at exit; superprof
//! merges them into one profile when the command ends.

use std::path::PathBuf;
use std::process::Command;

use anyhow::{anyhow, bail, Context, Result};
use superprof_profile::Profile;

use crate::cli::PreloadArgs;

/// libsuperprof.so: $SUPERPROF_LIB, else next to the superprof binary.
fn library() -> Result<PathBuf> {
    if let Some(p) = std::env::var_os("SUPERPROF_LIB") {
        let p = PathBuf::from(p);
        if !p.is_file() {
            bail!("SUPERPROF_LIB names {}, which is not a file", p.display());
        }
        return Ok(p);
    }
    let exe = std::env::current_exe().context("cannot find the superprof binary")?;
    let lib = exe
        .parent()
        .map(|d| d.join("libsuperprof.so"))
        .filter(|p| p.is_file())
        .ok_or_else(|| {
            anyhow!(
                "libsuperprof.so is not next to {} and SUPERPROF_LIB is not set: build it with \
                 `cargo build --release -p libsuperprof` and put target/release/libsuperprof.so \
                 there, or name it in SUPERPROF_LIB",
                exe.display()
            )
        })?;
    Ok(lib)
}

/// (One function of 105 lines: the command's steps in order: the program run with the library
/// preloaded, its processes' profiles merged from the private folder, then said and written; the
/// folder is removed on each way out of the first two.)
pub fn run(args: &PreloadArgs) -> Result<i32> {
    if args.frequency == 0 {
        bail!("frequency must be at least 1 Hz");
    }
    let outputs = superprof_resolve::check_outputs(&args.outputs)?;
    let lib = library()?;
    let program = args.command[0].to_string_lossy();
    let exe = superprof_trace::resolve_command(&args.command[0])
        .filter(|p| p.exists())
        .ok_or_else(|| superprof_trace::CannotRun::not_found(&args.command[0]))?;
    let dir = superprof_profile::output::private_temp_dir("superprof-preload")?;
    let preload = match std::env::var("LD_PRELOAD") {
        Ok(old) if !old.is_empty() => format!("{} {old}", lib.display()),
        _ => lib.display().to_string(),
    };
    let started = std::time::Instant::now();
    let mut command = Command::new(&exe);
    crate::sys::start_clean(&mut command);
    let status = command
        .args(&args.command[1..])
        .env("LD_PRELOAD", preload)
        .env("SUPERPROF_PRELOAD_DIR", &dir)
        .env("SUPERPROF_HZ", args.frequency.to_string())
        .spawn()
        .map_err(|e| {
            anyhow::Error::from(superprof_trace::CannotRun::exec(&args.command[0], &exe, &e))
        })
        .and_then(|child| {
            // Ctrl-C is the command's to take; superprof merges what it left. SIGTERM and
            // SIGHUP sent to superprof are passed on to the command, which ends as it would
            // have alone; superprof still merges.
            crate::sys::install_stop_handler();
            let _ignore = crate::sys::IgnoreInterrupts::new();
            superprof_trace::wait_child(child.id(), crate::sys::pass_stop_signal_on)
                .ok_or_else(|| anyhow!("cannot run '{program}': the command was reaped elsewhere"))
        });
    let status = match status {
        Ok(s) => s,
        Err(e) => {
            let _ = std::fs::remove_dir_all(&dir);
            return Err(e);
        }
    };
    // Every process's profile, merged in the order they started.
    let parts: Vec<PathBuf> = std::fs::read_dir(&dir)
        .map(|d| d.filter_map(|e| Some(e.ok()?.path())).collect())
        .unwrap_or_default();
    let mut read: Vec<Profile> = parts
        .iter()
        .filter(|p| p.extension().is_some_and(|x| x == "parquet"))
        .filter_map(|part| match superprof_profile::parquet::read(part) {
            Ok(p) => Some(p),
            Err(e) => {
                superprof_unwind::say!("superprof: skipping {}: {e}", part.display());
                None
            }
        })
        .collect();
    read.sort_by_key(|p| p.meta.start_time_unix_ns);
    let mut profile: Option<Profile> = None;
    for p in read {
        match &mut profile {
            Some(all) => all.merge(&p),
            None => profile = Some(p),
        }
    }
    let _ = std::fs::remove_dir_all(&dir);
    let code = status.shell_code();
    let Some(mut profile) = profile.filter(|p| !p.samples.is_empty()) else {
        superprof_unwind::say!(
            "superprof: no samples were taken: the program ran too briefly, was killed before \
             it could write its profile, or is statically linked (LD_PRELOAD needs the dynamic \
             loader)"
        );
        return Ok(if code == 0 { 1 } else { code });
    };
    profile.meta.command = superprof_record::lossy(&args.command);
    profile.meta.duration_ns = started.elapsed().as_nanos() as u64;
    let processes: std::collections::BTreeSet<u32> =
        profile.threads.iter().map(|t| t.pid).collect();
    superprof_unwind::say!(
        "superprof: {} samples from {} process{} ({} thread{}) in {:.2} s; {} dropped",
        profile.samples.len(),
        processes.len(),
        if processes.len() == 1 { "" } else { "es" },
        profile.threads.len(),
        if profile.threads.len() == 1 { "" } else { "s" },
        started.elapsed().as_secs_f64(),
        profile.meta.lost_samples
    );
    if !args.quiet {
        // The program's output owns stdout.
        let console = superprof_resolve::Console::Stderr;
        let style = crate::sys::table_style(console, 30, args.verbose);
        console.write_with(|w| superprof_profile::top::write_styled(&profile, &style, w))?;
    }
    for (path, format) in &outputs {
        if let Err(e) = superprof_resolve::write_output(&profile, path, *format) {
            // The command's status survives an output that failed (see FailedAfter).
            superprof_unwind::say!("superprof: {e}");
            return Ok(if code == 0 { 1 } else { code });
        }
        superprof_unwind::say!("superprof: wrote {}", path.display());
    }
    Ok(code)
}
