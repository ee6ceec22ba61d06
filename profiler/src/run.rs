//! `dmaprof run`: selects cases, runs them on the calling thread under the probes, and turns
//! what was measured into a [`Report`] with folded stacks and flamegraphs on disk.
use std::{
    collections::BTreeMap,
    fs,
    os::fd::AsRawFd as _,
    path::{Path, PathBuf},
    sync::{
        Arc, Mutex,
        atomic::{AtomicBool, Ordering},
    },
    time::Instant,
};

use crate::{
    attribution::{CATEGORIES, Category, CategoryCounts, classify},
    capabilities::Doctor,
    device::Device,
    dma::{self, DmaContext},
    flamegraph::Folded,
    hugepages::Reservation,
    matrix::{self, Case, IommuMode, Prefault},
    probes::{Drained, PROBE_TABLE, ProbeError, Probes, gettid},
    report::{
        self, CaseReport, Config, Counters, Exact, ExactRow, Failed, PhaseReport, Report, Sampled, Skipped, Stats,
        Timing,
    },
    symbols::KernelSymbols,
    workload::{self, PHASES, Phase, PhaseObserver, PhaseRun, WorkloadError},
};

/// Most iterations per case: every (iteration, phase) pair needs its own slot in the BPF maps.
pub const MAX_ITERATIONS: u32 = (crate::abi::MAX_PHASES - 1) / PHASES.len() as u32;

/// Options of `dmaprof run`, validated.
#[derive(Clone, Debug)]
pub struct RunOptions {
    /// Buffer size per case.
    pub size: u64,
    /// -v patterns.
    pub variants: Vec<String>,
    /// Prefaults to run.
    pub prefaults: Vec<Prefault>,
    /// Iterations per case.
    pub iterations: u32,
    /// Sampling frequency.
    pub freq_hz: u64,
    /// Output directory.
    pub out: PathBuf,
    /// PCI address of the device to DMA-map for (-d, or VFIO_SELFTESTS_BDF).
    pub device: Option<String>,
    /// Bind the device to vfio-pci for the run if it is bound elsewhere.
    pub bind: bool,
    /// Load no probes at all: every iteration untraced.
    pub no_trace: bool,
    /// Testing: entries of the sampled-stack map (small values force lost samples).
    pub sample_map_entries: Option<u32>,
    /// When the process started (for the start-up time in the report).
    pub started: Instant,
    /// Which probe mechanisms to attach.
    pub mechanisms: Vec<crate::probes::Mechanism>,
}

