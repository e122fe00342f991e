//! Folded stacks (`frame;frame;frame count`, root first), as superprof, perf's
//! stackcollapse and inferno write them.

use std::collections::BTreeMap;
use std::path::Path;

/// Folded stacks: frames root first, with their count.
#[derive(Debug)]
pub struct Folded(
    /// Each line: its frames, root first, and its count.
    pub Vec<(Vec<String>, u64)>,
);

impl Folded {
    /// Reads a folded file (which must exist).
    pub fn read(path: &Path) -> Folded {
        let text = std::fs::read_to_string(path).expect("folded output exists");
        Folded::parse(&text)
    }

    /// Parses folded text; blank lines are skipped.
    pub fn parse(text: &str) -> Folded {
        Folded(
            text.lines()
                .filter(|l| !l.is_empty())
                .map(|l| {
                    let (stack, n) = l.rsplit_once(' ').expect("count");
                    (
                        stack.split(';').map(str::to_owned).collect(),
                        n.parse().expect("number"),
                    )
                })
                .collect(),
        )
    }

    /// The sum of the counts.
    pub fn total(&self) -> u64 {
        self.0.iter().map(|(_, n)| n).sum()
    }

    /// Of the samples whose leaf is `leaf`, the share whose stack is whole: `via` calls it
    /// directly (main calling a work function).
    pub fn complete_share(&self, leaf: &str, via: &str) -> f64 {
        let (mut all, mut whole) = (0, 0);
        for (s, n) in &self.0 {
            if s.last().is_some_and(|x| x == leaf) {
                all += n;
                if s.len() >= 2 && s[s.len() - 2] == via {
                    whole += n;
                }
            }
        }
        whole as f64 / all.max(1) as f64
    }

    /// Share of samples whose stack passes through a frame named `f`.
    pub fn share_through(&self, f: &str) -> f64 {
        let n: u64 = self
            .0
            .iter()
            .filter(|(s, _)| s.iter().skip(1).any(|x| x == f))
            .map(|(_, n)| n)
            .sum();
        n as f64 / self.total() as f64
    }

    /// Share of samples whose leaf frame is `f`.
    pub fn share_leaf(&self, f: &str) -> f64 {
        let n: u64 = self
            .0
            .iter()
            .filter(|(s, _)| s.last().is_some_and(|x| x == f))
            .map(|(_, n)| n)
            .sum();
        n as f64 / self.total() as f64
    }

    /// Share of samples per root frame (thread name).
    pub fn share_per_root(&self) -> BTreeMap<String, f64> {
        let mut m: BTreeMap<String, u64> = BTreeMap::new();
        for (s, n) in &self.0 {
            *m.entry(s[0].clone()).or_default() += n;
        }
        let t = self.total() as f64;
        m.into_iter().map(|(k, v)| (k, v as f64 / t)).collect()
    }

    /// Of the samples whose leaf is `leaf`, the share whose stack ends with `tail` (frames
    /// joined by `;`, `main;inside_alpha`: called from main), the leaf included.
    pub fn share_ending(&self, leaf: &str, tail: &str) -> f64 {
        let (mut all, mut whole) = (0u64, 0u64);
        for (s, n) in &self.0 {
            if s.last().is_some_and(|x| x == leaf) {
                all += n;
                let stack = s.join(";");
                if stack == tail || stack.ends_with(&format!(";{tail}")) {
                    whole += n;
                }
            }
        }
        whole as f64 / all.max(1) as f64
    }

    /// Samples per leaf frame.
    pub fn leaves(&self) -> BTreeMap<String, u64> {
        let mut m = BTreeMap::new();
        for (s, n) in &self.0 {
            if let Some(leaf) = s.last() {
                *m.entry(leaf.clone()).or_default() += n;
            }
        }
        m
    }
}

#[cfg(test)]
mod tests {
    use super::Folded;

    #[test]
    fn folded_text_parses_and_shares_add_up() {
        let f = Folded::parse("main;main;a;spin 6\nmain;main;b;spin 3\n\nworker;start;b 1\n");
        assert_eq!(f.total(), 10);
        assert_eq!(f.0[0].0, ["main", "main", "a", "spin"]);
        // The root (a thread's name) is not a frame: `main` counts once per stack.
        assert_eq!(f.share_through("main"), 0.9);
        assert_eq!(f.share_through("b"), 0.4);
        assert_eq!(f.share_leaf("spin"), 0.9);
        assert_eq!(f.complete_share("spin", "a"), 6.0 / 9.0);
        assert_eq!(f.share_ending("spin", "main;b;spin"), 3.0 / 9.0);
        assert_eq!(f.leaves()["b"], 1);
        assert_eq!(f.share_per_root()["worker"], 0.1);
    }
}
