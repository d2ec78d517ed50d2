//! Where a connection's bytes come from and go to, in parts: a receive is scattered over the
//! connection's header buffer and a command's DMA buffer, a send gathers headers and DMA
//! buffers. The socket does it with one `readv`/`writev` (no copy of the data); memory (tests,
//! fuzzing) copies, so both drive the very same [`Connection`](crate::fabric::export::connection::Connection)
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
