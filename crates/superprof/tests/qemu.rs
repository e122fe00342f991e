//! `superprof qemu` on real QEMU (TCG) running test kernels that the tests build: an AArch64
//! kernel for `-M virt` and an x86_64 kernel booted through its PVH note, each spending known
//! shares of its time in known functions under known callers (tests/fixtures/qemu/work.h),
//! and a "user" program placed in guest memory with `-device loader` that the kernel runs.
//! Each kernel also comes laid out like real ones (`-hh`: x86_64 linked at
//! 0xffffffff80000000, AArch64 in TTBR1's half with the MMU on), and with address spaces of
//! its own (`-DSPACES`: two programs at one address, and two instances of one).

mod common;

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use common::*;

#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Arch {
    X86_64,
    Aarch64,
}

struct Kernels {
    kernel: PathBuf,
    user: PathBuf,
}

const CFLAGS: &[&str] = &[
    "-g",
    "-O1",
    "-ffreestanding",
    "-nostdlib",
    "-fno-omit-frame-pointer",
    "-fasynchronous-unwind-tables",
    "-fno-stack-protector",
    "-mgeneral-regs-only",
    "-static",
    "-no-pie",
    "-fno-pic",
    "-Wl,--build-id=none",
];

/// The test kernel laid out like real ones (issue 13): x86_64 linked at 0xffffffff80000000,
/// AArch64 in TTBR1's half with the MMU on, without frame pointers, so that only their CFI
/// unwinds them; their user programs in the lower half. Most tests run on these.
fn build(dir: &TempDir, arch: Arch) -> Kernels {
    match arch {
        Arch::X86_64 => build_with(
            dir,
            arch,
            "-hh",
            &["-mcmodel=kernel", "-fomit-frame-pointer"],
        ),
        Arch::Aarch64 => build_with(dir, arch, "-hh", &["-fomit-frame-pointer"]),
    }
}

/// The test kernel linked low, as hobby kernels often are.
fn build_low(dir: &TempDir, arch: Arch) -> Kernels {
    build_with(dir, arch, "", &[])
}

/// Builds the kernel from `{arch}-start.S`, linked with `{arch}{variant}.ld`, with `flags`
/// added, and the user program.
fn build_with(dir: &TempDir, arch: Arch, variant: &str, flags: &[&str]) -> Kernels {
    let q = fixtures_dir().join("qemu");
    let (cc, prefix, extra): (&str, &str, &[&str]) = match arch {
        Arch::X86_64 => ("gcc", "x86_64", &["-mno-red-zone"]),
        Arch::Aarch64 => ("aarch64-linux-gnu-gcc", "aarch64", &["-mstrict-align"]),
    };
    let out = |name: &str, ld: &str, srcs: &[String], more: &[&str]| {
        let path = dir.path(name);
        let o = Command::new(cc)
            .args(CFLAGS)
            .args(extra)
            .args(more)
            .arg("-T")
            .arg(q.join(ld))
            .arg("-o")
            .arg(&path)
            .args(srcs.iter().map(|s| q.join(s)))
            .output()
            .unwrap_or_else(|e| panic!("{cc} runs (scripts/test installs it): {e}"));
        assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
        path
    };
    Kernels {
        kernel: out(
            &format!("{prefix}-kernel.elf"),
            &format!("{prefix}{variant}.ld"),
            &[format!("{prefix}-start.S"), format!("{prefix}-kernel.c")],
            flags,
        ),
        user: out(
            &format!("{prefix}-user.elf"),
            &format!("{prefix}-user.ld"),
            &[format!("{prefix}-user-start.S"), "user.c".to_owned()],
            &[],
        ),
    }
}

/// The QEMU command line (without sockets) for a kernel and its user program.
fn qemu_command(arch: Arch, k: &Kernels) -> Vec<String> {
    let mut c: Vec<String> = match arch {
        Arch::X86_64 => vec!["qemu-system-x86_64".into(), "-M".into(), "pc".into()],
        Arch::Aarch64 => vec![
            "qemu-system-aarch64".into(),
            "-M".into(),
            "virt".into(),
            "-cpu".into(),
            "cortex-a57".into(),
        ],
    };
    for a in [
        "-m", "128M", "-display", "none", "-serial", "none", "-monitor", "none", "-kernel",
    ] {
        c.push(a.into());
    }
    c.push(k.kernel.display().to_string());
    c.push("-device".into());
    c.push(format!("loader,file={}", k.user.display()));
    c
}

/// QEMU with a gdbstub and a QMP socket for superprof, a QMP socket of the test's own (to read
/// what the guest measured of itself), killed when dropped.
struct Qemu {
    child: Child,
    gdb: PathBuf,
    qmp: PathBuf,
    own: PathBuf,
    /// Where the kernel keeps `measured` (tests/fixtures/qemu/work.h).
    measured: u64,
}

impl Drop for Qemu {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Qemu {
    /// What the guest has measured of itself so far.
    fn measured(&self) -> Measured {
        read_measured(&self.own, self.measured).unwrap()
    }
}

fn start_qemu(dir: &TempDir, arch: Arch, k: &Kernels) -> Qemu {
    start_qemu_with(dir, arch, k, &[])
}

fn start_qemu_with(dir: &TempDir, arch: Arch, k: &Kernels, extra: &[&str]) -> Qemu {
    let gdb = dir.path("gdb.sock");
    let qmp = dir.path("qmp.sock");
    let own = dir.path("own-qmp.sock");
    let mut cmd = qemu_command(arch, k);
    cmd.extend(own_qmp(&own));
    cmd.extend(extra.iter().map(|a| a.to_string()));
    let child = Command::new(&cmd[0])
        .args(&cmd[1..])
        .arg("-gdb")
        .arg(format!("unix:{},server=on,wait=off", gdb.display()))
        .arg("-qmp")
        .arg(format!("unix:{},server=on,wait=off", qmp.display()))
        .stdin(Stdio::null())
        .spawn()
        .expect("QEMU runs (scripts/test installs qemu-system-x86 and qemu-system-arm)");
    wait_for(&[&gdb, &qmp, &own]);
    let measured = symbol(&k.kernel, "measured");
    wait_running(&own, measured);
    Qemu {
        child,
        gdb,
        qmp,
        own,
        measured,
    }
}

/// Waits (20 s at most) until the guest's kernel runs its loop (an upper-half kernel's
/// addresses are mapped from then on): returns what it measured of itself so far.
fn wait_running(sock: &Path, addr: u64) -> Measured {
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        match read_measured(sock, addr) {
            Ok(m) if m.0[Measured::A] > 0 => return m,
            m => assert!(Instant::now() < deadline, "the guest never ran: {m:?}"),
        }
        std::thread::sleep(Duration::from_millis(10));
    }
}

