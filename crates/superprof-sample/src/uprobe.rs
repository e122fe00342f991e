//! Probes that do not stop the program: uprobes opened through `perf_event_open` (the kernel's
//! `uprobe` PMU), each hit writing a snapshot of a group of counters into a ring buffer, as
//! perf's leader sampling does (`perf record -e '{probe:fn,task-clock}:S'`).
//!
//! A [`ProbeGroup`] is one perf event group on one thread: the probes, each sampling every hit
//! (its time, thread, stack pointer, and a read of the whole group), and the counters as
//! members. It is not inherited: the kernel refuses to map the ring of an inherited per-thread
//! event (and per-CPU groups would split a thread's counts between CPUs), so the caller opens
//! one on each thread, before a new thread runs (the coordinator stops it at its creation). The kernel places the int3 of
//! each probe in every process that maps the file at that offset and runs one of the group's
//! tasks, and removes it when the last descriptor closes: a superprof that dies leaves none.
//! The `uprobe` PMU needs CAP_SYS_ADMIN (or CAP_PERFMON with a permissive paranoid level).

use std::collections::HashMap;
use std::ffi::CString;
use std::io;
use std::os::fd::{AsRawFd, OwnedFd, RawFd};
use std::os::unix::ffi::OsStrExt;
use std::path::PathBuf;

use crate::counter::{EventSpec, Reading};
use crate::record::{split_records, PERF_RECORD_LOST, PERF_RECORD_SAMPLE};
use crate::sys::{self, PerfEventAttr};

const PERF_SAMPLE_READ: u64 = 1 << 4;
const READ_FORMAT_TOTAL_TIME_ENABLED: u64 = 1;
const READ_FORMAT_TOTAL_TIME_RUNNING: u64 = 2;
const READ_FORMAT_GROUP: u64 = 8;

/// The stack pointer's bit in `sample_regs_user`.
#[cfg(target_arch = "x86_64")]
const REG_SP: u32 = 7;
#[cfg(target_arch = "aarch64")]
const REG_SP: u32 = 31;

/// The kernel's `uprobe` PMU.
#[derive(Debug, Clone, Copy)]
pub struct UprobePmu {
    type_: u32,
}

/// The uprobe PMU of this kernel (`/sys/bus/event_source/devices/uprobe`).
pub fn uprobe_pmu() -> io::Result<UprobePmu> {
    let type_ = std::fs::read_to_string("/sys/bus/event_source/devices/uprobe/type")?
        .trim()
        .parse()
        .map_err(|_| io::Error::new(io::ErrorKind::InvalidData, "unreadable uprobe PMU type"))?;
    Ok(UprobePmu { type_ })
}

/// One probe: the instruction at `offset` of file `path` (a file offset, not an address).
/// (No return probes: a uretprobe replaces the return address on the stack, and a C++
/// exception unwinding through that frame then terminates the program.)
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ProbeSpec {
    /// The file (an executable or a shared library).
    pub path: PathBuf,
    /// The instruction's offset in the file, in bytes.
    pub offset: u64,
}

/// The kernel event behind a probe.
#[derive(Debug, Clone)]
pub enum ProbeEvent {
    /// A uprobe of the `uprobe` PMU, made for each perf event opened on it: removing each
    /// costs the kernel a grace period (about 75 ms here), one after another.
    Pmu(UprobePmu, ProbeSpec),
    /// A uprobe defined in tracefs ([`ProbeDefinitions`]), by its event id: every thread's
    /// perf event on it shares one kernel uprobe, removed once, when the last one closes.
    Defined(u64),
}

use crate::sys::PERF_TYPE_TRACEPOINT;

impl ProbeEvent {
    /// The attr that names this probe (the rest left default), and the path it points at,
    /// which must live until the event is opened.
    fn attr(&self) -> io::Result<(PerfEventAttr, Option<CString>)> {
        match self {
            ProbeEvent::Pmu(pmu, p) => {
                let path = CString::new(p.path.as_os_str().as_bytes())
                    .map_err(|_| io::Error::new(io::ErrorKind::InvalidInput, "NUL in path"))?;
                let attr = PerfEventAttr {
                    type_: pmu.type_,
                    config1: path.as_ptr() as u64,
                    config2: p.offset,
                    ..Default::default()
                };
                Ok((attr, Some(path)))
            }
            ProbeEvent::Defined(id) => Ok((
                PerfEventAttr {
                    type_: PERF_TYPE_TRACEPOINT,
                    config: *id,
                    ..Default::default()
                },
                None,
            )),
        }
    }
}

