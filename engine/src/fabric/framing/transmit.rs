//! The send side: a queue of segments, header bytes in a buffer that does not grow and data
//! sent in place from the owner's buffers, gathered into one write.

use std::collections::VecDeque;
use std::io;

use vm_memory::VolatileSlice;

use crate::fabric::framing::socket::WriteWire;
use crate::fabric::pdu;

/// Segments most writes gather (a response, a header and its data): gathered in an array
/// this long rather than a [`usnvme_hugepages::MAX_PARTS`] one.
const FEW_SEGMENTS: usize = 4;

/// The owner's data buffers, as data segments name them (by `D`).
pub trait Buffers<D> {
    /// The `len` bytes segment `tag` sends.
    fn data(&self, tag: D, len: usize) -> Option<VolatileSlice<'_>>;
    /// Segment `tag` was sent, or dropped unsent: its buffer is no longer read.
    fn sent(&mut self, tag: D);
}

/// A piece of what is to be sent: bytes of the buffer, or data of the owner's.
#[derive(Debug, Clone, Copy)]
enum Segment<D> {
    Bytes { at: usize, len: usize },
    Data { tag: D, len: usize },
}

/// The send side of one connection.
#[derive(Debug)]
pub struct Transmitter<D> {
    /// Bytes to send (and, before the first bytes segment, bytes already sent).
    bytes: Vec<u8>,
    segments: VecDeque<Segment<D>>,
    /// Bytes of the first segment already sent.
    front_sent: usize,
    /// Bytes of `bytes` not yet sent.
    pending: usize,
}

impl<D: Copy> Transmitter<D> {
    /// A transmitter for `bytes` header bytes and `segments` segments at once at most.
    pub fn new(bytes: usize, segments: usize) -> Transmitter<D> {
        Transmitter {
            bytes: Vec::with_capacity(bytes),
            segments: VecDeque::with_capacity(segments),
            front_sent: 0,
            pending: 0,
        }
    }

    /// Grows the capacities to `bytes` and `segments` (once the owner knows its limits).
    pub fn reserve(&mut self, bytes: usize, segments: usize) {
        self.bytes
            .reserve_exact(bytes.saturating_sub(self.bytes.len()));
        self.segments
            .reserve_exact(segments.saturating_sub(self.segments.len()));
    }

    /// The byte buffer's and the segment queue's capacities (they must not grow).
    pub fn capacity(&self) -> (usize, usize) {
        (self.bytes.capacity(), self.segments.capacity())
    }

    /// Whether nothing waits to be sent.
    pub fn is_empty(&self) -> bool {
        self.segments.is_empty()
    }

    /// Bytes of the byte buffer waiting to be sent: the owner stops taking work (reading)
    /// above its high water mark, so that the buffer need not grow.
    pub fn pending(&self) -> usize {
        self.pending
    }

    /// Queues `bytes` to be sent.
    pub fn push(&mut self, bytes: &[u8]) {
        if bytes.is_empty() {
            return; // (an empty segment would never be sent)
        }
        let at = self.room(bytes.len());
        self.bytes.extend_from_slice(bytes);
        self.note(at);
    }

    /// Queues `n` zero bytes (padding up to a PDU's data offset).
    pub fn push_zeros(&mut self, n: usize) {
        if n == 0 {
            return;
        }
        let at = self.room(n);
        self.bytes.resize(at + n, 0);
        self.note(at);
    }

    /// Queues `len` bytes of the owner's buffer `tag`, and after them their data digest
    /// (`digest`: computed over `data`, those bytes now).
    pub fn push_data(&mut self, tag: D, len: usize, data: Option<VolatileSlice<'_>>, digest: bool) {
        self.segments.push_back(Segment::Data { tag, len });
        if digest {
            let crc = data.map_or(0, |d| pdu::crc32c_volatile(&d));
            self.push(&crc.to_le_bytes());
        }
    }

    /// The bytes from `at` on were appended: they go after what is queued.
    fn note(&mut self, at: usize) {
        let len = self.bytes.len() - at;
        self.pending += len;
        if let Some(Segment::Bytes { at: a, len: l }) = self.segments.back_mut() {
            if *a + *l == at {
                *l += len;
                return;
            }
        }
        self.segments.push_back(Segment::Bytes { at, len });
    }

