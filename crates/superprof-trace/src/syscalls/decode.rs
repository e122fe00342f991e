//! Decoding syscall arguments and results the way strace prints them, for the simple cases:
//! file descriptors, paths, sizes and the common flag words. Everything else is hex.

use crate::status::signal_name;
use crate::sys;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Arg {
    Fd,
    Dirfd,
    Path,
    Size,
    Int,
    Hex,
    OpenFlags,
    Mode,
    Prot,
    MapFlags,
    Whence,
    Signal,
}

use Arg::*;

/// Argument kinds of the syscalls decoded beyond hex (by name; same on x86_64 and AArch64).
fn signature(name: &str) -> Option<&'static [Arg]> {
    Some(match name {
        "read" | "write" => &[Fd, Hex, Size],
        "pread64" | "pwrite64" => &[Fd, Hex, Size, Int],
        "readv" | "writev" => &[Fd, Hex, Int],
        "open" => &[Path, OpenFlags, Mode],
        "openat" => &[Dirfd, Path, OpenFlags, Mode],
        "creat" => &[Path, Mode],
        "close" | "fsync" | "fdatasync" | "fchdir" | "dup" | "syncfs" => &[Fd],
        "dup2" | "dup3" => &[Fd, Fd],
        "fstat" => &[Fd, Hex],
        "lseek" => &[Fd, Int, Whence],
        "stat" | "lstat" | "statfs" => &[Path, Hex],
        "access" => &[Path, Int],
        "unlink" | "rmdir" | "chdir" | "chroot" => &[Path],
        "mkdir" | "chmod" => &[Path, Mode],
        "rename" | "link" | "symlink" => &[Path, Path],
        "readlink" => &[Path, Hex, Size],
        "truncate" => &[Path, Int],
        "ftruncate" => &[Fd, Int],
        "newfstatat" | "fstatat64" => &[Dirfd, Path, Hex, Hex],
        "faccessat" | "faccessat2" => &[Dirfd, Path, Int],
        "unlinkat" => &[Dirfd, Path, Hex],
        "mkdirat" | "fchmodat" => &[Dirfd, Path, Mode],
        "readlinkat" => &[Dirfd, Path, Hex, Size],
        "statx" => &[Dirfd, Path, Hex, Hex, Hex],
        "execve" => &[Path, Hex, Hex],
        "mmap" => &[Hex, Size, Prot, MapFlags, Fd, Hex],
        "mprotect" => &[Hex, Size, Prot],
        "munmap" => &[Hex, Size],
        "brk" => &[Hex],
        "kill" => &[Int, Signal],
        "tgkill" => &[Int, Int, Signal],
        "tkill" => &[Int, Signal],
        "exit" | "exit_group" => &[Int],
        "getpid" | "getppid" | "gettid" | "getuid" | "geteuid" | "getgid" | "getegid"
        | "sched_yield" | "fork" | "vfork" | "sync" | "pause" => &[],
        "pipe" | "pipe2" => &[Hex],
        "nanosleep" => &[Hex, Hex],
        "getcwd" => &[Hex, Size],
        "socket" => &[Int, Int, Int],
        _ => return None,
    })
}

const O_FLAGS: [(u64, &str); 14] = [
    (0o100, "O_CREAT"),
    (0o200, "O_EXCL"),
    (0o400, "O_NOCTTY"),
    (0o1000, "O_TRUNC"),
    (0o2000, "O_APPEND"),
    (0o4000, "O_NONBLOCK"),
    (0o10000, "O_DSYNC"),
    (0o20000, "O_ASYNC"),
    (0o40000, "O_DIRECT"),
    (0o200000, "O_DIRECTORY"),
    (0o400000, "O_NOFOLLOW"),
    (0o1000000, "O_NOATIME"),
    (0o2000000, "O_CLOEXEC"),
    (0o10000000, "O_PATH"),
];

fn open_flags(v: u64) -> String {
    let mut parts = vec![match v & 3 {
        0 => "O_RDONLY",
        1 => "O_WRONLY",
        2 => "O_RDWR",
        _ => "O_ACCMODE",
    }
    .to_owned()];
    let mut rest = v & !3;
    // O_LARGEFILE differs per architecture and says nothing on 64-bit: leave it out.
    rest &= !0o100000;
    for (bit, name) in O_FLAGS {
        if rest & bit == bit {
            parts.push(name.to_owned());
            rest &= !bit;
        }
    }
    if rest != 0 {
        parts.push(format!("{rest:#o}"));
    }
    parts.join("|")
}

