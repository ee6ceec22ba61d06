//! The variant matrix, declared once as data: IOMMU modes x backings x prefault, with the kernel
//! selftests' names (`vfio_type1_iommu`, `anonymous_hugetlb_2mb`, ...), so that `-v` globs work
//! like `vfio_dma_mapping_perf_test -v`.
use serde::{Deserialize, Serialize};

use crate::size::ByteSize;

/// How the buffer is DMA-mapped (a case without one runs only the memory phases).
#[derive(
    Clone,
    Copy,
    Debug,
    PartialEq,
    Eq,
    Hash,
    Serialize,
    Deserialize,
    strum::EnumIter,
    strum::IntoStaticStr,
    strum::Display,
)]
pub enum DmaMode {
    /// VFIO container, VFIO_TYPE1_IOMMU.
    #[serde(rename = "vfio_type1_iommu")]
    #[strum(serialize = "vfio_type1_iommu")]
    VfioType1Iommu,
    /// VFIO container, VFIO_TYPE1v2_IOMMU.
    #[serde(rename = "vfio_type1v2_iommu")]
    #[strum(serialize = "vfio_type1v2_iommu")]
    VfioType1v2Iommu,
    /// /dev/iommu used as a VFIO container, type1.
    #[serde(rename = "iommufd_compat_type1")]
    #[strum(serialize = "iommufd_compat_type1")]
    IommufdCompatType1,
    /// /dev/iommu used as a VFIO container, type1v2.
    #[serde(rename = "iommufd_compat_type1v2")]
    #[strum(serialize = "iommufd_compat_type1v2")]
    IommufdCompatType1v2,
    /// Native iommufd: IOAS + VFIO cdev.
    #[serde(rename = "iommufd")]
    #[strum(serialize = "iommufd")]
    Iommufd,
}

impl DmaMode {
    /// The selftests' name of the mode.
    pub fn name(self) -> &'static str {
        self.into()
    }

    /// Whether the mode goes through /dev/iommu (IOMMUFD), natively or as a VFIO container.
    pub fn is_iommufd(self) -> bool {
        !matches!(self, DmaMode::VfioType1Iommu | DmaMode::VfioType1v2Iommu)
    }
}

/// The name of a case's mode: the selftests' mode name, or `none` for memory phases only.
pub fn mode_name(mode: Option<DmaMode>) -> &'static str {
    mode.map_or("none", DmaMode::name)
}

/// Where the buffer's memory comes from, as the selftests name the backings.
#[derive(
    Clone,
    Copy,
    Debug,
    PartialEq,
    Eq,
    Hash,
    Serialize,
    Deserialize,
    strum::EnumIter,
    strum::IntoStaticStr,
    strum::Display,
)]
#[serde(rename_all = "snake_case")]
#[strum(serialize_all = "snake_case")]
pub enum Backing {
    /// Anonymous MAP_PRIVATE memory.
    Anonymous,
    /// Anonymous MAP_HUGETLB, 2 MiB pages.
    #[serde(rename = "anonymous_hugetlb_2mb")]
    #[strum(serialize = "anonymous_hugetlb_2mb")]
    AnonymousHugetlb2mb,
    /// Anonymous MAP_HUGETLB, 1 GiB pages.
    #[serde(rename = "anonymous_hugetlb_1gb")]
    #[strum(serialize = "anonymous_hugetlb_1gb")]
    AnonymousHugetlb1gb,
    /// memfd_create + ftruncate, mapped MAP_SHARED.
    Memfd,
    /// memfd with MFD_HUGETLB, 2 MiB pages.
    #[serde(rename = "memfd_hugetlb_2mb")]
    #[strum(serialize = "memfd_hugetlb_2mb")]
    MemfdHugetlb2mb,
    /// memfd with MFD_HUGETLB, 1 GiB pages.
    #[serde(rename = "memfd_hugetlb_1gb")]
    #[strum(serialize = "memfd_hugetlb_1gb")]
    MemfdHugetlb1gb,
}

impl Backing {
    /// The selftests' name of the backing.
    pub fn name(self) -> &'static str {
        self.into()
    }

    /// Created with memfd_create + ftruncate and mapped MAP_SHARED (else anonymous MAP_PRIVATE).
    pub fn memfd(self) -> bool {
        matches!(
            self,
            Backing::Memfd | Backing::MemfdHugetlb2mb | Backing::MemfdHugetlb1gb
        )
    }

    /// hugetlb page size in KiB, or None for base pages.
    pub fn hugetlb_kb(self) -> Option<u64> {
        match self {
            Backing::Anonymous | Backing::Memfd => None,
            Backing::AnonymousHugetlb2mb | Backing::MemfdHugetlb2mb => Some(2048),
            Backing::AnonymousHugetlb1gb | Backing::MemfdHugetlb1gb => Some(1 << 20),
        }
    }

    /// Size of one page of this backing, in bytes.
    pub fn page_size(self) -> u64 {
        self.hugetlb_kb().map_or(4096, |kb| kb * 1024)
    }
}

