//! Issue 13: a module in the upper half of the address space, linked and loaded where real
//! kernels are (0xffffffff80100000, bias 0), unwinds by its CFI. framehop looks code up by its
//! 32-bit offset from the module's base; with a base of 0 nothing in such a module was found,
//! and the unwinder fell back to frame pointers and stopped at the leaf.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::Arc;

use superprof_unwind::{
    frame_parts, Arch, ElfImage, GuestUnwinder, Truncation, UnwindOutcome, UserRegs,
};

/// `_start` calls `g`, which calls `f`; the addresses of `f` and of the two return sites.
struct Kernel {
    path: PathBuf,
    f: u64,
    ret_in_g: u64,
    ret_in_start: u64,
}

fn build(dir: &Path) -> Kernel {
    let asm = dir.join("hh.S");
    std::fs::write(
        &asm,
        "    .text\n    .globl _start\n_start:\n    .cfi_startproc\n    .cfi_undefined rip\n\
         \x20   call g\n    .globl ret_in_start\nret_in_start:\n    hlt\n    .cfi_endproc\n\
         \x20   .globl g\ng:\n    .cfi_startproc\n    subq $8, %rsp\n    .cfi_def_cfa_offset 16\n\
         \x20   call f\n    .globl ret_in_g\nret_in_g:\n    addq $8, %rsp\n    .cfi_def_cfa_offset 8\n\
         \x20   ret\n    .cfi_endproc\n    .globl f\nf:\n    .cfi_startproc\n    nop\n    ret\n\
         \x20   .cfi_endproc\n",
    )
    .unwrap();
    let script = dir.join("hh.ld");
    std::fs::write(
        &script,
        "ENTRY(_start)\nSECTIONS {\n  . = 0xffffffff80100000;\n  .text : { *(.text*) }\n\
         \x20 .eh_frame_hdr : { *(.eh_frame_hdr) }\n  .eh_frame : { *(.eh_frame) }\n}\n",
    )
    .unwrap();
    let obj = dir.join("hh.o");
    let elf = dir.join("hh.elf");
    let run = |c: &mut Command| {
        let out = c.output().unwrap();
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8_lossy(&out.stdout).into_owned()
    };
    run(Command::new("gcc").arg("-c").arg("-o").arg(&obj).arg(&asm));
    run(Command::new("ld")
        .arg("--eh-frame-hdr")
        .arg("-T")
        .arg(&script)
        .arg("-o")
        .arg(&elf)
        .arg(&obj));
    let nm = run(Command::new("nm").arg(&elf));
    let sym = |name: &str| {
        nm.lines()
            .find_map(|l| {
                let w: Vec<&str> = l.split_whitespace().collect();
                (w.len() == 3 && w[2] == name).then(|| u64::from_str_radix(w[0], 16).unwrap())
            })
            .unwrap_or_else(|| panic!("no {name} in {nm}"))
    };
    Kernel {
        f: sym("f"),
        ret_in_g: sym("ret_in_g"),
        ret_in_start: sym("ret_in_start"),
        path: elf,
    }
}

#[test]
fn a_module_in_the_upper_half_unwinds_by_its_cfi() {
    let dir = std::env::temp_dir().join(format!("superprof-higher-half-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let k = build(&dir);
    assert!(k.f >= 0xffff_ffff_8000_0000, "{:#x}", k.f);
    let image = Arc::new(ElfImage::open(&k.path).unwrap());
    let mut u = GuestUnwinder::new(Arch::X86_64);
    for r in image.executable_ranges() {
        u.add_module(&image, "kernel", r.clone(), 0);
    }
    // In f, at its first instruction: the return address into g on top of the stack, g's
    // 8-byte slot above it, then the return address into _start. No frame pointer (rbp 0).
    let sp = 0xffff_8000_0010_0000u64;
    let stack = [k.ret_in_g, 0xdead_beef, k.ret_in_start];
    let mut read = |a: u64| -> Result<u64, ()> {
        let i = a.checked_sub(sp).ok_or(())? / 8;
        stack.get(i as usize).copied().ok_or(())
    };
    let regs = UserRegs {
        pc: k.f,
        sp,
        fp: 0,
        lr: 0,
    };
    let mut out = Vec::new();
    let outcome = u.unwind(&regs, &mut read, &mut out);
    let frames: Vec<u64> = out.iter().map(|f| frame_parts(f).0).collect();
    assert_eq!(
        frames,
        [k.f, k.ret_in_g, k.ret_in_start],
        "frames {frames:x?}, {outcome:?}"
    );
    // Complete: the outermost frame's CFI (_start's `.cfi_undefined rip`) says the stack ends.
    assert_eq!(outcome, UnwindOutcome::Complete);
    // A return address into no module: no CFI to go on with; the frame-pointer fallback (rbp
    // 0) ends there, and that is a truncated stack, not a complete one.
    let lost = [k.ret_in_g, 0xdead_beef, 0x1234_5678];
    let mut read = |a: u64| -> Result<u64, ()> {
        let i = a.checked_sub(sp).ok_or(())? / 8;
        lost.get(i as usize).copied().ok_or(())
    };
    out.clear();
    let outcome = u.unwind(&regs, &mut read, &mut out);
    assert_eq!(
        outcome,
        UnwindOutcome::Truncated(Truncation::NoUnwindInfo),
        "{out:x?}"
    );
    // The stack cut short (the memory above f's frame unreadable).
    let short = [k.ret_in_g];
    let mut read = |a: u64| -> Result<u64, ()> {
        let i = a.checked_sub(sp).ok_or(())? / 8;
        short.get(i as usize).copied().ok_or(())
    };
    out.clear();
    let outcome = u.unwind(&regs, &mut read, &mut out);
    assert_eq!(
        outcome,
        UnwindOutcome::Truncated(Truncation::Unreadable),
        "{out:x?}"
    );
    let _ = std::fs::remove_dir_all(&dir);
}
