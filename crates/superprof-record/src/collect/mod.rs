//! From sampler records to a profile: module and thread tracking, unwinding, interning of
//! address stacks during the run, and symbolization of each distinct address at the end.
//!
//! Any sample source that yields registers plus stack bytes can feed a [`Collector`].

mod build;
mod off_cpu;

use std::collections::HashMap;
use std::path::{Path, PathBuf};

use off_cpu::OpenWait;
use superprof_profile::spill::{Spill, TimeLog};
use superprof_profile::{Profile, SampleKind, StackId};
use superprof_sample::{Record, SampleRecord};
use superprof_symbols::{Query, SymbolService};
use superprof_unwind::{ElfCache, FrameAddress, ModuleId, ProcessModules, UnwindOutcome};

/// A frame before symbolization.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
enum AddrFrame {
    /// `svma` in `module`; `ret` when the address is a return address.
    User {
        module: ModuleId,
        svma: u64,
        ret: bool,
    },
    Kernel(u64),
    /// Code in no file: JIT code, named from the process's perf map if it has one.
    Unknown {
        pid: u32,
        addr: u64,
    },
    /// The leaf of an off-CPU stack: what the thread waited in (a system call of this
    /// machine's numbering; None: named at the end from the kernel frames, if any).
    Wait {
        kind: SampleKind,
        syscall: Option<u64>,
    },
}

/// What an off-CPU sample stands for (see [`Collector::off_cpu`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct OffCpu {
    /// [`SampleKind::OffCpu`] (a wait) or [`SampleKind::Preempted`].
    pub kind: SampleKind,
    /// The system call the thread waits in, when known.
    pub syscall: Option<u64>,
    /// Time off the CPU, nanoseconds.
    pub ns: u64,
}

#[derive(Debug, Clone, Copy)]
struct PendingSample {
    time: u64,
    tid: u32,
    cpu: u32,
    stack: Option<u32>,
    kind: SampleKind,
    /// Off-CPU time (nanoseconds) of an off-CPU sample.
    off_ns: u64,
    /// Sampling periods an on-CPU sample stands for (occurrences, for a counted event).
    periods: u64,
    /// Its event's index (see [`Collector::set_events`]).
    event: u8,
}

impl Spill for PendingSample {
    const SIZE: usize = 40;
    fn time(&self) -> u64 {
        self.time
    }
    fn put(&self, out: &mut Vec<u8>) {
        out.extend_from_slice(&self.time.to_le_bytes());
        out.extend_from_slice(&self.off_ns.to_le_bytes());
        out.extend_from_slice(&self.periods.to_le_bytes());
        out.extend_from_slice(&self.tid.to_le_bytes());
        out.extend_from_slice(&self.cpu.to_le_bytes());
        out.extend_from_slice(&self.stack.unwrap_or(0).to_le_bytes());
        out.extend_from_slice(&[self.stack.is_some() as u8, self.kind as u8, self.event, 0]);
    }
    fn get(b: &[u8]) -> Option<PendingSample> {
        use superprof_profile::spill::{le_u32, le_u64};
        Some(PendingSample {
            time: le_u64(b, 0)?,
            off_ns: le_u64(b, 8)?,
            periods: le_u64(b, 16)?,
            tid: le_u32(b, 24)?,
            cpu: le_u32(b, 28)?,
            stack: match *b.get(36)? {
                0 => None,
                _ => Some(le_u32(b, 32)?),
            },
            kind: *SampleKind::ALL.get(*b.get(37)? as usize)?,
            event: *b.get(38)?,
        })
    }
}