    /// Makes room for `n` more bytes without growing the buffer, where the bytes already sent
    /// at its start can go; where they will start.
    fn room(&mut self, n: usize) -> usize {
        if self.bytes.len() + n > self.bytes.capacity() {
            // the sent part of a partly sent front segment goes too (a run of responses
            // merged into one segment would otherwise never give any space back)
            if let Some(Segment::Bytes { at, len }) = self.segments.front_mut() {
                *at += self.front_sent;
                *len -= self.front_sent;
                self.front_sent = 0;
            }
            let first = self.segments.iter().find_map(|s| match *s {
                Segment::Bytes { at, .. } => Some(at),
                Segment::Data { .. } => None,
            });
            let first = first.unwrap_or(self.bytes.len());
            self.bytes.drain(..first);
            for s in self.segments.iter_mut() {
                if let Segment::Bytes { at, .. } = s {
                    *at -= first;
                }
            }
        }
        self.bytes.len()
    }

    /// Sends what `dst` takes now, gathered in writes of up to
    /// [`usnvme_hugepages::MAX_PARTS`] segments (data straight from `buffers`); the bytes sent.
    /// Each data segment fully sent is reported to `buffers`.
    pub fn transmit<W: WriteWire + ?Sized>(
        &mut self,
        dst: &mut W,
        buffers: &mut impl Buffers<D>,
    ) -> io::Result<usize> {
        let mut total = 0;
        while !self.segments.is_empty() {
            // (a short array for the usual few segments: no large one to fill per write)
            let written = if self.segments.len() <= FEW_SEGMENTS {
                self.write_once::<FEW_SEGMENTS, W>(dst, buffers)
            } else {
                self.write_once::<{ usnvme_hugepages::MAX_PARTS }, W>(dst, buffers)
            };
            let written = match written {
                Ok(0) => break,
                Ok(w) => w,
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => break,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                Err(e) => return Err(e),
            };
            total += written;
            self.sent(written, buffers);
        }
        Ok(total)
    }

    /// One write of the first `N` segments at most; the bytes written.
    fn write_once<const N: usize, W: WriteWire + ?Sized>(
        &mut self,
        dst: &mut W,
        buffers: &impl Buffers<D>,
    ) -> io::Result<usize> {
        let bytes = VolatileSlice::from(&mut self.bytes[..]);
        let mut parts = [VolatileSlice::from(&mut [][..]); N];
        let mut n = 0;
        let mut skip = self.front_sent;
        for segment in self.segments.iter().take(N) {
            let part = match *segment {
                Segment::Bytes { at, len } => bytes.subslice(at + skip, len - skip).ok(),
                Segment::Data { tag, len } => buffers
                    .data(tag, len)
                    .and_then(|d| d.subslice(skip, len - skip).ok()),
            };
            parts[n] = part.ok_or_else(|| io::Error::other("a segment outside its buffer"))?;
            n += 1;
            skip = 0;
        }
        dst.write_parts(&parts[..n])
    }

    /// `n` more bytes of the queued segments were sent.
    fn sent(&mut self, mut n: usize, buffers: &mut impl Buffers<D>) {
        while n > 0 {
            let Some(&front) = self.segments.front() else {
                break;
            };
            let len = match front {
                Segment::Bytes { len, .. } | Segment::Data { len, .. } => len,
            };
            let k = n.min(len - self.front_sent);
            self.front_sent += k;
            n -= k;
            if matches!(front, Segment::Bytes { .. }) {
                self.pending -= k;
            }
            if self.front_sent < len {
                break;
            }
            self.segments.pop_front();
            self.front_sent = 0;
            if let Segment::Data { tag, .. } = front {
                buffers.sent(tag);
            }
        }
        // no bytes left to send: the whole buffer is free again
        if !self
            .segments
            .iter()
            .any(|s| matches!(s, Segment::Bytes { .. }))
        {
            self.bytes.clear();
        }
    }

    /// Drops everything queued (the peer is gone); each data segment dropped goes to
    /// `dropped`.
    pub fn clear(&mut self, mut dropped: impl FnMut(D)) {
        while let Some(segment) = self.segments.pop_front() {
            if let Segment::Data { tag, .. } = segment {
                dropped(tag);
            }
        }
        self.bytes.clear();
        self.front_sent = 0;
        self.pending = 0;
    }
}
