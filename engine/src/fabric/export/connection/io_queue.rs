//! The I/O queue's commands: checked, given a slot and a buffer, submitted to the backend
//! (write data in the capsule or by R2T and H2CData, Dataset Management ranges one by one),
//! completed (read data by C2HData, from the buffer).

use usnvme_driver::spec::fabrics::{SGL_IN_CAPSULE, SGL_TRANSPORT};
use usnvme_driver::spec::{IoOpcode, Sqe, Status};

use super::super::registry::AnaState;
use super::{Backend, Connection, Request, Role, Slot};
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
        if opcode == IoOpcode::DatasetManagement as u8 {
            self.deallocate(sqe, cid, token, data, backend);
            return Ok(());
        }
        if op.has_data() && !backend.reserve(token, len as usize) {
            self.respond(cid, 0, Status::NAMESPACE_NOT_READY);
            return Ok(());
        }
        self.occupy(token, cid, device, op, offset, len);
        if op == Op::Write {
            if data.is_empty() {
                // ask for all of it at once; the host sends it in PDUs of MAXH2CDATA at most
                let r2t = DataHeader {
                    cccid: cid,
                    ttag: token,
                    offset: 0,
                    length: len,
                };
                self.tx.push(OutHeader::r2t(&r2t, self.digests).as_slice());
                self.r2t_open += 1;
                return Ok(());
            }
            // In-capsule data normally goes straight into the buffer (see `transfer`); it is
            // here only when the buffer could not be had then but can now.
            let copied = backend
                .buffer(token)
                .and_then(|b| b.subslice(0, data.len()).ok())
                .map(|b| b.copy_from(&self.rx.pending()[data.clone()]));
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
            pending: 1,
            ..Slot::default()
        };
        self.in_flight += 1;
    }

    /// The block device (the namespace's), op, byte offset and length of an I/O command, or
    /// its status.
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
            .ok_or(Status::INVALID_NAMESPACE)?;
        let device = info.device;
        // the path this connection is: refused where its port is inaccessible (the host then
        // goes another way; no DNR, so it may come back once the state changes)
        if self.registry.ana_state(self.port.port_id) == AnaState::Inaccessible {
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
        Ok((device, op, slba * bs, len as u32))
    }

    /// Dataset Management: with the Deallocate attribute, each range (in the capsule, 16 bytes
    /// each: attributes, block count, starting LBA) becomes a deallocate on the namespace;
    /// without it the command is a hint, done at once.
    fn deallocate(
        &mut self,
        sqe: &Sqe,
        cid: u16,
        token: u16,
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
        let (bs, size, device) = (u64::from(info.block_size), info.blocks, info.device);
        // Each range as (byte offset, bytes); empty ranges are skipped. Checked in a first
        // pass, so that a bad range fails the command before any part of it ran.
        let range = |r: &[u8]| {
            let blocks = u64::from(u32::from_le_bytes([r[4], r[5], r[6], r[7]]));
            let slba = u64::from_le_bytes([r[8], r[9], r[10], r[11], r[12], r[13], r[14], r[15]]);
            (slba, blocks)
        };
        let mut count = 0u16;
        for r in self.rx.pending()[data.clone()].chunks_exact(16) {
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
            device,
            op: Some(Op::Deallocate),
            submitted: true,
            pending: count,
            ..Slot::default()
        };
        self.in_flight += 1;
        let mut left = count;
        for at in (data.start..data.end).step_by(16) {
            let (slba, blocks) = range(&self.rx.pending()[at..at + 16]);
            if blocks == 0 {
                continue;
            }
            let request = Request {
                device,
                op: Op::Deallocate,
                offset: slba * bs,
                len: blocks * bs,
            };
            if let Err(status) = backend.submit(token, request) {
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

    pub(super) fn submit(&mut self, token: u16, backend: &mut dyn Backend) {
        let s = self.slots[token as usize];
        let Some(op) = s.op else {
            return;
        };
        let request = Request {
            device: s.device,
            op,
            offset: s.offset,
            len: u64::from(s.len),
        };
        match backend.submit(token, request) {
            Ok(()) => self.slots[token as usize].submitted = true,
            Err(status) => self.finish(token, status, backend),
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
    pub(super) fn finish(&mut self, token: u16, status: Status, backend: &mut dyn Backend) {
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
}
