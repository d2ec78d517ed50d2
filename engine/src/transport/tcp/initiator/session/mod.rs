//! One NVMe/TCP queue's protocol, without a socket: commands in ([`Session::submit`]),
//! PDUs out ([`Session::transmit`] to a [`WriteWire`]), PDUs in ([`Session::receive_from`] a
//! [`ReadWire`]), completions out through the caller's handler. The socket's queue
//! ([`super::queue::IoQueue`]) and the tests (against the target's `Connection`, in memory)
//! drive the very same code.
//!
//! Set-up is part of it: ICReq out, ICResp in (checked: the digests asked for, no data
//! alignment), Fabrics Connect of the queue, its response. An I/O queue joins an existing
//! controller; an admin queue (QID 0) gets one from the target.
//!
//! This is the host's one PDU engine: the block layer's I/O ([`Session::submit`], no
//! allocation per command) and any other command, admin and Fabrics ones included
//! ([`Session::submit_command`], data in a buffer of the caller's), go through it.
//!
//! Data is never copied twice: a write's data goes from its DMA buffer (in the capsule, or in
//! H2CData PDUs when the target sends an R2T, MAXH2CDATA at most each). Received bytes come
//! in one `readv` per turn into the receive buffer (many PDUs per system call, as SPDK's
//! posix socket's pipe buffer): a C2HData's data found there is copied once into its DMA
//! buffer, and the rest of a data the read ended in comes straight into the DMA buffer with
//! the next one (`readv` of the data and then the receive buffer).
//! The buffers are reached through the IOVA address space's vm-memory model, as volatile
//! slices, never as `&[u8]`.
//!
//! Everything the target sends is checked before it is trusted. A malformed PDU ends the
//! queue: an H2CTermReq naming the field is queued, and every command in flight fails with
//! the reason ([`Failure`]). A data digest mismatch fails only its command. Nothing is
//! allocated per command: the slots, the receive buffer and the transmit queue are sized when
//! the queue is set up.
//!
//! The parts: this file (the state, its parameters, [`Session::new`] and what it tells),
//! `setup` (ICResp, Connect), `submit` (commands, capsules, H2CData for R2Ts, sending),
//! `receive` (C2HData, CapsuleResp, R2T, C2HTermReq; protocol errors), `complete`
//! (completions, the timeout, the end of the queue).

mod complete;
mod receive;
mod setup;
mod submit;
#[cfg(test)]
mod tests;

use usnvme_driver::spec::ConnectData;
use usnvme_driver::spec::{DsmRange, Status};
use usnvme_driver::IoBuffer;
use usnvme_hugepages::IovaMemory;
use vm_memory::{GuestAddress, GuestMemoryBackend, VolatileSlice};

use self::receive::Transfer;
use self::setup::Negotiated;
use self::submit::Chunk;
use super::options::{HostError, HostOptions};
use crate::fabric::framing::{Receiver, Transmitter};
use crate::fabric::pdu::{self, FatalError, IcReq, PFV_1_0};
use crate::transport::Op;

pub use self::receive::Receive;

/// Slots are the low bits of a command ID; the bits above are a generation, so that a
/// response to a command that already completed is caught even once its slot is reused.
const SLOT_BITS: u32 = 10;
/// The most entries a queue may have here.
pub const MAX_ENTRIES: u16 = 1 << SLOT_BITS;
/// The Connect command's ID (it completes before any I/O is accepted).
const CONNECT_CID: u16 = 0;
/// Bytes one `readv` takes into the receive buffer at most: many PDUs per system call (as a
/// queue of 4 KiB reads at depth 16). What it holds of a read's data is copied once into the
/// DMA buffer; the rest of that data is read straight in.
const RX_BATCH: usize = 64 * 1024;
/// Bytes one Dataset Management range takes (attributes, block count, starting LBA).
const DSM_RANGE: usize = DsmRange::SIZE;

/// In-capsule data an admin queue takes (fixed by the NVMe/TCP transport, 8 KiB). I/O queues
/// take IOCCSZ * 16 - 64 bytes, which the caller learns from Identify Controller.
pub const ADMIN_IN_CAPSULE: u32 = 8192;

/// Our data alignment (HPDA): none, so the target puts data right after the header.
const HPDA: u8 = 0;

/// What the owner knows of the queue before connecting it.
#[derive(Debug, Clone)]
pub struct QueueParams {
    pub subnqn: String,
    /// Queue ID: 0 for the admin queue.
    pub qid: u16,
    /// The admin queue's controller; on an admin queue, the one asked for (usually
    /// [`usnvme_driver::spec::fabrics::CNTLID_DYNAMIC`]).
    pub cntlid: u16,
    /// Commands in flight at most (SQSIZE is one less), 2 ..= [`MAX_ENTRIES`].
    pub entries: u16,
    pub nsid: u32,
    pub block_size: u32,
    /// Write data up to this many bytes goes in the command capsule (IOCCSZ * 16 - 64).
    pub in_capsule: u32,
    /// The largest transfer of one command (MDTS).
    pub max_transfer: u32,
    /// A command not completed within this many nanoseconds ends the queue.
    pub timeout_ns: u64,
}

