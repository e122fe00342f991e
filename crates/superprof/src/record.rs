//! `superprof record`: the arguments made a [`superprof_record::RecordConfig`]; the recording's
//! summary, table, output files and push.

use std::path::PathBuf;

use anyhow::{bail, Result};
use superprof_profile::OutputFormat;
use superprof_push::PushArgs;
use superprof_record::{RecordConfig, Recorded, SamplerKind, Target};
use superprof_sample::SamplerConfig;
use superprof_trace::ExitStatus;

use crate::cli::RecordArgs;
use crate::sys;

const EMPTY: &str =
    "no samples were taken: the target ran too briefly or was idle, so the profile is empty";

/// A recording and what is done with it.
#[derive(Debug, Clone)]
pub struct Record {
    pub config: RecordConfig,
    /// Output files (none: superprof.parquet).
    pub outputs: Vec<PathBuf>,
    /// No table.
    pub quiet: bool,
    /// Full function names in the table.
    pub verbose: bool,
    /// Where the table goes, when not where the target says (stderr for a launched
    /// command, whose output owns stdout; stdout when attached).
    pub console: Option<superprof_resolve::Console>,
    /// `--push DEST`, with `--app`, `--label`s and `--tenant` as given.
    pub push: Option<PushArgs>,
    /// Rows of the top table.
    pub top_rows: usize,
    /// `--precise`: what is counted beside the samples.
    pub precise: Option<Precise>,
}

/// `record --precise`'s request.
#[derive(Debug, Clone)]
pub struct Precise {
    /// The functions whose calls are counted (none: `top` of the hottest).
    pub names: Vec<String>,
    pub top: usize,
    /// Every block of each, for its lines (`--precise-lines`).
    pub lines: bool,
}

impl Record {
    pub fn from_args(a: RecordArgs) -> Result<Record> {
        // perf's -g: whole stacks are always recorded, with it or without.
        let _ = a.g;
        let target = a.target.target()?;
        let events = parse_events(&a.sampled.events)?;
        let mut sampler = SamplerConfig {
            frequency: a.frequency,
            stack_size: a.stack_size,
            off_cpu: a.off_cpu,
            events,
            period: a.sampled.period,
            ..SamplerConfig::default()
        };
        if let Some(mode) = &a.call_graph {
            CallGraph::parse(mode)?.apply(&mut sampler);
        }
        Ok(Record {
            config: RecordConfig {
                sampler_kind: match a.sampler {
                    crate::cli::SamplerArg::Perf => SamplerKind::Perf,
                    crate::cli::SamplerArg::Ptrace => SamplerKind::Ptrace,
                    crate::cli::SamplerArg::Auto => SamplerKind::Auto,
                },
                duration: a.duration,
                runtime_setup: !a.no_runtime_setup,
                ..record_config(target, sampler, a.quiet)
            },
            outputs: a.outputs,
            quiet: a.quiet,
            verbose: a.verbose,
            console: None,
            push: a.push.map(|dest| PushArgs {
                dest,
                app: a.app,
                labels: a.labels,
                tenant: a.tenant,
            }),
            top_rows: 30,
            precise: match a.precise {
                Some(names) => Some(Precise {
                    names: precise_names(names, a.precise_top)?,
                    top: a.precise_top,
                    lines: a.precise_lines,
                }),
                None => None,
            },
        })
    }

    /// Records, prints the table, writes the output; returns the exit code for superprof.
    pub fn run(&self) -> Result<i32> {
        let outputs = self.check_outputs()?;
        let push = self.push.as_ref().map(superprof_push::parse).transpose()?;
        let recorded = match &self.precise {
            Some(p) => record_precise(&self.config, p)?,
            None => record(&self.config)?,
        };
        match recorded.exit {
            // A launched command's status is superprof's, whatever there is to show.
            Some(status) if recorded.profile.samples.is_empty() => Err(crate::NothingToShow {
                why: format!("{EMPTY}; no output written"),
                status,
            }
            .into()),
            exit => {
                // A launched command's status survives an output or a push that failed.
                let shown = self.show(&recorded, &outputs).and_then(|()| match &push {
                    Some((dest, opts)) => {
                        let stop = sys::stop_requested;
                        Ok(superprof_push::push(dest, &recorded.profile, opts, &stop)?)
                    }
                    None => Ok(()),
                });
                crate::FailedAfter::wrap(shown, exit)?;
                Ok(exit.map_or(0, |e| e.shell_code()))
            }
        }
    }

    /// Prints the summary and the table, and writes the output files (from
    /// [`Record::check_outputs`]).
    pub fn show(&self, recorded: &Recorded, outputs: &[(PathBuf, OutputFormat)]) -> Result<()> {
        let profile = &recorded.profile;
        if profile.samples.is_empty() {
            bail!("{EMPTY}");
        }
        superprof_unwind::say!("{}", recorded.summary());
        // Samples lost by the tenth: what loses fewer.
        let lost = profile.meta.lost_samples;
        if lost > 0 && lost.saturating_mul(10) >= profile.samples.len() as u64 {
            superprof_unwind::say!(
                "superprof: {lost} samples were lost (the kernel wrote them faster than superprof \
                 read them): a smaller --stack-size, --call-graph fp (no stack copies) or, for \
                 an event, a larger -c PERIOD loses fewer"
            );
        }
        if let Some(status @ ExitStatus::Signal(_)) = recorded.exit {
            superprof_unwind::say!("superprof: the command {status}");
        }
        // The files first: a table cut short (stdout piped into `head`) loses no profile.
        for (path, format) in outputs {
            superprof_resolve::write_output(profile, path, *format)?;
            superprof_unwind::say!("superprof: wrote {}", path.display());
        }
        if !self.quiet {
            // A launched command's output owns stdout.
            let console = self.console.unwrap_or_else(|| {
                superprof_resolve::Console::of_run(match &self.config.target {
                    Target::Command(_) => true,
                    Target::System { command, .. } => !command.is_empty(),
                    Target::Pid(_) | Target::Thread(_) => false,
                })
            });
            let style = sys::table_style(console, self.top_rows, self.verbose);
            console.write_with(|w| superprof_profile::top::write_styled(profile, &style, w))?;
        }
        Ok(())
    }

