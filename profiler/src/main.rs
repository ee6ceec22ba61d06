//! The `dmaprof` command line. Exit codes: 0 success, 1 failure, 2 bad usage,
//! 128+N when stopped by signal N (130 for Ctrl-C, 143 for SIGTERM, 129 for SIGHUP).
use std::{process::ExitCode, sync::OnceLock, time::Instant};

use anyhow::Context as _;
use clap::Parser as _;
use profiler::{
    bpflog,
    cli::{Cli, Command, Format, RunArgs},
    diff, doctor, explain, export, leftovers, matrix, record, recording, report,
    session::{Outcome, RunError, Session},
    stop::{self, Supervisor},
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

fn main() -> ExitCode {
    STARTED.get_or_init(Instant::now);
    stop::hold_stop_signals();
    let cli = match Cli::try_parse() {
        Ok(c) => c,
        // --help and --version succeed; anything else is clap's whole message: what is wrong,
        // the allowed values, the usage line.
        Err(e) => {
            let _ = e.print();
            return ExitCode::from(if e.use_stderr() { 2 } else { 0 });
        }
    };
    if !matches!(cli.command, Command::Run(_) | Command::Record(_)) {
        stop::release_stop_signals();
    }
    dispatch(cli.command).unwrap_or_else(|e| {
        let usage = e.downcast_ref::<RunError>().is_some_and(RunError::is_usage)
            || e.downcast_ref::<diff::DiffError>()
                .is_some_and(diff::DiffError::is_usage)
            || e.downcast_ref::<report::ReadError>().is_some()
            || e.downcast_ref::<record::RecordError>()
                .is_some_and(record::RecordError::is_usage);
        eprintln!("dmaprof: {}", profiler::cli::one_line(&e));
        ExitCode::from(if usage { 2 } else { 1 })
    })
}

/// Runs the subcommand; its errors are mapped to exit codes by `main`.
fn dispatch(command: Command) -> anyhow::Result<ExitCode> {
    match command.with_reports_located() {
        Command::Doctor {
            json: as_json,
            leftovers: true,
        } => {
            let l = leftovers::leftovers();
            out(&leftovers::render_as(&l, as_json));
            Ok(ExitCode::from(u8::from(!l.is_empty())))
        }
        Command::Doctor { json: as_json, .. } => {
            let d = doctor::probe_host();
            out(&if as_json { export::json(&d) } else { doctor::render(&d) });
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
            html,
        } => {
            let format = Format::of(as_json, ktap, csv);
            let text = match html {
                true => export::saved(&report::read(&path)?, &path, format, true)?,
                false => export::render_file(&path, format)?,
            };
            out(&text);
            Ok(ExitCode::SUCCESS)
        }
        Command::Explain {
            report: path,
            json: as_json,
        } => {
            let e = explain::explain_file(&path)?;
            out(&if as_json { export::json(&e) } else { explain::render(&e) });
            Ok(ExitCode::SUCCESS)
        }
        Command::Diff {
            before,
            after,
            json: as_json,
            fail_above,
            phase: None,
            ..
        } if let Some(d) = recording::diff_saved(&before, &after) => {
            let d = d?;
            out(&recording::render_diff_as(&d, as_json));
            Ok(ExitCode::from(diff::gate_exit(&recording::gate(&d, fail_above))))
        }
        Command::Diff {
            before,
            after,
            out: dir,
            json: as_json,
            fail_above,
            phase,
        } => diff::compare_files(&before, &after, dir)
            .map_err(Into::into)
            .map(|(d, text)| {
                out(&if as_json { export::json(&d) } else { text });
                ExitCode::from(diff::gate_exit(&diff::gate(&d, fail_above, phase)))
            }),
        Command::Run(args) => run_command(&args),
        Command::Record(args) => {
            let (r, path, signal) = record::supervised(args.options())?;
            out(&recording::render_as(&r, args.json, Some(&path)));
            Ok(ExitCode::from(record::exit_code(signal)))
        }
    }
}

fn run_command(args: &RunArgs) -> anyhow::Result<ExitCode> {
    bpflog::show(args.debug || bpflog::rust_log_debug());
    // Registered before anything changes, so a signal at any moment is handled.
    let supervisor = Supervisor::start().context("starting the runtime")?;
    let session = Session::prepare(args.options(*STARTED.get_or_init(Instant::now)))?;
    eprint!("{}", session.plan().summary(session.out_dir()));
    let out_dir = session.out_dir().to_owned();
    let (report, signal) = supervisor
        .run("dmaprof-workload", move |control| session.execute(control))
        .context("running the workload thread")?;
    let report = report?;
    let format = Format::of(args.json, args.ktap, args.csv);
    out(&export::render(&report, format, Some(&out_dir.join("report.json"))));
    let outcome = Outcome::of(&report, signal);
    if let Some(note) = outcome.note() {
        eprintln!("dmaprof: {note}");
    }
    Ok(ExitCode::from(outcome.exit_code()))
}
