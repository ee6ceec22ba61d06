//! dmaprof's BPF programs. Every program first checks that the event belongs to the workload
//! thread and to a recorded phase, and aggregates in maps: nothing is sent per event.
#![no_std]
#![no_main]
// aya-ebpf's program macros drop the doc comments of the functions they wrap.
#![allow(missing_docs)]
// The program macros take their context by value; the programs only read it.
#![allow(clippy::needless_pass_by_value)]

use aya_ebpf::{
    EbpfContext,
    bindings::BPF_NOEXIST,
    helpers::generated::bpf_get_func_arg,
    helpers::{bpf_get_current_pid_tgid, bpf_get_func_ip, bpf_ktime_get_ns},
    macros::{fentry, fexit, kprobe, kretprobe, map, perf_event, raw_tracepoint},
    maps::{Array, HashMap, StackTrace},
    programs::{
        FEntryContext, FExitContext, PerfEventContext, ProbeContext, RawTracePointContext, RetProbeContext,
        tracing::StackIdContext as _,
    },
};
use aya_log_ebpf::warn;
use profiler_ebpf::{
    Control, Frame, MAX_CALL_DEPTH, MAX_PHASES, MAX_ROWS, PhaseCounters, RowConfig, RowStats, SAMPLE_MAP_ENTRIES,
    STACK_MAP_ENTRIES, SampleKey, SyscallEntry,
};

/// The workload thread's id; set by user space at load time.
#[unsafe(no_mangle)]
static TARGET_TID: u32 = 0;

/// The number of the bpf() syscall on this architecture; set by user space at load time.
/// Its own phase switches go through bpf(), so those calls are left out of the syscall time.
#[unsafe(no_mangle)]
static IGNORED_SYSCALL: i64 = -1;

#[map]
static CONTROL: Array<Control> = Array::with_max_entries(1, 0);

#[map]
static PHASE_COUNTERS: Array<PhaseCounters> = Array::with_max_entries(MAX_PHASES, 0);

#[map]
static SAMPLES: HashMap<SampleKey, u64> = HashMap::with_max_entries(SAMPLE_MAP_ENTRIES, 0);

#[map]
static STACKS: StackTrace = StackTrace::with_max_entries(STACK_MAP_ENTRIES, 0);

#[map]
static SYSCALL_ENTER: Array<SyscallEntry> = Array::with_max_entries(1, 0);

/// The phase slot being recorded, if the current thread is the workload thread.
#[inline(always)]
fn recording_phase() -> Option<u32> {
    // SAFETY: TARGET_TID is a plain u32 in .rodata; the volatile read keeps the compiler from
    // folding the load-time value to its 0 default.
    let target = unsafe { core::ptr::read_volatile(&TARGET_TID) };
    let tid = bpf_get_current_pid_tgid() as u32;
    if tid != target {
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
    let Some(phase) = recording_phase() else {
        return 0;
    };
    let Some(c) = counters(phase) else {
        return 0;
    };
    c.samples += 1;
    // A sample taken in user mode has no kernel stack: the helper fails and we keep -1. No
    // user stack is taken: walking it costs as much as the kernel one and the workload's user
    // side is one loop; a sample without a kernel stack is user time, which is all we need.
    let kernel_stack = ctx.get_stackid(&STACKS, 0).map_or(-1, |id| id as i32);
    let key = SampleKey { phase, kernel_stack };
    match SAMPLES.get_ptr_mut(key) {
        Some(count) => {
            // SAFETY: valid map value pointer for the duration of the program.
            unsafe { *count += 1 };
        }
        None => {
            if SAMPLES.insert(key, 1, BPF_NOEXIST as u64).is_err() {
                if c.lost_samples == 0 {
                    warn!(&ctx, "sample map full in phase slot {}: samples are being lost", phase);
                }
                c.lost_samples += 1;
            }
        }
    }
    0
}

#[inline(always)]
fn is_target_thread() -> bool {
    // SAFETY: see recording_phase.
    let target = unsafe { core::ptr::read_volatile(&TARGET_TID) };
    bpf_get_current_pid_tgid() as u32 == target
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
    let _ = SYSCALL_ENTER.set(0, SyscallEntry { enter_ns: now, id }, 0);
    0
}

/// raw_syscalls:sys_exit(regs, ret).
#[raw_tracepoint(tracepoint = "sys_exit")]
pub fn sys_exit(_ctx: RawTracePointContext) -> u32 {
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
    if entry.id == unsafe { core::ptr::read_volatile(&IGNORED_SYSCALL) } {
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
    let (Some(depth), Some(c)) = (CALL_DEPTH.get_ptr_mut(0), counters(phase)) else {
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
        return 0;
    }
    if let Some(frame) = CALL_STACK.get_ptr_mut(d) {
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
            }
        };
    }
    0
}

/// Pops the innermost frame and accounts its inclusive and exclusive time.
#[inline(always)]
fn leave<C: EbpfContext>(ctx: &C) -> u32 {
    let Some(phase) = recording_phase() else {
        return 0;
    };
    // SAFETY: reading the clock has no preconditions.
    let now = unsafe { bpf_ktime_get_ns() };
    let (Some(depth), Some(c)) = (CALL_DEPTH.get_ptr_mut(0), counters(phase)) else {
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
        return 0;
    }
    // SAFETY: as above.
    unsafe { *depth = d - 1 };
    if d > MAX_CALL_DEPTH {
        return 0;
    }
    let Some(frame) = CALL_STACK.get(d - 1).copied() else {
        return 0;
    };
    let inclusive = now.saturating_sub(frame.start_ns);
    if let Some(stats) = ROW_STATS.get_ptr_mut(phase * MAX_ROWS + frame.row) {
        // SAFETY: valid map value pointer for the duration of the program.
        let stats = unsafe { &mut *stats };
        stats.calls += 1;
        stats.inclusive_ns += inclusive;
        stats.exclusive_ns += inclusive.saturating_sub(frame.child_ns);
        stats.amount += frame.amount;
        stats.child_calls += frame.child_calls;
        stats.child_kprobe_calls += frame.child_kprobe_calls;
    }
    if d >= 2
        && let Some(parent) = CALL_STACK.get_ptr_mut(d - 2)
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

#[cfg(not(test))]
#[panic_handler]
fn panic(_info: &core::panic::PanicInfo) -> ! {
    loop {}
}

#[unsafe(link_section = "license")]
#[unsafe(no_mangle)]
static LICENSE: [u8; 4] = *b"GPL\0";
