//! A `dmaprof run` session: [`Session::prepare`] (output directory, privileges, plan, the
//! single-instance lock, the device) and [`Session::execute`] (untraced reference, probes, each
//! case's iterations, attribution, files), on the thread the probes watch.
use std::{cell::RefCell, path::Path, time::Instant};

use crate::{
    attribution::{self, CaseInput, Coverage, Demotion, PassRuns},
    calibrate,
    device::{Device, DeviceError},
    dma::DmaContext,
    doctor::{self, Doctor},
    floors::{self, Pace},
    held::Held,
    hugepages::Reservation,
    kernel,
    loader::{self, AttachError, Drained, Probes, Request},
    matrix::{Case, Workload},
    output::{self, OutDir, OutputError},
    plan::{self, Plan, PlanError, RunOptions},
    privileges,
    probes::{AttachedBy, Group, Pass, ProbeCost},
    report::{self, Config, Failed, LayoutRerun, Report, Skipped, Spend, Spent, Timing},
    size::ByteSize,
    stop::{Control, Stage},
    symbols::{KernelSymbols, Pending},
    sys::{self, FileLock, LockError},
    workload::{self, Phase, PhaseObserver, PhaseRun, WorkloadError},
};

/// Why a run could not start or finish.
#[derive(Debug, thiserror::Error)]
pub enum RunError {
    /// Bad options (exit code 2).
    #[error("{0}")]
    Usage(String),
    /// The plan could not be made from the options (exit code 2).
    #[error(transparent)]
    Plan(#[from] PlanError),
    /// Another dmaprof holds the lock.
    #[error("another dmaprof is running ({0}): wait for it or stop it")]
    Locked(#[from] LockError),
    /// Probes could not be loaded.
    #[error(transparent)]
    Attach(#[from] AttachError),
    /// The device cannot be used (exit code 2).
    #[error(transparent)]
    Device(#[from] DeviceError),
    /// Output could not be written.
    #[error(transparent)]
    Output(#[from] OutputError),
}

impl RunError {
    /// Whether the user should fix their command line (exit code 2) rather than the system.
    pub fn is_usage(&self) -> bool {
        matches!(self, RunError::Usage(_) | RunError::Plan(_) | RunError::Device(_))
    }
}

/// A prepared run: nothing has been measured yet, everything it needs is held.
pub struct Session {
    opts: RunOptions,
    out: OutDir,
    _lock: FileLock,
    device: Option<Device>,
    plan: Plan,
    doctor: Doctor,
    /// Set once the kernel asked for the device back: the DMA cases after that are skipped.
    device_gone: RefCell<Option<String>>,
    /// Where the cases' time went so far.
    spent: RefCell<Spent>,
}

/// Where the single-instance lock lives.
fn lock_path() -> &'static Path {
    if Path::new("/run").is_dir() {
        Path::new("/run/dmaprof.lock")
    } else {
        Path::new("/tmp/dmaprof.lock")
    }
}

impl Session {
    /// Checks privileges and the output directory, plans the cases, takes the lock and opens the
    /// device; usage errors come out before anything is changed.
    pub fn prepare(opts: RunOptions) -> Result<Self, RunError> {
        if opts.out.exists() && !opts.out.is_dir() {
            return Err(RunError::Usage(format!(
                "--out {} exists and is not a directory",
                opts.out.display()
            )));
        }
        if let Some(why) = privileges::refusal() {
            return Err(RunError::Usage(why));
        }
        if opts.fail_map_allocs && !Path::new("/proc/thread-self/make-it-fail").exists() {
            return Err(RunError::Usage(
                "--fail-map-allocs needs a kernel with CONFIG_FAULT_INJECTION (/proc/thread-self/make-it-fail)".into(),
            ));
        }
        output::claim(&opts.out).map_err(|e| RunError::Usage(e.to_string()))?;
        let out = OutDir::create(opts.out.clone()).map_err(|e| {
            RunError::Usage(format!(
                "cannot create --out {}: {}: choose a writable directory",
                e.path, e.source
            ))
        })?;
        let doctor = doctor::probe_for_run();
        let plan = plan::plan(&opts, &doctor.capabilities)?;
        let lock = sys::try_lock(lock_path())?;
        let device = match &opts.device {
            Some(bdf) if plan.run.iter().any(|c| c.mode.is_some()) => Some(Device::open(bdf, opts.bind)?),
            Some(bdf) => {
                crate::device::check(bdf, opts.bind)?;
                None
            }
            None => None,
        };
        Ok(Self {
            opts,
            out,
            _lock: lock,
            device,
            plan,
            doctor,
            device_gone: RefCell::new(None),
            spent: RefCell::new(Spent::default()),
        })
    }

    /// The plan, for printing before the run starts.
    pub fn plan(&self) -> &Plan {
        &self.plan
    }

    /// The output directory.
    pub fn out_dir(&self) -> &Path {
        &self.out.path
    }

    /// Runs the plan on the calling thread (the probes watch this thread only) and writes the
    /// report.
    pub fn execute(self, control: &Control) -> Result<Report, RunError> {
        control.enter(Stage::Attaching);
        let started = Instant::now();
        let pending = KernelSymbols::load_in_background();
        let rows = self.opts.passes.contains(&Pass::Exact);
        let loaded = self.load_object(rows);
        // Probe rows are found by their addresses; stacks are named only after the run.
        let (symbols, pending) = if rows {
            (pending.wait(), None)
        } else {
            (None, Some(pending))
        };
        let mut probes = self.attach(loaded?, symbols.as_ref(), rows)?;
        let attached = (started.elapsed(), self.opts.started.elapsed());
        let symbols = pending.map_or(symbols, Pending::wait);
        let mut report = self.new_report(symbols.as_ref());
        report.timing.attach_ns = attached.0.as_nanos() as u64;
        report.timing.start_to_attached_ns = attached.1.as_nanos() as u64;
        report.probes = probes.as_ref().map(|p| p.status.clone()).unwrap_or_default();
        report.probe_cost = match (probes.as_mut(), symbols.as_ref()) {
            (Some(p), Some(s)) if self.opts.passes.contains(&Pass::Exact) => {
                let mut used: Vec<AttachedBy> = p.attached_rows().into_iter().map(|(_, m)| m).collect();
                let tracepoints = p.status.iter().filter(|s| s.attached);
                used.extend(
                    tracepoints
                        .map(|s| s.mechanism)
                        .filter(|m| *m == AttachedBy::RawTracepoint),
                );
                Some(calibrate::measure(p, s, &used))
            }
            _ => None,
        };
        // With every probe detached again (attach leaves them so until a pass asks): the
        // floors are what the machine does untraced, and start-up is not made to wait for them.
        report.floors = Some(floors::measure());
        let coverage = match &probes {
            Some(p) => Coverage::of(&p.status, &self.opts.passes),
            None => Coverage::none(),
        };
        if let (Err(why), Some(_)) = (&coverage.exact, &probes) {
            eprintln!("dmaprof: exact attribution unavailable: {why}");
        }
        let mut tracing = Tracing {
            probes: probes.as_mut(),
            symbols: symbols.as_ref(),
            coverage: &coverage,
        };
        'cases: for case in &self.plan.run {
            for &size in &self.opts.sizes {
                if control.cancelled() || self.measure_case(case, size, &mut report, &mut tracing, control)? {
                    report.partial = true;
                    break 'cases;
                }
            }
        }
        // The last case may have left its exact pass's rows attached (see `Turn`).
        if let Some(p) = tracing.probes.as_deref_mut() {
            self.timed(Spend::Switching, || p.set_groups(&[]))?;
        }
        report.sweeps = crate::sweep::fit_all(&report.cases);
        report.timing.spent = self.spent.borrow().clone();
        eprintln!("dmaprof: {}", report.timing.spent.summary());
        // From here on a signal no longer shortens the run: the report is complete unless it
        // came before this check.
        control.enter(Stage::Finishing);
        report.partial |= control.cancelled();
        report.timing.peak_rss_kib = sys::peak_rss_kib();
        output::write_sweeps(&self.out.path, &report.sweeps)?;
        output::write_report(&self.out.path, &report)?;
        output::write_index(&self.out.path, &report)?;
        Ok(report)
    }

    fn new_report(&self, symbols: Option<&KernelSymbols>) -> Report {
        let mut kernel = self.doctor.kernel.clone();
        // The symbols are loaded already: judge the kernel's features from them.
        kernel.features = match symbols.filter(|s| s.usable()) {
            Some(s) => kernel::features_from(Some(&|n| s.has(n))),
            None => kernel::features_from(None),
        };
        let o = &self.opts;
        Report {
            schema: report::SCHEMA.into(),
            dmaprof_version: env!("CARGO_PKG_VERSION").into(),
            kernel,
            device: self.device.as_ref().map(|d| d.bdf.clone()),
            capabilities: self.doctor.capabilities.clone(),
            config: Config {
                size_bytes: o.size.bytes(),
                iterations: o.iterations,
                freq_hz: o.freq_hz,
                variants: o.variants.clone(),
                prefaults: o.prefaults.clone(),
                traced_iterations: o.traced_iterations,
                passes: o.passes.clone(),
                traced: traced(&o.passes),
                probes: if traced(&o.passes) {
                    o.mechanisms.clone()
                } else {
                    Vec::new()
                },
                thp: o.thp,
                prime: o.prime,
                settle_ms: o.settle.as_millis() as u64,
            },
            cases: Vec::new(),
            skipped: self.plan.skipped.clone(),
            failed: Vec::new(),
            leaks: Vec::new(),
            probes: Vec::new(),
            partial: false,
            timing: Timing::default(),
            probe_cost: None,
            floors: None,
            sweeps: Vec::new(),
        }
    }

    /// Loads the BPF object the traced passes need (None: no traced pass); `rows`: the exact
    /// pass's probe rows will be attached.
    fn load_object(&self, rows: bool) -> Result<Option<loader::Loaded>, AttachError> {
        if self.opts.passes.iter().all(|p| *p == Pass::Untraced) {
            return Ok(None);
        }
        let watch = loader::Watched::Thread(sys::gettid());
        loader::load_object(&watch, self.opts.sample_map_entries, rows).map(Some)
    }

    /// Attaches what the traced passes need to the loaded object (the probe rows only with
    /// `rows`), then detaches it again until a pass asks for it.
    fn attach(
        &self,
        loaded: Option<loader::Loaded>,
        symbols: Option<&KernelSymbols>,
        rows: bool,
    ) -> Result<Option<Probes>, AttachError> {
        let Some(loaded) = loaded else { return Ok(None) };
        let mut probes = loader::attach_loaded(
            loaded,
            &Request {
                watch: loader::Watched::Thread(sys::gettid()),
                freq_hz: self.opts.freq_hz,
                mechanisms: &self.opts.mechanisms,
                symbols,
                sample_map_entries: self.opts.sample_map_entries,
                rows: (!rows).then_some(&[]),
            },
        )?;
        probes.set_groups(&[])?;
        Ok(Some(probes))
    }

    /// Runs one case traced, attributes it and writes its files. Returns true when the run
    /// must stop (interrupted).
    fn measure_case(
        &self,
        case: &Case,
        size: ByteSize,
        report: &mut Report,
        tracing: &mut Tracing,
        control: &Control,
    ) -> Result<bool, RunError> {
        let mut probes = tracing.probes.as_deref_mut();
        let name = self.label(case, size);
        let cost = report.probe_cost.clone();
        let held = case.mode.map(|_| Held::now());
        let result = self.run_case(case, size, probes.as_deref_mut(), cost.as_ref(), control);
        if let Some(before) = held {
            report.leaks.extend(leaks_of(&before, &name));
        }
        let CaseRuns { steps, demotion } = match result {
            Ok(r) => r,
            Err(CaseError::Skip(reason)) => return Ok(skip(report, name, reason)),
            Err(CaseError::Fail(error)) => {
                eprintln!("dmaprof: {name} failed: {error}");
                report.failed.push(Failed {
                    name,
                    error,
                    left_mapped_bytes: None,
                });
                return Ok(false);
            }
            Err(CaseError::Probes(e)) => return Err(e.into()),
        };
        control.enter(Stage::Reporting(name.clone()));
        let reporting = Instant::now();
        let (drained, rows) = match probes {
            Some(p) => (
                p.drain(attribution::slots(2 * self.opts.traced_iterations))?,
                p.attached_rows(),
            ),
            None => (Drained::default(), Vec::new()),
        };
        // Drained above all the same: the next case's slots start empty.
        if let Some(e @ WorkloadError::HugepagesTaken { .. }) = &steps.failure {
            return Ok(skip(report, name, e.to_string()));
        }
        if !steps.runs.is_empty() {
            let workload = Workload {
                case: *case,
                size,
                thp: self.opts.thp,
            };
            let out = attribution::case_report(&CaseInput {
                label: &name,
                workload: &workload,
                runs: &steps.runs,
                drained: &drained,
                symbols: tracing.symbols,
                rows: &rows,
                coverage: tracing.coverage,
                cost: report.probe_cost.as_ref(),
                demotion: &demotion,
                pace: &steps.pace,
                layout_reruns: &steps.layout_reruns,
            });
            output::write_case(&self.out.path, &out)?;
            report.cases.push(out.report);
        }
        self.spent.borrow_mut().add(Spend::Reporting, reporting.elapsed());
        match steps.failure {
            Some(WorkloadError::Interrupted) => return Ok(true),
            Some(e) => report.failed.push(self.failed(name, &e)),
            None => {}
        }
        Ok(false)
    }

    /// A case that failed mid-run; a device that went away is remembered for the cases after.
    fn failed(&self, name: String, e: &WorkloadError) -> Failed {
        eprintln!("dmaprof: {name} failed: {e}");
        if let WorkloadError::DeviceRemoved { bdf } = e {
            *self.device_gone.borrow_mut() = Some(format!(
                "device {bdf} went away during the run: the kernel asked for it back while {name} used it"
            ));
        }
        let left_mapped_bytes = match e {
            WorkloadError::Dma(d) => d.left_mapped,
            _ => None,
        };
        Failed {
            name,
            error: e.to_string(),
            left_mapped_bytes,
        }
    }

    /// Reserves what `case` needs, sets up its DMA context, runs one discarded warm-up
    /// iteration, then the passes' iterations in their interleaved order, each pass with its
    /// probes attached and the others detached.
    fn run_case(
        &self,
        case: &Case,
        size: ByteSize,
        mut probes: Option<&mut Probes>,
        cost: Option<&ProbeCost>,
        control: &Control,
    ) -> Result<CaseRuns, CaseError> {
        control.enter(Stage::Opening(case.name()));
        let opening = Instant::now();
        let reservation = match case.backing.hugetlb_kb() {
            Some(kb) => Some(
                Reservation::reserve(kb, size.pages(case.backing.page_size()))
                    .map_err(|e| CaseError::Skip(e.to_string()))?,
            ),
            None => None,
        };
        let scouting = probes.is_some() && cost.is_some() && self.opts.passes.contains(&Pass::Exact);
        let turn = match probes.as_deref() {
            Some(p) if scouting && p.rows_linked() => Turn::ExactFirst,
            _ if scouting => Turn::ExactLast,
            _ => Turn::Unscouted,
        };
        let steps = case_steps(
            &self.opts.passes,
            (self.opts.iterations, self.opts.traced_iterations),
            turn,
        );
        eprintln!("dmaprof: {} ({} iterations x {size})", case.name(), steps.len());
        let mut dma = self.dma_context(case, size)?;
        self.spent.borrow_mut().add(Spend::Opening, opening.elapsed());
        let workload = Workload {
            case: *case,
            size,
            thp: self.opts.thp,
        };
        // What an earlier case left attached comes off (it may have failed mid-pass), except
        // the rows of an exact pass that came last: this case's own comes first.
        if let Some(p) = probes.as_deref_mut() {
            p.set_case(case.mode);
            let groups = if turn == Turn::ExactFirst {
                Pass::Exact.groups()
            } else {
                &[]
            };
            self.timed(Spend::Switching, || p.set_groups(groups))
                .map_err(CaseError::Probes)?;
        }
        let mut demotion = Demotion::default();
        let steps = match self.warm_up(&workload, dma.as_mut(), control) {
            Ok(warm) => {
                let scout = cost.filter(|_| scouting).map(|cost| Scout {
                    demotion: &mut demotion,
                    cost,
                    pending: Some(warm),
                });
                let current = if turn == Turn::ExactFirst {
                    Pass::Exact
                } else {
                    Pass::Untraced
                };
                let dma = dma.as_mut();
                self.run_steps(&workload, (&steps, current), probes.as_deref_mut(), dma, scout, control)?
            }
            Err(e) => Steps::default().failed(e),
        };
        // An exact pass that came last leaves its rows for the next case's to start with
        // (unless a sampled iteration ran again after it: then the sampler is attached).
        let ok = steps.failure.is_none();
        let leave = turn == Turn::ExactLast && probes.as_deref().is_some_and(Probes::rows_linked);
        if let Some(p) = probes.filter(|_| ok && !leave) {
            self.timed(Spend::Switching, || p.set_groups(&[]))
                .map_err(CaseError::Probes)?;
        }
        self.timed(Spend::Opening, || drop((dma, reservation)));
        Ok(CaseRuns { steps, demotion })
    }

    /// Runs the passes' iterations in `steps` order (from the `current` pass's probes),
    /// switching probes (and priming after a switch) where the pass changes; a pending `scout`
    /// runs before the first exact iteration. Returns them, and the failure that stopped them.
    fn run_steps(
        &self,
        workload: &Workload,
        (steps, mut current): (&[(Pass, u32)], Pass),
        mut probes: Option<&mut Probes>,
        mut dma: Option<&mut DmaContext>,
        mut scout: Option<Scout<'_>>,
        control: &Control,
    ) -> Result<Steps, CaseError> {
        let case = &workload.case;
        let mut out = Steps::default();
        let mut pace = Pace::new();
        for &(pass, index) in steps {
            if let (Some(p), Some(s)) = (probes.as_deref_mut(), scout.as_mut())
                && pass == Pass::Exact
                && let Some(warm) = s.pending.take()
            {
                if let Err(e) = self.scout(p, s, &warm, workload, dma.as_deref_mut(), control)? {
                    return Ok(out.failed(e));
                }
                current = Pass::Exact;
            }
            if let Some(p) = probes.as_deref_mut().filter(|_| pass != current) {
                control.enter(Stage::Switching(case.name(), pass));
                current = pass;
                if let Err(e) = self.switch(p, pass.groups(), workload, dma.as_deref_mut(), control)? {
                    return Ok(out.failed(e));
                }
            }
            if pass == Pass::Untraced {
                out.pace.push(pace.take());
            }
            let step = Step {
                pass,
                index,
                near: out.near(pass),
                reruns: MAX_LAYOUT_RERUNS,
            };
            match self.run_step(
                workload,
                step,
                probes.as_deref_mut(),
                dma.as_deref_mut(),
                scout.as_mut(),
                control,
            )? {
                Ok((r, reruns)) => {
                    let at = self.slot_iteration(pass, index).unwrap_or(index);
                    match pass {
                        Pass::Sampled if step.near.is_none() => out.unmatched.push(at),
                        Pass::Exact if step.near.is_none() => out.unheld.push(at),
                        _ => {}
                    }
                    out.runs.entry(pass).or_default().push((at, r));
                    out.layout_reruns.extend(reruns);
                }
                Err(e) => return Ok(out.failed(e)),
            }
        }
        if let Some(p) = probes.as_deref_mut()
            && let Err(e) = self.hold_exact_after(p, workload, &mut out, dma.as_deref_mut(), control)?
        {
            return Ok(out.failed(e));
        }
        if let Some(p) = probes
            && let Err(e) = self.match_after_exact(p, workload, &mut out, dma, control)?
        {
            return Ok(out.failed(e));
        }
        Ok(out)
    }

    /// The exact iterations that ran before any untraced one (the turns where the exact pass
    /// comes first, right after the scout and a probe switch) and whose buffers came in a
    /// layout far from the untraced iterations' median run again after them, on the exact
    /// pass's probes (see [`Session::far_layout`]). The first full iteration after a switch
    /// often comes in another layout than the rest: in a default matrix 2 of 15 4 KiB memfd
    /// exact iterations did (30590 runs against a median of 1603, its unmap 51.3 ms against
    /// 14.4), and the breakdown described other work than the headline times. The sampled
    /// iterations, held against the old layout, are then held against the new one
    /// ([`Session::match_after_exact`]).
    fn hold_exact_after(
        &self,
        p: &mut Probes,
        workload: &Workload,
        out: &mut Steps,
        mut dma: Option<&mut DmaContext>,
        control: &Control,
    ) -> Result<Result<(), WorkloadError>, CaseError> {
        let near = out.near(Pass::Exact);
        let mut switched = false;
        for at in std::mem::take(&mut out.unheld) {
            let Some(walls) = out.ran(Pass::Exact, at) else {
                continue;
            };
            let Some(rerun) = self.far_layout(p, (Pass::Exact, at), &walls, near, workload)? else {
                continue;
            };
            out.layout_reruns.push(rerun);
            if !switched {
                control.enter(Stage::Switching(workload.case.name(), Pass::Exact));
                if let Err(e) = self.switch(p, Pass::Exact.groups(), workload, dma.as_deref_mut(), control)? {
                    return Ok(Err(e));
                }
                switched = true;
            }
            let step = Step {
                pass: Pass::Exact,
                index: at,
                near,
                reruns: MAX_LAYOUT_RERUNS - 1,
            };
            match self.run_step(workload, step, Some(&mut *p), dma.as_deref_mut(), None, control)? {
                Ok((r, reruns)) => {
                    out.replace(Pass::Exact, at, r);
                    out.layout_reruns.extend(reruns);
                }
                Err(e) => return Ok(Err(e)),
            }
        }
        if switched && let Some(sampled) = out.runs.get(&Pass::Sampled) {
            out.unmatched = sampled.iter().map(|(at, _)| *at).collect();
        }
        Ok(Ok(()))
    }

    /// The sampled iterations that ran before any exact one (the turns where the exact pass
    /// comes last), or before the exact one ran again ([`Session::hold_exact_after`]), and
    /// whose buffers came in a layout far from the exact iteration's run again after it, on
    /// the sampled pass's probes (see [`Session::far_layout`]). The exact
    /// iteration follows the scout, a slow iteration, and its 4 KiB buffer comes in few runs,
    /// while a sampled iteration after an untraced one mostly comes in many: in a default
    /// matrix 6 of the 7 4 KiB memfd cases whose exact pass came last timed 26183-29260 runs
    /// sampled against 639-1782 exact, and three of them read 11-14 points apart. Switching
    /// back costs the rows' detach, which the next case would otherwise have shared.
    fn match_after_exact(
        &self,
        p: &mut Probes,
        workload: &Workload,
        out: &mut Steps,
        mut dma: Option<&mut DmaContext>,
        control: &Control,
    ) -> Result<Result<(), WorkloadError>, CaseError> {
        let near = out.near(Pass::Sampled);
        let mut switched = false;
        for at in std::mem::take(&mut out.unmatched) {
            let Some(walls) = out.ran(Pass::Sampled, at) else {
                continue;
            };
            let Some(rerun) = self.far_layout(p, (Pass::Sampled, at), &walls, near, workload)? else {
                continue;
            };
            out.layout_reruns.push(rerun);
            if !switched {
                control.enter(Stage::Switching(workload.case.name(), Pass::Sampled));
                if let Err(e) = self.switch(p, Pass::Sampled.groups(), workload, dma.as_deref_mut(), control)? {
                    return Ok(Err(e));
                }
                switched = true;
            }
            let step = Step {
                pass: Pass::Sampled,
                index: at - self.opts.traced_iterations,
                near,
                reruns: MAX_LAYOUT_RERUNS - 1,
            };
            match self.run_step(workload, step, Some(&mut *p), dma.as_deref_mut(), None, control)? {
                Ok((r, reruns)) => {
                    out.replace(Pass::Sampled, at, r);
                    out.layout_reruns.extend(reruns);
                }
                Err(e) => return Ok(Err(e)),
            }
        }
        Ok(Ok(()))
    }

    /// Runs iteration `index` of `pass`; an exact one that outgrew its `scout` runs once more
    /// with more rows demoted, and a traced one whose buffer came in a layout far from the one
    /// it is held against (`near`) runs again, up to [`MAX_LAYOUT_RERUNS`] times (see
    /// [`Session::far_layout`]). Returns it and its layout reruns.
    fn run_step(
        &self,
        workload: &Workload,
        Step {
            pass,
            index,
            near,
            reruns: allowed,
        }: Step,
        mut probes: Option<&mut Probes>,
        mut dma: Option<&mut DmaContext>,
        mut scout: Option<&mut Scout<'_>>,
        control: &Control,
    ) -> Result<Result<Ran, WorkloadError>, CaseError> {
        // The untraced pass switches no phase slot: not even a map update may touch it.
        let slot_iteration = self.slot_iteration(pass, index);
        let mut again = pass == Pass::Exact && scout.is_some();
        let mut reruns = Vec::new();
        loop {
            let traced = probes.as_deref_mut().filter(|_| slot_iteration.is_some());
            let mut obs = SlotObserver::new(traced, slot_iteration.unwrap_or(0), control, &workload.case);
            self.settle(workload);
            let r = self.timed(Spend::Iteration(pass), || {
                workload::run_iteration(workload, dma.as_deref_mut(), &mut obs, control.cancel_flag())
            });
            if let Some(e) = obs.error.take() {
                return Err(CaseError::Probes(e));
            }
            let r = match r {
                Ok(r) => r,
                Err(e) => return Ok(Err(e)),
            };
            let outgrown = match (again, probes.as_deref_mut(), scout.as_deref_mut()) {
                (true, Some(p), Some(s)) => {
                    self.outgrown(p, s, (index, r.as_slice()), workload, dma.as_deref_mut(), control)?
                }
                _ => Ok(false),
            };
            match outgrown {
                Ok(true) => {
                    again = false;
                    continue;
                }
                Ok(false) => {}
                Err(e) => return Ok(Err(e)),
            }
            let far = match (probes.as_deref_mut(), slot_iteration) {
                (Some(p), Some(at)) if reruns.len() < allowed => self.far_layout(p, (pass, at), &r, near, workload)?,
                _ => None,
            };
            match far {
                Some(rerun) => reruns.push(rerun),
                None => return Ok(Ok((r, reruns))),
            }
        }
    }

    /// Whether a traced iteration (`pass`, recorded in slot iteration `at`; its phases
    /// `walls`) came in a layout far from `near` ([`Steps::near`]: the exact iteration's
    /// physical runs for a sampled one, the untraced median for an exact one;
    /// [`crate::layout::far_apart`]); if so its slots are cleared for it to run again. The
    /// breakdown then describes the work the headline times, the two traced passes split like
    /// work, and their shares can be held against each other.
    /// The rerun stays on the same probes, so it costs one iteration and no switch; where the
    /// sampled iteration runs before the exact one (the turns where the exact pass comes last
    /// and leaves its rows attached) there is nothing to come near yet, and
    /// [`Session::match_after_exact`] holds it against the exact iteration afterwards.
    fn far_layout(
        &self,
        p: &mut Probes,
        (pass, at): (Pass, u32),
        walls: &[PhaseRun],
        near: Option<u64>,
        workload: &Workload,
    ) -> Result<Option<LayoutRerun>, CaseError> {
        let (Some(other), Some(got)) = (near, walls.first().and_then(|w| w.physical_runs)) else {
            return Ok(None);
        };
        if !crate::layout::far_apart(got, other, workload.size.pages(4096)) {
            return Ok(None);
        }
        let against = match pass {
            Pass::Exact => "the untraced iterations' median",
            _ => "the exact iteration's",
        };
        eprintln!(
            "dmaprof: {}: the {pass} iteration's buffer came in {got} physically contiguous runs, {against} in \
             {other}: running it again",
            workload.case.name()
        );
        for slot in attribution::iteration_slots(at) {
            p.discard_slot(slot).map_err(CaseError::Probes)?;
        }
        Ok(Some(LayoutRerun {
            pass,
            physical_runs: got,
            other_physical_runs: other,
        }))
    }

    /// Whether exact iteration `index` (its phases `walls`) outgrew the scout (see
    /// [`Demotion::outgrown`]); if so its slots are cleared and the newly demoted rows
    /// detached, ready for it to run again.
    fn outgrown(
        &self,
        p: &mut Probes,
        scout: &mut Scout<'_>,
        (index, walls): (u32, &[PhaseRun]),
        workload: &Workload,
        dma: Option<&mut DmaContext>,
        control: &Control,
    ) -> Result<Result<bool, WorkloadError>, CaseError> {
        let slots = attribution::iteration_slots(index);
        let seen = p.peek(slots.clone()).map_err(CaseError::Probes)?;
        let added = (scout.demotion).outgrown(&seen, walls, &p.attached_rows(), scout.cost, self.limits());
        if added.is_empty() {
            return Ok(Ok(false));
        }
        for (_, line) in crate::report::describe_demoted(&added) {
            eprintln!("dmaprof: {}: {line}", workload.case.name());
        }
        for slot in slots {
            p.discard_slot(slot).map_err(CaseError::Probes)?;
        }
        p.set_demoted(&scout.demotion.rows());
        control.enter(Stage::Switching(workload.case.name(), Pass::Exact));
        Ok(self
            .switch(p, Pass::Exact.groups(), workload, dma, control)?
            .map(|()| true))
    }

    /// The demotion limits: `--demote-above`, and the shortest phase whose time samples can
    /// split.
    fn limits(&self) -> (f64, u64) {
        let min_phase_ns = attribution::MIN_SPLIT_PERIODS * report::sampling_period_ns(self.opts.freq_hz);
        (self.opts.demote_above, min_phase_ns)
    }

    /// Runs the discarded warm-up: first touches of fresh (or freshly reserved) memory are
    /// many times slower and would make every first iteration an outlier. Returns its phases,
    /// for the scout to judge the rows against (run with the exact rows of the case before
    /// attached it took longer than untraced, which still bounds what the scout's phases less
    /// their probe cost can be).
    ///
    /// One warm-up, whatever the passes: a buffer is laid out like the one two iterations
    /// before it (see [`case_steps`]), so the untraced iterations' majority of five falls on the
    /// same layout only where as many iterations precede them modulo two. In every turn the
    /// first untraced iteration is the case's second, fourth or later even one.
    fn warm_up(
        &self,
        workload: &Workload,
        dma: Option<&mut DmaContext>,
        control: &Control,
    ) -> Result<Vec<PhaseRun>, WorkloadError> {
        let mut warm = SlotObserver::new(None, 0, control, &workload.case);
        self.settle(workload);
        self.timed(Spend::WarmUp, || {
            workload::run_iteration(workload, dma, &mut warm, control.cancel_flag())
        })
    }

    /// Runs the scout: one discarded iteration with every row attached. The rows whose hits
    /// would cost a syscall phase more than it can carry (judged against the scout's own time
    /// less the calibrated cost, and the `warm` warm-up's) are demoted for this case; the
    /// exact pass's probes stay attached.
    ///
    /// The scout runs on memory the warm-up has used and freed, as every later iteration does:
    /// on fresh memory the pages come physically contiguous and a 4 KiB buffer makes far fewer
    /// DMA chunks than it will.
    fn scout(
        &self,
        p: &mut Probes,
        s: &mut Scout<'_>,
        warm: &[PhaseRun],
        workload: &Workload,
        mut dma: Option<&mut DmaContext>,
        control: &Control,
    ) -> Result<Result<(), WorkloadError>, CaseError> {
        let case = &workload.case;
        control.enter(Stage::Switching(case.name(), Pass::Exact));
        p.set_demoted(&[]);
        let scout_groups = [Group::Rows, Group::Tracepoints, Group::Scout, Group::Switches];
        if let Err(e) = self.switch(p, &scout_groups, workload, dma.as_deref_mut(), control)? {
            p.set_groups(&[]).map_err(CaseError::Probes)?;
            return Ok(Err(e));
        }
        let mut obs = SlotObserver::new(Some(&mut *p), 0, control, case);
        self.settle(workload);
        let r = self.timed(Spend::WarmUp, || {
            workload::run_iteration(workload, dma.as_deref_mut(), &mut obs, control.cancel_flag())
        });
        if let Some(e) = obs.error.take() {
            return Err(CaseError::Probes(e));
        }
        // Only its own slots: a sampled pass that ran before it keeps its samples.
        let seen = p.peek(attribution::iteration_slots(0)).map_err(CaseError::Probes)?;
        for slot in attribution::iteration_slots(0) {
            p.discard_slot(slot).map_err(CaseError::Probes)?;
        }
        let walls = match r {
            Ok(w) => w,
            Err(e) => {
                p.set_groups(&[]).map_err(CaseError::Probes)?;
                return Ok(Err(e));
            }
        };
        *s.demotion = attribution::demotions(&seen, &walls, warm, &p.attached_rows(), s.cost, self.limits());
        for line in s.demotion.describe() {
            eprintln!("dmaprof: {}: {line}", case.name());
        }
        // Only the demoted rows come off. Re-attaching everything would patch the kernel
        // text again, which emulation pays for on the next run.
        p.set_demoted(&s.demotion.rows());
        self.switch(p, Pass::Exact.groups(), workload, dma, control)
    }

    /// Keeps `groups` attached and, where that attached or detached anything, runs one
    /// discarded iteration on the case's primer buffer ([`Workload::primer`]): under emulation
    /// the first run of patched kernel text, and of a program's JIT image, translates it again,
    /// a cost of the switch that would otherwise land in whichever measured iteration ran next.
    /// The probes record the primer into [`loader::PRIMER_SLOT`], then that is dropped: their
    /// recording paths run too.
    fn switch(
        &self,
        p: &mut Probes,
        groups: &[Group],
        workload: &Workload,
        dma: Option<&mut DmaContext>,
        control: &Control,
    ) -> Result<Result<(), WorkloadError>, CaseError> {
        let changed = self
            .timed(Spend::Switching, || p.set_groups(groups))
            .map_err(CaseError::Probes)?;
        let Some(primer) = workload.primer().filter(|_| changed && self.opts.prime) else {
            return Ok(Ok(()));
        };
        let mut obs = SlotObserver::new(Some(p), 0, control, &workload.case);
        obs.fixed_slot = Some(loader::PRIMER_SLOT);
        let r = self.timed(Spend::Priming, || {
            workload::run_iteration(&primer, dma, &mut obs, control.cancel_flag()).map(drop)
        });
        if let Some(e) = obs.error.take() {
            return Err(CaseError::Probes(e));
        }
        if let Some(p) = obs.probes {
            p.discard_slot(loader::PRIMER_SLOT).map_err(CaseError::Probes)?;
        }
        Ok(r)
    }

    /// Pauses for `--settle` before an iteration of a base-page case (see
    /// [`crate::plan::RunOptions::settle`]). The pages a buffer gets depend on how long ago the
    /// last one was freed: back to back, a 4 KiB memfd buffer came in about 500 or in
    /// 24000-32000 physically contiguous runs by chance, after any pause of 20 ms or more in the
    /// first. Every iteration waits the same, so the untraced, exact and sampled ones, and the
    /// iterations after a probe switch (a long pause of its own), time the same layout.
    /// Hugetlb buffers come from their pool, which keeps no such state.
    fn settle(&self, workload: &Workload) {
        if workload.case.backing.hugetlb_kb().is_none() && !self.opts.settle.is_zero() {
            self.timed(Spend::Settling, || std::thread::sleep(self.opts.settle));
        }
    }

    /// Runs `f`, adding what it took to `what`.
    fn timed<T>(&self, what: Spend, f: impl FnOnce() -> T) -> T {
        let started = Instant::now();
        let r = f();
        self.spent.borrow_mut().add(what, started.elapsed());
        r
    }

    /// Which slot-iteration a traced pass's `index`-th iteration records into (the exact pass
    /// first, then the sampled one); None for the untraced pass.
    fn slot_iteration(&self, pass: Pass, index: u32) -> Option<u32> {
        match pass {
            Pass::Untraced => None,
            Pass::Exact => Some(index),
            Pass::Sampled => Some(self.opts.traced_iterations + index),
        }
    }

    /// The case's name in this run: with several sizes, the size is part of it.
    fn label(&self, case: &Case, size: ByteSize) -> String {
        match self.opts.sizes.len() {
            1 => case.name(),
            _ => format!("{}@{}", case.name(), size.short()),
        }
    }

    fn dma_context(&self, case: &Case, size: ByteSize) -> Result<Option<DmaContext>, CaseError> {
        let Some(mode) = case.mode else { return Ok(None) };
        let Some(dev) = self.device.as_ref() else {
            return Err(CaseError::Skip("needs a VFIO device".into()));
        };
        if let Some(why) = self.device_gone.borrow().as_ref() {
            return Err(CaseError::Skip(why.clone()));
        }
        let driver = crate::device::driver_of(&dev.bdf);
        if driver.as_deref() != Some("vfio-pci") {
            let now = driver.map_or("no driver".to_owned(), |d| format!("driver {d}"));
            return Err(CaseError::Skip(format!(
                "device {} is no longer bound to vfio-pci ({now}): it was unbound or removed during the run",
                dev.bdf
            )));
        }
        let (memfd, page) = (case.backing.memfd(), case.backing.page_size());
        let mut ctx = DmaContext::open(mode, dev, memfd, size, page).map_err(|e| CaseError::Fail(e.to_string()))?;
        if self.opts.fail_map_allocs {
            ctx.inject_faults().map_err(|e| CaseError::Fail(e.to_string()))?;
        }
        Ok(Some(ctx))
    }
}

/// A case that did not run, said on stderr and in the report; the run goes on (false).
fn skip(report: &mut Report, name: String, reason: String) -> bool {
    eprintln!("dmaprof: skipping {name}: {reason}");
    report.skipped.push(Skipped { name, reason });
    false
}

/// What grew in the locked/pinned counters since `before`, each said on stderr.
fn leaks_of(before: &Held, name: &str) -> Vec<report::Leak> {
    let leaks = before.leaks(&Held::now(), name);
    for l in &leaks {
        eprintln!(
            "dmaprof: {name} left {} at {} (was {} before the case): the kernel did not give it all back",
            l.counter, l.after, l.before
        );
    }
    leaks
}

/// The scout of a case's exact pass and what it decided: the rows it demoted (an exact
/// iteration that outgrew it adds to them) and the calibrated cost per hit.
struct Scout<'a> {
    demotion: &'a mut Demotion,
    cost: &'a ProbeCost,
    /// The warm-up's phases, until the scout has run.
    pending: Option<Vec<PhaseRun>>,
}

/// Where a case's exact pass goes. Attaching or detaching the rows patches the kernel once per
/// row, about 30 ms each under emulation, so cases take turns: one ends with its exact pass
/// and leaves the rows attached, the next starts with its own. Each case then attaches or
/// detaches them once instead of both (but for a sampled iteration that must run again after
/// the exact pass: [`Session::match_after_exact`] takes the rows off for it).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Turn {
    /// The rows are attached (from the case before): the exact pass comes first.
    ExactFirst,
    /// The exact pass comes last and leaves the rows attached.
    ExactLast,
    /// No scout, no exact pass with rows to keep (or no calibrated cost).
    Unscouted,
}

/// The order of a case's iterations ([`schedule`]): in `turn` [`Turn::ExactFirst`] the
/// rotation starts with the exact pass and ends with the sampled one, in [`Turn::ExactLast`]
/// it runs backwards from the exact pass and the sampled one after it.
///
/// Either way the first sampled iteration runs two iterations from the first exact one (an
/// untraced iteration or the scout between them). A buffer's pages come back from the
/// allocator's free lists in the reverse order of their freeing, so one iteration's buffer is
/// laid out like the one two before it and not like the one before: 2 MiB hugetlb buffers
/// alternate strictly (48 and 125 physically contiguous runs by turns), and the two traced
/// passes then time the same layout.
fn case_steps(passes: &[Pass], (untraced, traced): (u32, u32), turn: Turn) -> Vec<(Pass, u32)> {
    let mut order = passes.to_vec();
    if let Some(at) = order
        .iter()
        .position(|p| *p == Pass::Exact)
        .filter(|_| turn != Turn::Unscouted)
    {
        order.rotate_left(at);
    }
    if turn == Turn::ExactFirst
        && let Some(at) = order.iter().position(|p| *p == Pass::Sampled)
    {
        let sampled = order.remove(at);
        order.push(sampled);
    }
    let steps = schedule(&order, untraced, traced);
    if turn != Turn::ExactLast {
        return steps;
    }
    // Backwards, each pass's iterations still counted up from 0.
    let mut next: Vec<(Pass, u32)> = Vec::new();
    let mut count = |pass: Pass| match next.iter_mut().find(|(p, _)| *p == pass) {
        Some((_, n)) => std::mem::replace(n, *n + 1),
        None => {
            next.push((pass, 1));
            0
        }
    };
    steps.iter().rev().map(|&(pass, _)| (pass, count(pass))).collect()
}

/// The probes of a traced run and what they measure.
struct Tracing<'a> {
    probes: Option<&'a mut Probes>,
    symbols: Option<&'a KernelSymbols>,
    coverage: &'a Coverage,
}

