//! `dmaprof explain`: what a report's numbers mean, in words. One table of rules
//! ([`RULES`]): each looks at one case of a report (and the other cases of the same run) and,
//! when its condition holds, says what costs the time, why the kernel pays it, the evidence
//! from this run, and what would remove it. Findings are ranked by the time at stake. Checks
//! ([`checks`]) say where a number in the report cannot be trusted. Nothing here guesses
//! beyond the report: a rule without the numbers it needs stays silent.
use std::fmt::Write as _;

use serde::Serialize;

use crate::{
    category::{CATEGORIES, Category},
    facts::FeatureId,
    matrix::{DmaMode, Prefault},
    recording::{KindSummary, RecordReport},
    report::{CaseReport, PhaseReport, Report, Shape},
    workload::Phase,
};

/// Why unmap time goes to IOVA lookups (a run's and a recording's finding).
const WHY_IOVA_WALK: &str = "the unmap finds the physical pages to unpin by walking the IOMMU page table one 4 KiB \
                             IOVA at a time (iommu_iova_to_phys), whatever the page size";
/// What would remove it.
const FIX_IOVA_WALK: &str = "no backing avoids it; it takes a kernel change that reads the mapped size back from \
                             the page table (or keeps the pinned pages) instead of walking every 4 KiB";

/// How many findings of one rule the text tells in full (the rest are listed by case).
const FULL_PER_RULE: usize = 3;

/// Bytes of a base page: per-page costs are per 4 KiB of the buffer.
const PAGE: u64 = 4096;

/// One finding about one case.
#[derive(Clone, Debug, Serialize, PartialEq)]
pub struct Finding {
    /// The rule that fired.
    pub rule: &'static str,
    /// The case.
    pub case: String,
    /// The phase it is about.
    pub phase: Phase,
    /// Time at stake in that phase (untraced scale), ns.
    pub ns: u64,
    /// What costs the time.
    pub what: String,
    /// Why the kernel pays it.
    pub why: String,
    /// The numbers of this run that show it.
    pub evidence: String,
    /// What would remove it.
    pub fix: String,
}

/// A finding's text, before it is tied to its case.
struct Fired {
    phase: Phase,
    ns: u64,
    what: String,
    why: String,
    evidence: String,
    fix: String,
}

impl Fired {
    /// The finding, tied to the rule that fired and what it fired on.
    fn finding(self, rule: &'static str, case: String) -> Finding {
        Finding {
            rule,
            case,
            phase: self.phase,
            ns: self.ns,
            what: self.what,
            why: self.why,
            evidence: self.evidence,
            fix: self.fix,
        }
    }
}

/// One rule: an id and a condition over a case of a report that yields a finding.
pub struct Rule {
    /// Stable name (in `explain --json`).
    pub id: &'static str,
    fires: fn(&Report, &CaseReport) -> Option<Fired>,
}

/// Every rule. Order does not matter: findings are ranked by the time at stake.
pub const RULES: &[Rule] = &[
    Rule {
        id: "demand_faults_in_map",
        fires: demand_faults_in_map,
    },
    Rule {
        id: "small_iommu_pages",
        fires: small_iommu_pages,
    },
    Rule {
        id: "iotlb_sync_per_map",
        fires: iotlb_sync_per_map,
    },
    Rule {
        id: "memfd_pin_allocates",
        fires: memfd_pin_allocates,
    },
    Rule {
        id: "unmap_iova_walk",
        fires: unmap_iova_walk,
    },
    Rule {
        id: "slower_than_other_mode",
        fires: slower_than_other_mode,
    },
    Rule {
        id: "super_linear_growth",
        fires: super_linear_growth,
    },
    Rule {
        id: "scattered_pages",
        fires: scattered_pages,
    },
    Rule {
        id: "driver_bookkeeping",
        fires: driver_bookkeeping,
    },
];

/// The map of a buffer whose pages came physically scattered in some iterations and far less
/// so in others, where the untraced line says each run costs time: what the scatter costs
/// against this run's own best layout.
fn scattered_pages(_: &Report, case: &CaseReport) -> Option<Fired> {
    let map = phase(case, Phase::Map)?;
    let (runs, line) = (map.physical_runs.as_ref()?, map.layout?);
    // The mean, not the median: iterations alternate between layouts, and half of them may be
    // the scattered ones.
    let mean = runs.runs.iter().sum::<u64>() / runs.runs.len().max(1) as u64;
    let at_stake = line.ns_per_run * mean.saturating_sub(runs.min) as f64;
    let worth = at_stake >= 1e6 && at_stake >= 0.05 * map.wall_ns.median as f64;
    if runs.max < runs.min.saturating_mul(2) || line.ns_per_run <= 0.0 || !worth {
        return None;
    }
    let pages = (case.size_bytes / case.page_size.max(PAGE)).max(1);
    Some(Fired {
        phase: Phase::Map,
        ns: at_stake as u64,
        what: format!(
            "the buffer's pages came in {}-{} physically contiguous runs from iteration to iteration, and the map \
             pays for each run",
            runs.min, runs.max
        ),
        why: "VFIO type1 pins, maps and later unpins one physically contiguous run per call \
              (vfio_pin_pages_remote, iommu_map), so a scattered buffer costs a call and an IOMMU mapping per piece; \
              pages one munmap frees come back to the next faults in another order"
            .into(),
        evidence: format!(
            "untraced map {} ms + {:.2} us per run over the untraced iterations (runs {:?} of {pages} pages); \
             at the mean {} runs that is {} more than at the fewest",
            ms(line.intercept_ns.max(0.0) as u64),
            line.ns_per_run / 1e3,
            runs.runs,
            mean,
            ms(at_stake as u64)
        ),
        fix: "back the buffer with hugepages (hugetlb, or THP with MADV_HUGEPAGE: each folio is contiguous) or \
              allocate it from freshly compacted memory (echo 1 > /proc/sys/vm/compact_memory before populating)"
            .into(),
    })
}

/// A mode is called out when its map takes this many times the fastest mode's on the same
/// buffer (and the two runs' spreads do not overlap).
const MODE_GAP: f64 = 1.5;

/// The findings and checks of one report.
#[derive(Clone, Debug, Default, Serialize)]
pub struct Explanation {
    /// Ranked by time at stake, largest first.
    pub findings: Vec<Finding>,
    /// Where a number cannot be trusted.
    pub checks: Vec<String>,
}

/// The map phase of the case of this run with the same backing, prefault and size in the
/// fastest other IOMMU mode: the case and its phase.
fn fastest_other_mode<'a>(report: &'a Report, case: &CaseReport) -> Option<(&'a CaseReport, &'a PhaseReport)> {
    report
        .cases
        .iter()
        .filter(|c| {
            c.iommu_mode.is_some()
                && c.iommu_mode != case.iommu_mode
                && c.backing == case.backing
                && c.prefault == case.prefault
                && c.size_bytes == case.size_bytes
        })
        .filter_map(|c| Some((c, phase(c, Phase::Map)?)))
        .min_by_key(|(_, p)| p.wall_ns.median)
}

/// The category whose time differs most between two phases (untraced scale), with both times.
fn biggest_difference(slow: &PhaseReport, fast: &PhaseReport) -> Option<(Category, u64, u64)> {
    CATEGORIES
        .iter()
        .map(|c| (*c, ns_of(slow, &[*c]), ns_of(fast, &[*c])))
        .max_by_key(|(_, a, b)| a.saturating_sub(*b))
        .filter(|(_, a, b)| a > b)
}

/// Cross-case: the same buffer maps much faster in another IOMMU mode of this run.
fn slower_than_other_mode(report: &Report, case: &CaseReport) -> Option<Fired> {
    let map = phase(case, Phase::Map)?;
    let (fast_case, fast) = fastest_other_mode(report, case)?;
    let ratio = map.wall_ns.median as f64 / fast.wall_ns.median.max(1) as f64;
    // Both runs' spreads apart: the slowest fast iteration is below the fastest slow one.
    if ratio < MODE_GAP || fast.wall_ns.max >= map.wall_ns.min {
        return None;
    }
    let (cat, here, there) = biggest_difference(map, fast)?;
    let fast_mode = fast_case.iommu_mode?.name();
    Some(Fired {
        phase: Phase::Map,
        ns: map.wall_ns.median - fast.wall_ns.median,
        what: format!("this map takes {ratio:.1}x as long as {fast_mode} on the same buffer"),
        why: format!(
            "most of the difference is {}: {} here against {} in {}",
            cat.name(),
            ms(here),
            ms(there),
            fast_case.name
        ),
        evidence: format!(
            "map {} [{}-{}] against {} [{}-{}] over the untraced iterations",
            ms(map.wall_ns.median),
            ms(map.wall_ns.min),
            ms(map.wall_ns.max),
            ms(fast.wall_ns.median),
            ms(fast.wall_ns.min),
            ms(fast.wall_ns.max)
        ),
        fix: format!("map this kind of buffer through {fast_mode}"),
    })
}

/// How fast a fit grows between its two smallest sizes and between its two largest, ns per GiB.
fn growth(points: &[(u64, u64)]) -> Option<(f64, f64)> {
    let per_gib =
        |a: (u64, u64), b: (u64, u64)| (b.1 as f64 - a.1 as f64) / ((b.0 - a.0).max(1) as f64 / (1u64 << 30) as f64);
    let n = points.len();
    (n >= 3).then(|| (per_gib(points[0], points[1]), per_gib(points[n - 2], points[n - 1])))
}