/// Uprobes defined in tracefs (`uprobe_events`), in a group of this superprof's own
/// (`superprof_PID`): each removed when dropped (after every perf event on it is closed). A
/// superprof killed leaves its definitions behind, unused (a definition with no perf event
/// open places no int3); the next one removes those of superprofs that are gone.
pub struct ProbeDefinitions {
    dir: PathBuf,
    group: String,
    /// (path, offset) -> (name, id)
    defined: HashMap<(PathBuf, u64), (String, u64)>,
    /// Definitions written whose id could not be read, and that could not be removed at once
    /// either: removed at drop.
    orphans: Vec<String>,
    /// The number of the next definition's name (`p0`, `p1`...): never reused.
    next: usize,
}

impl ProbeDefinitions {
    /// Where tracefs is mounted and writable, with the stale groups of dead superprofs
    /// removed.
    pub fn new() -> io::Result<ProbeDefinitions> {
        let dir = ["/sys/kernel/tracing", "/sys/kernel/debug/tracing"]
            .iter()
            .map(PathBuf::from)
            .find(|d| d.join("uprobe_events").exists())
            .ok_or_else(|| io::Error::new(io::ErrorKind::NotFound, "no tracefs"))?;
        let me = std::process::id();
        let defs = ProbeDefinitions {
            dir,
            group: format!("superprof_{me}"),
            defined: HashMap::new(),
            orphans: Vec::new(),
            next: 0,
        };
        defs.sweep();
        // Writable? (A definition is tried with the first probe; this opens only.)
        defs.open_events()?;
        Ok(defs)
    }

    fn open_events(&self) -> io::Result<std::fs::File> {
        // Appending: opening it for writing without O_APPEND would remove every definition.
        std::fs::OpenOptions::new()
            .append(true)
            .open(self.dir.join("uprobe_events"))
    }

    fn write(&self, line: &str) -> io::Result<()> {
        use std::io::Write;
        self.open_events()?.write_all(line.as_bytes())
    }

    /// Removes the definitions of superprofs that are no longer running.
    fn sweep(&self) {
        let text = std::fs::read_to_string(self.dir.join("uprobe_events")).unwrap_or_default();
        for line in text.lines() {
            // p:superprof_123/p4 /proc/...:0x1180
            let Some(event) = line.split_whitespace().next().and_then(|w| w.get(2..)) else {
                continue;
            };
            let Some(pid) = event
                .strip_prefix("superprof_")
                .and_then(|r| r.split('/').next())
                .and_then(|p| p.parse::<u32>().ok())
            else {
                continue;
            };
            if !crate::superprof_running(pid) {
                let _ = self.write(&format!("-:{event}\n"));
            }
        }
    }

    /// The event of a probe on `spec`, defined the first time.
    pub fn define(&mut self, spec: &ProbeSpec) -> io::Result<ProbeEvent> {
        let key = (spec.path.clone(), spec.offset);
        if let Some((_, id)) = self.defined.get(&key) {
            return Ok(ProbeEvent::Defined(*id));
        }
        let path = spec.path.to_str().filter(|p| !p.contains([' ', '\n', ':']));
        let path = path.ok_or_else(|| {
            io::Error::new(io::ErrorKind::InvalidInput, "a path tracefs cannot take")
        })?;
        let name = format!("p{}", self.next);
        self.next += 1;
        self.write(&format!(
            "p:{}/{name} {path}:{:#x}\n",
            self.group, spec.offset
        ))?;
        let id = match self.event_id(&name) {
            Ok(id) => id,
            Err(e) => {
                // Defined, but of no use without its id: removed at once, or at drop.
                if self.remove(&name).is_err() {
                    self.orphans.push(name);
                }
                return Err(e);
            }
        };
        self.defined.insert(key, (name, id));
        Ok(ProbeEvent::Defined(id))
    }

    /// The perf event id of this group's definition `name`.
    fn event_id(&self, name: &str) -> io::Result<u64> {
        let path = self.dir.join("events").join(&self.group).join(name);
        std::fs::read_to_string(path.join("id"))?
            .trim()
            .parse()
            .map_err(|_| io::Error::new(io::ErrorKind::InvalidData, "unreadable event id"))
    }

    /// Removes this group's definition `name`.
    fn remove(&self, name: &str) -> io::Result<()> {
        self.write(&format!("-:{}/{name}\n", self.group))
    }
}

