//! Issue 12, item 11: a bounded fuzz pass over what superprof reads from others. Real inputs
//! (a compiled ELF with DWARF, a recorded Parquet profile, the replies of a QMP and a gdbstub
//! session) are mutated at random, a few seconds each, and fed to the parsers and clients:
//! none may panic, every call must return, and memory must stay bounded.
//!
//! The pass is deterministic for a seed (`SUPERPROF_FUZZ_SEED`, default fixed);
//! `SUPERPROF_FUZZ_SECS` sets the seconds per target (default 3). A failing input is kept in
//! `target/fuzz-failures/` and named in the failure.
#![allow(clippy::disallowed_macros)] // a test's own diagnostics

mod common;

use common::*;
use std::ops::Range;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// xorshift64*: small, fast, and the same everywhere for a seed.
struct Rng(u64);

impl Rng {
    fn new(salt: u64) -> Rng {
        let seed = std::env::var("SUPERPROF_FUZZ_SEED")
            .ok()
            .and_then(|s| s.parse().ok())
            .unwrap_or(0x5eed_u64);
        Rng((seed ^ salt.wrapping_mul(0x9e37_79b9_7f4a_7c15)) | 1)
    }
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }
    fn below(&mut self, n: usize) -> usize {
        if n == 0 {
            0
        } else {
            (self.next() % n as u64) as usize
        }
    }
}

/// The fewest mutated inputs each file target runs, and sessions each peer target runs,
/// whatever the time budget.
const MIN_INPUTS: usize = 200;
const MIN_SESSIONS: usize = 5;

fn budget() -> Duration {
    let secs = std::env::var("SUPERPROF_FUZZ_SECS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(3.0f64);
    Duration::from_secs_f64(secs)
}

/// 1 to 8 mutations, most of them inside the `hot` ranges (headers, tables, the sections a
/// parser walks), with values that make lengths and offsets go wrong.
fn mutate(rng: &mut Rng, input: &[u8], hot: &[Range<usize>]) -> Vec<u8> {
    let mut v = input.to_vec();
    for _ in 0..1 + rng.below(8) {
        if v.is_empty() {
            break;
        }
        let pos = if !hot.is_empty() && rng.below(4) != 0 {
            let r = &hot[rng.below(hot.len())];
            (r.start + rng.below(r.len().max(1))).min(v.len() - 1)
        } else {
            rng.below(v.len())
        };
        match rng.below(10) {
            0..=2 => v[pos] = rng.next() as u8,
            3 | 4 => v[pos] = [0u8, 1, 0x7f, 0x80, 0xff][rng.below(5)],
            5 | 6 => {
                let words: [u64; 8] = [
                    0,
                    u64::MAX,
                    0xffff_ffff_ffff_ff00,
                    0x8000_0000,
                    0xffff_ffff,
                    input.len() as u64,
                    input.len() as u64 - 1,
                    1 << 40,
                ];
                let w = words[rng.below(words.len())].to_le_bytes();
                let n = if rng.below(2) == 0 { 4 } else { 8 };
                for (k, b) in w.iter().take(n).enumerate() {
                    if let Some(x) = v.get_mut(pos + k) {
                        *x = *b;
                    }
                }
            }
            7 => v[pos] ^= 1 << rng.below(8),
            8 => v.truncate(pos.max(1)),
            _ => {
                // A chunk copied over another place.
                let len = rng.below(64).min(v.len() - pos);
                let chunk = v[pos..pos + len].to_vec();
                let at = rng.below(v.len());
                for (k, b) in chunk.into_iter().enumerate() {
                    if let Some(x) = v.get_mut(at + k) {
                        *x = b;
                    }
                }
            }
        }
    }
    v
}

/// Peak resident memory of this test process, in MiB.
fn peak_mib() -> u64 {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            let l = s.lines().find(|l| l.starts_with("VmHWM:"))?;
            l.split_whitespace().nth(1)?.parse::<u64>().ok()
        })
        .map_or(0, |kb| kb / 1024)
}

