//! Where a connection's bytes come from and go to, in parts: a receive is scattered over the
//! connection's header buffer and a command's DMA buffer, a send gathers headers and DMA
//! buffers. The socket does it with one `readv`/`writev` (no copy of the data); memory (tests,
//! fuzzing) copies, so both drive the very same [`Connection`](super::connection::Connection)
//! code.

use std::io;
use std::net::TcpStream;
use std::os::fd::AsFd;

use vm_memory::{ReadVolatile, VolatileSlice, WriteVolatile};

/// A source of received bytes.
pub trait ReadWire {
    /// Fills `parts` in order with what is there now; 0 at the end of the stream.
    /// `WouldBlock` when a non-blocking source has nothing yet.
    fn read_parts(&mut self, parts: &[VolatileSlice<'_>]) -> io::Result<usize>;
}

/// A sink for bytes to send.
pub trait WriteWire {
    /// Sends from `parts` in order what fits now; `WouldBlock` when nothing does.
    fn write_parts(&mut self, parts: &[VolatileSlice<'_>]) -> io::Result<usize>;
}

impl ReadWire for TcpStream {
    fn read_parts(&mut self, parts: &[VolatileSlice<'_>]) -> io::Result<usize> {
        usnvme_hugepages::readv_volatile(self.as_fd(), parts)
    }
}

impl WriteWire for TcpStream {
    fn write_parts(&mut self, parts: &[VolatileSlice<'_>]) -> io::Result<usize> {
        usnvme_hugepages::writev_volatile(self.as_fd(), parts)
    }
}

/// One read into a receive buffer, `rx`, whose bytes kept are `rx[*start..*end]`: makes room
/// for `want` bytes after them (moving them to the front when they would not fit), then reads
/// from `src` into `data` first (a command's buffer, when a transfer's data is due: no copy)
/// and after it into that room. Returns the bytes read and how many of them went into `data`;
/// the rest is added to `*end`. The initiator and the target receive through this one path.
pub fn read_into<R: ReadWire + ?Sized>(
    src: &mut R,
    rx: &mut [u8],
    (start, end): (&mut usize, &mut usize),
    want: usize,
    data: Option<VolatileSlice<'_>>,
) -> io::Result<(usize, usize)> {
    if *start == *end {
        (*start, *end) = (0, 0);
    } else if rx.len() - *end < want && *start > 0 {
        rx.copy_within(*start..*end, 0);
        *end -= *start;
        *start = 0;
    }
    let stop = (*end + want).min(rx.len());
    let tail = VolatileSlice::from(&mut rx[*end..stop]);
    let (n, into_data) = match data {
        None if tail.is_empty() => return Err(io::Error::other("the receive buffer is full")),
        None => (src.read_parts(&[tail])?, 0),
        Some(data) => {
            let n = src.read_parts(&[data, tail])?;
            (n, n.min(data.len()))
        }
    };
    *end += n - into_data;
    Ok((n, into_data))
}

fn volatile_error(e: vm_memory::VolatileMemoryError) -> io::Error {
    match e {
        vm_memory::VolatileMemoryError::IOError(e) => e,
        other => io::Error::other(other.to_string()),
    }
}

/// Bytes in memory, consumed from the front.
impl ReadWire for &[u8] {
    fn read_parts(&mut self, parts: &[VolatileSlice<'_>]) -> io::Result<usize> {
        let mut total = 0;
        for part in parts {
            let mut part = *part;
            let n = self.read_volatile(&mut part).map_err(volatile_error)?;
            total += n;
            if n < part.len() {
                break;
            }
        }
        Ok(total)
    }
}

/// Everything is appended.
impl WriteWire for Vec<u8> {
    fn write_parts(&mut self, parts: &[VolatileSlice<'_>]) -> io::Result<usize> {
        let mut total = 0;
        for part in parts {
            total += self.write_volatile(part).map_err(volatile_error)?;
        }
        Ok(total)
    }
}
