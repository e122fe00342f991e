//! Output formats, chosen by name or by file extension, and the one way superprof creates
//! files.
//!
//! superprof often runs as root and writes into folders that other users own (their working
//! folder, /tmp). A name that is predictable there is a name someone else can plant a symlink
//! at, so no file is opened by a guessable name with O_CREAT alone:
//! - a new file is created with O_CREAT|O_EXCL|O_NOFOLLOW (and O_CLOEXEC), mode 0600 (profiles
//!   hold the command line and the host name; perf makes perf.data 0600 likewise);
//! - temporary names end in 64 random bits from the kernel and are retried when taken;
//! - an output that exists as a regular file is replaced by rename, never written into;
//! - an output that is a device, a FIFO or a symlink is written through, as the shell's `>` and
//!   `cp` do (`-o /dev/null`, `-o /dev/stdout`, a named pipe, a link to a file elsewhere): the
//!   node stays a node, the link stays a link, the kernel does the following (so its own symlink
//!   protections apply) and a file behind a link is truncated and written in place, not
//!   atomically. A dangling symlink is refused (as `cp` refuses it): following it would create
//!   a file wherever the link points; so is a link another user owns in a sticky folder shared
//!   by all (/tmp), which the kernel's `protected_symlinks` would refuse but may not be on. A
//!   FIFO is waited on for its reader at most [`FIFO_READER_WAIT`], and not past a stop signal.
//!
//! A log written as it comes ([`create_log`]) cannot go through a temporary file (a killed run
//! would lose it all), so its name is removed and created anew with O_EXCL instead; it holds
//! whole lines only (a failed write is cut back).

use std::fs::{File, OpenOptions};
use std::io::{self, BufWriter, Read, Write};
use std::os::unix::fs::{DirBuilderExt, FileTypeExt, OpenOptionsExt};
use std::path::{Path, PathBuf};

use crate::Profile;

/// A format a profile can be written in (see [`write()`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum OutputFormat {
    /// The top table of functions, text (`top`; no file extension).
    Top,
    /// The call tree, text (`tree`; no file extension).
    Tree,
    /// Collapsed stacks, `.folded`.
    Folded,
    /// An interactive SVG flamegraph, `.svg`.
    Svg,
    /// superprof's native file, Apache Parquet, `.parquet`.
    Parquet,
    /// pprof's gzipped protocol buffer, `.pb.gz`.
    Pprof,
    /// speedscope's JSON, `.speedscope.json`.
    Speedscope,
    /// The Firefox Profiler's JSON, `.firefox.json`.
    Firefox,
    /// A self-contained HTML report (speedscope's viewer), `.html`.
    Html,
}

/// File extensions and the formats they select (the longest match wins).
const EXTENSIONS: [(&str, OutputFormat); 7] = [
    (".speedscope.json", OutputFormat::Speedscope),
    (".firefox.json", OutputFormat::Firefox),
    (".pb.gz", OutputFormat::Pprof),
    (".parquet", OutputFormat::Parquet),
    (".folded", OutputFormat::Folded),
    (".svg", OutputFormat::Svg),
    (".html", OutputFormat::Html),
];

/// The names of the formats on the command line (`--format NAME`).
const NAMES: [(&str, OutputFormat); 9] = [
    ("top", OutputFormat::Top),
    ("tree", OutputFormat::Tree),
    ("folded", OutputFormat::Folded),
    ("svg", OutputFormat::Svg),
    ("parquet", OutputFormat::Parquet),
    ("pprof", OutputFormat::Pprof),
    ("speedscope", OutputFormat::Speedscope),
    ("firefox", OutputFormat::Firefox),
    ("html", OutputFormat::Html),
];

/// An output path whose extension names no format.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct UnknownExtension(pub PathBuf);

impl std::fmt::Display for UnknownExtension {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "cannot tell the format of output '{}': use one of the extensions {}",
            self.0.display(),
            OutputFormat::extensions()
        )
    }
}

impl std::error::Error for UnknownExtension {}

impl OutputFormat {
    /// The format a file's extension names, or why there is none: the one check of an
    /// output path's name (record, report, preload and libsuperprof give its message).
    pub fn for_path(path: &Path) -> Result<OutputFormat, UnknownExtension> {
        let name = path.file_name().and_then(|n| n.to_str()).unwrap_or("");
        EXTENSIONS
            .iter()
            .find(|(ext, _)| name.ends_with(ext) && name.len() > ext.len())
            .map(|&(_, f)| f)
            .ok_or_else(|| UnknownExtension(path.to_path_buf()))
    }