/// QEMU's arguments for the test's own QMP socket.
fn own_qmp(sock: &Path) -> [String; 2] {
    [
        "-qmp".into(),
        format!("unix:{},server=on,wait=off", sock.display()),
    ]
}

/// Waits (20 s at most) for QEMU to open its sockets.
fn wait_for(socks: &[&Path]) {
    let deadline = Instant::now() + Duration::from_secs(20);
    while !socks.iter().all(|s| s.exists()) {
        assert!(Instant::now() < deadline, "QEMU did not open its sockets");
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// A symbol's address in an ELF file, by nm.
fn symbol(elf: &Path, name: &str) -> u64 {
    let nm = Command::new("nm").arg(elf).output().unwrap();
    String::from_utf8_lossy(&nm.stdout)
        .lines()
        .find_map(|l| {
            let mut w = l.split_whitespace();
            let (addr, _, n) = (w.next()?, w.next()?, w.next()?);
            (n == name).then(|| u64::from_str_radix(addr, 16).unwrap())
        })
        .unwrap_or_else(|| panic!("{name} in the symbols of {}", elf.display()))
}

/// One command through a QMP socket (a connection of its own), its `return` as JSON.
fn qmp_command(sock: &Path, command: &str) -> Result<serde_json::Value, String> {
    use std::io::{BufRead, BufReader, Write};
    let s = std::os::unix::net::UnixStream::connect(sock).map_err(|e| e.to_string())?;
    s.set_read_timeout(Some(Duration::from_secs(10)))
        .map_err(|e| e.to_string())?;
    let mut r = BufReader::new(s.try_clone().map_err(|e| e.to_string())?);
    let mut w = s;
    let mut line = String::new();
    r.read_line(&mut line).map_err(|e| e.to_string())?; // greeting
    w.write_all(format!("{{\"execute\":\"qmp_capabilities\"}}\n{command}\n").as_bytes())
        .map_err(|e| e.to_string())?;
    let mut returns = 0;
    loop {
        line.clear();
        if r.read_line(&mut line).map_err(|e| e.to_string())? == 0 {
            return Err(format!("QMP closed: {command}"));
        }
        let v: serde_json::Value = serde_json::from_str(&line).map_err(|e| e.to_string())?;
        if v.get("error").is_some() {
            return Err(format!("{command}: {line}"));
        }
        if let Some(ret) = v.get("return") {
            returns += 1;
            if returns == 2 {
                return Ok(ret.clone());
            }
        }
    }
}

/// The guest's `measured[]` at `addr`, through the monitor's `x` (the guest's virtual
/// addresses, as its first vCPU maps them): superprof's own reader is what is under test.
fn read_measured(sock: &Path, addr: u64) -> Result<Measured, String> {
    let cmd = serde_json::json!({
        "execute": "human-monitor-command",
        "arguments": {"command-line": format!("x /8gx {addr:#x}")},
    });
    let ret = qmp_command(sock, &cmd.to_string())?;
    let text = ret.as_str().unwrap_or_default();
    let words: Vec<u64> = text
        .lines()
        .filter_map(|l| l.split_once(": "))
        .flat_map(|(_, w)| w.split_whitespace())
        .filter_map(|w| u64::from_str_radix(w.trim_start_matches("0x"), 16).ok())
        .collect();
    Ok(Measured(
        words.try_into().map_err(|_| format!("8 words: {text}"))?,
    ))
}

/// The kernel's own measure (work.h): counter ticks in work_a, work_b, the user program,
/// each address space's program, CPU 1's work_c.
#[derive(Clone, Copy, Debug)]
struct Measured([u64; 8]);

impl Measured {
    const A: usize = 0;
    const B: usize = 1;
    const USER: usize = 2;
    const SPACE: usize = 3;

    /// What was measured between `self` (earlier) and `later`.
    fn until(self, later: Measured) -> Measured {
        Measured(std::array::from_fn(|i| later.0[i] - self.0[i]))
    }

    /// The share of `which` among `of`.
    fn share(&self, which: usize, of: &[usize]) -> f64 {
        let total: u64 = of.iter().map(|&i| self.0[i]).sum();
        assert!(total > 0, "the guest measured nothing: {self:?}");
        self.0[which] as f64 / total as f64
    }
}

/// A root frame without its address space (`x86_64-user.elf [as 0x101000]`).
fn without_space(root: &str) -> &str {
    root.split_once(" [as 0x").map_or(root, |(name, _)| name)
}

/// The profile: spin under work_a, under work_b and the user program's loop, each with its full
/// stack down to the entry point, in the shares the kernel measured of itself over the run
/// (about 3/5, 1/5, 1/5): each within 4σ among the samples in these three stacks (the kernel
/// measures nothing else: its boot, kmain's own instructions, the stack switch).
fn assert_known_shares(what: &str, folded: &Path, user: &str, truth: Measured) {
    let f = Folded::read(folded);
    let count = |stack: &str| -> u64 {
        f.0.iter()
            .filter(|(s, _)| {
                let mut s = s[1..].to_vec();
                s[0] = without_space(&s[0]).to_owned();
                s.join(";") == stack
            })
            .map(|(_, n)| n)
            .sum()
    };
    let counts = [
        count("kernel;_start;kmain;work_a;spin"),
        count("kernel;_start;kmain;work_b;spin"),
        count(&format!("{user};_start;user_main;user_spin")),
    ];
    assert_split(what, counts, truth, &format!("{f:?}"));
    let n: u64 = counts.iter().sum();
    assert!(
        n as f64 > 0.9 * f.total() as f64,
        "{what}: stacks not unwound to the entry: {f:?}"
    );
}

/// Samples in work_a, work_b and the user program against the kernel's own split of its time.
fn assert_split(what: &str, counts: [u64; 3], truth: Measured, text: &str) {
    let n: u64 = counts.iter().sum();
    let of = [Measured::A, Measured::B, Measured::USER];
    for (name, got, which) in [
        ("work_a", counts[0], Measured::A),
        ("work_b", counts[1], Measured::B),
        ("user", counts[2], Measured::USER),
    ] {
        assert_share(
            &format!("{what}: {name} ({truth:?}; {text})"),
            got as f64 / n.max(1) as f64,
            truth.share(which, &of),
            n,
        );
    }
}

/// `superprof qemu` with `args` into `name`, and what the guest measured of itself meanwhile.
fn profile(
    dir: &TempDir,
    k: &Kernels,
    q: &Qemu,
    args: &[&str],
    name: &str,
) -> (std::process::Output, PathBuf, Measured) {
    let out_file = dir.path(name);
    let before = q.measured();
    let out = superprof()
        .args(["qemu", "--kernel"])
        .arg(&k.kernel)
        .arg("--user")
        .arg(&k.user)
        .args(args)
        .arg("-o")
        .arg(&out_file)
        .output()
        .unwrap();
    let truth = before.until(q.measured());
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    (out, out_file, truth)
}

fn both_backends(arch: Arch) {
    let _cpu = cpu_lock();
    let dir = TempDir::new(&format!("qemu-{arch:?}"));
    let k = build_low(&dir, arch);
    let q = start_qemu(&dir, arch, &k);
    let user = k.user.file_name().unwrap().to_string_lossy().into_owned();
    let gdb = q.gdb.to_string_lossy().into_owned();
    let (out, folded, truth) = profile(
        &dir,
        &k,
        &q,
        &["--gdb", &gdb, "--interval", "1", "--duration", "3"],
        "gdb.folded",
    );
    assert_known_shares("gdbstub", &folded, &user, truth);
    // Nearly every sample unwound to its entry point (a few land on the stack switch).
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(fully_unwound(&stderr) >= 95.0, "{stderr}");
    let qmp = q.qmp.to_string_lossy().into_owned();
    let (_, folded, truth) = profile(
        &dir,
        &k,
        &q,
        &["--qmp", &qmp, "--interval", "4", "--duration", "3"],
        "qmp.folded",
    );
    assert_known_shares("QMP", &folded, &user, truth);
    // One stack, symbolized, with addresses.
    let out = run_ok(
        superprof()
            .args(["qemu", "--kernel"])
            .arg(&k.kernel)
            .arg("--user")
            .arg(&k.user)
            .args(["--gdb", &gdb, "--one-shot", "--show-addresses"]),
    );
    let text = String::from_utf8_lossy(&out.stdout);
    // (In the kernel it is inside spin, or in kmain's own code between its calls: once at
    // the return from the program, work.h's enter_user.)
    let kernel_stack = text.starts_with("kernel\n") && text.contains(" kmain (");
    // (A sample may land on the program's first instruction: then `_start` is all there is.)
    let user_stack = text.starts_with(&format!("{user} [as 0x"))
        && (text.contains(" user_main (") || text.lines().count() == 2);
    assert!(kernel_stack || user_stack, "{text}");
    assert!(text.contains(" _start ("), "{text}");
    assert!(text.contains("#0  0x0000"), "{text}");
    // Only the kernel's samples, or only the program's.
    for (flag, root) in [("--kernel-only", "kernel"), ("--user-only", user.as_str())] {
        let (_, folded, truth) = profile(
            &dir,
            &k,
            &q,
            &["--gdb", &gdb, "--interval", "2", "--duration", "1", flag],
            "only.folded",
        );
        let f = Folded::read(&folded);
        assert!(f.total() > 20, "{flag}: {f:?}");
        assert!(
            f.0.iter().all(|(s, _)| without_space(&s[1]) == root),
            "{flag}: {f:?}"
        );
        if flag == "--kernel-only" {
            // The kernel's split without the program's time.
            let (a, b) = (f.share_through("work_a"), f.share_through("work_b"));
            assert_share(
                &format!("{flag}: work_a ({truth:?}; {f:?})"),
                a / (a + b),
                truth.share(Measured::A, &[Measured::A, Measured::B]),
                ((a + b) * f.total() as f64).round() as u64,
            );
        }
    }
    // The guest still runs after superprof let go.
    let mut q = q;
    assert!(q.child.try_wait().unwrap().is_none());
}

#[test]
fn aarch64_kernel_through_gdbstub_and_qmp() {
    both_backends(Arch::Aarch64);
}

#[test]
fn x86_64_kernel_through_gdbstub_and_qmp() {
    both_backends(Arch::X86_64);
}

#[test]
fn launch_mode_starts_and_ends_qemu() {
    let _cpu = cpu_lock();
    let dir = TempDir::new("qemu-launch");
    let k = build(&dir, Arch::X86_64);
    let own = dir.path("own-qmp.sock");
    let mut cmd = qemu_command(Arch::X86_64, &k);
    cmd.extend(own_qmp(&own));
    let folded = dir.path("launch.folded");
    let child = superprof()
        .args(["qemu", "--kernel"])
        .arg(&k.kernel)
        .arg("--user")
        .arg(dir.0.as_path())
        .args(["--interval", "1", "--duration", "3", "-o"])
        .arg(&folded)
        .arg("--")
        .args(&cmd)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    // What the guest measured, from QEMU's start to the last read before superprof ended it.
    let addr = symbol(&k.kernel, "measured");
    wait_for(&[&own]);
    let before = wait_running(&own, addr);
    let mut last = before;
    let out = loop {
        match read_measured(&own, addr) {
            Ok(m) => last = m,
            Err(_) => break child.wait_with_output().unwrap(),
        }
        std::thread::sleep(Duration::from_millis(100));
    };
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_known_shares("launch", &folded, "x86_64-user.elf", before.until(last));
    // QEMU is gone.
    let ps = Command::new("pgrep")
        .arg("-f")
        .arg(k.kernel.as_os_str())
        .output()
        .unwrap();
    assert!(
        ps.stdout.is_empty(),
        "QEMU still runs: {}",
        String::from_utf8_lossy(&ps.stdout)
    );
    // Through QMP as well.
    let out = superprof()
        .args(["qemu", "--backend", "qmp", "--kernel"])
        .arg(&k.kernel)
        .args(["--duration", "1", "-o"])
        .arg(dir.path("launch-qmp.folded"))
        .arg("--")
        .args(&cmd)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(Folded::read(&dir.path("launch-qmp.folded")).total() > 20);
}

/// superprof, started with `-v` and its stderr read: returns once it says it samples (20 s at
/// most), with a thread that gives the whole of its stderr at its end.
fn spawn_sampling(cmd: &mut Command) -> (Child, std::thread::JoinHandle<String>) {
    use std::io::{BufRead, BufReader};
    let mut child = cmd.arg("-v").stderr(Stdio::piped()).spawn().unwrap();
    let stderr = child.stderr.take().unwrap();
    let (tx, rx) = std::sync::mpsc::channel();
    let reader = std::thread::spawn(move || {
        let mut all = String::new();
        for line in BufReader::new(stderr).lines().map_while(Result::ok) {
            if line.ends_with(" backend: sampling") {
                let _ = tx.send(());
            }
            all.push_str(&line);
            all.push('\n');
        }
        all
    });
    if rx.recv_timeout(Duration::from_secs(20)).is_err() {
        let _ = child.kill();
        let _ = child.wait();
        panic!(
            "superprof never said it samples: {}",
            reader.join().unwrap()
        );
    }
    (child, reader)
}

/// `superprof qemu` through the gdbstub for 30 s, once it has sampled for a second.
fn profile_for_long(
    k: &Kernels,
    q: &Qemu,
    folded: &Path,
) -> (Child, std::thread::JoinHandle<String>) {
    let started = spawn_sampling(
        superprof()
            .args(["qemu", "--kernel"])
            .arg(&k.kernel)
            .arg("--gdb")
            .arg(&q.gdb)
            .args(["--interval", "1", "--duration", "30", "-o"])
            .arg(folded),
    );
    std::thread::sleep(Duration::from_secs(1));
    started
}

/// On a terminal, a progress line with the samples so far (issue 17); none on a pipe (the
/// other tests).
#[test]
fn a_progress_line_on_a_terminal() {
    let _cpu = cpu_lock();
    let dir = TempDir::new("qemu-progress");
    let k = build(&dir, Arch::Aarch64);
    let q = start_qemu(&dir, Arch::Aarch64, &k);
    let cmd = format!(
        "{} qemu --kernel {} --qmp {} --interval 1 --duration 1.5 -o {}",
        env!("CARGO_BIN_EXE_superprof"),
        k.kernel.display(),
        q.qmp.display(),
        dir.path("p.folded").display()
    );
    let out = run_ok(Command::new("script").args(["-qec", &cmd, "/dev/null"]));
    let text = String::from_utf8_lossy(&out.stdout);
    let lines: Vec<&str> = text
        .split("\r\x1b[K")
        .filter(|l| l.starts_with("[superprof] "))
        .collect();
    assert!(
        lines
            .iter()
            .any(|l| l.contains(" s, ") && l.contains(" samples")),
        "{text:?}"
    );
}

#[test]
fn qemu_ending_mid_run_keeps_the_samples() {
    let _cpu = cpu_lock();
    let dir = TempDir::new("qemu-ends");
    let k = build(&dir, Arch::Aarch64);
    let mut q = start_qemu(&dir, Arch::Aarch64, &k);
    let folded = dir.path("ends.folded");
    let (mut child, reader) = profile_for_long(&k, &q, &folded);
    let _ = q.child.kill();
    let _ = q.child.wait();
    let status = child.wait().unwrap();
    let stderr = reader.join().unwrap();
    assert!(status.success(), "{stderr}");
    assert!(stderr.contains("QEMU ended"), "{stderr}");
    assert!(Folded::read(&folded).total() > 50, "{stderr}");
}

#[test]
fn bad_input_gives_one_line() {
    let dir = TempDir::new("qemu-bad");
    // Frame records in leaf functions too (as Linux builds its frame-pointer kernels), for
    // the stripped copy below.
    let k = build_with(&dir, Arch::Aarch64, "", &["-mno-omit-leaf-frame-pointer"]);
    let kernel = k.kernel.to_string_lossy().into_owned();
    let run = |args: &[&str]| superprof().arg("qemu").args(args).output().unwrap();
    // No socket there.
    let missing = dir.path("nothing.sock").to_string_lossy().into_owned();
    assert_one_line_error(
        &run(&["--kernel", &kernel, "--gdb", &missing]),
        "cannot connect",
    );
    // A socket that is not QEMU's: a listener that says nothing.
    let fake = dir.path("fake.sock");
    let listener = std::os::unix::net::UnixListener::bind(&fake).unwrap();
    let fake = fake.to_string_lossy().into_owned();
    let t = std::thread::spawn(move || {
        let conns: Vec<_> = listener.incoming().take(2).collect();
        std::thread::sleep(Duration::from_secs(7));
        drop(conns);
    });
    assert_one_line_error(
        &run(&["--kernel", &kernel, "--gdb", &fake]),
        "gdb remote protocol",
    );
    assert_one_line_error(
        &run(&["--kernel", &kernel, "--qmp", &fake]),
        "not a QMP socket",
    );
    t.join().unwrap();
    // Not an ELF; no such kernel; no source; QEMU missing in launch mode.
    let text = dir.path("k.txt");
    std::fs::write(&text, "not an elf").unwrap();
    assert_one_line_error(
        &run(&["--kernel", &text.to_string_lossy(), "--gdb", &missing]),
        "not an x86_64 or AArch64 ELF",
    );
    assert_one_line_error(
        &run(&["--kernel", "/no/such/kernel", "--gdb", &missing]),
        "No such file",
    );
    // Issue 31: a device is no kernel (it said "no such file"); a device or FIFO given as a
    // program or as kernel symbols is refused before the guest is touched (they grew without
    // bound, or blocked with the guest stopped).
    assert_one_line_error(
        &run(&["--kernel", "/dev/zero", "--gdb", &missing]),
        "'/dev/zero': is not a regular file",
    );
    assert_one_line_error(
        &run(&[
            "--kernel",
            &kernel,
            "--user",
            "/dev/zero",
            "--gdb",
            &missing,
        ]),
        "is not a regular file",
    );
    let fifo = dir.path("kallsyms.fifo");
    std::fs::remove_file(&fifo).ok();
    assert!(Command::new("mkfifo")
        .arg(&fifo)
        .status()
        .unwrap()
        .success());
    assert_one_line_error(
        &run(&[
            "--kernel",
            &kernel,
            "--kallsyms",
            &fifo.to_string_lossy(),
            "--gdb",
            &missing,
        ]),
        "is not a regular file",
    );
    assert_one_line_error(&run(&["--kernel", &kernel]), "give one of");
    assert_one_line_error(
        &run(&[
            "--kernel",
            &kernel,
            "--",
            "qemu-system-nonexistent",
            "-M",
            "virt",
        ]),
        "qemu-system-nonexistent",
    );
    // The wrong protocol on a real QEMU, and a kernel of another machine than the guest.
    let _cpu = cpu_lock();
    let q = start_qemu(&dir, Arch::Aarch64, &k);
    let x86_dir = TempDir::new("qemu-bad-x86");
    let x86 = build(&x86_dir, Arch::X86_64);
    let gdb = q.gdb.to_string_lossy().into_owned();
    let qmp = q.qmp.to_string_lossy().into_owned();
    assert_one_line_error(
        &run(&["--kernel", &kernel, "--qmp", &gdb]),
        "not a QMP socket",
    );
    assert_one_line_error(
        &run(&["--kernel", &kernel, "--gdb", &qmp]),
        "gdb remote protocol",
    );
    assert_one_line_error(
        &run(&["--kernel", &x86.kernel.to_string_lossy(), "--gdb", &gdb]),
        "the kernel ELF is for x86_64 but the guest is AArch64",
    );
    // Without symbols and unwind tables: a notice, and addresses (leaf frames) in the profile.
    let bare = dir.path("stripped.elf");
    let st = Command::new("aarch64-linux-gnu-objcopy")
        .args(["--strip-all", "--remove-section=.eh_frame"])
        .arg(&k.kernel)
        .arg(&bare)
        .status()
        .unwrap();
    assert!(st.success());
    let folded = dir.path("bare.folded");
    let out = superprof()
        .args(["qemu", "--kernel"])
        .arg(&bare)
        .args(["--gdb", &gdb, "--duration", "1", "-o"])
        .arg(&folded)
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stderr}");
    assert!(stderr.contains("no symbol table"), "{stderr}");
    assert!(stderr.contains("no .eh_frame"), "{stderr}");
    let f = Folded::read(&folded);
    let kernel: Vec<_> = f.0.iter().filter(|(s, _)| s[1] == "kernel").collect();
    assert!(!kernel.is_empty(), "{f:?}");
    assert!(
        kernel
            .iter()
            .all(|(s, _)| s[2..].iter().all(|fr| fr.starts_with("stripped.elf+0x"))),
        "{f:?}"
    );
    // Built with frame pointers: the chains of frame records unwind it to _start (spin,
    // work_a or work_b, kmain, _start: the record of kmain holds _start's null frame pointer,
    // the end), and such stacks count as fully unwound. Samples in kmain's own code (its
    // counter reads, `isb` and `mrs`, slow under TCG: about a tenth of the kernel's) are
    // kmain and _start alone; which those are, the unstripped kernel's symbols say. A kernel
    // sample at an exception vector's first instructions may be cut short (see below): up to
    // 3 others.
    let nm = Command::new("aarch64-linux-gnu-nm")
        .arg(&k.kernel)
        .output()
        .unwrap();
    let symbol = |name: &str| {
        String::from_utf8_lossy(&nm.stdout)
            .lines()
            .find_map(|l| {
                let mut w = l.split_whitespace();
                let (a, _, n) = (w.next()?, w.next()?, w.next()?);
                (n == name).then(|| u64::from_str_radix(a, 16).ok())?
            })
            .unwrap_or_else(|| panic!("no {name} in the kernel's symbols"))
    };
    let kmain = symbol("kmain")..symbol("work_c");
    let leaf = |s: &[String]| {
        s.last()
            .and_then(|f| f.strip_prefix("stripped.elf+0x"))
            .and_then(|a| u64::from_str_radix(a, 16).ok())
    };
    let n: u64 = kernel.iter().map(|(_, n)| n).sum();
    let short: u64 = kernel
        .iter()
        .filter(|(s, _)| {
            s.len() != 6 && !(s.len() == 4 && leaf(s).is_some_and(|a| kmain.contains(&a)))
        })
        .map(|(_, n)| n)
        .sum();
    assert!(short <= 3, "{short} of {n} cut short: {f:?}");
    let unwound: f64 = stderr
        .split("% fully unwound")
        .next()
        .and_then(|s| s.rsplit(' ').next())
        .and_then(|p| p.parse().ok())
        .unwrap_or(0.0);
    // (The user program's samples, no --user given, are unknown code: not unwound.) A kernel
    // sample at an exception vector's first instructions, where x29 still holds the user's
    // frame pointer, chains into memory the kernel's tables do not map ("unreadable memory":
    // 1 of 100 samples seen once in many runs): up to 3 such samples are allowed.
    let kernel_share = 100.0 * n as f64 / f.total() as f64;
    let allowed = 3.0 * 100.0 / f.total() as f64 + 0.5;
    assert!(
        unwound >= kernel_share - allowed,
        "{kernel_share}: {stderr}"
    );
    // Linux's own unwind tables (ORC, as in Debian's kernels) and no .eh_frame: said so.
    let orc_data = dir.path("orc.bin");
    std::fs::write(&orc_data, [0u8; 12]).unwrap();
    let orc = dir.path("orc.elf");
    let st = Command::new("aarch64-linux-gnu-objcopy")
        .arg("--remove-section=.eh_frame")
        .arg(format!("--add-section=.orc_unwind={}", orc_data.display()))
        .arg(&k.kernel)
        .arg(&orc)
        .status()
        .unwrap();
    assert!(st.success());
    let out = superprof()
        .args(["qemu", "--kernel"])
        .arg(&orc)
        .args(["--gdb", &gdb, "--duration", "0.5", "-o"])
        .arg(dir.path("orc.folded"))
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stderr}");
    let notice: Vec<&str> = stderr.lines().filter(|l| l.contains("ORC")).collect();
    assert_eq!(notice.len(), 1, "{stderr}");
    assert!(notice[0].contains("frame pointers"), "{stderr}");
}

