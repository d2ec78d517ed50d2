//! One NVMe/TCP connection of the target: PDUs in, commands out to the block devices (through
//! a [`Backend`]), responses back. No socket here: the caller hands it a byte source and sink
//! ([`ReadWire`](crate::fabric::framing::socket::ReadWire) / [`WriteWire`](crate::fabric::framing::socket::WriteWire): the socket,
//! or memory in tests and the fuzzer), so tests and the fuzzer drive the same state machine
//! the reactors do.
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
//!
//! The connection's state is here; what it does is in one file per concern: `receive` (PDUs
//! in through the shared [`framing`](crate::fabric::framing): where data goes, dispatch),
//! `transmit` (responses, R2Ts, C2HData out through it), `fabrics` (ICReq,
//! Connect, properties, Disconnect), `admin_queue` (Keep Alive, events, SMART from the drives),
//! `io_queue` (the NVM commands and their data), `shutdown` (CC.SHN, the timers, and how a
//! connection ends).

mod admin_queue;
mod fabrics;
mod io_queue;
pub mod rdma;
mod receive;
mod shutdown;
mod transmit;

use std::sync::Arc;
use std::time::Instant;

use usnvme_driver::spec::{SmartLog, Sqe, Status};
use vm_memory::VolatileSlice;

use super::admin::{self, Features};
use super::registry::{Controller, Registry};
use super::{Listener, SubsystemInfo, Subsystems};
use crate::block::Op;
use crate::fabric::framing::{Receiver, Transmitter};
use crate::fabric::pdu::{self, Digests, DIGEST, SHORT_HEADER};
pub use shutdown::{ICREQ_TIMEOUT, STALL_TIMEOUT};
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
    /// A buffer of `len` bytes (at most the subsystem's largest transfer) for command
    /// `token`'s data; false when none can be had now: the command then waits
    /// ([`Backend::wait`]).
    fn reserve(&mut self, token: u16, len: usize) -> bool;
    /// Command `token`'s buffer (at least the `len` bytes reserved): a write's data is received
    /// into it and a read's data sent from it, in place.
    fn buffer(&self, token: u16) -> Option<VolatileSlice<'_>>;
    /// Starts `request` for command `token`; the result comes back through
    /// [`Connection::complete`]. [`Refused::Busy`] when the device has no room now: the
    /// command then waits ([`Backend::wait`]).
    fn submit(&mut self, token: u16, request: Request) -> Result<(), Refused>;
    /// Command `token` cannot go on now (no buffer, or no room in its device's queue): it
    /// waits behind those that came before it, until the backend's retry pass moves it on with
    /// [`Connection::resume`].
    fn wait(&mut self, token: u16);
    /// The command is done with its buffer.
    fn release(&mut self, token: u16);
    /// Starts reading SMART / Health of the drives under the subsystem (aggregated) where it
    /// does not hold up the reactor; false when it cannot be asked for now (asked again later).
    fn smart_request(&mut self) -> bool;
    /// The answer to the request, once it is there (taken once).
    fn smart_answer(&mut self) -> Option<SmartLog>;
}

/// Why the backend did not start a request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Refused {
    /// No room in the device's queue now: the command waits and is tried again.
    Busy,
    /// It failed for good, with this status.
    Failed(Status),
}

/// What a command (or one part of it) asks of the drives: `op` on block device `device` (the
/// namespace's [`ExportedNamespace::device`](super::ExportedNamespace)), `len` bytes at byte
/// `offset` (0 and 0 for a Flush).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Request {
    pub device: usize,
    pub op: Op,
    pub offset: u64,
    pub len: u64,
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
        /// Get Log Page (SMART) commands waiting for the drives' answer, and whether it is
        /// asked for.
        smart_waiting: Vec<Sqe>,
        smart_asked: bool,
        /// The last sign of the host: an admin command, or I/O on one of the controller's
        /// queues (`Controller::io_traffic`, last seen as `io_traffic_seen`).
        last_keep_alive: Instant,
        io_traffic_seen: u64,
    },
    Io {
        controller: Arc<Controller>,
        qid: u16,
        /// `sq_taken` at the last tick: more since means traffic to report.
        taken_at_tick: u32,
    },
}

