//! Samples into names and a profile: each frame's address symbolized from the guest's ELF
//! files (symbols and DWARF, inlined frames), a kallsyms file for modules, else an address;
//! one sample written as a stack (`--one-shot`), or all of them as a [`Profile`] named as
//! `record`'s are ([`superprof_resolve::Namer`]).

use std::collections::HashMap;
use std::path::PathBuf;
use std::time::Duration;

use superprof_profile::{escape, Profile};

use crate::sampler::{self, Owner, RawSample, Sampler};

/// What the profile says of the run that made it.
#[derive(Debug, Clone)]
pub struct RunInfo {
    /// The command line (QEMU's, launched), or what was sampled.
    pub command: Vec<String>,
    /// The asked interval between samples, in milliseconds (0: as fast as possible).
    pub interval_ms: f64,
    /// Each frame's name with its guest address.
    pub show_addresses: bool,
    /// How long sampling took.
    pub elapsed: Duration,
}

/// What is known of one frame's code: in an ELF (the module path frames are named by, the ELF
/// address, the symbolizer's frames, outermost first), a module's function named by a kallsyms
/// file, or nothing.
#[derive(Clone)]
enum Resolved {
    Elf {
        module: String,
        svma: u64,
        found: Vec<superprof_symbols::SymFrame>,
    },
    Module(String),
    Unknown(u64),
}

impl Resolved {
    /// (name, file, line, inlined) of each frame, outermost first, named as the profile names
    /// them (`superprof_resolve`).
    fn names(&self) -> Vec<(String, Option<String>, u32, bool)> {
        match self {
            Resolved::Elf { found, .. } if found.is_empty() => {
                vec![(self.fallback(), None, 0, false)]
            }
            Resolved::Elf { found, .. } => found
                .iter()
                .map(|f| {
                    (
                        f.function.clone().unwrap_or_else(|| self.fallback()),
                        f.file.clone(),
                        f.line.unwrap_or(0),
                        f.inlined,
                    )
                })
                .collect(),
            Resolved::Module(name) => vec![(name.clone(), None, 0, false)],
            Resolved::Unknown(_) => vec![(self.fallback(), None, 0, false)],
        }
    }

    fn fallback(&self) -> String {
        match self {
            Resolved::Elf { module, svma, .. } => superprof_symbols::address_name(module, *svma),
            Resolved::Module(name) => name.clone(),
            Resolved::Unknown(addr) => {
                superprof_symbols::address_name(superprof_resolve::UNKNOWN_MODULE, *addr)
            }
        }
    }

    /// The profile frames, outermost first.
    fn frames(
        &self,
        namer: &mut superprof_resolve::Namer,
        p: &mut Profile,
        addr: u64,
    ) -> Vec<superprof_profile::FrameId> {
        match self {
            Resolved::Elf {
                module,
                svma,
                found,
            } => namer.elf_frames(p, module, *svma, found.clone()),
            Resolved::Module(name) => vec![p.intern_frame_named(
                name,
                superprof_resolve::UNKNOWN_MODULE,
                None,
                0,
                addr,
                false,
            )],
            Resolved::Unknown(addr) => vec![namer.anonymous_frame(p, None, *addr)],
        }
    }
}

/// The frames of the code at `addr` (a return address where `ret`), of `owner`'s ELF loaded
/// `bias` above its link addresses; each asked once per run (`cache`).
fn symbolize(
    sampler: &Sampler,
    symbols: &mut superprof_symbols::Symbolizer,
    cache: &mut HashMap<(u64, bool, Owner, u64), Resolved>,
    (addr, ret, owner, bias): (u64, bool, Owner, u64),
) -> Resolved {
    cache
        .entry((addr, ret, owner, bias))
        .or_insert_with(|| {
            let elf = match owner {
                Owner::Kernel => Some(&sampler.kernel),
                Owner::User(u) => sampler.users.get(u),
                Owner::Unknown => None,
            };
            let Some(elf) = elf else {
                // A module's code, named by a kallsyms file.
                let look = superprof_symbols::lookup_address(addr, ret);
                if let Some((name, Some(module))) = sampler
                    .runtime_symbols
                    .as_ref()
                    .and_then(|k| k.lookup_with_module(look))
                {
                    return Resolved::Module(format!("{name} [{module}]"));
                }
                return Resolved::Unknown(addr);
            };
            let svma = addr.wrapping_sub(bias);
            let look = superprof_symbols::lookup_address(svma, ret);
            let mut found = symbols.symbolize(&elf.path, &elf.path, look);
            if found.is_empty() && owner == Owner::Kernel {
                // A kernel ELF without symbols: a System.map or kallsyms file names it.
                if let Some(name) = sampler.kernel_symbols.as_ref().and_then(|k| k.lookup(look)) {
                    found.push(superprof_symbols::SymFrame {
                        function: Some(name.to_owned()),
                        file: None,
                        line: None,
                        inlined: false,
                    });
                }
            }
            Resolved::Elf {
                module: elf.path.to_string_lossy().into_owned(),
                svma,
                found,
            }
        })
        .clone()
}

