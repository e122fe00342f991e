//! Output formats, chosen by name or by file extension, and atomic output files.

use std::io::{self, BufWriter, Write};
use std::path::{Path, PathBuf};

use crate::Profile;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum OutputFormat {
    Top,
    Tree,
    Folded,
    Svg,
    Parquet,
    Pprof,
    Speedscope,
    Firefox,
}

/// File extensions and the formats they select (the longest match wins).
const EXTENSIONS: [(&str, OutputFormat); 6] = [
    (".speedscope.json", OutputFormat::Speedscope),
    (".firefox.json", OutputFormat::Firefox),
    (".pb.gz", OutputFormat::Pprof),
    (".parquet", OutputFormat::Parquet),
    (".folded", OutputFormat::Folded),
    (".svg", OutputFormat::Svg),
];

impl OutputFormat {
    /// The format named by a file's extension.
    pub fn from_path(path: &Path) -> Option<OutputFormat> {
        let name = path.file_name()?.to_str()?;
        EXTENSIONS
            .iter()
            .find(|(ext, _)| name.ends_with(ext) && name.len() > ext.len())
            .map(|&(_, f)| f)
    }

    /// The format called `name` on the command line.
    pub fn from_name(name: &str) -> Option<OutputFormat> {
        Some(match name {
            "top" => OutputFormat::Top,
            "tree" => OutputFormat::Tree,
            "folded" => OutputFormat::Folded,
            "svg" => OutputFormat::Svg,
            "parquet" => OutputFormat::Parquet,
            "pprof" => OutputFormat::Pprof,
            "speedscope" => OutputFormat::Speedscope,
            "firefox" => OutputFormat::Firefox,
            _ => return None,
        })
    }

    pub fn extensions() -> &'static str {
        ".parquet, .folded, .svg, .pb.gz, .speedscope.json, .firefox.json"
    }

    /// Binary formats are not written to a terminal.
    pub fn is_binary(self) -> bool {
        matches!(self, OutputFormat::Parquet | OutputFormat::Pprof)
    }
}

/// Writes the profile in `format`. `title` names the flamegraph.
pub fn write(
    profile: &Profile,
    format: OutputFormat,
    title: &str,
    w: &mut (dyn Write + Send),
) -> io::Result<()> {
    match format {
        OutputFormat::Top => crate::top::write(profile, 40, w),
        OutputFormat::Tree => crate::tree::write(profile, w),
        OutputFormat::Folded => crate::folded::write(profile, w),
        OutputFormat::Svg => crate::svg::write(profile, title, w),
        OutputFormat::Parquet => crate::parquet::write(profile, w).map_err(io::Error::other),
        OutputFormat::Pprof => crate::pprof::write(profile, w),
        OutputFormat::Speedscope => crate::speedscope::write(profile, w),
        OutputFormat::Firefox => crate::firefox::write(profile, w),
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
    fill: impl FnOnce(&mut (dyn Write + Send)) -> io::Result<()>,
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
