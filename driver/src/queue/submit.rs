//! Submission: the commands a queue pair sends (reads, writes, flush, write zeroes, deallocate,
//! raw ones), their data described by PRP entries, a PRP list or an SGL, and the SQ ring write.

use vm_memory::Bytes;

use crate::error::SubmitError;
use crate::prp::{self, PrpLayout, PAGE};
use crate::spec::{DsmRange, SglDescriptor, Sqe};

use super::checks::check_block_count;
use super::{IoBuffer, MetadataIo, QueuePair, Tracker};

impl QueuePair {
    /// Read `buf.len` bytes at `slba` into `buf`.
    #[inline]
    pub fn read(
        &mut self,
        nsid: u32,
        slba: u64,
        buf: IoBuffer,
        token: u64,
    ) -> Result<(), SubmitError> {
        let blocks = self.io_blocks(nsid, slba, buf.len)?;
        self.submit_io(Sqe::read(nsid, slba, blocks), buf, token)
    }

    /// Write `buf.len` bytes from `buf` at `slba`.
    #[inline]
    pub fn write(
        &mut self,
        nsid: u32,
        slba: u64,
        buf: IoBuffer,
        token: u64,
    ) -> Result<(), SubmitError> {
        let blocks = self.io_blocks(nsid, slba, buf.len)?;
        self.submit_io(Sqe::write(nsid, slba, blocks), buf, token)
    }

    /// Read `blocks` blocks at `slba` of a namespace formatted with metadata, into the
    /// buffers of `io`, with its PRACT, PRCHK and tags.
    pub fn read_with_metadata(
        &mut self,
        nsid: u32,
        slba: u64,
        blocks: u32,
        io: MetadataIo,
        token: u64,
    ) -> Result<(), SubmitError> {
        let sqe = self.metadata_command(Sqe::read(nsid, slba, blocks), io)?;
        self.submit_io(sqe, io.data, token)
    }

    /// Write `blocks` blocks at `slba` of a namespace formatted with metadata, from the
    /// buffers of `io`, with its PRACT, PRCHK and tags.
    pub fn write_with_metadata(
        &mut self,
        nsid: u32,
        slba: u64,
        blocks: u32,
        io: MetadataIo,
        token: u64,
    ) -> Result<(), SubmitError> {
        let sqe = self.metadata_command(Sqe::write(nsid, slba, blocks), io)?;
        self.submit_io(sqe, io.data, token)
    }

    pub fn flush_cache(&mut self, nsid: u32, token: u64) -> Result<(), SubmitError> {
        self.namespace(nsid)?;
        self.submit(Sqe::flush(nsid), token)
    }

    /// Zero `blocks` blocks at `slba` without a data transfer.
    pub fn write_zeroes(
        &mut self,
        nsid: u32,
        slba: u64,
        blocks: u32,
        token: u64,
    ) -> Result<(), SubmitError> {
        self.namespace(nsid)?;
        check_block_count(blocks as u64)?;
        self.submit(Sqe::write_zeroes(nsid, slba, blocks), token)
    }

    /// Deallocate (trim) `blocks` blocks at `slba`: Dataset Management with one range.
    pub fn deallocate(
        &mut self,
        nsid: u32,
        slba: u64,
        blocks: u32,
        token: u64,
    ) -> Result<(), SubmitError> {
        self.namespace(nsid)?;
        if blocks == 0 {
            return Err(SubmitError::BlockCount { blocks: 0 });
        }
        let cid = self.take_cid()?;
        // The range list lives in the command's own PRP-list slot.
        let offset = self.slot_offset(cid);
        let range = DsmRange::new(slba, blocks);
        if self.memory_write(offset, range).is_err() {
            self.free_cids.push(cid);
            return Err(SubmitError::Dead);
        }
        let mut sqe = Sqe::dataset_management(nsid, 1, true);
        sqe.prp1 = self.memory.iova_of(offset);
        self.push(sqe, cid, token, 0);
        Ok(())
    }

    /// Any command without data (admin commands use this too).
    pub fn submit(&mut self, sqe: Sqe, token: u64) -> Result<(), SubmitError> {
        let cid = self.take_cid()?;
        self.push(sqe, cid, token, 0);
        Ok(())
    }

    /// Any command with a data buffer.
    pub fn submit_data(&mut self, sqe: Sqe, buf: IoBuffer, token: u64) -> Result<(), SubmitError> {
        if buf.len as u64 > self.max_transfer {
            return Err(SubmitError::ExceedsMdts {
                bytes: buf.len as u64,
                max: self.max_transfer,
            });
        }
        if buf.len == 0 {
            return Err(SubmitError::Misaligned { iova: buf.iova });
        }
        self.submit_io(sqe, buf, token)
    }

