//! What dmaprof probes: the probe table (kernel functions timed exactly), the tracepoints and
//! the sampler, the mechanisms a user can select, and the per-probe attach status the report
//! records. [`crate::loader`] attaches what this module declares.
use serde::{Deserialize, Serialize};

use crate::{abi, category::Category, matrix::DmaMode};

/// Unit of a probe row's summed size argument.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize, strum::IntoStaticStr)]
#[serde(rename_all = "snake_case")]
#[strum(serialize_all = "snake_case")]
pub enum AmountUnit {
    /// A page count.
    Pages,
    /// A byte count.
    Bytes,
}

/// One row of the probe table: a kernel function and the argument it sums.
#[derive(Clone, Copy, Debug)]
pub struct ProbeRow {
    /// Kernel function (vmlinux or module).
    pub function: &'static str,
    /// Argument (0-based) summed per row, and its unit.
    pub amount: Option<(u8, AmountUnit)>,
    /// Which DMA API's calls can reach the function.
    pub reach: Reach,
}

/// Which cases can call a row's function: a case attaches only the rows it can reach, since
/// each attach and detach of a row costs tens of milliseconds (text patching, RCU grace
/// periods), per case and pass switch.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Reach {
    /// Memory management and the IOMMU core: every case.
    Any,
    /// The VFIO type1 driver (`vfio_iommu_type1`): the VFIO container modes only.
    Type1,
    /// iommufd, natively or as a VFIO container.
    Iommufd,
}

impl Reach {
    /// Whether a case of `mode` (None: memory phases only) can call the function.
    pub fn reached_by(self, mode: Option<DmaMode>) -> bool {
        match self {
            Reach::Any => true,
            Reach::Type1 => mode.is_some_and(|m| !m.is_iommufd()),
            Reach::Iommufd => mode.is_some_and(DmaMode::is_iommufd),
        }
    }
}

impl ProbeRow {
    /// The same row, reached only by `reach`'s cases.
    const fn only(self, reach: Reach) -> Self {
        Self { reach, ..self }
    }

    /// The category its exclusive time counts as: the category table's, like samples.
    pub fn category(&self) -> Category {
        crate::category::of_function(self.function)
    }
}

const fn row(function: &'static str) -> ProbeRow {
    ProbeRow {
        function,
        amount: None,
        reach: Reach::Any,
    }
}

const fn pages(function: &'static str, arg: u8) -> ProbeRow {
    ProbeRow {
        function,
        amount: Some((arg, AmountUnit::Pages)),
        reach: Reach::Any,
    }
}

const fn bytes(function: &'static str, arg: u8) -> ProbeRow {
    ProbeRow {
        function,
        amount: Some((arg, AmountUnit::Bytes)),
        reach: Reach::Any,
    }
}

