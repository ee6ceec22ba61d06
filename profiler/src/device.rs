//! The PCI device DMA is mapped for: parsing its address, checking its driver and IOMMU group,
//! and (with `--bind`) binding it to vfio-pci for the run and back afterwards.
use std::{
    fs,
    path::{Path, PathBuf},
    sync::Mutex,
};

/// Why a device cannot be used.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum DeviceError {
    /// Not a PCI address.
    #[error("`{0}` is not a PCI address: use DDDD:BB:DD.F or BB:DD.F (e.g. 0000:00:01.0)")]
    Malformed(String),
    /// No such device.
    #[error("no PCI device {0} (see `lspci -D` or /sys/bus/pci/devices)")]
    NotFound(String),
    /// Bound elsewhere, no --bind.
    #[error(
        "device {bdf} is bound to {driver}, not vfio-pci: pass --bind to bind it to vfio-pci for the run (it is restored afterwards)"
    )]
    BoundElsewhere {
        /// Device.
        bdf: String,
        /// Its driver.
        driver: String,
    },
    /// No IOMMU group.
    #[error("device {0} has no IOMMU group: enable the IOMMU (intel_iommu=on / amd_iommu=on) or use `cargo xtask vm`")]
    NoGroup(String),
    /// Group not viable.
    #[error("IOMMU group {group} of {bdf} is not viable: these devices in it are bound to other drivers: {others}")]
    NotViable {
        /// Device.
        bdf: String,
        /// Group.
        group: String,
        /// The blocking devices.
        others: String,
    },
    /// Binding failed.
    #[error("binding {bdf} to vfio-pci failed: {why}")]
    Bind {
        /// Device.
        bdf: String,
        /// Why.
        why: String,
    },
}

/// Normalises a PCI address to `DDDD:BB:DD.F` (lower case).
pub fn parse_bdf(text: &str) -> Result<String, DeviceError> {
    let t = text.trim().to_ascii_lowercase();
    let full = if t.matches(':').count() == 1 {
        format!("0000:{t}")
    } else {
        t.clone()
    };
    let bad = || DeviceError::Malformed(text.to_owned());
    let (dom, rest) = full.split_once(':').ok_or_else(bad)?;
    let (bus, rest) = rest.split_once(':').ok_or_else(bad)?;
    let (dev, func) = rest.split_once('.').ok_or_else(bad)?;
    let hex = |s: &str, len: usize, max: u32| {
        s.len() == len && s.chars().all(|c| c.is_ascii_hexdigit()) && u32::from_str_radix(s, 16).is_ok_and(|v| v <= max)
    };
    if hex(dom, 4, 0xffff) && hex(bus, 2, 0xff) && hex(dev, 2, 0x1f) && hex(func, 1, 7) {
        Ok(full)
    } else {
        Err(bad())
    }
}

fn sysfs(bdf: &str) -> PathBuf {
    Path::new("/sys/bus/pci/devices").join(bdf)
}

fn link_name(p: &Path) -> Option<String> {
    fs::read_link(p)
        .ok()
        .and_then(|l| l.file_name().map(|n| n.to_string_lossy().into_owned()))
}

/// The driver a device is bound to, if any.
pub fn driver_of(bdf: &str) -> Option<String> {
    link_name(&sysfs(bdf).join("driver"))
}

/// A device ready for VFIO: bound to vfio-pci, in a viable group.
#[derive(Debug)]
pub struct Device {
    /// PCI address.
    pub bdf: String,
    /// IOMMU group number.
    pub group: String,
    /// The VFIO cdev (`/dev/vfio/devices/vfioN`), when the kernel has one.
    pub cdev: Option<PathBuf>,
    _binding: Option<Binding>,
}

/// Restores a device's original driver when dropped.
#[derive(Debug)]
struct Binding {
    bdf: String,
    original: Option<String>,
}

/// Bindings to undo on an emergency exit.
static TO_RESTORE: Mutex<Vec<(String, Option<String>)>> = Mutex::new(Vec::new());

fn write(path: PathBuf, value: &str) -> Result<(), String> {
    fs::write(&path, value).map_err(|e| format!("writing `{value}` to {}: {e}", path.display()))
}