/// Routes each phase of each iteration to its own slot in the BPF maps.
struct SlotObserver<'a> {
    probes: Option<&'a mut Probes>,
    iteration: u32,
    /// Records every phase into this slot instead (a primer's).
    fixed_slot: Option<u32>,
    control: &'a Control,
    case: String,
    error: Option<AttachError>,
}

impl<'a> SlotObserver<'a> {
    fn new(probes: Option<&'a mut Probes>, iteration: u32, control: &'a Control, case: &Case) -> Self {
        Self {
            probes,
            iteration,
            fixed_slot: None,
            control,
            case: case.name(),
            error: None,
        }
    }
}

impl PhaseObserver for SlotObserver<'_> {
    fn begin(&mut self, phase: Phase) {
        self.control.enter(Stage::Phase(self.case.clone(), phase));
        let slot = self
            .fixed_slot
            .unwrap_or_else(|| attribution::slot(self.iteration, phase));
        if let Some(Err(e)) = self.probes.as_mut().map(|p| p.set_phase(slot)) {
            self.error.get_or_insert(e);
        }
    }

    fn end(&mut self, _phase: Phase) {
        if let Some(Err(e)) = self.probes.as_mut().map(|p| p.set_phase(0)) {
            self.error.get_or_insert(e);
        }
        self.control.leave();
    }
}

