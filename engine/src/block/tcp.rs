//! A namespace of a remote NVMe/TCP controller as a block device: each reactor's channel is
//! one polled I/O queue ([`IoQueue`]) of the controller, so perf, sweep and verify run over
//! the fabric as over a local drive. Large I/Os are split at the controller's largest transfer
//! as for a local namespace.

use std::net::SocketAddr;
use std::sync::atomic::{AtomicU16, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use usnvme_driver::spec::Status;
use usnvme_driver::IoBuffer;

use super::split::SplitIos;
use super::{
    check, BlockDevice, BlockError, BlockInfo, Channel, ChannelOptions, DmaTarget, Finished,
    IoError, Op, NAMESPACE_PARENT,
};
use crate::fabric::host::HostOptions;
use crate::fabric::initiator::queue::Buffers;
use crate::fabric::initiator::session::MAX_ENTRIES;
use crate::fabric::initiator::{Completion, Failure, IoQueue, QueueParams};

/// Write Zeroes and Deallocate carry at most this many blocks per command (NLB is 16 bits).
const MAX_BLOCKS_PER_COMMAND: u64 = 65536;

/// What the owner learned from the remote controller (its admin queue): where it is, which
/// namespace, and the limits its I/O queues have.
#[derive(Debug, Clone)]
pub struct TcpNamespaceSpec {
    /// The device's name (e.g. `tcp://127.0.0.1:4420/nqn…/ns1`).
    pub name: String,
    pub addr: SocketAddr,
    pub subnqn: String,
    /// The admin queue's controller ID.
    pub cntlid: u16,
    pub host: HostOptions,
    pub nsid: u32,
    pub block_size: u32,
    pub blocks: u64,
    /// In-capsule data of an I/O command (IOCCSZ * 16 - 64).
    pub in_capsule: u32,
    /// The largest transfer (MDTS).
    pub max_transfer: u32,
    /// Entries an I/O queue may have (CAP.MQES + 1).
    pub max_entries: u16,
    /// I/O queues the controller grants: one per reactor and namespace.
    pub io_queues: u16,
    /// The controller's next free I/O queue ID, shared by the devices of its namespaces
    /// (start it at 1).
    pub qids: Arc<AtomicU16>,
    /// Set, once, when the controller is lost (its keep-alive failed), with why: every queue
    /// of it ends at its next poll.
    pub lost: Arc<OnceLock<String>>,
    /// Where I/O buffers come from (any DMA space: no device reaches them).
    pub dma: DmaTarget,
}

/// A remote namespace. `keep` holds what must live as long as the device (the controller's
/// admin queue: the I/O queues belong to its association).
#[derive(Debug)]
pub struct TcpNamespaceDevice {
    spec: TcpNamespaceSpec,
    info: BlockInfo,
    name: Arc<str>,
    _keep: Option<Box<dyn std::fmt::Debug + Send + Sync>>,
}

impl TcpNamespaceDevice {
    pub fn new(
        spec: TcpNamespaceSpec,
        keep: Option<Box<dyn std::fmt::Debug + Send + Sync>>,
    ) -> TcpNamespaceDevice {
        let bs = u64::from(spec.block_size.max(1));
        let info = BlockInfo {
            name: spec.name.clone(),
            size_bytes: spec.blocks * bs,
            block_size: spec.block_size,
            optimal_io: bs,
            max_io: (u64::from(spec.max_transfer) / bs * bs).max(bs),
        };
        TcpNamespaceDevice {
            name: Arc::from(spec.name.as_str()),
            info,
            spec,
            _keep: keep,
        }
    }
}

impl BlockDevice for TcpNamespaceDevice {
    fn info(&self) -> &BlockInfo {
        &self.info
    }

    fn dma(&self) -> DmaTarget {
        self.spec.dma.clone()
    }

    /// No local drive: the reactors the engine places it on are any.
    fn drives(&self) -> Vec<usize> {
        Vec::new()
    }

    fn channel(&self, options: &ChannelOptions) -> Result<Channel, usnvme_driver::Error> {
        let s = &self.spec;
        let invalid = |what: String| usnvme_driver::Error::Invalid {
            device: s.name.clone(),
            what,
        };
        let qid = s.qids.fetch_add(1, Ordering::Relaxed);
        if qid > s.io_queues {
            return Err(invalid(format!(
                "the controller grants {} I/O queues: one per reactor and namespace",
                s.io_queues
            )));
        }
        let most = s.max_entries.clamp(2, MAX_ENTRIES);
        let entries = options
            .queue_entries(u64::from(s.max_transfer), most - 1)
            .clamp(2, most);
        let timeout = options.timeout.unwrap_or(Duration::from_secs(30));
        let params = QueueParams {
            subnqn: s.subnqn.clone(),
            qid,
            cntlid: s.cntlid,
            entries,
            nsid: s.nsid,
            block_size: s.block_size,
            in_capsule: s.in_capsule,
            max_transfer: self.info.max_io as u32,
            timeout_ns: timeout.as_nanos().min(u128::from(u64::MAX)) as u64,
        };
        let buffers = Buffers::Space(s.dma.space.clone());
        let queue = IoQueue::connect(s.addr, params, &s.host, buffers)
            .map_err(|e| invalid(format!("I/O queue {qid}: {e}")))?;
        Ok(Channel::Tcp(TcpChannel {
            splits: SplitIos::new(queue.free().max(1)),
            queue,
            block_shift: self.info.block_size.trailing_zeros(),
            info: self.info.clone(),
            name: self.name.clone(),
            lost: s.lost.clone(),
            now_ns: 0,
        }))
    }
}

/// A reactor's I/O queue on a remote namespace.
#[derive(Debug)]
pub struct TcpChannel {
    queue: IoQueue,
    block_shift: u32,
    info: BlockInfo,
    name: Arc<str>,
    splits: SplitIos,
    lost: Arc<OnceLock<String>>,
    now_ns: u64,
}

impl TcpChannel {
    fn part_bytes(&self, op: Op) -> u64 {
        match op {
            Op::Read | Op::Write => self.info.max_io,
            Op::WriteZeroes | Op::Deallocate => {
                MAX_BLOCKS_PER_COMMAND * u64::from(self.info.block_size)
            }
            Op::Flush => u64::MAX,
        }
    }

    pub(crate) fn name(&self) -> &Arc<str> {
        &self.name
    }

    /// Checked here (the block layer owns offsets and sizes), split into commands that
    /// complete as one I/O; one command goes with the caller's token.
    pub(crate) fn submit(
        &mut self,
        op: Op,
        offset: u64,
        len: u64,
        buf: Option<IoBuffer>,
        token: u64,
    ) -> Result<(), BlockError> {
        check(&self.info, &self.name, op, offset, len, buf)?;
        let parts = self.commands_needed(op, len);
        let lba = offset >> self.block_shift;
        let blocks = |n: u64| (n >> self.block_shift) as u32;
        if parts == 1 {
            let b = buf.map(|b| IoBuffer {
                len: len as u32,
                ..b
            });
            return self
                .queue
                .submit(op, lba, blocks(len), b, token)
                .map_err(|e| BlockError::from_driver(&self.name, offset, len, e, &self.info));
        }
        let bytes = if op.has_data() { len } else { 0 };
        let parent = (parts <= self.free_commands())
            .then(|| self.splits.start(token, parts as u32, bytes, self.now_ns))
            .flatten();
        let Some(parent) = parent else {
            return Err(BlockError::busy(&self.name, parts));
        };
        let step = self.part_bytes(op);
        let mut done = 0u64;
        for part in 0..parts {
            let (at, n) = (offset + done, (len - done).min(step));
            let b = buf.map(|b| IoBuffer {
                iova: b.iova + done,
                len: n as u32,
            });
            let queued = self.queue.submit(
                op,
                at >> self.block_shift,
                blocks(n),
                b,
                NAMESPACE_PARENT | parent,
            );
            if let Err(e) = queued {
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

    pub(crate) fn poll(&mut self, mut on_finished: impl FnMut(Finished)) -> usize {
        if self.lost.get().is_some() && self.queue.ended().is_none() {
            return self.abandon(on_finished);
        }
        let (splits, name) = (&mut self.splits, &self.name);
        let mut finished = 0;
        self.queue.poll(|c| {
            if let Some(f) = finish(splits, name, c, false) {
                finished += 1;
                on_finished(f);
            }
        });
        finished
    }

    /// The target is given up on: everything in flight fails as "Host Pathing Error".
    pub(crate) fn abandon(&mut self, mut on_finished: impl FnMut(Finished)) -> usize {
        let (splits, name) = (&mut self.splits, &self.name);
        let mut finished = 0;
        self.queue.close(|c| {
            if let Some(f) = finish(splits, name, c, true) {
                finished += 1;
                on_finished(f);
            }
        });
        finished
    }

    pub(crate) fn flush(&mut self) {
        self.queue.flush();
    }

    pub(crate) fn set_now(&mut self, now_ns: u64) {
        self.now_ns = now_ns;
        self.queue.set_now(now_ns);
    }

    pub(crate) fn busy(&self) -> bool {
        self.queue.in_flight() > 0
    }

    pub(crate) fn commands_needed(&self, op: Op, len: u64) -> usize {
        let step = self.part_bytes(op);
        if op == Op::Flush || len <= step {
            return 1;
        }
        len.div_ceil(step) as usize
    }

    pub(crate) fn free_commands(&self) -> usize {
        self.queue.free()
    }

    /// Whether the queue ended (the target went away, broke the protocol, or was lost).
    pub fn ended(&self) -> bool {
        self.queue.ended().is_some()
    }

    /// Why the queue ended, once it has.
    pub fn why_ended(&self) -> Option<String> {
        if let Some(why) = self.lost.get() {
            return Some(why.clone());
        }
        self.queue.ended().map(|f| f.to_string())
    }
}

/// A failure of the queue as the block layer's kind: a target that is gone (closed, broke
/// the protocol, terminated the connection) is a removed device.
fn io_error(device: &Arc<str>, failure: Failure) -> IoError {
    let device = device.clone();
    match failure {
        Failure::Status(status) => IoError::from_status(device, status),
        Failure::TimedOut => IoError::TimedOut { device },
        Failure::Aborted => IoError::AbortedByReset { device },
        Failure::Closed | Failure::Protocol(_) | Failure::Terminated { .. } => {
            IoError::Removed { device }
        }
        Failure::DataDigest => IoError::Device {
            device,
            status: Status::DATA_TRANSFER_ERROR,
        },
    }
}

/// A command's completion as the I/O it belongs to (see the namespace's `finish`).
fn finish(
    splits: &mut SplitIos,
    name: &Arc<str>,
    c: Completion,
    removed: bool,
) -> Option<Finished> {
    let result = match c.result {
        Ok(()) => Ok(()),
        Err(_) if removed => Err(IoError::Removed {
            device: name.clone(),
        }),
        Err(f) => Err(io_error(name, f)),
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

#[cfg(test)]
mod tests {
    use std::time::Instant;

    use usnvme_hugepages::{BufferPool, IovaSpace, NoIommu, PageSize};

    use super::*;
    use crate::block::StripeDevice;
    use crate::fabric::host::Queue;
    use crate::fabric::initiator::queue::tests::{target, target_of};

    #[test]
    fn a_remote_namespace_is_a_block_device_whose_large_ios_are_split() {
        let (addr, sub, server) = target(2);
        let host = HostOptions {
            timeout: Duration::from_secs(5),
            ..HostOptions::default()
        };
        let (mut admin, cntlid) =
            Queue::connect(addr, &sub.nqn, 0, 32, 0xffff, &host).expect("admin");
        admin.property_set(0x14, false, 0x46_0001).expect("CC.EN");
        let space = IovaSpace::new(Arc::new(NoIommu));
        let ns = &sub.namespaces[0];
        let spec = TcpNamespaceSpec {
            name: format!("tcp://{addr}/{}", sub.nqn),
            addr,
            subnqn: sub.nqn.clone(),
            cntlid,
            host,
            nsid: ns.nsid,
            block_size: ns.block_size,
            blocks: ns.blocks,
            in_capsule: sub.in_capsule_bytes,
            max_transfer: sub.max_transfer,
            max_entries: sub.queue_entries,
            io_queues: sub.io_queues,
            qids: Arc::new(AtomicU16::new(1)),
            lost: Arc::default(),
            dma: DmaTarget {
                space: space.clone(),
                page: PageSize::Small4K,
            },
        };
        let device = TcpNamespaceDevice::new(spec, None);
        assert_eq!(device.info().size_bytes, 2048 * 512);
        let mut channel = device
            .channel(&ChannelOptions {
                depth: 16,
                ..ChannelOptions::default()
            })
            .expect("a channel");
        let mut pool =
            BufferPool::new(&space, 256 << 10, 2, PageSize::Small4K, None).expect("buffers");
        let (out, back) = (
            pool.alloc().expect("a buffer"),
            pool.alloc().expect("a buffer"),
        );
        let data: Vec<u8> = (0..256 << 10).map(|i| (i % 251) as u8).collect();
        out.write_from(&data, 0).expect("fill");
        let io = |b: &usnvme_hugepages::DmaBuffer| {
            Some(IoBuffer {
                iova: b.iova(),
                len: b.len() as u32,
            })
        };
        let wait = |channel: &mut Channel| {
            let deadline = Instant::now() + Duration::from_secs(10);
            let mut done = Vec::new();
            while done.is_empty() {
                assert!(Instant::now() < deadline, "no completion");
                channel.poll(|f| done.push((f.token, f.result, f.bytes)));
            }
            done
        };
        // 256 KiB: two commands of the target's 128 KiB, each by R2T
        channel
            .submit(Op::Write, 4096, 256 << 10, io(&out), 7)
            .expect("write");
        assert_eq!(wait(&mut channel), [(7, Ok(()), 256 << 10)]);
        channel
            .submit(Op::Read, 4096, 256 << 10, io(&back), 8)
            .expect("read");
        assert_eq!(wait(&mut channel), [(8, Ok(()), 256 << 10)]);
        let mut got = vec![0u8; data.len()];
        back.read_into(&mut got, 0).expect("read back");
        assert_eq!(got, data);
        // the device's own checks, and the target's status as the block layer's kind
        assert!(matches!(
            channel.submit(Op::Read, 1, 512, io(&back), 9),
            Err(BlockError::Misaligned { .. })
        ));
        drop(channel);
        drop(device);
        admin.disconnect();
        server.join().expect("the target");
    }

    #[test]
    fn a_stripe_over_two_remote_namespaces_reads_back_what_it_wrote() {
        let (addr, sub, server) = target_of(3, 2);
        let host = HostOptions {
            timeout: Duration::from_secs(5),
            ..HostOptions::default()
        };
        let (mut admin, cntlid) =
            Queue::connect(addr, &sub.nqn, 0, 32, 0xffff, &host).expect("admin");
        admin.property_set(0x14, false, 0x46_0001).expect("CC.EN");
        let space = IovaSpace::new(Arc::new(NoIommu));
        let qids = Arc::new(AtomicU16::new(1));
        let members: Vec<Arc<dyn BlockDevice>> = sub
            .namespaces
            .iter()
            .map(|ns| {
                let spec = TcpNamespaceSpec {
                    name: format!("tcp://{addr}/{}/ns{}", sub.nqn, ns.nsid),
                    addr,
                    subnqn: sub.nqn.clone(),
                    cntlid,
                    host: host.clone(),
                    nsid: ns.nsid,
                    block_size: ns.block_size,
                    blocks: ns.blocks,
                    in_capsule: sub.in_capsule_bytes,
                    max_transfer: sub.max_transfer,
                    max_entries: sub.queue_entries,
                    io_queues: sub.io_queues,
                    qids: qids.clone(),
                    lost: Arc::default(),
                    dma: DmaTarget {
                        space: space.clone(),
                        page: PageSize::Small4K,
                    },
                };
                Arc::new(TcpNamespaceDevice::new(spec, None)) as Arc<dyn BlockDevice>
            })
            .collect();
        let stripe = StripeDevice::new("s0", members, 64 << 10).expect("a stripe");
        let mut channel = stripe
            .channel(&ChannelOptions::default())
            .expect("a channel");
        let len = 512 << 10; // eight chunks, four on each member
        let mut pool = BufferPool::new(&space, len, 2, PageSize::Small4K, None).expect("buffers");
        let (out, back) = (
            pool.alloc().expect("a buffer"),
            pool.alloc().expect("a buffer"),
        );
        let data: Vec<u8> = (0..len).map(|i| (i * 7 % 253) as u8).collect();
        out.write_from(&data, 0).expect("fill");
        for (op, b, token) in [(Op::Write, &out, 1), (Op::Read, &back, 2)] {
            let io = Some(IoBuffer {
                iova: b.iova(),
                len: len as u32,
            });
            channel
                .submit(op, 0, len as u64, io, token)
                .expect("submitted");
            let deadline = Instant::now() + Duration::from_secs(10);
            let mut done = Vec::new();
            while done.is_empty() {
                assert!(Instant::now() < deadline, "no completion");
                channel.poll(|f| done.push((f.token, f.result)));
            }
            assert_eq!(done, [(token, Ok(()))]);
        }
        let mut got = vec![0u8; len];
        back.read_into(&mut got, 0).expect("read back");
        assert!(got == data, "the stripe read back what it wrote");
        drop(channel);
        drop(stripe);
        admin.disconnect();
        server.join().expect("the target");
    }
}
