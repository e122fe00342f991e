//! superprof-qemu: a guest's registers and memory, read from outside through QEMU.
//!
//! Two backends behind one interface, [`Backend`]: the gdbstub remote protocol ([`Gdb`]:
//! `g` for registers, `m` for memory, 0x03 to stop, `c` to go on; no-ack mode) and QMP
//! ([`Qmp`]: `stop`/`cont`, `info registers` through `human-monitor-command`, and guest
//! memory in bulk through `memsave`, or one HMP `x` per word, as the design this comes from
//! did, for comparison). Both connect to a Unix socket path or `HOST:PORT`.
//!
//! No sampling policy lives here: the caller decides when to stop the guest; one sample's
//! work (stop, read, unwind through guest memory, resume; the guest's programs recognized by
//! their code) is [`sampler::Sampler`]'s.
//!
//! The peer is not trusted: every reply must come within a deadline ([`REPLY_TIMEOUT`]), a
//! QMP line or gdb packet may not pass a size cap, thread and vCPU lists are capped, and a
//! caller's [`Cancel`] check (Ctrl-C, the end of the run) is looked at every
//! [`POLL`] while waiting, so a peer that floods, trickles or never ends a reply costs
//! bounded memory and time.
//!
//! ```no_run
//! use superprof_qemu::{Backend, Gdb};
//! let mut g = Gdb::connect("/tmp/qemu-gdb.sock").unwrap();
//! g.stop().unwrap();
//! let regs = g.regs().unwrap();
//! let mut stack = [0u8; 256];
//! g.read(regs.sp, &mut stack).unwrap();
//! g.resume().unwrap();
//! ```
#![forbid(unsafe_code)]
#![deny(missing_docs)]

mod gdb;
pub mod profile;
mod qmp;
pub mod sampler;
pub mod session;
pub mod tdesc;

pub use gdb::Gdb;
pub use qmp::Qmp;
pub use superprof_unwind::Arch;

use std::io::{Read, Write};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// The registers a sample needs: pc, stack pointer, frame pointer (rbp / x29) and link
/// register (x30 on AArch64, 0 on x86_64).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct GuestRegs {
    /// The program counter (rip, pc): a guest virtual address.
    pub pc: u64,
    /// The stack pointer (rsp, sp): a guest virtual address.
    pub sp: u64,
    /// The frame pointer (rbp, x29).
    pub fp: u64,
    /// The link register (x30) on AArch64; 0 on x86_64.
    pub lr: u64,
}

