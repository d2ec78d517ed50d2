//! The host side of NVMe/TCP, by its historical name: who the host is ([`HostOptions`]) and
//! what goes wrong ([`HostError`]). The protocol itself is the polled initiator's
//! ([`super::initiator`]), for admin and I/O queues alike.

/// The fuzz target's entry point: target bytes through the host's PDU engine.
pub mod fuzz;

/// The old name of [`super::initiator::CommandQueue`] (one command at a time on the polled
/// queue), for code written against it (block/tcp.rs's tests).
pub use super::initiator::command::{CommandQueue as Queue, Payload};
pub use super::initiator::options::{HostError, HostOptions};
pub use super::initiator::session::ADMIN_IN_CAPSULE;
