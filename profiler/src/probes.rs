//! Loading, attaching and reading dmaprof's BPF programs (the object is embedded at build time).
use std::collections::HashSet;

use aya::{
    Ebpf, EbpfLoader,
    maps::{Array, HashMap, MapData, StackTraceMap},
    programs::{
        PerfEvent, RawTracePoint,
        perf_event::{PerfEventConfig, PerfEventScope, SamplePolicy, SoftwareEvent},
    },
};
use serde::Serialize;

use crate::abi::{self, Control, PhaseCounters, SampleKey};

/// The BPF object built from profiler-ebpf by build.rs.
pub static BPF_OBJECT: &[u8] = aya::include_bytes_aligned!(concat!(env!("OUT_DIR"), "/profiler-ebpf"));

/// Tracepoints the memory phases use: (program, category, event, what it gives). They are
/// attached as raw tracepoints: cheaper per hit, and no tracefs mount needed.
pub const TRACEPOINTS: &[(&str, &str, &str, &str)] = &[
    (
        abi::programs::SYS_ENTER,
        "raw_syscalls",
        "sys_enter",
        "syscall time per phase",
    ),
    (
        abi::programs::SYS_EXIT,
        "raw_syscalls",
        "sys_exit",
        "syscall time per phase",
    ),
    (
        abi::programs::PAGE_FAULT_USER,
        "exceptions",
        "page_fault_user",
        "user page-fault counts",
    ),
];

/// Loads and attaches one raw tracepoint program of `ebpf`.
pub fn attach_raw_tracepoint(ebpf: &mut Ebpf, prog: &str, event: &str) -> Result<(), String> {
    let p: &mut RawTracePoint = ebpf
        .program_mut(prog)
        .ok_or("missing from the BPF object")?
        .try_into()
        .map_err(|e| format!("{e}"))?;
    p.load().map_err(|e| format!("load: {e}"))?;
    p.attach(event).map_err(|e| format!("attach: {e}"))?;
    Ok(())
}

