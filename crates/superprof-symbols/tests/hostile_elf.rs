//! Symbols of hostile files (issue 12, item 8): a real program compiled with gcc, its section
//! headers, program headers and symbols corrupted one at a time. Symbolizing never panics; a
//! file whose symbol and debug sections are intact still names its functions when only its
//! unwind sections are broken.

#[path = "../../../tests/fixtures/elf_patch.rs"]
mod elf_patch;

use std::path::{Path, PathBuf};

use elf_patch::{Elf, SymField};
use superprof_symbols::Symbolizer;

fn fixture(dir: &Path) -> PathBuf {
    elf_patch::compile_child(&Path::new(env!("CARGO_MANIFEST_DIR")).join("../.."), dir)
}

#[test]
fn corrupted_headers_never_panic_the_symbolizer() {
    let dir = std::env::temp_dir().join(format!("superprof-symbols-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    let exe = fixture(&dir);
    let original = Elf::read(&exe);
    let addr = original.symbol("child_work", SymField::Value) + 4;
    let named = |frames: &[superprof_symbols::SymFrame]| {
        frames
            .iter()
            .any(|f| f.function.as_deref() == Some("child_work"))
    };
    assert!(named(&Symbolizer::default().symbolize(&exe, &exe, addr)));
    let mut failures = Vec::new();
    for (i, (what, elf)) in elf_patch::hostile_variants(&original).iter().enumerate() {
        let path = dir.join(format!("v{i}"));
        elf.write(&path);
        let result = std::panic::catch_unwind(|| {
            let mut s = Symbolizer::default();
            s.preload(&path, &path);
            let frames = s.symbolize(&path, &path, addr);
            let _ = s.line_rows(&path, &path, "exec_child.c", 1..=40);
            let _ = s.inlined_sites(&path, &path, "child_work");
            frames
        });
        match result {
            Err(_) => failures.push(format!("{what}: panicked")),
            Ok(frames) if what.starts_with(".eh_frame") && !named(&frames) => {
                failures.push(format!("{what}: {frames:?}"))
            }
            Ok(_) => {}
        }
    }
    let _ = std::fs::remove_dir_all(&dir);
    assert!(failures.is_empty(), "{failures:#?}");
}
