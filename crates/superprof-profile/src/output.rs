//! Output files: format by extension, written to a temp file and renamed.

use std::io::{self, BufWriter, Write};
use std::path::{Path, PathBuf};

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum OutputFormat {
    Folded,
    Svg,
}

impl OutputFormat {
    /// The format named by a file's extension.
    pub fn from_path(path: &Path) -> Option<OutputFormat> {
        let name = path.file_name()?.to_str()?;
        if name.ends_with(".folded") {
            Some(OutputFormat::Folded)
        } else if name.ends_with(".svg") {
            Some(OutputFormat::Svg)
        } else {
            None
        }
    }

    pub fn extensions() -> &'static str {
        ".folded, .svg"
    }
}

fn temp_path(path: &Path) -> PathBuf {
    let name = path
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    path.with_file_name(format!(".{name}.superprof-{}.tmp", std::process::id()))
}

/// Checks that `path` can be written, without leaving anything behind.
pub fn check_writable(path: &Path) -> io::Result<()> {
    if path.is_dir() {
        return Err(io::Error::new(
            io::ErrorKind::IsADirectory,
            "is a directory",
        ));
    }
    let tmp = temp_path(path);
    std::fs::File::create(&tmp)?;
    std::fs::remove_file(&tmp)
}

/// Writes `path` through `fill`; on any error the destination is left untouched.
pub fn write_atomic(
    path: &Path,
    fill: impl FnOnce(&mut dyn Write) -> io::Result<()>,
) -> io::Result<()> {
    let tmp = temp_path(path);
    let result = (|| {
        let mut w = BufWriter::new(std::fs::File::create(&tmp)?);
        fill(&mut w)?;
        w.into_inner().map_err(|e| e.into_error())?.sync_all()?;
        std::fs::rename(&tmp, path)
    })();
    if result.is_err() {
        let _ = std::fs::remove_file(&tmp);
    }
    result
}
