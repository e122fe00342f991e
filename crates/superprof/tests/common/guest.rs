//! Guests under QEMU: Debian's packages unpacked, and a running guest killed when dropped.

use std::path::{Path, PathBuf};
use std::process::Child;

/// The package file in `dir` whose name `wanted` accepts.
pub fn find_deb(dir: &Path, what: &str, wanted: impl Fn(&str) -> bool) -> PathBuf {
    std::fs::read_dir(dir)
        .unwrap_or_else(|e| {
            panic!(
                "{}: {e} (scripts/test downloads the packages)",
                dir.display()
            )
        })
        .filter_map(|e| Some(e.ok()?.path()))
        .find(|p| {
            let n = p.file_name().unwrap().to_string_lossy();
            n.ends_with(".deb") && wanted(&n)
        })
        .unwrap_or_else(|| panic!("no {what} in {} (run scripts/test)", dir.display()))
}

/// The kernel image package: `linux-image-` and a version (not the meta package).
pub fn kernel_deb(dir: &Path) -> PathBuf {
    find_deb(dir, "linux-image-VERSION*.deb", |n| {
        n.strip_prefix("linux-image-")
            .is_some_and(|v| v.starts_with(|c: char| c.is_ascii_digit()))
    })
}

/// A QEMU process, killed when dropped.
pub struct Guest {
    pub child: Child,
}

impl Drop for Guest {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Unpacks the package file `deb` into `into` (dpkg-deb -x).
pub fn unpack(deb: &Path, into: &Path) {
    let out = std::process::Command::new("dpkg-deb")
        .arg("-x")
        .arg(deb)
        .arg(into)
        .output()
        .expect("dpkg-deb runs");
    assert!(
        out.status.success(),
        "dpkg-deb -x {}: {}",
        deb.display(),
        String::from_utf8_lossy(&out.stderr)
    );
}

/// The kernel image of an unpacked kernel package: boot/vmlinuz-*.
pub fn vmlinuz(pkg: &Path) -> PathBuf {
    std::fs::read_dir(pkg.join("boot"))
        .expect("a kernel package (linux-image-N.N...)")
        .filter_map(|e| Some(e.ok()?.path()))
        .find(|p| {
            p.file_name()
                .unwrap()
                .to_string_lossy()
                .starts_with("vmlinuz-")
        })
        .expect("vmlinuz in the kernel package")
}

/// Unpacks the kernel image package and busybox-static of `debs` into `pkg`.
pub fn unpack_kernel_and_busybox(debs: &Path, pkg: &Path) {
    unpack(&kernel_deb(debs), pkg);
    unpack(
        &find_deb(debs, "busybox-static*.deb", |n| {
            n.starts_with("busybox-static")
        }),
        pkg,
    );
}

/// Packs the folder `root` into a gzipped newc initramfs at `out`, with the cpio command
/// `cpio` (the host's, or a busybox's `cpio` applet), files owned by root.
pub fn initramfs(root: &Path, cpio: &str, out: &Path) {
    let packed = std::process::Command::new("sh")
        .arg("-c")
        .arg(format!(
            "cd {} && find . | LC_ALL=C sort | {cpio} -o -H newc -R 0:0 2>/dev/null | gzip -1",
            root.display()
        ))
        .output()
        .expect("sh runs");
    assert!(
        packed.status.success() && packed.stdout.len() > 1000,
        "{cpio} could not pack {}",
        root.display()
    );
    std::fs::write(out, &packed.stdout).unwrap();
}
