//! Loading, attaching and reading dmaprof's BPF programs (the object is embedded at build time).
use std::collections::HashSet;

use aya::{
    Ebpf, EbpfLoader,
    maps::{Array, HashMap, MapData, StackTraceMap},
    programs::{
        KProbe, PerfEvent, RawTracePoint,
        perf_event::{PerfEventConfig, PerfEventScope, SamplePolicy, SoftwareEvent},
    },
};
use serde::Serialize;

use crate::{
    abi::{self, Control, PhaseCounters, RowConfig, RowStats, SampleKey},
    attribution::Category,
    symbols::KernelSymbols,
};

/// The BPF object built from profiler-ebpf by build.rs.
pub static BPF_OBJECT: &[u8] = aya::include_bytes_aligned!(concat!(env!("OUT_DIR"), "/profiler-ebpf"));

/// One row of the probe table: a kernel function, what its time is, where it shows up.
#[derive(Clone, Copy, Debug)]
pub struct ProbeRow {
    /// Kernel function (vmlinux or module).
    pub function: &'static str,
    /// Category its exclusive time counts as.
    pub category: Category,
    /// The phases it is expected in.
    pub phase: &'static str,
    /// Outer boundary of a DMA ioctl (its exclusive time is the ioctl's own overhead).
    pub boundary: bool,
    /// Argument (0-based) summed per row, and its unit (`pages`, `bytes`).
    pub amount: Option<(u8, &'static str)>,
}

const fn row(function: &'static str, category: Category, phase: &'static str) -> ProbeRow {
    ProbeRow {
        function,
        category,
        phase,
        boundary: false,
        amount: None,
    }
}

const fn boundary(function: &'static str, phase: &'static str) -> ProbeRow {
    ProbeRow {
        function,
        category: Category::Other,
        phase,
        boundary: true,
        amount: None,
    }
}

const fn counted(
    function: &'static str,
    category: Category,
    phase: &'static str,
    arg: u8,
    unit: &'static str,
) -> ProbeRow {
    ProbeRow {
        function,
        category,
        phase,
        boundary: false,
        amount: Some((arg, unit)),
    }
}

/// The probe table: every function dmaprof times exactly. It drives attaching (a kprobe and a
/// kretprobe per row) and reporting (row -> category). Nesting is resolved in BPF: a row's
/// exclusive time excludes the probed rows it calls, so categories never double count (the
/// faults inside `pin_user_pages_remote` of an unpopulated map are faulting, not pinning).
pub const PROBE_TABLE: &[ProbeRow] = &[
    // VFIO type1 (module vfio_iommu_type1).
    boundary("vfio_iommu_type1_ioctl", "map, unmap"),
    row("vfio_dma_do_map", Category::Other, "map"),
    row("vfio_pin_map_dma", Category::Other, "map"),
    counted("vfio_pin_pages_remote", Category::Pinning, "map", 2, "pages"),
    counted("vaddr_get_pfns", Category::Pinning, "map", 2, "pages"),
    counted("vfio_iommu_map", Category::IommuMap, "map", 3, "pages"),
    row("vfio_unmap_unpin", Category::Other, "unmap"),
    // iommufd (module iommufd).
    boundary("iommufd_ioas_map", "map"),
    boundary("iommufd_ioas_map_file", "map"),
    boundary("iommufd_vfio_map_dma", "map"),
    boundary("iommufd_ioas_unmap", "unmap"),
    row("iopt_map_user_pages", Category::Other, "map"),
    row("iopt_map_file_pages", Category::Other, "map"),
    row("iopt_area_fill_domains", Category::Other, "map"),
    row("pfn_reader_user_pin", Category::Pinning, "map"),
    row("batch_to_domain", Category::IommuMap, "map"),
    row("iopt_pages_update_pinned", Category::Accounting, "map, unmap"),
    // GUP.
    counted("pin_user_pages_remote", Category::Pinning, "map", 2, "pages"),
    counted("pin_user_pages_fast", Category::Pinning, "map", 1, "pages"),
    row("memfd_pin_folios", Category::Pinning, "map"),
    counted("__get_user_pages", Category::Pinning, "mmap, map", 2, "pages"),
    // Faults and zeroing.
    row("handle_mm_fault", Category::Faulting, "mmap, touch, map"),
    row("hugetlb_fault", Category::Faulting, "mmap, touch, map"),
    row("folio_zero_user", Category::Zeroing, "mmap, touch, map"),
    row("clear_huge_page", Category::Zeroing, "mmap, touch, map"),
    // IOMMU core.
    counted("iommu_map", Category::IommuMap, "map", 3, "bytes"),
    counted("iommu_map_nosync", Category::IommuMap, "map", 3, "bytes"),
    counted("iommu_sync_map", Category::IommuFlush, "map", 2, "bytes"),
    counted("iommu_unmap", Category::IommuMap, "unmap", 2, "bytes"),
    counted("iommu_unmap_fast", Category::IommuMap, "unmap", 2, "bytes"),
    row("iommu_iotlb_sync", Category::IommuFlush, "unmap"),
    // The core's sync is inlined on current kernels: the Intel driver's flush hooks stand in.
    row("intel_iommu_iotlb_sync_map", Category::IommuFlush, "map"),
    row("intel_flush_iotlb_all", Category::IommuFlush, "map, unmap"),
    // locked_vm accounting.
    counted("__account_locked_vm", Category::Accounting, "map, unmap", 1, "pages"),
    counted("account_locked_vm", Category::Accounting, "map, unmap", 1, "pages"),
];

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
    p.load().map_err(|e| format!("load: {}", one_line(&e)))?;
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

/// The reason given for probes of a mechanism left off with `--probes`.
pub const NOT_REQUESTED: &str = "not requested (--probes)";

/// A probe mechanism that can be switched on or off (`dmaprof run --probes`), e.g. to measure
/// what each one costs.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, serde::Deserialize, clap::ValueEnum)]
#[serde(rename_all = "snake_case")]
pub enum Mechanism {
    /// perf_event cpu-clock sampling of kernel stacks (the flamegraphs).
    Samples,
    /// Raw tracepoints: syscall entry/exit and user page faults (counts, syscall time).
    Tracepoints,
    /// fentry + fexit on probe-table rows in vmlinux (exact entry/exit accounting; module
    /// functions need `kprobes`).
    Fentry,
    /// kprobe + kretprobe on probe-table rows (every row, or those fentry did not take).
    Kprobes,
}

impl Mechanism {
    /// All of them, the default: rows get fentry where it works, kprobes elsewhere.
    pub const ALL: [Mechanism; 4] = [
        Mechanism::Samples,
        Mechanism::Tracepoints,
        Mechanism::Fentry,
        Mechanism::Kprobes,
    ];
}

/// Loads the object with the workload thread's id and the bpf() syscall number filled in.
/// `sample_map_entries` shrinks the sampled-stack map (a test forces lost samples with it).
pub fn load_object(tid: u32, sample_map_entries: Option<u32>) -> Result<Ebpf, ProbeError> {
    let ignored: i64 = libc::SYS_bpf;
    let mut loader = EbpfLoader::new();
    loader
        .override_global(abi::TARGET_TID_GLOBAL, &tid, true)
        .override_global(abi::IGNORED_SYSCALL_GLOBAL, &ignored, true);
    if let Some(n) = sample_map_entries {
        loader.map_max_entries(abi::maps::SAMPLES, n);
    }
    loader.load(BPF_OBJECT).map_err(ProbeError::Load)
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
    /// Exact per-row stats: (slot, row index, stats), only non-zero ones.
    pub rows: Vec<(u32, usize, RowStats)>,
}

/// The loaded and attached probes for one workload thread.
pub struct Probes {
    _ebpf: Ebpf,
    control: Array<MapData, Control>,
    counters: Array<MapData, PhaseCounters>,
    samples: HashMap<MapData, SampleKey, u64>,
    stacks: StackTraceMap<MapData>,
    row_stats: Array<MapData, RowStats>,
    /// Probe-table rows that attached (indices into [`PROBE_TABLE`]).
    pub attached_rows: Vec<usize>,
    /// What attached and what did not.
    pub status: Vec<ProbeStatus>,
}

/// An error on one line: a verifier log is cut to the line that says why the program was refused.
pub fn one_line(e: &dyn std::fmt::Display) -> String {
    let text = e.to_string();
    let Some((head, log)) = text.split_once("Verifier output:") else {
        return text.lines().next().unwrap_or_default().to_owned();
    };
    let lines: Vec<&str> = log.lines().map(str::trim).filter(|l| !l.is_empty()).collect();
    let reason = lines
        .iter()
        .position(|l| l.starts_with("verification time") || l.starts_with("processed "))
        .and_then(|i| i.checked_sub(1))
        .and_then(|i| lines.get(i))
        .or(lines.last())
        .copied()
        .unwrap_or("");
    let head = head.trim().trim_end_matches('.');
    if reason.is_empty() {
        head.to_owned()
    } else {
        format!("{head} verifier: {reason}")
    }
}

/// Whether this kernel has kprobes at all (the kprobe PMU or the legacy tracefs interface).
pub fn kprobes_available() -> bool {
    std::path::Path::new("/sys/bus/event_source/devices/kprobe/type").exists()
}

/// Attaches the row programs to every probe-table function this kernel has: with `fentry`,
/// vmlinux functions get an fentry/fexit pair (cheaper than a kprobe pair: a direct call into a
/// BPF trampoline); with `kprobes`, every other row (module functions, compiler clones, or
/// when fentry is refused) gets a kprobe/kretprobe. Returns the attached row indices and one
/// status line per row.
fn attach_rows(
    ebpf: &mut Ebpf,
    symbols: Option<&KernelSymbols>,
    kprobes: bool,
    fentry: bool,
) -> (Vec<usize>, Vec<ProbeStatus>) {
    let mut attached = Vec::new();
    let mut status = Vec::new();
    let not = |row: &ProbeRow, mechanism: &'static str, why: String| ProbeStatus {
        function: row.function.to_owned(),
        mechanism,
        attached: false,
        error: Some(why),
    };
    let wanted = if fentry { "fentry" } else { "kprobe" };
    let symbols = match symbols {
        Some(s) if s.usable() => s,
        Some(_) => {
            let why = "/proc/kallsyms addresses are hidden (kptr_restrict): run as root";
            status.extend(PROBE_TABLE.iter().map(|r| not(r, wanted, why.into())));
            return (attached, status);
        }
        None => {
            let why = "kernel symbols unreadable (/proc/kallsyms)";
            status.extend(PROBE_TABLE.iter().map(|r| not(r, wanted, why.into())));
            return (attached, status);
        }
    };
    // Why kprobes cannot be used (None: they can), found once.
    let kprobe_block: Option<String> = if !kprobes {
        Some("kprobes not requested (--probes)".into())
    } else if !kprobes_available() {
        Some(
            "kernel has no kprobes (CONFIG_KPROBES off); fentry covers only vmlinux functions: run in `cargo xtask vm`"
                .into(),
        )
    } else {
        load_kprobe_pair(ebpf).err()
    };
    // Why fentry cannot be used any more (the first refused load says it for all).
    let btf = if fentry { aya::Btf::from_sys_fs().ok() } else { None };
    let mut fentry_block: Option<String> = match (fentry, &btf) {
        (false, _) => Some("fentry not requested (--probes)".into()),
        (true, None) => Some("no kernel BTF (/sys/kernel/btf/vmlinux): fentry needs it".into()),
        (true, Some(_)) => None,
    };
    let mut next_slot = 0u32;
    let mut row_by_ip: HashMap<_, u64, RowConfig> = match ebpf.map_mut(abi::maps::ROW_BY_IP).map(HashMap::try_from) {
        Some(Ok(m)) => m,
        _ => {
            status.extend(
                PROBE_TABLE
                    .iter()
                    .map(|r| not(r, wanted, "ROW_BY_IP map missing".into())),
            );
            return (attached, status);
        }
    };
    let mut configs = Vec::new();
    for (i, row) in PROBE_TABLE.iter().enumerate() {
        let found = symbols.lookup(row.function);
        let Some(&(symbol, addrs)) = found.first() else {
            status.push(not(
                row,
                wanted,
                "not in /proc/kallsyms: inlined, renamed, or its module is not loaded".into(),
            ));
            continue;
        };
        let cfg = RowConfig {
            row: i as u32,
            amount_arg: row.amount.map_or(-1, |(a, _)| i32::from(a)),
        };
        if let Err(e) = addrs.iter().try_for_each(|a| row_by_ip.insert(*a, cfg, 0)) {
            status.push(not(row, wanted, format!("ROW_BY_IP insert: {e}")));
            continue;
        }
        // fentry binds to a BTF function: the exact name, once, in vmlinux (module BTF needs
        // an attach object fd that aya 0.14 does not pass).
        let in_vmlinux = btf.as_ref().is_some_and(|b| {
            symbol == row.function
                && addrs.len() == 1
                && b.id_by_type_name_kind(symbol, aya_obj::btf::BtfKind::Func).is_ok()
        });
        configs.push((i, symbol.to_owned(), in_vmlinux));
    }

