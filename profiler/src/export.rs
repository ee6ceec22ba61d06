//! Machine formats of a report: KTAP (version 1, as the kernel selftests print it: one test per
//! case, phase times and shares as `#` diagnostics, kselftest's totals line) and CSV (one row
//! per case and phase, every category, for spreadsheets); [`render`] picks one of these, the
//! JSON or the tables.
use std::{fmt::Write as _, path::Path};

use crate::{
    category::{CATEGORIES, Category},
    cli::Format,
    recording,
    report::{self, ParseError, PhaseReport, ReadError, Report},
    table,
};

/// A saved report, `run`'s or `record`'s (told apart by its schema), in the format asked for.
/// A recording has no KTAP form (KTAP's tests are `run`'s cases).
pub fn render_file(path: &Path, format: Format) -> Result<String, ReadError> {
    let Some(r) = recording::read(path) else {
        return report::read(path).map(|r| render(&r, format, None));
    };
    let r = r?;
    match format {
        Format::Table => Ok(recording::render(&r)),
        Format::Json => Ok(recording::render_as(&r, true, None)),
        Format::Csv => Ok(recording::csv(&r)),
        Format::Ktap => Err(ReadError::Format {
            path: path.display().to_string(),
            reason: ParseError::OtherSchema(recording::SCHEMA.into()),
        }),
    }
}

/// `report` in the format asked for; the table ends with where the report is (`path`) and
/// the HTML report next to it, when there is one.
pub fn render(report: &Report, format: Format, path: Option<&Path>) -> String {
    match format {
        Format::Table => {
            let at = path.map_or(String::new(), |p| {
                let html = p.with_file_name(crate::output::INDEX);
                let html = if html.is_file() {
                    format!("html: {}\n", html.display())
                } else {
                    String::new()
                };
                format!("\nreport: {}\n{html}", p.display())
            });
            table::render_table(report) + &at
        }
        Format::Json => serde_json::to_string_pretty(report).expect("a report serialises") + "\n",
        Format::Ktap => ktap(report),
        Format::Csv => csv(report),
    }
}

/// `dmaprof report`: the saved report at `path` in the format asked for, or with `html` the
/// HTML report (re)written beside it and its path.
pub fn saved(report: &Report, path: &Path, format: Format, html: bool) -> Result<String, crate::output::OutputError> {
    if !html {
        return Ok(render(report, format, None));
    }
    let dir = path
        .parent()
        .filter(|d| !d.as_os_str().is_empty())
        .unwrap_or(Path::new("."));
    let written = crate::output::write_index(dir, report)?;
    Ok(format!("html: {}\n", written.display()))
}

/// Any of dmaprof's types as pretty JSON, with a final newline.
pub fn json(v: &impl serde::Serialize) -> String {
    serde_json::to_string_pretty(v).expect("dmaprof's types serialise") + "\n"
}

fn ms(ns: u64) -> String {
    format!("{:.3}", ns as f64 / 1e6)
}

/// A phase's shares, exact (less probe cost) where measured, else sampled, largest first,
/// those of 1% or more.
fn top_shares(p: &PhaseReport) -> String {
    let shares: Vec<(Category, f64)> = CATEGORIES
        .iter()
        .map(|c| (*c, share(p, *c, p.exact.available)))
        .filter(|(_, s)| *s >= 0.01)
        .collect();
    let mut shares = shares;
    shares.sort_by(|a, b| b.1.total_cmp(&a.1));
    let source = if p.exact.available { "exact" } else { "sampled" };
    if shares.is_empty() {
        return String::new();
    }
    let list: Vec<String> = shares
        .iter()
        .map(|(c, s)| format!("{} {:.0}%", label(*c, p.exact.available), s * 100.0))
        .collect();
    format!("; {source}: {}", list.join(", "))
}

/// A category's name; exact's `user` is what no probe saw.
fn label(cat: Category, exact: bool) -> &'static str {
    match cat {
        Category::User if exact => "unattributed",
        c => c.name(),
    }
}

/// The share of `cat` in `p`, exact (of the wall time less probe cost; `user` is the
/// unattributed rest) or sampled.
fn share(p: &PhaseReport, cat: Category, exact: bool) -> f64 {
    if exact {
        p.exact.share(cat)
    } else {
        p.sampled.categories.get(&cat).copied().unwrap_or(0.0)
    }
}

