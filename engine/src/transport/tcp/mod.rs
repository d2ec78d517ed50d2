//! The NVMe/TCP transport: a remote controller on its admin queue (the driver's controller
//! logic over Fabrics Property Get/Set and the polled session, [`controller`]), its
//! association as its queues and its controller thread share it ([`link`]: live, being
//! reconnected, given up), and where its I/O queues come from ([`queues`]: the queue IDs it
//! granted, one per reactor; a reactor's queue, across reconnects).

pub mod controller;
pub mod link;
pub mod queues;

pub use controller::{RemoteController, RemoteError};
pub use link::{ControllerLink, LinkState, ReconnectPolicy};
pub use queues::{QueueIds, RemoteQueue, RemoteQueues};
