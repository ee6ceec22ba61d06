//! dmaprof's BPF programs. Every program first checks that the event belongs to the workload
//! thread and to a recorded phase, and aggregates in maps: nothing is sent per event.
#![no_std]
#![no_main]

use aya_ebpf::{
    bindings::{BPF_F_USER_STACK, BPF_NOEXIST},
    helpers::{bpf_get_current_pid_tgid, bpf_ktime_get_ns},
    macros::{fentry, kprobe, map, perf_event, tracepoint},
    maps::{Array, HashMap, StackTrace},
    programs::{
        tracing::StackIdContext as _, FEntryContext, PerfEventContext, ProbeContext, TracePointContext,
    },
    EbpfContext as _,
};
use aya_log_ebpf::debug;
use profiler_ebpf::{
    Control, PhaseCounters, SampleKey, MAX_PHASES, SAMPLE_MAP_ENTRIES, STACK_MAP_ENTRIES,
};

/// The workload thread's id; set by user space at load time.
#[unsafe(no_mangle)]
static TARGET_TID: u32 = 0;

#[map]
static CONTROL: Array<Control> = Array::with_max_entries(1, 0);

#[map]
static PHASE_COUNTERS: Array<PhaseCounters> = Array::with_max_entries(MAX_PHASES, 0);

#[map]
static SAMPLES: HashMap<SampleKey, u64> = HashMap::with_max_entries(SAMPLE_MAP_ENTRIES, 0);

#[map]
static STACKS: StackTrace = StackTrace::with_max_entries(STACK_MAP_ENTRIES, 0);

#[map]
static SYSCALL_ENTER: Array<u64> = Array::with_max_entries(1, 0);

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
    // A sample taken in user mode has no kernel stack: the helper fails and we keep -1.
    let kernel_stack = ctx.get_stackid(&STACKS, 0).map_or(-1, |id| id as i32);
    let user_stack = ctx
        .get_stackid(&STACKS, u64::from(BPF_F_USER_STACK))
        .map_or(-1, |id| id as i32);
    let key = SampleKey { phase, kernel_stack, user_stack, _pad: 0 };
    match SAMPLES.get_ptr_mut(&key) {
        Some(count) => {
            // SAFETY: valid map value pointer for the duration of the program.
            unsafe { *count += 1 };
        }
        None => {
            if SAMPLES.insert(&key, &1, BPF_NOEXIST as u64).is_err() {
                c.lost_samples += 1;
            }
        }
    }
    0
}

#[tracepoint]
pub fn sys_enter(_ctx: TracePointContext) -> u32 {
    if recording_phase().is_none() {
        return 0;
    }
    // SAFETY: reading the clock has no preconditions.
    let now = unsafe { bpf_ktime_get_ns() };
    let _ = SYSCALL_ENTER.set(0, now, 0);
    0
}

#[tracepoint]
pub fn sys_exit(_ctx: TracePointContext) -> u32 {
    let Some(phase) = recording_phase() else {
        return 0;
    };
    // SAFETY: reading the clock has no preconditions.
    let now = unsafe { bpf_ktime_get_ns() };
    let Some(c) = counters(phase) else {
        return 0;
    };
    let Some(enter) = SYSCALL_ENTER.get_ptr_mut(0) else {
        return 0;
    };
    // SAFETY: valid map value pointer for the duration of the program.
    let entered = unsafe { *enter };
    if entered == 0 {
        c.unbalanced += 1;
        return 0;
    }
    // SAFETY: as above.
    unsafe { *enter = 0 };
    c.syscalls += 1;
    c.syscall_ns += now.saturating_sub(entered);
    if c.first_enter_ns == 0 {
        c.first_enter_ns = entered;
    }
    c.last_exit_ns = now;
    0
}

#[tracepoint]
pub fn page_fault_user(_ctx: TracePointContext) -> u32 {
    if let Some(c) = recording_phase().and_then(counters) {
        c.user_faults += 1;
    }
    0
}

#[kprobe]
pub fn probe_kprobe(ctx: ProbeContext) -> u32 {
    debug!(&ctx, "dmaprof doctor: kprobe fired in pid {}", ctx.pid());
    0
}

#[fentry]
pub fn probe_fentry(_ctx: FEntryContext) -> u32 {
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
