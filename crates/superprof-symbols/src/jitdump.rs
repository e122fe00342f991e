//! JIT code's names, and source lines where given, from a jitdump file (`jit-PID.dump`, the
//! format of the kernel's tools/perf/Documentation/jitdump-specification.txt), written by node
//! `--perf-prof`, Java's libperf-jvmti, wasmtime `--profile=jitdump`. The runtime maps the
//! file executable once as a marker, which is how the recording finds it. The file is the
//! program's: it is read only when it is a regular file (not a link) owned by root, this user
//! or the program's user, with checked offsets and caps on its size, records and names.

use std::collections::HashMap;
use std::path::{Path, PathBuf};

/// The largest jitdump read.
pub const MAX_DUMP: u64 = 1 << 30;
/// The most records taken.
const MAX_RECORDS: usize = 1 << 23;
/// The longest name kept.
const MAX_NAME: usize = 1024;
/// The largest piece of code taken (a larger one is a broken or hostile record; it would make
/// every lookup scan all the loads before it).
const MAX_CODE: u64 = 1 << 28;

const MAGIC: u32 = 0x4A69_5444; // "JiTD", in the writer's byte order
const CODE_LOAD: u32 = 0;
const CODE_MOVE: u32 = 1;
const CODE_DEBUG_INFO: u32 = 2;
const CODE_UNWINDING_INFO: u32 = 4;
/// The header's flag for times from the CPU's counter (TSC) instead of CLOCK_MONOTONIC.
const FLAG_ARCH_TIMESTAMP: u64 = 1;

/// The unwind tables a runtime gave for one piece of JIT code: its `.eh_frame` at runtime
/// address `eh_frame_at` (right after the code, 8-byte aligned, where the runtime puts it and
/// perf's `inject --jit` places it), and the `.eh_frame_hdr` after it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct JitUnwind {
    /// The code's name, from its load record.
    pub name: String,
    /// The runtime addresses of the code.
    pub code: std::ops::Range<u64>,
    /// The runtime address of `eh_frame`: the code's start plus its size rounded up to 8.
    pub eh_frame_at: u64,
    /// The `.eh_frame` bytes the runtime wrote (its CIEs and FDEs), as they are in the dump.
    pub eh_frame: Vec<u8>,
    /// The `.eh_frame_hdr` and its runtime address (right after `eh_frame`), where the record
    /// has one.
    pub hdr: Option<(u64, Vec<u8>)>,
}

/// One piece of code the runtime loaded (or moved): where, what, when (the record's
/// timestamp, CLOCK_MONOTONIC for the writers superprof reads), and its source lines.
#[derive(Debug)]
struct Load {
    start: u64,
    end: u64,
    name: String,
    time: u64,
    /// (address, line, file) rows, by address.
    lines: Vec<(u64, u32, String)>,
}

/// The code a dump describes, by start. A runtime frees code and loads other code at the same
/// address (a JVM's code cache does it all the time): an address's name at a given time is
/// that of the last load there before that time.
#[derive(Debug, Default)]
pub struct JitDump {
    /// By start, then in the order loaded.
    loads: Vec<Load>,
    /// The widest load (how far back from an address a covering load may start).
    widest: u64,
    /// Whether the records' times are CLOCK_MONOTONIC's (not the CPU's own counter, which
    /// JITDUMP_FLAGS_ARCH_TIMESTAMP announces): only then are they compared with samples'.
    monotonic: bool,
    /// The unwind tables of the code that has them, in the order loaded.
    pub unwind: Vec<JitUnwind>,
    /// The file it was read from (empty for a dump parsed from bytes).
    pub path: PathBuf,
}

fn u32_at(b: &[u8], at: usize) -> Option<u32> {
    Some(u32::from_le_bytes(
        b.get(at..at.checked_add(4)?)?.try_into().ok()?,
    ))
}

fn u64_at(b: &[u8], at: usize) -> Option<u64> {
    Some(u64::from_le_bytes(
        b.get(at..at.checked_add(8)?)?.try_into().ok()?,
    ))
}

