//! The gdbstub remote serial protocol, as QEMU speaks it: packets `$data#xx`, no-ack mode,
//! 0x03 to stop, `g`/`m`/`c`.

use std::time::Duration;

use crate::{shown, Arch, Backend, Cancel, Conn, GuestRegs, QemuError, Result, MAX_VCPUS};

/// The longest packet taken from the stub, before and after its escapes and run-length
/// encoding are undone (QEMU's packets are at most 4 KiB).
pub const MAX_PACKET: usize = 128 << 10;
/// The longest thread id (`p1.1`...).
const MAX_THREAD_ID: usize = 64;

/// A guest reached through QEMU's gdbstub (`-gdb`, `-s`): registers from `g` packets (laid
/// out by the stub's target description), memory from `m` packets, one connection.
pub struct Gdb {
    conn: Conn,
    /// Bytes of `conn.buf` after the `$` already searched for the `#`.
    scanned: usize,
    /// Bytes of memory one `m` reply can hold.
    max_read: usize,
    arch: Option<Arch>,
    /// Resumed by us, and no stop asked for since.
    running: bool,
    no_ack: bool,
    /// The vCPUs' thread ids, as the stub names them (`p1.1`, `p1.2`...).
    threads: Option<Vec<String>>,
    /// A stop was sent and its reply not read yet.
    stop_pending: bool,
    /// The last `g` reply (the current vCPU's registers).
    last_g: Vec<u8>,
    /// The address-space register's number and offset in `g`, once looked up (None inside:
    /// the stub does not have it).
    space_reg: Option<Option<(u32, Option<usize>)>>,
}

