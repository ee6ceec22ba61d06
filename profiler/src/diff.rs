//! `dmaprof diff`: two runs compared case by case and phase by phase, as a table and as
//! differential flamegraphs.
use std::{
    collections::{BTreeMap, BTreeSet},
    fmt::Write as _,
    path::{Path, PathBuf},
};

use serde::{Deserialize, Serialize};

use crate::{
    category::{CATEGORIES, Category},
    flamegraph::{self, Folded},
    html,
    output::OutputError,
    report::{self, PhaseReport, ReadError, Report},
    size::HumanSize,
    sys,
    table::ms,
    workload::Phase,
};

/// One phase compared between two runs.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct PhaseDiff {
    /// Case name.
    pub case: String,
    /// Phase.
    pub phase: Phase,
    /// Median wall time before.
    pub before_ns: u64,
    /// Median wall time after.
    pub after_ns: u64,
    /// after - before.
    pub delta_ns: i64,
    /// Relative change in percent (0 when before is 0).
    pub delta_pct: f64,
    /// after / before (None when before is 0).
    #[serde(default)]
    pub ratio: Option<f64>,
    /// Whether the change is outside both runs' spread (see [`significance`]).
    #[serde(default)]
    pub significant: bool,
    /// The machine's pace in the second run over the first's, for this case (a user-space
    /// clear timed beside the untraced iterations; over 1: the machine ran slower). A change
    /// is significant only where it holds at equal pace too ([`paced_significance`]).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pace_ratio: Option<f64>,
    /// Why it is not, when it is not: a [`Noise`] in words (the diff's JSON is read by people,
    /// and keeps the words it always had).
    #[serde(default)]
    pub noise: Option<String>,
    /// Exact ns per category: (before, after, delta).
    pub exact: BTreeMap<Category, (u64, u64, i64)>,
    /// Sampled share per category, change in percentage points.
    pub sampled_pp: BTreeMap<Category, f64>,
}

/// Two runs compared case by case and phase by phase.
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
pub struct RunDiff {
    /// Kernel release before / after.
    pub kernels: (String, String),
    /// Phases present in both.
    pub phases: Vec<PhaseDiff>,
    /// Cases only in the first run.
    pub only_before: Vec<String>,
    /// Cases only in the second run.
    pub only_after: Vec<String>,
    /// How the two runs differ in set-up (size, kernel, probes, iterations): a reader must
    /// know before reading the deltas.
    #[serde(default)]
    pub warnings: Vec<String>,
}

pub use crate::significance::{MIN_CHANGE_NS, Noise, Paces, SAME_PACE, pace_ratio, paced_significance, significance};

fn phase_diff(case: &str, pa: &PhaseReport, pb: &PhaseReport, paces: Paces) -> PhaseDiff {
    let (b, a) = (pa.wall_ns.median, pb.wall_ns.median);
    let delta = a as i64 - b as i64;
    let keys: BTreeSet<&Category> = pa.exact.categories.keys().chain(pb.exact.categories.keys()).collect();
    let exact = keys
        .into_iter()
        .map(|k| {
            let x = pa.exact.categories.get(k).copied().unwrap_or(0);
            let y = pb.exact.categories.get(k).copied().unwrap_or(0);
            (*k, (x, y, y as i64 - x as i64))
        })
        .collect();
    let sampled_pp = CATEGORIES
        .iter()
        .map(|c| {
            let x = pa.sampled.categories.get(c).copied().unwrap_or(0.0);
            let y = pb.sampled.categories.get(c).copied().unwrap_or(0.0);
            (*c, (y - x) * 100.0)
        })
        .collect();
    let noise = paced_significance(&pa.wall_ns, &pb.wall_ns, paces)
        .err()
        .map(|n| n.to_string());
    PhaseDiff {
        case: case.to_owned(),
        phase: pa.name,
        before_ns: b,
        after_ns: a,
        delta_ns: delta,
        delta_pct: if b == 0 { 0.0 } else { delta as f64 / b as f64 * 100.0 },
        ratio: (b > 0).then(|| a as f64 / b as f64),
        significant: noise.is_none(),
        pace_ratio: pace_ratio(paces),
        noise,
        exact,
        sampled_pp,
    }
}

