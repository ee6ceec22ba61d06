//! The workload: memfd_create / mmap / prefault / munmap / close of one buffer, phase by phase,
//! on the calling thread (the one the probes watch).
use std::{
    ffi::CStr,
    sync::atomic::{AtomicBool, Ordering},
    time::Instant,
};

pub use crate::phase::{PHASES, Phase};
use crate::{
    dma::DmaContext,
    matrix::{Backing, Prefault, Workload},
};

/// Told when each phase starts and ends (the probes switch their phase slot here).
pub trait PhaseObserver {
    /// Right before the phase's clock starts.
    fn begin(&mut self, phase: Phase);
    /// Right after the phase's clock stops.
    fn end(&mut self, phase: Phase);
}

/// What one phase of one iteration measured in user space.
#[derive(Clone, Copy, Debug)]
pub struct PhaseRun {
    /// Which phase.
    pub phase: Phase,
    /// Wall time, user-space monotonic clock.
    pub wall_ns: u64,
    /// The thread's CPU time over the phase (`CLOCK_THREAD_CPUTIME_ID`, read just outside the
    /// wall clock's reads): with it, the time the thread spent off the CPU is known in every
    /// pass, probes or none.
    pub cpu_ns: u64,
    /// Minor faults of this thread during the phase (getrusage; includes GUP-driven faults).
    pub minor_faults: u64,
    /// Major faults likewise.
    pub major_faults: u64,
    /// Times the thread left the CPU during the phase, by the kernel's own count (getrusage's
    /// voluntary plus involuntary context switches).
    pub context_switches: u64,
    /// How many physically contiguous runs the iteration's buffer made (read before its
    /// munmap; None where its pages were not all present or frame numbers are hidden).
    pub physical_runs: Option<u64>,
}

impl PhaseRun {
    /// The phase's wall time the thread spent off the CPU (other tasks ran, or it waited).
    pub fn off_cpu_ns(&self) -> u64 {
        self.wall_ns.saturating_sub(self.cpu_ns)
    }
}

/// Why an iteration failed.
#[derive(Debug, thiserror::Error)]
pub enum WorkloadError {
    /// A syscall failed.
    #[error("{call} failed: {source}")]
    Syscall {
        /// What was called.
        call: &'static str,
        /// errno.
        source: std::io::Error,
    },
    /// A DMA map or unmap failed.
    #[error(transparent)]
    Dma(#[from] crate::dma::DmaError),
    /// Ctrl-C or another stop signal arrived.
    #[error("interrupted")]
    Interrupted,
    /// A hugetlb mmap found no free hugepages: another process took the ones reserved for the
    /// case (they are free between iterations).
    #[error(
        "no free {size_kb} KiB hugepage for the mmap ({free} free of {total}): another process took the pages reserved for this case"
    )]
    HugepagesTaken {
        /// The pool's page size.
        size_kb: u64,
        /// free_hugepages when the mmap failed.
        free: u64,
        /// nr_hugepages.
        total: u64,
    },
    /// The kernel asked for the DMA device back (it is being unbound or removed).
    #[error(
        "device {bdf} is going away: the kernel asked for it back (unbound from vfio-pci or removed) while this case used it"
    )]
    DeviceRemoved {
        /// Its PCI address.
        bdf: String,
    },
}

fn last_error(call: &'static str) -> WorkloadError {
    WorkloadError::Syscall {
        call,
        source: std::io::Error::last_os_error(),
    }
}

/// This thread's minor faults, major faults and context switches so far.
/// The calling thread's CPU time, ns.
fn thread_cpu_ns() -> u64 {
    let mut ts = libc::timespec { tv_sec: 0, tv_nsec: 0 };
    // SAFETY: clock_gettime writes into the timespec we pass; the clock id is valid on Linux.
    unsafe { libc::clock_gettime(libc::CLOCK_THREAD_CPUTIME_ID, &mut ts) };
    ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64
}

fn thread_usage() -> [u64; 3] {
    // SAFETY: getrusage writes into the zeroed struct we pass; RUSAGE_THREAD is valid on Linux.
    let mut ru: libc::rusage = unsafe { std::mem::zeroed() };
    // SAFETY: as above.
    unsafe { libc::getrusage(libc::RUSAGE_THREAD, &mut ru) };
    [ru.ru_minflt, ru.ru_majflt, ru.ru_nvcsw + ru.ru_nivcsw].map(|n| n as u64)
}

/// The buffer under test; unmapped and closed on drop, whatever phase failed.
struct Buffer {
    fd: Option<libc::c_int>,
    addr: Option<(*mut libc::c_void, usize)>,
}

impl Drop for Buffer {
    fn drop(&mut self) {
        if let Some((addr, len)) = self.addr.take() {
            // SAFETY: addr/len are exactly what mmap returned; nothing else refers to them.
            unsafe { libc::munmap(addr, len) };
        }
        if let Some(fd) = self.fd.take() {
            // SAFETY: fd is ours, returned by memfd_create.
            unsafe { libc::close(fd) };
        }
    }
}

