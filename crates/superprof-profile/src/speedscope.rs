//! speedscope's file format (<https://www.speedscope.app/file-format-schema.json>): one
//! `sampled` profile per thread, frames shared, stacks root first, weights in nanoseconds.
//!
//! Written as a stream: one pass over the samples keeps, per thread, the sequence of its
//! stacks with consecutive repeats of one stack merged into one sample of their summed weight
//! (what speedscope's time-order view shows the same way), and each distinct stack's frame
//! list once; the JSON is then written piece by piece. Memory so follows the changes of stack
//! and the distinct stacks, not the samples (a 10-million-sample profile took 2 GB before).

use std::collections::HashMap;
use std::io::{self, Write};

use serde_json::json;

use crate::{Profile, StackId};

/// Writes `profile` as a speedscope JSON file.
pub fn write(profile: &Profile, w: &mut dyn Write) -> io::Result<()> {
    let period_ns = if profile.meta.frequency > 0 {
        1e9 / profile.meta.frequency as f64
    } else {
        1.0
    };
    // Shared frames, one per function (and file), as speedscope takes a frame: a function
    // whose samples are at several lines (main calling two functions) is one frame, or its
    // Sandwich and Left Heavy views would split it and never show it at 100% (issue 34). Its
    // line is the lowest seen, the nearest its start.
    let mut frames: Vec<serde_json::Value> = Vec::new();
    let mut frame_index: HashMap<(crate::StrId, Option<crate::StrId>), usize> = HashMap::new();
    // Each distinct list of frame indexes (root first) by a number of its own, and the number
    // of each stack's list (two stacks of different addresses may show as one list).
    let mut stack_number: HashMap<Option<StackId>, u32> = HashMap::new();
    let mut list_number: HashMap<Vec<usize>, u32> = HashMap::new();
    let mut stacks: Vec<Vec<usize>> = Vec::new();
    // Per thread: (stack number, weight in periods) with consecutive repeats merged.
    let mut per_thread: Vec<Vec<(u32, u64)>> = vec![Vec::new(); profile.threads.len()];
    for s in &profile.samples {
        let Some(seq) = per_thread.get_mut(s.thread as usize) else {
            continue;
        };
        let n = *stack_number.entry(s.stack).or_insert_with(|| {
            let mut list: Vec<usize> = profile
                .stack_frames(s.stack)
                .map(|fid| {
                    let f = profile.frame(fid);
                    let i = *frame_index.entry((f.function, f.file)).or_insert_with(|| {
                        let mut v = json!({ "name": profile.str(f.function) });
                        if let Some(file) = f.file {
                            v["file"] = json!(profile.str(file));
                        }
                        frames.push(v);
                        frames.len() - 1
                    });
                    if f.file.is_some() && f.line > 0 {
                        let v = &mut frames[i];
                        if v["line"].as_u64().is_none_or(|l| u64::from(f.line) < l) {
                            v["line"] = json!(f.line);
                        }
                    }
                    i
                })
                .collect();
            list.reverse();
            *list_number.entry(list).or_insert_with_key(|list| {
                stacks.push(list.clone());
                (stacks.len() - 1) as u32
            })
        });
        match seq.last_mut() {
            Some((last, weight)) if *last == n => *weight = weight.saturating_add(s.weight),
            _ => seq.push((n, s.weight)),
        }
    }
    let text = |s: &str| serde_json::to_string(s).map_err(io::Error::other);
    write!(
        w,
        "{{\"$schema\":\"https://www.speedscope.app/file-format-schema.json\",\
         \"shared\":{{\"frames\":"
    )?;
    serde_json::to_writer(&mut *w, &frames)?;
    write!(w, "}},\"profiles\":[")?;
    let mut first = true;
    for (t, seq) in per_thread.iter().enumerate() {
        if seq.is_empty() {
            continue;
        }
        let thread = &profile.threads[t];
        let end: f64 = seq.iter().map(|&(_, wt)| wt as f64 * period_ns).sum();
        if !first {
            w.write_all(b",")?;
        }
        first = false;
        write!(
            w,
            "{{\"type\":\"sampled\",\"name\":{},\"unit\":\"nanoseconds\",\"startValue\":0,\
             \"endValue\":{},\"samples\":[",
            text(&format!("{} ({})", profile.str(thread.name), thread.tid))?,
            json!(end)
        )?;
        for (i, &(n, _)) in seq.iter().enumerate() {
            if i > 0 {
                w.write_all(b",")?;
            }
            serde_json::to_writer(&mut *w, &stacks[n as usize])?;
        }
        w.write_all(b"],\"weights\":[")?;
        for (i, &(_, wt)) in seq.iter().enumerate() {
            if i > 0 {
                w.write_all(b",")?;
            }
            write!(w, "{}", json!(wt as f64 * period_ns))?;
        }
        w.write_all(b"]}")?;
    }
    write!(
        w,
        "],\"name\":{},\"activeProfileIndex\":0,\"exporter\":{}}}",
        text(&profile.meta.command.join(" "))?,
        text(&format!("superprof {}", profile.meta.version))?
    )?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn repeats_of_a_stack_merge_and_the_document_is_the_schema_s() {
        let mut p = Profile::default();
        p.meta.frequency = 1000;
        p.meta.command = vec!["prog".into(), "\"x\"".into()];
        let t = p.add_thread(1, 1, "main");
        let u = p.add_thread(1, 2, "worker");
        let main = p.intern_frame_named("main", "m", Some("a.c"), 3, 1, false);
        let f = p.intern_frame_named("f", "m", None, 0, 2, false);
        let sm = p.intern_stack(None, main);
        let sf = p.intern_stack(Some(sm), f);
        // `f` at another address: another stack, shown as the same one.
        let f2 = p.intern_frame_named("f", "m", None, 0, 9, false);
        let sf2 = p.intern_stack(Some(sm), f2);
        for (i, (th, st)) in [
            (t, sf),
            (t, sf),
            (u, sm),
            (t, sm),
            (t, sf),
            (t, sf2),
            (t, sf),
        ]
        .into_iter()
        .enumerate()
        {
            p.add_sample(i as u64, th, 0, 1, Some(st));
        }
        let mut out = Vec::new();
        write(&p, &mut out).unwrap();
        let doc: serde_json::Value = serde_json::from_slice(&out).unwrap();
        assert_eq!(doc["name"], "prog \"x\"");
        let frames = doc["shared"]["frames"].as_array().unwrap();
        // Numbered as first met, leaf first.
        assert_eq!(frames[0], json!({"name": "f"}));
        assert_eq!(frames[1], json!({"name": "main", "file": "a.c", "line": 3}));
        let profiles = doc["profiles"].as_array().unwrap();
        assert_eq!(profiles.len(), 2);
        assert_eq!(profiles[0]["name"], "main (1)");
        assert_eq!(profiles[0]["samples"], json!([[1, 0], [1], [1, 0]]));
        assert_eq!(profiles[0]["weights"], json!([2e6, 1e6, 3e6]));
        assert_eq!(profiles[0]["endValue"], json!(6e6));
        assert_eq!(profiles[1]["samples"], json!([[1]]));
    }

    #[test]
    fn a_function_seen_at_several_lines_is_one_frame() {
        let mut p = Profile::default();
        p.meta.frequency = 1000;
        let t = p.add_thread(1, 1, "main");
        // main calling f at line 7 and g at line 4: one main, at its lowest line.
        let main7 = p.intern_frame_named("main", "m", Some("a.c"), 7, 1, false);
        let main4 = p.intern_frame_named("main", "m", Some("a.c"), 4, 2, false);
        let f = p.intern_frame_named("f", "m", Some("a.c"), 20, 3, false);
        let g = p.intern_frame_named("g", "m", Some("a.c"), 30, 4, false);
        let s7 = p.intern_stack(None, main7);
        let s4 = p.intern_stack(None, main4);
        let sf = p.intern_stack(Some(s7), f);
        let sg = p.intern_stack(Some(s4), g);
        p.add_sample(0, t, 0, 1, Some(sf));
        p.add_sample(1, t, 0, 1, Some(sg));
        let mut out = Vec::new();
        write(&p, &mut out).unwrap();
        let doc: serde_json::Value = serde_json::from_slice(&out).unwrap();
        let frames = doc["shared"]["frames"].as_array().unwrap();
        let mains: Vec<&serde_json::Value> =
            frames.iter().filter(|v| v["name"] == "main").collect();
        assert_eq!(
            mains,
            vec![&json!({"name": "main", "file": "a.c", "line": 4})]
        );
        // Both samples' stacks start at that one frame.
        let samples = doc["profiles"][0]["samples"].as_array().unwrap();
        let root = |i: usize| samples[i][0].clone();
        assert_eq!(root(0), root(1));
    }
}
