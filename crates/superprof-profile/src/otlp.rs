//! OTLP profiles: an `ExportProfilesServiceRequest` of
//! `opentelemetry.proto.collector.profiles.v1development`, pinned to the protocol's v1.10.0
//! definitions (the profiles signal is still in development: each release may renumber it).
//! One resource (its attributes as the caller gives them), one scope (superprof), one
//! profile per kind of sample: `cpu`/`nanoseconds`, and `off_cpu`/`nanoseconds` when there are
//! off-CPU samples. The dictionary holds the mappings (one per module), locations (an address
//! with its inline chain, innermost line first, as in pprof), functions, stacks (leaf first)
//! and the per-sample attributes `thread.id`, `thread.name` and `process.pid`, each table
//! starting with its zero entry as the protocol requires.

use std::collections::HashMap;

use opentelemetry_proto::tonic::collector::profiles::v1development::{
    ExportProfilesServiceRequest, ExportProfilesServiceResponse,
};
use opentelemetry_proto::tonic::common::v1::{any_value, AnyValue, InstrumentationScope, KeyValue};
use opentelemetry_proto::tonic::profiles::v1development as pb;
use opentelemetry_proto::tonic::resource::v1::Resource;
use prost::Message;

use crate::strings::Strings;
use crate::{FrameId, Profile, StackId, StrId};

/// The protocol version these messages follow.
pub const VERSION: &str = "OTLP v1.10.0 profiles v1development";

/// An index into one of the dictionary's tables, as the protocol has them (`int32`).
fn index(i: usize) -> i32 {
    i32::try_from(i).unwrap_or(i32::MAX)
}

/// The dictionary being built, and its tables' indices (each table starts with its zero
/// entry, an empty message, as the protocol requires).
struct Dictionary {
    strings: Strings,
    dict: pb::ProfilesDictionary,
    mapping_of: HashMap<StrId, i32>,
    location_of: HashMap<Vec<FrameId>, i32>,
    function_of: HashMap<(StrId, Option<StrId>), i32>,
    stack_of: HashMap<Option<StackId>, i32>,
    attribute_of: HashMap<(i32, String), i32>,
}

impl Dictionary {
    fn new() -> Dictionary {
        Dictionary {
            strings: Strings::new(),
            dict: pb::ProfilesDictionary {
                mapping_table: vec![pb::Mapping::default()],
                location_table: vec![pb::Location::default()],
                function_table: vec![pb::Function::default()],
                link_table: vec![pb::Link::default()],
                attribute_table: vec![pb::KeyValueAndUnit::default()],
                stack_table: vec![pb::Stack::default()],
                ..Default::default()
            },
            mapping_of: HashMap::new(),
            location_of: HashMap::new(),
            function_of: HashMap::new(),
            stack_of: HashMap::new(),
            attribute_of: HashMap::new(),
        }
    }

    /// A string's index in the string table.
    fn str(&mut self, s: &str) -> i32 {
        i32::try_from(self.strings.id(s)).unwrap_or(i32::MAX)
    }

    fn attribute(&mut self, key: &str, value: any_value::Value) -> i32 {
        let k = self.str(key);
        let id = match &value {
            any_value::Value::IntValue(i) => format!("i{i}"),
            v => format!("s{v:?}"),
        };
        if let Some(&i) = self.attribute_of.get(&(k, id.clone())) {
            return i;
        }
        let i = index(self.dict.attribute_table.len());
        self.dict.attribute_table.push(pb::KeyValueAndUnit {
            key_strindex: k,
            value: Some(AnyValue { value: Some(value) }),
            unit_strindex: 0,
        });
        self.attribute_of.insert((k, id), i);
        i
    }

    fn mapping(&mut self, profile: &Profile, module: StrId) -> i32 {
        if let Some(&i) = self.mapping_of.get(&module) {
            return i;
        }
        let i = index(self.dict.mapping_table.len());
        let filename_strindex = self.str(profile.str(module));
        self.dict.mapping_table.push(pb::Mapping {
            filename_strindex,
            ..Default::default()
        });
        self.mapping_of.insert(module, i);
        i
    }

    fn function(&mut self, profile: &Profile, name: StrId, file: Option<StrId>) -> i32 {
        if let Some(&i) = self.function_of.get(&(name, file)) {
            return i;
        }
        let i = index(self.dict.function_table.len());
        let n = self.str(profile.str(name));
        let filename_strindex = file.map_or(0, |f| self.str(profile.str(f)));
        self.dict.function_table.push(pb::Function {
            name_strindex: n,
            system_name_strindex: n,
            filename_strindex,
            start_line: 0,
        });
        self.function_of.insert((name, file), i);
        i
    }

