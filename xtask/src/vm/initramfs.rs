//! The guest's initramfs: a newc cpio written from Rust, holding the static `/init`
//! (`src/bin/dmaprof-vm-init.rs`: sets the guest up, runs the payload, ships its output back over
//! the second serial port, powers off) with its configuration in `/etc/dmaprof-vm/`, busybox as
//! the payload's tool box, the VFIO modules and the static dmaprof.
use std::{
    fs,
    io::{self, Write},
    path::{Path, PathBuf},
};

use anyhow::{Context as _, Result};

use super::Payload;

/// A minimal newc ("070701") cpio writer.
pub struct Cpio<W: Write> {
    out: W,
    ino: u32,
    written: u64,
}

impl<W: Write> Cpio<W> {
    pub fn new(out: W) -> Self {
        Self {
            out,
            ino: 1,
            written: 0,
        }
    }

    fn entry(&mut self, name: &str, mode: u32, rdev: (u32, u32), data: &[u8]) -> io::Result<()> {
        let name_len = name.len() + 1;
        let header = format!(
            "070701{:08x}{:08x}{:08x}{:08x}{:08x}{:08x}{:08x}{:08x}{:08x}{:08x}{:08x}{:08x}{:08x}",
            self.ino,
            mode,
            0, // uid
            0, // gid
            1, // nlink
            0, // mtime
            data.len(),
            0, // dev major
            0, // dev minor
            rdev.0,
            rdev.1,
            name_len,
            0, // check
        );
        self.ino += 1;
        self.write(header.as_bytes())?;
        self.write(name.as_bytes())?;
        self.write(&[0])?;
        self.pad()?;
        self.write(data)?;
        self.pad()
    }

    fn write(&mut self, b: &[u8]) -> io::Result<()> {
        self.written += b.len() as u64;
        self.out.write_all(b)
    }

    fn pad(&mut self) -> io::Result<()> {
        let n = (4 - (self.written % 4) as usize) % 4;
        self.write(&[0; 3][..n])
    }

    pub fn dir(&mut self, name: &str) -> io::Result<()> {
        self.entry(name, 0o040_755, (0, 0), &[])
    }

    pub fn file(&mut self, name: &str, perm: u32, data: &[u8]) -> io::Result<()> {
        self.entry(name, 0o100_000 | perm, (0, 0), data)
    }

    pub fn char_dev(&mut self, name: &str, major: u32, minor: u32) -> io::Result<()> {
        self.entry(name, 0o020_600, (major, minor), &[])
    }

    /// Writes the trailer and returns the writer.
    pub fn finish(mut self) -> io::Result<W> {
        self.entry("TRAILER!!!", 0, (0, 0), &[])?;
        let n = ((512 - self.written % 512) % 512) as usize;
        self.write(&vec![0; n])?;
        self.out.flush()?;
        Ok(self.out)
    }
}

/// What the guest does.
pub struct Guest<'a> {
    /// The static guest init (`dmaprof-vm-init`), installed as /init.
    pub init: &'a Path,
    /// Static dmaprof for /bin/dmaprof (None: the payload does not need it).
    pub dmaprof: Option<&'a Path>,
    pub modules: &'a [PathBuf],
    pub payload: &'a Payload,
    /// Guest directory whose files are shipped back to the host.
    pub out_dir: &'a str,
    /// 2 MiB hugepages to reserve at run time.
    pub hugepages_2m: u32,
    /// 1 GiB hugepages asked for on the kernel command line (reported by /init).
    pub hugepages_1g: u32,
    /// Host files copied to the same absolute path in the guest (symlinks followed), e.g. a
    /// dynamically linked tool and its libraries.
    pub host_files: &'a [PathBuf],
}

/// Directories every initramfs has (the init makes the mount points it needs below them).
const BASE_DIRS: [&str; 8] = ["bin", "dev", "etc", "etc/dmaprof-vm", "modules", "proc", "sys", "tmp"];

/// The init's configuration files (`/etc/dmaprof-vm/<key>`), as `dmaprof-vm-init` reads them.
fn config(g: &Guest) -> Vec<(&'static str, Vec<u8>)> {
    let mut files = vec![
        ("out", g.out_dir.as_bytes().to_vec()),
        ("hugepages_2m", g.hugepages_2m.to_string().into_bytes()),
        ("hugepages_1g", g.hugepages_1g.to_string().into_bytes()),
    ];
    match g.payload {
        Payload::Dmaprof(args) => files.push(("dmaprof_args", args.join("\0").into_bytes())),
        Payload::Shell(cmd) => files.push(("shell", cmd.as_bytes().to_vec())),
    }
    files
}

