//! `dmaprof doctor`: what this host can do, found out by trying (load, attach, open, ioctl),
//! not by reading config files. The BPF trials go through the same attach path as a run.
use std::{fmt::Write as _, fs, os::fd::AsRawFd as _, path::Path, time::Duration};

use serde::{Deserialize, Serialize};

use crate::{
    dma,
    facts::{Capabilities, Capability, CapabilityId, KernelInfo, VfioDevice},
    hugepages::{self, Pool},
    kernel,
    loader::{self, Request, Watched},
    privileges,
    probes::{AttachedBy, Mechanism, ProbeStatus},
    symbols::KernelSymbols,
    sys,
};

/// Everything doctor found.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct Doctor {
    /// Kernel identity.
    pub kernel: KernelInfo,
    /// Capabilities by id.
    pub capabilities: Capabilities,
    /// Devices bound to vfio-pci.
    pub vfio_devices: Vec<VfioDevice>,
    /// hugetlb pools.
    pub hugepages: Vec<Pool>,
}

/// Probes the host. Every check is independent: one failing never hides another.
pub fn probe_host() -> Doctor {
    let mut d = probe_for_run();
    d.kernel.features = kernel::features();
    d.capabilities.insert(CapabilityId::BtfVmlinux, btf_vmlinux());
    d.capabilities.insert(CapabilityId::BtfModules, btf_modules());
    d.capabilities.extend(bpf_checks());
    d
}

/// What `run` needs to plan the cases: the DMA interfaces, without the BTF and BPF trials
/// (`run` finds out what attaches when it attaches, and reports that per probe). Under TCG this
/// saves seconds of start-up.
pub fn probe_for_run() -> Doctor {
    let mut c = Capabilities::new();
    c.insert(CapabilityId::Privileges, privileges::capability());
    c.insert(CapabilityId::VfioType1, vfio_type1());
    let (iommufd, map_file) = iommufd_checks();
    c.insert(CapabilityId::Iommufd, iommufd);
    c.insert(CapabilityId::MapFile, map_file);
    c.insert(CapabilityId::VfioCdev, vfio_cdev());
    Doctor {
        kernel: kernel::info(),
        capabilities: c,
        vfio_devices: vfio_devices(),
        hugepages: hugepages::pools(),
    }
}

fn btf_vmlinux() -> Capability {
    match aya::Btf::from_sys_fs() {
        Ok(_) => {
            let len = fs::metadata("/sys/kernel/btf/vmlinux").map(|m| m.len()).unwrap_or(0);
            Capability::yes(format!("/sys/kernel/btf/vmlinux parsed ({} KiB)", len / 1024))
        }
        Err(e) => Capability::no(format!(
            "cannot read kernel BTF ({e}): needs CONFIG_DEBUG_INFO_BTF; fentry/fexit need it"
        )),
    }
}

fn btf_modules() -> Capability {
    let mut mods: Vec<String> = fs::read_dir("/sys/kernel/btf")
        .map(|d| {
            d.flatten()
                .map(|e| e.file_name().to_string_lossy().into_owned())
                .filter(|n| n != "vmlinux")
                .collect()
        })
        .unwrap_or_default();
    if !mods.is_empty() {
        mods.sort();
        let n = mods.len();
        mods.truncate(8);
        let more = if n > 8 { ", ..." } else { "" };
        return Capability::yes(format!("{n} modules with BTF ({}{more})", mods.join(", ")));
    }
    if Path::new("/proc/modules").exists() {
        Capability::no(
            "no module has BTF loaded (needs CONFIG_DEBUG_INFO_BTF_MODULES and a loaded module such as vfio)",
        )
    } else {
        Capability::no(
            "kernel has no loadable modules (CONFIG_MODULES off), so no module BTF; VFIO/IOMMUFD would have to be built in",
        )
    }
}

