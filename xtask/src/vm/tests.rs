//! The VM part of `cargo xtask test`: boots real guests and checks what dmaprof (and the harness
//! itself) sees there. One line per test, then `vm: N passed, N failed, N skipped`.
use std::{
    fs,
    path::Path,
    process::Command,
    time::{Duration, Instant},
};

use anyhow::{Result, bail};
use serde_json::Value;

use super::{Payload, Plan, cache_dir, execute, kernel, qemu, transfer, unpack_archive};
use crate::{
    build::{build_static, build_vm_init},
    size::ByteSize,
};

/// Host-side limit for a guest that should finish (stock kernels boot slower under TCG).
const BOOT_TIMEOUT: Duration = Duration::from_secs(300);

enum Verdict {
    Ok(String),
    Skipped(String),
    Failed(String),
}

/// A named test.
type Test<'a> = (&'static str, Box<dyn Fn() -> Verdict + 'a>);

/// Runs every VM test (kernels are prepared first: a cold cache downloads and builds them).
pub fn run(only: &[String]) -> Result<()> {
    let started = Instant::now();
    kernel::ensure_vm_packages()?;
    let cache = cache_dir()?;
    eprintln!("xtask: VM tests (cache {})", cache.display());
    let custom = kernel::prepare(&kernel::Choice::Custom, None, &cache)?;
    let debian = kernel::prepare(&kernel::Choice::Debian("debian-6.12"), None, &cache)?;
    let debian_6_1 = kernel::prepare(&kernel::Choice::Debian("debian-6.1"), None, &cache)?;
    let dmaprof = build_static()?;
    if INIT.get().is_none() {
        let _ = INIT.set(build_vm_init()?);
    }
    let has_doctor = Command::new(&dmaprof)
        .arg("--help")
        .output()
        .is_ok_and(|o| String::from_utf8_lossy(&o.stdout).contains("doctor"));

    let tests: Vec<Test> = vec![
        (
            "boot_custom_doctor",
            Box::new(|| doctor(&custom, &dmaprof, has_doctor, true)),
        ),
        (
            "boot_debian_6_12_doctor",
            Box::new(|| doctor(&debian, &dmaprof, has_doctor, false)),
        ),
        ("guest_panic_or_hang_fails_fast", Box::new(|| panic_or_hang(&custom))),
        ("guest_files_arrive_intact", Box::new(|| files_arrive(&custom))),
        ("dma_matrix_custom", Box::new(|| dma_matrix_custom(&custom, &dmaprof))),
        (
            "dma_matrix_debian_6_12",
            Box::new(|| dma_matrix_debian(&debian, &dmaprof)),
        ),
        (
            "attribution_type1_and_iommufd",
            Box::new(|| attribution(&custom, &dmaprof)),
        ),
        ("bad_devices_and_bind", Box::new(|| bad_devices(&custom, &dmaprof))),
        (
            "kernel_matrix_debian_6_1",
            Box::new(|| kernel_matrix(&debian_6_1, &dmaprof, KERNEL_6_1)),
        ),
        (
            "signals_leave_nothing_behind",
            Box::new(|| signals_in_guest(&custom, &dmaprof)),
        ),
    ];
    let (mut passed, mut failed, mut skipped) = (0, 0, 0);
    for (name, test) in tests {
        if !only.is_empty() && !only.iter().any(|o| name.contains(o.as_str())) {
            continue;
        }
        let t = Instant::now();
        let verdict = test();
        let secs = t.elapsed().as_secs_f64();
        match verdict {
            Verdict::Ok(note) => {
                passed += 1;
                println!("vm test {name} ... ok ({secs:.1}s{note})");
            }
            Verdict::Skipped(why) => {
                skipped += 1;
                println!("vm test {name} ... SKIPPED: {why}");
            }
            Verdict::Failed(why) => {
                failed += 1;
                println!("vm test {name} ... FAILED: {why}");
            }
        }
    }
    eprintln!("xtask: VM tests took {:.0}s", started.elapsed().as_secs_f64());
    println!("vm: {passed} passed, {failed} failed, {skipped} skipped");
    if failed > 0 {
        bail!("{failed} VM test(s) failed");
    }
    Ok(())
}

/// The static guest init, built once per suite.
static INIT: std::sync::OnceLock<std::path::PathBuf> = std::sync::OnceLock::new();

fn plan<'a>(kernel: &'a kernel::Kernel, dmaprof: Option<&'a Path>, payload: Payload) -> Plan<'a> {
    Plan {
        kernel,
        init: INIT.get().expect("built before the tests run"),
        dmaprof,
        payload,
        mem: ByteSize::new(1 << 30).expect("1 GiB"),
        smp: 2,
        hugepages_1g: 0,
        hugepages_2m: 0,
        append: "",
        timeout: BOOT_TIMEOUT,
        echo: false,
        host_files: Vec::new(),
    }
}