    /// Validates the output paths before anything runs, so a bad -o costs nothing.
    pub fn check_outputs(&self) -> Result<Vec<(PathBuf, OutputFormat)>> {
        Ok(superprof_resolve::check_outputs(&self.outputs)?)
    }
}

/// `-e`'s events, as perf names them.
pub fn parse_events(names: &[String]) -> Result<Vec<superprof_sample::EventSpec>> {
    let events: Vec<superprof_sample::EventSpec> = names
        .iter()
        .filter(|e| !e.is_empty())
        .map(|e| superprof_sample::EventSpec::parse(e).map_err(anyhow::Error::msg))
        .collect::<Result<_>>()?;
    // (Each sample names its event by name: twice the same would be one.)
    for (i, e) in events.iter().enumerate() {
        if events[..i].iter().any(|x| x.name == e.name) {
            bail!("-e gives {} twice", e.name);
        }
    }
    Ok(events)
}

/// perf's `--call-graph MODE`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CallGraph {
    /// `dwarf[,SIZE]`: stack copies of SIZE bytes (None: `--stack-size`), unwound from the
    /// CFI.
    Dwarf(Option<u32>),
    /// `fp`: the kernel's frame-pointer walk, no stack copy.
    FramePointers,
}

impl CallGraph {
    /// `dwarf`, `dwarf,SIZE` or `fp`; perf's `lbr` is refused with the reason.
    pub fn parse(mode: &str) -> Result<CallGraph> {
        let (name, size) = match mode.split_once(',') {
            Some((n, s)) => (n, Some(s)),
            None => (mode, None),
        };
        match (name, size) {
            ("dwarf", None) => Ok(CallGraph::Dwarf(None)),
            ("dwarf", Some(s)) => {
                let n: u32 = s.trim().parse().map_err(|_| {
                    anyhow::anyhow!("--call-graph dwarf,SIZE: '{s}' is not a number of bytes")
                })?;
                if n == 0 || !n.is_multiple_of(8) || n > 65528 {
                    bail!(
                        "--call-graph dwarf,SIZE: {n} is out of range: give a multiple of 8 \
                         between 8 and 65528 bytes"
                    );
                }
                Ok(CallGraph::Dwarf(Some(n)))
            }
            ("fp", None) => Ok(CallGraph::FramePointers),
            ("lbr", _) => bail!(
                "--call-graph lbr needs Intel's last branch records, which superprof does not \
                 read: use dwarf (the default) or fp"
            ),
            _ => bail!("--call-graph takes dwarf, dwarf,SIZE or fp, not '{mode}'"),
        }
    }

    /// Sets `sampler` to unwind this way.
    pub fn apply(self, sampler: &mut SamplerConfig) {
        match self {
            CallGraph::Dwarf(size) => {
                if let Some(size) = size {
                    sampler.stack_size = size;
                }
                sampler.frame_pointers = false;
            }
            CallGraph::FramePointers => sampler.frame_pointers = true,
        }
    }
}

/// The config of a recording of `target` that stops on Ctrl-C, SIGTERM or SIGHUP, with a
/// progress line unless `quiet`.
pub fn record_config(target: Target, sampler: SamplerConfig, quiet: bool) -> RecordConfig {
    RecordConfig {
        progress: !quiet,
        stop: sys::stop_requested,
        ..RecordConfig::new(target, sampler)
    }
}

/// `--precise`'s names, trimmed (empty: the hottest, chosen while the command runs).
fn precise_names(names: Vec<String>, top: usize) -> Result<Vec<String>> {
    let names: Vec<String> = names
        .into_iter()
        .map(|n| n.trim().to_owned())
        .filter(|n| !n.is_empty())
        .collect();
    if names.is_empty() && top == 0 {
        bail!("--precise-top must be at least 1");
    }
    Ok(names)
}

/// [`record`] with calls counted beside the samples as `p` asks (`--precise`): in the
/// profile's `Meta::calls`.
pub fn record_precise(config: &RecordConfig, p: &Precise) -> Result<Recorded> {
    sys::install_stop_handler();
    superprof_sample::raise_fd_limit();
    let mut precise = superprof_probe::blocks::Precise::new(&p.names, p.top, p.lines)?;
    let mut recorded = superprof_record::record_beside(config, &mut precise)?;
    recorded.profile.meta.calls = precise.calls().to_vec();
    Ok(recorded)
}

/// Records `config` with superprof's stop signals caught (so that the target is let go and
/// the profile written on Ctrl-C).
pub fn record(config: &RecordConfig) -> Result<Recorded> {
    sys::install_stop_handler();
    superprof_sample::raise_fd_limit();
    Ok(superprof_record::record(config)?)
}
