//! The `dmaprof` command line: subcommands and options, and the run options they give.
use std::{path::PathBuf, time::Duration};

use clap::{Parser, Subcommand};

use crate::{
    attribution::MAX_SLOT_ITERATIONS,
    matrix::{Prefault, Thp},
    plan::RunOptions,
    probes::{Mechanism, Pass},
    record::RecordOptions,
    size::ByteSize,
    sys,
    workload::Phase,
};

/// Which text a run or a saved report is printed as.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Format {
    /// The tables (and the findings).
    Table,
    /// report.json.
    Json,
    /// KTAP version 1, a test per case.
    Ktap,
    /// A row per case and phase.
    Csv,
}

impl Format {
    /// The format the flags ask for (clap keeps them exclusive).
    pub fn of(json: bool, ktap: bool, csv: bool) -> Self {
        match (json, ktap, csv) {
            (true, _, _) => Format::Json,
            (_, true, _) => Format::Ktap,
            (_, _, true) => Format::Csv,
            _ => Format::Table,
        }
    }
}

/// A percentage above zero (`--fail-above`, `--demote-above`). A clap value parser: the String is the message
/// clap prints as the argument's error, nothing else reads it.
fn percent(s: &str) -> Result<f64, String> {
    match s.trim_end_matches('%').parse::<f64>() {
        Ok(p) if p > 0.0 && p.is_finite() => Ok(p),
        _ => Err(format!("`{s}` is not a percentage above 0 (e.g. 10)")),
    }
}

/// A duration: seconds, or with an `ms`, `s`, `m` or `h` suffix (`--duration`). A clap value
/// parser: the String is the message clap prints.
fn duration(s: &str) -> Result<Duration, String> {
    let (num, unit_ms) = [("ms", 1), ("s", 1000), ("m", 60_000), ("h", 3_600_000)]
        .iter()
        .find_map(|(suffix, ms)| s.strip_suffix(suffix).map(|n| (n, *ms)))
        .unwrap_or((s, 1000));
    match num.trim().parse::<f64>() {
        Ok(v) if v > 0.0 && v.is_finite() => Ok(Duration::from_secs_f64(v * unit_ms as f64 / 1000.0)),
        _ => Err(format!("`{s}` is not a duration above 0 (e.g. 10s, 500ms, 2m)")),
    }
}

/// dmaprof's arguments.
#[derive(Parser)]
#[command(
    name = "dmaprof",
    version,
    about = "Tells a kernel developer why a DMA map is slow",
    arg_required_else_help = true
)]
pub struct Cli {
    /// The subcommand.
    #[command(subcommand)]
    pub command: Command,
}

/// dmaprof's subcommands.
#[derive(Subcommand)]
pub enum Command {
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
    /// Record the DMA map and unmap ioctls of running processes, or of a command and its
    /// children: one record per call with its exact breakdown.
    Record(RecordArgs),
    /// Re-render a saved report.json as tables (or JSON).
    Report {
        /// The report.json of a run or recording, or the directory it is in.
        report: PathBuf,
        /// Print JSON instead of the tables.
        #[arg(long, conflicts_with_all = ["ktap", "csv"])]
        json: bool,
        /// Print KTAP (version 1, a test per case) instead of the tables.
        #[arg(long, conflicts_with = "csv")]
        ktap: bool,
        /// Print CSV (a row per case and phase, every category) instead of the tables.
        #[arg(long)]
        csv: bool,
        /// (Re)write the HTML report (index.html, with the flamegraphs found next to the report)
        /// beside the report and print its path instead of the tables.
        #[arg(long, conflicts_with_all = ["json", "ktap", "csv"])]
        html: bool,
    },
    /// Say what a run's numbers mean: ranked findings (what costs the time, why, the evidence,
    /// what would remove it) and the numbers to read with care.
    Explain {
        /// The report.json of a run or recording, or the directory it is in.
        report: PathBuf,
        /// Print JSON instead of text.
        #[arg(long)]
        json: bool,
    },
    /// Compare two runs case by case and phase by phase, with differential flamegraphs.
    Diff {
        /// report.json of the first run (before), or the directory it is in.
        before: PathBuf,
        /// report.json of the second run (after), or the directory it is in.
        after: PathBuf,
        /// Where the differential flamegraphs go (default: dmaprof-out/diff-<timestamp>).
        #[arg(short = 'o', long = "out")]
        out: Option<PathBuf>,
        /// Print the comparison as JSON.
        #[arg(long)]
        json: bool,
        /// Exit 1 when a phase got significantly slower by more than this many percent (a
        /// regression gate for CI).
        #[arg(long, value_name = "PCT", value_parser = percent)]
        fail_above: Option<f64>,
        /// With --fail-above: judge only this phase.
        #[arg(long, requires = "fail_above")]
        phase: Option<Phase>,
    },
}

