use std::collections::HashMap;

/// A string interned in a [`Profile`]: its index in the string table ([`Profile::str`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Default)]
pub struct StrId(pub u32);
/// A frame interned in a [`Profile`]: its index in [`Profile::frames`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct FrameId(pub u32);
/// A call path interned in a [`Profile`]: its index in [`Profile::stacks`]. A parent's id is
/// always lower than its children's.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct StackId(pub u32);

/// One source-level frame at one address. An address with inlined calls gives several frames
/// with the same `address`; all but the outermost have `inlined` set.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Frame {
    /// Function name, demangled; `module+0xOFFSET` when the address has no symbol.
    pub function: StrId,
    /// File name of the module (executable, library, `[kernel.kallsyms]`).
    pub module: StrId,
    /// Source file, as the debug information names it; None when unknown.
    pub file: Option<StrId>,
    /// Source line, 0 when unknown.
    pub line: u32,
    /// Address inside the module (ELF virtual address; kernel frames: runtime address).
    pub address: u64,
    /// This frame is a call inlined into the frame outside it, at the same address.
    pub inlined: bool,
}

/// A call path: `frame` called from `parent` (None at the root).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct StackNode {
    /// The call path of the caller; None for the outermost frame.
    pub parent: Option<StackId>,
    /// The innermost frame of this path.
    pub frame: FrameId,
}

/// A thread that has samples (or had, before a filter).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Thread {
    /// Its process.
    pub pid: u32,
    /// The thread's id (equal to `pid` for a process's main thread).
    pub tid: u32,
    /// Its name (the command name, `comm`).
    pub name: StrId,
}

/// The module of the frame that ends an off-CPU stack and names the wait.
pub const WAIT_MODULE: &str = "[off-cpu]";

/// What a sample stands for: time on a CPU, or time off it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default, PartialOrd, Ord)]
pub enum SampleKind {
    /// Running on a CPU (the sampling event's time: cpu-clock, cycles).
    #[default]
    OnCpu,
    /// Off the CPU by its own wish: blocked in a system call, a lock, a sleep, the disk.
    OffCpu,
    /// Off the CPU though it could have run: preempted, waiting for a CPU.
    Preempted,
}

impl SampleKind {
    /// Every kind, in the order of their values (the indexes of
    /// [`Profile::weight_by_kind`]).
    pub const ALL: [SampleKind; 3] = [SampleKind::OnCpu, SampleKind::OffCpu, SampleKind::Preempted];

    /// The name in files (Parquet's `kind`, pprof's `kind` label): `cpu`, `off-cpu`,
    /// `preempted`.
    pub fn as_str(self) -> &'static str {
        match self {
            SampleKind::OnCpu => "cpu",
            SampleKind::OffCpu => "off-cpu",
            SampleKind::Preempted => "preempted",
        }
    }

    /// The kind named `s` ([`SampleKind::as_str`]'s names); None for any other name.
    pub fn parse(s: &str) -> Option<SampleKind> {
        SampleKind::ALL.into_iter().find(|k| k.as_str() == s)
    }

    /// Time off the CPU (a wait or a preemption).
    pub fn is_off_cpu(self) -> bool {
        self != SampleKind::OnCpu
    }
}

/// One sample: when, which thread, where, and how much it stands for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Sample {
    /// Nanoseconds since the recording's start (CLOCK_MONOTONIC differences; the start's Unix
    /// time is `Meta::start_time_unix_ns`).
    pub time_ns: u64,
    /// Index into [`Profile::threads`].
    pub thread: u32,
    /// The CPU it was taken on (0 where the sampler does not know it).
    pub cpu: u32,
    /// Sampling periods this sample stands for: for an on-CPU sample, usually 1, but the CPU
    /// time since the thread's last sample where one sample covers several periods (the ptrace
    /// sampler's wall-clock mode); for an off-CPU one, the time off the CPU in periods (so on-
    /// and off-CPU samples share one scale).
    pub weight: u64,
    /// Leaf of the call path; None when nothing could be unwound.
    pub stack: Option<StackId>,
    /// On-CPU time, or a wait or preemption off the CPU.
    pub kind: SampleKind,
    /// The event it is a sample of: an index into [`Meta::event_list`] (0 where one event
    /// was sampled).
    pub event: u8,
}

