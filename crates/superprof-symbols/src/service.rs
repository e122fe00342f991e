//! A symbolizer on its own thread, so that loading symbol files overlaps with recording.
//!
//! While the target runs, the recorder announces each module as it is mapped
//! ([`SymbolService::preload`]); the worker opens and parses its symbols then, on a core the
//! target may not be using. At the end, [`SymbolService::symbolize`] resolves every distinct
//! address in one round trip, and most of the parsing is already done.

use std::path::PathBuf;
use std::sync::mpsc::{channel, Receiver, Sender};
use std::thread::JoinHandle;

use crate::{Kallsyms, SymFrame, Symbolizer};

/// One address to resolve: module path (as the target names it), where to read the file, and
/// the ELF virtual address to look up.
#[derive(Debug, Clone)]
pub struct Query {
    pub path: PathBuf,
    pub open_path: PathBuf,
    pub svma: u64,
}

enum Request {
    Preload(PathBuf, PathBuf),
    Kallsyms,
    Symbolize(Vec<Query>, Vec<u64>, Sender<Answer>),
}

/// Frames for each user query (outermost first), and a name for each kernel address.
pub struct Answer {
    pub user: Vec<Vec<SymFrame>>,
    pub kernel: Vec<Option<String>>,
}

pub struct SymbolService {
    tx: Option<Sender<Request>>,
    worker: Option<JoinHandle<()>>,
}

impl Default for SymbolService {
    fn default() -> Self {
        Self::new()
    }
}

impl SymbolService {
    pub fn new() -> SymbolService {
        let (tx, rx) = channel();
        let worker = std::thread::Builder::new()
            .name("superprof-symbols".into())
            .spawn(move || serve(rx))
            .ok();
        SymbolService {
            tx: Some(tx),
            worker,
        }
    }

    /// Starts loading the symbols of a module in the background.
    pub fn preload(&self, path: PathBuf, open_path: PathBuf) {
        self.send(Request::Preload(path, open_path));
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

    /// Resolves user addresses and kernel addresses; waits for the preloads before it.
    pub fn symbolize(&self, user: Vec<Query>, kernel: Vec<u64>) -> Answer {
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
    fn drop(&mut self) {
        drop(self.tx.take());
        if let Some(w) = self.worker.take() {
            let _ = w.join();
        }
    }
}

fn serve(rx: Receiver<Request>) {
    let mut symbolizer = Symbolizer::default();
    let mut kallsyms: Option<Kallsyms> = None;
    for request in rx {
        match request {
            Request::Preload(path, open) => symbolizer.preload(&path, &open),
            Request::Kallsyms => {
                kallsyms.get_or_insert_with(Kallsyms::load);
            }
            Request::Symbolize(user, kernel, reply) => {
                let user = user
                    .iter()
                    .map(|q| symbolizer.symbolize(&q.path, &q.open_path, q.svma))
                    .collect();
                let k = if kernel.is_empty() {
                    None
                } else {
                    Some(kallsyms.get_or_insert_with(Kallsyms::load))
                };
                let kernel = kernel
                    .iter()
                    .map(|&a| k.as_ref().and_then(|k| k.lookup(a)).map(str::to_owned))
                    .collect();
                let _ = reply.send(Answer { user, kernel });
            }
        }
    }
}
