//! `report --sort KEYS` (perf report's keys: `comm`, `pid`, `tid`, `dso`, `sym`, any subset in
//! any order): the samples grouped by those keys, as perf's `--sort` splits them. The table
//! gives each group's share of the samples (each sample counted for its leaf frame, as perf's
//! overhead with `--no-children`); the folded stacks begin with the groups' process and thread
//! keys instead of the thread name, their frames named by the frame keys, so that a build's
//! compilers, linkers and shells come out as separate flames.

use std::collections::HashMap;
use std::io::{self, Write};

use crate::{escape, Frame, Profile, StackId, StrId};

/// One key of `--sort`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum SortKey {
    /// The process's name (its main thread's `comm`).
    Comm,
    /// The process id.
    Pid,
    /// The thread id.
    Tid,
    /// The module of the sample's leaf frame (a frame's module, in folded stacks).
    Dso,
    /// The function of the sample's leaf frame (a frame's function, in folded stacks).
    Sym,
}

impl SortKey {
    /// Reads `comm,pid,tid,dso,sym` (any subset, in any order, each once).
    pub fn parse_list(s: &str) -> Result<Vec<SortKey>, String> {
        let mut keys = Vec::new();
        for word in s.split(',').map(str::trim) {
            let key = match word {
                "comm" => SortKey::Comm,
                "pid" => SortKey::Pid,
                "tid" => SortKey::Tid,
                "dso" => SortKey::Dso,
                "sym" => SortKey::Sym,
                other => {
                    let other = escape(other);
                    return Err(format!(
                        "unknown sort key '{other}': use comm, pid, tid, dso or sym, \
                         separated by commas"
                    ));
                }
            };
            if keys.contains(&key) {
                return Err(format!("sort key '{word}' is given twice"));
            }
            keys.push(key);
        }
        Ok(keys)
    }

    /// The column's title.
    fn header(self) -> &'static str {
        match self {
            SortKey::Comm => "Command",
            SortKey::Pid => "Pid",
            SortKey::Tid => "Tid",
            SortKey::Dso => "Shared Object",
            SortKey::Sym => "Symbol",
        }
    }

    /// Whether the key is a frame's (its module or function) rather than the sample's thread's.
    fn of_frame(self) -> bool {
        matches!(self, SortKey::Dso | SortKey::Sym)
    }
}

/// Each process's name: its main thread's (tid == pid), else its first thread's.
fn process_names(p: &Profile) -> HashMap<u32, StrId> {
    let mut names: HashMap<u32, StrId> = HashMap::new();
    for t in &p.threads {
        if t.tid == t.pid {
            names.insert(t.pid, t.name);
        } else {
            names.entry(t.pid).or_insert(t.name);
        }
    }
    names
}

/// A module as the table and the folded frames name it: its file name.
fn module_name(path: &str) -> &str {
    path.rsplit('/')
        .next()
        .filter(|n| !n.is_empty())
        .unwrap_or(path)
}

/// The value of each of `keys` for a sample of thread index `thread` with leaf `stack` (frame
/// keys from its leaf frame; "[unknown]" for a sample with no stack).
fn values(
    p: &Profile,
    names: &HashMap<u32, StrId>,
    keys: &[SortKey],
    (thread, stack): (u32, Option<StackId>),
) -> Vec<String> {
    let t = &p.threads[thread as usize];
    let leaf = stack
        .and_then(|st| p.stack_frames(Some(st)).next())
        .map(|f| p.frame(f));
    keys.iter()
        .map(|k| match k {
            SortKey::Comm => p
                .str(names.get(&t.pid).copied().unwrap_or(t.name))
                .to_owned(),
            SortKey::Pid => t.pid.to_string(),
            SortKey::Tid => t.tid.to_string(),
            SortKey::Dso => leaf
                .map_or("[unknown]", |f| module_name(p.str(f.module)))
                .to_owned(),
            SortKey::Sym => leaf.map_or("[unknown]", |f| p.str(f.function)).to_owned(),
        })
        .collect()
}

