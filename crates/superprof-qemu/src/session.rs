//! The sampling loop: every vCPU sampled each interval (with ±25% of jitter, so that sampling
//! does not lock onto a period of the guest's work) until the duration passes, the caller
//! says stop, or QEMU ends; then the guest let go.

use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::sampler::{Owner, RawSample, Sampler};
use crate::{Backend, QemuError, Result};

/// How the loop samples.
#[derive(Debug, Clone)]
pub struct LoopConfig {
    /// The mean time between two samples.
    pub interval: Duration,
    /// How long to sample (not a limit with `one_shot`).
    pub duration: Duration,
    /// One round of samples, then stop.
    pub one_shot: bool,
    /// Keep only the samples in the kernel's code, or only those in programs'.
    pub kernel_only: bool,
    /// (See `kernel_only`.)
    pub user_only: bool,
    /// A progress line on stderr.
    pub progress: bool,
    /// Whether the caller was asked to stop (Ctrl-C): checked between samples, and in every
    /// wait for QEMU once the backend's cancel check is this loop's.
    pub stop: fn() -> bool,
}

/// What the loop took.
pub struct Sampled {
    /// The samples kept, in the order taken.
    pub samples: Vec<RawSample>,
    /// Rounds of sampling done (a round samples every vCPU).
    pub rounds: u64,
    /// How long sampling took.
    pub elapsed: Duration,
    /// QEMU ended (or closed the connection) during the run.
    pub gone: bool,
}

/// Samples the guest behind `backend` as `cfg` says; `ended` tells whether a QEMU of the
/// caller's own has exited. An error is returned only where no sample was taken: after one,
/// the samples so far are kept, with a notice.
pub fn sample_guest(
    backend: &mut dyn Backend,
    sampler: &mut Sampler,
    cfg: &LoopConfig,
    mut ended: impl FnMut() -> bool,
) -> Result<Sampled> {
    let (duration, stop) = (cfg.duration, cfg.stop);
    let start = Instant::now();
    // From now on, the end of the duration ends a wait for QEMU as Ctrl-C does: a peer that
    // trickles or floods cannot hold the run past its end.
    if let Some(end) = start.checked_add(duration).filter(|_| !cfg.one_shot) {
        backend.set_cancel(Arc::new(move || stop() || Instant::now() >= end));
    }
    let over = || stop() || (!cfg.one_shot && start.elapsed() >= duration);
    let mut samples: Vec<RawSample> = Vec::new();
    let mut rounds = 0u64;
    let mut gone = false;
    let mut next = start;
    let seed = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(1, |d| d.subsec_nanos() as u64);
    let mut jitter = Jitter(seed | 1);
    let mut progress = superprof_resolve::progress::Progress::new(cfg.progress);
    loop {
        progress.update(|| format!("{} samples", samples.len()));
        if over() {
            break;
        }
        if ended() {
            gone = true;
            break;
        }
        // Wait in short slices, so that Ctrl-C and the end of the duration are seen at once.
        while Instant::now() < next && !stop() && start.elapsed() < duration {
            std::thread::sleep((next - Instant::now()).min(Duration::from_millis(50)));
        }
        if over() {
            break;
        }
        next = Instant::now() + cfg.interval.mul_f64(0.75 + 0.5 * jitter.next());
        match sampler.sample(backend, start.elapsed()) {
            Ok(taken) => {
                for s in taken {
                    let keep = match s.owner {
                        Owner::Kernel => !cfg.user_only,
                        Owner::User(_) => !cfg.kernel_only,
                        Owner::Unknown => !cfg.kernel_only && !cfg.user_only,
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
            // Ctrl-C or the end of the duration in the middle of a sample: the samples so far
            // are kept.
            Err(QemuError::Cancelled) => break,
            Err(_) if stop() => break,
            Err(e) if !samples.is_empty() => {
                superprof_unwind::say!(
                    "superprof: sampling stopped: {e}; keeping the samples so far"
                );
                break;
            }
            Err(e) => return Err(e),
        }
        if cfg.one_shot && rounds > 0 {
            break;
        }
    }
    progress.clear();
    let elapsed = start.elapsed();
    // A sample cut short may have left the guest stopped.
    if !gone {
        backend.let_go();
    }
    Ok(Sampled {
        samples,
        rounds,
        elapsed,
        gone,
    })
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_jitter_stays_in_its_range_and_moves() {
        let mut j = Jitter(12345 | 1);
        let v: Vec<f64> = (0..1000).map(|_| j.next()).collect();
        assert!(v.iter().all(|x| (0.0..1.0).contains(x)));
        let mean = v.iter().sum::<f64>() / v.len() as f64;
        // Uniform on [0, 1): mean 0.5, σ of the mean √(1/12/1000) ≈ 0.009.
        assert!((mean - 0.5).abs() < 0.04, "mean {mean}");
    }
}