/// A phase of a size sweep that grows faster than the size (told once, on the largest size).
fn super_linear_growth(report: &Report, case: &CaseReport) -> Option<Fired> {
    let sweep = report
        .sweeps
        .iter()
        .find(|s| s.case == crate::sweep::base_name(&case.name))?;
    let sp = sweep.phases.iter().find(|p| p.total.shape == Shape::SuperLinear)?;
    let &(largest, last_ns) = sp.total.points.last()?;
    if case.size_bytes != largest {
        return None;
    }
    let (early, late) = growth(&sp.total.points)?;
    let cats: Vec<&str> = sp
        .categories
        .iter()
        .filter(|(_, f)| f.shape == Shape::SuperLinear)
        .map(|(c, _)| c.name())
        .collect();
    // What the largest size costs beyond the rate of the smallest sizes.
    let (first_bytes, first_ns) = sp.total.points[0];
    let linear = first_ns as f64 + early * (largest - first_bytes) as f64 / (1u64 << 30) as f64;
    Some(Fired {
        phase: sp.phase,
        ns: (last_ns as f64 - linear).max(0.0) as u64,
        what: format!(
            "{} grows faster than the buffer: {:.1} ms per GiB between the two smallest sizes, {:.1} ms per GiB \
             between the two largest",
            sp.phase,
            early / 1e6,
            late / 1e6
        ),
        why: match cats.as_slice() {
            [] => "each GiB costs more than the one before; no single category carries the growth".into(),
            c => format!("each GiB costs more than the one before, in {}", c.join(", ")),
        },
        evidence: format!("the sweep {}: {}", sweep.case, crate::sweep::describe(&sp.total)),
        fix: "map in chunks no larger than the sizes where the cost still grows in proportion, and compare the \
              smallest and largest sizes' flamegraphs (`dmaprof diff`) to find what scales"
            .into(),
    })
}

/// Runs every rule on every case of `report`.
pub fn explain(report: &Report) -> Explanation {
    let mut findings: Vec<Finding> = report
        .cases
        .iter()
        .flat_map(|case| {
            RULES
                .iter()
                .filter_map(move |rule| (rule.fires)(report, case).map(|f| f.finding(rule.id, case.name.clone())))
        })
        .collect();
    findings.sort_by_key(|f| std::cmp::Reverse(f.ns));
    Explanation {
        findings,
        checks: checks(report),
    }
}

/// The phase of `case` named `phase`.
fn phase(case: &CaseReport, phase: Phase) -> Option<&PhaseReport> {
    case.phases.iter().find(|p| p.name == phase)
}

/// The share of `p` that `cats` take: exact (less probe cost) where measured, else sampled.
fn share(p: &PhaseReport, cats: &[Category]) -> f64 {
    if p.exact.available && p.exact.wall_ns > 0 {
        return cats.iter().map(|c| p.exact.share(*c)).sum();
    }
    cats.iter().filter_map(|c| p.sampled.categories.get(c)).sum()
}

/// What `cats` take of `p`, scaled to its headline (untraced) wall time.
fn ns_of(p: &PhaseReport, cats: &[Category]) -> u64 {
    (share(p, cats) * p.wall_ns.median as f64) as u64
}

/// Calls of an exact row in `p`, and their summed amount.
fn row(p: &PhaseReport, function: &str) -> Option<(u64, u64)> {
    p.exact
        .rows
        .iter()
        .find(|r| r.function == function)
        .map(|r| (r.calls, r.amount))
}

/// The other case of this run with the same mode and backing and prefault `prefault`.
fn sibling<'a>(report: &'a Report, case: &CaseReport, prefault: Prefault) -> Option<&'a CaseReport> {
    report.cases.iter().find(|c| {
        c.iommu_mode == case.iommu_mode
            && c.backing == case.backing
            && c.prefault == prefault
            && c.size_bytes == case.size_bytes
    })
}

fn ms(ns: u64) -> String {
    format!("{:.1} ms", ns as f64 / 1e6)
}

fn per_page(case: &CaseReport, ns: u64) -> f64 {
    ns as f64 / (case.size_bytes / PAGE).max(1) as f64
}

/// How `p`'s zeroing and faulting compare with this machine's floors (`report.floors`): the
/// zeroing rate against the clear bandwidth, the per-page fault cost against one 4 KiB fault
/// taken from user space. None without floors or without zeroing.
fn against_floors(report: &Report, case: &CaseReport, p: &PhaseReport) -> Option<String> {
    let f = report.floors.as_ref()?;
    let zeroing = ns_of(p, &[Category::Zeroing]);
    if zeroing == 0 {
        return None;
    }
    let rate = case.size_bytes as f64 / (1u64 << 30) as f64 / (zeroing as f64 / 1e9);
    let mut out = format!(
        "zeroing runs at {rate:.2} GiB/s, this machine clears at {:.2} GiB/s: {:.0}% of the limit",
        f.clear_gib_per_s,
        rate / f.clear_gib_per_s * 100.0
    );
    if let Some(fault) = f.fault_4k_ns {
        let both = per_page(case, ns_of(p, &[Category::Faulting, Category::Zeroing]));
        let _ = write!(
            out,
            "; faulting + zeroing {both:.0} ns per 4 KiB page against {fault} ns for one 4 KiB fault from user space"
        );
    }
    Some(out)
}

fn demand_faults_in_map(report: &Report, case: &CaseReport) -> Option<Fired> {
    let map = phase(case, Phase::Map)?;
    let cats = [Category::Faulting, Category::Zeroing];
    if case.prefault != Prefault::None || share(map, &cats) < 0.3 {
        return None;
    }
    let ns = ns_of(map, &cats);
    let mut evidence = format!("{} of a {} map", ms(ns), ms(map.wall_ns.median));
    if let Some((calls, _)) = row(map, "handle_mm_fault") {
        let _ = write!(evidence, "; {calls} handle_mm_fault calls");
    }
    if let Some(floors) = against_floors(report, case, map) {
        let _ = write!(evidence, "; {floors}");
    }
    if let Some(populated) = sibling(report, case, Prefault::Populate) {
        let (mmap, pmap) = (phase(populated, Phase::Mmap)?, phase(populated, Phase::Map)?);
        let _ = write!(
            evidence,
            "; populated first ({}), the same pages cost {} in mmap and the map takes {}",
            populated.name,
            ms(ns_of(mmap, &cats)),
            ms(pmap.wall_ns.median)
        );
    }
    Some(Fired {
        phase: Phase::Map,
        ns,
        what: format!(
            "faulting and zeroing are {:.0}% of the map ({:.0} ns per 4 KiB page)",
            share(map, &cats) * 100.0,
            per_page(case, ns)
        ),
        why: "the buffer was not populated, so pinning faults in, allocates and zeroes every page inside the \
              map ioctl"
            .into(),
        evidence,
        fix: if case.backing.hugetlb_kb().is_some() {
            "populate before mapping (MAP_POPULATE or MADV_POPULATE_WRITE) to take the cost out of the DMA map".into()
        } else {
            "populate before mapping (MAP_POPULATE or MADV_POPULATE_WRITE) to take the cost out of the DMA map; \
             hugetlb backing makes it fewer, larger faults"
                .into()
        },
    })
}

/// What the small-IOMMU-pages rules say: the bytes an iommu_map call covers on average, which
/// is a page only where every run is one page (a 4 KiB buffer's runs are often a little longer).
fn programmed_at(per_call: u64) -> String {
    format!("the IOMMU is programmed {per_call} bytes at a time")
}

fn small_iommu_pages(report: &Report, case: &CaseReport) -> Option<Fired> {
    let map = phase(case, Phase::Map)?;
    let (calls, bytes) = row(map, "iommu_map_nosync").or_else(|| row(map, "iommu_map"))?;
    let per_call = bytes / calls.max(1);
    if calls < 1024 || per_call > 2 * PAGE {
        return None;
    }
    let cats = [Category::IommuMap, Category::IommuFlush];
    let ns = ns_of(map, &cats);
    let mut evidence = format!("{calls} iommu_map calls of {per_call} bytes, {} of the map", ms(ns));
    let others: Vec<String> = report
        .cases
        .iter()
        .filter(|c| c.backing == case.backing && c.prefault == case.prefault && c.iommu_mode != case.iommu_mode)
        .filter_map(|c| {
            let (n, _) =
                row(phase(c, Phase::Map)?, "iommu_map_nosync").or_else(|| row(phase(c, Phase::Map)?, "iommu_map"))?;
            Some(format!("{} {n}", c.iommu_mode?.name()))
        })
        .collect();
    if !others.is_empty() {
        let _ = write!(evidence, "; the same buffer in other modes: {}", others.join(", "));
    }
    let compat = case.iommu_mode == Some(DmaMode::IommufdCompatType1);
    Some(Fired {
        phase: Phase::Map,
        ns,
        what: programmed_at(per_call),
        why: if compat {
            "iommufd's type1 compatibility (VFIO_TYPE1_IOMMU) disables large IOMMU pages, so every 4 KiB page \
             is its own iommu_map call"
                .into()
        } else {
            "the pinned pages are not physically contiguous, so each gets its own IOMMU mapping".into()
        },
        evidence,
        fix: if compat {
            "use VFIO_TYPE1v2_IOMMU (iommufd_compat_type1v2) or native iommufd, which map contiguous runs in one \
             call"
                .into()
        } else {
            "back the buffer with hugetlb (or THP) pages so that pinned runs are contiguous".into()
        },
    })
}

