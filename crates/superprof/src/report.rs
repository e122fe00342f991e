//! `superprof report`: read a native profile, filter it, write any format.

use std::io::{IsTerminal, Write};
use std::path::PathBuf;

use anyhow::{anyhow, bail, Context, Result};
use superprof_profile::sort::SortKey;
use superprof_profile::{Filter, OutputFormat};

use crate::cli::{DiffArgs, ReportArgs, ViewArgs};

#[derive(Debug, Clone)]
pub struct ReportConfig {
    pub file: PathBuf,
    pub format: OutputFormat,
    pub output: Option<PathBuf>,
    pub filter: Filter,
    /// The profile to compare with (`--diff BEFORE`), and in counts (`--absolute`).
    pub diff: Option<PathBuf>,
    pub absolute: bool,
    /// Full function names in the table.
    pub verbose: bool,
    /// `--sort KEYS`: the table and folded stacks by those keys.
    pub sort: Option<Vec<SortKey>>,
    /// `--calls`: the counted calls, as a table (false) or JSON (true).
    pub calls: Option<bool>,
    /// `--lines FUNC`: a counted function's lines.
    pub lines: Option<String>,
}

impl ReportConfig {
    pub fn from_args(a: ReportArgs) -> Result<ReportConfig> {
        if let Some(function) = a.lines {
            if a.view.diff.is_some() || a.view.sort.is_some() || a.view.format.is_some() {
                bail!("--lines FUNC shows a function's counted lines: not with --diff, --sort or --format");
            }
            return Ok(ReportConfig {
                lines: Some(function),
                ..ReportConfig::of_view(a.file, a.view)?
            });
        }
        if !a.calls {
            return ReportConfig::of_view(a.file, a.view);
        }
        let json = match a.view.format.as_deref() {
            None | Some("table") | Some("top") => false,
            Some("json") => true,
            Some(f) => bail!("--calls writes a table or json, not '{f}'"),
        };
        if a.view.diff.is_some() || a.view.sort.is_some() {
            bail!("--calls shows the counted calls: not with --diff or --sort");
        }
        Ok(ReportConfig {
            calls: Some(json),
            ..ReportConfig::of_view(
                a.file,
                ViewArgs {
                    format: None,
                    ..a.view
                },
            )?
        })
    }

    /// `superprof diff BEFORE AFTER`: `report AFTER --diff BEFORE`.
    pub fn from_diff(a: DiffArgs) -> Result<ReportConfig> {
        if a.view.diff.is_some() {
            bail!("superprof diff takes its two profiles as BEFORE AFTER, not --diff");
        }
        ReportConfig::of_view(
            a.after,
            ViewArgs {
                diff: Some(a.before),
                ..a.view
            },
        )
    }