impl crate::spill::Spill for Sample {
    const SIZE: usize = 32;
    fn time(&self) -> u64 {
        self.time_ns
    }
    fn put(&self, out: &mut Vec<u8>) {
        out.extend_from_slice(&self.time_ns.to_le_bytes());
        out.extend_from_slice(&self.weight.to_le_bytes());
        out.extend_from_slice(&self.thread.to_le_bytes());
        out.extend_from_slice(&self.cpu.to_le_bytes());
        out.extend_from_slice(&self.stack.map_or(0, |s| s.0).to_le_bytes());
        out.extend_from_slice(&[self.stack.is_some() as u8, self.kind as u8, self.event, 0]);
    }
    fn get(b: &[u8]) -> Option<Sample> {
        use crate::spill::{le_u32, le_u64};
        Some(Sample {
            time_ns: le_u64(b, 0)?,
            weight: le_u64(b, 8)?,
            thread: le_u32(b, 16)?,
            cpu: le_u32(b, 20)?,
            stack: match *b.get(28)? {
                0 => None,
                _ => Some(StackId(le_u32(b, 24)?)),
            },
            kind: *SampleKind::ALL.get(*b.get(29)? as usize)?,
            event: *b.get(30)?,
        })
    }
}

/// A profile's samples: in time order, with at most [`crate::spill::DEFAULT_CAP`] of them in
/// memory ([`crate::spill`]).
pub type SampleLog = crate::spill::TimeLog<Sample>;

/// Facts about the recording.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Meta {
    /// The profiled program's command line (program and arguments); empty when not known.
    pub command: Vec<String>,
    /// What was sampled, as the sampler names it (`cycles`, `cpu-clock`, `cpu-time (SIGPROF,
    /// in process)`...); the events' names, comma-separated, where `events` lists several.
    pub event: String,
    /// The events of a `record -e` (each sample's [`Sample::event`] indexes them); empty for
    /// one event of CPU time, `event`.
    pub events: Vec<EventInfo>,
    /// Samples per second asked for (or lowered to the kernel's maximum); 0 when not known.
    pub frequency: u32,
    /// Wall-clock start (Unix epoch, ns).
    pub start_time_unix_ns: u64,
    /// Length of the recording, in nanoseconds.
    pub duration_ns: u64,
    /// The name of the host it was recorded on.
    pub host: String,
    /// The version of superprof that recorded it.
    pub version: String,
    /// Samples the kernel or the sampler dropped (full buffers).
    pub lost_samples: u64,
    /// Samples whose stack stopped before its outermost frame (see `truncated_by`).
    pub truncated_stacks: u64,
    /// Truncated stacks by reason ("no unwind info", "unreadable memory", ...).
    pub truncated_by: std::collections::BTreeMap<String, u64>,
    /// CPU time the profiled processes used while they were recorded (0: not known).
    pub cpu_time_ns: u64,
    /// How off-CPU time was recorded (`record --off-cpu`): the mechanism's name, e.g.
    /// `sched:sched_switch`; empty when it was not.
    pub off_cpu: String,
    /// Functions whose calls were counted exactly beside the samples (`record --precise`).
    pub calls: Vec<crate::calls::FunctionCalls>,
}

/// An event sampled by `record -e`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EventInfo {
    /// Its name as perf spells it: `page-faults`, `cycles:u`, `sched:sched_switch`.
    pub name: String,
    /// A sample's weight counts occurrences of the event (the sample's period), not
    /// sampling periods of CPU time (`cpu-clock` and `task-clock` are time; any other event
    /// is counted).
    pub counted: bool,
}

