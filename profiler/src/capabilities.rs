//! `dmaprof doctor`: what this host can do, found out by trying (load, attach, open, ioctl),
//! not by reading config files. The same object is the report's `capabilities`.
use std::{collections::BTreeMap, fs, os::fd::AsRawFd as _, path::Path, time::Duration};

use aya::{
    Btf,
    maps::{Array, HashMap},
    programs::{
        FEntry, KProbe, PerfEvent,
        perf_event::{PerfEventConfig, PerfEventScope, SamplePolicy, SoftwareEvent},
    },
};
use serde::{Deserialize, Serialize};

use crate::{
    abi::{self, Control, PhaseCounters, SampleKey},
    hugepages::{self, Pool},
    probes::{gettid, load_object},
    report::KernelInfo,
};

/// One capability: whether it works and what was seen (or what would fix it).
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq, Eq)]
pub struct Capability {
    /// Works here.
    pub ok: bool,
    /// What was found, or why not and what would fix it.
    pub detail: String,
}

/// A PCI device bound to vfio-pci.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct VfioDevice {
    /// PCI address, e.g. 0000:00:01.0.
    pub bdf: String,
    /// Bound driver.
    pub driver: String,
    /// IOMMU group number.
    pub iommu_group: Option<String>,
}

/// Everything doctor found.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct Doctor {
    /// Kernel identity.
    pub kernel: KernelInfo,
    /// Capabilities by name.
    pub capabilities: BTreeMap<String, Capability>,
    /// Devices bound to vfio-pci.
    pub vfio_devices: Vec<VfioDevice>,
    /// hugetlb pools.
    pub hugepages: Vec<Pool>,
}

fn cap(ok: bool, detail: impl Into<String>) -> Capability {
    Capability {
        ok,
        detail: detail.into(),
    }
}

/// uname(2).
pub fn kernel_info() -> KernelInfo {
    // SAFETY: uname fills the zeroed struct; its fields are NUL-terminated on success.
    let mut u: libc::utsname = unsafe { std::mem::zeroed() };
    // SAFETY: as above.
    unsafe { libc::uname(&mut u) };
    let field = |f: &[libc::c_char]| {
        // SAFETY: uname NUL-terminates each field within its array.
        unsafe { std::ffi::CStr::from_ptr(f.as_ptr()) }
            .to_string_lossy()
            .into_owned()
    };
    KernelInfo {
        release: field(&u.release),
        version: field(&u.version),
        machine: field(&u.machine),
        features: Vec::new(),
    }
}

/// A kernel change recognised by symbols: present when every `with` symbol exists and no
/// `without` symbol does. (id, with, without, since, effect)
type FeatureRule = (
    &'static str,
    &'static [&'static str],
    &'static [&'static str],
    &'static str,
    &'static str,
);

/// Kernel changes that move DMA-map time. Versions and commits were checked against mainline;
/// module symbols (vfio, iommufd) show only while the module is loaded.
pub const KERNEL_FEATURES: &[FeatureRule] = &[
    (
        "iommufd",
        &["iommufd_ioas_map"],
        &[],
        "v6.2, 2ff4bed7fee7 (iommufd: File descriptor, context, kconfig and makefiles)",
        "/dev/iommu and IOMMU_IOAS_MAP; the iommufd_* modes",
    ),
    (
        "unpin_folios",
        &["unpin_folio", "unpin_folios"],
        &[],
        "v6.11, 6cc040542ba7 (mm/gup: introduce unpin_folio/unpin_folios helpers)",
        "folio-granular unpin on unmap",
    ),
    (
        "memfd_pin_folios",
        &["memfd_pin_folios"],
        &[],
        "v6.11, 89c1905d9c14 (mm/gup: introduce memfd_pin_folios() for pinning memfd folios)",
        "memfd pinned by folio from the page cache, without walking page tables",
    ),
    (
        "folio_zero_user",
        &["folio_zero_user"],
        &["clear_huge_page"],
        "v6.11, 78fefd04c123 (mm: memory: convert clear_huge_page() to folio_zero_user())",
        "hugepage zeroing is folio_zero_user (the probe row follows the rename)",
    ),
    (
        "huge_pfnmap",
        &["follow_pfnmap_start"],
        &[],
        "v6.12, 6da8e9634bb7 (mm: new follow_pfnmap API)",
        "PFNMAP (MMIO) mappings pinned by PMD/PUD, not per page",
    ),
    (
        "ioas_map_file",
        &["iommufd_ioas_map_file", "iopt_map_file_pages"],
        &[],
        "v6.13, f4986a72d6e4 (iommufd: Add IOMMU_IOAS_MAP_FILE)",
        "iommufd maps a memfd by file offset (IOMMU_IOAS_MAP_FILE): no prefault in the map",
    ),
    (
        "iommu_map_batched_sync",
        &["iommu_map_nosync", "iommu_sync_map"],
        &[],
        "v6.16, 5c87cffe2d38 (iommu: generalize the batched sync after map interface)",
        "one IOTLB/iotlb_sync_map per batch instead of per iommu_map",
    ),
];

