//! Debian packages from any suite, without touching the system's apt state.
//!
//! A private `APT_CONFIG` (own sources.list, lists, archives and an empty dpkg status) points at the
//! same mirror the system uses, with the suites the test bed's kernels come from (bookworm for 6.1,
//! trixie for 6.12, trixie-backports for 7.x) and bookworm-backports (the guest's QEMU, see
//! `guest_qemu`). Its package lists are refreshed at most once a day, and at once when the suites
//! change; downloaded `.deb` files stay in its archive directory, so a second run downloads nothing.
use std::{
    fs,
    path::{Path, PathBuf},
    process::Command,
    time::{Duration, SystemTime},
};

use anyhow::{Context as _, Result, bail};

use crate::setup::run_cmd;

/// How old the private package lists may get before they are refreshed.
const LISTS_MAX_AGE: Duration = Duration::from_secs(24 * 3600);

const KEYRING: &str = "/usr/share/keyrings/debian-archive-keyring.gpg";

/// The private apt set-up under `<cache>/apt`.
pub struct Apt {
    dir: PathBuf,
}

/// A resolved package: its name and (newest) version.
#[derive(Clone, Debug)]
pub struct Package {
    pub name: String,
    pub version: String,
}

/// The mirror hosts the system's apt uses: (main archive URI, security archive URI).
fn system_mirrors() -> (String, String) {
    let mut main = None;
    let mut security = None;
    let mut files = vec![PathBuf::from("/etc/apt/sources.list")];
    if let Ok(dir) = fs::read_dir("/etc/apt/sources.list.d") {
        let mut more: Vec<PathBuf> = dir
            .filter_map(|e| e.ok().map(|e| e.path()))
            .filter(|p| p.extension().is_some_and(|e| e == "list" || e == "sources"))
            .collect();
        more.sort();
        files.extend(more);
    }
    for file in files {
        let Ok(text) = fs::read_to_string(&file) else {
            continue;
        };
        for word in text.split_whitespace() {
            let uri = word.trim_end_matches('/');
            if !(uri.starts_with("http://") || uri.starts_with("https://")) {
                continue;
            }
            if uri.ends_with("/debian-security") {
                security.get_or_insert_with(|| uri.to_owned());
            } else if uri.ends_with("/debian") {
                main.get_or_insert_with(|| uri.to_owned());
            }
        }
    }
    let main = main.unwrap_or_else(|| "http://deb.debian.org/debian".to_owned());
    let security = security.unwrap_or_else(|| format!("{main}-security"));
    (main, security)
}

impl Apt {
    /// Sets up (idempotently) the private apt configuration under `cache/apt`.
    pub fn new(cache: &Path) -> Result<Self> {
        let dir = cache.join("apt");
        for sub in ["lists/partial", "archives/partial", "etc/parts", "etc/prefs"] {
            fs::create_dir_all(dir.join(sub)).with_context(|| format!("creating {}", dir.join(sub).display()))?;
        }
        let status = dir.join("status");
        if !status.exists() {
            fs::write(&status, "")?;
        }
        let (main, security) = system_mirrors();
        let mut sources = String::new();
        for suite in [
            "bookworm",
            "bookworm-updates",
            "bookworm-backports",
            "trixie",
            "trixie-updates",
            "trixie-backports",
        ] {
            sources += &format!("deb [signed-by={KEYRING}] {main} {suite} main\n");
        }
        for suite in ["bookworm-security", "trixie-security"] {
            sources += &format!("deb [signed-by={KEYRING}] {security} {suite} main\n");
        }
        if write_if_changed(&dir.join("etc/sources.list"), &sources)? {
            // Lists fetched for other suites would hide the new ones for a day.
            fs::remove_file(dir.join("lists/.updated")).ok();
        }
        let d = dir.display();
        let conf = format!(
            "Dir::State \"{d}\";\nDir::State::Lists \"{d}/lists\";\nDir::State::status \"{d}/status\";\n\
             Dir::Cache \"{d}\";\nDir::Cache::archives \"{d}/archives\";\n\
             Dir::Etc::sourcelist \"{d}/etc/sources.list\";\nDir::Etc::sourceparts \"{d}/etc/parts\";\n\
             Dir::Etc::parts \"{d}/etc/parts\";\nDir::Etc::preferences \"{d}/etc/preferences\";\n\
             Dir::Etc::preferencesparts \"{d}/etc/prefs\";\n\
             APT::Architecture \"amd64\";\nAPT::Architectures {{ \"amd64\"; }};\n\
             Acquire::Languages \"none\";\nAPT::Sandbox::User \"root\";\n"
        );
        write_if_changed(&dir.join("apt.conf"), &conf)?;
        Ok(Self { dir })
    }

