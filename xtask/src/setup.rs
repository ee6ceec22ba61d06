//! Idempotent installation of the build prerequisites.
//!
//! The BPF target needs a rustc with the matching library source (`-Z build-std=core`) and a
//! bpf-linker built against that rustc's LLVM. On the project's machines that is Debian's
//! `rustc-web` (1.96, LLVM 22) plus bpf-linker 0.13 built with `llvm-22-dev`; elsewhere a rustup
//! nightly with rust-src serves as well. [`bpf_toolchain`] is the one place that decides which.
use std::{path::Path, process::Command};

use anyhow::{Context as _, Result, bail};

/// bpf-linker version that matches LLVM 22 and our rustc.
const BPF_LINKER_VERSION: &str = "0.13.0";

/// Runs a command, echoing it, failing with its exit status.
pub fn run_cmd(cmd: &mut Command) -> Result<()> {
    eprintln!("xtask: running {cmd:?}");
    let status = cmd.status().with_context(|| format!("could not start {cmd:?}"))?;
    if !status.success() {
        bail!("{cmd:?} failed with {status}");
    }
    Ok(())
}

fn succeeds(cmd: &mut Command) -> bool {
    cmd.output().is_ok_and(|o| o.status.success())
}

fn dpkg_installed(pkg: &str) -> bool {
    Command::new("dpkg-query")
        .args(["-W", "-f=${Status}", pkg])
        .output()
        .is_ok_and(|o| String::from_utf8_lossy(&o.stdout).contains("install ok installed"))
}

/// Installs the Debian packages that are missing (running `apt-get update` once first).
pub fn ensure_debian_packages(why: &str, pkgs: &[&str]) -> Result<()> {
    let missing: Vec<&str> = pkgs.iter().copied().filter(|p| !dpkg_installed(p)).collect();
    if missing.is_empty() {
        return Ok(());
    }
    if !Path::new("/usr/bin/apt-get").exists() {
        bail!("missing packages {missing:?} ({why}) and no apt-get here: install their equivalents by hand");
    }
    eprintln!("xtask: installing Debian packages for {why}: {}", missing.join(" "));
    run_cmd(Command::new("apt-get").args(["update", "-q"]))?;
    run_cmd(
        Command::new("apt-get")
            .args(["install", "-y", "-q", "--no-install-recommends"])
            .args(&missing)
            .env("DEBIAN_FRONTEND", "noninteractive"),
    )
}

fn cargo_bin_dir() -> std::path::PathBuf {
    std::env::var_os("CARGO_HOME")
        .map(Into::into)
        .or_else(|| std::env::var_os("HOME").map(|h| Path::new(&h).join(".cargo")))
        .unwrap_or_else(|| "/root/.cargo".into())
        .join("bin")
}

/// Is there a nightly rustup toolchain with rust-src (the laptop recipe)?
fn nightly_with_rust_src() -> bool {
    Command::new("rustup")
        .args(["run", "nightly", "rustc", "--print", "sysroot"])
        .output()
        .ok()
        .filter(|o| o.status.success())
        .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_owned())
        .is_some_and(|sysroot| Path::new(&sysroot).join("lib/rustlib/src/rust/library/core").exists())
}

/// The rustc that builds the BPF object (and the fuzz targets, which need `-Z` flags as well).
#[derive(Debug, PartialEq, Eq)]
pub enum BpfToolchain {
    /// Debian's `rustc-web` linked into rustup as `debian` (installed by [`ensure_build_deps`]).
    Debian,
    /// A rustup nightly with rust-src.
    Nightly,
    /// Another rustup toolchain `DMAPROF_BPF_TOOLCHAIN` names; the user provides it.
    Named(String),
}

impl BpfToolchain {
    /// The rustup toolchain name (`cargo +<name>`).
    pub fn name(&self) -> &str {
        match self {
            Self::Debian => "debian",
            Self::Nightly => "nightly",
            Self::Named(n) => n,
        }
    }
}

