//! Writing a run's files: the output directory, each case's folded stacks and flamegraphs, and
//! report.json (written to a temporary file and renamed, so it is never left half-written).
use std::{
    fs,
    path::{Path, PathBuf},
};

use crate::{attribution::CaseOutput, report::Report};

/// A file or directory that could not be written (the cause follows as the error's source).
#[derive(Debug, thiserror::Error)]
#[error("cannot write {path} ({})", hint(source))]
pub struct OutputError {
    /// What.
    pub path: String,
    /// Why.
    pub source: std::io::Error,
}

/// What to do about a failed write.
fn hint(e: &std::io::Error) -> &'static str {
    match e.raw_os_error() {
        Some(libc::ENOSPC | libc::EDQUOT) => "its file system is full: free space or choose another --out",
        _ => "choose a writable --out directory",
    }
}

fn at(path: &Path) -> impl FnOnce(std::io::Error) -> OutputError + '_ {
    move |source| OutputError {
        path: path.display().to_string(),
        source,
    }
}

/// The output directory, created for the run: the directories dmaprof had to make are removed
/// again on drop if the run wrote nothing into them, so a failed start leaves nothing behind.
#[derive(Debug)]
pub struct OutDir {
    /// The directory.
    pub path: PathBuf,
    created: Vec<PathBuf>,
}

/// Why an existing `--out` directory cannot take this run.
#[derive(Debug, thiserror::Error)]
#[error("--out {0} is not empty and holds no dmaprof report: choose a new or empty directory")]
pub struct NotOurs(pub String);

/// Makes an existing `--out` directory ready: an empty one (or one holding only empty files) is
/// fine; one holding an earlier
/// dmaprof run loses that run's report and case folders (so no stale case mixes with the new
/// run); anything else is refused.
pub fn claim(path: &Path) -> Result<(), NotOurs> {
    let Ok(entries) = fs::read_dir(path) else {
        return Ok(());
    };
    // Empty files hold nothing to lose or mix up (a shell redirection into the directory
    // creates them before dmaprof starts): they count as empty.
    let holds_data = |e: &fs::DirEntry| e.metadata().is_ok_and(|m| !m.is_file() || m.len() > 0);
    let names: Vec<String> = entries
        .flatten()
        .filter(holds_data)
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .collect();
    if names.is_empty() {
        return Ok(());
    }
    let ours = fs::read_to_string(path.join("report.json"))
        .is_ok_and(|t| t.contains(crate::report::SCHEMA) || t.contains(crate::recording::SCHEMA));
    if !ours {
        return Err(NotOurs(path.display().to_string()));
    }
    let cases: Vec<String> = crate::matrix::all_cases()
        .iter()
        .map(crate::matrix::Case::name)
        .collect();
    for n in names.iter().filter(|n| cases.contains(n)) {
        let _ = fs::remove_dir_all(path.join(n));
    }
    let _ = fs::remove_file(path.join("report.json"));
    let _ = fs::remove_file(path.join(INDEX));
    Ok(())
}

impl OutDir {
    /// Creates `path` (and missing parents).
    pub fn create(path: PathBuf) -> Result<Self, OutputError> {
        // Leaf first, so dropping removes children before parents.
        let created = path
            .ancestors()
            .take_while(|a| !a.exists() && !a.as_os_str().is_empty())
            .map(Into::into)
            .collect();
        fs::create_dir_all(&path).map_err(at(&path))?;
        Ok(Self { path, created })
    }
}

impl Drop for OutDir {
    fn drop(&mut self) {
        for d in &self.created {
            // Fails (and keeps the directory) unless it is empty.
            let _ = fs::remove_dir(d);
        }
    }
}

/// Writes a case's folded stacks and flamegraphs (one per phase) and its exact summary into
/// `<dir>/<case>/`.
pub fn write_case(dir: &Path, case: &CaseOutput) -> Result<(), OutputError> {
    let name = &case.report.name;
    let case_dir = dir.join(name);
    let any_sampled = case.report.phases.iter().any(|p| p.folded.is_some());
    if !any_sampled && case.report.summary_flamegraph.is_none() {
        return Ok(());
    }
    fs::create_dir_all(&case_dir).map_err(at(&case_dir))?;
    let sampled = |p: &crate::workload::Phase| case.report.phases.iter().any(|r| r.name == *p && r.folded.is_some());
    for (phase, folded) in case.folded.iter().filter(|(p, _)| sampled(p)) {
        let stem = phase.name();
        folded
            .write(&case_dir, stem, &format!("{name}: {stem}"))
            .map_err(at(&case_dir.join(stem)))?;
    }
    if case.report.summary_flamegraph.is_none() {
        return Ok(());
    }
    case.summary
        .write_counted(
            &case_dir,
            "summary",
            &format!("{name}: exact time, phase -> category -> function"),
            "ns",
        )
        .map_err(at(&case_dir.join("summary.svg")))
}

