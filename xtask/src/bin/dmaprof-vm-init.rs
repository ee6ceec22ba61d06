//! `/init` of the VM test bed's guest (built static by xtask, see `vm/initramfs.rs`): mounts the
//! file systems, loads the VFIO modules, binds QEMU's edu device to vfio-pci, runs the payload,
//! ships its output directory to the host over ttyS1 and powers off. It prints the
//! `dmaprof-vm: ...` lines the host reads and, last, the exit marker with the payload's status.
//!
//! What to run comes from files xtask writes into the initramfs ([`CONFIG`]): `out` (the guest
//! directory to ship), `hugepages_2m`, `hugepages_1g`, and either `dmaprof_args` (NUL-separated
//! arguments of /bin/dmaprof) or `shell` (a command line for `/bin/busybox sh -c`). busybox is a
//! tool here (its applets are installed as links for the payload), not the init.
use std::{ffi::CString, fs, io::Write as _, os::fd::AsRawFd as _, path::Path, process::Command};

// The workspace's OS helpers (sysfs links), shared with dmaprof and xtask.
#[allow(dead_code, reason = "the init uses only part of the helpers")]
#[path = "../../../profiler/src/sys.rs"]
mod sys;
#[path = "../vm/transfer.rs"]
mod transfer;

/// Where xtask puts the guest's configuration.
const CONFIG: &str = "/etc/dmaprof-vm";

/// (fs type, source, target, required): mounted in this order.
const MOUNTS: &[(&str, &str, &str, bool)] = &[
    ("proc", "proc", "/proc", true),
    ("sysfs", "sysfs", "/sys", true),
    ("devtmpfs", "devtmpfs", "/dev", false),
    ("tmpfs", "tmpfs", "/tmp", true),
    ("tracefs", "tracefs", "/sys/kernel/tracing", false),
    ("debugfs", "debugfs", "/sys/kernel/debug", false),
    ("bpf", "bpf", "/sys/fs/bpf", false),
];

/// QEMU's `edu` device.
const EDU: (&str, &str) = ("0x1234", "0x11e8");

fn say(line: &str) {
    let mut out = std::io::stdout().lock();
    let _ = writeln!(out, "{line}");
    let _ = out.flush();
}

fn mount(fstype: &str, source: &str, target: &str) -> std::io::Result<()> {
    let _ = fs::create_dir_all(target);
    let c = |s: &str| CString::new(s).expect("no NUL in mount table");
    let (s, t, f) = (c(source), c(target), c(fstype));
    // SAFETY: valid C strings; no mount data.
    os_result(unsafe { libc::mount(s.as_ptr(), t.as_ptr(), f.as_ptr(), 0, std::ptr::null()) }.into())
}

/// A syscall's return value as a result (errno on failure).
fn os_result(rc: i64) -> std::io::Result<()> {
    if rc == 0 {
        Ok(())
    } else {
        Err(std::io::Error::last_os_error())
    }
}

fn read_trim(path: impl AsRef<Path>) -> String {
    fs::read_to_string(path)
        .map(|s| s.trim().to_owned())
        .unwrap_or_default()
}

fn config(key: &str) -> Option<String> {
    fs::read_to_string(Path::new(CONFIG).join(key)).ok()
}

fn config_u32(key: &str) -> u32 {
    config(key).and_then(|v| v.trim().parse().ok()).unwrap_or(0)
}

/// Loads one module with finit_module.
fn load_module(path: &Path) -> std::io::Result<()> {
    let file = fs::File::open(path)?;
    let params = CString::default();
    // SAFETY: an open descriptor and an empty parameter string.
    os_result(unsafe { libc::syscall(libc::SYS_finit_module, file.as_raw_fd(), params.as_ptr(), 0) })
}

/// Finds the edu device and binds it to vfio-pci; returns its BDF.
fn bind_edu() -> Option<String> {
    let mut devices: Vec<_> = fs::read_dir("/sys/bus/pci/devices")
        .ok()?
        .flatten()
        .map(|e| e.path())
        .collect();
    devices.sort();
    let dev = devices
        .into_iter()
        .find(|d| read_trim(d.join("vendor")) == EDU.0 && read_trim(d.join("device")) == EDU.1)?;
    let bdf = dev.file_name()?.to_string_lossy().into_owned();
    let _ = fs::write(dev.join("driver_override"), "vfio-pci");
    if dev.join("driver").exists() {
        let _ = fs::write(dev.join("driver/unbind"), &bdf);
    }
    let _ = fs::write("/sys/bus/pci/drivers_probe", &bdf);
    say(&format!(
        "dmaprof-vm: edu device {bdf} driver {} iommu_group {}",
        sys::link_name(&dev.join("driver")).unwrap_or_default(),
        sys::link_name(&dev.join("iommu_group")).unwrap_or_default()
    ));
    Some(bdf)
}

