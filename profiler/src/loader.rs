//! The one attach path, every probe attached as one thing in four steps: **plan** (which
//! probe-table rows this kernel has and which mechanism each gets) -> **load** (the embedded BPF object,
//! with the workload thread's id) -> **attach** (fentry/fexit where the kernel allows it,
//! kprobe/kretprobe otherwise; tracepoints; the sampler) -> **activate** ([`Probes`], whose
//! phase switch starts recording). `run` and `doctor` both go through it.
use std::collections::HashSet;

use aya::{
    Btf, Ebpf, EbpfLoader,
    maps::{Array, HashMap, MapData, PerCpuArray, RingBuf, StackTraceMap},
    programs::{
        FEntry, FExit, KProbe, PerfEvent, Program, ProgramError, RawTracePoint,
        fentry::{FEntryLink, FEntryLinkId},
        fexit::{FExitLink, FExitLinkId},
        kprobe::{KProbeLink, KProbeLinkId},
        perf_event::{PerfEventConfig, PerfEventLink, PerfEventLinkId, PerfEventScope, SamplePolicy, SoftwareEvent},
        raw_trace_point::{RawTracePointLink, RawTracePointLinkId},
    },
};

use crate::{
    abi::{self, Control, PhaseCounters, RowConfig, RowStats, SampleKey},
    category::{CATEGORIES, Category},
    matrix::DmaMode,
    probes::{AttachedBy, Group, Mechanism, NOT_REQUESTED, PROBE_TABLE, ProbeStatus, TRACEPOINTS},
    symbols::KernelSymbols,
};

/// The row the calibration probe is accounted under: past every probe-table row.
pub const CALIBRATION_ROW: u32 = abi::MAX_ROWS - 1;

/// The phase slot calibration records into: past every case's slots.
pub const CALIBRATION_SLOT: u32 = abi::MAX_PHASES - 1;

/// The phase slot a primer iteration records into, to be discarded: the calibration's,
/// which is done by the time cases run.
pub const PRIMER_SLOT: u32 = CALIBRATION_SLOT;

/// The BPF object built from profiler-ebpf by build.rs.
pub static BPF_OBJECT: &[u8] = aya::include_bytes_aligned!(concat!(env!("OUT_DIR"), "/profiler-ebpf"));

/// Why something could not be attached (or the probes could not be set up at all).
#[derive(Debug, thiserror::Error)]
pub enum AttachError {
    /// The BPF object did not load.
    #[error("cannot load the BPF programs: {0} (dmaprof needs root, or CAP_BPF + CAP_PERFMON + CAP_SYS_ADMIN)")]
    Load(#[source] aya::EbpfError),
    /// A map or program is missing from the object (a build mismatch).
    #[error("the embedded BPF object has no {0}: rebuild dmaprof")]
    Missing(String),
    /// A map operation failed.
    #[error("BPF map {what}: {source}")]
    Map {
        /// Which operation.
        what: &'static str,
        /// The error.
        #[source]
        source: aya::maps::MapError,
    },
    /// A program was refused at load (verifier, EPERM, no BTF target).
    #[error("{what} load: {reason}")]
    ProgramLoad {
        /// fentry, kprobe, ...
        what: &'static str,
        /// One line: the verifier's reason or the error.
        reason: String,
        /// The whole mechanism is refused here (EPERM, no trampolines), not just this target.
        refused: bool,
    },
    /// A loaded program did not attach.
    #[error("{what} on {target}: {reason}")]
    ProgramAttach {
        /// fentry, kprobe, ...
        what: &'static str,
        /// The function or event.
        target: String,
        /// Why.
        reason: String,
    },
    /// Not possible on this kernel or with these options.
    #[error("{0}")]
    Unavailable(String),
}

impl AttachError {
    /// Whether this refusal stands for every target of its mechanism.
    fn refuses_all(&self) -> bool {
        matches!(
            self,
            AttachError::ProgramLoad { refused: true, .. } | AttachError::Missing(_)
        )
    }
}

/// The program `name` of `ebpf` as the program type `T`.
fn program<'a, T>(ebpf: &'a mut Ebpf, name: &str) -> Result<&'a mut T, AttachError>
where
    &'a mut T: TryFrom<&'a mut Program, Error = ProgramError>,
{
    let p = ebpf
        .program_mut(name)
        .ok_or_else(|| AttachError::Missing(format!("program {name}")))?;
    p.try_into()
        .map_err(|e: ProgramError| AttachError::Missing(format!("program {name} of that type ({e})")))
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

/// Whether a load error means the mechanism as a whole is refused here (not this one function):
/// EPERM (lockdown, no CAP), or ENOTSUPP/EOPNOTSUPP (no trampolines on this arch/config).
fn is_refusal(e: &ProgramError) -> bool {
    /// The kernel's internal ENOTSUPP, which BPF_PROG_LOAD returns without trampolines.
    const ENOTSUPP: i32 = 524;
    matches!(
        e,
        ProgramError::LoadError { io_error, .. }
            if matches!(io_error.raw_os_error(), Some(libc::EPERM | libc::EOPNOTSUPP | ENOTSUPP))
    )
}

fn load_error(what: &'static str, e: &ProgramError) -> AttachError {
    AttachError::ProgramLoad {
        what,
        reason: one_line(e),
        refused: is_refusal(e),
    }
}

/// Which threads the programs watch.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Watched {
    /// One thread (`run`'s workload thread); phases switch recording on and off.
    Thread(u32),
    /// Every thread of the processes added with [`Probes::watch_process`] (and their children),
    /// rows accounted inside these ioctls only, one record per ioctl (`record`).
    Processes([abi::RecordIoctl; abi::MAX_RECORD_IOCTLS]),
}

/// What to attach, for which threads.
#[derive(Clone)]
pub struct Request<'a> {
    /// The threads the programs watch.
    pub watch: Watched,
    /// Sampling frequency (with [`Mechanism::Samples`]).
    pub freq_hz: u64,
    /// Mechanisms to use.
    pub mechanisms: &'a [Mechanism],
    /// Kernel symbols (probe-table rows are found there).
    pub symbols: Option<&'a KernelSymbols>,
    /// Testing: entries of the sampled-stack map (small values force lost samples).
    pub sample_map_entries: Option<u32>,
    /// Only these probe-table rows (indices); None: every row.
    pub rows: Option<&'a [usize]>,
}

/// One probe-table row this kernel has, and how it will be attached.
#[derive(Clone, Debug)]
struct RowPlan {
    row: usize,
    symbol: String,
    /// A single vmlinux function with BTF: fentry can bind to it.
    fentry_able: bool,
}

