//! Continuous profiling (`superprof agent --push DEST`, issue 18). The whole machine is
//! sampled per CPU (perf's `-a`; root or CAP_PERFMON), or the processes given with `--pid`;
//! every interval the samples become one profile per process, labelled with its name, pid,
//! host and cgroup, and go to the server through [`superprof_push`] on a thread of their own, so
//! that a slow or absent server never stalls the sampling. While the server cannot be
//! reached, whole intervals wait in a queue of `--buffer` intervals; beyond it the oldest are
//! dropped, and counted. SIGTERM, SIGINT or SIGHUP end the current interval early, and what
//! is queued is pushed within 10 s before superprof exits.
//!
//! Memory stays bounded: the collector forgets each interval's samples, frames and stacks
//! once its profiles are built, and the processes that are gone; what it keeps (mappings,
//! ELF files and symbols) grows with the distinct executables and libraries that run.

use std::collections::VecDeque;
use std::sync::mpsc;
use std::time::{Duration, Instant};

use superprof_profile::{Meta, Profile};
use superprof_push::{self as push, Dest, PushArgs, PushOptions};
use superprof_sample::{PerfSampler, SamplerConfig, TargetMode};

use crate::collect::Collector;
use crate::perf::Drainer;
use crate::{Clock, Error, Result};

/// What the agent samples, and where its profiles go.
#[derive(Debug, Clone)]
pub struct AgentConfig {
    /// The server (`--push DEST`), with the application name, labels and tenant.
    pub push: PushArgs,
    /// How long each profile covers.
    pub interval: Duration,
    /// Samples per second per CPU (or per thread with `pids`).
    pub frequency: u32,
    /// The processes to sample; none: every process, per CPU.
    pub pids: Vec<u32>,
    /// Intervals kept while the server cannot be reached (at least 1).
    pub buffer: usize,
    /// How long to run (none: until stopped).
    pub duration: Option<Duration>,
    /// Bytes of user stack copied per sample.
    pub stack_size: u32,
    /// Whether the caller was asked to stop (SIGTERM, Ctrl-C): checked at every poll.
    pub stop: fn() -> bool,
}

/// How long the queue may take to empty at the end.
const FLUSH_WITHIN: Duration = Duration::from_secs(10);

/// One interval's profiles, each with what goes with it.
struct Batch {
    index: u64,
    profiles: Vec<(Profile, PushOptions)>,
}

/// What the pushing thread did.
#[derive(Default, Debug)]
struct Totals {
    intervals: u64,
    profiles: u64,
    bytes: u64,
    dropped_intervals: u64,
    refused: u64,
}

