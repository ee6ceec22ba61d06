//! End-to-end tests on this machine's real kernel: real BPF loads and attaches, real mmaps and
//! faults. They run the built `dmaprof` binary as a user would.
//!
//! They need root (BPF, perf events, hugepage pools). Without it they fail, unless
//! DMAPROF_ALLOW_SKIP=1 is set, in which case each prints a SKIPPED line with the reason.
use std::{
    fs,
    os::unix::process::ExitStatusExt as _,
    path::{Path, PathBuf},
    process::{Command, Output},
};

use profiler::flamegraph::Folded;
use serde_json::Value;

/// dmaprof runs one at a time (it takes a lock); so do the tests that run it.
static SERIAL: std::sync::Mutex<()> = std::sync::Mutex::new(());

fn serial() -> std::sync::MutexGuard<'static, ()> {
    SERIAL.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}

fn dmaprof() -> Command {
    Command::new(env!("CARGO_BIN_EXE_dmaprof"))
}

/// False (after saying so) when the test cannot run here and skipping is allowed.
fn can_run(test: &str) -> bool {
    // SAFETY: geteuid cannot fail.
    if unsafe { libc::geteuid() } == 0 {
        return true;
    }
    if std::env::var_os("DMAPROF_ALLOW_SKIP").is_some() {
        eprintln!("SKIPPED {test}: needs root (BPF, perf events, hugepage pools)");
        return false;
    }
    panic!("{test} needs root; run as root or set DMAPROF_ALLOW_SKIP=1 to skip it");
}

fn tmpdir(name: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("dmaprof-test-{name}-{}", std::process::id()));
    let _ = fs::remove_dir_all(&d);
    d
}

fn ok(out: &Output) {
    assert!(
        out.status.success(),
        "dmaprof failed ({}):\nstdout: {}\nstderr: {}",
        out.status,
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}

/// Runs `dmaprof run --json` with `args` into a fresh directory; returns (report, dir).
fn run_json(name: &str, args: &[&str]) -> (Value, PathBuf) {
    let dir = tmpdir(name);
    let out = dmaprof()
        .args(["run", "--json", "-o"])
        .arg(&dir)
        .args(args)
        .output()
        .unwrap();
    ok(&out);
    let report: Value = serde_json::from_slice(&out.stdout).expect("stdout is the JSON report");
    let on_disk: Value = serde_json::from_str(&fs::read_to_string(dir.join("report.json")).unwrap()).unwrap();
    assert_eq!(report, on_disk, "--json prints what report.json holds");
    (report, dir)
}

/// A number the report must have; a missing or non-numeric field fails the test by name.
fn num(v: &Value, what: &str) -> u64 {
    v.as_u64().unwrap_or_else(|| panic!("{what} is not a number: {v}"))
}

fn case<'a>(report: &'a Value, name: &str) -> &'a Value {
    report["cases"]
        .as_array()
        .unwrap()
        .iter()
        .find(|c| c["name"] == name)
        .unwrap_or_else(|| panic!("case {name} missing; skipped: {}", report["skipped"]))
}

fn phase<'a>(case: &'a Value, name: &str) -> &'a Value {
    case["phases"]
        .as_array()
        .unwrap()
        .iter()
        .find(|p| p["name"] == name)
        .unwrap_or_else(|| panic!("phase {name} missing in {}", case["name"]))
}

#[test]
fn doctor_finds_what_this_host_has() {
    let _serial = serial();
    if !can_run("doctor_finds_what_this_host_has") {
        return;
    }
    let out = dmaprof().args(["doctor", "--json"]).output().unwrap();
    ok(&out);
    let d: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert!(!d["kernel"]["release"].as_str().unwrap().is_empty());
    let caps = &d["capabilities"];
    for name in [
        "btf_vmlinux",
        "btf_modules",
        "kprobes",
        "fentry",
        "tracepoints",
        "perf_sampling",
        "vfio_type1",
        "iommufd",
        "vfio_cdev",
        "map_file",
        "privileges",
    ] {
        assert!(caps[name]["ok"].is_boolean(), "capability {name} missing: {caps}");
        assert!(
            !caps[name]["detail"].as_str().unwrap().is_empty(),
            "{name} has no detail"
        );
    }
    // Independent oracles for what the kernel offers.
    let has = |p: &str| Path::new(p).exists();
    assert_eq!(
        caps["kprobes"]["ok"],
        has("/sys/bus/event_source/devices/kprobe"),
        "kprobes: {}",
        caps["kprobes"]
    );
    assert_eq!(
        caps["vfio_type1"]["ok"],
        has("/dev/vfio/vfio"),
        "vfio: {}",
        caps["vfio_type1"]
    );
    assert_eq!(caps["iommufd"]["ok"], has("/dev/iommu"), "iommufd: {}", caps["iommufd"]);
    assert_eq!(caps["btf_vmlinux"]["ok"], has("/sys/kernel/btf/vmlinux"));
    assert_eq!(caps["tracepoints"]["ok"], true, "{}", caps["tracepoints"]);
    assert_eq!(caps["perf_sampling"]["ok"], true, "{}", caps["perf_sampling"]);
    assert_eq!(caps["privileges"]["ok"], true);
    if !caps["iommufd"]["ok"].as_bool().unwrap() {
        assert_eq!(caps["map_file"]["ok"], false);
    }
    for h in d["hugepages"].as_array().unwrap() {
        assert!(h["size_kb"].as_u64().unwrap() >= 2048);
    }
    assert!(d["vfio_devices"].is_array());
    // The human table names the same facts.
    let table = dmaprof().arg("doctor").output().unwrap();
    ok(&table);
    let t = String::from_utf8_lossy(&table.stdout);
    assert!(t.contains("perf_sampling") && t.contains("kprobes"));
}

#[test]
fn populate_is_zeroing_and_faulting_inside_mmap() {
    let _serial = serial();
    if !can_run("populate_is_zeroing_and_faulting_inside_mmap") {
        return;
    }
    let (r, dir) = run_json(
        "populate",
        &["-b", "1G", "-v", "none_anonymous.populate", "-n", "1", "--freq", "4999"],
    );
    let mmap = phase(case(&r, "none_anonymous.populate"), "mmap");
    let samples = mmap["sampled"]["samples"].as_u64().unwrap();
    assert!(
        samples >= 500,
        "1 GiB MAP_POPULATE at 4999 Hz should give >= 500 samples, got {samples}"
    );
    let cats = &mmap["sampled"]["categories"];
    let zf = cats["zeroing"].as_f64().unwrap() + cats["faulting"].as_f64().unwrap();
    assert!(zf > 0.5, "zeroing+faulting should dominate MAP_POPULATE: {cats}");
    let total: f64 = cats.as_object().unwrap().values().map(|v| v.as_f64().unwrap()).sum();
    assert!((total - 1.0).abs() < 1e-6, "shares sum to 1: {total}");
    // The kernel-side syscall time is inside the user-space wall time of the same (exact)
    // pass; the untraced headline is another iteration and may be shorter.
    let wall = mmap["passes"]["exact"]["wall_ns"]["median"].as_u64().unwrap();
    let kernel = mmap["kernel_ns"]["median"].as_u64().unwrap();
    assert!(
        kernel > 0 && kernel <= wall,
        "kernel {kernel} ns vs exact-pass wall {wall} ns"
    );
    let share = mmap["kernel_share"].as_f64().unwrap();
    assert!(
        share > 0.9 && share <= 1.0,
        "a populating mmap is all kernel time: {share}"
    );
    assert!(
        mmap["counters"]["minor_faults"].as_u64().unwrap() >= 262_144,
        "GUP-driven faults counted by rusage"
    );
    fs::remove_dir_all(dir).unwrap();
}

