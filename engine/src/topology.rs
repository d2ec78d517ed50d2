//! NUMA topology from sysfs: the nodes, their CPUs, and the CPUs this process may run on.
//!
//! Also the parsers for CPU lists (`0-3,8`, as sysfs writes them) and core selections (SPDK's
//! `-c`: a hex mask `0xF0`, a list `0,2-3` or `[0,2-3]`), and pinning a thread to a CPU.

use std::io;
use std::path::{Path, PathBuf};

use nix::sched::{sched_getaffinity, sched_setaffinity, CpuSet};
use nix::unistd::Pid;

/// The largest CPU count the kernel supports (`NR_CPUS` ≤ 8192): bounds what the parsers accept.
const MAX_CPUS: usize = 8192;

const LIST_FORMS: &str = "expected a list like 0-3,8,10-11";
const CORE_FORMS: &str = "expected a hex mask like 0xF0, a list like 0,2-3, or [0,2-3]";

/// Why the topology could not be read or a CPU list not parsed.
#[derive(Debug, thiserror::Error)]
pub enum TopologyError {
    #[error("cannot read {}: {source}", path.display())]
    Read { path: PathBuf, source: io::Error },
    #[error("bad CPU list {input:?}: {reason} ({LIST_FORMS})")]
    CpuList { input: String, reason: String },
    #[error("bad core selection {input:?}: {reason} ({CORE_FORMS})")]
    Cores { input: String, reason: String },
    #[error("{} has no Cpus_allowed_list line", path.display())]
    NoAllowedList { path: PathBuf },
    #[error("cannot read this process's CPU affinity (sched_getaffinity): {0}")]
    Affinity(nix::Error),
}

/// A NUMA node and its CPUs (ascending).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NumaNode {
    pub id: u32,
    pub cpus: Vec<usize>,
}

/// The machine's NUMA nodes (ascending by id) and the CPUs this process may use (ascending).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Topology {
    pub nodes: Vec<NumaNode>,
    pub allowed: Vec<usize>,
}

impl Topology {
    /// A topology from its parts (sorted here), e.g. a faked one in tests.
    pub fn new(mut nodes: Vec<NumaNode>, mut allowed: Vec<usize>) -> Self {
        nodes.sort_by_key(|n| n.id);
        for node in &mut nodes {
            node.cpus.sort_unstable();
            node.cpus.dedup();
        }
        allowed.sort_unstable();
        allowed.dedup();
        Self { nodes, allowed }
    }

    /// Reads `<root>/sys/devices/system/node/node*/cpulist` (without node folders: one node 0
    /// with every CPU of `<root>/sys/devices/system/cpu/online`). The allowed CPUs come from
    /// `sched_getaffinity` when `root` is `/`, else from `<root>/proc/self/status`.
    pub fn from_sysfs(root: &Path) -> Result<Self, TopologyError> {
        let node_dir = root.join("sys/devices/system/node");
        let mut nodes = Vec::new();
        match std::fs::read_dir(&node_dir) {
            Ok(entries) => {
                for entry in entries {
                    let entry = entry.map_err(|source| read_error(&node_dir, source))?;
                    let name = entry.file_name();
                    let Some(id) = name.to_str().and_then(|n| n.strip_prefix("node")) else {
                        continue;
                    };
                    let Ok(id) = id.parse::<u32>() else { continue };
                    let cpus = parse_cpu_list(&read(&entry.path().join("cpulist"))?)?;
                    nodes.push(NumaNode { id, cpus });
                }
            }
            Err(e) if e.kind() == io::ErrorKind::NotFound => {}
            Err(source) => return Err(read_error(&node_dir, source)),
        }
        if nodes.is_empty() {
            let online = read(&root.join("sys/devices/system/cpu/online"))?;
            nodes.push(NumaNode {
                id: 0,
                cpus: parse_cpu_list(&online)?,
            });
        }
        let allowed = if root == Path::new("/") {
            let set = sched_getaffinity(Pid::from_raw(0)).map_err(TopologyError::Affinity)?;
            (0..CpuSet::count())
                .filter(|&cpu| set.is_set(cpu).unwrap_or(false))
                .collect()
        } else {
            let path = root.join("proc/self/status");
            let status = read(&path)?;
            let list = status
                .lines()
                .find_map(|l| l.strip_prefix("Cpus_allowed_list:"))
                .ok_or(TopologyError::NoAllowedList { path })?;
            parse_cpu_list(list)?
        };
        Ok(Self::new(nodes, allowed))
    }

    /// The node of `cpu`, if any node lists it.
    pub fn node_of(&self, cpu: usize) -> Option<u32> {
        self.nodes
            .iter()
            .find(|n| n.cpus.contains(&cpu))
            .map(|n| n.id)
    }

    /// The CPUs of `node` (empty for an unknown node).
    pub fn cpus_of(&self, node: u32) -> &[usize] {
        self.nodes
            .iter()
            .find(|n| n.id == node)
            .map_or(&[], |n| &n.cpus)
    }

