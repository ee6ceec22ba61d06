//! Kernel symbol resolution from /proc/kallsyms (through aya), read once per run.
use std::collections::BTreeMap;

/// Kernel symbols by start address.
pub struct KernelSymbols {
    by_addr: BTreeMap<u64, String>,
}

impl KernelSymbols {
    /// Reads /proc/kallsyms. Addresses read as 0 (kptr_restrict) make every lookup fail, which
    /// is reported rather than hidden: frames then print as hex.
    pub fn load() -> std::io::Result<Self> {
        Ok(Self {
            by_addr: aya::util::kernel_symbols()?,
        })
    }

    /// Whether any symbol has a real address.
    pub fn usable(&self) -> bool {
        self.by_addr.keys().next_back().is_some_and(|a| *a != 0)
    }

    /// The function containing `addr`, or the address in hex.
    pub fn resolve(&self, addr: u64) -> String {
        match self.by_addr.range(..=addr).next_back() {
            Some((_, name)) if self.usable() => name.clone(),
            _ => format!("0x{addr:x}"),
        }
    }
}
