//! Rendering `blocks` results: table, JSON, CSV, and the annotated disassembly.

use std::collections::HashMap;
use std::fmt::Write;

/// Writing to a String fails only where a value's own Display does.
type Result<T> = std::result::Result<T, std::fmt::Error>;
use serde_json::json;
use superprof_profile::escape;

use super::Mode;
use super::{BlockRow, ElfCode, Report};
use crate::Format;
use superprof_analyze::Isa;

fn mode_name(m: Mode) -> &'static str {
    match m {
        Mode::Count => "count",
        Mode::Coverage => "coverage",
        Mode::Sample => "sample",
    }
}

fn short_location(b: &BlockRow) -> String {
    match (&b.file, b.line) {
        (Some(f), Some(l)) => {
            let name = std::path::Path::new(f)
                .file_name()
                .map_or_else(|| f.clone(), |n| n.to_string_lossy().into_owned());
            format!("{}:{l}", escape(&name))
        }
        _ => String::new(),
    }
}

/// (One function of 239 lines: one match over the formats, each arm writing its whole document
/// (JSON, CSV, or the table with its summary lines) top to bottom from the same `total` and
/// `share`.)
pub fn render(r: &Report, format: Format, annotate: bool) -> Result<String> {
    let total: u64 = r.blocks.iter().map(|b| b.count).sum();
    let share = |n: u64| {
        if total == 0 {
            0.0
        } else {
            100.0 * n as f64 / total as f64
        }
    };
    let coverage = r.mode == Mode::Coverage;
    let mut out = String::new();
    match format {
        Format::Json => {
            let blocks: Vec<_> = r
                .blocks
                .iter()
                .map(|b| {
                    let mut v = json!({
                        "start": format!("{:#x}", b.start),
                        "end": format!("{:#x}", b.end),
                        "module": b.module.to_string_lossy(),
                        "function": b.function,
                        "file": b.file,
                        "line": b.line,
                        "instructions": b.instructions,
                        "count": b.count,
                        "share": share(b.count),
                    });
                    if let Some(hit) = b.hit {
                        v["hit"] = json!(hit);
                    }
                    v
                })
                .collect();
            let regions: Vec<_> = r
                .regions
                .iter()
                .map(|p| {
                    json!({
                        "name": p.name,
                        "start": format!("{:#x}", p.lo.wrapping_sub(p.file.bias)),
                        "end": format!("{:#x}", p.hi.wrapping_sub(p.file.bias)),
                        "module": p.file.path.to_string_lossy(),
                    })
                })
                .collect();
            let mut doc = json!({
                "mode": mode_name(r.mode),
                "regions": regions,
                "total": total,
                "blocks": blocks,
            });
            if let Some(engine) = r.engine {
                doc["engine"] = json!(engine);
            }
            if let Some((name, s)) = &r.analyzer {
                doc["analyzer"] = json!({
                    "name": name,
                    "single_steps": s.single_steps,
                    "predictions": s.predictions,
                    "predictions_right": s.predictions_right,
                    "table_entries": s.table_entries,
                    "training_steps": s.training_steps,
                    "mispredicted": s.mispredicted,
                    "settled": s.settled,
                    "probed": s.probed,
                    "lab_runs": s.lab_runs,
                });
            }
            if r.engine == Some("in-process") {
                doc["patched_blocks"] = json!(r.patched);
                doc["uprobe_blocks"] = json!(r.uprobe_blocks);
                doc["breakpoint_blocks"] = json!(r.breakpoint_blocks);
            }
            match r.mode {
                Mode::Sample => doc["samples_elsewhere"] = json!(r.samples_elsewhere),
                Mode::Coverage => doc["stops"] = json!(r.stops),
                Mode::Count => {
                    doc["stops"] = json!(r.stops);
                    doc["branches_emulated"] = json!(r.emulated);
                }
            }
            if coverage {
                doc["blocks_hit"] = json!(r.blocks.iter().filter(|b| b.hit == Some(true)).count());
            }
            out = serde_json::to_string_pretty(&doc).map_err(|_| std::fmt::Error)?;
            out.push('\n');
        }
        Format::Csv => {
            out.push_str("start,end,function,file,line,instructions,count,share,module");
            out.push_str(if coverage { ",hit\n" } else { "\n" });
            for b in &r.blocks {
                let _ = write!(
                    out,
                    "{:#x},{:#x},{},{},{},{},{},{:.3}",
                    b.start,
                    b.end,
                    csv_field(b.function.as_deref().unwrap_or("")),
                    csv_field(b.file.as_deref().unwrap_or("")),
                    b.line.map_or_else(String::new, |l| l.to_string()),
                    b.instructions,
                    b.count,
                    share(b.count)
                );
                let _ = write!(out, ",{}", csv_field(&b.module.to_string_lossy()));
                if let Some(hit) = b.hit {
                    let _ = write!(out, ",{hit}");
                }
                out.push('\n');
            }
        }
        Format::Table => {
            for p in &r.regions {
                let _ = writeln!(
                    out,
                    "region {} [{:#x}-{:#x}) in {}",
                    escape(&p.name),
                    p.lo.wrapping_sub(p.file.bias),
                    p.hi.wrapping_sub(p.file.bias),
                    escape(&p.file.path.to_string_lossy())
                );
            }
            let what = match r.mode {
                Mode::Count => "executions",
                Mode::Coverage => "hit",
                Mode::Sample => "samples",
            };
            let _ = writeln!(
                out,
                "{what:>12} {:>7}  {:<12} {:<12} {:>5}  {:<24} location",
                "share", "start", "end", "insns", "function"
            );
            let shown = r.blocks.iter().filter(|b| !coverage || b.hit == Some(true));
            for b in shown {
                let count = if coverage {
                    "yes".to_owned()
                } else {
                    b.count.to_string()
                };
                let _ = writeln!(
                    out,
                    "{count:>12} {:>6.2}%  {:<12} {:<12} {:>5}  {:<24} {}",
                    share(b.count),
                    format!("{:#x}", b.start),
                    format!("{:#x}", b.end),
                    b.instructions,
                    escape(b.function.as_deref().unwrap_or("?")),
                    short_location(b)
                );
            }
            match r.mode {
                Mode::Coverage => {
                    let hit = r.blocks.iter().filter(|b| b.hit == Some(true)).count();
                    let how = match r.engine {
                        Some("uprobe") => "counted by uprobes".to_owned(),
                        Some("in-process") => in_process(r),
                        _ => format!("{} breakpoint stops", r.stops),
                    };
                    let _ = writeln!(
                        out,
                        "{hit} of {} blocks ran ({:.1}%); {how}",
                        r.blocks.len(),
                        if r.blocks.is_empty() {
                            0.0
                        } else {
                            100.0 * hit as f64 / r.blocks.len() as f64
                        },
                    );
                }
                Mode::Count if r.engine == Some("in-process") => {
                    let _ = writeln!(
                        out,
                        "{} blocks, {total} block executions; {}",
                        r.blocks.len(),
                        in_process(r)
                    );
                }
                Mode::Count if r.engine == Some("uprobe") => {
                    let _ = writeln!(
                        out,
                        "{} blocks, {total} block executions; counted by uprobes (the program \
                         never stopped)",
                        r.blocks.len(),
                    );
                }
                Mode::Count => {
                    let _ = writeln!(
                        out,
                        "{} blocks, {total} block executions; {} ptrace stops, {} branches worked \
                         out from the registers",
                        r.blocks.len(),
                        r.stops,
                        r.emulated
                    );
                }
                Mode::Sample => {
                    let _ = writeln!(
                        out,
                        "{} blocks, {total} samples in the regions, {} elsewhere",
                        r.blocks.len(),
                        r.samples_elsewhere
                    );
                }
            }
            if let Some((name, s)) = &r.analyzer {
                if *name == "learn" {
                    let _ = writeln!(
                        out,
                        "learn: {} instructions run in the lab ({} runs), {} single steps in \
                         the regions and {} outside them to train, {} blocks predicted from the \
                         table{}, {} table entries ({}), {} runs off their predicted path (their \
                         ranges single-stepped since)",
                        s.probed,
                        s.lab_runs,
                        s.single_steps,
                        s.training_steps,
                        s.predictions,
                        s.predictions_right
                            .map(|n| format!(" ({n} agree with the decoder)"))
                            .unwrap_or_default(),
                        s.table_entries,
                        if s.probed > 0 {
                            "verdicts of the lab"
                        } else if s.settled {
                            "settled"
                        } else {
                            "still learning"
                        },
                        s.mispredicted
                    );
                }
            }
        }
    }
    if annotate {
        out.push_str(&annotated(r));
    }
    Ok(out)
}