/// The BPF trials: one attach per row mechanism, as a run would do it, plus the tracepoints and
/// a sampler that must see kernel stacks of this thread.
fn bpf_checks() -> Vec<(CapabilityId, Capability)> {
    let symbols = KernelSymbols::load().ok();
    let tid = sys::gettid();
    let request = |mechanisms| Request {
        watch: Watched::Thread(tid),
        freq_hz: 999,
        mechanisms,
        symbols: symbols.as_ref(),
        sample_map_entries: None,
        rows: None,
    };
    let mut out = Vec::new();
    match loader::attach(&request(&[
        Mechanism::Tracepoints,
        Mechanism::Samples,
        Mechanism::Kprobes,
    ])) {
        Ok(mut probes) => {
            out.push((CapabilityId::Tracepoints, tracepoints(&probes.status)));
            out.push((
                CapabilityId::Kprobes,
                rows_by(&probes.status, AttachedBy::Kprobe, kprobe_hint()),
            ));
            out.push((CapabilityId::PerfSampling, sampling(&mut probes, symbols.as_ref())));
        }
        Err(e) => {
            for id in [
                CapabilityId::Tracepoints,
                CapabilityId::Kprobes,
                CapabilityId::PerfSampling,
            ] {
                out.push((id, Capability::no(e.to_string())));
            }
        }
    }
    let fentry = match loader::attach(&request(&[Mechanism::Fentry])) {
        Ok(p) => rows_by(
            &p.status,
            AttachedBy::Fentry,
            "fentry/fexit denied here; dmaprof falls back to kprobes or tracepoints",
        ),
        Err(e) => Capability::no(e.to_string()),
    };
    out.push((CapabilityId::Fentry, fentry));
    out
}

fn kprobe_hint() -> &'static str {
    if loader::kprobes_available() {
        "kprobes exist but no probe-table row attached"
    } else {
        "module functions (vfio, iommufd) cannot be probed here"
    }
}

fn tracepoints(status: &[ProbeStatus]) -> Capability {
    let tracefs = if Path::new("/sys/kernel/tracing/events").exists() {
        "tracefs mounted"
    } else {
        "tracefs not mounted (not needed)"
    };
    let tps: Vec<&ProbeStatus> = status
        .iter()
        .filter(|s| s.mechanism == AttachedBy::RawTracepoint)
        .collect();
    match tps.iter().find(|s| !s.attached) {
        None => Capability::yes(format!("{} raw tracepoints attached; {tracefs}", tps.len())),
        Some(s) => Capability::no(format!(
            "{}: {} (needs CONFIG_TRACEPOINTS and BPF raw tracepoints)",
            s.function,
            s.error.as_deref().unwrap_or("not attached")
        )),
    }
}

/// How many probe-table rows attached by `mechanism`, or why none did.
fn rows_by(status: &[ProbeStatus], mechanism: AttachedBy, hint: &str) -> Capability {
    // Rows of this request: all probe-table rows (a row refused by fentry reports the
    // fallback it tried last).
    let rows: Vec<&ProbeStatus> = status
        .iter()
        .filter(|s| !matches!(s.mechanism, AttachedBy::RawTracepoint | AttachedBy::PerfEvent))
        .collect();
    let attached: Vec<&str> = rows
        .iter()
        .filter(|s| s.attached)
        .map(|s| s.function.as_str())
        .collect();
    match attached.first() {
        Some(first) => Capability::yes(format!(
            "{mechanism} attached to {} of {} probe-table rows this kernel has (e.g. {first})",
            attached.len(),
            rows.len()
        )),
        None => {
            // A row this kernel lacks says less than one it has and refused.
            let errors = || rows.iter().filter_map(|s| s.error.as_deref());
            let why = errors()
                .find(|e| !e.starts_with("not in /proc/kallsyms"))
                .or_else(|| errors().next())
                .unwrap_or("no row attached");
            Capability::no(format!("{why} ({hint})"))
        }
    }
}

