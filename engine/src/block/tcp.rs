//! A namespace of a remote NVMe/TCP controller as a block device, so perf, sweep and verify
//! run over the fabric as over a local drive. Each reactor has one polled I/O queue
//! ([`IoQueue`]) per remote controller, which the channels of that controller's namespaces on
//! the reactor share (as the kernel's host shares a queue per CPU): whichever channel polls
//! it, a completion for another namespace waits in that one's inbox. Large I/Os are split at
//! the controller's largest transfer as for a local namespace.

use std::cell::RefCell;
use std::collections::VecDeque;
use std::net::SocketAddr;
use std::rc::{Rc, Weak};
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use parking_lot::Mutex;
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
use crate::fabric::initiator::{Completion, Failure, IoNamespace, IoQueue, QueueParams};

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
    /// The controller's I/O queue IDs (as many as it grants: one per reactor), shared by the
    /// devices of its namespaces; it also tells which devices share a controller, hence its
    /// queues.
    pub qids: Arc<QueueIds>,
    /// How many of the controller's namespaces the run uses: a reactor's queue holds commands
    /// for each.
    pub namespaces: u16,
    /// Set, once, when the controller is lost (its keep-alive failed), with why: every queue
    /// of it ends at its next poll.
    pub lost: Arc<OnceLock<String>>,
    /// Where I/O buffers come from (any DMA space: no device reaches them).
    pub dma: DmaTarget,
}

/// The I/O queue IDs of one remote controller: a reactor's queue takes the lowest one free and
/// gives it back when it goes (a sweep starts its reactors again for every point).
#[derive(Debug)]
pub struct QueueIds {
    granted: u16,
    in_use: Mutex<Vec<u16>>,
}

impl QueueIds {
    /// IDs 1 ..= `granted` (what Set Features Number of Queues gave).
    pub fn new(granted: u16) -> QueueIds {
        QueueIds {
            granted,
            in_use: Mutex::new(Vec::new()),
        }
    }

    fn take(&self) -> Option<u16> {
        let mut in_use = self.in_use.lock();
        let qid = (1..=self.granted).find(|q| !in_use.contains(q))?;
        in_use.push(qid);
        Some(qid)
    }

    fn give(&self, qid: u16) {
        self.in_use.lock().retain(|&q| q != qid);
    }
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
        let ns = IoNamespace {
            nsid: s.nsid,
            block_size: s.block_size,
        };
        let most = s.max_entries.clamp(2, MAX_ENTRIES);
        let per_namespace = options.queue_entries(u64::from(s.max_transfer), most - 1);
        let entries = (u32::from(per_namespace) * u32::from(s.namespaces.max(1)))
            .clamp(2, u32::from(most)) as u16;
        let shared = match SharedQueue::of_this_reactor(&s.qids, ns.nsid) {
            Some(shared) => shared,
            None => SharedQueue::connect(s, &self.info, entries, options)?,
        };
        let free = {
            let mut q = shared.borrow_mut();
            let room = q.queue.free().max(1);
            q.inboxes.push((ns.nsid, VecDeque::with_capacity(room)));
            room
        };
        Ok(Channel::Tcp(TcpChannel {
            splits: SplitIos::new(free),
            shared,
            ns,
            in_flight: 0,
            block_shift: self.info.block_size.trailing_zeros(),
            info: self.info.clone(),
            name: self.name.clone(),
            lost: s.lost.clone(),
            now_ns: 0,
        }))
    }
}

/// One reactor's I/O queue to a remote controller, shared by the channels of its namespaces
/// there. Lives on the reactor's thread only.
#[derive(Debug)]
struct SharedQueue {
    queue: IoQueue,
    qid: u16,
    ids: Arc<QueueIds>,
    /// Each channel's NSID and the completions for it that came while another polled (sized
    /// for the whole queue: pushing never allocates).
    inboxes: Vec<(u32, VecDeque<Completion>)>,
    /// Given up on (lost, or abandoned): whatever failed, failed as from a removed device.
    abandoned: bool,
}

impl Drop for SharedQueue {
    fn drop(&mut self) {
        self.ids.give(self.qid);
    }
}

thread_local! {
    /// This reactor's queues, by controller (the address of its `qids`).
    static QUEUES: RefCell<Vec<(usize, Weak<RefCell<SharedQueue>>)>> =
        const { RefCell::new(Vec::new()) };
}

