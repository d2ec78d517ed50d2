//! The driver's errors: each names the device, the command and the NVMe status by name, and says
//! what to do where the fix is a setup step.

use std::time::Duration;

use crate::spec::Status;

#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error(transparent)]
    Vfio(#[from] crate::vfio::VfioError),
    #[error("{device}: DMA memory: {source}")]
    Memory {
        device: String,
        source: usnvme_hugepages::MemoryError,
    },
    #[error("{device}: DMA mapping: {source}")]
    Map {
        device: String,
        source: usnvme_hugepages::MapError,
    },
    #[error("{device}: {command} failed: {status}")]
    Command {
        device: String,
        command: &'static str,
        status: Status,
    },
    #[error("{device}: {what} did not complete within {after:?}")]
    Timeout {
        device: String,
        what: String,
        after: Duration,
    },
    #[error("{device}: controller fatal status (CSTS.CFS) during {during}; the controller needs a reset")]
    Fatal { device: String, during: String },
    #[error("{device}: the controller is not ready (CSTS.RDY = 0) during {during}: it was disabled behind the driver's back; reset it")]
    NotReady { device: String, during: String },
    #[error("{device}: the device is gone (its registers read all ones): removed or dead")]
    Gone { device: String },
    #[error("{device}: unsupported: {what}")]
    Unsupported { device: String, what: String },
    #[error("{device}: namespace {nsid} does not exist (active namespaces: {active:?})")]
    NoNamespace {
        device: String,
        nsid: u32,
        active: Vec<u32>,
    },
    #[error("{device}: no I/O queue left: the controller granted {granted} and all are in use")]
    NoQueue { device: String, granted: u16 },
    #[error("{device}: invalid argument: {what}")]
    Invalid { device: String, what: String },
}

/// Why an I/O was not submitted. Nothing was queued and the token is not returned.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SubmitError {
    #[error("the queue is full ({in_flight} commands in flight): poll for completions first")]
    QueueFull { in_flight: u16 },
    #[error("namespace {nsid} does not exist on this controller")]
    InvalidNamespace { nsid: u32 },
    #[error("namespace {nsid} is formatted with {bytes} bytes of metadata per block (protection information or metadata): a read or write without them would misplace data. Read and write it with its metadata (perf and sweep: --pi), or format it without metadata (`usnvme format`)")]
    Metadata { nsid: u32, bytes: u16 },
    #[error("namespace {nsid} has no metadata: read and write it without")]
    NoMetadata { nsid: u32 },
    #[error("namespace {nsid} is not formatted with protection information: PRACT and PRCHK do not apply")]
    NoProtection { nsid: u32 },
    #[error("the data buffer holds {bytes} bytes; these blocks take {expected} in this namespace's format")]
    DataLength { bytes: u64, expected: u64 },
    #[error("the metadata buffer holds {bytes} bytes; these blocks take {expected} apart from the data in this namespace's format (a dword-aligned buffer, or none for 0)")]
    MetadataLength { bytes: u64, expected: u64 },
    #[error("{bytes} bytes exceed the controller's maximum transfer (MDTS) of {max} bytes: split the I/O")]
    ExceedsMdts { bytes: u64, max: u64 },
    #[error("{bytes} bytes is not a whole number of {block_size}-byte blocks")]
    NotBlockMultiple { bytes: u64, block_size: u32 },
    #[error("{blocks} blocks in one command: 1 to 65536")]
    BlockCount { blocks: u64 },
    #[error("blocks {slba}..{} lie past the end of the namespace ({capacity} blocks)", slba.saturating_add(*blocks))]
    LbaRange {
        slba: u64,
        blocks: u64,
        capacity: u64,
    },
    #[error("buffer IOVA {iova:#x} is not dword aligned, or the buffer is empty or runs past the end of the IOVA space")]
    Misaligned { iova: u64 },
    #[error("the controller does not support {what}")]
    Unsupported { what: &'static str },
    #[error("the controller failed or is gone: this queue pair is unusable (see the log)")]
    Dead,
}