/// Writes `text` to `path` through a temporary file in the same directory and a rename, so a
/// reader never sees it half-written.
pub fn write_atomic(path: &Path, text: &str) -> Result<(), OutputError> {
    let name = path
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    let tmp = path.with_file_name(format!(".{name}.tmp"));
    fs::write(&tmp, text).map_err(|e| {
        let _ = fs::remove_file(&tmp);
        at(path)(e)
    })?;
    fs::rename(&tmp, path).map_err(at(path))
}

/// Writes `report.json` into `dir`, atomically.
pub fn write_report(dir: &Path, report: &impl serde::Serialize) -> Result<PathBuf, OutputError> {
    let path = dir.join("report.json");
    let json = serde_json::to_string_pretty(report).expect("reports always serialise") + "\n";
    write_atomic(&path, &json)?;
    Ok(path)
}

/// Writes each sweep's plot (`<dir>/<case>/sweep.svg`).
pub fn write_sweeps(dir: &Path, sweeps: &[crate::report::Sweep]) -> Result<(), OutputError> {
    for s in sweeps {
        let Some(rel) = &s.plot else { continue };
        let path = dir.join(rel);
        if let Some(parent) = path.parent() {
            fs::create_dir_all(parent).map_err(at(parent))?;
        }
        write_atomic(&path, &crate::sweep::svg(s))?;
    }
    Ok(())
}

/// Writes `index.html` into `dir` (the report's directory, whose flamegraphs it embeds),
/// atomically.
pub fn write_index(dir: &Path, report: &Report) -> Result<PathBuf, OutputError> {
    let path = dir.join(INDEX);
    let html = crate::html::index(report, &|rel| fs::read_to_string(dir.join(rel)).ok());
    write_atomic(&path, &html)?;
    Ok(path)
}

/// The HTML report's file name, next to report.json.
pub const INDEX: &str = "index.html";

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_earlier_run_is_cleared_and_a_foreign_directory_refused() {
        let root = std::env::temp_dir().join(format!("dmaprof-claim-test-{}", std::process::id()));
        fs::create_dir_all(root.join("none_anonymous.none")).unwrap();
        fs::write(root.join("none_anonymous.none/mmap.svg"), "<svg/>").unwrap();
        fs::write(root.join("stdout.json"), "").unwrap();
        fs::write(root.join("notes.txt"), "mine").unwrap();
        assert!(claim(&root).is_err(), "no report.json: not ours");
        fs::remove_file(root.join("notes.txt")).unwrap();
        fs::remove_dir_all(root.join("none_anonymous.none")).unwrap();
        assert!(claim(&root).is_ok(), "only empty files: as good as empty");
        fs::create_dir_all(root.join("none_anonymous.none")).unwrap();
        fs::write(root.join("none_anonymous.none/mmap.svg"), "<svg/>").unwrap();
        fs::write(root.join("notes.txt"), "mine").unwrap();
        fs::write(root.join("report.json"), r#"{"schema":"dmaprof.report.v1"}"#).unwrap();
        claim(&root).unwrap();
        assert!(!root.join("none_anonymous.none").exists() && !root.join("report.json").exists());
        assert!(root.join("notes.txt").exists(), "only the run's own files go");
        fs::remove_dir_all(&root).unwrap();
        assert!(claim(&root).is_ok(), "a missing directory is fine");
    }

    #[test]
    fn created_directories_go_away_when_nothing_was_written() {
        let root = std::env::temp_dir().join(format!("dmaprof-out-test-{}", std::process::id()));
        let out = OutDir::create(root.join("a/b")).unwrap();
        assert!(out.path.is_dir());
        drop(out);
        assert!(!root.exists());
        let out = OutDir::create(root.join("c")).unwrap();
        fs::write(out.path.join("kept"), "x").unwrap();
        drop(out);
        assert!(root.join("c/kept").exists());
        fs::remove_dir_all(&root).unwrap();
    }
}
