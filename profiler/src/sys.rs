//! Small operating-system helpers used across dmaprof: one place for each (files opened
//! read-write, sysfs links, /proc fields, exclusive locks, timestamps). xtask compiles this
//! file too (std, libc and thiserror only).
use std::{
    fs,
    os::fd::AsRawFd as _,
    path::{Path, PathBuf},
};

/// Opens `path` for reading and writing (device nodes, sysfs files).
pub fn open_rw(path: impl AsRef<Path>) -> std::io::Result<fs::File> {
    fs::OpenOptions::new().read(true).write(true).open(path)
}

/// The last component of the symlink at `p` (a sysfs driver or IOMMU group link).
pub fn link_name(p: &Path) -> Option<String> {
    fs::read_link(p)
        .ok()
        .and_then(|l| l.file_name().map(|n| n.to_string_lossy().into_owned()))
}

/// Field `name` of a `/proc` status-like text (`Name:   value`), trimmed.
pub fn status_field(text: &str, name: &str) -> Option<String> {
    text.lines()
        .find_map(|l| l.strip_prefix(name)?.strip_prefix(':').map(|v| v.trim().to_owned()))
}

/// Field `name` of /proc/self/status, trimmed (e.g. `CapEff`, `VmHWM` with its "kB").
pub fn self_status(name: &str) -> Option<String> {
    status_field(&fs::read_to_string("/proc/self/status").ok()?, name)
}

/// A `... kB` field of a /proc file, in bytes.
fn kb_field(text: &str, name: &str) -> Option<u64> {
    let v = status_field(text, name)?;
    v.trim_end_matches("kB").trim().parse::<u64>().ok().map(|kb| kb * 1024)
}

/// MemAvailable of /proc/meminfo, in bytes.
pub fn mem_available() -> Option<u64> {
    kb_field(&fs::read_to_string("/proc/meminfo").ok()?, "MemAvailable")
}

/// Peak resident set (VmHWM) of this process, in KiB.
pub fn peak_rss_kib() -> u64 {
    self_status("VmHWM")
        .and_then(|v| v.trim_end_matches("kB").trim().parse().ok())
        .unwrap_or(0)
}

/// An exclusive `flock` held for as long as this lives.
#[derive(Debug)]
pub struct FileLock {
    _file: fs::File,
    /// The lock file.
    pub path: PathBuf,
}

/// Why a lock was not taken.
#[derive(Debug, thiserror::Error)]
pub enum LockError {
    /// Another process holds it.
    #[error("lock {0} is held by another process")]
    Held(PathBuf),
    /// The lock file could not be opened.
    #[error("cannot open lock file {path}: {source}")]
    Open {
        /// The file.
        path: PathBuf,
        /// Why.
        source: std::io::Error,
    },
}

/// Takes an exclusive lock on `path` (created if missing); fails at once if it is held.
pub fn try_lock(path: &Path) -> Result<FileLock, LockError> {
    lock(path, false)
}

/// Takes an exclusive lock on `path` (created if missing); with `wait`, waits while another
/// process holds it, else fails at once.
pub fn lock(path: &Path, wait: bool) -> Result<FileLock, LockError> {
    let file = fs::OpenOptions::new()
        .create(true)
        .truncate(false)
        .write(true)
        .open(path)
        .map_err(|source| LockError::Open {
            path: path.to_owned(),
            source,
        })?;
    let how = if wait {
        libc::LOCK_EX
    } else {
        libc::LOCK_EX | libc::LOCK_NB
    };
    // SAFETY: flock on an fd we own; with LOCK_NB it fails instead of waiting.
    if unsafe { libc::flock(file.as_raw_fd(), how) } != 0 {
        return Err(LockError::Held(path.to_owned()));
    }
    Ok(FileLock {
        _file: file,
        path: path.to_owned(),
    })
}

/// The calling thread's id.
pub fn gettid() -> u32 {
    // SAFETY: gettid has no preconditions and cannot fail.
    unsafe { libc::gettid() as u32 }
}

/// CLOCK_MONOTONIC in ns: the clock `bpf_ktime_get_ns` reads.
pub fn monotonic_ns() -> u64 {
    let mut ts = libc::timespec { tv_sec: 0, tv_nsec: 0 };
    // SAFETY: clock_gettime writes one timespec through a valid pointer; CLOCK_MONOTONIC
    // always exists.
    unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut ts) };
    ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64
}

/// Whether process `pid` exists and has not exited (a zombie has).
pub fn process_alive(pid: u32) -> bool {
    let Ok(stat) = fs::read_to_string(format!("/proc/{pid}/stat")) else {
        return false;
    };
    // The state follows the command name, which may itself hold spaces and parentheses.
    let state = stat
        .rsplit_once(')')
        .and_then(|(_, rest)| rest.split_whitespace().next());
    !matches!(state, None | Some("Z" | "X"))
}

/// Now (UTC) as `YYYYMMDD-HHMMSS`, for output directory names.
pub fn timestamp() -> String {
    let secs = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs());
    civil(secs)
}

/// Seconds since the epoch as `YYYYMMDD-HHMMSS` (UTC), by Hinnant's civil-from-days.
fn civil(secs: u64) -> String {
    let (days, rem) = (secs / 86400, secs % 86400);
    let z = days as i64 + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = doy - (153 * mp + 2) / 5 + 1;
    let m = if mp < 10 { mp + 3 } else { mp - 9 };
    let y = yoe + era * 400 + i64::from(m <= 2);
    format!(
        "{y:04}{m:02}{d:02}-{:02}{:02}{:02}",
        rem / 3600,
        rem % 3600 / 60,
        rem % 60
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn civil_dates() {
        assert_eq!(civil(0), "19700101-000000");
        assert_eq!(civil(951_782_400), "20000229-000000");
        assert_eq!(civil(1_798_761_599), "20261231-235959");
    }

    #[test]
    fn this_process_is_alive_and_a_free_pid_is_not() {
        assert!(process_alive(std::process::id()));
        assert!(!process_alive(u32::MAX));
        assert!(monotonic_ns() > 0);
    }

    #[test]
    fn status_fields() {
        let t = "Name:\tdmaprof\nVmHWM:\t  1234 kB\nCapEff:\t000001ffffffffff\n";
        assert_eq!(status_field(t, "CapEff").as_deref(), Some("000001ffffffffff"));
        assert_eq!(kb_field(t, "VmHWM"), Some(1234 * 1024));
        assert_eq!(status_field(t, "Vm"), None);
    }

    #[test]
    fn a_held_lock_refuses_a_second_taker() {
        let path = std::env::temp_dir().join(format!("dmaprof-lock-test-{}", std::process::id()));
        let first = try_lock(&path).expect("first lock");
        assert!(matches!(try_lock(&path), Err(LockError::Held(_))));
        drop(first);
        assert!(try_lock(&path).is_ok());
        let _ = fs::remove_file(&path);
    }
}