#[derive(Default)]
pub struct Collector {
    /// Code that no file maps, named (see [`crate::CodeName`]): counting trampolines.
    code_names: Vec<crate::CodeName>,
    elves: ElfCache,
    processes: HashMap<u32, ProcessModules>,
    /// tid -> (pid, name)
    threads: HashMap<u32, (u32, String)>,
    frames: Vec<AddrFrame>,
    frame_ids: HashMap<AddrFrame, u32>,
    /// Address-stack trie: (parent, frame).
    nodes: Vec<(Option<u32>, u32)>,
    node_ids: HashMap<(Option<u32>, u32), u32>,
    /// In time order when read; spilled to a private temporary file past a cap.
    samples: TimeLog<PendingSample>,
    sampled_threads: std::collections::HashSet<u32>,
    /// Last time /proc/PID/maps was read for a pid (monotonic ns).
    maps_read_at: HashMap<u32, u64>,
    /// When /proc/PID/maps was first read for a pid (its libraries are still being mapped
    /// then: a miss may read the maps again sooner).
    maps_first_read: HashMap<u32, u64>,
    pub lost: u64,
    pub truncated: u64,
    truncated_by: std::collections::BTreeMap<superprof_unwind::Truncation, u64>,
    scratch: Vec<FrameAddress>,
    /// Why the last unwind in `scratch` stopped early, if it did.
    truncated_now: Option<superprof_unwind::Truncation>,
    path_frames: Vec<u32>,
    /// A copy of the vDSO in a private temp folder, made when a process maps `[vdso]`.
    vdso: Option<Option<TempCopy>>,
    /// Loads symbols in the background as modules appear.
    symbols: SymbolService,
    /// Each process's user (whose perf map may be trusted).
    owners: HashMap<u32, Option<u32>>,
    /// Each process's jitdump file, from its marker mapping.
    jitdumps: HashMap<u32, PathBuf>,
    /// When each process's jitdump was last read for unwind tables, and its reader (which
    /// goes on where it stopped).
    jit_unwind: HashMap<u32, (u64, Option<superprof_symbols::JitUnwindReader>)>,
    /// Each process's executable mappings of no file: JIT code (named at the end, unwound by
    /// its jitdump's tables or frame pointers; no reason to read /proc/PID/maps again).
    anon: HashMap<u32, Vec<(u64, u64)>>,
    /// A launched command whose samples count only from its exec (before it, the child runs
    /// superprof's code).
    awaiting_exec: Option<u32>,
    /// Each thread's last off-CPU stack (trie node), for [`Collector::off_cpu_again`].
    last_off: HashMap<u32, Option<u32>>,
    /// Threads off the CPU now (context switches).
    open_waits: HashMap<u32, OpenWait>,
    /// Threads that exited: their last switch out (after the exit record) is no wait.
    exited: std::collections::HashSet<u32>,
    /// Each thread's last on-CPU sample time (while off-CPU time is recorded).
    last_on_cpu: HashMap<u32, u64>,
    /// Context switches are recorded (off-CPU time by perf).
    switches: bool,
    /// Each thread's last switches back in: (time, whether a wait ending there was counted),
    /// oldest first. A switch out (or its sample) committed late to another CPU's ring can
    /// come after the switch in that ended it: its wait ends at the first of these after it.
    last_ins: HashMap<u32, std::collections::VecDeque<(u64, bool)>>,
    /// Each event id's index, where several events are sampled (`record -e A,B`).
    event_ids: HashMap<u64, u8>,
    /// Whether each event (by index) is counted: its samples weigh their periods.
    counted: Vec<bool>,
    /// What a counted event's sample with no period in its record stands for.
    fixed_period: u64,
}

/// A file in a private temporary folder (0700, random name: no name in it can have been
/// planted), both removed when dropped.
struct TempCopy {
    dir: PathBuf,
    file: PathBuf,
}

impl TempCopy {
    fn new(prefix: &str, name: &str, bytes: &[u8]) -> std::io::Result<TempCopy> {
        let dir = superprof_profile::output::private_temp_dir(prefix)?;
        let copy = TempCopy {
            file: dir.join(name),
            dir,
        };
        std::io::Write::write_all(
            &mut superprof_profile::output::create_new(&copy.file)?,
            bytes,
        )?;
        Ok(copy)
    }
}

impl Drop for TempCopy {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// Where superprof can read a file the target names `path`: through /proc/PID/root, so that
/// processes in other mount namespaces (containers) work.
/// Files of a process that shares superprof's root are opened by their plain path, which stays
/// valid after the process exits.
fn target_file_path(pid: u32, path: &Path) -> PathBuf {
    use std::os::unix::fs::MetadataExt;
    let root = Path::new("/proc").join(pid.to_string()).join("root");
    let same_root = match (std::fs::metadata(&root), std::fs::metadata("/")) {
        (Ok(a), Ok(b)) => a.dev() == b.dev() && a.ino() == b.ino(),
        _ => true,
    };
    let via_root = root.join(path.strip_prefix("/").unwrap_or(path));
    if !same_root && via_root.exists() {
        via_root
    } else {
        path.to_owned()
    }
}

impl Collector {
    pub fn sample_count(&self) -> usize {
        self.samples.len()
    }

