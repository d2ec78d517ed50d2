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
//! Data moves with no copy: a write's data goes from its DMA buffer (in the capsule, or in
//! H2CData PDUs when the target sends an R2T, MAXH2CDATA at most each), a read's C2HData is
//! received straight into its DMA buffer (one `readv` of the data and the headers after it).
//! The buffers are reached through the IOVA address space's vm-memory model, as volatile
//! slices, never as `&[u8]`.
//!
//! Everything the target sends is checked before it is trusted. A malformed PDU ends the
//! queue: an H2CTermReq naming the field is queued, and every command in flight fails with
//! the reason ([`Failure`]). A data digest mismatch fails only its command. Nothing is
//! allocated per command: the slots, the receive buffer and the transmit queue are sized when
//! the queue is set up.

use std::io;

use usnvme_driver::spec::fabrics::{CATTR_DISABLE_SQ_FLOW, CONNECT_DATA};
use usnvme_driver::spec::{
    ConnectData, ConnectResponse, Cqe, DsmRange, SglDescriptor, Sqe, Status,
};
use usnvme_driver::{IoBuffer, SubmitError};
use usnvme_hugepages::IovaMemory;
use vm_memory::{GuestAddress, GuestMemoryBackend, VolatileSlice};

use super::options::{HostError, HostOptions};
use crate::block::Op;
use crate::fabric::export::wire::{ReadWire, WriteWire};
use crate::fabric::framing::{Ahead, Buffers, Need, Read, Receiver, Rules, Step, Transmitter};
use crate::fabric::pdu::{
    self, flags, DataHeader, FatalError, IcReq, IcResp, Limits, OutHeader, PduType, DIGEST,
    PFV_1_0, SHORT_HEADER,
};

/// Slots are the low bits of a command ID; the bits above are a generation, so that a
/// response to a command that already completed is caught even once its slot is reused.
const SLOT_BITS: u32 = 10;
/// The most entries a queue may have here.
pub const MAX_ENTRIES: u16 = 1 << SLOT_BITS;
/// The Connect command's ID (it completes before any I/O is accepted).
const CONNECT_CID: u16 = 0;
/// Header bytes read at once while no read is in flight: many responses per `readv`.
const RX_BATCH: usize = 4096;
/// Most bytes one [`Session::receive_from`] takes before it lets the caller do other work.
const READ_BUDGET: usize = 1 << 20;
/// Bytes one Dataset Management range takes (attributes, block count, starting LBA).
const DSM_RANGE: usize = DsmRange::SIZE;

/// In-capsule data an admin queue takes (fixed by the NVMe/TCP transport, 8 KiB). I/O queues
/// take IOCCSZ * 16 - 64 bytes, which the caller learns from Identify Controller.
pub const ADMIN_IN_CAPSULE: u32 = 8192;

/// Our data alignment (HPDA): none, so the target puts data right after the header.
const HPDA: u8 = 0;

/// PDU types the host receives before and after ICResp.
const SETUP: &[PduType] = &[PduType::IcResp, PduType::C2HTermReq];
const READY: &[PduType] = &[
    PduType::C2HTermReq,
    PduType::CapsuleResp,
    PduType::C2HData,
    PduType::R2T,
];

/// What ICReq/ICResp settled.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Negotiated {
    digests: pdu::Digests,
    maxh2cdata: u32,
}

/// Checks an ICResp against what we asked for.
fn check_ic_resp(resp: &IcResp, asked: pdu::Digests) -> Result<Negotiated, FatalError> {
    if resp.digests != asked {
        return Err(field(11, "DGST"));
    }
    // capsules carry their data right after the header; like Linux, refuse a target that
    // wants it aligned
    if resp.cpda != 0 {
        return Err(FatalError::UnsupportedParameter {
            offset: 10,
            field: "CPDA",
        });
    }
    Ok(Negotiated {
        digests: resp.digests,
        maxh2cdata: resp.maxh2cdata,
    })
}

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

/// How a [`Session::receive_from`] ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Receive {
    /// Nothing more is there now (or this turn's budget is used up).
    Drained,
    /// The queue ended (the source closed, or a protocol error): see [`Session::ended`].
    Ended,
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
    submitted_ns: u64,
    /// The response's DW0 and DW1.
    dw: [u32; 2],
}

/// Where a C2HData's data goes: its command's buffer from `offset`.
#[derive(Debug, Clone, Copy)]
struct Transfer {
    slot: u16,
    offset: u32,
    flags: u8,
}

/// Where a data segment's bytes come from: slot `slot`'s buffer from `offset`.
#[derive(Debug, Clone, Copy)]
struct Chunk {
    slot: u16,
    offset: u32,
}

/// The slots' buffers, as the transmitter sees them.
struct Sending<'a> {
    slots: &'a mut [Slot],
    mem: &'a IovaMemory,
}

impl Buffers<Chunk> for Sending<'_> {
    fn data(&self, c: Chunk, len: usize) -> Option<VolatileSlice<'_>> {
        let iova = self.slots.get(c.slot as usize)?.iova;
        slice(self.mem, iova, c.offset, len)
    }

    fn sent(&mut self, c: Chunk) {
        if let Some(s) = self.slots.get_mut(c.slot as usize) {
            s.unsent = s.unsent.saturating_sub(1);
        }
    }
}

