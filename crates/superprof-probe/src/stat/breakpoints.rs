//! The ptrace engine: breakpoints at entries and return addresses, and tail calls.

use super::*;

impl Session {
    /// (One function of 133 lines: one breakpoint stop: the calls that end there closed first, then
    /// those that begin there opened, both on the thread's frames and the return breakpoints'
    /// counts, in that order (a thread may leave one region and enter another at once).)
    pub(super) fn on_breakpoint(&mut self, tracer: &mut Tracer, tid: u32, pid: u32, addr: u64) {
        if let Some(&(role, region)) = self.ip_bp.get(&addr) {
            if !self.on_ptrace.contains(&region) {
                // The ring's records first: this thread's entry is among them.
                self.drain_hits(pid);
                if let Some(hit) = self.hit_from_proc(tracer, tid, pid) {
                    self.on_hit(role, &hit);
                }
            }
        }
        // A return (or range end) first: a thread leaving one region may enter another at once.
        // Every frame that ends here ends (a function that tail-jumps into another region
        // returns with it, to the same address).
        if self.returns.contains_key(&addr) {
            let sp = tracer.regs(tid).map(|r| r.sp).unwrap_or(0);
            let end = self.read(tid);
            loop {
                let frames = self.frames.entry(tid).or_default();
                let Some(pos) = frames.iter().rposition(|f| {
                    f.exits
                        .iter()
                        .any(|&(a, is_return)| a == addr && (!is_return || popped(sp, f.sp)))
                        || (sp == f.sp && f.tails.contains(&addr))
                }) else {
                    break;
                };
                let frame = frames.remove(pos);
                let elapsed = frame.started.elapsed().as_nanos() as f64;
                self.record(tid, &frame, &end, elapsed);
                for &(exit, _) in &frame.exits {
                    self.release_exit(tracer, pid, exit);
                }
                for &tail in &frame.tails {
                    self.release_exit(tracer, pid, tail);
                }
            }
        }
        let mut sites = self.entries.get(&addr).cloned().unwrap_or_default();
        sites.retain(|(r, _)| self.by_ptrace(*r));
        for (region, site) in sites {
            let Ok(regs) = tracer.regs(tid) else { return };
            // Inside already: recursion (the outermost call counts), unless it is entered
            // again at the same depth or above, which means the open call was left without a
            // return (an exception, a longjmp, an inlined copy left by a path that skips its
            // end): that one still counts, with its events up to now, as on the other engines.
            let open = self
                .frames
                .get(&tid)
                .and_then(|f| f.iter().position(|f| f.region == region));
            if let Some(p) = open {
                let frame = &self.frames[&tid][p];
                if !site.ends_at_return {
                    continue;
                }
                if regs.sp < frame.sp {
                    // Deeper: a recursive call, if the open one is still on the stack. On
                    // x86_64 its return address is at its entry's stack pointer for as long
                    // as it runs; gone or overwritten, it was left (an exception, a longjmp)
                    // and this call is an outermost one. (AArch64 keeps it in a register.)
                    // (Still there, it may also be a later call's from the same call site,
                    // one whose callee tail-jumped here: then uncertain, as on the others.)
                    let ret = frame.exits.iter().find(|e| e.1).map(|e| e.0);
                    let gone = match ret {
                        Some(ret) if cfg!(target_arch = "x86_64") => {
                            let mut buf = [0u8; 8];
                            tracer.read_memory(pid, frame.sp, &mut buf) == 8
                                && u64::from_ne_bytes(buf) != ret
                        }
                        _ => false,
                    };
                    if !gone {
                        self.frames.get_mut(&tid).expect("open")[p].nested += 1;
                        continue;
                    }
                }
                let frame = self.frames.get_mut(&tid).expect("open").remove(p);
                self.results.as_mut().expect("results").uncertain[frame.region] += frame.nested;
                for &(exit, _) in &frame.exits {
                    self.release_exit(tracer, pid, exit);
                }
                for &tail in &frame.tails {
                    self.release_exit(tracer, pid, tail);
                }
                let now = self.read(tid);
                let elapsed = frame.started.elapsed().as_nanos() as f64;
                self.record(tid, &frame, &now, elapsed);
            }
            let mut exits = Vec::new();
            if let Some(end) = site.end {
                exits.push((end, false));
            }
            if site.ends_at_return {
                let ret = return_address(tracer, pid, &regs);
                if ret != 0 {
                    exits.push((ret, true));
                }
            }
            if exits.is_empty() {
                continue;
            }
            self.open_counters(tid);
            let start = self.read(tid);
            let mut placed = Vec::new();
            for (exit, is_return) in exits {
                if tracer.set_breakpoint(pid, exit).is_ok() {
                    *self.returns.entry(exit).or_default() += 1;
                    placed.push((exit, is_return));
                }
            }
            // A function's tail calls end its calls too, as on the other engines.
            let mut tails = Vec::new();
            if site.ends_at_return && placed.iter().any(|p| p.1) {
                for t in self.tail_calls(tracer, pid, addr) {
                    if tracer.set_breakpoint(pid, t).is_ok() {
                        *self.returns.entry(t).or_default() += 1;
                        tails.push(t);
                    }
                }
            }
            if !placed.is_empty() {
                self.frames.entry(tid).or_default().push(Frame {
                    region,
                    exits: placed,
                    sp: regs.sp,
                    start,
                    started: Instant::now(),
                    start_ns: 0,
                    nested: 0,
                    tails,
                });
            }
        }
    }

    /// The tail calls of the function that starts at `at` (ptrace engine; found once).
    pub(super) fn tail_calls(&mut self, tracer: &Tracer, pid: u32, at: u64) -> Vec<u64> {
        if let Some(t) = self.tails.get(&at) {
            return t.clone();
        }
        let t: Vec<u64> = function_exits(tracer, pid, at, &mut self.codes)
            .unwrap_or_default()
            .into_iter()
            .filter(|&(_, _, is_return)| !is_return)
            .map(|(x, _, _)| x)
            .collect();
        self.tails.insert(at, t.clone());
        t
    }

    /// One frame less waits at `exit`; the last one out removes the breakpoint (unless a region
    /// starts there).
    pub(super) fn release_exit(&mut self, tracer: &mut Tracer, pid: u32, exit: u64) {
        let Some(n) = self.returns.get_mut(&exit) else {
            return;
        };
        *n = n.saturating_sub(1);
        if *n == 0 {
            self.returns.remove(&exit);
            if !self.entries.contains_key(&exit) {
                let _ = tracer.remove_breakpoint(pid, exit);
            }
        }
    }
}
