//! An NVMe namespace as a block device. Each channel owns one queue pair on the controller.

use std::sync::Arc;

use usnvme_driver::spec::Status;
use usnvme_driver::{Completion, Controller, IoBuffer, QueuePair, QueuePairOptions};

use super::split::SplitIos;
use super::{
    check, BlockDevice, BlockError, BlockInfo, Channel, ChannelOptions, DmaTarget, Finished,
    IoError, Op, NAMESPACE_PARENT,
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

    fn channel(&self, options: &ChannelOptions) -> Result<Channel, usnvme_driver::Error> {
        let qp = self.ctrl.create_queue_pair(QueuePairOptions {
            depth: options.queue_entries(self.ctrl.max_transfer(), self.ctrl.cap().mqes()),
            node: options.node,
            timeout: options.timeout,
        })?;
        let capacity = qp.depth() as usize - 1;
        Ok(Channel::Namespace(NamespaceChannel {
            qp,
            nsid: self.nsid,
            block_shift: self.info.block_size.trailing_zeros(),
            info: self.info.clone(),
            name: self.name.clone(),
            splits: SplitIos::new(capacity),
            now_ns: 0,
        }))
    }
}

/// A reactor's queue pair on one namespace.
#[derive(Debug)]
pub struct NamespaceChannel {
    qp: QueuePair,
    nsid: u32,
    block_shift: u32,
    info: BlockInfo,
    name: Arc<str>,
    /// Parents of the I/Os split into several commands (only those).
    splits: SplitIos,
    now_ns: u64,
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

    pub(crate) fn name(&self) -> &Arc<str> {
        &self.name
    }

    /// A read or write of one command goes straight to the queue pair with the caller's token:
    /// the driver checks it against the namespace (the layer that owns those facts) and keeps
    /// the token. Only what the byte-to-block translation would hide is checked here.
    #[inline]
    pub(crate) fn submit(
        &mut self,
        op: Op,
        offset: u64,
        len: u64,
        buf: Option<IoBuffer>,
        token: u64,
    ) -> Result<(), BlockError> {
        if let (Op::Read | Op::Write, Some(b)) = (op, buf) {
            if len <= self.info.max_io && b.len as u64 >= len {
                let mask = (1u64 << self.block_shift) - 1;
                if offset & mask != 0 {
                    return Err(BlockError::Misaligned {
                        device: self.name.clone(),
                        offset,
                        len,
                        block_size: self.info.block_size,
                    });
                }
                let lba = offset >> self.block_shift;
                let b = IoBuffer {
                    len: len as u32,
                    ..b
                };
                let queued = if op == Op::Read {
                    self.qp.read(self.nsid, lba, b, token)
                } else {
                    self.qp.write(self.nsid, lba, b, token)
                };
                return queued
                    .map_err(|e| BlockError::from_driver(&self.name, offset, len, e, &self.info));
            }
        }
        self.submit_parts(op, offset, len, buf, token)
    }

