//! A stripe (RAID 0) over block devices: chunk `i` of the stripe lives on member `i % width`,
//! at that member's chunk `i / width`. An I/O is split at chunk boundaries, each part goes to
//! its member's channel, and the I/O completes once every part has.

use std::sync::Arc;

use usnvme_driver::IoBuffer;

use super::split::SplitIos;
use super::{
    check, BlockDevice, BlockError, BlockInfo, Channel, ChannelOptions, DmaTarget, Finished,
    NamespaceChannel, Op, STRIPE_PARENT,
};
use crate::transport::Queues;

#[derive(Debug)]
pub struct StripeDevice {
    members: Vec<Arc<dyn BlockDevice>>,
    chunk: u64,
    info: BlockInfo,
    name: Arc<str>,
}

/// Why a stripe cannot be built.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum StripeError {
    #[error("a stripe needs at least one member")]
    NoMembers,
    #[error(
        "stripe members must have the same block size: {first} has {a} bytes, {other} has {b}"
    )]
    BlockSizes {
        first: String,
        a: u32,
        other: String,
        b: u32,
    },
    #[error("chunk size {chunk} must be a positive multiple of the {block_size}-byte block size")]
    Chunk { chunk: u64, block_size: u32 },
    #[error("member {member} is in another DMA address space than the first (simulated and real drives cannot be striped together)")]
    Spaces { member: String },
    #[error("member {member} moves metadata with its data, which a stripe's buffers do not hold: stripe such drives with --pi PRACT=1 on a format whose metadata is its protection information alone (the drive inserts and strips it), or format them without metadata")]
    Metadata { member: String },
    #[error("member {member} ({size} bytes) is smaller than one chunk ({chunk} bytes)")]
    TooSmall {
        member: String,
        size: u64,
        chunk: u64,
    },
}

impl StripeDevice {
    pub fn new(
        name: &str,
        members: Vec<Arc<dyn BlockDevice>>,
        chunk: u64,
    ) -> Result<StripeDevice, StripeError> {
        let first = members
            .first()
            .ok_or(StripeError::NoMembers)?
            .info()
            .clone();
        for m in &members {
            let i = m.info();
            if i.block_size != first.block_size {
                return Err(StripeError::BlockSizes {
                    first: first.name.clone(),
                    a: first.block_size,
                    other: i.name.clone(),
                    b: i.block_size,
                });
            }
            // the members' commands carry their PI (each its own LBAs as reference tags), but
            // a stripe's buffers hold data only
            if i.buffer_bytes(u64::from(i.block_size)) != u64::from(i.block_size) {
                return Err(StripeError::Metadata {
                    member: i.name.clone(),
                });
            }
            if i.size_bytes < chunk {
                return Err(StripeError::TooSmall {
                    member: i.name.clone(),
                    size: i.size_bytes,
                    chunk,
                });
            }
        }
        let space = members[0].dma().space;
        if let Some(m) = members
            .iter()
            .find(|m| !Arc::ptr_eq(&m.dma().space, &space))
        {
            return Err(StripeError::Spaces {
                member: m.info().name.clone(),
            });
        }
        if chunk == 0 || !chunk.is_multiple_of(first.block_size as u64) {
            return Err(StripeError::Chunk {
                chunk,
                block_size: first.block_size,
            });
        }
        // Every member contributes the same whole number of chunks.
        let rows = members
            .iter()
            .map(|m| m.info().size_bytes / chunk)
            .min()
            .unwrap_or(0);
        let info = BlockInfo {
            name: name.to_string(),
            size_bytes: rows * chunk * members.len() as u64,
            block_size: first.block_size,
            optimal_io: chunk,
            max_io: chunk * members.len() as u64,
            protection: None,
        };
        Ok(StripeDevice {
            members,
            chunk,
            info,
            name: Arc::from(name),
        })
    }

    pub fn members(&self) -> &[Arc<dyn BlockDevice>] {
        &self.members
    }

    pub fn chunk(&self) -> u64 {
        self.chunk
    }
}

impl BlockDevice for StripeDevice {
    fn info(&self) -> &BlockInfo {
        &self.info
    }

    fn dma(&self) -> DmaTarget {
        // members share one IOVA space (one VFIO container, or the sim space): checked in `new`
        self.members[0].dma()
    }

    fn drives(&self) -> Vec<usize> {
        self.members.iter().flat_map(|m| m.drives()).collect()
    }