/// Why a run could not start or finish.
#[derive(Debug, thiserror::Error)]
pub enum RunError {
    /// Bad options (exit code 2).
    #[error("{0}")]
    Usage(String),
    /// Another dmaprof holds the lock.
    #[error("another dmaprof is running (lock {0} is held): wait for it or stop it")]
    Locked(String),
    /// Probes could not be loaded.
    #[error(transparent)]
    Probes(#[from] ProbeError),
    /// The device cannot be used.
    #[error(transparent)]
    Device(#[from] crate::device::DeviceError),
    /// Output could not be written.
    #[error("cannot write {path}: {source}: choose a writable --out directory")]
    Output {
        /// What.
        path: String,
        /// Why (in the message, not chained, so it prints once).
        source: std::io::Error,
    },
}

impl RunError {
    /// Whether the user should fix their command line (exit code 2) rather than the system.
    pub fn is_usage(&self) -> bool {
        matches!(self, RunError::Usage(_) | RunError::Device(_))
    }
}

/// Stage names outside the phases, as progress shows them.
pub const STAGE_SETUP: &str = "set-up";
/// Opening a case's container/IOAS and device, reserving its hugepages.
pub const STAGE_OPEN: &str = "opening";
/// Reading a case's maps and writing its flamegraphs.
pub const STAGE_REPORT: &str = "reporting";
/// Loading and attaching the probes.
pub const STAGE_ATTACH: &str = "attaching probes";
/// After the last phase: report written, probes detached. A signal here leaves the report
/// complete (not partial).
pub const STAGE_FINISH: &str = "finishing (report, detach)";

/// What the main thread shows as progress: the phase running now and since when.
#[derive(Default)]
pub struct Progress {
    current: Mutex<Option<(String, Instant)>>,
}

impl Progress {
    /// The running phase and its start, if any.
    pub fn current(&self) -> Option<(String, Instant)> {
        self.current.lock().unwrap_or_else(|e| e.into_inner()).clone()
    }

    fn set(&self, v: Option<(String, Instant)>) {
        *self.current.lock().unwrap_or_else(|e| e.into_inner()) = v;
    }

    /// Names a stage outside the phases (shown as progress and named when a signal lands).
    fn stage(&self, what: &str) {
        self.set(Some((what.to_owned(), Instant::now())));
    }
}

/// Case selection and per-case skip reasons, decided before anything runs.
pub struct Plan {
    /// Cases that will run.
    pub run: Vec<Case>,
    /// Cases that will not, with why.
    pub skipped: Vec<Skipped>,
}

fn mem_available() -> Option<u64> {
    let s = fs::read_to_string("/proc/meminfo").ok()?;
    let kb: u64 = s
        .lines()
        .find_map(|l| l.strip_prefix("MemAvailable:"))?
        .trim()
        .trim_end_matches("kB")
        .trim()
        .parse()
        .ok()?;
    Some(kb * 1024)
}

/// Why this host cannot run `case` (None: it can), from what doctor found.
fn cannot_run(case: &Case, opts: &RunOptions, doctor: &Doctor) -> Option<String> {
    let has = |name: &str| doctor.capabilities.get(name).is_some_and(|c| c.ok);
    let mode = case.mode;
    if !opts.size.is_multiple_of(case.backing.page_size()) {
        return Some(format!(
            "size {} is not a multiple of the {} page size",
            crate::size::HumanSize(opts.size),
            crate::size::HumanSize(case.backing.page_size())
        ));
    }
    if mode == IommuMode::None {
        return None;
    }
    if opts.device.is_none() {
        return Some("needs a VFIO device: give -d BDF (or set VFIO_SELFTESTS_BDF), or use `cargo xtask vm`".into());
    }
    match mode {
        IommuMode::VfioType1Iommu | IommuMode::VfioType1v2Iommu if !has("vfio_type1") => {
            Some("kernel has no VFIO type1 container (/dev/vfio/vfio)".into())
        }
        IommuMode::IommufdCompatType1 | IommuMode::IommufdCompatType1v2 | IommuMode::Iommufd if !has("iommufd") => {
            Some("kernel has no IOMMUFD".into())
        }
        IommuMode::Iommufd if !has("vfio_cdev") => Some("kernel has no VFIO cdev (CONFIG_VFIO_DEVICE_CDEV)".into()),
        IommuMode::Iommufd if case.backing.memfd && !has("map_file") => {
            Some("kernel has no IOMMU_IOAS_MAP_FILE (added in 6.13)".into())
        }
        _ => None,
    }
}

/// Selects the cases and says which cannot run here.
pub fn plan(opts: &RunOptions, doctor: &Doctor) -> Result<Plan, RunError> {
    let cases = matrix::select(&matrix::all_cases(), &opts.variants, &opts.prefaults)
        .map_err(|e| RunError::Usage(e.to_string()))?;
    if cases.is_empty() {
        return Err(RunError::Usage("no case selected: check -v and --prefault".into()));
    }
    let mut run = Vec::new();
    let mut skipped = Vec::new();
    for case in cases {
        match cannot_run(&case, opts, doctor) {
            Some(reason) => skipped.push(Skipped {
                name: case.name(),
                reason,
            }),
            None => run.push(case),
        }
    }
    if run.iter().any(|c| c.backing.hugetlb_kb.is_none())
        && let Some(avail) = mem_available()
        && opts.size > avail / 10 * 9
    {
        return Err(RunError::Usage(format!(
            "-b {} does not fit in available memory ({}): choose a smaller size",
            crate::size::HumanSize(opts.size),
            crate::size::HumanSize(avail / 4096 * 4096)
        )));
    }
    Ok(Plan { run, skipped })
}

/// Holds the single-instance lock for the run's lifetime.
pub struct InstanceLock {
    _file: fs::File,
}

/// Takes the lock that keeps two dmaprof runs from fighting over hugepages and devices.
pub fn lock_instance() -> Result<InstanceLock, RunError> {
    let path = if Path::new("/run").is_dir() {
        "/run/dmaprof.lock"
    } else {
        "/tmp/dmaprof.lock"
    };
    let file = fs::OpenOptions::new()
        .create(true)
        .truncate(false)
        .write(true)
        .open(path)
        .map_err(|source| RunError::Output {
            path: path.into(),
            source,
        })?;
    // SAFETY: flock on an fd we own; LOCK_NB makes it fail instead of waiting.
    if unsafe { libc::flock(file.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) } != 0 {
        return Err(RunError::Locked(path.into()));
    }
    Ok(InstanceLock { _file: file })
}

/// Routes each phase of each iteration to its own slot in the BPF maps.
struct SlotObserver<'a> {
    probes: Option<&'a mut Probes>,
    iteration: u32,
    progress: &'a Progress,
    case: String,
    error: Option<ProbeError>,
}

fn slot(iteration: u32, phase: Phase) -> u32 {
    1 + iteration * PHASES.len() as u32 + phase.index() as u32
}

impl PhaseObserver for SlotObserver<'_> {
    fn begin(&mut self, phase: Phase) {
        self.progress
            .set(Some((format!("{} {}", self.case, phase.name()), Instant::now())));
        if let Some(Err(e)) = self.probes.as_mut().map(|p| p.set_phase(slot(self.iteration, phase))) {
            self.error.get_or_insert(e);
        }
    }

