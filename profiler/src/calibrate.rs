//! What the exact pass's probes cost per call, measured on the running kernel before the
//! cases run: a cheap syscall called many times with nothing attached, then with the row
//! programs on a kernel function it calls, by fentry and by kprobe. Attribution takes that cost out of
//! the rows where the probe hits landed.
use std::time::Instant;

use crate::{
    loader::{AttachError, CALIBRATION_SLOT, Probes},
    probes::{AttachedBy, CallCost, ProbeCost},
    symbols::KernelSymbols,
};

/// The kernel function the probes are calibrated on: getppid() reaches it once per call
/// (task_tgid_vnr), it is global and in the kernel's BTF (the syscall wrappers need not be),
/// and it does little, so a probed call's cost stands out.
const FUNCTION: &str = "__task_pid_nr_ns";

/// Calls per round, and rounds (the fastest round counts: interruptions only add).
const CALLS: u32 = 1000;
const ROUNDS: u32 = 3;

/// Measures each mechanism in `used` (the ones rows attached with). Nothing is left attached.
pub fn measure(probes: &mut Probes, symbols: &KernelSymbols, used: &[AttachedBy]) -> ProbeCost {
    let base = per_call_ns();
    let mut cost = ProbeCost::default();
    for by in [AttachedBy::Fentry, AttachedBy::Kprobe]
        .into_iter()
        .filter(|b| used.contains(b))
    {
        match one(probes, symbols, by, base) {
            Ok(c) if by == AttachedBy::Fentry => cost.fentry = Some(c),
            Ok(c) => cost.kprobe = Some(c),
            Err(why) => cost.errors.push(format!("{by} on {FUNCTION}: {why}")),
        }
    }
    cost
}

/// Why a mechanism's cost could not be measured (report.json's `probe_cost.errors` has it in
/// words).
#[derive(Debug, thiserror::Error)]
enum CalibrationError {
    /// Attaching, switching the phase or reading the row failed.
    #[error(transparent)]
    Probes(#[from] AttachError),
    /// Fewer calls were caught than made: the function is not what getppid() reaches.
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
        let traced = per_call_ns();
        probes.set_phase(0)?;
        let st = probes.take_calibration_stats()?;
        // Every round's calls must have fired (fewer: the function is not what getppid() reaches).
        if st.calls < u64::from(CALLS * ROUNDS) {
            return Err(CalibrationError::Missed {
                seen: st.calls,
                made: CALLS * ROUNDS,
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

/// Wall ns per getppid() call: the fastest of [`ROUNDS`] rounds of [`CALLS`].
fn per_call_ns() -> f64 {
    (0..ROUNDS)
        .map(|_| {
            let t = Instant::now();
            for _ in 0..CALLS {
                // SAFETY: getppid has no preconditions and cannot fail.
                std::hint::black_box(unsafe { libc::getppid() });
            }
            t.elapsed().as_nanos() as f64 / f64::from(CALLS)
        })
        .fold(f64::INFINITY, f64::min)
}