#[test]
fn ctrl_c_keeps_the_samples_and_the_guest_runs_on() {
    stop_signal_keeps_the_samples_and_the_guest_runs_on("INT", "--gdb", 100);
}

/// SIGHUP (a dropped ssh session) through QMP, which stops the guest at every sample: it
/// must be resumed (issue 12).
#[test]
fn sighup_through_qmp_keeps_the_samples_and_the_guest_runs_on() {
    stop_signal_keeps_the_samples_and_the_guest_runs_on("HUP", "--qmp", 10);
}

fn stop_signal_keeps_the_samples_and_the_guest_runs_on(signal: &str, backend: &str, min: u64) {
    let _cpu = cpu_lock();
    let dir = TempDir::new("qemu-stopsig");
    let k = build(&dir, Arch::Aarch64);
    let q = start_qemu(&dir, Arch::Aarch64, &k);
    let folded = dir.path("int.folded");
    let (mut child, reader) = spawn_sampling(
        superprof()
            .args(["qemu", "--kernel"])
            .arg(&k.kernel)
            .arg(backend)
            .arg(if backend == "--gdb" { &q.gdb } else { &q.qmp })
            .args(["--interval", "1", "--duration", "30", "-o"])
            .arg(&folded),
    );
    // A second of sampling, then the signal.
    std::thread::sleep(Duration::from_secs(1));
    Command::new("kill")
        .args([&format!("-{signal}"), &child.id().to_string()])
        .status()
        .unwrap();
    let status = child.wait().unwrap();
    let stderr = reader.join().unwrap();
    assert!(status.success(), "{stderr}");
    assert!(Folded::read(&folded).total() > min, "{stderr}");
    // The guest was let go: QMP says it runs.
    use std::io::{BufRead, BufReader, Write};
    let s = std::os::unix::net::UnixStream::connect(&q.qmp).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    let mut r = BufReader::new(s.try_clone().unwrap());
    let mut w = s;
    let mut line = String::new();
    r.read_line(&mut line).unwrap(); // greeting
    w.write_all(b"{\"execute\":\"qmp_capabilities\"}\n{\"execute\":\"query-status\"}\n")
        .unwrap();
    let mut status = String::new();
    while !status.contains("\"status\"") {
        status.clear();
        r.read_line(&mut status).unwrap();
    }
    assert!(status.contains("\"running\""), "{status}");
}

