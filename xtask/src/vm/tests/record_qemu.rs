//! `dmaprof record` on the real client: Debian's QEMU (shipped by `guest_qemu`) started in the
//! guest with the edu device as `vfio-pci`, once on the legacy container (VFIO type1) and once
//! on the iommufd backend, in one boot. Under `-S` no guest code runs: QEMU only initialises,
//! realizes vfio-pci (whose memory listener maps every RAM and ROM section of the guest's
//! address space for DMA) and quits when QMP, served only once the machine is up, tells it to,
//! after printing its flat memory map. The recorded calls are checked against that map, and
//! the breakdown of the guest-RAM call against `dmaprof run` on the same backing.
use std::{fs, path::Path};

use serde_json::Value;

use super::{
    Ctx, Outcome, boot_ok, case, finding, findings, no_failed_step, ns, phase, plan, read_json, scratch, shell,
};
use crate::vm::{cache_dir, guest_qemu};

/// QEMU's `-m`: the guest RAM the maps must cover.
const GUEST_RAM: u64 = 256 << 20;

/// How far (percentage points) a category's share of the guest-RAM call may be from its
/// share of `run`'s map on the same backing.
const SHARE_TOLERANCE_PP: f64 = 15.0;

/// One QEMU backend: its recording's name, the map ioctls it may make, and the `run` case on
/// the same backing (QEMU's `-m` RAM is anonymous, not prefaulted; it asks for type1v2 first).
struct Backend {
    name: &'static str,
    map_kinds: &'static [&'static str],
    run_case: &'static str,
}

const TYPE1: Backend = Backend {
    name: "type1",
    map_kinds: &["VFIO_IOMMU_MAP_DMA"],
    run_case: "vfio_type1v2_iommu_anonymous.none",
};

const IOMMUFD: Backend = Backend {
    name: "iommufd",
    map_kinds: &["IOMMU_IOAS_MAP", "IOMMU_IOAS_MAP_FILE"],
    run_case: "iommufd_anonymous.none",
};

/// The guest script: QEMU recorded on each backend (the iommufd one only where QEMU, the
/// kernel and the device have what it needs, else a finding saying why), `run` on the same
/// backings, then `doctor --leftovers`.
fn script() -> String {
    let qemu = format!(
        "qemu-system-x86_64 -accel tcg -m {}M -nodefaults -nographic -S -qmp stdio",
        GUEST_RAM >> 20
    );
    format!(
        r#"QMP='{{"execute":"qmp_capabilities"}}
{{"execute":"human-monitor-command","arguments":{{"command-line":"info mtree -f"}}}}
{{"execute":"quit"}}'
B=$VFIO_SELFTESTS_BDF
rec() {{ # $1: name; the rest: vfio-pci options
  n=$1; shift
  printf '%s\n' "$QMP" | /bin/dmaprof record -o /tmp/$n -- {qemu} "$@" > /out/$n.out 2> /out/$n.err \
    || v ${{n}}_exit $?
  cp /tmp/$n/report.json /out/$n.json
}}
qemu-system-x86_64 --version | head -1 > /out/qemu-version.txt
rec type1 -device vfio-pci,host=$B
why=
lacks() {{ why="${{why:+$why; }}$1"; }}
qemu-system-x86_64 -object help | grep -qw iommufd \
  || lacks "$(cat /out/qemu-version.txt) has no iommufd object (QEMU's iommufd backend came in 9.0)"
[ -c /dev/iommu ] || lacks "no /dev/iommu (kernel without CONFIG_IOMMUFD, or iommufd.ko not loaded)"
ls /sys/bus/pci/devices/$B/vfio-dev 2>/dev/null | grep -q vfio \
  || lacks "no VFIO cdev for $B (kernel without CONFIG_VFIO_DEVICE_CDEV)"
if [ -z "$why" ]; then
  rec iommufd -object iommufd,id=iommufd0 -device vfio-pci,host=$B,iommufd=iommufd0
else
  v t iommufd_skip why "$why"
fi
/bin/dmaprof run --json -b {}M -v {} -v {} -n 1 -o /tmp/run > /out/run.json 2> /out/run.err || v run_exit $?
/bin/dmaprof doctor --leftovers > /out/leftovers.txt 2>&1 || v leftovers_exit $?
v done yes
"#,
        GUEST_RAM >> 20,
        TYPE1.run_case,
        IOMMUFD.run_case
    )
}

