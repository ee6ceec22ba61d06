//! The BPF/user ABI: every type and constant that crosses the boundary between dmaprof's BPF
//! programs (`main.rs`, built for `bpfel-unknown-none`) and user space (the `profiler` crate).
//!
//! Both sides compile this one file, so a layout change cannot reach only one of them.
#![no_std]

/// Number of phase slots. Slot 0 means "not inside a measured phase": events are dropped.
pub const MAX_PHASES: u32 = 256;

/// Depth of the per-thread stack of active probed calls (exact attribution).
pub const MAX_CALL_DEPTH: u32 = 16;

/// Rows of the probe table the BPF side can account (user space declares the table).
pub const MAX_ROWS: u32 = 64;

/// fentry/fexit program pairs (`row_fentry_<i>`, `row_fexit_<i>`) for vmlinux rows.
pub const FENTRY_SLOTS: u32 = 24;

/// Entries in the stack-trace map (distinct kernel call chains per case, the leaf
/// instruction's address not part of them).
pub const STACK_MAP_ENTRIES: u32 = 16_384;

/// [`SampleKey::kernel_stack`] ids at and above this are ids in the spill stack map plus it:
/// the kernel's stack map keeps one stack per hash bucket, and a stack whose bucket in the
/// first map another holds goes to the same bucket of the second, which makes the two one
/// map of two-stack buckets.
pub const SPILLED_STACK: i32 = STACK_MAP_ENTRIES as i32;

/// Entries in the sample-count map (distinct (phase, call chain, leaf instruction) keys).
pub const SAMPLE_MAP_ENTRIES: u32 = 131_072;

/// Category slots of a recorded call (user space numbers its categories below this).
pub const MAX_CATEGORIES: usize = 16;

/// Ioctl kinds `record` watches (user space fills [`RECORD_IOCTLS_GLOBAL`]).
pub const MAX_RECORD_IOCTLS: usize = 8;

/// Processes `record` can watch at once (a command, its children and their threads).
pub const MAX_WATCHED: u32 = 4096;

/// Threads that can be inside a recorded ioctl at once (preallocated: older kernels warn about
/// run-time allocated hash maps in tracing programs).
pub const MAX_THREAD_CALLS: u32 = 256;

/// Bytes of the ring buffer that carries recorded calls to user space (about 1300 records;
/// user space empties it every 20 ms).
pub const CALLS_RING_BYTES: u32 = 1 << 18;

