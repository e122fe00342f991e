//! pprof: a gzipped `profile.proto` (github.com/google/pprof/proto/profile.proto), its
//! messages in [`crate::pprof_pb`], encoded by prost. Each distinct address is a Location whose
//! Lines are its inline chain (innermost first, as pprof wants), so `go tool pprof` shows
//! file:line and inlined functions.

use std::collections::HashMap;
use std::io::{self, Write};

use flate2::write::GzEncoder;
use flate2::Compression;
use prost::Message;

use crate::pprof_pb as pb;
use crate::strings::Strings;
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

/// A string label.
fn label(key: i64, str: i64) -> pb::Label {
    pb::Label {
        key,
        str,
        ..Default::default()
    }
}

/// A numeric label.
fn num_label(key: i64, num: i64) -> pb::Label {
    pb::Label {
        key,
        num,
        ..Default::default()
    }
}

/// The tables a pprof's samples refer to, filled as samples come: mappings (one per module),
/// functions (one per name and file), locations (one per inline chain at an address), and
/// each stack's locations, leaf first.
struct Tables<'a> {
    profile: &'a Profile,
    out: pb::Profile,
    strings: Strings,
    mapping_of: HashMap<StrId, u64>,
    function_of: HashMap<(StrId, Option<StrId>), u64>,
    location_of: HashMap<Vec<FrameId>, u64>,
    stack_locs: HashMap<Option<crate::StackId>, Vec<u64>>,
}

impl Tables<'_> {
    /// The locations of a stack, leaf first: a location is a run of inlined frames ended by
    /// the one they were inlined into.
    fn stack(&mut self, stack: Option<crate::StackId>) -> Vec<u64> {
        if let Some(locs) = self.stack_locs.get(&stack) {
            return locs.clone();
        }
        let profile = self.profile;
        let frames: Vec<FrameId> = profile.stack_frames(stack).collect();
        let mut locs = Vec::new();
        let mut start = 0;
        for i in 0..frames.len() {
            let f = profile.frame(frames[i]);
            let next_same = frames
                .get(i + 1)
                .map(|&n| profile.frame(n))
                .is_some_and(|n| f.inlined && n.address == f.address && n.module == f.module);
            if !next_same {
                locs.push(self.location(&frames[start..=i]));
                start = i + 1;
            }
        }
        self.stack_locs.insert(stack, locs.clone());
        locs
    }

    fn location(&mut self, chain: &[FrameId]) -> u64 {
        if let Some(&id) = self.location_of.get(chain) {
            return id;
        }
        let profile = self.profile;
        let outer = profile.frame(*chain.last().expect("non-empty"));
        let mapping_id = self.mapping(outer.module);
        let id = self.location_of.len() as u64 + 1;
        let line = chain
            .iter()
            .map(|&fid| {
                let fr = profile.frame(fid);
                pb::Line {
                    function_id: self.function(fr.function, fr.file),
                    line: i64::from(fr.line),
                    ..Default::default()
                }
            })
            .collect();
        self.out.location.push(pb::Location {
            id,
            mapping_id,
            address: outer.address,
            line,
            ..Default::default()
        });
        self.location_of.insert(chain.to_vec(), id);
        id
    }

    fn mapping(&mut self, module: StrId) -> u64 {
        if let Some(&id) = self.mapping_of.get(&module) {
            return id;
        }
        let id = self.mapping_of.len() as u64 + 1;
        self.out.mapping.push(pb::Mapping {
            id,
            filename: self.strings.id(self.profile.str(module)),
            has_functions: true,
            has_filenames: true,
            has_line_numbers: true,
            has_inline_frames: true,
            ..Default::default()
        });
        self.mapping_of.insert(module, id);
        id
    }

    fn function(&mut self, function: StrId, file: Option<StrId>) -> u64 {
        if let Some(&id) = self.function_of.get(&(function, file)) {
            return id;
        }
        let id = self.function_of.len() as u64 + 1;
        let name = self.strings.id(self.profile.str(function));
        let filename = file.map_or(0, |f| self.strings.id(self.profile.str(f)));
        self.out.function.push(pb::Function {
            id,
            name,
            system_name: name,
            filename,
            ..Default::default()
        });
        self.function_of.insert((function, file), id);
        id
    }
}

