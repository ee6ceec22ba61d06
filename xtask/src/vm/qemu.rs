//! One guest boot under QEMU (TCG only: KVM cannot run a normal guest on these machines), its
//! console read line by line against a host-side deadline, and its shipped output decoded.
//!
//! ttyS0 (stdio) is the console: kernel messages, the payload's output and the exit marker.
//! ttyS1 (a file) is the data port: the payload's output directory as base64 of a .tar.gz between
//! markers, with its size and sha256, so kernel messages can never corrupt it.
use std::{
    collections::VecDeque,
    fmt, fs,
    io::{BufRead as _, BufReader, Read as _},
    path::{Path, PathBuf},
    process::{Child, Command, Stdio},
    sync::mpsc,
    thread,
    time::{Duration, Instant},
};

use anyhow::Result;

use crate::size::ByteSize;

use super::transfer::{self, EXIT_MARKER};

/// Console lines shown with a failure.
const TAIL_LINES: usize = 30;
/// How long to keep reading after a panic/Oops line (its trace), and to wait for `poweroff -f`.
const GRACE: Duration = Duration::from_secs(3);

/// What the guest's clocks count.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, clap::ValueEnum)]
pub enum Clock {
    /// The host's time: the guest's speed moves with the host's load and the emulator's
    /// translation work, up to 2x from one second to the next.
    #[default]
    Real,
    /// Instructions executed (QEMU `-icount`): every guest instruction advances the guest's
    /// clocks by the same step, whatever the host does, so a phase takes the same time
    /// whenever it runs and a sampler fires every so many instructions. Caches and memory
    /// cost nothing here, as under TCG anyway.
    Instructions,
}

impl Clock {
    /// The QEMU arguments that give this clock. The step is 8 ns (2^3): about the host's
    /// emulation speed, so sleeps and timeouts keep their proportions.
    fn qemu_args(self) -> &'static [&'static str] {
        match self {
            Clock::Real => &[],
            Clock::Instructions => &["-icount", "shift=3,sleep=on"],
        }
    }
}

/// How to boot.
pub struct Boot<'a> {
    pub kernel: &'a Path,
    pub initrd: &'a Path,
    pub mem: ByteSize,
    pub smp: u32,
    pub hugepages_1g: u32,
    /// Extra kernel command line.
    pub append: &'a str,
    pub clock: Clock,
    pub timeout: Duration,
    /// Stream the console to stdout as it comes.
    pub echo: bool,
    /// Where the data port (ttyS1) goes.
    pub data_file: PathBuf,
}

/// A boot that reached the exit marker.
pub struct Outcome {
    pub exit_status: i32,
    pub console: Vec<String>,
    /// The shipped output directory (verified .tar.gz), if the guest shipped one.
    pub archive: Option<Vec<u8>>,
    pub elapsed: Duration,
}

/// Why a boot failed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FailKind {
    Oops,
    Panic,
    Stall,
    Timeout,
    NoExitMarker,
    Transfer,
}

#[derive(Debug)]
pub struct BootError {
    pub kind: FailKind,
    pub message: String,
    /// From QEMU's start to the failure (waiting for the VM lock not included).
    pub elapsed: Duration,
}

impl fmt::Display for BootError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.message)
    }
}

impl std::error::Error for BootError {}

/// Drops carriage returns and terminal escape sequences (SeaBIOS clears the screen).
fn strip_escapes(raw: &str) -> String {
    let mut out = String::with_capacity(raw.len());
    let mut chars = raw.chars().peekable();
    while let Some(c) = chars.next() {
        match c {
            '\x1b' => {
                if chars.peek() == Some(&'[') {
                    chars.next();
                    // Parameters and intermediates, then one final byte in @..~.
                    for f in chars.by_ref() {
                        if ('@'..='~').contains(&f) {
                            break;
                        }
                    }
                } else {
                    chars.next();
                }
            }
            '\r' | '\n' => {}
            c => out.push(c),
        }
    }
    out
}

/// Classifies a console line that means the guest kernel is broken.
fn fatal_line(line: &str) -> Option<FailKind> {
    if line.contains("Kernel panic") {
        Some(FailKind::Panic)
    } else if line.contains("Oops") || line.contains("BUG: kernel NULL pointer") {
        Some(FailKind::Oops)
    } else if line.contains("soft lockup")
        || line.contains("hard LOCKUP")
        || line.contains("detected stall")
        || line.contains("RCU stall")
    {
        Some(FailKind::Stall)
    } else {
        None
    }
}