/// The workload pinned to one CPU beside a busy loop: the scheduler takes turns, so a
/// populating mmap spends much of its wall time off the CPU, preempted rather than asleep.
/// The switches dmaprof counts from sched_switch are the kernel's own (getrusage), less at
/// most a few around the phase switch.
#[test]
fn time_off_the_cpu_is_measured_and_agrees_with_the_kernels_count() {
    let _serial = serial();
    if !can_run("time_off_the_cpu_is_measured_and_agrees_with_the_kernels_count") {
        return;
    }
    let mut hog = Command::new("taskset")
        .args(["-c", "0", "sh", "-c", "while :; do :; done"])
        .spawn()
        .expect("taskset (util-linux) runs a busy loop on CPU 0");
    let dir = tmpdir("off-cpu");
    let out = Command::new("taskset")
        .args(["-c", "0"])
        .arg(env!("CARGO_BIN_EXE_dmaprof"))
        .args(["run", "--json", "-o"])
        .arg(&dir)
        .args([
            "-b",
            "256M",
            "-v",
            "none_anonymous.populate",
            "-n",
            "1",
            "--thp",
            "never",
        ])
        .output()
        .unwrap();
    let _ = hog.kill();
    let _ = hog.wait();
    ok(&out);
    let r: Value = serde_json::from_slice(&out.stdout).unwrap();
    let mmap = phase(case(&r, "none_anonymous.populate"), "mmap");
    let off = &mmap["counters"]["off_cpu"];
    let ns = num(&off["ns"], "off_cpu.ns");
    let switches = num(&off["switches"], "off_cpu.switches");
    let blocked = num(&off["blocked"], "off_cpu.blocked");
    let rusage = num(&off["rusage_switches"], "off_cpu.rusage_switches");
    let wall = num(
        &mmap["passes"]["exact"]["wall_ns"]["median"],
        "the exact pass's wall time",
    );
    assert!(
        ns * 5 >= wall,
        "beside a busy loop the mmap should be off the CPU a fifth of its {wall} ns or more: {off}"
    );
    assert!(switches >= 2 && blocked < switches, "mostly preempted: {off}");
    assert!(
        switches <= rusage && rusage <= switches + 4,
        "sched_switch's count {switches} against getrusage's {rusage}"
    );
    // The sampler runs on the thread's CPU time: its samples are what the sampled pass's wall
    // time less its time off the CPU gives at 4999 Hz.
    let sampled_wall = num(
        &mmap["passes"]["sampled"]["wall_ns"]["median"],
        "the sampled pass's wall time",
    );
    let on_cpu = sampled_wall - num(&mmap["sampled"]["off_cpu_ns"], "sampled.off_cpu_ns");
    let expected = on_cpu as f64 * 4999.0 / 1e9;
    let samples = num(&mmap["sampled"]["samples"], "sampled.samples") as f64;
    assert!(
        (samples - expected).abs() <= 0.2 * expected,
        "{samples} samples against {expected:.0} from {on_cpu} ns on the CPU of {sampled_wall}"
    );
    fs::remove_dir_all(dir).unwrap();
}

#[test]
fn touch_faults_are_counted_and_none_has_none() {
    let _serial = serial();
    if !can_run("touch_faults_are_counted_and_none_has_none") {
        return;
    }
    let (r, dir) = run_json(
        "touch",
        &[
            "-b",
            "1G",
            "-v",
            "none_anonymous",
            "--prefault",
            "none,touch",
            "-n",
            "1",
        ],
    );
    let touch = phase(case(&r, "none_anonymous.touch"), "touch");
    // This host has no kprobes and refuses fentry: exact attribution says so instead of
    // reporting everything as `other`.
    let exact = &touch["exact"];
    assert_eq!(exact["available"], false, "no probe-table row attached here: {exact}");
    assert!(exact["unavailable"].as_str().is_some_and(|w| !w.is_empty()), "{exact}");
    assert!(
        exact["categories"].as_object().is_none_or(serde_json::Map::is_empty),
        "{exact}"
    );
    let table = dmaprof().arg("report").arg(dir.join("report.json")).output().unwrap();
    let text = String::from_utf8_lossy(&table.stdout);
    assert!(text.contains("exact attribution unavailable: "), "{text}");
    let faults = touch["counters"]["cpu_faults"].as_u64().unwrap();
    assert!(
        (262_144 * 99 / 100..=262_144 * 101 / 100).contains(&faults),
        "1 GiB of 4 KiB pages: ~262144 faults, got {faults}"
    );
    // kmem:mm_page_alloc: a 4 KiB page per fault, plus the page tables that map them.
    let allocs = &touch["counters"]["page_allocs"];
    let small = allocs["0"].as_u64().unwrap_or(0);
    assert!(
        (faults..=faults * 101 / 100).contains(&small),
        "{faults} faults allocate about as many 4 KiB pages: {allocs}"
    );
    let none = case(&r, "none_anonymous.none");
    for p in none["phases"].as_array().unwrap() {
        assert_eq!(
            p["counters"]["cpu_faults"], 0,
            "prefault none faults nothing in {}",
            p["name"]
        );
    }
    assert!(
        r["cases"]
            .as_array()
            .unwrap()
            .iter()
            .all(|c| c["name"] != "none_anonymous.populate"),
        "--prefault filters"
    );
    fs::remove_dir_all(dir).unwrap();
}

/// A counter of the `kb` hugepage pool (`nr_hugepages`, `free_hugepages`).
fn pool(kb: u64, file: &str) -> Option<u64> {
    fs::read_to_string(format!("/sys/kernel/mm/hugepages/hugepages-{kb}kB/{file}"))
        .ok()?
        .trim()
        .parse()
        .ok()
}

fn nr_hugepages(kb: u64) -> Option<u64> {
    pool(kb, "nr_hugepages")
}

#[test]
fn hugetlb_2mb_cases_run_and_restore_the_pool() {
    let _serial = serial();
    if !can_run("hugetlb_2mb_cases_run_and_restore_the_pool") {
        return;
    }
    let Some(before) = nr_hugepages(2048) else {
        eprintln!("SKIPPED hugetlb_2mb_cases_run_and_restore_the_pool: kernel has no 2 MiB hugetlb pool");
        return;
    };
    let (r, dir) = run_json("huge2m", &["-b", "64M", "-v", "none_*hugetlb_2mb", "-n", "2"]);
    assert_eq!(nr_hugepages(2048), Some(before), "nr_hugepages restored");
    for name in ["none_anonymous_hugetlb_2mb", "none_memfd_hugetlb_2mb"] {
        let c = case(&r, &format!("{name}.touch"));
        assert_eq!(c["page_size"], 2 << 20);
        let faults = phase(c, "touch")["counters"]["cpu_faults"].as_u64().unwrap();
        assert_eq!(faults, 32, "64 MiB of 2 MiB pages: one fault per page");
        // A populated mmap takes its faults through GUP: no CPU fault, but rusage sees them.
        let mmap = phase(case(&r, &format!("{name}.populate")), "mmap");
        assert_eq!(mmap["counters"]["cpu_faults"], 0, "{}", mmap["counters"]);
        let p = phase(case(&r, &format!("{name}.populate")), "mmap");
        assert!(p["wall_ns"]["median"].as_u64().unwrap() > 0);
    }
    let memfd = case(&r, "none_memfd_hugetlb_2mb.none");
    let names: Vec<&str> = memfd["phases"]
        .as_array()
        .unwrap()
        .iter()
        .map(|p| p["name"].as_str().unwrap())
        .collect();
    assert_eq!(names, ["memfd_create", "mmap", "munmap", "close"]);
    fs::remove_dir_all(dir).unwrap();
}

#[test]
fn no_trace_claims_nothing_it_did_not_measure() {
    let _serial = serial();
    if !can_run("no_trace_claims_nothing_it_did_not_measure") {
        return;
    }
    let dir = tmpdir("notrace");
    let out = dmaprof()
        .args(["run", "-o"])
        .arg(&dir)
        .args(["-b", "16M", "-v", "none_anonymous.populate", "-n", "2", "--no-trace"])
        .output()
        .unwrap();
    ok(&out);
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        text.contains("untraced (--no-trace)") && !text.contains("sampling at"),
        "{text}"
    );
    let r: Value = serde_json::from_str(&fs::read_to_string(dir.join("report.json")).unwrap()).unwrap();
    let c = case(&r, "none_anonymous.populate");
    assert!(c["summary_flamegraph"].is_null());
    for p in c["phases"].as_array().unwrap() {
        assert!(p["folded"].is_null() && p["flamegraph"].is_null(), "{}", p["name"]);
        assert!(
            p["kernel_ns"].is_null() && p["counters"]["cpu_faults"].is_null(),
            "{}",
            p["name"]
        );
        assert_eq!(p["exact"]["available"], false);
    }
    let mut files: Vec<_> = fs::read_dir(&dir).unwrap().flatten().map(|e| e.file_name()).collect();
    files.sort();
    assert_eq!(
        files,
        ["index.html", "report.json"],
        "--no-trace writes the report and its page, no flamegraph"
    );
    // The table shows `-` for what was not measured, not 0.
    let row = text.lines().find(|l| l.trim_start().starts_with("mmap")).unwrap();
    assert!(row.contains(" -/") && row.contains(" - "), "{row}");
    fs::remove_dir_all(dir).unwrap();
}

