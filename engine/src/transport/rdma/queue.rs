//! One NVMe/RDMA queue of the host (admin or I/O): the same commands and completions as an
//! NVMe/TCP queue ([`crate::transport::tcp::initiator::IoQueue`]), carried as RDMA messages.
//!
//! - A command is a SEND of its 64-byte SQE, with a write's data right after it when it fits
//!   the target's in-capsule size (a second scatter entry straight from the DMA buffer), else
//!   a Keyed SGL naming the buffer: the target reads or writes it by RDMA, the host's CPU
//!   never touches the data.
//! - A command without data names none with a keyed SGL of length 0 (as the Linux host does;
//!   the Linux target refuses any other descriptor).
//! - A response is a RECV of a 16-byte CQE into one of the receive buffers posted at set-up
//!   (as many as the queue has entries: HRQSIZE), posted again once read.
//! - A command finishes when its response came and its SEND completed (only then may its
//!   SQE slot and its buffer be used again).
//!
//! Set-up ([`QueueSetup`], never blocking: a reactor steps it in its turns): the CM resolves
//! the address and the route, the queue pair is made and its receives posted, the CM connects
//! with NVMe/RDMA's private data (QID, HRQSIZE, HSQSIZE), then the Fabrics Connect command
//! goes as the first SEND (its data keyed, as the Linux target wants on an admin queue).
//!
//! Memory: every region of the queue's IOVA space is registered under its IOVA (so a buffer's
//! address is its IOVA, with no translation per I/O) on the device's protection domain, once
//! for all the queues of the process ([`super::domain`]); the queue keeps the keys, found by
//! a check of the last region used, then a scan of the few there are. Nothing is allocated
//! per command.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use nix::sys::epoll::{Epoll, EpollCreateFlags, EpollEvent, EpollFlags, EpollTimeout};
use usnvme_driver::spec::fabrics::{CATTR_DISABLE_SQ_FLOW, CONNECT_DATA};
use usnvme_driver::spec::rdma::{decode_accept, CmRejectStatus, CmRequest};
use usnvme_driver::spec::{ConnectData, Cqe, DsmRange, SglDescriptor, Sqe, Status};
use usnvme_driver::{IoBuffer, SubmitError};
use usnvme_hugepages::IovaMemory;
use vm_memory::{Bytes, GuestAddress, GuestMemoryBackend, GuestMemoryRegion, MemoryRegionAddress};

use super::completions::{self, Member};
use super::domain::{Domain, Registration};
use super::verbs::{
    wc_status_name, CmEventKind, CmId, EventChannel, MemoryRegion, QpCaps, Sge, Wc, WcOpcode,
};
use crate::transport::tcp::initiator::queue::Buffers;
use crate::transport::tcp::initiator::session::MAX_ENTRIES;
use crate::transport::tcp::initiator::{
    Completion, Data, Failure, HostError, HostOptions, IoNamespace, QueueParams, Unfinished,
};
use crate::transport::Op;

/// Slots are a CID's low bits, a generation the bits above (as on NVMe/TCP).
const SLOT_BITS: u32 = 10;
/// The Connect command's slot (it completes before anything else is submitted).
const CONNECT_SLOT: u16 = 0;
/// Receive work requests are told from sends by this bit of their ID.
const RECV_TAG: u64 = 1 << 63;
/// Where the queue's own buffers (SQEs, responses, ranges, Connect data) are addressed.
const OWN_IOVA: u64 = 0x1000;
const SQE: usize = Sqe::SIZE;
const CQE: usize = Cqe::SIZE;
const DSM_RANGE: usize = DsmRange::SIZE;
/// How long the CM may take to resolve an address or a route.
const RESOLVE_MS: i32 = 5000;
/// RDMA READs the target may have outstanding on the queue (and we on it: none).
const RDMA_DEPTH: u8 = 16;

