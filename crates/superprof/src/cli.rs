//! Command-line arguments, parsed by clap into plain structs.

use std::path::PathBuf;
use std::time::Duration;

use clap::{Args, Parser, Subcommand, ValueEnum};

/// A number of seconds (`--duration`): finite, not negative.
/// A duration as `15s`, `500ms`, `2m`, `1h`, or plain seconds; more than 0.
fn parse_interval(s: &str) -> Result<Duration, String> {
    let (number, unit) = match s.find(|c: char| c.is_ascii_alphabetic()) {
        Some(i) => s.split_at(i),
        None => (s, "s"),
    };
    let scale = match unit {
        "ms" => 0.001,
        "s" => 1.0,
        "m" | "min" => 60.0,
        "h" => 3600.0,
        _ => return Err(format!("'{s}': give a duration such as 15s, 500ms or 2m")),
    };
    let v: f64 = number
        .parse()
        .map_err(|_| format!("'{s}': give a duration such as 15s, 500ms or 2m"))?;
    match Duration::try_from_secs_f64(v * scale) {
        Ok(d) if d >= Duration::from_millis(100) => Ok(d),
        _ => Err(format!("'{s}': the duration must be 100ms or more")),
    }
}

fn parse_secs(s: &str) -> Result<Duration, String> {
    let secs: f64 = s
        .parse()
        .map_err(|_| format!("'{s}' is not a number of seconds"))?;
    Duration::try_from_secs_f64(secs)
        .map_err(|_| format!("'{s}' must be a finite number of seconds, 0 or more"))
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum SamplerArg {
    Auto,
    Perf,
    Ptrace,
}

#[derive(Debug, Parser)]
#[command(
    name = "superprof",
    version,
    about = "A sampling profiler for Linux: full call stacks, symbols, flamegraphs"
)]
pub struct Cli {
    #[command(subcommand)]
    pub command: Command,
}

#[derive(Debug, Subcommand)]
pub enum Command {
    /// Sample a program (launched: `record PROG ARGS...` or after `--`; or attached with -p)
    /// with full call stacks
    Record(RecordArgs),
    /// Compare two profiles, the baseline first as perf diff takes them: `diff BEFORE AFTER`
    /// is `report AFTER --diff BEFORE` (top, folded or a differential svg)
    Diff(DiffArgs),
    /// A live table of the hottest functions, refreshed as perf top's: the whole machine
    /// (root), or a process (-p), a thread (-t), a command; q or Ctrl-C quits
    Top(TopArgs),
    /// Read a profile file (.parquet) and show or convert it, optionally filtered
    Report(ReportArgs),
    /// Log every syscall of every thread (strace-like), then a summary (like strace -c)
    Syscalls(SyscallsArgs),
    /// Count events (page faults, instructions...) inside individual functions or ranges
    Stat(StatArgs),
    /// Which basic blocks run most: exact counts, coverage, or sampled heat
    Blocks(BlocksArgs),
    /// Profile an operating-system kernel (and its programs) running in QEMU, from outside
    Qemu(QemuArgs),
    /// Continuous profiling: the whole machine (or the processes given), one profile per
    /// process and interval, pushed to Pyroscope, Parca or an OTLP receiver
    Agent(AgentArgs),
    /// Run an unmodified program with libsuperprof preloaded, profiling it (and the programs
    /// it runs) from start to exit
    Preload(PreloadArgs),
    /// Profile a built-in demo workload: prints the top table and writes demo.svg
    Demo(DemoArgs),
    /// Print a shell completion script: `source <(superprof completions bash)`, or save it in
    /// the shell's completion folder
    Completions {
        #[arg(value_enum, value_name = "SHELL")]
        shell: clap_complete::Shell,
    },
    /// Print the man page (roff) of superprof, or of one of its subcommands:
    /// `superprof man > superprof.1`, `superprof man record | man -l -`
    Man {
        #[arg(value_name = "SUBCOMMAND")]
        subcommand: Option<String>,
    },
    /// Calls the empty region `stat` measures its probe engine's cost on (run by `stat`)
    #[command(hide = true, name = "__stat-calibration")]
    StatCalibration {
        calls: usize,
        kind: String,
        gap_us: u64,
    },
    /// The demo's workload (run by `superprof demo`)
    #[command(hide = true, name = "__demo-workload")]
    DemoWorkload {
        #[arg(long, default_value_t = 3.0)]
        seconds: f64,
    },
}

