//! Generated programs for the differential tests of exact counts: small C++ programs, one per
//! seed (the same seed always gives the same program), that count their own calls and print
//! them. Each program has a few functions `gen_f0`, `gen_f1`, … calling one another in the
//! shapes that make counting hard: threads running the same functions at once, recursion and
//! mutual recursion, a signal handler that calls a counted function, `longjmp` and C++
//! exceptions out of several frames, tail calls, and fork and vfork children. A function's
//! first instruction is often the locked, RIP-relative add of its own counter.
//!
//! The program prints, for each function, `count gen_fI outer=N total=M`: `outer`, the calls
//! that were not inside another call of the same function on the same thread (what `stat`
//! counts), `total` every entry (what `blocks` counts at the entry and callgrind counts as
//! calls). Only the launched process's own threads count; a fork child's calls do not.
//! A call left by `longjmp` or an exception is a call.

/// SplitMix64: a small, seedable generator with good statistics.
#[derive(Clone, Debug)]
pub struct Rng(u64);

impl Rng {
    /// The generator for `seed`.
    pub fn new(seed: u64) -> Rng {
        Rng(seed ^ 0x05ee_d0fe_8ac7)
    }

    /// The next 64 random bits.
    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    /// A number in `lo..=hi`.
    pub fn range(&mut self, lo: u64, hi: u64) -> u64 {
        lo + self.next_u64() % (hi - lo + 1)
    }

    /// True with probability `p`.
    pub fn chance(&mut self, p: f64) -> bool {
        (self.next_u64() >> 11) as f64 / (1u64 << 53) as f64 <= p
    }
}

/// One statement of a generated function's body.
#[derive(Clone, Debug, PartialEq)]
enum Step {
    /// `r += fJ(d, …)`, j greater than the function's own index.
    Call(usize),
    /// `if (d > 0) r += fI(d - 1, …)` (not a tail call: code follows).
    Recurse,
    /// `if (d > 0) r += fJ(d - 1, …)`, j smaller: the back edge of a mutual recursion.
    Back(usize),
    /// A loop with a data-dependent branch.
    Loop,
    /// `raise(SIGUSR1)`: the handler calls the last function.
    Raise,
    /// `setjmp`, then `r += fJ(d, …)`; a `longjmp` from below lands here.
    CatchJump(usize),
    /// `try { r += fJ(d, …) } catch (int)`; a `throw` from below lands here.
    CatchThrow(usize),
    /// `longjmp` to the innermost `CatchJump` of the thread, on odd x.
    Jump,
    /// `throw` to the innermost `CatchThrow` of the thread, on odd x.
    Throw,
    /// `pthread_exit` in a worker thread, now and then: the calls under way are left.
    ExitThread,
}

/// A generated program: its source and how to build it.
#[derive(Clone, Debug)]
pub struct Program {
    /// The seed it came from.
    pub seed: u64,
    /// The C++ source.
    pub source: String,
    /// The compiler's flags (optimization level, frame pointers, CET's endbr64).
    pub flags: Vec<String>,
    /// The counted functions' names, `gen_f0` first.
    pub functions: Vec<String>,
    /// What the program does, in a few words (for a failure's message).
    pub shape: String,
    /// (i, j): `gen_fI` ends with a tail call of `gen_fJ`. Where the compiler makes it a call
    /// rather than a jump, build with `-DCALL_TAIL_I`, so that the program counts the call as
    /// lasting until the callee returns.
    pub tail_calls: Vec<(usize, usize)>,
}

/// The program of `seed`, at most [`CALL_BUDGET`] calls a run.
pub fn generate(seed: u64) -> Program {
    generate_within(seed, CALL_BUDGET)
}

