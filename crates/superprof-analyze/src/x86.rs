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
    Some(insn_of(&decode_one(code, addr)?))
}

/// Every instruction from the start of `code` (at address `base`) up to the first invalid
/// one or the end: [`classify`] in a row, with one decoder (a decoder made for each
/// instruction was most of `stat`'s start on a large binary).
pub fn classify_all(code: &[u8], base: u64) -> Vec<Insn> {
    let mut d = Decoder::with_ip(64, code, base, DecoderOptions::NONE);
    let mut out = Vec::new();
    let mut i = Instruction::default();
    while d.can_decode() {
        d.decode_out(&mut i);
        if i.is_invalid() {
            break;
        }
        out.push(insn_of(&i));
    }
    out
}

/// The direct branches (jumps, conditional jumps, calls) from the start of `code` (at `base`)
/// up to the first invalid instruction or the end, as (target, the branch's address) into
/// `out`; returns the bytes decoded. What [`classify_all`]'s `Flow::target` gives, without
/// keeping every instruction (a whole binary's code is scanned for them).
pub fn branch_pairs(code: &[u8], base: u64, out: &mut Vec<(u64, u64)>) -> usize {
    let mut d = Decoder::with_ip(64, code, base, DecoderOptions::NONE);
    let mut i = Instruction::default();
    let mut end = 0;
    while d.can_decode() {
        d.decode_out(&mut i);
        if i.is_invalid() {
            break;
        }
        end = d.position();
        // (iced counts syscall and sysenter as calls; `insn_of` does not.)
        if matches!(
            i.flow_control(),
            FlowControl::UnconditionalBranch | FlowControl::ConditionalBranch | FlowControl::Call
        ) && !matches!(i.mnemonic(), Mnemonic::Syscall | Mnemonic::Sysenter)
        {
            out.push((i.near_branch_target(), i.ip()));
        }
    }
    end
}

/// What superprof needs of a decoded instruction.
fn insn_of(i: &Instruction) -> Insn {
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
    Insn {
        addr: i.ip(),
        len: i.len() as u32,
        flow,
        filler: matches!(i.mnemonic(), Mnemonic::Nop | Mnemonic::Int3),
    }
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

#[cfg(test)]
mod classify_all_tests {
    use super::*;

    #[test]
    fn one_decoder_reads_what_one_decoder_per_instruction_reads() {
        // push %rbp; mov %rsp,%rbp; call +0; je +2; ret; nop; syscall; rep movsb; and a
        // truncated instruction at the end, where both stop.
        let code = [
            0x55, 0x48, 0x89, 0xe5, 0xe8, 0, 0, 0, 0, 0x74, 0x02, 0xc3, 0x90, 0x0f, 0x05, 0xf3,
            0xa4, 0x48, 0x8b,
        ];
        let base = 0x40_1000;
        let mut one_by_one = Vec::new();
        let mut off = 0;
        while let Some(i) = classify(&code[off..], base + off as u64) {
            off += i.len as usize;
            one_by_one.push(i);
        }
        let all = classify_all(&code, base);
        assert_eq!(all, one_by_one);
        let mut pairs = Vec::new();
        let end = branch_pairs(&code, base, &mut pairs);
        assert_eq!(end, 17);
        let want: Vec<(u64, u64)> = all
            .iter()
            .filter_map(|i| Some((i.flow.target()?, i.addr)))
            .collect();
        assert_eq!(pairs, want);
        assert_eq!(all.len(), 8);
        assert_eq!(all[2].flow, Flow::Call { target: 0x40_1009 });
        assert_eq!(all[7].flow, Flow::Repeat);
    }
}
