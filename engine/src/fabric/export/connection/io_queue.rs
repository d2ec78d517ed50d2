//! The I/O queue's commands: checked, given a slot and a buffer, submitted to the backend
//! (write data in the capsule or by R2T and H2CData, Dataset Management ranges one by one),
//! completed (read data by C2HData, from the buffer). A command that cannot have a buffer or
//! room in its device's queue when it comes waits in the backend's queue, in arrival order
//! (see [`super::super::waiting`]), its in-capsule data kept in the connection's holding area.

use usnvme_driver::spec::fabrics::{SGL_IN_CAPSULE, SGL_KEYED, SGL_TRANSPORT};
use usnvme_driver::spec::{IoOpcode, Sqe, Status};

use super::super::registry::AnaState;
use super::rdma::{Keyed, RdmaOp};
use super::{Backend, Connection, Refused, Request, Role, Slot};
use crate::block::Op;
use crate::fabric::pdu::{flags, DataHeader, FatalError, OutHeader};

impl Connection {
    #[allow(clippy::too_many_arguments)]
    pub(super) fn on_io(
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
        let (device, op, offset, len) = match checked {
            Ok(c) => c,
            Err(status) => {
                self.respond(cid, 0, status);
                return Ok(());
            }
        };
        if op == Op::Deallocate {
            self.deallocate(sqe, cid, token, device, data, backend);
            return Ok(());
        }
        self.occupy(token, cid, device, op, offset, len);
        if let Some(remote) = Keyed::of(&sqe.sgl()) {
            self.slots[token as usize].remote = remote;
        }
        if op == Op::Write && !data.is_empty() {
            // In-capsule data normally goes straight into a buffer (see `transfer`); it is
            // here when none could be had then: kept aside until one can.
            if !self.hold(token, data) {
                self.finish(token, Status::INTERNAL_ERROR, backend);
                return Ok(());
            }
        }
        self.advance(token, backend);
        Ok(())
    }

