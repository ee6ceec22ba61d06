//! dmaprof's BPF programs. Every program first checks that the event belongs to a watched
//! thread (`run`'s workload thread, or any thread of `record`'s processes) and to a recorded
//! phase, and aggregates in maps; `record` alone sends one record per DMA ioctl.
#![no_std]
#![no_main]
// aya-ebpf's program macros drop the doc comments of the functions they wrap.
#![allow(missing_docs)]
// The program macros take their context by value; the programs only read it.
#![allow(clippy::needless_pass_by_value)]

use aya_ebpf::{
    EbpfContext,
    bindings::{BPF_NOEXIST, bpf_perf_event_data, bpf_perf_event_value, pt_regs},
    helpers::generated::{bpf_get_current_task, bpf_get_func_arg, bpf_get_smp_processor_id, bpf_perf_prog_read_value},
    helpers::{bpf_get_current_pid_tgid, bpf_get_func_ip, bpf_ktime_get_ns},
    helpers::{bpf_probe_read_kernel, bpf_probe_read_user},
    macros::{fentry, fexit, kprobe, kretprobe, map, perf_event, raw_tracepoint},
    maps::{Array, HashMap, PerCpuArray, RingBuf, StackTrace},
    programs::{
        FEntryContext, FExitContext, PerfEventContext, ProbeContext, RawTracePointContext, RetProbeContext,
        tracing::StackIdContext as _,
    },
};
use aya_log_ebpf::warn;
use profiler_ebpf::{
    CALLS_RING_BYTES, Control, DmaCall, Frame, IGNORED_SYSCALLS, LEAF_CODE, LEAF_PAGE_CLEAR, MAX_CALL_DEPTH,
    MAX_CATEGORIES, MAX_PHASES, MAX_RECORD_IOCTLS, MAX_ROWS, MAX_THREAD_CALLS, MAX_WATCHED, NO_CALLER, NO_KERNEL_STACK,
    OffCpu, PAGE_ORDERS, PhaseCounters, RecordIoctl, RecordSyscalls, RowConfig, RowStats, SAMPLE_MAP_ENTRIES,
    SPILLED_STACK, STACK_MAP_ENTRIES, SampleKey, SyscallEntry, ThreadCall, Watch, credit_periods,
};

/// The workload thread's id; set by user space at load time.
#[unsafe(no_mangle)]
static TARGET_TID: u32 = 0;

/// The numbers of the bpf() and clock_gettime() syscalls on this architecture; set by user
/// space at load time. The phase switches go through bpf(), and where the clocksource has no
/// vDSO read (Debian 6.1 under TCG) the phase's own clock reads are syscalls that start before
/// the phase's first timestamp and end after its last: both are left out of the syscall time.
#[unsafe(no_mangle)]
static IGNORED_SYSCALL: [i64; IGNORED_SYSCALLS] = [-1; IGNORED_SYSCALLS];

/// Whether the programs watch one thread or processes; set by user space at load time.
#[unsafe(no_mangle)]
static WATCH: Watch = Watch {
    by_process: 0,
    _reserved: 0,
};

/// The syscalls `record` reacts to; set by user space at load time.
#[unsafe(no_mangle)]
static RECORD_SYSCALLS: RecordSyscalls = RecordSyscalls {
    ioctl: -1,
    clones: [-1; 4],
    memory: [-1; 4],
};

/// The ioctls `record` records; set by user space at load time.
#[unsafe(no_mangle)]
static RECORD_IOCTLS: [RecordIoctl; MAX_RECORD_IOCTLS] = [RecordIoctl {
    cmd: 0,
    iova_offset: 0,
    size_offset: 0,
    _reserved: 0,
}; MAX_RECORD_IOCTLS];

#[map]
static WATCHED: HashMap<u32, u8> = HashMap::with_max_entries(MAX_WATCHED, 0);

#[map]
static THREAD_CALLS: HashMap<u32, ThreadCall> = HashMap::with_max_entries(MAX_THREAD_CALLS, 0);

/// `record`: when each watched thread inside a memory syscall entered it.
#[map]
static MEMORY_ENTER: HashMap<u32, u64> = HashMap::with_max_entries(MAX_THREAD_CALLS, 0);

#[map]
static CALL_SCRATCH: PerCpuArray<ThreadCall> = PerCpuArray::with_max_entries(1, 0);

#[map]
static CALLS: RingBuf = RingBuf::with_byte_size(CALLS_RING_BYTES, 0);

#[map]
static LOST_CALLS: PerCpuArray<u64> = PerCpuArray::with_max_entries(1, 0);

/// Whether the programs watch processes (`record`) rather than one thread.
#[inline(always)]
fn by_process() -> bool {
    // SAFETY: WATCH is a plain struct in .rodata; the volatile read keeps the compiler from
    // folding the load-time value to its default.
    unsafe { core::ptr::read_volatile(&WATCH.by_process) != 0 }
}

