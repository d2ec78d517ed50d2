//! Bytes in memory read as a quiet non-blocking socket: a [`super::Session`] driven without a
//! socket (the fuzz target, tests) sees the same `WouldBlock` it sees from TCP.

use std::io;

use vm_memory::VolatileSlice;

use crate::fabric::framing::socket::ReadWire;

/// Bytes in memory that, once taken, would block (as a quiet socket), not end: the end of a
/// stream would end the session.
#[derive(Debug)]
pub struct Gated<'a>(pub &'a [u8]);

impl ReadWire for Gated<'_> {
    fn read_parts(&mut self, parts: &[VolatileSlice<'_>]) -> io::Result<usize> {
        if self.0.is_empty() {
            return Err(io::ErrorKind::WouldBlock.into());
        }
        self.0.read_parts(parts)
    }
}
