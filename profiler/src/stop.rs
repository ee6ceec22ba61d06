//! Stopping a run: the stop signals (SIGINT, SIGTERM, SIGHUP), the cancel flag the workload
//! checks between steps, the stage names a signal is reported against, and the one registry of
//! things to undo when dmaprof must exit at once (hugepage pools, device bindings).
//!
//! A first signal asks the workload to stop after the step it is in (it then cleans up and
//! writes a partial report); a second one runs every registered undo and exits.
use std::{
    sync::{
        Arc, Mutex,
        atomic::{AtomicBool, AtomicI32, AtomicU64, Ordering},
    },
    time::{Duration, Instant},
};

use crate::{phase::Phase, probes::Pass};

/// What the run is doing, as progress shows it and as a signal is reported against.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Stage {
    /// Reading kernel symbols and facts before the first case.
    SetUp,
    /// Opening a case's container/IOAS and device, reserving its hugepages.
    Opening(String),
    /// A phase of a case (`<case> <phase>`).
    Phase(String, Phase),
    /// Loading and attaching the probes.
    Attaching,
    /// Attaching a pass's probes and detaching the others' (`<case> -> <pass> pass`).
    Switching(String, Pass),
    /// Reading a case's maps and writing its files.
    Reporting(String),
    /// `record` watching its processes.
    Recording,
    /// After the last phase: report written, probes detached. A signal here leaves the report
    /// complete (not partial).
    Finishing,
}

impl std::fmt::Display for Stage {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Stage::SetUp => f.write_str("set-up"),
            Stage::Opening(case) => write!(f, "{case} opening"),
            Stage::Phase(case, phase) => write!(f, "{case} {phase}"),
            Stage::Attaching => f.write_str("attaching probes"),
            Stage::Switching(case, pass) => write!(f, "{case} switching to the {pass} pass"),
            Stage::Reporting(case) => write!(f, "{case} reporting"),
            Stage::Recording => f.write_str("recording"),
            Stage::Finishing => f.write_str("finishing (report, detach)"),
        }
    }
}

/// Shared between the workload thread and the supervisor: the stage and whether to stop.
#[derive(Default)]
pub struct Control {
    stage: Mutex<Option<(Stage, Instant)>>,
    cancel: AtomicBool,
    signal: AtomicI32,
}

impl Control {
    /// A new control, shared by reference counting.
    pub fn new() -> Arc<Self> {
        Arc::new(Self::default())
    }

    /// Enters `stage` (shown as progress, named when a signal lands).
    pub fn enter(&self, stage: Stage) {
        *self.stage.lock().unwrap_or_else(std::sync::PoisonError::into_inner) = Some((stage, Instant::now()));
    }

    /// Leaves the current stage (between steps).
    pub fn leave(&self) {
        *self.stage.lock().unwrap_or_else(std::sync::PoisonError::into_inner) = None;
    }

    /// The current stage and since when.
    pub fn current(&self) -> Option<(Stage, Instant)> {
        self.stage
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .clone()
    }

    /// Whether the run was asked to stop.
    pub fn cancelled(&self) -> bool {
        self.cancel.load(Ordering::Relaxed)
    }

    /// The flag itself, for loops that poll it.
    pub fn cancel_flag(&self) -> &AtomicBool {
        &self.cancel
    }

    /// The stop signal received (0: none).
    pub fn signal(&self) -> i32 {
        self.signal.load(Ordering::Relaxed)
    }

    /// Records signal `sig`; returns true if it is the second one.
    fn on_signal(&self, sig: i32) -> bool {
        self.cancel.store(true, Ordering::Relaxed);
        self.signal.swap(sig, Ordering::Relaxed) != 0
    }
}

type Undo = Box<dyn FnOnce() + Send>;

/// Things to undo on an emergency exit, by id.
static REGISTRY: Mutex<Vec<(u64, String, Undo)>> = Mutex::new(Vec::new());
static NEXT_ID: AtomicU64 = AtomicU64::new(1);