/// A CSV field: escaped to one line, quoted when it holds a comma or a quote.
fn csv_field(s: &str) -> String {
    let s = escape(s);
    if s.contains([',', '"']) {
        format!("\"{}\"", s.replace('"', "\"\""))
    } else {
        s.into_owned()
    }
}

/// The disassembly of each region (or, for a whole executable, of each function with a
/// counted block) with each block's count in the margin of its first instruction.
fn annotated(r: &Report) -> String {
    let mut out = String::new();
    let by_start: HashMap<(&std::path::Path, u64), &BlockRow> = r
        .blocks
        .iter()
        .map(|b| ((b.module.as_path(), b.start), b))
        .collect();
    for p in &r.regions {
        let Some(code) = ElfCode::open(p.readable_path()) else {
            continue;
        };
        let (lo, hi) = (
            p.lo.wrapping_sub(p.file.bias),
            p.hi.wrapping_sub(p.file.bias),
        );
        let ranges: Vec<(String, u64, u64)> = if p.name.contains('/')
            || code.functions_in(lo, hi).count() <= 1
            || r.mode == Mode::Count
        {
            vec![(p.name.clone(), lo, hi)]
        } else {
            // Only the functions where something ran.
            code.functions_in(lo, hi)
                .filter(|f| {
                    r.blocks.iter().any(|b| {
                        b.module == p.file.path
                            && b.count > 0
                            && (f.addr..f.addr + f.size).contains(&b.start)
                    })
                })
                .map(|f| (f.name.clone(), f.addr.max(lo), (f.addr + f.size).min(hi)))
                .collect()
        };
        for (name, lo, hi) in ranges {
            let _ = writeln!(
                out,
                "\n{} [{lo:#x}-{hi:#x}) in {}",
                escape(&name),
                escape(&p.file.path.to_string_lossy())
            );
            let Some(bytes) = code.bytes(lo, hi - lo) else {
                continue;
            };
            let mut off = 0usize;
            while off < bytes.len() {
                let at = lo + off as u64;
                let Some((text, len)) = code.arch.disassemble(&bytes[off..], at) else {
                    let _ = writeln!(out, "{:>12}  {at:>8x}:  (bad)", "");
                    off += 1;
                    continue;
                };
                let margin = match by_start.get(&(p.file.path.as_path(), at)) {
                    Some(b) if r.mode == Mode::Coverage => {
                        if b.hit == Some(true) { "hit" } else { "-" }.to_owned()
                    }
                    Some(b) => b.count.to_string(),
                    None => String::new(),
                };
                let _ = writeln!(out, "{margin:>12}  {at:>8x}:  {text}");
                off += len as usize;
            }
        }
    }
    out
}

/// How the in-process engine counted: blocks patched, blocks on uprobes, blocks on
/// breakpoints and their stops.
fn in_process(r: &Report) -> String {
    let uprobes = match r.uprobe_blocks {
        0 => String::new(),
        n => format!(", {n} that cannot take a jump counted by uprobes"),
    };
    if r.breakpoint_blocks == 0 {
        format!(
            "counted in-process ({} blocks patched{uprobes}; the program never stopped)",
            r.patched
        )
    } else {
        format!(
            "counted in-process ({} blocks patched{uprobes}; {} that cannot take a jump \
             counted by breakpoints: {} stops)",
            r.patched, r.breakpoint_blocks, r.stops
        )
    }
}

#[cfg(test)]
mod tests {
    use super::csv_field;

    #[test]
    fn csv_quotes_commas() {
        assert_eq!(csv_field("a,b"), "\"a,b\"");
        assert_eq!(csv_field("f<int, int>"), "\"f<int, int>\"");
        assert_eq!(csv_field("plain"), "plain");
        assert_eq!(csv_field("a\nb\x1b[0m"), "a\\nb\\e[0m");
    }
}