    fn end(&mut self, _phase: Phase) {
        if let Some(Err(e)) = self.probes.as_mut().map(|p| p.set_phase(0)) {
            self.error.get_or_insert(e);
        }
        self.progress.set(None);
    }
}

/// The iterations of one case that ran, and what stopped the rest.
struct CaseRuns {
    runs: Vec<Vec<PhaseRun>>,
    failure: Option<WorkloadError>,
}

/// Why a case did not run at all.
enum CaseError {
    /// This host cannot run it (e.g. no hugepages): skipped with the reason.
    Skip(String),
    /// Setting it up failed (e.g. the DMA context): a failure.
    Fail(String),
    /// The probes broke: the whole run stops.
    Probes(ProbeError),
}

/// Reserves what `case` needs, sets up its DMA context, runs one discarded warm-up iteration,
/// then `iterations` iterations traced into `probes` if given.
fn run_case(
    case: &Case,
    opts: &RunOptions,
    device: Option<&Device>,
    iterations: u32,
    mut probes: Option<&mut Probes>,
    progress: &Progress,
    cancel: &AtomicBool,
) -> Result<CaseRuns, CaseError> {
    progress.stage(&format!("{} {STAGE_OPEN}", case.name()));
    let _reservation = match case.backing.hugetlb_kb {
        Some(kb) => Some(Reservation::reserve(kb, opts.size / case.backing.page_size()).map_err(CaseError::Skip)?),
        None => None,
    };
    let traced = if probes.is_some() { "traced" } else { "untraced" };
    eprintln!(
        "dmaprof: {} {traced} ({iterations} x {})",
        case.name(),
        crate::size::HumanSize(opts.size)
    );
    let mut dma = match (case.mode, device) {
        (IommuMode::None, _) => None,
        (mode, Some(dev)) => Some(
            DmaContext::open(mode, dev, case.backing.memfd, opts.size, case.backing.page_size())
                .map_err(|e| CaseError::Fail(e.to_string()))?,
        ),
        (_, None) => return Err(CaseError::Skip("needs a VFIO device".into())),
    };
    // Warm up untraced and discard: first touches of fresh (or freshly reserved) memory are
    // many times slower and would make every first iteration an outlier.
    let mut warm = SlotObserver {
        probes: None,
        iteration: 0,
        progress,
        case: case.name(),
        error: None,
    };
    if let Err(e) = workload::run_iteration(case, opts.size, dma.as_mut(), &mut warm, cancel) {
        return Ok(CaseRuns {
            runs: Vec::new(),
            failure: Some(e),
        });
    }
    let mut runs = Vec::new();
    for iteration in 0..iterations {
        let mut obs = SlotObserver {
            probes: probes.as_deref_mut(),
            iteration,
            progress,
            case: case.name(),
            error: None,
        };
        let r = workload::run_iteration(case, opts.size, dma.as_mut(), &mut obs, cancel);
        if let Some(e) = obs.error.take() {
            return Err(CaseError::Probes(e));
        }
        match r {
            Ok(r) => runs.push(r),
            Err(e) => return Ok(CaseRuns { runs, failure: Some(e) }),
        }
    }
    Ok(CaseRuns { runs, failure: None })
}

