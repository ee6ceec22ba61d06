//! Where time goes: the categories and the one table that maps kernel functions to them.
//!
//! [`CATEGORY_RULES`] is read by everything that names a category: the exact probe rows (a
//! row's category is its function's), the sampled-stack classifier and the flamegraph colours.
//! A sample is classified by its leaf-most kernel frame that the table knows, so a sample in
//! `clear_page_erms` under `handle_mm_fault` under `pin_user_pages_remote` counts as zeroing,
//! not faulting or pinning: the categories are exclusive, like the exact accounting.
use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

/// A class of work a DMA map (or the memory phases around it) spends time on.
#[derive(
    Clone,
    Copy,
    Debug,
    PartialEq,
    Eq,
    PartialOrd,
    Ord,
    Hash,
    Serialize,
    Deserialize,
    strum::EnumIter,
    strum::IntoStaticStr,
    strum::Display,
    strum::EnumString,
)]
#[serde(rename_all = "snake_case")]
#[strum(serialize_all = "snake_case")]
pub enum Category {
    /// Clearing freshly allocated pages.
    Zeroing,
    /// Page-fault handling and page allocation, other than zeroing.
    Faulting,
    /// get_user_pages / pinning.
    Pinning,
    /// IOMMU page-table writes.
    IommuMap,
    /// IOTLB flushes and map syncs.
    IommuFlush,
    /// locked_vm accounting.
    Accounting,
    /// IOVA-to-physical lookups in the IOMMU page table: unmap walks it page by page to find
    /// what to unpin.
    IommuLookup,
    /// Dropping pins (unpin_user_page*, the VFIO/iommufd unpin paths).
    Unpinning,
    /// Unmapping and freeing pages (munmap: zapping PTEs, TLB flush, returning folios).
    Release,
    /// VFIO type1's and iommufd's own work around the pin, map and accounting calls: the
    /// ioctl handlers, the DMA and area objects and their trees, the loops over chunks and
    /// domains.
    Bookkeeping,
    /// User-space execution (no kernel frames in the sample).
    User,
    /// Everything else: syscall entry and exit, ioctl dispatch, kernel code no rule names.
    Other,
}

/// Every category, in report order.
pub const CATEGORIES: &[Category] = &[
    Category::Zeroing,
    Category::Faulting,
    Category::Pinning,
    Category::IommuMap,
    Category::IommuFlush,
    Category::Accounting,
    Category::IommuLookup,
    Category::Unpinning,
    Category::Release,
    Category::Bookkeeping,
    Category::User,
    Category::Other,
];

impl Category {
    /// The name used in reports and JSON.
    pub fn name(self) -> &'static str {
        self.into()
    }

    /// The table column heading.
    pub fn short(self) -> &'static str {
        match self {
            Category::IommuFlush => "iotlb",
            Category::Accounting => "acct",
            Category::IommuLookup => "lookup",
            Category::Unpinning => "unpin",
            Category::Bookkeeping => "bookkeep",
            other => other.name(),
        }
    }

    /// Whether a row of this category runs inside a page fault (a probe hit there costs what
    /// a hit in a fault does).
    pub fn on_fault_path(self) -> bool {
        matches!(self, Category::Zeroing | Category::Faulting)
    }
}

impl Category {
    /// Its colour, in the flamegraphs and the HTML report alike: Paul Tol's "light" scheme
    /// (made for black text on coloured cells, distinguishable with the common colour-vision
    /// deficiencies) plus a light purple, a tan and two greys. The categories that share a
    /// phase get colours far apart (the map phase's six, the unmap phase's five); release's
    /// olive is near unpinning's pear, but release is alone in munmap and close.
    pub fn color(self) -> (u8, u8, u8) {
        match self {
            Category::Zeroing => (0xee, 0x88, 0x66),
            Category::Faulting => (0xee, 0xdd, 0x88),
            Category::Pinning => (0x77, 0xaa, 0xdd),
            Category::IommuMap => (0x44, 0xbb, 0x99),
            Category::IommuFlush => (0xff, 0xaa, 0xbb),
            Category::Accounting => (0xcc, 0x99, 0xcc),
            Category::IommuLookup => (0x99, 0xdd, 0xff),
            Category::Unpinning => (0xbb, 0xcc, 0x33),
            Category::Release => (0xaa, 0xaa, 0x00),
            Category::Bookkeeping => (0xcc, 0xaa, 0x88),
            Category::User => (0xbb, 0xbb, 0xbb),
            Category::Other => (0xdd, 0xdd, 0xdd),
        }
    }