#[map]
static CONTROL: Array<Control> = Array::with_max_entries(1, 0);

#[map]
static PHASE_COUNTERS: Array<PhaseCounters> = Array::with_max_entries(MAX_PHASES, 0);

#[map]
static SAMPLES: HashMap<SampleKey, u64> = HashMap::with_max_entries(SAMPLE_MAP_ENTRIES, 0);

/// The sampler's clock (its event's count, ns of CPU time) up to which samples have been
/// credited, by watched thread, or by `CPU_CLOCK_KEY | cpu` where the samplers watch CPUs.
#[map]
static SAMPLE_CLOCKS: HashMap<u32, u64> = HashMap::with_max_entries(MAX_SAMPLE_CLOCKS, 0);

#[map]
static STACKS: StackTrace = StackTrace::with_max_entries(STACK_MAP_ENTRIES, 0);

#[map]
static SPILLED_STACKS: StackTrace = StackTrace::with_max_entries(STACK_MAP_ENTRIES, 0);

#[map]
static SYSCALL_ENTER: Array<SyscallEntry> = Array::with_max_entries(1, 0);

#[map]
static OFF_CPU: Array<OffCpu> = Array::with_max_entries(1, 0);

/// The phase slot being recorded, if the current thread is watched.
#[inline(always)]
fn recording_phase() -> Option<u32> {
    if !is_target_thread() {
        return None;
    }
    let phase = CONTROL.get(0)?.phase;
    if phase == 0 || phase >= MAX_PHASES {
        return None;
    }
    Some(phase)
}

#[inline(always)]
fn counters(phase: u32) -> Option<&'static mut PhaseCounters> {
    // SAFETY: the pointer comes from a successful array lookup and is valid for the program's run;
    // only the workload thread's events write it.
    PHASE_COUNTERS.get_ptr_mut(phase).map(|p| unsafe { &mut *p })
}

#[perf_event]
pub fn sample_stack(ctx: PerfEventContext) -> u32 {
    // Credited before the thread and phase checks: the clock runs between recorded samples too.
    let periods = sample_periods(&ctx);
    if periods == 0 {
        return 0;
    }
    let Some(mut phase) = recording_phase() else {
        return 0;
    };
    // Watching processes: a sample outside a DMA ioctl of its thread goes to the next slot.
    // SAFETY: only the key's presence is read.
    if by_process() && unsafe { THREAD_CALLS.get(bpf_get_current_pid_tgid() as u32) }.is_none() {
        phase += 1;
        if phase >= MAX_PHASES {
            return 0;
        }
    }
    let Some(c) = counters(phase) else {
        return 0;
    };
    // SAFETY: reading the clock has no preconditions.
    let started = unsafe { bpf_ktime_get_ns() };
    c.samples += 1;
    c.late_periods += periods - 1;
    // A sample taken in user mode has no kernel stack: the helper fails and we keep -1. No
    // user stack is taken: walking it costs as much as the kernel one and the workload's user
    // side is one loop; a sample without a kernel stack is user time, which is all we need.
    // The stack map keeps the call chain above the interrupted instruction (the helper skips
    // that first frame) and the key the instruction's address: a hot loop's many addresses
    // would each make a distinct stack. The map keeps one stack per hash bucket and fails a
    // stack whose bucket another holds: that one goes to the spill map's bucket, and where
    // both are taken the kernel-mode sample is lost, never user time. Where the unwinder finds
    // no caller above the instruction the helper fails as it does on a stack of nothing: the
    // instruction alone is kept.
    let user = in_user_mode(&ctx);
    let stack = match ctx.get_stackid(&STACKS, STACK_SKIP_LEAF) {
        Err(EEXIST) => ctx
            .get_stackid(&SPILLED_STACKS, STACK_SKIP_LEAF)
            .map(|id| SPILLED_STACK + id as i32),
        other => other.map(|id| id as i32),
    };
    let kernel_stack = match stack {
        Ok(id) => id,
        Err(_) if user => NO_KERNEL_STACK,
        Err(EFAULT) => {
            c.no_caller += periods;
            NO_CALLER
        }
        Err(_) => {
            c.lost_samples += periods;
            // SAFETY: as below.
            c.sampler_ns += unsafe { bpf_ktime_get_ns() }.saturating_sub(started);
            return 0;
        }
    };
    let (leaf, ip) = match user {
        true => (LEAF_CODE, 0),
        false => (leaf_of(&ctx), saved_ip(&ctx)),
    };
    let key = SampleKey {
        phase,
        kernel_stack,
        leaf,
        _reserved: 0,
        ip,
    };
    match SAMPLES.get_ptr_mut(key) {
        Some(count) => {
            // SAFETY: valid map value pointer for the duration of the program.
            unsafe { *count += periods };
        }
        None => {
            if SAMPLES.insert(key, periods, BPF_NOEXIST as u64).is_err() {
                if c.lost_samples == 0 {
                    warn!(&ctx, "sample map full in phase slot {}: samples are being lost", phase);
                }
                c.lost_samples += periods;
            }
        }
    }
    // SAFETY: as above.
    c.sampler_ns += unsafe { bpf_ktime_get_ns() }.saturating_sub(started);
    0
}

