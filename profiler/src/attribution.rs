//! Attribution: turns what the probes recorded for one case (a [`Drained`]) and what the
//! workload measured into that case's report: the exact breakdown per phase, the sampled
//! category shares and folded stacks, and the exact summary (phase -> category -> function).
//! Everything here is a pure function of its inputs; writing files is [`crate::output`]'s job.
use std::collections::BTreeMap;

use crate::{
    abi::{PhaseCounters, RowStats},
    category::{CATEGORIES, Category, CategoryCounts, base_function, category_of, cut_short, in_context},
    dma,
    flamegraph::Folded,
    layout::LayoutModel,
    loader::{Drained, RawSample},
    matrix::Workload,
    probes::{AttachedBy, CallCost, PROBE_TABLE, Pass, ProbeCost, ProbeStatus},
    report::{
        CaseReport, Counters, DemotedRow, Exact, ExactRow, LayoutRerun, OffCpu, OverheadBasis, PassCost, PassTimes,
        PhaseReport, Ratio, Sampled, Stats, median_ci,
    },
    symbols::KernelSymbols,
    workload::{PHASES, Phase, PhaseRun},
};

/// Phases shorter than this (untraced) get no traced/untraced ratio: against one reference
/// iteration their ratio is noise.
pub const MIN_RATIO_NS: u64 = 1_000_000;

/// The BPF map slot of `phase` in `iteration` (slot 0 means "not recording").
pub fn slot(iteration: u32, phase: Phase) -> u32 {
    1 + iteration * PHASES.len() as u32 + phase.index() as u32
}

/// The slots iteration `iteration` records its phases into.
pub fn iteration_slots(iteration: u32) -> std::ops::Range<u32> {
    slot(iteration, PHASES[0])..slot(iteration + 1, PHASES[0])
}

/// The phase a slot belongs to.
fn phase_of_slot(s: u32) -> Option<Phase> {
    s.checked_sub(1).map(|s| PHASES[s as usize % PHASES.len()])
}

/// Slot iterations the BPF maps have room for.
pub const MAX_SLOT_ITERATIONS: u32 = (crate::abi::MAX_PHASES - 1) / PHASES.len() as u32;

/// Slots a case with `iterations` slot iterations uses, plus one (the drain bound).
pub fn slots(iterations: u32) -> u32 {
    1 + iterations * PHASES.len() as u32
}

/// Each pass's iterations: (slot iteration, the phases it ran). The slot iteration says where
/// a traced pass recorded in the BPF maps ([`slot`]); for the untraced pass it is the index.
pub type PassRuns = BTreeMap<Pass, Vec<(u32, Vec<PhaseRun>)>>;

/// Which measurements a run has, from what attached: a number that was not measured is
/// reported as absent, never as zero.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Coverage {
    /// Exact attribution: Ok when some probe-table row attached, else why not.
    pub exact: Result<(), NoExact>,
    /// Syscall time and counts (raw_syscalls tracepoints).
    pub syscalls: bool,
    /// CPU page faults (exceptions:page_fault_user).
    pub cpu_faults: bool,
    /// Page allocations by order (kmem:mm_page_alloc).
    pub page_allocs: bool,
    /// Sampled stacks (the perf event).
    pub samples: bool,
    /// The workload thread's time off the CPU (sched:sched_switch, both traced passes).
    pub switches: bool,
}

/// Why a run has no exact attribution (report.json's `exact.unavailable` has it in words).
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum NoExact {
    /// No traced pass ran, so no probe was loaded.
    #[error("no traced pass (--no-trace or --passes untraced): no probe was loaded")]
    NotLoaded,
    /// The probes were loaded for the sampled pass only.
    #[error("the exact pass was not run (--passes)")]
    NotRun,
    /// No probe-table row attached; the kernel's reason for the first refused row, in its
    /// words (it comes from the attach status, a message for people).
    #[error("no probe-table row attached: {0}")]
    NoRow(String),
}

impl Coverage {
    /// Nothing measured but wall time and getrusage: no probe was loaded.
    pub fn none() -> Self {
        Self {
            exact: Err(NoExact::NotLoaded),
            syscalls: false,
            cpu_faults: false,
            page_allocs: false,
            samples: false,
            switches: false,
        }
    }

    /// What the attach status says was measured, in the passes that ran: the rows and
    /// tracepoints in the exact pass, the sampler in the sampled one.
    pub fn of(status: &[ProbeStatus], passes: &[Pass]) -> Self {
        let mut c = Self::attached(status);
        if !passes.contains(&Pass::Exact) {
            c.exact = Err(NoExact::NotRun);
            (c.syscalls, c.cpu_faults, c.page_allocs) = (false, false, false);
        }
        c.samples &= passes.contains(&Pass::Sampled);
        c
    }

    fn attached(status: &[ProbeStatus]) -> Self {
        let attached = |f: &dyn Fn(&ProbeStatus) -> bool| status.iter().any(|s| s.attached && f(s));
        let is_row = |s: &ProbeStatus| matches!(s.mechanism, AttachedBy::Fentry | AttachedBy::Kprobe);
        let exact = if attached(&is_row) {
            Ok(())
        } else {
            // Say why the rows this kernel has were refused, not that a module is missing.
            let errors = || status.iter().filter(|s| is_row(s)).filter_map(|s| s.error.as_deref());
            let why = errors()
                .find(|e| !e.starts_with("not in /proc/kallsyms"))
                .or_else(|| errors().next())
                .unwrap_or("no probe-table row attached");
            Err(NoExact::NoRow(why.to_owned()))
        };
        Self {
            exact,
            syscalls: attached(&|s| s.function == "raw_syscalls:sys_exit"),
            cpu_faults: attached(&|s| s.function == "exceptions:page_fault_user"),
            page_allocs: attached(&|s| s.function == "kmem:mm_page_alloc"),
            switches: attached(&|s| s.function == "sched:sched_switch"),
            samples: attached(&|s| s.mechanism == AttachedBy::PerfEvent),
        }
    }
}

/// Probe cost (calls x calibrated cost) a syscall phase may carry, as a share of its
/// estimated untraced time, before its costliest rows are demoted: beyond a few percent the
/// probes rewrite the breakdown they measure.
pub const DEMOTE_ABOVE: f64 = 0.03;

/// Sampling periods a phase must last for demoting there to help: a demoted row's time is
/// split by the sampled stacks, and in a shorter phase too few come to split it by, so it
/// stays in its caller's row, unexplained. Under emulation the sampler takes a fraction of its
/// nominal samples (6-86% in one run): at 20 periods a 4 ms map took none.
pub const MIN_SPLIT_PERIODS: u64 = 60;

/// The rows one case's exact pass runs without, and what the warm-up iteration counted of
/// them.
#[derive(Clone, Debug, Default)]
pub struct Demotion {
    /// The rows, and why.
    pub demoted: Vec<(usize, DemotedRow)>,
    /// Their stats per phase in the warm-up iteration.
    counts: Vec<(Phase, usize, RowStats)>,
    /// Every row's probed callees per phase in the scout.
    children: Vec<(Phase, usize, u64)>,
    /// Page allocations by order per phase in the scout (the exact pass does not count them).
    page_allocs: Vec<(Phase, [u64; crate::abi::PAGE_ORDERS])>,
    /// Physical runs of the scout's buffer.
    physical_runs: Option<u64>,
}

impl Demotion {
    /// The demoted rows' indices into [`PROBE_TABLE`].
    pub fn rows(&self) -> Vec<usize> {
        self.demoted.iter().map(|(r, _)| *r).collect()
    }

    /// One line per phase: which rows, their calls and estimated cost, and what the probes
    /// would have cost the phase with them.
    pub fn describe(&self) -> Vec<String> {
        let rows: Vec<DemotedRow> = self.demoted.iter().map(|(_, d)| d.clone()).collect();
        crate::report::describe_demoted(&rows)
            .into_iter()
            .map(|(_, l)| l)
            .collect()
    }

    fn has(&self, row: usize) -> bool {
        self.demoted.iter().any(|(r, _)| *r == row)
    }
}

/// Which rows to demote, from one iteration with every row attached (`scout`, recorded in slot
/// iteration 0, and its phases' wall times): in each syscall phase whose rows' estimated
/// cost exceeds `limit` (a share, by default [`DEMOTE_ABOVE`]) of the rest of the phase, the
/// costliest rows until it does not. A phase whose rest is shorter than `min_phase_ns` (see
/// [`MIN_SPLIT_PERIODS`]) keeps every row. The rest is the scout's wall time less the
/// calibrated cost, or the `untraced` iteration's wall time where that is shorter: under
/// emulation a hit can cost twice its calibration, and a 2.7 ms map then looked like 5.6 ms.
pub fn demotions(
    scout: &Drained,
    walls: &[PhaseRun],
    untraced: &[PhaseRun],
    rows: &[(usize, AttachedBy)],
    cost: &ProbeCost,
    (limit, min_phase_ns): (f64, u64),
) -> Demotion {
    let mut out = Demotion {
        physical_runs: walls.first().and_then(|w| w.physical_runs),
        ..Demotion::default()
    };
    if limit >= 1.0 {
        // As much probe cost as the phase's own time or more is allowed: every row stays.
        return out;
    }
    // Not touch: with its fault rows demoted its kernel time would be nobody's, as no
    // syscall time contains it.
    for run in walls.iter().filter(|r| r.phase.is_syscall()) {
        let s = slot(0, run.phase);
        let mut costs: Vec<(usize, u64, u64)> = scout
            .rows
            .iter()
            .filter(|(sl, _, _)| *sl == s)
            .filter_map(|(_, row, st)| {
                let mechanism = rows.iter().find(|(r, _)| r == row)?.1;
                Some((*row, st.calls, (st.calls as f64 * cost.of(mechanism)?.ns) as u64))
            })
            .collect();
        costs.sort_by_key(|(_, _, c)| std::cmp::Reverse(*c));
        let total: u64 = costs.iter().map(|(_, _, c)| c).sum();
        let base = phase_rest(run, total, untraced) as f64;
        if base < min_phase_ns as f64 {
            continue;
        }
        let mut left: u64 = costs.iter().filter(|(r, _, _)| !out.has(*r)).map(|(_, _, c)| c).sum();
        for (row, calls, c) in costs {
            if (left as f64) <= limit * base {
                break;
            }
            if out.has(row) {
                continue;
            }
            left -= c;
            let why = DemotedRow {
                function: PROBE_TABLE[row].function.into(),
                phase: run.phase,
                calls,
                cost_ns: c,
                share: c as f64 / base,
                phase_share: total as f64 / base,
                outgrown: false,
                physical_runs: out.physical_runs,
            };
            out.demoted.push((row, why));
        }
    }
    for (sl, row, st) in &scout.rows {
        let Some(phase) = phase_of_slot(*sl) else { continue };
        if out.has(*row) {
            out.counts.push((phase, *row, *st));
        }
        out.children.push((phase, *row, st.child_calls));
    }
    for (sl, c) in &scout.counters {
        if let Some(phase) = phase_of_slot(*sl) {
            out.page_allocs.push((phase, c.page_allocs));
        }
    }
    out
}

/// What a scouted phase would take without its probes: the scout's wall time less their
/// calibrated cost `probes_ns`, or the untraced iteration's wall time where that is shorter.
/// Where the calibration says the probes cost the whole scout or more (under emulation it can
/// overstate a hit: 506 ms calibrated in a 353 ms compat type1 map), the scout's wall time
/// bounds the rest instead: read as zero, the phase looked too short to demote in and kept
/// 196608 probed calls, which cost its exact pass 2.6x its untraced time.
fn phase_rest(scout: &PhaseRun, probes_ns: u64, untraced: &[PhaseRun]) -> u64 {
    let scouted = scout
        .wall_ns
        .checked_sub(probes_ns)
        .filter(|rest| *rest > 0)
        .unwrap_or(scout.wall_ns);
    let plain = untraced
        .iter()
        .find(|u| u.phase == scout.phase)
        .map_or(u64::MAX, |u| u.wall_ns);
    scouted.min(plain).max(1)
}

/// How far over `--demote-above` an exact iteration's probe hits must cost one of its syscall
/// phases before the iteration runs again with more rows demoted: the scout's demotions
/// hold a like layout to the limit, so twice it means the buffer came in other runs.
const OUTGROWN_FACTOR: f64 = 2.0;

