//! Finding a separate debug file: by build id, then by `.gnu_debuglink`.

use std::path::{Path, PathBuf};

use object::{Object, ObjectSection};

const DEBUG_ROOT: &str = "/usr/lib/debug";

fn parse(path: &Path) -> Option<(memmap2::Mmap, ())> {
    Some((superprof_unwind::map_file(path).ok()?, ()))
}

/// Whether the file carries DWARF line or debug info itself.
pub fn has_dwarf(path: &Path) -> bool {
    let Some((map, ())) = parse(path) else {
        return false;
    };
    let Ok(obj) = object::File::parse(&*map) else {
        return false;
    };
    obj.section_by_name(".debug_info")
        .is_some_and(|s| s.size() > 0)
}

/// The separate debug file of `path`, if one is installed.
pub fn find(path: &Path) -> Option<PathBuf> {
    let (map, ()) = parse(path)?;
    let obj = object::File::parse(&*map).ok()?;
    if let Ok(Some(id)) = obj.build_id() {
        if let Some(hex) = crate::debuginfod::build_id_hex(id) {
            if let Some(c) = build_id_candidates(path, &hex)
                .into_iter()
                .find(|c| c.is_file())
            {
                return Some(c);
            }
        }
    }
    if let Ok(Some((name, crc))) = obj.gnu_debuglink() {
        let name = debuglink_name(name)?;
        return debuglink_candidates(path, name)
            .into_iter()
            .find(|c| c.is_file() && c != path && crc_matches(c, crc));
    }
    None
}

/// A path opened through a process's root (`/proc/PID/root/...`, a process in a container):
/// that root, and the path as the process names it. Other paths: no root.
fn split_proc_root(path: &Path) -> (Option<PathBuf>, &Path) {
    let mut parts = path.components();
    let root = (|| {
        use std::path::Component::{Normal, RootDir};
        let (RootDir, Normal(proc), Normal(pid), Normal(root)) =
            (parts.next()?, parts.next()?, parts.next()?, parts.next()?)
        else {
            return None;
        };
        let pid_ok = pid.to_str()?.bytes().all(|b| b.is_ascii_digit());
        (proc == "proc" && root == "root" && pid_ok)
            .then(|| Path::new("/").join(proc).join(pid).join(root))
    })();
    match root {
        Some(root) => (Some(root), parts.as_path()),
        None => (None, path),
    }
}

/// The debug folders to look in: the process's own `/usr/lib/debug` first (through its root),
/// then this machine's.
fn debug_roots(root: &Option<PathBuf>) -> Vec<PathBuf> {
    let mut roots = Vec::new();
    if let Some(r) = root {
        roots.push(r.join(DEBUG_ROOT.trim_start_matches('/')));
    }
    roots.push(PathBuf::from(DEBUG_ROOT));
    roots
}

/// Where the debug file of build id `hex` may be: `.build-id/xx/rest.debug` in each debug
/// folder.
fn build_id_candidates(path: &Path, hex: &str) -> Vec<PathBuf> {
    let (root, _) = split_proc_root(path);
    let mut c: Vec<PathBuf> = debug_roots(&root)
        .into_iter()
        .map(|d| {
            d.join(".build-id")
                .join(&hex[..2])
                .join(format!("{}.debug", &hex[2..]))
        })
        .collect();
    // What debuginfod fetched before (for gdb, perf or us), when it is in use.
    if std::env::var_os("DEBUGINFOD_URLS").is_some_and(|v| !v.is_empty()) {
        if let Some(cache) = crate::debuginfod::cache_dir() {
            c.push(crate::Debuginfod::cached_path(&cache, hex));
        }
    }
    c
}

/// The build id (hex) of a file that has no DWARF of its own and no debug file here: what a
/// debuginfod server would be asked for.
pub fn missing_debug_build_id(path: &Path) -> Option<String> {
    if has_dwarf(path) || find(path).is_some() {
        return None;
    }
    let (map, ()) = parse(path)?;
    let obj = object::File::parse(&*map).ok()?;
    crate::debuginfod::build_id_hex(obj.build_id().ok()??)
}

/// Where the debug file a `.gnu_debuglink` names may be, as gdb looks: beside the file, in
/// `.debug/` beside it, and under each debug folder at the file's own folder (as the process
/// names it, not as superprof reaches it through `/proc/PID/root`).
fn debuglink_candidates(path: &Path, name: &str) -> Vec<PathBuf> {
    let Some(dir) = path.parent() else {
        return Vec::new();
    };
    let (root, inside) = split_proc_root(path);
    let inside_dir = inside.parent().unwrap_or(Path::new(""));
    let rel = inside_dir.strip_prefix("/").unwrap_or(inside_dir);
    let mut c = vec![dir.join(name), dir.join(".debug").join(name)];
    c.extend(
        debug_roots(&root)
            .into_iter()
            .map(|d| d.join(rel).join(name)),
    );
    c
}