impl SharedQueue {
    /// The queue this reactor already has to the controller of `qids`, unless a channel of
    /// namespace `nsid` is on it already (then it gets a queue of its own).
    fn of_this_reactor(qids: &Arc<QueueIds>, nsid: u32) -> Option<Rc<RefCell<SharedQueue>>> {
        let key = Arc::as_ptr(qids) as usize;
        QUEUES.with(|queues| {
            let mut queues = queues.borrow_mut();
            queues.retain(|(_, q)| q.strong_count() > 0);
            queues
                .iter()
                .filter(|(k, _)| *k == key)
                .filter_map(|(_, q)| q.upgrade())
                .find(|q| q.borrow().inboxes.iter().all(|(n, _)| *n != nsid))
        })
    }

    /// Connects a new I/O queue of `entries` entries to the controller of `s`, and makes it
    /// this reactor's.
    fn connect(
        s: &TcpNamespaceSpec,
        info: &BlockInfo,
        entries: u16,
        options: &ChannelOptions,
    ) -> Result<Rc<RefCell<SharedQueue>>, usnvme_driver::Error> {
        let invalid = |what: String| usnvme_driver::Error::Invalid {
            device: s.name.clone(),
            what,
        };
        let Some(qid) = s.qids.take() else {
            return Err(invalid(format!(
                "the controller grants {} I/O queues: one per reactor; use fewer cores (-c)",
                s.qids.granted
            )));
        };
        let timeout = options.timeout.unwrap_or(Duration::from_secs(30));
        let params = QueueParams {
            subnqn: s.subnqn.clone(),
            qid,
            cntlid: s.cntlid,
            entries,
            nsid: s.nsid,
            block_size: s.block_size,
            in_capsule: s.in_capsule,
            max_transfer: info.max_io as u32,
            timeout_ns: timeout.as_nanos().min(u128::from(u64::MAX)) as u64,
        };
        let buffers = Buffers::Space(s.dma.space.clone());
        let queue = IoQueue::connect(s.addr, params, &s.host, buffers).map_err(|e| {
            s.qids.give(qid);
            invalid(format!("I/O queue {qid}: {e}"))
        })?;
        let shared = Rc::new(RefCell::new(SharedQueue {
            queue,
            qid,
            ids: s.qids.clone(),
            inboxes: Vec::with_capacity(usize::from(s.namespaces.max(1))),
            abandoned: false,
        }));
        let key = Arc::as_ptr(&s.qids) as usize;
        QUEUES.with(|queues| queues.borrow_mut().push((key, Rc::downgrade(&shared))));
        Ok(shared)
    }
}

impl SharedQueue {
    /// Ends the queue: what is in flight goes to the inboxes, to fail as from a removed device.
    fn give_up(&mut self) {
        self.abandoned = true;
        let SharedQueue { queue, inboxes, .. } = self;
        queue.close(|c| route(inboxes, c));
    }
}

/// Hands a completion to the inbox of its namespace (none: its channel is gone).
fn route(inboxes: &mut [(u32, VecDeque<Completion>)], c: Completion) {
    if let Some((_, inbox)) = inboxes.iter_mut().find(|(nsid, _)| *nsid == c.nsid) {
        inbox.push_back(c);
    }
}

/// A reactor's channel to a remote namespace, on the reactor's queue to its controller.
#[derive(Debug)]
pub struct TcpChannel {
    shared: Rc<RefCell<SharedQueue>>,
    ns: IoNamespace,
    /// Commands of this namespace in flight.
    in_flight: usize,
    block_shift: u32,
    info: BlockInfo,
    name: Arc<str>,
    splits: SplitIos,
    lost: Arc<OnceLock<String>>,
    now_ns: u64,
}

impl Drop for TcpChannel {
    /// The queue stops keeping this namespace's completions.
    fn drop(&mut self) {
        if let Ok(mut shared) = self.shared.try_borrow_mut() {
            shared.inboxes.retain(|(nsid, _)| *nsid != self.ns.nsid);
        }
    }
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