/// One command in flight.
#[derive(Debug, Clone, Copy, Default)]
struct Slot {
    busy: bool,
    generation: u16,
    /// Its SEND has not completed yet.
    sending: bool,
    /// Its response, once it came.
    response: Option<(Status, [u32; 2])>,
    token: u64,
    nsid: u32,
    /// Data bytes it moves (0: none).
    len: u32,
    submitted_ns: u64,
    since_ns: u64,
    timed_out: bool,
    /// What it takes to send it again on a new connection (I/Os only).
    io: Option<Unfinished>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Phase {
    ResolvingAddr,
    ResolvingRoute,
    Connecting,
    AwaitConnect,
    Ready,
    Ended,
}

/// One NVMe/RDMA queue. Field order is drop order: the queue pair (in `id`) goes before the
/// completion queue and the memory registrations, those before the device's domain, and the
/// event channel last.
#[derive(Debug)]
pub struct IoQueue {
    id: CmId,
    /// The data memory's regions as registered on the device's domain.
    regions: Vec<Arc<Registration>>,
    own_mr: Option<MemoryRegion>,
    /// Its place on a completion queue (shared by the reactor's I/O queues).
    cq: Option<Member>,
    /// The tag of its work request IDs (see [`completions`]).
    wr_tag: u64,
    domain: Option<Arc<Domain>>,
    channel: EventChannel,
    own: IovaMemory,
    buffers: Buffers,
    memory: Arc<IovaMemory>,
    params: QueueParams,
    host: HostOptions,
    phase: Phase,
    slots: Box<[Slot]>,
    free: Vec<u16>,
    in_flight: usize,
    /// The region the last buffer was in.
    last_region: usize,
    epoch: Instant,
    owner_clock: bool,
    now_ns: u64,
    next_timeout_check: u64,
    ended: Option<Failure>,
    /// Why the set-up failed, in words (the CM's event, the target's reject).
    setup_error: Option<String>,
    keep_unfinished: bool,
    rerouted: Option<Vec<(Unfinished, Status)>>,
    /// The target's receive queue size (CRQSIZE), from its accept.
    crqsize: u16,
    waiter: Option<Epoll>,
    /// Commands that finished while [`IoQueue::wait`] looked (after arming the completion
    /// queue, before sleeping): handed over by the next poll. Sized at set-up.
    early: Vec<Completion>,
}

fn own_layout(entries: usize) -> (u64, u64, u64, u64, usize) {
    let sqes = OWN_IOVA;
    let responses = sqes + (entries * SQE) as u64;
    let ranges = responses + (entries * CQE) as u64;
    let connect = ranges + (entries * DSM_RANGE) as u64;
    let len = (connect - OWN_IOVA) as usize + CONNECT_DATA;
    (sqes, responses, ranges, connect, len)
}

fn rdma_error(what: impl std::fmt::Display) -> HostError {
    HostError::Rdma(what.to_string())
}

/// An NVMe/RDMA queue being set up without waiting (see the module doc).
#[derive(Debug)]
pub struct QueueSetup {
    queue: IoQueue,
    addr: SocketAddr,
    deadline: Instant,
}

impl QueueSetup {
    /// Starts setting up queue `params.qid` at `addr` (QID 0: an admin queue of a controller
    /// the target picks); `host.timeout` bounds it.
    pub fn start(
        addr: SocketAddr,
        params: QueueParams,
        host: &HostOptions,
        buffers: Buffers,
    ) -> Result<QueueSetup, HostError> {
        if !(2..=MAX_ENTRIES).contains(&params.entries) {
            return Err(HostError::InvalidArgument("a queue has 2 to 1024 entries"));
        }
        if host.timeout.is_zero() {
            return Err(HostError::InvalidArgument("the timeout must not be zero"));
        }
        let deadline = Instant::now()
            .checked_add(host.timeout)
            .ok_or(HostError::InvalidArgument("the timeout is too long"))?;
        let entries = params.entries as usize;
        let (.., own_len) = own_layout(entries);
        let own = IovaMemory::from_ranges(&[(GuestAddress(OWN_IOVA), own_len)])
            .map_err(std::io::Error::other)?;
        let channel = EventChannel::new().map_err(rdma_error)?;
        let id = CmId::new(&channel).map_err(rdma_error)?;
        id.resolve_addr(addr, RESOLVE_MS).map_err(rdma_error)?;
        let memory = buffers.snapshot();
        let queue = IoQueue {
            id,
            regions: Vec::new(),
            own_mr: None,
            cq: None,
            wr_tag: 0,
            domain: None,
            channel,
            own,
            buffers,
            memory,
            host: host.clone(),
            phase: Phase::ResolvingAddr,
            slots: vec![Slot::default(); entries].into_boxed_slice(),
            // (the Connect takes slot 0 first)
            free: (0..entries as u16).rev().collect(),
            in_flight: 0,
            last_region: 0,
            epoch: Instant::now(),
            owner_clock: false,
            now_ns: 0,
            next_timeout_check: 0,
            ended: None,
            setup_error: None,
            keep_unfinished: false,
            rerouted: None,
            crqsize: 0,
            waiter: None,
            early: Vec::with_capacity(entries),
            params,
        };
        Ok(QueueSetup {
            queue,
            addr,
            deadline,
        })
    }

    /// Moves the set-up on as far as it goes now: true once the Connect is answered (then
    /// [`QueueSetup::into_queue`]); an error once it failed or ran out of time.
    pub fn step(&mut self) -> Result<bool, HostError> {
        let q = &mut self.queue;
        while let Some(ev) = q.channel.next().map_err(rdma_error)? {
            q.on_cm_event(ev.kind, ev.status, ev.private())?;
        }
        if q.phase == Phase::AwaitConnect || q.phase == Phase::Ready {
            q.poll_completions(&mut |_| {});
        }
        if let Some(f) = q.ended {
            return Err(match q.setup_error.take() {
                Some(why) => HostError::Rdma(format!("{}: {why}", self.addr)),
                None => HostError::from(f),
            });
        }
        if q.phase == Phase::Ready {
            return Ok(true);
        }
        if Instant::now() >= self.deadline {
            return Err(HostError::Timeout);
        }
        Ok(false)
    }

    /// Sleeps until the CM or the completion queue has news for [`QueueSetup::step`] (at
    /// most until the deadline).
    pub fn wait(&mut self) -> Result<(), HostError> {
        let left = self.deadline.saturating_duration_since(Instant::now());
        self.queue.wait(left)
    }