/// The samples' weight per (thread index, leaf stack).
fn weight_per_leaf(p: &Profile) -> HashMap<(u32, Option<StackId>), u64> {
    let mut per_leaf: HashMap<(u32, Option<StackId>), u64> = HashMap::new();
    for s in &p.samples {
        let e = per_leaf.entry((s.thread, s.stack)).or_default();
        *e = e.saturating_add(s.weight);
    }
    per_leaf
}

/// The groups of `keys` with their weights, heaviest first (then by their values).
pub fn groups(p: &Profile, keys: &[SortKey]) -> Vec<(Vec<String>, u64)> {
    let names = process_names(p);
    let mut acc: HashMap<Vec<String>, u64> = HashMap::new();
    // The keys' texts once per distinct (thread, leaf), not once per sample.
    for (pair, weight) in weight_per_leaf(p) {
        let w = acc.entry(values(p, &names, keys, pair)).or_default();
        *w = w.saturating_add(weight);
    }
    let mut out: Vec<(Vec<String>, u64)> = acc.into_iter().collect();
    out.sort_by(|a, b| b.1.cmp(&a.1).then_with(|| a.0.cmp(&b.0)));
    out
}

/// Writes the table of `keys`' groups: at most `limit` rows of Overhead (the share of the
/// samples' weight), Samples and one column per key, as `perf report --sort` shows them.
pub fn write_table(
    p: &Profile,
    keys: &[SortKey],
    limit: usize,
    w: &mut dyn Write,
) -> io::Result<()> {
    writeln!(w, "{}", crate::top::summary(p))?;
    let total = p.total_weight();
    if total == 0 {
        return Ok(());
    }
    let rows = groups(p, keys);
    let cells: Vec<Vec<String>> = rows
        .iter()
        .take(limit)
        .map(|(v, _)| v.iter().map(|x| escape(x).into_owned()).collect())
        .collect();
    // Each key column as wide as its widest cell (the last one left ragged).
    let widths: Vec<usize> = keys
        .iter()
        .enumerate()
        .map(|(i, k)| {
            cells
                .iter()
                .map(|c| c[i].chars().count())
                .chain([k.header().len()])
                .max()
                .unwrap_or(0)
        })
        .collect();
    let line = |first: String, second: String, cols: &[String]| -> String {
        let mut l = format!("{first:>9} {second:>9}");
        for (i, c) in cols.iter().enumerate() {
            if i + 1 == cols.len() {
                l.push_str(&format!("  {c}"));
            } else {
                l.push_str(&format!("  {c:<width$}", width = widths[i]));
            }
        }
        l
    };
    let headers: Vec<String> = keys.iter().map(|k| k.header().to_owned()).collect();
    let count = if p.meta.counted() {
        "Events"
    } else {
        "Samples"
    };
    writeln!(w, "{}", line("Overhead".into(), count.into(), &headers))?;
    for ((_, weight), c) in rows.iter().zip(&cells) {
        let share = format!("{:.2}%", 100.0 * *weight as f64 / total as f64);
        writeln!(w, "{}", line(share, weight.to_string(), c))?;
    }
    if rows.len() > limit {
        writeln!(w, "({} more groups)", rows.len() - limit)?;
    }
    Ok(())
}

