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

    /// A symbolic link `name` -> `target` (the target is the link's data, as in newc).
    pub fn symlink(&mut self, name: &str, target: &str) -> io::Result<()> {
        self.entry(name, 0o120_777, (0, 0), target.as_bytes())
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
    /// Host directories laid over the guest's root: `<dir>/usr/bin/x` becomes `/usr/bin/x`
    /// (modes kept, symlinks kept as symlinks), e.g. unpacked Debian packages.
    pub overlays: &'a [PathBuf],
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
    let mut entries = Vec::new();
    for root in g.overlays {
        walk(root, Path::new(""), &mut entries).with_context(|| format!("reading {}", root.display()))?;
    }
    for f in g.host_files {
        let rel = f.strip_prefix("/").unwrap_or(f).to_path_buf();
        entries.push((rel, Entry::File(f.clone(), 0o755)));
    }
    let mut dirs = std::collections::BTreeSet::new();
    for (rel, entry) in &entries {
        if matches!(entry, Entry::Dir) {
            dirs.insert(rel.clone());
        }
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
    for (rel, entry) in &entries {
        let name = rel.to_string_lossy();
        match entry {
            Entry::Dir => {}
            Entry::File(host, mode) => {
                let data = fs::read(host).with_context(|| format!("reading {}", host.display()))?;
                c.file(&name, *mode, &data)?;
            }
            Entry::Symlink(target) => c.symlink(&name, target)?,
        }
    }
    Ok(c.finish()?)
}

/// What a guest path is made of.
enum Entry {
    Dir,
    /// A host file (read when the archive is written) and its permission bits.
    File(PathBuf, u32),
    /// A symbolic link's target, as the link holds it.
    Symlink(String),
}

/// Every entry below `root/rel`, as (guest path relative to `/`, entry), directories first.
fn walk(root: &Path, rel: &Path, out: &mut Vec<(PathBuf, Entry)>) -> io::Result<()> {
    use std::os::unix::fs::PermissionsExt as _;
    let mut children: Vec<_> = fs::read_dir(root.join(rel))?.collect::<io::Result<_>>()?;
    children.sort_by_key(fs::DirEntry::file_name);
    for child in children {
        let rel = rel.join(child.file_name());
        let meta = fs::symlink_metadata(child.path())?;
        if meta.is_symlink() {
            let target = fs::read_link(child.path())?;
            out.push((rel, Entry::Symlink(target.to_string_lossy().into_owned())));
        } else if meta.is_dir() {
            out.push((rel.clone(), Entry::Dir));
            walk(root, &rel, out)?;
        } else {
            out.push((rel, Entry::File(child.path(), meta.permissions().mode() & 0o7777)));
        }
    }
    Ok(())
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
            overlays: &[],
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

    /// (name, mode, data) of every entry of a newc archive, trailer excluded.
    fn entries(cpio: &[u8]) -> Vec<(String, u32, Vec<u8>)> {
        let hex = |b: &[u8]| u32::from_str_radix(std::str::from_utf8(b).unwrap(), 16).unwrap() as usize;
        let align = |n: usize| n.div_ceil(4) * 4;
        let (mut at, mut out) = (0, Vec::new());
        while cpio[at..].starts_with(b"070701") {
            let h = &cpio[at..at + 110];
            let (mode, size, name_len) = (hex(&h[14..22]), hex(&h[54..62]), hex(&h[94..102]));
            let name = String::from_utf8_lossy(&cpio[at + 110..at + 110 + name_len - 1]).into_owned();
            let data_at = align(at + 110 + name_len);
            if name == "TRAILER!!!" {
                break;
            }
            out.push((name, mode as u32, cpio[data_at..data_at + size].to_vec()));
            at = align(data_at + size);
        }
        out
    }

    #[test]
    fn overlays_keep_modes_symlinks_and_empty_directories() {
        use std::os::unix::fs::PermissionsExt as _;
        if !Path::new("/bin/busybox").exists() {
            eprintln!("SKIPPED overlays_keep_modes_symlinks_and_empty_directories: no /bin/busybox here");
            return;
        }
        let dir = std::env::temp_dir().join(format!("xtask-overlay-{}", std::process::id()));
        let root = dir.join("root");
        fs::create_dir_all(root.join("usr/bin")).unwrap();
        fs::create_dir_all(root.join("usr/share/empty")).unwrap();
        fs::write(root.join("usr/bin/tool"), b"tool-bytes").unwrap();
        fs::set_permissions(root.join("usr/bin/tool"), fs::Permissions::from_mode(0o750)).unwrap();
        fs::write(root.join("usr/share/data.bin"), b"data").unwrap();
        fs::set_permissions(root.join("usr/share/data.bin"), fs::Permissions::from_mode(0o644)).unwrap();
        std::os::unix::fs::symlink("tool", root.join("usr/bin/alias")).unwrap();
        let init = dir.join("init");
        fs::write(&init, b"init").unwrap();
        let payload = Payload::Shell(String::new());
        let g = Guest {
            init: &init,
            dmaprof: None,
            modules: &[],
            payload: &payload,
            out_dir: "/out",
            hugepages_2m: 0,
            hugepages_1g: 0,
            host_files: &[],
            overlays: std::slice::from_ref(&root),
        };
        let all = entries(&write_to(Vec::new(), &g).unwrap());
        let get = |n: &str| all.iter().find(|e| e.0 == n).unwrap_or_else(|| panic!("{n} missing"));
        assert_eq!(get("usr/bin/tool").1, 0o100_750);
        assert_eq!(get("usr/bin/tool").2, b"tool-bytes");
        assert_eq!(get("usr/share/data.bin").1, 0o100_644);
        assert_eq!(
            (get("usr/bin/alias").1, &get("usr/bin/alias").2[..]),
            (0o120_777, &b"tool"[..])
        );
        assert_eq!(get("usr/share/empty").1, 0o040_755);
        let position = |n: &str| all.iter().position(|e| e.0 == n).unwrap();
        assert!(position("usr") < position("usr/share") && position("usr/share") < position("usr/share/data.bin"));
        assert_eq!(all.iter().filter(|e| e.0 == "usr").count(), 1, "each directory once");
        let _ = fs::remove_dir_all(&dir);
    }
}
