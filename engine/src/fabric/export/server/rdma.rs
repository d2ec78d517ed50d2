//! A reactor's NVMe/RDMA side: the queue pairs of its RDMA connections, all on one protection
//! domain, one completion queue and one shared receive queue, with the reactor's DMA buffer
//! pools registered once under their IOVAs (so an RDMA READ or WRITE reaches a command's
//! buffer by its IOVA, no translation per I/O), and its connections' CM events on one channel
//! of its own.
//!
//! The shared receive queue's buffers take the capsules of all the reactor's connections (a
//! host may have up to its queue's size outstanding, and most are idle at any time: one pool
//! for all costs far less memory than a buffer per entry of every queue; when it runs dry the
//! host's adapter retries, RNR). A capsule that arrives goes to its [`Connection`] (as
//! NVMe/TCP's would, see `connection::rdma`) straight from its receive buffer — its in-capsule
//! data copied once, into its command's DMA buffer — whose asks are carried out here: a
//! response is a SEND, a write's data an RDMA READ into the command's buffer, a read's data an
//! RDMA WRITE from it, admin data an RDMA WRITE of a copy. A capsule whose own data (a
//! Connect's, Dataset Management ranges, an admin command's) is keyed is read into its receive
//! buffer first, then handed over as in-capsule data.
//!
//! Work request IDs say whose and what: the connection's slot (bits 32..), the kind (24..32),
//! an index (a receive buffer, a response, a command's token); a receive's connection is the
//! one of the queue pair its completion names. Completions are checked against the
//! connection's queue pair number, so that a late one of a closed connection is never taken
//! for its slot's next.
//!
//! A reactor with RDMA connections polls: it does not sleep while it has any (its completion
//! queue is read every turn, with no system call).

use std::collections::HashMap;
use std::io;

use usnvme_driver::spec::fabrics::FABRICS_OPCODE;
use usnvme_driver::spec::rdma::{encode_accept, CmRequest};
use usnvme_driver::spec::{Cqe, IoOpcode, SglDescriptor, Sqe};
use usnvme_hugepages::{DmaBuffer, IovaMemory};
use vm_memory::{Bytes, GuestAddress, GuestMemoryBackend, GuestMemoryRegion, MemoryRegionAddress};

use super::backend::Pools;
use super::IncomingRdma;
use crate::fabric::export::admin::MAX_ADMIN_DATA;
use crate::fabric::export::connection::rdma::{Keyed, RdmaOp};
use crate::fabric::export::connection::{Backend, Connection};
use crate::fabric::export::Listener;
use crate::transport::rdma::verbs::{
    largest, wc_status_name, CmEventKind, CmId, CompletionQueue, EventChannel, MemoryRegion,
    ProtectionDomain, QpCaps, Sge, SharedReceiveQueue, Wc, WcOpcode, POLL_BATCH,
};

const RECV: u64 = 1;
const RESPOND: u64 = 2;
const ADMIN: u64 = 3;
const READ: u64 = 4;
const WRITE: u64 = 5;
/// The keyed data of a capsule, read into its receive buffer before it is handed over.
const PREREAD: u64 = 6;

/// Room in front of a received capsule for the header the connection reads it with.
const ROOM: usize = 8;
const SQE: usize = Sqe::SIZE;
/// Receive buffers of a reactor (fewer when the device allows fewer): as SPDK's default.
const RECEIVES: u32 = 4096;
/// The data a receive buffer holds at least: a Connect's.
const MIN_CAPSULE_DATA: usize = 1024;
/// Responses in flight per connection at most, per host queue entry.
const RESPONSES_PER_ENTRY: usize = 4;
/// Admin data transfers in flight per connection at most.
const ADMIN_SLOTS: usize = 8;
/// RDMA READs the host may have outstanding against us, and we against it.
const RDMA_DEPTH: u8 = 16;
/// Where a connection's own memory is addressed (its own region: any page-aligned address
/// does).
const OWN_IOVA: u64 = 0x1000;

fn wr_id(slot: usize, kind: u64, index: u16) -> u64 {
    ((slot as u64) << 32) | (kind << 24) | u64::from(index)
}

fn split(wr: u64) -> (u64, u16) {
    ((wr >> 24) & 0xff, wr as u16)
}