    /// A location: a run of inlined frames (innermost first) ended by the frame they were
    /// inlined into.
    fn location(&mut self, profile: &Profile, chain: &[FrameId]) -> i32 {
        if let Some(&i) = self.location_of.get(chain) {
            return i;
        }
        let outer = profile.frame(*chain.last().expect("a location has a frame"));
        let mapping_index = self.mapping(profile, outer.module);
        let lines = chain
            .iter()
            .map(|&fid| {
                let fr = profile.frame(fid);
                pb::Line {
                    function_index: self.function(profile, fr.function, fr.file),
                    line: i64::from(fr.line),
                    column: 0,
                }
            })
            .collect();
        let i = index(self.dict.location_table.len());
        self.dict.location_table.push(pb::Location {
            mapping_index,
            address: outer.address,
            lines,
            attribute_indices: Vec::new(),
        });
        self.location_of.insert(chain.to_vec(), i);
        i
    }

    fn stack(&mut self, profile: &Profile, stack: Option<StackId>) -> i32 {
        if let Some(&i) = self.stack_of.get(&stack) {
            return i;
        }
        let frames: Vec<FrameId> = profile.stack_frames(stack).collect();
        let mut location_indices = Vec::new();
        let mut start = 0;
        for i in 0..frames.len() {
            let f = profile.frame(frames[i]);
            let inlined_into_next = frames
                .get(i + 1)
                .map(|&n| profile.frame(n))
                .is_some_and(|n| f.inlined && n.address == f.address && n.module == f.module);
            if inlined_into_next {
                continue;
            }
            location_indices.push(self.location(profile, &frames[start..=i]));
            start = i + 1;
        }
        let i = index(self.dict.stack_table.len());
        self.dict.stack_table.push(pb::Stack { location_indices });
        self.stack_of.insert(stack, i);
        i
    }

    fn finish(mut self) -> pb::ProfilesDictionary {
        self.dict.string_table = self.strings.table;
        self.dict
    }
}

/// A 16-byte profile id, never all zeroes: from the recording's start, its duration and
/// its samples (two exports of one recording share it, as they should).
fn profile_id(profile: &Profile, kind: u8) -> Vec<u8> {
    fn mix(h: u64, v: u64) -> u64 {
        v.to_le_bytes()
            .iter()
            .fold(h, |h, &b| (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3))
    }
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for v in [
        profile.meta.start_time_unix_ns,
        profile.meta.duration_ns,
        profile.samples.len() as u64,
        u64::from(kind),
    ] {
        h = mix(h, v);
    }
    let a = h;
    let h = mix(h, 0x5eed);
    let mut id = a.to_le_bytes().to_vec();
    id.extend_from_slice(&(h | 1).to_le_bytes());
    id
}

/// Encodes the profile as an ExportProfilesServiceRequest with these resource attributes.
pub fn export_request(profile: &Profile, resource: &[(String, String)]) -> Vec<u8> {
    export_message(profile, resource).encode_to_vec()
}