/// The name and file of an owner's frames.
fn owner_name(sampler: &Sampler, owner: Owner) -> (String, PathBuf) {
    match owner {
        Owner::Kernel => ("kernel".to_owned(), sampler.kernel.path.clone()),
        Owner::User(u) => (sampler.users[u].name.clone(), sampler.users[u].path.clone()),
        Owner::Unknown => ("[unknown]".to_owned(), PathBuf::from("[unknown]")),
    }
}

/// A sample's root frame: whose code it is in, and for code of the lower half (programs), in
/// which address space: `prog_a [as 0x1d2c000]`, so that two processes, or two instances of
/// one program, are told apart.
fn root_name(sampler: &Sampler, s: &RawSample) -> (String, PathBuf) {
    let (name, path) = owner_name(sampler, s.owner);
    let user_half = s.frames.first().is_some_and(|f| f.0 >> 63 == 0);
    match s.space {
        Some(space) if s.owner != Owner::Kernel && user_half => {
            (format!("{name} [as {space:#x}]"), path)
        }
        _ => (name, path),
    }
}

/// One sample as a stack, innermost frame first, under the name of whose code it is in; with
/// each frame's guest address where `addresses`.
pub fn one_stack(
    sampler: &Sampler,
    symbols: &mut superprof_symbols::Symbolizer,
    s: &RawSample,
    addresses: bool,
) -> String {
    let mut cache = HashMap::new();
    let mut out = format!("{}\n", escape(&root_name(sampler, s).0));
    let mut i = 0;
    for &f in &s.frames {
        for (name, file, line, inlined) in symbolize(sampler, symbols, &mut cache, f)
            .names()
            .into_iter()
            .rev()
        {
            let at = if addresses {
                format!("{:#018x} ", f.0)
            } else {
                String::new()
            };
            let loc = match file {
                Some(file) if line > 0 => format!(" ({}:{line})", escape(&file)),
                _ => String::new(),
            };
            let name = escape(&name);
            out.push_str(&format!(
                "  #{i:<2} {at}{name}{loc}{}\n",
                if inlined { " [inlined]" } else { "" }
            ));
            i += 1;
        }
    }
    if let Some(why) = s.truncated {
        out.push_str(&format!(
            "  (the stack could not be unwound further: {})\n",
            why.as_str()
        ));
    }
    out
}

/// The samples as a profile: a thread per vCPU, each stack under its root frame (whose code
/// it is in).
pub fn build_profile(
    sampler: &Sampler,
    symbols: &mut superprof_symbols::Symbolizer,
    samples: &[RawSample],
    run: &RunInfo,
) -> Profile {
    let elapsed = run.elapsed;
    let mut p = Profile::default();
    p.meta.command = run.command.clone();
    p.meta.event = "qemu-interval".into();
    p.meta.frequency = if run.interval_ms > 0.0 {
        (1000.0 / run.interval_ms) as u32
    } else {
        0
    };
    p.meta.duration_ns = elapsed.as_nanos() as u64;
    superprof_resolve::stamp(&mut p.meta);
    p.meta.start_time_unix_ns = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos() as u64)
        .saturating_sub(elapsed.as_nanos() as u64);
    let t = truncation_meta(samples);
    p.meta.truncated_stacks = t.truncated_stacks;
    p.meta.truncated_by = t.truncated_by;
    let mut threads: HashMap<usize, u32> = HashMap::new();
    let mut cache = HashMap::new();
    let mut namer = superprof_resolve::Namer::new();
    for s in samples {
        let thread = *threads
            .entry(s.vcpu)
            .or_insert_with(|| p.add_thread(0, s.vcpu as u32 + 1, &format!("vcpu{}", s.vcpu)));
        let (root, root_module) = root_name(sampler, s);
        let root_module = root_module.to_string_lossy().into_owned();
        let rf = p.intern_frame_named(&root, &root_module, None, 0, 0, false);
        let mut stack = Some(p.intern_stack(None, rf));
        for &f in s.frames.iter().rev() {
            let resolved = symbolize(sampler, symbols, &mut cache, f);
            if !run.show_addresses {
                for fr in resolved.frames(&mut namer, &mut p, f.0) {
                    stack = Some(p.intern_stack(stack, fr));
                }
                continue;
            }
            // Each frame's name with its guest address.
            let module = match f.2 {
                Owner::Unknown => superprof_resolve::UNKNOWN_MODULE.to_owned(),
                o => owner_name(sampler, o).1.to_string_lossy().into_owned(),
            };
            for (name, file, line, inlined) in resolved.names() {
                let fr = p.intern_frame_named(
                    &format!("{name} [{:#x}]", f.0),
                    &module,
                    file.as_deref(),
                    line,
                    f.0.wrapping_sub(f.3),
                    inlined,
                );
                stack = Some(p.intern_stack(stack, fr));
            }
        }
        p.add_sample(s.time.as_nanos() as u64, thread, 0, 1, stack);
    }
    p
}

/// Truncated stacks of the samples, in all and by reason (as the profile's metadata has them).
pub fn truncation_meta(samples: &[sampler::RawSample]) -> superprof_profile::Meta {
    let mut m = superprof_profile::Meta::default();
    for why in samples.iter().filter_map(|s| s.truncated) {
        m.truncated_stacks += 1;
        *m.truncated_by.entry(why.as_str().to_owned()).or_default() += 1;
    }
    m
}