    /// Threads that have samples (kept as samples arrive: the progress line asks often).
    pub fn thread_count(&self) -> usize {
        self.sampled_threads.len()
    }

    /// Seeds a process's modules and thread names from /proc (attach mode, or a fallback when a
    /// sample lands outside every known mapping).
    pub fn read_proc(&mut self, pid: u32, now: u64) {
        self.maps_read_at.insert(pid, now);
        self.maps_first_read.entry(pid).or_insert(now);
        self.note_owner(pid);
        for m in superprof_unwind::maps::executable_mappings(pid).unwrap_or_default() {
            let known = self.processes.get(&pid).and_then(|p| p.lookup(m.start));
            if !known.is_some_and(|k| k.start == m.start && k.end == m.end) {
                self.add_mapping(pid, m.start, m.end - m.start, m.offset, &m.path);
            }
        }
        self.read_thread_names(pid);
    }

    /// Reads process `pid`'s jitdump (at most every 50 ms) and adds the unwind tables of code
    /// not given them yet; whether any was added.
    fn add_jit_unwind(&mut self, pid: u32, now: u64) -> bool {
        let Some(path) = self.jitdumps.get(&pid) else {
            return false;
        };
        let owner = self.owners.get(&pid).copied().flatten();
        let (read_at, reader) = self.jit_unwind.entry(pid).or_default();
        if *read_at != 0 && now.saturating_sub(*read_at) < 50_000_000 {
            return false;
        }
        *read_at = now.max(1);
        // The tables loaded since the last read, in order: code loaded again at an address
        // replaces what was there.
        let new = reader
            .get_or_insert_with(|| superprof_symbols::JitUnwindReader::new(path, owner))
            .read_new();
        let added = !new.is_empty();
        let process = self.processes.entry(pid).or_default();
        for u in new {
            let start = u.code.start;
            let m = superprof_unwind::jit_module(u.name, u.code, u.eh_frame_at, u.eh_frame, u.hdr);
            process.add_jit_module(m, start);
        }
        added
    }

    /// Keeps the user of process `pid`, the first time it is seen.
    fn note_owner(&mut self, pid: u32) {
        use std::os::unix::fs::MetadataExt;
        // (A process already gone is not looked for again at each of its samples.)
        self.owners.entry(pid).or_insert_with(|| {
            std::fs::metadata(format!("/proc/{pid}"))
                .ok()
                .map(|m| m.uid())
        });
    }

    /// Where superprof reads a module's file.
    fn open_path_of(&self, module: ModuleId) -> PathBuf {
        let path = self.elves.path(module);
        self.elves
            .image(module)
            .map_or_else(|| path.to_owned(), |i| i.path.clone())
    }

    /// Records an executable mapping; a module seen for the first time starts loading its
    /// symbols in the background.
    fn add_mapping(&mut self, pid: u32, start: u64, len: u64, pgoff: u64, path: &Path) {
        let known = self.elves.len();
        let open = self.open_path(pid, path);
        let process = self.processes.entry(pid).or_default();
        let m = process.add_mapping_at(&mut self.elves, start, len, pgoff, path, &open);
        if self.elves.len() > known && self.elves.image(m.module).is_some() {
            self.symbols
                .preload(path.to_owned(), self.open_path_of(m.module));
        }
    }

    /// Starts reading kernel symbols in the background (when kernel frames are recorded).
    pub fn expect_kernel_frames(&self) {
        self.symbols.preload_kallsyms();
    }

    /// Where to read the file a process maps as `path`.
    fn open_path(&mut self, pid: u32, path: &Path) -> PathBuf {
        if path == Path::new("[vdso]") {
            let file = self.vdso.get_or_insert_with(|| {
                let image = superprof_sample::vdso_image()?;
                TempCopy::new("superprof-vdso", "vdso.so", &image).ok()
            });
            return file
                .as_ref()
                .map_or_else(|| path.to_owned(), |f| f.file.clone());
        }
        target_file_path(pid, path)
    }

    /// Reads one thread's name from /proc.
    pub fn read_thread_name(&mut self, pid: u32, tid: u32) {
        if let Ok(name) = std::fs::read_to_string(format!("/proc/{pid}/task/{tid}/comm")) {
            self.threads.insert(tid, (pid, name.trim_end().to_owned()));
        }
    }

