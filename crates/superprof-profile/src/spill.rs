//! A log of fixed-size records read back in time order, with at most a fixed number of them in
//! memory: past that, each full batch is sorted by time and written as a run to a private,
//! unnamed temporary file, and reading merges the runs. A profile's memory so grows with its
//! distinct stacks, not its samples (a 2-minute record at 100 kHz holds ten million samples).
//!
//! The file is made with `O_TMPFILE` (never named) in the temporary directory (`TMPDIR`), or,
//! where the file system cannot, created with `O_EXCL` and mode 0600 and unlinked at once.
//! Should writing it fail (a full disk), the records stay in memory; should reading a run back
//! fail, the run ends there and superprof says how many records were lost.

use std::cmp::Reverse;
use std::collections::BinaryHeap;
use std::fs::File;
use std::io;
use std::os::unix::fs::{FileExt, OpenOptionsExt};
use std::sync::Arc;

/// A record the log can keep on disk: `SIZE` bytes, and a time to order by.
pub trait Spill: Copy {
    /// Bytes per record.
    const SIZE: usize;
    /// The time the log orders records by.
    fn time(&self) -> u64;
    /// Appends exactly `SIZE` bytes.
    fn put(&self, out: &mut Vec<u8>);
    /// The record of `SIZE` bytes written by `put`; None if they are not one.
    fn get(bytes: &[u8]) -> Option<Self>;
}

/// The little-endian u64 at byte `at` of `b` (for [`Spill::get`]).
pub fn le_u64(b: &[u8], at: usize) -> Option<u64> {
    Some(u64::from_le_bytes(
        b.get(at..at.checked_add(8)?)?.try_into().ok()?,
    ))
}

/// The little-endian u32 at byte `at` of `b` (for [`Spill::get`]).
pub fn le_u32(b: &[u8], at: usize) -> Option<u32> {
    Some(u32::from_le_bytes(
        b.get(at..at.checked_add(4)?)?.try_into().ok()?,
    ))
}

/// Records kept in memory before a run goes to the file (about 8–10 MiB of samples).
pub const DEFAULT_CAP: usize = 1 << 18;

/// Records read from a run's file at a time, at most (fewer when there are many runs).
const READ_BATCH: usize = 4096;

/// Bytes of read buffers for all runs together while merging.
const READ_BUDGET: usize = 8 << 20;

#[derive(Debug, Clone, Copy)]
struct Run {
    offset: u64,
    count: usize,
}

/// An append-only log of records, iterated in time order (records of equal time in the order
/// they were added). See the module's notes.
#[derive(Debug)]
pub struct TimeLog<T> {
    mem: Vec<T>,
    /// `mem` is in time order already.
    mem_sorted: bool,
    runs: Vec<Run>,
    /// Shared by clones: each appends its runs at the file's end.
    file: Option<Arc<File>>,
    len: usize,
    cap: usize,
    /// Spilling failed once: everything stays in memory from then on.
    in_memory: bool,
}

impl<T> Default for TimeLog<T> {
    fn default() -> Self {
        TimeLog::with_cap(DEFAULT_CAP)
    }
}

impl<T: Clone> Clone for TimeLog<T> {
    fn clone(&self) -> Self {
        TimeLog {
            mem: self.mem.clone(),
            mem_sorted: self.mem_sorted,
            runs: self.runs.clone(),
            file: self.file.clone(),
            len: self.len,
            cap: self.cap,
            in_memory: self.in_memory,
        }
    }
}

impl<T> TimeLog<T> {
    /// A log keeping at most `cap` records in memory (at least 1).
    pub fn with_cap(cap: usize) -> Self {
        TimeLog {
            mem: Vec::new(),
            mem_sorted: true,
            runs: Vec::new(),
            file: None,
            len: 0,
            cap: cap.max(1),
            in_memory: false,
        }
    }

    /// Records in the log.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether the log holds no record.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Records written to the temporary file so far.
    pub fn spilled(&self) -> usize {
        self.runs.iter().map(|r| r.count).sum()
    }

    /// Forgets every record (the file goes when no clone uses it).
    pub fn clear(&mut self) {
        self.mem.clear();
        self.mem_sorted = true;
        self.runs.clear();
        self.file = None;
        self.len = 0;
    }
}

impl<T: Spill> TimeLog<T> {
    /// Adds a record.
    pub fn push(&mut self, record: T) {
        if let Some(last) = self.mem.last() {
            self.mem_sorted &= last.time() <= record.time();
        }
        self.mem.push(record);
        self.len += 1;
        if self.mem.len() >= self.cap && !self.in_memory {
            if let Err(e) = self.spill() {
                self.in_memory = true;
                superprof_unwind::say!(
                    "superprof: cannot write samples to a temporary file in {} ({e}); \
                     keeping them in memory",
                    std::env::temp_dir().display()
                );
            }
        }
    }