/// Which BPF toolchain to use, by the rule build.rs follows too (`profiler/bpf_toolchain.rs`):
/// `$DMAPROF_BPF_TOOLCHAIN` if set; else Debian's where apt-get is (setup installs it) or it is
/// linked already, else a nightly with rust-src if there is one.
pub fn bpf_toolchain() -> BpfToolchain {
    let debian = Path::new("/usr/bin/apt-get").exists()
        || succeeds(Command::new("rustup").args(["run", "debian", "rustc", "--version"]));
    choose_toolchain(
        std::env::var("DMAPROF_BPF_TOOLCHAIN").ok().as_deref(),
        debian,
        nightly_with_rust_src,
    )
}

fn choose_toolchain(explicit: Option<&str>, debian: bool, has_nightly: impl FnOnce() -> bool) -> BpfToolchain {
    match crate::bpf_toolchain::choose(explicit, debian, has_nightly).as_str() {
        "debian" => BpfToolchain::Debian,
        "nightly" => BpfToolchain::Nightly,
        other => BpfToolchain::Named(other.to_owned()),
    }
}

/// Ensures the browser the HTML report's test loads the page in (headless; as root it runs
/// with --no-sandbox). Without it that test is skipped, saying so.
pub fn ensure_browser() -> Result<()> {
    ensure_debian_packages("the HTML report's browser test (headless chromium)", &["chromium"])
}

/// Ensures everything `cargo build -p profiler` needs for its BPF object.
pub fn ensure_build_deps() -> Result<()> {
    let toolchain = bpf_toolchain();
    let bpf_linker = cargo_bin_dir().join("bpf-linker");
    if toolchain == BpfToolchain::Debian {
        ensure_debian_packages(
            "the BPF toolchain (rustc 1.96 with library source and its clippy, LLVM 22 for bpf-linker)",
            &[
                "rustc-web",
                "rust-web-src",
                "rust-web-clippy",
                "llvm-22-dev",
                "libpolly-22-dev",
            ],
        )?;
        if !succeeds(Command::new("rustup").args(["run", "debian", "rustc", "--version"])) {
            eprintln!("xtask: linking Debian's toolchain into rustup as `debian`");
            run_cmd(Command::new("rustup").args(["toolchain", "link", "debian", "/usr"]))?;
        }
    }
    let linker_ok = Command::new(&bpf_linker)
        .arg("--version")
        .output()
        .is_ok_and(|o| o.status.success() && String::from_utf8_lossy(&o.stdout).contains(BPF_LINKER_VERSION));
    if !linker_ok {
        eprintln!(
            "xtask: installing bpf-linker {BPF_LINKER_VERSION} into {} (about a minute)",
            bpf_linker.display()
        );
        let mut cmd = Command::new("cargo");
        cmd.args(["install", "bpf-linker", "--version", BPF_LINKER_VERSION]);
        if toolchain != BpfToolchain::Nightly {
            cmd.args(["--no-default-features", "--features", "llvm-22"])
                .env("LLVM_PREFIX", "/usr/lib/llvm-22");
        }
        run_cmd(&mut cmd)?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn toolchain_choice() {
        let never = || panic!("not asked when the answer is known");
        assert_eq!(choose_toolchain(Some("nightly"), true, never), BpfToolchain::Nightly);
        assert_eq!(choose_toolchain(Some("debian"), false, never), BpfToolchain::Debian);
        assert_eq!(
            choose_toolchain(Some("my-bpf"), true, never),
            BpfToolchain::Named("my-bpf".into())
        );
        assert_eq!(choose_toolchain(None, true, never), BpfToolchain::Debian);
        assert_eq!(choose_toolchain(Some(""), true, never), BpfToolchain::Debian);
        assert_eq!(choose_toolchain(None, false, || true), BpfToolchain::Nightly);
        assert_eq!(choose_toolchain(None, false, || false), BpfToolchain::Debian);
        assert_eq!(BpfToolchain::Named("x".into()).name(), "x");
    }
}
