//! Ring buffers mapped ahead of the events that fill them.
//!
//! Mapping a ring costs about 1.4 ms of zeroed pages per CPU (8 MiB each), a quarter of a
//! warm `record -- true`. A per-CPU event for the whole machine needs no RCU grace period to
//! open (a per-task or cgroup event does, when none is open: 6–20 ms), so a disabled dummy
//! one per CPU, which records nothing, can own each ring from the moment a recording begins;
//! the cgroup's events, once open, are redirected into it (SET_OUTPUT). The rings are mapped on
//! a thread of their own, while the cgroup is made and the command forked.

use std::os::fd::OwnedFd;
use std::thread::JoinHandle;

use super::{data_pages, online_cpus, SamplerConfig};
use crate::sys::{self, PerfEventAttr, RingMap};

/// Per-CPU rings being mapped (see the module's note).
pub struct RingsAhead {
    cpus: Vec<u32>,
    data_pages: usize,
    thread: JoinHandle<Option<Vec<(OwnedFd, RingMap)>>>,
}

/// The attributes of the dummy event that owns a ring of `data_pages`: what the events
/// redirected into it must share (the clock, the watermark the ring wakes its reader at),
/// and nothing else: no samples, no records of the machine's mmaps or tasks.
fn owner_attr(data_pages: usize) -> PerfEventAttr {
    PerfEventAttr {
        type_: sys::PERF_TYPE_SOFTWARE,
        config: sys::PERF_COUNT_SW_DUMMY,
        flags: sys::FLAG_DISABLED
            | sys::FLAG_EXCLUDE_KERNEL
            | sys::FLAG_EXCLUDE_HV
            | sys::FLAG_WATERMARK
            | sys::FLAG_USE_CLOCKID,
        wakeup_events_or_watermark: super::watermark(data_pages),
        clockid: libc::CLOCK_MONOTONIC,
        ..Default::default()
    }
}

impl RingsAhead {
    /// Starts mapping one ring per online CPU for `config`'s sampling, where superprof may
    /// open per-CPU events and map rings of any size (root: CAP_IPC_LOCK); None elsewhere.
    pub fn start(config: &SamplerConfig) -> Option<RingsAhead> {
        if sys::euid() != 0 || !sys::has_ipc_lock() {
            return None;
        }
        let cpus = online_cpus().ok()?;
        let pages = data_pages(config, cpus.len());
        let attr = owner_attr(pages);
        let on = cpus.clone();
        let thread = std::thread::Builder::new()
            .name("superprof-rings".into())
            .spawn(move || {
                on.iter()
                    .map(|&cpu| {
                        let fd = sys::perf_event_open(&attr, -1, cpu as i32).ok()?;
                        let ring = RingMap::new(&fd, pages).ok()?;
                        Some((fd, ring))
                    })
                    .collect()
            })
            .ok()?;
        Some(RingsAhead {
            cpus,
            data_pages: pages,
            thread,
        })
    }

    /// The rings, one per CPU of `cpus` in that order, once mapped, where they were mapped for
    /// these CPUs and `data_pages`; None where anything differs or failed (the caller maps
    /// its own).
    pub(super) fn take(self, cpus: &[u32], data_pages: usize) -> Option<Vec<(OwnedFd, RingMap)>> {
        let rings = self.thread.join().ok()??;
        (self.cpus == cpus && self.data_pages == data_pages).then_some(rings)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_owner_records_nothing_and_shares_the_clock() {
        let a = owner_attr(2048);
        assert_eq!(a.sample_type, 0);
        for f in [
            sys::FLAG_MMAP,
            sys::FLAG_MMAP2,
            sys::FLAG_COMM,
            sys::FLAG_TASK,
            sys::FLAG_CONTEXT_SWITCH,
            sys::FLAG_INHERIT,
        ] {
            assert_eq!(a.flags & f, 0);
        }
        assert_ne!(a.flags & sys::FLAG_USE_CLOCKID, 0);
        assert_eq!(a.clockid, libc::CLOCK_MONOTONIC);
        assert_eq!(a.wakeup_events_or_watermark, super::super::watermark(2048));
    }
}