    /// Writes the records in memory to the file as one run, in time order.
    fn spill(&mut self) -> io::Result<()> {
        if self.file.is_none() {
            self.file = Some(Arc::new(spill_file()?));
        }
        let Some(file) = &self.file else {
            return Ok(());
        };
        if !self.mem_sorted {
            self.mem.sort_by_key(|r| r.time()); // stable: equal times keep their order
        }
        let offset = file.metadata()?.len();
        let mut buf = Vec::with_capacity(READ_BATCH * T::SIZE);
        let mut at = offset;
        for chunk in self.mem.chunks(READ_BATCH) {
            buf.clear();
            for r in chunk {
                r.put(&mut buf);
            }
            debug_assert_eq!(buf.len(), chunk.len() * T::SIZE);
            file.write_all_at(&buf, at)?;
            at += buf.len() as u64;
        }
        self.runs.push(Run {
            offset,
            count: self.mem.len(),
        });
        self.mem.clear();
        self.mem_sorted = true;
        Ok(())
    }

    /// Every record, in time order.
    pub fn iter(&self) -> Iter<'_, T> {
        let order = if self.mem_sorted {
            None
        } else {
            let mut idx: Vec<u32> = (0..self.mem.len() as u32).collect();
            idx.sort_by_key(|&i| self.mem[i as usize].time());
            Some(idx)
        };
        let batch = (READ_BUDGET / T::SIZE.max(1) / self.runs.len().max(1)).clamp(16, READ_BATCH);
        let cursors: Vec<Cursor<T>> = self
            .runs
            .iter()
            .map(|&run| Cursor {
                run,
                read: 0,
                buf: Vec::new(),
                pos: 0,
            })
            .collect();
        let mut it = Iter {
            log: self,
            order,
            mem_pos: 0,
            cursors,
            heap: BinaryHeap::new(),
            batch,
            warned: false,
        };
        for i in 0..it.cursors.len() {
            it.refill_and_queue(i);
        }
        it.queue_mem();
        it
    }

    /// Every record changed by `f`, in time order (the log is rebuilt).
    pub fn map_all(&mut self, mut f: impl FnMut(T) -> T) {
        let mut out = TimeLog::with_cap(self.cap);
        for r in self.iter() {
            out.push(f(r));
        }
        *self = out;
    }
}

impl<'a, T: Spill> IntoIterator for &'a TimeLog<T> {
    type Item = T;
    type IntoIter = Iter<'a, T>;
    fn into_iter(self) -> Iter<'a, T> {
        self.iter()
    }
}

impl<T: Spill> FromIterator<T> for TimeLog<T> {
    fn from_iter<I: IntoIterator<Item = T>>(iter: I) -> Self {
        let mut log = TimeLog::default();
        for r in iter {
            log.push(r);
        }
        log
    }
}

struct Cursor<T> {
    run: Run,
    /// Records of the run read so far.
    read: usize,
    buf: Vec<T>,
    pos: usize,
}

/// [`TimeLog::iter`]'s iterator: the runs and the records in memory, merged by time.
pub struct Iter<'a, T> {
    log: &'a TimeLog<T>,
    /// The order of the records in memory, when they were not added in time order.
    order: Option<Vec<u32>>,
    mem_pos: usize,
    cursors: Vec<Cursor<T>>,
    /// (time, source) of each source's next record; source `cursors.len()` is memory. Runs
    /// come before memory and earlier runs before later ones at equal times.
    heap: BinaryHeap<Reverse<(u64, usize)>>,
    batch: usize,
    warned: bool,
}

impl<T: Spill> Iter<'_, T> {
    fn mem_next(&self) -> Option<T> {
        let i = match &self.order {
            Some(order) => *order.get(self.mem_pos)? as usize,
            None => self.mem_pos,
        };
        self.log.mem.get(i).copied()
    }

    fn queue_mem(&mut self) {
        if let Some(r) = self.mem_next() {
            self.heap.push(Reverse((r.time(), self.cursors.len())));
        }
    }

    /// Queues cursor `i`'s next record, reading the next batch of its run when needed.
    fn refill_and_queue(&mut self, i: usize) {
        let batch = self.batch;
        let c = &mut self.cursors[i];
        if c.pos >= c.buf.len() {
            c.buf.clear();
            c.pos = 0;
            let n = batch.min(c.run.count - c.read);
            if n == 0 {
                return;
            }
            let Some(file) = &self.log.file else {
                return;
            };
            let mut bytes = vec![0u8; n * T::SIZE];
            let at = c.run.offset + (c.read * T::SIZE) as u64;
            let got = file.read_exact_at(&mut bytes, at).ok().and_then(|()| {
                bytes
                    .chunks_exact(T::SIZE)
                    .map(T::get)
                    .collect::<Option<Vec<T>>>()
            });
            match got {
                Some(records) => {
                    c.buf = records;
                    c.read += n;
                }
                None => {
                    let lost = c.run.count - c.read;
                    c.read = c.run.count;
                    if !std::mem::replace(&mut self.warned, true) {
                        superprof_unwind::say!(
                            "superprof: reading samples back from the temporary file failed; \
                             {lost} or more left out"
                        );
                    }
                    return;
                }
            }
        }
        let t = c.buf[c.pos].time();
        self.heap.push(Reverse((t, i)));
    }
}

