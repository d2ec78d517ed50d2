//! The block layer: a `BlockDevice` (an NVMe namespace, or a stripe over block devices) hands
//! each reactor its own `Channel`, which submits I/O by byte offset and polls for completions.
//! Large I/Os are split (at the controller's maximum transfer, at stripe chunks) and complete
//! once, when every part has; a part that fails fails the whole I/O with the part's error.

mod gather;
mod namespace;
mod stripe;

use std::sync::Arc;
use std::time::Duration;

use usnvme_driver::spec::Status;
use usnvme_driver::{IoBuffer, SubmitError};
use usnvme_hugepages::{IovaSpace, PageSize};

pub use namespace::NamespaceDevice;
pub use stripe::StripeDevice;

/// What an I/O does.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Op {
    Read,
    Write,
    Flush,
    WriteZeroes,
    Deallocate,
}

impl Op {
    /// Whether the op moves data through a buffer.
    pub fn has_data(self) -> bool {
        matches!(self, Op::Read | Op::Write)
    }
}

/// The shape of a block device.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BlockInfo {
    pub name: String,
    pub size_bytes: u64,
    pub block_size: u32,
    /// The I/O size that performs best (a stripe: its chunk; a namespace: its block size, or
    /// the namespace's optimal I/O boundary where reported).
    pub optimal_io: u64,
    /// The largest I/O one command carries; larger ones are split.
    pub max_io: u64,
}

/// How a reactor's channel is set up.
#[derive(Debug, Clone, Copy)]
pub struct ChannelOptions {
    /// Queue depth of each queue pair under the channel.
    pub depth: u16,
    /// NUMA node of the channel's DMA memory.
    pub node: Option<u32>,
    /// Commands older than this are aborted, then the controller reset.
    pub timeout: Option<Duration>,
}

impl Default for ChannelOptions {
    fn default() -> Self {
        ChannelOptions {
            depth: 256,
            node: None,
            timeout: Some(Duration::from_secs(30)),
        }
    }
}

/// Where a device's I/O buffers must live: its IOVA space, on pages of this size.
#[derive(Debug, Clone)]
pub struct DmaTarget {
    pub space: Arc<IovaSpace>,
    pub page: PageSize,
}

/// A block device: anything that can give a reactor a channel.
pub trait BlockDevice: Send + Sync + std::fmt::Debug {
    fn info(&self) -> &BlockInfo;
    /// Where buffers for this device's I/O come from.
    fn dma(&self) -> DmaTarget;
    /// The drives (by the engine's index) whose queue pairs a channel uses.
    fn drives(&self) -> Vec<usize>;
    /// A channel for the calling thread, with its own queue pairs.
    fn channel(&self, options: &ChannelOptions) -> Result<Box<dyn Channel>, usnvme_driver::Error>;
}

/// Why an I/O failed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum IoError {
    #[error("{device}: {status}")]
    Status { device: Arc<str>, status: Status },
}

/// A finished I/O.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct IoCompletion {
    pub token: u64,
    pub result: Result<(), IoError>,
}

/// Why an I/O was not submitted (nothing was queued; the token is not returned).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum BlockError {
    #[error("{device}: offset {offset} and length {len} must be multiples of the {block_size}-byte block size")]
    Misaligned {
        device: Arc<str>,
        offset: u64,
        len: u64,
        block_size: u32,
    },
    #[error(
        "{device}: {len} bytes at offset {offset} go past the end of the device ({size} bytes)"
    )]
    OutOfRange {
        device: Arc<str>,
        offset: u64,
        len: u64,
        size: u64,
    },
    #[error("{device}: {op:?} needs a buffer of at least {len} bytes")]
    Buffer { device: Arc<str>, op: Op, len: u64 },
    #[error("{device}: no room for {needed} more commands now: poll for completions first")]
    Busy { device: Arc<str>, needed: usize },
    #[error("{device}: {source}")]
    Submit {
        device: Arc<str>,
        source: SubmitError,
    },
}

/// One reactor's path to a block device. Owned by one thread.
pub trait Channel: Send {
    /// Queues `op` on `len` bytes at byte `offset` (`buf` for reads and writes). Doorbells ring
    /// on `poll`.
    fn submit(
        &mut self,
        op: Op,
        offset: u64,
        len: u64,
        buf: Option<IoBuffer>,
        token: u64,
    ) -> Result<(), BlockError>;
    /// Rings what was queued and hands finished I/Os to `on_complete`; returns how many.
    fn poll(&mut self, on_complete: &mut dyn FnMut(IoCompletion)) -> usize;
    /// I/Os submitted and not yet completed.
    fn in_flight(&self) -> usize;
    /// Commands `op` on `len` bytes needs in the queues below (for all-or-nothing submission).
    fn commands_needed(&self, op: Op, len: u64) -> usize;
    /// Commands that can be queued now.
    fn free_commands(&self) -> usize;
}

/// Checks offset, length and buffer against the device.
pub(crate) fn check(
    info: &BlockInfo,
    device: &Arc<str>,
    op: Op,
    offset: u64,
    len: u64,
    buf: Option<IoBuffer>,
) -> Result<(), BlockError> {
    if op == Op::Flush {
        return Ok(());
    }
    // block sizes are powers of two: masks, not divisions, on the I/O path
    let mask = info.block_size as u64 - 1;
    if offset & mask != 0 || len & mask != 0 || len == 0 {
        return Err(BlockError::Misaligned {
            device: device.clone(),
            offset,
            len,
            block_size: info.block_size,
        });
    }
    if offset
        .checked_add(len)
        .is_none_or(|end| end > info.size_bytes)
    {
        return Err(BlockError::OutOfRange {
            device: device.clone(),
            offset,
            len,
            size: info.size_bytes,
        });
    }
    if op.has_data() && buf.is_none_or(|b| (b.len as u64) < len) {
        return Err(BlockError::Buffer {
            device: device.clone(),
            op,
            len,
        });
    }
    Ok(())
}