    for (i, symbol, in_vmlinux) in configs {
        let row = &PROBE_TABLE[i];
        let mut fentry_error = None;
        if in_vmlinux && fentry_block.is_none() && next_slot < abi::FENTRY_SLOTS {
            let slot = next_slot;
            next_slot += 1;
            match attach_fentry_pair(ebpf, slot, &symbol, btf.as_ref().expect("checked")) {
                Ok(()) => {
                    attached.push(i);
                    status.push(ProbeStatus {
                        function: row.function.to_owned(),
                        mechanism: "fentry",
                        attached: true,
                        error: None,
                    });
                    continue;
                }
                Err((e, load_refused)) => {
                    if load_refused {
                        fentry_block = Some(e.clone());
                    }
                    fentry_error = Some(e);
                }
            }
        }
        if let Some(why) = &kprobe_block {
            let why = match (&fentry_error, in_vmlinux || !fentry) {
                (Some(f), _) => format!("{f}; {why}"),
                (None, true) => fentry_block.as_ref().map_or(why.clone(), |f| format!("{f}; {why}")),
                (None, false) => format!("module function or compiler clone (no fentry); {why}"),
            };
            status.push(not(row, wanted, why));
            continue;
        }
        match attach_kprobe_pair(ebpf, &symbol) {
            Ok(()) => {
                attached.push(i);
                status.push(ProbeStatus {
                    function: row.function.to_owned(),
                    mechanism: "kprobe",
                    attached: true,
                    error: None,
                });
            }
            Err(e) => status.push(not(row, "kprobe", e)),
        }
    }
    (attached, status)
}

