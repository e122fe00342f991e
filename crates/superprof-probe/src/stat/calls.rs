//! From probe hits to calls: the uprobe and in-process rings read, each hit opening or closing
//! a thread's outermost call, and each call's counts kept.

use super::*;

impl Session {
    /// A thread that ended (or the process): its calls still open were left by its end and
    /// count, with the figures of its last hit (the return breakpoints they held are
    /// released).
    pub(super) fn forget_thread(&mut self, tid: u32) {
        let last = self.last_hit.remove(&tid);
        if let Some(frames) = self.frames.remove(&tid) {
            // Calls left by the thread's end (pthread_exit, the process's exit or death): still
            // calls, with the thread's figures at its last hit (ptrace: its counters now).
            let (end, end_ns) = match last {
                Some((values, time)) => (values, Some(time)),
                None => (self.read(tid), None),
            };
            for f in frames {
                self.results.as_mut().expect("results").uncertain[f.region] += f.nested;
                let elapsed = match end_ns {
                    Some(t) if f.start_ns > 0 => t.saturating_sub(f.start_ns) as f64,
                    _ => f.started.elapsed().as_nanos() as f64,
                };
                self.record(tid, &f, &end, elapsed);
                for exit in f.exits.iter().map(|e| e.0).chain(f.tails.iter().copied()) {
                    if let Some(n) = self.returns.get_mut(&exit) {
                        *n = n.saturating_sub(1);
                    }
                }
            }
        }
    }

    /// Reads the uprobe rings, or the in-process ring, and turns their hits into calls.
    pub(super) fn drain_hits(&mut self, root: u32) {
        if let Some(ip) = self.inproc.as_mut() {
            let mut records = std::mem::take(&mut self.records);
            records.clear();
            self.lost_hits += ip.drain(&mut records);
            let reads: Vec<Option<InProcessReading>> =
                self.events.iter().map(InProcessReading::of).collect();
            for r in &records {
                let Some(&role) = self.ip_roles.get(r.probe as usize) else {
                    continue;
                };
                // A region moved to ptrace after its probes went in: theirs are ignored (an
                // end shared with one on ptrace too: its breakpoint closes those frames).
                match role {
                    Role::Entry(region, _) | Role::Exit(region) => {
                        if self.on_ptrace.contains(&region) {
                            continue;
                        }
                    }
                    Role::End(addr) => {
                        let on_ptrace = self.on_ptrace.iter().any(|&r| {
                            self.regions
                                .get(r)
                                .is_some_and(|g| g.sites.iter().any(|(_, s)| s.end == Some(addr)))
                        });
                        if on_ptrace {
                            continue;
                        }
                    }
                }
                let hit = superprof_sample::ProbeHit {
                    probe: r.probe as usize,
                    pid: root,
                    tid: r.tid,
                    time: r.time,
                    sp: r.sp,
                    values: reads
                        .iter()
                        .map(|x| Reading {
                            value: x.map_or(0, |x| x.value(r)),
                            ..Reading::default()
                        })
                        .collect(),
                };
                self.on_hit(role, &hit);
            }
            self.records = records;
            // Threads that exited whose every record is read now.
            let read = self.inproc.as_ref().map_or(u64::MAX, |ip| ip.read());
            let done: Vec<u32> = self
                .exited
                .iter()
                .filter(|&&(_, taken)| taken <= read)
                .map(|&(tid, _)| tid)
                .collect();
            self.exited.retain(|&(_, taken)| taken > read);
            for tid in done {
                self.forget_thread(tid);
            }
        }
        for a in 0..self.armed.len() {
            let mut hits = std::mem::take(&mut self.hits);
            hits.clear();
            self.lost_hits += self.armed[a].group.drain(&mut hits);
            let batch = self.armed[a].batch;
            for h in &hits {
                if h.pid != root {
                    continue;
                }
                if let Some(&role) = self.batches[batch].roles.get(h.probe) {
                    self.on_hit(role, h);
                }
            }
            self.hits = hits;
        }
    }

