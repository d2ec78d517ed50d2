//! The polled NVMe/TCP initiator: the host side's one protocol engine, for the I/O queues a
//! reactor owns next to its drives' queue pairs and for the admin queue of a remote controller.
//!
//! - [`session`]: one queue's protocol (set-up, commands, data, completions) without a
//!   socket, so tests drive it in memory against the target's connection state machine.
//! - [`queue`]: that protocol on a non-blocking socket: `submit` queues, `poll` sends what is
//!   queued in one `writev` and receives many PDUs per `readv`, read data into DMA buffers
//!   (copied once at most).
//! - `readiness`: which of a thread's queue sockets have something to read, one `epoll_wait`
//!   a turn for all of them.
//! - [`command`]: one command at a time on such a queue, polled to completion within a
//!   deadline (the admin queue; tests).
//! - [`options`]: who the host is, and why a connection or a command failed.
//! - [`Gated`]: bytes in memory read as a quiet socket, to drive a session without one.
//! - [`fuzz`]: the fuzz target's entry point: a target's bytes through a session.

pub mod command;
pub mod fuzz;
mod gated;
pub mod options;
pub mod queue;
mod readiness;
pub mod session;
#[cfg(test)]
pub(crate) mod testing;

pub use command::{CommandQueue, Payload};
pub use gated::Gated;
pub use options::{HostError, HostOptions};
pub use queue::{IoQueue, QueueSetup};
pub use session::{Completion, Data, Failure, IoNamespace, QueueParams, Session, Unfinished};
