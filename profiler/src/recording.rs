//! The `record` report (`dmaprof.record.v1`): every DMA map and unmap ioctl another process
//! made, and what they add up to per ioctl kind. Pure functions from the BPF side's records;
//! [`crate::record`] gathers them, [`render`] prints them.
use std::{collections::BTreeMap, path::Path};

use serde::{Deserialize, Serialize};

use crate::{
    abi::{DmaCall, MAX_CATEGORIES},
    category::{CATEGORIES, Category},
    dma::DmaIoctl,
    facts::KernelInfo,
    probes::ProbeStatus,
    report::{ParseError, ReadError},
};

/// The schema name of a `record` report.
pub const SCHEMA: &str = "dmaprof.record.v1";

/// How many calls `top` keeps.
pub const TOP_CALLS: usize = 10;

/// What was recorded.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Process {
    /// The processes watched from the start (`-p`, or the command's pid).
    pub pids: Vec<u32>,
    /// The command `record` started (empty with `-p`).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub command: Vec<String>,
    /// The command's exit code (None: not started by `record`, killed by a signal or still
    /// running when the recording stopped).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub exit_code: Option<i32>,
}

/// One recorded ioctl.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Call {
    /// Process id.
    pub pid: u32,
    /// Thread id.
    pub tid: u32,
    /// Start, from the start of the recording.
    pub start_ns: u64,
    /// Which ioctl.
    pub kind: DmaIoctl,
    /// IOVA from the argument struct.
    pub iova: u64,
    /// Size from the argument struct, in bytes.
    pub size: u64,
    /// Syscall entry to exit.
    pub duration_ns: u64,
    /// The syscall's return value (negative: -errno).
    pub ret: i64,
    /// Exclusive time of the probed kernel functions inside the call, by category (absent
    /// when no probe-table row was attached).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub categories: Option<BTreeMap<Category, u64>>,
    /// Probed calls inside it that could not be accounted (nested too deep, unbalanced).
    #[serde(default, skip_serializing_if = "is_zero")]
    pub unaccounted: u32,
}

fn is_zero(n: &u32) -> bool {
    *n == 0
}

impl Call {
    /// The report's call for a BPF record; None for a request number that is not a DMA ioctl.
    /// `origin_ns` is the recording's start on the same clock; `exact` says whether any row
    /// was attached (so that categories mean something).
    pub fn of(raw: &DmaCall, origin_ns: u64, exact: bool) -> Option<Self> {
        let categories = exact.then(|| {
            CATEGORIES
                .iter()
                .enumerate()
                .take(MAX_CATEGORIES)
                .filter(|&(i, _)| raw.category_ns[i] > 0)
                .map(|(i, &c)| (c, raw.category_ns[i]))
                .collect()
        });
        Some(Self {
            pid: raw.tgid,
            tid: raw.tid,
            start_ns: raw.start_ns.saturating_sub(origin_ns),
            kind: DmaIoctl::from_cmd(raw.cmd)?,
            iova: raw.iova,
            size: raw.size,
            duration_ns: raw.duration_ns,
            ret: raw.ret,
            categories,
            unaccounted: raw.unaccounted,
        })
    }

    /// The categories' sum.
    pub fn attributed_ns(&self) -> u64 {
        self.categories.iter().flat_map(|c| c.values()).sum()
    }
}

/// What the calls of one ioctl kind add up to.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct KindSummary {
    /// The ioctl.
    pub kind: DmaIoctl,
    /// Calls.
    pub count: u64,
    /// Calls that returned an error.
    pub failed: u64,
    /// Sum of their durations.
    pub total_ns: u64,
    /// Median duration.
    pub median_ns: u64,
    /// Longest duration.
    pub max_ns: u64,
    /// Sum of the sizes of the calls that succeeded.
    pub bytes: u64,
    /// Categories summed over the calls (absent when not measured).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub categories: Option<BTreeMap<Category, u64>>,
}