fn error(what: &str, e: impl std::fmt::Display) -> io::Error {
    io::Error::other(format!("{what}: {e}"))
}

/// What a reactor's RDMA connections share. Field order is drop order: the registrations
/// and the shared receive queue before the completion queue and the protection domain, the
/// receive buffers' registration before their memory.
pub(super) struct RdmaSide {
    /// The reactor's DMA pools' regions: IOVAs `start..end` under `lkey`.
    regions: Vec<(u64, u64, u32, MemoryRegion)>,
    receives_mr: MemoryRegion,
    srq: SharedReceiveQueue,
    cq: CompletionQueue,
    pd: ProtectionDomain,
    /// The receive buffers: buffer `i` at `i * stride` (IOVA `receives_iova` + that), a
    /// capsule received at [`ROOM`] into it. The adapter writes a buffer only while it is
    /// posted; this side reads and writes it only while it is not.
    receives: Vec<u8>,
    receives_iova: u64,
    stride: usize,
    /// The most in-capsule data a receive buffer holds.
    capsule_data: usize,
    /// Each receive buffer's holder while it is not posted: the queue pair whose capsule it
    /// holds (0: posted; no RC queue pair has number 0).
    holder: Vec<u32>,
    /// The connections' slots, by their queue pairs' numbers.
    slots: HashMap<u32, usize>,
    /// Where the CM events of the reactor's connections come.
    pub(super) channel: EventChannel,
    wcs: [Wc; POLL_BATCH],
}

impl RdmaSide {
    /// The reactor's side, on the RDMA device of its first connection `first`: a protection
    /// domain, a completion queue of `cq_entries`, the `pools` registered, a shared receive
    /// queue with its buffers (of a capsule with `in_capsule` bytes of data) posted.
    pub(super) fn new(
        first: &CmId,
        pools: &Pools,
        cq_entries: u32,
        in_capsule: u32,
    ) -> io::Result<RdmaSide> {
        let pd = first.alloc_pd()?;
        let cq = largest(cq_entries, |n| first.create_cq(n))?;
        let srq = largest(RECEIVES, |n| pd.create_srq(n))?;
        let (cq_entries, cq) = cq;
        let (count, srq) = srq;
        log::debug!("RDMA: a completion queue of {cq_entries}, {count} shared receives");
        let channel = EventChannel::new()?;
        let mut regions = Vec::new();
        for pool in std::iter::once(&pools.usual).chain(pools.large.as_ref()) {
            let r = pool.region();
            let mr = pd.register(r.as_ptr(), r.len(), r.iova())?;
            regions.push((r.iova(), r.iova() + r.len() as u64, mr.lkey(), mr));
        }
        let capsule_data = (in_capsule as usize).max(MIN_CAPSULE_DATA);
        let stride = (ROOM + SQE + capsule_data).next_multiple_of(64);
        let mut receives = vec![0u8; count as usize * stride];
        // addressed by their own addresses (an IOVA must keep an address's page offset)
        let receives_iova = receives.as_ptr() as u64;
        let receives_mr = pd.register(receives.as_mut_ptr(), receives.len(), receives_iova)?;
        let mut side = RdmaSide {
            regions,
            receives_mr,
            srq,
            cq,
            pd,
            receives,
            receives_iova,
            stride,
            capsule_data,
            holder: vec![0; count as usize],
            slots: HashMap::new(),
            channel,
            wcs: [Wc {
                wr_id: 0,
                qp_num: 0,
                status: 0,
                opcode: WcOpcode::Send,
                byte_len: 0,
            }; POLL_BATCH],
        };
        for i in 0..count as u16 {
            side.post_receive(i)?;
        }
        Ok(side)
    }

    /// The local key of the pool buffer at `iova` (`len` bytes).
    fn lkey(&self, iova: u64, len: u32) -> Option<u32> {
        let end = iova.checked_add(u64::from(len))?;
        self.regions
            .iter()
            .find(|(s, e, ..)| *s <= iova && end <= *e)
            .map(|r| r.2)
    }

    /// Where a capsule lands in receive buffer `i`: its IOVA (after the room).
    fn capsule_at(&self, i: u16) -> u64 {
        self.receives_iova + (usize::from(i) * self.stride + ROOM) as u64
    }

