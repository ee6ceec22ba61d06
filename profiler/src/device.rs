//! The PCI device DMA is mapped for: parsing its address, checking its driver and IOMMU group,
//! and (with `--bind`) binding it to vfio-pci for the run and back afterwards.
use std::{
    fs,
    path::{Path, PathBuf},
};

use crate::{stop, sys::link_name};

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
    /// Restores the device's original driver (with `--bind`) when the device is dropped.
    restore: Option<stop::UndoToken>,
}

impl Drop for Device {
    fn drop(&mut self) {
        if let Some(t) = self.restore.take() {
            t.run();
        }
    }
}

/// A sysfs write that failed.
#[derive(Debug, thiserror::Error)]
#[error("writing `{value}` to {path}: {source}")]
struct SysfsWrite {
    value: String,
    path: String,
    source: std::io::Error,
}

fn write(path: &Path, value: &str) -> Result<(), SysfsWrite> {
    fs::write(path, value).map_err(|source| SysfsWrite {
        value: value.to_owned(),
        path: path.display().to_string(),
        source,
    })
}

fn restore_binding(bdf: &str, original: Option<&str>) {
    let _ = write(&sysfs(bdf).join("driver/unbind"), bdf);
    let _ = write(&sysfs(bdf).join("driver_override"), "\n");
    if let Some(drv) = original {
        let _ = write(&Path::new("/sys/bus/pci/drivers").join(drv).join("bind"), bdf);
    }
}

fn bind_vfio(bdf: &str) -> Result<(), DeviceError> {
    let bind_err = |why: String| DeviceError::Bind {
        bdf: bdf.to_owned(),
        why,
    };
    let step = |path: PathBuf, value: &str| write(&path, value).map_err(|e| bind_err(e.to_string()));
    step(sysfs(bdf).join("driver_override"), "vfio-pci")?;
    if sysfs(bdf).join("driver").exists() {
        step(sysfs(bdf).join("driver/unbind"), bdf)?;
    }
    step(PathBuf::from("/sys/bus/pci/drivers_probe"), bdf)?;
    match driver_of(bdf) {
        Some(d) if d == "vfio-pci" => Ok(()),
        other => Err(bind_err(format!(
            "after drivers_probe it is bound to {other:?} (is the vfio-pci module loaded?)"
        ))),
    }
}

/// Checks, without changing anything, that `bdf` exists and is bound to vfio-pci (or that
/// `bind` may bind it): a bad `-d` is a usage error before anything runs.
pub fn check(bdf: &str, bind: bool) -> Result<String, DeviceError> {
    let bdf = parse_bdf(bdf)?;
    if !sysfs(&bdf).exists() {
        return Err(DeviceError::NotFound(bdf));
    }
    match driver_of(&bdf) {
        Some(d) if d == "vfio-pci" => Ok(bdf),
        _ if bind => Ok(bdf),
        other => Err(DeviceError::BoundElsewhere {
            bdf,
            driver: other.unwrap_or_else(|| "no driver".into()),
        }),
    }
}

impl Device {
    /// Opens `bdf` for VFIO, binding it to vfio-pci first when `bind` is set.
    pub fn open(bdf: &str, bind: bool) -> Result<Self, DeviceError> {
        let bdf = parse_bdf(bdf)?;
        if !sysfs(&bdf).exists() {
            return Err(DeviceError::NotFound(bdf));
        }
        let mut restore = None;
        match driver_of(&bdf) {
            Some(d) if d == "vfio-pci" => {}
            other if bind => {
                let (b, original) = (bdf.clone(), other.clone());
                let what = format!("{bdf} back to {}", other.as_deref().unwrap_or("no driver"));
                let token = stop::on_exit(what, move || restore_binding(&b, original.as_deref()));
                if let Err(e) = bind_vfio(&bdf) {
                    token.run();
                    return Err(e);
                }
                restore = Some(token);
            }
            other => {
                return Err(DeviceError::BoundElsewhere {
                    bdf,
                    driver: other.unwrap_or_else(|| "no driver".into()),
                });
            }
        }
        match group_and_cdev(&bdf) {
            Ok((group, cdev)) => Ok(Self {
                bdf,
                group,
                cdev,
                restore,
            }),
            Err(e) => {
                if let Some(t) = restore {
                    t.run();
                }
                Err(e)
            }
        }
    }
}

/// The device's IOMMU group, checked to be viable, and its VFIO cdev if the kernel has one.
fn group_and_cdev(bdf: &str) -> Result<(String, Option<PathBuf>), DeviceError> {
    let group = link_name(&sysfs(bdf).join("iommu_group")).ok_or_else(|| DeviceError::NoGroup(bdf.to_owned()))?;
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
            bdf: bdf.to_owned(),
            group,
            others: blocking.join(", "),
        });
    }
    let cdev = fs::read_dir(sysfs(bdf).join("vfio-dev"))
        .ok()
        .and_then(|mut d| d.next())
        .and_then(Result::ok)
        .map(|e| Path::new("/dev/vfio/devices").join(e.file_name()))
        .filter(|p| p.exists());
    Ok((group, cdev))
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