/// The phases (of `only`, or all) that got significantly slower by more than `pct` percent.
pub fn regressions(d: &RunDiff, pct: f64, only: Option<Phase>) -> Vec<&PhaseDiff> {
    d.phases
        .iter()
        .filter(|p| only.is_none_or(|o| p.phase == o))
        .filter(|p| p.significant && p.ratio.is_some_and(|r| r > 1.0 + pct / 100.0))
        .collect()
}

/// Compares two reports.
pub fn diff(before: &Report, after: &Report) -> RunDiff {
    let mut phases = Vec::new();
    for ca in &before.cases {
        let Some(cb) = after.cases.iter().find(|c| c.name == ca.name) else {
            continue;
        };
        let paces = ca.pace_ns.as_ref().zip(cb.pace_ns.as_ref());
        for pa in &ca.phases {
            if let Some(pb) = cb.phases.iter().find(|p| p.name == pa.name) {
                phases.push(phase_diff(&ca.name, pa, pb, paces));
            }
        }
    }
    let names = |r: &Report| r.cases.iter().map(|c| c.name.clone()).collect::<Vec<_>>();
    let (nb, na) = (names(before), names(after));
    let mut warnings = setup_differences(before, after);
    warnings.extend(pace_difference(&phases));
    for ca in &before.cases {
        if let Some(cb) = after.cases.iter().find(|c| c.name == ca.name) {
            warnings.extend(layout_difference(ca, cb));
        }
    }
    RunDiff {
        warnings,
        kernels: (before.kernel.release.clone(), after.kernel.release.clone()),
        only_before: nb.iter().filter(|n| !na.contains(n)).cloned().collect(),
        only_after: na.iter().filter(|n| !nb.contains(n)).cloned().collect(),
        phases,
    }
}

/// Where a case's buffer came in a different physical layout in the two runs (median runs
/// 1.5x apart or more on the map phase): a 4 KiB map follows it, so part of the change is the
/// layout's. Where both runs' untraced lines cover a common number of runs, the ratio at it.
fn layout_difference(a: &crate::report::CaseReport, b: &crate::report::CaseReport) -> Option<String> {
    // Across sizes the runs scale with the buffer: the size warning says enough.
    if a.size_bytes != b.size_bytes {
        return None;
    }
    let map = crate::workload::Phase::Map;
    let pa = a.phases.iter().find(|p| p.name == map)?;
    let pb = b.phases.iter().find(|p| p.name == map)?;
    let (ra, rb) = (pa.physical_runs.as_ref()?.median, pb.physical_runs.as_ref()?.median);
    if (ra.max(rb) as f64) < 1.5 * ra.min(rb).max(1) as f64 {
        return None;
    }
    let common = match (&pa.layout, &pb.layout) {
        (Some(la), Some(lb)) => {
            let (lo, hi) = (la.runs_seen.0.max(lb.runs_seen.0), la.runs_seen.1.min(lb.runs_seen.1));
            (lo <= hi).then(|| {
                let at = rb.clamp(lo, hi);
                let ratio = lb.predict(at) as f64 / la.predict(at).max(1) as f64;
                format!("; at {at} runs in both the untraced map is x{ratio:.2}")
            })
        }
        _ => None,
    };
    Some(format!(
        "{}: the buffer's pages came in {ra} -> {rb} physically contiguous runs (median over the untraced \
         iterations): the map follows them, not only the change{}",
        a.name,
        common.unwrap_or_else(|| "; their layouts do not overlap, so no comparison at equal layout".into())
    ))
}

/// Where the machine itself ran at another pace in the two runs: the cases and how far.
fn pace_difference(phases: &[PhaseDiff]) -> Option<String> {
    let mut paces: Vec<(&str, f64)> = phases
        .iter()
        .filter_map(|p| Some((p.case.as_str(), p.pace_ratio?)))
        .filter(|(_, r)| (r - 1.0).abs() >= SAME_PACE)
        .collect();
    paces.dedup_by(|a, b| a.0 == b.0);
    let cases = phases.iter().map(|p| p.case.as_str()).collect::<BTreeSet<_>>().len();
    let (lo, hi) = paces
        .iter()
        .fold((f64::MAX, 0.0_f64), |(lo, hi), (_, r)| (lo.min(*r), hi.max(*r)));
    (!paces.is_empty()).then(|| {
        format!(
            "the machine ran at another pace in {} of {cases} case(s) (a user-space clear timed beside the untraced \
             iterations: x{lo:.2}-x{hi:.2}, after/before): a change is marked only where it also holds at equal pace",
            paces.len()
        )
    })
}