    pub fn into_queue(self) -> IoQueue {
        self.queue
    }
}

impl IoQueue {
    /// Connects queue `params.qid` at `addr`, waiting (at most `host.timeout`).
    pub fn connect(
        addr: SocketAddr,
        params: QueueParams,
        host: &HostOptions,
        buffers: Buffers,
    ) -> Result<IoQueue, HostError> {
        let mut setup = QueueSetup::start(addr, params, host, buffers)?;
        while !setup.step()? {
            setup.wait()?;
        }
        Ok(setup.into_queue())
    }

    fn fail_setup(&mut self, why: String) -> Result<(), HostError> {
        self.setup_error = Some(why);
        self.end(Failure::Closed);
        Ok(())
    }

    fn on_cm_event(
        &mut self,
        kind: CmEventKind,
        status: i32,
        private: &[u8],
    ) -> Result<(), HostError> {
        match (self.phase, kind) {
            (Phase::ResolvingAddr, CmEventKind::AddrResolved) => {
                self.id.resolve_route(RESOLVE_MS).map_err(rdma_error)?;
                self.phase = Phase::ResolvingRoute;
            }
            (Phase::ResolvingRoute, CmEventKind::RouteResolved) => {
                self.make_queue_pair()?;
                let entries = self.params.entries;
                let request = CmRequest {
                    qid: self.params.qid,
                    hrqsize: entries,
                    hsqsize: entries - 1,
                };
                self.id
                    .connect(&request.encode(), RDMA_DEPTH)
                    .map_err(rdma_error)?;
                self.phase = Phase::Connecting;
            }
            (Phase::Connecting, CmEventKind::Established) => {
                self.crqsize = decode_accept(private).unwrap_or(0);
                self.phase = Phase::AwaitConnect;
                self.send_connect()?;
            }
            (Phase::Connecting, CmEventKind::Rejected) => {
                let why = match CmRejectStatus::decode(private) {
                    Some(sts) => format!("the target rejected the connection: {sts}"),
                    None => format!(
                        "the connection was rejected (status {status}): is an NVMe/RDMA \
                         target listening there?"
                    ),
                };
                return self.fail_setup(why);
            }
            (Phase::ResolvingAddr | Phase::ResolvingRoute | Phase::Connecting, other) => {
                return self.fail_setup(format!(
                    "{} (status {status}): is the address on an RDMA device (`rdma link`)?",
                    other.name()
                ));
            }
            (_, CmEventKind::Disconnected) => {
                if self.ended.is_none() {
                    self.end(Failure::Closed);
                }
            }
            (_, other) => log::debug!("NVMe/RDMA queue {}: {}", self.params.qid, other.name()),
        }
        Ok(())
    }

    /// The completion queue and the queue pair on the device's domain; the memory
    /// registered; every receive posted.
    fn make_queue_pair(&mut self) -> Result<(), HostError> {
        let entries = u32::from(self.params.entries);
        let domain = Domain::of(&self.id).map_err(rdma_error)?;
        let pd = domain.pd();
        // an I/O queue on its reactor's shared completion queue, an admin queue on its own
        let mut cq = match self.params.qid {
            0 => completions::own(&self.id, entries),
            _ => completions::join(&self.id, entries),
        }
        .map_err(rdma_error)?;
        let caps = QpCaps {
            send: entries,
            recv: entries,
            send_sge: 2,
        };
        self.id
            .create_qp(pd, cq.cq(), None, caps)
            .map_err(rdma_error)?;
        let qp_num = self.id.qp_num().ok_or(HostError::Closed)?;
        cq.bind(qp_num);
        self.wr_tag = cq.tag();
        let own_ptr = host_address(&self.own, OWN_IOVA)?;
        let (.., own_len) = own_layout(entries as usize);
        self.own_mr = Some(
            pd.register(own_ptr, own_len, OWN_IOVA)
                .map_err(rdma_error)?,
        );
        self.domain = Some(domain);
        self.cq = Some(cq);
        self.register_memory()?;
        for i in 0..self.params.entries {
            self.post_recv(i)?;
        }
        Ok(())
    }

    /// Takes the registrations of the data memory's regions it has not yet (each region is
    /// registered once on the device, for all queues).
    fn register_memory(&mut self) -> Result<(), HostError> {
        let Some(domain) = &self.domain else {
            return Ok(());
        };
        for r in self.memory.iter() {
            let start = r.start_addr().0;
            let ptr = r
                .get_host_address(MemoryRegionAddress(0))
                .map_err(|e| rdma_error(format!("a DMA region has no host address: {e}")))?;
            let len = r.len() as usize;
            let end = start + len as u64;
            if self
                .regions
                .iter()
                .any(|g| g.start == start && g.end == end)
            {
                continue;
            }
            let registration = domain
                .register(&self.memory, start, ptr, len)
                .map_err(rdma_error)?;
            self.regions.push(registration);
        }
        Ok(())
    }