/// Names of the maps, as user space looks them up.
pub mod maps {
    /// `Array<Control>` with one entry: which phase slot is recording.
    pub const CONTROL: &str = "CONTROL";
    /// `Array<PhaseCounters>` indexed by phase slot.
    pub const PHASE_COUNTERS: &str = "PHASE_COUNTERS";
    /// `HashMap<SampleKey, u64>`: sampled stacks and the sampling periods they stand for.
    pub const SAMPLES: &str = "SAMPLES";
    /// `StackTrace`: the stacks the sample keys refer to.
    pub const STACKS: &str = "STACKS";
    /// `StackTrace`: the stacks whose bucket in [`STACKS`] another stack held
    /// ([`super::SPILLED_STACK`]).
    pub const SPILLED_STACKS: &str = "SPILLED_STACKS";
    /// `Array<SyscallEntry>` with one entry: the workload thread's syscall in progress.
    pub const SYSCALL_ENTER: &str = "SYSCALL_ENTER";
    /// `Array<OffCpu>` with one entry: when and how the workload thread last left the CPU.
    pub const OFF_CPU: &str = "OFF_CPU";
    /// `HashMap<u64, RowConfig>`: probed function entry address -> probe-table row.
    pub const ROW_BY_IP: &str = "ROW_BY_IP";
    /// `Array<RowStats>` indexed by `phase * MAX_ROWS + row`.
    pub const ROW_STATS: &str = "ROW_STATS";
    /// `Array<Frame>`: the workload thread's stack of active probed calls.
    pub const CALL_STACK: &str = "CALL_STACK";
    /// `Array<u32>` with one entry: the depth of that stack (may exceed MAX_CALL_DEPTH).
    pub const CALL_DEPTH: &str = "CALL_DEPTH";
    /// `HashMap<u32, u8>`: the process ids (tgids) `record` watches.
    pub const WATCHED: &str = "WATCHED";
    /// `HashMap<u32, ThreadCall>`: per thread, the recorded ioctl in progress and its call stack.
    pub const THREAD_CALLS: &str = "THREAD_CALLS";
    /// `PerCpuArray<ThreadCall>` with one entry: where a new [`super::ThreadCall`] is built.
    pub const CALL_SCRATCH: &str = "CALL_SCRATCH";
    /// `RingBuf` of [`super::DmaCall`]: one record per finished ioctl.
    pub const CALLS: &str = "CALLS";
    /// `PerCpuArray<u64>` with one entry: records the ring buffer had no room for.
    pub const LOST_CALLS: &str = "LOST_CALLS";
    /// Every map name, for recognising dmaprof's objects among all loaded ones.
    pub const ALL: &[&str] = &[
        CONTROL,
        PHASE_COUNTERS,
        SAMPLES,
        STACKS,
        SPILLED_STACKS,
        SYSCALL_ENTER,
        OFF_CPU,
        ROW_BY_IP,
        ROW_STATS,
        CALL_STACK,
        CALL_DEPTH,
        WATCHED,
        THREAD_CALLS,
        CALL_SCRATCH,
        CALLS,
        LOST_CALLS,
    ];
}

/// Names of the programs in the BPF object.
pub mod programs {
    /// Perf-event program: one sampled stack of the workload thread.
    pub const SAMPLE_STACK: &str = "sample_stack";
    /// Raw tracepoint `sys_enter` (raw_syscalls).
    pub const SYS_ENTER: &str = "sys_enter";
    /// Raw tracepoint `sys_exit` (raw_syscalls).
    pub const SYS_EXIT: &str = "sys_exit";
    /// Raw tracepoint `page_fault_user` (exceptions).
    pub const PAGE_FAULT_USER: &str = "page_fault_user";
    /// Raw tracepoint `mm_page_alloc` (kmem).
    pub const PAGE_ALLOC: &str = "page_alloc";
    /// Raw tracepoint `sched_switch` (sched).
    pub const SCHED_SWITCH: &str = "sched_switch";
    /// Kprobe on every probed function's entry (the row comes from the entry address).
    pub const ROW_ENTRY: &str = "row_entry";
    /// Kretprobe on every probed function's return.
    pub const ROW_EXIT: &str = "row_exit";
    /// Prefix of the fentry slot programs (`row_fentry_0` ...).
    pub const ROW_FENTRY_PREFIX: &str = "row_fentry_";
    /// Prefix of the fexit slot programs (`row_fexit_0` ...).
    pub const ROW_FEXIT_PREFIX: &str = "row_fexit_";
    /// Every program name, for recognising dmaprof's programs among all loaded ones.
    pub const ALL: &[&str] = &[
        SAMPLE_STACK,
        SYS_ENTER,
        SYS_EXIT,
        PAGE_FAULT_USER,
        PAGE_ALLOC,
        SCHED_SWITCH,
        ROW_ENTRY,
        ROW_EXIT,
    ];
}

/// Name of the read-only global that holds the workload thread's id, set at load time.
pub const TARGET_TID_GLOBAL: &str = "TARGET_TID";

/// Name of the read-only global that holds the numbers of the syscalls left out of a phase's
/// syscall time ([`IGNORED_SYSCALLS`] of them), set at load time.
pub const IGNORED_SYSCALL_GLOBAL: &str = "IGNORED_SYSCALL";

/// How many syscall numbers [`IGNORED_SYSCALL_GLOBAL`] holds: bpf() and clock_gettime().
pub const IGNORED_SYSCALLS: usize = 2;

