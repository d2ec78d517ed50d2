//! Submission: commands into slots and their capsules (data in the capsule when it fits),
//! the H2CData an R2T asks for (straight from the buffer), and sending what is queued.

use std::io;

use usnvme_driver::spec::{DsmRange, SglDescriptor, Sqe};
use usnvme_driver::{IoBuffer, SubmitError};
use usnvme_hugepages::IovaMemory;
use vm_memory::VolatileSlice;

use super::receive::range_end;
use super::{
    field, slice, Data, Dir, IoNamespace, IoShape, Phase, Session, Slot, Unfinished, DSM_RANGE,
    SLOT_BITS,
};
use crate::fabric::framing::socket::WriteWire;
use crate::fabric::framing::Buffers;
use crate::fabric::pdu::{self, flags, DataHeader, FatalError, OutHeader, PduType};
use crate::transport::Op;

/// Where a data segment's bytes come from: slot `slot`'s buffer from `offset`.
#[derive(Debug, Clone, Copy)]
pub(super) struct Chunk {
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

impl Session {
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
        self.queue_io(ns, op, slba, blocks, buf, token, mem)
            .map(|_| ())
    }

    /// Sends again an I/O a queue of the same controller had not finished when its connection
    /// ended; its latency still counts from its first submission.
    pub fn resubmit(&mut self, u: Unfinished, mem: &IovaMemory) -> Result<(), SubmitError> {
        let index = self.queue_io(u.ns, u.op, u.slba, u.blocks, u.buf, u.token, mem)?;
        self.slots[index as usize].since_ns = u.since_ns;
        Ok(())
    }

    /// [`Session::submit_to`]; the slot it took.
    #[allow(clippy::too_many_arguments)]
    fn queue_io(
        &mut self,
        ns: IoNamespace,
        op: Op,
        slba: u64,
        blocks: u32,
        buf: Option<IoBuffer>,
        token: u64,
        mem: &IovaMemory,
    ) -> Result<u16, SubmitError> {
        if self.phase != Phase::Ready {
            return Err(SubmitError::Dead);
        }
        let p = &self.params;
        let most = usnvme_driver::spec::command::MAX_BLOCKS_PER_COMMAND;
        if op != Op::Flush && !(1..=most).contains(&u64::from(blocks)) {
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
            io: Some(IoShape {
                op,
                slba,
                blocks,
                block_size: ns.block_size,
            }),
            ..Slot::default()
        };
        let range = (op == Op::Deallocate).then(|| DsmRange::new(slba, blocks));
        self.start(sqe, command, range.as_ref().map(|r| r.as_bytes()), mem)
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
        self.start(sqe, command, None, mem).map(|_| ())
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
    ) -> Result<u16, SubmitError> {
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
            since_ns: self.now_ns,
            ..command
        };
        self.in_flight += 1;
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
        Ok(index)
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
    pub(super) fn push_bytes(&mut self, bytes: &[u8]) {
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

    /// Answers an R2T with H2CData PDUs of at most MAXH2CDATA bytes, straight from the buffer.
    pub(super) fn on_r2t(&mut self, d: &DataHeader, mem: &IovaMemory) -> Result<(), FatalError> {
        let index = self.data_slot(
            d.cccid,
            Dir::ToController,
            "R2T for a command that writes nothing",
        )?;
        let s = self.slots[index as usize];
        if s.in_capsule {
            return Err(FatalError::Sequence("R2T for data sent in the capsule"));
        }
        if d.length == 0 {
            return Err(field(16, "R2TL"));
        }
        let end = range_end(
            d,
            s.requested,
            s.len,
            "R2T not at the next offset",
            "R2T beyond the command's data",
        )?;
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
}
