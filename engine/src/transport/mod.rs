//! The transport layer: what the engine and the tools use of a controller, whatever carries
//! its commands — PCIe (MMIO registers, queue pairs of DMA rings and doorbells) or NVMe/TCP
//! (Fabrics properties, polled TCP connections).
//!
//! - [`Controller`]: one controller API over both (Identify, namespaces, SMART, how it is
//!   reached), for `identify` and `health`.
//! - [`IoQueue`]: one I/O queue API over both: submit a command (namespace, token), poll
//!   completions (the token back, the status by name), flush, abandon.
//! - [`QueueSource`]: where a controller's I/O queues come from (a local controller, or a
//!   remote one's queue IDs and connection parameters, [`RemoteQueues`]).
//! - [`tcp`]: the NVMe/TCP transport: a remote controller ([`RemoteController`]) and its I/O
//!   queues.
//! - [`Queues`]: a reactor's I/O queues, one per controller, shared by the channels of that
//!   controller's namespaces ([`SharedQueue`]); a queue only one channel uses becomes that
//!   channel's own.
//! - [`Op`], [`ChannelOptions`], [`DmaTarget`]: what I/O the queues carry, how they are set
//!   up, where their buffers live.
//! - [`DeviceName`]: the one grammar of device names, local or remote.

mod controller;
pub mod fabric_queue;
mod io;
mod io_queue;
mod name;
mod queues;
#[cfg(feature = "rdma")]
pub mod rdma;
pub mod tcp;

pub use controller::{Controller, ControllerError, Reach};
pub use io::{ChannelOptions, DmaTarget, Op};
pub use io_queue::{IoQueue, NamespaceProtection, QueueNamespace};
pub use name::DeviceName;
pub use queues::{QueueSource, Queues, SharedQueue};
pub use tcp::{
    ControllerLink, QueueIds, ReconnectPolicy, RemoteController, RemoteError, RemoteQueues,
};
