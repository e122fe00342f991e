//! JIT code's names from a perf map, `/tmp/perf-PID.map`: one `START SIZE NAME` line (hex,
//! without 0x) per piece of generated code, written by the runtime as it compiles (node
//! `--perf-basic-prof`, Java with a perf-map agent or `-XX:+DumpPerfMapAtExit`, .NET, LuaJIT,
//! Python 3.12 `-X perf`, wasmtime). The file sits in a shared folder: it is taken only when it
//! is a regular file (not a link) owned by root, by this user, or by the profiled program's
//! user, and it is read with caps on its size and lines.

use std::io::Read;
use std::path::{Path, PathBuf};

/// At most `max` bytes of a file a program wrote for its profiler, in a shared folder: read
/// only when it is a regular file (not a link) owned by root, this user, or `owner` (the
/// program's user).
pub(crate) fn read_trusted(path: &Path, owner: Option<u32>, max: u64) -> Option<Vec<u8>> {
    read_trusted_from(path, owner, 0, max)
}

/// As [`read_trusted`], from offset `from` of the file.
pub(crate) fn read_trusted_from(
    path: &Path,
    owner: Option<u32>,
    from: u64,
    max: u64,
) -> Option<Vec<u8>> {
    use std::io::Seek;
    use std::os::unix::fs::{MetadataExt, OpenOptionsExt};
    // O_NONBLOCK: a FIFO planted under the name must not hold the open (and the profiled
    // program, for libsuperprof) for ever; it is refused below as no regular file.
    let file = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NOFOLLOW | libc::O_NONBLOCK)
        .open(path)
        .ok()?;
    let meta = file.metadata().ok()?;
    let me = std::fs::metadata("/proc/self").map_or(u32::MAX, |m| m.uid());
    if !meta.is_file() || !(meta.uid() == 0 || meta.uid() == me || Some(meta.uid()) == owner) {
        return None;
    }
    let mut file = file;
    file.seek(std::io::SeekFrom::Start(from)).ok()?;
    let mut bytes = Vec::new();
    file.take(max).read_to_end(&mut bytes).ok()?;
    Some(bytes)
}

/// The largest map read.
pub const MAX_MAP: u64 = 256 << 20;
/// The most code ranges kept from one map (about 100 MB of names and ranges): a map with more
/// lines keeps its first ones (issue 31: a 3-million-line map cost 1.2 GB).
pub const MAX_ENTRIES: usize = 1 << 20;
/// The longest name kept.
const MAX_NAME: usize = 1024;

/// Code ranges and their names, sorted by start; a later line for the same start wins (code
/// recompiled in place).
#[derive(Debug, Default)]
pub struct PerfMap {
    entries: Vec<(u64, u64, String)>,
    /// The file it was read from (empty for a map made by [`PerfMap::parse`]).
    pub path: PathBuf,
}

impl PerfMap {
    /// The map of process `pid` in `dir` (normally /tmp), if there is one that may be trusted
    /// (owned by root, the current user, or `owner`).
    pub fn load(dir: &Path, pid: u32, owner: Option<u32>) -> Option<PerfMap> {
        let path = dir.join(format!("perf-{pid}.map"));
        let bytes = read_trusted(&path, owner, MAX_MAP)?;
        let mut map = PerfMap::parse(&String::from_utf8_lossy(&bytes));
        drop(bytes);
        map.path = path;
        Some(map)
    }

    /// Parses a perf map's text. Lines that are not `START SIZE NAME` (hex, `0x` optional)
    /// with a nonzero size are skipped; names are cut at 1024 bytes.
    pub fn parse(text: &str) -> PerfMap {
        let mut entries: Vec<(u64, u64, String, usize)> = Vec::new();
        for (line_no, line) in text.lines().enumerate() {
            if entries.len() >= MAX_ENTRIES {
                break;
            }
            let mut parts = line.splitn(3, ' ');
            let (Some(start), Some(size), Some(name)) = (parts.next(), parts.next(), parts.next())
            else {
                continue;
            };
            let hex = |s: &str| u64::from_str_radix(s.trim_start_matches("0x"), 16).ok();
            let (Some(start), Some(size)) = (hex(start), hex(size)) else {
                continue;
            };
            let Some(end) = start.checked_add(size).filter(|_| size > 0) else {
                continue;
            };
            let mut name = name.trim_end().to_owned();
            if name.len() > MAX_NAME {
                let mut cut = MAX_NAME;
                while !name.is_char_boundary(cut) {
                    cut -= 1;
                }
                name.truncate(cut);
            }
            entries.push((start, end, name, line_no));
        }
        // By start; for one start, the last line written last.
        entries.sort_by(|a, b| a.0.cmp(&b.0).then(b.3.cmp(&a.3)));
        entries.dedup_by_key(|e| e.0);
        PerfMap {
            entries: entries.into_iter().map(|(s, e, n, _)| (s, e, n)).collect(),
            path: PathBuf::new(),
        }
    }

