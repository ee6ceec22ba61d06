//! `cargo xtask bench`: what tracing costs, measured side by side. Every ratio is traced time
//! over untraced time of the same case in the same boot, with the configurations interleaved
//! round by round (rotating order), so drift of the machine hits them all alike. No
//! thresholds: it prints a markdown table and writes it to `docs/bench.md`.
//!
//! - Guest (custom kernel, the worst case: 4 KiB anonymous memory, prefault none, one fault and
//!   one pin per page): untraced, dmaprof per probe mechanism, and bpftrace (Debian's) with
//!   kprobe+kretprobe latency maps on the same functions and with `profile:hz:4999`.
//! - Host (no kprobes): sampling-only dmaprof against `bpftrace profile:hz:4999` on the
//!   memory phases.
//! - Start-up (process start to every probe attached) and peak RSS of a 1 GiB run.
use std::{
    collections::BTreeMap,
    fmt::Write as _,
    fs,
    path::{Path, PathBuf},
    process::{Command, Stdio},
    time::{Duration, Instant},
};

use anyhow::{Context as _, Result, bail};
use clap::Args;
use serde_json::Value;

use super::{Payload, Plan, cache_dir, execute, kernel, qemu::FailKind, unpack_archive};
use crate::{
    build::{build_release, build_static, build_vm_init, workspace_root},
    setup::ensure_debian_packages,
    size::ByteSize,
};

/// `n` GiB of guest memory.
fn gib(n: u64) -> ByteSize {
    ByteSize::new(n << 30).expect("whole GiB are a size")
}

/// Arguments of `cargo xtask bench`.
#[derive(Args)]
pub struct BenchArgs {
    /// Interleaved rounds; each runs every configuration once.
    #[arg(long, default_value_t = 5)]
    rounds: u32,
    /// Buffer size of the overhead runs (guest).
    #[arg(long, default_value = "64M")]
    size: ByteSize,
    /// Buffer size of the overhead runs on the host.
    #[arg(long, default_value = "512M")]
    host_size: ByteSize,
    /// Buffer size of the peak-RSS run (guest).
    #[arg(long, default_value = "1G")]
    rss_size: ByteSize,
    /// Skip the guest part (only the host comparison).
    #[arg(long)]
    no_vm: bool,
    /// Skip the host part (only the guest runs), e.g. for many rounds of `all_passes`.
    #[arg(long)]
    no_host: bool,
    /// Where the markdown goes (relative to the workspace).
    #[arg(long, default_value = "docs/bench.md")]
    out: PathBuf,
    /// Only these guest configurations (comma-separated; `untraced`, which every ratio is
    /// of, always runs), e.g. `all_passes,exact_pass` for many rounds of the exact pass alone.
    #[arg(long, value_delimiter = ',', value_parser = config_name)]
    configs: Vec<String>,
    /// Iterations of each selected pass per guest run (`-n` and `--traced-iterations`): more
    /// narrow the in-process ratios of `all_passes`.
    #[arg(long, default_value_t = 3, value_parser = clap::value_parser!(u32).range(1..=50))]
    iterations: u32,
}

impl BenchArgs {
    /// The guest configurations this bench runs, in table order.
    fn guest_configs(&self) -> Vec<Config> {
        GUEST_CONFIGS
            .iter()
            .filter(|c| self.configs.is_empty() || c.name == "untraced" || self.configs.iter().any(|n| n == c.name))
            .copied()
            .collect()
    }
}

/// What the exact pass's map may cost, as a ratio to the untraced map.
const EXACT_TARGET: f64 = 1.05;

/// The exact pass's map ratio held against [`EXACT_TARGET`], in words.
fn exact_target(ratio: f64) -> String {
    let verdict = if ratio <= EXACT_TARGET { "met" } else { "not met here" };
    format!("target <= {EXACT_TARGET}: {verdict}")
}

/// The summary sentence over the configurations that ran (a `--configs` run has only some).
fn in_short(results: &Results) -> String {
    let map = |c: &str| Some(median(ratios(results, c, GUEST_CASE, "map"))).filter(|r| r.is_finite());
    let named = [
        ("exact_pass", "the exact pass"),
        ("exact_kprobes", "every row by kprobes"),
        ("tracepoints", "its tracepoints alone"),
        ("bt_kprobes", "bpftrace kprobes"),
        ("sampled_pass", "the sampled pass at 4999 Hz"),
        ("bt_profile", "bpftrace profile"),
    ];
    let parts: Vec<String> = named
        .iter()
        .filter_map(|(c, what)| {
            let r = map(c)?;
            let target = match *c {
                "exact_pass" => format!(" ({})", exact_target(r)),
                _ => String::new(),
            };
            Some(format!("{what} {r:.3}{target}"))
        })
        .collect();
    let head = if parts.is_empty() {
        "In short: none of the separate-process configurations ran (see the in-process ratios below)".to_owned()
    } else {
        format!(
            "In short (map phase, median ratio to the untraced pass): {}",
            parts.join(", ")
        )
    };
    format!("{head}. The headline times of a run come from the untraced pass, which has nothing attached.")
}

/// A `--configs` entry: one of [`GUEST_CONFIGS`].
fn config_name(s: &str) -> Result<String, String> {
    let names: Vec<&str> = GUEST_CONFIGS.iter().map(|c| c.name).collect();
    if names.contains(&s) {
        Ok(s.to_owned())
    } else {
        Err(format!(
            "no bench configuration {s:?}; the guest ones are {}",
            names.join(", ")
        ))
    }
}