#[derive(Debug, Args)]
pub struct AgentArgs {
    /// Where the profiles go: pyroscope:URL, parca:URL, otlp:URL (gRPC) or otlp-http:URL,
    /// URL being http://HOST:PORT or https://HOST:PORT
    #[arg(long, value_name = "DEST")]
    pub push: String,
    /// How long each profile covers: 15s, 1m, 500ms...
    #[arg(long, value_name = "DURATION", default_value = "15s", value_parser = parse_interval)]
    pub interval: Duration,
    /// Samples per second per CPU (a prime, so as not to beat with periodic work)
    #[arg(short = 'F', long = "freq", value_name = "HZ", default_value_t = 19)]
    pub frequency: u32,
    /// Profile these processes (and their threads) only; default: the whole machine
    #[arg(short = 'p', long = "pid", value_name = "PID")]
    pub pids: Vec<u32>,
    /// The application name (default: each process's name)
    #[arg(long, value_name = "NAME")]
    pub app: Option<String>,
    /// A label of every profile (repeat for several)
    #[arg(long = "label", value_name = "KEY=VALUE")]
    pub labels: Vec<String>,
    /// The tenant, for a multi-tenant server (the X-Scope-OrgID header; Parca's tenant field)
    #[arg(long, value_name = "ID")]
    pub tenant: Option<String>,
    /// Intervals kept while the server cannot be reached; older ones are dropped (and counted)
    #[arg(long, value_name = "N", default_value_t = 8)]
    pub buffer: usize,
    /// Stop after this long (default: until SIGTERM or Ctrl-C, which push what is left)
    #[arg(long, value_name = "DURATION", value_parser = parse_interval)]
    pub duration: Option<Duration>,
    /// Bytes of user stack copied per sample
    #[arg(long = "stack-size", value_name = "BYTES", default_value_t = 16384)]
    pub stack_size: u32,
}

