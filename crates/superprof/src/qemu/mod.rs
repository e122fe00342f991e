//! `superprof qemu`: profile a kernel (and the programs it runs) inside QEMU, from outside,
//! through QMP or the gdbstub ([`superprof_qemu`]). Every interval the guest is stopped, its
//! registers and stack read, the stack unwound with framehop from the kernel ELF's unwind
//! tables (or a recognized program's), and the guest let go; at the end the addresses are
//! symbolized from the ELF files (symbols and DWARF) and written like `record`'s profiles.

use std::collections::HashMap;
use std::io::IsTerminal;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{anyhow, bail, Context, Result};
use superprof_profile::escape;
use superprof_profile::Profile;
use superprof_qemu::{Backend, Cancel, Gdb, QemuError, Qmp};

use crate::cli::{QemuArgs, QemuBackendArg};
use crate::sys;
use superprof_qemu::sampler::{self, GuestElf, Owner, RawSample, Sampler};

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

/// (One function of 246 lines: the command from start to end, in the order the guest needs: every
/// input read before the debugger stops it, the sampling loop, then the guest let go; `backend`,
/// `launched`, `sampler`, `samples` and `gone` live throughout.)
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
    let interval = Duration::from_secs_f64(args.interval / 1000.0);
    let start = Instant::now();
    // From now on, the end of --duration ends a wait for QEMU as Ctrl-C does: a peer that
    // trickles or floods cannot hold the run past its end.
    if let Some(end) = start.checked_add(duration).filter(|_| !args.one_shot) {
        backend.set_cancel(Arc::new(move || {
            sys::stop_requested() || Instant::now() >= end
        }));
    }
    let mut samples: Vec<RawSample> = Vec::new();
    let mut rounds = 0u64;
    let mut gone = false;
    let mut next = start;
    let seed = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(1, |d| d.subsec_nanos() as u64);
    let mut jitter = Jitter(seed | 1);
    // A progress line, unless a launched QEMU's console shares the terminal.
    let mut progress = superprof_resolve::progress::Progress::new(
        !args.one_shot && (launched.is_none() || !std::io::stdout().is_terminal()),
    );
    loop {
        progress.update(|| format!("{} samples", samples.len()));
        if sys::stop_requested() || (!args.one_shot && start.elapsed() >= duration) {
            break;
        }
        if launched.as_mut().is_some_and(Launched::exited) {
            gone = true;
            break;
        }
        // Wait in short slices, so that Ctrl-C and the end of --duration are seen at once.
        while Instant::now() < next && !sys::stop_requested() && start.elapsed() < duration {
            std::thread::sleep((next - Instant::now()).min(Duration::from_millis(50)));
        }
        if sys::stop_requested() || (!args.one_shot && start.elapsed() >= duration) {
            break;
        }
        // ±25% of jitter, so that sampling does not lock onto a period of the guest's work.
        next = Instant::now() + interval.mul_f64(0.75 + 0.5 * jitter.next());
        match sampler.sample(backend.as_mut(), start.elapsed()) {
            Ok(taken) => {
                for s in taken {
                    let keep = match s.owner {
                        Owner::Kernel => !args.user_only,
                        Owner::User(_) => !args.kernel_only,
                        Owner::Unknown => !args.kernel_only && !args.user_only,
                    };
                    if keep {
                        samples.push(s);
                    }
                }
                rounds += 1;
            }
            Err(QemuError::Gone) => {
                gone = true;
                break;
            }
            // Ctrl-C or the end of --duration in the middle of a sample: the samples so far
            // are kept.
            Err(QemuError::Cancelled) => break,
            Err(_) if sys::stop_requested() => break,
            Err(e) if !samples.is_empty() => {
                superprof_unwind::say!(
                    "superprof: sampling stopped: {e}; keeping the samples so far"
                );
                break;
            }
            Err(e) => return Err(e.into()),
        }
        if args.one_shot && rounds > 0 {
            break;
        }
    }
    progress.clear();
    let elapsed = start.elapsed();
    // A sample cut short may have left the guest stopped.
    if !gone {
        backend.let_go();
    }
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
    let profile = build_profile(&sampler, &mut symbols, &samples, args, elapsed);
    let style = sys::table_style(console, 20, args.verbose);
    console.write_with(|w| superprof_profile::top::write_styled(&profile, &style, w))?;
    for (path, format) in &outputs {
        superprof_resolve::write_output(&profile, path, *format)?;
        superprof_unwind::say!("superprof: wrote {}", path.display());
    }
    Ok(0)
}

/// A small xorshift generator for the sampling jitter.
struct Jitter(u64);