/// How many sampling periods this sample stands for (0: none, its time was credited to the
/// sample before). The timer cannot fire while interrupts are off (gup-fast pins tens of MiB
/// so) and fires once when they come back on, however many periods it missed: that sample
/// stands for all of them, read off the event's own clock ([`credit_periods`]).
#[inline(always)]
fn sample_periods(ctx: &PerfEventContext) -> u64 {
    let mut value = bpf_perf_event_value {
        counter: 0,
        enabled: 0,
        running: 0,
    };
    // SAFETY: the helper writes at most `size_of::<bpf_perf_event_value>()` bytes into `value`.
    let read = unsafe {
        bpf_perf_prog_read_value(
            ctx.as_ptr() as *mut bpf_perf_event_data,
            &mut value,
            core::mem::size_of::<bpf_perf_event_value>() as u32,
        )
    };
    if read != 0 {
        return 1;
    }
    let key = match by_process() {
        // SAFETY: the helper has no preconditions.
        true => CPU_CLOCK_KEY | unsafe { bpf_get_smp_processor_id() },
        false => bpf_get_current_pid_tgid() as u32,
    };
    let period = sampling_period(ctx);
    // SAFETY: the value is copied out at once.
    let credited = unsafe { SAMPLE_CLOCKS.get(key) }.copied();
    let (periods, credited) = credit_periods(value.counter, credited, period);
    let _ = SAMPLE_CLOCKS.insert(key, credited, 0);
    periods
}

/// The timer's period in ns (perf never arms a software clock for less than 10 µs).
#[inline(always)]
fn sampling_period(ctx: &PerfEventContext) -> u64 {
    let data = ctx.as_ptr() as *const bpf_perf_event_data;
    // SAFETY: one constant-offset context load of the event's period.
    let period = unsafe { core::ptr::read_volatile(&(*data).sample_period) };
    period.max(10_000)
}

/// [`SAMPLE_CLOCKS`] key bit of a CPU's clock.
const CPU_CLOCK_KEY: u32 = 1 << 31;

/// Entries in [`SAMPLE_CLOCKS`]: the watched threads, or the CPUs.
const MAX_SAMPLE_CLOCKS: u32 = 4096;

/// `bpf_get_stackid`'s error for a call chain no longer than the frames it skips.
const EFAULT: i32 = -14;

/// `bpf_get_stackid`'s error for a stack whose hash bucket another stack holds.
const EEXIST: i32 = -17;

/// `bpf_get_stackid` flags: skip the first frame (the interrupted instruction).
const STACK_SKIP_LEAF: u64 = 1;

/// The interrupted instruction's address.
#[inline(always)]
fn saved_ip(ctx: &PerfEventContext) -> u64 {
    let data = ctx.as_ptr() as *const bpf_perf_event_data;
    // SAFETY: one constant-offset context load of the saved registers.
    unsafe { core::ptr::read_volatile(&(*data).regs.rip) }
}

/// Whether the sample interrupted user-mode code (the saved code segment's privilege level).
#[inline(always)]
fn in_user_mode(ctx: &PerfEventContext) -> bool {
    let data = ctx.as_ptr() as *const bpf_perf_event_data;
    // SAFETY: one constant-offset context load of the saved registers.
    let cs = unsafe { core::ptr::read_volatile(&(*data).regs.cs) };
    cs & 3 != 0
}

