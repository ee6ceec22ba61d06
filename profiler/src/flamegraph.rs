//! Folded stacks (Brendan Gregg's format) and SVG flamegraphs (rendered by inferno).
use std::{collections::BTreeMap, fs, io, path::Path};

/// Folded stacks: `root;..;leaf` -> sample count, sorted for stable output.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Folded {
    /// Stack (frames joined by `;`, root first) to count.
    pub stacks: BTreeMap<String, u64>,
}

impl Folded {
    /// Adds `count` samples of a stack given root first.
    pub fn add<S: AsRef<str>>(&mut self, frames_root_first: impl IntoIterator<Item = S>, count: u64) {
        let key = frames_root_first
            .into_iter()
            // `;` separates frames and a space ends the stack: keep both out of frame names.
            .map(|f| f.as_ref().replace([';', ' '], "_"))
            .collect::<Vec<_>>()
            .join(";");
        *self.stacks.entry(key).or_default() += count;
    }

    /// Total samples.
    pub fn total(&self) -> u64 {
        self.stacks.values().sum()
    }

    /// The folded text, one `stack count` line per stack.
    pub fn to_text(&self) -> String {
        self.stacks.iter().map(|(s, n)| format!("{s} {n}\n")).collect()
    }

    /// Parses folded text (as written by [`Folded::to_text`] or by other tools).
    pub fn parse(text: &str) -> Result<Self, String> {
        let mut f = Folded::default();
        for (i, line) in text.lines().enumerate().filter(|(_, l)| !l.trim().is_empty()) {
            let (stack, count) = line
                .rsplit_once(' ')
                .ok_or_else(|| format!("line {}: no count after the stack", i + 1))?;
            let count: u64 = count
                .trim()
                .parse()
                .map_err(|_| format!("line {}: bad count `{count}`", i + 1))?;
            *f.stacks.entry(stack.to_owned()).or_default() += count;
        }
        Ok(f)
    }

    /// Writes `<stem>.folded` and `<stem>.svg` (an SVG saying "no samples" when empty).
    pub fn write(&self, dir: &Path, stem: &str, title: &str) -> io::Result<()> {
        fs::write(dir.join(format!("{stem}.folded")), self.to_text())?;
        let mut opts = inferno::flamegraph::Options::default();
        opts.title = title.to_owned();
        opts.count_name = "samples".to_owned();
        opts.colors = inferno::flamegraph::color::Palette::Basic(inferno::flamegraph::color::BasicPalette::Hot);
        opts.hash = true;
        opts.deterministic = true;
        let text = self.to_text();
        let file = fs::File::create(dir.join(format!("{stem}.svg")))?;
        let mut writer = io::BufWriter::new(file);
        if self.stacks.is_empty() {
            // inferno refuses empty input; an SVG that says so keeps every phase's file valid.
            use io::Write as _;
            write!(
                writer,
                r#"<?xml version="1.0" standalone="no"?><svg version="1.1" width="600" height="60" xmlns="http://www.w3.org/2000/svg"><text x="10" y="30">{}: no samples</text></svg>"#,
                xml_escape(title)
            )?;
            return Ok(());
        }
        inferno::flamegraph::from_lines(&mut opts, text.lines(), &mut writer).map_err(io::Error::other)
    }
}

fn xml_escape(s: &str) -> String {
    s.replace('&', "&amp;").replace('<', "&lt;").replace('>', "&gt;")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fold_and_parse_round_trip() {
        let mut f = Folded::default();
        f.add(["mmap", "do_syscall_64", "clear_page_erms"], 3);
        f.add(["mmap", "do_syscall_64", "clear_page_erms"], 2);
        f.add(["touch", "[user]"], 7);
        f.add(["odd;name with space"], 1);
        assert_eq!(f.total(), 13);
        let parsed = Folded::parse(&f.to_text()).unwrap();
        assert_eq!(parsed, f);
        assert!(parsed.stacks.contains_key("odd_name_with_space"));
        assert!(Folded::parse("a;b notanumber").is_err());
        assert!(Folded::parse("nocount").is_err());
    }

    #[test]
    fn svg_is_written() {
        let dir = std::env::temp_dir().join(format!("dmaprof-fg-{}", std::process::id()));
        fs::create_dir_all(&dir).unwrap();
        let mut f = Folded::default();
        f.add(["mmap", "clear_page_erms"], 5);
        f.write(&dir, "x", "test").unwrap();
        let svg = fs::read_to_string(dir.join("x.svg")).unwrap();
        assert!(svg.contains("<svg") && svg.contains("clear_page_erms"));
        Folded::default().write(&dir, "empty", "empty").unwrap();
        assert!(fs::read_to_string(dir.join("empty.svg")).unwrap().contains("<svg"));
        fs::remove_dir_all(&dir).unwrap();
    }
}
