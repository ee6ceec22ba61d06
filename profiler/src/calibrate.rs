//! What the exact pass's probes cost per call, measured on the running kernel before the
//! cases run: a cheap syscall called many times with nothing attached, then with the row
//! programs on a kernel function it calls, by fentry and by kprobe, and then with the exact
//! pass's tracepoints (the syscall's entry and exit hit two). The row programs are measured
//! again inside page faults, those user space takes and those the kernel's own page walk
//! takes. A hit on the fault path is charged what it cost in faults taken the same way; any
//! other hit the geometric mean of the loop's and the user faults' costs (the workload's
//! syscall-side hits land between them). Attribution takes that cost out of the rows where
//! the probe hits landed.
//!
//! Under emulation the machine's pace changes by 2x and more from one second to the next, as
//! much as a probe hit costs, so no time is held against one taken at another moment: each
//! probed call is timed against an unprobed syscall made right beside it, and the tracepoints
//! (which every syscall hits) and the fault path (which every fault reaches) in rounds that
//! attach and detach them by turns.
use std::time::Instant;

use crate::{
    floors,
    loader::{AttachError, CALIBRATION_SLOT, Probes},
    matrix::{Backing, Prefault},
    probes::{AttachedBy, CallCost, ContextCost, Group, ProbeCost},
    size::ByteSize,
    symbols::KernelSymbols,
};

/// The kernel function the probes are calibrated on: getppid() reaches it once per call
/// (task_tgid_vnr), it is global and in the kernel's BTF (the syscall wrappers need not be),
/// and it does little, so a probed call's cost stands out.
const FUNCTION: &str = "__task_pid_nr_ns";

/// Calls timed per measurement (each beside its control call).
const CALLS: u32 = 3000;

/// Rounds of the tracepoints' cost: each times the syscall detached, then attached.
const TRACEPOINT_ROUNDS: u32 = 5;

/// Measures each mechanism in `used` (the ones rows and tracepoints attached with). Nothing
/// is left attached.
pub fn measure(probes: &mut Probes, symbols: &KernelSymbols, used: &[AttachedBy]) -> ProbeCost {
    let base = beside_control_ns();
    let mut cost = ProbeCost::default();
    let rows = [AttachedBy::Fentry, AttachedBy::Kprobe];
    let [mut in_loop, mut in_fault, mut in_kernel_fault] = [ContextCost::default(); 3];
    for by in rows.into_iter().filter(|b| used.contains(b)) {
        let mut noted = |what: &str, why: CalibrationError| cost.errors.push(format!("{by} on {what}: {why}"));
        let looped = one(probes, symbols, by, base).map_err(|why| noted(FUNCTION, why)).ok();
        let mut faulted = |faults: Faults| match looped {
            Some(_) => row_in_fault(probes, symbols, by, faults)
                .map_err(|why| noted(&format!("{FAULT_FUNCTION} over {faults}"), why))
                .ok(),
            None => None,
        };
        let (user, kernel) = (faulted(Faults::User), faulted(Faults::Kernel));
        let charged = looped.map(|c| c.between(user));
        let looped = looped.map(|c| c.ns);
        let measured = [&mut in_loop, &mut in_fault, &mut in_kernel_fault];
        for (context, ns) in measured.into_iter().zip([looped, user, kernel]) {
            context.set(by, ns);
        }
        cost.set(by, charged);
    }
    if used.iter().any(|b| rows.contains(b)) {
        (cost.in_syscall_loop, cost.in_fault, cost.in_kernel_fault) =
            (Some(in_loop), Some(in_fault), Some(in_kernel_fault));
    }
    if used.contains(&AttachedBy::RawTracepoint) {
        match tracepoints(probes) {
            Ok(c) => cost.tracepoint = Some(c),
            Err(why) => cost.errors.push(format!("raw tracepoints on getppid(): {why}")),
        }
    }
    cost
}

/// The kernel function every page fault reaches once, taken by user space or by the
/// kernel's own page walk. A fault's own work (allocating, zeroing and mapping a page) leaves
/// the probe's code and data colder than a syscall loop does: under TCG an fentry hit cost
/// 756-1556 ns in user faults against 700-971 ns in the loop, in twelve runs over four boots.
const FAULT_FUNCTION: &str = "handle_mm_fault";

/// Who takes the faults a round times.
#[derive(Clone, Copy, Debug, strum::Display)]
enum Faults {
    /// User space writes a byte per page (a touch).
    #[strum(to_string = "user page faults")]
    User,
    /// The kernel's page walk (MADV_POPULATE_WRITE), as a populate or a pin faults pages in.
    #[strum(to_string = "page faults the kernel's page walk takes")]
    Kernel,
}