/// How two runs' set-ups differ.
fn setup_differences(a: &Report, b: &Report) -> Vec<String> {
    let (ca, cb) = (&a.config, &b.config);
    let mut w = Vec::new();
    if ca.size_bytes != cb.size_bytes {
        let (x, y) = (HumanSize(ca.size_bytes), HumanSize(cb.size_bytes));
        w.push(format!(
            "sizes differ ({x} -> {y}): times scale with size, compare GiB/s"
        ));
    }
    if a.kernel.release != b.kernel.release {
        w.push(format!("kernels differ ({} -> {})", a.kernel.release, b.kernel.release));
    }
    if ca.probes != cb.probes || ca.traced != cb.traced {
        w.push("probes differ (--probes / --no-trace): tracing cost differs between the runs".into());
    }
    if ca.iterations != cb.iterations {
        w.push(format!(
            "iteration counts differ ({} -> {})",
            ca.iterations, cb.iterations
        ));
    }
    w
}

/// The category changes of a phase: exact ms deltas, or sampled shifts (percentage points) when
/// either run has no exact data.
fn category_changes(p: &PhaseDiff) -> String {
    let exact: Vec<String> = p
        .exact
        .iter()
        .filter(|(_, (_, _, d))| *d != 0)
        .map(|(k, (_, _, d))| format!("{k} {:+.3}", *d as f64 / 1e6))
        .collect();
    if !exact.is_empty() {
        return exact.join(", ");
    }
    let sampled: Vec<String> = p
        .sampled_pp
        .iter()
        .filter(|(_, pp)| pp.abs() >= 5.0)
        .map(|(k, pp)| format!("{k} {pp:+.0}pp"))
        .collect();
    if sampled.is_empty() {
        String::new()
    } else {
        format!("sampled: {}", sampled.join(", "))
    }
}

/// The diff as a table.
pub fn render_diff(d: &RunDiff) -> String {
    let mut out = String::new();
    let _ = writeln!(out, "before: Linux {}   after: Linux {}", d.kernels.0, d.kernels.1);
    for w in &d.warnings {
        let _ = writeln!(out, "warning: {w}");
    }
    let mut case = "";
    for p in &d.phases {
        if p.case != case {
            case = &p.case;
            let _ = writeln!(
                out,
                "\n{case}\n  {:<13}{:>12}{:>12}{:>12}{:>9}{:>10}  category changes (exact ms, or sampled pp)",
                "phase", "before ms", "after ms", "delta ms", "delta", "after/bef"
            );
        }
        // A change inside the runs' spread is shown as `~`, never as a percentage.
        let (pct, ratio) = match (p.significant, p.ratio) {
            (true, Some(r)) => (format!("{:+.1}%", p.delta_pct), format!("x{r:.2}")),
            _ => ("~".to_owned(), "~".to_owned()),
        };
        let _ = writeln!(
            out,
            "  {:<13}{:>12}{:>12}{:>12}{:>9}{:>10}  {}",
            p.phase.name(),
            ms(p.before_ns),
            ms(p.after_ns),
            format!("{:+.3}", p.delta_ns as f64 / 1e6),
            pct,
            ratio,
            category_changes(p)
        );
    }
    let changed = d.phases.iter().filter(|p| p.significant).count();
    let _ = writeln!(
        out,
        "\n{changed} of {} phases changed beyond both runs' spread (`~`: within it, or under {} us)",
        d.phases.len(),
        MIN_CHANGE_NS / 1000
    );
    for n in &d.only_before {
        let _ = writeln!(out, "only in the first run: {n}");
    }
    for n in &d.only_after {
        let _ = writeln!(out, "only in the second run: {n}");
    }
    out
}

/// The folded stacks of `case`'s `phase` in the run whose report.json sits in `base`.
fn folded_of(r: &Report, base: &Path, case: &str, phase: Phase) -> Option<Folded> {
    let p = r
        .cases
        .iter()
        .find(|c| c.name == case)?
        .phases
        .iter()
        .find(|x| x.name == phase)?;
    Folded::parse(&std::fs::read_to_string(base.join(p.folded.as_ref()?)).ok()?).ok()
}

