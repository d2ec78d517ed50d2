//! An NVMe namespace as a block device, local or remote: each reactor's channel submits to
//! the reactor's queue to the namespace's controller (shared with the controller's other
//! namespaces there). Large I/Os are split at the controller's largest transfer (and Write
//! Zeroes and Deallocate at the 16-bit block count) and complete once.

use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::sync::Arc;

use usnvme_driver::spec::command::MAX_BLOCKS_PER_COMMAND;
use usnvme_driver::{Completion, Controller, IoBuffer};

use super::split::SplitIos;
use super::{
    check, BlockDevice, BlockError, BlockInfo, Channel, ChannelOptions, DmaTarget, Failure,
    Finished, Op, NAMESPACE_PARENT,
};
use crate::transport::{
    IoQueue, NamespaceProtection, QueueNamespace, QueueSource, Queues, RemoteQueues,
};
use usnvme_driver::protection::{MetadataFormat, PiChecks};

/// How to drive a namespace formatted with metadata (perf and sweep `--pi`, as SPDK's perf
/// `-e` takes it): PRACT (the drive inserts the PI on writes and checks and strips it on
/// reads; else the host makes and checks it), PRCHK (what the drive checks), and the
/// application tag every block carries.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PiMode {
    pub action: bool,
    pub checks: PiChecks,
    pub app_tag: u16,
}

impl PiMode {
    /// On a namespace of this format: without protection information, metadata travels
    /// (as the host gives it) and nothing is inserted or checked; a type takes the checks it
    /// allows (no reference tag check on type 3).
    fn on(self, format: MetadataFormat) -> NamespaceProtection {
        NamespaceProtection {
            format,
            action: self.action && format.protection.is_some(),
            checks: format
                .protection
                .map_or(PiChecks::NONE, |pi| pi.allowed(self.checks)),
            app_tag: self.app_tag,
        }
    }
}

#[derive(Debug)]
pub struct NamespaceDevice {
    source: QueueSource,
    ns: QueueNamespace,
    info: BlockInfo,
    name: Arc<str>,
    dma: DmaTarget,
    /// What must live as long as the device (a remote controller's admin queue: the I/O
    /// queues belong to its association).
    _keep: Option<Box<dyn std::fmt::Debug + Send + Sync>>,
}

impl NamespaceDevice {
    /// Namespace `nsid` of the local controller `ctrl`, which the engine knows as drive `drive`;
    /// a namespace formatted with metadata is refused by name (see [`NamespaceDevice::with_pi`]).
    pub fn new(
        ctrl: Controller,
        nsid: u32,
        drive: usize,
    ) -> Result<NamespaceDevice, usnvme_driver::Error> {
        NamespaceDevice::with_pi(ctrl, nsid, drive, None)
    }

    /// Namespace `nsid` of `ctrl`, driven with its metadata as `mode` says where it has any
    /// (perf `--pi`); without a mode, as by [`NamespaceDevice::new`].
    pub fn with_pi(
        ctrl: Controller,
        nsid: u32,
        drive: usize,
        mode: Option<PiMode>,
    ) -> Result<NamespaceDevice, usnvme_driver::Error> {
        let ns = ctrl.namespace(nsid)?;
        let format = ns.metadata;
        let protection = match mode {
            _ if format.size == 0 => None,
            Some(mode) => Some(mode.on(format)),
            // the driver refuses its I/O: refused here by name, before a run starts on it
            None => {
                return Err(usnvme_driver::Error::Invalid {
                    device: ctrl.name().to_string(),
                    what: usnvme_driver::SubmitError::Metadata {
                        nsid,
                        bytes: format.size,
                    }
                    .to_string(),
                })
            }
        };
        let name = if ctrl.namespaces().len() == 1 {
            ctrl.name().to_string()
        } else {
            format!("{}/ns{nsid}", ctrl.name())
        };
        let (block_size, blocks) = (ns.block_size, ns.blocks);
        let dma = DmaTarget {
            space: ctrl.iova_space().clone(),
            page: ctrl.page_size(),
        };
        let shape = QueueNamespace {
            nsid,
            block_size,
            blocks,
            protection,
        };
        Ok(NamespaceDevice::on(
            QueueSource::Pcie { ctrl, drive },
            name,
            shape,
            dma,
            None,
        ))
    }

    /// Namespace `ns` of a remote controller; `keep` holds what must live as long as the
    /// device.
    pub fn remote(
        name: String,
        source: Arc<RemoteQueues>,
        ns: QueueNamespace,
        keep: Option<Box<dyn std::fmt::Debug + Send + Sync>>,
    ) -> NamespaceDevice {
        let dma = source.dma.clone();
        NamespaceDevice::on(QueueSource::Tcp(source), name, ns, dma, keep)
    }

