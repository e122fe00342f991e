/// The registers unwinding needs, in the target's own terms.
///
/// On x86_64 `fp` is rbp and `lr` is unused; on AArch64 `fp` is x29 and `lr` is x30.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct UserRegs {
    /// The program counter (rip, pc): the address of the instruction interrupted.
    pub pc: u64,
    /// The stack pointer (rsp, sp).
    pub sp: u64,
    /// The frame pointer (rbp, x29); 0 where unknown.
    pub fp: u64,
    /// The link register (x30) on AArch64; 0 on x86_64 and where unknown.
    pub lr: u64,
}

impl UserRegs {
    /// A thread's pc and stack pointer alone (read without stopping it: the other registers
    /// unknown, 0).
    pub fn at(pc: u64, sp: u64) -> UserRegs {
        UserRegs {
            pc,
            sp,
            fp: 0,
            lr: 0,
        }
    }

    /// `sample_regs_user` mask for the registers above (`perf_regs.h` of this architecture).
    #[cfg(target_arch = "x86_64")]
    pub const PERF_REGS_MASK: u64 = (1 << 6) | (1 << 7) | (1 << 8); // bp, sp, ip
    /// `sample_regs_user` mask for the registers above (`perf_regs.h` of this architecture).
    #[cfg(target_arch = "aarch64")]
    pub const PERF_REGS_MASK: u64 = (1 << 29) | (1 << 30) | (1 << 31) | (1 << 32); // fp lr sp pc

    /// Builds the registers from a perf sample's register block, in mask bit order.
    #[cfg(target_arch = "x86_64")]
    pub fn from_perf_regs(r: &[u64]) -> UserRegs {
        let get = |i: usize| r.get(i).copied().unwrap_or(0);
        UserRegs {
            fp: get(0),
            sp: get(1),
            pc: get(2),
            lr: 0,
        }
    }

    /// Builds the registers from a perf sample's register block, in mask bit order.
    #[cfg(target_arch = "aarch64")]
    pub fn from_perf_regs(r: &[u64]) -> UserRegs {
        let get = |i: usize| r.get(i).copied().unwrap_or(0);
        UserRegs {
            fp: get(0),
            lr: get(1),
            sp: get(2),
            pc: get(3),
        }
    }
}