/// The most bytes of one target-description file.
const MAX_XML: usize = 1 << 20;

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
        Gdb::connect_with(addr, crate::never())
    }

    /// [`Gdb::connect`], giving up when `cancel` says so (Ctrl-C).
    pub fn connect_with(addr: &str, cancel: Cancel) -> Result<Gdb> {
        let conn = Conn::connect(addr, MAX_PACKET + 65536, cancel)?;
        let mut g = Gdb {
            conn,
            scanned: 0,
            max_read: 1024,
            arch: None,
            running: false,
            no_ack: false,
            threads: None,
            stop_pending: false,
            last_g: Vec::new(),
            space_reg: None,
        };
        g.conn.timeout = Duration::from_secs(3);
        // A running guest is stopped by the connection, and QEMU says so first (a stop
        // reply nobody asked for): skip it.
        g.conn.begin();
        let sup = g
            .send(b"qSupported:multiprocess+;swbreak+;hwbreak+;xmlRegisters=i386")
            .and_then(|_| loop {
                let r = g.recv()?;
                if !matches!(r.first(), Some(b'T') | Some(b'S')) {
                    break Ok(r);
                }
            })
            .map_err(|e| match e {
                QemuError::Timeout(_) | QemuError::Gone | QemuError::Protocol(_) => {
                    QemuError::Protocol(format!(
                        "{addr} does not speak the gdb remote protocol ({e}): is it QEMU's \
                         -gdb socket?"
                    ))
                }
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
            g.no_ack = true;
        }
        g.conn.timeout = crate::REPLY_TIMEOUT;
        // Where the guest is: a stop reply (QEMU stopped it on connect).
        g.conn.begin();
        g.send(b"?")?;
        let _ = g.recv()?;
        Ok(g)
    }

    fn send_raw(&mut self, b: &[u8]) -> Result<()> {
        self.conn.write_all(b)
    }

    fn send(&mut self, data: &[u8]) -> Result<()> {
        let sum = data.iter().fold(0u8, |a, &b| a.wrapping_add(b));
        let mut p = Vec::with_capacity(data.len() + 4);
        p.push(b'$');
        p.extend_from_slice(data);
        p.extend_from_slice(format!("#{sum:02x}").as_bytes());
        self.send_raw(&p)
    }

    /// The next packet's data (acks and stray bytes before it skipped; acked unless no-ack),
    /// within the current wait's deadline.
    fn recv(&mut self) -> Result<Vec<u8>> {
        loop {
            // Whatever comes before a packet (acks, noise) is dropped at once.
            match self.conn.buf.iter().position(|&b| b == b'$') {
                Some(0) => {}
                Some(start) => {
                    self.conn.buf.drain(..start);
                    self.scanned = 0;
                }
                None => {
                    self.conn.buf.clear();
                    self.scanned = 0;
                }
            }
            if !self.conn.buf.is_empty() {
                let from = self.scanned.max(1);
                if let Some(hash) = self.conn.buf[from..].iter().position(|&b| b == b'#') {
                    let end = from + hash;
                    if self.conn.buf.len() >= end + 3 {
                        // The checksum covers the data as sent (escaped). A local socket does
                        // not corrupt bytes: a wrong one is a broken or hostile peer, not a
                        // packet to ask for again.
                        let sum = self.conn.buf[1..end]
                            .iter()
                            .fold(0u8, |a, &b| a.wrapping_add(b));
                        let given = std::str::from_utf8(&self.conn.buf[end + 1..end + 3])
                            .ok()
                            .and_then(|h| u8::from_str_radix(h, 16).ok());
                        if given != Some(sum) {
                            return Err(QemuError::Protocol(format!(
                                "a gdbstub packet with a bad checksum ({:?} for {sum:02x})",
                                String::from_utf8_lossy(&self.conn.buf[end + 1..end + 3])
                            )));
                        }
                        let data = unescape(&self.conn.buf[1..end])?;
                        self.conn.buf.drain(..end + 3);
                        self.scanned = 0;
                        if !self.no_ack {
                            self.send_raw(b"+")?;
                        }
                        return Ok(data);
                    }
                } else {
                    self.scanned = self.conn.buf.len();
                    if self.scanned > MAX_PACKET {
                        return Err(QemuError::Protocol(format!(
                            "a gdbstub packet of more than {} KiB",
                            MAX_PACKET >> 10
                        )));
                    }
                }
            }
            self.conn.fill()?;
        }
    }

    fn request(&mut self, data: &[u8]) -> Result<Vec<u8>> {
        self.conn.begin();
        self.send(data)?;
        self.stop_reply()?;
        self.reply()
    }

    /// The reply to a stop sent before, if one is awaited.
    fn stop_reply(&mut self) -> Result<()> {
        if !std::mem::take(&mut self.stop_pending) {
            return Ok(());
        }
        // Console output may come first.
        let r = loop {
            let r = self.recv()?;
            if r.first() == Some(&b'O') && r != b"OK" {
                continue;
            }
            break r;
        };
        Self::check_stop_reply(&r)
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

    /// One file of the target description (`qXfer:features:read`), in as many pieces as
    /// the stub sends, at most [`MAX_XML`] bytes.
    fn xfer(&mut self, annex: &str, deadline: std::time::Instant) -> Result<String> {
        let mut out = Vec::new();
        loop {
            // Small pieces, or slow ones, cannot stretch it: one deadline for the whole
            // description (its pieces each get a fresh reply deadline).
            if std::time::Instant::now() > deadline {
                return Err(QemuError::Protocol(
                    "the gdbstub's target description came too slowly".into(),
                ));
            }
            let r = self.request(
                format!("qXfer:features:read:{annex}:{:x},{:x}", out.len(), 0xffb).as_bytes(),
            )?;
            let (last, data) = match r.split_first() {
                Some((b'l', d)) => (true, d),
                Some((b'm', d)) if !d.is_empty() => (false, d),
                _ => {
                    return Err(QemuError::Protocol(format!(
                        "cannot read {}: {}",
                        shown(annex.as_bytes()),
                        shown(&r)
                    )))
                }
            };
            if out.len() + data.len() > MAX_XML {
                return Err(QemuError::Protocol(format!(
                    "{} is more than {} KiB",
                    shown(annex.as_bytes()),
                    MAX_XML >> 10
                )));
            }
            out.extend_from_slice(data);
            if last {
                return Ok(String::from_utf8_lossy(&out).into_owned());
            }
        }
    }

    fn check_stop_reply(r: &[u8]) -> Result<()> {
        match r.first() {
            Some(b'T') | Some(b'S') => Ok(()),
            Some(b'W') | Some(b'X') => Err(QemuError::Gone),
            _ => Err(QemuError::Protocol(format!(
                "unexpected gdbstub reply: {}",
                shown(r)
            ))),
        }
    }
}

/// The binary escapes of the protocol (`}` then byte ^ 0x20), and run-length `*`; the
/// result is at most [`MAX_PACKET`] bytes.
fn unescape(data: &[u8]) -> Result<Vec<u8>> {
    let too_long = || {
        QemuError::Protocol(format!(
            "a gdbstub packet of more than {} KiB",
            MAX_PACKET >> 10
        ))
    };
    let mut out = Vec::with_capacity(data.len().min(MAX_PACKET));
    let mut i = 0;
    while i < data.len() {
        match data[i] {
            b'}' if i + 1 < data.len() => {
                out.push(data[i + 1] ^ 0x20);
                i += 2;
            }
            b'*' if i + 1 < data.len() && !out.is_empty() => {
                let n = data[i + 1].saturating_sub(29) as usize;
                if out.len() + n > MAX_PACKET {
                    return Err(too_long());
                }
                let last = out[out.len() - 1];
                out.extend(std::iter::repeat_n(last, n));
                i += 2;
            }
            b => {
                out.push(b);
                i += 1;
            }
        }
        if out.len() > MAX_PACKET {
            return Err(too_long());
        }
    }
    Ok(out)
}

impl Drop for Gdb {
    /// Detaching lets the guest run on (QEMU resumes it), whatever happened before.
    fn drop(&mut self) {
        let _ = self.send(b"D");
    }
}

/// The thread ids of one `m` reply of `qfThreadInfo`/`qsThreadInfo`.
fn thread_ids(list: &[u8], ids: &mut Vec<String>) -> Result<()> {
    for t in list.split(|&b| b == b',').filter(|t| !t.is_empty()) {
        let valid = t.len() <= MAX_THREAD_ID
            && t.iter()
                .all(|&b| b.is_ascii_hexdigit() || matches!(b, b'p' | b'.' | b'-'));
        if !valid {
            return Err(QemuError::Protocol(format!(
                "bad gdbstub thread id: {}",
                shown(t)
            )));
        }
        if ids.len() >= MAX_VCPUS {
            return Err(QemuError::Protocol(format!(
                "the gdbstub lists more than {MAX_VCPUS} threads"
            )));
        }
        ids.push(String::from_utf8_lossy(t).into_owned());
    }
    Ok(())
}

impl Backend for Gdb {
    fn arch(&mut self) -> Result<Arch> {
        if let Some(a) = self.arch {
            return Ok(a);
        }
        let xml = self.request(b"qXfer:features:read:target.xml:0,ffb")?;
        let text = String::from_utf8_lossy(&xml);
        let a = if text.contains("aarch64") {
            Arch::Aarch64
        } else if text.contains("x86-64") || text.contains("x86_64") {
            Arch::X86_64
        } else {
            return Err(QemuError::Protocol(format!(
                "unsupported guest architecture: {}",
                shown(&xml)
            )));
        };
        self.arch = Some(a);
        Ok(a)
    }

    /// Sends the stop; its reply is taken after the next request is sent (one round trip
    /// less a sample: QEMU stops the guest when the byte arrives, before it reads the
    /// request behind it).
    fn stop(&mut self) -> Result<()> {
        if !self.running {
            return Ok(());
        }
        // Set first: if the stop reply never comes, the guest may be stopped all the same.
        self.running = false;
        self.stop_pending = true;
        self.conn.begin();
        self.send_raw(&[0x03])
    }

    fn vcpus(&mut self) -> Result<usize> {
        if let Some(t) = &self.threads {
            return Ok(t.len());
        }
        let mut ids = Vec::new();
        let mut r = self.request(b"qfThreadInfo")?;
        // Each `m` reply names one thread or more; an endless list is cut at MAX_VCPUS.
        let mut replies = 0;
        while r.first() == Some(&b'm') {
            thread_ids(&r[1..], &mut ids)?;
            replies += 1;
            if replies > MAX_VCPUS {
                return Err(QemuError::Protocol(format!(
                    "the gdbstub lists more than {MAX_VCPUS} threads"
                )));
            }
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
                shown(r)
            ))),
        }
    }

    fn regs(&mut self) -> Result<GuestRegs> {
        let arch = self.arch()?;
        let r = self.request(b"g")?;
        let bytes = unhex(&r)
            .ok_or_else(|| QemuError::Protocol(format!("bad register reply: {}", shown(&r))))?;
        self.last_g.clear();
        let word = |i: usize| -> Result<u64> {
            bytes
                .get(i * 8..i * 8 + 8)
                .map(|b| u64::from_le_bytes(b.try_into().expect("8 bytes")))
                .ok_or_else(|| QemuError::Protocol("short register reply".into()))
        };
        let regs = match arch {
            // rax rbx rcx rdx rsi rdi rbp rsp r8..r15 rip
            Arch::X86_64 => GuestRegs {
                pc: word(16)?,
                sp: word(7)?,
                fp: word(6)?,
                lr: 0,
            },
            // x0..x30 sp pc
            Arch::Aarch64 => GuestRegs {
                pc: word(32)?,
                sp: word(31)?,
                fp: word(29)?,
                lr: word(30)?,
            },
        };
        self.last_g = bytes;
        Ok(regs)
    }

    fn space(&mut self) -> Result<Option<u64>> {
        let arch = self.arch()?;
        if self.space_reg.is_none() {
            let name = crate::space_register(arch);
            let deadline = std::time::Instant::now() + crate::REPLY_TIMEOUT;
            let regs = match crate::tdesc::registers(&mut |annex| self.xfer(annex, deadline)) {
                Ok(r) => r,
                Err(QemuError::Protocol(_)) => Vec::new(),
                Err(e) => return Err(e),
            };
            self.space_reg = Some(crate::tdesc::locate(&regs, name));
        }
        let Some(Some((regnum, offset))) = self.space_reg else {
            return Ok(None);
        };
        let in_g = offset
            .and_then(|o| self.last_g.get(o..o.checked_add(8)?))
            .map(|b| u64::from_le_bytes(b.try_into().expect("8 bytes")));
        let raw = match in_g {
            Some(v) => v,
            None => {
                let r = self.request(format!("p{regnum:x}").as_bytes())?;
                match unhex(&r).and_then(|b| Some(u64::from_le_bytes(b.get(..8)?.try_into().ok()?)))
                {
                    Some(v) => v,
                    // E.., empty or short: the stub cannot give it; not asked again.
                    None => {
                        self.space_reg = Some(None);
                        return Ok(None);
                    }
                }
            }
        };
        Ok(Some(crate::space_root(arch, raw)))
    }

    fn read(&mut self, addr: u64, buf: &mut [u8]) -> Result<usize> {
        let mut done = 0;
        while done < buf.len() {
            let n = (buf.len() - done).min(self.max_read);
            let Some(a) = addr.checked_add(done as u64) else {
                break;
            };
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
        self.conn.begin();
        self.stop_reply()?;
        self.send(b"c")?;
        self.running = true;
        Ok(())
    }

    fn quit(&mut self) -> Result<()> {
        // `k`: kill the guest; QEMU exits.
        let _ = self.send(b"k");
        Ok(())
    }

    fn set_cancel(&mut self, cancel: Cancel) {
        self.conn.set_cancel(cancel);
    }

    fn let_go(&mut self) {
        // Replies to a request given up on may still come: they are skipped as strays.
        self.stop_pending = false;
        if !self.running {
            let _ = self.send(b"c");
            self.running = true;
        }
    }
}

