//! Empties a sampler's ring buffers into memory on a thread of its own.
//!
//! A ring holds about 128 samples with their stack copies: half a second at 250 Hz. The
//! consumer unwinds and names each sample as it drains, and the first sample in a new module
//! makes it read that module's symbols and unwind tables (a large debug file can take seconds
//! on a slow machine, an emulated one above all). Had the consumer alone emptied the rings,
//! the kernel would drop every record that came meanwhile. The pump copies them out every few
//! milliseconds instead; the consumer takes them, older first, whenever it is ready.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::Duration;

use crate::record::Layout;
use crate::sys::RingMap;

/// At most this many bytes wait in memory: past it the pump stops copying, the rings fill and
/// the kernel counts what it drops as lost, as it would without a pump.
const QUEUE_CAP: usize = 256 << 20;

/// The rings of one sampler and the records copied out of them, not yet taken.
pub(crate) struct Rings {
    pub(crate) maps: Vec<RingMap>,
    queue: Vec<u8>,
}

impl Rings {
    pub(crate) fn new() -> Rings {
        Rings {
            maps: Vec::new(),
            queue: Vec::new(),
        }
    }

    /// Appends to `out` every record not taken yet: those the pump copied (the oldest), then
    /// what the rings hold now. Every record committed to a ring before the call is in `out`
    /// after it. Returns the bytes appended.
    pub(crate) fn take(&mut self, out: &mut Vec<u8>, layout: Layout) -> usize {
        let before = out.len();
        if out.is_empty() {
            std::mem::swap(out, &mut self.queue);
        } else {
            out.append(&mut self.queue);
        }
        for map in &mut self.maps {
            map.drain_cut(out, layout);
        }
        out.len() - before
    }

    /// Copies what the rings hold into the queue, within [`QUEUE_CAP`].
    fn pump(&mut self, layout: Layout) {
        if self.queue.len() >= QUEUE_CAP {
            return;
        }
        for map in &mut self.maps {
            map.drain_cut(&mut self.queue, layout);
        }
    }
}

/// The thread that empties the rings every `every`; stopped and joined when dropped.
pub(crate) struct Pump {
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<()>>,
}

impl Pump {
    /// Starts the pump; None when no thread can be started (the consumer then empties the
    /// rings alone, as it would have).
    pub(crate) fn start(rings: Arc<Mutex<Rings>>, layout: Layout, every: Duration) -> Option<Pump> {
        let stop = Arc::new(AtomicBool::new(false));
        let flag = stop.clone();
        let thread = std::thread::Builder::new()
            .name("superprof-pump".into())
            .spawn(move || {
                // Ahead of the program's threads where allowed (root): its work is a copy
                // every few milliseconds, and late it loses samples (27 of 1,039 once, in an
                // emulated guest on a host that stole much of the machine, both guest CPUs
                // busy with the program's threads).
                crate::sys::raise_thread_priority(-10);
                while !flag.load(Ordering::Acquire) {
                    std::thread::park_timeout(every);
                    match rings.lock() {
                        Ok(mut r) => r.pump(layout),
                        Err(_) => return, // (the consumer panicked)
                    }
                }
            })
            .ok()?;
        Some(Pump {
            stop,
            thread: Some(thread),
        })
    }

    /// How often to empty rings of `ring_bytes` each, holding samples of about `sample_bytes`
    /// at up to `frequency` a second: a quarter of a ring's room at most, within 2..50 ms.
    pub(crate) fn period(ring_bytes: usize, sample_bytes: usize, frequency: u32) -> Duration {
        let room = (ring_bytes / sample_bytes.max(1)).max(1) as f64;
        let seconds = room / 4.0 / f64::from(frequency.max(1));
        Duration::from_secs_f64(seconds.clamp(0.002, 0.050))
    }
}

impl Drop for Pump {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Release);
        if let Some(t) = self.thread.take() {
            t.thread().unpark();
            let _ = t.join();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_period_leaves_a_ring_three_quarters_empty() {
        // 128 samples of 9 KiB in a ring, at 250 Hz: 128 ms to a quarter, capped at 50 ms.
        assert_eq!(
            Pump::period(128 * 9216, 9216, 250),
            Duration::from_millis(50)
        );
        // At 4,000 Hz: 8 ms.
        assert_eq!(
            Pump::period(128 * 9216, 9216, 4000),
            Duration::from_millis(8)
        );
        // Never a busy loop, whatever the figures.
        assert_eq!(Pump::period(0, 0, u32::MAX), Duration::from_millis(2));
    }
}