    fn on(
        source: QueueSource,
        name: String,
        ns: QueueNamespace,
        dma: DmaTarget,
        keep: Option<Box<dyn std::fmt::Debug + Send + Sync>>,
    ) -> NamespaceDevice {
        let bs = u64::from(ns.block_size.max(1));
        // one command carries as many blocks as fit the largest transfer with the metadata
        // that travels in the data buffer
        let stride = ns.protection.map_or(bs, |p| p.layout(ns.block_size).0);
        let info = BlockInfo {
            name: name.clone(),
            size_bytes: ns.blocks * bs,
            block_size: ns.block_size,
            optimal_io: bs,
            max_io: (source.max_transfer() / stride * bs).max(bs),
            protection: ns.protection,
        };
        NamespaceDevice {
            source,
            ns,
            info,
            name: Arc::from(name),
            dma,
            _keep: keep,
        }
    }

    /// The local controller, for a namespace of one.
    pub fn controller(&self) -> Option<&Controller> {
        match &self.source {
            QueueSource::Pcie { ctrl, .. } => Some(ctrl),
            QueueSource::Tcp(_) => None,
        }
    }
}

impl BlockDevice for NamespaceDevice {
    fn info(&self) -> &BlockInfo {
        &self.info
    }

    fn dma(&self) -> DmaTarget {
        self.dma.clone()
    }

    /// A remote namespace is on no local drive: the reactors the engine places it on are any.
    fn drives(&self) -> Vec<usize> {
        match &self.source {
            QueueSource::Pcie { drive, .. } => vec![*drive],
            QueueSource::Tcp(_) => Vec::new(),
        }
    }

    fn local_nsid(&self) -> Option<u32> {
        match &self.source {
            QueueSource::Pcie { .. } => Some(self.ns.nsid),
            QueueSource::Tcp(_) => None,
        }
    }

    fn channel(
        &self,
        queues: &mut Queues,
        options: &ChannelOptions,
    ) -> Result<Channel, usnvme_driver::Error> {
        let queue = queues.queue_for(&self.source, self.ns, options)?;
        let interrupt = queue
            .interrupt()
            .map_err(|e| usnvme_driver::Error::Unsupported {
                device: self.name.to_string(),
                what: format!("interrupts (duplicating the queue's eventfd: {e})"),
            })?;
        let moves_metadata = self
            .ns
            .protection
            .is_some_and(|p| p.moves_metadata(self.ns.block_size));
        let capacity = queue.free().max(1);
        Ok(Channel::Namespace(NamespaceChannel {
            queue,
            interrupt,
            ns: self.ns,
            block_shift: self.info.block_size.trailing_zeros(),
            block_mask: (1u64 << self.info.block_size.trailing_zeros()) - 1,
            info: self.info.clone(),
            // a copy of its own: an error that names the device (a full queue: Busy) touches
            // this reactor's reference count, not one every reactor on the device shares
            name: Arc::from(&*self.name),
            splits: SplitIos::new(capacity),
            now_ns: 0,
            moves_metadata,
            // reads and writes with metadata take the out-of-line path
            fast_max_io: if self.ns.protection.is_some() {
                0
            } else {
                self.info.max_io
            },
        }))
    }
}

/// A reactor's channel to one namespace, on the reactor's queue to its controller.
#[derive(Debug)]
pub struct NamespaceChannel {
    queue: IoQueue,
    /// The queue's interrupt, for the owner's epoll (a descriptor of its own: the queue may be
    /// shared); None without interrupts.
    interrupt: Option<OwnedFd>,
    ns: QueueNamespace,
    block_shift: u32,
    /// Block size less one: the low bits a block-aligned offset has clear.
    block_mask: u64,
    info: BlockInfo,
    name: Arc<str>,
    /// Parents of the I/Os split into several commands (only those).
    splits: SplitIos,
    now_ns: u64,
    /// Its reads and writes move metadata: each is one command, its buffer laid out as
    /// [`NamespaceProtection`] says.
    moves_metadata: bool,
    /// The largest read or write that goes straight to the queue: `info.max_io`, 0 on a
    /// namespace with metadata (so the I/O path tests nothing more).
    fast_max_io: u64,
}

impl NamespaceChannel {
    /// Its queue as its own when no other channel shares it (see [`IoQueue::settle`]).
    pub(crate) fn settle(self) -> NamespaceChannel {
        NamespaceChannel {
            queue: self.queue.settle(),
            ..self
        }
    }

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

