//! The `dmaprof` command line. Exit codes: 0 success, 1 failure, 2 bad usage,
//! 128+N when stopped by signal N (130 for Ctrl-C, 143 for SIGTERM, 129 for SIGHUP).
use std::{
    path::PathBuf,
    process::ExitCode,
    sync::{
        Arc,
        atomic::{AtomicBool, AtomicI32, Ordering},
    },
    time::Duration,
};

use anyhow::Context as _;
use clap::{Parser, Subcommand};
use profiler::{
    capabilities,
    device::Device,
    hugepages,
    matrix::{self, Prefault},
    report,
    run::{self, Progress, RunError, RunOptions},
    size::parse_size,
};

#[derive(Parser)]
#[command(name = "dmaprof", version, about = "Tells a kernel developer why a DMA map is slow")]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Find out, by trying, what this host can trace and map.
    Doctor {
        /// Print JSON instead of the table.
        #[arg(long)]
        json: bool,
        /// Only check that no dmaprof programs, BPF links, kprobe events or processes remain
        /// (exit 1 if any do).
        #[arg(long)]
        leftovers: bool,
    },
    /// List the case matrix (what -v globs match).
    List,
    /// Run the workload matrix under the probes and report where the time went.
    Run(RunArgs),
    /// Re-render a saved report.json as tables (or JSON).
    Report {
        /// The report.json of a run.
        report: PathBuf,
        /// Print JSON instead of the tables.
        #[arg(long)]
        json: bool,
    },
    /// Compare two runs case by case and phase by phase, with differential flamegraphs.
    Diff {
        /// report.json of the first run (before).
        before: PathBuf,
        /// report.json of the second run (after).
        after: PathBuf,
        /// Where the differential flamegraphs go (default: dmaprof-out/diff-<timestamp>).
        #[arg(short = 'o', long = "out")]
        out: Option<PathBuf>,
        /// Print the comparison as JSON.
        #[arg(long)]
        json: bool,
    },
}

#[derive(clap::Args)]
struct RunArgs {
    /// Buffer size per case: bytes or with a K/M/G/T suffix.
    #[arg(short = 'b', long = "size", default_value = "1G", value_parser = size_arg, allow_hyphen_values = true)]
    size: u64,
    /// Select cases by shell glob on `<mode>_<backing>.<prefault>` (or on `<mode>_<backing>`
    /// when the pattern has no dot). Repeatable.
    #[arg(short = 'v', long = "variant", value_name = "GLOB")]
    variants: Vec<String>,
    /// Prefault strategies to run.
    #[arg(long, value_delimiter = ',', default_value = "none,populate,touch")]
    prefault: Vec<Prefault>,
    /// Traced iterations per case.
    #[arg(short = 'n', long, default_value_t = 3, value_parser = clap::value_parser!(u32).range(1..=run::MAX_ITERATIONS as i64))]
    iterations: u32,
    /// Stack sampling frequency in Hz.
    #[arg(long = "freq", default_value_t = 4999, value_parser = clap::value_parser!(u64).range(1..=100_000))]
    freq_hz: u64,
    /// Output directory (default: dmaprof-out/<timestamp>).
    #[arg(short = 'o', long = "out")]
    out: Option<PathBuf>,
    /// Print report.json on stdout instead of the tables.
    #[arg(long)]
    json: bool,
    /// PCI device (BDF) to DMA-map for; default $VFIO_SELFTESTS_BDF, as in the kernel selftests.
    #[arg(short = 'd', long, env = "VFIO_SELFTESTS_BDF")]
    device: Option<String>,
    /// Bind the device to vfio-pci for the run if another driver has it (restored afterwards).
    #[arg(long)]
    bind: bool,
    /// Load no probes: every iteration untraced (wall times only).
    #[arg(long)]
    no_trace: bool,
    /// Probe mechanisms to attach (what each costs: `cargo xtask bench`).
    #[arg(
        long = "probes",
        value_delimiter = ',',
        default_value = "samples,tracepoints,fentry,kprobes"
    )]
    mechanisms: Vec<profiler::probes::Mechanism>,
    /// Testing: entries of the sampled-stack map (a tiny map forces lost samples).
    #[arg(long, hide = true)]
    sample_map_entries: Option<u32>,
}

fn size_arg(s: &str) -> Result<u64, String> {
    parse_size(s).map_err(|e| e.to_string())
}

