//! What the running kernel is and which changes that move DMA-map time it carries, judged from
//! the symbols it exports.
use std::{collections::BTreeSet, fs};

use crate::facts::{FeatureId, KernelFeature, KernelInfo, ThpSettings};

/// uname(2), with no features judged yet.
pub fn info() -> KernelInfo {
    // SAFETY: uname fills the zeroed struct; its fields are NUL-terminated on success.
    let mut u: libc::utsname = unsafe { std::mem::zeroed() };
    // SAFETY: as above.
    unsafe { libc::uname(&mut u) };
    let field = |f: &[libc::c_char]| {
        // SAFETY: uname NUL-terminates each field within its array.
        unsafe { std::ffi::CStr::from_ptr(f.as_ptr()) }
            .to_string_lossy()
            .into_owned()
    };
    KernelInfo {
        release: field(&u.release),
        version: field(&u.version),
        machine: field(&u.machine),
        features: Vec::new(),
        thp: thp_settings(),
    }
}

/// The selected value of a sysfs choice file (`always [madvise] never` -> `madvise`).
pub fn selected(text: &str) -> Option<String> {
    let word = text.split_whitespace().find(|w| w.starts_with('['))?;
    Some(word.trim_matches(['[', ']']).to_owned())
}

/// The transparent huge page settings.
pub fn thp_settings() -> ThpSettings {
    let read = |f: &str| fs::read_to_string(format!("/sys/kernel/mm/transparent_hugepage/{f}")).ok();
    ThpSettings {
        enabled: read("enabled").as_deref().and_then(selected),
        shmem_enabled: read("shmem_enabled").as_deref().and_then(selected),
        defrag: read("defrag").as_deref().and_then(selected),
    }
}

/// A kernel change recognised by symbols: present when every `with` symbol exists and no
/// `without` symbol does.
#[derive(Clone, Copy, Debug)]
pub struct FeatureRule {
    /// Which change.
    pub id: FeatureId,
    /// Symbols that must exist.
    pub with: &'static [&'static str],
    /// Symbols that must not.
    pub without: &'static [&'static str],
    /// First mainline release and commit.
    pub since: &'static str,
    /// What it changes for a DMA map.
    pub effect: &'static str,
}

/// Kernel changes that move DMA-map time. Versions and commits were checked against mainline;
/// module symbols (vfio, iommufd) show only while the module is loaded.
pub const KERNEL_FEATURES: &[FeatureRule] = &[
    FeatureRule {
        id: FeatureId::Iommufd,
        with: &["iommufd_ioas_map"],
        without: &[],
        since: "v6.2, 2ff4bed7fee7 (iommufd: File descriptor, context, kconfig and makefiles)",
        effect: "/dev/iommu and IOMMU_IOAS_MAP; the iommufd_* modes",
    },
    FeatureRule {
        id: FeatureId::UnpinFolios,
        with: &["unpin_folio", "unpin_folios"],
        without: &[],
        since: "v6.11, 6cc040542ba7 (mm/gup: introduce unpin_folio/unpin_folios helpers)",
        effect: "folio-granular unpin on unmap",
    },
    FeatureRule {
        id: FeatureId::MemfdPinFolios,
        with: &["memfd_pin_folios"],
        without: &[],
        since: "v6.11, 89c1905d9c14 (mm/gup: introduce memfd_pin_folios() for pinning memfd folios)",
        effect: "memfd pinned by folio from the page cache, without walking page tables",
    },
    FeatureRule {
        id: FeatureId::FolioZeroUser,
        with: &["folio_zero_user"],
        without: &["clear_huge_page"],
        since: "v6.11, 78fefd04c123 (mm: memory: convert clear_huge_page() to folio_zero_user())",
        effect: "hugepage zeroing is folio_zero_user (the probe row follows the rename)",
    },
    FeatureRule {
        id: FeatureId::HugePfnmap,
        with: &["follow_pfnmap_start"],
        without: &[],
        since: "v6.12, 6da8e9634bb7 (mm: new follow_pfnmap API)",
        effect: "PFNMAP (MMIO) mappings pinned by PMD/PUD, not per page",
    },
    FeatureRule {
        id: FeatureId::IoasMapFile,
        with: &["iommufd_ioas_map_file", "iopt_map_file_pages"],
        without: &[],
        since: "v6.13, f4986a72d6e4 (iommufd: Add IOMMU_IOAS_MAP_FILE)",
        effect: "iommufd maps a memfd by file offset (IOMMU_IOAS_MAP_FILE): no prefault in the map",
    },
    FeatureRule {
        id: FeatureId::IommuMapBatchedSync,
        with: &["iommu_map_nosync", "iommu_sync_map"],
        without: &[],
        since: "v6.16, 5c87cffe2d38 (iommu: generalize the batched sync after map interface)",
        effect: "one IOTLB/iotlb_sync_map per batch instead of per iommu_map",
    },
];

