//! `dmaprof diff`: two runs compared case by case and phase by phase, as a table and as
//! differential flamegraphs.
use std::{
    collections::{BTreeMap, BTreeSet},
    fmt::Write as _,
    path::Path,
};

use serde::{Deserialize, Serialize};

use crate::{
    category::{CATEGORIES, Category},
    flamegraph::{self, Folded},
    report::{PhaseReport, Report},
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
    /// Exact ns per category: (before, after, delta).
    pub exact: BTreeMap<Category, (u64, u64, i64)>,
    /// Sampled share per category, change in percentage points.
    pub sampled_pp: BTreeMap<Category, f64>,
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

fn phase_diff(case: &str, pa: &PhaseReport, pb: &PhaseReport) -> PhaseDiff {
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
    PhaseDiff {
        case: case.to_owned(),
        phase: pa.name,
        before_ns: b,
        after_ns: a,
        delta_ns: delta,
        delta_pct: if b == 0 { 0.0 } else { delta as f64 / b as f64 * 100.0 },
        exact,
        sampled_pp,
    }
}

/// Compares two reports.
pub fn diff(before: &Report, after: &Report) -> RunDiff {
    let mut phases = Vec::new();
    for ca in &before.cases {
        let Some(cb) = after.cases.iter().find(|c| c.name == ca.name) else {
            continue;
        };
        for pa in &ca.phases {
            if let Some(pb) = cb.phases.iter().find(|p| p.name == pa.name) {
                phases.push(phase_diff(&ca.name, pa, pb));
            }
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
            p.phase.name(),
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
        flamegraph::write_differential(&fa, &fb, &case_dir, p.phase.name(), &title)?;
        written += 1;
    }
    Ok(written)
}