/// The program of `seed`, at most about `budget` calls a run (an emulated machine, where a
/// breakpoint stop costs milliseconds, takes fewer).
///
/// (One function of 216 lines: the seed's draws from one generator, in a fixed order (a seed must
/// name the same program), then the C++ source written top to bottom from them; split, the choices
/// (`bodies`, `tail`, `roots`, `depth`, `threads`, `fork`, `vfork`) would travel in a struct.)
pub fn generate_within(seed: u64, budget: u64) -> Program {
    let mut rng = Rng::new(seed);
    let n = rng.range(4, 7) as usize;
    let last = n - 1;
    let mut bodies: Vec<Vec<Step>> = vec![Vec::new(); n];
    let mut tail: Vec<Option<usize>> = vec![None; n];
    let mut late_count = vec![false; n];
    // Which kinds this program has.
    let signals = rng.chance(0.4);
    let jumps = rng.chance(0.4);
    let throws = rng.chance(0.4);
    let exits = rng.chance(0.25);
    for i in 0..last {
        let calls = rng.range(0, 2);
        for _ in 0..calls {
            let j = rng.range(i as u64 + 1, last as u64) as usize;
            bodies[i].push(Step::Call(j));
        }
        if rng.chance(0.35) {
            bodies[i].push(Step::Recurse);
        }
        if i > 0 && rng.chance(0.25) {
            let j = rng.range(0, i as u64 - 1) as usize;
            bodies[i].push(Step::Back(j));
        }
        if rng.chance(0.5) {
            bodies[i].push(Step::Loop);
        }
        if signals && rng.chance(0.4) {
            bodies[i].push(Step::Raise);
        }
        // A catcher calls a deeper function; a thrower is never the handler's function.
        if i + 2 <= last {
            let j = rng.range(i as u64 + 1, last as u64 - 1) as usize;
            if jumps && rng.chance(0.4) {
                bodies[i].push(Step::CatchJump(j));
            }
            if throws && rng.chance(0.4) {
                bodies[i].push(Step::CatchThrow(j));
            }
        }
        if i > 0 && jumps && rng.chance(0.35) {
            bodies[i].push(Step::Jump);
        }
        if i > 0 && throws && rng.chance(0.35) {
            bodies[i].push(Step::Throw);
        }
        if exits && rng.chance(0.3) {
            bodies[i].push(Step::ExitThread);
        }
        shuffle(&mut rng, &mut bodies[i]);
        if rng.chance(0.3) {
            tail[i] = Some(rng.range(i as u64 + 1, last as u64) as usize);
        }
        late_count[i] = rng.chance(0.3);
    }
    // The last function is a leaf (the signal handler's), with a loop or not.
    if rng.chance(0.5) {
        bodies[last].push(Step::Loop);
    }
    let threads = rng.range(0, 4);
    let main_runs = threads == 0 || rng.chance(0.5);
    let mut iterations = rng.range(5, 40);
    let mut depth = rng.range(1, 3);
    let roots: Vec<usize> = (0..rng.range(1, 2))
        .map(|_| rng.range(0, (last as u64).min(2)) as usize)
        .collect();
    let fork = rng.chance(0.25);
    // At most CALL_BUDGET calls a run (the ptrace engine stops twice a call): a shallower
    // recursion, then fewer rounds.
    let runners = threads + main_runs as u64 + fork as u64;
    let per_round = |d: u64| -> u64 {
        let mut memo = vec![vec![None; d as usize + 1]; n];
        roots
            .iter()
            .map(|&r| call_bound(r, d, &bodies, &tail, last, &mut memo))
            .fold(0u64, u64::saturating_add)
            .saturating_mul(runners)
    };
    while depth > 0 && per_round(depth).saturating_mul(iterations) > budget {
        depth -= 1;
    }
    iterations = iterations.min((budget / per_round(depth).max(1)).max(1));
    let vfork = rng.chance(0.25);
    let level = ["-O0", "-O1", "-O2", "-O2", "-O3", "-Os"][rng.range(0, 5) as usize];
    let mut flags = vec![level.to_owned(), "-g".to_owned(), "-pthread".to_owned()];
    if rng.chance(0.5) {
        flags.push("-fomit-frame-pointer".to_owned());
    }
    if rng.chance(0.3) {
        flags.push("-fcf-protection=none".to_owned());
    }

    let functions: Vec<String> = (0..n).map(|i| format!("gen_f{i}")).collect();
    let mut s = String::new();
    s.push_str(&format!(
        "// Generated by superprof-testkit's exact_gen, seed {seed}.\n\
         #include <atomic>\n#include <csetjmp>\n#include <csignal>\n#include <cstdio>\n\
         #include <cstring>\n#include <pthread.h>\n#include <sys/wait.h>\n#include <unistd.h>\n\n\
         #define N {n}\n\
         static std::atomic<long> outer_[N], total_[N];\n\
         static thread_local int depth_[N];\n\
         static thread_local std::jmp_buf *jump_to;\n\
         static thread_local int catching;\n\
         static thread_local bool in_worker;\n\
         #define ENTER(i) do {{ total_[i].fetch_add(1, std::memory_order_relaxed); \
         if (depth_[i]++ == 0) outer_[i].fetch_add(1, std::memory_order_relaxed); }} while (0)\n\
         #define LEAVE(i) (depth_[i]--)\n\n"
    ));
    for f in &functions {
        s.push_str(&format!("extern \"C\" long {f}(long d, long x);\n"));
    }
    s.push('\n');
    for i in 0..n {
        s.push_str(&function_source(
            i,
            &bodies[i],
            tail[i],
            late_count[i],
            last,
        ));
    }
    s.push_str(&format!(
        "static void on_usr1(int) {{ gen_f{last}(0, 3); }}\n\n\
         static long drive(long id) {{\n\
         \x20   long acc = 0;\n\
         \x20   for (long it = 0; it < {iterations}; it++) {{\n"
    ));
    for r in &roots {
        s.push_str(&format!("        acc += gen_f{r}({depth}, it + id);\n"));
    }
    s.push_str(
        "    }\n    return acc;\n}\n\n\
         static long results[8];\n\
         static void *worker(void *arg) {\n\
         \x20   long id = (long)arg;\n\
         \x20   in_worker = true;\n\
         \x20   results[id] = drive(id);\n\
         \x20   return nullptr;\n}\n\n\
         int main() {\n\
         \x20   struct sigaction sa;\n\
         \x20   memset(&sa, 0, sizeof sa);\n\
         \x20   sa.sa_handler = on_usr1;\n\
         \x20   sigaction(SIGUSR1, &sa, nullptr);\n\
         \x20   long acc = 0;\n",
    );
    if fork {
        // The child runs the same functions; its calls are not the program's.
        s.push_str(
            "    pid_t child = fork();\n\
             \x20   if (child == 0) {\n\
             \x20       long a = drive(100);\n\
             \x20       _exit((int)(a & 1));\n\
             \x20   }\n",
        );
    }
    if vfork {
        s.push_str(
            "    pid_t vchild = vfork();\n\
             \x20   if (vchild == 0) {\n\
             \x20       execl(\"/bin/true\", \"true\", (char *)nullptr);\n\
             \x20       _exit(127);\n\
             \x20   }\n\
             \x20   int vstatus = 0;\n\
             \x20   waitpid(vchild, &vstatus, 0);\n\
             \x20   printf(\"vfork child %d\\n\", vstatus);\n",
        );
    }
    s.push_str(&format!(
        "    pthread_t t[8];\n\
         \x20   for (long i = 0; i < {threads}; i++) pthread_create(&t[i], nullptr, worker, (void *)(i + 1));\n"
    ));
    if main_runs {
        s.push_str("    acc += drive(0);\n");
    }
    s.push_str(&format!(
        "    for (long i = 0; i < {threads}; i++) {{ pthread_join(t[i], nullptr); acc += results[i + 1]; }}\n"
    ));
    if fork {
        s.push_str(
            "    int status = 0;\n\
             \x20   waitpid(child, &status, 0);\n\
             \x20   printf(\"fork child %d\\n\", status);\n",
        );
    }
    s.push_str(
        "    printf(\"acc=%ld\\n\", acc);\n\
         \x20   for (int i = 0; i < N; i++)\n\
         \x20       printf(\"count gen_f%d outer=%ld total=%ld\\n\", i, outer_[i].load(), total_[i].load());\n\
         \x20   return 0;\n}\n",
    );
    let shape = format!(
        "{n} functions, {threads} threads{}, depth {depth}, {iterations} rounds{}{}{}{}{}{}, {}",
        if main_runs { " and main" } else { "" },
        if signals { ", signals" } else { "" },
        if jumps { ", longjmp" } else { "" },
        if throws { ", exceptions" } else { "" },
        if fork { ", fork" } else { "" },
        if exits { ", pthread_exit" } else { "" },
        if vfork { ", vfork" } else { "" },
        flags.join(" ")
    );
    let tail_calls = tail
        .iter()
        .enumerate()
        .filter_map(|(i, t)| Some((i, (*t)?)))
        .collect();
    Program {
        seed,
        tail_calls,
        source: s,
        flags,
        functions,
        shape,
    }
}