/// Runs the plan on the calling thread (the probes watch this thread only).
pub fn execute(
    opts: &RunOptions,
    plan: Plan,
    doctor: &Doctor,
    device: Option<&Device>,
    cancel: &AtomicBool,
    progress: &Arc<Progress>,
) -> Result<Report, RunError> {
    fs::create_dir_all(&opts.out).map_err(|source| RunError::Output {
        path: opts.out.display().to_string(),
        source,
    })?;
    progress.stage(STAGE_SETUP);
    let symbols = KernelSymbols::load().ok();
    let mut kernel = doctor.kernel.clone();
    // The symbols are loaded already: judge the kernel's features from them, not another read.
    kernel.features = match symbols.as_ref().filter(|s| s.usable()) {
        Some(s) => crate::capabilities::kernel_features_from(Some(&|n| s.has(n))),
        None => crate::capabilities::kernel_features_from(None),
    };
    let mut report = Report {
        schema: report::SCHEMA.into(),
        dmaprof_version: env!("CARGO_PKG_VERSION").into(),
        kernel,
        device: device.map(|d| d.bdf.clone()),
        capabilities: doctor.capabilities.clone(),
        config: Config {
            size_bytes: opts.size,
            iterations: opts.iterations,
            freq_hz: opts.freq_hz,
            variants: opts.variants.clone(),
            prefaults: opts.prefaults.iter().map(|p| p.name().to_owned()).collect(),
            traced: !opts.no_trace,
            probes: if opts.no_trace {
                Vec::new()
            } else {
                opts.mechanisms.clone()
            },
        },
        cases: Vec::new(),
        skipped: plan.skipped,
        failed: Vec::new(),
        probes: Vec::new(),
        partial: false,
        timing: Timing::default(),
    };
    let reference_start = Instant::now();
    // Untraced reference: one iteration per case before any probe is loaded, so the report
    // can show what tracing costs (traced / untraced) per phase.
    let mut untraced: BTreeMap<String, Vec<PhaseRun>> = BTreeMap::new();
    if !opts.no_trace {
        for case in &plan.run {
            if let Ok(CaseRuns { runs, failure: None }) = run_case(case, opts, device, 1, None, progress, cancel) {
                untraced.extend(runs.into_iter().next().map(|r| (case.name(), r)));
            }
        }
    }
    report.timing.reference_ns = reference_start.elapsed().as_nanos() as u64;
    progress.stage(STAGE_ATTACH);
    let attach_start = Instant::now();
    let mut probes = if opts.no_trace {
        None
    } else {
        Some(Probes::attach(
            gettid(),
            opts.freq_hz,
            symbols.as_ref(),
            opts.sample_map_entries,
            &opts.mechanisms,
        )?)
    };
    report.timing.attach_ns = attach_start.elapsed().as_nanos() as u64;
    report.timing.start_to_attached_ns = opts.started.elapsed().as_nanos() as u64;
    report.probes = probes
        .as_ref()
        .map(|p| p.status.iter().map(Into::into).collect())
        .unwrap_or_default();
    for case in plan.run {
        if cancel.load(Ordering::Relaxed) {
            report.partial = true;
            break;
        }
        let result = run_case(&case, opts, device, opts.iterations, probes.as_mut(), progress, cancel);
        let CaseRuns { runs, failure } = match result {
            Ok(r) => r,
            Err(CaseError::Skip(reason)) => {
                eprintln!("dmaprof: skipping {}: {reason}", case.name());
                report.skipped.push(Skipped {
                    name: case.name(),
                    reason,
                });
                continue;
            }
            Err(CaseError::Fail(error)) => {
                eprintln!("dmaprof: {} failed: {error}", case.name());
                report.failed.push(Failed {
                    name: case.name(),
                    error,
                });
                continue;
            }
            Err(CaseError::Probes(e)) => return Err(e.into()),
        };
        progress.stage(&format!("{} {STAGE_REPORT}", case.name()));
        let drained = match probes.as_mut() {
            Some(p) => p.drain(1 + opts.iterations * PHASES.len() as u32)?,
            None => Drained::default(),
        };
        let reference = untraced.get(&case.name()).map(Vec::as_slice);
        if !runs.is_empty() {
            report
                .cases
                .push(case_report(opts, &case, &runs, reference, drained, symbols.as_ref())?);
        }
        match failure {
            Some(WorkloadError::Interrupted) => {
                report.partial = true;
                break;
            }
            Some(e) => {
                eprintln!("dmaprof: {} failed: {e}", case.name());
                report.failed.push(Failed {
                    name: case.name(),
                    error: e.to_string(),
                });
            }
            None => {}
        }
    }
    // From here on a signal no longer shortens the run: the report is complete unless it came
    // before this check.
    progress.stage(STAGE_FINISH);
    if cancel.load(Ordering::Relaxed) {
        report.partial = true;
    }
    report.timing.peak_rss_kib = peak_rss_kib();
    write_report(&opts.out, &report)?;
    Ok(report)
}

