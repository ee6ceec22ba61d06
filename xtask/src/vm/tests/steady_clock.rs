//! The guest on an instruction-count clock (QEMU `-icount`): the same work takes the same
//! guest time whatever the host does, and the sampler fires at its full rate.
//!
//! On the real-time clock a probe hit's cost moves up to 2x within a boot, so the calibrated
//! probe cost can only be held within a factor there (`measurement`'s keep-every-row run). On
//! this clock it must hold within 25% of the measured cost. And the sampler's full rate gives
//! a case tens of thousands of samples, enough distinct kernel stacks to fill buckets of the
//! stack map: a kernel-mode sample whose stack finds its bucket taken is lost, and must be
//! counted lost, not read as user time inside a syscall. Code that runs with interrupts off
//! (gup-fast) holds the timer back: the one sample it fires when they come back on must stand
//! for every period it missed, or the sampled shares under-read that code. The guest has one
//! vCPU, as `cargo xtask run` boots it, and a default run's single exact iteration is held to
//! the same 25%.
use std::path::Path;

use serde_json::Value;

use super::{
    Ctx, ESTIMATE_PHASES, KEEP_ITERATIONS, Outcome, boot_ok, case, findings, no_failed_step, ns, phase, plan,
    read_json, samples_taken, scratch, share_base, shell,
};
use crate::vm::qemu::Clock;

/// How far the calibrated probe cost may be from the measured one on this clock.
const ESTIMATE_WITHIN: f64 = 0.25;

/// Phases that run in the kernel from start to end: a sample in them is kernel time.
const KERNEL_PHASES: [&str; 4] = ["map", "unmap", "munmap", "close"];

/// The share of a kernel phase's samples that may read as user time (the samples taken on
/// the way into and out of the syscall).
const USER_IN_KERNEL: f64 = 0.02;

/// The share of a phase's samples that may be lost (stack buckets taken, map full): with the
/// call chain alone in the stack map 0.1-3.7% of this case's kernel phases' samples were,
/// with whole stacks in 16384 buckets 23-57%.
const LOST_AT_MOST: f64 = 0.10;

/// The sampled case: a 4 KiB memfd populated, then pinned and mapped run by run (hundreds of
/// IOMMU calls, thousands of distinct stacks in the populate before the map).
const SAMPLED_CASE: &str = "vfio_type1_iommu_memfd.populate";

/// A case whose map pins with interrupts off: iommufd's compat type1 pins a 4 KiB memfd by
/// gup-fast, tens of MiB a call (16% of the map's exact time; sampled 3.0% when each late
/// sample counted once, 10.1% when it stands for the periods it missed).
const IRQ_OFF_CASE: &str = "iommufd_compat_type1_memfd.touch";

/// The share of the irq-off map's sampling periods that must have come in late samples: each
/// of its gup-fast calls keeps interrupts off for many periods (7.4-8.2% in three runs).
const LATE_AT_LEAST: f64 = 0.02;

/// Cases run as `cargo xtask run` runs them (one exact iteration, rows demoted as by default):
/// small anonymous maps, hundreds of probe hits, where a second emulated vCPU's work put about
/// 0.5 ms no probe explained into each phase (0.58x and 0.63x).
const DEFAULT_CASES: [&str; 2] = ["vfio_type1v2_iommu_anonymous", "iommufd_anonymous"];

/// The least calibrated probe cost, as a share of the exact iteration's wall time, for a phase
/// of [`DEFAULT_CASES`] to be judged: below it the estimate moves no share by much.
const JUDGED_COST_SHARE: f64 = 0.02;

fn script() -> String {
    let (a, b) = (ESTIMATE_PHASES[0].0, ESTIMATE_PHASES[2].0);
    let [d1, d2] = DEFAULT_CASES;
    format!(
        "D=/bin/dmaprof
$D run --json -b 64M -v {a} -v {b} --thp never -n {KEEP_ITERATIONS} --traced-iterations {KEEP_ITERATIONS} \
  --passes untraced,exact --demote-above 100 -o /tmp/k > /out/keep.json 2>> /out/err.txt || v keep_exit $?
$D run --json -b 256M -v {SAMPLED_CASE} -n 3 -o /tmp/s > /out/sampled.json 2>> /out/err.txt || v sampled_exit $?
$D run --json -b 256M -v {IRQ_OFF_CASE} -n 3 -o /tmp/i > /out/irq_off.json 2>> /out/err.txt || v irq_off_exit $?
$D run --json -b 256M -v {d1} -v {d2} -o /tmp/d > /out/default.json 2>> /out/err.txt || v default_exit $?
v done yes
"
    )
}

