//! Placing the regions in a process: each spec found (or kept pending until its library is
//! loaded), its entry and exits, where a uprobe may stand; forgotten when exec replaces the
//! image.

use super::*;

impl Session {
    pub(super) fn first_missing(&self) -> String {
        let mut keys: Vec<&usize> = self.missing.keys().collect();
        keys.sort();
        keys.first().map_or_else(
            || "a region was not found".to_owned(),
            |k| self.missing[k].clone(),
        )
    }

    /// Places the regions in process `pid`. Functions not found yet (in a library ld.so has not
    /// loaded) stay pending: Ok(false).
    /// With `explain`, a region not found gets its error message (with near names) kept in
    /// `missing`, for when it is still not found at the end.
    /// Proves every address where `region` would get a probe (its sites' starts and ends, and
    /// a function's symbol against its call-frame information) before any probe goes in: a
    /// probe inside an instruction or in data corrupts the program (issue 31).
    pub(super) fn prove(
        &mut self,
        pid: u32,
        region: &Region,
        function: Option<&superprof_symbols::FunctionAddress>,
    ) -> Result<()> {
        if crate::engine::is_calibration_region(&region.name) {
            return Ok(()); // superprof's own code, which it wrote
        }
        let refuse = |why: String| err!("region '{}': {why}; nothing was probed", region.name);
        for &(at, site) in &region.sites {
            let (code, bias) =
                code_at(&mut self.codes, pid, at).map_err(|e| refuse(format!("{at:#x}: {e}")))?;
            code.prove_instruction_start(at.wrapping_sub(bias))
                .map_err(refuse)?;
            if let Some(end) = site.end {
                code.prove_region_end(end.wrapping_sub(bias))
                    .map_err(refuse)?;
            }
        }
        if let Some(f) = function.filter(|f| f.size > 0) {
            let (code, bias) = code_at(&mut self.codes, pid, f.addr)
                .map_err(|e| refuse(format!("{:#x}: {e}", f.addr)))?;
            code.prove_function(f.addr.wrapping_sub(bias), f.size, &f.name)
                .map_err(refuse)?;
        }
        Ok(())
    }

    /// (One function of 113 lines: one pass over the region specs, each found
    /// ([`crate::region::find`]) and turned into a Region (a function with its inlined copies),
    /// then the one code that proves and places it.)
    pub(super) fn place(&mut self, tracer: &mut Tracer, pid: u32, explain: bool) -> Result<bool> {
        let mut all = true;
        for (i, spec) in self.specs.clone().iter().enumerate() {
            if self.regions.len() > i && self.regions[i].entry != 0 {
                continue;
            }
            let found = crate::region::find(pid, spec, &mut self.symbols, self.libraries_mapped)?;
            let function = found.as_ref().and_then(|f| f.function.clone());
            let region = match (spec, found) {
                (RegionSpec::Function(name), found) => {
                    let mut sites: Vec<(u64, Site)> = found
                        .as_ref()
                        .map(|f| {
                            let site = Site {
                                end: None,
                                ends_at_return: true,
                            };
                            vec![(f.lo, site)]
                        })
                        .unwrap_or_default();
                    // Its inlined copies are sites of the same region (the calibration
                    // region has none: superprof's own DWARF is not searched for them).
                    let target = found.as_ref().map_or(name.as_str(), |f| f.name.as_str());
                    let inlined = if crate::engine::is_calibration_region(target) {
                        Vec::new()
                    } else {
                        inlined_sites(
                            &mut self.symbols,
                            pid,
                            target,
                            function.as_ref().map(|f| &f.module),
                        )
                    };
                    for (start, end) in inlined {
                        let site = Site {
                            end: Some(end),
                            ends_at_return: false,
                        };
                        sites.push((start, site));
                    }
                    match sites.first() {
                        Some(&(entry, _)) => Region {
                            name: target.to_owned(),
                            entry,
                            sites,
                        },
                        None => {
                            all = false;
                            if explain {
                                self.missing.insert(i, not_found(pid, name));
                            }
                            Region {
                                name: name.clone(),
                                entry: 0,
                                sites: Vec::new(),
                            }
                        }
                    }
                }
                // Source lines or an address range: one site, from its start to its end.
                (_, Some(f)) => {
                    let site = Site {
                        end: Some(f.hi),
                        ends_at_return: superprof_symbols::function_at(pid, f.lo)?.is_some(),
                    };
                    Region {
                        name: f.name,
                        entry: f.lo,
                        sites: vec![(f.lo, site)],
                    }
                }
                (_, None) if explain => return Err(crate::region::no_code(spec)),
                (_, None) => {
                    all = false;
                    Region {
                        name: spec.label(),
                        entry: 0,
                        sites: Vec::new(),
                    }
                }
            };
            if region.entry != 0 {
                self.prove(pid, &region, function.as_ref())?;
                self.missing.remove(&i);
                let mut code = [0u8; 16];
                let n = tracer.read_code(pid, region.entry, &mut code);
                self.kinds.insert(i, EntryKind::of(&code[..n]));
                for &(at, site) in &region.sites {
                    match self.engine {
                        _ if self.on_ptrace.contains(&i) => {
                            tracer.set_breakpoint(pid, at).with_context(|| {
                                format!("cannot place a breakpoint for region '{}'", region.name)
                            })?;
                        }
                        Engine::Ptrace => {
                            tracer.set_breakpoint(pid, at).with_context(|| {
                                format!("cannot place a breakpoint for region '{}'", region.name)
                            })?;
                        }
                        Engine::Uprobe(_) | Engine::InProcess => self.new_sites.push((i, at, site)),
                    }
                    self.entries.entry(at).or_default().push((i, site));
                }
            }
            if self.regions.len() > i {
                self.regions[i] = region;
            } else {
                self.regions.push(region);
            }
        }
        self.arm(tracer, pid)?;
        Ok(all)
    }

