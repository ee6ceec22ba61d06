//! Kernel symbol resolution from /proc/kallsyms (through aya), read once per run.
use std::collections::{BTreeMap, HashMap};

/// Kernel symbols by start address, and by name.
pub struct KernelSymbols {
    by_addr: BTreeMap<u64, String>,
    by_name: HashMap<String, Vec<u64>>,
}

impl KernelSymbols {
    /// Reads /proc/kallsyms. Addresses read as 0 (kptr_restrict) make every lookup fail, which
    /// is reported rather than hidden: frames then print as hex.
    pub fn load() -> std::io::Result<Self> {
        // Module symbols read `name\t[module]`: keep the function name only.
        Ok(Self::from_pairs(
            aya::util::kernel_symbols()?
                .into_iter()
                .map(|(a, n)| (a, n.split('\t').next().unwrap_or_default().to_owned()))
                .collect(),
        ))
    }

    /// Symbols from (address, name) pairs.
    pub fn from_pairs(pairs: Vec<(u64, String)>) -> Self {
        let by_addr: BTreeMap<u64, String> = pairs.into_iter().collect();
        let mut by_name: HashMap<String, Vec<u64>> = HashMap::new();
        for (addr, name) in &by_addr {
            by_name.entry(name.clone()).or_default().push(*addr);
        }
        Self { by_addr, by_name }
    }

    /// Whether any symbol has a real address.
    pub fn usable(&self) -> bool {
        self.by_addr.keys().next_back().is_some_and(|a| *a != 0)
    }

    /// Whether a symbol is exactly `name`.
    pub fn has(&self, name: &str) -> bool {
        self.by_name.contains_key(name)
    }

    /// The symbols that are function `name`: itself, or a compiler clone of it
    /// (`name.isra.0`, `name.constprop.0`), each with its addresses (static functions can share
    /// a name across modules).
    pub fn lookup(&self, name: &str) -> Vec<(&str, &[u64])> {
        let mut out: Vec<(&str, &[u64])> = self
            .by_name
            .iter()
            .filter(|(n, _)| *n == name || n.strip_prefix(name).is_some_and(|rest| rest.starts_with('.')))
            .map(|(n, a)| (n.as_str(), a.as_slice()))
            .collect();
        out.sort();
        out
    }

    /// The function containing `addr`, or the address in hex.
    pub fn resolve(&self, addr: u64) -> String {
        match self.by_addr.range(..=addr).next_back() {
            Some((_, name)) if self.usable() => name.clone(),
            _ => format!("0x{addr:x}"),
        }
    }
}