/// [`LEAF_PAGE_CLEAR`] when the interrupted kernel instruction is a `rep stos` (byte, dword
/// or qword) storing zeroes up to a page boundary, else [`LEAF_CODE`]. A string instruction
/// is interrupted at itself with its count partly done, so the sample's ip points at it and
/// rdi + rcx x width is where the store ends: a page clear ends on a page boundary, a struct's
/// memset (`folio_batch` reinitialised in munmap's zap) almost never does.
#[inline(always)]
fn leaf_of(ctx: &PerfEventContext) -> u32 {
    let data = ctx.as_ptr() as *const bpf_perf_event_data;
    // SAFETY: the perf_event context is a bpf_perf_event_data; each read is one constant-offset
    // context load of its saved registers.
    let (ip, ax, cx, di) = unsafe {
        (
            core::ptr::read_volatile(&(*data).regs.rip),
            core::ptr::read_volatile(&(*data).regs.rax),
            core::ptr::read_volatile(&(*data).regs.rcx),
            core::ptr::read_volatile(&(*data).regs.rdi),
        )
    };
    // SAFETY: bpf_probe_read_kernel checks the address and fails cleanly.
    let Ok(op) = (unsafe { bpf_probe_read_kernel(ip as *const [u8; 3]) }) else {
        return LEAF_CODE;
    };
    let (width, zero) = match op {
        [0xf3, 0xaa, _] => (1, ax & 0xff == 0),
        [0xf3, 0xab, _] => (4, ax & 0xffff_ffff == 0),
        [0xf3, rex, 0xab] if rex & 0xf8 == 0x48 => (8, ax == 0),
        _ => return LEAF_CODE,
    };
    let end = di.wrapping_add(cx.wrapping_mul(width));
    if zero && end & (PAGE_BYTES - 1) == 0 {
        LEAF_PAGE_CLEAR
    } else {
        LEAF_CODE
    }
}

/// The base page size, whose boundary a page clear ends on.
const PAGE_BYTES: u64 = 4096;

/// Whether the current thread is watched: the workload thread, or (`record`) any thread of a
/// watched process.
#[inline(always)]
fn is_target_thread() -> bool {
    let id = bpf_get_current_pid_tgid();
    if by_process() {
        // SAFETY: only the key's presence is read.
        return unsafe { WATCHED.get((id >> 32) as u32) }.is_some();
    }
    // SAFETY: TARGET_TID is a plain u32 in .rodata; the volatile read keeps the compiler from
    // folding the load-time value to its 0 default.
    let target = unsafe { core::ptr::read_volatile(&TARGET_TID) };
    id as u32 == target
}

/// raw_syscalls:sys_enter(regs, id). Every syscall of the workload thread is noted, in or out
/// of a phase, so that the exit knows which syscall it ends (the bpf() calls that switch
/// phases straddle a phase boundary and are left out).
#[raw_tracepoint(tracepoint = "sys_enter")]
pub fn sys_enter(ctx: RawTracePointContext) -> u32 {
    if !is_target_thread() {
        return 0;
    }
    // SAFETY: reading the clock has no preconditions.
    let now = unsafe { bpf_ktime_get_ns() };
    let id: i64 = ctx.arg(1);
    if by_process() {
        record_enter(&ctx, id, now);
        return 0;
    }
    let _ = SYSCALL_ENTER.set(0, SyscallEntry { enter_ns: now, id }, 0);
    0
}

/// raw_syscalls:sys_exit(regs, ret).
#[raw_tracepoint(tracepoint = "sys_exit")]
pub fn sys_exit(ctx: RawTracePointContext) -> u32 {
    if by_process() {
        if is_target_thread() {
            record_exit(&ctx);
        }
        return 0;
    }
    let Some(phase) = recording_phase() else {
        return 0;
    };
    // SAFETY: reading the clock has no preconditions.
    let now = unsafe { bpf_ktime_get_ns() };
    let Some(c) = counters(phase) else {
        return 0;
    };
    let Some(entry) = SYSCALL_ENTER.get_ptr_mut(0) else {
        return 0;
    };
    // SAFETY: valid map value pointer for the duration of the program.
    let entry = unsafe { &mut *entry };
    if entry.enter_ns == 0 {
        c.unbalanced += 1;
        return 0;
    }
    let entered = entry.enter_ns;
    entry.enter_ns = 0;
    // SAFETY: see recording_phase.
    if unsafe { core::ptr::read_volatile(&IGNORED_SYSCALL) }.contains(&entry.id) {
        return 0;
    }
    c.syscalls += 1;
    c.syscall_ns += now.saturating_sub(entered);
    if c.first_enter_ns == 0 {
        c.first_enter_ns = entered;
    }
    c.last_exit_ns = now;
    0
}

/// exceptions:page_fault_user(address, regs, error_code): CPU faults from user mode.
#[raw_tracepoint(tracepoint = "page_fault_user")]
pub fn page_fault_user(_ctx: RawTracePointContext) -> u32 {
    if let Some(c) = recording_phase().and_then(counters) {
        c.user_faults += 1;
        event_hit();
    }
    0
}