/// Keeps a failing input for the record and names it.
fn keep(name: &str, bytes: &[u8]) -> PathBuf {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../target/fuzz-failures");
    let _ = std::fs::create_dir_all(&dir);
    let p = dir.join(name);
    let _ = std::fs::write(&p, bytes);
    p
}

/// Runs `f` on mutations of `input` until the budget is spent; panics name the input kept.
fn fuzz(
    what: &str,
    salt: u64,
    input: &[u8],
    hot: &[Range<usize>],
    per_call: Duration,
    mut f: impl FnMut(&[u8], usize),
) -> usize {
    let mut rng = Rng::new(salt);
    let start = Instant::now();
    let mut n = 0;
    // At least MIN_INPUTS, whatever the budget (`SUPERPROF_FUZZ_SECS=0` must not pass empty).
    while n < MIN_INPUTS || start.elapsed() < budget() {
        let m = mutate(&mut rng, input, hot);
        let t = Instant::now();
        let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| f(&m, n)));
        if r.is_err() {
            let p = keep(&format!("{what}-{n}"), &m);
            panic!("{what}: input {n} panicked; it is kept in {}", p.display());
        }
        if t.elapsed() > per_call {
            let p = keep(&format!("{what}-{n}-slow"), &m);
            panic!(
                "{what}: input {n} took {:?}; it is kept in {}",
                t.elapsed(),
                p.display()
            );
        }
        n += 1;
    }
    eprintln!("{what}: {n} mutated inputs in {:?}", start.elapsed());
    n
}

#[test]
fn mutated_elf_and_dwarf() {
    use object::{Object, ObjectSection, ObjectSymbol};
    let dir = TempDir::new("fuzz-elf");
    let exe = compile(&dir, "split", &["split.c"], &["-O2", "-g"]);
    let bytes = std::fs::read(&exe).unwrap();
    let obj = object::File::parse(&*bytes).unwrap();
    // Headers and the tables and sections the unwinder and symbolizer walk.
    let mut hot: Vec<Range<usize>> = Vec::new();
    hot.push(0..64);
    // ELF64 little-endian header fields: e_phoff, e_shoff, e_phnum, e_shnum.
    let u64_at = |o: usize| u64::from_le_bytes(bytes[o..o + 8].try_into().unwrap()) as usize;
    let u16_at = |o: usize| u16::from_le_bytes(bytes[o..o + 2].try_into().unwrap()) as usize;
    let (phoff, shoff) = (u64_at(0x20), u64_at(0x28));
    hot.push(phoff..phoff + 56 * u16_at(0x38));
    hot.push(shoff..shoff + 64 * u16_at(0x3c));
    for name in [
        ".eh_frame",
        ".eh_frame_hdr",
        ".debug_frame",
        ".debug_info",
        ".debug_abbrev",
        ".debug_line",
        ".debug_str",
        ".debug_line_str",
        ".debug_rnglists",
        ".debug_aranges",
        ".symtab",
        ".strtab",
        ".dynsym",
        ".gnu_debuglink",
    ] {
        if let Some((off, size)) = obj.section_by_name(name).and_then(|s| s.file_range()) {
            hot.push(off as usize..(off + size) as usize);
        }
    }
    let funcs: Vec<u64> = obj
        .symbols()
        .filter(|s| s.kind() == object::SymbolKind::Text && s.size() > 0)
        .map(|s| s.address())
        .take(16)
        .collect();
    assert!(!funcs.is_empty());
    let path = dir.path("mutated.elf");
    fuzz("elf", 1, &bytes, &hot, Duration::from_secs(10), |m, _| {
        // A new file each time: the previous one may still be mapped.
        let _ = std::fs::remove_file(&path);
        std::fs::write(&path, m).unwrap();
        if let Some(image) = superprof_unwind::ElfImage::open(&path) {
            let image = Arc::new(image);
            let _ = image.has_unwind_info();
            let mut u = superprof_unwind::GuestUnwinder::new(superprof_unwind::Arch::X86_64);
            for r in image.executable_ranges() {
                u.add_module(&image, "mutated", r.clone(), 0);
            }
            let mut out = Vec::new();
            for &f in &funcs {
                let regs = superprof_unwind::UserRegs {
                    pc: f + 4,
                    sp: 0x10000,
                    fp: 0x10080,
                    lr: 0,
                };
                // A stack of return addresses into the functions.
                let mut read = |a: u64| -> Result<u64, ()> {
                    if (0x10000..0x11000).contains(&a) {
                        Ok(funcs[(a as usize / 8) % funcs.len()] + 8)
                    } else {
                        Err(())
                    }
                };
                out.clear();
                u.unwind(&regs, &mut read, &mut out);
            }
        }
        let mut s = superprof_symbols::Symbolizer::default();
        for &f in &funcs {
            let _ = s.symbolize(&path, &path, f + 4);
        }
    });
    assert!(peak_mib() < 2048, "peak memory {} MiB", peak_mib());
}