fn iotlb_sync_per_map(report: &Report, case: &CaseReport) -> Option<Fired> {
    let map = phase(case, Phase::Map)?;
    let cats = [Category::IommuFlush];
    if share(map, &cats) < 0.25 {
        return None;
    }
    let ns = ns_of(map, &cats);
    let syncs = row(map, "intel_iommu_iotlb_sync_map").or_else(|| row(map, "iommu_sync_map"));
    let mut evidence = format!("{} of the map", ms(ns));
    if let Some((n, _)) = syncs {
        let _ = write!(evidence, "; {n} IOTLB syncs after map calls");
    }
    let batched = report
        .kernel
        .features
        .iter()
        .find(|f| f.id == FeatureId::IommuMapBatchedSync);
    let fix = match batched.and_then(|f| f.present) {
        Some(true) => "fewer, larger iommu_map calls (see the page size); this kernel already batches the sync per \
                       map request"
            .to_owned(),
        _ => format!(
            "a kernel with the batched sync after map ({}), and fewer, larger iommu_map calls",
            batched.map_or("iommu: generalize the batched sync after map interface", |f| f
                .since
                .as_str())
        ),
    };
    Some(Fired {
        phase: Phase::Map,
        ns,
        what: format!("IOTLB flushes are {:.0}% of the map", share(map, &cats) * 100.0),
        why: "each iommu_map call is followed by an IOTLB sync; where the IOMMU caches non-present entries (a \
              vIOMMU in caching mode) every sync is an invalidation the hypervisor must process"
            .into(),
        evidence,
        fix,
    })
}

fn memfd_pin_allocates(report: &Report, case: &CaseReport) -> Option<Fired> {
    let map = phase(case, Phase::Map)?;
    let cats = [Category::Faulting, Category::Zeroing];
    let (calls, _) = row(map, "memfd_pin_folios")?;
    let (allocs, _) = row(map, "memfd_alloc_folio").unwrap_or((0, 0));
    if case.prefault != Prefault::None || share(map, &cats) < 0.3 {
        return None;
    }
    let ns = ns_of(map, &cats);
    Some(Fired {
        phase: Phase::Map,
        ns,
        what: format!(
            "allocating and zeroing the memfd's folios is {:.0}% of the map",
            share(map, &cats) * 100.0
        ),
        why: "the map pins the file by offset (memfd_pin_folios), which allocates and zeroes every folio the \
              file does not have yet"
            .into(),
        evidence: match against_floors(report, case, map) {
            Some(floors) => format!(
                "{} in {calls} memfd_pin_folios calls that allocated {allocs} folios; {floors}",
                ms(ns)
            ),
            None => format!(
                "{} in {calls} memfd_pin_folios calls that allocated {allocs} folios",
                ms(ns)
            ),
        },
        fix: "fill the memfd before mapping it (fallocate, or mmap with MAP_POPULATE)".into(),
    })
}

fn unmap_iova_walk(_: &Report, case: &CaseReport) -> Option<Fired> {
    let unmap = phase(case, Phase::Unmap)?;
    let cats = [Category::IommuLookup];
    if share(unmap, &cats) < 0.4 || unmap.wall_ns.median < 1_000_000 {
        return None;
    }
    let ns = ns_of(unmap, &cats);
    Some(Fired {
        phase: Phase::Unmap,
        ns,
        what: format!(
            "looking up IOVAs is {:.0}% of the unmap ({:.0} ns per 4 KiB page)",
            share(unmap, &cats) * 100.0,
            per_page(case, ns)
        ),
        why: WHY_IOVA_WALK.into(),
        evidence: format!("{} of a {} unmap", ms(ns), ms(unmap.wall_ns.median)),
        fix: FIX_IOVA_WALK.into(),
    })
}

/// The share of a DMA phase that VFIO type1's or iommufd's own code takes before it is told
/// as a finding: its set-up and loops, not the pinning or programming it drives.
const BOOKKEEPING_SHARE: f64 = 0.15;

/// The map or unmap whose `bookkeeping` share is largest, where it is [`BOOKKEEPING_SHARE`] or
/// more of a phase of 1 ms or more: the driver's own cost per request and per chunk.
fn driver_bookkeeping(_: &Report, case: &CaseReport) -> Option<Fired> {
    let cats = [Category::Bookkeeping];
    let (p, own_share) = [Phase::Map, Phase::Unmap]
        .into_iter()
        .filter_map(|ph| phase(case, ph))
        .filter(|p| p.wall_ns.median >= 1_000_000)
        .map(|p| (p, share(p, &cats)))
        .filter(|(_, s)| *s >= BOOKKEEPING_SHARE)
        .max_by(|a, b| a.1.total_cmp(&b.1))?;
    let ns = ns_of(p, &cats);
    let mut own: Vec<(&str, u64)> = p
        .exact
        .rows
        .iter()
        .filter(|r| r.category == Category::Bookkeeping)
        .map(|r| (r.function.as_str(), r.exclusive_ns.saturating_sub(r.overhead_ns)))
        .filter(|(_, ns)| *ns > 0)
        .collect();
    own.sort_by_key(|(_, ns)| std::cmp::Reverse(*ns));
    let mut evidence = format!("{} of a {} {}", ms(ns), ms(p.wall_ns.median), p.name.name());
    if !own.is_empty() {
        let rows: Vec<String> = own
            .iter()
            .take(3)
            .map(|(f, ns)| format!("{f} {:.3} ms", *ns as f64 / 1e6))
            .collect();
        let _ = write!(evidence, "; own time of {}", rows.join(", "));
    }
    Some(Fired {
        phase: p.name,
        ns,
        what: format!(
            "the driver's own code is {:.0}% of the {}",
            own_share * 100.0,
            p.name.name()
        ),
        why: "VFIO type1 or iommufd spends it around the pin, map and accounting calls: the request's set-up (the \
              DMA or area object, its tree and xarray walks) and the loop over chunks and domains, a cost per \
              request and per chunk rather than per byte"
            .into(),
        evidence,
        fix: "map in fewer, larger requests; with many chunks, physically contiguous backing (hugetlb) shortens \
              the loop; on a small buffer this is the request's fixed cost"
            .into(),
    })
}

/// Where the report's numbers cannot be fully trusted: unattributed time above 2% of a phase
/// of 1 ms or more, lost events, a sampled pass that took under half its samples, an exact
/// iteration slower than the untraced one by more than the probe cost taken out of it, exact
/// and sampled apart by more than 10 points where both have enough data, a machine whose pace
/// moved 30% or more over a case, probe rows that did not attach.
pub fn checks(report: &Report) -> Vec<String> {
    let mut out = Vec::new();
    for case in &report.cases {
        for p in &case.phases {
            phase_checks(case, p, report.config.freq_hz, &mut out);
        }
    }
    out.extend(report.cases.iter().filter_map(|c| demand_against_populate(report, c)));
    out.extend(report.cases.iter().filter_map(unsteady_pace));
    out.extend(unprobed_categories(report));
    let missing = report.probes.iter().filter(|p| !p.attached).count();
    if missing > 0 {
        out.push(format!(
            "{missing} probes did not attach: categories they would cover can read low (see `probes`)"
        ));
    }
    out
}

/// The checks of one phase, appended to `out`.
fn phase_checks(case: &CaseReport, p: &PhaseReport, freq_hz: u64, out: &mut Vec<String>) {
    let e = &p.exact;
    let wall = e.share_base();
    // In touch, what samples split leaves unattributed is the loop's own user time.
    let user_only = !p.name.is_syscall() && e.split_ns > 0;
    if e.available && !user_only && wall >= 1_000_000 && e.unattributed_ns.unsigned_abs() * 50 > wall {
        out.push(format!(
            "{} {}: {:.1}% of the exact iteration is unattributed",
            case.name,
            p.name.name(),
            e.unattributed_ns as f64 / wall as f64 * 100.0
        ));
    }
    if p.sampled.lost + e.lost_events > 0 {
        out.push(format!(
            "{} {}: {} events lost; its numbers cover only what was kept",
            case.name,
            p.name.name(),
            p.sampled.lost + e.lost_events
        ));
    }
    if let Some(expected) = crate::report::samples_short(p, freq_hz) {
        out.push(format!(
            "{} {}: the sampled pass took {} of the ~{expected} samples its time on the CPU gives at {} Hz{}",
            case.name,
            p.name.name(),
            p.sampled.taken(),
            freq_hz,
            why_samples_short(p, freq_hz)
        ));
    }
    if let Some(off) = crate::report::off_cpu_heavy(p) {
        out.push(format!(
            "{} {}: the exact iteration was off the CPU for {}: that time is in the row the thread \
                     left from, not work that row did; run it again or look for what else the machine was doing",
            case.name,
            p.name.name(),
            off.describe(p.exact.wall_ns)
        ));
    }
    if let Some(excess) = crate::report::unexplained_cost(p) {
        out.push(format!(
            "{} {}: the exact iteration ran {} over the untraced one at its layout, and {} of that is \
                     more than the probe cost taken out ({} for {} hits, {} by the calibration): it stays in \
                     the rows it landed in, so read the exact shares beside the sampled ones, or run more exact \
                     iterations (--traced-iterations)",
            case.name,
            p.name.name(),
            ms(e.probe_overhead_measured_ns.unwrap_or(0)),
            ms(excess),
            ms(e.probe_overhead_ns.unwrap_or(0)),
            e.probe_hits,
            ms(e.probe_overhead_calibrated_ns.unwrap_or(0))
        ));
    }
    out.extend(scout_outgrown(case, p));
    out.extend(off_headline(case, p));
    if let Some((cat, gap)) = disagreement(p) {
        let why = match crate::report::layouts_apart(p) {
            Some(l) => layouts_told(&l),
            None => slowdowns_told(p).unwrap_or_default(),
        };
        out.push(format!(
            "{} {}: exact and sampled differ by {gap:.0} points on {cat}{why}",
            case.name,
            p.name.name()
        ));
    }
}

