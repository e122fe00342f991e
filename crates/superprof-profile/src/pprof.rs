//! pprof: a gzipped `profile.proto` (github.com/google/pprof/proto/profile.proto), encoded by
//! hand — the message set is small and fixed. Each distinct address is a Location whose Lines
//! are its inline chain (innermost first, as pprof wants), so `go tool pprof` shows file:line
//! and inlined functions.

use std::collections::HashMap;
use std::io::{self, Write};

use flate2::write::GzEncoder;
use flate2::Compression;

use crate::proto::{Pb, Strings};
use crate::{FrameId, Profile, StrId};

/// The samples of one stack, thread and kind as one, their weights summed, in the order first
/// seen: pprof's tools add samples up anyway, and the file (built whole in memory) so grows
/// with distinct stacks, not samples.
fn aggregated(profile: &Profile) -> Vec<crate::Sample> {
    let mut index: HashMap<(Option<crate::StackId>, u32, crate::SampleKind), usize> =
        HashMap::new();
    let mut out: Vec<crate::Sample> = Vec::new();
    for s in &profile.samples {
        let i = *index.entry((s.stack, s.thread, s.kind)).or_insert_with(|| {
            out.push(crate::Sample { weight: 0, ..s });
            out.len() - 1
        });
        out[i].weight = out[i].weight.saturating_add(s.weight);
    }
    out
}