/// Runs the attached sampler over ~100 ms of kernel work on this thread and counts the samples
/// with kernel stacks, through the same phase switch and drain a run uses.
fn sampling(probes: &mut loader::Probes, symbols: Option<&KernelSymbols>) -> Capability {
    if !symbols.is_some_and(KernelSymbols::usable) {
        return Capability::no(
            "/proc/kallsyms unreadable or its addresses hidden (kptr_restrict): stacks cannot be resolved; run as root",
        );
    }
    if let Some(s) = probes
        .status
        .iter()
        .find(|s| s.mechanism == AttachedBy::PerfEvent && !s.attached)
    {
        return Capability::no(s.error.clone().unwrap_or_default());
    }
    let drained = probes.set_phase(1).and_then(|()| {
        burn_kernel_time(Duration::from_millis(100));
        probes.set_phase(0)?;
        probes.drain(2)
    });
    let drained = match drained {
        Ok(d) => d,
        Err(e) => return Capability::no(e.to_string()),
    };
    let samples: u64 = drained.counters.iter().map(|(_, c)| c.samples).sum();
    let with_kernel: u64 = drained
        .samples
        .iter()
        .filter(|s| !s.kernel.is_empty())
        .map(|s| s.count)
        .sum();
    match (samples, with_kernel) {
        (0, _) => Capability::no("perf event attached but no sample arrived in 100 ms"),
        (n, 0) => Capability::no(format!("{n} samples but none with a kernel stack")),
        (n, k) => Capability::yes(format!(
            "cpu-clock on this thread: {n} samples in 100 ms at 999 Hz, {k} with kernel stacks"
        )),
    }
}

/// Spends `d` in the kernel: reading /dev/zero clears user memory in kernel mode.
fn burn_kernel_time(d: Duration) {
    let mut buf = vec![0u8; 1 << 20];
    let start = std::time::Instant::now();
    if let Ok(f) = fs::File::open("/dev/zero") {
        while start.elapsed() < d {
            // SAFETY: reads into our own buffer of the given length.
            unsafe { libc::read(f.as_raw_fd(), buf.as_mut_ptr().cast(), buf.len()) };
        }
    }
}

fn vfio_type1() -> Capability {
    let f = match sys::open_rw("/dev/vfio/vfio") {
        Ok(f) => f,
        Err(e) => {
            return Capability::no(format!(
                "/dev/vfio/vfio: {e} (needs the vfio and vfio_iommu_type1 modules or built-in VFIO; `cargo xtask vm` provides them)"
            ));
        }
    };
    let fd = f.as_raw_fd();
    // SAFETY: an argument-less VFIO ioctl on a VFIO container fd.
    let version = unsafe { libc::ioctl(fd, dma::VFIO_GET_API_VERSION) };
    let ext = |e: u32| {
        // SAFETY: VFIO_CHECK_EXTENSION takes the extension number by value.
        unsafe { libc::ioctl(fd, dma::VFIO_CHECK_EXTENSION, libc::c_ulong::from(e)) == 1 }
    };
    let (t1, t1v2) = (ext(dma::VFIO_TYPE1_IOMMU), ext(dma::VFIO_TYPE1V2_IOMMU));
    if t1 {
        let v2 = if t1v2 { "yes" } else { "no" };
        Capability::yes(format!("/dev/vfio/vfio API {version}, TYPE1 yes, TYPE1v2 {v2}"))
    } else {
        Capability::no(format!(
            "/dev/vfio/vfio API {version} but no TYPE1 IOMMU backend (load vfio_iommu_type1)"
        ))
    }
}