/// Boots, expects exit status 0 and returns the console and the unpacked output dir.
fn boot_ok(p: Plan, scratch: &Path) -> Result<Vec<String>, String> {
    let outcome = execute(p).map_err(|e| e.message)?;
    if outcome.exit_status != 0 {
        let tail: Vec<&str> = outcome
            .console
            .iter()
            .rev()
            .take(30)
            .rev()
            .map(String::as_str)
            .collect();
        return Err(format!(
            "guest command exited with {}; console tail:\n  {}",
            outcome.exit_status,
            tail.join("\n  ")
        ));
    }
    let _ = fs::remove_dir_all(scratch);
    if let Some(archive) = &outcome.archive {
        unpack_archive(archive, scratch).map_err(|e| format!("{e:#}"))?;
    }
    Ok(outcome.console)
}

fn scratch(name: &str) -> std::path::PathBuf {
    cache_dir()
        .unwrap_or_else(|_| std::env::temp_dir())
        .join("test-scratch")
        .join(name)
}

/// The edu device's BDF as the guest's /init printed it.
fn edu_bdf(console: &[String]) -> Option<String> {
    console.iter().find_map(|l| {
        l.split("dmaprof-vm: edu device ")
            .nth(1)?
            .split_whitespace()
            .next()
            .map(str::to_owned)
    })
}

fn doctor(k: &kernel::Kernel, dmaprof: &Path, has_doctor: bool, iommufd: bool) -> Verdict {
    let dir = scratch("doctor");
    if !has_doctor {
        // Until dmaprof has `doctor`: check the same facts with busybox.
        let mut cmd =
            String::from("ls -d /dev/vfio/vfio /dev/vfio/[0-9]* && grep -q ' register_kprobe$' /proc/kallsyms");
        if iommufd {
            cmd += " && ls /dev/iommu /dev/vfio/devices/vfio0";
        }
        return match boot_ok(plan(k, None, Payload::Shell(cmd)), &dir) {
            Ok(console) => match edu_bdf(&console) {
                Some(_) if console.iter().any(|l| l.contains("driver vfio-pci iommu_group")) => {
                    Verdict::Skipped("this dmaprof has no `doctor` yet (boot, vfio-pci binding and device nodes checked with busybox: ok)".to_owned())
                }
                _ => Verdict::Failed("the edu device is not bound to vfio-pci in an IOMMU group".to_owned()),
            },
            Err(e) => Verdict::Failed(e),
        };
    }
    // doctor's own exit status is not the verdict: its JSON is.
    let cmd = "/bin/dmaprof doctor --json > /out/doctor.json 2> /out/doctor.stderr; \
               echo \"dmaprof-vm: doctor exit status $?\""
        .to_owned();
    let console = match boot_ok(plan(k, Some(dmaprof), Payload::Shell(cmd)), &dir) {
        Ok(c) => c,
        Err(e) => return Verdict::Failed(e),
    };
    let text = match fs::read_to_string(dir.join("doctor.json")) {
        Ok(t) => t,
        Err(e) => return Verdict::Failed(format!("no doctor.json from the guest: {e}{}", doctor_stderr(&dir))),
    };
    let json: Value = match serde_json::from_str(&text) {
        Ok(v) => v,
        Err(e) => {
            return Verdict::Failed(format!(
                "doctor --json is not JSON ({e}): {}{}",
                text.chars().take(200).collect::<String>(),
                doctor_stderr(&dir)
            ));
        }
    };
    match check_doctor(&json, iommufd, edu_bdf(&console).as_deref()) {
        Ok(()) => Verdict::Ok(String::new()),
        Err(e) => Verdict::Failed(e),
    }
}

/// doctor's stderr, for failure messages.
fn doctor_stderr(dir: &Path) -> String {
    match fs::read_to_string(dir.join("doctor.stderr")) {
        Ok(t) if !t.trim().is_empty() => format!("; its stderr: {}", t.trim()),
        _ => String::new(),
    }
}

/// The issue's assertions on `dmaprof doctor --json`.
fn check_doctor(json: &Value, iommufd: bool, bdf: Option<&str>) -> Result<(), String> {
    let mut caps = vec!["kprobes", "vfio_type1"];
    if iommufd {
        caps.extend(["iommufd", "vfio_cdev", "map_file"]);
    }
    let mut problems = Vec::new();
    for cap in caps {
        let c = &json["capabilities"][cap];
        if c["ok"] != Value::Bool(true) {
            problems.push(format!("capabilities.{cap}.ok is {} ({})", c["ok"], c["detail"]));
        }
    }
    let devices = json["vfio_devices"].as_array().cloned().unwrap_or_default();
    let edu = devices.iter().find(|d| bdf.is_none_or(|b| d["bdf"] == b));
    match edu {
        None => problems.push(format!("vfio_devices has no edu device {bdf:?}: {devices:?}")),
        Some(d) => {
            if d["driver"] != "vfio-pci" {
                problems.push(format!("edu device driver is {}, not vfio-pci", d["driver"]));
            }
            if d["iommu_group"].is_null() {
                problems.push("edu device has no iommu_group".to_owned());
            }
        }
    }
    if problems.is_empty() {
        Ok(())
    } else {
        Err(problems.join("; "))
    }
}

