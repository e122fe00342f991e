//! The learning analyzer: it learns which encodings are branches by watching single steps.
//!
//! Each single-stepped instruction is an observation: its encoding key (opcode bits, see
//! `Keys::encoding_key`) and whether the pc went straight on or somewhere else. Keys seen
//! going elsewhere are branches; two branch keys are generalized into one pattern (value and
//! mask: the bits they share) when the pattern keeps enough of the opcode and covers no opcode
//! seen only going straight on. A key is predicted straight once its opcode has gone straight
//! on often enough with no branch seen for it. Anything else is unknown, and is stepped.
//!
//! Its limit is that of learning: a conditional branch never seen taken looks like a straight
//! instruction. On x86_64 the length decoder gives instruction lengths (that is not control
//! flow); on AArch64 every instruction is 4 bytes and nothing is decoded. An optional
//! [`Decode`] checks each prediction, for the report.

use std::collections::{HashMap, HashSet};

use crate::analyzer::{CodeWindow, ReadCode};
use crate::{Analyzer, AnalyzerStats, Arch, BlockEnd, Decode, Isa, Keys, Probed};

/// An instruction's exact bytes (its length, then up to 15 bytes): the lab's verdicts are
/// kept per encoding, which behaves the same at every address.
type Bytes = (u8, [u8; 15]);

fn bytes_of(code: &[u8], len: u32) -> Bytes {
    let n = (len as usize).min(15).min(code.len());
    let mut b = [0u8; 15];
    b[..n].copy_from_slice(&code[..n]);
    (n as u8, b)
}

/// Distinct addresses where an opcode must have gone straight on before it is predicted
/// straight: a conditional branch not taken yet looks straight at its one address, while
/// ordinary instructions of the same opcode are all over the code. (Executions at one address
/// are no evidence: a guard taken once in a thousand calls went straight on 999 times.)
const CONFIDENT: usize = 4;

/// Straight-on observations of a head or key.
#[derive(Debug, Clone, Default)]
struct Straight {
    /// Up to [`CONFIDENT`] distinct addresses.
    addrs: Vec<u64>,
    /// Executions seen going straight on, anywhere.
    times: u32,
}

