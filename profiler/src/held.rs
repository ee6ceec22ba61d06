//! Locked and pinned memory, counted before and after each DMA case: once a case's DMA context
//! is closed the kernel must have given back every page it pinned and every locked-memory
//! charge it made, whether the case passed or the kernel failed it half-way.
use std::fs;

use crate::{report::Leak, sys};

/// The counters a DMA map raises and its unmap lowers.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Held {
    /// `VmLck` of this process, KiB: type1 and the compat modes charge `locked_vm`.
    vm_lck_kib: i64,
    /// `VmPin` of this process, KiB: iommufd charges `pinned_vm`.
    vm_pin_kib: i64,
    /// FOLL_PIN pages held system-wide (`nr_foll_pin_acquired - nr_foll_pin_released`).
    foll_pins: Option<i64>,
}

fn status_kib(name: &str) -> i64 {
    sys::self_status(name)
        .and_then(|v| v.trim_end_matches("kB").trim().parse().ok())
        .unwrap_or(0)
}

fn vmstat(text: &str, name: &str) -> Option<i64> {
    text.lines()
        .find_map(|l| l.strip_prefix(name)?.strip_prefix(' ')?.trim().parse().ok())
}

impl Held {
    /// The counters now.
    pub fn now() -> Self {
        // vmstat counters are per-CPU until folded: fold them first (root only; without it a
        // few pages of drift can show).
        let _ = fs::write("/proc/sys/vm/stat_refresh", "1");
        let stat = fs::read_to_string("/proc/vmstat").unwrap_or_default();
        let pins = vmstat(&stat, "nr_foll_pin_acquired").zip(vmstat(&stat, "nr_foll_pin_released"));
        Self {
            vm_lck_kib: status_kib("VmLck"),
            vm_pin_kib: status_kib("VmPin"),
            foll_pins: pins.map(|(a, r)| a - r),
        }
    }

    /// What `after` holds beyond `self`, one [`Leak`] per counter that grew.
    pub fn leaks(&self, after: &Held, case: &str) -> Vec<Leak> {
        let pairs = [
            ("VmLck", Some(self.vm_lck_kib), Some(after.vm_lck_kib)),
            ("VmPin", Some(self.vm_pin_kib), Some(after.vm_pin_kib)),
            ("foll_pins", self.foll_pins, after.foll_pins),
        ];
        pairs
            .into_iter()
            .filter_map(|(counter, b, a)| {
                let (before, after) = (b?, a?);
                (after > before).then(|| Leak {
                    case: case.to_owned(),
                    counter: counter.to_owned(),
                    before,
                    after,
                    system_wide: counter == "foll_pins",
                })
            })
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_growth_is_a_leak() {
        let before = Held {
            vm_lck_kib: 0,
            vm_pin_kib: 0,
            foll_pins: Some(10),
        };
        let after = Held {
            vm_lck_kib: 2048,
            vm_pin_kib: 0,
            foll_pins: Some(4),
        };
        let l = before.leaks(&after, "c");
        assert_eq!(l.len(), 1);
        assert_eq!((l[0].counter.as_str(), l[0].before, l[0].after), ("VmLck", 0, 2048));
        assert!(after.leaks(&before, "c").iter().all(|l| l.counter == "foll_pins"));
    }

    #[test]
    fn vmstat_fields_by_exact_name() {
        let text = "nr_foll_pin_acquired 12\nnr_foll_pin_released 7\n";
        assert_eq!(vmstat(text, "nr_foll_pin_acquired"), Some(12));
        assert_eq!(vmstat(text, "nr_foll_pin"), None);
    }
}