/// Writes a differential flamegraph per phase both runs have folded stacks for (a run whose
/// folded files are gone still diffs; it just has no flamegraphs). Returns how many.
pub fn write_flamegraphs(
    d: &RunDiff,
    (a, a_path): (&Report, &Path),
    (b, b_path): (&Report, &Path),
    dir: &Path,
) -> std::io::Result<usize> {
    let base = |p: &Path| p.parent().map(Path::to_path_buf).unwrap_or_default();
    let (base_a, base_b) = (base(a_path), base(b_path));
    let mut written = 0;
    for p in &d.phases {
        let (Some(fa), Some(fb)) = (
            folded_of(a, &base_a, &p.case, p.phase),
            folded_of(b, &base_b, &p.case, p.phase),
        ) else {
            continue;
        };
        let case_dir = dir.join(&p.case);
        std::fs::create_dir_all(&case_dir)?;
        let title = format!("{} {}: before -> after", p.case, p.phase.name());
        // One flamegraph that cannot be drawn does not take the comparison with it.
        match flamegraph::write_differential(&fa, &fb, &case_dir, p.phase.name(), &title) {
            Ok(()) => written += 1,
            Err(e) => eprintln!(
                "dmaprof: warning: no differential flamegraph for {} {}: {e}",
                p.case,
                p.phase.name()
            ),
        }
    }
    Ok(written)
}

/// What the page's colours mean.
const LEGEND: &str = "<p>Rows in <span class=\"sw\" style=\"background:#fde0dd\"></span>red (&#9650;) got \
    significantly slower, in <span class=\"sw\" style=\"background:#deebf7\"></span>blue (&#9660;) significantly \
    faster: every iteration of one run beyond every iteration of the other, the medians further apart than either \
    run's own range. <code>~</code>: within the noise (hover for why). In the differential flamegraphs a frame is as \
    wide as its samples <i>after</i>; <b>red</b> frames have more samples after than before, <b>blue</b> fewer, the \
    deeper the colour the larger the change; pale frames did not change.</p>\n";

/// The comparison as a page (`diff.html`): the phases side by side with ratios, significant
/// changes marked, and the differential flamegraphs `svgs` finds (by `<case>/<phase>.svg`).
pub fn render_html(d: &RunDiff, svgs: html::SvgSource) -> String {
    let mut body = format!(
        "<h1>dmaprof diff: Linux {} &#8594; Linux {}</h1>\n",
        html::esc(&d.kernels.0),
        html::esc(&d.kernels.1)
    );
    for w in &d.warnings {
        let _ = writeln!(body, "<p class=\"warn\">{}</p>", html::esc(w));
    }
    body += LEGEND;
    body += &html_summary(d);
    let mut shared = html::SharedScripts::default();
    let mut cases: Vec<&str> = d.phases.iter().map(|p| p.case.as_str()).collect();
    cases.dedup();
    for case in cases {
        let phases: Vec<&PhaseDiff> = d.phases.iter().filter(|p| p.case == case).collect();
        body += &html_case(case, &phases, svgs, &mut shared);
    }
    for (which, names) in [("first", &d.only_before), ("second", &d.only_after)] {
        for n in names {
            let _ = writeln!(body, "<p class=\"note\">only in the {which} run: {}</p>", html::esc(n));
        }
    }
    let title = format!("dmaprof diff: {} -> {}", d.kernels.0, d.kernels.1);
    html::page(&title, &body, &shared)
}

/// A phase's change in words: percentage and ratio when significant, `~` with the reason
/// (as a tooltip) when not; and the row's class.
fn html_change(p: &PhaseDiff) -> (String, String, &'static str) {
    match (p.significant, p.ratio) {
        (true, Some(r)) => {
            let (mark, class) = if r > 1.0 {
                ("&#9650;", "slower")
            } else {
                ("&#9660;", "faster")
            };
            (format!("{mark} {:+.1}%", p.delta_pct), format!("x{r:.2}"), class)
        }
        _ => {
            let why = html::esc(p.noise.as_deref().unwrap_or(""));
            (
                format!("<span title=\"{why}\">~</span>"),
                format!("<span title=\"{why}\">~</span>"),
                "",
            )
        }
    }
}