/// QEMU on both backends under `record`: the calls are the sections of QEMU's memory map, they
/// cover the guest RAM, and the guest-RAM call's breakdown is `run`'s on the same backing.
pub(super) fn record_qemu(c: &Ctx) -> Outcome {
    let qemu = cache_dir()
        .and_then(|cache| guest_qemu::prepare(&cache))
        .map_err(|e| format!("preparing the guest's QEMU: {e:#}"))?;
    let dir = scratch("record-qemu");
    let mut p = plan(c, true, shell(&script()));
    p.overlays = vec![qemu.root];
    p.host_files = qemu.libraries;
    boot_ok(p, &dir)?;
    let found = findings(&dir)?;
    no_failed_step(&found, &dir)?;
    if finding(&found, "done", "yes").is_none() {
        return Err("the guest script did not finish".into());
    }
    let run = read_json(&dir, "run.json")?;
    let version = fs::read_to_string(dir.join("qemu-version.txt")).unwrap_or_default();
    let type1 = backend(&dir, &TYPE1, &run)?;
    let iommufd = match finding(&found, "t", "iommufd_skip") {
        Some(skip) => {
            let why = skip["why"].as_str().unwrap_or_default();
            eprintln!("xtask: SKIPPED record_qemu's iommufd backend: {why}");
            format!("iommufd backend SKIPPED: {why}")
        }
        None => backend(&dir, &IOMMUFD, &run)?,
    };
    Ok(format!("\n  {}\n  {type1}\n  {iommufd}", version.trim()))
}

/// A section of QEMU's flat memory map (`info mtree -f`, the system address space).
#[derive(Debug, PartialEq)]
struct Section {
    start: u64,
    size: u64,
    /// `ram` or `rom`.
    kind: String,
    name: String,
}

/// The RAM and ROM sections of the flat view of `AS "memory"` in `info mtree -f`'s text:
/// what QEMU's VFIO memory listener maps (it skips I/O).
fn memory_map(mtree: &str) -> Vec<Section> {
    let view = mtree
        .split("FlatView #")
        .find(|v| v.contains("AS \"memory\""))
        .unwrap_or_default();
    // "  0000000000100000-000000000fffffff (prio 0, ram): pc.ram @0000000000100000"
    view.lines()
        .filter_map(|l| {
            let (range, rest) = l.trim().split_once(" (prio ")?;
            let (start, end) = range.split_once('-')?;
            let (start, end) = (u64::from_str_radix(start, 16).ok()?, u64::from_str_radix(end, 16).ok()?);
            let (attrs, name) = rest.split_once("): ")?;
            let kind = attrs.split(", ").nth(1)?;
            (kind == "ram" || kind == "rom").then(|| Section {
                start,
                size: end - start + 1,
                kind: kind.to_owned(),
                name: name.split(" @").next().unwrap_or(name).to_owned(),
            })
        })
        .collect()
}

/// What QEMU printed on its QMP channel: the memory map, and whether it quit because QMP said
/// so (not killed, not crashed).
fn qmp_replies(text: &str) -> Result<(Vec<Section>, bool), String> {
    let replies: Vec<Value> = text
        .lines()
        .filter(|l| l.starts_with('{'))
        .filter_map(|l| serde_json::from_str(l).ok())
        .collect();
    let mtree = replies
        .iter()
        .find_map(|r| r["return"].as_str().filter(|s| s.contains("FlatView")))
        .ok_or_else(|| format!("QEMU printed no memory map on QMP: {text}"))?;
    let quit = replies
        .iter()
        .any(|r| r["event"] == "SHUTDOWN" && r["data"]["reason"] == "host-qmp-quit");
    Ok((memory_map(mtree), quit))
}

/// Bytes of `[0, end)` that no `(start, size)` range covers.
fn uncovered_below(end: u64, ranges: &[(u64, u64)]) -> u64 {
    let mut sorted = ranges.to_vec();
    sorted.sort_unstable();
    let (mut at, mut gaps) = (0, 0);
    for (start, size) in sorted {
        if start >= end {
            break;
        }
        gaps += start.saturating_sub(at);
        at = at.max(start + size);
    }
    gaps + end.saturating_sub(at)
}

