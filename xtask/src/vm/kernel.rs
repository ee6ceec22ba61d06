//! Guest kernels: the custom one (built once from Debian's newest `linux-source-7.x` with
//! `xtask/vm/custom.config`), stock Debian kernels (unpacked, never installed) or a user's bzImage.
//!
//! Every prepared kernel lands in `<cache>/kernels/<name>/` as `vmlinuz` plus the VFIO modules
//! (decompressed, numbered in load order) and a `ready` stamp written last, so an interrupted
//! preparation is redone rather than half used.
use std::{
    fs,
    path::{Path, PathBuf},
    process::Command,
};

use anyhow::{Context as _, Result, bail};

use super::{
    apt::{self, Apt, Package},
    transfer::sha256_hex,
};
use crate::setup::{ensure_debian_packages, run_cmd};

/// The kernel config fragment merged onto `make tinyconfig`.
const FRAGMENT: &str = include_str!("../../vm/custom.config");

/// Modules the guest loads, in this order (each after its own dependencies). Absent ones are
/// skipped (`iommufd` exists only in the custom kernel).
const WANTED_MODULES: [&str; 4] = ["iommufd", "vfio", "vfio_iommu_type1", "vfio_pci"];

/// What `--kernel` can name, besides a path to a bzImage.
pub const NAMES: &str = "custom, debian-6.12, debian-7.3, debian-6.1 or a path to a bzImage";

/// A stock Debian kernel: where its packages are.
struct Stock {
    name: &'static str,
    /// apt-cache regex of the package holding vmlinuz (and the modules, unless `split`).
    image_regex: &'static str,
    /// Split packaging (7.x backports): vmlinuz in `linux-binary-<abi>`, modules in `linux-modules-<abi>`.
    split: bool,
}

const STOCK: [Stock; 3] = [
    Stock {
        name: "debian-6.12",
        image_regex: r"^linux-image-6\.12\.[0-9]+\+deb13-amd64-unsigned$",
        split: false,
    },
    Stock {
        name: "debian-7.3",
        image_regex: r"^linux-binary-(unsigned-)?7\.3\.[0-9]+\+deb13-amd64$",
        split: true,
    },
    Stock {
        name: "debian-6.1",
        image_regex: r"^linux-image-6\.1\.0-[0-9]+-amd64-unsigned$",
        split: false,
    },
];

/// The value of `--kernel`, checked.
pub enum Choice {
    Custom,
    Debian(&'static str),
    User { image: PathBuf },
}

impl Choice {
    pub fn parse(s: &str) -> Result<Self> {
        if s == "custom" {
            return Ok(Self::Custom);
        }
        if let Some(stock) = STOCK.iter().find(|k| k.name == s) {
            return Ok(Self::Debian(stock.name));
        }
        let path = Path::new(s);
        if path.is_file() {
            return Ok(Self::User {
                image: path.to_path_buf(),
            });
        }
        bail!("unknown --kernel `{s}`: expected {NAMES}")
    }
}

/// A kernel ready to boot.
pub struct Kernel {
    /// What to call it in messages, e.g. `custom 7.3.4-1~bpo13+1`.
    pub label: String,
    pub image: PathBuf,
    /// Decompressed modules in load order.
    pub modules: Vec<PathBuf>,
}

/// Host packages every guest boot needs.
pub fn ensure_vm_packages() -> Result<()> {
    ensure_debian_packages(
        "the VM test bed (QEMU, the guest's busybox, module tools)",
        &["qemu-system-x86", "busybox-static", "kmod", "xz-utils", "zstd"],
    )
}

/// Prepares (downloading and building as needed, cached) the kernel `choice` names.
pub fn prepare(choice: &Choice, user_modules: Option<&Path>, cache: &Path) -> Result<Kernel> {
    match choice {
        Choice::Custom => custom(cache),
        Choice::Debian(name) => {
            let stock = STOCK
                .iter()
                .find(|k| k.name == *name)
                .expect("parsed names are in STOCK");
            debian(stock, cache)
        }
        Choice::User { image } => user(image, user_modules, cache),
    }
}

/// Directory-name-safe form of a Debian version.
fn sanitize(version: &str) -> String {
    version
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || c == '.' || c == '-' {
                c
            } else {
                '_'
            }
        })
        .collect()
}

/// Loads a prepared kernel directory.
fn load(dir: &Path, label: String) -> Result<Kernel> {
    let mut modules: Vec<PathBuf> = fs::read_dir(dir.join("modules"))
        .with_context(|| format!("reading {}", dir.join("modules").display()))?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.extension().is_some_and(|e| e == "ko"))
        .collect();
    modules.sort();
    Ok(Kernel {
        label,
        image: dir.join("vmlinuz"),
        modules,
    })
}