#[test]
fn passes_run_separately_and_the_headline_is_untraced() {
    let _serial = serial();
    if !can_run("passes_run_separately_and_the_headline_is_untraced") {
        return;
    }
    let args = [
        "-b",
        "64M",
        "-v",
        "none_anonymous.populate",
        "-n",
        "4",
        "--traced-iterations",
        "2",
    ];
    let (r, dir) = run_json("passes", &args);
    assert_eq!(
        r["config"]["passes"],
        serde_json::json!(["untraced", "exact", "sampled"])
    );
    let mmap = phase(case(&r, "none_anonymous.populate"), "mmap");
    assert_eq!(mmap["wall_pass"], "untraced");
    assert_eq!(
        mmap["wall_ns"]["runs"].as_array().unwrap().len(),
        4,
        "headline from the untraced pass"
    );
    let ci = &mmap["wall_ci"];
    assert!(num(&ci["low"], "ci low") <= num(&mmap["wall_ns"]["median"], "median"));
    assert!(ci["level"].as_f64().unwrap() > 0.8, "{ci}");
    for pass in ["exact", "sampled"] {
        let p = &mmap["passes"][pass];
        assert_eq!(p["wall_ns"]["runs"].as_array().unwrap().len(), 2, "{pass}: {p}");
        assert!(p["ratio"]["median"].as_f64().unwrap() > 0.5, "{pass}: {p}");
    }
    assert!(
        num(&mmap["sampled"]["samples"], "samples") > 0,
        "the sampled pass samples"
    );
    fs::remove_dir_all(dir).unwrap();
    // Without the untraced pass the headline says which pass it comes from; without the exact
    // pass there is no exact breakdown and no syscall time.
    let (r, dir) = run_json(
        "passes2",
        &["-b", "16M", "-v", "none_anonymous.populate", "--passes", "sampled"],
    );
    let mmap = phase(case(&r, "none_anonymous.populate"), "mmap");
    assert_eq!(mmap["wall_pass"], "sampled");
    assert!(mmap["exact"]["unavailable"].as_str().unwrap().contains("--passes"));
    assert!(mmap["kernel_ns"].is_null() && mmap["passes"].as_object().unwrap().len() == 1);
    fs::remove_dir_all(dir).unwrap();
}

#[test]
fn thp_never_gives_4k_pages_and_always_huge_ones() {
    let _serial = serial();
    if !can_run("thp_never_gives_4k_pages_and_always_huge_ones") {
        return;
    }
    let faults = |thp: &str| {
        let args = [
            "-b",
            "64M",
            "-v",
            "none_anonymous.touch",
            "-v",
            "none_anonymous.populate",
            "-n",
            "1",
        ];
        let (r, dir) = run_json(&format!("thp-{thp}"), &[&args[..], &["--thp", thp]].concat());
        assert_eq!(r["config"]["thp"], thp);
        assert!(
            r["kernel"]["thp"]["enabled"].is_string(),
            "THP settings recorded: {}",
            r["kernel"]
        );
        let touch = num(
            &phase(case(&r, "none_anonymous.touch"), "touch")["counters"]["cpu_faults"],
            "touch faults",
        );
        let populate = phase(case(&r, "none_anonymous.populate"), "mmap");
        let populated = num(&populate["counters"]["minor_faults"], "populate faults");
        fs::remove_dir_all(dir).unwrap();
        (touch, populated)
    };
    assert_eq!(
        faults("never"),
        (16384, 16384),
        "64 MiB of 4 KiB pages, touched and populated"
    );
    let (touch, populated) = faults("always");
    assert!(
        touch < 16384 / 4 && populated < 16384 / 4,
        "mostly 2 MiB pages: {touch}, {populated}"
    );
}

#[test]
fn report_shape_folded_and_svg_files() {
    let _serial = serial();
    if !can_run("report_shape_folded_and_svg_files") {
        return;
    }
    let (r, dir) = run_json(
        "shape",
        &["-b", "64M", "-v", "none_memfd.populate", "-n", "2", "--freq", "999"],
    );
    assert_eq!(r["schema"], "dmaprof.report.v1");
    assert!(r["kernel"]["release"].is_string());
    assert!(r["capabilities"]["vfio_type1"]["ok"].is_boolean());
    assert!(r["kernel"]["features"].as_array().is_some_and(|f| f.len() >= 5));
    assert!(r["timing"]["attach_ns"].as_u64().is_some_and(|n| n > 0));
    assert!(r["timing"]["peak_rss_kib"].as_u64().is_some_and(|n| n > 0));
    assert_eq!(r["config"]["size_bytes"], 64 << 20);
    assert_eq!(r["config"]["iterations"], 2);
    assert_eq!(r["config"]["freq_hz"], 999);
    assert!(r["skipped"].is_array());
    let c = case(&r, "none_memfd.populate");
    for key in ["name", "iommu_mode", "backing", "prefault", "size_bytes"] {
        assert!(!c[key].is_null(), "case.{key}");
    }
    assert_eq!(c["iommu_mode"], "none");
    assert_eq!(c["backing"], "memfd");
    assert_eq!(c["prefault"], "populate");
    for p in c["phases"].as_array().unwrap() {
        let w = &p["wall_ns"];
        assert_eq!(w["runs"].as_array().unwrap().len(), 2);
        let (min, median, max) = (
            num(&w["min"], "min"),
            num(&w["median"], "median"),
            num(&w["max"], "max"),
        );
        assert!(
            min <= median && median <= max,
            "wall_ns min {min} <= median {median} <= max {max}"
        );
        assert!(p["sampled"]["samples"].is_u64() && p["sampled"]["categories"].is_object());
        assert!(p["counters"]["cpu_faults"].is_u64());
        let folded = fs::read_to_string(dir.join(p["folded"].as_str().unwrap())).unwrap();
        let parsed = Folded::parse(&folded).expect("folded lines parse");
        assert_eq!(
            parsed.total(),
            p["sampled"]["samples"].as_u64().unwrap(),
            "folded counts = samples"
        );
        let svg = fs::read_to_string(dir.join(p["flamegraph"].as_str().unwrap())).unwrap();
        let opts = roxmltree::ParsingOptions {
            allow_dtd: true,
            ..Default::default()
        };
        let doc = roxmltree::Document::parse_with_options(&svg, opts)
            .unwrap_or_else(|e| panic!("{} is not valid XML: {e}", p["flamegraph"]));
        assert_eq!(doc.root_element().tag_name().name(), "svg");
    }
    let table = dmaprof()
        .args(["run", "-b", "64M", "-v", "none_memfd.none", "-n", "1", "-o"])
        .arg(dir.join("t"))
        .output()
        .unwrap();
    ok(&table);
    let t = String::from_utf8_lossy(&table.stdout);
    assert!(
        t.contains("none_memfd.none") && t.contains("median ms") && t.contains("report:"),
        "{t}"
    );
    let page = dir.join("t/index.html");
    assert!(
        t.contains(&format!("\nhtml: {}\n", page.display())) && page.is_file(),
        "the run writes its page and names it: {t}"
    );
    fs::remove_dir_all(dir).unwrap();
}

/// Every bad input: exit code 2 (usage) or 1, one line on stderr, no panic.
#[test]
fn bad_input_gives_one_clear_line() {
    let _serial = serial();
    let file = tmpdir("notadir");
    fs::write(&file, "x").unwrap();
    let file_s = file.to_str().unwrap();
    let foreign = tmpdir("foreign-out");
    fs::create_dir_all(&foreign).unwrap();
    fs::write(foreign.join("mine.txt"), "not dmaprof's").unwrap();
    let foreign_s = foreign.to_str().unwrap();
    for (args, code, needle) in bad_inputs(file_s, foreign_s) {
        assert_one_clear_line(&args, code, needle);
    }
    assert!(
        fs::read_to_string(foreign.join("mine.txt")).is_ok(),
        "a refused --out is left alone"
    );
    fs::remove_file(file).unwrap();
    fs::remove_dir_all(foreign).unwrap();
}

