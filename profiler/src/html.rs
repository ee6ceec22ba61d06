//! The HTML report: one self-contained `index.html` per run (inline CSS, JS and SVG; nothing is
//! fetched, so it opens from disk anywhere), and the parts `diff.html` is built from.
//!
//! Plain string building: the pages are a few fixed shapes filled from the report, so a template
//! language would add a dependency and a second syntax for no gain.
use std::fmt::Write as _;

use base64::Engine as _;

use crate::{
    category::{CATEGORIES, Category},
    explain,
    matrix::{self, Backing, DmaMode, Prefault},
    probes::ProbeStatus,
    recording::{Call, RecordReport},
    report::{CaseReport, PhaseReport, Report},
    size::HumanSize,
    table::ms,
    workload::Phase,
};

/// Text made safe for HTML text and attribute values.
pub fn esc(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for c in s.chars() {
        match c {
            '&' => out.push_str("&amp;"),
            '<' => out.push_str("&lt;"),
            '>' => out.push_str("&gt;"),
            '"' => out.push_str("&quot;"),
            '\'' => out.push_str("&#39;"),
            c => out.push(c),
        }
    }
    out
}

/// The id of a case's section (what the heat map's cells link to).
pub fn case_id(case: &str) -> String {
    format!("case-{case}")
}

/// Reads a flamegraph by its path relative to the report's directory (None: it is not there).
pub type SvgSource<'a> = &'a dyn Fn(&str) -> Option<String>;