impl Demotion {
    /// Demotes, on top of the scout's, the rows an exact iteration (`seen`: its slots, read
    /// from the maps; `walls`: its phases) shows to cost a syscall phase over
    /// [`OUTGROWN_FACTOR`] times the limit: a 4 KiB buffer's pin and map calls follow its
    /// physical runs, which change from iteration to iteration (an iommufd memfd map's scout
    /// made 1819 IOMMU map calls, the exact iteration after it 27852). Returns the rows newly
    /// demoted (none: keep the iteration).
    pub fn outgrown(
        &mut self,
        seen: &Drained,
        walls: &[PhaseRun],
        rows: &[(usize, AttachedBy)],
        cost: &ProbeCost,
        limits: (f64, u64),
    ) -> Vec<DemotedRow> {
        // Numbered as the scout's slots, which `demotions` reads.
        let as_scout = Drained {
            counters: Vec::new(),
            samples: Vec::new(),
            rows: (seen.rows.iter())
                .filter_map(|(sl, r, st)| Some((slot(0, phase_of_slot(*sl)?), *r, *st)))
                .collect(),
        };
        let more = demotions(&as_scout, walls, &[], rows, cost, limits);
        if !more
            .demoted
            .iter()
            .any(|(_, d)| d.phase_share >= OUTGROWN_FACTOR * limits.0)
        {
            return Vec::new();
        }
        let mut added = Vec::new();
        for (row, mut why) in more.demoted {
            if self.has(row) {
                continue;
            }
            why.outgrown = true;
            self.counts.extend(more.counts.iter().filter(|(_, r, _)| *r == row));
            added.push(why.clone());
            self.demoted.push((row, why));
        }
        // Their callers' callee counts as the larger buffer made them: the rows that lose
        // callees to the demotion are found against these.
        for (phase, row, n) in more.children {
            match self.children.iter_mut().find(|(p, r, _)| *p == phase && *r == row) {
                Some(c) => c.2 = c.2.max(n),
                None => self.children.push((phase, row, n)),
            }
        }
        added
    }

    /// Whether `row` made far fewer probed calls in the exact pass (`drained`) than in the
    /// scout: its demoted callees' time is in its exclusive time, even where the sampled
    /// stacks do not show them (a tail call leaves no frame).
    fn lost_callees(&self, drained: &Drained, phase: Phase, row: usize) -> bool {
        let scout = self
            .children
            .iter()
            .find(|(p, r, _)| *p == phase && *r == row)
            .map_or(0, |c| c.2);
        let exact = drained
            .rows
            .iter()
            .filter(|(sl, r, _)| *r == row && phase_of_slot(*sl) == Some(phase))
            .map(|(_, _, st)| st.child_calls)
            .max()
            .unwrap_or(0);
        scout >= 2 * exact + 16
    }
}

/// The sampled categories of the stacks each row owns (is the innermost attached row of),
/// per phase, for the owners with a demoted row's frame or unprobed zeroing under them or that
/// lost probed callees to demotion ([`Demotion::lost_callees`]); `None` owns the kernel
/// stacks no attached row is on. They split the exclusive time the demoted rows' time is in.
/// In a phase without a syscall (touch) `None` always owns its stacks, user samples too: they
/// split its wall time outside the rows (the faults' entry and exit, and the loop's own user
/// time, which stays unattributed).
type Owners = BTreeMap<Phase, BTreeMap<Option<usize>, CategoryCounts>>;

fn owners(input: &CaseInput, stacks: &[Stack]) -> Owners {
    let mut out = Owners::new();
    let demoted = input.demotion;
    let mut seen: BTreeMap<Phase, std::collections::BTreeSet<Option<usize>>> = BTreeMap::new();
    let row_of = |frame: &str| {
        let f = base_function(frame);
        PROBE_TABLE.iter().position(|r| r.function == f)
    };
    for s in stacks {
        let (phase, names) = (s.phase, &s.names);
        if cut_short(names) {
            continue;
        }
        if names.is_empty() {
            if !phase.is_syscall() {
                out.entry(phase)
                    .or_default()
                    .entry(None)
                    .or_default()
                    .add(Category::User, s.count);
            }
            continue;
        }
        let owner_at = names
            .iter()
            .position(|n| row_of(n).is_some_and(|r| !demoted.has(r) && input.rows.iter().any(|(a, _)| *a == r)));
        let owner = owner_at.and_then(|i| row_of(&names[i]));
        let inner = &names[..owner_at.map_or(names.len(), |i| i + 1)];
        // Classified as the samples are, but never by a frame outside the owner.
        let (found, at) = inner
            .iter()
            .enumerate()
            .find_map(|(i, n)| Some((category_of(n)?, i)))
            .unwrap_or((
                owner.map_or(Category::Other, |r| PROBE_TABLE[r].category()),
                inner.len(),
            ));
        let cat = in_context(found, names.iter().skip(at + 1).map(String::as_str));
        out.entry(phase)
            .or_default()
            .entry(owner)
            .or_default()
            .add(cat, s.count);
        // Zeroing wins wherever it sits: an owner whose time holds zeroing no row of its own
        // times (a page clear inlined into a fault, or one too cheap per call to probe) is
        // split by its stacks, as one that holds a demoted row's time is.
        let unprobed_zeroing = cat == Category::Zeroing && owner.is_none_or(|r| PROBE_TABLE[r].category() != cat);
        if unprobed_zeroing || inner.iter().any(|n| row_of(n).is_some_and(|r| demoted.has(r))) {
            seen.entry(phase).or_default().insert(owner);
        }
    }
    for (phase, owners) in &mut out {
        owners.retain(|o, _| {
            (o.is_none() && !phase.is_syscall())
                || seen.get(phase).is_some_and(|s| s.contains(o))
                || o.is_some_and(|r| demoted.lost_callees(input.drained, *phase, r))
        });
    }
    out
}

/// `ns` split in proportion to `counts` (the rounding rest to the largest).
fn split(ns: u64, counts: &CategoryCounts) -> BTreeMap<Category, u64> {
    let total = counts.total().max(1);
    let mut out: BTreeMap<Category, u64> = counts
        .counts
        .iter()
        .map(|(c, n)| (*c, (ns as u128 * u128::from(*n) / u128::from(total)) as u64))
        .collect();
    let rest = ns - out.values().sum::<u64>();
    if let Some((_, v)) = out.iter_mut().max_by_key(|(_, v)| **v) {
        *v += rest;
    }
    out
}

/// What a case's attribution starts from.
pub struct CaseInput<'a> {
    /// The case's name in this run (with its size when the run sweeps sizes).
    pub label: &'a str,
    /// The case and size.
    pub workload: &'a Workload,
    /// The iterations of every pass that ran.
    pub runs: &'a PassRuns,
    /// What the probes recorded.
    pub drained: &'a Drained,
    /// Kernel symbols for the sampled stacks.
    pub symbols: Option<&'a KernelSymbols>,
    /// The probe-table rows that attached and how.
    pub rows: &'a [(usize, AttachedBy)],
    /// What was measured at all.
    pub coverage: &'a Coverage,
    /// What a probed call costs (calibrated at start-up), if measured.
    pub cost: Option<&'a ProbeCost>,
    /// The rows the exact pass ran without.
    pub demotion: &'a Demotion,
    /// The machine's pace beside the untraced iterations, ns (`floors::Pace`).
    pub pace: &'a [u64],
    /// Traced iterations run again for their layout.
    pub layout_reruns: &'a [LayoutRerun],
}

/// A case's report and the flamegraph inputs that go with it.
pub struct CaseOutput {
    /// The case as report.json has it.
    pub report: CaseReport,
    /// Sampled stacks per phase.
    pub folded: Vec<(Phase, Folded)>,
    /// The exact summary: phase -> category -> function, in ns.
    pub summary: Folded,
}

/// Sampled category counts and folded stacks per phase.
fn sampled_by_phase(stacks: &[Stack]) -> BTreeMap<Phase, (CategoryCounts, Folded)> {
    let mut by_phase: BTreeMap<Phase, (CategoryCounts, Folded)> = BTreeMap::new();
    for s in stacks {
        let (cats, folded) = by_phase.entry(s.phase).or_default();
        cats.add_stack(&s.names, s.count);
        let mut frames = vec![s.phase.name().to_owned()];
        if s.names.is_empty() {
            frames.push("[user]".into());
        }
        frames.extend(s.names.iter().rev().cloned());
        folded.add(frames, s.count);
    }
    by_phase
}

/// One sampled stack with its frames named (leaf first) and the phase it was taken in.
struct Stack {
    phase: Phase,
    names: Vec<String>,
    count: u64,
}

/// The samples' stacks, each resolved once for everything that reads them.
fn resolve_stacks(samples: &[RawSample], symbols: Option<&KernelSymbols>) -> Vec<Stack> {
    samples
        .iter()
        .filter_map(|s| {
            Some(Stack {
                phase: phase_of_slot(s.slot)?,
                names: crate::symbols::sample_frames(&s.kernel, s.page_clear, symbols),
                count: s.count,
            })
        })
        .collect()
}

/// The exact breakdown of `phase` for its median iteration: categories + probe overhead + time
/// off the CPU outside syscalls + unattributed = that iteration's wall time. `untraced` (the
/// untraced pass's wall times, when it ran) sets the probe overhead.
fn exact_breakdown(
    phase: Phase,
    exact: &[(u32, &PhaseRun)],
    input: &CaseInput,
    untraced: Option<Reference>,
    owners: Option<&BTreeMap<Option<usize>, CategoryCounts>>,
) -> Exact {
    if let Err(why) = &input.coverage.exact {
        return Exact {
            available: false,
            unavailable: Some(why.to_string()),
            ..Exact::default()
        };
    }
    let mut order: Vec<usize> = (0..exact.len()).collect();
    order.sort_by_key(|&i| exact[i].1.wall_ns);
    let Some(&median) = order.get(order.len().saturating_sub(1) / 2) else {
        return Exact::default();
    };
    let (it, run) = exact[median];
    let s = slot(it, phase);
    let c = counters_at(input.drained, s);
    let mut rows = rows_at(input, s, phase);
    let reference = untraced.map(|u| u.at(run.physical_runs));
    let measured = untraced.map(|u| u.cost_of(run).max(0) as u64);
    let noise = untraced.map(|u| u.band());
    // Outside a syscall (touch) the wall time outside the rows is the faults' entry and exit
    // and the loop's user time: the probed calls' callers, whose share of the probe cost it
    // holds.
    let outer = if phase.is_syscall() { c.syscall_ns } else { run.wall_ns };
    let unprobed = outer.saturating_sub(rows.iter().map(|r| r.exclusive_ns).sum());
    let paid = input.cost.map(|k| as_paid(k, &rows, phase));
    let hits = Hits {
        rows: &rows,
        events: event_hits(&c),
    };
    let calibrated = calibrated_total(&hits, paid.as_ref()).map(|t| t as u64);
    let wall = untraced.map_or(run.wall_ns, |u| u.comparable_wall(run));
    let basis = overhead_basis(wall, reference, calibrated, noise);
    let costs = call_costs(
        &hits,
        paid.as_ref(),
        measured.filter(|_| basis == Some(OverheadBasis::Measured)),
    );
    let events = hits.events;
    let unprobed_overhead = costs
        .as_ref()
        .map_or(0, |k| charge_overhead(&mut rows, events, k, unprobed));
    let (categories, split_ns) = categorise(&mut rows, unprobed - unprobed_overhead, owners, phase);
    let probe_overhead_ns = costs.map(|_| rows.iter().map(|r| r.overhead_ns).sum::<u64>() + unprobed_overhead);
    let off_cpu_outside_ns = (phase.is_syscall() && input.coverage.switches).then_some(c.off_cpu_outside_ns);
    let sum: u64 = categories.values().sum::<u64>() + probe_overhead_ns.unwrap_or(0) + off_cpu_outside_ns.unwrap_or(0);
    let probe_hits = rows.iter().map(|r| r.calls).sum();
    rows.extend(demoted_rows(input, phase));
    Exact {
        available: true,
        unavailable: None,
        iteration: median as u32,
        wall_ns: run.wall_ns,
        kernel_ns: c.syscall_ns,
        categories,
        probe_overhead_ns,
        probe_overhead_measured_ns: measured,
        probe_overhead_basis: basis.filter(|_| probe_overhead_ns.is_some()),
        untraced_noise_ns: noise,
        untraced_reference_ns: reference,
        physical_runs: run.physical_runs,
        probe_overhead_calibrated_ns: calibrated,
        probe_hits,
        off_cpu_outside_ns,
        unattributed_ns: run.wall_ns as i64 - sum as i64,
        rows,
        lost_events: c.stack_overflow + c.unmatched_exit,
        split_ns,
    }
}

