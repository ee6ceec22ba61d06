//! The report: `report.json` (schema `dmaprof.report.v1`), its types and reading it back.
//! Rendering is elsewhere ([`crate::table`], [`crate::diff`]).
use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use crate::{
    category::Category,
    facts::{Capabilities, KernelInfo},
    matrix::{Backing, DmaMode, Prefault, Thp},
    probes::{AmountUnit, AttachedBy, Mechanism, Pass, ProbeCost, ProbeStatus},
    workload::Phase,
};

/// Schema tag of report.json.
pub const SCHEMA: &str = "dmaprof.report.v1";

/// A whole run.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct Report {
    /// Always [`SCHEMA`].
    pub schema: String,
    /// dmaprof's version.
    pub dmaprof_version: String,
    /// The kernel measured.
    pub kernel: KernelInfo,
    /// The device DMA was mapped for, if any.
    #[serde(default)]
    pub device: Option<String>,
    /// What the host can do (as `dmaprof doctor` reports it).
    pub capabilities: Capabilities,
    /// Run options.
    pub config: Config,
    /// Cases that ran.
    pub cases: Vec<CaseReport>,
    /// Cases that were selected but could not run here, with why.
    pub skipped: Vec<Skipped>,
    /// Cases that ran and failed, with the error.
    #[serde(default)]
    pub failed: Vec<Failed>,
    /// Locked or pinned memory a case left behind (empty when every case cleaned up).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub leaks: Vec<Leak>,
    /// Which probes attached (per run; the same for every case).
    #[serde(default)]
    pub probes: Vec<ProbeStatus>,
    /// What a probed call costs on this kernel, measured before the cases (None: no exact
    /// pass, or nothing could be measured).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub probe_cost: Option<ProbeCost>,
    /// How each case's cost grows with the size, when the run swept sizes (`-b` list).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub sweeps: Vec<Sweep>,
    /// What this machine can do at best (clear bandwidth, a 4 KiB fault, an empty ioctl),
    /// measured before anything was attached.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub floors: Option<crate::floors::Floors>,
    /// True when the run was interrupted and the report covers only what finished.
    #[serde(default)]
    pub partial: bool,
    /// What dmaprof itself cost: start-up and memory.
    #[serde(default)]
    pub timing: Timing,
}

/// dmaprof's own costs, for `cargo xtask bench`.
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
pub struct Timing {
    /// From process start to every requested probe attached.
    pub start_to_attached_ns: u64,
    /// Loading the BPF object and attaching the probes.
    pub attach_ns: u64,
    /// Peak resident set of the dmaprof process (VmHWM), the workload's buffers included.
    pub peak_rss_kib: u64,
    /// Where the cases' time went, summed over the cases.
    #[serde(default)]
    pub spent: Spent,
}

/// What a run spends its time on, case by case; each is summed over the cases (ns).
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct Spent {
    /// Reserving hugepages and opening and closing the DMA contexts.
    pub opening_ns: u64,
    /// The discarded warm-up iterations and the scouts.
    pub warm_up_ns: u64,
    /// Attaching one pass's probes and detaching the others'.
    pub switching_ns: u64,
    /// The discarded primer iterations after a switch.
    pub priming_ns: u64,
    /// The pauses before iterations (`--settle`).
    #[serde(default)]
    pub settling_ns: u64,
    /// The measured iterations of the untraced pass.
    pub untraced_ns: u64,
    /// The measured iterations of the exact pass.
    pub exact_ns: u64,
    /// The measured iterations of the sampled pass.
    pub sampled_ns: u64,
    /// Reading the probes' maps, attributing and writing a case's files.
    pub reporting_ns: u64,
}

/// One of the things [`Spent`] adds up.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Spend {
    /// See [`Spent::opening_ns`].
    Opening,
    /// See [`Spent::warm_up_ns`].
    WarmUp,
    /// See [`Spent::switching_ns`].
    Switching,
    /// See [`Spent::priming_ns`].
    Priming,
    /// See [`Spent::settling_ns`].
    Settling,
    /// A measured iteration of this pass.
    Iteration(Pass),
    /// See [`Spent::reporting_ns`].
    Reporting,
}

impl Spent {
    /// Adds `d` to what `what` took.
    pub fn add(&mut self, what: Spend, d: std::time::Duration) {
        let slot = match what {
            Spend::Opening => &mut self.opening_ns,
            Spend::WarmUp => &mut self.warm_up_ns,
            Spend::Switching => &mut self.switching_ns,
            Spend::Priming => &mut self.priming_ns,
            Spend::Settling => &mut self.settling_ns,
            Spend::Iteration(Pass::Untraced) => &mut self.untraced_ns,
            Spend::Iteration(Pass::Exact) => &mut self.exact_ns,
            Spend::Iteration(Pass::Sampled) => &mut self.sampled_ns,
            Spend::Reporting => &mut self.reporting_ns,
        };
        *slot += d.as_nanos() as u64;
    }

    /// Everything added up.
    pub fn total_ns(&self) -> u64 {
        self.opening_ns
            + self.warm_up_ns
            + self.switching_ns
            + self.priming_ns
            + self.settling_ns
            + self.untraced_ns
            + self.exact_ns
            + self.sampled_ns
            + self.reporting_ns
    }

    /// One line: the total, then each part in seconds.
    pub fn summary(&self) -> String {
        let s = |ns: u64| format!("{:.1}", ns as f64 / 1e9);
        format!(
            "cases took {} s: measured iterations untraced {} s, exact {} s, sampled {} s; \
             warm-up and scout {} s; switching probes {} s; priming {} s; settling {} s; opening {} s; reporting {} s",
            s(self.total_ns()),
            s(self.untraced_ns),
            s(self.exact_ns),
            s(self.sampled_ns),
            s(self.warm_up_ns),
            s(self.switching_ns),
            s(self.priming_ns),
            s(self.settling_ns),
            s(self.opening_ns),
            s(self.reporting_ns),
        )
    }
}