/// Why the probes could not be set up at all.
#[derive(Debug, thiserror::Error)]
pub enum ProbeError {
    /// The BPF object did not load.
    #[error("cannot load the BPF programs: {0} (dmaprof needs root, or CAP_BPF + CAP_PERFMON + CAP_SYS_ADMIN)")]
    Load(#[source] aya::EbpfError),
    /// A map or program is missing from the object (a build mismatch).
    #[error("the embedded BPF object has no {0}: rebuild dmaprof")]
    Missing(&'static str),
    /// A map operation failed.
    #[error("BPF map {what}: {source}")]
    Map {
        /// Which operation.
        what: &'static str,
        /// The error.
        #[source]
        source: aya::maps::MapError,
    },
    /// Loading a program failed.
    #[error("BPF program {name}: {source}")]
    Program {
        /// Which program.
        name: &'static str,
        /// The error.
        #[source]
        source: aya::programs::ProgramError,
    },
}

/// Attachment state of one probe, as reported.
#[derive(Clone, Debug, Serialize)]
pub struct ProbeStatus {
    /// Kernel function, tracepoint or perf event.
    pub function: String,
    /// fentry, kprobe, tracepoint, perf_event...
    pub mechanism: &'static str,
    /// Whether it is attached.
    pub attached: bool,
    /// Why not, if not.
    pub error: Option<String>,
}

/// Loads the object with the workload thread's id and the bpf() syscall number filled in.
pub fn load_object(tid: u32) -> Result<Ebpf, ProbeError> {
    let ignored: i64 = libc::SYS_bpf;
    EbpfLoader::new()
        .override_global(abi::TARGET_TID_GLOBAL, &tid, true)
        .override_global(abi::IGNORED_SYSCALL_GLOBAL, &ignored, true)
        .load(BPF_OBJECT)
        .map_err(ProbeError::Load)
}

/// The calling thread's id.
pub fn gettid() -> u32 {
    // SAFETY: gettid has no preconditions and cannot fail.
    unsafe { libc::gettid() as u32 }
}

/// One sampled stack and how often it was seen.
#[derive(Clone, Debug)]
pub struct RawSample {
    /// Phase slot.
    pub slot: u32,
    /// Kernel frame addresses, leaf first (empty: sample in user mode).
    pub kernel: Vec<u64>,
    /// Whether a user stack was captured.
    pub has_user: bool,
    /// Number of samples with this stack.
    pub count: u64,
}

/// What one case's probes recorded.
#[derive(Debug, Default)]
pub struct Drained {
    /// Counters per phase slot (only slots with any activity).
    pub counters: Vec<(u32, PhaseCounters)>,
    /// Sampled stacks.
    pub samples: Vec<RawSample>,
}

/// The loaded and attached probes for one workload thread.
pub struct Probes {
    _ebpf: Ebpf,
    control: Array<MapData, Control>,
    counters: Array<MapData, PhaseCounters>,
    samples: HashMap<MapData, SampleKey, u64>,
    stacks: StackTraceMap<MapData>,
    /// What attached and what did not.
    pub status: Vec<ProbeStatus>,
}

impl Probes {
    /// Loads the programs for thread `tid` (the caller) and attaches what this kernel allows.
    /// A probe that cannot attach is recorded in `status`; only a failed load is an error.
    pub fn attach(tid: u32, freq_hz: u64) -> Result<Self, ProbeError> {
        let mut ebpf = load_object(tid)?;
        let mut status = Vec::new();
        for &(prog, category, name, _) in TRACEPOINTS {
            let function = format!("{category}:{name}");
            let result = attach_raw_tracepoint(&mut ebpf, prog, name);
            status.push(ProbeStatus {
                function,
                mechanism: "raw_tracepoint",
                attached: result.is_ok(),
                error: result.err(),
            });
        }
        let sampler = (|| -> Result<(), String> {
            let p: &mut PerfEvent = ebpf
                .program_mut(abi::programs::SAMPLE_STACK)
                .ok_or("missing from the BPF object")?
                .try_into()
                .map_err(|e| format!("{e}"))?;
            p.load().map_err(|e| format!("load: {e}"))?;
            p.attach(
                PerfEventConfig::Software(SoftwareEvent::CpuClock),
                PerfEventScope::OneProcess { pid: tid, cpu: None },
                SamplePolicy::Frequency(freq_hz),
                false,
            )
            .map_err(|e| format!("attach: {e}"))?;
            Ok(())
        })();
        status.push(ProbeStatus {
            function: format!("cpu-clock@{freq_hz}Hz"),
            mechanism: "perf_event",
            attached: sampler.is_ok(),
            error: sampler.err(),
        });
        let take = |ebpf: &mut Ebpf, name: &'static str| ebpf.take_map(name).ok_or(ProbeError::Missing(name));
        let map_err = |what| move |source| ProbeError::Map { what, source };
        let control = Array::try_from(take(&mut ebpf, abi::maps::CONTROL)?).map_err(map_err("CONTROL"))?;
        let counters =
            Array::try_from(take(&mut ebpf, abi::maps::PHASE_COUNTERS)?).map_err(map_err("PHASE_COUNTERS"))?;
        let samples = HashMap::try_from(take(&mut ebpf, abi::maps::SAMPLES)?).map_err(map_err("SAMPLES"))?;
        let stacks = StackTraceMap::try_from(take(&mut ebpf, abi::maps::STACKS)?).map_err(map_err("STACKS"))?;
        Ok(Self {
            _ebpf: ebpf,
            control,
            counters,
            samples,
            stacks,
            status,
        })
    }

    /// Starts recording into phase slot `slot` (0 stops recording).
    pub fn set_phase(&mut self, slot: u32) -> Result<(), ProbeError> {
        self.control
            .set(
                0,
                Control {
                    phase: slot,
                    _reserved: 0,
                },
                0,
            )
            .map_err(|source| ProbeError::Map {
                what: "CONTROL update",
                source,
            })
    }

    /// Reads and clears everything recorded in slots `1..slots`.
    pub fn drain(&mut self, slots: u32) -> Result<Drained, ProbeError> {
        let map_err = |what| move |source| ProbeError::Map { what, source };
        let mut out = Drained::default();
        for slot in 1..slots.min(abi::MAX_PHASES) {
            let c = self.counters.get(&slot, 0).map_err(map_err("PHASE_COUNTERS read"))?;
            if c != PhaseCounters::default() {
                out.counters.push((slot, c));
                self.counters
                    .set(slot, PhaseCounters::default(), 0)
                    .map_err(map_err("PHASE_COUNTERS reset"))?;
            }
        }
        let keys: Vec<SampleKey> = self
            .samples
            .keys()
            .collect::<Result<_, _>>()
            .map_err(map_err("SAMPLES keys"))?;
        let mut stack_ids = HashSet::new();
        for key in keys {
            let count = match self.samples.get(&key, 0) {
                Ok(c) => c,
                Err(_) => continue,
            };
            let kernel = if key.kernel_stack >= 0 {
                stack_ids.insert(key.kernel_stack as u32);
                match self.stacks.get(&(key.kernel_stack as u32), 0) {
                    Ok(st) => st.frames().iter().map(|f| f.ip).collect(),
                    Err(_) => Vec::new(),
                }
            } else {
                Vec::new()
            };
            if key.user_stack >= 0 {
                stack_ids.insert(key.user_stack as u32);
            }
            out.samples.push(RawSample {
                slot: key.phase,
                kernel,
                has_user: key.user_stack >= 0,
                count,
            });
            let _ = self.samples.remove(&key);
        }
        for id in stack_ids {
            let _ = self.stacks.remove(&id);
        }
        Ok(out)
    }
}