/// sched:sched_switch(preempt, prev, next, prev_state), on every CPU's every switch: the
/// workload thread's time off the CPU inside a phase (blocked on a lock, waiting for a
/// work item, preempted), which the wall time holds and the sampler, running on the
/// thread's CPU time, never sees. The switch away runs as the thread; the switch back runs
/// as whoever it replaces, and is known by its `next` task.
#[raw_tracepoint(tracepoint = "sched_switch")]
pub fn sched_switch(ctx: RawTracePointContext) -> u32 {
    if by_process() {
        return 0;
    }
    let Some(off) = OFF_CPU.get_ptr_mut(0) else {
        return 0;
    };
    // SAFETY: reading the clock has no preconditions.
    let now = unsafe { bpf_ktime_get_ns() };
    if is_target_thread() {
        let Some(phase) = recording_phase() else {
            return 0;
        };
        let Some(c) = counters(phase) else {
            return 0;
        };
        // A preempted thread is runnable whatever its state says (the event's `R+`).
        let (preempt, prev_state): (u64, u64) = (ctx.arg(0), ctx.arg(3));
        c.switches += 1;
        if preempt & 1 == 0 && prev_state as u32 != 0 {
            c.blocked += 1;
        }
        event_hit();
        // SAFETY: reading the current task's address has no preconditions; it is only
        // compared, never dereferenced.
        let task = unsafe { bpf_get_current_task() };
        // sys_exit has run when a long syscall is preempted on its way back to user space.
        let in_syscall = SYSCALL_ENTER.get(0).is_some_and(|e| e.enter_ns != 0);
        // SAFETY: valid map value pointer for the duration of the program.
        unsafe {
            *off = OffCpu {
                out_ns: now,
                task,
                phase,
                outside_syscall: u32::from(!in_syscall),
            };
        }
        return 0;
    }
    // SAFETY: valid map value pointer for the duration of the program.
    let left = unsafe { *off };
    let next: u64 = ctx.arg(2);
    if left.out_ns == 0 || next != left.task {
        return 0;
    }
    if let Some(c) = counters(left.phase) {
        let away = now.saturating_sub(left.out_ns);
        c.off_cpu_ns += away;
        if left.outside_syscall != 0 {
            c.off_cpu_outside_ns += away;
        }
    }
    // SAFETY: as above.
    unsafe { (*off).out_ns = 0 };
    0
}

/// Notes a tracepoint hit on the innermost probed call, whose exclusive time its program's
/// cost lands in (attribution takes it out again).
#[inline(always)]
fn event_hit() {
    let Some((depth, thread)) = call_stack() else {
        return;
    };
    // SAFETY: valid map value pointer for the duration of the program.
    let d = unsafe { *depth };
    if d == 0 || d > MAX_CALL_DEPTH {
        return;
    }
    if let Some(frame) = frame_at(thread, d - 1) {
        // SAFETY: valid map value pointer for the duration of the program.
        unsafe { (*frame).event_hits += 1 };
    }
}
/// kmem:mm_page_alloc(page, order, gfp_flags, migratetype): every page allocation of the
/// workload thread, counted by order.
#[raw_tracepoint(tracepoint = "mm_page_alloc")]
pub fn page_alloc(ctx: RawTracePointContext) -> u32 {
    if let Some(c) = recording_phase().and_then(counters) {
        let order: u64 = ctx.arg(1);
        let slot = (order as usize).min(PAGE_ORDERS - 1);
        if let Some(n) = c.page_allocs.get_mut(slot) {
            *n += 1;
        }
        event_hit();
    }
    0
}

#[map]
static ROW_BY_IP: HashMap<u64, RowConfig> = HashMap::with_max_entries(MAX_ROWS * 2, 0);

#[map]
static ROW_STATS: Array<RowStats> = Array::with_max_entries(MAX_PHASES * MAX_ROWS, 0);

#[map]
static CALL_STACK: Array<Frame> = Array::with_max_entries(MAX_CALL_DEPTH, 0);

#[map]
static CALL_DEPTH: Array<u32> = Array::with_max_entries(1, 0);

/// Argument `n` (0-5) of a kprobe, or 0. The index comes from a map, and verifiers before
/// 7.x refuse a variable offset into the context: every argument is read at its constant
/// offset and the value is picked afterwards.
#[inline(always)]
fn read_arg(ctx: &ProbeContext, n: i32) -> u64 {
    let r = ctx.regs;
    // SAFETY: regs is the kprobe context; each read is one constant-offset context load, and
    // volatile keeps the compiler from turning the six into one computed-offset load.
    let a: [u64; 6] = unsafe {
        [
            core::ptr::read_volatile(&(*r).rdi),
            core::ptr::read_volatile(&(*r).rsi),
            core::ptr::read_volatile(&(*r).rdx),
            core::ptr::read_volatile(&(*r).rcx),
            core::ptr::read_volatile(&(*r).r8),
            core::ptr::read_volatile(&(*r).r9),
        ]
    };
    match n {
        0 => a[0],
        1 => a[1],
        2 => a[2],
        3 => a[3],
        4 => a[4],
        5 => a[5],
        _ => 0,
    }
}