impl Drop for ProbeDefinitions {
    fn drop(&mut self) {
        for name in self.defined.values().map(|(n, _)| n).chain(&self.orphans) {
            let _ = self.remove(name);
        }
    }
}

/// One hit of a probe: which (its index in the group's list), where, when (CLOCK_MONOTONIC
/// ns), the stack pointer then, and the counters' readings (in the group's event order).
#[derive(Debug, Clone, PartialEq)]
pub struct ProbeHit {
    /// The probe's index in the list the group was opened with.
    pub probe: usize,
    /// The process.
    pub pid: u32,
    /// The thread.
    pub tid: u32,
    /// When: CLOCK_MONOTONIC, in nanoseconds.
    pub time: u64,
    /// The thread's stack pointer at the probed instruction.
    pub sp: u64,
    /// The group's counters at the hit, in the order of its events.
    pub values: Vec<Reading>,
}

/// Why a group could not be opened: the error, and which probe it came from (None: a
/// counter, the ring, or the group as a whole).
#[derive(Debug)]
pub struct ProbeError {
    /// The index of the probe that failed; None for a counter, the ring or the group.
    pub probe: Option<usize>,
    /// The kernel's error.
    pub error: io::Error,
}

impl ProbeError {
    /// The kernel refuses to probe that instruction (ENOTSUPP: on x86, one with a lock
    /// prefix, for example).
    pub fn unsupported_instruction(&self) -> bool {
        self.probe.is_some() && self.error.raw_os_error() == Some(524)
    }

    /// The thread is gone.
    pub fn no_thread(&self) -> bool {
        self.error.raw_os_error() == Some(libc::ESRCH)
    }
}

impl std::fmt::Display for ProbeError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        if self.unsupported_instruction() {
            return f.write_str("the kernel cannot probe that instruction");
        }
        match self.probe {
            Some(i) => write!(f, "probe {i}: {}", self.error),
            None => write!(f, "{}", self.error),
        }
    }
}

impl std::error::Error for ProbeError {}

impl From<io::Error> for ProbeError {
    fn from(error: io::Error) -> ProbeError {
        ProbeError { probe: None, error }
    }
}

/// Probes and counters on one thread (see the module's notes).
pub struct ProbeGroup {
    /// Probes first (the first one leads), then counters; kept open: closing them removes
    /// the probes.
    fds: Vec<OwnedFd>,
    ring: sys::RingMap,
    /// Event id -> probe index.
    ids: HashMap<u64, usize>,
    probes: usize,
    counters: usize,
    buf: Vec<u8>,
}

