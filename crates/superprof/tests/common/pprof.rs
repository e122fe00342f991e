//! pprof files read back as `go tool pprof` reads them (github.com/google/pprof/proto/
//! profile.proto, the messages and fields the tests look at).

use std::collections::BTreeMap;
use std::io::Read;

use prost::Message;
use superprof_profile::pprof_pb::{Location, Profile};

/// Each sample of a gzipped pprof: its `thread` label, its functions root first (each
/// location's inline chain included), its first value (samples).
pub fn samples(gz: &[u8]) -> Vec<(Option<String>, Vec<String>, u64)> {
    let mut raw = Vec::new();
    flate2::read::GzDecoder::new(gz)
        .read_to_end(&mut raw)
        .unwrap();
    let p = Profile::decode(&raw[..]).unwrap();
    let s = |i: i64| p.string_table[i as usize].clone();
    let func: BTreeMap<u64, String> = p.function.iter().map(|f| (f.id, s(f.name))).collect();
    let loc: BTreeMap<u64, &Location> = p.location.iter().map(|l| (l.id, l)).collect();
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