/// Which of [`KERNEL_FEATURES`] this kernel shows, read from /proc/kallsyms names (addresses
/// are not needed, so this works unprivileged too). `run` has the symbols loaded already and
/// uses [`kernel_features_from`] instead of reading the file again.
pub fn kernel_features() -> Vec<crate::report::KernelFeature> {
    let wanted: std::collections::BTreeSet<&str> = KERNEL_FEATURES
        .iter()
        .flat_map(|(_, w, wo, _, _)| w.iter().chain(wo.iter()).copied())
        .collect();
    let seen: Option<std::collections::BTreeSet<String>> = fs::read_to_string("/proc/kallsyms").ok().map(|text| {
        text.lines()
            .filter_map(|l| l.split_whitespace().nth(2))
            .filter(|n| wanted.contains(n))
            .map(str::to_owned)
            .collect()
    });
    match seen {
        Some(seen) => kernel_features_from(Some(&|n| seen.contains(n))),
        None => kernel_features_from(None),
    }
}

/// [`KERNEL_FEATURES`] judged by `has` (whether the kernel has a symbol); None: unknown.
pub fn kernel_features_from(has: Option<&dyn Fn(&str) -> bool>) -> Vec<crate::report::KernelFeature> {
    KERNEL_FEATURES
        .iter()
        .map(|(id, with, without, since, effect)| {
            let evidence = with
                .iter()
                .map(|s| format!("{s} present"))
                .chain(without.iter().map(|s| format!("{s} absent")))
                .collect::<Vec<_>>()
                .join(", ");
            crate::report::KernelFeature {
                id: (*id).to_owned(),
                present: has.map(|has| with.iter().all(|s| has(s)) && !without.iter().any(|s| has(s))),
                evidence,
                since: (*since).to_owned(),
                effect: (*effect).to_owned(),
            }
        })
        .collect()
}

/// Probes the host. Every check is independent: one failing never hides another.
pub fn probe_host() -> Doctor {
    probe(true)
}

/// What `run` needs to plan the cases: the DMA interfaces, without the BTF and BPF trials
/// (`run` finds out what attaches when it attaches, and reports that per probe). Under TCG this
/// saves seconds of start-up.
pub fn probe_for_run() -> Doctor {
    probe(false)
}

fn probe(bpf: bool) -> Doctor {
    let mut kernel = kernel_info();
    if bpf {
        kernel.features = kernel_features();
    }
    let mut c = BTreeMap::new();
    c.insert("privileges".into(), privileges());
    if bpf {
        c.insert("btf_vmlinux".into(), btf_vmlinux());
        c.insert("btf_modules".into(), btf_modules());
        for (name, result) in bpf_checks() {
            c.insert(name.into(), result);
        }
    }
    c.insert("vfio_type1".into(), vfio_type1());
    let (iommufd, map_file) = iommufd_checks();
    c.insert("iommufd".into(), iommufd);
    c.insert("map_file".into(), map_file);
    c.insert("vfio_cdev".into(), vfio_cdev());
    Doctor {
        kernel,
        capabilities: c,
        vfio_devices: vfio_devices(),
        hugepages: hugepages::pools(),
    }
}

/// Field `name` of /proc/self/status, trimmed (e.g. `CapEff`, `VmHWM` with its "kB").
pub fn self_status(name: &str) -> Option<String> {
    let text = fs::read_to_string("/proc/self/status").ok()?;
    text.lines()
        .find_map(|l| l.strip_prefix(name)?.strip_prefix(':').map(|v| v.trim().to_owned()))
}