impl ProbeGroup {
    /// Opens `probes` and `events` as one group on thread `tid`, enabled, with a ring of `ring_pages` pages (a power of two). `user_only` counts user
    /// space only.
    pub fn open(
        tid: u32,
        probes: &[ProbeEvent],
        events: &[EventSpec],
        user_only: bool,
        ring_pages: usize,
    ) -> Result<ProbeGroup, ProbeError> {
        if probes.is_empty() {
            return Err(io::Error::new(io::ErrorKind::InvalidInput, "no probe").into());
        }
        let mut flags = sys::FLAG_USE_CLOCKID | sys::FLAG_WATERMARK;
        if user_only {
            flags |= sys::FLAG_EXCLUDE_KERNEL | sys::FLAG_EXCLUDE_HV;
        }
        let read_format =
            READ_FORMAT_GROUP | READ_FORMAT_TOTAL_TIME_ENABLED | READ_FORMAT_TOTAL_TIME_RUNNING;
        let page = sys::page_size();
        let mut fds: Vec<OwnedFd> = Vec::new();
        let mut ids = HashMap::new();
        for (i, p) in probes.iter().enumerate() {
            // (`_path` lives until the event is opened: the kernel copies it then.)
            let (probe, _path) = p.attr()?;
            let attr = PerfEventAttr {
                sample_period_or_freq: 1,
                sample_type: sys::PERF_SAMPLE_IDENTIFIER
                    | sys::PERF_SAMPLE_TID
                    | sys::PERF_SAMPLE_TIME
                    | PERF_SAMPLE_READ
                    | sys::PERF_SAMPLE_REGS_USER,
                read_format,
                sample_regs_user: 1 << REG_SP,
                // The leader starts disabled: the group starts whole.
                flags: flags | if i == 0 { sys::FLAG_DISABLED } else { 0 },
                // Wake a reader only when the ring is half full (superprof reads it on its own
                // schedule; a wakeup per hit would cost the program).
                wakeup_events_or_watermark: (ring_pages * page / 2) as u32,
                clockid: libc::CLOCK_MONOTONIC,
                ..probe
            };
            let leader = fds.first().map(|f: &OwnedFd| f.as_raw_fd());
            let fd =
                sys::perf_event_open_group(&attr, tid as i32, -1, leader).map_err(|error| {
                    ProbeError {
                        probe: Some(i),
                        error,
                    }
                })?;
            let id = sys::event_id(&fd)
                .map_err(|e| io::Error::new(e.kind(), format!("the id of probe {i}: {e}")))?;
            ids.insert(id, i);
            fds.push(fd);
        }
        for spec in events {
            let attr = PerfEventAttr {
                type_: spec.type_,
                config: spec.config,
                read_format,
                flags: (flags & !sys::FLAG_WATERMARK) | spec.exclude_flags(),
                // A group keeps one clock.
                clockid: libc::CLOCK_MONOTONIC,
                ..Default::default()
            };
            fds.push(
                sys::perf_event_open_group(&attr, tid as i32, -1, Some(fds[0].as_raw_fd()))
                    .map_err(|e| io::Error::new(e.kind(), format!("counter {}: {e}", spec.name)))?,
            );
        }
        let ring = sys::RingMap::new(&fds[0], ring_pages)
            .map_err(|e| io::Error::new(e.kind(), format!("the probes' ring buffer: {e}")))?;
        for fd in &fds[1..probes.len()] {
            sys::set_output(fd, &fds[0])
                .map_err(|e| io::Error::new(e.kind(), format!("the probes' output: {e}")))?;
        }
        sys::enable(&fds[0])
            .map_err(|e| io::Error::new(e.kind(), format!("enabling the probes: {e}")))?;
        Ok(ProbeGroup {
            fds,
            ring,
            ids,
            probes: probes.len(),
            counters: events.len(),
            buf: Vec::new(),
        })
    }

    /// The descriptor to poll for a half-full ring.
    pub fn fd(&self) -> RawFd {
        self.fds[0].as_raw_fd()
    }

    /// Appends the hits written since the last call to `out`; returns the hits the kernel
    /// could not write (the ring was full).
    pub fn drain(&mut self, out: &mut Vec<ProbeHit>) -> u64 {
        self.buf.clear();
        self.ring.drain(&mut self.buf);
        parse_hits(&self.buf, &self.ids, self.probes, self.counters, out)
    }
}

/// A uprobe that only counts its hits, on thread `tid`. No ring: nothing is written per hit,
/// the cheapest way the kernel can count an instruction. Not inherited: a uprobe event's path
/// is a pointer into the opener's memory, which the kernel reads again, in the new thread's
/// memory, when a new thread inherits it (the copy fails and the thread goes uncounted); the
/// caller opens one on each thread.
pub struct UprobeCounter {
    fd: OwnedFd,
}

impl UprobeCounter {
    /// Opens the counter of `probe` on thread `tid`, counting from now.
    pub fn open(tid: u32, probe: &ProbeEvent) -> Result<UprobeCounter, ProbeError> {
        let (attr, _path) = probe.attr()?;
        let fd = sys::perf_event_open(&attr, tid as i32, -1).map_err(|error| ProbeError {
            probe: Some(0),
            error,
        })?;
        Ok(UprobeCounter { fd })
    }

    /// The hits so far.
    pub fn count(&self) -> io::Result<u64> {
        let mut v = [0u64; 1];
        sys::read_u64s(&self.fd, &mut v)?;
        Ok(v[0])
    }
}

