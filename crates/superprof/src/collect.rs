//! From sampler records to a profile: module and thread tracking, unwinding, interning of
//! address stacks during the run, and symbolization of each distinct address at the end.
//!
//! Any sample source that yields registers plus stack bytes can feed a [`Collector`].

use std::collections::HashMap;
use std::path::{Path, PathBuf};

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
    /// Sampling periods an on-CPU sample stands for.
    periods: u64,
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
        out.extend_from_slice(&[self.stack.is_some() as u8, self.kind as u8, 0, 0]);
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
        })
    }
}

#[derive(Default)]
pub struct Collector {
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
}

/// A wait's kind: run-queue time when its switch out was a preemption.
fn wait_kind(preempted: bool) -> SampleKind {
    if preempted {
        SampleKind::Preempted
    } else {
        SampleKind::OffCpu
    }
}

/// How many switches back in are kept per thread for records that come late.
const LAST_INS: usize = 8;

/// A thread off the CPU, from its context-switch sample and PERF_RECORD_SWITCH out, until its
/// switch back in.
#[derive(Debug, Clone, Copy, Default)]
struct OpenWait {
    since: u64,
    cpu: u32,
    /// Its stack as it left (trie node, without the wait's frame); None when the sample was
    /// lost (the ring was full) and only the switch record came, or nothing could be unwound.
    stack: Option<u32>,
    /// Switch-out records seen since the sample: one is this wait's; a second means the
    /// switch back in was lost, and this wait is stale.
    outs: u8,
    preempted: bool,
    /// The system call it waits in, where known without kernel frames.
    syscall: Option<u64>,
    /// Records were lost while it was open: its switch back in may be among them.
    doubtful: bool,
    /// Its switch back in, already seen (its sample came after it): it ends there.
    until: Option<u64>,
}

/// A file in a private temporary folder (0700, random name: no name in it can have been
/// planted), both removed when dropped.
struct TempCopy {
    dir: PathBuf,
    file: PathBuf,
}