/// Effective capabilities of this process.
fn effective_caps() -> u64 {
    self_status("CapEff")
        .and_then(|v| u64::from_str_radix(&v, 16).ok())
        .unwrap_or(0)
}

/// The capabilities dmaprof needs: (bit, name).
pub const NEEDED_CAPS: &[(u32, &str)] = &[
    (39, "CAP_BPF"),
    (38, "CAP_PERFMON"),
    (21, "CAP_SYS_ADMIN"),
    (14, "CAP_IPC_LOCK"),
];

/// Names of the needed capabilities this process lacks.
pub fn missing_caps() -> Vec<&'static str> {
    let eff = effective_caps();
    NEEDED_CAPS
        .iter()
        .filter(|(bit, _)| eff & (1 << bit) == 0)
        .map(|(_, n)| *n)
        .collect()
}

fn privileges() -> Capability {
    // SAFETY: geteuid cannot fail.
    let euid = unsafe { libc::geteuid() };
    let missing = missing_caps();
    if missing.is_empty() {
        cap(
            true,
            format!("euid {euid}; CAP_BPF, CAP_PERFMON, CAP_SYS_ADMIN, CAP_IPC_LOCK effective"),
        )
    } else {
        cap(
            false,
            format!("euid {euid}; missing {}: run as root", missing.join(", ")),
        )
    }
}

fn btf_vmlinux() -> Capability {
    match Btf::from_sys_fs() {
        Ok(_) => {
            let len = fs::metadata("/sys/kernel/btf/vmlinux").map(|m| m.len()).unwrap_or(0);
            cap(true, format!("/sys/kernel/btf/vmlinux parsed ({} KiB)", len / 1024))
        }
        Err(e) => cap(
            false,
            format!("cannot read kernel BTF ({e}): needs CONFIG_DEBUG_INFO_BTF; fentry/fexit need it"),
        ),
    }
}

fn btf_modules() -> Capability {
    let mods: Vec<String> = fs::read_dir("/sys/kernel/btf")
        .map(|d| {
            d.flatten()
                .map(|e| e.file_name().to_string_lossy().into_owned())
                .filter(|n| n != "vmlinux")
                .collect()
        })
        .unwrap_or_default();
    if !mods.is_empty() {
        let mut m = mods.clone();
        m.sort();
        m.truncate(8);
        return cap(
            true,
            format!(
                "{} modules with BTF ({}{})",
                mods.len(),
                m.join(", "),
                if mods.len() > 8 { ", ..." } else { "" }
            ),
        );
    }
    if !Path::new("/proc/modules").exists() {
        cap(
            false,
            "kernel has no loadable modules (CONFIG_MODULES off), so no module BTF; VFIO/IOMMUFD would have to be built in",
        )
    } else {
        cap(
            false,
            "no module has BTF loaded (needs CONFIG_DEBUG_INFO_BTF_MODULES and a loaded module such as vfio)",
        )
    }
}

/// Functions tried as kprobe targets, the first that exists wins.
const KPROBE_TARGETS: &[&str] = &["do_sys_openat2", "do_sys_open", "vfs_read"];

