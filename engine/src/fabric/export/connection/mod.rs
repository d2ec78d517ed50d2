//! One NVMe/TCP connection of the target: PDUs in, commands out to the block devices (through
//! a [`Backend`]), responses back. No socket here: the caller hands it a byte source and sink
//! ([`ReadWire`] / [`WriteWire`]: the socket, or memory in tests and the fuzzer), so tests and
//! the fuzzer drive the same state machine the reactors do.
//!
//! A connection is set up by ICReq/ICResp, then a Fabrics Connect makes it an admin queue
//! (which creates a controller) or an I/O queue (of an existing controller). Everything the
//! peer sends is checked before it is trusted; a malformed PDU ends the connection with a
//! C2HTermReq naming the field, and the commands in flight are drained (their buffers given
//! back) before the connection is dropped. Memory is bounded by what the target advertises:
//! queue entries, in-capsule size and MAXH2CDATA.
//!
//! Zero copy: a write's data (in-capsule or H2CData) is received straight into the command's
//! DMA buffer, and a read's data is sent straight from it (one `writev` of header, buffer and
//! response). Headers, and data the connection itself consumes (Connect, Dataset Management
//! ranges), go through the connection's own receive buffer. Headers are read ahead in batches
//! (one `read` for many commands) only after a long run of PDUs without data for the drives
//! and while no R2T awaits its data; otherwise the connection reads exactly one header ahead,
//! so the next PDU's data is not pulled into the header buffer. (When it was, as for the
//! first write after a long run of reads, those bytes are copied over and counted in
//! [`Connection::copied`].)

use std::collections::VecDeque;
use std::io;
use std::sync::Arc;
use std::time::{Duration, Instant};

use usnvme_driver::spec::{Cqe, SmartLog, Sqe, Status};
use vm_memory::VolatileSlice;

use super::admin::{self, ConnectData, FabricsCommand, Features};
use super::registry::{Controller, Registry};
use super::wire::{self, ReadWire, WriteWire};
use super::{Listener, SubsystemInfo};
use crate::block::Op;
use crate::fabric::host::CATTR_DISABLE_SQ_FLOW;
use crate::fabric::pdu::{
    self, flags, CommonHeader, DataHeader, Digests, FatalError, IcReq, IcResp, Layout, Limits,
    OutHeader, PduType, CAPSULE_CMD_HEADER, COMMON_HEADER, DIGEST, PFV_1_0, SHORT_HEADER,
};

/// PDU types a target receives.
const RECEIVED: &[PduType] = &[
    PduType::IcReq,
    PduType::H2CTermReq,
    PduType::CapsuleCmd,
    PduType::H2CData,
];

/// NVM command set opcodes served on I/O queues.
const FLUSH: u8 = 0x00;
const WRITE: u8 = 0x01;
const READ: u8 = 0x02;
const WRITE_ZEROES: u8 = 0x08;
const DATASET_MANAGEMENT: u8 = 0x09;
const FABRICS: u8 = 0x7f;
/// Connect's CATTR bit by which a host disables SQ flow control.
/// Admin opcodes handled by the connection itself (the rest go to [`admin`]).
const ASYNC_EVENT_REQUEST: u8 = 0x0c;
const KEEP_ALIVE: u8 = 0x18;

/// SGL descriptor types in a command capsule: data in the capsule at an offset, or data the
/// transport moves (R2T/H2CData for writes, C2HData for reads).
const SGL_IN_CAPSULE: u8 = 0x01;
const SGL_TRANSPORT: u8 = 0x5a;

/// SMART Get Log Page commands one admin queue may have waiting for the drives' answer.
const SMART_WAITING: usize = 4;
/// PDUs in a row without data for the drives after which headers are read ahead in batches
/// (one `read` for many commands): a host that only reads gets batched reads, one that also
/// writes gets its write data straight into the DMA buffers.
const QUIET_BEFORE_READ_AHEAD: u16 = 64;
/// Most bytes one [`Connection::receive_from`] takes before it lets the reactor serve others.
const READ_BUDGET: usize = 1 << 20;
/// Reading stops while more header bytes than this wait to be sent (the host is not reading
/// its responses): TCP then pushes back on the host, and the transmit buffer stays bounded.
const TX_HIGH_WATER: usize = 16 << 10;
/// Transmit bytes one command can add when it completes: a C2HData header padded to the
/// host's alignment (at most 128 bytes), a data digest, a CapsuleResp with its digest.
const TX_PER_COMMAND: usize = 128 + DIGEST + SHORT_HEADER + DIGEST;
/// Transmit bytes one received PDU can add: an IcResp, a TermReq with the offending header, or
/// an admin command's data (with its C2HData header and digest) and response.
const TX_PER_PDU: usize = admin::MAX_ADMIN_DATA + 2 * 128 + 4 * DIGEST + SHORT_HEADER;

/// What the drives under the target do for a connection. Tokens are the connection's own
/// (one per command slot); the caller maps them to its block devices' tokens.
pub trait Backend {
    /// A buffer of `len` bytes for command `token`'s data; false when none is free now (the
    /// command then fails with "Namespace Not Ready"-like busy status and the host retries).
    fn reserve(&mut self, token: u16, len: usize) -> bool;
    /// Command `token`'s buffer (at least the `len` bytes reserved): a write's data is received
    /// into it and a read's data sent from it, in place.
    fn buffer(&self, token: u16) -> Option<VolatileSlice<'_>>;
    /// Starts `op` on namespace index `ns` at byte `offset`, `len` bytes; the result comes
    /// back through [`Connection::complete`].
    fn submit(
        &mut self,
        token: u16,
        ns: usize,
        op: Op,
        offset: u64,
        len: u64,
    ) -> Result<(), Status>;
    /// The command is done with its buffer.
    fn release(&mut self, token: u16);
    /// Starts reading SMART / Health of the drives under the subsystem (aggregated) where it
    /// does not hold up the reactor; false when it cannot be asked for now.
    fn smart_request(&mut self) -> bool;
    /// The answer to the request, once it is there (taken once).
    fn smart_answer(&mut self) -> Option<SmartLog>;
}

/// The limits this target advertises and enforces on every connection.
#[derive(Debug, Clone, Copy)]
pub struct ConnectionLimits {
    /// Most data in one H2CData PDU.
    pub maxh2cdata: u32,
}

/// How a [`Connection::receive_from`] ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Receive {
    /// The source has nothing more now (or the read budget of this turn is used up).
    Drained,
    /// The source ended: the host closed the connection.
    Ended,
    /// Nothing is read now: the connection is closing, or its responses are backed up.
    Paused,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Phase {
    AwaitIcReq,
    Ready,
    /// A TermReq was queued, or the host ended the connection: nothing more is read.
    Closing,
}

/// What a Fabrics Connect made of this connection.
#[derive(Debug)]
enum Role {
    None,
    Admin {
        controller: Arc<Controller>,
        features: Features,
        registers: admin::ControllerRegisters,
        /// Async Event Requests held (their CIDs), completed when the controller goes away.
        events: Vec<u16>,
        /// Get Log Page (SMART) commands waiting for the drives' answer.
        smart_waiting: Vec<Sqe>,
        last_keep_alive: Instant,
    },
    Io {
        controller: Arc<Controller>,
        qid: u16,
    },
}

/// How a discovery controller's host reads the discovery log: at the port it came in on, with
/// the NVM subsystem listed only if the host may connect to it. None for an I/O controller.
fn discovery_asker<'a>(
    port: &'a Listener,
    registry: &Registry,
    controller: &Controller,
) -> Option<admin::DiscoveryAsker<'a>> {
    controller.discovery().then(|| admin::DiscoveryAsker {
        port,
        host_allowed: registry.host_allowed(controller.host_nqn()),
    })
}

/// One command in flight on this connection.
#[derive(Debug, Clone, Copy, Default)]
struct Slot {
    busy: bool,
    cid: u16,
    ns: usize,
    op: Option<Op>,
    offset: u64,
    len: u32,
    /// Write data received so far (R2T transfers).
    received: u32,
    /// Submitted to the backend (a reply is owed when it completes).
    submitted: bool,
    /// Completed and answered; its data is still being sent from its buffer.
    sending: bool,
    /// Backend completions still to come (a Dataset Management command has one per range).
    pending: u16,
    /// The first failure among its parts.
    failed: Option<Status>,
    /// The Flushes of a shutdown (CC.SHN), not a command of the host's.
    shutdown_flush: bool,
}

/// Data of the PDU being received that goes straight into a command's buffer.
#[derive(Debug, Clone, Copy)]
struct Transfer {
    token: u16,
    /// Where the PDU's data starts in the buffer, its length and how much has arrived.
    offset: usize,
    len: usize,
    done: usize,
    /// The PDU's header and padding, at the start of the receive buffer.
    head: usize,
    digest: bool,
    /// H2CData: whether it is the transfer's last PDU; None for in-capsule data.
    last: Option<bool>,
}

/// Where the PDU being received stands.
#[derive(Debug, Clone, Copy)]
enum RxState {
    /// Its header is being read (from `rx_start`).
    Header,
    /// It is kept whole in the receive buffer (its data is the connection's own).
    Whole(CommonHeader, Layout),
    /// Its data goes into a command's buffer.
    Data(Transfer),
}

/// What the receive side needs before it can go on.
#[derive(Debug, Clone, Copy)]
enum Need {
    /// The start of a PDU: read a header's worth ahead.
    Header,
    /// Exactly this many more bytes (data of the drives may follow them).
    Exact(usize),
    /// This many more bytes, after which a new PDU starts (its header may be read ahead).
    ThenHeader(usize),
}

/// A piece of what is to be sent: bytes of `tx`, or data from a command's buffer.
#[derive(Debug, Clone, Copy)]
enum Segment {
    Bytes { at: usize, len: usize },
    Data { token: u16, len: usize },
}

/// The state machine of one connection.
pub struct Connection {
    phase: Phase,
    digests: Digests,
    /// The host's PDU data alignment (HPDA), dwords, 0's based.
    host_alignment: u8,
    role: Role,
    /// The submission queue as the host sees it: its entries (from Connect), the commands
    /// taken from it so far (the SQ head every response reports), and whether the host keeps
    /// SQ flow control (a Connect without "disable SQ flow control"): without it a read may end
    /// with its C2HData (the SUCCESS flag) and no response capsule.
    sq_entries: u32,
    sq_taken: u32,
    sq_flow: bool,
    subsystem: Arc<SubsystemInfo>,
    registry: Arc<Registry>,
    limits: ConnectionLimits,
    /// Received bytes: the PDU being received starts at `rx_start`; `rx_end` is the end of
    /// what was read (headers read ahead may follow it).
    rx: Box<[u8]>,
    rx_start: usize,
    rx_end: usize,
    rx_state: RxState,
    /// PDUs in a row without data for the drives (saturating): headers are read ahead in
    /// batches from [`QUIET_BEFORE_READ_AHEAD`] on.
    quiet: u16,
    /// R2Ts whose data has not all come: the next PDU may be an H2CData (a short header).
    r2t_open: u16,
    /// Data bytes that were read ahead into the header buffer and copied into a DMA buffer.
    copied: u64,
    /// What is to be sent, in order; bytes in `tx`, `tx_pending` of them not yet sent.
    tx: Vec<u8>,
    segments: VecDeque<Segment>,
    /// Bytes of the first segment already sent.
    segment_sent: usize,
    tx_pending: usize,
    slots: Box<[Slot]>,
    in_flight: usize,
    /// Where an admin command's answer (Identify, a log page) is built, then copied to `tx`.
    admin_data: Box<[u8]>,
    /// Why the connection ends, once it does.
    closed: Option<String>,
    peer: String,
    /// The port the host reached (the discovery log describes it).
    port: Listener,
    /// Bytes received so far, and when `tick` last saw that count change (or the connection
    /// open): a host that leaves a PDU half sent, or never sends its ICReq, is found by it.
    received: u64,
    progress: Option<(u64, Instant)>,
    /// When `tick` first saw the connection.
    opened: Option<Instant>,
}

/// A connection that has not sent its ICReq this long after it opened is closed (a port
/// scanner, a stuck host): it holds buffers another host could use.
pub const ICREQ_TIMEOUT: Duration = Duration::from_secs(10);
/// A PDU left half received this long is a stalled host: the connection is closed. The Keep
/// Alive timeout the host set on its admin queue, where known, else this.
pub const STALL_TIMEOUT: Duration = Duration::from_secs(15);

impl std::fmt::Debug for Connection {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Connection")
            .field("peer", &self.peer)
            .field("phase", &self.phase)
            .field("in_flight", &self.in_flight)
            .finish()
    }
}