/// Samples until `stop` says so, or the duration passes, or every process given has ended;
/// pushes what is queued, and says what was pushed.
///
/// (One function of 151 lines: the samplers opened, one loop cutting the rings into intervals, then
/// the pusher joined and its totals said; `samplers`, `drainers`, `collector`, the interval's
/// `start` and the channel to the pusher live through all three, and end in this order.)
pub fn run(args: &AgentConfig) -> Result<()> {
    let (dest, opts) = push::parse(&args.push)?;
    if args.buffer == 0 {
        return Err(Error::Invalid("--buffer must be 1 or more".into()));
    }
    let config = SamplerConfig {
        frequency: args.frequency,
        stack_size: args.stack_size,
        ..SamplerConfig::default()
    };
    let mut samplers = Vec::new();
    if args.pids.is_empty() {
        samplers.push(
            PerfSampler::open_system(&config)
                .map_err(|e| Error::from(e).while_("superprof agent"))?,
        );
    } else {
        for &pid in &args.pids {
            samplers.push(
                PerfSampler::open(pid, TargetMode::Attached, &config).map_err(|e| {
                    Error::from(e).while_(format!("superprof agent: process {pid}"))
                })?,
            );
        }
    }
    let mut collector = Collector::default();
    if samplers.iter().all(|s| s.kernel_stacks()) {
        collector.expect_kernel_frames();
    }
    let mut drainers: Vec<Drainer> = samplers.iter().map(Drainer::new).collect();
    let event = samplers[0].event_name();
    let frequency = samplers[0].frequency();
    let own = std::process::id();
    let mut meta = Meta {
        event: event.to_owned(),
        frequency,
        ..Meta::default()
    };
    superprof_resolve::stamp(&mut meta);
    let host = meta.host.clone();
    for s in &samplers {
        s.enable()?;
    }
    superprof_unwind::say!(
        "superprof agent: sampling {} at {frequency} Hz ({event}), a profile per process every {:?} to {}",
        if args.pids.is_empty() {
            "every process (per CPU)".to_owned()
        } else {
            format!("process{} {:?}", if args.pids.len() == 1 { "" } else { "es" }, args.pids)
        },
        args.interval,
        dest.name()
    );
    let (tx, rx) = mpsc::channel::<Batch>();
    let pusher = {
        let dest = dest.clone();
        let (cap, interval) = (args.buffer, args.interval);
        std::thread::Builder::new()
            .name("push".into())
            .spawn(move || push_loop(&dest, rx, cap, interval))?
    };
    let started = Instant::now();
    let mut start = Clock::now();
    let interval_ns = args.interval.as_nanos() as u64;
    let mut index = 0u64;
    loop {
        // (The rings hold seconds of samples at an agent's rates: a poll of the first
        // sampler's, or a short sleep, then every ring.)
        samplers[0].wait(&[], 100);
        let stop = (args.stop)()
            || args.duration.is_some_and(|d| started.elapsed() >= d)
            || (!args.pids.is_empty()
                && args
                    .pids
                    .iter()
                    .all(|&p| !superprof_trace::process_alive(p)));
        let horizon = Drainer::horizon();
        let end = start.monotonic_ns.saturating_add(interval_ns);
        // The interval's end, or now when stopping; records after it wait for the next one.
        let cut = if stop { u64::MAX } else { horizon.min(end) };
        for (s, d) in samplers.iter_mut().zip(&mut drainers) {
            d.drain(s, &mut collector, cut);
        }
        if !stop && horizon < end {
            continue;
        }
        let now = superprof_sample::monotonic_ns();
        let until = if stop { now } else { end };
        let mut m = meta.clone();
        m.start_time_unix_ns = start.unix_ns;
        m.duration_ns = until.saturating_sub(start.monotonic_ns);
        let mut whole = Profile::default();
        whole.meta = m;
        let whole = collector.finish_interval(whole, start.monotonic_ns);
        let profiles = superprof_profile::filter::split_by_process(&whole)
            .into_iter()
            // The idle task, and superprof itself unless asked for.
            .filter(|(pid, _)| *pid != 0 && (*pid != own || args.pids.contains(&own)))
            .map(|(pid, p)| labelled(pid, p, &opts, &host))
            .collect::<Vec<_>>();
        index += 1;
        let _ = tx.send(Batch { index, profiles });
        start = Clock {
            monotonic_ns: until,
            unix_ns: start
                .unix_ns
                .saturating_add(until.saturating_sub(start.monotonic_ns)),
        };
        if stop {
            break;
        }
    }
    for s in &samplers {
        s.disable();
    }
    drop(samplers);
    drop(tx);
    let totals = pusher
        .join()
        .map_err(|_| Error::Invalid("the pushing thread failed".into()))?;
    superprof_unwind::say!(
        "superprof agent: {} interval{} pushed ({} profiles, {} bytes){}{}",
        totals.intervals,
        if totals.intervals == 1 { "" } else { "s" },
        totals.profiles,
        totals.bytes,
        if totals.dropped_intervals > 0 {
            format!(
                "; {} interval{} dropped while {} could not be reached",
                totals.dropped_intervals,
                if totals.dropped_intervals == 1 {
                    ""
                } else {
                    "s"
                },
                dest.name()
            )
        } else {
            String::new()
        },
        if totals.refused > 0 {
            format!("; {} profiles refused by the server", totals.refused)
        } else {
            String::new()
        }
    );
    Ok(())
}