#[derive(Debug, Args)]
pub struct RecordArgs {
    /// Sampling frequency in Hz
    #[arg(short = 'F', long = "freq", value_name = "HZ", default_value_t = 999)]
    pub frequency: u32,
    /// Output file; the format follows the extension (.parquet, .folded, .svg, .pb.gz,
    /// .speedscope.json, .firefox.json, .html). Repeat for several. Default: superprof.parquet
    #[arg(short = 'o', long = "output", value_name = "OUT")]
    pub outputs: Vec<PathBuf>,
    /// Stop recording after this many seconds
    #[arg(long, value_name = "SECS", value_parser = parse_secs)]
    pub duration: Option<Duration>,
    /// Bytes of user stack copied with each sample
    #[arg(long = "stack-size", value_name = "BYTES", default_value_t = 32768)]
    pub stack_size: u32,
    /// Call graphs, as perf's -g asks: superprof always records whole stacks (unwound from
    /// the CFI, frame pointers or not), so this changes nothing
    #[arg(short = 'g')]
    pub g: bool,
    /// How stacks are unwound: dwarf or dwarf,SIZE (the default: a copy of SIZE bytes of user
    /// stack per sample, unwound from the CFI, frame pointers or not) or fp (the kernel
    /// follows frame pointers: no stack copy, but code built without them loses callers)
    #[arg(long = "call-graph", value_name = "MODE")]
    pub call_graph: Option<String>,
    #[command(flatten)]
    pub sampled: EventArgs,
    /// Do not print the top table
    #[arg(short = 'q', long)]
    pub quiet: bool,
    /// Full function names in the table (templates and argument lists kept)
    #[arg(short = 'v', long)]
    pub verbose: bool,
    /// Sampler: perf (perf_event_open), ptrace (works where perf_event_open is denied), or
    /// auto (perf, falling back to ptrace with a notice)
    #[arg(long, value_enum, default_value_t = SamplerArg::Auto)]
    pub sampler: SamplerArg,
    /// Leave a launched node, java or python as it is (by default superprof asks them to
    /// name their JIT-compiled code: --perf-basic-prof, -XX:+PreserveFramePointer
    /// -XX:+DumpPerfMapAtExit, PYTHONPERFSUPPORT=1)
    #[arg(long = "no-runtime-setup")]
    pub no_runtime_setup: bool,
    /// Also record the time each thread spends off the CPU (blocked, sleeping, preempted),
    /// with the stack it waited in: the profile adds up to wall-clock time per thread
    #[arg(long = "off-cpu")]
    pub off_cpu: bool,
    /// Count exactly how often functions are called while the command is sampled, and give
    /// each one's time per call (its sampled CPU time over its calls, ± the error the sample
    /// count leaves): FUNC,FUNC names them (counted from the start), none counts the hottest
    /// (--precise-top), chosen after 0.2 s of samples and again each second. Counted in the
    /// program: a counter at each function's entry, a few nanoseconds per call. Before the
    /// command, put -- after a bare --precise
    #[arg(
        long,
        value_name = "FUNC",
        value_delimiter = ',',
        num_args = 0..=1,
        default_missing_value = ""
    )]
    pub precise: Option<Vec<String>>,
    /// How many of the hottest functions `--precise` with no names counts
    #[arg(long = "precise-top", value_name = "N", default_value_t = 10)]
    pub precise_top: usize,
    /// With --precise: count every block of those functions too, for each source line's
    /// executions (`report --lines FUNC`); a counter in each loop's body costs a few
    /// nanoseconds per iteration
    #[arg(long = "precise-lines", requires = "precise")]
    pub precise_lines: bool,
    /// After the recording, send the profile to a server (the local outputs are written
    /// too): pyroscope:URL (Pyroscope's HTTP ingest), parca:URL (Parca's gRPC WriteRaw),
    /// otlp:URL (OTLP profiles over gRPC) or otlp-http:URL (OTLP over HTTP); URL is
    /// http://HOST:PORT or https://HOST:PORT
    #[arg(long, value_name = "DEST")]
    pub push: Option<String>,
    /// The application the pushed profile belongs to (default: the command's name)
    #[arg(long, value_name = "NAME", requires = "push")]
    pub app: Option<String>,
    /// A label of the pushed profile (repeat for several)
    #[arg(long = "label", value_name = "KEY=VALUE", requires = "push")]
    pub labels: Vec<String>,
    /// The tenant, for a multi-tenant server (the X-Scope-OrgID header; Parca's tenant field)
    #[arg(long, value_name = "ID", requires = "push")]
    pub tenant: Option<String>,
    #[command(flatten)]
    pub target: RecordTargetArgs,
}

/// What record and top sample: perf's `-e` and `-c`.
#[derive(Debug, Args)]
pub struct EventArgs {
    /// Events to sample, as perf names them (comma-separated, or repeat -e): cycles,
    /// instructions, cache-misses, page-faults, context-switches, l1d-read-miss,
    /// sched:sched_switch, rNNN; :u or :k for user space or the kernel only. `superprof stat
    /// --list` shows them. Default: CPU time (cycles where the CPU counts them, else
    /// cpu-clock)
    #[arg(
        short = 'e',
        long = "event",
        value_name = "EVENT",
        value_delimiter = ','
    )]
    pub events: Vec<String>,
    /// Sample every PERIOD occurrences of the events instead of -F times a second (CPU-time
    /// events: every PERIOD nanoseconds)
    #[arg(short = 'c', long = "count", value_name = "PERIOD")]
    pub period: Option<u64>,
}