/// The NUL-terminated string at `at` (cut at MAX_NAME), and the offset after its NUL.
fn str_at(b: &[u8], at: usize, end: usize) -> Option<(String, usize)> {
    let rest = b.get(at..end)?;
    let len = rest.iter().position(|&c| c == 0)?;
    let s = String::from_utf8_lossy(&rest[..len.min(MAX_NAME)]).into_owned();
    Some((s, at + len + 1))
}

impl JitDump {
    /// The dump at `path`, if it may be trusted (see the module's notes) and parses.
    pub fn load(path: &Path, owner: Option<u32>) -> Option<JitDump> {
        let bytes = crate::perfmap::read_trusted(path, owner, MAX_DUMP)?;
        let mut d = JitDump::parse(&bytes)?;
        d.path = path.to_owned();
        Some(d)
    }

    /// Parses a little-endian jitdump (the byte order of the machines superprof runs on).
    pub fn parse(b: &[u8]) -> Option<JitDump> {
        let mut r = Records::default();
        read_records(b, header_end(b)?, &mut r);
        // Lines given after their load (against the specification, which puts them before):
        // the last load at that address takes them.
        for (code, rows) in r.pending_lines.drain() {
            if let Some(l) = r.loads.iter_mut().rev().find(|l| l.start == code) {
                if l.lines.is_empty() {
                    l.lines = rows;
                }
            }
        }
        let mut loads = r.loads;
        // Stable: loads at one start stay in the order loaded.
        loads.sort_by_key(|l| l.start);
        let widest = loads.iter().map(|l| l.end - l.start).max().unwrap_or(0);
        Some(JitDump {
            loads,
            widest,
            monotonic: u64_at(b, 32).is_some_and(|flags| flags & FLAG_ARCH_TIMESTAMP == 0),
            unwind: r.unwind,
            path: PathBuf::new(),
        })
    }

    /// The name of the code at `addr`, with its source file and line where the dump has them:
    /// of the last load there at or before `time` (the sample's, CLOCK_MONOTONIC), else of the
    /// first load after it (code may run before its record is written); with no time, of the
    /// last load.
    pub fn lookup_at(&self, addr: u64, time: Option<u64>) -> Option<(&str, Option<(&str, u32)>)> {
        let time = time.filter(|_| self.monotonic);
        let i = self.loads.partition_point(|l| l.start <= addr);
        let from = self
            .loads
            .partition_point(|l| l.start < addr.saturating_sub(self.widest));
        let mut best: Option<&Load> = None;
        let mut first_after: Option<&Load> = None;
        for l in self.loads[from..i].iter().filter(|l| addr < l.end) {
            match time {
                Some(t) if l.time > t => {
                    if first_after.is_none_or(|f| l.time < f.time) {
                        first_after = Some(l);
                    }
                }
                _ => {
                    if best.is_none_or(|b| l.time >= b.time) {
                        best = Some(l);
                    }
                }
            }
        }
        let l = best.or(first_after)?;
        let j = l.lines.partition_point(|r| r.0 <= addr);
        let line = j
            .checked_sub(1)
            .and_then(|j| l.lines.get(j))
            .map(|r| (r.2.as_str(), r.1));
        Some((l.name.as_str(), line))
    }

    /// [`JitDump::lookup_at`] with no time: the last load at `addr`.
    pub fn lookup(&self, addr: u64) -> Option<(&str, Option<(&str, u32)>)> {
        self.lookup_at(addr, None)
    }

    /// How many pieces of code the dump describes (each load and each move counts once).
    pub fn len(&self) -> usize {
        self.loads.len()
    }

    /// Whether the dump describes no code.
    pub fn is_empty(&self) -> bool {
        self.loads.is_empty()
    }
}

/// Where a dump's records start, if it is a jitdump.
fn header_end(b: &[u8]) -> Option<usize> {
    if u32_at(b, 0)? != MAGIC {
        return None;
    }
    Some((u32_at(b, 8)? as usize).max(40))
}

/// What the records of a dump say.
#[derive(Default)]
struct Records {
    /// In the order loaded.
    loads: Vec<Load>,
    /// Source lines for the next load at a code address (they come before it).
    pending_lines: HashMap<u64, Vec<(u64, u32, String)>>,
    unwind: Vec<JitUnwind>,
    /// Records read so far.
    n: usize,
}

