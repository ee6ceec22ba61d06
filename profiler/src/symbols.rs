//! Kernel symbol resolution from /proc/kallsyms, read once per run. Only text symbols (types
//! `t`/`T`) are kept: a data symbol (e.g. `orc_header` with CONFIG_KALLSYMS_ALL) between two
//! functions must never name a stack frame.
use std::collections::BTreeMap;

use crate::category::{Category, PAGE_CLEAR_FRAME, category_of, function_name};

/// Kernel symbols being read by [`KernelSymbols::load_in_background`].
pub struct Pending(std::thread::JoinHandle<Option<KernelSymbols>>);

impl Pending {
    /// The symbols, once read (None: unreadable).
    pub fn wait(self) -> Option<KernelSymbols> {
        self.0.join().ok().flatten()
    }
}

/// Kernel function symbols by start address, and by name.
pub struct KernelSymbols {
    by_addr: BTreeMap<u64, String>,
    by_name: BTreeMap<String, Vec<u64>>,
}

impl KernelSymbols {
    /// Starts reading /proc/kallsyms on another thread (about 100 ms, half of it the kernel's):
    /// the BPF object loads meanwhile, and a run without probe rows attaches without waiting.
    pub fn load_in_background() -> Pending {
        Pending(std::thread::spawn(|| Self::load().ok()))
    }

    /// Reads /proc/kallsyms. Addresses read as 0 (kptr_restrict) make every lookup fail, which
    /// is reported rather than hidden: frames then print as hex.
    pub fn load() -> std::io::Result<Self> {
        Ok(Self::parse(&std::fs::read_to_string("/proc/kallsyms")?))
    }

    /// Parses kallsyms text (`address type name [module]` lines), keeping text symbols.
    /// Module functions are named `func [module]` in frames, as the kernel prints them.
    pub fn parse(text: &str) -> Self {
        let pairs = text.lines().filter_map(|line| {
            let mut f = line.split_ascii_whitespace();
            let addr = u64::from_str_radix(f.next()?, 16).ok()?;
            let kind = f.next()?;
            let name = f.next()?;
            let name = match f.next() {
                Some(module) => format!("{name} {module}"),
                None => name.to_owned(),
            };
            matches!(kind, "t" | "T").then_some((addr, name))
        });
        Self::from_pairs(pairs.collect())
    }

    /// Symbols from (address, name) pairs; a name may carry its ` [module]`.
    pub fn from_pairs(pairs: Vec<(u64, String)>) -> Self {
        let mut by_name: BTreeMap<String, Vec<u64>> = BTreeMap::new();
        for (addr, name) in &pairs {
            by_name.entry(function_name(name).to_owned()).or_default().push(*addr);
        }
        Self {
            by_addr: pairs.into_iter().collect(),
            by_name,
        }
    }

    /// Whether any symbol has a real address.
    pub fn usable(&self) -> bool {
        self.by_addr.keys().next_back().is_some_and(|a| *a != 0)
    }

    /// Whether a function is exactly `name`.
    pub fn has(&self, name: &str) -> bool {
        self.by_name.contains_key(name)
    }

    /// The symbols that are function `name`: itself, or a compiler clone of it
    /// (`name.isra.0`, `name.constprop.0`), each with its addresses (static functions can share
    /// a name across modules).
    pub fn lookup(&self, name: &str) -> Vec<(&str, &[u64])> {
        // `name` and every `name.<suffix>` sort between `name` and `name/` ('/' follows '.').
        let end = format!("{name}/");
        self.by_name
            .range::<str, _>((std::ops::Bound::Included(name), std::ops::Bound::Excluded(end.as_str())))
            .filter(|(n, _)| *n == name || n.strip_prefix(name).is_some_and(|rest| rest.starts_with('.')))
            .map(|(n, a)| (n.as_str(), a.as_slice()))
            .collect()
    }

