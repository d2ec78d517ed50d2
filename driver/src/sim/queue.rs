//! Submission and completion queues as the controller keeps them, and the command engine:
//! fetch, fault, execute or hold, complete.

use std::collections::VecDeque;
use std::sync::atomic::{fence, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use nix::sys::eventfd::EventFd;
use parking_lot::Mutex;
use usnvme_hugepages::MemoryView;
use vm_memory::GuestAddress;

use super::fault::FaultAction;
use super::{admin, io, Ctx, Inner, Outcome, Running, SimMode};
use crate::spec::{Cqe, Sqe, Status};

pub(crate) const SQE_BYTES: u64 = 64;
pub(crate) const CQE_BYTES: u64 = 16;
/// How long a held command waits when nobody releases it.
const HELD: Duration = Duration::from_secs(365 * 24 * 3600);

/// Command ids in flight on one SQ: 65 536 bits.
pub(crate) struct CidSet(Box<[u64]>);

impl CidSet {
    pub fn new() -> CidSet {
        CidSet(vec![0; 1024].into_boxed_slice())
    }

    pub fn contains(&self, cid: u16) -> bool {
        self.0[cid as usize / 64] & (1 << (cid % 64)) != 0
    }

    pub fn insert(&mut self, cid: u16) {
        self.0[cid as usize / 64] |= 1 << (cid % 64);
    }

    pub fn remove(&mut self, cid: u16) {
        self.0[cid as usize / 64] &= !(1 << (cid % 64));
    }

    /// A command id not in flight, from the top down (hosts hand out low ids first).
    pub fn unused(&self) -> u16 {
        (0..=u16::MAX)
            .rev()
            .find(|&c| !self.contains(c))
            .unwrap_or(u16::MAX)
    }
}

/// How a queue's shadow doorbell is read. It is trusted only after the host has rung the MMIO
/// doorbell once since the queue was created (or Doorbell Buffer Config came): EventIdx starts at
/// 0 then, so a host that follows the EventIdx rule rings MMIO on its first update, and a stale
/// value left from an earlier queue with the same id is never taken for a doorbell write.
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct ShadowState {
    pub armed: bool,
    /// The last value taken (MMIO or shadow).
    pub last: u32,
}

impl ShadowState {
    /// An MMIO doorbell write of `value`.
    pub fn rung(&mut self, value: u32) {
        self.armed = true;
        self.last = value;
    }

    /// Whether to take the shadow `value`: armed, and new.
    pub fn take(&mut self, value: u32) -> bool {
        if !self.armed || value == self.last {
            return false;
        }
        self.last = value;
        true
    }
}

/// A command fetched but not completed yet (threaded mode's latency, or a delay fault).
#[derive(Debug, Clone, Copy)]
pub(crate) struct Pending {
    pub sqe: Sqe,
    pub due: Instant,
    /// Fetch order, to complete in order when not asked otherwise.
    pub seq: u64,
    pub action: Option<FaultAction>,
}

/// A submission queue.
pub(crate) struct Sq {
    pub qid: u16,
    pub base: u64,
    pub size: u16,
    pub cq: Arc<Mutex<Cq>>,
    pub cqid: u16,
    /// Next entry to fetch.
    pub head: u16,
    /// The last tail the host rang (MMIO or shadow).
    pub tail: u16,
    pub deleted: bool,
    pub inflight: CidSet,
    pub pending: Vec<Pending>,
    pub seq: u64,
    pub shadow: ShadowState,
    /// Scratch space, reused: data segments, data, commands that became due.
    pub segs: Vec<(u64, u32)>,
    pub data: Vec<u8>,
    pub ready: Vec<Pending>,
    /// What the IOVA space maps, as this queue pair last saw it: its doorbells translate
    /// through it (taken out while they do), so that queues on many cores share nothing per
    /// command. None until its first doorbell.
    pub view: Option<MemoryView>,
}

impl Sq {
    pub fn new(qid: u16, base: u64, size: u16, cqid: u16, cq: Arc<Mutex<Cq>>) -> Sq {
        Sq {
            qid,
            base,
            size,
            cq,
            cqid,
            head: 0,
            tail: 0,
            deleted: false,
            inflight: CidSet::new(),
            pending: Vec::new(),
            seq: 0,
            shadow: ShadowState::default(),
            segs: Vec::new(),
            data: Vec::new(),
            ready: Vec::new(),
            view: None,
        }
    }

    /// Takes a new tail from a doorbell. It must lie in the ring and must not move back over
    /// entries the host already handed over; otherwise it is refused.
    pub fn set_tail(&mut self, value: u32) -> Result<(), String> {
        let size = self.size as u32;
        if value >= size {
            return Err(format!(
                "SQ {} tail {value} is outside the queue of {size} entries",
                self.qid
            ));
        }
        let handed = (self.tail as u32 + size - self.head as u32) % size;
        let now = (value + size - self.head as u32) % size;
        if now < handed {
            return Err(format!(
                "SQ {} tail moved back from {} to {value} (head {})",
                self.qid, self.tail, self.head
            ));
        }
        self.tail = value as u16;
        Ok(())
    }

    pub fn sqe_address(&self) -> GuestAddress {
        GuestAddress(self.base + self.head as u64 * SQE_BYTES)
    }
}

/// A completion queue.
pub(crate) struct Cq {
    pub qid: u16,
    pub base: u64,
    pub size: u16,
    pub head: u16,
    pub tail: u16,
    pub phase: bool,
    /// Completions that found the queue full: posted as the host frees entries.
    pub overflow: VecDeque<Cqe>,
    pub deleted: bool,
    pub shadow: ShadowState,
    /// The MSI-X vector's eventfd of a CQ created with interrupts enabled, and whether entries
    /// were posted since it was last signalled.
    pub irq: Option<Arc<EventFd>>,
    posted: bool,
}

/// Why a completion could not be written: the CQ is not mapped.
#[derive(Debug)]
pub(crate) struct CqFault(pub u64);

impl Cq {
    pub fn new(qid: u16, base: u64, size: u16) -> Cq {
        Cq {
            qid,
            base,
            size,
            head: 0,
            tail: 0,
            phase: true,
            overflow: VecDeque::new(),
            deleted: false,
            shadow: ShadowState::default(),
            irq: None,
            posted: false,
        }
    }

    pub fn full(&self) -> bool {
        (self.tail + 1) % self.size == self.head
    }

    /// Takes a new head from a doorbell: it must lie in the ring and not pass what was posted.
    pub fn set_head(&mut self, value: u32) -> Result<(), String> {
        let size = self.size as u32;
        let posted = (self.tail as u32 + size - self.head as u32) % size;
        let freed = (value + size - self.head as u32) % size;
        if value >= size || freed > posted {
            return Err(format!(
                "CQ {} head {value} is beyond what was posted (head {}, tail {}, {} entries)",
                self.qid, self.head, self.tail, size
            ));
        }
        self.head = value as u16;
        Ok(())
    }

    /// Posts `cqe` (its phase tag is set here), or queues it while the CQ is full.
    pub fn post(&mut self, mem: &super::IovaMemory, cqe: Cqe) -> Result<(), CqFault> {
        if !self.overflow.is_empty() || self.full() {
            self.overflow.push_back(cqe);
            return self.drain(mem);
        }
        let written = self.write(mem, cqe);
        self.interrupt();
        written
    }

    /// Posts queued completions while there is room.
    pub fn drain(&mut self, mem: &super::IovaMemory) -> Result<(), CqFault> {
        let mut written = Ok(());
        while !self.full() && written.is_ok() {
            let Some(cqe) = self.overflow.pop_front() else {
                break;
            };
            written = self.write(mem, cqe);
        }
        self.interrupt();
        written
    }

    /// Signals the CQ's vector if entries were posted since the last time: the MSI-X message.
    fn interrupt(&mut self) {
        if std::mem::take(&mut self.posted) {
            if let Some(fd) = &self.irq {
                // only fails when the counter would overflow: it is raised then
                let _ = fd.write(1);
            }
        }
    }

    /// The entry's first 14 bytes, then (Release) the status word with the phase tag, which is
    /// what makes it visible to a host polling that word.
    fn write(&mut self, mem: &super::IovaMemory, mut cqe: Cqe) -> Result<(), CqFault> {
        let addr = self.base + self.tail as u64 * CQE_BYTES;
        cqe.status = (cqe.status & !1) | self.phase as u16;
        if !super::dma::write(mem, addr, &cqe.as_bytes()[..14]) {
            return Err(CqFault(addr));
        }
        fence(Ordering::Release);
        if !super::dma::store_u16(mem, addr + 14, cqe.status) {
            return Err(CqFault(addr));
        }
        self.tail += 1;
        if self.tail == self.size {
            self.tail = 0;
            self.phase = !self.phase;
        }
        self.posted = true;
        Ok(())
    }
}

/// The command engine: fetch, fault, execute or hold, complete.
impl Inner {
    /// Fetches the commands from head to tail; each completes now or becomes pending.
    pub(super) fn run_sq(&self, ctx: &Ctx, sq: &mut Sq) {
        while sq.head != sq.tail && !self.halted(ctx.run) {
            let addr = sq.sqe_address();
            let sqe = match super::dma::read_obj::<Sqe>(ctx.mem, addr.0) {
                Some(sqe) => sqe,
                None => {
                    self.dma_fault(addr.0, "submission queue entry");
                    self.fatal("a command could not be fetched");
                    return;
                }
            };
            sq.head = (sq.head + 1) % sq.size;
            self.counters.commands.fetch_add(1, Ordering::Relaxed);
            self.accept(ctx, sq, sqe);
        }
    }

    fn accept(&self, ctx: &Ctx, sq: &mut Sq, sqe: Sqe) {
        let cid = sqe.cid();
        if sq.inflight.contains(cid) {
            // the command already in flight keeps its id: post without touching it
            let out = Outcome::fail(Status::CID_CONFLICT).at(2);
            self.log_error(sq.qid, cid, sqe.nsid, &out);
            self.post(ctx, sq, cid, &out, 1);
            return;
        }
        let action = self.faults.check(sq.qid, &sqe);
        let latency = match self.config.mode {
            SimMode::Threaded { latency, .. } if sq.qid != 0 => Some(latency),
            _ => None,
        };
        let pend = |sq: &mut Sq, after: Duration, action| {
            sq.inflight.insert(cid);
            sq.seq += 1;
            let seq = sq.seq;
            sq.pending.push(Pending {
                sqe,
                due: ctx.now + after,
                seq,
                action,
            });
        };
        match action {
            Some(FaultAction::Fail(status)) => {
                self.finish(ctx, sq, &sqe, Outcome::status(status), None)
            }
            Some(FaultAction::Drop) => {
                log::warn!(
                    "{}: fault: command {cid} on SQ {} dropped",
                    self.config.serial,
                    sq.qid
                );
                sq.inflight.insert(cid);
            }
            Some(FaultAction::Fatal) => self.fatal("injected fault"),
            Some(FaultAction::Remove) => {
                log::warn!("{}: fault: surprise removal", self.config.serial);
                self.removed.store(true, Ordering::Release);
            }
            Some(FaultAction::Delay(d)) => pend(sq, latency.unwrap_or_default() + d, None),
            // due in a year: `release` makes it due now
            Some(FaultAction::Hold) => pend(sq, HELD, Some(FaultAction::Hold)),
            Some(FaultAction::MisdirectWrite) => {
                let mut moved = sqe;
                let slba = (u64::from(sqe.cdw11) << 32 | u64::from(sqe.cdw10)) + 1;
                (moved.cdw10, moved.cdw11) = (slba as u32, (slba >> 32) as u32);
                log::warn!(
                    "{}: fault: write of command {cid} misdirected to LBA {slba}",
                    self.config.serial
                );
                let out = self.execute(ctx, sq, &moved, None);
                self.finish(ctx, sq, &sqe, out, None);
            }
            Some(FaultAction::RaiseEvent(event)) => {
                let out = self.execute(ctx, sq, &sqe, None);
                self.finish(ctx, sq, &sqe, out, None);
                self.raise_event_while_busy(ctx, event);
            }
            other => match latency {
                Some(l) => pend(sq, l, other),
                None => {
                    let out = self.execute(ctx, sq, &sqe, other);
                    self.finish(ctx, sq, &sqe, out, other);
                }
            },
        }
    }

    /// `action`: a fault that changes how the command moves data (I/O reads), if one hit it.
    fn execute(&self, ctx: &Ctx, sq: &mut Sq, sqe: &Sqe, action: Option<FaultAction>) -> Outcome {
        if sq.qid == 0 {
            admin::execute(ctx, sq, sqe)
        } else {
            io::execute(ctx, sq, sqe, action)
        }
    }

    /// Completes a command: Error Information entry if it failed, then its completion entry
    /// (twice, or under a wrong command id, if a fault says so).
    pub(super) fn finish(
        &self,
        ctx: &Ctx,
        sq: &mut Sq,
        sqe: &Sqe,
        out: Outcome,
        action: Option<FaultAction>,
    ) {
        let cid = sqe.cid();
        if out.hold {
            sq.inflight.insert(cid);
            return;
        }
        sq.inflight.remove(cid);
        if !out.status.is_success() {
            self.log_error(sq.qid, cid, sqe.nsid, &out);
        }
        match action {
            Some(FaultAction::UnknownCid) => {
                let wrong = sq.inflight.unused();
                log::warn!(
                    "{}: fault: command {cid} on SQ {} completes as command {wrong}",
                    self.config.serial,
                    sq.qid
                );
                self.post(ctx, sq, wrong, &out, 1);
            }
            Some(FaultAction::Duplicate) => self.post(ctx, sq, cid, &out, 2),
            _ => self.post(ctx, sq, cid, &out, 1),
        }
    }

    pub(super) fn post(&self, ctx: &Ctx, sq: &Sq, cid: u16, out: &Outcome, times: u32) {
        let cqe = crate::spec::Cqe::new(out.dw0, sq.head, sq.qid, cid, out.status, false);
        let mut cq = sq.cq.lock();
        if cq.deleted {
            return;
        }
        for _ in 0..times {
            if cq.qid != 0 && (!cq.overflow.is_empty() || cq.full()) {
                ctx.refresh_cq(&mut cq);
            }
            if let Err(e) = cq.post(ctx.mem, cqe) {
                self.cq_fault(e.0);
                return;
            }
            self.counters.completions.fetch_add(1, Ordering::Relaxed);
        }
        if cq.qid != 0 && !cq.overflow.is_empty() {
            // waiting for room: ask the host to ring the CQ head doorbell as it consumes
            ctx.write_event_idx(cq.qid, true, cq.head);
        }
    }

    /// Completes the pending commands that are due (in order, or shuffled when out of order).
    pub(super) fn run_due(&self, ctx: &Ctx, sq: &mut Sq) -> usize {
        if sq.pending.is_empty() {
            return 0;
        }
        let mut ready = std::mem::take(&mut sq.ready);
        let mut i = 0;
        while i < sq.pending.len() {
            if sq.pending[i].due <= ctx.now {
                ready.push(sq.pending.swap_remove(i));
            } else {
                i += 1;
            }
        }
        match self.config.mode {
            SimMode::Threaded {
                out_of_order: true, ..
            } => shuffle(&mut ready),
            _ => ready.sort_unstable_by_key(|p| p.seq),
        }
        let n = ready.len();
        for p in ready.drain(..) {
            if self.halted(ctx.run) {
                break;
            }
            sq.inflight.remove(p.sqe.cid());
            let out = self.execute(ctx, sq, &p.sqe, p.action);
            self.finish(ctx, sq, &p.sqe, out, p.action);
        }
        sq.ready = ready;
        n
    }

    /// Threaded mode's controller thread: polls doorbells (MMIO and shadow), completes commands
    /// when due, sleeps when idle (a doorbell write wakes it).
    pub(super) fn worker(self: Arc<Self>, run: &Arc<Running>) {
        let mut sqs: Vec<Arc<Mutex<Sq>>> = Vec::new();
        let mut view = self.space.view();
        while !run.stop.load(Ordering::Acquire) {
            if self.halted(run) {
                std::thread::park_timeout(Duration::from_millis(1));
                continue;
            }
            let shadow = {
                let t = run.table.read();
                sqs.clear();
                sqs.extend(t.sqs.iter().skip(1).flatten().cloned());
                t.shadow
            };
            let mem = self.space.refresh(&mut view);
            let ctx = self.ctx(run, mem, shadow);
            let mut busy = false;
            let mut next: Option<Instant> = None;
            for sq in &sqs {
                let mut sq = sq.lock();
                if sq.deleted {
                    continue;
                }
                if let Some(v) = ctx.read_shadow(sq.qid, false) {
                    if sq.shadow.take(v) {
                        if let Err(e) = sq.set_tail(v) {
                            self.invalid_doorbell(&format!("shadow doorbell: {e}"));
                        }
                    }
                }
                if sq.head != sq.tail {
                    busy = true;
                    self.run_sq(&ctx, &mut sq);
                    ctx.write_event_idx(sq.qid, false, sq.tail);
                }
                busy |= self.run_due(&ctx, &mut sq) > 0;
                if let Some(due) = sq.pending.iter().map(|p| p.due).min() {
                    next = Some(next.map_or(due, |n| n.min(due)));
                }
                let cq = sq.cq.clone();
                drop(sq);
                let mut cq = cq.lock();
                if !cq.overflow.is_empty() {
                    ctx.refresh_cq(&mut cq);
                }
            }
            if !busy {
                let now = Instant::now();
                let wait = next
                    .map_or(Duration::from_millis(1), |n| {
                        n.saturating_duration_since(now)
                    })
                    .min(Duration::from_millis(1));
                if !wait.is_zero() {
                    std::thread::park_timeout(wait);
                }
            }
        }
    }
}

/// Out-of-order completions: a shuffle from one seeded generator, so runs repeat.
fn shuffle<T>(items: &mut [T]) {
    static SEED: AtomicU64 = AtomicU64::new(0x9e37_79b9_7f4a_7c15);
    let mut rng = fastrand::Rng::with_seed(SEED.load(Ordering::Relaxed));
    rng.shuffle(items);
    SEED.store(rng.get_seed(), Ordering::Relaxed);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cid_set_and_doorbell_rules() {
        let mut set = CidSet::new();
        set.insert(3);
        set.insert(u16::MAX);
        assert!(set.contains(3) && !set.contains(4));
        assert_eq!(set.unused(), u16::MAX - 1);
        set.remove(3);
        assert!(!set.contains(3));

        let cq = Arc::new(Mutex::new(Cq::new(1, 0, 8)));
        let mut sq = Sq::new(1, 0, 8, 1, cq.clone());
        assert!(sq.set_tail(8).is_err());
        sq.set_tail(5).expect("forward");
        sq.head = 3;
        assert!(sq.set_tail(4).is_err(), "back over handed entries");
        sq.set_tail(2).expect("forward, wrapping");

        let mut cq = cq.lock();
        cq.tail = 3;
        cq.set_head(2).expect("within posted");
        assert!(cq.set_head(4).is_err());
        assert!(
            cq.set_head(1).is_err(),
            "behind the head is beyond the tail"
        );
        cq.set_head(3).expect("all consumed");
    }
}