impl Faults {
    /// How the buffer is faulted in.
    fn prefault(self) -> Prefault {
        match self {
            Faults::User => Prefault::Touch,
            Faults::Kernel => Prefault::Populate,
        }
    }
}

/// The buffer a fault round faults in: 4096 fresh 4 KiB pages. Under TCG linking a probe
/// slows the calls right after it (the patched code is translated again); over this many
/// faults that is lost.
const FAULT_BYTES: u64 = 16 << 20;

/// Faulted in untimed right after each link or unlink, before the timed round.
const FAULT_WARM_BYTES: u64 = 256 << 10;

/// Rounds of each measurement on the fault path: each times the buffer unprobed and probed.
const FAULT_ROUNDS: u32 = 9;

/// Faults a round takes (one a 4 KiB page), each reaching [`FAULT_FUNCTION`] once.
const FAULTS: u32 = (FAULT_BYTES / 4096) as u32;

/// The cost of one hit of the row programs attached to [`FAULT_FUNCTION`] by `by`: fault
/// rounds with the probe linked and unlinked by turns (every fault reaches the function, so
/// no unprobed fault can be timed beside a probed one), the median of the rounds' differences
/// over the hits.
fn row_in_fault(
    probes: &mut Probes,
    symbols: &KernelSymbols,
    by: AttachedBy,
    faults: Faults,
) -> Result<f64, CalibrationError> {
    let result = (|| {
        probes.attach_calibration(symbols, FAULT_FUNCTION, by)?;
        let mut per_hit = Vec::new();
        for round in 0..FAULT_ROUNDS {
            let mut timed = |linked: bool| -> Result<(f64, u64), CalibrationError> {
                probes.link_calibration(linked)?;
                fault_ns(FAULT_WARM_BYTES, faults)?;
                probes.set_phase(CALIBRATION_SLOT)?;
                let ns = fault_ns(FAULT_BYTES, faults);
                probes.set_phase(0)?;
                Ok((ns?, probes.take_calibration_stats()?.calls))
            };
            let (plain, probed) = if round % 2 == 0 {
                let plain = timed(false)?;
                (plain, timed(true)?)
            } else {
                let probed = timed(true)?;
                (timed(false)?, probed)
            };
            if probed.1 < u64::from(FAULTS) {
                return Err(CalibrationError::Missed {
                    seen: probed.1,
                    made: FAULTS,
                });
            }
            per_hit.push((probed.0 - plain.0) / probed.1 as f64);
        }
        Some(median(&mut per_hit))
            .filter(|ns| *ns > 0.0)
            .ok_or(CalibrationError::Lost)
    })();
    let _ = probes.set_phase(0);
    let _ = probes.detach_calibration();
    let _ = probes.take_calibration_stats();
    result
}

/// Wall ns of faulting in a fresh 4 KiB-page anonymous buffer of `bytes`, one fault a page.
fn fault_ns(bytes: u64, faults: Faults) -> Result<f64, CalibrationError> {
    let size = ByteSize::new(bytes).expect("a constant size in whole pages");
    Ok(floors::fault_4k_ns_by(size, Backing::Anonymous, faults.prefault())? as f64)
}

/// The cost of one raw tracepoint hit: getppid() with the exact pass's tracepoints attached
/// hits its syscall entry and exit. Every syscall hits them, so there is no unprobed call to
/// time beside it: rounds time it detached and then attached, and the median of the rounds'
/// differences counts.
fn tracepoints(probes: &mut Probes) -> Result<CallCost, AttachError> {
    let result = (|| {
        let mut added = Vec::new();
        for _ in 0..TRACEPOINT_ROUNDS {
            probes.set_groups(&[])?;
            let base = median_call_ns(Call::Probed);
            probes.set_groups(&[Group::Tracepoints])?;
            probes.set_phase(CALIBRATION_SLOT)?;
            added.push(median_call_ns(Call::Probed) - base);
            probes.set_phase(0)?;
        }
        Ok(CallCost {
            ns: (median(&mut added) / 2.0).max(0.0),
            own_share: 0.0,
        })
    })();
    let _ = probes.set_phase(0);
    let _ = probes.set_groups(&[]);
    let _ = probes.take_calibration_stats();
    result
}

