//! DMA mapping through each IOMMU mode, as the kernel's VFIO selftests set them up: a VFIO
//! container (`/dev/vfio/vfio`, or `/dev/iommu` in compat mode) with the device's group, or a
//! native iommufd IOAS with the device attached through its VFIO cdev.
//!
//! The ioctl argument structs come from rust-vmm's `vfio-bindings` and cloud-hypervisor's
//! `iommufd-bindings`; the ioctl numbers (`_IO(';', nr)`) are spelled out here because those
//! crates do not carry them.
use std::{
    fs::File,
    io,
    os::fd::{AsRawFd as _, RawFd},
    path::Path,
};

use iommufd_bindings as iofd;
use vfio_bindings::bindings::vfio;

use crate::{device::Device, matrix::DmaMode, size::ByteSize};

const fn io(nr: u32) -> libc::c_ulong {
    ((b';' as u32) << 8 | nr) as libc::c_ulong
}
const VFIO_BASE: u32 = 100;
/// `VFIO_GET_API_VERSION`.
pub const VFIO_GET_API_VERSION: libc::c_ulong = io(VFIO_BASE);
/// `VFIO_CHECK_EXTENSION`.
pub const VFIO_CHECK_EXTENSION: libc::c_ulong = io(VFIO_BASE + 1);
const VFIO_SET_IOMMU: libc::c_ulong = io(VFIO_BASE + 2);
const VFIO_GROUP_GET_STATUS: libc::c_ulong = io(VFIO_BASE + 3);
const VFIO_GROUP_SET_CONTAINER: libc::c_ulong = io(VFIO_BASE + 4);
const VFIO_GROUP_GET_DEVICE_FD: libc::c_ulong = io(VFIO_BASE + 6);
const VFIO_DEVICE_SET_IRQS: libc::c_ulong = io(VFIO_BASE + 10);
const VFIO_IOMMU_GET_INFO: libc::c_ulong = io(VFIO_BASE + 12);
/// `VFIO_IOMMU_MAP_DMA` (0x3b71).
pub const VFIO_IOMMU_MAP_DMA: libc::c_ulong = io(VFIO_BASE + 13);
const VFIO_IOMMU_UNMAP_DMA: libc::c_ulong = io(VFIO_BASE + 14);
const VFIO_DEVICE_BIND_IOMMUFD: libc::c_ulong = io(VFIO_BASE + 18);
const VFIO_DEVICE_ATTACH_IOMMUFD_PT: libc::c_ulong = io(VFIO_BASE + 19);
const IOMMU_IOAS_ALLOC: libc::c_ulong = io(iofd::IOMMUFD_CMD_IOAS_ALLOC);
const IOMMU_IOAS_IOVA_RANGES: libc::c_ulong = io(iofd::IOMMUFD_CMD_IOAS_IOVA_RANGES);
const IOMMU_IOAS_MAP: libc::c_ulong = io(iofd::IOMMUFD_CMD_IOAS_MAP);
const IOMMU_IOAS_UNMAP: libc::c_ulong = io(iofd::IOMMUFD_CMD_IOAS_UNMAP);
/// The type1 IOMMU backend (VFIO_CHECK_EXTENSION / VFIO_SET_IOMMU argument).
pub const VFIO_TYPE1_IOMMU: u32 = vfio::VFIO_TYPE1_IOMMU;
/// The type1v2 IOMMU backend.
pub const VFIO_TYPE1V2_IOMMU: u32 = vfio::VFIO_TYPE1v2_IOMMU;
/// `IOMMU_IOAS_MAP_FILE` (6.13+).
pub const IOMMU_IOAS_MAP_FILE: libc::c_ulong = io(iofd::IOMMUFD_CMD_IOAS_MAP_FILE);

/// A failed DMA step, with the errno and what it means here.
#[derive(Debug, thiserror::Error)]
#[error("{step}: {source}{}{}", detail.as_ref().map_or(hint(.source).to_owned(), |d| format!(" ({d})")), left_note(*.left_mapped))]
pub struct DmaError {
    /// What was being done.
    pub step: String,
    /// The OS error.
    #[source]
    pub source: io::Error,
    /// What the errno means in this very case (e.g. the memlock limit that was hit), in place
    /// of the errno's usual meaning.
    pub detail: Option<String>,
    /// After a failed map: how many bytes of the range the kernel had left mapped (0 when it
    /// cleaned up as it should; dmaprof unmaps whatever it finds).
    pub left_mapped: Option<u64>,
}

