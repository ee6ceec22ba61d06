//! Building dmaprof and running it (`cargo xtask build`, `cargo xtask run`).
use std::{
    path::{Path, PathBuf},
    process::Command,
};

use anyhow::{Context as _, Result, bail};
use clap::Args;

use crate::setup::{ensure_build_deps, run_cmd};

/// Workspace root (xtask lives one level below it).
pub fn workspace_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("xtask sits inside the workspace")
        .to_path_buf()
}

/// The target of the static binaries the VM's initramfs holds.
const STATIC_TARGET: &str = "x86_64-unknown-linux-gnu";

/// Builds `bin` of `package` (release) and returns its path: for the host, or (with
/// `static_target`) fully static for that target, as the VM's initramfs needs it. cargo keeps
/// it cached; a rebuild only happens when its sources changed.
fn cargo_build(package: &str, bin: &str, static_target: Option<&str>) -> Result<PathBuf> {
    let mut cmd = Command::new("cargo");
    cmd.current_dir(workspace_root())
        .args(["build", "--release", "--package", package, "--bin", bin]);
    let mut out = workspace_root().join("target");
    if let Some(target) = static_target {
        cmd.args(["--target", target])
            .env("RUSTFLAGS", "-C target-feature=+crt-static");
        out = out.join(target);
    }
    run_cmd(&mut cmd)?;
    Ok(out.join("release").join(bin))
}

/// Builds the release dmaprof for the host and returns its path.
pub fn build_release() -> Result<PathBuf> {
    ensure_build_deps()?;
    cargo_build("profiler", "dmaprof", None)
}

/// Builds a fully static dmaprof (for the VM's initramfs) and returns its path.
pub fn build_static() -> Result<PathBuf> {
    ensure_build_deps()?;
    cargo_build("profiler", "dmaprof", Some(STATIC_TARGET))
}

/// Where [`build_static`] puts the static dmaprof (it may not be built yet).
pub fn static_dmaprof_path() -> PathBuf {
    workspace_root()
        .join("target")
        .join(STATIC_TARGET)
        .join("release/dmaprof")
}

/// Builds the VM guest's static `/init` (`src/bin/dmaprof-vm-init.rs`) and returns its path.
pub fn build_vm_init() -> Result<PathBuf> {
    cargo_build("xtask", "dmaprof-vm-init", Some(STATIC_TARGET))
}

/// Builds the C reference for untraced map times (`xtask/guest/dma_map_ref.c`) static with
/// gcc, cached by the source's hash, and returns its path.
pub fn build_c_reference() -> Result<PathBuf> {
    let src = workspace_root().join("xtask/guest/dma_map_ref.c");
    let text = std::fs::read(&src).with_context(|| format!("reading {}", src.display()))?;
    let hash = &crate::vm::transfer::sha256_hex(&text)[..12];
    let out = crate::vm::cache_dir()?.join(format!("dma_map_ref-{hash}"));
    if !out.exists() {
        crate::setup::ensure_debian_packages("the C reference (static glibc)", &["gcc", "libc6-dev"])?;
        run_cmd(
            Command::new("gcc")
                .args(["-O2", "-Wall", "-Wextra", "-Werror", "-static", "-o"])
                .arg(&out)
                .arg(&src),
        )?;
    }
    Ok(out)
}

/// Arguments of `cargo xtask run`.
#[derive(Args)]
pub struct RunArgs {
    /// Run on this host's kernel instead of the built-in VM.
    #[arg(long)]
    host: bool,
    /// Arguments for `dmaprof run` (default: the whole matrix).
    #[arg(last = true)]
    args: Vec<String>,
}

/// `cargo xtask run`: the README's main command.
pub fn run(args: RunArgs) -> Result<()> {
    let has_device = args.args.iter().any(|a| a == "-d" || a.starts_with("--device"))
        || std::env::var_os("VFIO_SELFTESTS_BDF").is_some();
    if args.host || has_device {
        let dmaprof = build_release()?;
        let status = Command::new(&dmaprof)
            .arg("run")
            .args(&args.args)
            .status()
            .with_context(|| format!("could not start {}", dmaprof.display()))?;
        if !status.success() {
            bail!("dmaprof exited with {status}");
        }
        return Ok(());
    }
    crate::vm::run_default(args.args)
}
