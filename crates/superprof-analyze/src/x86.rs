//! x86_64 instruction classification with iced-x86.

use iced_x86::{Decoder, DecoderOptions, FlowControl, Instruction, Mnemonic};

use crate::{Flow, Insn};

/// The x86_64 instruction at the start of `code` (at address `addr`); None if invalid.
pub(crate) fn decode_one(code: &[u8], addr: u64) -> Option<Instruction> {
    let mut d = Decoder::with_ip(64, code, addr, DecoderOptions::NONE);
    if !d.can_decode() {
        return None;
    }
    let i = d.decode();
    (!i.is_invalid()).then_some(i)
}

/// Decodes the instruction at the start of `code` (at address `addr`); None if invalid.
pub fn classify(code: &[u8], addr: u64) -> Option<Insn> {
    let i = decode_one(code, addr)?;
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
        filler: matches!(i.mnemonic(), Mnemonic::Nop | Mnemonic::Int3),
    })
}

/// The instruction at the start of `code` as text (AT&T syntax, as objdump prints it), and
/// its length.
pub fn disassemble(code: &[u8], addr: u64) -> Option<(String, u32)> {
    use iced_x86::{Formatter, GasFormatter};
    let i = decode_one(code, addr)?;
    let mut f = GasFormatter::new();
    f.options_mut().set_uppercase_hex(false);
    f.options_mut().set_space_after_operand_separator(false);
    f.options_mut().set_branch_leading_zeros(false);
    let mut text = String::new();
    f.format(&i, &mut text);
    Some((text, i.len() as u32))
}

/// Legacy and REX prefixes: not part of an encoding's opcode.
fn is_prefix(b: u8) -> bool {
    matches!(
        b,
        0x26 | 0x2e | 0x36 | 0x3e | 0x64 | 0x65 | 0x66 | 0x67 | 0xf0 | 0xf2 | 0xf3
    ) || (0x40..=0x4f).contains(&b)
}

/// Bits of an encoding key that belong to the opcode (map and opcode byte), as opposed to the
/// byte after it (ModRM, or an immediate or displacement).
pub const KEY_HEAD_SHIFT: u32 = 9;

/// The learning analyzer's view of an instruction: its length (from the length decoder) and
/// a key made of its opcode bytes with the prefixes left out: map (none, 0F, 0F38, 0F3A: 2
/// bits), opcode byte (8 bits), then whether a byte follows (1 bit) and that byte (8 bits).
pub fn encoding_key(code: &[u8], addr: u64) -> Option<(u32, u32)> {
    let i = decode_one(code, addr)?;
    let len = i.len();
    let bytes = &code[..len];
    let mut p = 0;
    while p < len && is_prefix(bytes[p]) {
        p += 1;
    }
    let mut map = 0u32;
    if p + 1 < len && bytes[p] == 0x0f {
        p += 1;
        map = 1;
        if p + 1 < len && (bytes[p] == 0x38 || bytes[p] == 0x3a) {
            map = if bytes[p] == 0x38 { 2 } else { 3 };
            p += 1;
        }
    }
    let opcode = *bytes.get(p)? as u32;
    let next = match bytes.get(p + 1) {
        Some(&b) => 0x100 | b as u32,
        None => 0,
    };
    Some((((map << 8 | opcode) << KEY_HEAD_SHIFT) | next, len as u32))
}
