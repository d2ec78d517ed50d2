//! The host side of NVMe/TCP: a small blocking client over [`TcpStream`], one queue per
//! connection and one command at a time. Tests of `usnvme serve` drive targets with it.
//!
//! The protocol logic has no socket in it: `Exchange` builds a command's PDUs into a byte
//! buffer and consumes the PDUs the target sends for it (C2HData into the caller's buffer,
//! R2T answered with H2CData), and `decode` checks a received PDU's digests and fields.
//! `Connection` only reads and writes whole PDUs, so a polled initiator can reuse the rest.
//!
//! Everything the target sends is checked before it is trusted; a malformed PDU ends the
//! connection with an H2CTermReq naming the field. A data digest mismatch fails only its
//! command: the command is drained, so the queue stays usable.

use std::io::{ErrorKind, Read, Write};
use std::net::{Shutdown, SocketAddr, TcpStream};
use std::time::{Duration, Instant};

use usnvme_driver::spec::{
    ConnectData, ConnectResponse, Cqe, PropertyCommand, PropertySize, SglDescriptor, Sqe, Status,
};

use super::pdu::{
    check_header_digest, crc32c, flags, parse_term_req, term_req, CommonHeader, DataHeader,
    Digests, FatalError, IcReq, IcResp, Layout, Limits, OutHeader, PduType, COMMON_HEADER, DIGEST,
    MAX_HEADER, PFV_1_0, SHORT_HEADER,
};

/// The fuzz target's entry point: target bytes through this module's checks.
pub mod fuzz;

// The Fabrics constants live in the driver's spec; the target imports this one from here.
pub(crate) use usnvme_driver::spec::fabrics::{CATTR_DISABLE_SQ_FLOW, CONNECT_DATA};

/// In-capsule data the admin queue takes (fixed by the NVMe/TCP transport, 8 KiB). I/O queues
/// take IOCCSZ * 16 - 64 bytes, which the caller learns from Identify Controller.
pub const ADMIN_IN_CAPSULE: usize = 8192;

/// Our data alignment (HPDA): none, so the target puts data right after the header.
pub(crate) const HPDA: u8 = 0;

/// PDU types the host receives before and after ICResp.
pub(crate) const SETUP: &[PduType] = &[PduType::IcResp, PduType::C2HTermReq];
pub(crate) const READY: &[PduType] = &[
    PduType::C2HTermReq,
    PduType::CapsuleResp,
    PduType::C2HData,
    PduType::R2T,
];

/// Who this host is and how it talks.
#[derive(Debug, Clone)]
pub struct HostOptions {
    /// Digests to ask for; the target must grant exactly these.
    pub digests: Digests,
    pub host_nqn: String,
    pub host_id: [u8; 16],
    /// Keep Alive Timeout for an admin queue, ms; 0 disables it (this client sends no Keep
    /// Alive by itself).
    pub kato_ms: u32,
    /// The longest the TCP connect, the connection set-up or one command may take.
    pub timeout: Duration,
}

/// A fixed host identity (a UUID NQN matching the host ID), no digests, no keep-alive.
impl Default for HostOptions {
    fn default() -> Self {
        HostOptions {
            digests: Digests::default(),
            host_nqn: "nqn.2014-08.org.nvmexpress:uuid:75736e76-6d65-4000-8000-686f73743031"
                .to_owned(),
            host_id: [
                0x75, 0x73, 0x6e, 0x76, 0x6d, 0x65, 0x40, 0x00, 0x80, 0x00, 0x68, 0x6f, 0x73, 0x74,
                0x30, 0x31,
            ],
            kato_ms: 0,
            timeout: Duration::from_secs(10),
        }
    }
}

/// Why a connection or a command failed.
#[derive(Debug, thiserror::Error)]
pub enum HostError {
    #[error("NVMe/TCP connection: {0}")]
    Io(#[from] std::io::Error),
    #[error("connection refused by {addr}: is a target listening there?")]
    Refused { addr: SocketAddr },
    #[error("timed out waiting for the target")]
    Timeout,
    #[error("the connection is closed (by the target, or after an earlier error)")]
    Closed,
    /// The target sent a malformed or unexpected PDU; we answered with an H2CTermReq.
    #[error("the target broke the NVMe/TCP protocol: {what}")]
    Protocol { what: FatalError },
    /// The target ended the connection with a C2HTermReq.
    #[error("the target ended the connection: C2HTermReq {} (FES {fes}, FEI {fei})", fes_name(*.fes))]
    Terminated { fes: u16, fei: u32 },
    /// A header digest mismatch ends the connection; a data digest mismatch fails the command.
    #[error("{} digest mismatch", if *.header { "header" } else { "data" })]
    Digest { header: bool },
    #[error("{command} failed: {name} (SCT {:#x}, SC {:#x})", .status.sct(), .status.sc())]
    Status {
        command: &'static str,
        name: &'static str,
        status: Status,
    },
    #[error("invalid argument: {0}")]
    InvalidArgument(&'static str),
}

impl HostError {
    /// A failed command; Fabrics commands give some command specific codes other meanings.
    pub(crate) fn status(command: &'static str, status: Status, fabrics: bool) -> HostError {
        let name = match status.alternate_name() {
            Some(name) if fabrics => name,
            _ => status.name(),
        };
        HostError::Status {
            command,
            name,
            status,
        }
    }

    /// Whether the connection can no longer be used after this error.
    fn is_fatal(&self) -> bool {
        !matches!(
            self,
            HostError::Digest { header: false }
                | HostError::Status { .. }
                | HostError::InvalidArgument(_)
        )
    }
}

fn fes_name(fes: u16) -> &'static str {
    match fes {
        1 => "Invalid PDU Header Field",
        2 => "PDU Sequence Error",
        3 => "Header Digest Error",
        4 => "Data Transfer Out of Range",
        5 => "Data Transfer Limit Exceeded",
        6 => "Unsupported Parameter",
        _ => "with an unknown status",
    }
}

fn field(offset: u32, field: &'static str) -> FatalError {
    FatalError::InvalidHeaderField { offset, field }
}

/// A command's data.
#[derive(Debug)]
pub enum Payload<'a> {
    None,
    /// Sent in the capsule when it fits the in-capsule size, else when the target asks (R2T).
    ToController(&'a [u8]),
    /// Filled by the target's C2HData PDUs.
    FromController(&'a mut [u8]),
}

impl Payload<'_> {
    fn len(&self) -> usize {
        match self {
            Payload::None => 0,
            Payload::ToController(d) => d.len(),
            Payload::FromController(d) => d.len(),
        }
    }
}

/// What ICReq/ICResp settled.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Negotiated {
    pub(crate) digests: Digests,
    pub(crate) maxh2cdata: u32,
}

