//! The built-in QEMU test bed: boots a guest with a real
//! VFIO/IOMMUFD kernel, runs `dmaprof <args>` in it and brings its output back to the host.
//!
//! - [`kernel`]: which kernel (custom, stock Debian, a user's bzImage), prepared once and cached.
//! - [`initramfs`]: the guest's root (busybox, modules, dmaprof, `/init`) as a newc cpio.
//! - [`qemu`]: one boot with a host-side deadline and console checks.
//! - [`transfer`]: the guest -> host protocol (exit marker, output archive on the data port).
//! - [`tests`]: the VM part of `cargo xtask test`.
//!
//! Everything downloaded or built lives under `$DMAPROF_CACHE` (default `~/.cache/dmaprof`).
mod apt;
pub mod bench;
mod guest_qemu;
mod initramfs;
mod kernel;
mod kunit;
mod qemu;
mod run_options;
mod tests;
pub mod transfer;

use std::{
    fs,
    path::{Path, PathBuf},
    process::Command,
    time::{Duration, SystemTime, UNIX_EPOCH},
};

use anyhow::{Context as _, Result, bail};
use clap::Args;
use qemu::Clock;

use crate::{
    build::{build_static, build_vm_init, static_dmaprof_path},
    size::ByteSize,
};

/// Arguments of `cargo xtask vm`.
#[derive(Args)]
pub struct VmArgs {
    /// Guest kernel: custom (built once from Debian's newest linux-source-7.x with
    /// xtask/vm/custom.config; has IOMMUFD), debian-6.12, debian-7.3, debian-6.1 (stock, type1
    /// only), or a path to a bzImage.
    #[arg(long, default_value = "custom")]
    kernel: String,
    /// With a bzImage: modules to load (an INSTALL_MOD_PATH root or a lib/modules/<kver> dir).
    #[arg(long)]
    modules: Option<PathBuf>,
    /// Guest memory (QEMU -m): 2G, 1536M; a bare number is MiB, as QEMU reads it. Default 2G,
    /// or N+3 G with --hugepages-1g N (1 GiB pages come only from the RAM q35 puts above 4 GiB,
    /// less the top gigabyte the kernel takes).
    #[arg(long, value_parser = qemu_mem)]
    mem: Option<ByteSize>,
    /// Guest CPUs.
    #[arg(long, default_value_t = 2)]
    smp: u32,
    /// 1 GiB hugepages to reserve at boot (kernel command line).
    #[arg(long, default_value_t = 0)]
    hugepages_1g: u32,
    /// 2 MiB hugepages to reserve at run time.
    #[arg(long, default_value_t = 0)]
    hugepages_2m: u32,
    /// What the guest's clocks count: real (the host's time) or instructions (QEMU -icount:
    /// the same work takes the same time whatever the host's load, so before/after runs and
    /// the probe-cost estimate hold still; memory and caches cost nothing).
    #[arg(long, value_enum, default_value_t = Clock::Real)]
    clock: Clock,
    /// Host directory for what dmaprof wrote (default: dmaprof-out/vm-<timestamp>).
    #[arg(long)]
    out: Option<PathBuf>,
    /// Host-side limit for the whole boot, in seconds.
    #[arg(long, default_value_t = 1800)]
    timeout: u64,
    /// Testing: run this busybox sh command line in the guest instead of dmaprof.
    #[arg(long, hide = true)]
    guest_cmd: Option<String>,
    /// Testing: extra guest kernel command line.
    #[arg(long, hide = true, default_value = "")]
    append: String,
    /// Testing: run the VM test suite (the VM part of `cargo xtask test`) and nothing else.
    #[arg(long, hide = true)]
    self_test: bool,
    /// Arguments for dmaprof inside the guest.
    #[arg(last = true)]
    args: Vec<String>,
}

/// The cache directory: `$DMAPROF_CACHE`, else `$HOME/.cache/dmaprof`.
pub fn cache_dir() -> Result<PathBuf> {
    let dir = match std::env::var_os("DMAPROF_CACHE").filter(|v| !v.is_empty()) {
        Some(d) => PathBuf::from(d),
        None => {
            let home = std::env::var_os("HOME")
                .filter(|v| !v.is_empty())
                .unwrap_or_else(|| "/root".into());
            Path::new(&home).join(".cache/dmaprof")
        }
    };
    fs::create_dir_all(&dir).with_context(|| format!("creating the cache {}", dir.display()))?;
    Ok(dir)
}