fn bpf_checks() -> Vec<(&'static str, Capability)> {
    let tid = gettid();
    let mut ebpf = match load_object(tid, None) {
        Ok(e) => e,
        Err(e) => {
            let c = cap(false, e.to_string());
            return vec![
                ("tracepoints", c.clone()),
                ("perf_sampling", c.clone()),
                ("kprobes", c.clone()),
                ("fentry", c),
            ];
        }
    };
    let mut out = Vec::new();

    // Tracepoints: attach the syscall-exit program for real (as a raw tracepoint).
    let tracefs = if Path::new("/sys/kernel/tracing/events").exists() {
        "tracefs mounted"
    } else {
        "tracefs not mounted (not needed)"
    };
    out.push((
        "tracepoints",
        match crate::probes::attach_raw_tracepoint(&mut ebpf, abi::programs::SYS_EXIT, "sys_exit") {
            Ok(()) => cap(
                true,
                format!("raw tracepoint raw_syscalls:sys_exit attached; {tracefs}"),
            ),
            Err(e) => cap(
                false,
                format!("raw_syscalls:sys_exit: {e} (needs CONFIG_TRACEPOINTS and BPF raw tracepoints)"),
            ),
        },
    ));

    // Sampling: attach the sampler to this thread, burn kernel time, count kernel stacks.
    out.push((
        "perf_sampling",
        match sample_check(&mut ebpf, tid) {
            Ok(d) => cap(true, d),
            Err(e) => cap(false, e),
        },
    ));

    // kprobes: try one.
    let kp = (|| -> Result<String, String> {
        let p: &mut KProbe = ebpf
            .program_mut(abi::programs::PROBE_KPROBE)
            .ok_or("program missing")?
            .try_into()
            .map_err(|e| format!("{e}"))?;
        p.load().map_err(|e| format!("load: {e}"))?;
        let mut last = String::new();
        for f in KPROBE_TARGETS {
            match p.attach(f, 0) {
                Ok(link) => {
                    let _ = p.detach(link);
                    return Ok(format!("kprobe on {f} attached"));
                }
                Err(e) => last = format!("attach {f}: {e}"),
            }
        }
        Err(last)
    })();
    out.push(("kprobes", match kp {
        Ok(d) => cap(true, d),
        Err(e) => {
            let hint = if Path::new("/sys/bus/event_source/devices/kprobe").exists() || Path::new("/sys/kernel/tracing/kprobe_events").exists() {
                "kprobes exist but this attach failed"
            } else {
                "kernel built without CONFIG_KPROBES; module functions (vfio, iommufd) cannot be probed here: use `cargo xtask vm`"
            };
            cap(false, format!("{e} ({hint})"))
        }
    }));

    // fentry: load against vmlinux BTF and attach.
    let fe = (|| -> Result<String, String> {
        let btf = Btf::from_sys_fs().map_err(|e| format!("no kernel BTF: {e}"))?;
        let p: &mut FEntry = ebpf
            .program_mut(abi::programs::PROBE_FENTRY)
            .ok_or("program missing")?
            .try_into()
            .map_err(|e| format!("{e}"))?;
        p.load("handle_mm_fault", &btf)
            .map_err(|e| format!("load on handle_mm_fault: {}", chain(&e)))?;
        let link = p.attach().map_err(|e| format!("attach: {}", chain(&e)))?;
        let _ = p.detach(link);
        Ok("fentry on handle_mm_fault attached".into())
    })();
    out.push((
        "fentry",
        match fe {
            Ok(d) => cap(true, d),
            Err(e) => cap(
                false,
                format!("{e} (fentry/fexit denied here; dmaprof falls back to kprobes or tracepoints)"),
            ),
        },
    ));
    out
}

/// An error with its sources, on one line.
fn chain(e: &dyn std::error::Error) -> String {
    let mut s = e.to_string();
    let mut cur = e.source();
    while let Some(c) = cur {
        s.push_str(": ");
        s.push_str(&c.to_string());
        cur = c.source();
    }
    s
}