/// A map or unmap whose breakdown comes from a buffer laid out unlike every untraced
/// iteration's (see [`crate::report::breakdown_off_headline`]).
fn off_headline(case: &CaseReport, p: &PhaseReport) -> Option<String> {
    let o = crate::report::breakdown_off_headline(p, case.size_bytes / PAGE)?;
    let (min, median, max) = o.untraced_runs;
    let calls = if p.name == Phase::Map {
        "a pin and a map"
    } else {
        "an unmap and an unpin"
    };
    Some(format!(
        "{} {}: the breakdown is of a buffer in {} physically contiguous runs ({} less its probe cost), \
         the headline of buffers in {min}-{max} (median {median}, {}): the {} makes {calls} call per run, \
         so its shares describe other work than the headline times",
        case.name,
        p.name.name(),
        o.exact_runs,
        ms(o.exact_ns),
        ms(o.headline_ns),
        p.name.name()
    ))
}

/// Share of a syscall phase the exact iteration's probe hits may cost by the calibration
/// before it is told: the scout keeps the hits to `--demote-above` (3%) of the phase, so a
/// tenth means the rows were chosen on a buffer that made fewer calls.
const OUTGROWN_SHARE: f64 = 0.10;

/// A syscall phase whose exact iteration's probe hits cost, by the calibration, a tenth of it
/// or more: a 4 KiB buffer's pin and map calls follow its physical runs, which change from
/// iteration to iteration (an iommufd memfd map's scout made 1819 IOMMU map calls, its exact
/// iteration 27852, at 55738 probe hits), so the rows the scout kept can cost the exact
/// iteration far more than the scout predicted.
fn scout_outgrown(case: &CaseReport, p: &PhaseReport) -> Option<String> {
    let e = &p.exact;
    let cost = e.probe_overhead_calibrated_ns?;
    if !e.available || !p.name.is_syscall() || !case.demoted.iter().any(|d| d.phase == p.name) {
        return None;
    }
    let share = cost as f64 / e.wall_ns.max(1) as f64;
    if share < OUTGROWN_SHARE {
        return None;
    }
    let layouts = match (e.physical_runs, case.scout_physical_runs) {
        (Some(exact), Some(scout)) => format!(
            ": its buffer came in {exact} physically contiguous runs, the scout's in {scout}, whose calls chose the rows to demote"
        ),
        _ => String::new(),
    };
    Some(format!(
        "{} {}: the exact iteration's {} probe hits cost ~{} by the calibration, {:.0}% of it{layouts}; \
         the cost taken out of its rows is an estimate, so read its shares beside the sampled ones, or run it \
         again with a lower --demote-above",
        case.name,
        p.name.name(),
        e.probe_hits,
        ms(cost),
        share * 100.0
    ))
}

/// Categories the exact pass reads as 0 in a phase where samples put 5% or more, while rows of
/// that category did not attach: the 0 is a missing probe, not a missing cost.
fn unprobed_categories(report: &Report) -> Vec<String> {
    let mut out = Vec::new();
    for cat in CATEGORIES {
        let unattached: Vec<&str> = report
            .probes
            .iter()
            .filter(|p| !p.attached && crate::category::category_of(&p.function) == Some(*cat))
            .map(|p| p.function.as_str())
            .collect();
        if unattached.is_empty() {
            continue;
        }
        for case in &report.cases {
            for p in case.phases.iter().filter(|p| p.exact.available) {
                let sampled = p.sampled.categories.get(cat).copied().unwrap_or(0.0);
                if p.exact.categories.get(cat).copied().unwrap_or(0) == 0 && sampled >= 0.05 {
                    out.push(format!(
                        "{} {}: exact {} reads 0 while samples put {:.0}% there; not attached: {}",
                        case.name,
                        p.name.name(),
                        cat.name(),
                        sampled * 100.0,
                        unattached.join(", ")
                    ));
                }
            }
        }
    }
    out
}

/// A case whose untraced iterations ran on a machine of changing speed: part of their spread
/// is the machine's.
fn unsteady_pace(case: &CaseReport) -> Option<String> {
    let pace = case.pace_ns.as_ref()?;
    crate::report::unsteady_pace(pace).map(|moved| {
        format!(
            "{}: the machine's pace moved {moved:.2}x over the untraced iterations (a fixed user-space clear \
             took {} to {}): part of the times' spread is the machine's, not the kernel's; `diff` scales by \
             the pace, and an idle machine (no other guests, a fixed CPU clock) narrows the spread",
            case.name,
            ms(pace.min),
            ms(pace.max)
        )
    })
}

/// Demand faulting may differ from populating by this fraction before the two are flagged.
const DEMAND_POPULATE_GAP: f64 = 0.15;

/// The same pages faulted in on demand inside the map, and populated in mmap by the populate
/// sibling, should cost about the same: when they differ by more than 15%, one of the two
/// breakdowns (or an assumption behind comparing them) is off.
fn demand_against_populate(report: &Report, case: &CaseReport) -> Option<String> {
    let cats = [Category::Faulting, Category::Zeroing];
    if case.prefault != Prefault::None || case.iommu_mode.is_none() {
        return None;
    }
    let populated = sibling(report, case, Prefault::Populate)?;
    let (demand, upfront) = (
        ns_of(phase(case, Phase::Map)?, &cats),
        ns_of(phase(populated, Phase::Mmap)?, &cats),
    );
    let gap = demand.abs_diff(upfront) as f64 / demand.max(upfront).max(1) as f64;
    (demand.max(upfront) >= 1_000_000 && gap > DEMAND_POPULATE_GAP).then(|| {
        format!(
            "{} map: faulting + zeroing on demand take {}, the same pages populated in {}'s mmap {} ({:.0}% apart): \
             compare the two with care",
            case.name,
            ms(demand),
            populated.name,
            ms(upfront),
            gap * 100.0
        )
    })
}

/// Why a phase took fewer samples than its time gives: each sample cost about a sampling
/// period (the timer then skips periods, and the samples stay evenly spread), or the
/// sampler missed stretches.
fn why_samples_short(p: &PhaseReport, freq_hz: u64) -> String {
    let period_us = crate::report::sampling_period_ns(freq_hz) / 1000;
    match crate::report::sampler_skips(p, freq_hz) {
        Some(ns) => format!(
            ": each sample cost the phase about {} us (the sampled pass's time over the untraced \
             one, per sample; {} us of it in dmaprof's program) against a {period_us} us period, so the \
             timer skipped periods; the samples are fewer but still spread evenly",
            ns / 1000,
            p.sampled.per_sample_ns().unwrap_or(0) / 1000
        ),
        None => ": the sampler missed stretches of it, and its shares hold only if those are spread evenly".to_owned(),
    }
}

/// Why exact and sampled may differ when their iterations' buffers were laid out apart.
fn layouts_told(l: &crate::report::LayoutsApart) -> String {
    let times = match l.by {
        crate::report::ApartBy::Line => "where the untraced line takes",
        crate::report::ApartBy::Passes => "and the two iterations took (the exact one less its probe cost)",
    };
    format!(
        ": their iterations' buffers came in {} and {} physically contiguous runs, {times} {} and {}: \
         the two passes timed different work (a pin and a map call per run), not the same work told \
         two ways, and each pass's shares hold for its own iteration",
        l.exact_runs,
        l.sampled_runs,
        ms(l.exact_ns),
        ms(l.sampled_ns)
    )
}

/// Where the two passes timed buffers laid out alike but one of them ran 1.2x or more longer
/// than the other against the untraced median: which pass's shares describe the untraced run.
/// Under emulation the sampler's interrupts can slow some paths more than others (a compat
/// type1 2 MiB hugetlb map ran 1.76x its untraced time sampled, at 4999 Hz, the exact pass
/// 0.95x, and the samples put 117 ms more in the IOTLB sync than the exact rows did).
fn slowdowns_told(p: &PhaseReport) -> Option<String> {
    let untraced = (p.wall_pass == crate::probes::Pass::Untraced).then_some(p.wall_ns.median)?;
    let sampled = p.passes.get(&crate::probes::Pass::Sampled)?.wall_ns.median;
    let x = |ns: u64| ns as f64 / untraced.max(1) as f64;
    let (exact_x, sampled_x) = (x(p.exact.wall_less_cost()), x(sampled));
    if exact_x.max(sampled_x) < 1.2 * exact_x.min(sampled_x) {
        return None;
    }
    let (slower, nearer) = if sampled_x > exact_x {
        ("sampled", "exact")
    } else {
        ("exact", "sampled")
    };
    Some(format!(
        ": on buffers laid out alike the exact iteration (less its probe cost) ran x{exact_x:.2} the \
         untraced median and the sampled one x{sampled_x:.2}; the {slower} pass's shares also hold \
         where its own slowdown went, so the {nearer} shares are the ones that describe the untraced run"
    ))
}

