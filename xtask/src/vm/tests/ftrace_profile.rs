//! dmaprof's exact per-function exclusive times against ftrace's function profiler, which
//! nobody here wrote: the profiler times the same probe-table functions while dmaprof measures
//! the same workload, and every row holding at least [`MIN_SHARE`] of its phase is compared per
//! call.
//!
//! What the profiler gives and how it is read (Linux 7.3, the custom guest kernel):
//! - Per function and CPU, calls and summed time over everything it saw while enabled. A `run`
//!   row is one exact iteration, while the profiler sees every iteration of the run (the two
//!   discarded ones, warm-up and scout, and the whole exact pass); so per-call times are compared,
//!   over functions called as often in every iteration (ftrace's calls = iterations x dmaprof's),
//!   and how much the exact pass's iterations differ (under emulation, whatever else the host
//!   runs slows some of them) is added to the tolerance. `dmaprof record` of a `dmaprof run
//!   --no-trace` counts every call of the same workload, as ftrace does: there both sides cover
//!   the same calls and the tolerance is [`TOLERANCE`] alone.
//! - With graph-time off a function's time excludes the time of the filtered functions it calls,
//!   which are exactly the probe-table rows dmaprof attached: dmaprof's definition of exclusive
//!   time. The 7.3 kernel has two faults here. `options/graph-time` no longer reaches the
//!   profiler (the option moved to the global trace flags, and the switch that forwards it still
//!   tests the function-graph tracer's own flag value, 0x400, which among the global flags is
//!   `annotate`): writing 0 to `options/annotate` is what turns it off. And with graph-time off a
//!   call that made no filtered call is recorded as taking no time at all. So a function that
//!   calls no probed function (a leaf: its exclusive time is its whole time) is read from a run
//!   with graph-time on, and every other one from a run with graph-time off.
use std::{
    collections::{BTreeMap, BTreeSet},
    fmt::Write as _,
    fs,
    path::Path,
};

use serde_json::Value;

use super::{Ctx, Outcome, boot_ok, findings, no_failed_step, ns, plan, scratch, shell};

/// The profiled cases: backed by 2 MiB hugetlb pages, so every iteration faults, zeroes, pins,
/// maps and unmaps the same 32 pages. Their runs keep every row attached (`--demote-above
/// 100`): a demoted row's time stays in its caller's row, while ftrace would still take it out,
/// and with ftrace's profiler on, the estimated cost of 32 pin calls can pass the default 3% of
/// a short unmap. Nor do they run primers (`--no-prime`): ftrace would count a primer's calls,
/// which are in no iteration of dmaprof's.
const CASES: [&str; 2] = [
    "vfio_type1_iommu_anonymous_hugetlb_2mb.none",
    "iommufd_anonymous_hugetlb_2mb.none",
];

/// Buffer size of each profiled run, in MiB.
const SIZE_MIB: u64 = 64;

/// Exact-pass iterations per run: many, so that the two discarded iterations ftrace also counts
/// (the warm-up has no probes and is the process's first, the scout runs just after the probes
/// were attached and pays for emulating freshly patched code) weigh little in its per-call means.
const EXACT_ITERATIONS: u64 = 11;

/// The iterations dmaprof runs before the passes (a warm-up, then the scout).
const DISCARDED_ITERATIONS: u64 = 2;

/// A row holding this share of its phase's exact wall time is compared.
const MIN_SHARE: f64 = 0.05;

/// How far dmaprof's per-call exclusive time may be from ftrace's, relative to ftrace's, where
/// both cover the same calls.
const TOLERANCE: f64 = 0.10;

/// Rows the recordings must have compared for the test to mean anything. A `run` needs one: how
/// many of its rows are steady enough to compare depends on what else the host runs.
const MIN_COMPARED: usize = 3;

/// Rows whose probe cost dmaprof estimates at this share or more are not compared. The part of
/// a probed callee's cost outside dmaprof's window (the BPF trampoline around its programs) is
/// in the caller's exclusive time for dmaprof and in the callee's for ftrace, whose hooks run
/// outside the trampoline. dmaprof's estimate (`overhead_ns`) comes from a calibration loop, and
/// under emulation a probed call inside the workload costs about ten times that: this test's
/// aligned recordings put 4-8 us of a callee's probe cost in its caller for dmaprof and not for
/// ftrace (`vaddr_get_pfns`, `vfio_lock_acct`, `vfio_unmap_unpin`), against 0.3-0.7 us
/// calibrated. So from an estimated 1% on, that placing can fill the whole [`TOLERANCE`].
const PROBE_SHARE_LIMIT: f64 = 0.01;

