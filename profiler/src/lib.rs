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
