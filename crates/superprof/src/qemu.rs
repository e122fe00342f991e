//! `superprof qemu`: profile a kernel (and the programs it runs) inside QEMU, from outside,
//! through QMP or the gdbstub ([`superprof_qemu`]). Here: the arguments checked and every
//! input read, QEMU launched (launch mode) or connected to, superprof-qemu's sampling loop
//! run, and its profile shown and written like `record`'s.

use std::io::IsTerminal;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{anyhow, bail, Context, Result};
use superprof_qemu::profile::{build_profile, one_stack, truncation_meta, RunInfo};
use superprof_qemu::sampler::{GuestElf, Sampler};
use superprof_qemu::session::{sample_guest, LoopConfig, Sampled};
use superprof_qemu::{Backend, Cancel, Gdb, QemuError, Qmp};

use crate::cli::{QemuArgs, QemuBackendArg};
use crate::sys;

/// QEMU started by superprof (launch mode): ended when dropped.
struct Launched {
    child: Child,
    dir: PathBuf,
}

impl Drop for Launched {
    fn drop(&mut self) {
        if let Ok(None) = self.child.try_wait() {
            let _ = self.child.kill();
        }
        let _ = self.child.wait();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

impl Launched {
    fn exited(&mut self) -> bool {
        !matches!(self.child.try_wait(), Ok(None))
    }
}

/// Ctrl-C (and the other stop signals) end every wait for QEMU.
fn on_stop_signal() -> Cancel {
    Arc::new(sys::stop_requested)
}

/// Connects to the socket of `--qmp` or `--gdb` (or launch mode's own).
fn connect(backend: QemuBackendArg, addr: &str) -> superprof_qemu::Result<Box<dyn Backend>> {
    Ok(match backend {
        QemuBackendArg::Gdb => Box::new(Gdb::connect_with(addr, on_stop_signal())?),
        QemuBackendArg::Qmp => Box::new(Qmp::connect_with(addr, on_stop_signal())?),
    })
}

/// Starts QEMU with a socket of superprof's own and connects to it.
fn launch(args: &QemuArgs) -> Result<(Launched, Box<dyn Backend>)> {
    let program = args.command[0].to_string_lossy();
    let exe = superprof_trace::resolve_command(&args.command[0])
        .filter(|p| p.exists())
        .ok_or_else(|| anyhow!("cannot run '{program}': command not found (is QEMU installed?)"))?;
    let dir = superprof_profile::output::private_temp_dir("superprof-qemu")?;
    let sock = dir.join(match args.backend {
        QemuBackendArg::Gdb => "gdb.sock",
        QemuBackendArg::Qmp => "qmp.sock",
    });
    let flag = match args.backend {
        QemuBackendArg::Gdb => "-gdb",
        QemuBackendArg::Qmp => "-qmp",
    };
    let mut cmd = Command::new(&exe);
    cmd.args(&args.command[1..])
        .arg(flag)
        .arg(format!("unix:{},server=on,wait=off", sock.display()))
        .stdin(Stdio::null());
    // QEMU ends with superprof, even if superprof is killed.
    sys::die_with_parent(&mut cmd);
    sys::start_clean(&mut cmd);
    let child = cmd
        .spawn()
        .with_context(|| format!("cannot run '{program}'"))?;
    let mut launched = Launched { child, dir };
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        if launched.exited() {
            let status = launched.child.wait()?;
            bail!("QEMU exited at start ({status}): check its command line");
        }
        if sys::stop_requested() {
            bail!("interrupted while waiting for QEMU to start");
        }
        if sock.exists() {
            let addr = sock.to_string_lossy().into_owned();
            match connect(args.backend, &addr) {
                Ok(b) => return Ok((launched, b)),
                // Bound but not listening yet: try again.
                Err(QemuError::Connect { .. }) if Instant::now() < deadline => {}
                Err(e) => return Err(e.into()),
            }
        }
        if Instant::now() > deadline {
            bail!("QEMU did not open its {flag} socket within 20 s");
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// The --user arguments: ELF files, and the ELF files in folders.
fn user_elves(paths: &[PathBuf]) -> Result<Vec<GuestElf>> {
    let mut out = Vec::new();
    for p in paths {
        if p.is_dir() {
            let mut entries: Vec<PathBuf> = std::fs::read_dir(p)
                .with_context(|| format!("cannot read folder '{}'", p.display()))?
                .filter_map(|e| Some(e.ok()?.path()))
                .filter(|p| p.is_file())
                .collect();
            entries.sort();
            out.extend(entries.iter().filter_map(|e| GuestElf::open(e).ok()));
        } else {
            out.push(
                GuestElf::open(p)
                    .map_err(|e| anyhow!("cannot read user program '{}': {e}", p.display()))?,
            );
        }
    }
    Ok(out)
}

/// (One function of 195 lines: the command from start to end, in the order the guest needs:
/// every input read before the debugger stops it, the sampling loop, then QEMU ended and the
/// profile written; `backend`, `launched` and `sampler` live throughout.)
pub fn run(args: &QemuArgs) -> Result<i32> {
    let sources =
        args.qmp.is_some() as u8 + args.gdb.is_some() as u8 + (!args.command.is_empty()) as u8;
    if sources != 1 {
        bail!("give one of --qmp SOCKET, --gdb SOCKET or -- QEMU-COMMAND...");
    }
    if !args.interval.is_finite() || !(0.0..=3_600_000.0).contains(&args.interval) {
        bail!("--interval must be 0 to 3600000 milliseconds");
    }
    let duration = args.duration;
    if duration.is_zero() {
        bail!("--duration must be above 0 seconds");
    }
    let kernel_path = &args.kernel;
    let kernel = GuestElf::open(kernel_path)
        .map_err(|e| anyhow!("cannot read kernel ELF '{}': {e}", kernel_path.display()))?;
    let arch = kernel.arch.ok_or_else(|| {
        anyhow!(
            "'{}' is not an x86_64 or AArch64 ELF file: give the guest kernel's ELF",
            kernel_path.display()
        )
    })?;
    if !kernel.has_symbols && args.kallsyms.is_none() {
        superprof_unwind::say!(
            "superprof: {} has no symbol table: frames are shown as addresses (--kallsyms \
             FILE names them from a System.map or a copy of the guest's /proc/kallsyms)",
            kernel_path.display()
        );
    }
    if !kernel.image.has_unwind_info() && kernel.has_orc {
        superprof_unwind::say!(
            "superprof: {} unwinds with ORC (.orc_unwind), which superprof does not read, and \
             has no .eh_frame: stacks come from frame pointers (a kernel built with \
             CONFIG_UNWINDER_FRAME_POINTER unwinds fully), else the leaf frame only",
            kernel_path.display()
        );
    } else if !kernel.image.has_unwind_info() {
        superprof_unwind::say!(
            "superprof: {} has no .eh_frame or .debug_frame: stacks come from frame pointers, \
             and may be the leaf frame only",
            kernel_path.display()
        );
    }
    let users = user_elves(&args.users)?;
    let outputs = if args.one_shot {
        Vec::new()
    } else {
        superprof_resolve::check_outputs(&args.outputs)?
    };
    // Every input is read before the guest is touched: connecting a debugger stops it, and a
    // FIFO or a slow file must not keep it stopped (they are refused: regular files only).
    let kallsyms = match &args.kallsyms {
        Some(path) => Some((
            path,
            superprof_symbols::Kallsyms::from_file(path)
                .map_err(|e| anyhow!("cannot read kernel symbols '{}': {e}", path.display()))?,
        )),
        None => None,
    };
    sys::install_stop_handler();
    let (mut launched, mut backend): (Option<Launched>, Box<dyn Backend>) =
        if let Some(q) = &args.qmp {
            let mut q = Qmp::connect_with(q, on_stop_signal())?;
            q.word_reads = args.word_reads;
            (None, Box::new(q))
        } else if let Some(g) = &args.gdb {
            (None, connect(QemuBackendArg::Gdb, g)?)
        } else {
            let (l, b) = launch(args)?;
            (Some(l), b)
        };
    let guest = backend.arch()?;
    if guest != arch {
        // Leave the guest running as it was.
        let _ = backend.resume();
        bail!(
            "the kernel ELF is for {} but the guest is {}: give the kernel this QEMU runs",
            arch.name(),
            guest.name()
        );
    }
    let mut sampler = Sampler::new(arch, kernel, users);
    sampler.verbose = args.verbose;
    if let Some((path, syms)) = kallsyms {
        if let Some(slide) = sampler.set_kernel_symbols(syms) {
            superprof_unwind::say!(
                "superprof: the kernel runs {slide:#x} above its link addresses (KASLR), as {} \
                 says",
                path.display()
            );
        }
    }
    // A debugger's connection stops the guest: let it run first.
    backend.resume()?;
    if args.verbose {
        // Printed once sampling starts: a script (or a test) may wait for this line.
        superprof_unwind::say!(
            "superprof: {} guest, {} backend: sampling",
            arch.name(),
            if args.qmp.is_some() || (args.gdb.is_none() && args.backend == QemuBackendArg::Qmp) {
                "QMP"
            } else {
                "gdbstub"
            }
        );
    }
    let loop_config = LoopConfig {
        interval: Duration::from_secs_f64(args.interval / 1000.0),
        duration,
        one_shot: args.one_shot,
        kernel_only: args.kernel_only,
        user_only: args.user_only,
        // A progress line, unless a launched QEMU's console shares the terminal.
        progress: !args.one_shot && (launched.is_none() || !std::io::stdout().is_terminal()),
        stop: sys::stop_requested,
    };
    let Sampled {
        samples,
        rounds,
        elapsed,
        gone,
    } = sample_guest(backend.as_mut(), &mut sampler, &loop_config, || {
        launched.as_mut().is_some_and(Launched::exited)
    })?;
    let mut symbols = superprof_symbols::Symbolizer::default();
    // A launched QEMU's output (its serial console) owns stdout.
    let console = superprof_resolve::Console::of_run(launched.is_some());
    if args.one_shot {
        if samples.is_empty() {
            bail!("no sample could be taken");
        }
        let several = samples.iter().any(|s| s.vcpu > 0);
        let mut text = String::new();
        for s in &samples {
            if several {
                text.push_str(&format!("vcpu{}:\n", s.vcpu));
            }
            text.push_str(&one_stack(&sampler, &mut symbols, s, args.show_addresses));
        }
        console.write_with(|w| w.write_all(text.as_bytes()))?;
    }
    if let Some(mut l) = launched.take() {
        if !gone {
            let _ = backend.quit();
            let deadline = Instant::now() + Duration::from_secs(5);
            while !l.exited() && Instant::now() < deadline {
                std::thread::sleep(Duration::from_millis(20));
            }
        }
        drop(l);
    }
    if gone {
        superprof_unwind::say!(
            "superprof: QEMU ended after {:.2} s; keeping the samples so far",
            elapsed.as_secs_f64()
        );
    }
    if args.one_shot {
        return Ok(0);
    }
    let n = samples.len();
    let complete = samples.iter().filter(|s| s.complete()).count();
    let vcpus = samples.iter().map(|s| s.vcpu + 1).max().unwrap_or(1);
    let reasons = truncation_meta(&samples).truncation_reasons();
    superprof_unwind::say!(
        "superprof: {n} samples in {:.2} s ({:.0} samples/s{}), {:.0} µs per sample, {:.1}% fully unwound{}",
        elapsed.as_secs_f64(),
        n as f64 / elapsed.as_secs_f64().max(1e-9),
        if vcpus > 1 { format!(" over {vcpus} vCPUs") } else { String::new() },
        if rounds == 0 { 0.0 } else { sampler.busy.as_secs_f64() * 1e6 / rounds as f64 },
        if n == 0 { 0.0 } else { 100.0 * complete as f64 / n as f64 },
        if reasons.is_empty() { String::new() } else { format!(" (truncated: {reasons})") },
    );
    if n == 0 {
        bail!("no samples were taken");
    }
    let run = RunInfo {
        command: if args.command.is_empty() {
            vec![format!("qemu {}", args.kernel.display())]
        } else {
            superprof_record::lossy(&args.command)
        },
        interval_ms: args.interval,
        show_addresses: args.show_addresses,
        elapsed,
    };
    let profile = build_profile(&sampler, &mut symbols, &samples, &run);
    let style = sys::table_style(console, 20, args.verbose);
    console.write_with(|w| superprof_profile::top::write_styled(&profile, &style, w))?;
    for (path, format) in &outputs {
        superprof_resolve::write_output(&profile, path, *format)?;
        superprof_unwind::say!("superprof: wrote {}", path.display());
    }
    Ok(0)
}
