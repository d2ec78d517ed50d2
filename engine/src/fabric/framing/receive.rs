//! The receive side: a receive buffer for headers and whole PDUs, transfers of data straight
//! into the owner's destination buffers.

use std::io;

use vm_memory::VolatileSlice;

use super::Need;
use crate::fabric::framing::socket::ReadWire;
use crate::fabric::pdu::{
    self, CommonHeader, FatalError, Layout, Limits, PduType, COMMON_HEADER, DIGEST,
};

/// What a PDU may be now.
#[derive(Debug, Clone, Copy)]
pub struct Rules<'a> {
    /// The PDU types this end receives at all: another is a bad PDU-Type.
    pub known: &'a [PduType],
    /// Of those, the ones that may come now: another is out of sequence, for this reason.
    pub now: &'a [PduType],
    pub out_of_sequence: &'static str,
    pub limits: Limits,
}

/// How far a read reaches beyond what is needed.
#[derive(Debug, Clone, Copy)]
pub struct Ahead {
    /// Bytes of the next PDU's header read with the end of this one.
    pub peek: usize,
    /// Read up to this many bytes into the receive buffer (0: no batching): many PDUs in one
    /// read. Data that comes that way is copied once into its destination; an owner that
    /// must not copy (the target, while data for its drives can come) batches only while
    /// none can.
    pub batch: usize,
}

/// How a [`Receiver::read`] went.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Read {
    /// This many bytes came.
    Got(usize),
    /// The source has nothing more now, or this turn's budget is used up.
    Drained,
    /// The source ended (the peer closed the connection).
    Ended,
}

/// What [`Receiver::step`] found.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Step<T> {
    /// More bytes are needed ([`Receiver::read`]).
    Need(Need),
    /// A PDU's header and padding are in, checked (and its header digest): the owner calls
    /// [`Receiver::receive_data`] or [`Receiver::keep_whole`] (or fails the PDU).
    Header(CommonHeader, Layout),
    /// A PDU kept whole is in ([`Receiver::pending`] starts with it), its data digest
    /// checked: the owner acts on it, then calls [`Receiver::next_pdu`].
    Whole(CommonHeader, Layout),
    /// A transfer's `len` bytes are all in its destination; whether their data digest matched
    /// (true without one). The owner calls [`Receiver::next_pdu`] to go on.
    Data { tag: T, len: usize, digest_ok: bool },
}

/// The data of the PDU being received, going into the destination the owner names by `tag`.
#[derive(Debug, Clone, Copy)]
struct Transfer<T> {
    tag: T,
    len: usize,
    done: usize,
    /// The PDU's header and padding, at the start of the pending bytes.
    head: usize,
    /// Data bytes that stay in the receive buffer after the header (copied out, with more
    /// PDUs read after them): the digest follows them.
    kept: usize,
    digest: bool,
}

#[derive(Debug, Clone, Copy)]
enum State<T> {
    /// A header is being read.
    Header,
    /// The PDU is kept whole in the receive buffer.
    Whole(CommonHeader, Layout),
    /// Its data goes into a destination.
    Data(Transfer<T>),
}

/// The receive side of one connection. `T` names a transfer's destination (the owner's
/// command); the owner maps it to the buffer when asked (`dest`: the `len` bytes the transfer
/// fills, from its start).
#[derive(Debug)]
pub struct Receiver<T> {
    /// The PDU being received starts at `start`; `end` is the end of what was read (headers
    /// read ahead may follow the PDU).
    buf: Box<[u8]>,
    start: usize,
    end: usize,
    state: State<T>,
    /// Data bytes read ahead with a header and copied into a destination.
    copied: u64,
    /// Bytes read so far.
    received: u64,
    /// The last read took less than it had room for: the source had nothing more then, and
    /// the next [`Receiver::read`] says so without asking it again (a non-blocking socket
    /// would answer "would block": a system call for nothing; the owner's readiness poll
    /// tells when more comes).
    emptied: bool,
}

impl<T: Copy> Receiver<T> {
    /// A receiver whose buffer holds `capacity` bytes: the largest header with its digest,
    /// padding, and the largest PDU the owner keeps whole.
    pub fn new(capacity: usize) -> Receiver<T> {
        Receiver {
            buf: vec![0; capacity].into_boxed_slice(),
            start: 0,
            end: 0,
            state: State::Header,
            copied: 0,
            received: 0,
            emptied: false,
        }
    }

    /// The receive buffer's size.
    pub fn capacity(&self) -> usize {
        self.buf.len()
    }