/// What runs in the guest.
#[derive(Clone)]
enum Payload {
    /// `dmaprof <args>`.
    Dmaprof(Vec<String>),
    /// A busybox sh command line (tests).
    Shell(String),
}

/// One guest run, fully described.
#[derive(Clone)]
struct Plan<'a> {
    kernel: &'a kernel::Kernel,
    /// The static guest init (`build::build_vm_init`).
    init: &'a Path,
    dmaprof: Option<&'a Path>,
    payload: Payload,
    mem: ByteSize,
    smp: u32,
    hugepages_1g: u32,
    hugepages_2m: u32,
    append: &'a str,
    clock: Clock,
    timeout: Duration,
    echo: bool,
    /// Host files to copy into the guest at the same path.
    host_files: Vec<PathBuf>,
    /// Host directories laid over the guest's root (`initramfs::Guest::overlays`).
    overlays: Vec<PathBuf>,
}

/// The guest directory dmaprof writes to: the value of `-o`/`--out` in `args`.
fn out_option(args: &[String]) -> Option<String> {
    option_value(args, 'o', "--out")
}

/// The value of the `dmaprof run` option `-<short>`/`<long>` in `args`, in any spelling clap
/// accepts: `-o x`, `-ox`, `-o=x`, `--out x`, `--out=x`. The values of the other options are
/// skipped (the lists in `run_options`), so `-v -o` is a variant named `-o`.
fn option_value(args: &[String], short: char, long: &str) -> Option<String> {
    let short_flag = format!("-{short}");
    let mut it = args.iter();
    while let Some(a) = it.next() {
        if a == "--" {
            break;
        }
        if *a == short_flag || a == long {
            return it.next().cloned();
        }
        if let Some(v) = a.strip_prefix(long).and_then(|v| v.strip_prefix('=')) {
            return Some(v.to_owned());
        }
        if let Some(v) = a
            .strip_prefix(&short_flag)
            .filter(|v| !v.is_empty() && !a.starts_with("--"))
        {
            return Some(v.strip_prefix('=').unwrap_or(v).to_owned());
        }
        let valued_short = a.len() == 2
            && a.strip_prefix('-')
                .is_some_and(|c| run_options::VALUED_SHORT.iter().any(|s| c.starts_with(*s)));
        if valued_short || run_options::VALUED_LONG.contains(&a.as_str()) {
            it.next();
        }
    }
    None
}

/// `dmaprof run` or `record` without `-o` gets `-o /out` (the directory shipped back; their
/// own default is below the guest's working directory); returns the args and the guest output dir.
fn guest_args(mut args: Vec<String>) -> (Vec<String>, String) {
    match out_option(&args) {
        Some(dir) => (args, dir),
        None => {
            if args.first().is_some_and(|a| a == "run" || a == "record") {
                args.splice(1..1, ["-o".to_owned(), "/out".to_owned()]);
            }
            (args, "/out".to_owned())
        }
    }
}

