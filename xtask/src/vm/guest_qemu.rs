//! QEMU inside the guest, the real client `dmaprof record` is tested on: Debian's
//! `qemu-system-x86` from bookworm-backports, unpacked once into the cache, shipped with the
//! firmware its x86 machines open and the host's shared libraries.
//!
//! bookworm-backports, not the host's own bookworm QEMU (7.2): the backport (10.x) is built
//! against bookworm's libraries, so the libraries `ldd` finds on this bookworm host serve it in
//! the guest, and it has the iommufd backend (`-object iommufd`, QEMU 9.0 and later), which 7.2
//! lacks.
use std::{
    fs,
    path::{Path, PathBuf},
};

use anyhow::{Context as _, Result, bail};

use super::apt::{self, Apt, Package};

/// The suite the guest's QEMU comes from (see the module comment).
const SUITE: &str = "bookworm-backports";

/// The binary the guest runs.
pub const BINARY: &str = "qemu-system-x86_64";

/// What the guest gets of the unpacked packages, relative to `/`: the binary and the firmware
/// the x86 machines open at start (traced with strace on the host: `pc` and `q35` open
/// seabios's bios-256k.bin and kvmvapic.bin, `microvm` its bios-microvm.bin; `-kernel` adds
/// linuxboot_dma.bin or pvh.bin, `-M isapc` bios.bin). The rest of qemu-system-data is other
/// architectures' firmware.
const FILES: [&str; 8] = [
    "usr/bin/qemu-system-x86_64",
    "usr/share/qemu/kvmvapic.bin",
    "usr/share/qemu/linuxboot_dma.bin",
    "usr/share/qemu/pvh.bin",
    "usr/share/qemu/qboot.rom",
    "usr/share/seabios/bios-256k.bin",
    "usr/share/seabios/bios.bin",
    "usr/share/seabios/bios-microvm.bin",
];

/// A QEMU ready to ship: `root` to lay over the guest's root (`Plan::overlays`) and the host
/// libraries it needs (`Plan::host_files`).
pub struct GuestQemu {
    pub root: PathBuf,
    pub libraries: Vec<PathBuf>,
    /// Debian's version of qemu-system-x86.
    pub version: String,
}

/// Whether dmaprof arguments run QEMU (`record -- qemu-system-x86_64 ...`), so the guest needs it.
pub fn named_in(args: &[String]) -> bool {
    args.iter()
        .any(|a| Path::new(a).file_name().is_some_and(|n| n == BINARY))
}

/// The guest's QEMU, downloaded and unpacked on first use (cached in `<cache>/qemu/<version>`).
/// Without the network, the newest one already cached.
pub fn prepare(cache: &Path) -> Result<GuestQemu> {
    let dir = cache.join("qemu");
    let root = match resolve(cache).and_then(|packages| unpack(&dir, &packages)) {
        Ok(root) => root,
        Err(e) => match newest_ready(&dir) {
            Some(root) => {
                eprintln!("xtask: warning: {e:#}; using the cached {}", root.display());
                root
            }
            None => return Err(e),
        },
    };
    let version = fs::read_to_string(root.with_file_name("ready")).unwrap_or_default();
    // The first entry is the binary itself, which the overlay carries.
    let libraries = super::with_libraries(&root.join(FILES[0]))?.split_off(1);
    Ok(GuestQemu {
        root,
        libraries,
        version,
    })
}

/// The packages to unpack: QEMU and its data from [`SUITE`], seabios (firmware, built for no
/// particular release) the newest of any suite.
fn resolve(cache: &Path) -> Result<(Apt, Vec<Package>)> {
    let apt = Apt::new(cache)?;
    apt.update(false)?;
    let mut packages = Vec::new();
    for name in ["qemu-system-x86", "qemu-system-data"] {
        match apt.in_suite(name, SUITE)? {
            Some(p) => packages.push(p),
            None => bail!("no {name} in {SUITE}"),
        }
    }
    match apt.newest("^seabios$", |n| n == "seabios")? {
        Some(p) => packages.push(p),
        None => bail!("no seabios package"),
    }
    Ok((apt, packages))
}

/// Unpacks [`FILES`] of the packages into `<dir>/<qemu version>/root` once (a `ready` file
/// marks a finished one); returns that root.
fn unpack(dir: &Path, (apt, packages): &(Apt, Vec<Package>)) -> Result<PathBuf> {
    let version = super::kernel::sanitize(&packages[0].version);
    let home = dir.join(&version);
    let root = home.join("root");
    if home.join("ready").exists() {
        return Ok(root);
    }
    let unpacked = home.join("unpacked");
    fs::remove_dir_all(&home).ok();
    for p in packages {
        apt::unpack(&apt.download(p)?, &unpacked)?;
    }
    for file in FILES {
        let to = root.join(file);
        fs::create_dir_all(to.parent().expect("FILES are below a directory"))?;
        // Symlinks in the packages (seabios's names) point at files that are shipped as files.
        fs::copy(unpacked.join(file), &to).with_context(|| format!("{file} is not in {}", unpacked.display()))?;
    }
    fs::remove_dir_all(&unpacked).ok();
    fs::write(home.join("ready"), &packages[0].version)?;
    eprintln!(
        "xtask: the guest's QEMU {} is in {}",
        packages[0].version,
        root.display()
    );
    Ok(root)
}

/// The root of the newest finished unpack under `dir`, if any.
fn newest_ready(dir: &Path) -> Option<PathBuf> {
    let mut ready: Vec<(std::time::SystemTime, PathBuf)> = fs::read_dir(dir)
        .ok()?
        .flatten()
        .filter_map(|e| {
            let modified = fs::metadata(e.path().join("ready")).ok()?.modified().ok()?;
            Some((modified, e.path().join("root")))
        })
        .collect();
    ready.sort();
    ready.pop().map(|(_, root)| root)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn qemu_is_shipped_only_when_the_arguments_run_it() {
        let args = |v: &[&str]| v.iter().map(|s| (*s).to_owned()).collect::<Vec<_>>();
        assert!(named_in(&args(&["record", "--", "qemu-system-x86_64", "-S"])));
        assert!(named_in(&args(&["record", "--", "/usr/bin/qemu-system-x86_64"])));
        assert!(!named_in(&args(&["record", "--", "qemu-system-x86_64-microvm"])));
        assert!(!named_in(&args(&["run", "-b", "64M"])));
    }
}
