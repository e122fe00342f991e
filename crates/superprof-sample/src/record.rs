//! Parsing of the perf ring-buffer records the sampler asks for. The layout of a sample follows
//! from the `sample_type` bits set in `sampler.rs`; the two must change together.

use superprof_unwind::UserRegs;

pub const PERF_RECORD_MMAP: u32 = 1;
pub const PERF_RECORD_LOST: u32 = 2;
pub const PERF_RECORD_COMM: u32 = 3;
pub const PERF_RECORD_EXIT: u32 = 4;
pub const PERF_RECORD_FORK: u32 = 7;
pub const PERF_RECORD_SAMPLE: u32 = 9;
pub const PERF_RECORD_MMAP2: u32 = 10;
pub const PERF_RECORD_LOST_SAMPLES: u32 = 13;
pub const PERF_RECORD_SWITCH: u32 = 14;

const PERF_RECORD_MISC_COMM_EXEC: u16 = 1 << 13;
const PERF_RECORD_MISC_MMAP_BUILD_ID: u16 = 1 << 14;
const PERF_RECORD_MISC_SWITCH_OUT: u16 = 1 << 13;
const PERF_RECORD_MISC_SWITCH_OUT_PREEMPT: u16 = 1 << 14;

/// Callchain context markers (`enum perf_callchain_context`).
const PERF_CONTEXT_MAX: u64 = -4095i64 as u64;
const PERF_CONTEXT_USER: u64 = -512i64 as u64;

/// One sample: where the thread was and the bytes of its user stack.
#[derive(Debug)]
pub struct SampleRecord<'a> {
    /// The id of the event that took the sample (PERF_SAMPLE_IDENTIFIER).
    pub id: u64,
    /// When it was taken: CLOCK_MONOTONIC, in nanoseconds.
    pub time: u64,
    /// The process.
    pub pid: u32,
    /// The thread.
    pub tid: u32,
    /// The CPU the thread ran on.
    pub cpu: u32,
    /// What the sample stands for: nanoseconds of CPU time for `cpu-clock`, cycles for
    /// `cycles` (the period the kernel set to reach the frequency), 1 for a context switch.
    pub period: u64,
    /// Kernel frames, innermost first (empty when the sample was taken in user mode or kernel
    /// callchains are excluded).
    pub kernel_ips: Vec<u64>,
    /// User frames the kernel walked by frame pointers (`--call-graph fp`), innermost (the
    /// pc) first; empty otherwise.
    pub user_ips: Vec<u64>,
    /// `None` when the sample has no user context (a kernel thread).
    pub regs: Option<UserRegs>,
    /// Copy of the user stack starting at `regs.sp`.
    pub stack: &'a [u8],
    /// The copy filled the whole buffer: the stack may go on beyond it.
    pub stack_full: bool,
}

