//! /proc/PID/maps, parsed once in one place; and a process's threads (/proc/PID/task).

use std::path::PathBuf;

/// One executable, file-backed mapping of a process.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MapEntry {
    /// The first address of the mapping.
    pub start: u64,
    /// The address just past the mapping (exclusive).
    pub end: u64,
    /// File offset mapped at `start`.
    pub offset: u64,
    /// The path as the process names it (absolute), or a pseudo-file such as `[vdso]`.
    pub path: PathBuf,
}

/// The threads of process `pid`, by id, in order.
pub fn list_threads(pid: u32) -> std::io::Result<Vec<u32>> {
    let mut tids: Vec<u32> = std::fs::read_dir(format!("/proc/{pid}/task"))?
        .filter_map(|e| e.ok()?.file_name().to_str()?.parse().ok())
        .collect();
    tids.sort_unstable();
    Ok(tids)
}

/// The executable mappings of `pid` that have a name (files and `[vdso]`).
pub fn executable_mappings(pid: u32) -> std::io::Result<Vec<MapEntry>> {
    let text = std::fs::read_to_string(format!("/proc/{pid}/maps"))?;
    Ok(parse(&text))
}

/// Parses the text of a maps file.
pub fn parse(text: &str) -> Vec<MapEntry> {
    text.lines()
        .filter_map(|line| {
            let mut f = line.split_whitespace();
            let (range, perms, off) = (f.next()?, f.next()?, f.next()?);
            let (_dev, _inode) = (f.next()?, f.next()?);
            // Paths may contain spaces: the rest of the line.
            let path = f.collect::<Vec<_>>().join(" ");
            if !perms.contains('x') || path.is_empty() {
                return None;
            }
            let (a, b) = range.split_once('-')?;
            Some(MapEntry {
                start: u64::from_str_radix(a, 16).ok()?,
                end: u64::from_str_radix(b, 16).ok()?,
                offset: u64::from_str_radix(off, 16).ok()?,
                path: PathBuf::from(path),
            })
        })
        .collect()
}

#[cfg(test)]
mod tests {
    #[test]
    fn own_maps_have_this_executable() {
        let exe = std::fs::read_link("/proc/self/exe").unwrap();
        let maps = super::executable_mappings(std::process::id()).unwrap();
        assert!(maps.iter().any(|m| m.path == exe && m.end > m.start));
        assert!(
            super::parse("7f00-7f10 r--p 0 00:00 0 /x\n").is_empty(),
            "not executable"
        );
        let m = super::parse("1000-2000 r-xp 00003000 fe:00 12 /a dir/b c\n");
        assert_eq!(m[0].path.to_str(), Some("/a dir/b c"));
        assert_eq!(
            (m[0].start, m[0].end, m[0].offset),
            (0x1000, 0x2000, 0x3000)
        );
    }
}
