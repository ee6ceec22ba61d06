//! The built-in QEMU test bed (see ../shared/notes/vm-testbed.md).
use anyhow::{Result, bail};
use clap::Args;

/// Arguments of `cargo xtask vm`.
#[derive(Args)]
pub struct VmArgs {
    /// Arguments for dmaprof inside the guest.
    #[arg(last = true)]
    args: Vec<String>,
}

/// `cargo xtask vm`.
pub fn run(_args: VmArgs) -> Result<()> {
    bail!("the VM test bed is not built yet")
}

/// `cargo xtask run` without --host: the default matrix in the VM.
pub fn run_default(_args: Vec<String>) -> Result<()> {
    bail!("the VM test bed is not built yet; use `cargo xtask run --host`")
}

/// The VM part of `cargo xtask test`.
pub fn test() -> Result<()> {
    eprintln!("xtask: SKIP: VM tests: the VM test bed is not built yet");
    Ok(())
}