impl Meta {
    /// The events sampled, in the order of [`Sample::event`]: `events`, or the one event of
    /// CPU time named `event`.
    pub fn event_list(&self) -> Vec<EventInfo> {
        if self.events.is_empty() {
            vec![EventInfo {
                name: self.event.clone(),
                counted: false,
            }]
        } else {
            self.events.clone()
        }
    }

    /// Whether the profile's weights count events rather than periods of time: its only
    /// event is a counted one.
    pub fn counted(&self) -> bool {
        matches!(self.events.as_slice(), [e] if e.counted)
    }

    /// The index of event `e` in [`Meta::event_list`], added to the list where it is not in it
    /// (at most 256 events: later ones share the last index).
    pub fn event_index(&mut self, e: EventInfo) -> u8 {
        // A profile with no event yet takes this one.
        if self.events.is_empty() && self.event.is_empty() {
            self.event = e.name.clone();
            if e.counted {
                self.events.push(e);
            }
            return 0;
        }
        let list = self.event_list();
        if let Some(i) = list.iter().position(|x| *x == e) {
            return i.min(255) as u8;
        }
        self.events = list;
        self.events.push(e);
        self.event = self
            .events
            .iter()
            .map(|e| e.name.as_str())
            .collect::<Vec<_>>()
            .join(",");
        (self.events.len() - 1).min(255) as u8
    }

    /// The sampling period in nanoseconds (1 s / `frequency`; `frequency` 0 counts as 1 Hz).
    pub fn period_ns(&self) -> u64 {
        1_000_000_000 / u64::from(self.frequency.max(1))
    }

    /// Samples per second of the profiled CPU time: the rate the kernel delivered, where
    /// `frequency` is the one asked (0 when the CPU time is not known).
    pub fn delivered_frequency(&self, samples: usize) -> f64 {
        if self.cpu_time_ns == 0 {
            return 0.0;
        }
        samples as f64 / (self.cpu_time_ns as f64 / 1e9)
    }
}

impl Meta {
    /// "12 no unwind info, 3 unreadable memory" (empty when no stack was truncated).
    pub fn truncation_reasons(&self) -> String {
        self.truncated_by
            .iter()
            .filter(|(_, n)| **n > 0)
            .map(|(why, n)| format!("{n} {why}"))
            .collect::<Vec<_>>()
            .join(", ")
    }
}

/// A profile: its metadata, threads and samples, and the strings, frames and call paths the
/// samples refer to, each interned once (see the crate's notes).
#[derive(Debug, Default, Clone)]
pub struct Profile {
    /// Facts about the recording.
    pub meta: Meta,
    strings: Vec<String>,
    string_ids: HashMap<String, StrId>,
    frames: Vec<Frame>,
    frame_ids: HashMap<Frame, FrameId>,
    stacks: Vec<StackNode>,
    stack_ids: HashMap<StackNode, StackId>,
    /// The threads, by index ([`Sample::thread`]).
    pub threads: Vec<Thread>,
    /// The samples, read back in time order (equal times in the order added).
    pub samples: SampleLog,
}

impl Profile {
    /// The id of string `s`, added to the table the first time.
    pub fn intern_str(&mut self, s: &str) -> StrId {
        if let Some(&id) = self.string_ids.get(s) {
            return id;
        }
        let id = StrId(self.strings.len() as u32);
        self.strings.push(s.to_owned());
        self.string_ids.insert(s.to_owned(), id);
        id
    }

    /// The string with this id (an id of this profile: another's names another string, or
    /// panics past the end of the table).
    pub fn str(&self, id: StrId) -> &str {
        &self.strings[id.0 as usize]
    }

