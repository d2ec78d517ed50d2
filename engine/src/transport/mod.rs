//! The transport layer: what the block layer uses of a controller, whatever carries its
//! commands — PCIe (a queue pair of DMA rings and doorbells) or NVMe/TCP (a polled TCP
//! connection).
//!
//! - [`IoQueue`]: one I/O queue API over both: submit a command (namespace, token), poll
//!   completions (token and namespace back, the status by name), flush, abandon.
//! - [`QueueSource`]: where a controller's I/O queues come from (a local controller, or a
//!   remote one's queue IDs and connection parameters, [`RemoteQueues`]).
//! - [`Queues`]: a reactor's I/O queues, one per controller, shared by the channels of that
//!   controller's namespaces ([`SharedQueue`]). The reactor owns them.

mod io_queue;
mod queues;
mod remote;

pub use io_queue::{IoQueue, QueueNamespace};
pub use queues::{ChannelQueue, QueueSource, Queues, SharedQueue};
pub use remote::{QueueIds, RemoteQueues};
