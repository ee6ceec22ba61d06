//! The kernel's own KTAP parser (`tools/testing/kunit/kunit_parser.py`, from the
//! linux-source package the custom guest kernel is built from), to read dmaprof's KTAP output
//! with a parser nobody here wrote.
use std::{
    fs,
    path::{Path, PathBuf},
    process::Command,
};

/// Why the kernel's KTAP parser could not be found or run.
#[derive(Debug, thiserror::Error)]
pub enum KunitError {
    /// The apt package cache is not there.
    #[error("no package cache at {}: {source}", dir.display())]
    NoCache {
        /// The cache directory looked at.
        dir: PathBuf,
        /// Why it could not be read.
        source: std::io::Error,
    },
    /// The cache holds no linux-source package.
    #[error("no linux-source package in the cache (the custom kernel build downloads it)")]
    NoSourcePackage,
    /// A file or program the extraction needs failed.
    #[error("{what}: {source}")]
    Io {
        /// What was being done.
        what: String,
        /// What failed.
        source: std::io::Error,
    },
    /// The package did not extract.
    #[error("extracting kunit_parser.py failed ({0})")]
    Extract(std::process::ExitStatus),
    /// The package has no kunit_parser.py.
    #[error("no kunit_parser.py in {}", .0.display())]
    NotInPackage(PathBuf),
    /// kunit_parser failed; its stderr.
    #[error("kunit_parser failed: {0}")]
    Parser(String),
    /// kunit_parser printed something else than the counts asked for.
    #[error("unexpected output {0:?}")]
    Output(String),
}

/// The directory holding kunit_parser.py, extracted once from the cached linux-source package
/// into `<cache>/kunit/<package file stem>`; Err says why it is not there (the check is then
/// skipped with that reason).
pub fn parser_dir(cache: &Path) -> Result<PathBuf, KunitError> {
    let archives = cache.join("apt/archives");
    let deb = fs::read_dir(&archives)
        .map_err(|source| KunitError::NoCache {
            dir: archives.clone(),
            source,
        })?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| {
            let name = p.file_name().unwrap_or_default().to_string_lossy();
            name.starts_with("linux-source-") && name.ends_with(".deb")
        })
        .max()
        .ok_or(KunitError::NoSourcePackage)?;
    let stem = deb.file_stem().unwrap_or_default().to_string_lossy().into_owned();
    let dir = cache.join("kunit").join(stem);
    let found = |d: &Path| {
        walk(d)
            .into_iter()
            .find(|p| p.ends_with("tools/testing/kunit/kunit_parser.py"))
            .and_then(|p| p.parent().map(Path::to_path_buf))
    };
    if let Some(d) = found(&dir) {
        return Ok(d);
    }
    fs::create_dir_all(&dir).map_err(|source| KunitError::Io {
        what: format!("creating {}", dir.display()),
        source,
    })?;
    eprintln!(
        "xtask: extracting the kernel's KTAP parser from {} (once)",
        deb.display()
    );
    // The package holds the tree as one .tar.xz: stream it out of the .deb and take the
    // parser's directory only.
    let script = format!(
        "dpkg-deb --fsys-tarfile '{}' | tar -xO --wildcards '*.tar.xz' | tar -xJ -C '{}' --wildcards '*/tools/testing/kunit/*.py'",
        deb.display(),
        dir.display()
    );
    let status = Command::new("sh")
        .args(["-c", &script])
        .status()
        .map_err(|source| KunitError::Io {
            what: "running sh".into(),
            source,
        })?;
    if !status.success() {
        return Err(KunitError::Extract(status));
    }
    found(&dir).ok_or(KunitError::NotInPackage(deb))
}

/// Every file below `dir`.
fn walk(dir: &Path) -> Vec<PathBuf> {
    let mut out = Vec::new();
    let Ok(entries) = fs::read_dir(dir) else {
        return out;
    };
    for e in entries.flatten() {
        let p = e.path();
        if p.is_dir() {
            out.extend(walk(&p));
        } else {
            out.push(p);
        }
    }
    out
}

/// What kunit_parser made of a KTAP text.
#[derive(Debug, PartialEq, Eq)]
pub struct Parsed {
    /// The top-level status (`SUCCESS`, `FAILURE`, `SKIPPED`, ...).
    pub status: String,
    /// Passed, failed, skipped and errors, as the parser counts them.
    pub counts: [u32; 4],
    /// Tests (cases) found.
    pub tests: u32,
}

/// Parses `ktap` (a file) with kunit_parser from `parser`.
pub fn parse(parser: &Path, ktap: &Path) -> Result<Parsed, KunitError> {
    let code = "import sys; sys.path.insert(0, sys.argv[1]); import kunit_parser, kunit_printer; \
                t = kunit_parser.parse_run_tests(open(sys.argv[2]), kunit_printer.null_printer); c = t.counts; \
                print(t.status.name, c.passed, c.failed, c.skipped, c.errors, len(t.subtests))";
    let out = Command::new("python3")
        .args(["-c", code])
        .arg(parser)
        .arg(ktap)
        .output()
        .map_err(|source| KunitError::Io {
            what: "python3".into(),
            source,
        })?;
    if !out.status.success() {
        return Err(KunitError::Parser(String::from_utf8_lossy(&out.stderr).into_owned()));
    }
    let text = String::from_utf8_lossy(&out.stdout);
    let words: Vec<&str> = text.split_whitespace().collect();
    let num = |i: usize| {
        words
            .get(i)
            .and_then(|w| w.parse().ok())
            .ok_or_else(|| KunitError::Output(text.clone().into_owned()))
    };
    Ok(Parsed {
        status: words.first().copied().unwrap_or_default().to_owned(),
        counts: [num(1)?, num(2)?, num(3)?, num(4)?],
        tests: num(5)?,
    })
}

#[cfg(test)]
mod unit {
    use super::*;

    #[test]
    fn a_cache_without_the_package_says_why() {
        let cache = std::env::temp_dir().join(format!("xtask-kunit-{}", std::process::id()));
        let _ = fs::remove_dir_all(&cache);
        assert!(matches!(parser_dir(&cache), Err(KunitError::NoCache { .. })));
        fs::create_dir_all(cache.join("apt/archives")).unwrap();
        let why = parser_dir(&cache).unwrap_err();
        assert!(matches!(why, KunitError::NoSourcePackage), "{why}");
        assert!(why.to_string().contains("no linux-source package"));
        fs::remove_dir_all(&cache).unwrap();
    }
}
