//! The BPF/user ABI: every type and constant that crosses the boundary between dmaprof's BPF
//! programs (`main.rs`, built for `bpfel-unknown-none`) and user space (the `profiler` crate).
//!
//! Both sides compile this one file, so a layout change cannot reach only one of them.
#![no_std]

/// Number of phase slots. Slot 0 means "not inside a measured phase": events are dropped.
pub const MAX_PHASES: u32 = 256;

/// Depth of the per-thread stack of active probed calls (exact attribution).
pub const MAX_CALL_DEPTH: u32 = 16;

/// Entries in the stack-trace map (distinct stacks per case, kernel and user).
pub const STACK_MAP_ENTRIES: u32 = 16_384;

/// Entries in the sample-count map (distinct (phase, kernel stack, user stack) triples).
pub const SAMPLE_MAP_ENTRIES: u32 = 32_768;

/// Names of the maps, as user space looks them up.
pub mod maps {
    /// `Array<Control>` with one entry: which phase slot is recording.
    pub const CONTROL: &str = "CONTROL";
    /// `Array<PhaseCounters>` indexed by phase slot.
    pub const PHASE_COUNTERS: &str = "PHASE_COUNTERS";
    /// `HashMap<SampleKey, u64>`: sampled stacks and their counts.
    pub const SAMPLES: &str = "SAMPLES";
    /// `StackTrace`: the stacks the sample keys refer to.
    pub const STACKS: &str = "STACKS";
    /// `Array<u64>` with one entry: when the workload thread entered its current syscall.
    pub const SYSCALL_ENTER: &str = "SYSCALL_ENTER";
}

/// Names of the programs in the BPF object.
pub mod programs {
    /// Perf-event program: one sampled stack of the workload thread.
    pub const SAMPLE_STACK: &str = "sample_stack";
    /// Tracepoint `raw_syscalls:sys_enter`.
    pub const SYS_ENTER: &str = "sys_enter";
    /// Tracepoint `raw_syscalls:sys_exit`.
    pub const SYS_EXIT: &str = "sys_exit";
    /// Tracepoint `exceptions:page_fault_user`.
    pub const PAGE_FAULT_USER: &str = "page_fault_user";
    /// Do-nothing kprobe used by `doctor` to find out whether kprobes attach at all.
    pub const PROBE_KPROBE: &str = "probe_kprobe";
    /// Do-nothing fentry program used by `doctor` to find out whether fentry loads.
    pub const PROBE_FENTRY: &str = "probe_fentry";
}

/// Name of the read-only global that holds the workload thread's id, set at load time.
pub const TARGET_TID_GLOBAL: &str = "TARGET_TID";

/// What user space tells the BPF programs while they run.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Control {
    /// The phase slot being recorded; 0 = none.
    pub phase: u32,
    /// Reserved; keeps the struct 8-byte sized.
    pub _reserved: u32,
}

/// Exact per-phase counters, kept in kernel time by the tracepoint and sampling programs.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct PhaseCounters {
    /// Stack samples taken in this phase.
    pub samples: u64,
    /// Samples that could not be recorded (stack map collision or sample map full).
    pub lost_samples: u64,
    /// `exceptions:page_fault_user` hits (CPU faults only; GUP-driven faults are not counted).
    pub user_faults: u64,
    /// Syscalls the workload thread completed in this phase.
    pub syscalls: u64,
    /// Time spent inside those syscalls (sum of exit - enter), in ns.
    pub syscall_ns: u64,
    /// `bpf_ktime_get_ns` of the first syscall entry in this phase (0 = none).
    pub first_enter_ns: u64,
    /// `bpf_ktime_get_ns` of the last syscall exit in this phase.
    pub last_exit_ns: u64,
    /// Syscall exits seen without a matching entry (lost or unbalanced events).
    pub unbalanced: u64,
}

/// Key of one sampled-stack count.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct SampleKey {
    /// Phase slot the sample belongs to.
    pub phase: u32,
    /// Kernel stack id in the stack map, or negative when the sample had no kernel stack.
    pub kernel_stack: i32,
    /// User stack id in the stack map, or negative when none could be taken.
    pub user_stack: i32,
    /// Padding, always 0 (hash keys compare bytes).
    pub _pad: u32,
}

/// Offsets into the `raw_syscalls:sys_enter` / `sys_exit` tracepoint records (stable since 2.6.x:
/// an 8-byte common header, then `long id`, then `args[6]` or `long ret`).
pub mod raw_syscalls {
    /// Offset of `id` in both records.
    pub const ID_OFFSET: usize = 8;
    /// Offset of `ret` in the exit record.
    pub const RET_OFFSET: usize = 16;
}
