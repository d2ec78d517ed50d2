//! The NVMe/TCP target: NVM subsystems whose namespaces are the engine's block devices, plus
//! the discovery subsystem on the same listeners. (The module is `export`, not `target`: a
//! folder named `target` is taken for build output by tools and common gitignore rules.)
//!
//! - [`admin`]: what the controllers answer without touching a drive: properties (CAP, VS, CC,
//!   CSTS), Identify, features, log pages (SMART aggregated from the drives, the discovery log),
//!   the Fabrics commands' fields; a file for each.
//! - [`connection`]: one TCP connection's state machine (PDUs in, commands to the block
//!   devices, responses out), without I/O of its own so it can be driven by tests and fuzzing;
//!   a file for each concern (receive, transmit, Fabrics commands, the admin queue, the I/O
//!   queue, shutdown).
//! - [`memory`]: a backend over memory, for tests and the fuzz targets.
//! - [`fuzz`]: the fuzz targets' bodies: arbitrary bytes, and arbitrary commands each answered
//!   exactly once.
//! - [`live`]: the target while it runs: subsystems, namespaces and hosts added and removed,
//!   every reactor told before the hosts are.
//! - [`registry`]: the controllers (dynamic IDs) and the hosts allowed to connect.
//! - [`server`]: the job each reactor runs: its connections' sockets, commands and buffers.
//! - [`waiting`]: commands that wait for a DMA buffer or room in a device's queue, in arrival
//!   order (a host's I/O is never refused for want of them).
//! - [`wire`]: byte sources and sinks in parts (socket `readv`/`writev` into and out of DMA
//!   buffers, or memory).

pub mod admin;
pub mod connection;
pub mod fuzz;
pub mod live;
pub mod memory;
pub mod registry;
pub mod server;
pub mod waiting;

use std::sync::Arc;

/// The well-known NQN of the discovery subsystem.
pub use usnvme_driver::spec::fabrics::DISCOVERY_NQN;

/// The subsystem NQN `usnvme serve` takes when none is given, from the files under `root`
/// (`/`): `nqn.2024-01.io.usnvme:HOSTNAME` when the host name is one (letters, digits, `.`,
/// `-`, `_`; not "(none)", the kernel's word for unset, nor "localhost", which every machine
/// shares); else `nqn.2024-01.io.usnvme:uuid:UUID`, the UUID derived from `etc/machine-id`
/// (stable on this machine, and not the machine ID itself), as the host NQN is; else
/// `nqn.2024-01.io.usnvme:localhost`.
pub fn default_nqn(root: &std::path::Path) -> String {
    let read = |path: &str| super::identity::read_setting(root, path);
    let hostname = read("proc/sys/kernel/hostname").filter(|h| {
        h.bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"-._".contains(&b))
            && !h.starts_with("localhost")
    });
    if let Some(host) = hostname {
        return format!("{NQN_PREFIX}:{host}");
    }
    match read(super::identity::MACHINE_ID_FILE) {
        Some(machine) => {
            let uuid = uuid::Uuid::new_v5(&SUBSYSTEM_NAMESPACE, machine.as_bytes());
            format!("{NQN_PREFIX}:uuid:{}", uuid.hyphenated())
        }
        None => format!("{NQN_PREFIX}:localhost"),
    }
}

const NQN_PREFIX: &str = "nqn.2024-01.io.usnvme";

/// The namespace of the name-based UUIDs of default subsystem NQNs: a fixed random UUID, other
/// than the host NQN's, so that a machine's subsystem and host NQNs differ.
const SUBSYSTEM_NAMESPACE: uuid::Uuid =
    uuid::Uuid::from_u128(0x3d5e_81a2_c7f4_5b09_a6e3_52c1_98d7_0f4b);

/// Namespace IDs are 1 ..= this (NN): namespaces added while the target runs take the lowest
/// free one.
pub const MAX_NAMESPACES: u32 = 1024;

/// Asymmetric Namespace Access groups (ANAGRPMAX, NANAGRPID): IDs 1 ..= this. Each port sets
/// each group's state for the hosts that come through it.
pub const ANA_GROUPS: u32 = 32;
/// The group a namespace is in unless given another.
pub const DEFAULT_ANA_GROUP: u32 = 1;

/// One exported block device, as a namespace of the subsystem.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ExportedNamespace {
    /// 1-based namespace ID.
    pub nsid: u32,
    /// The block device's name (a PCI address and namespace, a `sim:` drive, `stripe0`).
    pub name: String,
    pub block_size: u32,
    pub blocks: u64,
    /// Stable across restarts for the same device (derived from its name and the subsystem).
    pub nguid: [u8; 16],
    /// Its UUID, as stable: Linux names a namespace by it first (`uuid.…` in its wwid), as
    /// nvmet's are named. [`uuid_of_nguid`] unless given.
    pub uuid: [u8; 16],
    /// Its ANA group (1 ..= [`ANA_GROUPS`]).
    pub ana_group: u32,
    /// The block device behind it: its index among the reactors' devices (the one every
    /// request for this namespace names; never reused while the target runs).
    pub device: usize,
}

