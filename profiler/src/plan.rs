//! The options of `dmaprof run` and the plan made from them before anything runs: which cases
//! run and why the others cannot run on this host.
use std::{path::PathBuf, time::Instant};

use crate::{
    facts::{Capabilities, CapabilityId, has},
    matrix::{self, Case, DmaMode, Prefault, Thp},
    probes::{Mechanism, Pass},
    report::Skipped,
    size::{ByteSize, HumanSize},
    sys,
};

/// Options of `dmaprof run`, validated.
#[derive(Clone, Debug)]
pub struct RunOptions {
    /// The largest buffer size (what must fit in memory).
    pub size: ByteSize,
    /// Every buffer size, ascending: each case runs at each (a size sweep when more than one).
    pub sizes: Vec<ByteSize>,
    /// -v patterns.
    pub variants: Vec<String>,
    /// Prefaults to run.
    pub prefaults: Vec<Prefault>,
    /// Untraced iterations per case (the headline wall times).
    pub iterations: u32,
    /// Iterations of each traced pass (exact, sampled) per case.
    pub traced_iterations: u32,
    /// The passes to run.
    pub passes: Vec<Pass>,
    /// Sampling frequency.
    pub freq_hz: u64,
    /// Output directory.
    pub out: PathBuf,
    /// PCI address of the device to DMA-map for (-d, or VFIO_SELFTESTS_BDF).
    pub device: Option<String>,
    /// Bind the device to vfio-pci for the run if it is bound elsewhere.
    pub bind: bool,
    /// Testing: entries of the sampled-stack map (small values force lost samples).
    pub sample_map_entries: Option<u32>,
    /// Testing: arm the kernel's fault injection around each map ioctl.
    pub fail_map_allocs: bool,
    /// When the process started (for the start-up time in the report).
    pub started: Instant,
    /// Which probe mechanisms to attach.
    pub mechanisms: Vec<Mechanism>,
    /// Transparent huge pages for base-page backings.
    pub thp: Thp,
    /// The share of a syscall phase the exact pass's probe rows may cost before the hottest
    /// are demoted (a fraction: 0.03).
    pub demote_above: f64,
    /// Run a primer iteration after every probe switch (see [`crate::matrix::Workload::primer`]).
    pub prime: bool,
    /// The pause before each iteration of a base-page case (`--settle`).
    pub settle: std::time::Duration,
}

/// Case selection and per-case skip reasons, decided before anything runs.
#[derive(Clone, Debug)]
pub struct Plan {
    /// Cases that will run.
    pub run: Vec<Case>,
    /// Cases that will not, with why.
    pub skipped: Vec<Skipped>,
}

impl Plan {
    /// What will run and what will not (skip reasons grouped), as printed before a run.
    pub fn summary(&self, out: &std::path::Path) -> String {
        let mut text = format!(
            "dmaprof: {} case(s) to run, {} skipped; output in {}\n",
            self.run.len(),
            self.skipped.len(),
            out.display()
        );
        let mut reasons: Vec<(&str, usize)> = Vec::new();
        for s in &self.skipped {
            match reasons.iter_mut().find(|(r, _)| *r == s.reason) {
                Some((_, n)) => *n += 1,
                None => reasons.push((&s.reason, 1)),
            }
        }
        for (reason, n) in reasons {
            text += &format!("dmaprof:   skipping {n} case(s): {reason}\n");
        }
        text
    }
}