/// Prints to stdout; a closed pipe (`dmaprof ... | head`) ends the output quietly instead of
/// panicking.
fn out(text: &str) {
    use std::io::Write as _;
    let mut stdout = std::io::stdout().lock();
    if stdout.write_all(text.as_bytes()).and_then(|()| stdout.flush()).is_err() {
        std::process::exit(0);
    }
}

/// When main() began: the start of dmaprof's start-up time.
static STARTED: std::sync::OnceLock<std::time::Instant> = std::sync::OnceLock::new();

fn main() -> ExitCode {
    STARTED.get_or_init(std::time::Instant::now);
    let cli = match Cli::try_parse() {
        Ok(c) => c,
        Err(e) => {
            if !e.use_stderr() {
                let _ = e.print();
                return ExitCode::SUCCESS;
            }
            // One line, not clap's multi-line block: the first line names the problem.
            let text = e.render().to_string();
            eprintln!(
                "dmaprof: {}",
                text.lines().next().unwrap_or("bad usage").trim_start_matches("error: ")
            );
            return ExitCode::from(2);
        }
    };
    match cli.command {
        Command::Doctor { json, leftovers: true } => {
            let l = capabilities::leftovers();
            if json {
                out(&(serde_json::to_string_pretty(&l).expect("leftovers serialise") + "\n"));
            } else {
                out(&capabilities::render_leftovers(&l));
            }
            if l.is_empty() {
                ExitCode::SUCCESS
            } else {
                ExitCode::from(1)
            }
        }
        Command::Doctor { json, leftovers: false } => {
            let d = capabilities::probe_host();
            if json {
                out(&(serde_json::to_string_pretty(&d).expect("doctor output serialises") + "\n"));
            } else {
                out(&capabilities::render(&d));
            }
            ExitCode::SUCCESS
        }
        Command::List => {
            out(&matrix::all_cases().iter().map(|c| c.name() + "\n").collect::<String>());
            ExitCode::SUCCESS
        }
        Command::Report { report, json } => match report::read(&report) {
            Ok(r) => {
                if json {
                    out(&(serde_json::to_string_pretty(&r).expect("reports serialise") + "\n"));
                } else {
                    out(&report::render_table(&r));
                }
                ExitCode::SUCCESS
            }
            Err(e) => {
                eprintln!("dmaprof: {e}");
                ExitCode::from(2)
            }
        },
        Command::Diff {
            before,
            after,
            out: dir,
            json,
        } => match diff_command(&before, &after, dir, json) {
            Ok(()) => ExitCode::SUCCESS,
            Err(e) => {
                eprintln!("dmaprof: {e:#}");
                ExitCode::from(2)
            }
        },
        Command::Run(args) => match run_command(args) {
            Ok(code) => code,
            Err(e) => {
                let usage = e.downcast_ref::<RunError>().is_some_and(RunError::is_usage);
                eprintln!("dmaprof: {e:#}");
                ExitCode::from(if usage { 2 } else { 1 })
            }
        },
    }
}

/// Directories made for `--out`, removed again when the run ends if they are still empty: a run
/// that fails before writing anything leaves nothing behind.
struct CreatedDirs(Vec<PathBuf>);

impl Drop for CreatedDirs {
    fn drop(&mut self) {
        for d in &self.0 {
            let _ = std::fs::remove_dir(d);
        }
    }
}

/// Seconds since the epoch as `YYYYMMDD-HHMMSS` (UTC).
fn timestamp() -> String {
    let secs = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs());
    let (days, rem) = (secs / 86400, secs % 86400);
    // Civil-from-days (H. Hinnant), valid for the Gregorian calendar.
    let z = days as i64 + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = doy - (153 * mp + 2) / 5 + 1;
    let m = if mp < 10 { mp + 3 } else { mp - 9 };
    let y = yoe + era * 400 + i64::from(m <= 2);
    format!(
        "{y:04}{m:02}{d:02}-{:02}{:02}{:02}",
        rem / 3600,
        rem % 3600 / 60,
        rem % 60
    )
}