/// Writes folded stacks whose roots are the sample's thread keys of `keys` (comm, pid, tid, in
/// their order) instead of the thread name, and whose frames are named by its frame keys: the
/// function (`sym`, or no frame key), the module's file name (`dso`), or both (`FUNCTION
/// [MODULE]`).
pub fn write_folded(p: &Profile, keys: &[SortKey], w: &mut dyn Write) -> io::Result<()> {
    let names = process_names(p);
    let roots: Vec<SortKey> = keys.iter().copied().filter(|k| !k.of_frame()).collect();
    let (sym, dso) = (keys.contains(&SortKey::Sym), keys.contains(&SortKey::Dso));
    let frame_name = |f: &Frame| -> String {
        let module = module_name(p.str(f.module));
        match (sym, dso) {
            (false, true) => module.to_owned(),
            (true, true) => format!("{} [{module}]", p.str(f.function)),
            _ => p.str(f.function).to_owned(),
        }
    };
    let lines = crate::folded::collapse_with(
        p,
        |thread| values(p, &names, &roots, (thread, None)),
        frame_name,
    );
    for (stack, count) in lines {
        writeln!(w, "{stack} {count}")?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Two processes: cc (pid 10, two threads) and ld (pid 20), in libc and in themselves.
    fn build() -> Profile {
        let mut p = Profile::default();
        let cc = p.add_thread(10, 10, "cc");
        let cc2 = p.add_thread(10, 11, "cc-worker");
        let ld = p.add_thread(20, 20, "ld");
        let main = p.intern_frame_named("main", "/usr/bin/cc", None, 0, 1, false);
        let parse = p.intern_frame_named("parse", "/usr/bin/cc", None, 0, 2, false);
        let memcpy = p.intern_frame_named("memcpy", "/lib/libc.so.6", None, 0, 3, false);
        let m = p.intern_stack(None, main);
        let mp = p.intern_stack(Some(m), parse);
        let mpc = p.intern_stack(Some(mp), memcpy);
        p.add_sample(0, cc, 0, 3, Some(mp));
        p.add_sample(0, cc2, 0, 1, Some(mpc));
        p.add_sample(0, ld, 0, 4, Some(mpc));
        p
    }

    fn text(f: impl Fn(&mut Vec<u8>) -> io::Result<()>) -> String {
        let mut out = Vec::new();
        f(&mut out).unwrap();
        String::from_utf8(out).unwrap()
    }

    #[test]
    fn keys_are_perfs_and_each_once() {
        assert_eq!(
            SortKey::parse_list("comm,dso").unwrap(),
            vec![SortKey::Comm, SortKey::Dso]
        );
        assert!(SortKey::parse_list("comm,comm").is_err());
        assert!(SortKey::parse_list("cpu")
            .unwrap_err()
            .contains("unknown sort key 'cpu'"));
    }

    #[test]
    fn groups_split_by_process_name_then_module() {
        let p = build();
        let g = groups(&p, &[SortKey::Comm]);
        // cc's second thread is named by its process (its main thread), not by itself.
        assert_eq!(g, vec![(vec!["cc".into()], 4), (vec!["ld".into()], 4)]);
        let g = groups(&p, &[SortKey::Comm, SortKey::Dso]);
        assert_eq!(
            g,
            vec![
                (vec!["ld".into(), "libc.so.6".into()], 4),
                (vec!["cc".into(), "cc".into()], 3),
                (vec!["cc".into(), "libc.so.6".into()], 1),
            ]
        );
        let table = text(|w| write_table(&p, &[SortKey::Pid, SortKey::Sym], 10, w));
        assert!(table.contains("Overhead   Samples  Pid  Symbol"), "{table}");
        assert!(
            table.contains("   50.00%         4  20   memcpy"),
            "{table}"
        );
    }

    #[test]
    fn folded_roots_are_the_thread_keys() {
        let p = build();
        let f = text(|w| write_folded(&p, &[SortKey::Comm], w));
        assert_eq!(
            f,
            "cc;main;parse 3\ncc;main;parse;memcpy 1\nld;main;parse;memcpy 4\n"
        );
        let f = text(|w| write_folded(&p, &[SortKey::Pid, SortKey::Tid, SortKey::Dso], w));
        assert!(f.contains("10;11;cc;cc;libc.so.6 1\n"), "{f}");
        // Frame keys only: no root, the stacks by module.
        let f = text(|w| write_folded(&p, &[SortKey::Dso], w));
        assert_eq!(f, "cc;cc 3\ncc;cc;libc.so.6 5\n");
    }
}