    /// A free command slot; none means the host broke SQ flow control.
    pub(super) fn free_slot(&self) -> Result<u16, FatalError> {
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
    pub(super) fn occupy(
        &mut self,
        token: u16,
        cid: u16,
        device: usize,
        op: Op,
        offset: u64,
        len: u32,
    ) {
        self.slots[token as usize] = Slot {
            busy: true,
            cid,
            device,
            op: Some(op),
            offset,
            len,
            parts: 1,
            pending: 1,
            ..Slot::default()
        };
        self.in_flight += 1;
    }

    /// The block device (the namespace's), op, byte offset and length of an I/O command, or
    /// its status (with Do Not Retry: the same command would fail again; but for the ANA
    /// state, which may change).
    pub(super) fn check_io(
        &self,
        sqe: &Sqe,
        opcode: u8,
        sgl_type: u8,
        sgl_len: u32,
        in_capsule: usize,
    ) -> Result<(usize, Op, u64, u32), Status> {
        let info = self
            .subsystem
            .namespaces
            .iter()
            .find(|n| n.nsid == sqe.nsid)
            .ok_or(Status::INVALID_NAMESPACE.with_dnr())?;
        let device = info.device;
        // the path this connection is: refused where its port is inaccessible (the host then
        // goes another way; no DNR, so it may come back once the state changes)
        if self.registry.ana_state(self.port.port_id, info.ana_group) == AnaState::Inaccessible {
            return Err(Status::ANA_INACCESSIBLE);
        }
        let bs = u64::from(info.block_size);
        let slba = u64::from(sqe.cdw10) | (u64::from(sqe.cdw11) << 32);
        let blocks = u64::from(sqe.cdw12 & 0xffff) + 1;
        let (op, moves_data) = match IoOpcode::from_raw(opcode) {
            Some(IoOpcode::Read) => (Op::Read, true),
            Some(IoOpcode::Write) => (Op::Write, true),
            Some(IoOpcode::Flush) => return Ok((device, Op::Flush, 0, 0)),
            Some(IoOpcode::WriteZeroes) => (Op::WriteZeroes, false),
            // see `deallocate`
            Some(IoOpcode::DatasetManagement) => return Ok((device, Op::Deallocate, 0, 0)),
            _ => return Err(Status::INVALID_OPCODE.with_dnr()),
        };
        if slba.checked_add(blocks).is_none_or(|end| end > info.blocks) {
            return Err(Status::LBA_OUT_OF_RANGE.with_dnr());
        }
        let len = blocks * bs;
        if moves_data {
            if len > u64::from(self.subsystem.max_transfer) {
                return Err(Status::INVALID_FIELD.with_dnr());
            }
            // over RDMA a Keyed SGL of either subtype: address, or invalidate (the Linux host
            // invalidates the key itself when the response does not)
            let sgl_ok = if in_capsule > 0 {
                sgl_type == SGL_IN_CAPSULE
            } else if self.is_rdma() {
                sgl_type >> 4 == SGL_KEYED >> 4
            } else {
                sgl_type == SGL_TRANSPORT
            };
            if !sgl_ok || u64::from(sgl_len) != len {
                return Err(Status::DATA_SGL_LENGTH_INVALID.with_dnr());
            }
            if op == Op::Read && in_capsule > 0 {
                return Err(Status::INVALID_FIELD.with_dnr());
            }
        }
        Ok((device, op, slba * bs, len as u32))
    }

    /// Dataset Management: with the Deallocate attribute, each range (in the capsule, 16 bytes
    /// each: attributes, block count, starting LBA) becomes a deallocate on the namespace;
    /// without it the command is a hint, done at once. The ranges are checked first (a bad one
    /// fails the command before any part of it runs), then kept in the holding area as parts
    /// (byte offset, bytes; empty ranges left out) that start one by one as the device has room.
    fn deallocate(
        &mut self,
        sqe: &Sqe,
        cid: u16,
        token: u16,
        device: usize,
        data: std::ops::Range<usize>,
        backend: &mut dyn Backend,
    ) {
        let ranges = (sqe.cdw10 & 0xff) as usize + 1;
        if sqe.cdw11 & usnvme_driver::spec::command::DSM_DEALLOCATE == 0 {
            self.respond(cid, 0, Status::SUCCESS);
            return;
        }
        // the ranges first; more data may follow (Linux sends a 4 KiB page for one range, as
        // nvmet takes it)
        if data.len() < ranges * 16 {
            self.respond(cid, 0, Status::DATA_SGL_LENGTH_INVALID);
            return;
        }
        let data = data.start..data.start + ranges * 16;
        // (checked by `check_io`: the namespace is there)
        let Some(info) = self
            .subsystem
            .namespaces
            .iter()
            .find(|n| n.nsid == sqe.nsid)
        else {
            self.respond(cid, 0, Status::INVALID_NAMESPACE);
            return;
        };
        let (bs, size) = (u64::from(info.block_size), info.blocks);
        let range = |r: &[u8]| {
            let blocks = u64::from(u32::from_le_bytes([r[4], r[5], r[6], r[7]]));
            let slba = u64::from_le_bytes([r[8], r[9], r[10], r[11], r[12], r[13], r[14], r[15]]);
            (slba, blocks)
        };
        let mut parts = 0u16;
        for r in self.rx.pending()[data.clone()].chunks_exact(16) {
            let (slba, blocks) = range(r);
            if slba.checked_add(blocks).is_none_or(|end| end > size) {
                self.respond(cid, 0, Status::LBA_OUT_OF_RANGE);
                return;
            }
            parts += u16::from(blocks > 0);
        }
        if parts == 0 {
            self.respond(cid, 0, Status::SUCCESS);
            return;
        }
        // the parts, 16 bytes each like the ranges they came from, in the holding area
        let Some(holding) = &self.holding else {
            self.respond(cid, 0, Status::INTERNAL_ERROR);
            return;
        };
        let mut at = 0;
        for r in self.rx.pending()[data].chunks_exact(16) {
            let (slba, blocks) = range(r);
            if blocks > 0 {
                let mut part = [0u8; 16];
                part[..8].copy_from_slice(&(slba * bs).to_le_bytes());
                part[8..].copy_from_slice(&(blocks * bs).to_le_bytes());
                if let Some(place) = holding.place(token, at, 16) {
                    place.copy_from(&part);
                }
                at += 16;
            }
        }
        self.slots[token as usize] = Slot {
            busy: true,
            cid,
            device,
            op: Some(Op::Deallocate),
            parts,
            pending: parts,
            ..Slot::default()
        };
        self.in_flight += 1;
        self.advance(token, backend);
    }

    /// Keeps the in-capsule data at `data` of the receive buffer in command `token`'s place of
    /// the holding area, until the command has a buffer; false if there is no such place
    /// (cannot happen: an I/O queue's area has a place of IOCCSZ bytes for each slot).
    fn hold(&mut self, token: u16, data: std::ops::Range<usize>) -> bool {
        let place = self
            .holding
            .as_ref()
            .and_then(|h| h.place(token, 0, data.len()));
        let Some(place) = place else {
            return false;
        };
        place.copy_from(&self.rx.pending()[data]);
        self.slots[token as usize].held = true;
        true
    }

    /// Moves command `token`'s held write data into its buffer; false if it cannot be.
    fn unhold(&mut self, token: u16, backend: &mut dyn Backend) -> bool {
        let len = self.slots[token as usize].len as usize;
        let from = self.holding.as_ref().and_then(|h| h.place(token, 0, len));
        let to = backend.buffer(token).and_then(|b| b.subslice(0, len).ok());
        let (Some(from), Some(to)) = (from, to) else {
            return false;
        };
        from.copy_to_volatile_slice(to);
        self.copied += len as u64;
        let s = &mut self.slots[token as usize];
        s.held = false;
        s.received = s.len;
        true
    }

    /// Part `i` of command `token`: its one request, a Dataset Management's `i`th range, a
    /// shutdown's Flush of the `i`th namespace. None when there is no such part (a namespace
    /// removed meanwhile).
    fn part(&self, token: u16, i: u16) -> Option<Request> {
        let s = self.slots.get(token as usize)?;
        if s.shutdown_flush {
            let ns = self.subsystem.namespaces.get(usize::from(i))?;
            return Some(Request {
                device: ns.device,
                op: Op::Flush,
                offset: 0,
                len: 0,
            });
        }
        let op = s.op?;
        if op != Op::Deallocate {
            return Some(Request {
                device: s.device,
                op,
                offset: s.offset,
                len: u64::from(s.len),
            });
        }
        let mut r = [0u8; 16];
        let place = self
            .holding
            .as_ref()?
            .place(token, usize::from(i) * 16, 16)?;
        place.copy_to(&mut r);
        let word = |b: &[u8]| u64::from_le_bytes(b.try_into().unwrap_or([0; 8]));
        Some(Request {
            device: s.device,
            op,
            offset: word(&r[..8]),
            len: word(&r[8..]),
        })
    }

    /// Moves command `token` on as far as it can go now: a buffer for its data (a write's data
    /// then asked for by R2T, or taken from the holding area), then its parts to the backend.
    /// When it cannot go on for want of a buffer or of room, it waits in the backend's queue
    /// (entered once) until [`Connection::resume`] moves it on.
    pub(super) fn advance(&mut self, token: u16, backend: &mut dyn Backend) {
        let waits = self.start(token, backend);
        if let Some(s) = self.slots.get_mut(token as usize) {
            if waits && s.busy && !s.waiting {
                s.waiting = true;
                backend.wait(token);
            }
        }
    }

    /// Moves a waiting command on (see [`Connection::advance`]), from the backend's retry
    /// pass: true once it no longer waits (it started, failed, or is gone), false while it
    /// still does (it keeps its place in the queue).
    pub fn resume(&mut self, token: u16, backend: &mut dyn Backend) -> bool {
        let waiting = self
            .slots
            .get(token as usize)
            .is_some_and(|s| s.busy && s.waiting);
        if !waiting {
            return true;
        }
        if self.start(token, backend) {
            return false;
        }
        self.slots[token as usize].waiting = false;
        true
    }

    /// [`Connection::advance`]'s work; true when the command must wait.
    fn start(&mut self, token: u16, backend: &mut dyn Backend) -> bool {
        let t = token as usize;
        let s = self.slots[t];
        if s.op.is_some_and(Op::has_data) && !s.buffered {
            if !backend.reserve(token, s.len as usize) {
                return true;
            }
            self.slots[t].buffered = true;
            if s.op == Some(Op::Write) {
                if !s.held {
                    self.send_r2t(token);
                    return false; // its parts start once its data is in
                }
                if !self.unhold(token, backend) {
                    self.finish(token, Status::INTERNAL_ERROR, backend);
                    return false;
                }
            }
        }
        while self.slots[t].started < s.parts {
            let Some(request) = self.part(token, self.slots[t].started) else {
                self.fail_unstarted(token, Status::INTERNAL_ERROR, backend);
                return false;
            };
            match backend.submit(token, request) {
                Ok(()) => {
                    let s = &mut self.slots[t];
                    s.started += 1;
                    s.submitted = true;
                }
                Err(Refused::Busy) => return true,
                Err(Refused::Failed(status)) => {
                    self.fail_unstarted(token, status, backend);
                    return false;
                }
            }
        }
        false
    }

    /// Asks the host for all of write `token`'s data at once (it sends it in PDUs of
    /// MAXH2CDATA at most).
    fn send_r2t(&mut self, token: u16) {
        let s = self.slots[token as usize];
        // over RDMA, the target reads it from the host's buffer
        let read = RdmaOp::Read {
            token,
            len: s.len,
            remote: s.remote,
        };
        if self.push_rdma(read) {
            return;
        }
        let r2t = DataHeader {
            cccid: s.cid,
            ttag: token,
            offset: 0,
            length: s.len,
        };
        self.tx.push(OutHeader::r2t(&r2t, self.digests).as_slice());
        self.r2t_open += 1;
    }

    /// The parts of command `token` not started will not run: they count as failed with
    /// `status` now, and the command ends once those started have completed.
    pub(super) fn fail_unstarted(&mut self, token: u16, status: Status, backend: &mut dyn Backend) {
        let s = &mut self.slots[token as usize];
        let left = s.parts - s.started;
        s.started = s.parts;
        s.pending -= left;
        s.failed = s.failed.or(Some(status));
        if s.pending == 0 {
            let status = s.failed.unwrap_or(status);
            self.finish(token, status, backend);
        }
    }
    /// Checks the H2CData header being received against the transfer it belongs to: the
    /// header and whether it is the transfer's last PDU.
    pub(super) fn check_h2c_data(&self, data_len: usize) -> Result<(DataHeader, bool), FatalError> {
        let header = self.rx.pending();
        let d = DataHeader::parse(header)?;
        let slot = self
            .slots
            .get(d.ttag as usize)
            .copied()
            .filter(|s| {
                s.busy
                    && s.cid == d.cccid
                    && s.op == Some(Op::Write)
                    && s.buffered
                    && !s.held
                    && !s.submitted
            })
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
        let last = header[1] & flags::LAST_PDU != 0;
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
            let success = !self.sq_flow && !self.is_rdma();
            let write = RdmaOp::Write {
                token,
                len: slot.len,
                remote: slot.remote,
            };
            if !self.push_rdma(write) {
                self.send_read_data(token, slot.cid, slot.len as usize, success, backend);
            }
            self.slots[token as usize].sending = true;
            if !success {
                self.respond(slot.cid, 0, status);
            }
            return;
        }
        self.finish(token, status, backend);
    }

    /// Frees the slot and answers the command.
    pub(super) fn finish(&mut self, token: u16, status: Status, backend: &mut dyn Backend) {
        let slot = self.slots[token as usize];
        if slot.buffered {
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
}
