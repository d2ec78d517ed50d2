//! A stripe (RAID 0) over block devices: chunk `i` of the stripe lives on member `i % width`,
//! at that member's chunk `i / width`. An I/O is split at chunk boundaries, each part goes to
//! its member's channel, and the I/O completes once every part has.

use std::sync::Arc;

use usnvme_driver::IoBuffer;

use super::gather::Gather;
use super::{
    check, BlockDevice, BlockError, BlockInfo, Channel, ChannelOptions, DmaTarget, IoCompletion, Op,
};

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

    fn channel(&self, options: &ChannelOptions) -> Result<Box<dyn Channel>, usnvme_driver::Error> {
        let members = self
            .members
            .iter()
            .map(|m| m.channel(options))
            .collect::<Result<Vec<_>, _>>()?;
        let capacity: usize = members.iter().map(|m| m.free_commands()).sum();
        Ok(Box::new(StripeChannel {
            members,
            chunk: self.chunk,
            info: self.info.clone(),
            name: self.name.clone(),
            gather: Gather::new(capacity.max(1)),
            needed: vec![0; self.members.len()],
        }))
    }
}

struct StripeChannel {
    members: Vec<Box<dyn Channel>>,
    chunk: u64,
    info: BlockInfo,
    name: Arc<str>,
    gather: Gather,
    /// Scratch: commands per member for the I/O being submitted (allocated once).
    needed: Vec<usize>,
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

impl Channel for StripeChannel {
    fn submit(
        &mut self,
        op: Op,
        offset: u64,
        len: u64,
        buf: Option<IoBuffer>,
        token: u64,
    ) -> Result<(), BlockError> {
        check(&self.info, &self.name, op, offset, len, buf)?;
        let width = self.members.len();
        // All or nothing: every member must have room for its parts before any is queued.
        self.needed.iter_mut().for_each(|n| *n = 0);
        let mut count = 0u32;
        if op == Op::Flush {
            for (m, n) in self.members.iter().zip(self.needed.iter_mut()) {
                *n = m.commands_needed(op, 0);
            }
            count = width as u32;
        } else {
            for p in parts(offset, len, self.chunk, width) {
                self.needed[p.member] += self.members[p.member].commands_needed(op, p.len);
                count += 1;
            }
        }
        let short = self
            .members
            .iter()
            .zip(&self.needed)
            .any(|(m, n)| *n > m.free_commands());
        if short || !self.gather.has_room() {
            return Err(BlockError::Busy {
                device: self.name.clone(),
                needed: self.needed.iter().sum(),
            });
        }
        let Some(parent) = self.gather.start(token, count) else {
            return Err(BlockError::Busy {
                device: self.name.clone(),
                needed: count as usize,
            });
        };
        if op == Op::Flush {
            for member in self.members.iter_mut() {
                if let Err(e) = member.submit(op, 0, 0, None, parent) {
                    log::error!("{}: flush of a member failed to queue: {e}", self.name);
                    let _ = self.gather.part_done(parent, Ok(()));
                }
            }
            return Ok(());
        }
        for p in parts(offset, len, self.chunk, width) {
            let b = buf.map(|b| IoBuffer {
                iova: b.iova + p.at,
                len: p.len as u32,
            });
            if let Err(e) = self.members[p.member].submit(op, p.offset, p.len, b, parent) {
                // cannot happen after the room check; fail this part rather than lose the I/O
                log::error!("{}: part of an I/O failed to queue: {e}", self.name);
                let failed = super::IoError::Status {
                    device: self.name.clone(),
                    status: usnvme_driver::spec::Status::INTERNAL_ERROR,
                };
                let _ = self.gather.part_done(parent, Err(failed));
            }
        }
        Ok(())
    }

    fn poll(&mut self, on_complete: &mut dyn FnMut(IoCompletion)) -> usize {
        let gather = &mut self.gather;
        let mut finished = 0;
        for member in self.members.iter_mut() {
            member.poll(&mut |c: IoCompletion| {
                if let Some(done) = gather.part_done(c.token, c.result) {
                    finished += 1;
                    on_complete(done);
                }
            });
        }
        finished
    }

    fn in_flight(&self) -> usize {
        self.gather.in_flight()
    }

    fn commands_needed(&self, op: Op, len: u64) -> usize {
        if op == Op::Flush {
            return self.members.iter().map(|m| m.commands_needed(op, 0)).sum();
        }
        // An upper bound: every chunk-sized part may need its own commands.
        let per_part = self
            .members
            .first()
            .map_or(1, |m| m.commands_needed(op, self.chunk));
        (len.div_ceil(self.chunk) as usize + 1) * per_part
    }

    fn free_commands(&self) -> usize {
        self.members
            .iter()
            .map(|m| m.free_commands())
            .min()
            .unwrap_or(0)
    }
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
