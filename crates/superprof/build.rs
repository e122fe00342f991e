//! The installed binary stays small (issue 17): its DWARF (line tables of superprof's own code
//! and the standard library's) is compressed at link time, with zstd where the linker can
//! (binutils 2.40), else zlib. superprof's symbolizer, gdb, addr2line and readelf read
//! compressed sections, as Debian's debug files have them.

#![allow(clippy::disallowed_macros)] // cargo reads a build script's stdout

use std::io::Write;
use std::process::{Command, Stdio};

fn main() {
    println!("cargo:rerun-if-changed=build.rs");
    if std::env::var("CARGO_CFG_TARGET_OS").as_deref() != Ok("linux") {
        return;
    }
    let linker = std::env::var("RUSTC_LINKER").unwrap_or_else(|_| "cc".to_owned());
    let out = std::env::var("OUT_DIR").unwrap_or_else(|_| ".".to_owned());
    for kind in ["zstd", "zlib"] {
        let flag = format!("-Wl,--compress-debug-sections={kind}");
        if links(&linker, &flag, &format!("{out}/probe-{kind}")) {
            println!("cargo:rustc-link-arg-bins={flag}");
            return;
        }
    }
}

/// Whether `linker` links a C program with `flag`.
fn links(linker: &str, flag: &str, output: &str) -> bool {
    let Ok(mut child) = Command::new(linker)
        .args(["-x", "c", "-", "-g", "-o", output, flag])
        .stdin(Stdio::piped())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
    else {
        return false;
    };
    if let Some(mut stdin) = child.stdin.take() {
        let _ = stdin.write_all(b"int main(void) { return 0; }\n");
    }
    child.wait().is_ok_and(|s| s.success())
}
