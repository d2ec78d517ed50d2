//! The NVMe/TCP transport: a remote controller on its admin queue (the driver's controller
//! logic over Fabrics Property Get/Set and the polled session, [`controller`]) and where its
//! I/O queues come from ([`queues`]: the queue IDs it granted, one per reactor).

pub mod controller;
pub mod queues;

pub use controller::{RemoteController, RemoteError};
pub use queues::{QueueIds, RemoteQueue, RemoteQueues};
