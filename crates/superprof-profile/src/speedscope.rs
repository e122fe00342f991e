//! speedscope's file format (<https://www.speedscope.app/file-format-schema.json>): one
//! `sampled` profile per thread, frames shared, stacks root first, weights in nanoseconds.

use std::collections::HashMap;
use std::io::{self, Write};

use serde_json::{json, Value};

use crate::{FrameId, Profile};

/// Writes `profile` as a speedscope JSON file.
pub fn write(profile: &Profile, w: &mut dyn Write) -> io::Result<()> {
    let period_ns = if profile.meta.frequency > 0 {
        1e9 / profile.meta.frequency as f64
    } else {
        1.0
    };
    let mut frames: Vec<Value> = Vec::new();
    let mut frame_index: HashMap<(crate::StrId, Option<crate::StrId>, u32), usize> = HashMap::new();
    let mut index_of = |fid: FrameId, frames: &mut Vec<Value>| -> usize {
        let f = profile.frame(fid);
        *frame_index
            .entry((f.function, f.file, f.line))
            .or_insert_with(|| {
                let mut v = json!({ "name": profile.str(f.function) });
                if let Some(file) = f.file {
                    v["file"] = json!(profile.str(file));
                    if f.line > 0 {
                        v["line"] = json!(f.line);
                    }
                }
                frames.push(v);
                frames.len() - 1
            })
    };
    let mut profiles = Vec::new();
    for (t, thread) in profile.threads.iter().enumerate() {
        let mut samples = Vec::new();
        let mut weights = Vec::new();
        for s in profile.samples.iter().filter(|s| s.thread as usize == t) {
            let mut stack: Vec<usize> = profile
                .stack_frames(s.stack)
                .map(|f| index_of(f, &mut frames))
                .collect();
            stack.reverse();
            samples.push(stack);
            weights.push(s.weight as f64 * period_ns);
        }
        if samples.is_empty() {
            continue;
        }
        let end: f64 = weights.iter().sum();
        profiles.push(json!({
            "type": "sampled",
            "name": format!("{} ({})", profile.str(thread.name), thread.tid),
            "unit": "nanoseconds",
            "startValue": 0,
            "endValue": end,
            "samples": samples,
            "weights": weights,
        }));
    }
    let doc = json!({
        "$schema": "https://www.speedscope.app/file-format-schema.json",
        "shared": { "frames": frames },
        "profiles": profiles,
        "name": profile.meta.command.join(" "),
        "activeProfileIndex": 0,
        "exporter": format!("superprof {}", profile.meta.version),
    });
    serde_json::to_writer(&mut *w, &doc)?;
    Ok(())
}