/// How the buffer is faulted in before the map.
#[derive(
    Clone,
    Copy,
    Debug,
    PartialEq,
    Eq,
    Hash,
    Serialize,
    Deserialize,
    clap::ValueEnum,
    strum::EnumIter,
    strum::IntoStaticStr,
    strum::Display,
)]
#[serde(rename_all = "snake_case")]
#[strum(serialize_all = "snake_case")]
pub enum Prefault {
    /// Not at all: faults happen later (inside the DMA map's pinning, for DMA modes).
    None,
    /// MAP_POPULATE: the kernel faults everything in inside mmap.
    Populate,
    /// User space writes one byte per page after mmap (CPU page faults).
    Touch,
}

impl Prefault {
    /// The name used in case names.
    pub fn name(self) -> &'static str {
        self.into()
    }
}

/// One cell of the matrix.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Case {
    /// IOMMU mode; None: memory phases only.
    pub mode: Option<DmaMode>,
    /// Memory backing.
    pub backing: Backing,
    /// Prefault strategy.
    pub prefault: Prefault,
}

impl Case {
    /// `<mode>_<backing>`, the selftests' variant name.
    pub fn variant(&self) -> String {
        format!("{}_{}", mode_name(self.mode), self.backing.name())
    }

    /// `<mode>_<backing>.<prefault>`, the case name globs match.
    pub fn name(&self) -> String {
        format!("{}.{}", self.variant(), self.prefault.name())
    }
}

/// Transparent huge pages for the base-page backings (`anonymous`, `memfd`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize, clap::ValueEnum, strum::Display)]
#[serde(rename_all = "snake_case")]
#[strum(serialize_all = "snake_case")]
pub enum Thp {
    /// Whatever the system's settings give (the guest's custom kernel: THP `always`).
    #[default]
    System,
    /// MADV_NOHUGEPAGE on the buffer: 4 KiB pages, really.
    Never,
    /// MADV_HUGEPAGE on the buffer.
    Always,
}

impl Thp {
    /// The madvise advice, if any.
    pub fn advice(self) -> Option<libc::c_int> {
        match self {
            Thp::System => None,
            Thp::Never => Some(libc::MADV_NOHUGEPAGE),
            Thp::Always => Some(libc::MADV_HUGEPAGE),
        }
    }
}

/// What one iteration runs: a case at a size.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Workload {
    /// The case.
    pub case: Case,
    /// Buffer size.
    pub size: ByteSize,
    /// Transparent huge pages for base-page backings.
    pub thp: Thp,
}

/// The largest buffer a primer iteration takes (one THP or 2 MiB hugetlb page, 512 base pages).
pub const PRIMER_BYTES: u64 = 2 << 20;

impl Workload {
    /// The same case on a buffer of at most [`PRIMER_BYTES`]: an iteration that runs every
    /// phase's code paths once more, cheaply, to be discarded. None where one page of the
    /// backing is larger (1 GiB hugetlb: a primer would zero a whole gigabyte).
    pub fn primer(&self) -> Option<Workload> {
        let bytes = self.size.bytes().min(PRIMER_BYTES);
        if self.case.backing.page_size() > bytes {
            return None;
        }
        Some(Workload {
            size: ByteSize::new(bytes).ok()?,
            ..*self
        })
    }
}

/// The whole matrix, in run order (mode, then backing, then prefault).
pub fn all_cases() -> Vec<Case> {
    use strum::IntoEnumIterator as _;
    std::iter::once(None)
        .chain(DmaMode::iter().map(Some))
        .flat_map(|mode| {
            Backing::iter().flat_map(move |backing| {
                Prefault::iter().map(move |prefault| Case {
                    mode,
                    backing,
                    prefault,
                })
            })
        })
        .collect()
}

/// Why a selection was rejected.
#[derive(Debug, thiserror::Error)]
pub enum SelectError {
    /// A pattern is not a valid glob.
    #[error("bad -v pattern `{pattern}`: {reason}")]
    BadGlob {
        /// The pattern as given.
        pattern: String,
        /// What is wrong with it.
        reason: String,
    },
    /// A pattern matched no case.
    #[error(
        "-v `{0}` matches no case; cases are named <mode>_<backing>.<prefault>, e.g. none_anonymous.populate (list them with `dmaprof list`)"
    )]
    NoMatch(String),
}