/// The newest `<cache>/kernels/<prefix>*` that is ready (for running without the network).
fn newest_cached(cache: &Path, prefix: &str, suffix: &str) -> Option<PathBuf> {
    let mut dirs: Vec<PathBuf> = fs::read_dir(cache.join("kernels"))
        .ok()?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| {
            let n = p.file_name().unwrap_or_default().to_string_lossy().into_owned();
            n.starts_with(prefix) && n.ends_with(suffix) && p.join("ready").exists()
        })
        .collect();
    dirs.sort_by_key(|p| fs::metadata(p.join("ready")).and_then(|m| m.modified()).ok());
    dirs.pop()
}

/// Resolves the newest package, or falls back to the newest cached kernel when apt cannot answer.
fn resolve(
    apt: Result<Apt>,
    regex: &str,
    what: &str,
    cache: &Path,
    prefix: &str,
    suffix: &str,
) -> Result<std::result::Result<(Apt, Package), PathBuf>> {
    let found = apt.and_then(|apt| {
        apt.update(false)?;
        let pkg = match apt.newest(regex, |_| true)? {
            Some(p) => p,
            None => {
                apt.update(true)?;
                apt.newest(regex, |_| true)?
                    .with_context(|| format!("no package for {what} in the archive"))?
            }
        };
        Ok((apt, pkg))
    });
    match found {
        Ok(x) => Ok(Ok(x)),
        Err(e) => match newest_cached(cache, prefix, suffix) {
            Some(dir) => {
                eprintln!("xtask: warning: {e:#}; using the cached {}", dir.display());
                Ok(Err(dir))
            }
            None => Err(e),
        },
    }
}

/// Copies the wanted modules from a module tree (a dir holding `lib/modules/<kver>`), decompressed
/// and numbered in load order, into `dest/modules`.
fn extract_modules(tree: &Path, dest: &Path) -> Result<()> {
    // Debian trixie keeps modules in /usr/lib/modules; depmod and modprobe look below <base>/lib/modules.
    let base = [tree.to_path_buf(), tree.join("usr")]
        .into_iter()
        .find(|b| b.join("lib/modules").is_dir())
        .with_context(|| format!("no lib/modules in {}", tree.display()))?;
    let kvers: Vec<String> = fs::read_dir(base.join("lib/modules"))?
        .filter_map(|e| e.ok())
        .filter(|e| e.path().join("kernel").is_dir())
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .collect();
    let [kver] = kvers.as_slice() else {
        bail!(
            "expected one kernel version in {}, found {kvers:?}",
            base.join("lib/modules").display()
        );
    };
    if !base.join("lib/modules").join(kver).join("modules.dep").exists() {
        run_cmd(Command::new("depmod").arg("-b").arg(&base).arg(kver))?;
    }
    let mut order: Vec<PathBuf> = Vec::new();
    for name in WANTED_MODULES {
        let out = Command::new("modprobe")
            .arg("-d")
            .arg(&base)
            .args(["-S", kver, "--show-depends", name])
            .output()
            .context("could not start modprobe")?;
        if !out.status.success() {
            if name == "iommufd" {
                continue;
            }
            bail!(
                "module {name} not found for {kver}: {}",
                String::from_utf8_lossy(&out.stderr).trim()
            );
        }
        for line in String::from_utf8_lossy(&out.stdout).lines() {
            if let Some(path) = line.strip_prefix("insmod ") {
                let path = PathBuf::from(path.split_whitespace().next().unwrap_or_default());
                if !order.contains(&path) {
                    order.push(path);
                }
            }
        }
    }
    let mdir = dest.join("modules");
    fs::create_dir_all(&mdir)?;
    for (i, src) in order.iter().enumerate() {
        let file = src.file_name().unwrap_or_default().to_string_lossy().into_owned();
        let (stem, tool) = if let Some(s) = file.strip_suffix(".ko.xz") {
            (s, Some("xz"))
        } else if let Some(s) = file.strip_suffix(".ko.zst") {
            (s, Some("zstd"))
        } else if let Some(s) = file.strip_suffix(".ko.gz") {
            (s, Some("gzip"))
        } else if let Some(s) = file.strip_suffix(".ko") {
            (s, None)
        } else {
            bail!("unexpected module file {}", src.display())
        };
        let to = mdir.join(format!("{i:02}-{stem}.ko"));
        match tool {
            None => {
                fs::copy(src, &to).with_context(|| format!("copying {}", src.display()))?;
            }
            Some(tool) => {
                let out = Command::new(tool)
                    .arg("-dc")
                    .arg(src)
                    .output()
                    .with_context(|| format!("could not start {tool}"))?;
                if !out.status.success() {
                    bail!("{tool} -dc {} failed", src.display());
                }
                fs::write(&to, out.stdout)?;
            }
        }
    }
    fs::write(dest.join("kver"), kver)?;
    Ok(())
}

