//! A symbolizer on its own thread, so that loading symbol files overlaps with recording.
//!
//! While the target runs, the recorder announces each module as it is mapped
//! ([`SymbolService::preload`]); the worker opens and parses its symbols then, on a core the
//! target may not be using. At the end, [`SymbolService::symbolize`] resolves every distinct
//! address in one round trip, and most of the parsing is already done.

use std::path::PathBuf;
use std::sync::mpsc::{channel, Receiver, Sender};
use std::thread::JoinHandle;

use std::sync::{Arc, Condvar, Mutex};

use crate::{Debuginfod, Kallsyms, SymFrame, Symbolizer};

/// A slot among the [`PARALLEL_FETCHES`] fetches that may run at once, held while it lives.
struct Slot;

static SLOTS: (Mutex<usize>, Condvar) = (Mutex::new(0), Condvar::new());

impl Slot {
    fn take() -> Slot {
        let mut used = SLOTS.0.lock().unwrap_or_else(|e| e.into_inner());
        while *used >= PARALLEL_FETCHES {
            used = SLOTS.1.wait(used).unwrap_or_else(|e| e.into_inner());
        }
        *used += 1;
        Slot
    }
}

impl Drop for Slot {
    fn drop(&mut self) {
        *SLOTS.0.lock().unwrap_or_else(|e| e.into_inner()) -= 1;
        SLOTS.1.notify_one();
    }
}

/// One address to resolve: module path (as the target names it), where to read the file, and
/// the ELF virtual address to look up.
#[derive(Debug, Clone)]
pub struct Query {
    /// The module's path as the target names it (the key its symbols are kept under).
    pub path: PathBuf,
    /// Where superprof can read the file (e.g. through /proc/PID/root).
    pub open_path: PathBuf,
    /// The ELF virtual address (runtime address minus the mapping's bias).
    pub svma: u64,
}

enum Request {
    Preload(PathBuf, PathBuf),
    Kallsyms,
    Symbolize(Vec<Query>, Vec<u64>, Sender<Answer>),
}

/// Frames for each user query (outermost first), and a name for each kernel address.
pub struct Answer {
    /// One list of frames per [`Query`], in the order asked; empty where nothing is known.
    pub user: Vec<Vec<SymFrame>>,
    /// One name per kernel address, in the order asked; None where kallsyms does not cover it
    /// (or is unreadable).
    pub kernel: Vec<Option<String>>,
}

/// A [`Symbolizer`] and the kernel's symbols on a worker thread of their own (see the
/// module's notes); dropping it ends the worker.
pub struct SymbolService {
    tx: Option<Sender<Request>>,
    worker: Option<JoinHandle<()>>,
    /// Debug files to fetch, where DEBUGINFOD_URLS asks for it.
    debuginfod: Option<Arc<Debuginfod>>,
    /// Fetches running or waiting: their number, signalled when it changes.
    fetching: Arc<(Mutex<usize>, Condvar)>,
}

/// The most debuginfod fetches at once.
const PARALLEL_FETCHES: usize = 8;

impl Default for SymbolService {
    fn default() -> Self {
        Self::new()
    }
}

impl SymbolService {
    /// Starts the worker; debuginfod is used where `DEBUGINFOD_URLS` is set.
    pub fn new() -> SymbolService {
        let (tx, rx) = channel();
        let worker = std::thread::Builder::new()
            .name("superprof-symbols".into())
            .spawn(move || serve(rx))
            .ok();
        SymbolService {
            tx: Some(tx),
            worker,
            debuginfod: Debuginfod::from_env().map(Arc::new),
            fetching: Arc::new((Mutex::new(0), Condvar::new())),
        }
    }

    /// Starts loading the symbols of a module in the background; where debuginfod is in use
    /// and the module's debug file is nowhere here, fetches it first (on a thread of its own,
    /// a few at a time), with a notice.
    pub fn preload(&self, path: PathBuf, open_path: PathBuf) {
        // ([vdso] and the like are no file a server would know.)
        let (Some(d), Some(tx), true) = (&self.debuginfod, &self.tx, path.is_absolute()) else {
            self.send(Request::Preload(path, open_path));
            return;
        };
        let (d, tx, fetching) = (d.clone(), tx.clone(), self.fetching.clone());
        *fetching.0.lock().unwrap_or_else(|e| e.into_inner()) += 1;
        let spawned = std::thread::Builder::new()
            .name("superprof-debuginfod".into())
            .spawn({
                let fetching = fetching.clone();
                let (path, open_path) = (path.clone(), open_path.clone());
                move || {
                    if let Some(hex) = crate::debugfile::missing_debug_build_id(&open_path) {
                        // A slot among PARALLEL_FETCHES: wait while as many fetch.
                        let _slot = Slot::take();
                        let name = path.file_name().unwrap_or_default().to_string_lossy();
                        match d.fetch(&hex) {
                            Ok(p) => superprof_unwind::say!(
                                "superprof: debuginfod: {name}: debug info fetched ({:.1} MB, {})",
                                std::fs::metadata(&p).map_or(0, |m| m.len()) as f64 / 1e6,
                                p.display()
                            ),
                            Err(e) => superprof_unwind::say!(
                                "superprof: debuginfod: {name}: not fetched ({e})"
                            ),
                        }
                    }
                    let _ = tx.send(Request::Preload(path, open_path));
                    let (n, cv) = &*fetching;
                    *n.lock().unwrap_or_else(|e| e.into_inner()) -= 1;
                    cv.notify_all();
                }
            });
        if spawned.is_err() {
            let (n, _) = &*self.fetching;
            *n.lock().unwrap_or_else(|e| e.into_inner()) -= 1;
            self.send(Request::Preload(path, open_path));
        }
    }

