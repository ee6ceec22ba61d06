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
use sha2::{Digest as _, Sha256};

use super::{Payload, Plan, cache_dir, execute, kernel, qemu, unpack_archive};
use crate::build::build_static;

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
pub fn run() -> Result<()> {
    let started = Instant::now();
    kernel::ensure_vm_packages()?;
    let cache = cache_dir()?;
    eprintln!("xtask: VM tests (cache {})", cache.display());
    let custom = kernel::prepare(&kernel::Choice::Custom, None, &cache)?;
    let debian = kernel::prepare(&kernel::Choice::Debian("debian-6.12"), None, &cache)?;
    let dmaprof = build_static()?;
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
    ];
    let (mut passed, mut failed, mut skipped) = (0, 0, 0);
    for (name, test) in tests {
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

fn plan<'a>(kernel: &'a kernel::Kernel, dmaprof: Option<&'a Path>, payload: Payload) -> Plan<'a> {
    Plan {
        kernel,
        dmaprof,
        payload,
        mem: "1G",
        smp: 2,
        hugepages_1g: 0,
        hugepages_2m: 0,
        append: "",
        timeout: BOOT_TIMEOUT,
        echo: false,
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

/// The assertions on `dmaprof doctor --json`.
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
    let got: String = Sha256::digest(&blob).iter().map(|b| format!("{b:02x}")).collect();
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