/// Checks an ICResp against what we asked for.
pub(crate) fn check_ic_resp(resp: &IcResp, asked: Digests) -> Result<Negotiated, FatalError> {
    if resp.digests != asked {
        return Err(field(11, "DGST"));
    }
    // OutHeader::capsule_cmd puts in-capsule data right after the header; like Linux,
    // refuse a target that wants its data aligned.
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

/// Appends one PDU to `out`: header, padding up to PDO, data, data digest.
fn append_pdu(out: &mut Vec<u8>, header: &OutHeader, data: &[u8], digests: Digests) {
    out.extend_from_slice(header.as_slice());
    out.resize(out.len() + header.pad(), 0);
    out.extend_from_slice(data);
    if digests.data && !data.is_empty() {
        out.extend_from_slice(&crc32c(data).to_le_bytes());
    }
}

/// A received PDU: its header (with digest) and what follows it (pad, data, data digest).
#[derive(Debug)]
struct Pdu {
    common: CommonHeader,
    layout: Layout,
    header: [u8; MAX_HEADER],
    body: Vec<u8>,
}

impl Pdu {
    fn header(&self) -> &[u8] {
        self.header
            .get(..self.layout.header_bytes)
            .unwrap_or(&self.header)
    }
}

/// A received PDU, checked and decoded.
#[derive(Debug)]
enum Incoming<'a> {
    IcResp(IcResp),
    CapsuleResp(Cqe),
    C2HData {
        header: DataHeader,
        flags: u8,
        data: &'a [u8],
        /// The data digest matched (or none was negotiated).
        digest_ok: bool,
    },
    R2T(DataHeader),
    TermReq {
        fes: u16,
        fei: u32,
    },
}

/// Checks `pdu`'s header digest and fields and decodes it (its layout is already checked).
fn decode(pdu: &Pdu) -> Result<Incoming<'_>, FatalError> {
    let header = pdu.header();
    if pdu.common.flags & flags::HDGST != 0 {
        check_header_digest(header, pdu.common.hlen as usize)?;
    }
    Ok(match pdu.common.pdu_type {
        PduType::IcResp => Incoming::IcResp(IcResp::parse(header)?),
        PduType::CapsuleResp => Incoming::CapsuleResp(
            header
                .get(8..SHORT_HEADER)
                .and_then(Cqe::from_slice)
                .ok_or(field(2, "HLEN"))?,
        ),
        PduType::R2T => Incoming::R2T(DataHeader::parse(header)?),
        PduType::C2HTermReq => {
            let (fes, fei) = parse_term_req(header).ok_or(field(2, "HLEN"))?;
            Incoming::TermReq { fes, fei }
        }
        PduType::C2HData => {
            let d = DataHeader::parse(header)?;
            let Layout { pad, data, .. } = pdu.layout;
            let bytes = pdu.body.get(pad..pad + data).ok_or(field(4, "PLEN"))?;
            if d.length as usize != bytes.len() {
                return Err(field(16, "DATAL"));
            }
            let digest_ok = !pdu.layout.data_digest
                || pdu
                    .body
                    .get(pad + data..pad + data + DIGEST)
                    .and_then(|d| <[u8; DIGEST]>::try_from(d).ok())
                    .is_some_and(|d| u32::from_le_bytes(d) == crc32c(bytes));
            Incoming::C2HData {
                header: d,
                flags: pdu.common.flags,
                data: bytes,
                digest_ok,
            }
        }
        _ => return Err(field(0, "PDU-Type")),
    })
}

/// Where a command stands after a PDU.
#[derive(Debug)]
enum Progress {
    Pending,
    Done(Cqe),
}

/// The one command in flight: what it sends, what it expects, what has arrived.
#[derive(Debug)]
struct Exchange<'a> {
    cid: u16,
    qid: u16,
    payload: Payload<'a>,
    /// The data went in the capsule, so no R2T may come.
    in_capsule: bool,
    /// C2HData bytes received so far (they must come in order).
    received: usize,
    /// A C2HData's data digest did not match: the command is drained, then fails.
    corrupt: bool,
}