/// Options of `dmaprof run`.
#[derive(clap::Args)]
pub struct RunArgs {
    /// Buffer size per case: bytes or with a K/M/G/T suffix. A comma list (`64M,128M,256M`)
    /// runs every case at every size and fits each category's cost against the size.
    #[arg(
        short = 'b',
        long = "size",
        default_value = "1G",
        allow_hyphen_values = true,
        value_delimiter = ','
    )]
    pub size: Vec<ByteSize>,
    /// Select cases by shell glob on `<mode>_<backing>.<prefault>` (or on `<mode>_<backing>`
    /// when the pattern has no dot). Repeatable.
    #[arg(short = 'v', long = "variant", value_name = "GLOB")]
    pub variants: Vec<String>,
    /// Prefault strategies to run.
    #[arg(long, value_delimiter = ',', default_value = "none,populate,touch")]
    pub prefault: Vec<Prefault>,
    /// Untraced iterations per case: the headline wall times, their median and its
    /// confidence interval.
    #[arg(short = 'n', long, default_value_t = 5, value_parser = clap::value_parser!(u32).range(1..=1000))]
    pub iterations: u32,
    /// Iterations of each traced pass (exact, sampled) per case.
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u32).range(1..=i64::from(MAX_SLOT_ITERATIONS / 2)))]
    pub traced_iterations: u32,
    /// Passes per case, interleaved: `untraced` (nothing attached: the headline times), `exact`
    /// (probe-table rows and tracepoints: the exact breakdown), `sampled` (stack sampling only:
    /// shares and flamegraphs).
    #[arg(long, value_delimiter = ',', default_value = "untraced,exact,sampled")]
    pub passes: Vec<Pass>,
    /// Stack sampling frequency in Hz.
    #[arg(long = "freq", default_value_t = 4999, value_parser = clap::value_parser!(u64).range(1..=100_000))]
    pub freq_hz: u64,
    /// Output directory (default: dmaprof-out/<timestamp>).
    #[arg(short = 'o', long = "out")]
    pub out: Option<PathBuf>,
    /// Print report.json on stdout instead of the tables.
    #[arg(long, conflicts_with_all = ["ktap", "csv"])]
    pub json: bool,
    /// Print KTAP (version 1, a test per case, as the kernel selftests do) instead of the tables.
    #[arg(long, conflicts_with = "csv")]
    pub ktap: bool,
    /// Print CSV (a row per case and phase, every category) instead of the tables.
    #[arg(long)]
    pub csv: bool,
    /// PCI device (BDF) to DMA-map for; default $VFIO_SELFTESTS_BDF, as in the kernel selftests.
    #[arg(short = 'd', long, env = "VFIO_SELFTESTS_BDF")]
    pub device: Option<String>,
    /// Bind the device to vfio-pci for the run if another driver has it (restored afterwards).
    #[arg(long)]
    pub bind: bool,
    /// Load no probes: every iteration untraced (wall times only); the same as
    /// `--passes untraced`.
    #[arg(long)]
    pub no_trace: bool,
    /// Probe mechanisms to attach (what each costs: `cargo xtask bench`).
    #[arg(
        long = "probes",
        value_delimiter = ',',
        default_value = "samples,tracepoints,fentry,kprobes"
    )]
    pub mechanisms: Vec<Mechanism>,
    /// Show what the BPF programs report (call stacks out of balance, full maps) as it happens;
    /// `RUST_LOG=debug` does the same. They are counted in the report either way.
    #[arg(long)]
    pub debug: bool,
    /// Demote (leave detached in the exact pass) the hottest probe rows of a syscall phase
    /// while the rows' estimated probe cost exceeds this percentage of the rest of the phase;
    /// their time is split by the sampled stacks. 100 or more keeps every row: exact call
    /// counts and times everywhere, at the probes' full cost.
    #[arg(long, value_name = "PERCENT", default_value_t = 3.0, value_parser = percent)]
    pub demote_above: f64,
    /// Skip the primer: by default, after each attach or detach of probes, one discarded
    /// iteration on a buffer of at most 2 MiB runs the case's code paths once, so that the
    /// next measured iteration does not pay for the first run of the patched kernel text
    /// (under emulation it is translated again: a fixed cost per switch, not per probe hit).
    #[arg(long)]
    pub no_prime: bool,
    /// Pause this long (milliseconds) before each iteration of a base-page case (anonymous,
    /// memfd), so that every iteration takes its pages from an allocator at rest. Back to back,
    /// a 256 MiB 4 KiB memfd buffer came in about 500 or in 24000-32000 physically contiguous
    /// runs by chance, and its DMA map took three times as long on the second; after a pause
    /// of 20 ms or more it came in the first. 0: no pause.
    #[arg(long, value_name = "MS", default_value_t = 50)]
    pub settle: u64,
    /// Transparent huge pages for the anonymous and memfd backings: `system` (as configured),
    /// `never` (MADV_NOHUGEPAGE: 4 KiB pages), `always` (MADV_HUGEPAGE). With populate, the
    /// advice goes first and MADV_POPULATE_WRITE populates.
    #[arg(long, default_value = "system")]
    pub thp: Thp,
    /// Testing: entries of the sampled-stack map (a tiny map forces lost samples).
    #[arg(long, hide = true)]
    pub sample_map_entries: Option<u32>,
    /// Testing: arm the kernel's fault injection (`/proc/thread-self/make-it-fail`) for the
    /// workload thread during each map ioctl; what fails is set in /sys/kernel/debug/fail*.
    #[arg(long, hide = true)]
    pub fail_map_allocs: bool,
}