/// Reads the records of `b` from offset `at` into `r`; the offset where a later read may go
/// on (after the last whole record, or at an unwinding record whose code load is not there
/// yet).
///
/// (One function of 127 lines: one match over the record kinds, whose arms share the `pending`
/// unwinding info (it waits for its code load) and the `resume` offset across records.)
fn read_records(b: &[u8], mut at: usize, r: &mut Records) -> usize {
    // Unwinding info comes before the load it belongs to: (eh_frame, header), and where its
    // record starts.
    let mut pending: Option<(Vec<u8>, Vec<u8>, usize)> = None;
    let mut resume = at;
    while r.n < MAX_RECORDS {
        let (Some(id), Some(size)) = (u32_at(b, at), u32_at(b, at + 4)) else {
            break;
        };
        let size = size as usize;
        let Some(end) = at.checked_add(size).filter(|&e| size >= 16 && e <= b.len()) else {
            break; // cut short (the program still writing) or broken: what came before stays
        };
        let body = at + 16;
        let time = u64_at(b, at + 8).unwrap_or(0);
        match id {
            CODE_LOAD => {
                // pid, tid, vma, code_addr, code_size, code_index, name, code
                if let (Some(addr), Some(len), Some((name, _))) = (
                    u64_at(b, body + 16),
                    u64_at(b, body + 24),
                    str_at(b, body + 40, end),
                ) {
                    let end = addr.checked_add(len).filter(|_| len > 0 && len <= MAX_CODE);
                    let aligned = len.checked_add(7).and_then(|l| addr.checked_add(l & !7));
                    if let (Some(e), Some(eh_frame_at)) = (end, aligned) {
                        if let Some((eh_frame, hdr, _)) = pending.take() {
                            let hdr_at = eh_frame_at.saturating_add(eh_frame.len() as u64);
                            r.unwind.push(JitUnwind {
                                name: name.clone(),
                                code: addr..e,
                                eh_frame_at,
                                eh_frame,
                                hdr: (!hdr.is_empty()).then_some((hdr_at, hdr)),
                            });
                        }
                        let lines = r.pending_lines.remove(&addr).unwrap_or_default();
                        r.loads.push(Load {
                            start: addr,
                            end: e,
                            name,
                            time,
                            lines,
                        });
                    }
                }
                pending = None;
            }
            CODE_MOVE => {
                // pid, tid, vma, old_code_addr, new_code_addr, code_size, code_index
                if let (Some(old), Some(new), Some(len)) = (
                    u64_at(b, body + 16),
                    u64_at(b, body + 24),
                    u64_at(b, body + 32),
                ) {
                    let found = r.loads.iter().rev().find(|l| l.start == old);
                    let moved = found.map(|l| {
                        let lines = l
                            .lines
                            .iter()
                            .map(|(a, n, f)| (a.wrapping_sub(old).wrapping_add(new), *n, f.clone()))
                            .collect();
                        (l.name.clone(), lines)
                    });
                    if let (Some((name, lines)), Some(e)) = (
                        moved,
                        new.checked_add(len).filter(|_| len > 0 && len <= MAX_CODE),
                    ) {
                        r.loads.push(Load {
                            start: new,
                            end: e,
                            name,
                            time,
                            lines,
                        });
                    }
                }
            }
            CODE_UNWINDING_INFO => {
                // unwinding_size, eh_frame_hdr_size, mapped_size, then the eh_frame and, at
                // its end, the eh_frame_hdr (the layout V8 writes and perf reads). A table
                // without an FDE (a header and an empty eh_frame) is left out.
                pending = None;
                if let (Some(size), Some(hdr)) = (u64_at(b, body), u64_at(b, body + 8)) {
                    // Inside this record: a size reaching past it is refused.
                    let data = usize::try_from(size)
                        .ok()
                        .and_then(|s| (body + 24).checked_add(s))
                        .filter(|&e| e <= end)
                        .and_then(|e| b.get(body + 24..e));
                    if let (Some(data), Ok(hdr)) = (data, usize::try_from(hdr)) {
                        if hdr < data.len() && data.len() - hdr > 8 {
                            let (eh, h) = data.split_at(data.len() - hdr);
                            pending = Some((eh.to_vec(), h.to_vec(), at));
                        }
                    }
                }
            }
            CODE_DEBUG_INFO => {
                // code_addr, nr_entry, entries of (addr, lineno, discrim, name)
                if let (Some(code), Some(count)) = (u64_at(b, body), u64_at(b, body + 8)) {
                    let mut rows = Vec::new();
                    let mut p = body + 16;
                    for _ in 0..count.min(1 << 20) {
                        let (Some(addr), Some(line)) = (u64_at(b, p), u32_at(b, p + 8)) else {
                            break;
                        };
                        let Some((file, next)) = str_at(b, p + 16, end) else {
                            break;
                        };
                        rows.push((addr, line, file));
                        p = next;
                    }
                    rows.sort_by_key(|r| r.0);
                    r.pending_lines.insert(code, rows);
                }
            }
            _ => {}
        }
        at = end;
        r.n += 1;
        if pending.is_none() {
            resume = at;
        }
    }
    pending.map_or(resume, |p| p.2)
}