/// Loads the object with what it watches and the syscall numbers filled in. Without the
/// kernel's BTF: it would serve only CO-RE relocations, and the programs have none (Rust emits
/// no field-access relocations), while aya's loader would parse all of it once more.
fn load(watch: &Watched, sample_map_entries: Option<u32>) -> Result<Ebpf, AttachError> {
    let ignored: [i64; abi::IGNORED_SYSCALLS] = [libc::SYS_bpf, libc::SYS_clock_gettime];
    let (tid, by_process, ioctls) = match watch {
        Watched::Thread(tid) => (*tid, 0, [abi::RecordIoctl::default(); abi::MAX_RECORD_IOCTLS]),
        Watched::Processes(ioctls) => (0, 1, *ioctls),
    };
    let mode = abi::Watch {
        by_process,
        _reserved: 0,
    };
    let syscalls = abi::RecordSyscalls {
        ioctl: libc::SYS_ioctl,
        clones: [libc::SYS_clone, libc::SYS_fork, libc::SYS_vfork, libc::SYS_clone3],
        memory: [libc::SYS_mmap, libc::SYS_munmap, libc::SYS_madvise, libc::SYS_mremap],
    };
    let mut loader = EbpfLoader::new();
    loader
        .btf(None)
        .override_global(abi::TARGET_TID_GLOBAL, &tid, true)
        .override_global(abi::IGNORED_SYSCALL_GLOBAL, &ignored, true)
        .override_global(abi::WATCH_GLOBAL, &mode, true)
        .override_global(abi::RECORD_SYSCALLS_GLOBAL, &syscalls, true)
        .override_global(abi::RECORD_IOCTLS_GLOBAL, &ioctls, true);
    if let Some(n) = sample_map_entries {
        loader.map_max_entries(abi::maps::SAMPLES, n);
    }
    loader.load(BPF_OBJECT).map_err(AttachError::Load)
}

/// Why no probe-table row can be planned at all (None: some can).
fn rows_blocked(symbols: Option<&KernelSymbols>) -> Option<&'static str> {
    match symbols {
        Some(s) if s.usable() => None,
        Some(_) => Some("/proc/kallsyms addresses are hidden (kptr_restrict): run as root"),
        None => Some("kernel symbols unreadable (/proc/kallsyms)"),
    }
}

/// Plans the rows: finds each in the symbols and decides whether fentry can bind to it.
/// Rows that cannot be planned get their status here.
fn plan_rows(req: &Request, btf: Option<&Btf>, wanted: AttachedBy) -> (Vec<RowPlan>, Vec<ProbeStatus>) {
    let mut plans = Vec::new();
    let mut status = Vec::new();
    let selected = |i: &usize| req.rows.is_none_or(|r| r.contains(i));
    let symbols = match (rows_blocked(req.symbols), req.symbols) {
        (None, Some(s)) => Ok(s),
        (why, _) => Err(why.unwrap_or("kernel symbols unreadable (/proc/kallsyms)")),
    };
    for (i, row) in PROBE_TABLE.iter().enumerate().filter(|(i, _)| selected(i)) {
        let found = symbols.map(|s| s.lookup(row.function).first().map(|&(sym, addrs)| (sym, addrs.len())));
        match found {
            Ok(Some((symbol, n))) => plans.push(RowPlan {
                row: i,
                symbol: symbol.to_owned(),
                fentry_able: symbol == row.function
                    && n == 1
                    && btf.is_some_and(|b| b.id_by_type_name_kind(symbol, aya_obj::btf::BtfKind::Func).is_ok()),
            }),
            Ok(None) => status.push(not_attached(
                row.function,
                wanted,
                "not in /proc/kallsyms: inlined, renamed, or its module is not loaded",
            )),
            Err(why) => status.push(not_attached(row.function, wanted, why)),
        }
    }
    (plans, status)
}

fn not_attached(function: &str, mechanism: AttachedBy, why: impl Into<String>) -> ProbeStatus {
    ProbeStatus {
        function: function.to_owned(),
        mechanism,
        attached: false,
        error: Some(why.into()),
    }
}

/// Attaches probes to a loaded object, remembering which mechanism has been refused as a whole.
pub struct Attacher<'e> {
    ebpf: &'e mut Ebpf,
    btf: Option<Btf>,
    /// Why fentry cannot be used any more (None: it can).
    fentry_block: Option<String>,
    /// Why kprobes cannot be used (None: they can).
    kprobe_block: Option<String>,
    fentry_requested: bool,
    kprobes_requested: bool,
    next_slot: u32,
    hooks: Vec<Hook>,
}

impl<'e> Attacher<'e> {
    /// An attacher for `ebpf` with the row mechanisms `fentry` and `kprobes` allowed.
    pub fn new(ebpf: &'e mut Ebpf, btf: Option<Btf>, fentry: bool, kprobes: bool) -> Self {
        let btf = btf.filter(|_| fentry);
        let fentry_block = match (fentry, &btf) {
            (false, _) => Some("fentry not requested (--probes)".into()),
            (true, None) => Some("no kernel BTF (/sys/kernel/btf/vmlinux): fentry needs it".into()),
            (true, Some(_)) => None,
        };
        let mut this = Self {
            ebpf,
            btf,
            fentry_block,
            kprobe_block: None,
            fentry_requested: fentry,
            kprobes_requested: kprobes,
            next_slot: 0,
            hooks: Vec::new(),
        };
        this.kprobe_block = if !kprobes {
            Some("kprobes not requested (--probes)".into())
        } else if !kprobes_available() {
            Some("kernel has no kprobes (CONFIG_KPROBES off); fentry covers only vmlinux functions: run in `cargo xtask vm`".into())
        } else {
            this.load_kprobe_pair().err().map(|e| e.to_string())
        };
        this
    }

    /// Loads row_entry/row_exit (once; they attach to many functions).
    fn load_kprobe_pair(&mut self) -> Result<(), AttachError> {
        for name in [abi::programs::ROW_ENTRY, abi::programs::ROW_EXIT] {
            program::<KProbe>(self.ebpf, name)?
                .load()
                .map_err(|e| load_error("kprobe", &e))?;
        }
        Ok(())
    }

    /// kprobe + kretprobe on `symbol`; neither stays if one fails.
    pub fn kprobe_pair(&mut self, symbol: &str) -> Result<(), AttachError> {
        if let Some(why) = &self.kprobe_block {
            return Err(AttachError::Unavailable(why.clone()));
        }
        self.hook(Group::Rows, Target::Kprobe(symbol.to_owned()))
    }

    /// Links `target` now and keeps it as a hook of `group`.
    fn hook(&mut self, group: Group, target: Target) -> Result<(), AttachError> {
        let link = link(self.ebpf, &target)?;
        self.hooks.push(Hook {
            group,
            target,
            link: Some(link),
            row: None,
        });
        Ok(())
    }