impl<'a> Exchange<'a> {
    /// Appends the CapsuleCmd for `sqe` to `out`, with the data in the capsule if it is to
    /// the controller and at most `in_capsule_limit` bytes.
    fn start(
        mut sqe: Sqe,
        cid: u16,
        qid: u16,
        payload: Payload<'a>,
        in_capsule_limit: usize,
        digests: Digests,
        out: &mut Vec<u8>,
    ) -> Result<Exchange<'a>, HostError> {
        let len = u32::try_from(payload.len())
            .map_err(|_| HostError::InvalidArgument("a command moves at most 4 GiB"))?;
        let in_capsule = match &payload {
            Payload::ToController(d) => !d.is_empty() && d.len() <= in_capsule_limit,
            _ => false,
        };
        sqe.set_cid(cid);
        sqe.set_sgl(if in_capsule {
            SglDescriptor::in_capsule(len)
        } else {
            SglDescriptor::transport(len)
        });
        let data = match &payload {
            Payload::ToController(d) if in_capsule => d,
            _ => &[][..],
        };
        append_pdu(
            out,
            &OutHeader::capsule_cmd(&sqe, data.len(), digests),
            data,
            digests,
        );
        Ok(Exchange {
            cid,
            qid,
            payload,
            in_capsule,
            received: 0,
            corrupt: false,
        })
    }

    /// The most data one PDU for this command may carry: what is left of a read.
    fn max_data(&self) -> u32 {
        match &self.payload {
            Payload::FromController(buf) => {
                u32::try_from(buf.len().saturating_sub(self.received)).unwrap_or(u32::MAX)
            }
            _ => 0,
        }
    }

    /// Consumes a PDU for this command; answers (H2CData) go to `out`.
    fn on_pdu(
        &mut self,
        pdu: Incoming<'_>,
        link: Negotiated,
        out: &mut Vec<u8>,
    ) -> Result<Progress, FatalError> {
        match pdu {
            Incoming::CapsuleResp(cqe) => {
                if cqe.cid != self.cid {
                    return Err(field(20, "CID"));
                }
                let missing = match &self.payload {
                    Payload::FromController(buf) => self.received < buf.len(),
                    _ => false,
                };
                if missing && cqe.status().is_success() {
                    return Err(FatalError::DataOutOfRange(
                        "command succeeded before all its data arrived",
                    ));
                }
                Ok(Progress::Done(cqe))
            }
            Incoming::C2HData {
                header,
                flags: f,
                data,
                digest_ok,
            } => {
                if header.cccid != self.cid {
                    return Err(field(8, "CCCID"));
                }
                let Payload::FromController(buf) = &mut self.payload else {
                    return Err(FatalError::Sequence(
                        "C2HData for a command that reads nothing",
                    ));
                };
                if header.offset as usize != self.received {
                    return Err(FatalError::DataOutOfRange("C2HData out of order"));
                }
                let end = self.received + data.len();
                let dst = buf
                    .get_mut(self.received..end)
                    .ok_or(FatalError::DataOutOfRange("C2HData beyond the buffer"))?;
                if digest_ok {
                    dst.copy_from_slice(data);
                } else {
                    self.corrupt = true;
                }
                self.received = end;
                let last = f & flags::LAST_PDU != 0;
                if last && end != buf.len() {
                    return Err(FatalError::DataOutOfRange(
                        "LAST_PDU before the end of the data",
                    ));
                }
                if f & flags::SUCCESS == 0 {
                    return Ok(Progress::Pending);
                }
                if !last {
                    return Err(field(1, "FLAGS (SUCCESS without LAST_PDU)"));
                }
                // The target skipped the CapsuleResp: this is the command's completion.
                let cqe = Cqe::new(0, 0, self.qid, self.cid, Status::SUCCESS, false);
                Ok(Progress::Done(cqe))
            }
            Incoming::R2T(r2t) => {
                if r2t.cccid != self.cid {
                    return Err(field(8, "CCCID"));
                }
                let Payload::ToController(data) = &self.payload else {
                    return Err(FatalError::Sequence(
                        "R2T for a command that writes nothing",
                    ));
                };
                if self.in_capsule {
                    return Err(FatalError::Sequence("R2T for data sent in the capsule"));
                }
                if r2t.length == 0 {
                    return Err(field(16, "R2TL"));
                }
                let start = r2t.offset as usize;
                let wanted = start
                    .checked_add(r2t.length as usize)
                    .and_then(|end| data.get(start..end))
                    .ok_or(FatalError::DataOutOfRange("R2T beyond the command's data"))?;
                self.answer_r2t(&r2t, wanted, link, out);
                Ok(Progress::Pending)
            }
            Incoming::IcResp(_) | Incoming::TermReq { .. } => {
                Err(FatalError::Sequence("PDU not expected during a command"))
            }
        }
    }

    /// H2CData PDUs of at most MAXH2CDATA bytes for the R2T's range; LAST_PDU on the last.
    fn answer_r2t(&self, r2t: &DataHeader, wanted: &[u8], link: Negotiated, out: &mut Vec<u8>) {
        let chunk = (link.maxh2cdata as usize).max(1);
        let count = wanted.len().div_ceil(chunk);
        for (i, piece) in wanted.chunks(chunk).enumerate() {
            let d = DataHeader {
                cccid: self.cid,
                ttag: r2t.ttag,
                // chunks of a u32-sized range: these fit in u32
                offset: r2t.offset + (i * chunk) as u32,
                length: piece.len() as u32,
            };
            let last = if i + 1 == count { flags::LAST_PDU } else { 0 };
            let h = OutHeader::data(PduType::H2CData, &d, last, link.digests, 0);
            append_pdu(out, &h, piece, link.digests);
        }
    }
}

/// The socket: whole PDUs in and out, each read bounded by a deadline.
#[derive(Debug)]
struct Connection {
    stream: TcpStream,
    /// None until ICResp is accepted.
    digests: Option<Digests>,
    closed: bool,
}

impl Connection {
    fn io(error: std::io::Error) -> HostError {
        match error.kind() {
            ErrorKind::WouldBlock | ErrorKind::TimedOut => HostError::Timeout,
            ErrorKind::UnexpectedEof => HostError::Closed,
            _ => HostError::Io(error),
        }
    }

    fn send(&mut self, bytes: &[u8]) -> Result<(), HostError> {
        self.stream.write_all(bytes).map_err(Self::io)
    }

    fn read_exact(&mut self, buf: &mut [u8], deadline: Instant) -> Result<(), HostError> {
        if buf.is_empty() {
            return Ok(());
        }
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return Err(HostError::Timeout);
        }
        self.stream.set_read_timeout(Some(left))?;
        self.stream.read_exact(buf).map_err(Self::io)
    }

    /// Reads one PDU of a type in `allowed` carrying at most `max_data` bytes of data.
    fn receive(
        &mut self,
        allowed: &[PduType],
        max_data: u32,
        deadline: Instant,
    ) -> Result<Pdu, HostError> {
        let mut common = [0u8; COMMON_HEADER];
        self.read_exact(&mut common, deadline)?;
        let limits = Limits {
            digests: self.digests,
            max_data,
            alignment: HPDA,
        };
        let checked =
            CommonHeader::parse(&common, allowed).and_then(|c| Ok((c, c.layout(&limits)?)));
        let (parsed, layout) = match checked {
            Ok(c) => c,
            Err(e) => return Err(self.abort(e, &common)),
        };
        let mut pdu = Pdu {
            common: parsed,
            layout,
            header: [0; MAX_HEADER],
            body: Vec::new(),
        };
        pdu.header[..COMMON_HEADER].copy_from_slice(&common);
        let Some(rest) = pdu.header.get_mut(COMMON_HEADER..layout.header_bytes) else {
            return Err(self.abort(field(2, "HLEN"), &common));
        };
        self.read_exact(rest, deadline)?;
        // bounded: the layout check capped the data at max_data, the padding at PDO
        pdu.body = vec![0; layout.rest()];
        self.read_exact(&mut pdu.body, deadline)?;
        Ok(pdu)
    }

    /// Tells the target why we give up (H2CTermReq with `offending`, the bad header) and
    /// stops using the connection.
    fn abort(&mut self, error: FatalError, offending: &[u8]) -> HostError {
        // best effort: the connection is being torn down anyway
        let _ = self
            .stream
            .write_all(&term_req(PduType::H2CTermReq, &error, offending));
        self.close();
        match error {
            FatalError::HeaderDigest => HostError::Digest { header: true },
            what => HostError::Protocol { what },
        }
    }

    fn close(&mut self) {
        // Shut down only our side: closing with unread bytes would reset the connection and
        // could lose the TermReq. The socket itself closes when the queue is dropped.
        let _ = self.stream.shutdown(Shutdown::Write);
        self.closed = true;
    }
}