/// The profile as an ExportProfilesServiceRequest with these resource attributes.
pub fn export_message(
    profile: &Profile,
    resource: &[(String, String)],
) -> ExportProfilesServiceRequest {
    let mut dict = Dictionary::new();
    let period_ns = if profile.meta.frequency > 0 {
        1_000_000_000 / i64::from(profile.meta.frequency)
    } else {
        1
    };
    // Samples of one stack and thread are one sample (values: their sum), per kind.
    let mut sums: [HashMap<(i32, u32), i64>; 2] = [HashMap::new(), HashMap::new()];
    let mut order: [Vec<(i32, u32)>; 2] = [Vec::new(), Vec::new()];
    for s in &profile.samples {
        let stack = dict.stack(profile, s.stack);
        let k = usize::from(s.kind.is_off_cpu());
        let v = i64::try_from(s.weight)
            .unwrap_or(i64::MAX)
            .saturating_mul(period_ns);
        let e = sums[k].entry((stack, s.thread)).or_insert_with(|| {
            order[k].push((stack, s.thread));
            0
        });
        *e = e.saturating_add(v);
    }
    let mut thread_attrs: HashMap<u32, Vec<i32>> = HashMap::new();
    let mut profiles = Vec::new();
    for (k, (kind, unit)) in [("cpu", "nanoseconds"), ("off_cpu", "nanoseconds")]
        .into_iter()
        .enumerate()
    {
        if order[k].is_empty() && !(k == 0 && order[1].is_empty()) {
            continue;
        }
        let sample_type = Some(pb::ValueType {
            type_strindex: dict.str(kind),
            unit_strindex: dict.str(unit),
        });
        let mut samples = Vec::new();
        for &(stack, thread) in &order[k] {
            let attrs = thread_attrs.entry(thread).or_insert_with(|| {
                let t = &profile.threads[thread as usize];
                vec![
                    dict.attribute("thread.id", any_value::Value::IntValue(i64::from(t.tid))),
                    dict.attribute(
                        "thread.name",
                        any_value::Value::StringValue(profile.str(t.name).to_owned()),
                    ),
                    dict.attribute("process.pid", any_value::Value::IntValue(i64::from(t.pid))),
                ]
            });
            samples.push(pb::Sample {
                stack_index: stack,
                attribute_indices: attrs.clone(),
                link_index: 0,
                values: vec![sums[k][&(stack, thread)]],
                timestamps_unix_nano: Vec::new(),
            });
        }
        let period_type = Some(pb::ValueType {
            type_strindex: dict.str("cpu"),
            unit_strindex: dict.str("nanoseconds"),
        });
        profiles.push(pb::Profile {
            sample_type,
            samples,
            time_unix_nano: profile.meta.start_time_unix_ns,
            duration_nano: profile.meta.duration_ns,
            period_type,
            period: period_ns,
            profile_id: profile_id(profile, k as u8),
            ..Default::default()
        });
    }
    request(profile, resource, profiles, dict.finish())
}

/// The request around `profiles`: one resource with these attributes, one scope
/// (superprof, its version), and the dictionary.
fn request(
    profile: &Profile,
    resource: &[(String, String)],
    profiles: Vec<pb::Profile>,
    dictionary: pb::ProfilesDictionary,
) -> ExportProfilesServiceRequest {
    let scope = InstrumentationScope {
        name: "superprof".to_owned(),
        version: profile.meta.version.clone(),
        ..Default::default()
    };
    let attributes = resource
        .iter()
        .map(|(k, v)| KeyValue {
            key: k.clone(),
            value: Some(AnyValue {
                value: Some(any_value::Value::StringValue(v.clone())),
            }),
            ..Default::default()
        })
        .collect();
    ExportProfilesServiceRequest {
        resource_profiles: vec![pb::ResourceProfiles {
            resource: Some(Resource {
                attributes,
                ..Default::default()
            }),
            scope_profiles: vec![pb::ScopeProfiles {
                scope: Some(scope),
                profiles,
                schema_url: String::new(),
            }],
            schema_url: String::new(),
        }],
        dictionary: Some(dictionary),
    }
}

/// What an ExportProfilesServiceResponse says: its partial_success, if profiles were rejected
/// (a refusal: the same request would be rejected again). `None` for an answer that does not
/// decode, or says nothing was rejected. The message is cut at 300 characters.
pub fn rejection(response: &[u8]) -> Option<String> {
    let partial = ExportProfilesServiceResponse::decode(response)
        .ok()?
        .partial_success?;
    let message: String = partial.error_message.chars().take(300).collect();
    let rejected = partial.rejected_profiles;
    (rejected > 0 || !message.is_empty()).then(|| {
        format!(
            "{rejected} profile(s) rejected{}{message}",
            if message.is_empty() { "" } else { ": " }
        )
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use opentelemetry_proto::tonic::collector::profiles::v1development::ExportProfilesPartialSuccess;

    #[test]
    fn a_partial_success_is_a_rejection() {
        let answer = |rejected_profiles, error_message: &str| {
            ExportProfilesServiceResponse {
                partial_success: Some(ExportProfilesPartialSuccess {
                    rejected_profiles,
                    error_message: error_message.to_owned(),
                }),
            }
            .encode_to_vec()
        };
        assert_eq!(
            rejection(&answer(2, "too old")).as_deref(),
            Some("2 profile(s) rejected: too old")
        );
        assert_eq!(rejection(&answer(0, "")), None);
        assert_eq!(rejection(&[]), None);
        // Hostile: cut short, or a length past its end.
        assert_eq!(rejection(&answer(1, "x")[..3]), None);
        assert_eq!(rejection(&[0x0a, 0x7f, 1]), None);
        let long = "y".repeat(1000);
        assert_eq!(rejection(&answer(1, &long)).unwrap().len(), 300 + 23);
    }
}
