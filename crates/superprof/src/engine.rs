//! The probe engine a run of `stat` uses, chosen per run (`--engine`) and named in its output:
//!
//! - `uprobe`: kernel uprobes through `perf_event_open`, each hit writing the counters of its
//!   group into a ring buffer (`superprof_sample::ProbeGroup`); the program is never stopped
//!   for a probe. Needs CAP_SYS_ADMIN. The kernel removes the probes when superprof's
//!   descriptors close, whatever ends superprof.
//! - `ptrace`: the coordinator's breakpoints; the program stops at each. Works for any user
//!   who may trace the program: the fallback.
//! - `in-process`: counting code mapped into the program; not built yet.

use std::path::PathBuf;

use anyhow::{bail, Result};
use superprof_sample::{ProbeSpec, UprobePmu};

use crate::cli::EngineArg;

#[derive(Debug, Clone, Copy)]
pub enum Engine {
    Uprobe(UprobePmu),
    Ptrace,
}

impl Engine {
    /// The engine asked for, else the fastest this machine allows (with why the faster ones
    /// cannot run, for a notice).
    pub fn choose(arg: Option<EngineArg>) -> Result<(Engine, Option<String>)> {
        match arg {
            Some(EngineArg::InProcess) => bail!(
                "the in-process engine is not built yet: use --engine uprobe (root) or --engine ptrace"
            ),
            Some(EngineArg::Ptrace) => Ok((Engine::Ptrace, None)),
            Some(EngineArg::Uprobe) => match uprobe_usable() {
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
    superprof_sample::ProbeGroup::open(pmu, 0, &[spec], &[], true, 1)
        .map(drop)
        .map_err(|e| match e.error.raw_os_error() {
            Some(libc::EACCES) | Some(libc::EPERM) => {
                "opening a uprobe needs root or CAP_SYS_ADMIN".to_owned()
            }
            _ => format!("cannot open a uprobe: {e}"),
        })?;
    Ok(pmu)
}

/// The name of the empty function the engines' own cost is measured on.
pub const CALIBRATION_REGION: &str = "superprof_calibration_region";

/// The empty region whose calls measure a probe engine's own cost (see `stat`).
#[inline(never)]
#[no_mangle]
pub extern "C" fn superprof_calibration_region(x: u64) -> u64 {
    std::hint::black_box(x).wrapping_add(1)
}

/// `superprof __stat-calibration N`: calls the calibration region N times.
pub fn calibration_workload(calls: usize) -> i32 {
    let f: extern "C" fn(u64) -> u64 = std::hint::black_box(superprof_calibration_region);
    let mut x = 0;
    for _ in 0..calls {
        x = f(x);
    }
    std::hint::black_box(x);
    0
}

/// The mean of `v` without its highest 0.1% (a call the scheduler preempted measures that, not
/// the engine); 0 when empty. A mean, not a median: what is subtracted from each call must
/// average to what the engine adds, for totals and means to come out right.
pub fn trimmed_mean(mut v: Vec<f64>) -> f64 {
    if v.is_empty() {
        return 0.0;
    }
    v.sort_by(|a, b| a.total_cmp(b));
    let keep = v.len() - v.len() / 1000;
    v[..keep].iter().sum::<f64>() / keep as f64
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
        ret: false,
    })
}

#[cfg(test)]
mod tests {
    use super::trimmed_mean;

    #[test]
    fn trimmed_means() {
        assert_eq!(trimmed_mean(vec![]), 0.0);
        assert_eq!(trimmed_mean(vec![5.0, 1.0, 3.0]), 3.0);
        // The highest 0.1% left out.
        let mut v = vec![2.0; 999];
        v.push(1e9);
        assert_eq!(trimmed_mean(v), 2.0);
    }
}
