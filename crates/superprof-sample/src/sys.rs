//! The only place in this crate that talks to the kernel: `perf_event_open`, its ioctls and the
//! ring-buffer mmap. Everything here is a thin, documented wrapper; policy lives in `sampler.rs`.

use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::sync::atomic::{AtomicU64, Ordering};

pub const PERF_TYPE_HARDWARE: u32 = 0;
pub const PERF_TYPE_SOFTWARE: u32 = 1;
pub const PERF_TYPE_TRACEPOINT: u32 = 2;
pub const PERF_COUNT_SW_CONTEXT_SWITCHES: u64 = 3;
pub const PERF_COUNT_HW_CPU_CYCLES: u64 = 0;
pub const PERF_COUNT_SW_CPU_CLOCK: u64 = 0;
pub const PERF_COUNT_SW_TASK_CLOCK: u64 = 1;
pub const PERF_COUNT_SW_DUMMY: u64 = 9;

pub const PERF_SAMPLE_TID: u64 = 1 << 1;
pub const PERF_SAMPLE_TIME: u64 = 1 << 2;
pub const PERF_SAMPLE_CALLCHAIN: u64 = 1 << 5;
pub const PERF_SAMPLE_CPU: u64 = 1 << 7;
pub const PERF_SAMPLE_PERIOD: u64 = 1 << 8;
pub const PERF_SAMPLE_REGS_USER: u64 = 1 << 12;
pub const PERF_SAMPLE_STACK_USER: u64 = 1 << 13;
pub const PERF_SAMPLE_IDENTIFIER: u64 = 1 << 16;

// Bits of the attr flag word.
pub const FLAG_DISABLED: u64 = 1 << 0;
pub const FLAG_INHERIT: u64 = 1 << 1;
pub const FLAG_EXCLUDE_USER: u64 = 1 << 4;
pub const FLAG_EXCLUDE_KERNEL: u64 = 1 << 5;
pub const FLAG_EXCLUDE_HV: u64 = 1 << 6;
pub const FLAG_MMAP: u64 = 1 << 8;
pub const FLAG_COMM: u64 = 1 << 9;
pub const FLAG_FREQ: u64 = 1 << 10;
pub const FLAG_ENABLE_ON_EXEC: u64 = 1 << 12;
pub const FLAG_TASK: u64 = 1 << 13;
pub const FLAG_WATERMARK: u64 = 1 << 14;
pub const FLAG_SAMPLE_ID_ALL: u64 = 1 << 18;
pub const FLAG_EXCLUDE_CALLCHAIN_KERNEL: u64 = 1 << 21;
pub const FLAG_EXCLUDE_CALLCHAIN_USER: u64 = 1 << 22;
pub const FLAG_MMAP2: u64 = 1 << 23;
pub const FLAG_COMM_EXEC: u64 = 1 << 24;
pub const FLAG_USE_CLOCKID: u64 = 1 << 25;
pub const FLAG_CONTEXT_SWITCH: u64 = 1 << 26;

const PERF_EVENT_IOC_ENABLE: libc::c_ulong = 0x2400;
const PERF_EVENT_IOC_DISABLE: libc::c_ulong = 0x2401;
const PERF_EVENT_IOC_SET_OUTPUT: libc::c_ulong = 0x2405;
/// _IOR('$', 7, u64)
const PERF_EVENT_IOC_ID: libc::c_ulong = 0x8008_2407;
const PERF_FLAG_FD_CLOEXEC: libc::c_ulong = 1 << 3;

/// `struct perf_event_attr` up to `sig_data` (PERF_ATTR_SIZE_VER7, 128 bytes).
#[repr(C)]
#[derive(Debug, Default, Clone, Copy)]
pub struct PerfEventAttr {
    pub type_: u32,
    pub size: u32,
    pub config: u64,
    pub sample_period_or_freq: u64,
    pub sample_type: u64,
    pub read_format: u64,
    pub flags: u64,
    pub wakeup_events_or_watermark: u32,
    pub bp_type: u32,
    pub config1: u64,
    pub config2: u64,
    pub branch_sample_type: u64,
    pub sample_regs_user: u64,
    pub sample_stack_user: u32,
    pub clockid: i32,
    pub sample_regs_intr: u64,
    pub aux_watermark: u32,
    pub sample_max_stack: u16,
    pub reserved_2: u16,
    pub aux_sample_size: u32,
    pub reserved_3: u32,
    pub sig_data: u64,
}

