//! The decoder against objdump on real compiled code, and on hand-picked encodings.

use std::collections::BTreeSet;
use std::path::Path;
use std::process::Command;

use object::{Object, ObjectSection, ObjectSymbol};
use superprof_analyze::{blocks, classify, decode_all, Arch, Flow, Isa};
use superprof_testkit::{compile, compile_with, TempDir};

/// (address, mnemonic, direct target) of each instruction of `func`, from objdump.
fn objdump(exe: &Path, func: &str) -> Vec<(u64, String, Option<u64>)> {
    let out = Command::new("objdump")
        .args(["-d", "--no-show-raw-insn", &format!("--disassemble={func}")])
        .arg(exe)
        .output()
        .expect("objdump runs");
    let text = String::from_utf8_lossy(&out.stdout);
    text.lines()
        .filter_map(|l| {
            let (addr, rest) = l.trim().split_once(":\t")?;
            let addr = u64::from_str_radix(addr, 16).ok()?;
            let mut w = rest.split_whitespace();
            let mnemonic = w.next()?.to_owned();
            let target = w.next().and_then(|t| u64::from_str_radix(t, 16).ok());
            Some((addr, mnemonic, target))
        })
        .collect()
}

fn function_bytes(exe: &Path, func: &str) -> (Vec<u8>, u64) {
    let data = std::fs::read(exe).unwrap();
    let obj = object::File::parse(&*data).unwrap();
    let sym = obj.symbols().find(|s| s.name() == Ok(func)).unwrap();
    let text = obj.section_by_name(".text").unwrap();
    let off = (sym.address() - text.address()) as usize;
    let bytes = text.data().unwrap()[off..off + sym.size() as usize].to_vec();
    (bytes, sym.address())
}