/// VmHWM of this process.
fn peak_rss_kib() -> u64 {
    crate::capabilities::self_status("VmHWM")
        .and_then(|v| v.trim_end_matches("kB").trim().parse().ok())
        .unwrap_or(0)
}

/// Writes `report.json` into `dir`.
pub fn write_report(dir: &Path, report: &Report) -> Result<(), RunError> {
    let path = dir.join("report.json");
    let json = serde_json::to_string_pretty(report).expect("reports always serialise");
    fs::write(&path, json + "\n").map_err(|source| RunError::Output {
        path: path.display().to_string(),
        source,
    })
}

/// phase -> category -> function, weighted by exact exclusive ns (median iterations), with the
/// syscall time no row covered and the unattributed rest as their own frames.
fn summary_folded(phases: &[PhaseReport]) -> Folded {
    let mut f = Folded::default();
    for p in phases {
        let mut covered = 0;
        for r in &p.exact.rows {
            f.add(
                [p.name.as_str(), &format!("cat:{}", r.category), &r.function],
                r.exclusive_ns,
            );
            if r.category == "other" {
                covered += r.exclusive_ns;
            }
        }
        let rest = p
            .exact
            .categories
            .get("other")
            .copied()
            .unwrap_or(0)
            .saturating_sub(covered);
        f.add([p.name.as_str(), "cat:other", "[syscall, unprobed]"], rest);
        f.add(
            [p.name.as_str(), "[unattributed]"],
            p.exact.unattributed_ns.max(0) as u64,
        );
    }
    f.stacks.retain(|_, n| *n > 0);
    f
}