/// One record of the ring buffer, parsed. Every `time` is CLOCK_MONOTONIC, in nanoseconds.
#[derive(Debug)]
pub enum Record<'a> {
    /// A sample (PERF_RECORD_SAMPLE).
    Sample(SampleRecord<'a>),
    /// A file or anonymous memory mapped by a thread (PERF_RECORD_MMAP or MMAP2).
    Mmap {
        /// The process.
        pid: u32,
        /// The thread that mapped it.
        tid: u32,
        /// When.
        time: u64,
        /// The first address of the mapping.
        start: u64,
        /// Its length in bytes.
        len: u64,
        /// The file offset mapped at `start`, in bytes.
        pgoff: u64,
        /// Whether the mapping may be executed (PROT_EXEC).
        executable: bool,
        /// The file's path as the kernel names it (`//anon`, `[vdso]` and the like for
        /// memory of no file).
        path: String,
    },
    /// A thread's command name set (PERF_RECORD_COMM), by prctl or by exec.
    Comm {
        /// The process.
        pid: u32,
        /// The thread.
        tid: u32,
        /// When.
        time: u64,
        /// The new name (at most 15 bytes, as the kernel keeps it).
        name: String,
        /// Set by an exec: the process's old mappings are gone.
        exec: bool,
    },
    /// A process or thread started (PERF_RECORD_FORK).
    Fork {
        /// The new task's process.
        pid: u32,
        /// The process it was forked from (its own `pid` for a new thread).
        ppid: u32,
        /// The new thread.
        tid: u32,
        /// The thread that started it.
        ptid: u32,
        /// When.
        time: u64,
    },
    /// A thread ended (PERF_RECORD_EXIT).
    Exit {
        /// Its process.
        pid: u32,
        /// The thread.
        tid: u32,
        /// When.
        time: u64,
    },
    /// Records or samples the kernel could not write (PERF_RECORD_LOST, LOST_SAMPLES).
    Lost {
        /// How many were lost.
        count: u64,
        /// When the loss was reported.
        time: u64,
    },
    /// A thread left the CPU (`out`; `preempted` when it was still runnable) or came back.
    Switch {
        /// The process.
        pid: u32,
        /// The thread.
        tid: u32,
        /// When.
        time: u64,
        /// The CPU and the id of the event that wrote it (the sample_id trailer).
        cpu: u32,
        /// The id of the event that wrote it (PERF_SAMPLE_IDENTIFIER).
        id: u64,
        /// The thread left the CPU (else it came back).
        out: bool,
        /// It left while still runnable (preempted, not waiting).
        preempted: bool,
    },
    /// A record of another type, which the caller only orders by time.
    Other {
        /// When, from its sample_id trailer (0 when the record is too short to have one).
        time: u64,
    },
}

impl Record<'_> {
    /// When the record was written: CLOCK_MONOTONIC, in nanoseconds.
    pub fn time(&self) -> u64 {
        match self {
            Record::Sample(s) => s.time,
            Record::Mmap { time, .. }
            | Record::Comm { time, .. }
            | Record::Fork { time, .. }
            | Record::Exit { time, .. }
            | Record::Lost { time, .. }
            | Record::Switch { time, .. }
            | Record::Other { time } => *time,
        }
    }
}

/// What the parser must know about how the events were opened.
#[derive(Debug, Clone, Copy)]
pub struct Layout {
    /// Number of user registers in each sample (bits set in `sample_regs_user`): at most 8; a
    /// sample parsed with more is refused as malformed.
    pub user_regs: usize,
    /// Whether samples carry a copy of the user stack (PERF_SAMPLE_STACK_USER: not with
    /// `--call-graph fp`).
    pub stack_user: bool,
    /// Whether samples carry their period (PERF_SAMPLE_PERIOD: not with a fixed period of
    /// `record -c`, where the kernel would sample each software event, its period 1).
    pub period: bool,
}

/// The most user registers a sample may carry for [`parse_record`].
const MAX_USER_REGS: usize = 8;

struct Cursor<'a> {
    buf: &'a [u8],
    pos: usize,
}

impl<'a> Cursor<'a> {
    fn u64(&mut self) -> Option<u64> {
        let b = self.buf.get(self.pos..self.pos + 8)?;
        self.pos += 8;
        Some(u64::from_ne_bytes(b.try_into().ok()?))
    }
    fn u32(&mut self) -> Option<u32> {
        let b = self.buf.get(self.pos..self.pos + 4)?;
        self.pos += 4;
        Some(u32::from_ne_bytes(b.try_into().ok()?))
    }
    fn bytes(&mut self, n: usize) -> Option<&'a [u8]> {
        let b = self.buf.get(self.pos..self.pos.checked_add(n)?)?;
        self.pos += n;
        Some(b)
    }
    fn skip(&mut self, n: usize) -> Option<()> {
        self.bytes(n).map(|_| ())
    }
    /// A NUL-terminated string padded to 8 bytes.
    fn cstr(&mut self) -> Option<String> {
        let rest = self.buf.get(self.pos..)?;
        let nul = rest.iter().position(|&b| b == 0)?;
        let s = String::from_utf8_lossy(&rest[..nul]).into_owned();
        self.pos += (nul + 1).div_ceil(8) * 8;
        Some(s)
    }
    /// The `sample_id_all` trailer for TID | TIME | CPU | IDENTIFIER: returns the time.
    fn sample_id_time(&mut self) -> Option<u64> {
        self.skip(8)?;
        self.u64()
    }
}

