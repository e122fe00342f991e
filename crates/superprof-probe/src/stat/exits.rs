//! Where a function leaves (its returns, its jumps out, its cold parts), the code of the
//! process's files it is read from, and a stopped thread's return address.

use super::*;

/// An exit of a function: its address, the code range it lies in (the function or one of its
/// parts), and whether it is a return (else a tail call).
pub(super) type FunctionExit = (u64, (u64, u64), bool);

/// Where the function that starts at `at` in process `pid` leaves: its returns, its jumps out
/// of itself to other functions (tail calls) and through memory (`jmp *slot(%rip)`), from its
/// code (its size from the symbol table); and those of its parts placed elsewhere (gcc's
/// `f.cold`, with a symbol of that name or none), which it jumps to. Each exit with the code
/// range it lies in, and whether it is a return (else a tail call). None when that cannot be
/// told.
pub(super) fn function_exits(
    tracer: &Tracer,
    pid: u32,
    at: u64,
    codes: &mut HashMap<std::path::PathBuf, Option<superprof_analyze::ElfCode>>,
) -> Option<Vec<FunctionExit>> {
    use superprof_analyze::Flow;
    let f = superprof_symbols::function_at(pid, at).ok()??;
    let end = at.checked_add(f.size)?;
    let read = |lo: u64, hi: u64| -> Option<Vec<u8>> {
        let size = usize::try_from(hi.checked_sub(lo)?)
            .ok()
            .filter(|&s| s > 0 && s <= 1 << 20)?;
        let mut code = vec![0u8; size];
        (tracer.read_code(pid, lo, &mut code) == size).then_some(code)
    };
    // A jump out of the function: to another function's start (a tail call), or to a part of
    // this one (a symbol named after it, or code no symbol starts).
    // (A PLT stub is another function's: a jump there is a tail call.)
    let in_plt = |codes: &mut HashMap<std::path::PathBuf, Option<superprof_analyze::ElfCode>>,
                  target: u64| {
        code_at(codes, pid, target).is_ok_and(|(c, bias)| c.in_plt(target.wrapping_sub(bias)))
    };
    let part_of_it = |target: u64| match superprof_symbols::function_at(pid, target).ok().flatten()
    {
        Some(g) => {
            g.name.starts_with(&format!("{}.", f.name))
                || g.name.starts_with(&format!("{} [clone .", f.name))
                || g.name.contains("[clone .cold")
        }
        None => true,
    };
    let mut exits = Vec::new();
    // (part start, part end): the function, then its parts as found.
    let mut parts: Vec<(u64, u64)> = vec![(at, end)];
    let mut k = 0;
    while k < parts.len() && k < 16 {
        let (lo, hi) = parts[k];
        k += 1;
        let Some(code) = read(lo, hi) else {
            continue;
        };
        for i in superprof_analyze::decode_all(&code, lo) {
            let inside = |t: u64| parts.iter().any(|&(a, b)| (a..b).contains(&t));
            match i.flow {
                Flow::Return => exits.push((i.addr, (lo, hi), true)),
                Flow::IndirectJump => {
                    let off = (i.addr - lo) as usize;
                    if <crate::inprocess::patch::Host as crate::inprocess::patch::Patcher>::jumps_through_slot(&code[off..], i.addr) {
                        exits.push((i.addr, (lo, hi), false));
                    }
                }
                Flow::Jump { target } | Flow::Conditional { target } if !inside(target) => {
                    if !in_plt(codes, target) && part_of_it(target) {
                        // Its range: the symbol's, else up to the next function's start.
                        let part_end =
                            match superprof_symbols::function_at(pid, target).ok().flatten() {
                                Some(g) if g.size > 0 => target.checked_add(g.size)?,
                                _ => next_function_start(codes, pid, target)
                                    .unwrap_or(target + 4096)
                                    .min(target + (1 << 16)),
                            };
                        if !parts.iter().any(|&(a, _)| a == target) {
                            parts.push((target, part_end));
                        }
                    } else if matches!(i.flow, Flow::Jump { .. }) {
                        exits.push((i.addr, (lo, hi), false));
                    }
                }
                _ => {}
            }
        }
    }
    // One exit once, whatever part found it: parts found from different jumps may overlap
    // (a cold part without a symbol runs to the next function, and a jump into its middle
    // starts another; Debian's python3.11 PyFloat_FromDouble), and a second probe there would
    // find the first's bytes.
    exits.sort_unstable();
    exits.dedup_by_key(|(x, _, _)| *x);
    (!exits.is_empty()).then_some(exits)
}

/// The code of the file that holds runtime address `addr` of `pid` (opened once per file and
/// kept in `codes`), and its load bias.
pub(super) fn code_at(
    codes: &mut HashMap<std::path::PathBuf, Option<superprof_analyze::ElfCode>>,
    pid: u32,
    addr: u64,
) -> Result<(&superprof_analyze::ElfCode, u64), String> {
    let file = crate::blocks::file_at(pid, addr).ok_or(
        "it is not in the executable code of any file the program maps (data, or no code)",
    )?;
    let code = codes
        .entry(file.path.clone())
        .or_insert_with(|| superprof_analyze::ElfCode::open(&file.open_path))
        .as_ref()
        .ok_or("cannot read its file")?;
    Ok((code, file.bias))
}

/// The start of the first function after `addr` in the file that holds it (runtime address).
pub(super) fn next_function_start(
    codes: &mut HashMap<std::path::PathBuf, Option<superprof_analyze::ElfCode>>,
    pid: u32,
    addr: u64,
) -> Option<u64> {
    let (code, bias) = code_at(codes, pid, addr).ok()?;
    let a = addr.wrapping_sub(bias);
    let i = code.functions.partition_point(|f| f.addr <= a);
    Some(code.functions.get(i)?.addr.wrapping_add(bias))
}

/// Whether a thread whose stack pointer is `sp` has returned from the call entered with `entry`
/// (the callee's stack popped: above it on x86_64, where the call pushed the return address;
/// at or above it on AArch64, where the return address is in a register).
pub(super) fn popped(sp: u64, entry: u64) -> bool {
    if cfg!(target_arch = "aarch64") {
        sp >= entry
    } else {
        sp > entry
    }
}

/// The return address of a thread stopped at a function's first instruction.
pub(super) fn return_address(tracer: &Tracer, pid: u32, regs: &superprof_unwind::UserRegs) -> u64 {
    if cfg!(target_arch = "aarch64") {
        return regs.lr;
    }
    let mut buf = [0u8; 8];
    if tracer.read_memory(pid, regs.sp, &mut buf) == 8 {
        u64::from_ne_bytes(buf)
    } else {
        0
    }
}

/// Runtime [start, end) ranges of the copies of function `name` inlined in the main executable
/// and in `module` (where the function itself is).
pub(super) fn inlined_sites(
    symbolizer: &mut superprof_symbols::Symbolizer,
    pid: u32,
    name: &str,
    module: Option<&std::path::PathBuf>,
) -> Vec<(u64, u64)> {
    let exe = std::fs::read_link(format!("/proc/{pid}/exe")).ok();
    let mut out = Vec::new();
    for file in superprof_symbols::mapped_files(pid).unwrap_or_default() {
        if Some(&file.path) != exe.as_ref() && Some(&file.path) != module {
            continue;
        }
        for (a, b) in symbolizer.inlined_sites(&file.path, &file.open_path, name) {
            out.push((a + file.bias, b + file.bias));
        }
    }
    out
}
