//! `superprof qemu` on a real Linux guest (issue 13): Debian's own x86_64 kernel (stripped,
//! ORC unwind tables only, KASLR on), booted under TCG with a busybox initramfs that runs two
//! instances of one static program and one of another, both linked at the same addresses with
//! different code. The packages come from Debian (scripts/test downloads them into
//! target/test-deps/linux-guest); the kernel ELF is taken out of the bzImage here, and the
//! guest's /proc/kallsyms comes out on its second serial port.

mod common;

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use common::guest::*;
use common::*;

fn debs() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../target/test-deps/linux-guest")
}

/// The kernel ELF inside a bzImage: the compressed payload (where the boot header says) run
/// through xz, which Debian compresses its kernels with.
fn vmlinux_from_bzimage(bz: &Path, out: &Path) {
    let d = std::fs::read(bz).unwrap();
    assert_eq!(&d[0x202..0x206], b"HdrS", "not a bzImage");
    let setup = (if d[0x1f1] == 0 { 4 } else { d[0x1f1] as usize } + 1) * 512;
    let word = |at: usize| u32::from_le_bytes(d[at..at + 4].try_into().unwrap()) as usize;
    let (off, len) = (setup + word(0x248), word(0x24c));
    let payload = &d[off..off + len];
    assert_eq!(
        &payload[..6],
        b"\xfd7zXZ\0",
        "Debian's kernels are xz-compressed"
    );
    let mut xz = Command::new("xz")
        .args(["-dc", "--single-stream"])
        .stdin(Stdio::piped())
        .stdout(std::fs::File::create(out).unwrap())
        .spawn()
        .expect("xz (scripts/test installs xz-utils)");
    use std::io::Write;
    xz.stdin.take().unwrap().write_all(payload).unwrap();
    assert!(xz.wait().unwrap().success());
}