/// One command in flight on this connection.
#[derive(Debug, Clone, Copy, Default)]
struct Slot {
    busy: bool,
    cid: u16,
    /// The block device (see [`Request::device`]): kept by device, not by the namespace's
    /// place in the list, which a namespace removed meanwhile would shift.
    device: usize,
    op: Option<Op>,
    offset: u64,
    len: u32,
    /// Write data received so far (R2T transfers).
    received: u32,
    /// It holds a buffer of the backend's.
    buffered: bool,
    /// Its in-capsule data (write data) waits in the holding area for a buffer.
    held: bool,
    /// It waits in the backend's queue (for a buffer, or room in its device's queue).
    waiting: bool,
    /// Its requests to the backend: one; a Dataset Management's one per range; a shutdown's
    /// one per namespace. Started so far, and not completed yet (started or not).
    parts: u16,
    started: u16,
    pending: u16,
    /// Some part was handed to the backend (a reply is owed when they complete).
    submitted: bool,
    /// Completed and answered; its data is still being sent from its buffer.
    sending: bool,
    /// The first failure among its parts.
    failed: Option<Status>,
    /// The Flushes of a shutdown (CC.SHN), not a command of the host's.
    shutdown_flush: bool,
    /// Over NVMe/RDMA: the host's buffer of its data (a Keyed SGL).
    remote: rdma::Keyed,
}

/// An I/O queue's in-capsule data (write data, Dataset Management ranges) of commands that wait
/// for a buffer or room: a place of IOCCSZ bytes per command slot, in an anonymous mapping made
/// at Connect, whose pages the kernel gives only when a command is held there (and takes back
/// with the connection).
#[derive(Debug)]
struct Holding {
    region: vm_memory::mmap::MmapRegion,
    stride: usize,
}

impl Holding {
    fn new(slots: usize, stride: u32) -> Option<Holding> {
        let stride = stride as usize;
        let region = vm_memory::mmap::MmapRegion::new(slots * stride).ok()?;
        Some(Holding { region, stride })
    }