#[cfg(test)]
mod hostile {
    use std::io::{Read, Write};
    use std::time::{Duration, Instant};

    use super::{thread_ids, unescape, Gdb, MAX_PACKET};
    use crate::tests::{flood, peer};
    use crate::{Backend, MAX_VCPUS};

    #[test]
    fn run_length_encoding_cannot_grow_a_packet_past_the_cap() {
        // "0*~" repeated: each three bytes grow by 97.
        let bomb: Vec<u8> = b"0*~".iter().copied().cycle().take(3 * 20_000).collect();
        assert!(unescape(&bomb).is_err());
        assert_eq!(unescape(b"0*\"").unwrap(), b"000000");
        assert_eq!(unescape(b"a}\x03").unwrap(), b"a#");
    }

    #[test]
    fn thread_ids_are_checked_and_capped() {
        let mut ids = Vec::new();
        thread_ids(b"p1.1,p1.2", &mut ids).unwrap();
        assert_eq!(ids, ["p1.1", "p1.2"]);
        assert!(thread_ids(b"p1.3#00$", &mut ids).is_err());
        assert!(thread_ids(&[b'1'; 65], &mut ids).is_err());
        let many = vec!["1"; MAX_VCPUS].join(",");
        assert!(thread_ids(many.as_bytes(), &mut ids).is_err());
    }