/// The case every overhead run uses in the guest: a fault and a pin per 4 KiB page (with
/// `--thp never`, so the guest's THP `always` does not turn it into 2 MiB pages).
const GUEST_CASE: &str = "vfio_type1_iommu_anonymous.none";
/// Host cases: faults per page (touch) and prefault inside mmap (populate).
const HOST_CASES: &[&str] = &["none_anonymous.touch", "none_anonymous.populate"];
/// The workload thread's comm as bpftrace sees it (16 bytes with the NUL).
const WORKLOAD_COMM: &str = "dmaprof-workloa";

/// One configuration: a name and how the shell runs it.
#[derive(Clone, Copy)]
struct Config {
    name: &'static str,
    what: &'static str,
    /// dmaprof options, or None for the bpftrace ones (dmaprof runs with --no-trace then).
    dmaprof: Option<&'static str>,
    /// bpftrace script file in the guest or on the host.
    bpftrace: Option<&'static str>,
}

const GUEST_CONFIGS: &[Config] = &[
    Config {
        name: "untraced",
        what: "dmaprof --no-trace (the untraced pass alone: wall clock only)",
        dmaprof: Some("--no-trace"),
        bpftrace: None,
    },
    Config {
        name: "sampled_pass",
        what: "dmaprof --passes sampled (the sampled pass: perf_event stacks at 4999 Hz)",
        dmaprof: Some("--passes sampled"),
        bpftrace: None,
    },
    Config {
        name: "tracepoints",
        what: "dmaprof --passes exact --probes tracepoints (the exact pass's raw tracepoints alone)",
        dmaprof: Some("--passes exact --probes tracepoints"),
        bpftrace: None,
    },
    Config {
        name: "exact_pass",
        what: "dmaprof --passes exact (the exact pass as a run does it: fentry/fexit on vmlinux rows, kprobe/kretprobe on module rows, tracepoints)",
        dmaprof: Some("--passes exact"),
        bpftrace: None,
    },
    Config {
        name: "exact_kprobes",
        what: "dmaprof --passes exact --probes kprobes,tracepoints (every row by kprobe/kretprobe)",
        dmaprof: Some("--passes exact --probes kprobes,tracepoints"),
        bpftrace: None,
    },
    Config {
        name: "all_passes",
        what: "dmaprof with every pass, as `run` does by default (exact and sampled iterations interleaved with untraced ones in one process)",
        dmaprof: Some("--passes untraced,exact,sampled"),
        bpftrace: None,
    },
    Config {
        name: "all_passes_unprimed",
        what: "all_passes without the primer iteration after each probe switch (`--no-prime`): the next measured iteration pays for the patched text's first run",
        dmaprof: Some("--passes untraced,exact,sampled --no-prime"),
        bpftrace: None,
    },
    Config {
        name: "bt_kprobes",
        what: "bpftrace kprobe+kretprobe latency sums on the same functions",
        dmaprof: None,
        bpftrace: Some("/tmp/kprobes.bt"),
    },
    Config {
        name: "bt_profile",
        what: "bpftrace profile:hz:4999 kernel stacks",
        dmaprof: None,
        bpftrace: Some("/tmp/profile.bt"),
    },
];

const HOST_CONFIGS: &[Config] = &[
    GUEST_CONFIGS[0],
    GUEST_CONFIGS[1],
    GUEST_CONFIGS[2],
    Config {
        name: "bt_profile",
        what: "bpftrace profile:hz:4999 kernel stacks",
        dmaprof: None,
        bpftrace: Some("profile"),
    },
];

/// `profile:hz:4999` on the workload thread, kernel stacks counted (what dmaprof's sampling does).
fn profile_script() -> String {
    format!(
        "BEGIN {{ printf(\"READY\\n\"); }}\nprofile:hz:4999 /comm == \"{WORKLOAD_COMM}\"/ {{ @[kstack] = count(); }}\n"
    )
}

/// kprobe+kretprobe latency sums and call counts on `functions` for the workload thread.
fn kprobes_script(functions: &[String]) -> String {
    let mut s = String::from("BEGIN { printf(\"READY\\n\"); }\n");
    for f in functions {
        let _ = writeln!(
            s,
            "kprobe:{f} /comm == \"{WORKLOAD_COMM}\"/ {{ @ts[tid, \"{f}\"] = nsecs; }}\n\
             kretprobe:{f} /@ts[tid, \"{f}\"]/ {{ @ns[\"{f}\"] = sum(nsecs - @ts[tid, \"{f}\"]); \
             @calls[\"{f}\"] = count(); delete(@ts[tid, \"{f}\"]); }}"
        );
    }
    s
}

/// The guest script's `bt NAME ROUND SCRIPT`: starts bpftrace, waits up to `wait_polls` x 100 ms
/// for its BEGIN line (READY), then: READY seen -> `T` line, the untraced run (`one`) measured
/// under it, bpftrace stopped; still running without READY -> `F ... no READY`, killed; dead ->
/// `F` with its output. `tmp` holds its log, copied to `out`. Needs `up`, `one` and `usleep`.
///
/// Stopping waits as long again and then kills (`K` line): sh starts a background job with
/// SIGINT ignored, and bpftrace installs its handler only after compiling its script, so a
/// SIGINT sent before that is dropped and bpftrace runs on; an unbounded `wait` on it hung the
/// guest's script with both CPUs idle.
fn bt_function(wait_polls: u32, tmp: &str, out: &str) -> String {
    let secs = f64::from(wait_polls) / 10.0;
    format!(
        r#"stop_bt() {{ # name round: SIGINT, and SIGKILL if bpftrace outlives the same wait
  kill -INT $bp; n=0
  while kill -0 $bp 2>/dev/null && [ $n -lt {wait_polls} ]; do usleep 100000; n=$((n + 1)); done
  if kill -0 $bp 2>/dev/null; then
    echo "K $1 $2 bpftrace still running {secs} s after SIGINT: $(grep -E 'SigIgn|SigCgt' /proc/$bp/status | tr '\n\t' '  ')"
    kill -9 $bp
  fi
  wait $bp
}}
bt() {{ # name round script
  rm -f {tmp}/bt.out; : > {tmp}/bt.out
  t0=$(up); bpftrace $3 > {tmp}/bt.out 2>&1 & bp=$!
  n=0
  while ! grep -q READY {tmp}/bt.out && [ $n -lt {wait_polls} ]; do kill -0 $bp 2>/dev/null || break; usleep 100000; n=$((n + 1)); done
  if grep -q READY {tmp}/bt.out; then
    echo "T $1 $2 $(( ($(up) - t0) * 10 ))"
    one $1 $2 --no-trace
    stop_bt $1 $2
  elif kill -0 $bp 2>/dev/null; then
    echo "F $1 $2 no READY after {secs} s: $(head -c 300 {tmp}/bt.out | tr '\n' ' ')"; kill -9 $bp; wait $bp
  else
    wait $bp; echo "F $1 $2 $(head -c 300 {tmp}/bt.out | tr '\n' ' ')"
  fi
  cp {tmp}/bt.out {out}/$1-$2.bt
}}
"#
    )
}