impl Jitter {
    /// A number in [0, 1).
    fn next(&mut self) -> f64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        (self.0 >> 11) as f64 / (1u64 << 53) as f64
    }
}

/// What is known of one frame's code: in an ELF (the module path frames are named by, the ELF
/// address, the symbolizer's frames, outermost first), a module's function named by a kallsyms
/// file, or nothing.
#[derive(Clone)]
enum Resolved {
    Elf {
        module: String,
        svma: u64,
        found: Vec<superprof_symbols::SymFrame>,
    },
    Module(String),
    Unknown(u64),
}

impl Resolved {
    /// (name, file, line, inlined) of each frame, outermost first, named as the profile names
    /// them (`superprof_resolve`).
    fn names(&self) -> Vec<(String, Option<String>, u32, bool)> {
        match self {
            Resolved::Elf { found, .. } if found.is_empty() => {
                vec![(self.fallback(), None, 0, false)]
            }
            Resolved::Elf { found, .. } => found
                .iter()
                .map(|f| {
                    (
                        f.function.clone().unwrap_or_else(|| self.fallback()),
                        f.file.clone(),
                        f.line.unwrap_or(0),
                        f.inlined,
                    )
                })
                .collect(),
            Resolved::Module(name) => vec![(name.clone(), None, 0, false)],
            Resolved::Unknown(_) => vec![(self.fallback(), None, 0, false)],
        }
    }

    fn fallback(&self) -> String {
        match self {
            Resolved::Elf { module, svma, .. } => superprof_symbols::address_name(module, *svma),
            Resolved::Module(name) => name.clone(),
            Resolved::Unknown(addr) => {
                superprof_symbols::address_name(superprof_resolve::UNKNOWN_MODULE, *addr)
            }
        }
    }

    /// The profile frames, outermost first.
    fn frames(
        &self,
        namer: &mut superprof_resolve::Namer,
        p: &mut Profile,
        addr: u64,
    ) -> Vec<superprof_profile::FrameId> {
        match self {
            Resolved::Elf {
                module,
                svma,
                found,
            } => namer.elf_frames(p, module, *svma, found.clone()),
            Resolved::Module(name) => vec![p.intern_frame_named(
                name,
                superprof_resolve::UNKNOWN_MODULE,
                None,
                0,
                addr,
                false,
            )],
            Resolved::Unknown(addr) => vec![namer.anonymous_frame(p, None, *addr)],
        }
    }
}

fn symbolize(
    sampler: &Sampler,
    symbols: &mut superprof_symbols::Symbolizer,
    cache: &mut HashMap<(u64, bool, Owner, u64), Resolved>,
    (addr, ret, owner, bias): (u64, bool, Owner, u64),
) -> Resolved {
    cache
        .entry((addr, ret, owner, bias))
        .or_insert_with(|| {
            let elf = match owner {
                Owner::Kernel => Some(&sampler.kernel),
                Owner::User(u) => sampler.users.get(u),
                Owner::Unknown => None,
            };
            let Some(elf) = elf else {
                // A module's code, named by a kallsyms file.
                let look = superprof_symbols::lookup_address(addr, ret);
                if let Some((name, Some(module))) = sampler
                    .runtime_symbols
                    .as_ref()
                    .and_then(|k| k.lookup_with_module(look))
                {
                    return Resolved::Module(format!("{name} [{module}]"));
                }
                return Resolved::Unknown(addr);
            };
            let svma = addr.wrapping_sub(bias);
            let look = superprof_symbols::lookup_address(svma, ret);
            let mut found = symbols.symbolize(&elf.path, &elf.path, look);
            if found.is_empty() && owner == Owner::Kernel {
                // A kernel ELF without symbols: a System.map or kallsyms file names it.
                if let Some(name) = sampler.kernel_symbols.as_ref().and_then(|k| k.lookup(look)) {
                    found.push(superprof_symbols::SymFrame {
                        function: Some(name.to_owned()),
                        file: None,
                        line: None,
                        inlined: false,
                    });
                }
            }
            Resolved::Elf {
                module: elf.path.to_string_lossy().into_owned(),
                svma,
                found,
            }
        })
        .clone()
}

/// The name and file of an owner's frames.
fn owner_name(sampler: &Sampler, owner: Owner) -> (String, PathBuf) {
    match owner {
        Owner::Kernel => ("kernel".to_owned(), sampler.kernel.path.clone()),
        Owner::User(u) => (sampler.users[u].name.clone(), sampler.users[u].path.clone()),
        Owner::Unknown => ("[unknown]".to_owned(), PathBuf::from("[unknown]")),
    }
}