fn restore_binding(bdf: &str, original: Option<&str>) {
    let _ = write(sysfs(bdf).join("driver/unbind"), bdf);
    let _ = write(sysfs(bdf).join("driver_override"), "\n");
    if let Some(drv) = original {
        let _ = write(Path::new("/sys/bus/pci/drivers").join(drv).join("bind"), bdf);
    }
}

impl Drop for Binding {
    fn drop(&mut self) {
        let mut list = TO_RESTORE.lock().unwrap_or_else(|e| e.into_inner());
        list.retain(|(b, _)| *b != self.bdf);
        restore_binding(&self.bdf, self.original.as_deref());
    }
}

/// Puts every device bound by `--bind` back (emergency exit path).
pub fn restore_all() {
    let mut list = TO_RESTORE.lock().unwrap_or_else(|e| e.into_inner());
    for (bdf, original) in list.drain(..) {
        restore_binding(&bdf, original.as_deref());
    }
}

fn bind_vfio(bdf: &str) -> Result<(), String> {
    write(sysfs(bdf).join("driver_override"), "vfio-pci")?;
    if sysfs(bdf).join("driver").exists() {
        write(sysfs(bdf).join("driver/unbind"), bdf)?;
    }
    write(PathBuf::from("/sys/bus/pci/drivers_probe"), bdf)?;
    match driver_of(bdf) {
        Some(d) if d == "vfio-pci" => Ok(()),
        other => Err(format!(
            "after drivers_probe it is bound to {other:?} (is the vfio-pci module loaded?)"
        )),
    }
}

impl Device {
    /// Opens `bdf` for VFIO, binding it to vfio-pci first when `bind` is set.
    pub fn open(bdf: &str, bind: bool) -> Result<Self, DeviceError> {
        let bdf = parse_bdf(bdf)?;
        if !sysfs(&bdf).exists() {
            return Err(DeviceError::NotFound(bdf));
        }
        let mut binding = None;
        match driver_of(&bdf) {
            Some(d) if d == "vfio-pci" => {}
            other if bind => {
                TO_RESTORE
                    .lock()
                    .unwrap_or_else(|e| e.into_inner())
                    .push((bdf.clone(), other.clone()));
                binding = Some(Binding {
                    bdf: bdf.clone(),
                    original: other,
                });
                bind_vfio(&bdf).map_err(|why| DeviceError::Bind { bdf: bdf.clone(), why })?;
            }
            other => {
                return Err(DeviceError::BoundElsewhere {
                    bdf,
                    driver: other.unwrap_or_else(|| "no driver".into()),
                });
            }
        }
        let group = link_name(&sysfs(&bdf).join("iommu_group")).ok_or_else(|| DeviceError::NoGroup(bdf.clone()))?;
        let others: Vec<String> = fs::read_dir(format!("/sys/kernel/iommu_groups/{group}/devices"))
            .map(|d| {
                d.flatten()
                    .map(|e| e.file_name().to_string_lossy().into_owned())
                    .collect()
            })
            .unwrap_or_default();
        let blocking: Vec<String> = others
            .iter()
            .filter(|o| **o != bdf)
            .filter_map(|o| match driver_of(o) {
                Some(d) if d != "vfio-pci" && d != "pcieport" => Some(format!("{o} ({d})")),
                _ => None,
            })
            .collect();
        if !blocking.is_empty() {
            return Err(DeviceError::NotViable {
                bdf,
                group,
                others: blocking.join(", "),
            });
        }
        let cdev = fs::read_dir(sysfs(&bdf).join("vfio-dev"))
            .ok()
            .and_then(|mut d| d.next())
            .and_then(|e| e.ok())
            .map(|e| Path::new("/dev/vfio/devices").join(e.file_name()))
            .filter(|p| p.exists());
        Ok(Self {
            bdf,
            group,
            cdev,
            _binding: binding,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bdfs() {
        assert_eq!(parse_bdf("0000:00:01.0").unwrap(), "0000:00:01.0");
        assert_eq!(parse_bdf("00:1F.7").unwrap(), "0000:00:1f.7");
        for bad in [
            "",
            "0000:00:01",
            "00:01.8",
            "0000:00:20.0",
            "zz:00.0",
            "0000:000:01.0",
            "1:2:3:4.0",
        ] {
            assert!(parse_bdf(bad).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn missing_device() {
        assert_eq!(
            Device::open("ffff:ff:1f.7", false).unwrap_err(),
            DeviceError::NotFound("ffff:ff:1f.7".into())
        );
    }
}