    /// Reads the names of a process's threads from /proc (they may rename themselves).
    pub fn read_thread_names(&mut self, pid: u32) {
        if let Ok(tids) = superprof_sample::list_threads(pid) {
            for tid in tids {
                if let Ok(name) = std::fs::read_to_string(format!("/proc/{pid}/task/{tid}/comm")) {
                    self.threads.insert(tid, (pid, name.trim_end().to_owned()));
                }
            }
        }
    }

    /// (One function of 101 lines: one match over the perf record kinds, each arm a few lines on
    /// the collector's own maps (processes, threads, anon, open waits); a long match, not a long
    /// piece of logic.)
    pub fn handle(&mut self, record: &Record) {
        match record {
            Record::Sample(s) => self.sample(s),
            Record::Mmap { pid, path, .. } if superprof_symbols::is_jitdump(Path::new(path)) => {
                // A runtime's jitdump marker: its JIT code's names are in that file.
                self.jitdumps.insert(*pid, PathBuf::from(path));
            }
            Record::Mmap {
                pid,
                start,
                len,
                pgoff,
                executable: true,
                path,
                ..
            } => {
                if is_anonymous(path) {
                    let end = start.saturating_add(*len);
                    self.anon.entry(*pid).or_default().push((*start, end));
                } else {
                    self.add_mapping(*pid, *start, *len, *pgoff, Path::new(path));
                }
            }
            Record::Mmap { .. } => {}
            Record::Comm {
                pid,
                tid,
                name,
                exec,
                ..
            } => {
                if *exec && pid == tid {
                    self.maps_first_read.remove(pid);
                    self.processes.entry(*pid).or_default().clear();
                    self.anon.remove(pid);
                    if self.awaiting_exec == Some(*pid) {
                        self.awaiting_exec = None;
                    }
                }
                self.threads.insert(*tid, (*pid, name.clone()));
            }
            Record::Fork {
                pid,
                ppid,
                tid,
                ptid,
                ..
            } => {
                if pid != ppid && !self.processes.contains_key(pid) {
                    let child = self
                        .processes
                        .get(ppid)
                        .map(|p| p.fork(&self.elves))
                        .unwrap_or_default();
                    self.processes.insert(*pid, child);
                    if let Some(a) = self.anon.get(ppid).cloned() {
                        self.anon.insert(*pid, a);
                    }
                }
                let name = self
                    .threads
                    .get(ptid)
                    .map(|t| t.1.clone())
                    .unwrap_or_default();
                self.threads.insert(*tid, (*pid, name));
            }
            Record::Exit { pid, tid, .. } => {
                self.settle_late(*tid);
                self.open_waits.remove(tid);
                self.last_ins.remove(tid);
                self.last_on_cpu.remove(tid);
                if self.switches {
                    self.exited.insert(*tid);
                }
                // The pid may be reused by a later process, which must not see these mappings.
                if pid == tid {
                    self.processes.remove(pid);
                    self.maps_read_at.remove(pid);
                    self.maps_first_read.remove(pid);
                }
            }
            Record::Switch {
                tid,
                time,
                out,
                preempted,
                ..
            } => self.switch(*tid, *time, *out, *preempted),
            Record::Other { .. } => {}
            Record::Lost { count, .. } => {
                self.lost += count;
                // The switches back in of the waits open now may be among the records lost:
                // closed by a later one, they would take in time the thread spent running.
                // A doubtful wait is dropped if the thread was seen on a CPU meanwhile (lost
                // records lose off-CPU time, never add running time to it).
                for w in self.open_waits.values_mut() {
                    w.doubtful = true;
                }
            }
        }
    }

    fn intern_frame(&mut self, f: AddrFrame) -> u32 {
        *self.frame_ids.entry(f).or_insert_with(|| {
            self.frames.push(f);
            self.frames.len() as u32 - 1
        })
    }

    /// /proc/PID/maps is re-read on a miss at most every 50 ms per process; every 2 ms in the
    /// first 100 ms after it was first read (at exec, the dynamic loader has not mapped the
    /// libraries yet, and the ptrace sampler sees no mmap).
    fn may_reread_maps(&self, pid: u32, now: u64) -> bool {
        let early = self
            .maps_first_read
            .get(&pid)
            .is_some_and(|&t| now.saturating_sub(t) < 100_000_000);
        let gap = if early { 2_000_000 } else { 50_000_000 };
        now.saturating_sub(self.maps_read_at.get(&pid).copied().unwrap_or(0)) > gap
    }

