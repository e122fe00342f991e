//! `sample`: the perf sampler's instruction pointers attributed to decoded blocks. No
//! breakpoints: the program runs at sampling cost, and the blocks come from decoding the ELF
//! files afterwards, so regions are found in the files themselves.

use std::collections::{BTreeSet, HashMap};
use std::path::{Path, PathBuf};

use crate::{bail, err, Context, Result};
use superprof_sample::SamplerConfig;
use superprof_symbols::MappedFile;
use superprof_trace::ExitStatus;

use super::{rows, ElfCode, Placed, Report};
use super::{BlocksConfig, Mode};
use crate::region::{line_range_in, RegionSpec};
use superprof_record::{RecordConfig, SamplerKind, Target};

fn file(path: &Path) -> MappedFile {
    MappedFile {
        path: path.to_owned(),
        open_path: path.to_owned(),
        bias: 0,
    }
}

/// Places a region in the ELF files the samples came from (ELF addresses: bias 0).
fn place_static(
    spec: &RegionSpec,
    exe: &Path,
    modules: &[PathBuf],
    codes: &mut HashMap<PathBuf, Option<ElfCode>>,
    symbols: &mut superprof_symbols::Symbolizer,
) -> Result<Placed> {
    match spec {
        RegionSpec::Function(name) => {
            let mut exact = Vec::new();
            let mut partial = Vec::new();
            for m in std::iter::once(exe).chain(modules.iter().map(PathBuf::as_path)) {
                let Some(code) = codes
                    .entry(m.to_owned())
                    .or_insert_with(|| ElfCode::open(m))
                    .as_ref()
                else {
                    continue;
                };
                for f in &code.functions {
                    if f.name == *name {
                        exact.push((m.to_owned(), f.clone()));
                    } else if f.name.contains(name.as_str()) {
                        partial.push((m.to_owned(), f.clone()));
                    }
                }
            }
            let found = if exact.is_empty() { partial } else { exact };
            let names: BTreeSet<&str> = found.iter().map(|(_, f)| f.name.as_str()).collect();
            if names.len() > 1 {
                let names: Vec<&str> = names.into_iter().take(10).collect();
                bail!(
                    "region '{name}' is ambiguous: it matches {}",
                    names.join(", ")
                );
            }
            let (m, f) = found.into_iter().next().ok_or_else(|| {
                err!("no function '{name}' in the program or the libraries it ran code of")
            })?;
            Ok(Placed {
                name: f.name.clone(),
                lo: f.addr,
                hi: f.addr + f.size,
                file: file(&m),
            })
        }
        RegionSpec::Range(a, b) => Ok(Placed {
            name: spec.label(),
            lo: *a,
            hi: *b,
            file: file(exe),
        }),
        RegionSpec::Lines(f1, l1, f2, l2) => {
            for m in std::iter::once(exe).chain(modules.iter().map(PathBuf::as_path)) {
                if let Some((lo, hi)) = line_range_in(symbols, m, m, (f1, *l1), (f2, *l2)) {
                    return Ok(Placed {
                        name: spec.label(),
                        lo,
                        hi,
                        file: file(m),
                    });
                }
            }
            bail!(
                "no code for {} (is the program built with -g, and is the file name right?)",
                spec.label()
            )
        }
    }
}

