//! The probe engine a run of `stat` uses, chosen per run (`--engine`) and named in its output:
//!
//! - `uprobe`: kernel uprobes through `perf_event_open`, each hit writing the counters of its
//!   group into a ring buffer (`superprof_sample::ProbeGroup`); the program is never stopped
//!   for a probe. Needs CAP_SYS_ADMIN. The kernel removes the probes when superprof's
//!   descriptors close, whatever ends superprof.
//! - `ptrace`: the coordinator's breakpoints; the program stops at each. Works for any user
//!   who may trace the program: the fallback.
//! - `in-process`: code mapped into the program ([`crate::inprocess`]): counting trampolines
//!   (`blocks`), recording ones (`stat`, for the events it can read with system calls). x86_64.

use std::path::PathBuf;

use crate::{bail, EngineKind, Result};
use superprof_sample::{ProbeDefinitions, ProbeEvent, ProbeSpec, UprobePmu};

#[derive(Debug, Clone, Copy)]
pub enum Engine {
    Uprobe(UprobePmu),
    Ptrace,
    InProcess,
}

impl Engine {
    /// The engine asked for, else the fastest this machine allows (with why the faster ones
    /// cannot run, for a notice).
    /// The kernel engines (the callers decide on in-process first: it bails for it).
    pub fn choose(arg: Option<EngineKind>) -> Result<(Engine, Option<String>)> {
        match arg {
            Some(EngineKind::InProcess) => bail!("the in-process engine cannot run here"),
            Some(EngineKind::Ptrace) => Ok((Engine::Ptrace, None)),
            Some(EngineKind::Uprobe) => match uprobe_usable() {
                Ok(pmu) => Ok((Engine::Uprobe(pmu), None)),
                Err(why) => bail!("the uprobe engine cannot run here: {why}"),
            },
            None => match uprobe_usable() {
                Ok(pmu) => Ok((Engine::Uprobe(pmu), None)),
                Err(why) => Ok((
                    Engine::Ptrace,
                    Some(format!(
                        "superprof: probing with ptrace (the program stops at every probe): the \
                         uprobe engine cannot run here ({why})"
                    )),
                )),
            },
        }
    }

    pub fn name(&self) -> &'static str {
        match self {
            Engine::Uprobe(_) => "uprobe",
            Engine::Ptrace => "ptrace",
            Engine::InProcess => "in-process",
        }
    }
}

/// A function of superprof's own, probed once to learn whether uprobes may be opened.
#[inline(never)]
fn probe_target() -> u64 {
    std::hint::black_box(1)
}

/// The uprobe PMU, if this process may open uprobes (tried on one of its own functions).
fn uprobe_usable() -> Result<UprobePmu, String> {
    let pmu = superprof_sample::uprobe_pmu().map_err(|e| format!("no uprobe PMU: {e}"))?;
    let me = std::process::id();
    let spec = probe_at(me, probe_target as *const () as usize as u64)
        .ok_or_else(|| "cannot find superprof's own code in its maps".to_owned())?;
    // On this thread only (tid 0), closed at once.
    superprof_sample::ProbeGroup::open(0, &[ProbeEvent::Pmu(pmu, spec)], &[], true, 1)
        .map(drop)
        .map_err(|e| match e.error.raw_os_error() {
            Some(libc::EACCES) | Some(libc::EPERM) => {
                "opening a uprobe needs root or CAP_SYS_ADMIN".to_owned()
            }
            _ => format!("cannot open a uprobe: {e}"),
        })?;
    Ok(pmu)
}

/// How the kernel runs the instruction a uprobe replaced: emulated (x86_64: push of a
/// register, nop, jmp, call, jcc), or stepped out of line, which costs one more trap. The
/// uprobe engine's cost per call depends on it, so it is measured on a region of each kind.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum EntryKind {
    /// The kernel emulates the instruction (no single step out of line).
    Emulated,
    /// The kernel single-steps a copy of it out of line.
    Stepped,
}