/// A label value as the servers take it: no control characters, none of `{},=`.
fn label_value(s: &str) -> String {
    s.chars()
        .map(|c| {
            if c.is_control() || "{},=\"".contains(c) {
                '_'
            } else {
                c
            }
        })
        .take(200)
        .collect()
}

/// The cgroup (v2) a process is in, where known and not the root.
fn cgroup_of(pid: u32) -> Option<String> {
    let text = std::fs::read_to_string(format!("/proc/{pid}/cgroup")).ok()?;
    let path = text.lines().find_map(|l| l.strip_prefix("0::"))?.trim();
    (!path.is_empty() && path != "/").then(|| path.to_owned())
}

/// A process's profile with its name as the command and its labels: `process_name`, `pid`,
/// `host`, `cgroup` (where known), then the agent's own `--label`s.
fn labelled(pid: u32, mut p: Profile, opts: &PushOptions, host: &str) -> (Profile, PushOptions) {
    // The process's name (its main thread's): from /proc while it runs, else from the
    // profile's threads.
    let name = std::fs::read_to_string(format!("/proc/{pid}/comm"))
        .ok()
        .map(|c| c.trim().to_owned())
        .filter(|n| !n.is_empty())
        .or_else(|| {
            p.threads
                .iter()
                .find(|t| t.tid == pid)
                .or(p.threads.first())
                .map(|t| p.str(t.name).to_owned())
                .filter(|n| !n.is_empty() && !n.starts_with("thread-"))
        })
        .unwrap_or_else(|| format!("pid-{pid}"));
    let name = label_value(&name);
    p.meta.command = vec![name.clone()];
    let mut labels = vec![
        ("process_name".to_owned(), name.clone()),
        ("pid".to_owned(), pid.to_string()),
    ];
    if !host.is_empty() {
        labels.push(("host".to_owned(), label_value(host)));
    }
    if let Some(c) = cgroup_of(pid) {
        labels.push(("cgroup".to_owned(), label_value(&c)));
    }
    labels.extend(
        opts.labels
            .iter()
            .filter(|(k, _)| !labels.iter().any(|(l, _)| l == k))
            .cloned()
            .collect::<Vec<_>>(),
    );
    let opts = PushOptions {
        app: Some(opts.app.clone().unwrap_or_else(|| name.clone())),
        labels,
        tenant: opts.tenant.clone(),
    };
    (p, opts)
}