/// The probe table: every function dmaprof times exactly. It drives attaching (an fentry/fexit
/// or kprobe/kretprobe pair per row) and reporting. Nesting is resolved in BPF: a row's
/// exclusive time excludes the probed rows it calls, so categories never double count (the
/// faults inside `pin_user_pages_remote` of an unpopulated map are faulting, not pinning).
/// The ioctl entry points and the VFIO/iommufd functions around the probed calls count as
/// `bookkeeping`: their exclusive time is the driver's own work.
pub const PROBE_TABLE: &[ProbeRow] = &[
    // VFIO type1 (module vfio_iommu_type1).
    row("vfio_iommu_type1_ioctl").only(Reach::Type1),
    row("vfio_dma_do_map").only(Reach::Type1),
    row("vfio_pin_map_dma").only(Reach::Type1),
    pages("vfio_pin_pages_remote", 2).only(Reach::Type1),
    pages("vaddr_get_pfns", 2).only(Reach::Type1),
    pages("vfio_iommu_map", 3).only(Reach::Type1),
    row("vfio_unmap_unpin").only(Reach::Type1),
    row("vfio_sync_unpin").only(Reach::Type1),
    pages("vfio_unpin_pages_remote", 3).only(Reach::Type1),
    row("vfio_lock_acct").only(Reach::Type1),
    // iommufd (module iommufd).
    row("iommufd_ioas_map").only(Reach::Iommufd),
    row("iommufd_ioas_map_file").only(Reach::Iommufd),
    row("iommufd_vfio_map_dma").only(Reach::Iommufd),
    row("iommufd_ioas_unmap").only(Reach::Iommufd),
    row("iopt_map_user_pages").only(Reach::Iommufd),
    row("iopt_map_file_pages").only(Reach::Iommufd),
    row("iopt_area_fill_domains").only(Reach::Iommufd),
    row("pfn_reader_first").only(Reach::Iommufd),
    row("pfn_reader_next").only(Reach::Iommufd),
    row("pfn_reader_user_pin").only(Reach::Iommufd),
    row("batch_to_domain").only(Reach::Iommufd),
    row("iopt_pages_update_pinned").only(Reach::Iommufd),
    row("iopt_area_unfill_domains").only(Reach::Iommufd),
    row("__iopt_area_unfill_domain").only(Reach::Iommufd),
    row("batch_from_domain").only(Reach::Iommufd),
    row("batch_unpin").only(Reach::Iommufd),
    // GUP.
    pages("pin_user_pages_remote", 2),
    pages("pin_user_pages_fast", 1),
    row("memfd_pin_folios"),
    // One call per folio the file lacks: the allocation (and zeroing) inside memfd_pin_folios.
    row("memfd_alloc_folio"),
    pages("__get_user_pages", 2),
    // Faults and zeroing.
    row("handle_mm_fault"),
    row("hugetlb_fault"),
    row("folio_zero_user"),
    row("clear_huge_page"),
    // A new page's own zeroing when init_on_alloc is on (Debian's default) or the caller asked
    // for __GFP_ZERO: outside folio_zero_user, and as long again for a THP. Whichever of the
    // two the build did not inline.
    row("prep_new_page"),
    row("post_alloc_hook"),
    // IOMMU core.
    bytes("iommu_map", 3),
    bytes("iommu_map_nosync", 3),
    bytes("iommu_sync_map", 2),
    bytes("iommu_unmap", 2),
    bytes("iommu_unmap_fast", 2),
    row("iommu_iotlb_sync"),
    // The core's sync is inlined on current kernels: the Intel driver's flush hooks stand in.
    row("intel_iommu_iotlb_sync_map"),
    row("intel_flush_iotlb_all"),
    row("intel_iommu_tlb_sync"),
    // locked_vm accounting.
    pages("__account_locked_vm", 1),
    pages("account_locked_vm", 1),
    // Release: munmap's zap, page-table freeing and TLB flush, and a memfd's page cache freed
    // at its last close. Once per call each, so they cost nothing to probe.
    row("unmap_region"),
    row("unmap_vmas"),
    row("tlb_finish_mmu"),
    row("shmem_undo_range"),
];

/// What one probed call costs on the running kernel, per mechanism (None: not measured).
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct ProbeCost {
    /// An fentry/fexit pair off the fault path: the geometric mean of its cost per hit in a
    /// tight syscall loop and inside user page faults, where both were measured (a
    /// workload's syscall-side hits land between the two: among page walks and IOMMU writes,
    /// which leave the probe colder than the loop and warmer than a fault), else the loop's;
    /// its own share from the loop. A hit on the fault path costs what the faults' context
    /// measured (`in_fault`, `in_kernel_fault`).
    pub fentry: Option<CallCost>,
    /// A kprobe/kretprobe pair, measured as `fentry` is.
    pub kprobe: Option<CallCost>,
    /// One raw tracepoint hit (page allocation, user fault, syscall entry or exit): all of
    /// it lands where the event happened, so its `own_share` is 0.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tracepoint: Option<CallCost>,
    /// The pairs' cost per hit on getppid() calls, each timed beside an unprobed call.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub in_syscall_loop: Option<ContextCost>,
    /// The pairs' cost per hit inside user page faults of fresh 4 KiB pages: what a hit on
    /// the fault path costs in a touch.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub in_fault: Option<ContextCost>,
    /// The pairs' cost per hit inside page faults of fresh 4 KiB pages that the kernel's page
    /// walk takes (MADV_POPULATE_WRITE): what a hit on the fault path costs in a populate or
    /// in a pin that faults pages in.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub in_kernel_fault: Option<ContextCost>,
    /// Why a mechanism the rows use could not be measured.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub errors: Vec<String>,
}