impl DmaError {
    fn new(step: impl Into<String>, source: io::Error) -> Self {
        Self {
            step: step.into(),
            source,
            detail: None,
            left_mapped: None,
        }
    }
}

fn left_note(left: Option<u64>) -> String {
    match left {
        Some(n) if n > 0 => format!("; the kernel left {n} bytes of the range mapped (unmapped them)"),
        _ => String::new(),
    }
}

fn hint(e: &io::Error) -> &'static str {
    match e.raw_os_error() {
        Some(libc::ENOMEM) => " (ENOMEM: out of memory, or over RLIMIT_MEMLOCK without CAP_IPC_LOCK)",
        Some(libc::ENODEV) => " (ENODEV: the device is gone or going)",
        Some(libc::EBUSY) => " (EBUSY: the group or device is in use by another process)",
        Some(libc::EEXIST) => " (EEXIST: the IOVA range is already mapped)",
        Some(libc::EINVAL) => " (EINVAL: the kernel rejected the arguments: alignment, IOVA range or flags)",
        Some(libc::ENOTTY) => " (ENOTTY: this kernel does not know the ioctl)",
        Some(libc::EPERM) => " (EPERM: needs root)",
        _ => "",
    }
}

fn err(step: impl Into<String>) -> DmaError {
    DmaError::new(step, io::Error::last_os_error())
}

fn open_rw(path: &Path) -> Result<File, DmaError> {
    crate::sys::open_rw(path).map_err(|source| DmaError::new(format!("open {}", path.display()), source))
}

/// ioctl with a pointer argument; `Ok(ret)` when it returns >= 0.
fn ioctl_ptr<T>(fd: RawFd, req: libc::c_ulong, arg: &mut T, step: &str) -> Result<i32, DmaError> {
    // SAFETY: `arg` is a live, properly sized #[repr(C)] struct for this request; the kernel
    // reads/writes at most its `argsz`/`size` bytes, which callers set to size_of::<T>().
    let r = unsafe { libc::ioctl(fd, req, arg as *mut T) };
    if r < 0 { Err(err(step)) } else { Ok(r) }
}

/// The mean time of one empty ioctl (`VFIO_GET_API_VERSION` on the container) over
/// `iterations` calls, ns; None without /dev/vfio/vfio.
pub fn empty_ioctl_ns(iterations: u32) -> Option<u64> {
    let container = crate::sys::open_rw("/dev/vfio/vfio").ok()?;
    let start = std::time::Instant::now();
    for _ in 0..iterations {
        ioctl_val(container.as_raw_fd(), VFIO_GET_API_VERSION, 0, "VFIO_GET_API_VERSION").ok()?;
    }
    Some(start.elapsed().as_nanos() as u64 / u64::from(iterations.max(1)))
}

/// ioctl with an integer argument.
fn ioctl_val(fd: RawFd, req: libc::c_ulong, arg: libc::c_ulong, step: &str) -> Result<i32, DmaError> {
    // SAFETY: these VFIO requests take their argument by value and touch no user memory.
    let r = unsafe { libc::ioctl(fd, req, arg) };
    if r < 0 { Err(err(step)) } else { Ok(r) }
}

/// An IOVA range, inclusive.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct IovaRange {
    /// First IOVA.
    pub start: u64,
    /// Last IOVA.
    pub last: u64,
}

/// The lowest `align`-aligned IOVA at which `size` bytes fit in one of `ranges`.
pub fn choose_iova(ranges: &[IovaRange], size: u64, align: u64) -> Option<u64> {
    let mut best: Option<u64> = None;
    for r in ranges {
        // Stay off IOVA 0: some drivers treat it as "no address".
        let start = r.start.max(align).checked_next_multiple_of(align)?;
        if start.checked_add(size - 1).is_some_and(|end| end <= r.last) {
            best = Some(best.map_or(start, |b| b.min(start)));
        }
    }
    best
}

enum Backend {
    /// A VFIO container (type1 or iommufd compat) with the group attached and the device open.
    Container {
        container: File,
        _group: File,
        _device: File,
    },
    /// Native iommufd: the IOAS the device is attached to.
    Iommufd { iommufd: File, _device: File, ioas: u32 },
}

impl Backend {
    fn device(&self) -> &File {
        match self {
            Backend::Container { _device, .. } | Backend::Iommufd { _device, .. } => _device,
        }
    }
}

/// VFIO_DEVICE_SET_IRQS with one eventfd: the header and the fd as the kernel reads them.
#[repr(C)]
struct IrqSetOne {
    set: vfio::vfio_irq_set,
    fd: i32,
}

