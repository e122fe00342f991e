//! Off-CPU time: each thread's waits, from its context-switch samples and PERF_RECORD_SWITCH
//! records in whatever order the CPUs' rings give them (a wait opens at its switch out and
//! closes at its switch back in), turned into whole sampling periods per place ([`Carry`]) and
//! named after the system call the kernel frames wait in ([`kernel_wait`]).

use super::*;

/// A wait's kind: run-queue time when its switch out was a preemption.
pub(super) fn wait_kind(preempted: bool) -> SampleKind {
    if preempted {
        SampleKind::Preempted
    } else {
        SampleKind::OffCpu
    }
}

/// How many switches back in are kept per thread for records that come late.
pub(super) const LAST_INS: usize = 8;

/// A thread off the CPU, from its context-switch sample and PERF_RECORD_SWITCH out, until its
/// switch back in.
#[derive(Debug, Clone, Copy, Default)]
pub(super) struct OpenWait {
    pub(super) since: u64,
    pub(super) cpu: u32,
    /// Its stack as it left (trie node, without the wait's frame); None when the sample was
    /// lost (the ring was full) and only the switch record came, or nothing could be unwound.
    pub(super) stack: Option<u32>,
    /// Switch-out records seen since the sample: one is this wait's; a second means the
    /// switch back in was lost, and this wait is stale.
    pub(super) outs: u8,
    pub(super) preempted: bool,
    /// The system call it waits in, where known without kernel frames.
    pub(super) syscall: Option<u64>,
    /// Records were lost while it was open: its switch back in may be among them.
    pub(super) doubtful: bool,
    /// Its switch back in, already seen (its sample came after it): it ends there.
    pub(super) until: Option<u64>,
}

impl Collector {
    /// Adds a stretch of off-CPU time of a thread: `s` gives where it waited (registers and
    /// stack as at a sample, kernel frames where recorded). Its stack ends in a frame that
    /// names the wait.
    /// `preempted_ns`: run-queue time to count where the thread is too (unwound once).
    pub fn off_cpu(&mut self, s: &SampleRecord, off: OffCpu, preempted_ns: u64) {
        self.sample_as(s, Some(off), 0, 0, preempted_ns);
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
            event: 0,
        });
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
    pub(super) fn late(&self, tid: u32, time: u64) -> Option<(u64, bool)> {
        let ins = self.last_ins.get(&tid)?;
        ins.iter().copied().find(|&(at, _)| at > time)
    }

    pub(super) fn mark_counted(&mut self, tid: u32, until: u64) {
        if let Some(i) = self.last_ins.get_mut(&tid) {
            if let Some(e) = i.iter_mut().find(|(at, _)| *at == until) {
                e.1 = true;
            }
        }
    }

    /// Closes `tid`'s wait if its switch back in was seen already (its switch out never came).
    pub(super) fn settle_late(&mut self, tid: u32) {
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
    pub(super) fn switch(&mut self, tid: u32, time: u64, out: bool, preempted: bool) {
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
    pub(super) fn close_wait(&mut self, tid: u32, time: u64) -> Option<u64> {
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
    pub(super) fn push_wait(
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
            event: 0,
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
}

/// Off-CPU time turned into whole sampling periods per place (thread, stack, kind): what is
/// short of a period is carried to the next stretch of time in the same place, so that many
/// short waits add up (a pipe ping-pong's waits are microseconds each). What a place has left
/// at the end is one period with the probability of its share of a period, as a clock would
/// have sampled it: the short waits of short threads (a thread per request, 250 µs each) add up
/// to the right time over many threads instead of none, and each of them appears as often as
/// its time allows.
pub(super) struct Carry<K> {
    period_ns: u64,
    /// Per place: nanoseconds carried, time of the last stretch.
    left: HashMap<K, (u64, u64)>,
}

impl<K: std::hash::Hash + Eq + Copy> Carry<K> {
    pub(super) fn new(period_ns: u64) -> Carry<K> {
        Carry {
            period_ns: period_ns.max(1),
            left: HashMap::new(),
        }
    }

    /// Adds `ns` at `time`: the whole periods now due, if any.
    pub(super) fn add(&mut self, key: K, ns: u64, time: u64) -> Option<u64> {
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
    pub(super) fn rest(self) -> Vec<(K, u64)> {
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
pub(super) fn kernel_wait(profile: &Profile, leaf: Option<StackId>) -> Option<String> {
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

#[cfg(test)]
mod tests {
    use super::*;

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
                    user_ips: Vec::new(),
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
