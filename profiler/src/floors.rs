//! What this machine can do at best, measured at the start of a run with nothing attached:
//! the floors the per-page costs of a case are held against. Clearing memory (what the kernel
//! does to every page it hands out), one 4 KiB fault taken from user space (allocation,
//! zeroing and the page-table update together), and one empty ioctl on the VFIO container (the
//! fixed cost any DMA ioctl pays). A few hundred milliseconds in all.
use std::{hint::black_box, sync::atomic::AtomicBool, time::Instant};

use serde::{Deserialize, Serialize};

use crate::{
    dma,
    matrix::{Backing, Case, Prefault, Thp, Workload},
    phase::Phase,
    size::ByteSize,
    workload::{self, PhaseObserver},
};

/// Bytes cleared per pass of the clear measurement: one 2 MiB hugepage, what `folio_zero_user`
/// clears per THP or hugetlb fault.
const CLEAR_BYTES: usize = 2 << 20;
/// Passes over it (128 MiB in all).
const CLEAR_PASSES: u32 = 64;
/// The buffer the fault measurement touches page by page (4096 faults of 4 KiB).
const FAULT_BYTES: u64 = 16 << 20;
/// Empty ioctls timed.
const IOCTLS: u32 = 2000;
/// Each floor is the best of this many tries: a floor is what the machine can do, and
/// interruptions only ever make a try slower.
const TRIES: usize = 3;

/// This machine's floors (report.json `floors`).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Floors {
    /// Memory clear bandwidth, GiB/s.
    pub clear_gib_per_s: f64,
    /// How it was measured.
    pub clear_how: String,
    /// One 4 KiB fault from user space, ns (allocation, zeroing, page-table update).
    pub fault_4k_ns: Option<u64>,
    /// How it was measured (or why not).
    pub fault_how: String,
    /// One empty ioctl on the VFIO container, ns (None: no /dev/vfio/vfio here).
    pub empty_ioctl_ns: Option<u64>,
    /// How it was measured (or why not).
    pub ioctl_how: String,
}

/// Measures every floor (call it with every probe detached: the floors are untraced).
pub fn measure() -> Floors {
    let clear = best(clear_gib_per_s);
    let fault = (0..TRIES).filter_map(|_| fault_4k_ns().ok()).min();
    let ioctl = (0..TRIES).filter_map(|_| dma::empty_ioctl_ns(IOCTLS)).min();
    Floors {
        clear_gib_per_s: clear,
        clear_how: format!(
            "{} MiB buffer zeroed {CLEAR_PASSES} times from user space (memset: `rep stosb` or vector \
             stores, as the kernel's clear_page), best of {TRIES}",
            CLEAR_BYTES >> 20
        ),
        fault_4k_ns: fault,
        fault_how: match fault {
            Some(_) => format!(
                "{} MiB anonymous buffer with MADV_NOHUGEPAGE written once per 4 KiB page (one fault each), \
                 wall time per page, best of {TRIES}",
                FAULT_BYTES >> 20
            ),
            None => "the fault measurement failed (mmap refused)".into(),
        },
        empty_ioctl_ns: ioctl,
        ioctl_how: match ioctl {
            Some(_) => format!("VFIO_GET_API_VERSION on /dev/vfio/vfio, {IOCTLS} calls, best of {TRIES}"),
            None => "no /dev/vfio/vfio on this machine".into(),
        },
    }
}

/// Bytes the pace clears each time it is taken: four passes over one 2 MiB buffer, a few
/// milliseconds under emulation and well under one on hardware.
const PACE_PASSES: u32 = 4;

/// The machine's pace beside a case's untraced iterations: a fixed user-space clear timed
/// right before each one. Its times move with what the machine gives this process at that
/// moment (a host that steals the vCPU, a clock that drops), not with the kernel under test,
/// so two runs whose paces differ were measured on machines of different speed.
pub struct Pace {
    buf: Vec<u8>,
}

impl Pace {
    /// A pace with its buffer written once (faulted in), so that no timing holds a fault.
    pub fn new() -> Self {
        Self {
            buf: vec![1u8; CLEAR_BYTES],
        }
    }