/// What a probed call costs in one context, per mechanism, in ns (None: not measured there).
#[derive(Clone, Copy, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct ContextCost {
    /// An fentry/fexit pair.
    pub fentry_ns: Option<f64>,
    /// A kprobe/kretprobe pair.
    pub kprobe_ns: Option<f64>,
}

impl ContextCost {
    /// The cost of a call caught by `by`, ns.
    pub fn of(&self, by: AttachedBy) -> Option<f64> {
        match by {
            AttachedBy::Fentry => self.fentry_ns,
            AttachedBy::Kprobe => self.kprobe_ns,
            _ => None,
        }
    }

    /// Sets the cost of a call caught by `by` (a row mechanism; others are ignored).
    pub fn set(&mut self, by: AttachedBy, ns: Option<f64>) {
        match by {
            AttachedBy::Fentry => self.fentry_ns = ns,
            AttachedBy::Kprobe => self.kprobe_ns = ns,
            _ => {}
        }
    }
}

impl ProbeCost {
    /// This calibration with the pairs' per-hit costs of one context (`in_syscall_loop` or
    /// `in_fault`) in place of the charged ones, where that context measured them.
    pub fn in_context(&self, context: Option<ContextCost>) -> ProbeCost {
        let with = |c: Option<CallCost>, ns: Option<f64>| {
            c.map(|c| CallCost {
                ns: ns.unwrap_or(c.ns),
                ..c
            })
        };
        let ctx = context.unwrap_or_default();
        ProbeCost {
            fentry: with(self.fentry, ctx.fentry_ns),
            kprobe: with(self.kprobe, ctx.kprobe_ns),
            ..self.clone()
        }
    }

    /// Sets the cost of a call caught by `by` (a row mechanism; others are ignored).
    pub fn set(&mut self, by: AttachedBy, cost: Option<CallCost>) {
        match by {
            AttachedBy::Fentry => self.fentry = cost,
            AttachedBy::Kprobe => self.kprobe = cost,
            _ => {}
        }
    }

    /// The cost of a call caught by `by`.
    pub fn of(&self, by: AttachedBy) -> Option<CallCost> {
        match by {
            AttachedBy::Fentry => self.fentry,
            AttachedBy::Kprobe => self.kprobe,
            _ => None,
        }
    }
}

/// The cost of one probed call.
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
pub struct CallCost {
    /// Wall time the call gains, in ns.
    pub ns: f64,
    /// The share of that inside the call's own entry-to-return time; the rest lands in its
    /// caller's exclusive time.
    pub own_share: f64,
}

impl CallCost {
    /// This cost measured in a syscall loop, charged between it and `in_fault` ns a hit where
    /// that was measured too: their geometric mean (over- and underestimates by the same
    /// factor, whichever context a phase's hits resemble more). A fault leaves the probe no
    /// warmer than the loop does, so an `in_fault` below the loop's cost counts as the loop's.
    pub fn between(self, in_fault: Option<f64>) -> CallCost {
        CallCost {
            ns: in_fault.map_or(self.ns, |f| (f.max(self.ns) * self.ns).sqrt()),
            ..self
        }
    }
}

/// A tracepoint the memory phases use, attached as a raw tracepoint (cheaper per hit, and no
/// tracefs mount needed).
#[derive(Clone, Copy, Debug)]
pub struct Tracepoint {
    /// Program in the BPF object.
    pub program: &'static str,
    /// Tracepoint category.
    pub category: &'static str,
    /// Event name.
    pub event: &'static str,
    /// When it is attached.
    pub group: Group,
}

/// The tracepoints: syscall time per phase, user page-fault counts, page allocations by order.
pub const TRACEPOINTS: &[Tracepoint] = &[
    Tracepoint {
        program: abi::programs::SYS_ENTER,
        category: "raw_syscalls",
        event: "sys_enter",
        group: Group::Tracepoints,
    },
    Tracepoint {
        program: abi::programs::SYS_EXIT,
        category: "raw_syscalls",
        event: "sys_exit",
        group: Group::Tracepoints,
    },
    Tracepoint {
        program: abi::programs::PAGE_FAULT_USER,
        category: "exceptions",
        event: "page_fault_user",
        group: Group::Tracepoints,
    },
    Tracepoint {
        program: abi::programs::SCHED_SWITCH,
        category: "sched",
        event: "sched_switch",
        group: Group::Switches,
    },
    Tracepoint {
        program: abi::programs::PAGE_ALLOC,
        category: "kmem",
        event: "mm_page_alloc",
        group: Group::Scout,
    },
];

