//! Sample filters of `superprof report`: threads, a time window, focus and exclude.

use std::collections::{HashMap, HashSet};

use crate::{Frame, FrameId, Profile, StackId, StrId};

/// Which samples `report` keeps; every condition given must hold. The default keeps all.
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
    /// Keep only the samples of this event (of a profile of several, `record -e A,B`): the
    /// profile becomes one of that event alone.
    pub event: Option<String>,
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

/// The names of `candidates` closest to `name` (at most three, by edit distance, or
/// containing it), for a "did you mean" in an error message: the one such search of superprof
/// (report's `--focus`, stat's and blocks' regions).
pub fn near_names(name: &str, candidates: impl IntoIterator<Item = String>) -> Vec<String> {
    let mut scored: Vec<(usize, String)> = candidates
        .into_iter()
        .map(|n| (edit_distance(&n, name), n))
        .filter(|(d, n)| *d <= name.len().max(3) / 2 || n.contains(name))
        .collect();
    scored.sort();
    scored.dedup_by(|a, b| a.1 == b.1);
    scored.into_iter().take(3).map(|(_, n)| n).collect()
}

/// Levenshtein's distance between two names, in characters.
fn edit_distance(a: &str, b: &str) -> usize {
    let b: Vec<char> = b.chars().collect();
    let mut prev: Vec<usize> = (0..=b.len()).collect();
    for (i, ca) in a.chars().enumerate() {
        let mut cur = vec![i + 1];
        for (j, cb) in b.iter().enumerate() {
            cur.push(
                (prev[j] + (ca != *cb) as usize)
                    .min(prev[j + 1] + 1)
                    .min(cur[j] + 1),
            );
        }
        prev = cur;
    }
    prev[b.len()]
}

impl Filter {
    /// `--focus` or `--exclude` names no function of `p`: the flag, the pattern, and the
    /// names closest to it. (A focus that matches nothing keeps no sample: a typo, not an
    /// empty profile.)
    pub fn unmatched(&self, p: &Profile) -> Vec<(&'static str, String, Vec<String>)> {
        let mut out = Vec::new();
        if let Some(name) = &self.event {
            let names: Vec<String> = p.meta.event_list().into_iter().map(|e| e.name).collect();
            if !names.contains(name) {
                out.push(("--event", name.clone(), names));
            }
        }
        for (flag, pattern) in [("--focus", &self.focus), ("--exclude", &self.exclude)] {
            let Some(pattern) = pattern else { continue };
            if matching(p, pattern).is_empty() {
                let names: HashSet<StrId> = p.frames().iter().map(|f| f.function).collect();
                let near = near_names(pattern, names.into_iter().map(|n| p.str(n).to_owned()));
                out.push((flag, pattern.clone(), near));
            }
        }
        out
    }

    /// Whether no condition is set (the filter keeps every sample).
    pub fn is_empty(&self) -> bool {
        self.tids.is_empty()
            && self.since_ns.is_none()
            && self.until_ns.is_none()
            && self.focus.is_none()
            && self.exclude.is_none()
            && self.off_cpu.is_none()
            && self.event.is_none()
    }

    /// A new profile with the samples (and stacks) the filter keeps.
    pub fn apply(&self, p: &Profile) -> Profile {
        let focus = self.focus.as_deref().map(|f| matching(p, f));
        let exclude = self.exclude.as_deref().map(|f| matching(p, f));
        let mut out = Profile::default();
        out.meta = p.meta.clone();
        let events = p.meta.event_list();
        let event = self
            .event
            .as_ref()
            .map(|name| events.iter().position(|e| e.name == *name));
        if let Some(i) = event {
            let e = i.and_then(|i| events.get(i)).cloned();
            out.meta.event = e.as_ref().map_or_else(String::new, |e| e.name.clone());
            out.meta.events = e.into_iter().filter(|e| e.counted).collect();
        }
        let mut threads: HashMap<u32, u32> = HashMap::new();
        let mut frames: HashMap<FrameId, FrameId> = HashMap::new();
        // Old stack -> new stack (None inside: keep the sample with no stack; outer None: drop).
        let mut stacks: HashMap<Option<StackId>, Option<Option<StackId>>> = HashMap::new();
        for s in &p.samples {
            let t = &p.threads[s.thread as usize];
            if event.is_some_and(|e| e != Some(s.event as usize)) {
                continue;
            }
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
            out.samples.push(crate::Sample {
                thread,
                stack,
                event: if event.is_some() { 0 } else { s.event },
                ..s
            });
        }
        out
    }
}

