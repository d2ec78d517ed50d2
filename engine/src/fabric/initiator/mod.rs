//! The polled NVMe/TCP initiator: I/O queues a reactor owns, next to its drives' queue pairs.
//!
//! - [`session`]: one I/O queue's protocol (set-up, commands, data, completions) without a
//!   socket, so tests drive it in memory against the target's connection state machine.
//! - [`queue`]: that protocol on a non-blocking socket: `submit` queues, `poll` sends what is
//!   queued in one `writev` and receives in `readv`s, read data straight into DMA buffers.

pub mod queue;
pub mod session;

pub use queue::IoQueue;
pub use session::{Completion, Failure, IoNamespace, QueueParams, Session};