    /// fentry + fexit on `symbol` in the next free slot; neither stays if one fails.
    pub fn fentry_pair(&mut self, symbol: &str) -> Result<(), AttachError> {
        if let Some(why) = &self.fentry_block {
            return Err(AttachError::Unavailable(why.clone()));
        }
        if self.next_slot >= abi::FENTRY_SLOTS {
            return Err(AttachError::Unavailable("all fentry slots in use".into()));
        }
        let slot = self.next_slot;
        self.next_slot += 1;
        let result = self
            .load_fentry_slot(slot, symbol)
            .and_then(|()| self.hook(Group::Rows, Target::Fentry(slot, symbol.to_owned())));
        if let Err(e) = &result
            && e.refuses_all()
        {
            self.fentry_block = Some(e.to_string());
        }
        result
    }

    /// Loads slot `slot`'s fentry and fexit programs for `symbol` (BTF binds them at load).
    fn load_fentry_slot(&mut self, slot: u32, symbol: &str) -> Result<(), AttachError> {
        load_fentry_slot(self.ebpf, self.btf.as_ref(), slot, symbol)
    }

    /// Records that the hook attached last measures `row` (so it can be demoted alone).
    fn mark_row(&mut self, row: usize, status: ProbeStatus) -> ProbeStatus {
        if let Some(h) = self.hooks.last_mut() {
            h.row = Some(row);
        }
        status
    }

    /// One planned row: fentry when it can bind and is allowed, else kprobes.
    fn row(&mut self, plan: &RowPlan) -> ProbeStatus {
        let function = PROBE_TABLE[plan.row].function;
        let attached = |mechanism| ProbeStatus {
            function: function.to_owned(),
            mechanism,
            attached: true,
            error: None,
        };
        let fentry_error = if plan.fentry_able {
            match self.fentry_pair(&plan.symbol) {
                Ok(()) => return self.mark_row(plan.row, attached(AttachedBy::Fentry)),
                Err(e) => Some(e.to_string()),
            }
        } else {
            None
        };
        match self.kprobe_pair(&plan.symbol) {
            Ok(()) => self.mark_row(plan.row, attached(AttachedBy::Kprobe)),
            Err(e) => {
                let first = match fentry_error {
                    Some(f) => f,
                    None if !self.fentry_requested => String::new(),
                    None if self.btf.is_some() && !plan.fentry_able => {
                        "module function or compiler clone (no fentry)".to_owned()
                    }
                    None => self.fentry_block.clone().unwrap_or_default(),
                };
                let (mechanism, why) = match (first.is_empty(), self.kprobes_requested) {
                    (true, _) => (AttachedBy::Kprobe, e.to_string()),
                    (false, false) => (AttachedBy::Fentry, first),
                    (false, true) => (AttachedBy::Kprobe, format!("{first}; {e}")),
                };
                not_attached(function, mechanism, why)
            }
        }
    }

    /// Loads and attaches one raw tracepoint.
    pub fn tracepoint(&mut self, prog: &'static str, event: &'static str, group: Group) -> Result<(), AttachError> {
        program::<RawTracePoint>(self.ebpf, prog)?
            .load()
            .map_err(|e| load_error("raw tracepoint", &e))?;
        self.hook(group, Target::Tracepoint(prog, event))
    }

    /// Loads the sampler and attaches it to thread `tid`'s CPU clock at `freq_hz`.
    pub fn sampler(&mut self, tid: u32, freq_hz: u64) -> Result<(), AttachError> {
        program::<PerfEvent>(self.ebpf, abi::programs::SAMPLE_STACK)?
            .load()
            .map_err(|e| load_error("perf_event", &e))?;
        let on = SampleOn::Thread(tid);
        self.hook(Group::Sampler, Target::Sampler { on, freq_hz })
    }

    /// Loads the sampler and attaches it to every online CPU's clock at `freq_hz`: watched
    /// processes have threads that come and go, so the program picks their samples itself.
    pub fn sampler_all_cpus(&mut self, freq_hz: u64) -> Result<(), AttachError> {
        program::<PerfEvent>(self.ebpf, abi::programs::SAMPLE_STACK)?
            .load()
            .map_err(|e| load_error("perf_event", &e))?;
        let cpus = aya::util::online_cpus().map_err(|(what, e)| AttachError::Unavailable(format!("{what}: {e}")))?;
        for cpu in cpus {
            self.hook(
                Group::Sampler,
                Target::Sampler {
                    on: SampleOn::Cpu(cpu),
                    freq_hz,
                },
            )?;
        }
        Ok(())
    }
}

/// Where a probe hooks into the kernel, kept so that it can be detached and attached again
/// between passes without being loaded (and verified) again.
#[derive(Clone, Debug)]
enum Target {
    /// row_entry + row_exit on a function.
    Kprobe(String),
    /// Fentry slot `.0` (loaded for function `.1`).
    Fentry(u32, String),
    /// A raw tracepoint program and its event.
    Tracepoint(&'static str, &'static str),
    /// The sampler on a CPU clock.
    Sampler {
        /// Whose clock.
        on: SampleOn,
        /// Frequency.
        freq_hz: u64,
    },
}

/// Whose CPU clock the sampler counts.
#[derive(Clone, Copy, Debug)]
enum SampleOn {
    /// One thread's, wherever it runs.
    Thread(u32),
    /// Everything on one CPU (the program keeps the watched processes' samples).
    Cpu(u32),
}