/// Why a mechanism's cost could not be measured (report.json's `probe_cost.errors` has it in
/// words).
#[derive(Debug, thiserror::Error)]
enum CalibrationError {
    /// Attaching, switching the phase or reading the row failed.
    #[error(transparent)]
    Probes(#[from] AttachError),
    /// The buffer the fault rounds touch could not be mapped or touched.
    #[error("the fault round's buffer: {0}")]
    Workload(#[from] crate::workload::WorkloadError),
    /// The probed rounds came out no slower than the unprobed ones, in the median: the
    /// machine's pace moved more than the probe cost.
    #[error("no cost stood out of the machine's pace changes over {FAULT_ROUNDS} rounds")]
    Lost,
    /// Fewer calls were caught than made: the function is not what the calls reach.
    #[error("{seen} of {made} calls seen")]
    Missed {
        /// Calls the probe counted.
        seen: u64,
        /// Calls made.
        made: u32,
    },
}

/// The cost of a call caught by `by`, or why it could not be measured.
fn one(probes: &mut Probes, symbols: &KernelSymbols, by: AttachedBy, base: f64) -> Result<CallCost, CalibrationError> {
    let result = (|| {
        probes.attach_calibration(symbols, FUNCTION, by)?;
        probes.set_phase(CALIBRATION_SLOT)?;
        let traced = beside_control_ns();
        probes.set_phase(0)?;
        let st = probes.take_calibration_stats()?;
        // Every call must have fired (fewer: the function is not what getppid() reaches).
        if st.calls < u64::from(CALLS) {
            return Err(CalibrationError::Missed {
                seen: st.calls,
                made: CALLS,
            });
        }
        let ns = (traced - base).max(0.0);
        let own = st.inclusive_ns as f64 / st.calls as f64;
        Ok(CallCost {
            ns,
            own_share: if ns > 0.0 { (own / ns).min(1.0) } else { 0.0 },
        })
    })();
    let _ = probes.set_phase(0);
    let _ = probes.detach_calibration();
    let _ = probes.take_calibration_stats();
    result
}

/// Bytes written between two calls. Inside the workload a probe hit follows the zeroing or
/// walking of pages, so the probe's code and data are no longer in the nearest caches; in a
/// tight loop they would be, and a hit costs less there than in a map. Checked against runs
/// that keep every row (`--demote-above 100`, 64 MiB, the five phases with 13 ms or more of
/// probe cost, one boot): the calibrated cost over the measured one reads 0.66-1.16 without
/// these writes, 0.76-1.35 with 16 KiB, 0.83-1.47 with 64 KiB, 1.7-3.1 with 1 MiB.
const COLD_BYTES: usize = 16 << 10;

/// The syscalls timed: getppid() reaches [`FUNCTION`]; getuid(), its control, reaches no
/// probed function and costs about as much.
#[derive(Clone, Copy)]
enum Call {
    Probed,
    Control,
}

impl Call {
    /// Wall ns of one call, after [`COLD_BYTES`] of writes to `cold` (not timed).
    fn time(self, cold: &mut [u8], fill: u8) -> f64 {
        cold.fill(fill);
        std::hint::black_box(&cold);
        let t = Instant::now();
        match self {
            // SAFETY: getppid has no preconditions and cannot fail.
            Call::Probed => std::hint::black_box(unsafe { libc::getppid() } as u32),
            // SAFETY: getuid has no preconditions and cannot fail.
            Call::Control => std::hint::black_box(unsafe { libc::getuid() }),
        };
        t.elapsed().as_nanos() as f64
    }
}

/// How much longer a getppid() call takes than a getuid() call made right beside it (the
/// median over [`CALLS`] pairs, which comes first taking turns): whatever the machine's pace
/// does to both cancels, and an interrupted call is an outlier the median leaves out.
fn beside_control_ns() -> f64 {
    let mut cold = vec![0u8; COLD_BYTES];
    let mut d: Vec<f64> = (0..CALLS)
        .map(|i| {
            let fill = i as u8;
            if i % 2 == 0 {
                let probed = Call::Probed.time(&mut cold, fill);
                probed - Call::Control.time(&mut cold, fill)
            } else {
                let control = Call::Control.time(&mut cold, fill);
                Call::Probed.time(&mut cold, fill) - control
            }
        })
        .collect();
    median(&mut d)
}

/// The median wall ns of [`CALLS`] calls of `call`, each after [`COLD_BYTES`] of writes.
fn median_call_ns(call: Call) -> f64 {
    let mut cold = vec![0u8; COLD_BYTES];
    let mut t: Vec<f64> = (0..CALLS).map(|i| call.time(&mut cold, i as u8)).collect();
    median(&mut t)
}

/// The median of `v` (0 when empty).
fn median(v: &mut [f64]) -> f64 {
    crate::layout::median(v).unwrap_or(0.0)
}
