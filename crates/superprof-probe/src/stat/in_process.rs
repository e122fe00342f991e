//! The in-process engine's side of a [`Session`]: recording probes patched at each region's
//! entry and exits (or a range's start and end), and regions it cannot probe handed over.

use super::*;

impl Session {
    /// Puts recording probes on the sites placed since the last call (in-process engine), from
    /// the stopped thread `self.stopped` (none: they wait). A region the engine cannot probe
    /// goes to ptrace (see `region_to_ptrace`).
    pub(super) fn arm_in_process(&mut self, tracer: &mut Tracer, pid: u32) -> Result<()> {
        let Some(tid) = self.stopped else {
            return Ok(());
        };
        let sites = std::mem::take(&mut self.new_sites);
        let mut regions: Vec<usize> = sites.iter().map(|s| s.0).collect();
        regions.dedup();
        // Regions the engine cannot probe, for uprobes (as root) or else ptrace.
        let mut handed: Vec<(usize, String)> = Vec::new();
        if self.inproc.is_none() && !regions.is_empty() {
            match crate::inprocess::InProcess::new(pid) {
                Ok(ip) => self.inproc = Some(ip),
                Err(why) => {
                    let handed = regions.into_iter().map(|r| (r, why.clone())).collect();
                    return self.hand_over(tracer, pid, &sites, handed);
                }
            }
        }
        for r in regions {
            if self.on_ptrace.contains(&r) {
                continue;
            }
            let mine: Vec<(u64, Site)> = sites
                .iter()
                .filter(|s| s.0 == r)
                .map(|s| (s.1, s.2))
                .collect();
            let mut patched = Vec::new();
            let result = mine.iter().try_for_each(|&(at, site)| {
                self.probe_site(tracer, tid, pid, r, at, site, &mut patched)
            });
            if let Err(why) = result {
                // The region goes to ptrace: its probes come out.
                for at in patched {
                    let _ = tracer.unpatch(pid, at);
                }
                let mine: Vec<u64> = self
                    .ip_bp
                    .iter()
                    .filter(|(_, &(_, g))| g == r)
                    .map(|(&a, _)| a)
                    .collect();
                for a in mine {
                    self.ip_bp.remove(&a);
                    let _ = tracer.remove_breakpoint(pid, a);
                }
                self.instant.remove(&r);
                handed.push((r, why));
            }
        }
        self.hand_over(tracer, pid, &sites, handed)
    }

    /// Regions the in-process engine cannot probe (with why): to uprobes, which never stop
    /// the program, where this process may open them (root; new threads are then held until
    /// theirs are open), else to ptrace's breakpoints.
    pub(super) fn hand_over(
        &mut self,
        tracer: &mut Tracer,
        pid: u32,
        sites: &[(usize, u64, Site)],
        handed: Vec<(usize, String)>,
    ) -> Result<()> {
        let Some(pmu) = self.uprobe_fallback.filter(|_| self.auto_engine) else {
            for (r, why) in handed {
                self.region_to_ptrace(tracer, pid, r, &why)?;
            }
            return Ok(());
        };
        let mut mine = Vec::new();
        for (r, why) in handed {
            let name = self
                .regions
                .get(r)
                .map_or_else(|| "?".to_owned(), |g| g.name.clone());
            superprof_unwind::say!(
                "superprof: region '{name}' is probed with uprobes (the in-process engine \
                 cannot: {why})"
            );
            self.on_uprobe.insert(r);
            mine.extend(sites.iter().filter(|s| s.0 == r).copied());
        }
        if mine.is_empty() {
            return Ok(());
        }
        if !self
            .engines_used
            .iter()
            .any(|e| matches!(e, Engine::Uprobe(_)))
        {
            self.engines_used.push(Engine::Uprobe(pmu));
        }
        self.arm_uprobes(tracer, pid, mine, pmu)
    }

    /// Recording probes for one site of region `region` (in-process engine): a function's
    /// entry and exits, or a start (a range, an inlined copy), and its end. Every patch made is
    /// added to `patched` (taken out by the caller if the region cannot be probed in the end).
    #[allow(clippy::too_many_arguments)]
    pub(super) fn probe_site(
        &mut self,
        tracer: &mut Tracer,
        tid: u32,
        pid: u32,
        region: usize,
        at: u64,
        site: Site,
        patched: &mut Vec<u64>,
    ) -> Result<(), String> {
        if site.ends_at_return {
            self.probe_function(tracer, tid, pid, region, at, site, patched)?;
        } else {
            self.probe_point(tracer, tid, pid, at, Role::Entry(region, site), patched)
                .map_err(|e| format!("its start: {e}"))?;
        }
        if let Some(end) = site.end {
            // (One probe per end, whatever regions end there.)
            if self.ip_ends.insert(end) {
                let placed = self.probe_point(tracer, tid, pid, end, Role::End(end), patched);
                if let Err(e) = placed {
                    self.ip_ends.remove(&end);
                    return Err(format!("its end: {e}"));
                }
            }
        }
        Ok(())
    }