impl RunArgs {
    /// The run options these arguments give; `started` is when the process began.
    pub fn options(&self, started: std::time::Instant) -> RunOptions {
        let mut sizes = self.size.clone();
        sizes.sort_by_key(|s| s.bytes());
        sizes.dedup();
        RunOptions {
            size: *sizes.last().expect("clap gives at least one size"),
            sizes,
            variants: self.variants.clone(),
            prefaults: self.prefault.clone(),
            iterations: self.iterations,
            traced_iterations: self.traced_iterations,
            passes: if self.no_trace {
                vec![Pass::Untraced]
            } else {
                dedup(&self.passes)
            },
            freq_hz: self.freq_hz,
            out: self
                .out
                .clone()
                .unwrap_or_else(|| PathBuf::from("dmaprof-out").join(sys::timestamp())),
            device: self.device.clone(),
            bind: self.bind,
            sample_map_entries: self.sample_map_entries,
            fail_map_allocs: self.fail_map_allocs,
            mechanisms: self.mechanisms.clone(),
            thp: self.thp,
            demote_above: self.demote_above / 100.0,
            prime: !self.no_prime,
            settle: std::time::Duration::from_millis(self.settle),
            started,
        }
    }
}

/// Options of `dmaprof record`: exactly one of `-p` and a command.
#[derive(clap::Args)]
#[command(group(clap::ArgGroup::new("target").required(true).args(["pids", "command"])))]
pub struct RecordArgs {
    /// Processes to watch (every thread; children they start from now on too).
    #[arg(short = 'p', long = "pid", value_name = "PID", value_delimiter = ',')]
    pub pids: Vec<u32>,
    /// Stop after this long (default: when the processes end, or Ctrl-C).
    #[arg(long, value_parser = duration)]
    pub duration: Option<Duration>,
    /// Output directory (default: dmaprof-out/record-<timestamp>).
    #[arg(short = 'o', long = "out")]
    pub out: Option<PathBuf>,
    /// Print report.json on stdout instead of the tables.
    #[arg(long)]
    pub json: bool,
    /// Probe mechanisms: the exact breakdown per call, and stack sampling on every CPU (the
    /// watched processes' samples are kept, inside and outside their DMA ioctls).
    #[arg(
        long = "probes",
        value_delimiter = ',',
        default_value = "samples,tracepoints,fentry,kprobes"
    )]
    pub mechanisms: Vec<Mechanism>,
    /// Stack sampling frequency per CPU, in Hz.
    #[arg(long = "freq", default_value_t = 999, value_parser = clap::value_parser!(u64).range(1..=100_000))]
    pub freq_hz: u64,
    /// The command to start and record (after `--`).
    #[arg(last = true, value_name = "CMD")]
    pub command: Vec<String>,
}

