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
    if let Ok(Some((name, _crc))) = obj.gnu_debuglink() {
        let name = std::str::from_utf8(name).ok()?;
        let dir = path.parent()?;
        let rel = dir.strip_prefix("/").unwrap_or(dir);
        let candidates = [
            dir.join(name),
            dir.join(".debug").join(name),
            Path::new(DEBUG_ROOT).join(rel).join(name),
        ];
        return candidates.into_iter().find(|c| c.is_file() && c != path);
    }
    None
}
