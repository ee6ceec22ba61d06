//! The HTML report in a real browser: Debian's headless chromium loads the page `dmaprof report
//! --html` writes for the saved matrix (with a flamegraph for every sampled phase), and the test
//! reads back the DOM the page's script built, drives an embedded flamegraph (search, zoom),
//! checks the console stayed quiet, and saves a screenshot next to the report.
//!
//! Without chromium the test says SKIP and why; `cargo xtask setup` installs it.
use std::{
    fs,
    path::{Path, PathBuf},
    process::Command,
};

use profiler::{flamegraph::Folded, report};

/// How long one browser run may take: its virtual clock runs ahead of the real one while the
/// page waits, this is the real time it may spend.
const BROWSER_TIMEOUT_S: &str = "120";

fn chromium() -> Option<PathBuf> {
    ["/usr/bin/chromium", "/usr/bin/chromium-browser"]
        .iter()
        .map(PathBuf::from)
        .find(|p| p.exists())
}

/// Writes the report's folded stacks and flamegraphs (the saved matrix keeps only the JSON):
/// a few stacks per phase, so every figure has frames to search and zoom into.
fn write_flamegraphs(dir: &Path, r: &report::Report) {
    for case in &r.cases {
        let case_dir = dir.join(&case.name);
        fs::create_dir_all(&case_dir).unwrap();
        let stems = case
            .phases
            .iter()
            .filter(|p| p.flamegraph.is_some())
            .map(|p| p.name.name())
            .chain(case.summary_flamegraph.as_ref().map(|_| "summary"));
        for stem in stems {
            let mut f = Folded::default();
            let sys = [stem, "entry_SYSCALL_64", "do_syscall_64"];
            f.add(
                sys.iter()
                    .chain(&["pin_user_pages_remote", "handle_mm_fault", "clear_page_erms"]),
                7,
            );
            f.add(sys.iter().chain(&["iommu_map", "intel_iommu_map_pages"]), 3);
            f.add([stem, "[user]"], 1);
            f.write(&case_dir, stem, &format!("{}: {stem}", case.name)).unwrap();
        }
    }
}

/// Runs headless chromium on `url` with `args`; returns (stdout, the console lines).
fn browse(chromium: &Path, url: &str, args: &[&str]) -> (String, Vec<String>) {
    let out = Command::new("timeout")
        .arg(BROWSER_TIMEOUT_S)
        .arg(chromium)
        // Root has no sandbox to run in.
        .args([
            "--headless",
            "--no-sandbox",
            "--disable-gpu",
            "--enable-logging=stderr",
            "--v=0",
        ])
        .args(["--window-size=1280,800", "--virtual-time-budget=10000"])
        .args(args)
        .arg(url)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "chromium failed ({}): {}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    let console = String::from_utf8_lossy(&out.stderr)
        .lines()
        .filter(|l| l.contains("CONSOLE") || l.contains("Uncaught"))
        .map(str::to_owned)
        .collect();
    (String::from_utf8_lossy(&out.stdout).into_owned(), console)
}

/// A page that opens the report at `#case-<case>` in a frame, then searches and zooms in that
/// case's first flamegraph, sorts its exact rows by calls, and writes what it saw into `#out` (the frames are all file: and
/// blob: documents of one origin with --allow-file-access-from-files).
fn harness(case: &str) -> String {
    format!(
        r#"<!DOCTYPE html><html><body><pre id="out">not run</pre>
<iframe id="page" style="width:1280px;height:800px" src="index.html#case-{case}"></iframe>
<script>
setTimeout(() => {{
  const out = [], page = document.getElementById('page').contentDocument;
  const figs = page.querySelectorAll('#fg-' + CSS.escape('{case}') + ' figure.fg');
  const frames = page.querySelectorAll('#fg-' + CSS.escape('{case}') + ' figure.fg iframe');
  out.push('figures ' + figs.length + ' frames ' + frames.length);
  const w = frames[0].contentWindow, d = frames[0].contentDocument;
  w.search('clear_page');
  out.push('search ' + d.getElementById('matched').textContent);
  const leaf = [...d.querySelectorAll('#frames > g')].find(g => g.textContent.includes('handle_mm_fault'));
  leaf.dispatchEvent(new MouseEvent('click', {{ bubbles: true }}));
  out.push('zoomed ' + !d.getElementById('unzoom').classList.contains('hide'));
  const table = page.querySelector('#case-' + CSS.escape('{case}') + ' table.data');
  const calls = [...table.tHead.rows[0].cells].findIndex(th => th.textContent === 'calls');
  table.tHead.rows[0].cells[calls].click();
  const v = [...table.tBodies[0].rows].map(r => parseFloat(r.cells[calls].dataset.v));
  out.push('sorted ' + (v.length > 1 && v.every((x, i) => i === 0 || v[i - 1] >= x)));
  document.getElementById('out').textContent = out.join('\n');
}}, 3000);
</script></body></html>"#
    )
}