    /// The keys of the region holding `iova .. iova + len` (None: not registered).
    #[inline]
    fn keys(&mut self, iova: u64, len: u32) -> Option<(u32, u32)> {
        let end = iova.checked_add(u64::from(len))?;
        let fits = |r: &Arc<Registration>| r.start <= iova && end <= r.end;
        if let Some(r) = self.regions.get(self.last_region).filter(|r| fits(r)) {
            return Some((r.lkey, r.rkey));
        }
        let (i, r) = self.regions.iter().enumerate().find(|(_, r)| fits(r))?;
        self.last_region = i;
        Some((r.lkey, r.rkey))
    }

    /// The keys of a buffer, registering memory mapped since the last snapshot (cold path).
    fn buffer_keys(&mut self, buf: IoBuffer, len: u32) -> Result<(u32, u32), SubmitError> {
        if let Some(k) = self.keys(buf.iova, len) {
            return Ok(k);
        }
        let fresh = self.buffers.snapshot();
        if !Arc::ptr_eq(&fresh, &self.memory) {
            self.memory = fresh;
            if let Err(e) = self.register_memory() {
                log::warn!("NVMe/RDMA: registering new DMA memory: {e}");
            }
        }
        self.keys(buf.iova, len)
            .ok_or(SubmitError::Misaligned { iova: buf.iova })
    }

    fn own_lkey(&self) -> u32 {
        self.own_mr.as_ref().map_or(0, MemoryRegion::lkey)
    }

    fn own_rkey(&self) -> u32 {
        self.own_mr.as_ref().map_or(0, MemoryRegion::rkey)
    }

    fn post_recv(&self, i: u16) -> Result<(), HostError> {
        let (_, responses, ..) = own_layout(self.slots.len());
        let sge = Sge {
            addr: responses + (usize::from(i) * CQE) as u64,
            len: CQE as u32,
            lkey: self.own_lkey(),
        };
        self.id
            .post_recv(self.wr_tag | RECV_TAG | u64::from(i), sge)
            .map_err(rdma_error)
    }

    /// The Fabrics Connect: the first command, its data keyed in the queue's own memory.
    fn send_connect(&mut self) -> Result<(), HostError> {
        let p = &self.params;
        let data = ConnectData::new(self.host.host_id, p.cntlid, &p.subnqn, &self.host.host_nqn)
            .map_err(|_| HostError::InvalidArgument("an NQN is at most 255 bytes, with no NUL"))?;
        let (.., connect, _) = own_layout(self.slots.len());
        self.own
            .write_slice(data.as_bytes(), GuestAddress(connect))
            .map_err(std::io::Error::other)?;
        let cattr = if p.qid == 0 { 0 } else { CATTR_DISABLE_SQ_FLOW };
        let kato = if p.qid == 0 { self.host.kato_ms } else { 0 };
        let mut sqe = Sqe::connect(p.qid, p.entries, cattr, kato);
        sqe.set_sgl(SglDescriptor::keyed(
            connect,
            CONNECT_DATA as u32,
            self.own_rkey(),
        ));
        let index = self
            .take_slot(Slot {
                token: u64::MAX,
                ..Slot::default()
            })
            .map_err(|_| HostError::Closed)?;
        debug_assert_eq!(index, CONNECT_SLOT);
        self.send(index, sqe, None).map_err(|_| HostError::Closed)
    }

    fn take_slot(&mut self, command: Slot) -> Result<u16, SubmitError> {
        let Some(index) = self.free.pop() else {
            return Err(SubmitError::QueueFull {
                in_flight: self.in_flight as u16,
            });
        };
        let slot = &mut self.slots[index as usize];
        let generation = (slot.generation % ((1 << (16 - SLOT_BITS)) - 1)) + 1;
        *slot = Slot {
            busy: true,
            generation,
            submitted_ns: self.now_ns,
            since_ns: self.now_ns,
            ..command
        };
        self.in_flight += 1;
        Ok(index)
    }

    /// Writes slot `index`'s SQE (its CID set here) and posts its SEND, with `data` after it.
    fn send(&mut self, index: u16, sqe: Sqe, data: Option<Sge>) -> Result<(), SubmitError> {
        self.send_capsule(index, sqe, SQE as u32, data)
    }

    /// Sends the first `sqe_len` bytes of `sqe` (with its CID), then `data`.
    fn send_capsule(
        &mut self,
        index: u16,
        mut sqe: Sqe,
        sqe_len: u32,
        data: Option<Sge>,
    ) -> Result<(), SubmitError> {
        let (sqes, ..) = own_layout(self.slots.len());
        let slot = &mut self.slots[index as usize];
        sqe.set_cid(index | (slot.generation << SLOT_BITS));
        slot.sending = true;
        let at = sqes + (usize::from(index) * SQE) as u64;
        if self
            .own
            .write_slice(sqe.as_bytes(), GuestAddress(at))
            .is_err()
        {
            self.slots[index as usize].sending = false;
            self.release(index);
            return Err(SubmitError::Dead);
        }
        let command = Sge {
            addr: at,
            len: sqe_len,
            lkey: self.own_lkey(),
        };
        let posted = match data {
            Some(d) => self
                .id
                .post_send(self.wr_tag | u64::from(index), &[command, d]),
            None => self
                .id
                .post_send(self.wr_tag | u64::from(index), &[command]),
        };
        if let Err(e) = posted {
            log::warn!("NVMe/RDMA queue {}: post send: {e}", self.params.qid);
            self.slots[index as usize].sending = false;
            self.release(index);
            self.end(Failure::Closed);
            return Err(SubmitError::Dead);
        }
        Ok(())
    }