/// Splits a drained buffer into records, yielding `(type, misc, body)` triples.
pub fn split_records(buf: &[u8]) -> impl Iterator<Item = (u32, u16, &[u8])> {
    let mut pos = 0usize;
    std::iter::from_fn(move || {
        let header = buf.get(pos..pos + 8)?;
        let ty = u32::from_ne_bytes(header[0..4].try_into().ok()?);
        let misc = u16::from_ne_bytes(header[4..6].try_into().ok()?);
        let size = u16::from_ne_bytes(header[6..8].try_into().ok()?) as usize;
        if size < 8 {
            return None;
        }
        let body = buf.get(pos + 8..pos + size)?;
        pos += size;
        Some((ty, misc, body))
    })
}

/// Where a sample record's user stack copy can be cut: the kernel writes the whole
/// `sample_stack_user` bytes (32 KiB by default) whatever the thread used, and copying them
/// out of the ring was most of record's own CPU time (a reader starved by a busy program lost
/// records). Given a sample's length in bytes (header included) and a reader of its u64 at a
/// byte offset, returns `(offset of the stack's size field, size, used bytes)` when the used
/// part, rounded up, is shorter than the copy; `None` keeps the record whole (no stack, a full copy, or a
/// layout other than [`parse_record`]'s, with STACK_USER last).
pub fn stack_cut(
    len: usize,
    read: impl Fn(usize) -> Option<u64>,
    layout: Layout,
) -> Option<(usize, usize, usize)> {
    if !layout.stack_user {
        return None;
    }
    // Header 8, then IDENTIFIER, TID, TIME, CPU, PERIOD (8 each), CALLCHAIN's nr at 48
    // (40 without PERIOD).
    let nr_at = if layout.period { 48 } else { 40 };
    let nr = usize::try_from(read(nr_at)?).ok()?;
    let abi_at = nr.checked_mul(8)?.checked_add(nr_at + 8)?;
    let abi = read(abi_at)?;
    let regs = if abi != 0 { layout.user_regs } else { 0 };
    let size_at = abi_at.checked_add(8)?.checked_add(regs.checked_mul(8)?)?;
    let size = usize::try_from(read(size_at)?).ok()?;
    // STACK_USER must end the record exactly: size, data, dyn_size.
    let dyn_at = size_at.checked_add(8)?.checked_add(size)?;
    if size == 0 || dyn_at.checked_add(8)? != len {
        return None;
    }
    let used = usize::try_from(read(dyn_at)?).ok()?;
    (cut_size(used) < size).then_some((size_at, size, used))
}

/// The size a cut stack copy keeps for `used` bytes: a multiple of 8 (records stay aligned)
/// and more than `used`, so a parsed sample still reads as not truncated (`stack_full` is
/// `used == size`).
pub fn cut_size(used: usize) -> usize {
    (used + 8) & !7
}