/// The category exact and sampled disagree on most, where both are there (1000 samples or
/// more, a phase of 1 ms or more) and they differ by more than 10 points.
fn disagreement(p: &PhaseReport) -> Option<(Category, f64)> {
    if !p.exact.available || p.sampled.samples < 1000 || p.wall_ns.median < 1_000_000 {
        return None;
    }
    crate::category::CATEGORIES
        .iter()
        .filter(|c| !matches!(c, Category::User | Category::Other))
        .map(|c| {
            (
                *c,
                (share(p, &[*c]) - p.sampled.categories.get(c).copied().unwrap_or(0.0)).abs() * 100.0,
            )
        })
        .filter(|(_, gap)| *gap > 10.0)
        .max_by(|a, b| a.1.total_cmp(&b.1))
}

/// The explanation as text.
pub fn render(e: &Explanation) -> String {
    let mut out = String::from("Findings");
    if e.findings.is_empty() {
        out += ": nothing stands out (no rule fired on these numbers)\n";
    } else {
        out += ", by time at stake:\n";
    }
    // A rule that fires on many cases of a matrix is told in full for its largest few.
    let mut told: std::collections::BTreeMap<&str, Vec<&Finding>> = Default::default();
    let mut n = 0;
    for f in &e.findings {
        let seen = told.entry(f.rule).or_default();
        seen.push(f);
        if seen.len() > FULL_PER_RULE {
            continue;
        }
        n += 1;
        let _ = write!(
            out,
            "\n{n}. {} {}: {}\n   why: {}\n   evidence: {}\n   fix: {}\n",
            f.case,
            f.phase.name(),
            f.what,
            f.why,
            f.evidence,
            f.fix
        );
    }
    for (rule, all) in told.iter().filter(|(_, all)| all.len() > FULL_PER_RULE) {
        let rest: Vec<String> = all[FULL_PER_RULE..]
            .iter()
            .map(|f| format!("{} ({})", f.case, ms(f.ns)))
            .collect();
        let _ = write!(out, "\n{rule} also fires on: {}\n", rest.join(", "));
    }
    if !e.checks.is_empty() {
        out += "\nChecks (numbers to read with care):\n";
        for c in &e.checks {
            let _ = writeln!(out, "  - {c}");
        }
    }
    out
}

/// One rule over a recording: a condition over one ioctl kind's summed calls.
struct RecordRule {
    id: &'static str,
    fires: fn(&RecordReport, &KindSummary) -> Option<Fired>,
}

/// The rules that apply to a recording (`dmaprof record`): the same mechanisms as a run's,
/// read from the calls of another process.
const RECORD_RULES: &[RecordRule] = &[
    RecordRule {
        id: "demand_faults_in_map",
        fires: recorded_demand_faults,
    },
    RecordRule {
        id: "small_iommu_pages",
        fires: recorded_small_iommu_pages,
    },
    RecordRule {
        id: "unmap_iova_walk",
        fires: recorded_iova_walk,
    },
];

/// What `cats` take of a kind's calls, and that as a share of their time.
fn kind_ns(k: &KindSummary, cats: &[Category]) -> (u64, f64) {
    let ns: u64 = cats.iter().filter_map(|c| k.categories.as_ref()?.get(c)).sum();
    (ns, ns as f64 / k.total_ns.max(1) as f64)
}

fn recorded_demand_faults(r: &RecordReport, k: &KindSummary) -> Option<Fired> {
    let (ns, share) = kind_ns(k, &[Category::Faulting, Category::Zeroing]);
    if !k.kind.maps() || share < 0.3 {
        return None;
    }
    let mut evidence = format!(
        "{} of {} in {} calls mapping {:.0} MiB ({:.0} ns per 4 KiB page)",
        ms(ns),
        ms(k.total_ns),
        k.count,
        k.bytes as f64 / (1u64 << 20) as f64,
        ns as f64 / (k.bytes / PAGE).max(1) as f64
    );
    if let Some(f) = r.cpu_faults {
        let _ = write!(evidence, "; {f} CPU page faults outside the maps");
    }
    Some(Fired {
        phase: Phase::Map,
        ns,
        what: format!("faulting and zeroing are {:.0}% of the {} calls", share * 100.0, k.kind),
        why: "the memory was not populated before it was mapped, so pinning faults in, allocates and zeroes \
              every page inside the map ioctl"
            .into(),
        evidence,
        fix: "populate before mapping: for QEMU, `prealloc=on` on the memory backend (or -mem-prealloc); in \
              your own code MAP_POPULATE or MADV_POPULATE_WRITE; hugetlb backing makes fewer, larger faults"
            .into(),
    })
}

fn recorded_small_iommu_pages(r: &RecordReport, k: &KindSummary) -> Option<Fired> {
    let named = |f: &str| r.rows.iter().find(|row| row.function == f);
    let row = named("iommu_map_nosync").or_else(|| named("iommu_map"))?;
    let per_call = k.bytes / row.calls.max(1);
    if !k.kind.maps() || row.calls < 1024 || per_call > 2 * PAGE {
        return None;
    }
    let (ns, _) = kind_ns(k, &[Category::IommuMap, Category::IommuFlush]);
    Some(Fired {
        phase: Phase::Map,
        ns,
        what: programmed_at(per_call),
        why: "the pinned pages are not physically contiguous (4 KiB pages), or the container disables large \
              IOMMU pages (VFIO_TYPE1_IOMMU on iommufd), so every page is its own iommu_map call"
            .into(),
        evidence: format!(
            "{} {} calls for {:.0} MiB mapped by {} {} calls; IOMMU programming {}",
            row.calls,
            row.function,
            k.bytes as f64 / (1u64 << 20) as f64,
            k.count,
            k.kind,
            ms(ns)
        ),
        fix: "back the memory with hugetlb (or THP) pages, and use VFIO_TYPE1v2_IOMMU or native iommufd".into(),
    })
}

fn recorded_iova_walk(_: &RecordReport, k: &KindSummary) -> Option<Fired> {
    let (ns, share) = kind_ns(k, &[Category::IommuLookup]);
    if k.kind.maps() || share < 0.4 || k.total_ns < 1_000_000 {
        return None;
    }
    Some(Fired {
        phase: Phase::Unmap,
        ns,
        what: format!("looking up IOVAs is {:.0}% of the {} calls", share * 100.0, k.kind),
        why: WHY_IOVA_WALK.into(),
        evidence: format!("{} of {} in {} calls", ms(ns), ms(k.total_ns), k.count),
        fix: FIX_IOVA_WALK.into(),
    })
}

/// The findings of a saved report: a run's, or a recording's.
pub fn explain_file(path: &std::path::Path) -> Result<Explanation, crate::report::ReadError> {
    match crate::recording::read(path) {
        Some(r) => Ok(explain_recording(&r?)),
        None => Ok(explain(&crate::report::read(path)?)),
    }
}