#[test]
fn blocks_agree_with_objdump_on_compiled_code() {
    let dir = TempDir::new("analyze");
    for opt in ["-O0", "-O2"] {
        let exe = compile(&dir, "branches", &["branches.c"], &[opt, "-g"]);
        for func in ["pick", "zigzag", "main"] {
            let (bytes, base) = function_bytes(&exe, func);
            let theirs = objdump(&exe, func);
            let ours = decode_all(&bytes, base);
            // Same instruction boundaries.
            let a: Vec<u64> = ours.iter().map(|i| i.addr).collect();
            let b: Vec<u64> = theirs.iter().map(|i| i.0).collect();
            assert_eq!(a, b, "{func} {opt}: instruction boundaries differ");
            // Same control flow, instruction by instruction.
            for (i, (_, m, target)) in ours.iter().zip(&theirs) {
                let expect_end = m.starts_with('j')
                    || m.starts_with("call")
                    || m.starts_with("ret")
                    || m == "ud2"
                    || m == "hlt"
                    || m == "syscall"
                    || m.starts_with("int");
                assert_eq!(
                    i.flow.ends_block(),
                    expect_end,
                    "{func} {opt} at {:#x}: {m} vs {:?}",
                    i.addr,
                    i.flow
                );
                if m.starts_with('j') && m != "jmp" {
                    assert!(
                        matches!(i.flow, Flow::Conditional { .. }),
                        "{m} at {:#x}",
                        i.addr
                    );
                }
                if let (Some(t), Some(expect)) = (i.flow.target(), target) {
                    assert_eq!(t, *expect, "{m} at {:#x}", i.addr);
                }
            }
            // Every branch target inside the function starts a block; blocks tile the code.
            let bl = blocks(&bytes, base);
            let starts: BTreeSet<u64> = bl.iter().map(|b| b.start).collect();
            let end = base + bytes.len() as u64;
            for (_, m, target) in &theirs {
                if let Some(t) = target.filter(|t| (base..end).contains(t)) {
                    if m.starts_with('j') {
                        assert!(
                            starts.contains(&t),
                            "{func} {opt}: target {t:#x} of {m} is not a block start"
                        );
                    }
                }
            }
            assert_eq!(bl.first().unwrap().start, base);
            // Blocks tile the code but for filler (nops after a return or jump).
            let filler: BTreeSet<u64> = theirs
                .iter()
                .filter(|(_, m, _)| {
                    m.starts_with("nop") || m == "cs" || m == "data16" || m == "xchg"
                })
                .map(|(a, _, _)| *a)
                .collect();
            for w in bl.windows(2) {
                let gap: Vec<u64> = ours
                    .iter()
                    .map(|i| i.addr)
                    .filter(|a| (w[0].end..w[1].start).contains(a))
                    .collect();
                assert!(
                    gap.iter().all(|a| filler.contains(a)),
                    "{func} {opt}: code between blocks at {:#x}..{:#x} is not filler",
                    w[0].end,
                    w[1].start
                );
            }
            let in_blocks: usize = bl.iter().map(|b| b.instructions as usize).sum();
            let skipped = ours.len() - in_blocks;
            assert!(
                skipped <= filler.len(),
                "{func} {opt}: {skipped} instructions left out, {} of them filler",
                filler.len()
            );
        }
    }
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn hand_picked_encodings() {
    let c = |bytes: &[u8]| classify(bytes, 0x1000).unwrap().flow;
    assert_eq!(c(&[0xf3, 0xa4]), Flow::Repeat); // rep movsb
    assert_eq!(c(&[0xa4]), Flow::Next); // movsb
    assert_eq!(c(&[0x0f, 0x05]), Flow::Syscall);
    assert_eq!(c(&[0xcd, 0x80]), Flow::Syscall); // int 0x80
    assert_eq!(c(&[0xcc]), Flow::Trap); // int3
    assert_eq!(c(&[0x0f, 0x0b]), Flow::Trap); // ud2
    assert_eq!(c(&[0xc3]), Flow::Return);
    assert_eq!(c(&[0xff, 0xe0]), Flow::IndirectJump); // jmp rax
    assert_eq!(c(&[0xff, 0xd0]), Flow::IndirectCall); // call rax
    assert_eq!(c(&[0xe8, 0x10, 0, 0, 0]), Flow::Call { target: 0x1015 });
    assert_eq!(c(&[0xeb, 0xfe]), Flow::Jump { target: 0x1000 }); // jmp $
    assert_eq!(c(&[0x90]), Flow::Next);
    assert!(classify(&[0x0f], 0x1000).is_none());
}

/// AArch64 code from the cross compiler, against the cross objdump: the same control flow.
#[test]
fn aarch64_decoder_agrees_with_objdump() {
    if Command::new("aarch64-linux-gnu-gcc")
        .arg("--version")
        .output()
        .is_err()
    {
        panic!("aarch64-linux-gnu-gcc is missing: scripts/test installs gcc-aarch64-linux-gnu");
    }
    let dir = TempDir::new("analyze-a64");
    let mut kinds = BTreeSet::new();
    for opt in ["-O0", "-O2"] {
        let obj = compile_with(
            "aarch64-linux-gnu-gcc",
            &dir,
            "branches.o",
            &["branches_core.h"],
            &[opt, "-x", "c", "-c", "-fno-pic"],
        );
        let text = String::from_utf8(
            Command::new("aarch64-linux-gnu-objdump")
                .args(["-d", "--no-show-raw-insn"])
                .arg(&obj)
                .output()
                .unwrap()
                .stdout,
        )
        .unwrap();
        let data = std::fs::read(&obj).unwrap();
        let file = object::File::parse(&*data).unwrap();
        let code = file
            .section_by_name(".text")
            .unwrap()
            .data()
            .unwrap()
            .to_vec();
        let mut checked = 0;
        for line in text.lines() {
            let Some((addr, rest)) = line.trim().split_once(":\t") else {
                continue;
            };
            let Ok(addr) = u64::from_str_radix(addr, 16) else {
                continue;
            };
            let mut w = rest.split_whitespace();
            let m = w.next().unwrap_or("").to_owned();
            let insn = Arch::Aarch64
                .classify(&code[addr as usize..], addr)
                .unwrap_or_else(|| panic!("{opt}: {m} at {addr:#x} does not decode"));
            let expect = match m.as_str() {
                "b" => "jump",
                "bl" => "call",
                "br" => "indirect jump",
                "blr" => "indirect call",
                "ret" => "return",
                "cbz" | "cbnz" | "tbz" | "tbnz" => "conditional",
                "svc" => "syscall",
                "brk" | "udf" | "hlt" => "trap",
                b if b.starts_with("b.") => "conditional",
                _ => "next",
            };
            let got = match insn.flow {
                Flow::Jump { .. } => "jump",
                Flow::Call { .. } => "call",
                Flow::IndirectJump => "indirect jump",
                Flow::IndirectCall => "indirect call",
                Flow::Return => "return",
                Flow::Conditional { .. } => "conditional",
                Flow::Syscall => "syscall",
                Flow::Trap => "trap",
                Flow::Next | Flow::Repeat => "next",
            };
            assert_eq!(got, expect, "{opt}: {m} at {addr:#x}");
            // Direct targets as objdump prints them (relocated calls print their own address).
            if let (Some(t), Some(Ok(expect_t))) = (
                insn.flow.target(),
                w.next()
                    .map(|t| u64::from_str_radix(t.trim_start_matches("0x"), 16)),
            ) {
                if m != "bl" {
                    assert_eq!(t, expect_t, "{opt}: {m} at {addr:#x}");
                }
            }
            kinds.insert(expect);
            checked += 1;
        }
        assert!(checked > 40, "{opt}: only {checked} instructions checked");
        // Blocks split at every conditional's target.
        let bl = superprof_analyze::blocks_for(Arch::Aarch64, &code, 0);
        let starts: BTreeSet<u64> = bl.iter().map(|b| b.start).collect();
        for i in superprof_analyze::decode_all_for(Arch::Aarch64, &code, 0) {
            if let Flow::Conditional { target } = i.flow {
                assert!(starts.contains(&target), "{opt}: target {target:#x}");
            }
        }
    }
    for k in ["conditional", "return", "jump", "call", "indirect call"] {
        assert!(kinds.contains(k), "no {k} in the AArch64 code");
    }
    let _ = std::fs::remove_dir_all(&dir);
}

/// How an AArch64 instruction moves the pc, by objdump's mnemonic: the truth the learner is
/// trained with and checked against here (never superprof's own decoder).
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum A64Flow {
    Next,
    Conditional,
    Direct,
    Indirect,
}

fn a64_flow(mnemonic: &str) -> A64Flow {
    match mnemonic {
        "cbz" | "cbnz" | "tbz" | "tbnz" => A64Flow::Conditional,
        m if m.starts_with("b.") => A64Flow::Conditional,
        "b" | "bl" => A64Flow::Direct,
        "br" | "blr" | "ret" | "brk" | "udf" | "hlt" | "svc" | "eret" => A64Flow::Indirect,
        _ => A64Flow::Next,
    }
}

/// The learning analyzer on AArch64 words (no AArch64 machine here: its single steps are
/// simulated from objdump's listing: where each instruction sends the pc). It learns from the
/// -O0 code and predicts the -O2 code's block ends, which it has never seen: every prediction
/// it makes is objdump's block end (the first instruction from the block's start that may
/// send the pc elsewhere).
#[test]
fn learn_generalizes_aarch64_branches() {
    use superprof_analyze::{Analyzer, BlockEnd, Learn};
    let dir = TempDir::new("learn-a64");
    // The code, and objdump's (address, flow, printed target) of each instruction.
    let code_of = |opt: &str| {
        let obj = compile_with(
            "aarch64-linux-gnu-gcc",
            &dir,
            &format!("b{opt}.o"),
            &["branches_core.h"],
            &[opt, "-x", "c", "-c", "-fno-pic"],
        );
        let data = std::fs::read(&obj).unwrap();
        let file = object::File::parse(&*data).unwrap();
        let code = file
            .section_by_name(".text")
            .unwrap()
            .data()
            .unwrap()
            .to_vec();
        let out = Command::new("aarch64-linux-gnu-objdump")
            .args(["-d", "--no-show-raw-insn", "-j", ".text"])
            .arg(&obj)
            .output()
            .expect("aarch64-linux-gnu-objdump runs (scripts/test installs it)");
        let listing: Vec<(u64, A64Flow, Option<u64>)> = String::from_utf8_lossy(&out.stdout)
            .lines()
            .filter_map(|l| {
                let (addr, rest) = l.trim().split_once(":\t")?;
                let addr = u64::from_str_radix(addr, 16).ok()?;
                let mut w = rest.split_whitespace();
                let flow = a64_flow(w.next()?);
                // The target is the last operand objdump prints as a bare hex number.
                let target = w
                    .filter_map(|t| u64::from_str_radix(t.trim_end_matches(','), 16).ok())
                    .next_back();
                Some((addr, flow, target))
            })
            .collect();
        assert_eq!(listing.len() * 4, code.len(), "{opt}: one line per word");
        (code, listing)
    };
    let mut learn = Learn::new(Arch::Aarch64, true);
    const PREDICT_BASE: u64 = 0x80_0000;
    // Simulated runs of the code loaded at `base`: each instruction once, each conditional
    // once taken and once not.
    let train =
        |learn: &mut Learn, code: &[u8], listing: &[(u64, A64Flow, Option<u64>)], base: u64| {
            for &(addr, flow, target) in listing {
                let bytes = &code[addr as usize..];
                let (at, next) = (base + addr, base + addr + 4);
                match (flow, target) {
                    (A64Flow::Next, _) => learn.observe(at, bytes, next),
                    (A64Flow::Conditional, Some(t)) => {
                        learn.observe(at, bytes, next);
                        learn.observe(at, bytes, base + t);
                    }
                    (A64Flow::Direct, Some(t)) => learn.observe(at, bytes, base + t),
                    _ => learn.observe(at, bytes, 0xdead_0000),
                }
            }
        };
    // (predicted, unknown) over the blocks of the code, by objdump: a block starts at the
    // code's start, after each instruction that may send the pc elsewhere, and at each
    // direct target; it ends at the first such instruction. Every prediction must be that.
    let predict = |learn: &mut Learn, code: &[u8], listing: &[(u64, A64Flow, Option<u64>)]| {
        // (Loaded at PREDICT_BASE, where no training ran: the per-address table knows none
        // of it.)
        let mut read = |addr: u64, buf: &mut [u8]| {
            let a = ((addr - PREDICT_BASE) as usize).min(code.len());
            let n = buf.len().min(code.len() - a);
            buf[..n].copy_from_slice(&code[a..a + n]);
            n
        };
        let mut starts: BTreeSet<u64> = BTreeSet::from([0]);
        for &(addr, flow, target) in listing {
            if flow != A64Flow::Next {
                starts.insert(addr + 4);
                if let Some(t) = target {
                    starts.insert(t);
                }
            }
        }
        let (mut predicted, mut unknown) = (0, 0);
        for &start in starts.iter().filter(|&&a| a < code.len() as u64) {
            let end = listing
                .iter()
                .find(|&&(a, flow, _)| a >= start && flow != A64Flow::Next)
                .map(|&(a, _, _)| a);
            let limit = PREDICT_BASE + code.len() as u64;
            match learn.block_end(PREDICT_BASE + start, limit, &mut read) {
                BlockEnd::Unknown { .. } => unknown += 1,
                BlockEnd::Last {
                    addr, instructions, ..
                } => {
                    predicted += 1;
                    let addr = addr - PREDICT_BASE;
                    assert_eq!(Some(addr), end, "block {start:#x}");
                    assert_eq!(instructions as u64, (addr - start) / 4 + 1);
                }
                BlockEnd::Open { end: open, .. } => {
                    predicted += 1;
                    assert_eq!(end, None, "block {start:#x} open to {open:#x}");
                }
            }
        }
        (predicted, unknown)
    };
    let (o0, o0_listing) = code_of("-O0");
    let (o2, o2_listing) = code_of("-O2");
    train(&mut learn, &o0, &o0_listing, 0);
    // On code it has not seen, it predicts what it can, rightly, and would step the rest.
    let (predicted, _unknown) = predict(&mut learn, &o2, &o2_listing);
    assert!(predicted > 0);
    // Once it has seen the code run at four places (an opcode must go straight on at four
    // addresses before it is trusted), it predicts every block.
    for base in [0x10_0000, 0x20_0000, 0x30_0000, 0x40_0000] {
        train(&mut learn, &o2, &o2_listing, base);
    }
    let (predicted, unknown) = predict(&mut learn, &o2, &o2_listing);
    assert_eq!(unknown, 0, "{predicted} predicted");
    assert!(predicted > 20, "{predicted} blocks");
}
