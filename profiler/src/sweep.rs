//! The size sweep (`-b 64M,128M,256M`): how each case's cost grows with the buffer size. One
//! least-squares line per phase and category (fixed cost + cost per GiB, with its R^2) over the
//! sizes the run measured, what its shape is, and a plot of time against size.
//!
//! Each size's point is its fastest untraced iteration. The sizes run one after another, so a
//! spell of a slower machine (a host busy loop, another guest) lands on some of one size's
//! iterations and not the next size's; the fastest iteration carries it least. Under a host
//! busy loop the medians of seven iterations bent 2 MiB hugetlb lines to R^2 0.89-0.94 where
//! the fastest read 0.96-1.00 (a spell as long as a whole size still bends both).
use std::{collections::BTreeMap, fmt::Write as _};

use crate::{
    category::{CATEGORIES, Category},
    phase::{PHASES, Phase},
    report::{CaseReport, Fit, PhaseReport, Shape, Sweep, SweepPhase},
    size::HumanSize,
};

/// Bytes in a GiB: the fit's unit of size.
const GIB: f64 = (1u64 << 30) as f64;
/// A category below this share of its phase at the largest size gets no line of its own.
const MIN_SHARE: f64 = 0.02;
/// R^2 a line must reach to call a cost linear.
const LINEAR_R2: f64 = 0.95;
/// A cost is constant when the line rises by less than this share of its mean over the sweep.
const CONSTANT_RISE: f64 = 0.1;
/// A cost is super-linear when its last interval costs this much more per GiB than its first.
const SUPER_LINEAR: f64 = 1.3;

/// The case a name belongs to, without its `@size`.
pub fn base_name(name: &str) -> &str {
    name.split_once('@').map_or(name, |(base, _)| base)
}

/// Fits every case the run measured at two sizes or more.
pub fn fit_all(cases: &[CaseReport]) -> Vec<Sweep> {
    let mut by_case: BTreeMap<&str, Vec<&CaseReport>> = BTreeMap::new();
    for c in cases {
        by_case.entry(base_name(&c.name)).or_default().push(c);
    }
    by_case
        .into_iter()
        .filter_map(|(name, mut runs)| {
            runs.sort_by_key(|c| c.size_bytes);
            runs.dedup_by_key(|c| c.size_bytes);
            (runs.len() >= 2).then(|| Sweep {
                case: name.to_owned(),
                // Every phase whose cost can depend on the size: all but memfd_create.
                phases: PHASES
                    .iter()
                    .filter(|p| **p != Phase::MemfdCreate)
                    .filter_map(|p| fit_phase(*p, &runs))
                    .collect(),
                plot: Some(format!("{name}/sweep.svg")),
            })
        })
        .collect()
}

fn fit_phase(phase: Phase, runs: &[&CaseReport]) -> Option<SweepPhase> {
    let phases: Vec<_> = runs
        .iter()
        .map(|c| Some((c.size_bytes, c.phases.iter().find(|p| p.name == phase)?)))
        .collect::<Option<_>>()?;
    let total: Vec<(u64, u64)> = phases.iter().map(|(b, p)| (*b, p.wall_ns.min)).collect();
    let (largest_bytes, largest) = phases.last()?;
    // A category's time at the fastest iteration: its per-page cost is at the median's.
    let at_fastest = |b: u64, p: &PhaseReport, c: &Category| {
        let scale = p.wall_ns.min as f64 / p.wall_ns.median.max(1) as f64;
        p.per_page_ns.get(c).copied().unwrap_or(0.0) * (b / 4096) as f64 * scale
    };
    let categories = CATEGORIES
        .iter()
        .filter(|c| at_fastest(*largest_bytes, largest, c) >= MIN_SHARE * largest.wall_ns.min as f64)
        .map(|c| {
            let points = phases.iter().map(|(b, p)| (*b, at_fastest(*b, p, c) as u64)).collect();
            (*c, fit(points))
        })
        .collect();
    Some(SweepPhase {
        phase,
        total: fit(total),
        categories,
    })
}

/// The least-squares line through `points` (bytes, ns), and its shape.
pub fn fit(points: Vec<(u64, u64)>) -> Fit {
    let xy: Vec<(f64, f64)> = points.iter().map(|(b, ns)| (*b as f64 / GIB, *ns as f64)).collect();
    let n = xy.len().max(1) as f64;
    let (mx, my) = (
        xy.iter().map(|p| p.0).sum::<f64>() / n,
        xy.iter().map(|p| p.1).sum::<f64>() / n,
    );
    let sxx: f64 = xy.iter().map(|(x, _)| (x - mx).powi(2)).sum();
    let sxy: f64 = xy.iter().map(|(x, y)| (x - mx) * (y - my)).sum();
    let slope = if sxx > 0.0 { sxy / sxx } else { 0.0 };
    let fixed = my - slope * mx;
    let ss_res: f64 = xy.iter().map(|(x, y)| (y - fixed - slope * x).powi(2)).sum();
    let ss_tot: f64 = xy.iter().map(|(_, y)| (y - my).powi(2)).sum();
    let r2 = if ss_tot > 0.0 { 1.0 - ss_res / ss_tot } else { 1.0 };
    let shape = shape(&xy, slope, my, r2);
    Fit {
        points,
        fixed_ns: fixed,
        ns_per_gib: slope,
        r2,
        shape,
    }
}