#[test]
fn every_vcpu_of_an_smp_guest_is_sampled() {
    let _cpu = cpu_lock();
    let dir = TempDir::new("qemu-smp");
    let k = build(&dir, Arch::Aarch64);
    // CPU 1, started by the kernel through PSCI, spends all its time in spin under work_c.
    let q = start_qemu_with(&dir, Arch::Aarch64, &k, &["-smp", "2"]);
    let user = k.user.file_name().unwrap().to_string_lossy().into_owned();
    for (backend, args) in [
        (
            "gdbstub",
            vec!["--gdb", q.gdb.to_str().unwrap(), "--interval", "1"],
        ),
        (
            "QMP",
            vec!["--qmp", q.qmp.to_str().unwrap(), "--interval", "4"],
        ),
    ] {
        let mut args = args;
        args.extend(["--duration", "2"]);
        let (out, folded, truth) = profile(&dir, &k, &q, &args, "smp.folded");
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(stderr.contains("over 2 vCPUs"), "{backend}: {stderr}");
        let f = Folded::read(&folded);
        let count = |vcpu: &str, pred: &dyn Fn(&[String]) -> bool| -> u64 {
            f.0.iter()
                .filter(|(s, _)| s[0] == vcpu && pred(s))
                .map(|(_, n)| n)
                .sum()
        };
        let cpu1 = count("vcpu1", &|_| true);
        let cpu1_c = count("vcpu1", &|s| {
            s.join(";")
                .ends_with("kernel;secondary_start;kmain2;work_c;spin")
        });
        assert!(
            cpu1 > 50 && cpu1_c as f64 >= 0.9 * cpu1 as f64,
            "{backend}: {f:?}"
        );
        // CPU 0 keeps its split.
        let cpu0 = count("vcpu0", &|_| true) as f64;
        let a = count("vcpu0", &|s| {
            s.join(";").ends_with("kernel;_start;kmain;work_a;spin")
        });
        let b = count("vcpu0", &|s| {
            s.join(";").ends_with("kernel;_start;kmain;work_b;spin")
        });
        let u = count("vcpu0", &|s| {
            without_space(&s[1]) == user && s.join(";").ends_with("_start;user_main;user_spin")
        });
        assert!((a + b + u) as f64 > 0.9 * cpu0, "{backend}: {f:?}");
        // Within 4σ of what CPU 0 measured of itself over the run.
        assert_split(
            &format!("{backend}: vCPU 0"),
            [a, b, u],
            truth,
            &format!("{f:?}"),
        );
        // Each vCPU's stacks are its own.
        let elsewhere = count("vcpu0", &|s| s.iter().any(|x| x == "kmain2"));
        assert_eq!(elsewhere, 0, "{backend}: {f:?}");
    }
}

