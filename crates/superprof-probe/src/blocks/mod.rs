//! Which basic blocks run most (`superprof blocks`).
//!
//! Three modes ([`Mode`]) share the region handling and the output:
//! - `count` (trace.rs): exact executions of every block of a region. In-process (the default
//!   on x86_64 and AArch64), a jump to a counting trampoline replaces each block's start
//!   (inprocess.rs); on uprobes, a counting uprobe sits on each. On ptrace,
//!   breakpoints sit at the entry of the region and at the last instruction of each block
//!   execution reaches; a thread that stops at a block's end is single-stepped, and where its
//!   pc lands starts the next block. The dynamic code analyzer (decode or learn) says where
//!   each block ends.
//! - `coverage` (trace.rs): a one-shot breakpoint at the start of every block, removed at
//!   its first hit.
//! - `sample` (sample.rs): the perf sampler's instruction pointers, attributed to the
//!   statically decoded blocks that contain them.

mod count;
mod output;
mod precise;
mod sample;
mod trace;

use std::path::PathBuf;
use std::time::Duration;

use crate::{bail, err, Context, Result};
use superprof_analyze::AnalyzerStats;
use superprof_symbols::MappedFile;
use superprof_trace::ExitStatus;

pub use superprof_analyze::ElfCode;

use crate::region::RegionSpec;
use crate::EngineKind;
use superprof_record::Target;

pub use output::render;
pub use precise::Precise;

/// What `blocks` measures.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mode {
    /// Exact executions of every block of the regions.
    Count,
    /// Which blocks ran at all.
    Coverage,
    /// Samples of the instruction pointer, attributed to the blocks that hold them.
    Sample,
}

/// How the ptrace engine learns where a block ends.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AnalyzerKind {
    /// From the decoded instructions (exact).
    Decode,
    /// By trying instructions out in a lab.
    Learn,
}

/// A `blocks` run.
#[derive(Debug, Clone)]
pub struct BlocksConfig {
    /// Regions as the user writes them (see [`RegionSpec::parse`]); none: the whole
    /// executable (coverage, sample).
    pub regions: Vec<String>,
    /// Count, coverage or sample.
    pub mode: Mode,
    /// How the ptrace engine learns where blocks end.
    pub analyzer: AnalyzerKind,
    /// Single-step every block end (ptrace) instead of working branches out.
    pub step_branches: bool,
    /// The engine asked for (none: in-process where built, else ptrace).
    pub engine: Option<EngineKind>,
    /// Sample mode's sampling rate.
    pub frequency: u32,
    /// How long to run (none: until the target ends or `stop`).
    pub duration: Option<Duration>,
    /// The process attached to, or the command launched.
    pub target: Target,
    /// Whether the caller was asked to stop (Ctrl-C, SIGTERM): checked while running.
    pub stop: fn() -> bool,
}

/// A region placed in the process: runtime addresses [lo, hi) in `file`.
#[derive(Debug, Clone)]
pub struct Placed {
    /// The region's name (a function's own, else the spec's label).
    pub name: String,
    /// Its first address.
    pub lo: u64,
    /// The address after its last byte.
    pub hi: u64,
    /// The file that maps it, with its load bias.
    pub file: MappedFile,
}

impl Placed {
    /// Where to read the region's file now: through /proc/PID/root while the process lives,
    /// else by its own path.
    pub fn readable_path(&self) -> &std::path::Path {
        if self.file.open_path.exists() {
            &self.file.open_path
        } else {
            &self.file.path
        }
    }
}

/// One block of the results, in the ELF file's own addresses.
#[derive(Debug, Clone)]
pub struct BlockRow {
    /// The block's first address.
    pub start: u64,
    /// The address after its last instruction.
    pub end: u64,
    /// The ELF file it is in.
    pub module: PathBuf,
    /// The function it is in, where the symbols say.
    pub function: Option<String>,
    /// Its first instruction's source file and line, where the DWARF says.
    pub file: Option<String>,
    /// (See `file`.)
    pub line: Option<u32>,
    /// Instructions in the block.
    pub instructions: u32,
    /// Executions (count), samples (sample), 1 or 0 (coverage).
    pub count: u64,
    /// Coverage: whether it ran.
    pub hit: Option<bool>,
}