/// A `run` row whose iterations may differ by more than this share of its own time (see
/// [`Function::noise`]) is not compared against ftrace's mean over all of them.
const MAX_NOISE: f64 = 1.0;

/// A function whose probed callees hold at least this share of its inclusive time shows
/// whether self time and total time are told apart (see [`Control`]).
const CONTROL_CALLEE_SHARE: f64 = 0.5;

/// How the profiler accounts a function's callees in one run.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Mode {
    /// graph-time on: entry to return, callees included.
    Total,
    /// graph-time off: the filtered callees' time taken out.
    SelfTime,
}

impl Mode {
    const ALL: [Self; 2] = [Self::Total, Self::SelfTime];

    /// File name part of this run's outputs.
    fn tag(self) -> &'static str {
        match self {
            Self::Total => "total",
            Self::SelfTime => "self",
        }
    }

    /// The value written to `options/graph-time` (and to `options/annotate`, see the module
    /// documentation).
    fn graph_time(self) -> u8 {
        u8::from(self == Self::Total)
    }
}

/// Where dmaprof's rows come from.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Source {
    /// `dmaprof run --passes exact`: `exact.rows` of one iteration per phase.
    Run,
    /// `dmaprof record` of `dmaprof run --no-trace`: `rows` over every call it made.
    Record,
}

impl Source {
    const ALL: [Self; 2] = [Self::Run, Self::Record];

    fn tag(self) -> &'static str {
        match self {
            Self::Run => "run",
            Self::Record => "record",
        }
    }

    /// The rows that must be compared (see [`MIN_COMPARED`]).
    fn min_compared(self) -> usize {
        match self {
            Self::Run => 1,
            Self::Record => MIN_COMPARED,
        }
    }

    /// The iterations ftrace sees per iteration dmaprof's rows cover (so its calls of a
    /// function are dmaprof's times this, when it counts nothing else).
    fn iterations(self) -> u64 {
        match self {
            Self::Run => EXACT_ITERATIONS + DISCARDED_ITERATIONS,
            Self::Record => 1,
        }
    }

    /// The guest command whose rows go to `/out/<case>.<source>.<mode>.json`.
    fn command(self, case: &str, mode: Mode) -> String {
        let (src, tag) = (self.tag(), mode.tag());
        let out = format!("/out/{case}.{src}.{tag}.json");
        match self {
            Self::Run => format!(
                "/bin/dmaprof run --json -b {SIZE_MIB}M -v {case} --thp never --passes exact \
                 --demote-above 100 --no-prime --traced-iterations {EXACT_ITERATIONS} -o /tmp/{case}.{src}.{tag} > {out}"
            ),
            // The recorded command's own output would mix with record's: the report is copied.
            Self::Record => format!(
                "/bin/dmaprof record -o /tmp/{case}.{src}.{tag} -- /bin/dmaprof run --no-trace -b {SIZE_MIB}M \
                 -v {case} --thp never -n {EXACT_ITERATIONS} -o /tmp/{case}.inner.{tag} > /dev/null \
                 && cp /tmp/{case}.{src}.{tag}/report.json {out}"
            ),
        }
    }
}

/// The guest's script: THP off (so that `folio_zero_user` runs only for the hugetlb faults of
/// the workload), a first traced run that warms the guest's memory (the host backs guest RAM
/// on first touch, which would make the first profiled iterations slower) and names the rows
/// dmaprof attached, those rows (or their compiler clones) as ftrace's filter, then per case,
/// [`Source`] and [`Mode`] one profiled dmaprof.
fn script() -> String {
    let mut s = String::from(
        "T=/sys/kernel/tracing; mount -t tracefs nodev $T 2>/dev/null
echo never > /sys/kernel/mm/transparent_hugepage/enabled || v thp_exit $?
/bin/dmaprof run --json -b 512M -v none_anonymous_hugetlb_2mb.touch --passes exact -o /tmp/names \
  > /tmp/names.json 2>> /out/err.txt || v names_exit $?
tr -d ' \\n' < /tmp/names.json | tr '{}' '\\n\\n' | grep '\"attached\":true' \
  | grep -E '\"mechanism\":\"(fentry|kprobe)\"' | sed 's/.*\"function\":\"\\([^\"]*\\)\".*/\\1/' > /out/attached.txt
for f in $(cat /out/attached.txt); do
  echo $f >> $T/set_ftrace_filter 2>/dev/null || echo \"$f.*\" >> $T/set_ftrace_filter 2>/dev/null || echo $f >> /out/unfiltered.txt
done
cat $T/set_ftrace_filter > /out/filter.txt
",
    );
    for source in Source::ALL {
        for case in CASES {
            for mode in Mode::ALL {
                let (gt, src, tag) = (mode.graph_time(), source.tag(), mode.tag());
                let _ = write!(
                    s,
                    "echo {gt} > $T/options/graph-time; echo {gt} > $T/options/annotate
echo 1 > $T/function_profile_enabled
{{ {}; }} 2>> /out/err.txt || v {src}_exit $? case {case} mode {tag}
echo 0 > $T/function_profile_enabled
cat $T/trace_stat/function* > /out/{case}.{src}.{tag}.stat
",
                    source.command(case, mode)
                );
            }
        }
    }
    s + "echo 1 > $T/options/annotate; echo 1 > $T/options/graph-time\nv done yes\n"
}