/// memsave at an address in the upper half (2^63 and up, where real kernels live) is asked
/// as QEMU wants it (a signed integer). The test kernel maps its first GiB both at 0 and at
/// 0xffffffff80000000: the same bytes through both; an address mapped nowhere reads nothing,
/// without an error (a refusal of the request itself would be an error, not "unmapped";
/// issue 13).
#[test]
fn qmp_reads_upper_half_addresses() {
    use superprof_qemu::Backend;
    let _cpu = cpu_lock();
    let dir = TempDir::new("qemu-upper");
    let k = build_low(&dir, Arch::X86_64);
    let q = start_qemu(&dir, Arch::X86_64, &k);
    let mut b = superprof_qemu::Qmp::connect(q.qmp.to_str().unwrap()).unwrap();
    // (start_qemu waits for the kernel's loop: the guest is in long mode.)
    b.stop().unwrap();
    let (mut low, mut high) = ([0u8; 64], [0u8; 64]);
    // The kernel's own code at 1 MiB, and the same physical page seen from the upper half.
    assert_eq!(b.read(0x10_0000, &mut low).unwrap(), 64);
    assert_eq!(b.read(0xffff_ffff_8010_0000, &mut high).unwrap(), 64);
    assert_eq!(low, high);
    assert!(low.iter().any(|&x| x != 0));
    assert_eq!(b.read(0xffff_8000_0000_0000, &mut high).unwrap(), 0);
    b.resume().unwrap();
}