/// What the calls of one ioctl kind in one size bucket add up to.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct SizeBucket {
    /// The ioctl.
    pub kind: DmaIoctl,
    /// The bucket: sizes from this power of two up to (not including) twice it.
    pub size_from: u64,
    /// Calls.
    pub count: u64,
    /// Sum of their durations.
    pub total_ns: u64,
    /// Median duration.
    pub median_ns: u64,
}

/// One probed kernel function, summed over every recorded call.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct RowTotal {
    /// The function (a probe-table row).
    pub function: String,
    /// The category its exclusive time counts as.
    pub category: Category,
    /// Completed calls.
    pub calls: u64,
    /// Entry to return, summed.
    pub inclusive_ns: u64,
    /// Less its probed callees.
    pub exclusive_ns: u64,
}

/// A `record` report.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct RecordReport {
    /// Always [`SCHEMA`].
    pub schema: String,
    /// The dmaprof that wrote it.
    pub dmaprof_version: String,
    /// What was watched.
    pub process: Process,
    /// How long the recording lasted.
    pub duration_ns: u64,
    /// Every recorded call, in start order.
    pub calls: Vec<Call>,
    /// Per ioctl kind, in [`DmaIoctl`] order.
    pub by_kind: Vec<KindSummary>,
    /// Per ioctl kind and power-of-two size bucket.
    #[serde(default)]
    pub by_size: Vec<SizeBucket>,
    /// Every call's categories summed (absent when not measured).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub categories: Option<BTreeMap<Category, u64>>,
    /// The longest calls, longest first (at most [`TOP_CALLS`]).
    pub top: Vec<Call>,
    /// Per probed function inside the recorded calls, largest exclusive time first (threads
    /// of one process in calls at once on several CPUs may lose an update here; the per-call
    /// categories are per thread and exact).
    #[serde(default)]
    pub rows: Vec<RowTotal>,
    /// CPU page faults of the watched processes while recorded (`exceptions:page_fault_user`;
    /// absent when it did not attach). Faults GUP takes inside a map are in its categories.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cpu_faults: Option<u64>,
    /// Probed calls that could not be accounted (nested deeper than the BPF stack, or a
    /// return without its entry): the categories undercount by their time.
    #[serde(default)]
    pub unaccounted: u64,
    /// What attached and what did not.
    pub probes: Vec<ProbeStatus>,
    /// The kernel.
    pub kernel: KernelInfo,
    /// The recording was stopped by a signal before the processes ended or the duration
    /// passed.
    pub partial: bool,
    /// Records the ring buffer had no room for (those calls are missing from `calls`).
    pub lost: u64,
    /// The processes' mmap, munmap, madvise and mremap calls while recorded (absent without
    /// the syscall tracepoints): their memory set-up outside the DMA ioctls. Faults they take
    /// on first touch are in `cpu_faults` and in the samples outside the calls.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub memory_syscalls: Option<MemorySyscalls>,
    /// Stack samples of the watched processes (absent when the sampler did not attach).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sampled: Option<RecordSampled>,
}

/// Calls of a set of syscalls and their summed time.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct MemorySyscalls {
    /// Completed calls.
    pub calls: u64,
    /// Entry to exit, summed.
    pub ns: u64,
}

/// Where the watched processes' sampled time went, inside and outside their DMA ioctls; the
/// flamegraphs `in_calls.svg` and `outside.svg` sit next to report.json.
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
pub struct RecordSampled {
    /// The sampling frequency, Hz (per CPU, every CPU).
    pub freq_hz: u64,
    /// Samples taken inside a DMA ioctl of the sampled thread.
    pub in_calls: crate::report::Sampled,
    /// Samples outside them: the processes' own work, their page faults, other syscalls.
    pub outside: crate::report::Sampled,
}

/// The median of `v` (the lower middle of an even count), 0 when empty.
fn median(v: &mut [u64]) -> u64 {
    v.sort_unstable();
    v.get(v.len().saturating_sub(1) / 2).copied().unwrap_or(0)
}

fn add_categories(sum: &mut Option<BTreeMap<Category, u64>>, c: &Option<BTreeMap<Category, u64>>) {
    if let Some(c) = c {
        let sum = sum.get_or_insert_with(BTreeMap::new);
        for (k, v) in c {
            *sum.entry(*k).or_default() += v;
        }
    }
}