impl<T: Spill> Iterator for Iter<'_, T> {
    type Item = T;

    fn next(&mut self) -> Option<T> {
        // The usual case, nothing spilled: the records in memory, in order.
        if self.cursors.is_empty() {
            let r = self.mem_next()?;
            self.mem_pos += 1;
            return Some(r);
        }
        let Reverse((_, src)) = self.heap.pop()?;
        if src == self.cursors.len() {
            let r = self.mem_next()?;
            self.mem_pos += 1;
            self.queue_mem();
            return Some(r);
        }
        let c = &mut self.cursors[src];
        let r = *c.buf.get(c.pos)?;
        c.pos += 1;
        self.refill_and_queue(src);
        Some(r)
    }

    fn size_hint(&self) -> (usize, Option<usize>) {
        (0, Some(self.log.len))
    }
}

/// A new unnamed file in the temporary directory, readable and writable by this user only.
fn spill_file() -> io::Result<File> {
    let dir = std::env::temp_dir();
    let unnamed = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .mode(0o600)
        .custom_flags(libc::O_TMPFILE)
        .open(&dir);
    if let Ok(f) = unnamed {
        return Ok(f);
    }
    let stamp = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos());
    let mut last = io::Error::other("no name left");
    for i in 0..16 {
        let path = dir.join(format!(
            ".superprof-spill-{}-{stamp:x}-{i}",
            std::process::id()
        ));
        match std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .create_new(true)
            .mode(0o600)
            .custom_flags(libc::O_NOFOLLOW)
            .open(&path)
        {
            Ok(f) => {
                std::fs::remove_file(&path)?;
                return Ok(f);
            }
            Err(e) => last = e,
        }
    }
    Err(last)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Debug, Clone, Copy, PartialEq)]
    struct R(u64, u32);

    impl Spill for R {
        const SIZE: usize = 12;
        fn time(&self) -> u64 {
            self.0
        }
        fn put(&self, out: &mut Vec<u8>) {
            out.extend_from_slice(&self.0.to_le_bytes());
            out.extend_from_slice(&self.1.to_le_bytes());
        }
        fn get(b: &[u8]) -> Option<R> {
            Some(R(le_u64(b, 0)?, le_u32(b, 8)?))
        }
    }

    /// What the log must yield: the records sorted by time, ties in the order added.
    fn expected(records: &[R]) -> Vec<R> {
        let mut v = records.to_vec();
        v.sort_by_key(|r| r.0);
        v
    }

    #[test]
    fn records_come_back_in_time_order_whatever_was_spilled() {
        // Times out of order, with ties, over several runs and a part still in memory.
        let records: Vec<R> = (0..10_000u32)
            .map(|i| R(((i as u64 * 7919) % 1000) / 3, i))
            .collect();
        for cap in [1, 7, 100, 4096, 20_000] {
            let mut log = TimeLog::with_cap(cap);
            for &r in &records {
                log.push(r);
            }
            assert_eq!(log.len(), records.len());
            if cap < records.len() {
                assert!(log.spilled() > 0, "cap {cap}: nothing spilled");
                assert!(
                    log.mem.len() < cap,
                    "cap {cap}: {} in memory",
                    log.mem.len()
                );
            }
            let back: Vec<R> = log.iter().collect();
            assert_eq!(back, expected(&records), "cap {cap}");
            // Twice: reading does not consume.
            assert_eq!(log.iter().count(), records.len());
        }
    }

    #[test]
    fn clones_share_the_file_without_mixing_their_runs() {
        let mut a = TimeLog::with_cap(10);
        for i in 0..25 {
            a.push(R(i, 1));
        }
        let mut b = a.clone();
        for i in 25..50 {
            a.push(R(i, 1));
            b.push(R(i, 2));
        }
        assert!(a.iter().all(|r| r.1 == 1 || r.0 < 25));
        assert_eq!(a.iter().filter(|r| r.1 == 1).count(), 50);
        assert_eq!(b.iter().filter(|r| r.1 == 2).count(), 25);
        assert_eq!(
            b.iter().map(|r| r.0).collect::<Vec<_>>(),
            (0..50).collect::<Vec<_>>()
        );
        b.map_all(|r| R(r.0 + 1, r.1));
        assert_eq!(b.iter().next(), Some(R(1, 1)));
        assert_eq!(b.len(), 50);
        a.clear();
        assert!(a.is_empty() && a.iter().next().is_none());
    }

    #[test]
    fn records_in_time_order_need_no_index() {
        let mut log = TimeLog::with_cap(1000);
        for i in 0..500 {
            log.push(R(i / 2, i as u32));
        }
        assert!(log.mem_sorted);
        assert_eq!(log.iter().collect::<Vec<_>>(), expected(&log.mem));
    }
}