    /// One timing of the clear, ns.
    pub fn take(&mut self) -> u64 {
        let start = Instant::now();
        clear(&mut self.buf, PACE_PASSES);
        start.elapsed().as_nanos() as u64
    }

    /// What [`Pace::take`] times, for the report.
    pub fn how() -> String {
        format!(
            "{} MiB cleared from user space ({PACE_PASSES} passes over one {} MiB buffer) right before each \
             untraced iteration",
            (CLEAR_BYTES as u64 * u64::from(PACE_PASSES)) >> 20,
            CLEAR_BYTES >> 20
        )
    }
}

impl Default for Pace {
    fn default() -> Self {
        Self::new()
    }
}

/// The largest of [`TRIES`] measurements.
fn best(f: fn() -> f64) -> f64 {
    (0..TRIES).map(|_| f()).fold(0.0, f64::max)
}

fn clear_gib_per_s() -> f64 {
    let mut buf = vec![1u8; CLEAR_BYTES];
    let start = Instant::now();
    clear(&mut buf, CLEAR_PASSES);
    let secs = start.elapsed().as_secs_f64().max(1e-9);
    (CLEAR_BYTES as f64 * f64::from(CLEAR_PASSES)) / (1u64 << 30) as f64 / secs
}

/// Clears `buf` `passes` times.
fn clear(buf: &mut [u8], passes: u32) {
    for pass in 0..passes {
        buf.fill(0);
        // Keep every pass: the compiler may not fold repeated clears of a buffer nobody reads.
        black_box(&mut *buf);
        buf[pass as usize] = 1;
    }
}

/// Times the touch phase of dmaprof's own workload on a small 4 KiB buffer.
fn fault_4k_ns() -> Result<u64, workload::WorkloadError> {
    let size = ByteSize::new(FAULT_BYTES).expect("a valid constant size");
    Ok(touch_4k_ns(size)? / (FAULT_BYTES / 4096))
}

/// Wall ns of the touch phase of dmaprof's own workload on a fresh anonymous buffer of `size`
/// in 4 KiB pages (MADV_NOHUGEPAGE): one user fault, page allocation and zeroing per page.
/// Mapping and unmapping it are not timed.
pub fn touch_4k_ns(size: ByteSize) -> Result<u64, workload::WorkloadError> {
    fault_4k_ns_by(size, Backing::Anonymous, Prefault::Touch)
}

/// Wall ns of faulting in a fresh buffer of `size` with `backing` in 4 KiB pages
/// (MADV_NOHUGEPAGE), one fault a page: by user writes (the touch phase) or by the kernel's
/// own page walk (populate: MADV_POPULATE_WRITE inside the mmap phase). Nothing else is timed.
pub fn fault_4k_ns_by(size: ByteSize, backing: Backing, prefault: Prefault) -> Result<u64, workload::WorkloadError> {
    let w = Workload {
        case: Case {
            mode: None,
            backing,
            prefault,
        },
        size,
        thp: Thp::Never,
    };
    let phase = match prefault {
        Prefault::Touch => Phase::Touch,
        _ => Phase::Mmap,
    };
    let runs = workload::run_iteration(&w, None, &mut Untimed, &AtomicBool::new(false))?;
    Ok(runs.iter().find(|r| r.phase == phase).map_or(0, |r| r.wall_ns))
}

/// No phase is recorded anywhere.
struct Untimed;

impl PhaseObserver for Untimed {
    fn begin(&mut self, _: Phase) {}
    fn end(&mut self, _: Phase) {}
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn floors_are_measured_here() {
        let f = measure();
        assert!(
            f.clear_gib_per_s > 0.05,
            "clearing memory at {} GiB/s",
            f.clear_gib_per_s
        );
        let fault = f.fault_4k_ns.expect("a 4 KiB fault can be taken here");
        // A fault costs at least the clear of its page and no more than a millisecond.
        let clear_4k_ns = 4096.0 / (f.clear_gib_per_s * (1u64 << 30) as f64) * 1e9;
        assert!(
            fault as f64 >= clear_4k_ns * 0.5 && fault < 1_000_000,
            "{fault} ns per fault"
        );
        assert_eq!(
            f.empty_ioctl_ns.is_some(),
            std::path::Path::new("/dev/vfio/vfio").exists()
        );
    }
}
