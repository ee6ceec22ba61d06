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
    /// User-space execution (no kernel frames in the sample).
    User,
    /// Everything else.
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
            other => other.name(),
        }
    }
}

impl Category {
    /// Its colour in flamegraphs (r, g, b).
    pub fn color(self) -> (u8, u8, u8) {
        match self {
            Category::Zeroing => (230, 85, 13),
            Category::Faulting => (253, 174, 107),
            Category::Pinning => (49, 130, 189),
            Category::IommuMap => (49, 163, 84),
            Category::IommuFlush => (161, 217, 155),
            Category::Accounting => (117, 107, 177),
            Category::User => (189, 189, 189),
            Category::Other => (222, 222, 222),
        }
    }
}

/// Kernel function patterns and their category. A trailing `*` makes a prefix match.
/// Order does not matter between rows: the stack decides (leaf-most known frame wins).
pub const CATEGORY_RULES: &[(&str, Category)] = &[
    // Zeroing: per-page clears and the huge-page zeroing loop.
    ("clear_page*", Category::Zeroing),
    ("clear_huge_page", Category::Zeroing),
    ("folio_zero_user", Category::Zeroing),
    ("clear_subpage", Category::Zeroing),
    ("clear_user_highpage*", Category::Zeroing),
    ("clear_highpage*", Category::Zeroing),
    ("process_huge_page", Category::Zeroing),
    ("kernel_init_pages", Category::Zeroing),
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
    ("alloc_hugetlb_folio", Category::Faulting),
    ("__alloc_pages*", Category::Faulting),
    ("alloc_pages*", Category::Faulting),
    ("vma_alloc_folio*", Category::Faulting),
    ("folio_alloc*", Category::Faulting),
    // Pinning: GUP and the VFIO/iommufd pinning wrappers.
    ("pin_user_pages*", Category::Pinning),
    ("get_user_pages*", Category::Pinning),
    ("__get_user_pages*", Category::Pinning),
    ("__gup_longterm_locked", Category::Pinning),
    ("gup_*", Category::Pinning),
    ("follow_page*", Category::Pinning),
    ("memfd_pin_folios", Category::Pinning),
    ("populate_vma_page_range", Category::Pinning),
    ("__mm_populate", Category::Pinning),
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
    // Accounting: locked_vm.
    ("__account_locked_vm", Category::Accounting),
    ("account_locked_vm", Category::Accounting),
    ("mm_lock_acct", Category::Accounting),
    ("vfio_lock_acct", Category::Accounting),
    ("incr_user_locked_vm", Category::Accounting),
    ("decr_user_locked_vm", Category::Accounting),
    ("update_mm_locked_vm", Category::Accounting),
    ("iopt_pages_update_pinned", Category::Accounting),
];

/// Category of one kernel function name per [`CATEGORY_RULES`], if the table knows it.
pub fn category_of(function: &str) -> Option<Category> {
    // A module frame reads `func [module]`; the table names functions.
    let function = function_name(function);
    CATEGORY_RULES.iter().find_map(|(pattern, cat)| {
        let hit = match pattern.strip_suffix('*') {
            Some(prefix) => function.starts_with(prefix),
            None => function == *pattern,
        };
        hit.then_some(*cat)
    })
}

/// The function of a frame name, without its ` [module]`.
pub fn function_name(frame: &str) -> &str {
    frame.split_once(" [").map_or(frame, |(f, _)| f)
}

/// Category of a probed function's exclusive time: the table's, or `other` (the syscall's own
/// work: ioctl dispatch, the VFIO/iommufd bookkeeping between the probed calls).
pub fn of_function(function: &str) -> Category {
    category_of(function).unwrap_or(Category::Other)
}

/// Classifies one sample by its kernel frames, given leaf first. No kernel frames: user time.
pub fn classify<'a>(kernel_frames_leaf_first: impl IntoIterator<Item = &'a str>) -> Category {
    let mut any = false;
    for f in kernel_frames_leaf_first {
        any = true;
        if let Some(c) = category_of(f) {
            return c;
        }
    }
    if any { Category::Other } else { Category::User }
}

/// Sample counts per category, and the derived shares.
#[derive(Clone, Debug, Default)]
pub struct CategoryCounts {
    /// Samples per category.
    pub counts: BTreeMap<Category, u64>,
}

impl CategoryCounts {
    /// Adds `n` samples to `cat`.
    pub fn add(&mut self, cat: Category, n: u64) {
        *self.counts.entry(cat).or_default() += n;
    }

    /// Total samples.
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
        assert_eq!(classify(["unmap_page_range", "do_syscall_64"]), Category::Other);
        assert_eq!(
            classify(["vfio_pin_pages_remote [vfio_iommu_type1]"]),
            Category::Pinning
        );
        assert_eq!(classify([]), Category::User);
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