/// Why talking to QEMU failed.
#[derive(Debug, thiserror::Error)]
pub enum QemuError {
    /// The socket could not be opened (no such path, refused, no route to `HOST:PORT`).
    #[error("cannot connect to {addr}: {source}")]
    Connect {
        /// The address as given: a Unix socket path or `HOST:PORT`.
        addr: String,
        /// The system's reason.
        #[source]
        source: std::io::Error,
    },
    /// The peer answered something this client does not take: not the protocol, a reply
    /// over a size cap, an error reply, a value out of range. One line, for the user.
    #[error("{0}")]
    Protocol(String),
    /// The connection closed or QEMU said the guest ended.
    #[error("QEMU closed the connection (the guest ended?)")]
    Gone,
    /// A reply did not come whole within the time given (the limit is in the variant), or a
    /// write blocked that long because the peer does not read.
    #[error("QEMU did not answer within {0:?}")]
    Timeout(Duration),
    /// The caller's [`Cancel`] check said to stop waiting (Ctrl-C, the end of the run).
    #[error("interrupted while waiting for QEMU")]
    Cancelled,
    /// Another I/O error on the socket or on a local file (QMP's `memsave` file).
    #[error("{0}")]
    Io(#[from] std::io::Error),
}

/// A result whose error is a [`QemuError`].
pub type Result<T> = std::result::Result<T, QemuError>;

/// Says whether to give up waiting for the peer (Ctrl-C, the end of the run): looked at
/// every [`POLL`] while a reply is awaited.
pub type Cancel = Arc<dyn Fn() -> bool + Send + Sync>;

/// The longest a reply may take, from the request to its end.
pub const REPLY_TIMEOUT: Duration = Duration::from_secs(5);
/// How often a wait for the peer looks at the clock and the [`Cancel`] check.
pub const POLL: Duration = Duration::from_millis(50);
/// The longest [`Backend::let_go`] (and a drop) waits for the peer, whatever [`Cancel`] says.
pub const GRACE: Duration = Duration::from_millis(500);
/// The most vCPUs (gdbstub threads) a guest may report.
pub const MAX_VCPUS: usize = 4096;
/// A write to the peer that blocks this long fails (a peer that does not read).
const WRITE_TIMEOUT: Duration = Duration::from_secs(1);

/// A guest controlled from outside.
pub trait Backend {
    /// The guest's architecture, as QEMU reports it.
    fn arch(&mut self) -> Result<Arch>;
    /// Stops the guest (every vCPU).
    fn stop(&mut self) -> Result<()>;
    /// The guest's vCPUs (their number is their index for [`Backend::select`]).
    fn vcpus(&mut self) -> Result<usize>;
    /// Makes vCPU `index` the current one, for [`Backend::regs`] and [`Backend::read`].
    fn select(&mut self, index: usize) -> Result<()>;
    /// Registers of the current vCPU of a stopped guest.
    fn regs(&mut self) -> Result<GuestRegs>;
    /// The current vCPU's address space (call after [`Backend::regs`]): the physical address
    /// of its page-table root, CR3 on x86_64 and TTBR0_EL1 on AArch64 (the user half's), with
    /// PCID or ASID and flag bits cleared ([`space_root`]); None where the backend cannot
    /// read it.
    fn space(&mut self) -> Result<Option<u64>>;
    /// Reads guest virtual memory (as the current vCPU sees it); returns the bytes read.
    fn read(&mut self, addr: u64, buf: &mut [u8]) -> Result<usize>;
    /// Lets the guest run again.
    fn resume(&mut self) -> Result<()>;
    /// Asks QEMU to quit (launch mode, at the end); waits at most [`GRACE`].
    fn quit(&mut self) -> Result<()>;
    /// Replaces the check that ends every wait for the peer with [`QemuError::Cancelled`].
    fn set_cancel(&mut self, cancel: Cancel);
    /// Lets a guest that we may have left stopped run again (after [`QemuError::Cancelled`]
    /// or any error, mid-sample); waits at most [`GRACE`] and ignores the [`Cancel`] check.
    /// Best effort: errors are ignored.
    fn let_go(&mut self);
}

/// The register that roots the address space of user code: `cr3` (x86_64) or `TTBR0_EL1`
/// (AArch64), as gdbstubs name them.
pub fn space_register(arch: Arch) -> &'static str {
    match arch {
        Arch::X86_64 => "cr3",
        Arch::Aarch64 => "TTBR0_EL1",
    }
}

/// An address space's identity from the raw register: CR3 without its PCID and flag bits
/// (0-11) and bit 63 (no-flush); TTBR0_EL1 without its ASID (48-63) and CnP (0). A process
/// keeps it while it lives, whatever PCID or ASID the kernel gives it.
pub fn space_root(arch: Arch, raw: u64) -> u64 {
    match arch {
        Arch::X86_64 => raw & 0x000f_ffff_ffff_f000,
        Arch::Aarch64 => raw & 0x0000_ffff_ffff_fffe,
    }
}

/// A [`Cancel`] check that never cancels.
pub fn never() -> Cancel {
    Arc::new(|| false)
}

/// A connected socket: Unix path, or HOST:PORT over TCP.
pub(crate) trait Stream: Read + Write + Send {}

impl Stream for std::os::unix::net::UnixStream {}

impl Stream for std::net::TcpStream {}