/// One NVMe/TCP queue (admin or I/O) of a controller, connected and ready for commands.
#[derive(Debug)]
pub struct Queue {
    conn: Connection,
    link: Negotiated,
    qid: u16,
    cid: u16,
    in_capsule: usize,
    timeout: Duration,
}

impl Queue {
    /// Connects queue `qid` (0: admin) of `entries` entries to subsystem `subnqn` at `addr`:
    /// TCP, ICReq/ICResp, then Fabrics Connect. `cntlid` is 0xFFFF on an admin queue (the
    /// target picks one), the admin queue's controller on an I/O queue. Returns the queue
    /// and the controller ID.
    pub fn connect(
        addr: SocketAddr,
        subnqn: &str,
        qid: u16,
        entries: u16,
        cntlid: u16,
        opts: &HostOptions,
    ) -> Result<(Queue, u16), HostError> {
        if opts.timeout.is_zero() {
            return Err(HostError::InvalidArgument("the timeout must not be zero"));
        }
        let setup_deadline = deadline(opts.timeout)?;
        let data = connect_data(opts, cntlid, subnqn)?;
        let stream =
            TcpStream::connect_timeout(&addr, opts.timeout).map_err(|e| match e.kind() {
                ErrorKind::ConnectionRefused => HostError::Refused { addr },
                _ => Connection::io(e),
            })?;
        // commands are small PDUs we wait on: do not let Nagle hold them back
        stream.set_nodelay(true)?;
        stream.set_write_timeout(Some(opts.timeout))?;
        let mut conn = Connection {
            stream,
            digests: None,
            closed: false,
        };
        let link = initialize(&mut conn, opts.digests, setup_deadline)?;
        let mut queue = Queue {
            conn,
            link,
            qid,
            cid: 0,
            in_capsule: if qid == 0 { ADMIN_IN_CAPSULE } else { 0 },
            timeout: opts.timeout,
        };
        let kato = if qid == 0 { opts.kato_ms } else { 0 };
        let sqe = connect_command(qid, entries, kato);
        // Connect data always goes in the capsule, whatever the queue's in-capsule size.
        let cqe = queue.execute(sqe, Payload::ToController(data.as_bytes()), CONNECT_DATA)?;
        if !cqe.status().is_success() {
            return Err(HostError::status("Connect", cqe.status(), true));
        }
        let granted = if qid == 0 {
            ConnectResponse::from_cqe(&cqe).cntlid
        } else {
            cntlid
        };
        Ok((queue, granted))
    }

    /// Sets the in-capsule data size of an I/O queue (IOCCSZ * 16 - 64 from Identify
    /// Controller); larger writes wait for R2Ts.
    pub fn set_in_capsule_limit(&mut self, bytes: usize) {
        self.in_capsule = bytes;
    }

    /// The longest one command may take from now on.
    pub fn set_timeout(&mut self, timeout: Duration) {
        if !timeout.is_zero() {
            self.timeout = timeout;
        }
    }

    pub fn qid(&self) -> u16 {
        self.qid
    }

    /// The most data the target takes in one H2CData PDU.
    pub fn maxh2cdata(&self) -> u32 {
        self.link.maxh2cdata
    }

    /// Property Get: the controller register at `offset` (CAP, VS, CC, CSTS), 4 or 8 bytes.
    pub fn property_get(&mut self, offset: u32, eight_bytes: bool) -> Result<u64, HostError> {
        let size = property_size(eight_bytes);
        let cqe = self.execute(Sqe::property_get(offset, size), Payload::None, 0)?;
        if !cqe.status().is_success() {
            return Err(HostError::status("Property Get", cqe.status(), true));
        }
        Ok(PropertyCommand::value_of(&cqe, size))
    }

    /// Property Set: writes `value` to the controller register at `offset`.
    pub fn property_set(
        &mut self,
        offset: u32,
        eight_bytes: bool,
        value: u64,
    ) -> Result<(), HostError> {
        let sqe = Sqe::property_set(offset, property_size(eight_bytes), value);
        let cqe = self.execute(sqe, Payload::None, 0)?;
        if !cqe.status().is_success() {
            return Err(HostError::status("Property Set", cqe.status(), true));
        }
        Ok(())
    }

    /// A command that returns `data_in_len` bytes (Identify, Get Log Page, Get Features);
    /// check `cqe.status()`.
    pub fn admin(&mut self, sqe: Sqe, data_in_len: usize) -> Result<(Cqe, Vec<u8>), HostError> {
        let mut data = vec![0; data_in_len];
        let payload = if data_in_len == 0 {
            Payload::None
        } else {
            Payload::FromController(&mut data)
        };
        let cqe = self.command(sqe, payload)?;
        Ok((cqe, data))
    }

    /// Any command; its CID and SGL are filled in here. Check `cqe.status()`.
    pub fn command(&mut self, sqe: Sqe, payload: Payload<'_>) -> Result<Cqe, HostError> {
        self.execute(sqe, payload, self.in_capsule)
    }

