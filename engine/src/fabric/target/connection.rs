//! One NVMe/TCP connection of the target: PDUs in, commands out to the block devices (through
//! a [`Backend`]), responses back. No socket here: the caller feeds received bytes to
//! [`Connection::receive`] and writes [`Connection::outgoing`], so tests and the fuzzer drive
//! the same state machine the reactors do.
//!
//! A connection is set up by ICReq/ICResp, then a Fabrics Connect makes it an admin queue
//! (which creates a controller) or an I/O queue (of an existing controller). Everything the
//! peer sends is checked before it is trusted; a malformed PDU ends the connection with a
//! C2HTermReq naming the field, and the commands in flight are drained (their buffers given
//! back) before the connection is dropped. Memory is bounded by what the target advertises:
//! queue entries, in-capsule size and MAXH2CDATA.

use std::sync::Arc;
use std::time::{Duration, Instant};

use usnvme_driver::spec::{Cqe, Sqe, Status};

use super::admin::{self, ConnectData, FabricsCommand, Features};
use super::registry::{Controller, Registry};
use super::SubsystemInfo;
use crate::block::Op;
use crate::fabric::pdu::{
    self, flags, CommonHeader, DataHeader, Digests, FatalError, IcReq, IcResp, Limits, OutHeader,
    PduType, COMMON_HEADER, DIGEST, PFV_1_0,
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
/// Admin opcodes handled by the connection itself (the rest go to [`admin`]).
const ASYNC_EVENT_REQUEST: u8 = 0x0c;
const KEEP_ALIVE: u8 = 0x18;

/// SGL descriptor types in a command capsule: data in the capsule at an offset, or data the
/// transport moves (R2T/H2CData for writes, C2HData for reads).
const SGL_IN_CAPSULE: u8 = 0x01;
const SGL_TRANSPORT: u8 = 0x5a;

/// What the drives under the target do for a connection. Tokens are the connection's own
/// (one per command slot); the caller maps them to its block devices' tokens.
pub trait Backend {
    /// A buffer of `len` bytes for command `token`'s data; false when none is free now (the
    /// command then fails with "Namespace Not Ready"-like busy status and the host retries).
    fn reserve(&mut self, token: u16, len: usize) -> bool;
    /// The host's data for a write, at `offset` of the command's buffer.
    fn fill(&mut self, token: u16, offset: usize, bytes: &[u8]);
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
    /// A read's data, from `offset` of the command's buffer, into `dst`.
    fn copy_out(&mut self, token: u16, offset: usize, dst: &mut [u8]);
    /// The command is done with its buffer.
    fn release(&mut self, token: u16);
    /// SMART / Health of the drives under the subsystem, aggregated.
    fn smart(&mut self) -> usnvme_driver::spec::SmartLog;
}

/// The limits this target advertises and enforces on every connection.
#[derive(Debug, Clone, Copy)]
pub struct ConnectionLimits {
    /// Most data in one H2CData PDU.
    pub maxh2cdata: u32,
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
        last_keep_alive: Instant,
    },
    Io {
        controller: Arc<Controller>,
        qid: u16,
    },
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
    /// Backend completions still to come (a Dataset Management command has one per range).
    pending: u16,
    /// The first failure among its parts.
    failed: Option<Status>,
}

