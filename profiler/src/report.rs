//! The report: `report.json` (schema `dmaprof.report.v1`) and the tables on stdout.
use std::{collections::BTreeMap, fmt::Write as _};

use serde::{Deserialize, Serialize};

use crate::{attribution::CATEGORIES, capabilities::Capability, probes::ProbeStatus};

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
    pub capabilities: BTreeMap<String, Capability>,
    /// Run options.
    pub config: Config,
    /// Cases that ran.
    pub cases: Vec<CaseReport>,
    /// Cases that were selected but could not run here, with why.
    pub skipped: Vec<Skipped>,
    /// Cases that ran and failed, with the error.
    #[serde(default)]
    pub failed: Vec<Failed>,
    /// Which probes attached (per run; the same for every case).
    #[serde(default)]
    pub probes: Vec<ProbeStatusRecord>,
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
    /// From process start to every requested probe attached (includes the untraced reference).
    pub start_to_attached_ns: u64,
    /// The untraced reference iterations inside that span (workload time, not start-up).
    pub reference_ns: u64,
    /// Loading the BPF object and attaching the probes.
    pub attach_ns: u64,
    /// Peak resident set of the dmaprof process (VmHWM), the workload's buffers included.
    pub peak_rss_kib: u64,
}

/// Kernel facts.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct KernelInfo {
    /// uname -r.
    pub release: String,
    /// uname -v.
    #[serde(default)]
    pub version: String,
    /// uname -m.
    #[serde(default)]
    pub machine: String,
    /// Kernel changes that move DMA-map time, as seen in /proc/kallsyms.
    #[serde(default)]
    pub features: Vec<KernelFeature>,
}

/// One kernel change and whether this kernel has it.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq, Eq)]
pub struct KernelFeature {
    /// Short id, e.g. `memfd_pin_folios`.
    pub id: String,
    /// Whether the kernel shows it (None: /proc/kallsyms unreadable).
    pub present: Option<bool>,
    /// The symbol test used.
    pub evidence: String,
    /// First mainline release and the commit (backports can bring it earlier).
    pub since: String,
    /// What it changes for a DMA map.
    pub effect: String,
}

/// Run options.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct Config {
    /// Buffer size per case.
    pub size_bytes: u64,
    /// Traced iterations per case.
    pub iterations: u32,
    /// Stack sampling frequency.
    pub freq_hz: u64,
    /// The -v patterns.
    #[serde(default)]
    pub variants: Vec<String>,
    /// The prefaults selected.
    #[serde(default)]
    pub prefaults: Vec<String>,
    /// False with --no-trace: no probe was loaded.
    #[serde(default = "yes")]
    pub traced: bool,
    /// The probe mechanisms requested (`--probes`).
    #[serde(default)]
    pub probes: Vec<crate::probes::Mechanism>,
}

fn yes() -> bool {
    true
}

/// A probe's attachment, as recorded in the report.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct ProbeStatusRecord {
    /// Function or event.
    pub function: String,
    /// Mechanism.
    pub mechanism: String,
    /// Attached or not.
    pub attached: bool,
    /// Why not.
    pub error: Option<String>,
}

impl From<&ProbeStatus> for ProbeStatusRecord {
    fn from(p: &ProbeStatus) -> Self {
        Self {
            function: p.function.clone(),
            mechanism: p.mechanism.to_owned(),
            attached: p.attached,
            error: p.error.clone(),
        }
    }
}

/// One case.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct CaseReport {
    /// `<mode>_<backing>.<prefault>`.
    pub name: String,
    /// IOMMU mode name.
    pub iommu_mode: String,
    /// Backing name.
    pub backing: String,
    /// Prefault name.
    pub prefault: String,
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

/// Sampled-stack breakdown of a phase.
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
pub struct Sampled {
    /// Samples taken (all iterations).
    pub samples: u64,
    /// Samples lost (map full, stack collisions).
    #[serde(default)]
    pub lost: u64,
    /// Share of samples per category (sums to 1 when samples > 0).
    pub categories: BTreeMap<String, f64>,
}

/// Counters of a phase: medians over iterations (lost events: the total).
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
pub struct Counters {
    /// CPU page faults from the exceptions:page_fault_user tracepoint.
    pub faults: u64,
    /// Minor faults from getrusage (also counts GUP-driven faults).
    #[serde(default)]
    pub minor_faults: u64,
    /// Major faults from getrusage.
    #[serde(default)]
    pub major_faults: u64,
    /// Syscalls completed (raw_syscalls tracepoints).
    #[serde(default)]
    pub syscalls: u64,
    /// Syscall exits without a matching entry (lost events).
    #[serde(default)]
    pub unbalanced: u64,
}

