//! Where a buffer's pages sit in physical memory: how many physically contiguous runs they
//! make, read from `/proc/self/pagemap`.
//!
//! A 4 KiB buffer's map and unmap cost follow that number (VFIO type1 pins, maps and unpins
//! one contiguous run at a time), and it changes from iteration to iteration: pages freed by
//! one munmap come back to the next fault in another order. Two iterations of one case can
//! differ 2x in map time and 6x in unmap time for this reason alone, so a traced iteration is
//! compared only with untraced ones whose pages lay alike.
use std::{fs::File, os::unix::fs::FileExt};

/// pagemap entry: page present in RAM.
const PRESENT: u64 = 1 << 63;
/// pagemap entry: the page frame number (bits 0-54; zero without CAP_SYS_ADMIN).
const PFN_MASK: u64 = (1 << 55) - 1;
/// The unit pagemap counts in.
const BASE_PAGE: usize = 4096;

/// How many times apart (numerator, denominator) two buffers' physical runs must be for their
/// iterations to do different work (see [`far_apart`]). A map's time is its pinning, the same
/// for any layout, and its IOMMU work, one mapping per run: between layouts k times apart a
/// share can move by up to (sqrt(k) - 1) / (sqrt(k) + 1), 17 points at 2x and 6.5 at 1.3x.
/// With 2x, a compat type1v2 4 KiB memfd map's exact and sampled iterations, in 19799 and
/// 34944 runs (1.76x), were held against each other and read 19.5 points apart.
const FAR_APART_RATIO: (u64, u64) = (13, 10);
/// The least difference in runs, as a share (one in this many) of the buffer's 4 KiB pages,
/// for [`far_apart`]: a 2 MiB hugetlb buffer alternating between 31 and 127 runs maps the
/// same pages in a hundred calls more, which its map does not feel.
const FAR_APART_PAGES: u64 = 64;

/// Whether two iterations' buffers of `pages` 4 KiB pages, in `a` and `b` physically
/// contiguous runs, came in layouts far enough apart that their maps did different work: a
/// map pins, maps and flushes one run per call. 256 MiB memfd maps in the guest came in
/// 200-3500 runs, now and then 24000-32000, and the shares of one case's exact and sampled
/// maps differed by up to 20 points on 659 against 1867 runs, 14 on 1264 against 2785, 46 on
/// 602 against 24439 (94% pinning in 72 ms against 49% pinning and 40% IOMMU work in 332 ms).
pub fn far_apart(a: u64, b: u64, pages: u64) -> bool {
    let (lo, hi) = (a.min(b), a.max(b));
    hi * FAR_APART_RATIO.1 >= FAR_APART_RATIO.0 * lo.max(1) && hi - lo >= pages / FAR_APART_PAGES
}

/// How many physically contiguous runs the pages of `[addr, addr + len)` make, in the
/// order of their virtual addresses; None when a page is not present or the kernel hides
/// frame numbers (no CAP_SYS_ADMIN).
pub fn physical_runs(addr: usize, len: usize) -> Option<u64> {
    let pages = len.div_ceil(BASE_PAGE);
    let file = File::open("/proc/self/pagemap").ok()?;
    let mut raw = vec![0u8; pages * 8];
    file.read_exact_at(&mut raw, (addr / BASE_PAGE * 8) as u64).ok()?;
    let entries = raw
        .chunks_exact(8)
        .map(|b| u64::from_ne_bytes(b.try_into().expect("8 bytes")));
    runs(entries)
}

/// The physical runs of a file's first `len` bytes (a memfd's page cache), read through a
/// second, read-only mapping of `fd` populated for the purpose and dropped at once. For a
/// buffer the process never faulted in: iommufd's IOMMU_IOAS_MAP_FILE pins a memfd's pages
/// in its page cache without mapping them, so the buffer's own mapping has nothing present.
/// The second mapping's page-table entries go with it, so the buffer's munmap has no more to
/// zap than before. None where [`physical_runs`] gives none, or the mapping fails.
pub fn file_runs(fd: libc::c_int, len: usize) -> Option<u64> {
    let (prot, flags) = (libc::PROT_READ, libc::MAP_SHARED | libc::MAP_POPULATE);
    // SAFETY: a fresh mapping the kernel places; `fd` is the caller's open file.
    let addr = unsafe { libc::mmap(std::ptr::null_mut(), len, prot, flags, fd, 0) };
    if addr == libc::MAP_FAILED {
        return None;
    }
    let runs = physical_runs(addr as usize, len);
    // SAFETY: exactly the mapping mmap returned above, used by nothing else.
    unsafe { libc::munmap(addr, len) };
    runs
}

/// Counts the runs of consecutive frame numbers in pagemap `entries`.
fn runs(entries: impl Iterator<Item = u64>) -> Option<u64> {
    let mut count = 0;
    let mut prev: Option<u64> = None;
    for e in entries {
        let pfn = e & PFN_MASK;
        if e & PRESENT == 0 || pfn == 0 {
            return None;
        }
        if prev != Some(pfn.wrapping_sub(1)) {
            count += 1;
        }
        prev = Some(pfn);
    }
    (count > 0).then_some(count)
}