    /// One command of this namespace on the shared queue.
    fn submit_command(
        &mut self,
        op: Op,
        lba: u64,
        blocks: u32,
        buf: Option<IoBuffer>,
        token: u64,
    ) -> Result<(), usnvme_driver::SubmitError> {
        let queued = self
            .shared
            .borrow_mut()
            .queue
            .submit_to(self.ns, op, lba, blocks, buf, token);
        if queued.is_ok() {
            self.in_flight += 1;
        }
        queued
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
        let shift = self.block_shift;
        let blocks = |n: u64| (n >> shift) as u32;
        if parts == 1 {
            let b = buf.map(|b| IoBuffer {
                len: len as u32,
                ..b
            });
            return self
                .submit_command(op, lba, blocks(len), b, token)
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
            let queued =
                self.submit_command(op, at >> shift, blocks(n), b, NAMESPACE_PARENT | parent);
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

    /// Polls the shared queue (what comes for the other namespaces goes to their inboxes),
    /// then hands on this namespace's completions.
    pub(crate) fn poll(&mut self, on_finished: impl FnMut(Finished)) -> usize {
        {
            let mut shared = self.shared.borrow_mut();
            if self.lost.get().is_some() && shared.queue.ended().is_none() {
                // the controller is lost: its queues end, their I/Os fail as removed
                shared.give_up();
            } else {
                let SharedQueue { queue, inboxes, .. } = &mut *shared;
                queue.poll(|c| route(inboxes, c));
            }
        }
        self.deliver(on_finished)
    }

    /// This namespace's completions from the inbox, as the I/Os they belong to.
    /// (The queue is not borrowed while `on_finished` runs: it may reach this queue again.)
    fn deliver(&mut self, mut on_finished: impl FnMut(Finished)) -> usize {
        let mut finished = 0;
        loop {
            let (c, removed) = {
                let mut shared = self.shared.borrow_mut();
                let removed = shared.abandoned;
                let next = shared
                    .inboxes
                    .iter_mut()
                    .find(|(nsid, _)| *nsid == self.ns.nsid)
                    .and_then(|(_, inbox)| inbox.pop_front());
                match next {
                    Some(c) => (c, removed),
                    None => return finished,
                }
            };
            self.in_flight = self.in_flight.saturating_sub(1);
            if let Some(f) = finish(&mut self.splits, &self.name, c, removed) {
                finished += 1;
                on_finished(f);
            }
        }
    }

    /// The target is given up on: everything in flight on the queue fails as "Host Pathing
    /// Error" (the other namespaces' at their next poll).
    pub(crate) fn abandon(&mut self, on_finished: impl FnMut(Finished)) -> usize {
        self.shared.borrow_mut().give_up();
        self.deliver(on_finished)
    }

    pub(crate) fn flush(&mut self) {
        self.shared.borrow_mut().queue.flush();
    }

    pub(crate) fn set_now(&mut self, now_ns: u64) {
        self.now_ns = now_ns;
        self.shared.borrow_mut().queue.set_now(now_ns);
    }

    pub(crate) fn busy(&self) -> bool {
        self.in_flight > 0
    }

    pub(crate) fn commands_needed(&self, op: Op, len: u64) -> usize {
        let step = self.part_bytes(op);
        if op == Op::Flush || len <= step {
            return 1;
        }
        len.div_ceil(step) as usize
    }

    pub(crate) fn free_commands(&self) -> usize {
        self.shared.borrow().queue.free()
    }

    /// Whether the queue ended (the target went away, broke the protocol, or was lost).
    pub fn ended(&self) -> bool {
        self.shared.borrow().queue.ended().is_some()
    }

    /// Why the queue ended, once it has.
    pub fn why_ended(&self) -> Option<String> {
        if let Some(why) = self.lost.get() {
            return Some(why.clone());
        }
        self.shared.borrow().queue.ended().map(|f| f.to_string())
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
    fn queue_ids_are_the_lowest_free_of_those_granted_and_come_back() {
        let ids = QueueIds::new(2);
        assert_eq!(
            (ids.take(), ids.take(), ids.take()),
            (Some(1), Some(2), None)
        );
        ids.give(1);
        assert_eq!(ids.take(), Some(1));
        assert_eq!(QueueIds::new(0).take(), None);
    }

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
            qids: Arc::new(QueueIds::new(sub.io_queues)),
            namespaces: 1,
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
        let (addr, sub, server) = target_of(2, 2); // the admin queue and one I/O queue: the members share it
        let host = HostOptions {
            timeout: Duration::from_secs(5),
            ..HostOptions::default()
        };
        let (mut admin, cntlid) =
            Queue::connect(addr, &sub.nqn, 0, 32, 0xffff, &host).expect("admin");
        admin.property_set(0x14, false, 0x46_0001).expect("CC.EN");
        let space = IovaSpace::new(Arc::new(NoIommu));
        let qids = Arc::new(QueueIds::new(sub.io_queues));
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
                    qids: qids.clone(),
                    namespaces: 2,
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