fn kprobe_program<'a>(ebpf: &'a mut Ebpf, name: &str) -> Result<&'a mut KProbe, String> {
    ebpf.program_mut(name)
        .ok_or_else(|| format!("{name} missing from the BPF object"))?
        .try_into()
        .map_err(|e| format!("{e}"))
}

/// Loads row_entry/row_exit (once; they attach to many functions).
fn load_kprobe_pair(ebpf: &mut Ebpf) -> Result<(), String> {
    for name in [abi::programs::ROW_ENTRY, abi::programs::ROW_EXIT] {
        kprobe_program(ebpf, name)?
            .load()
            .map_err(|e| format!("load {name}: {}", one_line(&e)))?;
    }
    Ok(())
}

/// kprobe + kretprobe on `symbol`; neither stays if one fails.
fn attach_kprobe_pair(ebpf: &mut Ebpf, symbol: &str) -> Result<(), String> {
    let link = kprobe_program(ebpf, abi::programs::ROW_ENTRY)?
        .attach(symbol, 0)
        .map_err(|e| format!("kprobe on {symbol}: {e}"))?;
    if let Err(e) = kprobe_program(ebpf, abi::programs::ROW_EXIT)?.attach(symbol, 0) {
        let _ = kprobe_program(ebpf, abi::programs::ROW_ENTRY)?.detach(link);
        return Err(format!("kretprobe: {e}"));
    }
    Ok(())
}