/// A `.gnu_debuglink` name, taken only as a file name (the file sits in one of the known
/// folders): not empty, no `/`, not `.` or `..`, no NUL, UTF-8. A name the target's ELF file
/// chose cannot point superprof elsewhere.
fn debuglink_name(name: &[u8]) -> Option<&str> {
    let name = std::str::from_utf8(name).ok()?;
    let plain = !name.is_empty() && name != "." && name != ".." && !name.contains(['/', '\0']);
    plain.then_some(name)
}

/// Whether the file's contents have the CRC-32 (zlib's, as gdb computes it) that the
/// debuglink records: a stale or unrelated file of the same name is skipped. Read through a
/// fixed buffer, not mapped: a huge (or sparse) file costs time, never memory (issue 31: a
/// link to a 4 GB sparse file cost 4.2 GB of resident memory).
fn crc_matches(path: &Path, crc: u32) -> bool {
    use std::io::Read;
    let Ok(mut file) = superprof_unwind::open_input(path) else {
        return false;
    };
    let mut hasher = crc32fast::Hasher::new();
    let mut buf = vec![0u8; 1 << 20];
    loop {
        match file.read(&mut buf) {
            Ok(0) => return hasher.finalize() == crc,
            Ok(n) => hasher.update(&buf[..n]),
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(_) => return false,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::{
        build_id_candidates, crc_matches, debuglink_candidates, debuglink_name, split_proc_root,
    };

    #[test]
    fn debuglink_names_are_plain_file_names() {
        assert_eq!(debuglink_name(b"libc.so.6.debug"), Some("libc.so.6.debug"));
        assert_eq!(debuglink_name(b"a..b.debug"), Some("a..b.debug"));
        for bad in [
            &b""[..],
            b".",
            b"..",
            b"../../etc/passwd",
            b"/etc/passwd",
            b"sub/x.debug",
            b"x\0y",
            b"\xff.debug",
        ] {
            assert_eq!(debuglink_name(bad), None, "{bad:?}");
        }
    }

    #[test]
    fn debug_files_of_a_process_in_a_container_are_looked_for_in_its_root_then_here() {
        use std::path::PathBuf;
        let p = |s: &str| PathBuf::from(s);
        assert_eq!(
            debuglink_candidates(&p("/proc/42/root/usr/bin/xz"), "xz.debug"),
            [
                p("/proc/42/root/usr/bin/xz.debug"),
                p("/proc/42/root/usr/bin/.debug/xz.debug"),
                p("/proc/42/root/usr/lib/debug/usr/bin/xz.debug"),
                p("/usr/lib/debug/usr/bin/xz.debug"),
            ]
        );
        assert_eq!(
            debuglink_candidates(&p("/usr/bin/xz"), "xz.debug"),
            [
                p("/usr/bin/xz.debug"),
                p("/usr/bin/.debug/xz.debug"),
                p("/usr/lib/debug/usr/bin/xz.debug"),
            ]
        );
        assert_eq!(
            build_id_candidates(&p("/proc/7/root/lib/libc.so.6"), "abcdef"),
            [
                p("/proc/7/root/usr/lib/debug/.build-id/ab/cdef.debug"),
                p("/usr/lib/debug/.build-id/ab/cdef.debug"),
            ]
        );
        // Not a process root: the path as it is.
        assert_eq!(split_proc_root(&p("/proc/self/exe")).0, None);
        assert_eq!(split_proc_root(&p("/proc/12/rootx/a")).0, None);
    }

    #[test]
    fn crc_is_the_gnu_debuglink_crc32() {
        // The CRC-32 check value, and what `objcopy --add-gnu-debuglink` records for these bytes.
        assert_eq!(crc32fast::hash(b"123456789"), 0xcbf4_3926);
        let path = std::env::temp_dir().join(format!("superprof-crc-{}.debug", std::process::id()));
        std::fs::write(&path, b"123456789").unwrap();
        assert!(crc_matches(&path, 0xcbf4_3926));
        assert!(!crc_matches(&path, 0xcbf4_3927));
        assert!(!crc_matches(&path.with_extension("missing"), 0xcbf4_3926));
        std::fs::remove_file(&path).unwrap();
    }
}
