//! `dmaprof record`: watches the DMA map and unmap ioctls of other processes (given by pid, or
//! a command it starts) through the same probes as `run`, filtered by process instead of by
//! thread, and writes one record per ioctl with its exact breakdown.
use std::{
    path::{Path, PathBuf},
    time::{Duration, Instant},
};

use strum::IntoEnumIterator as _;

use crate::{
    abi::{self, DmaCall, PhaseCounters, RecordIoctl},
    attribution,
    category::CategoryCounts,
    dma::DmaIoctl,
    flamegraph::Folded,
    kernel,
    launch::{self, Held, LaunchError},
    loader::{self, AttachError, Drained, Probes, Request, Watched},
    output::{self, OutDir, OutputError},
    privileges,
    probes::{AttachedBy, Mechanism, PROBE_TABLE, ProbeStatus},
    recording::{self, Call, MemorySyscalls, Process, RecordReport, RecordSampled, RowTotal},
    report::Sampled,
    stop::{Control, Stage, Supervisor},
    symbols::KernelSymbols,
    sys,
};

/// How often the ring buffer is read and the processes are checked.
const POLL: Duration = Duration::from_millis(20);

/// The phase slot `record` accounts its rows in (it has no phases).
const RECORD_SLOT: u32 = 1;

/// What to record.
#[derive(Clone, Debug)]
pub struct RecordOptions {
    /// Processes to watch (with `command` empty).
    pub pids: Vec<u32>,
    /// The command to start and watch (with `pids` empty).
    pub command: Vec<String>,
    /// Stop after this long.
    pub duration: Option<Duration>,
    /// Output directory.
    pub out: PathBuf,
    /// Mechanisms for the probe-table rows, tracepoints and sampling.
    pub mechanisms: Vec<Mechanism>,
    /// Sampling frequency per CPU, Hz.
    pub freq_hz: u64,
}

