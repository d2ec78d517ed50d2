//! The NVMe/RDMA transport, host side: the same queues as NVMe/TCP's (admin and I/O,
//! [`IoQueue`], [`QueueSetup`]) with commands as RDMA SENDs and data moved by the target's
//! RDMA READ and WRITE into registered DMA memory ([`queue`]; each region registered once per
//! device, [`domain`]), over the verbs and RDMA CM
//! calls wrapped in [`verbs`] (all of the transport's `unsafe`).
//!
//! Built with the `rdma` feature only (it links rdma-core's libibverbs and librdmacm).

pub mod completions;
pub mod domain;
pub mod queue;
pub mod verbs;

pub use queue::{IoQueue, QueueSetup};