/// Why an I/O failed, by kind.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum Failure {
    /// The target completed it with this status.
    #[error("{0}")]
    Status(Status),
    /// It was not completed within the command timeout; the queue was ended.
    #[error("timed out (the queue was closed)")]
    TimedOut,
    /// The queue was ended while it was in flight (another command timed out, or the owner
    /// closed the queue): it may or may not have been carried out.
    #[error("aborted: the queue was closed")]
    Aborted,
    /// The connection ended (the target closed it, or a socket error).
    #[error("the target closed the connection")]
    Closed,
    /// The target broke the protocol; the queue sent an H2CTermReq and ended.
    #[error("the target broke the NVMe/TCP protocol: {0}")]
    Protocol(FatalError),
    /// The target ended the connection with a C2HTermReq.
    #[error("the target ended the connection: C2HTermReq (FES {fes}, FEI {fei})")]
    Terminated { fes: u16, fei: u32 },
    /// The data digest of its C2HData did not match (the queue goes on).
    #[error("data digest mismatch")]
    DataDigest,
}

/// The namespace a command goes to, and its block size.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct IoNamespace {
    pub nsid: u32,
    pub block_size: u32,
}

/// A finished I/O.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Completion {
    pub token: u64,
    /// The namespace it went to.
    pub nsid: u32,
    pub result: Result<(), Failure>,
    /// The session's clock when it was submitted ([`Session::set_now`]).
    pub submitted_ns: u64,
    /// Bytes it moved (0 without data).
    pub bytes: u32,
    /// The response's command specific DW0 and DW1 (zero when the target ended a read with
    /// its data and sent no response).
    pub dw0: u32,
    pub dw1: u32,
}

/// A command's data for [`Session::submit_command`]: a buffer in the session's memory and
/// the way it moves.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Data {
    None,
    /// In the capsule when it fits the in-capsule size, else when the target asks (R2T).
    ToController(IoBuffer),
    /// Filled by the target's C2HData PDUs.
    FromController(IoBuffer),
}

/// Which way a command's data moves.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
enum Dir {
    #[default]
    None,
    ToController,
    FromController,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Phase {
    AwaitIcResp,
    AwaitConnect,
    Ready,
    Ended,
}

/// One command in flight.
#[derive(Debug, Clone, Copy, Default)]
struct Slot {
    busy: bool,
    generation: u16,
    dir: Dir,
    token: u64,
    nsid: u32,
    iova: u64,
    len: u32,
    in_capsule: bool,
    /// C2HData bytes received (in order).
    received: u32,
    /// Write bytes R2Ts asked for so far.
    requested: u32,
    /// Data segments of this command queued and not yet sent (the buffer is still read).
    unsent: u16,
    /// Completed while `unsent > 0`: delivered once its data is sent.
    deferred: Option<Result<(), Failure>>,
    corrupt: bool,
    timed_out: bool,
    /// When it was sent on this queue: the timeout counts from then.
    submitted_ns: u64,
    /// When it was first submitted (before a reconnect, if it was sent again): its latency
    /// counts from then.
    since_ns: u64,
    /// What it takes to send it again on a new connection (an I/O; None for other commands).
    io: Option<IoShape>,
    /// The response's DW0 and DW1.
    dw: [u32; 2],
}

/// An I/O command's op and blocks (with the slot's namespace, buffer and token, all it takes
/// to send it again).
#[derive(Debug, Clone, Copy)]
struct IoShape {
    op: Op,
    slba: u64,
    blocks: u32,
    block_size: u32,
}

/// An I/O the queue had not finished when its connection ended (with
/// [`Session::keep_unfinished`]): what it takes to send it again on a new connection.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Unfinished {
    pub ns: IoNamespace,
    pub op: Op,
    pub slba: u64,
    pub blocks: u32,
    pub buf: Option<IoBuffer>,
    pub token: u64,
    /// When it was first submitted: its latency counts from then.
    pub since_ns: u64,
}

/// The state machine of one I/O queue.
#[derive(Debug)]
pub struct Session {
    params: QueueParams,
    asked: pdu::Digests,
    link: Negotiated,
    phase: Phase,
    slots: Box<[Slot]>,
    free: Vec<u16>,
    in_flight: usize,
    deferred: usize,
    rx: Receiver<Transfer>,
    tx: Transmitter<Chunk>,
    now_ns: u64,
    next_timeout_check: u64,
    ended: Option<Failure>,
    /// The Connect data, until it is sent (after ICResp).
    connect: Option<Box<ConnectData>>,
    /// Keep Alive Timeout asked for in the Connect of an admin queue, ms.
    kato_ms: u32,
    /// When the queue ends, its unfinished I/Os stay for [`Session::take_unfinished`] instead
    /// of failing (an owner that reconnects sends them again).
    keep_unfinished: bool,
    /// I/Os the target refused for a path-related reason (SCT 3: ANA inaccessible, ...), kept
    /// for [`Session::take_rerouted`] when the owner has other paths (sized at set-up).
    rerouted: Option<Vec<(Unfinished, Status)>>,
}