impl Connection {
    /// A new connection from `peer` (for logs), waiting for its ICReq.
    pub fn new(
        subsystem: Arc<SubsystemInfo>,
        registry: Arc<Registry>,
        limits: ConnectionLimits,
        peer: String,
    ) -> Connection {
        // What the connection keeps whole: a header with its digest, padding up to the
        // largest PDO, in-capsule data for itself (Connect, ranges) and its digest.
        let own_data = (subsystem.in_capsule_bytes as usize).max(1024);
        let rx_capacity = pdu::MAX_HEADER + 256 + own_data + DIGEST;
        let entries = subsystem.queue_entries as usize;
        let tx_capacity = TX_HIGH_WATER + TX_PER_PDU + entries * TX_PER_COMMAND;
        let port = subsystem.listeners.first().cloned().unwrap_or(Listener {
            address: std::net::SocketAddr::from(([0, 0, 0, 0], 0)),
            port_id: 1,
        });
        Connection {
            port,
            phase: Phase::AwaitIcReq,
            digests: Digests::default(),
            host_alignment: 0,
            sq_entries: 0,
            sq_taken: 0,
            sq_flow: true,
            role: Role::None,
            slots: vec![Slot::default(); entries].into_boxed_slice(),
            subsystem,
            registry,
            limits,
            rx: vec![0; rx_capacity].into_boxed_slice(),
            rx_start: 0,
            rx_end: 0,
            rx_state: RxState::Header,
            quiet: 0,
            r2t_open: 0,
            copied: 0,
            tx: Vec::with_capacity(tx_capacity),
            // a data segment and the bytes after it per command, and a few more
            segments: VecDeque::with_capacity(2 * entries + 8),
            segment_sent: 0,
            tx_pending: 0,
            in_flight: 0,
            admin_data: vec![0; admin::MAX_ADMIN_DATA].into_boxed_slice(),
            closed: None,
            peer,
            received: 0,
            progress: None,
            opened: None,
        }
    }

    /// The connection came in on `port`, at its address (the connection's local one).
    pub fn on_port(mut self, port: Listener) -> Connection {
        self.port = port;
        self
    }

    /// Whether anything waits to be sent.
    pub fn has_outgoing(&self) -> bool {
        !self.segments.is_empty()
    }

    /// The transmit buffer's capacity and its segment queue's: preallocated, and they must
    /// not grow (tests check).
    pub fn tx_capacity(&self) -> (usize, usize) {
        (self.tx.capacity(), self.segments.capacity())
    }

    /// Data bytes that were copied from the header buffer into a DMA buffer because they had
    /// been read ahead with a header (0 while the host sends only data PDUs).
    pub fn copied(&self) -> u64 {
        self.copied
    }

    /// Why the connection is over, once it is and everything queued was sent and every
    /// command drained: the caller then closes the socket and drops the connection.
    pub fn finished(&self) -> Option<&str> {
        let drained = self.in_flight_submitted() == 0 && self.segments.is_empty();
        match &self.closed {
            Some(why) if drained => Some(why),
            _ => None,
        }
    }

    /// Commands handed to the backend whose completion has not come back yet.
    pub fn in_flight_submitted(&self) -> usize {
        self.slots
            .iter()
            .filter(|s| s.busy && s.submitted && !s.sending)
            .count()
    }

    /// The host went away (connection reset, EOF): nothing more is sent; what the backend
    /// holds is drained as it completes.
    pub fn peer_gone(&mut self, why: &str, backend: &mut dyn Backend) {
        self.close(why.to_string(), backend);
        while let Some(segment) = self.segments.pop_front() {
            if let Segment::Data { token, .. } = segment {
                self.data_sent(token, backend);
            }
        }
        self.tx.clear();
        self.segment_sent = 0;
        self.tx_pending = 0;
    }

    /// Feeds bytes from memory (tests, the fuzzer); returns how many were taken (fewer than
    /// given only when the connection stopped reading).
    pub fn receive(&mut self, input: &[u8], backend: &mut dyn Backend) -> usize {
        let mut rest = input;
        // (at least once: PDUs already received may wait for the responses to drain)
        loop {
            match self.receive_from(&mut rest, backend) {
                Ok(Receive::Drained) if !rest.is_empty() => continue,
                _ => break,
            }
        }
        input.len() - rest.len()
    }

    /// Reads from `src` and acts on what came, until it has nothing more now, ends, or the
    /// connection stops reading. Write data goes straight into the commands' buffers.
    pub fn receive_from<R: ReadWire + ?Sized>(
        &mut self,
        src: &mut R,
        backend: &mut dyn Backend,
    ) -> io::Result<Receive> {
        let mut taken = 0;
        loop {
            if self.phase == Phase::Closing || self.tx_pending > TX_HIGH_WATER {
                return Ok(Receive::Paused);
            }
            let need = match self.step(backend) {
                Ok(None) => continue, // progress; more may be done with what is here
                Ok(Some(need)) => need,
                Err(e) => {
                    self.terminate(e, backend);
                    continue;
                }
            };
            if taken >= READ_BUDGET {
                return Ok(Receive::Drained);
            }
            let read = match self.read(src, need, backend) {
                Ok(0) => return Ok(Receive::Ended),
                Ok(n) => n,
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => return Ok(Receive::Drained),
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                Err(e) => return Err(e),
            };
            taken += read;
            self.received += read as u64;
        }
    }

    /// One read from `src`: into the receive buffer, or (receiving a transfer) into the
    /// command's buffer and, after it, into the receive buffer the data digest and the next
    /// header. Counts what went where.
    fn read<R: ReadWire + ?Sized>(
        &mut self,
        src: &mut R,
        need: Need,
        backend: &mut dyn Backend,
    ) -> io::Result<usize> {
        let hdgst = if self.digests.header { DIGEST } else { 0 };
        // one header ahead: a short one while R2T data is expected, else a command capsule's
        let peek = hdgst
            + if self.r2t_open > 0 {
                SHORT_HEADER
            } else {
                CAPSULE_CMD_HEADER
            };
        let have = self.rx_end - self.rx_start;
        let mut want = match need {
            Need::Header => peek.saturating_sub(have).max(1),
            Need::Exact(n) => n,
            Need::ThenHeader(n) => n + peek,
        };
        if let RxState::Data(t) = self.rx_state {
            want = if t.digest { DIGEST } else { 0 } + peek;
        } else if self.quiet >= QUIET_BEFORE_READ_AHEAD && self.r2t_open == 0 {
            want = self.rx.len(); // as much as fits: reads only, lately
        }
        let transfer = match self.rx_state {
            RxState::Data(t) if t.done < t.len => Some(t),
            _ => None,
        };
        let data = match transfer {
            None => None,
            Some(t) => Some(
                backend
                    .buffer(t.token)
                    .and_then(|b| b.subslice(t.offset + t.done, t.len - t.done).ok())
                    .ok_or_else(|| io::Error::other("a transfer without its buffer"))?,
            ),
        };
        let (n, into_data) = wire::read_into(
            src,
            &mut self.rx,
            (&mut self.rx_start, &mut self.rx_end),
            want,
            data,
        )?;
        if let RxState::Data(t) = &mut self.rx_state {
            t.done += into_data;
        }
        Ok(n)
    }

    /// Acts on what the receive buffer holds: None when something was done (call again),
    /// else what is needed to go on.
    fn step(&mut self, backend: &mut dyn Backend) -> Result<Option<Need>, FatalError> {
        let have = self.rx_end - self.rx_start;
        match self.rx_state {
            RxState::Header => {
                if have < COMMON_HEADER {
                    return Ok(Some(Need::Header));
                }
                let b = self.rx_start;
                let common: &[u8; COMMON_HEADER] = self.rx[b..b + COMMON_HEADER]
                    .try_into()
                    .map_err(|_| FatalError::Sequence("short header"))?;
                let header = CommonHeader::parse(common, RECEIVED)?;
                let layout = header.layout(&self.limits_now())?;
                match (self.phase, header.pdu_type) {
                    (Phase::AwaitIcReq, PduType::IcReq) => {}
                    (Phase::AwaitIcReq, _) => {
                        return Err(FatalError::Sequence("ICReq expected first"))
                    }
                    (_, PduType::IcReq) => return Err(FatalError::Sequence("a second ICReq")),
                    _ => {}
                }
                let head = layout.header_bytes + layout.pad;
                if have < head {
                    return Ok(Some(Need::Exact(head - have)));
                }
                let hlen = header.pdu_type.header_len();
                if layout.header_bytes > hlen {
                    pdu::check_header_digest(&self.rx[b..b + layout.header_bytes], hlen)?;
                }
                self.rx_state = match self.transfer(&header, &layout, backend)? {
                    Some(t) => {
                        self.quiet = 0;
                        RxState::Data(t)
                    }
                    None => {
                        if header.plen as usize > self.rx.len() {
                            return Err(FatalError::DataLimitExceeded(
                                "PDU longer than advertised",
                            ));
                        }
                        RxState::Whole(header, layout)
                    }
                };
                Ok(None)
            }
            RxState::Whole(header, layout) => {
                let plen = header.plen as usize;
                if have < plen {
                    return Ok(Some(Need::ThenHeader(plen - have)));
                }
                self.on_pdu(&header, &layout, backend)?;
                if self.phase != Phase::Closing {
                    self.rx_start += plen;
                    self.rx_state = RxState::Header;
                    self.quiet = self.quiet.saturating_add(1);
                }
                Ok(None)
            }
            RxState::Data(mut t) => {
                let own = self.rx_start + t.head; // the receive buffer past the header
                if t.done < t.len {
                    let ahead = self.rx_end - own;
                    if ahead == 0 {
                        return Ok(Some(Need::Exact(t.len - t.done)));
                    }
                    // data read ahead with the header: copy it over
                    let k = ahead.min(t.len - t.done);
                    let into = backend
                        .buffer(t.token)
                        .and_then(|b| b.subslice(t.offset + t.done, k).ok())
                        .ok_or(FatalError::Sequence("a transfer without its buffer"))?;
                    into.copy_from(&self.rx[own..own + k]);
                    self.rx.copy_within(own + k..self.rx_end, own);
                    self.rx_end -= k;
                    t.done += k;
                    self.copied += k as u64;
                    self.rx_state = RxState::Data(t);
                    return Ok(None);
                }
                let digest = if t.digest { DIGEST } else { 0 };
                if self.rx_end - own < digest {
                    return Ok(Some(Need::ThenHeader(digest - (self.rx_end - own))));
                }
                if t.digest {
                    let got = u32::from_le_bytes([
                        self.rx[own],
                        self.rx[own + 1],
                        self.rx[own + 2],
                        self.rx[own + 3],
                    ]);
                    let data = backend
                        .buffer(t.token)
                        .and_then(|b| b.subslice(t.offset, t.len).ok())
                        .ok_or(FatalError::Sequence("a transfer without its buffer"))?;
                    if pdu::crc32c_volatile(&data) != got {
                        // A data digest error fails the command, not the connection (NVMe/TCP
                        // 3.6.1.3): here it ends the connection too, which the host recovers
                        // from by reconnecting.
                        return Err(FatalError::field(0, "data digest"));
                    }
                }
                self.rx_start = own + digest;
                self.rx_state = RxState::Header;
                self.transfer_done(t, backend);
                Ok(None)
            }
        }
    }

    fn limits_now(&self) -> Limits {
        Limits {
            digests: (self.phase != Phase::AwaitIcReq).then_some(self.digests),
            max_data: self
                .subsystem
                .in_capsule_bytes
                .max(self.limits.maxh2cdata)
                .max(1024),
            alignment: 0,
        }
    }

    /// Whether the data of the PDU whose header was just read goes straight into a command's
    /// buffer: an I/O queue's Write with in-capsule data (a slot and buffer are taken for it
    /// here) or an H2CData. Everything else, and a Write that fails its checks (answered once
    /// the whole PDU is in), is kept whole.
    fn transfer(
        &mut self,
        header: &CommonHeader,
        layout: &Layout,
        backend: &mut dyn Backend,
    ) -> Result<Option<Transfer>, FatalError> {
        let b = self.rx_start;
        let head = layout.header_bytes + layout.pad;
        match header.pdu_type {
            PduType::H2CData => {
                let (d, last) = self.check_h2c_data(layout.data)?;
                Ok(Some(Transfer {
                    token: d.ttag,
                    offset: d.offset as usize,
                    len: layout.data,
                    done: 0,
                    head,
                    digest: layout.data_digest,
                    last: Some(last),
                }))
            }
            PduType::CapsuleCmd if layout.data > 0 && matches!(self.role, Role::Io { .. }) => {
                let sqe = self.sqe_at(b)?;
                let (opcode, sgl_type, sgl_len) = capsule_fields(&sqe);
                if sqe.cdw0 as u8 != WRITE {
                    return Ok(None);
                }
                self.check_in_capsule(opcode, sgl_type, sgl_len, layout.data)?;
                let token = self.free_slot()?;
                let checked = self.check_io(&sqe, opcode, sgl_type, sgl_len, layout.data);
                let Ok((ns, op, offset, len)) = checked else {
                    return Ok(None);
                };
                if !backend.reserve(token, len as usize) {
                    return Ok(None);
                }
                self.occupy(token, (sqe.cdw0 >> 16) as u16, ns, op, offset, len);
                Ok(Some(Transfer {
                    token,
                    offset: 0,
                    len: layout.data,
                    done: 0,
                    head,
                    digest: layout.data_digest,
                    last: None,
                }))
            }
            _ => Ok(None),
        }
    }