    /// [`Category::color`] as CSS (`#rrggbb`).
    pub fn css_color(self) -> String {
        let (r, g, b) = self.color();
        format!("#{r:02x}{g:02x}{b:02x}")
    }
}

/// The frame a sample gets on top of its stack when it interrupted a `rep stos` storing
/// zeroes up to a page boundary: a page clear the kernel inlined (x86 `clear_pages()` since 6.19 is one instruction
/// in the function that asked for the page, `shmem_get_folio_gfp` for a memfd) has no
/// function of its own to be named by. Brackets, as perf's `[unknown]`: it is not a symbol.
pub const PAGE_CLEAR_FRAME: &str = "[clear_page_inline]";

/// Kernel function patterns and their category. A trailing `*` makes a prefix match. The first
/// matching row wins, so a specific row comes before a prefix row that also matches it; between
/// functions the stack decides (leaf-most known frame wins, then [`CONTEXT_RULES`]).
pub const CATEGORY_RULES: &[(&str, Category)] = &[
    // Zeroing: per-page clears and the huge-page zeroing loop, and zeroes stored inline.
    (PAGE_CLEAR_FRAME, Category::Zeroing),
    ("clear_page*", Category::Zeroing),
    ("clear_huge_page", Category::Zeroing),
    ("folio_zero_user", Category::Zeroing),
    ("clear_subpage", Category::Zeroing),
    ("clear_user_highpage*", Category::Zeroing),
    ("clear_highpage*", Category::Zeroing),
    ("process_huge_page", Category::Zeroing),
    ("kernel_init_pages", Category::Zeroing),
    // A new page's set-up: little work, unless init_on_alloc or __GFP_ZERO has it clear the
    // page, which is then nearly all of it.
    ("prep_new_page", Category::Zeroing),
    ("post_alloc_hook", Category::Zeroing),
    // Faulting: the fault handlers and the page allocator below them.
    ("handle_mm_fault", Category::Faulting),
    ("__handle_mm_fault", Category::Faulting),
    ("hugetlb_fault", Category::Faulting),
    ("hugetlb_no_page", Category::Faulting),
    ("do_anonymous_page", Category::Faulting),
    ("do_huge_pmd_anonymous_page", Category::Faulting),
    ("do_fault", Category::Faulting),
    ("do_user_addr_fault", Category::Faulting),
    ("exc_page_fault", Category::Faulting),
    ("asm_exc_page_fault", Category::Faulting),
    ("shmem_fault", Category::Faulting),
    ("shmem_get_folio_gfp", Category::Faulting),
    ("shmem_read_folio*", Category::Faulting),
    ("memfd_alloc_folio", Category::Faulting),
    ("alloc_hugetlb_folio", Category::Faulting),
    ("__alloc_pages*", Category::Faulting),
    ("alloc_pages*", Category::Faulting),
    ("vma_alloc_folio*", Category::Faulting),
    ("folio_alloc*", Category::Faulting),
    // Populating (MAP_POPULATE, MADV_POPULATE_*) faults pages in through GUP; it pins nothing.
    ("__mm_populate", Category::Faulting),
    ("populate_vma_page_range", Category::Faulting),
    ("faultin_page_range", Category::Faulting),
    // Unpinning, before the pinning prefixes that would also match.
    ("unpin_user_page*", Category::Unpinning),
    ("unpin_folio*", Category::Unpinning),
    ("gup_put_folio", Category::Unpinning),
    ("put_pfn", Category::Unpinning),
    ("vfio_unpin_pages_remote", Category::Unpinning),
    ("vfio_sync_unpin", Category::Unpinning),
    ("vfio_batch_unpin", Category::Unpinning),
    ("batch_unpin", Category::Unpinning),
    ("pfn_reader_unpin", Category::Unpinning),
    ("pfn_reader_release_pins", Category::Unpinning),
    ("__iopt_area_unfill_domain", Category::Unpinning),
    ("iopt_area_unfill_domain*", Category::Unpinning),
    // IOVA lookups: the per-page walks unmap does to find the physical pages. Their callers'
    // own time is that walk's loop (iommu_iova_to_phys once per 4 KiB page).
    ("iommu_iova_to_phys", Category::IommuLookup),
    ("intel_iommu_iova_to_phys", Category::IommuLookup),
    ("pt_iommu_*", Category::IommuLookup),
    ("__iova_to_phys*", Category::IommuLookup),
    ("pfn_to_dma_pte", Category::IommuLookup),
    ("batch_from_domain", Category::IommuLookup),
    ("vfio_unmap_unpin", Category::IommuLookup),
    // Pinning: GUP and the VFIO/iommufd pinning wrappers.
    ("pin_user_pages*", Category::Pinning),
    ("get_user_pages*", Category::Pinning),
    ("__get_user_pages*", Category::Pinning),
    ("__gup_longterm_locked", Category::Pinning),
    ("gup_*", Category::Pinning),
    ("follow_page*", Category::Pinning),
    ("memfd_pin_folios", Category::Pinning),
    ("vfio_pin_pages_remote", Category::Pinning),
    ("vaddr_get_pfns", Category::Pinning),
    ("pfn_reader_*", Category::Pinning),
    ("batch_from_*", Category::Pinning),
    ("batch_add_pfn*", Category::Pinning),
    // IOMMU programming: page-table writes.
    ("iommu_map", Category::IommuMap),
    ("iommu_map_nosync", Category::IommuMap),
    ("__iommu_map", Category::IommuMap),
    ("iommu_map_pages", Category::IommuMap),
    ("intel_iommu_map_pages", Category::IommuMap),
    ("amd_iommu_map_pages", Category::IommuMap),
    ("vfio_iommu_map", Category::IommuMap),
    ("batch_to_domain", Category::IommuMap),
    ("iommu_unmap*", Category::IommuMap),
    ("__iommu_unmap", Category::IommuMap),
    ("iopt_area_unmap_domain*", Category::IommuMap),
    ("intel_iommu_unmap_pages", Category::IommuMap),
    ("amd_iommu_unmap_pages", Category::IommuMap),
    ("__unmap_range", Category::IommuMap),
    ("__map_range", Category::IommuMap),
    ("vtdss_*", Category::IommuMap),
    ("x86_64_map_range", Category::IommuMap),
    ("x86_64_unmap_range", Category::IommuMap),
    ("amdv1_*", Category::IommuMap),
    // IOMMU flushes: IOTLB sync, caching-mode flushes, invalidation queue.
    ("iommu_sync_map", Category::IommuFlush),
    ("iommu_iotlb_sync*", Category::IommuFlush),
    ("iommu_flush_iotlb_all", Category::IommuFlush),
    ("intel_iommu_iotlb_sync_map", Category::IommuFlush),
    ("intel_flush_iotlb_all", Category::IommuFlush),
    ("cache_tag_flush_*", Category::IommuFlush),
    ("qi_submit_sync", Category::IommuFlush),
    ("qi_flush_*", Category::IommuFlush),
    ("domain_flush_*", Category::IommuFlush),
    ("intel_iommu_tlb_sync", Category::IommuFlush),
    // Accounting: locked_vm.
    ("__account_locked_vm", Category::Accounting),
    ("account_locked_vm", Category::Accounting),
    ("mm_lock_acct", Category::Accounting),
    ("vfio_lock_acct", Category::Accounting),
    ("incr_user_locked_vm", Category::Accounting),
    ("decr_user_locked_vm", Category::Accounting),
    ("update_mm_locked_vm", Category::Accounting),
    ("iopt_pages_update_pinned", Category::Accounting),
    // Release: munmap's zap, TLB flush and freeing of the folios.
    ("unmap_region", Category::Release),
    ("unmap_vmas", Category::Release),
    ("__unmap_hugepage_range", Category::Release),
    ("shmem_undo_range", Category::Release),
    ("truncate_inode_folio", Category::Release),
    ("unmap_single_vma", Category::Release),
    ("unmap_page_range", Category::Release),
    ("zap_*", Category::Release),
    ("tlb_finish_mmu", Category::Release),
    ("tlb_flush_mmu*", Category::Release),
    ("free_pgtables", Category::Release),
    ("folios_put_refs", Category::Release),
    ("free_pages_and_swap_cache", Category::Release),
    ("free_unref_*", Category::Release),
    ("__free_pages*", Category::Release),
    ("free_huge_folio", Category::Release),
    ("__folio_put", Category::Release),
    ("release_pages", Category::Release),
    // Bookkeeping: whatever of VFIO type1's and iommufd's own code the rows above do not
    // name. Last, so that every specific row before it wins.
    ("vfio_*", Category::Bookkeeping),
    ("iommufd_*", Category::Bookkeeping),
    ("iopt_*", Category::Bookkeeping),
];

