//! The crate's shape, checked on its source: data flows one way (no module imports one that
//! imports it back, directly or through others), and functions stay short enough to read at
//! once (tests included).
use std::{
    collections::{BTreeMap, BTreeSet},
    fs,
    path::Path,
};

const MAX_FN_LINES: usize = 80;

/// `main.rs` parses, dispatches and maps errors to exit codes; anything more belongs in a module.
const MAX_MAIN_LINES: usize = 150;

/// Each module's source without comments and without its `#[cfg(test)]` part.
fn modules() -> BTreeMap<String, String> {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let mut out = BTreeMap::new();
    for e in fs::read_dir(&dir).unwrap().flatten() {
        let name = e.file_name().to_string_lossy().into_owned();
        let Some(stem) = name.strip_suffix(".rs") else { continue };
        if stem == "lib" || stem == "main" {
            continue;
        }
        let text = fs::read_to_string(e.path()).unwrap();
        let code = text.split("#[cfg(test)]").next().unwrap_or_default();
        let code: String = code
            .lines()
            .filter(|l| !l.trim_start().starts_with("//"))
            .map(|l| l.to_owned() + "\n")
            .collect();
        out.insert(stem.to_owned(), code);
    }
    out
}

/// The crate modules `code` refers to (`crate::x` paths and `use crate::{x, ...}` groups).
fn imports(code: &str, modules: &BTreeSet<String>) -> BTreeSet<String> {
    let mut found = BTreeSet::new();
    for (i, _) in code.match_indices("crate::") {
        let rest = &code[i + "crate::".len()..];
        let body = match rest.strip_prefix('{') {
            Some(group) => &group[..group.find("};").unwrap_or(group.len())],
            None => {
                &rest[..rest
                    .find(|c: char| !(c.is_alphanumeric() || c == '_'))
                    .unwrap_or(rest.len())]
            }
        };
        for word in body.split(|c: char| !(c.is_alphanumeric() || c == '_' || c == ':')) {
            let head = word.split("::").next().unwrap_or_default();
            if modules.contains(head) {
                found.insert(head.to_owned());
            }
        }
    }
    found
}

#[test]
fn no_module_imports_one_that_imports_it_back() {
    let mods = modules();
    let names: BTreeSet<String> = mods.keys().cloned().collect();
    let deps: BTreeMap<&str, BTreeSet<String>> = mods
        .iter()
        .map(|(m, code)| {
            let mut d = imports(code, &names);
            d.remove(m);
            (m.as_str(), d)
        })
        .collect();
    for start in deps.keys() {
        // Depth-first from each module: reaching it again is a cycle.
        let mut stack: Vec<(&str, Vec<&str>)> = vec![(start, vec![start])];
        let mut seen = BTreeSet::new();
        while let Some((m, path)) = stack.pop() {
            for d in &deps[m] {
                let mut p = path.clone();
                p.push(d);
                assert!(d != start, "import cycle: {}", p.join(" -> "));
                if seen.insert(d.as_str()) {
                    stack.push((d, p));
                }
            }
        }
    }
    assert!(deps["category"].is_empty(), "the category table depends on nothing");
    assert!(deps["facts"].is_empty(), "the shared fact types depend on nothing");
    assert!(deps["phase"].is_empty(), "the phase names depend on nothing");
}

#[test]
fn the_checker_sees_imports() {
    let names: BTreeSet<String> = ["a", "b", "c"].iter().map(ToString::to_string).collect();
    let code = "use crate::{a::X, b};\nfn f() { crate::c::g(); }\n";
    assert_eq!(imports(code, &names), names);
}

/// `(name, lines)` of every function in `code` (a `fn` line up to its closing brace at the
/// same indentation).
fn functions(code: &str) -> Vec<(String, usize)> {
    let lines: Vec<&str> = code.lines().collect();
    let mut out = Vec::new();
    for (i, l) in lines.iter().enumerate() {
        let t = l.trim_start();
        let is_fn = [
            "fn ",
            "pub fn ",
            "pub(crate) fn ",
            "async fn ",
            "pub async fn ",
            "const fn ",
            "pub const fn ",
        ]
        .iter()
        .any(|p| t.starts_with(p));
        if !is_fn || t.ends_with(';') {
            continue;
        }
        let indent = l.len() - t.len();
        let end = lines[i + 1..]
            .iter()
            .position(|e| e.len() - e.trim_start().len() == indent && e.trim_start().starts_with('}'))
            .map_or(0, |n| n + 1);
        let name = t.split("fn ").nth(1).unwrap_or_default();
        let name = name.split(['(', '<']).next().unwrap_or_default().to_owned();
        out.push((name, end + 1));
    }
    out
}