fn sample_check(ebpf: &mut aya::Ebpf, tid: u32) -> Result<String, String> {
    let syms = crate::symbols::KernelSymbols::load().map_err(|e| format!("cannot read /proc/kallsyms: {e}"))?;
    if !syms.usable() {
        return Err(
            "/proc/kallsyms shows zero addresses (kptr_restrict): stacks cannot be resolved; run as root".into(),
        );
    }
    let p: &mut PerfEvent = ebpf
        .program_mut(abi::programs::SAMPLE_STACK)
        .ok_or("program missing")?
        .try_into()
        .map_err(|e| format!("{e}"))?;
    p.load().map_err(|e| format!("load: {e}"))?;
    let link = p
        .attach(
            PerfEventConfig::Software(SoftwareEvent::CpuClock),
            PerfEventScope::OneProcess { pid: tid, cpu: None },
            SamplePolicy::Frequency(999),
            false,
        )
        .map_err(|e| format!("perf_event_open + attach: {}", chain(&e)))?;
    let mut control: Array<_, Control> =
        Array::try_from(ebpf.map_mut(abi::maps::CONTROL).ok_or("CONTROL map missing")?).map_err(|e| e.to_string())?;
    control
        .set(0, Control { phase: 1, _reserved: 0 }, 0)
        .map_err(|e| e.to_string())?;
    // Spend ~100 ms in the kernel (reading /dev/zero clears user memory in kernel mode).
    let mut buf = vec![0u8; 1 << 20];
    let start = std::time::Instant::now();
    if let Ok(f) = fs::File::open("/dev/zero") {
        while start.elapsed() < Duration::from_millis(100) {
            // SAFETY: reads into our own buffer of the given length.
            unsafe { libc::read(f.as_raw_fd(), buf.as_mut_ptr().cast(), buf.len()) };
        }
    }
    control
        .set(0, Control { phase: 0, _reserved: 0 }, 0)
        .map_err(|e| e.to_string())?;
    let p: &mut PerfEvent = ebpf
        .program_mut(abi::programs::SAMPLE_STACK)
        .ok_or("program missing")?
        .try_into()
        .map_err(|e| format!("{e}"))?;
    let _ = p.detach(link);
    let counters: Array<_, PhaseCounters> = Array::try_from(
        ebpf.map(abi::maps::PHASE_COUNTERS)
            .ok_or("PHASE_COUNTERS map missing")?,
    )
    .map_err(|e| e.to_string())?;
    let samples = counters.get(&1, 0).map_err(|e| e.to_string())?.samples;
    let keys: HashMap<_, SampleKey, u64> =
        HashMap::try_from(ebpf.map(abi::maps::SAMPLES).ok_or("SAMPLES map missing")?).map_err(|e| e.to_string())?;
    let with_kernel: u64 = keys
        .iter()
        .flatten()
        .filter(|(k, _)| k.kernel_stack >= 0)
        .map(|(_, n)| n)
        .sum();
    if samples == 0 {
        return Err("perf event attached but no sample arrived in 100 ms".into());
    }
    if with_kernel == 0 {
        return Err(format!("{samples} samples but none with a kernel stack"));
    }
    Ok(format!(
        "cpu-clock on this thread: {samples} samples in 100 ms at 999 Hz, {with_kernel} with kernel stacks"
    ))
}

// VFIO and iommufd ioctl numbers: _IO(';', nr), from include/uapi/linux/vfio.h and iommufd.h.
const VFIO_GET_API_VERSION: libc::c_ulong = 0x3b64;
const VFIO_CHECK_EXTENSION: libc::c_ulong = 0x3b65;
const VFIO_TYPE1_IOMMU: libc::c_ulong = 1;
const VFIO_TYPE1V2_IOMMU: libc::c_ulong = 3;
const IOMMU_IOAS_MAP_FILE: libc::c_ulong = 0x3b00 | 0x8f;

fn open_rw(path: &str) -> std::io::Result<fs::File> {
    fs::OpenOptions::new().read(true).write(true).open(path)
}

fn vfio_type1() -> Capability {
    let f = match open_rw("/dev/vfio/vfio") {
        Ok(f) => f,
        Err(e) => {
            return cap(
                false,
                format!(
                    "/dev/vfio/vfio: {e} (needs the vfio and vfio_iommu_type1 modules or built-in VFIO; `cargo xtask vm` provides them)"
                ),
            );
        }
    };
    // SAFETY: argument-less VFIO ioctls on a VFIO container fd.
    let version = unsafe { libc::ioctl(f.as_raw_fd(), VFIO_GET_API_VERSION) };
    // SAFETY: VFIO_CHECK_EXTENSION takes the extension number by value.
    let t1 = unsafe { libc::ioctl(f.as_raw_fd(), VFIO_CHECK_EXTENSION, VFIO_TYPE1_IOMMU) };
    // SAFETY: as above.
    let t1v2 = unsafe { libc::ioctl(f.as_raw_fd(), VFIO_CHECK_EXTENSION, VFIO_TYPE1V2_IOMMU) };
    if t1 == 1 {
        cap(
            true,
            format!(
                "/dev/vfio/vfio API {version}, TYPE1 yes, TYPE1v2 {}",
                if t1v2 == 1 { "yes" } else { "no" }
            ),
        )
    } else {
        cap(
            false,
            format!("/dev/vfio/vfio API {version} but no TYPE1 IOMMU backend (load vfio_iommu_type1)"),
        )
    }
}

