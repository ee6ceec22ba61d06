//! The fuzz part of `cargo xtask test`: each cargo-fuzz target runs for a short, fixed time on
//! its kept corpus (fuzz/corpus/<target>). A crash fails the suite; libFuzzer leaves the input
//! in fuzz/artifacts/<target>/.
use std::{path::PathBuf, process::Command};

use anyhow::{Result, bail};

use crate::{build::workspace_root, setup::run_cmd};

/// The targets (fuzz/fuzz_targets/<name>.rs).
const TARGETS: &[&str] = &["parse_size", "read_report"];

/// Seconds each target runs in the test suite.
const SECONDS: u32 = 20;

fn cargo_fuzz_installed() -> bool {
    Command::new("cargo")
        .args(["fuzz", "--version"])
        .output()
        .is_ok_and(|o| o.status.success())
}

/// Runs every fuzz target for [`SECONDS`]; returns (passed, failed).
pub fn run() -> Result<(u32, u32)> {
    if !cargo_fuzz_installed() {
        eprintln!("xtask: installing cargo-fuzz (about a minute)");
        run_cmd(Command::new("cargo").args(["install", "cargo-fuzz", "--version", "0.13.2"]))?;
    }
    // libFuzzer instrumentation needs -Z flags: the BPF build's toolchain (Debian's rustc with
    // RUSTC_BOOTSTRAP, or a nightly). The build is cached outside the clone: it takes minutes.
    let toolchain = crate::setup::bpf_toolchain();
    let toolchain = toolchain.name();
    let target_dir = std::env::var_os("HOME")
        .map(PathBuf::from)
        .unwrap_or_else(|| "/root".into())
        .join(".cache/dmaprof/fuzz-target");
    let fuzz_dir = workspace_root().join("fuzz");
    let (mut passed, mut failed) = (0, 0);
    for t in TARGETS {
        // New inputs go to a scratch corpus first in the list; the kept one is only read.
        let scratch = target_dir.join("corpus").join(t);
        std::fs::create_dir_all(&scratch)?;
        let status = Command::new("cargo")
            .current_dir(&fuzz_dir)
            .arg(format!("+{toolchain}"))
            .args(["fuzz", "run", "--sanitizer", "none", "-O", t])
            .arg(&scratch)
            .arg(fuzz_dir.join("corpus").join(t))
            .args(["--", &format!("-max_total_time={SECONDS}"), "-print_final_stats=1"])
            .env("RUSTC_BOOTSTRAP", "1")
            .env("DMAPROF_NO_BPF", "1")
            .env("CARGO_TARGET_DIR", &target_dir)
            .status()?;
        if status.success() {
            passed += 1;
            println!("fuzz {t} ... ok ({SECONDS}s)");
        } else {
            failed += 1;
            println!("fuzz {t} ... FAILED: {status}; the input is in fuzz/artifacts/{t}/");
        }
    }
    if failed > 0 {
        bail!("{failed} fuzz target(s) found a crash");
    }
    Ok((passed, failed))
}