/// Reads the unwind tables of a jitdump as it grows: each read takes only the records written
/// since the last one (a long-running JVM's dump reaches hundreds of MB).
#[derive(Debug)]
pub struct JitUnwindReader {
    path: PathBuf,
    owner: Option<u32>,
    /// Where the next read starts (0: at the header).
    at: u64,
    /// The file's size at the last read.
    size: u64,
}

impl JitUnwindReader {
    /// A reader of the jitdump at `path`, taken only when [`JitDump::load`] would take it
    /// (owned by root, this user or `owner`); nothing is read until
    /// [`JitUnwindReader::read_new`].
    pub fn new(path: &Path, owner: Option<u32>) -> JitUnwindReader {
        JitUnwindReader {
            path: path.to_owned(),
            owner,
            at: 0,
            size: 0,
        }
    }

    /// The unwind tables written since the last call, in the order loaded (code loaded again
    /// at an address replaces what was there); nothing when the file has not grown.
    pub fn read_new(&mut self) -> Vec<JitUnwind> {
        let len = std::fs::metadata(&self.path).map_or(0, |m| m.len());
        if len <= self.size || self.at >= MAX_DUMP {
            return Vec::new();
        }
        self.size = len;
        let Some(b) =
            crate::perfmap::read_trusted_from(&self.path, self.owner, self.at, MAX_DUMP - self.at)
        else {
            return Vec::new();
        };
        let start = if self.at == 0 {
            match header_end(&b) {
                // The header written whole.
                Some(h) if h <= b.len() => h,
                // Not yet: read it again when the file grows.
                _ if b.len() < 12 || u32_at(&b, 0) == Some(MAGIC) => return Vec::new(),
                _ => {
                    self.at = MAX_DUMP; // not a jitdump: never read again
                    return Vec::new();
                }
            }
        } else {
            0
        };
        let mut r = Records::default();
        let resume = read_records(&b, start, &mut r);
        self.at = self.at.saturating_add(resume as u64);
        r.unwind
    }
}

