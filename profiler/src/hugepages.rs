//! hugetlb page reservation: raise `nr_hugepages` of one size for a case, and put it back.
//!
//! Every reservation is also recorded in a process-wide list, so that an emergency exit
//! (a second Ctrl-C) can restore the counts even while the workload thread is busy.
use std::{fs, path::PathBuf, sync::Mutex};

/// Pool sizes to restore: (nr_hugepages path, previous value).
static TO_RESTORE: Mutex<Vec<(PathBuf, u64)>> = Mutex::new(Vec::new());

/// One hugetlb pool's counters.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct Pool {
    /// Page size in KiB.
    pub size_kb: u64,
    /// nr_hugepages.
    pub total: u64,
    /// free_hugepages.
    pub free: u64,
}

fn pool_dir(size_kb: u64) -> PathBuf {
    PathBuf::from(format!("/sys/kernel/mm/hugepages/hugepages-{size_kb}kB"))
}

fn read_u64(path: &PathBuf) -> Option<u64> {
    fs::read_to_string(path).ok()?.trim().parse().ok()
}

/// Every hugetlb pool the kernel offers.
pub fn pools() -> Vec<Pool> {
    let mut out = Vec::new();
    let Ok(dir) = fs::read_dir("/sys/kernel/mm/hugepages") else {
        return out;
    };
    for entry in dir.flatten() {
        let name = entry.file_name().to_string_lossy().into_owned();
        let Some(kb) = name.strip_prefix("hugepages-").and_then(|s| s.strip_suffix("kB")) else {
            continue;
        };
        let Ok(size_kb) = kb.parse() else { continue };
        let p = entry.path();
        out.push(Pool {
            size_kb,
            total: read_u64(&p.join("nr_hugepages")).unwrap_or(0),
            free: read_u64(&p.join("free_hugepages")).unwrap_or(0),
        });
    }
    out.sort_by_key(|p| p.size_kb);
    out
}

/// A pool of `size_kb` pages with at least `pages` free, for as long as it lives.
#[derive(Debug)]
pub struct Reservation {
    path: PathBuf,
    previous: u64,
}

impl Reservation {
    /// Makes sure `pages` pages of `size_kb` are free, raising nr_hugepages as needed.
    /// The error is the reason the case cannot run (it is skipped with it).
    pub fn reserve(size_kb: u64, pages: u64) -> Result<Self, String> {
        let dir = pool_dir(size_kb);
        let path = dir.join("nr_hugepages");
        let human = if size_kb >= 1 << 20 {
            format!("{} GiB", size_kb >> 20)
        } else {
            format!("{} MiB", size_kb >> 10)
        };
        let (Some(total), Some(free)) = (read_u64(&path), read_u64(&dir.join("free_hugepages"))) else {
            return Err(format!(
                "this kernel offers no {human} hugetlb pages ({} missing)",
                path.display()
            ));
        };
        let this = Self {
            path: path.clone(),
            previous: total,
        };
        if free >= pages {
            return Ok(this);
        }
        let want = total + (pages - free);
        TO_RESTORE
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .push((path.clone(), total));
        if let Err(e) = fs::write(&path, want.to_string()) {
            drop(this);
            return Err(format!("cannot raise {} to {want}: {e} (run as root)", path.display()));
        }
        let got = read_u64(&dir.join("free_hugepages")).unwrap_or(0);
        if got < pages {
            drop(this);
            let hint = if size_kb >= 1 << 20 {
                "; 1 GiB pages usually need hugepagesz=1G hugepages=N on the kernel command line"
            } else {
                "; memory is too fragmented or too small"
            };
            return Err(format!(
                "needs {pages} free {human} hugepages, the kernel could provide only {got}{hint}"
            ));
        }
        Ok(this)
    }
}

impl Drop for Reservation {
    fn drop(&mut self) {
        let mut list = TO_RESTORE.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(i) = list.iter().rposition(|(p, _)| *p == self.path) {
            list.remove(i);
            if let Err(e) = fs::write(&self.path, self.previous.to_string()) {
                eprintln!(
                    "dmaprof: warning: could not restore {} to {}: {e}",
                    self.path.display(),
                    self.previous
                );
            }
        }
    }
}

/// Restores every pool still raised (emergency exit path).
pub fn restore_all() {
    let mut list = TO_RESTORE.lock().unwrap_or_else(|e| e.into_inner());
    while let Some((path, previous)) = list.pop() {
        let _ = fs::write(&path, previous.to_string());
    }
}
