//! QMP, QEMU's JSON machine protocol: `stop`/`cont`, `info registers` through
//! `human-monitor-command`, and memory in bulk with `memsave` (or a word at a time with HMP
//! `x`, as the design this comes from did).

use std::io::{BufRead, BufReader, Write};
use std::path::PathBuf;

use serde_json::{json, Value};

use crate::{connect, read_error, Backend, GuestArch, GuestRegs, QemuError, Result, Stream};

pub struct Qmp {
    reader: BufReader<Box<dyn Stream>>,
    arch: Option<GuestArch>,
    /// Read memory one 8-byte word per HMP `x` command (the original design; slow).
    pub word_reads: bool,
    scratch: PathBuf,
    shutdown: bool,
    /// Stopped by us and not resumed yet.
    stopped: bool,
    /// The vCPU that `info registers` and `memsave` look at.
    cpu: usize,
    cpus: Option<usize>,
}

impl Qmp {
    /// Connects, checks the greeting, and enters command mode.
    pub fn connect(addr: &str) -> Result<Qmp> {
        let stream = connect(addr)?;
        let mut q = Qmp {
            reader: BufReader::new(stream),
            arch: None,
            word_reads: false,
            scratch: private_dir()?.join("memsave"),
            shutdown: false,
            stopped: false,
            cpu: 0,
            cpus: None,
        };
        let greeting = q.next_message().map_err(|e| match e {
            QemuError::Timeout(_) | QemuError::Gone | QemuError::Protocol(_) => {
                QemuError::Protocol(format!(
                    "{addr} is not a QMP socket (is it QEMU's -qmp socket?)"
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

    fn next_message(&mut self) -> Result<Value> {
        let mut line = String::new();
        let n = self.reader.read_line(&mut line).map_err(read_error)?;
        if n == 0 {
            return Err(QemuError::Gone);
        }
        serde_json::from_str(&line)
            .map_err(|_| QemuError::Protocol(format!("not QMP: {}", line.trim())))
    }

    /// Runs a command and returns its "return" value (events on the way are skipped).
    pub fn execute(&mut self, cmd: &str, args: Value) -> Result<Value> {
        let mut msg = json!({ "execute": cmd });
        if args.as_object().is_some_and(|o| !o.is_empty()) {
            msg["arguments"] = args;
        }
        let mut text = msg.to_string();
        text.push('\n');
        self.reader
            .get_mut()
            .write_all(text.as_bytes())
            .map_err(read_error)?;
        loop {
            let m = self.next_message()?;
            if let Some(ev) = m.get("event").and_then(Value::as_str) {
                if ev == "SHUTDOWN" {
                    self.shutdown = true;
                }
                continue;
            }
            if let Some(r) = m.get("return") {
                return Ok(r.clone());
            }
            if let Some(e) = m.get("error") {
                return Err(QemuError::Protocol(format!(
                    "QMP {cmd}: {}",
                    e.get("desc").and_then(Value::as_str).unwrap_or("error")
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

/// A new folder only this user can use, for memsave's file (a name chosen by someone else
/// cannot be reused: creating it must succeed).
fn private_dir() -> Result<PathBuf> {
    use std::os::unix::fs::DirBuilderExt;
    for attempt in 0..100u32 {
        let nanos = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.subsec_nanos());
        let dir = std::env::temp_dir().join(format!(
            "superprof-qmp-{}-{nanos:x}-{attempt}",
            std::process::id()
        ));
        match std::fs::DirBuilder::new().mode(0o700).create(&dir) {
            Ok(()) => return Ok(dir),
            Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => continue,
            Err(e) => return Err(e.into()),
        }
    }
    Err(QemuError::Protocol(
        "cannot create a private temporary folder".into(),
    ))
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
    fn arch(&mut self) -> Result<GuestArch> {
        if let Some(a) = self.arch {
            return Ok(a);
        }
        let t = self.execute("query-target", json!({}))?;
        let a = match t.get("arch").and_then(Value::as_str) {
            Some("aarch64") => GuestArch::Aarch64,
            Some("x86_64") => GuestArch::X86_64,
            other => {
                return Err(QemuError::Protocol(format!(
                    "unsupported guest architecture {other:?}"
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
        Ok(match arch {
            // In long mode the 64-bit names; before it (at boot), the 32-bit ones.
            GuestArch::X86_64 if reg(&text, "RIP").is_some() => GuestRegs {
                pc: get("RIP")?,
                sp: get("RSP")?,
                fp: get("RBP")?,
                lr: 0,
            },
            GuestArch::X86_64 => GuestRegs {
                pc: get("EIP")?,
                sp: get("ESP")?,
                fp: get("EBP")?,
                lr: 0,
            },
            GuestArch::Aarch64 => GuestRegs {
                pc: get("PC")?,
                sp: get("SP")?,
                fp: get("X29")?,
                lr: get("X30")?,
            },
        })
    }

    fn read(&mut self, addr: u64, buf: &mut [u8]) -> Result<usize> {
        if self.word_reads {
            // One HMP round trip per 8-byte word.
            let mut done = 0;
            while done + 8 <= buf.len() {
                let a = addr + done as u64;
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
        let r = self.execute(
            "memsave",
            json!({ "val": addr, "size": buf.len(), "filename": file, "cpu-index": self.cpu }),
        );
        match r {
            Ok(_) => {
                let data = std::fs::read(&self.scratch)?;
                let n = data.len().min(buf.len());
                buf[..n].copy_from_slice(&data[..n]);
                Ok(n)
            }
            // An unmapped address: nothing read.
            Err(QemuError::Protocol(_)) => Ok(0),
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
        let _ = self.execute("quit", json!({}));
        Ok(())
    }
}

impl Drop for Qmp {
    /// A guest stopped by us is let go, whatever happened.
    fn drop(&mut self) {
        if self.stopped && !self.shutdown {
            let _ = self.execute("cont", json!({}));
        }
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