/// Boots the guest once (with one retry on an Oops); the work dir is removed afterwards.
fn execute(plan: Plan) -> std::result::Result<qemu::Outcome, qemu::BootError> {
    let setup_err = |e: anyhow::Error| qemu::BootError {
        kind: qemu::FailKind::NoExitMarker,
        message: format!("{e:#}"),
        elapsed: Duration::ZERO,
    };
    let cache = cache_dir().map_err(setup_err)?;
    let work = cache.join("run").join(format!("{}-{}", std::process::id(), nanos()));
    fs::create_dir_all(&work).map_err(|e| setup_err(e.into()))?;
    let (payload, out_dir) = match plan.payload {
        Payload::Dmaprof(args) => {
            let (args, out) = guest_args(args);
            (Payload::Dmaprof(args), out)
        }
        shell @ Payload::Shell(_) => (shell, "/out".to_owned()),
    };
    let initrd = work.join("initramfs.cpio");
    let guest = initramfs::Guest {
        init: plan.init,
        dmaprof: plan.dmaprof,
        modules: &plan.kernel.modules,
        payload: &payload,
        out_dir: &out_dir,
        hugepages_2m: plan.hugepages_2m,
        hugepages_1g: plan.hugepages_1g,
        host_files: &plan.host_files,
        overlays: &plan.overlays,
    };
    initramfs::write(&initrd, &guest).map_err(setup_err)?;
    let boot = qemu::Boot {
        kernel: &plan.kernel.image,
        initrd: &initrd,
        mem: plan.mem,
        smp: plan.smp,
        hugepages_1g: plan.hugepages_1g,
        append: plan.append,
        clock: plan.clock,
        timeout: plan.timeout,
        echo: plan.echo,
        data_file: work.join("ttyS1.out"),
    };
    let _lock = vm_lock(&cache).map_err(setup_err)?;
    let result = qemu::boot_with_retry(&boot);
    fs::remove_dir_all(&work).ok();
    result
}

/// One VM at a time on this machine (2 cores): an exclusive flock on `<cache>/vm.lock`, waited for
/// if another xtask (a developer's or CI's) holds it. Released when the returned file is dropped.
fn vm_lock(cache: &Path) -> Result<crate::sys::FileLock> {
    let path = cache.join("vm.lock");
    match crate::sys::try_lock(&path) {
        Err(crate::sys::LockError::Held(_)) => {
            eprintln!(
                "xtask: another VM is running on this machine; waiting for it ({})",
                path.display()
            );
            Ok(crate::sys::lock(&path, true)?)
        }
        other => Ok(other?),
    }
}

fn nanos() -> u128 {
    SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |d| d.as_nanos())
}

/// Guest memory when --mem is not given: q35 keeps 2 GiB below 4 GiB and 1 GiB pages fit only
/// above it, where the kernel also takes the top gigabyte for itself (measured: N pages need
/// N+3 GiB).
fn default_mem(hugepages_1g: u32) -> ByteSize {
    let gib = if hugepages_1g == 0 {
        2
    } else {
        u64::from(hugepages_1g) + 3
    };
    ByteSize::new(gib << 30).expect("a whole number of GiB is a size")
}