/// Whether any pass attaches probes.
fn traced(passes: &[Pass]) -> bool {
    passes.iter().any(|p| *p != Pass::Untraced)
}

/// The iterations of one case that ran, by pass, and what stopped the rest.
struct CaseRuns {
    steps: Steps,
    /// The rows its exact pass ran without.
    demotion: Demotion,
}

/// Times a traced iteration may run again for its layout ([`Session::far_layout`]): each
/// costs one iteration. Even after the settle pause ([`Session::settle`]) the first full
/// iteration after a probe switch often comes in another layout (the sampled one in 10 of 12
/// 256 MiB 4 KiB memfd cases); a rerun, on the same probes, came near in all 10.
const MAX_LAYOUT_RERUNS: usize = 2;

/// An iteration's phases, and the layout reruns it took.
type Ran = (Vec<PhaseRun>, Vec<LayoutRerun>);

/// One iteration to run: its pass and index, the physical runs its buffer is to come near
/// ([`Steps::near`]), and how often it may run again for that.
#[derive(Clone, Copy)]
struct Step {
    pass: Pass,
    index: u32,
    near: Option<u64>,
    reruns: usize,
}

/// The iterations of a case's passes that ran ([`Session::run_steps`]).
#[derive(Default)]
struct Steps {
    runs: PassRuns,
    /// The machine's pace before each untraced iteration ([`Pace`]).
    pace: Vec<u64>,
    /// Sampled iterations run again for their layout.
    layout_reruns: Vec<LayoutRerun>,
    /// The slot iterations of sampled iterations that ran with no exact one to come near.
    unmatched: Vec<u32>,
    /// The slot iterations of exact iterations that ran with no untraced one to come near.
    unheld: Vec<u32>,
    /// What stopped them.
    failure: Option<WorkloadError>,
}