    fn release(&mut self, index: u16) {
        let s = &mut self.slots[index as usize];
        *s = Slot {
            generation: s.generation,
            ..Slot::default()
        };
        self.free.push(index);
        self.in_flight -= 1;
    }

    /// Queues `op` on `blocks` blocks of namespace `ns` from `slba` (`buf` for reads and
    /// writes): all or nothing; it goes out at once (there is nothing to flush).
    pub fn submit_to(
        &mut self,
        ns: IoNamespace,
        op: Op,
        slba: u64,
        blocks: u32,
        buf: Option<IoBuffer>,
        token: u64,
    ) -> Result<(), SubmitError> {
        let u = Unfinished {
            ns,
            op,
            slba,
            blocks,
            buf,
            token,
            since_ns: self.now_ns,
        };
        self.queue_io(u)
    }

    /// Sends again an I/O a queue of the same controller had not finished; its latency still
    /// counts from its first submission.
    pub fn resubmit(&mut self, u: Unfinished) -> Result<(), SubmitError> {
        self.queue_io(u)
    }

    fn queue_io(&mut self, u: Unfinished) -> Result<(), SubmitError> {
        if self.phase != Phase::Ready {
            return Err(SubmitError::Dead);
        }
        let most = usnvme_driver::spec::command::MAX_BLOCKS_PER_COMMAND;
        if u.op != Op::Flush && !(1..=most).contains(&u64::from(u.blocks)) {
            return Err(SubmitError::BlockCount {
                blocks: u64::from(u.blocks),
            });
        }
        let len = if u.op.has_data() {
            u64::from(u.blocks) * u64::from(u.ns.block_size)
        } else {
            0
        };
        if len > u64::from(self.params.max_transfer) {
            return Err(SubmitError::ExceedsMdts {
                bytes: len,
                max: u64::from(self.params.max_transfer),
            });
        }
        let len = len as u32;
        let keys = match u.buf {
            Some(b) if u.op.has_data() => {
                if b.len < len {
                    return Err(SubmitError::Misaligned { iova: b.iova });
                }
                Some((b.iova, self.buffer_keys(b, len)?))
            }
            None if u.op.has_data() => return Err(SubmitError::Misaligned { iova: 0 }),
            _ => None,
        };
        if self.free.is_empty() {
            return Err(SubmitError::QueueFull {
                in_flight: self.in_flight as u16,
            });
        }
        let nsid = u.ns.nsid;
        let mut sqe = match u.op {
            Op::Read => Sqe::read(nsid, u.slba, u.blocks),
            Op::Write => Sqe::write(nsid, u.slba, u.blocks),
            Op::Flush => Sqe::flush(nsid),
            Op::WriteZeroes => Sqe::write_zeroes(nsid, u.slba, u.blocks),
            Op::Deallocate => Sqe::dataset_management(nsid, 1, true),
        };
        let index = self.take_slot(Slot {
            token: u.token,
            nsid,
            len,
            io: Some(u),
            ..Slot::default()
        })?;
        self.slots[index as usize].since_ns = u.since_ns;
        let mut data = None;
        match keys {
            Some((iova, (lkey, _))) if u.op == Op::Write && len <= self.params.in_capsule => {
                sqe.set_sgl(SglDescriptor::in_capsule(len));
                data = Some(Sge {
                    addr: iova,
                    len,
                    lkey,
                });
            }
            Some((iova, (_, rkey))) => sqe.set_sgl(SglDescriptor::keyed(iova, len, rkey)),
            None if u.op == Op::Deallocate => {
                let (.., ranges, _, _) = own_layout(self.slots.len());
                let at = ranges + (usize::from(index) * DSM_RANGE) as u64;
                let range = DsmRange::new(u.slba, u.blocks);
                if self
                    .own
                    .write_slice(range.as_bytes(), GuestAddress(at))
                    .is_err()
                {
                    self.release(index);
                    return Err(SubmitError::Dead);
                }
                sqe.set_sgl(SglDescriptor::keyed(at, DSM_RANGE as u32, self.own_rkey()));
            }
            None => sqe.set_sgl(SglDescriptor::keyed(0, 0, 0)),
        }
        self.send(index, sqe, data)
    }