/// A page that shows the report scrolled to its heat map (a screenshot of a page opened at an
/// anchor comes out blank in headless chromium; one of a frame at that anchor does not).
const HEAT_MAP: &str = r#"<!DOCTYPE html><html><body style="margin:0">
<iframe style="display:block;width:1280px;height:800px;border:0" src="index.html#heatmap"></iframe></body></html>"#;

#[test]
fn the_html_report_works_in_a_browser() {
    let dir = std::env::temp_dir().join(format!("dmaprof-test-browser-{}", std::process::id()));
    let _ = fs::remove_dir_all(&dir);
    fs::create_dir_all(&dir).unwrap();
    let saved = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/data/matrix-7.3.json");
    fs::copy(&saved, dir.join("report.json")).unwrap();
    let r = report::read(&saved).unwrap();
    write_flamegraphs(&dir, &r);
    let out = Command::new(env!("CARGO_BIN_EXE_dmaprof"))
        .args(["report", "--html"])
        .arg(dir.join("report.json"))
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let index = dir.join("index.html");
    assert_eq!(
        String::from_utf8_lossy(&out.stdout),
        format!("html: {}\n", index.display())
    );
    let html = fs::read_to_string(&index).unwrap();
    eprintln!("index.html: {} bytes for {} cases", html.len(), r.cases.len());
    let Some(chromium) = chromium() else {
        eprintln!("SKIP the_html_report_works_in_a_browser: chromium not installed: run cargo xtask setup");
        return;
    };
    let first = html
        .split("class=\"cell\" href=\"#case-")
        .nth(1)
        .and_then(|rest| rest.split('"').next())
        .expect("the heat map has a cell")
        .to_owned();
    let (dom, console) = browse(
        &chromium,
        &format!("file://{}#case-{first}", index.display()),
        &["--dump-dom"],
    );
    assert!(console.is_empty(), "the page's console: {console:#?}");
    assert_eq!(
        dom.matches("class=\"cell\"").count(),
        r.cases.len(),
        "one heat-map cell per case"
    );
    let section = dom
        .split(&format!("id=\"case-{first}\""))
        .nth(1)
        .expect("the first cell's case section is there");
    let section = section.split("<section").next().unwrap();
    assert!(
        section.contains(&format!("<details class=\"flamegraphs\" id=\"fg-{first}\" open=\"\"")),
        "opening the case opens its flamegraphs"
    );
    let case = r.cases.iter().find(|c| c.name == first).unwrap();
    let figures =
        case.phases.iter().filter(|p| p.flamegraph.is_some()).count() + usize::from(case.summary_flamegraph.is_some());
    assert_eq!(
        section.matches("data-state=\"shown\"").count(),
        figures,
        "every flamegraph unpacked"
    );
    assert_eq!(section.matches("<iframe").count(), figures, "each in its frame");
    interact(&chromium, &dir, &first, figures);
    diff_page(&chromium, &dir, &first);
    fs::write(dir.join("heatmap.html"), HEAT_MAP).unwrap();
    let shot = dir.join("index.png");
    let (_, console) = browse(
        &chromium,
        &format!("file://{}", dir.join("heatmap.html").display()),
        &[&format!("--screenshot={}", shot.display())],
    );
    assert!(console.is_empty(), "the page's console: {console:#?}");
    assert!(
        fs::metadata(&shot).unwrap().len() > 10_000,
        "a screenshot with something in it"
    );
    eprintln!("screenshot of the heat map: {}", shot.display());
}