/// (arguments, exit code, text that must appear) for [`bad_input_gives_one_clear_line`]; `file`
/// is a regular file, `foreign` a directory holding something that is not dmaprof's.
fn bad_inputs<'a>(file: &'a str, foreign: &'a str) -> Vec<(Vec<&'a str>, i32, &'static str)> {
    let cases: &[(&[&str], i32, &str)] = &[
        (&["run", "-b", "0"], 2, "larger than 0"),
        (&["run", "-b", "-1G"], 2, "not a size"),
        (&["run", "-b", "1.5G"], 2, "not a size"),
        (&["run", "-b", "10X"], 2, "not a size"),
        (&["run", "-b", "99999999999999999999"], 2, "too large"),
        (&["run", "-b", "100"], 2, "multiple of 4 KiB"),
        (&["run", "-v", "nothing_matches_*"], 2, "matches no case"),
        (&["run", "-v", "none_[x"], 2, "bad -v pattern"),
        (&["run", "-n", "0"], 2, "iterations"),
        (
            &["run", "--prefault", "sometimes"],
            2,
            "[possible values: none, populate, touch]",
        ),
        (
            &["run", "--passes", "fast"],
            2,
            "[possible values: untraced, exact, sampled]",
        ),
        (
            &["run", "--probes", "kretprobes"],
            2,
            "[possible values: samples, tracepoints, fentry, kprobes]",
        ),
        (
            &["run", "-b", "64M", "-v", "none_anonymous.none", "-o", file],
            2,
            "not a directory",
        ),
        (
            &[
                "run",
                "-b",
                "64M",
                "-v",
                "none_anonymous.none",
                "-o",
                "/proc/dmaprof-no/such",
            ],
            2,
            "choose a writable directory",
        ),
        (
            &["run", "-b", "64M", "-v", "none_anonymous.none", "-o", foreign],
            2,
            "holds no dmaprof report",
        ),
        (
            &["run", "-b", "1T", "-v", "none_anonymous.none"],
            2,
            "does not fit in available memory",
        ),
        (
            &["run", "-b", "4M", "-v", "none_anonymous.none", "-d", "0000:ff:1f.7"],
            2,
            "no PCI device 0000:ff:1f.7",
        ),
        (&["diff", "a.json"], 2, "<AFTER>"),
        (&["doctor", "--bogus"], 2, "--bogus"),
        (&["frobnicate"], 2, "frobnicate"),
        (&[], 2, "Usage: dmaprof <COMMAND>"),
    ];
    cases.iter().map(|(a, c, n)| (a.to_vec(), *c, *n)).collect()
}

/// dmaprof's own errors are one line; clap's argument errors are clap's whole message (what is
/// wrong, allowed values, usage). Either way exit `code`, `needle` in it and no panic.
fn assert_one_clear_line(args: &[&str], code: i32, needle: &str) {
    let out = dmaprof().args(args).output().unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(code), "{args:?}: {err}");
    if err.starts_with("error:") || err.contains("Usage:") {
        assert!(
            err.contains("Usage:") || err.contains("--help"),
            "{args:?}: clap's whole message: {err}"
        );
    } else {
        assert_eq!(
            err.trim_end().lines().count(),
            1,
            "{args:?} should print one line: {err}"
        );
    }
    assert!(err.contains(needle), "{args:?}: expected `{needle}` in: {err}");
    assert!(!err.contains("panicked"), "{args:?} panicked: {err}");
}

#[test]
fn a_run_whose_every_case_is_skipped_exits_4_and_says_so() {
    let _serial = serial();
    if !can_run("a_run_whose_every_case_is_skipped_exits_4_and_says_so") {
        return;
    }
    if std::path::Path::new("/dev/vfio/vfio").exists() {
        eprintln!("SKIPPED a_run_whose_every_case_is_skipped_exits_4_and_says_so: this host has VFIO");
        return;
    }
    let dir = tmpdir("allskipped");
    let out = dmaprof()
        .args(["run", "--ktap", "-b", "4M", "-v", "vfio_type1_iommu_anonymous", "-o"])
        .arg(&dir)
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(4), "kselftest's skip code: {err}");
    // KTAP on stdout, as kselftest prints it: the plan, every case skipped with its reason.
    let ktap = String::from_utf8_lossy(&out.stdout);
    let lines: Vec<&str> = ktap.lines().collect();
    assert_eq!(lines.first(), Some(&"KTAP version 1"), "{ktap}");
    assert_eq!(lines.get(1), Some(&"1..3"), "{ktap}");
    assert_eq!(
        lines
            .iter()
            .filter(|l| l.starts_with("ok ") && l.contains("# SKIP kernel has no VFIO type1"))
            .count(),
        3,
        "{ktap}"
    );
    assert!(
        ktap.ends_with("# Totals: pass:0 fail:0 xfail:0 xpass:0 skip:3 error:0\n"),
        "{ktap}"
    );
    let line = err
        .lines()
        .find(|l| l.contains("every selected case was skipped"))
        .unwrap_or_default();
    assert!(
        line.contains("kernel has no VFIO type1"),
        "the first reason is the kernel's: {err}"
    );
    // A second run into the same directory replaces the first, it does not mix with it.
    let again = dmaprof()
        .args(["run", "-b", "4M", "-v", "none_anonymous.none", "-n", "1", "-o"])
        .arg(&dir)
        .output()
        .unwrap();
    ok(&again);
    let r: Value = serde_json::from_str(&fs::read_to_string(dir.join("report.json")).unwrap()).unwrap();
    assert_eq!(r["cases"].as_array().unwrap().len(), 1);
    assert!(
        r["skipped"].as_array().unwrap().is_empty(),
        "no stale skip from the first run: {}",
        r["skipped"]
    );
    fs::remove_dir_all(dir).unwrap();
}

#[test]
fn report_rerenders_and_diff_compares() {
    let _serial = serial();
    if !can_run("report_rerenders_and_diff_compares") {
        return;
    }
    let (small, dir_a) = run_json("diff-a", &["-b", "64M", "-v", "none_anonymous.populate", "-n", "3"]);
    let (_, dir_b) = run_json("diff-b", &["-b", "512M", "-v", "none_anonymous.populate", "-n", "3"]);
    let a = dir_a.join("report.json");
    let b = dir_b.join("report.json");
    // `report` re-renders exactly what was saved.
    let r = dmaprof().arg("report").arg(&a).arg("--json").output().unwrap();
    ok(&r);
    assert_eq!(serde_json::from_slice::<Value>(&r.stdout).unwrap(), small);
    let t = dmaprof().arg("report").arg(&a).output().unwrap();
    ok(&t);
    assert!(String::from_utf8_lossy(&t.stdout).contains("none_anonymous.populate"));
    // A run against itself: no change anywhere.
    let d = diff_json(&a, &a, &dir_a.join("d0"));
    for p in d["phases"].as_array().unwrap() {
        assert_eq!(p["delta_ns"], 0, "{p}");
        assert_eq!(p["significant"], false, "a run against itself changes nothing: {p}");
        assert!(p["exact"].as_object().unwrap().values().all(|v| v[2] == 0));
    }
    assert_eq!(d["warnings"].as_array().map(Vec::len), Some(0), "{}", d["warnings"]);
    // 8x the size: MAP_POPULATE takes longer, and the differential flamegraph exists.
    let d = diff_json(&a, &b, &dir_a.join("d1"));
    let mmap = d["phases"]
        .as_array()
        .unwrap()
        .iter()
        .find(|p| p["phase"] == "mmap")
        .unwrap();
    assert!(
        mmap["delta_ns"].as_i64().unwrap() > 0,
        "bigger populate should be slower: {mmap}"
    );
    // 8x the pages: a significant change of several times, and a warning that sizes differ.
    let ratio = mmap["ratio"].as_f64().unwrap();
    assert!(mmap["significant"] == true && (4.0..16.0).contains(&ratio), "{mmap}");
    assert!(
        d["warnings"][0].as_str().unwrap().contains("sizes differ"),
        "{}",
        d["warnings"]
    );
    let text = dmaprof()
        .arg("diff")
        .arg(&a)
        .arg(&b)
        .arg("-o")
        .arg(dir_a.join("d2"))
        .output()
        .unwrap();
    ok(&text);
    let text = String::from_utf8_lossy(&text.stdout);
    assert!(
        text.contains("warning: sizes differ") && text.contains("phases changed beyond"),
        "{text}"
    );
    let svg = fs::read_to_string(dir_a.join("d1/none_anonymous.populate/mmap.svg")).unwrap();
    assert!(svg.contains("<svg"));
    diff_page_marks_the_change(&dir_a.join("d2"), &text);
    let page = fs::read_to_string(dir_a.join("index.html")).unwrap();
    assert!(page.contains("class=\"cell\" href=\"#case-none_anonymous.populate\""));
    bad_reports_give_one_line(&dir_a, &a);
    fs::remove_dir_all(dir_a).unwrap();
    fs::remove_dir_all(dir_b).unwrap();
}