/// The pprof message of the profile.
pub fn message(profile: &Profile) -> pb::Profile {
    let mut t = Tables {
        profile,
        out: pb::Profile::default(),
        strings: Strings::new(),
        mapping_of: HashMap::new(),
        function_of: HashMap::new(),
        location_of: HashMap::new(),
        stack_locs: HashMap::new(),
    };
    let period_ns = if profile.meta.frequency > 0 {
        1_000_000_000 / i64::from(profile.meta.frequency)
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
        let vt = pb::ValueType {
            r#type: t.strings.id(ty),
            unit: t.strings.id(unit),
        };
        t.out.sample_type.push(vt);
    }
    let tid_key = t.strings.id("tid");
    let pid_key = t.strings.id("pid");
    let thread_key = t.strings.id("thread");
    let kind_key = t.strings.id("kind");
    for s in aggregated(profile) {
        let thread = &profile.threads[s.thread as usize];
        let weight = i64::try_from(s.weight).unwrap_or(i64::MAX);
        let ns = weight.saturating_mul(period_ns);
        let mut sample = pb::Sample {
            location_id: t.stack(s.stack),
            ..Default::default()
        };
        if off_cpu {
            let (on, off) = if s.kind.is_off_cpu() {
                (0, ns)
            } else {
                (ns, 0)
            };
            sample.value = vec![weight, on, off, ns];
            let kind = t.strings.id(s.kind.as_str());
            sample.label.push(label(kind_key, kind));
        } else {
            sample.value = vec![weight, ns];
        }
        let name = t.strings.id(profile.str(thread.name));
        sample.label.push(label(thread_key, name));
        sample.label.push(num_label(tid_key, i64::from(thread.tid)));
        sample.label.push(num_label(pid_key, i64::from(thread.pid)));
        t.out.sample.push(sample);
    }
    let mut out = t.out;
    let mut strings = t.strings;
    out.period_type = Some(pb::ValueType {
        r#type: strings.id("cpu"),
        unit: strings.id("nanoseconds"),
    });
    let comment = profile.meta.command.join(" ");
    if !comment.is_empty() {
        out.comment.push(strings.id(&comment));
    }
    out.default_sample_type = strings.id(if off_cpu { "wall" } else { "cpu" });
    out.time_nanos = i64::try_from(profile.meta.start_time_unix_ns).unwrap_or(i64::MAX);
    out.duration_nanos = i64::try_from(profile.meta.duration_ns).unwrap_or(i64::MAX);
    out.period = period_ns;
    out.string_table = strings.table;
    out
}

/// Encodes the profile (uncompressed protobuf bytes).
pub fn encode(profile: &Profile) -> Vec<u8> {
    message(profile).encode_to_vec()
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
    use crate::{Frame, SampleKind};

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
        let got = pb::Profile::decode(&encode(&p)[..]).unwrap();
        assert_eq!(got.string_table[0], "", "string_table[0] is empty");
        let s = |i: i64| got.string_table[i as usize].as_str();
        // sample_type: samples/count, cpu/nanoseconds.
        let types: Vec<(&str, &str)> = got
            .sample_type
            .iter()
            .map(|t| (s(t.r#type), s(t.unit)))
            .collect();
        assert_eq!(types, [("samples", "count"), ("cpu", "nanoseconds")]);
        // One sample: two locations, leaf first; 3 samples of 10 ms each.
        assert_eq!(got.sample.len(), 1);
        let sample = &got.sample[0];
        assert_eq!(sample.value, [3, 30_000_000]);
        // Each location's function, by its name: work, then main, at line 7.
        let names: Vec<&str> = sample
            .location_id
            .iter()
            .map(|&id| {
                let loc = got.location.iter().find(|l| l.id == id).unwrap();
                assert_eq!(loc.line[0].line, 7, "the line number");
                let f = got
                    .function
                    .iter()
                    .find(|f| f.id == loc.line[0].function_id)
                    .unwrap();
                s(f.name)
            })
            .collect();
        assert_eq!(names, ["work", "main"]);
        // Its labels: the thread by name, its ids as numbers.
        let labels: Vec<(&str, &str, i64)> = sample
            .label
            .iter()
            .map(|l| (s(l.key), s(l.str), l.num))
            .collect();
        assert_eq!(
            labels,
            [("thread", "prog", 0), ("tid", "", 6), ("pid", "", 5)]
        );
        // The period: 10 ms of cpu/nanoseconds.
        assert_eq!(got.period, 10_000_000);
        assert_eq!(
            got.period_type.map(|t| (t.r#type, t.unit)),
            Some((
                got.string_table.iter().position(|x| x == "cpu").unwrap() as i64,
                got.string_table
                    .iter()
                    .position(|x| x == "nanoseconds")
                    .unwrap() as i64
            ))
        );
    }
}