/// An eventfd the kernel signals when it asks for `device` back (vfio-pci's request
/// interrupt); None where the kernel does not offer it.
fn removal_eventfd(device: &File) -> Option<File> {
    // SAFETY: eventfd takes no pointers; a negative result is handled below.
    let efd = unsafe { libc::eventfd(0, libc::EFD_NONBLOCK | libc::EFD_CLOEXEC) };
    if efd < 0 {
        return None;
    }
    // SAFETY: efd is a fresh fd; File takes sole ownership.
    let efd = unsafe { <File as std::os::fd::FromRawFd>::from_raw_fd(efd) };
    let mut irq = IrqSetOne {
        set: vfio::vfio_irq_set {
            argsz: size_of::<IrqSetOne>() as u32,
            flags: vfio::VFIO_IRQ_SET_DATA_EVENTFD | vfio::VFIO_IRQ_SET_ACTION_TRIGGER,
            index: vfio::VFIO_PCI_REQ_IRQ_INDEX,
            start: 0,
            count: 1,
            data: Default::default(),
        },
        fd: efd.as_raw_fd(),
    };
    ioctl_ptr(
        device.as_raw_fd(),
        VFIO_DEVICE_SET_IRQS,
        &mut irq,
        "VFIO_DEVICE_SET_IRQS",
    )
    .ok()?;
    Some(efd)
}

/// Where the kernel's fault injection is armed for the calling thread.
const MAKE_IT_FAIL: &str = "/proc/thread-self/make-it-fail";

/// The calling thread armed for the kernel's fault injection while this lives. The file is
/// opened before arming: with failslab armed, opening it (a `struct file` from the slab) would
/// fail, and the thread would stay armed.
struct Armed<'a>(&'a File);

impl<'a> Armed<'a> {
    fn arm(knob: &'a File) -> Result<Self, DmaError> {
        set_make_it_fail(knob, b"1")?;
        Ok(Self(knob))
    }
}

impl Drop for Armed<'_> {
    fn drop(&mut self) {
        let _ = set_make_it_fail(self.0, b"0");
    }
}

fn set_make_it_fail(knob: &File, value: &[u8]) -> Result<(), DmaError> {
    use std::os::unix::fs::FileExt as _;
    knob.write_at(value, 0)
        .map(drop)
        .map_err(|e| DmaError::new(format!("writing {MAKE_IT_FAIL}"), e))
}

/// One mode's DMA-mapping context for one case: set up (not timed), then map/unmap per iteration.
pub struct DmaContext {
    backend: Backend,
    /// The IOVA every map uses.
    pub iova: u64,
    /// The size every map maps (the IOVA range was chosen for it).
    size: ByteSize,
    mapped: Option<u64>,
    use_map_file: bool,
    /// The device's PCI address, for messages.
    bdf: String,
    /// The eventfd the kernel signals when it wants the device back (an unbind or a removal
    /// waits until every fd of the device is closed); None where the kernel refused it.
    removal: Option<File>,
    /// This thread's fault-injection switch, flipped on for each map ioctl when set.
    inject: Option<File>,
}

/// A DMA map or unmap ioctl, as `record` recognises it in another process: its request number
/// and where its argument struct keeps the IOVA and the size.
#[derive(
    Clone,
    Copy,
    Debug,
    PartialEq,
    Eq,
    PartialOrd,
    Ord,
    Hash,
    serde::Serialize,
    serde::Deserialize,
    strum::EnumIter,
    strum::IntoStaticStr,
    strum::Display,
)]
pub enum DmaIoctl {
    /// VFIO type1 (and iommufd's compat container) map.
    #[serde(rename = "VFIO_IOMMU_MAP_DMA")]
    #[strum(serialize = "VFIO_IOMMU_MAP_DMA")]
    VfioMapDma,
    /// VFIO type1 unmap.
    #[serde(rename = "VFIO_IOMMU_UNMAP_DMA")]
    #[strum(serialize = "VFIO_IOMMU_UNMAP_DMA")]
    VfioUnmapDma,
    /// iommufd map of user memory.
    #[serde(rename = "IOMMU_IOAS_MAP")]
    #[strum(serialize = "IOMMU_IOAS_MAP")]
    IoasMap,
    /// iommufd map of a file range (6.13+).
    #[serde(rename = "IOMMU_IOAS_MAP_FILE")]
    #[strum(serialize = "IOMMU_IOAS_MAP_FILE")]
    IoasMapFile,
    /// iommufd unmap.
    #[serde(rename = "IOMMU_IOAS_UNMAP")]
    #[strum(serialize = "IOMMU_IOAS_UNMAP")]
    IoasUnmap,
    /// iommufd copy of a mapping into another IOAS (the destination IOVA is recorded).
    #[serde(rename = "IOMMU_IOAS_COPY")]
    #[strum(serialize = "IOMMU_IOAS_COPY")]
    IoasCopy,
}