/// Each category's share (percent) of a call's or a phase's categorised time.
fn shares(categories: &Value) -> Vec<(String, f64)> {
    let all: Vec<(String, f64)> = categories
        .as_object()
        .into_iter()
        .flatten()
        .map(|(k, v)| (k.clone(), ns(v)))
        .collect();
    let total: f64 = all.iter().map(|(_, v)| v).sum();
    all.into_iter()
        .filter(|(_, v)| *v > 0.0)
        .map(|(k, v)| (k, 100.0 * v / total.max(1.0)))
        .collect()
}

fn share_of(shares: &[(String, f64)], category: &str) -> f64 {
    shares.iter().find(|(k, _)| k == category).map_or(0.0, |(_, v)| *v)
}

/// "zeroing 96%, pinning 2%" (largest first; those under 0.5% left out).
fn shares_text(shares: &[(String, f64)]) -> String {
    let mut sorted = shares.to_vec();
    sorted.sort_by(|a, b| b.1.total_cmp(&a.1));
    sorted
        .iter()
        .filter(|(_, v)| *v >= 0.5)
        .map(|(k, v)| format!("{k} {v:.0}%"))
        .collect::<Vec<_>>()
        .join(", ")
}

/// The recording of one backend against QEMU's memory map and `run`'s map on the same backing.
fn backend(dir: &Path, b: &Backend, run: &Value) -> Outcome {
    let rec = read_json(dir, &format!("{}.json", b.name))?;
    let qmp = fs::read_to_string(dir.join(format!("{}.out", b.name))).unwrap_or_default();
    let (sections, quit) = qmp_replies(&qmp)?;
    let calls = rec["calls"].as_array().cloned().unwrap_or_default();
    let (unmaps, maps): (Vec<&Value>, Vec<&Value>) = calls
        .iter()
        .partition(|c| c["kind"].as_str().is_some_and(|k| k.contains("UNMAP")));
    let mut problems = Vec::new();
    if !quit || rec["partial"] != false || rec["lost"] != 0 || rec["process"]["exit_code"] != 0 {
        problems.push(format!(
            "QEMU did not quit through QMP with status 0 (quit {quit}, exit {}, partial {}, lost {}); stderr: {}",
            rec["process"]["exit_code"],
            rec["partial"],
            rec["lost"],
            fs::read_to_string(dir.join(format!("{}.err", b.name))).unwrap_or_default()
        ));
    }
    if let Some(c) = maps
        .iter()
        .find(|c| !b.map_kinds.iter().any(|k| c["kind"] == *k) || c["ret"] != 0)
    {
        problems.push(format!("a map call that is not a successful {:?}: {c}", b.map_kinds));
    }
    let mut recorded: Vec<(u64, u64)> = maps
        .iter()
        .map(|c| (c["iova"].as_u64().unwrap_or(u64::MAX), c["size"].as_u64().unwrap_or(0)))
        .collect();
    recorded.sort_unstable();
    let wanted: Vec<(u64, u64)> = sections.iter().map(|s| (s.start, s.size)).collect();
    if recorded != wanted {
        problems.push(format!(
            "mapped (iova, size) {recorded:x?}, QEMU's RAM and ROM sections {sections:x?}"
        ));
    }
    let bytes: u64 = recorded.iter().map(|r| r.1).sum();
    let gaps = uncovered_below(GUEST_RAM, &recorded);
    if bytes < GUEST_RAM || gaps != 0 {
        problems.push(format!(
            "{bytes} bytes mapped, {gaps} bytes of the guest RAM's {GUEST_RAM} not covered"
        ));
    }
    let largest = breakdown(&maps, run, b.run_case);
    let kinds: std::collections::BTreeSet<&str> = maps.iter().filter_map(|c| c["kind"].as_str()).collect();
    let note = format!(
        "{}: {} map calls {kinds:?}, {bytes} bytes ({}), {} unmaps; {}",
        b.name,
        maps.len(),
        sections_text(&sections),
        unmaps.len(),
        match &largest {
            Ok(t) | Err(t) => t,
        }
    );
    problems.extend(largest.err());
    match problems.is_empty() {
        true => Ok(note),
        false => Err(format!("{}: {}", problems.join("; "), note)),
    }
}