/// One profile per process (by pid, in the order of their first sample), each with its own
/// threads, frames and stacks, and the whole profile's meta: `superprof agent` pushes one
/// profile per process and interval.
pub fn split_by_process(p: &Profile) -> Vec<(u32, Profile)> {
    struct Part {
        out: Profile,
        threads: HashMap<u32, u32>,
        frames: HashMap<FrameId, FrameId>,
        stacks: HashMap<Option<StackId>, Option<StackId>>,
    }
    let mut order: Vec<u32> = Vec::new();
    let mut parts: HashMap<u32, Part> = HashMap::new();
    for s in &p.samples {
        let t = &p.threads[s.thread as usize];
        let part = parts.entry(t.pid).or_insert_with(|| {
            order.push(t.pid);
            let mut out = Profile::default();
            out.meta = p.meta.clone();
            Part {
                out,
                threads: HashMap::new(),
                frames: HashMap::new(),
                stacks: HashMap::new(),
            }
        });
        let stack = match part.stacks.get(&s.stack) {
            Some(&st) => st,
            None => {
                let mut path: Vec<FrameId> = p.stack_frames(s.stack).collect();
                path.reverse(); // root first
                let mut node = None;
                for f in path {
                    let nf = *part
                        .frames
                        .entry(f)
                        .or_insert_with(|| copy_frame(p, &mut part.out, f));
                    node = Some(part.out.intern_stack(node, nf));
                }
                part.stacks.insert(s.stack, node);
                node
            }
        };
        let thread = *part.threads.entry(s.thread).or_insert_with(|| {
            let name = p.str(t.name).to_owned();
            part.out.add_thread(t.pid, t.tid, &name)
        });
        part.out
            .add_sample_of(s.kind, s.time_ns, thread, s.cpu, s.weight, stack);
    }
    order
        .into_iter()
        .map(|pid| (pid, parts.remove(&pid).expect("one part per pid").out))
        .collect()
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn near_names_are_the_closest_or_containing() {
        let names = [
            "crunch_numbers",
            "hash_strings",
            "walk_list",
            "crunch",
            "main",
        ];
        let near = near_names("crunch_nubmers", names.iter().map(|s| s.to_string()));
        assert_eq!(near[0], "crunch_numbers");
        assert!(near_names("xyzzy", names.iter().map(|s| s.to_string())).is_empty());
        // A part of a name finds the names holding it.
        assert_eq!(
            near_names("hash", names.iter().map(|s| s.to_string())),
            vec!["hash_strings".to_owned()]
        );
        assert_eq!(edit_distance("kitten", "sitting"), 3);
    }
    use crate::SampleKind;

    /// Two processes, two threads in the first, stacks sharing frames across processes.
    fn two_processes() -> Profile {
        let mut p = Profile::default();
        let frame = |p: &mut Profile, name: &str| {
            let f = Frame {
                function: p.intern_str(name),
                module: p.intern_str("m"),
                file: None,
                line: 0,
                address: name.len() as u64,
                inlined: false,
            };
            p.intern_frame(f)
        };
        let (main, work, other) = (
            frame(&mut p, "main"),
            frame(&mut p, "work"),
            frame(&mut p, "other"),
        );
        let a1 = p.add_thread(10, 10, "a");
        let a2 = p.add_thread(10, 11, "a-worker");
        let b = p.add_thread(20, 20, "b");
        let root = p.intern_stack(None, main);
        let deep = p.intern_stack(Some(root), work);
        let side = p.intern_stack(Some(root), other);
        for (t, stack, n) in [
            (a1, Some(deep), 3),
            (a2, Some(side), 2),
            (b, Some(deep), 5),
            (b, None, 1),
        ] {
            for i in 0..n {
                p.add_sample_of(SampleKind::OnCpu, i, t, 0, 1, stack);
            }
        }
        p
    }

    #[test]
    fn a_profile_splits_into_one_per_process() {
        let p = two_processes();
        let parts = split_by_process(&p);
        assert_eq!(
            parts.iter().map(|(pid, _)| *pid).collect::<Vec<_>>(),
            [10, 20]
        );
        let folded = |q: &Profile| crate::folded::collapse(q).into_iter().collect::<Vec<_>>();
        assert_eq!(
            folded(&parts[0].1),
            [
                ("a-worker;main;other".to_owned(), 2),
                ("a;main;work".to_owned(), 3)
            ]
        );
        assert_eq!(
            folded(&parts[1].1),
            [("b;[unknown]".to_owned(), 1), ("b;main;work".to_owned(), 5)]
        );
        // Each part holds its own threads and only the frames it uses.
        assert_eq!(parts[1].1.threads.len(), 1);
        assert_eq!(parts[1].1.frames().len(), 2);
        assert_eq!(parts[0].1.meta, p.meta);
    }
}