/// The state machine of one connection.
pub struct Connection {
    phase: Phase,
    digests: Digests,
    /// The host's PDU data alignment (HPDA), dwords, 0's based.
    host_alignment: u8,
    role: Role,
    subsystem: Arc<SubsystemInfo>,
    registry: Arc<Registry>,
    limits: ConnectionLimits,
    /// Received bytes not yet consumed (at most one PDU).
    rx: Vec<u8>,
    rx_capacity: usize,
    /// Bytes to send, from `tx_sent` on.
    tx: Vec<u8>,
    tx_sent: usize,
    slots: Box<[Slot]>,
    in_flight: usize,
    /// Why the connection ends, once it does.
    closed: Option<String>,
    peer: String,
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
        subsystem: Arc<SubsystemInfo>,
        registry: Arc<Registry>,
        limits: ConnectionLimits,
        peer: String,
    ) -> Connection {
        let data = (subsystem.in_capsule_bytes.max(limits.maxh2cdata) as usize).max(1024);
        // a header with its digest, padding up to the largest PDO, data and its digest
        let rx_capacity = pdu::MAX_HEADER + 256 + data + DIGEST;
        Connection {
            phase: Phase::AwaitIcReq,
            digests: Digests::default(),
            host_alignment: 0,
            role: Role::None,
            slots: vec![Slot::default(); subsystem.queue_entries as usize].into_boxed_slice(),
            subsystem,
            registry,
            limits,
            rx: Vec::with_capacity(rx_capacity),
            rx_capacity,
            tx: Vec::with_capacity(64 << 10),
            tx_sent: 0,
            in_flight: 0,
            closed: None,
            peer,
        }
    }

    /// Bytes waiting to be sent.
    pub fn outgoing(&self) -> &[u8] {
        &self.tx[self.tx_sent..]
    }

    /// `n` bytes of [`Self::outgoing`] were sent.
    pub fn sent(&mut self, n: usize) {
        self.tx_sent = (self.tx_sent + n).min(self.tx.len());
        if self.tx_sent == self.tx.len() {
            self.tx.clear();
            self.tx_sent = 0;
        }
    }

    /// Why the connection is over, once it is and everything queued was sent and every
    /// command drained: the caller then closes the socket and drops the connection.
    pub fn finished(&self) -> Option<&str> {
        let drained = self.in_flight_submitted() == 0 && self.outgoing().is_empty();
        match &self.closed {
            Some(why) if drained => Some(why),
            _ => None,
        }
    }

    /// Commands handed to the backend whose completion has not come back yet.
    pub fn in_flight_submitted(&self) -> usize {
        self.slots.iter().filter(|s| s.busy && s.submitted).count()
    }

    /// The host went away (connection reset, EOF): nothing more is sent; what the backend
    /// holds is drained as it completes.
    pub fn peer_gone(&mut self, why: &str, backend: &mut dyn Backend) {
        self.close(why.to_string(), backend);
        self.tx.clear();
        self.tx_sent = 0;
    }

    /// Feeds received bytes; returns how many were taken (fewer than given only when the
    /// connection is closing).
    pub fn receive(&mut self, mut input: &[u8], backend: &mut dyn Backend) -> usize {
        let given = input.len();
        while !input.is_empty() && self.phase != Phase::Closing {
            let want = self.bytes_wanted();
            let take = want.saturating_sub(self.rx.len()).min(input.len());
            self.rx.extend_from_slice(&input[..take]);
            input = &input[take..];
            if self.rx.len() < want {
                continue;
            }
            if let Err(e) = self.process(backend) {
                self.terminate(e, backend);
            }
        }
        given - input.len()
    }

    /// How many bytes the PDU being received has in all, as far as known: the common header
    /// first, then all of it once the header says how long it is.
    fn bytes_wanted(&self) -> usize {
        if self.rx.len() < COMMON_HEADER {
            return COMMON_HEADER;
        }
        let plen = u32::from_le_bytes([self.rx[4], self.rx[5], self.rx[6], self.rx[7]]);
        // an oversized PLEN is refused in `process`, before anything more is read
        (plen as usize).clamp(COMMON_HEADER, self.rx_capacity)
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

    /// One PDU is in `rx` (or its common header, if that already fails).
    fn process(&mut self, backend: &mut dyn Backend) -> Result<(), FatalError> {
        let common: &[u8; COMMON_HEADER] = self.rx[..COMMON_HEADER]
            .try_into()
            .map_err(|_| FatalError::Sequence("short header"))?;
        let header = CommonHeader::parse(common, RECEIVED)?;
        let layout = header.layout(&self.limits_now())?;
        if self.rx.len() < header.plen as usize {
            return Ok(()); // (only while the common header alone was read)
        }
        if header.plen as usize > self.rx_capacity {
            return Err(FatalError::DataLimitExceeded("PDU longer than advertised"));
        }
        match (self.phase, header.pdu_type) {
            (Phase::AwaitIcReq, PduType::IcReq) => {}
            (Phase::AwaitIcReq, _) => return Err(FatalError::Sequence("ICReq expected first")),
            (_, PduType::IcReq) => return Err(FatalError::Sequence("a second ICReq")),
            _ => {}
        }
        let hlen = header.pdu_type.header_len();
        if layout.header_bytes > hlen {
            pdu::check_header_digest(&self.rx[..layout.header_bytes], hlen)?;
        }
        let data_at = layout.header_bytes + layout.pad;
        let data_end = data_at + layout.data;
        if layout.data_digest {
            let want = pdu::crc32c(&self.rx[data_at..data_end]);
            let got = self.rx[data_end..data_end + DIGEST]
                .try_into()
                .map(u32::from_le_bytes)
                .map_err(|_| FatalError::Sequence("short data digest"))?;
            if want != got {
                // A data digest error fails the command, not the connection (NVMe/TCP 3.6.1.3):
                // here it ends the connection too, which the host recovers from by reconnecting.
                return Err(FatalError::field(0, "data digest"));
            }
        }
        let result = match header.pdu_type {
            PduType::IcReq => self.on_ic_req(),
            PduType::H2CTermReq => {
                let (fes, fei) = pdu::parse_term_req(&self.rx).unwrap_or((0, 0));
                self.close(
                    format!("the host terminated the connection (FES {fes}, FEI {fei})"),
                    backend,
                );
                Ok(())
            }
            PduType::CapsuleCmd => self.on_capsule(data_at, layout.data, backend),
            PduType::H2CData => self.on_h2c_data(data_at, layout.data, backend),
            _ => Err(FatalError::field(0, "PDU-Type")),
        };
        self.rx.clear();
        result
    }

    fn on_ic_req(&mut self) -> Result<(), FatalError> {
        let req = IcReq::parse(&self.rx)?;
        self.digests = req.digests;
        self.host_alignment = req.hpda;
        self.phase = Phase::Ready;
        let resp = IcResp {
            pfv: PFV_1_0,
            cpda: 0,
            digests: req.digests,
            maxh2cdata: self.limits.maxh2cdata,
        };
        self.tx.extend_from_slice(&resp.encode());
        Ok(())
    }

    fn on_capsule(
        &mut self,
        data_at: usize,
        data_len: usize,
        backend: &mut dyn Backend,
    ) -> Result<(), FatalError> {
        let sqe_bytes: &[u8; 64] = self.rx[8..72]
            .try_into()
            .map_err(|_| FatalError::field(2, "HLEN"))?;
        let sqe = Sqe::from_bytes(sqe_bytes);
        let cid = (sqe.cdw0 >> 16) as u16;
        let opcode = sqe.cdw0 as u8;
        let sgl_type = sqe.as_bytes()[39];
        let sgl_len = sqe.prp2 as u32; // dword 8 of the SGL: its length
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
        let data = data_at..data_at + data_len;
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
                events: Vec::new(),
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
        let discovery = controller.discovery();
        let cntlid = controller.cntlid();
        // Any admin command shows the host is there (the Keep Alive timer is traffic based);
        // the association ends only after twice KATO without one, so a host that sends its
        // Keep Alive every KATO is never cut off by scheduling jitter.
        *last_keep_alive = Instant::now();
        let result: Result<(u32, Vec<u8>), Status> = match opcode {
            KEEP_ALIVE => Ok((0, Vec::new())),
            ASYNC_EVENT_REQUEST => {
                if events.len() >= admin::ASYNC_EVENT_LIMIT {
                    Err(Status::AER_LIMIT_EXCEEDED)
                } else {
                    events.push(cid);
                    return; // held until an event, or the controller goes away
                }
            }
            _ => admin::execute(
                &self.subsystem,
                cntlid,
                discovery,
                features,
                sqe,
                &mut || backend.smart(),
            ),
        };
        match result {
            Ok((dw0, data)) if data.is_empty() => self.respond(cid, dw0, Status::SUCCESS),
            Ok((dw0, data)) => {
                let asked = sqe.prp2 as u32 as usize; // the transport SGL's length
                let len = data.len().min(asked);
                self.send_data(cid, &data[..len]);
                self.respond(cid, dw0, Status::SUCCESS);
            }
            Err(status) => self.respond(cid, 0, status),
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
        let Some(token) = self.slots.iter().position(|s| !s.busy) else {
            // more commands than the queue has entries: the host broke SQ flow control
            return Err(FatalError::Sequence(
                "more commands in flight than queue entries",
            ));
        };
        let token = token as u16;
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
        self.slots[token as usize] = Slot {
            busy: true,
            cid,
            ns,
            op: Some(op),
            offset,
            len,
            received: 0,
            submitted: false,
            pending: 1,
            failed: None,
        };
        self.in_flight += 1;
        if op == Op::Write {
            if data.is_empty() {
                // ask for all of it at once; the host sends it in PDUs of MAXH2CDATA at most
                let r2t = DataHeader {
                    cccid: cid,
                    ttag: token,
                    offset: 0,
                    length: len,
                };
                self.tx
                    .extend_from_slice(OutHeader::r2t(&r2t, self.digests).as_slice());
                return Ok(());
            }
            backend.fill(token, 0, &self.rx[data]);
            self.slots[token as usize].received = len;
        }
        self.submit(token, backend);
        Ok(())
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

    fn on_h2c_data(
        &mut self,
        data_at: usize,
        data_len: usize,
        backend: &mut dyn Backend,
    ) -> Result<(), FatalError> {
        let d = DataHeader::parse(&self.rx)?;
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
        let last = self.rx[1] & flags::LAST_PDU != 0;
        if last != (end == slot.len) {
            return Err(FatalError::field(1, "FLAGS (LAST_PDU)"));
        }
        backend.fill(
            d.ttag,
            d.offset as usize,
            &self.rx[data_at..data_at + data_len],
        );
        self.slots[d.ttag as usize].received = end;
        if last {
            self.submit(d.ttag, backend);
        }
        Ok(())
    }

    /// A command handed to the backend finished.
    pub fn complete(&mut self, token: u16, result: Result<(), Status>, backend: &mut dyn Backend) {
        let Some(slot) = self.slots.get(token as usize).copied() else {
            return;
        };
        if !slot.busy || !slot.submitted {
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
            let len = slot.len as usize;
            self.send_c2h(slot.cid, len, |dst| backend.copy_out(token, 0, dst));
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
        if self.closed.is_none() {
            self.respond(slot.cid, 0, status);
        }
    }

    /// Sends admin data to the host.
    fn send_data(&mut self, cid: u16, data: &[u8]) {
        self.send_c2h(cid, data.len(), |dst| dst.copy_from_slice(data));
    }

    /// One C2HData PDU (the last of its command) of `len` bytes for command `cid`, whose data
    /// `fill` writes in place in the transmit buffer.
    fn send_c2h(&mut self, cid: u16, len: usize, fill: impl FnOnce(&mut [u8])) {
        let d = DataHeader {
            cccid: cid,
            ttag: 0,
            offset: 0,
            length: len as u32,
        };
        let header = OutHeader::data(
            PduType::C2HData,
            &d,
            flags::LAST_PDU,
            self.digests,
            self.host_alignment,
        );
        self.tx.extend_from_slice(header.as_slice());
        self.tx.resize(self.tx.len() + header.pad(), 0);
        let at = self.tx.len();
        self.tx.resize(at + len, 0);
        fill(&mut self.tx[at..]);
        if self.digests.data {
            let digest = pdu::crc32c(&self.tx[at..]);
            self.tx.extend_from_slice(&digest.to_le_bytes());
        }
    }

    fn respond(&mut self, cid: u16, dw0: u32, status: Status) {
        let sqid = match &self.role {
            Role::Io { qid, .. } => *qid,
            _ => 0,
        };
        let cqe = Cqe::new(dw0, 0, sqid, cid, status, false);
        self.tx
            .extend_from_slice(OutHeader::capsule_resp(&cqe, self.digests).as_slice());
    }

    fn respond64(&mut self, cid: u16, value: u64, status: Status) {
        let mut cqe = Cqe::new(value as u32, 0, 0, cid, status, false);
        cqe.dw1 = (value >> 32) as u32;
        self.tx
            .extend_from_slice(OutHeader::capsule_resp(&cqe, self.digests).as_slice());
    }

    fn complete_events(&mut self, status: Status) {
        let held = match &mut self.role {
            Role::Admin { events, .. } => std::mem::take(events),
            _ => return,
        };
        for cid in held {
            self.respond(cid, 0, status);
        }
    }

    /// Timers: an admin queue whose host sent no Keep Alive within KATO ends its association;
    /// an I/O queue of a controller that went away ends too. Call every few milliseconds.
    pub fn tick(&mut self, now: Instant, backend: &mut dyn Backend) {
        let why = match &self.role {
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
        };
        if let Some(why) = why {
            if self.closed.is_none() {
                log::warn!("{}: {why}: closing", self.peer);
            }
            self.close(why, backend);
        }
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
        let header_len = self.rx.len().min(pdu::TERM_REQ_MAX_DATA);
        let term = pdu::term_req(PduType::C2HTermReq, &error, &self.rx[..header_len]);
        self.tx.extend_from_slice(&term);
        self.rx.clear();
        self.close(format!("protocol error: {error}"), backend);
    }
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
            let out = self.conn.outgoing().to_vec();
            self.conn.sent(out.len());
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
            let mut sqe = Sqe::new(FABRICS);
            let b: &mut [u8; 64] = zerocopy::IntoBytes::as_mut_bytes(&mut sqe)
                .try_into()
                .unwrap();
            b[4] = 0x01;
            b[42..44].copy_from_slice(&qid.to_le_bytes());
            b[44..46].copy_from_slice(&15u16.to_le_bytes());
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