/// The most calls one run of a generated program makes, roughly (fewer where a longjmp or an
/// exception cuts a call short).
pub const CALL_BUDGET: u64 = 20_000;

/// How many calls `gen_f{i}(d, …)` makes at most, itself included.
fn call_bound(
    i: usize,
    d: u64,
    bodies: &[Vec<Step>],
    tail: &[Option<usize>],
    last: usize,
    memo: &mut Vec<Vec<Option<u64>>>,
) -> u64 {
    if let Some(v) = memo[i][d as usize] {
        return v;
    }
    let mut total = 1u64;
    let mut add = |n: u64| total = total.saturating_add(n);
    for step in &bodies[i] {
        match *step {
            Step::Call(j) | Step::CatchJump(j) | Step::CatchThrow(j) => {
                add(call_bound(j, d, bodies, tail, last, memo))
            }
            Step::Recurse if d > 0 => add(call_bound(i, d - 1, bodies, tail, last, memo)),
            Step::Back(j) if d > 0 => add(call_bound(j, d - 1, bodies, tail, last, memo)),
            Step::Raise => add(call_bound(last, 0, bodies, tail, last, memo)),
            _ => {}
        }
    }
    if let Some(j) = tail[i] {
        add(call_bound(j, d, bodies, tail, last, memo));
    }
    memo[i][d as usize] = Some(total);
    total
}