fn panic_or_hang(k: &kernel::Kernel) -> Verdict {
    // A kernel panic (no init to run) must end the boot at once with a message naming the panic.
    let timeout = Duration::from_secs(60);
    let mut p = plan(k, None, Payload::Shell("true".to_owned()));
    p.append = "rdinit=/nonexistent init=/nonexistent";
    p.timeout = timeout;
    let t = Instant::now();
    match execute(p) {
        Ok(_) => return Verdict::Failed("a guest without init reported success".to_owned()),
        Err(e) if e.kind != qemu::FailKind::Panic || !e.message.contains("panic") => {
            return Verdict::Failed(format!("expected a panic failure, got {:?}: {}", e.kind, e.message));
        }
        Err(_) if t.elapsed() >= timeout => {
            return Verdict::Failed(format!("panic noticed only after {:.0}s", t.elapsed().as_secs_f64()));
        }
        Err(_) => {}
    }
    let panic_secs = t.elapsed().as_secs_f64();
    // A hung guest must be stopped at the deadline.
    let timeout = Duration::from_secs(15);
    let mut p = plan(k, None, Payload::Shell("sleep 100000".to_owned()));
    p.timeout = timeout;
    let t = Instant::now();
    match execute(p) {
        Ok(_) => Verdict::Failed("a hung guest reported success".to_owned()),
        Err(e) if e.kind != qemu::FailKind::Timeout => {
            Verdict::Failed(format!("expected a timeout, got {:?}: {}", e.kind, e.message))
        }
        Err(_) if t.elapsed() > timeout + Duration::from_secs(10) => Verdict::Failed(format!(
            "hung guest stopped only after {:.0}s",
            t.elapsed().as_secs_f64()
        )),
        Err(_) => Verdict::Ok(format!(
            ", panic caught in {panic_secs:.1}s, hang stopped at {}s",
            timeout.as_secs()
        )),
    }
}

fn files_arrive(k: &kernel::Kernel) -> Verdict {
    let dir = scratch("files");
    let cmd = "dd if=/dev/urandom of=/out/blob bs=64k count=16 2>/dev/null && mkdir -p /out/sub && \
               echo hello > /out/sub/note.txt && echo \"BLOB-SHA256 $(sha256sum /out/blob)\""
        .to_owned();
    let console = match boot_ok(plan(k, None, Payload::Shell(cmd)), &dir) {
        Ok(c) => c,
        Err(e) => return Verdict::Failed(e),
    };
    let Some(want) = console.iter().find_map(|l| {
        l.split("BLOB-SHA256 ")
            .nth(1)?
            .split_whitespace()
            .next()
            .map(str::to_owned)
    }) else {
        return Verdict::Failed("the guest printed no sha256 for its file".to_owned());
    };
    let blob = match fs::read(dir.join("blob")) {
        Ok(b) => b,
        Err(e) => return Verdict::Failed(format!("blob did not arrive: {e}")),
    };
    let got = transfer::sha256_hex(&blob);
    if got != want || blob.len() != 1 << 20 {
        return Verdict::Failed(format!(
            "blob differs: {} bytes sha256 {got}, guest had 1048576 bytes sha256 {want}",
            blob.len()
        ));
    }
    if fs::read_to_string(dir.join("sub/note.txt")).ok().as_deref() != Some("hello\n") {
        return Verdict::Failed("sub/note.txt did not arrive intact".to_owned());
    }
    let _ = fs::remove_dir_all(&dir);
    Verdict::Ok(String::new())
}

/// Runs `dmaprof run --json <args> -o /out` in the guest; returns report.json as parsed.
fn guest_run(k: &kernel::Kernel, dmaprof: &Path, name: &str, args: &str) -> Result<Value, String> {
    let dir = scratch(name);
    let cmd = format!(
        "/bin/dmaprof run --json -o /out {args} > /out/stdout.json 2> /out/stderr.txt; echo \"dmaprof-vm: run exit status $?\""
    );
    let console = boot_ok(plan(k, Some(dmaprof), Payload::Shell(cmd)), &dir)?;
    let status = console.iter().find_map(|l| {
        l.split("dmaprof-vm: run exit status ")
            .nth(1)
            .map(|s| s.trim().to_owned())
    });
    let stderr = fs::read_to_string(dir.join("stderr.txt")).unwrap_or_default();
    if status.as_deref() != Some("0") {
        let tail: Vec<&str> = stderr
            .lines()
            .rev()
            .take(15)
            .collect::<Vec<_>>()
            .into_iter()
            .rev()
            .collect();
        return Err(format!(
            "dmaprof run exited {status:?}; stderr tail:\n  {}",
            tail.join("\n  ")
        ));
    }
    let text = fs::read_to_string(dir.join("report.json")).map_err(|e| format!("no report.json: {e}"))?;
    serde_json::from_str(&text).map_err(|e| format!("report.json is not JSON: {e}"))
}

fn case<'a>(r: &'a Value, name: &str) -> Result<&'a Value, String> {
    r["cases"]
        .as_array()
        .and_then(|c| c.iter().find(|c| c["name"] == name))
        .ok_or_else(|| {
            let why = r["skipped"]
                .as_array()
                .and_then(|s| s.iter().find(|s| s["name"] == name))
                .map(|s| s["reason"].clone());
            let failed = r["failed"]
                .as_array()
                .and_then(|s| s.iter().find(|s| s["name"] == name))
                .map(|s| s["error"].clone());
            format!("case {name} did not run (skipped: {why:?}, failed: {failed:?})")
        })
}

fn phase<'a>(c: &'a Value, name: &str) -> Result<&'a Value, String> {
    c["phases"]
        .as_array()
        .and_then(|p| p.iter().find(|p| p["name"] == name))
        .ok_or_else(|| format!("{} has no {name} phase", c["name"]))
}