/// What an untraced iteration takes on a buffer laid out in a given number of physical runs:
/// a line through the untraced iterations' (runs, wall time), fitted by Theil-Sen (the median
/// of the pairwise slopes, then the median intercept), which a single outlier iteration does
/// not tilt. It is flat at the iterations' median where every iteration had the same layout,
/// and where the time fell with the runs: more runs are never less work (a run is a
/// pin batch and an IOMMU mapping more), so a falling fit is drift or noise
/// between iterations, not the layout (a 4 KiB memfd's five untraced maps once read 705-1255
/// ms over 3239-28908 runs in no order, and the line through them gave -15 us per run).
#[derive(Clone, Copy, Debug, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct LayoutModel {
    /// Added ns per physical run.
    pub ns_per_run: f64,
    /// ns at zero runs.
    pub intercept_ns: f64,
    /// The fewest and most runs the fit saw: predictions stay inside (no extrapolation).
    pub runs_seen: (u64, u64),
    /// The shortest and longest wall time the fit saw: predictions stay inside too (a line
    /// through a few scattered points can fall to zero at one end of its runs).
    #[serde(default)]
    pub walls_seen: Option<(u64, u64)>,
}

impl LayoutModel {
    /// Fits `(runs, wall_ns)` points; None with fewer than two.
    pub fn fit(points: &[(u64, u64)]) -> Option<Self> {
        if points.len() < 2 {
            return None;
        }
        let mut slopes: Vec<f64> = Vec::new();
        for (i, a) in points.iter().enumerate() {
            for b in &points[i + 1..] {
                if a.0 != b.0 {
                    slopes.push((b.1 as f64 - a.1 as f64) / (b.0 as f64 - a.0 as f64));
                }
            }
        }
        let slope = median(&mut slopes).unwrap_or(0.0);
        let ns_per_run = slope.max(0.0);
        let mut intercepts: Vec<f64> = points.iter().map(|(r, w)| *w as f64 - ns_per_run * *r as f64).collect();
        let intercept_ns = median(&mut intercepts)?;
        let runs = points.iter().map(|p| p.0);
        let runs_seen = (runs.clone().min()?, runs.max()?);
        let walls = points.iter().map(|p| p.1);
        Some(Self {
            ns_per_run,
            intercept_ns,
            runs_seen,
            walls_seen: Some((walls.clone().min()?, walls.max()?)),
        })
    }

    /// Whether the time follows the layout: a rising line (a flat one predicts the median
    /// everywhere).
    pub fn follows(&self) -> bool {
        self.ns_per_run > 0.0
    }

    /// The predicted untraced wall time at `runs` (held to the runs and wall times the fit
    /// saw).
    pub fn predict(&self, runs: u64) -> u64 {
        let r = runs.clamp(self.runs_seen.0, self.runs_seen.1);
        let (lo, hi) = self.walls_seen.unwrap_or((0, u64::MAX));
        ((self.intercept_ns + self.ns_per_run * r as f64).max(0.0) as u64).clamp(lo, hi)
    }
}