/// The rows of slot `s` (of `phase`), the longest inclusive time first.
fn rows_at(input: &CaseInput, s: u32, phase: Phase) -> Vec<ExactRow> {
    let mut rows: Vec<ExactRow> = input
        .drained
        .rows
        .iter()
        .filter(|(sl, _, _)| *sl == s)
        .map(|(_, row, st)| {
            let mechanism = input
                .rows
                .iter()
                .find(|(r, _)| r == row)
                .map_or(AttachedBy::Kprobe, |(_, m)| *m);
            exact_row(*row, st, mechanism, phase)
        })
        .collect();
    rows.sort_by_key(|r| std::cmp::Reverse(r.inclusive_ns));
    rows
}

/// The exact categories of one phase: each row's exclusive time less probe cost under its
/// category, or split by the samples it owns where demoted rows' time is in it (likewise the
/// unprobed syscall time `unprobed_net`). Returns them and how much was split.
fn categorise(
    rows: &mut [ExactRow],
    unprobed_net: u64,
    owners: Option<&BTreeMap<Option<usize>, CategoryCounts>>,
    phase: Phase,
) -> (BTreeMap<Category, u64>, u64) {
    let mut categories: BTreeMap<Category, u64> = CATEGORIES
        .iter()
        .filter(|c| **c != Category::User)
        .map(|c| (*c, 0))
        .collect();
    let owned = |row: Option<usize>| owners.and_then(|o| o.get(&row));
    let mut split_ns = 0;
    for r in rows.iter_mut() {
        let net = r.exclusive_ns - r.overhead_ns;
        match owned(PROBE_TABLE.iter().position(|t| t.function == r.function)) {
            Some(counts) => {
                r.by_samples = split(net, counts);
                split_ns += net;
                for (c, ns) in &r.by_samples {
                    *categories
                        .entry(crate::category::in_phase(*c, phase.is_dma()))
                        .or_default() += ns;
                }
            }
            None => *categories.entry(r.category).or_default() += net,
        }
    }
    // Syscall time that no probed row covered is the syscall's own work: `other` (or, where
    // demoted rows' time is in it, what the stacks no attached row is on say). Outside a
    // syscall the samples split it, their user-space part left unattributed; without samples
    // all of it is.
    match owned(None) {
        Some(counts) => {
            for (c, ns) in split(unprobed_net, counts)
                .into_iter()
                .filter(|(c, _)| *c != Category::User)
            {
                split_ns += ns;
                *categories
                    .entry(crate::category::in_phase(c, phase.is_dma()))
                    .or_default() += ns;
            }
        }
        None if phase.is_syscall() => *categories.entry(Category::Other).or_default() += unprobed_net,
        None => {}
    }
    (categories, split_ns)
}

/// The demoted rows of `phase` as the warm-up iteration counted them, with no time of their
/// own (it is in their callers').
fn demoted_rows(input: &CaseInput, phase: Phase) -> Vec<ExactRow> {
    let mechanism = |row: usize| {
        input
            .rows
            .iter()
            .find(|(r, _)| *r == row)
            .map_or(AttachedBy::Kprobe, |(_, m)| *m)
    };
    input
        .demotion
        .counts
        .iter()
        .filter(|(ph, _, _)| *ph == phase)
        .map(|(_, row, st)| {
            let counted = RowStats {
                calls: st.calls,
                amount: st.amount,
                ..RowStats::default()
            };
            ExactRow {
                demoted: true,
                ..exact_row(*row, &counted, mechanism(*row), phase)
            }
        })
        .collect()
}

/// One phase's probe hits: its rows' calls and its tracepoint hits.
struct Hits<'a> {
    rows: &'a [ExactRow],
    /// Raw tracepoint hits of the workload thread in the phase.
    events: u64,
}

/// The exact pass's tracepoint hits in a phase: each syscall's entry and exit, each user
/// fault and each page allocation.
fn event_hits(c: &PhaseCounters) -> u64 {
    2 * c.syscalls + c.user_faults + c.page_allocs.iter().sum::<u64>()
}

/// The most the measured probe cost may be, as a multiple of the calibrated one, for the
/// hits to be what it measured: in a slow boot a hit cost up to 25 times its calibration on
/// large maps. Beyond it the difference is the machine or the layout, not the probes: in
/// three default matrices 167 phases read more, with a median of 3 hits, and charged 3.1 s to
/// probes in all (a memfd's close, 379 ms of 542 for one hit).
const MEASURED_PLAUSIBLE: u64 = 25;

/// Which cost the rows' probe charges follow (None: neither is known). The measured one
/// (`wall` less the untraced `reference`) where it tells the calibration wrong: further from
/// the `calibrated` total than one untraced iteration's own `noise` moves it, not below the
/// reference (no probe makes a phase faster: an exact iteration under its untraced line is
/// noise), and not beyond what the hits can cost ([`MEASURED_PLAUSIBLE`]). Else the
/// calibration, as it is: a 1 ms map's exact iteration once ran 0.5 ms under its single
/// untraced one, and the measured 0 left every hit's cost in the rows.
fn overhead_basis(
    wall: u64,
    reference: Option<u64>,
    calibrated: Option<u64>,
    noise: Option<u64>,
) -> Option<OverheadBasis> {
    let Some(reference) = reference else {
        return calibrated.map(|_| OverheadBasis::Calibration);
    };
    let Some(calibrated) = calibrated else {
        return Some(OverheadBasis::Measured);
    };
    let measured = wall.checked_sub(reference);
    let apart = measured.is_some_and(|m| {
        m.abs_diff(calibrated) > noise.unwrap_or(0) && m <= MEASURED_PLAUSIBLE.saturating_mul(calibrated)
    });
    Some(if apart {
        OverheadBasis::Measured
    } else {
        OverheadBasis::Calibration
    })
}

/// The calibration as one phase's `rows` pay it, per mechanism: a hit on the fault path
/// costs what it did in faults taken the way the phase takes them (user faults in a touch,
/// the kernel's page walk in a populate or a pin), any other hit the charged cost; the
/// mechanism's cost is their mean over its calls. A context that measured nothing leaves the
/// charged cost, and one that measured less than the syscall loop counts as the loop: a
/// fault leaves the probe no warmer than the loop does (each call there follows 16 KiB of
/// writes), so such a reading is the machine's pace changing between rounds (an fentry hit
/// once read 352 ns in user faults against 850 in the loop, and the run's other phases
/// then came out at 0.24-0.28x of their measured cost).
fn as_paid(cost: &ProbeCost, rows: &[ExactRow], phase: Phase) -> ProbeCost {
    let faults = match phase {
        Phase::Touch => cost.in_fault,
        _ => cost.in_kernel_fault,
    };
    let mut paid = cost.clone();
    for by in [AttachedBy::Fentry, AttachedBy::Kprobe] {
        let (Some(charged), Some(measured)) = (cost.of(by), faults.and_then(|f| f.of(by))) else {
            continue;
        };
        let in_fault = measured.max(cost.in_syscall_loop.and_then(|l| l.of(by)).unwrap_or(0.0));
        let calls = |fault_path: bool| -> u64 {
            rows.iter()
                .filter(|r| r.mechanism == by && r.category.on_fault_path() == fault_path)
                .map(|r| r.calls)
                .sum()
        };
        let (on, off) = (calls(true), calls(false));
        if on > 0 {
            let ns = (on as f64 * in_fault + off as f64 * charged.ns) / (on + off) as f64;
            paid.set(by, Some(CallCost { ns, ..charged }));
        }
    }
    paid
}

/// What the calibrated cost per hit adds up to over one phase's rows and tracepoint hits,
/// when the calibration covers every mechanism the rows used (tracepoints: where measured).
fn calibrated_total(hits: &Hits, calibrated: Option<&ProbeCost>) -> Option<f64> {
    let c = calibrated?;
    let rows = hits
        .rows
        .iter()
        .map(|r| c.of(r.mechanism).map(|k| r.calls as f64 * k.ns))
        .sum::<Option<f64>>()?;
    Some(rows + c.tracepoint.map_or(0.0, |t| hits.events as f64 * t.ns))
}

/// The cost of a probed call, by mechanism, for one phase's rows. The calibration gives each
/// mechanism's cost and own share; where the phase's `measured` cost (wall time over the
/// untraced median) is known, the costs are scaled to add up to it, since under emulation a
/// hit inside the workload costs more than in the calibration loop. Without a calibration
/// the measured cost is spread evenly over the calls, half inside each call and half in its
/// caller. None when neither is known.
fn call_costs(hits: &Hits, calibrated: Option<&ProbeCost>, measured: Option<u64>) -> Option<ProbeCost> {
    let calls: u64 = hits.rows.iter().map(|r| r.calls).sum();
    let even = CallCost {
        ns: 1.0,
        own_share: 0.5,
    };
    let calibrated_sum = calibrated_total(hits, calibrated);
    let (weights, total) = match (calibrated, calibrated_sum) {
        (Some(c), Some(total)) => (c.clone(), total),
        _ => (
            ProbeCost {
                fentry: Some(even),
                kprobe: Some(even),
                ..ProbeCost::default()
            },
            calls as f64,
        ),
    };
    let scale = match measured {
        Some(m) if total > 0.0 => m as f64 / total,
        None if calibrated_sum.is_some() => 1.0,
        _ => return None,
    };
    let scaled = |k: Option<CallCost>| k.map(|k| CallCost { ns: k.ns * scale, ..k });
    Some(ProbeCost {
        fentry: scaled(weights.fentry),
        kprobe: scaled(weights.kprobe),
        tracepoint: scaled(weights.tracepoint),
        ..ProbeCost::default()
    })
}

/// Takes the probes' cost out of the rows where it landed: a call's own share stays in its
/// own exclusive time, the rest in its caller's (a probed row, or the unprobed syscall time
/// `unprobed` for top-level calls); a tracepoint hit's cost stays in the innermost probed call
/// around it, or the unprobed time for the `events` outside every row. Sets each row's
/// `overhead_ns` (never more than its exclusive time) and returns the part charged to the
/// unprobed time.
fn charge_overhead(rows: &mut [ExactRow], events: u64, costs: &ProbeCost, unprobed: u64) -> u64 {
    let cost = |by: AttachedBy| {
        costs
            .of(by)
            .map_or((0.0, 0.0), |c| (c.ns * c.own_share, c.ns * (1.0 - c.own_share)))
    };
    let (_, kprobe_caller) = cost(AttachedBy::Kprobe);
    let (_, fentry_caller) = cost(AttachedBy::Fentry);
    let caller_share = |kprobe_calls: u64, all_calls: u64| {
        kprobe_calls as f64 * kprobe_caller + all_calls.saturating_sub(kprobe_calls) as f64 * fentry_caller
    };
    let event = costs.tracepoint.map_or(0.0, |t| t.ns);
    let (mut calls, mut kprobe_calls, mut child_calls, mut child_kprobe_calls) = (0, 0, 0, 0);
    let mut row_events = 0;
    for r in rows.iter_mut() {
        let own = r.calls as f64 * cost(r.mechanism).0 + r.event_hits as f64 * event;
        let charge = own + caller_share(r.child_kprobe_calls, r.child_calls);
        r.overhead_ns = (charge as u64).min(r.exclusive_ns);
        row_events += r.event_hits;
        calls += r.calls;
        kprobe_calls += if r.mechanism == AttachedBy::Kprobe { r.calls } else { 0 };
        child_calls += r.child_calls;
        child_kprobe_calls += r.child_kprobe_calls;
    }
    let top = caller_share(
        kprobe_calls.saturating_sub(child_kprobe_calls),
        calls.saturating_sub(child_calls),
    ) + events.saturating_sub(row_events) as f64 * event;
    (top as u64).min(unprobed)
}

/// The counters recorded in `slot` (zero where nothing was).
fn counters_at(drained: &Drained, slot: u32) -> PhaseCounters {
    drained
        .counters
        .iter()
        .find(|(sl, _)| *sl == slot)
        .map(|(_, c)| *c)
        .unwrap_or_default()
}

/// `pass`'s runs of `phase`, with their slot iterations.
fn runs_of(runs: &PassRuns, pass: Pass, phase: Phase) -> Vec<(u32, &PhaseRun)> {
    runs.get(&pass)
        .into_iter()
        .flatten()
        .filter_map(|(it, r)| r.iter().find(|p| p.phase == phase).map(|p| (*it, p)))
        .collect()
}

fn wall_stats(runs: &[(u32, &PhaseRun)]) -> Stats {
    Stats::of(runs.iter().map(|(_, p)| p.wall_ns).collect())
}

/// The iterations' physical runs, when every one was read.
fn layout_stats(runs: &[(u32, &PhaseRun)]) -> Option<Stats> {
    runs.iter()
        .map(|(_, p)| p.physical_runs)
        .collect::<Option<Vec<u64>>>()
        .map(Stats::of)
}