impl DmaIoctl {
    /// The ioctl request number.
    pub fn cmd(self) -> libc::c_ulong {
        match self {
            DmaIoctl::VfioMapDma => VFIO_IOMMU_MAP_DMA,
            DmaIoctl::VfioUnmapDma => VFIO_IOMMU_UNMAP_DMA,
            DmaIoctl::IoasMap => IOMMU_IOAS_MAP,
            DmaIoctl::IoasMapFile => IOMMU_IOAS_MAP_FILE,
            DmaIoctl::IoasUnmap => IOMMU_IOAS_UNMAP,
            DmaIoctl::IoasCopy => io(iofd::IOMMUFD_CMD_IOAS_COPY),
        }
    }

    /// Offsets of the u64 IOVA and the u64 size in the argument struct.
    pub fn iova_and_size_offsets(self) -> (usize, usize) {
        use std::mem::offset_of;
        match self {
            DmaIoctl::VfioMapDma => (
                offset_of!(vfio::vfio_iommu_type1_dma_map, iova),
                offset_of!(vfio::vfio_iommu_type1_dma_map, size),
            ),
            DmaIoctl::VfioUnmapDma => (
                offset_of!(vfio::vfio_iommu_type1_dma_unmap, iova),
                offset_of!(vfio::vfio_iommu_type1_dma_unmap, size),
            ),
            DmaIoctl::IoasMap => (
                offset_of!(iofd::iommu_ioas_map, iova),
                offset_of!(iofd::iommu_ioas_map, length),
            ),
            DmaIoctl::IoasMapFile => (
                offset_of!(iofd::iommu_ioas_map_file, iova),
                offset_of!(iofd::iommu_ioas_map_file, length),
            ),
            DmaIoctl::IoasUnmap => (
                offset_of!(iofd::iommu_ioas_unmap, iova),
                offset_of!(iofd::iommu_ioas_unmap, length),
            ),
            DmaIoctl::IoasCopy => (
                offset_of!(iofd::iommu_ioas_copy, dst_iova),
                offset_of!(iofd::iommu_ioas_copy, length),
            ),
        }
    }

    /// Whether it maps (rather than unmaps).
    pub fn maps(self) -> bool {
        !matches!(self, DmaIoctl::VfioUnmapDma | DmaIoctl::IoasUnmap)
    }

    /// The kind with request number `cmd`.
    pub fn from_cmd(cmd: u32) -> Option<Self> {
        <Self as strum::IntoEnumIterator>::iter().find(|k| k.cmd() == libc::c_ulong::from(cmd))
    }
}

/// Which ioctl a mode uses for the map phase.
pub fn map_ioctl(mode: DmaMode, memfd: bool) -> &'static str {
    match (mode, memfd) {
        (DmaMode::Iommufd, true) => "IOMMU_IOAS_MAP_FILE",
        (DmaMode::Iommufd, false) => "IOMMU_IOAS_MAP",
        _ => "VFIO_IOMMU_MAP_DMA",
    }
}

impl DmaContext {
    /// Sets up `mode` for `device` and picks an IOVA for `size` aligned to `align`; every
    /// [`Self::map`] maps that size.
    pub fn open(mode: DmaMode, device: &Device, memfd: bool, size: ByteSize, align: u64) -> Result<Self, DmaError> {
        let (backend, ranges) = match mode {
            DmaMode::Iommufd => open_iommufd(device)?,
            DmaMode::VfioType1Iommu
            | DmaMode::VfioType1v2Iommu
            | DmaMode::IommufdCompatType1
            | DmaMode::IommufdCompatType1v2 => open_container(mode, device)?,
        };
        let iova = choose_iova(&ranges, size.bytes(), align).ok_or_else(|| {
            DmaError::new(
                format!("choosing an IOVA for {size} bytes in {ranges:x?}"),
                io::Error::from_raw_os_error(libc::ENOSPC),
            )
        })?;
        let removal = removal_eventfd(backend.device());
        Ok(Self {
            backend,
            iova,
            size,
            mapped: None,
            use_map_file: mode == DmaMode::Iommufd && memfd,
            bdf: device.bdf.clone(),
            removal,
            inject: None,
        })
    }