    pub(crate) fn shares_queue(&self) -> bool {
        self.queue.is_shared()
    }

    /// One command of this namespace on the queue, off the I/O path (with its metadata on a
    /// namespace that has some).
    fn submit_command(
        &mut self,
        op: Op,
        lba: u64,
        blocks: u32,
        buf: Option<IoBuffer>,
        token: u64,
    ) -> Result<(), usnvme_driver::SubmitError> {
        self.queue.submit_any(self.ns, op, lba, blocks, buf, token)
    }

    /// A read or write of one command goes straight to the queue with the caller's token:
    /// the transport checks it against the namespace (whole blocks, within its size); only
    /// what the byte-to-block translation would hide is checked here. Everything else is
    /// checked here and split into commands that complete as one I/O.
    // Always inlined (the I/O path), down to the queue pair; `submit_parts` stays out of line.
    #[inline(always)]
    pub(crate) fn submit(
        &mut self,
        op: Op,
        offset: u64,
        len: u64,
        buf: Option<IoBuffer>,
        token: u64,
    ) -> Result<(), BlockError> {
        if let (Op::Read | Op::Write, Some(b)) = (op, buf) {
            if len <= self.fast_max_io && b.len as u64 >= len {
                if offset & self.block_mask != 0 {
                    return Err(BlockError::Misaligned {
                        device: self.name.clone(),
                        offset,
                        len,
                        block_size: self.info.block_size,
                    });
                }
                let b = IoBuffer {
                    len: len as u32,
                    ..b
                };
                // the buffer's length gives the blocks of a read or write
                return self
                    .queue
                    .submit(self.ns, op, offset >> self.block_shift, 0, Some(b), token)
                    .map_err(|e| BlockError::from_driver(&self.name, offset, len, e, &self.info));
            }
        }
        self.submit_parts(op, offset, len, buf, token)
    }

    /// A read or write whose buffer carries metadata too: one command (a split would have to
    /// carve the metadata as well).
    #[inline(never)]
    fn submit_with_metadata(
        &mut self,
        op: Op,
        offset: u64,
        len: u64,
        buf: Option<IoBuffer>,
        token: u64,
    ) -> Result<(), BlockError> {
        let wire = self.info.buffer_bytes(len);
        check(&self.info, &self.name, op, offset, len, buf)?;
        let Some(b) = buf.filter(|b| u64::from(b.len) >= wire) else {
            return Err(BlockError::Buffer {
                device: self.name.clone(),
                op,
                len: wire,
            });
        };
        if len > self.info.max_io {
            return Err(BlockError::Submit {
                device: self.name.clone(),
                source: usnvme_driver::SubmitError::ExceedsMdts {
                    bytes: len,
                    max: self.info.max_io,
                },
            });
        }
        let b = IoBuffer {
            len: wire as u32,
            ..b
        };
        let (lba, blocks) = (offset >> self.block_shift, (len >> self.block_shift) as u32);
        self.submit_command(op, lba, blocks, Some(b), token)
            .map_err(|e| BlockError::from_driver(&self.name, offset, len, e, &self.info))
    }

    /// Checked here, split into commands that complete as one I/O.
    #[inline(never)]
    fn submit_parts(
        &mut self,
        op: Op,
        offset: u64,
        len: u64,
        buf: Option<IoBuffer>,
        token: u64,
    ) -> Result<(), BlockError> {
        if self.moves_metadata && op.has_data() {
            return self.submit_with_metadata(op, offset, len, buf, token);
        }
        check(&self.info, &self.name, op, offset, len, buf)?;
        let parts = self.commands_needed(op, len);
        let shift = self.block_shift;
        if parts == 1 {
            let b = buf.map(|b| IoBuffer {
                len: len as u32,
                ..b
            });
            return self
                .submit_command(op, offset >> shift, (len >> shift) as u32, b, token)
                .map_err(|e| BlockError::from_driver(&self.name, offset, len, e, &self.info));
        }
        if parts > self.free_commands() {
            return Err(BlockError::busy(&self.name, parts));
        }
        let bytes = if op.has_data() { len } else { 0 };
        let step = self.part_bytes(op);
        let NamespaceChannel {
            queue,
            ns,
            info,
            name,
            splits,
            now_ns,
            ..
        } = self;
        splits.submit(
            name,
            token,
            parts,
            bytes,
            *now_ns,
            NAMESPACE_PARENT,
            |i, part_token| {
                let done = i as u64 * step;
                let n = (len - done).min(step);
                let b = buf.map(|b| IoBuffer {
                    iova: b.iova + done,
                    len: n as u32,
                });
                let (lba, blocks) = ((offset + done) >> shift, (n >> shift) as u32);
                queue
                    .submit_any(*ns, op, lba, blocks, b, part_token)
                    .map_err(|e| BlockError::from_driver(name, offset, len, e, info))
            },
        )
    }