/// Whether a mapped file is a jitdump marker (`jit-PID.dump`).
pub fn is_jitdump(path: &Path) -> bool {
    path.file_name()
        .and_then(|n| n.to_str())
        .and_then(|n| n.strip_prefix("jit-")?.strip_suffix(".dump"))
        .is_some_and(|pid| !pid.is_empty() && pid.bytes().all(|c| c.is_ascii_digit()))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn record(id: u32, body: &[u8]) -> Vec<u8> {
        record_at(id, 0, body)
    }

    fn record_at(id: u32, time: u64, body: &[u8]) -> Vec<u8> {
        let mut r = Vec::new();
        r.extend_from_slice(&id.to_le_bytes());
        r.extend_from_slice(&((16 + body.len()) as u32).to_le_bytes());
        r.extend_from_slice(&time.to_le_bytes());
        r.extend_from_slice(body);
        r
    }

    fn load(addr: u64, size: u64, name: &str) -> Vec<u8> {
        let mut b = Vec::new();
        for v in [1u32, 1] {
            b.extend_from_slice(&v.to_le_bytes());
        }
        for v in [addr, addr, size, 0] {
            b.extend_from_slice(&v.to_le_bytes());
        }
        b.extend_from_slice(name.as_bytes());
        b.push(0);
        b.extend(std::iter::repeat_n(0x90u8, size as usize));
        record(CODE_LOAD, &b)
    }

    /// An unwinding record's body: 12 bytes of eh_frame (1s), then 4 of header (2s).
    fn unwinding() -> Vec<u8> {
        let mut unw = Vec::new();
        for v in [16u64, 4, 16] {
            unw.extend_from_slice(&v.to_le_bytes());
        }
        unw.extend_from_slice(&[1u8; 12]);
        unw.extend_from_slice(&[2u8; 4]);
        unw
    }

    fn dump(records: &[Vec<u8>]) -> Vec<u8> {
        let mut d = Vec::new();
        for v in [MAGIC, 1, 40, 62, 0, 1] {
            d.extend_from_slice(&v.to_le_bytes());
        }
        d.extend_from_slice(&[0u8; 16]);
        for r in records {
            d.extend_from_slice(r);
        }
        d
    }

    #[test]
    fn loads_moves_and_lines() {
        let mut dbg = Vec::new();
        for v in [0x1000u64, 2] {
            dbg.extend_from_slice(&v.to_le_bytes());
        }
        for (addr, line, file) in [(0x1000u64, 3u32, "x.js"), (0x1010, 4, "x.js")] {
            dbg.extend_from_slice(&addr.to_le_bytes());
            dbg.extend_from_slice(&line.to_le_bytes());
            dbg.extend_from_slice(&0u32.to_le_bytes());
            dbg.extend_from_slice(file.as_bytes());
            dbg.push(0);
        }
        let mut mv = Vec::new();
        for v in [1u32, 1] {
            mv.extend_from_slice(&v.to_le_bytes());
        }
        for v in [0u64, 0x2000, 0x3000, 0x20, 0] {
            mv.extend_from_slice(&v.to_le_bytes());
        }
        // Unwinding info for the next load: 12 bytes of eh_frame, 4 of header.
        let unw = unwinding();
        let d = dump(&[
            record(CODE_UNWINDING_INFO, &unw),
            load(0x1000, 0x3c, "JS:*hot"),
            record(CODE_DEBUG_INFO, &dbg),
            load(0x2000, 0x20, "LazyCompile:~cold"),
            record(CODE_MOVE, &mv),
        ]);
        let j = JitDump::parse(&d).unwrap();
        // The tables after the code, 8-byte aligned, the header after them; only that load.
        assert_eq!(
            j.unwind,
            vec![JitUnwind {
                name: "JS:*hot".into(),
                code: 0x1000..0x103c,
                eh_frame_at: 0x1040,
                eh_frame: vec![1; 12],
                hdr: Some((0x104c, vec![2; 4])),
            }]
        );
        assert_eq!(j.lookup(0x1014), Some(("JS:*hot", Some(("x.js", 4)))));
        assert_eq!(j.lookup(0x1004), Some(("JS:*hot", Some(("x.js", 3)))));
        assert_eq!(j.lookup(0x3010), Some(("LazyCompile:~cold", None)));
        assert_eq!(j.lookup(0x1040), None);
        // Cut anywhere, or scribbled on: no panic, what came before stays.
        for cut in 0..d.len() {
            let _ = JitDump::parse(&d[..cut]);
        }
        let mut bad = d.clone();
        bad[44] = 0xff; // a record size of 4 GiB
        bad[45] = 0xff;
        bad[46] = 0xff;
        bad[47] = 0xff;
        assert!(JitDump::parse(&bad).unwrap().is_empty());
        assert!(JitDump::parse(b"nope").is_none());
        // Unwinding info that claims more bytes than its record holds: left out, not copied
        // from the records after it.
        let mut big = Vec::new();
        for v in [1u64 << 20, 4, 0] {
            big.extend_from_slice(&v.to_le_bytes());
        }
        big.extend_from_slice(&[1u8; 16]);
        let d = dump(&[record(CODE_UNWINDING_INFO, &big), load(0x5000, 0x10, "f")]);
        let j = JitDump::parse(&d).unwrap();
        assert!(j.unwind.is_empty());
        assert_eq!(j.lookup(0x5004), Some(("f", None)));
        assert!(is_jitdump(Path::new("/tmp/jit-1234.dump")));
        assert!(!is_jitdump(Path::new("/tmp/jit-.dump")));
        assert!(!is_jitdump(Path::new("/tmp/perf-1.map")));
    }

    /// Code freed and other code loaded at the same address: each sample gets the name of the
    /// code there at its time.
    #[test]
    fn reused_addresses_by_time() {
        let at = |t: u64, addr: u64, size: u64, name: &str| {
            let mut r = load(addr, size, name);
            r[8..16].copy_from_slice(&t.to_le_bytes());
            r
        };
        let mut dbg = Vec::new();
        for v in [0x1000u64, 1, 0x1000, 7] {
            dbg.extend_from_slice(&v.to_le_bytes());
        }
        dbg.extend_from_slice(b"B.java\0");
        let d = dump(&[
            at(10, 0x1000, 0x40, "A"),
            record_at(CODE_DEBUG_INFO, 19, &dbg),
            at(20, 0x1000, 0x20, "B"),
            at(30, 0x1010, 0x100, "C"),
        ]);
        let j = JitDump::parse(&d).unwrap();
        assert_eq!(j.lookup_at(0x1004, Some(15)), Some(("A", None)));
        assert_eq!(
            j.lookup_at(0x1004, Some(25)),
            Some(("B", Some(("B.java", 7))))
        );
        // Before any load: the first one after.
        assert_eq!(j.lookup_at(0x1004, Some(5)), Some(("A", None)));
        assert_eq!(j.lookup_at(0x1030, Some(25)), Some(("A", None)));
        assert_eq!(j.lookup_at(0x1030, Some(35)), Some(("C", None)));
        assert_eq!(j.lookup_at(0x1100, Some(35)), Some(("C", None)));
        assert_eq!(j.lookup_at(0x1110, Some(35)), None);
        assert_eq!(j.lookup(0x1004), Some(("B", Some(("B.java", 7)))));
        // A load claiming more code than any runtime makes is left out (it would make every
        // lookup scan the loads before it).
        let mut huge = load(0x10_0000, 0x10, "huge");
        huge[40..48].copy_from_slice(&(1u64 << 40).to_le_bytes());
        let j = JitDump::parse(&dump(&[huge, at(1, 0x2000, 0x10, "f")])).unwrap();
        assert_eq!(j.len(), 1);
        assert_eq!(j.lookup_at(0x20_0000, None), None);
    }

    /// The reader takes each table once, as the file grows, even when the growth cuts a
    /// record or falls between an unwinding record and its code load.
    #[test]
    fn reader_goes_on_where_it_stopped() {
        let unw = unwinding();
        let d = dump(&[
            record(CODE_UNWINDING_INFO, &unw),
            load(0x1000, 0x10, "a"),
            load(0x2000, 0x10, "b"),
            record(CODE_UNWINDING_INFO, &unw),
            load(0x3000, 0x10, "c"),
        ]);
        let dir = std::env::temp_dir().join(format!("jitreader-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("jit-1.dump");
        // Every cut point: the tables read in two pieces are those read whole.
        for cut in 0..=d.len() {
            std::fs::write(&path, &d[..cut]).unwrap();
            let mut r = JitUnwindReader::new(&path, None);
            let mut names: Vec<String> = r.read_new().into_iter().map(|u| u.name).collect();
            assert!(r.read_new().is_empty(), "nothing new at {cut}");
            std::fs::write(&path, &d).unwrap();
            names.extend(r.read_new().into_iter().map(|u| u.name));
            assert_eq!(names, ["a", "c"], "cut at {cut}");
        }
        // A file that is no jitdump is not read again.
        std::fs::write(&path, b"not a dump at all, not at all").unwrap();
        let mut r = JitUnwindReader::new(&path, None);
        assert!(r.read_new().is_empty());
        std::fs::write(&path, &d).unwrap();
        assert!(r.read_new().is_empty());
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
