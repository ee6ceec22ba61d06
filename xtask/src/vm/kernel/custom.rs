//! The custom kernel: built once from Debian's newest `linux-source-7.x` with
//! `xtask/vm/custom.config` merged onto `make tinyconfig` (IOMMUFD, VFIO cdev, kprobes, BTF).
use std::{fs, path::Path, process::Command};

use anyhow::{Context as _, Result, bail};

use super::{Kernel, extract_modules, finish, fresh_dir, load, resolve, sanitize};
use crate::{
    setup::{ensure_debian_packages, run_cmd},
    vm::{
        apt::{self, Apt},
        transfer::sha256_hex,
    },
};

/// The kernel config fragment merged onto `make tinyconfig`.
const FRAGMENT: &str = include_str!("../../../vm/custom.config");

pub fn prepare(cache: &Path) -> Result<Kernel> {
    let hash = &sha256_hex(FRAGMENT.as_bytes())[..12];
    let suffix = format!("-{hash}");
    let (apt, pkg) = match resolve(
        Apt::new(cache),
        r"^linux-source-7\.[0-9]+$",
        "linux-source-7.x",
        cache,
        "custom-",
        &suffix,
    )? {
        Ok(x) => x,
        Err(dir) => return load(&dir, "custom".to_owned()),
    };
    let name = format!("custom-{}{suffix}", sanitize(&pkg.version));
    let dir = cache.join("kernels").join(&name);
    let label = format!("custom ({} {}, fragment {hash})", pkg.name, pkg.version);
    if dir.join("ready").exists() {
        return load(&dir, label);
    }
    ensure_debian_packages(
        "building the custom guest kernel",
        &[
            "make",
            "gcc",
            "flex",
            "bison",
            "bc",
            "libelf-dev",
            "libssl-dev",
            "dwarves",
            "kmod",
            "xz-utils",
            "cpio",
        ],
    )?;
    let deb = apt.download(&pkg)?;
    let build = cache.join("build").join(&name);
    fresh_dir(&build)?;
    let log = cache.join("build").join(format!("{name}.log"));
    eprintln!(
        "xtask: building the custom guest kernel from {} {} with xtask/vm/custom.config \
         (once; 10-15 min on 2 cores); log: {}",
        pkg.name,
        pkg.version,
        log.display()
    );
    apt::unpack(&deb, &build.join("deb"))?;
    let tarball = fs::read_dir(build.join("deb/usr/src"))?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .find(|p| p.to_string_lossy().ends_with(".tar.xz"))
        .context("no .tar.xz in the linux-source package")?;
    run_cmd(Command::new("tar").arg("-xf").arg(&tarball).arg("-C").arg(&build))?;
    fs::remove_dir_all(build.join("deb")).ok();
    let src = fs::read_dir(&build)?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .find(|p| p.join("Makefile").exists())
        .context("no kernel tree in the linux-source tarball")?;
    let out = build.join("out");
    fs::create_dir_all(&out)?;
    let frag = build.join("custom.config");
    fs::write(&frag, FRAGMENT)?;
    let jobs = std::thread::available_parallelism()
        .map_or(2, |n| n.get() + 1)
        .to_string();
    let logged = |args: &[&str]| -> Result<()> {
        let file = fs::OpenOptions::new().create(true).append(true).open(&log)?;
        let mut cmd = Command::new("make");
        cmd.current_dir(&src).arg(format!("O={}", out.display())).args(args);
        cmd.stdout(file.try_clone()?).stderr(file);
        eprintln!("xtask: running make {}", args.join(" "));
        let status = cmd.status().context("could not start make")?;
        if !status.success() {
            let text = fs::read_to_string(&log).unwrap_or_default();
            let tail: Vec<&str> = text.lines().rev().take(30).collect();
            let tail: Vec<&str> = tail.into_iter().rev().collect();
            bail!(
                "make {} failed ({status}); last lines of {}:\n{}",
                args.join(" "),
                log.display(),
                tail.join("\n")
            );
        }
        Ok(())
    };
    fs::write(&log, "")?;
    logged(&["tinyconfig"])?;
    let file = fs::OpenOptions::new().append(true).open(&log)?;
    run_cmd(
        Command::new(src.join("scripts/kconfig/merge_config.sh"))
            .current_dir(&src)
            .arg("-m")
            .arg("-O")
            .arg(&out)
            .arg(out.join(".config"))
            .arg(&frag)
            .stdout(file.try_clone()?)
            .stderr(file),
    )?;
    logged(&["olddefconfig"])?;
    check_config(&fs::read_to_string(out.join(".config"))?)?;
    logged(&[&format!("-j{jobs}"), "bzImage", "modules"])?;
    let mods = build.join("mods");
    logged(&[
        "modules_install",
        &format!("INSTALL_MOD_PATH={}", mods.display()),
        "INSTALL_MOD_STRIP=1",
    ])?;
    let tmp = dir.with_extension("tmp");
    fresh_dir(&tmp)?;
    fs::copy(out.join("arch/x86/boot/bzImage"), tmp.join("vmlinuz"))?;
    fs::copy(out.join(".config"), tmp.join("config"))?;
    extract_modules(&mods, &tmp)?;
    finish(&tmp, &dir)?;
    eprintln!("xtask: custom guest kernel ready in {}", dir.display());
    fs::remove_dir_all(&build).ok();
    load(&dir, label)
}

/// Fails if an option the fragment asks for did not survive `olddefconfig` (a missing dependency).
fn check_config(config: &str) -> Result<()> {
    let missing: Vec<&str> = FRAGMENT
        .lines()
        .map(str::trim)
        .filter(|l| l.starts_with("CONFIG_"))
        .filter(|l| !config.lines().any(|c| c.trim() == *l))
        .collect();
    if !missing.is_empty() {
        bail!("xtask/vm/custom.config asks for options that olddefconfig dropped (unmet dependencies?): {missing:?}");
    }
    Ok(())
}
