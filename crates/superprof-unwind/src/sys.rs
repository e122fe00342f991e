//! The unsafe operations of this crate: file mapping, the clock samples are stamped with, the
//! page size, and a terminal's size.

use std::path::Path;

/// Opens an input file to read: a regular file only (a FIFO or a device named where a file is
/// expected would block in open, or never end), opened with O_NONBLOCK so that even the open
/// cannot wait.
pub fn open_input(path: &Path) -> std::io::Result<std::fs::File> {
    use std::os::unix::fs::OpenOptionsExt;
    let file = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NOCTTY | libc::O_NONBLOCK)
        .open(path)?;
    if !file.metadata()?.is_file() {
        return Err(std::io::Error::new(
            std::io::ErrorKind::InvalidInput,
            "is not a regular file",
        ));
    }
    Ok(file)
}

/// Maps the regular file at `path` read-only, to be read without a copy.
pub fn map_file(path: &Path) -> std::io::Result<memmap2::Mmap> {
    let file = open_input(path)?;
    // SAFETY: the map is read-only and only read through bounds-checked slices. If another
    // process truncates the file while it is mapped, reads may fault (SIGBUS); profilers accept
    // this (as perf and samply do) for the speed of not copying whole binaries.
    unsafe { memmap2::Mmap::map(&file) }
}

/// The time of clock `clock` (CLOCK_MONOTONIC, CLOCK_THREAD_CPUTIME_ID...) in nanoseconds.
pub fn clock_ns(clock: libc::clockid_t) -> u64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: `ts` is a valid out-pointer.
    unsafe { libc::clock_gettime(clock, &mut ts) };
    ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64
}

/// CLOCK_MONOTONIC in nanoseconds: the clock every sampler stamps its samples with (the perf
/// sampler asks the kernel for it; the ptrace sampler and the syscall log read it), so that
/// their times compare.
pub fn monotonic_ns() -> u64 {
    clock_ns(libc::CLOCK_MONOTONIC)
}

/// The size of a page of memory (shared by the crates that map memory, here and in traced
/// processes).
pub fn page_size() -> usize {
    // SAFETY: sysconf has no preconditions.
    let p = unsafe { libc::sysconf(libc::_SC_PAGESIZE) };
    if p > 0 {
        p as usize
    } else {
        4096
    }
}

/// The size of the terminal `fd` is, as (rows, columns), if it is a terminal that knows it.
pub fn terminal_size(fd: std::os::fd::BorrowedFd) -> Option<(usize, usize)> {
    use std::os::fd::AsRawFd;
    // SAFETY: a winsize is plain integers; all zero is a valid value.
    let mut ws: libc::winsize = unsafe { std::mem::zeroed() };
    // SAFETY: TIOCGWINSZ writes one winsize into `ws`, which outlives the call; a descriptor
    // that is no terminal makes it fail (ENOTTY).
    let r = unsafe { libc::ioctl(fd.as_raw_fd(), libc::TIOCGWINSZ, &mut ws) };
    (r == 0 && ws.ws_row > 0 && ws.ws_col > 0)
        .then(|| (usize::from(ws.ws_row), usize::from(ws.ws_col)))
}