/// A registered undo; its owner runs it (normal path) or it runs on an emergency exit.
#[derive(Debug)]
#[must_use = "dropping the token leaves the undo registered; call run() or dismiss()"]
pub struct UndoToken(u64);

/// Registers `undo` (described as `what`) to run if dmaprof must exit at once.
pub fn on_exit(what: impl Into<String>, undo: impl FnOnce() + Send + 'static) -> UndoToken {
    let id = NEXT_ID.fetch_add(1, Ordering::Relaxed);
    REGISTRY
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
        .push((id, what.into(), Box::new(undo)));
    UndoToken(id)
}

impl UndoToken {
    fn take(&self) -> Option<Undo> {
        let mut list = REGISTRY.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        let i = list.iter().position(|(id, _, _)| *id == self.0)?;
        Some(list.remove(i).2)
    }

    /// Runs the undo now (the normal path); a no-op if an emergency exit already ran it.
    pub fn run(self) {
        if let Some(undo) = self.take() {
            undo();
        }
    }

    /// Forgets the undo without running it.
    pub fn dismiss(self) {
        drop(self.take());
    }
}

/// What is registered now, newest last.
pub fn pending() -> Vec<String> {
    let list = REGISTRY.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
    list.iter().map(|(_, what, _)| what.clone()).collect()
}

/// Runs every registered undo, newest first (the emergency exit).
pub fn undo_all() {
    let undos: Vec<Undo> = {
        let mut list = REGISTRY.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        list.drain(..).rev().map(|(_, _, u)| u).collect()
    };
    for undo in undos {
        undo();
    }
}

/// The stop signals, registered before dmaprof changes anything so that a signal at any moment
/// is queued for [`supervise`] instead of killing the process.
pub struct StopSignals {
    int: Option<tokio::signal::unix::Signal>,
    term: Option<tokio::signal::unix::Signal>,
    hup: Option<tokio::signal::unix::Signal>,
}

impl StopSignals {
    /// Registers SIGINT, SIGTERM and SIGHUP (must run inside a tokio runtime's context).
    pub fn register() -> Self {
        use tokio::signal::unix::{SignalKind, signal};
        Self {
            int: signal(SignalKind::interrupt()).ok(),
            term: signal(SignalKind::terminate()).ok(),
            hup: signal(SignalKind::hangup()).ok(),
        }
    }
}

/// The stop signals dmaprof handles.
const STOP_SIGNALS: [libc::c_int; 3] = [libc::SIGINT, libc::SIGTERM, libc::SIGHUP];

fn set_stop_signals_blocked(blocked: bool) {
    // SAFETY: sigset_t is plain data that sigemptyset initialises; the calls only read and
    // write it and this thread's signal mask.
    unsafe {
        let mut set: libc::sigset_t = std::mem::zeroed();
        libc::sigemptyset(&mut set);
        for s in STOP_SIGNALS {
            libc::sigaddset(&mut set, s);
        }
        let how = if blocked { libc::SIG_BLOCK } else { libc::SIG_UNBLOCK };
        libc::pthread_sigmask(how, &set, std::ptr::null_mut());
    }
}

/// Holds the stop signals pending from the first line of `main` until [`Supervisor::start`]
/// has registered their handlers, so a signal during start-up is handled, not fatal. Call it
/// before any thread is spawned: the mask is per thread and inherited.
pub fn hold_stop_signals() {
    set_stop_signals_blocked(true);
}

/// Lets held stop signals through again: a pending one is delivered now, to the registered
/// handlers if [`Supervisor::start`] ran, else with its default action.
pub fn release_stop_signals() {
    set_stop_signals_blocked(false);
}

/// The stop signals and the runtime that receives them, set up before anything changes.
pub struct Supervisor {
    rt: tokio::runtime::Runtime,
    signals: StopSignals,
}

impl Supervisor {
    /// A current-thread runtime with the stop signals registered.
    pub fn start() -> std::io::Result<Self> {
        let rt = tokio::runtime::Builder::new_current_thread().enable_all().build()?;
        let signals = {
            let _ctx = rt.enter();
            StopSignals::register()
        };
        release_stop_signals();
        Ok(Self { rt, signals })
    }

