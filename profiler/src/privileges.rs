//! The Linux capabilities dmaprof needs, and which of them this process lacks.
use crate::{facts::Capability, sys};

/// A Linux capability dmaprof needs.
#[derive(Clone, Copy, Debug, PartialEq, Eq, strum::EnumIter, strum::IntoStaticStr, strum::Display)]
pub enum LinuxCap {
    /// Loading BPF programs and maps.
    #[strum(serialize = "CAP_BPF")]
    Bpf,
    /// perf events, kprobes, reading kernel addresses.
    #[strum(serialize = "CAP_PERFMON")]
    Perfmon,
    /// hugepage pools, driver binding, kernels without CAP_BPF.
    #[strum(serialize = "CAP_SYS_ADMIN")]
    SysAdmin,
    /// Pinning memory for DMA beyond RLIMIT_MEMLOCK.
    #[strum(serialize = "CAP_IPC_LOCK")]
    IpcLock,
}

impl LinuxCap {
    /// Its bit in the capability sets.
    pub const fn bit(self) -> u32 {
        match self {
            LinuxCap::Bpf => 39,
            LinuxCap::Perfmon => 38,
            LinuxCap::SysAdmin => 21,
            LinuxCap::IpcLock => 14,
        }
    }
}

/// Every capability dmaprof needs.
pub const NEEDED: [LinuxCap; 4] = [LinuxCap::Bpf, LinuxCap::Perfmon, LinuxCap::SysAdmin, LinuxCap::IpcLock];

/// The needed capabilities missing from the effective set `eff`.
pub fn missing_from(eff: u64) -> Vec<LinuxCap> {
    NEEDED.into_iter().filter(|c| eff & (1 << c.bit()) == 0).collect()
}

/// The needed capabilities this process lacks.
pub fn missing() -> Vec<LinuxCap> {
    let eff = sys::self_status("CapEff")
        .and_then(|v| u64::from_str_radix(&v, 16).ok())
        .unwrap_or(0);
    missing_from(eff)
}

/// Names joined for messages.
pub fn names(caps: &[LinuxCap]) -> String {
    caps.iter().map(ToString::to_string).collect::<Vec<_>>().join(", ")
}

/// The one-line reason an unprivileged `dmaprof run` refuses, or None when it may run.
/// CAP_IPC_LOCK alone does not refuse: without it the maps are held to RLIMIT_MEMLOCK, and a
/// map over the limit fails saying so (see [`memlock_shortfall`]).
pub fn refusal() -> Option<String> {
    let missing = missing();
    missing.iter().any(|c| *c != LinuxCap::IpcLock).then(|| {
        format!(
            "dmaprof run needs {} (missing {}): run it as root",
            names(&NEEDED),
            names(&missing)
        )
    })
}

/// Why a map of `bytes` failed with ENOMEM when this process pins under RLIMIT_MEMLOCK (it
/// lacks CAP_IPC_LOCK and the limit is finite): the limit, its value and the fix. None when
/// the limit does not apply, so the ENOMEM came from the allocator.
pub fn memlock_shortfall(bytes: u64) -> Option<String> {
    if !missing().contains(&LinuxCap::IpcLock) {
        return None;
    }
    let mut limit = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: getrlimit writes into the struct we pass.
    if unsafe { libc::getrlimit(libc::RLIMIT_MEMLOCK, &mut limit) } != 0 || limit.rlim_cur == libc::RLIM_INFINITY {
        return None;
    }
    Some(format!(
        "ENOMEM: RLIMIT_MEMLOCK is {} KiB and this process lacks CAP_IPC_LOCK, while the map pins {} KiB: \
         raise the limit (`ulimit -l unlimited`, or LimitMEMLOCK=infinity for a systemd service) or run with CAP_IPC_LOCK",
        limit.rlim_cur / 1024,
        bytes / 1024
    ))
}

/// The `privileges` capability for doctor.
pub fn capability() -> Capability {
    // SAFETY: geteuid cannot fail.
    let euid = unsafe { libc::geteuid() };
    match missing().as_slice() {
        [] => Capability::yes(format!("euid {euid}; {} effective", names(&NEEDED))),
        m => Capability::no(format!("euid {euid}; missing {}: run as root", names(m))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn missing_bits() {
        assert!(missing_from(u64::MAX).is_empty());
        assert_eq!(missing_from(0), NEEDED.to_vec());
        assert_eq!(missing_from(1 << 39 | 1 << 38 | 1 << 21), vec![LinuxCap::IpcLock]);
        assert_eq!(names(&[LinuxCap::Bpf, LinuxCap::IpcLock]), "CAP_BPF, CAP_IPC_LOCK");
    }
}