    /// `len` bytes at `offset` of command `token`'s place.
    fn place(&self, token: u16, offset: usize, len: usize) -> Option<VolatileSlice<'_>> {
        use vm_memory::VolatileMemory;
        if offset + len > self.stride {
            return None;
        }
        let at = token as usize * self.stride + offset;
        self.region.get_slice(at, len).ok()
    }
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
    /// The target's subsystems, and the one this connection's Connect named (until then, and
    /// for a discovery controller, the target's own description).
    subsystems: Arc<Subsystems>,
    subsystem: Arc<SubsystemInfo>,
    registry: Arc<Registry>,
    limits: ConnectionLimits,
    /// PDUs in: headers and what the connection keeps whole, write data into the commands'
    /// buffers.
    rx: Receiver<receive::DataInto>,
    /// PDUs in a row without data for the drives (saturating): headers are read ahead in
    /// batches from [`QUIET_BEFORE_READ_AHEAD`] on.
    quiet: u16,
    /// R2Ts whose data has not all come: the next PDU may be an H2CData (a short header).
    r2t_open: u16,
    /// In-capsule write data copied from the receive buffer into a DMA buffer (the buffer
    /// could not be had when its header came).
    copied: u64,
    /// PDUs out: headers and the connection's own data, read data from the commands' buffers
    /// (data segments name the command's token).
    tx: Transmitter<u16>,
    slots: Box<[Slot]>,
    in_flight: usize,
    /// An I/O queue's in-capsule data of commands that wait (made at Connect).
    holding: Option<Holding>,
    /// Where an admin command's answer (Identify, a log page) is built, then copied to `tx`.
    admin_data: Box<[u8]>,
    /// Why the connection ends, once it does.
    closed: Option<String>,
    peer: String,
    /// The port the host reached (the discovery log describes it).
    port: Listener,
    /// Bytes received so far ([`Receiver::received`]), when `tick` last saw that count change
    /// (or the connection open): a host that leaves a PDU half sent, or never sends its ICReq,
    /// is found by it.
    progress: Option<(u64, Instant)>,
    /// When `tick` first saw the connection.
    opened: Option<Instant>,
    /// Over NVMe/RDMA: what it asks of its queue pair (see [`rdma`]); None over TCP.
    rdma: Option<rdma::RdmaLink>,
}

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
        subsystems: Arc<Subsystems>,
        registry: Arc<Registry>,
        limits: ConnectionLimits,
        peer: String,
    ) -> Connection {
        let subsystem = subsystems.base.clone();
        // What the connection keeps whole: a header with its digest, padding up to the
        // largest PDO, in-capsule data for itself (Connect, ranges) and its digest.
        let own_data = (subsystem.in_capsule_bytes as usize).max(1024);
        let rx_capacity = pdu::MAX_HEADER + 256 + own_data + DIGEST;
        let entries = subsystem.queue_entries as usize;
        let tx_capacity = TX_HIGH_WATER + TX_PER_PDU + entries * TX_PER_COMMAND;
        let port = subsystem.listeners.first().cloned().unwrap_or(Listener {
            address: std::net::SocketAddr::from(([0, 0, 0, 0], 0)),
            port_id: 1,
            transport: crate::fabric::address::Transport::Tcp,
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
            subsystems,
            subsystem,
            registry,
            limits,
            rx: Receiver::new(rx_capacity),
            quiet: 0,
            r2t_open: 0,
            copied: 0,
            // a data segment and the bytes after it per command, and a few more
            tx: Transmitter::new(tx_capacity, 2 * entries + 8),
            in_flight: 0,
            holding: None,
            admin_data: vec![0; admin::MAX_ADMIN_DATA].into_boxed_slice(),
            closed: None,
            peer,
            progress: None,
            opened: None,
            rdma: None,
        }
    }

    /// The target changed while it runs (a subsystem added or removed, namespaces or hosts of
    /// one changed): later commands see `subsystems`; those in flight go on to the devices they
    /// were sent to. A connection whose subsystem was removed keeps its last view of it until
    /// it closes (its controller went away with the subsystem).
    pub fn set_subsystems(&mut self, subsystems: Arc<Subsystems>) {
        let connected = match &self.role {
            Role::Admin { controller, .. } | Role::Io { controller, .. } => {
                (!controller.discovery()).then(|| controller.subnqn())
            }
            Role::None => None,
        };
        match connected {
            Some(nqn) => {
                if let Some(sub) = subsystems.find(nqn) {
                    self.subsystem = sub.clone();
                }
            }
            None => self.subsystem = subsystems.base.clone(),
        }
        self.subsystems = subsystems;
    }

    /// The connection came in on `port`, at its address (the connection's local one).
    pub fn on_port(mut self, port: Listener) -> Connection {
        self.port = port;
        self
    }

    /// Whether anything waits to be sent.
    pub fn has_outgoing(&self) -> bool {
        !self.tx.is_empty()
    }

    /// The transmit buffer's capacity and its segment queue's: preallocated, and they must
    /// not grow (tests check).
    pub fn tx_capacity(&self) -> (usize, usize) {
        self.tx.capacity()
    }

    /// Data bytes that were copied from the header buffer into a DMA buffer because they had
    /// been read ahead with a header (0 while the host sends only data PDUs).
    pub fn copied(&self) -> u64 {
        self.copied + self.rx.copied()
    }

    /// Why the connection is over, once it is and everything queued was sent and every
    /// command drained: the caller then closes the socket and drops the connection.
    pub fn finished(&self) -> Option<&str> {
        // (over RDMA, a read's buffer is free once its WRITE is over, which may come after)
        let drained = match self.rdma {
            Some(_) => self.in_flight == 0,
            None => self.in_flight_submitted() == 0 && self.tx.is_empty(),
        };
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
}

#[cfg(test)]
mod tests;