impl Steps {
    fn failed(mut self, e: WorkloadError) -> Self {
        self.failure = Some(e);
        self
    }

    /// The phases of `pass`'s iteration in slot iteration `at`, if it ran.
    fn ran(&self, pass: Pass, at: u32) -> Option<Vec<PhaseRun>> {
        let runs = self.runs.get(&pass)?;
        runs.iter().find(|(a, _)| *a == at).map(|(_, w)| w.clone())
    }

    /// Puts `walls` in place of `pass`'s iteration in slot iteration `at` (run again).
    fn replace(&mut self, pass: Pass, at: u32, walls: Vec<PhaseRun>) {
        let runs = self.runs.entry(pass).or_default();
        if let Some(slot) = runs.iter_mut().find(|(a, _)| *a == at) {
            slot.1 = walls;
        }
    }

    /// The layout an iteration of `pass` is to come near: for the sampled pass, the physical
    /// runs of the last exact iteration so far (the two traced passes split like work); for
    /// the exact pass, the median of the untraced iterations' so far (the breakdown is of the
    /// work the headline times). None before there is one.
    fn near(&self, pass: Pass) -> Option<u64> {
        let layouts = |from: Pass| -> Vec<u64> {
            let runs = self.runs.get(&from).map_or(&[][..], Vec::as_slice);
            runs.iter().filter_map(|(_, r)| r.first()?.physical_runs).collect()
        };
        match pass {
            Pass::Untraced => None,
            Pass::Exact => {
                let mut all = layouts(Pass::Untraced);
                all.sort_unstable();
                all.get(all.len() / 2).copied()
            }
            Pass::Sampled => layouts(Pass::Exact).last().copied(),
        }
    }
}

