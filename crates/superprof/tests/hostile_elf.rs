//! A profiled program whose ELF file is hostile (issue 12, items 3 and 8): its section headers
//! corrupted (the issue's .eh_frame_hdr at offset 0xffffffffffffff00, size 0x200, and others).
//! `record`, `blocks --mode sample` and `preload` profile it without panicking (superprof
//! exited 101 and lost the program's status; in preload mode the program itself aborted), and
//! the program's exit status passes through.

mod common;

#[path = "../../../tests/fixtures/elf_patch.rs"]
mod elf_patch;

use common::*;
use elf_patch::{Elf, Field, SymField};

/// The program, and copies of it with one corruption each.
fn hostile_programs(dir: &TempDir) -> Vec<(&'static str, std::path::PathBuf)> {
    let exe = compile(dir, "child", &["exec_child.c"], &["-O2", "-g"]);
    let original = Elf::read(&exe);
    let len = original.bytes.len() as u64;
    let mut out = Vec::new();
    let mut add = |what: &'static str, patch: &dyn Fn(&mut Elf)| {
        let mut e = original.clone();
        patch(&mut e);
        let path = dir.path(&format!("hostile-{}", out.len()));
        e.write(&path);
        out.push((what, path));
    };
    add("the issue's .eh_frame_hdr", &|e| {
        e.set_section(".eh_frame_hdr", Field::Offset, 0xffff_ffff_ffff_ff00)
            .set_section(".eh_frame_hdr", Field::Size, 0x200);
    });
    add(".eh_frame past the end", &|e| {
        e.set_section(".eh_frame", Field::Offset, len + 0x1000);
    });
    add(".eh_frame at a wrong address", &|e| {
        let a = e.section(".eh_frame", Field::Addr);
        e.set_section(".eh_frame", Field::Addr, a + 0x1234);
    });
    add(".text wraps", &|e| {
        e.set_section(".text", Field::Offset, 0xffff_ffff_ffff_ff00);
    });
    add(".symtab huge", &|e| {
        e.set_section(".symtab", Field::Size, u64::MAX);
    });
    add("child_work of enormous size", &|e| {
        e.set_symbol("child_work", SymField::Size, u64::MAX);
    });
    out
}

fn assert_no_panic(what: &str, out: &std::process::Output, status: i32) {
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        !stderr.contains("panicked") && out.status.code() == Some(status),
        "{what}: {:?}\n{stderr}",
        out.status
    );
    assert!(
        String::from_utf8_lossy(&out.stdout).contains("exec_child ran"),
        "{what}: the program did not finish"
    );
}

#[test]
fn record_and_blocks_keep_the_status_of_a_program_with_a_hostile_elf() {
    let _cpu = cpu_lock();
    let dir = TempDir::new("hostile-elf");
    for (what, exe) in hostile_programs(&dir) {
        let folded = dir.path("r.folded");
        let out = superprof()
            .args(["record", "-q", "-o"])
            .arg(&folded)
            .arg("--")
            .arg(&exe)
            .args(["0.3", "7"])
            .output()
            .unwrap();
        assert_no_panic(what, &out, 7);
        let f = Folded::read(&folded);
        assert!(f.total() > 50, "{what}: {} samples", f.total());
        if what.starts_with(".eh_frame") || what.contains("issue") {
            // Symbols are intact: the work is named.
            assert!(f.share_leaf("child_work") > 0.5, "{what}: {:?}", f.0);
        }
        let out = superprof()
            .args(["blocks", "--mode", "sample", "--format", "json", "-o"])
            .arg(dir.path("b.json"))
            .arg("--")
            .arg(&exe)
            .args(["0.3", "7"])
            .output()
            .unwrap();
        // blocks decodes the program's code from its file before it starts it: a file it
        // cannot parse is refused with one line.
        if out.status.code() == Some(7) {
            assert_no_panic(what, &out, 7);
        } else {
            assert_one_line_error(&out, exe.to_str().unwrap());
        }
    }
}

#[test]
fn preload_keeps_a_program_with_a_hostile_elf_alive() {
    let _cpu = cpu_lock();
    let dir = TempDir::new("hostile-elf-preload");
    for (what, exe) in hostile_programs(&dir) {
        let folded = dir.path("p.folded");
        let out = superprof()
            .args(["preload", "-q", "-o"])
            .arg(&folded)
            .arg("--")
            .arg(&exe)
            .args(["0.3", "7"])
            .output()
            .unwrap();
        assert_no_panic(what, &out, 7);
        assert!(Folded::read(&folded).total() > 50, "{what}");
    }
}