    /// Runs `work` on a thread of its own named `name` while this one handles the signals
    /// ([`supervise`]); returns what it returned and the stop signal received (0: none).
    pub fn run<T: Send + 'static>(
        self,
        name: &str,
        work: impl FnOnce(&Control) -> T + Send + 'static,
    ) -> std::io::Result<(T, i32)> {
        let control = Control::new();
        let worker = {
            let control = control.clone();
            std::thread::Builder::new()
                .name(name.into())
                .spawn(move || work(&control))?
        };
        self.rt
            .block_on(supervise(self.signals, &control, || worker.is_finished()));
        let out = worker
            .join()
            .map_err(|_| std::io::Error::other(format!("the {name} thread panicked")))?;
        Ok((out, control.signal()))
    }
}

async fn recv(s: &mut Option<tokio::signal::unix::Signal>) {
    match s {
        Some(s) => {
            s.recv().await;
        }
        None => std::future::pending::<()>().await,
    }
}

/// Waits until `done()` while handling stop signals and printing progress once a second for
/// stages that take longer than that.
pub async fn supervise(mut signals: StopSignals, control: &Control, done: impl Fn() -> bool) {
    let mut tick = tokio::time::interval(Duration::from_millis(250));
    let mut last_note = Instant::now();
    while !done() {
        let sig = tokio::select! {
            _ = recv(&mut signals.int) => libc::SIGINT,
            _ = recv(&mut signals.term) => libc::SIGTERM,
            _ = recv(&mut signals.hup) => libc::SIGHUP,
            _ = tick.tick() => {
                if let Some((stage, since)) = control.current() {
                    let secs = since.elapsed().as_secs();
                    if secs >= 1 && last_note.elapsed() >= Duration::from_secs(1) {
                        eprintln!("dmaprof:   ... {stage}: {secs} s");
                        last_note = Instant::now();
                    }
                }
                continue;
            }
        };
        if control.on_signal(sig) {
            // A second signal: don't wait for the step to end. BPF links and fds close with
            // the process; pools and bindings must be put back by hand.
            eprintln!("dmaprof: second signal, exiting now");
            undo_all();
            std::process::exit(128 + sig);
        }
        let during = control
            .current()
            .map_or_else(|| "between phases".to_owned(), |(stage, _)| stage.to_string());
        eprintln!("dmaprof: signal {sig} during {during}: stopping after it and cleaning up (again to force)");
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::AtomicUsize;

    #[test]
    fn undo_runs_once_either_way() {
        static RAN: AtomicUsize = AtomicUsize::new(0);
        let t = on_exit("test undo a", || {
            RAN.fetch_add(1, Ordering::SeqCst);
        });
        assert!(pending().iter().any(|p| p == "test undo a"));
        t.run();
        assert_eq!(RAN.load(Ordering::SeqCst), 1);
        assert!(!pending().iter().any(|p| p == "test undo a"));
        let t = on_exit("test undo b", || {
            RAN.fetch_add(10, Ordering::SeqCst);
        });
        t.dismiss();
        assert_eq!(RAN.load(Ordering::SeqCst), 1);
    }

    #[test]
    fn second_signal_is_recognised() {
        let c = Control::default();
        assert!(!c.cancelled());
        assert!(!c.on_signal(libc::SIGINT));
        assert!(c.cancelled());
        assert!(c.on_signal(libc::SIGTERM));
        assert_eq!(c.signal(), libc::SIGTERM);
    }

    #[test]
    fn stages_read_as_before() {
        assert_eq!(
            Stage::Switching("c".into(), Pass::Exact).to_string(),
            "c switching to the exact pass"
        );
        assert_eq!(Stage::Phase("x.none".into(), Phase::Map).to_string(), "x.none map");
        assert_eq!(
            Stage::Phase("x.none".into(), Phase::MemfdCreate).to_string(),
            "x.none memfd_create"
        );
        assert_eq!(Stage::Attaching.to_string(), "attaching probes");
        assert_eq!(Stage::Opening("c".into()).to_string(), "c opening");
    }
}