    /// Posts receive buffer `i` (again).
    fn post_receive(&mut self, i: u16) -> io::Result<()> {
        self.holder[usize::from(i)] = 0;
        let sge = Sge {
            addr: self.capsule_at(i),
            len: (SQE + self.capsule_data) as u32,
            lkey: self.receives_mr.lkey(),
        };
        self.srq.post_recv(wr_id(0, RECV, i), sge)
    }

    /// Posts receive buffer `i` again if queue pair `qp_num` holds it.
    fn release(&mut self, i: u16, qp_num: u32) {
        if self.holder.get(usize::from(i)) == Some(&qp_num) {
            if let Err(e) = self.post_receive(i) {
                log::warn!("RDMA: posting a receive again: {e}");
            }
        }
    }

    /// The slot of the connection completion `wc` is for, as far as its work request says
    /// (the caller checks the queue pair's number).
    pub(super) fn slot_of(&self, wc: &Wc) -> Option<usize> {
        match split(wc.wr_id).0 {
            RECV => self.slots.get(&wc.qp_num).copied(),
            _ => Some((wc.wr_id >> 32) as usize),
        }
    }

    /// A completion no connection takes (its connection closed): a receive buffer it used
    /// is posted again.
    pub(super) fn unclaimed(&mut self, wc: Wc) {
        let (kind, i) = split(wc.wr_id);
        match kind {
            RECV => {
                self.holder[usize::from(i)] = wc.qp_num;
                self.release(i, wc.qp_num);
            }
            PREREAD => self.release(i, wc.qp_num),
            _ => {}
        }
    }

    /// Queue pair `qp_num` is gone (destroyed: its adapter touches nothing of ours): the
    /// receive buffers it held are posted again.
    pub(super) fn closed(&mut self, qp_num: u32) {
        self.slots.remove(&qp_num);
        for i in 0..self.holder.len() {
            self.release(i as u16, qp_num);
        }
    }

    /// Takes up to a batch of completions; hands each to `on`.
    pub(super) fn poll(&mut self, mut on: impl FnMut(&mut RdmaSide, Wc)) -> io::Result<usize> {
        let n = self.cq.poll(&mut self.wcs)?;
        // what the adapter wrote before these completions is seen after them
        std::sync::atomic::fence(std::sync::atomic::Ordering::Acquire);
        for i in 0..n {
            let wc = self.wcs[i];
            on(self, wc);
        }
        Ok(n)
    }
}

/// One connection's queue pair and its own registered memory: responses and admin data.
/// Field order is drop order: the queue pair (in `id`) first.
pub(super) struct QueuePair {
    id: CmId,
    mr: MemoryRegion,
    own: IovaMemory,
    qp_num: u32,
    /// The host's submission queue entries.
    entries: u16,
    /// An I/O queue (its writes' keyed data goes straight into the commands' buffers).
    io: bool,
    next_response: usize,
    next_admin: usize,
    disconnected: bool,
}

impl std::fmt::Debug for QueuePair {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("QueuePair")
            .field("qp_num", &self.qp_num)
            .field("entries", &self.entries)
            .finish()
    }
}

impl QueuePair {
    /// Takes connection `id` (a connect request for `request`) on `side` as the reactor's
    /// connection `slot`: its queue pair on the shared receive queue, accepted.
    pub(super) fn accept(
        side: &mut RdmaSide,
        id: CmId,
        request: CmRequest,
        slot: usize,
    ) -> io::Result<QueuePair> {
        id.migrate(&side.channel)?;
        let entries = request.hsqsize.saturating_add(1);
        let mut id = id;
        let e = usize::from(entries);
        id.create_qp(
            &side.pd,
            &side.cq,
            Some(&side.srq),
            QpCaps {
                send: (e * RESPONSES_PER_ENTRY + ADMIN_SLOTS) as u32,
                recv: 0,
                send_sge: 1,
            },
        )?;
        let len = e * RESPONSES_PER_ENTRY * Cqe::SIZE + ADMIN_SLOTS * MAX_ADMIN_DATA;
        let own =
            IovaMemory::from_ranges(&[(GuestAddress(OWN_IOVA), len)]).map_err(io::Error::other)?;
        let region = own
            .find_region(GuestAddress(OWN_IOVA))
            .ok_or_else(|| io::Error::other("a connection's own memory is not mapped"))?;
        let ptr = region
            .get_host_address(MemoryRegionAddress(0))
            .map_err(|e| error("a connection's own memory", e))?;
        let mr = side.pd.register(ptr, len, OWN_IOVA)?;
        let qp_num = id
            .qp_num()
            .ok_or_else(|| io::Error::other("the connection has no queue pair"))?;
        let qp = QueuePair {
            id,
            mr,
            own,
            qp_num,
            entries,
            io: request.qid != 0,
            next_response: 0,
            next_admin: 0,
            disconnected: false,
        };
        qp.id.accept(&encode_accept(entries), RDMA_DEPTH)?;
        side.slots.insert(qp_num, slot);
        Ok(qp)
    }