    /// The name of the code at `addr`.
    pub fn lookup(&self, addr: u64) -> Option<&str> {
        let i = self.entries.partition_point(|e| e.0 <= addr);
        // Ranges may nest or overlap (a stub inside a region): the closest start that still
        // covers the address.
        self.entries[..i]
            .iter()
            .rev()
            .take(16)
            .find(|e| addr < e.1)
            .map(|e| e.2.as_str())
    }

    /// How many code ranges the map names (one per start address).
    pub fn len(&self) -> usize {
        self.entries.len()
    }

    /// Whether the map names no code.
    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_map_keeps_at_most_max_entries() {
        let text: String = (0..MAX_ENTRIES as u64 + 5000)
            .map(|i| format!("{:x} 10 f{i}\n", 0x1000 + i * 0x10))
            .collect();
        let m = PerfMap::parse(&text);
        assert_eq!(m.len(), MAX_ENTRIES);
        assert_eq!(m.lookup(0x1000), Some("f0"));
    }

    #[test]
    fn lines_of_node_java_and_junk() {
        let m = PerfMap::parse(
            "3a1c0e5c3c0 7c JS:*hotLoop /tmp/x.js:3:17\n\
             3a1c0e5c500 40 Builtin:ArgumentsAdaptorTrampoline\n\
             7f00001000 0x100 Interpreter\n\
             7f00001040 20 LazyCompile:~f x.js:1\n\
             zz 10 bad\n\
             10 0 empty\n\
             ffffffffffffffff 10 wraps\n\
             3a1c0e5c3c0 7c JS:*hotLoop recompiled\n",
        );
        assert_eq!(
            m.lookup(0x3a1c0e5c3c0 + 0x10),
            Some("JS:*hotLoop recompiled")
        );
        assert_eq!(m.lookup(0x3a1c0e5c3c0 + 0x7c), None);
        assert_eq!(
            m.lookup(0x3a1c0e5c510),
            Some("Builtin:ArgumentsAdaptorTrampoline")
        );
        // Nested: the innermost start that covers it.
        assert_eq!(m.lookup(0x7f00001048), Some("LazyCompile:~f x.js:1"));
        assert_eq!(m.lookup(0x7f00001080), Some("Interpreter"));
        assert_eq!(m.lookup(0x10), None);
        assert_eq!(m.len(), 4);
    }

    #[test]
    fn a_map_of_someone_else_or_a_link_is_not_read() {
        let dir = std::env::temp_dir().join(format!("superprof-perfmap-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::write(dir.join("perf-1.map"), "1000 10 f\n").unwrap();
        assert_eq!(
            PerfMap::load(&dir, 1, None).unwrap().lookup(0x1008),
            Some("f")
        );
        std::os::unix::fs::symlink(dir.join("perf-1.map"), dir.join("perf-2.map")).unwrap();
        assert!(PerfMap::load(&dir, 2, None).is_none());
        // A FIFO with nobody writing: refused at once, not waited on.
        let fifo = dir.join("perf-4.map");
        let made = std::process::Command::new("mkfifo").arg(&fifo).status();
        assert!(made.is_ok_and(|s| s.success()), "mkfifo {}", fifo.display());
        let t = std::time::Instant::now();
        assert!(PerfMap::load(&dir, 4, None).is_none());
        assert!(t.elapsed() < std::time::Duration::from_secs(1));
        assert!(PerfMap::load(&dir, 3, None).is_none());
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