#[test]
fn mutated_parquet_profiles() {
    let dir = TempDir::new("fuzz-parquet");
    let exe = compile(&dir, "split", &["split.c"], &["-O2", "-g"]);
    let profile = dir.path("p.parquet");
    run_ok(
        superprof()
            .args(["record", "-q", "-o"])
            .arg(&profile)
            .arg("--")
            .arg(&exe)
            .arg("0.5"),
    );
    let bytes = std::fs::read(&profile).unwrap();
    // The footer (metadata, its length, the magic) is where sizes and offsets live.
    let n = bytes.len();
    let meta_len = u32::from_le_bytes(bytes[n - 8..n - 4].try_into().unwrap()) as usize;
    let hot = vec![n.saturating_sub(meta_len + 8)..n, 0..n.min(4096)];
    let path = dir.path("mutated.parquet");
    fuzz(
        "parquet",
        2,
        &bytes,
        &hot,
        Duration::from_secs(10),
        |m, _| {
            std::fs::write(&path, m).unwrap();
            if let Ok(p) = superprof_profile::parquet::read(&path) {
                // Whatever was read must be writable again.
                let mut out = Vec::new();
                let _ = superprof_profile::top::write(&p, 10, &mut out);
            }
        },
    );
    assert!(peak_mib() < 2048, "peak memory {} MiB", peak_mib());
}

mod peers {
    //! Fake QEMU peers that answer like QEMU 7.2 does, with every reply mutated at random.
    use super::{mutate, Rng};
    use std::io::{BufRead, BufReader, Read, Write};
    use std::os::unix::net::{UnixListener, UnixStream};
    use std::sync::{Arc, Mutex};

    fn maybe_mutate(rng: &Mutex<Rng>, bytes: Vec<u8>) -> Vec<u8> {
        let mut rng = rng.lock().unwrap();
        if rng.below(3) == 0 {
            bytes
        } else {
            mutate(&mut rng, &bytes, &[])
        }
    }