/// What a sample's category becomes under a [`CONTEXT_RULES`] frame.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Becomes {
    /// This category.
    Category(Category),
    /// Whatever the frames from the matched one outward decide (its own rule, else the next
    /// known frame's, under the rules again; `other` where none is known): the inner work is
    /// part of what its caller does, not a category of its own.
    Outer,
}

type C = Category;

/// [`Becomes::Category`], short for [`CONTEXT_RULES`].
const fn to(category: Category) -> Becomes {
    Becomes::Category(category)
}

/// Rules that look past the leaf-most known frame: (category found, an outer frame, what the
/// sample's category becomes). GUP under a populate call faults pages in; it pins nothing.
/// Exact rows see no callers: [`in_phase`] makes the populate decision for them.
pub const CONTEXT_RULES: &[(Category, &str, Becomes)] = &[
    (C::Pinning, "__mm_populate", to(C::Faulting)),
    (C::Pinning, "populate_vma_page_range", to(C::Faulting)),
    (C::Pinning, "faultin_page_range", to(C::Faulting)),
    // iommufd's pfn batches serve the unmap walk too.
    (C::Pinning, "batch_from_domain", to(C::IommuLookup)),
    // Allocating and clearing the IOMMU's own page-table pages is programming the IOMMU, not
    // faulting the buffer in.
    (C::Zeroing, "iommu_alloc_pages_node_sz", to(C::IommuMap)),
    (C::Faulting, "iommu_alloc_pages_node_sz", to(C::IommuMap)),
    (C::Zeroing, "iommu_alloc_pages_node", to(C::IommuMap)),
    (C::Faulting, "iommu_alloc_pages_node", to(C::IommuMap)),
    // Folio references dropped that free nothing: memfd_pin_folios drops its lookup
    // references once it holds its pins, and an LRU batch the references it took to add
    // folios to the LRU (under a fault, a pin or munmap's drain alike). 3-7% of a memfd
    // map's samples, which exact rows count in their callers.
    (C::Release, "memfd_pin_folios", Becomes::Outer),
    (C::Release, "folio_batch_move_lru", Becomes::Outer),
];