/// Findings for a recording: the record rules on each ioctl kind, ranked by time at stake.
pub fn explain_recording(r: &RecordReport) -> Explanation {
    let mut findings: Vec<Finding> = r
        .by_kind
        .iter()
        .flat_map(|k| {
            RECORD_RULES
                .iter()
                .filter_map(move |rule| (rule.fires)(r, k).map(|f| f.finding(rule.id, format!("{} calls", k.kind))))
        })
        .collect();
    findings.sort_by_key(|f| std::cmp::Reverse(f.ns));
    let mut checks = Vec::new();
    if r.lost > 0 || r.unaccounted > 0 {
        checks.push(format!(
            "{} calls lost and {} probed calls unaccounted: the sums undercount",
            r.lost, r.unaccounted
        ));
    }
    Explanation { findings, checks }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::probes::Pass;

    /// A real run of the custom 7.3 kernel's matrix in the guest (64 MiB), trimmed to the cases
    /// the rules are about, with exact rows kept for the map and unmap phases only.
    const MATRIX: &str = include_str!("../tests/data/matrix-7.3.json");

    fn matrix() -> Report {
        crate::report::parse(MATRIX).expect("the saved report parses")
    }

    /// The first phase of `r` that `pred` holds for: (case index, phase index).
    fn phase_where(r: &Report, pred: impl Fn(&PhaseReport) -> bool) -> Option<(usize, usize)> {
        r.cases
            .iter()
            .enumerate()
            .flat_map(|(ci, c)| c.phases.iter().enumerate().map(move |(pi, p)| (ci, pi, p)))
            .find_map(|(ci, pi, p)| pred(p).then_some((ci, pi)))
    }

    fn fired(e: &Explanation, rule: &str, case: &str) -> bool {
        e.findings.iter().any(|f| f.rule == rule && f.case == case)
    }

    #[test]
    fn every_rule_fires_on_a_real_run() {
        let e = explain(&matrix());
        assert!(fired(&e, "demand_faults_in_map", "vfio_type1_iommu_anonymous.none"));
        assert!(!fired(
            &e,
            "demand_faults_in_map",
            "vfio_type1_iommu_anonymous.populate"
        ));
        assert!(fired(
            &e,
            "small_iommu_pages",
            "iommufd_compat_type1_anonymous_hugetlb_2mb.none"
        ));
        assert!(!fired(&e, "small_iommu_pages", "iommufd_anonymous_hugetlb_2mb.none"));
        assert!(fired(
            &e,
            "iotlb_sync_per_map",
            "iommufd_compat_type1_anonymous_hugetlb_2mb.none"
        ));
        assert!(fired(&e, "memfd_pin_allocates", "iommufd_memfd.none"));
        assert!(fired(&e, "unmap_iova_walk", "iommufd_anonymous_hugetlb_2mb.none"));
        assert!(fired(
            &e,
            "slower_than_other_mode",
            "iommufd_compat_type1_anonymous_hugetlb_2mb.none"
        ));
        assert!(!fired(
            &e,
            "slower_than_other_mode",
            "iommufd_anonymous_hugetlb_2mb.none"
        ));
        // The saved run swept no sizes, read no layouts and predates `bookkeeping`: those rules
        // have their own tests.
        for rule in RULES
            .iter()
            .filter(|r| !["super_linear_growth", "scattered_pages", "driver_bookkeeping"].contains(&r.id))
        {
            assert!(e.findings.iter().any(|f| f.rule == rule.id), "{} never fires", rule.id);
        }
        assert!(
            e.findings.windows(2).all(|w| w[0].ns >= w[1].ns),
            "ranked by time at stake"
        );
    }

    #[test]
    fn the_drivers_own_code_is_told_where_it_is_a_large_share() {
        let name = "iommufd_anonymous_hugetlb_2mb.none";
        let mut r = matrix();
        assert!(!fired(&explain(&r), "driver_bookkeeping", name));
        let case = r.cases.iter_mut().find(|c| c.name == name).unwrap();
        let map = case.phases.iter_mut().find(|p| p.name == Phase::Map).unwrap();
        let own = map.exact.wall_less_cost() / 5;
        let (_, largest) = map.exact.categories.iter_mut().max_by_key(|(_, ns)| **ns).unwrap();
        *largest -= own;
        map.exact.categories.insert(Category::Bookkeeping, own);
        let fill = map
            .exact
            .rows
            .iter_mut()
            .find(|r| r.function == "iopt_area_fill_domains")
            .unwrap();
        fill.category = Category::Bookkeeping;
        let e = explain(&r);
        let f = e
            .findings
            .iter()
            .find(|f| f.rule == "driver_bookkeeping")
            .expect("fires");
        assert_eq!((f.case.as_str(), f.phase), (name, Phase::Map));
        assert!(f.what.contains("20% of the map"), "{}", f.what);
        assert!(
            f.evidence.contains("own time of iopt_area_fill_domains"),
            "{}",
            f.evidence
        );
    }

    /// The saved run's `vfio_type1_iommu_anonymous.none` at three sizes, its map costing `ns`.
    fn swept(ns: [u64; 3]) -> Report {
        let mut r = matrix();
        let base = r
            .cases
            .iter()
            .find(|c| c.name == "vfio_type1_iommu_anonymous.none")
            .unwrap()
            .clone();
        let sizes = [64u64 << 20, 128 << 20, 256 << 20];
        r.cases = sizes
            .iter()
            .zip(ns)
            .map(|(&size, ns)| {
                let mut c = base.clone();
                c.name = format!("{}@{}M", base.name, size >> 20);
                c.size_bytes = size;
                for p in c.phases.iter_mut().filter(|p| p.name == Phase::Map) {
                    p.wall_ns = crate::report::Stats::of(vec![ns]);
                }
                c
            })
            .collect();
        r.sweeps = crate::sweep::fit_all(&r.cases);
        r
    }

    #[test]
    fn super_linear_growth_is_told_once_on_the_largest_size() {
        let e = explain(&swept([10_000_000, 20_000_000, 80_000_000]));
        let f: Vec<&Finding> = e.findings.iter().filter(|f| f.rule == "super_linear_growth").collect();
        assert_eq!(f.len(), 1, "{f:?}");
        assert_eq!(f[0].case, "vfio_type1_iommu_anonymous.none@256M");
        assert!(
            f[0].what.contains("160.0 ms per GiB between the two smallest"),
            "{}",
            f[0].what
        );
        assert!(
            f[0].what.contains("480.0 ms per GiB between the two largest"),
            "{}",
            f[0].what
        );
        // The largest size at the smallest sizes' rate would cost 40 ms: 40 ms more is at stake.
        assert_eq!(f[0].ns, 40_000_000);
        let linear = explain(&swept([10_000_000, 20_000_000, 40_000_000]));
        assert!(!linear.findings.iter().any(|f| f.rule == "super_linear_growth"));
    }

    #[test]
    fn a_scattered_buffer_is_told_with_what_its_runs_cost() {
        let mut r = matrix();
        let case = r
            .cases
            .iter_mut()
            .find(|c| c.name == "vfio_type1_iommu_anonymous.none")
            .unwrap();
        let map = case.phases.iter_mut().find(|p| p.name == Phase::Map).unwrap();
        // Guest iterations of a 64 MiB --thp never buffer: (runs, ms).
        let pts = [(532, 71.0), (16052, 119.4), (660, 72.7), (16034, 143.8), (786, 71.0)];
        map.physical_runs = Some(crate::report::Stats::of(pts.iter().map(|p| p.0).collect()));
        map.layout = crate::layout::LayoutModel::fit(&pts.map(|(r, m)| (r, (m * 1e6) as u64)));
        map.wall_ns = crate::report::Stats::of(pts.iter().map(|p| (p.1 * 1e6) as u64).collect());
        let e = explain(&r);
        let f = e.findings.iter().find(|f| f.rule == "scattered_pages").unwrap();
        assert!(f.what.contains("532-16052 physically contiguous runs"), "{}", f.what);
        assert!(
            f.ns > 10_000_000 && f.evidence.contains("at the mean 6812 runs"),
            "{f:?}"
        );
        assert!(!fired(
            &explain(&matrix()),
            "scattered_pages",
            "vfio_type1_iommu_anonymous.none"
        ));
    }

    #[test]
    fn the_slower_mode_names_the_faster_and_the_difference() {
        let e = explain(&matrix());
        let f = e
            .findings
            .iter()
            .find(|f| f.rule == "slower_than_other_mode" && f.case == "iommufd_compat_type1_anonymous_hugetlb_2mb.none")
            .unwrap();
        assert!(f.what.contains("1.9x as long as iommufd_compat_type1v2"), "{}", f.what);
        assert!(f.evidence.contains("37.8 ms"), "{}", f.evidence);
        assert_eq!(f.ns, 37_760_378 - 19_895_293);
    }

    #[test]
    fn an_unsteady_machine_is_told() {
        let mut r = matrix();
        let said = |r: &Report| {
            checks(r)
                .into_iter()
                .filter(|c| c.contains("pace moved"))
                .collect::<Vec<_>>()
        };
        assert!(said(&r).is_empty(), "a run without paces says nothing of them");
        let st = |v: &[u64]| crate::report::Stats::of(v.to_vec());
        r.cases[0].pace_ns = Some(st(&[2_625_654, 2_488_145, 2_590_000, 2_710_000, 2_860_263]));
        assert!(said(&r).is_empty(), "1.15x is steady enough: {:#?}", said(&r));
        r.cases[0].pace_ns = Some(st(&[3_807_910, 3_724_123, 3_693_877, 3_889_593, 5_491_227]));
        let s = said(&r);
        assert!(
            s.len() == 1 && s[0].starts_with(&r.cases[0].name) && s[0].contains("1.49x"),
            "{s:#?}"
        );
    }

    #[test]
    fn demand_faulting_is_held_against_populating() {
        let mut r = matrix();
        let flagged = |r: &Report| {
            checks(r)
                .into_iter()
                .filter(|c| c.starts_with("vfio_type1_iommu_anonymous.none map: faulting + zeroing on demand"))
                .collect::<Vec<_>>()
        };
        // The saved run: 14.6 ms on demand, 19.3 ms populated.
        assert!(
            flagged(&r).iter().any(|c| c.contains("(24% apart)")),
            "{:#?}",
            flagged(&r)
        );
        // Populating as fast as demand faulting: nothing to flag.
        let populate = r
            .cases
            .iter_mut()
            .find(|c| c.name == "vfio_type1_iommu_anonymous.populate")
            .unwrap();
        for p in populate.phases.iter_mut().filter(|p| p.name == Phase::Mmap) {
            p.wall_ns.median = p.wall_ns.median * 146 / 193;
        }
        assert!(flagged(&r).is_empty(), "{:#?}", flagged(&r));
    }

    #[test]
    fn an_exact_iteration_that_outgrew_its_scout_is_told() {
        let mut r = matrix();
        let (ci, pi) = phase_where(&r, |p| p.name == Phase::Map && p.exact.available)
            .expect("the saved run has an exact map phase");
        let name = format!("{} map:", r.cases[ci].name);
        let said = |r: &Report| {
            checks(r)
                .into_iter()
                .find(|c| c.starts_with(&name) && c.contains("probe hits cost"))
        };
        // The measured case: an iommufd memfd map of 515 ms whose exact iteration made 55738
        // hits (27852 runs) after a scout on 1819 runs had demoted two rows.
        let e = &mut r.cases[ci].phases[pi].exact;
        e.wall_ns = 515_000_000;
        e.probe_hits = 55738;
        e.probe_overhead_calibrated_ns = Some(60_000_000);
        e.physical_runs = Some(27852);
        r.cases[ci].scout_physical_runs = Some(1819);
        assert_eq!(said(&r), None, "no row demoted in the map: the scout did not act on it");
        r.cases[ci].demoted.push(crate::report::DemotedRow {
            function: "iommu_map".into(),
            phase: Phase::Map,
            calls: 1819,
            cost_ns: 4_439_462,
            share: 0.013,
            phase_share: 0.52,
            outgrown: false,
            physical_runs: Some(1819),
        });
        let told = said(&r).expect("12% of the phase is told");
        assert!(
            told.contains("55738 probe hits")
                && told.contains("12%")
                && told.contains("27852")
                && told.contains("1819"),
            "{told}"
        );
        r.cases[ci].phases[pi].exact.probe_overhead_calibrated_ns = Some(30_000_000);
        assert_eq!(said(&r), None, "6% is within what a scout leaves");
    }

    #[test]
    fn exact_and_sampled_on_buffers_laid_out_apart_are_told_so() {
        let mut r = matrix();
        let (ci, pi) = phase_where(&r, |p| {
            p.name == Phase::Map && p.exact.available && p.wall_ns.median >= 1_000_000
        })
        .expect("the saved run has an exact map phase of 1 ms or more");
        let name = format!("{} map:", r.cases[ci].name);
        let said = |r: &Report| {
            checks(r)
                .into_iter()
                .find(|c| c.starts_with(&name) && c.contains("exact and sampled differ"))
        };
        let p = &mut r.cases[ci].phases[pi];
        p.sampled.samples = 1202;
        p.sampled.categories = [(Category::Release, 1.0)].into();
        let plain = said(&r).expect("a 100-point gap is told");
        assert!(!plain.contains("physically contiguous runs"), "{plain}");
        // The measured pair: a 4 KiB memfd's type1 map, the untraced line through five
        // iterations, the exact one on 635 runs and the sampled one on 18790.
        let p = &mut r.cases[ci].phases[pi];
        let untraced = [
            (3446, 40_946_421),
            (2013, 38_784_214),
            (28157, 226_990_321),
            (206, 53_149_419),
            (3171, 78_789_935),
        ];
        p.layout = crate::layout::LayoutModel::fit(&untraced);
        p.exact.physical_runs = Some(635);
        let sampled = p.passes.entry(Pass::Sampled).or_default();
        sampled.physical_runs = Some(crate::report::Stats::of(vec![18790]));
        let told = said(&r).expect("still told");
        assert!(
            told.contains("came in 635 and 18790 physically contiguous runs"),
            "{told}"
        );
        // Layouts that the line puts within 1.5x of each other are the same work.
        let p = &mut r.cases[ci].phases[pi];
        p.passes.get_mut(&Pass::Sampled).unwrap().physical_runs = Some(crate::report::Stats::of(vec![900]));
        let same = said(&r).expect("still told");
        assert!(!same.contains("physically contiguous runs"), "{same}");
        // Beyond the runs the line saw, the passes' own times judge: an iommufd 4 KiB memfd
        // map, exact 36.1 ms on 643 runs, sampled 222.8 ms on 28938, untraced on 156-2738.
        let p = &mut r.cases[ci].phases[pi];
        let untraced = [
            (2672, 61_882_172),
            (156, 36_524_920),
            (1914, 40_181_298),
            (2738, 30_480_046),
            (1310, 36_453_352),
        ];
        p.layout = crate::layout::LayoutModel::fit(&untraced);
        p.exact.physical_runs = Some(643);
        p.exact.wall_ns = 36_102_917;
        p.exact.probe_overhead_ns = Some(84_882);
        let sampled = p.passes.get_mut(&Pass::Sampled).unwrap();
        sampled.physical_runs = Some(crate::report::Stats::of(vec![28938]));
        sampled.wall_ns = crate::report::Stats::of(vec![222_751_830]);
        let beyond = said(&r).expect("still told");
        assert!(
            beyond.contains("came in 643 and 28938 physically contiguous runs, and the two iterations took"),
            "{beyond}"
        );
        // As far apart in runs, but the same time: the layout did not change the work.
        let p = &mut r.cases[ci].phases[pi];
        p.passes.get_mut(&Pass::Sampled).unwrap().wall_ns = crate::report::Stats::of(vec![40_000_000]);
        let same = said(&r).expect("still told");
        assert!(!same.contains("physically contiguous runs"), "{same}");
        // Laid out alike, the exact iteration at its untraced time and the sampled one 1.76x
        // it: the exact shares describe the untraced run.
        let p = &mut r.cases[ci].phases[pi];
        let sampled = p.passes.get_mut(&Pass::Sampled).unwrap();
        sampled.physical_runs = Some(crate::report::Stats::of(vec![643]));
        p.wall_pass = Pass::Untraced;
        p.wall_ns = crate::report::Stats::of(vec![36_000_000]);
        p.passes.get_mut(&Pass::Sampled).unwrap().wall_ns = crate::report::Stats::of(vec![63_360_000]);
        let slowed = said(&r).expect("still told");
        assert!(
            slowed.contains("ran x1.00 the untraced median and the sampled one x1.76")
                && slowed.contains("so the exact shares are the ones"),
            "{slowed}"
        );
    }

    #[test]
    fn a_breakdown_on_a_layout_no_untraced_iteration_had_is_told() {
        let mut r = matrix();
        let (ci, pi) = phase_where(&r, |p| {
            p.name == Phase::Map && p.exact.available && p.wall_pass == Pass::Untraced
        })
        .expect("the saved run has an exact map phase");
        r.cases[ci].size_bytes = 256 << 20;
        let name = format!("{} map:", r.cases[ci].name);
        let said = |r: &Report| {
            checks(r)
                .into_iter()
                .find(|c| c.starts_with(&name) && c.contains("the breakdown is of a buffer"))
        };
        // Measured in a default matrix (256 MiB 4 KiB memfd, touch, type1v2): the untraced
        // maps on 24282-28354 runs (median 76.7 ms), the exact one on 613 runs in 21.4 ms.
        let p = &mut r.cases[ci].phases[pi];
        p.physical_runs = Some(crate::report::Stats::of(vec![28354, 24282, 28225, 28182, 28099]));
        p.wall_ns = crate::report::Stats::of(vec![76_700_000; 5]);
        p.exact.physical_runs = Some(613);
        p.exact.wall_ns = 21_800_000;
        p.exact.probe_overhead_ns = Some(400_000);
        let told = said(&r).expect("a breakdown on 613 runs under a headline on 28182 is told");
        assert!(
            told.contains("in 613 physically contiguous runs (21.4 ms less its probe cost)")
                && told.contains("24282-28354 (median 28182, 76.7 ms)"),
            "{told}"
        );
        // Inside the untraced iterations' runs: one of them had that layout.
        let p = &mut r.cases[ci].phases[pi];
        p.physical_runs = Some(crate::report::Stats::of(vec![28354, 600, 28225, 28182, 28099]));
        assert_eq!(said(&r), None);
        // Outside them, but at the headline's time: the layout did not change the work.
        let p = &mut r.cases[ci].phases[pi];
        p.physical_runs = Some(crate::report::Stats::of(vec![28354, 24282, 28225, 28182, 28099]));
        p.exact.wall_ns = 75_000_000;
        assert_eq!(said(&r), None);
        // Far from the median in time and outside the runs, but not far apart in runs.
        let p = &mut r.cases[ci].phases[pi];
        p.exact.wall_ns = 21_800_000;
        p.exact.physical_runs = Some(24_000);
        assert_eq!(said(&r), None);
    }

    #[test]
    fn a_sampler_that_missed_stretches_is_flagged() {
        let mut r = matrix();
        let freq = r.config.freq_hz;
        let (ci, pi, expected) = r
            .cases
            .iter()
            .enumerate()
            .flat_map(|(ci, c)| c.phases.iter().enumerate().map(move |(pi, p)| (ci, pi, p)))
            .find_map(|(ci, pi, p)| Some((ci, pi, crate::report::expected_samples(p, freq).filter(|e| *e >= 100)?)))
            .expect("the saved run has a sampled phase of 100 samples or more");
        let name = format!("{} {}:", r.cases[ci].name, r.cases[ci].phases[pi].name.name());
        let flagged = |r: &Report| {
            checks(r)
                .into_iter()
                .any(|c| c.starts_with(&name) && c.contains("samples its time on the CPU"))
        };
        r.cases[ci].phases[pi].sampled.samples = expected;
        assert!(!flagged(&r));
        r.cases[ci].phases[pi].sampled.samples = expected / 3;
        assert!(flagged(&r), "{:#?}", checks(&r));
        let says = |r: &Report, what: &str| checks(r).iter().any(|c| c.starts_with(&name) && c.contains(what));
        // Time the thread spent off the CPU, where the sampler cannot fire, is not a miss.
        let wall: u64 = r.cases[ci].phases[pi].passes[&Pass::Sampled].wall_ns.runs.iter().sum();
        r.cases[ci].phases[pi].sampled.off_cpu_ns = Some(wall / 2);
        assert!(!flagged(&r), "{:#?}", checks(&r));
        // The sampled pass no slower than the untraced one: the sampler missed stretches.
        let p = &mut r.cases[ci].phases[pi];
        let n = p.passes[&Pass::Sampled].wall_ns.runs.len();
        let set_walls = |p: &mut PhaseReport, per_run: u64| {
            p.passes.get_mut(&Pass::Sampled).unwrap().wall_ns = crate::report::Stats::of(vec![per_run; n]);
        };
        set_walls(p, p.wall_ns.median);
        (p.sampled.samples, p.sampled.off_cpu_ns) = (10, Some(0));
        assert!(
            says(&r, "missed stretches") && !says(&r, "skipped periods"),
            "{:#?}",
            checks(&r)
        );
        // Samples that cost the phase more than a period each: the timer skipped periods.
        let p = &mut r.cases[ci].phases[pi];
        set_walls(p, p.wall_ns.median + 10 / n as u64 * 300_000);
        p.sampled.sampler_ns = 10 * 30_000;
        assert!(says(&r, "about 300 us"), "{:#?}", checks(&r));
        assert!(says(
            &r,
            "30 us of it in dmaprof's program) against a 200 us period, so the timer skipped"
        ));
    }

    #[test]
    fn an_exact_iteration_mostly_off_the_cpu_is_flagged() {
        let mut r = matrix();
        let (ci, pi) = phase_where(&r, |p| p.exact.available && p.exact.wall_ns > 1_000_000)
            .expect("the saved run has an exact phase over 1 ms");
        let name = format!("{} {}:", r.cases[ci].name, r.cases[ci].phases[pi].name.name());
        let flagged = |r: &Report| {
            checks(r)
                .into_iter()
                .any(|c| c.starts_with(&name) && c.contains("off the CPU"))
        };
        let wall = r.cases[ci].phases[pi].exact.wall_ns;
        let off = |ns| crate::report::OffCpu {
            ns,
            switches: 9,
            blocked: 8,
            rusage_switches: 9,
        };
        r.cases[ci].phases[pi].counters.off_cpu = Some(off(wall / 20));
        assert!(!flagged(&r));
        r.cases[ci].phases[pi].counters.off_cpu = Some(off(wall / 2));
        assert!(flagged(&r), "{:#?}", checks(&r));
    }

    #[test]
    fn a_category_without_its_probes_is_flagged_where_samples_see_it() {
        let mut r = matrix();
        let flagged = |r: &Report| {
            checks(r)
                .into_iter()
                .filter(|c| c.contains("reads 0"))
                .collect::<Vec<_>>()
        };
        // The saved run has one: vfio_iommu_map (inlined in 7.3) is the only iommu_map row that
        // did not attach, and the populated iommufd map's exact iommu_map reads 0 against 8%.
        assert_eq!(flagged(&r).len(), 1, "{:#?}", flagged(&r));
        assert!(flagged(&r)[0].starts_with("iommufd_anonymous_hugetlb_2mb.populate map: exact iommu_map reads 0"));
        // Zeroing's rows off, and its exact time gone with them, as on a kernel without them.
        for p in r.probes.iter_mut().filter(|p| p.function == "folio_zero_user") {
            p.attached = false;
        }
        for c in &mut r.cases {
            for p in &mut c.phases {
                p.exact.categories.remove(&Category::Zeroing);
            }
        }
        let after = flagged(&r);
        assert!(
            after
                .iter()
                .any(|c| c.starts_with("vfio_type1_iommu_anonymous.none map: exact zeroing reads 0")),
            "{after:#?}"
        );
    }

    #[test]
    fn a_real_recording_is_explained_by_its_calls() {
        let r: RecordReport = serde_json::from_str(include_str!("../tests/data/record-7.3.json")).unwrap();
        let e = explain_recording(&r);
        let ids: Vec<(&str, &str)> = e.findings.iter().map(|f| (f.rule, f.case.as_str())).collect();
        // The C reference's 4 maps of 32 MiB of demand-faulted THP memory, and their unmaps.
        assert_eq!(
            ids,
            [
                ("demand_faults_in_map", "VFIO_IOMMU_MAP_DMA calls"),
                ("unmap_iova_walk", "VFIO_IOMMU_UNMAP_DMA calls")
            ]
        );
        assert!(
            e.findings[0]
                .evidence
                .starts_with("38.9 ms of 48.9 ms in 4 calls mapping 128 MiB")
        );
        assert!(e.findings[0].fix.contains("prealloc=on"));
        // 38 iommu_map calls for 128 MiB: large IOMMU pages, nothing to say about page size.
        assert!(!e.findings.iter().any(|f| f.rule == "small_iommu_pages"));
        // The same calls made one 4 KiB page at a time.
        let mut small = r.clone();
        for row in small.rows.iter_mut().filter(|row| row.function == "iommu_map_nosync") {
            row.calls = 32768;
        }
        let e = explain_recording(&small);
        let f = e.findings.iter().find(|f| f.rule == "small_iommu_pages").unwrap();
        assert_eq!(f.what, "the IOMMU is programmed 4096 bytes at a time");
    }

    #[test]
    fn evidence_comes_from_the_run() {
        let e = explain(&matrix());
        let small = e
            .findings
            .iter()
            .find(|f| f.rule == "small_iommu_pages" && f.case == "iommufd_compat_type1_anonymous_hugetlb_2mb.none")
            .unwrap();
        assert!(
            small.evidence.contains("16384 iommu_map calls of 4096 bytes"),
            "{}",
            small.evidence
        );
        assert!(
            small.evidence.contains("iommufd "),
            "the native mode's count: {}",
            small.evidence
        );
        let demand = e
            .findings
            .iter()
            .find(|f| f.rule == "demand_faults_in_map" && f.case == "vfio_type1_iommu_anonymous.none")
            .unwrap();
        assert!(
            demand
                .evidence
                .contains("populated first (vfio_type1_iommu_anonymous.populate)")
        );
    }

    #[test]
    fn zeroing_is_held_against_the_floors() {
        let mut r = matrix();
        assert!(
            explain(&r)
                .findings
                .iter()
                .all(|f| !f.evidence.contains("of the limit")),
            "no floors, no comparison"
        );
        r.floors = Some(crate::floors::Floors {
            clear_gib_per_s: 10.0,
            clear_how: String::new(),
            fault_4k_ns: Some(2000),
            fault_how: String::new(),
            empty_ioctl_ns: None,
            ioctl_how: String::new(),
        });
        let e = explain(&r);
        let f = e
            .findings
            .iter()
            .find(|f| f.rule == "demand_faults_in_map" && f.case == "vfio_type1_iommu_anonymous.none")
            .expect("the type1 demand map is explained");
        assert!(
            f.evidence.contains("this machine clears at 10.00 GiB/s") && f.evidence.contains("against 2000 ns"),
            "{}",
            f.evidence
        );
    }

    #[test]
    fn an_exact_iteration_slower_than_its_probes_explain_is_told() {
        const NAME: &str = "iommufd_compat_type1_anonymous_hugetlb_2mb.none";
        fn map(r: &mut Report) -> &mut crate::report::Exact {
            let p = r
                .cases
                .iter_mut()
                .find(|c| c.name == NAME)
                .and_then(|c| c.phases.iter_mut().find(|p| p.name == Phase::Map))
                .expect("the saved run has the compat type1 map");
            &mut p.exact
        }
        let told = |r: &Report| {
            checks(r)
                .into_iter()
                .filter(|c| c.starts_with(&format!("{NAME} map: the exact iteration ran")))
                .collect::<Vec<_>>()
        };
        let mut r = matrix();
        // The boot that read 401 ms against 289 ms untraced, with 415 hits worth 0.9 ms.
        let e = map(&mut r);
        e.wall_ns = 400_937_266;
        e.probe_overhead_ns = Some(31_080_000);
        e.probe_overhead_measured_ns = Some(112_130_000);
        e.probe_overhead_calibrated_ns = Some(910_000);
        e.probe_hits = 415;
        let said = told(&r);
        assert_eq!(said.len(), 1, "{said:?}");
        assert!(
            said[0].contains("ran 112.1 ms over")
                && said[0].contains(
                    "and 81.0 ms of that is more than the probe cost taken out (31.1 ms for 415 hits, 0.9 ms"
                ),
            "{}",
            said[0]
        );
        // Within a tenth of the phase it is noise the breakdown can carry.
        map(&mut r).probe_overhead_measured_ns = Some(60_000_000);
        assert!(told(&r).is_empty());
        // Without an untraced pass nothing was measured against.
        map(&mut r).probe_overhead_measured_ns = None;
        assert!(told(&r).is_empty());
    }

    #[test]
    fn a_rule_without_its_numbers_stays_silent() {
        let mut r = matrix();
        for c in &mut r.cases {
            for p in &mut c.phases {
                p.exact.rows.clear();
            }
        }
        let e = explain(&r);
        assert!(
            !e.findings
                .iter()
                .any(|f| f.rule == "small_iommu_pages" || f.rule == "memfd_pin_allocates")
        );
        r.cases.clear();
        let text = render(&explain(&r));
        assert!(text.contains("nothing stands out"), "{text}");
    }
}