    /// A QMP peer: a greeting, then an answer to each command.
    pub fn qmp(c: UnixStream, rng: Arc<Mutex<Rng>>) -> std::io::Result<()> {
        c.set_read_timeout(Some(std::time::Duration::from_millis(300)))?;
        let mut w = c.try_clone()?;
        let greeting = br#"{"QMP": {"version": {"qemu": {"micro": 0, "minor": 2, "major": 7}, "package": "Debian 1:7.2+dfsg-7"}, "capabilities": ["oob"]}}"#;
        let mut g = maybe_mutate(&rng, greeting.to_vec());
        g.push(b'\n');
        w.write_all(&g)?;
        for line in BufReader::new(c).lines() {
            let line = line?;
            let v: serde_json::Value = serde_json::from_str(&line).unwrap_or_default();
            let id = v["id"].clone();
            let ret = match v["execute"].as_str().unwrap_or("") {
                "query-target" => serde_json::json!({"arch": "x86_64"}),
                "query-cpus-fast" => serde_json::json!([
                    {"cpu-index": 0, "qom-path": "/machine/unattached/device[0]", "thread-id": 4242, "target": "x86_64"},
                    {"cpu-index": 1, "qom-path": "/machine/unattached/device[1]", "thread-id": 4243, "target": "x86_64"}
                ]),
                "human-monitor-command" => serde_json::json!(
                    "RAX=0000000000000001 RBX=0000000000000002 RCX=0 RDX=0\r\nRSI=0 RDI=0 RBP=0000000000107ff0 RSP=0000000000107fe0\r\nR8 =0 R9 =0\r\nRIP=0000000000100123 RFL=00000046 [---Z-P-] CPL=0 II=0 A20=1 SMM=0 HLT=0\r\n"
                ),
                "memsave" => {
                    if let Some(f) = v["arguments"]["filename"].as_str() {
                        let size = v["arguments"]["size"].as_u64().unwrap_or(0).min(1 << 16);
                        let body = maybe_mutate(&rng, vec![0x41; size as usize]);
                        let _ = std::fs::write(f, body);
                    }
                    serde_json::json!({})
                }
                _ => serde_json::json!({}),
            };
            let mut reply = serde_json::to_vec(&serde_json::json!({"return": ret, "id": id}))?;
            if rng.lock().unwrap().below(4) == 0 {
                // An event first, as QEMU sends them.
                w.write_all(b"{\"timestamp\": {\"seconds\": 1, \"microseconds\": 2}, \"event\": \"STOP\"}\n")?;
            }
            reply = maybe_mutate(&rng, reply);
            reply.push(b'\n');
            w.write_all(&reply)?;
        }
        Ok(())
    }

    fn packet(data: &[u8]) -> Vec<u8> {
        let sum = data.iter().fold(0u8, |a, b| a.wrapping_add(*b));
        let mut p = vec![b'$'];
        p.extend_from_slice(data);
        p.extend_from_slice(format!("#{sum:02x}").as_bytes());
        p
    }

    /// A gdbstub peer: answers each packet (and the 0x03 interrupt) as QEMU's would.
    pub fn gdb(c: UnixStream, rng: Arc<Mutex<Rng>>) -> std::io::Result<()> {
        c.set_read_timeout(Some(std::time::Duration::from_millis(300)))?;
        let mut w = c.try_clone()?;
        let mut r = c;
        let mut buf = Vec::new();
        let mut chunk = [0u8; 4096];
        let mut threads_listed = false;
        loop {
            let n = r.read(&mut chunk)?;
            if n == 0 {
                return Ok(());
            }
            buf.extend_from_slice(&chunk[..n]);
            loop {
                // Acks and interrupts, then whole packets.
                while let Some(&b) = buf.first() {
                    if b == b'+' || b == b'-' {
                        buf.remove(0);
                    } else if b == 0x03 {
                        buf.remove(0);
                        let p = maybe_mutate(&rng, packet(b"T05thread:p01.01;"));
                        w.write_all(&p)?;
                    } else {
                        break;
                    }
                }
                let Some(start) = buf.iter().position(|&b| b == b'$') else {
                    break;
                };
                let Some(hash) = buf[start..].iter().position(|&b| b == b'#') else {
                    break;
                };
                let end = start + hash + 3;
                if buf.len() < end {
                    break;
                }
                let data = buf[start + 1..start + hash].to_vec();
                buf.drain(..end);
                let reply: Vec<u8> = if data.starts_with(b"qSupported") {
                    b"PacketSize=1000;qXfer:features:read+;QStartNoAckMode+".to_vec()
                } else if data == b"QStartNoAckMode" || data.starts_with(b"Hg") {
                    b"OK".to_vec()
                } else if data == b"?" {
                    b"T05thread:p01.01;".to_vec()
                } else if data.starts_with(b"qXfer:features:read:target.xml") {
                    b"l<?xml version=\"1.0\"?><target><architecture>i386:x86-64</architecture></target>".to_vec()
                } else if data == b"qfThreadInfo" {
                    threads_listed = false;
                    b"mp01.01,p01.02".to_vec()
                } else if data == b"qsThreadInfo" {
                    if threads_listed {
                        b"l".to_vec()
                    } else {
                        threads_listed = true;
                        b"mp01.03".to_vec()
                    }
                } else if data == b"g" {
                    let mut regs = String::new();
                    for i in 0..24u64 {
                        let v: u64 = match i {
                            6 => 0x107ff0,
                            7 => 0x107fe0,
                            16 => 0x100123,
                            _ => i,
                        };
                        for b in v.to_le_bytes() {
                            regs.push_str(&format!("{b:02x}"));
                        }
                    }
                    regs.into_bytes()
                } else if data.first() == Some(&b'm') {
                    let len = std::str::from_utf8(&data)
                        .ok()
                        .and_then(|s| s.split(',').nth(1))
                        .and_then(|l| usize::from_str_radix(l, 16).ok())
                        .unwrap_or(0)
                        .min(4096);
                    "41".repeat(len).into_bytes()
                } else if data == b"c" || data == b"D" || data == b"k" {
                    continue;
                } else {
                    Vec::new()
                };
                let p = maybe_mutate(&rng, packet(&reply));
                w.write_all(&p)?;
            }
        }
    }