/// `cargo xtask bench`.
pub fn run(args: &BenchArgs) -> Result<()> {
    ensure_debian_packages("bpftrace, the peer dmaprof is compared with", &["bpftrace"])?;
    let mut md = String::new();
    let _ = writeln!(
        md,
        "# dmaprof benchmarks\n\nTaken by `cargo xtask bench` on {} ({} rounds, configurations interleaved in \
         rotating order; ratios are traced / untraced of the same round: median [min-max] over rounds, then the \
         95% bootstrap confidence interval of that median and its half-width; `not significant` when it \
         holds 1).\n",
        super::timestamp(),
        args.rounds
    );
    if args.no_vm {
        md += "Guest part skipped (--no-vm).\n\n";
    } else {
        md += &guest(args)?;
    }
    if args.no_host {
        md += "Host part skipped (--no-host).\n";
    } else {
        md += &host(args)?;
    }
    let path = workspace_root().join(&args.out);
    if let Some(dir) = path.parent() {
        fs::create_dir_all(dir)?;
    }
    fs::write(&path, &md).with_context(|| format!("writing {}", path.display()))?;
    println!("{md}");
    eprintln!("xtask: bench written to {}", path.display());
    Ok(())
}

/// A median in ms, or "not run" where the configuration measuring it was not selected.
fn ms_or_not_run(ms: f64) -> String {
    if ms.is_finite() {
        format!("{ms:.0}")
    } else {
        "not run".into()
    }
}

fn median(mut v: Vec<f64>) -> f64 {
    if v.is_empty() {
        return f64::NAN;
    }
    v.sort_by(f64::total_cmp);
    let n = v.len();
    if n % 2 == 1 {
        v[n / 2]
    } else {
        (v[n / 2 - 1] + v[n / 2]) / 2.0
    }
}

/// "1.23 [1.10-1.40] CI 1.15-1.31 (+-6.5%)": median, min-max over rounds, and the 95%
/// bootstrap confidence interval of the median with its half-width relative to the median;
/// "not significant" when the interval holds 1 (no measurable overhead).
fn spread(v: &[f64]) -> String {
    if v.is_empty() {
        return "n/a".into();
    }
    let lo = v.iter().copied().fold(f64::INFINITY, f64::min);
    let hi = v.iter().copied().fold(f64::NEG_INFINITY, f64::max);
    let m = median(v.to_vec());
    let (a, b) = bootstrap_ci(v);
    let half = (b - a) / 2.0 / m * 100.0;
    let verdict = if a <= 1.0 && b >= 1.0 { ", not significant" } else { "" };
    format!("{m:.3} [{lo:.3}-{hi:.3}] CI {a:.3}-{b:.3} (+-{half:.1}%{verdict})")
}

/// Resamples for [`bootstrap_ci`].
const BOOTSTRAP: usize = 4000;

/// The 95% percentile-bootstrap confidence interval of the median of `v` (rounds resampled
/// with replacement; a fixed seed, so a table is reproducible from its data).
fn bootstrap_ci(v: &[f64]) -> (f64, f64) {
    let mut state = 0x9e37_79b9_7f4a_7c15_u64;
    let mut next = || {
        // xorshift64*: plenty for picking rounds.
        state ^= state >> 12;
        state ^= state << 25;
        state ^= state >> 27;
        state.wrapping_mul(0x2545_f491_4f6c_dd1d)
    };
    let mut medians: Vec<f64> = (0..BOOTSTRAP)
        .map(|_| median((0..v.len()).map(|_| v[(next() % v.len() as u64) as usize]).collect()))
        .collect();
    medians.sort_by(f64::total_cmp);
    (medians[BOOTSTRAP * 25 / 1000], medians[BOOTSTRAP * 975 / 1000])
}

/// Per round, a pass's in-process ratio to the untraced pass (report `passes.<pass>.ratio`)
/// for `phase` of `case` in `config`'s runs: paired within one process, so the physical
/// layout a process happens to get (and with it the DMA chunk count) cancels out.
fn in_run_ratios(results: &Results, config: &str, case: &str, phase: &str, pass: &str) -> Vec<f64> {
    let Some(runs) = results.get(config) else {
        return Vec::new();
    };
    runs.values()
        .filter_map(|r| {
            let p = r["cases"].as_array()?.iter().find(|c| c["name"] == case)?["phases"]
                .as_array()?
                .iter()
                .find(|p| p["name"] == phase)?;
            p["passes"][pass]["ratio"]["median"].as_f64()
        })
        .collect()
}

/// The configurations whose runs hold every pass in one process.
const IN_RUN_CONFIGS: [&str; 2] = ["all_passes", "all_passes_unprimed"];

