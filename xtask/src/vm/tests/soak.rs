//! Many consecutive runs in one boot, with what a leak would grow checked after each: the
//! guest's MemAvailable, dmaprof's own peak RSS, dmaprof BPF objects left, the hugepage pool,
//! the device's driver and the pinned/locked counters.
use std::fs;

use serde_json::Value;

use super::{Ctx, Outcome, boot_ok, findings, no_failed_step, plan, scratch, shell};

/// Runs in the short form CI runs; `DMAPROF_SOAK_RUNS` sets another count (200 for the full
/// soak, whose numbers the README gives).
const SHORT_RUNS: u32 = 20;
/// MemAvailable may drift (page cache, slab) but not by this much between the first and the
/// last runs, KiB.
const MEM_DRIFT_KIB: i64 = 32 * 1024;

/// The guest loop: odd runs take the whole matrix untraced (every DMA and hugepage path), even
/// runs one case per IOMMU mode with every pass (probes attached, switched and detached).
fn script(runs: u32) -> String {
    format!(
        r#"mem() {{ awk '/MemAvailable/ {{print $2}}' /proc/meminfo; }}
hp() {{ cat /sys/kernel/mm/hugepages/hugepages-2048kB/nr_hugepages; }}
drv() {{ basename "$(readlink /sys/bus/pci/devices/$VFIO_SELFTESTS_BDF/driver 2>/dev/null || echo none)"; }}
pins() {{ awk '/nr_foll_pin_acquired/ {{a=$2}} /nr_foll_pin_released/ {{r=$2}} END {{print a-r}}' /proc/vmstat; }}
i=1
while [ $i -le {runs} ]; do
  if [ $((i % 2)) -eq 1 ]; then
    /bin/dmaprof run --json -b 2M -n 1 --passes untraced -o /tmp/soak > /dev/null 2> /out/err.txt; rc=$?
  else
    /bin/dmaprof run --json -b 2M -n 1 -v vfio_type1_iommu_anonymous.none -v iommufd_compat_type1v2_memfd.populate \
      -v iommufd_memfd_hugetlb_2mb.none -o /tmp/soak > /dev/null 2> /out/err.txt; rc=$?
  fi
  [ $rc -ne 0 ] && cp /out/err.txt /out/err-$i.txt
  /bin/dmaprof doctor --leftovers > /dev/null 2>&1; l=$?
  echo 1 > /proc/sys/vm/stat_refresh
  rss=$(grep -o '"peak_rss_kib": *[0-9]*' /tmp/soak/report.json | grep -o '[0-9]*$')
  v i $i rc $rc left $l mem "$(mem)" hp "$(hp)" drv "$(drv)" pins "$(pins)" rss "$rss"
  i=$((i+1))
done
"#
    )
}

fn num(f: &Value, k: &str) -> i64 {
    f[k].as_str().and_then(|v| v.trim().parse().ok()).unwrap_or(-1)
}

/// What grew or failed over the runs.
fn problems(found: &[Value], runs: u32) -> Vec<String> {
    let mut out = Vec::new();
    if found.len() != runs as usize {
        out.push(format!("{} of {runs} runs reported", found.len()));
    }
    for f in found {
        if f["rc"] != "0" || f["left"] != "0" || f["hp"] != "0" || f["drv"] != "vfio-pci" || num(f, "pins") != 0 {
            out.push(format!("run {}: {f}", f["i"]));
        }
    }
    // The first run of each kind warms caches; compare like with like from there on.
    for parity in [1, 0] {
        let kind: Vec<&Value> = found.iter().filter(|f| num(f, "i") % 2 == parity).skip(1).collect();
        if let (Some(first), Some(last)) = (kind.first(), kind.last()) {
            if num(first, "mem") - num(last, "mem") > MEM_DRIFT_KIB {
                out.push(format!(
                    "MemAvailable fell from {} to {} KiB",
                    first["mem"], last["mem"]
                ));
            }
            if num(last, "rss") > num(first, "rss") * 11 / 10 {
                out.push(format!(
                    "dmaprof's peak RSS grew from {} to {} KiB",
                    first["rss"], last["rss"]
                ));
            }
        }
    }
    out
}

/// `SHORT_RUNS` (or `DMAPROF_SOAK_RUNS`) runs in one boot leave nothing growing.
pub(super) fn soak(c: &Ctx) -> Outcome {
    let runs = std::env::var("DMAPROF_SOAK_RUNS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(SHORT_RUNS);
    let dir = scratch("soak");
    let mut p = plan(c, true, shell(&script(runs)));
    p.timeout = std::time::Duration::from_secs(600 + 60 * u64::from(runs));
    boot_ok(p, &dir)?;
    let found = findings(&dir)?;
    no_failed_step(&found, &dir)?;
    let problems = problems(&found, runs);
    let (first, last) = (found.first(), found.last());
    let summary = format!(
        "{runs} runs; MemAvailable {} -> {} KiB; peak RSS {} -> {} KiB",
        first.map_or(-1, |f| num(f, "mem")),
        last.map_or(-1, |f| num(f, "mem")),
        first.map_or(-1, |f| num(f, "rss")),
        last.map_or(-1, |f| num(f, "rss")),
    );
    match problems.is_empty() {
        true => Ok(summary),
        false => Err(format!(
            "{summary}\n{}\nfirst failing run's stderr: {}",
            problems.join("\n"),
            first_error(&dir, &found)
        )),
    }
}

fn first_error(dir: &std::path::Path, found: &[Value]) -> String {
    found
        .iter()
        .find(|f| f["rc"] != "0")
        .and_then(|f| fs::read_to_string(dir.join(format!("err-{}.txt", num(f, "i")))).ok())
        .unwrap_or_default()
}
