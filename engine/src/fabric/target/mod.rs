//! The NVMe/TCP target: one NVM subsystem whose namespaces are the engine's block devices,
//! plus the discovery subsystem on the same listener.
//!
//! - [`admin`]: what the controllers answer without touching a drive: properties (CAP, VS, CC,
//!   CSTS), Identify, features, log pages (SMART aggregated from the drives, the discovery log).
//! - [`connection`]: one TCP connection's state machine (PDUs in, commands to the block
//!   devices, responses out), without I/O of its own so it can be driven by tests and fuzzing.
//! - [`memory`]: a backend over memory, for tests and the fuzz target.
//! - [`registry`]: the controllers (dynamic IDs) and the hosts allowed to connect.
//! - [`server`]: the job each reactor runs: its connections' sockets, commands and buffers.
//! - [`wire`]: byte sources and sinks in parts (socket `readv`/`writev` into and out of DMA
//!   buffers, or memory).

pub mod admin;
pub mod connection;
pub mod memory;
pub mod registry;
pub mod server;
pub mod wire;

/// The well-known NQN of the discovery subsystem.
pub const DISCOVERY_NQN: &str = "nqn.2014-08.org.nvmexpress.discovery";

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
}

/// Where the subsystem listens (the discovery log lists it).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Listener {
    pub address: std::net::SocketAddr,
    /// The port ID the discovery log reports (1, 2, ... in the order given).
    pub port_id: u16,
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
}