fn iommufd_checks() -> (Capability, Capability) {
    let f = match open_rw("/dev/iommu") {
        Ok(f) => f,
        Err(e) => {
            let why = format!(
                "/dev/iommu: {e} (kernel without CONFIG_IOMMUFD; Debian kernels lack it: use `cargo xtask vm` with the custom kernel)"
            );
            return (cap(false, why.clone()), cap(false, format!("no iommufd: {why}")));
        }
    };
    // A zero-sized argument: an ioctl the kernel knows fails its size check with EINVAL, an
    // unknown one (before 6.13) fails with ENOTTY.
    let arg = [0u32; 16];
    // SAFETY: the kernel reads at most `size` (= 0) bytes of our buffer; it is 64 bytes long.
    let r = unsafe { libc::ioctl(f.as_raw_fd(), IOMMU_IOAS_MAP_FILE, arg.as_ptr()) };
    let errno = std::io::Error::last_os_error();
    let map_file = if r == 0 || errno.raw_os_error() != Some(libc::ENOTTY) {
        cap(
            true,
            format!("IOMMU_IOAS_MAP_FILE known to the kernel (probe returned {errno})"),
        )
    } else {
        cap(false, "IOMMU_IOAS_MAP_FILE unknown (ENOTTY): kernel older than 6.13")
    };
    (cap(true, "/dev/iommu opened"), map_file)
}

fn vfio_cdev() -> Capability {
    match fs::read_dir("/dev/vfio/devices") {
        Ok(d) => {
            let names: Vec<String> = d
                .flatten()
                .map(|e| e.file_name().to_string_lossy().into_owned())
                .collect();
            cap(
                true,
                format!(
                    "/dev/vfio/devices: {}",
                    if names.is_empty() {
                        "present, no device bound".into()
                    } else {
                        names.join(", ")
                    }
                ),
            )
        }
        Err(e) => cap(
            false,
            format!("/dev/vfio/devices: {e} (needs CONFIG_VFIO_DEVICE_CDEV and a device bound to vfio-pci)"),
        ),
    }
}

fn link_name(p: &Path) -> Option<String> {
    fs::read_link(p)
        .ok()
        .and_then(|l| l.file_name().map(|n| n.to_string_lossy().into_owned()))
}

/// What an ended (or killed) dmaprof could have left behind. The kernel drops programs, links
/// and perf kprobes when the last fd closes, so anything here means a dmaprof process still
/// lives or something pinned them; `doctor --leftovers` exits 1 then.
#[derive(Clone, Debug, Default, Serialize, Deserialize, PartialEq, Eq)]
pub struct Leftovers {
    /// Loaded BPF programs that are dmaprof's (name and maps match): "id <n> <name>".
    pub programs: Vec<String>,
    /// BPF link ids whose program is one of those.
    pub links: Vec<u32>,
    /// tracefs kprobe/uprobe events that aya created (`aya_<pid>_...`).
    pub kprobe_events: Vec<String>,
    /// Other processes named dmaprof.
    pub processes: Vec<u32>,
}

impl Leftovers {
    /// Nothing left behind.
    pub fn is_empty(&self) -> bool {
        *self == Self::default()
    }
}