/// Every Rust file of the crate (`src/` with `main.rs`, `lib.rs` and the test modules, and
/// `tests/`), named by its path, without comment lines.
fn all_sources() -> BTreeMap<String, String> {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let mut out = BTreeMap::new();
    for dir in ["src", "tests"] {
        for e in fs::read_dir(root.join(dir)).unwrap().flatten() {
            let name = e.file_name().to_string_lossy().into_owned();
            if !name.ends_with(".rs") {
                continue;
            }
            let text = fs::read_to_string(e.path()).unwrap();
            let code: String = text
                .lines()
                .filter(|l| !l.trim_start().starts_with("//"))
                .map(|l| l.to_owned() + "\n")
                .collect();
            out.insert(format!("{dir}/{name}"), code);
        }
    }
    out
}

#[test]
fn functions_stay_short() {
    let sources = all_sources();
    assert!(
        ["src/main.rs", "src/attribution.rs", "tests/host.rs"]
            .iter()
            .all(|f| sources.contains_key(*f)),
        "main.rs, test modules and integration tests are checked too"
    );
    let mut long = Vec::new();
    for (m, code) in sources {
        for (f, n) in functions(&code) {
            if n > MAX_FN_LINES {
                long.push(format!("{m}::{f} ({n} lines)"));
            }
        }
    }
    assert!(
        long.is_empty(),
        "functions over {MAX_FN_LINES} lines: {}",
        long.join(", ")
    );
}

#[test]
fn main_stays_thin() {
    let main = fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join("src/main.rs")).unwrap();
    let n = main.lines().count();
    assert!(
        n < MAX_MAIN_LINES,
        "main.rs has {n} lines, fewer than {MAX_MAIN_LINES} wanted"
    );
}

/// The comments of Rust source `text`: `//` and `/* */` comments (doc comments included), each
/// with its line number, string and char literals skipped.
fn comments(text: &str) -> Vec<(usize, String)> {
    let chars: Vec<char> = text.chars().collect();
    let (mut out, mut line, mut i) = (Vec::new(), 1, 0);
    let at = |i: usize, s: &str| s.chars().enumerate().all(|(k, c)| chars.get(i + k) == Some(&c));
    while i < chars.len() {
        let start_line = line;
        let end = if at(i, "//") {
            chars[i..]
                .iter()
                .position(|c| *c == '\n')
                .map_or(chars.len(), |n| i + n)
        } else if at(i, "/*") {
            chars[i..]
                .windows(2)
                .position(|w| w == ['*', '/'])
                .map_or(chars.len(), |n| i + n + 2)
        } else if chars[i] == '"' || (chars[i] == 'r' && matches!(chars.get(i + 1), Some('"' | '#'))) {
            // A string: plain (escapes skipped) or raw (ends at `"` and as many `#` as it began with).
            let hashes = chars[i + 1..].iter().take_while(|c| **c == '#').count();
            let mut j = i + 1 + hashes + usize::from(chars[i] == 'r');
            let close: String = std::iter::once('"').chain(std::iter::repeat_n('#', hashes)).collect();
            while j < chars.len() && !at(j, &close) {
                j += if chars[i] == '"' && chars[j] == '\\' { 2 } else { 1 };
            }
            line += chars[i..j.min(chars.len())].iter().filter(|c| **c == '\n').count();
            i = j + close.len();
            continue;
        } else if chars[i] == '\'' && (chars.get(i + 2) == Some(&'\'') || chars.get(i + 1) == Some(&'\\')) {
            // A char literal ('"', '\''); a lifetime has no closing quote and is left alone.
            i += chars[i + 2..].iter().position(|c| *c == '\'').map_or(1, |n| n + 3);
            continue;
        } else {
            line += usize::from(chars[i] == '\n');
            i += 1;
            continue;
        };
        let comment: String = chars[i..end].iter().collect();
        line += comment.matches('\n').count();
        out.push((start_line, comment));
        i = end;
    }
    out
}