/// The order a case's iterations run in: round by round, each round every pass that still has
/// iterations to run, starting one pass later each round, so that drift over the case (caches,
/// fragmentation, the host) reaches every pass alike.
pub fn schedule(passes: &[Pass], untraced: u32, traced: u32) -> Vec<(Pass, u32)> {
    let count = |p: Pass| if p == Pass::Untraced { untraced } else { traced };
    let rounds = passes.iter().map(|p| count(*p)).max().unwrap_or(0);
    let mut out = Vec::new();
    for round in 0..rounds {
        for i in 0..passes.len() {
            let pass = passes[(i + round as usize) % passes.len()];
            if round < count(pass) {
                out.push((pass, round));
            }
        }
    }
    out
}

/// How a finished run ends: as kselftest does (0 pass, 1 a case failed, 4 every case skipped),
/// or 128+N when stopped by signal N (130 Ctrl-C, 143 SIGTERM, 129 SIGHUP).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Outcome {
    /// Every selected case ran and passed (some may have been skipped).
    Passed,
    /// A case ran and failed.
    Failed,
    /// Nothing ran, and that is not a pass (kselftest's KSFT_SKIP).
    AllSkipped {
        /// How many cases were skipped.
        count: usize,
        /// Why the first one was.
        first_reason: String,
    },
    /// Stopped by this signal.
    Stopped(i32),
}

