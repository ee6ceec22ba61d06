//! Builds profiler-ebpf for the BPF target and leaves the object in OUT_DIR, where `probes`
//! embeds it, with the toolchain `bpf_toolchain.rs` chooses (xtask follows the same rule).
use std::{env, process::Command};

use anyhow::{Context as _, anyhow};

#[path = "bpf_toolchain.rs"]
mod bpf_toolchain;

fn toolchain_works(name: &str) -> bool {
    Command::new("rustup")
        .args(["run", name, "rustc", "--version"])
        .output()
        .is_ok_and(|o| o.status.success())
}

fn main() -> anyhow::Result<()> {
    println!("cargo:rerun-if-env-changed=DMAPROF_BPF_TOOLCHAIN");
    println!("cargo:rerun-if-env-changed=DMAPROF_NO_BPF");
    if env::var_os("DMAPROF_NO_BPF").is_some() {
        // For builds that never load BPF (the fuzz targets): an empty object, which fails to
        // load with a clear error if anything tries.
        let out = std::path::PathBuf::from(env::var_os("OUT_DIR").expect("cargo sets OUT_DIR"));
        std::fs::write(out.join("profiler-ebpf"), b"")?;
        return Ok(());
    }
    let explicit = env::var("DMAPROF_BPF_TOOLCHAIN").ok();
    let debian = toolchain_works("debian") || std::path::Path::new("/usr/bin/apt-get").exists();
    let toolchain = bpf_toolchain::choose(explicit.as_deref(), debian, || toolchain_works("nightly"));
    if toolchain != "nightly" && env::var_os("RUSTC_BOOTSTRAP").is_none() {
        // A stable rustc (Debian's) accepts `-Z build-std` only with RUSTC_BOOTSTRAP; aya-build
        // reads it from our environment and passes it on to the inner cargo.
        // SAFETY: build scripts are single-threaded at this point; nothing reads env concurrently.
        unsafe { env::set_var("RUSTC_BOOTSTRAP", "1") };
    }
    if which_bpf_linker().is_none() {
        return Err(anyhow!(
            "bpf-linker not found in PATH or ~/.cargo/bin: run `cargo xtask setup` (it installs it)"
        ));
    }
    let package = aya_build::Package {
        name: "profiler-ebpf",
        root_dir: concat!(env!("CARGO_MANIFEST_DIR"), "/../profiler-ebpf"),
        ..Default::default()
    };
    aya_build::build_ebpf([package], aya_build::Toolchain::Custom(&toolchain)).with_context(|| {
        format!("building the BPF object with toolchain `{toolchain}` (run `cargo xtask setup` to install it)")
    })
}

fn which_bpf_linker() -> Option<std::path::PathBuf> {
    let path = env::var_os("PATH").unwrap_or_default();
    env::split_paths(&path)
        .chain(env::var_os("CARGO_HOME").map(|h| std::path::PathBuf::from(h).join("bin")))
        .map(|d| d.join("bpf-linker"))
        .find(|p| p.is_file())
}