    #[test]
    fn a_packet_without_end_is_refused_at_the_cap() {
        let sock = peer("gdb-flood", |mut c| {
            let mut first = [0u8; 64];
            let _ = c.read(&mut first)?;
            flood(c, b"$")
        });
        let t = Instant::now();
        let Err(e) = Gdb::connect(&sock) else {
            panic!("connected")
        };
        assert!(
            e.to_string()
                .contains(&format!("more than {} KiB", MAX_PACKET >> 10)),
            "{e}"
        );
        assert!(t.elapsed() < Duration::from_secs(3));
    }

    /// A stub that reads packets and answers each with `reply` (the handshake too).
    fn stub(
        c: std::os::unix::net::UnixStream,
        mut reply: impl FnMut(&[u8]) -> String,
    ) -> std::io::Result<()> {
        let mut w = c.try_clone()?;
        let mut r = std::io::BufReader::new(c);
        loop {
            let mut b = [0u8];
            let mut p = Vec::new();
            loop {
                r.read_exact(&mut b)?;
                if b[0] == b'$' {
                    break;
                }
            }
            loop {
                r.read_exact(&mut b)?;
                if b[0] == b'#' {
                    r.read_exact(&mut [0u8; 2])?;
                    break;
                }
                p.push(b[0]);
            }
            let reply = match p.as_slice() {
                b"QStartNoAckMode" => "OK".to_owned(),
                b"?" => "T05".to_owned(),
                other => reply(other),
            };
            let sum = reply.bytes().fold(0u8, |a, b| a.wrapping_add(b));
            write!(w, "${reply}#{sum:02x}")?;
        }
    }

