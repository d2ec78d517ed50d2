//! PDUs in: headers read into the receive buffer (ahead in batches after a long run without
//! data for the drives), write data straight into the commands' buffers, each PDU checked,
//! then handed to the Fabrics, admin or I/O handlers.

use std::io;

use usnvme_driver::spec::{Sqe, Status};

use super::super::wire::{self, ReadWire};
use super::{
    Backend, Connection, Phase, Receive, Role, FABRICS, QUIET_BEFORE_READ_AHEAD, READ_BUDGET,
    SGL_IN_CAPSULE, TX_HIGH_WATER, WRITE,
};
use crate::fabric::pdu::{
    self, CommonHeader, FatalError, Layout, Limits, PduType, CAPSULE_CMD_HEADER, COMMON_HEADER,
    DIGEST, SHORT_HEADER,
};

/// PDU types a target receives.
const RECEIVED: &[PduType] = &[
    PduType::IcReq,
    PduType::H2CTermReq,
    PduType::CapsuleCmd,
    PduType::H2CData,
];

/// Data of the PDU being received that goes straight into a command's buffer.
#[derive(Debug, Clone, Copy)]
pub(super) struct Transfer {
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
pub(super) enum RxState {
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

impl Connection {
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
}

/// A command capsule's opcode, SGL descriptor type and SGL length (dword 8 of the SGL).
fn capsule_fields(sqe: &Sqe) -> (u8, u8, u32) {
    (sqe.cdw0 as u8, sqe.as_bytes()[39], sqe.prp2 as u32)
}