    /// From now on each map ioctl runs with this thread armed for the kernel's fault injection
    /// (what fails, and how often, is set in /sys/kernel/debug/fail*): a test of the failure
    /// paths, the kernel's and dmaprof's.
    pub fn inject_faults(&mut self) -> Result<(), DmaError> {
        let knob = std::fs::OpenOptions::new()
            .write(true)
            .open(MAKE_IT_FAIL)
            .map_err(|e| DmaError::new(format!("opening {MAKE_IT_FAIL} (needs CONFIG_FAULT_INJECTION)"), e))?;
        self.inject = Some(knob);
        Ok(())
    }

    /// The device's PCI address.
    pub fn bdf(&self) -> &str {
        &self.bdf
    }

    /// True once the kernel has asked for the device back: it is being unbound from vfio-pci
    /// or removed, and waits until this context's fds are closed.
    pub fn removal_requested(&self) -> bool {
        let Some(efd) = &self.removal else { return false };
        let mut count = [0u8; 8];
        // SAFETY: reads 8 bytes into a local buffer from our non-blocking eventfd.
        unsafe { libc::read(efd.as_raw_fd(), count.as_mut_ptr().cast(), count.len()) == 8 }
    }

    /// Maps `len` bytes at `addr` (or of `memfd` from offset 0, for MAP_FILE) at
    /// [`Self::iova`]: the context's size, or less (a primer's buffer).
    pub fn map(&mut self, addr: u64, len: ByteSize, memfd: Option<RawFd>) -> Result<(), DmaError> {
        if len > self.size {
            return Err(DmaError::new(
                format!("mapping {len} in a DMA context set up for {}", self.size),
                io::Error::from_raw_os_error(libc::EINVAL),
            ));
        }
        let knob = self.inject.take();
        let armed = knob.as_ref().map(Armed::arm).transpose()?;
        let r = self.map_once(addr, len.bytes(), memfd);
        drop(armed);
        self.inject = knob;
        r.map_err(|mut e| {
            if e.source.raw_os_error() == Some(libc::ENOMEM) {
                e.detail = match self.inject.is_some() {
                    true => {
                        Some("ENOMEM: the kernel's fault injection, armed for this map, failed an allocation".into())
                    }
                    false => crate::privileges::memlock_shortfall(len.bytes()),
                };
            }
            e.left_mapped = self.clear_range();
            e
        })
    }

    /// After a failed map the kernel must have undone what it had mapped: unmaps the whole
    /// range and returns how many bytes it found still mapped (None if it could not tell).
    fn clear_range(&mut self) -> Option<u64> {
        self.mapped = None;
        match self.unmap_range(self.size.bytes()) {
            Ok(n) => Some(n),
            // iommufd says ENOENT for a range with nothing mapped; type1 answers a size of 0.
            Err(e) if e.source.raw_os_error() == Some(libc::ENOENT) => Some(0),
            Err(_) => None,
        }
    }

    fn map_once(&mut self, addr: u64, len: u64, memfd: Option<RawFd>) -> Result<(), DmaError> {
        match &self.backend {
            Backend::Container { container, .. } => {
                let mut m = vfio::vfio_iommu_type1_dma_map {
                    argsz: size_of::<vfio::vfio_iommu_type1_dma_map>() as u32,
                    flags: vfio::VFIO_DMA_MAP_FLAG_READ | vfio::VFIO_DMA_MAP_FLAG_WRITE,
                    vaddr: addr,
                    iova: self.iova,
                    size: len,
                };
                ioctl_ptr(container.as_raw_fd(), VFIO_IOMMU_MAP_DMA, &mut m, "VFIO_IOMMU_MAP_DMA")?;
            }
            Backend::Iommufd { iommufd, ioas, .. } => {
                let flags = iofd::iommufd_ioas_map_flags_IOMMU_IOAS_MAP_FIXED_IOVA
                    | iofd::iommufd_ioas_map_flags_IOMMU_IOAS_MAP_READABLE
                    | iofd::iommufd_ioas_map_flags_IOMMU_IOAS_MAP_WRITEABLE;
                match (self.use_map_file, memfd) {
                    (true, Some(fd)) => {
                        let mut m = iofd::iommu_ioas_map_file {
                            size: size_of::<iofd::iommu_ioas_map_file>() as u32,
                            flags,
                            ioas_id: *ioas,
                            fd,
                            start: 0,
                            length: len,
                            iova: self.iova,
                        };
                        ioctl_ptr(iommufd.as_raw_fd(), IOMMU_IOAS_MAP_FILE, &mut m, "IOMMU_IOAS_MAP_FILE")?;
                    }
                    _ => {
                        let mut m = iofd::iommu_ioas_map {
                            size: size_of::<iofd::iommu_ioas_map>() as u32,
                            flags,
                            ioas_id: *ioas,
                            __reserved: 0,
                            user_va: addr,
                            length: len,
                            iova: self.iova,
                        };
                        ioctl_ptr(iommufd.as_raw_fd(), IOMMU_IOAS_MAP, &mut m, "IOMMU_IOAS_MAP")?;
                    }
                }
            }
        }
        self.mapped = Some(len);
        Ok(())
    }