/// Entry of any probed function: push a frame for its row.
#[kprobe]
pub fn row_entry(ctx: ProbeContext) -> u32 {
    // SAFETY: bpf_get_func_ip is allowed in kprobe programs (5.15+) and reads only ctx.
    let ip = unsafe { bpf_get_func_ip(ctx.as_ptr()) };
    enter(&ctx, ip, true, |n| read_arg(&ctx, n))
}

/// Return of any probed function: pop its frame, account inclusive and exclusive time.
#[kretprobe]
pub fn row_exit(ctx: RetProbeContext) -> u32 {
    leave(&ctx)
}

/// Argument `n` of an fentry program's function, or 0 past its last argument (checked by the
/// helper at run time; a direct context read past the prototype would be refused at load).
#[inline(always)]
fn func_arg(ctx: &FEntryContext, n: i32) -> u64 {
    let mut v = 0u64;
    if n >= 0 {
        // SAFETY: bpf_get_func_arg (5.17+) writes one u64 through a valid stack pointer.
        unsafe { bpf_get_func_arg(ctx.as_ptr(), n as u32, &mut v) };
    }
    v
}

/// fentry/fexit pairs for probe-table rows in vmlinux: BTF binds each program to one function
/// at load time, so there is one pair per slot (user space loads only the slots it uses).
macro_rules! fentry_slots {
    ($($entry:ident $exit:ident)*) => {$(
        #[fentry]
        pub fn $entry(ctx: FEntryContext) -> u32 {
            // SAFETY: bpf_get_func_ip is allowed in tracing programs and reads only ctx.
            let ip = unsafe { bpf_get_func_ip(ctx.as_ptr()) };
            enter(&ctx, ip, false, |n| func_arg(&ctx, n))
        }

        #[fexit]
        pub fn $exit(ctx: FExitContext) -> u32 {
            leave(&ctx)
        }
    )*};
}

fentry_slots! {
    row_fentry_0 row_fexit_0 row_fentry_1 row_fexit_1 row_fentry_2 row_fexit_2
    row_fentry_3 row_fexit_3 row_fentry_4 row_fexit_4 row_fentry_5 row_fexit_5
    row_fentry_6 row_fexit_6 row_fentry_7 row_fexit_7 row_fentry_8 row_fexit_8
    row_fentry_9 row_fexit_9 row_fentry_10 row_fexit_10 row_fentry_11 row_fexit_11
    row_fentry_12 row_fexit_12 row_fentry_13 row_fexit_13 row_fentry_14 row_fexit_14
    row_fentry_15 row_fexit_15 row_fentry_16 row_fexit_16 row_fentry_17 row_fexit_17
    row_fentry_18 row_fexit_18 row_fentry_19 row_fexit_19 row_fentry_20 row_fexit_20
    row_fentry_21 row_fexit_21 row_fentry_22 row_fexit_22 row_fentry_23 row_fexit_23
}

/// Where the current thread's stack of active probed calls lives: the one shared stack
/// (`run` watches one thread), or the thread's recorded ioctl (`record`; None outside one,
/// where rows are not accounted).
#[inline(always)]
fn call_stack() -> Option<(*mut u32, Option<*mut ThreadCall>)> {
    if !by_process() {
        return CALL_DEPTH.get_ptr_mut(0).map(|d| (d, None));
    }
    let thread = THREAD_CALLS.get_ptr_mut(bpf_get_current_pid_tgid() as u32)?;
    // SAFETY: valid map value pointer for the duration of the program.
    Some((unsafe { &raw mut (*thread).depth }, Some(thread)))
}

/// Frame `d` of the stack [`call_stack`] found.
#[inline(always)]
fn frame_at(thread: Option<*mut ThreadCall>, d: u32) -> Option<*mut Frame> {
    match thread {
        None => CALL_STACK.get_ptr_mut(d),
        // SAFETY: valid map value pointer; the index is bounds-checked.
        Some(t) => unsafe { (*t).frames.get_mut(d as usize).map(|f| f as *mut Frame) },
    }
}

/// Counts a probed call a recorded ioctl could not account.
#[inline(always)]
fn unaccounted(thread: Option<*mut ThreadCall>) {
    if let Some(t) = thread {
        // SAFETY: valid map value pointer for the duration of the program.
        unsafe { (*t).call.unaccounted += 1 };
    }
}