fn ns(v: &Value) -> f64 {
    v.as_f64().unwrap_or(0.0)
}

/// Issue 4: every mode x backing x prefault the custom kernel supports runs and reports every
/// phase; iommufd maps memfd with IOMMU_IOAS_MAP_FILE.
fn dma_matrix_custom(k: &kernel::Kernel, dmaprof: &Path) -> Verdict {
    let args = "-b 64M -v '*_anonymous' -v '*_anonymous_hugetlb_2mb' -v '*_memfd' -v '*_memfd_hugetlb_2mb' \
                --prefault none,populate -n 1";
    let r = match guest_run(k, dmaprof, "matrix-custom", args) {
        Ok(r) => r,
        Err(e) => return Verdict::Failed(e),
    };
    let mut problems = check_features(&r, KERNEL_CUSTOM);
    if r["failed"].as_array().is_some_and(|f| !f.is_empty()) {
        problems.push(format!("failed cases: {}", r["failed"]));
    }
    let modes = [
        "vfio_type1_iommu",
        "vfio_type1v2_iommu",
        "iommufd_compat_type1",
        "iommufd_compat_type1v2",
        "iommufd",
    ];
    let backings = ["anonymous", "anonymous_hugetlb_2mb", "memfd", "memfd_hugetlb_2mb"];
    let mut ran = 0;
    for m in modes {
        for b in backings {
            for pf in ["none", "populate"] {
                let name = format!("{m}_{b}.{pf}");
                let c = match case(&r, &name) {
                    Ok(c) => c,
                    Err(e) => {
                        problems.push(e);
                        continue;
                    }
                };
                ran += 1;
                let want = match (m, b.starts_with("memfd")) {
                    ("iommufd", true) => "IOMMU_IOAS_MAP_FILE",
                    ("iommufd", false) => "IOMMU_IOAS_MAP",
                    _ => "VFIO_IOMMU_MAP_DMA",
                };
                if c["map_ioctl"] != want {
                    problems.push(format!("{name}: map_ioctl {} (want {want})", c["map_ioctl"]));
                }
                for p in ["mmap", "map", "unmap", "munmap"] {
                    match phase(c, p) {
                        Ok(ph) if ns(&ph["wall_ns"]["median"]) > 0.0 => {}
                        Ok(_) => problems.push(format!("{name}: {p} took 0 ns")),
                        Err(e) => problems.push(e),
                    }
                }
            }
        }
    }
    // The faulting moves into the map when nothing was prefaulted (direction, not a threshold).
    let map_ms = |n: &str| {
        case(&r, n)
            .and_then(|c| phase(c, "map"))
            .map(|p| ns(&p["wall_ns"]["median"]) / 1e6)
    };
    if let (Ok(none), Ok(pop)) = (
        map_ms("vfio_type1_iommu_anonymous.none"),
        map_ms("vfio_type1_iommu_anonymous.populate"),
    ) {
        if none <= pop * 2.0 {
            problems.push(format!(
                "type1 anonymous map: prefault none {none:.2} ms is not much larger than populate {pop:.2} ms"
            ));
        }
    }
    if problems.is_empty() {
        Verdict::Ok(format!(", {ran} cases"))
    } else {
        Verdict::Failed(problems.join("; "))
    }
}

/// Issue 4 on a stock kernel: type1 runs, iommufd modes are skipped with the reason; and the
/// probe table reports rows it could not attach (vfio_dma_do_map is inlined on Debian).
fn dma_matrix_debian(k: &kernel::Kernel, dmaprof: &Path) -> Verdict {
    let r = match guest_run(
        k,
        dmaprof,
        "matrix-debian",
        "-b 64M -v '*_anonymous' --prefault populate -n 1",
    ) {
        Ok(r) => r,
        Err(e) => return Verdict::Failed(e),
    };
    let mut problems = check_features(&r, KERNEL_6_12);
    for m in ["vfio_type1_iommu", "vfio_type1v2_iommu"] {
        if let Err(e) = case(&r, &format!("{m}_anonymous.populate")).and_then(|c| phase(c, "map")) {
            problems.push(e);
        }
    }
    for m in ["iommufd_compat_type1", "iommufd_compat_type1v2", "iommufd"] {
        let name = format!("{m}_anonymous.populate");
        let reason = r["skipped"]
            .as_array()
            .and_then(|s| s.iter().find(|s| s["name"] == name.as_str()))
            .map(|s| s["reason"].clone());
        if !reason
            .as_ref()
            .is_some_and(|r| r.as_str().is_some_and(|r| r.contains("kernel has no IOMMUFD")))
        {
            problems.push(format!(
                "{name} should be skipped with \"kernel has no IOMMUFD\", got {reason:?}"
            ));
        }
    }
    let probes = r["probes"].as_array().cloned().unwrap_or_default();
    match probes.iter().find(|p| p["function"] == "vfio_dma_do_map") {
        Some(p) if p["attached"] == false && p["error"].as_str().is_some_and(|e| !e.is_empty()) => {}
        other => problems.push(format!(
            "vfio_dma_do_map should be listed as not attached with a reason: {other:?}"
        )),
    }
    if !probes
        .iter()
        .any(|p| p["function"] == "vfio_pin_pages_remote" && p["attached"] == true)
    {
        problems.push("vfio_pin_pages_remote did not attach on debian-6.12".into());
    }
    if problems.is_empty() {
        Verdict::Ok(String::new())
    } else {
        Verdict::Failed(problems.join("; "))
    }
}

