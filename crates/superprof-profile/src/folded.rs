//! Collapsed stacks (`root;...;leaf COUNT`), the format of FlameGraph, inferno and speedscope.
//! The root frame is the thread name; one line per distinct stack, sorted.
//!
//! The format has no quoting: a line ends at a newline, frames are split at every `;`, and
//! the count follows the last space. So each name is printed through [`crate::escape`]
//! (a newline becomes `\n`, an ESC `\e`...) and a `;` in a name becomes `:`, as FlameGraph's
//! and inferno's own stack collapsers do (`tidy_generic`); spaces are kept (the count is
//! found from the end of the line).

use std::borrow::Cow;
use std::collections::{BTreeMap, HashMap};
use std::io::{self, Write};

use crate::{Frame, Profile, StackId};

/// The folded lines as a map from stack text to weight: each stack under its thread's name.
pub fn collapse(profile: &Profile) -> BTreeMap<String, u64> {
    collapse_with(
        profile,
        |thread| vec![profile.thread_name(thread).to_owned()],
        |f| profile.str(f.function).to_owned(),
    )
}

/// The folded lines of `profile`, each stack under the root frames `root` gives its thread
/// (index), its frames named by `frame`; names made safe for the format here.
pub(crate) fn collapse_with(
    profile: &Profile,
    root: impl Fn(u32) -> Vec<String>,
    frame: impl Fn(&Frame) -> String,
) -> BTreeMap<String, u64> {
    // Weight per (thread, leaf), then one text per distinct pair: the work and the memory
    // follow the size of the output, whatever the depth of the stacks.
    let mut per_leaf: HashMap<(u32, Option<StackId>), u64> = HashMap::new();
    for s in &profile.samples {
        let w = per_leaf.entry((s.thread, s.stack)).or_default();
        *w = w.saturating_add(s.weight);
    }
    let mut names: Vec<Option<String>> = vec![None; profile.frames().len()];
    let mut frames = Vec::new();
    let mut lines: BTreeMap<String, u64> = BTreeMap::new();
    for ((thread, leaf), weight) in per_leaf {
        let mut text = root(thread)
            .iter()
            .map(|r| clean(r).into_owned())
            .collect::<Vec<_>>()
            .join(";");
        match leaf {
            Some(_) => {
                frames.clear();
                frames.extend(profile.stack_frames(leaf));
                for f in frames.iter().rev() {
                    let name = names[f.0 as usize]
                        .get_or_insert_with(|| clean(&frame(profile.frame(*f))).into_owned());
                    if !text.is_empty() {
                        text.push(';');
                    }
                    text.push_str(name);
                }
            }
            None if text.is_empty() => text.push_str("[unknown]"),
            None => text.push_str(";[unknown]"),
        }
        let w = lines.entry(text).or_default();
        *w = w.saturating_add(weight);
    }
    lines
}

/// A name as one frame of a folded line: escaped, and no `;` that would split it.
fn clean(name: &str) -> Cow<'_, str> {
    match crate::escape(name) {
        Cow::Borrowed(s) if !s.contains(';') => Cow::Borrowed(s),
        e => Cow::Owned(e.replace(';', ":")),
    }
}

/// Writes `profile` as collapsed stacks: one `thread;outer;...;leaf WEIGHT` line per distinct
/// stack, sorted.
pub fn write(profile: &Profile, w: &mut dyn Write) -> io::Result<()> {
    for (stack, count) in collapse(profile) {
        writeln!(w, "{stack} {count}")?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use crate::Profile;

    fn folded(p: &Profile) -> String {
        let mut out = Vec::new();
        super::write(p, &mut out).unwrap();
        String::from_utf8(out).unwrap()
    }

    #[test]
    fn names_cannot_break_lines_or_frames() {
        let mut p = Profile::default();
        let t = p.add_thread(1, 1, "a\nb\x1b[31m");
        let f = p.intern_frame_named("f;g\r", "m", None, 0, 1, false);
        let s = p.intern_stack(None, f);
        p.add_sample(0, t, 0, 3, Some(s));
        assert_eq!(folded(&p), "a\\nb\\e[31m;f:g\\r 3\n");
    }

    #[test]
    fn deep_stacks_cost_the_size_of_the_output() {
        let mut p = Profile::default();
        let t = p.add_thread(1, 1, "t");
        let f = p.intern_frame_named("f", "m", None, 0, 1, false);
        let mut s = None;
        for _ in 0..100_000 {
            s = Some(p.intern_stack(s, f));
        }
        p.add_sample(0, t, 0, 1, s);
        p.add_sample(1, t, 0, 1, s);
        let text = folded(&p);
        assert_eq!(text.len(), "t".len() + 100_000 * 2 + " 2\n".len());
    }
}