fn shape(xy: &[(f64, f64)], slope: f64, mean: f64, r2: f64) -> Shape {
    let span = xy.last().map_or(0.0, |l| l.0) - xy.first().map_or(0.0, |f| f.0);
    if (slope * span).abs() < CONSTANT_RISE * mean.abs().max(1.0) {
        return Shape::Constant;
    }
    let per_gib = |a: (f64, f64), b: (f64, f64)| (b.1 - a.1) / (b.0 - a.0).max(f64::EPSILON);
    if let n @ 3.. = xy.len() {
        let (early, late) = (per_gib(xy[0], xy[1]), per_gib(xy[n - 2], xy[n - 1]));
        if early > 0.0 && late > SUPER_LINEAR * early {
            return Shape::SuperLinear;
        }
    }
    if r2 >= LINEAR_R2 { Shape::Linear } else { Shape::Noisy }
}

/// One line of the sweep table: `fixed + per GiB (R^2, shape)`.
pub fn describe(f: &Fit) -> String {
    format!(
        "{:.3} ms + {:.3} ms/GiB (R^2 {:.3}, {})",
        f.fixed_ns / 1e6,
        f.ns_per_gib / 1e6,
        f.r2,
        f.shape
    )
}

/// Plot geometry: one panel per phase.
const WIDTH: f64 = 720.0;
const PANEL: f64 = 240.0;
const LEFT: f64 = 70.0;
const RIGHT: f64 = 170.0;
const TOP: f64 = 30.0;
const BOTTOM: f64 = 40.0;

/// The sweep as an SVG: a panel per phase, time (ms) against size, the headline total dashed
/// and a line per category in its table colour, each point marked.
pub fn svg(s: &Sweep) -> String {
    let height = s.phases.len() as f64 * PANEL;
    let mut out = format!(
        "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"{WIDTH}\" height=\"{height}\" \
         font-family=\"sans-serif\" font-size=\"12\">\n<rect width=\"100%\" height=\"100%\" fill=\"white\"/>\n"
    );
    for (i, p) in s.phases.iter().enumerate() {
        out += &panel(&s.case, p, i as f64 * PANEL);
    }
    out += "</svg>\n";
    out
}

