//! Which reactor core serves which drive.
//!
//! By default ([`Policy::Local`]) a drive is served by the selected cores of its own NUMA node;
//! a drive on a node without selected cores is served by every selected core and reported in
//! [`Placement::remote`] so that the engine can warn. Every core that serves a drive owns one
//! queue pair on it.

use std::fmt;

use crate::topology::{format_cpu_list, Topology};

/// How drives are assigned to cores.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum Policy {
    /// Each drive is served by the selected cores of its node (all cores if none is there).
    #[default]
    Local,
    /// Every selected core serves every drive.
    AllToAll,
}

/// One reactor: its CPU, that CPU's node, and the drives (indices) it serves, ascending.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ReactorAssignment {
    pub cpu: usize,
    pub node: Option<u32>,
    pub drives: Vec<usize>,
}

/// A drive that no selected core of its node serves: `served_from` are the (remote) CPUs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RemoteDrive {
    pub drive: usize,
    pub drive_node: u32,
    pub served_from: Vec<usize>,
}

/// The reactors in the order of the selected cores, and the drives served from remote nodes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Placement {
    pub reactors: Vec<ReactorAssignment>,
    pub remote: Vec<RemoteDrive>,
}

/// Why the selected cores cannot be used.
#[derive(Debug, thiserror::Error)]
pub enum PlacementError {
    #[error("no cores selected: select at least one (e.g. -c 0x1 or -c 0,2)")]
    NoCores,
    #[error("core {core} is selected twice")]
    Duplicate { core: usize },
    #[error("core {core} is not available to this process; allowed CPUs: {allowed}")]
    NotAllowed { core: usize, allowed: String },
}

/// Places `drive_nodes.len()` drives (each with its NUMA node, `None` if unknown) on `cores`.
/// An unknown node means any core: such a drive is served by every selected core.
pub fn place(
    topology: &Topology,
    cores: &[usize],
    drive_nodes: &[Option<u32>],
    policy: Policy,
) -> Result<Placement, PlacementError> {
    if cores.is_empty() {
        return Err(PlacementError::NoCores);
    }
    for (i, &core) in cores.iter().enumerate() {
        if cores[..i].contains(&core) {
            return Err(PlacementError::Duplicate { core });
        }
        if !topology.is_allowed(core) {
            return Err(PlacementError::NotAllowed {
                core,
                allowed: format_cpu_list(&topology.allowed),
            });
        }
    }
    let mut reactors: Vec<ReactorAssignment> = cores
        .iter()
        .map(|&cpu| ReactorAssignment {
            cpu,
            node: topology.node_of(cpu),
            drives: Vec::new(),
        })
        .collect();
    let mut remote = Vec::new();
    for (drive, &drive_node) in drive_nodes.iter().enumerate() {
        let local = |r: &ReactorAssignment| match (policy, drive_node) {
            (Policy::Local, Some(node)) => r.node == Some(node),
            _ => true,
        };
        let any_local = reactors.iter().any(local);
        if let (false, Some(drive_node)) = (any_local, drive_node) {
            remote.push(RemoteDrive {
                drive,
                drive_node,
                served_from: cores.to_vec(),
            });
        }
        for reactor in &mut reactors {
            if !any_local || local(reactor) {
                reactor.drives.push(drive);
            }
        }
    }
    Ok(Placement { reactors, remote })
}