/// A sample's root frame: whose code it is in, and for code of the lower half (programs), in
/// which address space: `prog_a [as 0x1d2c000]`, so that two processes, or two instances of
/// one program, are told apart.
fn root_name(sampler: &Sampler, s: &RawSample) -> (String, PathBuf) {
    let (name, path) = owner_name(sampler, s.owner);
    let user_half = s.frames.first().is_some_and(|f| f.0 >> 63 == 0);
    match s.space {
        Some(space) if s.owner != Owner::Kernel && user_half => {
            (format!("{name} [as {space:#x}]"), path)
        }
        _ => (name, path),
    }
}

fn one_stack(
    sampler: &Sampler,
    symbols: &mut superprof_symbols::Symbolizer,
    s: &RawSample,
    addresses: bool,
) -> String {
    let mut cache = HashMap::new();
    let mut out = format!("{}\n", escape(&root_name(sampler, s).0));
    let mut i = 0;
    for &f in &s.frames {
        for (name, file, line, inlined) in symbolize(sampler, symbols, &mut cache, f)
            .names()
            .into_iter()
            .rev()
        {
            let at = if addresses {
                format!("{:#018x} ", f.0)
            } else {
                String::new()
            };
            let loc = match file {
                Some(file) if line > 0 => format!(" ({}:{line})", escape(&file)),
                _ => String::new(),
            };
            let name = escape(&name);
            out.push_str(&format!(
                "  #{i:<2} {at}{name}{loc}{}\n",
                if inlined { " [inlined]" } else { "" }
            ));
            i += 1;
        }
    }
    if let Some(why) = s.truncated {
        out.push_str(&format!(
            "  (the stack could not be unwound further: {})\n",
            why.as_str()
        ));
    }
    out
}

fn build_profile(
    sampler: &Sampler,
    symbols: &mut superprof_symbols::Symbolizer,
    samples: &[RawSample],
    args: &QemuArgs,
    elapsed: Duration,
) -> Profile {
    let mut p = Profile::default();
    p.meta.command = if args.command.is_empty() {
        vec![format!("qemu {}", args.kernel.display())]
    } else {
        superprof_record::lossy(&args.command)
    };
    p.meta.event = "qemu-interval".into();
    p.meta.frequency = if args.interval > 0.0 {
        (1000.0 / args.interval) as u32
    } else {
        0
    };
    p.meta.duration_ns = elapsed.as_nanos() as u64;
    superprof_resolve::stamp(&mut p.meta);
    p.meta.start_time_unix_ns = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos() as u64)
        .saturating_sub(elapsed.as_nanos() as u64);
    let t = truncation_meta(samples);
    p.meta.truncated_stacks = t.truncated_stacks;
    p.meta.truncated_by = t.truncated_by;
    let mut threads: HashMap<usize, u32> = HashMap::new();
    let mut cache = HashMap::new();
    let mut namer = superprof_resolve::Namer::new();
    for s in samples {
        let thread = *threads
            .entry(s.vcpu)
            .or_insert_with(|| p.add_thread(0, s.vcpu as u32 + 1, &format!("vcpu{}", s.vcpu)));
        let (root, root_module) = root_name(sampler, s);
        let root_module = root_module.to_string_lossy().into_owned();
        let rf = p.intern_frame_named(&root, &root_module, None, 0, 0, false);
        let mut stack = Some(p.intern_stack(None, rf));
        for &f in s.frames.iter().rev() {
            let resolved = symbolize(sampler, symbols, &mut cache, f);
            if !args.show_addresses {
                for fr in resolved.frames(&mut namer, &mut p, f.0) {
                    stack = Some(p.intern_stack(stack, fr));
                }
                continue;
            }
            // Each frame's name with its guest address.
            let module = match f.2 {
                Owner::Unknown => superprof_resolve::UNKNOWN_MODULE.to_owned(),
                o => owner_name(sampler, o).1.to_string_lossy().into_owned(),
            };
            for (name, file, line, inlined) in resolved.names() {
                let fr = p.intern_frame_named(
                    &format!("{name} [{:#x}]", f.0),
                    &module,
                    file.as_deref(),
                    line,
                    f.0.wrapping_sub(f.3),
                    inlined,
                );
                stack = Some(p.intern_stack(stack, fr));
            }
        }
        p.add_sample(s.time.as_nanos() as u64, thread, 0, 1, stack);
    }
    p
}

/// Truncated stacks of the samples, in all and by reason (as the profile's metadata has them).
fn truncation_meta(samples: &[sampler::RawSample]) -> superprof_profile::Meta {
    let mut m = superprof_profile::Meta::default();
    for why in samples.iter().filter_map(|s| s.truncated) {
        m.truncated_stacks += 1;
        *m.truncated_by.entry(why.as_str().to_owned()).or_default() += 1;
    }
    m
}
