//! The gdbstub remote serial protocol, as QEMU speaks it: packets `$data#xx`, no-ack mode,
//! 0x03 to stop, `g`/`m`/`c`.

use std::time::Duration;

use crate::{connect, read_error, Backend, GuestArch, GuestRegs, QemuError, Result, Stream};

pub struct Gdb {
    stream: Box<dyn Stream>,
    buf: Vec<u8>,
    /// Bytes of memory one `m` reply can hold.
    max_read: usize,
    arch: Option<GuestArch>,
    running: bool,
    no_ack: bool,
    /// The vCPUs' thread ids, as the stub names them (`p1.1`, `p1.2`...).
    threads: Option<Vec<String>>,
}

fn hex_byte(b: &[u8]) -> Option<u8> {
    u8::from_str_radix(std::str::from_utf8(b).ok()?, 16).ok()
}

fn unhex(s: &[u8]) -> Option<Vec<u8>> {
    if !s.len().is_multiple_of(2) {
        return None;
    }
    s.chunks(2).map(hex_byte).collect()
}

impl Gdb {
    /// Connects and negotiates no-ack mode. QEMU stops the guest when a debugger connects;
    /// it stays stopped until [`Backend::resume`].
    pub fn connect(addr: &str) -> Result<Gdb> {
        let stream = connect(addr)?;
        let mut g = Gdb {
            stream,
            buf: Vec::new(),
            max_read: 1024,
            arch: None,
            running: false,
            no_ack: false,
            threads: None,
        };
        g.stream.set_timeout(Duration::from_secs(3))?;
        // A running guest is stopped by the connection, and QEMU says so first (a stop
        // reply nobody asked for): skip it.
        let sup = g
            .send(b"qSupported:multiprocess+;swbreak+;hwbreak+;xmlRegisters=i386")
            .and_then(|_| loop {
                let r = g.recv()?;
                if !matches!(r.first(), Some(b'T') | Some(b'S')) {
                    break Ok(r);
                }
            })
            .map_err(|e| match e {
                QemuError::Timeout(_) | QemuError::Gone => QemuError::Protocol(format!(
                    "{addr} does not speak the gdb remote protocol (is it QEMU's -gdb socket?)"
                )),
                e => e,
            })?;
        let sup = String::from_utf8_lossy(&sup).into_owned();
        if let Some(size) = sup
            .split(';')
            .find_map(|f| f.strip_prefix("PacketSize="))
            .and_then(|s| usize::from_str_radix(s, 16).ok())
        {
            // Hex doubles the bytes; keep room for the framing.
            g.max_read = (size.saturating_sub(16) / 2).clamp(64, 8192);
        }
        if g.request(b"QStartNoAckMode")? == b"OK" {
            // Acks stop after this reply's own ack.
            g.send_raw(b"+")?;
            g.buf.retain(|&b| b != b'+');
            g.no_ack = true;
        }
        g.stream.set_timeout(Duration::from_secs(5))?;
        // Where the guest is: a stop reply (QEMU stopped it on connect).
        g.send(b"?")?;
        let _ = g.recv()?;
        Ok(g)
    }

    fn send_raw(&mut self, b: &[u8]) -> Result<()> {
        self.stream.write_all(b).map_err(read_error)
    }

    fn send(&mut self, data: &[u8]) -> Result<()> {
        let sum = data.iter().fold(0u8, |a, &b| a.wrapping_add(b));
        let mut p = Vec::with_capacity(data.len() + 4);
        p.push(b'$');
        p.extend_from_slice(data);
        p.extend_from_slice(format!("#{sum:02x}").as_bytes());
        self.send_raw(&p)
    }

    /// The next packet's data (acks and stray bytes before it skipped; acked unless no-ack).
    fn recv(&mut self) -> Result<Vec<u8>> {
        loop {
            if let Some(start) = self.buf.iter().position(|&b| b == b'$') {
                if let Some(hash) = self.buf[start..].iter().position(|&b| b == b'#') {
                    let end = start + hash;
                    if self.buf.len() >= end + 3 {
                        let data = self.buf[start + 1..end].to_vec();
                        self.buf.drain(..end + 3);
                        if !self.no_ack {
                            self.send_raw(b"+")?;
                        }
                        return Ok(unescape(&data));
                    }
                }
            }
            let mut chunk = [0u8; 65536];
            let n = match self.stream.read(&mut chunk) {
                Ok(n) => n,
                // A signal (Ctrl-C) interrupted the read: superprof decides what to do next.
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
                Err(e) => return Err(read_error(e)),
            };
            if n == 0 {
                return Err(QemuError::Gone);
            }
            self.buf.extend_from_slice(&chunk[..n]);
        }
    }

    fn request(&mut self, data: &[u8]) -> Result<Vec<u8>> {
        self.send(data)?;
        self.reply()
    }

    /// The reply to a request: console output (`O...`) and stray stop replies are skipped, a
    /// guest that ended (`W`, `X`) is [`QemuError::Gone`], and a File-I/O request (`F...`,
    /// semihosting) is answered "not supported".
    fn reply(&mut self) -> Result<Vec<u8>> {
        loop {
            let r = self.recv()?;
            match r.first() {
                Some(b'O') if r != b"OK" => continue,
                Some(b'W') | Some(b'X') if r.len() >= 3 => return Err(QemuError::Gone),
                Some(b'T') | Some(b'S') if r.len() >= 3 => continue,
                Some(b'F') => {
                    self.send(b"F-1,58")?;
                    continue;
                }
                _ => return Ok(r),
            }
        }
    }

