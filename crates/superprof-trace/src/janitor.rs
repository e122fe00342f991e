//! The janitor: a small process that puts the original code back under our breakpoints if
//! superprof dies without doing it (SIGKILL, the OOM killer, a crash that skips Drop).
//!
//! ptrace cannot outlive its tracer, but an `int3` written into a process's code does: the
//! process would die of SIGTRAP at the next hit. So every breakpoint is also written into a
//! table in memory shared with a process forked for the purpose, which waits on a socket whose
//! only other end is superprof's. For each process with breakpoints superprof sends it an
//! open /proc/PID/mem (SCM_RIGHTS): that descriptor names the process's memory itself, so it
//! needs no ptrace rights of the janitor's own (Yama's ptrace_scope 1 lets only an ancestor
//! open it), and it cannot reach another process that reuses the pid or the image after an
//! exec. When superprof is gone, the janitor writes the original bytes of every breakpoint
//! still in the table through those descriptors (without one, through /proc/PID/mem if the
//! pid still has the same start time), then exits. When superprof ends normally the table is
//! empty by then and the janitor just exits.
//!
//! It must be quick about it: the kernel lets the tracer's stopped threads go as the tracer
//! thread dies, and one stopped at its exec runs through ld.so to the entry point's
//! breakpoint in well under a millisecond. The socket's end-of-file comes too late for that
//! (after the whole address space of superprof is torn down, and its last thread gone), so the
//! tracer thread also holds a robust, process-shared mutex in the shared memory for as long
//! as it lives: as that thread dies, before it releases its memory or its tracees, the kernel
//! marks the mutex "owner died" and wakes the janitor, which waits on it and on a count of
//! messages at once (futex_waitv). The janitor also scans only the part of the table ever
//! used.
//!
//! One window is left, and no ptrace tool closes it: a thread that has trapped (on a
//! breakpoint, or at the end of a single step) sits in a SIGTRAP stop until its tracer's wait
//! takes it; if the tracer dies before that, the kernel delivers the SIGTRAP as the thread is
//! let go, and its default action ends the process. The kernel shows such a stop as the
//! thread's `exit_code` (field 52 of /proc/PID/task/TID/stat: 5 until taken, then 0). superprof
//! waits for its stops at once, so the window is the time it takes to wake up, unless it is
//! itself stopped meanwhile (SIGSTOP, then SIGKILL). Making the program job-control stopped
//! while traced would park such threads instead, but it would also make its process group
//! one with a stopped job, which the kernel sends SIGHUP when superprof dies and leaves the
//! group orphaned (an interactive shell's job): worse than the window.
//!
//! The janitor is forked from a possibly multi-threaded process, so it only makes raw system
//! calls on memory prepared before the fork: no allocation, no locks.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU32, Ordering};

/// One breakpoint in the shared table. `len` is written last when an entry is filled and
/// first (to 0) when it is cleared, so the janitor never uses half an entry.
#[repr(C)]
#[derive(Clone, Copy)]
struct Entry {
    pid: u32,
    len: u32,
    addr: u64,
    /// The process's start time (field 22 of /proc/PID/stat), against pid reuse.
    start_time: u64,
    orig: [u8; 8],
}

/// Entries the table holds (2 MiB); breakpoints beyond it are not covered.
const CAPACITY: usize = 1 << 16;

/// The start of the shared memory, before the table.
#[repr(C)]
struct Header {
    /// Held by the thread that started the janitor (the tracer's) for as long as it lives:
    /// robust and process-shared, so that the kernel wakes the janitor when that thread dies.
    lock: libc::pthread_mutex_t,
    /// 1 when `lock` is held and its futex word is its first four bytes (glibc's layout,
    /// checked at start): the janitor then waits on it.
    robust: AtomicU32,
    /// Bumped, and woken, after each message to the janitor.
    mail: AtomicU32,
    /// Slots of the table ever filled: the janitor reads no further.
    used: AtomicU32,
}

/// The header's room: a page, so that the table stays aligned.
const HEADER: usize = 4096;
const _: () = assert!(std::mem::size_of::<Header>() <= HEADER);