    /// All of a transfer's data is in its command's buffer (and its digest checked).
    fn transfer_done(&mut self, t: Transfer, backend: &mut dyn Backend) {
        let Some(slot) = self.slots.get_mut(t.token as usize) else {
            return;
        };
        slot.received = (t.offset + t.len) as u32;
        match t.last {
            Some(false) => {}
            Some(true) => {
                self.r2t_open = self.r2t_open.saturating_sub(1);
                self.submit(t.token, backend);
            }
            None => self.submit(t.token, backend),
        }
    }

    fn sqe_at(&self, b: usize) -> Result<Sqe, FatalError> {
        let sqe_bytes: &[u8; 64] = self.rx[b + 8..b + 72]
            .try_into()
            .map_err(|_| FatalError::field(2, "HLEN"))?;
        Ok(Sqe::from_bytes(sqe_bytes))
    }

    /// In-capsule data must be what the command's SGL describes, and fit IOCCSZ.
    fn check_in_capsule(
        &self,
        opcode: u8,
        sgl_type: u8,
        sgl_len: u32,
        data_len: usize,
    ) -> Result<(), FatalError> {
        if data_len > 0 && (sgl_type != SGL_IN_CAPSULE || sgl_len as usize != data_len) {
            return Err(FatalError::DataOutOfRange(
                "in-capsule data does not match the SGL",
            ));
        }
        if data_len > self.subsystem.in_capsule_bytes as usize && opcode != FABRICS {
            return Err(FatalError::DataLimitExceeded(
                "in-capsule data beyond IOCCSZ",
            ));
        }
        Ok(())
    }

    /// A whole PDU kept in the receive buffer (from `rx_start`).
    fn on_pdu(
        &mut self,
        header: &CommonHeader,
        layout: &Layout,
        backend: &mut dyn Backend,
    ) -> Result<(), FatalError> {
        let b = self.rx_start;
        let data_at = b + layout.header_bytes + layout.pad;
        let data_end = data_at + layout.data;
        if layout.data_digest {
            let want = pdu::crc32c(&self.rx[data_at..data_end]);
            let got = self.rx[data_end..data_end + DIGEST]
                .try_into()
                .map(u32::from_le_bytes)
                .map_err(|_| FatalError::Sequence("short data digest"))?;
            if want != got {
                return Err(FatalError::field(0, "data digest"));
            }
        }
        match header.pdu_type {
            PduType::IcReq => self.on_ic_req(),
            PduType::H2CTermReq => {
                let plen = header.plen as usize;
                let (fes, fei) = pdu::parse_term_req(&self.rx[b..b + plen]).unwrap_or((0, 0));
                self.close(
                    format!("the host terminated the connection (FES {fes}, FEI {fei})"),
                    backend,
                );
                Ok(())
            }
            PduType::CapsuleCmd => self.on_capsule(data_at..data_end, backend),
            _ => Err(FatalError::field(0, "PDU-Type")),
        }
    }

    fn on_ic_req(&mut self) -> Result<(), FatalError> {
        let req = IcReq::parse(&self.rx[self.rx_start..self.rx_end])?;
        self.digests = req.digests;
        self.host_alignment = req.hpda;
        self.phase = Phase::Ready;
        let resp = IcResp {
            pfv: PFV_1_0,
            cpda: 0,
            digests: req.digests,
            maxh2cdata: self.limits.maxh2cdata,
        };
        self.push_bytes(&resp.encode());
        Ok(())
    }

    /// A command capsule whose in-capsule data (if any) is at `data` in the receive buffer.
    fn on_capsule(
        &mut self,
        data: std::ops::Range<usize>,
        backend: &mut dyn Backend,
    ) -> Result<(), FatalError> {
        let sqe = self.sqe_at(self.rx_start)?;
        self.sq_taken = self.sq_taken.wrapping_add(1);
        let cid = (sqe.cdw0 >> 16) as u16;
        let (opcode, sgl_type, sgl_len) = capsule_fields(&sqe);
        self.check_in_capsule(opcode, sgl_type, sgl_len, data.len())?;
        if opcode == FABRICS {
            return self.on_fabrics(&sqe, cid, data, backend);
        }
        match &self.role {
            Role::None => {
                self.respond(cid, 0, Status::COMMAND_SEQUENCE_ERROR);
                Ok(())
            }
            Role::Admin { .. } => {
                self.on_admin(&sqe, cid, opcode, backend);
                Ok(())
            }
            Role::Io { .. } => self.on_io(&sqe, cid, opcode, sgl_type, sgl_len, data, backend),
        }
    }

    fn on_fabrics(
        &mut self,
        sqe: &Sqe,
        cid: u16,
        data: std::ops::Range<usize>,
        backend: &mut dyn Backend,
    ) -> Result<(), FatalError> {
        let command = match FabricsCommand::from_sqe(sqe) {
            Ok(c) => c,
            Err(status) => {
                self.respond(cid, 0, status);
                return Ok(());
            }
        };
        match command {
            FabricsCommand::Connect(connect) => {
                let parsed = ConnectData::parse(&self.rx[data]);
                let result = match parsed {
                    Ok(d) => self.connect(&connect, &d),
                    Err(status) => Err(status),
                };
                match result {
                    Ok(cntlid) => self.respond(cid, u32::from(cntlid), Status::SUCCESS),
                    Err(status) => self.respond(cid, 0, status),
                }
            }
            FabricsCommand::PropertyGet {
                offset,
                eight_bytes,
            } => {
                let value = match &self.role {
                    Role::Admin { registers, .. } => registers.property_get(offset, eight_bytes),
                    _ => Err(Status::COMMAND_SEQUENCE_ERROR),
                };
                match value {
                    Ok(v) => self.respond64(cid, v, Status::SUCCESS),
                    Err(status) => self.respond(cid, 0, status),
                }
            }
            FabricsCommand::PropertySet {
                offset,
                eight_bytes,
                value,
            } => {
                let result = match &mut self.role {
                    Role::Admin {
                        registers,
                        controller,
                        ..
                    } => {
                        let r = registers.property_set(offset, eight_bytes, value);
                        controller.set_ready(registers.ready());
                        r
                    }
                    _ => Err(Status::COMMAND_SEQUENCE_ERROR),
                };
                let status = result.err().unwrap_or(Status::SUCCESS);
                self.respond(cid, 0, status);
                if self.shutting_down() {
                    self.complete_events(Status::ABORT_REQUESTED);
                    self.flush_for_shutdown(backend);
                }
            }
            FabricsCommand::Disconnect => {
                self.respond(cid, 0, Status::SUCCESS);
                self.close("the host disconnected".into(), backend);
            }
        }
        Ok(())
    }

    fn shutting_down(&self) -> bool {
        matches!(&self.role, Role::Admin { registers, .. } if registers.shutdown_requested())
    }

    /// A shutdown (CC.SHN) flushes the drives' volatile write caches: a Flush to every
    /// exported namespace, as one command of this queue's (its parts count down as for a
    /// Dataset Management); CSTS.SHST reports shutdown complete when all are done.
    fn flush_for_shutdown(&mut self, backend: &mut dyn Backend) {
        let Role::Admin {
            registers,
            controller,
            ..
        } = &mut self.role
        else {
            return;
        };
        let started = self.slots.iter().any(|s| s.busy && s.shutdown_flush);
        if !registers.shutting_down() || started {
            return;
        }
        let count = self.subsystem.namespaces.len();
        let token = self.slots.iter().position(|s| !s.busy);
        let (Some(token), false, 1..) = (token, controller.discovery(), count) else {
            registers.shutdown_complete(); // nothing to flush (or no slot: cannot happen)
            return;
        };
        self.slots[token] = Slot {
            busy: true,
            op: Some(Op::Flush),
            submitted: true,
            pending: count as u16,
            shutdown_flush: true,
            ..Slot::default()
        };
        self.in_flight += 1;
        for ns in 0..count {
            if let Err(status) = backend.submit(token as u16, ns, Op::Flush, 0, 0) {
                // the parts not submitted will not complete: count them now
                let s = &mut self.slots[token];
                s.failed = s.failed.or(Some(status));
                s.pending -= (count - ns) as u16;
                if s.pending == 0 {
                    self.finish(token as u16, status, backend);
                }
                return;
            }
        }
    }

    /// Checks a Connect and makes this connection an admin or I/O queue; the controller ID.
    fn connect(
        &mut self,
        connect: &admin::ConnectCommand,
        data: &ConnectData,
    ) -> Result<u16, Status> {
        if !matches!(self.role, Role::None) {
            return Err(Status::COMMAND_SEQUENCE_ERROR);
        }
        let discovery = data.subnqn == super::DISCOVERY_NQN;
        if !discovery && data.subnqn != self.subsystem.nqn {
            log::warn!(
                "{}: Connect to unknown subsystem {:?} refused",
                self.peer,
                data.subnqn
            );
            return Err(Status::CONNECT_INVALID_PARAMETERS);
        }
        if !self.registry.host_allowed(&data.hostnqn) {
            log::warn!(
                "{}: host {} is not allowed (--allow-host): Connect refused",
                self.peer,
                data.hostnqn
            );
            return Err(Status::CONNECT_INVALID_HOST);
        }
        let entries = u32::from(connect.sqsize) + 1;
        if connect.sqsize == 0 || entries > u32::from(self.subsystem.queue_entries) {
            return Err(Status::CONNECT_INVALID_PARAMETERS);
        }
        // (set before the Connect's own response, which reports the head past it)
        self.sq_entries = entries;
        self.sq_flow = connect.cattr & CATTR_DISABLE_SQ_FLOW == 0;
        if connect.qid == 0 {
            if data.cntlid != 0xffff {
                return Err(Status::CONNECT_INVALID_PARAMETERS);
            }
            let controller = self.registry.create(&data.hostnqn, discovery)?;
            let cntlid = controller.cntlid();
            let mut features = Features::new(&self.subsystem);
            features.set_keep_alive_ms(connect.kato);
            self.role = Role::Admin {
                controller,
                features,
                registers: admin::ControllerRegisters::new(&self.subsystem, discovery),
                events: Vec::with_capacity(admin::ASYNC_EVENT_LIMIT),
                smart_waiting: Vec::with_capacity(SMART_WAITING),
                last_keep_alive: Instant::now(),
            };
            log::info!(
                "{}: host {} connected (controller {cntlid}{})",
                self.peer,
                data.hostnqn,
                if discovery { ", discovery" } else { "" }
            );
            return Ok(cntlid);
        }
        let controller = self
            .registry
            .find(data.cntlid, &data.hostnqn)
            .ok_or(Status::CONNECT_INVALID_PARAMETERS)?;
        if controller.discovery() || !controller.ready() || connect.qid > self.subsystem.io_queues {
            return Err(Status::CONNECT_INVALID_PARAMETERS);
        }
        let cntlid = controller.cntlid();
        self.role = Role::Io {
            controller,
            qid: connect.qid,
        };
        Ok(cntlid)
    }

    fn on_admin(&mut self, sqe: &Sqe, cid: u16, opcode: u8, backend: &mut dyn Backend) {
        let Role::Admin {
            controller,
            features,
            registers,
            events,
            smart_waiting,
            last_keep_alive,
        } = &mut self.role
        else {
            return;
        };
        // Until the host enables the controller (CC.EN, then CSTS.RDY) only Fabrics commands
        // are served.
        if !registers.ready() {
            self.respond(cid, 0, Status::COMMAND_SEQUENCE_ERROR);
            return;
        }
        let cntlid = controller.cntlid();
        // Any admin command shows the host is there (the Keep Alive timer is traffic based);
        // the association ends only after twice KATO without one, so a host that sends its
        // Keep Alive every KATO is never cut off by scheduling jitter.
        *last_keep_alive = Instant::now();
        // SMART comes from the drives, which take milliseconds: the command waits for the
        // backend's answer (see `poll_smart`) while the reactor serves everything else.
        let mut wants_smart = false;
        let result: Result<(u32, usize), Status> = match opcode {
            KEEP_ALIVE => Ok((0, 0)),
            ASYNC_EVENT_REQUEST => {
                if events.len() >= admin::ASYNC_EVENT_LIMIT {
                    Err(Status::AER_LIMIT_EXCEEDED)
                } else {
                    events.push(cid); // (preallocated: ASYNC_EVENT_LIMIT entries)
                    return; // held until an event, or the controller goes away
                }
            }
            _ => admin::execute(
                &self.subsystem,
                cntlid,
                discovery_asker(&self.port, &self.registry, controller),
                features,
                sqe,
                &mut || {
                    wants_smart = true;
                    SmartLog::zeroed()
                },
                &mut self.admin_data,
            ),
        };
        if wants_smart && result.is_ok() {
            // (the command passed every check; its answer is built again with the drives')
            let refused = smart_waiting.is_empty() && !backend.smart_request();
            if refused || smart_waiting.len() >= SMART_WAITING {
                self.respond(cid, 0, Status::NAMESPACE_NOT_READY); // busy: the host retries
            } else {
                smart_waiting.push(*sqe);
            }
            return;
        }
        self.answer_admin(cid, sqe, result);
    }