fn bits(v: u64, names: &[(u64, &str)], zero: &str) -> String {
    if v == 0 {
        return zero.to_owned();
    }
    let mut parts = Vec::new();
    let mut rest = v;
    for &(bit, name) in names {
        if rest & bit == bit && bit != 0 {
            parts.push(name.to_owned());
            rest &= !bit;
        }
    }
    if rest != 0 {
        parts.push(format!("{rest:#x}"));
    }
    parts.join("|")
}

const PROT: [(u64, &str); 3] = [(1, "PROT_READ"), (2, "PROT_WRITE"), (4, "PROT_EXEC")];
const MAP: [(u64, &str); 9] = [
    (0x01, "MAP_SHARED"),
    (0x02, "MAP_PRIVATE"),
    (0x10, "MAP_FIXED"),
    (0x20, "MAP_ANONYMOUS"),
    (0x100, "MAP_GROWSDOWN"),
    (0x800, "MAP_DENYWRITE"),
    (0x2000, "MAP_LOCKED"),
    (0x4000, "MAP_NORESERVE"),
    (0x100000, "MAP_FIXED_NOREPLACE"),
];

/// A NUL-terminated string in the target, quoted and escaped like strace, at most 256 bytes.
fn read_path(pid: u32, addr: u64) -> String {
    if addr == 0 {
        return "NULL".to_owned();
    }
    let mut buf = [0u8; 257];
    let n = sys::read_memory(pid, addr, &mut buf);
    if n == 0 {
        return format!("{addr:#x}");
    }
    let end = buf[..n].iter().position(|&b| b == 0);
    let s = &buf[..end.unwrap_or(n.min(256))];
    let mut out = String::from("\"");
    for &b in s {
        match b {
            b'"' => out.push_str("\\\""),
            b'\\' => out.push_str("\\\\"),
            b'\n' => out.push_str("\\n"),
            0x20..=0x7e => out.push(b as char),
            _ => out.push_str(&format!("\\x{b:02x}")),
        }
    }
    out.push('"');
    if end.is_none() {
        out.push_str("...");
    }
    out
}

/// Decodes the arguments of syscall `name` (at its entry, while the target is stopped).
pub fn args(name: &str, pid: u32, raw: &[u64; 6]) -> Vec<String> {
    let Some(sig) = signature(name) else {
        // Unknown shape: the six registers, trailing zeros left out.
        let n = raw.iter().rposition(|&a| a != 0).map_or(0, |i| i + 1);
        return raw[..n].iter().map(|a| format!("{a:#x}")).collect();
    };
    // open/openat carry a mode only with O_CREAT or O_TMPFILE, as strace prints them.
    let sig = match name {
        "open" | "openat" => {
            let flags = raw[sig.iter().position(|a| *a == OpenFlags).unwrap_or(0)];
            if flags & (0o100 | 0o20000000) == 0 {
                &sig[..sig.len() - 1]
            } else {
                sig
            }
        }
        _ => sig,
    };
    sig.iter()
        .zip(raw)
        .map(|(kind, &v)| match kind {
            Fd | Int => (v as i64 as i32).to_string(),
            Dirfd if v as i32 == -100 => "AT_FDCWD".to_owned(),
            Dirfd => (v as i32).to_string(),
            Path => read_path(pid, v),
            Size => v.to_string(),
            Hex if v == 0 => "NULL".to_owned(),
            Hex => format!("{v:#x}"),
            OpenFlags => open_flags(v),
            Mode => format!("0{:o}", v & 0o7777),
            Prot => bits(v, &PROT, "PROT_NONE"),
            MapFlags => bits(v, &MAP, "0"),
            Whence => match v {
                0 => "SEEK_SET".to_owned(),
                1 => "SEEK_CUR".to_owned(),
                2 => "SEEK_END".to_owned(),
                _ => v.to_string(),
            },
            Signal => signal_name(v as i32).map_or_else(|| v.to_string(), str::to_owned),
        })
        .collect()
}

/// Whether the result is an address (printed in hex).
pub fn returns_address(name: &str) -> bool {
    matches!(name, "mmap" | "brk" | "mremap" | "shmat")
}