    /// Starts reading /proc/kallsyms in the background.
    pub fn preload_kallsyms(&self) {
        self.send(Request::Kallsyms);
    }

    fn send(&self, r: Request) {
        if let Some(tx) = &self.tx {
            let _ = tx.send(r);
        }
    }

    /// Resolves user addresses and kernel addresses; waits for the preloads before it (and
    /// for the debuginfod fetches, each bounded by its own timeout).
    pub fn symbolize(&self, user: Vec<Query>, kernel: Vec<u64>) -> Answer {
        let (n, cv) = &*self.fetching;
        let mut left = n.lock().unwrap_or_else(|e| e.into_inner());
        while *left > 0 {
            left = cv.wait(left).unwrap_or_else(|e| e.into_inner());
        }
        drop(left);
        let (atx, arx) = channel();
        let (nu, nk) = (user.len(), kernel.len());
        self.send(Request::Symbolize(user, kernel, atx));
        arx.recv().unwrap_or_else(|_| Answer {
            user: vec![Vec::new(); nu],
            kernel: vec![None; nk],
        })
    }
}

impl Drop for SymbolService {
    /// Ends the worker without waiting for it: it frees what it loaded (tens of megabytes of
    /// debug info) on its own, while the recording's outputs are written, or not at all when
    /// the process exits first.
    fn drop(&mut self) {
        drop(self.tx.take());
        drop(self.worker.take());
    }
}

/// The kernel's symbols, read on a thread of their own (reading /proc/kallsyms takes tens of
/// milliseconds of the kernel's time: overlapped with the modules' loading).
#[derive(Default)]
struct KernelSymbols {
    /// The thread reading them, until they are asked for.
    loading: Option<JoinHandle<Kallsyms>>,
    ready: Option<Kallsyms>,
}

impl KernelSymbols {
    fn start(&mut self) {
        if self.loading.is_none() && self.ready.is_none() {
            match std::thread::Builder::new()
                .name("superprof-kallsyms".into())
                .spawn(Kallsyms::load)
            {
                Ok(h) => self.loading = Some(h),
                Err(_) => self.ready = Some(Kallsyms::load()),
            }
        }
    }

    fn get(&mut self) -> &Kallsyms {
        self.start();
        if let Some(h) = self.loading.take() {
            self.ready = Some(h.join().unwrap_or_else(|_| Kallsyms::parse("")));
        }
        self.ready.get_or_insert_with(|| Kallsyms::parse(""))
    }
}

/// How long after the service starts modules begin to be preloaded: a command that ends
/// sooner has only the modules its samples need loaded, when they are symbolized (not libc's
/// whole debug info for a sample in the loader); a longer one has them loaded while it runs.
const PRELOAD_AFTER: std::time::Duration = std::time::Duration::from_millis(100);

fn serve(rx: Receiver<Request>) {
    let started = std::time::Instant::now();
    let mut symbolizer = Symbolizer::default();
    let mut kallsyms = KernelSymbols::default();
    let mut queue: std::collections::VecDeque<Request> = Default::default();
    loop {
        if queue.is_empty() {
            match rx.recv() {
                Ok(r) => queue.push_back(r),
                Err(_) => break,
            }
        }
        queue.extend(rx.try_iter());
        // Early preloads wait, for a symbolization that would make them needless; other
        // requests go first.
        if let Some(i) = queue
            .iter()
            .position(|r| !matches!(r, Request::Preload(..)))
        {
            let request = queue.remove(i).expect("found above");
            queue.push_front(request);
        } else if let Some(wait) = PRELOAD_AFTER.checked_sub(started.elapsed()) {
            match rx.recv_timeout(wait) {
                Ok(r) => queue.push_back(r),
                Err(std::sync::mpsc::RecvTimeoutError::Timeout) => {}
                Err(std::sync::mpsc::RecvTimeoutError::Disconnected) => break,
            }
            continue;
        }
        // A symbolization waits: it loads the modules it needs itself, so the preloads of
        // modules it may not need go (a short command's libraries unsampled).
        if queue.iter().any(|r| matches!(r, Request::Symbolize(..))) {
            queue.retain(|r| !matches!(r, Request::Preload(..)));
        }
        let Some(request) = queue.pop_front() else {
            continue;
        };
        match request {
            Request::Preload(path, open) => symbolizer.preload(&path, &open),
            Request::Kallsyms => kallsyms.start(),
            Request::Symbolize(user, kernel, reply) => {
                // (The kernel's symbols load meanwhile.)
                if !kernel.is_empty() {
                    kallsyms.start();
                }
                let user = user
                    .iter()
                    .map(|q| symbolizer.symbolize(&q.path, &q.open_path, q.svma))
                    .collect();
                let k = (!kernel.is_empty()).then(|| kallsyms.get());
                let kernel = kernel
                    .iter()
                    .map(|&a| k.and_then(|k| k.lookup(a)).map(str::to_owned))
                    .collect();
                let _ = reply.send(Answer { user, kernel });
            }
        }
    }
}