    pub fn has_node(&self, node: u32) -> bool {
        self.nodes.iter().any(|n| n.id == node)
    }

    /// Whether this process may run on `cpu`.
    pub fn is_allowed(&self, cpu: usize) -> bool {
        self.allowed.binary_search(&cpu).is_ok()
    }
}

fn read(path: &Path) -> Result<String, TopologyError> {
    std::fs::read_to_string(path).map_err(|source| read_error(path, source))
}

fn read_error(path: &Path, source: io::Error) -> TopologyError {
    TopologyError::Read {
        path: path.to_owned(),
        source,
    }
}

/// Parses a CPU list as sysfs writes it (`0-3,8,10-11`; empty for a CPU-less node) into
/// ascending, unique CPU numbers.
pub fn parse_cpu_list(input: &str) -> Result<Vec<usize>, TopologyError> {
    let mut cpus = parse_ranges(input.trim()).map_err(|reason| TopologyError::CpuList {
        input: input.trim().to_owned(),
        reason,
    })?;
    cpus.sort_unstable();
    cpus.dedup();
    Ok(cpus)
}

/// Parses a core selection like SPDK's `-c`: a hex mask (`0x3`, `0xF0`), a list (`0,2-3`) or a
/// bracketed list (`[0,2-3]`). Unlike SPDK, a bare number is a core, not a mask: `1` is core 1.
/// Returns ascending cores; an empty selection or a core given twice is an error.
pub fn parse_cores(input: &str) -> Result<Vec<usize>, TopologyError> {
    let s = input.trim();
    let error = |reason: String| TopologyError::Cores {
        input: s.to_owned(),
        reason,
    };
    let mut cores = if let Some(hex) = s.strip_prefix("0x").or_else(|| s.strip_prefix("0X")) {
        parse_mask(hex).map_err(error)?
    } else {
        let list = s.strip_prefix('[').map_or(Some(s), |l| l.strip_suffix(']'));
        let list = list.ok_or_else(|| error("unbalanced brackets".into()))?;
        parse_ranges(list.trim()).map_err(error)?
    };
    if cores.is_empty() {
        return Err(error("it selects no core".into()));
    }
    cores.sort_unstable();
    if let Some(pair) = cores.windows(2).find(|w| w[0] == w[1]) {
        return Err(error(format!("core {} is given twice", pair[0])));
    }
    Ok(cores)
}

fn parse_mask(hex: &str) -> Result<Vec<usize>, String> {
    if hex.is_empty() {
        return Err("no hex digits after 0x".into());
    }
    let mut cores = Vec::new();
    for (i, c) in hex.chars().rev().enumerate() {
        let digit = c
            .to_digit(16)
            .ok_or_else(|| format!("{c:?} is not a hex digit"))?;
        for bit in 0..4 {
            if digit & (1 << bit) != 0 {
                let core = i * 4 + bit;
                if core >= MAX_CPUS {
                    return Err(format!(
                        "core {core} is beyond the largest CPU {}",
                        MAX_CPUS - 1
                    ));
                }
                cores.push(core);
            }
        }
    }
    Ok(cores)
}

/// `a-b,c,...` in the given order (duplicates kept); empty input is an empty list.
fn parse_ranges(s: &str) -> Result<Vec<usize>, String> {
    let mut cpus = Vec::new();
    if s.is_empty() {
        return Ok(cpus);
    }
    for part in s.split(',').map(str::trim) {
        let number = |n: &str| -> Result<usize, String> {
            let cpu: usize = n
                .trim()
                .parse()
                .map_err(|_| format!("{n:?} is not a CPU number"))?;
            if cpu >= MAX_CPUS {
                return Err(format!(
                    "CPU {cpu} is beyond the largest CPU {}",
                    MAX_CPUS - 1
                ));
            }
            Ok(cpu)
        };
        match part.split_once('-') {
            Some((lo, hi)) => {
                let (lo, hi) = (number(lo)?, number(hi)?);
                if lo > hi {
                    return Err(format!("range {part:?} runs backwards"));
                }
                cpus.extend(lo..=hi);
            }
            None => cpus.push(number(part)?),
        }
    }
    Ok(cpus)
}

/// Formats numbers as a compressed list: `[0, 1, 2, 5, 7, 8]` → `0-2,5,7-8` (`none` if empty).
pub fn format_cpu_list(values: &[usize]) -> String {
    let mut sorted = values.to_vec();
    sorted.sort_unstable();
    sorted.dedup();
    let mut runs = Vec::new();
    let mut rest = &sorted[..];
    while let Some(&start) = rest.first() {
        let len = rest
            .iter()
            .zip(start..)
            .take_while(|(&v, n)| v == *n)
            .count();
        runs.push(match len {
            1 => start.to_string(),
            _ => format!("{start}-{}", start + len - 1),
        });
        rest = &rest[len..];
    }
    if runs.is_empty() {
        "none".to_owned()
    } else {
        runs.join(",")
    }
}