impl EntryKind {
    /// The kind of the instruction whose first bytes are `code` (x86_64 as the kernel's
    /// arch/x86/kernel/uprobes.c sorts them; on other machines, stepped).
    pub fn of(code: &[u8]) -> EntryKind {
        if !cfg!(target_arch = "x86_64") {
            return EntryKind::Stepped;
        }
        // An operand-size prefix before nop, and REX.B before push (r8-r15).
        let op = match code {
            [0x66, rest @ ..] | [0x41, rest @ ..] => rest,
            rest => rest,
        };
        match op {
            [0x50..=0x57, ..] // push reg
            | [0x90, ..] // nop
            | [0xeb, ..] | [0xe9, ..] | [0xe8, ..] // jmp, call
            | [0x70..=0x7f, ..] // jcc rel8
            | [0x0f, 0x80..=0x8f, ..] => EntryKind::Emulated, // jcc rel32
            _ => EntryKind::Stepped,
        }
    }

    /// The empty function of superprof's own whose first instruction is of this kind.
    pub fn calibration_region(self) -> &'static str {
        match self {
            EntryKind::Emulated => CALIBRATION_REGIONS[1],
            EntryKind::Stepped => CALIBRATION_REGIONS[2],
        }
    }

    /// Its name in the output and in `__stat-calibration`'s arguments.
    pub fn name(self) -> &'static str {
        match self {
            EntryKind::Emulated => "emulated",
            EntryKind::Stepped => "stepped",
        }
    }
}

/// The empty function of superprof's own the in-process engine is calibrated on: a first
/// instruction of 5 bytes (room for a jump) and a `ret` followed by filler.
pub const IN_PROCESS_CALIBRATION: &str = "superprof_calibration_in_process";

/// Every calibration region (superprof's own functions, only ever called).
pub const CALIBRATION_REGIONS: [&str; 3] = [
    IN_PROCESS_CALIBRATION,
    "superprof_calibration_emulated",
    "superprof_calibration_stepped",
];

/// Whether `name` is one of the calibration regions.
pub fn is_calibration_region(name: &str) -> bool {
    CALIBRATION_REGIONS.contains(&name)
}

/// `superprof __stat-calibration N KIND GAP_US`: calls the calibration region of that kind N
/// times, spinning GAP_US microseconds before each call (so that a tracer waiting for the call
/// has gone idle, as it has before most calls of a real region).
pub fn calibration_workload(calls: usize, kind: &str, gap_us: u64) -> i32 {
    let f: extern "C" fn(u64) -> u64 = std::hint::black_box(match kind {
        "emulated" => calibration::superprof_calibration_emulated,
        "in-process" => calibration::superprof_calibration_in_process,
        _ => calibration::superprof_calibration_stepped,
    });
    let gap = std::time::Duration::from_micros(gap_us);
    let mut x = 0;
    for _ in 0..calls {
        let t = std::time::Instant::now();
        while t.elapsed() < gap {
            std::hint::spin_loop();
        }
        x = f(x);
    }
    std::hint::black_box(x);
    0
}

/// The calibration regions, in machine code: what their first instruction is matters.
mod calibration {
    /// Starts with `push`, which the kernel emulates.
    #[cfg(target_arch = "x86_64")]
    // SAFETY: a complete function in the C ABI: saves and restores rbp, returns its argument.
    #[unsafe(naked)]
    #[no_mangle]
    pub extern "C" fn superprof_calibration_emulated(x: u64) -> u64 {
        core::arch::naked_asm!("push rbp", "mov rax, rdi", "pop rbp", "ret")
    }

    /// Starts with a `mov`, which the kernel steps out of line, and has no instruction the
    /// kernel emulates before its `ret` (the uprobe engine would probe that one instead).
    #[cfg(target_arch = "x86_64")]
    // SAFETY: a complete function in the C ABI: returns its argument, touches nothing else.
    #[unsafe(naked)]
    #[no_mangle]
    pub extern "C" fn superprof_calibration_stepped(x: u64) -> u64 {
        core::arch::naked_asm!("mov rax, rdi", "ret")
    }