    /// The format called `name` on the command line.
    pub fn from_name(name: &str) -> Option<OutputFormat> {
        NAMES.iter().find(|(n, _)| *n == name).map(|&(_, f)| f)
    }

    /// Its name on the command line (`--format NAME`).
    pub fn name(self) -> &'static str {
        NAMES
            .iter()
            .find(|(_, f)| *f == self)
            .map_or("?", |&(n, _)| n)
    }

    /// The names `--format` takes, for messages ("top, tree, ... or html").
    pub fn names() -> String {
        let all: Vec<&str> = NAMES.iter().map(|(n, _)| *n).collect();
        let (last, rest) = all.split_last().expect("formats have names");
        format!("{} or {last}", rest.join(", "))
    }

    /// The file extensions that select a format, for messages.
    pub fn extensions() -> &'static str {
        ".parquet, .folded, .svg, .pb.gz, .speedscope.json, .firefox.json, .html"
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
    // A profile of several events: the table shows each, Parquet keeps all; the other
    // formats show one, the first (`report --event` picks another).
    if !matches!(format, OutputFormat::Top | OutputFormat::Parquet) {
        if let Some(one) = first_event(profile, format.name()) {
            return write(&one, format, title, w);
        }
    }
    match format {
        OutputFormat::Top => crate::top::write(profile, 40, w),
        OutputFormat::Tree => crate::tree::write(profile, w),
        OutputFormat::Folded => crate::folded::write(profile, w),
        OutputFormat::Svg => crate::svg::write(profile, title, w),
        OutputFormat::Parquet => crate::parquet::write(profile, w).map_err(io::Error::other),
        OutputFormat::Pprof => crate::pprof::write(profile, w),
        OutputFormat::Speedscope => crate::speedscope::write(profile, w),
        OutputFormat::Firefox => crate::firefox::write(profile, w),
        OutputFormat::Html => crate::html::write(profile, title, w),
    }
}

/// A profile of several events (`record -e A,B`) made one of its first event, for an output
/// (`what`) that shows one, said on stderr; None for a profile of one event.
pub fn first_event(profile: &Profile, what: &str) -> Option<Profile> {
    let events = profile.meta.event_list();
    let first = events.first().filter(|_| events.len() > 1)?.name.clone();
    superprof_unwind::say!(
        "superprof: the {what} output shows one event, {}, of {} (report --event NAME for \
         another)",
        crate::escape(&first),
        crate::escape(&profile.meta.event)
    );
    Some(
        crate::Filter {
            event: Some(first),
            ..Default::default()
        }
        .apply(profile),
    )
}

/// Creates `path`, which must not exist yet (not even as a symlink): O_CREAT|O_EXCL|O_NOFOLLOW,
/// mode 0600. Std opens every file with O_CLOEXEC.
pub fn create_new(path: &Path) -> io::Result<File> {
    OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .custom_flags(libc::O_NOFOLLOW | libc::O_NOCTTY)
        .open(path)
}

/// 64 bits nobody else can predict: from the kernel's /dev/urandom, else (a bare chroot) from
/// std's hasher keys, which std takes from getrandom.
fn random_u64() -> u64 {
    let mut b = [0u8; 8];
    if File::open("/dev/urandom")
        .and_then(|mut f| f.read_exact(&mut b))
        .is_ok()
    {
        return u64::from_ne_bytes(b);
    }
    use std::hash::BuildHasher;
    std::collections::hash_map::RandomState::new()
        .hash_one((std::process::id(), std::time::SystemTime::now()))
}

/// How many random names are tried before giving up (a taken one means someone is guessing).
const ATTEMPTS: u32 = 100;

/// Runs `make` on fresh random names `{prefix}{16 hex digits}{suffix}` in `dir` until one is
/// not taken.
fn with_random_name<T>(
    dir: &Path,
    prefix: &str,
    suffix: &str,
    mut make: impl FnMut(&Path) -> io::Result<T>,
) -> io::Result<(T, PathBuf)> {
    for _ in 0..ATTEMPTS {
        let path = dir.join(format!("{prefix}{:016x}{suffix}", random_u64()));
        match make(&path) {
            Ok(t) => return Ok((t, path)),
            Err(e) if e.kind() == io::ErrorKind::AlreadyExists => continue,
            Err(e) => return Err(e),
        }
    }
    Err(io::Error::new(
        io::ErrorKind::AlreadyExists,
        format!(
            "cannot create a temporary file in '{}': every name tried was taken",
            dir.display()
        ),
    ))
}