/// Encodes the profile (uncompressed protobuf bytes).
pub fn encode(profile: &Profile) -> Vec<u8> {
    let mut out = Pb::default();
    let mut strings = Strings::new();
    let period_ns = if profile.meta.frequency > 0 {
        1_000_000_000 / profile.meta.frequency as i64
    } else {
        1
    };
    // sample_type: samples/count, cpu/nanoseconds; with off-CPU samples also
    // off-cpu/nanoseconds and wall/nanoseconds (their sum, the default).
    let off_cpu = profile.has_off_cpu();
    let types: &[(&str, &str)] = if off_cpu {
        &[
            ("samples", "count"),
            ("cpu", "nanoseconds"),
            ("off-cpu", "nanoseconds"),
            ("wall", "nanoseconds"),
        ]
    } else {
        &[("samples", "count"), ("cpu", "nanoseconds")]
    };
    for &(ty, unit) in types {
        let mut vt = Pb::default();
        vt.int(1, strings.id(ty));
        vt.int(2, strings.id(unit));
        out.msg(1, vt);
    }

    // Mappings: one per module.
    let mut mapping_of: HashMap<StrId, u64> = HashMap::new();
    // Functions: one per (name, file).
    let mut function_of: HashMap<(StrId, Option<StrId>), u64> = HashMap::new();
    let mut functions = Pb::default();
    // Locations: one per (module, address) with its inline chain.
    let mut location_of: HashMap<Vec<FrameId>, u64> = HashMap::new();
    let mut locations = Pb::default();
    let mut mappings = Pb::default();

    let mut samples = Pb::default();
    let mut stack_locs: HashMap<Option<crate::StackId>, Vec<u64>> = HashMap::new();
    let tid_key = strings.id("tid");
    let pid_key = strings.id("pid");
    let thread_key = strings.id("thread");
    let kind_key = strings.id("kind");
    for s in aggregated(profile) {
        if let std::collections::hash_map::Entry::Vacant(slot) = stack_locs.entry(s.stack) {
            let frames: Vec<FrameId> = profile.stack_frames(s.stack).collect();
            let mut locs = Vec::new();
            // Leaf first; a location is a run of inlined frames ended by a non-inlined one.
            let mut start = 0;
            for i in 0..frames.len() {
                let f = profile.frame(frames[i]);
                let next_same = frames
                    .get(i + 1)
                    .map(|&n| profile.frame(n))
                    .is_some_and(|n| f.inlined && n.address == f.address && n.module == f.module);
                if next_same {
                    continue;
                }
                let chain = frames[start..=i].to_vec();
                start = i + 1;
                let next_id = location_of.len() as u64 + 1;
                let id = *location_of.entry(chain.clone()).or_insert_with(|| {
                    let outer = profile.frame(*chain.last().expect("non-empty"));
                    let next_mapping = mapping_of.len() as u64 + 1;
                    let mapping = *mapping_of.entry(outer.module).or_insert_with(|| {
                        let mut m = Pb::default();
                        m.uint(1, next_mapping);
                        m.int(5, strings.id(profile.str(outer.module)));
                        m.bool(7, true);
                        m.bool(8, true);
                        m.bool(9, true);
                        m.bool(10, true);
                        mappings.msg(3, m);
                        next_mapping
                    });
                    let mut loc = Pb::default();
                    loc.uint(1, next_id);
                    loc.uint(2, mapping);
                    loc.uint(3, outer.address);
                    for &fid in &chain {
                        let fr = profile.frame(fid);
                        let next_fn = function_of.len() as u64 + 1;
                        let func =
                            *function_of
                                .entry((fr.function, fr.file))
                                .or_insert_with(|| {
                                    let mut fm = Pb::default();
                                    fm.uint(1, next_fn);
                                    let name = strings.id(profile.str(fr.function));
                                    fm.int(2, name);
                                    fm.int(3, name);
                                    if let Some(file) = fr.file {
                                        fm.int(4, strings.id(profile.str(file)));
                                    }
                                    functions.msg(5, fm);
                                    next_fn
                                });
                        let mut line = Pb::default();
                        line.uint(1, func);
                        line.int(2, fr.line as i64);
                        loc.msg(4, line);
                    }
                    locations.msg(4, loc);
                    next_id
                });
                locs.push(id);
            }
            slot.insert(locs);
        }
        let t = &profile.threads[s.thread as usize];
        let mut sm = Pb::default();
        sm.packed(1, stack_locs[&s.stack].iter().copied());
        let ns = s.weight.saturating_mul(period_ns as u64);
        if off_cpu {
            let (on, off) = if s.kind.is_off_cpu() {
                (0, ns)
            } else {
                (ns, 0)
            };
            sm.packed(2, [s.weight, on, off, ns].into_iter());
            let mut l = Pb::default();
            l.int(1, kind_key);
            l.int(2, strings.id(s.kind.as_str()));
            sm.msg(3, l);
        } else {
            sm.packed(2, [s.weight, ns].into_iter());
        }
        let mut l = Pb::default();
        l.int(1, thread_key);
        l.int(2, strings.id(profile.str(t.name)));
        sm.msg(3, l);
        let mut l = Pb::default();
        l.int(1, tid_key);
        l.int(3, t.tid as i64);
        sm.msg(3, l);
        let mut l = Pb::default();
        l.int(1, pid_key);
        l.int(3, t.pid as i64);
        sm.msg(3, l);
        samples.msg(2, sm);
    }
    out.0.extend_from_slice(&samples.0);
    out.0.extend_from_slice(&mappings.0);
    out.0.extend_from_slice(&locations.0);
    out.0.extend_from_slice(&functions.0);
    let period_type = {
        let mut vt = Pb::default();
        vt.int(1, strings.id("cpu"));
        vt.int(2, strings.id("nanoseconds"));
        vt
    };
    let comment = profile.meta.command.join(" ");
    let comment_id = (!comment.is_empty()).then(|| strings.id(&comment));
    let default_type = strings.id(if off_cpu { "wall" } else { "cpu" });
    for s in &strings.table {
        out.bytes(6, s.as_bytes());
    }
    out.int(9, profile.meta.start_time_unix_ns as i64);
    out.int(10, profile.meta.duration_ns as i64);
    out.msg(11, period_type);
    out.int(12, period_ns);
    if let Some(c) = comment_id {
        out.key(13, 0);
        out.varint(c as u64);
    }
    out.int(14, default_type);
    out.0
}

