//! The `dmaprof` command line. Exit codes: 0 success, 1 failure, 2 bad usage,
//! 128+N when stopped by signal N (130 for Ctrl-C, 143 for SIGTERM, 129 for SIGHUP).
use std::{path::Path, process::ExitCode, sync::OnceLock, time::Instant};

use anyhow::Context as _;
use clap::Parser as _;
use profiler::{
    bpflog,
    cli::{Cli, Command, Format, RunArgs},
    diff, doctor, explain, export, leftovers, matrix, report,
    session::{RunError, Session},
    stop::{self, Control, StopSignals},
    sys, table,
    workload::Phase,
};

/// When main() began: the start of dmaprof's start-up time.
static STARTED: OnceLock<Instant> = OnceLock::new();

/// Prints to stdout; a closed pipe (`dmaprof ... | head`) ends the output quietly.
fn out(text: &str) {
    use std::io::Write as _;
    let mut stdout = std::io::stdout().lock();
    if stdout.write_all(text.as_bytes()).and_then(|()| stdout.flush()).is_err() {
        std::process::exit(0);
    }
}

fn json(v: &impl serde::Serialize) -> String {
    serde_json::to_string_pretty(v).expect("dmaprof's types serialise") + "\n"
}

/// `report` in the format asked for; the table ends with where the report is (`path`).
fn render(report: &report::Report, format: Format, path: Option<&Path>) -> String {
    match format {
        Format::Table => {
            let at = path.map_or(String::new(), |p| format!("\nreport: {}\n", p.display()));
            table::render_table(report) + &at
        }
        Format::Json => json(report),
        Format::Ktap => export::ktap(report),
        Format::Csv => export::csv(report),
    }
}

fn main() -> ExitCode {
    STARTED.get_or_init(Instant::now);
    let cli = match Cli::try_parse() {
        Ok(c) => c,
        Err(e) if !e.use_stderr() => {
            let _ = e.print();
            return ExitCode::SUCCESS;
        }
        Err(e) => {
            // clap's whole message: what is wrong, the allowed values, the usage line.
            let _ = e.print();
            return ExitCode::from(2);
        }
    };
    let result = match cli.command {
        Command::Doctor {
            json: as_json,
            leftovers: true,
        } => {
            let l = leftovers::leftovers();
            out(&if as_json {
                json(&l)
            } else {
                leftovers::render_leftovers(&l)
            });
            return if l.is_empty() {
                ExitCode::SUCCESS
            } else {
                ExitCode::from(1)
            };
        }
        Command::Doctor {
            json: as_json,
            leftovers: false,
        } => {
            let d = doctor::probe_host();
            out(&if as_json { json(&d) } else { doctor::render(&d) });
            Ok(ExitCode::SUCCESS)
        }
        Command::List => {
            out(&matrix::all_cases().iter().map(|c| c.name() + "\n").collect::<String>());
            Ok(ExitCode::SUCCESS)
        }
        Command::Report {
            report: path,
            json: as_json,
            ktap,
            csv,
        } => report::read(&path).map_err(Into::into).map(|r| {
            out(&render(&r, Format::of(as_json, ktap, csv), None));
            ExitCode::SUCCESS
        }),
        Command::Explain {
            report: path,
            json: as_json,
        } => report::read(&path).map_err(Into::into).map(|r| {
            let e = explain::explain(&r);
            out(&if as_json { json(&e) } else { explain::render(&e) });
            ExitCode::SUCCESS
        }),
        Command::Diff {
            before,
            after,
            out: dir,
            json: as_json,
            fail_above,
            phase,
        } => diff_command(&before, &after, dir, as_json).map(|d| gate(&d, fail_above, phase)),
        Command::Run(args) => run_command(&args),
    };
    result.unwrap_or_else(|e| {
        let usage = match e.downcast_ref::<RunError>() {
            Some(r) => r.is_usage(),
            None => e.downcast_ref::<report::ReadError>().is_some(),
        };
        eprintln!("dmaprof: {e:#}");
        ExitCode::from(if usage { 2 } else { 1 })
    })
}

/// `dmaprof diff`: the comparison on stdout, differential flamegraphs in `dir`.
fn diff_command(
    before: &Path,
    after: &Path,
    dir: Option<std::path::PathBuf>,
    as_json: bool,
) -> anyhow::Result<diff::RunDiff> {
    let (a, b) = (report::read(before)?, report::read(after)?);
    let d = diff::diff(&a, &b);
    let dir = dir.unwrap_or_else(|| Path::new("dmaprof-out").join(format!("diff-{}", sys::timestamp())));
    let written = diff::write_flamegraphs(&d, (&a, before), (&b, after), &dir)
        .with_context(|| format!("writing differential flamegraphs into {}", dir.display()))?;
    let text = diff::render_diff(&d) + &format!("\n{written} differential flamegraphs in {}\n", dir.display());
    out(&if as_json { json(&d) } else { text });
    Ok(d)
}

/// The regression gate of `diff --fail-above PCT [--phase P]`: exit 1, naming each phase that
/// got significantly slower by more than PCT; 0 otherwise.
fn gate(d: &diff::RunDiff, fail_above: Option<f64>, phase: Option<Phase>) -> ExitCode {
    let Some(pct) = fail_above else {
        return ExitCode::SUCCESS;
    };
    let slower = diff::regressions(d, pct, phase);
    for p in &slower {
        eprintln!(
            "dmaprof: regression: {} {} x{:.2} ({:+.1}%), above {pct}%",
            p.case,
            p.phase.name(),
            p.ratio.unwrap_or(0.0),
            p.delta_pct
        );
    }
    if slower.is_empty() {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    }
}

fn run_command(args: &RunArgs) -> anyhow::Result<ExitCode> {
    bpflog::show(args.debug || bpflog::rust_log_debug());
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .context("starting the runtime")?;
    // Registered before anything changes, so a signal at any moment is handled.
    let signals = {
        let _ctx = rt.enter();
        StopSignals::register()
    };
    let session = Session::prepare(args.options(*STARTED.get_or_init(Instant::now)))?;
    eprint!("{}", session.plan().summary(session.out_dir()));
    let out_dir = session.out_dir().to_owned();
    let control = Control::new();
    let worker = {
        let control = control.clone();
        std::thread::Builder::new()
            .name("dmaprof-workload".into())
            .spawn(move || session.execute(&control))
            .context("starting the workload thread")?
    };
    rt.block_on(stop::supervise(signals, &control, || worker.is_finished()));
    let report = worker
        .join()
        .map_err(|_| anyhow::anyhow!("the workload thread panicked"))??;
    let format = Format::of(args.json, args.ktap, args.csv);
    out(&render(&report, format, Some(&out_dir.join("report.json"))));
    let all_skipped = report.cases.is_empty() && report.failed.is_empty() && !report.skipped.is_empty();
    Ok(match control.signal() {
        // kselftest's KSFT_SKIP: nothing ran, and that is not a pass.
        0 if all_skipped => {
            let first = &report.skipped[0];
            let n = report.skipped.len();
            eprintln!(
                "dmaprof: every selected case was skipped ({n}); the first because {}",
                first.reason
            );
            ExitCode::from(4)
        }
        0 if report.failed.is_empty() => ExitCode::SUCCESS,
        0 => ExitCode::FAILURE,
        sig => ExitCode::from(128 + sig as u8),
    })
}