/// The untraced pass of a phase, which traced iterations are held against: its wall times and,
/// where every iteration's layout was read, the line that predicts them from it (how
/// physically contiguous a buffer's pages come changes from iteration to iteration, and a
/// 4 KiB buffer's map time follows it).
#[derive(Clone, Copy)]
struct Reference<'a> {
    stats: &'a Stats,
    layout: Option<LayoutModel>,
    /// The untraced iterations' physical runs, in the order of `stats.runs`.
    runs: Option<&'a Stats>,
    /// The untraced iterations' median time off the CPU.
    off_cpu_ns: u64,
}

impl Reference<'_> {
    /// Traced iteration `run`'s wall time less the time it spent off the CPU beyond the
    /// untraced iterations: other tasks' work (a probe switch leaves some behind), which no
    /// probe's hit costs. On one guest CPU that was all of 0.4-4.1 ms per phase that the hits
    /// did not explain.
    fn comparable_wall(&self, run: &PhaseRun) -> u64 {
        let off_beyond = run.off_cpu_ns() as i64 - self.off_cpu_ns as i64;
        (run.wall_ns as i64 - off_beyond).max(0) as u64
    }

    /// What traced iteration `run` took beyond an untraced one at its layout
    /// ([`Reference::comparable_wall`]).
    fn cost_of(&self, run: &PhaseRun) -> i64 {
        self.comparable_wall(run) as i64 - self.at(run.physical_runs) as i64
    }

    /// What an untraced iteration takes on a buffer of `runs` physical runs (the median
    /// where either side's layout is unknown).
    fn at(&self, runs: Option<u64>) -> u64 {
        match (self.layout, runs) {
            (Some(m), Some(r)) => m.predict(r),
            _ => self.stats.median,
        }
    }

    /// How far the untraced iterations themselves fall from it, each at its own layout: the
    /// most one iteration's noise moved one of them (0 with a single iteration).
    fn band(&self) -> u64 {
        self.residuals().into_iter().map(f64::abs).fold(0.0, f64::max) as u64
    }

    /// The untraced iterations' distances from it, each at its own layout (signed: above the
    /// line positive).
    fn residuals(&self) -> Vec<f64> {
        let runs = |i: usize| self.runs.and_then(|r| r.runs.get(i).copied());
        (self.stats.runs.iter().enumerate())
            .map(|(i, w)| *w as f64 - self.at(runs(i)) as f64)
            .collect()
    }

    /// What the untraced iterations' scatter makes of a sum of `n` traced iterations' times
    /// less the line (one standard error): each traced iteration scatters as one untraced
    /// does, and the line is placed only as well as its iterations place it. None with fewer
    /// than two untraced iterations, whose scatter cannot be read.
    fn sum_noise(&self, n: u32) -> Option<u64> {
        let r = self.residuals();
        let k = r.len();
        if k < 2 {
            return None;
        }
        let spread = (r.iter().map(|x| x * x).sum::<f64>() / (k - 1) as f64).sqrt();
        let n = f64::from(n);
        Some((spread * (n + n * n / k as f64).sqrt()) as u64)
    }

    /// Whether a buffer of `runs` physical runs lies outside the layouts the line was fit on
    /// (beyond a tenth either way): the line holds its prediction there at its nearest end.
    fn beyond(&self, runs: Option<u64>) -> bool {
        match (self.layout.filter(LayoutModel::follows), runs) {
            (Some(m), Some(r)) => {
                let (lo, hi) = m.runs_seen;
                (r as f64) < lo as f64 * 0.9 || r as f64 > hi as f64 * 1.1
            }
            _ => false,
        }
    }

    /// `traced` iterations against it: per iteration at its own layout where known.
    fn ratio(&self, traced: &[(u32, &PhaseRun)], wall: &Stats) -> Option<Ratio> {
        let matched = self.layout.is_some_and(|l| l.follows()) && traced.iter().all(|(_, p)| p.physical_runs.is_some());
        if !matched {
            return Ratio::of(wall, self.stats);
        }
        let mut r: Vec<f64> = traced
            .iter()
            .map(|(_, p)| p.wall_ns as f64 / self.at(p.physical_runs).max(1) as f64)
            .collect();
        let median = crate::layout::median(&mut r)?;
        Some(Ratio {
            median,
            low: *r.first()?,
            high: *r.last()?,
            layout_matched: true,
        })
    }
}

/// The traced passes' times and their cost against the untraced pass (when it ran and the
/// phase is long enough for a ratio to mean something).
fn pass_times(input: &CaseInput, phase: Phase, untraced: Option<Reference>) -> BTreeMap<Pass, PassTimes> {
    [Pass::Exact, Pass::Sampled]
        .into_iter()
        .filter_map(|pass| {
            let runs = runs_of(input.runs, pass, phase);
            (!runs.is_empty()).then(|| {
                let wall_ns = wall_stats(&runs);
                let ratio = untraced
                    .filter(|u| u.stats.median >= MIN_RATIO_NS)
                    .and_then(|u| u.ratio(&runs, &wall_ns));
                let physical_runs = layout_stats(&runs);
                let probe_cost = untraced
                    .filter(|_| pass == Pass::Exact)
                    .and_then(|u| pass_cost(input, phase, &runs, u));
                (
                    pass,
                    PassTimes {
                        wall_ns,
                        ratio,
                        physical_runs,
                        probe_cost,
                    },
                )
            })
        })
        .collect()
}

/// The exact pass's probe cost over all its iterations `runs` of `phase`: each one's
/// calibrated hits, and its wall time less the `untraced` line at its layout. None without a
/// calibration that covers the rows' mechanisms.
fn pass_cost(input: &CaseInput, phase: Phase, runs: &[(u32, &PhaseRun)], untraced: Reference) -> Option<PassCost> {
    let mut sum = PassCost::default();
    let cost = input.cost?;
    // What the hits cost at each context's per-hit costs, where every context measured them.
    let contexts = [cost.in_syscall_loop, cost.in_fault, cost.in_kernel_fault]
        .into_iter()
        .map(|c| c.map(|c| cost.in_context(Some(c))))
        .collect::<Option<Vec<ProbeCost>>>();
    let mut range = vec![0.0; contexts.as_ref().map_or(0, Vec::len)];
    for (it, run) in runs {
        let s = slot(*it, phase);
        let rows = rows_at(input, s, phase);
        let hits = Hits {
            rows: &rows,
            events: event_hits(&counters_at(input.drained, s)),
        };
        sum.calibrated_ns += calibrated_total(&hits, Some(&as_paid(cost, &rows, phase)))? as u64;
        for (total, context) in range.iter_mut().zip(contexts.iter().flatten()) {
            *total += calibrated_total(&hits, Some(context))?;
        }
        sum.hits += rows.iter().map(|r| r.calls).sum::<u64>() + hits.events;
        sum.measured_ns += untraced.cost_of(run);
        sum.beyond_line += u32::from(untraced.beyond(run.physical_runs));
        sum.iterations += 1;
    }
    sum.noise_ns = untraced.sum_noise(sum.iterations);
    sum.calibrated_range_ns = contexts.map(|_| {
        let (low, high) = range.iter().fold((f64::MAX, 0.0f64), |(l, h), &t| (l.min(t), h.max(t)));
        (low as u64, high as u64)
    });
    Some(sum)
}

fn exact_row(row: usize, st: &RowStats, mechanism: AttachedBy, phase: Phase) -> ExactRow {
    let r = &PROBE_TABLE[row];
    ExactRow {
        function: r.function.into(),
        category: crate::category::in_phase(r.category(), phase.is_dma()),
        mechanism,
        calls: st.calls,
        inclusive_ns: st.inclusive_ns,
        exclusive_ns: st.exclusive_ns,
        child_calls: st.child_calls,
        child_kprobe_calls: st.child_kprobe_calls,
        event_hits: st.event_hits,
        overhead_ns: 0,
        amount: st.amount,
        unit: r.amount.map(|(_, u)| u),
        demoted: false,
        by_samples: BTreeMap::new(),
    }
}

/// One phase's report from its iterations, counters and samples.
fn phase_report(phase: Phase, input: &CaseInput, cats: &CategoryCounts, owners: &Owners) -> Option<PhaseReport> {
    let headline = [Pass::Untraced, Pass::Exact, Pass::Sampled]
        .into_iter()
        .map(|p| (p, runs_of(input.runs, p, phase)))
        .find(|(_, r)| !r.is_empty())?;
    let (wall_pass, head) = headline;
    let wall = wall_stats(&head);
    let exact = runs_of(input.runs, Pass::Exact, phase);
    // Counters come from the exact pass: its tracepoints are the ones that count.
    let counters: Vec<PhaseCounters> = exact
        .iter()
        .map(|(it, _)| counters_at(input.drained, slot(*it, phase)))
        .collect();
    let all_traced: Vec<PhaseCounters> = (0..slots(MAX_SLOT_ITERATIONS))
        .filter(|s| phase_of_slot(*s) == Some(phase))
        .map(|s| counters_at(input.drained, s))
        .collect();
    let med = |f: fn(&PhaseCounters) -> u64| Stats::of(counters.iter().map(f).collect()).median;
    // A non-populating mmap only reserves addresses: a GiB/s of it would be meaningless.
    let moves_memory = match phase {
        Phase::Close | Phase::MemfdCreate => false,
        Phase::Mmap => input.workload.case.prefault == crate::matrix::Prefault::Populate,
        _ => true,
    };
    let gib_per_s = if wall.median > 0 && moves_memory {
        input.workload.size.bytes() as f64 / (1u64 << 30) as f64 / (wall.median as f64 / 1e9)
    } else {
        0.0
    };
    let (cov, case) = (input.coverage, input.label);
    let file = |ext: &str| cov.samples.then(|| format!("{case}/{}.{ext}", phase.name()));
    let physical_runs = layout_stats(&head);
    let layout = physical_runs
        .as_ref()
        .filter(|_| wall_pass == Pass::Untraced)
        .and_then(|r| {
            let points: Vec<(u64, u64)> = r.runs.iter().copied().zip(wall.runs.iter().copied()).collect();
            LayoutModel::fit(&points)
        });
    let untraced = (wall_pass == Pass::Untraced).then_some(Reference {
        stats: &wall,
        layout,
        runs: physical_runs.as_ref(),
        off_cpu_ns: Stats::of(head.iter().map(|(_, p)| p.off_cpu_ns()).collect()).median,
    });
    let mut report = PhaseReport {
        name: phase,
        wall_pass,
        wall_ci: median_ci(&wall.runs),
        passes: pass_times(input, phase, untraced),
        exact: exact_breakdown(phase, &exact, input, untraced, owners.get(&phase)),
        kernel_ns: cov
            .syscalls
            .then(|| Stats::of(counters.iter().map(|c| c.syscall_ns).collect())),
        kernel_share: cov.syscalls.then(|| kernel_share(&exact, &counters)).flatten(),
        gib_per_s,
        sampled: sampled_report(phase, input, cats, &all_traced),
        per_page_ns: BTreeMap::new(),
        counters: Counters {
            cpu_faults: cov.cpu_faults.then(|| med(|c| c.user_faults)),
            page_allocs: cov.page_allocs.then(|| page_allocs(input.demotion, phase)).flatten(),
            minor_faults: Stats::of(head.iter().map(|(_, p)| p.minor_faults).collect()).median,
            major_faults: Stats::of(head.iter().map(|(_, p)| p.major_faults).collect()).median,
            syscalls: cov.syscalls.then(|| med(|c| c.syscalls)),
            unbalanced: all_traced.iter().map(|c| c.unbalanced).sum(),
            off_cpu: (cov.switches && !exact.is_empty()).then(|| off_cpu(&exact, &counters)),
        },
        wall_ns: wall,
        physical_runs,
        layout,
        folded: file("folded"),
        flamegraph: file("svg"),
    };
    report.per_page_ns = per_page_ns(&report, input.workload.size.bytes());
    Some(report)
}

/// The exact iterations' time off the CPU (medians), with the kernel's count of their
/// context switches.
fn off_cpu(exact: &[(u32, &PhaseRun)], counters: &[PhaseCounters]) -> OffCpu {
    let med = |f: fn(&PhaseCounters) -> u64| Stats::of(counters.iter().map(f).collect()).median;
    OffCpu {
        ns: med(|c| c.off_cpu_ns),
        switches: med(|c| c.switches),
        blocked: med(|c| c.blocked),
        rusage_switches: Stats::of(exact.iter().map(|(_, r)| r.context_switches).collect()).median,
    }
}

