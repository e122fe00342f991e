//! superprof-unwind: modules, load bias and stack unwinding.
//!
//! Given the user registers of a sample and a way to read stack memory, this crate produces
//! the return addresses of the call stack with [framehop] (DWARF CFI from `.eh_frame`,
//! `.eh_frame_hdr` or `.debug_frame`; frame pointers where no CFI covers an address). It keeps,
//! per process, the executable mappings reported by the sampler and the ELF images behind them,
//! each parsed once per run ([`ElfCache`]): [`ProcessModules`] holds one address space's
//! mappings and unwinds its stacks ([`UserRegs`] in, [`UnwindOutcome`] out). A
//! [`GuestUnwinder`] does the same for a QEMU guest of either architecture, and [`maps`]
//! reads a live process's mappings and threads from /proc.
//!
//! It reads no memory of the target: callers hand in bytes (a copied stack, guest memory), which is
//! what lets the perf sampler, the ptrace sampler and the QEMU sampler share it.
//!
//! ```no_run
//! use superprof_unwind::{ElfCache, ProcessModules, UserRegs};
//! let mut elves = ElfCache::default();
//! let mut process = ProcessModules::default();
//! process.add_mapping(&mut elves, 0x5555_5555_4000, 0x1000, 0x1000, "/usr/bin/true".as_ref());
//! let regs = UserRegs { pc: 0x5555_5555_4100, sp: 0x7ffe_0000_0000, fp: 0, lr: 0 };
//! let mut frames = Vec::new();
//! let outcome = process.unwind(&regs, &[0u8; 64], &mut frames);
//! # let _ = outcome;
//! ```

#![deny(missing_docs)]

mod arch;
mod elf;
mod guest;
pub mod maps;
mod process;
mod regs;
mod sys;

pub use arch::Arch;
pub use elf::{drop_omitted_lsda, jit_module, ElfCache, ElfImage, ModuleId, SectionBytes};
pub use framehop::FrameAddress;
pub use guest::{frame_parts, GuestUnwinder};
pub use process::{Mapping, ProcessModules, Truncation, UnwindOutcome};
pub use regs::UserRegs;
pub use sys::{clock_ns, map_file, monotonic_ns, open_input, page_size, terminal_size};

/// Writes one line to stderr, like `eprintln!`, but never fails: std's `eprintln!` panics when
/// stderr is a pipe whose reader is gone (`superprof ... 2>&1 | head -1`), and a diagnostic that
/// nobody can read must not end a run, change the profiled command's exit status or, in
/// libsuperprof, harm the program it runs in. (`eprintln!` is a disallowed macro: clippy.toml.)
#[macro_export]
macro_rules! say {
    ($($arg:tt)*) => {{
        use ::std::io::Write as _;
        let _ = ::std::writeln!(::std::io::stderr(), $($arg)*);
    }};
}

/// The value of the tests' switch `name` (SUPERPROF_TEST_*), when set: only in a build with
/// the `test-switches` feature (scripts/test's, through the binary's feature of that name); a
/// build people run ignores them.
pub fn test_switch(name: &str) -> Option<String> {
    if !cfg!(feature = "test-switches") {
        return None;
    }
    std::env::var(name).ok()
}

/// An error and its causes (its `source` chain) on one line, each cause said once: a cause
/// whose text an earlier part already holds is left out.
pub fn one_line(e: &(dyn std::error::Error + 'static)) -> String {
    let mut parts: Vec<String> = Vec::new();
    let mut cause = Some(e);
    while let Some(c) = cause {
        let s = c.to_string();
        if !parts.iter().any(|p| p.contains(&s)) {
            parts.push(s);
        }
        cause = c.source();
    }
    parts.join(": ").replace('\n', " ")
}