impl ExportedNamespace {
    /// Block device `device` (the reactors' index `index`) as namespace `nsid` of subsystem
    /// `subnqn`, its NGUID from both names ([`nguid_of`]).
    pub fn of(
        nsid: u32,
        index: usize,
        device: &dyn crate::block::BlockDevice,
        subnqn: &str,
    ) -> ExportedNamespace {
        let info = device.info();
        let nguid = nguid_of(subnqn, &info.name);
        ExportedNamespace {
            nsid,
            name: info.name.clone(),
            block_size: info.block_size,
            blocks: info.size_bytes / u64::from(info.block_size),
            nguid,
            uuid: uuid_of_nguid(&nguid),
            ana_group: DEFAULT_ANA_GROUP,
            device: index,
        }
    }
}

/// The NGUID of device `name` in subsystem `subnqn` unless one is given: 16 bytes that stay
/// the same for the same device under the same NQN (across restarts, so a host's multipath
/// finds the namespace again).
pub fn nguid_of(subnqn: &str, name: &str) -> [u8; 16] {
    let crc = |first: &[u8], second: &[u8], salt: u8| {
        let mut bytes = Vec::with_capacity(first.len() + second.len() + 1);
        bytes.push(salt);
        bytes.extend_from_slice(first);
        bytes.extend_from_slice(second);
        crate::fabric::pdu::crc32c(&bytes)
    };
    let (nqn, name) = (subnqn.as_bytes(), name.as_bytes());
    let words = [
        crc(nqn, name, 0),
        crc(name, nqn, 1),
        crc(nqn, name, 2),
        crc(name, nqn, 3),
    ];
    let mut g = [0u8; 16];
    for (i, w) in words.iter().enumerate() {
        g[i * 4..i * 4 + 4].copy_from_slice(&w.to_le_bytes());
    }
    g
}

/// A subsystem's serial number unless one is given: from its NQN (20 ASCII characters).
pub fn serial_of(nqn: &str) -> String {
    format!("usnvme{:08x}", crate::fabric::pdu::crc32c(nqn.as_bytes()))
}

/// The UUID a namespace with NGUID `nguid` has unless one is given: name-based (version 5),
/// so as stable as the NGUID.
pub fn uuid_of_nguid(nguid: &[u8; 16]) -> [u8; 16] {
    uuid::Uuid::new_v5(&NAMESPACE_UUIDS, nguid).into_bytes()
}

/// The namespace of the name-based UUIDs of namespaces: a fixed random UUID.
const NAMESPACE_UUIDS: uuid::Uuid =
    uuid::Uuid::from_u128(0x8b2f_6c1d_94e7_5a30_b1c8_7e52_0f9d_36a4);

/// Where the subsystem listens (the discovery log lists it).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Listener {
    pub address: std::net::SocketAddr,
    /// The port ID the discovery log reports (1, 2, ... in the order given).
    pub port_id: u16,
    /// NVMe/TCP or NVMe/RDMA.
    pub transport: crate::fabric::address::Transport,
}

/// The subsystem as every controller of it describes it.
#[derive(Debug, Clone)]
pub struct SubsystemInfo {
    pub nqn: String,
    /// Serial number (20 ASCII characters at most) and model (40).
    pub serial: String,
    pub model: String,
    /// Firmware revision (8 ASCII characters at most): the usnvme version.
    pub firmware: String,
    pub namespaces: Vec<ExportedNamespace>,
    pub listeners: Vec<Listener>,
    /// In-capsule data a command capsule may carry, in bytes (IOCCSZ is this plus the 64-byte
    /// SQE, in 16-byte units).
    pub in_capsule_bytes: u32,
    /// The largest transfer of one command, in bytes: a power of two, at least 4096 (MDTS).
    pub max_transfer: u32,
    /// Entries of each I/O queue (CAP.MQES + 1, MAXCMD).
    pub queue_entries: u16,
    /// I/O queues a controller may have.
    pub io_queues: u16,
    /// Host NQNs that may connect; None: any host.
    pub allowed_hosts: Option<Vec<String>>,
    /// The IDs of the ports (listeners) it is reached through; None: every port.
    pub ports: Option<Vec<u16>>,
}

impl SubsystemInfo {
    pub fn host_allowed(&self, host_nqn: &str) -> bool {
        self.allowed_hosts
            .as_ref()
            .is_none_or(|hosts| hosts.iter().any(|h| h == host_nqn))
    }

    /// Whether hosts reach it through port `port_id`.
    pub fn on_port(&self, port_id: u16) -> bool {
        self.ports
            .as_ref()
            .is_none_or(|ports| ports.contains(&port_id))
    }

