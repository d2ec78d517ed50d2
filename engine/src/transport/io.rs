//! What the transport's queues are asked to do and with what: the op of an I/O, the options
//! of a reactor's channel and the queues under it, and where a device's DMA buffers live. The
//! block layer above re-exports them.

use std::sync::Arc;
use std::time::Duration;

use usnvme_hugepages::{IovaSpace, PageSize};

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

/// How a reactor's channel is set up.
#[derive(Debug, Clone, Copy)]
pub struct ChannelOptions {
    /// Queue depth of each queue pair under the channel: ring entries, or I/Os with `io_size`.
    pub depth: u16,
    /// With it, `depth` counts I/Os of up to this many bytes, not ring entries: each queue pair
    /// holds `depth` such I/Os split at its drive's largest transfer (one more part where an
    /// I/O straddles a boundary) and the entry a ring keeps empty, within what the drive grants.
    pub io_size: Option<u64>,
    /// NUMA node of the channel's DMA memory.
    pub node: Option<u32>,
    /// Commands older than this are aborted, then the controller reset.
    pub timeout: Option<Duration>,
    /// Keep latency histograms (percentiles) per device: costs more per I/O than the rest of
    /// the statistics together, so only when asked for (`perf -L`).
    pub latency_histograms: bool,
    /// Local queue pairs raise an MSI-X interrupt when their controller posts a completion
    /// (each an eventfd: `DeviceChannel::interrupts`), so that a reactor with I/O in flight and
    /// nothing else to do can sleep until one comes. On a drive with fewer MSI-X vectors than
    /// queues, queue pairs share them. Remote (NVMe/TCP) queues are sockets, not
    /// interrupts: unaffected.
    pub interrupts: bool,
}

impl ChannelOptions {
    /// Ring entries for a queue pair on a drive whose largest transfer is `max_transfer` bytes
    /// and that grants `mqes + 1` entries.
    pub fn queue_entries(&self, max_transfer: u64, mqes: u16) -> u16 {
        let Some(io_size) = self.io_size else {
            return self.depth;
        };
        let parts = io_size.div_ceil(max_transfer.max(1)) + 1;
        let entries = (u64::from(self.depth) * parts + 1).min(u64::from(mqes) + 1);
        entries.min(u64::from(u16::MAX)) as u16
    }
}

impl Default for ChannelOptions {
    fn default() -> Self {
        ChannelOptions {
            depth: 256,
            io_size: None,
            node: None,
            timeout: Some(Duration::from_secs(30)),
            latency_histograms: false,
            interrupts: false,
        }
    }
}

/// Where a device's I/O buffers must live: its IOVA space, on pages of this size.
#[derive(Debug, Clone)]
pub struct DmaTarget {
    pub space: Arc<IovaSpace>,
    pub page: PageSize,
}