/// Parses one record body; `None` means a malformed record, which the caller counts and skips.
///
/// (One function of 106 lines: one match over the perf record types, each arm reading its fields in
/// the order of the kernel's layout; a table of layouts, with nothing shared to split out.)
pub fn parse_record<'a>(ty: u32, misc: u16, body: &'a [u8], layout: Layout) -> Option<Record<'a>> {
    let mut c = Cursor { buf: body, pos: 0 };
    Some(match ty {
        PERF_RECORD_SAMPLE => Record::Sample(parse_sample(&mut c, layout)?),
        PERF_RECORD_MMAP | PERF_RECORD_MMAP2 => {
            let pid = c.u32()?;
            let tid = c.u32()?;
            let start = c.u64()?;
            let len = c.u64()?;
            let pgoff = c.u64()?;
            let executable = if ty == PERF_RECORD_MMAP2 {
                // maj/min/ino/ino_generation, or a build id when MMAP_BUILD_ID is set: 24 bytes.
                let _ = misc & PERF_RECORD_MISC_MMAP_BUILD_ID;
                c.skip(24)?;
                let prot = c.u32()?;
                let _flags = c.u32()?;
                prot & libc::PROT_EXEC as u32 != 0
            } else {
                misc & (1 << 13) == 0 // PERF_RECORD_MISC_MMAP_DATA
            };
            let path = c.cstr()?;
            let time = c.sample_id_time()?;
            Record::Mmap {
                pid,
                tid,
                time,
                start,
                len,
                pgoff,
                executable,
                path,
            }
        }
        PERF_RECORD_COMM => {
            let pid = c.u32()?;
            let tid = c.u32()?;
            let name = c.cstr()?;
            let time = c.sample_id_time()?;
            Record::Comm {
                pid,
                tid,
                time,
                name,
                exec: misc & PERF_RECORD_MISC_COMM_EXEC != 0,
            }
        }
        PERF_RECORD_FORK | PERF_RECORD_EXIT => {
            let pid = c.u32()?;
            let ppid = c.u32()?;
            let tid = c.u32()?;
            let ptid = c.u32()?;
            let time = c.u64()?;
            if ty == PERF_RECORD_FORK {
                Record::Fork {
                    pid,
                    ppid,
                    tid,
                    ptid,
                    time,
                }
            } else {
                Record::Exit { pid, tid, time }
            }
        }
        PERF_RECORD_LOST => {
            let _id = c.u64()?;
            let count = c.u64()?;
            let time = c.sample_id_time()?;
            Record::Lost { count, time }
        }
        PERF_RECORD_SWITCH => {
            // Only the sample_id trailer: pid/tid, time, cpu/res, identifier.
            let pid = c.u32()?;
            let tid = c.u32()?;
            let time = c.u64()?;
            let cpu = c.u32()?;
            c.skip(4)?;
            let id = c.u64()?;
            Record::Switch {
                pid,
                tid,
                time,
                cpu,
                id,
                out: misc & PERF_RECORD_MISC_SWITCH_OUT != 0,
                preempted: misc & PERF_RECORD_MISC_SWITCH_OUT_PREEMPT != 0,
            }
        }
        PERF_RECORD_LOST_SAMPLES => {
            let count = c.u64()?;
            let time = c.sample_id_time()?;
            Record::Lost { count, time }
        }
        _ => {
            // Every other record type still carries the sample_id trailer at its end:
            // pid/tid, time, cpu/res, identifier.
            let time = body
                .len()
                .checked_sub(24)
                .and_then(|p| body.get(p..p + 8))
                .map(|b| u64::from_ne_bytes(b.try_into().unwrap_or_default()))
                .unwrap_or(0);
            Record::Other { time }
        }
    })
}

