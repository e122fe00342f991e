//! Sample filters of `superprof report`: threads, a time window, focus and exclude.

use std::collections::{HashMap, HashSet};

use crate::{Frame, FrameId, Profile, StackId, StrId};

#[derive(Debug, Clone, Default)]
pub struct Filter {
    /// Keep only these threads (empty: all).
    pub tids: Vec<u32>,
    /// Keep samples at or after this time since the start of the recording.
    pub since_ns: Option<u64>,
    /// Keep samples before this time since the start of the recording.
    pub until_ns: Option<u64>,
    /// Keep only stacks through this function, re-rooted at its outermost call.
    pub focus: Option<String>,
    /// Drop stacks through this function.
    pub exclude: Option<String>,
    /// Keep only on-CPU samples (`Some(false)`) or only off-CPU ones (`Some(true)`).
    pub off_cpu: Option<bool>,
}

/// The functions a name selects: those named exactly so, or, when none is, those whose name
/// contains it (so `crunch_numbers` finds `superprof::demo::crunch_numbers`).
fn matching(profile: &Profile, pattern: &str) -> HashSet<StrId> {
    let names: HashSet<StrId> = profile.frames().iter().map(|f| f.function).collect();
    let exact: HashSet<StrId> = names
        .iter()
        .copied()
        .filter(|&n| profile.str(n) == pattern)
        .collect();
    if !exact.is_empty() {
        return exact;
    }
    names
        .into_iter()
        .filter(|&n| profile.str(n).contains(pattern))
        .collect()
}

impl Filter {
    pub fn is_empty(&self) -> bool {
        self.tids.is_empty()
            && self.since_ns.is_none()
            && self.until_ns.is_none()
            && self.focus.is_none()
            && self.exclude.is_none()
            && self.off_cpu.is_none()
    }

    /// A new profile with the samples (and stacks) the filter keeps.
    pub fn apply(&self, p: &Profile) -> Profile {
        let focus = self.focus.as_deref().map(|f| matching(p, f));
        let exclude = self.exclude.as_deref().map(|f| matching(p, f));
        let mut out = Profile::default();
        out.meta = p.meta.clone();
        let mut threads: HashMap<u32, u32> = HashMap::new();
        let mut frames: HashMap<FrameId, FrameId> = HashMap::new();
        // Old stack -> new stack (None inside: keep the sample with no stack; outer None: drop).
        let mut stacks: HashMap<Option<StackId>, Option<Option<StackId>>> = HashMap::new();
        for s in &p.samples {
            let t = &p.threads[s.thread as usize];
            if self.off_cpu.is_some_and(|off| s.kind.is_off_cpu() != off) {
                continue;
            }
            if !self.tids.is_empty() && !self.tids.contains(&t.tid) {
                continue;
            }
            if self.since_ns.is_some_and(|x| s.time_ns < x)
                || self.until_ns.is_some_and(|x| s.time_ns >= x)
            {
                continue;
            }
            let new_stack = *stacks.entry(s.stack).or_insert_with(|| {
                let mut path: Vec<FrameId> = p.stack_frames(s.stack).collect();
                path.reverse(); // root first
                let is = |set: &Option<HashSet<StrId>>, f: &FrameId| {
                    set.as_ref()
                        .is_some_and(|set| set.contains(&p.frame(*f).function))
                };
                if path.iter().any(|f| is(&exclude, f)) {
                    return None;
                }
                let start = match &focus {
                    Some(_) => path.iter().position(|f| is(&focus, f))?,
                    None => 0,
                };
                let mut node = None;
                for &f in &path[start..] {
                    let nf = *frames
                        .entry(f)
                        .or_insert_with(|| copy_frame(p, &mut out, f));
                    node = Some(out.intern_stack(node, nf));
                }
                Some(node)
            });
            let Some(stack) = new_stack else { continue };
            let thread = *threads.entry(s.thread).or_insert_with(|| {
                let name = p.str(t.name).to_owned();
                out.add_thread(t.pid, t.tid, &name)
            });
            out.add_sample_of(s.kind, s.time_ns, thread, s.cpu, s.weight, stack);
        }
        out
    }
}

fn copy_frame(from: &Profile, to: &mut Profile, f: FrameId) -> FrameId {
    let fr = from.frame(f);
    let frame = Frame {
        function: to.intern_str(from.str(fr.function)),
        module: to.intern_str(from.str(fr.module)),
        file: fr.file.map(|x| to.intern_str(from.str(x))),
        ..*fr
    };
    to.intern_frame(frame)
}
