//! Stock Debian kernels: the newest package of a series, unpacked (never installed), with its
//! VFIO modules.
use std::{
    fs,
    path::{Path, PathBuf},
};

use anyhow::{Context as _, Result};

use super::{Kernel, extract_modules, finish, fresh_dir, load, resolve, sanitize};
use crate::vm::apt::{self, Apt, Package};

/// A stock Debian kernel: where its packages are.
pub struct Stock {
    pub name: &'static str,
    /// apt-cache regex of the package holding vmlinuz (and the modules, unless `split`).
    image_regex: &'static str,
    /// Split packaging (7.x backports): vmlinuz in `linux-binary-<abi>`, modules in `linux-modules-<abi>`.
    split: bool,
}

pub const STOCK: [Stock; 3] = [
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

pub fn prepare(stock: &Stock, cache: &Path) -> Result<Kernel> {
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
