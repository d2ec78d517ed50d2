//! `--pi` in the perf job: where each block's data and metadata sit in an I/O's buffer on a
//! namespace driven with its metadata, and the protection information perf makes before a
//! write and checks after a read when the drive does not insert it (PRACT=0), as SPDK's perf
//! does with `-e PRACT=0`. The drive checks what PRCHK asks either way; perf checks every
//! field of what it reads back.

use usnvme_driver::protection::{PiChecks, PiFormat};
use usnvme_engine::transport::NamespaceProtection;
use usnvme_engine::BlockInfo;
use usnvme_hugepages::DmaBuffer;

use super::workload::Mismatch;

/// Where the blocks of an I/O sit in its buffer: block `b`'s data at `b * stride` (its
/// metadata right after it on an extended-LBA format), and the metadata kept apart after all
/// the blocks' data.
#[derive(Debug, Clone, Copy)]
pub(super) struct BufferLayout {
    pub block: usize,
    pub stride: usize,
    apart: usize,
    metadata: usize,
    /// perf makes and checks the tuples: PRACT=0 on a format with PI.
    software: Option<(PiFormat, NamespaceProtection)>,
}

impl BufferLayout {
    pub fn of(info: &BlockInfo) -> BufferLayout {
        let block = info.block_size as usize;
        let Some(p) = info.protection else {
            return BufferLayout {
                block,
                stride: block,
                apart: 0,
                metadata: 0,
                software: None,
            };
        };
        let (stride, apart) = p.layout(info.block_size);
        BufferLayout {
            block,
            stride: stride as usize,
            apart: apart as usize,
            metadata: (stride + apart) as usize - block,
            software: p.format.protection.filter(|_| !p.action).map(|pi| (pi, p)),
        }
    }

    /// Metadata bytes per block the host makes or checks (0: none travels, or perf has nothing
    /// to do with it).
    pub fn scratch_bytes(&self) -> usize {
        if self.software.is_some() {
            self.metadata
        } else {
            0
        }
    }

    /// Where block `b` of `blocks` keeps its metadata in the buffer.
    fn metadata_at(&self, b: usize, blocks: usize) -> usize {
        if self.apart > 0 {
            blocks * self.stride + b * self.apart
        } else {
            b * self.stride + self.block
        }
    }

    /// Before a write of `blocks` blocks at `lba`: every block's tuple, from the data the
    /// buffer holds (`data` and `metadata`: one block's worth of scratch).
    pub fn protect(
        &self,
        buf: &DmaBuffer,
        lba: u64,
        blocks: usize,
        data: &mut [u8],
        metadata: &mut [u8],
    ) {
        let Some((pi, p)) = self.software else {
            return;
        };
        let first = p.ref_tag(lba);
        for b in 0..blocks {
            let at = self.metadata_at(b, blocks);
            // the buffer holds the I/O's blocks: these cannot fail
            let _ = buf.read_into(data, b * self.stride);
            let _ = buf.read_into(metadata, at);
            pi.generate(data, metadata, pi.ref_tag_at(first, b as u64), p.app_tag);
            let _ = buf.write_from(metadata, at);
        }
    }

    /// After a read of `blocks` blocks at `lba`: every tuple checked whole (guard, application
    /// and reference tags), each failure kept as a mismatch naming its block.
    pub fn check(
        &self,
        buf: &DmaBuffer,
        lba: u64,
        blocks: usize,
        scratch: (&mut [u8], &mut [u8]),
        kept: &mut Vec<Mismatch>,
        more: &mut u64,
    ) {
        let Some((pi, p)) = self.software else {
            return;
        };
        let (data, metadata) = scratch;
        let fields = usnvme_driver::protection::PiFields {
            checks: pi.allowed(PiChecks::ALL),
            ..p.fields(lba)
        };
        for b in 0..blocks {
            if buf.read_into(data, b * self.stride).is_err()
                || buf
                    .read_into(metadata, self.metadata_at(b, blocks))
                    .is_err()
            {
                continue;
            }
            let expected = pi.ref_tag_at(fields.ref_tag, b as u64);
            if let Err(e) = pi.check(data, metadata, &fields, expected) {
                let what = format!("protection information: {e}");
                super::workload::keep(kept, more, lba + b as u64, what);
            }
        }
    }
}