/// Why a recording could not start or finish.
#[derive(Debug, thiserror::Error)]
pub enum RecordError {
    /// Bad options or a process that does not exist (exit code 2).
    #[error("{0}")]
    Usage(String),
    /// The command could not be started.
    #[error(transparent)]
    Launch(#[from] LaunchError),
    /// Probes could not be loaded.
    #[error(transparent)]
    Attach(#[from] AttachError),
    /// Output could not be written.
    #[error(transparent)]
    Output(#[from] OutputError),
    /// The signal runtime or the recording thread could not start, or the thread panicked.
    #[error("{0}")]
    Runtime(String),
}

impl RecordError {
    /// Whether the user should fix their command line (exit code 2).
    pub fn is_usage(&self) -> bool {
        matches!(
            self,
            RecordError::Usage(_) | RecordError::Launch(LaunchError::Exec { .. } | LaunchError::Command(_))
        )
    }
}

/// Records as `opts` say, on a thread of its own while this one handles stop signals
/// (registered before anything changes). Returns the report, where it was written, and the
/// stop signal that ended the recording (0: none).
pub fn supervised(opts: RecordOptions) -> Result<(RecordReport, PathBuf, i32), RecordError> {
    let runtime_err = |e: std::io::Error| RecordError::Runtime(format!("recording: {e}"));
    let supervisor = Supervisor::start().map_err(runtime_err)?;
    let recorder = Recorder::prepare(opts)?;
    let path = recorder.out_dir().join("report.json");
    let (report, signal) = supervisor
        .run("dmaprof-record", move |control| recorder.execute(control))
        .map_err(runtime_err)?;
    Ok((report?, path, signal))
}

/// The exit code of a recording that `signal` ended (0: none). Ctrl-C is how a recording of
/// running processes ends, so it is a success; other stop signals give 128+N, as for `run`.
pub fn exit_code(signal: i32) -> u8 {
    match signal {
        0 | libc::SIGINT => 0,
        s => (128 + s) as u8,
    }
}

/// A prepared recording: options checked, output directory claimed.
pub struct Recorder {
    opts: RecordOptions,
    out: OutDir,
}

/// The ioctl table the BPF side matches requests against.
pub fn recorded_ioctls() -> [RecordIoctl; abi::MAX_RECORD_IOCTLS] {
    let mut table = [RecordIoctl::default(); abi::MAX_RECORD_IOCTLS];
    for (slot, kind) in table.iter_mut().zip(DmaIoctl::iter()) {
        let (iova, size) = kind.iova_and_size_offsets();
        *slot = RecordIoctl {
            cmd: kind.cmd() as u32,
            iova_offset: iova as u32,
            size_offset: size as u32,
            _reserved: 0,
        };
    }
    table
}

impl Recorder {
    /// Checks privileges, that the processes exist, and the output directory; nothing is
    /// changed before these pass.
    pub fn prepare(opts: RecordOptions) -> Result<Self, RecordError> {
        if let Some(why) = privileges::refusal() {
            return Err(RecordError::Usage(why));
        }
        if let Some(pid) = opts.pids.iter().find(|&&p| !sys::process_alive(p)) {
            return Err(RecordError::Usage(format!("-p {pid}: no such process")));
        }
        if let Some(command) = opts.command.first() {
            launch::check(command)?;
        }
        if opts.out.exists() && !opts.out.is_dir() {
            return Err(RecordError::Usage(format!(
                "--out {} exists and is not a directory",
                opts.out.display()
            )));
        }
        output::claim(&opts.out).map_err(|e| RecordError::Usage(e.to_string()))?;
        let out = OutDir::create(opts.out.clone()).map_err(|e| {
            RecordError::Usage(format!(
                "cannot create --out {}: {}: choose a writable directory",
                e.path, e.source
            ))
        })?;
        Ok(Self { opts, out })
    }

    /// The output directory.
    pub fn out_dir(&self) -> &Path {
        &self.out.path
    }

    /// Attaches, starts the command (or watches the pids) and records until the processes end,
    /// the duration passes or `control` is cancelled; writes report.json.
    pub fn execute(self, control: &Control) -> Result<RecordReport, RecordError> {
        control.enter(Stage::Attaching);
        let watch = Watched::Processes(recorded_ioctls());
        let pending = KernelSymbols::load_in_background();
        let loaded = loader::load_object(&watch, None, true);
        let symbols = pending.wait();
        let mut probes = loader::attach_loaded(
            loaded?,
            &Request {
                watch,
                freq_hz: self.opts.freq_hz,
                mechanisms: &self.opts.mechanisms,
                symbols: symbols.as_ref(),
                sample_map_entries: None,
                rows: None,
            },
        )?;
        let exact = !probes.attached_rows().is_empty();
        let mut ring = probes.take_calls()?;
        let mut report = self.new_report(&probes, symbols.as_ref());
        let origin = sys::monotonic_ns();
        let started = Instant::now();
        // The slot is set before anything is watched: a command's first syscalls (the dynamic
        // loader's mmaps) come right after its release.
        probes.set_phase(RECORD_SLOT)?;
        let child = self.start(&mut probes)?;
        report.process.pids = child.map_or_else(|| self.opts.pids.clone(), |pid| vec![pid]);
        control.enter(Stage::Recording);
        let mut raw = Vec::new();
        let end = loop {
            drain(&mut ring, &mut raw);
            if let Some(end) = self.ended(child, &report.process.pids, started, control) {
                break end;
            }
            std::thread::sleep(POLL);
        };
        control.enter(Stage::Finishing);
        report.process.exit_code = match (end, child) {
            (End::Exited(code), _) => code,
            (_, Some(pid)) => launch::terminate(pid),
            _ => None,
        };
        probes.set_phase(0)?;
        drain(&mut ring, &mut raw);
        report.lost = probes.lost_calls()?;
        let drained = probes.drain(RECORD_SLOT + 2)?;
        totals(&mut report, &drained);
        report.sampled = self.sampled(&drained, symbols.as_ref(), &report.probes)?;
        report.partial = end == End::Cancelled;
        report.duration_ns = started.elapsed().as_nanos() as u64;
        drop(probes);
        report.calls = raw.iter().filter_map(|r| Call::of(r, origin, exact)).collect();
        recording::summarise(&mut report);
        output::write_report(&self.out.path, &report)?;
        let dir = self.out.path.clone();
        let page = crate::html::record_index(&report, &|rel| std::fs::read_to_string(dir.join(rel)).ok());
        output::write_atomic(&self.out.path.join(output::INDEX), &page)?;
        Ok(report)
    }

    /// The samples inside and outside the DMA ioctls (None when the sampler did not attach),
    /// and their flamegraphs written next to report.json.
    fn sampled(
        &self,
        drained: &Drained,
        symbols: Option<&KernelSymbols>,
        status: &[ProbeStatus],
    ) -> Result<Option<RecordSampled>, RecordError> {
        if !status
            .iter()
            .any(|p| p.attached && p.mechanism == AttachedBy::PerfEvent)
        {
            return Ok(None);
        }
        let mut out = RecordSampled {
            freq_hz: self.opts.freq_hz,
            ..RecordSampled::default()
        };
        for (slot, stem, title) in [
            (RECORD_SLOT, "in_calls", "inside the DMA ioctls"),
            (RECORD_SLOT + 1, "outside", "outside the DMA ioctls"),
        ] {
            let (sampled, folded) = slot_samples(drained, slot, symbols);
            if folded.total() > 0 {
                folded
                    .write(&self.out.path, stem, &format!("recorded processes: {title}"))
                    .map_err(|e| RecordError::Runtime(format!("writing {stem}.svg: {e}")))?;
            }
            match slot {
                RECORD_SLOT => out.in_calls = sampled,
                _ => out.outside = sampled,
            }
        }
        Ok(Some(out))
    }

    fn new_report(&self, probes: &Probes, symbols: Option<&KernelSymbols>) -> RecordReport {
        let mut kernel = kernel::info();
        kernel.features = match symbols.filter(|s| s.usable()) {
            Some(s) => kernel::features_from(Some(&|n| s.has(n))),
            None => kernel::features_from(None),
        };
        RecordReport {
            schema: recording::SCHEMA.into(),
            dmaprof_version: env!("CARGO_PKG_VERSION").into(),
            process: Process {
                pids: self.opts.pids.clone(),
                command: self.opts.command.clone(),
                exit_code: None,
            },
            duration_ns: 0,
            calls: Vec::new(),
            by_kind: Vec::new(),
            by_size: Vec::new(),
            categories: None,
            top: Vec::new(),
            rows: Vec::new(),
            cpu_faults: None,
            unaccounted: 0,
            probes: probes.status.clone(),
            kernel,
            partial: false,
            lost: 0,
            memory_syscalls: None,
            sampled: None,
        }
    }

    /// Watches the pids, or starts the command watched from its first instruction; returns
    /// the command's pid.
    fn start(&self, probes: &mut Probes) -> Result<Option<u32>, RecordError> {
        if self.opts.command.is_empty() {
            for &pid in &self.opts.pids {
                probes.watch_process(pid)?;
            }
            return Ok(None);
        }
        let held: Held = launch::hold(&self.opts.command)?;
        if let Err(e) = probes.watch_process(held.pid) {
            held.abandon();
            return Err(e.into());
        }
        Ok(Some(held.release()?))
    }

    /// Whether the recording is over, and why.
    fn ended(&self, child: Option<u32>, pids: &[u32], started: Instant, control: &Control) -> Option<End> {
        if let Some(pid) = child
            && let Some(code) = launch::try_wait(pid)
        {
            return Some(End::Exited(Some(code)));
        }
        if child.is_none() && pids.iter().all(|&p| !sys::process_alive(p)) {
            return Some(End::Exited(None));
        }
        if control.cancelled() {
            return Some(End::Cancelled);
        }
        if self.opts.duration.is_some_and(|d| started.elapsed() >= d) {
            return Some(End::Duration);
        }
        None
    }
}

/// One slot's samples: shares by category, and the folded stacks (root first).
fn slot_samples(drained: &Drained, slot: u32, symbols: Option<&KernelSymbols>) -> (Sampled, Folded) {
    let mut cats = CategoryCounts::default();
    let mut folded = Folded::default();
    for s in drained.samples.iter().filter(|s| s.slot == slot) {
        let names = crate::symbols::sample_frames(&s.kernel, s.page_clear, symbols);
        cats.add_stack(&names, s.count);
        let user = names.is_empty().then(|| "[user]".to_owned());
        folded.add(user.into_iter().chain(names.into_iter().rev()), s.count);
    }
    let counters: Vec<PhaseCounters> = drained
        .counters
        .iter()
        .filter(|(at, _)| *at == slot)
        .map(|(_, c)| *c)
        .collect();
    let sampled = attribution::sampled_counts(&cats, &counters);
    (sampled, folded)
}

/// The per-function totals and counters the probes kept over the whole recording.
fn totals(report: &mut RecordReport, drained: &Drained) {
    let mut rows: Vec<RowTotal> = drained
        .rows
        .iter()
        .filter(|(slot, _, _)| *slot == RECORD_SLOT)
        .map(|&(_, row, st)| RowTotal {
            function: PROBE_TABLE[row].function.to_owned(),
            category: PROBE_TABLE[row].category(),
            calls: st.calls,
            inclusive_ns: st.inclusive_ns,
            exclusive_ns: st.exclusive_ns,
        })
        .collect();
    rows.sort_by_key(|r| std::cmp::Reverse(r.exclusive_ns));
    report.rows = rows;
    let counters = drained
        .counters
        .iter()
        .find(|(slot, _)| *slot == RECORD_SLOT)
        .map(|(_, c)| *c);
    let faults_seen = report
        .probes
        .iter()
        .any(|p| p.attached && p.function.ends_with(":page_fault_user"));
    report.cpu_faults = faults_seen.then(|| counters.map_or(0, |c| c.user_faults));
    let syscalls_seen = report
        .probes
        .iter()
        .any(|p| p.attached && p.function.ends_with(":sys_exit"));
    report.memory_syscalls = syscalls_seen.then(|| MemorySyscalls {
        calls: counters.map_or(0, |c| c.syscalls),
        ns: counters.map_or(0, |c| c.syscall_ns),
    });
    report.unaccounted = counters.map_or(0, |c| c.stack_overflow + c.unmatched_exit);
}

/// Why a recording stopped.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum End {
    /// The watched processes ended (the command's exit code, when it was ours).
    Exited(Option<i32>),
    /// `--duration` passed.
    Duration,
    /// A stop signal.
    Cancelled,
}

/// Moves every record waiting in the ring buffer into `out`.
fn drain(ring: &mut aya::maps::RingBuf<aya::maps::MapData>, out: &mut Vec<DmaCall>) {
    while let Some(item) = ring.next() {
        out.extend(decode(&item));
    }
}

/// A [`DmaCall`] from its bytes (the BPF side's `repr(C)` layout, native endian), read
/// field by field so that no unaligned or partial record is ever reinterpreted.
fn decode(bytes: &[u8]) -> Option<DmaCall> {
    if bytes.len() < size_of::<DmaCall>() {
        return None;
    }
    let mut at = 0;
    let mut take = |n: usize| {
        let mut b = [0u8; 8];
        b[..n].copy_from_slice(&bytes[at..at + n]);
        at += n;
        u64::from_ne_bytes(b)
    };
    let mut call = DmaCall {
        tid: take(4) as u32,
        tgid: take(4) as u32,
        cmd: take(4) as u32,
        unaccounted: take(4) as u32,
        start_ns: take(8),
        duration_ns: take(8),
        ret: take(8) as i64,
        iova: take(8),
        size: take(8),
        category_ns: [0; abi::MAX_CATEGORIES],
    };
    for c in &mut call.category_ns {
        *c = take(8);
    }
    Some(call)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn records_decode_from_their_bytes() {
        let mut words: Vec<u8> = [7u32, 5, 0x3b71, 1].iter().flat_map(|w| w.to_ne_bytes()).collect();
        for v in [100u64, 200, (-22i64) as u64, 1 << 32, 4096] {
            words.extend(v.to_ne_bytes());
        }
        for i in 0..abi::MAX_CATEGORIES as u64 {
            words.extend(i.to_ne_bytes());
        }
        assert_eq!(words.len(), size_of::<DmaCall>(), "the layout has no padding");
        let c = decode(&words).unwrap();
        assert_eq!((c.tid, c.tgid, c.cmd, c.unaccounted), (7, 5, 0x3b71, 1));
        assert_eq!(
            (c.start_ns, c.duration_ns, c.ret, c.iova, c.size),
            (100, 200, -22, 1 << 32, 4096)
        );
        assert_eq!(c.category_ns[15], 15);
        assert!(decode(&words[..10]).is_none());
    }

    #[test]
    fn the_bpf_table_names_every_dma_ioctl() {
        let t = recorded_ioctls();
        assert_eq!(t.iter().filter(|k| k.cmd != 0).count(), DmaIoctl::iter().count());
        assert_eq!((t[0].cmd, t[0].iova_offset, t[0].size_offset), (0x3b71, 16, 24));
    }
}