/// The shared memory's size.
const SHARED: usize = HEADER + CAPACITY * std::mem::size_of::<Entry>();

/// The kernel's `struct futex_waitv`.
#[repr(C)]
struct FutexWaitv {
    val: u64,
    uaddr: u64,
    flags: u32,
    reserved: u32,
}

/// FUTEX2_SIZE_U32: a 32-bit futex, shared between processes (no FUTEX2_PRIVATE).
const FUTEX2_SIZE_U32: u32 = 2;
const FUTEX_WAITERS: u32 = 0x8000_0000;
const FUTEX_OWNER_DIED: u32 = 0x4000_0000;
const FUTEX_TID_MASK: u32 = 0x3fff_ffff;

/// Processes whose memory descriptor the janitor keeps (others: by path and start time); well
/// under the usual limit of 1024 open files.
const MAX_PROCESSES: usize = 512;

/// What a message to the janitor says about its pid.
#[derive(Clone, Copy)]
#[repr(u32)]
enum Message {
    /// Its /proc/PID/mem comes with the message.
    Memory = 1,
    /// It exited or exec'd: close its descriptor.
    Forget = 2,
}

pub struct Janitor {
    header: *mut Header,
    table: *mut Entry,
    /// Our end of the socket: the janitor sees end-of-file when superprof is gone.
    alive: Option<std::os::fd::OwnedFd>,
    /// Processes whose /proc/PID/mem the janitor holds.
    sent: std::collections::HashSet<u32>,
    pid: libc::pid_t,
    slots: HashMap<(u32, u64), usize>,
    free: Vec<usize>,
    next: usize,
    start_times: HashMap<u32, u64>,
}