/// Selects cases with shell-style globs. A pattern without a `.` matches the variant
/// (`<mode>_<backing>`, as in the selftests), so every prefault of it is selected. No patterns
/// select everything; a pattern that selects nothing is an error rather than a silent no-op.
pub fn select(cases: &[Case], patterns: &[String], prefaults: &[Prefault]) -> Result<Vec<Case>, SelectError> {
    let mut globs = Vec::new();
    for p in patterns {
        let glob = glob::Pattern::new(p).map_err(|e| SelectError::BadGlob {
            pattern: p.clone(),
            reason: e.msg.to_owned(),
        })?;
        globs.push((p, glob, p.contains('.')));
    }
    let matches = |case: &Case, glob: &glob::Pattern, whole: bool| {
        if whole {
            glob.matches(&case.name())
        } else {
            glob.matches(&case.variant())
        }
    };
    for (p, glob, whole) in &globs {
        if !cases.iter().any(|c| matches(c, glob, *whole)) {
            return Err(SelectError::NoMatch((*p).clone()));
        }
    }
    Ok(cases
        .iter()
        .filter(|c| prefaults.contains(&c.prefault))
        .filter(|c| globs.is_empty() || globs.iter().any(|(_, g, w)| matches(c, g, *w)))
        .copied()
        .collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_primer_takes_one_huge_page_at_most_and_never_a_gigabyte() {
        let size = |b: u64| ByteSize::new(b).unwrap();
        let w = |backing, bytes| Workload {
            case: Case {
                mode: Some(DmaMode::VfioType1Iommu),
                backing,
                prefault: Prefault::None,
            },
            size: size(bytes),
            thp: Thp::Never,
        };
        let primer = |backing, bytes| w(backing, bytes).primer().map(|p| p.size.bytes());
        assert_eq!(primer(Backing::Anonymous, 64 << 20), Some(PRIMER_BYTES));
        assert_eq!(primer(Backing::Memfd, 8192), Some(8192));
        assert_eq!(primer(Backing::MemfdHugetlb2mb, 64 << 20), Some(2 << 20));
        assert_eq!(primer(Backing::AnonymousHugetlb1gb, 1 << 30), None);
        let p = w(Backing::Memfd, 64 << 20).primer().unwrap();
        assert_eq!((p.case, p.thp), (w(Backing::Memfd, 1 << 20).case, Thp::Never));
    }

    fn names(patterns: &[&str]) -> Result<Vec<String>, SelectError> {
        let p: Vec<String> = patterns.iter().map(ToString::to_string).collect();
        Ok(
            select(&all_cases(), &p, &[Prefault::None, Prefault::Populate, Prefault::Touch])?
                .iter()
                .map(Case::name)
                .collect(),
        )
    }

    #[test]
    fn matrix_is_complete_and_named_like_the_selftests() {
        let all = all_cases();
        assert_eq!(all.len(), 6 * 6 * 3);
        let n: Vec<String> = all.iter().map(Case::name).collect();
        assert!(n.contains(&"none_anonymous_hugetlb_2mb.populate".to_string()));
        assert!(n.contains(&"vfio_type1_iommu_memfd_hugetlb_1gb.none".to_string()));
        assert!(n.contains(&"iommufd_memfd_hugetlb_1gb.touch".to_string()));
    }

    #[test]
    fn globs_select() {
        assert_eq!(names(&["none_*"]).unwrap().len(), 6 * 3);
        assert_eq!(
            names(&["none_anonymous.populate"]).unwrap(),
            ["none_anonymous.populate"]
        );
        assert_eq!(
            names(&["iommufd_memfd_hugetlb_1gb.*"]).unwrap(),
            [
                "iommufd_memfd_hugetlb_1gb.none",
                "iommufd_memfd_hugetlb_1gb.populate",
                "iommufd_memfd_hugetlb_1gb.touch"
            ]
        );
        // A bare variant name selects its prefaults, as `-v` does in the selftests.
        assert_eq!(names(&["none_memfd"]).unwrap().len(), 3);
        assert_eq!(names(&["none_anonymous", "none_memfd.touch"]).unwrap().len(), 4);
        assert_eq!(names(&[]).unwrap().len(), all_cases().len());
    }

    #[test]
    fn bad_globs_are_errors() {
        assert!(matches!(names(&["nothing_*"]), Err(SelectError::NoMatch(_))));
        assert!(matches!(names(&["none_[a"]), Err(SelectError::BadGlob { .. })));
        assert!(matches!(names(&["none_*", "zzz"]), Err(SelectError::NoMatch(_))));
    }

    #[test]
    fn prefault_filter() {
        let only = select(&all_cases(), &["none_anonymous".into()], &[Prefault::Touch]).unwrap();
        assert_eq!(
            only.iter().map(Case::name).collect::<Vec<_>>(),
            ["none_anonymous.touch"]
        );
    }
}
