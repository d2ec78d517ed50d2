//! PDUs in: headers read into the receive buffer (ahead in batches after a long run without
//! data for the drives), write data straight into the commands' buffers, each PDU checked,
//! then handed to the Fabrics, admin or I/O handlers.

use std::io;

use usnvme_driver::spec::command::PSDT_SGL;
use usnvme_driver::spec::fabrics::{FABRICS_OPCODE, SGL_IN_CAPSULE};
use usnvme_driver::spec::{IoOpcode, Sqe, Status};

use vm_memory::VolatileSlice;

use super::{
    Backend, Connection, Phase, Receive, Role, QUIET_BEFORE_READ_AHEAD, READ_BUDGET, TX_HIGH_WATER,
};
use crate::fabric::framing::socket::ReadWire;
use crate::fabric::framing::{Ahead, Need, Read, Rules, Step};
use crate::fabric::pdu::{
    self, CommonHeader, FatalError, Layout, Limits, PduType, CAPSULE_CMD_HEADER, DIGEST,
    SHORT_HEADER,
};

/// PDU types a target receives.
const RECEIVED: &[PduType] = &[
    PduType::IcReq,
    PduType::H2CTermReq,
    PduType::CapsuleCmd,
    PduType::H2CData,
];
/// What comes first, and only first.
const FIRST: &[PduType] = &[PduType::IcReq];
const AFTER_FIRST: &[PduType] = &[PduType::H2CTermReq, PduType::CapsuleCmd, PduType::H2CData];

/// Where the data of the PDU being received goes: command `token`'s buffer from `offset`.
#[derive(Debug, Clone, Copy)]
pub(super) struct DataInto {
    token: u16,
    offset: usize,
    /// H2CData: whether it is the transfer's last PDU; None for in-capsule data.
    last: Option<bool>,
}