    /// Where the uprobe of the function entered at `at` may stand (x86_64): the first
    /// instruction the kernel emulates among those [`superprof_analyze::patch::x86_64::quiet_head`]
    /// allows (only register moves before it: every call passes it with the entry's stack
    /// pointer), where no direct branch of the file lands between; else `at`.
    /// Never onto one of its `exits` (a function that is a register move and a tail jump).
    /// A function whose first instruction is lock-prefixed (which uprobes refuse: a function
    /// counting its own calls in a global) has its probe on the first allowed instruction
    /// after it, whatever its kind.
    pub(super) fn emulated_entry(
        &mut self,
        tracer: &Tracer,
        pid: u32,
        at: u64,
        exits: &[u64],
    ) -> u64 {
        let mut code = [0u8; 96];
        let n = tracer.read_code(pid, at, &mut code);
        let Ok((elf, bias)) = code_at(&mut self.codes, pid, at) else {
            return at;
        };
        let locked = superprof_analyze::patch::x86_64::has_lock_prefix(&code[..n], at);
        let mut past_lock = None;
        for q in superprof_analyze::patch::x86_64::quiet_head(&code[..n], at, 8) {
            let off = (q - at) as usize;
            if off + 15 > n {
                break;
            }
            if q > at
                && (exits.contains(&q)
                    || elf.targeted(at.wrapping_sub(bias) + 1, q.wrapping_sub(bias) + 1))
            {
                break;
            }
            if EntryKind::of(&code[off..n]) == EntryKind::Emulated {
                return q;
            }
            if locked && q > at && past_lock.is_none() {
                past_lock = Some(q);
            }
        }
        past_lock.unwrap_or(at)
    }

    /// Forgets every region placed in an image that exec replaced (the calls counted stay).
    pub(super) fn forget_placements(&mut self) {
        self.regions.clear();
        self.entries.clear();
        self.returns.clear();
        self.frames.clear();
        self.tails.clear();
        self.new_sites.clear();
        self.kinds.clear();
        self.missing.clear();
        self.on_ptrace.clear();
        self.on_uprobe.clear();
        self.exited.clear();
        self.instant.clear();
        self.armed.clear();
        self.batches.clear();
        self.inproc = None;
        self.ip_roles.clear();
        self.ip_ends.clear();
        self.ip_bp.clear();
    }
}
