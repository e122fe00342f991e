//! AArch64 instruction classification with yaxpeax-arm.

use yaxpeax_arch::{Decoder, U8Reader};
use yaxpeax_arm::armv8::a64::{InstDecoder, Instruction, Opcode, Operand};

use crate::{Flow, Insn};

fn decode(code: &[u8]) -> Option<Instruction> {
    let bytes = code.get(..4)?;
    InstDecoder::default()
        .decode(&mut U8Reader::new(bytes))
        .ok()
}

/// The pc-relative target of a branch at `addr`.
fn label(i: &Instruction, addr: u64) -> Option<u64> {
    i.operands.iter().find_map(|o| match o {
        Operand::PCOffset(off) => Some(addr.wrapping_add(*off as u64)),
        _ => None,
    })
}

/// Decodes the instruction at the start of `code` (at address `addr`); None if invalid.
pub fn classify(code: &[u8], addr: u64) -> Option<Insn> {
    let i = decode(code)?;
    let flow = match i.opcode {
        Opcode::B => Flow::Jump {
            target: label(&i, addr)?,
        },
        Opcode::BL => Flow::Call {
            target: label(&i, addr)?,
        },
        // b.al and b.nv always branch.
        Opcode::Bcc(c) | Opcode::BCcc(c) if c >= 14 => Flow::Jump {
            target: label(&i, addr)?,
        },
        Opcode::Bcc(_)
        | Opcode::BCcc(_)
        | Opcode::CBZ
        | Opcode::CBNZ
        | Opcode::TBZ
        | Opcode::TBNZ => Flow::Conditional {
            target: label(&i, addr)?,
        },
        Opcode::BR | Opcode::BRAA | Opcode::BRAAZ | Opcode::BRAB | Opcode::BRABZ => {
            Flow::IndirectJump
        }
        Opcode::BLR | Opcode::BLRAA | Opcode::BLRAAZ | Opcode::BLRAB | Opcode::BLRABZ => {
            Flow::IndirectCall
        }
        Opcode::RET
        | Opcode::RETAA
        | Opcode::RETAB
        | Opcode::RETAASPPC
        | Opcode::RETABSPPC
        | Opcode::RETAASPPCR
        | Opcode::RETABSPPCR
        | Opcode::ERET
        | Opcode::ERETAA
        | Opcode::ERETAB => Flow::Return,
        Opcode::SVC | Opcode::HVC | Opcode::SMC => Flow::Syscall,
        Opcode::BRK | Opcode::HLT | Opcode::UDF => Flow::Trap,
        _ => Flow::Next,
    };
    Some(Insn {
        addr,
        len: 4,
        flow,
        // nop, or udf as padding
        filler: code[..4] == [0x1f, 0x20, 0x03, 0xd5] || i.opcode == Opcode::UDF,
    })
}

/// The instruction at the start of `code` as text, and its length.
pub fn disassemble(code: &[u8], _addr: u64) -> Option<(String, u32)> {
    Some((decode(code)?.to_string(), 4))
}

/// The learning analyzer's key: the instruction word itself (fixed-size encodings).
pub fn encoding_key(code: &[u8]) -> Option<(u32, u32)> {
    let word = u32::from_le_bytes(code.get(..4)?.try_into().ok()?);
    Some((word, 4))
}

/// The opcode part of the key: the top byte holds the major encoding groups.
pub const KEY_HEAD_SHIFT: u32 = 24;