/// The median of `v` (mean of the middle two for an even count), sorting it; None when empty.
pub fn median(v: &mut [f64]) -> Option<f64> {
    if v.is_empty() {
        return None;
    }
    v.sort_by(f64::total_cmp);
    let n = v.len();
    Some(if n % 2 == 1 {
        v[n / 2]
    } else {
        (v[n / 2 - 1] + v[n / 2]) / 2.0
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn layouts_far_apart_differ_by_a_factor_and_by_many_runs() {
        // 256 MiB of 4 KiB memfd pages.
        assert!(far_apart(602, 24_439, 65_536));
        assert!(far_apart(1_867, 659, 65_536));
        assert!(far_apart(19_799, 34_944, 65_536));
        assert!(
            !far_apart(29_802, 36_561, 65_536),
            "1.23x: an untraced pass's own spread"
        );
        assert!(!far_apart(1_581, 2_005, 65_536), "1.27x");
        // 2 MiB hugetlb, alternating: four times apart, a hundred runs.
        assert!(!far_apart(31, 127, 65_536));
        // 16 MiB: a quarter of the pages' difference.
        assert!(far_apart(300, 1_000, 4_096));
        assert!(!far_apart(300, 340, 4_096));
        assert!(far_apart(0, 8_000, 65_536));
    }

    fn present(pfns: &[u64]) -> Vec<u64> {
        pfns.iter().map(|p| p | PRESENT).collect()
    }

    #[test]
    fn consecutive_frames_make_one_run() {
        assert_eq!(runs(present(&[10, 11, 12, 13]).into_iter()), Some(1));
        assert_eq!(
            runs(present(&[13, 12, 11, 10]).into_iter()),
            Some(4),
            "descending is not contiguous"
        );
        assert_eq!(runs(present(&[1, 2, 7, 8, 3]).into_iter()), Some(3));
    }

    #[test]
    fn absent_or_hidden_pages_give_none() {
        assert_eq!(runs([5 | PRESENT, 6].into_iter()), None);
        assert_eq!(runs(present(&[0, 0]).into_iter()), None, "frame numbers hidden");
        assert_eq!(runs(std::iter::empty()), None);
    }

    #[test]
    fn this_process_sees_its_own_pages() {
        // SAFETY: geteuid has no arguments and cannot fail.
        if unsafe { libc::geteuid() } != 0 {
            eprintln!("SKIP: pagemap frame numbers need CAP_SYS_ADMIN (run as root)");
            return;
        }
        let len = 64 * BASE_PAGE;
        let mut buf = vec![1u8; len + BASE_PAGE];
        let start = buf.as_mut_ptr() as usize;
        let aligned = start.next_multiple_of(BASE_PAGE);
        let n = physical_runs(aligned, len).expect("a written heap buffer is present");
        assert!((1..=64).contains(&n), "{n} runs for 64 pages");
    }

    #[test]
    fn a_memfd_never_mapped_is_read_through_its_file() {
        // SAFETY: geteuid has no arguments and cannot fail.
        if unsafe { libc::geteuid() } != 0 {
            eprintln!("SKIP: pagemap frame numbers need CAP_SYS_ADMIN (run as root)");
            return;
        }
        use std::os::fd::AsRawFd;
        let len = 64 * BASE_PAGE;
        // SAFETY: a NUL-terminated name and no flags.
        let fd = unsafe { libc::memfd_create(c"layout-test".as_ptr(), 0) };
        assert!(fd >= 0, "memfd_create: {}", std::io::Error::last_os_error());
        // SAFETY: fd was just created and is owned by this File alone.
        let file = unsafe { <std::fs::File as std::os::fd::FromRawFd>::from_raw_fd(fd) };
        // Written through the file, never mapped: the page cache holds the pages.
        file.write_all_at(&vec![7u8; len], 0).expect("write the memfd");
        let n = file_runs(file.as_raw_fd(), len).expect("the memfd's pages are in its page cache");
        assert!((1..=64).contains(&n), "{n} runs for 64 pages");
        assert_eq!(
            file_runs(file.as_raw_fd(), 128 * BASE_PAGE),
            None,
            "past the file's end"
        );
    }

    #[test]
    fn the_layout_line_predicts_untraced_time_at_a_layout() {
        // Untraced map iterations of a 64 MiB 4 KiB buffer in the guest: (runs, ms).
        let ms = |v: f64| (v * 1e6) as u64;
        let pts = [
            (532, ms(71.0)),
            (16052, ms(119.4)),
            (660, ms(72.7)),
            (16034, ms(143.8)),
            (786, ms(71.0)),
        ];
        let m = LayoutModel::fit(&pts).unwrap();
        let at = |r| m.predict(r) as f64 / 1e6;
        assert!((70.0..74.0).contains(&at(863)), "{}", at(863));
        assert!((110.0..125.0).contains(&at(16000)), "{}", at(16000));
        assert_eq!(m.predict(1_000_000), m.predict(16052), "no extrapolation");
        let flat = LayoutModel::fit(&[(1, 10), (1, 30), (1, 20)]).unwrap();
        assert_eq!(flat.predict(1), 20, "one layout: the median");
        assert_eq!(flat.predict(5), 20);
        assert!(LayoutModel::fit(&[(1, 10)]).is_none());
        // Scattered points whose line falls below zero at one end: held to the walls seen.
        let wild = LayoutModel::fit(&[(100, ms(200.0)), (200, ms(50.0)), (300, ms(10.0)), (110, ms(190.0))]).unwrap();
        assert!(wild.predict(300) >= ms(10.0), "{}", wild.predict(300));
        assert!(wild.predict(100) <= ms(200.0));
        assert!(!wild.follows(), "time falling with the runs is not the layout");
        assert!(m.follows());
    }

    #[test]
    fn a_time_that_does_not_rise_with_the_runs_is_flat() {
        // A 4 KiB memfd's untraced maps in the guest, in iteration order: drifting up while the
        // runs came in no order. The line through them fell 15 us per run.
        let ms = |v: f64| (v * 1e6) as u64;
        let pts = [
            (4080, ms(704.8)),
            (28908, ms(704.9)),
            (28753, ms(877.3)),
            (7094, ms(1254.9)),
            (3239, ms(1215.3)),
        ];
        let m = LayoutModel::fit(&pts).unwrap();
        assert!(!m.follows(), "{m:?}");
        assert_eq!(m.predict(1617), ms(877.3), "the median at any layout");
        assert_eq!(m.predict(28908), ms(877.3));
    }
}