    /// Everything else: checked here, split into commands that complete as one I/O.
    fn submit_parts(
        &mut self,
        op: Op,
        offset: u64,
        len: u64,
        buf: Option<IoBuffer>,
        token: u64,
    ) -> Result<(), BlockError> {
        check(&self.info, &self.name, op, offset, len, buf)?;
        let parts = self.commands_needed(op, len);
        let bytes = if op.has_data() { len } else { 0 };
        let parent = (parts <= self.free_commands())
            .then(|| self.splits.start(token, parts as u32, bytes, self.now_ns))
            .flatten();
        let Some(parent) = parent else {
            return Err(BlockError::busy(&self.name, parts));
        };
        let part_token = NAMESPACE_PARENT | parent;
        let bs = self.info.block_size as u64;
        let step = self.part_bytes(op);
        let mut done = 0u64;
        for part in 0..parts {
            let (at, n) = (offset + done, (len - done).min(step));
            let lba = at >> self.block_shift;
            let buffer = buf.map(|b| IoBuffer {
                iova: b.iova + done,
                len: n as u32,
            });
            let queued = match (op, buffer) {
                (Op::Read, Some(b)) => self.qp.read(self.nsid, lba, b, part_token),
                (Op::Write, Some(b)) => self.qp.write(self.nsid, lba, b, part_token),
                (Op::Flush, _) => self.qp.flush_cache(self.nsid, part_token),
                (Op::WriteZeroes, _) => {
                    self.qp
                        .write_zeroes(self.nsid, lba, (n / bs) as u32, part_token)
                }
                (Op::Deallocate, _) => {
                    self.qp
                        .deallocate(self.nsid, lba, (n / bs) as u32, part_token)
                }
                (Op::Read | Op::Write, None) => unreachable_buffer(),
            };
            if let Err(e) = queued {
                // Parts already queued complete later; the rest never will.
                let err = BlockError::from_driver(&self.name, offset, len, e, &self.info);
                if part == 0 {
                    let _ = self.splits.parts_done(parent, parts as u32, Ok(()));
                    return Err(err);
                }
                let failed = IoError::Device {
                    device: self.name.clone(),
                    status: Status::INTERNAL_ERROR,
                };
                let _ = self
                    .splits
                    .parts_done(parent, (parts - part) as u32, Err(failed));
                log::error!("{err}: I/O partly submitted; it will complete with an error");
                return Ok(());
            }
            done += n;
        }
        Ok(())
    }

    #[inline]
    pub(crate) fn poll(&mut self, mut on_finished: impl FnMut(Finished)) -> usize {
        let (splits, name) = (&mut self.splits, &self.name);
        let mut finished = 0;
        self.qp.poll(|c: Completion| {
            if let Some(f) = finish(splits, name, c) {
                finished += 1;
                on_finished(f);
            }
        });
        finished
    }

    pub(crate) fn abandon(&mut self, mut on_finished: impl FnMut(Finished)) -> usize {
        let (splits, name) = (&mut self.splits, &self.name);
        let mut finished = 0;
        self.qp.abandon(|c: Completion| {
            if let Some(f) = finish(splits, name, c) {
                finished += 1;
                on_finished(f);
            }
        });
        finished
    }

    #[inline]
    pub(crate) fn flush(&mut self) {
        self.qp.flush();
    }

    #[inline]
    pub(crate) fn set_now(&mut self, now_ns: u64) {
        self.now_ns = now_ns;
        self.qp.set_now(now_ns);
    }

    #[inline]
    pub(crate) fn busy(&self) -> bool {
        self.qp.in_flight() > 0
    }

    pub(crate) fn commands_needed(&self, op: Op, len: u64) -> usize {
        if op == Op::Flush {
            return 1;
        }
        let step = self.part_bytes(op);
        if len <= step {
            return 1; // the common case, without a division
        }
        len.div_ceil(step) as usize
    }

    pub(crate) fn free_commands(&self) -> usize {
        (self.qp.depth() as usize - 1).saturating_sub(self.qp.in_flight() as usize)
    }
}

/// A command's completion as the I/O it belongs to: itself, or its parent when it was the last
/// part of a split one.
#[inline]
fn finish(splits: &mut SplitIos, name: &Arc<str>, c: Completion) -> Option<Finished> {
    let result = if c.status.is_success() {
        Ok(())
    } else {
        Err(IoError::from_status(name.clone(), c.status))
    };
    if c.token & NAMESPACE_PARENT == 0 {
        return Some(Finished {
            token: c.token,
            result,
            submitted_ns: c.submitted_ns,
            bytes: u64::from(c.bytes),
        });
    }
    splits.part_done(c.token & !NAMESPACE_PARENT, result)
}

/// `check` guarantees reads and writes have a buffer.
fn unreachable_buffer() -> Result<(), usnvme_driver::SubmitError> {
    Err(usnvme_driver::SubmitError::Unsupported {
        what: "a read or write without a buffer",
    })
}