/// Run options.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct Config {
    /// Buffer size per case.
    pub size_bytes: u64,
    /// Untraced iterations per case.
    pub iterations: u32,
    /// Iterations of each traced pass per case.
    #[serde(default)]
    pub traced_iterations: u32,
    /// The passes run, in the order given.
    #[serde(default)]
    pub passes: Vec<Pass>,
    /// Stack sampling frequency.
    pub freq_hz: u64,
    /// The -v patterns.
    #[serde(default)]
    pub variants: Vec<String>,
    /// The prefaults selected.
    #[serde(default)]
    pub prefaults: Vec<Prefault>,
    /// False with no traced pass (--no-trace): no probe was loaded.
    #[serde(default = "yes")]
    pub traced: bool,
    /// The probe mechanisms requested (`--probes`).
    #[serde(default)]
    pub probes: Vec<Mechanism>,
    /// `--thp`.
    #[serde(default)]
    pub thp: Thp,
    /// Whether a primer iteration ran after each probe switch (false with `--no-prime`).
    #[serde(default = "yes")]
    pub prime: bool,
    /// The pause before each iteration of a base-page case, in ms (`--settle`; 0 in reports
    /// from before it).
    #[serde(default)]
    pub settle_ms: u64,
}

fn yes() -> bool {
    true
}

/// How one case's cost grows with the buffer size: a least-squares line per phase and
/// category over the sizes the run swept.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Sweep {
    /// The case (its name without the size).
    pub case: String,
    /// Its phases that moved memory or mapped it.
    pub phases: Vec<SweepPhase>,
    /// The plot of time against size (`<case>/sweep.svg`), if written.
    #[serde(default)]
    pub plot: Option<String>,
}

/// One phase of a [`Sweep`].
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct SweepPhase {
    /// Phase.
    pub phase: Phase,
    /// The fastest untraced iteration's wall time against the size.
    pub total: Fit,
    /// Each category's time against the size (its share of the phase times that fastest
    /// iteration), for the categories holding 2% or more of the phase at the largest size.
    pub categories: BTreeMap<Category, Fit>,
}

/// A least-squares line `fixed_ns + ns_per_gib * GiB` through measured points.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Fit {
    /// (bytes, ns) per size, ascending.
    pub points: Vec<(u64, u64)>,
    /// The line's value at size 0: the fixed cost per call.
    pub fixed_ns: f64,
    /// Its slope: the cost per GiB mapped.
    pub ns_per_gib: f64,
    /// Coefficient of determination (1: every point on the line).
    pub r2: f64,
    /// What the points say about growth.
    pub shape: Shape,
}

/// How a cost grows with the size.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize, strum::Display)]
#[serde(rename_all = "snake_case")]
#[strum(serialize_all = "snake_case")]
pub enum Shape {
    /// The same at every size (a fixed cost).
    Constant,
    /// In proportion to the size (R^2 >= 0.95).
    Linear,
    /// Faster than the size: each GiB costs more than the one before.
    SuperLinear,
    /// None of these: the points scatter.
    Noisy,
}

/// One case.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct CaseReport {
    /// `<mode>_<backing>.<prefault>`.
    pub name: String,
    /// IOMMU mode (`none`: memory phases only).
    #[serde(with = "mode_name")]
    pub iommu_mode: Option<DmaMode>,
    /// Backing.
    pub backing: Backing,
    /// Prefault.
    pub prefault: Prefault,
    /// The ioctl of the map phase (VFIO_IOMMU_MAP_DMA, IOMMU_IOAS_MAP, IOMMU_IOAS_MAP_FILE).
    #[serde(default)]
    pub map_ioctl: Option<String>,
    /// Buffer size.
    pub size_bytes: u64,
    /// Backing page size.
    #[serde(default)]
    pub page_size: u64,
    /// Phases in execution order.
    pub phases: Vec<PhaseReport>,
    /// Category-level flamegraph of the exact numbers (phase -> category -> function).
    #[serde(default)]
    pub summary_flamegraph: Option<String>,
    /// Rows its exact pass ran without, and why.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub demoted: Vec<DemotedRow>,
    /// Physical runs of the scout iteration's buffer, whose call counts the demoted rows
    /// keep (a 4 KiB buffer's pin and map calls follow its runs).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub scout_physical_runs: Option<u64>,
    /// Traced iterations run again because their buffer came in a layout far from the other
    /// traced pass's (`layout::far_apart`): the two passes' shares are then of like work.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub layout_reruns: Vec<LayoutRerun>,
    /// The machine's pace beside the untraced iterations: a fixed user-space clear timed
    /// right before each (`floors::Pace`), which `diff` holds two runs' speeds against.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pace_ns: Option<Stats>,
}

/// Median/min/max over iterations, plus every run.
#[derive(Clone, Debug, Default, Serialize, Deserialize, PartialEq)]
pub struct Stats {
    /// Median (mean of the middle two for even counts).
    pub median: u64,
    /// Minimum.
    pub min: u64,
    /// Maximum.
    pub max: u64,
    /// Every iteration's value, in order.
    pub runs: Vec<u64>,
}

impl Stats {
    /// Stats of `runs`.
    pub fn of(runs: Vec<u64>) -> Self {
        let mut s = runs.clone();
        s.sort_unstable();
        let median = match s.len() {
            0 => 0,
            n if n % 2 == 1 => s[n / 2],
            n => (s[n / 2 - 1] + s[n / 2]) / 2,
        };
        Self {
            median,
            min: s.first().copied().unwrap_or(0),
            max: s.last().copied().unwrap_or(0),
            runs,
        }
    }
}

fn untraced() -> Pass {
    Pass::Untraced
}

/// A confidence interval.
#[derive(Clone, Copy, Debug, Serialize, Deserialize, PartialEq)]
pub struct Interval {
    /// Lower bound.
    pub low: u64,
    /// Upper bound.
    pub high: u64,
    /// Its confidence level (0.95 = 95%).
    pub level: f64,
}