    /// Unwinds a sample's user stack into `self.scratch`, counting truncated stacks.
    fn unwind(&mut self, s: &SampleRecord) {
        // Frames the kernel walked by frame pointers (`--call-graph fp`): the pc, then
        // return addresses.
        if !s.user_ips.is_empty() {
            self.scratch.clear();
            self.scratch
                .extend(s.user_ips.iter().enumerate().filter_map(|(i, &ip)| {
                    if i == 0 {
                        Some(FrameAddress::from_instruction_pointer(ip))
                    } else {
                        FrameAddress::from_return_address(ip)
                    }
                }));
            self.truncated_now = None;
            return;
        }
        let Some(regs) = &s.regs else { return };
        let process = self.processes.entry(s.pid).or_default();
        self.scratch.clear();
        self.truncated_now = match process.unwind(regs, s.stack, &mut self.scratch) {
            UnwindOutcome::Complete => None,
            UnwindOutcome::Truncated(why) => Some(why),
        };
    }

    /// Keeps no sample of process `pid` until it execs.
    pub fn await_exec(&mut self, pid: u32) {
        self.awaiting_exec = Some(pid);
    }

    fn sample(&mut self, s: &SampleRecord) {
        if self.switches {
            self.last_on_cpu.insert(s.tid, s.time);
        }
        // A sample of a counted event stands for its period's occurrences.
        let event = self.event_ids.get(&s.id).copied().unwrap_or(0);
        let periods = if self.counted.get(event as usize) == Some(&true) {
            if s.period > 0 {
                s.period
            } else {
                self.fixed_period
            }
        } else {
            1
        };
        self.sample_as(s, None, periods, event, 0);
    }

    /// The sampled events (`record -e`): each event id's index, and whether each event (by
    /// index) is counted, so that its samples weigh their periods.
    /// `fixed_period`: what a sample whose record has no period stands for (`record -c`).
    pub fn set_events(
        &mut self,
        ids: HashMap<u64, u8>,
        counted: Vec<bool>,
        fixed_period: Option<u64>,
    ) {
        self.event_ids = ids;
        self.counted = counted;
        self.fixed_period = fixed_period.unwrap_or(1).max(1);
    }

    /// Context switches will be recorded (perf's off-CPU time): exits and on-CPU samples are
    /// kept track of for them.
    pub fn expect_switches(&mut self) {
        self.switches = true;
    }

    fn intern_node(&mut self, parent: Option<u32>, frame: u32) -> u32 {
        let key = (parent, frame);
        let next = self.nodes.len() as u32;
        let id = *self.node_ids.entry(key).or_insert(next);
        if id == next {
            self.nodes.push(key);
        }
        id
    }

    /// An on-CPU sample that stands for `periods` sampling periods of CPU time (and
    /// `preempted_ns` of run-queue time, counted where it is).
    pub fn sample_periods(&mut self, s: &SampleRecord, periods: u64, preempted_ns: u64) {
        self.sample_as(s, None, periods, 0, preempted_ns);
    }

    /// One unwind, then the sample (on-CPU, or `off`), and the preempted time beside it.
    /// `event`: the on-CPU sample's event's index (see [`Collector::set_events`]).
    fn sample_as(
        &mut self,
        s: &SampleRecord,
        off: Option<OffCpu>,
        periods: u64,
        event: u8,
        preempted_ns: u64,
    ) {
        if self.awaiting_exec == Some(s.pid) {
            return;
        }
        let node = self.stack_node(s);
        match off {
            Some(off) => {
                let leaf = self.push_wait(node, s.tid, s.time, s.cpu, off);
                if off.kind == SampleKind::OffCpu {
                    self.last_off.insert(s.tid, leaf);
                }
            }
            None => self.samples.push(PendingSample {
                time: s.time,
                tid: s.tid,
                cpu: s.cpu,
                stack: node,
                kind: SampleKind::OnCpu,
                off_ns: 0,
                periods,
                event,
            }),
        }
        if preempted_ns > 0 {
            let off = OffCpu {
                kind: SampleKind::Preempted,
                syscall: None,
                ns: preempted_ns,
            };
            self.push_wait(node, s.tid, s.time, s.cpu, off);
        }
    }