/// Issue 5: the exact breakdown, cross-checked by samples, on type1 4 KiB-page anonymous memory.
fn attribution(k: &kernel::Kernel, dmaprof: &Path) -> Verdict {
    let args =
        "-b 256M -v vfio_type1_iommu_anonymous -v 'iommufd*_anonymous_hugetlb_2mb' --prefault none,populate -n 3";
    let r = match guest_run(k, dmaprof, "attribution", args) {
        Ok(r) => r,
        Err(e) => return Verdict::Failed(e),
    };
    let mut problems = Vec::new();
    let mut notes = Vec::new();
    let get = |case_name: &str, p: &str| case(&r, case_name).and_then(|c| phase(c, p)).cloned();
    let share = |ph: &Value, cats: &[&str]| {
        let wall = ns(&ph["exact"]["wall_ns"]).max(1.0);
        cats.iter().map(|c| ns(&ph["exact"]["categories"][*c])).sum::<f64>() / wall
    };
    match (
        get("vfio_type1_iommu_anonymous.none", "map"),
        get("vfio_type1_iommu_anonymous.populate", "map"),
        get("vfio_type1_iommu_anonymous.populate", "mmap"),
    ) {
        (Ok(none), Ok(pop), Ok(pop_mmap)) => {
            let fz = share(&none, &["faulting", "zeroing"]);
            let largest_other = ["pinning", "iommu_map", "iommu_flush", "accounting", "other"]
                .iter()
                .map(|c| share(&none, &[c]))
                .fold(0.0, f64::max);
            if fz <= largest_other {
                problems.push(format!(
                    "prefault none: faulting+zeroing {:.0}% is not the largest category of map",
                    fz * 100.0
                ));
            }
            let fz_pop = share(&pop, &["faulting", "zeroing"]);
            if fz_pop > 0.1 {
                problems.push(format!(
                    "prefault populate: faulting+zeroing still {:.0}% of map",
                    fz_pop * 100.0
                ));
            }
            let fz_mmap = share(&pop_mmap, &["faulting", "zeroing"]);
            if fz_mmap < 0.5 {
                problems.push(format!(
                    "prefault populate: faulting+zeroing only {:.0}% of mmap",
                    fz_mmap * 100.0
                ));
            }
            notes.push(format!(
                "none map f+z {:.0}%, populate map {:.0}%, populate mmap {:.0}%",
                fz * 100.0,
                fz_pop * 100.0,
                fz_mmap * 100.0
            ));
            // Exact vs sampled, map phase, where there are enough samples.
            let samples = ns(&none["sampled"]["samples"]);
            if samples >= 1000.0 {
                let worst = [
                    "zeroing",
                    "faulting",
                    "pinning",
                    "iommu_map",
                    "iommu_flush",
                    "accounting",
                ]
                .iter()
                .map(|c| ((share(&none, &[c]) - ns(&none["sampled"]["categories"][*c])) * 100.0).abs())
                .fold(0.0, f64::max);
                notes.push(format!("exact vs sampled within {worst:.1} pp at {samples} samples"));
                if worst > 15.0 {
                    problems.push(format!(
                        "exact and sampled disagree by {worst:.1} pp on the type1 map phase"
                    ));
                }
            } else {
                notes.push(format!("only {samples} samples: exact/sampled agreement not checked"));
            }
        }
        (a, b, c) => problems.extend([a.err(), b.err(), c.err()].into_iter().flatten()),
    }
    // Categories + unattributed = wall, for every traced phase; unattributed small on map.
    let mut worst_unattr: f64 = 0.0;
    for c in r["cases"].as_array().cloned().unwrap_or_default() {
        for p in c["phases"].as_array().cloned().unwrap_or_default() {
            let e = &p["exact"];
            let sum: f64 = e["categories"]
                .as_object()
                .map(|m| m.values().map(ns).sum())
                .unwrap_or(0.0);
            if (sum + ns(&e["unattributed_ns"]) - ns(&e["wall_ns"])).abs() > 1.0 {
                problems.push(format!(
                    "{} {}: categories + unattributed != wall",
                    c["name"], p["name"]
                ));
            }
            // A few-ms phase under emulation carries ~1 ms of timer noise outside the syscall:
            // hold the 5% bound where that noise is small against the phase.
            if p["name"] == "map" && ns(&e["wall_ns"]) >= 20e6 {
                let u = ns(&e["unattributed_ns"]).abs() / ns(&e["wall_ns"]).max(1.0);
                worst_unattr = worst_unattr.max(u);
            }
        }
    }
    notes.push(format!(
        "worst unattributed {:.2}% of a map phase >= 20 ms",
        worst_unattr * 100.0
    ));
    if worst_unattr > 0.05 {
        problems.push(format!(
            "unattributed reaches {:.1}% of a map phase",
            worst_unattr * 100.0
        ));
    }
    // Mixed mechanisms: vmlinux rows by fentry/fexit, module rows by kprobe/kretprobe, one
    // accounting (the call counts above and below come through both).
    let probes = r["probes"].as_array().cloned().unwrap_or_default();
    for (function, mechanism) in [
        ("handle_mm_fault", "fentry"),
        ("iommu_map", "fentry"),
        ("vfio_pin_pages_remote", "kprobe"),
    ] {
        if !probes
            .iter()
            .any(|p| p["function"] == function && p["mechanism"] == mechanism && p["attached"] == true)
        {
            problems.push(format!("{function} is not attached by {mechanism}"));
        }
    }
    // iommufd_compat_type1 disables large pages: many more iommu_map calls than iommufd.
    let calls = |n: &str| {
        get(n, "map").ok().and_then(|p| {
            p["exact"]["rows"]
                .as_array()?
                .iter()
                .find(|r| r["function"] == "iommu_map")
                .map(|r| ns(&r["calls"]))
        })
    };
    match (
        calls("iommufd_compat_type1_anonymous_hugetlb_2mb.populate"),
        calls("iommufd_anonymous_hugetlb_2mb.populate"),
    ) {
        (Some(compat), Some(native)) if compat >= native * 4.0 => {
            notes.push(format!("iommu_map calls compat {compat} vs iommufd {native}"))
        }
        other => problems.push(format!(
            "iommu_map calls (compat_type1, iommufd) = {other:?}: compat should be many times more"
        )),
    }
    if problems.is_empty() {
        Verdict::Ok(format!(", {}", notes.join(", ")))
    } else {
        Verdict::Failed(problems.join("; "))
    }
}