/// Fisher–Yates.
fn shuffle<T>(rng: &mut Rng, v: &mut [T]) {
    for i in (1..v.len()).rev() {
        let j = rng.range(0, i as u64) as usize;
        v.swap(i, j);
    }
}

/// The source of function `i`: its counter first (or after a little arithmetic), its steps,
/// and its end (a return, or a tail call to `tail`).
fn function_source(
    i: usize,
    body: &[Step],
    tail: Option<usize>,
    late_count: bool,
    last: usize,
) -> String {
    let mut s = format!("extern \"C\" __attribute__((noipa)) long gen_f{i}(long d, long x) {{\n");
    // `r` is volatile where a longjmp may land: it changes between setjmp and the landing.
    let jumps = body.iter().any(|s| matches!(s, Step::CatchJump(_)));
    let ty = if jumps {
        "volatile unsigned long"
    } else {
        "unsigned long"
    };
    if late_count {
        s.push_str(&format!(
            "    {ty} r = x * {} + d;\n    ENTER({i});\n",
            i + 3
        ));
    } else {
        s.push_str(&format!(
            "    ENTER({i});\n    {ty} r = x * {} + d;\n",
            i + 3
        ));
    }
    for step in body {
        let line = match step {
            Step::Call(j) => format!("    r += gen_f{j}(d, (r & 7) + {j});\n"),
            Step::Recurse => format!("    if (d > 0) r += gen_f{i}(d - 1, r & 15);\n    r ^= 5;\n"),
            Step::Back(j) => format!("    if (d > 0) r += gen_f{j}(d - 1, r & 15);\n"),
            Step::Loop => {
                "    for (long k = 0; k < (x & 15); k++) r = (k & 1) ? r * 3 + k : r - (k ^ x);\n"
                    .to_owned()
            }
            Step::Raise => "    raise(SIGUSR1);\n".to_owned(),
            Step::CatchJump(j) => format!(
                "    {{\n\
                 \x20       std::jmp_buf jb;\n\
                 \x20       std::jmp_buf *prev = jump_to;\n\
                 \x20       int prev_catching = catching;\n\
                 \x20       int saved[N];\n\
                 \x20       memcpy(saved, depth_, sizeof saved);\n\
                 \x20       if (setjmp(jb) == 0) {{\n\
                 \x20           jump_to = &jb;\n\
                 \x20           r += gen_f{j}(d, r & 15);\n\
                 \x20       }} else {{\n\
                 \x20           memcpy(depth_, saved, sizeof saved);\n\
                 \x20           r += 1000;\n\
                 \x20       }}\n\
                 \x20       jump_to = prev;\n\
                 \x20       catching = prev_catching;\n\
                 \x20   }}\n"
            ),
            Step::CatchThrow(j) => format!(
                "    {{\n\
                 \x20       int saved[N];\n\
                 \x20       memcpy(saved, depth_, sizeof saved);\n\
                 \x20       int prev = catching;\n\
                 \x20       std::jmp_buf *prev_jump = jump_to;\n\
                 \x20       catching = prev + 1;\n\
                 \x20       try {{\n\
                 \x20           r += gen_f{j}(d, r & 15);\n\
                 \x20       }} catch (int e) {{\n\
                 \x20           memcpy(depth_, saved, sizeof saved);\n\
                 \x20           r += e;\n\
                 \x20       }}\n\
                 \x20       catching = prev;\n\
                 \x20       jump_to = prev_jump;\n\
                 \x20   }}\n"
            ),
            Step::Jump => "    if (jump_to && (x & 1)) std::longjmp(*jump_to, 1);\n".to_owned(),
            Step::Throw => "    if (catching > 0 && (x & 1)) throw 2000;\n".to_owned(),
            Step::ExitThread => {
                "    if (in_worker && x % 13 == 5) pthread_exit(nullptr);\n".to_owned()
            }
        };
        s.push_str(&line);
    }
    let _ = last;
    match tail {
        // Whether the compiler makes the tail call a jump (the call then ends there) or a call
        // (it ends when the callee returns) the program cannot know; the harness reads the
        // code and defines CALL_TAIL_I where it is a call.
        Some(j) => s.push_str(&format!(
            "#ifdef CALL_TAIL_{i}\n\
             \x20   {{ unsigned long t = gen_f{j}(d, r); LEAVE({i}); return t; }}\n\
             #else\n\
             \x20   LEAVE({i});\n\
             \x20   return gen_f{j}(d, r);\n\
             #endif\n}}\n\n"
        )),
        None => s.push_str(&format!("    LEAVE({i});\n    return r;\n}}\n\n")),
    }
    s
}

