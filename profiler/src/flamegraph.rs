//! Folded stacks (Brendan Gregg's format) and SVG flamegraphs (rendered by inferno).
use std::{collections::BTreeMap, fs, io, path::Path};

use crate::category::{CATEGORIES, Category, category_of, in_context};

/// A folded-stack line that does not parse.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum FoldedError {
    /// No count after the stack.
    #[error("line {0}: no count after the stack")]
    NoCount(usize),
    /// The count is not a number.
    #[error("line {0}: bad count `{1}`")]
    BadCount(usize, String),
}

/// The category a flamegraph frame is coloured with: the table's category for kernel functions
/// it knows (under the context rules its callers `outer` trigger), `user` for user-space
/// frames, `other` for the rest.
fn frame_category(frame: &str, outer: &[&str]) -> Category {
    if frame == "[user]" {
        return Category::User;
    }
    let name = frame.strip_prefix("cat:").unwrap_or(frame);
    CATEGORIES
        .iter()
        .copied()
        .find(|c| c.name() == name)
        .or_else(|| category_of(frame).map(|c| in_context(c, outer.iter().copied())))
        .unwrap_or(Category::Other)
}

/// A palette that colours every frame of `folded` by its category. A frame's colour is set by
/// the first stack it appears in (a function is coloured once per flamegraph).
fn category_palette(folded: &Folded) -> inferno::flamegraph::color::PaletteMap {
    let mut text = String::new();
    let mut seen = std::collections::HashSet::new();
    for stack in folded.stacks.keys() {
        let frames: Vec<&str> = stack.split(';').collect();
        for (i, frame) in frames.iter().enumerate() {
            if seen.insert(*frame) {
                let (r, g, b) = frame_category(frame, &frames[..i]).color();
                text.push_str(&format!("{frame}->rgb({r},{g},{b})\n"));
            }
        }
    }
    inferno::flamegraph::color::PaletteMap::from_reader(&mut text.as_bytes()).unwrap_or_default()
}

/// An SVG group with one coloured box and name per category, for the top-right corner.
fn legend(width: usize) -> String {
    let mut g = String::from(r#"<g id="dmaprof-legend" font-family="Verdana" font-size="11">"#);
    let x0 = width.saturating_sub(120);
    for (i, c) in CATEGORIES.iter().enumerate() {
        let (r, gr, b) = c.color();
        let y = 30 + i * 15;
        g.push_str(&format!(
            r#"<rect x="{x0}" y="{y}" width="12" height="12" fill="rgb({r},{gr},{b})" stroke="black" stroke-width="0.5"/><text x="{}" y="{}">{}</text>"#,
            x0 + 16,
            y + 10,
            c.name()
        ));
    }
    g.push_str("</g>");
    g
}

/// Renders folded `lines` (or differential lines) to an SVG at `path`, coloured by category
/// unless `differential`, with a category legend.
fn render(path: &Path, title: &str, count_name: &str, lines: &str, palette: Option<&Folded>) -> io::Result<()> {
    let mut opts = inferno::flamegraph::Options::default();
    opts.title = title.to_owned();
    opts.count_name = count_name.to_owned();
    opts.deterministic = true;
    let mut palette_map = palette.map(category_palette);
    if let Some(map) = palette_map.as_mut() {
        opts.palette_map = Some(map);
    } else {
        opts.colors = inferno::flamegraph::color::Palette::Basic(inferno::flamegraph::color::BasicPalette::Hot);
    }
    let width = opts.image_width.unwrap_or(1200);
    let mut svg = Vec::new();
    if lines.trim().is_empty() {
        // inferno refuses empty input; an SVG that says so keeps every phase's file valid.
        svg = format!(
            r#"<?xml version="1.0" standalone="no"?><svg version="1.1" width="600" height="60" xmlns="http://www.w3.org/2000/svg"><text x="10" y="30">{}: no samples</text></svg>"#,
            xml_escape(title)
        )
        .into_bytes();
    } else {
        inferno::flamegraph::from_lines(&mut opts, lines.lines(), &mut svg).map_err(io::Error::other)?;
        if palette.is_some() {
            let text = String::from_utf8_lossy(&svg).into_owned();
            if let Some(end) = text.rfind("</svg>") {
                svg = format!("{}{}{}", &text[..end], legend(width), &text[end..]).into_bytes();
            }
        }
    }
    fs::write(path, svg)
}

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
    pub fn parse(text: &str) -> Result<Self, FoldedError> {
        let mut f = Folded::default();
        for (i, line) in text.lines().enumerate().filter(|(_, l)| !l.trim().is_empty()) {
            let (stack, count) = line.rsplit_once(' ').ok_or(FoldedError::NoCount(i + 1))?;
            let count: u64 = count
                .trim()
                .parse()
                .map_err(|_| FoldedError::BadCount(i + 1, count.to_owned()))?;
            *f.stacks.entry(stack.to_owned()).or_default() += count;
        }
        Ok(f)
    }

    /// Writes `<stem>.folded` and `<stem>.svg`, frames coloured by category, with a legend.
    pub fn write(&self, dir: &Path, stem: &str, title: &str) -> io::Result<()> {
        self.write_counted(dir, stem, title, "samples")
    }

    /// As [`Folded::write`], with the name of what the counts count (samples, ns).
    pub fn write_counted(&self, dir: &Path, stem: &str, title: &str, count_name: &str) -> io::Result<()> {
        let text = self.to_text();
        fs::write(dir.join(format!("{stem}.folded")), &text)?;
        render(&dir.join(format!("{stem}.svg")), title, count_name, &text, Some(self))
    }
}

