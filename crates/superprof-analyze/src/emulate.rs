//! "Where does this branch go?", worked out from the registers without running it (x86_64).
//!
//! A thread stopped on a breakpoint at a block's last instruction can be sent on without a
//! single step: the coordinator sets the pc (and pushes or pops the return address) itself.
//! That is one ptrace stop per block instead of two. Only plain near branches are done here
//! (a `jmp`/`call` through memory with an `fs:`/`gs:` override included: its address is
//! worked out from [`X86Regs::fs_base`]/[`X86Regs::gs_base`]); anything else (loop, jrcxz, far
//! branches, `ret imm16`, syscalls) is for stepping.

use iced_x86::{ConditionCode, FlowControl, MemorySize, Mnemonic, OpKind, Register};

/// The x86_64 registers a branch can read.
#[derive(Debug, Clone, Copy, Default)]
pub struct X86Regs {
    /// rax, rcx, rdx, rbx, rsp, rbp, rsi, rdi, r8..r15 (the encoding order).
    pub gpr: [u64; 16],
    /// The flags, for conditional branches (CF, PF, ZF, SF, OF).
    pub rflags: u64,
    /// The base address of the fs segment, for a `jmp`/`call` through an `fs:` operand.
    pub fs_base: u64,
    /// The base address of the gs segment, for a `jmp`/`call` through a `gs:` operand.
    pub gs_base: u64,
}

/// What a branch does.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Taken {
    /// The next pc.
    pub pc: u64,
    /// A call pushes this return address (rsp -= 8).
    pub push: Option<u64>,
    /// A return pops the next pc (rsp += 8).
    pub pop: bool,
}

const CF: u64 = 1 << 0;
const PF: u64 = 1 << 2;
const ZF: u64 = 1 << 6;
const SF: u64 = 1 << 7;
const OF: u64 = 1 << 11;

/// Whether condition `cc` holds for `rflags`.
pub fn condition_holds(cc: ConditionCode, rflags: u64) -> Option<bool> {
    let f = |bit: u64| rflags & bit != 0;
    Some(match cc {
        ConditionCode::o => f(OF),
        ConditionCode::no => !f(OF),
        ConditionCode::b => f(CF),
        ConditionCode::ae => !f(CF),
        ConditionCode::e => f(ZF),
        ConditionCode::ne => !f(ZF),
        ConditionCode::be => f(CF) || f(ZF),
        ConditionCode::a => !f(CF) && !f(ZF),
        ConditionCode::s => f(SF),
        ConditionCode::ns => !f(SF),
        ConditionCode::p => f(PF),
        ConditionCode::np => !f(PF),
        ConditionCode::l => f(SF) != f(OF),
        ConditionCode::ge => f(SF) == f(OF),
        ConditionCode::le => f(ZF) || f(SF) != f(OF),
        ConditionCode::g => !f(ZF) && f(SF) == f(OF),
        ConditionCode::None => return None,
    })
}

fn gpr64(regs: &X86Regs, r: Register) -> Option<u64> {
    if !r.is_gpr64() {
        return None;
    }
    Some(regs.gpr[r.number()])
}