/// The distribution-free confidence interval of the median of `runs`: the narrowest pair of
/// order statistics `[x(j), x(n+1-j)]` that covers the median with probability >= 95% (the
/// binomial argument); with fewer than 6 runs no pair reaches 95% and the whole range is given
/// with the level it has. None for fewer than 2 runs.
pub fn median_ci(runs: &[u64]) -> Option<Interval> {
    let n = runs.len();
    if n < 2 {
        return None;
    }
    let mut v = runs.to_vec();
    v.sort_unstable();
    // P(Bin(n, 1/2) < j), summed term by term in f64 (n stays small).
    let below = |j: usize| (0..j).map(|i| binomial(n, i)).sum::<f64>() / 2f64.powi(n as i32);
    let mut j = 1;
    while j < n / 2 && 1.0 - 2.0 * below(j + 1) >= 0.95 {
        j += 1;
    }
    Some(Interval {
        low: v[j - 1],
        high: v[n - j],
        level: 1.0 - 2.0 * below(j),
    })
}

fn binomial(n: usize, k: usize) -> f64 {
    (0..k).fold(1.0, |acc, i| acc * (n - i) as f64 / (i + 1) as f64)
}

/// A traced pass's wall times for a phase and what tracing cost.
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
pub struct PassTimes {
    /// Wall time per iteration of this pass.
    pub wall_ns: Stats,
    /// This pass's wall time over the untraced one (None: no untraced pass, or the phase is
    /// under 1 ms, where a ratio is noise).
    pub ratio: Option<Ratio>,
    /// Physical runs of each iteration's buffer (same order as `wall_ns.runs`; None where
    /// the layout could not be read).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub physical_runs: Option<Stats>,
    /// The exact pass's probe cost over all its iterations, calibrated against measured
    /// (None for the sampled pass, or without a calibration or an untraced pass).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub probe_cost: Option<PassCost>,
}

/// What the probes cost the exact pass's iterations of a phase, summed over them: one
/// iteration's measured cost is as noisy as the untraced iterations around it (a 64 MiB 4 KiB
/// map's layout alternates between about 2000 and 16000 physical runs from one iteration to
/// the next), a pass's sum much less so.
#[derive(Clone, Copy, Debug, Default, Serialize, Deserialize, PartialEq)]
pub struct PassCost {
    /// Iterations summed.
    pub iterations: u32,
    /// Probe hits (row calls and tracepoint hits) in them.
    pub hits: u64,
    /// What the calibration says those hits cost.
    pub calibrated_ns: u64,
    /// What they cost at the syscall loop's per-hit costs and at the page faults' (the two
    /// contexts `calibrated_ns` takes the middle of), lower first.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub calibrated_range_ns: Option<(u64, u64)>,
    /// Their wall time less the untraced line at each one's layout (negative where they ran
    /// under it).
    pub measured_ns: i64,
    /// How far `measured_ns` can be off by the untraced iterations' own scatter around their
    /// line (one standard error: each exact iteration scatters as much, and the line itself
    /// is known only as well as its iterations place it). A measured cost within this of the
    /// calibrated one cannot tell the calibration wrong (None with fewer than two untraced
    /// iterations).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub noise_ns: Option<u64>,
    /// Exact iterations whose buffer came in more or fewer physical runs than any untraced
    /// iteration's: the line cannot place them, and their measured cost holds its guess.
    #[serde(default)]
    pub beyond_line: u32,
}

/// A ratio with its spread.
#[derive(Clone, Copy, Debug, Serialize, Deserialize, PartialEq)]
pub struct Ratio {
    /// median / median.
    pub median: f64,
    /// The lowest it can be: fastest traced over slowest untraced.
    pub low: f64,
    /// The highest: slowest traced over fastest untraced.
    pub high: f64,
    /// Whether each traced iteration was held against what the untraced pass takes on a
    /// buffer laid out like its own (`layout` of the phase): then median, low and high are
    /// the median, lowest and highest of those per-iteration ratios.
    #[serde(default)]
    pub layout_matched: bool,
}

impl Ratio {
    /// `traced` against `untraced`.
    pub fn of(traced: &Stats, untraced: &Stats) -> Option<Self> {
        let r = |a: u64, b: u64| (b > 0).then(|| a as f64 / b as f64);
        Some(Self {
            median: r(traced.median, untraced.median)?,
            low: r(traced.min, untraced.max)?,
            high: r(traced.max, untraced.min)?,
            layout_matched: false,
        })
    }
}

/// Sampled-stack breakdown of a phase.
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
pub struct Sampled {
    /// Sampling periods the samples stand for (all iterations): one each, and where the timer
    /// fired late because interrupts were off, one per period it missed.
    pub samples: u64,
    /// Of those, the periods the timer missed, each standing in the stack of the sample it
    /// took next: with interrupts off (gup-fast pins so) the one taken when they came back
    /// on; where a sample's handling outlasts a period (under emulation) the next one.
    #[serde(default)]
    pub late_periods: u64,
    /// Of those, the periods of kernel-mode samples whose unwinder found no caller above the
    /// interrupted instruction: their stacks are that instruction's function alone.
    #[serde(default)]
    pub no_caller: u64,
    /// Of those, samples whose kernel stack the unwinder cut at a retpoline thunk: they name
    /// no caller, and `categories` leaves them out.
    #[serde(default)]
    pub cut: u64,
    /// Sampling periods whose samples were lost (map full, stack collisions).
    #[serde(default)]
    pub lost: u64,
    /// Share of the samples not cut per category (sums to 1 when there are any).
    pub categories: BTreeMap<Category, f64>,
    /// The thread's time off the CPU over the same iterations, which the sampler (running on
    /// its CPU time) cannot see (None: sched_switch was not attached).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub off_cpu_ns: Option<u64>,
    /// Time the sampler's own program took over those samples (its kernel stack walks): where
    /// a sample costs about a sampling period, the timer skips periods and a phase takes fewer
    /// samples than its time gives, still spread evenly over it.
    #[serde(default)]
    pub sampler_ns: u64,
}

impl Sampled {
    /// The samples the timer took: one per period less the periods late ones stand for.
    pub fn taken(&self) -> u64 {
        self.samples.saturating_sub(self.late_periods)
    }

    /// What one sample's program took on average (None without samples).
    pub fn per_sample_ns(&self) -> Option<u64> {
        (self.taken() > 0).then(|| self.sampler_ns / self.taken())
    }
}