impl Outcome {
    /// The outcome of `report`, written after stop signal `signal` (0: none).
    pub fn of(report: &Report, signal: i32) -> Self {
        if signal != 0 {
            return Self::Stopped(signal);
        }
        match (
            report.cases.is_empty() && report.failed.is_empty(),
            report.skipped.first(),
        ) {
            (true, Some(first)) => Self::AllSkipped {
                count: report.skipped.len(),
                first_reason: first.reason.clone(),
            },
            _ if report.failed.is_empty() && report.leaks.iter().all(|l| l.system_wide) => Self::Passed,
            _ => Self::Failed,
        }
    }

    /// The process exit code.
    pub fn exit_code(&self) -> u8 {
        match self {
            Self::Passed => 0,
            Self::Failed => 1,
            Self::AllSkipped { .. } => 4,
            Self::Stopped(sig) => (128 + sig) as u8,
        }
    }

    /// The line stderr gets, when the code alone does not say it.
    pub fn note(&self) -> Option<String> {
        match self {
            Self::AllSkipped { count, first_reason } => Some(format!(
                "every selected case was skipped ({count}); the first because {first_reason}"
            )),
            _ => None,
        }
    }
}

/// Why a case did not run at all.
enum CaseError {
    /// This host cannot run it (e.g. no hugepages): skipped with the reason.
    Skip(String),
    /// Setting it up failed (e.g. the DMA context): a failure.
    Fail(String),
    /// The probes broke: the whole run stops.
    Probes(AttachError),
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn passes_interleave_and_rotate() {
        use Pass::{Exact as E, Sampled as S, Untraced as U};
        assert_eq!(
            schedule(&[U, E, S], 3, 2),
            [(U, 0), (E, 0), (S, 0), (E, 1), (S, 1), (U, 1), (U, 2)]
        );
        assert_eq!(schedule(&[U], 2, 9), [(U, 0), (U, 1)]);
        assert_eq!(schedule(&[E, S], 5, 1), [(E, 0), (S, 0)]);
        assert!(schedule(&[], 3, 3).is_empty());
    }