    /// Sends an admin command's answer built in the admin buffer, or its status.
    fn answer_admin(&mut self, cid: u16, sqe: &Sqe, result: Result<(u32, usize), Status>) {
        match result {
            Ok((dw0, 0)) => self.respond(cid, dw0, Status::SUCCESS),
            Ok((dw0, len)) => {
                let asked = sqe.prp2 as u32 as usize; // the transport SGL's length
                self.send_admin_data(cid, len.min(asked));
                self.respond(cid, dw0, Status::SUCCESS);
            }
            Err(status) => self.respond(cid, 0, status),
        }
    }

    /// Answers the SMART Get Log Page commands waiting, once the drives' answer is there.
    fn poll_smart(&mut self, backend: &mut dyn Backend) {
        let Role::Admin { smart_waiting, .. } = &self.role else {
            return;
        };
        if smart_waiting.is_empty() || self.closed.is_some() {
            return;
        }
        let Some(log) = backend.smart_answer() else {
            return;
        };
        while let Role::Admin {
            smart_waiting,
            features,
            controller,
            ..
        } = &mut self.role
        {
            let Some(sqe) = smart_waiting.pop() else {
                break;
            };
            let cntlid = controller.cntlid();
            let result = admin::execute(
                &self.subsystem,
                cntlid,
                discovery_asker(&self.port, &self.registry, controller),
                features,
                &sqe,
                &mut || log,
                &mut self.admin_data,
            );
            self.answer_admin(sqe.cid(), &sqe, result);
        }
    }

    #[allow(clippy::too_many_arguments)]
    fn on_io(
        &mut self,
        sqe: &Sqe,
        cid: u16,
        opcode: u8,
        sgl_type: u8,
        sgl_len: u32,
        data: std::ops::Range<usize>,
        backend: &mut dyn Backend,
    ) -> Result<(), FatalError> {
        let token = self.free_slot()?;
        let checked = self.check_io(sqe, opcode, sgl_type, sgl_len, data.len());
        let (ns, op, offset, len) = match checked {
            Ok(c) => c,
            Err(status) => {
                self.respond(cid, 0, status);
                return Ok(());
            }
        };
        if opcode == DATASET_MANAGEMENT {
            self.deallocate(sqe, cid, token, ns, data, backend);
            return Ok(());
        }
        if op.has_data() && !backend.reserve(token, len as usize) {
            self.respond(cid, 0, Status::NAMESPACE_NOT_READY);
            return Ok(());
        }
        self.occupy(token, cid, ns, op, offset, len);
        if op == Op::Write {
            if data.is_empty() {
                // ask for all of it at once; the host sends it in PDUs of MAXH2CDATA at most
                let r2t = DataHeader {
                    cccid: cid,
                    ttag: token,
                    offset: 0,
                    length: len,
                };
                self.push_bytes(OutHeader::r2t(&r2t, self.digests).as_slice());
                self.r2t_open += 1;
                return Ok(());
            }
            // In-capsule data normally goes straight into the buffer (see `transfer`); it is
            // here only when the buffer could not be had then but can now.
            let copied = backend
                .buffer(token)
                .and_then(|b| b.subslice(0, data.len()).ok())
                .map(|b| b.copy_from(&self.rx[data.clone()]));
            if copied.is_none() {
                self.finish(token, Status::INTERNAL_ERROR, backend);
                return Ok(());
            }
            self.copied += data.len() as u64;
            self.slots[token as usize].received = len;
        }
        self.submit(token, backend);
        Ok(())
    }

    /// A free command slot; none means the host broke SQ flow control.
    fn free_slot(&self) -> Result<u16, FatalError> {
        let token = self
            .slots
            .iter()
            .position(|s| !s.busy)
            .ok_or(FatalError::Sequence(
                "more commands in flight than queue entries",
            ))?;
        Ok(token as u16)
    }

    /// Takes slot `token` for a command with one part.
    fn occupy(&mut self, token: u16, cid: u16, ns: usize, op: Op, offset: u64, len: u32) {
        self.slots[token as usize] = Slot {
            busy: true,
            cid,
            ns,
            op: Some(op),
            offset,
            len,
            pending: 1,
            ..Slot::default()
        };
        self.in_flight += 1;
    }

    /// The namespace index, op, byte offset and length of an I/O command, or its status.
    fn check_io(
        &self,
        sqe: &Sqe,
        opcode: u8,
        sgl_type: u8,
        sgl_len: u32,
        in_capsule: usize,
    ) -> Result<(usize, Op, u64, u32), Status> {
        let ns = self
            .subsystem
            .namespaces
            .iter()
            .position(|n| n.nsid == sqe.nsid)
            .ok_or(Status::INVALID_NAMESPACE)?;
        let info = &self.subsystem.namespaces[ns];
        let bs = u64::from(info.block_size);
        let slba = u64::from(sqe.cdw10) | (u64::from(sqe.cdw11) << 32);
        let blocks = u64::from(sqe.cdw12 & 0xffff) + 1;
        let (op, moves_data) = match opcode {
            READ => (Op::Read, true),
            WRITE => (Op::Write, true),
            FLUSH => return Ok((ns, Op::Flush, 0, 0)),
            WRITE_ZEROES => (Op::WriteZeroes, false),
            DATASET_MANAGEMENT => return Ok((ns, Op::Deallocate, 0, 0)), // see `deallocate`
            _ => return Err(Status::INVALID_OPCODE),
        };
        if slba.checked_add(blocks).is_none_or(|end| end > info.blocks) {
            return Err(Status::LBA_OUT_OF_RANGE);
        }
        let len = blocks * bs;
        if moves_data {
            if len > u64::from(self.subsystem.max_transfer) {
                return Err(Status::INVALID_FIELD);
            }
            let expected_sgl = if in_capsule > 0 {
                SGL_IN_CAPSULE
            } else {
                SGL_TRANSPORT
            };
            if sgl_type != expected_sgl || u64::from(sgl_len) != len {
                return Err(Status::DATA_SGL_LENGTH_INVALID);
            }
            if op == Op::Read && in_capsule > 0 {
                return Err(Status::INVALID_FIELD);
            }
        }
        Ok((ns, op, slba * bs, len as u32))
    }

    /// Dataset Management: with the Deallocate attribute, each range (in the capsule, 16 bytes
    /// each: attributes, block count, starting LBA) becomes a deallocate on the namespace;
    /// without it the command is a hint, done at once.
    fn deallocate(
        &mut self,
        sqe: &Sqe,
        cid: u16,
        token: u16,
        ns: usize,
        data: std::ops::Range<usize>,
        backend: &mut dyn Backend,
    ) {
        let ranges = (sqe.cdw10 & 0xff) as usize + 1;
        if sqe.cdw11 & usnvme_driver::spec::command::DSM_DEALLOCATE == 0 {
            self.respond(cid, 0, Status::SUCCESS);
            return;
        }
        if data.len() != ranges * 16 {
            self.respond(cid, 0, Status::DATA_SGL_LENGTH_INVALID);
            return;
        }
        let info = &self.subsystem.namespaces[ns];
        let (bs, size) = (u64::from(info.block_size), info.blocks);
        // Each range as (byte offset, bytes); empty ranges are skipped. Checked in a first
        // pass, so that a bad range fails the command before any part of it ran.
        let range = |r: &[u8]| {
            let blocks = u64::from(u32::from_le_bytes([r[4], r[5], r[6], r[7]]));
            let slba = u64::from_le_bytes([r[8], r[9], r[10], r[11], r[12], r[13], r[14], r[15]]);
            (slba, blocks)
        };
        let mut count = 0u16;
        for r in self.rx[data.clone()].chunks_exact(16) {
            let (slba, blocks) = range(r);
            if slba.checked_add(blocks).is_none_or(|end| end > size) {
                self.respond(cid, 0, Status::LBA_OUT_OF_RANGE);
                return;
            }
            count += u16::from(blocks > 0);
        }
        if count == 0 {
            self.respond(cid, 0, Status::SUCCESS);
            return;
        }
        self.slots[token as usize] = Slot {
            busy: true,
            cid,
            ns,
            op: Some(Op::Deallocate),
            submitted: true,
            pending: count,
            ..Slot::default()
        };
        self.in_flight += 1;
        let mut left = count;
        for at in (data.start..data.end).step_by(16) {
            let (slba, blocks) = range(&self.rx[at..at + 16]);
            if blocks == 0 {
                continue;
            }
            if let Err(status) = backend.submit(token, ns, Op::Deallocate, slba * bs, blocks * bs) {
                // the parts not submitted will not complete: count them as failed now
                let s = &mut self.slots[token as usize];
                s.failed = s.failed.or(Some(status));
                s.pending -= left;
                if s.pending == 0 {
                    self.finish(token, status, backend);
                }
                return;
            }
            left -= 1;
        }
    }

    fn submit(&mut self, token: u16, backend: &mut dyn Backend) {
        let s = self.slots[token as usize];
        let Some(op) = s.op else {
            return;
        };
        match backend.submit(token, s.ns, op, s.offset, u64::from(s.len)) {
            Ok(()) => self.slots[token as usize].submitted = true,
            Err(status) => self.finish(token, status, backend),
        }
    }

    /// Checks an H2CData header (at `rx_start`) against the transfer it belongs to: the
    /// header and whether it is the transfer's last PDU.
    fn check_h2c_data(&self, data_len: usize) -> Result<(DataHeader, bool), FatalError> {
        let b = self.rx_start;
        let d = DataHeader::parse(&self.rx[b..self.rx_end])?;
        let slot = self
            .slots
            .get(d.ttag as usize)
            .copied()
            .filter(|s| s.busy && s.cid == d.cccid && s.op == Some(Op::Write) && !s.submitted)
            .ok_or(FatalError::field(10, "TTAG"))?;
        if d.length as usize != data_len {
            return Err(FatalError::field(16, "DATAL"));
        }
        if d.offset != slot.received {
            return Err(FatalError::DataOutOfRange("H2CData not at the next offset"));
        }
        let end = d.offset.checked_add(d.length).filter(|&e| e <= slot.len);
        let Some(end) = end else {
            return Err(FatalError::DataOutOfRange("H2CData beyond the transfer"));
        };
        let last = self.rx[b + 1] & flags::LAST_PDU != 0;
        if last != (end == slot.len) {
            return Err(FatalError::field(1, "FLAGS (LAST_PDU)"));
        }
        Ok((d, last))
    }

    /// A command handed to the backend finished.
    pub fn complete(&mut self, token: u16, result: Result<(), Status>, backend: &mut dyn Backend) {
        let Some(slot) = self.slots.get(token as usize).copied() else {
            return;
        };
        if !slot.busy || !slot.submitted || slot.sending {
            return;
        }
        let failed = slot.failed.or(result.err());
        if slot.pending > 1 {
            let s = &mut self.slots[token as usize];
            s.pending -= 1;
            s.failed = failed;
            return;
        }
        let status = failed.unwrap_or(Status::SUCCESS);
        if status.is_success() && slot.op == Some(Op::Read) && self.closed.is_none() {
            // the data goes from the buffer, which is released once it is sent; without SQ
            // flow control its C2HData ends the command (SUCCESS), no response capsule
            let success = !self.sq_flow;
            self.send_read_data(token, slot.cid, slot.len as usize, success, backend);
            self.slots[token as usize].sending = true;
            if !success {
                self.respond(slot.cid, 0, status);
            }
            return;
        }
        self.finish(token, status, backend);
    }

    /// Frees the slot and answers the command.
    fn finish(&mut self, token: u16, status: Status, backend: &mut dyn Backend) {
        let slot = self.slots[token as usize];
        if slot.op.is_some_and(Op::has_data) {
            backend.release(token);
        }
        self.slots[token as usize] = Slot::default();
        self.in_flight -= 1;
        if slot.shutdown_flush {
            // no command of the host's: the shutdown it asked for is complete
            if !status.is_success() {
                log::warn!(
                    "{}: flushing the drives for a shutdown failed: {status}",
                    self.peer
                );
            }
            if let Role::Admin { registers, .. } = &mut self.role {
                registers.shutdown_complete();
            }
            return;
        }
        if self.closed.is_none() {
            self.respond(slot.cid, 0, status);
        }
    }

    /// A read's data was sent (or will never be): its buffer and slot are free.
    fn data_sent(&mut self, token: u16, backend: &mut dyn Backend) {
        if self.slots.get(token as usize).is_some_and(|s| s.sending) {
            backend.release(token);
            self.slots[token as usize] = Slot::default();
            self.in_flight -= 1;
        }
    }