/// Why a `--mem` value is not one QEMU takes.
#[derive(Debug, thiserror::Error)]
enum MemError {
    /// Not a size.
    #[error(transparent)]
    Size(#[from] crate::size::SizeError),
    /// Not whole MiB.
    #[error("{0} is not a whole number of MiB (QEMU's -m unit)")]
    NotMib(ByteSize),
}

/// `--mem` as QEMU's `-m` reads it: a size (`2G`, `1536M`), a bare number being MiB; whole MiB.
fn qemu_mem(text: &str) -> Result<ByteSize, MemError> {
    let t = text.trim();
    let size = if !t.is_empty() && t.bytes().all(|b| b.is_ascii_digit()) {
        format!("{t}M").parse::<ByteSize>()
    } else {
        t.parse::<ByteSize>()
    }?;
    if !size.is_multiple_of(1 << 20) {
        return Err(MemError::NotMib(size));
    }
    Ok(size)
}

/// UTC `YYYYMMDD-HHMMSS` for output directory names.
fn timestamp() -> String {
    crate::sys::timestamp()
}

/// Unpacks a shipped output archive into `dir`.
fn unpack_archive(archive: &[u8], dir: &Path) -> Result<()> {
    fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
    let tgz = dir.join(".dmaprof-vm-out.tgz");
    fs::write(&tgz, archive)?;
    let out = Command::new("tar")
        .arg("-xzf")
        .arg(&tgz)
        .arg("--no-same-owner")
        .arg("-C")
        .arg(dir)
        .output();
    fs::remove_file(&tgz).ok();
    let out = out.context("could not start tar")?;
    if !out.status.success() {
        bail!(
            "unpacking the guest's output into {} failed: {}",
            dir.display(),
            String::from_utf8_lossy(&out.stderr).trim()
        );
    }
    Ok(())
}

/// `cargo xtask vm`.
pub fn run(args: VmArgs) -> Result<()> {
    if args.self_test {
        // `cargo xtask vm --self-test -- <name>...` runs only the tests whose names contain one.
        return tests::run(&args.args);
    }
    let choice = kernel::Choice::parse(&args.kernel)?;
    if args.modules.is_some() && !matches!(choice, kernel::Choice::User { .. }) {
        bail!("--modules goes with --kernel <path to a bzImage>");
    }
    let mem = args.mem.unwrap_or_else(|| default_mem(args.hugepages_1g));
    if args.hugepages_1g > 0 && mem < default_mem(args.hugepages_1g) {
        eprintln!(
            "xtask: warning: --mem {mem} leaves room for fewer than {} 1 GiB pages (needs about {})",
            args.hugepages_1g,
            default_mem(args.hugepages_1g)
        );
    }
    kernel::ensure_vm_packages()?;
    // A test command line gets dmaprof too when a static build is at hand (it is not built for it).
    let dmaprof = match &args.guest_cmd {
        Some(_) => Some(static_dmaprof_path()).filter(|p| p.exists()),
        None => Some(build_static()?),
    };
    let init = build_vm_init()?;
    let cache = cache_dir()?;
    let kernel = kernel::prepare(&choice, args.modules.as_deref(), &cache)?;
    let payload = match args.guest_cmd {
        Some(cmd) => Payload::Shell(cmd),
        None => Payload::Dmaprof(args.args),
    };
    let (overlays, host_files) = guest_tools(&payload, &cache)?;
    eprintln!(
        "xtask: booting {} ({} RAM, {} CPUs, TCG, {} clock; timeout {}s)",
        kernel.label,
        mem,
        args.smp,
        match args.clock {
            Clock::Real => "real",
            Clock::Instructions => "instruction-count",
        },
        args.timeout
    );
    let outcome = execute(Plan {
        kernel: &kernel,
        init: &init,
        dmaprof: dmaprof.as_deref(),
        payload,
        mem,
        smp: args.smp,
        hugepages_1g: args.hugepages_1g,
        hugepages_2m: args.hugepages_2m,
        append: &args.append,
        clock: args.clock,
        timeout: Duration::from_secs(args.timeout),
        echo: true,
        host_files,
        overlays,
    })?;
    if args.hugepages_1g > 0 {
        let got = outcome.console.iter().find_map(|l| {
            l.split("dmaprof-vm: 1 GiB hugepages: ")
                .nth(1)?
                .split_whitespace()
                .next()?
                .parse::<u32>()
                .ok()
        });
        if got.is_some_and(|g| g < args.hugepages_1g) {
            eprintln!(
                "xtask: warning: the guest kernel reserved {} of {} 1 GiB pages (give more --mem)",
                got.unwrap_or(0),
                args.hugepages_1g
            );
        }
    }
    if let Some(archive) = &outcome.archive {
        let out = args
            .out
            .unwrap_or_else(|| Path::new("dmaprof-out").join(format!("vm-{}", timestamp())));
        unpack_archive(archive, &out)?;
        let shown = fs::canonicalize(&out).unwrap_or(out);
        eprintln!("xtask: the guest's output is in {}", shown.display());
        let report = shown.join("report.json");
        if report.exists() {
            eprintln!("xtask: report: {}", report.display());
        }
    }
    eprintln!(
        "xtask: guest finished in {:.1}s, exit status {}",
        outcome.elapsed.as_secs_f64(),
        outcome.exit_status
    );
    if outcome.exit_status != 0 {
        // The exit status is dmaprof's own.
        std::process::exit(outcome.exit_status.clamp(1, 255));
    }
    Ok(())
}

/// What the guest needs besides dmaprof for `payload` (as `Plan::overlays`, `Plan::host_files`):
/// QEMU with its firmware and libraries when the dmaprof arguments run `qemu-system-x86_64`
/// (about 60 MB, so only then).
fn guest_tools(payload: &Payload, cache: &Path) -> Result<(Vec<PathBuf>, Vec<PathBuf>)> {
    match payload {
        Payload::Dmaprof(args) if guest_qemu::named_in(args) => {
            let qemu = guest_qemu::prepare(cache)?;
            eprintln!(
                "xtask: shipping QEMU {} into the guest as /usr/bin/{}",
                qemu.version,
                guest_qemu::BINARY
            );
            Ok((vec![qemu.root], qemu.libraries))
        }
        _ => Ok((Vec::new(), Vec::new())),
    }
}

/// `cargo xtask run` without --host: `dmaprof run <args>` in the VM with the custom kernel.
pub fn run_default(args: Vec<String>) -> Result<()> {
    let mut all = vec!["run".to_owned()];
    // The guest has 2 GiB and emulated CPUs: 256 MiB per case keeps the whole matrix to
    // minutes (what the kernel selftests' -b would be for a quick run). -b overrides it.
    if !has_size_option(&args) {
        all.extend(["-b".to_owned(), "256M".to_owned()]);
    }
    all.extend(args);
    // One vCPU on the instruction clock. QEMU emulates its vCPUs in turn on one host thread,
    // so a second vCPU's timer ticks, softirqs and RCU kthreads land inside the first one's
    // phases, which real CPUs would run beside them: on two vCPUs the probe-cost estimate read
    // 0.58-0.75x on small maps (about 0.5 ms each no probe explained), on one 0.86-1.15x in all
    // 17 phases it is read in. The instruction clock holds the emulator's pace still, so the
    // same work takes the same time from run to run and kernel to kernel.
    run(VmArgs {
        kernel: "custom".to_owned(),
        modules: None,
        mem: None,
        smp: 1,
        hugepages_1g: 0,
        hugepages_2m: 0,
        clock: Clock::Instructions,
        out: None,
        timeout: 1800,
        guest_cmd: None,
        append: String::new(),
        self_test: false,
        args: all,
    })
}

/// Whether `dmaprof run` arguments give `-b`/`--size`, in any spelling clap accepts.
fn has_size_option(args: &[String]) -> bool {
    option_value(args, 'b', "--size").is_some()
}

/// The VM part of `cargo xtask test`.
pub fn test() -> Result<()> {
    tests::run(&[])
}

/// A dynamically linked host binary with the shared libraries `ldd` lists for it and the
/// dynamic loader: what the guest needs to run it (as `host_files`). A library `ldd` cannot
/// find on this host is an error naming it (the guest could not start the binary either).
pub(crate) fn with_libraries(binary: &Path) -> Result<Vec<PathBuf>> {
    let out = Command::new("ldd").arg(binary).output().context("running ldd")?;
    let mut files = vec![binary.to_owned()];
    let text = String::from_utf8_lossy(&out.stdout);
    let missing: Vec<&str> = text
        .lines()
        .filter(|l| l.contains("=> not found"))
        .filter_map(|l| l.split_whitespace().next())
        .collect();
    if !missing.is_empty() {
        bail!(
            "{} needs {} that this host does not have (install the Debian packages that ship them)",
            binary.display(),
            missing.join(", ")
        );
    }
    for line in text.lines() {
        // "libx.so.1 => /lib/x86_64-linux-gnu/libx.so.1 (0x...)" or "/lib64/ld-linux-x86-64.so.2 (0x...)".
        let path = line
            .split("=>")
            .nth(1)
            .unwrap_or(line)
            .split_whitespace()
            .next()
            .unwrap_or_default();
        if path.starts_with('/') {
            files.push(PathBuf::from(path));
        }
    }
    Ok(files)
}

#[cfg(test)]
mod unit {
    use super::*;