/// A function name as dmaprof's rows name it: a compiler clone (`.isra.0`, `.part.0`) is its
/// function, as dmaprof attaches the clone for a row whose function has none of its own.
fn base_name(symbol: &str) -> &str {
    symbol.split('.').next().unwrap_or(symbol)
}

/// What the profiler measured, per function (clones folded in) and summed over CPUs: calls and
/// time in ns. `trace_stat/function<cpu>` lines read `name hits time us avg us s^2 us`.
fn profile(stat: &str) -> BTreeMap<String, (u64, f64)> {
    let mut out: BTreeMap<String, (u64, f64)> = BTreeMap::new();
    for line in stat.lines() {
        let w: Vec<&str> = line.split_whitespace().collect();
        let (Some(name), Some(Ok(hits)), Some(Ok(us)), Some(&"us")) = (
            w.first(),
            w.get(1).map(|h| h.parse::<u64>()),
            w.get(2).map(|t| t.parse::<f64>()),
            w.get(3),
        ) else {
            continue;
        };
        let e = out.entry(base_name(name).to_owned()).or_default();
        e.0 += hits;
        e.1 += us * 1e3;
    }
    out
}

/// The functions ftrace's filter held (`name [module]` lines, clones folded in).
fn filtered(filter: &str) -> BTreeSet<String> {
    filter
        .lines()
        .filter_map(|l| l.split_whitespace().next())
        .map(|n| base_name(n).to_owned())
        .collect()
}

/// One function in one report: its rows summed over the case's phases.
#[derive(Debug, Default, Clone)]
struct Function {
    calls: u64,
    exclusive_ns: u64,
    inclusive_ns: u64,
    /// It made no probed call.
    leaf: bool,
    /// Every phase has at least as many probed calls from it as calls of it.
    callee_every_call: bool,
    /// The share of its exclusive time dmaprof estimated to be probe cost (`overhead_ns`).
    probe_share: f64,
    /// Its phases and its share of each (exclusive over the phase's wall time).
    shares: Vec<(String, f64)>,
    /// How much its time may differ between the iterations ftrace averages over, relative to
    /// it: the largest over its phases of the phase's exact-pass spread ((max - min) / median of
    /// the wall times) over its share of the phase (a row's time moves the phase's as much, so
    /// a row holding half of it can move by twice the phase's spread); 0 where the rows cover
    /// every iteration.
    noise: f64,
    demoted: bool,
}

impl Function {
    fn per_call(ns: u64, calls: u64) -> f64 {
        ns as f64 / calls.max(1) as f64
    }

    /// The largest share it holds of one of its phases.
    fn top_share(&self) -> f64 {
        self.shares.iter().map(|(_, s)| *s).fold(0.0, f64::max)
    }

    fn phases(&self) -> String {
        let parts: Vec<String> = self
            .shares
            .iter()
            .map(|(p, s)| format!("{p} {:.0}%", s * 100.0))
            .collect();
        parts.join(", ")
    }
}

/// (max - min) / median of a phase's exact-pass wall times.
fn spread(phase: &Value) -> f64 {
    let w = &phase["passes"]["exact"]["wall_ns"];
    (ns(&w["max"]) - ns(&w["min"])) / ns(&w["median"]).max(1.0)
}