fn parse_sample<'a>(c: &mut Cursor<'a>, layout: Layout) -> Option<SampleRecord<'a>> {
    // Order fixed by the ABI: IDENTIFIER, TID, TIME, CPU, PERIOD, CALLCHAIN, REGS_USER,
    // STACK_USER.
    let id = c.u64()?;
    let pid = c.u32()?;
    let tid = c.u32()?;
    let time = c.u64()?;
    let cpu = c.u32()?;
    c.skip(4)?;
    let period = if layout.period { c.u64()? } else { 0 };
    let nr = c.u64()? as usize;
    let mut kernel_ips = Vec::new();
    let mut user_ips = Vec::new();
    let mut user = false;
    for _ in 0..nr {
        let ip = c.u64()?;
        if ip >= PERF_CONTEXT_MAX {
            user = ip == PERF_CONTEXT_USER;
        } else if user {
            user_ips.push(ip);
        } else {
            kernel_ips.push(ip);
        }
    }
    let abi = c.u64()?;
    let regs = if abi != 0 {
        let mut r = [0u64; MAX_USER_REGS];
        // More registers than kept here: refused (None), not a slice past the array's end.
        let r = r.get_mut(..layout.user_regs)?;
        for slot in r.iter_mut() {
            *slot = c.u64()?;
        }
        Some(UserRegs::from_perf_regs(r))
    } else {
        None
    };
    let size = if layout.stack_user {
        c.u64()? as usize
    } else {
        0
    };
    let (stack, stack_full) = if size > 0 {
        let data = c.bytes(size)?;
        let dyn_size = (c.u64()? as usize).min(size);
        (&data[..dyn_size], dyn_size == size)
    } else {
        (&[][..], false)
    };
    Some(SampleRecord {
        id,
        time,
        pid,
        tid,
        cpu,
        period,
        kernel_ips,
        user_ips,
        regs,
        stack,
        stack_full,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A whole sample record (header included) with `nr` callchain entries, 3 registers and
    /// a stack copy of `size` bytes of which `used` are valid.
    fn sample_record(nr: usize, size: usize, used: usize) -> Vec<u8> {
        let mut r = vec![0u8; 8];
        for v in [7u64, (11u64 << 32) | 10, 1234, 1, 1000, nr as u64] {
            r.extend_from_slice(&v.to_ne_bytes());
        }
        for i in 0..nr {
            r.extend_from_slice(&(0x1000 + i as u64).to_ne_bytes());
        }
        for v in [2u64, 0x401000, 0x7ff0, 0x7ff8, size as u64] {
            r.extend_from_slice(&v.to_ne_bytes());
        }
        r.extend((0..size).map(|i| i as u8));
        if size > 0 {
            r.extend_from_slice(&(used as u64).to_ne_bytes());
        }
        let len = r.len() as u16;
        r[0..4].copy_from_slice(&PERF_RECORD_SAMPLE.to_ne_bytes());
        r[6..8].copy_from_slice(&len.to_ne_bytes());
        r
    }

    /// What the ring's cut drain writes for a record, done on a plain buffer.
    fn cut(r: &[u8]) -> Vec<u8> {
        let layout = Layout {
            user_regs: 3,
            stack_user: true,
            period: true,
        };
        let read = |at: usize| Some(u64::from_ne_bytes(r.get(at..at + 8)?.try_into().ok()?));
        let Some((size_at, size, used)) = stack_cut(r.len(), read, layout) else {
            return r.to_vec();
        };
        let kept = cut_size(used);
        assert!(kept <= size && kept > used && kept.is_multiple_of(8));
        let mut out = r[..size_at].to_vec();
        let len = (size_at + 16 + kept) as u16;
        out[6..8].copy_from_slice(&len.to_ne_bytes());
        out.extend_from_slice(&(kept as u64).to_ne_bytes());
        out.extend_from_slice(&r[size_at + 8..size_at + 8 + used]);
        out.resize(out.len() + kept - used, 0);
        out.extend_from_slice(&(used as u64).to_ne_bytes());
        out
    }

    #[test]
    fn a_cut_stack_parses_as_the_whole_one() {
        let layout = Layout {
            user_regs: 3,
            stack_user: true,
            period: true,
        };
        for (nr, size, used) in [(0, 4096, 0), (3, 4096, 100), (5, 4096, 4087), (2, 256, 13)] {
            let whole = sample_record(nr, size, used);
            let small = cut(&whole);
            assert!(small.len() < whole.len(), "{nr} {size} {used}");
            let parse = |b: &[u8]| {
                let (ty, misc, body) = split_records(b).next().unwrap();
                match parse_record(ty, misc, body, layout).unwrap() {
                    Record::Sample(s) => (
                        s.tid,
                        s.kernel_ips,
                        s.regs.is_some(),
                        s.stack.to_vec(),
                        s.stack_full,
                    ),
                    _ => panic!("not a sample"),
                }
            };
            assert_eq!(parse(&whole), parse(&small), "{nr} {size} {used}");
        }
        // Kept whole: a full copy, no stack at all, a record whose stack is not last.
        for r in [
            sample_record(1, 512, 512),
            sample_record(1, 512, 509),
            sample_record(1, 0, 0),
        ] {
            assert_eq!(cut(&r), r);
        }
        let mut longer = sample_record(1, 512, 10);
        longer.extend_from_slice(&[0u8; 8]);
        let len = longer.len() as u16;
        longer[6..8].copy_from_slice(&len.to_ne_bytes());
        assert_eq!(cut(&longer), longer);
        // Hostile sizes: a callchain or stack size past the record, no panic.
        let mut bad = sample_record(1, 64, 10);
        bad[48..56].copy_from_slice(&u64::MAX.to_ne_bytes());
        assert_eq!(cut(&bad), bad);
        let mut bad = sample_record(0, 64, 10);
        bad[88..96].copy_from_slice(&(usize::MAX as u64 - 3).to_ne_bytes());
        assert_eq!(cut(&bad), bad);
    }

    fn switch(misc: u16, body: &[u8]) -> Option<(u32, u64, bool, bool)> {
        match parse_record(
            PERF_RECORD_SWITCH,
            misc,
            body,
            Layout {
                user_regs: 3,
                stack_user: true,
                period: true,
            },
        )? {
            Record::Switch {
                tid,
                time,
                out,
                preempted,
                ..
            } => Some((tid, time, out, preempted)),
            _ => None,
        }
    }

    /// A sample body with `regs` user registers (values 1, 2, ...) and no stack.
    fn sample_body(regs: u64) -> Vec<u8> {
        let mut body = Vec::new();
        body.extend_from_slice(&1u64.to_ne_bytes()); // identifier
        body.extend_from_slice(&7u32.to_ne_bytes()); // pid
        body.extend_from_slice(&9u32.to_ne_bytes()); // tid
        body.extend_from_slice(&1234u64.to_ne_bytes()); // time
        body.extend_from_slice(&[0; 8]); // cpu, res
        body.extend_from_slice(&1u64.to_ne_bytes()); // period
        body.extend_from_slice(&0u64.to_ne_bytes()); // callchain: nr
        body.extend_from_slice(&2u64.to_ne_bytes()); // regs abi (64-bit)
        for i in 1..=regs {
            body.extend_from_slice(&i.to_ne_bytes());
        }
        body.extend_from_slice(&0u64.to_ne_bytes()); // stack size
        body
    }

    #[test]
    fn a_layout_of_too_many_registers_is_refused_not_a_panic() {
        fn parse(regs: usize, body: &[u8]) -> Option<Record<'_>> {
            parse_record(
                PERF_RECORD_SAMPLE,
                0,
                body,
                Layout {
                    user_regs: regs,
                    stack_user: true,
                    period: true,
                },
            )
        }
        match parse(3, &sample_body(3)) {
            Some(Record::Sample(s)) => {
                assert_eq!((s.tid, s.time), (9, 1234));
                assert!(s.regs.is_some());
            }
            r => panic!("{r:?}"),
        }
        let n = MAX_USER_REGS + 1;
        assert!(parse(n, &sample_body(n as u64)).is_none());
        assert!(parse(usize::MAX, &sample_body(3)).is_none());
    }

    #[test]
    fn switch_records_in_and_out() {
        let mut body = Vec::new();
        body.extend_from_slice(&7u32.to_ne_bytes()); // pid
        body.extend_from_slice(&9u32.to_ne_bytes()); // tid
        body.extend_from_slice(&1234u64.to_ne_bytes()); // time
        body.extend_from_slice(&[0; 16]); // cpu, res, identifier
        assert_eq!(switch(0, &body), Some((9, 1234, false, false)));
        assert_eq!(switch(1 << 13, &body), Some((9, 1234, true, false)));
        assert_eq!(switch(3 << 13, &body), Some((9, 1234, true, true)));
        // Cut short: refused, not read past its end.
        assert_eq!(switch(0, &body[..12]), None);
        assert_eq!(switch(0, &body[..24]), None);
    }
}
