//! The phases of one iteration, as names: a leaf module, so that [`crate::stop`] can name the
//! phase a signal landed in without importing the workload (which imports what stop serves).
//! [`crate::workload`] re-exports them.
use serde::{Deserialize, Serialize};

/// A timed step of one iteration.
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
    clap::ValueEnum,
)]
#[serde(rename_all = "snake_case")]
#[strum(serialize_all = "snake_case")]
#[clap(rename_all = "snake_case")]
pub enum Phase {
    /// memfd_create + ftruncate (memfd backings).
    MemfdCreate,
    /// mmap (with MAP_POPULATE when prefault is populate).
    Mmap,
    /// User space writes one byte per page (prefault touch).
    Touch,
    /// The DMA map ioctl.
    Map,
    /// The DMA unmap ioctl.
    Unmap,
    /// munmap.
    Munmap,
    /// close of the memfd.
    Close,
}

/// Every phase, in execution order.
pub const PHASES: &[Phase] = &[
    Phase::MemfdCreate,
    Phase::Mmap,
    Phase::Touch,
    Phase::Map,
    Phase::Unmap,
    Phase::Munmap,
    Phase::Close,
];

impl Phase {
    /// Name in reports.
    pub fn name(self) -> &'static str {
        self.into()
    }

    /// Whether the phase is a DMA ioctl (the only phases that pin or unpin).
    pub fn is_dma(self) -> bool {
        matches!(self, Phase::Map | Phase::Unmap)
    }

    /// Whether the phase is one system call, so that all its kernel time is syscall time
    /// (touch is page faults taken from user space).
    pub fn is_syscall(self) -> bool {
        self != Phase::Touch
    }

    /// Position in [`PHASES`].
    pub fn index(self) -> usize {
        PHASES.iter().position(|p| *p == self).unwrap_or(0)
    }
}