    /// Queues any command (admin and Fabrics ones included) with `data` in the queue's
    /// buffers: all or nothing; its CID and SGL are filled in here (the data always keyed).
    pub fn submit_command(
        &mut self,
        mut sqe: Sqe,
        data: Data,
        token: u64,
    ) -> Result<(), SubmitError> {
        if self.phase != Phase::Ready {
            return Err(SubmitError::Dead);
        }
        let buf = match data {
            Data::ToController(b) | Data::FromController(b) if b.len > 0 => Some(b),
            _ => None,
        };
        let len = buf.map_or(0, |b| b.len);
        if len > self.params.max_transfer {
            return Err(SubmitError::ExceedsMdts {
                bytes: u64::from(len),
                max: u64::from(self.params.max_transfer),
            });
        }
        let sgl = match buf {
            Some(b) => {
                let (_, rkey) = self.buffer_keys(b, len)?;
                SglDescriptor::keyed(b.iova, len, rkey)
            }
            None => SglDescriptor::keyed(0, 0, 0),
        };
        sqe.set_sgl(sgl);
        let index = self.take_slot(Slot {
            token,
            nsid: sqe.nsid,
            len,
            ..Slot::default()
        })?;
        self.send(index, sqe, None)
    }

    /// Sends `sqe` as it is — its SGL untouched, its CID filled in — as a capsule of `len`
    /// bytes: fewer than 64 cut the SQE short, more send the bytes of `data` after it. For
    /// tests of a target's handling of malformed capsules; a response, if the target sends
    /// one, completes it as any command's.
    #[doc(hidden)]
    pub fn submit_raw(
        &mut self,
        sqe: Sqe,
        len: u32,
        data: Option<IoBuffer>,
        token: u64,
    ) -> Result<(), SubmitError> {
        if self.phase != Phase::Ready {
            return Err(SubmitError::Dead);
        }
        let trailing = len.saturating_sub(SQE as u32);
        let data = match data {
            Some(b) if trailing > 0 => {
                let (lkey, _) = self.buffer_keys(b, trailing)?;
                Some(Sge {
                    addr: b.iova,
                    len: trailing,
                    lkey,
                })
            }
            _ => None,
        };
        let index = self.take_slot(Slot {
            token,
            nsid: sqe.nsid,
            ..Slot::default()
        })?;
        self.send_capsule(index, sqe, len.min(SQE as u32), data)
    }

    /// Nothing waits to be sent on RDMA: commands are posted as they are submitted.
    pub fn flush(&mut self) {}

    /// Takes what completed, checks the command timeout, hands finished commands to
    /// `on_done`; returns how many.
    pub fn poll(&mut self, mut on_done: impl FnMut(Completion)) -> usize {
        if !self.owner_clock {
            self.now_ns = self.epoch.elapsed().as_nanos() as u64;
        }
        let mut count = 0;
        let mut handler = |c: Completion| {
            count += 1;
            on_done(c);
        };
        for c in self.early.drain(..) {
            handler(c);
        }
        if self.phase == Phase::Ready {
            // a disconnect shows here too (as flushed work requests), so the CM is read only
            // when the queue is idle or ended
            if self.in_flight == 0 {
                self.read_cm_events();
            }
            self.poll_completions(&mut handler);
            self.check_timeouts();
        }
        self.deliver_ended(&mut handler);
        count
    }

    fn read_cm_events(&mut self) {
        loop {
            match self.channel.next() {
                Ok(Some(ev)) => {
                    let _ = self.on_cm_event(ev.kind, ev.status, ev.private());
                }
                Ok(None) => break,
                Err(e) => {
                    log::warn!("NVMe/RDMA queue {}: {e}", self.params.qid);
                    self.end(Failure::Closed);
                    break;
                }
            }
        }
    }

    /// Takes the queue pair's completions; whether any went to another queue pair on the
    /// shared completion queue.
    fn poll_completions(&mut self, on_done: &mut impl FnMut(Completion)) -> bool {
        let Some(cq) = self.cq.take() else {
            return false;
        };
        let polled = cq.poll(|wc| {
            if cq.is_mine(wc.wr_id) {
                self.on_completion(wc, on_done);
            }
        });
        self.cq = Some(cq);
        match polled {
            Ok((_, others)) => others,
            Err(e) => {
                log::warn!("NVMe/RDMA queue {}: {e}", self.params.qid);
                self.end(Failure::Closed);
                false
            }
        }
    }

    fn on_completion(&mut self, wc: &Wc, on_done: &mut impl FnMut(Completion)) {
        if wc.status != 0 {
            // a flushed request after a disconnect, or a transport error: the queue is over
            if self.ended.is_none() {
                log::warn!(
                    "NVMe/RDMA queue {}: work request failed: {}",
                    self.params.qid,
                    wc_status_name(wc.status)
                );
                self.end(Failure::Closed);
            }
            if wc.wr_id & RECV_TAG == 0 {
                if let Some(s) = self.slots.get_mut(usize::from(wc.wr_id as u16)) {
                    s.sending = false;
                }
            }
            return;
        }
        match wc.opcode {
            WcOpcode::Recv => {
                let i = wc.wr_id as u16;
                self.on_response(i, wc.byte_len, on_done);
            }
            WcOpcode::Send => {
                let index = wc.wr_id as u16;
                let Some(s) = self.slots.get_mut(index as usize) else {
                    return;
                };
                s.sending = false;
                if s.busy && s.response.is_some() {
                    self.finish(index, on_done);
                }
            }
            other => log::debug!("NVMe/RDMA queue {}: completion {other:?}", self.params.qid),
        }
    }