/// The workload thread's time off the CPU in a phase (`sched:sched_switch`): blocked on a
/// lock or a wait, or preempted.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct OffCpu {
    /// From each switch away to the switch back, summed.
    pub ns: u64,
    /// Switches away.
    pub switches: u64,
    /// Of those, the sleeps (the rest were preemptions).
    pub blocked: u64,
    /// The kernel's own count of the same iterations' context switches (getrusage), which also
    /// holds the phase switch's own bpf() calls around the phase.
    #[serde(default)]
    pub rusage_switches: u64,
}

impl OffCpu {
    /// `X of Y ms, N sleep(s) and M preemption(s)`, out of a phase of `wall_ns`.
    pub fn describe(&self, wall_ns: u64) -> String {
        format!(
            "{:.2} of {:.2} ms, {} sleep(s) and {} preemption(s)",
            self.ns as f64 / 1e6,
            wall_ns as f64 / 1e6,
            self.blocked,
            self.switches.saturating_sub(self.blocked)
        )
    }
}

/// Counters of a phase: medians over iterations (lost events: the total).
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
pub struct Counters {
    /// CPU page faults from the exceptions:page_fault_user tracepoint (None: it was not
    /// attached). GUP-driven faults (inside a pin or MAP_POPULATE) do not fire it.
    #[serde(alias = "faults")]
    pub cpu_faults: Option<u64>,
    /// Page allocations of the workload thread by order (kmem:mm_page_alloc: order 0 is a
    /// 4 KiB page, 9 a 2 MiB folio; 11 means 11 or more), the orders that occurred; None when
    /// the tracepoint was not attached. hugetlb pages come from the pool and are not counted.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub page_allocs: Option<BTreeMap<u32, u64>>,
    /// Minor faults from getrusage (also counts GUP-driven faults).
    #[serde(default)]
    pub minor_faults: u64,
    /// Major faults from getrusage.
    #[serde(default)]
    pub major_faults: u64,
    /// Syscalls completed (raw_syscalls tracepoints; None: not attached).
    #[serde(default)]
    pub syscalls: Option<u64>,
    /// Syscall exits without a matching entry (lost events).
    #[serde(default)]
    pub unbalanced: u64,
    /// Time off the CPU (None: sched_switch was not attached).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub off_cpu: Option<OffCpu>,
}

/// One phase of one case.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct PhaseReport {
    /// Phase.
    pub name: Phase,
    /// Wall time per iteration (user-space monotonic clock).
    pub wall_ns: Stats,
    /// Time inside syscalls per iteration of the exact pass, measured in the kernel
    /// (raw_syscalls enter/exit). Traced time: compare it with `passes.exact.wall_ns`, not
    /// with the untraced `wall_ns`.
    #[serde(default)]
    pub kernel_ns: Option<Stats>,
    /// Median share of the exact pass's wall time spent inside syscalls: the part of the
    /// phase the kernel owns, comparable across passes because both sides carry the probes.
    #[serde(default)]
    pub kernel_share: Option<f64>,
    /// Throughput at the median wall time.
    #[serde(default)]
    pub gib_per_s: f64,
    /// Sampled-stack category shares.
    pub sampled: Sampled,
    /// Exact entry/exit breakdown.
    #[serde(default)]
    pub exact: Exact,
    /// The pass `wall_ns` comes from: `untraced` whenever it ran.
    #[serde(default = "untraced")]
    pub wall_pass: Pass,
    /// Confidence interval of the median of `wall_ns` (order statistics; its level is what
    /// the iteration count allows, 95% from 6 iterations on).
    #[serde(default)]
    pub wall_ci: Option<Interval>,
    /// The traced passes' wall times and what tracing cost against `wall_ns`.
    #[serde(default)]
    pub passes: BTreeMap<Pass, PassTimes>,
    /// Physical runs of each headline iteration's buffer (same order as `wall_ns.runs`):
    /// how many physically contiguous pieces its pages made (`/proc/self/pagemap`, read
    /// before the munmap). A 4 KiB buffer's map and unmap follow it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub physical_runs: Option<Stats>,
    /// The untraced wall time as a line in the physical runs (fitted over the untraced
    /// iterations): what traced iterations are held against.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub layout: Option<crate::layout::LayoutModel>,
    /// The cost model: ns per 4 KiB page of the buffer, per category, at the headline
    /// (untraced) time (exact shares less probe cost where measured, else sampled shares).
    /// For hugetlb backings multiply by the hugepage's 4 KiB pages for the cost per hugepage.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub per_page_ns: BTreeMap<Category, f64>,
    /// Counters.
    pub counters: Counters,
    /// Folded-stack file, relative to the report's directory (None: no stacks were sampled,
    /// e.g. `--no-trace` or no sampler).
    #[serde(default)]
    pub folded: Option<String>,
    /// SVG flamegraph, relative to the report's directory (None likewise).
    #[serde(default)]
    pub flamegraph: Option<String>,
}

