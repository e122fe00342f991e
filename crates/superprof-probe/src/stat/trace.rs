//! The run: the program traced to its end (or --duration / Ctrl-C), its threads, execs and
//! breakpoints dispatched to the session.

use super::*;

impl Session {
    /// Runs the target to its end (or --duration / Ctrl-C). Returns its exit status and
    /// whether it died inside a region.
    ///
    /// (One function of 242 lines: one event loop whose locals (`tracer`, `placement`,
    /// `place_at_stop`, `exit`, `died_inside`) run from the attach to the ending (last hits, probes
    /// closed, tracer finished); split, they would travel in a struct.)
    pub(super) fn trace(
        &mut self,
        pid: Option<u32>,
        command: &[std::ffi::OsString],
        duration: Option<Duration>,
    ) -> Result<(Option<ExitStatus>, bool)> {
        let opts = TraceOptions {
            hold_new_threads: matches!(self.engine, Engine::Uprobe(_))
                || self.uprobe_fallback.is_some(),
            // (A thread inside a region runs without the guard's stops: set_quiet.)
            guard_sigtrap: matches!(self.engine, Engine::Ptrace),
            ..TraceOptions::default()
        };
        let (mut tracer, launched) = match pid {
            Some(pid) => (Tracer::attach(pid, opts)?, false),
            None => (Tracer::spawn(command, opts)?, true),
        };
        let root = tracer.root();
        let mut names: Vec<String> = self.events.iter().map(|e| e.name.clone()).collect();
        names.push("time-elapsed-ns".into());
        self.results = Some(Results {
            engine: self.engine.name(),
            engines: Vec::new(),
            regions: Vec::new(),
            events: names.clone(),
            calls: vec![0; self.specs.len()],
            stats: vec![vec![Stats::default(); names.len()]; self.specs.len()],
            per_call: Vec::new(),
            lost_hits: 0,
            uncertain: vec![0; self.specs.len()],
        });
        let mut placement = Placement::default();
        let in_process = matches!(self.engine, Engine::InProcess);
        // Attached in-process: the regions are placed at the first stop of the interrupted
        // main thread (system calls run in it, every other thread held).
        let mut place_at_stop = false;
        if !launched {
            for tid in superprof_sample::list_threads(root).unwrap_or_default() {
                self.open_counters(tid);
            }
            if in_process {
                place_at_stop = tracer.interrupt(root);
                if !place_at_stop {
                    bail!("cannot stop pid {root} to place the regions");
                }
            // Stop everything while the breakpoints go in? Writing int3 is atomic per byte;
            // threads run on.
            } else if !self.place(&mut tracer, root, true)? {
                bail!("{}", self.first_missing());
            }
        }
        let start = Instant::now();
        let mut exit = None;
        let mut died_inside = false;
        // The uprobe rings are read every 10 ms (16 MiB hold about 100 ms of hits at the
        // fastest rate a uprobe allows).
        let wait = match self.engine {
            Engine::Uprobe(_) | Engine::InProcess => Duration::from_millis(10),
            Engine::Ptrace => Duration::from_millis(50),
        };
        let mut progress = superprof_resolve::progress::Progress::new(!self.calibrating);
        loop {
            self.drain_hits(root);
            progress.update(|| {
                let calls: u64 = self.results.as_ref().map_or(0, |r| r.calls.iter().sum());
                format!("{calls} calls")
            });
            // (The calibration run ends by itself, even after a stop signal: within its
            // deadline.)
            let stop = (self.stop)() && !self.calibrating;
            if stop || duration.is_some_and(|d| start.elapsed() >= d) {
                break;
            }
            let Some(ev) = tracer.next_event(wait)? else {
                continue;
            };
            match ev {
                TraceEvent::Stopped { tid, .. } if tid == root && place_at_stop => {
                    place_at_stop = false;
                    tracer.hold_others(tid);
                    self.stopped = Some(tid);
                    let all = self.place(&mut tracer, root, true);
                    self.stopped = None;
                    tracer.let_others_go();
                    if !all? {
                        bail!("{}", self.first_missing());
                    }
                    tracer.resume(tid);
                }
                TraceEvent::Exec { pid } if pid == root => {
                    if placement.exec() {
                        // The program ran another (a wrapper such as env): what was placed
                        // went with its code; start over on the new program (its last
                        // records read first).
                        self.drain_hits(root);
                        self.forget_placements();
                    }
                    self.open_counters(pid);
                    // (Its only thread is stopped: the in-process engine runs its system
                    // calls there.)
                    self.stopped = Some(pid);
                    self.libraries_mapped = placement.libraries_mapped();
                    let all = self.place(&mut tracer, pid, false)?;
                    // Libraries are loaded by ld.so after exec: look again at the program's
                    // entry point, when they are all mapped; with no entry point to wait
                    // for, what is missing is said at the end (the command runs on).
                    if !placement.after_exec(&mut tracer, pid, all) && !all {
                        self.libraries_mapped = placement.libraries_mapped();
                        self.place(&mut tracer, pid, true)?;
                    }
                    self.stopped = None;
                    tracer.resume(pid);
                }
                TraceEvent::Breakpoint { tid, pid, addr } if placement.is_control(addr) => {
                    // At the entry point every library ld.so maps at start is there: a region
                    // missing then gets its error (said at the end if dlopen never brings it).
                    let probes: std::collections::HashSet<u64> = self
                        .entries
                        .keys()
                        .chain(self.returns.keys())
                        .copied()
                        .collect();
                    placement.lift(&mut tracer, pid, addr, &|a| probes.contains(&a));
                    self.libraries_mapped = placement.libraries_mapped();
                    if in_process {
                        tracer.hold_others(tid);
                        self.stopped = Some(tid);
                    }
                    let all = self.place(&mut tracer, pid, placement.is_entry(addr));
                    if in_process {
                        self.stopped = None;
                        tracer.let_others_go();
                    }
                    let all = all?;
                    let probed =
                        self.entries.contains_key(&addr) || self.returns.contains_key(&addr);
                    let (entries, returns) = (&self.entries, &self.returns);
                    placement.after_control(&mut tracer, pid, addr, all, &|a| {
                        entries.contains_key(&a) || returns.contains_key(&a)
                    })?;
                    if probed {
                        self.on_breakpoint(&mut tracer, tid, pid, addr);
                    }
                    tracer.resume(tid);
                }
                TraceEvent::Breakpoint { tid, pid, addr } => {
                    self.on_breakpoint(&mut tracer, tid, pid, addr);
                    // Inside a region, no system call stops of the SIGTRAP guard: they would
                    // be in the call's figures.
                    let inside = self.frames.get(&tid).is_some_and(|f| !f.is_empty());
                    tracer.set_quiet(tid, inside);
                    tracer.resume(tid);
                }
                TraceEvent::NewThread { tid, .. } => {
                    if matches!(self.engine, Engine::Ptrace) || !self.on_ptrace.is_empty() {
                        self.open_counters(tid);
                    }
                    // Its probes as soon as it is known (a thread born while the coordinator
                    // holds every thread to step a breakpoint has no ThreadReady).
                    if !self.batches.is_empty() {
                        self.arm_new_thread(tid)?;
                    }
                }
                // (uprobe engine) A new thread, held before its first instruction: its
                // probes first (if its NewThread has not opened them).
                TraceEvent::ThreadReady { tid, .. } => {
                    if !self.batches.is_empty() {
                        self.arm_new_thread(tid)?;
                    }
                    tracer.resume(tid);
                }
                TraceEvent::ThreadExited { tid, .. } => {
                    self.disarm_thread(root, tid);
                    // Its records may still wait in the in-process ring behind another
                    // thread's record being written: its open calls go once those are read
                    // (dropped now, the rest of its records would open calls of their own).
                    match self.inproc.as_ref().map(|ip| ip.taken()) {
                        Some(taken) if taken > self.inproc.as_ref().map_or(0, |ip| ip.read()) => {
                            self.exited.push((tid, taken))
                        }
                        _ => self.forget_thread(tid),
                    }
                    self.counters.remove(&tid);
                }
                TraceEvent::ProcessExited { pid, status } if pid == root => {
                    died_inside = matches!(status, ExitStatus::Signal(_))
                        && self.frames.values().any(|f| !f.is_empty());
                    exit = Some(status);
                    break;
                }
                other => tracer.resume_after(&other),
            }
        }
        progress.clear();
        // The last hits, then the probes closed (the kernel removes them), then their
        // definitions.
        self.drain_hits(root);
        self.armed.clear();
        self.probe_source = None;
        if launched && exit.is_none() {
            exit = tracer.terminate(Duration::from_secs(5), |_| {})?;
        }
        // Every breakpoint is removed and an attached process let go here.
        let killed = tracer.finish();
        // In-process: the records that came in meanwhile, then the shared memory's pages freed
        // (an attached program keeps only the mappings).
        self.drain_hits(root);
        if let Some(ip) = &self.inproc {
            ip.release();
        }
        // Calls left by the process's end (exit inside a region, a crash): still calls.
        let open: Vec<u32> = self.frames.keys().copied().collect();
        for tid in open {
            self.forget_thread(tid);
        }
        if !self.missing.is_empty() {
            match exit.or(killed) {
                // A region never found: said, and the command's status is superprof's.
                Some(status) if launched => {
                    return Err(Error::NothingToShow {
                        why: self.first_missing(),
                        status,
                    })
                }
                _ => bail!("{}", self.first_missing()),
            }
        }
        let res = self.results.as_mut().expect("results");
        res.regions = self
            .specs
            .iter()
            .enumerate()
            .map(|(i, s)| {
                self.regions
                    .get(i)
                    .filter(|r| r.entry != 0)
                    .map_or_else(|| s.label(), |r| r.name.clone())
            })
            .collect();
        Ok((exit.or(killed), died_inside))
    }
}
