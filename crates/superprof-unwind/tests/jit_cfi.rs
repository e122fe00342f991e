//! JIT code unwound by the tables its runtime wrote into the jitdump (issue 14): the bytes of
//! one of node 20's optimized functions (`--perf-prof-unwinding-info`: an eh_frame of one CIE
//! and one FDE, then its eh_frame_hdr, placed after the code at an 8-byte boundary). At the
//! function's first instruction the caller's frame pointer is still in rbp: by the CFI the
//! return address is the word at sp; a frame-pointer walk would skip to rbp's frame instead.
//! (V8's CIE says "zLR" with the LSDA omitted, which gimli refuses as it is: the CIE is
//! rewritten first.)
#![cfg(target_arch = "x86_64")]

use superprof_unwind::{frame_parts, jit_module, ProcessModules, UserRegs};

/// Unwinding data as node wrote it for code at 0x7f250c0068c0, 884 bytes long.
const V8_UNWIND: &str = "1800000000000000037a4c520001781002ff1b0c0708900100000000200000002000000064fcffff74030000004f0e108602430d0602560d07410e08520c061000000000011b033bb8ffffff0100000044fcffffd8ffffff";

fn bytes(hex: &str) -> Vec<u8> {
    (0..hex.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(&hex[i..i + 2], 16).unwrap())
        .collect()
}

fn second_frame(p: &mut ProcessModules, pc: u64) -> Option<u64> {
    // A stack: at sp the return address 0x1234000; rbp points higher, at a frame record whose
    // return address is 0x5678000.
    let sp = 0x7ffd_0000_1000u64;
    let mut stack = vec![0u8; 256];
    stack[0..8].copy_from_slice(&0x123_4000u64.to_le_bytes());
    stack[0x88..0x90].copy_from_slice(&0x567_8000u64.to_le_bytes());
    let regs = UserRegs {
        pc,
        sp,
        fp: sp + 0x80,
        lr: 0,
    };
    let mut out = Vec::new();
    let _ = p.unwind(&regs, &stack, &mut out);
    out.get(1).map(|f| frame_parts(f).0)
}

#[test]
fn jit_code_unwinds_by_its_own_cfi() {
    let code = 0x7f25_0c00_68c0u64..0x7f25_0c00_68c0 + 884;
    let data = bytes(V8_UNWIND);
    let (eh_frame, hdr) = data.split_at(data.len() - 20);
    let eh_frame_at = code.start + ((884 + 7) & !7);
    let hdr_at = eh_frame_at + eh_frame.len() as u64;
    for with_hdr in [true, false] {
        let mut p = ProcessModules::default();
        p.add_jit_module(
            jit_module(
                "JS:*hotA".into(),
                code.clone(),
                eh_frame_at,
                eh_frame.to_vec(),
                with_hdr.then(|| (hdr_at, hdr.to_vec())),
            ),
            code.start,
        );
        assert_eq!(
            second_frame(&mut p, code.start),
            Some(0x123_4000),
            "hdr {with_hdr}"
        );
    }
    // Without the tables, the same registers go by rbp: the caller is missed.
    let mut bare = ProcessModules::default();
    assert_ne!(second_frame(&mut bare, code.start), Some(0x123_4000));
}

#[test]
fn the_cie_rewrite_keeps_lengths_and_leaves_others_alone() {
    let data = bytes(V8_UNWIND);
    let mut eh = data[..data.len() - 20].to_vec();
    let before = eh.clone();
    superprof_unwind::drop_omitted_lsda(&mut eh);
    assert_eq!(eh.len(), before.len());
    assert_ne!(eh, before);
    assert_eq!(&eh[9..12], b"zR\0");
    // The FDE is untouched.
    assert_eq!(eh[28..], before[28..]);
    // A CIE without 'L', junk, a cut table: unchanged, no panic.
    let again = eh.clone();
    superprof_unwind::drop_omitted_lsda(&mut eh);
    assert_eq!(eh, again);
    for cut in 0..before.len() {
        let mut b = before[..cut].to_vec();
        superprof_unwind::drop_omitted_lsda(&mut b);
    }
    let mut junk = vec![0xffu8; 64];
    superprof_unwind::drop_omitted_lsda(&mut junk);
    // Entries too short to hold a CIE id, in every length.
    for n in 0..16u8 {
        let mut short = vec![n, 0, 0, 0, 0, 0, 0, 0, b'z', b'L', 0];
        superprof_unwind::drop_omitted_lsda(&mut short);
    }
}