    /// Adds another profile's threads and samples (a process of the same run, say): strings,
    /// frames and stacks are interned again. The merged profile starts at the earlier of the
    /// two starts, and every sample's time (this profile's and `other`'s) is moved to count
    /// from it, whichever of the two started first.
    pub fn merge(&mut self, other: &Profile) {
        let mut strs: HashMap<StrId, StrId> = HashMap::new();
        let mut str_of = |p: &mut Profile, id: StrId| -> StrId {
            *strs
                .entry(id)
                .or_insert_with(|| p.intern_str(other.str(id)))
        };
        let frames: Vec<FrameId> = other
            .frames
            .iter()
            .map(|f| {
                let frame = Frame {
                    function: str_of(self, f.function),
                    module: str_of(self, f.module),
                    file: f.file.map(|x| str_of(self, x)),
                    ..*f
                };
                self.intern_frame(frame)
            })
            .collect();
        let mut stacks: Vec<StackId> = Vec::with_capacity(other.stacks.len());
        for n in &other.stacks {
            // Parents come before their children in the trie.
            let parent = n.parent.map(|p| stacks[p.0 as usize]);
            stacks.push(self.intern_stack(parent, frames[n.frame.0 as usize]));
        }
        let threads: Vec<u32> = other
            .threads
            .iter()
            .map(|t| {
                let name = str_of(self, t.name);
                self.add_thread_named(t.pid, t.tid, name)
            })
            .collect();
        // Both profiles' times count from the earlier start: the one that started later has
        // its samples moved by the difference.
        let start = self
            .meta
            .start_time_unix_ns
            .min(other.meta.start_time_unix_ns);
        let own_shift = self.meta.start_time_unix_ns - start;
        let shift = other.meta.start_time_unix_ns - start;
        if own_shift > 0 {
            self.samples.map_all(|smp| Sample {
                time_ns: smp.time_ns.saturating_add(own_shift),
                ..smp
            });
        }
        // The other's events, by name in this one's list (added where missing).
        let events: Vec<u8> = other
            .meta
            .event_list()
            .into_iter()
            .map(|e| self.meta.event_index(e))
            .collect();
        for smp in &other.samples {
            self.samples.push(Sample {
                time_ns: smp.time_ns.saturating_add(shift),
                thread: threads[smp.thread as usize],
                stack: smp.stack.map(|s| stacks[s.0 as usize]),
                event: events.get(smp.event as usize).copied().unwrap_or(0),
                ..smp
            });
        }
        let m = &mut self.meta;
        m.start_time_unix_ns = start;
        m.duration_ns = own_shift
            .saturating_add(m.duration_ns)
            .max(shift.saturating_add(other.meta.duration_ns));
        m.lost_samples = m.lost_samples.saturating_add(other.meta.lost_samples);
        m.truncated_stacks = m
            .truncated_stacks
            .saturating_add(other.meta.truncated_stacks);
        m.cpu_time_ns = m.cpu_time_ns.saturating_add(other.meta.cpu_time_ns);
        for (why, n) in &other.meta.truncated_by {
            let total = m.truncated_by.entry(why.clone()).or_default();
            *total = total.saturating_add(*n);
        }
    }

    /// The id of `frame` (whose strings are this profile's), added the first time.
    pub fn intern_frame(&mut self, frame: Frame) -> FrameId {
        *self.frame_ids.entry(frame).or_insert_with(|| {
            self.frames.push(frame);
            FrameId(self.frames.len() as u32 - 1)
        })
    }

    /// Interns a frame given by its strings.
    pub fn intern_frame_named(
        &mut self,
        function: &str,
        module: &str,
        file: Option<&str>,
        line: u32,
        address: u64,
        inlined: bool,
    ) -> FrameId {
        let frame = Frame {
            function: self.intern_str(function),
            module: self.intern_str(module),
            file: file.map(|f| self.intern_str(f)),
            line,
            address,
            inlined,
        };
        self.intern_frame(frame)
    }

    /// The frame with this id.
    pub fn frame(&self, id: FrameId) -> &Frame {
        &self.frames[id.0 as usize]
    }

