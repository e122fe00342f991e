//! Counting events (perf stat's kind of perf_event): event names, opening a counter on one
//! thread, reading it with the time it was enabled and running (for multiplexing).

use std::io;
use std::os::fd::{AsRawFd, OwnedFd};

use crate::sys::{self, PerfEventAttr};

use crate::sys::PERF_TYPE_TRACEPOINT;
const PERF_TYPE_HW_CACHE: u32 = 3;
const PERF_TYPE_RAW: u32 = 4;
const READ_FORMAT_TOTAL_TIME_ENABLED: u64 = 1;
const READ_FORMAT_TOTAL_TIME_RUNNING: u64 = 2;

/// Which family an event belongs to (`stat --list KIND`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum EventKind {
    /// A generic hardware event of the PMU (`cycles`, `instructions`, `branch-misses`...).
    Hardware,
    /// A software event of the kernel (`task-clock`, `page-faults`, `context-switches`...).
    Software,
    /// A cache event, `CACHE-OP-RESULT` (`l1d-read-miss`, `llc-read-access`...).
    Cache,
    /// A tracepoint, `SYSTEM:EVENT` (`sched:sched_switch`), by its id in tracefs.
    Tracepoint,
    /// A raw PMU event, `rHEX`: the config as the CPU's manual gives it.
    Raw,
}

/// A countable event: its perf type and config.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EventSpec {
    /// The event's name, lowercase, aliases replaced by the name they stand for (`cs`:
    /// `context-switches`).
    pub name: String,
    /// Its family.
    pub kind: EventKind,
    /// `perf_event_attr.type` (`PERF_TYPE_HARDWARE`, `PERF_TYPE_SOFTWARE`...).
    pub type_: u32,
    /// `perf_event_attr.config`: the event's number within its type.
    pub config: u64,
    /// perf's modifiers after the name (`instructions:u`): which privilege levels are left
    /// out. None of them without a modifier.
    pub exclude_user: bool,
    /// Kernel left out (`:u`, `:h`).
    pub exclude_kernel: bool,
    /// Hypervisor left out (any modifier but `h`).
    pub exclude_hv: bool,
}

const HARDWARE: [(&str, u64); 10] = [
    ("cycles", 0),
    ("instructions", 1),
    ("cache-references", 2),
    ("cache-misses", 3),
    ("branches", 4),
    ("branch-misses", 5),
    ("bus-cycles", 6),
    ("stalled-cycles-frontend", 7),
    ("stalled-cycles-backend", 8),
    ("ref-cycles", 9),
];

const SOFTWARE: [(&str, u64); 9] = [
    ("cpu-clock", 0),
    ("task-clock", 1),
    ("page-faults", 2),
    ("context-switches", 3),
    ("cpu-migrations", 4),
    ("minor-faults", 5),
    ("major-faults", 6),
    ("alignment-faults", 7),
    ("emulation-faults", 8),
];

/// Aliases perf accepts.
const ALIASES: [(&str, &str); 5] = [
    ("faults", "page-faults"),
    ("cs", "context-switches"),
    ("migrations", "cpu-migrations"),
    ("branch-instructions", "branches"),
    ("cpu-cycles", "cycles"),
];

const CACHES: [(&str, u64); 6] = [
    ("l1d", 0),
    ("l1i", 1),
    ("llc", 2),
    ("dtlb", 3),
    ("itlb", 4),
    ("branch", 5),
];
const CACHE_OPS: [(&str, u64); 3] = [("read", 0), ("write", 1), ("prefetch", 2)];
const CACHE_RESULTS: [(&str, u64); 2] = [("access", 0), ("miss", 1)];

