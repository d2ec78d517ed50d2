//! Responses, R2Ts and C2HData out: headers and small data queued in the transmit buffer
//! (which never grows: reading pauses while too much waits), read data sent in place from the
//! commands' buffers, all gathered into one write.

use std::io;

use usnvme_driver::spec::{Cqe, Status};
use vm_memory::VolatileSlice;

use super::super::wire::WriteWire;
use super::{Backend, Connection, Role};
use crate::fabric::pdu::{self, flags, DataHeader, OutHeader, PduType, DIGEST};

/// A piece of what is to be sent: bytes of `tx`, or data from a command's buffer.
#[derive(Debug, Clone, Copy)]
pub(super) enum Segment {
    Bytes { at: usize, len: usize },
    Data { token: u16, len: usize },
}

impl Connection {
    /// Queues `bytes` to be sent.
    pub(super) fn push_bytes(&mut self, bytes: &[u8]) {
        self.make_room(bytes.len());
        let at = self.tx.len();
        self.tx.extend_from_slice(bytes);
        self.note_bytes(at);
    }

    /// The bytes of `tx` from `at` on are to be sent after what is queued.
    fn note_bytes(&mut self, at: usize) {
        let len = self.tx.len() - at;
        self.tx_pending += len;
        if let Some(Segment::Bytes { at: a, len: l }) = self.segments.back_mut() {
            if *a + *l == at {
                *l += len;
                return;
            }
        }
        self.segments.push_back(Segment::Bytes { at, len });
    }

    pub(super) fn respond(&mut self, cid: u16, dw0: u32, status: Status) {
        let sqid = match &self.role {
            Role::Io { qid, .. } => *qid,
            _ => 0,
        };
        let cqe = Cqe::new(dw0, self.sq_head(), sqid, cid, status, false);
        self.push_bytes(OutHeader::capsule_resp(&cqe, self.digests).as_slice());
    }

    pub(super) fn respond64(&mut self, cid: u16, value: u64, status: Status) {
        let mut cqe = Cqe::new(value as u32, self.sq_head(), 0, cid, status, false);
        cqe.dw1 = (value >> 32) as u32;
        self.push_bytes(OutHeader::capsule_resp(&cqe, self.digests).as_slice());
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
        let at = self.c2h_header(cid, len, len + DIGEST, false);
        let data = &self.admin_data[..len];
        self.tx.extend_from_slice(data);
        if self.digests.data {
            self.tx.extend_from_slice(&pdu::crc32c(data).to_le_bytes());
        }
        self.note_bytes(at);
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
        let at = self.c2h_header(cid, len, 0, success);
        self.note_bytes(at);
        self.segments.push_back(Segment::Data { token, len });
        if self.digests.data {
            let digest = backend
                .buffer(token)
                .and_then(|b| b.subslice(0, len).ok())
                .map_or(0, |b| pdu::crc32c_volatile(&b));
            self.push_bytes(&digest.to_le_bytes());
        }
    }

    /// Appends the header (and padding to the host's alignment) of the one C2HData PDU of
    /// command `cid`, `len` bytes, with room for `then` bytes after it; where it starts in `tx`.
    /// `success`: it ends the command (the SUCCESS flag), no response follows.
    fn c2h_header(&mut self, cid: u16, len: usize, then: usize, success: bool) -> usize {
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
        self.make_room(header.as_slice().len() + header.pad() + then);
        let at = self.tx.len();
        self.tx.extend_from_slice(header.as_slice());
        self.tx.resize(self.tx.len() + header.pad(), 0);
        at
    }

    /// Sends what `dst` takes now, headers and read data gathered in one write (the data
    /// straight from the commands' buffers); the bytes sent. A read's buffer is released
    /// once its data is sent.
    pub fn transmit<W: WriteWire + ?Sized>(
        &mut self,
        dst: &mut W,
        backend: &mut dyn Backend,
    ) -> io::Result<usize> {
        let mut total = 0;
        while !self.segments.is_empty() {
            let written = {
                let tx = VolatileSlice::from(&mut self.tx[..]);
                let mut parts = [VolatileSlice::from(&mut [][..]); usnvme_hugepages::MAX_PARTS];
                let mut n = 0;
                let mut skip = self.segment_sent;
                for segment in self.segments.iter().take(parts.len()) {
                    let part = match *segment {
                        Segment::Bytes { at, len } => tx.subslice(at + skip, len - skip).ok(),
                        Segment::Data { token, len } => backend
                            .buffer(token)
                            .and_then(|b| b.subslice(skip, len - skip).ok()),
                    };
                    parts[n] =
                        part.ok_or_else(|| io::Error::other("a segment outside its buffer"))?;
                    n += 1;
                    skip = 0;
                }
                match dst.write_parts(&parts[..n]) {
                    Ok(0) => break,
                    Ok(w) => w,
                    Err(e) if e.kind() == io::ErrorKind::WouldBlock => break,
                    Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                    Err(e) => return Err(e),
                }
            };
            total += written;
            self.sent(written, backend);
        }
        Ok(total)
    }

    /// `n` more bytes of the queued segments were sent.
    fn sent(&mut self, mut n: usize, backend: &mut dyn Backend) {
        while n > 0 {
            let Some(&front) = self.segments.front() else {
                break;
            };
            let (len, bytes) = match front {
                Segment::Bytes { len, .. } => (len, true),
                Segment::Data { len, .. } => (len, false),
            };
            let k = n.min(len - self.segment_sent);
            self.segment_sent += k;
            n -= k;
            if bytes {
                self.tx_pending -= k;
            }
            if self.segment_sent < len {
                break;
            }
            self.segments.pop_front();
            self.segment_sent = 0;
            if let Segment::Data { token, .. } = front {
                self.data_sent(token, backend);
            }
        }
        self.reclaim();
    }

    /// Gives back the space of sent bytes at the start of `tx`.
    fn reclaim(&mut self) {
        if !self
            .segments
            .iter()
            .any(|s| matches!(s, Segment::Bytes { .. }))
        {
            self.tx.clear();
        }
    }

    /// Makes room for `n` more bytes in `tx` without growing it: the bytes already sent at
    /// its start go. (Reading pauses at TX_HIGH_WATER bytes pending, so what is pending plus
    /// what one PDU and the completions add fits the capacity.)
    fn make_room(&mut self, n: usize) {
        if self.tx.len() + n <= self.tx.capacity() {
            return;
        }
        let first = self.segments.iter().find_map(|s| match *s {
            Segment::Bytes { at, .. } => Some(at),
            Segment::Data { .. } => None,
        });
        let first = first.unwrap_or(self.tx.len());
        self.tx.drain(..first);
        for s in self.segments.iter_mut() {
            if let Segment::Bytes { at, .. } = s {
                *at -= first;
            }
        }
    }
}