/// The kernel links of one attached [`Target`], with what of the target detaching needs (the
/// program names), so that a link can be detached without looking its target up again.
#[derive(Debug)]
enum Link {
    Kprobe(KProbeLinkId, KProbeLinkId),
    /// Fentry slot `.0`'s entry and exit links.
    Fentry(u32, FEntryLinkId, FExitLinkId),
    /// Raw tracepoint program `.0`'s link.
    Tracepoint(&'static str, RawTracePointLinkId),
    Sampler(PerfEventLinkId),
}

/// One probe, its group, and its links while attached.
#[derive(Debug)]
struct Hook {
    group: Group,
    target: Target,
    link: Option<Link>,
    /// The probe-table row it measures, for row hooks.
    row: Option<usize>,
}

/// Loads slot `slot`'s fentry and fexit programs for `symbol` (BTF binds them at load).
fn load_fentry_slot(ebpf: &mut Ebpf, btf: Option<&Btf>, slot: u32, symbol: &str) -> Result<(), AttachError> {
    let btf = btf.ok_or_else(|| AttachError::Unavailable("no kernel BTF".into()))?;
    if slot >= abi::FENTRY_SLOTS {
        return Err(AttachError::Unavailable("all fentry slots in use".into()));
    }
    let (entry, exit) = fentry_names(slot);
    program::<FEntry>(ebpf, &entry)?
        .load(symbol, btf)
        .map_err(|e| load_error("fentry", &e))?;
    program::<FExit>(ebpf, &exit)?
        .load(symbol, btf)
        .map_err(|e| load_error("fexit", &e))
}

fn fentry_names(slot: u32) -> (String, String) {
    (
        format!("{}{slot}", abi::programs::ROW_FENTRY_PREFIX),
        format!("{}{slot}", abi::programs::ROW_FEXIT_PREFIX),
    )
}

fn attach_error(what: &'static str, target: &str) -> impl FnOnce(ProgramError) -> AttachError {
    move |e| AttachError::ProgramAttach {
        what,
        target: target.to_owned(),
        reason: chain(&e),
    }
}

/// Attaches a loaded target; of a pair, neither stays if one fails.
fn link(ebpf: &mut Ebpf, target: &Target) -> Result<Link, AttachError> {
    match target {
        Target::Kprobe(symbol) => {
            let entry = program::<KProbe>(ebpf, abi::programs::ROW_ENTRY)?
                .attach(symbol, 0)
                .map_err(attach_error("kprobe", symbol))?;
            match program::<KProbe>(ebpf, abi::programs::ROW_EXIT)?.attach(symbol, 0) {
                Ok(exit) => Ok(Link::Kprobe(entry, exit)),
                Err(e) => {
                    let _ = program::<KProbe>(ebpf, abi::programs::ROW_ENTRY)?.detach(entry);
                    Err(attach_error("kretprobe", symbol)(e))
                }
            }
        }
        Target::Fentry(slot, symbol) => {
            let (entry_name, exit_name) = fentry_names(*slot);
            let entry = program::<FEntry>(ebpf, &entry_name)?
                .attach()
                .map_err(attach_error("fentry", symbol))?;
            match program::<FExit>(ebpf, &exit_name)?.attach() {
                Ok(exit) => Ok(Link::Fentry(*slot, entry, exit)),
                Err(e) => {
                    let _ = program::<FEntry>(ebpf, &entry_name)?.detach(entry);
                    Err(attach_error("fexit", symbol)(e))
                }
            }
        }
        Target::Tracepoint(prog, event) => program::<RawTracePoint>(ebpf, prog)?
            .attach(event)
            .map(|id| Link::Tracepoint(prog, id))
            .map_err(attach_error("raw tracepoint", event)),
        Target::Sampler { on, freq_hz } => {
            let (scope, what) = match *on {
                SampleOn::Thread(tid) => (
                    PerfEventScope::OneProcess { pid: tid, cpu: None },
                    format!("thread {tid}"),
                ),
                SampleOn::Cpu(cpu) => (PerfEventScope::AllProcessesOneCpu { cpu }, format!("cpu {cpu}")),
            };
            program::<PerfEvent>(ebpf, abi::programs::SAMPLE_STACK)?
                .attach(
                    PerfEventConfig::Software(SoftwareEvent::CpuClock),
                    scope,
                    SamplePolicy::Frequency(*freq_hz),
                    false,
                )
                .map(Link::Sampler)
                .map_err(attach_error("perf_event", &format!("cpu-clock of {what}")))
        }
    }
}

/// A link taken out of its program: dropping it detaches it.
#[expect(dead_code, reason = "the links are held only to be dropped")]
enum Taken {
    Kprobe(KProbeLink, KProbeLink),
    Fentry(FEntryLink, FExitLink),
    Tracepoint(RawTracePointLink),
    Sampler(PerfEventLink),
}

/// Takes `link` out of its programs, to be detached by dropping it ([`detach_all`]).
fn unlink(ebpf: &mut Ebpf, target: &Target, link: Link) -> Result<Taken, AttachError> {
    let detach_err = |e: ProgramError| AttachError::ProgramAttach {
        what: "detach",
        target: format!("{target:?}"),
        reason: chain(&e),
    };
    Ok(match link {
        Link::Kprobe(entry, exit) => Taken::Kprobe(
            program::<KProbe>(ebpf, abi::programs::ROW_ENTRY)?
                .take_link(entry)
                .map_err(detach_err)?,
            program::<KProbe>(ebpf, abi::programs::ROW_EXIT)?
                .take_link(exit)
                .map_err(detach_err)?,
        ),
        Link::Fentry(slot, entry, exit) => {
            let (entry_name, exit_name) = fentry_names(slot);
            Taken::Fentry(
                program::<FEntry>(ebpf, &entry_name)?
                    .take_link(entry)
                    .map_err(detach_err)?,
                program::<FExit>(ebpf, &exit_name)?
                    .take_link(exit)
                    .map_err(detach_err)?,
            )
        }
        Link::Tracepoint(prog, id) => Taken::Tracepoint(
            program::<RawTracePoint>(ebpf, prog)?
                .take_link(id)
                .map_err(detach_err)?,
        ),
        Link::Sampler(id) => Taken::Sampler(
            program::<PerfEvent>(ebpf, abi::programs::SAMPLE_STACK)?
                .take_link(id)
                .map_err(detach_err)?,
        ),
    })
}

/// Threads that drop taken links at once.
const DETACH_THREADS: usize = 8;

/// Detaches `links` by dropping them from several threads at once: removing a kprobe waits for
/// an RCU grace period, about 65 ms under TCG, and waits that run side by side share their
/// grace periods (22 kprobe/kretprobe pairs took 2.8-3.0 s one after another).
fn detach_all(links: Vec<Taken>) {
    if links.len() < 2 {
        return drop(links);
    }
    let mut shares: Vec<Vec<Taken>> = (0..DETACH_THREADS).map(|_| Vec::new()).collect();
    for (i, l) in links.into_iter().enumerate() {
        shares[i % DETACH_THREADS].push(l);
    }
    std::thread::scope(|s| {
        for share in shares.into_iter().filter(|v| !v.is_empty()) {
            s.spawn(move || drop(share));
        }
    });
}

/// An error with its sources, on one line.
pub fn chain(e: &dyn std::error::Error) -> String {
    let mut s = e.to_string();
    let mut cur = e.source();
    while let Some(c) = cur {
        s.push_str(": ");
        s.push_str(&c.to_string());
        cur = c.source();
    }
    s
}

/// Whether this kernel has kprobes at all (the kprobe PMU).
pub fn kprobes_available() -> bool {
    std::path::Path::new("/sys/bus/event_source/devices/kprobe/type").exists()
}

/// The map from a probed function's entry address to its row.
fn row_by_ip(ebpf: &mut Ebpf) -> Result<HashMap<&mut aya::maps::MapData, u64, RowConfig>, AttachError> {
    ebpf.map_mut(abi::maps::ROW_BY_IP)
        .ok_or_else(|| AttachError::Missing(format!("map {}", abi::maps::ROW_BY_IP)))
        .and_then(|m| {
            HashMap::try_from(m).map_err(|source| AttachError::Map {
                what: "ROW_BY_IP",
                source,
            })
        })
}

/// The index a recorded call's per-category time is kept under: the category's place in
/// [`CATEGORIES`].
pub fn category_index(c: Category) -> u32 {
    CATEGORIES.iter().position(|&x| x == c).unwrap_or(CATEGORIES.len() - 1) as u32
}

/// Fills ROW_BY_IP so the row programs know which row an entry address belongs to.
fn register_rows(ebpf: &mut Ebpf, symbols: &KernelSymbols, plans: &[RowPlan]) -> Result<(), AttachError> {
    let mut by_ip = row_by_ip(ebpf)?;
    for plan in plans {
        let row = &PROBE_TABLE[plan.row];
        let cfg = RowConfig {
            row: plan.row as u32,
            amount_arg: row.amount.map_or(-1, |(a, _)| i32::from(a)),
            category: category_index(row.category()),
            _reserved: 0,
        };
        for (_, addrs) in symbols.lookup(row.function).iter().filter(|(s, _)| *s == plan.symbol) {
            for a in *addrs {
                by_ip.insert(*a, cfg, 0).map_err(|source| AttachError::Map {
                    what: "ROW_BY_IP insert",
                    source,
                })?;
            }
        }
    }
    Ok(())
}

/// Attaches the probe-table rows the request selects.
/// What attaching the rows leaves for later attaches: the kernel BTF and the next free fentry
/// slot.
struct RowsLeft {
    btf: Option<Btf>,
    next_slot: u32,
}

fn attach_rows(
    ebpf: &mut Ebpf,
    btf: Option<Btf>,
    req: &Request,
) -> Result<(Vec<ProbeStatus>, Vec<Hook>, RowsLeft), AttachError> {
    let (fentry, kprobes) = (
        req.mechanisms.contains(&Mechanism::Fentry),
        req.mechanisms.contains(&Mechanism::Kprobes),
    );
    let wanted = if fentry { AttachedBy::Fentry } else { AttachedBy::Kprobe };
    if !fentry && !kprobes {
        let selected = |i: &usize| req.rows.is_none_or(|r| r.contains(i));
        let status = PROBE_TABLE
            .iter()
            .enumerate()
            .filter(|(i, _)| selected(i))
            .map(|(_, r)| not_attached(r.function, AttachedBy::Kprobe, NOT_REQUESTED))
            .collect();
        return Ok((status, Vec::new(), RowsLeft { btf, next_slot: 0 }));
    }
    let mut attacher = Attacher::new(ebpf, btf, fentry, kprobes);
    let (plans, mut status) = plan_rows(req, attacher.btf.as_ref(), wanted);
    if let Some(symbols) = req.symbols {
        register_rows(attacher.ebpf, symbols, &plans)?;
    }
    status.extend(plans.iter().map(|p| attacher.row(p)));
    let left = RowsLeft {
        btf: attacher.btf.take(),
        next_slot: attacher.next_slot,
    };
    Ok((status, attacher.hooks, left))
}

/// Attaches the tracepoints and the sampler the request selects.
fn attach_events(ebpf: &mut Ebpf, req: &Request) -> (Vec<ProbeStatus>, Vec<Hook>) {
    let mut attacher = Attacher::new(ebpf, None, false, false);
    let mut status = Vec::new();
    for tp in TRACEPOINTS {
        let result = if req.mechanisms.contains(&Mechanism::Tracepoints) {
            attacher
                .tracepoint(tp.program, tp.event, tp.group)
                .map_err(|e| e.to_string())
        } else {
            Err(NOT_REQUESTED.into())
        };
        status.push(ProbeStatus {
            function: format!("{}:{}", tp.category, tp.event),
            mechanism: AttachedBy::RawTracepoint,
            attached: result.is_ok(),
            error: result.err(),
        });
    }
    let sampler = match req.watch {
        _ if !req.mechanisms.contains(&Mechanism::Samples) => Err(NOT_REQUESTED.into()),
        Watched::Thread(tid) => attacher.sampler(tid, req.freq_hz).map_err(|e| e.to_string()),
        Watched::Processes(_) => attacher.sampler_all_cpus(req.freq_hz).map_err(|e| e.to_string()),
    };
    status.push(ProbeStatus {
        function: format!("cpu-clock@{}Hz", req.freq_hz),
        mechanism: AttachedBy::PerfEvent,
        attached: sampler.is_ok(),
        error: sampler.err(),
    });
    (status, attacher.hooks)
}

/// The BPF object loaded, nothing attached yet, with the kernel's BTF fentry binds by.
pub struct Loaded {
    ebpf: Ebpf,
    btf: Option<Btf>,
}

/// Loads the object for `watch`, parsing the kernel's BTF (fentry binds by it) on another
/// thread meanwhile when `rows` are to be attached.
pub fn load_object(watch: &Watched, sample_map_entries: Option<u32>, rows: bool) -> Result<Loaded, AttachError> {
    std::thread::scope(|s| {
        let btf = s.spawn(move || rows.then(|| Btf::from_sys_fs().ok()).flatten());
        let ebpf = load(watch, sample_map_entries);
        let btf = btf.join().ok().flatten();
        Ok(Loaded { ebpf: ebpf?, btf })
    })
}

/// Plans, loads and attaches what `req` asks for, and returns the activated probes. A probe
/// that cannot attach is recorded in `status`; only a failed load is an error.
pub fn attach(req: &Request) -> Result<Probes, AttachError> {
    let rows = req.rows.is_none_or(|r| !r.is_empty());
    attach_loaded(load_object(&req.watch, req.sample_map_entries, rows)?, req)
}

/// Attaches what `req` asks for to an object [`load_object`] loaded for `req.watch`.
pub fn attach_loaded(loaded: Loaded, req: &Request) -> Result<Probes, AttachError> {
    let Loaded { mut ebpf, btf } = loaded;
    let (mut status, mut hooks, left) = attach_rows(&mut ebpf, btf, req)?;
    let (events, event_hooks) = attach_events(&mut ebpf, req);
    status.extend(events);
    hooks.extend(event_hooks);
    Probes::activate(ebpf, status, hooks, left)
}

/// One sampled stack and how often it was seen.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct RawSample {
    /// Phase slot.
    pub slot: u32,
    /// Kernel frame addresses, leaf first (empty: sample in user mode).
    pub kernel: Vec<u64>,
    /// The sample interrupted a page clear: a `rep stos` storing zeroes up to a page boundary
    /// (see [`crate::symbols::sample_frames`]).
    pub page_clear: bool,
    /// Number of samples with this stack.
    pub count: u64,
}