/// Every phase in one sortable table.
fn html_summary(d: &RunDiff) -> String {
    let mut out = String::from("<h2>Every phase</h2><table class=\"data\"><thead><tr>");
    for (h, numeric) in [
        ("case", false),
        ("phase", false),
        ("before ms", true),
        ("after ms", true),
        ("delta ms", true),
        ("change", false),
        ("after/before", false),
        ("category changes (exact ms, or sampled pp)", false),
    ] {
        let _ = write!(out, "<th class=\"sort{}\">{h}</th>", if numeric { " n" } else { "" });
    }
    out += "</tr></thead><tbody>\n";
    for p in &d.phases {
        let (pct, ratio, class) = html_change(p);
        let _ = writeln!(
            out,
            "<tr class=\"{class}\"><td><a href=\"#{}\">{}</a></td><td>{}</td><td class=\"n\" data-v=\"{}\">{}</td>\
             <td class=\"n\" data-v=\"{}\">{}</td><td class=\"n\" data-v=\"{}\">{:+.3}</td><td>{pct}</td><td>{ratio}</td><td>{}</td></tr>",
            html::esc(&html::case_id(&p.case)),
            html::esc(&p.case),
            p.phase.name(),
            p.before_ns,
            ms(p.before_ns),
            p.after_ns,
            ms(p.after_ns),
            p.delta_ns,
            p.delta_ns as f64 / 1e6,
            html::esc(&category_changes(p))
        );
    }
    out + "</tbody></table>\n"
}

/// A case: each phase's exact categories before and after as two bars on one scale, and its
/// differential flamegraphs.
fn html_case(case: &str, phases: &[&PhaseDiff], svgs: html::SvgSource, shared: &mut html::SharedScripts) -> String {
    let mut out = format!(
        "<section class=\"case\" id=\"{}\"><h3>{}</h3>\n{}",
        html::esc(&html::case_id(case)),
        html::esc(case),
        html::category_legend()
    );
    let longest = phases
        .iter()
        .map(|p| p.before_ns.max(p.after_ns))
        .max()
        .unwrap_or(1)
        .max(1) as f64;
    for p in phases {
        let bar = |pick: fn(&(u64, u64, i64)) -> u64, wall: u64| {
            let shares: Vec<(Category, f64, u64)> =
                p.exact.iter().map(|(c, v)| (*c, pick(v) as f64, pick(v))).collect();
            html::stacked_bar(&shares, wall as f64 / longest * 100.0, None)
        };
        let (pct, ratio, _) = html_change(p);
        let _ = writeln!(
            out,
            "<div class=\"phase\"><b>{} before</b><span>{}</span>{}</div>\
             <div class=\"phase\"><b>after</b><span>{} · {pct} · {ratio}</span>{}</div>",
            p.phase.name(),
            html::ms_unit(p.before_ns),
            bar(|v| v.0, p.before_ns),
            html::ms_unit(p.after_ns),
            bar(|v| v.1, p.after_ns)
        );
    }
    let mut figures = String::new();
    for p in phases {
        let rel = format!("{case}/{}.svg", p.phase.name());
        if svgs(&rel).is_some() {
            figures += &html::flamegraph(
                &format!("{}: before -> after", p.phase.name()),
                Some(&rel),
                svgs,
                shared,
            )
            .0;
        }
    }
    if figures.is_empty() {
        figures = "<p class=\"note\">No differential flamegraphs: a run has no folded stacks for this case.</p>".into();
    }
    let _ = writeln!(
        out,
        "<details class=\"flamegraphs\" id=\"fg-{}\"><summary>Differential flamegraphs</summary>{figures}</details></section>",
        html::esc(case)
    );
    out
}

