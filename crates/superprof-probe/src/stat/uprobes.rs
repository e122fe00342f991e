//! The uprobe engine's side of a [`Session`]: its probes opened in one perf group per thread,
//! new threads armed before they run, and regions handed to ptrace where a uprobe cannot stand.

use super::*;

impl Session {
    /// Opens the uprobes of the sites placed since the last call, in one group per thread of
    /// process `pid` (threads made later get theirs at their first stop).
    pub(super) fn arm(&mut self, tracer: &mut Tracer, pid: u32) -> Result<()> {
        if matches!(self.engine, Engine::InProcess) {
            return self.arm_in_process(tracer, pid);
        }
        let Engine::Uprobe(pmu) = self.engine else {
            return Ok(());
        };
        let sites = std::mem::take(&mut self.new_sites);
        self.arm_uprobes(tracer, pid, sites, pmu)
    }

    /// Opens uprobes for `sites` (the uprobe engine's, or regions the in-process engine
    /// handed over), in one group per thread of process `pid`.
    ///
    /// (One function of 120 lines: `specs` and `roles` built in step (a probe's index is its
    /// role's) for one batch, then opened on every thread; a refusal undoes that batch and arms it
    /// again without the region, so both halves share the batch.)
    pub(super) fn arm_uprobes(
        &mut self,
        tracer: &mut Tracer,
        pid: u32,
        sites: Vec<(usize, u64, Site)>,
        pmu: superprof_sample::UprobePmu,
    ) -> Result<()> {
        let mut specs = Vec::new();
        let mut roles = Vec::new();
        let mut kept = Vec::new();
        let mut ends: HashMap<u64, ()> = HashMap::new();
        for (region, at, site) in sites {
            if self.on_ptrace.contains(&region) {
                continue;
            }
            let name = self
                .regions
                .get(region)
                .map_or("", |r| r.name.as_str())
                .to_owned();
            let spec = crate::engine::probe_at(pid, at)
                .ok_or_else(|| err!("region '{name}' is in no file: it cannot be probed"))?;
            // Its returns and tail calls, not a return probe: a uretprobe replaces the return
            // address on the stack, and a C++ exception unwinding through that frame then
            // finds no caller and terminates the program.
            let exits: Vec<u64> = if site.ends_at_return {
                match function_exits(tracer, pid, at, &mut self.codes) {
                    Some(exits) => exits.into_iter().map(|(x, _, _)| x).collect(),
                    None => {
                        let why = format!(
                            "cannot find where region '{name}' returns (no size in its symbol, \
                             or code that does not decode)"
                        );
                        self.region_to_ptrace(tracer, pid, region, &why)?;
                        continue;
                    }
                }
            } else {
                Vec::new()
            };
            // A function's entry probe on the first instruction of its entry block that the
            // kernel emulates, where only register moves come before it: a stepped hit costs
            // about 10 µs more here (docs/benchmarks.md).
            let entry_probe = if site.ends_at_return && cfg!(target_arch = "x86_64") {
                self.emulated_entry(tracer, pid, at, &exits)
            } else {
                at
            };
            let spec = if entry_probe != at {
                let mut code = [0u8; 16];
                let n = tracer.read_code(pid, entry_probe, &mut code);
                self.kinds.insert(region, EntryKind::of(&code[..n]));
                crate::engine::probe_at(pid, entry_probe).unwrap_or(spec)
            } else {
                spec
            };
            specs.push(spec);
            roles.push(Role::Entry(region, site));
            if exits.contains(&entry_probe) {
                // A function that starts with its exit (a tail jump): each entry is a call.
                self.instant.insert(region);
            }
            for x in exits.into_iter().filter(|&x| x != entry_probe) {
                let spec = crate::engine::probe_at(pid, x).ok_or_else(|| {
                    err!("the returns of region '{name}' are in no file: they cannot be probed")
                })?;
                specs.push(spec);
                roles.push(Role::Exit(region));
            }
            if let Some(end) = site.end.filter(|e| ends.insert(*e, ()).is_none()) {
                let spec = crate::engine::probe_at(pid, end).ok_or_else(|| {
                    err!("the end of region '{name}' is in no file: it cannot be probed")
                })?;
                specs.push(spec);
                roles.push(Role::End(end));
            }
            kept.push((region, at, site));
        }
        if specs.is_empty() {
            return Ok(());
        }
        let source = self
            .probe_source
            .get_or_insert_with(|| crate::engine::Probes::new(pmu));
        let probes = specs.iter().map(|s| source.event(s)).collect();
        self.batches.push(Batch {
            sites: kept,
            probes,
            roles,
        });
        let batch = self.batches.len() - 1;
        for tid in superprof_sample::list_threads(pid).unwrap_or_else(|_| vec![pid]) {
            if let Err(e) = self.arm_thread(batch, tid) {
                let refused = e.probe.filter(|_| e.unsupported_instruction());
                let Some(probe) = refused else {
                    bail!("cannot open the uprobes of the regions on thread {tid}: {e}");
                };
                // That region goes on with ptrace; the others of the batch are armed again
                // without it.
                let what = self.probe_label(batch, probe);
                let regions = self.regions_of_probe(batch, probe);
                self.drain_hits(pid);
                self.armed.retain(|a| a.batch != batch);
                let b = &mut self.batches[batch];
                b.probes.clear();
                b.roles.clear();
                let sites = std::mem::take(&mut b.sites);
                let why = format!(
                    "the kernel cannot put a uprobe on {what} (on x86, an instruction with a \
                     lock prefix, say)"
                );
                for r in regions {
                    self.on_uprobe.remove(&r);
                    self.region_to_ptrace(tracer, pid, r, &why)?;
                }
                return self.arm_uprobes(tracer, pid, sites, pmu);
            }
        }
        Ok(())
    }

