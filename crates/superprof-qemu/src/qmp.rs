//! QMP, QEMU's JSON machine protocol: `stop`/`cont`, `info registers` through
//! `human-monitor-command`, and memory in bulk with `memsave` (or a word at a time with HMP
//! `x`, as the design this comes from did).
//!
//! Each command carries an `id` and only the reply with that id answers it, so a reply left
//! over from a command given up on (Ctrl-C) is not taken for the next one's.

use std::io::Read;
use std::path::PathBuf;

use serde_json::{json, Value};

use crate::{shown, Arch, Backend, Cancel, Conn, GuestRegs, QemuError, Result, MAX_VCPUS};

/// The longest QMP message (one line) taken from the peer.
pub const MAX_LINE: usize = 4 << 20;

/// A guest reached through QMP (`-qmp`): registers parsed from HMP `info registers`, memory
/// through `memsave` into a private file of this host (so QEMU must run on it), or one HMP
/// `x` per word with [`Qmp::word_reads`].
pub struct Qmp {
    conn: Conn,
    /// Bytes of `conn.buf` already searched for a line end.
    scanned: usize,
    /// The id of the last command sent.
    id: u64,
    arch: Option<Arch>,
    /// Read memory one 8-byte word per HMP `x` command (the original design; slow).
    pub word_reads: bool,
    scratch: PathBuf,
    shutdown: bool,
    /// Stopped by us and not resumed yet.
    stopped: bool,
    /// The vCPU that `info registers` and `memsave` look at.
    cpu: usize,
    cpus: Option<usize>,
    /// The last `info registers` text (the current vCPU's).
    last_info: String,
}

impl Qmp {
    /// Connects, checks the greeting, and enters command mode.
    pub fn connect(addr: &str) -> Result<Qmp> {
        Qmp::connect_with(addr, crate::never())
    }

    /// [`Qmp::connect`], giving up when `cancel` says so (Ctrl-C).
    pub fn connect_with(addr: &str, cancel: Cancel) -> Result<Qmp> {
        let conn = Conn::connect(addr, MAX_LINE + 65536, cancel)?;
        let mut q = Qmp {
            conn,
            scanned: 0,
            id: 0,
            arch: None,
            word_reads: false,
            scratch: private_dir()?.join("memsave"),
            shutdown: false,
            stopped: false,
            cpu: 0,
            cpus: None,
            last_info: String::new(),
        };
        q.conn.begin();
        let greeting = q.next_message().map_err(|e| match e {
            QemuError::Timeout(_) | QemuError::Gone | QemuError::Protocol(_) => {
                QemuError::Protocol(format!(
                    "{addr} is not a QMP socket ({e}): is it QEMU's -qmp socket?"
                ))
            }
            e => e,
        })?;
        if greeting.get("QMP").is_none() {
            return Err(QemuError::Protocol(format!(
                "{addr} is not a QMP socket (no QMP greeting)"
            )));
        }
        q.execute("qmp_capabilities", json!({}))?;
        Ok(q)
    }

    /// The next line from the peer, as JSON (within the current wait's deadline).
    fn next_message(&mut self) -> Result<Value> {
        loop {
            if let Some(i) = self.conn.buf[self.scanned..]
                .iter()
                .position(|&b| b == b'\n')
            {
                let end = self.scanned + i;
                let line: Vec<u8> = self.conn.buf.drain(..=end).collect();
                self.scanned = 0;
                let text = String::from_utf8_lossy(&line);
                return serde_json::from_str(&text).map_err(|_| {
                    QemuError::Protocol(format!("not QMP: {}", shown(text.trim().as_bytes())))
                });
            }
            self.scanned = self.conn.buf.len();
            if self.scanned > MAX_LINE {
                return Err(QemuError::Protocol(format!(
                    "a QMP message of more than {} MiB",
                    MAX_LINE >> 20
                )));
            }
            self.conn.fill()?;
        }
    }

    /// Runs a command and returns its "return" value (events on the way are skipped); the
    /// whole reply must come within the timeout.
    pub fn execute(&mut self, cmd: &str, args: Value) -> Result<Value> {
        self.conn.begin();
        self.exchange(cmd, args)
    }