/// Why a plan cannot be made (a usage error: the command line must change).
#[derive(Debug, thiserror::Error)]
pub enum PlanError {
    /// A -v pattern is bad or matches nothing.
    #[error(transparent)]
    Select(#[from] matrix::SelectError),
    /// Nothing selected.
    #[error("no case selected: check -v and --prefault")]
    Empty,
    /// The buffer does not fit.
    #[error("-b {size} does not fit in available memory ({available}): choose a smaller size")]
    TooLarge {
        /// Asked for.
        size: ByteSize,
        /// MemAvailable.
        available: HumanSize,
    },
}

/// Why this host cannot run `case` (None: it can), from the capabilities found.
pub fn cannot_run(case: &Case, opts: &RunOptions, caps: &Capabilities) -> Option<String> {
    let page = case.backing.page_size();
    if let Some(size) = opts.sizes.iter().find(|s| !s.is_multiple_of(page)) {
        return Some(format!(
            "size {size} is not a multiple of the {} page size",
            HumanSize(page)
        ));
    }
    let mode = case.mode?;
    // The most fundamental missing piece first: a kernel without the interface, then the device.
    let missing = |id| !has(caps, id);
    let kernel = match mode {
        DmaMode::VfioType1Iommu | DmaMode::VfioType1v2Iommu if missing(CapabilityId::VfioType1) => {
            Some("kernel has no VFIO type1 container (/dev/vfio/vfio)".into())
        }
        m if m.is_iommufd() && missing(CapabilityId::Iommufd) => Some("kernel has no IOMMUFD".into()),
        DmaMode::Iommufd if missing(CapabilityId::VfioCdev) => {
            Some("kernel has no VFIO cdev (CONFIG_VFIO_DEVICE_CDEV)".into())
        }
        DmaMode::Iommufd if case.backing.memfd() && missing(CapabilityId::MapFile) => {
            Some("kernel has no IOMMU_IOAS_MAP_FILE (added in 6.13)".into())
        }
        _ => None,
    };
    kernel.or_else(|| {
        opts.device
            .is_none()
            .then(|| "needs a VFIO device: give -d BDF (or set VFIO_SELFTESTS_BDF), or use `cargo xtask vm`".into())
    })
}

/// Selects the cases and says which cannot run here.
pub fn plan(opts: &RunOptions, caps: &Capabilities) -> Result<Plan, PlanError> {
    let cases = matrix::select(&matrix::all_cases(), &opts.variants, &opts.prefaults)?;
    if cases.is_empty() {
        return Err(PlanError::Empty);
    }
    let (mut run, mut skipped) = (Vec::new(), Vec::new());
    for case in cases {
        match cannot_run(&case, opts, caps) {
            Some(reason) => skipped.push(Skipped {
                name: case.name(),
                reason,
            }),
            None => run.push(case),
        }
    }
    if run.iter().any(|c| c.backing.hugetlb_kb().is_none())
        && let Some(avail) = sys::mem_available()
        && opts.size.bytes() > avail / 10 * 9
    {
        return Err(PlanError::TooLarge {
            size: opts.size,
            available: HumanSize(avail / 4096 * 4096),
        });
    }
    Ok(Plan { run, skipped })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::facts::Capability;

    fn opts(size: &str, device: Option<&str>) -> RunOptions {
        RunOptions {
            size: size.parse().unwrap(),
            sizes: vec![size.parse().unwrap()],
            variants: Vec::new(),
            prefaults: vec![Prefault::None],
            iterations: 1,
            traced_iterations: 1,
            passes: vec![Pass::Untraced],
            freq_hz: 1,
            out: PathBuf::new(),
            device: device.map(Into::into),
            bind: false,
            sample_map_entries: None,
            fail_map_allocs: false,
            started: Instant::now(),
            mechanisms: Vec::new(),
            thp: Thp::System,
            demote_above: crate::attribution::DEMOTE_ABOVE,
            prime: true,
            settle: std::time::Duration::ZERO,
        }
    }

    fn reason(name: &str, o: &RunOptions, caps: &Capabilities) -> Option<String> {
        let case = matrix::all_cases().into_iter().find(|c| c.name() == name).unwrap();
        cannot_run(&case, o, caps)
    }

    #[test]
    fn skip_reasons_follow_the_capabilities() {
        let mut caps = Capabilities::new();
        caps.insert(CapabilityId::VfioType1, Capability::yes(""));
        let o = opts("2M", Some("0000:00:01.0"));
        assert_eq!(reason("none_anonymous.none", &o, &caps), None);
        assert_eq!(reason("vfio_type1_iommu_anonymous.none", &o, &caps), None);
        assert_eq!(
            reason("iommufd_memfd.none", &o, &caps).as_deref(),
            Some("kernel has no IOMMUFD")
        );
        caps.insert(CapabilityId::Iommufd, Capability::yes(""));
        caps.insert(CapabilityId::VfioCdev, Capability::yes(""));
        assert!(reason("iommufd_memfd.none", &o, &caps).unwrap().contains("MAP_FILE"));
        assert_eq!(reason("iommufd_anonymous.none", &o, &caps), None);
        assert!(
            reason("none_anonymous_hugetlb_1gb.none", &o, &caps)
                .unwrap()
                .contains("not a multiple")
        );
        let no_dev = opts("2M", None);
        assert!(
            reason("vfio_type1_iommu_memfd.none", &no_dev, &caps)
                .unwrap()
                .contains("-d BDF")
        );
        // Without the kernel interface, that is the reason, not the missing device.
        let bare = Capabilities::new();
        assert_eq!(
            reason("iommufd_memfd.none", &no_dev, &bare).as_deref(),
            Some("kernel has no IOMMUFD")
        );
    }
}
