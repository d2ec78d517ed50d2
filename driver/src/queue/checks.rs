//! What a command is checked against before it is queued: its namespace's geometry and
//! format (one lookup and three comparisons on the I/O path) and the largest transfer.

use crate::error::SubmitError;
use crate::protection::Guard;
use crate::spec::command::MAX_BLOCKS_PER_COMMAND;
use crate::spec::Sqe;

use super::{MetadataIo, NamespaceGeometry, QueuePair};

/// A namespace as the queue pair checks commands against it, derived once from its geometry
/// and the largest transfer, so that the I/O path tests a read or write with one lookup and
/// three comparisons: whole blocks (`block_mask`), 1 to `max_blocks` of them (the 16-bit block
/// count and MDTS in one), inside the namespace. An nsid without a usable geometry has `nsid`
/// and `max_blocks` 0: every I/O fails the test, and the full checks (`blocks_for`) name what
/// is wrong.
#[derive(Debug, Clone, Copy, Default)]
pub(super) struct IoLimits {
    nsid: u32,
    block_shift: u32,
    block_mask: u64,
    max_blocks: u64,
    blocks: u64,
    /// Non-zero: the namespace has metadata, and `max_blocks` is 0 (see NamespaceGeometry).
    metadata_size: u16,
}

impl IoLimits {
    pub(super) fn of(g: &NamespaceGeometry, nsid: u32, max_transfer: u64) -> IoLimits {
        if g.nsid != nsid || !g.block_size.is_power_of_two() {
            return IoLimits::default();
        }
        if g.metadata.size > 0 {
            return IoLimits {
                nsid,
                metadata_size: g.metadata.size,
                ..IoLimits::default()
            };
        }
        let block_shift = g.block_size.trailing_zeros();
        IoLimits {
            nsid,
            block_mask: u64::from(g.block_size) - 1,
            block_shift,
            max_blocks: (max_transfer >> block_shift).min(MAX_BLOCKS_PER_COMMAND),
            blocks: g.blocks,
            metadata_size: 0,
        }
    }
}

impl QueuePair {
    /// The namespace `nsid` as this queue pair checks I/O against it.
    pub fn namespace_geometry(&self, nsid: u32) -> Option<NamespaceGeometry> {
        let g = self.namespaces.get(nsid.checked_sub(1)? as usize)?;
        (g.nsid == nsid).then_some(*g)
    }

    /// `sqe` (a read or write) checked against its namespace's format and completed with the
    /// metadata pointer and the protection fields.
    pub(super) fn metadata_command(
        &self,
        mut sqe: Sqe,
        io: MetadataIo,
    ) -> Result<Sqe, SubmitError> {
        let MetadataIo { data, metadata, pi } = io;
        let (nsid, slba, blocks) = (sqe.nsid, sqe.slba(), u64::from(sqe.blocks()));
        let g = self
            .namespace_geometry(nsid)
            .ok_or(SubmitError::InvalidNamespace { nsid })?;
        let format = g.metadata;
        if format.size == 0 {
            return Err(SubmitError::NoMetadata { nsid });
        }
        if format.protection.is_none() && (pi.action || pi.cdw12() != 0) {
            return Err(SubmitError::NoProtection { nsid });
        }
        check_block_count(blocks)?;
        if slba.checked_add(blocks).is_none_or(|end| end > g.blocks) {
            return Err(SubmitError::LbaRange {
                slba,
                blocks,
                capacity: g.blocks,
            });
        }
        let (per_block, metadata_per_block) = format.bytes_per_block(g.block_size, pi.action);
        let bytes = u64::from(data.len);
        if bytes != blocks * per_block {
            return Err(SubmitError::DataLength {
                bytes,
                expected: blocks * per_block,
            });
        }
        if bytes > self.max_transfer {
            return Err(SubmitError::ExceedsMdts {
                bytes,
                max: self.max_transfer,
            });
        }
        let expected = blocks * metadata_per_block;
        sqe.mptr = match metadata {
            None if expected == 0 => 0,
            Some(m) if u64::from(m.len) == expected && expected > 0 && m.iova.is_multiple_of(4) => {
                m.iova
            }
            other => {
                return Err(SubmitError::MetadataLength {
                    bytes: other.map_or(0, |m| u64::from(m.len)),
                    expected,
                })
            }
        };
        sqe.cdw12 |= pi.cdw12();
        sqe.cdw14 = pi.ref_tag as u32;
        if format.protection.is_some_and(|p| p.guard == Guard::Crc64) {
            sqe.cdw3 = ((pi.ref_tag >> 32) & 0xffff) as u32;
        }
        sqe.cdw15 = u32::from(pi.app_tag) | u32::from(pi.app_mask) << 16;
        Ok(sqe)
    }