impl RecordArgs {
    /// The record options these arguments give.
    pub fn options(&self) -> RecordOptions {
        RecordOptions {
            pids: self.pids.clone(),
            command: self.command.clone(),
            duration: self.duration,
            out: self
                .out
                .clone()
                .unwrap_or_else(|| PathBuf::from("dmaprof-out").join(format!("record-{}", sys::timestamp()))),
            mechanisms: dedup(&self.mechanisms),
            freq_hz: self.freq_hz,
        }
    }
}

/// The items in the order given, each once.
fn dedup<T: PartialEq + Copy>(passes: &[T]) -> Vec<T> {
    let mut out: Vec<T> = Vec::new();
    for p in passes {
        if !out.contains(p) {
            out.push(*p);
        }
    }
    out
}

/// The error and its causes on one line, a cause left out where the text before it already
/// says it (a message that names its source, as `cannot read {path}: {source}` does, would
/// print it twice).
pub fn one_line(e: &anyhow::Error) -> String {
    e.chain().map(ToString::to_string).fold(String::new(), |line, cause| {
        match (line.is_empty(), line.contains(&cause)) {
            (true, _) => cause,
            (false, true) => line,
            (false, false) => format!("{line}: {cause}"),
        }
    })
}

impl Command {
    /// This command with each report it reads located (a run's output directory stands for
    /// its report.json).
    pub fn with_reports_located(mut self) -> Self {
        match &mut self {
            Command::Report { report: path, .. } | Command::Explain { report: path, .. } => {
                *path = crate::report::locate(path);
            }
            Command::Diff { before, after, .. } => {
                *before = crate::report::locate(before);
                *after = crate::report::locate(after);
            }
            _ => {}
        }
        self
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn output_formats_and_the_gate_parse() {
        let run = |args: &[&str]| Cli::try_parse_from([&["dmaprof", "run"], args].concat());
        assert!(run(&["--ktap"]).is_ok());
        assert!(run(&["--ktap", "--csv"]).is_err());
        assert!(run(&["--json", "--ktap"]).is_err());
        assert_eq!(Format::of(false, true, false), Format::Ktap);
        assert_eq!(Format::of(false, false, false), Format::Table);
        let diff = |args: &[&str]| Cli::try_parse_from([&["dmaprof", "diff", "a", "b"], args].concat());
        let Ok(Cli {
            command: Command::Diff { fail_above, phase, .. },
        }) = diff(&["--fail-above", "10%", "--phase", "map"])
        else {
            panic!("diff --fail-above 10% --phase map parses");
        };
        assert_eq!((fail_above, phase), (Some(10.0), Some(Phase::Map)));
        assert!(diff(&["--fail-above", "0"]).is_err());
        assert!(diff(&["--phase", "map"]).is_err(), "--phase needs --fail-above");
        assert!(diff(&["--fail-above", "5", "--phase", "mapp"]).is_err());
    }

    #[test]
    fn record_takes_pids_or_a_command_never_both() {
        let record = |args: &[&str]| Cli::try_parse_from([&["dmaprof", "record"], args].concat());
        let Ok(Cli {
            command: Command::Record(a),
        }) = record(&["-p", "1,2", "--duration", "1.5s"])
        else {
            panic!("-p 1,2 parses");
        };
        assert_eq!(
            (a.pids.clone(), a.duration),
            (vec![1, 2], Some(Duration::from_millis(1500)))
        );
        assert!(
            a.options().mechanisms.contains(&Mechanism::Samples),
            "recordings sample too"
        );
        assert_eq!(a.options().freq_hz, 999);
        let Ok(Cli {
            command: Command::Record(a),
        }) = record(&["-o", "x", "--", "qemu", "-m", "1G"])
        else {
            panic!("a command parses");
        };
        assert_eq!(a.command, vec!["qemu", "-m", "1G"]);
        assert!(record(&[]).is_err(), "neither");
        assert!(record(&["-p", "1", "--", "true"]).is_err(), "both");
        assert!(record(&["-p", "x"]).is_err());
        assert_eq!(duration("500ms"), Ok(Duration::from_millis(500)));
        assert_eq!(duration("2m"), Ok(Duration::from_secs(120)));
        assert_eq!(duration("3"), Ok(Duration::from_secs(3)));
        assert!(duration("0").is_err() && duration("soon").is_err());
    }

    #[test]
    fn run_arguments_parse_into_types() {
        let cli = Cli::try_parse_from([
            "dmaprof",
            "run",
            "-b",
            "256M",
            "--probes",
            "fentry,kprobes",
            "--prefault",
            "touch",
        ])
        .unwrap();
        let Command::Run(args) = cli.command else {
            panic!("not run")
        };
        let o = args.options(std::time::Instant::now());
        assert_eq!(o.size.bytes(), 256 << 20);
        assert_eq!(o.sizes.len(), 1);
        assert_eq!(o.mechanisms, vec![Mechanism::Fentry, Mechanism::Kprobes]);
        assert_eq!(o.prefaults, vec![Prefault::Touch]);
        assert!(Cli::try_parse_from(["dmaprof", "run", "-b", "100"]).is_err());
        assert!(Cli::try_parse_from(["dmaprof", "run", "-n", "0"]).is_err());
        assert_eq!(o.passes, vec![Pass::Untraced, Pass::Exact, Pass::Sampled]);
        let cli = Cli::try_parse_from(["dmaprof", "run", "--no-trace", "--passes", "exact"]).unwrap();
        let Command::Run(args) = cli.command else {
            panic!("not run")
        };
        assert_eq!(args.options(std::time::Instant::now()).passes, vec![Pass::Untraced]);
        assert!(Cli::try_parse_from(["dmaprof", "run", "--passes", "fast"]).is_err());
    }

    #[test]
    fn a_cause_the_message_already_names_is_not_repeated() {
        let io = std::io::Error::from(std::io::ErrorKind::NotFound);
        let said = io.to_string();
        let e = anyhow::Error::new(io).context(format!("cannot read x: {said}"));
        assert_eq!(one_line(&e), format!("cannot read x: {said}"));
        let e = anyhow::anyhow!("inner").context("outer");
        assert_eq!(one_line(&e), "outer: inner");
    }
}