/// The in-process ratios of the exact and sampled passes of each of [`IN_RUN_CONFIGS`] that ran.
fn in_run_table(results: &Results, case: &str, phases: &[&str]) -> String {
    let mut s = String::from("| pass | configuration |");
    for p in phases {
        let _ = write!(s, " {p} ratio |");
    }
    s += "\n|---|---|";
    s += &"---|".repeat(phases.len());
    s += "\n";
    for config in IN_RUN_CONFIGS.into_iter().filter(|c| results.contains_key(*c)) {
        for pass in ["exact", "sampled"] {
            let _ = write!(s, "| {pass} | {config} |");
            for p in phases {
                let _ = write!(s, " {} |", spread(&in_run_ratios(results, config, case, p, pass)));
            }
            s += "\n";
        }
    }
    s
}

/// Median wall time (ns) of `phase` of `case` in a report.
fn phase_ns(report: &Value, case: &str, phase: &str) -> Option<f64> {
    report["cases"].as_array()?.iter().find(|c| c["name"] == case)?["phases"]
        .as_array()?
        .iter()
        .find(|p| p["name"] == phase)?["wall_ns"]["median"]
        .as_f64()
}

/// Per config: per round, the report.
type Results = BTreeMap<&'static str, BTreeMap<u32, Value>>;

/// Per round, `phase` of `case` under `config` over the same round's untraced run.
fn ratios(results: &Results, config: &str, case: &str, phase: &str) -> Vec<f64> {
    let (Some(base), Some(runs)) = (results.get("untraced"), results.get(config)) else {
        return Vec::new();
    };
    runs.iter()
        .filter_map(|(round, r)| Some(phase_ns(r, case, phase)? / phase_ns(base.get(round)?, case, phase)?))
        .collect()
}

/// The overhead table for `phases` of `case`.
fn overhead_table(results: &Results, configs: &[Config], case: &str, phases: &[&str]) -> String {
    let mut s = String::new();
    let _ = write!(s, "| configuration |");
    for p in phases {
        let _ = write!(s, " {p} ms | {p} ratio |");
    }
    s += "\n|---|";
    s += &"---|---|".repeat(phases.len());
    s += "\n";
    for c in configs {
        let Some(runs) = results.get(c.name) else { continue };
        let _ = write!(s, "| {} ({}) |", c.name, c.what);
        for p in phases {
            let ms: Vec<f64> = runs
                .values()
                .filter_map(|r| phase_ns(r, case, p))
                .map(|n| n / 1e6)
                .collect();
            let _ = write!(
                s,
                " {:.2} | {} |",
                median(ms),
                spread(&ratios(results, c.name, case, p))
            );
        }
        s += "\n";
    }
    s
}