impl TempCopy {
    fn new(prefix: &str, name: &str, bytes: &[u8]) -> std::io::Result<TempCopy> {
        let dir = crate::sys::private_temp_dir(prefix)?;
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
                let image = crate::sys::vdso_image()?;
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

    /// Adds a stretch of off-CPU time of a thread: `s` gives where it waited (registers and
    /// stack as at a sample, kernel frames where recorded). Its stack ends in a frame that
    /// names the wait.
    /// `preempted_ns`: run-queue time to count where the thread is too (unwound once).
    pub fn off_cpu(&mut self, s: &SampleRecord, off: OffCpu, preempted_ns: u64) {
        self.sample_as(s, Some(off), 0, preempted_ns);
    }

    /// More off-CPU time of thread `tid`, in the same place as its last off-CPU sample (a
    /// thread still blocked where it was): nothing to unwind again. (Nothing when the thread
    /// has no off-CPU sample yet.)
    pub fn off_cpu_again(&mut self, tid: u32, time: u64, off: OffCpu) {
        let Some(&stack) = self.last_off.get(&tid) else {
            return;
        };
        self.samples.push(PendingSample {
            time,
            tid,
            cpu: 0,
            stack,
            kind: off.kind,
            off_ns: off.ns,
            periods: 0,
        });
    }

    fn sample(&mut self, s: &SampleRecord) {
        if self.switches {
            self.last_on_cpu.insert(s.tid, s.time);
        }
        self.sample_as(s, None, 1, 0);
    }

    /// Context switches will be recorded (perf's off-CPU time): exits and on-CPU samples are
    /// kept track of for them.
    pub fn expect_switches(&mut self) {
        self.switches = true;
    }

    /// A thread leaves the CPU (a context-switch sample): its stack now, kept until it comes
    /// back ([`Record::Switch`]), when the time it was away is known.
    pub fn off_cpu_begin(&mut self, s: &SampleRecord) {
        if self.awaiting_exec == Some(s.pid) || self.exited.contains(&s.tid) {
            return;
        }
        let late = self.late(s.tid, s.time);
        if late.is_some_and(|(_, counted)| counted) {
            return; // its wait is counted already (from its switch out, without a stack)
        }
        let stack = self.stack_node(s);
        if let Some((until, _)) = late {
            self.mark_counted(s.tid, until);
            if self.open_waits.contains_key(&s.tid) {
                // A later wait is open: this one is counted now, as it is.
                let off = OffCpu {
                    kind: SampleKind::OffCpu,
                    syscall: None,
                    ns: until.saturating_sub(s.time),
                };
                self.push_wait(stack, s.tid, s.time, s.cpu, off);
                return;
            }
        } else {
            self.settle_late(s.tid);
        }
        self.open_waits.insert(
            s.tid,
            OpenWait {
                since: s.time,
                cpu: s.cpu,
                stack,
                until: late.map(|(until, _)| until),
                ..OpenWait::default()
            },
        );
    }

    /// The switch back in that ended a wait begun at `time`, when it was seen already (the
    /// record of `time` came late): (its time, whether that wait is counted).
    fn late(&self, tid: u32, time: u64) -> Option<(u64, bool)> {
        let ins = self.last_ins.get(&tid)?;
        ins.iter().copied().find(|&(at, _)| at > time)
    }

    fn mark_counted(&mut self, tid: u32, until: u64) {
        if let Some(i) = self.last_ins.get_mut(&tid) {
            if let Some(e) = i.iter_mut().find(|(at, _)| *at == until) {
                e.1 = true;
            }
        }
    }

    /// Closes `tid`'s wait if its switch back in was seen already (its switch out never came).
    fn settle_late(&mut self, tid: u32) {
        if self.open_waits.get(&tid).is_some_and(|w| w.until.is_some()) {
            self.close_wait(tid, u64::MAX);
        }
    }

    /// A thread found blocked in `syscall` when the recording started (attach): its wait is
    /// open from `s.time` (`s`: its pc, stack pointer and stack from /proc), until its switch
    /// back in.
    pub fn off_cpu_already(&mut self, s: &SampleRecord, syscall: Option<u64>) {
        let stack = self.stack_node(s);
        self.open_waits.insert(
            s.tid,
            OpenWait {
                since: s.time,
                stack,
                outs: 1,
                syscall,
                ..OpenWait::default()
            },
        );
    }

    /// A PERF_RECORD_SWITCH: out says whether the thread was preempted (and opens a wait of
    /// unknown stack when its sample was lost); in closes its wait. Records lost in a full
    /// ring lose a wait's stack or the wait, never add time that was on the CPU.
    fn switch(&mut self, tid: u32, time: u64, out: bool, preempted: bool) {
        if !out {
            self.exited.remove(&tid);
            let counted = self.close_wait(tid, time) == Some(time);
            let ins = self.last_ins.entry(tid).or_default();
            if ins.back().is_none_or(|&(at, _)| at < time) {
                if ins.len() == LAST_INS {
                    ins.pop_front();
                }
                ins.push_back((time, counted));
            }
            return;
        }
        if self.exited.remove(&tid) {
            return; // its last switch out: nothing more of it is to come
        }
        if let Some((until, counted)) = self.late(tid, time) {
            // Its switch back in came first (this record was committed late).
            match self.open_waits.get_mut(&tid) {
                Some(w) if w.outs == 0 && w.until == Some(until) => {
                    w.outs = 1;
                    w.preempted = preempted;
                    w.since = w.since.max(time);
                    self.close_wait(tid, until);
                }
                _ if !counted => {
                    self.mark_counted(tid, until);
                    let off = OffCpu {
                        kind: wait_kind(preempted),
                        syscall: None,
                        ns: until.saturating_sub(time),
                    };
                    self.push_wait(None, tid, time, 0, off);
                }
                _ => {}
            }
            return;
        }
        self.settle_late(tid);
        match self.open_waits.get_mut(&tid) {
            Some(w) if w.outs == 0 => {
                w.outs = 1;
                w.preempted = preempted;
                // The thread is off the CPU from here: between its sample (taken as it
                // starts to leave) and this record, it still ran, writing the sample (µs
                // with a stack copy), and its CPU clock counted that.
                w.since = w.since.max(time);
            }
            // No sample for this switch (lost), or a stale wait whose switch in was lost.
            _ => {
                self.open_waits.insert(
                    tid,
                    OpenWait {
                        since: time,
                        outs: 1,
                        preempted,
                        ..OpenWait::default()
                    },
                );
            }
        }
    }

    /// Ends `tid`'s wait at `time` (or at its switch back in, when that was seen already).
    /// Returns when it ended, if it was counted.
    fn close_wait(&mut self, tid: u32, time: u64) -> Option<u64> {
        let w = self.open_waits.remove(&tid)?;
        let time = w.until.unwrap_or(time);
        if w.doubtful && self.last_on_cpu.get(&tid).is_some_and(|&t| t > w.since) {
            return None;
        }
        // (Without a system call, its name is found at the end, from the kernel frames.)
        let off = OffCpu {
            kind: wait_kind(w.preempted),
            syscall: w.syscall,
            ns: time.saturating_sub(w.since),
        };
        self.push_wait(w.stack, tid, w.since, w.cpu, off);
        Some(time)
    }

    /// An off-CPU sample at `stack` (a trie node, without the wait): the wait's frame on top.
    /// Returns the node of its leaf.
    fn push_wait(
        &mut self,
        stack: Option<u32>,
        tid: u32,
        time: u64,
        cpu: u32,
        off: OffCpu,
    ) -> Option<u32> {
        let wait = self.intern_frame(AddrFrame::Wait {
            kind: off.kind,
            syscall: off.syscall,
        });
        let leaf = Some(self.intern_node(stack, wait));
        self.samples.push(PendingSample {
            time,
            tid,
            cpu,
            stack: leaf,
            kind: off.kind,
            off_ns: off.ns,
            periods: 0,
        });
        leaf
    }

    /// Ends the waits still open at the end of the recording, at `time`: the threads were
    /// off the CPU until then.
    pub fn close_waits(&mut self, time: u64) {
        let tids: Vec<u32> = self.open_waits.keys().copied().collect();
        for tid in tids {
            self.close_wait(tid, time);
        }
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
        self.sample_as(s, None, periods, preempted_ns);
    }

    /// One unwind, then the sample (on-CPU, or `off`), and the preempted time beside it.
    fn sample_as(
        &mut self,
        s: &SampleRecord,
        off: Option<OffCpu>,
        periods: u64,
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

    /// Symbolizes every distinct address once and builds the profile. Sample times become
    /// nanoseconds since `start_ns` (CLOCK_MONOTONIC).
    pub fn finish(mut self, profile: Profile, start_ns: u64) -> Profile {
        self.finish_interval(profile, start_ns)
    }

    /// [`Collector::finish`] for the samples so far, and a fresh start for the next
    /// interval (`superprof agent`): the samples, the frames and stacks they use, the counts
    /// of lost records and truncated stacks go; what is known of the processes (their
    /// mappings, ELF files, symbols) stays, less what belongs to processes that are gone. A
    /// wait still open goes on in the next interval without its stack.
    pub fn finish_interval(&mut self, profile: Profile, start_ns: u64) -> Profile {
        let profile = self.build(profile, start_ns);
        self.samples.clear();
        self.frames.clear();
        self.frame_ids.clear();
        self.nodes.clear();
        self.node_ids.clear();
        self.sampled_threads.clear();
        self.last_off.clear();
        for w in self.open_waits.values_mut() {
            w.stack = None;
        }
        self.lost = 0;
        self.truncated = 0;
        self.truncated_by.clear();
        // Threads and processes of which no exit was seen (records lost): gone if /proc says
        // so.
        let alive = |pid: &u32| std::path::Path::new(&format!("/proc/{pid}")).exists();
        self.threads.retain(|_, (pid, _)| alive(pid));
        self.processes.retain(|pid, _| alive(pid));
        self.maps_read_at.retain(|pid, _| alive(pid));
        self.maps_first_read.retain(|pid, _| alive(pid));
        self.owners.retain(|pid, _| alive(pid));
        self.jitdumps.retain(|pid, _| alive(pid));
        self.jit_unwind.retain(|pid, _| alive(pid));
        self.anon.retain(|pid, _| alive(pid));
        self.exited.clear();
        profile
    }

    /// (One function of 160 lines: passes over the frames, the trie nodes, then the samples, each
    /// reading what the earlier made (the symbol answers, `chains`, `stack_of`, `wait_named`,
    /// `node_timed`) and the one `namer`; split, they would travel in a struct.)
    fn build(&self, mut profile: Profile, start_ns: u64) -> Profile {
        // One round trip to the symbol worker for every distinct address.
        let mut queries = Vec::new();
        let mut kernel = Vec::new();
        for f in &self.frames {
            match *f {
                AddrFrame::User { module, svma, ret } => queries.push(Query {
                    path: self.elves.path(module).to_owned(),
                    open_path: self.open_path_of(module),
                    svma: superprof_symbols::lookup_address(svma, ret),
                }),
                AddrFrame::Kernel(addr) => kernel.push(addr),
                AddrFrame::Unknown { .. } | AddrFrame::Wait { .. } => {}
            }
        }
        let mut answer = self.symbols.symbolize(queries, kernel);
        let (mut user_answers, mut kernel_answers) =
            (answer.user.drain(..), answer.kernel.drain(..));
        // Names as everywhere in superprof; JIT code's perf maps are read now (they grow while
        // the program runs), once per process.
        let mut namer = superprof_resolve::Namer::new();
        for (&pid, &uid) in &self.owners {
            if let Some(uid) = uid {
                namer.set_owner(pid, uid);
            }
        }
        for (&pid, path) in &self.jitdumps {
            namer.set_jitdump(pid, path);
        }
        // Each address frame becomes a chain of profile frames, outermost first.
        let mut chains: Vec<Vec<superprof_profile::FrameId>> =
            Vec::with_capacity(self.frames.len());
        for f in &self.frames {
            let mut chain = Vec::new();
            match *f {
                AddrFrame::User { module, svma, .. } => {
                    let module_name = self.elves.path(module).to_string_lossy();
                    let found = user_answers.next().unwrap_or_default();
                    chain = namer.elf_frames(&mut profile, &module_name, svma, found);
                }
                AddrFrame::Kernel(addr) => {
                    let name = kernel_answers.next().flatten();
                    chain.push(namer.kernel_frame(&mut profile, addr, name.as_deref()));
                }
                AddrFrame::Unknown { pid, addr } => {
                    chain.push(namer.anonymous_frame(&mut profile, Some(pid), addr));
                }
                AddrFrame::Wait { kind, syscall } => {
                    let name = syscall.map(superprof_trace::syscalls::name);
                    chain.push(profile.wait_frame(kind, name.as_deref()));
                }
            }
            chains.push(chain);
        }
        // Trie nodes are created parent-first, so one forward pass maps them all.
        let mut stack_of: Vec<Option<StackId>> = Vec::with_capacity(self.nodes.len());
        // The frame of each wait named from its kernel frames (by node).
        let mut wait_named: HashMap<u32, superprof_profile::FrameId> = HashMap::new();
        for (i, &(parent, frame)) in self.nodes.iter().enumerate() {
            let mut s = parent.and_then(|p| stack_of[p as usize]);
            match self.frames[frame as usize] {
                // A wait of no known system call: named after the kernel's entry to the
                // call, where the kernel frames were recorded.
                AddrFrame::Wait {
                    kind: SampleKind::OffCpu,
                    syscall: None,
                } => {
                    let name = kernel_wait(&profile, s);
                    let fid = profile.wait_frame(SampleKind::OffCpu, name.as_deref());
                    wait_named.insert(i as u32, fid);
                    s = Some(profile.intern_stack(s, fid));
                }
                _ => {
                    for &fid in &chains[frame as usize] {
                        s = Some(profile.intern_stack(s, fid));
                    }
                }
            }
            stack_of.push(s);
        }
        // Nodes whose path holds JIT code of a process with a jitdump: their samples are named
        // one by one, after the code there at each sample's time.
        let timed =
            |f: &AddrFrame| matches!(*f, AddrFrame::Unknown { pid, .. } if namer.has_jitdump(pid));
        let mut node_timed: Vec<bool> = Vec::with_capacity(self.nodes.len());
        for &(parent, frame) in &self.nodes {
            let t = parent.is_some_and(|p| node_timed[p as usize])
                || timed(&self.frames[frame as usize]);
            node_timed.push(t);
        }
        let mut path = Vec::new();
        let mut thread_index: HashMap<u32, u32> = HashMap::new();
        let period_ns = profile.meta.period_ns();
        let mut carry: Carry<(u32, Option<StackId>, SampleKind)> = Carry::new(period_ns);
        for s in &self.samples {
            let t = *thread_index.entry(s.tid).or_insert_with(|| {
                let (pid, name) = self.threads.get(&s.tid).cloned().unwrap_or_default();
                let name = if name.is_empty() {
                    format!("thread-{}", s.tid)
                } else {
                    name
                };
                profile.add_thread(pid, s.tid, &name)
            });
            let mut stack = s.stack.and_then(|n| stack_of[n as usize]);
            if let Some(leaf) = s.stack.filter(|&n| node_timed[n as usize]) {
                path.clear();
                let mut n = Some(leaf);
                while let Some(i) = n {
                    path.push(i);
                    n = self.nodes[i as usize].0;
                }
                stack = None;
                for &node in path.iter().rev() {
                    let frame = self.nodes[node as usize].1;
                    if let Some(&fid) = wait_named.get(&node) {
                        stack = Some(profile.intern_stack(stack, fid));
                        continue;
                    }
                    match self.frames[frame as usize] {
                        AddrFrame::Unknown { pid, addr } if namer.has_jitdump(pid) => {
                            let fid = namer.anonymous_frame_at(
                                &mut profile,
                                Some(pid),
                                addr,
                                Some(s.time),
                            );
                            stack = Some(profile.intern_stack(stack, fid));
                        }
                        _ => {
                            for &fid in &chains[frame as usize] {
                                stack = Some(profile.intern_stack(stack, fid));
                            }
                        }
                    }
                }
            }
            let time = s.time.saturating_sub(start_ns);
            if !s.kind.is_off_cpu() {
                profile.add_sample(time, t, s.cpu, s.periods, stack);
                continue;
            }
            if let Some(periods) = carry.add((t, stack, s.kind), s.off_ns, time) {
                profile.add_sample_of(s.kind, time, t, s.cpu, periods, stack);
            }
        }
        for ((t, stack, kind), time) in carry.rest() {
            profile.add_sample_of(kind, time, t, 0, 1, stack);
        }
        // (Those last ones came after later samples: the profile's log reads back in time
        // order.)
        profile.meta.lost_samples = self.lost;
        profile.meta.truncated_stacks = self.truncated;
        profile.meta.truncated_by = self
            .truncated_by
            .iter()
            .map(|(why, n)| (why.as_str().to_owned(), *n))
            .collect();
        profile
    }
}

/// Off-CPU time turned into whole sampling periods per place (thread, stack, kind): what is
/// short of a period is carried to the next stretch of time in the same place, so that many
/// short waits add up (a pipe ping-pong's waits are microseconds each). What a place has left
/// at the end is one period with the probability of its share of a period, as a clock would
/// have sampled it: the short waits of short threads (a thread per request, 250 µs each) add up
/// to the right time over many threads instead of none, and each of them appears as often as
/// its time allows.
struct Carry<K> {
    period_ns: u64,
    /// Per place: nanoseconds carried, time of the last stretch.
    left: HashMap<K, (u64, u64)>,
}

impl<K: std::hash::Hash + Eq + Copy> Carry<K> {
    fn new(period_ns: u64) -> Carry<K> {
        Carry {
            period_ns: period_ns.max(1),
            left: HashMap::new(),
        }
    }

    /// Adds `ns` at `time`: the whole periods now due, if any.
    fn add(&mut self, key: K, ns: u64, time: u64) -> Option<u64> {
        let e = self.left.entry(key).or_insert((0, time));
        e.0 = e.0.saturating_add(ns);
        e.1 = time;
        let periods = e.0 / self.period_ns;
        e.0 -= periods * self.period_ns;
        (periods > 0).then_some(periods)
    }

    /// The places whose time left is drawn as one more period (with probability ns / period,
    /// from a hash of the place and its time: the same profile from the same records), at
    /// their last time, in time order.
    fn rest(self) -> Vec<(K, u64)> {
        use std::hash::{Hash, Hasher};
        let period = self.period_ns as f64;
        let mut v: Vec<(K, u64)> = self
            .left
            .into_iter()
            .filter(|(k, (ns, time))| {
                let mut h = std::hash::DefaultHasher::new();
                (k, ns, time).hash(&mut h);
                // A uniform draw in [0, 1) from the hash's top 53 bits.
                let u = (h.finish() >> 11) as f64 / (1u64 << 53) as f64;
                u < *ns as f64 / period
            })
            .map(|(k, (_, time))| (k, time))
            .collect();
        v.sort_by_key(|(_, time)| *time);
        v
    }
}

/// The system call a stack's kernel frames (leaf first from `leaf`) wait in: "page fault"
/// under a fault's handler; else the outermost system call entry, `__x64_sys_NAME`
/// (`__arm64_sys_`, `__ia32_sys_`); else, where the entry was inlined or is not there, the
/// innermost of `__do_sys_`, `__se_sys_`, `ksys_`, `do_sys_`, `__sys_`, `kernel_`
/// (`kernel_wait4`); else the function the system call dispatcher (`do_syscall_64`,
/// `invoke_syscall`) called, less a `do_` (`do_readv`).
fn kernel_wait(profile: &Profile, leaf: Option<StackId>) -> Option<String> {
    const ENTRIES: [&str; 3] = ["__x64_sys_", "__arm64_sys_", "__ia32_sys_"];
    const INNER: [&str; 6] = [
        "__do_sys_",
        "__se_sys_",
        "ksys_",
        "do_sys_",
        "__sys_",
        "kernel_",
    ];
    const DISPATCHERS: [&str; 6] = [
        "do_syscall_64",
        "x64_sys_call",
        "invoke_syscall",
        "el0_svc_common",
        "do_int80_syscall_32",
        "__do_fast_syscall_32",
    ];
    let mut entry = None;
    let mut inner = None;
    let mut dispatched = None;
    let mut callee: Option<&str> = None;
    for fid in profile.stack_frames(leaf) {
        let f = profile.frame(fid);
        if profile.str(f.module) != superprof_resolve::KERNEL_MODULE {
            break; // past the kernel frames
        }
        let name = profile.str(f.function);
        if matches!(name, "exc_page_fault" | "do_page_fault" | "do_mem_abort") {
            return Some("page fault".to_owned());
        }
        if let Some(call) = ENTRIES.iter().find_map(|p| name.strip_prefix(p)) {
            entry = Some(call); // the outermost wins
        } else if inner.is_none() {
            inner = INNER.iter().find_map(|p| name.strip_prefix(p));
        }
        if dispatched.is_none() && DISPATCHERS.contains(&name) {
            dispatched = callee.filter(|c| !DISPATCHERS.contains(c)).map(|c| {
                c.trim_start_matches("__")
                    .strip_prefix("do_")
                    .unwrap_or(c.trim_start_matches("__"))
            });
        }
        callee = Some(name);
    }
    entry.or(inner).or(dispatched).map(str::to_owned)
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
            },
            PendingSample {
                time: 1,
                tid: 0,
                cpu: 0,
                stack: None,
                kind: SampleKind::OnCpu,
                off_ns: 0,
                periods: 1,
            },
        ];
        for p in all {
            let mut b = Vec::new();
            p.put(&mut b);
            assert_eq!(b.len(), PendingSample::SIZE);
            let q = PendingSample::get(&b).unwrap();
            assert_eq!(
                (q.time, q.tid, q.cpu, q.stack, q.kind, q.off_ns, q.periods),
                (p.time, p.tid, p.cpu, p.stack, p.kind, p.off_ns, p.periods)
            );
        }
        // A kind byte out of range is no sample.
        let mut b = Vec::new();
        all[0].put(&mut b);
        b[37] = 9;
        assert!(PendingSample::get(&b).is_none());
    }

    #[test]
    fn short_waits_add_up_to_whole_periods() {
        let mut c: Carry<u8> = Carry::new(1000);
        assert_eq!(c.add(1, 400, 1), None);
        assert_eq!(c.add(1, 400, 2), None);
        assert_eq!(c.add(1, 400, 3), Some(1)); // 1200: one period, 200 carried
        assert_eq!(c.add(1, 2850, 4), Some(3)); // 3050
        assert_eq!(c.add(2, 600, 5), None);
        assert_eq!(c.add(3, 1000, 6), Some(1));
        // Left: place 1 with 50, 2 with 600, 3 with none (never drawn).
        assert!(c.rest().iter().all(|&(k, _)| k != 3));
    }

    /// 10,000 places (short threads) with a quarter of a period each: about 2,500 periods,
    /// within 4σ (binomial, p = 1/4); before, none (under half a period each was dropped).
    /// Places with a whole number of periods carried nothing, and are never drawn.
    #[test]
    fn time_left_short_of_a_period_is_drawn_as_a_clock_would() {
        let mut c: Carry<u32> = Carry::new(1000);
        for k in 0..10_000 {
            assert_eq!(c.add(k, 250, u64::from(k)), None);
        }
        let drawn = c.rest();
        let (n, p) = (10_000.0f64, 0.25);
        let sigma = (n * p * (1.0 - p)).sqrt();
        assert!(
            (drawn.len() as f64 - n * p).abs() < 4.0 * sigma,
            "{} drawn",
            drawn.len()
        );
        // In time order.
        assert!(drawn.windows(2).all(|w| w[0].1 <= w[1].1));
        // The same records, the same draws.
        let mut again: Carry<u32> = Carry::new(1000);
        for k in 0..10_000 {
            again.add(k, 250, u64::from(k));
        }
        assert_eq!(again.rest(), drawn);
    }

    /// A thread's wait, its records in the order given: (kind, ns) of each wait counted.
    fn waits(order: &[(&str, u64)]) -> Vec<(SampleKind, u64)> {
        let mut c = Collector::default();
        c.expect_switches();
        for &(what, time) in order {
            let switch = |out, preempted| Record::Switch {
                pid: 7,
                tid: 7,
                time,
                cpu: 0,
                id: 0,
                out,
                preempted,
            };
            match what {
                "sample" => c.off_cpu_begin(&SampleRecord {
                    id: 0,
                    time,
                    pid: 7,
                    tid: 7,
                    cpu: 1,
                    period: 1,
                    kernel_ips: Vec::new(),
                    regs: None,
                    stack: &[],
                    stack_full: false,
                }),
                "out" => c.handle(&switch(true, false)),
                "preempt" => c.handle(&switch(true, true)),
                "in" => c.handle(&switch(false, false)),
                _ => unreachable!(),
            }
        }
        c.close_waits(1_000_000);
        c.samples.iter().map(|s| (s.kind, s.off_ns)).collect()
    }

    #[test]
    fn a_wait_ends_at_its_switch_in_whatever_order_its_records_come() {
        let off = SampleKind::OffCpu;
        // In order: from the switch out (after the sample) to the switch in.
        let inorder = [("sample", 100), ("out", 110), ("in", 500)];
        assert_eq!(waits(&inorder), vec![(off, 390)]);
        // The switch in first (the others committed late on another CPU): the same.
        assert_eq!(
            waits(&[("in", 500), ("sample", 100), ("out", 110)]),
            vec![(off, 390)]
        );
        // (Closed by the switch in before its switch out came: from its sample, the µs the
        // sample took to write counted in.)
        assert_eq!(
            waits(&[("sample", 100), ("in", 500), ("out", 110)]),
            vec![(off, 400)]
        );
        // Preempted, its sample lost, the switch out late.
        assert_eq!(
            waits(&[("in", 500), ("preempt", 110)]),
            vec![(SampleKind::Preempted, 390)]
        );
        // A late wait whose switch out never comes ends at its switch in, not at the end.
        assert_eq!(waits(&[("in", 500), ("sample", 100)]), vec![(off, 400)]);
        assert_eq!(
            waits(&[("in", 500), ("sample", 100), ("sample", 700), ("out", 710)]),
            vec![(off, 400), (off, 1_000_000 - 710)]
        );
        // A second wait open when the first's records come: both, each its own length.
        assert_eq!(
            waits(&[
                ("in", 500),
                ("sample", 700),
                ("out", 710),
                ("sample", 100),
                ("out", 110),
                ("in", 900),
            ]),
            vec![(off, 400), (off, 190)]
        );
        // Its switch out and its sample late, each once: counted once.
        assert_eq!(
            waits(&[("in", 500), ("out", 110), ("sample", 100)]),
            vec![(off, 390)]
        );
        // A switch in with nothing open counts nothing; nor does a later one.
        assert_eq!(waits(&[("in", 500), ("in", 900)]), vec![]);
    }

    fn kernel_stack(names: &[&str], user_caller: bool) -> (Profile, Option<StackId>) {
        let mut p = Profile::default();
        let mut s = None;
        if user_caller {
            let f = p.intern_frame_named("read", "libc.so.6", None, 0, 1, false);
            s = Some(p.intern_stack(s, f));
        }
        // Outermost first.
        for (i, n) in names.iter().enumerate() {
            let f = p.intern_frame_named(
                n,
                superprof_resolve::KERNEL_MODULE,
                None,
                0,
                i as u64,
                false,
            );
            s = Some(p.intern_stack(s, f));
        }
        (p, s)
    }

    #[test]
    fn waits_are_named_after_the_innermost_system_call_entry() {
        let (p, s) = kernel_stack(
            &[
                "do_syscall_64",
                "ksys_read",
                "vfs_read",
                "pipe_read",
                "schedule",
            ],
            true,
        );
        assert_eq!(kernel_wait(&p, s).as_deref(), Some("read"));
        let (p, s) = kernel_stack(
            &[
                "do_syscall_64",
                "__x64_sys_futex",
                "do_futex",
                "futex_wait",
                "schedule",
            ],
            true,
        );
        assert_eq!(kernel_wait(&p, s).as_deref(), Some("futex"));
        let (p, s) = kernel_stack(
            &["do_syscall_64", "kernel_wait4", "do_wait", "schedule"],
            true,
        );
        assert_eq!(kernel_wait(&p, s).as_deref(), Some("wait4"));
        let (p, s) = kernel_stack(
            &["asm_exc_page_fault", "exc_page_fault", "io_schedule"],
            true,
        );
        assert_eq!(kernel_wait(&p, s).as_deref(), Some("page fault"));
        // None inside the kernel frames: a user frame ends the search.
        let (p, s) = kernel_stack(&["schedule"], true);
        assert_eq!(kernel_wait(&p, s), None);
        assert_eq!(kernel_wait(&p, None), None);
    }
}