impl Placement {
    /// Where the drives are and who serves them, one line per NUMA node (drives of no known
    /// node last, as `node ?`): the node's selected cores, its drives (`names[i]`: drive i's
    /// name; `nodes[i]`: its node) and the cores their queue pairs are on, said to be the
    /// node's own or not. Empty when no drive's node is known (simulated drives).
    pub fn by_node(&self, names: &[String], nodes: &[Option<u32>]) -> Vec<String> {
        if nodes.iter().all(Option::is_none) {
            return Vec::new();
        }
        let mut listed: Vec<Option<u32>> = nodes.to_vec();
        listed.extend(self.reactors.iter().map(|r| r.node));
        listed.sort_by_key(|n| n.map_or(u64::MAX, u64::from));
        listed.dedup();
        listed
            .into_iter()
            .map(|node| {
                let label = node.map_or("?".to_owned(), |n| n.to_string());
                let cores: Vec<usize> = self
                    .reactors
                    .iter()
                    .filter(|r| node.is_some() && r.node == node)
                    .map(|r| r.cpu)
                    .collect();
                let cores = match cores.len() {
                    0 => "no core selected".to_owned(),
                    _ => cores_named(&cores),
                };
                let drives: Vec<usize> = (0..nodes.len()).filter(|&d| nodes[d] == node).collect();
                let (Some(&first), Some(&last)) = (drives.first(), drives.last()) else {
                    return format!("node {label}: {cores}; no drive");
                };
                let serving: Vec<usize> = self
                    .reactors
                    .iter()
                    .filter(|r| r.drives.iter().any(|d| drives.contains(d)))
                    .map(|r| r.cpu)
                    .collect();
                let own = node.is_some()
                    && self
                        .reactors
                        .iter()
                        .filter(|r| serving.contains(&r.cpu))
                        .all(|r| r.node == node);
                let name = |d: usize| names.get(d).map_or("?", String::as_str);
                let which = match drives.len() {
                    1 => format!("1 drive ({})", name(first)),
                    n => format!("{n} drives ({} … {})", name(first), name(last)),
                };
                let whose = match (node, own) {
                    (None, _) => "",
                    (Some(_), true) => ", the node's own",
                    (Some(_), false) => ", remote: select a core of this node",
                };
                format!(
                    "node {label}: {cores}; {which}, their queue pairs on {}{whose}",
                    cores_named(&serving)
                )
            })
            .collect()
    }
}

/// `core 3` or `cores 0-3`.
fn cores_named(cores: &[usize]) -> String {
    match cores {
        [one] => format!("core {one}"),
        _ => format!("cores {}", format_cpu_list(cores)),
    }
}