fn qemu_command(b: &Boot) -> Command {
    let mut append = String::from("console=ttyS0 intel_iommu=on panic=-1 quiet");
    if b.hugepages_1g > 0 {
        append += &format!(" hugepagesz=1G hugepages={}", b.hugepages_1g);
    }
    if !b.append.is_empty() {
        append += " ";
        append += b.append;
    }
    let mut cmd = Command::new("qemu-system-x86_64");
    cmd.args([
        "-accel",
        "tcg,thread=single",
        "-M",
        "q35,kernel-irqchip=split",
        "-cpu",
        "qemu64,+pdpe1gb",
    ])
    .args(["-smp", &b.smp.to_string(), "-m", &format!("{}M", b.mem.mib())])
    .args(b.clock.qemu_args())
    // Guest RAM the host has not yet backed costs a host page fault per page the first time
    // the guest touches it, a stall the guest sees as time in whatever it was running: a 64
    // MiB 4 KiB touch that landed on never-used memory took 251-260 ms against 82-106 for the
    // other iterations, in two boots out of two; with the RAM allocated up front, 83 ms.
    .arg("-mem-prealloc")
    .args(["-device", "intel-iommu,intremap=on,caching-mode=on", "-device", "edu"])
    .args(["-nographic", "-no-reboot", "-nodefaults", "-display", "none"])
    .args(["-serial", "stdio"])
    .arg("-serial")
    .arg(format!("file:{}", b.data_file.display()))
    .arg("-monitor")
    .arg(format!("unix:{},server=on,wait=off", monitor_path(b).display()))
    .arg("-kernel")
    .arg(b.kernel)
    .arg("-initrd")
    .arg(b.initrd)
    .args(["-append", &append])
    .stdin(Stdio::null())
    .stdout(Stdio::piped())
    .stderr(Stdio::piped());
    cmd
}

/// QEMU's human monitor socket, next to the data port's file.
fn monitor_path(b: &Boot) -> PathBuf {
    b.data_file.with_file_name("monitor.sock")
}

/// What each vCPU is doing, asked of QEMU's monitor before a guest that went quiet is killed:
/// registers (RIP, `HLT=`, IF in RFL) and the local APIC (timer, IRR/ISR) tell a halted guest
/// with no wake-up from one spinning in the kernel. Empty when the monitor does not answer.
fn vcpu_state(b: &Boot) -> String {
    use std::io::Write as _;
    let Ok(mut sock) = std::os::unix::net::UnixStream::connect(monitor_path(b)) else {
        return String::new();
    };
    let _ = sock.set_read_timeout(Some(Duration::from_secs(2)));
    let mut commands = String::from("info registers -a\n");
    for cpu in 0..b.smp {
        commands += &format!("cpu {cpu}\ninfo lapic\n");
    }
    if sock.write_all(commands.as_bytes()).is_err() {
        return String::new();
    }
    let mut raw = Vec::new();
    let mut buf = [0u8; 8192];
    // The answer is complete once the monitor has been silent for the read timeout.
    while let Ok(n) = sock.read(&mut buf) {
        if n == 0 || raw.len() > 1 << 20 {
            break;
        }
        raw.extend_from_slice(&buf[..n]);
    }
    String::from_utf8_lossy(&raw)
        .lines()
        .map(strip_escapes)
        .filter(|l| !l.trim().is_empty() && !l.starts_with("QEMU ") && !l.starts_with("(qemu)"))
        .collect::<Vec<_>>()
        .join("\n  ")
}

fn kill(child: &mut Child) {
    let _ = child.kill();
    let _ = child.wait();
}