    fn channel(
        &self,
        queues: &mut Queues,
        options: &ChannelOptions,
    ) -> Result<Channel, usnvme_driver::Error> {
        let mut members = Vec::with_capacity(self.members.len());
        for m in &self.members {
            match m.channel(queues, options)? {
                Channel::Namespace(c) => members.push(c),
                _ => {
                    return Err(usnvme_driver::Error::Invalid {
                        device: self.name.to_string(),
                        what: format!("member {} is not a namespace", m.info().name),
                    })
                }
            }
        }
        let capacity: usize = members.iter().map(|m| m.free_commands()).sum();
        Ok(Channel::Stripe(StripeChannel {
            members,
            chunk: self.chunk,
            info: self.info.clone(),
            // a copy of its own: an error that names the device (a full queue: Busy) touches
            // this reactor's reference count, not one every reactor on the device shares
            name: Arc::from(&*self.name),
            splits: SplitIos::new(capacity.max(1)),
            now_ns: 0,
        }))
    }
}

/// A reactor's channels on every member of a stripe.
#[derive(Debug)]
pub struct StripeChannel {
    /// Namespaces: a stripe of stripes would be a stripe with a smaller chunk.
    members: Vec<NamespaceChannel>,
    chunk: u64,
    info: BlockInfo,
    name: Arc<str>,
    /// Parents of the I/Os that span several chunks (only those).
    splits: SplitIos,
    now_ns: u64,
}

/// One part of a striped I/O: `len` bytes at `offset` of member `member`, `at` bytes into the I/O.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Part {
    member: usize,
    offset: u64,
    len: u64,
    at: u64,
}

/// The parts of `len` bytes at `offset` over `width` members with `chunk`-byte chunks.
fn parts(offset: u64, len: u64, chunk: u64, width: usize) -> impl Iterator<Item = Part> {
    let mut at = 0u64;
    std::iter::from_fn(move || {
        if at >= len {
            return None;
        }
        let pos = offset + at;
        let index = pos / chunk;
        let within = pos % chunk;
        let n = (chunk - within).min(len - at);
        let part = Part {
            member: (index % width as u64) as usize,
            offset: (index / width as u64) * chunk + within,
            len: n,
            at,
        };
        at += n;
        Some(part)
    })
}

impl StripeChannel {
    pub(crate) fn name(&self) -> &Arc<str> {
        &self.name
    }

    /// An I/O inside one chunk (the common case) goes to its member with the caller's token,
    /// touching nothing else; one that spans chunks gets a parent that completes once.
    #[inline]
    pub(crate) fn submit(
        &mut self,
        op: Op,
        offset: u64,
        len: u64,
        buf: Option<IoBuffer>,
        token: u64,
    ) -> Result<(), BlockError> {
        check(&self.info, &self.name, op, offset, len, buf)?;
        if op != Op::Flush {
            let mut one = parts(offset, len, self.chunk, self.members.len());
            if let (Some(p), None) = (one.next(), one.next()) {
                return self.members[p.member].submit(op, p.offset, p.len, buf, token);
            }
        }
        self.submit_parts(op, offset, len, buf, token)
    }

    fn submit_parts(
        &mut self,
        op: Op,
        offset: u64,
        len: u64,
        buf: Option<IoBuffer>,
        token: u64,
    ) -> Result<(), BlockError> {
        let width = self.members.len();
        // All or nothing: every member an I/O touches must have room for its parts (a member
        // touched twice is checked against the sum; I/Os span a few chunks).
        let count = if op == Op::Flush {
            if self.members.iter().any(|m| m.free_commands() == 0) {
                return Err(BlockError::busy(&self.name, width));
            }
            width as u32
        } else {
            let mut count = 0u32;
            for p in parts(offset, len, self.chunk, width) {
                let needed: usize = parts(offset, len, self.chunk, width)
                    .filter(|q| q.member == p.member)
                    .map(|q| self.members[q.member].commands_needed(op, q.len))
                    .sum();
                if needed > self.members[p.member].free_commands() {
                    return Err(BlockError::busy(&self.name, needed));
                }
                count += 1;
            }
            count
        };
        let bytes = if op.has_data() { len } else { 0 };
        let (chunk, members) = (self.chunk, &mut self.members);
        let mut parts_of = parts(offset, len, chunk, width);
        self.splits.submit(
            &self.name,
            token,
            count as usize,
            bytes,
            self.now_ns,
            STRIPE_PARENT,
            |i, part_token| {
                if op == Op::Flush {
                    return members[i].submit(op, 0, 0, None, part_token);
                }
                let Some(p) = parts_of.next() else {
                    return Err(BlockError::busy(&self.name, 1));
                };
                let b = buf.map(|b| IoBuffer {
                    iova: b.iova + p.at,
                    len: p.len as u32,
                });
                members[p.member].submit(op, p.offset, p.len, b, part_token)
            },
        )
    }

