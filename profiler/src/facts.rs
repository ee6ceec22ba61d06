//! Facts about the host that several modules share (doctor finds them, the plan reads them,
//! the report records them). This module defines the types only and imports no other module.
use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

/// Something this host can or cannot do, as `dmaprof doctor` finds out by trying.
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
)]
#[serde(rename_all = "snake_case")]
#[strum(serialize_all = "snake_case")]
pub enum CapabilityId {
    /// CAP_BPF, CAP_PERFMON, CAP_SYS_ADMIN, CAP_IPC_LOCK.
    Privileges,
    /// /sys/kernel/btf/vmlinux parses.
    BtfVmlinux,
    /// Module BTF is present.
    BtfModules,
    /// A raw tracepoint attaches.
    Tracepoints,
    /// A perf event samples kernel stacks.
    PerfSampling,
    /// A kprobe attaches.
    Kprobes,
    /// An fentry program loads and attaches.
    Fentry,
    /// /dev/vfio/vfio with the type1 backend.
    VfioType1,
    /// /dev/iommu.
    Iommufd,
    /// IOMMU_IOAS_MAP_FILE (6.13+).
    MapFile,
    /// VFIO device cdevs (/dev/vfio/devices).
    VfioCdev,
}

/// One capability: whether it works and what was seen (or what would fix it).
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq, Eq)]
pub struct Capability {
    /// Works here.
    pub ok: bool,
    /// What was found, or why not and what would fix it.
    pub detail: String,
}

impl Capability {
    /// It works; `detail` says what was seen.
    pub fn yes(detail: impl Into<String>) -> Self {
        Self {
            ok: true,
            detail: detail.into(),
        }
    }

    /// It does not; `detail` says why and what would fix it.
    pub fn no(detail: impl Into<String>) -> Self {
        Self {
            ok: false,
            detail: detail.into(),
        }
    }
}

/// Capabilities by id.
pub type Capabilities = BTreeMap<CapabilityId, Capability>;

/// Whether `caps` says `id` works.
pub fn has(caps: &Capabilities, id: CapabilityId) -> bool {
    caps.get(&id).is_some_and(|c| c.ok)
}

/// Kernel identity and the DMA-relevant changes it carries.
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
pub struct KernelInfo {
    /// uname -r.
    pub release: String,
    /// uname -v.
    #[serde(default)]
    pub version: String,
    /// uname -m.
    #[serde(default)]
    pub machine: String,
    /// Kernel changes that move DMA-map time, as seen in /proc/kallsyms.
    #[serde(default)]
    pub features: Vec<KernelFeature>,
    /// Transparent huge page settings (the selected value of each sysfs file).
    #[serde(default)]
    pub thp: ThpSettings,
}

/// /sys/kernel/mm/transparent_hugepage settings; None where the file is missing.
#[derive(Clone, Debug, Default, Serialize, Deserialize, PartialEq, Eq)]
pub struct ThpSettings {
    /// `enabled`: always, madvise or never (anonymous memory).
    pub enabled: Option<String>,
    /// `shmem_enabled` (memfd backings).
    pub shmem_enabled: Option<String>,
    /// `defrag`.
    pub defrag: Option<String>,
}

/// A kernel change that moves DMA-map time (the rules that recognise them are
/// `kernel::KERNEL_FEATURES`).
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
)]
#[serde(rename_all = "snake_case")]
#[strum(serialize_all = "snake_case")]
pub enum FeatureId {
    /// /dev/iommu and IOMMU_IOAS_MAP.
    Iommufd,
    /// unpin_folio/unpin_folios.
    UnpinFolios,
    /// memfd_pin_folios.
    MemfdPinFolios,
    /// clear_huge_page became folio_zero_user.
    FolioZeroUser,
    /// The follow_pfnmap API.
    HugePfnmap,
    /// IOMMU_IOAS_MAP_FILE.
    IoasMapFile,
    /// The batched sync after iommu_map.
    IommuMapBatchedSync,
}

impl FeatureId {
    /// The id in reports, e.g. `memfd_pin_folios`.
    pub fn name(self) -> &'static str {
        self.into()
    }
}

/// One kernel change and whether this kernel has it.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq, Eq)]
pub struct KernelFeature {
    /// Which change.
    pub id: FeatureId,
    /// Whether the kernel shows it (None: /proc/kallsyms unreadable).
    pub present: Option<bool>,
    /// What the symbol test saw: each symbol it looks for, present or absent.
    pub evidence: String,
    /// First mainline release and the commit (backports can bring it earlier).
    pub since: String,
    /// What it changes for a DMA map.
    pub effect: String,
}

/// A PCI device bound to vfio-pci.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct VfioDevice {
    /// PCI address, e.g. 0000:00:01.0.
    pub bdf: String,
    /// Bound driver.
    pub driver: String,
    /// IOMMU group number.
    pub iommu_group: Option<String>,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn capability_ids_keep_their_json_names() {
        let mut caps = Capabilities::new();
        caps.insert(CapabilityId::VfioType1, Capability::yes("x"));
        caps.insert(CapabilityId::MapFile, Capability::no("y"));
        let json = serde_json::to_value(&caps).unwrap();
        assert_eq!(json["vfio_type1"]["ok"], true);
        assert_eq!(json["map_file"]["ok"], false);
        let back: Capabilities = serde_json::from_value(json).unwrap();
        assert!(has(&back, CapabilityId::VfioType1) && !has(&back, CapabilityId::MapFile));
        assert_eq!(CapabilityId::PerfSampling.to_string(), "perf_sampling");
    }

    #[test]
    fn feature_ids_keep_their_json_names() {
        assert_eq!(
            serde_json::to_value(FeatureId::IommuMapBatchedSync).unwrap(),
            "iommu_map_batched_sync"
        );
        assert_eq!(FeatureId::MemfdPinFolios.name(), "memfd_pin_folios");
        let back: FeatureId = serde_json::from_value("ioas_map_file".into()).unwrap();
        assert_eq!(back, FeatureId::IoasMapFile);
    }
}