/// fentry + fexit slot `slot` on `symbol`. The error says whether the kernel refused the load
/// itself (then no fentry will load: EPERM, no trampolines) or just this function.
fn attach_fentry_pair(ebpf: &mut Ebpf, slot: u32, symbol: &str, btf: &aya::Btf) -> Result<(), (String, bool)> {
    use aya::programs::{FEntry, FExit};
    let entry_name = format!("{}{slot}", abi::programs::ROW_FENTRY_PREFIX);
    let exit_name = format!("{}{slot}", abi::programs::ROW_FEXIT_PREFIX);
    let missing = |n: &str| (format!("{n} missing from the BPF object"), true);
    let entry: &mut FEntry = ebpf
        .program_mut(&entry_name)
        .ok_or_else(|| missing(&entry_name))?
        .try_into()
        .map_err(|e| (format!("{e}"), true))?;
    entry
        .load(symbol, btf)
        .map_err(|e| (format!("fentry load: {}", one_line(&e)), is_refusal(&e)))?;
    let link = entry.attach().map_err(|e| (format!("fentry attach: {e}"), false))?;
    let exit: &mut FExit = ebpf
        .program_mut(&exit_name)
        .ok_or_else(|| missing(&exit_name))?
        .try_into()
        .map_err(|e| (format!("{e}"), true))?;
    let result = exit
        .load(symbol, btf)
        .map_err(|e| (format!("fexit load: {}", one_line(&e)), is_refusal(&e)))
        .and_then(|()| {
            exit.attach()
                .map(drop)
                .map_err(|e| (format!("fexit attach: {e}"), false))
        });
    if result.is_err() {
        if let Some(Ok(entry)) = ebpf.program_mut(&entry_name).map(<&mut FEntry>::try_from) {
            let _ = entry.detach(link);
        }
    }
    result
}