/// Connects to a Unix socket path, or to HOST:PORT when `addr` is not an existing path and
/// looks like one.
fn open(addr: &str) -> Result<Box<dyn Stream>> {
    let err = |source| QemuError::Connect {
        addr: addr.to_owned(),
        source,
    };
    let path = std::path::Path::new(addr);
    let tcp = !path.exists()
        && addr
            .rsplit_once(':')
            .is_some_and(|(_, p)| p.parse::<u16>().is_ok());
    if tcp {
        use std::net::ToSocketAddrs;
        let addr = addr.strip_prefix("tcp:").unwrap_or(addr);
        let mut last = std::io::Error::other("no address");
        for a in addr.to_socket_addrs().map_err(err)? {
            match std::net::TcpStream::connect_timeout(&a, REPLY_TIMEOUT) {
                Ok(s) => {
                    s.set_nodelay(true).map_err(err)?;
                    s.set_read_timeout(Some(POLL)).map_err(err)?;
                    s.set_write_timeout(Some(WRITE_TIMEOUT)).map_err(err)?;
                    return Ok(Box::new(s));
                }
                Err(e) => last = e,
            }
        }
        Err(err(last))
    } else {
        let p = addr.strip_prefix("unix:").unwrap_or(addr);
        let s = std::os::unix::net::UnixStream::connect(p).map_err(err)?;
        s.set_read_timeout(Some(POLL)).map_err(err)?;
        s.set_write_timeout(Some(WRITE_TIMEOUT)).map_err(err)?;
        Ok(Box::new(s))
    }
}

/// A connection to an untrusted peer: bytes received but not consumed yet, and the
/// deadline of the reply being waited for.
pub(crate) struct Conn {
    stream: Box<dyn Stream>,
    /// Received, not consumed yet.
    pub buf: Vec<u8>,
    /// The most bytes `buf` may hold (one line or packet, and what arrived with it).
    max_buf: usize,
    cancel: Cancel,
    /// The longest a reply may take.
    pub timeout: Duration,
    deadline: Instant,
    /// The limit of the current wait (`timeout`, or [`GRACE`] for a cleanup wait), for a
    /// [`QemuError::Timeout`].
    limit: Duration,
    /// Whether the [`Cancel`] check applies to the current wait (not during cleanup).
    cancellable: bool,
}

impl Conn {
    pub fn connect(addr: &str, max_buf: usize, cancel: Cancel) -> Result<Conn> {
        Ok(Conn {
            stream: open(addr)?,
            buf: Vec::new(),
            max_buf,
            cancel,
            timeout: REPLY_TIMEOUT,
            deadline: Instant::now() + REPLY_TIMEOUT,
            limit: REPLY_TIMEOUT,
            cancellable: true,
        })
    }

    pub fn set_cancel(&mut self, cancel: Cancel) {
        self.cancel = cancel;
    }

    /// Starts the wait for a reply: it must be complete within the timeout.
    pub fn begin(&mut self) {
        self.deadline = Instant::now() + self.timeout;
        self.limit = self.timeout;
        self.cancellable = true;
    }

    /// Starts a cleanup wait: at most [`GRACE`], whatever the [`Cancel`] check says.
    pub fn begin_cleanup(&mut self) {
        self.deadline = Instant::now() + GRACE;
        self.limit = GRACE;
        self.cancellable = false;
    }

    pub fn write_all(&mut self, b: &[u8]) -> Result<()> {
        self.stream.write_all(b).map_err(read_error)
    }