/// A new file in `dir` named `{prefix}{random}{suffix}`, created as [`create_new`] does.
pub fn create_temp_file(dir: &Path, prefix: &str, suffix: &str) -> io::Result<(File, PathBuf)> {
    with_random_name(dir, prefix, suffix, create_new)
}

/// A new folder in `parent` named `{prefix}-{random}`, mode 0700: mkdir fails on any existing
/// name, so the folder is ours and nobody else can enter it. The caller removes it.
pub fn create_private_dir(parent: &Path, prefix: &str) -> io::Result<PathBuf> {
    let (_, dir) = with_random_name(parent, &format!("{prefix}-"), "", |p| {
        std::fs::DirBuilder::new().mode(0o700).create(p)
    })?;
    Ok(dir)
}

/// A new private folder (see [`create_private_dir`]) under the temporary folder (`TMPDIR`, or
/// /tmp). The caller removes it.
pub fn private_temp_dir(prefix: &str) -> io::Result<PathBuf> {
    create_private_dir(&std::env::temp_dir(), prefix)
}

/// What writing an output path means.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Target {
    /// Nothing there, or a regular file: a new file takes the name.
    Replace,
    /// A device, FIFO or symlink: opened and written through; `follow` for a symlink.
    Through { follow: bool },
}

fn target(path: &Path) -> io::Result<Target> {
    let meta = match std::fs::symlink_metadata(path) {
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(Target::Replace),
        r => r?,
    };
    let kind = meta.file_type();
    let kind = if kind.is_symlink() {
        refuse_foreign_link(path, &meta)?;
        match std::fs::metadata(path) {
            Ok(m) => m.file_type(),
            Err(e) if e.kind() == io::ErrorKind::NotFound => {
                return Err(io::Error::new(
                    io::ErrorKind::NotFound,
                    "is a symbolic link to a missing file (not followed)",
                ))
            }
            Err(e) => return Err(e),
        }
    } else if kind.is_file() {
        return Ok(Target::Replace);
    } else {
        kind
    };
    if kind.is_dir() {
        return Err(io::Error::new(
            io::ErrorKind::IsADirectory,
            "is a directory",
        ));
    }
    if kind.is_socket() {
        return Err(io::Error::other("is a socket"));
    }
    Ok(Target::Through {
        follow: meta.file_type().is_symlink(),
    })
}

/// Refuses to follow a symlink that the kernel's `protected_symlinks` would not let us follow
/// (it is 0 on some systems): one in a sticky, world-writable folder (/tmp) whose owner is
/// neither us nor the folder's owner. As root, following a link that another user planted in
/// /tmp would truncate and overwrite whatever file it names.
fn refuse_foreign_link(path: &Path, link: &std::fs::Metadata) -> io::Result<()> {
    use std::os::unix::fs::MetadataExt;
    let folder = std::fs::metadata(folder_of(path))?;
    let sticky_shared = folder.mode() & 0o1002 == 0o1002;
    let me = effective_uid();
    if sticky_shared && link.uid() != me && link.uid() != folder.uid() {
        return Err(io::Error::new(
            io::ErrorKind::PermissionDenied,
            format!(
                "is a symbolic link owned by another user (uid {}) in a sticky folder shared by \
                 all: not followed (the kernel's protected_symlinks rule)",
                link.uid()
            ),
        ));
    }
    Ok(())
}

/// Our effective user id, as the owner of /proc/self (no unsafe call needed).
fn effective_uid() -> u32 {
    use std::os::unix::fs::MetadataExt;
    std::fs::metadata("/proc/self").map_or(0, |m| m.uid())
}

/// How a stop request (SIGTERM, Ctrl-C) is seen while superprof waits for a FIFO's reader; set
/// once by the binary.
static STOP_CHECK: std::sync::OnceLock<fn() -> bool> = std::sync::OnceLock::new();

/// Lets a wait for a FIFO's reader end when `stop` says so (the binary's stop signals).
pub fn set_stop_check(stop: fn() -> bool) {
    let _ = STOP_CHECK.set(stop);
}

/// How long an output FIFO may go without a reader before superprof gives up on it.
pub const FIFO_READER_WAIT: std::time::Duration = std::time::Duration::from_secs(30);

