//! The call tree: total and self share per call path, indented, hottest first. Frames of the
//! same function under the same parent are merged.

use std::collections::HashMap;
use std::io::{self, Write};

use crate::{escape, Profile, StackId, StrId};

/// Paths below this share of all samples are left out (and counted in a closing line).
const MIN_SHARE: f64 = 0.005;

#[derive(Default)]
struct Node {
    key: (StrId, StrId),
    total: u64,
    self_: u64,
    children: Vec<usize>,
}

/// Writes the call tree of `profile` as text.
pub fn write(profile: &Profile, w: &mut dyn Write) -> io::Result<()> {
    let total = profile.total_weight();
    writeln!(
        w,
        "{total} samples; call tree (total%, self%), paths under {:.1}% not shown",
        MIN_SHARE * 100.0
    )?;
    if total == 0 {
        return Ok(());
    }
    let mut nodes = vec![Node::default()]; // 0: the invisible root
    let mut index: HashMap<(usize, (StrId, StrId)), usize> = HashMap::new();
    let per_stack = profile.weight_per_stack();
    for (i, &weight) in per_stack.iter().enumerate().take(profile.stacks().len()) {
        if weight == 0 {
            continue;
        }
        let mut path: Vec<_> = profile.stack_frames(Some(StackId(i as u32))).collect();
        path.reverse();
        let mut cur = 0;
        nodes[0].total += weight;
        for f in path {
            let fr = profile.frame(f);
            let key = (fr.function, fr.module);
            let next = match index.get(&(cur, key)) {
                Some(&n) => n,
                None => {
                    nodes.push(Node {
                        key,
                        ..Node::default()
                    });
                    let n = nodes.len() - 1;
                    nodes[cur].children.push(n);
                    index.insert((cur, key), n);
                    n
                }
            };
            nodes[next].total += weight;
            cur = next;
        }
        nodes[cur].self_ += weight;
    }
    let mut hidden = 0usize;
    // Depth-first, hottest child first.
    let mut todo = vec![(0usize, 0usize)];
    while let Some((n, depth)) = todo.pop() {
        if n != 0 {
            let node = &nodes[n];
            if (node.total as f64) < MIN_SHARE * total as f64 {
                hidden += 1;
                continue;
            }
            let pct = |x: u64| 100.0 * x as f64 / total as f64;
            let module = profile.str(node.key.1);
            let module = module.rsplit('/').next().unwrap_or(module);
            let module = if module.starts_with('[') {
                escape(module).into_owned()
            } else {
                format!("[{}]", escape(module))
            };
            writeln!(
                w,
                "{:>7.2}% {:>7.2}%  {:indent$}{}  {}",
                pct(node.total),
                pct(node.self_),
                "",
                escape(profile.str(node.key.0)),
                module,
                indent = 2 * (depth - 1)
            )?;
        }
        let mut children = nodes[n].children.clone();
        children.sort_by_key(|&c| std::cmp::Reverse(nodes[c].total));
        for &c in children.iter().rev() {
            todo.push((c, depth + 1));
        }
    }
    if hidden > 0 {
        writeln!(
            w,
            "({hidden} call paths under {:.1}% not shown)",
            MIN_SHARE * 100.0
        )?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use crate::Profile;

    #[test]
    fn names_are_printed_escaped() {
        let mut p = Profile::default();
        let t = p.add_thread(1, 1, "t");
        let main = p.intern_frame_named("main", "/bin/p", None, 0, 1, false);
        let evil = p.intern_frame_named("e\nvil\x1b[0m", "/bin/p\r", None, 0, 2, false);
        let s = p.intern_stack(None, main);
        let s = p.intern_stack(Some(s), evil);
        p.add_sample(0, t, 0, 1, Some(s));
        let mut out = Vec::new();
        super::write(&p, &mut out).unwrap();
        let text = String::from_utf8(out).unwrap();
        assert_eq!(text.lines().count(), 3, "{text}");
        assert!(!text.contains('\x1b') && !text.contains('\r'), "{text}");
        assert!(text.contains("e\\nvil\\e[0m  [p\\r]"), "{text}");
    }
}
