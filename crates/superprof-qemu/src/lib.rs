//! superprof-qemu: a guest's registers and memory, read from outside through QEMU.
//!
//! Two backends behind one interface, [`Backend`]: the gdbstub remote protocol ([`Gdb`]:
//! `g` for registers, `m` for memory, 0x03 to stop, `c` to go on; no-ack mode) and QMP
//! ([`Qmp`]: `stop`/`cont`, `info registers` through `human-monitor-command`, and guest
//! memory in bulk through `memsave`, or one HMP `x` per word, as the design this comes from
//! did, for comparison). Both connect to a Unix socket path or `HOST:PORT`.
//!
//! No sampling policy lives here: the caller stops the guest, reads what it needs, and lets it
//! go on.
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

mod gdb;
mod qmp;

pub use gdb::Gdb;
pub use qmp::Qmp;
pub use superprof_unwind::GuestArch;

use std::io::{Read, Write};
use std::time::Duration;

/// The registers a sample needs: pc, stack pointer, frame pointer (rbp / x29) and link
/// register (x30 on AArch64, 0 on x86_64).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct GuestRegs {
    pub pc: u64,
    pub sp: u64,
    pub fp: u64,
    pub lr: u64,
}

#[derive(Debug, thiserror::Error)]
pub enum QemuError {
    #[error("cannot connect to {addr}: {source}")]
    Connect {
        addr: String,
        #[source]
        source: std::io::Error,
    },
    #[error("{0}")]
    Protocol(String),
    /// The connection closed or QEMU said the guest ended.
    #[error("QEMU closed the connection (the guest ended?)")]
    Gone,
    #[error("QEMU did not answer within {0:?}")]
    Timeout(Duration),
    #[error("{0}")]
    Io(#[from] std::io::Error),
}

pub type Result<T> = std::result::Result<T, QemuError>;

/// A guest controlled from outside.
pub trait Backend {
    /// The guest's architecture, as QEMU reports it.
    fn arch(&mut self) -> Result<GuestArch>;
    /// Stops the guest (every vCPU).
    fn stop(&mut self) -> Result<()>;
    /// The guest's vCPUs (their number is their index for [`Backend::select`]).
    fn vcpus(&mut self) -> Result<usize>;
    /// Makes vCPU `index` the current one, for [`Backend::regs`] and [`Backend::read`].
    fn select(&mut self, index: usize) -> Result<()>;
    /// Registers of the current vCPU of a stopped guest.
    fn regs(&mut self) -> Result<GuestRegs>;
    /// Reads guest virtual memory (as the current vCPU sees it); returns the bytes read.
    fn read(&mut self, addr: u64, buf: &mut [u8]) -> Result<usize>;
    /// Lets the guest run again.
    fn resume(&mut self) -> Result<()>;
    /// Asks QEMU to quit (launch mode, at the end).
    fn quit(&mut self) -> Result<()>;
}

/// A connected socket: Unix path, or HOST:PORT over TCP.
pub(crate) trait Stream: Read + Write + Send {
    fn set_timeout(&self, t: Duration) -> std::io::Result<()>;
}

impl Stream for std::os::unix::net::UnixStream {
    fn set_timeout(&self, t: Duration) -> std::io::Result<()> {
        self.set_read_timeout(Some(t))
    }
}

impl Stream for std::net::TcpStream {
    fn set_timeout(&self, t: Duration) -> std::io::Result<()> {
        self.set_nodelay(true)?;
        self.set_read_timeout(Some(t))
    }
}

/// Connects to a Unix socket path, or to HOST:PORT when `addr` is not an existing path and
/// looks like one.
pub(crate) fn connect(addr: &str) -> Result<Box<dyn Stream>> {
    let err = |source| QemuError::Connect {
        addr: addr.to_owned(),
        source,
    };
    let path = std::path::Path::new(addr);
    let tcp = !path.exists()
        && addr
            .rsplit_once(':')
            .is_some_and(|(_, p)| p.parse::<u16>().is_ok());
    let s: Box<dyn Stream> = if tcp {
        let addr = addr.strip_prefix("tcp:").unwrap_or(addr);
        Box::new(std::net::TcpStream::connect(addr).map_err(err)?)
    } else {
        let p = addr.strip_prefix("unix:").unwrap_or(addr);
        Box::new(std::os::unix::net::UnixStream::connect(p).map_err(err)?)
    };
    s.set_timeout(Duration::from_secs(5)).map_err(err)?;
    Ok(s)
}

/// Maps a read error to Timeout or Gone.
pub(crate) fn read_error(e: std::io::Error) -> QemuError {
    match e.kind() {
        std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut => {
            QemuError::Timeout(Duration::from_secs(5))
        }
        std::io::ErrorKind::UnexpectedEof
        | std::io::ErrorKind::ConnectionReset
        | std::io::ErrorKind::BrokenPipe => QemuError::Gone,
        _ => QemuError::Io(e),
    }
}