/// Issue 4: bad devices get one clear line and exit 2; --bind binds and restores.
fn bad_devices(k: &kernel::Kernel, dmaprof: &Path) -> Verdict {
    let dir = scratch("bad-devices");
    let run = "/bin/dmaprof run -b 16M -v vfio_type1_iommu_anonymous.none -n 1 -o /tmp/o";
    let cmd = format!(
        "E=/sys/bus/pci/devices/$VFIO_SELFTESTS_BDF; \
         {run} -d 0000:00:1f.7 2> /out/nodev.txt; echo \"T nodev $?\"; \
         {run} -d zz:00 2> /out/malformed.txt; echo \"T malformed $?\"; \
         echo $VFIO_SELFTESTS_BDF > $E/driver/unbind; echo > $E/driver_override; \
         {run} 2> /out/unbound.txt; echo \"T unbound $?\"; \
         {run} --bind > /dev/null 2> /out/bind.txt; echo \"T bind $?\"; \
         echo \"T after $(basename $(readlink $E/driver 2>/dev/null || echo none))\""
    );
    let console = match boot_ok(plan(k, Some(dmaprof), Payload::Shell(cmd)), &dir) {
        Ok(c) => c,
        Err(e) => return Verdict::Failed(e),
    };
    let result = |t: &str| {
        console
            .iter()
            .find_map(|l| l.split(&format!("T {t} ")).nth(1).map(|s| s.trim().to_owned()))
    };
    let stderr = |f: &str| fs::read_to_string(dir.join(f)).unwrap_or_default();
    let mut problems = Vec::new();
    for (t, file, needle) in [
        ("nodev", "nodev.txt", "no PCI device"),
        ("malformed", "malformed.txt", "not a PCI address"),
        ("unbound", "unbound.txt", "pass --bind"),
    ] {
        let err = stderr(file);
        if result(t).as_deref() != Some("2") || err.trim_end().lines().count() != 1 || !err.contains(needle) {
            problems.push(format!(
                "{t}: exit {:?}, stderr {err:?} (want exit 2, one line with `{needle}`)",
                result(t)
            ));
        }
    }
    if result("bind").as_deref() != Some("0") {
        problems.push(format!(
            "--bind run exited {:?}: {}",
            result("bind"),
            stderr("bind.txt")
        ));
    }
    if result("after").as_deref() != Some("none") {
        problems.push(format!(
            "after --bind the device should be unbound again, is bound to {:?}",
            result("after")
        ));
    }
    if problems.is_empty() {
        Verdict::Ok(String::new())
    } else {
        Verdict::Failed(problems.join("; "))
    }
}

/// Kernel changes debian-6.1 must lack (all came later).
const KERNEL_6_1: &[(&str, bool)] = &[
    ("memfd_pin_folios", false),
    ("folio_zero_user", false),
    ("ioas_map_file", false),
    ("iommu_map_batched_sync", false),
];
/// debian-6.12: after 6.11/6.12's changes, before 6.13's MAP_FILE and 6.16's batched sync.
const KERNEL_6_12: &[(&str, bool)] = &[
    ("memfd_pin_folios", true),
    ("folio_zero_user", true),
    ("huge_pfnmap", true),
    ("ioas_map_file", false),
    ("iommu_map_batched_sync", false),
];
/// The custom 7.x kernel has all of them (iommufd built in).
const KERNEL_CUSTOM: &[(&str, bool)] = &[
    ("iommufd", true),
    ("memfd_pin_folios", true),
    ("folio_zero_user", true),
    ("ioas_map_file", true),
    ("iommu_map_batched_sync", true),
];