/// Looks for dmaprof's programs, links, tracefs probe events and processes. The kernel frees a
/// program only after an RCU grace period once its last reference is gone, so programs with no
/// process and no link left get up to two seconds to disappear before they count.
pub fn leftovers() -> Leftovers {
    let deadline = std::time::Instant::now() + Duration::from_secs(2);
    loop {
        let l = leftovers_now();
        let only_programs = l.links.is_empty() && l.processes.is_empty() && l.kprobe_events.is_empty();
        if l.is_empty() || !only_programs || std::time::Instant::now() >= deadline {
            return l;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

fn leftovers_now() -> Leftovers {
    use aya::{maps::MapInfo, programs::loaded_links, programs::loaded_programs};
    let ours = |p: &aya::programs::ProgramInfo| {
        let named = p.name_as_str().is_some_and(|n| {
            abi::programs::ALL.contains(&n)
                || n.starts_with(abi::programs::ROW_FENTRY_PREFIX)
                || n.starts_with(abi::programs::ROW_FEXIT_PREFIX)
        });
        // A name alone could be anyone's `sys_enter`; our programs also use our maps.
        let our_maps = p.map_ids().ok().flatten().unwrap_or_default().into_iter().any(|id| {
            MapInfo::from_id(id)
                .ok()
                .and_then(|m| m.name_as_str().map(|n| abi::maps::ALL.contains(&n)))
                .unwrap_or(false)
        });
        named && our_maps
    };
    let mut program_ids = Vec::new();
    let mut programs = Vec::new();
    for p in loaded_programs().flatten().filter(ours) {
        program_ids.push(p.id());
        programs.push(format!("id {} {}", p.id(), p.name_as_str().unwrap_or("?")));
    }
    let links = loaded_links()
        .flatten()
        .filter(|l| program_ids.contains(&l.program_id()))
        .map(|l| l.id())
        .collect();
    let mut kprobe_events = Vec::new();
    for dir in ["/sys/kernel/tracing", "/sys/kernel/debug/tracing"] {
        for file in ["kprobe_events", "uprobe_events"] {
            if let Ok(text) = fs::read_to_string(Path::new(dir).join(file)) {
                kprobe_events.extend(text.lines().filter(|l| l.contains("/aya_")).map(str::to_owned));
            }
        }
    }
    kprobe_events.sort();
    kprobe_events.dedup();
    let me = std::process::id();
    let processes = fs::read_dir("/proc")
        .map(|d| {
            d.flatten()
                .filter_map(|e| e.file_name().to_str()?.parse::<u32>().ok())
                .filter(|&pid| pid != me)
                .filter(|pid| fs::read_to_string(format!("/proc/{pid}/comm")).is_ok_and(|c| c.trim_end() == "dmaprof"))
                .collect()
        })
        .unwrap_or_default();
    Leftovers {
        programs,
        links,
        kprobe_events,
        processes,
    }
}

/// The `doctor --leftovers` text.
pub fn render_leftovers(l: &Leftovers) -> String {
    if l.is_empty() {
        return "leftovers: none (no dmaprof programs, links, kprobe events or processes)\n".into();
    }
    let mut s = String::from("leftovers:\n");
    for p in &l.programs {
        s += &format!("  bpf program {p}\n");
    }
    for id in &l.links {
        s += &format!("  bpf link id {id}\n");
    }
    for e in &l.kprobe_events {
        s += &format!("  probe event {e}\n");
    }
    for pid in &l.processes {
        s += &format!("  dmaprof process {pid} (it holds the rest; it ends on SIGTERM)\n");
    }
    s
}

/// PCI devices bound to vfio-pci.
pub fn vfio_devices() -> Vec<VfioDevice> {
    let mut out = Vec::new();
    let Ok(dir) = fs::read_dir("/sys/bus/pci/devices") else {
        return out;
    };
    for e in dir.flatten() {
        let p = e.path();
        let driver = link_name(&p.join("driver")).unwrap_or_default();
        if driver != "vfio-pci" {
            continue;
        }
        out.push(VfioDevice {
            bdf: e.file_name().to_string_lossy().into_owned(),
            driver,
            iommu_group: link_name(&p.join("iommu_group")),
        });
    }
    out.sort_by(|a, b| a.bdf.cmp(&b.bdf));
    out
}

/// The doctor table.
pub fn render(d: &Doctor) -> String {
    use std::fmt::Write as _;
    let mut s = String::new();
    let _ = writeln!(
        s,
        "kernel: Linux {} {} ({})",
        d.kernel.release, d.kernel.machine, d.kernel.version
    );
    for (name, c) in &d.capabilities {
        let _ = writeln!(s, "  {:<14} {:<4} {}", name, if c.ok { "yes" } else { "NO" }, c.detail);
    }
    let _ = writeln!(s, "kernel changes (from /proc/kallsyms):");
    for f in &d.kernel.features {
        let has = match f.present {
            Some(true) => "yes",
            Some(false) => "no",
            None => "?",
        };
        let _ = writeln!(s, "  {:<22} {:<3} since {}", f.id, has, f.since);
    }
    let _ = writeln!(
        s,
        "vfio-pci devices:{}",
        if d.vfio_devices.is_empty() { " none" } else { "" }
    );
    for v in &d.vfio_devices {
        let _ = writeln!(
            s,
            "  {} iommu_group {}",
            v.bdf,
            v.iommu_group.as_deref().unwrap_or("none (no IOMMU?)")
        );
    }
    let _ = writeln!(s, "hugepages:");
    for h in &d.hugepages {
        let _ = writeln!(s, "  {:>8} kB: {} total, {} free", h.size_kb, h.total, h.free);
    }
    s
}