/// diff.html in `dir` (named by the diff's `text`) marks the slower mmap and embeds its
/// differential flamegraph.
fn diff_page_marks_the_change(dir: &Path, text: &str) {
    let page = dir.join("diff.html");
    assert!(text.contains(&format!("html: {}", page.display())), "{text}");
    let html = fs::read_to_string(page).unwrap();
    let slower = html.split("<tr class=\"slower\">").nth(1).expect("a row marked slower");
    assert!(
        slower.split("</tr>").next().unwrap().contains("<td>mmap</td>"),
        "{slower}"
    );
    assert!(
        html.contains("data-title=\"mmap: before -&gt; after\""),
        "the differential flamegraph"
    );
    assert!(html.contains("<b>red</b> frames have more samples after than before"));
}

/// `dmaprof diff A B --json -o OUT`, which must succeed, as JSON.
fn diff_json(a: &Path, b: &Path, out: &Path) -> Value {
    let o = dmaprof()
        .arg("diff")
        .args([a, b])
        .arg("--json")
        .arg("-o")
        .arg(out)
        .output()
        .unwrap();
    ok(&o);
    serde_json::from_slice(&o.stdout).unwrap()
}

/// Truncated, foreign and missing reports (written into `dir`, next to the good report `a`)
/// make `report` and `diff` print one clear line and exit 2.
fn bad_reports_give_one_line(dir: &Path, a: &Path) {
    let trunc = dir.join("trunc.json");
    fs::write(&trunc, &fs::read_to_string(a).unwrap()[..100]).unwrap();
    let other = dir.join("other.json");
    fs::write(&other, r#"{"schema":"perf.script.v0"}"#).unwrap();
    for (bad, needle) in [
        (&trunc, "invalid JSON"),
        (&other, "perf.script.v0"),
        (&dir.join("missing.json"), "cannot read"),
    ] {
        for args in [
            vec!["report".into(), bad.clone()],
            vec!["diff".into(), bad.clone(), a.to_path_buf()],
        ] {
            let o = dmaprof().args(&args).output().unwrap();
            let err = String::from_utf8_lossy(&o.stderr);
            assert_eq!(o.status.code(), Some(2), "{args:?}: {err}");
            assert_eq!(err.trim_end().lines().count(), 1, "{err}");
            assert!(err.contains(needle), "{err}");
        }
    }
}

/// A deterministic-but-varied sequence of delays (no rand crate needed for 10 numbers).
fn delays(n: usize, max_ms: u64) -> Vec<u64> {
    let mut x = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_nanos() as u64
        | 1;
    (0..n)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x % max_ms
        })
        .collect()
}

#[test]
fn signals_at_random_moments_leave_nothing_behind() {
    let _serial = serial();
    if !can_run("signals_at_random_moments_leave_nothing_behind") {
        return;
    }
    let Some(before) = nr_hugepages(2048) else {
        eprintln!("SKIPPED signals_at_random_moments_leave_nothing_behind: no 2 MiB hugetlb pool");
        return;
    };
    let dir = tmpdir("signals");
    let mut interrupted = 0;
    for (i, delay) in delays(12, 1500).into_iter().enumerate() {
        let (sig, code) = [(libc::SIGINT, 130), (libc::SIGTERM, 143), (libc::SIGHUP, 129)][i % 3];
        let out = dir.join(format!("r{i}"));
        let child = dmaprof()
            .args([
                "run",
                "-b",
                "128M",
                "-v",
                "none_*hugetlb_2mb",
                "-v",
                "none_anonymous",
                "-n",
                "3",
                "-o",
            ])
            .arg(&out)
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::piped())
            .spawn()
            .unwrap();
        std::thread::sleep(std::time::Duration::from_millis(delay));
        // SAFETY: signalling our own child process.
        unsafe { libc::kill(child.id() as i32, sig) };
        let status = child.wait_with_output().unwrap();
        let err = String::from_utf8_lossy(&status.stderr);
        assert!(!err.contains("panicked"), "{err}");
        match status.status.code() {
            Some(0) => {}
            Some(c) if c == code => {
                interrupted += 1;
                // Interrupted after the report directory exists: the report says it is partial,
                // unless the signal came after the last phase (the report is complete then).
                let after_last_phase = err.contains("during finishing");
                if let Ok(text) = fs::read_to_string(out.join("report.json")) {
                    let r: Value = serde_json::from_str(&text).unwrap();
                    assert_eq!(
                        r["partial"], !after_last_phase,
                        "interrupted run's report must be marked partial unless it had finished: {err}"
                    );
                }
            }
            // Before main() holds the stop signals (the loader's and the runtime's start-up),
            // the default action applies; dmaprof had changed nothing and said nothing yet.
            None if status.status.signal() == Some(sig) && err.is_empty() && !out.exists() => {}
            other => panic!("signal {sig} after {delay} ms: exit {other:?}: {err}"),
        }
        assert_eq!(
            nr_hugepages(2048),
            Some(before),
            "signal {sig} after {delay} ms left hugepages raised"
        );
    }
    assert!(interrupted > 0, "no run was interrupted; the delays were all too long");
    fs::remove_dir_all(dir).unwrap();
}

#[test]
fn second_instance_refuses_and_unprivileged_run_says_why() {
    let _serial = serial();
    if !can_run("second_instance_refuses_and_unprivileged_run_says_why") {
        return;
    }
    let dir = tmpdir("lock");
    let mut first = dmaprof()
        .args(["run", "-b", "512M", "-v", "none_anonymous.touch", "-n", "5", "-o"])
        .arg(dir.join("a"))
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    std::thread::sleep(std::time::Duration::from_millis(300));
    let second = dmaprof()
        .args(["run", "-b", "64M", "-v", "none_anonymous.none", "-o"])
        .arg(dir.join("b"))
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&second.stderr);
    first.kill().unwrap();
    first.wait().unwrap();
    assert_eq!(second.status.code(), Some(1), "{err}");
    assert!(err.contains("another dmaprof is running"), "{err}");
    // Without privileges: one line naming the capabilities, exit 2.
    if Path::new("/usr/bin/setpriv").exists() {
        let out = Command::new("/usr/bin/setpriv")
            .args([
                "--reuid=65534",
                "--regid=65534",
                "--clear-groups",
                "--inh-caps=-all",
                "--bounding-set=-all",
            ])
            .arg(env!("CARGO_BIN_EXE_dmaprof"))
            .args([
                "run",
                "-b",
                "64M",
                "-v",
                "none_anonymous.none",
                "-o",
                "/tmp/dmaprof-unpriv-never",
            ])
            .output()
            .unwrap();
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{err}");
        assert_eq!(err.trim_end().lines().count(), 1, "{err}");
        for cap in ["CAP_BPF", "CAP_PERFMON", "CAP_SYS_ADMIN", "CAP_IPC_LOCK"] {
            assert!(err.contains(cap), "{err}");
        }
    } else {
        eprintln!("SKIPPED unprivileged part: no /usr/bin/setpriv");
    }
    let _ = fs::remove_dir_all(dir);
}

