//! The instruction sets superprof knows: one [`Arch`] for the decoders (superprof-analyze),
//! the unwinders (a guest's, here), the system call tables (superprof-trace) and the guests
//! QEMU runs (superprof-qemu).

/// An instruction set.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Arch {
    /// x86-64: instructions of 1 to 15 bytes; the return address is on the stack, rbp is the
    /// frame pointer.
    X86_64,
    /// AArch64 (A64): instructions of 4 bytes; the return address is in x30 (lr), x29 is the
    /// frame pointer.
    Aarch64,
}

impl Arch {
    /// The architecture superprof runs on.
    pub const HOST: Arch = if cfg!(target_arch = "aarch64") {
        Arch::Aarch64
    } else {
        Arch::X86_64
    };

    /// Its name in messages ("x86_64", "AArch64").
    pub fn name(self) -> &'static str {
        match self {
            Arch::X86_64 => "x86_64",
            Arch::Aarch64 => "AArch64",
        }
    }
}