/// One phase of one case.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct PhaseReport {
    /// Phase name.
    pub name: String,
    /// Wall time per iteration (user-space monotonic clock).
    pub wall_ns: Stats,
    /// Time inside syscalls per iteration, measured in the kernel (raw_syscalls enter/exit).
    #[serde(default)]
    pub kernel_ns: Stats,
    /// Throughput at the median wall time.
    #[serde(default)]
    pub gib_per_s: f64,
    /// Sampled-stack category shares.
    pub sampled: Sampled,
    /// Exact entry/exit breakdown.
    #[serde(default)]
    pub exact: Exact,
    /// Wall time of one untraced iteration (no probe loaded), when one ran.
    #[serde(default)]
    pub untraced_ns: Option<u64>,
    /// Traced median / untraced: what observing cost this phase.
    #[serde(default)]
    pub overhead: Option<f64>,
    /// Counters.
    pub counters: Counters,
    /// Folded-stack file, relative to the report's directory.
    pub folded: String,
    /// SVG flamegraph, relative to the report's directory.
    pub flamegraph: String,
}

/// The exact (entry/exit) breakdown of a phase, for its median iteration: the categories plus
/// `unattributed_ns` add up to that iteration's `wall_ns`.
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
pub struct Exact {
    /// Which iteration (0-based): the one with the median wall time.
    pub iteration: u32,
    /// Its wall time.
    pub wall_ns: u64,
    /// Its time inside syscalls.
    pub kernel_ns: u64,
    /// Exclusive time per category; `other` includes syscall time outside every probed row.
    pub categories: BTreeMap<String, u64>,
    /// wall - sum(categories): user space, exception entry, and whatever no probe saw.
    pub unattributed_ns: i64,
    /// Per probed function.
    pub rows: Vec<ExactRow>,
    /// Calls not accounted (stack overflow, unmatched returns); non-zero marks the numbers.
    #[serde(default)]
    pub lost_events: u64,
}

/// One probed function in one phase.
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
pub struct ExactRow {
    /// Kernel function.
    pub function: String,
    /// Category of its exclusive time.
    pub category: String,
    /// kprobe, fentry...
    pub mechanism: String,
    /// Completed calls.
    pub calls: u64,
    /// Entry-to-return time.
    pub inclusive_ns: u64,
    /// Minus probed callees.
    pub exclusive_ns: u64,
    /// Sum of the row's size argument.
    #[serde(default)]
    pub amount: u64,
    /// Its unit (pages, bytes), if any.
    #[serde(default)]
    pub unit: Option<String>,
}

/// A case that ran and failed.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct Failed {
    /// Case name.
    pub name: String,
    /// The error, with errno and meaning.
    pub error: String,
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
        reason: String,
    },
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
pub fn parse(text: &str) -> Result<Report, String> {
    let value: serde_json::Value = serde_json::from_str(text).map_err(|e| format!("invalid JSON ({e})"))?;
    match value.get("schema").and_then(|s| s.as_str()) {
        Some(SCHEMA) => {}
        Some(other) => return Err(format!("schema is `{other}`, this dmaprof reads `{SCHEMA}`")),
        None => return Err(format!("no \"schema\" field (expected `{SCHEMA}`)")),
    }
    serde_json::from_value(value).map_err(|e| format!("does not match {SCHEMA}: {e}"))
}

fn ms(ns: u64) -> String {
    let ms = ns as f64 / 1e6;
    if ms >= 100.0 {
        format!("{ms:.0}")
    } else if ms >= 1.0 {
        format!("{ms:.2}")
    } else {
        format!("{ms:.3}")
    }
}