    fn cmd(&self, program: &str) -> Command {
        let mut cmd = Command::new(program);
        cmd.env("APT_CONFIG", self.dir.join("apt.conf"));
        cmd
    }

    /// Refreshes the package lists if they are missing or older than a day. A failed refresh with
    /// lists present is only a warning (the cache may still hold what is needed).
    pub fn update(&self, force: bool) -> Result<()> {
        let stamp = self.dir.join("lists/.updated");
        let fresh = fs::metadata(&stamp)
            .and_then(|m| m.modified())
            .ok()
            .and_then(|t| SystemTime::now().duration_since(t).ok())
            .is_some_and(|age| age < LISTS_MAX_AGE);
        if fresh && !force {
            return Ok(());
        }
        eprintln!(
            "xtask: refreshing the package lists of the VM's suites (bookworm, bookworm-backports, trixie, trixie-backports)"
        );
        let out = self
            .cmd("apt-get")
            .args(["update", "-q"])
            .output()
            .context("could not start apt-get")?;
        if !out.status.success() {
            let had_lists = stamp.exists();
            let msg = format!("apt-get update failed: {}", String::from_utf8_lossy(&out.stderr).trim());
            if had_lists {
                eprintln!("xtask: warning: {msg}; using the old package lists");
                return Ok(());
            }
            bail!(msg);
        }
        fs::write(&stamp, "")?;
        Ok(())
    }

    /// The newest package whose name matches `regex` (apt-cache's POSIX regex, anchored by the caller)
    /// and whose name passes `filter`.
    pub fn newest(&self, regex: &str, filter: impl Fn(&str) -> bool) -> Result<Option<Package>> {
        let out = self.cmd("apt-cache").args(["search", "--names-only", regex]).output()?;
        let names: Vec<String> = String::from_utf8_lossy(&out.stdout)
            .lines()
            .filter_map(|l| l.split(" - ").next())
            .map(str::to_owned)
            .filter(|n| filter(n))
            .collect();
        if names.is_empty() {
            return Ok(None);
        }
        let out = self
            .cmd("apt-cache")
            .args(["show", "--no-all-versions"])
            .args(&names)
            .output()?;
        let mut best: Option<Package> = None;
        let mut name = None;
        for line in String::from_utf8_lossy(&out.stdout).lines() {
            if let Some(n) = line.strip_prefix("Package: ") {
                name = Some(n.trim().to_owned());
            } else if let Some(v) = line.strip_prefix("Version: ")
                && let Some(n) = name.take()
            {
                let version = v.trim().to_owned();
                if best.as_ref().is_none_or(|b| version_gt(&version, &b.version)) {
                    best = Some(Package { name: n, version });
                }
            }
        }
        Ok(best)
    }

    /// The newest version of the package `name` in `suite` (e.g. `bookworm-backports`), as
    /// `apt-cache madison` lists it.
    pub fn in_suite(&self, name: &str, suite: &str) -> Result<Option<Package>> {
        let out = self.cmd("apt-cache").args(["madison", name]).output()?;
        Ok(newest_in_suite(&String::from_utf8_lossy(&out.stdout), name, suite))
    }