/// Per-kind sums of `calls`, kinds in [`DmaIoctl`] order.
pub fn by_kind(calls: &[Call]) -> Vec<KindSummary> {
    let mut kinds: BTreeMap<DmaIoctl, Vec<&Call>> = BTreeMap::new();
    for c in calls {
        kinds.entry(c.kind).or_default().push(c);
    }
    kinds
        .into_iter()
        .map(|(kind, calls)| {
            let mut durations: Vec<u64> = calls.iter().map(|c| c.duration_ns).collect();
            let mut categories = None;
            calls
                .iter()
                .for_each(|c| add_categories(&mut categories, &c.categories));
            KindSummary {
                kind,
                count: calls.len() as u64,
                failed: calls.iter().filter(|c| c.ret < 0).count() as u64,
                total_ns: durations.iter().sum(),
                max_ns: durations.iter().copied().max().unwrap_or(0),
                median_ns: median(&mut durations),
                bytes: calls.iter().filter(|c| c.ret >= 0).map(|c| c.size).sum(),
                categories,
            }
        })
        .collect()
}

/// The power of two at or below `size` (0 for 0).
fn bucket(size: u64) -> u64 {
    if size == 0 { 0 } else { 1 << size.ilog2() }
}

/// Per kind and power-of-two size bucket sums of `calls`, in kind then size order.
pub fn by_size(calls: &[Call]) -> Vec<SizeBucket> {
    let mut buckets: BTreeMap<(DmaIoctl, u64), Vec<u64>> = BTreeMap::new();
    for c in calls {
        buckets.entry((c.kind, bucket(c.size))).or_default().push(c.duration_ns);
    }
    buckets
        .into_iter()
        .map(|((kind, size_from), mut durations)| SizeBucket {
            kind,
            size_from,
            count: durations.len() as u64,
            total_ns: durations.iter().sum(),
            median_ns: median(&mut durations),
        })
        .collect()
}

/// The `n` longest calls, longest first (ties: earlier first).
pub fn top(calls: &[Call], n: usize) -> Vec<Call> {
    let mut sorted: Vec<&Call> = calls.iter().collect();
    sorted.sort_by(|a, b| b.duration_ns.cmp(&a.duration_ns).then(a.start_ns.cmp(&b.start_ns)));
    sorted.into_iter().take(n).cloned().collect()
}

/// Fills the derived parts (`by_kind`, `top`) from `calls`, which it sorts by start.
pub fn summarise(report: &mut RecordReport) {
    report.calls.sort_by_key(|c| (c.start_ns, c.tid));
    report.by_kind = by_kind(&report.calls);
    report.by_size = by_size(&report.calls);
    report.categories = None;
    for c in &report.calls {
        add_categories(&mut report.categories, &c.categories);
    }
    report.top = top(&report.calls, TOP_CALLS);
}

/// The `record` report saved at `path`; None when the file holds something else (a `run`
/// report, or nothing readable: [`crate::report::read`] says what).
pub fn read(path: &Path) -> Option<Result<RecordReport, ReadError>> {
    let text = std::fs::read_to_string(path).ok()?;
    let value: serde_json::Value = serde_json::from_str(&text).ok()?;
    (value.get("schema")?.as_str()? == SCHEMA).then(|| {
        serde_json::from_value(value).map_err(|e| ReadError::Format {
            path: path.display().to_string(),
            reason: ParseError::Shape(e),
        })
    })
}

/// A report as JSON, or as the tables followed by where it was written (`saved`).
pub fn render_as(r: &RecordReport, json: bool, saved: Option<&Path>) -> String {
    if json {
        return serde_json::to_string_pretty(r).expect("reports always serialise") + "\n";
    }
    let mut text = render(r);
    if let Some(p) = saved {
        text += &format!("report: {}\n", p.display());
    }
    text
}