#[test]
fn lost_samples_are_counted_and_marked() {
    let _serial = serial();
    if !can_run("lost_samples_are_counted_and_marked") {
        return;
    }
    // A two-entry sample map cannot hold the stacks of a 256 MiB populate.
    let (r, dir) = run_json(
        "lost",
        &[
            "-b",
            "256M",
            "-v",
            "none_anonymous.populate",
            "-n",
            "1",
            "--sample-map-entries",
            "2",
        ],
    );
    let mmap = phase(case(&r, "none_anonymous.populate"), "mmap");
    let lost = mmap["sampled"]["lost"].as_u64().unwrap();
    assert!(
        lost > 0,
        "a full sample map must count lost samples: {}",
        mmap["sampled"]
    );
    let table = dmaprof().arg("report").arg(dir.join("report.json")).output().unwrap();
    ok(&table);
    let t = String::from_utf8_lossy(&table.stdout);
    assert!(
        t.contains("events lost") && t.contains('*'),
        "the table must mark lost events: {t}"
    );
    fs::remove_dir_all(dir).unwrap();
    // The BPF program says so itself (aya-log), once per phase, shown with --debug only.
    let run = |debug: bool| {
        let dir = tmpdir("lost-log");
        let mut cmd = dmaprof();
        cmd.args(["run", "-o"])
            .arg(&dir)
            .args(["-b", "64M", "-v", "none_anonymous.populate", "-n", "1"]);
        cmd.args(["--sample-map-entries", "2"]).env_remove("RUST_LOG");
        if debug {
            cmd.arg("--debug");
        }
        let out = cmd.output().unwrap();
        ok(&out);
        fs::remove_dir_all(dir).unwrap();
        String::from_utf8_lossy(&out.stderr).into_owned()
    };
    let shown = run(true);
    let slots = warned_slots(&shown);
    assert!(!slots.is_empty(), "--debug shows the BPF side's warning: {shown}");
    // A slot is cleared whenever what it recorded is dropped: after every primer, and when an
    // iteration is run again (its buffer came in another layout). It warns once per recording.
    let primer = profiler::loader::PRIMER_SLOT;
    let recordings = 1 + shown.matches("running it again").count();
    let over: Vec<_> = slots
        .iter()
        .filter(|&&(slot, n)| slot != primer && n > recordings)
        .collect();
    assert!(
        over.is_empty(),
        "one warning per phase slot and recording ({recordings}), not per lost sample: \
         (slot, warnings) {over:?} in {shown}"
    );
    let quiet = run(false);
    assert!(
        !quiet.contains("dmaprof: bpf"),
        "without --debug nothing is shown: {quiet}"
    );
}

/// (phase slot, warnings) for each slot the BPF side said its sample map was full in.
fn warned_slots(stderr: &str) -> Vec<(u32, usize)> {
    let mut slots = std::collections::BTreeMap::new();
    for line in stderr.lines() {
        if let Some(rest) = line.split("sample map full in phase slot ").nth(1) {
            let slot = rest.split(':').next().and_then(|n| n.trim().parse().ok());
            *slots.entry(slot.expect("a slot number in the warning")).or_insert(0) += 1;
        }
    }
    slots.into_iter().collect()
}

#[test]
fn leftovers_are_seen_while_running_and_gone_after() {
    let _serial = serial();
    if !can_run("leftovers_are_seen_while_running_and_gone_after") {
        return;
    }
    let leftovers = || {
        let o = dmaprof().args(["doctor", "--leftovers", "--json"]).output().unwrap();
        let v: Value = serde_json::from_slice(&o.stdout).unwrap();
        (o.status.code(), v)
    };
    let (code, before) = leftovers();
    assert_eq!(code, Some(0), "leftovers before the run: {before}");
    let dir = tmpdir("leftovers");
    let mut child = dmaprof()
        // Many traced iterations: the case's traced passes then start right after its
        // warm-up, whichever end of its rotation the exact pass takes.
        .args([
            "run",
            "-b",
            "1G",
            "-v",
            "none_anonymous.touch",
            "-n",
            "1",
            "--traced-iterations",
            "10",
            "-o",
        ])
        .arg(&dir)
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    // While it runs, its programs, links and process are visible (the check can fail).
    let mut seen = None;
    for _ in 0..200 {
        std::thread::sleep(std::time::Duration::from_millis(50));
        let (code, v) = leftovers();
        if code == Some(1) && !v["links"].as_array().unwrap().is_empty() {
            seen = Some(v);
            break;
        }
    }
    // SAFETY: signalling our own child process.
    unsafe { libc::kill(child.id() as i32, libc::SIGTERM) };
    let status = child.wait().unwrap();
    let seen = seen.expect("doctor --leftovers never saw the running dmaprof's links");
    for key in ["programs", "processes"] {
        assert!(!seen[key].as_array().unwrap().is_empty(), "{key} not seen: {seen}");
    }
    assert!(matches!(status.code(), Some(143) | Some(0)), "{status}");
    let (code, after) = leftovers();
    assert_eq!(code, Some(0), "left behind: {after}");
    fs::remove_dir_all(dir).unwrap();
}

/// A tmpfs mounted for one test, unmounted when dropped (also when the test fails).
struct Mounted(PathBuf);

impl Drop for Mounted {
    fn drop(&mut self) {
        let _ = Command::new("umount").arg(&self.0).status();
    }
}

/// A full file system under --out: exit 1 with one line that names the file, says the file
/// system is full and what to do; no probes or processes are left behind.
#[test]
fn a_full_disk_fails_clearly_and_leaves_nothing() {
    let _serial = serial();
    if !can_run("a_full_disk_fails_clearly_and_leaves_nothing") {
        return;
    }
    let mnt = tmpdir("full-disk");
    fs::create_dir_all(&mnt).unwrap();
    let status = Command::new("mount")
        .args(["-t", "tmpfs", "-o", "size=48k", "tmpfs"])
        .arg(&mnt)
        .status()
        .expect("mount runs");
    assert!(status.success(), "mounting a 48 KiB tmpfs at {}", mnt.display());
    let _mounted = Mounted(mnt.clone());
    let out = dmaprof()
        .args(["run", "-b", "16M", "-v", "none_anonymous.*", "-n", "1", "-o"])
        .arg(mnt.join("out"))
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "stderr: {stderr}");
    let last = stderr.lines().last().unwrap_or_default();
    assert!(
        last.contains("file system is full")
            && last.contains("No space left on device")
            && last.contains(&mnt.display().to_string()),
        "{last}"
    );
    let left = dmaprof().args(["doctor", "--leftovers"]).output().unwrap();
    assert!(left.status.success(), "{}", String::from_utf8_lossy(&left.stdout));
}

fn free_hugepages(kb: u64) -> Option<u64> {
    pool(kb, "free_hugepages")
}

fn set_nr_hugepages(kb: u64, n: u64) {
    fs::write(
        format!("/sys/kernel/mm/hugepages/hugepages-{kb}kB/nr_hugepages"),
        n.to_string(),
    )
    .expect("writing nr_hugepages");
}

/// Another process holds every free hugepage of the pool: dmaprof raises the pool by what its
/// case needs, runs, and puts the pool back to exactly what it was, the holder's pages still
/// in use.
#[test]
fn hugepages_taken_by_another_holder_stay_theirs() {
    let _serial = serial();
    if !can_run("hugepages_taken_by_another_holder_stay_theirs") {
        return;
    }
    let Some(before) = nr_hugepages(2048) else {
        eprintln!("SKIPPED hugepages_taken_by_another_holder_stay_theirs: kernel has no 2 MiB hugetlb pool");
        return;
    };
    // The holder: this test, with two pages of its own, populated.
    let held = 2;
    set_nr_hugepages(2048, before + held);
    let len = (held * (2 << 20)) as usize;
    // SAFETY: an anonymous private mapping with no address hint; checked for MAP_FAILED.
    let ptr = unsafe {
        libc::mmap(
            std::ptr::null_mut(),
            len,
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_HUGETLB | libc::MAP_POPULATE,
            -1,
            0,
        )
    };
    assert_ne!(ptr, libc::MAP_FAILED, "the holder maps its hugepages");
    let free = free_hugepages(2048).unwrap();
    let out = dmaprof()
        .args([
            "run",
            "-b",
            "16M",
            "-v",
            "none_anonymous_hugetlb_2mb.populate",
            "-n",
            "1",
            "--no-trace",
            "-o",
        ])
        .arg(tmpdir("taken"))
        .output()
        .unwrap();
    let (after, free_after) = (nr_hugepages(2048), free_hugepages(2048));
    // SAFETY: the mapping made above, of this length.
    unsafe { libc::munmap(ptr, len) };
    set_nr_hugepages(2048, before);
    ok(&out);
    assert_eq!(after, Some(before + held), "the pool is back to what it was");
    assert_eq!(free_after, Some(free), "the holder's pages are still in use");
}