/// Opens a device, FIFO or symlink target for writing: never created, truncated (a no-op on
/// devices and FIFOs). A FIFO waits for its reader, as the shell's `>` does, but not forever:
/// at most [`FIFO_READER_WAIT`], and not past a stop signal (a blocking open would ignore both:
/// std retries it on EINTR).
fn open_through(path: &Path, follow: bool) -> io::Result<File> {
    let nofollow = if follow { 0 } else { libc::O_NOFOLLOW };
    let open = |extra: i32| {
        OpenOptions::new()
            .write(true)
            .truncate(true)
            .custom_flags(libc::O_NOCTTY | nofollow | extra)
            .open(path)
    };
    if !std::fs::metadata(path)?.file_type().is_fifo() {
        return open(0);
    }
    let start = std::time::Instant::now();
    loop {
        // O_NONBLOCK: ENXIO at once while there is no reader.
        match open(libc::O_NONBLOCK) {
            // A reader is there: open again without O_NONBLOCK (at once now) for blocking
            // writes, then let the first descriptor go.
            Ok(probe) => {
                let file = open(0);
                drop(probe);
                return file;
            }
            Err(e) if e.raw_os_error() == Some(libc::ENXIO) => {}
            Err(e) => return Err(e),
        }
        if STOP_CHECK.get().is_some_and(|stop| stop()) {
            return Err(io::Error::new(
                io::ErrorKind::Interrupted,
                "is a FIFO that nobody read before superprof was stopped",
            ));
        }
        if start.elapsed() >= FIFO_READER_WAIT {
            return Err(io::Error::new(
                io::ErrorKind::TimedOut,
                format!(
                    "is a FIFO that nobody opened for reading in {} s",
                    FIFO_READER_WAIT.as_secs()
                ),
            ));
        }
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
}

/// The folder that holds `path` ("." for a bare name).
fn folder_of(path: &Path) -> &Path {
    match path.parent() {
        Some(p) if !p.as_os_str().is_empty() => p,
        _ => Path::new("."),
    }
}

/// A temporary file beside `path`, to be renamed onto it.
fn create_temp_beside(path: &Path) -> io::Result<(File, PathBuf)> {
    // The output's name, shortened so that the temporary name stays under NAME_MAX.
    let name: String = path
        .file_name()
        .map(|n| n.to_string_lossy().chars().take(64).collect())
        .unwrap_or_default();
    create_temp_file(folder_of(path), &format!(".{name}.superprof-"), ".tmp")
}

/// Checks that `path` can be written, without leaving anything behind or changing it.
pub fn check_writable(path: &Path) -> io::Result<()> {
    match target(path)? {
        Target::Replace => {
            let (file, tmp) = create_temp_beside(path)?;
            drop(file);
            std::fs::remove_file(&tmp)
        }
        // A FIFO would wait for its reader and a device may act on open: only a file behind a
        // symlink is opened (without truncation).
        Target::Through { follow } => {
            if std::fs::metadata(path)?.is_file() {
                let nofollow = if follow { 0 } else { libc::O_NOFOLLOW };
                OpenOptions::new()
                    .write(true)
                    .custom_flags(libc::O_NOCTTY | libc::O_NONBLOCK | nofollow)
                    .open(path)?;
            }
            Ok(())
        }
    }
}

/// Writes `path` through `fill`. A new or regular file is written to a temporary file beside it
/// and renamed over it: on any error the destination is left untouched. A device, FIFO or
/// symlink is written through (see the module's notes).
pub fn write_atomic(
    path: &Path,
    fill: impl FnOnce(&mut (dyn Write + Send)) -> io::Result<()>,
) -> io::Result<()> {
    if let Target::Through { follow } = target(path)? {
        let mut w = BufWriter::new(open_through(path, follow)?);
        fill(&mut w)?;
        return w.flush();
    }
    let (file, tmp) = create_temp_beside(path)?;
    let result = (|| {
        let mut w = BufWriter::new(file);
        fill(&mut w)?;
        w.into_inner().map_err(|e| e.into_error())?.sync_all()?;
        std::fs::rename(&tmp, path)
    })();
    if result.is_err() {
        let _ = std::fs::remove_file(&tmp);
    }
    result
}

/// A log written as it comes ([`create_log`]): whole lines only. Writes gather in memory and
/// go to the file at each [`Write::flush`], which the writer calls between lines; a flush that
/// fails (a full disk) cuts the file back to the end of the last flush that worked, so the log
/// never ends in the middle of a line. [`LogFile::discard`] removes a log that is not whole (a
/// document cut short, a run that never began).
pub struct LogFile {
    file: File,
    path: PathBuf,
    /// Created here (a regular file that can be cut back or removed), not a device or a FIFO.
    ours: bool,
    pending: Vec<u8>,
    /// The length of the file as of the last flush that worked.
    committed: u64,
}

impl LogFile {
    /// Removes the log if this run created it (a device or a FIFO stays as it was).
    pub fn discard(self) -> io::Result<()> {
        if self.ours {
            std::fs::remove_file(&self.path)?;
        }
        Ok(())
    }
}

impl Write for LogFile {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        self.pending.extend_from_slice(buf);
        Ok(buf.len())
    }

    fn flush(&mut self) -> io::Result<()> {
        // In pieces of whole lines (about 8 KiB each), so that a disk that fills up keeps all
        // but the last piece.
        let pending = std::mem::take(&mut self.pending);
        let mut rest = &pending[..];
        while !rest.is_empty() {
            let cut = match rest
                .get(8192..)
                .and_then(|t| t.iter().position(|&b| b == b'\n'))
            {
                Some(nl) => 8192 + nl + 1,
                None => rest.len(),
            };
            let (piece, after) = rest.split_at(cut);
            if let Err(e) = self.file.write_all(piece) {
                if self.ours {
                    // Back to the last whole line; the next write goes there too.
                    let _ = self.file.set_len(self.committed);
                    let _ = io::Seek::seek(&mut self.file, io::SeekFrom::Start(self.committed));
                }
                return Err(e);
            }
            self.committed += piece.len() as u64;
            rest = after;
        }
        Ok(())
    }
}