/// One ioctl kind in two recordings.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct KindDiff {
    /// The ioctl.
    pub kind: DmaIoctl,
    /// Its sums in the first recording (None: it made no such call).
    pub before: Option<KindSummary>,
    /// Its sums in the second.
    pub after: Option<KindSummary>,
    /// after / before of the median duration (None when one side is missing or zero).
    pub median_ratio: Option<f64>,
    /// Whether the calls' durations changed beyond both recordings' spread (the rule `diff`
    /// uses for runs, over the successful calls of this kind).
    #[serde(default)]
    pub significant: bool,
    /// Why not, when not.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub noise: Option<String>,
}

/// Two recordings compared kind by kind (`dmaprof diff` of two `record` reports).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct RecordDiff {
    /// Per ioctl kind either recording made.
    pub kinds: Vec<KindDiff>,
}

/// The durations of a recording's successful calls of `kind`.
fn durations(r: &RecordReport, kind: DmaIoctl) -> crate::report::Stats {
    crate::report::Stats::of(
        r.calls
            .iter()
            .filter(|c| c.kind == kind && c.ret >= 0)
            .map(|c| c.duration_ns)
            .collect(),
    )
}

/// The regression gate for recordings (`diff --fail-above PCT`): a line for each ioctl kind
/// whose calls got significantly slower by more than PCT.
pub fn gate(d: &RecordDiff, fail_above: Option<f64>) -> Vec<String> {
    let Some(pct) = fail_above else { return Vec::new() };
    d.kinds
        .iter()
        .filter(|k| k.significant && k.median_ratio.is_some_and(|r| (r - 1.0) * 100.0 > pct))
        .map(|k| {
            format!(
                "regression: {} calls x{:.2}, above {pct}%",
                k.kind,
                k.median_ratio.unwrap_or(0.0)
            )
        })
        .collect()
}

/// Compares `before` and `after` kind by kind.
pub fn diff(before: &RecordReport, after: &RecordReport) -> RecordDiff {
    let find = |r: &RecordReport, k: DmaIoctl| r.by_kind.iter().find(|s| s.kind == k).cloned();
    let mut kinds: Vec<DmaIoctl> = before.by_kind.iter().chain(&after.by_kind).map(|s| s.kind).collect();
    kinds.sort_unstable();
    kinds.dedup();
    let kinds = kinds
        .into_iter()
        .map(|kind| {
            let (b, a) = (find(before, kind), find(after, kind));
            let median_ratio = match (&b, &a) {
                (Some(b), Some(a)) if b.median_ns > 0 => Some(a.median_ns as f64 / b.median_ns as f64),
                _ => None,
            };
            let change = crate::significance::significance(&durations(before, kind), &durations(after, kind));
            KindDiff {
                kind,
                before: b,
                after: a,
                median_ratio,
                significant: change.is_ok(),
                noise: change.err().map(|n| n.to_string()),
            }
        })
        .collect();
    RecordDiff { kinds }
}

/// The diff of two saved recordings; None unless both are `record` reports (the `run` diff
/// then says what they are).
pub fn diff_saved(before: &Path, after: &Path) -> Option<Result<RecordDiff, ReadError>> {
    let (b, a) = (read(before)?, read(after)?);
    Some(b.and_then(|b| a.map(|a| diff(&b, &a))))
}

/// The sampled shares inside and outside the DMA ioctls, a line each.
fn sampled_lines(s: Option<&RecordSampled>) -> String {
    let Some(s) = s else { return String::new() };
    let line = |what: &str, x: &crate::report::Sampled| {
        let mut top: Vec<(&Category, &f64)> = x.categories.iter().filter(|(_, v)| **v >= 0.01).collect();
        top.sort_by(|a, b| b.1.total_cmp(a.1));
        let shares: Vec<String> = top
            .iter()
            .map(|(c, v)| format!("{} {:.0}%", c.name(), **v * 100.0))
            .collect();
        format!("  sampled {what}: {} samples; {}\n", x.samples, shares.join(", "))
    };
    line("inside the DMA ioctls", &s.in_calls) + &line("outside them", &s.outside)
}