/// The pushing thread: sends each interval's profiles in order; while the server cannot be
/// reached, waits (backing off up to an interval) with at most `cap` intervals queued,
/// dropping the oldest beyond; when the sampling side hangs up, empties the queue within
/// [`FLUSH_WITHIN`].
fn push_loop(dest: &Dest, rx: mpsc::Receiver<Batch>, cap: usize, interval: Duration) -> Totals {
    let mut totals = Totals::default();
    let mut queue: VecDeque<Batch> = VecDeque::new();
    let mut backoff = Duration::from_millis(250);
    let mut retry_at: Option<Instant> = None;
    let mut flush_by: Option<Instant> = None;
    loop {
        // New intervals: wait for one when there is nothing to do.
        let wait = match (queue.is_empty(), retry_at) {
            (true, _) if flush_by.is_none() => None,
            (_, Some(at)) => Some(at.saturating_duration_since(Instant::now())),
            _ => Some(Duration::ZERO),
        };
        let got = match wait {
            None => rx.recv().map_err(|_| mpsc::RecvTimeoutError::Disconnected),
            // (Hung up: nothing more will come, the wait is a sleep.)
            Some(d) if flush_by.is_some() => {
                std::thread::sleep(d.min(Duration::from_millis(100)));
                Err(mpsc::RecvTimeoutError::Timeout)
            }
            Some(d) => rx.recv_timeout(d),
        };
        match got {
            Ok(b) => queue.push_back(b),
            Err(mpsc::RecvTimeoutError::Disconnected) if flush_by.is_none() => {
                flush_by = Some(Instant::now() + FLUSH_WITHIN);
            }
            Err(_) => {}
        }
        while queue.len() > cap {
            let old = queue.pop_front().expect("a queue longer than its cap");
            totals.dropped_intervals += 1;
            superprof_unwind::say!(
                "superprof agent: {} still cannot be reached: interval {} dropped ({} so far)",
                dest.name(),
                old.index,
                totals.dropped_intervals
            );
        }
        if flush_by.is_some_and(|by| Instant::now() >= by) {
            totals.dropped_intervals += queue.len() as u64;
            return totals;
        }
        if retry_at.is_some_and(|at| Instant::now() < at) {
            continue;
        }
        retry_at = None;
        // The oldest interval's profiles, one after the other.
        while let Some(front) = queue.front_mut() {
            let Some((profile, opts)) = front.profiles.first() else {
                queue.pop_front();
                totals.intervals += 1;
                continue;
            };
            match push::send_once(dest, profile, opts) {
                Ok(sent) => {
                    totals.profiles += 1;
                    totals.bytes += sent.bytes as u64;
                    front.profiles.remove(0);
                    backoff = Duration::from_millis(250);
                }
                Err(f) if f.transient => {
                    superprof_unwind::say!(
                        "superprof agent: cannot push to {} ({}); trying again in {:.1} s",
                        dest.name(),
                        f.message,
                        backoff.as_secs_f64()
                    );
                    retry_at = Some(Instant::now() + backoff);
                    backoff = (backoff * 2).min(interval.max(Duration::from_secs(1)));
                    break;
                }
                Err(f) => {
                    superprof_unwind::say!(
                        "superprof agent: {} refused a profile of {}: {}",
                        dest.name(),
                        profile.meta.command.first().map_or("?", |c| c.as_str()),
                        f.message
                    );
                    totals.refused += 1;
                    front.profiles.remove(0);
                }
            }
        }
        if queue.is_empty() && flush_by.is_some() {
            return totals;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn label_values_are_what_servers_take() {
        assert_eq!(label_value("kworker/1:2H-kblockd"), "kworker/1:2H-kblockd");
        assert_eq!(label_value("a{b},c=d\"e\nf"), "a_b__c_d_e_f");
        assert_eq!(label_value(&"x".repeat(300)).len(), 200);
        // Each is accepted by the label check of --label.
        assert!(push::parse_label(&format!("k={}", label_value("a{=},\t"))).is_ok());
    }

    #[test]
    fn a_process_profile_is_named_and_labelled() {
        let mut p = Profile::default();
        p.add_thread(4_000_000, 4_000_001, "worker");
        let opts = PushOptions {
            app: None,
            labels: vec![("env".into(), "ci".into()), ("pid".into(), "clash".into())],
            tenant: None,
        };
        // (A pid that cannot exist: its name comes from the profile's threads.)
        let (p, o) = labelled(4_000_000, p, &opts, "vm");
        assert_eq!(p.meta.command, ["worker"]);
        assert_eq!(o.app.as_deref(), Some("worker"));
        assert_eq!(
            o.labels,
            [
                ("process_name".to_owned(), "worker".to_owned()),
                ("pid".into(), "4000000".into()),
                ("host".into(), "vm".into()),
                ("env".into(), "ci".into()),
            ]
        );
        // Its own cgroup, as /proc says.
        let own = cgroup_of(std::process::id());
        let text = std::fs::read_to_string("/proc/self/cgroup").unwrap();
        assert_eq!(own.is_some(), !text.trim_end().ends_with("::/"));
    }
}