    /// Reads `blocks` blocks (1..=65536) from `slba` into `buf` (blocks times the block size).
    pub fn read(
        &mut self,
        nsid: u32,
        slba: u64,
        blocks: u32,
        buf: &mut [u8],
    ) -> Result<(), HostError> {
        let cqe = self.command(Sqe::read(nsid, slba, blocks), Payload::FromController(buf))?;
        match cqe.status() {
            s if s.is_success() => Ok(()),
            s => Err(HostError::status("Read", s, false)),
        }
    }

    /// Writes `data` (`blocks` blocks, 1..=65536) at `slba`.
    pub fn write(
        &mut self,
        nsid: u32,
        slba: u64,
        blocks: u32,
        data: &[u8],
    ) -> Result<(), HostError> {
        let cqe = self.command(Sqe::write(nsid, slba, blocks), Payload::ToController(data))?;
        match cqe.status() {
            s if s.is_success() => Ok(()),
            s => Err(HostError::status("Write", s, false)),
        }
    }

    /// Closes the connection (no Fabrics Disconnect: closing the admin queue's connection ends
    /// the controller on the target anyway).
    pub fn disconnect(self) {
        let _ = self.conn.stream.shutdown(Shutdown::Both);
    }

    fn execute(
        &mut self,
        sqe: Sqe,
        payload: Payload<'_>,
        in_capsule_limit: usize,
    ) -> Result<Cqe, HostError> {
        if self.conn.closed {
            return Err(HostError::Closed);
        }
        let result = self.run(sqe, payload, in_capsule_limit);
        if result.as_ref().is_err_and(HostError::is_fatal) {
            self.conn.close();
        }
        result
    }

    /// Sends the command and feeds the target's PDUs to its exchange until it completes.
    fn run(
        &mut self,
        sqe: Sqe,
        payload: Payload<'_>,
        in_capsule_limit: usize,
    ) -> Result<Cqe, HostError> {
        let deadline = deadline(self.timeout)?;
        let cid = self.cid;
        self.cid = self.cid.wrapping_add(1);
        let digests = self.link.digests;
        let mut out = Vec::new();
        let mut exchange = Exchange::start(
            sqe,
            cid,
            self.qid,
            payload,
            in_capsule_limit,
            digests,
            &mut out,
        )?;
        self.conn.send(&out)?;
        loop {
            let pdu = self.conn.receive(READY, exchange.max_data(), deadline)?;
            let incoming = match decode(&pdu) {
                Ok(i) => i,
                Err(e) => return Err(self.conn.abort(e, pdu.header())),
            };
            if let Incoming::TermReq { fes, fei } = incoming {
                return Err(HostError::Terminated { fes, fei });
            }
            out.clear();
            match exchange.on_pdu(incoming, self.link, &mut out) {
                Err(e) => return Err(self.conn.abort(e, pdu.header())),
                Ok(Progress::Pending) => self.conn.send(&out)?,
                Ok(Progress::Done(_)) if exchange.corrupt => {
                    return Err(HostError::Digest { header: false })
                }
                Ok(Progress::Done(cqe)) => return Ok(cqe),
            }
        }
    }
}

fn deadline(timeout: Duration) -> Result<Instant, HostError> {
    Instant::now()
        .checked_add(timeout)
        .ok_or(HostError::InvalidArgument("the timeout is too long"))
}

/// ICReq out, ICResp in and checked.
fn initialize(
    conn: &mut Connection,
    digests: Digests,
    deadline: Instant,
) -> Result<Negotiated, HostError> {
    let req = IcReq {
        pfv: PFV_1_0,
        hpda: HPDA,
        digests,
        maxr2t: 0, // one R2T at a time per command
    };
    conn.send(&req.encode())?;
    let pdu = conn.receive(SETUP, 0, deadline)?;
    let link = decode(&pdu).and_then(|incoming| match incoming {
        Incoming::IcResp(resp) => check_ic_resp(&resp, digests).map(Ok),
        Incoming::TermReq { fes, fei } => Ok(Err(HostError::Terminated { fes, fei })),
        _ => Err(FatalError::Sequence("expected ICResp")),
    });
    match link {
        Ok(Ok(link)) => {
            conn.digests = Some(link.digests);
            Ok(link)
        }
        Ok(Err(e)) => {
            conn.close();
            Err(e)
        }
        Err(e) => Err(conn.abort(e, pdu.header())),
    }
}

fn property_size(eight_bytes: bool) -> PropertySize {
    if eight_bytes {
        PropertySize::Eight
    } else {
        PropertySize::Four
    }
}

/// Fabrics Connect: RECFMT 0, QID, SQSIZE (0's based), CATTR 0, KATO.
pub(crate) fn connect_command(qid: u16, entries: u16, kato_ms: u32) -> Sqe {
    Sqe::connect(qid, entries, 0, kato_ms)
}

