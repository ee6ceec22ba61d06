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