    /// Sends a command and waits for its reply, within the wait begun by the caller.
    fn exchange(&mut self, cmd: &str, args: Value) -> Result<Value> {
        self.id += 1;
        let id = self.id;
        let mut msg = json!({ "execute": cmd, "id": id });
        if args.as_object().is_some_and(|o| !o.is_empty()) {
            msg["arguments"] = args;
        }
        let mut text = msg.to_string();
        text.push('\n');
        self.conn.write_all(text.as_bytes())?;
        loop {
            let m = self.next_message()?;
            if let Some(ev) = m.get("event").and_then(Value::as_str) {
                if ev == "SHUTDOWN" {
                    self.shutdown = true;
                }
                continue;
            }
            // The reply to an earlier command, given up on.
            if m.get("id").is_some_and(|i| i.as_u64() != Some(id)) {
                continue;
            }
            if let Some(r) = m.get("return") {
                return Ok(r.clone());
            }
            if let Some(e) = m.get("error") {
                let desc = e.get("desc").and_then(Value::as_str).unwrap_or("error");
                return Err(QemuError::Protocol(format!(
                    "QMP {cmd}: {}",
                    shown(desc.as_bytes())
                )));
            }
        }
    }

    fn hmp(&mut self, line: &str) -> Result<String> {
        let r = self.execute(
            "human-monitor-command",
            json!({ "command-line": line, "cpu-index": self.cpu }),
        )?;
        Ok(r.as_str().unwrap_or_default().to_owned())
    }
}

/// A new folder only this user can use, for memsave's file (see
/// `superprof_profile::output`: a random name, created 0700 or not at all).
fn private_dir() -> Result<PathBuf> {
    Ok(superprof_profile::output::create_private_dir(
        &std::env::temp_dir(),
        "superprof-qmp",
    )?)
}

/// The arguments of `memsave`. QEMU takes `val` as a signed 64-bit integer: an address in the
/// upper half (a kernel's, 2^63 and up) goes as the same 64 bits, negative; sent as an
/// unsigned number, QEMU 7.2 refuses it ("Invalid parameter type for 'val'").
fn memsave_args(addr: u64, size: usize, file: &str, cpu: usize) -> Value {
    json!({ "val": addr as i64, "size": size, "filename": file, "cpu-index": cpu })
}

/// The value of `NAME=hex` in `info registers` output.
fn reg(text: &str, name: &str) -> Option<u64> {
    let mut rest = text;
    while let Some(i) = rest.find(name) {
        let before = rest[..i].chars().last();
        let after = &rest[i + name.len()..];
        rest = after;
        if before.is_some_and(|c| c.is_ascii_alphanumeric()) {
            continue;
        }
        if let Some(v) = after.strip_prefix('=') {
            let hex: String = v.chars().take_while(|c| c.is_ascii_hexdigit()).collect();
            return u64::from_str_radix(&hex, 16).ok();
        }
    }
    None
}

impl Backend for Qmp {
    fn arch(&mut self) -> Result<Arch> {
        if let Some(a) = self.arch {
            return Ok(a);
        }
        let t = self.execute("query-target", json!({}))?;
        let a = match t.get("arch").and_then(Value::as_str) {
            Some("aarch64") => Arch::Aarch64,
            Some("x86_64") => Arch::X86_64,
            other => {
                return Err(QemuError::Protocol(format!(
                    "unsupported guest architecture {}",
                    shown(other.unwrap_or("?").as_bytes())
                )))
            }
        };
        self.arch = Some(a);
        Ok(a)
    }

    fn stop(&mut self) -> Result<()> {
        // Set first: if the answer is lost, the guest may be stopped all the same.
        self.stopped = true;
        self.execute("stop", json!({}))?;
        Ok(())
    }

    fn vcpus(&mut self) -> Result<usize> {
        if let Some(n) = self.cpus {
            return Ok(n);
        }
        let n = self
            .execute("query-cpus-fast", json!({}))?
            .as_array()
            .map_or(1, |a| a.len().max(1));
        if n > MAX_VCPUS {
            return Err(QemuError::Protocol(format!(
                "QEMU reports {n} vCPUs (at most {MAX_VCPUS} are supported)"
            )));
        }
        self.cpus = Some(n);
        Ok(n)
    }