fn set_up() {
    for &(fstype, source, target, required) in MOUNTS {
        if let Err(e) = mount(fstype, source, target)
            && required
        {
            say(&format!("dmaprof-vm: mounting {fstype} on {target} failed: {e}"));
        }
    }
    for d in ["/run", "/sbin", "/usr/bin", "/usr/sbin", "/root"] {
        let _ = fs::create_dir_all(d);
    }
    // The payload's tools: busybox applets as links in /bin, /sbin, /usr/bin, /usr/sbin.
    let _ = Command::new("/bin/busybox").args(["--install", "-s"]).status();
    // SAFETY: single-threaded at this point.
    unsafe {
        std::env::set_var("PATH", "/bin:/sbin:/usr/bin:/usr/sbin");
        std::env::set_var("HOME", "/root");
    }
    // SAFETY: utsname is plain data, filled by the kernel.
    let mut uts: libc::utsname = unsafe { std::mem::zeroed() };
    // SAFETY: a valid pointer to it.
    unsafe { libc::uname(&mut uts) };
    // SAFETY: the kernel NUL-terminates release.
    let release = unsafe { std::ffi::CStr::from_ptr(uts.release.as_ptr()) }.to_string_lossy();
    let cpus = std::thread::available_parallelism().map_or(1, std::num::NonZero::get);
    let mem = fs::read_to_string("/proc/meminfo")
        .ok()
        .and_then(|m| {
            m.lines()
                .find_map(|l| l.strip_prefix("MemTotal:"))
                .and_then(|v| v.split_whitespace().next().map(str::to_owned))
        })
        .unwrap_or_default();
    say(&format!("dmaprof-vm: kernel {release}, {cpus} CPUs, {mem} kB"));

    let mut modules: Vec<_> = fs::read_dir("/modules")
        .map(|d| {
            d.flatten()
                .map(|e| e.path())
                .filter(|p| p.extension().is_some_and(|e| e == "ko"))
                .collect()
        })
        .unwrap_or_default();
    modules.sort();
    for m in &modules {
        if let Err(e) = load_module(m) {
            say(&format!("dmaprof-vm: insmod {} failed: {e}", m.display()));
        }
    }
    match bind_edu() {
        // SAFETY: single-threaded.
        Some(bdf) => unsafe { std::env::set_var("VFIO_SELFTESTS_BDF", bdf) },
        None => say("dmaprof-vm: no edu device (1234:11e8) found"),
    }
    let hp1g = config_u32("hugepages_1g");
    if hp1g > 0 {
        let got = read_trim("/sys/kernel/mm/hugepages/hugepages-1048576kB/nr_hugepages");
        let got = if got.is_empty() { "0".to_owned() } else { got };
        say(&format!("dmaprof-vm: 1 GiB hugepages: {got} of {hp1g}"));
    }
    let hp2m = config_u32("hugepages_2m");
    if hp2m > 0 {
        let pool = "/sys/kernel/mm/hugepages/hugepages-2048kB/nr_hugepages";
        let _ = fs::write(pool, hp2m.to_string());
        say(&format!("dmaprof-vm: 2 MiB hugepages: {} of {hp2m}", read_trim(pool)));
    }
    let unlimited = libc::rlimit {
        rlim_cur: libc::RLIM_INFINITY,
        rlim_max: libc::RLIM_INFINITY,
    };
    // SAFETY: a valid rlimit.
    unsafe { libc::setrlimit(libc::RLIMIT_MEMLOCK, &unlimited) };
}