/// A probe mechanism that can be switched on or off (`dmaprof run --probes`), e.g. to measure
/// what each one costs.
#[derive(
    Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize, clap::ValueEnum, strum::EnumIter, strum::Display,
)]
#[serde(rename_all = "snake_case")]
#[strum(serialize_all = "snake_case")]
pub enum Mechanism {
    /// perf_event cpu-clock sampling of kernel stacks (the flamegraphs).
    Samples,
    /// Raw tracepoints: syscall entry/exit and user page faults (counts, syscall time).
    Tracepoints,
    /// fentry + fexit on probe-table rows in vmlinux (exact entry/exit accounting; module
    /// functions need `kprobes`).
    Fentry,
    /// kprobe + kretprobe on probe-table rows (every row, or those fentry did not take).
    Kprobes,
}

impl Mechanism {
    /// All of them, the default: rows get fentry where it works, kprobes elsewhere.
    pub const ALL: [Mechanism; 4] = [
        Mechanism::Samples,
        Mechanism::Tracepoints,
        Mechanism::Fentry,
        Mechanism::Kprobes,
    ];
}

/// One pass over a case: what is attached while its iterations run.
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
    clap::ValueEnum,
    strum::EnumIter,
    strum::Display,
)]
#[serde(rename_all = "snake_case")]
#[strum(serialize_all = "snake_case")]
pub enum Pass {
    /// Nothing attached: the headline wall times.
    Untraced,
    /// Probe-table rows (fentry/kprobes) and the tracepoints, no sampling: the exact breakdown.
    Exact,
    /// The stack sampler only: sampled shares and flamegraphs.
    Sampled,
}

impl Pass {
    /// The probe groups attached during this pass.
    pub fn groups(self) -> &'static [Group] {
        match self {
            Pass::Untraced => &[],
            Pass::Exact => &[Group::Rows, Group::Tracepoints, Group::Switches],
            Pass::Sampled => &[Group::Sampler, Group::Switches],
        }
    }
}

/// Probes that are attached and detached together between passes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Group {
    /// The probe-table rows.
    Rows,
    /// The raw tracepoints.
    Tracepoints,
    /// Counts taken in the scout iteration only (page allocations by order): a hit per page
    /// allocated would cost the exact pass of a 4 KiB map about 8% of its time.
    Scout,
    /// The perf-event sampler.
    Sampler,
    /// The workload thread's switches off and back onto the CPU, in both traced passes: the
    /// sampler runs on the thread's CPU time and misses the rest of the wall time.
    Switches,
}

/// How one probe is (or would have been) attached.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize, strum::Display)]
#[serde(rename_all = "snake_case")]
#[strum(serialize_all = "snake_case")]
pub enum AttachedBy {
    /// fentry + fexit (BPF trampoline).
    Fentry,
    /// kprobe + kretprobe.
    Kprobe,
    /// A raw tracepoint.
    RawTracepoint,
    /// A perf event.
    PerfEvent,
}

/// Attachment state of one probe, as reported.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ProbeStatus {
    /// Kernel function, tracepoint or perf event.
    pub function: String,
    /// The mechanism it attached with, or the one that was tried last.
    pub mechanism: AttachedBy,
    /// Whether it is attached.
    pub attached: bool,
    /// Why not, if not.
    pub error: Option<String>,
}

