//! The report reader never panics on any input, and what it accepts renders and diffs.
#![no_main]
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    if let Ok(text) = std::str::from_utf8(data)
        && let Ok(report) = profiler::report::parse(text)
    {
        let _ = profiler::table::render_table(&report);
        let _ = profiler::diff::render_diff(&profiler::diff::diff(&report, &report));
    }
});