/// The exact breakdown of `phase` for its median iteration.
fn exact_breakdown(
    phase: Phase,
    per_iter: &[&PhaseRun],
    iter_counters: &[crate::abi::PhaseCounters],
    rows: &[(u32, usize, crate::abi::RowStats)],
) -> Exact {
    let mut order: Vec<usize> = (0..per_iter.len()).collect();
    order.sort_by_key(|&i| per_iter[i].wall_ns);
    let Some(&it) = order.get(order.len().saturating_sub(1) / 2) else {
        return Exact::default();
    };
    let wall_ns = per_iter[it].wall_ns;
    let c = iter_counters.get(it).copied().unwrap_or_default();
    let s = slot(it as u32, phase);
    let mut categories: BTreeMap<String, u64> = CATEGORIES
        .iter()
        .filter(|c| **c != Category::User)
        .map(|c| (c.name().to_owned(), 0))
        .collect();
    let mut out_rows = Vec::new();
    let mut attributed = 0u64;
    for (_, row, st) in rows.iter().filter(|(sl, _, _)| *sl == s) {
        let r = &PROBE_TABLE[*row];
        *categories.entry(r.category.name().to_owned()).or_default() += st.exclusive_ns;
        attributed += st.exclusive_ns;
        out_rows.push(ExactRow {
            function: r.function.into(),
            category: r.category.name().into(),
            mechanism: "kprobe".into(),
            calls: st.calls,
            inclusive_ns: st.inclusive_ns,
            exclusive_ns: st.exclusive_ns,
            amount: st.amount,
            unit: r.amount.map(|(_, u)| u.to_owned()),
        });
    }
    out_rows.sort_by_key(|r| std::cmp::Reverse(r.inclusive_ns));
    // Syscall time that no probed row covered is the syscall's own work: `other`.
    *categories.entry("other".into()).or_default() += c.syscall_ns.saturating_sub(attributed);
    let sum: u64 = categories.values().sum();
    Exact {
        iteration: it as u32,
        wall_ns,
        kernel_ns: c.syscall_ns,
        categories,
        unattributed_ns: wall_ns as i64 - sum as i64,
        rows: out_rows,
        lost_events: c.stack_overflow + c.unmatched_exit,
    }
}