/// A kernel in the upper half, without frame pointers, through both backends: full stacks
/// from its CFI (before issue 13 every stack stopped at the leaf, and the statistics line
/// still said "100.0% fully unwound"; QMP read nothing at all up there).
#[test]
fn x86_64_higher_half_kernel_through_gdbstub_and_qmp() {
    let _cpu = cpu_lock();
    let (dir, k, q) = higher_half_on_both_backends(Arch::X86_64);
    let user = k.user.file_name().unwrap().to_string_lossy().into_owned();
    // The same kernel as if KASLR had moved it: an ELF whose addresses are all 2 MiB lower
    // than where the guest runs it. The slide is found in guest memory, through both backends,
    // and the profile is the same.
    let moved = dir.path("x86_64-kernel-moved.elf");
    let st = Command::new("objcopy")
        .args(["--change-addresses", "-0x200000"])
        .arg(&k.kernel)
        .arg(&moved)
        .status()
        .unwrap();
    assert!(st.success());
    let moved_k = Kernels {
        kernel: moved,
        user: k.user.clone(),
    };
    for (backend, sock, interval) in [("--gdb", &q.gdb, "1"), ("--qmp", &q.qmp, "4")] {
        let sock = sock.to_string_lossy().into_owned();
        let (out, folded, truth) = profile(
            &dir,
            &moved_k,
            &q,
            &[backend, &sock, "--interval", interval, "--duration", "3"],
            "moved.folded",
        );
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(
            stderr
                .contains("runs 0x200000 above its link addresses (KASLR): found in guest memory"),
            "{backend}: {stderr}"
        );
        assert_known_shares(backend, &folded, &user, truth);
    }
}