    /// The target-wide part of `sub` (its limits, listeners, firmware) under the discovery NQN.
    pub fn base_of(sub: &SubsystemInfo) -> SubsystemInfo {
        SubsystemInfo {
            nqn: DISCOVERY_NQN.to_string(),
            namespaces: Vec::new(),
            allowed_hosts: None,
            ports: None,
            ..sub.clone()
        }
    }
}

/// Every NVM subsystem of the target, as its connections see them (each reactor swaps in a new
/// `Arc` when one is added, removed or changed).
#[derive(Debug, Clone)]
pub struct Subsystems {
    /// The target's own description (limits, listeners, firmware) under the discovery NQN, with
    /// no namespaces: what a connection goes by until its Connect names a subsystem, and what a
    /// discovery controller describes.
    pub base: Arc<SubsystemInfo>,
    /// The NVM subsystems, in the order they were made.
    pub list: Vec<Arc<SubsystemInfo>>,
    /// Changes whenever the discovery log would (a subsystem added or removed, its hosts
    /// changed): the log's GENCTR.
    pub generation: u64,
}

impl Subsystems {
    /// The target of subsystem `sub` alone.
    pub fn one(sub: Arc<SubsystemInfo>) -> Arc<Subsystems> {
        Arc::new(Subsystems {
            base: Arc::new(SubsystemInfo::base_of(&sub)),
            list: vec![sub],
            generation: 1,
        })
    }

    pub fn find(&self, nqn: &str) -> Option<&Arc<SubsystemInfo>> {
        self.list.iter().find(|s| s.nqn == nqn)
    }

    /// The NQNs of the subsystems host `host_nqn` may connect to through port `port_id` (what
    /// its discovery log there lists).
    pub fn open_to(&self, host_nqn: &str, port_id: u16) -> Vec<&str> {
        let open = self
            .list
            .iter()
            .filter(|s| s.host_allowed(host_nqn) && s.on_port(port_id));
        open.map(|s| s.nqn.as_str()).collect()
    }
}

#[cfg(test)]
mod tests {
    use super::default_nqn;

    #[test]
    fn a_discovery_log_lists_the_subsystems_a_host_may_reach_through_its_port() {
        let sub = |nqn: &str, hosts: Option<&[&str]>, ports: Option<Vec<u16>>| {
            std::sync::Arc::new(super::SubsystemInfo {
                nqn: nqn.into(),
                allowed_hosts: hosts.map(|h| h.iter().map(|s| s.to_string()).collect()),
                ports,
                ..super::memory::test_subsystem(0)
            })
        };
        let mut target = (*super::Subsystems::one(sub("a", None, None))).clone();
        target.list.push(sub("b", Some(&["h1"]), None));
        target.list.push(sub("c", None, Some(vec![2])));
        assert_eq!(target.open_to("h1", 1), ["a", "b"]);
        assert_eq!(target.open_to("h2", 1), ["a"]);
        assert_eq!(target.open_to("h2", 2), ["a", "c"]);
        assert!(!target.list[2].on_port(1) && target.list[2].on_port(2));
    }

    #[test]
    fn the_default_nqn_is_the_host_name_or_else_one_from_the_machine_id() {
        let root = std::env::temp_dir().join(format!("usnvme-nqn-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&root);
        std::fs::create_dir_all(root.join("proc/sys/kernel")).expect("mkdir");
        std::fs::create_dir_all(root.join("etc")).expect("mkdir");
        let hostname = root.join("proc/sys/kernel/hostname");
        std::fs::write(&hostname, "storage-01.lab\n").expect("write");
        assert_eq!(default_nqn(&root), "nqn.2024-01.io.usnvme:storage-01.lab");
        // unset ("(none)", as the bed's guest has it), shared or with odd bytes: the machine ID
        std::fs::write(
            root.join("etc/machine-id"),
            "0123456789abcdef0123456789abcdef\n",
        )
        .expect("write");
        std::fs::write(&hostname, "(none)").expect("write");
        let from_machine = default_nqn(&root);
        for unusable in ["(none)", "localhost", "", "host name", "h\u{e9}te"] {
            std::fs::write(&hostname, unusable).expect("write");
            assert_eq!(default_nqn(&root), from_machine, "{unusable:?}");
        }
        let uuid = from_machine
            .strip_prefix("nqn.2024-01.io.usnvme:uuid:")
            .expect("a UUID NQN");
        assert!(uuid::Uuid::parse_str(uuid).is_ok(), "{from_machine}");
        assert!(
            !from_machine.contains("0123456789abcdef"),
            "not the machine ID itself"
        );
        // and not this machine's host NQN
        let host = super::super::identity::host_identity(&root)
            .expect("host NQN")
            .0;
        assert!(!host.ends_with(uuid), "{host} / {from_machine}");
        std::fs::remove_file(root.join("etc/machine-id")).expect("rm");
        assert_eq!(default_nqn(&root), "nqn.2024-01.io.usnvme:localhost");
        let _ = std::fs::remove_dir_all(&root);
    }
}