/// The `len` bytes of `backend`'s buffers a transfer fills.
fn destination<'b>(
    backend: &'b dyn Backend,
) -> impl Fn(&DataInto, usize) -> Option<VolatileSlice<'b>> {
    move |t, len| {
        backend
            .buffer(t.token)
            .and_then(|b| b.subslice(t.offset, len).ok())
    }
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
        let mut budget = READ_BUDGET;
        loop {
            if self.phase == Phase::Closing || self.tx.pending() > TX_HIGH_WATER {
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
            let hdgst = if self.digests.header { DIGEST } else { 0 };
            // one header ahead: a short one while R2T data is expected, else a command capsule's
            let peek = hdgst
                + if self.r2t_open > 0 {
                    SHORT_HEADER
                } else {
                    CAPSULE_CMD_HEADER
                };
            let batch = self.quiet >= QUIET_BEFORE_READ_AHEAD && self.r2t_open == 0;
            let ahead = Ahead {
                peek,
                // as much as fits: reads only, lately
                batch: if batch { self.rx.capacity() } else { 0 },
            };
            match self
                .rx
                .read(src, need, ahead, &mut budget, destination(backend))?
            {
                Read::Got(_) => {}
                Read::Drained => return Ok(Receive::Drained),
                Read::Ended => return Ok(Receive::Ended),
            }
        }
    }

    /// Acts on what the receive buffer holds: None when something was done (call again),
    /// else what is needed to go on.
    fn step(&mut self, backend: &mut dyn Backend) -> Result<Option<Need>, FatalError> {
        let rules = Rules {
            known: RECEIVED,
            now: if self.phase == Phase::AwaitIcReq {
                FIRST
            } else {
                AFTER_FIRST
            },
            out_of_sequence: if self.phase == Phase::AwaitIcReq {
                "ICReq expected first"
            } else {
                "a second ICReq"
            },
            limits: self.limits_now(),
        };
        match self.rx.step(&rules, destination(backend))? {
            Step::Need(need) => return Ok(Some(need)),
            Step::Header(header, layout) => match self.transfer(&header, &layout, backend)? {
                Some(into) => {
                    self.quiet = 0;
                    self.rx.receive_data(into, &layout);
                }
                None => self.rx.keep_whole(header, layout)?,
            },
            Step::Whole(header, layout) => {
                self.on_pdu(&header, &layout, backend)?;
                if self.phase != Phase::Closing {
                    self.rx.next_pdu();
                    self.quiet = self.quiet.saturating_add(1);
                }
            }
            Step::Data {
                tag,
                len,
                digest_ok,
            } => {
                if !digest_ok {
                    // A data digest error fails the command, not the connection (NVMe/TCP
                    // 3.6.1.3): here it ends the connection too, which the host recovers
                    // from by reconnecting.
                    return Err(FatalError::field(0, "data digest"));
                }
                self.rx.next_pdu();
                self.transfer_done(tag, len, backend);
            }
        }
        Ok(None)
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
    ) -> Result<Option<DataInto>, FatalError> {
        match header.pdu_type {
            PduType::H2CData => {
                let (d, last) = self.check_h2c_data(layout.data)?;
                Ok(Some(DataInto {
                    token: d.ttag,
                    offset: d.offset as usize,
                    last: Some(last),
                }))
            }
            PduType::CapsuleCmd if layout.data > 0 && matches!(self.role, Role::Io { .. }) => {
                let sqe = self.sqe()?;
                let (opcode, sgl_type, sgl_len) = capsule_fields(&sqe);
                if opcode != IoOpcode::Write as u8 || check_flags(&sqe).is_err() {
                    return Ok(None);
                }
                self.check_in_capsule(opcode, sgl_type, sgl_len, layout.data)?;
                let token = self.free_slot()?;
                let checked = self.check_io(&sqe, opcode, sgl_type, sgl_len, layout.data);
                let Ok((device, op, offset, len)) = checked else {
                    return Ok(None);
                };
                if !backend.reserve(token, len as usize) {
                    return Ok(None);
                }
                self.occupy(token, (sqe.cdw0 >> 16) as u16, device, op, offset, len);
                self.slots[token as usize].buffered = true;
                // taken from the SQ here (`on_capsule` does it for the others)
                self.sq_taken = self.sq_taken.wrapping_add(1);
                Ok(Some(DataInto {
                    token,
                    offset: 0,
                    last: None,
                }))
            }
            _ => Ok(None),
        }
    }

    /// All `len` bytes of a transfer are in its command's buffer (and their digest checked).
    fn transfer_done(&mut self, t: DataInto, len: usize, backend: &mut dyn Backend) {
        let Some(slot) = self.slots.get_mut(t.token as usize) else {
            return;
        };
        slot.received = (t.offset + len) as u32;
        match t.last {
            Some(false) => {}
            Some(true) => {
                self.r2t_open = self.r2t_open.saturating_sub(1);
                self.advance(t.token, backend);
            }
            None => self.advance(t.token, backend),
        }
    }

    /// The SQE of the command capsule being received.
    fn sqe(&self) -> Result<Sqe, FatalError> {
        let sqe_bytes: &[u8; 64] = self
            .rx
            .pending()
            .get(8..72)
            .and_then(|b| b.try_into().ok())
            .ok_or(FatalError::field(2, "HLEN"))?;
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
        if data_len > self.subsystem.in_capsule_bytes as usize && opcode != FABRICS_OPCODE {
            return Err(FatalError::DataLimitExceeded(
                "in-capsule data beyond IOCCSZ",
            ));
        }
        Ok(())
    }

    /// A whole PDU kept in the receive buffer (its data digest checked).
    fn on_pdu(
        &mut self,
        header: &CommonHeader,
        layout: &Layout,
        backend: &mut dyn Backend,
    ) -> Result<(), FatalError> {
        let data_at = layout.header_bytes + layout.pad;
        let data_end = data_at + layout.data;
        match header.pdu_type {
            PduType::IcReq => self.on_ic_req(),
            PduType::H2CTermReq => {
                let plen = header.plen as usize;
                let (fes, fei) = pdu::parse_term_req(&self.rx.pending()[..plen]).unwrap_or((0, 0));
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

    /// A command capsule whose in-capsule data (if any) is at `data` in the PDU.
    fn on_capsule(
        &mut self,
        data: std::ops::Range<usize>,
        backend: &mut dyn Backend,
    ) -> Result<(), FatalError> {
        let sqe = self.sqe()?;
        self.sq_taken = self.sq_taken.wrapping_add(1);
        let cid = (sqe.cdw0 >> 16) as u16;
        let (opcode, sgl_type, sgl_len) = capsule_fields(&sqe);
        self.check_in_capsule(opcode, sgl_type, sgl_len, data.len())?;
        if let Err(status) = check_flags(&sqe) {
            self.respond(cid, 0, status);
            return Ok(());
        }
        if opcode == FABRICS_OPCODE {
            return self.on_fabrics(&sqe, cid, data, backend);
        }
        match &self.role {
            Role::None => {
                self.respond(cid, 0, Status::COMMAND_SEQUENCE_ERROR);
                Ok(())
            }
            Role::Admin { .. } => self.on_admin(&sqe, cid, opcode, backend),
            Role::Io { .. } => self.on_io(&sqe, cid, opcode, sgl_type, sgl_len, data, backend),
        }
    }
}

/// What every command's first dword must say on a fabric: its data described by SGLs (PSDT
/// 01b, the only value NVMe over Fabrics allows), and not fused (this target runs no fused
/// operations); else "Invalid Field", whatever the rest of the command holds.
fn check_flags(sqe: &Sqe) -> Result<(), Status> {
    if sqe.fuse() != 0 || sqe.psdt() != PSDT_SGL {
        return Err(Status::INVALID_FIELD.with_dnr());
    }
    Ok(())
}

/// A command capsule's opcode, SGL identifier and SGL length (a Keyed SGL's 3-byte one).
fn capsule_fields(sqe: &Sqe) -> (u8, u8, u32) {
    let sgl = sqe.sgl();
    let length = sgl.keyed_parts().map_or(sgl.length, |(len, _)| len);
    (sqe.opcode(), sgl.identifier, length)
}
