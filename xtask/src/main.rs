//! dmaprof's task runner: `cargo xtask <setup|build|run|test|vm|bench>`.
//!
//! xtask stays a thin orchestrator: it installs what the build needs (idempotently, saying what it
//! installs), builds, and runs dmaprof or its tests. Each subcommand lives in its own module.
mod build;
mod fuzz;
mod setup;
// Which toolchain builds the BPF programs: the rule profiler/build.rs follows.
#[path = "../../profiler/bpf_toolchain.rs"]
mod bpf_toolchain;
// The workspace's one size type (std + thiserror only, so xtask compiles the same file).
#[allow(dead_code, reason = "xtask uses only part of the size API")]
#[path = "../../profiler/src/size.rs"]
mod size;
// The workspace's OS helpers (locks, timestamps), shared with dmaprof the same way.
#[allow(dead_code, reason = "xtask uses only part of the helpers")]
#[path = "../../profiler/src/sys.rs"]
mod sys;
mod test;
mod vm;

use std::process::ExitCode;

use clap::{Parser, Subcommand};

#[derive(Parser)]
#[command(name = "cargo xtask", about = "Build, run and test dmaprof")]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Install what building and testing dmaprof needs (Debian packages, bpf-linker, the rustup
    /// link to Debian's toolchain, chromium for the HTML report's browser test). Idempotent;
    /// prints what it installs.
    Setup,
    /// Set up, then build dmaprof (release) with its BPF object embedded.
    Build,
    /// Set up, build, then run dmaprof: in the built-in VM by default, on this host with --host.
    Run(build::RunArgs),
    /// Set up, build, then run every test (lint, unit, host integration, VM).
    Test(test::TestArgs),
    /// Boot the built-in QEMU test bed and run `dmaprof <args>` inside it.
    Vm(vm::VmArgs),
    /// Measure what tracing costs (traced / untraced, per mechanism, against bpftrace), start-up
    /// time and peak RSS; prints a markdown table and writes docs/bench.md.
    Bench(vm::bench::BenchArgs),
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    let result = match cli.command {
        Command::Setup => setup::ensure_build_deps().and_then(|()| setup::ensure_browser()),
        Command::Build => build::build_release().map(|_| ()),
        Command::Run(args) => build::run(args),
        Command::Test(args) => test::run(&args),
        Command::Vm(args) => vm::run(args),
        Command::Bench(args) => vm::bench::run(&args),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("xtask: error: {e:#}");
            ExitCode::FAILURE
        }
    }
}