/// Pins the calling thread to `cpu` (`sched_setaffinity`).
pub fn pin_current_thread(cpu: usize) -> io::Result<()> {
    let mut set = CpuSet::new();
    set.set(cpu).map_err(|e| {
        io::Error::new(
            io::ErrorKind::InvalidInput,
            format!("cannot pin to CPU {cpu}: {e}"),
        )
    })?;
    sched_setaffinity(Pid::from_raw(0), &set).map_err(io::Error::from)
}

#[cfg(test)]
mod tests {
    use super::*;
    use usnvme_driver::pci::fake::FakeSysfs;

    fn affinity() -> Vec<usize> {
        let set = sched_getaffinity(Pid::from_raw(0)).unwrap();
        (0..CpuSet::count())
            .filter(|&c| set.is_set(c).unwrap())
            .collect()
    }

    #[test]
    fn cpu_lists() {
        assert_eq!(
            parse_cpu_list("0-3,8,10-11\n").unwrap(),
            [0, 1, 2, 3, 8, 10, 11]
        );
        assert_eq!(parse_cpu_list("\n").unwrap(), Vec::<usize>::new());
        for bad in ["0-", "a", "3-1", "0,,1", "99999"] {
            let err = parse_cpu_list(bad).unwrap_err().to_string();
            assert!(err.contains("expected a list like 0-3,8,10-11"), "{err}");
        }
        assert_eq!(
            format_cpu_list(&[12, 13, 0, 1, 2, 5, 7, 8]),
            "0-2,5,7-8,12-13"
        );
        assert_eq!(format_cpu_list(&[]), "none");
    }

    #[test]
    fn core_selections() {
        assert_eq!(parse_cores("0x5").unwrap(), [0, 2]);
        assert_eq!(parse_cores("0xF0").unwrap(), [4, 5, 6, 7]);
        assert_eq!(parse_cores("[0,2-3]").unwrap(), [0, 2, 3]);
        assert_eq!(parse_cores("0,2-3").unwrap(), [0, 2, 3]);
        assert_eq!(parse_cores("1").unwrap(), [1]);
        let cases = [
            ("0x", "no hex digits"),
            ("0xG1", "'G' is not a hex digit"),
            ("0x0", "selects no core"),
            ("", "selects no core"),
            ("[]", "selects no core"),
            ("[0,1", "unbalanced brackets"),
            ("1,0-2", "core 1 is given twice"),
        ];
        for (input, reason) in cases {
            let err = parse_cores(input).unwrap_err().to_string();
            assert!(
                err.contains(reason) && err.contains(CORE_FORMS),
                "{input}: {err}"
            );
        }
    }

    #[test]
    fn from_fake_sysfs() {
        let fake = FakeSysfs::new();
        fake.write("sys/devices/system/node/node0/cpulist", "0-1\n");
        fake.write("sys/devices/system/node/node1/cpulist", "2-3\n");
        fake.write("sys/devices/system/node/possible", "0-1\n");
        fake.write("proc/self/status", "Name:\tx\nCpus_allowed_list:\t1-3\n");
        let topo = Topology::from_sysfs(fake.root()).unwrap();
        assert_eq!(topo.nodes.len(), 2);
        assert_eq!(topo.cpus_of(1), [2, 3]);
        assert!(topo.cpus_of(7).is_empty());
        assert_eq!(topo.node_of(1), Some(0));
        assert_eq!(topo.node_of(9), None);
        assert!(topo.has_node(1) && !topo.has_node(2));
        assert_eq!(topo.allowed, [1, 2, 3]);
    }

    #[test]
    fn from_fake_sysfs_without_nodes() {
        let fake = FakeSysfs::new();
        fake.write("sys/devices/system/cpu/online", "0-5\n");
        fake.write("proc/self/status", "Cpus_allowed_list:\t0-5\n");
        let topo = Topology::from_sysfs(fake.root()).unwrap();
        assert_eq!(
            topo.nodes,
            [NumaNode {
                id: 0,
                cpus: (0..6).collect()
            }]
        );

        fake.write("proc/self/status", "Name:\tx\n");
        let err = Topology::from_sysfs(fake.root()).unwrap_err().to_string();
        assert!(err.contains("no Cpus_allowed_list"), "{err}");
        let err = Topology::from_sysfs(&fake.root().join("missing")).unwrap_err();
        assert!(err.to_string().contains("cpu/online"), "{err}");
    }

    #[test]
    fn from_this_machine() {
        let topo = Topology::from_sysfs(Path::new("/")).unwrap();
        assert!(!topo.nodes.is_empty() && !topo.allowed.is_empty());
        assert_eq!(topo.allowed, affinity());
        assert!(topo.allowed.iter().all(|&cpu| topo.node_of(cpu).is_some()));
    }

    #[test]
    fn pins_a_thread() {
        let cpu = affinity()[0];
        let pinned = std::thread::spawn(move || {
            pin_current_thread(cpu).unwrap();
            affinity()
        });
        assert_eq!(pinned.join().unwrap(), [cpu]);
        assert!(pin_current_thread(1 << 20).is_err());
    }
}