    pub(super) fn qp_num(&self) -> u32 {
        self.qp_num
    }

    /// The CM ID's identity, as its events name it.
    pub(super) fn cm_id(&self) -> usize {
        self.id.raw()
    }

    fn responses_at(&self) -> u64 {
        OWN_IOVA
    }

    fn admin_at(&self) -> u64 {
        let responses = usize::from(self.entries) * RESPONSES_PER_ENTRY * Cqe::SIZE;
        self.responses_at() + responses as u64
    }

    /// The connection is over: disconnect (its work requests flush).
    pub(super) fn disconnect(&mut self) {
        if !self.disconnected {
            self.disconnected = true;
            self.id.disconnect();
        }
    }

    /// A completion of this queue pair: the capsules received go to `conn`, the data moved
    /// is reported to it; what it asks for is carried out (see [`QueuePair::carry_out`]).
    pub(super) fn on_completion(
        &mut self,
        wc: Wc,
        slot: usize,
        conn: &mut Connection,
        backend: &mut dyn Backend,
        side: &mut RdmaSide,
    ) {
        let (kind, index) = split(wc.wr_id);
        if kind == RECV {
            side.holder[usize::from(index)] = self.qp_num;
        }
        if wc.status != 0 {
            match kind {
                RECV | PREREAD => side.release(index, self.qp_num),
                READ => conn.rdma_read_done(index, false, backend),
                WRITE => conn.rdma_written(index, backend),
                _ => {}
            }
            if !self.disconnected {
                self.disconnected = true;
                conn.peer_gone(
                    &format!("RDMA: a work request failed: {}", wc_status_name(wc.status)),
                    backend,
                );
            }
            return;
        }
        match kind {
            RECV => self.on_capsule(index, wc.byte_len as usize, slot, conn, backend, side),
            PREREAD => self.hand_over(index, None, conn, backend, side),
            READ => conn.rdma_read_done(index, true, backend),
            WRITE => conn.rdma_written(index, backend),
            _ => {} // responses and admin data: their place is free again
        }
    }

    /// Receive buffer `i` holds a capsule of `len` bytes.
    fn on_capsule(
        &mut self,
        i: u16,
        len: usize,
        slot: usize,
        conn: &mut Connection,
        backend: &mut dyn Backend,
        side: &mut RdmaSide,
    ) {
        if len < SQE {
            side.release(i, self.qp_num);
            self.disconnect();
            conn.peer_gone(&format!("RDMA: a capsule of {len} bytes"), backend);
            return;
        }
        let at = usize::from(i) * side.stride + ROOM;
        let Some(sqe) = side.receives[at..].first_chunk().map(Sqe::from_bytes) else {
            side.release(i, self.qp_num); // (cannot be: a buffer holds an SQE)
            return;
        };
        // keyed data the connection keeps whole: read it in first
        if let Some(keyed) = self.keyed_own_data(&sqe, len, side.capsule_data) {
            let sge = Sge {
                addr: side.capsule_at(i) + SQE as u64,
                len: keyed.length,
                lkey: side.receives_mr.lkey(),
            };
            let read = self
                .id
                .post_read(wr_id(slot, PREREAD, i), &[sge], keyed.address, keyed.key);
            if let Err(e) = read {
                side.release(i, self.qp_num);
                self.disconnect();
                conn.peer_gone(&format!("RDMA: post READ: {e}"), backend);
            }
            return;
        }
        self.hand_over(i, Some(len), conn, backend, side);
    }