    fn strings(v: &[&str]) -> Vec<String> {
        v.iter().map(|s| (*s).to_owned()).collect()
    }

    #[test]
    fn run_without_out_gets_guest_out_dir() {
        let (args, dir) = guest_args(strings(&["run", "-b", "1G"]));
        assert_eq!(args, strings(&["run", "-o", "/out", "-b", "1G"]));
        assert_eq!(dir, "/out");
        let (args, _) = guest_args(strings(&["record", "--", "qemu-system-x86_64", "-o", "x"]));
        assert_eq!(
            args,
            strings(&["record", "-o", "/out", "--", "qemu-system-x86_64", "-o", "x"])
        );
        let (args, dir) = guest_args(strings(&["record", "-o", "/r", "--", "true"]));
        assert_eq!(
            (args, dir.as_str()),
            (strings(&["record", "-o", "/r", "--", "true"]), "/r")
        );
    }

    #[test]
    fn explicit_out_is_kept_and_shipped() {
        for given in [
            &["run", "-o", "/r"][..],
            &["run", "--out", "/r"],
            &["run", "--out=/r"],
            &["run", "-o/r"],
            &["run", "-o=/r"],
            &["run", "-v", "-o", "-o", "/r"],
        ] {
            let (args, dir) = guest_args(strings(given));
            assert_eq!(args, strings(given));
            assert_eq!(dir, "/r");
        }
        let (args, dir) = guest_args(strings(&["doctor", "--json"]));
        assert_eq!(args, strings(&["doctor", "--json"]));
        assert_eq!(dir, "/out");
    }