impl Straight {
    fn confident(&self) -> bool {
        self.addrs.len() >= CONFIDENT
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Pattern {
    value: u32,
    mask: u32,
}

impl Pattern {
    fn covers(&self, key: u32) -> bool {
        key & self.mask == self.value
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Prediction {
    Branch,
    Straight,
    Unknown,
}

/// The learning analyzer (see the module's notes): it predicts block ends from a table of
/// encodings learned from single steps, and asks for a step where it cannot tell.
pub struct Learn {
    arch: Arch,
    /// Keys seen sending the pc elsewhere.
    branched: HashSet<u32>,
    /// Generalized branch encodings.
    patterns: Vec<Pattern>,
    /// Heads (opcode parts of keys) of the branch keys.
    branch_heads: HashSet<u32>,
    /// x86_64: rows of the opcode map (map and high nibble) that are all branches: two
    /// opcodes of the row branched, and none of the others is known to go straight on.
    branch_rows: HashSet<u32>,
    /// Addresses (up to [`CONFIDENT`]) where each head and each exact key went straight on.
    straight_heads: HashMap<u32, Straight>,
    straight_keys: HashMap<u32, Straight>,
    /// x86_64: rows of the opcode map where some opcode branched, and per row how many of its
    /// opcodes went straight on with confidence.
    rows_with_branch: HashSet<u32>,
    row_straight_heads: HashMap<u32, u32>,
    /// Addresses observed so far (up to [`SEEN_MAX`]): only an instruction at an address new
    /// to it tells how well the table knows code it has not seen.
    seen: HashSet<u64>,
    /// Observations in a row at addresses seen before: training that only goes round the
    /// same code (a loop outside the regions) has nothing left to teach.
    stale: u64,
    /// The per-address table: instructions seen sending the pc elsewhere, whatever their
    /// encoding's key predicts (a block ends there from then on).
    branch_addrs: HashSet<u64>,
    /// Observations in the current window, and how many of them were new to the table (an
    /// opcode never seen, or a branch it did not predict).
    window_observations: u64,
    window_new: u64,
    /// Whether the last whole window was predicted well enough ([`SETTLED_SHARE`]).
    settled: bool,
    window: CodeWindow,
    check: Option<Decode>,
    stats: AnalyzerStats,
    /// Whether the caller runs instructions in a lab ([`Probed`]): then only the lab's
    /// verdicts and executions make an instruction straight, never a pattern.
    lab: bool,
    /// The lab's verdict per encoding.
    probed: HashMap<Bytes, Probed>,
    /// Encodings that touch memory (no verdict from the lab) seen going straight on in the
    /// program.
    ran_straight: HashSet<Bytes>,
}

/// The knowledge suffices (no more training outside the regions) once, over a window of this
/// many observations, the table could predict all but one in [`SETTLED_SHARE`] of them.
const SETTLED_WINDOW: u64 = 4000;
/// At most one observation in this many new to the table, over a window.
const SETTLED_SHARE: u64 = 200;
/// Opcodes of a row of the x86 opcode map, straight on with confidence and none branching,
/// before its other opcodes are predicted straight too.
const ROW_STRAIGHT: u32 = 3;
/// Straight-on executions of an opcode (at any number of places) that make it straight once
/// training has settled, in a row of the opcode map where nothing ever branched.
const SETTLED_TIMES: u32 = 16;
/// Addresses remembered for the settling window.
const SEEN_MAX: usize = 1 << 20;

impl Learn {
    /// An empty table. With `check`, every prediction is compared with the decoder's.
    pub fn new(arch: Arch, check: bool) -> Learn {
        Learn {
            arch,
            branched: HashSet::new(),
            patterns: Vec::new(),
            branch_heads: HashSet::new(),
            branch_rows: HashSet::new(),
            straight_heads: HashMap::new(),
            straight_keys: HashMap::new(),
            branch_addrs: HashSet::new(),
            rows_with_branch: HashSet::new(),
            row_straight_heads: HashMap::new(),
            seen: HashSet::new(),
            stale: 0,
            window_observations: 0,
            window_new: 0,
            settled: false,
            window: CodeWindow::new(),
            check: check.then(|| Decode::new(arch)),
            stats: AnalyzerStats {
                predictions_right: check.then_some(0),
                ..AnalyzerStats::default()
            },
            lab: false,
            probed: HashMap::new(),
            ran_straight: HashSet::new(),
        }
    }

    /// The prediction for the instruction at `addr` with bytes `code`, key `key`.
    fn predict_at(&self, code: &[u8], addr: u64, key: u32, len: u32) -> Prediction {
        if self.branch_addrs.contains(&addr) {
            return Prediction::Branch;
        }
        if !self.lab {
            return self.predict(key);
        }
        let bytes = bytes_of(code, len);
        match self.probed.get(&bytes) {
            Some(Probed::Branch | Probed::Syscall) => Prediction::Branch,
            Some(Probed::Straight) => Prediction::Straight,
            Some(Probed::TouchesMemory) if self.ran_straight.contains(&bytes) => {
                Prediction::Straight
            }
            Some(Probed::TouchesMemory) | None => Prediction::Unknown,
        }
    }

    fn head(&self, key: u32) -> u32 {
        key >> self.arch.key_head_shift()
    }

    /// Head bits a pattern must keep fixed, so that it stays one family of opcodes: on
    /// x86_64 the map and the opcode's high nibble (a row of the opcode map) and one more
    /// bit; on AArch64 the top six bits of the word.
    fn family_ok(&self, mask: u32) -> bool {
        let head = mask >> self.arch.key_head_shift();
        match self.arch {
            Arch::X86_64 => head & 0x3f0 == 0x3f0 && head.count_ones() >= 7,
            Arch::Aarch64 => head & 0xfc == 0xfc,
        }
    }

    fn predict(&self, key: u32) -> Prediction {
        if self.branched.contains(&key) {
            return Prediction::Branch;
        }
        // An opcode with branch and non-branch forms (x86 FF: inc, call, jmp, push): a form
        // seen going straight on with confidence is straight, whatever a pattern says.
        let head = self.head(key);
        let row = self.arch == Arch::X86_64 && self.branch_rows.contains(&(head >> 4));
        if !row
            && self.branch_heads.contains(&head)
            && self
                .straight_keys
                .get(&key)
                .is_some_and(Straight::confident)
        {
            return Prediction::Straight;
        }
        if self.patterns.iter().any(|p| p.covers(key)) {
            return Prediction::Branch;
        }
        if self.arch == Arch::X86_64 && self.branch_rows.contains(&(self.head(key) >> 4)) {
            return Prediction::Branch;
        }
        let head = self.head(key);
        let straight = if self.branch_heads.contains(&head) {
            self.straight_keys.get(&key)
        } else {
            self.straight_heads.get(&head)
        };
        if straight.is_some_and(Straight::confident) {
            return Prediction::Straight;
        }
        // x86_64: an opcode seen at fewer places, in a row of the opcode map where no opcode
        // ever branched and at least ROW_STRAIGHT opcodes went straight on with confidence
        // (the vector instructions of a loop: pxor, paddd... each at one or two places).
        let row = head >> 4;
        if self.arch == Arch::X86_64
            && !self.branch_heads.contains(&head)
            && !self.rows_with_branch.contains(&row)
        {
            // Or, once training has settled (the branch rows are known by then), an opcode
            // of a row where nothing ever branched that went straight on often, wherever.
            let times = self.straight_heads.get(&head).map_or(0, |s| s.times);
            if self.row_straight_heads.get(&row).copied().unwrap_or(0) >= ROW_STRAIGHT
                || (self.settled() && times >= SETTLED_TIMES)
            {
                return Prediction::Straight;
            }
        }
        Prediction::Unknown
    }

    /// x86_64: whether the row of the opcode map that holds `head` is all branches: at least
    /// two of its opcodes branched, and more of them than went straight on with confidence
    /// and never branched (so one conditional branch not taken at a few places does not keep
    /// its row of conditional branches from being learned).
    fn refresh_row(&mut self, head: u32) {
        if self.arch != Arch::X86_64 {
            return;
        }
        let row = head >> 4;
        let branched = self.branch_heads.iter().filter(|&&h| h >> 4 == row).count();
        let straight = self
            .straight_heads
            .iter()
            .filter(|(&h, seen)| {
                h >> 4 == row && seen.confident() && !self.branch_heads.contains(&h)
            })
            .count();
        if branched >= 2 && branched > straight {
            self.branch_rows.insert(row);
        } else {
            self.branch_rows.remove(&row);
        }
    }

    /// Whether the table has stopped changing: training on code outside the regions is no
    /// longer worth its single steps.
    pub fn settled(&self) -> bool {
        self.settled || self.stale >= SETTLED_WINDOW
    }

    /// Adds a branch key to the table, merged into the pattern it generalizes best.
    fn learn_branch(&mut self, key: u32) {
        if !self.branched.insert(key) {
            return;
        }
        let head = self.head(key);
        self.branch_heads.insert(head);
        self.rows_with_branch.insert(head >> 4);
        self.refresh_row(head);
        if self.patterns.iter().any(|p| p.covers(key)) {
            return;
        }
        let shift = self.arch.key_head_shift();
        let head_mask = u32::MAX << shift;
        let mut best: Option<(usize, Pattern)> = None;
        for (i, p) in self.patterns.iter().enumerate() {
            let mask = p.mask & !(p.value ^ key);
            let merged = Pattern {
                value: key & mask,
                mask,
            };
            if !self.family_ok(mask) {
                continue;
            }
            // It must not cover an opcode seen only going straight on.
            let covers_straight = self.straight_heads.keys().any(|&h| {
                !self.branch_heads.contains(&h)
                    && (h << shift) & mask & head_mask == merged.value & head_mask
            }) || self.straight_keys.iter().any(|(&k, seen)| {
                seen.confident() && !self.branched.contains(&k) && merged.covers(k)
            });
            if covers_straight {
                continue;
            }
            if best.is_none_or(|(_, b)| mask.count_ones() > b.mask.count_ones()) {
                best = Some((i, merged));
            }
        }
        match best {
            Some((i, merged)) => self.patterns[i] = merged,
            None => self.patterns.push(Pattern {
                value: key,
                mask: u32::MAX,
            }),
        }
    }
}

impl Analyzer for Learn {
    fn name(&self) -> &'static str {
        "learn"
    }

    fn block_end(&mut self, pc: u64, limit: u64, read: &mut ReadCode) -> BlockEnd {
        let mut at = pc;
        let mut n = 0u32;
        let max = self.arch.max_insn_len();
        let result = loop {
            if at >= limit {
                break BlockEnd::Open {
                    end: at,
                    instructions: n,
                };
            }
            let window = self.window.at(at, max, limit, read);
            let mut code = [0u8; 16];
            code[..window.len().min(16)].copy_from_slice(&window[..window.len().min(16)]);
            let code = &code[..window.len().min(16)];
            let Some((key, len)) = self.arch.encoding_key(code, at) else {
                break BlockEnd::Open {
                    end: at,
                    instructions: n,
                };
            };
            match self.predict_at(code, at, key, len) {
                Prediction::Unknown => return BlockEnd::Unknown { addr: at },
                Prediction::Straight => {
                    n += 1;
                    at += len as u64;
                }
                Prediction::Branch => {
                    break BlockEnd::Last {
                        addr: at,
                        len,
                        instructions: n + 1,
                    }
                }
            }
        };
        self.stats.predictions += 1;
        if let Some(check) = &mut self.check {
            if check.block_end(pc, limit, read) == result {
                *self.stats.predictions_right.get_or_insert(0) += 1;
            }
        }
        result
    }

    fn observe(&mut self, addr: u64, code: &[u8], next: u64) {
        let Some((key, len)) = self.arch.encoding_key(code, addr) else {
            return;
        };
        let before = self.predict_at(code, addr, key, len);
        let straight = next == addr + len as u64;
        if straight && self.lab {
            let bytes = bytes_of(code, len);
            if self.probed.get(&bytes) == Some(&Probed::TouchesMemory) {
                self.ran_straight.insert(bytes);
            }
        }
        // New to the table: an opcode never seen, or a branch it did not predict (a branch
        // going straight on is a conditional one not taken; a known opcode going straight on
        // where the table could not tell yet only adds to its evidence).
        let head = self.head(key);
        // The window counts instructions at addresses new to it only: stepping the same loop
        // again says nothing of how well the table knows code it has not seen.
        let first_time = self.seen.len() < SEEN_MAX && self.seen.insert(addr);
        self.stale = if first_time { 0 } else { self.stale + 1 };
        if first_time {
            let new_head =
                !self.straight_heads.contains_key(&head) && !self.branch_heads.contains(&head);
            if new_head || (!straight && before != Prediction::Branch) {
                self.window_new += 1;
            }
            self.window_observations += 1;
            if self.window_observations == SETTLED_WINDOW {
                self.settled = self.window_new * SETTLED_SHARE <= SETTLED_WINDOW;
                self.window_observations = 0;
                self.window_new = 0;
            }
        }
        if straight {
            let mut confident_now = false;
            let mut head_confident_now = false;
            for (i, seen) in [
                self.straight_heads.entry(head).or_default(),
                self.straight_keys.entry(key).or_default(),
            ]
            .into_iter()
            .enumerate()
            {
                let was = seen.confident();
                seen.times = seen.times.saturating_add(1);
                if seen.addrs.len() < CONFIDENT && !seen.addrs.contains(&addr) {
                    seen.addrs.push(addr);
                }
                let now = !was && seen.confident();
                confident_now |= now;
                head_confident_now |= now && i == 0;
            }
            if head_confident_now {
                *self.row_straight_heads.entry(head >> 4).or_default() += 1;
            }
            if confident_now {
                self.refresh_row(head);
            }
        } else {
            self.branch_addrs.insert(addr);
            self.learn_branch(key);
        }
    }

    fn ends_block(&self, code: &[u8], addr: u64) -> bool {
        self.arch
            .encoding_key(code, addr)
            .is_some_and(|(key, len)| self.predict_at(code, addr, key, len) == Prediction::Branch)
    }

    fn answers_are_final(&self) -> bool {
        false
    }

    fn wants_training(&self) -> bool {
        !self.lab && !self.settled()
    }

    fn wants_probe(&self, code: &[u8], addr: u64) -> bool {
        self.arch
            .encoding_key(code, addr)
            .is_some_and(|(_, len)| !self.probed.contains_key(&bytes_of(code, len)))
    }

    fn probed(&mut self, code: &[u8], addr: u64, verdict: Probed) {
        let Some((_, len)) = self.arch.encoding_key(code, addr) else {
            return;
        };
        if self.probed.insert(bytes_of(code, len), verdict).is_none() {
            self.stats.probed += 1;
        }
    }

    fn is_syscall(&self, code: &[u8], addr: u64) -> Option<bool> {
        let (_, len) = self.arch.encoding_key(code, addr)?;
        self.lab
            .then(|| self.probed.get(&bytes_of(code, len)))
            .flatten()
            .map(|v| *v == Probed::Syscall)
    }

    /// From now on an instruction is straight only once the lab saw it go straight on under
    /// every condition, or, for one that touches memory (never a conditional branch), once
    /// it went straight on in the program.
    fn use_lab(&mut self) {
        self.lab = true;
    }

    fn stats(&self) -> AnalyzerStats {
        AnalyzerStats {
            table_entries: self.probed.len()
                + self.branched.len()
                + self.patterns.len()
                + self.branch_rows.len()
                + self.straight_heads.len()
                + self.branch_addrs.len(),
            // (With a lab there is nothing to train for.)
            settled: self.lab || self.settled(),
            ..self.stats.clone()
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Observes the x86_64 instruction `code` at `addr`, going straight on or to `to`.
    fn see(l: &mut Learn, code: &[u8], addr: u64, to: Option<u64>) {
        let next = to.unwrap_or(addr + code.len() as u64);
        l.observe(addr, code, next);
    }

    fn predict_at(l: &mut Learn, code: &[u8], addr: u64) -> BlockEnd {
        let mut buf = code.to_vec();
        buf.extend_from_slice(&[0xc3]); // ret after it
        let mut read = |a: u64, out: &mut [u8]| {
            let off = (a - addr) as usize;
            let n = out.len().min(buf.len().saturating_sub(off));
            out[..n].copy_from_slice(&buf[off..off + n]);
            n
        };
        l.block_end(addr, addr + buf.len() as u64, &mut read)
    }

    #[test]
    fn a_row_of_conditional_branches_is_learned_from_two_taken() {
        let mut l = Learn::new(Arch::X86_64, false);
        // je and jne taken somewhere: the row 7x is all branches, jg included.
        see(&mut l, &[0x74, 0x05], 0x1000, Some(0x1007));
        see(&mut l, &[0x75, 0x05], 0x2000, Some(0x2007));
        assert_eq!(
            predict_at(&mut l, &[0x7f, 0x10], 0x3000),
            BlockEnd::Last {
                addr: 0x3000,
                len: 2,
                instructions: 1
            }
        );
        // One more conditional branch not taken at four places does not undo the row: two
        // taken against one straight.
        for a in [0x4000, 0x4100, 0x4200, 0x4300] {
            see(&mut l, &[0x78, 0x05], a, None);
        }
        assert!(l.branch_rows.contains(&0x07));
    }

    #[test]
    fn straight_needs_four_places_and_a_branch_seen_once_ends_blocks_there() {
        let mut l = Learn::new(Arch::X86_64, false);
        // inc eax, executed 1000 times at one address: still unknown (no evidence).
        for _ in 0..1000 {
            see(&mut l, &[0xff, 0xc0], 0x1000, None);
        }
        assert_eq!(
            predict_at(&mut l, &[0xff, 0xc0], 0x5000),
            BlockEnd::Unknown { addr: 0x5000 }
        );
        for a in [0x1100, 0x1200, 0x1300] {
            see(&mut l, &[0xff, 0xc0], a, None);
        }
        // Straight on at four places: predicted straight, the look goes on to the ret
        // after it (never seen: to be stepped).
        assert_eq!(
            predict_at(&mut l, &[0xff, 0xc0], 0x5000),
            BlockEnd::Unknown { addr: 0x5002 }
        );
        // An instruction seen branching once ends a block at its address from then on,
        // whatever its key predicts.
        see(&mut l, &[0x90], 0x6000, Some(0x7000));
        assert!(l.ends_block(&[0x90], 0x6000));
    }

    #[test]
    fn training_stops_when_new_code_holds_nothing_new() {
        let mut l = Learn::new(Arch::X86_64, false);
        assert!(l.wants_training());
        // 4,000 instructions at new addresses, all of a known opcode going straight on.
        for a in 0..4 {
            see(&mut l, &[0x01, 0xc0], 0x100 + a * 0x10, None);
        }
        for a in 0..SETTLED_WINDOW {
            see(&mut l, &[0x01, 0xc0], 0x10_0000 + a * 4, None);
        }
        assert!(!l.wants_training());
        // Or going round the same code.
        let mut l = Learn::new(Arch::X86_64, false);
        for _ in 0..=SETTLED_WINDOW {
            see(&mut l, &[0x01, 0xc0], 0x100, None);
        }
        assert!(!l.wants_training());
    }
}