    /// Reads what the peer sent next into `buf`, waiting until the deadline at most.
    pub fn fill(&mut self) -> Result<()> {
        let mut chunk = [0u8; 16384];
        loop {
            if self.cancellable && (self.cancel)() {
                return Err(QemuError::Cancelled);
            }
            if Instant::now() >= self.deadline {
                return Err(QemuError::Timeout(self.limit));
            }
            match self.stream.read(&mut chunk) {
                Ok(0) => return Err(QemuError::Gone),
                Ok(n) => {
                    if self.buf.len().saturating_add(n) > self.max_buf {
                        return Err(QemuError::Protocol(format!(
                            "QEMU sent a message of more than {} bytes",
                            self.max_buf
                        )));
                    }
                    self.buf.extend_from_slice(&chunk[..n]);
                    return Ok(());
                }
                // A signal (Ctrl-C), or one poll period without data: look at the clock and
                // the cancel check again.
                Err(e)
                    if matches!(
                        e.kind(),
                        std::io::ErrorKind::Interrupted
                            | std::io::ErrorKind::WouldBlock
                            | std::io::ErrorKind::TimedOut
                    ) => {}
                Err(e) => return Err(read_error(e)),
            }
        }
    }
}

/// Text from the peer, for a message: at most 80 bytes, control characters escaped (one
/// line, nothing for the terminal to act on).
pub(crate) fn shown(text: &[u8]) -> String {
    let t = String::from_utf8_lossy(&text[..text.len().min(80)]).into_owned();
    t.escape_debug().to_string()
}

/// Maps an I/O error on the socket to Gone, Timeout or Io.
pub(crate) fn read_error(e: std::io::Error) -> QemuError {
    match e.kind() {
        std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut => {
            QemuError::Timeout(WRITE_TIMEOUT)
        }
        std::io::ErrorKind::UnexpectedEof
        | std::io::ErrorKind::ConnectionReset
        | std::io::ErrorKind::BrokenPipe => QemuError::Gone,
        _ => QemuError::Io(e),
    }
}

#[cfg(test)]
pub(crate) mod tests {
    //! Fake peers on Unix sockets, for the clients' tests.
    use std::io::Write;
    use std::os::unix::net::{UnixListener, UnixStream};
    use std::path::PathBuf;

    /// A socket path of its own, and a thread that serves its first connection with `serve`.
    pub fn peer(tag: &str, serve: fn(UnixStream) -> std::io::Result<()>) -> String {
        let path: PathBuf = std::env::temp_dir().join(format!(
            "superprof-qemu-test-{}-{tag}.sock",
            std::process::id()
        ));
        let _ = std::fs::remove_file(&path);
        let listener = UnixListener::bind(&path).unwrap();
        std::thread::spawn(move || {
            if let Ok((c, _)) = listener.accept() {
                let _ = serve(c);
            }
        });
        path.to_string_lossy().into_owned()
    }

    /// Junk as fast as the client takes it, after `head`.
    pub fn flood(mut c: UnixStream, head: &[u8]) -> std::io::Result<()> {
        c.write_all(head)?;
        loop {
            c.write_all(&[b'A'; 4096])?;
        }
    }

    /// Says nothing, and keeps the connection open.
    fn silent(c: UnixStream) -> std::io::Result<()> {
        std::thread::sleep(std::time::Duration::from_secs(10));
        drop(c);
        Ok(())
    }

    #[test]
    fn a_timeout_reports_the_limit_of_its_wait() {
        use super::{Conn, QemuError, GRACE};
        use std::time::Duration;
        let sock = peer("silent", silent);
        let mut c = Conn::connect(&sock, 1024, super::never()).unwrap();
        c.begin_cleanup();
        let r = c.fill();
        assert!(
            matches!(r, Err(QemuError::Timeout(d)) if d == GRACE),
            "{r:?}"
        );
        c.timeout = Duration::from_millis(200);
        c.begin();
        let r = c.fill();
        assert!(
            matches!(r, Err(QemuError::Timeout(d)) if d == Duration::from_millis(200)),
            "{r:?}"
        );
    }

    /// `bytes` over and over, a byte every 20 ms.
    pub fn trickle(mut c: UnixStream, bytes: &[u8]) -> std::io::Result<()> {
        for b in bytes.iter().cycle() {
            c.write_all(&[*b])?;
            std::thread::sleep(std::time::Duration::from_millis(20));
        }
        Ok(())
    }
}