    fn of_view(file: PathBuf, a: ViewArgs) -> Result<ReportConfig> {
        if a.absolute && a.diff.is_none() {
            bail!("--absolute goes with --diff (or superprof diff)");
        }
        let format = match (&a.format, &a.output) {
            (Some(name), _) => OutputFormat::from_name(name)
                .ok_or_else(|| anyhow!("unknown format '{name}': use {}", OutputFormat::names()))?,
            (None, Some(out)) => {
                OutputFormat::for_path(out).map_err(|e| anyhow!("{e}, or --format"))?
            }
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
        let sort = a
            .sort
            .as_deref()
            .map(SortKey::parse_list)
            .transpose()
            .map_err(|e| anyhow!(e))?;
        Ok(ReportConfig {
            calls: None,
            lines: None,
            sort,
            file,
            format,
            output: a.output,
            diff: a.diff,
            absolute: a.absolute,
            verbose: a.verbose,
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
                event: a.event,
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
    if cfg.diff.is_some() && !superprof_profile::diff::supports(cfg.format) {
        bail!("--diff writes top, folded or svg");
    }
    if cfg.sort.is_some()
        && (cfg.diff.is_some() || !matches!(cfg.format, OutputFormat::Top | OutputFormat::Folded))
    {
        bail!("--sort groups the table and folded stacks (not with --diff)");
    }
    let read = |file: &std::path::Path| -> Result<superprof_profile::Profile> {
        let profile = superprof_profile::parquet::read(file)
            .with_context(|| format!("cannot read profile '{}'", file.display()))?;
        Ok(if cfg.filter.is_empty() {
            profile
        } else {
            cfg.filter.apply(&profile)
        })
    };
    let profile = superprof_profile::parquet::read(&cfg.file)
        .with_context(|| format!("cannot read profile '{}'", cfg.file.display()))?;
    // A --focus that names no function keeps nothing: a typo, said with the names near it.
    for (flag, pattern, near) in cfg.filter.unmatched(&profile) {
        let near: Vec<String> = near
            .iter()
            .map(|n| superprof_profile::escape(n).into_owned())
            .collect();
        if flag == "--event" {
            bail!(
                "--event '{}' is not an event of the profile, which has {}",
                superprof_profile::escape(&pattern),
                near.join(", ")
            );
        }
        let message = format!(
            "{flag} '{}' names no function of the profile{}",
            superprof_profile::escape(&pattern),
            if near.is_empty() {
                String::new()
            } else {
                format!("; did you mean {}?", near.join(", "))
            }
        );
        if flag == "--focus" {
            bail!("{message}");
        }
        superprof_unwind::say!("superprof: {message}: nothing is left out");
    }
    let profile = if cfg.filter.is_empty() {
        profile
    } else {
        cfg.filter.apply(&profile)
    };
    // --sort and --diff show one event of a profile of several.
    let profile = match (&cfg.sort, &cfg.diff) {
        (None, None) => profile,
        (Some(_), _) => {
            superprof_profile::output::first_event(&profile, "--sort").unwrap_or(profile)
        }
        (_, Some(_)) => {
            superprof_profile::output::first_event(&profile, "--diff").unwrap_or(profile)
        }
    };
    if let Some(function) = &cfg.lines {
        // (A source file the profile names, read where it is an ordinary file of at most
        // 16 MiB: a profile is input like any other.)
        let read = |file: &str| {
            let meta = std::fs::metadata(file).ok()?;
            (meta.is_file() && meta.len() <= 16 << 20)
                .then(|| std::fs::read_to_string(file).ok())
                .flatten()
        };
        let mut out = Vec::new();
        superprof_profile::calls::write_lines(&profile, function, &read, &mut out)?
            .map_err(|e| anyhow!("{e}"))?;
        let write = |w: &mut (dyn Write + Send)| w.write_all(&out);
        match &cfg.output {
            Some(path) => {
                superprof_profile::write_atomic(path, |w| write(w))
                    .with_context(|| format!("cannot write '{}'", path.display()))?;
                superprof_unwind::say!("superprof: wrote {}", path.display());
            }
            None => superprof_resolve::Console::Stdout.write_with(write)?,
        }
        return Ok(0);
    }
    if let Some(json) = cfg.calls {
        if profile.meta.calls.is_empty() {
            bail!(
                "{} has no counted calls: record it with --precise FUNC",
                cfg.file.display()
            );
        }
        let write = |w: &mut (dyn Write + Send)| -> std::io::Result<()> {
            if json {
                writeln!(w, "{}", superprof_profile::calls::to_json(&profile))
            } else {
                superprof_profile::calls::write_table(&profile, w)
            }
        };
        match &cfg.output {
            Some(out) => {
                superprof_profile::write_atomic(out, |w| write(w))
                    .with_context(|| format!("cannot write '{}'", out.display()))?;
                superprof_unwind::say!("superprof: wrote {}", out.display());
            }
            None => superprof_resolve::Console::Stdout.write_with(write)?,
        }
        return Ok(0);
    }
    let before = cfg.diff.as_deref().map(read).transpose()?;
    let before = before.map(|b| superprof_profile::output::first_event(&b, "--diff").unwrap_or(b));
    if let Some(b) = &before {
        if cfg.absolute
            && (b.meta.event != profile.meta.event
                || b.meta.frequency != profile.meta.frequency
                || b.meta.events != profile.meta.events)
        {
            superprof_unwind::say!(
                "superprof: the profiles were sampled differently ({} at {} Hz before, {} at {} \
                 Hz after): their counts are not of the same thing",
                superprof_profile::escape(&b.meta.event),
                b.meta.frequency,
                superprof_profile::escape(&profile.meta.event),
                profile.meta.frequency
            );
        }
    }
    let title = match &before {
        Some(b) => format!(
            "superprof: {} against {}",
            profile.meta.command.join(" "),
            b.meta.command.join(" ")
        ),
        None => format!("superprof: {}", profile.meta.command.join(" ")),
    };
    // The table fits the terminal it is shown on (a file gets names shortened, no width).
    let console = superprof_resolve::Console::Stdout;
    let style = crate::sys::table_style(console, 40, cfg.verbose);
    let style = superprof_profile::top::TableStyle {
        width: style.width.filter(|_| cfg.output.is_none()),
        ..style
    };
    let write = |w: &mut (dyn Write + Send)| -> std::io::Result<()> {
        match &before {
            Some(b) => {
                let opts = superprof_profile::diff::DiffOptions {
                    absolute: cfg.absolute,
                    style,
                };
                superprof_profile::diff::write(b, &profile, cfg.format, opts, &title, w)
            }
            None => match (&cfg.sort, cfg.format) {
                (Some(keys), OutputFormat::Top) => {
                    superprof_profile::sort::write_table(&profile, keys, 40, w)
                }
                (Some(keys), _) => superprof_profile::sort::write_folded(&profile, keys, w),
                (None, OutputFormat::Top) => {
                    superprof_profile::top::write_styled(&profile, &style, w)
                }
                (None, format) => superprof_profile::output::write(&profile, format, &title, w),
            },
        }
    };
    match &cfg.output {
        Some(out) => {
            superprof_profile::write_atomic(out, |w| write(w))
                .with_context(|| format!("cannot write '{}'", out.display()))?;
            superprof_unwind::say!("superprof: wrote {}", out.display());
        }
        None => console.write_with(write)?,
    }
    Ok(0)
}
