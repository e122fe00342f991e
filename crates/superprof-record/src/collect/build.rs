//! The profile built at the end (or at each interval's, for the agent): every distinct
//! address symbolized once, the address stacks made frames, the samples placed.

use super::off_cpu::{kernel_wait, Carry};
use super::*;

impl Collector {
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

    /// Names the samples taken in `code` (code no file maps) after its functions.
    pub fn name_code(&mut self, code: Vec<crate::CodeName>) {
        self.code_names.extend(code);
    }

    /// The profile of the samples so far, symbolized, the collector unchanged (sample times
    /// from `start_ns`; its metadata empty).
    pub fn snapshot(&self, start_ns: u64) -> Profile {
        self.build(Profile::default(), start_ns)
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
                    let named = self
                        .code_names
                        .iter()
                        .find(|c| c.pid == pid && (c.lo..c.hi).contains(&addr));
                    chain.push(match named {
                        Some(c) => {
                            profile.intern_frame_named(&c.function, &c.module, None, 0, addr, false)
                        }
                        None => namer.anonymous_frame(&mut profile, Some(pid), addr),
                    });
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
                let name = if s.tid == 0 {
                    // The idle task of every CPU (system-wide), named as perf names it.
                    "swapper".to_owned()
                } else if name.is_empty() {
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
                profile.samples.push(superprof_profile::Sample {
                    time_ns: time,
                    thread: t,
                    cpu: s.cpu,
                    weight: s.periods,
                    stack,
                    kind: SampleKind::OnCpu,
                    event: s.event,
                });
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