/// The table of a recording diff: per kind, calls, median, total and bytes before -> after.
pub fn render_diff(d: &RecordDiff) -> String {
    let side = |s: &Option<KindSummary>, f: fn(&KindSummary) -> String| s.as_ref().map_or("-".to_owned(), f);
    let mut out = format!(
        "  {:<22} {:>13} {:>21} {:>8} {:>23} {:>17}\n",
        "ioctl", "calls", "median ms", "ratio", "total ms", "MiB"
    );
    for k in &d.kinds {
        let pair = |f: fn(&KindSummary) -> String| format!("{} -> {}", side(&k.before, f), side(&k.after, f));
        out += &format!(
            "  {:<22} {:>13} {:>21} {:>8} {:>23} {:>17}\n",
            k.kind.to_string(),
            pair(|s| s.count.to_string()),
            pair(|s| ms(s.median_ns)),
            k.median_ratio.map_or("-".to_owned(), |r| format!(
                "x{r:.2}{}",
                if k.significant { "*" } else { "" }
            )),
            pair(|s| ms(s.total_ns)),
            pair(|s| mib(s.bytes)),
        );
    }
    out + "  (* the change is outside both recordings' spread)\n"
}

/// A recording diff as JSON, or as its table.
pub fn render_diff_as(d: &RecordDiff, json: bool) -> String {
    if json {
        serde_json::to_string_pretty(d).expect("diffs serialise") + "\n"
    } else {
        render_diff(d)
    }
}

/// The calls as CSV, one row each, every category's ns (empty when not measured).
pub fn csv(r: &RecordReport) -> String {
    let names: Vec<&str> = CATEGORIES.iter().map(|c| c.name()).collect();
    let mut out = format!("pid,tid,start_ns,kind,iova,size,duration_ns,ret,{}\n", names.join(","));
    for c in &r.calls {
        let cats: Vec<String> = CATEGORIES
            .iter()
            .map(|k| {
                c.categories
                    .as_ref()
                    .map_or(String::new(), |m| m.get(k).copied().unwrap_or(0).to_string())
            })
            .collect();
        out += &format!(
            "{},{},{},{},{},{},{},{},{}\n",
            c.pid,
            c.tid,
            c.start_ns,
            c.kind,
            c.iova,
            c.size,
            c.duration_ns,
            c.ret,
            cats.join(",")
        );
    }
    out
}

fn ms(ns: u64) -> String {
    format!("{:.3}", ns as f64 / 1e6)
}

fn mib(bytes: u64) -> String {
    format!("{:.1}", bytes as f64 / f64::from(1 << 20))
}

/// The largest categories of a call or kind, as `name NN%` of `of_ns`.
fn shares(c: &Option<BTreeMap<Category, u64>>, of_ns: u64) -> String {
    let Some(c) = c else {
        return "-".to_owned();
    };
    let mut v: Vec<(&Category, &u64)> = c.iter().collect();
    v.sort_by(|a, b| b.1.cmp(a.1));
    let parts: Vec<String> = v
        .iter()
        .take(3)
        .map(|(k, ns)| format!("{k} {:.0}%", **ns as f64 * 100.0 / of_ns.max(1) as f64))
        .collect();
    if parts.is_empty() {
        "-".to_owned()
    } else {
        parts.join(", ")
    }
}