/// The exact (entry/exit) breakdown of a phase, for its median iteration: the categories plus
/// `unattributed_ns` add up to that iteration's `wall_ns`. When no probe-table row attached,
/// `available` is false, `unavailable` says why, and the numbers are empty rather than zero.
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
pub struct Exact {
    /// Whether exact attribution ran (some probe-table row attached).
    #[serde(default = "yes")]
    pub available: bool,
    /// Why not, when it did not.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub unavailable: Option<String>,
    /// Which iteration (0-based): the one with the median wall time.
    pub iteration: u32,
    /// Its wall time.
    pub wall_ns: u64,
    /// Its time inside syscalls.
    pub kernel_ns: u64,
    /// Exclusive time per category; `other` includes syscall time outside every probed row.
    pub categories: BTreeMap<Category, u64>,
    /// What the probes themselves cost in this iteration, taken out of the rows (and the
    /// unprobed syscall time) where the probe hits landed, never more than a row's own time:
    /// by `probe_overhead_basis`, `probe_overhead_measured_ns` spread over the hits in the
    /// calibration's proportions (per mechanism, own share and caller's share), or the
    /// calibrated cost as it is. None when neither is known.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub probe_overhead_ns: Option<u64>,
    /// Which cost `probe_overhead_ns` follows: the measured one where it is further from the
    /// calibrated one than `untraced_noise_ns` (and the iteration was not under its untraced
    /// reference), else the calibration.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub probe_overhead_basis: Option<OverheadBasis>,
    /// How far the untraced iterations fall from the untraced reference line, each at its
    /// own layout (the largest): the noise one untraced iteration carries, and with it the
    /// measured probe cost (0 with a single untraced iteration).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub untraced_noise_ns: Option<u64>,
    /// This iteration's wall time minus `untraced_reference_ns` (None without an untraced
    /// pass): what the probes cost, measured, noise included.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub probe_overhead_measured_ns: Option<u64>,
    /// What an untraced iteration takes on a buffer laid out like this one (the phase's
    /// `layout` line at its physical runs), else the untraced median.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub untraced_reference_ns: Option<u64>,
    /// This iteration's physical runs (see `PhaseReport::physical_runs`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub physical_runs: Option<u64>,
    /// What the calibrated cost per call (`probe_cost`) adds up to over this iteration's
    /// probe hits (None: no calibration for a mechanism the rows used).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub probe_overhead_calibrated_ns: Option<u64>,
    /// Probed calls in this iteration (each one an entry and a return probe hit).
    #[serde(default)]
    pub probe_hits: u64,
    /// Time this iteration spent off the CPU after switches away outside every syscall of a
    /// syscall phase: mostly a long syscall preempted on its way back to user space, after its
    /// exit (a non-preemptible kernel reschedules there). Wall time, but not the kernel's work
    /// for the phase, so not in `unattributed_ns` and not in what the shares are of. None when
    /// context switches were not traced or the phase is no syscall.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub off_cpu_outside_ns: Option<u64>,
    /// wall - sum(categories) - probe overhead - time off the CPU outside syscalls: user
    /// space, exception entry, and whatever no probe saw.
    pub unattributed_ns: i64,
    /// Per probed function.
    pub rows: Vec<ExactRow>,
    /// Calls not accounted (stack overflow, unmatched returns); non-zero marks the numbers.
    #[serde(default)]
    pub lost_events: u64,
    /// The part of the categories split by sampled stacks (rows whose demoted callees' time
    /// is in them; see [`ExactRow::by_samples`]).
    #[serde(default)]
    pub split_ns: u64,
}

/// Where an exact iteration's probe cost comes from.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum OverheadBasis {
    /// The per-hit costs measured at start-up on the running kernel, summed over the hits.
    Calibration,
    /// The iteration's wall time less the untraced one at its layout, spread over the hits.
    Measured,
}

impl Exact {
    /// The iteration's wall time less what its probes cost: what the shares are of.
    pub fn wall_less_cost(&self) -> u64 {
        self.wall_ns.saturating_sub(self.probe_overhead_ns.unwrap_or(0))
    }

    /// What the shares are of: [`Exact::wall_less_cost`] less the time off the CPU outside
    /// syscalls (the sampled shares leave time off the CPU out too).
    pub fn share_base(&self) -> u64 {
        self.wall_less_cost()
            .saturating_sub(self.off_cpu_outside_ns.unwrap_or(0))
    }

    /// The share of `cat` in [`Exact::share_base`]; `user` is the unattributed rest (which can
    /// be below zero by the clock's noise).
    pub fn share(&self, cat: Category) -> f64 {
        let ns = match cat {
            Category::User => self.unattributed_ns as f64,
            c => self.categories.get(&c).copied().unwrap_or(0) as f64,
        };
        ns / self.share_base().max(1) as f64
    }
}

/// One probed function in one phase.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct ExactRow {
    /// Kernel function.
    pub function: String,
    /// Category of its exclusive time.
    pub category: Category,
    /// How it was attached.
    pub mechanism: AttachedBy,
    /// Completed calls.
    pub calls: u64,
    /// Entry-to-return time.
    pub inclusive_ns: u64,
    /// Minus probed callees (as measured, probe cost included).
    pub exclusive_ns: u64,
    /// Probed calls made directly from it.
    #[serde(default)]
    pub child_calls: u64,
    /// How many of those were kprobe hits (the rest fentry).
    #[serde(default)]
    pub child_kprobe_calls: u64,
    /// Tracepoint hits (page allocations, user faults) while it was the innermost probed
    /// call: their cost is in its exclusive time.
    #[serde(default)]
    pub event_hits: u64,
    /// The part of `exclusive_ns` estimated to be probe cost (its own and its probed callees'
    /// entry and return); its category gets the rest.
    #[serde(default)]
    pub overhead_ns: u64,
    /// Sum of the row's size argument.
    #[serde(default)]
    pub amount: u64,
    /// Its unit (pages, bytes), if any.
    #[serde(default)]
    pub unit: Option<AmountUnit>,
    /// Left detached in this case's exact pass (see [`CaseReport::demoted`]): `calls` and
    /// `amount` were counted in the warm-up iteration, its time is in its caller's row.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub demoted: bool,
    /// Its exclusive time less probe cost split by the sampled stacks it owns, when a demoted
    /// row's time is in it (empty: all of it counts as `category`).
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub by_samples: BTreeMap<Category, u64>,
}

/// One line per phase of `demoted`: which rows the exact pass ran without, and why.
pub fn describe_demoted(demoted: &[DemotedRow]) -> Vec<(Phase, String)> {
    let groups = crate::workload::PHASES
        .iter()
        .flat_map(|ph| [(*ph, false), (*ph, true)]);
    groups
        .filter_map(|(ph, outgrown)| {
            let rows: Vec<&DemotedRow> = demoted
                .iter()
                .filter(|d| d.phase == ph && d.outgrown == outgrown)
                .collect();
            let first = rows.first()?;
            let names: Vec<&str> = rows.iter().map(|d| d.function.as_str()).collect();
            let lead = if outgrown {
                "the exact iteration outgrew the scout and ran again"
            } else {
                "exact pass"
            };
            let line = format!(
                "{lead} without {}: {} calls in {} would cost ~{:.1} ms of probes ({:.0}% of the phase, with every row {:.0}%)",
                names.join(", "),
                rows.iter().map(|d| d.calls).sum::<u64>(),
                ph.name(),
                rows.iter().map(|d| d.cost_ns).sum::<u64>() as f64 / 1e6,
                rows.iter().map(|d| d.share).sum::<f64>() * 100.0,
                first.phase_share * 100.0
            );
            Some((ph, line))
        })
        .collect()
}

