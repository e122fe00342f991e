//! Syscall names per architecture (the tables in syscall_tables.rs): the syscall log's and
//! the ptrace sampler's (a wait named after its call), in a module of their own.

pub use superprof_unwind::Arch;

/// The name of syscall `nr` of `arch`; `syscall_NR` for a number with no name.
pub fn name_for(arch: Arch, nr: u64) -> String {
    known_name_for(arch, nr).map_or_else(|| format!("syscall_{nr}"), str::to_owned)
}

/// The name of syscall `nr` of `arch`, if it has one (no allocation).
pub fn known_name_for(arch: Arch, nr: u64) -> Option<&'static str> {
    let table: &[&str] = match arch {
        Arch::X86_64 => &crate::syscall_tables::X86_64,
        Arch::Aarch64 => &crate::syscall_tables::AARCH64,
    };
    table.get(nr as usize).copied().filter(|n| !n.is_empty())
}

/// The name of syscall `nr` of the ABI that PTRACE_GET_SYSCALL_INFO reports (AUDIT_ARCH_*).
/// A 32-bit call (ia32 `int 0x80`) has no table here: `ia32:syscall_NR`.
pub fn name_for_audit_arch(audit_arch: u32, nr: u64) -> String {
    const AUDIT_ARCH_X86_64: u32 = 0xc000_003e;
    const AUDIT_ARCH_AARCH64: u32 = 0xc000_00b7;
    match audit_arch {
        AUDIT_ARCH_X86_64 => name_for(Arch::X86_64, nr),
        AUDIT_ARCH_AARCH64 => name_for(Arch::Aarch64, nr),
        0x4000_0003 => format!("ia32:syscall_{nr}"),
        _ => name(nr),
    }
}

/// The name of syscall `nr` on the architecture superprof runs on.
pub fn name(nr: u64) -> String {
    name_for(Arch::HOST, nr)
}
