//! The tables `dmaprof run` and `dmaprof report` print.
use std::fmt::Write as _;

use crate::{
    category::{CATEGORIES, Category},
    probes::{AttachedBy, Mechanism, NOT_REQUESTED, Pass},
    report::{CaseReport, OverheadBasis, PhaseReport, Report, off_cpu_heavy, samples_short},
    size::HumanSize,
};

/// Milliseconds with as many decimals as the magnitude deserves.
pub fn ms(ns: u64) -> String {
    let ms = ns as f64 / 1e6;
    if ms >= 100.0 {
        format!("{ms:.0}")
    } else if ms >= 1.0 {
        format!("{ms:.2}")
    } else {
        format!("{ms:.3}")
    }
}

/// Renders the human-readable tables: a header, one table per case, then what was skipped,
/// failed or not attached.
pub fn render_table(report: &Report) -> String {
    let mut out = header(report);
    for case in &report.cases {
        out += &case_table(case);
    }
    out += &footer(report);
    out += &sweeps(report);
    out += &findings(report);
    out
}

/// How each swept case's cost grows: per phase, the total and each category's line.
fn sweeps(report: &Report) -> String {
    let mut out = String::new();
    if report.sweeps.is_empty() {
        return out;
    }
    out += "
Size sweep (least squares over each size's fastest untraced iteration: fixed + per GiB, R^2, shape; plots in <case>/sweep.svg):
";
    for s in &report.sweeps {
        let _ = writeln!(out, "  {}", s.case);
        for p in s.phases.iter().filter(|p| p.phase.is_dma() || !p.categories.is_empty()) {
            let _ = writeln!(
                out,
                "    {:<8} total    {}",
                p.phase.name(),
                crate::sweep::describe(&p.total)
            );
            for (c, f) in &p.categories {
                let _ = writeln!(out, "    {:<8} {:<8} {}", "", c.short(), crate::sweep::describe(f));
            }
        }
    }
    out
}

/// How many findings the table's closing block names.
const TOP_FINDINGS: usize = 3;

/// The largest findings of `dmaprof explain`, a line each.
fn findings(report: &Report) -> String {
    let e = crate::explain::explain(report);
    let mut out = String::new();
    if e.findings.is_empty() {
        return out;
    }
    out += "\nFindings (largest first; `dmaprof explain <report.json>` for why, evidence and the rest):\n";
    for f in e.findings.iter().take(TOP_FINDINGS) {
        let _ = writeln!(out, "  {} {}: {}; fix: {}", f.case, f.phase.name(), f.what, f.fix);
    }
    out
}

fn header(report: &Report) -> String {
    let mut out = String::new();
    let c = &report.config;
    let sampled = report
        .probes
        .iter()
        .any(|p| p.mechanism == AttachedBy::PerfEvent && p.attached);
    let how = match (c.traced, sampled) {
        (false, _) => "untraced (--no-trace): wall times only, no breakdown, no flamegraphs".to_owned(),
        (true, true) => format!("sampling at {} Hz", c.freq_hz),
        (true, false) => "no stack sampling".to_owned(),
    };
    let partial = if report.partial {
        " -- PARTIAL (interrupted)"
    } else {
        ""
    };
    let _ = writeln!(
        out,
        "dmaprof on Linux {} ({}), {} per case, {how}{partial}",
        report.kernel.release,
        report.kernel.machine,
        HumanSize(c.size_bytes),
    );
    let _ = writeln!(out, "{}", passes_line(report));
    let t = &report.kernel.thp;
    let word = |v: &Option<String>| v.clone().unwrap_or_else(|| "-".into());
    let _ = writeln!(
        out,
        "THP: enabled {}, shmem {}, defrag {}; --thp {}",
        word(&t.enabled),
        word(&t.shmem_enabled),
        word(&t.defrag),
        c.thp
    );
    if let Some(f) = &report.floors {
        let _ = writeln!(
            out,
            "floors: clears memory at {:.2} GiB/s, a 4 KiB fault takes {}, an empty VFIO ioctl {}",
            f.clear_gib_per_s,
            f.fault_4k_ns.map_or("-".into(), |n| format!("{n} ns")),
            f.empty_ioctl_ns.map_or("- (no VFIO)".into(), |n| format!("{n} ns"))
        );
    }
    if let Some(line) = pace_line(report) {
        let _ = writeln!(out, "{line}");
    }
    let unavailable = report
        .cases
        .iter()
        .flat_map(|c| &c.phases)
        .find_map(|p| p.exact.unavailable.as_deref());
    if c.traced
        && let Some(why) = unavailable
    {
        let _ = writeln!(out, "exact attribution unavailable: {why}");
    }
    let with = |p: bool| {
        let ids: Vec<&str> = report
            .kernel
            .features
            .iter()
            .filter(|f| f.present == Some(p))
            .map(|f| f.id.name())
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
    out
}

/// How many iterations each pass ran, and the confidence level of the headline medians.
fn passes_line(report: &Report) -> String {
    let c = &report.config;
    let runs: Vec<String> = c
        .passes
        .iter()
        .map(|p| match p {
            Pass::Untraced => format!("{} untraced", c.iterations),
            p => format!("{} {p}", c.traced_iterations),
        })
        .collect();
    let level = report
        .cases
        .iter()
        .flat_map(|c| &c.phases)
        .find_map(|p| p.wall_ci)
        .map(|ci| ci.level);
    let ci = level.map_or(String::new(), |l| {
        format!(
            "; ci: {:.0}% confidence interval of the median (order statistics)",
            l * 100.0
        )
    });
    format!("passes per case: {} iterations, interleaved{ci}", runs.join(" + "))
}

fn case_table(case: &CaseReport) -> String {
    let mut out = String::new();
    match &case.map_ioctl {
        Some(ioctl) => _ = writeln!(out, "\n{} (map: {ioctl})", case.name),
        None => _ = writeln!(out, "\n{}", case.name),
    }
    let _ = write!(
        out,
        "  {:<13}{:>10}{:>10}{:>10}{:>8}{:>8}{:>8}{:>11}{:>15}{:>8}",
        "phase",
        "median ms",
        "ci low",
        "ci high",
        "GiB/s",
        "exact x",
        "smpl x",
        "kernel %",
        "faults cpu/min",
        "samples"
    );
    let columns = columns(case);
    for c in &columns {
        let _ = write!(out, " {:>9}", c.short());
    }
    out.push('\n');
    for p in &case.phases {
        out += &phase_row(p, &columns);
        out += &exact_row(p, &columns);
    }
    out += &demoted(case);
    out += &allocated(case);
    out += &cut_stacks(case);
    out += &layout(case);
    out += &pass_probe_cost(case);
    out
}

/// Probe hits in a phase's exact pass below which its summed cost is not shown: a few calls
/// cost microseconds, and the measured difference there is the untraced iterations' noise.
const PASS_COST_MIN_HITS: u64 = 1000;

/// The calibrated probe cost against the measured one, summed over an exact pass of two or
/// more iterations (one iteration's is on its exact row), with the measured sum's noise: how
/// far the calibration can be trusted on this machine.
fn pass_probe_cost(case: &CaseReport) -> String {
    let costs: Vec<_> = (case.phases.iter())
        .filter_map(|p| {
            let c = p.passes.get(&Pass::Exact)?.probe_cost?;
            (c.iterations >= 2 && c.hits >= PASS_COST_MIN_HITS).then_some((p.name, c))
        })
        .collect();
    let Some(n) = costs.first().map(|(_, c)| c.iterations) else {
        return String::new();
    };
    let parts: Vec<String> = (costs.iter())
        .map(|(phase, c)| {
            let measured = match c.measured_ns {
                m if m < 0 => format!("-{}", ms(m.unsigned_abs())),
                m => ms(m as u64),
            };
            let noise = c.noise_ns.map_or(String::new(), |n| format!(" +- {}", ms(n)));
            let ratio = match c.measured_ns {
                m if m > 0 => format!(", {:.2}x", c.calibrated_ns as f64 / m as f64),
                _ => String::new(),
            };
            let range = c.calibrated_range_ns.map_or(String::new(), |(low, high)| {
                format!(
                    " ({}-{} by a syscall loop's, user faults' and kernel faults' cost per hit)",
                    ms(low),
                    ms(high)
                )
            });
            format!(
                "{} {} ms calibrated{range}, {measured}{noise} ms measured ({} hits{ratio})",
                phase.name(),
                ms(c.calibrated_ns),
                c.hits
            )
        })
        .collect();
    format!("  probe cost over {n} exact iterations: {}\n", parts.join("; "))
}

/// How physically contiguous the buffer came, iteration by iteration, where that moved the map
/// (its runs differ by more than 10% between iterations): traced iterations are held against
/// the untraced line at their own layout.
fn layout(case: &CaseReport) -> String {
    let Some(p) = case.phases.iter().find(|p| p.name == crate::workload::Phase::Map) else {
        return String::new();
    };
    let (Some(runs), Some(line)) = (&p.physical_runs, &p.layout) else {
        return String::new();
    };
    if (runs.max as f64) < runs.min as f64 * 1.1 {
        return String::new();
    }
    let exact = p
        .exact
        .physical_runs
        .map_or(String::new(), |r| format!(", the exact iteration {r}"));
    let sampled = (p.passes.get(&crate::probes::Pass::Sampled))
        .and_then(|s| s.physical_runs.as_ref())
        .map_or(String::new(), |r| format!(", the sampled {}", r.median));
    let discarded: Vec<String> = (case.layout_reruns.iter())
        .map(|r| format!("{} {}", r.pass, r.physical_runs))
        .collect();
    let rerun = if discarded.is_empty() {
        String::new()
    } else {
        format!(
            " (run again, far from the layout they are held against: {})",
            discarded.join(", ")
        )
    };
    let follows = if line.follows() {
        format!(
            "untraced map {} ms + {:.2} us per run",
            ms(line.intercept_ns.max(0.0) as u64),
            line.ns_per_run / 1e3
        )
    } else {
        "the untraced map did not rise with them, so traced iterations are held against its median".into()
    };
    let off = crate::report::breakdown_off_headline(p, case.size_bytes / 4096).map_or(String::new(), |o| {
        format!(
            "; the breakdown is of the exact iteration's layout, which no untraced iteration had ({} ms against \
             the headline's {} ms)",
            ms(o.exact_ns),
            ms(o.headline_ns)
        )
    });
    format!(
        "  physical layout: {}-{} contiguous runs over the untraced iterations{exact}{sampled}{rerun}; {follows}{off}\n",
        runs.min, runs.max,
    )
}

/// The samples each phase's shares leave out: their stack stopped at a retpoline thunk.
fn cut_stacks(case: &CaseReport) -> String {
    let parts: Vec<String> = case
        .phases
        .iter()
        .filter(|p| p.sampled.cut > 0)
        .map(|p| format!("{} {} of {}", p.name.name(), p.sampled.cut, p.sampled.samples))
        .collect();
    match parts.is_empty() {
        true => String::new(),
        false => format!(
            "  samples cut at a retpoline thunk (no caller: left out of the sampled shares): {}\n",
            parts.join("; ")
        ),
    }
}

/// The pages each phase allocated, by size (the exact pass's kmem:mm_page_alloc counts).
fn allocated(case: &CaseReport) -> String {
    let parts: Vec<String> = case
        .phases
        .iter()
        .filter_map(|p| {
            let by_order = p.counters.page_allocs.as_ref().filter(|a| !a.is_empty())?;
            let sizes: Vec<String> = by_order
                .iter()
                .rev()
                .map(|(order, n)| {
                    let size = HumanSize(4096 << order)
                        .to_string()
                        .replace(" KiB", "K")
                        .replace(" MiB", "M");
                    format!(
                        "{n} x {size}{}",
                        if *order as usize == crate::abi::PAGE_ORDERS - 1 {
                            "+"
                        } else {
                            ""
                        }
                    )
                })
                .collect();
            Some(format!("{} {}", p.name.name(), sizes.join(" + ")))
        })
        .collect();
    match parts.is_empty() {
        true => String::new(),
        false => format!("  pages allocated: {}\n", parts.join("; ")),
    }
}

/// Which rows the exact pass ran without, and where their time went.
fn demoted(case: &CaseReport) -> String {
    let mut out = String::new();
    for (phase, line) in crate::report::describe_demoted(&case.demoted) {
        let split = case.phases.iter().any(|p| p.name == phase && p.exact.split_ns > 0);
        let whither = if split {
            "their time is in their callers' rows, split by the sampled stacks"
        } else {
            "their time is in their callers' rows (no sampled pass to split it)"
        };
        let _ = writeln!(out, "  {line}; {whither}");
    }
    out
}

/// The categories a case's table shows: those any of its phases measured (exact or sampled),
/// so a case that never unpins or releases has no empty columns. report.json keeps them all.
fn columns(case: &CaseReport) -> Vec<Category> {
    let seen = |c: Category| {
        case.phases.iter().any(|p| {
            let sampled = p.sampled.categories.get(&c).is_some_and(|s| *s >= 0.005);
            let exact = match c {
                Category::User => p.exact.available && p.exact.unattributed_ns != 0,
                c => p.exact.categories.get(&c).is_some_and(|ns| *ns > 0),
            };
            sampled || exact
        })
    };
    CATEGORIES.iter().copied().filter(|c| seen(*c)).collect()
}

fn phase_row(p: &PhaseReport, columns: &[Category]) -> String {
    let mut out = String::new();
    // Throughput of a phase that takes microseconds says nothing about memory.
    let gib = if p.gib_per_s > 0.0 && p.wall_ns.median >= 100_000 {
        format!("{:.2}", p.gib_per_s)
    } else {
        "-".into()
    };
    let samples = if p.sampled.lost > 0 {
        format!("{}*", p.sampled.samples)
    } else {
        p.sampled.samples.to_string()
    };
    let _ = write!(
        out,
        "  {:<13}{:>10}{:>10}{:>10}{:>8}{:>8}{:>8}{:>11}{:>15}{:>8}",
        p.name.name(),
        ms(p.wall_ns.median),
        p.wall_ci.map_or("-".into(), |c| ms(c.low)),
        p.wall_ci.map_or("-".into(), |c| ms(c.high)),
        gib,
        ratio(p, Pass::Exact),
        ratio(p, Pass::Sampled),
        p.kernel_share.map_or("-".into(), |k| format!("{:.0}%", k * 100.0)),
        faults(p),
        samples
    );
    for c in columns {
        let cell = match p.sampled.samples {
            0 => "-".to_owned(),
            _ => format!("{:.0}%", p.sampled.categories.get(c).copied().unwrap_or(0.0) * 100.0),
        };
        let _ = write!(out, " {cell:>9}");
    }
    out.push('\n');
    out
}

/// What a traced pass cost this phase (median ratio to the untraced pass), or `-`.
fn ratio(p: &PhaseReport, pass: Pass) -> String {
    p.passes
        .get(&pass)
        .and_then(|t| t.ratio)
        .map_or("-".into(), |r| format!("x{:.2}", r.median))
}

/// CPU faults (tracepoint) / minor faults (getrusage, GUP-driven ones included); `-` for what
/// was not measured.
fn faults(p: &PhaseReport) -> String {
    let cpu = p.counters.cpu_faults.map_or("-".into(), |n| n.to_string());
    format!("{cpu}/{}", p.counters.minor_faults)
}

/// The same categories measured exactly, as shares of the reported iteration's wall time less
/// what its probes cost (shown, with their hits); the `user` column holds what no probe saw
/// (unattributed).
fn exact_row(p: &PhaseReport, columns: &[Category]) -> String {
    let mut out = String::new();
    if !p.exact.available || p.exact.wall_ns == 0 {
        return out;
    }
    let calibrated = p.exact.probe_overhead_calibrated_ns;
    let basis = match (p.exact.probe_overhead_basis, calibrated) {
        (Some(OverheadBasis::Measured), Some(c)) => format!(" as measured, {} ms per calibration", ms(c)),
        (Some(OverheadBasis::Measured), None) => " as measured".into(),
        (Some(OverheadBasis::Calibration), _) => " per calibration".into(),
        (None, _) => String::new(),
    };
    let mut cost = p.exact.probe_overhead_ns.map_or(String::new(), |o| {
        format!("probes cost {} ms of it{basis} ({} calls)", ms(o), p.exact.probe_hits)
    });
    if let Some(off) = p.exact.off_cpu_outside_ns.filter(|n| *n > 0) {
        let _ = write!(cost, "; {} ms off the CPU outside syscalls", ms(off));
    }
    let _ = write!(out, "  {:<13}{:>10} {cost:>77}", "  exact", ms(p.exact.wall_ns));
    for c in columns {
        let _ = write!(out, " {:>9}", format!("{:.0}%", p.exact.share(*c) * 100.0));
    }
    out.push('\n');
    out
}

fn footer(report: &Report) -> String {
    let mut out = String::new();
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
    if !report.leaks.is_empty() {
        let _ = writeln!(
            out,
            "\nLEFT HELD after the case ended (the kernel did not give it back):"
        );
        for l in &report.leaks {
            let scope = if l.system_wide {
                " (system-wide: another process may have pinned)"
            } else {
                ""
            };
            let _ = writeln!(out, "  {:<40} {} {} -> {}{scope}", l.case, l.counter, l.before, l.after);
        }
    }
    out + &samples_footer(report) + &off_cpu_footer(report) + &probes_footer(report)
}

/// Phases whose sampled pass took fewer than half the samples its wall time should have given
/// (the shares still hold where the misses are spread evenly over the phase).
fn samples_footer(report: &Report) -> String {
    let freq = report.config.freq_hz;
    let short: Vec<String> = report
        .cases
        .iter()
        .flat_map(|c| c.phases.iter().map(move |p| (c, p)))
        .filter_map(|(c, p)| {
            let e = samples_short(p, freq)?;
            let cost = crate::report::sample_cost_ns(p);
            let cost = cost.map_or(String::new(), |ns| format!(", {} us each", ns / 1000));
            Some(format!(
                "{} {} {} of ~{e}{cost}",
                c.name,
                p.name.name(),
                p.sampled.taken()
            ))
        })
        .collect();
    if short.is_empty() {
        return String::new();
    }
    format!(
        "\nsampled: {} phase(s) took under half the samples of their time on the CPU at {freq} Hz ({}): \
         where a sample costs the phase about a period ({} us) or more, the timer skips periods and the \
         samples stay spread evenly; elsewhere the sampler missed stretches, and the shares hold only if \
         those are spread evenly\n",
        short.len(),
        first_three(&short, ", "),
        crate::report::sampling_period_ns(freq) / 1000
    )
}

/// Phases whose exact iteration spent a tenth or more of its time off the CPU.
fn off_cpu_footer(report: &Report) -> String {
    let heavy: Vec<String> = report
        .cases
        .iter()
        .flat_map(|c| c.phases.iter().map(move |p| (c, p)))
        .filter_map(|(c, p)| {
            let off = off_cpu_heavy(p)?;
            Some(format!(
                "{} {} {}",
                c.name,
                p.name.name(),
                off.describe(p.exact.wall_ns)
            ))
        })
        .collect();
    if heavy.is_empty() {
        return String::new();
    }
    format!(
        "\noff the CPU: {} phase(s) spent a tenth or more of their exact iteration off the CPU ({}): \
         inside a syscall that time is in the row the thread left from, outside one it is its own part of \
         the exact row; it varies with the machine's other work\n",
        heavy.len(),
        first_three(&heavy, "; ")
    )
}

/// The first three of `items` joined by `sep`, and how many more there are.
fn first_three(items: &[String], sep: &str) -> String {
    let more = match items.len() {
        n if n > 3 => format!(" and {} more", n - 3),
        _ => String::new(),
    };
    items.iter().take(3).cloned().collect::<Vec<_>>().join(sep) + &more
}

/// Probes off by request, and those that did not attach grouped by reason (on a kernel without
/// kprobes every row fails the same way).
fn probes_footer(report: &Report) -> String {
    let mut out = String::new();
    let mut by_reason: Vec<(&str, Vec<&str>)> = Vec::new();
    for p in report
        .probes
        .iter()
        .filter(|p| !p.attached && p.error.as_deref() != Some(NOT_REQUESTED))
    {
        let reason = p.error.as_deref().unwrap_or("");
        match by_reason.iter_mut().find(|(r, _)| *r == reason) {
            Some((_, names)) => names.push(&p.function),
            None => by_reason.push((reason, vec![&p.function])),
        }
    }
    let off: Vec<String> = Mechanism::ALL
        .iter()
        .filter(|m| report.config.traced && !report.config.probes.is_empty() && !report.config.probes.contains(m))
        .map(ToString::to_string)
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

/// The machine's pace over every untraced iteration of the run (`floors::Pace`): whether the
/// machine itself held one speed, which the spreads of the times depend on.
pub fn pace_line(report: &Report) -> Option<String> {
    let runs: Vec<u64> = report
        .cases
        .iter()
        .filter_map(|c| c.pace_ns.as_ref())
        .flat_map(|p| p.runs.iter().copied())
        .collect();
    if runs.is_empty() {
        return None;
    }
    let s = crate::report::Stats::of(runs);
    Some(format!(
        "machine pace: a fixed user-space clear took {} ms median ({}-{} ms) before the {} untraced iterations: {}",
        ms(s.median),
        ms(s.min),
        ms(s.max),
        s.runs.len(),
        match crate::report::unsteady_pace(&s) {
            Some(moved) => format!("the machine's speed moved {moved:.2}x, part of every spread is the machine's"),
            None => "steady".to_owned(),
        }
    ))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::report::Stats;

    #[test]
    fn the_machines_pace_is_told_steady_or_not() {
        let mut r = crate::report::parse(include_str!("../tests/data/matrix-7.3.json")).unwrap();
        assert!(
            !render_table(&r).contains("machine pace"),
            "a run without paces says nothing"
        );
        r.cases[0].pace_ns = Some(Stats::of(vec![2_625_654, 2_488_145, 2_590_000]));
        r.cases[1].pace_ns = Some(Stats::of(vec![2_710_000, 2_860_263]));
        let t = render_table(&r);
        assert!(
            t.contains("took 2.63 ms median (2.49-2.86 ms) before the 5 untraced iterations: steady"),
            "{t}"
        );
        r.cases[1].pace_ns = Some(Stats::of(vec![2_710_000, 3_807_910]));
        let t = render_table(&r);
        assert!(t.contains("the machine's speed moved 1.53x"), "{t}");
    }

    #[test]
    fn samples_cut_at_a_retpoline_thunk_are_told_per_phase() {
        use crate::workload::Phase;
        let mut r = crate::report::parse(include_str!("../tests/data/matrix-7.3.json")).unwrap();
        assert_eq!(cut_stacks(&r.cases[0]), "", "nothing cut, nothing said");
        let unmap = (r.cases[0].phases.iter_mut())
            .find(|p| p.name == Phase::Unmap)
            .expect("an unmap phase");
        unmap.sampled.cut = 5;
        unmap.sampled.samples = 48;
        assert_eq!(
            cut_stacks(&r.cases[0]),
            "  samples cut at a retpoline thunk (no caller: left out of the sampled shares): unmap 5 of 48\n"
        );
    }

    #[test]
    fn an_exact_pass_of_several_iterations_tells_its_probe_cost_against_the_measured() {
        use crate::{probes::Pass, report::PassCost, workload::Phase};
        let mut r = crate::report::parse(include_str!("../tests/data/matrix-7.3.json")).unwrap();
        let set = |r: &mut crate::report::Report, cost: PassCost| {
            let map = (r.cases[0].phases.iter_mut())
                .find(|p| p.name == Phase::Map)
                .expect("a map phase");
            map.passes.get_mut(&Pass::Exact).expect("an exact pass").probe_cost = Some(cost);
        };
        let cost = PassCost {
            iterations: 7,
            hits: 163_183,
            calibrated_ns: 138_600_000,
            measured_ns: 185_900_000,
            noise_ns: Some(15_700_000),
            beyond_line: 0,
            calibrated_range_ns: None,
        };
        set(&mut r, PassCost { iterations: 1, ..cost });
        assert_eq!(pass_probe_cost(&r.cases[0]), "", "one iteration's is on its exact row");
        set(&mut r, cost);
        assert_eq!(
            pass_probe_cost(&r.cases[0]),
            "  probe cost over 7 exact iterations: map 139 ms calibrated, 186 +- 15.70 ms measured \
             (163183 hits, 0.75x)\n"
        );
        set(
            &mut r,
            PassCost {
                calibrated_range_ns: Some((110_400_000, 174_000_000)),
                ..cost
            },
        );
        assert_eq!(
            pass_probe_cost(&r.cases[0]),
            "  probe cost over 7 exact iterations: map 139 ms calibrated (110-174 by a syscall loop's, \
             user faults' and kernel faults' cost per hit), 186 +- 15.70 ms measured (163183 hits, 0.75x)\n"
        );
    }

    #[test]
    fn a_layout_rerun_is_told_with_the_layouts() {
        use crate::{probes::Pass, report::LayoutRerun, workload::Phase};
        let mut r = crate::report::parse(include_str!("../tests/data/matrix-7.3.json")).unwrap();
        let case = &mut r.cases[0];
        let map = (case.phases.iter_mut())
            .find(|p| p.name == Phase::Map)
            .expect("a map phase");
        // A 256 MiB memfd: untraced 613-2824 runs, exact 602, the sampled one 24439 then 1859.
        map.physical_runs = Some(Stats::of(vec![2350, 613, 2125, 1859, 2824]));
        map.layout = crate::layout::LayoutModel::fit(&[(613, 89_950_153), (2824, 133_922_700), (2125, 100_401_354)]);
        map.exact.physical_runs = Some(602);
        let sampled = map.passes.get_mut(&Pass::Sampled).expect("a sampled pass");
        sampled.physical_runs = Some(Stats::of(vec![1859]));
        assert!(!layout(case).contains("run again"), "{}", layout(case));
        case.layout_reruns.push(LayoutRerun {
            pass: Pass::Sampled,
            physical_runs: 24439,
            other_physical_runs: 602,
        });
        let line = layout(case);
        assert!(
            line.contains(
                "613-2824 contiguous runs over the untraced iterations, the exact iteration 602, the sampled 1859 \
                 (run again, far from the layout they are held against: sampled 24439)"
            ),
            "{line}"
        );
    }
}