    /// Polls the members with something queued or in flight only.
    #[inline]
    pub(crate) fn poll(&mut self, mut on_finished: impl FnMut(Finished)) -> usize {
        let splits = &mut self.splits;
        let mut finished = 0;
        for member in self.members.iter_mut().filter(|m| m.busy()) {
            member.poll(|f: Finished| {
                if let Some(f) = up(splits, f) {
                    finished += 1;
                    on_finished(f);
                }
            });
        }
        finished
    }

    pub(crate) fn abandon(&mut self, mut on_finished: impl FnMut(Finished)) -> usize {
        let splits = &mut self.splits;
        let mut finished = 0;
        for member in self.members.iter_mut() {
            member.abandon(|f: Finished| {
                if let Some(f) = up(splits, f) {
                    finished += 1;
                    on_finished(f);
                }
            });
        }
        finished
    }

    pub(crate) fn flush(&mut self) {
        self.members.iter_mut().for_each(NamespaceChannel::flush);
    }

    pub(crate) fn set_now(&mut self, now_ns: u64) {
        self.now_ns = now_ns;
        self.members.iter_mut().for_each(|m| m.set_now(now_ns));
    }

    /// The members' queues as their own where no other channel shares them.
    pub(crate) fn settle(self) -> StripeChannel {
        StripeChannel {
            members: self
                .members
                .into_iter()
                .map(NamespaceChannel::settle)
                .collect(),
            ..self
        }
    }

    pub(crate) fn shares_queue(&self) -> bool {
        self.members.iter().any(NamespaceChannel::shares_queue)
    }

    /// The channel is going: the shared queues under it no longer keep its completions.
    pub(crate) fn leave(&self) {
        self.members.iter().for_each(NamespaceChannel::leave);
    }

    /// Why a member's queue ended, once one has.
    pub(crate) fn ended(&self) -> Option<String> {
        self.members.iter().find_map(NamespaceChannel::ended)
    }

    pub(crate) fn reconnects(&self) -> u32 {
        self.members.iter().map(NamespaceChannel::reconnects).sum()
    }

    /// The members' interrupts (see [`Channel::interrupts`](super::Channel::interrupts)).
    pub(crate) fn interrupts<'a>(&'a self, out: &mut Vec<std::os::fd::BorrowedFd<'a>>) {
        out.extend(self.members.iter().filter_map(NamespaceChannel::interrupt));
    }

    pub(crate) fn busy(&self) -> bool {
        self.members.iter().any(NamespaceChannel::busy)
    }

    pub(crate) fn free_commands(&self) -> usize {
        self.members
            .iter()
            .map(NamespaceChannel::free_commands)
            .min()
            .unwrap_or(0)
    }
}

/// A member's finished I/O as the stripe's: itself when it was a whole I/O, else its parent
/// once every part is done.
#[inline]
fn up(splits: &mut SplitIos, f: Finished) -> Option<Finished> {
    if f.token & STRIPE_PARENT == 0 {
        return Some(f);
    }
    splits.part_done(f.token & !STRIPE_PARENT, f.failure)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_io_over_three_chunks_lands_on_three_members() {
        // 4 members, 64 KiB chunks; 128 KiB starting 32 KiB into chunk 1
        let p: Vec<Part> = parts(96 << 10, 128 << 10, 64 << 10, 4).collect();
        assert_eq!(
            p,
            vec![
                Part {
                    member: 1,
                    offset: 32 << 10,
                    len: 32 << 10,
                    at: 0
                },
                Part {
                    member: 2,
                    offset: 0,
                    len: 64 << 10,
                    at: 32 << 10
                },
                Part {
                    member: 3,
                    offset: 0,
                    len: 32 << 10,
                    at: 96 << 10
                },
            ]
        );
        // the second row: chunk 5 is member 1's second chunk
        assert_eq!(
            parts(5 * (64 << 10), 4096, 64 << 10, 4).next(),
            Some(Part {
                member: 1,
                offset: 64 << 10,
                len: 4096,
                at: 0
            })
        );
    }
}