    pub(super) fn on_hit(&mut self, role: Role, h: &superprof_sample::ProbeHit) {
        // The thread's latest figures: those of a call it leaves by ending.
        match self.last_hit.get_mut(&h.tid) {
            Some((values, time)) => {
                values.clone_from(&h.values);
                *time = h.time;
            }
            None => {
                self.last_hit.insert(h.tid, (h.values.clone(), h.time));
            }
        }
        let frames = self.frames.entry(h.tid).or_default();
        // A call found left without a return (an exception, a longjmp): still a call, with
        // its events up to this hit, the first to show it was left.
        let mut left = None;
        let closed = match role {
            Role::Entry(region, site) if site.ends_at_return && self.instant.contains(&region) => {
                let frame = Frame {
                    region,
                    exits: Vec::new(),
                    sp: h.sp,
                    start: h.values.clone(),
                    started: Instant::now(),
                    start_ns: h.time,
                    nested: 0,
                    tails: Vec::new(),
                };
                self.record(h.tid, &frame, &h.values, 0.0);
                return;
            }
            Role::Entry(region, site) => {
                if let Some(p) = frames.iter().position(|f| f.region == region) {
                    if !site.ends_at_return || h.sp < frames[p].sp {
                        // Recursion: the outermost call counts. (Or the open call was left
                        // and this one begins deeper: told only if it turns out left.)
                        if site.ends_at_return {
                            frames[p].nested += 1;
                        }
                        return;
                    }
                    // Entered again at the same depth or above: the open call was left without
                    // a return (an exception, a longjmp).
                    left = Some(frames.remove(p));
                }
                let mut exits = Vec::new();
                if let Some(end) = site.end {
                    exits.push((end, false));
                }
                if site.ends_at_return {
                    exits.push((0, true));
                }
                if !exits.is_empty() {
                    frames.push(Frame {
                        region,
                        exits,
                        sp: h.sp,
                        start: h.values.clone(),
                        started: Instant::now(),
                        start_ns: h.time,
                        nested: 0,
                        tails: Vec::new(),
                    });
                }
                None
            }
            Role::End(addr) => frames
                .iter()
                .rposition(|f| f.exits.iter().any(|&(a, r)| !r && a == addr)),
            Role::Exit(region) => {
                let open = frames
                    .iter()
                    .rposition(|f| f.region == region && f.exits.iter().any(|&(_, r)| r));
                match open {
                    // The outermost call leaving (a recursive one leaves with its stack lower).
                    Some(p) if h.sp == frames[p].sp => Some(p),
                    // Leaving a call above it: it was left without a return.
                    Some(p) if h.sp > frames[p].sp => {
                        left = Some(frames.remove(p));
                        None
                    }
                    _ => None,
                }
            }
        };
        let closed = closed.map(|pos| frames.remove(pos));
        if let Some(f) = &left {
            self.results.as_mut().expect("results").uncertain[f.region] += f.nested;
        }
        for frame in left.iter().chain(closed.iter()) {
            let elapsed = h.time.saturating_sub(frame.start_ns) as f64;
            self.record(h.tid, frame, &h.values, elapsed);
        }
    }

    /// What an in-process record would say, for thread `tid` stopped at a breakpoint: the time,
    /// its stack pointer, and its counters read from /proc (CPU time from schedstat, faults
    /// from stat, context switches from status).
    pub(super) fn hit_from_proc(
        &self,
        tracer: &Tracer,
        tid: u32,
        pid: u32,
    ) -> Option<superprof_sample::ProbeHit> {
        let sp = tracer.regs(tid).ok()?.sp;
        let time = superprof_trace::monotonic_ns();
        let cputime = superprof_trace::CpuTime::open(pid, tid)
            .and_then(|c| c.read())
            .unwrap_or(0);
        let stat = std::fs::read_to_string(format!("/proc/{pid}/task/{tid}/stat")).ok()?;
        // After the command's closing parenthesis: state is field 3; minflt 10, majflt 12.
        let rest = stat.rsplit_once(')')?.1;
        let field = |n: usize| -> u64 {
            rest.split_whitespace()
                .nth(n - 3)
                .and_then(|v| v.parse().ok())
                .unwrap_or(0)
        };
        let status = std::fs::read_to_string(format!("/proc/{pid}/task/{tid}/status")).ok()?;
        let count = |key: &str| -> u64 {
            status
                .lines()
                .find_map(|l| l.strip_prefix(key))
                .and_then(|v| v.trim().parse().ok())
                .unwrap_or(0)
        };
        let r = crate::inprocess::Record {
            probe: 0,
            tid,
            sp,
            time,
            cputime,
            minflt: field(10),
            majflt: field(12),
            nvcsw: count("voluntary_ctxt_switches:"),
            nivcsw: count("nonvoluntary_ctxt_switches:"),
        };
        Some(superprof_sample::ProbeHit {
            probe: 0,
            pid,
            tid,
            time,
            sp,
            values: self
                .events
                .iter()
                .map(|e| Reading {
                    value: InProcessReading::of(e).map_or(0, |x| x.value(&r)),
                    ..Reading::default()
                })
                .collect(),
        })
    }

    /// Keeps one call's counts as measured (the engine's cost comes off in [`tally`]).
    pub(super) fn record(&mut self, tid: u32, frame: &Frame, end: &[Reading], elapsed: f64) {
        let res = self.results.as_mut().expect("results");
        let r = frame.region;
        let mut values = Vec::with_capacity(end.len() + 1);
        let mut scaled_mask = 0u64;
        for (i, (a, b)) in frame.start.iter().zip(end).enumerate() {
            let (v, scaled) = scaled_delta(a, b);
            if scaled && i < 64 {
                scaled_mask |= 1 << i;
            }
            values.push(v);
        }
        values.push(elapsed);
        res.calls[r] += 1;
        let engine = if matches!(self.engine, Engine::Ptrace) || self.on_ptrace.contains(&r) {
            Engine::Ptrace
        } else if let Some(pmu) = self.uprobe_fallback.filter(|_| self.on_uprobe.contains(&r)) {
            Engine::Uprobe(pmu)
        } else {
            self.engine
        };
        let kind = match engine {
            Engine::Uprobe(_) => self.kinds.get(&r).copied().unwrap_or(EntryKind::Stepped),
            // ptrace steps every breakpoint's instruction
            Engine::Ptrace | Engine::InProcess => EntryKind::Stepped,
        };
        res.per_call.push(Call {
            region: r,
            tid,
            engine: engine.name(),
            kind,
            scaled: scaled_mask,
            values,
        });
    }
}
