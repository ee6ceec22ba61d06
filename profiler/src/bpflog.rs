//! The BPF programs' own reports of rare events (an unbalanced call stack, a call stack deeper
//! than the BPF side tracks, a full sample map), forwarded from aya-log-ebpf. They are counted
//! in the report's counters either way; the text is shown with `--debug` (or `RUST_LOG=debug`).
use std::sync::atomic::{AtomicBool, Ordering};

static SHOW: AtomicBool = AtomicBool::new(false);

/// Shows forwarded records on stderr from now on.
pub fn show(on: bool) {
    SHOW.store(on, Ordering::Relaxed);
}

/// Whether `RUST_LOG` asks for debug output.
pub fn rust_log_debug() -> bool {
    std::env::var("RUST_LOG").is_ok_and(|v| v.split(',').any(|d| d.ends_with("debug") || d.ends_with("trace")))
}

/// The `log` sink the BPF records go to.
pub struct BpfLog;

impl log::Log for BpfLog {
    fn enabled(&self, _: &log::Metadata) -> bool {
        true
    }

    fn log(&self, record: &log::Record) {
        if SHOW.load(Ordering::Relaxed) {
            eprintln!(
                "dmaprof: bpf {}: {}",
                record.level().as_str().to_lowercase(),
                record.args()
            );
        }
    }

    fn flush(&self) {}
}