/// Signals sent in the guest (issue 6 asks for at least 30 interrupted runs; a SIGINT that
/// arrives before dmaprof installs its handler is ignored, as sh ignores it for background jobs,
/// and such a run completes normally).
const SIGNAL_RUNS: u32 = 40;

/// Issue 6: SIGINT/SIGTERM/SIGHUP at random moments of real VFIO/IOMMUFD runs leave nothing
/// behind: no dmaprof BPF program, link, kprobe event or process, hugepage pools as before, the
/// device unbound again after `--bind`, and an interrupted report marked partial.
fn signals_in_guest(k: &kernel::Kernel, dmaprof: &Path) -> Verdict {
    let dir = scratch("signals");
    // One uninterrupted run first calibrates how long a run takes in this boot; the even runs'
    // signals land uniformly over 0..85% of that (set-up, untraced reference, probe attach,
    // clean-up), the odd runs' within 600 ms of the first traced case starting (the phases).
    let run = "/bin/dmaprof run --bind -b 32M -v vfio_type1_iommu_anonymous -v iommufd_memfd_hugetlb_2mb \
               --prefault none,populate -n 1";
    let cmd = format!(
        r#"E=/sys/bus/pci/devices/$VFIO_SELFTESTS_BDF
echo $VFIO_SELFTESTS_BDF > $E/driver/unbind; echo > $E/driver_override
hp() {{ cat /sys/kernel/mm/hugepages/*/nr_hugepages | tr '\n' ,; }}
drv() {{ basename $(readlink $E/driver 2>/dev/null || echo none); }}
up() {{ cut -d' ' -f1 /proc/uptime | tr -d .; }}
echo "S before $(hp) $(drv)"
t0=$(up); {run} -o /tmp/cal > /dev/null 2> /out/cal.txt; rc=$?; T=$(( ($(up) - t0) * 10 ))
echo "S calibrate $rc $T"
i=0
while [ $i -lt {SIGNAL_RUNS} ]; do
  case $((i % 3)) in 0) s=INT;; 1) s=TERM;; *) s=HUP;; esac
  {run} -o /tmp/r$i > /dev/null 2> /out/e$i.txt & p=$!
  if [ $((i % 2)) = 0 ]; then
    d=$(( (RANDOM * 32768 + RANDOM) % (T * 85 / 100 + 1) ))
  else
    # Aim at the workload: wait for the first traced case to start, then up to 600 ms more.
    n=0; while ! grep -q ' traced (' /out/e$i.txt && [ $n -lt 600 ]; do usleep 20000; n=$((n + 1)); done
    d=$((RANDOM % 600))
  fi
  usleep $((d * 1000)); kill -$s $p; wait $p; rc=$?
  /bin/dmaprof doctor --leftovers > /out/l$i.txt 2>&1; l=$?
  part=$(grep -c '"partial": true' /tmp/r$i/report.json 2>/dev/null)
  echo "S run $i $s $d $rc $l $(hp) $(drv) ${{part:-none}}"
  rm -rf /tmp/r$i
  i=$((i + 1))
done"#
    );
    let mut p = plan(k, Some(dmaprof), Payload::Shell(cmd));
    p.timeout = Duration::from_secs(900);
    let console = match boot_ok(p, &dir) {
        Ok(c) => c,
        Err(e) => return Verdict::Failed(e),
    };
    let lines: Vec<Vec<&str>> = console
        .iter()
        .filter_map(|l| l.split("S ").nth(1).filter(|_| l.starts_with("S ")))
        .map(|l| l.split_whitespace().collect())
        .collect();
    let Some(before) = lines.iter().find(|l| l.first() == Some(&"before")) else {
        return Verdict::Failed("the guest script printed no `before` line".into());
    };
    let (hp0, drv0) = (before[1], before[2]);
    let mut problems = Vec::new();
    match lines.iter().find(|l| l.first() == Some(&"calibrate")) {
        Some(l) if l[1] == "0" => {}
        other => problems.push(format!(
            "the uninterrupted calibration run failed: {other:?}: {}",
            fs::read_to_string(dir.join("cal.txt")).unwrap_or_default()
        )),
    }
    let (mut interrupted, mut places) = (0, std::collections::BTreeMap::<String, u32>::new());
    let runs: Vec<&Vec<&str>> = lines.iter().filter(|l| l.first() == Some(&"run")).collect();
    for r in &runs {
        let [_, i, sig, delay, rc, leftovers, hp, drv, partial] = r[..] else {
            problems.push(format!("malformed guest line {r:?}"));
            continue;
        };
        let stderr = fs::read_to_string(dir.join(format!("e{i}.txt"))).unwrap_or_default();
        let want = match sig {
            "INT" => "130",
            "TERM" => "143",
            _ => "129",
        };
        let what = format!("run {i} (SIG{sig} after {delay} ms)");
        if stderr.contains("panicked") {
            problems.push(format!("{what} panicked: {stderr}"));
        }
        if rc == want {
            interrupted += 1;
            // Where it landed: "signal N during <case> <phase>: ..." or a stage of the run.
            let place = match stderr
                .lines()
                .find_map(|l| l.split(" during ").nth(1))
                .and_then(|s| s.split(':').next())
            {
                Some(stage) if !stage.contains('.') => stage.to_owned(),
                Some(case_phase) => case_phase.rsplit(' ').next().unwrap_or(case_phase).to_owned(),
                None => "before the handler".into(),
            };
            // Only a signal after the last phase may leave a complete report behind.
            if partial == "0" && !place.starts_with("finishing") {
                problems.push(format!("{what}: landed in {place}, report.json is not marked partial"));
            }
            *places.entry(place).or_default() += 1;
        } else if rc != "0" {
            problems.push(format!("{what}: exit {rc}, want {want} or 0: {}", stderr.trim()));
        }
        if leftovers != "0" {
            let l = fs::read_to_string(dir.join(format!("l{i}.txt"))).unwrap_or_default();
            problems.push(format!("{what} left things behind: {}", l.trim()));
        }
        if hp != hp0 {
            problems.push(format!("{what}: hugepage pools {hp}, before {hp0}"));
        }
        if drv != drv0 {
            problems.push(format!("{what}: device bound to {drv}, before {drv0}"));
        }
    }
    if runs.len() != SIGNAL_RUNS as usize {
        problems.push(format!("{} of {SIGNAL_RUNS} signalled runs reported", runs.len()));
    }
    if interrupted < 30 {
        problems.push(format!("only {interrupted} runs were interrupted (want >= 30)"));
    }
    let phases = ["memfd_create", "mmap", "touch", "map", "unmap", "munmap", "close"];
    if !places.keys().any(|p| phases.contains(&p.as_str())) {
        problems.push(format!(
            "no signal landed inside a workload phase (landed in {places:?})"
        ));
    }
    if problems.is_empty() {
        let places: Vec<String> = places.into_iter().map(|(p, n)| format!("{p} x{n}")).collect();
        Verdict::Ok(format!(
            ", {interrupted}/{} runs interrupted, landed in: {}",
            runs.len(),
            places.join(", ")
        ))
    } else {
        Verdict::Failed(problems.join("; "))
    }
}

/// Which kernel changes (`kernel.features` in report.json) a kernel must show or lack.
fn check_features(r: &Value, expect: &[(&str, bool)]) -> Vec<String> {
    let features = r["kernel"]["features"].as_array().cloned().unwrap_or_default();
    expect
        .iter()
        .filter_map(|(id, want)| {
            let got = features.iter().find(|f| f["id"] == *id).map(|f| f["present"].clone());
            (got != Some(Value::Bool(*want))).then(|| format!("kernel feature {id}: present {got:?}, want {want}"))
        })
        .collect()
}

/// Issue 6, kernel matrix: on a stock kernel every selected case runs or is skipped with a
/// reason, every probe row attaches or says why, nothing crashes, and report.json records the
/// kernel's facts.
fn kernel_matrix(k: &kernel::Kernel, dmaprof: &Path, expect: &[(&str, bool)]) -> Verdict {
    let r = match guest_run(
        k,
        dmaprof,
        "kernel-matrix",
        "-b 32M -v '*_anonymous' -v '*_memfd' -v '*_anonymous_hugetlb_2mb' --prefault none,populate -n 1",
    ) {
        Ok(r) => r,
        Err(e) => return Verdict::Failed(e),
    };
    let mut problems = check_features(&r, expect);
    if r["failed"].as_array().is_some_and(|f| !f.is_empty()) {
        problems.push(format!("failed cases: {}", r["failed"]));
    }
    let ran: Vec<&str> = r["cases"]
        .as_array()
        .map(|c| c.iter().filter_map(|c| c["name"].as_str()).collect())
        .unwrap_or_default();
    let skipped = r["skipped"].as_array().cloned().unwrap_or_default();
    for s in &skipped {
        if s["reason"].as_str().is_none_or(str::is_empty) {
            problems.push(format!("{} skipped without a reason", s["name"]));
        }
    }
    // 3 backings x 2 prefaults x 6 modes (`none` included).
    if ran.len() + skipped.len() != 36 {
        problems.push(format!("{} ran + {} skipped, want 36 cases", ran.len(), skipped.len()));
    }
    for want in ["vfio_type1_iommu_anonymous.none", "vfio_type1v2_iommu_memfd.populate"] {
        if !ran.contains(&want) {
            problems.push(format!("{want} did not run on a kernel with VFIO type1"));
        }
    }
    let probes = r["probes"].as_array().cloned().unwrap_or_default();
    for p in &probes {
        if p["attached"] != true && p["error"].as_str().is_none_or(str::is_empty) {
            problems.push(format!("probe {} neither attached nor says why", p["function"]));
        }
    }
    let attached = probes.iter().filter(|p| p["attached"] == true).count();
    if attached < 10 {
        problems.push(format!("only {attached} probes attached"));
    }
    if problems.is_empty() {
        let has: Vec<&str> = r["kernel"]["features"]
            .as_array()
            .map(|f| {
                f.iter()
                    .filter(|f| f["present"] == true)
                    .filter_map(|f| f["id"].as_str())
                    .collect()
            })
            .unwrap_or_default();
        Verdict::Ok(format!(
            ", Linux {}: {} cases ran, {} skipped, {attached}/{} probes attached, has [{}]",
            r["kernel"]["release"].as_str().unwrap_or("?"),
            ran.len(),
            skipped.len(),
            probes.len(),
            has.join(" ")
        ))
    } else {
        Verdict::Failed(problems.join("; "))
    }
}