/// The Connect data: host ID, controller ID, NUL-padded subsystem and host NQNs.
pub(crate) fn connect_data(
    opts: &HostOptions,
    cntlid: u16,
    subnqn: &str,
) -> Result<ConnectData, HostError> {
    ConnectData::new(opts.host_id, cntlid, subnqn, &opts.host_nqn)
        .map_err(|_| HostError::InvalidArgument("an NQN is at most 255 bytes, with no NUL"))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::net::TcpListener;
    use std::thread::JoinHandle;

    use crate::fabric::pdu::{Limits, CAPSULE_CMD_HEADER};
    use usnvme_driver::spec::fabrics::{
        FABRICS_OPCODE as FABRICS, FCTYPE_CONNECT, FCTYPE_PROPERTY_GET, FCTYPE_PROPERTY_SET,
        SGL_IN_CAPSULE, SGL_TRANSPORT,
    };

    const SUBNQN: &str = "nqn.2024-01.dev.usnvme:test";
    const TARGET_RECEIVES: &[PduType] = &[
        PduType::IcReq,
        PduType::H2CTermReq,
        PduType::CapsuleCmd,
        PduType::H2CData,
    ];
    const MAXH2CDATA: u32 = 8192;
    const BOTH: Digests = Digests {
        header: true,
        data: true,
    };

    /// A PDU the fake target received, digests already checked.
    struct Rx {
        pdu_type: PduType,
        flags: u8,
        header: Vec<u8>,
        data: Vec<u8>,
    }

    /// A scripted target: one connection, driven step by step by the test.
    struct Fake {
        s: TcpStream,
        digests: Option<Digests>,
    }

    impl Fake {
        fn recv(&mut self) -> Rx {
            let mut common = [0u8; COMMON_HEADER];
            self.s.read_exact(&mut common).expect("a common header");
            let c = CommonHeader::parse(&common, TARGET_RECEIVES).expect("a host PDU type");
            let limits = Limits {
                digests: self.digests,
                max_data: 1 << 20,
                alignment: 0,
            };
            let layout = c.layout(&limits).expect("a good layout");
            let mut header = vec![0u8; layout.header_bytes];
            header[..COMMON_HEADER].copy_from_slice(&common);
            self.s
                .read_exact(&mut header[COMMON_HEADER..])
                .expect("the header");
            let mut rest = vec![0u8; layout.rest()];
            self.s.read_exact(&mut rest).expect("the data");
            if c.flags & flags::HDGST != 0 {
                check_header_digest(&header, c.hlen as usize).expect("header digest");
            }
            let data = rest[layout.pad..layout.pad + layout.data].to_vec();
            if layout.data_digest {
                let digest = &rest[layout.pad + layout.data..];
                assert_eq!(digest, crc32c(&data).to_le_bytes(), "data digest");
            }
            Rx {
                pdu_type: c.pdu_type,
                flags: c.flags,
                header,
                data,
            }
        }

        fn send(&mut self, header: &OutHeader, data: &[u8]) {
            let mut out = Vec::new();
            append_pdu(&mut out, header, data, self.digests.unwrap_or_default());
            self.s.write_all(&out).expect("send");
        }

        fn send_raw(&mut self, bytes: &[u8]) {
            self.s.write_all(bytes).expect("send");
        }

        /// ICReq in; ICResp granting `grant` (the asked digests when None) out.
        fn handshake(&mut self, grant: Option<Digests>) {
            let rx = self.recv();
            assert_eq!(rx.pdu_type, PduType::IcReq);
            let req = IcReq::parse(&rx.header).expect("an ICReq");
            assert_eq!((req.pfv, req.hpda, req.maxr2t), (0, 0, 0));
            let digests = grant.unwrap_or(req.digests);
            let resp = IcResp {
                pfv: 0,
                cpda: 0,
                digests,
                maxh2cdata: MAXH2CDATA,
            };
            self.send_raw(&resp.encode());
            self.digests = Some(digests);
        }

        fn command(&mut self) -> (Sqe, Vec<u8>) {
            let rx = self.recv();
            assert_eq!(rx.pdu_type, PduType::CapsuleCmd);
            let sqe = Sqe::from_slice(&rx.header[8..CAPSULE_CMD_HEADER]).expect("an SQE");
            (sqe, rx.data)
        }

        fn respond(&mut self, sqe: &Sqe, dw0: u32, dw1: u32, status: Status) {
            let mut cqe = Cqe::new(dw0, 1, 0, sqe.cid(), status, false);
            cqe.dw1 = dw1;
            let h = OutHeader::capsule_resp(&cqe, self.digests.unwrap_or_default());
            self.send(&h, &[]);
        }

        fn c2h(&mut self, sqe: &Sqe, offset: u32, data: &[u8], extra: u8) {
            let d = DataHeader {
                cccid: sqe.cid(),
                ttag: 0,
                offset,
                length: data.len() as u32,
            };
            let h = OutHeader::data(
                PduType::C2HData,
                &d,
                extra,
                self.digests.unwrap_or_default(),
                0,
            );
            self.send(&h, data);
        }

        /// Checks the admin Connect and grants controller 1.
        fn connect(&mut self, kato: u32) {
            let (sqe, data) = self.command();
            assert_eq!((sqe.opcode(), sqe.as_bytes()[4]), (FABRICS, FCTYPE_CONNECT));
            let b = sqe.as_bytes();
            assert_eq!(&b[40..48], &[0, 0, 0, 0, 31, 0, 0, 0]); // recfmt, qid, sqsize, cattr
            assert_eq!(sqe.cdw12, kato);
            assert_eq!(
                (sqe.sgl().identifier, sqe.sgl().address, sqe.sgl().length),
                (SGL_IN_CAPSULE, 0, 1024)
            );
            assert_eq!(data.len(), CONNECT_DATA);
            assert_eq!(&data[..16], &HostOptions::default().host_id);
            assert_eq!(&data[16..18], &[0xff, 0xff]);
            assert_eq!(&data[256..256 + SUBNQN.len()], SUBNQN.as_bytes());
            assert_eq!(data[256 + SUBNQN.len()], 0);
            let host = HostOptions::default().host_nqn;
            assert_eq!(&data[512..512 + host.len()], host.as_bytes());
            self.respond(&sqe, 1, 0, Status::SUCCESS);
        }

        /// Reads until the host closes; the H2CTermReq it sent, if any.
        fn term_req(&mut self) -> Option<(u16, u32)> {
            let rx = self.recv();
            assert_eq!(rx.pdu_type, PduType::H2CTermReq);
            parse_term_req(&rx.header)
        }
    }

    /// Runs `script` as the target of one connection on a loopback port.
    fn target(script: impl FnOnce(Fake) + Send + 'static) -> (SocketAddr, JoinHandle<()>) {
        let listener = TcpListener::bind("127.0.0.1:0").expect("bind");
        let addr = listener.local_addr().expect("address");
        let handle = std::thread::spawn(move || {
            let (s, _) = listener.accept().expect("accept");
            script(Fake { s, digests: None });
        });
        (addr, handle)
    }

    fn options(digests: Digests) -> HostOptions {
        HostOptions {
            digests,
            kato_ms: 5000,
            timeout: Duration::from_secs(5),
            ..HostOptions::default()
        }
    }

    /// A target that sets up the admin queue, then runs `script`.
    fn connected(
        digests: Digests,
        script: impl FnOnce(&mut Fake) + Send + 'static,
    ) -> (Queue, JoinHandle<()>) {
        let (addr, handle) = target(|mut f| {
            f.handshake(None);
            f.connect(5000);
            script(&mut f);
        });
        let (queue, cntlid) =
            Queue::connect(addr, SUBNQN, 0, 32, 0xffff, &options(digests)).expect("connect");
        assert_eq!(cntlid, 1);
        (queue, handle)
    }

    fn pattern(len: usize, seed: u8) -> Vec<u8> {
        (0..len)
            .map(|i| (i as u8).wrapping_mul(31).wrapping_add(seed))
            .collect()
    }

    #[test]
    fn commands_with_and_without_digests() {
        for digests in [Digests::default(), BOTH] {
            let (mut q, target) = connected(digests, |f| {
                // Property Get CAP (8 bytes), Property Set CC (4 bytes)
                let (sqe, _) = f.command();
                assert_eq!(
                    (sqe.as_bytes()[4], sqe.cdw10, sqe.cdw11),
                    (FCTYPE_PROPERTY_GET, 1, 0)
                );
                f.respond(&sqe, 0x1234_5678, 0x9, Status::SUCCESS);
                let (sqe, _) = f.command();
                assert_eq!(sqe.as_bytes()[4], FCTYPE_PROPERTY_SET);
                assert_eq!(
                    (sqe.cdw10, sqe.cdw11, sqe.cdw12, sqe.cdw13),
                    (0, 0x14, 0x46_0001, 0)
                );
                f.respond(&sqe, 0, 0, Status::SUCCESS);

                // Identify: C2HData with LAST_PDU, then the CapsuleResp
                let (sqe, data) = f.command();
                assert!(data.is_empty());
                assert_eq!(
                    (sqe.sgl().identifier, sqe.sgl().length),
                    (SGL_TRANSPORT, 4096)
                );
                f.c2h(&sqe, 0, &pattern(4096, 1), flags::LAST_PDU);
                f.respond(&sqe, 0, 0, Status::SUCCESS);

                // Read: two C2HData, the second ends the command (no CapsuleResp)
                let (sqe, _) = f.command();
                assert_eq!(
                    (sqe.opcode(), sqe.nsid, sqe.cdw10, sqe.cdw11, sqe.cdw12),
                    (2, 1, 8, 0, 7)
                );
                let data = pattern(4096, 2);
                f.c2h(&sqe, 0, &data[..2048], 0);
                f.c2h(&sqe, 2048, &data[2048..], flags::LAST_PDU | flags::SUCCESS);

                // Small write: in the capsule
                let (sqe, data) = f.command();
                assert_eq!(
                    (sqe.opcode(), sqe.sgl().identifier, sqe.sgl().length),
                    (1, SGL_IN_CAPSULE, 512)
                );
                assert_eq!(data, pattern(512, 3));
                f.respond(&sqe, 0, 0, Status::SUCCESS);

                // Large write: two R2Ts, the first answered in MAXH2CDATA pieces
                let (sqe, data) = f.command();
                assert_eq!(
                    (sqe.sgl().identifier, sqe.sgl().length),
                    (SGL_TRANSPORT, 16384)
                );
                assert!(data.is_empty());
                let expect = pattern(16384, 4);
                let mut got = Vec::new();
                for (ttag, offset, length, pieces) in [(7, 0, 12288, 2), (8, 12288, 4096, 1)] {
                    let r2t = DataHeader {
                        cccid: sqe.cid(),
                        ttag,
                        offset,
                        length,
                    };
                    f.send(&OutHeader::r2t(&r2t, f.digests.unwrap_or_default()), &[]);
                    for piece in 0..pieces {
                        let rx = f.recv();
                        assert_eq!(rx.pdu_type, PduType::H2CData);
                        let d = DataHeader::parse(&rx.header).expect("H2CData");
                        assert_eq!((d.cccid, d.ttag), (sqe.cid(), ttag));
                        // the R2Ts cover the data in order, so each piece starts where
                        // the previous one ended
                        assert_eq!(d.offset as usize, got.len());
                        assert!(d.length <= MAXH2CDATA);
                        let last = piece + 1 == pieces;
                        assert_eq!(rx.flags & flags::LAST_PDU != 0, last);
                        got.extend_from_slice(&rx.data);
                    }
                    assert_eq!(got.len(), (offset + length) as usize);
                }
                assert_eq!(got, expect);
                f.respond(&sqe, 0, 0, Status::SUCCESS);

                // A read that fails
                let (sqe, _) = f.command();
                f.respond(&sqe, 0, 0, Status::LBA_OUT_OF_RANGE.with_dnr());
            });
            assert_eq!(q.property_get(0, true).expect("CAP"), 0x9_1234_5678);
            q.property_set(0x14, false, 0x46_0001).expect("CC");
            let (cqe, id) = q.admin(Sqe::new(0x06), 4096).expect("identify");
            assert!(cqe.status().is_success());
            assert_eq!(id, pattern(4096, 1));
            let mut buf = vec![0u8; 4096];
            q.read(1, 8, 8, &mut buf).expect("read");
            assert_eq!(buf, pattern(4096, 2));
            q.set_in_capsule_limit(4096);
            q.write(1, 0, 1, &pattern(512, 3)).expect("small write");
            q.write(1, 0, 32, &pattern(16384, 4)).expect("large write");
            let err = q
                .read(1, 1 << 40, 1, &mut buf[..512])
                .expect_err("out of range");
            assert!(
                matches!(err, HostError::Status { status, .. } if status.code() == Status::LBA_OUT_OF_RANGE)
            );
            assert_eq!(
                err.to_string(),
                "Read failed: LBA Out of Range (SCT 0x0, SC 0x80)"
            );
            target.join().expect("the fake target");
            q.disconnect();
        }
    }

    #[test]
    fn wrong_hlen_is_a_protocol_error_answered_with_a_term_req() {
        let (mut q, target) = connected(Digests::default(), |f| {
            let (sqe, _) = f.command();
            let cqe = Cqe::new(0, 0, 0, sqe.cid(), Status::SUCCESS, false);
            let mut h = OutHeader::capsule_resp(&cqe, Digests::default());
            h.bytes[2] = 23; // HLEN
            f.send(&h, &[]);
            assert_eq!(f.term_req(), Some((1, 2)));
        });
        let err = q.property_get(0, true).expect_err("bad HLEN");
        assert!(
            matches!(
                err,
                HostError::Protocol {
                    what: FatalError::InvalidHeaderField { field: "HLEN", .. }
                }
            ),
            "{err}"
        );
        assert!(err.to_string().contains("HLEN"), "{err}");
        target.join().expect("the fake target");
        assert!(matches!(q.property_get(0, true), Err(HostError::Closed)));
    }

    #[test]
    fn c2h_term_req_surfaces_as_terminated() {
        let (mut q, target) = connected(Digests::default(), |f| {
            let (_sqe, _) = f.command();
            let e = FatalError::InvalidHeaderField {
                offset: 3,
                field: "PDO",
            };
            f.send_raw(&term_req(PduType::C2HTermReq, &e, &[0u8; 24]));
        });
        let err = q.read(1, 0, 1, &mut [0u8; 512]).expect_err("terminated");
        assert!(
            matches!(err, HostError::Terminated { fes: 1, fei: 3 }),
            "{err}"
        );
        assert!(
            err.to_string().contains("Invalid PDU Header Field"),
            "{err}"
        );
        target.join().expect("the fake target");
    }

    #[test]
    fn data_digest_mismatch_fails_the_command_not_the_queue() {
        let (mut q, target) = connected(BOTH, |f| {
            let (sqe, _) = f.command();
            let data = pattern(512, 5);
            let d = DataHeader {
                cccid: sqe.cid(),
                ttag: 0,
                offset: 0,
                length: 512,
            };
            let h = OutHeader::data(PduType::C2HData, &d, flags::LAST_PDU, BOTH, 0);
            let mut out = Vec::new();
            append_pdu(&mut out, &h, &data, BOTH);
            let at = out.len() - 1;
            out[at] ^= 0xff; // the data digest
            f.send_raw(&out);
            f.respond(&sqe, 0, 0, Status::SUCCESS);
            // the queue goes on
            let (sqe, _) = f.command();
            f.respond(&sqe, 7, 0, Status::SUCCESS);
        });
        let err = q.read(1, 0, 1, &mut [0u8; 512]).expect_err("bad digest");
        assert!(matches!(err, HostError::Digest { header: false }), "{err}");
        assert_eq!(q.property_get(8, false).expect("VS"), 7);
        target.join().expect("the fake target");
    }

    #[test]
    fn header_digest_mismatch_ends_the_connection() {
        let (mut q, target) = connected(BOTH, |f| {
            let (sqe, _) = f.command();
            let cqe = Cqe::new(0, 0, 0, sqe.cid(), Status::SUCCESS, false);
            let mut h = OutHeader::capsule_resp(&cqe, BOTH);
            h.bytes[SHORT_HEADER] ^= 1;
            f.send(&h, &[]);
            assert_eq!(f.term_req(), Some((3, 0)));
        });
        let err = q.property_get(0, true).expect_err("bad digest");
        assert!(matches!(err, HostError::Digest { header: true }), "{err}");
        target.join().expect("the fake target");
    }

    #[test]
    fn c2h_data_beyond_the_buffer_or_out_of_order_is_refused() {
        // after 512 bytes of a 1024-byte read: too much data (FES 5), a gap (FES 4)
        for (offset, length, fes) in [(512, 1024, 5), (768, 256, 4)] {
            let (mut q, target) = connected(Digests::default(), move |f| {
                let (sqe, _) = f.command();
                f.c2h(&sqe, 0, &[0u8; 512], 0);
                f.c2h(&sqe, offset, &vec![0u8; length], flags::LAST_PDU);
                assert_eq!(f.term_req(), Some((fes, 0)));
            });
            let err = q.read(1, 0, 2, &mut [0u8; 1024]).expect_err("bad C2HData");
            assert!(
                matches!(err, HostError::Protocol { what } if what.fes() == fes),
                "{err}"
            );
            target.join().expect("the fake target");
        }
    }

    #[test]
    fn failed_connect_names_the_status() {
        // 82h is also an NVM command set code: a Connect names its Fabrics meaning
        for (status, text) in [
            (
                Status::CONNECT_INVALID_HOST,
                "Connect Invalid Host (SCT 0x1, SC 0x84)",
            ),
            (
                Status::CONNECT_INVALID_PARAMETERS,
                "Connect Invalid Parameters (SCT 0x1, SC 0x82)",
            ),
        ] {
            let (addr, target) = target(move |mut f| {
                f.handshake(None);
                let (sqe, _) = f.command();
                f.respond(&sqe, 0, 0, status.with_dnr());
            });
            let err = Queue::connect(addr, SUBNQN, 0, 32, 0xffff, &options(Digests::default()))
                .expect_err("refused");
            assert_eq!(err.to_string(), format!("Connect failed: {text}"));
            target.join().expect("the fake target");
        }
    }

    #[test]
    fn ic_resp_must_grant_the_digests_asked() {
        let (addr, target) = target(|mut f| {
            f.handshake(Some(Digests::default()));
            f.digests = None; // the TermReq has no digest either way
            assert_eq!(f.term_req(), Some((1, 11)));
        });
        let err =
            Queue::connect(addr, SUBNQN, 0, 32, 0xffff, &options(BOTH)).expect_err("no digests");
        assert!(err.to_string().contains("DGST"), "{err}");
        target.join().expect("the fake target");
    }

    #[test]
    fn refused_and_timed_out() {
        let addr = TcpListener::bind("127.0.0.1:0")
            .and_then(|l| l.local_addr())
            .expect("a free port");
        let err = Queue::connect(addr, SUBNQN, 0, 32, 0xffff, &options(Digests::default()))
            .expect_err("nobody listens");
        assert!(matches!(err, HostError::Refused { .. }), "{err}");
        assert!(err.to_string().contains("refused"), "{err}");

        // a target that never answers the Connect
        let (addr, target) = target(|mut f| {
            f.handshake(None);
            let _ = f.command();
            let _ = f.s.read(&mut [0u8; 1]); // until the host gives up
        });
        let opts = HostOptions {
            timeout: Duration::from_millis(200),
            ..options(Digests::default())
        };
        let err = Queue::connect(addr, SUBNQN, 0, 32, 0xffff, &opts).expect_err("silence");
        assert!(matches!(err, HostError::Timeout), "{err}");
        target.join().expect("the fake target");
    }
}