/// Issue 13, item 4: processes told apart by address space. The upper-half kernel built with
/// SPACES runs three address spaces of its own (CR3 on x86_64, TTBR0_EL1 on AArch64), each
/// mapping USER_BASE to its own copy of a program: the user program in the first and third
/// (two instances), and user-b.c, linked at the same address with other code, in the second,
/// for 1, 2 and 1 UNITs a round. Every user sample has its address space's root frame, with
/// the program found in that space (`x86_64-user.elf [as 0x...]`, the root the kernel set),
/// the right program's functions under it, and each space's share within 4σ of the time the
/// kernel measured in it (about 1:2:1). (Before, every
/// sample went to the first program found, as one process.) QMP cannot read TTBR0_EL1.
fn address_spaces(arch: Arch) {
    let _cpu = cpu_lock();
    let dir = TempDir::new(&format!("qemu-spaces-{arch:?}"));
    let (prefix, cc, objcopy, flags, phys, table, vma): (_, _, _, &[&str], u64, _, u64) = match arch
    {
        Arch::X86_64 => (
            "x86_64",
            "gcc",
            "objcopy",
            &["-mcmodel=kernel", "-fomit-frame-pointer", "-DSPACES"],
            0x1000000,
            "space_pml4",
            0xffffffff80000000,
        ),
        Arch::Aarch64 => (
            "aarch64",
            "aarch64-linux-gnu-gcc",
            "aarch64-linux-gnu-objcopy",
            &["-fomit-frame-pointer", "-DSPACES"],
            0x44000000,
            "space_l0",
            0xffff000000000000,
        ),
    };
    let k = build_with(&dir, arch, "-hh", flags);
    let q = fixtures_dir().join("qemu");
    let user_b = dir.path(&format!("{prefix}-user-b.elf"));
    let o = Command::new(cc)
        .args(CFLAGS)
        .arg(match arch {
            Arch::X86_64 => "-mno-red-zone",
            Arch::Aarch64 => "-mstrict-align",
        })
        .arg("-T")
        .arg(q.join(format!("{prefix}-user.ld")))
        .arg("-o")
        .arg(&user_b)
        .arg(q.join(format!("{prefix}-user-start.S")))
        .arg(q.join("user-b.c"))
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    // Raw images, for the loader to place at physical addresses of our choosing.
    let raw = |elf: &Path, name: &str| {
        let bin = dir.path(name);
        let o = Command::new(objcopy)
            .args(["-O", "binary"])
            .arg(elf)
            .arg(&bin)
            .output()
            .unwrap();
        assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
        bin.display().to_string()
    };
    let (a_bin, b_bin) = (raw(&k.user, "a.bin"), raw(&user_b, "b.bin"));
    let loaders: Vec<String> = [(&a_bin, 0), (&b_bin, 1), (&a_bin, 2)]
        .iter()
        .map(|(f, i)| format!("loader,file={f},addr={:#x},force-raw=on", phys + (i << 21)))
        .collect();
    let mut extra = Vec::new();
    for l in &loaders {
        extra.extend(["-device", l.as_str()]);
    }
    let qemu = start_qemu_with(&dir, arch, &k, &extra);
    // Each space's root: the physical address of its top-level table.
    let tables = symbol(&k.kernel, table);
    let root = |i: u64| tables - vma + i * 4096;
    let a = k.user.file_name().unwrap().to_string_lossy().into_owned();
    let b = user_b.file_name().unwrap().to_string_lossy().into_owned();
    // Each space's program, its hot function, and the functions of the other program (at the
    // same addresses), which a stack in that space must never name.
    let want = [
        (
            format!("{a} [as {:#x}]", root(0)),
            "user_spin",
            &["b_work", "b_spin"][..],
        ),
        (
            format!("{b} [as {:#x}]", root(1)),
            "b_spin",
            &["user_spin"][..],
        ),
        (
            format!("{a} [as {:#x}]", root(2)),
            "user_spin",
            &["b_work", "b_spin"][..],
        ),
    ];
    let spaces: Vec<usize> = (0..3).map(|i| Measured::SPACE + i).collect();
    let mut backends = vec![("--gdb", &qemu.gdb, "1")];
    if arch == Arch::X86_64 {
        backends.push(("--qmp", &qemu.qmp, "2"));
    }
    for (backend, sock, interval) in backends {
        let out_file = dir.path("spaces.folded");
        let _ = std::fs::remove_file(&out_file);
        let before = qemu.measured();
        let out = superprof()
            .args(["qemu", "--user-only", "--kernel"])
            .arg(&k.kernel)
            .arg("--user")
            .arg(&k.user)
            .arg("--user")
            .arg(&user_b)
            .arg(backend)
            .arg(sock)
            .args(["--interval", interval, "--duration", "3", "-o"])
            .arg(&out_file)
            .output()
            .unwrap();
        let truth = before.until(qemu.measured());
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(out.status.success(), "{stderr}");
        let f = Folded::read(&out_file);
        let total = f.total();
        assert!(total > 100, "{backend}: {total} user samples: {stderr}");
        for (i, (root, hot, foreign)) in want.iter().enumerate() {
            let under: Vec<_> = f.0.iter().filter(|(s, _)| s.get(1) == Some(root)).collect();
            let n: u64 = under.iter().map(|(_, n)| n).sum();
            let wrong: u64 = under
                .iter()
                .filter(|(s, _)| s.iter().any(|fr| foreign.contains(&fr.as_str())))
                .map(|(_, n)| n)
                .sum();
            let in_hot: u64 = under
                .iter()
                .filter(|(s, _)| s.iter().any(|fr| fr == hot))
                .map(|(_, n)| n)
                .sum();
            assert_share(
                &format!("{arch:?} {backend}: {root} ({truth:?}; {:?})", f.0),
                n as f64 / total as f64,
                truth.share(Measured::SPACE + i, &spaces),
                total,
            );
            // The program found in that space, never the one at the same address elsewhere;
            // and its hot function found in it (its loop calls it: most samples are there).
            assert_eq!(
                wrong, 0,
                "{arch:?} {backend}: {root}: {wrong} of {n} stacks name the other program's \
                 functions: {:?}",
                f.0
            );
            assert!(
                in_hot * 2 > n,
                "{arch:?} {backend}: {root}: {in_hot} of {n} stacks in {hot}: {:?}",
                f.0
            );
        }
    }
}

