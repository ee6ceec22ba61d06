//! dmaprof: runs the mmap / populate / DMA-map workload and attributes where its time goes.
//!
//! Data flows one way: options -> [`matrix`] of cases -> [`workload`] phases -> [`probes`]
//! (attach, read maps) -> [`attribution`] -> [`report`] / [`flamegraph`].

/// The BPF/user ABI types, shared with the BPF programs (one definition, in profiler-ebpf).
pub mod abi {
    pub use profiler_ebpf::*;
}
pub mod attribution;
pub mod capabilities;
pub mod device;
pub mod dma;
pub mod flamegraph;
pub mod hugepages;
pub mod matrix;
pub mod probes;
pub mod report;
pub mod run;
pub mod size;
pub mod symbols;
pub mod workload;
