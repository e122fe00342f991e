//! pprof files read back as `go tool pprof` reads them (github.com/google/pprof/proto/
//! profile.proto, the messages and fields the tests look at).

use std::collections::BTreeMap;
use std::io::Read;

use prost::Message;

// pprof's messages, as much as read here (github.com/google/pprof/proto/profile.proto).
#[derive(Clone, PartialEq, Message)]
pub struct PProfile {
    #[prost(message, repeated, tag = "2")]
    pub sample: Vec<PSample>,
    #[prost(message, repeated, tag = "4")]
    pub location: Vec<PLocation>,
    #[prost(message, repeated, tag = "5")]
    pub function: Vec<PFunction>,
    #[prost(string, repeated, tag = "6")]
    pub string_table: Vec<String>,
}
#[derive(Clone, PartialEq, Message)]
pub struct PSample {
    #[prost(uint64, repeated, tag = "1")]
    pub location_id: Vec<u64>,
    #[prost(int64, repeated, tag = "2")]
    pub value: Vec<i64>,
    #[prost(message, repeated, tag = "3")]
    pub label: Vec<PLabel>,
}
#[derive(Clone, PartialEq, Message)]
pub struct PLabel {
    #[prost(int64, tag = "1")]
    pub key: i64,
    #[prost(int64, tag = "2")]
    pub str: i64,
}
#[derive(Clone, PartialEq, Message)]
pub struct PLocation {
    #[prost(uint64, tag = "1")]
    pub id: u64,
    #[prost(message, repeated, tag = "4")]
    pub line: Vec<PLine>,
}
#[derive(Clone, PartialEq, Message)]
pub struct PLine {
    #[prost(uint64, tag = "1")]
    pub function_id: u64,
}
#[derive(Clone, PartialEq, Message)]
pub struct PFunction {
    #[prost(uint64, tag = "1")]
    pub id: u64,
    #[prost(int64, tag = "2")]
    pub name: i64,
}

/// Each sample of a gzipped pprof: its `thread` label, its functions root first (each
/// location's inline chain included), its first value (samples).
pub fn samples(gz: &[u8]) -> Vec<(Option<String>, Vec<String>, u64)> {
    let mut raw = Vec::new();
    flate2::read::GzDecoder::new(gz)
        .read_to_end(&mut raw)
        .unwrap();
    let p = PProfile::decode(&raw[..]).unwrap();
    let s = |i: i64| p.string_table[i as usize].clone();
    let func: BTreeMap<u64, String> = p.function.iter().map(|f| (f.id, s(f.name))).collect();
    let loc: BTreeMap<u64, &PLocation> = p.location.iter().map(|l| (l.id, l)).collect();
    p.sample
        .iter()
        .map(|sm| {
            let thread = sm
                .label
                .iter()
                .find(|l| s(l.key) == "thread")
                .map(|l| s(l.str));
            // Locations leaf first, each one's lines innermost first.
            let mut frames: Vec<String> = sm
                .location_id
                .iter()
                .flat_map(|id| loc[id].line.iter().map(|l| func[&l.function_id].clone()))
                .collect();
            frames.reverse();
            (thread, frames, sm.value[0] as u64)
        })
        .collect()
}