/// The category of exact time a probe row measured, in its phase: rows know their function
/// but not their callers, and a phase that makes no DMA call pins nothing, so pinning there
/// is GUP populating pages (the same decision [`CONTEXT_RULES`] makes from a stack).
pub fn in_phase(category: Category, phase_maps_dma: bool) -> Category {
    match category {
        Category::Pinning if !phase_maps_dma => Category::Faulting,
        c => c,
    }
}

/// Category of one kernel function name per [`CATEGORY_RULES`], if the table knows it.
pub fn category_of(function: &str) -> Option<Category> {
    // A module frame reads `func [module]`; the table names functions.
    let function = unclone(function_name(function));
    CATEGORY_RULES.iter().find_map(|(pattern, cat)| {
        let hit = match pattern.strip_suffix('*') {
            Some(prefix) => function.starts_with(prefix),
            None => function == *pattern,
        };
        hit.then_some(*cat)
    })
}

/// The function of a frame name, without its ` [module]` (`_[module]` in folded stacks, where
/// spaces end a stack).
pub fn function_name(frame: &str) -> &str {
    frame
        .split_once(" [")
        .or_else(|| frame.split_once("_["))
        .map_or(frame, |(f, _)| f)
}

/// The function a frame belongs to: module suffix and clone suffix dropped.
pub fn base_function(frame: &str) -> &str {
    unclone(function_name(frame))
}

