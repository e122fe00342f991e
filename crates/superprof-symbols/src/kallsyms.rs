//! Kernel symbols from /proc/kallsyms.

/// Sorted kernel symbols. Empty (all addresses zero) when kptr_restrict hides them.
pub struct Kallsyms {
    symbols: Vec<(u64, String)>,
}

impl Kallsyms {
    pub fn load() -> Kallsyms {
        let text = std::fs::read_to_string("/proc/kallsyms").unwrap_or_default();
        Self::parse(&text)
    }

    pub fn parse(text: &str) -> Kallsyms {
        let mut symbols: Vec<(u64, String)> = text
            .lines()
            .filter_map(|line| {
                let mut parts = line.split_whitespace();
                let addr = u64::from_str_radix(parts.next()?, 16).ok()?;
                let kind = parts.next()?;
                let name = parts.next()?;
                let text_symbol = matches!(kind, "t" | "T" | "w" | "W");
                (addr != 0 && text_symbol).then(|| (addr, name.to_string()))
            })
            .collect();
        symbols.sort_unstable_by_key(|s| s.0);
        Kallsyms { symbols }
    }

    /// The function that contains `addr`, if kernel symbols are readable.
    pub fn lookup(&self, addr: u64) -> Option<&str> {
        let i = self.symbols.partition_point(|s| s.0 <= addr);
        Some(self.symbols.get(i.checked_sub(1)?)?.1.as_str())
    }
}
