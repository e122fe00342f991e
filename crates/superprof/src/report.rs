//! `superprof report`: read a native profile, filter it, write any format.

use std::io::{IsTerminal, Write};
use std::path::PathBuf;

use anyhow::{anyhow, bail, Context, Result};
use superprof_profile::{Filter, OutputFormat};

use crate::cli::ReportArgs;

#[derive(Debug, Clone)]
pub struct ReportConfig {
    pub file: PathBuf,
    pub format: OutputFormat,
    pub output: Option<PathBuf>,
    pub filter: Filter,
}

impl ReportConfig {
    pub fn from_args(a: ReportArgs) -> Result<ReportConfig> {
        let format = match (&a.format, &a.output) {
            (Some(name), _) => OutputFormat::from_name(name).ok_or_else(|| {
                anyhow!("unknown format '{name}': use top, tree, folded, svg, parquet, pprof, speedscope or firefox")
            })?,
            (None, Some(out)) => OutputFormat::from_path(out).ok_or_else(|| {
                anyhow!(
                    "cannot tell the format of output '{}': use --format or one of the extensions {}",
                    out.display(),
                    OutputFormat::extensions()
                )
            })?,
            (None, None) => OutputFormat::Top,
        };
        let secs = |x: Option<f64>, what: &str| -> Result<Option<u64>> {
            match x {
                Some(s) if !(s >= 0.0 && s.is_finite()) => {
                    bail!("--{what} must be a number of seconds >= 0")
                }
                Some(s) => Ok(Some((s * 1e9) as u64)),
                None => Ok(None),
            }
        };
        Ok(ReportConfig {
            file: a.file,
            format,
            output: a.output,
            filter: Filter {
                tids: a.tids,
                since_ns: secs(a.since, "since")?,
                until_ns: secs(a.until, "until")?,
                focus: a.focus,
                exclude: a.exclude,
                off_cpu: match (a.on_cpu, a.off_cpu) {
                    (true, _) => Some(false),
                    (_, true) => Some(true),
                    _ => None,
                },
            },
        })
    }
}

pub fn run(cfg: &Result<ReportConfig>) -> Result<i32> {
    let cfg = cfg.as_ref().map_err(|e| anyhow!("{e:#}"))?;
    if cfg.output.is_none() && cfg.format.is_binary() && std::io::stdout().is_terminal() {
        bail!("this format is binary: give an output file with -o");
    }
    if let Some(out) = &cfg.output {
        superprof_profile::output::check_writable(out)
            .with_context(|| format!("cannot write output '{}'", out.display()))?;
    }
    let profile = superprof_profile::parquet::read(&cfg.file)
        .with_context(|| format!("cannot read profile '{}'", cfg.file.display()))?;
    let profile = if cfg.filter.is_empty() {
        profile
    } else {
        cfg.filter.apply(&profile)
    };
    let title = format!("superprof: {}", profile.meta.command.join(" "));
    match &cfg.output {
        Some(out) => {
            superprof_profile::write_atomic(out, |w| {
                superprof_profile::output::write(&profile, cfg.format, &title, w)
            })
            .with_context(|| format!("cannot write '{}'", out.display()))?;
            eprintln!("superprof: wrote {}", out.display());
        }
        None => {
            let mut stdout = std::io::stdout();
            superprof_profile::output::write(&profile, cfg.format, &title, &mut stdout)?;
            stdout.flush()?;
        }
    }
    Ok(0)
}