/// The exact rows of a `run` report, per function.
fn run_functions(report: &Value, case: &str) -> Result<BTreeMap<String, Function>, String> {
    let c = super::case(report, case)?;
    let mut out: BTreeMap<String, Function> = BTreeMap::new();
    let mut overhead: BTreeMap<String, u64> = BTreeMap::new();
    for p in c["phases"].as_array().into_iter().flatten() {
        let wall = ns(&p["exact"]["wall_ns"]).max(1.0);
        for r in p["exact"]["rows"].as_array().into_iter().flatten() {
            let name = r["function"].as_str().unwrap_or("?").to_owned();
            let f = out.entry(name.clone()).or_insert_with(|| Function {
                leaf: true,
                callee_every_call: true,
                ..Function::default()
            });
            let (calls, children) = (r["calls"].as_u64().unwrap_or(0), r["child_calls"].as_u64().unwrap_or(0));
            f.calls += calls;
            f.exclusive_ns += r["exclusive_ns"].as_u64().unwrap_or(0);
            f.inclusive_ns += r["inclusive_ns"].as_u64().unwrap_or(0);
            f.leaf &= children == 0;
            f.callee_every_call &= children >= calls;
            f.demoted |= r["demoted"] == true;
            let share = ns(&r["exclusive_ns"]) / wall;
            f.noise = f.noise.max(spread(p) / share.max(1e-9));
            f.shares.push((p["name"].as_str().unwrap_or("?").to_owned(), share));
            *overhead.entry(name).or_default() += r["overhead_ns"].as_u64().unwrap_or(0);
        }
    }
    for (name, f) in &mut out {
        f.probe_share = overhead[name] as f64 / f.exclusive_ns.max(1) as f64;
    }
    Ok(out)
}

/// The rows of a `record` report, per function. A row's share is of the recorded DMA ioctls'
/// time; what rows do not say (whether every call has a probed callee, the probe cost) comes
/// from the `run` of the same case, `like`, which makes the same calls in every iteration.
fn record_functions(report: &Value, like: &BTreeMap<String, Function>) -> BTreeMap<String, Function> {
    let ioctls: f64 = report["by_kind"]
        .as_array()
        .into_iter()
        .flatten()
        .map(|k| ns(&k["total_ns"]))
        .sum();
    let mut out = BTreeMap::new();
    for r in report["rows"].as_array().into_iter().flatten() {
        let name = r["function"].as_str().unwrap_or("?").to_owned();
        let (exclusive_ns, inclusive_ns) = (
            r["exclusive_ns"].as_u64().unwrap_or(0),
            r["inclusive_ns"].as_u64().unwrap_or(0),
        );
        let known = like.get(&name).cloned().unwrap_or_default();
        let f = Function {
            calls: r["calls"].as_u64().unwrap_or(0),
            exclusive_ns,
            inclusive_ns,
            leaf: inclusive_ns == exclusive_ns,
            callee_every_call: known.callee_every_call,
            probe_share: known.probe_share,
            shares: vec![("ioctls".to_owned(), exclusive_ns as f64 / ioctls.max(1.0))],
            noise: 0.0,
            demoted: false,
        };
        out.insert(name, f);
    }
    out
}

/// One profiled dmaprof: its rows and ftrace's profile of the same time.
struct Measured {
    source: Source,
    rows: BTreeMap<String, Function>,
    profile: BTreeMap<String, (u64, f64)>,
}

impl Measured {
    /// The run's outputs for `case` and `mode`; `like` is the `run` of the same case and mode
    /// (for a `record`, see [`record_functions`]).
    fn read(dir: &Path, case: &str, source: Source, mode: Mode, like: Option<&Self>) -> Result<Self, String> {
        let file = |ext: &str| {
            let path = dir.join(format!("{case}.{}.{}.{ext}", source.tag(), mode.tag()));
            fs::read_to_string(&path).map_err(|e| format!("no {}: {e}", path.display()))
        };
        let report: Value = serde_json::from_str(&file("json")?)
            .map_err(|e| format!("{case} {} {}: not JSON: {e}", source.tag(), mode.tag()))?;
        let rows = match (source, like) {
            (Source::Run, _) => run_functions(&report, case)?,
            (Source::Record, Some(run)) => record_functions(&report, &run.rows),
            (Source::Record, None) => return Err("a recording is read after its run".into()),
        };
        Ok(Self {
            source,
            rows,
            profile: profile(&file("stat")?),
        })
    }

    /// ftrace's calls and ns per call of `function`, when it counted every call dmaprof's rows
    /// count and nothing else: its calls equal dmaprof's times the iterations it saw.
    fn per_call(&self, function: &str) -> Result<(u64, f64), String> {
        let calls = self.rows.get(function).map_or(0, |f| f.calls);
        let (hits, time) = self.profile.get(function).copied().unwrap_or_default();
        let iterations = self.source.iterations();
        if hits == 0 || hits != calls * iterations {
            return Err(format!(
                "ftrace counted {hits} calls, {iterations} x {calls} expected: it also runs outside the \
                 workload, or not as often in every iteration"
            ));
        }
        Ok((hits, time / hits as f64))
    }
}

/// One compared row, as the table prints it.
struct Compared {
    case: &'static str,
    source: Source,
    function: String,
    phases: String,
    mode: Mode,
    hits: u64,
    calls: u64,
    dmaprof: f64,
    probe_share: f64,
    ftrace: f64,
    /// The largest `diff` allowed: [`TOLERANCE`], plus [`Function::noise`] where ftrace saw more
    /// iterations than the row covers.
    allowed: f64,
}