    /// Starts with a 5-byte no-op (room for the in-process engine's jump); its `ret` is
    /// followed by filler (room for another).
    #[cfg(target_arch = "x86_64")]
    // SAFETY: a complete function in the C ABI: returns its argument, touches nothing else.
    #[unsafe(naked)]
    #[no_mangle]
    pub extern "C" fn superprof_calibration_in_process(x: u64) -> u64 {
        core::arch::naked_asm!(
            "nop dword ptr [rax + rax]",
            "mov rax, rdi",
            "ret",
            "int3",
            "int3",
            "int3",
            "int3"
        )
    }

    #[cfg(not(target_arch = "x86_64"))]
    #[inline(never)]
    #[no_mangle]
    pub extern "C" fn superprof_calibration_in_process(x: u64) -> u64 {
        std::hint::black_box(x)
    }

    #[cfg(not(target_arch = "x86_64"))]
    #[inline(never)]
    #[no_mangle]
    pub extern "C" fn superprof_calibration_emulated(x: u64) -> u64 {
        std::hint::black_box(x)
    }

    #[cfg(not(target_arch = "x86_64"))]
    #[inline(never)]
    #[no_mangle]
    pub extern "C" fn superprof_calibration_stepped(x: u64) -> u64 {
        std::hint::black_box(x)
    }
}

/// The mean of `v` without its highest 0.1% (a call the scheduler preempted measures that, not
/// the engine); 0 when empty. A mean, not a median: what is subtracted from each call must
/// average to what the engine adds, for totals and means to come out right.
///
/// With it, its standard error (the spread of the values kept over the square root of their
/// number): how far the mean may be from the engine's true cost.
pub fn trimmed_mean_and_error(mut v: Vec<f64>) -> (f64, f64) {
    if v.is_empty() {
        return (0.0, 0.0);
    }
    v.sort_by(|a, b| a.total_cmp(b));
    let keep = v.len() - v.len() / 1000;
    let kept = &v[..keep];
    let mean = kept.iter().sum::<f64>() / keep as f64;
    (mean, standard_error(kept.iter().copied()))
}

/// The standard error of the mean of `values`: their sample standard deviation over the square
/// root of their number (0 for fewer than two).
pub fn standard_error(values: impl Iterator<Item = f64> + Clone) -> f64 {
    let n = values.clone().count();
    if n < 2 {
        return 0.0;
    }
    let mean = values.clone().sum::<f64>() / n as f64;
    let var = values.map(|x| (x - mean) * (x - mean)).sum::<f64>() / (n - 1) as f64;
    (var / n as f64).sqrt()
}

/// Where the uprobe engine gets its kernel events: uprobes defined in tracefs where it can be
/// written (every thread's perf event on an address then shares one kernel uprobe, removed
/// once: 41 threads on one region detach in 1.6 s instead of 15 s here), else the uprobe PMU.
/// Dropped after every perf event on its probes is closed.
pub struct Probes {
    pmu: UprobePmu,
    defs: Option<ProbeDefinitions>,
}

impl Probes {
    pub fn new(pmu: UprobePmu) -> Probes {
        Probes {
            pmu,
            defs: ProbeDefinitions::new().ok(),
        }
    }

    /// The kernel event for a probe on `spec`.
    pub fn event(&mut self, spec: &ProbeSpec) -> ProbeEvent {
        if let Some(event) = self.defs.as_mut().and_then(|d| d.define(spec).ok()) {
            return event;
        }
        ProbeEvent::Pmu(self.pmu, spec.clone())
    }
}

/// The probe for the instruction at address `addr` of process `pid`: the mapped file (through
/// /proc/PID/map_files, the very file the process maps, whatever its name or namespace) and
/// the offset in it.
pub fn probe_at(pid: u32, addr: u64) -> Option<ProbeSpec> {
    let maps = superprof_unwind::maps::executable_mappings(pid).ok()?;
    let m = maps.iter().find(|m| m.start <= addr && addr < m.end)?;
    if m.path.to_string_lossy().starts_with('[') {
        return None; // [vdso] and the like: no file
    }
    let offset = addr.checked_sub(m.start)?.checked_add(m.offset)?;
    Some(ProbeSpec {
        path: PathBuf::from(format!("/proc/{pid}/map_files/{:x}-{:x}", m.start, m.end)),
        offset,
    })
}