const _: () = assert!(std::mem::size_of::<PerfEventAttr>() == 128);

/// The perf id of tracepoint `system:event`, from tracefs (readable by root).
pub fn tracepoint_id(system: &str, event: &str) -> Option<u64> {
    ["/sys/kernel/tracing", "/sys/kernel/debug/tracing"]
        .iter()
        .find_map(|root| std::fs::read_to_string(format!("{root}/events/{system}/{event}/id")).ok())
        .and_then(|s| s.trim().parse::<u64>().ok())
}

/// Opens one perf event. `pid` is a thread or process id, `cpu` a CPU number or -1.
pub fn perf_event_open(attr: &PerfEventAttr, pid: i32, cpu: i32) -> io::Result<OwnedFd> {
    perf_event_open_group(attr, pid, cpu, None)
}

/// Opens one per-CPU event for the tasks of a cgroup (v2): `cgroup` is the cgroup's directory.
pub fn perf_event_open_cgroup(
    attr: &PerfEventAttr,
    cgroup: &OwnedFd,
    cpu: i32,
) -> io::Result<OwnedFd> {
    perf_event_open_flags(attr, cgroup.as_raw_fd(), cpu, None, PERF_FLAG_PID_CGROUP)
}

const PERF_FLAG_PID_CGROUP: libc::c_ulong = 1 << 2;

/// Opens one perf event, in the group of `group_fd` when given.
pub fn perf_event_open_group(
    attr: &PerfEventAttr,
    pid: i32,
    cpu: i32,
    group_fd: Option<RawFd>,
) -> io::Result<OwnedFd> {
    perf_event_open_flags(attr, pid, cpu, group_fd, 0)
}

fn perf_event_open_flags(
    attr: &PerfEventAttr,
    pid: i32,
    cpu: i32,
    group_fd: Option<RawFd>,
    flags: libc::c_ulong,
) -> io::Result<OwnedFd> {
    let mut attr = *attr;
    attr.size = std::mem::size_of::<PerfEventAttr>() as u32;
    // SAFETY: `attr` is a valid, fully initialised perf_event_attr of the size we pass; the
    // kernel only reads it (and may write `size` back on E2BIG, which is our own copy).
    let fd = unsafe {
        libc::syscall(
            libc::SYS_perf_event_open,
            &mut attr as *mut PerfEventAttr,
            pid as libc::pid_t,
            cpu as libc::c_int,
            group_fd.unwrap_or(-1) as libc::c_int,
            PERF_FLAG_FD_CLOEXEC | flags,
        )
    };
    if fd < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: the syscall returned a fresh file descriptor that nothing else owns.
    Ok(unsafe { OwnedFd::from_raw_fd(fd as RawFd) })
}

fn ioctl(fd: &OwnedFd, request: libc::c_ulong, arg: libc::c_ulong) -> io::Result<()> {
    // SAFETY: perf event ioctls with integer arguments; `fd` is a live perf event descriptor.
    let rc = unsafe { libc::ioctl(fd.as_raw_fd(), request as _, arg) };
    if rc < 0 {
        Err(io::Error::last_os_error())
    } else {
        Ok(())
    }
}

pub fn enable(fd: &OwnedFd) -> io::Result<()> {
    ioctl(fd, PERF_EVENT_IOC_ENABLE, 0)
}

pub fn disable(fd: &OwnedFd) -> io::Result<()> {
    ioctl(fd, PERF_EVENT_IOC_DISABLE, 0)
}

/// Sends the records of `fd` to the ring buffer of `target` (same CPU).
pub fn set_output(fd: &OwnedFd, target: &OwnedFd) -> io::Result<()> {
    ioctl(
        fd,
        PERF_EVENT_IOC_SET_OUTPUT,
        target.as_raw_fd() as libc::c_ulong,
    )
}