fn huge_flag(backing: Backing) -> libc::c_int {
    match backing.hugetlb_kb() {
        // MAP_HUGE_* and MFD_HUGE_* share the encoding: log2(page size) << 26.
        Some(kb) => ((kb * 1024).trailing_zeros() as libc::c_int) << libc::MAP_HUGE_SHIFT,
        None => 0,
    }
}

/// madvise on our own mapping.
fn madvise(addr: *mut libc::c_void, len: usize, advice: libc::c_int, call: &'static str) -> Result<(), WorkloadError> {
    // SAFETY: addr/len are a mapping this iteration created; madvise only changes its policy.
    if unsafe { libc::madvise(addr, len, advice) } != 0 {
        return Err(last_error(call));
    }
    Ok(())
}

/// One iteration in progress: the phases measured so far and the buffer they work on.
struct Iteration<'a> {
    w: &'a Workload,
    len: usize,
    buf: Buffer,
    runs: Vec<PhaseRun>,
    observer: &'a mut dyn PhaseObserver,
    cancel: &'a AtomicBool,
}

impl Iteration<'_> {
    /// Runs `f` as `phase`: checks for a stop first, tells the observer, takes the time and the
    /// thread's fault and context-switch counts around it.
    fn timed(
        &mut self,
        phase: Phase,
        f: impl FnOnce(&mut Buffer) -> Result<(), WorkloadError>,
    ) -> Result<(), WorkloadError> {
        if self.cancel.load(Ordering::Relaxed) {
            return Err(WorkloadError::Interrupted);
        }
        let before = thread_usage();
        self.observer.begin(phase);
        let cpu0 = thread_cpu_ns();
        let t0 = Instant::now();
        let r = f(&mut self.buf);
        let wall_ns = t0.elapsed().as_nanos() as u64;
        let cpu_ns = thread_cpu_ns().saturating_sub(cpu0);
        self.observer.end(phase);
        let after = thread_usage();
        r?;
        let [minor_faults, major_faults, context_switches] = [0, 1, 2].map(|i| after[i] - before[i]);
        self.runs.push(PhaseRun {
            phase,
            wall_ns,
            cpu_ns,
            minor_faults,
            major_faults,
            context_switches,
            physical_runs: None,
        });
        Ok(())
    }

    fn memfd_create(&mut self) -> Result<(), WorkloadError> {
        let (backing, size) = (self.w.case.backing, self.w.size.bytes());
        self.timed(Phase::MemfdCreate, |buf| {
            let name: &CStr = c"dmaprof";
            let flags = libc::MFD_CLOEXEC
                | if backing.hugetlb_kb().is_some() {
                    libc::MFD_HUGETLB | huge_flag(backing) as u32
                } else {
                    0
                };
            // SAFETY: name is a valid C string; flags are valid MFD_* bits.
            let fd = unsafe { libc::memfd_create(name.as_ptr(), flags) };
            if fd < 0 {
                return Err(last_error("memfd_create"));
            }
            buf.fd = Some(fd);
            // SAFETY: fd is a memfd we own.
            if unsafe { libc::ftruncate(fd, size as libc::off_t) } != 0 {
                return Err(last_error("ftruncate"));
            }
            Ok(())
        })
    }

    fn mmap(&mut self) -> Result<(), WorkloadError> {
        let (case, len) = (self.w.case, self.len);
        let backing = case.backing;
        let mut flags = if backing.memfd() {
            libc::MAP_SHARED
        } else {
            libc::MAP_PRIVATE | libc::MAP_ANONYMOUS
        };
        if backing.hugetlb_kb().is_some() && !backing.memfd() {
            flags |= libc::MAP_HUGETLB | huge_flag(backing);
        }
        // With a THP advice the populate must come after it: MADV_POPULATE_WRITE inside the
        // same timed phase stands in for MAP_POPULATE.
        let advice = self.w.thp.advice().filter(|_| backing.hugetlb_kb().is_none());
        let populate = case.prefault == Prefault::Populate;
        if populate && advice.is_none() {
            flags |= libc::MAP_POPULATE;
        }
        self.timed(Phase::Mmap, |buf| {
            let fd = buf.fd.unwrap_or(-1);
            let prot = libc::PROT_READ | libc::PROT_WRITE;
            // SAFETY: a fresh mapping at a kernel-chosen address; the result is checked.
            let addr = unsafe { libc::mmap(std::ptr::null_mut(), len, prot, flags, fd, 0) };
            if addr == libc::MAP_FAILED {
                return Err(mmap_error(backing));
            }
            buf.addr = Some((addr, len));
            if let Some(advice) = advice {
                madvise(addr, len, advice, "madvise (--thp)")?;
                if populate {
                    madvise(addr, len, libc::MADV_POPULATE_WRITE, "madvise(MADV_POPULATE_WRITE)")?;
                }
            }
            Ok(())
        })
    }

    fn touch(&mut self) -> Result<(), WorkloadError> {
        let step = self.w.case.backing.page_size() as usize;
        let cancel = self.cancel;
        self.timed(Phase::Touch, |buf| {
            let (addr, len) = buf.addr.expect("mapped before touch");
            let base = addr.cast::<u8>();
            for (i, off) in (0..len).step_by(step).enumerate() {
                // Check for Ctrl-C every 64 MiB or so, not per page.
                if i % 16384 == 0 && cancel.load(Ordering::Relaxed) {
                    return Err(WorkloadError::Interrupted);
                }
                // SAFETY: off < len, inside our read-write mapping; volatile so the write (and
                // the fault it causes) is not optimised away.
                unsafe { std::ptr::write_volatile(base.add(off), 1) };
            }
            Ok(())
        })
    }

    fn map_unmap(&mut self, ctx: &mut DmaContext) -> Result<(), WorkloadError> {
        self.timed(Phase::Map, |buf| {
            let (addr, _) = buf.addr.expect("mapped before the DMA map");
            ctx.map(addr as u64, self.w.size, buf.fd).map_err(WorkloadError::Dma)
        })?;
        still_there(ctx)?;
        self.timed(Phase::Unmap, |_| ctx.unmap().map(drop).map_err(WorkloadError::Dma))?;
        still_there(ctx)
    }

    fn munmap(&mut self) -> Result<(), WorkloadError> {
        // Outside every timed phase: the layout the map and unmap worked on (the pages stay
        // mapped in the process after the DMA unmap; a memfd that iommufd pinned by file was
        // never mapped in the process, its page cache holds them).
        let layout = self.buf.addr.and_then(|(a, l)| {
            crate::layout::physical_runs(a as usize, l)
                .or_else(|| self.buf.fd.and_then(|fd| crate::layout::file_runs(fd, l)))
        });
        self.timed(Phase::Munmap, |buf| {
            if let Some((addr, len)) = buf.addr.take() {
                // SAFETY: exactly the mapping mmap returned.
                if unsafe { libc::munmap(addr, len) } != 0 {
                    return Err(last_error("munmap"));
                }
            }
            Ok(())
        })?;
        for r in &mut self.runs {
            r.physical_runs = layout;
        }
        Ok(())
    }

    fn close(&mut self) -> Result<(), WorkloadError> {
        self.timed(Phase::Close, |buf| {
            if let Some(fd) = buf.fd.take() {
                // SAFETY: our memfd.
                if unsafe { libc::close(fd) } != 0 {
                    return Err(last_error("close"));
                }
            }
            Ok(())
        })
    }
}