/// Opens `path` for a log that is written as it comes, so that what was written survives a
/// killed writer (a temporary file renamed at the end would not). A device, FIFO or symlink is
/// written through; otherwise an existing file is removed (unlink never follows a link) and the
/// name created anew as [`create_new`] does: an existing file is never written into in place, so
/// neither a symlink nor a hard link planted there can redirect the log. If something takes the
/// name between the two steps, that is an error, not a retry.
pub fn create_log(path: &Path) -> io::Result<LogFile> {
    let (file, ours) = match target(path)? {
        Target::Through { follow } => (open_through(path, follow)?, false),
        Target::Replace => {
            match std::fs::remove_file(path) {
                Err(e) if e.kind() != io::ErrorKind::NotFound => return Err(e),
                _ => {}
            }
            (create_new(path)?, true)
        }
    };
    Ok(LogFile {
        file,
        path: path.to_owned(),
        ours,
        pending: Vec::new(),
        committed: 0,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::{MetadataExt, PermissionsExt};

    /// A scratch folder of this test process.
    fn scratch(tag: &str) -> PathBuf {
        let d = std::env::temp_dir().join(format!("superprof-output-{}-{tag}", std::process::id()));
        let _ = std::fs::remove_dir_all(&d);
        std::fs::create_dir_all(&d).unwrap();
        d
    }

    #[test]
    fn formats_by_extension_and_by_name() {
        let f = |p: &str| OutputFormat::for_path(Path::new(p));
        assert_eq!(f("a/b.speedscope.json"), Ok(OutputFormat::Speedscope));
        assert_eq!(f("x.pb.gz"), Ok(OutputFormat::Pprof));
        assert_eq!(f("x.svg"), Ok(OutputFormat::Svg));
        // A bare extension is no name; an unknown one is said with the known ones.
        assert!(f(".svg").is_err());
        let e = f("out.txt").unwrap_err().to_string();
        assert!(e.contains("'out.txt'") && e.contains(".parquet"), "{e}");
        for (name, format) in NAMES {
            assert_eq!(OutputFormat::from_name(name), Some(format));
        }
        assert_eq!(OutputFormat::from_name("svgz"), None);
        assert_eq!(
            OutputFormat::names(),
            "top, tree, folded, svg, parquet, pprof, speedscope, firefox or html"
        );
    }

    #[test]
    fn random_names_differ() {
        let d = scratch("names");
        let (_, a) = create_temp_file(&d, "x-", ".tmp").unwrap();
        let (_, b) = create_temp_file(&d, "x-", ".tmp").unwrap();
        assert_ne!(a, b);
        let name = a.file_name().unwrap().to_str().unwrap();
        assert!(name.starts_with("x-") && name.ends_with(".tmp") && name.len() == 2 + 16 + 4);
        std::fs::remove_dir_all(&d).unwrap();
    }

    #[test]
    fn create_new_refuses_existing_names_and_links() {
        let d = scratch("new");
        let victim = d.join("victim");
        std::fs::write(&victim, "keep").unwrap();
        let link = d.join("link");
        std::os::unix::fs::symlink(&victim, &link).unwrap();
        assert_eq!(
            create_new(&link).unwrap_err().kind(),
            io::ErrorKind::AlreadyExists
        );
        assert_eq!(
            create_new(&victim).unwrap_err().kind(),
            io::ErrorKind::AlreadyExists
        );
        assert_eq!(std::fs::read_to_string(&victim).unwrap(), "keep");
        std::fs::remove_dir_all(&d).unwrap();
    }

    #[test]
    fn outputs_are_private_and_replace_files() {
        let d = scratch("replace");
        let out = d.join("out.txt");
        std::fs::write(&out, "old contents, longer").unwrap();
        write_atomic(&out, |w| w.write_all(b"new")).unwrap();
        assert_eq!(std::fs::read_to_string(&out).unwrap(), "new");
        let meta = std::fs::symlink_metadata(&out).unwrap();
        assert_eq!(meta.permissions().mode() & 0o777, 0o600);
        // Nothing else was left in the folder.
        assert_eq!(std::fs::read_dir(&d).unwrap().count(), 1);
        std::fs::remove_dir_all(&d).unwrap();
    }

    #[test]
    fn symlinks_are_written_through() {
        let d = scratch("through");
        let real = d.join("real.txt");
        std::fs::write(&real, "old contents, longer").unwrap();
        let link = d.join("link.txt");
        std::os::unix::fs::symlink(&real, &link).unwrap();
        check_writable(&link).unwrap();
        write_atomic(&link, |w| w.write_all(b"new")).unwrap();
        assert!(std::fs::symlink_metadata(&link)
            .unwrap()
            .file_type()
            .is_symlink());
        assert_eq!(std::fs::read_to_string(&real).unwrap(), "new");
        // A dangling link is not followed.
        let dangling = d.join("dangling.txt");
        std::os::unix::fs::symlink(d.join("missing"), &dangling).unwrap();
        assert!(check_writable(&dangling).is_err());
        assert!(write_atomic(&dangling, |w| w.write_all(b"x")).is_err());
        assert!(!d.join("missing").exists());
        std::fs::remove_dir_all(&d).unwrap();
    }

    #[test]
    fn devices_are_written_through() {
        let null = Path::new("/dev/null");
        check_writable(null).unwrap();
        write_atomic(null, |w| w.write_all(b"x")).unwrap();
        drop(create_log(null).unwrap());
        assert!(std::fs::symlink_metadata(null)
            .unwrap()
            .file_type()
            .is_char_device());
    }

    #[test]
    fn logs_are_made_anew() {
        let d = scratch("log");
        let out = d.join("log.txt");
        let victim = d.join("victim");
        std::fs::write(&victim, "keep").unwrap();
        std::fs::hard_link(&victim, &out).unwrap();
        let mut f = create_log(&out).unwrap();
        f.write_all(b"line\n").unwrap();
        f.flush().unwrap();
        assert_eq!(std::fs::read_to_string(&victim).unwrap(), "keep");
        assert_eq!(std::fs::read_to_string(&out).unwrap(), "line\n");
        let meta = std::fs::metadata(&out).unwrap();
        assert_eq!((meta.mode() & 0o777, meta.nlink()), (0o600, 1));
        std::fs::remove_dir_all(&d).unwrap();
    }

    #[test]
    fn private_dirs() {
        let d = scratch("dirs");
        let a = create_private_dir(&d, "p").unwrap();
        let b = create_private_dir(&d, "p").unwrap();
        assert_ne!(a, b);
        let meta = std::fs::symlink_metadata(&a).unwrap();
        assert!(meta.is_dir());
        assert_eq!(meta.permissions().mode() & 0o777, 0o700);
        std::fs::remove_dir_all(&d).unwrap();
    }

    #[test]
    fn directories_are_refused() {
        let d = scratch("isdir");
        assert_eq!(
            check_writable(&d).unwrap_err().kind(),
            io::ErrorKind::IsADirectory
        );
        std::fs::remove_dir_all(&d).unwrap();
    }
}