#[cfg(test)]
mod tests {
    use super::{standard_error, trimmed_mean_and_error, EntryKind};

    fn trimmed_mean(v: Vec<f64>) -> f64 {
        trimmed_mean_and_error(v).0
    }

    #[test]
    fn entry_kinds() {
        if !cfg!(target_arch = "x86_64") {
            return;
        }
        for (code, kind) in [
            (&[0x55u8][..], EntryKind::Emulated),             // push rbp
            (&[0x41, 0x57], EntryKind::Emulated),             // push r15
            (&[0x90], EntryKind::Emulated),                   // nop
            (&[0xe9, 0, 0, 0, 0], EntryKind::Emulated),       // jmp
            (&[0x0f, 0x84, 0, 0, 0, 0], EntryKind::Emulated), // je
            (&[0x48, 0x8d, 0x44, 0x7f, 0x01], EntryKind::Stepped), // lea
            (&[0xf0, 0x48, 0x83, 0x05], EntryKind::Stepped),  // lock add
            (&[0xf3, 0x0f, 0x1e, 0xfa], EntryKind::Stepped),  // endbr64
            (&[], EntryKind::Stepped),
        ] {
            assert_eq!(EntryKind::of(code), kind, "{code:x?}");
        }
    }

    #[test]
    fn trimmed_means() {
        assert_eq!(trimmed_mean(vec![]), 0.0);
        assert_eq!(trimmed_mean(vec![5.0, 1.0, 3.0]), 3.0);
        // The highest 0.1% left out.
        let mut v = vec![2.0; 999];
        v.push(1e9);
        assert_eq!(trimmed_mean(v), 2.0);
        // The error of the mean of the values kept: 1, 3 (and 1e9 left out of 1,000).
        let mut v = vec![1.0; 500];
        v.extend(vec![3.0; 499]);
        v.push(1e9);
        let (mean, error) = trimmed_mean_and_error(v);
        assert!((mean - 1997.0 / 999.0).abs() < 1e-9, "{mean}");
        assert!((error - (1.0f64 / 999.0).sqrt()).abs() < 1e-3, "{error}");
        assert_eq!(standard_error([5.0].into_iter()), 0.0);
        // Sample standard deviation 1 (n - 1 in the divisor), over √4.
        let e = standard_error([1.0, 2.0, 3.0, 2.0].into_iter());
        assert!((e - (2.0f64 / 3.0).sqrt() / 2.0).abs() < 1e-12, "{e}");
    }

    /// superprof's own calibration functions, read alone from its file: each one whole, with
    /// its bytes, its instructions proven, and no other function or branch of the file.
    #[test]
    fn the_calibration_functions_alone() {
        // (Called, so that this test's binary has them.)
        for kind in ["in-process", "emulated", "stepped"] {
            assert_eq!(super::calibration_workload(1, kind, 0), 0);
        }
        let exe = std::fs::read_link("/proc/self/exe").unwrap();
        let names = super::CALIBRATION_REGIONS;
        let only = superprof_analyze::ElfCode::open_only(&exe, &names).unwrap();
        let all = superprof_analyze::ElfCode::open(&exe).unwrap();
        assert_eq!(only.functions.len(), names.len());
        for f in &only.functions {
            assert!(names.contains(&f.name.as_str()), "{}", f.name);
            let whole = all.function_at(f.addr).unwrap();
            assert_eq!((whole.addr, whole.size), (f.addr, f.size));
            assert_eq!(only.bytes(f.addr, f.size), all.bytes(f.addr, f.size));
            only.prove_function(f.addr, f.size, &f.name).unwrap();
            // Only called: no branch anywhere in the file lands inside one.
            assert!(
                all.targets_in(f.addr, f.addr + f.size).is_empty(),
                "{}",
                f.name
            );
            assert!(only.targets_in(f.addr, f.addr + f.size).is_empty());
        }
        // Nothing else: another function's bytes are not there.
        let main = all.functions.iter().find(|f| f.name == "main").unwrap();
        assert!(only.bytes(main.addr, 1).is_none());
    }
}
