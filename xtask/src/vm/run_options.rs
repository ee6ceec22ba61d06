//! The options of `dmaprof run` that take a value, which xtask must know to read a run's
//! command line (to find `-b` or `-o` without taking the glob of `-v -b` for a size). The
//! profiler's tests compile this file and compare it with its clap definition
//! (`profiler/tests/xtask.rs`), so a new option cannot be missed here.

/// Short options that take a value.
pub const VALUED_SHORT: &[char] = &['b', 'd', 'n', 'o', 'v'];

/// Long options that take a value.
pub const VALUED_LONG: &[&str] = &[
    "--demote-above",
    "--device",
    "--freq",
    "--iterations",
    "--out",
    "--passes",
    "--prefault",
    "--probes",
    "--sample-map-entries",
    "--settle",
    "--size",
    "--thp",
    "--traced-iterations",
    "--variant",
];