/// Runs the payload and returns its exit status (128+N for signal N), reaping every orphan that
/// lands on this init meanwhile.
fn run_payload() -> i32 {
    let mut cmd = if let Some(args) = config("dmaprof_args") {
        let bdf = std::env::var("VFIO_SELFTESTS_BDF").ok();
        let mut c = Command::new("/bin/dmaprof");
        c.args(
            args.split('\0')
                .filter(|a| !a.is_empty())
                .map(|a| expand_bdf(a, bdf.as_deref())),
        );
        c
    } else {
        let mut c = Command::new("/bin/busybox");
        c.args(["sh", "-c", &config("shell").unwrap_or_default()]);
        c
    };
    cmd.current_dir("/");
    let child = match cmd.spawn() {
        Ok(c) => c,
        Err(e) => {
            say(&format!("dmaprof-vm: could not start the payload: {e}"));
            return 127;
        }
    };
    let pid = child.id() as libc::pid_t;
    loop {
        let mut status = 0;
        // SAFETY: waiting for any child; status is a valid pointer.
        let got = unsafe { libc::waitpid(-1, &mut status, 0) };
        if got == pid {
            return if libc::WIFEXITED(status) {
                libc::WEXITSTATUS(status)
            } else {
                128 + libc::WTERMSIG(status)
            };
        }
        if got < 0 && std::io::Error::last_os_error().raw_os_error() != Some(libc::EINTR) {
            return -1;
        }
    }
}

/// A dmaprof argument with `$VFIO_SELFTESTS_BDF` (or `${VFIO_SELFTESTS_BDF}`) replaced by the
/// edu device's address: dmaprof runs without a shell, and the host cannot know the address
/// before the guest has found the device (e.g. `record -- qemu-system-x86_64 -device
/// 'vfio-pci,host=$VFIO_SELFTESTS_BDF'`). Left as it is when there is no device.
fn expand_bdf(arg: &str, bdf: Option<&str>) -> String {
    match bdf {
        Some(bdf) => arg
            .replace("${VFIO_SELFTESTS_BDF}", bdf)
            .replace("$VFIO_SELFTESTS_BDF", bdf),
        None => arg.to_owned(),
    }
}

/// Packs the output directory (busybox tar) and writes it to the data port.
fn ship(out: &str) {
    let empty = fs::read_dir(out).map_or(true, |mut d| d.next().is_none());
    if empty {
        return;
    }
    let tgz = "/tmp/.dmaprof-vm-xfer.tgz";
    let packed = Command::new("/bin/busybox")
        .args(["tar", "-czf", tgz, "-C", out, "."])
        .status()
        .is_ok_and(|s| s.success());
    let archive = match fs::read(tgz) {
        Ok(a) if packed => a,
        _ => {
            say(&format!("dmaprof-vm: packing {out} failed"));
            return;
        }
    };
    match fs::OpenOptions::new().write(true).open("/dev/ttyS1") {
        Ok(mut port) => {
            if let Err(e) = port.write_all(transfer::encode(&archive).as_bytes()) {
                say(&format!("dmaprof-vm: writing the data port failed: {e}"));
            }
            // SAFETY: an open descriptor; waits until the UART has sent everything.
            unsafe { libc::tcdrain(port.as_raw_fd()) };
        }
        Err(e) => say(&format!("dmaprof-vm: no data port /dev/ttyS1: {e}")),
    }
}

fn main() {
    set_up();
    let out = config("out").map_or_else(|| "/out".to_owned(), |o| o.trim().to_owned());
    let _ = fs::create_dir_all(&out);
    let status = run_payload();
    ship(&out);
    say(&format!("{}{status}", transfer::EXIT_MARKER));
    // SAFETY: plain syscalls; the console is drained before the power goes.
    unsafe {
        libc::tcdrain(1);
        libc::sync();
        libc::reboot(libc::RB_POWER_OFF);
    }
    // Only reached if reboot failed: PID 1 must not exit.
    loop {
        std::thread::sleep(std::time::Duration::from_secs(3600));
    }
}

#[cfg(test)]
mod tests {
    use super::expand_bdf;

    #[test]
    fn the_device_address_is_expanded_in_dmaprof_arguments() {
        let bdf = Some("0000:00:03.0");
        assert_eq!(
            expand_bdf("vfio-pci,host=$VFIO_SELFTESTS_BDF", bdf),
            "vfio-pci,host=0000:00:03.0"
        );
        assert_eq!(expand_bdf("${VFIO_SELFTESTS_BDF},x", bdf), "0000:00:03.0,x");
        assert_eq!(expand_bdf("-d", bdf), "-d");
        assert_eq!(expand_bdf("host=$VFIO_SELFTESTS_BDF", None), "host=$VFIO_SELFTESTS_BDF");
    }
}
