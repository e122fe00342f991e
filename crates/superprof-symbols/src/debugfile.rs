//! Finding a separate debug file: by build id, then by `.gnu_debuglink`.

use std::path::{Path, PathBuf};

use object::{Object, ObjectSection};

const DEBUG_ROOT: &str = "/usr/lib/debug";

fn parse(path: &Path) -> Option<(memmap2::Mmap, ())> {
    Some((crate::sys::map_file(path).ok()?, ()))
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
        if id.len() > 1 {
            let hex: String = id.iter().map(|b| format!("{b:02x}")).collect();
            let candidate = PathBuf::from(format!(
                "{DEBUG_ROOT}/.build-id/{}/{}.debug",
                &hex[..2],
                &hex[2..]
            ));
            if candidate.is_file() {
                return Some(candidate);
            }
        }
    }
    if let Ok(Some((name, crc))) = obj.gnu_debuglink() {
        let name = debuglink_name(name)?;
        let dir = path.parent()?;
        let rel = dir.strip_prefix("/").unwrap_or(dir);
        let candidates = [
            dir.join(name),
            dir.join(".debug").join(name),
            Path::new(DEBUG_ROOT).join(rel).join(name),
        ];
        return candidates
            .into_iter()
            .find(|c| c.is_file() && c != path && crc_matches(c, crc));
    }
    None
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
/// debuglink records: a stale or unrelated file of the same name is skipped.
fn crc_matches(path: &Path, crc: u32) -> bool {
    crate::sys::map_file(path).is_ok_and(|map| crc32fast::hash(&map) == crc)
}

#[cfg(test)]
mod tests {
    use super::{crc_matches, debuglink_name};

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