/// Renders the human-readable tables: one per case.
pub fn render_table(report: &Report) -> String {
    let mut out = String::new();
    let _ = writeln!(
        out,
        "dmaprof on Linux {} ({}), {} per case, {} iterations, sampling at {} Hz{}",
        report.kernel.release,
        report.kernel.machine,
        crate::size::HumanSize(report.config.size_bytes),
        report.config.iterations,
        report.config.freq_hz,
        if report.partial {
            " -- PARTIAL (interrupted)"
        } else {
            ""
        }
    );
    let with = |p: bool| {
        let ids: Vec<&str> = report
            .kernel
            .features
            .iter()
            .filter(|f| f.present == Some(p))
            .map(|f| f.id.as_str())
            .collect();
        if ids.is_empty() {
            "none".to_owned()
        } else {
            ids.join(", ")
        }
    };
    if !report.kernel.features.is_empty() {
        let _ = writeln!(out, "kernel has: {}; lacks: {}", with(true), with(false));
    }
    let cat_names: Vec<&str> = CATEGORIES.iter().map(|c| c.name()).collect();
    for case in &report.cases {
        match &case.map_ioctl {
            Some(ioctl) => {
                let _ = writeln!(out, "\n{} (map: {ioctl})", case.name);
            }
            None => {
                let _ = writeln!(out, "\n{}", case.name);
            }
        }
        let _ = write!(
            out,
            "  {:<13}{:>10}{:>10}{:>10}{:>8}{:>8}{:>10}{:>9}{:>8}",
            "phase", "median ms", "min ms", "max ms", "GiB/s", "traced", "kernel ms", "faults", "samples"
        );
        for c in &cat_names {
            let _ = write!(out, " {:>9}", short(c));
        }
        out.push('\n');
        for p in &case.phases {
            // Throughput of a phase that takes microseconds says nothing about memory.
            let gib = if p.gib_per_s > 0.0 && p.wall_ns.median >= 100_000 {
                format!("{:.2}", p.gib_per_s)
            } else {
                "-".into()
            };
            let _ = write!(
                out,
                "  {:<13}{:>10}{:>10}{:>10}{:>8}{:>8}{:>10}{:>9}{:>8}",
                p.name,
                ms(p.wall_ns.median),
                ms(p.wall_ns.min),
                ms(p.wall_ns.max),
                gib,
                p.overhead.map_or("-".into(), |o| format!("x{o:.2}")),
                ms(p.kernel_ns.median),
                p.counters.faults,
                if p.sampled.lost > 0 {
                    format!("{}*", p.sampled.samples)
                } else {
                    p.sampled.samples.to_string()
                }
            );
            for c in &cat_names {
                let share = p.sampled.categories.get(*c).copied().unwrap_or(0.0);
                let cell = if p.sampled.samples == 0 {
                    "-".to_owned()
                } else {
                    format!("{:.0}%", share * 100.0)
                };
                let _ = write!(out, " {cell:>9}");
            }
            out.push('\n');
            if !p.exact.rows.is_empty() && p.exact.wall_ns > 0 {
                // The same categories measured exactly, as shares of the median iteration's
                // wall time; the `user` column holds what no probe saw (unattributed).
                let _ = write!(out, "  {:<13}{:>10}{:>63}", "  exact", ms(p.exact.wall_ns), "");
                let wall = p.exact.wall_ns as f64;
                for c in &cat_names {
                    let v = if *c == "user" {
                        p.exact.unattributed_ns as f64
                    } else {
                        p.exact.categories.get(*c).copied().unwrap_or(0) as f64
                    };
                    let _ = write!(out, " {:>9}", format!("{:.0}%", v / wall * 100.0));
                }
                out.push('\n');
            }
        }
    }
    let lost: u64 = report
        .cases
        .iter()
        .flat_map(|c| &c.phases)
        .map(|p| p.sampled.lost + p.exact.lost_events)
        .sum();
    if lost > 0 {
        let _ = writeln!(
            out,
            "\n* {lost} events lost (sample map full, stack collisions, or call stack overflow): \
             the marked numbers cover only what was kept"
        );
    }
    if !report.skipped.is_empty() {
        let _ = writeln!(out, "\nskipped:");
        for s in &report.skipped {
            let _ = writeln!(out, "  {:<40} {}", s.name, s.reason);
        }
    }
    if !report.failed.is_empty() {
        let _ = writeln!(out, "\nFAILED:");
        for f in &report.failed {
            let _ = writeln!(out, "  {:<40} {}", f.name, f.error);
        }
    }
    // Group by reason: on a kernel without kprobes every row fails the same way.
    let mut by_reason: Vec<(&str, Vec<&str>)> = Vec::new();
    for p in report
        .probes
        .iter()
        .filter(|p| !p.attached && p.error.as_deref() != Some(crate::probes::NOT_REQUESTED))
    {
        let reason = p.error.as_deref().unwrap_or("");
        match by_reason.iter_mut().find(|(r, _)| *r == reason) {
            Some((_, names)) => names.push(&p.function),
            None => by_reason.push((reason, vec![&p.function])),
        }
    }
    let off: Vec<String> = crate::probes::Mechanism::ALL
        .iter()
        .filter(|m| report.config.traced && !report.config.probes.is_empty() && !report.config.probes.contains(m))
        .map(|m| format!("{m:?}").to_lowercase())
        .collect();
    if !off.is_empty() {
        let _ = writeln!(out, "\nprobes off by request (--probes): {}", off.join(", "));
    }
    if !by_reason.is_empty() {
        let _ = writeln!(out, "\nprobes not attached (the exact breakdown lacks their rows):");
        for (reason, names) in by_reason {
            let _ = writeln!(out, "  {} ({}): {reason}", names.join(", "), names.len());
        }
    }
    out
}