    /// Response buffer `i` holds a CQE: its command finishes (once its SEND completed too).
    fn on_response(&mut self, i: u16, len: u32, on_done: &mut impl FnMut(Completion)) {
        let (_, responses, ..) = own_layout(self.slots.len());
        let mut bytes = [0u8; CQE];
        let read = self.own.read_slice(
            &mut bytes,
            GuestAddress(responses + (usize::from(i) * CQE) as u64),
        );
        // the buffer is free again as soon as it is read
        if self.ended.is_none() {
            if let Err(e) = self.post_recv(i) {
                log::warn!("NVMe/RDMA queue {}: {e}", self.params.qid);
                self.end(Failure::Closed);
            }
        }
        if read.is_err() || len as usize != CQE {
            log::warn!(
                "NVMe/RDMA queue {}: a response of {len} bytes (a CQE is {CQE}): the queue ends",
                self.params.qid
            );
            self.end(Failure::Closed);
            return;
        }
        let cqe = Cqe::from_bytes(&bytes);
        let index = cqe.cid & ((1 << SLOT_BITS) - 1);
        let generation = cqe.cid >> SLOT_BITS;
        let Some(s) = self.slots.get_mut(index as usize) else {
            return self.protocol_error(cqe.cid);
        };
        if !s.busy || s.generation != generation || s.response.is_some() {
            return self.protocol_error(cqe.cid);
        }
        s.response = Some((cqe.status(), [cqe.dw0, cqe.dw1]));
        if self.phase == Phase::AwaitConnect && index == CONNECT_SLOT {
            let status = cqe.status();
            if !status.is_success() {
                // (the caller names a refused Connect by its status: unknown NQN, host)
                self.end(Failure::Status(status));
                return;
            }
            if self.params.qid == 0 {
                self.params.cntlid = cqe.dw0 as u16;
            }
        }
        if !s.sending {
            self.finish(index, on_done);
        }
    }

    fn protocol_error(&mut self, cid: u16) {
        log::warn!(
            "NVMe/RDMA queue {}: a response for CID {cid:#x}, not in flight: the queue ends",
            self.params.qid
        );
        self.end(Failure::Closed);
    }

    fn finish(&mut self, index: u16, on_done: &mut impl FnMut(Completion)) {
        let s = self.slots[index as usize];
        self.release(index);
        let Some((status, dw)) = s.response else {
            return;
        };
        if s.token == u64::MAX && self.phase == Phase::AwaitConnect {
            // the Connect's own slot
            self.phase = Phase::Ready;
            return;
        }
        let result = if status.is_success() {
            Ok(())
        } else {
            Err(Failure::Status(status))
        };
        if let (Some(rerouted), Err(Failure::Status(st)), Some(io)) =
            (&mut self.rerouted, result, s.io)
        {
            if st.sct() == 3 && rerouted.len() < rerouted.capacity() {
                rerouted.push((io, st));
                return;
            }
        }
        on_done(Completion {
            token: s.token,
            nsid: s.nsid,
            result,
            submitted_ns: s.since_ns,
            bytes: s.len,
            dw0: dw[0],
            dw1: dw[1],
        });
    }

    fn check_timeouts(&mut self) {
        if self.now_ns < self.next_timeout_check || self.in_flight == 0 {
            return;
        }
        let timeout = self.params.timeout_ns;
        self.next_timeout_check = self.now_ns.saturating_add(timeout / 8 + 1);
        let now = self.now_ns;
        let mut expired = false;
        for s in self
            .slots
            .iter_mut()
            .filter(|s| s.busy && s.response.is_none())
        {
            if now.saturating_sub(s.submitted_ns) > timeout {
                s.timed_out = true;
                expired = true;
            }
        }
        if expired {
            log::warn!(
                "NVMe/RDMA queue {}: a command got no response within {} ms: the queue ends",
                self.params.qid,
                timeout / 1_000_000
            );
            self.end(Failure::TimedOut);
        }
    }

    /// The queue ends: it disconnects; what is in flight fails (or is kept) on the next poll.
    fn end(&mut self, why: Failure) {
        if self.ended.is_none() {
            self.ended = Some(why);
            self.phase = Phase::Ended;
            self.id.disconnect();
        }
    }

    /// Once the queue ended: everything in flight fails with the reason (I/Os kept for
    /// [`IoQueue::take_unfinished`] where asked).
    fn deliver_ended(&mut self, on_done: &mut impl FnMut(Completion)) {
        let Some(reason) = self.ended else {
            return;
        };
        for index in 0..self.slots.len() as u16 {
            let s = self.slots[index as usize];
            if !s.busy || (self.keep_unfinished && s.io.is_some() && s.response.is_none()) {
                continue;
            }
            let result = match s.response {
                Some((status, _)) if status.is_success() => Ok(()),
                Some((status, _)) => Err(Failure::Status(status)),
                None if s.timed_out => Err(Failure::TimedOut),
                None => Err(reason),
            };
            self.release(index);
            if s.token == u64::MAX {
                continue;
            }
            on_done(Completion {
                token: s.token,
                nsid: s.nsid,
                result,
                submitted_ns: s.since_ns,
                bytes: s.len,
                dw0: s.response.map_or(0, |r| r.1[0]),
                dw1: s.response.map_or(0, |r| r.1[1]),
            });
        }
    }