/// (One function of 135 lines: one pass from the recording to the report: the samples' leaf
/// addresses, the regions placed, then the samples counted per block; `ips`, `codes`, `symbols` and
/// `claimed` pass from step to step, and the config and report literals are a third of it.)
pub fn run(args: &BlocksConfig, specs: &[RegionSpec]) -> Result<(Report, Option<ExitStatus>)> {
    let (target, exe) = match &args.target {
        &Target::Pid(pid) => (
            Target::Pid(pid),
            std::fs::read_link(format!("/proc/{pid}/exe"))
                .with_context(|| format!("no process with pid {pid}"))?,
        ),
        Target::Command(command) => {
            let cmd = command
                .first()
                .ok_or_else(|| err!("no command given after --"))?;
            let exe = superprof_trace::resolve_command(cmd)
                .ok_or_else(|| superprof_trace::CannotRun::not_found(cmd))?;
            (Target::Command(command.clone()), exe)
        }
        Target::Thread(_) | Target::System { .. } => {
            return Err(err!(
                "blocks follows a command or a process (-p), not a thread or the machine"
            ))
        }
    };
    let exe = std::fs::canonicalize(&exe).unwrap_or(exe);
    if args.frequency == 0 {
        bail!("frequency must be at least 1 Hz");
    }
    let cfg = RecordConfig {
        sampler: SamplerConfig {
            frequency: args.frequency,
            // Only the instruction pointer matters: the smallest stack copy.
            stack_size: 512,
            ..SamplerConfig::default()
        },
        sampler_kind: SamplerKind::Perf,
        duration: args.duration,
        stop: args.stop,
        ..RecordConfig::new(target, SamplerConfig::default())
    };
    let recorded = superprof_record::record(&cfg)?;
    let profile = &recorded.profile;
    // The instruction pointer of each sample: its innermost user-space frame.
    let mut ips: HashMap<(PathBuf, u64), u64> = HashMap::new();
    let mut elsewhere = 0u64;
    for s in &profile.samples {
        let leaf = s
            .stack
            .and_then(|st| profile.stack_frames(Some(st)).next())
            .map(|f| profile.frame(f));
        match leaf {
            Some(f) if !profile.str(f.module).starts_with('[') => {
                *ips.entry((PathBuf::from(profile.str(f.module)), f.address))
                    .or_default() += s.weight.max(1);
            }
            _ => elsewhere += s.weight.max(1),
        }
    }
    let mut modules: Vec<PathBuf> = ips.keys().map(|(m, _)| m.clone()).collect();
    modules.sort();
    modules.dedup();
    let mut codes: HashMap<PathBuf, Option<ElfCode>> = HashMap::new();
    let mut symbols = superprof_symbols::Symbolizer::default();
    let regions: Vec<Placed> = if specs.is_empty() {
        let code = ElfCode::open(&exe).ok_or_else(|| err!("cannot read {}", exe.display()))?;
        let lo = code.functions.iter().map(|f| f.addr).min().unwrap_or(0);
        let hi = code
            .functions
            .iter()
            .map(|f| f.addr + f.size)
            .max()
            .unwrap_or(0);
        codes.insert(exe.clone(), Some(code));
        vec![Placed {
            name: exe
                .file_name()
                .map_or_else(String::new, |n| n.to_string_lossy().into_owned()),
            lo,
            hi,
            file: file(&exe),
        }]
    } else {
        specs
            .iter()
            .map(|s| place_static(s, &exe, &modules, &mut codes, &mut symbols))
            .collect::<Result<_>>()?
    };
    let mut blocks = Vec::new();
    let mut inside = 0u64;
    let mut claimed: std::collections::HashSet<(&PathBuf, u64)> = Default::default();
    for region in &regions {
        let path = &region.file.path;
        let Some(code) = codes
            .entry(path.clone())
            .or_insert_with(|| ElfCode::open(path))
            .as_ref()
        else {
            continue;
        };
        let list = code.static_blocks(region.lo, region.hi);
        let mut counts = vec![0u64; list.len()];
        for ((m, addr), n) in &ips {
            if m != path || !(region.lo..region.hi).contains(addr) || !claimed.insert((m, *addr)) {
                continue; // another module, outside, or counted with an earlier region
            }
            let i = list.partition_point(|b| b.start <= *addr);
            if let Some(k) = i.checked_sub(1).filter(|&k| *addr < list[k].end) {
                counts[k] += n;
                inside += n;
            }
        }
        let items = list
            .iter()
            .zip(&counts)
            .filter(|(_, &n)| n > 0)
            .map(|(b, &n)| (b.start, b.end, b.instructions, n, None));
        blocks.extend(rows(region, code, &mut symbols, items));
    }
    let total: u64 = ips.values().sum::<u64>() + elsewhere;
    Ok((
        Report {
            mode: Mode::Sample,
            analyzer: None,
            regions,
            blocks,
            engine: None,
            stops: 0,
            emulated: 0,
            samples_elsewhere: total.saturating_sub(inside),
            patched: 0,
            uprobe_blocks: 0,
            breakpoint_blocks: 0,
        },
        recorded.exit,
    ))
}