/// The samples' shares from `cats` and their counts from the slots' `counters`.
pub fn sampled_counts(cats: &CategoryCounts, counters: &[PhaseCounters]) -> Sampled {
    let sum = |f: fn(&PhaseCounters) -> u64| counters.iter().map(f).sum();
    Sampled {
        samples: cats.total() + cats.cut,
        cut: cats.cut,
        lost: sum(|c| c.lost_samples),
        late_periods: sum(|c| c.late_periods),
        no_caller: sum(|c| c.no_caller),
        categories: cats.shares(),
        ..Sampled::default()
    }
}

/// The phase's samples: shares from `cats`, counts from the traced slots' counters
/// `all_traced`, and the sampled iterations' time off the CPU and in the sampler's program.
fn sampled_report(phase: Phase, input: &CaseInput, cats: &CategoryCounts, all_traced: &[PhaseCounters]) -> Sampled {
    let slots: Vec<PhaseCounters> = runs_of(input.runs, Pass::Sampled, phase)
        .iter()
        .map(|(it, _)| counters_at(input.drained, slot(*it, phase)))
        .collect();
    Sampled {
        off_cpu_ns: input
            .coverage
            .switches
            .then(|| slots.iter().map(|c| c.off_cpu_ns).sum()),
        sampler_ns: slots.iter().map(|c| c.sampler_ns).sum(),
        ..sampled_counts(cats, all_traced)
    }
}

/// Page allocations by order (only the orders that occurred) in the scout iteration, which
/// allocates as the measured ones do; None without a scout.
fn page_allocs(scout: &Demotion, phase: Phase) -> Option<BTreeMap<u32, u64>> {
    let (_, by_order) = scout.page_allocs.iter().find(|(p, _)| *p == phase)?;
    Some(
        (0..crate::abi::PAGE_ORDERS)
            .map(|order| (order as u32, by_order[order]))
            .filter(|(_, n)| *n > 0)
            .collect(),
    )
}

/// ns per 4 KiB page of a `bytes` buffer, per category, at `p`'s headline time.
fn per_page_ns(p: &PhaseReport, bytes: u64) -> BTreeMap<Category, f64> {
    let pages = (bytes / 4096).max(1) as f64;
    let wall = p.wall_ns.median as f64;
    let shares: BTreeMap<Category, f64> = if p.exact.available && p.exact.wall_ns > 0 {
        CATEGORIES.iter().map(|c| (*c, p.exact.share(*c))).collect()
    } else {
        p.sampled.categories.clone()
    };
    shares
        .into_iter()
        .filter(|(_, s)| *s > 0.0)
        .map(|(c, s)| (c, s * wall / pages))
        .collect()
}

/// Median over the exact pass's iterations of syscall time / wall time (None: no iteration
/// long enough to divide by).
fn kernel_share(exact: &[(u32, &PhaseRun)], counters: &[PhaseCounters]) -> Option<f64> {
    let mut shares: Vec<f64> = exact
        .iter()
        .zip(counters)
        .filter(|((_, r), _)| r.wall_ns > 0)
        .map(|((_, r), c)| (c.syscall_ns as f64 / r.wall_ns as f64).min(1.0))
        .collect();
    shares.sort_by(f64::total_cmp);
    shares.get(shares.len() / 2).copied()
}

/// phase -> category -> function, weighted by exact exclusive ns (median iterations), with the
/// syscall time no row covered and the unattributed rest as their own frames.
pub fn summary_folded(phases: &[PhaseReport]) -> Folded {
    let mut f = Folded::default();
    for p in phases {
        let name = p.name.name();
        let mut covered = 0;
        for r in &p.exact.rows {
            let own = r.exclusive_ns.saturating_sub(r.overhead_ns);
            let parts = match r.by_samples.is_empty() {
                true => vec![(r.category, own)],
                false => r.by_samples.iter().map(|(c, ns)| (*c, *ns)).collect(),
            };
            for (cat, ns) in parts {
                f.add([name, &format!("cat:{cat}"), &r.function], ns);
                if cat == Category::Other {
                    covered += ns;
                }
            }
        }
        f.add([name, "[probe overhead]"], p.exact.probe_overhead_ns.unwrap_or(0));
        f.add(
            [name, "[off CPU outside syscalls]"],
            p.exact.off_cpu_outside_ns.unwrap_or(0),
        );
        let other = p.exact.categories.get(&Category::Other).copied().unwrap_or(0);
        f.add(
            [name, "cat:other", "[syscall, unprobed]"],
            other.saturating_sub(covered),
        );
        f.add([name, "[unattributed]"], p.exact.unattributed_ns.max(0) as u64);
    }
    f.stacks.retain(|_, n| *n > 0);
    f
}