/// The `len` bytes of its command's buffer a C2HData fills.
fn destination<'m>(
    mem: &'m IovaMemory,
    slots: &'m [Slot],
) -> impl Fn(&Transfer, usize) -> Option<VolatileSlice<'m>> {
    move |t, len| slice(mem, slots.get(t.slot as usize)?.iova, t.offset, len)
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
    /// Reads in flight: while there are any, headers are read one response ahead only, so
    /// that C2HData lands in the DMA buffers and not in the header buffer.
    reads: usize,
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
            reads: 0,
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

    /// Queues `op` on `blocks` blocks from `slba` (`buf`, in `mem`, for reads and writes):
    /// all or nothing; it is sent on the next [`Session::transmit`].
    pub fn submit(
        &mut self,
        op: Op,
        slba: u64,
        blocks: u32,
        buf: Option<IoBuffer>,
        token: u64,
        mem: &IovaMemory,
    ) -> Result<(), SubmitError> {
        self.submit_to(self.namespace(), op, slba, blocks, buf, token, mem)
    }

    /// [`Session::submit`] to namespace `ns` (a queue serves every namespace of its
    /// controller).
    #[allow(clippy::too_many_arguments)] // a command's fields, as `submit` has them
    pub fn submit_to(
        &mut self,
        ns: IoNamespace,
        op: Op,
        slba: u64,
        blocks: u32,
        buf: Option<IoBuffer>,
        token: u64,
        mem: &IovaMemory,
    ) -> Result<(), SubmitError> {
        if self.phase != Phase::Ready {
            return Err(SubmitError::Dead);
        }
        let p = &self.params;
        if op != Op::Flush && !(1..=65536).contains(&blocks) {
            return Err(SubmitError::BlockCount {
                blocks: u64::from(blocks),
            });
        }
        let len = if op.has_data() {
            u64::from(blocks) * u64::from(ns.block_size)
        } else {
            0
        };
        if len > u64::from(p.max_transfer) {
            return Err(SubmitError::ExceedsMdts {
                bytes: len,
                max: u64::from(p.max_transfer),
            });
        }
        let len = len as u32; // at most max_transfer
        let iova = match buf {
            Some(b) if op.has_data() => {
                if b.len < len || slice(mem, b.iova, 0, len as usize).is_none() {
                    return Err(SubmitError::Misaligned { iova: b.iova });
                }
                b.iova
            }
            None if op.has_data() => return Err(SubmitError::Misaligned { iova: 0 }),
            _ => 0,
        };
        let nsid = ns.nsid;
        let sqe = match op {
            Op::Read => Sqe::read(nsid, slba, blocks),
            Op::Write => Sqe::write(nsid, slba, blocks),
            Op::Flush => Sqe::flush(nsid),
            Op::WriteZeroes => Sqe::write_zeroes(nsid, slba, blocks),
            Op::Deallocate => Sqe::dataset_management(nsid, 1, true),
        };
        let dir = match op {
            Op::Read => Dir::FromController,
            Op::Write => Dir::ToController,
            _ => Dir::None,
        };
        let command = Slot {
            dir,
            token,
            nsid,
            iova,
            len,
            ..Slot::default()
        };
        if op == Op::Deallocate {
            let range = DsmRange::new(slba, blocks);
            return self.start(sqe, command, Some(range.as_bytes()), mem);
        }
        self.start(sqe, command, None, mem)
    }

    /// Queues any command (admin and Fabrics ones included) with `data` in `mem`: all or
    /// nothing; its CID and SGL are filled in here. It completes like an I/O, with `token`
    /// and the response's DW0 and DW1.
    pub fn submit_command(
        &mut self,
        sqe: Sqe,
        data: Data,
        token: u64,
        mem: &IovaMemory,
    ) -> Result<(), SubmitError> {
        if self.phase != Phase::Ready {
            return Err(SubmitError::Dead);
        }
        let (dir, buf) = match data {
            Data::ToController(b) if b.len > 0 => (Dir::ToController, b),
            Data::FromController(b) if b.len > 0 => (Dir::FromController, b),
            _ => (Dir::None, IoBuffer { iova: 0, len: 0 }),
        };
        if buf.len > self.params.max_transfer {
            return Err(SubmitError::ExceedsMdts {
                bytes: u64::from(buf.len),
                max: u64::from(self.params.max_transfer),
            });
        }
        if dir != Dir::None && slice(mem, buf.iova, 0, buf.len as usize).is_none() {
            return Err(SubmitError::Misaligned { iova: buf.iova });
        }
        let command = Slot {
            dir,
            token,
            nsid: sqe.nsid,
            iova: buf.iova,
            len: buf.len,
            ..Slot::default()
        };
        self.start(sqe, command, None, mem)
    }

    /// Takes a free slot for `command` (its direction, buffer and token) and queues its
    /// capsule: the data in it when it is a write that fits the in-capsule size, or `range`
    /// (Dataset Management's) when given.
    fn start(
        &mut self,
        mut sqe: Sqe,
        command: Slot,
        range: Option<&[u8; DSM_RANGE]>,
        mem: &IovaMemory,
    ) -> Result<(), SubmitError> {
        let Some(index) = self.free.pop() else {
            return Err(SubmitError::QueueFull {
                in_flight: self.in_flight as u16,
            });
        };
        let slot = &mut self.slots[index as usize];
        // (generation 0 never: the Connect's CID is 0)
        let generation = (slot.generation % ((1 << (16 - SLOT_BITS)) - 1)) + 1;
        let cid = index | (generation << SLOT_BITS);
        let len = command.len;
        let in_capsule = command.dir == Dir::ToController && len <= self.params.in_capsule;
        *slot = Slot {
            busy: true,
            generation,
            in_capsule,
            submitted_ns: self.now_ns,
            ..command
        };
        self.in_flight += 1;
        if command.dir == Dir::FromController {
            self.reads += 1;
        }
        sqe.set_cid(cid);
        let digests = self.link.digests;
        if let Some(range) = range {
            sqe.set_sgl(SglDescriptor::in_capsule(DSM_RANGE as u32));
            let header = OutHeader::capsule_cmd(&sqe, DSM_RANGE, digests);
            self.push_bytes(header.as_slice());
            self.push_bytes(range);
            if digests.data {
                self.push_bytes(&pdu::crc32c(range).to_le_bytes());
            }
        } else if in_capsule {
            sqe.set_sgl(SglDescriptor::in_capsule(len));
            let header = OutHeader::capsule_cmd(&sqe, len as usize, digests);
            self.push_bytes(header.as_slice());
            self.push_data(index, 0, len, mem);
        } else {
            // reads, R2T writes: the data moves in data PDUs; others carry none
            sqe.set_sgl(SglDescriptor::transport(len));
            let header = OutHeader::capsule_cmd(&sqe, 0, digests);
            self.push_bytes(header.as_slice());
        }
        Ok(())
    }

    /// Queues `len` bytes of slot `index`'s buffer from `offset`, and their data digest.
    fn push_data(&mut self, index: u16, offset: u32, len: u32, mem: &IovaMemory) {
        let slot = &mut self.slots[index as usize];
        slot.unsent += 1;
        let data = slice(mem, slot.iova, offset, len as usize);
        let chunk = Chunk {
            slot: index,
            offset,
        };
        self.tx
            .push_data(chunk, len as usize, data, self.link.digests.data);
    }

    /// Queues `bytes` to be sent.
    fn push_bytes(&mut self, bytes: &[u8]) {
        self.tx.push(bytes);
    }

    /// Sends what `dst` takes now: headers and write data gathered in one write (the data
    /// straight from the DMA buffers). The bytes sent.
    pub fn transmit<W: WriteWire + ?Sized>(
        &mut self,
        dst: &mut W,
        mem: &IovaMemory,
    ) -> io::Result<usize> {
        let mut sending = Sending {
            slots: &mut self.slots,
            mem,
        };
        self.tx.transmit(dst, &mut sending)
    }

    /// Reads from `src` and acts on what came, until it has nothing more now or the queue
    /// ends; completions go to `on_done`. Read data goes straight into the DMA buffers.
    pub fn receive_from<R: ReadWire + ?Sized>(
        &mut self,
        src: &mut R,
        mem: &IovaMemory,
        on_done: &mut impl FnMut(Completion),
    ) -> Receive {
        let mut budget = READ_BUDGET;
        loop {
            if self.phase == Phase::Ended {
                return Receive::Ended;
            }
            let need = match self.step(mem, on_done) {
                Ok(None) => continue,
                Ok(Some(need)) => need,
                Err(e) => {
                    self.protocol_error(e);
                    continue;
                }
            };
            let hdgst = if self.link.digests.header { DIGEST } else { 0 };
            let batch = self.reads == 0 && self.phase == Phase::Ready;
            let ahead = Ahead {
                // every PDU a host receives in I/O has a 24-byte header: a response and the
                // header after it
                peek: 2 * (SHORT_HEADER + hdgst),
                batch: if batch { RX_BATCH } else { 0 },
            };
            let dest = destination(mem, &self.slots);
            match self.rx.read(src, need, ahead, &mut budget, dest) {
                Ok(Read::Got(_)) => {}
                Ok(Read::Drained) => return Receive::Drained,
                Ok(Read::Ended) => self.end(Failure::Closed),
                Err(e) => {
                    log::log!(self.log_level(), "NVMe/TCP queue {}: {e}", self.params.qid);
                    self.end(Failure::Closed);
                }
            }
        }
    }

    /// Acts on what the receive buffer holds: None when something was done (call again), else
    /// what is needed to go on.
    fn step(
        &mut self,
        mem: &IovaMemory,
        on_done: &mut impl FnMut(Completion),
    ) -> Result<Option<Need>, FatalError> {
        let setup = self.phase == Phase::AwaitIcResp;
        let allowed = if setup { SETUP } else { READY };
        let rules = Rules {
            known: allowed,
            now: allowed,
            out_of_sequence: "",
            limits: Limits {
                digests: (!setup).then_some(self.link.digests),
                max_data: self.params.max_transfer,
                alignment: HPDA,
            },
        };
        match self.rx.step(&rules, destination(mem, &self.slots))? {
            Step::Need(need) => return Ok(Some(need)),
            Step::Header(header, layout) if header.pdu_type == PduType::C2HData => {
                let head = &self.rx.pending()[..layout.header_bytes + layout.pad];
                let t = self.c2h_data(head, layout.data, header.flags)?;
                self.rx.receive_data(t, &layout);
            }
            // the rest is kept whole: at most a TermReq's 152 bytes
            Step::Header(header, layout) => self.rx.keep_whole(header, layout)?,
            Step::Whole(header, _) => {
                self.on_pdu(header.pdu_type, header.plen as usize, mem, on_done)?;
                if self.phase != Phase::Ended {
                    self.rx.next_pdu();
                }
            }
            Step::Data {
                tag: t,
                len,
                digest_ok,
            } => {
                self.rx.next_pdu();
                let s = &mut self.slots[t.slot as usize];
                s.received = t.offset + len as u32;
                s.corrupt |= !digest_ok;
                if t.flags & flags::SUCCESS != 0 {
                    // the target skipped the CapsuleResp: this is the command's completion
                    self.complete(t.slot, Status::SUCCESS, [0, 0], on_done);
                }
            }
        }
        Ok(None)
    }

    /// The slot of command `cid`, if it is in flight.
    fn slot_of(&self, cid: u16) -> Option<u16> {
        let index = cid & (MAX_ENTRIES - 1);
        let s = self.slots.get(index as usize)?;
        (s.busy && s.generation == cid >> SLOT_BITS).then_some(index)
    }

    /// Checks a C2HData header against its command: where its data goes.
    fn c2h_data(&self, header: &[u8], data: usize, f: u8) -> Result<Transfer, FatalError> {
        let d = DataHeader::parse(header)?;
        let index = self.slot_of(d.cccid).ok_or(field(8, "CCCID"))?;
        let s = &self.slots[index as usize];
        if s.dir != Dir::FromController {
            return Err(FatalError::Sequence(
                "C2HData for a command that reads nothing",
            ));
        }
        if d.length as usize != data {
            return Err(field(16, "DATAL"));
        }
        if d.offset != s.received {
            return Err(FatalError::DataOutOfRange("C2HData not at the next offset"));
        }
        let end = d
            .offset
            .checked_add(d.length)
            .filter(|&e| e <= s.len)
            .ok_or(FatalError::DataOutOfRange(
                "C2HData beyond the command's data",
            ))?;
        let last = f & flags::LAST_PDU != 0;
        if last && end != s.len {
            return Err(FatalError::DataOutOfRange(
                "LAST_PDU before the end of the data",
            ));
        }
        if f & flags::SUCCESS != 0 && !last {
            return Err(field(1, "FLAGS (SUCCESS without LAST_PDU)"));
        }
        Ok(Transfer {
            slot: index,
            offset: d.offset,
            flags: f,
        })
    }

    /// A whole PDU (not C2HData) in the receive buffer, `plen` bytes.
    fn on_pdu(
        &mut self,
        t: PduType,
        plen: usize,
        mem: &IovaMemory,
        on_done: &mut impl FnMut(Completion),
    ) -> Result<(), FatalError> {
        match t {
            PduType::IcResp => {
                let resp = IcResp::parse(&self.rx.pending()[..plen])?;
                self.link = check_ic_resp(&resp, self.asked)?;
                self.size_tx();
                let data = self
                    .connect
                    .take()
                    .ok_or(FatalError::Sequence("a second ICResp"))?;
                // a slot frees only on its command's completion: the SQ head is not needed,
                // and a read may then end with its data, one PDU less (an admin queue keeps
                // SQ flow control, as Linux does: a target need not let it go there)
                let cattr = if self.params.qid == 0 {
                    0
                } else {
                    CATTR_DISABLE_SQ_FLOW
                };
                let (qid, entries) = (self.params.qid, self.params.entries);
                let mut sqe = Sqe::connect(qid, entries, cattr, self.kato_ms);
                sqe.set_cid(CONNECT_CID);
                sqe.set_sgl(SglDescriptor::in_capsule(CONNECT_DATA as u32));
                let digests = self.link.digests;
                let bytes = data.as_bytes();
                let header = OutHeader::capsule_cmd(&sqe, bytes.len(), digests);
                self.push_bytes(header.as_slice());
                self.push_bytes(bytes);
                if digests.data {
                    self.push_bytes(&pdu::crc32c(bytes).to_le_bytes());
                }
                self.phase = Phase::AwaitConnect;
                Ok(())
            }
            PduType::C2HTermReq => {
                let (fes, fei) = pdu::parse_term_req(&self.rx.pending()[..plen]).unwrap_or((0, 0));
                log::log!(
                    self.log_level(),
                    "NVMe/TCP queue {}: the target ended the connection (FES {fes}, FEI {fei})",
                    self.params.qid
                );
                self.end(Failure::Terminated { fes, fei });
                Ok(())
            }
            PduType::CapsuleResp => {
                let cqe = self
                    .rx
                    .pending()
                    .get(8..SHORT_HEADER)
                    .and_then(Cqe::from_slice)
                    .ok_or(field(2, "HLEN"))?;
                if self.phase == Phase::AwaitConnect {
                    if cqe.cid != CONNECT_CID {
                        return Err(field(20, "CID"));
                    }
                    if cqe.status().is_success() {
                        if self.params.qid == 0 {
                            self.params.cntlid = ConnectResponse::from_cqe(&cqe).cntlid;
                        }
                        self.phase = Phase::Ready;
                    } else {
                        self.end(Failure::Status(cqe.status()));
                    }
                    return Ok(());
                }
                let index = self.slot_of(cqe.cid).ok_or(field(20, "CID"))?;
                let s = self.slots[index as usize];
                let status = cqe.status();
                if status.is_success() {
                    let missing = match s.dir {
                        Dir::FromController => s.received < s.len,
                        Dir::ToController => !s.in_capsule && s.requested < s.len,
                        Dir::None => false,
                    };
                    if missing {
                        return Err(FatalError::DataOutOfRange(
                            "command succeeded before all its data moved",
                        ));
                    }
                }
                self.complete(index, status, [cqe.dw0, cqe.dw1], on_done);
                Ok(())
            }
            PduType::R2T => {
                let d = DataHeader::parse(&self.rx.pending()[..plen])?;
                self.on_r2t(&d, mem)
            }
            _ => Err(field(0, "PDU-Type")),
        }
    }

    /// Answers an R2T with H2CData PDUs of at most MAXH2CDATA bytes, straight from the buffer.
    fn on_r2t(&mut self, d: &DataHeader, mem: &IovaMemory) -> Result<(), FatalError> {
        let index = self.slot_of(d.cccid).ok_or(field(8, "CCCID"))?;
        let s = self.slots[index as usize];
        if s.dir != Dir::ToController {
            return Err(FatalError::Sequence(
                "R2T for a command that writes nothing",
            ));
        }
        if s.in_capsule {
            return Err(FatalError::Sequence("R2T for data sent in the capsule"));
        }
        if d.length == 0 {
            return Err(field(16, "R2TL"));
        }
        if d.offset != s.requested {
            return Err(FatalError::DataOutOfRange("R2T not at the next offset"));
        }
        let end = d
            .offset
            .checked_add(d.length)
            .filter(|&e| e <= s.len)
            .ok_or(FatalError::DataOutOfRange("R2T beyond the command's data"))?;
        if s.unsent > 0 {
            // we asked for one R2T at a time (MAXR2T 0): the transmit queue stays bounded
            return Err(FatalError::Sequence(
                "an R2T while the previous one's data is being sent",
            ));
        }
        self.slots[index as usize].requested = end;
        let chunk = self.link.maxh2cdata;
        let digests = self.link.digests;
        let mut at = d.offset;
        while at < end {
            let len = chunk.min(end - at);
            let h = DataHeader {
                cccid: d.cccid,
                ttag: d.ttag,
                offset: at,
                length: len,
            };
            let last = if at + len == end { flags::LAST_PDU } else { 0 };
            let header = OutHeader::data(PduType::H2CData, &h, last, digests, 0);
            self.push_bytes(header.as_slice());
            self.push_data(index, at, len, mem);
            at += len;
        }
        Ok(())
    }

    /// Sizes the transmit queue for what can be queued at once: every command's capsule and
    /// the H2CData of its one outstanding R2T, and a TermReq.
    fn size_tx(&mut self) {
        let chunks = (self.params.max_transfer as usize).div_ceil(self.link.maxh2cdata as usize);
        let entries = self.params.entries as usize;
        let per_command =
            pdu::CAPSULE_CMD_HEADER + 2 * DIGEST + chunks * (SHORT_HEADER + 2 * DIGEST);
        let bytes = entries * per_command
            + pdu::CAPSULE_CMD_HEADER
            + CONNECT_DATA
            + 2 * DIGEST
            + SHORT_HEADER
            + pdu::TERM_REQ_MAX_DATA;
        let segments = entries * (2 + 2 * chunks) + 8;
        self.tx.reserve(bytes, segments);
    }

    /// Command `index` completed with `status`: to the handler, unless its data is still
    /// being sent (then once it is).
    fn complete(
        &mut self,
        index: u16,
        status: Status,
        dw: [u32; 2],
        on_done: &mut impl FnMut(Completion),
    ) {
        let s = &mut self.slots[index as usize];
        s.dw = dw;
        let result = if !status.is_success() {
            Err(Failure::Status(status))
        } else if s.corrupt {
            Err(Failure::DataDigest)
        } else {
            Ok(())
        };
        if s.unsent > 0 {
            if s.deferred.is_none() {
                s.deferred = Some(result);
                self.deferred += 1;
            }
            return;
        }
        self.finish(index, result, on_done);
    }

    fn finish(
        &mut self,
        index: u16,
        result: Result<(), Failure>,
        on_done: &mut impl FnMut(Completion),
    ) {
        let s = self.slots[index as usize];
        self.slots[index as usize] = Slot {
            generation: s.generation,
            ..Slot::default()
        };
        self.free.push(index);
        self.in_flight -= 1;
        if s.dir == Dir::FromController {
            self.reads -= 1;
        }
        on_done(Completion {
            token: s.token,
            nsid: s.nsid,
            result,
            submitted_ns: s.submitted_ns,
            bytes: if s.dir == Dir::None { 0 } else { s.len },
            dw0: s.dw[0],
            dw1: s.dw[1],
        });
    }

    /// Delivers the completions that waited for their data to be sent, and once the queue
    /// ended, fails everything in flight (nothing is sent from the buffers any more).
    pub fn deliver(&mut self, on_done: &mut impl FnMut(Completion)) {
        if let Some(reason) = self.ended {
            // (the slots' `unsent` go with the slots, just below)
            self.tx.clear(|_| {});
            self.deferred = 0;
            for index in 0..self.slots.len() as u16 {
                let s = self.slots[index as usize];
                if s.busy {
                    let result = match s.deferred {
                        Some(r) => r,
                        None if s.timed_out => Err(Failure::TimedOut),
                        None => Err(reason),
                    };
                    self.finish(index, result, on_done);
                }
            }
            return;
        }
        if self.deferred == 0 {
            return;
        }
        for index in 0..self.slots.len() as u16 {
            let s = self.slots[index as usize];
            if let (true, 0, Some(result)) = (s.busy, s.unsent, s.deferred) {
                self.deferred -= 1;
                self.finish(index, result, on_done);
            }
        }
    }

    /// Ends the queue if a command outlived the timeout (checked a few times per timeout).
    pub fn check_timeouts(&mut self) {
        let now = self.now_ns;
        if self.in_flight == 0 || now < self.next_timeout_check || self.ended.is_some() {
            return;
        }
        let timeout = self.params.timeout_ns.max(1);
        self.next_timeout_check = now.saturating_add((timeout / 4).max(1_000_000));
        let mut late = false;
        for s in self.slots.iter_mut() {
            if s.busy && s.deferred.is_none() && now.saturating_sub(s.submitted_ns) > timeout {
                s.timed_out = true;
                late = true;
            }
        }
        if late {
            log::log!(
                self.log_level(),
                "NVMe/TCP queue {}: a command timed out: closing the queue",
                self.params.qid
            );
            self.end(Failure::Aborted);
        }
    }

    /// The owner closes the queue: what is in flight fails as aborted on the next
    /// [`Session::deliver`].
    pub fn close(&mut self) {
        self.end(Failure::Aborted);
    }

    /// The connection is gone (a socket error).
    pub fn peer_gone(&mut self) {
        self.end(Failure::Closed);
    }

    /// How loud the queue's own failures are: an I/O queue's go to many I/Os and are logged;
    /// an admin queue's client reports each to its caller, so they are only debug output.
    fn log_level(&self) -> log::Level {
        if self.params.qid == 0 {
            log::Level::Debug
        } else {
            log::Level::Warn
        }
    }

    fn end(&mut self, reason: Failure) {
        if self.ended.is_none() {
            self.ended = Some(reason);
            self.phase = Phase::Ended;
        }
    }

    /// A malformed PDU: an H2CTermReq naming the field (after what is queued), then the end.
    fn protocol_error(&mut self, error: FatalError) {
        log::log!(
            self.log_level(),
            "NVMe/TCP queue {}: the target broke the protocol: {error} (FES {}, FEI {})",
            self.params.qid,
            error.fes(),
            error.fei()
        );
        let bad = pdu::offending(self.rx.pending());
        let term = pdu::TermReq::new(PduType::H2CTermReq, &error, bad);
        self.push_bytes(term.as_slice());
        self.end(Failure::Protocol(error));
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use vm_memory::Bytes;

    use super::*;
    use crate::fabric::export::connection::{Connection, ConnectionLimits};
    use crate::fabric::export::memory::{test_subsystem, MemoryBackend};
    use crate::fabric::export::registry::Registry;
    use usnvme_driver::spec::fabrics::CNTLID_DYNAMIC;
    use usnvme_driver::spec::PropertySize;

    const BASE: u64 = 0x10_0000;
    const BOTH: pdu::Digests = pdu::Digests {
        header: true,
        data: true,
    };

    /// Bytes in memory; `WouldBlock` once they are consumed (as a quiet socket).
    struct Pipe<'a>(&'a [u8]);

    impl ReadWire for Pipe<'_> {
        fn read_parts(&mut self, parts: &[VolatileSlice<'_>]) -> io::Result<usize> {
            if self.0.is_empty() {
                return Err(io::ErrorKind::WouldBlock.into());
            }
            self.0.read_parts(parts)
        }
    }

    /// A capsule of `sqe` with `data` in it.
    pub(crate) fn capsule(sqe: &Sqe, data: &[u8], digests: pdu::Digests) -> Vec<u8> {
        let h = OutHeader::capsule_cmd(sqe, data.len(), digests);
        let mut out = h.as_slice().to_vec();
        out.extend_from_slice(data);
        if digests.data && !data.is_empty() {
            out.extend_from_slice(&pdu::crc32c(data).to_le_bytes());
        }
        out
    }

    /// An enabled controller (1) on the target, through an admin connection driven by hand.
    fn admin(
        sub: &Arc<crate::fabric::export::SubsystemInfo>,
        registry: &Arc<Registry>,
    ) -> Connection {
        let mut backend = MemoryBackend::new(sub);
        let limits = ConnectionLimits { maxh2cdata: 16384 };
        let mut a = Connection::new(sub.clone(), registry.clone(), limits, "admin".into());
        let ic = IcReq {
            pfv: PFV_1_0,
            hpda: 0,
            digests: pdu::Digests::default(),
            maxr2t: 0,
        };
        a.receive(&ic.encode(), &mut backend);
        let mut sqe = Sqe::connect(0, 32, 0, 0);
        sqe.set_sgl(SglDescriptor::in_capsule(CONNECT_DATA as u32));
        let host = HostOptions::default();
        let data =
            ConnectData::new(host.host_id, CNTLID_DYNAMIC, &sub.nqn, &host.host_nqn).expect("data");
        let data = data.as_bytes();
        a.receive(&capsule(&sqe, data, pdu::Digests::default()), &mut backend);
        let mut cc = Sqe::property_set(0x14, PropertySize::Four, 0x46_0001);
        cc.set_cid(1);
        a.receive(&capsule(&cc, &[], pdu::Digests::default()), &mut backend);
        let mut out = Vec::new();
        a.transmit(&mut out, &mut backend).expect("memory");
        a
    }

    /// The target's I/O connection and our session over memory.
    struct Bed {
        _admin: Connection,
        conn: Connection,
        backend: MemoryBackend,
        session: Session,
        mem: IovaMemory,
        done: Vec<Completion>,
        /// Bytes the target sent.
        received: usize,
    }

    fn params(sub: &crate::fabric::export::SubsystemInfo) -> QueueParams {
        QueueParams {
            subnqn: sub.nqn.clone(),
            qid: 1,
            cntlid: 1,
            entries: 32,
            nsid: 1,
            block_size: 512,
            in_capsule: sub.in_capsule_bytes,
            max_transfer: sub.max_transfer,
            timeout_ns: 1_000_000_000,
        }
    }

    impl Bed {
        fn new(digests: pdu::Digests) -> Bed {
            let sub = Arc::new(test_subsystem(1));
            let registry = Arc::new(Registry::new(None));
            let admin = admin(&sub, &registry);
            let backend = MemoryBackend::new(&sub);
            let limits = ConnectionLimits { maxh2cdata: 16384 };
            let conn = Connection::new(sub.clone(), registry, limits, "io".into());
            let host = HostOptions {
                digests,
                ..HostOptions::default()
            };
            let session = Session::new(params(&sub), &host).expect("a session");
            let mem = IovaMemory::from_ranges(&[(GuestAddress(BASE), 4 << 20)]).expect("memory");
            let mut bed = Bed {
                _admin: admin,
                conn,
                backend,
                session,
                mem,
                done: Vec::new(),
                received: 0,
            };
            bed.pump();
            assert!(bed.session.ready(), "{:?}", bed.session.ended());
            assert_eq!(bed.session.negotiated(), (digests, 16384));
            bed
        }

        /// Moves bytes both ways until both sides are quiet.
        fn pump(&mut self) {
            for _ in 0..64 {
                let mut wire = Vec::new();
                self.session.transmit(&mut wire, &self.mem).expect("memory");
                if !wire.is_empty() {
                    self.conn.receive(&wire, &mut self.backend);
                }
                self.backend.complete_all(&mut self.conn);
                let mut back = Vec::new();
                self.conn
                    .transmit(&mut back, &mut self.backend)
                    .expect("memory");
                self.received += back.len();
                let done = &mut self.done;
                let mut on_done = |c| done.push(c);
                self.session
                    .receive_from(&mut Pipe(&back), &self.mem, &mut on_done);
                self.session.deliver(&mut on_done);
                if wire.is_empty() && back.is_empty() {
                    return;
                }
            }
            panic!("the queue never went quiet");
        }

        fn io(&mut self, op: Op, slba: u64, blocks: u32, at: u64, token: u64) {
            let buf = op.has_data().then_some(IoBuffer {
                iova: BASE + at,
                len: blocks * 512,
            });
            self.session
                .submit(op, slba, blocks, buf, token, &self.mem)
                .expect("submitted");
        }

        fn results(&mut self) -> Vec<(u64, Result<(), Failure>)> {
            let mut r: Vec<_> = self.done.drain(..).map(|c| (c.token, c.result)).collect();
            r.sort_by_key(|x| x.0);
            r
        }
    }

    fn pattern(len: usize, seed: u8) -> Vec<u8> {
        (0..len)
            .map(|i| (i as u8).wrapping_mul(13).wrapping_add(seed))
            .collect()
    }

    #[test]
    fn writes_in_the_capsule_and_by_r2t_read_back_with_and_without_digests() {
        for digests in [pdu::Digests::default(), BOTH] {
            let mut bed = Bed::new(digests);
            let small = pattern(4096, 1); // in the capsule (8 KiB at most)
            let big = pattern(64 << 10, 2); // R2T, four H2CData of 16 KiB
            bed.mem
                .write_slice(&small, GuestAddress(BASE))
                .expect("write");
            bed.mem
                .write_slice(&big, GuestAddress(BASE + 0x10000))
                .expect("write");
            bed.io(Op::Write, 8, 8, 0, 1);
            bed.io(Op::Write, 100, 128, 0x10000, 2);
            bed.pump();
            assert_eq!(bed.results(), [(1, Ok(())), (2, Ok(()))]);
            let disk = &bed.backend.namespaces[0];
            assert_eq!(&disk[8 * 512..8 * 512 + 4096], &small[..]);
            assert_eq!(&disk[100 * 512..100 * 512 + big.len()], &big[..]);

            // both back, at once, into other buffers
            bed.io(Op::Read, 8, 8, 0x40000, 3);
            bed.io(Op::Read, 100, 128, 0x80000, 4);
            bed.pump();
            assert_eq!(bed.results(), [(3, Ok(())), (4, Ok(()))]);
            let mut got = vec![0u8; big.len()];
            bed.mem
                .read_slice(&mut got[..4096], GuestAddress(BASE + 0x40000))
                .expect("read");
            assert_eq!(&got[..4096], &small[..]);
            bed.mem
                .read_slice(&mut got, GuestAddress(BASE + 0x80000))
                .expect("read");
            assert_eq!(got, big);

            // Write Zeroes, Deallocate, Flush
            bed.io(Op::WriteZeroes, 8, 4, 0, 5);
            bed.io(Op::Deallocate, 12, 4, 0, 6);
            bed.io(Op::Flush, 0, 0, 0, 7);
            bed.pump();
            assert_eq!(bed.results(), [(5, Ok(())), (6, Ok(())), (7, Ok(()))]);
            assert!(bed.backend.namespaces[0][8 * 512..16 * 512]
                .iter()
                .all(|&b| b == 0));
            assert_eq!(bed.backend.flushes[0], 1);
            assert_eq!(bed.session.in_flight(), 0);
        }
    }

    #[test]
    fn a_read_ends_with_its_data_and_no_response_capsule() {
        let mut bed = Bed::new(pdu::Digests::default());
        bed.received = 0;
        bed.io(Op::Read, 0, 8, 0, 1);
        bed.pump();
        assert_eq!(bed.results(), [(1, Ok(()))]);
        // one C2HData (LAST_PDU | SUCCESS): its 24-byte header and 4 KiB, no CapsuleResp
        assert_eq!(bed.received, 24 + 4096);
        // a write is still answered by a response capsule
        bed.received = 0;
        bed.io(Op::Write, 0, 8, 0, 2);
        bed.pump();
        assert_eq!(bed.results(), [(2, Ok(()))]);
        assert_eq!(bed.received, 24);
    }

    #[test]
    fn a_failed_command_names_its_status_and_the_queue_goes_on() {
        let mut bed = Bed::new(pdu::Digests::default());
        bed.io(Op::Read, 2047, 2, 0, 1); // past the end of the 2048-block namespace
        bed.pump();
        let r = bed.results();
        let Err(Failure::Status(status)) = r[0].1 else {
            panic!("{r:?}");
        };
        assert_eq!(status.code(), Status::LBA_OUT_OF_RANGE);
        assert_eq!(status.name(), "LBA Out of Range");
        bed.io(Op::Read, 0, 1, 0, 2);
        bed.pump();
        assert_eq!(bed.results(), [(2, Ok(()))]);
    }

    #[test]
    fn the_queue_refuses_what_it_cannot_send() {
        let mut bed = Bed::new(pdu::Digests::default());
        let mem = &bed.mem;
        let s = &mut bed.session;
        let buf = |len| Some(IoBuffer { iova: BASE, len });
        assert!(matches!(
            s.submit(Op::Read, 0, 512, buf(256 << 10), 1, mem),
            Err(SubmitError::ExceedsMdts { .. })
        ));
        assert!(matches!(
            s.submit(Op::Read, 0, 2, buf(512), 1, mem),
            Err(SubmitError::Misaligned { .. })
        ));
        let outside = Some(IoBuffer {
            iova: 0x1000,
            len: 512,
        });
        assert!(matches!(
            s.submit(Op::Write, 0, 1, outside, 1, mem),
            Err(SubmitError::Misaligned { .. })
        ));
        for token in 0..32 {
            s.submit(Op::Read, 0, 1, buf(512), token, mem)
                .expect("room");
        }
        assert!(matches!(
            s.submit(Op::Read, 0, 1, buf(512), 99, mem),
            Err(SubmitError::QueueFull { in_flight: 32 })
        ));
        bed.pump();
        assert_eq!(bed.results().len(), 32);
    }

    /// A session ready on memory whose target the test plays by hand.
    fn scripted(digests: pdu::Digests) -> (Session, IovaMemory) {
        let sub = test_subsystem(1);
        let host = HostOptions {
            digests,
            ..HostOptions::default()
        };
        let mut s = Session::new(params(&sub), &host).expect("a session");
        let mem = IovaMemory::from_ranges(&[(GuestAddress(BASE), 1 << 20)]).expect("memory");
        let resp = IcResp {
            pfv: 0,
            cpda: 0,
            digests,
            maxh2cdata: 8192,
        };
        let mut none = |_| {};
        s.transmit(&mut Vec::new(), &mem).expect("memory");
        s.receive_from(&mut Pipe(&resp.encode()), &mem, &mut none);
        let cqe = Cqe::new(0, 0, 1, CONNECT_CID, Status::SUCCESS, false);
        let h = OutHeader::capsule_resp(&cqe, digests);
        s.receive_from(&mut Pipe(h.as_slice()), &mem, &mut none);
        assert!(s.ready(), "{:?}", s.ended());
        (s, mem)
    }

    #[test]
    fn a_malformed_pdu_ends_the_queue_with_a_term_req_and_fails_what_is_in_flight() {
        let (mut s, mem) = scripted(pdu::Digests::default());
        let buf = Some(IoBuffer {
            iova: BASE,
            len: 512,
        });
        s.submit(Op::Read, 0, 1, buf, 1, &mem).expect("room");
        s.submit(Op::Write, 0, 1, buf, 2, &mem).expect("room");
        let mut wire = Vec::new();
        s.transmit(&mut wire, &mem).expect("memory");
        let cqe = Cqe::new(0, 0, 1, 1, Status::SUCCESS, false);
        let mut h = OutHeader::capsule_resp(&cqe, pdu::Digests::default());
        h.bytes[2] = 23; // HLEN
        let mut done = Vec::new();
        let mut on_done = |c: Completion| done.push((c.token, c.result));
        assert_eq!(
            s.receive_from(&mut Pipe(h.as_slice()), &mem, &mut on_done),
            Receive::Ended
        );
        let mut term = Vec::new();
        s.transmit(&mut term, &mem).expect("memory");
        assert_eq!(PduType::from_raw(term[0]), Some(PduType::H2CTermReq));
        assert_eq!(pdu::parse_term_req(&term), Some((1, 2)));
        s.deliver(&mut on_done);
        done.sort_by_key(|d| d.0);
        let hlen = Failure::Protocol(field(2, "HLEN"));
        assert_eq!(done, [(1, Err(hlen)), (2, Err(hlen))]);
        assert!(Failure::Protocol(field(2, "HLEN"))
            .to_string()
            .contains("HLEN"));
        assert!(matches!(
            s.submit(Op::Read, 0, 1, buf, 3, &mem),
            Err(SubmitError::Dead)
        ));
    }

    #[test]
    fn c2h_data_is_checked_against_its_command() {
        // (offset, length, CID change, FES): out of order, beyond the command, unknown command
        let cases: [(u32, u32, u16, u16); 3] = [(512, 512, 0, 4), (0, 1024, 0, 4), (0, 512, 9, 1)];
        for (offset, length, cid_delta, fes) in cases {
            let (mut s, mem) = scripted(pdu::Digests::default());
            let buf = Some(IoBuffer {
                iova: BASE,
                len: 512,
            });
            s.submit(Op::Read, 0, 1, buf, 1, &mem).expect("room");
            let d = DataHeader {
                cccid: (1 << SLOT_BITS) + cid_delta, // slot 0, generation 1
                ttag: 0,
                offset,
                length,
            };
            let h = OutHeader::data(
                PduType::C2HData,
                &d,
                flags::LAST_PDU,
                pdu::Digests::default(),
                0,
            );
            let mut bytes = h.as_slice().to_vec();
            bytes.resize(bytes.len() + length as usize, 0xaa);
            let mut done = Vec::new();
            let mut on_done = |c: Completion| done.push(c.result);
            s.receive_from(&mut Pipe(&bytes), &mem, &mut on_done);
            s.deliver(&mut on_done);
            let [Err(Failure::Protocol(e))] = done[..] else {
                panic!("{done:?}");
            };
            assert_eq!(e.fes(), fes, "{e}");
        }
    }

    #[test]
    fn a_data_digest_mismatch_fails_only_its_command() {
        let (mut s, mem) = scripted(BOTH);
        let buf = Some(IoBuffer {
            iova: BASE,
            len: 512,
        });
        s.submit(Op::Read, 0, 1, buf, 1, &mem).expect("room");
        let d = DataHeader {
            cccid: 1 << SLOT_BITS,
            ttag: 0,
            offset: 0,
            length: 512,
        };
        let h = OutHeader::data(
            PduType::C2HData,
            &d,
            flags::LAST_PDU | flags::SUCCESS,
            BOTH,
            0,
        );
        let mut bytes = h.as_slice().to_vec();
        bytes.extend_from_slice(&[7u8; 512]);
        bytes.extend_from_slice(&(pdu::crc32c(&[7u8; 512]) ^ 1).to_le_bytes());
        let mut done = Vec::new();
        let mut on_done = |c: Completion| done.push(c.result);
        s.receive_from(&mut Pipe(&bytes), &mem, &mut on_done);
        assert_eq!(done, [Err(Failure::DataDigest)]);
        assert!(s.ready());
    }

    #[test]
    fn a_command_past_its_timeout_ends_the_queue() {
        let (mut s, mem) = scripted(pdu::Digests::default());
        let buf = Some(IoBuffer {
            iova: BASE,
            len: 512,
        });
        s.set_now(10);
        s.submit(Op::Read, 0, 1, buf, 1, &mem).expect("room");
        s.set_now(500_000_000);
        s.submit(Op::Read, 0, 1, buf, 2, &mem).expect("room");
        s.check_timeouts();
        assert_eq!(s.ended(), None);
        s.set_now(1_100_000_000);
        s.check_timeouts();
        let mut done = Vec::new();
        s.deliver(&mut |c: Completion| done.push((c.token, c.result)));
        done.sort_by_key(|d| d.0);
        assert_eq!(
            done,
            [(1, Err(Failure::TimedOut)), (2, Err(Failure::Aborted))]
        );
    }

    /// What a good target sends for a read (slot 0), an in-capsule write (1) and an R2T
    /// write (2), all in generation 1.
    fn good_answers(digests: pdu::Digests) -> Vec<u8> {
        let g = 1 << SLOT_BITS;
        let mut out = Vec::new();
        let mut pdu_with = |h: OutHeader, data: &[u8]| {
            out.extend_from_slice(h.as_slice());
            out.resize(out.len() + h.pad(), 0);
            out.extend_from_slice(data);
            if digests.data && !data.is_empty() {
                out.extend_from_slice(&pdu::crc32c(data).to_le_bytes());
            }
        };
        let d = |cccid, offset, length| DataHeader {
            cccid,
            ttag: 5,
            offset,
            length,
        };
        pdu_with(
            OutHeader::data(PduType::C2HData, &d(g, 0, 512), flags::LAST_PDU, digests, 0),
            &[3u8; 512],
        );
        pdu_with(OutHeader::r2t(&d(g + 2, 0, 16384), digests), &[]);
        for cid in [g, g + 1, g + 2] {
            let cqe = Cqe::new(0, 0, 1, cid, Status::SUCCESS, false);
            pdu_with(OutHeader::capsule_resp(&cqe, digests), &[]);
        }
        out
    }

    #[test]
    fn mutated_target_streams_never_panic_and_every_io_completes_once() {
        let mut rng = fastrand::Rng::with_seed(16);
        for round in 0..3000 {
            let digests = if round % 2 == 0 {
                BOTH
            } else {
                pdu::Digests::default()
            };
            let (mut s, mem) = scripted(digests);
            let buf = |at: u64, len| {
                Some(IoBuffer {
                    iova: BASE + at,
                    len,
                })
            };
            s.submit(Op::Read, 0, 1, buf(0, 512), 0, &mem)
                .expect("room");
            s.submit(Op::Write, 0, 1, buf(0x1000, 512), 1, &mem)
                .expect("room");
            s.submit(Op::Write, 0, 32, buf(0x10000, 16384), 2, &mem)
                .expect("room");
            s.transmit(&mut Vec::new(), &mem).expect("memory");
            let mut stream = good_answers(digests);
            if round > 0 {
                for _ in 0..rng.usize(1..4) {
                    let at = rng.usize(..stream.len());
                    match rng.u8(..3) {
                        0 => stream[at] ^= 1 << rng.u8(..8),
                        1 => stream[at] = rng.u8(..),
                        _ => stream.truncate(at),
                    }
                    if stream.is_empty() {
                        break;
                    }
                }
            }
            let mut done = Vec::new();
            let mut on_done = |c: Completion| done.push((c.token, c.result));
            let mut rest = &stream[..];
            while !rest.is_empty() && s.ended().is_none() {
                let n = rng.usize(1..=rest.len().min(700));
                s.receive_from(&mut Pipe(&rest[..n]), &mem, &mut on_done);
                s.transmit(&mut Vec::new(), &mem).expect("memory");
                s.deliver(&mut on_done);
                rest = &rest[n..];
            }
            s.close();
            s.deliver(&mut on_done);
            done.sort_by_key(|d| d.0);
            let tokens: Vec<u64> = done.iter().map(|d| d.0).collect();
            assert_eq!(tokens, [0, 1, 2], "round {round}: every I/O completes once");
            if round == 0 {
                assert!(done.iter().all(|d| d.1.is_ok()), "{done:?}");
            }
            assert_eq!(s.in_flight(), 0);
        }
    }
}