#[test]
fn debian_kernel_processes_kaslr_and_symbols() {
    let _cpu = cpu_lock();
    let dir = TempDir::new("linux-guest");
    let debs = debs();
    // The kernel package and busybox, unpacked.
    let pkg = dir.path("pkg");
    // (linux-image-6.1.0-56-amd64_...deb: the versioned package, not the meta one.)
    unpack_kernel_and_busybox(&debs, &pkg);
    let vmlinuz = vmlinuz(&pkg);
    let vmlinux = dir.path("vmlinux");
    vmlinux_from_bzimage(&vmlinuz, &vmlinux);
    // The programs, and the initramfs (busybox's own cpio).
    let root = dir.path("root");
    for d in ["bin", "proc", "dev"] {
        std::fs::create_dir_all(root.join(d)).unwrap();
    }
    let fx = fixtures_dir().join("linux");
    let mut progs = Vec::new();
    for p in ["prog_a", "prog_b"] {
        let exe = dir.path(p);
        run_ok(
            Command::new("gcc")
                .args([
                    "-static",
                    "-no-pie",
                    "-O2",
                    "-g",
                    "-fno-omit-frame-pointer",
                    "-o",
                ])
                .arg(&exe)
                .arg(fx.join(format!("{p}.c"))),
        );
        std::fs::copy(&exe, root.join("bin").join(p)).unwrap();
        progs.push(exe);
    }
    let busybox = pkg.join("bin/busybox");
    std::fs::copy(&busybox, root.join("bin/busybox")).unwrap();
    for a in ["sh", "mount", "grep", "sleep", "echo"] {
        std::os::unix::fs::symlink("busybox", root.join("bin").join(a)).unwrap();
    }
    std::fs::copy(fx.join("init"), root.join("init")).unwrap();
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(root.join("init"), std::fs::Permissions::from_mode(0o755)).unwrap();
    let initrd = dir.path("initrd.gz");
    initramfs(&root, &format!("{} cpio", busybox.display()), &initrd);
    // Boot: the console on the first serial port, kallsyms on the second.
    let (console, kallsyms) = (dir.path("console.txt"), dir.path("kallsyms.txt"));
    let (gdb, qmp) = (dir.path("gdb.sock"), dir.path("qmp.sock"));
    let _guest = Guest {
        child: Command::new("qemu-system-x86_64")
            .args([
                "-M", "pc", "-cpu", "max", "-smp", "1", "-m", "512M", "-display", "none",
            ])
            .args(["-no-reboot", "-monitor", "none", "-serial"])
            .arg(format!("file:{}", console.display()))
            .arg("-serial")
            .arg(format!("file:{}", kallsyms.display()))
            .arg("-kernel")
            .arg(&vmlinuz)
            .arg("-initrd")
            .arg(&initrd)
            .args(["-append", "console=ttyS0 quiet panic=-1", "-gdb"])
            .arg(format!("unix:{},server=on,wait=off", gdb.display()))
            .arg("-qmp")
            .arg(format!("unix:{},server=on,wait=off", qmp.display()))
            .stdin(Stdio::null())
            .spawn()
            .expect("qemu-system-x86_64"),
    };
    let deadline = Instant::now() + Duration::from_secs(90);
    loop {
        let text = std::fs::read_to_string(&console).unwrap_or_default();
        if text.contains("init: programs started") {
            break;
        }
        assert!(
            Instant::now() < deadline && !text.contains("Failed to execute /init"),
            "the guest did not start: {text}"
        );
        std::thread::sleep(Duration::from_millis(200));
    }
    // The slide, from the guest's own kallsyms, and a System.map (link addresses) made from it.
    let ks = std::fs::read_to_string(&kallsyms).unwrap();
    let text_at = |t: &str| {
        t.lines().find_map(|l| {
            let mut p = l.split_whitespace();
            let a = u64::from_str_radix(p.next()?, 16).ok()?;
            (p.nth(1)? == "_stext").then_some(a)
        })
    };
    let running = text_at(&ks).expect("_stext in the guest's kallsyms");
    let readelf = run_ok(Command::new("readelf").args(["-SW"]).arg(&vmlinux));
    let linked = String::from_utf8_lossy(&readelf.stdout)
        .lines()
        .find_map(|l| {
            let l = l.split_once(']')?.1;
            let mut p = l.split_whitespace();
            (p.next()? == ".text").then(|| u64::from_str_radix(p.nth(1)?, 16).ok())?
        })
        .expect(".text in vmlinux");
    let slide = running.wrapping_sub(linked);
    let map = dir.path("System.map");
    let lines: String = ks
        .lines()
        .filter_map(|l| {
            let mut p = l.split_whitespace();
            let a = u64::from_str_radix(p.next()?, 16).ok()?;
            Some(format!(
                "{:016x} {} {}\n",
                a.wrapping_sub(slide),
                p.next()?,
                p.next()?
            ))
        })
        .collect();
    std::fs::write(&map, lines).unwrap();

    for (backend, sock, symbols, interval) in
        [("--gdb", &gdb, &map, "2"), ("--qmp", &qmp, &kallsyms, "5")]
    {
        let folded = dir.path("guest.folded");
        let out = superprof()
            .args(["qemu", "--kernel"])
            .arg(&vmlinux)
            .arg("--kallsyms")
            .arg(symbols)
            .arg("--user")
            .arg(&progs[0])
            .arg("--user")
            .arg(&progs[1])
            .arg(backend)
            .arg(sock)
            .args(["--interval", interval, "--duration", "3", "-o"])
            .arg(&folded)
            .output()
            .unwrap();
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(out.status.success(), "{backend}: {stderr}");
        // Debian's kernel: ORC only, said once.
        assert_eq!(stderr.matches("ORC").count(), 1, "{stderr}");
        // The slide: found in guest memory (System.map: link addresses), or read from kallsyms.
        if slide != 0 {
            let how = if backend == "--gdb" {
                "found in guest memory"
            } else {
                "as"
            };
            let said = format!("runs {slide:#x} above its link addresses (KASLR)");
            assert!(
                stderr.contains(&said) && stderr.contains(how),
                "{backend}: want '{said}': {stderr}"
            );
        }
        let f = Folded::read(&folded);
        // Three processes, each its own root: prog_a twice, prog_b once, a third of the user
        // samples each within 4σ, each with its own program's functions.
        let mut roots: std::collections::BTreeMap<String, (u64, u64)> = Default::default();
        for (s, n) in &f.0 {
            let r = &s[1];
            if r.starts_with("prog_") {
                let e = roots.entry(r.clone()).or_default();
                e.0 += n;
                let own = if r.starts_with("prog_a") {
                    s.join(";").ends_with("main;a_outer;a_mid;a_work")
                } else {
                    s.iter().any(|x| x == "b_work")
                };
                if own {
                    e.1 += n;
                }
            }
        }
        let names: Vec<&str> = roots
            .keys()
            .map(|r| r.split_once(" [as 0x").unwrap().0)
            .collect();
        assert_eq!(
            names,
            ["prog_a", "prog_a", "prog_b"],
            "{backend}: {roots:?}"
        );
        let user: u64 = roots.values().map(|v| v.0).sum();
        assert!(user > 100, "{backend}: {roots:?}");
        let sigma = (2.0 / 9.0 / user as f64).sqrt();
        for (r, (n, own)) in &roots {
            let p = *n as f64 / user as f64;
            assert!(
                (p - 1.0 / 3.0).abs() < 4.0 * sigma,
                "{backend}: {r} {n} of {user}: {roots:?}"
            );
            assert!(*own as f64 >= 0.9 * *n as f64, "{backend}: {r}: {roots:?}");
        }
        // Kernel samples (the timer tick, the scheduler) are named from the symbols file.
        let kernel: Vec<_> = f.0.iter().filter(|(s, _)| s[1] == "kernel").collect();
        let named = kernel
            .iter()
            .filter(|(s, _)| s[2..].iter().all(|x| !x.starts_with("vmlinux+0x")))
            .count();
        assert!(
            !kernel.is_empty() && named as f64 >= 0.9 * kernel.len() as f64,
            "{backend}: {kernel:?}"
        );
    }
}