/// Maps `pages` 2 MiB hugepages populated, retrying while none are free, until `running`
/// says stop; the mapping, if it got one.
fn take_hugepages(pages: usize, running: &dyn Fn() -> bool) -> Option<*mut libc::c_void> {
    let len = pages * (2 << 20);
    while running() {
        // SAFETY: an anonymous private mapping with no address hint; checked for MAP_FAILED.
        let ptr = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                len,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_HUGETLB | libc::MAP_POPULATE,
                -1,
                0,
            )
        };
        if ptr != libc::MAP_FAILED {
            return Some(ptr);
        }
    }
    None
}

/// Another process takes the hugepages dmaprof reserved while they are free between two
/// iterations: the next mmap finds none, and the case is skipped saying so (not failed), the
/// pool restored.
#[test]
fn hugepages_taken_mid_case_skip_it() {
    let _serial = serial();
    if !can_run("hugepages_taken_mid_case_skip_it") {
        return;
    }
    let Some(before) = nr_hugepages(2048) else {
        eprintln!("SKIPPED hugepages_taken_mid_case_skip_it: kernel has no 2 MiB hugetlb pool");
        return;
    };
    let dir = tmpdir("taken-mid-case");
    let child = dmaprof()
        .args([
            "run",
            "-b",
            "16M",
            "-v",
            "none_anonymous_hugetlb_2mb.populate",
            "-n",
            "1000",
            "--no-trace",
            "-o",
        ])
        .arg(&dir)
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let pid = child.id();
    let alive = || fs::read_to_string(format!("/proc/{pid}/stat")).is_ok_and(|s| !s.contains(") Z "));
    let taken = take_hugepages(8, &alive);
    let out = child.wait_with_output().unwrap();
    if let Some(ptr) = taken {
        // SAFETY: the mapping take_hugepages made, of this length.
        unsafe { libc::munmap(ptr, 8 * (2 << 20)) };
    }
    // dmaprof lowered the pool while the taken pages were in use (surplus): released, they go.
    let after = nr_hugepages(2048);
    set_nr_hugepages(2048, before);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(taken.is_some(), "never caught the pages free between iterations: {err}");
    assert_eq!(out.status.code(), Some(4), "the only case skipped: {err}");
    let r: Value = serde_json::from_str(&fs::read_to_string(dir.join("report.json")).unwrap()).unwrap();
    let reason = r["skipped"][0]["reason"].as_str().unwrap_or_default();
    assert!(
        reason.contains("another process took the pages reserved for this case"),
        "{r}"
    );
    assert!(r["failed"].as_array().is_none_or(Vec::is_empty), "{r}");
    assert_eq!(after, Some(before), "the pool is back to what it was");
    let _ = fs::remove_dir_all(&dir);
}

/// A perl one-liner making `ioctl`s with the DMA request numbers on /dev/null (ENOTTY, but
/// the syscalls happen): 3 VFIO_IOMMU_MAP_DMA of 4, 8 and 12 KiB, one VFIO_IOMMU_UNMAP_DMA,
/// then a forked child's IOMMU_IOAS_MAP of 64 KiB at 8 GiB. perl is Essential in Debian.
const FAKE_MAPS: &str = r#"open(F, "</dev/null");
for $i (1..3) { $m = pack("LLQQQ", 32, 3, 0, (1 << 32) + $i * 4096, 4096 * $i); ioctl(F, 0x3b71, $m); }
$u = pack("LLQQ", 24, 0, 1 << 32, 8192); ioctl(F, 0x3b72, $u);
if (fork() == 0) { $a = pack("LLLLQQQ", 40, 0, 1, 0, 0, 65536, 1 << 33); ioctl(F, 0x3b85, $a); exit 0 }
wait;"#;

/// `record -- CMD`: the command runs to its end, every DMA ioctl of it and of its child is one
/// call with its IOVA, size and return value, `report` re-renders it, nothing is left.
#[test]
fn record_follows_a_command_and_its_children() {
    if !can_run("record_follows_a_command_and_its_children") {
        return;
    }
    let _serial = serial();
    let dir = tmpdir("record-true");
    let out = dmaprof()
        .args(["record", "--json", "-o"])
        .arg(&dir)
        .args(["--", "/bin/true"])
        .output()
        .unwrap();
    ok(&out);
    let r: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(r["schema"], "dmaprof.record.v1");
    assert_eq!(r["calls"].as_array().map(Vec::len), Some(0), "{r}");
    assert_eq!(
        (r["process"]["exit_code"].as_i64(), r["partial"].as_bool()),
        (Some(0), Some(false))
    );
    assert!(dir.join("report.json").is_file());
    let dir = tmpdir("record-perl");
    let out = dmaprof()
        .args(["record", "--json", "-o"])
        .arg(&dir)
        .args(["--", "perl", "-e", FAKE_MAPS])
        .output()
        .unwrap();
    ok(&out);
    let r: Value = serde_json::from_slice(&out.stdout).unwrap();
    let calls = r["calls"].as_array().unwrap();
    let kinds: Vec<&str> = calls.iter().map(|c| c["kind"].as_str().unwrap()).collect();
    assert_eq!(
        kinds,
        [
            "VFIO_IOMMU_MAP_DMA",
            "VFIO_IOMMU_MAP_DMA",
            "VFIO_IOMMU_MAP_DMA",
            "VFIO_IOMMU_UNMAP_DMA",
            "IOMMU_IOAS_MAP"
        ]
    );
    let sizes: Vec<u64> = calls.iter().map(|c| num(&c["size"], "size")).collect();
    assert_eq!(sizes, [4096, 8192, 12288, 8192, 65536]);
    assert_eq!(
        (num(&calls[0]["iova"], "iova"), num(&calls[4]["iova"], "iova")),
        ((1 << 32) + 4096, 1 << 33)
    );
    assert!(calls.iter().all(|c| c["ret"] == -i64::from(libc::ENOTTY)), "{calls:?}");
    assert_ne!(calls[4]["pid"], calls[0]["pid"], "the child is a process of its own");
    assert_eq!(r["by_kind"][0]["failed"], 3);
    let shown = dmaprof().arg("report").arg(dir.join("report.json")).output().unwrap();
    ok(&shown);
    assert!(String::from_utf8_lossy(&shown.stdout).contains("VFIO_IOMMU_UNMAP_DMA"));
    recording_outputs(&dir);
    let left = dmaprof().args(["doctor", "--leftovers"]).output().unwrap();
    assert!(left.status.success(), "{}", String::from_utf8_lossy(&left.stdout));
    let _ = fs::remove_dir_all(&dir);
}

/// What a saved recording of FAKE_MAPS gives: its page, CSV, a self-diff and `explain`.
fn recording_outputs(dir: &Path) {
    // The recording's page: a row per ioctl kind and per call among the longest.
    let html = fs::read_to_string(dir.join("index.html")).unwrap();
    for needle in ["By ioctl", "Longest calls", "<td>IOMMU_IOAS_MAP</td>", "0x200000000"] {
        assert!(html.contains(needle), "index.html lacks {needle}");
    }
    assert_eq!(
        html.matches("<td>VFIO_IOMMU_MAP_DMA</td>").count(),
        4,
        "a kind row and 3 calls"
    );
    let csv = dmaprof()
        .args(["report", "--csv"])
        .arg(dir.join("report.json"))
        .output()
        .unwrap();
    ok(&csv);
    assert_eq!(
        String::from_utf8_lossy(&csv.stdout).lines().count(),
        6,
        "a header and a row per call"
    );
    let diff = dmaprof()
        .arg("diff")
        .arg(dir.join("report.json"))
        .arg(dir.join("report.json"))
        .output()
        .unwrap();
    ok(&diff);
    assert!(String::from_utf8_lossy(&diff.stdout).contains("3 -> 3"));
    // Failed calls have no categories to explain.
    let explained = dmaprof().arg("explain").arg(dir.join("report.json")).output().unwrap();
    ok(&explained);
    assert!(String::from_utf8_lossy(&explained.stdout).contains("nothing stands out"));
}