    /// Waits until a completion or a CM event may be there, at most `timeout`.
    pub fn wait(&mut self, timeout: Duration) -> Result<(), HostError> {
        if self.waiter.is_none() {
            let epoll =
                Epoll::new(EpollCreateFlags::EPOLL_CLOEXEC).map_err(std::io::Error::from)?;
            epoll
                .add(
                    self.channel.as_fd(),
                    EpollEvent::new(EpollFlags::EPOLLIN, 0),
                )
                .map_err(std::io::Error::from)?;
            self.waiter = Some(epoll);
        }
        if let (Some(cq), Some(epoll)) = (&self.cq, self.waiter.as_ref()) {
            cq.cq().arm().map_err(rdma_error)?;
            // (adding it again only fails with EEXIST)
            let _ = epoll.add(cq.cq().as_fd(), EpollEvent::new(EpollFlags::EPOLLIN, 1));
        }
        // what completed before the arm raises no event: take it now, sleep only if nothing
        // moved (its completions go out with the next poll; another queue pair's, handed to
        // it, with its owner's next poll)
        let phase = self.phase;
        let mut early = std::mem::take(&mut self.early);
        let others = self.poll_completions(&mut |c| early.push(c));
        let moved = !early.is_empty() || others || self.phase != phase || self.ended.is_some();
        self.early = early;
        if moved {
            return Ok(());
        }
        let Some(epoll) = &self.waiter else {
            return Ok(());
        };
        let ms = timeout.as_micros().div_ceil(1000);
        let t = EpollTimeout::try_from(ms).unwrap_or(EpollTimeout::MAX);
        match epoll.wait(&mut [EpollEvent::empty()], t) {
            Ok(_) | Err(nix::errno::Errno::EINTR) => {}
            Err(e) => return Err(std::io::Error::from(e).into()),
        }
        if let Some(cq) = &self.cq {
            while cq.cq().take_event() {}
        }
        Ok(())
    }

    /// The owner's clock (nanoseconds), once per turn.
    pub fn set_now(&mut self, now_ns: u64) {
        self.owner_clock = true;
        self.now_ns = now_ns;
    }

    pub fn in_flight(&self) -> usize {
        self.in_flight
    }

    pub fn free(&self) -> usize {
        if self.phase == Phase::Ready {
            self.free.len()
        } else {
            0
        }
    }

    pub fn ended(&self) -> Option<Failure> {
        self.ended
    }

    pub fn qid(&self) -> u16 {
        self.params.qid
    }

    /// The controller: on an admin queue, the one the target granted.
    pub fn cntlid(&self) -> u16 {
        self.params.cntlid
    }

    /// The target's receive queue size (CRQSIZE of its accept).
    pub fn crqsize(&self) -> u16 {
        self.crqsize
    }

    /// Write data up to `bytes` goes in the command capsule from now on.
    pub fn set_in_capsule(&mut self, bytes: u32) {
        self.params.in_capsule = bytes;
    }

    pub fn set_timeout(&mut self, ns: u64) {
        self.params.timeout_ns = ns;
    }

    pub fn keep_unfinished(&mut self, keep: bool) {
        self.keep_unfinished = keep;
    }

    pub fn reroute_path_errors(&mut self) {
        if self.rerouted.is_none() {
            self.rerouted = Some(Vec::with_capacity(self.slots.len()));
        }
    }

    pub fn take_rerouted(&mut self, mut take: impl FnMut(Unfinished, Status)) {
        if let Some(r) = &mut self.rerouted {
            for (u, s) in r.drain(..) {
                take(u, s);
            }
        }
    }

    /// Once the queue ended: the I/Os it had not finished (see [`IoQueue::keep_unfinished`]).
    pub fn take_unfinished(&mut self, mut take: impl FnMut(Unfinished)) {
        if self.ended.is_none() {
            return;
        }
        for index in 0..self.slots.len() as u16 {
            let s = self.slots[index as usize];
            if let (true, None, Some(io)) = (s.busy, s.response, s.io) {
                self.release(index);
                take(io);
            }
        }
    }

    /// Ends the queue: what is in flight fails as aborted (handed to `on_done`).
    pub fn close(&mut self, on_done: impl FnMut(Completion)) -> usize {
        self.end(Failure::Aborted);
        self.poll(on_done)
    }
}

impl Drop for IoQueue {
    fn drop(&mut self) {
        self.id.disconnect();
    }
}

fn host_address(mem: &IovaMemory, iova: u64) -> Result<*mut u8, HostError> {
    let r = mem
        .find_region(GuestAddress(iova))
        .ok_or_else(|| rdma_error("the queue's own memory is not mapped"))?;
    r.get_host_address(MemoryRegionAddress(iova - r.start_addr().0))
        .map_err(|e| rdma_error(format!("the queue's own memory: {e}")))
}