/// `steady_clock_probe_cost_and_samples`: the probe cost estimate within 25% of the measured
/// cost, and full-rate samples of kernel phases kept as kernel time or counted lost.
pub fn steady_clock(c: &Ctx) -> Outcome {
    let dir = scratch("steady-clock");
    let mut p = plan(c, true, shell(&script()));
    // As `cargo xtask run` boots the test bed.
    (p.clock, p.smp) = (Clock::Instructions, 1);
    boot_ok(p, &dir)?;
    no_failed_step(&findings(&dir)?, &dir)?;
    let mut problems = Vec::new();
    let cost = estimate(&dir, &mut problems)?;
    let single = single_exact(&read_json(&dir, "default.json")?, &mut problems)?;
    let samples = samples(&read_json(&dir, "sampled.json")?, &mut problems)?;
    let late = late_samples(&read_json(&dir, "irq_off.json")?, &mut problems)?;
    let all = format!("{cost}; {single}; {samples}; {late}");
    match problems.is_empty() {
        true => Ok(all),
        false => Err(format!("{}; ({all})", problems.join("; "))),
    }
}

/// The keep-every-row run's calibrated probe cost against the measured one, phase by phase
/// (those whose measured cost is 5 ms or more).
fn estimate(dir: &Path, problems: &mut Vec<String>) -> Outcome {
    let r = read_json(dir, "keep.json")?;
    let mut notes = Vec::new();
    for (variant, name) in ESTIMATE_PHASES {
        let cost = &phase(case(&r, variant)?, name)?["passes"]["exact"]["probe_cost"];
        let (measured, calibrated) = (ns(&cost["measured_ns"]), ns(&cost["calibrated_ns"]));
        let noise = ns(&cost["noise_ns"]);
        let note = format!(
            "{variant} {name}: calibrated {:.1} ms, measured {:.1} +- {:.1} ms ({:.2}x, {} hits)",
            calibrated / 1e6,
            measured / 1e6,
            noise / 1e6,
            calibrated / measured.max(1.0),
            cost["hits"]
        );
        if measured < 5e6 {
            problems.push(format!(
                "{note}: too little measured probe cost to judge (want 5 ms or more)"
            ));
        } else if (calibrated - measured).abs() > ESTIMATE_WITHIN * measured + 2.0 * noise {
            problems.push(format!("probe cost estimate off by more than 25%: {note}"));
        }
        notes.push(note);
    }
    Ok(format!("instruction clock, every row kept: {}", notes.join(", ")))
}

/// In a default run's single exact iteration, each phase's calibrated probe cost within 25% of
/// the measured one (its wall time less the untraced line), as far as the untraced iterations'
/// own scatter tells, wherever the calibrated cost is [`JUDGED_COST_SHARE`] of the phase or more.
fn single_exact(r: &Value, problems: &mut Vec<String>) -> Outcome {
    let mut notes = Vec::new();
    for variant in DEFAULT_CASES {
        let prefix = format!("{variant}.");
        let cases = r["cases"].as_array().into_iter().flatten();
        for c in cases.filter(|c| c["name"].as_str().is_some_and(|n| n.starts_with(&prefix))) {
            for p in c["phases"].as_array().into_iter().flatten() {
                let e = &p["exact"];
                let (wall, calibrated) = (ns(&e["wall_ns"]), ns(&e["probe_overhead_calibrated_ns"]));
                if wall < 1e6 || calibrated < JUDGED_COST_SHARE * wall {
                    continue;
                }
                let (measured, noise) = (ns(&e["probe_overhead_measured_ns"]), ns(&e["untraced_noise_ns"]));
                let note = format!(
                    "{} {}: {:.2}x ({:.2} ms calibrated, {:.2} +- {:.2} measured, {} hits)",
                    c["name"].as_str().unwrap_or("?"),
                    p["name"].as_str().unwrap_or("?"),
                    calibrated / measured.max(1.0),
                    calibrated / 1e6,
                    measured / 1e6,
                    noise / 1e6,
                    e["probe_hits"]
                );
                if (calibrated - measured).abs() > ESTIMATE_WITHIN * measured + noise {
                    problems.push(format!("single exact iteration's probe cost estimate off: {note}"));
                }
                notes.push(note);
            }
        }
    }
    if notes.len() < 3 {
        problems.push(format!(
            "only {} phases to judge the single exact iteration by",
            notes.len()
        ));
    }
    Ok(format!("one vCPU, one exact iteration: {}", notes.join(", ")))
}