/// Parses the records of a probe group's ring (see [`ProbeGroup::open`] for the layout);
/// returns the count of lost hits. Malformed records are skipped.
fn parse_hits(
    buf: &[u8],
    ids: &HashMap<u64, usize>,
    probes: usize,
    counters: usize,
    out: &mut Vec<ProbeHit>,
) -> u64 {
    let mut lost = 0u64;
    for (ty, _misc, body) in split_records(buf) {
        let u64_at = |i: usize| -> Option<u64> {
            let at = i.checked_mul(8)?;
            Some(u64::from_ne_bytes(
                body.get(at..at.checked_add(8)?)?.try_into().ok()?,
            ))
        };
        match ty {
            PERF_RECORD_LOST => lost = lost.saturating_add(u64_at(1).unwrap_or(0)),
            PERF_RECORD_SAMPLE => {
                let hit = (|| {
                    // identifier, pid|tid, time, read {nr, enabled, running, values[nr]},
                    // regs {abi, sp}
                    let probe = *ids.get(&u64_at(0)?)?;
                    let pid_tid = u64_at(1)?;
                    let time = u64_at(2)?;
                    let nr = usize::try_from(u64_at(3)?).ok()?;
                    if nr != probes + counters {
                        return None;
                    }
                    let (enabled, running) = (u64_at(4)?, u64_at(5)?);
                    let values = (0..counters)
                        .map(|c| {
                            Some(Reading {
                                value: u64_at(6 + probes + c)?,
                                enabled,
                                running,
                            })
                        })
                        .collect::<Option<Vec<_>>>()?;
                    let abi = u64_at(6 + nr)?;
                    let sp = if abi == 0 { 0 } else { u64_at(7 + nr)? };
                    Some(ProbeHit {
                        probe,
                        pid: pid_tid as u32,
                        tid: (pid_tid >> 32) as u32,
                        time,
                        sp,
                        values,
                    })
                })();
                out.extend(hit);
            }
            _ => {}
        }
    }
    lost
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_definition_whose_id_cannot_be_read_is_removed() {
        // A stand-in for tracefs: uprobe_events a plain file, one event's id readable.
        let dir = std::env::temp_dir().join(format!("superprof-tracefs-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(dir.join("events/superprof_test/p1")).unwrap();
        std::fs::write(dir.join("events/superprof_test/p1/id"), "42\n").unwrap();
        std::fs::write(dir.join("uprobe_events"), "").unwrap();
        let mut defs = ProbeDefinitions {
            dir: dir.clone(),
            group: "superprof_test".to_owned(),
            defined: HashMap::new(),
            orphans: Vec::new(),
            next: 0,
        };
        let spec = |offset| ProbeSpec {
            path: "/bin/true".into(),
            offset,
        };
        // p0's id is missing: an error, and p0 removed again at once.
        assert!(defs.define(&spec(0x10)).is_err());
        // p1 (a name of its own) is defined, and removed at drop.
        assert!(matches!(
            defs.define(&spec(0x20)),
            Ok(ProbeEvent::Defined(42))
        ));
        drop(defs);
        let events = std::fs::read_to_string(dir.join("uprobe_events")).unwrap();
        assert_eq!(
            events,
            "p:superprof_test/p0 /bin/true:0x10\n-:superprof_test/p0\n\
             p:superprof_test/p1 /bin/true:0x20\n-:superprof_test/p1\n"
        );
        let _ = std::fs::remove_dir_all(&dir);
    }

    fn record(ty: u32, words: &[u64]) -> Vec<u8> {
        let mut r = Vec::new();
        r.extend_from_slice(&ty.to_ne_bytes());
        r.extend_from_slice(&0u16.to_ne_bytes());
        r.extend_from_slice(&((8 + words.len() * 8) as u16).to_ne_bytes());
        for w in words {
            r.extend_from_slice(&w.to_ne_bytes());
        }
        r
    }

    #[test]
    fn hits_from_records() {
        let ids: HashMap<u64, usize> = [(70, 0), (71, 1)].into();
        // Two probes, one counter.
        let mut buf = record(
            PERF_RECORD_SAMPLE,
            &[
                71,
                (12 << 32) | 10,
                5000,
                3,
                900,
                800,
                1,
                2,
                4242,
                2,
                0x7ffe_0000,
            ],
        );
        buf.extend(record(PERF_RECORD_LOST, &[70, 3]));
        // Unknown id, wrong count, cut short: skipped.
        buf.extend(record(PERF_RECORD_SAMPLE, &[99, 1, 1, 3, 0, 0, 0, 0, 0, 0]));
        buf.extend(record(PERF_RECORD_SAMPLE, &[70, 1, 1, 9, 0, 0, 0, 0, 0, 0]));
        buf.extend(record(PERF_RECORD_SAMPLE, &[70, 1, 1, 3, 0]));
        let mut out = Vec::new();
        assert_eq!(parse_hits(&buf, &ids, 2, 1, &mut out), 3);
        assert_eq!(
            out,
            vec![ProbeHit {
                probe: 1,
                pid: 10,
                tid: 12,
                time: 5000,
                sp: 0x7ffe_0000,
                values: vec![Reading {
                    value: 4242,
                    enabled: 900,
                    running: 800
                }],
            }]
        );
    }
}
