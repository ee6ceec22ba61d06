//! Faults dmaprof must survive in the guest, in one boot: kernel allocation failures inside
//! the map ioctl of every IOMMU mode (the kernel's fault injection, armed for dmaprof's
//! workload thread only during the map), RLIMIT_MEMLOCK without CAP_IPC_LOCK (util-linux's
//! `setpriv` drops it), and the device unbound from vfio-pci while a case maps.
use std::{fs, path::Path};

use serde_json::Value;

use super::{Ctx, Outcome, boot_ok, findings, plan, scratch, shell};

/// One case per IOMMU mode whose map allocates pages (demand faults inside GUP, or
/// memfd_pin_folios for iommufd's MAP_FILE): fail_page_alloc fails them part-way.
const PAGE_CASES: &str = "-v vfio_type1_iommu_anonymous.none -v vfio_type1v2_iommu_anonymous.none \
     -v iommufd_compat_type1_anonymous.none -v iommufd_compat_type1v2_anonymous.none \
     -v iommufd_anonymous.none -v iommufd_memfd.none";
/// One case per IOMMU mode on populated 2 MiB hugetlb pages: only the kernel's own structures
/// are allocated in the map, and failslab fails the first of them.
const SLAB_CASES: &str = "-v '*iommu*_anonymous_hugetlb_2mb.populate'";
/// Cases for the memlock limit (type1 charges locked_vm, iommufd the user's locked_vm).
const MEMLOCK_CASES: &str = "-v vfio_type1_iommu_anonymous.populate -v iommufd_anonymous.populate \
     -v iommufd_compat_type1v2_anonymous.populate";
/// The device is unbound while the first of these maps; the others need it too.
const REMOVAL_CASES: &str =
    "-v vfio_type1_iommu_memfd.none -v vfio_type1v2_iommu_anonymous.none -v iommufd_anonymous.none";

/// The guest script: each step records its exit code, the hugepage pool, the device's driver
/// and `doctor --leftovers` with `v`.
fn script() -> String {
    format!(
        r#"R='/bin/dmaprof run --json'
hp() {{ cat /sys/kernel/mm/hugepages/hugepages-2048kB/nr_hugepages; }}
drv() {{ basename "$(readlink /sys/bus/pci/devices/$VFIO_SELFTESTS_BDF/driver 2>/dev/null || echo none)"; }}
left() {{ /bin/dmaprof doctor --leftovers > /out/leftovers-$1.txt 2>&1; echo $?; }}
arm() {{ # $1: fail_page_alloc or failslab; $2: interval
  D=/sys/kernel/debug/$1
  echo Y > $D/task-filter; echo 100 > $D/probability; echo -1 > $D/times; echo 0 > $D/verbose
  echo 0 > $D/space; echo $2 > $D/interval; echo N > $D/ignore-gfp-wait
  [ -e $D/min-order ] && echo 0 > $D/min-order && echo N > $D/ignore-gfp-highmem
}}
disarm() {{ echo 0 > /sys/kernel/debug/$1/probability; }}
v t before hp "$(hp)" drv "$(drv)"
arm fail_page_alloc 10
$R -b 64M -n 1 --fail-map-allocs {PAGE_CASES} -o /out/pages > /dev/null 2> /out/pages.err; rc=$?
disarm fail_page_alloc
v t pages rc $rc hp "$(hp)" drv "$(drv)" left "$(left pages)"
arm failslab 1
$R -b 64M -n 1 --fail-map-allocs {SLAB_CASES} -o /out/slab > /dev/null 2> /out/slab.err; rc=$?
disarm failslab
v t slab rc $rc hp "$(hp)" drv "$(drv)" left "$(left slab)"
$R -b 64M -n 1 {PAGE_CASES} {SLAB_CASES} -o /out/again > /dev/null 2> /out/again.err; rc=$?
v t again rc $rc hp "$(hp)" drv "$(drv)" left "$(left again)"
(ulimit -l 1024 && exec /usr/bin/setpriv --bounding-set -ipc_lock --inh-caps -ipc_lock \
  $R -b 64M -n 1 --no-trace {MEMLOCK_CASES} -o /out/memlock > /dev/null 2> /out/memlock.err); rc=$?
v t memlock rc $rc left "$(left memlock)"
$R -b 256M -n 8 --passes untraced {REMOVAL_CASES} -o /out/removed > /dev/null 2> /out/removed.err &
P=$!
i=0; while ! grep -q 'vfio_type1_iommu_memfd.none (' /out/removed.err && [ $i -lt 600 ]; do sleep 0.1; i=$((i+1)); done
sleep 1
echo $VFIO_SELFTESTS_BDF > /sys/bus/pci/drivers/vfio-pci/unbind &
U=$!
wait $P; rc=$?
wait $U; u=$?
v t removed rc $rc unbind $u drv "$(drv)" left "$(left removed)"
"#
    )
}

/// The run's report.json and stderr.
fn run_output(dir: &Path, name: &str) -> Result<(Value, String), String> {
    let stderr = fs::read_to_string(dir.join(format!("{name}.err"))).unwrap_or_default();
    let text = fs::read_to_string(dir.join(name).join("report.json"))
        .map_err(|e| format!("{name}: no report.json ({e}); stderr: {stderr}"))?;
    let r = serde_json::from_str(&text).map_err(|e| format!("{name}: report.json: {e}"))?;
    Ok((r, stderr))
}