    /// The bytes received from where the current PDU starts (read ahead ones included).
    pub fn pending(&self) -> &[u8] {
        &self.buf[self.start..self.end]
    }

    /// Whether a PDU is partly received.
    pub fn mid_pdu(&self) -> bool {
        self.end > self.start || !matches!(self.state, State::Header)
    }

    /// Data bytes that were read ahead with a header and copied into a destination.
    pub fn copied(&self) -> u64 {
        self.copied
    }

    /// Bytes read so far.
    pub fn received(&self) -> u64 {
        self.received
    }

    /// Forgets everything received (the connection is closing).
    pub fn reset(&mut self) {
        (self.start, self.end) = (0, 0);
        self.state = State::Header;
    }

    /// The PDU whose header was just read goes whole into the receive buffer.
    pub fn keep_whole(&mut self, header: CommonHeader, layout: Layout) -> Result<(), FatalError> {
        if header.plen as usize > self.buf.len() {
            return Err(FatalError::DataLimitExceeded("PDU longer than advertised"));
        }
        self.state = State::Whole(header, layout);
        Ok(())
    }

    /// The data of the PDU whose header was just read goes into the destination `tag`.
    pub fn receive_data(&mut self, tag: T, layout: &Layout) {
        self.state = State::Data(Transfer {
            tag,
            len: layout.data,
            done: 0,
            head: layout.header_bytes + layout.pad,
            kept: 0,
            digest: layout.data_digest,
        });
    }

    /// The owner is done with the PDU received: the next one starts after it.
    pub fn next_pdu(&mut self) {
        match self.state {
            State::Header => {}
            State::Whole(header, _) => self.start += header.plen as usize,
            State::Data(t) => self.start += t.head + t.kept + if t.digest { DIGEST } else { 0 },
        }
        self.state = State::Header;
    }

