//! `dmaprof doctor --leftovers`: any dmaprof BPF program, BPF link, kprobe event or process
//! still alive.
use std::{fs, path::Path, time::Duration};

use serde::{Deserialize, Serialize};

use crate::abi;

/// What an ended (or killed) dmaprof could have left behind. The kernel drops programs, links
/// and perf kprobes when the last fd closes, so anything here means a dmaprof process still
/// lives or something pinned them; `doctor --leftovers` exits 1 then.
#[derive(Clone, Debug, Default, Serialize, Deserialize, PartialEq, Eq)]
pub struct Leftovers {
    /// Loaded BPF programs that are dmaprof's (name and maps match): "id <n> <name>".
    pub programs: Vec<String>,
    /// BPF link ids whose program is one of those.
    pub links: Vec<u32>,
    /// tracefs kprobe/uprobe events that aya created (`aya_<pid>_...`).
    pub kprobe_events: Vec<String>,
    /// Other processes named dmaprof.
    pub processes: Vec<u32>,
}

impl Leftovers {
    /// Nothing left behind.
    pub fn is_empty(&self) -> bool {
        *self == Self::default()
    }
}

/// What was found, as JSON or as text.
pub fn render_as(l: &Leftovers, json: bool) -> String {
    if json {
        serde_json::to_string_pretty(l).expect("leftovers serialise") + "\n"
    } else {
        render_leftovers(l)
    }
}

/// Looks for dmaprof's programs, links, tracefs probe events and processes. The kernel frees a
/// program only after an RCU grace period once its last reference is gone, so programs with no
/// process and no link left get up to two seconds to disappear before they count.
pub fn leftovers() -> Leftovers {
    let deadline = std::time::Instant::now() + Duration::from_secs(2);
    loop {
        let l = leftovers_now();
        let only_programs = l.links.is_empty() && l.processes.is_empty() && l.kprobe_events.is_empty();
        if l.is_empty() || !only_programs || std::time::Instant::now() >= deadline {
            return l;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

fn leftovers_now() -> Leftovers {
    use aya::{maps::MapInfo, programs::loaded_links, programs::loaded_programs};
    let ours = |p: &aya::programs::ProgramInfo| {
        let named = p.name_as_str().is_some_and(|n| {
            abi::programs::ALL.contains(&n)
                || n.starts_with(abi::programs::ROW_FENTRY_PREFIX)
                || n.starts_with(abi::programs::ROW_FEXIT_PREFIX)
        });
        // A name alone could be anyone's `sys_enter`; our programs also use our maps.
        let our_maps = p.map_ids().ok().flatten().unwrap_or_default().into_iter().any(|id| {
            MapInfo::from_id(id)
                .ok()
                .and_then(|m| m.name_as_str().map(|n| abi::maps::ALL.contains(&n)))
                .unwrap_or(false)
        });
        named && our_maps
    };
    let mut program_ids = Vec::new();
    let mut programs = Vec::new();
    for p in loaded_programs().flatten().filter(ours) {
        program_ids.push(p.id());
        programs.push(format!("id {} {}", p.id(), p.name_as_str().unwrap_or("?")));
    }
    let links = loaded_links()
        .flatten()
        .filter(|l| program_ids.contains(&l.program_id()))
        .map(|l| l.id())
        .collect();
    let mut kprobe_events = Vec::new();
    for dir in ["/sys/kernel/tracing", "/sys/kernel/debug/tracing"] {
        for file in ["kprobe_events", "uprobe_events"] {
            if let Ok(text) = fs::read_to_string(Path::new(dir).join(file)) {
                kprobe_events.extend(text.lines().filter(|l| l.contains("/aya_")).map(str::to_owned));
            }
        }
    }
    kprobe_events.sort();
    kprobe_events.dedup();
    let me = std::process::id();
    let processes = fs::read_dir("/proc")
        .map(|d| {
            d.flatten()
                .filter_map(|e| e.file_name().to_str()?.parse::<u32>().ok())
                .filter(|&pid| pid != me)
                .filter(|pid| fs::read_to_string(format!("/proc/{pid}/comm")).is_ok_and(|c| c.trim_end() == "dmaprof"))
                .collect()
        })
        .unwrap_or_default();
    Leftovers {
        programs,
        links,
        kprobe_events,
        processes,
    }
}

/// The `doctor --leftovers` text.
pub fn render_leftovers(l: &Leftovers) -> String {
    if l.is_empty() {
        return "leftovers: none (no dmaprof programs, links, kprobe events or processes)\n".into();
    }
    let mut s = String::from("leftovers:\n");
    for p in &l.programs {
        s += &format!("  bpf program {p}\n");
    }
    for id in &l.links {
        s += &format!("  bpf link id {id}\n");
    }
    for e in &l.kprobe_events {
        s += &format!("  probe event {e}\n");
    }
    for pid in &l.processes {
        s += &format!("  dmaprof process {pid} (it holds the rest; it ends on SIGTERM)\n");
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rendering_names_every_kind() {
        assert!(render_leftovers(&Leftovers::default()).contains("none"));
        let l = Leftovers {
            programs: vec!["id 7 sys_exit".into()],
            links: vec![3],
            kprobe_events: vec!["p:kprobes/aya_1_x x".into()],
            processes: vec![42],
        };
        let text = render_leftovers(&l);
        for want in ["id 7 sys_exit", "link id 3", "aya_1_x", "process 42"] {
            assert!(text.contains(want), "{want} in {text}");
        }
        assert!(!l.is_empty());
    }
}