/// Name of the read-only [`Watch`] global: one thread (`run`) or the processes in
/// [`maps::WATCHED`] (`record`), set at load time.
pub const WATCH_GLOBAL: &str = "WATCH";

/// Name of the read-only [`RecordSyscalls`] global, set at load time.
pub const RECORD_SYSCALLS_GLOBAL: &str = "RECORD_SYSCALLS";

/// Name of the read-only `[RecordIoctl; MAX_RECORD_IOCTLS]` global, set at load time.
pub const RECORD_IOCTLS_GLOBAL: &str = "RECORD_IOCTLS";

/// Which threads the programs watch.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Watch {
    /// 0: the thread `TARGET_TID` only (`run`); 1: every thread of the processes in
    /// [`maps::WATCHED`], rows accounted only inside a recorded ioctl (`record`).
    pub by_process: u32,
    /// Reserved; keeps the struct 8-byte sized.
    pub _reserved: u32,
}

/// The syscall numbers `record` reacts to (they differ per architecture).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct RecordSyscalls {
    /// ioctl(2).
    pub ioctl: i64,
    /// clone, fork, vfork, clone3: a watched process's new child is watched too.
    pub clones: [i64; 4],
    /// mmap, munmap, madvise, mremap: their time is summed into the record slot's
    /// `syscalls` / `syscall_ns` (the processes' memory set-up outside the DMA ioctls).
    pub memory: [i64; 4],
}

/// One ioctl command `record` records, and where its argument struct keeps the IOVA and size.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct RecordIoctl {
    /// The ioctl request number (0: unused slot).
    pub cmd: u32,
    /// Offset of the u64 IOVA in the argument struct.
    pub iova_offset: u32,
    /// Offset of the u64 size in the argument struct.
    pub size_offset: u32,
    /// Reserved; keeps the struct 8-byte aligned in arrays.
    pub _reserved: u32,
}

/// One finished recorded ioctl, as the ring buffer carries it.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct DmaCall {
    /// Thread id.
    pub tid: u32,
    /// Process id.
    pub tgid: u32,
    /// The ioctl request number.
    pub cmd: u32,
    /// Probed calls not accounted in this call (nested deeper than MAX_CALL_DEPTH, or a return
    /// without its entry).
    pub unaccounted: u32,
    /// `bpf_ktime_get_ns` at syscall entry.
    pub start_ns: u64,
    /// Syscall entry to exit.
    pub duration_ns: u64,
    /// The syscall's return value.
    pub ret: i64,
    /// IOVA from the argument struct (0 if unreadable).
    pub iova: u64,
    /// Size from the argument struct (0 if unreadable).
    pub size: u64,
    /// Exclusive time of the probe-table rows inside the call, by category index.
    pub category_ns: [u64; MAX_CATEGORIES],
}

/// A thread's recorded ioctl in progress: the record being filled and the thread's own stack
/// of active probed calls.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ThreadCall {
    /// The record.
    pub call: DmaCall,
    /// Depth of `frames` in use (may exceed MAX_CALL_DEPTH).
    pub depth: u32,
    /// Reserved; keeps `frames` 8-byte aligned.
    pub _reserved: u32,
    /// Active probed calls, outermost first.
    pub frames: [Frame; MAX_CALL_DEPTH as usize],
}

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
    /// Stack samples taken in this phase (each once, however many periods it stands for).
    pub samples: u64,
    /// Sampling periods whose samples could not be recorded (stack map collision or sample
    /// map full).
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
    /// Probed calls not accounted because the call stack was deeper than MAX_CALL_DEPTH.
    pub stack_overflow: u64,
    /// Probed returns with no call on the stack (a missed entry).
    pub unmatched_exit: u64,
    /// `kmem:mm_page_alloc` hits by allocation order (the last slot: that order or higher):
    /// the page and folio sizes the phase allocated (4 KiB pages, 2 MiB THP folios, ...).
    pub page_allocs: [u64; PAGE_ORDERS],
    /// Times the workload thread left the CPU (`sched:sched_switch` away from it).
    pub switches: u64,
    /// Of those, the times it went to sleep (blocked on a lock, an I/O, a wait) rather than
    /// being preempted while runnable.
    pub blocked: u64,
    /// Time it spent off the CPU: from each switch away to the switch back, in ns.
    pub off_cpu_ns: u64,
    /// Of that, the time after switches away outside every syscall (preempted on the way back
    /// to user space, or in user space): time no syscall's `syscall_ns` holds.
    pub off_cpu_outside_ns: u64,
    /// Time the sampler's program took over this phase's samples (its kernel stack walks
    /// mostly), in ns.
    pub sampler_ns: u64,
    /// Sampling periods the timer missed (interrupts were off, or the sampler's own handling
    /// outlasted a period), which the sample it took next stands for (`samples` and the
    /// stacks' counts hold them).
    pub late_periods: u64,
    /// Sampling periods of kernel-mode samples whose unwinder found no caller above the
    /// interrupted instruction: kept with the instruction alone.
    pub no_caller: u64,
}