/// A probe-table row the exact pass of one case ran without: counted in the warm-up
/// iteration, its hits would have cost more than the phase can carry.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct DemotedRow {
    /// Kernel function.
    pub function: String,
    /// The phase it was too costly in.
    pub phase: Phase,
    /// Its calls in that phase of the warm-up iteration.
    pub calls: u64,
    /// Their estimated cost (calls x the calibrated cost of its mechanism).
    pub cost_ns: u64,
    /// That cost over the phase's estimated untraced time.
    pub share: f64,
    /// What every row's hits would have cost that phase, likewise.
    #[serde(default)]
    pub phase_share: f64,
    /// Demoted after an exact iteration's buffer made far more calls than the scout's (a 4
    /// KiB buffer's pin and map calls follow its physical runs): its calls and cost are that
    /// iteration's, which then ran again without it.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub outgrown: bool,
    /// Physical runs of the buffer in the iteration `calls` were counted in (the scout's, or
    /// the outgrown exact iteration's): a 4 KiB buffer's pin and map calls follow its runs.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub physical_runs: Option<u64>,
}

/// A traced iteration discarded and run again for its layout (see
/// [`CaseReport::layout_reruns`]).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct LayoutRerun {
    /// The pass whose iteration ran again.
    pub pass: Pass,
    /// The discarded iteration's physical runs.
    pub physical_runs: u64,
    /// The layout it was run again to come near: for a sampled iteration the exact
    /// iteration's, for an exact one the untraced iterations' median.
    pub other_physical_runs: u64,
}

/// A case that ran and failed.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct Failed {
    /// Case name.
    pub name: String,
    /// The error, with errno and meaning.
    pub error: String,
    /// After a failed map: bytes the kernel still had mapped in the range (0 when it cleaned
    /// up after itself; dmaprof unmaps what it finds).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub left_mapped_bytes: Option<u64>,
}

/// Memory a case left held after it ended: its DMA context closed, so everything it locked
/// or pinned should be back.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq, Eq)]
pub struct Leak {
    /// Case name.
    pub case: String,
    /// The counter: `VmLck` or `VmPin` (this process, KiB), or `foll_pins` (the system's
    /// FOLL_PIN pages acquired less released, /proc/vmstat).
    pub counter: String,
    /// Before the case.
    pub before: i64,
    /// After it.
    pub after: i64,
    /// A system-wide counter: another process pinning meanwhile moves it too, so it warns
    /// but does not fail the run.
    #[serde(default)]
    pub system_wide: bool,
}

/// A case that did not run.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct Skipped {
    /// Case name.
    pub name: String,
    /// Why.
    pub reason: String,
}

/// Why a saved report could not be read.
#[derive(Debug, thiserror::Error)]
pub enum ReadError {
    /// Not readable.
    #[error("cannot read {path}: {source}")]
    Io {
        /// The file.
        path: String,
        /// The error.
        #[source]
        source: std::io::Error,
    },
    /// Not JSON of our schema.
    #[error("{path} is not a dmaprof report: {reason}")]
    Format {
        /// The file.
        path: String,
        /// What is wrong.
        reason: ParseError,
    },
}

/// Why report.json text is not a report.
#[derive(Debug, thiserror::Error)]
pub enum ParseError {
    /// Not JSON.
    #[error("invalid JSON ({0})")]
    Json(serde_json::Error),
    /// Another schema.
    #[error("schema is `{0}`, this dmaprof reads `{SCHEMA}`")]
    OtherSchema(String),
    /// No schema tag.
    #[error("no \"schema\" field (expected `{SCHEMA}`)")]
    NoSchema,
    /// The schema tag is right but the content does not match it.
    #[error("does not match {SCHEMA}: {0}")]
    Shape(serde_json::Error),
}

/// A report as named on the command line: a run's or a recording's output directory stands
/// for the report.json in it.
pub fn locate(path: &std::path::Path) -> std::path::PathBuf {
    match path.is_dir() {
        true => path.join("report.json"),
        false => path.to_owned(),
    }
}

/// Reads and validates a saved report.json.
pub fn read(path: &std::path::Path) -> Result<Report, ReadError> {
    let text = std::fs::read_to_string(path).map_err(|source| ReadError::Io {
        path: path.display().to_string(),
        source,
    })?;
    parse(&text).map_err(|reason| ReadError::Format {
        path: path.display().to_string(),
        reason,
    })
}

/// Parses report.json text, checking the schema tag first for a clear error.
pub fn parse(text: &str) -> Result<Report, ParseError> {
    let value: serde_json::Value = serde_json::from_str(text).map_err(ParseError::Json)?;
    match value.get("schema").and_then(|s| s.as_str()) {
        Some(SCHEMA) => {}
        Some(other) => return Err(ParseError::OtherSchema(other.to_owned())),
        None => return Err(ParseError::NoSchema),
    }
    serde_json::from_value(value).map_err(ParseError::Shape)
}

/// `iommu_mode` in JSON: the selftests' mode name, or `none`.
mod mode_name {
    use serde::{Deserialize as _, Deserializer, Serializer};

    use crate::matrix::{DmaMode, mode_name};