/// Writes a differential flamegraph (`before` -> `after`, red = grew, blue = shrank) and its
/// two-count folded lines to `<stem>.folded` / `<stem>.svg` in `dir`.
pub fn write_differential(before: &Folded, after: &Folded, dir: &Path, stem: &str, title: &str) -> io::Result<()> {
    let text = differential(before, after);
    fs::write(dir.join(format!("{stem}.folded")), &text)?;
    render(&dir.join(format!("{stem}.svg")), title, "samples", &text, None)
}

/// The differential folded format (`stack before after` per line, as difffolded.pl writes it).
/// Done here rather than with inferno's differential module: that one hashes with ahash, whose
/// seed comes from getrandom, which waits for the kernel's entropy pool; on a fresh VM or test
/// machine that can be forever.
pub fn differential(before: &Folded, after: &Folded) -> String {
    let stacks: std::collections::BTreeSet<&String> = before.stacks.keys().chain(after.stacks.keys()).collect();
    stacks
        .into_iter()
        .map(|s| {
            let count = |f: &Folded| f.stacks.get(s).copied().unwrap_or(0);
            format!("{s} {} {}\n", count(before), count(after))
        })
        .collect()
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
    fn differential_lines_pair_the_counts() {
        let mut a = Folded::default();
        a.add(["map", "pin"], 3);
        a.add(["map", "zero"], 1);
        let mut b = Folded::default();
        b.add(["map", "pin"], 5);
        b.add(["map", "flush"], 2);
        assert_eq!(differential(&a, &b), "map;flush 0 2\nmap;pin 3 5\nmap;zero 1 0\n");
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
        let mut after = Folded::default();
        after.add(["mmap", "clear_page_erms"], 9);
        write_differential(&f, &after, &dir, "d", "diff").unwrap();
        let d = fs::read_to_string(dir.join("d.folded")).unwrap();
        assert!(d.contains("mmap;clear_page_erms 5 9"), "{d}");
        assert!(fs::read_to_string(dir.join("d.svg")).unwrap().contains("<svg"));
        fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn frames_are_coloured_by_category() {
        assert_eq!(frame_category("clear_page_erms", &[]), Category::Zeroing);
        assert_eq!(frame_category("[user]", &[]), Category::User);
        assert_eq!(frame_category("cat:pinning", &[]), Category::Pinning);
        assert_eq!(frame_category("mmap", &[]), Category::Other);
        assert_eq!(
            frame_category("vfio_pin_pages_remote_[vfio_iommu_type1]", &[]),
            Category::Pinning
        );
        let populate = ["mmap", "vm_mmap_pgoff", "__mm_populate", "populate_vma_page_range"];
        assert_eq!(frame_category("__get_user_pages", &populate), Category::Faulting);
        let mut f = Folded::default();
        f.add(["mmap", "handle_mm_fault", "clear_page_erms"], 1);
        let p = category_palette(&f);
        let z = Category::Zeroing.color();
        let c = p.get("clear_page_erms").unwrap();
        assert_eq!((c.r, c.g, c.b), z);
        assert!(legend(1200).contains("iommu_flush"));
    }
}