impl EventSpec {
    /// Parses an event name: hardware, software, cache (`l1d-read-miss`), tracepoint
    /// (`sched:sched_switch`) or raw (`r01c2`).
    pub fn parse(name: &str) -> Result<EventSpec, String> {
        // perf's modifiers: `:u` user space, `:k` kernel, `:h` hypervisor, any together
        // (`cycles:uk`); not on tracepoints, whose names have a colon of their own.
        if let Some((base, mods)) = name.rsplit_once(':') {
            let modifiers = !mods.is_empty() && mods.bytes().all(|b| b"ukh".contains(&b));
            if let Some(mut spec) = EventSpec::parse(base)
                .ok()
                .filter(|s| modifiers && s.kind != EventKind::Tracepoint)
            {
                spec.exclude_user = !mods.contains('u');
                spec.exclude_kernel = !mods.contains('k');
                spec.exclude_hv = !mods.contains('h');
                spec.name = format!("{}:{mods}", spec.name);
                return Ok(spec);
            }
        }
        let lower = name.to_ascii_lowercase();
        let canonical = ALIASES
            .iter()
            .find(|(a, _)| *a == lower)
            .map_or(lower.as_str(), |(_, c)| c);
        let make = |kind, type_, config| EventSpec {
            name: canonical.to_owned(),
            kind,
            type_,
            config,
            exclude_user: false,
            exclude_kernel: false,
            exclude_hv: false,
        };
        if let Some((_, c)) = HARDWARE.iter().find(|(n, _)| *n == canonical) {
            return Ok(make(EventKind::Hardware, sys::PERF_TYPE_HARDWARE, *c));
        }
        if let Some((_, c)) = SOFTWARE.iter().find(|(n, _)| *n == canonical) {
            return Ok(make(EventKind::Software, sys::PERF_TYPE_SOFTWARE, *c));
        }
        let parts: Vec<&str> = canonical.split('-').collect();
        if parts.len() == 3 {
            let cache = CACHES.iter().find(|(n, _)| *n == parts[0]);
            let op = CACHE_OPS.iter().find(|(n, _)| *n == parts[1]);
            let res = CACHE_RESULTS.iter().find(|(n, _)| *n == parts[2]);
            if let (Some(c), Some(o), Some(r)) = (cache, op, res) {
                return Ok(make(
                    EventKind::Cache,
                    PERF_TYPE_HW_CACHE,
                    c.1 | (o.1 << 8) | (r.1 << 16),
                ));
            }
        }
        if let Some((sys_, ev)) = canonical.split_once(':') {
            let id = crate::sys::tracepoint_id(sys_, ev).ok_or_else(|| {
                format!(
                    "tracepoint '{name}' not found (is tracefs mounted at /sys/kernel/tracing?)"
                )
            })?;
            return Ok(make(EventKind::Tracepoint, PERF_TYPE_TRACEPOINT, id));
        }
        if let Some(hex) = canonical.strip_prefix('r') {
            if let Ok(c) = u64::from_str_radix(hex, 16) {
                return Ok(make(EventKind::Raw, PERF_TYPE_RAW, c));
            }
        }
        Err(format!(
            "unknown event '{name}' (see superprof stat --list)"
        ))
    }

    /// The `perf_event_attr` flags of its modifiers (exclude_user, _kernel, _hv).
    pub fn exclude_flags(&self) -> u64 {
        let mut f = 0;
        if self.exclude_user {
            f |= sys::FLAG_EXCLUDE_USER;
        }
        if self.exclude_kernel {
            f |= sys::FLAG_EXCLUDE_KERNEL;
        }
        if self.exclude_hv {
            f |= sys::FLAG_EXCLUDE_HV;
        }
        f
    }