    /// Acts on what the receive buffer holds: checks a header, copies data read ahead into
    /// its destination, checks a digest; what was found.
    pub fn step<'b>(
        &mut self,
        rules: &Rules<'_>,
        dest: impl Fn(&T, usize) -> Option<VolatileSlice<'b>>,
    ) -> Result<Step<T>, FatalError> {
        let have = self.end - self.start;
        let b = self.start;
        match self.state {
            State::Header => {
                if have < COMMON_HEADER {
                    return Ok(Step::Need(Need::Header));
                }
                let common: &[u8; COMMON_HEADER] = self.buf[b..b + COMMON_HEADER]
                    .try_into()
                    .map_err(|_| FatalError::Sequence("short header"))?;
                let header = CommonHeader::parse(common, rules.known)?;
                let layout = header.layout(&rules.limits)?;
                if !rules.now.contains(&header.pdu_type) {
                    return Err(FatalError::Sequence(rules.out_of_sequence));
                }
                let head = layout.header_bytes + layout.pad;
                if have < head {
                    return Ok(Step::Need(Need::Exact(head - have)));
                }
                let hlen = header.pdu_type.header_len();
                if layout.header_bytes > hlen {
                    pdu::check_header_digest(&self.buf[b..b + layout.header_bytes], hlen)?;
                }
                Ok(Step::Header(header, layout))
            }
            State::Whole(header, layout) => {
                let plen = header.plen as usize;
                if have < plen {
                    return Ok(Step::Need(Need::ThenHeader(plen - have)));
                }
                if layout.data_digest {
                    let at = b + layout.header_bytes + layout.pad;
                    let want = pdu::crc32c(&self.buf[at..at + layout.data]);
                    if digest_at(&self.buf, at + layout.data) != Some(want) {
                        return Err(FatalError::field(0, "data digest"));
                    }
                }
                Ok(Step::Whole(header, layout))
            }
            State::Data(mut t) => {
                // the receive buffer past the header and the data kept
                let own = b + t.head + t.kept;
                let ahead = self.end - own;
                if t.done < t.len && ahead > 0 {
                    // data read into the receive buffer (with its header, or batched): copy it
                    let k = ahead.min(t.len - t.done);
                    let into = dest(&t.tag, t.len)
                        .and_then(|d| d.subslice(t.done, k).ok())
                        .ok_or(FatalError::Sequence("a transfer without its buffer"))?;
                    into.copy_from(&self.buf[own..own + k]);
                    if own + k == self.end {
                        // nothing after it: forget it, the rest reads in after the header
                        self.end = own;
                    } else {
                        // the PDUs after it stay where they are (no move)
                        t.kept += k;
                    }
                    t.done += k;
                    self.copied += k as u64;
                    self.state = State::Data(t);
                }
                if t.done < t.len {
                    return Ok(Step::Need(Need::Exact(t.len - t.done)));
                }
                let own = b + t.head + t.kept;
                let digest = if t.digest { DIGEST } else { 0 };
                let have = self.end - own;
                if have < digest {
                    return Ok(Step::Need(Need::ThenHeader(digest - have)));
                }
                let mut digest_ok = true;
                if t.digest {
                    let data = dest(&t.tag, t.len)
                        .ok_or(FatalError::Sequence("a transfer without its buffer"))?;
                    digest_ok = digest_at(&self.buf, own) == Some(pdu::crc32c_volatile(&data));
                }
                Ok(Step::Data {
                    tag: t.tag,
                    len: t.len,
                    digest_ok,
                })
            }
        }
    }

    /// One read from `src` for what `need`s (see [`Ahead`]): into the receive buffer, or,
    /// receiving a transfer, into its destination first and the receive buffer after it (the
    /// data digest and the next headers). `budget`: the bytes this turn may still take.
    pub fn read<'b, R: ReadWire + ?Sized>(
        &mut self,
        src: &mut R,
        need: Need,
        ahead: Ahead,
        budget: &mut usize,
        dest: impl Fn(&T, usize) -> Option<VolatileSlice<'b>>,
    ) -> io::Result<Read> {
        if *budget == 0 || std::mem::take(&mut self.emptied) {
            return Ok(Read::Drained);
        }
        let have = self.end - self.start;
        let mut want = match need {
            Need::Header => ahead.peek.saturating_sub(have).max(1),
            Need::Exact(n) => n,
            Need::ThenHeader(n) => n + ahead.peek,
        };
        let mut data = None;
        match self.state {
            State::Data(t) => {
                want = (if t.digest { DIGEST } else { 0 } + ahead.peek).max(ahead.batch);
                if t.done < t.len {
                    let rest = dest(&t.tag, t.len)
                        .and_then(|d| d.subslice(t.done, t.len - t.done).ok())
                        .ok_or_else(|| io::Error::other("a transfer without its buffer"))?;
                    data = Some(rest);
                }
            }
            _ => want = want.max(ahead.batch),
        }
        loop {
            let result = read_into(
                src,
                &mut self.buf,
                (&mut self.start, &mut self.end),
                want,
                data,
            );
            return match result {
                Ok((0, _, _)) => Ok(Read::Ended),
                Ok((n, into_data, room)) => {
                    if let State::Data(t) = &mut self.state {
                        t.done += into_data;
                    }
                    self.emptied = n < room;
                    self.received += n as u64;
                    *budget = budget.saturating_sub(n);
                    Ok(Read::Got(n))
                }
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => Ok(Read::Drained),
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                Err(e) => Err(e),
            };
        }
    }
}

/// The little-endian digest at `at` in `buf`, if it is all there.
fn digest_at(buf: &[u8], at: usize) -> Option<u32> {
    let bytes = buf.get(at..at + DIGEST)?;
    bytes.try_into().ok().map(u32::from_le_bytes)
}

/// One read into a receive buffer, `rx`, whose bytes kept are `rx[*start..*end]`: makes room
/// for `want` bytes after them (moving them to the front when they would not fit), then reads
/// from `src` into `data` first (a destination, when a transfer's data is due: no copy) and
/// after it into that room. Returns the bytes read, how many of them went into `data` (the
/// rest is added to `*end`), and how many there was room for.
fn read_into<R: ReadWire + ?Sized>(
    src: &mut R,
    rx: &mut [u8],
    (start, end): (&mut usize, &mut usize),
    want: usize,
    data: Option<VolatileSlice<'_>>,
) -> io::Result<(usize, usize, usize)> {
    if *start == *end {
        (*start, *end) = (0, 0);
    } else if rx.len() - *end < want && *start > 0 {
        rx.copy_within(*start..*end, 0);
        *end -= *start;
        *start = 0;
    }
    let stop = (*end + want).min(rx.len());
    let tail = VolatileSlice::from(&mut rx[*end..stop]);
    let room = tail.len() + data.map_or(0, |d| d.len());
    let (n, into_data) = match data {
        None if tail.is_empty() => return Err(io::Error::other("the receive buffer is full")),
        None => (src.read_parts(&[tail])?, 0),
        Some(data) => {
            let n = src.read_parts(&[data, tail])?;
            (n, n.min(data.len()))
        }
    };
    *end += n - into_data;
    Ok((n, into_data, room))
}