/// In the sampled case's kernel phases: user time at most [`USER_IN_KERNEL`], losses at most
/// [`LOST_AT_MOST`] (both of 200 samples or more), and exact and sampled within 10 points per
/// category in the map and unmap.
fn samples(r: &Value, problems: &mut Vec<String>) -> Outcome {
    let c = case(r, SAMPLED_CASE)?;
    let mut notes = Vec::new();
    for name in KERNEL_PHASES {
        let p = phase(c, name)?;
        let s = &p["sampled"];
        let (n, lost) = (ns(&s["samples"]), ns(&s["lost"]));
        let user = ns(&s["categories"]["user"]);
        if n < 200.0 {
            problems.push(format!("{SAMPLED_CASE} {name}: {n} samples, too few to judge"));
            continue;
        }
        let apart = matches!(name, "map" | "unmap").then(|| apart_pp(p));
        let note = format!(
            "{name} {n} samples, {lost} lost, {:.1}% user{}",
            user * 100.0,
            apart.as_ref().map_or(String::new(), |(pp, k)| format!(
                ", exact vs sampled {pp:.1} points ({k})"
            ))
        );
        if user > USER_IN_KERNEL {
            problems.push(format!("kernel-mode samples read as user time: {note}"));
        }
        if lost > LOST_AT_MOST * n {
            problems.push(format!("too many samples lost: {note}"));
        }
        if apart.is_some_and(|(pp, _)| pp > 10.0) && samples_taken(p) >= 1000.0 {
            problems.push(format!("exact and sampled apart: {note}"));
        }
        notes.push(note);
    }
    Ok(format!("{SAMPLED_CASE}: {}", notes.join(", ")))
}

/// In the irq-off case's map: late samples standing for [`LATE_AT_LEAST`] of its periods or
/// more, and exact and sampled within 10 points per category.
fn late_samples(r: &Value, problems: &mut Vec<String>) -> Outcome {
    let p = phase(case(r, IRQ_OFF_CASE)?, "map")?;
    let s = &p["sampled"];
    let (n, late) = (ns(&s["samples"]), ns(&s["late_periods"]));
    let taken = samples_taken(p);
    let (pp, k) = apart_pp(p);
    let note = format!(
        "{IRQ_OFF_CASE} map: {n} sampling periods, {late} of them in late samples, \
         exact vs sampled {pp:.1} points ({k}), pinning {:.1}% exact and {:.1}% sampled",
        ns(&p["exact"]["categories"]["pinning"]) / share_base(&p["exact"]) * 100.0,
        ns(&s["categories"]["pinning"]) * 100.0
    );
    if taken < 1000.0 {
        problems.push(format!("too few samples to judge ({taken} taken): {note}"));
    } else if late < LATE_AT_LEAST * n {
        problems.push(format!("late samples stand for too few periods: {note}"));
    } else if pp > 10.0 {
        problems.push(format!("exact and sampled apart: {note}"));
    }
    Ok(note)
}

/// The largest gap, in points, between a phase's exact and sampled shares over the
/// categories either pass reports (user time aside: the exact pass has none in a syscall).
fn apart_pp(p: &Value) -> (f64, String) {
    let e = &p["exact"];
    let base = share_base(e);
    let mut keys: Vec<&String> = Vec::new();
    for side in [&e["categories"], &p["sampled"]["categories"]] {
        keys.extend(side.as_object().into_iter().flat_map(|o| o.keys()));
    }
    keys.into_iter()
        .filter(|k| *k != "user")
        .map(|k| {
            let pp = (ns(&e["categories"][k]) / base - ns(&p["sampled"]["categories"][k])).abs() * 100.0;
            (pp, k.clone())
        })
        .fold((0.0, String::new()), |a, b| if b.0 > a.0 { b } else { a })
}