    /// A stub that lists threads forever.
    fn endless_threads(c: std::os::unix::net::UnixStream) -> std::io::Result<()> {
        let mut n = 0u32;
        stub(c, |p| match p {
            b"qfThreadInfo" | b"qsThreadInfo" => {
                n += 1;
                format!("mp1.{n:x}")
            }
            _ => String::new(),
        })
    }

    /// A stub whose target description never ends (`m` pieces for ever) after an x86_64
    /// first piece.
    fn endless_description(c: std::os::unix::net::UnixStream) -> std::io::Result<()> {
        stub(c, |p| match p {
            q if q.starts_with(b"qXfer:features:read:target.xml:0,") => {
                "m<target><architecture>i386:x86-64</architecture>".to_owned()
            }
            q if q.starts_with(b"qXfer") => {
                format!("m{}", "<reg name=\"r\" bitsize=\"64\"/>".repeat(100))
            }
            _ => String::new(),
        })
    }

    /// A stub whose description comes one byte a piece, for ever: bounded by one deadline,
    /// not one per piece (a million pieces would fit in the byte cap).
    fn crumbs(c: std::os::unix::net::UnixStream) -> std::io::Result<()> {
        stub(c, |p| match p {
            q if q.starts_with(b"qXfer:features:read:target.xml:0,") => {
                "m<target><architecture>i386:x86-64</architecture>".to_owned()
            }
            q if q.starts_with(b"qXfer") => "m ".to_owned(),
            _ => String::new(),
        })
    }

    #[test]
    fn a_description_in_crumbs_is_given_up_in_time() {
        let sock = peer("gdb-crumbs", crumbs);
        let mut g = Gdb::connect(&sock).unwrap();
        let t = Instant::now();
        assert_eq!(g.space().unwrap(), None);
        assert!(t.elapsed() < Duration::from_secs(8), "{:?}", t.elapsed());
    }

    #[test]
    fn a_description_without_end_leaves_the_address_space_unknown() {
        let sock = peer("gdb-xml", endless_description);
        let mut g = Gdb::connect(&sock).unwrap();
        let t = Instant::now();
        assert_eq!(g.space().unwrap(), None);
        // Looked up once: the next sample asks nothing.
        assert_eq!(g.space().unwrap(), None);
        assert!(t.elapsed() < Duration::from_secs(5));
    }

    /// Issue 31: a reply whose checksum is wrong is refused (it was taken unchecked).
    #[test]
    fn a_bad_checksum_is_refused() {
        let sock = peer("gdb-sum", |c| {
            let mut w = c.try_clone()?;
            let mut r = std::io::BufReader::new(c);
            let mut b = [0u8];
            loop {
                r.read_exact(&mut b)?;
                if b[0] == b'#' {
                    r.read_exact(&mut [0u8; 2])?;
                    // "OK" sums to 9a.
                    w.write_all(b"+$OK#00")?;
                }
            }
        });
        let Err(e) = Gdb::connect(&sock) else {
            panic!("connected")
        };
        assert!(e.to_string().contains("bad checksum"), "{e}");
    }

    #[test]
    fn a_thread_list_without_end_is_refused() {
        let sock = peer("gdb-threads", endless_threads);
        let mut g = Gdb::connect(&sock).unwrap();
        let e = g.vcpus().unwrap_err();
        assert!(e.to_string().contains("more than 4096 threads"), "{e}");
    }
}
