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

use crate::proto::{Pb, Strings};
use crate::{FrameId, Profile, StackId, StrId};

/// The protocol version these messages follow.
pub const VERSION: &str = "OTLP v1.10.0 profiles v1development";

/// An attribute value: a string or an integer (AnyValue's string_value, int_value).
enum Value<'a> {
    Str(&'a str),
    Int(i64),
}

fn any_value(v: &Value) -> Pb {
    let mut a = Pb::default();
    match v {
        Value::Str(s) => a.bytes(1, s.as_bytes()),
        Value::Int(i) => {
            // (int_value 0 is still a value: written whatever it is.)
            a.key(3, 0);
            a.varint(*i as u64);
        }
    }
    a
}

/// The dictionary being built, and its tables' indices.
struct Dictionary {
    strings: Strings,
    mappings: Pb,
    mapping_of: HashMap<StrId, i64>,
    locations: Pb,
    location_of: HashMap<Vec<FrameId>, i64>,
    functions: Pb,
    function_of: HashMap<(StrId, Option<StrId>), i64>,
    stacks: Pb,
    stack_of: HashMap<Option<StackId>, i64>,
    attributes: Pb,
    attribute_of: HashMap<(i64, String), i64>,
    /// The next index of each table (index 0 is each table's zero entry).
    next: [i64; 5],
}

const MAPPINGS: usize = 0;
const LOCATIONS: usize = 1;
const FUNCTIONS: usize = 2;
const STACKS: usize = 3;
const ATTRIBUTES: usize = 4;

impl Dictionary {
    fn new() -> Dictionary {
        // The zero entries: an empty message in each table.
        let mut d = Dictionary {
            strings: Strings::new(),
            mappings: Pb::default(),
            mapping_of: HashMap::new(),
            locations: Pb::default(),
            location_of: HashMap::new(),
            functions: Pb::default(),
            function_of: HashMap::new(),
            stacks: Pb::default(),
            stack_of: HashMap::new(),
            attributes: Pb::default(),
            attribute_of: HashMap::new(),
            next: [1; 5],
        };
        d.mappings.bytes(1, &[]);
        d.locations.bytes(2, &[]);
        d.functions.bytes(3, &[]);
        d.stacks.bytes(7, &[]);
        d.attributes.bytes(6, &[]);
        d
    }

    fn take(&mut self, table: usize) -> i64 {
        self.next[table] += 1;
        self.next[table] - 1
    }

    fn attribute(&mut self, key: &str, value: Value) -> i64 {
        let k = self.strings.id(key);
        let id = match &value {
            Value::Str(s) => format!("s{s}"),
            Value::Int(i) => format!("i{i}"),
        };
        if let Some(&i) = self.attribute_of.get(&(k, id.clone())) {
            return i;
        }
        let i = self.take(ATTRIBUTES);
        let mut a = Pb::default();
        a.int(1, k);
        a.msg(2, any_value(&value));
        self.attributes.msg(6, a);
        self.attribute_of.insert((k, id), i);
        i
    }

    fn mapping(&mut self, profile: &Profile, module: StrId) -> i64 {
        if let Some(&i) = self.mapping_of.get(&module) {
            return i;
        }
        let i = self.take(MAPPINGS);
        let mut m = Pb::default();
        m.int(4, self.strings.id(profile.str(module)));
        self.mappings.msg(1, m);
        self.mapping_of.insert(module, i);
        i
    }

    fn function(&mut self, profile: &Profile, name: StrId, file: Option<StrId>) -> i64 {
        if let Some(&i) = self.function_of.get(&(name, file)) {
            return i;
        }
        let i = self.take(FUNCTIONS);
        let mut f = Pb::default();
        let n = self.strings.id(profile.str(name));
        f.int(1, n);
        f.int(2, n);
        if let Some(file) = file {
            f.int(3, self.strings.id(profile.str(file)));
        }
        self.functions.msg(3, f);
        self.function_of.insert((name, file), i);
        i
    }

    /// A location: a run of inlined frames (innermost first) ended by the frame they were
    /// inlined into.
    fn location(&mut self, profile: &Profile, chain: &[FrameId]) -> i64 {
        if let Some(&i) = self.location_of.get(chain) {
            return i;
        }
        let outer = profile.frame(*chain.last().expect("a location has a frame"));
        let mapping = self.mapping(profile, outer.module);
        let mut loc = Pb::default();
        loc.int(1, mapping);
        loc.uint(2, outer.address);
        for &fid in chain {
            let fr = profile.frame(fid);
            let func = self.function(profile, fr.function, fr.file);
            let mut line = Pb::default();
            line.int(1, func);
            line.int(2, i64::from(fr.line));
            loc.msg(3, line);
        }
        let i = self.take(LOCATIONS);
        self.locations.msg(2, loc);
        self.location_of.insert(chain.to_vec(), i);
        i
    }