#[derive(Debug, Args)]
pub struct TopArgs {
    /// Sampling frequency in Hz
    #[arg(short = 'F', long = "freq", value_name = "HZ", default_value_t = 999)]
    pub frequency: u32,
    #[command(flatten)]
    pub sampled: EventArgs,
    /// Seconds between refreshes
    #[arg(short = 'd', long = "delay", value_name = "SECS", default_value = "2", value_parser = parse_secs)]
    pub delay: Duration,
    /// The table covers the samples of this many last seconds (functions no longer hot fade
    /// out)
    #[arg(long, value_name = "SECS", default_value = "10", value_parser = parse_secs)]
    pub window: Duration,
    /// Stop after this many seconds
    #[arg(long, value_name = "SECS", value_parser = parse_secs)]
    pub duration: Option<Duration>,
    /// Full function names (templates and argument lists kept)
    #[arg(short = 'v', long)]
    pub verbose: bool,
    /// Attach to this running process and all its threads
    #[arg(short = 'p', long = "pid", value_name = "PID", conflicts_with_all = ["command", "tid", "all_cpus", "cpus"])]
    pub pid: Option<u32>,
    /// Attach to this thread only
    #[arg(short = 't', long = "tid", value_name = "TID", conflicts_with_all = ["command", "all_cpus", "cpus"])]
    pub tid: Option<u32>,
    /// The whole machine (the default without -p, -t or a command)
    #[arg(short = 'a', long = "all-cpus")]
    pub all_cpus: bool,
    /// These CPUs only: 0-3,5
    #[arg(short = 'C', long = "cpu", value_name = "CPUS")]
    pub cpus: Option<String>,
    /// A command to launch and watch (its output shares the terminal)
    #[arg(value_name = "CMD", trailing_var_arg = true)]
    pub command: Vec<std::ffi::OsString>,
}

impl TopArgs {
    /// What is watched: record's targets, the machine by default.
    pub fn target(&self) -> anyhow::Result<superprof_record::Target> {
        let none = self.pid.is_none() && self.tid.is_none() && self.command.is_empty();
        RecordTargetArgs {
            pid: self.pid,
            tid: self.tid,
            all_cpus: self.all_cpus || (none && self.cpus.is_none()),
            cpus: self.cpus.clone(),
            command: self.command.clone(),
        }
        .target()
    }
}

/// What `record` samples: a command, a process, a thread, or the machine.
#[derive(Debug, Args)]
pub struct RecordTargetArgs {
    /// Attach to this running process and all its threads
    #[arg(
        short = 'p',
        long = "pid",
        value_name = "PID",
        conflicts_with_all = ["command", "tid", "all_cpus", "cpus"]
    )]
    pub pid: Option<u32>,
    /// Attach to this thread only (and the threads it starts)
    #[arg(
        short = 't',
        long = "tid",
        value_name = "TID",
        conflicts_with_all = ["command", "all_cpus", "cpus"]
    )]
    pub tid: Option<u32>,
    /// Sample every process of the machine (root), kernel frames too, until --duration or
    /// Ctrl-C, or while the command given runs
    #[arg(short = 'a', long = "all-cpus")]
    pub all_cpus: bool,
    /// Sample these CPUs only, every process on them (as -a): 0-3,5
    #[arg(short = 'C', long = "cpu", value_name = "CPUS")]
    pub cpus: Option<String>,
    /// The command to launch: its arguments are its own (after `--` too)
    #[arg(
        value_name = "CMD",
        trailing_var_arg = true,
        required_unless_present_any = ["pid", "tid", "all_cpus", "cpus"]
    )]
    pub command: Vec<std::ffi::OsString>,
}

impl RecordTargetArgs {
    /// The process, thread, machine or command sampled (`-C`'s list checked).
    pub fn target(&self) -> anyhow::Result<superprof_record::Target> {
        use superprof_record::Target;
        if let Some(pid) = self.pid {
            return Ok(Target::Pid(pid));
        }
        if let Some(tid) = self.tid {
            return Ok(Target::Thread(tid));
        }
        if self.all_cpus || self.cpus.is_some() {
            let cpus = match &self.cpus {
                Some(list) => {
                    let cpus = superprof_sample::parse_cpu_list(list)
                        .map_err(|e| anyhow::anyhow!("-C {list}: {e}"))?;
                    if cpus.is_empty() {
                        anyhow::bail!("-C names no CPU");
                    }
                    Some(cpus)
                }
                None => None,
            };
            return Ok(Target::System {
                cpus,
                command: self.command.clone(),
            });
        }
        Ok(Target::Command(self.command.clone()))
    }
}

#[derive(Debug, Args)]
pub struct DemoArgs {
    /// Where to write the flamegraph
    #[arg(
        short = 'o',
        long = "output",
        value_name = "OUT",
        default_value = "demo.svg"
    )]
    pub output: PathBuf,
    /// How long the workload runs, in seconds
    #[arg(long, value_name = "SECS", default_value_t = 3.0)]
    pub seconds: f64,
}