    fn select(&mut self, index: usize) -> Result<()> {
        if index >= self.vcpus()? {
            return Err(QemuError::Protocol(format!("no vCPU {index}")));
        }
        self.cpu = index;
        Ok(())
    }

    fn regs(&mut self) -> Result<GuestRegs> {
        let arch = self.arch()?;
        let text = self.hmp("info registers")?;
        let get = |n: &str| {
            reg(&text, n).ok_or_else(|| QemuError::Protocol(format!("no {n} in info registers")))
        };
        let regs = match arch {
            // In long mode the 64-bit names; before it (at boot), the 32-bit ones.
            Arch::X86_64 if reg(&text, "RIP").is_some() => GuestRegs {
                pc: get("RIP")?,
                sp: get("RSP")?,
                fp: get("RBP")?,
                lr: 0,
            },
            Arch::X86_64 => GuestRegs {
                pc: get("EIP")?,
                sp: get("ESP")?,
                fp: get("EBP")?,
                lr: 0,
            },
            Arch::Aarch64 => GuestRegs {
                pc: get("PC")?,
                sp: get("SP")?,
                fp: get("X29")?,
                lr: get("X30")?,
            },
        };
        self.last_info = text;
        Ok(regs)
    }

    fn space(&mut self) -> Result<Option<u64>> {
        let arch = self.arch()?;
        match arch {
            // From the `info registers` of the last regs().
            Arch::X86_64 => Ok(reg(&self.last_info, "CR3").map(|v| crate::space_root(arch, v))),
            Arch::Aarch64 => Ok(None),
        }
    }

    fn read(&mut self, addr: u64, buf: &mut [u8]) -> Result<usize> {
        if self.word_reads {
            // One HMP round trip per 8-byte word.
            let mut done = 0;
            while done + 8 <= buf.len() {
                let Some(a) = addr.checked_add(done as u64) else {
                    break;
                };
                let out = self.hmp(&format!("x /1gx {a:#x}"))?;
                let Some(v) = out.split_once(": ").and_then(|(_, v)| {
                    u64::from_str_radix(v.trim().trim_start_matches("0x"), 16).ok()
                }) else {
                    break;
                };
                buf[done..done + 8].copy_from_slice(&v.to_le_bytes());
                done += 8;
            }
            return Ok(done);
        }
        let file = self.scratch.to_string_lossy().into_owned();
        let r = self.execute("memsave", memsave_args(addr, buf.len(), &file, self.cpu));
        match r {
            Ok(_) => {
                // No more than asked for, whatever the file holds.
                let mut file = std::fs::File::open(&self.scratch)?.take(buf.len() as u64);
                let mut n = 0;
                while n < buf.len() {
                    match file.read(&mut buf[n..])? {
                        0 => break,
                        k => n += k,
                    }
                }
                Ok(n)
            }
            // An unmapped address: nothing read. Any other refusal is an error, not "unmapped".
            Err(QemuError::Protocol(why)) if why.contains("Invalid addr") => Ok(0),
            Err(e) => Err(e),
        }
    }

    fn resume(&mut self) -> Result<()> {
        if self.shutdown {
            return Err(QemuError::Gone);
        }
        self.execute("cont", json!({}))?;
        self.stopped = false;
        Ok(())
    }

    fn quit(&mut self) -> Result<()> {
        self.conn.begin_cleanup();
        let _ = self.exchange("quit", json!({}));
        Ok(())
    }

    fn set_cancel(&mut self, cancel: Cancel) {
        self.conn.set_cancel(cancel);
    }

    fn let_go(&mut self) {
        if self.stopped && !self.shutdown {
            // One try: a peer that does not answer within GRACE will not later either.
            self.stopped = false;
            self.conn.begin_cleanup();
            let _ = self.exchange("cont", json!({}));
        }
    }
}