    /// Every interned frame, by id.
    pub fn frames(&self) -> &[Frame] {
        &self.frames
    }

    /// The id of the call path `frame` called from `parent` (None: `frame` is outermost),
    /// added the first time.
    pub fn intern_stack(&mut self, parent: Option<StackId>, frame: FrameId) -> StackId {
        let node = StackNode { parent, frame };
        *self.stack_ids.entry(node).or_insert_with(|| {
            self.stacks.push(node);
            StackId(self.stacks.len() as u32 - 1)
        })
    }

    /// The call path with this id.
    pub fn stack(&self, id: StackId) -> &StackNode {
        &self.stacks[id.0 as usize]
    }

    /// Every interned call path, by id (parents before their children).
    pub fn stacks(&self) -> &[StackNode] {
        &self.stacks
    }

    /// Frames of a stack, leaf first.
    pub fn stack_frames(&self, leaf: Option<StackId>) -> impl Iterator<Item = FrameId> + '_ {
        let mut cur = leaf;
        std::iter::from_fn(move || {
            let node = self.stack(cur?);
            cur = node.parent;
            Some(node.frame)
        })
    }

    /// Adds a thread and returns its index (for [`Sample::thread`]). Threads are not merged:
    /// each call adds one.
    pub fn add_thread(&mut self, pid: u32, tid: u32, name: &str) -> u32 {
        let name = self.intern_str(name);
        self.add_thread_named(pid, tid, name)
    }

    /// [`Profile::add_thread`] with a name already interned.
    pub fn add_thread_named(&mut self, pid: u32, tid: u32, name: StrId) -> u32 {
        self.threads.push(Thread { pid, tid, name });
        self.threads.len() as u32 - 1
    }

    /// The name of the thread with this index.
    pub fn thread_name(&self, thread: u32) -> &str {
        self.str(self.threads[thread as usize].name)
    }

    /// Every interned string, by id.
    pub fn strings(&self) -> impl Iterator<Item = &str> + '_ {
        self.strings.iter().map(String::as_str)
    }

    /// Adds an on-CPU sample: at `time_ns` since the start, of thread index `thread`, on
    /// `cpu`, standing for `weight` periods, with leaf `stack`.
    pub fn add_sample(
        &mut self,
        time_ns: u64,
        thread: u32,
        cpu: u32,
        weight: u64,
        stack: Option<StackId>,
    ) {
        self.add_sample_of(SampleKind::OnCpu, time_ns, thread, cpu, weight, stack);
    }

    /// [`Profile::add_sample`] for a sample of any kind.
    pub fn add_sample_of(
        &mut self,
        kind: SampleKind,
        time_ns: u64,
        thread: u32,
        cpu: u32,
        weight: u64,
        stack: Option<StackId>,
    ) {
        self.samples.push(Sample {
            time_ns,
            thread,
            cpu,
            weight,
            stack,
            kind,
            event: 0,
        });
    }

    /// The frame that ends an off-CPU stack: `[off-cpu: read]` (the system call the thread
    /// waited in), `[off-cpu]` (a wait outside a known one), `[preempted]`.
    pub fn wait_frame(&mut self, kind: SampleKind, wait: Option<&str>) -> FrameId {
        let name = match (kind, wait) {
            (SampleKind::Preempted, _) => "[preempted]".to_owned(),
            (_, Some(w)) => format!("[off-cpu: {w}]"),
            (_, None) => "[off-cpu]".to_owned(),
        };
        self.intern_frame_named(&name, WAIT_MODULE, None, 0, 0, false)
    }

    /// On-CPU samples (their weight: a sample of the ptrace sampler's wall-clock mode may
    /// stand for several periods).
    pub fn on_cpu_samples(&self) -> u64 {
        self.weight_by_kind()[SampleKind::OnCpu as usize]
    }

    /// Whether any sample is off-CPU time.
    pub fn has_off_cpu(&self) -> bool {
        self.samples.iter().any(|s| s.kind.is_off_cpu())
    }

    /// Total weight of the samples of each kind, in [`SampleKind::ALL`]'s order.
    pub fn weight_by_kind(&self) -> [u64; 3] {
        let mut w = [0u64; 3];
        for s in &self.samples {
            w[s.kind as usize] = w[s.kind as usize].saturating_add(s.weight);
        }
        w
    }

    /// Sum of sample weights per stack leaf (index: stack id; the last slot counts samples
    /// with no stack).
    pub fn weight_per_stack(&self) -> Vec<u64> {
        let mut w = vec![0u64; self.stacks.len() + 1];
        for s in &self.samples {
            let i = s.stack.map_or(self.stacks.len(), |id| id.0 as usize);
            w[i] = w[i].saturating_add(s.weight);
        }
        w
    }

    /// The weight of all samples, in sampling periods (saturating at `u64::MAX`).
    pub fn total_weight(&self) -> u64 {
        self.samples
            .iter()
            .fold(0u64, |w, s| w.saturating_add(s.weight))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// What a profile past its cap writes to its temporary file reads back as it was.
    #[test]
    fn samples_come_back_from_the_spill_file_whole() {
        use crate::spill::Spill;
        for s in [
            Sample {
                time_ns: u64::MAX,
                thread: 5,
                cpu: 1,
                weight: 3,
                stack: Some(StackId(0)),
                kind: SampleKind::OffCpu,
                event: 7,
            },
            Sample {
                time_ns: 0,
                thread: 0,
                cpu: 0,
                weight: 1,
                stack: None,
                kind: SampleKind::OnCpu,
                event: 0,
            },
        ] {
            let mut b = Vec::new();
            s.put(&mut b);
            assert_eq!(b.len(), Sample::SIZE);
            assert_eq!(Sample::get(&b), Some(s));
        }
    }

    /// A profile of one process with the stack `main;f` (n samples) and `main;g` (m).
    fn profile(pid: u32, start: u64, n: u64, m: u64) -> Profile {
        let mut p = Profile::default();
        p.meta.start_time_unix_ns = start;
        let t = p.add_thread(pid, pid, "prog");
        let main = p.intern_frame_named("main", "/bin/prog", Some("prog.c"), 3, 0x10, false);
        let f = p.intern_frame_named("f", "/bin/prog", Some("prog.c"), 7, 0x20, false);
        let g = p.intern_frame_named("g", "/bin/prog", None, 0, 0x30, false);
        let root = p.intern_stack(None, main);
        let sf = p.intern_stack(Some(root), f);
        let sg = p.intern_stack(Some(root), g);
        for i in 0..n {
            p.add_sample(i, t, 0, 1, Some(sf));
        }
        for i in 0..m {
            p.add_sample(i, t, 0, 1, Some(sg));
        }
        p
    }

    fn leaves(p: &Profile) -> Vec<(String, u32, u64)> {
        let mut v: Vec<(String, u32, u64)> = p
            .samples
            .iter()
            .map(|s| {
                let leaf = p.stack_frames(s.stack).next().unwrap();
                let path: Vec<&str> = p
                    .stack_frames(s.stack)
                    .map(|f| p.str(p.frame(f).function))
                    .collect();
                assert_eq!(path.last(), Some(&"main"));
                (
                    p.str(p.frame(leaf).function).to_owned(),
                    p.threads[s.thread as usize].pid,
                    s.time_ns,
                )
            })
            .collect();
        v.sort();
        v
    }

    #[test]
    fn kinds_by_name_and_wait_frames() {
        for k in SampleKind::ALL {
            assert_eq!(SampleKind::parse(k.as_str()), Some(k));
        }
        assert_eq!(SampleKind::parse("idle"), None);
        assert!(!SampleKind::OnCpu.is_off_cpu());
        assert!(SampleKind::Preempted.is_off_cpu());
        let mut p = Profile::default();
        let name = |p: &mut Profile, k, w| {
            let f = p.wait_frame(k, w);
            (
                p.str(p.frame(f).function).to_owned(),
                p.str(p.frame(f).module).to_owned(),
            )
        };
        assert_eq!(
            name(&mut p, SampleKind::OffCpu, Some("read")),
            ("[off-cpu: read]".to_owned(), WAIT_MODULE.to_owned())
        );
        assert_eq!(name(&mut p, SampleKind::OffCpu, None).0, "[off-cpu]");
        assert_eq!(
            name(&mut p, SampleKind::Preempted, Some("read")).0,
            "[preempted]"
        );
        let t = p.add_thread(1, 1, "t");
        p.add_sample(0, t, 0, 1, None);
        p.add_sample_of(SampleKind::OffCpu, 1, t, 0, 7, None);
        p.add_sample_of(SampleKind::Preempted, 2, t, 0, 2, None);
        assert_eq!(p.weight_by_kind(), [1, 7, 2]);
        assert!(p.has_off_cpu());
    }

    #[test]
    fn merge_keeps_every_sample_with_its_stack_thread_and_time() {
        let mut a = profile(1, 1_000, 2, 1);
        let b = profile(2, 1_500, 1, 2);
        a.merge(&b);
        let l = leaves(&a);
        assert_eq!(l.len(), 6);
        let f: Vec<_> = l.iter().filter(|x| x.0 == "f").collect();
        let g: Vec<_> = l.iter().filter(|x| x.0 == "g").collect();
        assert_eq!((f.len(), g.len()), (3, 3));
        // b's samples: its own process, times moved by the 500 ns between the starts.
        assert!(f.contains(&&("f".to_owned(), 2, 500)));
        assert!(g.contains(&&("g".to_owned(), 2, 501)));
        // Frames and stacks interned once: the same frames for both processes.
        assert_eq!(a.frames().len(), 3);
        assert_eq!(a.stacks().len(), 3);
        assert_eq!(a.threads.len(), 2);
    }

    #[test]
    fn merge_starts_at_the_earlier_start_in_either_order() {
        let mut a = profile(1, 1_000, 2, 1);
        a.meta.duration_ns = 100;
        let mut b = profile(2, 1_500, 1, 2);
        b.meta.duration_ns = 700;
        // The one that started first merged into the later one.
        let mut later = b.clone();
        later.merge(&a);
        assert_eq!(later.meta.start_time_unix_ns, 1_000);
        // b's own samples moved by the 500 ns between the starts; a's kept their times.
        assert!(leaves(&later).contains(&("f".to_owned(), 2, 500)));
        assert!(leaves(&later).contains(&("f".to_owned(), 1, 1)));
        assert_eq!(later.meta.duration_ns, 1_200);
        // The same profile as merging the other way round.
        let mut earlier = a.clone();
        earlier.merge(&b);
        assert_eq!(earlier.meta.start_time_unix_ns, 1_000);
        assert_eq!(earlier.meta.duration_ns, 1_200);
        assert_eq!(leaves(&earlier), leaves(&later));
    }

    #[test]
    fn weights_saturate() {
        let mut p = Profile::default();
        let t = p.add_thread(1, 1, "t");
        let f = p.intern_frame_named("f", "m", None, 0, 0, false);
        let s = p.intern_stack(None, f);
        p.add_sample(0, t, 0, u64::MAX, Some(s));
        p.add_sample(1, t, 0, 2, Some(s));
        p.add_sample(2, t, 0, u64::MAX, None);
        p.add_sample(3, t, 0, 2, None);
        assert_eq!(p.total_weight(), u64::MAX);
        assert_eq!(p.weight_per_stack(), vec![u64::MAX, u64::MAX]);
        assert_eq!(p.weight_by_kind()[0], u64::MAX);
    }
}