impl fmt::Display for Placement {
    /// `core 3 (node 1): drives 12-23`, one line per core, then one warning line per remote drive.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for r in &self.reactors {
            let node = r.node.map_or("?".to_owned(), |n| n.to_string());
            let drives = match r.drives.len() {
                0 => "no drives".to_owned(),
                1 => format!("drive {}", r.drives[0]),
                _ => format!("drives {}", format_cpu_list(&r.drives)),
            };
            writeln!(f, "core {} (node {node}): {drives}", r.cpu)?;
        }
        for d in &self.remote {
            writeln!(
                f,
                "warning: drive {} is on node {} but no selected core is; served from remote \
                 cores {} (select a core of node {} to serve it locally)",
                d.drive,
                d.drive_node,
                format_cpu_list(&d.served_from),
                d.drive_node
            )?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::topology::NumaNode;

    /// Two nodes: CPUs 0-1 on node 0, 2-3 on node 1; drives 0-11 on node 0, 12-23 on node 1.
    fn two_nodes() -> (Topology, Vec<Option<u32>>) {
        let node = |id, cpus: &[usize]| NumaNode {
            id,
            cpus: cpus.to_vec(),
        };
        let nodes = vec![node(0, &[0, 1]), node(1, &[2, 3])];
        let drives = (0..24).map(|d| Some(if d < 12 { 0 } else { 1 })).collect();
        (Topology::new(nodes, vec![0, 1, 2, 3]), drives)
    }

    fn drives_of(p: &Placement) -> Vec<(usize, Vec<usize>)> {
        p.reactors
            .iter()
            .map(|r| (r.cpu, r.drives.clone()))
            .collect()
    }

    #[test]
    fn local_serves_each_drive_from_its_node() {
        let (topo, drives) = two_nodes();
        let p = place(&topo, &[0, 2], &drives, Policy::Local).unwrap();
        let expected = [(0, (0..12).collect()), (2, (12..24).collect())];
        assert_eq!(drives_of(&p), expected);
        assert_eq!(p.reactors[1].node, Some(1));
        assert!(p.remote.is_empty());
        assert_eq!(
            p.to_string(),
            "core 0 (node 0): drives 0-11\ncore 2 (node 1): drives 12-23\n"
        );
    }

    #[test]
    fn by_node_says_each_nodes_cores_drives_and_where_their_queue_pairs_are() {
        let (topo, drives) = two_nodes();
        let names: Vec<String> = (0..24).map(|d| format!("d{d}")).collect();
        let p = place(&topo, &[0, 2], &drives, Policy::Local).unwrap();
        assert_eq!(
            p.by_node(&names, &drives),
            [
                "node 0: core 0; 12 drives (d0 … d11), their queue pairs on core 0, the node's own",
                "node 1: core 2; 12 drives (d12 … d23), their queue pairs on core 2, the node's own",
            ]
        );
        // no core on node 1: its drives are served from node 0, and the line says so
        let p = place(&topo, &[0, 1], &drives, Policy::Local).unwrap();
        assert_eq!(
            p.by_node(&names, &drives)[1],
            "node 1: no core selected; 12 drives (d12 … d23), their queue pairs on cores 0-1, \
             remote: select a core of this node"
        );
        // simulated drives: no node known, nothing to say
        assert!(p.by_node(&names, &[None; 24]).is_empty());
    }

    #[test]
    fn drives_without_a_local_core_are_remote() {
        let (topo, drives) = two_nodes();
        let p = place(&topo, &[0, 1], &drives, Policy::Local).unwrap();
        let all: Vec<usize> = (0..24).collect();
        assert_eq!(drives_of(&p), [(0, all.clone()), (1, all)]);
        assert_eq!(p.remote.len(), 12);
        let first = RemoteDrive {
            drive: 12,
            drive_node: 1,
            served_from: vec![0, 1],
        };
        assert_eq!(p.remote[0], first);
        let text = p.to_string();
        assert!(text.starts_with("core 0 (node 0): drives 0-23\n"), "{text}");
        assert!(text.contains(
            "warning: drive 23 is on node 1 but no selected core is; served from remote cores 0-1"
        ));
    }

    #[test]
    fn all_to_all_and_unknown_nodes() {
        let (topo, drives) = two_nodes();
        let p = place(&topo, &[1, 3], &drives, Policy::AllToAll).unwrap();
        let all: Vec<usize> = (0..24).collect();
        assert_eq!(drives_of(&p), [(1, all.clone()), (3, all)]);
        assert!(p.remote.is_empty());

        let p = place(&topo, &[0, 2], &[None, Some(1), None], Policy::Local).unwrap();
        assert_eq!(drives_of(&p), [(0, vec![0, 2]), (2, vec![0, 1, 2])]);
        assert!(p.remote.is_empty());

        let cpu_without_node = Topology::new(vec![], vec![5]);
        let p = place(&cpu_without_node, &[5], &[Some(0)], Policy::Local).unwrap();
        assert_eq!(p.reactors[0].node, None);
        assert!(p.to_string().starts_with("core 5 (node ?): drive 0\n"));
    }

    #[test]
    fn bad_core_selections() {
        let (topo, drives) = two_nodes();
        let err = |cores: &[usize]| {
            place(&topo, cores, &drives, Policy::Local)
                .unwrap_err()
                .to_string()
        };
        assert_eq!(
            err(&[0, 4]),
            "core 4 is not available to this process; allowed CPUs: 0-3"
        );
        assert_eq!(err(&[2, 0, 2]), "core 2 is selected twice");
        assert!(err(&[]).starts_with("no cores selected"));
    }
}
