//! dmaprof: runs the mmap / populate / DMA-map workload and attributes where its time goes.
//!
//! Data flows one way: [`cli`] options -> [`plan`] (the [`matrix`] of cases against the host's
//! [`facts`]) -> [`session`] runs the [`workload`] (with [`dma`], [`device`], [`hugepages`])
//! under the probes ([`probes`] declares them, [`loader`] attaches and reads them,
//! [`calibrate`] measures what they cost, [`floors`] what the machine can do at best) ->
//! [`attribution`] (exact + sampled, by the one [`category`] table) -> [`report`], written by
//! [`output`] and shown by [`table`], [`html`] (the HTML report), [`diff`], [`explain`], [`export`]
//! (KTAP, CSV) and [`flamegraph`]. [`stop`] owns signals and
//! the emergency clean-up; [`doctor`], [`kernel`], [`privileges`] and [`leftovers`] find the
//! host's facts.

/// The BPF/user ABI types, shared with the BPF programs (one definition, in profiler-ebpf).
pub mod abi {
    pub use profiler_ebpf::*;

    #[cfg(test)]
    mod tests {
        use super::*;

        const P: u64 = 200_000;

        #[test]
        fn a_sample_stands_for_the_periods_since_the_last() {
            // (the event's clock at a sample, periods it stands for, clock credited after it)
            let samples = [
                // The first sample, then one on time and one 4 us late: a period each.
                (1_000_000, 1, 1_000_000),
                (1_200_000, 1, 1_200_000),
                (1_404_000, 1, 1_400_000),
                // Interrupts off for 2.6 ms: the timer fires once, late, and that sample stands
                // for the 13 periods since the last; the next, on the grid again, for one.
                (4_000_000, 13, 4_000_000),
                (4_200_000, 1, 4_200_000),
                // The next expiry fired 0.6 periods late: rounded to two, the credit runs ahead,
                // and the expiry after it, on time, stands for none: two periods for two.
                (4_520_000, 2, 4_600_000),
                (4_600_000, 0, 4_600_000),
            ];
            let mut credited = None;
            for (clock, periods, after) in samples {
                let (n, c) = credit_periods(clock, credited, P);
                assert_eq!((n, c), (periods, after), "at {clock}");
                credited = Some(c);
            }
        }

        #[test]
        fn a_new_event_starts_anew_and_a_stall_is_capped() {
            // The sampler attached again: its clock starts near 0, far behind the credit.
            assert_eq!(credit_periods(5_000, Some(9_000_000_000), P), (1, 5_000));
            let (n, c) = credit_periods(P * 5000, Some(0), P);
            assert_eq!((n, c), (MAX_LATE_PERIODS, P * 5000));
        }
    }
}
pub mod attribution;
pub mod bpflog;
pub mod calibrate;
pub mod category;
pub mod cli;
pub mod device;
pub mod diff;
pub mod dma;
pub mod doctor;
pub mod explain;
pub mod export;
pub mod facts;
pub mod flamegraph;
pub mod floors;
pub mod held;
pub mod html;
pub mod hugepages;
pub mod kernel;
pub mod launch;
pub mod layout;
pub mod leftovers;
pub mod loader;
pub mod matrix;
pub mod output;
pub mod phase;
pub mod plan;
pub mod privileges;
pub mod probes;
pub mod record;
pub mod recording;
pub mod report;
pub mod session;
pub mod significance;
pub mod size;
pub mod stop;
pub mod sweep;
pub mod symbols;
pub mod sys;
pub mod table;
pub mod workload;