    #[test]
    fn size_option_in_every_spelling() {
        for given in [
            &["-b", "1G"][..],
            &["-b1G"],
            &["-b=1G"],
            &["--size", "1G"],
            &["--size=1G"],
            &["-v", "x", "-b", "64M"],
        ] {
            assert!(has_size_option(&strings(given)), "{given:?}");
        }
        for given in [
            &[][..],
            &["-v", "-b"],
            &["--variant", "-b1G"],
            &["--sizes"],
            &["--", "-b", "1G"],
            &["-n", "1"],
            &["-b"],
        ] {
            assert!(!has_size_option(&strings(given)), "{given:?}");
        }
        // Every other option's value is skipped, whatever it looks like.
        let others = run_options::VALUED_LONG.iter().filter(|o| **o != "--size");
        for opt in others.copied().chain(["-v", "-o", "-n", "-d"]) {
            assert!(!has_size_option(&strings(&[opt, "-b1G"])), "{opt} -b1G");
            assert!(has_size_option(&strings(&[opt, "x", "-b1G"])), "{opt} x -b1G");
        }
        for opt in ["--passes", "--traced-iterations", "--thp", "--sample-map-entries"] {
            assert!(run_options::VALUED_LONG.contains(&opt), "{opt}");
        }
    }

    #[test]
    fn mem_sizes() {
        assert_eq!(qemu_mem("2G").unwrap().mib(), 2048);
        assert_eq!(qemu_mem("1536M").unwrap().mib(), 1536);
        assert_eq!(qemu_mem("512").unwrap().mib(), 512, "a bare number is MiB, as for QEMU");
        assert!(qemu_mem("lots").is_err());
        assert!(qemu_mem("0").is_err());
        assert!(qemu_mem("1028K").is_err(), "not whole MiB");
        assert_eq!(default_mem(0).mib(), 2048);
        assert_eq!(default_mem(2).mib(), 5 << 10);
    }

    #[test]
    fn timestamp_shape() {
        let t = timestamp();
        assert_eq!(t.len(), 15, "{t}");
        assert_eq!(&t[8..9], "-");
    }

    #[test]
    fn unknown_kernel_is_one_clear_error() {
        let e = kernel::Choice::parse("debian-5.10").err().expect("unknown kernel");
        let msg = format!("{e:#}");
        assert!(
            msg.contains("unknown --kernel `debian-5.10`") && !msg.contains('\n'),
            "{msg}"
        );
    }

    #[test]
    fn cpio_is_newc_and_aligned() {
        let mut c = initramfs::Cpio::new(Vec::new());
        c.dir("bin").unwrap();
        c.file("bin/x", 0o755, b"hello").unwrap();
        c.char_dev("dev/console", 5, 1).unwrap();
        let out = c.finish().unwrap();
        assert!(out.starts_with(b"070701"));
        assert_eq!(out.len() % 512, 0);
        let text = String::from_utf8_lossy(&out);
        assert!(text.contains("bin/x\0") && text.contains("hello") && text.contains("TRAILER!!!\0"));
        // The second header follows "bin\0" (110 + 4 bytes, padded to 116): ino 2, mode 0100755, size 5.
        let h = &text[116..];
        assert_eq!(&h[..6], "070701");
        assert_eq!(&h[6..14], "00000002");
        assert_eq!(&h[14..22], "000081ed");
        assert_eq!(&h[54..62], "00000005");
    }
}