#[test]
fn x86_64_address_spaces_tell_programs_and_instances_apart() {
    address_spaces(Arch::X86_64);
}

#[test]
fn aarch64_address_spaces_tell_programs_and_instances_apart() {
    address_spaces(Arch::Aarch64);
}

/// Issue 13, item 2: the AArch64 kernel in TTBR1's half (0xffff000040085000 and up, MMU on,
/// no frame pointers), its user program in TTBR0's: both unwind from their CFI through both
/// backends.
#[test]
fn aarch64_higher_half_kernel_through_gdbstub_and_qmp() {
    let _cpu = cpu_lock();
    higher_half_on_both_backends(Arch::Aarch64);
}

/// The upper-half kernel of `arch` profiled through the gdbstub and QMP: the kernel's own
/// split of its time, and 95% of the samples unwound to their entry point. Returns the
/// folder, the kernels and the QEMU that runs them, for more.
fn higher_half_on_both_backends(arch: Arch) -> (TempDir, Kernels, Qemu) {
    let dir = TempDir::new(&format!("qemu-higher-half-{arch:?}"));
    let k = build(&dir, arch);
    let q = start_qemu(&dir, arch, &k);
    let user = k.user.file_name().unwrap().to_string_lossy().into_owned();
    for (backend, sock, interval) in [("--gdb", &q.gdb, "1"), ("--qmp", &q.qmp, "4")] {
        let sock = sock.to_string_lossy().into_owned();
        let (out, folded, truth) = profile(
            &dir,
            &k,
            &q,
            &[backend, &sock, "--interval", interval, "--duration", "3"],
            "hh.folded",
        );
        assert_known_shares(&format!("{arch:?} {backend}"), &folded, &user, truth);
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(
            fully_unwound(&stderr) >= 95.0,
            "{arch:?} {backend}: {stderr}"
        );
    }
    (dir, k, q)
}

/// The share of samples fully unwound, from superprof qemu's statistics line.
fn fully_unwound(stderr: &str) -> f64 {
    stderr
        .split("% fully unwound")
        .next()
        .and_then(|s| s.rsplit(' ').next())
        .and_then(|p| p.parse().ok())
        .unwrap_or_else(|| panic!("no statistics: {stderr}"))
}
