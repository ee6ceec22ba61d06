//! A before/after comparison across kernels points the way the untraced truth does: the same
//! case on debian-6.12 and on the custom 7.3 kernel, run with default options and with
//! `--no-trace`, compared phase by phase and through `dmaprof diff`.
use std::{fs, path::Path};

use serde_json::Value;

use super::{Ctx, KernelName, Outcome, boot_ok, case, findings, no_failed_step, ns, phase, plan, scratch, shell};
use crate::size::ByteSize;

/// The case and size where traced numbers once inverted the comparison (map unchanged and
/// unmap 1.4x slower on 7.3 traced, against 6x and 2x faster untraced).
const CASE: &str = "vfio_type1_iommu_anonymous_hugetlb_2mb.touch";
const SIZE: &str = "512M";
/// A ratio this close to 1 has no direction to agree on.
const SAME: f64 = 0.1;

fn script() -> String {
    format!(
        "D='/bin/dmaprof run --json -b {SIZE} -v {CASE}'\n\
         $D -o /out/default > /dev/null 2>> /out/err.txt || v default_exit $?\n\
         $D --no-trace -o /out/untraced > /dev/null 2>> /out/err.txt || v untraced_exit $?\n"
    )
}

/// Boots `kernel`, runs both, returns where the output landed.
fn run_on(c: &Ctx, kernel: &crate::vm::kernel::Kernel, name: &str) -> Result<std::path::PathBuf, String> {
    let dir = scratch(&format!("direction-{name}"));
    let mut p = plan(c, true, shell(&script()));
    p.kernel = kernel;
    p.mem = ByteSize::new(2 << 30).expect("2 GiB");
    boot_ok(p, &dir)?;
    no_failed_step(&findings(&dir).unwrap_or_default(), &dir)?;
    Ok(dir)
}

fn median(dir: &Path, run: &str, ph: &str) -> Result<f64, String> {
    let text = fs::read_to_string(dir.join(run).join("report.json")).map_err(|e| format!("{run}: {e}"))?;
    let r: Value = serde_json::from_str(&text).map_err(|e| format!("{run}: {e}"))?;
    Ok(ns(&phase(case(&r, CASE)?, ph)?["wall_ns"]["median"]))
}

/// The diff's significant map and unmap changes go the way the untraced runs do.
fn diff_agrees(d: &Value, before: &Path, after: &Path) -> Vec<String> {
    let phases = d["phases"].as_array().cloned().unwrap_or_default();
    ["map", "unmap"]
        .iter()
        .filter_map(|ph| {
            let p = phases.iter().find(|p| p["phase"] == *ph)?;
            let truth = median(after, "untraced", ph).ok()? / median(before, "untraced", ph).ok()?.max(1.0);
            let shown = p["ratio"].as_f64()?;
            let wrong = p["significant"] == true && (shown - 1.0).signum() != (truth - 1.0).signum();
            wrong.then(|| format!("dmaprof diff marks {ph} {shown:.2}x, untraced it is {truth:.2}x"))
        })
        .collect()
}

/// Phase by phase, the default run's after/before ratio goes the way the untraced one does.
pub(super) fn kernels_compare(c: &Ctx) -> Outcome {
    let old = c
        .bed
        .kernel(KernelName::Debian612)
        .as_ref()
        .map_err(|e| format!("debian-6.12: {e}"))?;
    let before = run_on(c, old, "debian-6.12")?;
    let after = run_on(c, c.kernel, "custom")?;
    let mut lines = Vec::new();
    let mut problems = Vec::new();
    for ph in ["map", "unmap"] {
        let ratio =
            |run: &str| -> Result<f64, String> { Ok(median(&after, run, ph)? / median(&before, run, ph)?.max(1.0)) };
        let (default, untraced) = (ratio("default")?, ratio("untraced")?);
        lines.push(format!(
            "{ph}: 7.3/6.12 {default:.2}x by default, {untraced:.2}x untraced"
        ));
        if (untraced - 1.0).abs() > SAME && (default - 1.0).signum() != (untraced - 1.0).signum() {
            problems.push(format!(
                "{ph} points the other way by default: {default:.2}x against {untraced:.2}x"
            ));
        }
    }
    let diff = std::process::Command::new(c.dmaprof)
        .args(["diff", "--json"])
        .arg(before.join("default/report.json"))
        .arg(after.join("default/report.json"))
        .output()
        .map_err(|e| format!("dmaprof diff: {e}"))?;
    let d: Value = serde_json::from_slice(&diff.stdout)
        .map_err(|e| format!("dmaprof diff: {e}: {}", String::from_utf8_lossy(&diff.stderr)))?;
    problems.extend(diff_agrees(&d, &before, &after));
    match problems.is_empty() {
        true => Ok(format!(", {}", lines.join("; "))),
        false => Err(format!("{} ({})", problems.join("; "), lines.join("; "))),
    }
}