    /// A recording probe with role `role` at `addr`, an instruction anywhere in a function:
    /// the instructions from there to the end of its block move (where no jump table could
    /// land between them), else one long one must start there.
    pub(super) fn probe_point(
        &mut self,
        tracer: &mut Tracer,
        tid: u32,
        pid: u32,
        addr: u64,
        role: Role,
        patched: &mut Vec<u64>,
    ) -> Result<(), String> {
        use crate::inprocess::patch::{Recording, SpAt};
        let (code, bias) = code_at(&mut self.codes, pid, addr)?;
        let at = addr.wrapping_sub(bias);
        let f = code.function_at(at).ok_or("no function symbol holds it")?;
        if !code.is_instruction_start(at) {
            return Err(format!("{addr:#x} is not the start of an instruction"));
        }
        let blocks = code.counted_blocks(f.addr, f.addr + f.size);
        let (k, b) = blocks
            .iter()
            .enumerate()
            .find(|(_, b)| b.start <= at && at < b.end)
            .ok_or("its code does not decode")?;
        let several = at == f.addr || code.without_indirect_jumps(at);
        let from = superprof_analyze::Block {
            start: at,
            end: b.end,
            instructions: 1,
            flow: b.flow,
        };
        let next = blocks.get(k + 1).map_or(u64::MAX, |n| n.start);
        let boards = crate::inprocess::springboards(code, f.addr, f.addr + f.size, bias);
        let site = crate::inprocess::Site::of(code, &from, next, bias, several, &boards);
        let pcs = crate::inprocess::thread_pcs(tracer, pid);
        let inside = |from: u64, len: u64| pcs.iter().any(|pc| (from..from + len).contains(pc));
        let (cputime, rusage) = InProcessReading::needs(&self.events);
        let recording = Recording {
            probe: self.ip_roles.len() as u32,
            sp: SpAt::Rsp(0),
            cputime,
            rusage,
        };
        let inproc = self.inproc.as_mut().ok_or("no in-process engine")?;
        let (at, _) = inproc.probe(tracer, tid, &site, &inside, &recording, true)?;
        patched.push(at);
        self.ip_roles.push(role);
        Ok(())
    }