impl Compared {
    fn diff(&self) -> f64 {
        (self.dmaprof - self.ftrace) / self.ftrace
    }
}

/// The outcome of one function of one case and source: compared, or why not.
enum Verdict {
    Compared(Compared),
    Skipped {
        case: &'static str,
        source: Source,
        function: String,
        phases: String,
        why: String,
    },
}

/// Why `f`, measured in `run`, cannot be compared, if it cannot.
fn not_comparable(function: &str, f: &Function, run: &Measured, traced: &BTreeSet<String>) -> Option<String> {
    if !traced.contains(function) {
        return Some("not in ftrace's filter (not in available_filter_functions)".into());
    }
    if !f.leaf && !f.callee_every_call {
        return Some("some calls make no probed call, and with graph-time off this kernel records those as 0".into());
    }
    if let Err(why) = run.per_call(function) {
        return Some(why);
    }
    if f.noise > MAX_NOISE {
        return Some(format!(
            "its iterations may differ by {:.0}% of it (its phase's spread over its share), too much for one \
             iteration against the mean of all",
            f.noise * 100.0
        ));
    }
    (f.probe_share >= PROBE_SHARE_LIMIT).then(|| {
        format!(
            "probe cost is {:.1}% of it by dmaprof's calibration, about ten times that inside the workload, \
             which the two tools place differently",
            f.probe_share * 100.0
        )
    })
}

/// Compares `function` of `case`: a leaf (no probed callee) from the graph-time on run, any
/// other function from the graph-time off run.
///
/// dmaprof's side is `exclusive_ns` as measured, not less its `overhead_ns`: ftrace timed the
/// same probed execution, so the probes' cost is inside what both measured, and `overhead_ns`
/// is only dmaprof's estimate of that cost, taken out for the category shares.
fn compare(case: &'static str, function: &str, runs: &[Measured; 2], traced: &BTreeSet<String>) -> Verdict {
    let leaf = runs.iter().all(|r| r.rows.get(function).is_none_or(|f| f.leaf));
    let mode = if leaf { Mode::Total } else { Mode::SelfTime };
    let run = &runs[usize::from(!leaf)];
    let f = run.rows.get(function).cloned().unwrap_or_default();
    let skip = |why: String| Verdict::Skipped {
        case,
        source: run.source,
        function: function.to_owned(),
        phases: f.phases(),
        why,
    };
    if let Some(why) = not_comparable(function, &f, run, traced) {
        return skip(why);
    }
    let (hits, ftrace) = run.per_call(function).unwrap_or_default();
    Verdict::Compared(Compared {
        case,
        source: run.source,
        function: function.to_owned(),
        phases: f.phases(),
        mode,
        hits,
        calls: f.calls,
        dmaprof: Function::per_call(f.exclusive_ns, f.calls),
        probe_share: f.probe_share,
        ftrace,
        allowed: TOLERANCE + f.noise,
    })
}

/// The functions that hold [`MIN_SHARE`] of a phase in either run.
fn large(runs: &[Measured; 2]) -> BTreeSet<String> {
    runs.iter()
        .flat_map(|r| r.rows.iter())
        .filter(|(_, f)| f.top_share() >= MIN_SHARE)
        .map(|(n, _)| n.clone())
        .collect()
}

/// Why the case's comparisons would be wrong as a whole: demoted rows.
fn demoted(case: &str, runs: &[Measured; 2]) -> Result<(), String> {
    let names: BTreeSet<&String> = runs
        .iter()
        .flat_map(|r| r.rows.iter())
        .filter(|(_, f)| f.demoted)
        .map(|(n, _)| n)
        .collect();
    if names.is_empty() {
        Ok(())
    } else {
        Err(format!(
            "{case} demoted {names:?}: their time stays in their callers' rows while ftrace takes it out, \
             so this case cannot be compared"
        ))
    }
}

/// A row that shows self time and total time apart: a function whose probed callees hold most
/// of its time, with what graph-time on and off read for it.
struct Control {
    case: &'static str,
    function: String,
    dmaprof_exclusive: f64,
    dmaprof_inclusive: f64,
    ftrace_total: f64,
    ftrace_self: f64,
}

impl Control {
    /// The share of its inclusive time its probed callees hold, as dmaprof measured it.
    fn callee_share(&self) -> f64 {
        1.0 - self.dmaprof_exclusive / self.dmaprof_inclusive.max(1.0)
    }
}