#[derive(Debug, Args)]
pub struct ReportArgs {
    /// The profile to read (a .parquet file written by superprof)
    #[arg(value_name = "FILE")]
    pub file: PathBuf,
    /// The calls counted by `record --precise`: each function's calls, time per call (± its
    /// error), samples and share; --format json for `{"functions": [...]}` on stdout
    #[arg(long)]
    pub calls: bool,
    /// The executions of each source line of FUNC, a function counted by `record --precise
    /// --precise-lines`, beside the source where it can be read
    #[arg(long, value_name = "FUNC", conflicts_with = "calls")]
    pub lines: Option<String>,
    #[command(flatten)]
    pub view: ViewArgs,
}

/// `superprof diff BEFORE AFTER`: perf diff's order for `report AFTER --diff BEFORE`.
#[derive(Debug, Args)]
pub struct DiffArgs {
    /// The baseline profile (.parquet)
    #[arg(value_name = "BEFORE")]
    pub before: PathBuf,
    /// The profile compared with it (.parquet)
    #[arg(value_name = "AFTER")]
    pub after: PathBuf,
    #[command(flatten)]
    pub view: ViewArgs,
}

/// How `report` (and `diff`) shows a profile: the format, the output, the filters.
#[derive(Debug, Args)]
pub struct ViewArgs {
    /// Output format: top, tree, folded, svg, parquet, pprof, speedscope, firefox, html
    /// (default: from the extension of -o, else top)
    #[arg(long, value_name = "FORMAT")]
    pub format: Option<String>,
    /// Output file (default: stdout)
    #[arg(short = 'o', long = "output", value_name = "OUT")]
    pub output: Option<PathBuf>,
    /// Keep only this thread (repeat for several)
    #[arg(long = "tid", value_name = "N")]
    pub tids: Vec<u32>,
    /// Keep samples from this many seconds after the start of the recording
    #[arg(long, value_name = "SECS")]
    pub since: Option<f64>,
    /// Keep samples until this many seconds after the start of the recording
    #[arg(long, value_name = "SECS")]
    pub until: Option<f64>,
    /// Keep only stacks through this function, re-rooted at it
    #[arg(long, value_name = "FUNC")]
    pub focus: Option<String>,
    /// Drop stacks through this function
    #[arg(long, value_name = "FUNC")]
    pub exclude: Option<String>,
    /// Group the samples by these keys, as perf report --sort: comm, pid, tid, dso, sym (any
    /// of them, comma-separated); for the table (each group's share) and folded stacks (rooted
    /// at the process and thread keys, frames named by the frame keys)
    #[arg(long, value_name = "KEYS")]
    pub sort: Option<String>,
    /// Show this event of a profile of several (`record -e A,B`); the table shows each in
    /// turn, the other formats the first unless told
    #[arg(long, value_name = "EVENT")]
    pub event: Option<String>,
    /// Keep only on-CPU samples (of a profile recorded with --off-cpu)
    #[arg(long = "on-cpu", conflicts_with = "off_cpu")]
    pub on_cpu: bool,
    /// Keep only off-CPU samples: waits and preemptions (of a profile recorded with --off-cpu)
    #[arg(long = "off-cpu")]
    pub off_cpu: bool,
    /// Compare with this earlier profile: FILE is the after, BEFORE the before (top, folded
    /// `stack BEFORE AFTER`, or a differential svg); the filters apply to both
    #[arg(long, value_name = "BEFORE")]
    pub diff: Option<PathBuf>,
    /// With --diff (or `superprof diff`): sample counts instead of shares of each profile's
    /// total
    #[arg(long)]
    pub absolute: bool,
    /// Full function names in the table (templates and argument lists kept)
    #[arg(short = 'v', long)]
    pub verbose: bool,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum SyscallFormat {
    Table,
    Json,
}

#[derive(Debug, Args)]
pub struct SyscallsArgs {
    /// Output format
    #[arg(long, value_enum, default_value_t = SyscallFormat::Table)]
    pub format: SyscallFormat,
    /// Write the log to this file instead of stderr
    #[arg(short = 'o', long = "output", value_name = "FILE")]
    pub output: Option<PathBuf>,
    /// Only the summary, no line per syscall
    #[arg(long = "summary-only")]
    pub summary_only: bool,
    /// Follow child processes over fork and vfork
    #[arg(long = "follow-forks")]
    pub follow_forks: bool,
    /// Stop after this many seconds
    #[arg(long, value_name = "SECS", value_parser = parse_secs)]
    pub duration: Option<Duration>,
    #[command(flatten)]
    pub target: TargetArgs,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum StatFormat {
    Table,
    Csv,
    Json,
}

#[derive(Debug, Args)]
pub struct StatArgs {
    /// A region: a function name (exact, else a unique substring of the demangled name), or an
    /// address range 0xSTART-0xEND of the executable (ELF addresses, as objdump prints them)
    #[arg(short = 'r', long = "region", value_name = "REGION")]
    pub regions: Vec<String>,
    /// Events to count, comma-separated (default: the hardware set, else the software set)
    #[arg(
        short = 'e',
        long = "event",
        value_name = "EVENT,...",
        value_delimiter = ','
    )]
    pub events: Vec<String>,
    /// Events opened as one group, comma-separated (repeat for several groups)
    #[arg(long = "group", value_name = "EVENT,...")]
    pub groups: Vec<String>,
    /// Print every invocation instead of the summary
    #[arg(long = "per-call")]
    pub per_call: bool,
    #[arg(long, value_enum, default_value_t = StatFormat::Table)]
    pub format: StatFormat,
    /// Write the results to this file instead of stdout
    #[arg(short = 'o', long = "output", value_name = "FILE")]
    pub output: Option<PathBuf>,
    /// Stop after this many seconds (an attached process runs on, with no breakpoint left)
    #[arg(long, value_name = "SECS", value_parser = parse_secs)]
    pub duration: Option<Duration>,
    /// List the events of a kind (hardware, software, cache, tracepoint) and whether this
    /// machine supports them
    #[arg(long, value_name = "KIND", num_args = 0..=1, default_missing_value = "all")]
    pub list: Option<String>,
    /// Attach to this running process and all its threads
    #[arg(
        short = 'p',
        long = "pid",
        value_name = "PID",
        conflicts_with = "command"
    )]
    pub pid: Option<u32>,
    /// How regions are probed (default: in-process where it reads every event asked, else
    /// uprobe where allowed, else ptrace)
    #[arg(long, value_enum, value_name = "ENGINE")]
    pub engine: Option<EngineArg>,
    /// The command to launch: its arguments are its own (after `--` too)
    #[arg(
        value_name = "CMD",
        trailing_var_arg = true,
        required_unless_present_any = ["pid", "list"]
    )]
    pub command: Vec<std::ffi::OsString>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum EngineArg {
    /// Code mapped into the program, reached by jumps that replace the probed instructions:
    /// counting (blocks) or recording with system calls (stat); x86_64
    InProcess,
    /// Kernel uprobes reading the counters at each hit, without stopping the program (root)
    Uprobe,
    /// Breakpoints through ptrace: the program stops at each (works without privileges)
    Ptrace,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum BlocksMode {
    /// Exact execution count of every block of the region
    Count,
    /// Which blocks ever ran (one-shot breakpoints)
    Coverage,
    /// Samples per block (the perf sampler; no breakpoints)
    Sample,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum AnalyzerArg {
    /// Decode each instruction (iced-x86, yaxpeax-arm)
    Decode,
    /// Learn which encodings are branches by single-stepping
    Learn,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum BlocksFormat {
    Table,
    Json,
    Csv,
}

#[derive(Debug, Args)]
pub struct BlocksArgs {
    /// A region: a function name, 0xSTART-0xEND of the executable (ELF addresses), or
    /// FILE:LINE-LINE. Repeat for several. Required for count; default for coverage and
    /// sample: the whole executable
    #[arg(short = 'r', long = "region", value_name = "REGION")]
    pub regions: Vec<String>,
    #[arg(long, value_enum, default_value_t = BlocksMode::Count)]
    pub mode: BlocksMode,
    /// How the ptrace engine finds block ends: decode instructions, or learn them by
    /// single-stepping (learn runs count on ptrace unless --engine says otherwise)
    #[arg(long, value_enum, default_value_t = AnalyzerArg::Decode)]
    pub analyzer: AnalyzerArg,
    #[arg(long, value_enum, default_value_t = BlocksFormat::Table)]
    pub format: BlocksFormat,
    /// Print the regions' disassembly with the counts in the margin
    #[arg(long)]
    pub annotate: bool,
    /// Write the results to this file instead of stdout
    #[arg(short = 'o', long = "output", value_name = "FILE")]
    pub output: Option<PathBuf>,
    /// Single-step every block's last instruction instead of working out where the branch
    /// goes from the registers (for comparison)
    #[arg(long = "step-branches", hide = true)]
    pub step_branches: bool,
    /// How count and coverage probe the blocks (default: in-process on x86_64, else ptrace)
    #[arg(long, value_enum, value_name = "ENGINE")]
    pub engine: Option<EngineArg>,
    /// Sampling frequency for --mode sample
    #[arg(short = 'F', long = "freq", value_name = "HZ", default_value_t = 999)]
    pub frequency: u32,
    /// Stop after this many seconds (an attached process runs on, with no breakpoint left)
    #[arg(long, value_name = "SECS", value_parser = parse_secs)]
    pub duration: Option<Duration>,
    #[command(flatten)]
    pub target: TargetArgs,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum QemuBackendArg {
    /// The gdbstub (fast)
    Gdb,
    /// QMP
    Qmp,
}

#[derive(Debug, Args)]
pub struct QemuArgs {
    /// The guest kernel's ELF file (symbols, DWARF, unwind tables); its machine says the
    /// guest's architecture
    #[arg(long, value_name = "ELF")]
    pub kernel: PathBuf,
    /// The kernel's symbols, for a kernel ELF without them (one extracted from a bzImage): a
    /// System.map, or a copy of the guest's /proc/kallsyms (which also names modules' code and
    /// gives the KASLR slide)
    #[arg(long, value_name = "FILE")]
    pub kallsyms: Option<PathBuf>,
    /// Sample through this QMP socket (a Unix socket path, or HOST:PORT)
    #[arg(long, value_name = "SOCKET", conflicts_with = "gdb")]
    pub qmp: Option<String>,
    /// Sample through this gdbstub socket (a Unix socket path, or HOST:PORT)
    #[arg(long, value_name = "SOCKET|HOST:PORT")]
    pub gdb: Option<String>,
    /// ELF files of the guest's programs (or folders of them), recognized by their code
    #[arg(long = "user", value_name = "ELF|DIR")]
    pub users: Vec<PathBuf>,
    /// Milliseconds between samples (0: as fast as possible)
    #[arg(long, value_name = "MS", default_value_t = 10.0)]
    pub interval: f64,
    /// Seconds to profile
    #[arg(long, value_name = "SECS", default_value = "5", value_parser = parse_secs)]
    pub duration: Duration,
    /// Print one symbolized stack and exit
    #[arg(long = "one-shot")]
    pub one_shot: bool,
    /// Keep only samples in the kernel
    #[arg(long = "kernel-only", conflicts_with = "user_only")]
    pub kernel_only: bool,
    /// Keep only samples in the guest's programs
    #[arg(long = "user-only")]
    pub user_only: bool,
    /// Show addresses next to function names (--one-shot, and frames' names in the outputs)
    #[arg(long = "show-addresses")]
    pub show_addresses: bool,
    /// Say more: the backend, what was matched, each sample's time
    #[arg(short = 'v', long)]
    pub verbose: bool,
    /// Output file; the format follows the extension, as for `record`. Repeat for several.
    /// Default: superprof.parquet
    #[arg(short = 'o', long = "output", value_name = "OUT")]
    pub outputs: Vec<PathBuf>,
    /// Launch mode: the socket superprof adds to the QEMU command line
    #[arg(long, value_enum, default_value_t = QemuBackendArg::Gdb)]
    pub backend: QemuBackendArg,
    /// QMP: read memory one word per HMP `x` command, as the original design did (benchmark)
    #[arg(long = "qmp-word-reads", hide = true)]
    pub word_reads: bool,
    /// Launch mode: the QEMU command line, after `--`
    #[arg(last = true, value_name = "QEMU-CMD")]
    pub command: Vec<std::ffi::OsString>,
}

#[derive(Debug, Args)]
pub struct PreloadArgs {
    /// Samples per second of CPU time
    #[arg(short = 'F', long = "freq", value_name = "HZ", default_value_t = 999)]
    pub frequency: u32,
    /// Output file; the format follows the extension, as for `record`. Repeat for several.
    /// Default: superprof.parquet
    #[arg(short = 'o', long = "output", value_name = "OUT")]
    pub outputs: Vec<PathBuf>,
    /// Do not print the top table
    #[arg(short = 'q', long)]
    pub quiet: bool,
    /// Full function names in the table (templates and argument lists kept)
    #[arg(short = 'v', long)]
    pub verbose: bool,
    /// The command to launch: its arguments are its own (after `--` too)
    #[arg(value_name = "CMD", trailing_var_arg = true, required = true)]
    pub command: Vec<std::ffi::OsString>,
}

/// The process to work on: attached with -p, or a command launched (its arguments are its
/// own, after `--` or not).
#[derive(Debug, Args)]
pub struct TargetArgs {
    /// Attach to this running process and all its threads
    #[arg(
        short = 'p',
        long = "pid",
        value_name = "PID",
        conflicts_with = "command"
    )]
    pub pid: Option<u32>,
    /// The command to launch: its arguments are its own (after `--` too)
    #[arg(
        value_name = "CMD",
        trailing_var_arg = true,
        required_unless_present = "pid"
    )]
    pub command: Vec<std::ffi::OsString>,
}