/// The function a compiler clone was made from (`vfio_lock_acct.part.0` -> `vfio_lock_acct`).
fn unclone(function: &str) -> &str {
    function.split_once('.').map_or(function, |(f, _)| f)
}

/// Category of a probed function's exclusive time: the table's, or `other` (code no rule
/// names).
pub fn of_function(function: &str) -> Category {
    category_of(function).unwrap_or(Category::Other)
}

/// The retpoline thunks: their unwind hint is undefined (ORC), so the kernel's unwinder stops
/// in them, and a sample taken there keeps that one frame and names no caller.
const UNWIND_STOP_PREFIX: &str = "__x86_indirect_thunk_";

/// Whether a sampled stack (kernel frames, leaf first) is only a frame the unwinder stops at:
/// it says nothing of where its time belongs.
pub fn cut_short<S: AsRef<str>>(kernel_frames_leaf_first: &[S]) -> bool {
    matches!(kernel_frames_leaf_first, [only] if function_name(only.as_ref()).starts_with(UNWIND_STOP_PREFIX))
}

/// Classifies one sample by its kernel frames, given leaf first. No kernel frames: user time.
pub fn classify<'a>(kernel_frames_leaf_first: impl IntoIterator<Item = &'a str>) -> Category {
    let mut frames = kernel_frames_leaf_first.into_iter().peekable();
    if frames.peek().is_none() {
        return Category::User;
    }
    let Some(found) = frames.by_ref().find_map(category_of) else {
        return Category::Other;
    };
    in_context(found, frames)
}

/// The category `found` (a frame's own) takes under the given outer frames (leaf-most first),
/// per [`CONTEXT_RULES`]: the one decision samples and flamegraph colours share.
pub fn in_context<'a>(found: Category, outer: impl IntoIterator<Item = &'a str>) -> Category {
    let outer: Vec<&str> = outer.into_iter().map(|f| unclone(function_name(f))).collect();
    let rule = CONTEXT_RULES.iter().find_map(|(inner, caller, becomes)| {
        let at = outer.iter().position(|f| f == caller).filter(|_| *inner == found)?;
        Some((at, *becomes))
    });
    match rule {
        None => found,
        Some((_, Becomes::Category(c))) => c,
        Some((at, Becomes::Outer)) => {
            let rest = &outer[at..];
            rest.iter()
                .enumerate()
                .find_map(|(i, f)| Some((category_of(f)?, i)))
                .map_or(Category::Other, |(c, i)| in_context(c, rest[i + 1..].iter().copied()))
        }
    }
}

/// Sample counts per category, and the derived shares.
#[derive(Clone, Debug, Default)]
pub struct CategoryCounts {
    /// Samples per category.
    pub counts: BTreeMap<Category, u64>,
    /// Samples whose stack was [`cut_short`]: in no category.
    pub cut: u64,
}