fn iommufd_checks() -> (Capability, Capability) {
    let f = match sys::open_rw("/dev/iommu") {
        Ok(f) => f,
        Err(e) => {
            let why = format!(
                "/dev/iommu: {e} (kernel without CONFIG_IOMMUFD; Debian kernels lack it: use `cargo xtask vm` with the custom kernel)"
            );
            return (
                Capability::no(why.clone()),
                Capability::no(format!("no iommufd: {why}")),
            );
        }
    };
    // A zero-sized argument: an ioctl the kernel knows fails its size check with EINVAL, an
    // unknown one (before 6.13) fails with ENOTTY.
    let arg = [0u32; 16];
    // SAFETY: the kernel reads at most `size` (= 0) bytes of our buffer; it is 64 bytes long.
    let r = unsafe { libc::ioctl(f.as_raw_fd(), dma::IOMMU_IOAS_MAP_FILE, arg.as_ptr()) };
    let errno = std::io::Error::last_os_error();
    let map_file = if r == 0 || errno.raw_os_error() != Some(libc::ENOTTY) {
        Capability::yes(format!(
            "IOMMU_IOAS_MAP_FILE known to the kernel (probe returned {errno})"
        ))
    } else {
        Capability::no("IOMMU_IOAS_MAP_FILE unknown (ENOTTY): kernel older than 6.13")
    };
    (Capability::yes("/dev/iommu opened"), map_file)
}

fn vfio_cdev() -> Capability {
    match fs::read_dir("/dev/vfio/devices") {
        Ok(d) => {
            let names: Vec<String> = d
                .flatten()
                .map(|e| e.file_name().to_string_lossy().into_owned())
                .collect();
            let what = if names.is_empty() {
                "present, no device bound".into()
            } else {
                names.join(", ")
            };
            Capability::yes(format!("/dev/vfio/devices: {what}"))
        }
        Err(e) => Capability::no(format!(
            "/dev/vfio/devices: {e} (needs CONFIG_VFIO_DEVICE_CDEV and a device bound to vfio-pci)"
        )),
    }
}

/// PCI devices bound to vfio-pci.
pub fn vfio_devices() -> Vec<VfioDevice> {
    let Ok(dir) = fs::read_dir("/sys/bus/pci/devices") else {
        return Vec::new();
    };
    let mut out: Vec<VfioDevice> = dir
        .flatten()
        .filter_map(|e| {
            let p = e.path();
            let driver = sys::link_name(&p.join("driver")).filter(|d| d == "vfio-pci")?;
            Some(VfioDevice {
                bdf: e.file_name().to_string_lossy().into_owned(),
                driver,
                iommu_group: sys::link_name(&p.join("iommu_group")),
            })
        })
        .collect();
    out.sort_by(|a, b| a.bdf.cmp(&b.bdf));
    out
}

/// The doctor table.
pub fn render(d: &Doctor) -> String {
    let mut s = String::new();
    let k = &d.kernel;
    let _ = writeln!(s, "kernel: Linux {} {} ({})", k.release, k.machine, k.version);
    for (id, c) in &d.capabilities {
        let _ = writeln!(
            s,
            "  {:<14} {:<4} {}",
            id.to_string(),
            if c.ok { "yes" } else { "NO" },
            c.detail
        );
    }
    let _ = writeln!(s, "kernel changes (from /proc/kallsyms):");
    for f in &k.features {
        let has = match f.present {
            Some(true) => "yes",
            Some(false) => "no",
            None => "?",
        };
        let _ = writeln!(s, "  {:<22} {:<3} since {}", f.id.name(), has, f.since);
    }
    let none = if d.vfio_devices.is_empty() { " none" } else { "" };
    let _ = writeln!(s, "vfio-pci devices:{none}");
    for v in &d.vfio_devices {
        let group = v.iommu_group.as_deref().unwrap_or("none (no IOMMU?)");
        let _ = writeln!(s, "  {} iommu_group {group}", v.bdf);
    }
    let _ = writeln!(s, "hugepages:");
    for h in &d.hugepages {
        let _ = writeln!(s, "  {:>8} kB: {} total, {} free", h.size_kb, h.total, h.free);
    }
    s
}