/// The tables `record` and `report` print: per kind, then the longest calls.
pub fn render(r: &RecordReport) -> String {
    let mut out = String::new();
    let what = if r.process.command.is_empty() {
        format!("pids {:?}", r.process.pids)
    } else {
        r.process.command.join(" ")
    };
    out += &format!(
        "recorded {what}: {} DMA ioctls in {} ms{}{}\n",
        r.calls.len(),
        ms(r.duration_ns),
        if r.partial {
            " (partial: stopped by a signal)"
        } else {
            ""
        },
        if r.lost > 0 {
            format!(", {} lost", r.lost)
        } else {
            String::new()
        }
    );
    if r.calls.is_empty() {
        return out;
    }
    out += &format!(
        "\n  {:<22} {:>6} {:>6} {:>11} {:>10} {:>10} {:>10}  {}\n",
        "ioctl", "calls", "failed", "total ms", "median ms", "max ms", "MiB", "exact categories"
    );
    for k in &r.by_kind {
        out += &format!(
            "  {:<22} {:>6} {:>6} {:>11} {:>10} {:>10} {:>10}  {}\n",
            k.kind.to_string(),
            k.count,
            k.failed,
            ms(k.total_ns),
            ms(k.median_ns),
            ms(k.max_ns),
            mib(k.bytes),
            shares(&k.categories, k.total_ns)
        );
    }
    if let Some(f) = r.cpu_faults {
        out += &format!("  CPU page faults of the processes while recorded: {f}\n");
    }
    if let Some(m) = r.memory_syscalls {
        out += &format!(
            "  mmap/munmap/madvise/mremap of the processes: {} calls, {} ms\n",
            m.calls,
            ms(m.ns)
        );
    }
    out += &sampled_lines(r.sampled.as_ref());
    if r.unaccounted > 0 {
        out += &format!(
            "  {} probed calls could not be accounted: the categories undercount\n",
            r.unaccounted
        );
    }
    out += &format!(
        "\n  longest calls\n  {:>10} {:>8} {:<22} {:>18} {:>10} {:>10} {:>5}  {}\n",
        "start ms", "tid", "ioctl", "iova", "MiB", "ms", "ret", "exact categories"
    );
    for c in &r.top {
        out += &format!(
            "  {:>10} {:>8} {:<22} {:>#18x} {:>10} {:>10} {:>5}  {}\n",
            ms(c.start_ns),
            c.tid,
            c.kind.to_string(),
            c.iova,
            mib(c.size),
            ms(c.duration_ns),
            c.ret,
            shares(&c.categories, c.duration_ns)
        );
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_recording_diff_marks_only_changes_beyond_the_spread() {
        let r: RecordReport = serde_json::from_str(include_str!("../tests/data/record-7.3.json")).unwrap();
        let same = diff(&r, &r);
        assert!(same.kinds.iter().all(|k| !k.significant), "{same:?}");
        assert!(gate(&same, Some(10.0)).is_empty());
        let mut slower = r.clone();
        for c in slower.calls.iter_mut().filter(|c| c.kind == DmaIoctl::VfioMapDma) {
            c.duration_ns += 50_000_000;
        }
        slower.by_kind = by_kind(&slower.calls);
        let d = diff(&r, &slower);
        let map = d.kinds.iter().find(|k| k.kind == DmaIoctl::VfioMapDma).unwrap();
        assert!(map.significant, "{map:?}");
        assert_eq!(gate(&d, Some(10.0)).len(), 1);
        assert!(render_diff(&d).contains(&format!("x{:.2}*", map.median_ratio.unwrap())));
    }
    use crate::loader::category_index;

    fn raw(cmd: DmaIoctl, start: u64, dur: u64, size: u64, ret: i64) -> DmaCall {
        let mut r = DmaCall {
            tid: 7,
            tgid: 5,
            cmd: cmd.cmd() as u32,
            start_ns: start,
            duration_ns: dur,
            ret,
            size,
            iova: 1 << 32,
            ..DmaCall::default()
        };
        r.category_ns[category_index(Category::Pinning) as usize] = dur / 2;
        r.category_ns[category_index(Category::IommuMap) as usize] = dur / 4;
        r
    }

    fn calls() -> Vec<Call> {
        [
            raw(DmaIoctl::VfioMapDma, 1_000, 400, 4096, 0),
            raw(DmaIoctl::VfioUnmapDma, 2_000, 100, 4096, 0),
            raw(DmaIoctl::VfioMapDma, 3_000, 800, 8192, 0),
            raw(DmaIoctl::VfioMapDma, 4_000, 200, 8192, -22),
        ]
        .iter()
        .map(|r| Call::of(r, 1_000, true).expect("a DMA ioctl"))
        .collect()
    }

    #[test]
    fn records_become_calls_with_their_categories() {
        let c = &calls()[0];
        assert_eq!((c.kind, c.start_ns, c.pid, c.tid), (DmaIoctl::VfioMapDma, 0, 5, 7));
        let cats = c.categories.as_ref().unwrap();
        assert_eq!(cats.get(&Category::Pinning), Some(&200));
        assert_eq!(cats.get(&Category::IommuMap), Some(&100));
        assert_eq!(cats.len(), 2, "zero categories are left out");
        assert!(c.attributed_ns() <= c.duration_ns);
        assert!(
            Call::of(&raw(DmaIoctl::VfioMapDma, 0, 1, 1, 0), 0, false)
                .unwrap()
                .categories
                .is_none()
        );
        let mut other = raw(DmaIoctl::VfioMapDma, 0, 1, 1, 0);
        other.cmd = 0x5401;
        assert!(Call::of(&other, 0, true).is_none(), "not a DMA ioctl");
    }

    #[test]
    fn kinds_sum_counts_bytes_and_categories() {
        let k = by_kind(&calls());
        assert_eq!(k.len(), 2);
        let map = &k[0];
        assert_eq!(map.kind, DmaIoctl::VfioMapDma);
        assert_eq!((map.count, map.failed, map.total_ns, map.max_ns), (3, 1, 1400, 800));
        assert_eq!(map.median_ns, 400);
        assert_eq!(map.bytes, 4096 + 8192, "a failed map maps nothing");
        assert_eq!(map.categories.as_ref().unwrap()[&Category::Pinning], 700);
        assert_eq!((k[1].kind, k[1].count, k[1].bytes), (DmaIoctl::VfioUnmapDma, 1, 4096));
        assert_eq!(median(&mut [5, 1, 3, 2]), 2);
        assert_eq!(median(&mut []), 0);
    }

    #[test]
    fn top_is_longest_first_and_the_report_round_trips() {
        let t = top(&calls(), 2);
        assert_eq!(t.iter().map(|c| c.duration_ns).collect::<Vec<_>>(), vec![800, 400]);
        let mut r = RecordReport {
            schema: SCHEMA.into(),
            dmaprof_version: "0".into(),
            process: Process {
                pids: vec![5],
                command: vec!["x".into()],
                exit_code: Some(0),
            },
            duration_ns: 10_000,
            calls: calls().into_iter().rev().collect(),
            by_kind: Vec::new(),
            by_size: Vec::new(),
            categories: None,
            top: Vec::new(),
            rows: Vec::new(),
            cpu_faults: None,
            unaccounted: 0,
            probes: Vec::new(),
            kernel: KernelInfo::default(),
            partial: false,
            lost: 0,
            memory_syscalls: None,
            sampled: None,
        };
        summarise(&mut r);
        assert_eq!(r.calls[0].start_ns, 0, "sorted by start");
        assert_eq!(r.top.len(), 4);
        let buckets: Vec<(u64, u64)> = r.by_size.iter().map(|b| (b.size_from, b.count)).collect();
        assert_eq!(
            buckets,
            vec![(4096, 1), (8192, 2), (4096, 1)],
            "maps of 4 and 8 KiB, an unmap"
        );
        assert_eq!(r.categories.as_ref().unwrap()[&Category::Pinning], 750);
        assert_eq!((bucket(0), bucket(12288), bucket(1 << 30)), (0, 8192, 1 << 30));
        let text = serde_json::to_string(&r).unwrap();
        assert!(text.contains("\"kind\":\"VFIO_IOMMU_MAP_DMA\""));
        let back = serde_json::from_str::<RecordReport>(&text).unwrap();
        assert_eq!(
            (back.calls, back.by_kind, back.top),
            (r.calls.clone(), r.by_kind.clone(), r.top.clone())
        );
        let d = diff(
            &r,
            &RecordReport {
                calls: r.calls[..2].to_vec(),
                ..r.clone()
            },
        );
        assert_eq!(d.kinds.len(), 2);
        assert_eq!(
            (d.kinds[0].before.as_ref().unwrap().count, d.kinds[0].median_ratio),
            (3, Some(1.0))
        );
        assert!(render_diff(&d).contains("3 -> 3"));
        let lines: Vec<String> = csv(&r).lines().map(str::to_owned).collect();
        assert_eq!(lines.len(), 5);
        assert!(lines[0].starts_with("pid,tid,start_ns,kind") && lines[1].contains(",VFIO_IOMMU_MAP_DMA,"));
        let table = render(&r);
        assert!(table.contains("VFIO_IOMMU_UNMAP_DMA") && table.contains("pinning 50%"));
    }
}