/// The id the kernel gave event `fd` (what PERF_SAMPLE_IDENTIFIER says in its samples, and
/// in those of the copies inherited by new threads).
pub fn event_id(fd: &OwnedFd) -> io::Result<u64> {
    let mut id = 0u64;
    // SAFETY: PERF_EVENT_IOC_ID writes one u64 through the pointer, which points at `id`.
    let rc = unsafe { libc::ioctl(fd.as_raw_fd(), PERF_EVENT_IOC_ID as _, &mut id as *mut u64) };
    if rc < 0 {
        Err(io::Error::last_os_error())
    } else {
        Ok(id)
    }
}

/// A mapped perf ring buffer: one metadata page followed by `2^n` data pages.
pub struct RingMap {
    base: *mut u8,
    len: usize,
    data_offset: usize,
    data_size: usize,
}

// SAFETY: the mapping is owned by this value and only accessed through `&mut self` methods.
unsafe impl Send for RingMap {}

const DATA_HEAD_OFFSET: usize = 1024;
const DATA_TAIL_OFFSET: usize = 1032;
const DATA_OFFSET_OFFSET: usize = 1040;
const DATA_SIZE_OFFSET: usize = 1048;

impl RingMap {
    pub fn new(fd: &OwnedFd, data_pages: usize) -> io::Result<RingMap> {
        let page = page_size();
        let len = page * (data_pages + 1);
        // SAFETY: a fresh shared mapping of a perf fd; the kernel defines its layout and we
        // unmap it in Drop.
        let base = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                len,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_SHARED,
                fd.as_raw_fd(),
                0,
            )
        };
        if base == libc::MAP_FAILED {
            return Err(io::Error::last_os_error());
        }
        let base = base as *mut u8;
        // SAFETY: the first page is the perf_event_mmap_page; these u64 fields are in bounds.
        let (data_offset, data_size) = unsafe {
            (
                std::ptr::read_volatile(base.add(DATA_OFFSET_OFFSET) as *const u64) as usize,
                std::ptr::read_volatile(base.add(DATA_SIZE_OFFSET) as *const u64) as usize,
            )
        };
        let (data_offset, data_size) = if data_size == 0 {
            (page, len - page) // kernels before 4.1 leave these zero
        } else {
            (data_offset, data_size)
        };
        Ok(RingMap {
            base,
            len,
            data_offset,
            data_size,
        })
    }

    fn head_tail(&self) -> (&AtomicU64, &AtomicU64) {
        // SAFETY: data_head and data_tail are naturally aligned u64 fields of the metadata page,
        // shared with the kernel; atomics give the ordering the perf ABI asks for.
        unsafe {
            (
                &*(self.base.add(DATA_HEAD_OFFSET) as *const AtomicU64),
                &*(self.base.add(DATA_TAIL_OFFSET) as *const AtomicU64),
            )
        }
    }

    /// Copies every complete record written since the last call into `out` (each record's
    /// bytes, header included, contiguous even where the ring wrapped) and releases the space.
    pub fn drain(&mut self, out: &mut Vec<u8>) -> usize {
        let (head_a, tail_a) = self.head_tail();
        let head = head_a.load(Ordering::Acquire);
        let tail = tail_a.load(Ordering::Relaxed);
        if head == tail {
            return 0;
        }
        let size = self.data_size as u64;
        let avail = (head - tail) as usize;
        // SAFETY: the data area is `data_size` bytes at `data_offset`, inside the mapping.
        let data =
            unsafe { std::slice::from_raw_parts(self.base.add(self.data_offset), self.data_size) };
        let start = (tail % size) as usize;
        let first = avail.min(self.data_size - start);
        out.extend_from_slice(&data[start..start + first]);
        out.extend_from_slice(&data[..avail - first]);
        tail_a.store(head, Ordering::Release);
        avail
    }
}