    /// A socket path of its own and a thread serving its first connection.
    pub fn serve(
        dir: &std::path::Path,
        n: usize,
        rng: Arc<Mutex<Rng>>,
        f: fn(UnixStream, Arc<Mutex<Rng>>) -> std::io::Result<()>,
    ) -> String {
        let path = dir.join(format!("peer-{n}.sock"));
        let _ = std::fs::remove_file(&path);
        let listener = UnixListener::bind(&path).unwrap();
        std::thread::spawn(move || {
            if let Ok((c, _)) = listener.accept() {
                let _ = f(c, rng);
            }
        });
        path.to_string_lossy().into_owned()
    }
}

/// One sample's worth of calls on a backend, all errors allowed.
fn one_sample(b: &mut dyn superprof_qemu::Backend) {
    if b.arch().is_err() {
        return;
    }
    if b.stop().is_err() {
        b.let_go();
        return;
    }
    let n = b.vcpus().unwrap_or(1);
    for i in 0..n.min(4) {
        if b.select(i).is_ok() {
            if let Ok(r) = b.regs() {
                let mut stack = [0u8; 512];
                let _ = b.read(r.sp, &mut stack);
            }
        }
    }
    let _ = b.resume();
}

fn fuzz_peer(
    what: &str,
    salt: u64,
    serve: fn(std::os::unix::net::UnixStream, Arc<std::sync::Mutex<Rng>>) -> std::io::Result<()>,
    connect: fn(&str, superprof_qemu::Cancel) -> Option<Box<dyn superprof_qemu::Backend>>,
) {
    let dir = TempDir::new(what);
    let rng = Arc::new(std::sync::Mutex::new(Rng::new(salt)));
    let start = Instant::now();
    let mut n = 0;
    while n < MIN_SESSIONS || start.elapsed() < budget() {
        let path = peers::serve(&dir.0, n, rng.clone(), serve);
        // Each exchange may wait for the peer; the whole sample is given 400 ms.
        let t = Instant::now();
        let cancel: superprof_qemu::Cancel =
            Arc::new(move || t.elapsed() > Duration::from_millis(400));
        let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            if let Some(mut b) = connect(&path, cancel) {
                one_sample(b.as_mut());
            }
        }));
        assert!(r.is_ok(), "{what}: exchange {n} panicked (seed {salt})");
        // The cancel check is looked at every 50 ms; the let-go and drop grace is 0.5 s.
        assert!(
            t.elapsed() < Duration::from_millis(2500),
            "{what}: exchange {n} took {:?}",
            t.elapsed()
        );
        let _ = std::fs::remove_file(&path);
        n += 1;
    }
    eprintln!("{what}: {n} mutated sessions in {:?}", start.elapsed());
    assert!(peak_mib() < 2048, "peak memory {} MiB", peak_mib());
}