    #[inline]
    pub(crate) fn poll(&mut self, mut on_finished: impl FnMut(Finished)) -> usize {
        let (splits, name) = (&mut self.splits, &self.name);
        let mut finished = 0;
        // inlined into the queue pair's loop: no call, no copy of the completion, per I/O
        self.queue.poll(
            #[inline(always)]
            |c: Completion| {
                if finish(splits, name, c, &mut on_finished) {
                    finished += 1;
                }
            },
        );
        finished
    }

    /// The controller is gone: what is in flight fails with "Host Pathing Error".
    pub(crate) fn abandon(&mut self, mut on_finished: impl FnMut(Finished)) -> usize {
        let (splits, name) = (&mut self.splits, &self.name);
        let mut finished = 0;
        self.queue.abandon(|c: Completion| {
            if finish(splits, name, c, &mut on_finished) {
                finished += 1;
            }
        });
        finished
    }

    #[inline]
    pub(crate) fn flush(&mut self) {
        self.queue.flush();
    }

    #[inline]
    pub(crate) fn set_now(&mut self, now_ns: u64) {
        self.now_ns = now_ns;
        self.queue.set_now(now_ns);
    }

    #[inline]
    pub(crate) fn busy(&self) -> bool {
        self.queue.in_flight() > 0
    }

    /// The channel is going: a shared queue no longer keeps its completions.
    pub(crate) fn leave(&self) {
        self.queue.leave();
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
        self.queue.free()
    }

    /// Why the queue under it ended, once it has (a remote target gone or lost).
    pub(crate) fn ended(&self) -> Option<String> {
        self.queue.ended()
    }

    pub(crate) fn reconnects(&self) -> u32 {
        self.queue.reconnects()
    }

    pub(crate) fn interrupt(&self) -> Option<BorrowedFd<'_>> {
        self.interrupt.as_ref().map(|fd| fd.as_fd())
    }
}

/// Hands `on_finished` the I/O a command's completion finishes, if any: itself, or its parent
/// when it was the last part of a split one. Returns whether one finished.
#[inline(always)]
fn finish(
    splits: &mut SplitIos,
    name: &Arc<str>,
    c: Completion,
    on_finished: &mut impl FnMut(Finished),
) -> bool {
    let failure = (!c.status.is_success()).then(|| Failure {
        device: name.clone(),
        status: c.status,
    });
    // an I/O of one command finishes with it: handed up at once, with no Option to test
    let finished = if c.token & NAMESPACE_PARENT == 0 {
        Finished {
            token: c.token,
            failure,
            submitted_ns: c.submitted_ns,
            bytes: u64::from(c.bytes),
        }
    } else {
        match splits.part_done(c.token & !NAMESPACE_PARENT, failure) {
            Some(f) => f,
            None => return false,
        }
    };
    on_finished(finished);
    true
}

#[cfg(test)]
mod tests {
    use std::time::{Duration, Instant};

    use usnvme_hugepages::{BufferPool, DmaBuffer, IovaSpace, NoIommu, PageSize};

    use super::*;
    use crate::block::remote::RemoteSubsystem;
    use crate::block::{IoError, StripeDevice};
    use crate::fabric::address::TcpAddress;
    use crate::transport::tcp::initiator::queue::tests::target_of;
    use crate::transport::tcp::initiator::HostOptions;
    use crate::transport::ReconnectPolicy;

    /// A remote subsystem of `namespaces` namespaces served on `connections` connections.
    fn remote(
        connections: usize,
        namespaces: u32,
    ) -> (RemoteSubsystem, Arc<IovaSpace>, std::thread::JoinHandle<()>) {
        let (addr, sub, server) = target_of(connections, namespaces);
        let address: TcpAddress = format!("tcp://{addr}/{}", sub.nqn)
            .parse()
            .expect("address");
        let host = HostOptions {
            timeout: Duration::from_secs(5),
            ..HostOptions::default()
        };
        let space = IovaSpace::new(Arc::new(NoIommu));
        let dma = DmaTarget {
            space: space.clone(),
            page: PageSize::Small4K,
        };
        let remote = RemoteSubsystem::attach(&address, &host, ReconnectPolicy::NEVER, 1, dma)
            .expect("attached");
        (remote, space, server)
    }

