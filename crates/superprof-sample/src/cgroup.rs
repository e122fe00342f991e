//! A cgroup (v2) of superprof's own for a launched command, so that its whole process tree is
//! sampled per CPU: the sampling timer then runs on across the tree's task switches, and a
//! process or thread that lives less than one sampling period is sampled too (a per-task
//! timer starts again in every new task, so a fork storm or a thread churn goes unseen).
//!
//! Made only where allowed (root, with cgroup v2 mounted and perf's cgroup events on it);
//! otherwise `record` samples per task as before. The cgroup is made inside superprof's own,
//! with no controller and no limit of its own: the limits and the unit (a systemd scope, a
//! container) that hold superprof still hold the command. At the end, any process left in it (a daemon the command
//! started) is moved back to superprof's own cgroup and the folder removed; a folder left by a
//! superprof killed with SIGKILL is removed by the next one, once it is empty.

use std::io::Write;
use std::os::fd::OwnedFd;
use std::path::{Path, PathBuf};

/// superprof's cgroup for one launched command (removed when dropped).
pub struct Cgroup {
    dir: PathBuf,
    /// Its folder, open: what [`crate::PerfSampler::open_cgroup`] samples.
    pub fd: OwnedFd,
    /// Where processes left at the end go back to: superprof's own cgroup.
    home: PathBuf,
}

/// The cgroup v2 mount point, from /proc/self/mountinfo.
fn cgroup2_mount() -> Option<PathBuf> {
    let info = std::fs::read_to_string("/proc/self/mountinfo").ok()?;
    info.lines().find_map(|l| {
        // ... mount-point ... - fstype source options
        let (left, right) = l.split_once(" - ")?;
        if right.split_whitespace().next()? != "cgroup2" {
            return None;
        }
        Some(PathBuf::from(left.split_whitespace().nth(4)?))
    })
}

/// This process's cgroup v2 path (`0::/PATH` in /proc/self/cgroup).
fn own_cgroup() -> Option<String> {
    let text = std::fs::read_to_string("/proc/self/cgroup").ok()?;
    text.lines()
        .find_map(|l| l.strip_prefix("0::"))
        .map(|p| p.trim().to_owned())
}

impl Cgroup {
    /// A new, empty cgroup inside superprof's own (so that the limits and the unit of
    /// whatever contains superprof still hold for the command), or None where that is not
    /// allowed.
    pub fn create() -> Option<Cgroup> {
        use std::os::unix::fs::DirBuilderExt;
        if crate::sys::euid() != 0 {
            return None;
        }
        let root = cgroup2_mount()?;
        let home = root.join(own_cgroup()?.trim_start_matches('/'));
        sweep(&home);
        let nanos = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.subsec_nanos());
        let dir = home.join(format!("superprof-{}-{nanos:08x}", std::process::id()));
        // create, not create_all: a folder that already exists is not ours.
        std::fs::DirBuilder::new().mode(0o755).create(&dir).ok()?;
        let fd = match std::fs::File::open(&dir) {
            Ok(f) => OwnedFd::from(f),
            Err(_) => {
                let _ = std::fs::remove_dir(&dir);
                return None;
            }
        };
        Some(Cgroup { dir, fd, home })
    }

    /// Puts process `pid` (and the tasks it will start) in the cgroup.
    pub fn add(&self, pid: u32) -> std::io::Result<()> {
        write_pid(&self.dir.join("cgroup.procs"), pid)
    }
}

fn write_pid(procs: &Path, pid: u32) -> std::io::Result<()> {
    let mut f = std::fs::OpenOptions::new().write(true).open(procs)?;
    f.write_all(format!("{pid}\n").as_bytes())
}

/// Removes the cgroups an earlier superprof left behind (killed with SIGKILL, it could not):
/// `superprof-PID-…` folders whose superprof is gone and in which no process is left.
fn sweep(root: &Path) {
    let Ok(entries) = std::fs::read_dir(root) else {
        return;
    };
    for e in entries.flatten() {
        let name = e.file_name().to_string_lossy().into_owned();
        let Some(pid) = name
            .strip_prefix("superprof-")
            .and_then(|r| r.split('-').next())
            .and_then(|p| p.parse::<u32>().ok())
        else {
            continue;
        };
        let alive = crate::superprof_running(pid);
        let empty = std::fs::read_to_string(e.path().join("cgroup.procs"))
            .is_ok_and(|p| p.trim().is_empty());
        if !alive && empty {
            let _ = std::fs::remove_dir(e.path());
        }
    }
}

impl Drop for Cgroup {
    fn drop(&mut self) {
        let home = self.home.join("cgroup.procs");
        for _ in 0..50 {
            let left = std::fs::read_to_string(self.dir.join("cgroup.procs")).unwrap_or_default();
            for pid in left.lines().filter_map(|l| l.trim().parse::<u32>().ok()) {
                let _ = write_pid(&home, pid);
            }
            if std::fs::remove_dir(&self.dir).is_ok() {
                return;
            }
            std::thread::sleep(std::time::Duration::from_millis(10));
        }
        superprof_unwind::say!(
            "superprof: could not remove the cgroup {} (processes still in it)",
            self.dir.display()
        );
    }
}