/// A recording samples its processes on every CPU: a child that burns CPU outside any DMA
/// ioctl shows up in `sampled.outside` and its flamegraph, nothing inside.
#[test]
fn record_samples_its_processes() {
    if !can_run("record_samples_its_processes") {
        return;
    }
    let _serial = serial();
    let dir = tmpdir("record-sampled");
    let out = dmaprof()
        .args(["record", "--json", "-o"])
        .arg(&dir)
        .args([
            "--",
            "sh",
            "-c",
            "dd if=/dev/zero of=/dev/null bs=64K count=40000 2>/dev/null",
        ])
        .output()
        .unwrap();
    ok(&out);
    let r: Value = serde_json::from_slice(&out.stdout).unwrap();
    let s = &r["sampled"];
    assert_eq!(s["freq_hz"], 999, "{s}");
    assert_eq!(s["in_calls"]["samples"], 0, "{s}");
    assert!(
        num(&s["outside"]["samples"], "samples") >= 20,
        "dd's copying is sampled: {s}"
    );
    let folded = fs::read_to_string(dir.join("outside.folded")).unwrap();
    assert!(
        folded.contains("read_iter") || folded.contains("read_zero") || folded.contains("clear_user"),
        "{folded}"
    );
    let html = fs::read_to_string(dir.join("index.html")).unwrap();
    assert!(html.contains("Sampled stacks") && html.contains("outside.svg"));
    let _ = fs::remove_dir_all(&dir);
}

/// The recorded process's mmap/munmap/madvise/mremap calls: as many as strace counts for the
/// same command.
#[test]
fn record_counts_memory_syscalls_as_strace_does() {
    if !can_run("record_counts_memory_syscalls_as_strace_does") {
        return;
    }
    let _serial = serial();
    let cmd = ["dd", "if=/dev/zero", "of=/dev/null", "bs=64M", "count=4"];
    let Ok(traced) = Command::new("strace")
        .args(["-c", "-e", "trace=mmap,munmap,madvise,mremap"])
        .args(cmd)
        .output()
    else {
        eprintln!("SKIPPED record_counts_memory_syscalls_as_strace_does: no strace");
        return;
    };
    let table = String::from_utf8_lossy(&traced.stderr);
    let strace_calls: u64 = table
        .lines()
        .find(|l| l.trim_end().ends_with(" total"))
        .and_then(|l| l.split_whitespace().nth(3)?.parse().ok())
        .unwrap_or_else(|| panic!("no total in strace's table: {table}"));
    let dir = tmpdir("record-memory");
    let out = dmaprof()
        .args(["record", "--json", "-o"])
        .arg(&dir)
        .arg("--")
        .args(cmd)
        .output()
        .unwrap();
    ok(&out);
    let r: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(
        num(&r["memory_syscalls"]["calls"], "calls"),
        strace_calls,
        "{}",
        r["memory_syscalls"]
    );
    assert!(num(&r["memory_syscalls"]["ns"], "ns") > 0);
    let _ = fs::remove_dir_all(&dir);
}

/// A missing process is one line and exit 2 with nothing created; -p and a command together,
/// or neither, are clap's errors.
#[test]
fn record_refuses_bad_targets() {
    if !can_run("record_refuses_bad_targets") {
        return;
    }
    let dir = tmpdir("record-bad");
    let out_dir = dir.to_str().unwrap();
    assert_one_clear_line(&["record", "-p", "999999", "-o", out_dir], 2, "999999");
    assert!(!dir.exists(), "nothing is left behind");
    assert_one_clear_line(&["record", "-o", out_dir, "--", "/nonexistent/cmd"], 2, "No such file");
    assert!(!dir.exists());
    assert_one_clear_line(&["record", "-p", "1", "--", "true"], 2, "cannot be used with");
    assert_one_clear_line(&["record"], 2, "required");
}

/// `record -p`: a running process (and the child it forks) is recorded until it exits; a
/// recording of a process that does not end stops at Ctrl-C with exit 0, marked partial,
/// and leaves that process alone.
#[test]
fn record_watches_running_processes() {
    if !can_run("record_watches_running_processes") {
        return;
    }
    let _serial = serial();
    let mut target = Command::new("perl")
        .args(["-e", &format!("sleep 2; {FAKE_MAPS}")])
        .spawn()
        .unwrap();
    let dir = tmpdir("record-pid");
    let out = dmaprof()
        .args(["record", "--json", "-o"])
        .arg(&dir)
        .args(["-p", &target.id().to_string()])
        .output()
        .unwrap();
    ok(&out);
    assert!(target.wait().unwrap().success());
    let r: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(r["calls"].as_array().map(Vec::len), Some(5), "{r}");
    assert_eq!(r["process"]["pids"][0], target.id());
    let mut sleeper = Command::new("sleep").arg("30").spawn().unwrap();
    let recorder = dmaprof()
        .args(["record", "--json", "-o"])
        .arg(&dir)
        .args(["-p", &sleeper.id().to_string()])
        .stdout(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    std::thread::sleep(std::time::Duration::from_millis(1500));
    // SAFETY: kill has no memory preconditions; the pid is our own child.
    unsafe { libc::kill(recorder.id() as i32, libc::SIGINT) };
    let out = recorder.wait_with_output().unwrap();
    ok(&out);
    let r: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(r["partial"], true);
    assert_eq!(sleeper.try_wait().unwrap(), None, "a -p process is not ours to stop");
    sleeper.kill().unwrap();
    let _ = sleeper.wait();
    let _ = fs::remove_dir_all(&dir);
}

/// `--duration` ends a recording; the command it started is stopped with SIGTERM (exit 143).
#[test]
fn record_duration_stops_the_command() {
    if !can_run("record_duration_stops_the_command") {
        return;
    }
    let _serial = serial();
    let dir = tmpdir("record-duration");
    let started = std::time::Instant::now();
    let out = dmaprof()
        .args(["record", "--json", "--duration", "1s", "-o"])
        .arg(&dir)
        .args(["--", "sleep", "30"])
        .output()
        .unwrap();
    ok(&out);
    assert!(started.elapsed() < std::time::Duration::from_secs(20));
    let r: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(
        (r["process"]["exit_code"].as_i64(), r["partial"].as_bool()),
        (Some(143), Some(false))
    );
    assert!(num(&r["duration_ns"], "duration_ns") >= 1_000_000_000);
    let _ = fs::remove_dir_all(&dir);
}

/// ftrace's stack traces, with `sym-addr`, as ` => name <address>` frame lines: a private mount
/// of tracefs (in a new mount namespace, so the host's mounts are untouched) and an instance of
/// its own record the kernel stack of every page allocation of a `dd`.
const KERNEL_STACKS: &str = r#"D=$(mktemp -d) && mount -t tracefs nodev $D || exit 3
I=$D/instances/dmaprof-symbols
mkdir $I && cd $I || exit 4
echo 1 > options/stacktrace; echo 1 > options/sym-addr; echo 1 > options/event-fork
echo $$ > set_event_pid; echo 1 > events/kmem/mm_page_alloc/enable
dd if=/dev/zero of=/dev/null bs=4M count=2 2>/dev/null
echo 0 > events/kmem/mm_page_alloc/enable
grep '^ => ' trace
cd /; rmdir $I; umount $D; rmdir $D"#;

#[test]
fn kernel_stacks_resolve_as_the_kernel_names_them() {
    if !can_run("kernel_stacks_resolve_as_the_kernel_names_them") {
        return;
    }
    let out = Command::new("unshare")
        .args(["-m", "sh", "-c", KERNEL_STACKS])
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    if !out.status.success() || text.is_empty() {
        eprintln!(
            "SKIPPED kernel_stacks_resolve_as_the_kernel_names_them: no ftrace stack traces here ({}: {})",
            out.status,
            String::from_utf8_lossy(&out.stderr).trim()
        );
        return;
    }
    let frames: std::collections::BTreeSet<(u64, String)> = text
        .lines()
        .filter_map(|l| {
            let (name, addr) = l.strip_prefix(" => ")?.split_once(" <")?;
            Some((u64::from_str_radix(addr.strip_suffix('>')?, 16).ok()?, name.to_owned()))
        })
        .collect();
    let symbols = profiler::symbols::KernelSymbols::load().unwrap();
    let wrong: Vec<String> = frames
        .iter()
        .filter(|(addr, name)| symbols.resolve(*addr) != *name)
        .map(|(addr, name)| format!("{addr:x}: kernel {name}, dmaprof {}", symbols.resolve(*addr)))
        .collect();
    assert!(frames.len() >= 20, "too few frames to compare: {text}");
    assert!(
        wrong.is_empty(),
        "{} of {} frames differ: {wrong:#?}",
        wrong.len(),
        frames.len()
    );
    eprintln!("{} distinct kernel frames named as the kernel names them", frames.len());
}