fn case_report(
    opts: &RunOptions,
    case: &Case,
    runs: &[Vec<PhaseRun>],
    untraced: Option<&[PhaseRun]>,
    drained: Drained,
    symbols: Option<&KernelSymbols>,
) -> Result<CaseReport, RunError> {
    let name = case.name();
    let case_dir = opts.out.join(&name);
    fs::create_dir_all(&case_dir).map_err(|source| RunError::Output {
        path: case_dir.display().to_string(),
        source,
    })?;
    let counters: BTreeMap<u32, crate::abi::PhaseCounters> = drained.counters.into_iter().collect();
    // Phase index -> (category counts, folded stacks, lost).
    let mut by_phase: BTreeMap<usize, (CategoryCounts, Folded)> = BTreeMap::new();
    let phase_of_slot = |s: u32| ((s - 1) as usize) % PHASES.len();
    for s in &drained.samples {
        if s.slot == 0 {
            continue;
        }
        let phase = PHASES[phase_of_slot(s.slot)];
        let names: Vec<String> = s
            .kernel
            .iter()
            .map(|ip| symbols.map_or_else(|| format!("0x{ip:x}"), |sy| sy.resolve(*ip)))
            .collect();
        let (cats, folded) = by_phase.entry(phase.index()).or_default();
        cats.add(classify(names.iter().map(String::as_str)), s.count);
        let mut frames = vec![phase.name().to_owned()];
        if s.has_user || names.is_empty() {
            frames.push("[user]".into());
        }
        frames.extend(names.into_iter().rev());
        folded.add(frames, s.count);
    }
    let mut phases = Vec::new();
    for &phase in PHASES {
        let per_iter: Vec<&PhaseRun> = runs
            .iter()
            .filter_map(|r| r.iter().find(|p| p.phase == phase))
            .collect();
        if per_iter.is_empty() {
            continue;
        }
        let iter_counters: Vec<crate::abi::PhaseCounters> = (0..runs.len() as u32)
            .map(|i| counters.get(&slot(i, phase)).copied().unwrap_or_default())
            .collect();
        let wall = Stats::of(per_iter.iter().map(|p| p.wall_ns).collect());
        let kernel = Stats::of(iter_counters.iter().map(|c| c.syscall_ns).collect());
        let (cats, folded) = by_phase.remove(&phase.index()).unwrap_or_default();
        let stem = phase.name();
        folded
            .write(&case_dir, stem, &format!("{name}: {stem}"))
            .map_err(|source| RunError::Output {
                path: case_dir.join(stem).display().to_string(),
                source,
            })?;
        // Counters are per iteration (the median), like the times next to them.
        let med = |f: fn(&crate::abi::PhaseCounters) -> u64| Stats::of(iter_counters.iter().map(f).collect()).median;
        let sum = |f: fn(&crate::abi::PhaseCounters) -> u64| iter_counters.iter().map(f).sum::<u64>();
        let gib_per_s = if wall.median > 0 && phase != Phase::Close && phase != Phase::MemfdCreate {
            opts.size as f64 / (1u64 << 30) as f64 / (wall.median as f64 / 1e9)
        } else {
            0.0
        };
        let exact = exact_breakdown(phase, &per_iter, &iter_counters, &drained.rows);
        let untraced_ns = untraced
            .and_then(|u| u.iter().find(|p| p.phase == phase))
            .map(|p| p.wall_ns);
        let overhead = untraced_ns.filter(|u| *u > 0).map(|u| wall.median as f64 / u as f64);
        phases.push(PhaseReport {
            name: stem.into(),
            untraced_ns,
            overhead,
            exact,
            wall_ns: wall,
            kernel_ns: kernel,
            gib_per_s,
            sampled: Sampled {
                samples: cats.total(),
                lost: sum(|c| c.lost_samples),
                categories: cats.shares().into_iter().map(|(k, v)| (k.to_owned(), v)).collect(),
            },
            counters: Counters {
                faults: med(|c| c.user_faults),
                minor_faults: Stats::of(per_iter.iter().map(|p| p.minor_faults).collect()).median,
                major_faults: Stats::of(per_iter.iter().map(|p| p.major_faults).collect()).median,
                syscalls: med(|c| c.syscalls),
                unbalanced: sum(|c| c.unbalanced),
            },
            folded: format!("{name}/{stem}.folded"),
            flamegraph: format!("{name}/{stem}.svg"),
        });
    }
    let summary = summary_folded(&phases);
    summary
        .write_counted(
            &case_dir,
            "summary",
            &format!("{name}: exact time, phase -> category -> function"),
            "ns",
        )
        .map_err(|source| RunError::Output {
            path: case_dir.join("summary.svg").display().to_string(),
            source,
        })?;
    Ok(CaseReport {
        summary_flamegraph: Some(format!("{name}/summary.svg")),
        name,
        iommu_mode: case.mode.name().into(),
        backing: case.backing.name.into(),
        prefault: case.prefault.name().into(),
        map_ioctl: (case.mode != IommuMode::None).then(|| dma::map_ioctl(case.mode, case.backing.memfd).to_owned()),
        size_bytes: opts.size,
        page_size: case.backing.page_size(),
        phases,
    })
}