impl TargetArgs {
    /// Where results go without -o: stderr when superprof launches the command (its output
    /// owns stdout), stdout when it attaches.
    pub fn console(&self) -> superprof_resolve::Console {
        superprof_resolve::Console::of_run(self.pid.is_none())
    }

    /// The process attached to, or the command to launch.
    pub fn target(&self) -> superprof_record::Target {
        match self.pid {
            Some(pid) => superprof_record::Target::Pid(pid),
            None => superprof_record::Target::Command(self.command.clone()),
        }
    }
}

// The choices' own types in the libraries, for the values clap parsed.

impl From<EngineArg> for superprof_probe::EngineKind {
    fn from(e: EngineArg) -> Self {
        match e {
            EngineArg::InProcess => Self::InProcess,
            EngineArg::Uprobe => Self::Uprobe,
            EngineArg::Ptrace => Self::Ptrace,
        }
    }
}

impl From<BlocksMode> for superprof_probe::blocks::Mode {
    fn from(m: BlocksMode) -> Self {
        match m {
            BlocksMode::Count => Self::Count,
            BlocksMode::Coverage => Self::Coverage,
            BlocksMode::Sample => Self::Sample,
        }
    }
}

impl From<AnalyzerArg> for superprof_probe::blocks::AnalyzerKind {
    fn from(a: AnalyzerArg) -> Self {
        match a {
            AnalyzerArg::Decode => Self::Decode,
            AnalyzerArg::Learn => Self::Learn,
        }
    }
}

impl From<StatFormat> for superprof_probe::Format {
    fn from(f: StatFormat) -> Self {
        match f {
            StatFormat::Table => Self::Table,
            StatFormat::Csv => Self::Csv,
            StatFormat::Json => Self::Json,
        }
    }
}

impl From<BlocksFormat> for superprof_probe::Format {
    fn from(f: BlocksFormat) -> Self {
        match f {
            BlocksFormat::Table => Self::Table,
            BlocksFormat::Csv => Self::Csv,
            BlocksFormat::Json => Self::Json,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn intervals_take_units() {
        assert_eq!(parse_interval("15s"), Ok(Duration::from_secs(15)));
        assert_eq!(parse_interval("500ms"), Ok(Duration::from_millis(500)));
        assert_eq!(parse_interval("2m"), Ok(Duration::from_secs(120)));
        assert_eq!(parse_interval("1h"), Ok(Duration::from_secs(3600)));
        assert_eq!(parse_interval("2.5"), Ok(Duration::from_millis(2500)));
        for bad in ["", "s", "10x", "50ms", "-1s", "inf", "1e400s"] {
            assert!(parse_interval(bad).is_err(), "{bad}");
        }
    }
}