/// Pushes a frame for the row of the function at `ip` (caught by a kprobe or by fentry);
/// `arg(n)` reads its argument n.
#[inline(always)]
fn enter<C: EbpfContext>(ctx: &C, ip: u64, kprobe: bool, arg: impl FnOnce(i32) -> u64) -> u32 {
    let Some(phase) = recording_phase() else {
        return 0;
    };
    // SAFETY: the value is copied out before any other map operation.
    let Some(cfg) = (unsafe { ROW_BY_IP.get(ip) }).copied() else {
        return 0;
    };
    if cfg.row >= MAX_ROWS {
        return 0;
    }
    let amount = arg(cfg.amount_arg);
    let (Some((depth, thread)), Some(c)) = (call_stack(), counters(phase)) else {
        return 0;
    };
    // SAFETY: valid map value pointer for the duration of the program.
    let d = unsafe { *depth };
    // SAFETY: as above.
    unsafe { *depth = d + 1 };
    if d >= MAX_CALL_DEPTH {
        if c.stack_overflow == 0 {
            warn!(
                ctx,
                "probed calls nest deeper than {} in phase slot {}: inner calls go unaccounted", MAX_CALL_DEPTH, phase
            );
        }
        c.stack_overflow += 1;
        unaccounted(thread);
        return 0;
    }
    if let Some(frame) = frame_at(thread, d) {
        // SAFETY: reading the clock has no preconditions; the frame pointer is a valid value.
        unsafe {
            *frame = Frame {
                row: cfg.row,
                kprobe: u32::from(kprobe),
                start_ns: bpf_ktime_get_ns(),
                child_ns: 0,
                amount,
                child_calls: 0,
                child_kprobe_calls: 0,
                event_hits: 0,
                category: cfg.category,
                _reserved: 0,
            }
        };
    }
    0
}

/// Pops the innermost frame and accounts its inclusive and exclusive time (and, inside a
/// recorded ioctl, its exclusive time to its category).
#[inline(always)]
fn leave<C: EbpfContext>(ctx: &C) -> u32 {
    let Some(phase) = recording_phase() else {
        return 0;
    };
    // SAFETY: reading the clock has no preconditions.
    let now = unsafe { bpf_ktime_get_ns() };
    let (Some((depth, thread)), Some(c)) = (call_stack(), counters(phase)) else {
        return 0;
    };
    // SAFETY: valid map value pointer for the duration of the program.
    let d = unsafe { *depth };
    if d == 0 {
        if c.unmatched_exit == 0 {
            warn!(
                ctx,
                "a probed return without its entry in phase slot {}: the call stack is unbalanced", phase
            );
        }
        c.unmatched_exit += 1;
        unaccounted(thread);
        return 0;
    }
    // SAFETY: as above.
    unsafe { *depth = d - 1 };
    if d > MAX_CALL_DEPTH {
        return 0;
    }
    let Some(frame) = frame_at(thread, d - 1) else {
        return 0;
    };
    // SAFETY: valid map value pointer; copied before the parent frame is written.
    let frame = unsafe { *frame };
    let inclusive = now.saturating_sub(frame.start_ns);
    let exclusive = inclusive.saturating_sub(frame.child_ns);
    if let Some(stats) = ROW_STATS.get_ptr_mut(phase * MAX_ROWS + frame.row) {
        // SAFETY: valid map value pointer for the duration of the program.
        let stats = unsafe { &mut *stats };
        stats.calls += 1;
        stats.inclusive_ns += inclusive;
        stats.exclusive_ns += exclusive;
        stats.amount += frame.amount;
        stats.child_calls += frame.child_calls;
        stats.child_kprobe_calls += frame.child_kprobe_calls;
        stats.event_hits += frame.event_hits;
    }
    if let Some(t) = thread {
        let i = frame.category as usize & (MAX_CATEGORIES - 1);
        // SAFETY: valid map value pointer; the index is masked into the array.
        unsafe { (*t).call.category_ns[i] += exclusive };
    }
    if d >= 2
        && let Some(parent) = frame_at(thread, d - 2)
    {
        // SAFETY: valid map value pointer for the duration of the program.
        unsafe {
            (*parent).child_ns += inclusive;
            (*parent).child_calls += 1;
            (*parent).child_kprobe_calls += u64::from(frame.kprobe);
        }
    }
    0
}

/// The recorded ioctl kind of request `cmd`, if it is one.
#[inline(always)]
// An index bounded by a constant is the loop form the verifier proves finite at once.
#[allow(clippy::needless_range_loop)]
fn recorded_ioctl(cmd: u32) -> Option<RecordIoctl> {
    for i in 0..MAX_RECORD_IOCTLS {
        // SAFETY: RECORD_IOCTLS is a plain array in .rodata; see by_process.
        let k = unsafe { core::ptr::read_volatile(&RECORD_IOCTLS[i]) };
        if k.cmd != 0 && k.cmd == cmd {
            return Some(k);
        }
    }
    None
}

/// A u64 at `addr` in the calling process's memory, or 0.
#[inline(always)]
fn user_u64(addr: u64) -> u64 {
    // SAFETY: bpf_probe_read_user checks the address and fails cleanly.
    unsafe { bpf_probe_read_user(addr as *const u64) }.unwrap_or(0)
}

