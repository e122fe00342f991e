//! Collapsed stacks (`root;...;leaf COUNT`), the format of FlameGraph, inferno and speedscope.
//! The root frame is the thread name; one line per distinct stack, sorted.

use std::collections::BTreeMap;
use std::io::{self, Write};

use crate::Profile;

/// The folded lines as a map from stack text to weight.
pub fn collapse(profile: &Profile) -> BTreeMap<String, u64> {
    let mut cache: Vec<Option<String>> = vec![None; profile.stacks().len()];
    let mut lines: BTreeMap<String, u64> = BTreeMap::new();
    for s in &profile.samples {
        let thread = clean(profile.thread_name(s.thread));
        let path = match s.stack {
            Some(id) => stack_text(profile, id, &mut cache).to_owned(),
            None => "[unknown]".to_owned(),
        };
        *lines.entry(format!("{thread};{path}")).or_default() += s.weight;
    }
    lines
}

fn stack_text<'c>(
    profile: &Profile,
    id: crate::StackId,
    cache: &'c mut [Option<String>],
) -> &'c str {
    // Iterative fill from the first cached ancestor to avoid deep recursion.
    let mut chain = Vec::new();
    let mut cur = Some(id);
    while let Some(c) = cur {
        if cache[c.0 as usize].is_some() {
            break;
        }
        chain.push(c);
        cur = profile.stack(c).parent;
    }
    for c in chain.into_iter().rev() {
        let node = profile.stack(c);
        let name = clean(profile.str(profile.frame(node.frame).function));
        let text = match node.parent {
            Some(p) => format!("{};{}", cache[p.0 as usize].as_deref().unwrap_or(""), name),
            None => name,
        };
        cache[c.0 as usize] = Some(text);
    }
    cache[id.0 as usize].as_deref().unwrap_or("")
}

/// Frame names may not contain the separator, nor line breaks.
fn clean(name: &str) -> String {
    name.replace([';', '\n', '\r'], ":")
}

pub fn write(profile: &Profile, w: &mut dyn Write) -> io::Result<()> {
    for (stack, count) in collapse(profile) {
        writeln!(w, "{stack} {count}")?;
    }
    Ok(())
}