    /// Unmaps what [`Self::map`] mapped; fails unless the kernel unmapped all of it.
    pub fn unmap(&mut self) -> Result<u64, DmaError> {
        let Some(len) = self.mapped.take() else { return Ok(0) };
        let unmapped = self.unmap_range(len)?;
        if unmapped != len {
            return Err(DmaError::new(
                format!("unmap returned {unmapped} bytes of {len}"),
                io::Error::from_raw_os_error(libc::EIO),
            ));
        }
        Ok(unmapped)
    }

    /// Unmaps `len` bytes at the IOVA; returns how many bytes the kernel unmapped.
    fn unmap_range(&self, len: u64) -> Result<u64, DmaError> {
        Ok(match &self.backend {
            Backend::Container { container, .. } => {
                let mut u = vfio::vfio_iommu_type1_dma_unmap {
                    argsz: size_of::<vfio::vfio_iommu_type1_dma_unmap>() as u32,
                    flags: 0,
                    iova: self.iova,
                    size: len,
                    data: Default::default(),
                };
                ioctl_ptr(
                    container.as_raw_fd(),
                    VFIO_IOMMU_UNMAP_DMA,
                    &mut u,
                    "VFIO_IOMMU_UNMAP_DMA",
                )?;
                u.size
            }
            Backend::Iommufd { iommufd, ioas, .. } => {
                let mut u = iofd::iommu_ioas_unmap {
                    size: size_of::<iofd::iommu_ioas_unmap>() as u32,
                    ioas_id: *ioas,
                    iova: self.iova,
                    length: len,
                };
                ioctl_ptr(iommufd.as_raw_fd(), IOMMU_IOAS_UNMAP, &mut u, "IOMMU_IOAS_UNMAP")?;
                u.length
            }
        })
    }
}

impl Drop for DmaContext {
    fn drop(&mut self) {
        // An iteration that failed between map and unmap leaves a mapping: take it down before
        // the fds close (closing would also do it, but an explicit unmap reports nothing left).
        let _ = self.unmap();
    }
}

fn open_container(mode: DmaMode, device: &Device) -> Result<(Backend, Vec<IovaRange>), DmaError> {
    let (path, iommu_type) = match mode {
        DmaMode::VfioType1Iommu => ("/dev/vfio/vfio", vfio::VFIO_TYPE1_IOMMU),
        DmaMode::VfioType1v2Iommu => ("/dev/vfio/vfio", vfio::VFIO_TYPE1v2_IOMMU),
        DmaMode::IommufdCompatType1 => ("/dev/iommu", vfio::VFIO_TYPE1_IOMMU),
        _ => ("/dev/iommu", vfio::VFIO_TYPE1v2_IOMMU),
    };
    let container = open_rw(Path::new(path))?;
    let cfd = container.as_raw_fd();
    let version = ioctl_val(cfd, VFIO_GET_API_VERSION, 0, "VFIO_GET_API_VERSION")?;
    if version != vfio::VFIO_API_VERSION as i32 {
        return Err(DmaError::new(
            format!("{path} speaks VFIO API {version}, not {}", vfio::VFIO_API_VERSION),
            io::Error::from_raw_os_error(libc::EINVAL),
        ));
    }
    if ioctl_val(cfd, VFIO_CHECK_EXTENSION, iommu_type.into(), "VFIO_CHECK_EXTENSION")? != 1 {
        return Err(DmaError::new(
            format!("{path} does not support IOMMU type {iommu_type}"),
            io::Error::from_raw_os_error(libc::ENOTSUP),
        ));
    }
    let group = open_rw(&Path::new("/dev/vfio").join(&device.group))?;
    let mut status = vfio::vfio_group_status {
        argsz: size_of::<vfio::vfio_group_status>() as u32,
        flags: 0,
    };
    ioctl_ptr(
        group.as_raw_fd(),
        VFIO_GROUP_GET_STATUS,
        &mut status,
        "VFIO_GROUP_GET_STATUS",
    )?;
    if status.flags & vfio::VFIO_GROUP_FLAGS_VIABLE == 0 {
        return Err(DmaError::new(
            format!(
                "IOMMU group {} is not viable (bind every device in it to vfio-pci)",
                device.group
            ),
            io::Error::from_raw_os_error(libc::EPERM),
        ));
    }
    let mut fd = cfd;
    ioctl_ptr(
        group.as_raw_fd(),
        VFIO_GROUP_SET_CONTAINER,
        &mut fd,
        "VFIO_GROUP_SET_CONTAINER",
    )?;
    ioctl_val(cfd, VFIO_SET_IOMMU, iommu_type.into(), "VFIO_SET_IOMMU")?;
    // Open the device as the selftests do: with /dev/iommu as the container, that is what
    // attaches it to the IOAS; without a domain iommufd pins and maps nothing at MAP_DMA.
    let name = std::ffi::CString::new(device.bdf.as_str()).expect("a BDF has no NUL");
    // SAFETY: VFIO_GROUP_GET_DEVICE_FD reads a NUL-terminated device name and returns a new fd.
    let dfd = unsafe { libc::ioctl(group.as_raw_fd(), VFIO_GROUP_GET_DEVICE_FD, name.as_ptr()) };
    if dfd < 0 {
        return Err(err(format!("VFIO_GROUP_GET_DEVICE_FD {}", device.bdf)));
    }
    // SAFETY: dfd is a fresh fd the kernel just gave us; File takes sole ownership.
    let dev = unsafe { <File as std::os::fd::FromRawFd>::from_raw_fd(dfd) };
    let ranges = type1_iova_ranges(cfd)?;
    Ok((
        Backend::Container {
            container,
            _group: group,
            _device: dev,
        },
        ranges,
    ))
}