    /// A capsule's keyed data the connection must have whole (not a write's, which goes into
    /// its command's buffer): host-to-controller data of a Fabrics or admin command, or of an
    /// I/O command other than Write, no larger than a receive buffer's `room`.
    fn keyed_own_data(&self, sqe: &Sqe, len: usize, room: usize) -> Option<Keyed> {
        let keyed = Keyed::of(&sqe.sgl()).filter(|k| k.length > 0)?;
        let opcode = sqe.opcode();
        let to_controller = if opcode == FABRICS_OPCODE {
            sqe.fctype().is_some_and(|t| t & 1 == 1)
        } else {
            opcode & 1 == 1
        };
        let write = self.io && opcode == IoOpcode::Write as u8;
        (len == SQE && to_controller && !write && keyed.length as usize <= room).then_some(keyed)
    }

    /// Hands receive buffer `i`'s capsule to the connection, where it lies (`len` bytes as
    /// received; None: its keyed data was read in after the SQE, which now says so), posts
    /// the buffer again, and carries out what the connection asks.
    fn hand_over(
        &mut self,
        i: u16,
        len: Option<usize>,
        conn: &mut Connection,
        backend: &mut dyn Backend,
        side: &mut RdmaSide,
    ) {
        let start = usize::from(i) * side.stride;
        let buffer = &mut side.receives[start..start + side.stride];
        let data = match len {
            Some(len) => len - SQE,
            None => {
                let Some(bytes) = buffer[ROOM..].first_chunk_mut::<SQE>() else {
                    side.release(i, self.qp_num); // (cannot be: a buffer holds an SQE)
                    return;
                };
                let mut sqe = Sqe::from_bytes(bytes);
                let n = Keyed::of(&sqe.sgl()).map_or(0, |k| k.length);
                sqe.set_sgl(SglDescriptor::in_capsule(n));
                bytes.copy_from_slice(sqe.as_bytes());
                n as usize
            }
        };
        // (the adapter never writes more than a buffer takes; a READ is at most its room)
        let end = (ROOM + SQE + data).min(buffer.len());
        conn.receive_capsule(&mut buffer[..end], backend);
        side.release(i, self.qp_num);
    }

    /// Carries out what `conn` asks of the queue pair (`buffers`: its commands' DMA buffers).
    pub(super) fn carry_out(
        &mut self,
        slot: usize,
        conn: &mut Connection,
        buffers: &[Option<DmaBuffer>],
        side: &RdmaSide,
    ) {
        let mut failed = None;
        conn.take_rdma_ops(|op| {
            if failed.is_some() {
                return;
            }
            if let Err(e) = self.post(slot, op, buffers, side) {
                failed = Some(e);
            }
        });
        if let Some(e) = failed {
            log::warn!("{conn:?}: RDMA: {e}: disconnecting");
            self.disconnect();
        }
    }

    fn post(
        &mut self,
        slot: usize,
        op: RdmaOp,
        buffers: &[Option<DmaBuffer>],
        side: &RdmaSide,
    ) -> io::Result<()> {
        let lkey = self.mr.lkey();
        match op {
            RdmaOp::Respond(cqe) => {
                let ring = usize::from(self.entries) * RESPONSES_PER_ENTRY;
                let n = self.next_response % ring;
                self.next_response = self.next_response.wrapping_add(1);
                let at = self.responses_at() + (n * Cqe::SIZE) as u64;
                self.own
                    .write_slice(cqe.as_bytes(), GuestAddress(at))
                    .map_err(io::Error::other)?;
                let sge = Sge {
                    addr: at,
                    len: Cqe::SIZE as u32,
                    lkey,
                };
                self.id.post_send(wr_id(slot, RESPOND, n as u16), &[sge])
            }
            RdmaOp::AdminData { data, remote } => {
                let n = self.next_admin % ADMIN_SLOTS;
                self.next_admin = self.next_admin.wrapping_add(1);
                let at = self.admin_at() + (n * MAX_ADMIN_DATA) as u64;
                let len = data.len().min(MAX_ADMIN_DATA);
                self.own
                    .write_slice(&data[..len], GuestAddress(at))
                    .map_err(io::Error::other)?;
                let sge = Sge {
                    addr: at,
                    len: len as u32,
                    lkey,
                };
                self.id.post_write(
                    wr_id(slot, ADMIN, n as u16),
                    &[sge],
                    remote.address,
                    remote.key,
                )
            }
            RdmaOp::Read { token, len, remote } | RdmaOp::Write { token, len, remote } => {
                let is_read = matches!(op, RdmaOp::Read { .. });
                let b = buffers
                    .get(usize::from(token))
                    .and_then(Option::as_ref)
                    .ok_or_else(|| io::Error::other("a command without a buffer"))?;
                let lkey = side
                    .lkey(b.iova(), len)
                    .ok_or_else(|| io::Error::other("a buffer outside the registered pools"))?;
                let sge = Sge {
                    addr: b.iova(),
                    len,
                    lkey,
                };
                if is_read {
                    self.id
                        .post_read(wr_id(slot, READ, token), &[sge], remote.address, remote.key)
                } else {
                    self.id.post_write(
                        wr_id(slot, WRITE, token),
                        &[sge],
                        remote.address,
                        remote.key,
                    )
                }
            }
            RdmaOp::Disconnect => {
                self.disconnect();
                Ok(())
            }
        }
    }
}