/// The case's control row (see [`Control`]): of the functions ftrace counted every call of in
/// both runs, the one whose probed callees hold the largest share of its time (a small share
/// would leave the check to the noise of the discarded iterations).
fn control(case: &'static str, runs: &[Measured; 2]) -> Option<Control> {
    let [total, selft] = runs;
    selft
        .rows
        .iter()
        .filter(|(_, f)| !f.leaf && f.callee_every_call && f.exclusive_ns > 0)
        .filter_map(|(name, f)| {
            let (_, ftrace_self) = selft.per_call(name).ok()?;
            let (_, ftrace_total) = total.per_call(name).ok()?;
            Some(Control {
                case,
                function: name.clone(),
                dmaprof_exclusive: Function::per_call(f.exclusive_ns, f.calls),
                dmaprof_inclusive: Function::per_call(f.inclusive_ns, f.calls),
                ftrace_total,
                ftrace_self,
            })
        })
        .max_by(|a, b| a.callee_share().total_cmp(&b.callee_share()))
        .filter(|c| c.callee_share() >= CONTROL_CALLEE_SHARE)
}

/// Every verdict of `case` (both sources) and its control row.
fn case_verdicts(
    dir: &Path,
    case: &'static str,
    traced: &BTreeSet<String>,
) -> Result<(Vec<Verdict>, Option<Control>), String> {
    let read = |source, like: Option<&[Measured; 2]>| -> Result<[Measured; 2], String> {
        let [a, b] = Mode::ALL;
        Ok([
            Measured::read(dir, case, source, a, like.map(|l| &l[0]))?,
            Measured::read(dir, case, source, b, like.map(|l| &l[1]))?,
        ])
    };
    let runs = read(Source::Run, None)?;
    demoted(case, &runs)?;
    let recorded = read(Source::Record, Some(&runs))?;
    let mut verdicts: Vec<Verdict> = large(&runs).iter().map(|f| compare(case, f, &runs, traced)).collect();
    verdicts.extend(large(&recorded).iter().map(|f| compare(case, f, &recorded, traced)));
    Ok((verdicts, control(case, &runs)))
}

/// The table of compared rows, skipped rows and control rows, for the log.
fn table(verdicts: &[Verdict], controls: &[Control]) -> String {
    let mut t = format!(
        "{:<6} {:<44} {:<24} {:<16} {:<10} {:>12} {:>15} {:>6} {:>14} {:>7} {:>7}\n",
        "source",
        "case",
        "function",
        "share",
        "graph-time",
        "calls",
        "dmaprof ns/call",
        "probe",
        "ftrace ns/call",
        "diff",
        "allowed"
    );
    for v in verdicts {
        match v {
            Verdict::Compared(c) => {
                let how = if c.mode == Mode::Total { "on, leaf" } else { "off" };
                let calls = format!("{}={}x{}", c.hits, c.hits / c.calls.max(1), c.calls);
                let _ = writeln!(
                    t,
                    "{:<6} {:<44} {:<24} {:<16} {:<10} {:>12} {:>15.0} {:>5.1}% {:>14.0} {:>+6.1}% {:>6.1}%",
                    c.source.tag(),
                    c.case,
                    c.function,
                    c.phases,
                    how,
                    calls,
                    c.dmaprof,
                    c.probe_share * 100.0,
                    c.ftrace,
                    c.diff() * 100.0,
                    c.allowed * 100.0
                );
            }
            Verdict::Skipped {
                case,
                source,
                function,
                phases,
                why,
            } => {
                let _ = writeln!(
                    t,
                    "{:<6} {case:<44} {function:<24} {phases:<16} not compared: {why}",
                    source.tag()
                );
            }
        }
    }
    for c in controls {
        let _ = writeln!(
            t,
            "control {} {} (probed callees {:.0}% of its time): dmaprof exclusive {:.0}, inclusive {:.0} ns/call; \
             ftrace graph-time off {:.0}, on {:.0} ns/call",
            c.case,
            c.function,
            c.callee_share() * 100.0,
            c.dmaprof_exclusive,
            c.dmaprof_inclusive,
            c.ftrace_self,
            c.ftrace_total
        );
    }
    t
}

/// What the control rows must show: graph-time off took effect, and total times would not
/// have passed as exclusive ones.
fn control_problems(controls: &[Control]) -> Vec<String> {
    if controls.is_empty() {
        return vec![
            "no row with probed callees counted cleanly in both runs: self and total time not told apart".into(),
        ];
    }
    let mut problems = Vec::new();
    for c in controls {
        // Its callees hold at least half its time, so with them taken out it must read below
        // half of what graph-time on reads.
        if c.ftrace_self >= 0.5 * c.ftrace_total {
            problems.push(format!(
                "graph-time off did not take effect: ftrace reads {:.0} ns/call for {} with it off, {:.0} with it on",
                c.ftrace_self, c.function, c.ftrace_total
            ));
        }
        if ((c.dmaprof_exclusive - c.ftrace_total) / c.ftrace_total).abs() <= TOLERANCE {
            problems.push(format!(
                "{}: total time matches exclusive time too, the comparison cannot tell them apart",
                c.function
            ));
        }
    }
    problems
}