/// Why `dmaprof diff` could not compare two runs.
#[derive(Debug, thiserror::Error)]
pub enum DiffError {
    /// A report could not be read (exit code 2: the user named the wrong file).
    #[error(transparent)]
    Read(#[from] ReadError),
    /// diff.html could not be written.
    #[error(transparent)]
    Html(#[from] OutputError),
    /// The differential flamegraphs could not be written.
    #[error("writing differential flamegraphs into {}", dir.display())]
    Flamegraphs {
        /// Where they were to go.
        dir: PathBuf,
        /// What failed.
        #[source]
        source: std::io::Error,
    },
}

impl DiffError {
    /// Whether the user should fix their command line (exit code 2) rather than the system.
    pub fn is_usage(&self) -> bool {
        matches!(self, Self::Read(_))
    }
}

/// `dmaprof diff`: reads both reports, compares them and writes the differential flamegraphs
/// and diff.html into `dir` (default `dmaprof-out/diff-<timestamp>`). Returns the comparison
/// and its table, which ends with where the flamegraphs and the page went.
pub fn compare_files(before: &Path, after: &Path, dir: Option<PathBuf>) -> Result<(RunDiff, String), DiffError> {
    let (a, b) = (report::read(before)?, report::read(after)?);
    let d = diff(&a, &b);
    let dir = dir.unwrap_or_else(|| Path::new("dmaprof-out").join(format!("diff-{}", sys::timestamp())));
    let written = write_flamegraphs(&d, (&a, before), (&b, after), &dir).map_err(|source| DiffError::Flamegraphs {
        dir: dir.clone(),
        source,
    })?;
    let page = render_html(&d, &|rel| std::fs::read_to_string(dir.join(rel)).ok());
    std::fs::create_dir_all(&dir).map_err(|source| DiffError::Flamegraphs {
        dir: dir.clone(),
        source,
    })?;
    let html_path = dir.join("diff.html");
    crate::output::write_atomic(&html_path, &page)?;
    let text = render_diff(&d)
        + &format!(
            "\n{written} differential flamegraphs in {}\nhtml: {}\n",
            dir.display(),
            html_path.display()
        );
    Ok((d, text))
}

/// Says the gate's lines on stderr; the exit code they make (1 when there are any).
pub fn gate_exit(slower: &[String]) -> u8 {
    slower.iter().for_each(|line| eprintln!("dmaprof: {line}"));
    u8::from(!slower.is_empty())
}

/// The regression gate of `diff --fail-above PCT [--phase P]`: a line for each phase that got
/// significantly slower by more than PCT (none without a PCT). Any line means exit code 1.
pub fn gate(d: &RunDiff, fail_above: Option<f64>, phase: Option<Phase>) -> Vec<String> {
    let Some(pct) = fail_above else {
        return Vec::new();
    };
    regressions(d, pct, phase)
        .iter()
        .map(|p| {
            format!(
                "regression: {} {} x{:.2} ({:+.1}%), above {pct}%",
                p.case,
                p.phase.name(),
                p.ratio.unwrap_or(0.0),
                p.delta_pct
            )
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::report::Stats;

    fn phase(p: Phase, significant: bool, ratio: f64) -> PhaseDiff {
        PhaseDiff {
            case: "c".into(),
            phase: p,
            before_ns: 1_000_000,
            after_ns: (1e6 * ratio) as u64,
            delta_ns: 0,
            delta_pct: (ratio - 1.0) * 100.0,
            ratio: Some(ratio),
            significant,
            pace_ratio: None,
            noise: None,
            exact: BTreeMap::new(),
            sampled_pp: BTreeMap::new(),
        }
    }

    #[test]
    fn the_gate_takes_significant_slowdowns_above_the_threshold() {
        let d = RunDiff {
            phases: vec![
                phase(Phase::Map, true, 1.25),
                phase(Phase::Unmap, true, 1.05),
                phase(Phase::Mmap, false, 3.0),
                phase(Phase::Munmap, true, 0.5),
            ],
            ..RunDiff::default()
        };
        let names = |v: Vec<&PhaseDiff>| v.iter().map(|p| p.phase).collect::<Vec<_>>();
        assert_eq!(names(regressions(&d, 10.0, None)), vec![Phase::Map]);
        assert_eq!(names(regressions(&d, 3.0, None)), vec![Phase::Map, Phase::Unmap]);
        assert_eq!(names(regressions(&d, 3.0, Some(Phase::Unmap))), vec![Phase::Unmap]);
        assert!(regressions(&d, 30.0, None).is_empty());
        assert_eq!(
            gate(&d, Some(10.0), None),
            ["regression: c map x1.25 (+25.0%), above 10%"]
        );
        assert!(gate(&d, None, None).is_empty(), "no threshold, no gate");
    }

    #[test]
    fn only_changes_outside_both_spreads_count() {
        let st = |v: &[u64]| Stats::of(v.to_vec());
        assert!(significance(&st(&[100_000, 110_000, 105_000]), &st(&[200_000, 210_000, 190_000])).is_ok());
        assert_eq!(
            significance(&st(&[100_000, 150_000]), &st(&[140_000, 160_000])),
            Err(Noise::RangesOverlap)
        );
        // Unmap of two reruns of one case in the guest: apart, but by less than a run's range.
        assert_eq!(
            significance(
                &st(&[2_547_124, 2_787_421, 2_377_922, 2_301_739, 2_534_791]),
                &st(&[2_193_507, 2_079_259, 2_190_370, 1_954_888, 2_294_285])
            ),
            Err(Noise::WithinSpread)
        );
        assert_eq!(
            significance(&st(&[1_000, 1_100]), &st(&[2_000, 2_100])),
            Err(Noise::TooSmall)
        );
        assert_eq!(
            significance(&st(&[100_000]), &st(&[900_000])),
            Err(Noise::TooFewIterations)
        );
        // 8x the pages populated, one iteration of the larger run stalled to 2x the others:
        // a 7x change is beyond a 2x range.
        assert!(
            significance(
                &st(&[22_938_159, 22_524_387, 21_370_179]),
                &st(&[160_710_850, 315_822_564, 158_355_375])
            )
            .is_ok()
        );
        // As far apart as the stalled run spans is within its spread.
        assert_eq!(
            significance(&st(&[100_000, 105_000, 102_000]), &st(&[190_000, 200_000, 400_000])),
            Err(Noise::WithinSpread)
        );
        // Two reruns' maps in the guest: 4.2% apart, ranges tight and apart.
        assert_eq!(
            significance(
                &st(&[20_202_438, 20_150_000, 20_260_000]),
                &st(&[19_347_110, 19_300_000, 19_390_000])
            ),
            Err(Noise::TooSmallShare)
        );
        // report.json and the diff's JSON keep the words they had.
        assert_eq!(Noise::TooSmall.to_string(), "change under 20 us");
    }

    #[test]
    fn a_change_of_the_machines_pace_is_not_a_change() {
        let st = |v: &[u64]| Stats::of(v.to_vec());
        // Two processes of one build in one guest boot, one after the other: the map 1.54x
        // apart with tight ranges, and the user-space clear timed beside them 1.33x.
        let (before, after) = (
            st(&[34_451_401, 30_485_565, 30_913_417, 31_999_213, 32_414_031]),
            st(&[47_759_395, 49_298_862, 48_387_673, 51_797_918, 54_887_811]),
        );
        let pace = |ns: u64| st(&[ns; 5]);
        let (slow, fast) = (pace(3_807_910), pace(2_860_263));
        let (same, faster) = (pace(2_888_866), pace(2_288_210));
        assert_eq!(significance(&before, &after), Ok(()), "apart without the pace");
        assert_eq!(
            paced_significance(&before, &after, Some((&fast, &slow))),
            Err(Noise::MachinePace)
        );
        // A kernel that got 1.5x slower at the same pace is still slower.
        assert_eq!(paced_significance(&before, &after, Some((&fast, &same))), Ok(()));
        assert_eq!(paced_significance(&before, &after, None), Ok(()));
        // The machine got faster while the map got slower: the change only grows.
        assert_eq!(paced_significance(&before, &after, Some((&fast, &faster))), Ok(()));
    }

    #[test]
    fn a_change_is_held_iteration_by_iteration_at_the_pace_beside_it() {
        let st = |v: &[u64]| Stats::of(v.to_vec());
        // Two reruns' unmaps in one guest boot: 0.58x apart, at a median pace of 0.77x, the
        // host's speed moving within each run.
        let (before, after) = (
            st(&[4_840_549, 5_669_939, 4_742_445, 4_758_529, 4_632_577]),
            st(&[2_511_645, 2_898_248, 2_777_505, 2_989_969, 2_775_679]),
        );
        let pa = st(&[2_815_510, 2_864_935, 2_314_077, 2_370_323, 2_481_381]);
        let pb = st(&[1_453_207, 1_930_889, 1_918_400, 1_937_670, 1_479_408]);
        assert_eq!(significance(&before, &after), Ok(()));
        // At the median pace alone they are 1.32x apart, within their ranges together (1.22x
        // and 1.19x); iteration by iteration they overlap.
        let (flat_a, flat_b) = (st(&[pa.median; 5]), st(&[pb.median; 5]));
        assert_eq!(
            paced_significance(&before, &after, Some((&flat_a, &flat_b))),
            Err(Noise::MachinePace)
        );
        assert_eq!(
            paced_significance(&before, &after, Some((&pa, &pb))),
            Err(Noise::MachinePace)
        );
        // Apart at the median pace, but one iteration ran at a pace that puts it among the
        // other run's: the ranges are held iteration by iteration.
        let ms = |v: &[f64]| st(&v.iter().map(|x| (x * 1e6) as u64).collect::<Vec<_>>());
        let (steady, quick) = (ms(&[10.0, 10.1, 10.2, 10.3, 10.4]), ms(&[6.0; 5]));
        let (one, half) = (ms(&[1.0; 5]), ms(&[0.5, 0.5, 0.5, 0.5, 0.6]));
        let (flat_one, flat_half) = (ms(&[1.0; 5]), ms(&[0.5; 5]));
        assert_eq!(
            paced_significance(&steady, &quick, Some((&flat_one, &flat_half))),
            Ok(())
        );
        assert_eq!(
            paced_significance(&steady, &quick, Some((&one, &half))),
            Err(Noise::MachinePace)
        );
        // A kernel that unmaps 2x faster at those paces still does.
        let halved = st(&after.runs.iter().map(|r| r / 2).collect::<Vec<_>>());
        assert_eq!(paced_significance(&before, &halved, Some((&pa, &pb))), Ok(()));
        // 64 MiB against 256 MiB in one boot, one pace of the larger run timed through a stall:
        // 4x apart whatever the paces.
        let (small, large) = (
            st(&[51_995_446, 50_249_924, 48_937_694, 49_887_383, 50_612_453]),
            st(&[177_866_589, 202_185_816, 206_425_130]),
        );
        let (ps, pl) = (
            st(&[3_183_732, 3_148_410, 2_972_024, 3_023_526, 3_017_773]),
            st(&[3_658_685, 3_875_666, 2_258_581]),
        );
        assert_eq!(paced_significance(&small, &large, Some((&ps, &pl))), Ok(()));
        // Paces that do not line up with the iterations are held at the median only.
        let short = st(&half.runs[..3]);
        assert_eq!(paced_significance(&steady, &quick, Some((&one, &short))), Ok(()));
    }

    #[test]
    fn a_pace_difference_is_told_once_per_case() {
        let mut d = RunDiff::default();
        for (case, pace) in [("a", Some(1.3)), ("a", Some(1.3)), ("b", Some(1.01)), ("c", None)] {
            let mut p = phase(Phase::Map, false, 1.0);
            p.case = case.into();
            p.pace_ratio = pace;
            d.phases.push(p);
        }
        let w = pace_difference(&d.phases).expect("case a's pace is told");
        assert!(w.contains("in 1 of 3 case(s)") && w.contains("x1.30-x1.30"), "{w}");
        d.phases.retain(|p| p.case != "a");
        assert_eq!(pace_difference(&d.phases), None);
    }

    #[test]
    fn a_different_layout_is_told_with_the_ratio_at_equal_layout() {
        let r = crate::report::parse(include_str!("../tests/data/matrix-7.3.json")).unwrap();
        let mut a = r.cases[0].clone();
        let mut b = a.clone();
        let set = |c: &mut crate::report::CaseReport, runs: &[u64], ms: &[f64]| {
            let p = c.phases.iter_mut().find(|p| p.name == Phase::Map).unwrap();
            p.physical_runs = Some(Stats::of(runs.to_vec()));
            let pts: Vec<(u64, u64)> = runs.iter().zip(ms).map(|(r, m)| (*r, (m * 1e6) as u64)).collect();
            p.layout = crate::layout::LayoutModel::fit(&pts);
        };
        // Before mostly contiguous, after mostly scattered; at equal layout after is 10% faster.
        set(&mut a, &[500, 600, 16_000], &[70.0, 71.0, 110.0]);
        set(&mut b, &[550, 15_000, 16_000], &[63.0, 96.0, 99.0]);
        let w = layout_difference(&a, &b).expect("600 -> 15000 runs is told");
        assert!(w.contains("600 -> 15000 physically contiguous runs"), "{w}");
        assert!(w.contains("x0.9"), "{w}");
        assert_eq!(layout_difference(&a, &a), None, "same layout: nothing to say");
        b.size_bytes *= 4;
        assert_eq!(layout_difference(&a, &b), None, "another size: its own warning");
    }
}