    /// The function containing `addr`, or the address in hex.
    pub fn resolve(&self, addr: u64) -> String {
        match self.by_addr.range(..=addr).next_back() {
            Some((_, name)) if self.usable() => name.clone(),
            _ => format!("0x{addr:x}"),
        }
    }
}

/// A sample's kernel frames named, leaf first (`symbols` None: addresses in hex), topped with
/// [`PAGE_CLEAR_FRAME`] where it interrupted a page clear (`page_clear`) in a function that is
/// not itself a zeroing one.
pub fn sample_frames(kernel: &[u64], page_clear: bool, symbols: Option<&KernelSymbols>) -> Vec<String> {
    let names: Vec<String> = kernel
        .iter()
        .map(|ip| symbols.map_or_else(|| format!("0x{ip:x}"), |sy| sy.resolve(*ip)))
        .collect();
    let inline = page_clear
        && names
            .first()
            .is_some_and(|leaf| category_of(leaf) != Some(Category::Zeroing));
    inline
        .then(|| PAGE_CLEAR_FRAME.to_owned())
        .into_iter()
        .chain(names)
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    const KALLSYMS: &str = "\
ffffffff81000000 T _stext
ffffffff81001000 T handle_mm_fault
ffffffff81002000 d orc_header
ffffffff81003000 t pin_user_pages_remote.isra.0
ffffffff81004000 T pin_user_pages_remote
ffffffff81005000 T pin_user_pages_remote_x
ffffffffc0001000 t vfio_pin_pages_remote\t[vfio_iommu_type1]
ffffffffc0002000 r __ksymtab_x\t[vfio_iommu_type1]
";

    #[test]
    fn text_symbols_only_and_module_names_stripped() {
        let s = KernelSymbols::parse(KALLSYMS);
        assert!(s.usable());
        // The data symbol between two functions does not take the frame.
        assert_eq!(s.resolve(0xffffffff81002010), "handle_mm_fault");
        assert_eq!(
            s.resolve(0xffffffffc0001010),
            "vfio_pin_pages_remote [vfio_iommu_type1]"
        );
        assert!(s.has("vfio_pin_pages_remote"));
        assert!(!s.has("orc_header") && !s.has("__ksymtab_x"));
    }

    #[test]
    fn lookup_finds_the_function_and_its_clones_only() {
        let s = KernelSymbols::parse(KALLSYMS);
        let names: Vec<&str> = s.lookup("pin_user_pages_remote").iter().map(|(n, _)| *n).collect();
        assert_eq!(names, ["pin_user_pages_remote", "pin_user_pages_remote.isra.0"]);
        assert!(s.lookup("pin_user_pages").is_empty());
        assert_eq!(s.lookup("vfio_pin_pages_remote")[0].1, [0xffffffffc0001000]);
    }

    #[test]
    fn hidden_addresses_resolve_to_hex() {
        let s = KernelSymbols::parse("0000000000000000 T handle_mm_fault\n");
        assert!(!s.usable());
        assert_eq!(s.resolve(0x10), "0x10");
    }

    #[test]
    fn an_inline_page_clear_tops_the_stack_unless_a_zeroing_function_holds_it() {
        let sy = KernelSymbols::parse(KALLSYMS);
        let named = |store| sample_frames(&[0xffff_ffff_8100_1010, 0xffff_ffff_8100_0010], store, Some(&sy));
        assert_eq!(named(true), [PAGE_CLEAR_FRAME, "handle_mm_fault", "_stext"]);
        assert_eq!(named(false), ["handle_mm_fault", "_stext"]);
        let clear = KernelSymbols::parse("ffffffff81000000 T clear_page_erms\n");
        assert_eq!(
            sample_frames(&[0xffff_ffff_8100_0004], true, Some(&clear)),
            ["clear_page_erms"]
        );
        assert_eq!(
            sample_frames(&[0xffff_ffff_8100_1010], true, None),
            [PAGE_CLEAR_FRAME, "0xffffffff81001010"]
        );
    }
}