/// What must hold: each source compared enough rows, each within its allowed difference; and
/// the control rows (see [`control_problems`]).
fn judge(verdicts: &[Verdict], controls: &[Control]) -> Result<String, String> {
    let compared: Vec<&Compared> = verdicts
        .iter()
        .filter_map(|v| match v {
            Verdict::Compared(c) => Some(c),
            Verdict::Skipped { .. } => None,
        })
        .collect();
    let mut problems: Vec<String> = compared
        .iter()
        .filter(|c| c.diff().abs() > c.allowed)
        .map(|c| {
            format!(
                "{} {} {}: dmaprof {:.0} vs ftrace {:.0} ns/call ({:+.1}%, {:.1}% allowed)",
                c.source.tag(),
                c.case,
                c.function,
                c.dmaprof,
                c.ftrace,
                c.diff() * 100.0,
                c.allowed * 100.0
            )
        })
        .collect();
    let mut notes = Vec::new();
    for source in Source::ALL {
        let mine: Vec<&&Compared> = compared.iter().filter(|c| c.source == source).collect();
        let worst = mine.iter().map(|c| c.diff().abs()).fold(0.0, f64::max);
        notes.push(format!(
            "{} {} rows within {:.1}%",
            source.tag(),
            mine.len(),
            worst * 100.0
        ));
        if mine.len() < source.min_compared() {
            problems.push(format!(
                "{}: only {} rows compared, {} needed",
                source.tag(),
                mine.len(),
                source.min_compared()
            ));
        }
    }
    problems.extend(control_problems(controls));
    if problems.is_empty() {
        Ok(format!(", {} of ftrace's function profiler", notes.join(", ")))
    } else {
        Err(problems.join("; "))
    }
}

/// The test: boots the custom kernel, profiles [`CASES`] with ftrace while dmaprof measures
/// them, prints the table and judges it.
pub(super) fn run(c: &Ctx) -> Outcome {
    let dir = scratch("ftrace-profile");
    let mut p = plan(c, true, shell(&script()));
    p.echo = std::env::var_os("DMAPROF_VM_ECHO").is_some();
    boot_ok(p, &dir)?;
    no_failed_step(&findings(&dir)?, &dir)?;
    let filter = fs::read_to_string(dir.join("filter.txt")).map_err(|e| format!("no filter.txt: {e}"))?;
    let traced = filtered(&filter);
    if let Ok(missing) = fs::read_to_string(dir.join("unfiltered.txt")) {
        eprintln!(
            "ftrace_profile: attached by dmaprof, not filterable by ftrace: {}",
            missing.split_whitespace().collect::<Vec<_>>().join(" ")
        );
    }
    let (mut verdicts, mut controls) = (Vec::new(), Vec::new());
    for case in CASES {
        let (v, k) = case_verdicts(&dir, case, &traced)?;
        verdicts.extend(v);
        controls.extend(k);
    }
    eprint!("{}", table(&verdicts, &controls));
    judge(&verdicts, &controls)
}

#[cfg(test)]
mod unit {
    use super::*;

    #[test]
    fn profile_lines_sum_over_cpus_and_fold_clones() {
        let stat = "  Function                               Hit    Time            Avg             s^2
  --------                               ---    ----            ---             ---
  folio_zero_user                        160    297743.7 us     1860.898 us     5984695 us
  vfio_sync_unpin.isra.0                   5    0.000 us        0.000 us        0.000 us
  Function                               Hit    Time            Avg             s^2
  folio_zero_user                          3    7775.237 us     2591.745 us     11068109 us
  vfio_iommu_type1_ioctl                  15    1234567 us      82304.46 us     1 us
";
        let p = profile(stat);
        assert_eq!(p["folio_zero_user"].0, 163);
        assert!((p["folio_zero_user"].1 - 305_518_937.0).abs() < 1.0);
        assert_eq!(p["vfio_sync_unpin"], (5, 0.0));
        assert_eq!(p["vfio_iommu_type1_ioctl"].1, 1_234_567_000.0);
        assert_eq!(p.len(), 3);
    }

    #[test]
    fn the_filter_names_functions_as_rows_do() {
        let f = filtered("folio_zero_user\nvfio_sync_unpin.isra.0 [vfio_iommu_type1]\nbatch_unpin [iommufd]\n");
        let want: BTreeSet<String> = ["batch_unpin", "folio_zero_user", "vfio_sync_unpin"]
            .map(String::from)
            .into();
        assert_eq!(f, want);
    }

