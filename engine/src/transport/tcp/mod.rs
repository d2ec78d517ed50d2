//! The NVMe/TCP host side, all of it: the polled initiator, the host's one protocol engine
//! for admin and I/O queues ([`initiator`]); a remote controller on its admin queue (the
//! driver's controller logic over Fabrics Property Get/Set, [`controller`]); its association
//! as its queues and its controller thread share it ([`link`]: live, being reconnected, given
//! up); and where its I/O queues come from ([`queues`]: the queue IDs it granted, one per
//! reactor; a reactor's queue, across reconnects). A remote subsystem's namespaces as block
//! devices are the block layer's (`crate::block::remote`), beside the local ones.

pub mod controller;
pub mod initiator;
pub mod link;
pub mod queues;

pub use controller::{RemoteController, RemoteError};
pub use initiator::{HostError, HostOptions};
pub use link::{ControllerLink, LinkState, ReconnectPolicy};
pub use queues::{QueueIds, RemoteQueue, RemoteQueues};