impl CategoryCounts {
    /// Adds `n` samples of one stack (kernel frames, leaf first) to its category, or to
    /// [`CategoryCounts::cut`].
    pub fn add_stack<S: AsRef<str>>(&mut self, kernel_frames_leaf_first: &[S], n: u64) {
        match cut_short(kernel_frames_leaf_first) {
            true => self.cut += n,
            false => self.add(classify(kernel_frames_leaf_first.iter().map(AsRef::as_ref)), n),
        }
    }

    /// Adds `n` samples to `cat`.
    pub fn add(&mut self, cat: Category, n: u64) {
        *self.counts.entry(cat).or_default() += n;
    }

    /// Samples in a category (the cut ones not counted).
    pub fn total(&self) -> u64 {
        self.counts.values().sum()
    }

    /// Share of each category (all categories present, 0.0 where no samples), summing to 1.
    pub fn shares(&self) -> BTreeMap<Category, f64> {
        let total = self.total();
        CATEGORIES
            .iter()
            .map(|&c| {
                let n = self.counts.get(&c).copied().unwrap_or(0);
                (c, if total == 0 { 0.0 } else { n as f64 / total as f64 })
            })
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn iommu_page_table_pages_are_iommu_programming() {
        // A stack from the custom kernel's populated type1 map: the IOMMU allocates and clears
        // a page-table page inside iommu_map.
        let leaf_first = [
            "clear_highpages_kasan_tagged",
            "get_page_from_freelist",
            "__alloc_frozen_pages_noprof",
            "__folio_alloc_noprof",
            "iommu_alloc_pages_node_sz",
            "__map_range",
            "do_map",
            "vtdss_map_range",
            "iommu_map_nosync",
            "iommu_map",
            "vfio_iommu_type1_ioctl [vfio_iommu_type1]",
        ];
        assert_eq!(classify(leaf_first), Category::IommuMap);
        assert_eq!(classify(["clear_page_erms", "handle_mm_fault"]), Category::Zeroing);
        let inline = [
            PAGE_CLEAR_FRAME,
            "shmem_get_folio_gfp.isra.0",
            "shmem_fault",
            "handle_mm_fault",
        ];
        assert_eq!(classify(inline), Category::Zeroing);
        let table_page = [PAGE_CLEAR_FRAME, "get_page_from_freelist", "iommu_alloc_pages_node_sz"];
        assert_eq!(classify(table_page), Category::IommuMap);
    }

    #[test]
    fn a_stack_cut_at_a_retpoline_thunk_is_in_no_category() {
        // Two stacks of the custom kernel's iommufd_anonymous.none unmap (5 and 26 of its 48
        // samples): the IOVA walk, and a sample the unwinder stopped in the thunk.
        let walk = [
            "pt_iommu_vtdss_iova_to_phys",
            "batch_from_domain [iommufd]",
            "__iopt_area_unfill_domain [iommufd]",
            "iopt_area_unfill_domains [iommufd]",
            "iopt_unmap_iova_range [iommufd]",
            "iommufd_ioas_unmap [iommufd]",
            "iommufd_fops_ioctl [iommufd]",
            "__x64_sys_ioctl",
        ];
        let mut c = CategoryCounts::default();
        c.add_stack(&["__x86_indirect_thunk_rax"], 5);
        c.add_stack(&walk, 26);
        assert_eq!((c.cut, c.total()), (5, 26));
        assert_eq!(c.shares()[&Category::IommuLookup], 1.0);
        // Under real frames the thunk is one frame among them: the stack is classified.
        let through = ["__x86_indirect_thunk_rax", "batch_from_domain [iommufd]"];
        assert!(!cut_short(&through));
        assert!(
            !cut_short::<&str>(&[]),
            "no kernel frames is user time, not a cut stack"
        );
    }

    #[test]
    fn leafmost_known_frame_wins() {
        let populate = [
            "clear_page_erms",
            "folio_zero_user",
            "do_anonymous_page",
            "handle_mm_fault",
            "__get_user_pages",
        ];
        assert_eq!(classify(populate), Category::Zeroing);
        let alloc = [
            "rmqueue",
            "get_page_from_freelist",
            "__alloc_pages_noprof",
            "handle_mm_fault",
        ];
        assert_eq!(classify(alloc), Category::Faulting);
        let gup = [
            "follow_page_mask",
            "__get_user_pages",
            "pin_user_pages_remote",
            "vfio_pin_pages_remote",
        ];
        assert_eq!(classify(gup), Category::Pinning);
        let flush = [
            "qi_submit_sync",
            "cache_tag_flush_range_np",
            "intel_iommu_iotlb_sync_map",
            "iommu_sync_map",
            "iommu_map",
        ];
        assert_eq!(classify(flush), Category::IommuFlush);
        let pt = ["_raw_spin_lock", "intel_iommu_map_pages", "iommu_map"];
        assert_eq!(classify(pt), Category::IommuMap);
        assert_eq!(
            classify(["__account_locked_vm", "vfio_lock_acct"]),
            Category::Accounting
        );
        assert_eq!(classify(["do_vfs_ioctl", "do_syscall_64"]), Category::Other);
        assert_eq!(
            classify(["vfio_pin_pages_remote [vfio_iommu_type1]"]),
            Category::Pinning
        );
        assert_eq!(classify([]), Category::User);
    }

    #[test]
    fn populate_gup_is_faulting_and_pins_only_under_dma() {
        // A populating mmap (host, 6.18): GUP walks the range to fault pages in.
        let populate = [
            "follow_page_mask",
            "__get_user_pages",
            "populate_vma_page_range",
            "__mm_populate",
            "vm_mmap_pgoff",
        ];
        assert_eq!(classify(populate), Category::Faulting);
        let pin = ["follow_page_mask", "__get_user_pages", "pin_user_pages_remote"];
        assert_eq!(classify(pin), Category::Pinning);
        assert_eq!(in_phase(Category::Pinning, false), Category::Faulting);
        assert_eq!(in_phase(Category::Pinning, true), Category::Pinning);
        assert_eq!(in_phase(Category::Zeroing, false), Category::Zeroing);
    }

    #[test]
    fn unmap_stacks_from_the_custom_kernel() {
        // Leaf-first frames of `unmap.folded` lines captured in the 7.3 guest.
        let type1_walk = [
            "make_range_ul",
            "pt_iommu_vtdss_iova_to_phys",
            "iommu_iova_to_phys",
            "vfio_unmap_unpin_[vfio_iommu_type1]",
            "vfio_iommu_type1_ioctl_[vfio_iommu_type1]",
        ];
        assert_eq!(classify(type1_walk), Category::IommuLookup);
        let type1_unpin = [
            "gup_put_folio",
            "unpin_user_pages_dirty_lock",
            "vfio_unpin_pages_remote_[vfio_iommu_type1]",
            "vfio_sync_unpin.isra.0_[vfio_iommu_type1]",
            "vfio_unmap_unpin_[vfio_iommu_type1]",
        ];
        assert_eq!(classify(type1_unpin), Category::Unpinning);
        let iommufd_walk = [
            "__iova_to_phys1.constprop.0",
            "pt_iommu_vtdss_iova_to_phys",
            "batch_from_domain_[iommufd]",
            "__iopt_area_unfill_domain_[iommufd]",
        ];
        assert_eq!(classify(iommufd_walk), Category::IommuLookup);
        let batch = [
            "batch_add_pfn_num_[iommufd]",
            "batch_from_domain_[iommufd]",
            "__iopt_area_unfill_domain_[iommufd]",
        ];
        assert_eq!(classify(batch), Category::IommuLookup);
        let clear = [
            "__unmap_range",
            "vtdss_unmap_range",
            "iommu_unmap_nofail",
            "__iopt_area_unfill_domain",
        ];
        assert_eq!(classify(clear), Category::IommuMap);
        assert_eq!(
            classify(["vfio_lock_acct.part.0_[vfio_iommu_type1]"]),
            Category::Accounting
        );
        assert_eq!(
            classify(["free_unref_folios", "folios_put_refs", "tlb_flush_mmu", "unmap_vmas"]),
            Category::Release
        );
    }

    #[test]
    fn lookup_references_dropped_by_a_pin_are_pinning() {
        // Leaf-first frames of a `map.folded` line captured in the 7.3 guest (iommufd memfd).
        let dropped = [
            "folios_put_refs",
            "memfd_pin_folios",
            "pfn_reader_user_pin_[iommufd]",
            "pfn_reader_next_[iommufd]",
            "pfn_reader_first_[iommufd]",
            "iopt_area_fill_domains_[iommufd]",
        ];
        assert_eq!(classify(dropped), Category::Pinning);
        assert_eq!(classify(dropped[..1].iter().copied()), Category::Release);
    }

    /// Leaf-first frames of a root-first folded stack.
    fn leaf_first(folded: &str) -> Vec<&str> {
        folded.split(';').rev().collect()
    }

    #[test]
    fn an_lru_batch_dropping_its_references_is_its_callers_work() {
        // Lines of `map.folded` and `munmap.folded` captured in the 7.3 guest (memfd cases).
        let lru = "__folio_batch_add_and_move;folio_batch_move_lru;folios_put_refs";
        let pin = format!(
            "vaddr_get_pfns_[vfio_iommu_type1];pin_user_pages_remote;__gup_longterm_locked;__get_user_pages;follow_page_pte;folio_mark_accessed;{lru}"
        );
        assert_eq!(classify(leaf_first(&pin)), Category::Pinning);
        let fault = format!(
            "pfn_reader_user_pin_[iommufd];pin_user_pages_fast;gup_fast_fallback;__gup_longterm_locked;__get_user_pages;handle_mm_fault;__handle_mm_fault;__do_fault;shmem_fault;shmem_get_folio_gfp.isra.0;shmem_alloc_and_add_folio.constprop.0;{lru}"
        );
        assert_eq!(classify(leaf_first(&fault)), Category::Faulting);
        let zap = format!(
            "do_vmi_align_munmap;vms_complete_munmap_vmas;unmap_region;unmap_vmas;__zap_vma_range;folio_mark_accessed;{lru}"
        );
        assert_eq!(classify(leaf_first(&zap)), Category::Release);
        assert_eq!(classify(leaf_first(lru)), Category::Other);
    }

    #[test]
    fn the_drivers_own_code_is_bookkeeping_and_syscall_entry_other() {
        // Leaf-first frames of a `map.folded` line captured in the 7.3 guest (iommufd memfd).
        let areas = [
            "xas_find",
            "xa_find_after",
            "iopt_area_fill_domains_[iommufd]",
            "iopt_map_pages_[iommufd]",
            "iopt_map_common.isra.0_[iommufd]",
            "iommufd_ioas_map_file_[iommufd]",
            "iommufd_fops_ioctl_[iommufd]",
            "__x64_sys_ioctl",
        ];
        assert_eq!(classify(areas), Category::Bookkeeping);
        // The rows inside the driver keep their own categories.
        let pin = [
            "memfd_pin_folios",
            "pfn_reader_user_pin_[iommufd]",
            "iopt_area_fill_domains_[iommufd]",
        ];
        assert_eq!(classify(pin), Category::Pinning);
        assert_eq!(classify(["vfio_pin_map_dma_[vfio_iommu_type1]"]), Category::Bookkeeping);
        assert_eq!(
            classify(["vfio_pin_pages_remote_[vfio_iommu_type1]"]),
            Category::Pinning
        );
        assert_eq!(classify(["__x64_sys_ioctl", "do_syscall_64"]), Category::Other);
    }

    #[test]
    fn shares_cover_every_category() {
        let mut c = CategoryCounts::default();
        c.add(Category::Zeroing, 3);
        c.add(Category::Faulting, 1);
        let s = c.shares();
        assert_eq!(s.len(), CATEGORIES.len());
        assert!((s[&Category::Zeroing] - 0.75).abs() < 1e-9);
        assert!((s.values().sum::<f64>() - 1.0).abs() < 1e-9);
    }
}