/// "ram 255.75 MiB in 2 (pc.ram), rom 512 KiB in 3 (pc.rom, pc.bios)".
fn sections_text(sections: &[Section]) -> String {
    ["ram", "rom"]
        .iter()
        .map(|kind| {
            let of: Vec<&Section> = sections.iter().filter(|s| s.kind == *kind).collect();
            let mut names: Vec<&str> = of.iter().map(|s| s.name.as_str()).collect();
            names.dedup();
            let kib = of.iter().map(|s| s.size).sum::<u64>() >> 10;
            format!("{kind} {kib} KiB in {} sections ({})", of.len(), names.join(", "))
        })
        .collect::<Vec<_>>()
        .join(", ")
}

/// The largest map call's category shares against `run`'s exact map on the same backing: the
/// same top category, and every category within [`SHARE_TOLERANCE_PP`].
fn breakdown(maps: &[&Value], run: &Value, run_case: &str) -> Outcome {
    let largest = maps
        .iter()
        .max_by_key(|c| c["size"].as_u64().unwrap_or(0))
        .ok_or("no map call recorded")?;
    let exact = &phase(case(run, run_case)?, "map")?["exact"];
    let (ours, theirs) = (shares(&largest["categories"]), shares(&exact["categories"]));
    let text = format!(
        "largest call {} MiB at {:#x} in {:.1} ms: {}; run's {run_case} map: {}",
        largest["size"].as_u64().unwrap_or(0) >> 20,
        largest["iova"].as_u64().unwrap_or(0),
        ns(&largest["duration_ns"]) / 1e6,
        shares_text(&ours),
        shares_text(&theirs)
    );
    let top = |s: &[(String, f64)]| s.iter().max_by(|a, b| a.1.total_cmp(&b.1)).map(|(k, _)| k.clone());
    let apart: Vec<String> = ours
        .iter()
        .chain(&theirs)
        .map(|(k, _)| k)
        .filter(|k| (share_of(&ours, k) - share_of(&theirs, k)).abs() > SHARE_TOLERANCE_PP)
        .map(|k| format!("{k} {:.0}% vs {:.0}%", share_of(&ours, k), share_of(&theirs, k)))
        .collect();
    if ours.is_empty() || top(&ours) != top(&theirs) || !apart.is_empty() {
        return Err(format!(
            "the largest call's breakdown is not run's (apart by more than {SHARE_TOLERANCE_PP} points: {apart:?}): {text}"
        ));
    }
    Ok(text)
}

#[cfg(test)]
mod unit {
    use super::*;

    #[test]
    fn memory_map_is_the_system_flat_view_ram_and_rom() {
        let mtree = "FlatView #0\n AS \"i440FX\", root: bus master container\n  No rendered FlatView\n\n\
            FlatView #1\n AS \"memory\", root: system\n Root memory region: system\n\
              0000000000000000-00000000000bffff (prio 0, ram): pc.ram\n\
              00000000000e0000-00000000000fffff (prio 0, rom): pc.bios @0000000000020000\n\
              00000000fec00000-00000000fec00fff (prio 0, i/o): ioapic\n\n\
            FlatView #2\n AS \"cpu-smm-0\", root: memory\n\
              0000000000000000-00000000000bffff (prio 0, ram): other\n";
        let map = memory_map(mtree);
        assert_eq!(map.len(), 2, "{map:?}");
        assert_eq!((map[0].start, map[0].size, map[0].kind.as_str()), (0, 0xc0000, "ram"));
        assert_eq!(
            (map[1].start, map[1].size, map[1].name.as_str()),
            (0xe0000, 0x20000, "pc.bios")
        );
    }

    #[test]
    fn coverage_counts_holes_and_overlaps_once() {
        assert_eq!(uncovered_below(100, &[(0, 50), (50, 60)]), 0);
        assert_eq!(uncovered_below(100, &[(10, 20), (0, 5), (15, 5)]), 5 + 70);
        assert_eq!(uncovered_below(100, &[]), 100);
    }

    #[test]
    fn shares_are_percent_of_categorised_time() {
        let s = shares(&serde_json::json!({"zeroing": 897, "pinning": 100, "other": 3, "faulting": 0}));
        assert_eq!(share_of(&s, "zeroing"), 89.7);
        assert_eq!(share_of(&s, "faulting"), 0.0);
        assert_eq!(shares_text(&s), "zeroing 90%, pinning 10%");
    }
}