    /// Unwinds a sample and interns its stack: the trie node of its leaf.
    fn stack_node(&mut self, s: &SampleRecord) -> Option<u32> {
        self.threads
            .entry(s.tid)
            .or_insert_with(|| (s.pid, String::new()));
        self.note_owner(s.pid);
        self.path_frames.clear();
        for &ip in &s.kernel_ips {
            let id = self.intern_frame(AddrFrame::Kernel(ip));
            self.path_frames.push(id);
        }
        if let Some(regs) = &s.regs {
            let jit = |c: &Collector, addr: u64| {
                c.anon
                    .get(&s.pid)
                    .is_some_and(|a| a.iter().any(|&(lo, hi)| (lo..hi).contains(&addr)))
            };
            let known = |c: &Collector, addr: u64| {
                c.processes
                    .get(&s.pid)
                    .is_some_and(|p| p.lookup(addr).is_some())
                    || jit(c, addr)
            };
            if !known(self, regs.pc) && self.may_reread_maps(s.pid, s.time) {
                self.read_proc(s.pid, s.time);
            }
            self.unwind(s);
            // A caller outside every known mapping: a library mapped without a record we saw
            // (the ptrace sampler has none; a race with perf's records): re-read the maps once
            // and unwind again, since unwinding through it needs its CFI.
            if self.scratch.iter().any(|f| !known(self, f.address()))
                && self.may_reread_maps(s.pid, s.time)
            {
                self.read_proc(s.pid, s.time);
                self.unwind(s);
            }
            // JIT code with unwind tables in the process's jitdump (read again at most every
            // 50 ms, as it grows): give them to the unwinder, and unwind again.
            if self.jitdumps.contains_key(&s.pid)
                && self.scratch.iter().any(|f| jit(self, f.address()))
                && self.add_jit_unwind(s.pid, s.time)
            {
                self.unwind(s);
            }
            if let Some(why) = self.truncated_now {
                self.truncated += 1;
                *self.truncated_by.entry(why).or_default() += 1;
            }
            let process = self.processes.entry(s.pid).or_default();
            for i in 0..self.scratch.len() {
                let fa = self.scratch[i];
                let avma = fa.address();
                let f = match process.lookup(avma) {
                    Some(m) => AddrFrame::User {
                        module: m.module,
                        svma: avma.wrapping_sub(m.bias),
                        ret: fa.is_return_address(),
                    },
                    None => AddrFrame::Unknown {
                        pid: s.pid,
                        addr: avma,
                    },
                };
                let id = *self.frame_ids.entry(f).or_insert_with(|| {
                    self.frames.push(f);
                    self.frames.len() as u32 - 1
                });
                self.path_frames.push(id);
            }
        }
        // Intern from the root (the end of the leaf-first list).
        let mut node = None;
        for i in (0..self.path_frames.len()).rev() {
            node = Some(self.intern_node(node, self.path_frames[i]));
        }
        self.sampled_threads.insert(s.tid);
        node
    }
}

/// An executable mapping of no file: JIT code (perf names it `//anon`, or `[anon:NAME]` when
/// the program named it). Its code is named from the process's perf map.
fn is_anonymous(path: &str) -> bool {
    path.is_empty() || path.starts_with("//anon") || path.starts_with("[anon")
}

#[cfg(test)]
mod tests {
    use super::*;

    /// What a collector past its cap writes to its temporary file reads back as it was.
    #[test]
    fn pending_samples_come_back_from_the_spill_file_whole() {
        let all = [
            PendingSample {
                time: u64::MAX - 1,
                tid: 7,
                cpu: 3,
                stack: Some(u32::MAX),
                kind: SampleKind::Preempted,
                off_ns: 12_345,
                periods: 2,
                event: 3,
            },
            PendingSample {
                time: 1,
                tid: 0,
                cpu: 0,
                stack: None,
                kind: SampleKind::OnCpu,
                off_ns: 0,
                periods: 1,
                event: 0,
            },
        ];
        for p in all {
            let mut b = Vec::new();
            p.put(&mut b);
            assert_eq!(b.len(), PendingSample::SIZE);
            let q = PendingSample::get(&b).unwrap();
            assert_eq!(
                (q.time, q.tid, q.cpu, q.stack, q.kind, q.off_ns, q.periods, q.event),
                (p.time, p.tid, p.cpu, p.stack, p.kind, p.off_ns, p.periods, p.event)
            );
        }
        // A kind byte out of range is no sample.
        let mut b = Vec::new();
        all[0].put(&mut b);
        b[37] = 9;
        assert!(PendingSample::get(&b).is_none());
    }
}