/// Everything `blocks` prints.
pub struct Report {
    /// What was measured.
    pub mode: Mode,
    /// The analyzer count mode used on ptrace, and what it did.
    pub analyzer: Option<(&'static str, AnalyzerStats)>,
    /// The regions, placed.
    pub regions: Vec<Placed>,
    /// Hottest first.
    pub blocks: Vec<BlockRow>,
    /// The probe engine of count and coverage (uprobe, ptrace).
    pub engine: Option<&'static str>,
    /// Breakpoint stops and single steps taken (count and coverage).
    pub stops: u64,
    /// Count: block ends whose branch was worked out from the registers instead of stepped.
    pub emulated: u64,
    /// Sample mode: samples outside the regions (other modules, the kernel).
    pub samples_elsewhere: u64,
    /// In-process engine: blocks counted by a patch, and, not patchable, by a uprobe (as
    /// root) or else by a breakpoint.
    pub patched: usize,
    /// (See `patched`.)
    pub uprobe_blocks: usize,
    /// (See `patched`.)
    pub breakpoint_blocks: usize,
}

/// Runs the target with `args`' regions counted, covered or sampled; the blocks hottest
/// first, and the launched command's status.
pub fn measure(args: &BlocksConfig) -> Result<(Report, Option<ExitStatus>)> {
    let specs: Vec<RegionSpec> = args
        .regions
        .iter()
        .map(|r| RegionSpec::parse(r))
        .collect::<Result<_>>()?;
    if specs.is_empty() && args.mode == Mode::Count {
        bail!("--mode count needs a region: give one with -r FUNCTION, -r 0xSTART-0xEND or -r FILE:LINE-LINE");
    }
    let (mut report, exit) = match args.mode {
        Mode::Count | Mode::Coverage => trace::run(args, &specs)?,
        Mode::Sample => sample::run(args, &specs)?,
    };
    report
        .blocks
        .sort_by(|a, b| b.count.cmp(&a.count).then(a.start.cmp(&b.start)));
    if let Some((_, s)) = report.analyzer.as_ref().filter(|(_, s)| s.mispredicted > 0) {
        superprof_unwind::say!(
            "superprof: {} block runs left the path the learner predicted (an instruction it \
             took for straight code branched): the counts of their blocks may be off by up to \
             that many; --analyzer decode is exact",
            s.mispredicted
        );
    }
    Ok((report, exit))
}

/// The mapped file that holds runtime address `addr`.
pub(crate) fn file_at(pid: u32, addr: u64) -> Option<MappedFile> {
    let maps = superprof_unwind::maps::executable_mappings(pid).ok()?;
    let m = maps.iter().find(|m| (m.start..m.end).contains(&addr))?;
    superprof_symbols::mapped_files(pid)
        .ok()?
        .into_iter()
        .find(|f| f.path == m.path)
}

/// The main executable as mapped by `pid`.
fn exe_file(pid: u32) -> Result<MappedFile> {
    let exe = std::fs::read_link(format!("/proc/{pid}/exe"))
        .with_context(|| format!("cannot read the executable of pid {pid}"))?;
    superprof_symbols::mapped_files(pid)?
        .into_iter()
        .find(|f| f.path == exe)
        .ok_or_else(|| err!("cannot find the executable's load address"))
}

/// Places region `spec` in `pid` ([`crate::region::find`]), with the file that maps it.
/// Ok(None): a function not found (yet). `substrings`: a function name may match a substring
/// (the libraries are mapped).
fn place(
    pid: u32,
    spec: &RegionSpec,
    symbols: &mut superprof_symbols::Symbolizer,
    substrings: bool,
) -> Result<Option<Placed>> {
    let Some(found) = crate::region::find(pid, spec, symbols, substrings)? else {
        return match spec {
            RegionSpec::Lines(..) => Err(crate::region::no_code(spec)),
            _ => Ok(None),
        };
    };
    let file = match &found.function {
        Some(f) if f.size == 0 => bail!(
            "function '{}' has no size in the symbol table: give its range as 0xSTART-0xEND",
            f.name
        ),
        Some(f) => superprof_symbols::mapped_files(pid)?
            .into_iter()
            .find(|m| m.path == f.module)
            .ok_or_else(|| err!("cannot find where {} is loaded", f.module.display()))?,
        None if matches!(spec, RegionSpec::Range(..)) => exe_file(pid)?,
        None => file_at(pid, found.lo).ok_or_else(|| err!("no file maps {:#x}", found.lo))?,
    };
    Ok(Some(Placed {
        name: found.name,
        lo: found.lo,
        hi: found.hi,
        file,
    }))
}

/// The error for a region that was never placed.
fn not_found(pid: u32, spec: &RegionSpec) -> crate::Error {
    match spec {
        RegionSpec::Function(name) => err!("{}", crate::region::not_found(pid, name)),
        _ => err!("region {} was not found", spec.label()),
    }
}

/// The whole executable as one region: from its first function to the end of its last.
fn whole_executable(pid: u32) -> Result<Placed> {
    let file = exe_file(pid)?;
    let code = ElfCode::open(&file.open_path)
        .ok_or_else(|| err!("cannot read {}", file.path.display()))?;
    let lo = code.functions.iter().map(|f| f.addr).min();
    let hi = code.functions.iter().map(|f| f.addr + f.size).max();
    let (Some(lo), Some(hi)) = (lo, hi) else {
        bail!(
            "{} has no function symbols: give a region with -r 0xSTART-0xEND",
            file.path.display()
        );
    };
    Ok(Placed {
        name: file
            .path
            .file_name()
            .map_or_else(String::new, |n| n.to_string_lossy().into_owned()),
        lo: lo + file.bias,
        hi: hi + file.bias,
        file,
    })
}

/// Rows for blocks given in ELF addresses of `region`'s file: function, file:line.
fn rows(
    region: &Placed,
    code: &ElfCode,
    symbols: &mut superprof_symbols::Symbolizer,
    blocks: impl IntoIterator<Item = (u64, u64, u32, u64, Option<bool>)>,
) -> Vec<BlockRow> {
    blocks
        .into_iter()
        .map(|(start, end, instructions, count, hit)| {
            let frames = symbols.symbolize(&region.file.path, region.readable_path(), start);
            let inner = frames.last();
            BlockRow {
                start,
                end,
                module: region.file.path.clone(),
                function: frames
                    .first()
                    .and_then(|f| f.function.clone())
                    .or_else(|| code.function_at(start).map(|f| f.name.clone())),
                file: inner.and_then(|f| f.file.clone()),
                line: inner.and_then(|f| f.line),
                instructions,
                count,
                hit,
            }
        })
        .collect()
}