    /// Recording probes at the entry of the function at `at` and at each of its exits (a
    /// `ret` or a jump out, with the filler after it; else before it, recording the stack
    /// pointer the exit will have).
    ///
    /// (One function of 163 lines: the entry probe, then each exit's, placed from one decoded
    /// function: `code`, `bias`, `blocks`, `boards` and the `inside`, `rec` and `quiet_to` closures
    /// over them serve both; split, each piece would rebuild them or be passed them all.)
    #[allow(clippy::too_many_arguments)]
    pub(super) fn probe_function(
        &mut self,
        tracer: &mut Tracer,
        tid: u32,
        pid: u32,
        region: usize,
        at: u64,
        site: Site,
        patched: &mut Vec<u64>,
    ) -> Result<(), String> {
        use crate::inprocess::patch::{Host, Patcher, Recording, SpAt};
        use crate::inprocess::Site as Patched;
        let exits = function_exits(tracer, pid, at, &mut self.codes)
            .ok_or("cannot find where it returns")?;
        let (code, bias) = code_at(&mut self.codes, pid, at)?;
        let start = at.wrapping_sub(bias);
        let f = code
            .function_at(start)
            .filter(|f| f.addr == start)
            .ok_or("no function symbol starts there")?;
        let blocks = code.counted_blocks(f.addr, f.addr + f.size);
        let several = code.without_indirect_jumps(start);
        let pcs = crate::inprocess::thread_pcs(tracer, pid);
        let inside = |from: u64, len: u64| pcs.iter().any(|pc| (from..from + len).contains(pc));
        let (cputime, rusage) = InProcessReading::needs(&self.events);
        let rec = |probe: usize, sp: SpAt| Recording {
            probe: probe as u32,
            sp,
            cputime,
            rusage,
        };
        let inproc = self.inproc.as_mut().ok_or("no in-process engine")?;
        let next_of = |k: usize| blocks.get(k + 1).map_or(u64::MAX, |n| n.start);
        // The entry: its first instructions (nothing jumps into a function's first bytes).
        let b0 = blocks
            .first()
            .filter(|b| b.start == start)
            .ok_or("its code does not decode")?;
        let boards = crate::inprocess::springboards(code, f.addr, f.addr + f.size, bias);
        let entry = Patched::of(code, b0, next_of(0), bias, true, &boards);
        let b0_end = b0.end.wrapping_add(bias);
        // Whether nothing from the entry up to exit `x` (runtime address) in the entry block can
        // fault: a call that ends there may be taken as ending where it starts.
        let b0_bytes = code.bytes(b0.start, b0.end - b0.start).unwrap_or_default();
        let quiet_to = |x: u64| {
            x < b0_end
                && Host::quiet_tail(b0_bytes, b0.start, x.wrapping_sub(bias)).contains(&b0.start)
        };
        let probe = self.ip_roles.len();
        let (first, first_end) = inproc
            .probe(
                tracer,
                tid,
                &entry,
                &inside,
                &rec(probe, SpAt::Rsp(0)),
                true,
            )
            .map_err(|e| format!("its entry: {e}"))?;
        self.ip_roles.push(Role::Entry(region, site));
        patched.push(first);
        // The blocks of the function's parts placed elsewhere (f.cold), as they come.
        let mut parts: HashMap<(u64, u64), Vec<superprof_analyze::Block>> = HashMap::new();
        for (x, (plo, phi), _) in exits {
            if (first..first_end).contains(&x) {
                // The exit moved with the entry's instructions: the entry block ends in it, so
                // every call ends as it starts (where nothing between can fault: a call that
                // faults there has not ended).
                if !quiet_to(x) {
                    return Err(format!(
                        "a return at {x:#x} moved with the entry's instructions, after some that \
                         may fault"
                    ));
                }
                self.instant.insert(region);
                continue;
            }
            let ex = x.wrapping_sub(bias);
            let part = if plo == at {
                &blocks
            } else {
                parts.entry((plo, phi)).or_insert_with(|| {
                    code.counted_blocks(plo.wrapping_sub(bias), phi.wrapping_sub(bias))
                })
            };
            let next_of = |k: usize| part.get(k + 1).map_or(u64::MAX, |n| n.start);
            let (k, b) = part
                .iter()
                .enumerate()
                .find(|(_, b)| b.start <= ex && ex < b.end)
                .ok_or_else(|| format!("a return at {x:#x} is in no block"))?;
            // A part elsewhere: several instructions may move where it has no indirect jump.
            let (several, part_boards) = if plo == at {
                (several, None)
            } else {
                let (lo, hi) = (plo.wrapping_sub(bias), phi.wrapping_sub(bias));
                let direct_only = code.bytes(lo, hi - lo).is_some_and(|c| {
                    !superprof_analyze::decode_all_for(code.arch, c, lo)
                        .iter()
                        .any(|i| i.flow == superprof_analyze::Flow::IndirectJump)
                });
                (
                    direct_only,
                    Some(crate::inprocess::springboards(code, lo, hi, bias)),
                )
            };
            let boards = part_boards.as_deref().unwrap_or(&boards);
            let probe = self.ip_roles.len();
            // At the exit itself (and the filler after it), else before it where nothing in
            // between can fault (a call that faults there must not be counted as ended),
            // recording the stack pointer the exit will have. Several instructions move only
            // where no jump table could land between them.
            let bytes = code.bytes(b.start, b.end - b.start).unwrap_or_default();
            let mut placed = Err("no room for a jump".to_owned());
            for q in Host::quiet_tail(bytes, b.start, ex) {
                let Some(sp) = Host::sp_at(&bytes[(q - b.start) as usize..], q, ex) else {
                    continue;
                };
                let from = superprof_analyze::Block {
                    start: q,
                    end: b.end,
                    instructions: 1,
                    flow: b.flow,
                };
                let site = Patched::of(code, &from, next_of(k), bias, several || q == ex, boards);
                placed = inproc.probe(tracer, tid, &site, &inside, &rec(probe, sp), true);
                if placed.is_ok() {
                    break;
                }
            }
            match placed {
                Ok((at, _)) => {
                    patched.push(at);
                    self.ip_roles.push(Role::Exit(region));
                }
                // An exit that ends the entry block (straight code from the entry: no call, no
                // system call, nothing that can fault) with no room of its own (its bytes, or
                // the filler after them, taken by other probes): every call ends there as it
                // starts.
                Err(_) if plo == at && quiet_to(x) => {
                    self.instant.insert(region);
                }
                Err(e) if plo == at => return Err(format!("a return at {x:#x}: {e}")),
                // No room for a jump in a part placed elsewhere (a cold path, which the
                // compiler expects rare): a breakpoint there, which reads the thread's counters
                // from /proc when a call leaves that way (its stop is in that call's figures).
                // As root, the whole region goes to uprobes instead (no int3 where a uprobe
                // works).
                Err(e) if self.uprobe_fallback.is_some() && self.auto_engine => {
                    return Err(format!(
                        "a return at {x:#x} in a part placed elsewhere: {e}"
                    ))
                }
                Err(e) => {
                    tracer
                        .set_breakpoint(pid, x)
                        .map_err(|b| format!("a return at {x:#x}: {e}, and no breakpoint: {b}"))?;
                    self.ip_bp.insert(x, (Role::Exit(region), region));
                }
            }
        }
        Ok(())
    }
}
