//! Responses, R2Ts and C2HData out, through the connection's [`Transmitter`]: headers and
//! small data copied into its buffer (which never grows: reading pauses while too much waits),
//! read data sent in place from the commands' buffers.

use std::io;

use usnvme_driver::spec::fabrics::{PropertyCommand, PropertySize};
use usnvme_driver::spec::{Cqe, Status};
use vm_memory::VolatileSlice;

use super::rdma::RdmaOp;
use super::{Backend, Connection, Role, Slot};
use crate::fabric::framing::socket::WriteWire;
use crate::fabric::framing::Buffers;
use crate::fabric::pdu::{flags, DataHeader, OutHeader, PduType};

/// The commands' buffers, as the transmitter sees them: read data is sent from them, and a
/// command whose data is all sent is over (its buffer released, its slot free).
pub(super) struct Sending<'a> {
    pub(super) slots: &'a mut [Slot],
    pub(super) in_flight: &'a mut usize,
    pub(super) backend: &'a mut dyn Backend,
}

impl Buffers<u16> for Sending<'_> {
    fn data(&self, token: u16, len: usize) -> Option<VolatileSlice<'_>> {
        self.backend.buffer(token)?.subslice(0, len).ok()
    }

    fn sent(&mut self, token: u16) {
        if self.slots.get(token as usize).is_some_and(|s| s.sending) {
            self.backend.release(token);
            self.slots[token as usize] = Slot::default();
            *self.in_flight -= 1;
        }
    }
}

impl Connection {
    pub(super) fn respond(&mut self, cid: u16, dw0: u32, status: Status) {
        let sqid = match &self.role {
            Role::Io { qid, .. } => *qid,
            _ => 0,
        };
        let cqe = Cqe::new(dw0, self.sq_head(), sqid, cid, status, false);
        self.send_cqe(cqe);
    }

    fn send_cqe(&mut self, cqe: Cqe) {
        if !self.push_rdma(RdmaOp::Respond(cqe)) {
            self.tx
                .push(OutHeader::capsule_resp(&cqe, self.digests).as_slice());
        }
    }

    /// A successful Property Get's response (on the admin queue, SQID 0), carrying `value`.
    pub(super) fn respond_property(&mut self, cid: u16, size: PropertySize, value: u64) {
        let mut cqe = Cqe::new(0, self.sq_head(), 0, cid, Status::SUCCESS, false);
        PropertyCommand::put_value(&mut cqe, size, value);
        self.send_cqe(cqe);
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

    /// Sends the first `len` bytes of the admin buffer to the host, copied into the transmit
    /// buffer (admin data is small and not DMA data).
    pub(super) fn send_admin_data(&mut self, cid: u16, len: usize) {
        let len = len.min(self.admin_data.len());
        self.c2h_header(cid, len, false);
        let data = &self.admin_data[..len];
        self.tx.push(data);
        if self.digests.data {
            self.tx
                .push(&crate::fabric::pdu::crc32c(data).to_le_bytes());
        }
    }

    /// A read's data: a C2HData header, the data from command `token`'s buffer (sent in
    /// place), its digest computed over the buffer.
    pub(super) fn send_read_data(
        &mut self,
        token: u16,
        cid: u16,
        len: usize,
        success: bool,
        backend: &dyn Backend,
    ) {
        self.c2h_header(cid, len, success);
        let data = backend.buffer(token).and_then(|b| b.subslice(0, len).ok());
        self.tx.push_data(token, len, data, self.digests.data);
    }

    /// Queues the header (and padding to the host's alignment) of the one C2HData PDU of
    /// command `cid`, `len` bytes. `success`: it ends the command (the SUCCESS flag), no
    /// response follows.
    fn c2h_header(&mut self, cid: u16, len: usize, success: bool) {
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
        self.tx.push(header.as_slice());
        self.tx.push_zeros(header.pad());
    }

    /// Sends what `dst` takes now, headers and read data gathered in one write (the data
    /// straight from the commands' buffers); the bytes sent. A read's buffer is released
    /// once its data is sent.
    pub fn transmit<W: WriteWire + ?Sized>(
        &mut self,
        dst: &mut W,
        backend: &mut dyn Backend,
    ) -> io::Result<usize> {
        let mut sending = Sending {
            slots: &mut self.slots,
            in_flight: &mut self.in_flight,
            backend,
        };
        self.tx.transmit(dst, &mut sending)
    }
}