impl RingMap {
    /// Like [`RingMap::drain`], but each sample keeps only the used part of its user stack
    /// copy ([`crate::stack_cut`]): the rest, most of a 32 KiB copy for a shallow stack, is
    /// never copied. Returns the bytes released from the ring.
    pub fn drain_cut(&mut self, out: &mut Vec<u8>, layout: crate::Layout) -> usize {
        let (head_a, tail_a) = self.head_tail();
        let head = head_a.load(Ordering::Acquire);
        let tail = tail_a.load(Ordering::Relaxed);
        if head == tail {
            return 0;
        }
        // SAFETY: the data area is `data_size` bytes at `data_offset`, inside the mapping.
        let data =
            unsafe { std::slice::from_raw_parts(self.base.add(self.data_offset), self.data_size) };
        let size = self.data_size;
        // Copies `len` bytes from ring position `from`, across the wrap.
        let copy = |out: &mut Vec<u8>, from: u64, len: usize| {
            let start = (from % size as u64) as usize;
            let first = len.min(size - start);
            out.extend_from_slice(&data[start..start + first]);
            out.extend_from_slice(&data[..len - first]);
        };
        let read = |from: u64| -> u64 {
            let mut b = [0u8; 8];
            for (i, byte) in b.iter_mut().enumerate() {
                *byte = data[((from + i as u64) % size as u64) as usize];
            }
            u64::from_ne_bytes(b)
        };
        let avail = head - tail;
        let mut pos = tail;
        while pos < head {
            let header = read(pos).to_ne_bytes();
            let ty = u32::from_ne_bytes([header[0], header[1], header[2], header[3]]);
            let len = u16::from_ne_bytes([header[6], header[7]]) as usize;
            if len < 8 || pos + len as u64 > head {
                // Not a record boundary: hand the rest over as it is, for the parser to
                // count as malformed.
                copy(out, pos, (head - pos) as usize);
                break;
            }
            let cut = (ty == crate::record::PERF_RECORD_SAMPLE)
                .then(|| {
                    crate::stack_cut(
                        len,
                        |at| (at + 8 <= len).then(|| read(pos + at as u64)),
                        layout,
                    )
                })
                .flatten();
            match cut {
                Some((size_at, _, used)) => {
                    let kept = crate::cut_size(used);
                    let start = out.len();
                    copy(out, pos, size_at);
                    // The new length fits in the u16: it is shorter than the old one.
                    let new_len = (size_at + 8 + kept + 8) as u16;
                    out[start + 6..start + 8].copy_from_slice(&new_len.to_ne_bytes());
                    out.extend_from_slice(&(kept as u64).to_ne_bytes());
                    copy(out, pos + size_at as u64 + 8, used);
                    out.resize(out.len() + (kept - used), 0);
                    out.extend_from_slice(&(used as u64).to_ne_bytes());
                }
                None => copy(out, pos, len),
            }
            pos += len as u64;
        }
        tail_a.store(head, Ordering::Release);
        avail as usize
    }
}

impl Drop for RingMap {
    fn drop(&mut self) {
        // SAFETY: unmapping exactly the region mapped in `new`.
        unsafe {
            libc::munmap(self.base as *mut libc::c_void, self.len);
        }
    }
}

pub use superprof_unwind::page_size;

/// Waits until one of `fds` is readable or `timeout_ms` passes. Returns the indexes of the fds
/// that reported a hang-up (their task exited).
pub fn poll_fds(fds: &[RawFd], timeout_ms: i32) -> io::Result<Vec<usize>> {
    let mut pfds: Vec<libc::pollfd> = fds
        .iter()
        .map(|&fd| libc::pollfd {
            fd,
            events: libc::POLLIN,
            revents: 0,
        })
        .collect();
    // SAFETY: `pfds` is a valid array of pollfd of the length we pass.
    let rc = unsafe { libc::poll(pfds.as_mut_ptr(), pfds.len() as libc::nfds_t, timeout_ms) };
    if rc < 0 {
        let e = io::Error::last_os_error();
        if e.kind() == io::ErrorKind::Interrupted {
            return Ok(Vec::new());
        }
        return Err(e);
    }
    Ok(pfds
        .iter()
        .enumerate()
        .filter(|(_, p)| p.revents & libc::POLLHUP != 0)
        .map(|(i, _)| i)
        .collect())
}

pub use superprof_unwind::monotonic_ns;

/// This process's effective user id.
pub fn euid() -> u32 {
    // SAFETY: geteuid has no arguments and cannot fail.
    unsafe { libc::geteuid() }
}

/// The calling thread's CPU time (CLOCK_THREAD_CPUTIME_ID) in nanoseconds.
pub fn thread_cpu_ns() -> u64 {
    superprof_unwind::clock_ns(libc::CLOCK_THREAD_CPUTIME_ID)
}

