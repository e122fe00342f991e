//! File mapping, the one unsafe operation of this crate.

use std::path::Path;

/// Maps the file at `path` read-only, to be read without a copy. If another process truncates
/// the file while it is mapped, reads past its new end fault (SIGBUS), as in perf and samply.
pub fn map_file(path: &Path) -> std::io::Result<memmap2::Mmap> {
    let file = std::fs::File::open(path)?;
    // SAFETY: the map is read-only and only read through bounds-checked slices. If another
    // process truncates the file while it is mapped, reads may fault (SIGBUS); profilers accept
    // this (as perf and samply do) for the speed of not copying whole binaries.
    unsafe { memmap2::Mmap::map(&file) }
}