    /// Sends the first `len` bytes of the admin buffer to the host, copied into the transmit
    /// buffer (admin data is small and not DMA data).
    fn send_admin_data(&mut self, cid: u16, len: usize) {
        let len = len.min(self.admin_data.len());
        let at = self.c2h_header(cid, len, len + DIGEST, false);
        let data = &self.admin_data[..len];
        self.tx.extend_from_slice(data);
        if self.digests.data {
            self.tx.extend_from_slice(&pdu::crc32c(data).to_le_bytes());
        }
        self.note_bytes(at);
    }

    /// A read's data: a C2HData header, the data from command `token`'s buffer (sent in
    /// place), its digest computed over the buffer.
    fn send_read_data(
        &mut self,
        token: u16,
        cid: u16,
        len: usize,
        success: bool,
        backend: &dyn Backend,
    ) {
        let at = self.c2h_header(cid, len, 0, success);
        self.note_bytes(at);
        self.segments.push_back(Segment::Data { token, len });
        if self.digests.data {
            let digest = backend
                .buffer(token)
                .and_then(|b| b.subslice(0, len).ok())
                .map_or(0, |b| pdu::crc32c_volatile(&b));
            self.push_bytes(&digest.to_le_bytes());
        }
    }

    /// Appends the header (and padding to the host's alignment) of the one C2HData PDU of
    /// command `cid`, `len` bytes, with room for `then` bytes after it; where it starts in `tx`.
    /// `success`: it ends the command (the SUCCESS flag), no response follows.
    fn c2h_header(&mut self, cid: u16, len: usize, then: usize, success: bool) -> usize {
        let d = DataHeader {
            cccid: cid,
            ttag: 0,
            offset: 0,
            length: len as u32,
        };
        let flags = if success {
            flags::LAST_PDU | flags::SUCCESS
        } else {
            flags::LAST_PDU
        };
        let header = OutHeader::data(
            PduType::C2HData,
            &d,
            flags,
            self.digests,
            self.host_alignment,
        );
        self.make_room(header.as_slice().len() + header.pad() + then);
        let at = self.tx.len();
        self.tx.extend_from_slice(header.as_slice());
        self.tx.resize(self.tx.len() + header.pad(), 0);
        at
    }

    /// Queues `bytes` to be sent.
    fn push_bytes(&mut self, bytes: &[u8]) {
        self.make_room(bytes.len());
        let at = self.tx.len();
        self.tx.extend_from_slice(bytes);
        self.note_bytes(at);
    }

    /// The bytes of `tx` from `at` on are to be sent after what is queued.
    fn note_bytes(&mut self, at: usize) {
        let len = self.tx.len() - at;
        self.tx_pending += len;
        if let Some(Segment::Bytes { at: a, len: l }) = self.segments.back_mut() {
            if *a + *l == at {
                *l += len;
                return;
            }
        }
        self.segments.push_back(Segment::Bytes { at, len });
    }

    /// Sends what `dst` takes now, headers and read data gathered in one write (the data
    /// straight from the commands' buffers); the bytes sent. A read's buffer is released
    /// once its data is sent.
    pub fn transmit<W: WriteWire + ?Sized>(
        &mut self,
        dst: &mut W,
        backend: &mut dyn Backend,
    ) -> io::Result<usize> {
        let mut total = 0;
        while !self.segments.is_empty() {
            let written = {
                let tx = VolatileSlice::from(&mut self.tx[..]);
                let mut parts = [VolatileSlice::from(&mut [][..]); usnvme_hugepages::MAX_PARTS];
                let mut n = 0;
                let mut skip = self.segment_sent;
                for segment in self.segments.iter().take(parts.len()) {
                    let part = match *segment {
                        Segment::Bytes { at, len } => tx.subslice(at + skip, len - skip).ok(),
                        Segment::Data { token, len } => backend
                            .buffer(token)
                            .and_then(|b| b.subslice(skip, len - skip).ok()),
                    };
                    parts[n] =
                        part.ok_or_else(|| io::Error::other("a segment outside its buffer"))?;
                    n += 1;
                    skip = 0;
                }
                match dst.write_parts(&parts[..n]) {
                    Ok(0) => break,
                    Ok(w) => w,
                    Err(e) if e.kind() == io::ErrorKind::WouldBlock => break,
                    Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                    Err(e) => return Err(e),
                }
            };
            total += written;
            self.sent(written, backend);
        }
        Ok(total)
    }

    /// `n` more bytes of the queued segments were sent.
    fn sent(&mut self, mut n: usize, backend: &mut dyn Backend) {
        while n > 0 {
            let Some(&front) = self.segments.front() else {
                break;
            };
            let (len, bytes) = match front {
                Segment::Bytes { len, .. } => (len, true),
                Segment::Data { len, .. } => (len, false),
            };
            let k = n.min(len - self.segment_sent);
            self.segment_sent += k;
            n -= k;
            if bytes {
                self.tx_pending -= k;
            }
            if self.segment_sent < len {
                break;
            }
            self.segments.pop_front();
            self.segment_sent = 0;
            if let Segment::Data { token, .. } = front {
                self.data_sent(token, backend);
            }
        }
        self.reclaim();
    }

    /// Gives back the space of sent bytes at the start of `tx`.
    fn reclaim(&mut self) {
        if !self
            .segments
            .iter()
            .any(|s| matches!(s, Segment::Bytes { .. }))
        {
            self.tx.clear();
        }
    }

    /// Makes room for `n` more bytes in `tx` without growing it: the bytes already sent at
    /// its start go. (Reading pauses at TX_HIGH_WATER bytes pending, so what is pending plus
    /// what one PDU and the completions add fits the capacity.)
    fn make_room(&mut self, n: usize) {
        if self.tx.len() + n <= self.tx.capacity() {
            return;
        }
        let first = self.segments.iter().find_map(|s| match *s {
            Segment::Bytes { at, .. } => Some(at),
            Segment::Data { .. } => None,
        });
        let first = first.unwrap_or(self.tx.len());
        self.tx.drain(..first);
        for s in self.segments.iter_mut() {
            if let Segment::Bytes { at, .. } = s {
                *at -= first;
            }
        }
    }

    fn respond(&mut self, cid: u16, dw0: u32, status: Status) {
        let sqid = match &self.role {
            Role::Io { qid, .. } => *qid,
            _ => 0,
        };
        let cqe = Cqe::new(dw0, self.sq_head(), sqid, cid, status, false);
        self.push_bytes(OutHeader::capsule_resp(&cqe, self.digests).as_slice());
    }

    /// The SQ head a response reports: the commands taken so far, around the queue (reserved,
    /// 0, when the host disabled SQ flow control, or before a Connect set the queue's size).
    fn sq_head(&self) -> u16 {
        if self.sq_flow && self.sq_entries > 0 {
            (self.sq_taken % self.sq_entries) as u16
        } else {
            0
        }
    }

    fn respond64(&mut self, cid: u16, value: u64, status: Status) {
        let mut cqe = Cqe::new(value as u32, self.sq_head(), 0, cid, status, false);
        cqe.dw1 = (value >> 32) as u32;
        self.push_bytes(OutHeader::capsule_resp(&cqe, self.digests).as_slice());
    }

    fn complete_events(&mut self, status: Status) {
        while let Role::Admin { events, .. } = &mut self.role {
            let Some(cid) = events.pop() else {
                break;
            };
            self.respond(cid, 0, status);
        }
    }

    /// Timers: an admin queue whose host sent no Keep Alive within KATO ends its association;
    /// an I/O queue of a controller that went away ends too; SMART answers are collected.
    /// Call every few milliseconds.
    pub fn tick(&mut self, now: Instant, backend: &mut dyn Backend) {
        self.poll_smart(backend);
        let why = self.stalled(now).or_else(|| match &self.role {
            Role::Admin {
                features,
                last_keep_alive,
                ..
            } if features.keep_alive_ms() > 0
                && now.saturating_duration_since(*last_keep_alive)
                    > 2 * Duration::from_millis(features.keep_alive_ms().into()) =>
            {
                Some(format!(
                    "no Keep Alive within {} ms",
                    features.keep_alive_ms()
                ))
            }
            Role::Io { controller, .. } if controller.gone() => {
                Some(format!("controller {} went away", controller.cntlid()))
            }
            _ => None,
        });
        if let Some(why) = why {
            if self.closed.is_none() {
                log::warn!("{}: {why}: closing", self.peer);
            }
            self.close(why, backend);
        }
    }

    /// Why the connection is to close for a host that stopped sending: no ICReq within
    /// [`ICREQ_TIMEOUT`] of opening, or a PDU half received and nothing more for the stall
    /// timeout. (Between PDUs a host may be quiet for as long as it likes: Keep Alive
    /// watches that.)
    fn stalled(&mut self, now: Instant) -> Option<String> {
        let opened = *self.opened.get_or_insert(now);
        if self.phase == Phase::AwaitIcReq && now.saturating_duration_since(opened) > ICREQ_TIMEOUT
        {
            return Some(format!("no ICReq within {} s", ICREQ_TIMEOUT.as_secs()));
        }
        let (count, since) = *self.progress.get_or_insert((self.received, now));
        if count != self.received {
            self.progress = Some((self.received, now));
            return None;
        }
        let quiet = now.saturating_duration_since(since);
        let mid_pdu = self.rx_end > self.rx_start || !matches!(self.rx_state, RxState::Header);
        let limit = match &self.role {
            Role::Admin { features, .. } if features.keep_alive_ms() > 0 => {
                Duration::from_millis(features.keep_alive_ms().into())
            }
            _ => STALL_TIMEOUT,
        };
        (mid_pdu && self.phase != Phase::Closing && quiet > limit).then(|| {
            format!(
                "a PDU half received and nothing more for {} ms",
                quiet.as_millis()
            )
        })
    }

    /// The target stops: held events complete, the connection closes once drained.
    pub fn shut_down(&mut self, backend: &mut dyn Backend) {
        self.complete_events(Status::ABORT_REQUESTED);
        self.close("the target is shutting down".into(), backend);
    }

    fn close(&mut self, why: String, backend: &mut dyn Backend) {
        if self.closed.is_some() {
            return;
        }
        self.phase = Phase::Closing;
        if let Role::Admin { controller, .. } = &self.role {
            controller.go_away();
        }
        // Commands not yet handed to the backend are dropped now; the others drain.
        for token in 0..self.slots.len() {
            let s = self.slots[token];
            if s.busy && !s.submitted {
                if s.op.is_some_and(Op::has_data) {
                    backend.release(token as u16);
                }
                self.slots[token] = Slot::default();
                self.in_flight -= 1;
            }
        }
        self.closed = Some(why);
    }

    fn terminate(&mut self, error: FatalError, backend: &mut dyn Backend) {
        log::warn!(
            "{}: closing the connection: {error} (FES {}, FEI {})",
            self.peer,
            error.fes(),
            error.fei()
        );
        let bad = pdu::offending(&self.rx[self.rx_start..self.rx_end]);
        let term = pdu::TermReq::new(PduType::C2HTermReq, &error, bad);
        self.push_bytes(term.as_slice());
        (self.rx_start, self.rx_end) = (0, 0);
        self.rx_state = RxState::Header;
        self.close(format!("protocol error: {error}"), backend);
    }
}

/// A command capsule's opcode, SGL descriptor type and SGL length (dword 8 of the SGL).
fn capsule_fields(sqe: &Sqe) -> (u8, u8, u32) {
    (sqe.cdw0 as u8, sqe.as_bytes()[39], sqe.prp2 as u32)
}

#[cfg(test)]
mod tests {
    use super::super::memory::{test_subsystem, MemoryBackend};
    use super::*;
    use crate::fabric::pdu::{parse_term_req, SHORT_HEADER};

    const HOST: &str = "nqn.2024-01.io.usnvme:host-a";

    /// A connection, its backend, and the host side of the test.
    struct Bed {
        conn: Connection,
        backend: MemoryBackend,
        digests: Digests,
        sub: Arc<SubsystemInfo>,
        /// The flags of every C2HData PDU taken, in order.
        c2h_flags: Vec<u8>,
    }

    /// What the target sent, PDU by PDU.
    #[derive(Debug)]
    enum Got {
        Resp(Cqe),
        Data(DataHeader, Vec<u8>),
        R2T(DataHeader),
        Term(u16, u32),
        IcResp,
    }

    impl Got {
        fn clone_r2t(&self) -> Got {
            match self {
                Got::R2T(d) => Got::R2T(*d),
                _ => Got::IcResp,
            }
        }
    }