/// `dmaprof diff`: the comparison on stdout, differential flamegraphs in `dir`.
fn diff_command(
    before: &std::path::Path,
    after: &std::path::Path,
    dir: Option<PathBuf>,
    json: bool,
) -> anyhow::Result<()> {
    let a = report::read(before)?;
    let b = report::read(after)?;
    let d = report::diff(&a, &b);
    let dir = dir.unwrap_or_else(|| PathBuf::from("dmaprof-out").join(format!("diff-{}", timestamp())));
    let base = |p: &std::path::Path| p.parent().map(std::path::Path::to_path_buf).unwrap_or_default();
    let (base_a, base_b) = (base(before), base(after));
    let mut written = 0;
    for p in &d.phases {
        let find = |r: &report::Report, base: &std::path::Path| {
            r.cases
                .iter()
                .find(|c| c.name == p.case)
                .and_then(|c| c.phases.iter().find(|x| x.name == p.phase))
                .and_then(|x| std::fs::read_to_string(base.join(&x.folded)).ok())
                .and_then(|t| profiler::flamegraph::Folded::parse(&t).ok())
        };
        // A run whose folded files are gone still diffs; it just has no flamegraphs.
        if let (Some(fa), Some(fb)) = (find(&a, &base_a), find(&b, &base_b)) {
            let case_dir = dir.join(&p.case);
            std::fs::create_dir_all(&case_dir).with_context(|| format!("creating {}", case_dir.display()))?;
            profiler::flamegraph::write_differential(
                &fa,
                &fb,
                &case_dir,
                &p.phase,
                &format!("{} {}: before -> after", p.case, p.phase),
            )
            .with_context(|| format!("writing the differential flamegraph for {} {}", p.case, p.phase))?;
            written += 1;
        }
    }
    if json {
        out(&(serde_json::to_string_pretty(&d)? + "\n"));
    } else {
        out(&report::render_diff(&d));
        out(&format!("\n{written} differential flamegraphs in {}\n", dir.display()));
    }
    Ok(())
}

fn run_command(args: RunArgs) -> anyhow::Result<ExitCode> {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .context("starting the runtime")?;
    let signals = {
        let _ctx = rt.enter();
        StopSignals::register()
    };
    let opts = RunOptions {
        size: args.size,
        variants: args.variants,
        prefaults: args.prefault,
        iterations: args.iterations,
        freq_hz: args.freq_hz,
        out: args
            .out
            .unwrap_or_else(|| PathBuf::from("dmaprof-out").join(timestamp())),
        device: args.device,
        bind: args.bind,
        no_trace: args.no_trace,
        sample_map_entries: args.sample_map_entries,
        mechanisms: args.mechanisms,
        started: *STARTED.get_or_init(std::time::Instant::now),
    };
    if opts.out.exists() && !opts.out.is_dir() {
        return Err(RunError::Usage(format!("--out {} exists and is not a directory", opts.out.display())).into());
    }
    // Leaf first, so dropping removes children before parents.
    let _created = CreatedDirs(
        opts.out
            .ancestors()
            .take_while(|a| !a.exists() && !a.as_os_str().is_empty())
            .map(Into::into)
            .collect(),
    );
    let missing = capabilities::missing_caps();
    if !missing.is_empty() {
        return Err(RunError::Usage(format!(
            "dmaprof run needs {} (missing {}): run it as root",
            capabilities::NEEDED_CAPS
                .iter()
                .map(|(_, n)| *n)
                .collect::<Vec<_>>()
                .join(", "),
            missing.join(", ")
        ))
        .into());
    }
    // Find an unwritable --out before anything runs (and leave no directory behind on error).
    if let Err(e) = std::fs::create_dir_all(&opts.out) {
        return Err(RunError::Usage(format!(
            "cannot create --out {}: {e}: choose a writable directory",
            opts.out.display()
        ))
        .into());
    }
    let doctor = capabilities::probe_for_run();
    let plan = run::plan(&opts, &doctor)?;
    let _lock = run::lock_instance()?;
    let device = match &opts.device {
        Some(bdf) if plan.run.iter().any(|c| c.mode != matrix::IommuMode::None) => {
            Some(Device::open(bdf, opts.bind).map_err(RunError::from)?)
        }
        Some(bdf) => {
            profiler::device::parse_bdf(bdf).map_err(RunError::from)?;
            None
        }
        None => None,
    };
    eprintln!(
        "dmaprof: {} case(s) to run, {} skipped; output in {}",
        plan.run.len(),
        plan.skipped.len(),
        opts.out.display()
    );
    let mut reasons: Vec<(&str, usize)> = Vec::new();
    for s in &plan.skipped {
        match reasons.iter_mut().find(|(r, _)| *r == s.reason) {
            Some((_, n)) => *n += 1,
            None => reasons.push((&s.reason, 1)),
        }
    }
    for (reason, n) in reasons {
        eprintln!("dmaprof:   skipping {n} case(s): {reason}");
    }

    let cancel = Arc::new(AtomicBool::new(false));
    let signal = Arc::new(AtomicI32::new(0));
    let progress = Arc::new(Progress::default());
    let worker = {
        let (cancel, progress, opts) = (cancel.clone(), progress.clone(), opts.clone());
        std::thread::Builder::new()
            .name("dmaprof-workload".into())
            .spawn(move || run::execute(&opts, plan, &doctor, device.as_ref(), &cancel, &progress))
            .context("starting the workload thread")?
    };
    rt.block_on(supervise(&worker, signals, &cancel, &signal, &progress));
    let report = worker
        .join()
        .map_err(|_| anyhow::anyhow!("the workload thread panicked"))??;
    if args.json {
        out(&(serde_json::to_string_pretty(&report)? + "\n"));
    } else {
        out(&report::render_table(&report));
        out(&format!("\nreport: {}\n", opts.out.join("report.json").display()));
    }
    match signal.load(Ordering::Relaxed) {
        0 if report.failed.is_empty() => Ok(ExitCode::SUCCESS),
        0 => Ok(ExitCode::FAILURE),
        sig => Ok(ExitCode::from(128 + sig as u8)),
    }
}

