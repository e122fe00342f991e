//! Rendering `stat` results: table, CSV, JSON.

use std::fmt::Write;

/// Writing to a String fails only where a value's own Display does.
type Result<T> = std::result::Result<T, std::fmt::Error>;
use serde_json::json;
use superprof_profile::escape;

use super::Results;
use crate::Format;

/// Why a region's count may be low by `n` (see [`Results::uncertain`]).
pub fn uncertain_why(n: u64) -> String {
    format!(
        "up to {n} of its calls were taken for recursive calls of a call that was left without \
         returning (an exception, a longjmp, the thread's end), and may have begun after it was \
         left: the count may be low by that many"
    )
}

/// (One function of 221 lines: one match over the format and --per-call, each arm writing its whole
/// document (JSON, CSV, the per-call rows, or the table with its notes) top to bottom.)
pub fn render(r: &Results, format: Format, per_call: bool) -> Result<String> {
    let mut out = String::new();
    match (format, per_call) {
        (Format::Json, _) => {
            let regions: Vec<_> = r
                .regions
                .iter()
                .enumerate()
                .map(|(i, name)| {
                    let n = r.calls[i];
                    let events: serde_json::Map<String, serde_json::Value> = r
                        .events
                        .iter()
                        .enumerate()
                        .map(|(e, ev)| {
                            let s = &r.stats[i][e];
                            let mean = if n > 0 { s.total() / n as f64 } else { 0.0 };
                            (
                                ev.clone(),
                                json!({
                                    "total": s.total(),
                                    "mean": mean,
                                    "mean_error": s.error,
                                    "below_resolution": s.below_resolution,
                                    "min": s.min,
                                    "max": s.max,
                                    "scaled": s.scaled,
                                }),
                            )
                        })
                        .collect();
                    let mut v = json!({
                        "region": name,
                        "calls": n,
                        "uncertain_calls": r.uncertain.get(i).copied().unwrap_or(0),
                        "events": events,
                    });
                    if per_call {
                        v["invocations"] = r
                            .per_call
                            .iter()
                            .filter(|c| c.region == i)
                            .map(|c| json!({"tid": c.tid, "values": c.values}))
                            .collect();
                    }
                    v
                })
                .collect();
            let engines: Vec<serde_json::Value> = r
                .engines
                .iter()
                .map(|k| {
                    let cost: serde_json::Map<String, serde_json::Value> = r
                        .events
                        .iter()
                        .zip(&k.cost)
                        .map(|(e, c)| (e.clone(), json!(c)))
                        .collect();
                    json!({"engine": k.engine, "first_instruction": k.kind.name(), "cost_per_call": cost})
                })
                .collect();
            writeln!(
                out,
                "{}",
                json!({
                    "engine": r.engine,
                    "engines": engines,
                    "regions": regions,
                    "exact": r.lost_hits == 0 && r.uncertain.iter().all(|&n| n == 0),
                    "lost_hits": r.lost_hits,
                })
            )?;
        }
        (Format::Csv, false) => {
            writeln!(
                out,
                "region,calls,event,total,mean,min,max,scaled,mean_error,below_resolution"
            )?;
            for (i, name) in r.regions.iter().enumerate() {
                let n = r.calls[i];
                for (e, ev) in r.events.iter().enumerate() {
                    let s = &r.stats[i][e];
                    let mean = if n > 0 { s.total() / n as f64 } else { 0.0 };
                    writeln!(
                        out,
                        "{},{n},{ev},{:.0},{mean:.1},{:.0},{:.0},{},{:.1},{}",
                        csv(name),
                        s.total(),
                        s.min,
                        s.max,
                        s.scaled,
                        s.error,
                        s.below_resolution
                    )?;
                }
            }
        }
        (Format::Csv, true) => {
            writeln!(out, "region,tid,{}", r.events.join(","))?;
            for c in &r.per_call {
                let vals: Vec<String> = c.values.iter().map(|v| format!("{v:.0}")).collect();
                writeln!(
                    out,
                    "{},{},{}",
                    csv(&r.regions[c.region]),
                    c.tid,
                    vals.join(",")
                )?;
            }
        }
        (Format::Table, true) => {
            writeln!(
                out,
                "{:<30} {:>8}  {}",
                "region",
                "tid",
                r.events
                    .iter()
                    .map(|e| format!("{e:>16}"))
                    .collect::<String>()
            )?;
            for c in &r.per_call {
                let vals: String = c.values.iter().map(|v| format!("{v:>16.0}")).collect();
                writeln!(
                    out,
                    "{:<30} {:>8}  {vals}",
                    escape(&r.regions[c.region]),
                    c.tid
                )?;
            }
        }
        (Format::Table, false) => {
            // The engines, and their own cost per call (taken off every call).
            let used: Vec<String> = r
                .engines
                .iter()
                .map(|k| {
                    let cost: Vec<String> = r
                        .events
                        .iter()
                        .zip(&k.cost)
                        .filter(|(_, c)| **c >= 0.5)
                        .map(|(e, c)| format!("{} {c:.0}", escape(e)))
                        .collect();
                    let kind = if k.engine == "uprobe" {
                        format!(", first instruction {}", k.kind.name())
                    } else {
                        String::new()
                    };
                    format!(
                        "{} (its own cost per call{kind}, taken off: {})",
                        k.engine,
                        cost.join(", ")
                    )
                })
                .collect();
            if used.is_empty() {
                writeln!(out, "Engine: {}\n", r.engine)?;
            } else {
                writeln!(out, "Engine: {}\n", used.join("; "))?;
            }
            if r.lost_hits > 0 {
                writeln!(
                    out,
                    "Counts not exact: {} probe hits were lost\n",
                    r.lost_hits
                )?;
            }
            for (name, &n) in r.regions.iter().zip(&r.uncertain) {
                if n > 0 {
                    writeln!(
                        out,
                        "Count not exact: {}: {}\n",
                        escape(name),
                        uncertain_why(n)
                    )?;
                }
            }
            for (i, name) in r.regions.iter().enumerate() {
                let n = r.calls[i];
                writeln!(out, "Region {}: {n} calls", escape(name))?;
                writeln!(
                    out,
                    "  {:<24} {:>16} {:>16} {:>10} {:>16} {:>16}",
                    "event", "total", "mean", "± error", "min", "max"
                )?;
                let mut unresolved = false;
                for (e, ev) in r.events.iter().enumerate() {
                    let s = &r.stats[i][e];
                    let mean = if n > 0 { s.total() / n as f64 } else { 0.0 };
                    let mark = if s.scaled { " (scaled)" } else { "" };
                    // Below resolution: the bound it is under, not a measured zero.
                    let shown = if s.below_resolution {
                        unresolved = true;
                        format!("< {:.1}", mean + 2.0 * s.error)
                    } else {
                        format!("{mean:.1}")
                    };
                    writeln!(
                        out,
                        "  {:<24} {:>16.0} {shown:>16} {:>10.1} {:>16.0} {:>16.0}{mark}",
                        escape(ev),
                        s.total(),
                        s.error,
                        s.min,
                        s.max
                    )?;
                }
                if unresolved {
                    writeln!(
                        out,
                        "  (< X: below resolution: what is left of the mean once the engine's \
                         own cost is taken off is within two standard errors of zero)"
                    )?;
                }
                writeln!(out)?;
            }
        }
    }
    Ok(out)
}

/// A CSV field: escaped to one line, quoted when it holds a comma or a quote.
fn csv(s: &str) -> String {
    let s = escape(s);
    if s.contains([',', '"']) {
        format!("\"{}\"", s.replace('"', "\"\""))
    } else {
        s.into_owned()
    }
}

#[cfg(test)]
mod tests {
    use super::csv;

    #[test]
    fn csv_fields_are_one_line() {
        assert_eq!(csv("plain"), "plain");
        assert_eq!(csv("a,b"), "\"a,b\"");
        assert_eq!(csv("a\nb\x1b"), "a\\nb\\e");
        assert_eq!(csv("x\n\"y\""), "\"x\\n\"\"y\"\"\"");
    }
}