impl Janitor {
    /// Forks the janitor. `None` if it cannot be started (then breakpoints are only removed
    /// by superprof itself).
    pub fn start() -> Option<Janitor> {
        // SAFETY: a fresh shared anonymous mapping; checked for MAP_FAILED below.
        let shared = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                SHARED,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_SHARED | libc::MAP_ANONYMOUS,
                -1,
                0,
            )
        };
        if shared == libc::MAP_FAILED {
            return None;
        }
        let header = shared as *mut Header;
        // SAFETY: the header lies at the start of the fresh mapping, zeroed, page-aligned.
        unsafe { hold_lock(header) };
        // SAFETY: HEADER < SHARED: the table starts inside the mapping.
        let table = unsafe { (shared as *mut u8).add(HEADER) } as *mut Entry;
        let mut fds = [0; 2];
        // SAFETY: `fds` is a valid out-array of two ints.
        if unsafe {
            libc::socketpair(
                libc::AF_UNIX,
                libc::SOCK_SEQPACKET | libc::SOCK_CLOEXEC,
                0,
                fds.as_mut_ptr(),
            )
        } != 0
        {
            // SAFETY: letting go of the lock taken above and unmapping the mapping.
            unsafe { release(header) };
            return None;
        }
        let (read_end, write_end) = (fds[0], fds[1]);
        // SAFETY: the child only makes raw system calls on memory prepared before the fork
        // (the shared memory, the socket) and leaves with _exit; see `watch`.
        let pid = unsafe { libc::fork() };
        if pid == 0 {
            // SAFETY: as above.
            unsafe { watch(read_end, write_end, header, table as *const Entry) };
        }
        // SAFETY: our copy of the read end is not needed; closing a descriptor we own.
        unsafe { libc::close(read_end) };
        if pid < 0 {
            // SAFETY: closing the write end, letting go of the lock, unmapping.
            unsafe {
                libc::close(write_end);
                release(header);
            }
            return None;
        }
        Some(Janitor {
            header,
            table,
            // SAFETY: socketpair gave us this descriptor; we now own it.
            alive: Some(unsafe { std::os::fd::FromRawFd::from_raw_fd(write_end) }),
            sent: std::collections::HashSet::new(),
            pid,
            slots: HashMap::new(),
            free: Vec::new(),
            next: 0,
            start_times: HashMap::new(),
        })
    }

    /// Records a breakpoint at `addr` of process `pid` over the bytes `orig`.
    pub fn add(&mut self, pid: u32, addr: u64, orig: &[u8]) {
        if orig.len() > 8 || self.slots.contains_key(&(pid, addr)) {
            return;
        }
        let Some(start_time) = self.start_time(pid) else {
            return;
        };
        if !self.sent.contains(&pid) && self.send_memory(pid) {
            self.sent.insert(pid);
        }
        let slot = match self.free.pop() {
            Some(s) => s,
            None if self.next < CAPACITY => {
                self.next += 1;
                // SAFETY: the header of our mapping; the janitor only reads `used`.
                unsafe {
                    (*self.header)
                        .used
                        .store(self.next as u32, Ordering::SeqCst)
                };
                self.next - 1
            }
            None => return,
        };
        let mut bytes = [0u8; 8];
        bytes[..orig.len()].copy_from_slice(orig);
        // SAFETY: `slot` < CAPACITY, inside the mapping; only this thread writes the table.
        unsafe {
            let e = self.table.add(slot);
            std::ptr::write_volatile(&mut (*e).pid, pid);
            std::ptr::write_volatile(&mut (*e).addr, addr);
            std::ptr::write_volatile(&mut (*e).start_time, start_time);
            std::ptr::write_volatile(&mut (*e).orig, bytes);
            std::sync::atomic::fence(std::sync::atomic::Ordering::SeqCst);
            std::ptr::write_volatile(&mut (*e).len, orig.len() as u32);
        }
        self.slots.insert((pid, addr), slot);
    }

    /// Forgets a breakpoint (its code is back, or gone with its process).
    pub fn remove(&mut self, pid: u32, addr: u64) {
        if let Some(slot) = self.slots.remove(&(pid, addr)) {
            // SAFETY: as in `add`.
            unsafe { std::ptr::write_volatile(&mut (*self.table.add(slot)).len, 0) };
            self.free.push(slot);
        }
    }

    /// Forgets a process that exited or exec'd (its pid may be reused).
    pub fn forget_process(&mut self, pid: u32) {
        self.start_times.remove(&pid);
        if self.sent.remove(&pid) {
            self.send(Message::Forget, pid, None);
        }
    }

    /// Hands the janitor an open /proc/PID/mem of `pid` (superprof, its tracer, may open it).
    /// Returns whether it went (else it is tried again with the next breakpoint).
    fn send_memory(&mut self, pid: u32) -> bool {
        use std::os::fd::AsRawFd;
        match std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .open(format!("/proc/{pid}/mem"))
        {
            Ok(mem) => self.send(Message::Memory, pid, Some(mem.as_raw_fd())),
            Err(_) => false,
        }
    }

    /// One message to the janitor: `op` and `pid`, and a descriptor with it. Returns whether
    /// the whole message went.
    fn send(&mut self, op: Message, pid: u32, fd: Option<i32>) -> bool {
        use std::os::fd::AsRawFd;
        let Some(sock) = self.alive.as_ref() else {
            return false;
        };
        let mut body = [0u8; 8];
        body[..4].copy_from_slice(&(op as u32).to_ne_bytes());
        body[4..].copy_from_slice(&pid.to_ne_bytes());
        let mut iov = libc::iovec {
            iov_base: body.as_mut_ptr() as *mut libc::c_void,
            iov_len: body.len(),
        };
        // Room for one descriptor, aligned as cmsghdr wants.
        let mut control = [0u64; 4];
        // SAFETY: a msghdr over our own buffers: one iovec of 8 bytes, and a control buffer
        // of 32 bytes, enough for CMSG_SPACE(4); the cmsg macros stay inside it.
        unsafe {
            let mut msg: libc::msghdr = std::mem::zeroed();
            msg.msg_iov = &mut iov;
            msg.msg_iovlen = 1;
            if let Some(fd) = fd {
                msg.msg_control = control.as_mut_ptr() as *mut libc::c_void;
                msg.msg_controllen = libc::CMSG_SPACE(4) as usize;
                let c = libc::CMSG_FIRSTHDR(&msg);
                (*c).cmsg_level = libc::SOL_SOCKET;
                (*c).cmsg_type = libc::SCM_RIGHTS;
                (*c).cmsg_len = libc::CMSG_LEN(4) as usize;
                std::ptr::write_unaligned(libc::CMSG_DATA(c) as *mut i32, fd);
            }
            let sent =
                libc::sendmsg(sock.as_raw_fd(), &msg, libc::MSG_NOSIGNAL) == body.len() as isize;
            // The janitor may be waiting on the lock and the mail, not on the socket.
            let mail = &(*self.header).mail;
            mail.fetch_add(1, Ordering::SeqCst);
            libc::syscall(libc::SYS_futex, mail.as_ptr(), libc::FUTEX_WAKE, 1);
            sent
        }
    }

    fn start_time(&mut self, pid: u32) -> Option<u64> {
        if let Some(&t) = self.start_times.get(&pid) {
            return Some(t);
        }
        let stat = std::fs::read(format!("/proc/{pid}/stat")).ok()?;
        let t = parse_start_time(&stat)?;
        self.start_times.insert(pid, t);
        Some(t)
    }
}