/// What one case's probes recorded.
#[derive(Clone, Debug, Default)]
pub struct Drained {
    /// Counters per phase slot (only slots with any activity).
    pub counters: Vec<(u32, PhaseCounters)>,
    /// Sampled stacks.
    pub samples: Vec<RawSample>,
    /// Exact per-row stats: (slot, row index, stats), only non-zero ones.
    pub rows: Vec<(u32, usize, RowStats)>,
}

/// The sampler's two stack maps, one map of two-stack buckets ([`abi::SPILLED_STACK`]).
struct Stacks {
    first: StackTraceMap<MapData>,
    spilled: StackTraceMap<MapData>,
}

impl Stacks {
    /// The map and the id in it of a sample key's stack id (None: the sample has no stack).
    fn at(&mut self, id: i32) -> Option<(&mut StackTraceMap<MapData>, u32)> {
        match id {
            abi::SPILLED_STACK.. => Some((&mut self.spilled, (id - abi::SPILLED_STACK) as u32)),
            0.. => Some((&mut self.first, id as u32)),
            _ => None,
        }
    }

    /// The call chain of stack `id`, innermost first (empty when it is gone).
    fn chain(&mut self, id: i32) -> Vec<u64> {
        self.at(id)
            .and_then(|(map, id)| map.get(&id, 0).ok())
            .map(|st| st.frames().iter().map(|f| f.ip).collect())
            .unwrap_or_default()
    }