/// Moves a fully prepared `tmp` into place as `dir` and stamps it ready.
fn finish(tmp: &Path, dir: &Path) -> Result<()> {
    fs::write(tmp.join("ready"), "")?;
    if dir.exists() {
        fs::remove_dir_all(dir)?;
    }
    fs::rename(tmp, dir).with_context(|| format!("moving {} to {}", tmp.display(), dir.display()))
}

fn fresh_dir(path: &Path) -> Result<()> {
    if path.exists() {
        fs::remove_dir_all(path).with_context(|| format!("removing {}", path.display()))?;
    }
    fs::create_dir_all(path).with_context(|| format!("creating {}", path.display()))
}

/// The kernel image in an unpacked package: /boot/vmlinuz-<kver> (classic packaging) or
/// /usr/lib/modules/<kver>/vmlinuz* (split packaging of 7.x).
fn find_vmlinuz(root: &Path) -> Option<PathBuf> {
    let mut dirs = vec![root.join("boot"), root.join("usr/boot")];
    for m in [root.join("lib/modules"), root.join("usr/lib/modules")] {
        if let Ok(entries) = fs::read_dir(m) {
            dirs.extend(entries.filter_map(|e| e.ok().map(|e| e.path())));
        }
    }
    dirs.iter()
        .filter_map(|d| fs::read_dir(d).ok())
        .flatten()
        .filter_map(|e| e.ok().map(|e| e.path()))
        .find(|p| {
            p.is_file()
                && p.file_name()
                    .is_some_and(|n| n.to_string_lossy().starts_with("vmlinuz"))
        })
}

fn debian(stock: &Stock, cache: &Path) -> Result<Kernel> {
    let prefix = format!("{}-", stock.name);
    let (apt, pkg) = match resolve(Apt::new(cache), stock.image_regex, stock.name, cache, &prefix, "")? {
        Ok(x) => x,
        Err(dir) => return load(&dir, stock.name.to_owned()),
    };
    let dir = cache
        .join("kernels")
        .join(format!("{prefix}{}", sanitize(&pkg.version)));
    let label = format!("{} ({} {})", stock.name, pkg.name, pkg.version);
    if dir.join("ready").exists() {
        return load(&dir, label);
    }
    eprintln!(
        "xtask: preparing the {} guest kernel from {} {} (once; cached in {})",
        stock.name,
        pkg.name,
        pkg.version,
        dir.display()
    );
    let mut debs = vec![apt.download(&pkg)?];
    if stock.split {
        let abi = pkg
            .name
            .trim_start_matches("linux-binary-")
            .trim_start_matches("unsigned-");
        let modules = Package {
            name: format!("linux-modules-{abi}"),
            version: pkg.version.clone(),
        };
        debs.push(apt.download(&modules)?);
    }
    let unpacked = cache.join("build").join(format!("{}-unpacked", stock.name));
    fresh_dir(&unpacked)?;
    for deb in &debs {
        eprintln!("xtask: unpacking {}", deb.display());
        apt::unpack(deb, &unpacked)?;
    }
    let tmp = dir.with_extension("tmp");
    fresh_dir(&tmp)?;
    let vmlinuz = find_vmlinuz(&unpacked).with_context(|| format!("no vmlinuz in {debs:?}"))?;
    fs::copy(&vmlinuz, tmp.join("vmlinuz"))?;
    extract_modules(&unpacked, &tmp)?;
    finish(&tmp, &dir)?;
    fs::remove_dir_all(&unpacked).ok();
    load(&dir, label)
}

fn custom(cache: &Path) -> Result<Kernel> {
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

fn user(image: &Path, modules: Option<&Path>, cache: &Path) -> Result<Kernel> {
    let label = format!("user kernel {}", image.display());
    let Some(modules) = modules else {
        eprintln!("xtask: no --modules given: the guest loads no modules (VFIO must be built in)");
        return Ok(Kernel {
            label,
            image: image.to_path_buf(),
            modules: Vec::new(),
        });
    };
    let dest = cache.join("build/user-kernel-modules");
    fresh_dir(&dest)?;
    // Accept an INSTALL_MOD_PATH root or a lib/modules/<kver> directory.
    let tree = if modules.join("lib/modules").is_dir() || modules.join("usr/lib/modules").is_dir() {
        modules.to_path_buf()
    } else if modules.join("kernel").is_dir() {
        let link = cache.join("build/user-kernel-tree");
        fresh_dir(&link.join("lib/modules"))?;
        let kver = modules.file_name().context("--modules has no file name")?;
        std::os::unix::fs::symlink(fs::canonicalize(modules)?, link.join("lib/modules").join(kver))?;
        link
    } else {
        bail!(
            "--modules {}: expected a dir holding lib/modules/<kver> or a lib/modules/<kver> dir",
            modules.display()
        );
    };
    extract_modules(&tree, &dest)?;
    let mut k = load(&dest, label)?;
    k.image = image.to_path_buf();
    Ok(k)
}