/// Allocation orders [`PhaseCounters::page_allocs`] tells apart (0 to 10, then 11 and above).
pub const PAGE_ORDERS: usize = 12;

/// How a probed function's entry is accounted.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct RowConfig {
    /// Row in the probe table (< MAX_ROWS).
    pub row: u32,
    /// Argument (0-based) whose value is summed into `RowStats::amount`, or -1.
    pub amount_arg: i32,
    /// Category index of the row's exclusive time in a recorded call (< MAX_CATEGORIES).
    pub category: u32,
    /// Reserved; keeps the struct 8-byte sized.
    pub _reserved: u32,
}

/// Exact per-row accounting for one phase slot.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct RowStats {
    /// Completed calls.
    pub calls: u64,
    /// Time from entry to return, summed.
    pub inclusive_ns: u64,
    /// Inclusive time minus the inclusive time of probed callees.
    pub exclusive_ns: u64,
    /// Sum of the row's amount argument (pages or bytes).
    pub amount: u64,
    /// Probed calls made directly from this row (each one's probe cost lands partly in this
    /// row's exclusive time).
    pub child_calls: u64,
    /// How many of those were kprobe hits (the rest fentry), which cost differently.
    pub child_kprobe_calls: u64,
    /// Tracepoint hits (page allocations, user faults) while this row was the innermost
    /// probed call: their programs' cost is in this row's exclusive time.
    pub event_hits: u64,
}

/// One active probed call.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Frame {
    /// Probe-table row.
    pub row: u32,
    /// 1 when the call was caught by a kprobe, 0 by fentry.
    pub kprobe: u32,
    /// Entry time.
    pub start_ns: u64,
    /// Inclusive time of probed callees so far.
    pub child_ns: u64,
    /// The amount argument at entry.
    pub amount: u64,
    /// Probed calls made directly from this one so far.
    pub child_calls: u64,
    /// How many of those were kprobe hits.
    pub child_kprobe_calls: u64,
    /// Tracepoint hits while this was the innermost probed call.
    pub event_hits: u64,
    /// Category index of the row (from its [`RowConfig`]).
    pub category: u32,
    /// Reserved; keeps the struct 8-byte sized.
    pub _reserved: u32,
}

/// Key of one sampled-stack count.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct SampleKey {
    /// Phase slot the sample belongs to.
    pub phase: u32,
    /// Kernel stack id in the stack map (the call chain above the interrupted instruction;
    /// from [`SPILLED_STACK`] up, in the spill map), [`NO_KERNEL_STACK`] for a sample taken in
    /// user mode, or [`NO_CALLER`].
    pub kernel_stack: i32,
    /// What the interrupted instruction was doing, where the stack cannot tell: [`LEAF_CODE`]
    /// or [`LEAF_PAGE_CLEAR`].
    pub leaf: u32,
    /// Reserved; keeps `ip` 8-byte aligned.
    pub _reserved: u32,
    /// The interrupted kernel instruction's address (the stack's leaf frame), 0 in user mode.
    pub ip: u64,
}

