//! x86_64 instruction classification with iced-x86.

use iced_x86::{Decoder, DecoderOptions, FlowControl, Mnemonic};

use crate::{Flow, Insn};

/// Decodes the instruction at the start of `code` (at address `addr`); None if invalid.
pub fn classify(code: &[u8], addr: u64) -> Option<Insn> {
    let mut d = Decoder::with_ip(64, code, addr, DecoderOptions::NONE);
    if !d.can_decode() {
        return None;
    }
    let i = d.decode();
    if i.is_invalid() {
        return None;
    }
    let flow = match i.flow_control() {
        FlowControl::Next => {
            if (i.has_rep_prefix() || i.has_repne_prefix()) && i.is_string_instruction() {
                Flow::Repeat
            } else {
                Flow::Next
            }
        }
        FlowControl::UnconditionalBranch => Flow::Jump {
            target: i.near_branch_target(),
        },
        FlowControl::IndirectBranch => Flow::IndirectJump,
        FlowControl::ConditionalBranch => Flow::Conditional {
            target: i.near_branch_target(),
        },
        FlowControl::Return => Flow::Return,
        FlowControl::Call => Flow::Call {
            target: i.near_branch_target(),
        },
        FlowControl::IndirectCall => Flow::IndirectCall,
        FlowControl::Interrupt => match i.mnemonic() {
            Mnemonic::Int if i.immediate8() == 0x80 => Flow::Syscall,
            _ => Flow::Trap,
        },
        FlowControl::XbeginXabortXend => Flow::IndirectJump,
        FlowControl::Exception => Flow::Trap,
    };
    let flow = match i.mnemonic() {
        Mnemonic::Syscall | Mnemonic::Sysenter => Flow::Syscall,
        Mnemonic::Hlt | Mnemonic::Ud2 => Flow::Trap,
        _ => flow,
    };
    Some(Insn {
        addr,
        len: i.len() as u32,
        flow,
    })
}