fn panel(case: &str, p: &SweepPhase, y0: f64) -> String {
    let xs: Vec<u64> = p.total.points.iter().map(|(b, _)| *b).collect();
    let (xmin, xmax) = (*xs.first().unwrap_or(&0) as f64, *xs.last().unwrap_or(&1) as f64);
    let ymax = p.total.points.iter().map(|(_, ns)| *ns).max().unwrap_or(1).max(1) as f64 * 1.1;
    let (w, h) = (WIDTH - LEFT - RIGHT, PANEL - TOP - BOTTOM);
    let x = |b: u64| LEFT + (b as f64 - xmin) / (xmax - xmin).max(1.0) * w;
    let y = |ns: u64| y0 + TOP + h - ns as f64 / ymax * h;
    let mut out = format!(
        "<text x=\"{LEFT}\" y=\"{}\" font-weight=\"bold\">{case}: {} (ms against size)</text>\n\
         <line x1=\"{LEFT}\" y1=\"{}\" x2=\"{LEFT}\" y2=\"{}\" stroke=\"black\"/>\n\
         <line x1=\"{LEFT}\" y1=\"{}\" x2=\"{}\" y2=\"{}\" stroke=\"black\"/>\n",
        y0 + 18.0,
        p.phase.name(),
        y0 + TOP,
        y0 + TOP + h,
        y0 + TOP + h,
        LEFT + w,
        y0 + TOP + h
    );
    for b in &xs {
        let _ = writeln!(
            out,
            "<text x=\"{}\" y=\"{}\" text-anchor=\"middle\">{}</text>",
            x(*b),
            y0 + TOP + h + 16.0,
            HumanSize(*b)
        );
    }
    for frac in [0.0, 0.5, 1.0] {
        let ns = (ymax / 1.1 * frac) as u64;
        let _ = writeln!(
            out,
            "<text x=\"{}\" y=\"{}\" text-anchor=\"end\">{:.1}</text>",
            LEFT - 6.0,
            y(ns) + 4.0,
            ns as f64 / 1e6
        );
    }
    let mut legend = vec![("total".to_owned(), "black".to_owned(), true, &p.total)];
    for (c, f) in &p.categories {
        let (r, g, b) = c.color();
        legend.push((c.name().to_owned(), format!("rgb({r},{g},{b})"), false, f));
    }
    for (i, (name, colour, dashed, f)) in legend.iter().enumerate() {
        let pts: Vec<String> = f
            .points
            .iter()
            .map(|(b, ns)| format!("{:.1},{:.1}", x(*b), y(*ns)))
            .collect();
        let dash = if *dashed { " stroke-dasharray=\"6 3\"" } else { "" };
        let _ = writeln!(
            out,
            "<polyline points=\"{}\" fill=\"none\" stroke=\"{colour}\" stroke-width=\"2\"{dash}/>",
            pts.join(" ")
        );
        for (b, ns) in &f.points {
            let _ = writeln!(
                out,
                "<circle cx=\"{:.1}\" cy=\"{:.1}\" r=\"3\" fill=\"{colour}\"/>",
                x(*b),
                y(*ns)
            );
        }
        let ly = y0 + TOP + 14.0 * i as f64;
        let _ = writeln!(
            out,
            "<rect x=\"{}\" y=\"{}\" width=\"12\" height=\"4\" fill=\"{colour}\"/><text x=\"{}\" y=\"{}\">{name} R² {:.2}</text>",
            WIDTH - RIGHT + 10.0,
            ly - 4.0,
            WIDTH - RIGHT + 26.0,
            ly,
            f.r2
        );
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    const M: u64 = 1 << 20;

    #[test]
    fn lines_constants_and_super_linear_costs_are_told_apart() {
        // 2 ms fixed + 1 ms per 64 MiB (16 ms/GiB), exactly.
        let linear = fit(vec![(64 * M, 3_000_000), (128 * M, 4_000_000), (256 * M, 6_000_000)]);
        assert!((linear.fixed_ns - 2e6).abs() < 1.0 && (linear.ns_per_gib - 16e6).abs() < 1.0);
        assert!((linear.r2 - 1.0).abs() < 1e-9);
        assert_eq!(linear.shape, Shape::Linear);
        let flat = fit(vec![(64 * M, 5_000_000), (128 * M, 5_050_000), (256 * M, 4_990_000)]);
        assert_eq!(flat.shape, Shape::Constant);
        // Each doubling costs four times as much.
        let quad = fit(vec![(64 * M, 1_000_000), (128 * M, 4_000_000), (256 * M, 16_000_000)]);
        assert_eq!(quad.shape, Shape::SuperLinear);
        let noisy = fit(vec![(64 * M, 9_000_000), (128 * M, 1_000_000), (256 * M, 12_000_000)]);
        assert_eq!(noisy.shape, Shape::Noisy);
    }

    #[test]
    fn sizes_of_one_case_are_fitted_together() {
        let saved = crate::report::parse(include_str!("../tests/data/matrix-7.3.json")).unwrap();
        let mut cases = Vec::new();
        for (i, bytes) in [64 * M, 128 * M, 256 * M].into_iter().enumerate() {
            let mut c = saved.cases[0].clone();
            let scale = (i + 1) as u64;
            c.name = format!(
                "{}@{}",
                saved.cases[0].name,
                crate::size::ByteSize::new(bytes).unwrap().short()
            );
            c.size_bytes = bytes;
            for p in &mut c.phases {
                // The fastest iteration is the point; the median is twice as slow.
                p.wall_ns.min = 1_000_000 + scale * 2_000_000;
                p.wall_ns.median = 2 * p.wall_ns.min;
            }
            cases.push(c);
        }
        cases.push(saved.cases[1].clone());
        let sweeps = fit_all(&cases);
        assert_eq!(sweeps.len(), 1, "one case ran at several sizes");
        let s = &sweeps[0];
        assert_eq!(s.case, saved.cases[0].name);
        let map = s
            .phases
            .iter()
            .find(|p| p.phase == Phase::Map)
            .expect("the map is fitted");
        // 3, 5 and 7 ms at 64, 128 and 256 MiB: rising, and slower per GiB as it grows.
        assert_eq!(
            map.total.points,
            [(64 * M, 3_000_000), (128 * M, 5_000_000), (256 * M, 7_000_000)],
            "the fastest iterations, not the medians"
        );
        assert_eq!(map.total.shape, Shape::Linear);
        assert!(map.total.r2 > 0.95 && map.total.r2 < 1.0, "{}", map.total.r2);
        let plot = svg(s);
        assert!(plot.starts_with("<svg") && plot.matches("<polyline").count() >= s.phases.len());
        assert!(plot.contains("64 MiB") && plot.contains("256 MiB"));
    }
}