fn field(offset: u32, name: &'static str) -> FatalError {
    FatalError::InvalidHeaderField {
        offset,
        field: name,
    }
}

fn slice(mem: &IovaMemory, iova: u64, offset: u32, len: usize) -> Option<VolatileSlice<'_>> {
    let at = iova.checked_add(u64::from(offset))?;
    mem.get_slice(GuestAddress(at), len).ok()
}

impl Session {
    /// A session that starts with ICReq (queued to be sent), for `host`.
    pub fn new(params: QueueParams, host: &HostOptions) -> Result<Session, HostError> {
        if !(2..=MAX_ENTRIES).contains(&params.entries) {
            return Err(HostError::InvalidArgument("a queue has 2 to 1024 entries"));
        }
        if params.block_size == 0 || !params.block_size.is_power_of_two() {
            return Err(HostError::InvalidArgument(
                "the block size is a power of two",
            ));
        }
        let connect = ConnectData::new(host.host_id, params.cntlid, &params.subnqn, &host.host_nqn)
            .map_err(|_| HostError::InvalidArgument("an NQN is at most 255 bytes, with no NUL"))?;
        let entries = params.entries as usize;
        let mut s = Session {
            asked: host.digests,
            link: Negotiated {
                digests: host.digests,
                maxh2cdata: pdu::MIN_MAXH2CDATA,
            },
            phase: Phase::AwaitIcResp,
            slots: vec![Slot::default(); entries].into_boxed_slice(),
            free: (0..entries as u16).rev().collect(),
            in_flight: 0,
            deferred: 0,
            rx: Receiver::new(RX_BATCH + pdu::MAX_HEADER + 256),
            // sized for real once ICResp tells MAXH2CDATA
            tx: Transmitter::new(2048, 8),
            now_ns: 0,
            next_timeout_check: 0,
            ended: None,
            connect: Some(Box::new(connect)),
            // only an admin queue has a keep-alive timer
            kato_ms: if params.qid == 0 { host.kato_ms } else { 0 },
            keep_unfinished: false,
            rerouted: None,
            params,
        };
        let req = IcReq {
            pfv: PFV_1_0,
            hpda: HPDA,
            digests: host.digests,
            maxr2t: 0, // one R2T at a time per command
        };
        s.push_bytes(&req.encode());
        Ok(s)
    }

    /// Whether the queue is connected and takes commands.
    pub fn ready(&self) -> bool {
        self.phase == Phase::Ready
    }

    /// The controller: on an admin queue, the one the target granted in its Connect response.
    pub fn cntlid(&self) -> u16 {
        self.params.cntlid
    }

    pub fn qid(&self) -> u16 {
        self.params.qid
    }

    /// Write data up to `bytes` goes in the command capsule from now on (IOCCSZ * 16 - 64
    /// from Identify Controller).
    pub fn set_in_capsule(&mut self, bytes: u32) {
        self.params.in_capsule = bytes;
    }

    /// A command not completed within `ns` nanoseconds from now on ends the queue.
    pub fn set_timeout(&mut self, ns: u64) {
        self.params.timeout_ns = ns;
    }

    /// Why the queue ended, once it has.
    pub fn ended(&self) -> Option<Failure> {
        self.ended
    }

    /// The namespace of [`QueueParams`]: where [`Session::submit`] sends commands.
    pub fn namespace(&self) -> IoNamespace {
        IoNamespace {
            nsid: self.params.nsid,
            block_size: self.params.block_size,
        }
    }

    /// Commands in flight.
    pub fn in_flight(&self) -> usize {
        self.in_flight
    }

    /// Commands that can be submitted now.
    pub fn free(&self) -> usize {
        if self.phase == Phase::Ready {
            self.free.len()
        } else {
            0
        }
    }

    /// Whether anything waits to be sent.
    pub fn has_outgoing(&self) -> bool {
        !self.tx.is_empty()
    }

    /// Data bytes that were read ahead with a header and copied into a DMA buffer.
    pub fn copied(&self) -> u64 {
        self.rx.copied()
    }

    /// What the target granted: the digests and MAXH2CDATA.
    pub fn negotiated(&self) -> (pdu::Digests, u32) {
        (self.link.digests, self.link.maxh2cdata)
    }

    /// The transmit buffer's and segment queue's capacities (they must not grow; tests check).
    pub fn tx_capacity(&self) -> (usize, usize) {
        self.tx.capacity()
    }

    /// The owner's clock (nanoseconds), once per turn: the submission stamp of what follows,
    /// and what timeouts are measured against.
    pub fn set_now(&mut self, now_ns: u64) {
        self.now_ns = now_ns;
    }
}