/// Builds a case's report from what was measured and recorded.
pub fn case_report(input: &CaseInput) -> CaseOutput {
    let stacks = resolve_stacks(&input.drained.samples, input.symbols);
    let mut sampled = sampled_by_phase(&stacks);
    let owners = owners(input, &stacks);
    let mut phases = Vec::new();
    let mut folded = Vec::new();
    for &phase in PHASES {
        let (cats, f) = sampled.remove(&phase).unwrap_or_default();
        if let Some(p) = phase_report(phase, input, &cats, &owners) {
            phases.push(p);
            folded.push((phase, f));
        }
    }
    let w = input.workload;
    let name = input.label.to_owned();
    CaseOutput {
        summary: summary_folded(&phases),
        folded,
        report: CaseReport {
            summary_flamegraph: input.coverage.exact.is_ok().then(|| format!("{name}/summary.svg")),
            name,
            iommu_mode: w.case.mode,
            backing: w.case.backing,
            prefault: w.case.prefault,
            map_ioctl: w
                .case
                .mode
                .map(|m| dma::map_ioctl(m, w.case.backing.memfd()).to_owned()),
            size_bytes: w.size.bytes(),
            page_size: w.case.backing.page_size(),
            phases,
            demoted: input.demotion.demoted.iter().map(|(_, d)| d.clone()).collect(),
            scout_physical_runs: input.demotion.physical_runs,
            layout_reruns: input.layout_reruns.to_vec(),
            pace_ns: (!input.pace.is_empty()).then(|| Stats::of(input.pace.to_vec())),
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{
        matrix::{Backing, Case, DmaMode, Prefault},
        probes::ContextCost,
    };

    fn row(name: &str) -> usize {
        PROBE_TABLE.iter().position(|r| r.function == name).unwrap()
    }

    fn run(phase: Phase, wall_ns: u64) -> PhaseRun {
        PhaseRun {
            context_switches: 0,
            phase,
            wall_ns,
            cpu_ns: wall_ns,
            minor_faults: 0,
            major_faults: 0,
            physical_runs: None,
        }
    }

    fn stats(exclusive_ns: u64) -> RowStats {
        RowStats {
            calls: 2,
            inclusive_ns: exclusive_ns,
            exclusive_ns,
            amount: 8,
            child_calls: 0,
            child_kprobe_calls: 0,
            event_hits: 0,
        }
    }

    fn exact(function: &str, by: AttachedBy, calls: u64, children: (u64, u64), exclusive_ns: u64) -> ExactRow {
        ExactRow {
            function: function.into(),
            category: Category::Other,
            mechanism: by,
            calls,
            inclusive_ns: exclusive_ns,
            exclusive_ns,
            child_calls: children.0,
            child_kprobe_calls: children.1,
            event_hits: 0,
            overhead_ns: 0,
            amount: 0,
            unit: None,
            demoted: false,
            by_samples: BTreeMap::new(),
        }
    }

    #[test]
    fn time_off_the_cpu_beyond_the_untraced_iterations_is_not_probe_cost() {
        let walls = Stats::of(vec![273_400_000; 5]);
        let u = Reference {
            stats: &walls,
            layout: None,
            runs: None,
            off_cpu_ns: 200_000,
        };
        // A guest's hugetlb touch on one vCPU: 3.51 ms over the untraced median, 0.69 ms of
        // it off the CPU where the untraced iterations were off it 0.2 ms.
        let mut r = run(Phase::Touch, 276_910_000);
        r.cpu_ns = r.wall_ns - 690_000;
        assert_eq!(u.cost_of(&r), 3_510_000 - 490_000);
        assert_eq!(u.comparable_wall(&r), 276_910_000 - 490_000);
        // Off it less than they were: held to their time off it too.
        r.cpu_ns = r.wall_ns - 100_000;
        assert_eq!(u.cost_of(&r), 3_510_000 + 100_000);
    }

    #[test]
    fn measured_probe_cost_is_split_evenly_per_call() {
        // One top-level call making 99 probed calls: 100 calls, 200 halves of 10 ns each.
        let mut rows = [
            exact("vfio_pin_map_dma", AttachedBy::Kprobe, 1, (99, 0), 5_000),
            exact("iommu_map", AttachedBy::Fentry, 99, (0, 0), 50_000),
        ];
        let costs = call_costs(&Hits { rows: &rows, events: 0 }, None, Some(2_000)).unwrap();
        let unprobed = charge_overhead(&mut rows, 0, &costs, 1_000_000);
        assert_eq!(rows[0].overhead_ns, 1_000);
        assert_eq!(rows[1].overhead_ns, 990);
        assert_eq!(unprobed, 10);
        // Never more than a row measured.
        rows[0].exclusive_ns = 300;
        charge_overhead(&mut rows, 0, &costs, 1_000_000);
        assert_eq!(rows[0].overhead_ns, 300);
        assert!(call_costs(&Hits { rows: &rows, events: 0 }, None, None).is_none());
        assert!(call_costs(&Hits { rows: &[], events: 0 }, None, Some(5)).is_none());
    }

    #[test]
    fn the_measured_cost_is_charged_only_where_it_tells_the_calibration_wrong() {
        use OverheadBasis::{Calibration, Measured};
        // Guest maps: (exact wall, untraced reference, calibrated, untraced noise).
        // Every row kept on a 4 KiB memfd: 397 ms measured against 329 calibrated, with the
        // untraced iterations 20 ms apart at most.
        let kept = overhead_basis(729_608_912, Some(332_712_139), Some(329_295_875), Some(20_000_000));
        assert_eq!(kept, Some(Measured));
        // A 1 ms hugetlb map 0.5 ms under its single untraced iteration: noise, not a free probe.
        assert_eq!(
            overhead_basis(1_131_923, Some(1_641_781), Some(205_486), Some(0)),
            Some(Calibration)
        );
        // 0.27 ms measured, 0.64 calibrated, the untraced iterations 0.63-1.60 ms: within noise.
        assert_eq!(
            overhead_basis(1_142_742, Some(876_147), Some(638_842), Some(728_367)),
            Some(Calibration)
        );
        // With one untraced iteration there is no noise to hold a measurement against.
        assert_eq!(
            overhead_basis(1_142_742, Some(876_147), Some(638_842), Some(0)),
            Some(Measured)
        );
        // A memfd's close with one hit (2 us calibrated) 379 ms over its untraced line, 3 ms
        // more than the untraced iterations fell from it: the machine, not the probe.
        assert_eq!(
            overhead_basis(541_800_000, Some(162_700_000), Some(2_000), Some(376_000_000)),
            Some(Calibration)
        );
        // 25 times the calibration is still the hits.
        assert_eq!(
            overhead_basis(200_000_000, Some(150_000_000), Some(2_000_000), Some(1_000_000)),
            Some(Measured)
        );
        assert_eq!(overhead_basis(5, None, Some(3), None), Some(Calibration));
        assert_eq!(overhead_basis(5, Some(4), None, Some(0)), Some(Measured));
        assert_eq!(overhead_basis(5, None, None, None), None);
    }

    #[test]
    fn calibrated_probe_cost_follows_the_mechanism() {
        let cost = ProbeCost {
            fentry: Some(CallCost {
                ns: 100.0,
                own_share: 0.5,
            }),
            kprobe: Some(CallCost {
                ns: 1_000.0,
                own_share: 0.2,
            }),
            ..ProbeCost::default()
        };
        let mut rows = [
            exact("vfio_pin_map_dma", AttachedBy::Kprobe, 1, (99, 0), 1_000_000),
            exact("iommu_map", AttachedBy::Fentry, 99, (0, 0), 1_000_000),
        ];
        // Without a measured cost the calibration stands as it is.
        let costs = call_costs(&Hits { rows: &rows, events: 0 }, Some(&cost), None).unwrap();
        assert_eq!(costs, cost);
        let unprobed = charge_overhead(&mut rows, 0, &costs, 1_000_000);
        // Its own 200 ns of one kprobe hit, and 50 ns of each of its 99 fentry callees.
        assert_eq!(rows[0].overhead_ns, 5_150);
        assert_eq!(rows[1].overhead_ns, 4_950);
        // The top-level kprobe call's caller share lands in the unprobed syscall time.
        assert_eq!(unprobed, 800);
        // With a measured cost, the calibration's proportions scaled to it: 1000 + 99 * 100 =
        // 10900 ns calibrated, 21800 measured, so every call costs twice as much.
        let scaled = call_costs(&Hits { rows: &rows, events: 0 }, Some(&cost), Some(21_800)).unwrap();
        assert_eq!(scaled.fentry.unwrap().ns, 200.0);
        assert_eq!(scaled.kprobe.unwrap().own_share, 0.2);
        assert_eq!(
            calibrated_total(&Hits { rows: &rows, events: 0 }, Some(&cost)),
            Some(10_900.0)
        );
        // A mechanism the calibration lacks: back to the measured even split.
        let fentry_only = ProbeCost {
            kprobe: None,
            ..cost.clone()
        };
        let even = call_costs(&Hits { rows: &rows, events: 0 }, Some(&fentry_only), Some(1_000)).unwrap();
        assert_eq!(even.kprobe.unwrap().ns, 10.0);
        assert_eq!(even.kprobe.unwrap().own_share, 0.5);
        assert!(call_costs(&Hits { rows: &rows, events: 0 }, Some(&fentry_only), None).is_none());
    }

    #[test]
    fn fault_path_hits_cost_what_faults_taken_the_same_way_cost() {
        let context = |fentry_ns, kprobe_ns| {
            Some(ContextCost {
                fentry_ns: Some(fentry_ns),
                kprobe_ns,
            })
        };
        let cost = ProbeCost {
            fentry: Some(CallCost {
                ns: 800.0,
                own_share: 0.5,
            }),
            kprobe: Some(CallCost {
                ns: 2_000.0,
                own_share: 0.4,
            }),
            in_fault: context(1_000.0, Some(3_000.0)),
            in_kernel_fault: context(2_300.0, None),
            ..ProbeCost::default()
        };
        let fault = ExactRow {
            category: Category::Faulting,
            ..exact("handle_mm_fault", AttachedBy::Fentry, 300, (0, 0), 1_000_000)
        };
        let rows = [
            fault,
            exact("iommu_map", AttachedBy::Fentry, 100, (0, 0), 1_000_000),
            exact("vfio_pin_pages_remote", AttachedBy::Kprobe, 100, (0, 0), 1_000_000),
        ];
        // In a pin, the faults are the kernel's: 300 hits at 2300 ns, 100 at the charged 800.
        let map = as_paid(&cost, &rows, Phase::Map);
        assert_eq!(map.fentry.unwrap().ns, (300.0 * 2_300.0 + 100.0 * 800.0) / 400.0);
        assert_eq!(map.fentry.unwrap().own_share, 0.5);
        // No kprobe hit is on the fault path, and the kernel's faults did not measure kprobes.
        assert_eq!(map.kprobe, cost.kprobe);
        // In a touch, the faults are user space's.
        let touch = as_paid(&cost, &rows, Phase::Touch);
        assert_eq!(touch.fentry.unwrap().ns, (300.0 * 1_000.0 + 100.0 * 800.0) / 400.0);
        // Off the fault path nothing changes.
        assert_eq!(as_paid(&cost, &rows[1..], Phase::Map), cost);
        // Faults read cheaper than the syscall loop: the loop's cost stands for them.
        let cheap = ProbeCost {
            in_syscall_loop: context(700.0, None),
            in_kernel_fault: context(350.0, None),
            ..cost.clone()
        };
        let map = as_paid(&cheap, &rows, Phase::Map);
        assert_eq!(map.fentry.unwrap().ns, (300.0 * 700.0 + 100.0 * 800.0) / 400.0);
    }

    #[test]
    fn tracepoint_hits_cost_where_they_landed() {
        let cost = ProbeCost {
            fentry: Some(CallCost {
                ns: 100.0,
                own_share: 0.5,
            }),
            tracepoint: Some(CallCost {
                ns: 40.0,
                own_share: 0.0,
            }),
            ..ProbeCost::default()
        };
        let mut rows = [exact("__get_user_pages", AttachedBy::Fentry, 1, (0, 0), 1_000_000)];
        // 100 page allocations inside the row, 10 more (and a syscall's entry and exit) outside.
        rows[0].event_hits = 100;
        let hits = Hits {
            rows: &rows,
            events: 112,
        };
        assert_eq!(calibrated_total(&hits, Some(&cost)), Some(100.0 + 112.0 * 40.0));
        let costs = call_costs(&hits, Some(&cost), None).unwrap();
        let unprobed = charge_overhead(&mut rows, 112, &costs, 1_000_000);
        assert_eq!(rows[0].overhead_ns, 50 + 4_000);
        assert_eq!(unprobed, 50 + 12 * 40);
        // A measured cost scales the tracepoints with the rest.
        let doubled = call_costs(
            &Hits {
                rows: &rows,
                events: 112,
            },
            Some(&cost),
            Some(9_160),
        )
        .unwrap();
        assert_eq!(doubled.tracepoint.unwrap().ns, 80.0);
    }

    /// What one synthetic 1 MiB type1 case measured: two untraced iterations, one exact (slot
    /// iteration 0), one sampled (slot iteration 1).
    struct Synthetic {
        workload: Workload,
        runs: PassRuns,
        drained: Drained,
        symbols: KernelSymbols,
        rows: [(usize, AttachedBy); 2],
        coverage: Coverage,
        demotion: Demotion,
    }

    impl Synthetic {
        fn input(&self) -> CaseInput<'_> {
            CaseInput {
                label: "vfio_type1_iommu_anonymous.none",
                workload: &self.workload,
                runs: &self.runs,
                drained: &self.drained,
                symbols: Some(&self.symbols),
                rows: &self.rows,
                coverage: &self.coverage,
                cost: None,
                demotion: &self.demotion,
                pace: &[],
                layout_reruns: &[],
            }
        }
    }

    fn synthetic_runs() -> PassRuns {
        let untraced = |map| vec![run(Phase::Mmap, 999_999), run(Phase::Map, map), run(Phase::Unmap, 50)];
        let mut runs = PassRuns::new();
        runs.insert(Pass::Untraced, vec![(0, untraced(900_000)), (1, untraced(1_100_000))]);
        runs.insert(
            Pass::Exact,
            vec![(0, vec![run(Phase::Mmap, 100), run(Phase::Map, 1_000_000)])],
        );
        runs.insert(Pass::Sampled, vec![(1, vec![run(Phase::Map, 2_000_000)])]);
        runs
    }

    fn synthetic_drained() -> Drained {
        let map = slot(0, Phase::Map);
        let sample = |kernel: Vec<u64>, count| RawSample {
            slot: slot(1, Phase::Map),
            kernel,
            page_clear: false,
            count,
        };
        Drained {
            counters: vec![
                (
                    map,
                    PhaseCounters {
                        syscall_ns: 999_900,
                        samples: 3,
                        switches: 3,
                        blocked: 2,
                        off_cpu_ns: 200_000,
                        ..Default::default()
                    },
                ),
                (
                    slot(1, Phase::Map),
                    PhaseCounters {
                        off_cpu_ns: 1_000_000,
                        ..Default::default()
                    },
                ),
            ],
            samples: vec![sample(vec![0x2010, 0x1010], 2), sample(vec![], 1)],
            rows: vec![
                (map, row("pin_user_pages_remote"), stats(500)),
                (map, row("iommu_map"), stats(300)),
            ],
        }
    }

    fn synthetic() -> Synthetic {
        Synthetic {
            workload: Workload {
                case: Case {
                    mode: Some(DmaMode::VfioType1Iommu),
                    backing: Backing::Anonymous,
                    prefault: Prefault::None,
                },
                size: "1M".parse().unwrap(),
                thp: crate::matrix::Thp::System,
            },
            runs: synthetic_runs(),
            drained: synthetic_drained(),
            symbols: KernelSymbols::from_pairs(vec![
                (0x1000, "vfio_pin_pages_remote".into()),
                (0x2000, "pin_user_pages_remote".into()),
            ]),
            rows: [
                (row("pin_user_pages_remote"), AttachedBy::Fentry),
                (row("iommu_map"), AttachedBy::Kprobe),
            ],
            coverage: Coverage {
                exact: Ok(()),
                syscalls: true,
                cpu_faults: false,
                page_allocs: false,
                samples: true,
                switches: true,
            },
            demotion: Demotion::default(),
        }
    }

    fn phase_of(out: &CaseOutput, phase: Phase) -> &PhaseReport {
        out.report.phases.iter().find(|p| p.name == phase).unwrap()
    }

    #[test]
    fn a_synthetic_case_adds_up() {
        let out = case_report(&synthetic().input());
        let p = phase_of(&out, Phase::Map);
        let e = &p.exact;
        assert_eq!(
            phase_of(&out, Phase::Mmap).gib_per_s,
            0.0,
            "a mmap that populates nothing moves no memory"
        );
        assert!(p.gib_per_s > 0.0);
        assert_eq!(e.categories[&Category::Pinning], 500);
        // 1 MiB is 256 pages of 4 KiB: 500 ns of a 1 ms exact iteration at a 1 ms headline.
        assert!((p.per_page_ns[&Category::Pinning] - 500.0 / 256.0).abs() < 1e-9);
        assert_eq!(e.categories[&Category::IommuMap], 300);
        assert_eq!(e.categories[&Category::Other], 999_100);
        assert_eq!(e.unattributed_ns, 100);
        // The untraced median (900 us, 1.1 ms -> 1 ms) equals the exact iteration: no probe cost.
        assert_eq!(e.probe_overhead_ns, Some(0));
        assert_eq!(e.probe_hits, 4);
        assert_eq!(e.categories.values().sum::<u64>() as i64 + e.unattributed_ns, 1_000_000);
        assert!(e.available);
        let mech = |f: &str| e.rows.iter().find(|r| r.function == f).unwrap().mechanism;
        assert_eq!(mech("pin_user_pages_remote"), AttachedBy::Fentry);
        assert_eq!(mech("iommu_map"), AttachedBy::Kprobe);
        assert_eq!(p.exact.wall_ns, 1_000_000, "the exact pass's own iteration");
        assert_eq!(out.summary.stacks["map;cat:pinning;pin_user_pages_remote"], 500);
        assert_eq!(out.summary.stacks["map;[unattributed]"], 100);
        assert_eq!(out.report.map_ioctl.as_deref(), Some("VFIO_IOMMU_MAP_DMA"));
        assert!(out.report.phases.iter().all(|p| p.name != Phase::Touch));
    }

    #[test]
    fn time_off_the_cpu_outside_syscalls_is_its_own_part_of_the_wall() {
        let mut s = synthetic();
        // 60 of the map's 100 ns outside its syscall were spent preempted after the exit.
        s.drained.counters[0].1.off_cpu_outside_ns = 60;
        let out = case_report(&s.input());
        let e = &phase_of(&out, Phase::Map).exact;
        assert_eq!((e.off_cpu_outside_ns, e.unattributed_ns), (Some(60), 40));
        assert_eq!(
            e.categories.values().sum::<u64>() as i64 + 60 + e.unattributed_ns,
            1_000_000,
            "categories + probe cost + off the CPU outside syscalls + unattributed = wall"
        );
        assert_eq!(
            e.share_base(),
            1_000_000 - 60,
            "the shares leave it out, as the samples do"
        );
        assert_eq!(out.summary.stacks["map;[off_CPU_outside_syscalls]"], 60);
        s.coverage.switches = false;
        let out = case_report(&s.input());
        let e = &phase_of(&out, Phase::Map).exact;
        assert_eq!(
            (e.off_cpu_outside_ns, e.unattributed_ns),
            (None, 100),
            "not traced: not known"
        );
    }

    /// An iteration whose map takes `map` ns on a buffer in `runs` physical runs.
    fn laid_out(map: u64, runs: u64) -> Vec<PhaseRun> {
        let mut r = vec![run(Phase::Mmap, 999_999), run(Phase::Map, map), run(Phase::Unmap, 50)];
        for p in &mut r {
            p.physical_runs = Some(runs);
        }
        r
    }

    #[test]
    fn traced_iterations_are_held_against_untraced_ones_laid_out_alike() {
        // As in the guest: iterations alternate between a contiguous buffer (500 runs, 70 ms)
        // and a scattered one (16000 runs, 110 ms). An exact iteration on a scattered buffer
        // is 5 ms over what an untraced one takes there, though 40 ms over the median.
        let it = laid_out;
        let mut s = synthetic();
        s.runs.insert(
            Pass::Untraced,
            vec![
                (0, it(70_000_000, 500)),
                (1, it(110_000_000, 16_000)),
                (2, it(70_000_000, 520)),
                (3, it(110_000_000, 16_020)),
                (4, it(71_000_000, 540)),
            ],
        );
        s.runs.insert(Pass::Exact, vec![(0, it(115_000_000, 16_010))]);
        s.runs.insert(Pass::Sampled, vec![(1, it(77_000_000, 530))]);
        let out = case_report(&s.input());
        let p = phase_of(&out, Phase::Map);
        assert_eq!(p.wall_ns.median, 71_000_000);
        assert_eq!(p.physical_runs.as_ref().unwrap().runs, [500, 16_000, 520, 16_020, 540]);
        let e = &p.exact;
        assert_eq!(e.physical_runs, Some(16_010));
        let reference = e.untraced_reference_ns.unwrap();
        assert!((109_000_000..=111_000_000).contains(&reference), "{reference}");
        let measured = e.probe_overhead_measured_ns.unwrap();
        assert!((4_000_000..=6_000_000).contains(&measured), "{measured}");
        // Each untraced iteration is within 1 ms of the line at its own layout, though 40 ms
        // from the median.
        let noise = e.untraced_noise_ns.unwrap();
        assert!(noise <= 1_000_000, "{noise}");
        let exact = p.passes[&Pass::Exact].ratio.unwrap();
        assert!(
            exact.layout_matched && (exact.median - 115.0 / 110.0).abs() < 0.01,
            "{exact:?}"
        );
        let sampled = p.passes[&Pass::Sampled].ratio.unwrap();
        assert!((sampled.median - 1.1).abs() < 0.01, "{sampled:?}");
        // Without a layout on every traced iteration, the plain median ratio.
        s.runs
            .insert(Pass::Sampled, vec![(1, vec![run(Phase::Map, 77_000_000)])]);
        let out = case_report(&s.input());
        let sampled = phase_of(&out, Phase::Map).passes[&Pass::Sampled].ratio.unwrap();
        assert!(!sampled.layout_matched && (sampled.median - 77.0 / 71.0).abs() < 1e-9);
    }

    #[test]
    fn the_exact_pass_cost_sums_every_iteration_against_its_own_layout() {
        let it = laid_out;
        let untraced = [(70_000_000, 500), (110_000_000, 16_000), (70_000_000, 500)];
        let mut s = synthetic();
        s.runs
            .insert(Pass::Untraced, (0..).zip(untraced.map(|(m, r)| it(m, r))).collect());
        // 5 ms over the line on a contiguous buffer, 8 ms on a scattered one.
        s.runs.insert(
            Pass::Exact,
            vec![(0, it(75_000_000, 500)), (1, it(118_000_000, 16_000))],
        );
        s.runs.insert(Pass::Sampled, vec![(2, it(80_000_000, 500))]);
        s.drained.rows = vec![
            one_row(slot(0, Phase::Map), "iommu_map", 1_000, 1_000_000),
            one_row(slot(1, Phase::Map), "iommu_map", 2_000, 2_000_000),
        ];
        s.drained.counters.clear();
        let cost = costs(1_000.0, 4_000.0);
        let input = CaseInput {
            cost: Some(&cost),
            ..s.input()
        };
        let out = case_report(&input);
        let passes = &phase_of(&out, Phase::Map).passes;
        let c = passes[&Pass::Exact].probe_cost.unwrap();
        assert_eq!((c.iterations, c.hits), (2, 3_000));
        assert_eq!(c.calibrated_ns, 12_000_000, "1000 + 2000 kprobe hits at 4 us");
        assert_eq!(c.measured_ns, 13_000_000);
        assert!((c.calibrated_ns as f64 / c.measured_ns as f64 - 12.0 / 13.0).abs() < 1e-9);
        assert_eq!(c.calibrated_range_ns, None, "no context measured: no range");
        assert_eq!(passes[&Pass::Sampled].probe_cost, None);
        // Every context measured: the range is what the hits cost at each one's per-hit costs
        // (kprobe 2 us in the loop, 8 us in user faults, 5 us in the kernel's), around the
        // charged 4 us.
        let every = ProbeCost {
            in_syscall_loop: Some(ContextCost {
                fentry_ns: Some(500.0),
                kprobe_ns: Some(2_000.0),
            }),
            in_fault: Some(ContextCost {
                fentry_ns: Some(2_000.0),
                kprobe_ns: Some(8_000.0),
            }),
            in_kernel_fault: Some(ContextCost {
                fentry_ns: Some(1_500.0),
                kprobe_ns: Some(5_000.0),
            }),
            ..costs(1_000.0, 4_000.0)
        };
        let out = case_report(&CaseInput {
            cost: Some(&every),
            ..s.input()
        });
        let c = phase_of(&out, Phase::Map).passes[&Pass::Exact].probe_cost.unwrap();
        assert_eq!(c.calibrated_ns, 12_000_000);
        assert_eq!(c.calibrated_range_ns, Some((6_000_000, 24_000_000)));
        // Without a calibration there is nothing to hold the measurement against.
        let out = case_report(&s.input());
        assert_eq!(phase_of(&out, Phase::Map).passes[&Pass::Exact].probe_cost, None);
    }

    #[test]
    fn the_exact_pass_cost_carries_the_untraced_scatter_and_the_layouts_beyond_the_line() {
        let it = laid_out;
        // 1 ms and 0.5 ms either side of a line rising 40 ms over 15500 runs.
        let untraced = [
            (69_000_000, 500),
            (110_000_000, 16_000),
            (71_000_000, 500),
            (111_000_000, 16_000),
        ];
        let mut s = synthetic();
        s.runs
            .insert(Pass::Untraced, (0..).zip(untraced.map(|(m, r)| it(m, r))).collect());
        // The second exact iteration's buffer lies beyond every untraced one's.
        s.runs.insert(
            Pass::Exact,
            vec![(0, it(75_000_000, 500)), (1, it(140_000_000, 30_000))],
        );
        s.drained.rows = vec![
            one_row(slot(0, Phase::Map), "iommu_map", 1_000, 1_000_000),
            one_row(slot(1, Phase::Map), "iommu_map", 2_000, 2_000_000),
        ];
        s.drained.counters.clear();
        let cost = costs(1_000.0, 4_000.0);
        let input = CaseInput {
            cost: Some(&cost),
            ..s.input()
        };
        let out = case_report(&input);
        let c = phase_of(&out, Phase::Map).passes[&Pass::Exact].probe_cost.unwrap();
        assert_eq!(c.beyond_line, 1);
        // Scatter sqrt(2.5/3) ms per iteration, over two iterations and a line of four.
        let noise = c.noise_ns.unwrap();
        assert!((1_500_000..=1_700_000).contains(&noise), "{noise}");
        // With one untraced iteration its scatter cannot be read.
        s.runs.insert(Pass::Untraced, vec![(0, it(70_000_000, 500))]);
        let out = case_report(&CaseInput {
            cost: Some(&cost),
            ..s.input()
        });
        let c = phase_of(&out, Phase::Map).passes[&Pass::Exact].probe_cost.unwrap();
        assert_eq!((c.noise_ns, c.beyond_line), (None, 0));
    }

    #[test]
    fn a_synthetic_case_has_samples_and_pass_ratios() {
        let out = case_report(&synthetic().input());
        let p = phase_of(&out, Phase::Map);
        assert_eq!(p.sampled.samples, 3);
        assert!((p.sampled.categories[&Category::Pinning] - 2.0 / 3.0).abs() < 1e-9);
        assert!((p.sampled.categories[&Category::User] - 1.0 / 3.0).abs() < 1e-9);
        // The headline is the untraced pass; each traced pass has its ratio to it.
        assert_eq!(p.wall_pass, Pass::Untraced);
        assert_eq!(p.wall_ns.median, 1_000_000);
        assert_eq!(p.wall_ns.runs, [900_000, 1_100_000]);
        let exact = p.passes[&Pass::Exact].ratio.unwrap();
        assert!((exact.median - 1.0).abs() < 1e-9 && (exact.low - 1.0 / 1.1).abs() < 1e-9);
        assert!((p.passes[&Pass::Sampled].ratio.unwrap().median - 2.0).abs() < 1e-9);
        // Each traced pass says how long the thread was off the CPU; the sampler could see
        // only the rest of the sampled pass's 2 ms.
        let off = crate::report::OffCpu {
            ns: 200_000,
            switches: 3,
            blocked: 2,
            rusage_switches: 0,
        };
        assert_eq!(p.counters.off_cpu, Some(off));
        assert_eq!(p.sampled.off_cpu_ns, Some(1_000_000));
        assert_eq!(crate::report::expected_samples(p, 10_000), Some(10));
        // Not measured is absent, not zero; a phase under 1 ms untraced gets no ratio.
        assert_eq!(p.counters.cpu_faults, None);
        assert!(p.kernel_ns.is_some());
        assert!(
            (p.kernel_share.unwrap() - 0.9999).abs() < 1e-9,
            "syscall time over the exact pass's own wall"
        );
        let mmap = phase_of(&out, Phase::Mmap);
        assert_eq!(mmap.kernel_share, Some(0.0), "no syscall time counted in that slot");
        assert_eq!(mmap.passes[&Pass::Exact].ratio, None);
        let (_, f) = out.folded.iter().find(|(ph, _)| *ph == Phase::Map).unwrap();
        assert_eq!(f.stacks["map;vfio_pin_pages_remote;pin_user_pages_remote"], 2);
        assert_eq!(f.stacks["map;[user]"], 1);
    }

    #[test]
    fn without_probes_only_wall_time_is_claimed() {
        let s = Synthetic {
            coverage: Coverage::none(),
            ..synthetic()
        };
        let out = case_report(&s.input());
        let p = phase_of(&out, Phase::Map);
        assert!(!p.exact.available && p.exact.categories.is_empty() && p.exact.rows.is_empty());
        assert_eq!(
            p.exact.unavailable.as_deref(),
            Some("no traced pass (--no-trace or --passes untraced): no probe was loaded")
        );
        assert!(p.folded.is_none() && p.flamegraph.is_none() && p.kernel_ns.is_none());
        assert!(out.report.summary_flamegraph.is_none());
    }

    #[test]
    fn coverage_follows_what_attached() {
        let st = |f: &str, m: AttachedBy, attached: bool, error: Option<&str>| ProbeStatus {
            function: f.into(),
            mechanism: m,
            attached,
            error: error.map(Into::into),
        };
        let status = vec![
            st(
                "vfio_pin_pages_remote",
                AttachedBy::Kprobe,
                false,
                Some("not in /proc/kallsyms: x"),
            ),
            st(
                "handle_mm_fault",
                AttachedBy::Kprobe,
                false,
                Some("kernel has no kprobes"),
            ),
            st("raw_syscalls:sys_exit", AttachedBy::RawTracepoint, true, None),
            st("cpu-clock@99Hz", AttachedBy::PerfEvent, true, None),
        ];
        let c = Coverage::of(&status, &[Pass::Untraced, Pass::Exact, Pass::Sampled]);
        assert_eq!(c.exact, Err(NoExact::NoRow("kernel has no kprobes".into())));
        assert!(c.syscalls && c.samples && !c.cpu_faults);
        // What a pass that did not run would have measured is not claimed.
        let c = Coverage::of(&status, &[Pass::Untraced, Pass::Sampled]);
        assert_eq!(c.exact, Err(NoExact::NotRun));
        assert!(!c.syscalls && c.samples);
        assert_eq!(NoExact::NotRun.to_string(), "the exact pass was not run (--passes)");
    }

    #[test]
    fn slots_round_trip() {
        for it in 0..3 {
            for &p in PHASES {
                assert_eq!(phase_of_slot(slot(it, p)), Some(p));
                assert!(slot(it, p) < slots(3));
            }
        }
        assert_eq!(phase_of_slot(0), None);
    }

    fn one_row(slot: u32, name: &str, calls: u64, exclusive_ns: u64) -> (u32, usize, RowStats) {
        let st = RowStats {
            calls,
            inclusive_ns: exclusive_ns,
            exclusive_ns,
            amount: calls * 4096,
            ..RowStats::default()
        };
        (slot, row(name), st)
    }

    /// A calibration: `fentry` and `kprobe` ns per call, half of each the probed call's own.
    fn costs(fentry: f64, kprobe: f64) -> ProbeCost {
        let half = |ns| Some(CallCost { ns, own_share: 0.5 });
        ProbeCost {
            fentry: half(fentry),
            kprobe: half(kprobe),
            ..ProbeCost::default()
        }
    }

    #[test]
    fn an_exact_iteration_on_a_buffer_in_more_runs_demotes_more() {
        let attached = [
            (row("batch_to_domain"), AttachedBy::Kprobe),
            (row("iommu_map"), AttachedBy::Fentry),
            (row("iommu_map_nosync"), AttachedBy::Fentry),
        ];
        let cost = costs(1000.0, 1000.0);
        let limits = (DEMOTE_ABOVE, 0);
        let walls = [run(Phase::Map, 500_000_000)];
        // The scout's buffer made 1819 map calls: 1.8 ms of 500, nothing to demote.
        let scout = Drained {
            rows: vec![one_row(slot(0, Phase::Map), "iommu_map", 1819, 4_000_000)],
            ..Drained::default()
        };
        let mut d = demotions(&scout, &walls, &[], &attached, &cost, limits);
        assert!(d.demoted.is_empty());
        // Exact iteration 1 on a buffer in more runs: 55738 calls, 56 ms of hits, 11% of the phase.
        let seen = |calls| Drained {
            rows: vec![
                one_row(slot(1, Phase::Map), "batch_to_domain", 6, 40_000_000),
                one_row(slot(1, Phase::Map), "iommu_map_nosync", calls, 30_000_000),
            ],
            ..Drained::default()
        };
        // 5000 calls: 5 ms, 1% of the phase; 20000: 4%, under twice the limit. Kept.
        for calls in [5000, 20_000] {
            assert!(d.outgrown(&seen(calls), &walls, &attached, &cost, limits).is_empty());
        }
        // Its calls are counted on the exact iteration's layout, not the scout's.
        let exact_walls = [PhaseRun {
            physical_runs: Some(27_852),
            ..walls[0]
        }];
        let added = d.outgrown(&seen(55_738), &exact_walls, &attached, &cost, limits);
        assert_eq!(added.len(), 1, "{added:?}");
        assert!(added[0].outgrown && added[0].function == "iommu_map_nosync" && added[0].calls == 55_738);
        assert_eq!(added[0].physical_runs, Some(27_852));
        assert_eq!(d.rows(), [row("iommu_map_nosync")]);
        assert!(
            d.counts
                .iter()
                .any(|(p, r, st)| *p == Phase::Map && *r == row("iommu_map_nosync") && st.calls == 55_738)
        );
        let said = d.describe();
        assert!(
            said.len() == 1
                && said[0].starts_with("the exact iteration outgrew the scout and ran again without iommu_map_nosync"),
            "{said:?}"
        );
    }

    #[test]
    fn hot_rows_are_demoted_and_their_time_split_by_samples() {
        let map = slot(0, Phase::Map);
        let scout = Drained {
            rows: vec![
                one_row(map, "vfio_pin_map_dma", 1, 4_000_000),
                one_row(map, "iommu_map", 10_000, 6_000_000),
            ],
            ..Drained::default()
        };
        let attached = [
            (row("vfio_pin_map_dma"), AttachedBy::Kprobe),
            (row("iommu_map"), AttachedBy::Fentry),
        ];
        let cost = costs(500.0, 1000.0);
        // The map's wall time and the shortest phase demotion applies in.
        let demote = |scout: &Drained, wall, min| {
            demotions(
                scout,
                &[run(Phase::Map, wall)],
                &[],
                &attached,
                &cost,
                (DEMOTE_ABOVE, min),
            )
        };
        // 10000 hits at 500 ns: 5 ms of a 10 ms phase. The 1 us of the one top call stays.
        let d = demote(&scout, 10_000_000, 0);
        assert_eq!(d.rows(), [row("iommu_map")]);
        let why = &d.demoted[0].1;
        assert_eq!((why.calls, why.cost_ns, why.phase), (10_000, 5_000_000, Phase::Map));
        assert!((why.share - 5.0 / (10.0 - 5.001)).abs() < 1e-3);
        assert!((why.phase_share - 5.001 / (10.0 - 5.001)).abs() < 1e-3);
        let said = d.describe();
        assert_eq!(said.len(), 1);
        assert!(
            said[0].starts_with("exact pass without iommu_map: 10000 calls in map"),
            "{said:?}"
        );
        // Too short for the sampled pass to split a demoted row's time: every row stays.
        assert!(demote(&scout, 10_000_000, 6_000_000).demoted.is_empty());
        // Also when only an untraced iteration shows it short: the hits cost more than
        // calibrated (a 2.7 ms map that looked like 5.6 ms kept none of its rows, and read
        // 100% other).
        let short = |untraced_ns| {
            let untraced = [run(Phase::Map, untraced_ns)];
            demotions(
                &scout,
                &[run(Phase::Map, 10_000_000)],
                &untraced,
                &attached,
                &cost,
                (DEMOTE_ABOVE, 4_000_000),
            )
        };
        assert!(short(3_000_000).demoted.is_empty());
        assert_eq!(short(5_000_000).rows(), [row("iommu_map")]);
        // A calibration that says the hits cost the whole scout or more: the phase is not
        // short for it, and its costliest rows go (without an untraced iteration too).
        assert_eq!(demote(&scout, 4_000_000, 3_000_000).rows(), [row("iommu_map")]);
        let overstated = demotions(
            &scout,
            &[run(Phase::Map, 4_000_000)],
            &[run(Phase::Map, 3_500_000)],
            &attached,
            &cost,
            (DEMOTE_ABOVE, 3_000_000),
        );
        assert_eq!(overstated.rows(), [row("iommu_map")]);
        // A phase that carries its probes keeps them all.
        assert!(demote(&scout, 1_000_000_000, 0).demoted.is_empty());
        demoted_time_is_split_by_samples(&d, &attached, "iommu_map");
        // A tail call leaves no frame of the demoted row: the caller's lost probed callees
        // (10000 in the scout, none in the exact pass) say where its time went.
        let mut scout = scout;
        scout.rows[0].2.child_calls = 10_000;
        let d = demote(&scout, 10_000_000, 0);
        demoted_time_is_split_by_samples(&d, &attached, "intel_iommu_map_pages");
    }

    /// What the synthetic cases measured: exact rows, syscall times and samples.
    fn exact_and_samples() -> Coverage {
        Coverage {
            exact: Ok(()),
            syscalls: true,
            cpu_faults: false,
            page_allocs: false,
            samples: true,
            switches: false,
        }
    }

    /// A touch phase has no syscall: its wall time outside `handle_mm_fault` (the faults' entry
    /// and exit, the loop's user time) is split by the samples no row owns, the user-space
    /// part left unattributed; without samples all of it stays unattributed.
    #[test]
    fn touch_time_outside_the_fault_rows_is_split_by_samples() {
        let touch = slot(0, Phase::Touch);
        let w = Workload {
            case: Case {
                mode: None,
                backing: Backing::Memfd,
                prefault: Prefault::Touch,
            },
            size: "1M".parse().unwrap(),
            thp: crate::matrix::Thp::System,
        };
        let mut runs = PassRuns::new();
        runs.insert(Pass::Exact, vec![(0, vec![run(Phase::Touch, 10_000_000)])]);
        runs.insert(Pass::Sampled, vec![(1, vec![run(Phase::Touch, 10_000_000)])]);
        let sampled = slot(1, Phase::Touch);
        let sample = |kernel: Vec<u64>, count| RawSample {
            slot: sampled,
            kernel,
            page_clear: false,
            count,
        };
        let mut drained = Drained {
            counters: Vec::new(),
            rows: vec![one_row(touch, "handle_mm_fault", 256, 6_000_000)],
            samples: vec![
                sample(vec![0x1010, 0x2010], 6),
                sample(vec![0x2020], 3),
                sample(Vec::new(), 1),
            ],
        };
        let symbols = KernelSymbols::from_pairs(vec![
            (0x1000, "handle_mm_fault".into()),
            (0x2000, "exc_page_fault".into()),
            (0x3000, "shmem_get_folio_gfp".into()),
        ]);
        let coverage = exact_and_samples();
        let rows = [(row("handle_mm_fault"), AttachedBy::Fentry)];
        let exact = |drained: &Drained| {
            let out = case_report(&CaseInput {
                label: "none_memfd.touch",
                workload: &w,
                runs: &runs,
                drained,
                symbols: Some(&symbols),
                rows: &rows,
                coverage: &coverage,
                cost: None,
                demotion: &Demotion::default(),
                pace: &[],
                layout_reruns: &[],
            });
            out.report
                .phases
                .iter()
                .find(|p| p.name == Phase::Touch)
                .unwrap()
                .exact
                .clone()
        };
        let e = exact(&drained);
        assert_eq!(e.categories[&Category::Faulting], 9_000_000, "{e:?}");
        assert_eq!(e.categories[&Category::Other], 0);
        assert_eq!(e.split_ns, 3_000_000);
        assert_eq!(e.unattributed_ns, 1_000_000, "the user-space part");
        // A page cleared inline in the fault (two samples on its rep stos) is zeroing inside
        // handle_mm_fault's own time, which its stacks then split 6:2.
        drained.samples.push(RawSample {
            page_clear: true,
            ..sample(vec![0x3010, 0x1010, 0x2010], 2)
        });
        let e = exact(&drained);
        assert_eq!(e.categories[&Category::Zeroing], 1_500_000, "{e:?}");
        assert_eq!(e.categories[&Category::Faulting], 4_500_000 + 3_000_000);
        assert_eq!(e.split_ns, 9_000_000);
        drained.samples.clear();
        let e = exact(&drained);
        assert_eq!(e.categories[&Category::Faulting], 6_000_000);
        assert_eq!((e.unattributed_ns, e.split_ns), (4_000_000, 0));
    }

    /// The exact pass without iommu_map (demoted in `d`): its time is in vfio_pin_map_dma,
    /// whose sampled stacks say 3 parts IOMMU mapping to 1 part its own.
    fn demoted_time_is_split_by_samples(d: &Demotion, attached: &[(usize, AttachedBy)], leaf: &str) {
        let map = slot(0, Phase::Map);
        let w = Workload {
            case: Case {
                mode: Some(DmaMode::VfioType1Iommu),
                backing: Backing::Anonymous,
                prefault: Prefault::None,
            },
            size: "1M".parse().unwrap(),
            thp: crate::matrix::Thp::System,
        };
        let mut runs = PassRuns::new();
        runs.insert(Pass::Exact, vec![(0, vec![run(Phase::Map, 8_000_000)])]);
        runs.insert(Pass::Sampled, vec![(1, vec![run(Phase::Map, 8_000_000)])]);
        let sampled = slot(1, Phase::Map);
        let drained = Drained {
            counters: vec![(
                map,
                PhaseCounters {
                    syscall_ns: 8_000_000,
                    ..Default::default()
                },
            )],
            rows: vec![one_row(map, "vfio_pin_map_dma", 1, 8_000_000)],
            samples: vec![
                RawSample {
                    slot: sampled,
                    kernel: vec![0x2010, 0x1010],
                    page_clear: false,
                    count: 3,
                },
                RawSample {
                    slot: sampled,
                    kernel: vec![0x1020],
                    page_clear: false,
                    count: 1,
                },
            ],
        };
        let symbols = KernelSymbols::from_pairs(vec![
            (0x1000, "vfio_pin_map_dma [vfio_iommu_type1]".into()),
            (0x2000, leaf.into()),
        ]);
        let coverage = exact_and_samples();
        let out = case_report(&CaseInput {
            label: "vfio_type1_iommu_anonymous.none",
            workload: &w,
            runs: &runs,
            drained: &drained,
            symbols: Some(&symbols),
            rows: attached,
            coverage: &coverage,
            cost: None,
            demotion: d,
            pace: &[],
            layout_reruns: &[],
        });
        let e = &out.report.phases.iter().find(|p| p.name == Phase::Map).unwrap().exact;
        assert_eq!(e.categories[&Category::IommuMap], 6_000_000);
        assert_eq!(e.categories[&Category::Bookkeeping], 2_000_000);
        assert_eq!(e.split_ns, 8_000_000);
        assert_eq!(e.probe_hits, 1, "a demoted row has no hits");
        let demoted = e.rows.iter().find(|r| r.function == "iommu_map").unwrap();
        assert!(demoted.demoted && demoted.calls == 10_000 && demoted.exclusive_ns == 0);
        assert_eq!(demoted.amount, 10_000 * 4096, "counted in the warm-up iteration");
        assert_eq!(out.report.demoted.len(), 1);
        assert_eq!(out.summary.stacks["map;cat:iommu_map;vfio_pin_map_dma"], 6_000_000);
    }
}
