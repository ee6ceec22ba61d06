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

use super::apt::{Apt, Package};
use crate::setup::{ensure_debian_packages, run_cmd};

mod custom;
mod debian;
mod user;

/// Modules the guest loads, in this order (each after its own dependencies). Absent ones are
/// skipped (`iommufd` exists only in the custom kernel).
const WANTED_MODULES: [&str; 4] = ["iommufd", "vfio", "vfio_iommu_type1", "vfio_pci"];

/// What `--kernel` can name, besides a path to a bzImage.
pub const NAMES: &str = "custom, debian-6.12, debian-7.3, debian-6.1 or a path to a bzImage";

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
        if let Some(stock) = debian::STOCK.iter().find(|k| k.name == s) {
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
        Choice::Custom => custom::prepare(cache),
        Choice::Debian(name) => {
            let stock = debian::STOCK
                .iter()
                .find(|k| k.name == *name)
                .expect("parsed names are in STOCK");
            debian::prepare(stock, cache)
        }
        Choice::User { image } => user::prepare(image, user_modules, cache),
    }
}

/// Directory-name-safe form of a Debian version.
pub(crate) fn sanitize(version: &str) -> String {
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
        .filter_map(Result::ok)
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