    /// A command with a data buffer of 1 to `max_transfer` bytes.
    // Always inlined into `read` and `write` (the I/O path); PRP lists go out of line.
    #[inline(always)]
    fn submit_io(&mut self, mut sqe: Sqe, buf: IoBuffer, token: u64) -> Result<(), SubmitError> {
        // (an IOVA range that wraps the address space would make the PRP arithmetic wrap)
        if !buf.iova.is_multiple_of(4) || buf.iova > u64::MAX - (2 << 20) {
            return Err(SubmitError::Misaligned { iova: buf.iova });
        }
        let cid = self.take_cid()?;
        if let Err(e) = self.describe_data(&mut sqe, cid, buf) {
            self.free_cids.push(cid);
            return Err(e);
        }
        self.push(sqe, cid, token, buf.len);
        Ok(())
    }

    /// PRP1 (and PRP2) for one or two pages; beyond that one SGL data block where the
    /// controller takes SGLs, else a PRP list in the command's slot.
    #[inline]
    fn describe_data(&mut self, sqe: &mut Sqe, cid: u16, buf: IoBuffer) -> Result<(), SubmitError> {
        match prp::layout(buf.iova, buf.len) {
            PrpLayout::One { prp1 } => (sqe.prp1, sqe.prp2) = (prp1, 0),
            PrpLayout::Two { prp1, prp2 } => (sqe.prp1, sqe.prp2) = (prp1, prp2),
            PrpLayout::List { .. } if self.use_sgl => {
                sqe.set_sgl(SglDescriptor::data_block(buf.iova, buf.len))
            }
            PrpLayout::List {
                prp1,
                first_entry,
                entries,
            } => (sqe.prp1, sqe.prp2) = (prp1, self.prp_list(cid, buf, first_entry, entries)?),
        }
        Ok(())
    }

    /// Writes the PRP list of a transfer over more than two pages into the command's slot;
    /// its IOVA (PRP2).
    #[inline(never)]
    fn prp_list(
        &mut self,
        cid: u16,
        buf: IoBuffer,
        first_entry: u64,
        entries: u32,
    ) -> Result<u64, SubmitError> {
        if entries as u64 > self.layout.slot_entries() {
            return Err(SubmitError::ExceedsMdts {
                bytes: buf.len as u64,
                max: self.max_transfer,
            });
        }
        let offset = self.slot_offset(cid);
        let slot = self
            .memory
            .slice(offset, entries as usize * 8)
            .map_err(|_| SubmitError::Dead)?;
        for i in 0..entries as usize {
            slot.write_obj(first_entry + i as u64 * PAGE, i * 8)
                .map_err(|_| SubmitError::Dead)?;
        }
        Ok(self.memory.iova_of(offset))
    }

    #[inline]
    fn take_cid(&mut self) -> Result<u16, SubmitError> {
        // An idle queue pair catches up with a controller reset here (nothing to fail); a busy
        // one does in `poll`, where its commands in flight can be handed back.
        if self.in_flight == 0 && self.lost_queues() {
            self.reconnect(&mut |_| {});
        }
        if self.unusable {
            return Err(SubmitError::Dead);
        }
        // A free command id means a free SQ slot: there are depth - 1 ids for depth slots,
        // and the SQ holds only commands in flight (a completion's SQ head lies past its
        // command; every other way an id comes back resets the rings or makes the queue
        // pair unusable). So the id pool is the one test of a full queue.
        let cid = self.free_cids.pop().ok_or(SubmitError::QueueFull {
            in_flight: self.in_flight,
        })?;
        debug_assert!(
            self.next(self.sq_tail) != self.sq_head,
            "SQ full with a free id"
        );
        Ok(cid)
    }

    /// The ring index after `index` (no division on the hot path).
    #[inline]
    fn next(&self, index: u16) -> u16 {
        if index + 1 == self.depth {
            0
        } else {
            index + 1
        }
    }

    fn slot_offset(&self, cid: u16) -> usize {
        self.layout.prp + cid as usize * self.layout.prp_slot
    }

    fn memory_write<T: vm_memory::ByteValued>(&self, offset: usize, value: T) -> Result<(), ()> {
        let slice = self
            .memory
            .slice(offset, std::mem::size_of::<T>())
            .map_err(|_| ())?;
        slice.write_obj(value, 0).map_err(|_| ())
    }

    /// Copies the SQE into the ring at the tail; the doorbell waits for `flush`/`poll`.
    #[inline]
    fn push(&mut self, mut sqe: Sqe, cid: u16, token: u64, bytes: u32) {
        sqe.set_cid(cid);
        self.rings.write_sqe(self.sq_tail, &sqe);
        self.trackers[cid as usize] = Tracker {
            token,
            started_ns: self.now_ns,
            sq_position: self.sq_written,
            bytes,
            busy: true,
            abort_sent: false,
        };
        self.sq_written = self.sq_written.wrapping_add(1);
        self.sq_tail = self.next(self.sq_tail);
        self.in_flight += 1;
        self.stats.submitted += 1;
    }
}