fn short(category: &str) -> &str {
    match category {
        "iommu_map" => "iommu_map",
        "iommu_flush" => "iotlb",
        "accounting" => "acct",
        other => other,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

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
    fn schema_errors_are_clear() {
        assert!(parse("{").unwrap_err().contains("invalid JSON"));
        assert!(parse(r#"{"schema":"other.v9"}"#).unwrap_err().contains("other.v9"));
        assert!(parse(r#"{"cases":[]}"#).unwrap_err().contains("no \"schema\""));
        assert!(
            parse(r#"{"schema":"dmaprof.report.v1"}"#)
                .unwrap_err()
                .contains("does not match")
        );
    }
}

/// One phase compared between two runs.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct PhaseDiff {
    /// Case name.
    pub case: String,
    /// Phase name.
    pub phase: String,
    /// Median wall time before.
    pub before_ns: u64,
    /// Median wall time after.
    pub after_ns: u64,
    /// after - before.
    pub delta_ns: i64,
    /// Relative change in percent (0 when before is 0).
    pub delta_pct: f64,
    /// Exact ns per category: (before, after, delta).
    pub exact: BTreeMap<String, (u64, u64, i64)>,
    /// Sampled share per category, change in percentage points.
    pub sampled_pp: BTreeMap<String, f64>,
}

/// Two runs compared case by case and phase by phase.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct RunDiff {
    /// Kernel release before / after.
    pub kernels: (String, String),
    /// Phases present in both.
    pub phases: Vec<PhaseDiff>,
    /// Cases only in the first run.
    pub only_before: Vec<String>,
    /// Cases only in the second run.
    pub only_after: Vec<String>,
}

/// Compares two reports.
pub fn diff(before: &Report, after: &Report) -> RunDiff {
    let mut phases = Vec::new();
    for ca in &before.cases {
        let Some(cb) = after.cases.iter().find(|c| c.name == ca.name) else {
            continue;
        };
        for pa in &ca.phases {
            let Some(pb) = cb.phases.iter().find(|p| p.name == pa.name) else {
                continue;
            };
            let (b, a) = (pa.wall_ns.median, pb.wall_ns.median);
            let delta = a as i64 - b as i64;
            let keys: std::collections::BTreeSet<&String> =
                pa.exact.categories.keys().chain(pb.exact.categories.keys()).collect();
            let exact = keys
                .into_iter()
                .map(|k| {
                    let x = pa.exact.categories.get(k).copied().unwrap_or(0);
                    let y = pb.exact.categories.get(k).copied().unwrap_or(0);
                    (k.clone(), (x, y, y as i64 - x as i64))
                })
                .collect();
            let sampled_pp = CATEGORIES
                .iter()
                .map(|c| {
                    let x = pa.sampled.categories.get(c.name()).copied().unwrap_or(0.0);
                    let y = pb.sampled.categories.get(c.name()).copied().unwrap_or(0.0);
                    (c.name().to_owned(), (y - x) * 100.0)
                })
                .collect();
            phases.push(PhaseDiff {
                case: ca.name.clone(),
                phase: pa.name.clone(),
                before_ns: b,
                after_ns: a,
                delta_ns: delta,
                delta_pct: if b == 0 { 0.0 } else { delta as f64 / b as f64 * 100.0 },
                exact,
                sampled_pp,
            });
        }
    }
    let names = |r: &Report| r.cases.iter().map(|c| c.name.clone()).collect::<Vec<_>>();
    let (nb, na) = (names(before), names(after));
    RunDiff {
        kernels: (before.kernel.release.clone(), after.kernel.release.clone()),
        only_before: nb.iter().filter(|n| !na.contains(n)).cloned().collect(),
        only_after: na.iter().filter(|n| !nb.contains(n)).cloned().collect(),
        phases,
    }
}

/// The diff as a table.
pub fn render_diff(d: &RunDiff) -> String {
    let mut out = String::new();
    let _ = writeln!(out, "before: Linux {}   after: Linux {}", d.kernels.0, d.kernels.1);
    let mut case = "";
    for p in &d.phases {
        if p.case != case {
            case = &p.case;
            let _ = writeln!(
                out,
                "\n{case}\n  {:<13}{:>12}{:>12}{:>12}{:>9}  exact category deltas (ms)",
                "phase", "before ms", "after ms", "delta ms", "delta"
            );
        }
        let cats: Vec<String> = p
            .exact
            .iter()
            .filter(|(_, (_, _, d))| *d != 0)
            .map(|(k, (_, _, d))| format!("{k} {:+.3}", *d as f64 / 1e6))
            .collect();
        let _ = writeln!(
            out,
            "  {:<13}{:>12}{:>12}{:>12}{:>8.1}%  {}",
            p.phase,
            ms(p.before_ns),
            ms(p.after_ns),
            format!("{:+.3}", p.delta_ns as f64 / 1e6),
            p.delta_pct,
            cats.join(", ")
        );
    }
    for n in &d.only_before {
        let _ = writeln!(out, "only in the first run: {n}");
    }
    for n in &d.only_after {
        let _ = writeln!(out, "only in the second run: {n}");
    }
    out
}