/// Why mmap failed: for a hugetlb backing, ENOMEM means the pool had no free page left.
fn mmap_error(backing: crate::matrix::Backing) -> WorkloadError {
    let e = last_error("mmap");
    let enomem = matches!(&e, WorkloadError::Syscall { source, .. } if source.raw_os_error() == Some(libc::ENOMEM));
    let pool = backing
        .hugetlb_kb()
        .and_then(|kb| crate::hugepages::pools().into_iter().find(|p| p.size_kb == kb));
    match pool {
        Some(p) if enomem => WorkloadError::HugepagesTaken {
            size_kb: p.size_kb,
            free: p.free,
            total: p.total,
        },
        _ => e,
    }
}

/// Fails once the kernel wants the device back: the unbind waits for the case to let go.
fn still_there(ctx: &DmaContext) -> Result<(), WorkloadError> {
    match ctx.removal_requested() {
        true => Err(WorkloadError::DeviceRemoved {
            bdf: ctx.bdf().to_owned(),
        }),
        false => Ok(()),
    }
}

/// Runs one iteration of `w`: every phase its case has, in order. `dma` runs the map/unmap
/// phases (None for cases without a DMA mode).
pub fn run_iteration(
    w: &Workload,
    dma: Option<&mut DmaContext>,
    observer: &mut dyn PhaseObserver,
    cancel: &AtomicBool,
) -> Result<Vec<PhaseRun>, WorkloadError> {
    let len = usize::try_from(w.size.bytes()).map_err(|_| WorkloadError::Syscall {
        call: "mmap",
        source: std::io::Error::from_raw_os_error(libc::EOVERFLOW),
    })?;
    let mut it = Iteration {
        w,
        len,
        buf: Buffer { fd: None, addr: None },
        runs: Vec::new(),
        observer,
        cancel,
    };
    let memfd = w.case.backing.memfd();
    if memfd {
        it.memfd_create()?;
    }
    it.mmap()?;
    if w.case.prefault == Prefault::Touch {
        it.touch()?;
    }
    if let Some(ctx) = dma {
        it.map_unmap(ctx)?;
    }
    it.munmap()?;
    if memfd {
        it.close()?;
    }
    Ok(it.runs)
}