/// Writes the gzipped profile.
pub fn write(profile: &Profile, w: &mut dyn Write) -> io::Result<()> {
    let mut gz = GzEncoder::new(w, Compression::default());
    gz.write_all(&encode(profile))?;
    gz.finish()?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::proto::{fields, Field};
    use crate::{Frame, SampleKind};

    /// The varints of a packed field.
    fn packed(b: &[u8]) -> Vec<u64> {
        let mut out = Vec::new();
        let (mut v, mut shift) = (0u64, 0);
        for &byte in b {
            v |= u64::from(byte & 0x7f) << shift;
            shift += 7;
            if byte & 0x80 == 0 {
                out.push(v);
                (v, shift) = (0, 0);
            }
        }
        out
    }

    #[test]
    fn a_profile_encodes_as_pprof_reads_it() {
        let mut p = Profile::default();
        p.meta.frequency = 100;
        p.meta.duration_ns = 2_000_000_000;
        let frame = |p: &mut Profile, name: &str, address: u64| {
            let f = Frame {
                function: p.intern_str(name),
                module: p.intern_str("/bin/prog"),
                file: Some(p.intern_str("prog.c")),
                line: 7,
                address,
                inlined: false,
            };
            p.intern_frame(f)
        };
        let main = frame(&mut p, "main", 0x10);
        let work = frame(&mut p, "work", 0x20);
        let t = p.add_thread(5, 6, "prog");
        let root = p.intern_stack(None, main);
        let leaf = p.intern_stack(Some(root), work);
        p.add_sample_of(SampleKind::OnCpu, 0, t, 0, 3, Some(leaf));
        let bytes = encode(&p);
        let top = fields(&bytes).unwrap();
        let strings: Vec<&[u8]> = top
            .iter()
            .filter_map(|f| match f {
                Field::Bytes(6, s) => Some(*s),
                _ => None,
            })
            .collect();
        assert_eq!(strings[0], b"", "string_table[0] is empty");
        let s = |i: u64| String::from_utf8_lossy(strings[i as usize]).into_owned();
        // sample_type: samples/count, cpu/nanoseconds.
        let types: Vec<(String, String)> = top
            .iter()
            .filter_map(|f| match f {
                Field::Bytes(1, b) => {
                    let v = fields(b).unwrap();
                    let get = |n| {
                        v.iter().find_map(|x| match x {
                            Field::Varint(k, i) if *k == n => Some(*i),
                            _ => None,
                        })
                    };
                    Some((s(get(1)?), s(get(2)?)))
                }
                _ => None,
            })
            .collect();
        assert_eq!(
            types,
            [
                ("samples".into(), "count".into()),
                ("cpu".into(), "nanoseconds".into())
            ]
        );
        // One sample: two locations, leaf first; 3 samples of 10 ms each.
        let sample = top
            .iter()
            .find_map(|f| match f {
                Field::Bytes(2, b) => Some(fields(b).unwrap()),
                _ => None,
            })
            .unwrap();
        let locs = sample
            .iter()
            .find_map(|f| match f {
                Field::Bytes(1, b) => Some(packed(b)),
                _ => None,
            })
            .unwrap();
        let values = sample
            .iter()
            .find_map(|f| match f {
                Field::Bytes(2, b) => Some(packed(b)),
                _ => None,
            })
            .unwrap();
        assert_eq!(values, [3, 30_000_000]);
        assert_eq!(locs.len(), 2);
        // Each location's function, by its name: work, then main.
        let names: Vec<String> = locs
            .iter()
            .map(|&id| {
                let loc = top
                    .iter()
                    .filter_map(|f| match f {
                        Field::Bytes(4, b) => Some(fields(b).unwrap()),
                        _ => None,
                    })
                    .find(|l| l.contains(&Field::Varint(1, id)))
                    .unwrap();
                let line = loc
                    .iter()
                    .find_map(|f| match f {
                        Field::Bytes(4, b) => Some(fields(b).unwrap()),
                        _ => None,
                    })
                    .unwrap();
                assert!(line.contains(&Field::Varint(2, 7)), "the line number");
                let Field::Varint(1, fid) = line[0] else {
                    panic!("{line:?}")
                };
                let func = top
                    .iter()
                    .filter_map(|f| match f {
                        Field::Bytes(5, b) => Some(fields(b).unwrap()),
                        _ => None,
                    })
                    .find(|g| g.contains(&Field::Varint(1, fid)))
                    .unwrap();
                let name = func
                    .iter()
                    .find_map(|f| match f {
                        Field::Varint(2, n) => Some(*n),
                        _ => None,
                    })
                    .unwrap();
                s(name)
            })
            .collect();
        assert_eq!(names, ["work", "main"]);
        // The period: 10 ms of cpu/nanoseconds.
        assert!(top.contains(&Field::Varint(12, 10_000_000)));
    }
}