    fn check_stop_reply(r: &[u8]) -> Result<()> {
        match r.first() {
            Some(b'T') | Some(b'S') => Ok(()),
            Some(b'W') | Some(b'X') => Err(QemuError::Gone),
            _ => Err(QemuError::Protocol(format!(
                "unexpected gdbstub reply: {}",
                String::from_utf8_lossy(r)
            ))),
        }
    }
}

/// The binary escapes of the protocol (`}` then byte ^ 0x20), and run-length `*`.
fn unescape(data: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(data.len());
    let mut i = 0;
    while i < data.len() {
        match data[i] {
            b'}' if i + 1 < data.len() => {
                out.push(data[i + 1] ^ 0x20);
                i += 2;
            }
            b'*' if i + 1 < data.len() && !out.is_empty() => {
                let n = data[i + 1].saturating_sub(29) as usize;
                let last = *out.last().expect("non-empty");
                out.extend(std::iter::repeat_n(last, n));
                i += 2;
            }
            b => {
                out.push(b);
                i += 1;
            }
        }
    }
    out
}

impl Drop for Gdb {
    /// Detaching lets the guest run on (QEMU resumes it), whatever happened before.
    fn drop(&mut self) {
        let _ = self.send(b"D");
    }
}

impl Backend for Gdb {
    fn arch(&mut self) -> Result<GuestArch> {
        if let Some(a) = self.arch {
            return Ok(a);
        }
        let xml = self.request(b"qXfer:features:read:target.xml:0,ffb")?;
        let text = String::from_utf8_lossy(&xml);
        let a = if text.contains("aarch64") {
            GuestArch::Aarch64
        } else if text.contains("x86-64") || text.contains("x86_64") {
            GuestArch::X86_64
        } else {
            return Err(QemuError::Protocol(format!(
                "unsupported guest architecture: {}",
                text.chars().take(120).collect::<String>()
            )));
        };
        self.arch = Some(a);
        Ok(a)
    }

    fn stop(&mut self) -> Result<()> {
        if !self.running {
            return Ok(());
        }
        self.send_raw(&[0x03])?;
        // Console output may come first.
        let r = loop {
            let r = self.recv()?;
            if r.first() == Some(&b'O') && r != b"OK" {
                continue;
            }
            break r;
        };
        Self::check_stop_reply(&r)?;
        self.running = false;
        Ok(())
    }

    fn vcpus(&mut self) -> Result<usize> {
        if let Some(t) = &self.threads {
            return Ok(t.len());
        }
        let mut ids = Vec::new();
        let mut r = self.request(b"qfThreadInfo")?;
        while r.first() == Some(&b'm') {
            ids.extend(
                String::from_utf8_lossy(&r[1..])
                    .split(',')
                    .filter(|t| !t.is_empty())
                    .map(str::to_owned),
            );
            r = self.request(b"qsThreadInfo")?;
        }
        if ids.is_empty() {
            ids.push("0".to_owned()); // a stub without threads: the one CPU
        }
        let n = ids.len();
        self.threads = Some(ids);
        Ok(n)
    }

    fn select(&mut self, index: usize) -> Result<()> {
        self.vcpus()?;
        let Some(id) = self.threads.as_ref().and_then(|t| t.get(index)).cloned() else {
            return Err(QemuError::Protocol(format!("no vCPU {index}")));
        };
        if id == "0" {
            return Ok(());
        }
        match self.request(format!("Hg{id}").as_bytes())?.as_slice() {
            b"OK" => Ok(()),
            r => Err(QemuError::Protocol(format!(
                "cannot select vCPU {index}: {}",
                String::from_utf8_lossy(r)
            ))),
        }
    }

    fn regs(&mut self) -> Result<GuestRegs> {
        let arch = self.arch()?;
        let r = self.request(b"g")?;
        let bytes = unhex(&r).ok_or_else(|| {
            QemuError::Protocol(format!(
                "bad register reply: {}",
                String::from_utf8_lossy(&r)
            ))
        })?;
        let word = |i: usize| -> Result<u64> {
            bytes
                .get(i * 8..i * 8 + 8)
                .map(|b| u64::from_le_bytes(b.try_into().expect("8 bytes")))
                .ok_or_else(|| QemuError::Protocol("short register reply".into()))
        };
        Ok(match arch {
            // rax rbx rcx rdx rsi rdi rbp rsp r8..r15 rip
            GuestArch::X86_64 => GuestRegs {
                pc: word(16)?,
                sp: word(7)?,
                fp: word(6)?,
                lr: 0,
            },
            // x0..x30 sp pc
            GuestArch::Aarch64 => GuestRegs {
                pc: word(32)?,
                sp: word(31)?,
                fp: word(29)?,
                lr: word(30)?,
            },
        })
    }

    fn read(&mut self, addr: u64, buf: &mut [u8]) -> Result<usize> {
        let mut done = 0;
        while done < buf.len() {
            let n = (buf.len() - done).min(self.max_read);
            let a = addr + done as u64;
            let r = self.request(format!("m{a:x},{n:x}").as_bytes())?;
            if r.first() == Some(&b'E') || r.is_empty() {
                break;
            }
            let bytes = unhex(&r).ok_or_else(|| QemuError::Protocol("bad memory reply".into()))?;
            let k = bytes.len().min(n);
            buf[done..done + k].copy_from_slice(&bytes[..k]);
            done += k;
            if k < n {
                break;
            }
        }
        Ok(done)
    }

    fn resume(&mut self) -> Result<()> {
        if self.running {
            return Ok(());
        }
        self.send(b"c")?;
        self.running = true;
        Ok(())
    }

    fn quit(&mut self) -> Result<()> {
        // `k`: kill the guest; QEMU exits.
        let _ = self.send(b"k");
        Ok(())
    }
}
