//! NVMe/TCP PDU framing, one for both ends: the target's connections
//! ([`export`](super::export)) and the initiator's queues (`crate::transport::tcp::initiator`)
//! receive and send PDUs through it, and only decide what the PDUs mean.
//!
//! [`Receiver`]: bytes in. A PDU's common header is read into a receive buffer and checked
//! (its type against what this end takes now, its layout against the limits agreed), then the
//! rest of its header and its header digest. The owner then says where the data goes: kept
//! whole in the receive buffer (headers, small data the owner consumes), or into a
//! destination buffer (a command's DMA buffer), the data digest checked over it: what of the
//! data a read brought into the receive buffer is copied over once, the rest comes straight
//! into the destination (one `readv` of the data and the receive buffer after it). An owner
//! may read in batches (many PDUs per `readv`: the host) or only a header ahead (no data
//! copied: the target while data for its drives can come). Reads may stop anywhere; a turn
//! has a byte budget.
//!
//! [`Transmitter`]: bytes out. A queue of segments: header bytes copied into a byte buffer of
//! fixed capacity, and data segments sent in place from the owner's buffers. One `writev`
//! gathers them; a partial write resumes where it stopped; the buffer's sent bytes are
//! reclaimed, and the owner stops reading while too many wait ([`Transmitter::pending`]).
//!
//! Nothing is allocated per PDU: both buffers are sized when the owner is made.

mod receive;
pub mod socket;
mod transmit;

pub use receive::{Ahead, Read, Receiver, Rules, Step};
pub use transmit::{Buffers, Transmitter};

/// What a [`Receiver`] needs before it can go on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Need {
    /// The start of a PDU: a header's worth ahead.
    Header,
    /// Exactly this many more bytes (a destination's data may follow them).
    Exact(usize),
    /// This many more bytes, after which a new PDU starts (its header may be read ahead).
    ThenHeader(usize),
}

#[cfg(test)]
mod tests;