/// Syscall argument register `reg` of the tracepoint's pt_regs, or 0.
#[inline(always)]
fn reg(regs: *const pt_regs, read: impl FnOnce(*const pt_regs) -> *const u64) -> u64 {
    // SAFETY: the pointer is the tracepoint's pt_regs; bpf_probe_read_kernel checks the read.
    unsafe { bpf_probe_read_kernel(read(regs)) }.unwrap_or(0)
}

/// `record`: a watched thread enters ioctl(fd, cmd, arg) with a recorded `cmd`: its call
/// starts, with the IOVA and size read from the argument struct.
#[inline(always)]
fn record_enter(ctx: &RawTracePointContext, id: i64, now: u64) {
    // SAFETY: see by_process.
    let syscalls = unsafe { core::ptr::read_volatile(&RECORD_SYSCALLS) };
    if syscalls.memory.contains(&id) {
        let _ = MEMORY_ENTER.insert(bpf_get_current_pid_tgid() as u32, now, 0);
        return;
    }
    if id != syscalls.ioctl {
        return;
    }
    let regs: *const pt_regs = ctx.arg(0);
    // SAFETY: only the field's address is computed.
    let cmd = reg(regs, |r| unsafe { &raw const (*r).rsi }) as u32;
    let Some(kind) = recorded_ioctl(cmd) else {
        return;
    };
    // SAFETY: as above.
    let arg = reg(regs, |r| unsafe { &raw const (*r).rdx });
    let Some(scratch) = CALL_SCRATCH.get_ptr_mut(0) else {
        return;
    };
    // SAFETY: valid per-CPU map value pointer; no other program runs on this CPU meanwhile.
    let s = unsafe { &mut *scratch };
    let id = bpf_get_current_pid_tgid();
    s.call.tid = id as u32;
    s.call.tgid = (id >> 32) as u32;
    s.call.cmd = cmd;
    s.call.unaccounted = 0;
    s.call.start_ns = now;
    s.call.duration_ns = 0;
    s.call.ret = 0;
    s.call.iova = user_u64(arg.wrapping_add(u64::from(kind.iova_offset)));
    s.call.size = user_u64(arg.wrapping_add(u64::from(kind.size_offset)));
    s.call.category_ns = [0; MAX_CATEGORIES];
    s.depth = 0;
    // By reference to the scratch value: a copy would take the 512-byte BPF stack.
    #[allow(clippy::needless_borrows_for_generic_args)]
    let _ = THREAD_CALLS.insert(id as u32, &*s, 0);
}

/// `record`: a watched thread leaves a syscall. A clone's child is watched from now on; a
/// recorded ioctl's record goes to user space.
#[inline(always)]
fn record_exit(ctx: &RawTracePointContext) {
    let ret: i64 = ctx.arg(1);
    if ret > 0 {
        let regs: *const pt_regs = ctx.arg(0);
        // SAFETY: only the field's address is computed.
        let nr = reg(regs, |r| unsafe { &raw const (*r).orig_rax }) as i64;
        // SAFETY: see by_process.
        let clones = unsafe { core::ptr::read_volatile(&RECORD_SYSCALLS.clones) };
        if clones.contains(&nr) {
            let _ = WATCHED.insert(ret as u32, 1, 0);
        }
    }
    let tid = bpf_get_current_pid_tgid() as u32;
    // SAFETY: a plain u64 map value, read once.
    if let Some(&entered) = unsafe { MEMORY_ENTER.get(tid) } {
        let _ = MEMORY_ENTER.remove(tid);
        if let Some(c) = recording_phase().and_then(counters) {
            // SAFETY: reading the clock has no preconditions.
            c.syscall_ns += unsafe { bpf_ktime_get_ns() }.saturating_sub(entered);
            c.syscalls += 1;
        }
        return;
    }
    let Some(state) = THREAD_CALLS.get_ptr_mut(tid) else {
        return;
    };
    // SAFETY: reading the clock has no preconditions; the state pointer is a valid map value.
    let call = unsafe {
        let now = bpf_ktime_get_ns();
        (*state).call.duration_ns = now.saturating_sub((*state).call.start_ns);
        (*state).call.ret = ret;
        &(*state).call
    };
    if CALLS.output::<DmaCall>(call, 0).is_err()
        && let Some(lost) = LOST_CALLS.get_ptr_mut(0)
    {
        // SAFETY: valid per-CPU map value pointer.
        unsafe { *lost += 1 };
    }
    let _ = THREAD_CALLS.remove(tid);
}

#[cfg(not(test))]
#[panic_handler]
fn panic(_info: &core::panic::PanicInfo) -> ! {
    loop {}
}

#[unsafe(link_section = "license")]
#[unsafe(no_mangle)]
static LICENSE: [u8; 4] = *b"GPL\0";