    pub fn serialize<S: Serializer>(mode: &Option<DmaMode>, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(mode_name(*mode))
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Option<DmaMode>, D::Error> {
        let name = String::deserialize(d)?;
        if name == "none" {
            return Ok(None);
        }
        serde_json::from_value(serde_json::Value::String(name))
            .map(Some)
            .map_err(serde::de::Error::custom)
    }
}

/// Samples a phase's sampled pass should have taken: its iterations' time on the CPU (their wall
/// time less what the thread spent off it, where that was measured) at `freq_hz`
/// (None without a sampled pass).
pub fn expected_samples(p: &PhaseReport, freq_hz: u64) -> Option<u64> {
    let t = p.passes.get(&Pass::Sampled)?;
    let wall: u64 = t.wall_ns.runs.iter().sum();
    let ns = wall.saturating_sub(p.sampled.off_cpu_ns.unwrap_or(0));
    Some((u128::from(ns) * u128::from(freq_hz) / 1_000_000_000) as u64)
}

/// What a sample cost the phase's wall time: the sampled iterations' time over as many
/// untraced medians, less their time off the CPU, per sample (None without both passes or
/// without samples). Under emulation the timer interrupt and its re-arming cost more than
/// dmaprof's program (`Sampled::sampler_ns`) does.
pub fn sample_cost_ns(p: &PhaseReport) -> Option<u64> {
    let t = p.passes.get(&Pass::Sampled)?;
    if p.wall_pass != Pass::Untraced || p.sampled.taken() == 0 {
        return None;
    }
    let sampled: u64 = t.wall_ns.runs.iter().sum();
    let untraced = p.wall_ns.median * t.wall_ns.runs.len() as u64;
    let extra = sampled.saturating_sub(untraced + p.sampled.off_cpu_ns.unwrap_or(0));
    Some(extra / p.sampled.taken())
}

/// Whether samples cost about a sampling period or more each: the timer then fires at the
/// first period after the last sample's handling ended, skipping periods, and takes fewer
/// samples than the phase's time gives, still spread evenly over it.
pub fn sampler_skips(p: &PhaseReport, freq_hz: u64) -> Option<u64> {
    sample_cost_ns(p).filter(|ns| ns * 2 >= sampling_period_ns(freq_hz))
}

/// The sampler's period at `freq_hz`.
pub fn sampling_period_ns(freq_hz: u64) -> u64 {
    1_000_000_000 / freq_hz.max(1)
}

/// A machine whose pace (`floors::Pace`) moved by this factor or more over one set of untraced
/// iterations was not steady. Under TCG on a shared host one process's paces read 1.09x to
/// 1.6x apart (24 runs of 5 iterations).
pub const UNSTEADY_PACE: f64 = 1.3;

/// How far the machine's pace moved over `pace` (max over min), when that is
/// [`UNSTEADY_PACE`] or more.
pub fn unsteady_pace(pace: &Stats) -> Option<f64> {
    let moved = pace.max as f64 / pace.min.max(1) as f64;
    (pace.runs.len() >= 2 && moved >= UNSTEADY_PACE).then_some(moved)
}

/// The phase's exact time off the CPU, where it is a tenth or more of the exact iteration's
/// wall time and at least 0.1 ms: the exact breakdown holds it in whichever row the thread
/// left the CPU from (a lock it waited for, a work item it flushed), and it varies from run
/// to run as the machine's other work does.
pub fn off_cpu_heavy(p: &PhaseReport) -> Option<OffCpu> {
    let off = p.counters.off_cpu?;
    (p.exact.available && off.ns >= 100_000 && off.ns * 10 >= p.exact.wall_ns).then_some(off)
}

/// Time the exact iteration took over the untraced one at its layout beyond the probe cost
/// taken out of its rows, where that is a tenth or more of the phase (less probe cost) and at
/// least 1 ms: it stays in whichever rows it landed in. The cost taken out follows the hits
/// (scaled to the measured time, but never more than a row's own time), so what is left is
/// noise no hit explains: under emulation one iteration can run a third slower than the next
/// with the same hits (a 289 ms compat type1 map read 401 ms with 415 hits calibrated at
/// 0.9 ms; 31 ms was taken out, 81 ms stayed), or a buffer's pages can come in more pieces.
pub fn unexplained_cost(p: &PhaseReport) -> Option<u64> {
    let e = &p.exact;
    let left = e.probe_overhead_measured_ns?.saturating_sub(e.probe_overhead_ns?);
    (e.available && left >= 1_000_000 && left * 10 >= e.wall_less_cost()).then_some(left)
}

/// How far apart the untraced line may put the exact and the sampled iterations' layouts
/// before their shares are not held against each other: a buffer's map pins and maps one
/// physically contiguous run per call, so a 4 KiB memfd whose pages came in 635 runs in the
/// exact iteration and 18790 in the sampled one (61 ms against 243 ms) had the two passes
/// time different work (91% pinning against 39%, the rest IOMMU map and flush calls).
pub const LAYOUT_WORK_APART: f64 = 1.5;

/// The exact and sampled iterations of a phase on buffers laid out differently enough to
/// change its work (see [`layouts_apart`]).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct LayoutsApart {
    /// The exact iteration's physical runs.
    pub exact_runs: u64,
    /// The sampled iterations' median physical runs.
    pub sampled_runs: u64,
    /// What the exact iteration's layout takes, ns (see `by`).
    pub exact_ns: u64,
    /// What the sampled iterations' layout takes, ns (see `by`).
    pub sampled_ns: u64,
    /// Where the two times come from.
    pub by: ApartBy,
}

/// What told two layouts' work apart.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ApartBy {
    /// The untraced line, at each pass's runs.
    Line,
    /// The two passes' own iterations (the exact one less its probe cost, the sampled median),
    /// where one pass's runs lie beyond the untraced iterations' and the line cannot tell.
    Passes,
}

/// Where the phase's untraced line (its time against the buffer's physical runs) puts the
/// exact and the sampled iterations' layouts [`LAYOUT_WORK_APART`] or more apart: their
/// shares come from different work, and a gap between them is the workload's, not the
/// attribution's. The line is never extrapolated, so where the runs are that far apart too
/// and one side lies outside what the untraced iterations saw (a 4 KiB memfd's exact iteration
/// on 643 runs, its sampled one on 28938, the untraced ones on 156-2738), the passes' own
/// times judge instead. None where a layout is missing or neither tells them apart.
pub fn layouts_apart(p: &PhaseReport) -> Option<LayoutsApart> {
    let exact_runs = p.exact.physical_runs?;
    let sampled = p.passes.get(&Pass::Sampled)?;
    let sampled_runs = sampled.physical_runs.as_ref()?.median;
    let apart = |a: u64, b: u64| a.max(b) as f64 >= LAYOUT_WORK_APART * a.min(b).max(1) as f64;
    let out = |(exact_ns, sampled_ns), by| LayoutsApart {
        exact_runs,
        sampled_runs,
        exact_ns,
        sampled_ns,
        by,
    };
    let line = p.layout.as_ref();
    if let Some(l) = line {
        let on_line = (l.predict(exact_runs), l.predict(sampled_runs));
        if apart(on_line.0, on_line.1) {
            return Some(out(on_line, ApartBy::Line));
        }
    }
    let unseen = |runs: u64| line.is_none_or(|l| runs < l.runs_seen.0 || runs > l.runs_seen.1);
    let beyond = unseen(exact_runs) || unseen(sampled_runs);
    let own = (p.exact.wall_less_cost(), sampled.wall_ns.median);
    (beyond && apart(exact_runs, sampled_runs) && apart(own.0, own.1)).then(|| out(own, ApartBy::Passes))
}