/// The functions i of `tails` (i, j) whose code, as `objdump` (an objdump of the program's
/// architecture) shows it, has no jump to `gen_fJ`: the compiler made their tail call a call,
/// and the program must be built again with `-DCALL_TAIL_I` for each.
pub fn tail_calls_made_calls(
    objdump: &str,
    exe: &std::path::Path,
    tails: &[(usize, usize)],
) -> Vec<usize> {
    let out = std::process::Command::new(objdump)
        .args(["-d", "--no-show-raw-insn"])
        .arg(exe)
        .output()
        .unwrap_or_else(|e| panic!("{objdump}: {e}"));
    let text = String::from_utf8_lossy(&out.stdout);
    let mut made_calls = Vec::new();
    for &(i, j) in tails {
        let head = format!("<gen_f{i}>:");
        let body = text
            .split_once(&head)
            .map(|(_, rest)| rest.split("\n\n").next().unwrap_or(""))
            .unwrap_or("");
        let target = format!("<gen_f{j}>");
        // x86_64's jmp, AArch64's b.
        let jumps = body.lines().any(|l| {
            let mnemonic = l.split('\t').nth(1).unwrap_or("").split_whitespace().next();
            l.contains(&target) && matches!(mnemonic, Some("jmp" | "b"))
        });
        if !jumps {
            made_calls.push(i);
        }
    }
    made_calls
}

/// A generated program's own counts, from its output: function -> (outer, total).
pub fn parse_counts(stdout: &str) -> std::collections::BTreeMap<String, (u64, u64)> {
    let mut out = std::collections::BTreeMap::new();
    for l in stdout.lines() {
        let Some(rest) = l.strip_prefix("count ") else {
            continue;
        };
        let mut w = rest.split_whitespace();
        let (Some(name), Some(outer), Some(total)) = (w.next(), w.next(), w.next()) else {
            continue;
        };
        let num = |s: &str, key: &str| s.strip_prefix(key).and_then(|v| v.parse::<u64>().ok());
        if let (Some(o), Some(t)) = (num(outer, "outer="), num(total, "total=")) {
            out.insert(name.to_owned(), (o, t));
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_seed_always_gives_the_same_program() {
        for seed in 0..50 {
            assert_eq!(generate(seed).source, generate(seed).source);
        }
        assert_ne!(generate(1).source, generate(2).source);
    }

    #[test]
    fn calls_go_deeper_and_recursion_is_bounded() {
        for seed in 0..500 {
            let p = generate(seed);
            let n = p.functions.len();
            assert!((4..=7).contains(&n));
            // The handler's function is a leaf: no call, no raise, no jump.
            let leaf = p
                .source
                .split(&format!("long gen_f{}(long d, long x) {{", n - 1))
                .nth(1)
                .unwrap();
            let leaf = &leaf[..leaf.find("\n}\n").unwrap()];
            for bad in ["gen_f", "raise", "longjmp", "throw"] {
                assert!(!leaf.contains(bad), "seed {seed}: {leaf}");
            }
        }
    }

    #[test]
    fn every_kind_turns_up_over_a_hundred_seeds() {
        let all: String = (0..100).map(|s| generate(s).source).collect();
        for kind in [
            "raise(SIGUSR1)",
            "std::longjmp",
            "throw 2000",
            "vfork()",
            "fork()",
            "pthread_create",
            "return gen_f",
            "gen_f1(d - 1",
            "pthread_exit",
        ] {
            assert!(all.contains(kind), "{kind}");
        }
    }

    #[test]
    fn counts_are_read_back() {
        let c = parse_counts(
            "acc=3\ncount gen_f0 outer=4 total=9\nnoise\ncount gen_f1 outer=x total=1\n",
        );
        assert_eq!(c.len(), 1);
        assert_eq!(c["gen_f0"], (4, 9));
    }
}