    /// Submits `op` of the whole of `b` at `offset` and waits for it: (token, result, bytes).
    fn one_io(
        channel: &mut Channel,
        op: Op,
        offset: u64,
        b: &DmaBuffer,
        token: u64,
    ) -> Vec<(u64, Result<(), IoError>, u64)> {
        let io = IoBuffer {
            iova: b.iova(),
            len: b.len() as u32,
        };
        channel
            .submit(op, offset, b.len() as u64, Some(io), token)
            .expect("submitted");
        let deadline = Instant::now() + Duration::from_secs(10);
        let mut done = Vec::new();
        while done.is_empty() {
            assert!(Instant::now() < deadline, "no completion");
            channel.poll(|f| done.push((f.token, f.result(), f.bytes)));
        }
        done
    }

    #[test]
    fn a_remote_namespace_is_a_block_device_whose_large_ios_are_split() {
        let (remote, space, server) = remote(2, 1);
        let device = remote.devices(None).expect("a namespace").remove(0);
        assert_eq!(device.info().size_bytes, 2048 * 512);
        let options = ChannelOptions {
            depth: 16,
            ..ChannelOptions::default()
        };
        let mut queues = Queues::new();
        let mut channel = device.channel(&mut queues, &options).expect("a channel");
        let mut pool =
            BufferPool::new(&space, 256 << 10, 2, PageSize::Small4K, None).expect("buffers");
        let (out, back) = (
            pool.alloc().expect("a buffer"),
            pool.alloc().expect("a buffer"),
        );
        let data: Vec<u8> = (0..256 << 10).map(|i| (i % 251) as u8).collect();
        out.write_from(&data, 0).expect("fill");
        // 256 KiB: two commands of the target's 128 KiB, each by R2T
        assert_eq!(
            one_io(&mut channel, Op::Write, 4096, &out, 7),
            [(7, Ok(()), 256 << 10)]
        );
        assert_eq!(
            one_io(&mut channel, Op::Read, 4096, &back, 8),
            [(8, Ok(()), 256 << 10)]
        );
        let mut got = vec![0u8; data.len()];
        back.read_into(&mut got, 0).expect("read back");
        assert!(got == data, "read back what was written");
        // the block layer's own checks
        let io = Some(IoBuffer {
            iova: back.iova(),
            len: 512,
        });
        assert!(matches!(
            channel.submit(Op::Read, 1, 512, io, 9),
            Err(BlockError::Misaligned { .. })
        ));
        assert!(matches!(
            channel.submit(Op::Read, 2048 * 512, 512, io, 9),
            Err(BlockError::OutOfRange { .. })
        ));
        let part_block = Some(IoBuffer {
            iova: back.iova(),
            len: 700,
        });
        assert!(matches!(
            channel.submit(Op::Write, 0, 700, part_block, 9),
            Err(BlockError::Misaligned { .. })
        ));
        drop((channel, queues, device, remote));
        server.join().expect("the target");
    }

    #[test]
    fn a_stripe_over_two_remote_namespaces_shares_one_queue_and_reads_back_what_it_wrote() {
        // the admin queue and one I/O queue: the members share it
        let (remote, space, server) = remote(2, 2);
        let members = remote.devices(None).expect("two namespaces");
        let stripe = StripeDevice::new("s0", members, 64 << 10).expect("a stripe");
        let mut queues = Queues::new();
        let mut channel = stripe
            .channel(&mut queues, &ChannelOptions::default())
            .expect("a channel");
        assert_eq!(queues.len(), 1, "one queue for both members");
        let len = 512 << 10; // eight chunks, four on each member
        let mut pool = BufferPool::new(&space, len, 2, PageSize::Small4K, None).expect("buffers");
        let (out, back) = (
            pool.alloc().expect("a buffer"),
            pool.alloc().expect("a buffer"),
        );
        let data: Vec<u8> = (0..len).map(|i| (i * 7 % 253) as u8).collect();
        out.write_from(&data, 0).expect("fill");
        assert_eq!(
            one_io(&mut channel, Op::Write, 0, &out, 1),
            [(1, Ok(()), len as u64)]
        );
        assert_eq!(
            one_io(&mut channel, Op::Read, 0, &back, 2),
            [(2, Ok(()), len as u64)]
        );
        let mut got = vec![0u8; len];
        back.read_into(&mut got, 0).expect("read back");
        assert!(got == data, "the stripe read back what it wrote");
        drop((channel, queues, stripe, remote));
        server.join().expect("the target");
    }
}