/// Rejects connect request `id` for want of resources.
pub(super) fn reject_no_resources(id: &CmId) {
    let status = usnvme_driver::spec::rdma::CmRejectStatus::NoResources;
    if let Err(e) = id.reject(&status.encode()) {
        log::warn!("RDMA: reject: {e}");
    }
}

/// An NVMe/RDMA port: the RDMA CM listening on an address; connect requests are checked
/// (their private data) and handed to reactors, or rejected with the reason.
pub struct RdmaListener {
    /// Listening while it lives (events come on `channel`).
    _id: CmId,
    channel: EventChannel,
    port: Listener,
}

impl std::fmt::Debug for RdmaListener {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RdmaListener")
            .field("port", &self.port)
            .finish()
    }
}

impl RdmaListener {
    /// Listens on `address` as port `port_id` (the address must be an RDMA device's: see
    /// `rdma link`).
    pub fn bind(address: std::net::SocketAddr, port_id: u16) -> io::Result<RdmaListener> {
        let channel = EventChannel::new()?;
        let id = CmId::new(&channel)?;
        id.bind(address).map_err(|e| {
            error(
                &format!("{address} (is it the address of an RDMA device? `rdma link` lists them)"),
                e,
            )
        })?;
        id.listen(128)?;
        Ok(RdmaListener {
            _id: id,
            channel,
            port: Listener {
                address,
                port_id,
                transport: crate::fabric::address::Transport::Rdma,
            },
        })
    }

    pub fn port(&self) -> &Listener {
        &self.port
    }

    /// The CM's descriptor: readable when a host knocks.
    pub fn as_fd(&self) -> std::os::fd::BorrowedFd<'_> {
        self.channel.as_fd()
    }

    /// Takes the connect requests that came: each whose private data is valid (queues of at
    /// most `max_entries`) goes to the next of `inboxes` (round robin, `next`); the others
    /// are rejected with the reason. True when any came.
    pub fn accept(&self, max_entries: u16, inboxes: &[super::Inbox], next: &mut usize) -> bool {
        let mut any = false;
        loop {
            let mut ev = match self.channel.next() {
                Ok(Some(ev)) => ev,
                Ok(None) => return any,
                Err(e) => {
                    log::warn!("RDMA port {}: {e}", self.port.address);
                    return any;
                }
            };
            let (CmEventKind::ConnectRequest, Some(id)) = (ev.kind, ev.new_id.take()) else {
                continue; // (a connection's events before its reactor took it over)
            };
            any = true;
            let peer = format!("rdma host on port {}", self.port.address);
            match CmRequest::decode(ev.private(), max_entries) {
                Ok(request) if !inboxes.is_empty() => {
                    log::info!("{peer}: connected (queue {})", request.qid);
                    inboxes[*next % inboxes.len()].send_rdma(IncomingRdma {
                        id,
                        request,
                        peer,
                        port: self.port.clone(),
                    });
                    *next += 1;
                }
                Ok(_) => {
                    let _ =
                        id.reject(&usnvme_driver::spec::rdma::CmRejectStatus::NoResources.encode());
                }
                Err(status) => {
                    log::warn!("{peer}: connect request rejected: {status}");
                    if let Err(e) = id.reject(&status.encode()) {
                        log::warn!("{peer}: reject: {e}");
                    }
                }
            }
        }
    }
}
