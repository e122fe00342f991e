//! ELF images from hostile files (issue 12, items 3 and 8): a real program compiled with gcc,
//! with its section headers, program headers and symbols corrupted one at a time. Opening the
//! file and unwinding through it must never panic (in libsuperprof the unwinder runs in a
//! signal handler, where a panic aborts the program); a broken section is left out, and what
//! is left still unwinds.

#[path = "../../../tests/fixtures/elf_patch.rs"]
mod elf_patch;

use std::path::{Path, PathBuf};

use elf_patch::{Elf, Field, SymField};
use superprof_unwind::{ElfCache, ElfImage, FrameAddress, ProcessModules, UserRegs};

fn fixture(dir: &Path) -> PathBuf {
    elf_patch::compile_child(&Path::new(env!("CARGO_MANIFEST_DIR")).join("../.."), dir)
}

fn tempdir(tag: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("superprof-unwind-{}-{tag}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).unwrap();
    d
}

/// Where the test places the file: its code segment mapped at BASE plus its ELF address.
const BASE: u64 = 0x5555_0000_0000;

/// Unwinds one frame from the entry of the function at `entry` (an ELF address of the
/// original file), whose return address on the stack is `ret`: the frames found.
fn unwind_from_entry(path: &Path, original: &Elf, entry: u64, ret: u64) -> Vec<FrameAddress> {
    let ph = original.code_segment_header();
    let (offset, vaddr, filesz) = (
        original.u64_at(ph + 8),
        original.u64_at(ph + 0x10),
        original.u64_at(ph + 0x20),
    );
    let start = BASE + (vaddr & !0xfff);
    let len = (filesz + (vaddr & 0xfff) + 0xfff) & !0xfff;
    let mut elves = ElfCache::default();
    let mut process = ProcessModules::default();
    process.add_mapping(&mut elves, start, len, offset & !0xfff, path);
    // At a function's entry the return address is at the stack pointer; the frame pointer is
    // zero, so only the CFI can find it.
    let sp = 0x7ffd_0000_1000;
    let mut stack = ret.to_le_bytes().to_vec();
    stack.extend((1..64u64).flat_map(|i| i.wrapping_mul(0x9e37_79b9_7f4a_7c15).to_le_bytes()));
    let regs = UserRegs {
        pc: BASE + entry,
        sp,
        fp: 0,
        lr: 0,
    };
    let mut frames = Vec::new();
    process.unwind(&regs, &stack, &mut frames);
    frames
}

#[test]
fn corrupted_headers_never_panic_and_the_rest_still_unwinds() {
    let dir = tempdir("hostile");
    let exe = fixture(&dir);
    let original = Elf::read(&exe);
    let entry = original.symbol("child_work", SymField::Value);
    let ret = BASE + original.symbol("main", SymField::Value) + 0x10;
    // The intact file: CFI finds the return address at the function's entry.
    let frames = unwind_from_entry(&exe, &original, entry, ret);
    assert!(
        frames.len() >= 2 && frames[1].address() == ret,
        "intact file: {frames:?}"
    );
    let variants = elf_patch::hostile_variants(&original);
    assert!(variants.len() > 50, "{} variants", variants.len());
    let mut failures = Vec::new();
    for (i, (what, elf)) in variants.iter().enumerate() {
        let path = dir.join(format!("v{i}"));
        elf.write(&path);
        let result = std::panic::catch_unwind(|| {
            let image = ElfImage::open(&path);
            let frames = unwind_from_entry(&path, &original, entry, ret);
            (image.is_some(), frames)
        });
        match result {
            Err(_) => failures.push(format!("{what}: panicked")),
            // Only the index (.eh_frame_hdr) is broken: .eh_frame alone still unwinds.
            Ok((opened, frames)) if what.starts_with(".eh_frame_hdr") => {
                if !opened || frames.get(1).map(|f| f.address()) != Some(ret) {
                    failures.push(format!("{what}: {frames:?}"));
                }
            }
            Ok(_) => {}
        }
    }
    assert!(failures.is_empty(), "{failures:#?}");
}

#[test]
fn the_issues_eh_frame_hdr_is_left_out() {
    let dir = tempdir("issue");
    let exe = fixture(&dir);
    let mut elf = Elf::read(&exe);
    elf.set_section(".eh_frame_hdr", Field::Offset, 0xffff_ffff_ffff_ff00)
        .set_section(".eh_frame_hdr", Field::Size, 0x200);
    let path = dir.join("wrapped");
    elf.write(&path);
    let image = ElfImage::open(&path).expect("the rest of the file is usable");
    assert!(image.has_unwind_info());
    // A section of the file whose bytes wrap past the end is as if it were absent: a .eh_frame
    // out of the file leaves no unwind information at all.
    let mut elf = Elf::read(&exe);
    let len = elf.bytes.len() as u64;
    elf.set_section(".eh_frame", Field::Offset, len - 8);
    let path = dir.join("eh-frame-out");
    elf.write(&path);
    let image = ElfImage::open(&path).expect("opens");
    assert!(!image.has_unwind_info());
}

/// A bounded mutation pass over the bytes the unwinder reads while sampling: .eh_frame_hdr
/// and .eh_frame with random bytes changed, unwound from every function's entry and middle.
/// Whatever the bytes say, unwinding ends without a panic.
#[test]
fn mutated_unwind_sections_never_panic() {
    let dir = tempdir("mutated");
    let exe = fixture(&dir);
    let original = Elf::read(&exe);
    let ranges: Vec<(u64, u64)> = [".eh_frame_hdr", ".eh_frame"]
        .iter()
        .map(|s| {
            (
                original.section(s, Field::Offset),
                original.section(s, Field::Size),
            )
        })
        .collect();
    let ret = BASE + original.symbol("main", SymField::Value) + 0x10;
    let pcs: Vec<u64> = ["main", "child_work"]
        .iter()
        .flat_map(|f| {
            let (a, n) = (
                original.symbol(f, SymField::Value),
                original.symbol(f, SymField::Size),
            );
            [a, a + n / 2, a + n.saturating_sub(1)]
        })
        .collect();
    let mut seed = 0x2545_f491_4f6c_dd1du64;
    let mut next = move || {
        seed ^= seed << 13;
        seed ^= seed >> 7;
        seed ^= seed << 17;
        seed
    };
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(3);
    let mut failures = Vec::new();
    let mut runs = 0;
    while runs < 400 && std::time::Instant::now() < deadline {
        let mut e = original.clone();
        let (off, size) = ranges[runs % 2];
        let mut changed = Vec::new();
        for _ in 0..1 + next() % 8 {
            let at = (off + next() % size.max(1)) as usize;
            let b = next() as u8;
            e.bytes[at] = b;
            changed.push((at, b));
        }
        let path = dir.join("mutant");
        e.write(&path);
        for &pc in &pcs {
            if std::panic::catch_unwind(|| unwind_from_entry(&path, &original, pc, ret)).is_err() {
                failures.push(format!("pc {pc:#x}, bytes changed {changed:x?}"));
            }
        }
        runs += 1;
    }
    assert!(runs >= 50, "only {runs} mutants in the time given");
    assert!(failures.is_empty(), "{failures:#?}");
}