/// Writes the initramfs to `path`.
pub fn write(path: &Path, g: &Guest) -> Result<()> {
    let file = fs::File::create(path).with_context(|| format!("creating {}", path.display()))?;
    write_to(io::BufWriter::new(file), g)?;
    Ok(())
}

fn write_to<W: Write>(out: W, g: &Guest) -> Result<W> {
    let busybox = fs::read("/bin/busybox").context("reading /bin/busybox (package busybox-static)")?;
    let init = fs::read(g.init).with_context(|| format!("reading {}", g.init.display()))?;
    let mut c = Cpio::new(out);
    for d in BASE_DIRS {
        c.dir(d)?;
    }
    c.char_dev("dev/console", 5, 1)?;
    c.char_dev("dev/null", 1, 3)?;
    c.file("bin/busybox", 0o755, &busybox)?;
    c.file("init", 0o755, &init)?;
    for (key, value) in config(g) {
        c.file(&format!("etc/dmaprof-vm/{key}"), 0o644, &value)?;
    }
    if let Some(dmaprof) = g.dmaprof {
        let bin = fs::read(dmaprof).with_context(|| format!("reading {}", dmaprof.display()))?;
        c.file("bin/dmaprof", 0o755, &bin)?;
    }
    for m in g.modules {
        let name = m.file_name().unwrap_or_default().to_string_lossy();
        c.file(&format!("modules/{name}"), 0o644, &fs::read(m)?)?;
    }
    let mut dirs = std::collections::BTreeSet::new();
    for f in g.host_files {
        let rel = f.strip_prefix("/").unwrap_or(f);
        for a in rel.ancestors().skip(1).filter(|a| !a.as_os_str().is_empty()) {
            dirs.insert(a.to_path_buf());
        }
    }
    // BTreeSet order puts a parent before its children.
    for d in &dirs {
        if !BASE_DIRS.contains(&d.to_string_lossy().as_ref()) {
            c.dir(&d.to_string_lossy())?;
        }
    }
    for f in g.host_files {
        let data = fs::read(f).with_context(|| format!("reading {}", f.display()))?;
        let rel = f.strip_prefix("/").unwrap_or(f);
        c.file(&rel.to_string_lossy(), 0o755, &data)?;
    }
    Ok(c.finish()?)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn init_and_its_configuration_are_in_the_archive() {
        let dir = std::env::temp_dir().join(format!("xtask-initramfs-{}", std::process::id()));
        fs::create_dir_all(&dir).unwrap();
        let init = dir.join("init");
        fs::write(&init, b"\x7fELF-fake-init").unwrap();
        let args = vec!["run".to_owned(), "-v".to_owned(), "a b*".to_owned()];
        let payload = Payload::Dmaprof(args);
        let g = Guest {
            init: &init,
            dmaprof: None,
            modules: &[],
            payload: &payload,
            out_dir: "/out",
            hugepages_2m: 4,
            hugepages_1g: 0,
            host_files: &[],
        };
        if !Path::new("/bin/busybox").exists() {
            eprintln!("no /bin/busybox here: only the configuration is checked");
        } else {
            let cpio = write_to(Vec::new(), &g).unwrap();
            let text = String::from_utf8_lossy(&cpio);
            for needle in [
                "init\0\0",
                "\x7fELF-fake-init",
                "etc/dmaprof-vm/dmaprof_args\0",
                "run\0-v\0a b*",
            ] {
                assert!(text.contains(needle), "{needle:?} missing");
            }
        }
        let conf = config(&g);
        assert!(conf.contains(&("hugepages_2m", b"4".to_vec())));
        assert!(conf.contains(&("out", b"/out".to_vec())));
        let shell = Payload::Shell("echo hi; exit 3".into());
        let g = Guest { payload: &shell, ..g };
        assert!(config(&g).contains(&("shell", b"echo hi; exit 3".to_vec())));
        let _ = fs::remove_dir_all(&dir);
    }
}
