//! An NVMe namespace as a block device. Each channel owns one queue pair on the controller.

use std::sync::Arc;

use usnvme_driver::{Completion, Controller, IoBuffer, QueuePair, QueuePairOptions};

use super::gather::Gather;
use super::{
    check, BlockDevice, BlockError, BlockInfo, Channel, ChannelOptions, DmaTarget, IoCompletion,
    IoError, Op,
};

/// Write Zeroes and Deallocate carry at most this many blocks per command (NLB is 16 bits).
const MAX_BLOCKS_PER_COMMAND: u64 = 65536;

#[derive(Debug)]
pub struct NamespaceDevice {
    ctrl: Controller,
    nsid: u32,
    drive: usize,
    info: BlockInfo,
    name: Arc<str>,
}

impl NamespaceDevice {
    /// Namespace `nsid` of `ctrl`, which the engine knows as drive `drive`.
    pub fn new(
        ctrl: Controller,
        nsid: u32,
        drive: usize,
    ) -> Result<NamespaceDevice, usnvme_driver::Error> {
        let ns = ctrl.namespace(nsid)?;
        let block_size = ns.block_size;
        let name = if ctrl.namespaces().len() == 1 {
            ctrl.name().to_string()
        } else {
            format!("{}/ns{nsid}", ctrl.name())
        };
        let max_io = ctrl.max_transfer() / block_size as u64 * block_size as u64;
        let info = BlockInfo {
            name: name.clone(),
            size_bytes: ns.capacity_bytes(),
            block_size,
            optimal_io: block_size as u64,
            max_io,
        };
        Ok(NamespaceDevice {
            ctrl,
            nsid,
            drive,
            info,
            name: Arc::from(name),
        })
    }

    pub fn controller(&self) -> &Controller {
        &self.ctrl
    }
}

impl BlockDevice for NamespaceDevice {
    fn info(&self) -> &BlockInfo {
        &self.info
    }

    fn dma(&self) -> DmaTarget {
        DmaTarget {
            space: self.ctrl.iova_space().clone(),
            page: self.ctrl.page_size(),
        }
    }

    fn drives(&self) -> Vec<usize> {
        vec![self.drive]
    }

    fn channel(&self, options: &ChannelOptions) -> Result<Box<dyn Channel>, usnvme_driver::Error> {
        let qp = self.ctrl.create_queue_pair(QueuePairOptions {
            depth: options.depth,
            node: options.node,
            timeout: options.timeout,
        })?;
        let capacity = qp.depth() as usize - 1;
        Ok(Box::new(NamespaceChannel {
            qp,
            nsid: self.nsid,
            info: self.info.clone(),
            name: self.name.clone(),
            gather: Gather::new(capacity),
        }))
    }
}

struct NamespaceChannel {
    qp: QueuePair,
    nsid: u32,
    info: BlockInfo,
    name: Arc<str>,
    gather: Gather,
}

impl NamespaceChannel {
    /// Bytes per command for `op`.
    fn part_bytes(&self, op: Op) -> u64 {
        match op {
            Op::Read | Op::Write => self.info.max_io,
            Op::WriteZeroes | Op::Deallocate => {
                MAX_BLOCKS_PER_COMMAND * self.info.block_size as u64
            }
            Op::Flush => u64::MAX,
        }
    }
}

impl Channel for NamespaceChannel {
    fn submit(
        &mut self,
        op: Op,
        offset: u64,
        len: u64,
        buf: Option<IoBuffer>,
        token: u64,
    ) -> Result<(), BlockError> {
        check(&self.info, &self.name, op, offset, len, buf)?;
        let parts = self.commands_needed(op, len);
        if parts > self.free_commands() || !self.gather.has_room() {
            return Err(BlockError::Busy {
                device: self.name.clone(),
                needed: parts,
            });
        }
        let Some(parent) = self.gather.start(token, parts as u32) else {
            return Err(BlockError::Busy {
                device: self.name.clone(),
                needed: parts,
            });
        };
        // The common case, one read or write command, without the loop over parts.
        if let (1, Op::Read | Op::Write, Some(b)) = (parts, op, buf) {
            let lba = offset >> self.info.block_size.trailing_zeros();
            let b = IoBuffer {
                len: len as u32,
                ..b
            };
            let queued = if op == Op::Read {
                self.qp.read(self.nsid, lba, b, parent)
            } else {
                self.qp.write(self.nsid, lba, b, parent)
            };
            return queued.map_err(|source| {
                let _ = self.gather.parts_done(parent, 1, Ok(()));
                BlockError::Submit {
                    device: self.name.clone(),
                    source,
                }
            });
        }
        let bs = self.info.block_size as u64;
        let step = self.part_bytes(op);
        let mut done = 0u64;
        for part in 0..parts {
            let (at, n) = (offset + done, (len - done).min(step));
            let lba = at >> bs.trailing_zeros();
            let buffer = buf.map(|b| IoBuffer {
                iova: b.iova + done,
                len: n as u32,
            });
            let queued = match (op, buffer) {
                (Op::Read, Some(b)) => self.qp.read(self.nsid, lba, b, parent),
                (Op::Write, Some(b)) => self.qp.write(self.nsid, lba, b, parent),
                (Op::Flush, _) => self.qp.flush_cache(self.nsid, parent),
                (Op::WriteZeroes, _) => {
                    self.qp
                        .write_zeroes(self.nsid, lba, (n / bs) as u32, parent)
                }
                (Op::Deallocate, _) => self.qp.deallocate(self.nsid, lba, (n / bs) as u32, parent),
                (Op::Read | Op::Write, None) => unreachable_buffer(),
            };
            if let Err(source) = queued {
                // Parts already queued complete later; the rest never will.
                let err = BlockError::Submit {
                    device: self.name.clone(),
                    source,
                };
                if part == 0 {
                    let _ = self.gather.parts_done(parent, parts as u32, Ok(()));
                    return Err(err);
                }
                let failed = IoError::Status {
                    device: self.name.clone(),
                    status: usnvme_driver::spec::Status::INTERNAL_ERROR,
                };
                let _ = self
                    .gather
                    .parts_done(parent, (parts - part) as u32, Err(failed));
                log::error!("{err}: I/O partly submitted; it will complete with an error");
                return Ok(());
            }
            done += n;
        }
        Ok(())
    }

    fn poll(&mut self, on_complete: &mut dyn FnMut(IoCompletion)) -> usize {
        let (gather, name) = (&mut self.gather, &self.name);
        let mut finished = 0;
        self.qp.poll(|c: Completion| {
            let result = if c.status.is_success() {
                Ok(())
            } else {
                Err(IoError::Status {
                    device: name.clone(),
                    status: c.status,
                })
            };
            if let Some(done) = gather.part_done(c.token, result) {
                finished += 1;
                on_complete(done);
            }
        });
        finished
    }

    fn in_flight(&self) -> usize {
        self.gather.in_flight()
    }

    fn commands_needed(&self, op: Op, len: u64) -> usize {
        if op == Op::Flush {
            return 1;
        }
        let step = self.part_bytes(op);
        if len <= step {
            return 1; // the common case, without a division
        }
        len.div_ceil(step) as usize
    }

    fn free_commands(&self) -> usize {
        (self.qp.depth() as usize - 1).saturating_sub(self.qp.in_flight() as usize)
    }
}

/// `check` guarantees reads and writes have a buffer.
fn unreachable_buffer() -> Result<(), usnvme_driver::SubmitError> {
    Err(usnvme_driver::SubmitError::Unsupported {
        what: "a read or write without a buffer",
    })
}