    impl Bed {
        fn new(allowed: Option<Vec<String>>, digests: Digests) -> Bed {
            let sub = Arc::new(test_subsystem(2));
            let backend = MemoryBackend::new(&sub);
            let conn = Connection::new(
                sub.clone(),
                Arc::new(Registry::new(allowed)),
                ConnectionLimits { maxh2cdata: 4096 },
                "test".into(),
            );
            let mut bed = Bed {
                conn,
                backend,
                digests,
                sub,
                c2h_flags: Vec::new(),
            };
            let req = IcReq {
                pfv: 0,
                hpda: 0,
                digests,
                maxr2t: 0,
            };
            bed.send(&req.encode());
            assert!(matches!(bed.take()[..], [Got::IcResp]));
            bed
        }

        fn send(&mut self, bytes: &[u8]) {
            // in odd pieces: the state machine must not care how TCP cuts the stream
            for piece in bytes.chunks(7) {
                self.conn.receive(piece, &mut self.backend);
            }
            self.backend.complete_all(&mut self.conn);
        }

        /// All at once, as a socket with everything arrived gives it.
        fn send_whole(&mut self, bytes: &[u8]) {
            assert_eq!(self.conn.receive(bytes, &mut self.backend), bytes.len());
            self.backend.complete_all(&mut self.conn);
        }

        fn capsule_whole(&mut self, sqe: &Sqe, data: &[u8]) {
            let h = OutHeader::capsule_cmd(sqe, data.len(), self.digests);
            let mut pdu = h.as_slice().to_vec();
            pdu.resize(pdu.len() + h.pad(), 0);
            pdu.extend_from_slice(data);
            if self.digests.data && !data.is_empty() {
                pdu.extend_from_slice(&pdu::crc32c(data).to_le_bytes());
            }
            self.send_whole(&pdu);
        }

        fn capsule(&mut self, sqe: &Sqe, data: &[u8]) {
            let h = OutHeader::capsule_cmd(sqe, data.len(), self.digests);
            let mut pdu = h.as_slice().to_vec();
            pdu.resize(pdu.len() + h.pad(), 0);
            pdu.extend_from_slice(data);
            if self.digests.data && !data.is_empty() {
                pdu.extend_from_slice(&pdu::crc32c(data).to_le_bytes());
            }
            self.send(&pdu);
        }

        fn take(&mut self) -> Vec<Got> {
            let mut out = Vec::new();
            self.conn
                .transmit(&mut out, &mut self.backend)
                .expect("memory takes all");
            let mut got = Vec::new();
            let mut at = 0;
            while at < out.len() {
                let plen = u32::from_le_bytes(out[at + 4..at + 8].try_into().unwrap()) as usize;
                let pdu = &out[at..at + plen];
                let hd = if pdu[1] & flags::HDGST != 0 {
                    DIGEST
                } else {
                    0
                };
                got.push(match PduType::from_raw(pdu[0]) {
                    Some(PduType::IcResp) => Got::IcResp,
                    Some(PduType::CapsuleResp) => {
                        if hd > 0 {
                            pdu::check_header_digest(pdu, SHORT_HEADER).expect("digest");
                        }
                        Got::Resp(Cqe::from_slice(&pdu[8..24]).unwrap())
                    }
                    Some(PduType::C2HData) => {
                        self.c2h_flags.push(pdu[1]);
                        let d = DataHeader::parse(pdu).unwrap();
                        let from = pdu[3] as usize;
                        let data = pdu[from..from + d.length as usize].to_vec();
                        if pdu[1] & flags::DDGST != 0 {
                            let dd = &pdu[from + data.len()..from + data.len() + 4];
                            assert_eq!(
                                u32::from_le_bytes(dd.try_into().unwrap()),
                                pdu::crc32c(&data)
                            );
                        }
                        Got::Data(d, data)
                    }
                    Some(PduType::R2T) => Got::R2T(DataHeader::parse(pdu).unwrap()),
                    Some(PduType::C2HTermReq) => {
                        let (fes, fei) = parse_term_req(pdu).unwrap();
                        Got::Term(fes, fei)
                    }
                    other => panic!("unexpected {other:?}"),
                });
                at += plen;
            }
            got
        }

        fn status(&mut self) -> Status {
            match self.take().last() {
                Some(Got::Resp(c)) => c.status(),
                other => panic!("no response: {other:?}"),
            }
        }

        fn connect(&mut self, qid: u16, cntlid: u16, subnqn: &str, host: &str) -> Cqe {
            self.connect_with(qid, cntlid, subnqn, host, 0)
        }

        /// A Connect with connect attributes `cattr`.
        fn connect_with(
            &mut self,
            qid: u16,
            cntlid: u16,
            subnqn: &str,
            host: &str,
            cattr: u8,
        ) -> Cqe {
            let mut sqe = Sqe::new(FABRICS);
            let b: &mut [u8; 64] = zerocopy::IntoBytes::as_mut_bytes(&mut sqe)
                .try_into()
                .unwrap();
            b[4] = 0x01;
            b[42..44].copy_from_slice(&qid.to_le_bytes());
            b[44..46].copy_from_slice(&15u16.to_le_bytes());
            b[46] = cattr;
            b[48..52].copy_from_slice(&0u32.to_le_bytes());
            b[39] = SGL_IN_CAPSULE;
            b[32..36].copy_from_slice(&1024u32.to_le_bytes());
            let mut data = [0u8; 1024];
            data[16..18].copy_from_slice(&cntlid.to_le_bytes());
            data[256..256 + subnqn.len()].copy_from_slice(subnqn.as_bytes());
            data[512..512 + host.len()].copy_from_slice(host.as_bytes());
            self.capsule(&sqe, &data);
            match self.take().last() {
                Some(Got::Resp(c)) => *c,
                other => panic!("no response: {other:?}"),
            }
        }

        fn enable(&mut self) {
            let mut sqe = Sqe::new(FABRICS);
            let b: &mut [u8; 64] = zerocopy::IntoBytes::as_mut_bytes(&mut sqe)
                .try_into()
                .unwrap();
            b[4] = 0x00; // Property Set
            b[44..48].copy_from_slice(&0x14u32.to_le_bytes()); // CC
            b[48..56].copy_from_slice(&(1u64 | 6 << 16 | 4 << 20).to_le_bytes());
            self.capsule(&sqe, &[]);
            assert_eq!(self.status(), Status::SUCCESS);
        }

        fn io(&mut self, opcode: u8, slba: u64, blocks: u32, transport: u32) -> Sqe {
            let mut sqe = Sqe::new(opcode);
            sqe.nsid = 1;
            sqe.cdw10 = slba as u32;
            sqe.cdw11 = (slba >> 32) as u32;
            sqe.cdw12 = blocks - 1;
            let b: &mut [u8; 64] = zerocopy::IntoBytes::as_mut_bytes(&mut sqe)
                .try_into()
                .unwrap();
            b[39] = if transport > 0 {
                SGL_TRANSPORT
            } else {
                SGL_IN_CAPSULE
            };
            b[32..36].copy_from_slice(
                &(if transport > 0 {
                    transport
                } else {
                    blocks * 512
                })
                .to_le_bytes(),
            );
            sqe
        }

        /// An admin queue connected and enabled, then an I/O queue on a second connection.
        fn io_queue(digests: Digests) -> Bed {
            let mut admin = Bed::new(None, digests);
            let cntlid = admin.connect(0, 0xffff, &admin.sub.nqn.clone(), HOST).dw0 as u16;
            admin.enable();
            let mut io = Bed::new(None, digests);
            io.conn.registry = admin.conn.registry.clone();
            let cqe = io.connect(1, cntlid, &io.sub.nqn.clone(), HOST);
            assert_eq!(cqe.status(), Status::SUCCESS);
            io
        }
    }

    fn both() -> Digests {
        Digests {
            header: true,
            data: true,
        }
    }

    #[test]
    fn a_connection_without_an_icreq_is_closed_after_the_limit_and_a_half_sent_pdu_after_its_own() {
        let sub = Arc::new(test_subsystem(1));
        let mut backend = MemoryBackend::new(&sub);
        let registry = Arc::new(Registry::new(None));
        let limits = ConnectionLimits { maxh2cdata: 4096 };
        let t0 = Instant::now();
        let secs = |s: u64| t0 + Duration::from_secs(s);

        // no ICReq at all; then one begun (bytes come) but never finished: the limit counts
        // from the connection's opening either way
        for sent in [&[][..], &[0u8, 0, 128, 0][..]] {
            let mut conn = Connection::new(sub.clone(), registry.clone(), limits, "h".into());
            conn.tick(t0, &mut backend);
            conn.receive(sent, &mut backend);
            conn.tick(secs(9), &mut backend);
            assert_eq!(conn.finished(), None, "closed before the ICReq limit");
            conn.tick(secs(11), &mut backend);
            assert_eq!(conn.finished(), Some("no ICReq within 10 s"), "{sent:?}");
        }

        // Ready, between PDUs: quiet for as long as the host likes
        let mut bed = Bed::new(None, Digests::default());
        bed.conn.tick(t0, &mut bed.backend);
        bed.conn.tick(secs(3600), &mut bed.backend);
        assert_eq!(bed.conn.finished(), None, "a quiet connection between PDUs");
        // half a command capsule: closed once nothing more came for the stall limit
        let h = OutHeader::capsule_cmd(
            &Sqe::identify(usnvme_driver::spec::command::Cns::Controller, 0),
            0,
            bed.digests,
        );
        let half = &h.as_slice()[..30];
        bed.conn.receive(half, &mut bed.backend);
        bed.conn.tick(secs(3601), &mut bed.backend);
        bed.conn.tick(secs(3601 + 15), &mut bed.backend);
        assert_eq!(bed.conn.finished(), None, "closed before the stall limit");
        // a byte more starts the limit again
        bed.conn.receive(&h.as_slice()[30..31], &mut bed.backend);
        bed.conn.tick(secs(3601 + 20), &mut bed.backend);
        bed.conn.tick(secs(3601 + 35), &mut bed.backend);
        assert_eq!(
            bed.conn.finished(),
            None,
            "the limit restarts with each byte"
        );
        bed.conn.tick(secs(3601 + 36), &mut bed.backend);
        assert!(
            bed.conn
                .finished()
                .is_some_and(|why| why.starts_with("a PDU half received and nothing more for")),
            "{:?}",
            bed.conn.finished()
        );
    }