/// Most sampling periods one sample stands for (a second at 1 kHz): more is not a late timer.
pub const MAX_LATE_PERIODS: u64 = 1000;

/// The sampling periods a sample stands for, and the clock credited up to after it, where the
/// sampler's event clock reads `clock` (ns), samples have been credited up to `credited` (None:
/// the first sample) and the timer's period is `period` (not 0). Credit moves in whole periods,
/// rounded, so that a timer firing a little late or early neither adds nor loses time, and a
/// sample just after one credited ahead stands for none (0). Credit more than a period ahead of
/// the clock is an earlier event's (the sampler attached again): the sample starts anew.
#[inline(always)]
pub fn credit_periods(clock: u64, credited: Option<u64>, period: u64) -> (u64, u64) {
    match credited {
        Some(c) if clock + period >= c => {
            let periods = (clock.saturating_sub(c) + period / 2) / period;
            (periods.min(MAX_LATE_PERIODS), c + periods * period)
        }
        _ => (1, clock),
    }
}

/// [`SampleKey::kernel_stack`]: the sample interrupted user mode.
pub const NO_KERNEL_STACK: i32 = -1;

/// [`SampleKey::kernel_stack`]: the kernel's unwinder found no caller above the interrupted
/// instruction, which `ip` alone names.
pub const NO_CALLER: i32 = -2;

/// [`SampleKey::leaf`]: nothing known beyond the stack.
pub const LEAF_CODE: u32 = 0;

/// [`SampleKey::leaf`]: the sample interrupted a `rep stos` storing zeroes up to a page
/// boundary, a page clear. A kernel that inlines its page clear (x86 `clear_pages()` since
/// 6.19) zeroes a page inside the function that asked for it, so its stacks end in that
/// function, not in a `clear_page*` one.
pub const LEAF_PAGE_CLEAR: u32 = 1;

#[cfg(feature = "user")]
mod pod {
    // SAFETY: all of them are #[repr(C)], contain only integers, and have no padding holes
    // (explicit _reserved/_pad fields fill them), so any byte pattern is a valid value.
    unsafe impl aya::Pod for super::Control {}
    // SAFETY: as above.
    unsafe impl aya::Pod for super::PhaseCounters {}
    // SAFETY: as above.
    unsafe impl aya::Pod for super::SampleKey {}
    // SAFETY: as above.
    unsafe impl aya::Pod for super::SyscallEntry {}
    // SAFETY: as above.
    unsafe impl aya::Pod for super::OffCpu {}
    // SAFETY: as above.
    unsafe impl aya::Pod for super::RowConfig {}
    // SAFETY: as above.
    unsafe impl aya::Pod for super::RowStats {}
    // SAFETY: as above.
    unsafe impl aya::Pod for super::Frame {}
    // SAFETY: as above.
    unsafe impl aya::Pod for super::Watch {}
    // SAFETY: as above.
    unsafe impl aya::Pod for super::RecordSyscalls {}
    // SAFETY: as above.
    unsafe impl aya::Pod for super::RecordIoctl {}
    // SAFETY: as above.
    unsafe impl aya::Pod for super::DmaCall {}
}

/// When the workload thread last left the CPU, until it is switched back in.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct OffCpu {
    /// `bpf_ktime_get_ns` at the switch away; 0 = on the CPU.
    pub out_ns: u64,
    /// Its `task_struct` address, which the switch back names as `next`.
    pub task: u64,
    /// The phase slot it left in.
    pub phase: u32,
    /// 1 when it left with no syscall in progress (after its exit, or in user space).
    pub outside_syscall: u32,
}

/// The workload thread's syscall in progress (raw_syscalls:sys_enter -> sys_exit).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct SyscallEntry {
    /// `bpf_ktime_get_ns` at entry; 0 = no syscall in progress.
    pub enter_ns: u64,
    /// Syscall number.
    pub id: i64,
}