    /// The regions probe `probe` of batch `batch` serves.
    pub(super) fn regions_of_probe(&self, batch: usize, probe: usize) -> Vec<usize> {
        let b = &self.batches[batch];
        match b.roles.get(probe) {
            Some(Role::Entry(r, _)) | Some(Role::Exit(r)) => vec![*r],
            Some(Role::End(addr)) => b
                .sites
                .iter()
                .filter(|(_, _, site)| site.end == Some(*addr))
                .map(|(r, _, _)| *r)
                .collect(),
            None => Vec::new(),
        }
    }

    /// Region `region` is counted with ptrace's breakpoints from now on, the others staying
    /// on uprobes (`why`: what uprobes cannot do there). With `--engine uprobe`, an error.
    pub(super) fn region_to_ptrace(
        &mut self,
        tracer: &mut Tracer,
        pid: u32,
        region: usize,
        why: &str,
    ) -> Result<()> {
        if !self.auto_engine {
            bail!("{why}: use --engine ptrace");
        }
        let name = self
            .regions
            .get(region)
            .map_or_else(|| "?".to_owned(), |r| r.name.clone());
        superprof_unwind::say!(
            "superprof: region '{name}' is probed with ptrace (the program stops at each of its \
             probes): {why}"
        );
        self.on_ptrace.insert(region);
        if !self
            .engines_used
            .iter()
            .any(|e| matches!(e, Engine::Ptrace))
        {
            self.engines_used.push(Engine::Ptrace);
        }
        for tid in superprof_sample::list_threads(pid).unwrap_or_else(|_| vec![pid]) {
            self.open_counters(tid);
        }
        let entries: Vec<u64> = self
            .entries
            .iter()
            .filter(|(_, sites)| sites.iter().any(|(r, _)| *r == region))
            .map(|(&at, _)| at)
            .collect();
        for at in entries {
            tracer
                .set_breakpoint(pid, at)
                .with_context(|| format!("cannot place a breakpoint for region '{name}'"))?;
        }
        Ok(())
    }

    /// Whether region `region`'s calls are counted with ptrace's breakpoints.
    pub(super) fn by_ptrace(&self, region: usize) -> bool {
        matches!(self.engine, Engine::Ptrace) || self.on_ptrace.contains(&region)
    }

    /// What probe `probe` of batch `batch` is on, for a message.
    pub(super) fn probe_label(&self, batch: usize, probe: usize) -> String {
        let region = |r: usize| self.regions.get(r).map_or("?", |r| r.name.as_str());
        match self.batches[batch].roles.get(probe) {
            Some(Role::Entry(r, _)) => format!("the first instruction of region '{}'", region(*r)),
            Some(Role::Exit(r)) => format!("a return of region '{}'", region(*r)),
            Some(Role::End(addr)) => format!("the end of a region, at {addr:#x}"),
            None => "a region".to_owned(),
        }
    }

    /// Opens batch `batch`'s group on thread `tid` (a thread already gone is passed over).
    pub(super) fn arm_thread(
        &mut self,
        batch: usize,
        tid: u32,
    ) -> Result<(), superprof_sample::ProbeError> {
        if self.batches[batch].probes.is_empty() {
            return Ok(());
        }
        // 4 MiB of ring for each of the first 16 threads (about 40,000 hits, read every
        // 10 ms), less past them.
        let pages = match self.armed.len() {
            0..16 => 1024,
            16..256 => 128,
            _ => 16,
        };
        let events = self.all_events();
        match superprof_sample::ProbeGroup::open(
            tid,
            &self.batches[batch].probes,
            &events,
            self.user_only,
            pages,
        ) {
            Ok(group) => self.armed.push(Armed { batch, tid, group }),
            Err(e) if e.no_thread() => {}
            Err(e) => return Err(e),
        }
        Ok(())
    }

    /// A new thread: every batch's probes on it too, before it runs.
    pub(super) fn arm_new_thread(&mut self, tid: u32) -> Result<()> {
        for batch in 0..self.batches.len() {
            if self.armed.iter().any(|a| a.batch == batch && a.tid == tid) {
                continue; // armed at its NewThread already
            }
            self.arm_thread(batch, tid).with_context(|| {
                format!("cannot open the uprobes of the regions on thread {tid}")
            })?;
        }
        Ok(())
    }

    /// A thread ended: its last hits read, its groups closed.
    pub(super) fn disarm_thread(&mut self, root: u32, tid: u32) {
        self.drain_hits(root);
        self.armed.retain(|a| a.tid != tid);
    }

    /// Every event, in order (the uprobe engine counts them all in one group).
    pub(super) fn all_events(&self) -> Vec<EventSpec> {
        self.events.clone()
    }
}