    fn stack(&mut self, profile: &Profile, stack: Option<StackId>) -> i64 {
        if let Some(&i) = self.stack_of.get(&stack) {
            return i;
        }
        let frames: Vec<FrameId> = profile.stack_frames(stack).collect();
        let mut locs = Vec::new();
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
            locs.push(self.location(profile, &frames[start..=i]) as u64);
            start = i + 1;
        }
        let mut s = Pb::default();
        s.packed(1, locs.into_iter());
        let i = self.take(STACKS);
        self.stacks.msg(7, s);
        self.stack_of.insert(stack, i);
        i
    }

    fn encode(self) -> Pb {
        let mut d = Pb::default();
        d.0.extend_from_slice(&self.mappings.0);
        d.0.extend_from_slice(&self.locations.0);
        d.0.extend_from_slice(&self.functions.0);
        // link_table: its zero entry only.
        d.bytes(4, &[]);
        for s in &self.strings.table {
            d.bytes(5, s.as_bytes());
        }
        d.0.extend_from_slice(&self.attributes.0);
        d.0.extend_from_slice(&self.stacks.0);
        d
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
    let mut dict = Dictionary::new();
    let period_ns = if profile.meta.frequency > 0 {
        1_000_000_000 / i64::from(profile.meta.frequency)
    } else {
        1
    };
    // Samples of one stack and thread are one sample (values: their sum), per kind.
    let mut sums: [HashMap<(i64, u32), i64>; 2] = [HashMap::new(), HashMap::new()];
    let mut order: [Vec<(i64, u32)>; 2] = [Vec::new(), Vec::new()];
    for s in &profile.samples {
        let stack = dict.stack(profile, s.stack);
        let k = usize::from(s.kind.is_off_cpu());
        let v = s.weight.saturating_mul(period_ns as u64) as i64;
        let e = sums[k].entry((stack, s.thread)).or_insert_with(|| {
            order[k].push((stack, s.thread));
            0
        });
        *e = e.saturating_add(v);
    }
    let mut thread_attrs: HashMap<u32, Vec<i64>> = HashMap::new();
    let mut profiles = Vec::new();
    for (k, (kind, unit)) in [("cpu", "nanoseconds"), ("off_cpu", "nanoseconds")]
        .into_iter()
        .enumerate()
    {
        if order[k].is_empty() && !(k == 0 && order[1].is_empty()) {
            continue;
        }
        let mut p = Pb::default();
        let mut vt = Pb::default();
        vt.int(1, dict.strings.id(kind));
        vt.int(2, dict.strings.id(unit));
        p.msg(1, vt);
        for &(stack, thread) in &order[k] {
            let attrs = thread_attrs.entry(thread).or_insert_with(|| {
                let t = &profile.threads[thread as usize];
                vec![
                    dict.attribute("thread.id", Value::Int(i64::from(t.tid))),
                    dict.attribute("thread.name", Value::Str(profile.str(t.name))),
                    dict.attribute("process.pid", Value::Int(i64::from(t.pid))),
                ]
            });
            let mut sm = Pb::default();
            sm.int(1, stack);
            sm.packed(2, attrs.iter().map(|&a| a as u64));
            sm.packed(4, [sums[k][&(stack, thread)] as u64].into_iter());
            p.msg(2, sm);
        }
        p.key(3, 1);
        p.0.extend_from_slice(&profile.meta.start_time_unix_ns.to_le_bytes());
        p.uint(4, profile.meta.duration_ns);
        let mut pt = Pb::default();
        pt.int(1, dict.strings.id("cpu"));
        pt.int(2, dict.strings.id("nanoseconds"));
        p.msg(5, pt);
        p.int(6, period_ns);
        p.bytes(7, &profile_id(profile, k as u8));
        profiles.push(p);
    }
    let mut scope = Pb::default();
    let mut name = Pb::default();
    name.bytes(1, b"superprof");
    if !profile.meta.version.is_empty() {
        name.bytes(2, profile.meta.version.as_bytes());
    }
    scope.msg(1, name);
    for p in profiles {
        scope.msg(2, p);
    }
    let mut res = Pb::default();
    for (k, v) in resource {
        let mut kv = Pb::default();
        kv.bytes(1, k.as_bytes());
        kv.msg(2, any_value(&Value::Str(v)));
        res.msg(1, kv);
    }
    let mut rp = Pb::default();
    rp.msg(1, res);
    rp.msg(2, scope);
    let mut req = Pb::default();
    req.msg(1, rp);
    req.msg(2, dict.encode());
    req.0
}