    #[test]
    fn responses_report_the_sq_head_and_without_sq_flow_control_a_read_ends_with_its_data() {
        let mut admin = Bed::new(None, Digests::default());
        let nqn = admin.sub.nqn.clone();
        // the Connect is the admin queue's first command: the head is past it
        let connected = admin.connect(0, 0xffff, &nqn, HOST);
        assert_eq!((connected.status(), connected.sqhd), (Status::SUCCESS, 1));
        let cntlid = connected.dw0 as u16;
        admin.enable();
        let read_of = |io: &mut Bed, cid: u16| {
            let mut sqe = io.io(READ, 0, 8, 4096);
            sqe.set_cid(cid);
            io.capsule(&sqe, &[]);
            io.take()
        };
        // SQ flow control kept: data, then a response whose SQ head wraps at the queue's 16
        let mut io = Bed::new(None, Digests::default());
        io.conn.registry = admin.conn.registry.clone();
        assert_eq!(io.connect(1, cntlid, &nqn, HOST).sqhd, 1);
        for cid in 0..16u16 {
            match &read_of(&mut io, cid)[..] {
                [Got::Data(d, _), Got::Resp(c)] => {
                    assert_eq!((d.cccid, c.cid, c.status()), (cid, cid, Status::SUCCESS));
                    assert_eq!(c.sqhd, (cid + 2) % 16, "command {cid}");
                }
                other => panic!("{other:?}"),
            }
        }
        assert!(io.c2h_flags.iter().all(|f| f & flags::SUCCESS == 0));
        // disabled: the C2HData carries SUCCESS and LAST_PDU, and no response follows
        let mut io = Bed::new(None, Digests::default());
        io.conn.registry = admin.conn.registry.clone();
        let c = io.connect_with(2, cntlid, &nqn, HOST, CATTR_DISABLE_SQ_FLOW);
        assert_eq!((c.status(), c.sqhd), (Status::SUCCESS, 0));
        match &read_of(&mut io, 5)[..] {
            [Got::Data(d, data)] => assert_eq!((d.cccid, data.len()), (5, 4096)),
            other => panic!("{other:?}"),
        }
        assert_eq!(io.c2h_flags, [flags::LAST_PDU | flags::SUCCESS]);
        assert_eq!(
            io.backend.buffers_held(),
            0,
            "the read's buffer is back once sent"
        );
        // a failed read still gets its response
        let mut sqe = io.io(READ, 1 << 40, 8, 4096);
        sqe.set_cid(6);
        io.capsule(&sqe, &[]);
        match &io.take()[..] {
            [Got::Resp(c)] => assert_eq!(c.status(), Status::LBA_OUT_OF_RANGE),
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn writes_in_capsule_and_by_r2t_read_back_with_and_without_digests() {
        for digests in [Digests::default(), both()] {
            let mut io = Bed::io_queue(digests);
            // in-capsule: 4 KiB at LBA 8
            let small: Vec<u8> = (0..4096u32).map(|i| i as u8).collect();
            let sqe = io.io(WRITE, 8, 8, 0);
            io.capsule(&sqe, &small);
            assert_eq!(io.status(), Status::SUCCESS);
            // R2T: 12 KiB at LBA 100, sent in three H2CData PDUs of MAXH2CDATA (4 KiB)
            let big: Vec<u8> = (0..12288u32).map(|i| (i / 7) as u8).collect();
            let mut sqe = io.io(WRITE, 100, 24, 12288);
            sqe.set_cid(9);
            io.capsule(&sqe, &[]);
            let got = io.take();
            let Some(Got::R2T(r2t)) = got.first() else {
                panic!("an R2T: {got:?}");
            };
            assert_eq!((r2t.cccid, r2t.offset, r2t.length), (9, 0, 12288));
            for (i, part) in big.chunks(4096).enumerate() {
                let d = DataHeader {
                    cccid: 9,
                    ttag: r2t.ttag,
                    offset: i as u32 * 4096,
                    length: 4096,
                };
                let last = if i == 2 { flags::LAST_PDU } else { 0 };
                let h = OutHeader::data(PduType::H2CData, &d, last, digests, 0);
                let mut pdu = h.as_slice().to_vec();
                pdu.resize(pdu.len() + h.pad(), 0);
                pdu.extend_from_slice(part);
                if digests.data {
                    pdu.extend_from_slice(&pdu::crc32c(part).to_le_bytes());
                }
                io.send(&pdu);
            }
            assert_eq!(io.status(), Status::SUCCESS);
            assert_eq!(
                &io.backend.namespaces[0][100 * 512..100 * 512 + 12288],
                &big[..]
            );
            // read both back
            for (slba, want) in [(8u64, &small), (100, &big)] {
                let len = want.len() as u32;
                let sqe = io.io(READ, slba, len / 512, len);
                io.capsule(&sqe, &[]);
                let got = io.take();
                match &got[..] {
                    [Got::Data(d, data), Got::Resp(c)] => {
                        assert_eq!(d.length, len);
                        assert_eq!(data, want);
                        assert_eq!(c.status(), Status::SUCCESS);
                    }
                    other => panic!("{other:?}"),
                }
            }
            assert_eq!(io.backend.buffers_held(), 0);
        }
    }

    #[test]
    fn bad_commands_fail_by_status_and_the_connection_goes_on() {
        let mut io = Bed::io_queue(Digests::default());
        let sqe = io.io(READ, 2047, 2, 1024); // past the end (2048 blocks)
        io.capsule(&sqe, &[]);
        assert_eq!(io.status(), Status::LBA_OUT_OF_RANGE);
        let mut sqe = io.io(READ, 0, 1, 512);
        sqe.nsid = 9;
        io.capsule(&sqe, &[]);
        assert_eq!(io.status(), Status::INVALID_NAMESPACE);
        let sqe = io.io(READ, 0, 2, 512); // SGL says 512 bytes, the command 1024
        io.capsule(&sqe, &[]);
        assert_eq!(io.status(), Status::DATA_SGL_LENGTH_INVALID);
        let sqe = io.io(0x55, 0, 1, 512);
        io.capsule(&sqe, &[]);
        assert_eq!(io.status(), Status::INVALID_OPCODE);
        let sqe = io.io(FLUSH, 0, 1, 0);
        io.capsule(&sqe, &[]);
        assert_eq!(io.status(), Status::SUCCESS);
    }

    #[test]
    fn deallocate_zeroes_each_range() {
        let mut io = Bed::io_queue(Digests::default());
        io.backend.namespaces[0].fill(0xEE);
        let mut sqe = io.io(DATASET_MANAGEMENT, 0, 1, 0);
        sqe.cdw10 = 1; // two ranges
        sqe.cdw11 = usnvme_driver::spec::command::DSM_DEALLOCATE;
        let b: &mut [u8; 64] = zerocopy::IntoBytes::as_mut_bytes(&mut sqe)
            .try_into()
            .unwrap();
        b[32..36].copy_from_slice(&32u32.to_le_bytes());
        let mut ranges = [0u8; 32];
        ranges[4..8].copy_from_slice(&4u32.to_le_bytes()); // 4 blocks at LBA 0
        ranges[20..24].copy_from_slice(&2u32.to_le_bytes()); // 2 blocks at LBA 10
        ranges[24..32].copy_from_slice(&10u64.to_le_bytes());
        io.capsule(&sqe, &ranges);
        assert_eq!(io.status(), Status::SUCCESS);
        let disk = &io.backend.namespaces[0];
        assert!(disk[..4 * 512].iter().all(|&b| b == 0));
        assert!(disk[4 * 512..10 * 512].iter().all(|&b| b == 0xEE));
        assert!(disk[10 * 512..12 * 512].iter().all(|&b| b == 0));
        assert_eq!(disk[12 * 512], 0xEE);
    }

    #[test]
    fn refusals_by_name() {
        let mut bed = Bed::new(Some(vec![HOST.into()]), Digests::default());
        let nqn = bed.sub.nqn.clone();
        let c = bed.connect(0, 0xffff, &nqn, "nqn.2024-01.io.usnvme:stranger");
        assert_eq!(c.status(), Status::CONNECT_INVALID_HOST);
        let c = bed.connect(0, 0xffff, "nqn.2024-01.io.usnvme:nothing-here", HOST);
        assert_eq!(c.status(), Status::CONNECT_INVALID_PARAMETERS);
        // an I/O queue of a controller that does not exist
        let c = bed.connect(1, 7, &nqn, HOST);
        assert_eq!(c.status(), Status::CONNECT_INVALID_PARAMETERS);
        // admin commands before the controller is enabled
        let c = bed.connect(0, 0xffff, &nqn, HOST);
        assert_eq!(c.status(), Status::SUCCESS);
        let mut identify = Sqe::new(0x06);
        identify.cdw10 = 1;
        bed.capsule(&identify, &[]);
        assert_eq!(bed.status(), Status::COMMAND_SEQUENCE_ERROR);
        bed.enable();
        let b: &mut [u8; 64] = zerocopy::IntoBytes::as_mut_bytes(&mut identify)
            .try_into()
            .unwrap();
        b[39] = SGL_TRANSPORT;
        b[32..36].copy_from_slice(&4096u32.to_le_bytes());
        bed.capsule(&identify, &[]);
        match &bed.take()[..] {
            [Got::Data(d, data), Got::Resp(c)] => {
                assert_eq!((d.length, c.status()), (4096, Status::SUCCESS));
                let id = usnvme_driver::spec::IdentifyController::from_slice(data).unwrap();
                assert_eq!(id.subnqn(), nqn);
                assert_ne!(id.sgls, 0, "the Linux host insists on SGL support");
            }
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn malformed_pdus_end_the_connection_with_a_term_req_naming_the_field() {
        // (bytes to send after the ICReq, FES, FEI)
        let mut wrong_hlen = OutHeader::capsule_cmd(&Sqe::new(0), 0, Digests::default()).bytes;
        wrong_hlen[2] = 70;
        let mut oversized = OutHeader::capsule_cmd(&Sqe::new(0), 0, Digests::default()).bytes;
        oversized[4..8].copy_from_slice(&(1u32 << 30).to_le_bytes());
        oversized[3] = 72;
        let stray_data = OutHeader::data(
            PduType::H2CData,
            &DataHeader {
                cccid: 1,
                ttag: 3,
                offset: 0,
                length: 4,
            },
            flags::LAST_PDU,
            Digests::default(),
            0,
        );
        let mut stray = stray_data.as_slice().to_vec();
        stray.extend_from_slice(&[1, 2, 3, 4]);
        let cases: Vec<(Vec<u8>, u16, u32)> = vec![
            (wrong_hlen[..72].to_vec(), 1, 2),
            (oversized[..72].to_vec(), 5, 0),
            (stray, 1, 10),
            (
                IcReq {
                    pfv: 0,
                    hpda: 0,
                    digests: Digests::default(),
                    maxr2t: 0,
                }
                .encode()
                .to_vec(),
                2,
                0,
            ),
            ([0x42u8, 0, 24, 0, 24, 0, 0, 0].to_vec(), 1, 0),
        ];
        for (bytes, fes, fei) in cases {
            let mut bed = Bed::new(None, Digests::default());
            bed.send(&bytes);
            let got = bed.take();
            assert!(
                matches!(got.last(), Some(Got::Term(f, i)) if (*f, *i) == (fes, fei)),
                "{bytes:?}: {got:?}"
            );
            assert!(bed.conn.finished().is_some());
            // nothing more is read once it is closing
            assert_eq!(bed.conn.receive(&[0; 8], &mut bed.backend), 0);
        }
        // a header digest mismatch
        let mut bed = Bed::new(None, both());
        let mut h = OutHeader::capsule_cmd(&Sqe::new(0), 0, both());
        h.bytes[20] ^= 1;
        bed.send(h.as_slice());
        assert!(matches!(bed.take().last(), Some(Got::Term(3, _))));
    }

    /// One H2CData PDU with `data` at `offset` of transfer `ttag` of command `cid`.
    fn h2c_pdu(cid: u16, ttag: u16, offset: u32, data: &[u8], last: bool, dg: Digests) -> Vec<u8> {
        let d = DataHeader {
            cccid: cid,
            ttag,
            offset,
            length: data.len() as u32,
        };
        let flag = if last { flags::LAST_PDU } else { 0 };
        let h = OutHeader::data(PduType::H2CData, &d, flag, dg, 0);
        let mut pdu = h.as_slice().to_vec();
        pdu.resize(pdu.len() + h.pad(), 0);
        pdu.extend_from_slice(data);
        if dg.data {
            pdu.extend_from_slice(&pdu::crc32c(data).to_le_bytes());
        }
        pdu
    }

    #[test]
    fn write_data_is_received_into_the_buffer_and_read_data_sent_from_it() {
        for digests in [Digests::default(), both()] {
            let mut io = Bed::io_queue(digests);
            let capacity = io.conn.tx_capacity();
            for round in 0..4u32 {
                // in-capsule, 8 KiB at LBA 16
                let small: Vec<u8> = (0..8192u32).map(|i| (i * 3 + round) as u8).collect();
                let sqe = io.io(WRITE, 16, 16, 0);
                io.capsule_whole(&sqe, &small);
                assert_eq!(io.status(), Status::SUCCESS);
                // R2T: 12 KiB at LBA 200 in three H2CData PDUs, all sent at once
                let big: Vec<u8> = (0..12288u32).map(|i| (i / 5 + round) as u8).collect();
                let mut sqe = io.io(WRITE, 200, 24, 12288);
                sqe.set_cid(4);
                io.capsule_whole(&sqe, &[]);
                let Some(Got::R2T(r2t)) = io.take().first().map(|g| g.clone_r2t()) else {
                    panic!("an R2T");
                };
                let mut pdus = Vec::new();
                for (i, part) in big.chunks(4096).enumerate() {
                    let at = i as u32 * 4096;
                    pdus.extend(h2c_pdu(4, r2t.ttag, at, part, i == 2, digests));
                }
                io.send_whole(&pdus);
                assert_eq!(io.status(), Status::SUCCESS);
                assert_eq!(io.conn.copied(), 0, "no data copied in round {round}");
                // read both back: the data waits in the buffer, not in the transmit queue
                for (slba, want) in [(16u64, &small), (200, &big)] {
                    let len = want.len() as u32;
                    let sqe = io.io(READ, slba, len / 512, len);
                    io.capsule_whole(&sqe, &[]);
                    assert!(io.conn.tx_pending < want.len(), "headers only are queued");
                    assert_eq!(io.backend.buffers_held(), 1, "held until sent");
                    match &io.take()[..] {
                        [Got::Data(d, data), Got::Resp(c)] => {
                            assert_eq!((d.length, c.status()), (len, Status::SUCCESS));
                            assert_eq!(data, want);
                        }
                        other => panic!("{other:?}"),
                    }
                    assert_eq!(io.backend.buffers_held(), 0);
                }
            }
            assert_eq!(
                io.conn.tx_capacity(),
                capacity,
                "the transmit queue never grew"
            );
        }
    }

    #[test]
    fn a_host_that_does_not_read_its_responses_is_paused_and_the_transmit_buffer_never_grows() {
        let mut admin = Bed::new(None, Digests::default());
        let nqn = admin.sub.nqn.clone();
        assert_eq!(
            admin.connect(0, 0xffff, &nqn, HOST).status(),
            Status::SUCCESS
        );
        admin.enable();
        let capacity = admin.conn.tx_capacity();
        let mut identify = Sqe::new(0x06);
        identify.cdw10 = 1;
        let b: &mut [u8; 64] = zerocopy::IntoBytes::as_mut_bytes(&mut identify)
            .try_into()
            .unwrap();
        b[39] = SGL_TRANSPORT;
        b[32..36].copy_from_slice(&4096u32.to_le_bytes());
        let one = OutHeader::capsule_cmd(&identify, 0, Digests::default());
        let many: Vec<u8> = (0..100).flat_map(|_| one.as_slice().to_vec()).collect();
        // 100 Identify answers are 400 KiB: reading stops once 16 KiB wait to be sent
        let taken = admin.conn.receive(&many, &mut admin.backend);
        assert!(taken < many.len() / 10, "took {taken} bytes");
        assert_eq!(admin.conn.tx_capacity(), capacity);
        // the host reads, and the rest is served
        let mut answered = 0;
        let mut rest = &many[taken..];
        loop {
            let got = admin.take();
            answered += got
                .iter()
                .filter(|g| matches!(g, Got::Resp(c) if c.status() == Status::SUCCESS))
                .count();
            if rest.is_empty() && got.is_empty() {
                break;
            }
            let n = admin.conn.receive(rest, &mut admin.backend);
            rest = &rest[n..];
        }
        assert_eq!(answered, 100);
        assert_eq!(
            admin.conn.tx_capacity(),
            capacity,
            "the transmit buffer never grew"
        );
    }

    #[test]
    fn a_smart_read_waits_for_the_drives_while_other_commands_are_served() {
        let mut admin = Bed::new(None, Digests::default());
        let nqn = admin.sub.nqn.clone();
        let cntlid = admin.connect(0, 0xffff, &nqn, HOST).dw0 as u16;
        admin.enable();
        admin.backend.smart_held = true; // the drives are slow to answer
        admin.backend.smart.temperature_sensors[0] = 321;
        let mut smart = Sqe::new(0x02);
        smart.nsid = u32::MAX;
        smart.cdw10 = 0x02 | ((512 / 4 - 1) << 16);
        smart.set_cid(40);
        let b: &mut [u8; 64] = zerocopy::IntoBytes::as_mut_bytes(&mut smart)
            .try_into()
            .unwrap();
        b[39] = SGL_TRANSPORT;
        b[32..36].copy_from_slice(&512u32.to_le_bytes());
        admin.capsule(&smart, &[]);
        admin.conn.tick(Instant::now(), &mut admin.backend);
        assert!(
            admin.take().is_empty(),
            "no answer while the drives have none"
        );
        assert_eq!(admin.backend.smart_asked, 1);
        // meanwhile: an Identify on the same queue, and I/O on a queue of the controller
        let mut identify = Sqe::new(0x06);
        identify.cdw10 = 1;
        admin.capsule(&identify, &[]);
        assert_eq!(admin.status(), Status::SUCCESS);
        let mut io = Bed::new(None, Digests::default());
        io.conn.registry = admin.conn.registry.clone();
        assert_eq!(io.connect(1, cntlid, &nqn, HOST).status(), Status::SUCCESS);
        let sqe = io.io(WRITE, 0, 8, 0);
        io.capsule(&sqe, &[9; 4096]);
        assert_eq!(io.status(), Status::SUCCESS);
        // the drives answer: the command completes with their log
        admin.conn.tick(Instant::now(), &mut admin.backend);
        assert!(admin.take().is_empty());
        admin.backend.smart_held = false;
        admin.conn.tick(Instant::now(), &mut admin.backend);
        match &admin.take()[..] {
            [Got::Data(d, data), Got::Resp(c)] => {
                assert_eq!((d.cccid, c.cid, c.status()), (40, 40, Status::SUCCESS));
                let log = usnvme_driver::spec::SmartLog::from_slice(data).expect("512 bytes");
                assert_eq!(log.temperature_sensors[0], 321);
            }
            other => panic!("{other:?}"),
        }
        assert_eq!(admin.backend.smart_asked, 0);
    }

    #[test]
    fn a_shutdown_flushes_every_namespace_before_it_reports_complete() {
        let mut admin = Bed::new(None, Digests::default());
        let nqn = admin.sub.nqn.clone();
        assert_eq!(
            admin.connect(0, 0xffff, &nqn, HOST).status(),
            Status::SUCCESS
        );
        admin.enable();
        let property = |set: Option<u64>| {
            let mut sqe = Sqe::new(FABRICS);
            let b: &mut [u8; 64] = zerocopy::IntoBytes::as_mut_bytes(&mut sqe)
                .try_into()
                .unwrap();
            b[4] = if set.is_some() { 0x00 } else { 0x04 };
            let offset: u32 = if set.is_some() { 0x14 } else { 0x1c };
            b[44..48].copy_from_slice(&offset.to_le_bytes());
            b[48..56].copy_from_slice(&set.unwrap_or(0).to_le_bytes());
            OutHeader::capsule_cmd(&sqe, 0, Digests::default()).bytes[..72].to_vec()
        };
        let csts = |bed: &mut Bed| {
            bed.conn.receive(&property(None), &mut bed.backend); // (nothing completes)
            match &bed.take()[..] {
                [Got::Resp(c)] => c.dw0,
                other => panic!("{other:?}"),
            }
        };
        let cc = 1u64 | 6 << 16 | 4 << 20;
        admin
            .conn
            .receive(&property(Some(cc | 1 << 14)), &mut admin.backend); // SHN normal
        assert!(matches!(&admin.take()[..], [Got::Resp(c)] if c.status() == Status::SUCCESS));
        assert_eq!(admin.backend.flushes, [1, 1], "a Flush to every namespace");
        assert_eq!(
            csts(&mut admin) >> 2 & 3,
            0b01,
            "SHST: processing, flushes pending"
        );
        admin.backend.complete_all(&mut admin.conn);
        assert!(admin.take().is_empty(), "no response of its own");
        assert_eq!(
            csts(&mut admin) >> 2 & 3,
            0b10,
            "SHST: complete once flushed"
        );
        // written again: no second round of flushes
        admin
            .conn
            .receive(&property(Some(cc | 1 << 14)), &mut admin.backend);
        admin.backend.complete_all(&mut admin.conn);
        assert!(matches!(&admin.take()[..], [Got::Resp(c)] if c.status() == Status::SUCCESS));
        assert_eq!(admin.backend.flushes, [1, 1]);
        assert_eq!(csts(&mut admin) >> 2 & 3, 0b10);
    }

    #[test]
    fn a_full_queue_of_reads_is_sent_from_the_buffers_in_order() {
        let mut io = Bed::io_queue(both());
        for (i, b) in io.backend.namespaces[0].iter_mut().enumerate() {
            *b = (i / 512 * 7 + i % 512) as u8;
        }
        // 32 reads (every queue entry) of one block each, completed at once: more parts
        // (header, data, response) than one writev takes
        let mut pdus = Vec::new();
        for i in 0..32u16 {
            let mut sqe = io.io(READ, u64::from(i) * 3, 1, 512);
            sqe.set_cid(100 + i);
            let h = OutHeader::capsule_cmd(&sqe, 0, both());
            pdus.extend_from_slice(h.as_slice());
        }
        io.send_whole(&pdus);
        assert_eq!(
            io.backend.buffers_held(),
            32,
            "every buffer held until sent"
        );
        let got = io.take();
        assert_eq!(got.len(), 64);
        for (i, pair) in got.chunks(2).enumerate() {
            let lba = i * 3;
            match pair {
                [Got::Data(d, data), Got::Resp(c)] => {
                    assert_eq!((d.cccid, c.cid), (100 + i as u16, 100 + i as u16));
                    assert_eq!(data[..], io.backend.namespaces[0][lba * 512..][..512]);
                }
                other => panic!("{other:?}"),
            }
        }
        assert_eq!(io.backend.buffers_held(), 0);
    }

    #[test]
    fn a_bad_data_digest_on_data_for_the_drives_ends_the_connection() {
        let mut io = Bed::io_queue(both());
        let sqe = io.io(WRITE, 0, 8, 4096);
        io.capsule_whole(&sqe, &[]);
        let Some(Got::R2T(r2t)) = io.take().first().map(|g| g.clone_r2t()) else {
            panic!("an R2T");
        };
        let mut pdu = h2c_pdu(sqe.cid(), r2t.ttag, 0, &[7; 4096], true, both());
        let n = pdu.len();
        pdu[n - 1] ^= 1;
        io.send_whole(&pdu);
        assert!(matches!(io.take().last(), Some(Got::Term(1, 0))));
        assert_eq!(io.backend.buffers_held(), 0);
        assert!(io.conn.finished().is_some());
        assert!(io.backend.namespaces[0][..4096].iter().all(|&b| b == 0));
    }

    #[test]
    fn a_host_that_vanishes_mid_write_gives_every_buffer_back() {
        let mut io = Bed::io_queue(Digests::default());
        let sqe = io.io(WRITE, 0, 16, 8192);
        io.capsule(&sqe, &[]);
        assert!(matches!(io.take()[..], [Got::R2T(_)]));
        assert_eq!(io.backend.buffers_held(), 1);
        io.conn.peer_gone("reset by peer", &mut io.backend);
        assert_eq!(io.backend.buffers_held(), 0);
        assert!(io.conn.finished().is_some());
    }

    #[test]
    fn mutated_io_streams_never_panic_and_give_every_buffer_back() {
        let seed = std::env::var("USNVME_STRESS_SEED")
            .ok()
            .and_then(|s| s.parse().ok())
            .unwrap_or(11);
        let rounds = std::env::var("USNVME_STRESS_ROUNDS")
            .ok()
            .and_then(|s| s.parse().ok())
            .unwrap_or(150);
        let mut rng = fastrand::Rng::with_seed(seed);
        for _ in 0..rounds {
            let digests = Digests {
                header: rng.bool(),
                data: rng.bool(),
            };
            let mut io = Bed::io_queue(digests);
            // a valid stream of writes (in-capsule and R2T, whose TTAG is the slot the
            // command gets: the lowest free one) and reads...
            let mut stream = Vec::new();
            for i in 0..rng.usize(1..12) {
                let cid = i as u16;
                let blocks = rng.u32(1..17);
                let slba = rng.u64(0..2000);
                let len = blocks * 512;
                let data: Vec<u8> = (0..len).map(|_| rng.u8(..)).collect();
                let mut push_capsule = |sqe: &Sqe, data: &[u8]| {
                    let h = OutHeader::capsule_cmd(sqe, data.len(), digests);
                    stream.extend_from_slice(h.as_slice());
                    stream.resize(stream.len() + h.pad(), 0);
                    stream.extend_from_slice(data);
                    if digests.data && !data.is_empty() {
                        stream.extend_from_slice(&pdu::crc32c(data).to_le_bytes());
                    }
                };
                match rng.u8(0..3) {
                    0 => {
                        let mut sqe = io.io(WRITE, slba, blocks, 0);
                        sqe.set_cid(cid);
                        push_capsule(&sqe, &data);
                    }
                    1 => {
                        let mut sqe = io.io(WRITE, slba, blocks, len);
                        sqe.set_cid(cid);
                        push_capsule(&sqe, &[]);
                        stream.extend(h2c_pdu(cid, 0, 0, &data, true, digests));
                    }
                    _ => {
                        let mut sqe = io.io(READ, slba, blocks, len);
                        sqe.set_cid(cid);
                        push_capsule(&sqe, &[]);
                    }
                }
            }
            // ...with a few bytes changed, fed in pieces of any size
            for _ in 0..rng.usize(0..4) {
                let at = rng.usize(0..stream.len());
                stream[at] ^= 1 << rng.u8(0..8);
            }
            let mut rest = &stream[..];
            while !rest.is_empty() {
                let piece = rng.usize(1..=rest.len().min(9000));
                let n = io.conn.receive(&rest[..piece], &mut io.backend);
                if n == 0 {
                    break; // closing (or paused: the stream is over anyway)
                }
                rest = &rest[n..];
                if rng.bool() {
                    io.backend.complete_all(&mut io.conn);
                }
                if rng.bool() {
                    io.take();
                }
            }
            io.conn.peer_gone("the stream ended", &mut io.backend);
            io.backend.complete_all(&mut io.conn);
            assert_eq!(
                io.backend.buffers_held(),
                0,
                "seed {seed}: every buffer back"
            );
            assert!(io.conn.finished().is_some(), "seed {seed}: drained");
        }
    }

    #[test]
    fn random_bytes_never_panic_and_leave_nothing_held() {
        let mut rng = fastrand::Rng::with_seed(7);
        for _ in 0..300 {
            let len = rng.usize(0..600);
            let mut bytes: Vec<u8> = (0..len).map(|_| rng.u8(..)).collect();
            // often start with a valid ICReq, so the fuzz reaches past it
            if rng.bool() {
                let ic = IcReq {
                    pfv: 0,
                    hpda: 0,
                    digests: Digests::default(),
                    maxr2t: 0,
                };
                let mut v = vec![0, 0, 0, 0];
                v.extend_from_slice(&ic.encode());
                v.extend_from_slice(&bytes);
                bytes = v;
            }
            super::super::memory::fuzz_connection(&bytes);
        }
    }
}
