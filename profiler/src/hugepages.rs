//! hugetlb page reservation: raise `nr_hugepages` of one size for a case, and put it back.
//!
//! Every raised pool is also registered with [`crate::stop`], so that an emergency exit (a
//! second Ctrl-C) restores the count even while the workload thread is busy.
use std::{fs, path::PathBuf};

use crate::{size::HumanSize, stop};

/// Why a case's hugepages could not be had (the case is skipped with it).
#[derive(Debug, thiserror::Error)]
pub enum HugepageError {
    /// The kernel has no pool of that size.
    #[error("this kernel offers no {size} hugetlb pages ({path} missing)")]
    NoPool {
        /// Page size.
        size: HumanSize,
        /// The missing file.
        path: String,
    },
    /// The pool could not be raised.
    #[error("cannot raise {path} to {want}: {source} (run as root)")]
    Raise {
        /// nr_hugepages.
        path: String,
        /// The value tried.
        want: u64,
        /// Why.
        source: std::io::Error,
    },
    /// Raised, but the kernel found fewer pages.
    #[error("needs {pages} free {size} hugepages, the kernel could provide only {got}{hint}")]
    Short {
        /// Pages needed.
        pages: u64,
        /// Pages free after raising.
        got: u64,
        /// Page size.
        size: HumanSize,
        /// What usually helps.
        hint: &'static str,
    },
}

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
    restore: Option<stop::UndoToken>,
}

fn write_pool(path: &PathBuf, value: u64) -> std::io::Result<()> {
    fs::write(path, value.to_string())
}

impl Reservation {
    /// Makes sure `pages` pages of `size_kb` are free, raising nr_hugepages as needed.
    pub fn reserve(size_kb: u64, pages: u64) -> Result<Self, HugepageError> {
        let dir = pool_dir(size_kb);
        let path = dir.join("nr_hugepages");
        let size = HumanSize(size_kb * 1024);
        let (Some(total), Some(free)) = (read_u64(&path), read_u64(&dir.join("free_hugepages"))) else {
            return Err(HugepageError::NoPool {
                size,
                path: path.display().to_string(),
            });
        };
        if free >= pages {
            return Ok(Self { restore: None });
        }
        let want = total + (pages - free);
        let undo_path = path.clone();
        let this = Self {
            restore: Some(stop::on_exit(
                format!("{} back to {total}", path.display()),
                move || {
                    if let Err(e) = write_pool(&undo_path, total) {
                        eprintln!(
                            "dmaprof: warning: could not restore {} to {total}: {e}",
                            undo_path.display()
                        );
                    }
                },
            )),
        };
        if let Err(source) = write_pool(&path, want) {
            return Err(HugepageError::Raise {
                path: path.display().to_string(),
                want,
                source,
            });
        }
        let got = read_u64(&dir.join("free_hugepages")).unwrap_or(0);
        if got < pages {
            // The pool grew as asked, yet fewer are free: someone mapped them the moment
            // they appeared.
            let grew = read_u64(&path).is_some_and(|n| n >= want);
            let hint = if grew {
                "; the pool grew to hold them: another process took the pages reserved for this case"
            } else if size_kb >= 1 << 20 {
                "; 1 GiB pages usually need hugepagesz=1G hugepages=N on the kernel command line"
            } else {
                "; memory is too fragmented or too small"
            };
            return Err(HugepageError::Short { pages, got, size, hint });
        }
        Ok(this)
    }
}

impl Drop for Reservation {
    fn drop(&mut self) {
        if let Some(t) = self.restore.take() {
            t.run();
        }
    }
}
