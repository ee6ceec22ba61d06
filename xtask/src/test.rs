//! `cargo xtask test`: every test the project has, in one command (what `.ci/run` calls).
use std::process::Command;

use anyhow::Result;
use clap::Args;

use crate::{
    build::{build_release, workspace_root},
    setup::run_cmd,
};

/// Arguments of `cargo xtask test`.
#[derive(Args)]
pub struct TestArgs {
    /// Skip the VM part of the suite (host tests only).
    #[arg(long)]
    no_vm: bool,
    /// Skip the fuzz targets.
    #[arg(long)]
    no_fuzz: bool,
}

/// Runs lint, unit, host integration and VM tests.
pub fn run(args: &TestArgs) -> Result<()> {
    let root = workspace_root();
    build_release()?;
    run_cmd(
        Command::new("cargo")
            .current_dir(&root)
            .args(["fmt", "--all", "--", "--check"]),
    )?;
    run_cmd(Command::new("cargo").current_dir(&root).args([
        "clippy",
        "--release",
        "--package",
        "profiler",
        "--package",
        "xtask",
        "--all-targets",
        "--",
        "-D",
        "warnings",
    ]))?;
    // The BPF/user ABI types as the host compiles them.
    run_cmd(Command::new("cargo").current_dir(&root).args([
        "clippy",
        "--release",
        "--package",
        "profiler-ebpf",
        "--lib",
        "--",
        "-D",
        "warnings",
    ]))?;
    clippy_bpf_programs(&root)?;
    crate::setup::ensure_browser()?;
    run_cmd(
        Command::new("cargo")
            .current_dir(&root)
            .args(["test", "--release", "--package", "profiler", "--package", "xtask"])
            .env("DMAPROF_BIN", root.join("target/release/dmaprof")),
    )?;
    if args.no_fuzz {
        eprintln!("xtask: SKIP: fuzz targets (--no-fuzz given)");
    } else {
        crate::fuzz::run()?;
    }
    if args.no_vm {
        eprintln!("xtask: SKIP: VM tests (--no-vm given)");
        return Ok(());
    }
    crate::vm::test()
}

/// The BPF programs under the workspace lints, as the BPF toolchain compiles them: its own
/// clippy (Debian's `rust-web-clippy` matches `rustc-web`) checks them for the BPF target.
fn clippy_bpf_programs(root: &std::path::Path) -> Result<()> {
    let toolchain = crate::setup::bpf_toolchain();
    run_cmd(
        Command::new("rustup")
            .current_dir(root.join("profiler-ebpf"))
            .args(["run", toolchain.name(), "cargo", "clippy", "--release"])
            .args([
                "--target",
                "bpfel-unknown-none",
                "-Z",
                "build-std=core",
                "--bin",
                "profiler-ebpf",
            ])
            .arg("--target-dir")
            .arg(root.join("target/bpf-clippy"))
            .args(["--", "-D", "warnings"])
            // Debian's stable rustc takes `-Z build-std` only with this, as build.rs does.
            .env("RUSTC_BOOTSTRAP", "1"),
    )
}