/// VFIO_IOMMU_GET_INFO's IOVA-range capability; the whole 64-bit space minus 0 when absent.
fn type1_iova_ranges(cfd: RawFd) -> Result<Vec<IovaRange>, DmaError> {
    let header = size_of::<vfio::vfio_iommu_type1_info>();
    let mut buf = vec![0u64; 512];
    let info = buf.as_mut_ptr().cast::<vfio::vfio_iommu_type1_info>();
    // SAFETY: buf is 4 KiB, 8-byte aligned, larger than the header; argsz tells the kernel so.
    unsafe { (*info).argsz = (buf.len() * 8) as u32 };
    // SAFETY: as above; the kernel writes at most argsz bytes.
    if unsafe { libc::ioctl(cfd, VFIO_IOMMU_GET_INFO, info) } < 0 {
        return Err(err("VFIO_IOMMU_GET_INFO"));
    }
    let bytes: &[u8] = {
        // SAFETY: reinterpreting our own u64 buffer as bytes.
        unsafe { std::slice::from_raw_parts(buf.as_ptr().cast::<u8>(), buf.len() * 8) }
    };
    let rd32 = |o: usize| {
        bytes
            .get(o..o + 4)
            .map(|b| u32::from_ne_bytes(b.try_into().expect("4 bytes")))
    };
    let rd64 = |o: usize| {
        bytes
            .get(o..o + 8)
            .map(|b| u64::from_ne_bytes(b.try_into().expect("8 bytes")))
    };
    let mut ranges = Vec::new();
    let mut off = rd32(16).unwrap_or(0) as usize; // cap_offset
    let mut guard = 0;
    while off >= header && guard < 32 {
        guard += 1;
        let (Some(idver), Some(next)) = (rd32(off), rd32(off + 4)) else {
            break;
        };
        if idver & 0xffff == vfio::VFIO_IOMMU_TYPE1_INFO_CAP_IOVA_RANGE {
            let n = rd32(off + 8).unwrap_or(0) as usize;
            for i in 0..n {
                if let (Some(start), Some(last)) = (rd64(off + 16 + i * 16), rd64(off + 24 + i * 16)) {
                    ranges.push(IovaRange { start, last });
                }
            }
        }
        off = next as usize;
    }
    if ranges.is_empty() {
        ranges.push(IovaRange {
            start: 0,
            last: u64::MAX,
        });
    }
    Ok(ranges)
}

