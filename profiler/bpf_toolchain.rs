//! Which rustup toolchain builds the BPF programs: the one rule `profiler/build.rs` (which
//! builds them) and xtask (which installs that toolchain) both follow; each includes this file.

/// The toolchain's name: `explicit` (`DMAPROF_BPF_TOOLCHAIN`) when set; else `debian` (Debian's
/// `rustc-web` linked into rustup) when `debian` says it is there or apt-get can install it;
/// else `nightly` when `nightly` says one with rust-src is there; else `debian`, which `cargo
/// xtask setup` is then asked to provide.
pub fn choose(explicit: Option<&str>, debian: bool, nightly: impl FnOnce() -> bool) -> String {
    match explicit.filter(|t| !t.is_empty()) {
        Some(t) => t.to_owned(),
        None if debian => "debian".to_owned(),
        None if nightly() => "nightly".to_owned(),
        None => "debian".to_owned(),
    }
}
