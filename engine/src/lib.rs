//! usnvme-engine: the machine-wide I/O system on top of the driver.
//!
//! - `topology`: NUMA nodes and their CPUs from sysfs, the CPUs this process may use.
//! - `placement`: which reactor core serves which drive (by default, cores of the drive's node).
//! - `transport`: one controller API and one I/O queue API over PCIe and NVMe/TCP, a reactor's
//!   queues (one per controller, shared by its namespaces), and the NVMe/TCP transport itself.
//! - `block`: the block layer — `BlockDevice` (an NVMe namespace, local or remote; a stripe
//!   over devices) and the per-reactor `Channel` that submits and polls I/O; one splitter.
//! - `stats`: per-reactor, per-device counters and latency histograms, merged on request.
//! - `engine`: attach drives in parallel, one pinned polling thread (reactor) per core.
//! - `fabric`: NVMe/TCP's protocol: PDUs and their framing, the target (`usnvme serve`), the
//!   polled host side, discovery, remote subsystems as block devices.

pub mod block;
pub mod engine;
pub mod fabric;
pub mod placement;
pub mod stats;
pub mod topology;
pub mod transport;

pub use block::{
    BlockDevice, BlockError, BlockInfo, Channel, ChannelOptions, Failure, IoCompletion, IoError,
    NamespaceDevice, Op, PiMode, StripeDevice,
};
pub use engine::{
    attach, drive_namespaces, Assignment, Drive, Engine, EngineError, EngineOptions, Job,
    QueueLimited, ReactorContext, ReactorInfo, Run, Share,
};