impl Drop for Janitor {
    fn drop(&mut self) {
        // Closing our end lets the janitor exit (at once: the table is empty when superprof
        // ends normally); it is reaped here, or by init once superprof is gone.
        drop(self.alive.take());
        // It may be asleep on the lock and the mail, not on the socket: wake it to see the
        // socket closed (else each run waited the 100 ms below for nothing).
        // SAFETY: the header stays mapped until `release` below.
        unsafe {
            let mail = &(*self.header).mail;
            mail.fetch_add(1, Ordering::SeqCst);
            libc::syscall(libc::SYS_futex, mail.as_ptr(), libc::FUTEX_WAKE, 1);
        }
        for _ in 0..50 {
            // Ended (or reaped already): not running.
            if !matches!(crate::posix::waitpid(self.pid as u32, true), Ok(None)) {
                break;
            }
            std::thread::sleep(std::time::Duration::from_millis(2));
        }
        // SAFETY: the lock and the mapping of `start`; nothing uses them any more.
        unsafe { release(self.header) };
    }
}

/// Makes `header.lock` a robust, process-shared mutex and takes it for the calling thread;
/// sets `header.robust` if the janitor can wait on it.
///
/// # Safety
/// `header` points to a zeroed header in shared memory that nothing else uses yet.
unsafe fn hold_lock(header: *mut Header) {
    let lock = std::ptr::addr_of_mut!((*header).lock);
    let mut attr: libc::pthread_mutexattr_t = std::mem::zeroed();
    if libc::pthread_mutexattr_init(&mut attr) != 0 {
        return;
    }
    let ok = libc::pthread_mutexattr_setpshared(&mut attr, libc::PTHREAD_PROCESS_SHARED) == 0
        && libc::pthread_mutexattr_setrobust(&mut attr, libc::PTHREAD_MUTEX_ROBUST) == 0
        && libc::pthread_mutex_init(lock, &attr) == 0;
    libc::pthread_mutexattr_destroy(&mut attr);
    if !ok || libc::pthread_mutex_lock(lock) != 0 {
        return;
    }
    // The futex word the kernel marks when this thread dies is the one the janitor watches
    // only if it holds this thread's id: glibc's layout (its first four bytes).
    let word = &*(lock as *const AtomicU32);
    if word.load(Ordering::SeqCst) & FUTEX_TID_MASK == libc::gettid() as u32 {
        (*header).robust.store(1, Ordering::SeqCst);
    } else {
        libc::pthread_mutex_unlock(lock);
    }
}

/// Lets go of the lock (if held) and unmaps the shared memory; left mapped if the lock cannot
/// be let go (it is on the thread's robust list, which must not point into unmapped memory).
///
/// # Safety
/// `header` is the start of the mapping of [`Janitor::start`], used by nothing else now,
/// called on the thread that took the lock.
unsafe fn release(header: *mut Header) {
    if (*header).robust.load(Ordering::SeqCst) == 1
        && libc::pthread_mutex_unlock(std::ptr::addr_of_mut!((*header).lock)) != 0
    {
        return;
    }
    libc::munmap(header as *mut libc::c_void, SHARED);
}