#[test]
fn mutated_qmp_replies() {
    fuzz_peer("fuzz-qmp", 3, peers::qmp, |path, cancel| {
        superprof_qemu::Qmp::connect_with(path, cancel)
            .ok()
            .map(|q| Box::new(q) as Box<dyn superprof_qemu::Backend>)
    });
}

#[test]
fn mutated_gdb_replies() {
    fuzz_peer("fuzz-gdb", 4, peers::gdb, |path, cancel| {
        superprof_qemu::Gdb::connect_with(path, cancel)
            .ok()
            .map(|g| Box::new(g) as Box<dyn superprof_qemu::Backend>)
    });
}

/// A real jitdump, node's (`--perf-prof`, with its unwinding tables), mutated: the header and
/// every record's 16-byte header most of all. Parsed whole, looked up at the code it named,
/// and read as a growing file in two halves (as `record` reads a live one): no panic, no hang,
/// memory bounded. (Kept in superprof-symbols rather than taken from linux-perf-data, whose
/// reader panics on such input: docs/architecture.md, "Crates considered".)
#[test]
fn mutated_jitdumps() {
    let dir = TempDir::new("fuzz-jitdump");
    run_ok(
        std::process::Command::new("node")
            .args(["--perf-prof", "--perf-prof-unwinding-info", "-e"])
            .arg(
                "function f(n){let x=1;for(let i=0;i<n;i++)x=(x*31+i)%1000003;return x}\
                 let s=0;for(let i=0;i<300;i++)s+=f(20000);console.log(s)",
            )
            .current_dir(&dir.0),
    );
    let dump = std::fs::read_dir(&dir.0)
        .unwrap()
        .map(|e| e.unwrap().path())
        .find(|p| superprof_symbols::is_jitdump(p))
        .expect("node --perf-prof wrote no jit-PID.dump");
    let mut bytes = std::fs::read(&dump).unwrap();
    // Its first 256 KiB (a few hundred records: mutations spread over them, not over MBs).
    bytes.truncate(256 << 10);
    let original = superprof_symbols::JitDump::parse(&bytes).expect("node's jitdump");
    assert!(original.len() > 10, "{} loads", original.len());
    // The header, then each record's header (id, size, time).
    let mut hot: Vec<Range<usize>> = Vec::new();
    hot.push(0..40);
    let mut at = 40;
    while at + 16 <= bytes.len() {
        hot.push(at..at + 16);
        let size = u32::from_le_bytes(bytes[at + 4..at + 8].try_into().unwrap()) as usize;
        if size < 16 {
            break;
        }
        at += size;
    }
    assert!(hot.len() > 10);
    // Addresses to look up: inside and around the code the original names.
    let addrs: Vec<u64> = original
        .unwind
        .iter()
        .flat_map(|u| [u.code.start, u.code.end - 1, u.code.end])
        .take(64)
        .collect();
    let grown = dir.path("jit-1.dump");
    fuzz(
        "jitdump",
        5,
        &bytes,
        &hot,
        Duration::from_secs(2),
        |m, _| {
            if let Some(d) = superprof_symbols::JitDump::parse(m) {
                for &a in &addrs {
                    let _ = d.lookup_at(a, Some(u64::MAX));
                    let _ = d.lookup_at(a, Some(0));
                    let _ = d.lookup(a);
                }
            }
            // Read as it grows: the first half, then the rest.
            let _ = std::fs::remove_file(&grown);
            let half = m.len() / 2;
            std::fs::write(&grown, &m[..half]).unwrap();
            let mut reader = superprof_symbols::JitUnwindReader::new(&grown, None);
            let _ = reader.read_new();
            use std::io::Write;
            std::fs::OpenOptions::new()
                .append(true)
                .open(&grown)
                .unwrap()
                .write_all(&m[half..])
                .unwrap();
            let _ = reader.read_new();
        },
    );
    assert!(peak_mib() < 2048, "peak memory {} MiB", peak_mib());
}