    #[test]
    fn cases_take_turns_at_keeping_the_rows() {
        use Pass::{Exact as E, Sampled as S, Untraced as U};
        let passes = [U, E, S];
        let first = case_steps(&passes, (3, 2), Turn::ExactFirst);
        assert_eq!(first, [(E, 0), (U, 0), (S, 0), (U, 1), (S, 1), (E, 1), (U, 2)]);
        // The default: an untraced iteration between the exact and the sampled one.
        let first = case_steps(&passes, (5, 1), Turn::ExactFirst);
        assert_eq!(first[..3], [(E, 0), (U, 0), (S, 0)]);
        // Backwards, the scout comes between the sampled iteration and the exact one.
        let last = case_steps(&passes, (5, 1), Turn::ExactLast);
        assert_eq!(last[4..], [(U, 4), (S, 0), (E, 0)]);
        let last = case_steps(&passes, (3, 2), Turn::ExactLast);
        assert_eq!(last, [(U, 0), (E, 0), (U, 1), (S, 0), (U, 2), (S, 1), (E, 1)]);
        assert_eq!(
            case_steps(&passes, (2, 1), Turn::Unscouted),
            [(U, 0), (E, 0), (S, 0), (U, 1)]
        );
    }

    #[test]
    fn the_exact_pass_is_held_against_the_untraced_median_and_the_sampled_against_the_exact() {
        let ran = |runs: u64| {
            vec![PhaseRun {
                phase: Phase::Mmap,
                wall_ns: 1,
                cpu_ns: 1,
                minor_faults: 0,
                major_faults: 0,
                context_switches: 0,
                physical_runs: Some(runs),
            }]
        };
        let mut steps = Steps::default();
        assert_eq!(steps.near(Pass::Exact), None);
        assert_eq!(steps.near(Pass::Sampled), None);
        // The layouts a 256 MiB memfd case's untraced iterations came in, one after a switch.
        let untraced = steps.runs.entry(Pass::Untraced).or_default();
        for (i, runs) in [4538, 21369, 400, 427, 400].into_iter().enumerate() {
            untraced.push((i as u32, ran(runs)));
        }
        assert_eq!(steps.near(Pass::Exact), Some(427));
        assert_eq!(steps.near(Pass::Sampled), None);
        steps.runs.entry(Pass::Exact).or_default().push((0, ran(693)));
        assert_eq!(steps.near(Pass::Sampled), Some(693));
        assert_eq!(steps.near(Pass::Untraced), None);
    }

    #[test]
    fn outcomes_map_to_kselftest_codes() {
        let mut r = report::parse(include_str!("../tests/data/matrix-7.3.json")).unwrap();
        assert_eq!(Outcome::of(&r, 0), Outcome::Passed);
        assert_eq!(Outcome::of(&r, libc::SIGINT).exit_code(), 130);
        assert_eq!(Outcome::of(&r, libc::SIGTERM).exit_code(), 143);
        let skip = Skipped {
            name: "x".into(),
            reason: "no device".into(),
        };
        r.skipped = vec![skip];
        assert_eq!(Outcome::of(&r, 0), Outcome::Passed, "some ran: skips do not matter");
        r.failed.push(Failed {
            name: "y".into(),
            error: "EFAULT".into(),
            left_mapped_bytes: None,
        });
        assert_eq!(Outcome::of(&r, 0).exit_code(), 1);
        r.failed.clear();
        r.cases.clear();
        let all = Outcome::of(&r, 0);
        assert_eq!(all.exit_code(), 4);
        assert!(all.note().unwrap().ends_with("(1); the first because no device"));
        assert_eq!(Outcome::of(&r, libc::SIGHUP).exit_code(), 129, "a signal wins");
    }
}