/// Every case of an injected run failed with ENOMEM and its meaning, and the kernel left
/// nothing mapped, locked or pinned.
fn injected(dir: &Path, name: &str, want: usize) -> Result<String, String> {
    let (r, stderr) = run_output(dir, name)?;
    let failed = r["failed"].as_array().cloned().unwrap_or_default();
    let mut problems = Vec::new();
    if failed.len() != want || !r["cases"].as_array().is_some_and(Vec::is_empty) {
        problems.push(format!(
            "{name}: {} of {want} cases failed; stderr: {stderr}",
            failed.len()
        ));
    }
    for f in &failed {
        let error = f["error"].as_str().unwrap_or_default();
        if !error.contains("ENOMEM") || !error.contains("fault injection") {
            problems.push(format!(
                "{name}: {} failed with {error:?}, not an injected ENOMEM",
                f["name"]
            ));
        }
        if f["left_mapped_bytes"] != 0 {
            problems.push(format!(
                "{name}: {} left {} bytes mapped",
                f["name"], f["left_mapped_bytes"]
            ));
        }
    }
    if r["leaks"].as_array().is_some_and(|l| !l.is_empty()) {
        problems.push(format!("{name}: left held: {}", r["leaks"]));
    }
    match problems.is_empty() {
        true => Ok(format!(
            "{name}: {} cases failed with an injected ENOMEM, nothing left",
            failed.len()
        )),
        false => Err(problems.join("; ")),
    }
}

/// The memlock run: every DMA case failed naming the limit, its value and the fix.
fn memlock(dir: &Path) -> Result<String, String> {
    let (r, stderr) = run_output(dir, "memlock")?;
    let failed = r["failed"].as_array().cloned().unwrap_or_default();
    if failed.len() != 3 {
        return Err(format!("memlock: {} of 3 cases failed; stderr: {stderr}", failed.len()));
    }
    for f in &failed {
        let error = f["error"].as_str().unwrap_or_default();
        let named = ["RLIMIT_MEMLOCK is 1024 KiB", "CAP_IPC_LOCK", "ulimit -l"];
        if !named.iter().all(|n| error.contains(n)) {
            return Err(format!("memlock: {} failed with {error:?}: want {named:?}", f["name"]));
        }
    }
    Ok(format!("memlock: {}", failed[0]["error"].as_str().unwrap_or_default()))
}

/// The removal run: the mapping case failed saying the device went away, the later cases
/// were skipped for it, the report was written.
fn removal(dir: &Path) -> Result<String, String> {
    let (r, stderr) = run_output(dir, "removed")?;
    let failed = r["failed"].as_array().cloned().unwrap_or_default();
    let skipped = r["skipped"].as_array().cloned().unwrap_or_default();
    let gone = |s: &Value| {
        let reason = s["reason"].as_str().unwrap_or_default();
        reason.contains("went away") || reason.contains("no longer bound to vfio-pci")
    };
    let first_failed = failed.first().is_some_and(|f| {
        f["name"] == "vfio_type1_iommu_memfd.none" && f["error"].as_str().is_some_and(|e| e.contains("going away"))
    });
    if !first_failed || skipped.len() != 2 || !skipped.iter().all(gone) {
        return Err(format!(
            "removed: failed {failed:?}, skipped {skipped:?} (want the first case failed and two skipped for the removal); stderr: {stderr}"
        ));
    }
    Ok(format!("removed: {}; {}", failed[0]["error"], skipped[0]["reason"]))
}

/// The steps' exit codes, hugepage pools, driver and leftovers.
fn steps(found: &[Value]) -> Vec<String> {
    let want_rc = [
        ("pages", "1"),
        ("slab", "1"),
        ("again", "0"),
        ("memlock", "1"),
        ("removed", "1"),
    ];
    let before = found.iter().find(|f| f["t"] == "before");
    let mut problems = Vec::new();
    for (t, rc) in want_rc {
        let Some(f) = found.iter().find(|f| f["t"] == t) else {
            problems.push(format!("no {t} step"));
            continue;
        };
        if f["rc"] != rc || f["left"] != "0" {
            problems.push(format!(
                "{t}: exit {} (want {rc}), doctor --leftovers {}",
                f["rc"], f["left"]
            ));
        }
        let same = |k: &str| f.get(k).is_none() || before.is_some_and(|b| b[k] == f[k]);
        if t != "removed" && (!same("hp") || !same("drv")) {
            problems.push(format!("{t}: pool/driver {f} differ from before {before:?}"));
        }
    }
    if let Some(f) = found.iter().find(|f| f["t"] == "removed")
        && (f["unbind"] != "0" || f["drv"] != "none")
    {
        problems.push(format!("the unbind did not complete: {f}"));
    }
    problems
}

/// Kernel allocation failures in every mode's map, the memlock limit and a device unbound
/// mid-run: each fails its cases cleanly and leaves nothing behind.
pub(super) fn faults_survived(c: &Ctx) -> Outcome {
    let dir = scratch("faults");
    let mut p = plan(c, true, shell(&script()));
    p.host_files = crate::vm::with_libraries(Path::new("/usr/bin/setpriv")).map_err(|e| format!("{e:#}"))?;
    boot_ok(p, &dir)?;
    let found = findings(&dir)?;
    let mut problems = steps(&found);
    let mut lines = Vec::new();
    for r in [
        injected(&dir, "pages", 6),
        injected(&dir, "slab", 5),
        memlock(&dir),
        removal(&dir),
    ] {
        match r {
            Ok(line) => lines.push(line),
            Err(e) => problems.push(e),
        }
    }
    match problems.is_empty() {
        true => Ok(lines.join("\n")),
        false => Err(problems.join("\n")),
    }
}