/// Whether a load error means fentry as a whole is refused here (not this one function):
/// EPERM (lockdown, no CAP), or ENOTSUPP/EOPNOTSUPP (no trampolines on this arch/config).
fn is_refusal(e: &aya::programs::ProgramError) -> bool {
    /// The kernel's internal ENOTSUPP, which BPF_PROG_LOAD returns without trampolines.
    const ENOTSUPP: i32 = 524;
    matches!(
        e,
        aya::programs::ProgramError::LoadError { io_error, .. }
            if matches!(io_error.raw_os_error(), Some(libc::EPERM | libc::EOPNOTSUPP | ENOTSUPP))
    )
}

impl Probes {
    /// Loads the programs for thread `tid` (the caller) and attaches what this kernel allows.
    /// A probe that cannot attach is recorded in `status`; only a failed load is an error.
    pub fn attach(
        tid: u32,
        freq_hz: u64,
        symbols: Option<&KernelSymbols>,
        sample_map_entries: Option<u32>,
        mechanisms: &[Mechanism],
    ) -> Result<Self, ProbeError> {
        let mut ebpf = load_object(tid, sample_map_entries)?;
        let (kprobes, fentry) = (
            mechanisms.contains(&Mechanism::Kprobes),
            mechanisms.contains(&Mechanism::Fentry),
        );
        let (attached_rows, mut status) = if kprobes || fentry {
            attach_rows(&mut ebpf, symbols, kprobes, fentry)
        } else {
            let status = PROBE_TABLE
                .iter()
                .map(|r| ProbeStatus {
                    function: r.function.to_owned(),
                    mechanism: "kprobe",
                    attached: false,
                    error: Some(NOT_REQUESTED.into()),
                })
                .collect();
            (Vec::new(), status)
        };
        for &(prog, category, name, _) in TRACEPOINTS {
            let function = format!("{category}:{name}");
            let result = if mechanisms.contains(&Mechanism::Tracepoints) {
                attach_raw_tracepoint(&mut ebpf, prog, name)
            } else {
                Err(NOT_REQUESTED.into())
            };
            status.push(ProbeStatus {
                function,
                mechanism: "raw_tracepoint",
                attached: result.is_ok(),
                error: result.err(),
            });
        }
        let sampler = (|| -> Result<(), String> {
            if !mechanisms.contains(&Mechanism::Samples) {
                return Err(NOT_REQUESTED.into());
            }
            let p: &mut PerfEvent = ebpf
                .program_mut(abi::programs::SAMPLE_STACK)
                .ok_or("missing from the BPF object")?
                .try_into()
                .map_err(|e| format!("{e}"))?;
            p.load().map_err(|e| format!("load: {}", one_line(&e)))?;
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
        let row_stats = Array::try_from(take(&mut ebpf, abi::maps::ROW_STATS)?).map_err(map_err("ROW_STATS"))?;
        Ok(Self {
            _ebpf: ebpf,
            control,
            counters,
            samples,
            stacks,
            row_stats,
            attached_rows,
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
        for slot in 1..slots.min(abi::MAX_PHASES) {
            for &row in &self.attached_rows {
                let idx = slot * abi::MAX_ROWS + row as u32;
                let st = self.row_stats.get(&idx, 0).map_err(map_err("ROW_STATS read"))?;
                if st != RowStats::default() {
                    out.rows.push((slot, row, st));
                    self.row_stats
                        .set(idx, RowStats::default(), 0)
                        .map_err(map_err("ROW_STATS reset"))?;
                }
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