/// Where the branch at the start of `code` (at `addr`) goes with these registers; `read_u64`
/// reads the traced program's memory. None when it is not a branch done here.
pub fn x86_branch(
    code: &[u8],
    addr: u64,
    regs: &X86Regs,
    read_u64: &mut dyn FnMut(u64) -> Option<u64>,
) -> Option<Taken> {
    let i = crate::x86::decode_one(code, addr)?;
    let next = i.next_ip();
    let target = |regs: &X86Regs, read_u64: &mut dyn FnMut(u64) -> Option<u64>| -> Option<u64> {
        match i.op0_kind() {
            OpKind::NearBranch64 => Some(i.near_branch_target()),
            OpKind::Register => gpr64(regs, i.op0_register()),
            OpKind::Memory
                if matches!(
                    i.memory_size(),
                    MemorySize::QwordOffset | MemorySize::UInt64
                ) =>
            {
                let va = i.virtual_address(0, 0, |r, _, _| match r {
                    Register::ES | Register::CS | Register::SS | Register::DS => Some(0),
                    Register::FS => Some(regs.fs_base),
                    Register::GS => Some(regs.gs_base),
                    r => gpr64(regs, r),
                })?;
                read_u64(va)
            }
            _ => None,
        }
    };
    match i.flow_control() {
        FlowControl::UnconditionalBranch | FlowControl::IndirectBranch
            if i.mnemonic() == Mnemonic::Jmp =>
        {
            Some(Taken {
                pc: target(regs, read_u64)?,
                push: None,
                pop: false,
            })
        }
        // jcc only: loop/loope/loopne and jrcxz/jecxz also count or test rcx.
        FlowControl::ConditionalBranch
            if !matches!(
                i.mnemonic(),
                Mnemonic::Jrcxz
                    | Mnemonic::Jecxz
                    | Mnemonic::Jcxz
                    | Mnemonic::Loop
                    | Mnemonic::Loope
                    | Mnemonic::Loopne
            ) =>
        {
            let taken = condition_holds(i.condition_code(), regs.rflags)?;
            Some(Taken {
                pc: if taken { i.near_branch_target() } else { next },
                push: None,
                pop: false,
            })
        }
        FlowControl::Call | FlowControl::IndirectCall if i.mnemonic() == Mnemonic::Call => {
            Some(Taken {
                pc: target(regs, read_u64)?,
                push: Some(next),
                pop: false,
            })
        }
        FlowControl::Return if i.mnemonic() == Mnemonic::Ret && i.op_count() == 0 => Some(Taken {
            pc: read_u64(regs.gpr[4])?,
            push: None,
            pop: true,
        }),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn regs() -> X86Regs {
        let mut r = X86Regs::default();
        r.gpr[0] = 0x5000; // rax
        r.gpr[4] = 0x7000; // rsp
        r
    }

    fn mem(a: u64) -> Option<u64> {
        match a {
            0x7000 => Some(0x1234),
            0x5010 => Some(0x4444),
            _ => None,
        }
    }

    #[test]
    fn branches_resolved_from_registers() {
        let mut r = regs();
        let go = |code: &[u8], r: &X86Regs| x86_branch(code, 0x1000, r, &mut mem);
        // je +0x10: taken with ZF, else straight on.
        r.rflags = ZF;
        assert_eq!(go(&[0x74, 0x10], &r).unwrap().pc, 0x1012);
        r.rflags = 0;
        assert_eq!(go(&[0x74, 0x10], &r).unwrap().pc, 0x1002);
        // jl: SF != OF.
        r.rflags = SF;
        assert_eq!(go(&[0x7c, 0x10], &r).unwrap().pc, 0x1012);
        r.rflags = SF | OF;
        assert_eq!(go(&[0x7c, 0x10], &r).unwrap().pc, 0x1002);
        // call rel32 pushes the return address.
        let t = go(&[0xe8, 0x10, 0, 0, 0], &r).unwrap();
        assert_eq!((t.pc, t.push), (0x1015, Some(0x1005)));
        // ret pops.
        let t = go(&[0xc3], &r).unwrap();
        assert_eq!((t.pc, t.pop), (0x1234, true));
        // jmp rax; call [rax+0x10]
        assert_eq!(go(&[0xff, 0xe0], &r).unwrap().pc, 0x5000);
        let t = go(&[0xff, 0x50, 0x10], &r).unwrap();
        assert_eq!((t.pc, t.push), (0x4444, Some(0x1003)));
        // jmp fs:[0x10]: through the fs segment's base.
        r.fs_base = 0x5000;
        let fs_jmp = [0x64, 0xff, 0x24, 0x25, 0x10, 0, 0, 0];
        assert_eq!(go(&fs_jmp, &r).unwrap().pc, 0x4444);
        // Not done here: syscall, loop, jrcxz, ret imm16, an unreadable table.
        assert!(go(&[0x0f, 0x05], &r).is_none());
        assert!(go(&[0xe2, 0x10], &r).is_none());
        assert!(go(&[0xe3, 0x10], &r).is_none());
        assert!(go(&[0xe1, 0x10], &r).is_none()); // loope
        assert!(go(&[0xe0, 0x10], &r).is_none()); // loopne
        assert!(go(&[0xc2, 0x08, 0x00], &r).is_none());
        assert!(go(&[0xff, 0x60, 0x40], &r).is_none());
    }
}