/// Boots once. The console is read line by line until the exit marker, a fatal line, QEMU's exit or
/// the deadline, whichever comes first; QEMU never outlives this call.
pub fn boot(b: &Boot) -> std::result::Result<Outcome, BootError> {
    let _ = fs::remove_file(&b.data_file);
    let _ = fs::remove_file(monitor_path(b));
    let start = Instant::now();
    let fail = |kind, message: String| BootError {
        kind,
        message,
        elapsed: start.elapsed(),
    };
    let mut child = qemu_command(b).spawn().map_err(|e| {
        fail(
            FailKind::NoExitMarker,
            format!("could not start qemu-system-x86_64: {e}"),
        )
    })?;
    let stdout = child.stdout.take().expect("piped");
    let mut stderr = child.stderr.take().expect("piped");
    let (tx, rx) = mpsc::channel::<String>();
    thread::spawn(move || {
        let mut reader = BufReader::new(stdout);
        let mut buf = Vec::new();
        while reader.read_until(b'\n', &mut buf).is_ok_and(|n| n > 0) {
            let line = strip_escapes(&String::from_utf8_lossy(&buf));
            buf.clear();
            if tx.send(line).is_err() {
                break;
            }
        }
    });
    let err_thread = thread::spawn(move || {
        let mut s = String::new();
        let _ = stderr.read_to_string(&mut s);
        s
    });

    let deadline = start + b.timeout;
    let mut console: Vec<String> = Vec::new();
    let mut fatal: Option<(FailKind, String)> = None;
    let mut exit_status: Option<i32> = None;
    // After a fatal line or the exit marker: read on only until this.
    let mut until: Option<Instant> = None;
    let mut timed_out = false;
    loop {
        let now = Instant::now();
        let end = until.unwrap_or(deadline).min(deadline);
        if now >= end {
            timed_out = until.is_none() || now >= deadline;
            break;
        }
        match rx.recv_timeout(end - now) {
            Ok(line) => {
                if let Some(rest) = line.split(EXIT_MARKER).nth(1).filter(|_| exit_status.is_none()) {
                    exit_status = rest.trim().parse().ok().or(Some(-1));
                    until.get_or_insert(Instant::now() + GRACE);
                    continue;
                }
                if b.echo {
                    println!("{line}");
                }
                if fatal.is_none()
                    && let Some(kind) = fatal_line(&line)
                {
                    fatal = Some((kind, line.clone()));
                    until = Some(Instant::now() + GRACE);
                }
                console.push(line);
            }
            Err(mpsc::RecvTimeoutError::Timeout) => {}
            Err(mpsc::RecvTimeoutError::Disconnected) => break,
        }
    }
    let state = if timed_out && exit_status.is_none() && fatal.is_none() {
        vcpu_state(b)
    } else {
        String::new()
    };
    // QEMU has powered off, or gets no more time: give `poweroff -f` a moment when the payload
    // finished, stop it at once otherwise.
    let grace = if exit_status.is_some() && fatal.is_none() {
        GRACE
    } else {
        Duration::ZERO
    };
    let wait_until = Instant::now() + grace;
    while !matches!(child.try_wait(), Ok(Some(_))) {
        if Instant::now() >= wait_until {
            kill(&mut child);
            break;
        }
        thread::sleep(Duration::from_millis(50));
    }
    let qemu_stderr = err_thread.join().unwrap_or_default();
    let elapsed = start.elapsed();
    let tail = || {
        let t: VecDeque<&String> = console.iter().rev().take(TAIL_LINES).collect();
        let lines: Vec<&str> = t.into_iter().rev().map(String::as_str).collect();
        let mut s = format!("last {} console lines:\n  {}", lines.len(), lines.join("\n  "));
        if !qemu_stderr.trim().is_empty() {
            s += &format!("\nqemu stderr: {}", qemu_stderr.trim());
        }
        s
    };
    if let Some((kind, line)) = fatal {
        let what = match kind {
            FailKind::Panic => "guest kernel panic",
            FailKind::Oops => "guest kernel Oops",
            _ => "guest kernel stall/lockup",
        };
        return Err(fail(
            kind,
            format!(
                "{what} after {:.1}s: `{}`\n{}",
                elapsed.as_secs_f64(),
                line.trim(),
                tail()
            ),
        ));
    }
    let Some(exit_status) = exit_status else {
        if timed_out {
            return Err(fail(
                FailKind::Timeout,
                format!(
                    "guest timed out: no exit status within {}s (QEMU killed)\n{}\nvCPUs at the deadline (QEMU monitor):\n  {}",
                    b.timeout.as_secs(),
                    tail(),
                    if state.is_empty() { "(no answer)" } else { &state }
                ),
            ));
        }
        return Err(fail(
            FailKind::NoExitMarker,
            format!(
                "guest stopped after {:.1}s without reporting an exit status\n{}",
                elapsed.as_secs_f64(),
                tail()
            ),
        ));
    };
    let archive = read_data_port(&b.data_file).map_err(|e| fail(FailKind::Transfer, format!("{e:#}\n{}", tail())))?;
    Ok(Outcome {
        exit_status,
        console,
        archive,
        elapsed,
    })
}

/// Decodes and verifies what the guest shipped over ttyS1.
fn read_data_port(path: &Path) -> Result<Option<Vec<u8>>> {
    let Ok(bytes) = fs::read(path) else {
        return Ok(None);
    };
    transfer::decode(&String::from_utf8_lossy(&bytes)).map_err(anyhow::Error::msg)
}

/// Boots, retrying once when the guest kernel Oopses.
pub fn boot_with_retry(b: &Boot) -> std::result::Result<Outcome, BootError> {
    match boot(b) {
        Err(e) if e.kind == FailKind::Oops => {
            eprintln!("xtask: {}\nxtask: retrying the boot once", e.message);
            boot(b)
        }
        r => r,
    }
}