/// Where a map's or unmap's breakdown comes from a buffer laid out unlike the headline's:
/// the exact iteration's physical runs are far from every untraced iteration's
/// ([`crate::layout::far_apart`]), and the iteration (less its probe cost) took a tenth of
/// the headline more or less. A map pins and maps one run per call, so such an
/// iteration did other work than the headline times: in a default matrix the exact
/// iteration of a 4 KiB memfd touch map came in 613 runs and took 21.4 ms, the untraced
/// ones in 24282-28354 runs and a median 76.7 ms (the traced iterations follow a probe
/// switch, and their 4 KiB buffers mostly come far more contiguous).
pub fn breakdown_off_headline(p: &PhaseReport, pages: u64) -> Option<OffHeadline> {
    if !matches!(p.name, crate::workload::Phase::Map | crate::workload::Phase::Unmap)
        || !p.exact.available
        || p.wall_pass != Pass::Untraced
    {
        return None;
    }
    let (exact_runs, untraced) = (p.exact.physical_runs?, p.physical_runs.as_ref()?);
    let nearest = untraced.runs.iter().min_by_key(|r| r.abs_diff(exact_runs))?;
    let (exact_ns, headline_ns) = (p.exact.wall_less_cost(), p.wall_ns.median);
    let differs = exact_ns.abs_diff(headline_ns) * 10 >= headline_ns;
    (differs && crate::layout::far_apart(exact_runs, *nearest, pages)).then_some(OffHeadline {
        exact_runs,
        untraced_runs: (untraced.min, untraced.median, untraced.max),
        exact_ns,
        headline_ns,
    })
}

/// A breakdown on a layout the headline did not time (see [`breakdown_off_headline`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct OffHeadline {
    /// The exact iteration's physical runs.
    pub exact_runs: u64,
    /// The untraced iterations' fewest, median and most runs.
    pub untraced_runs: (u64, u64, u64),
    /// The exact iteration's wall time less its probe cost.
    pub exact_ns: u64,
    /// The headline: the untraced median.
    pub headline_ns: u64,
}

/// Whether the sampler missed much of a phase: fewer than half the samples its wall time
/// should have given, where that is at least 50 (fewer are too few to tell loss from chance).
pub fn samples_short(p: &PhaseReport, freq_hz: u64) -> Option<u64> {
    expected_samples(p, freq_hz).filter(|e| *e >= 50 && p.sampled.taken() * 2 < *e)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_sampler_that_missed_half_a_phase_is_told() {
        let mut p: PhaseReport = serde_json::from_str(
            r#"{"name":"mmap","wall_ns":{"median":1,"min":1,"max":1,"runs":[1]},"kernel_ns":null,
                "kernel_share":null,"gib_per_s":0.0,"sampled":{"samples":587,"categories":{}},
                "exact":{"iteration":0,"wall_ns":0,"kernel_ns":0,"categories":{},"unattributed_ns":0,
                "rows":[]},"counters":{"cpu_faults":null}}"#,
        )
        .unwrap();
        assert_eq!(expected_samples(&p, 4999), None);
        p.passes.insert(
            Pass::Sampled,
            PassTimes {
                wall_ns: Stats::of(vec![247_730_000]),
                ..PassTimes::default()
            },
        );
        // 247.73 ms at 4999 Hz: 1238 expected, 587 taken (a guest run under TCG).
        assert_eq!(expected_samples(&p, 4999), Some(1238));
        assert_eq!(samples_short(&p, 4999), Some(1238));
        p.sampled.samples = 700;
        assert_eq!(samples_short(&p, 4999), None);
        // A 2 ms phase's 0 of 10 is not judged.
        p.sampled.samples = 0;
        p.passes.get_mut(&Pass::Sampled).unwrap().wall_ns = Stats::of(vec![2_000_000]);
        assert_eq!(samples_short(&p, 4999), None);
    }

    #[test]
    fn stats() {
        assert_eq!(
            Stats::of(vec![3, 1, 2]),
            Stats {
                median: 2,
                min: 1,
                max: 3,
                runs: vec![3, 1, 2]
            }
        );
        assert_eq!(Stats::of(vec![4, 1]).median, 2);
        assert_eq!(Stats::of(vec![]).median, 0);
    }

    #[test]
    fn median_confidence_intervals() {
        assert_eq!(median_ci(&[5]), None);
        let three = median_ci(&[3, 1, 2]).unwrap();
        assert_eq!((three.low, three.high), (1, 3));
        assert!((three.level - 0.75).abs() < 1e-9);
        let six = median_ci(&[6, 5, 4, 3, 2, 1]).unwrap();
        assert_eq!((six.low, six.high), (1, 6));
        assert!(six.level >= 0.95 && six.level < 0.97);
        // With many runs the interval narrows to inner order statistics.
        let v: Vec<u64> = (1..=20).collect();
        let ci = median_ci(&v).unwrap();
        assert_eq!((ci.low, ci.high), (6, 15));
        assert!(ci.level >= 0.95);
    }

    #[test]
    fn an_output_directory_stands_for_its_report() {
        let dir = std::env::temp_dir();
        assert_eq!(locate(&dir), dir.join("report.json"));
        let file = dir.join("no-such-report.json");
        assert_eq!(locate(&file), file);
    }

    #[test]
    fn schema_errors_are_clear() {
        let err = |t: &str| parse(t).unwrap_err().to_string();
        assert!(err("{").contains("invalid JSON"));
        assert!(err(r#"{"schema":"other.v9"}"#).contains("other.v9"));
        assert!(err(r#"{"cases":[]}"#).contains("no \"schema\""));
        assert!(err(r#"{"schema":"dmaprof.report.v1"}"#).contains("does not match"));
    }
}