/// Searches and zooms in the first flamegraph of `case` and sorts its rows, as a reader would.
fn interact(chromium: &Path, dir: &Path, case: &str, figures: usize) {
    let page = dir.join("harness.html");
    fs::write(&page, harness(case)).unwrap();
    let (dom, console) = browse(
        chromium,
        &format!("file://{}", page.display()),
        &["--dump-dom", "--allow-file-access-from-files"],
    );
    assert!(console.is_empty(), "the page's console: {console:#?}");
    let out = dom
        .split("<pre id=\"out\">")
        .nth(1)
        .and_then(|s| s.split("</pre>").next())
        .unwrap();
    assert!(out.contains(&format!("figures {figures} frames {figures}")), "{out}");
    // 7 of the 11 samples are under clear_page_erms.
    assert!(
        out.contains("search Matched: 63.6%"),
        "search works inside the page: {out}"
    );
    assert!(out.contains("zoomed true"), "zoom works inside the page: {out}");
    assert!(
        out.contains("sorted true"),
        "a click on a heading sorts the exact rows: {out}"
    );
}

/// diff.html of the report against itself, opened at `case`: its differential flamegraphs
/// unpack in their frames and the console stays quiet.
fn diff_page(chromium: &Path, dir: &Path, case: &str) {
    let report = dir.join("report.json");
    let out = Command::new(env!("CARGO_BIN_EXE_dmaprof"))
        .arg("diff")
        .args([&report, &report])
        .arg("-o")
        .arg(dir.join("diff"))
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let page = dir.join("diff/diff.html");
    let (dom, console) = browse(
        chromium,
        &format!("file://{}#case-{case}", page.display()),
        &["--dump-dom"],
    );
    assert!(console.is_empty(), "the diff page's console: {console:#?}");
    let section = dom.split(&format!("id=\"case-{case}\"")).nth(1).unwrap();
    let section = section.split("<section").next().unwrap();
    let shown = section.matches("data-state=\"shown\"").count();
    assert!(shown > 0 && section.matches("<iframe").count() == shown, "{section}");
}

/// A recording's page: `dmaprof record` of a command that copies from /dev/zero (root: it
/// loads BPF), opened in chromium: the console stays quiet, the tables are there and the
/// flamegraph of the samples outside the DMA ioctls is unpacked in its frame.
#[test]
fn a_recordings_page_works_in_a_browser() {
    let Some(chromium) = chromium() else {
        eprintln!("SKIPPED a_recordings_page_works_in_a_browser: no chromium (cargo xtask setup installs it)");
        return;
    };
    // SAFETY: geteuid cannot fail.
    if unsafe { libc::geteuid() } != 0 {
        eprintln!("SKIPPED a_recordings_page_works_in_a_browser: recording needs root");
        return;
    }
    let dir = std::env::temp_dir().join(format!("dmaprof-test-record-page-{}", std::process::id()));
    let _ = fs::remove_dir_all(&dir);
    let out = Command::new(env!("CARGO_BIN_EXE_dmaprof"))
        .args(["record", "-o"])
        .arg(&dir)
        .args(["--", "dd", "if=/dev/zero", "of=/dev/null", "bs=64K", "count=40000"])
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let page = dir.join("index.html");
    let (dom, console) = browse(&chromium, &format!("file://{}", page.display()), &["--dump-dom"]);
    assert!(console.is_empty(), "the recording page's console: {console:#?}");
    assert!(dom.contains("By ioctl") && dom.contains("Sampled stacks"), "{dom}");
    let sampled = dom.split("id=\"sampled\"").nth(1).unwrap();
    assert!(
        sampled.contains("data-state=\"shown\"") && sampled.contains("<iframe"),
        "{sampled}"
    );
    let _ = fs::remove_dir_all(&dir);
}