/// What a comment must not point at: addresses outside the repository, issue numbers (they
/// mean nothing once the tracker moves), and other projects cited as the model for our code.
fn points_outside(comment: &str) -> Option<String> {
    let lower = comment.to_lowercase();
    if let Some(i) = lower.find("http://").or_else(|| lower.find("https://")) {
        return Some(comment[i..].split_whitespace().next().unwrap_or_default().to_owned());
    }
    let numbered_after = |marker: &str| {
        lower
            .match_indices(marker)
            .any(|(i, _)| lower[i + marker.len()..].starts_with(|c: char| c.is_ascii_digit()))
    };
    if numbered_after("issue ") || numbered_after("issues ") || numbered_after("#") {
        return Some("an issue number".to_owned());
    }
    ["retsnoop", "samply", "ripgrep", "aya-template", "libbpf-tools"]
        .iter()
        .find(|p| lower.contains(*p))
        .map(|p| format!("another project ({p})"))
}

/// The Rust files under `dir`, recursively.
fn rust_files(dir: &Path) -> Vec<std::path::PathBuf> {
    let mut out = Vec::new();
    for e in fs::read_dir(dir).unwrap().flatten() {
        let p = e.path();
        if p.is_dir() {
            out.extend(rust_files(&p));
        } else if p.extension().is_some_and(|x| x == "rs") {
            out.push(p);
        }
    }
    out
}

#[test]
fn comments_point_inside_the_repository() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    let mut files = vec![root.join("profiler/build.rs")];
    for dir in ["profiler/src", "profiler/tests", "profiler-ebpf/src", "xtask/src"] {
        files.extend(rust_files(&root.join(dir)));
    }
    assert!(files.len() > 40, "the scan sees the workspace: {} files", files.len());
    let mut bad = Vec::new();
    for f in files {
        for (line, c) in comments(&fs::read_to_string(&f).unwrap()) {
            if let Some(what) = points_outside(&c) {
                bad.push(format!(
                    "{}:{line}: {what}",
                    f.strip_prefix(&root).unwrap_or(&f).display()
                ));
            }
        }
    }
    assert!(
        bad.is_empty(),
        "comments pointing outside the repository:\n{}",
        bad.join("\n")
    );
}

#[test]
fn the_comment_scan_finds_what_it_should() {
    let src = "let u = \"https://x//y\"; // see issue 12\nlet c = '\"'; /* #34 */ let l: &'a str;\n/// as retsnoop does\nlet r = r#\"// https://z\"#;\n";
    let found: Vec<(usize, Option<String>)> = comments(src).iter().map(|(l, c)| (*l, points_outside(c))).collect();
    assert_eq!(
        found,
        [
            (1, Some("an issue number".to_owned())),
            (2, Some("an issue number".to_owned())),
            (3, Some("another project (retsnoop)".to_owned())),
        ]
    );
    assert_eq!(
        points_outside("// https://example.org/a b").as_deref(),
        Some("https://example.org/a")
    );
    assert_eq!(points_outside("// #[derive] and 4 KiB"), None);
}

#[test]
fn types_leave_no_case_unreachable() {
    // A value that cannot occur is a type that allows it: pair the data instead.
    let found: Vec<String> = modules()
        .iter()
        .filter(|(_, code)| code.contains("unreachable!("))
        .map(|(m, _)| m.clone())
        .collect();
    assert!(found.is_empty(), "unreachable! in: {found:?}");
}

/// README's Layout section names every source file of the profiler and of xtask, one line
/// each, so a new module cannot arrive undescribed.
#[test]
fn readme_layout_names_every_module() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    let readme = fs::read_to_string(root.join("README.md")).unwrap();
    let layout = readme
        .split("## Layout")
        .nth(1)
        .and_then(|s| s.split("\n## ").next())
        .expect("README has a Layout section");
    let mut missing = Vec::new();
    for dir in ["profiler/src", "xtask/src", "xtask/src/vm", "xtask/src/bin"] {
        for e in fs::read_dir(root.join(dir)).unwrap().flatten() {
            let name = e.file_name().to_string_lossy().into_owned();
            if !name.ends_with(".rs") {
                continue;
            }
            let stem = name.trim_end_matches(".rs");
            let named = layout.contains(&format!("`{name}`"))
                || layout.contains(&format!("/{name}`"))
                || layout.contains(&format!("`vm/{name}`"))
                || layout.contains(&format!(",{stem},"))
                || layout.contains(&format!("{{{stem},"));
            if !named {
                missing.push(format!("{dir}/{name}"));
            }
        }
    }
    assert!(missing.is_empty(), "README Layout does not describe: {missing:?}");
}