    /// Every named event of a kind (raw and tracepoint events are open-ended).
    pub fn all(kind: EventKind) -> Vec<EventSpec> {
        let names: Vec<String> = match kind {
            EventKind::Hardware => HARDWARE.iter().map(|(n, _)| n.to_string()).collect(),
            EventKind::Software => SOFTWARE.iter().map(|(n, _)| n.to_string()).collect(),
            EventKind::Cache => CACHES
                .iter()
                .flat_map(|(c, _)| {
                    CACHE_OPS.iter().flat_map(move |(o, _)| {
                        CACHE_RESULTS
                            .iter()
                            .map(move |(r, _)| format!("{c}-{o}-{r}"))
                    })
                })
                .collect(),
            EventKind::Tracepoint => [
                "sched:sched_switch",
                "sched:sched_wakeup",
                "syscalls:sys_enter_write",
            ]
            .iter()
            .map(|s| s.to_string())
            .collect(),
            EventKind::Raw => Vec::new(),
        };
        names
            .iter()
            .filter_map(|n| EventSpec::parse(n).ok())
            .collect()
    }
}

/// One open counter on one thread.
pub struct Counter {
    fd: OwnedFd,
}

/// A counter reading: value, and the nanoseconds it was enabled and running.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Reading {
    /// The count (events, or nanoseconds for the clock events), over the time it ran.
    pub value: u64,
    /// Nanoseconds the counter was enabled.
    pub enabled: u64,
    /// Nanoseconds it was actually on the PMU: less than `enabled` when counters were
    /// multiplexed (the count then covers this part of the time only).
    pub running: u64,
}

impl Counter {
    /// Opens a counter for `tid` (a thread of any process, or 0 for the calling thread),
    /// counting from now. `user_only` excludes kernel and hypervisor.
    pub fn open(
        spec: &EventSpec,
        tid: u32,
        user_only: bool,
        group: Option<&Counter>,
    ) -> io::Result<Counter> {
        let mut flags = spec.exclude_flags();
        if user_only {
            flags |= sys::FLAG_EXCLUDE_KERNEL | sys::FLAG_EXCLUDE_HV;
        }
        let attr = PerfEventAttr {
            type_: spec.type_,
            config: spec.config,
            read_format: READ_FORMAT_TOTAL_TIME_ENABLED | READ_FORMAT_TOTAL_TIME_RUNNING,
            flags,
            ..Default::default()
        };
        let fd =
            sys::perf_event_open_group(&attr, tid as i32, -1, group.map(|g| g.fd.as_raw_fd()))?;
        Ok(Counter { fd })
    }

    /// The count so far, with the times it was enabled and running.
    pub fn read(&self) -> io::Result<Reading> {
        let mut buf = [0u64; 3];
        sys::read_u64s(&self.fd, &mut buf)?;
        Ok(Reading {
            value: buf[0],
            enabled: buf[1],
            running: buf[2],
        })
    }
}

/// Whether this machine can count `spec` (opened on the calling thread and closed at once),
/// and the error that says why not.
pub fn probe(spec: &EventSpec) -> Result<(), io::Error> {
    Counter::open(spec, 0, false, None)
        .or_else(|_| Counter::open(spec, 0, true, None))
        .map(drop)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn perfs_modifiers_leave_privilege_levels_out() {
        let plain = EventSpec::parse("instructions").unwrap();
        assert_eq!(plain.exclude_flags(), 0);
        let u = EventSpec::parse("instructions:u").unwrap();
        assert_eq!((u.name.as_str(), u.config), ("instructions:u", 1));
        assert_eq!(
            u.exclude_flags(),
            sys::FLAG_EXCLUDE_KERNEL | sys::FLAG_EXCLUDE_HV
        );
        let k = EventSpec::parse("cycles:k").unwrap();
        assert_eq!(
            k.exclude_flags(),
            sys::FLAG_EXCLUDE_USER | sys::FLAG_EXCLUDE_HV
        );
        assert_eq!(
            EventSpec::parse("page-faults:uk").unwrap().exclude_flags(),
            sys::FLAG_EXCLUDE_HV
        );
        // Not modifiers: unknown letters, and nothing after the colon.
        assert!(EventSpec::parse("instructions:x").is_err());
        assert!(EventSpec::parse("instructions:").is_err());
    }
}