/// The report as KTAP version 1: a test per case in the order cases ran, then the failed and
/// skipped ones; `Bail out!` when the run was interrupted.
pub fn ktap(report: &Report) -> String {
    let failed = |name: &str| report.failed.iter().any(|f| f.name == name);
    let ran: Vec<_> = report.cases.iter().filter(|c| !failed(&c.name)).collect();
    let total = ran.len() + report.failed.len() + report.skipped.len();
    let mut out = format!("KTAP version 1\n1..{total}\n");
    let _ = writeln!(
        out,
        "# dmaprof {} on Linux {}, {} bytes per case",
        report.dmaprof_version, report.kernel.release, report.config.size_bytes
    );
    let mut n = 0;
    for case in &ran {
        for p in &case.phases {
            let _ = writeln!(
                out,
                "# {} {}: {} ms median of {} ({}){}",
                case.name,
                p.name.name(),
                ms(p.wall_ns.median),
                p.wall_ns.runs.len(),
                p.wall_pass,
                top_shares(p)
            );
        }
        n += 1;
        let _ = writeln!(out, "ok {n} {}", case.name);
    }
    for f in &report.failed {
        n += 1;
        let _ = writeln!(out, "# {}: {}", f.name, f.error.replace('\n', " "));
        let _ = writeln!(out, "not ok {n} {}", f.name);
    }
    for s in &report.skipped {
        n += 1;
        let _ = writeln!(out, "ok {n} {} # SKIP {}", s.name, s.reason.replace('\n', " "));
    }
    if report.partial {
        out += "Bail out! interrupted: the cases after the last one listed did not run\n";
    }
    let _ = writeln!(
        out,
        "# Totals: pass:{} fail:{} xfail:0 xpass:0 skip:{} error:0",
        ran.len(),
        report.failed.len(),
        report.skipped.len()
    );
    out
}

/// The report as CSV: one row per case and phase; wall times in ms, then every category's
/// exact share and sampled share in percent (empty where not measured).
pub fn csv(report: &Report) -> String {
    let mut out = String::from("case,phase,wall_pass,median_ms,ci_low_ms,ci_high_ms,gib_per_s,minor_faults,samples");
    for c in CATEGORIES {
        let _ = write!(out, ",exact_{}_pct", label(*c, true));
    }
    for c in CATEGORIES {
        let _ = write!(out, ",sampled_{c}_pct");
    }
    out.push('\n');
    for case in &report.cases {
        for p in &case.phases {
            let _ = write!(
                out,
                "{},{},{},{},{},{},{:.3},{},{}",
                case.name,
                p.name.name(),
                p.wall_pass,
                ms(p.wall_ns.median),
                p.wall_ci.map_or(String::new(), |c| ms(c.low)),
                p.wall_ci.map_or(String::new(), |c| ms(c.high)),
                p.gib_per_s,
                p.counters.minor_faults,
                p.sampled.samples
            );
            for (exact, on) in [(true, p.exact.available), (false, p.sampled.samples > 0)] {
                for c in CATEGORIES {
                    let cell = if on {
                        format!("{:.2}", share(p, *c, exact) * 100.0)
                    } else {
                        String::new()
                    };
                    let _ = write!(out, ",{cell}");
                }
            }
            out.push('\n');
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn saved() -> Report {
        crate::report::parse(include_str!("../tests/data/matrix-7.3.json")).expect("the saved report parses")
    }

    #[test]
    fn ktap_has_a_plan_a_test_per_case_and_totals() {
        let mut r = saved();
        r.skipped.push(crate::report::Skipped {
            name: "iommufd_memfd_hugetlb_1gb.none".into(),
            reason: "no 1 GiB pages".into(),
        });
        let k = ktap(&r);
        let lines: Vec<&str> = k.lines().collect();
        assert_eq!(lines[0], "KTAP version 1");
        assert_eq!(lines[1], format!("1..{}", r.cases.len() + 1));
        let results = lines
            .iter()
            .filter(|l| l.starts_with("ok ") || l.starts_with("not ok "))
            .count();
        assert_eq!(results, r.cases.len() + 1);
        assert!(k.contains("ok 1 vfio_type1_iommu_anonymous.none\n"), "{k}");
        assert!(k.contains("# SKIP no 1 GiB pages"));
        assert!(k.contains("# vfio_type1_iommu_anonymous.none map: "));
        assert!(k.ends_with(&format!(
            "# Totals: pass:{} fail:0 xfail:0 xpass:0 skip:1 error:0\n",
            r.cases.len()
        )));
        // Only comments between the plan and the results: nothing a parser could misread.
        assert!(lines[2..].iter().all(|l| l.starts_with('#') || l.starts_with("ok ")));
    }

    #[test]
    fn csv_has_a_row_per_case_and_phase_and_every_category() {
        let r = saved();
        let c = csv(&r);
        let rows: Vec<&str> = c.lines().collect();
        let phases: usize = r.cases.iter().map(|c| c.phases.len()).sum();
        assert_eq!(rows.len(), 1 + phases);
        let width = rows[0].split(',').count();
        assert_eq!(width, 9 + 2 * CATEGORIES.len());
        assert!(rows.iter().all(|r| r.split(',').count() == width));
        assert!(rows[0].contains("exact_iommu_lookup_pct") && rows[0].contains("sampled_release_pct"));
    }
}