const CSS: &str = r##"
body { font: 14px/1.4 system-ui, sans-serif; margin: 0 auto; padding: 0 16px 48px; max-width: 1240px; box-sizing: border-box; color: #111; }
h1 { font-size: 22px; margin: 16px 0 4px; } h2 { font-size: 18px; margin: 24px 0 8px; border-bottom: 1px solid #ccc; }
h3 { font-size: 16px; margin: 20px 0 6px; } a { color: #0550ae; }
table { border-collapse: collapse; margin: 4px 0 8px; } td, th { padding: 2px 8px; text-align: left; vertical-align: top; }
table.data td, table.data th { border-bottom: 1px solid #e4e4e4; } td.n, th.n { text-align: right; font-variant-numeric: tabular-nums; }
th.sort { cursor: pointer; user-select: none; } th.sort:after { content: " \2195"; color: #999; }
.note { color: #555; } .warn { color: #8a3b00; font-weight: 600; } .missing { color: #8a3b00; }
.panels { display: flex; flex-wrap: wrap; gap: 16px; } .panel h3 { margin: 4px 0; }
.heat td, .heat th { border: 1px solid #fff; padding: 0; font-size: 12px; } .heat th { padding: 2px 4px; background: #f3f3f3; }
.heat th.row { text-align: right; } .heat a.cell { display: block; min-width: 84px; padding: 4px 2px; text-align: center; text-decoration: none; }
.heat a.cell:focus, .heat a.cell:hover { outline: 2px solid #000; } .heat td.off { background: #f7f7f7; color: #777; text-align: center; }
.scale { display: inline-block; width: 200px; height: 12px; vertical-align: middle; border: 1px solid #999; }
.legend span.sw, .sw { display: inline-block; width: 12px; height: 12px; border: 1px solid #666; vertical-align: middle; margin: 0 3px 0 10px; }
.phase { display: grid; grid-template-columns: 110px 250px 1fr; align-items: center; gap: 6px; margin: 2px 0; }
.track { position: relative; height: 20px; background: #f4f4f4; }
.bar { display: flex; height: 100%; } .seg { height: 100%; overflow: hidden; white-space: nowrap; font-size: 11px; line-height: 20px; padding-left: 2px; box-sizing: border-box; }
.ci { position: absolute; top: 9px; height: 2px; background: #000; } .ci:before, .ci:after { content: ""; position: absolute; top: -4px; width: 1px; height: 10px; background: #000; }
.ci:before { left: 0; } .ci:after { right: 0; }
.case { border-top: 2px solid #ddd; margin-top: 24px; } .case:target { background: #fffbe6; }
details > summary { cursor: pointer; } figure.fg { margin: 8px 0; } figure.fg iframe { width: 100%; box-sizing: border-box; border: 1px solid #ddd; }
tr.slower td { background: #fde0dd; } tr.faster td { background: #deebf7; }
"##;

/// What the page does: sortable tables, and flamegraphs unpacked when their case is opened.
/// Each flamegraph is an SVG document of its own in an iframe: inferno's SVGs carry a script
/// that looks its elements up by fixed ids and takes the first `svg` of the document, so two
/// inlined into one page would steer each other. They travel zlib-compressed and base64-coded
/// (a matrix of flamegraphs is tens of MB as text); the script each one carries is kept once
/// per page and put back when it is unpacked. Their URL state (zoom, search) has no URL of its
/// own here, so the history calls that keep it are disabled.
const JS: &str = r##"
function sortBy(th) {
  const table = th.closest('table'), body = table.tBodies[0], col = th.cellIndex;
  const down = th.dataset.dir !== 'down'; th.dataset.dir = down ? 'down' : 'up';
  const key = td => td.dataset.v !== undefined ? parseFloat(td.dataset.v) : td.textContent;
  const rows = Array.from(body.rows);
  rows.sort((a, b) => { const x = key(a.cells[col]), y = key(b.cells[col]);
    const c = typeof x === 'number' ? x - y : String(x).localeCompare(y); return down ? -c : c; });
  rows.forEach(r => body.appendChild(r));
}
document.querySelectorAll('th.sort').forEach(th => th.addEventListener('click', () => sortBy(th)));
async function inflate(b64) {
  const bytes = Uint8Array.from(atob(b64), c => c.charCodeAt(0));
  const stream = new Blob([bytes]).stream().pipeThrough(new DecompressionStream('deflate'));
  return new Response(stream).text();
}
const shared = {};
function script(i) {
  if (!shared[i]) shared[i] = inflate(document.getElementById('fg-script-' + i).dataset.z);
  return shared[i];
}
const GUARD = '<script type="text/ecmascript">history.replaceState = function () {};<\/script>';
async function unpack(fig) {
  if (fig.dataset.state) return;
  fig.dataset.state = 'loading';
  let svg = await inflate(fig.dataset.z);
  const ids = [...svg.matchAll(/<!--dmaprof-script-(\d+)-->/g)].map(m => m[1]);
  for (const i of ids) svg = svg.replace('<!--dmaprof-script-' + i + '-->', GUARD + await script(i));

  const frame = document.createElement('iframe');
  frame.title = fig.dataset.title;
  frame.style.height = (parseInt(fig.dataset.height) + 4) + 'px';
  frame.src = URL.createObjectURL(new Blob([svg], { type: 'image/svg+xml' }));
  fig.appendChild(frame);
  fig.dataset.state = 'shown';
}
function openFlamegraphs(d) { d.querySelectorAll('figure.fg[data-z]').forEach(unpack); }
document.querySelectorAll('details.flamegraphs').forEach(d =>
  d.addEventListener('toggle', () => { if (d.open) openFlamegraphs(d); }));
function openTarget() {
  const id = decodeURIComponent(location.hash.slice(1)), t = id && document.getElementById(id);
  const d = t && (t.matches('details.flamegraphs') ? t : t.querySelector('details.flamegraphs'));
  if (d) d.open = true;
}
window.addEventListener('hashchange', openTarget);
window.addEventListener('load', openTarget);
document.querySelectorAll('details.flamegraphs[open]').forEach(openFlamegraphs);
"##;

/// A whole page around `body`: its title, the style and the script.
pub fn page(title: &str, body: &str, scripts: &SharedScripts) -> String {
    let mut out = String::with_capacity(body.len() + 8192);
    let _ = write!(
        out,
        "<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">\
         <meta name=\"viewport\" content=\"width=device-width, initial-scale=1\">\
         <title>{}</title><style>{CSS}</style></head><body>\n{body}\n{}<script>{JS}</script></body></html>\n",
        esc(title),
        scripts.html()
    );
    out
}

/// zlib-compressed, base64-coded: how flamegraphs travel inside a page.
fn pack(text: &str) -> String {
    base64::engine::general_purpose::STANDARD.encode(miniz_oxide::deflate::compress_to_vec_zlib(text.as_bytes(), 9))
}

/// The scripts the flamegraphs of a page share, each kept once.
#[derive(Default)]
pub struct SharedScripts {
    scripts: Vec<String>,
}

impl SharedScripts {
    /// `svg` with each `<script>` element replaced by a marker naming its shared copy.
    fn take(&mut self, svg: &str) -> String {
        let mut out = String::with_capacity(svg.len());
        let mut rest = svg;
        while let Some(start) = rest.find("<script") {
            let Some(len) = rest[start..].find("</script>") else {
                break;
            };
            let end = start + len + "</script>".len();
            let block = &rest[start..end];
            let i = self.scripts.iter().position(|s| s == block).unwrap_or_else(|| {
                self.scripts.push(block.to_owned());
                self.scripts.len() - 1
            });
            let _ = write!(out, "{}<!--dmaprof-script-{i}-->", &rest[..start]);
            rest = &rest[end..];
        }
        out + rest
    }

    /// The hidden elements that hold the shared scripts.
    fn html(&self) -> String {
        self.scripts
            .iter()
            .enumerate()
            .map(|(i, s)| format!("<div hidden id=\"fg-script-{i}\" data-z=\"{}\"></div>\n", pack(s)))
            .collect()
    }
}

/// A flamegraph figure (unpacked by the page's script when its `details` opens), or a line
/// saying why there is none. Returns the HTML and the packed size.
pub fn flamegraph(label: &str, rel: Option<&str>, svgs: SvgSource, shared: &mut SharedScripts) -> (String, usize) {
    let Some(rel) = rel else {
        return (
            format!(
                "<p class=\"missing\">{}: no flamegraph (nothing was sampled)</p>",
                esc(label)
            ),
            0,
        );
    };
    match svgs(rel) {
        Some(svg) => {
            let z = pack(&shared.take(&scaled(&svg)));
            let n = z.len();
            (
                format!(
                    "<figure class=\"fg\" data-title=\"{0}\" data-height=\"{2}\" data-z=\"{z}\"><figcaption>{0} \
                     <a href=\"{1}\">{1}</a></figcaption></figure>",
                    esc(label),
                    esc(rel),
                    height(&svg)
                ),
                n,
            )
        }
        None => (
            format!(
                "<p class=\"missing\">{}: flamegraph {} is not next to the report</p>",
                esc(label),
                esc(rel)
            ),
            0,
        ),
    }
}

/// The height of an SVG's drawing in pixels (its root's `height`; 400 when it has none).
fn height(svg: &str) -> u32 {
    svg.find("<svg ")
        .and_then(|i| svg[i..].split_once(" height=\""))
        .and_then(|(_, rest)| rest.split('"').next()?.parse().ok())
        .unwrap_or(400)
}

/// An inferno SVG drawn at its own width and scaled to its frame by its viewBox. Left as it is,
/// it measures its frame when it loads and lays itself out for that width; a frame that is not
/// laid out yet measures 0 and the drawing comes out broken (and the console says so).
fn scaled(svg: &str) -> String {
    let Some(start) = svg.find("<svg ") else {
        return svg.to_owned();
    };
    let end = svg[start..].find('>').map_or(svg.len(), |e| start + e);
    let mut root = svg[start..end].to_owned();
    for attr in ["width", "height"] {
        let key = format!(" {attr}=\"");
        if let Some(i) = root.find(&key) {
            let j = root[i + key.len()..]
                .find('"')
                .map_or(root.len(), |j| i + key.len() + j);
            root.replace_range(i + key.len()..j, "100%");
        }
    }
    let text = format!("{}{root}{}", &svg[..start], &svg[end..]);
    text.replacen("var fluiddrawing = true;", "var fluiddrawing = false;", 1)
}

/// A line of coloured boxes naming every category.
pub fn category_legend() -> String {
    let mut out = String::from("<p class=\"legend\">");
    for c in CATEGORIES {
        let _ = write!(
            out,
            "<span class=\"sw\" style=\"background:{}\"></span>{}",
            c.css_color(),
            label(*c)
        );
    }
    out + "</p>"
}

/// A category's name in the exact breakdown (`user` there is what no probe saw).
fn label(c: Category) -> &'static str {
    match c {
        Category::User => "user / unattributed",
        c => c.name(),
    }
}

/// Milliseconds with a unit.
pub fn ms_unit(ns: u64) -> String {
    format!("{} ms", ms(ns))
}

/// A stacked bar of category shares, `width` percent of its track wide, with an optional
/// whisker from `ci.0` to `ci.1` percent.
pub fn stacked_bar(shares: &[(Category, f64, u64)], width: f64, ci: Option<(f64, f64)>) -> String {
    let total: f64 = shares.iter().map(|s| s.1.max(0.0)).sum();
    let mut out = format!("<div class=\"track\"><div class=\"bar\" style=\"width:{width:.2}%\">");
    for (c, share, ns) in shares.iter().filter(|s| s.1 > 0.0) {
        let w = share / total.max(f64::MIN_POSITIVE) * 100.0;
        let text = if w * width / 100.0 >= 9.0 { label(*c) } else { "" };
        let _ = write!(
            out,
            "<span class=\"seg\" style=\"width:{w:.2}%;background:{}\" title=\"{}: {:.1}% ({})\">{text}</span>",
            c.css_color(),
            label(*c),
            share * 100.0,
            ms_unit(*ns)
        );
    }
    out += "</div>";
    if let Some((lo, hi)) = ci {
        let _ = write!(
            out,
            "<div class=\"ci\" style=\"left:{lo:.2}%;width:{:.2}%\"></div>",
            (hi - lo).max(0.2)
        );
    }
    out + "</div>"
}

/// The shares a phase's bar shows: exact (of the wall time less probe cost, `user` being the
/// unattributed rest) where measured, else sampled; with the source's name.
fn phase_shares(p: &PhaseReport) -> (Vec<(Category, f64, u64)>, &'static str) {
    let exact = p.exact.available && p.exact.wall_ns > 0;
    let shares = CATEGORIES
        .iter()
        .map(|c| {
            let s = if exact {
                p.exact.share(*c)
            } else {
                p.sampled.categories.get(c).copied().unwrap_or(0.0)
            };
            (*c, s, (s.max(0.0) * p.wall_ns.median as f64) as u64)
        })
        .filter(|s| s.1 > 0.0005)
        .collect();
    match (exact, p.sampled.samples > 0) {
        (true, _) => (shares, "exact"),
        (false, true) => (shares, "sampled"),
        (false, false) => (Vec::new(), "no breakdown"),
    }
}

/// The largest category of a phase, in words (for the heat map's hover).
fn top_category(p: &PhaseReport) -> String {
    let (shares, source) = phase_shares(p);
    shares.iter().max_by(|a, b| a.1.total_cmp(&b.1)).map_or_else(
        || source.to_owned(),
        |(c, s, _)| format!("{} {:.0}% ({source})", label(*c), s * 100.0),
    )
}

/// The run's page: `index.html`.
pub fn index(report: &Report, svgs: SvgSource) -> String {
    let mut shared = SharedScripts::default();
    let mut body = header(report);
    body += &kernel_and_probes(&report.kernel, &report.probes);
    body += &findings(report);
    body += &heat_map(report);
    body += "<h2 id=\"cases\">Cases</h2>\n";
    body += &category_legend();
    for case in &report.cases {
        body += &case_section(case, svgs, &mut shared);
    }
    body += &not_run(report);
    let title = format!("dmaprof: Linux {}, {} cases", report.kernel.release, report.cases.len());
    page(&title, &body, &shared)
}

fn header(report: &Report) -> String {
    let k = &report.kernel;
    let c = &report.config;
    let mut out = format!(
        "<h1>dmaprof report: Linux {}</h1>\n<p>{} {} · dmaprof {} · {} per case · {} untraced + {} traced \
         iterations per pass · passes {} · device {}</p>\n",
        esc(&k.release),
        esc(&k.version),
        esc(&k.machine),
        esc(&report.dmaprof_version),
        HumanSize(c.size_bytes),
        c.iterations,
        c.traced_iterations,
        c.passes.iter().map(ToString::to_string).collect::<Vec<_>>().join(", "),
        esc(report.device.as_deref().unwrap_or("none")),
    );
    if let Some(f) = &report.floors {
        let _ = writeln!(
            out,
            "<p title=\"{}; {}; {}\">This machine's floors: clears memory at {:.2} GiB/s, a 4 KiB fault takes {}, \
             an empty VFIO ioctl {}</p>",
            esc(&f.clear_how),
            esc(&f.fault_how),
            esc(&f.ioctl_how),
            f.clear_gib_per_s,
            f.fault_4k_ns.map_or("-".into(), |n| format!("{n} ns")),
            f.empty_ioctl_ns.map_or("- (no VFIO)".into(), |n| format!("{n} ns"))
        );
    }
    if let Some(line) = crate::table::pace_line(report) {
        let _ = writeln!(
            out,
            "<p title=\"{}\">{}</p>",
            esc(&crate::floors::Pace::how()),
            esc(&line)
        );
    }
    if report.partial {
        out += "<p class=\"warn\">Interrupted: this report covers only the cases that finished.</p>\n";
    }
    out
}

/// How many findings are listed before the rest fold away (the heat map stays near the top).
const SHOWN_FINDINGS: usize = 5;

/// The findings of `dmaprof explain`, largest first, each opening to why, evidence and fix.
fn findings(report: &Report) -> String {
    let e = explain::explain(report);
    let mut out = String::from("<h2 id=\"findings\">Findings</h2>\n");
    if e.findings.is_empty() {
        out += "<p>Nothing stands out (no rule fired on these numbers).</p>\n";
    }
    for (i, f) in e.findings.iter().enumerate() {
        if i == SHOWN_FINDINGS {
            let _ = write!(out, "<details><summary>{} more</summary>", e.findings.len() - i);
        }
        let _ = writeln!(
            out,
            "<details><summary><a href=\"#{}\">{}</a> {}: {} ({} at stake)</summary>\
             <p><b>Why:</b> {}<br><b>Evidence:</b> {}<br><b>Fix:</b> {}</p></details>",
            esc(&case_id(&f.case)),
            esc(&f.case),
            f.phase.name(),
            esc(&f.what),
            ms_unit(f.ns),
            esc(&f.why),
            esc(&f.evidence),
            esc(&f.fix)
        );
    }
    if e.findings.len() > SHOWN_FINDINGS {
        out += "</details>\n";
    }
    if !e.checks.is_empty() {
        out += "<p><b>Read with care:</b></p><ul>";
        for c in &e.checks {
            let _ = write!(out, "<li>{}</li>", esc(c));
        }
        out += "</ul>\n";
    }
    out
}

/// The colour of `t` in 0..=1 on a viridis scale (light yellow = fast, dark purple = slow:
/// perceptually even and readable with the common colour-vision deficiencies), and a text
/// colour that reads on it.
fn heat_color(t: f64) -> (String, &'static str) {
    const STOPS: [(f64, f64, f64); 5] = [
        (253.0, 231.0, 37.0),
        (94.0, 201.0, 98.0),
        (33.0, 145.0, 140.0),
        (59.0, 82.0, 139.0),
        (68.0, 1.0, 84.0),
    ];
    let x = t.clamp(0.0, 1.0) * (STOPS.len() - 1) as f64;
    let i = (x.floor() as usize).min(STOPS.len() - 2);
    let f = x - i as f64;
    let (a, b) = (STOPS[i], STOPS[i + 1]);
    let mix = |p: f64, q: f64| (p + (q - p) * f).round() as u8;
    let css = format!("#{:02x}{:02x}{:02x}", mix(a.0, b.0), mix(a.1, b.1), mix(a.2, b.2));
    (css, if t > 0.45 { "#fff" } else { "#000" })
}

/// The phase a case's heat-map cell shows: the map, or for memory-only cases none.
fn map_phase(case: &CaseReport) -> Option<&PhaseReport> {
    case.phases.iter().find(|p| p.name == Phase::Map)
}

/// Where map medians sit on the log scale: (ln min, ln max).
fn log_range(report: &Report) -> Option<(f64, f64)> {
    let logs: Vec<f64> = report
        .cases
        .iter()
        .filter_map(map_phase)
        .map(|p| (p.wall_ns.median.max(1) as f64).ln())
        .collect();
    let lo = logs.iter().copied().reduce(f64::min)?;
    let hi = logs.iter().copied().reduce(f64::max)?;
    Some((lo, hi))
}

fn heat_map(report: &Report) -> String {
    let mut out = String::from(
        "<h2 id=\"heatmap\">DMA map time across the matrix</h2>\n<p>Untraced median of the map phase \
         (colour on a log scale); each cell opens its case. ",
    );
    if let Some((lo, hi)) = log_range(report) {
        let stops: Vec<String> = (0..=4).map(|i| heat_color(f64::from(i) / 4.0).0).collect();
        let _ = write!(
            out,
            "{} <span class=\"scale\" style=\"background:linear-gradient(to right,{})\"></span> {}",
            ms_unit(lo.exp().round() as u64),
            stops.join(","),
            ms_unit(hi.exp().round() as u64)
        );
    }
    out += "</p>\n<div class=\"panels\">\n";
    let cases = matrix::all_cases();
    let listed = |name: &str| {
        report.cases.iter().any(|c| c.name == name)
            || report.skipped.iter().any(|s| s.name == name)
            || report.failed.iter().any(|f| f.name == name)
    };
    let shown: Vec<&matrix::Case> = cases.iter().filter(|c| listed(&c.name())).collect();
    for prefault in <Prefault as strum::IntoEnumIterator>::iter() {
        let in_panel: Vec<&&matrix::Case> = shown.iter().filter(|c| c.prefault == prefault).collect();
        if in_panel.is_empty() {
            continue;
        }
        out += &heat_panel(report, prefault, &in_panel);
    }
    out + "</div>\n"
}

/// One prefault's panel: IOMMU modes down, backings across.
fn heat_panel(report: &Report, prefault: Prefault, cases: &[&&matrix::Case]) -> String {
    let mut modes: Vec<Option<DmaMode>> = Vec::new();
    let mut backings: Vec<Backing> = Vec::new();
    for c in cases {
        if !modes.contains(&c.mode) {
            modes.push(c.mode);
        }
        if !backings.contains(&c.backing) {
            backings.push(c.backing);
        }
    }
    let mut out = format!(
        "<div class=\"panel\"><h3>prefault: {}</h3><table class=\"heat\"><tr><th></th>",
        prefault.name()
    );
    for b in &backings {
        let _ = write!(out, "<th>{}</th>", b.name().replace('_', " "));
    }
    out += "</tr>\n";
    for mode in &modes {
        let _ = write!(out, "<tr><th class=\"row\">{}</th>", matrix::mode_name(*mode));
        for backing in &backings {
            let case = matrix::Case {
                mode: *mode,
                backing: *backing,
                prefault,
            };
            out += &heat_cell(report, &case.name());
        }
        out += "</tr>\n";
    }
    out + "</table></div>\n"
}

fn heat_cell(report: &Report, name: &str) -> String {
    if let Some(f) = report.failed.iter().find(|f| f.name == name) {
        return format!("<td class=\"off\" title=\"{}\">failed</td>", esc(&f.error));
    }
    // In a size sweep the cell is the case at its largest size.
    let Some(case) = report
        .cases
        .iter()
        .filter(|c| crate::sweep::base_name(&c.name) == name)
        .max_by_key(|c| c.size_bytes)
    else {
        return match report.skipped.iter().find(|s| s.name == name) {
            Some(s) => format!(
                "<td class=\"off\" title=\"{}: {}\">skipped</td>",
                esc(name),
                esc(&s.reason)
            ),
            None => "<td class=\"off\">-</td>".to_owned(),
        };
    };
    let href = esc(&case_id(name));
    let Some(p) = map_phase(case) else {
        let total: u64 = case.phases.iter().map(|p| p.wall_ns.median).sum();
        return format!(
            "<td><a class=\"cell\" href=\"#{href}\" style=\"background:#eee;color:#000\" \
             title=\"{}: memory phases only, {} in all\">no map<br>{}</a></td>",
            esc(name),
            ms_unit(total),
            ms_unit(total)
        );
    };
    let t = log_range(report).map_or(0.0, |(lo, hi)| {
        if hi > lo {
            ((p.wall_ns.median.max(1) as f64).ln() - lo) / (hi - lo)
        } else {
            0.5
        }
    });
    let (bg, fg) = heat_color(t);
    format!(
        "<td><a class=\"cell\" href=\"#{href}\" style=\"background:{bg};color:{fg}\" \
         title=\"{}&#10;map {} ({:.2} GiB/s){}&#10;top: {}\">{}<br>{:.2} GiB/s</a></td>",
        esc(name),
        ms_unit(p.wall_ns.median),
        p.gib_per_s,
        ci_text(p),
        esc(&top_category(p)),
        ms_unit(p.wall_ns.median),
        p.gib_per_s
    )
}

/// The confidence interval of a phase's median, in words (empty without one).
fn ci_text(p: &PhaseReport) -> String {
    p.wall_ci.map_or(String::new(), |ci| {
        format!(", {:.0}% CI {}-{}", ci.level * 100.0, ms(ci.low), ms_unit(ci.high))
    })
}

fn case_section(case: &CaseReport, svgs: SvgSource, shared: &mut SharedScripts) -> String {
    let mut out = format!(
        "<section class=\"case\" id=\"{}\"><h3>{} <a href=\"#heatmap\" title=\"back to the heat map\">&#8593;</a></h3>\n\
         <p class=\"note\">IOMMU mode {} · backing {} · prefault {} · {} · {}, {} pages</p>\n",
        esc(&case_id(&case.name)),
        esc(&case.name),
        matrix::mode_name(case.iommu_mode),
        case.backing.name(),
        case.prefault.name(),
        esc(case.map_ioctl.as_deref().unwrap_or("no DMA map")),
        HumanSize(case.size_bytes),
        HumanSize(case.page_size)
    );
    out += &phase_bars(case);
    for (_, line) in crate::report::describe_demoted(&case.demoted) {
        let _ = writeln!(out, "<p class=\"note\">{}</p>", esc(&line));
    }
    out += &rows_table(case);
    if case.name.contains('@')
        && let Some(plot) = svgs(&format!("{}/sweep.svg", crate::sweep::base_name(&case.name)))
    {
        // A static picture (no script, no ids): safe to inline as it is.
        let _ = writeln!(
            out,
            "<figure class=\"sweep\"><figcaption>time against size</figcaption>{plot}</figure>"
        );
    }
    out += &case_flamegraphs(case, svgs, shared);
    out + "</section>\n"
}

/// A bar per phase on one scale (the case's slowest phase fills the track), with its
/// untraced median, the interval of that median, and its split by category.
fn phase_bars(case: &CaseReport) -> String {
    let longest = case
        .phases
        .iter()
        .map(|p| p.wall_ci.map_or(p.wall_ns.median, |c| c.high).max(p.wall_ns.median))
        .max()
        .unwrap_or(1)
        .max(1) as f64;
    let pct = |ns: u64| ns as f64 / longest * 100.0;
    let mut out = String::from("<div class=\"phases\">\n");
    for p in &case.phases {
        let (shares, source) = phase_shares(p);
        let ci = p.wall_ci.map(|c| (pct(c.low), pct(c.high)));
        let _ = writeln!(
            out,
            "<div class=\"phase\"><b>{}</b><span>{}{} · {:.2} GiB/s · <span class=\"note\">{source}</span></span>{}</div>",
            p.name.name(),
            ms_unit(p.wall_ns.median),
            esc(&ci_text(p)),
            p.gib_per_s,
            stacked_bar(&shares, pct(p.wall_ns.median), ci)
        );
    }
    out + "</div>\n"
}

fn rows_table(case: &CaseReport) -> String {
    let rows: Vec<(Phase, &crate::report::ExactRow)> = case
        .phases
        .iter()
        .flat_map(|p| p.exact.rows.iter().map(move |r| (p.name, r)))
        .filter(|(_, r)| r.calls > 0 || r.demoted)
        .collect();
    if rows.is_empty() {
        return "<p class=\"note\">No exact rows (no exact pass, or no probe-table row was hit).</p>\n".into();
    }
    let mut out = format!(
        "<details open><summary>Exact rows ({}; click a heading to sort)</summary><table class=\"data\"><thead><tr>",
        rows.len()
    );
    for (h, numeric) in [
        ("phase", false),
        ("function", false),
        ("category", false),
        ("by", false),
        ("calls", true),
        ("inclusive ms", true),
        ("exclusive ms", true),
        ("probe cost ms", true),
        ("amount", true),
    ] {
        let _ = write!(out, "<th class=\"sort{}\">{h}</th>", if numeric { " n" } else { "" });
    }
    out += "</tr></thead><tbody>\n";
    for (phase, r) in rows {
        let num = |ns: u64| format!("<td class=\"n\" data-v=\"{ns}\">{}</td>", ms(ns));
        let _ = writeln!(
            out,
            "<tr><td>{}</td><td>{}{}</td><td><span class=\"sw\" style=\"background:{}\"></span>{}</td><td>{}</td>\
             <td class=\"n\" data-v=\"{}\">{}</td>{}{}{}<td class=\"n\" data-v=\"{}\">{}</td></tr>",
            phase.name(),
            esc(&r.function),
            if r.demoted {
                " <i>(demoted: counted by the scout)</i>"
            } else {
                ""
            },
            r.category.css_color(),
            r.category.name(),
            r.mechanism,
            r.calls,
            r.calls,
            num(r.inclusive_ns),
            num(r.exclusive_ns),
            num(r.overhead_ns),
            r.amount,
            amount(r)
        );
    }
    out + "</tbody></table></details>\n"
}

/// A row's summed size argument in its unit (bytes as a size).
fn amount(r: &crate::report::ExactRow) -> String {
    match r.unit {
        Some(crate::probes::AmountUnit::Bytes) => HumanSize(r.amount).to_string(),
        Some(u) => format!("{} {}", r.amount, <&str>::from(u)),
        None if r.amount == 0 => String::new(),
        None => r.amount.to_string(),
    }
}

fn case_flamegraphs(case: &CaseReport, svgs: SvgSource, shared: &mut SharedScripts) -> String {
    let mut figures = String::new();
    let mut bytes = 0;
    for p in &case.phases {
        let (html, n) = flamegraph(
            &format!("{}: sampled stacks", p.name.name()),
            p.flamegraph.as_deref(),
            svgs,
            shared,
        );
        figures += &html;
        bytes += n;
    }
    if let Some(summary) = case.summary_flamegraph.as_deref() {
        let (html, n) = flamegraph(
            "summary: exact time, phase -> category -> function",
            Some(summary),
            svgs,
            shared,
        );
        figures += &html;
        bytes += n;
    }
    format!(
        "<details class=\"flamegraphs\" id=\"fg-{}\"><summary>Flamegraphs ({} KiB packed; opened on demand; \
         click a frame to zoom, Search at the top right)</summary>\n{figures}</details>\n",
        esc(&case.name),
        bytes / 1024
    )
}

fn not_run(report: &Report) -> String {
    let mut out = String::new();
    if !report.failed.is_empty() {
        out += "<h2 id=\"failed\">Failed</h2><ul>";
        for f in &report.failed {
            let _ = write!(out, "<li>{}: {}</li>", esc(&f.name), esc(&f.error));
        }
        out += "</ul>\n";
    }
    if !report.skipped.is_empty() {
        out += "<h2 id=\"skipped\">Skipped</h2><ul>";
        for s in &report.skipped {
            let _ = write!(out, "<li>{}: {}</li>", esc(&s.name), esc(&s.reason));
        }
        out += "</ul>\n";
    }
    out
}

/// The kernel's features and the probes: what attached and what did not, and why.
fn kernel_and_probes(k: &crate::facts::KernelInfo, probe_status: &[ProbeStatus]) -> String {
    let with = |p: Option<bool>| {
        let v: Vec<&str> = k
            .features
            .iter()
            .filter(|f| f.present == p)
            .map(|f| f.id.name())
            .collect();
        if v.is_empty() { "none".to_owned() } else { v.join(", ") }
    };
    let mut out = format!(
        "<h2 id=\"kernel\">Kernel</h2>\n<p>Has: {}. Lacks: {}.</p>\n<details><summary>Features: what each \
         changes, since when, and the evidence</summary><table class=\"data\"><thead><tr><th>feature</th>\
         <th>has it</th><th>since</th><th>what it changes</th><th>evidence</th></tr></thead><tbody>\n",
        with(Some(true)),
        with(Some(false))
    );
    for f in &k.features {
        let _ = writeln!(
            out,
            "<tr><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td></tr>",
            f.id.name(),
            f.present.map_or("unknown", |p| if p { "yes" } else { "no" }),
            esc(&f.since),
            esc(&f.effect),
            esc(&f.evidence)
        );
    }
    out += "</tbody></table></details>\n";
    out + &probes(probe_status)
}

fn probes(status: &[ProbeStatus]) -> String {
    let (on, off): (Vec<_>, Vec<_>) = status.iter().partition(|p| p.attached);
    let mut by: Vec<(String, usize)> = Vec::new();
    for p in &on {
        let m = p.mechanism.to_string();
        match by.iter_mut().find(|(n, _)| *n == m) {
            Some((_, k)) => *k += 1,
            None => by.push((m, 1)),
        }
    }
    let mut out = format!(
        "<h2 id=\"probes\">Probes</h2>\n<p>{} attached ({}); {} did not.</p>\n<details><summary>Attached</summary><p>{}</p></details>\n",
        on.len(),
        by.iter()
            .map(|(m, k)| format!("{k} {m}"))
            .collect::<Vec<_>>()
            .join(", "),
        off.len(),
        on.iter()
            .map(|p| format!("{} ({})", esc(&p.function), p.mechanism))
            .collect::<Vec<_>>()
            .join(", ")
    );
    if !off.is_empty() {
        out += "<details open><summary>Not attached, and why</summary><table class=\"data\"><tbody>";
        for p in off {
            let _ = write!(
                out,
                "<tr><td>{}</td><td>{}</td><td>{}</td></tr>",
                esc(&p.function),
                p.mechanism,
                esc(p.error.as_deref().unwrap_or(""))
            );
        }
        out += "</tbody></table></details>\n";
    }
    out
}

/// The categories of a recorded time, largest first, with what no probe saw as `other`.
fn call_shares(
    categories: Option<&std::collections::BTreeMap<Category, u64>>,
    total_ns: u64,
) -> Vec<(Category, f64, u64)> {
    let Some(c) = categories else { return Vec::new() };
    let seen: u64 = c.values().sum();
    let mut out: Vec<(Category, f64, u64)> = c
        .iter()
        .map(|(cat, ns)| (*cat, *ns as f64 / total_ns.max(1) as f64, *ns))
        .collect();
    let rest = total_ns.saturating_sub(seen);
    if rest > 0 {
        match out.iter_mut().find(|s| s.0 == Category::Other) {
            Some(o) => (o.1, o.2) = (o.1 + rest as f64 / total_ns as f64, o.2 + rest),
            None => out.push((Category::Other, rest as f64 / total_ns as f64, rest)),
        }
    }
    out.sort_by_key(|s| std::cmp::Reverse(s.2));
    out
}

fn record_header(r: &RecordReport) -> String {
    let what = match r.process.command.is_empty() {
        true => format!("pids {:?}", r.process.pids),
        false => r.process.command.join(" "),
    };
    let mut out = format!(
        "<h1>dmaprof record: {}</h1>\n<p>Linux {}; recorded {:.3} s; {} DMA ioctls",
        esc(&what),
        esc(&r.kernel.release),
        r.duration_ns as f64 / 1e9,
        r.calls.len()
    );
    if let Some(f) = r.cpu_faults {
        let _ = write!(out, "; {f} CPU page faults of the processes");
    }
    out += ".</p>\n";
    if r.partial || r.lost > 0 || r.unaccounted > 0 {
        let _ = writeln!(
            out,
            "<p class=\"warn\">{}{} calls lost (ring buffer full); {} probed calls unaccounted.</p>",
            if r.partial { "Stopped early (partial). " } else { "" },
            r.lost,
            r.unaccounted
        );
    }
    out
}

fn record_kinds(r: &RecordReport) -> String {
    let widest = r.by_kind.iter().map(|k| k.total_ns).max().unwrap_or(1).max(1);
    let mut out = String::from(
        "<h2 id=\"kinds\">By ioctl</h2>\n<table class=\"data\"><thead><tr><th class=\"sort\">ioctl</th>\
         <th class=\"n sort\">calls</th><th class=\"n sort\">failed</th><th class=\"n sort\">total ms</th>\
         <th class=\"n sort\">median ms</th><th class=\"n sort\">max ms</th><th class=\"n sort\">MiB</th>\
         <th style=\"width:40%\">where the time went</th></tr></thead><tbody>\n",
    );
    for k in &r.by_kind {
        let _ = writeln!(
            out,
            "<tr><td>{}</td><td class=\"n\">{}</td><td class=\"n\">{}</td><td class=\"n\" data-v=\"{}\">{}</td>\
             <td class=\"n\">{}</td><td class=\"n\">{}</td><td class=\"n\">{:.1}</td><td>{}</td></tr>",
            k.kind,
            k.count,
            k.failed,
            k.total_ns,
            ms(k.total_ns),
            ms(k.median_ns),
            ms(k.max_ns),
            k.bytes as f64 / (1u64 << 20) as f64,
            stacked_bar(
                &call_shares(k.categories.as_ref(), k.total_ns),
                k.total_ns as f64 / widest as f64 * 100.0,
                None
            )
        );
    }
    out + "</tbody></table>\n"
}

fn record_calls(r: &RecordReport) -> String {
    let widest = r.top.iter().map(|c| c.duration_ns).max().unwrap_or(1).max(1);
    let mut out = String::from(
        "<h2 id=\"top\">Longest calls</h2>\n<table class=\"data\"><thead><tr><th class=\"n sort\">start ms</th>\
         <th class=\"n sort\">tid</th><th class=\"sort\">ioctl</th><th>iova</th><th class=\"n sort\">MiB</th>\
         <th class=\"n sort\">ms</th><th class=\"n\">ret</th><th style=\"width:36%\">where the time went</th>\
         </tr></thead><tbody>\n",
    );
    for c in &r.top {
        out += &call_row(c, widest);
    }
    out + "</tbody></table>\n"
}

fn call_row(c: &Call, widest: u64) -> String {
    format!(
        "<tr><td class=\"n\" data-v=\"{}\">{}</td><td class=\"n\">{}</td><td>{}</td><td>0x{:x}</td>\
         <td class=\"n\">{:.1}</td><td class=\"n\" data-v=\"{}\">{}</td><td class=\"n\">{}</td><td>{}</td></tr>\n",
        c.start_ns,
        ms(c.start_ns),
        c.tid,
        c.kind,
        c.iova,
        c.size as f64 / (1u64 << 20) as f64,
        c.duration_ns,
        ms(c.duration_ns),
        c.ret,
        stacked_bar(
            &call_shares(c.categories.as_ref(), c.duration_ns),
            c.duration_ns as f64 / widest as f64 * 100.0,
            None
        )
    )
}

fn record_functions(r: &RecordReport) -> String {
    let mut out = String::from(
        "<h2 id=\"functions\">Probed functions inside the calls</h2>\n<table class=\"data\"><thead><tr>\
         <th class=\"sort\">function</th><th class=\"sort\">category</th><th class=\"n sort\">calls</th>\
         <th class=\"n sort\">exclusive ms</th><th class=\"n sort\">inclusive ms</th></tr></thead><tbody>\n",
    );
    for row in &r.rows {
        let _ = writeln!(
            out,
            "<tr><td>{}</td><td><span class=\"sw\" style=\"background:{}\"></span>{}</td><td class=\"n\">{}</td>\
             <td class=\"n\" data-v=\"{}\">{}</td><td class=\"n\" data-v=\"{}\">{}</td></tr>",
            esc(&row.function),
            row.category.css_color(),
            label(row.category),
            row.calls,
            row.exclusive_ns,
            ms(row.exclusive_ns),
            row.inclusive_ns,
            ms(row.inclusive_ns)
        );
    }
    out + "</tbody></table>\n"
}

/// The HTML page of a `record` report: the ioctls by kind, the longest calls, each with where
/// its time went, and the probed functions.
pub fn record_index(r: &RecordReport, svgs: SvgSource) -> String {
    let mut shared = SharedScripts::default();
    let mut body = record_header(r);
    body += &category_legend();
    body += &record_kinds(r);
    body += &record_calls(r);
    body += &record_sampled(r, svgs, &mut shared);
    body += &record_functions(r);
    body += &kernel_and_probes(&r.kernel, &r.probes);
    let title = format!("dmaprof record: {} DMA ioctls", r.calls.len());
    page(&title, &body, &shared)
}

/// The sampled shares inside and outside the DMA ioctls, each with its flamegraph.
fn record_sampled(r: &RecordReport, svgs: SvgSource, shared: &mut SharedScripts) -> String {
    let Some(s) = &r.sampled else {
        return String::new();
    };
    let mut out = format!(
        "<h2 id=\"sampled\">Sampled stacks</h2>\n<p class=\"note\">{} Hz on every CPU; the watched processes' \
         samples, split by whether their thread was inside a DMA ioctl.</p>\n<details class=\"flamegraphs\" open>\
         <summary>Flamegraphs</summary>\n",
        s.freq_hz
    );
    for (what, stem, x) in [
        ("inside the DMA ioctls", "in_calls", &s.in_calls),
        ("outside them", "outside", &s.outside),
    ] {
        // The CPU time a share stands for: samples over the frequency.
        let cpu_ns = |v: f64| (v * x.samples as f64 / s.freq_hz.max(1) as f64 * 1e9) as u64;
        let shares: Vec<(Category, f64, u64)> = x.categories.iter().map(|(c, v)| (*c, *v, cpu_ns(*v))).collect();
        let _ = write!(
            out,
            "<div class=\"phase\"><span>{what}</span><span class=\"n\">{} samples</span>{}</div>",
            x.samples,
            stacked_bar(&shares, 100.0, None)
        );
        let rel = format!("{stem}.svg");
        let (fig, _) = flamegraph(what, (x.samples > 0).then_some(rel.as_str()), svgs, shared);
        out += &fig;
    }
    out + "</details>\n"
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::flamegraph::Folded;

    const MATRIX: &str = include_str!("../tests/data/matrix-7.3.json");

    fn fixture() -> Report {
        crate::report::parse(MATRIX).expect("the saved report parses")
    }

    /// The values of `attr="..."` in `html`.
    fn attrs<'a>(html: &'a str, attr: &str) -> Vec<&'a str> {
        let key = format!(" {attr}=\"");
        html.match_indices(&key)
            .map(|(i, _)| {
                let rest = &html[i + key.len()..];
                &rest[..rest.find('"').unwrap()]
            })
            .collect()
    }

    #[test]
    fn one_heat_map_cell_per_case_and_each_opens_its_case() {
        let r = fixture();
        let html = index(&r, &|_| None);
        let cells = html.matches("class=\"cell\"").count();
        assert_eq!(cells, r.cases.len(), "one cell per case");
        let ids = attrs(&html, "id");
        let hrefs: Vec<&str> = attrs(&html, "href")
            .into_iter()
            .filter_map(|h| h.strip_prefix('#'))
            .collect();
        for h in &hrefs {
            assert!(ids.contains(h), "anchor #{h} has no target");
        }
        for c in &r.cases {
            let id = esc(&case_id(&c.name));
            assert!(hrefs.contains(&id.as_str()), "no cell links {id}");
            assert!(
                html.contains(&format!("id=\"fg-{}\"", c.name)),
                "{} has no flamegraph container",
                c.name
            );
        }
        // Every ran case of the fixture is a DMA case: each cell shows a map time and a rate.
        assert_eq!(html.matches(" GiB/s</a></td>").count(), r.cases.len());
    }

    #[test]
    fn nothing_is_fetched_and_the_structure_closes() {
        let html = index(&fixture(), &|_| None);
        assert!(html.starts_with("<!DOCTYPE html>") && html.trim_end().ends_with("</html>"));
        assert!(!html.contains("http"), "no URL of any kind without flamegraphs");
        for tag in ["section", "details", "table", "div", "figure", "ul", "style"] {
            assert_eq!(
                html.matches(&format!("<{tag}")).count() - html.matches(&format!("<{tag}s")).count(),
                html.matches(&format!("</{tag}>")).count(),
                "<{tag}> opened and closed alike"
            );
        }
        // One inline script (the other `<script` is a string in it, closed as `<\/script>`).
        assert_eq!(
            (html.matches("<script>").count(), html.matches("</script>").count()),
            (1, 1)
        );
        assert!(html.contains("flamegraph") && html.contains("is not next to the report"));
        assert!(html.contains("Findings") && html.contains("Kernel") && html.contains("Not attached"));
    }

    #[test]
    fn flamegraphs_travel_packed_with_their_script_kept_once() {
        let r = fixture();
        let dir = std::env::temp_dir().join(format!("dmaprof-html-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let mut f = Folded::default();
        f.add(["map", "pin_user_pages_remote", "clear_page_erms"], 5);
        f.write(&dir, "x", "test").unwrap();
        let svg = std::fs::read_to_string(dir.join("x.svg")).unwrap();
        std::fs::remove_dir_all(&dir).unwrap();
        let html = index(&r, &|_| Some(svg.clone()));
        let figures = attrs(&html, "data-z");
        let expected: usize = r
            .cases
            .iter()
            .map(|c| {
                c.phases.iter().filter(|p| p.flamegraph.is_some()).count() + usize::from(c.summary_flamegraph.is_some())
            })
            .sum();
        // The figures plus the one shared script.
        assert_eq!(figures.len(), expected + 1);
        assert!(html.contains("id=\"fg-script-0\"") && !html.contains("id=\"fg-script-1\""));
        let unpack = |z: &str| {
            let bytes = base64::engine::general_purpose::STANDARD.decode(z).unwrap();
            String::from_utf8(miniz_oxide::inflate::decompress_to_vec_zlib(&bytes).unwrap()).unwrap()
        };
        let first = unpack(figures[0]);
        let script = unpack(figures.last().unwrap());
        assert!(first.contains("<!--dmaprof-script-0-->") && !first.contains("<script"));
        assert_eq!(first.replace("<!--dmaprof-script-0-->", &script), scaled(&svg));
        assert!(scaled(&svg).contains("width=\"100%\"") && scaled(&svg).contains("fluiddrawing = false"));
        assert_eq!(height(&svg).to_string(), attrs(&svg, "height")[0]);
        let urls: Vec<&str> = html.match_indices("http").map(|(i, _)| &html[i..i + 30]).collect();
        assert!(urls.is_empty(), "packed flamegraphs hide their namespaces: {urls:?}");
    }

    #[test]
    fn text_is_escaped() {
        assert_eq!(esc("<a href=\"x\">&'"), "&lt;a href=&quot;x&quot;&gt;&amp;&#39;");
    }
}