/// Field 22 of /proc/PID/stat (the start time), read without allocating: the fields after
/// the command name, which ends at the last ')'.
fn parse_start_time(stat: &[u8]) -> Option<u64> {
    let close = stat.iter().rposition(|&b| b == b')')?;
    let rest = stat.get(close + 2..)?;
    // After ") " come state (field 3) .. starttime (field 22): skip 19 fields.
    let field = rest.split(|&b| b == b' ').nth(19)?;
    let mut v: u64 = 0;
    if field.is_empty() {
        return None;
    }
    for &b in field {
        if !b.is_ascii_digit() {
            return None;
        }
        v = v.checked_mul(10)?.checked_add(u64::from(b - b'0'))?;
    }
    Some(v)
}

/// Writes "/proc/<pid>/<name>\0" into `buf`; returns false if it does not fit.
fn proc_path(buf: &mut [u8; 40], pid: u32, name: &[u8]) -> bool {
    let mut digits = [0u8; 10];
    let mut n = pid;
    let mut len = 0;
    loop {
        digits[len] = b'0' + (n % 10) as u8;
        len += 1;
        n /= 10;
        if n == 0 {
            break;
        }
    }
    let total = 6 + len + 1 + name.len() + 1;
    if total > buf.len() {
        return false;
    }
    buf[..6].copy_from_slice(b"/proc/");
    for i in 0..len {
        buf[6 + i] = digits[len - 1 - i];
    }
    buf[6 + len] = b'/';
    buf[7 + len..7 + len + name.len()].copy_from_slice(name);
    buf[7 + len + name.len()] = 0;
    true
}

/// What one look at the socket gave.
enum Mail {
    /// A message, handled.
    One,
    /// Nothing there now (only without waiting).
    Empty,
    /// Superprof's end is closed.
    Gone,
}

/// Receives one message from superprof on descriptor 0 (waiting for it unless `flags` has
/// MSG_DONTWAIT) and keeps or drops the descriptor it brings in `mems`.
///
/// # Safety
/// In the janitor only: raw system calls on its own buffers.
unsafe fn receive(mems: &mut [(u32, i32); MAX_PROCESSES], flags: i32) -> Mail {
    let mut body = [0u8; 8];
    let mut iov = libc::iovec {
        iov_base: body.as_mut_ptr() as *mut libc::c_void,
        iov_len: body.len(),
    };
    let mut control = [0u64; 4];
    let mut msg: libc::msghdr = std::mem::zeroed();
    msg.msg_iov = &mut iov;
    msg.msg_iovlen = 1;
    msg.msg_control = control.as_mut_ptr() as *mut libc::c_void;
    msg.msg_controllen = std::mem::size_of_val(&control);
    let n = libc::recvmsg(0, &mut msg, libc::MSG_CMSG_CLOEXEC | flags);
    if n < 0 {
        return match *libc::__errno_location() {
            libc::EINTR => Mail::One, // look again
            libc::EAGAIN => Mail::Empty,
            _ => Mail::Gone,
        };
    }
    if n == 0 {
        return Mail::Gone;
    }
    let mut fd = -1;
    let c = libc::CMSG_FIRSTHDR(&msg);
    if !c.is_null()
        && (*c).cmsg_level == libc::SOL_SOCKET
        && (*c).cmsg_type == libc::SCM_RIGHTS
        && (*c).cmsg_len >= libc::CMSG_LEN(4) as usize
    {
        fd = std::ptr::read_unaligned(libc::CMSG_DATA(c) as *const i32);
    }
    let op = u32::from_ne_bytes([body[0], body[1], body[2], body[3]]);
    let pid = u32::from_ne_bytes([body[4], body[5], body[6], body[7]]);
    // A descriptor already held for the pid is replaced or closed either way.
    for m in mems.iter_mut() {
        if m.0 == pid && pid != 0 {
            libc::close(m.1);
            *m = (0, -1);
        }
    }
    if op == Message::Memory as u32 && fd >= 0 {
        match mems.iter_mut().find(|m| m.0 == 0) {
            Some(m) => *m = (pid, fd),
            None => {
                libc::close(fd);
            }
        }
    } else if fd >= 0 {
        libc::close(fd);
    }
    Mail::One
}