fn open_iommufd(device: &Device) -> Result<(Backend, Vec<IovaRange>), DmaError> {
    let cdev = device.cdev.as_ref().ok_or_else(|| {
        DmaError::new(
            format!("device {} has no VFIO cdev", device.bdf),
            io::Error::from_raw_os_error(libc::ENODEV),
        )
    })?;
    let iommufd = open_rw(Path::new("/dev/iommu"))?;
    let dev = open_rw(cdev)?;
    let mut bind = vfio::vfio_device_bind_iommufd {
        // Up to out_devid: what every kernel with cdev support accepts.
        argsz: 16,
        flags: 0,
        iommufd: iommufd.as_raw_fd(),
        out_devid: 0,
        token_uuid_ptr: 0,
    };
    ioctl_ptr(
        dev.as_raw_fd(),
        VFIO_DEVICE_BIND_IOMMUFD,
        &mut bind,
        "VFIO_DEVICE_BIND_IOMMUFD",
    )?;
    let mut alloc = iofd::iommu_ioas_alloc {
        size: size_of::<iofd::iommu_ioas_alloc>() as u32,
        flags: 0,
        out_ioas_id: 0,
    };
    ioctl_ptr(iommufd.as_raw_fd(), IOMMU_IOAS_ALLOC, &mut alloc, "IOMMU_IOAS_ALLOC")?;
    let ioas = alloc.out_ioas_id;
    let mut attach = vfio::vfio_device_attach_iommufd_pt {
        argsz: 12,
        flags: 0,
        pt_id: ioas,
        pasid: 0,
    };
    ioctl_ptr(
        dev.as_raw_fd(),
        VFIO_DEVICE_ATTACH_IOMMUFD_PT,
        &mut attach,
        "VFIO_DEVICE_ATTACH_IOMMUFD_PT",
    )?;
    let mut raw = vec![iofd::iommu_iova_range { start: 0, last: 0 }; 64];
    let mut q = iofd::iommu_ioas_iova_ranges {
        size: size_of::<iofd::iommu_ioas_iova_ranges>() as u32,
        ioas_id: ioas,
        num_iovas: raw.len() as u32,
        __reserved: 0,
        allowed_iovas: raw.as_mut_ptr() as u64,
        out_iova_alignment: 0,
    };
    ioctl_ptr(
        iommufd.as_raw_fd(),
        IOMMU_IOAS_IOVA_RANGES,
        &mut q,
        "IOMMU_IOAS_IOVA_RANGES",
    )?;
    let ranges = raw
        .iter()
        .take(q.num_iovas as usize)
        .map(|r| IovaRange {
            start: r.start,
            last: r.last,
        })
        .collect();
    Ok((
        Backend::Iommufd {
            iommufd,
            _device: dev,
            ioas,
        },
        ranges,
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ioctl_numbers_match_the_uapi() {
        assert_eq!(VFIO_IOMMU_MAP_DMA, 0x3b71);
        assert_eq!(VFIO_IOMMU_UNMAP_DMA, 0x3b72);
        assert_eq!(VFIO_DEVICE_BIND_IOMMUFD, 0x3b76);
        assert_eq!(IOMMU_IOAS_MAP, 0x3b85);
        assert_eq!(IOMMU_IOAS_MAP_FILE, 0x3b8f);
        assert_eq!(DmaIoctl::IoasCopy.cmd(), 0x3b83);
        assert_eq!(DmaIoctl::IoasUnmap.cmd(), 0x3b86);
    }

    #[test]
    fn recorded_ioctls_find_their_fields() {
        assert_eq!(DmaIoctl::VfioMapDma.iova_and_size_offsets(), (16, 24));
        assert_eq!(DmaIoctl::VfioUnmapDma.iova_and_size_offsets(), (8, 16));
        assert_eq!(DmaIoctl::IoasMap.iova_and_size_offsets(), (32, 24));
        assert_eq!(DmaIoctl::IoasUnmap.iova_and_size_offsets(), (8, 16));
        assert_eq!(DmaIoctl::from_cmd(0x3b71), Some(DmaIoctl::VfioMapDma));
        assert_eq!(DmaIoctl::from_cmd(0x3b70), None);
        assert_eq!(DmaIoctl::IoasMapFile.to_string(), "IOMMU_IOAS_MAP_FILE");
        assert!(!DmaIoctl::IoasUnmap.maps() && DmaIoctl::IoasCopy.maps());
    }

    #[test]
    fn iova_choice() {
        let r = [
            IovaRange {
                start: 0,
                last: 0xfedf_ffff,
            },
            IovaRange {
                start: 0xfef0_0000,
                last: (1 << 48) - 1,
            },
        ];
        assert_eq!(choose_iova(&r, 1 << 30, 1 << 30), Some(1 << 30));
        assert_eq!(choose_iova(&r, 4 << 30, 2 << 20), Some(0xff00_0000));
        assert_eq!(choose_iova(&r, 1 << 50, 4096), None);
        assert_eq!(
            choose_iova(
                &[IovaRange {
                    start: 0,
                    last: u64::MAX
                }],
                4096,
                4096
            ),
            Some(4096)
        );
    }
}