/// Reads a perf counter's value block (value, time enabled, time running...).
pub fn read_u64s(fd: &OwnedFd, buf: &mut [u64]) -> io::Result<()> {
    let want = std::mem::size_of_val(buf);
    // SAFETY: reading at most `want` bytes into `buf`, which is exactly that large.
    let n = unsafe { libc::read(fd.as_raw_fd(), buf.as_mut_ptr() as *mut libc::c_void, want) };
    if n == want as isize {
        Ok(())
    } else {
        Err(io::Error::last_os_error())
    }
}

/// Raises the calling thread's scheduling priority to nice `nice` (negative: sooner), where
/// allowed (root, or CAP_SYS_NICE); false where not, and nothing changes.
pub fn raise_thread_priority(nice: i32) -> bool {
    // SAFETY: gettid and setpriority take plain integers; on Linux PRIO_PROCESS with a thread
    // id sets that one thread's nice value.
    unsafe {
        let tid = libc::syscall(libc::SYS_gettid) as libc::id_t;
        libc::setpriority(libc::PRIO_PROCESS, tid, nice) == 0
    }
}

/// The kernel's vDSO as mapped into superprof itself. Every local process gets the same image
/// from the same kernel, so this copy serves to unwind and symbolize their `[vdso]` frames.
pub fn vdso_image() -> Option<Vec<u8>> {
    let maps = std::fs::read_to_string("/proc/self/maps").ok()?;
    let line = maps.lines().find(|l| l.trim_end().ends_with("[vdso]"))?;
    let (a, b) = line.split_whitespace().next()?.split_once('-')?;
    let (a, b) = (
        u64::from_str_radix(a, 16).ok()?,
        u64::from_str_radix(b, 16).ok()?,
    );
    // SAFETY: the range comes from our own maps and the vDSO stays mapped, readable, for the
    // life of the process; we copy it out at once.
    let bytes = unsafe { std::slice::from_raw_parts(a as *const u8, b.checked_sub(a)? as usize) };
    Some(bytes.to_vec())
}

/// Raises the soft limit on open files to the hard limit: attaching opens one perf event per
/// thread and CPU, which passes the usual 1024 soon on a many-threaded process.
pub fn raise_fd_limit() {
    let mut lim = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: get/setrlimit with a valid rlimit struct.
    unsafe {
        if libc::getrlimit(libc::RLIMIT_NOFILE, &mut lim) == 0 && lim.rlim_cur < lim.rlim_max {
            lim.rlim_cur = lim.rlim_max;
            libc::setrlimit(libc::RLIMIT_NOFILE, &lim);
        }
    }
}

/// Whether this process has CAP_IPC_LOCK in its effective set (/proc/self/status's CapEff):
/// what lifts perf_event_mlock_kb's limit on the rings (root has it, but not every root: a
/// container may grant CAP_PERFMON alone).
pub fn has_ipc_lock() -> bool {
    const CAP_IPC_LOCK: u32 = 14;
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines()
                .find_map(|l| l.strip_prefix("CapEff:"))
                .and_then(|v| u64::from_str_radix(v.trim(), 16).ok())
        })
        .is_some_and(|caps| caps & (1 << CAP_IPC_LOCK) != 0)
}

/// Starts, on a thread of its own, what the kernel does once before the first per-task or
/// cgroup perf event of the machine: it switches its context-switch hooks on and waits out
/// an RCU grace period (6–20 ms here, a third of a cold `record -- true`), and keeps them on
/// for a second after the last such event closes. A disabled dummy event on this thread,
/// opened and closed, starts that wait now, so that it overlaps what comes before the real
/// events (the cgroup, the command's fork): their open then waits only for the rest. Costs
/// nothing where the hooks are on already; where perf_event_open is refused, the refusal is
/// ignored (the real open reports it).
pub fn warm_up_task_events() {
    let attr = PerfEventAttr {
        type_: PERF_TYPE_SOFTWARE,
        config: PERF_COUNT_SW_DUMMY,
        flags: FLAG_DISABLED | FLAG_EXCLUDE_KERNEL | FLAG_EXCLUDE_HV,
        ..Default::default()
    };
    let _ = std::thread::Builder::new()
        .name("superprof-warm".into())
        .spawn(move || drop(perf_event_open(&attr, 0, -1)));
}