/// The symbolic name of an errno value (ENOENT...).
///
/// (One function of 148 lines: a table of names, the errno values 0 to 133 in order, then the
/// kernel's restart values from 512; nothing in it to split.)
pub fn errno_name(e: i64) -> String {
    const NAMES: [&str; 134] = [
        "",
        "EPERM",
        "ENOENT",
        "ESRCH",
        "EINTR",
        "EIO",
        "ENXIO",
        "E2BIG",
        "ENOEXEC",
        "EBADF",
        "ECHILD",
        "EAGAIN",
        "ENOMEM",
        "EACCES",
        "EFAULT",
        "ENOTBLK",
        "EBUSY",
        "EEXIST",
        "EXDEV",
        "ENODEV",
        "ENOTDIR",
        "EISDIR",
        "EINVAL",
        "ENFILE",
        "EMFILE",
        "ENOTTY",
        "ETXTBSY",
        "EFBIG",
        "ENOSPC",
        "ESPIPE",
        "EROFS",
        "EMLINK",
        "EPIPE",
        "EDOM",
        "ERANGE",
        "EDEADLK",
        "ENAMETOOLONG",
        "ENOLCK",
        "ENOSYS",
        "ENOTEMPTY",
        "ELOOP",
        "",
        "ENOMSG",
        "EIDRM",
        "ECHRNG",
        "EL2NSYNC",
        "EL3HLT",
        "EL3RST",
        "ELNRNG",
        "EUNATCH",
        "ENOCSI",
        "EL2HLT",
        "EBADE",
        "EBADR",
        "EXFULL",
        "ENOANO",
        "EBADRQC",
        "EBADSLT",
        "",
        "EBFONT",
        "ENOSTR",
        "ENODATA",
        "ETIME",
        "ENOSR",
        "ENONET",
        "ENOPKG",
        "EREMOTE",
        "ENOLINK",
        "EADV",
        "ESRMNT",
        "ECOMM",
        "EPROTO",
        "EMULTIHOP",
        "EDOTDOT",
        "EBADMSG",
        "EOVERFLOW",
        "ENOTUNIQ",
        "EBADFD",
        "EREMCHG",
        "ELIBACC",
        "ELIBBAD",
        "ELIBSCN",
        "ELIBMAX",
        "ELIBEXEC",
        "EILSEQ",
        "ERESTART",
        "ESTRPIPE",
        "EUSERS",
        "ENOTSOCK",
        "EDESTADDRREQ",
        "EMSGSIZE",
        "EPROTOTYPE",
        "ENOPROTOOPT",
        "EPROTONOSUPPORT",
        "ESOCKTNOSUPPORT",
        "EOPNOTSUPP",
        "EPFNOSUPPORT",
        "EAFNOSUPPORT",
        "EADDRINUSE",
        "EADDRNOTAVAIL",
        "ENETDOWN",
        "ENETUNREACH",
        "ENETRESET",
        "ECONNABORTED",
        "ECONNRESET",
        "ENOBUFS",
        "EISCONN",
        "ENOTCONN",
        "ESHUTDOWN",
        "ETOOMANYREFS",
        "ETIMEDOUT",
        "ECONNREFUSED",
        "EHOSTDOWN",
        "EHOSTUNREACH",
        "EALREADY",
        "EINPROGRESS",
        "ESTALE",
        "EUCLEAN",
        "ENOTNAM",
        "ENAVAIL",
        "EISNAM",
        "EREMOTEIO",
        "EDQUOT",
        "ENOMEDIUM",
        "EMEDIUMTYPE",
        "ECANCELED",
        "ENOKEY",
        "EKEYEXPIRED",
        "EKEYREVOKED",
        "EKEYREJECTED",
        "EOWNERDEAD",
        "ENOTRECOVERABLE",
        "ERFKILL",
        "EHWPOISON",
    ];
    match e {
        512 => "ERESTARTSYS".to_owned(),
        513 => "ERESTARTNOINTR".to_owned(),
        514 => "ERESTARTNOHAND".to_owned(),
        516 => "ERESTART_RESTARTBLOCK".to_owned(),
        _ => NAMES
            .get(e as usize)
            .filter(|n| !n.is_empty())
            .map_or_else(|| format!("E{e}"), |n| (*n).to_owned()),
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn errno_names_match_libc_values() {
        for (v, n) in [
            (libc::EPERM, "EPERM"),
            (libc::ENOENT, "ENOENT"),
            (libc::EAGAIN, "EAGAIN"),
            (libc::ENOSYS, "ENOSYS"),
            (libc::ELOOP, "ELOOP"),
            (libc::ENOMSG, "ENOMSG"),
            (libc::EBFONT, "EBFONT"),
            (libc::EOVERFLOW, "EOVERFLOW"),
            (libc::ECONNREFUSED, "ECONNREFUSED"),
            (libc::ENOTRECOVERABLE, "ENOTRECOVERABLE"),
            (libc::EHWPOISON, "EHWPOISON"),
        ] {
            assert_eq!(super::errno_name(v as i64), n);
        }
    }

    #[test]
    fn open_flags_read_like_strace() {
        assert_eq!(super::open_flags(0), "O_RDONLY");
        let v = (libc::O_WRONLY | libc::O_CREAT | libc::O_TRUNC | libc::O_CLOEXEC) as u64;
        assert_eq!(super::open_flags(v), "O_WRONLY|O_CREAT|O_TRUNC|O_CLOEXEC");
    }
}