/// The janitor's life, in the forked child: wait for superprof to go, then put back the code
/// under every breakpoint left in the table.
///
/// (One function of 132 lines: the forked child's life, run once top to bottom: cut loose from
/// superprof, wait on the lock and the mail, then put the code back; the three share the `mems`
/// descriptors and the `header`.)
///
/// # Safety
/// Called once, in the child of fork, with the socket's ends and the shared memory.
unsafe fn watch(read_end: i32, write_end: i32, header: *const Header, table: *const Entry) -> ! {
    // A session of its own: `kill -- -PGID`, `timeout`, job control and the terminal's
    // signals reach superprof's process group, not the janitor. Named so that `ps` says what
    // it is, and `killall superprof` leaves it be.
    libc::setsid();
    libc::prctl(
        libc::PR_SET_NAME,
        c"superprof-jan".as_ptr() as libc::c_ulong,
        0,
        0,
        0,
    );
    // Ahead of ordinary tasks when it wakes, where allowed (root): it has microseconds to put
    // the code back before the threads that superprof's death lets go run into it, and the
    // dying superprof, on whose CPU the wake-up lands, tears down its memory meanwhile. (It
    // sleeps until then, and its work is bounded: the part of the table used.)
    let param = libc::sched_param { sched_priority: 1 };
    libc::sched_setscheduler(0, libc::SCHED_FIFO | libc::SCHED_RESET_ON_FORK, &param);
    // Our copy of the write end would keep the socket open forever; every other descriptor
    // (the terminal, superprof's output pipes, perf events) is superprof's, not ours.
    libc::close(write_end);
    libc::dup2(read_end, 0);
    libc::syscall(libc::SYS_close_range, 1u32, u32::MAX, 0u32);
    // Ctrl-C and the like reach the whole process group: they are superprof's to handle.
    for sig in [
        libc::SIGINT,
        libc::SIGQUIT,
        libc::SIGTERM,
        libc::SIGHUP,
        libc::SIGPIPE,
    ] {
        libc::signal(sig, libc::SIG_IGN);
    }
    // (pid, /proc/PID/mem) as superprof sends them; pid 0: a free place.
    let mut mems = [(0u32, -1i32); MAX_PROCESSES];
    let header = &*header;
    let word = &*(std::ptr::addr_of!(header.lock) as *const AtomicU32);
    // Without the lock (or futex_waitv), the socket's end-of-file is the sign.
    let mut robust = header.robust.load(Ordering::SeqCst) == 1;
    'life: loop {
        let mail = header.mail.load(Ordering::SeqCst);
        let flags = if robust { libc::MSG_DONTWAIT } else { 0 };
        loop {
            match receive(&mut mems, flags) {
                Mail::One => {}
                Mail::Empty => break,
                Mail::Gone => break 'life,
            }
        }
        let v = word.load(Ordering::SeqCst);
        if v & FUTEX_OWNER_DIED != 0 || v & FUTEX_TID_MASK == 0 {
            break; // the tracer thread died (or let go)
        }
        if v & FUTEX_WAITERS == 0 {
            // So that the kernel wakes us when it marks the lock.
            let _ = word.compare_exchange(v, v | FUTEX_WAITERS, Ordering::SeqCst, Ordering::SeqCst);
            continue;
        }
        let waits = [
            FutexWaitv {
                val: u64::from(v),
                uaddr: word.as_ptr() as u64,
                flags: FUTEX2_SIZE_U32,
                reserved: 0,
            },
            FutexWaitv {
                val: u64::from(mail),
                uaddr: header.mail.as_ptr() as u64,
                flags: FUTEX2_SIZE_U32,
                reserved: 0,
            },
        ];
        let rc = libc::syscall(
            libc::SYS_futex_waitv,
            waits.as_ptr(),
            2u32,
            0u32,
            std::ptr::null::<libc::timespec>(),
            libc::CLOCK_MONOTONIC,
        );
        if rc < 0 && *libc::__errno_location() == libc::ENOSYS {
            robust = false;
        }
    }
    let mut path = [0u8; 40];
    let mut stat = [0u8; 1024];
    let used = (header.used.load(Ordering::SeqCst) as usize).min(CAPACITY);
    for i in 0..used {
        let e = std::ptr::read_volatile(table.add(i));
        if e.len == 0 || e.len > 8 {
            continue;
        }
        if let Some(&(_, fd)) = mems.iter().find(|m| m.0 == e.pid && e.pid != 0) {
            // Its own memory, whoever has the pid now.
            libc::pwrite(
                fd,
                e.orig.as_ptr() as *const libc::c_void,
                e.len as usize,
                e.addr as libc::off_t,
            );
            continue;
        }
        // The same process still? (its pid may have been reused since)
        if !proc_path(&mut path, e.pid, b"stat") {
            continue;
        }
        let fd = libc::open(path.as_ptr() as *const libc::c_char, libc::O_RDONLY);
        if fd < 0 {
            continue;
        }
        let n = libc::read(fd, stat.as_mut_ptr() as *mut libc::c_void, stat.len());
        libc::close(fd);
        if n <= 0 || parse_start_time(&stat[..n as usize]) != Some(e.start_time) {
            continue;
        }
        if !proc_path(&mut path, e.pid, b"mem") {
            continue;
        }
        let fd = libc::open(path.as_ptr() as *const libc::c_char, libc::O_WRONLY);
        if fd < 0 {
            continue;
        }
        libc::pwrite(
            fd,
            e.orig.as_ptr() as *const libc::c_void,
            e.len as usize,
            e.addr as libc::off_t,
        );
        libc::close(fd);
    }
    libc::_exit(0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn start_time_is_field_22_whatever_the_name() {
        let stat =
            b"1234 (a) b) c) S 1 1234 1234 0 -1 4194560 100 0 0 0 5 3 0 0 20 0 1 0 987654 1000 10";
        assert_eq!(parse_start_time(stat), Some(987654));
        assert_eq!(parse_start_time(b"1 (x) S 0"), None);
        assert_eq!(parse_start_time(b"garbage"), None);
        let own = std::fs::read("/proc/self/stat").unwrap();
        assert!(parse_start_time(&own).is_some());
    }

    #[test]
    fn proc_paths_are_built_without_allocating() {
        let mut buf = [0u8; 40];
        assert!(proc_path(&mut buf, 4_294_967_295, b"mem"));
        assert_eq!(&buf[..22], b"/proc/4294967295/mem\0\0"[..22].as_ref());
        assert!(proc_path(&mut buf, 7, b"stat"));
        assert_eq!(&buf[..13], b"/proc/7/stat\0");
    }

    #[test]
    fn janitor_restores_the_code_when_superprof_is_gone() {
        // A child stands in for the profiled process; we "set a breakpoint" in its memory
        // by writing a byte, record it, then drop the janitor's pipe without removing it.
        let mut child = std::process::Command::new("sleep")
            .arg("5")
            .spawn()
            .unwrap();
        let pid = child.id();
        // Any writable address of the child will do: its stack's first page.
        let maps = std::fs::read_to_string(format!("/proc/{pid}/maps")).unwrap();
        let line = maps.lines().find(|l| l.ends_with("[stack]")).unwrap();
        let addr = u64::from_str_radix(line.split('-').next().unwrap(), 16).unwrap();
        let mut orig = [0u8; 1];
        assert_eq!(crate::sys::read_memory(pid, addr, &mut orig), 1);
        crate::sys::write_memory(pid, addr, &[orig[0] ^ 0xff]).unwrap();
        let mut j = Janitor::start().unwrap();
        j.add(pid, addr, &orig);
        // Spoil the start time: only the descriptor sent with the first breakpoint can do
        // the work now (as when Yama keeps the janitor from opening /proc/PID/mem itself).
        let slot = j.slots[&(pid, addr)];
        // SAFETY: a slot of the table `add` just filled; no other writer.
        unsafe { std::ptr::write_volatile(&mut (*j.table.add(slot)).start_time, 1) };
        drop(j); // as if superprof were gone with the breakpoint in place
        let mut now = [0u8; 1];
        crate::sys::read_memory(pid, addr, &mut now);
        let _ = child.kill();
        let _ = child.wait();
        assert_eq!(now, orig);
    }
}