impl Drop for Qmp {
    /// A guest stopped by us is let go, whatever happened.
    fn drop(&mut self) {
        self.let_go();
        let _ = std::fs::remove_file(&self.scratch);
        if let Some(dir) = self.scratch.parent() {
            let _ = std::fs::remove_dir(dir);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::reg;

    #[test]
    fn memsave_takes_upper_half_addresses_as_signed_integers() {
        let a = super::memsave_args(0xffff_ffff_8010_0000, 64, "/x", 1);
        assert_eq!(a["val"].as_i64(), Some(-0x7ff0_0000));
        assert!(a["val"].as_u64().is_none());
        let low = super::memsave_args(0x4008_0000, 64, "/x", 0);
        assert_eq!(low["val"].as_i64(), Some(0x4008_0000));
    }

    #[test]
    fn registers_from_info_registers() {
        let a64 = " PC=000000004008008c X00=00000000000927c0 X01=23c145d25313ca69\nX29=00000000400881e0 X30=00000000400800c4  SP=00000000400881e0\n";
        assert_eq!(reg(a64, "PC"), Some(0x4008008c));
        assert_eq!(reg(a64, "SP"), Some(0x400881e0));
        assert_eq!(reg(a64, "X30"), Some(0x400800c4));
        let x86 = "RAX=0000000000000001 RBX=0000000000000002\nRSI=0 RDI=0 RBP=0000000000107ff0 RSP=0000000000107fe0\nRIP=0000000000100123 RFL=00000046";
        assert_eq!(reg(x86, "RIP"), Some(0x100123));
        assert_eq!(reg(x86, "RSP"), Some(0x107fe0));
        assert_eq!(reg(x86, "RBP"), Some(0x107ff0));
    }
}

#[cfg(test)]
mod hostile {
    use std::io::{BufRead, BufReader, Write};
    use std::sync::atomic::{AtomicBool, Ordering};
    use std::sync::Arc;
    use std::time::{Duration, Instant};

    use super::Qmp;
    use crate::tests::{flood, peer, trickle};
    use crate::{Backend, QemuError};

    #[test]
    fn a_greeting_without_end_is_refused_at_the_line_cap() {
        let sock = peer("qmp-flood", |c| flood(c, b"{\"QMP\": "));
        let t = Instant::now();
        let Err(e) = Qmp::connect(&sock) else {
            panic!("connected")
        };
        assert!(e.to_string().contains("more than 4 MiB"), "{e}");
        assert!(t.elapsed() < Duration::from_secs(5));
    }

    #[test]
    fn a_trickled_greeting_ends_at_cancel() {
        let sock = peer("qmp-trickle", |c| trickle(c, b"{\"QMP\""));
        let stop = Arc::new(AtomicBool::new(false));
        let flag = stop.clone();
        let canceller = std::thread::spawn(move || {
            std::thread::sleep(Duration::from_millis(300));
            flag.store(true, Ordering::SeqCst);
            Instant::now()
        });
        let cancel = Arc::new(move || stop.load(Ordering::SeqCst));
        let r = Qmp::connect_with(&sock, cancel);
        let ended = Instant::now();
        assert!(matches!(r, Err(QemuError::Cancelled)), "{:?}", r.err());
        let took = ended - canceller.join().unwrap();
        assert!(took < 4 * crate::POLL, "{took:?} after the cancel");
    }

    /// Events forever after the greeting and the capabilities: a command gets no answer.
    fn events_forever(c: std::os::unix::net::UnixStream) -> std::io::Result<()> {
        let mut w = c.try_clone()?;
        w.write_all(b"{\"QMP\": {}}\n")?;
        let mut lines = BufReader::new(c).lines();
        let first = lines.next().unwrap_or(Ok(String::new()))?;
        // A reply to another command first: it must not be taken for this one's.
        writeln!(w, "{{\"return\": {{\"arch\": \"x86_64\"}}, \"id\": 999}}")?;
        let v: serde_json::Value = serde_json::from_str(&first)?;
        writeln!(w, "{}", serde_json::json!({"return": {}, "id": v["id"]}))?;
        let _ = lines.next();
        loop {
            w.write_all(b"{\"event\": \"RESUME\"}\n")?;
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    #[test]
    fn a_reply_drowned_in_events_ends_at_the_deadline() {
        let sock = peer("qmp-events", events_forever);
        let mut q = Qmp::connect(&sock).unwrap();
        q.conn.timeout = Duration::from_millis(300);
        let t = Instant::now();
        let r = q.arch();
        assert!(matches!(r, Err(QemuError::Timeout(_))), "{r:?}");
        assert!(t.elapsed() < Duration::from_secs(1), "{:?}", t.elapsed());
    }
}