/// Waits for the workload thread while handling stop signals and printing progress.
/// The stop signals dmaprof handles, registered before it changes anything so that a signal
/// at any moment is queued for [`supervise`] instead of killing the process.
struct StopSignals {
    int: Option<tokio::signal::unix::Signal>,
    term: Option<tokio::signal::unix::Signal>,
    hup: Option<tokio::signal::unix::Signal>,
}

impl StopSignals {
    /// Registers SIGINT, SIGTERM and SIGHUP (must run inside the runtime's context).
    fn register() -> Self {
        use tokio::signal::unix::{SignalKind, signal};
        Self {
            int: signal(SignalKind::interrupt()).ok(),
            term: signal(SignalKind::terminate()).ok(),
            hup: signal(SignalKind::hangup()).ok(),
        }
    }
}

async fn supervise(
    worker: &std::thread::JoinHandle<Result<report::Report, RunError>>,
    signals: StopSignals,
    cancel: &AtomicBool,
    signal: &AtomicI32,
    progress: &Progress,
) {
    let StopSignals {
        int: mut sigint,
        term: mut sigterm,
        hup: mut sighup,
    } = signals;
    let mut tick = tokio::time::interval(Duration::from_millis(250));
    let mut last_note = std::time::Instant::now();
    async fn recv(s: &mut Option<tokio::signal::unix::Signal>) {
        match s {
            Some(s) => {
                s.recv().await;
            }
            None => std::future::pending::<()>().await,
        }
    }
    while !worker.is_finished() {
        let sig = tokio::select! {
            _ = recv(&mut sigint) => libc::SIGINT,
            _ = recv(&mut sigterm) => libc::SIGTERM,
            _ = recv(&mut sighup) => libc::SIGHUP,
            _ = tick.tick() => {
                if let Some((what, since)) = progress.current() {
                    let secs = since.elapsed().as_secs();
                    if secs >= 1 && last_note.elapsed() >= Duration::from_secs(1) {
                        eprintln!("dmaprof:   ... {what}: {secs} s");
                        last_note = std::time::Instant::now();
                    }
                }
                continue;
            }
        };
        if signal.swap(sig, Ordering::Relaxed) != 0 {
            // A second signal: don't wait for the phase to end. BPF links and fds close with
            // the process; hugepage pools must be put back by hand.
            eprintln!("dmaprof: second signal, exiting now");
            hugepages::restore_all();
            profiler::device::restore_all();
            std::process::exit(128 + sig);
        }
        let during = progress
            .current()
            .map_or_else(|| "between phases".to_owned(), |(what, _)| what);
        eprintln!("dmaprof: signal {sig} during {during}: stopping after it and cleaning up (again to force)");
        cancel.store(true, Ordering::Relaxed);
    }
}
