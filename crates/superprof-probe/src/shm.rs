//! Memory shared with a traced program (the in-process engine's counters and record ring):
//! the one unsafe module of this crate.

/// Memory shared with a traced program (a memfd it mapped, opened here through
/// /proc/PID/fd), read as 8-byte words: readable while it runs, and after it is gone.
pub struct SharedMemory {
    ptr: *const u64,
    words: usize,
    /// The memfd, kept to free its pages at the end ([`SharedMemory::release`]).
    file: std::fs::File,
}

impl SharedMemory {
    /// Maps the first `len` bytes (a multiple of 8) of the memfd at `path`.
    pub fn open(path: &std::path::Path, len: usize) -> std::io::Result<SharedMemory> {
        use std::os::fd::AsRawFd;
        let file = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .open(path)?;
        if len == 0 || !len.is_multiple_of(8) || file.metadata()?.len() < len as u64 {
            return Err(std::io::Error::other(
                "the shared file is shorter than asked",
            ));
        }
        // SAFETY: a fresh shared mapping of `len` bytes of an open file (checked long enough);
        // the result is checked against MAP_FAILED. Writable for `set_word` only.
        let ptr = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                len,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_SHARED,
                file.as_raw_fd(),
                0,
            )
        };
        if ptr == libc::MAP_FAILED {
            return Err(std::io::Error::last_os_error());
        }
        Ok(SharedMemory {
            ptr: ptr.cast(),
            words: len / 8,
            file,
        })
    }

    /// Frees the memory's pages (the program that shares it keeps a mapping, which a late write
    /// would simply fill again): what an attached program is left holding after superprof.
    pub fn release(&self) {
        use std::os::fd::AsRawFd;
        let len = (self.words * 8) as libc::off_t;
        // SAFETY: fallocate on our own descriptor of the memfd; no memory is touched.
        unsafe {
            libc::fallocate(
                self.file.as_raw_fd(),
                libc::FALLOC_FL_PUNCH_HOLE | libc::FALLOC_FL_KEEP_SIZE,
                0,
                len,
            )
        };
    }

    /// The 8-byte word `i` (0 beyond the end).
    pub fn word(&self, i: usize) -> u64 {
        if i >= self.words {
            return 0;
        }
        // SAFETY: `i` < words, inside the mapping, 8-byte aligned (page-aligned start); the
        // program writes it concurrently, hence an atomic read of a whole word, with acquire
        // ordering: a record's fields are read after its commit word and before its second
        // read (AArch64 reorders loads).
        let word = unsafe { &*(self.ptr.add(i) as *const std::sync::atomic::AtomicU64) };
        word.load(std::sync::atomic::Ordering::Acquire)
    }

    /// Sets the 8-byte word `i` (nothing beyond the end), with release ordering: what was read
    /// before is done with when the program sees it.
    pub fn set_word(&self, i: usize, value: u64) {
        if i >= self.words {
            return;
        }
        // SAFETY: as in `word`: inside the mapping, aligned, shared with the program, written
        // atomically.
        let word = unsafe { &*(self.ptr.add(i) as *const std::sync::atomic::AtomicU64) };
        word.store(value, std::sync::atomic::Ordering::Release);
    }
}

impl Drop for SharedMemory {
    fn drop(&mut self) {
        // SAFETY: the mapping made in `open`, of this length, unmapped once.
        unsafe { libc::munmap(self.ptr as *mut libc::c_void, self.words * 8) };
    }
}