/// Boots the custom kernel twice: once to learn which probe functions exist, once for the bench.
fn guest(args: &BenchArgs) -> Result<String> {
    kernel::ensure_vm_packages()?;
    let cache = cache_dir()?;
    let custom = kernel::prepare(&kernel::Choice::Custom, None, &cache)?;
    let dmaprof = build_static()?;
    let init = build_vm_init()?;
    let scratch = cache.join("bench");
    let _ = fs::remove_dir_all(&scratch);

    // Boot 1: dmaprof's probe table as this kernel resolves it; bpftrace gets the same functions.
    eprintln!("xtask: bench: which probe functions attach on the custom kernel");
    let discover = scratch.join("discover");
    boot(
        &custom,
        &init,
        &dmaprof,
        Vec::new(),
        format!(
            "/bin/dmaprof doctor --json > /out/doctor.json; \
             /bin/dmaprof run --json -b 4M -v {GUEST_CASE} -n 1 -o /tmp/o > /out/report.json 2> /out/stderr.txt; \
             awk '{{print $3}}' /proc/kallsyms > /out/symbols.txt"
        ),
        gib(2),
        &discover,
        BOOT_TIMEOUT,
    )?;
    let report: Value = serde_json::from_str(&fs::read_to_string(discover.join("report.json"))?)
        .context("discovery run: report.json")?;
    let functions: Vec<String> = report["probes"]
        .as_array()
        .map(|p| {
            p.iter()
                .filter(|p| (p["mechanism"] == "kprobe" || p["mechanism"] == "fentry") && p["attached"] == true)
                .filter_map(|p| p["function"].as_str().map(str::to_owned))
                .collect()
        })
        .unwrap_or_default();
    // bpftrace names a probe by its symbol: a row dmaprof attached through a compiler clone
    // (`vfio_sync_unpin.isra.0`) has no symbol of its own name, and bpftrace refuses it.
    let symbols: std::collections::HashSet<String> = fs::read_to_string(discover.join("symbols.txt"))
        .unwrap_or_default()
        .lines()
        .map(str::to_owned)
        .collect();
    let functions: Vec<String> = functions.into_iter().filter(|f| symbols.contains(f)).collect();
    let doctor: Value =
        serde_json::from_str(&fs::read_to_string(discover.join("doctor.json")).unwrap_or_default()).unwrap_or_default();
    let fentry_rows = report["probes"].as_array().map_or(0, |p| {
        p.iter()
            .filter(|p| p["mechanism"] == "fentry" && p["attached"] == true)
            .count()
    });
    let fentry = doctor["capabilities"]["fentry"].clone();

    // Boot 2: every configuration, interleaved; bpftrace and its libraries ride in the initramfs.
    let host_files = super::with_libraries(Path::new("/usr/bin/bpftrace"))?;
    let mut script = format!(
        "cat > /tmp/kprobes.bt <<'EOF'\n{}EOF\ncat > /tmp/profile.bt <<'EOF'\n{}EOF\n",
        kprobes_script(&functions),
        profile_script()
    );
    let _ = write!(
        script,
        r#"up() {{ cut -d' ' -f1 /proc/uptime | tr -d .; }}
B="/bin/dmaprof run --json -b {size_bytes} -v {GUEST_CASE} -n {n} --traced-iterations {n} --thp never"
attempt() {{ # name round dmaprof-options; fails if the run hung
  rm -rf /tmp/o
  $B $3 -o /tmp/o > /dev/null 2> /tmp/err & dp=$!
  n=0; while kill -0 $dp 2>/dev/null && [ $n -lt 3000 ]; do usleep 100000; n=$((n + 1)); done
  if kill -0 $dp 2>/dev/null; then
    # Stuck for 300 s: say where each thread is in the kernel, then end it.
    echo "H $1 $2 hung: $(tail -1 /tmp/err)"
    for t in /proc/$dp/task/*; do echo "STACK $(cat $t/comm) $(cat $t/wchan)"; cat $t/stack; done
    kill -9 $dp; wait $dp
    return 1
  fi
  wait $dp || echo "E $1 $2 $? $(tail -1 /tmp/err)"
}}
one() {{ # name round dmaprof-options: a run that hangs is killed and run once more
  echo "R $1 $2"
  attempt "$@" || attempt "$@" || echo "E $1 $2 hung twice"
  cp /tmp/o/report.json /out/$1-$2.json; rm -rf /tmp/o
}}
{bt}"#,
        bt = bt_function(1200, "/tmp", "/out"),
        size_bytes = args.size.bytes(),
        n = args.iterations
    );
    let configs = args.guest_configs();
    let names: Vec<&str> = configs.iter().map(|c| c.name).collect();
    for round in 0..args.rounds {
        // Rotate the order each round so no configuration always runs first.
        let k = round as usize % names.len();
        for c in names[k..].iter().chain(&names[..k]) {
            let c = configs.iter().find(|x| x.name == *c).expect("listed");
            match (c.dmaprof, c.bpftrace) {
                (Some(opts), _) => {
                    let _ = writeln!(script, "one {} {round} '{opts}'", c.name);
                }
                (None, Some(file)) => {
                    let _ = writeln!(script, "bt {} {round} {file}", c.name);
                }
                (None, None) => unreachable!("a configuration runs something"),
            }
        }
    }
    let _ = writeln!(
        script,
        "/bin/dmaprof run --json -b {} -v vfio_type1_iommu_anonymous.populate -n 1 -o /tmp/o > /dev/null 2> /tmp/err \
         || echo \"E rss 0 $? $(tail -1 /tmp/err)\"; cp /tmp/o/report.json /out/rss.json",
        args.rss_size.bytes()
    );
    eprintln!(
        "xtask: bench: {} rounds x {} configurations in one boot (TCG: this takes a while)",
        args.rounds,
        configs.len()
    );
    let dir = scratch.join("guest");
    let limit = bench_timeout(args.rounds, configs.len());
    let console = boot(&custom, &init, &dmaprof, host_files, script, gib(4), &dir, limit)?;

    let mut results: Results = BTreeMap::new();
    for c in &configs {
        for round in 0..args.rounds {
            if let Ok(text) = fs::read_to_string(dir.join(format!("{}-{round}.json", c.name))) {
                if let Ok(v) = serde_json::from_str(&text) {
                    results.entry(c.name).or_default().insert(round, v);
                }
            }
        }
    }
    let marker = |m: &str| -> Vec<Vec<String>> {
        console
            .iter()
            .filter(|l| l.starts_with(&format!("{m} ")))
            .map(|l| l.split_whitespace().map(str::to_owned).collect())
            .collect()
    };
    let mut md = String::new();
    let release = report["kernel"]["release"].as_str().unwrap_or("?");
    let _ = writeln!(
        md,
        "## Tracing overhead in the guest\n\nCustom kernel {release} under QEMU TCG (no KVM here: every \
         instruction is emulated, so absolute times are slow and kprobe traps cost more than on hardware). \
         Case `{GUEST_CASE}` with `--thp never` (4 KiB pages), {} per map, {} iterations of the selected pass \
         per run. dmaprof attached {} probe-table functions ({} of \
         them in vmlinux by fentry/fexit when fentry is on, the rest by kprobe/kretprobe); bpftrace 0.17 (Debian) \
         got the same list as kprobe/kretprobe, less the compiler clones it cannot name.\n",
        args.size,
        args.iterations,
        functions.len(),
        fentry_rows
    );
    let _ = writeln!(md, "{}\n", in_short(&results));
    md += &overhead_table(&results, &configs, GUEST_CASE, &["map", "unmap", "mmap"]);
    let in_run = median(in_run_ratios(&results, "all_passes", GUEST_CASE, "map", "exact"));
    let _ = writeln!(
        md,
        "\nWithin one process (`all_passes`: a default run, each pass's iterations interleaved with the untraced \
         ones; the report's `passes.<pass>.ratio`: each traced iteration's wall time over the untraced iterations' \
         line at its buffer's physical layout, the median of those; per round, then over rounds). Paired inside \
         a process and matched by layout, the DMA chunk count (+-30% from process to process at 4 KiB, 2x from \
         iteration to iteration) is the same for both sides. The exact pass's map: {in_run:.3} \
         ({}){}.\n",
        exact_target(in_run),
        match in_run_ratios(&results, "all_passes_unprimed", GUEST_CASE, "map", "exact") {
            v if v.is_empty() => String::new(),
            v => format!(
                "; without the primer iteration after each probe switch {:.3}",
                median(v)
            ),
        }
    );
    md += &in_run_table(&results, GUEST_CASE, &["map", "unmap", "mmap"]);
    let _ = writeln!(
        md,
        "\nPer mechanism: `exact_kprobes` vs `exact_pass` are the same accounting by kprobe/kretprobe or by \
         fentry/fexit (vmlinux rows; aya 0.14 cannot attach fentry to module functions, so those stay kprobes). \
         doctor on this kernel: fentry {}.\n",
        match fentry["ok"].as_bool() {
            Some(true) => "loads",
            Some(false) => "does not load",
            None => "unknown",
        }
    );
    for f in marker("F") {
        let _ = writeln!(md, "- bpftrace {} failed in round {}: {}", f[1], f[2], f[3..].join(" "));
    }
    for k in marker("K") {
        let _ = writeln!(
            md,
            "- bpftrace {} round {} did not stop on SIGINT and was killed: {}",
            k[1],
            k[2],
            k[3..].join(" ")
        );
    }
    for h in marker("H") {
        let _ = writeln!(
            md,
            "- dmaprof run {} round {} hung (no progress for 300 s; each thread's kernel stack is in the console \
             log), was killed and run once more: {}",
            h[1],
            h[2],
            h[3..].join(" ")
        );
    }
    for e in marker("E") {
        let _ = writeln!(
            md,
            "- dmaprof run {} round {} exited {}: {}",
            e[1],
            e[2],
            e[3],
            e[4..].join(" ")
        );
    }

    // Start-up and memory.
    let starts: Vec<(f64, f64)> = results
        .get("exact_pass")
        .map(|r| {
            r.values()
                .map(|r| {
                    let t = &r["timing"];
                    let f = |k: &str| t[k].as_f64().unwrap_or(f64::NAN) / 1e6;
                    (f("start_to_attached_ns"), f("attach_ns"))
                })
                .collect()
        })
        .unwrap_or_default();
    let bt_ready: BTreeMap<String, Vec<f64>> = marker("T").into_iter().fold(BTreeMap::new(), |mut m, t| {
        if let Some(ms) = t.get(3).and_then(|v| v.parse().ok()) {
            m.entry(t[1].clone()).or_default().push(ms);
        }
        m
    });
    let _ = writeln!(
        md,
        "\n## Start-up (guest)\n\n| tool | time to all probes attached (ms, median) |\n|---|---|\n\
         | dmaprof exact pass, process start to attached | {} |\n\
         | dmaprof: loading the BPF object and attaching ({} probe-table functions, tracepoints, sampler) | {} |",
        ms_or_not_run(median(starts.iter().map(|(s, _)| *s).collect())),
        functions.len(),
        ms_or_not_run(median(starts.iter().map(|(_, a)| *a).collect()))
    );
    for (name, ms) in &bt_ready {
        let _ = writeln!(
            md,
            "| {name}: start to BEGIN (compiles with LLVM, attaches) | {:.0} |",
            median(ms.clone())
        );
    }
    let rss = fs::read_to_string(dir.join("rss.json"))
        .ok()
        .and_then(|t| serde_json::from_str::<Value>(&t).ok());
    match rss.as_ref().and_then(|r| r["timing"]["peak_rss_kib"].as_u64()) {
        Some(kib) => {
            let buffer_kib = args.rss_size.bytes() >> 10;
            let _ = writeln!(
                md,
                "\n## Memory\n\nPeak RSS (VmHWM) of dmaprof during a {} `vfio_type1_iommu_anonymous.populate` run \
                 (all probes): {:.1} MiB, of which the populated workload buffer is {:.1} MiB: dmaprof's own \
                 peak is about {:.1} MiB.\n",
                args.rss_size,
                kib as f64 / 1024.0,
                buffer_kib as f64 / 1024.0,
                kib.saturating_sub(buffer_kib) as f64 / 1024.0
            );
        }
        None => md += "\n## Memory\n\nThe 1 GiB run produced no report (see the console above).\n",
    }
    Ok(md)
}

/// The longest a bench boot may take before it counts as hung, at the least.
const BOOT_TIMEOUT: Duration = Duration::from_secs(2400);

/// What one configuration's run in one round may take under TCG, on average (a 64 MiB round of
/// `untraced` and `all_passes` with 5 iterations took 36 s).
const RUN_ALLOWANCE: Duration = Duration::from_secs(30);

/// The time limit of the bench boot: [`BOOT_TIMEOUT`], or more where `rounds` x `configs`
/// runs need it.
fn bench_timeout(rounds: u32, configs: usize) -> Duration {
    BOOT_TIMEOUT.max(RUN_ALLOWANCE * rounds * configs as u32)
}

/// Boots `kernel` with `script` and returns the console; the guest's /out lands in `dir`.
#[allow(clippy::too_many_arguments)]
fn boot(
    kernel: &kernel::Kernel,
    init: &Path,
    dmaprof: &Path,
    host_files: Vec<PathBuf>,
    script: String,
    mem: ByteSize,
    dir: &Path,
    timeout: Duration,
) -> Result<Vec<String>> {
    let plan = Plan {
        kernel,
        init,
        dmaprof: Some(dmaprof),
        payload: Payload::Shell(script),
        mem,
        smp: 2,
        hugepages_1g: 0,
        hugepages_2m: 0,
        append: "",
        clock: super::Clock::Real,
        timeout,
        // The console (progress lines R/T/E/F) goes to stderr: a long boot shows where it is.
        echo: true,
        host_files,
        overlays: Vec::new(),
    };
    // A guest that stops making progress as a whole (no console line before the deadline, or
    // a stall the kernel reports) is killed and booted once more.
    let outcome = match execute(plan.clone()) {
        Err(e) if matches!(e.kind, FailKind::Timeout | FailKind::Stall) => {
            eprintln!("xtask: bench: the guest hung ({}); booting it once more", e.message);
            execute(plan)
        }
        other => other,
    }
    .map_err(|e| anyhow::anyhow!(e.message))?;
    if let Some(archive) = &outcome.archive {
        unpack_archive(archive, dir)?;
    }
    if outcome.exit_status != 0 {
        bail!("bench guest exited with {}", outcome.exit_status);
    }
    Ok(outcome.console)
}

/// Why bpftrace never said READY (with its log).
#[derive(Debug, thiserror::Error)]
enum NotReady {
    /// It ended first.
    #[error("exited ({0}) before READY: {1}")]
    Exited(std::process::ExitStatus, String),
    /// The limit passed.
    #[error("no READY after {0} s: {1}")]
    Timeout(f64, String),
}

/// Waits until bpftrace's log (its stdout) shows READY (its BEGIN ran: every probe attached);
/// returns how long that took, or why it never came (it exited, or `limit` passed).
fn wait_ready(child: &mut std::process::Child, log: &Path, limit: Duration) -> Result<Duration, NotReady> {
    let started = Instant::now();
    loop {
        let text = fs::read_to_string(log).unwrap_or_default();
        if text.contains("READY") {
            return Ok(started.elapsed());
        }
        if let Ok(Some(status)) = child.try_wait() {
            return Err(NotReady::Exited(status, text.trim().to_owned()));
        }
        if started.elapsed() > limit {
            return Err(NotReady::Timeout(limit.as_secs_f64(), text.trim().to_owned()));
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// Host part: sampling-only dmaprof against `bpftrace profile:hz:4999` (the host has no kprobes).
fn host(args: &BenchArgs) -> Result<String> {
    let dmaprof = build_release()?;
    let dir = cache_dir()?.join("bench/host");
    let _ = fs::remove_dir_all(&dir);
    fs::create_dir_all(&dir)?;
    let script = dir.join("profile.bt");
    fs::write(&script, profile_script())?;
    let mut results: Results = BTreeMap::new();
    let mut bt_ready = Vec::new();
    let mut notes = Vec::new();
    let variants: Vec<String> = HOST_CASES.iter().map(|c| format!("-v{c}")).collect();
    for round in 0..args.rounds {
        let k = round as usize % HOST_CONFIGS.len();
        for c in HOST_CONFIGS[k..].iter().chain(&HOST_CONFIGS[..k]) {
            let out = dir.join(format!("{}-{round}", c.name));
            let mut cmd = Command::new(&dmaprof);
            cmd.args(["run", "--json", "-b", &args.host_size.bytes().to_string(), "-n", "3"])
                .args(["--traced-iterations", "3"])
                .args(&variants)
                .arg("-o")
                .arg(&out)
                .stdout(Stdio::null())
                .stderr(Stdio::piped());
            let mut tracer = None;
            match c.dmaprof {
                Some(opts) => {
                    cmd.args(opts.split_whitespace());
                }
                None => {
                    cmd.arg("--no-trace");
                    let log = dir.join(format!("{}-{round}.bt", c.name));
                    let mut child = Command::new("bpftrace")
                        .arg(&script)
                        .stdout(fs::File::create(&log)?)
                        .stderr(Stdio::null())
                        .spawn()
                        .context("starting bpftrace")?;
                    match wait_ready(&mut child, &log, Duration::from_secs(120)) {
                        Ok(took) => bt_ready.push(took.as_secs_f64() * 1e3),
                        Err(why) => {
                            // Not attached: a run now would be measured as traced by bpftrace.
                            notes.push(format!("bpftrace {} round {round}: {why}", c.name));
                            let _ = child.kill();
                            let _ = child.wait();
                            continue;
                        }
                    }
                    tracer = Some(child);
                }
            }
            let o = cmd.output().context("running dmaprof")?;
            if let Some(mut t) = tracer {
                // SAFETY: signalling our own child process.
                unsafe { libc::kill(t.id() as i32, libc::SIGINT) };
                let _ = t.wait();
            }
            if !o.status.success() {
                notes.push(format!(
                    "{} round {round}: dmaprof exited {}: {}",
                    c.name,
                    o.status,
                    String::from_utf8_lossy(&o.stderr).lines().last().unwrap_or_default()
                ));
                continue;
            }
            let v: Value = serde_json::from_str(&fs::read_to_string(out.join("report.json"))?)?;
            results.entry(c.name).or_default().insert(round, v);
        }
    }
    let release = results
        .values()
        .flat_map(|r| r.values())
        .find_map(|r| r["kernel"]["release"].as_str().map(str::to_owned))
        .unwrap_or_default();
    let mut md = format!(
        "\n## Sampling overhead on the host\n\nLinux {release} (this machine: no kprobes, so bpftrace is compared on \
         sampling only), {} per case, 3 iterations per run.\n",
        args.host_size
    );
    for case in HOST_CASES {
        let _ = writeln!(md, "\n`{case}`:\n");
        let phases: &[&str] = if case.ends_with(".touch") {
            &["mmap", "touch", "munmap"]
        } else {
            &["mmap", "munmap"]
        };
        md += &overhead_table(&results, HOST_CONFIGS, case, phases);
    }
    let starts: Vec<f64> = results
        .get("sampled_pass")
        .map(|r| {
            r.values()
                .map(|r| {
                    let t = &r["timing"];
                    t["start_to_attached_ns"].as_f64().unwrap_or(f64::NAN) / 1e6
                })
                .collect()
        })
        .unwrap_or_default();
    let _ = writeln!(
        md,
        "\nStart-up on the host: dmaprof (sampled pass) {:.0} ms from process start to attached, \
         bpftrace {:.0} ms to BEGIN (medians).",
        median(starts),
        median(bt_ready)
    );
    for n in notes {
        let _ = writeln!(md, "- {n}");
    }
    Ok(md)
}

#[cfg(test)]
mod tests {
    use std::os::unix::fs::PermissionsExt as _;

    use super::*;

    /// A scratch directory with executable `name`s holding `body` (sh scripts).
    fn fake_bin(dir: &Path, name: &str, body: &str) {
        let path = dir.join(name);
        fs::write(&path, format!("#!/bin/sh\n{body}\n")).unwrap();
        fs::set_permissions(&path, fs::Permissions::from_mode(0o755)).unwrap();
    }

    /// Runs the guest's `bt` with the host's sh against a fake bpftrace; returns its stdout.
    fn run_bt(case: &str, bpftrace: &str) -> String {
        let dir = std::env::temp_dir().join(format!("xtask-bt-{}-{case}", std::process::id()));
        let _ = fs::remove_dir_all(&dir);
        let (bin, tmp, out) = (dir.join("bin"), dir.join("tmp"), dir.join("out"));
        for d in [&bin, &tmp, &out] {
            fs::create_dir_all(d).unwrap();
        }
        fake_bin(&bin, "bpftrace", bpftrace);
        fake_bin(&bin, "usleep", "sleep 0.02");
        let script = format!(
            "up() {{ echo 100; }}\none() {{ echo \"ONE $1 $2 $3\"; }}\n{}bt bt_x 0 /tmp/x.bt\n",
            bt_function(5, &tmp.to_string_lossy(), &out.to_string_lossy())
        );
        let path = format!("{}:{}", bin.display(), std::env::var("PATH").unwrap_or_default());
        let o = Command::new("sh")
            .arg("-c")
            .arg(&script)
            .env("PATH", path)
            .output()
            .unwrap();
        let _ = fs::remove_dir_all(&dir);
        String::from_utf8_lossy(&o.stdout).into_owned()
    }

    #[test]
    fn bt_measures_only_an_attached_bpftrace() {
        // Background jobs of sh ignore SIGINT, so the fake ends by itself.
        let out = run_bt("ready", "echo READY; sleep 0.3");
        assert!(
            out.contains("T bt_x 0 ") && out.contains("ONE bt_x 0 --no-trace"),
            "{out}"
        );
        assert!(!out.contains("F bt_x"), "{out}");

        let out = run_bt("silent", "exec sleep 10");
        assert!(out.contains("F bt_x 0 no READY after 0.5 s"), "{out}");
        assert!(!out.contains("ONE") && !out.contains("T bt_x"), "{out}");

        // A background job starts with SIGINT ignored: this one never installs a handler.
        let out = run_bt("deaf", "echo READY; exec sleep 30");
        assert!(
            out.contains("K bt_x 0 bpftrace still running 0.5 s after SIGINT"),
            "{out}"
        );

        let out = run_bt("dies", "echo 'ERROR: cannot attach'; exit 1");
        assert!(out.contains("F bt_x 0 ERROR: cannot attach"), "{out}");
        assert!(!out.contains("ONE") && !out.contains("no READY"), "{out}");
    }

    #[test]
    fn the_bench_boot_may_take_as_long_as_its_rounds_need() {
        assert_eq!(bench_timeout(5, 8), BOOT_TIMEOUT);
        assert_eq!(bench_timeout(160, 2), Duration::from_secs(9600));
    }

    #[test]
    fn host_waits_for_ready_or_says_why_not() {
        let dir = std::env::temp_dir().join(format!("xtask-ready-{}", std::process::id()));
        fs::create_dir_all(&dir).unwrap();
        let start = |body: &str, name: &str| {
            let log = dir.join(name);
            let child = Command::new("sh")
                .args(["-c", body])
                .stdout(fs::File::create(&log).unwrap())
                .spawn()
                .unwrap();
            (child, log)
        };
        let (mut c, log) = start("echo READY; sleep 0.2", "ready");
        assert!(wait_ready(&mut c, &log, Duration::from_secs(5)).is_ok());
        let _ = c.wait();
        let (mut c, log) = start("exec sleep 10", "silent");
        let e = wait_ready(&mut c, &log, Duration::from_millis(200)).unwrap_err();
        assert!(e.to_string().contains("no READY"), "{e}");
        let _ = c.kill();
        let _ = c.wait();
        let (mut c, log) = start("echo oops; exit 3", "dies");
        let e = wait_ready(&mut c, &log, Duration::from_secs(5)).unwrap_err();
        let e = e.to_string();
        assert!(e.contains("exited") && e.contains("oops"), "{e}");
        let _ = fs::remove_dir_all(&dir);
    }

    #[test]
    fn bootstrap_intervals_narrow_with_rounds_and_say_when_one_is_inside() {
        assert_eq!(bootstrap_ci(&[1.1; 5]), (1.1, 1.1));
        let few = [0.95, 1.02, 1.10, 0.99, 1.06];
        assert!(spread(&few).ends_with(", not significant)"), "{}", spread(&few));
        let many: Vec<f64> = few.iter().cycle().take(40).map(|r| r + 0.2).collect();
        let (a, b) = bootstrap_ci(&few);
        let (c, d) = bootstrap_ci(&many);
        assert!(d - c < b - a, "{c}-{d} not narrower than {a}-{b}");
        assert!(!spread(&many).contains("not significant"), "{}", spread(&many));
    }

    #[test]
    fn sizes_parse_as_byte_sizes() {
        #[derive(clap::Parser)]
        struct Cli {
            #[command(flatten)]
            bench: BenchArgs,
        }
        let cli = <Cli as clap::Parser>::try_parse_from(["bench", "--size", "32M", "--rss-size", "2G"]).unwrap();
        assert_eq!(cli.bench.size.bytes(), 32 << 20);
        assert_eq!(cli.bench.rss_size.bytes(), 2 << 30);
        assert_eq!(cli.bench.host_size.bytes(), 512 << 20);
        assert!(<Cli as clap::Parser>::try_parse_from(["bench", "--size", "1.5G"]).is_err());
    }
}