impl FeatureRule {
    /// This rule judged by `has` (whether the kernel has a symbol); None: unknown.
    pub fn judge(&self, has: Option<&dyn Fn(&str) -> bool>) -> KernelFeature {
        let symbols = self
            .with
            .iter()
            .map(|s| (s, true))
            .chain(self.without.iter().map(|s| (s, false)));
        let said = |present: bool| if present { "present" } else { "absent" };
        // What was seen, symbol by symbol: "present: no" beside "iommufd_ioas_map present"
        // would read as a contradiction.
        let evidence = match has {
            Some(has) => symbols
                .map(|(s, _)| format!("{s} {}", said(has(s))))
                .collect::<Vec<_>>()
                .join(", "),
            None => {
                let wanted: Vec<String> = symbols.map(|(s, want)| format!("{s} {}", said(want))).collect();
                format!("/proc/kallsyms unreadable; the test wants {}", wanted.join(", "))
            }
        };
        KernelFeature {
            id: self.id,
            present: has.map(|has| self.with.iter().all(|s| has(s)) && !self.without.iter().any(|s| has(s))),
            evidence,
            since: self.since.to_owned(),
            effect: self.effect.to_owned(),
        }
    }
}

/// [`KERNEL_FEATURES`] judged by `has`; None: unknown.
pub fn features_from(has: Option<&dyn Fn(&str) -> bool>) -> Vec<KernelFeature> {
    KERNEL_FEATURES.iter().map(|r| r.judge(has)).collect()
}

/// [`KERNEL_FEATURES`] judged from /proc/kallsyms names (addresses are not needed, so this
/// works unprivileged too). A run that has the symbols loaded uses [`features_from`].
pub fn features() -> Vec<KernelFeature> {
    let wanted: BTreeSet<&str> = KERNEL_FEATURES
        .iter()
        .flat_map(|r| r.with.iter().chain(r.without.iter()).copied())
        .collect();
    let seen: Option<BTreeSet<String>> = fs::read_to_string("/proc/kallsyms").ok().map(|text| {
        text.lines()
            .filter_map(|l| l.split_whitespace().nth(2))
            .filter(|n| wanted.contains(n))
            .map(str::to_owned)
            .collect()
    });
    match seen {
        Some(seen) => features_from(Some(&|n| seen.contains(n))),
        None => features_from(None),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sysfs_choices() {
        assert_eq!(selected("always [madvise] never\n").as_deref(), Some("madvise"));
        assert_eq!(
            selected("[always] within_size advise never deny force").as_deref(),
            Some("always")
        );
        assert_eq!(selected("always madvise never"), None);
    }

    #[test]
    fn rules_judge_with_and_without() {
        let has = |n: &str| ["folio_zero_user", "memfd_pin_folios"].contains(&n);
        let f = features_from(Some(&has));
        let get = |id: FeatureId| f.iter().find(|x| x.id == id).unwrap().present;
        assert_eq!(get(FeatureId::FolioZeroUser), Some(true));
        assert_eq!(get(FeatureId::MemfdPinFolios), Some(true));
        assert_eq!(get(FeatureId::Iommufd), Some(false));
        let evidence = |id: FeatureId| f.iter().find(|x| x.id == id).unwrap().evidence.clone();
        assert_eq!(evidence(FeatureId::Iommufd), "iommufd_ioas_map absent");
        assert_eq!(
            evidence(FeatureId::FolioZeroUser),
            "folio_zero_user present, clear_huge_page absent"
        );
        assert_eq!(
            evidence(FeatureId::IommuMapBatchedSync),
            "iommu_map_nosync absent, iommu_sync_map absent"
        );
        let both = |n: &str| ["folio_zero_user", "clear_huge_page"].contains(&n);
        let f = features_from(Some(&both));
        assert_eq!(
            f.iter().find(|x| x.id == FeatureId::FolioZeroUser).unwrap().present,
            Some(false)
        );
        assert!(features_from(None).iter().all(|x| x.present.is_none()));
        let unknown = features_from(None);
        assert_eq!(
            unknown[0].evidence,
            "/proc/kallsyms unreadable; the test wants iommufd_ioas_map present"
        );
    }

    #[test]
    fn every_feature_has_one_rule() {
        use strum::IntoEnumIterator as _;
        let ids: Vec<FeatureId> = KERNEL_FEATURES.iter().map(|r| r.id).collect();
        assert_eq!(ids, FeatureId::iter().collect::<Vec<_>>());
    }
}
