//! Debug files fetched by build id from debuginfod servers, as gdb and perf do: only when
//! `DEBUGINFOD_URLS` is set (space-separated server addresses), into the elfutils client cache
//! (`$DEBUGINFOD_CACHE_PATH`, else `$XDG_CACHE_HOME/debuginfod_client`, else
//! `~/.cache/debuginfod_client`), laid out as `BUILDID/debuginfo`, which gdb, perf and
//! debuginfod-find share. A fetch gives up when connecting or the reply's start takes more
//! than `$DEBUGINFOD_TIMEOUT` seconds (default 30), or the download ten times that,
//! and takes at most `$DEBUGINFOD_MAXSIZE` bytes (default 4 GiB); the file is written to a
//! temporary name and renamed, so a cache entry is whole or absent.

use std::io::{Read, Write};
use std::path::{Path, PathBuf};
use std::time::Duration;

/// A debuginfod client: the servers of `DEBUGINFOD_URLS`, the client cache and the limits
/// of the module's notes.
pub struct Debuginfod {
    urls: Vec<String>,
    /// The client cache folder (`cache_dir`): the debug file of a build id goes to
    /// `BUILDID/debuginfo` in it.
    pub cache: PathBuf,
    timeout: Duration,
    max_size: u64,
}

/// The client cache folder, by the elfutils rules.
pub fn cache_dir() -> Option<PathBuf> {
    let var = |k: &str| {
        std::env::var_os(k)
            .filter(|v| !v.is_empty())
            .map(PathBuf::from)
    };
    var("DEBUGINFOD_CACHE_PATH")
        .or_else(|| var("XDG_CACHE_HOME").map(|x| x.join("debuginfod_client")))
        .or_else(|| var("HOME").map(|h| h.join(".cache/debuginfod_client")))
}

/// A build id as lowercase hex, when it looks like one.
pub fn build_id_hex(id: &[u8]) -> Option<String> {
    (id.len() >= 2 && id.len() <= 64).then(|| id.iter().map(|b| format!("{b:02x}")).collect())
}

impl Debuginfod {
    /// The servers of `DEBUGINFOD_URLS`; None when it is unset or empty (no network use).
    pub fn from_env() -> Option<Debuginfod> {
        let urls: Vec<String> = std::env::var("DEBUGINFOD_URLS")
            .ok()?
            .split_whitespace()
            .filter(|u| u.starts_with("http://") || u.starts_with("https://"))
            .map(|u| u.trim_end_matches('/').to_owned())
            .collect();
        if urls.is_empty() {
            return None;
        }
        let secs = std::env::var("DEBUGINFOD_TIMEOUT")
            .ok()
            .and_then(|v| v.trim().parse::<u64>().ok())
            .filter(|&s| s > 0)
            .unwrap_or(30);
        let max_size = std::env::var("DEBUGINFOD_MAXSIZE")
            .ok()
            .and_then(|v| v.trim().parse::<u64>().ok())
            .filter(|&s| s > 0)
            .unwrap_or(4 << 30);
        Some(Debuginfod {
            urls,
            cache: cache_dir()?,
            timeout: Duration::from_secs(secs),
            max_size,
        })
    }

    /// Where the debug file of `hex` is (or would be) in the cache.
    pub fn cached_path(cache: &Path, hex: &str) -> PathBuf {
        cache.join(hex).join("debuginfo")
    }

    /// Fetches the debug file of build id `hex` into the cache (from the first server that
    /// has it); its path, or why not.
    pub fn fetch(&self, hex: &str) -> Result<PathBuf, String> {
        let dest = Self::cached_path(&self.cache, hex);
        if dest.is_file() {
            return Ok(dest);
        }
        let mut last = String::from("no server");
        for url in &self.urls {
            match self.fetch_from(url, hex, &dest) {
                Ok(()) => return Ok(dest),
                Err(e) => last = format!("{url}: {e}"),
            }
        }
        Err(last)
    }

    fn fetch_from(&self, url: &str, hex: &str, dest: &Path) -> Result<(), String> {
        let agent: ureq::Agent = ureq::Agent::config_builder()
            // As elfutils means DEBUGINFOD_TIMEOUT: for the connection and the reply to start;
            // the body of a large debug file gets ten times that.
            .timeout_connect(Some(self.timeout))
            .timeout_recv_response(Some(self.timeout))
            .timeout_recv_body(Some(self.timeout * 10))
            .http_status_as_error(true)
            .build()
            .into();
        let resp = agent
            .get(&format!("{url}/buildid/{hex}/debuginfo"))
            .call()
            .map_err(|e| e.to_string())?;
        let dir = dest.parent().ok_or("no cache folder")?;
        std::fs::create_dir_all(dir).map_err(|e| format!("{}: {e}", dir.display()))?;
        // A new file of our own beside the destination, then renamed over it.
        let tmp = dir.join(format!(
            ".superprof-{}-{:x}.tmp",
            std::process::id(),
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(0, |d| d.as_nanos())
        ));
        let result = (|| {
            let mut out = std::fs::OpenOptions::new()
                .write(true)
                .create_new(true)
                .open(&tmp)
                .map_err(|e| e.to_string())?;
            let mut body = resp.into_body().into_reader().take(self.max_size + 1);
            let mut buf = vec![0u8; 1 << 16];
            let mut total = 0u64;
            loop {
                let n = body.read(&mut buf).map_err(|e| e.to_string())?;
                if n == 0 {
                    break;
                }
                total += n as u64;
                if total > self.max_size {
                    return Err(format!("more than {} bytes", self.max_size));
                }
                out.write_all(&buf[..n]).map_err(|e| e.to_string())?;
            }
            out.sync_all().map_err(|e| e.to_string())?;
            std::fs::rename(&tmp, dest).map_err(|e| e.to_string())
        })();
        if result.is_err() {
            let _ = std::fs::remove_file(&tmp);
        }
        result
    }
}