    /// A `run` measurement of one function: dmaprof's calls and ns per iteration, ftrace's
    /// hits and ns over every iteration.
    fn measured(source: Source, f: Function, name: &str, hits: u64, ftrace_ns: f64) -> Measured {
        Measured {
            source,
            rows: [(name.to_owned(), f)].into(),
            profile: [(name.to_owned(), (hits, ftrace_ns))].into(),
        }
    }

    fn node(calls: u64, exclusive_ns: u64, inclusive_ns: u64) -> Function {
        Function {
            calls,
            exclusive_ns,
            inclusive_ns,
            leaf: false,
            callee_every_call: true,
            shares: vec![("unmap".into(), 0.9)],
            noise: 0.05,
            ..Function::default()
        }
    }

    #[test]
    fn a_function_with_callees_is_read_with_graph_time_off() {
        let traced: BTreeSet<String> = ["f".to_owned()].into();
        let n = Source::Run.iterations();
        // graph-time on reads its callees too (10x); off reads 1.02x dmaprof's exclusive.
        let runs = [
            measured(
                Source::Run,
                node(2, 100_000, 1_000_000),
                "f",
                2 * n,
                2.0 * n as f64 * 500_000.0,
            ),
            measured(
                Source::Run,
                node(2, 100_000, 1_000_000),
                "f",
                2 * n,
                2.0 * n as f64 * 51_000.0,
            ),
        ];
        let Verdict::Compared(c) = compare("c", "f", &runs, &traced) else {
            panic!("compared")
        };
        assert_eq!(c.mode, Mode::SelfTime);
        assert!((c.diff() + 0.0196).abs() < 1e-3, "{}", c.diff());
        assert!((c.allowed - 0.15).abs() < 1e-9, "the run's spread widens the tolerance");
        let k = control("c", &runs).expect("its callees hold 90%");
        assert!(control_problems(&[k]).is_empty());
        // One call too many: ftrace counted something else too.
        let runs = [
            measured(Source::Run, node(2, 100_000, 1_000_000), "f", 2 * n + 1, 1.0),
            measured(Source::Run, node(2, 100_000, 1_000_000), "f", 2 * n + 1, 1.0),
        ];
        assert!(matches!(compare("c", "f", &runs, &traced), Verdict::Skipped { .. }));
    }

    #[test]
    fn total_times_or_a_graph_time_left_on_fail_the_control() {
        let same = Control {
            case: "c",
            function: "f".into(),
            dmaprof_exclusive: 100.0,
            dmaprof_inclusive: 1000.0,
            ftrace_total: 1000.0,
            ftrace_self: 1000.0,
        };
        let problems = control_problems(&[same]);
        assert!(
            problems[0].contains("graph-time off did not take effect"),
            "{problems:?}"
        );
        assert_eq!(control_problems(&[]).len(), 1, "no control row is a failure");
    }

    #[test]
    fn rows_out_of_tolerance_or_too_few_fail() {
        let row = |source, diff: f64| {
            Verdict::Compared(Compared {
                case: "c",
                source,
                function: "f".into(),
                phases: String::new(),
                mode: Mode::Total,
                hits: 1,
                calls: 1,
                dmaprof: 100.0 * (1.0 + diff),
                probe_share: 0.0,
                ftrace: 100.0,
                allowed: TOLERANCE,
            })
        };
        let control = Control {
            case: "c",
            function: "g".into(),
            dmaprof_exclusive: 10.0,
            dmaprof_inclusive: 1000.0,
            ftrace_total: 1000.0,
            ftrace_self: 11.0,
        };
        let good: Vec<Verdict> = Source::ALL
            .into_iter()
            .flat_map(|s| [0.01, -0.05, 0.09].map(|d| row(s, d)))
            .collect();
        assert!(judge(&good, std::slice::from_ref(&control)).is_ok());
        let mut bad = good;
        bad.push(row(Source::Record, 0.12));
        let err = judge(&bad, &[control]).unwrap_err();
        assert!(err.contains("+12.0%"), "{err}");
        assert!(judge(&[row(Source::Run, 0.0)], &[]).is_err());
    }

    #[test]
    fn the_script_profiles_each_case_both_ways() {
        let s = script();
        for case in CASES {
            for (source, mode) in Source::ALL.into_iter().flat_map(|s| Mode::ALL.map(|m| (s, m))) {
                let stat = format!("/out/{case}.{}.{}.stat", source.tag(), mode.tag());
                assert!(s.contains(&stat), "{stat}");
            }
        }
        assert!(s.contains("echo 0 > $T/options/annotate"));
    }
}
