//! When a change between two sets of timings is a change and not noise: the rule `diff` uses
//! for runs and for recordings.
/// Changes smaller than this are never significant, whatever the spread: timer and scheduling
/// noise on a phase of microseconds is not a kernel change.
pub const MIN_CHANGE_NS: u64 = 20_000;

/// Changes smaller than this share of the slower median are never significant: two processes
/// of one build get their pages, and so a 4 KiB buffer its DMA chunks, differently, and two
/// reruns' maps in the guest once differed by 4.2% with tight, apart ranges.
pub const MIN_CHANGE_SHARE: f64 = 0.05;

/// Why a change between two runs is noise, not a change (see [`significance`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
pub enum Noise {
    /// A run has fewer than two iterations.
    #[error("fewer than 2 iterations: no spread to compare (-n 3 or more)")]
    TooFewIterations,
    /// The medians differ by less than [`MIN_CHANGE_NS`].
    #[error("change under {} us", MIN_CHANGE_NS / 1000)]
    TooSmall,
    /// The medians differ by less than [`MIN_CHANGE_SHARE`] of the slower one.
    #[error("change under {:.0}%: what two processes of one build differ by", MIN_CHANGE_SHARE * 100.0)]
    TooSmallShare,
    /// Some iteration of one run is as fast as some iteration of the other.
    #[error("the two runs' ranges overlap")]
    RangesOverlap,
    /// The medians differ by less than one run's own range.
    #[error("the change is within one run's own spread")]
    WithinSpread,
    /// The change is gone once the second run's times are scaled by how much slower or faster
    /// the machine itself ran (see [`paced_significance`]).
    #[error("the change is the machine's: gone at equal pace (a user-space clear timed beside both runs)")]
    MachinePace,
}

/// Paces closer than this (as a ratio's distance from 1) are the same pace: scaling by them
/// would only add the pace's own noise.
pub const SAME_PACE: f64 = 0.03;

/// [`significance`], and the same again with the second run's times divided by its machine
/// pace over the first run's (`paces`: each run's pace beside its untraced iterations,
/// `floors::Pace`): a change is one only where it holds at equal pace too. A guest on a busy
/// host ran one build's map 1.5x slower in one process than in the next, and its user-space
/// clear 1.4x slower with it; a kernel change leaves that clear alone. Where the paces line
/// up with the iterations, the two runs' ranges must also stay apart with each iteration
/// scaled by the pace timed right before it: the host's speed moves within a run too, and two
/// reruns' unmaps read 0.58x at a median pace of 0.77x, apart at the median pace and not
/// iteration by iteration.
/// Where the paces agree (within [`SAME_PACE`]) this is [`significance`].
pub fn paced_significance(
    before: &crate::report::Stats,
    after: &crate::report::Stats,
    paces: Paces,
) -> Result<(), Noise> {
    significance(before, after)?;
    let (Some((pa, pb)), Some(pace)) = (paces, pace_ratio(paces)) else {
        return Ok(());
    };
    if (pace - 1.0).abs() < SAME_PACE {
        return Ok(());
    }
    let scaled = crate::report::Stats::of(after.runs.iter().map(|r| (*r as f64 / pace) as u64).collect());
    significance(before, &scaled).map_err(|_| Noise::MachinePace)?;
    // Only the ranges, not the spread: one iteration's pace timed through a host stall widens
    // its run's scaled range by as much, and a 4x larger map read as within that spread.
    let unit = pa.median as f64;
    match (at_pace(before, pa, unit), at_pace(after, pb, unit)) {
        (Some(b), Some(a)) if overlap(&b, &a) => Err(Noise::MachinePace),
        _ => Ok(()),
    }
}

/// Two runs' machine paces beside their untraced iterations (`floors::Pace`), first run's
/// first, where both have them.
pub type Paces<'a> = Option<(&'a crate::report::Stats, &'a crate::report::Stats)>;

/// The machine's pace in the second run over the first's, by their medians.
pub fn pace_ratio(paces: Paces) -> Option<f64> {
    let (a, b) = paces.filter(|(a, b)| a.median > 0 && b.median > 0)?;
    Some(b.median as f64 / a.median as f64)
}

/// `times` with each iteration scaled to pace `unit` by the pace timed right before it (None
/// where the paces do not line up with the iterations, one each).
fn at_pace(times: &crate::report::Stats, paces: &crate::report::Stats, unit: f64) -> Option<crate::report::Stats> {
    if times.runs.len() != paces.runs.len() || paces.runs.contains(&0) {
        return None;
    }
    let runs = (times.runs.iter().zip(&paces.runs))
        .map(|(t, p)| (*t as f64 * unit / *p as f64) as u64)
        .collect();
    Some(crate::report::Stats::of(runs))
}

/// Whether a phase changed: every iteration of one run is slower than every iteration of the
/// other (the ranges do not overlap), the medians differ by a larger ratio than the two runs'
/// own ranges span together (each slowest over fastest iteration, multiplied), and by at least
/// [`MIN_CHANGE_NS`]. As ratios, because an iteration that stalls stretches a run's range by a
/// share of its time: one 315 ms iteration among 158 and 161 ms ones spans 2x, and compared
/// as nanoseconds that 157 ms range hid a 7x larger populate (22.5 ms before). Together,
/// because each median can sit anywhere in its run's range: two processes of one build in the
/// guest read 1.20x apart with ranges of 1.16x and 1.14x. The second rule is there because two runs are two
/// processes on different physical pages: the spread between runs is larger than the spread
/// within one (two runs of the same case in the guest differed by 14% on a 2 ms unmap with
/// ranges that just failed to overlap), and so is [`MIN_CHANGE_SHARE`]. With fewer than two
/// iterations in either run nothing can be said. Returns why it is noise when it is.
pub fn significance(before: &crate::report::Stats, after: &crate::report::Stats) -> Result<(), Noise> {
    if before.runs.len() < 2 || after.runs.len() < 2 {
        return Err(Noise::TooFewIterations);
    }
    let shift = before.median.abs_diff(after.median);
    if shift < MIN_CHANGE_NS {
        return Err(Noise::TooSmall);
    }
    if (shift as f64) < MIN_CHANGE_SHARE * before.median.max(after.median) as f64 {
        return Err(Noise::TooSmallShare);
    }
    if overlap(before, after) {
        return Err(Noise::RangesOverlap);
    }
    if log_ratio(before.median, after.median) <= log_range(before) + log_range(after) {
        return Err(Noise::WithinSpread);
    }
    Ok(())
}

/// How far apart two times are as a ratio (its logarithm, so that either order reads the same).
fn log_ratio(a: u64, b: u64) -> f64 {
    (a.max(b).max(1) as f64 / a.min(b).max(1) as f64).ln()
}

/// A run's own spread as a ratio: how many times its slowest iteration took its fastest.
fn log_range(run: &crate::report::Stats) -> f64 {
    log_ratio(run.min, run.max)
}

/// Whether some iteration of one run is as fast as some iteration of the other.
fn overlap(a: &crate::report::Stats, b: &crate::report::Stats) -> bool {
    !(b.min > a.max || b.max < a.min)
}