    /// Frees stack `id` for other stacks.
    fn remove(&mut self, id: i32) {
        if let Some((map, id)) = self.at(id) {
            let _ = map.remove(&id);
        }
    }
}

/// The loaded and attached probes for one workload thread.
pub struct Probes {
    ebpf: Ebpf,
    control: Array<MapData, Control>,
    counters: Array<MapData, PhaseCounters>,
    samples: HashMap<MapData, SampleKey, u64>,
    stacks: Stacks,
    row_stats: Array<MapData, RowStats>,
    logger: Option<aya_log::EbpfLogger<crate::bpflog::BpfLog>>,
    hooks: Vec<Hook>,
    /// What attached and what did not.
    pub status: Vec<ProbeStatus>,
    left: RowsLeft,
    /// The probe on the calibration function while it is measured.
    calibration: Option<Hook>,
    /// The row configurations the calibration probe displaced (its function may be a row's),
    /// put back when it is detached.
    displaced: Vec<(u64, RowConfig)>,
    /// Rows kept detached (see [`Probes::set_demoted`]).
    demoted: Vec<usize>,
    /// Rows the current case cannot reach (see [`Probes::set_case`]).
    unreached: Vec<usize>,
}

impl Probes {
    /// Takes the maps user space reads and starts forwarding the programs' log records.
    fn activate(
        mut ebpf: Ebpf,
        status: Vec<ProbeStatus>,
        hooks: Vec<Hook>,
        left: RowsLeft,
    ) -> Result<Self, AttachError> {
        let logger = aya_log::EbpfLogger::init_with_logger(&mut ebpf, crate::bpflog::BpfLog).ok();
        let mut take = |name: &'static str| {
            ebpf.take_map(name)
                .ok_or_else(|| AttachError::Missing(format!("map {name}")))
        };
        let map_err = |what| move |source| AttachError::Map { what, source };
        let control = Array::try_from(take(abi::maps::CONTROL)?).map_err(map_err("CONTROL"))?;
        let counters = Array::try_from(take(abi::maps::PHASE_COUNTERS)?).map_err(map_err("PHASE_COUNTERS"))?;
        let samples = HashMap::try_from(take(abi::maps::SAMPLES)?).map_err(map_err("SAMPLES"))?;
        let stacks = Stacks {
            first: StackTraceMap::try_from(take(abi::maps::STACKS)?).map_err(map_err("STACKS"))?,
            spilled: StackTraceMap::try_from(take(abi::maps::SPILLED_STACKS)?).map_err(map_err("SPILLED_STACKS"))?,
        };
        let row_stats = Array::try_from(take(abi::maps::ROW_STATS)?).map_err(map_err("ROW_STATS"))?;
        Ok(Self {
            ebpf,
            control,
            counters,
            samples,
            stacks,
            row_stats,
            logger,
            hooks,
            status,
            left,
            calibration: None,
            displaced: Vec::new(),
            demoted: Vec::new(),
            unreached: Vec::new(),
        })
    }

    /// Keeps attached exactly the probes of `groups` (a pass's set): detaches the others and
    /// attaches again what a previous pass detached. Nothing is loaded again. Returns whether
    /// any probe was attached or detached.
    pub fn set_groups(&mut self, groups: &[Group]) -> Result<bool, AttachError> {
        let mut changed = false;
        let mut taken = Vec::new();
        for hook in &mut self.hooks {
            let kept_off = hook
                .row
                .is_some_and(|r| self.demoted.contains(&r) || self.unreached.contains(&r));
            let wanted = groups.contains(&hook.group) && !kept_off;
            match hook.link.take() {
                Some(l) if !wanted => match unlink(&mut self.ebpf, &hook.target, l) {
                    Ok(t) => taken.push(t),
                    Err(e) => {
                        detach_all(taken);
                        return Err(e);
                    }
                },
                Some(l) => {
                    hook.link = Some(l);
                    continue;
                }
                None if wanted => hook.link = Some(link(&mut self.ebpf, &hook.target)?),
                None => continue,
            }
            changed = true;
        }
        detach_all(taken);
        Ok(changed)
    }

    /// Whether any probe-table row is attached now.
    pub fn rows_linked(&self) -> bool {
        self.hooks.iter().any(|h| h.group == Group::Rows && h.link.is_some())
    }

    /// Leaves rows `rows` (indices into [`PROBE_TABLE`]) detached from the next
    /// [`Probes::set_groups`] on, even in a group that is attached: their hits would cost more
    /// than the phase can carry. An empty list attaches every row again.
    pub fn set_demoted(&mut self, rows: &[usize]) {
        self.demoted = rows.to_vec();
    }

    /// From the next [`Probes::set_groups`] on, attaches only the rows a case of `mode` (None:
    /// memory phases only) can reach ([`crate::probes::Reach`]).
    pub fn set_case(&mut self, mode: Option<DmaMode>) {
        self.unreached = PROBE_TABLE
            .iter()
            .enumerate()
            .filter(|(_, r)| !r.reach.reached_by(mode))
            .map(|(i, _)| i)
            .collect();
    }

    /// The rows that attached (indices into [`PROBE_TABLE`]) and how; for a case, those it
    /// can reach.
    pub fn attached_rows(&self) -> Vec<(usize, AttachedBy)> {
        PROBE_TABLE
            .iter()
            .enumerate()
            .filter(|(i, _)| !self.unreached.contains(i))
            .filter_map(|(i, r)| {
                let s = self.status.iter().find(|s| s.function == r.function && s.attached)?;
                Some((i, s.mechanism))
            })
            .collect()
    }

    /// Starts recording into phase slot `slot` (0 stops recording).
    pub fn set_phase(&mut self, slot: u32) -> Result<(), AttachError> {
        self.control
            .set(
                0,
                Control {
                    phase: slot,
                    _reserved: 0,
                },
                0,
            )
            .map_err(|source| AttachError::Map {
                what: "CONTROL update",
                source,
            })
    }

    /// Forwards the programs' pending log records (shown with `--debug`).
    pub fn flush_log(&mut self) {
        if let Some(l) = self.logger.as_mut() {
            l.flush();
        }
    }

    /// Reads and clears everything recorded in slots `1..slots`.
    pub fn drain(&mut self, slots: u32) -> Result<Drained, AttachError> {
        self.flush_log();
        let map_err = |what| move |source| AttachError::Map { what, source };
        let mut out = self.peek(1..slots)?;
        for (slot, _) in &out.counters {
            self.counters
                .set(*slot, PhaseCounters::default(), 0)
                .map_err(map_err("PHASE_COUNTERS reset"))?;
        }
        for (slot, row, _) in &out.rows {
            self.row_stats
                .set(slot * abi::MAX_ROWS + *row as u32, RowStats::default(), 0)
                .map_err(map_err("ROW_STATS reset"))?;
        }
        out.samples = self.drain_samples()?;
        Ok(out)
    }

    /// Reads the counters and the attached rows' stats recorded in `slots`, leaving them
    /// there (no samples).
    pub fn peek(&self, slots: std::ops::Range<u32>) -> Result<Drained, AttachError> {
        let map_err = |what| move |source| AttachError::Map { what, source };
        let slots = slots.start..slots.end.min(abi::MAX_PHASES);
        let mut out = Drained::default();
        for slot in slots.clone() {
            let c = self.counters.get(&slot, 0).map_err(map_err("PHASE_COUNTERS read"))?;
            if c != PhaseCounters::default() {
                out.counters.push((slot, c));
            }
        }
        let rows: Vec<usize> = self.attached_rows().into_iter().map(|(r, _)| r).collect();
        for slot in slots {
            for &row in &rows {
                let st = self
                    .row_stats
                    .get(&(slot * abi::MAX_ROWS + row as u32), 0)
                    .map_err(map_err("ROW_STATS read"))?;
                if st != RowStats::default() {
                    out.rows.push((slot, row, st));
                }
            }
        }
        Ok(out)
    }

    fn drain_samples(&mut self) -> Result<Vec<RawSample>, AttachError> {
        let keys: Vec<SampleKey> =
            self.samples
                .keys()
                .collect::<Result<_, _>>()
                .map_err(|source| AttachError::Map {
                    what: "SAMPLES keys",
                    source,
                })?;
        let mut stack_ids = HashSet::new();
        let mut out = Vec::new();
        for key in keys {
            let Ok(count) = self.samples.get(&key, 0) else { continue };
            // The stack maps hold the call chain; the key, the interrupted instruction.
            let kernel = match key.kernel_stack {
                abi::NO_CALLER => vec![key.ip],
                id if id >= 0 => {
                    stack_ids.insert(id);
                    let chain = self.stacks.chain(id);
                    std::iter::once(key.ip).chain(chain).collect()
                }
                _ => Vec::new(),
            };
            out.push(RawSample {
                slot: key.phase,
                kernel,
                page_clear: key.leaf == abi::LEAF_PAGE_CLEAR,
                count,
            });
            let _ = self.samples.remove(&key);
        }
        for id in stack_ids {
            self.stacks.remove(id);
        }
        Ok(out)
    }

    /// Attaches the row programs to `symbol` by `by` (fentry or kprobe), accounted as row
    /// [`CALIBRATION_ROW`], replacing an earlier calibration probe. Recording needs
    /// `set_phase(CALIBRATION_SLOT)`.
    pub fn attach_calibration(
        &mut self,
        symbols: &KernelSymbols,
        symbol: &str,
        by: AttachedBy,
    ) -> Result<(), AttachError> {
        self.detach_calibration()?;
        let mut by_ip = row_by_ip(&mut self.ebpf)?;
        let cfg = RowConfig {
            row: CALIBRATION_ROW,
            amount_arg: -1,
            category: category_index(Category::Other),
            _reserved: 0,
        };
        for (_, addrs) in symbols.lookup(symbol).iter().filter(|(s, _)| *s == symbol) {
            for a in *addrs {
                if let Ok(row) = by_ip.get(a, 0) {
                    self.displaced.push((*a, row));
                }
                by_ip.insert(*a, cfg, 0).map_err(|source| AttachError::Map {
                    what: "ROW_BY_IP insert",
                    source,
                })?;
            }
        }
        let target = match by {
            AttachedBy::Fentry => {
                let slot = self.left.next_slot;
                load_fentry_slot(&mut self.ebpf, self.left.btf.as_ref(), slot, symbol)?;
                self.left.next_slot += 1;
                Target::Fentry(slot, symbol.to_owned())
            }
            _ => Target::Kprobe(symbol.to_owned()),
        };
        let link = link(&mut self.ebpf, &target)?;
        self.calibration = Some(Hook {
            group: Group::Rows,
            target,
            link: Some(link),
            row: None,
        });
        Ok(())
    }

    /// Detaches the calibration probe, if any, and gives back the rows it displaced and the
    /// fentry slot it took (the calibration measures more than one function, and the rows
    /// leave few slots).
    pub fn detach_calibration(&mut self) -> Result<(), AttachError> {
        if let Some(mut hook) = self.calibration.take() {
            if let Some(l) = hook.link.take() {
                drop(unlink(&mut self.ebpf, &hook.target, l)?);
            }
            if let Target::Fentry(slot, symbol) = &hook.target {
                let (entry, exit) = fentry_names(*slot);
                let unload_err = |e: ProgramError| AttachError::ProgramAttach {
                    what: "unload",
                    target: symbol.clone(),
                    reason: chain(&e),
                };
                program::<FEntry>(&mut self.ebpf, &entry)?
                    .unload()
                    .map_err(unload_err)?;
                program::<FExit>(&mut self.ebpf, &exit)?.unload().map_err(unload_err)?;
                if *slot + 1 == self.left.next_slot {
                    self.left.next_slot -= 1;
                }
            }
        }
        if !self.displaced.is_empty() {
            let mut by_ip = row_by_ip(&mut self.ebpf)?;
            for (ip, row) in self.displaced.drain(..) {
                by_ip.insert(ip, row, 0).map_err(|source| AttachError::Map {
                    what: "ROW_BY_IP insert",
                    source,
                })?;
            }
        }
        Ok(())
    }

    /// Links (`on`) or unlinks the calibration probe [`Probes::attach_calibration`] attached,
    /// without loading it again: where no unprobed call can be timed beside a probed one (every
    /// page fault reaches the probed function), rounds time the same work by turns.
    pub fn link_calibration(&mut self, on: bool) -> Result<(), AttachError> {
        let Some(hook) = self.calibration.as_mut() else {
            return Err(AttachError::Unavailable("no calibration probe attached".into()));
        };
        match (on, hook.link.take()) {
            (true, None) => hook.link = Some(link(&mut self.ebpf, &hook.target)?),
            (false, Some(l)) => drop(unlink(&mut self.ebpf, &hook.target, l)?),
            (_, l) => hook.link = l,
        }
        Ok(())
    }

    /// Drops what slot `slot` recorded: its counters, the attached rows' stats and its samples.
    pub fn discard_slot(&mut self, slot: u32) -> Result<(), AttachError> {
        let map_err = |what| move |source| AttachError::Map { what, source };
        self.counters
            .set(slot, PhaseCounters::default(), 0)
            .map_err(map_err("PHASE_COUNTERS reset"))?;
        for (row, _) in self.attached_rows() {
            self.row_stats
                .set(slot * abi::MAX_ROWS + row as u32, RowStats::default(), 0)
                .map_err(map_err("ROW_STATS reset"))?;
        }
        let keys: Vec<SampleKey> = self.samples.keys().filter_map(Result::ok).collect();
        let (dropped, kept): (Vec<SampleKey>, Vec<SampleKey>) = keys.into_iter().partition(|k| k.phase == slot);
        for key in &dropped {
            let _ = self.samples.remove(key);
        }
        // A stack another slot's samples share stays for the next drain.
        let kept: HashSet<i32> = kept.iter().map(|k| k.kernel_stack).collect();
        for key in dropped.iter().filter(|k| !kept.contains(&k.kernel_stack)) {
            self.stacks.remove(key.kernel_stack);
        }
        Ok(())
    }

    /// Reads and clears what the calibration row recorded in [`CALIBRATION_SLOT`].
    pub fn take_calibration_stats(&mut self) -> Result<RowStats, AttachError> {
        let map_err = |what| move |source| AttachError::Map { what, source };
        let idx = CALIBRATION_SLOT * abi::MAX_ROWS + CALIBRATION_ROW;
        let st = self.row_stats.get(&idx, 0).map_err(map_err("ROW_STATS read"))?;
        self.row_stats
            .set(idx, RowStats::default(), 0)
            .map_err(map_err("ROW_STATS reset"))?;
        self.counters
            .set(CALIBRATION_SLOT, PhaseCounters::default(), 0)
            .map_err(map_err("PHASE_COUNTERS reset"))?;
        Ok(st)
    }

    /// Watches every thread of process `pid` (with [`Watched::Processes`]).
    pub fn watch_process(&mut self, pid: u32) -> Result<(), AttachError> {
        self.watched()?.insert(pid, 1, 0).map_err(|source| AttachError::Map {
            what: "WATCHED insert",
            source,
        })
    }

    /// Stops watching process `pid`.
    pub fn unwatch_process(&mut self, pid: u32) -> Result<(), AttachError> {
        match self.watched()?.remove(&pid) {
            Ok(()) | Err(aya::maps::MapError::KeyNotFound) => Ok(()),
            Err(source) => Err(AttachError::Map {
                what: "WATCHED remove",
                source,
            }),
        }
    }

    fn watched(&mut self) -> Result<HashMap<&mut MapData, u32, u8>, AttachError> {
        let map = self
            .ebpf
            .map_mut(abi::maps::WATCHED)
            .ok_or_else(|| AttachError::Missing(format!("map {}", abi::maps::WATCHED)))?;
        HashMap::try_from(map).map_err(|source| AttachError::Map {
            what: "WATCHED",
            source,
        })
    }

    /// The ring buffer the recorded calls arrive in (taken once).
    pub fn take_calls(&mut self) -> Result<RingBuf<MapData>, AttachError> {
        let map = self
            .ebpf
            .take_map(abi::maps::CALLS)
            .ok_or_else(|| AttachError::Missing(format!("map {}", abi::maps::CALLS)))?;
        RingBuf::try_from(map).map_err(|source| AttachError::Map { what: "CALLS", source })
    }

    /// Recorded calls the ring buffer had no room for, so far.
    pub fn lost_calls(&mut self) -> Result<u64, AttachError> {
        let map_err = |what| move |source| AttachError::Map { what, source };
        let map = self
            .ebpf
            .map(abi::maps::LOST_CALLS)
            .ok_or_else(|| AttachError::Missing(format!("map {}", abi::maps::LOST_CALLS)))?;
        let lost: PerCpuArray<&MapData, u64> = PerCpuArray::try_from(map).map_err(map_err("LOST_CALLS"))?;
        Ok(lost.get(&0, 0).map_err(map_err("LOST_CALLS read"))?.iter().sum())
    }

    /// The loaded object (for tests and doctor's checks).
    pub fn ebpf(&mut self) -> &mut Ebpf {
        &mut self.ebpf
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn verifier_logs_shrink_to_their_reason() {
        let e = "the BPF_PROG_LOAD syscall failed. Verifier output: 0: (b7) r0 = 0\n\
                 R1 invalid mem access 'scalar'\nprocessed 12 insns (limit 1000000)";
        assert_eq!(
            one_line(&e),
            "the BPF_PROG_LOAD syscall failed verifier: R1 invalid mem access 'scalar'"
        );
        assert_eq!(one_line(&"plain error\nsecond line"), "plain error");
    }

    #[test]
    fn rows_without_symbols_say_why() {
        let req = Request {
            watch: Watched::Thread(1),
            freq_hz: 1,
            mechanisms: &Mechanism::ALL,
            symbols: None,
            sample_map_entries: None,
            rows: Some(&[0, 3]),
        };
        let (plans, status) = plan_rows(&req, None, AttachedBy::Fentry);
        assert!(plans.is_empty());
        assert_eq!(status.len(), 2);
        assert!(
            status
                .iter()
                .all(|s| !s.attached && s.error.as_deref().unwrap().contains("kallsyms"))
        );
    }
}