    #[inline]
    pub(super) fn namespace(&self, nsid: u32) -> Result<IoLimits, SubmitError> {
        nsid.checked_sub(1)
            .and_then(|i| self.limits.get(i as usize))
            .filter(|l| l.nsid == nsid)
            .copied()
            .ok_or(SubmitError::InvalidNamespace { nsid })
    }

    /// The block count of a read or write of `bytes` at `slba`: whole blocks, within the
    /// namespace, within the largest transfer. The one place a read or write is checked
    /// against the namespace: the fast test (see [`IoLimits`]), and when it fails, the full
    /// checks, which say what is wrong.
    #[inline(always)]
    pub(super) fn io_blocks(&self, nsid: u32, slba: u64, bytes: u32) -> Result<u32, SubmitError> {
        let bytes = u64::from(bytes);
        if let Some(l) = self.limits.get(nsid.wrapping_sub(1) as usize) {
            let blocks = bytes >> l.block_shift;
            if bytes & l.block_mask == 0
                && blocks.wrapping_sub(1) < l.max_blocks
                && slba.checked_add(blocks).is_some_and(|end| end <= l.blocks)
            {
                return Ok(blocks as u32);
            }
        }
        Err(self.io_error(nsid, slba, bytes))
    }

    /// Why a read or write failed the fast test of `io_blocks`.
    #[cold]
    #[inline(never)]
    fn io_error(&self, nsid: u32, slba: u64, bytes: u64) -> SubmitError {
        match self.blocks_for(nsid, slba, bytes) {
            Err(e) => e,
            // whole blocks inside the namespace, more than one command may carry
            Ok(_) => SubmitError::ExceedsMdts {
                bytes,
                max: self.max_transfer,
            },
        }
    }

    /// The block count of `bytes` at `slba`: whole blocks, within the namespace.
    fn blocks_for(&self, nsid: u32, slba: u64, bytes: u64) -> Result<u32, SubmitError> {
        let ns = self.namespace(nsid)?;
        // (Flush, Write Zeroes and Dataset Management move no data: they take such namespaces)
        if ns.metadata_size > 0 {
            return Err(SubmitError::Metadata {
                nsid,
                bytes: ns.metadata_size,
            });
        }
        if bytes & ns.block_mask != 0 || bytes == 0 {
            return Err(SubmitError::NotBlockMultiple {
                bytes,
                block_size: 1 << ns.block_shift,
            });
        }
        let blocks = bytes >> ns.block_shift;
        check_block_count(blocks)?;
        if slba.checked_add(blocks).is_none_or(|end| end > ns.blocks) {
            return Err(SubmitError::LbaRange {
                slba,
                blocks,
                capacity: ns.blocks,
            });
        }
        Ok(blocks as u32)
    }
}

pub(super) fn check_block_count(blocks: u64) -> Result<(), SubmitError> {
    if blocks == 0 || blocks > MAX_BLOCKS_PER_COMMAND {
        return Err(SubmitError::BlockCount { blocks });
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::protection::MetadataFormat;

    #[test]
    fn io_limits_fold_the_block_count_and_the_largest_transfer() {
        let g = |nsid, block_size| NamespaceGeometry {
            nsid,
            block_size,
            blocks: 1000,
            metadata: MetadataFormat::default(),
        };
        let l = IoLimits::of(&g(1, 512), 1, 2 << 20);
        assert_eq!((l.block_mask, l.block_shift), (511, 9));
        assert_eq!((l.max_blocks, l.blocks), (4096, 1000));
        // NLB is 16 bits: 65536 blocks at most, whatever the controller takes
        assert_eq!(IoLimits::of(&g(1, 512), 1, 1 << 30).max_blocks, 65536);
        // no I/O passes the fast test of an nsid without a usable geometry, nor any other check
        for (geometry, nsid) in [(g(0, 0), 1), (g(1, 0), 1), (g(1, 1000), 1), (g(1, 512), 2)] {
            let l = IoLimits::of(&geometry, nsid, 2 << 20);
            assert_eq!((l.nsid, l.max_blocks), (0, 0));
        }
    }
}