/// The reason given for probes of a mechanism left off with `--probes`.
pub const NOT_REQUESTED: &str = "not requested (--probes)";

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_hit_is_charged_between_the_syscall_loop_and_the_page_faults() {
        let looped = CallCost {
            ns: 750.0,
            own_share: 0.5,
        };
        // Measured in twelve runs over four boots: 700-971 ns in the loop, 756-1556 in faults.
        let charged = looped.between(Some(1_200.0));
        assert!((charged.ns - 948.7).abs() < 0.1, "{charged:?}");
        assert_eq!(charged.own_share, 0.5, "the share inside the call is the loop's");
        assert_eq!(looped.between(None), looped);
        // Faults read cheaper than the loop: the machine's pace, and the loop's cost stands.
        assert_eq!(looped.between(Some(352.0)), looped);
        let cost = ProbeCost {
            fentry: Some(charged),
            kprobe: Some(looped),
            in_fault: Some(ContextCost {
                fentry_ns: Some(1_200.0),
                kprobe_ns: None,
            }),
            ..ProbeCost::default()
        };
        let faulted = cost.in_context(cost.in_fault);
        assert_eq!(faulted.fentry.unwrap().ns, 1_200.0);
        assert_eq!(
            faulted.kprobe,
            Some(looped),
            "a context that did not measure it keeps the charged"
        );
        assert_eq!(cost.in_context(None), cost);
    }

    #[test]
    fn the_probe_table_fits_the_bpf_side_and_has_no_duplicates() {
        assert!(PROBE_TABLE.len() <= abi::MAX_ROWS as usize);
        let mut names: Vec<&str> = PROBE_TABLE.iter().map(|r| r.function).collect();
        names.sort_unstable();
        names.dedup();
        assert_eq!(names.len(), PROBE_TABLE.len());
    }

    #[test]
    fn a_case_attaches_only_the_rows_its_dma_api_can_reach() {
        let reached = |mode: Option<DmaMode>| -> Vec<&str> {
            let rows = PROBE_TABLE.iter().filter(|r| r.reach.reached_by(mode));
            rows.map(|r| r.function).collect()
        };
        let type1 = reached(Some(DmaMode::VfioType1v2Iommu));
        let iommufd = reached(Some(DmaMode::IommufdCompatType1));
        let memory = reached(None);
        assert!(type1.contains(&"vfio_pin_pages_remote") && !type1.contains(&"iopt_area_fill_domains"));
        assert!(iommufd.contains(&"iopt_area_fill_domains") && !iommufd.contains(&"vfio_pin_pages_remote"));
        assert!(memory.contains(&"handle_mm_fault") && memory.contains(&"iommu_map"));
        assert_eq!(reached(Some(DmaMode::Iommufd)), iommufd);
        // The drivers' own functions are the only ones left out, by their prefixes.
        for r in PROBE_TABLE {
            let driver = [
                "vfio_",
                "vaddr_",
                "iommufd_",
                "iopt_",
                "pfn_reader_",
                "batch_",
                "__iopt_",
            ];
            let own = driver.iter().any(|p| r.function.starts_with(p));
            assert_eq!(own, r.reach != Reach::Any, "{}", r.function);
        }
    }

    #[test]
    fn rows_and_samples_share_one_category_table() {
        for r in PROBE_TABLE {
            assert_eq!(r.category(), crate::category::classify([r.function]), "{}", r.function);
        }
        let cat = |f: &str| PROBE_TABLE.iter().find(|r| r.function == f).unwrap().category();
        assert_eq!(cat("iopt_area_fill_domains"), Category::Bookkeeping);
        assert_eq!(cat("pin_user_pages_remote"), Category::Pinning);
        assert_eq!(cat("folio_zero_user"), Category::Zeroing);
        assert_eq!(cat("intel_flush_iotlb_all"), Category::IommuFlush);
        assert_eq!(cat("vfio_iommu_type1_ioctl"), Category::Bookkeeping);
        assert_eq!(cat("iopt_area_unfill_domains"), Category::Unpinning);
        assert_eq!(cat("vfio_unmap_unpin"), Category::IommuLookup);
        assert_eq!(cat("vfio_unpin_pages_remote"), Category::Unpinning);
        assert_eq!(cat("batch_from_domain"), Category::IommuLookup);
        assert_eq!(cat("vfio_lock_acct"), Category::Accounting);
    }

    #[test]
    fn status_keeps_its_json_words() {
        let s = ProbeStatus {
            function: "iommu_map".into(),
            mechanism: AttachedBy::RawTracepoint,
            attached: true,
            error: None,
        };
        assert_eq!(serde_json::to_value(&s).unwrap()["mechanism"], "raw_tracepoint");
        assert_eq!(Mechanism::Fentry.to_string(), "fentry");
    }
}