    /// Downloads `pkg` (if not yet in the archive directory) and returns the `.deb` path.
    pub fn download(&self, pkg: &Package) -> Result<PathBuf> {
        let archives = self.dir.join("archives");
        let file = archives.join(format!(
            "{}_{}_{}.deb",
            pkg.name,
            pkg.version.replace(':', "%3a"),
            "amd64"
        ));
        let file_all = archives.join(format!("{}_{}_all.deb", pkg.name, pkg.version.replace(':', "%3a")));
        for f in [&file, &file_all] {
            if f.exists() {
                return Ok(f.clone());
            }
        }
        eprintln!("xtask: downloading {} {}", pkg.name, pkg.version);
        run_cmd(
            self.cmd("apt-get")
                .current_dir(&archives)
                .args(["download", "-q"])
                .arg(format!("{}={}", pkg.name, pkg.version)),
        )?;
        for f in [&file, &file_all] {
            if f.exists() {
                return Ok(f.clone());
            }
        }
        bail!("downloaded {} but cannot find it in {}", pkg.name, archives.display())
    }
}

/// The newest version of `name` in `suite` in `apt-cache madison`'s lines.
fn newest_in_suite(madison: &str, name: &str, suite: &str) -> Option<Package> {
    let mut best: Option<Package> = None;
    // "qemu-system-x86 | 1:10.0.2+ds-2~bpo12+1 | <mirror> bookworm-backports/main amd64 Packages"
    for line in madison.lines() {
        let fields: Vec<&str> = line.split('|').map(str::trim).collect();
        let [pkg, version, source] = fields[..] else {
            continue;
        };
        let in_suite = source.split_whitespace().nth(1).and_then(|s| s.split('/').next()) == Some(suite);
        if pkg == name && in_suite && best.as_ref().is_none_or(|b| version_gt(version, &b.version)) {
            best = Some(Package {
                name: name.to_owned(),
                version: version.to_owned(),
            });
        }
    }
    best
}

/// `a > b` in Debian version order (asks dpkg).
fn version_gt(a: &str, b: &str) -> bool {
    Command::new("dpkg")
        .args(["--compare-versions", a, "gt", b])
        .status()
        .is_ok_and(|s| s.success())
}

/// Writes `text` to `path` unless it holds it already; whether it wrote.
fn write_if_changed(path: &Path, text: &str) -> Result<bool> {
    if fs::read_to_string(path).ok().as_deref() == Some(text) {
        return Ok(false);
    }
    fs::write(path, text).with_context(|| format!("writing {}", path.display()))?;
    Ok(true)
}

/// Unpacks a `.deb` into `dest` with `dpkg -x` (never installs it).
pub fn unpack(deb: &Path, dest: &Path) -> Result<()> {
    fs::create_dir_all(dest)?;
    run_cmd(Command::new("dpkg").arg("-x").arg(deb).arg(dest))
}

#[cfg(test)]
mod tests {
    use super::newest_in_suite;

    #[test]
    fn a_suite_s_newest_version_only() {
        let madison = "\
qemu-system-x86 | 1:11.1.3+ds-1~bpo13+1 | http://m/debian trixie-backports/main amd64 Packages
qemu-system-x86 | 1:10.0.2+ds-2+deb13u1~bpo12+1 | http://m/debian bookworm-backports/main amd64 Packages
qemu-system-x86 | 1:9.2.1+ds-1~bpo12+1 | http://m/debian bookworm-backports/main amd64 Packages
qemu-system-x86 | 1:7.2+dfsg-7+deb12u18+b3 | http://m/debian bookworm/main amd64 Packages
qemu-system-gui | 1:10.0.3~bpo12+1 | http://m/debian bookworm-backports/main amd64 Packages";
        let got = newest_in_suite(madison, "qemu-system-x86", "bookworm-backports").expect("found");
        assert_eq!(got.version, "1:10.0.2+ds-2+deb13u1~bpo12+1");
        assert_eq!(
            newest_in_suite(madison, "qemu-system-x86", "bookworm").map(|p| p.version),
            Some("1:7.2+dfsg-7+deb12u18+b3".to_owned())
        );
        assert!(newest_in_suite(madison, "qemu-system-x86", "sid").is_none());
    }
}
