//! When commands do not complete: abort what timed out, reset the controller when an abort does
//! not help or the controller reports a fatal status, re-create the queues after a reset, and
//! fail everything when the device is gone. Detection runs on the owning thread, from `poll`,
//! off the fast path. Nothing here waits: the reset runs on a thread of its own
//! (`Controller::start_reset`), and the admin commands (Create I/O CQ and SQ, Abort) are
//! submitted and their outcomes picked up on later polls, so a reactor that polls many devices
//! keeps serving the others while one recovers.

use super::{Completion, QueueOwner, QueuePair, Release, Ticket, CQE_BYTES};
use crate::error::Error;
use crate::spec::command::QueuePriority;
use crate::spec::{Sqe, Status};

/// Aborts in flight per queue pair at most (the spec recommends controllers take 4 at once);
/// more overdue commands wait for a later scan.
const MAX_ABORTS: usize = 4;

/// Re-creating the queues after the reset that brought the controller to `generation`.
#[derive(Debug, Clone, Copy)]
pub(super) struct Recreate {
    generation: u64,
    step: Step,
    /// The queues are created for the first time (`Controller::open_queue_pair`).
    first: bool,
}

impl Recreate {
    /// Creating the queues of a queue pair opened in `generation` for the first time.
    pub(super) fn first(generation: u64) -> Recreate {
        Recreate {
            generation,
            step: Step::CreateCq,
            first: true,
        }
    }
}

#[derive(Debug, Clone, Copy)]
enum Step {
    CreateCq,
    CqSent(Ticket),
    CreateSq,
    SqSent(Ticket),
    /// It failed; `cq`: the CQ may exist.
    Failed {
        cq: bool,
    },
}

impl Step {
    fn ticket(self) -> Option<Ticket> {
        match self {
            Step::CqSent(t) | Step::SqSent(t) => Some(t),
            _ => None,
        }
    }
}

impl QueuePair {
    /// Hands every command in flight back to the caller with `status`, freeing its tracker.
    pub(crate) fn fail_all(&mut self, status: Status, on_completion: &mut dyn FnMut(Completion)) {
        for cid in 0..self.trackers.len() {
            let t = self.trackers[cid];
            if t.busy {
                self.trackers[cid].busy = false;
                self.free_cids.push(cid as u16);
                self.in_flight -= 1;
                on_completion(Completion {
                    token: t.token,
                    status,
                    dw0: 0,
                    submitted_ns: t.started_ns,
                    bytes: t.bytes,
                });
            }
        }
    }

    /// Empty rings, as after creation: the CQ zeroed (phase tags 0), indices back to 0.
    pub(crate) fn reset_rings(&mut self) {
        let zeroes = vec![0u8; self.depth as usize * CQE_BYTES];
        let zeroed = self
            .memory
            .slice(self.layout.cq, zeroes.len())
            .is_ok_and(|cq| vm_memory::Bytes::write_slice(&cq, &zeroes, 0).is_ok());
        if !zeroed {
            self.unusable = true;
        }
        (self.sq_written, self.sq_fetched) = (0, 0);
        (
            self.sq_tail,
            self.sq_head,
            self.sq_tail_rung,
            self.cq_head,
            self.cq_head_rung,
            self.cq_phase,
        ) = (0, 0, 0, 0, 0, true);
    }

    /// After a controller reset: the commands in flight were lost with the old queues; they come
    /// back as "Command Aborted By Host", and the queues are created again, one admin command
    /// per step, each picked up on a later call (from `poll`). While the reset is under way (an
    /// odd generation) nothing happens: the queue pair waits, ringing nothing, and its owner's
    /// other queue pairs go on. After a failed reset everything held fails with "Host Pathing
    /// Error" and the queue pair is unusable.
    pub(super) fn reconnect(&mut self, on_completion: &mut dyn FnMut(Completion)) {
        let Some(owner) = self.owner.clone() else {
            return;
        };
        let generation = owner.generation();
        if generation % 2 == 1 {
            return;
        }
        if self.recreate.is_none_or(|r| r.generation != generation) {
            self.restart(&*owner, generation, on_completion);
        }
        self.advance_recreate(&*owner);
    }

    /// Whether its queues are being re-created after the reset that ended last (each poll moves
    /// that on), not waiting for a reset or given up.
    pub(super) fn recreating(&self) -> bool {
        let Some(owner) = &self.owner else {
            return false;
        };
        self.recreate.is_some_and(|r| {
            r.generation == owner.generation() && !matches!(r.step, Step::Failed { .. })
        })
    }

    /// A reset ended since the last call: start over from its generation.
    fn restart(
        &mut self,
        owner: &dyn QueueOwner,
        generation: u64,
        on_completion: &mut dyn FnMut(Completion),
    ) {
        // What was under way belonged to queues the reset deleted.
        if let Some(t) = self.recreate.take().and_then(|r| r.step.ticket()) {
            owner.forget_admin(t);
        }
        self.forget_aborts(owner);
        if owner.failed() {
            log::error!(
                "{}: the reset failed: queue {} fails {} command(s) and takes no more",
                owner.name(),
                self.qid,
                self.in_flight
            );
            self.generation = generation;
            self.fail_all(Status::HOST_PATHING_ERROR, on_completion);
            self.unusable = true;
            return;
        }
        self.fail_all(Status::ABORTED_BY_HOST, on_completion);
        self.reset_rings();
        if self.unusable {
            self.generation = generation;
            return;
        }
        self.recreate = Some(Recreate {
            generation,
            step: Step::CreateCq,
            first: false,
        });
    }

    /// Moves the re-creation on as far as it goes without waiting. When the SQ is created, the
    /// queue pair takes the new generation and is usable again.
    fn advance_recreate(&mut self, owner: &dyn QueueOwner) {
        let Some(mut r) = self.recreate else {
            return;
        };
        let (qid, entries) = (self.qid, self.depth as u32);
        loop {
            r.step = match r.step {
                Step::CreateCq => {
                    // with the vector it had: MSI-X stays enabled through a controller reset
                    let vector = self.interrupt_vector();
                    let sqe = Sqe::create_io_cq_with(qid, entries, self.cq_iova(), vector);
                    match owner.submit_admin(sqe, r.generation) {
                        Ok(Some(t)) => Step::CqSent(t),
                        Ok(None) => break, // the admin queue is busy: the next poll tries again
                        Err(e) => self.recreate_failed(owner, "CQ", e, false),
                    }
                }
                Step::CqSent(t) => match owner.admin_result(t) {
                    None => break,
                    Some(Ok(_)) => Step::CreateSq,
                    Some(Err(e)) => self.recreate_failed(owner, "CQ", e, false),
                },
                Step::CreateSq => {
                    let sqe =
                        Sqe::create_io_sq(qid, entries, self.sq_iova(), qid, QueuePriority::Urgent);
                    match owner.submit_admin(sqe, r.generation) {
                        Ok(Some(t)) => Step::SqSent(t),
                        Ok(None) => break,
                        Err(e) => self.recreate_failed(owner, "SQ", e, true),
                    }
                }
                Step::SqSent(t) => match owner.admin_result(t) {
                    None => break,
                    Some(Ok(_)) => {
                        if !r.first {
                            log::info!("{}: queue {qid} re-created after a reset", owner.name());
                        }
                        self.generation = r.generation;
                        self.recreate = None;
                        return;
                    }
                    Some(Err(e)) => self.recreate_failed(owner, "SQ", e, true),
                },
                Step::Failed { .. } => break,
            };
        }
        self.recreate = Some(r);
    }

    /// A creation command failed: a controller that let it time out is reset (the queue pair
    /// tries again after it); one that refused it leaves the queue pair unusable.
    fn recreate_failed(&mut self, owner: &dyn QueueOwner, what: &str, e: Error, cq: bool) -> Step {
        let when = match self.recreate.is_some_and(|r| r.first) {
            true => "created",
            false => "re-created after a reset",
        };
        log::error!(
            "{}: queue {} cannot be {when} ({what}): {e}",
            owner.name(),
            self.qid
        );
        if matches!(e, Error::Timeout { .. }) {
            owner.start_reset();
            return Step::Failed { cq: true };
        }
        self.unusable = true;
        Step::Failed { cq }
    }

    fn forget_aborts(&mut self, owner: &dyn QueueOwner) {
        for (_, t) in self.aborts.drain(..) {
            owner.forget_admin(t);
        }
    }

    /// What the controller is to delete when this queue pair goes: its queues if they exist in
    /// the controller's current generation, after the creation command that may be out.
    pub(super) fn release(&mut self, owner: &dyn QueueOwner) -> Release {
        self.forget_aborts(owner);
        let current = owner.generation();
        let both = Release {
            delete_sq: true,
            delete_cq: true,
            after: None,
        };
        match self.recreate {
            Some(r) if r.generation == current => match r.step {
                Step::CreateCq => Release::default(),
                Step::CqSent(t) => Release {
                    delete_cq: true,
                    after: Some(t),
                    ..Release::default()
                },
                Step::CreateSq => Release {
                    delete_cq: true,
                    ..Release::default()
                },
                Step::SqSent(t) => Release {
                    after: Some(t),
                    ..both
                },
                Step::Failed { cq } => Release {
                    delete_cq: cq,
                    ..Release::default()
                },
            },
            // a reset since: the queues are gone
            Some(r) => Release {
                after: r.step.ticket(),
                ..Release::default()
            },
            None if current == self.generation && !self.unusable => both,
            None => Release::default(),
        }
    }

    /// Aborts commands older than the timeout; resets the controller when a command is still
    /// there after its abort completed, an abort fails, or CSTS.CFS is set; fails everything
    /// when the device is gone. Runs every few dozen polls, on the owner's clock (or one read of
    /// its own); scans the trackers a few times per timeout. Aborts are submitted here and
    /// their outcomes picked up on later runs: nothing waits.
    pub(super) fn check_timeouts(&mut self, on_completion: &mut dyn FnMut(Completion)) {
        if !self.owner_clock {
            self.now_ns = self.clock.elapsed().as_nanos().min(u64::MAX as u128 / 2) as u64;
        }
        let now = self.now_ns;
        let timeout = self.timeout_ns;
        // After a long gap without polls the stamps say nothing about the device: start the
        // clocks of the commands in flight now.
        if now.saturating_sub(self.checked_ns) > timeout / 2 {
            let busy = self.trackers.iter_mut().filter(|t| t.busy);
            busy.for_each(|t| t.started_ns = now);
        }
        self.checked_ns = now;
        if self.aborts.is_empty() && (self.in_flight == 0 || now < self.next_scan_ns) {
            return;
        }
        let Some(owner) = self.owner.clone() else {
            return;
        };
        let reset = (!self.aborts.is_empty() && self.reap_aborts(&*owner, now))
            || self.scan(&*owner, now, on_completion);
        if reset {
            // On a thread of its own: this reactor's other devices keep being served; this
            // queue pair waits (see `reconnect`).
            owner.start_reset();
        }
    }

    /// Looks for overdue commands and sends their aborts; returns whether to reset.
    fn scan(
        &mut self,
        owner: &dyn QueueOwner,
        now: u64,
        on_completion: &mut dyn FnMut(Completion),
    ) -> bool {
        let timeout = self.timeout_ns;
        if self.in_flight == 0 || now < self.next_scan_ns {
            return false;
        }
        self.next_scan_ns = now + (timeout / 4).clamp(1_000_000, 100_000_000);
        let overdue = |t: &super::Tracker| t.busy && now.saturating_sub(t.started_ns) > timeout;
        if !self.trackers.iter().any(overdue) {
            return false;
        }
        let csts = owner.status();
        if csts.removed() {
            log::error!(
                "{}: the device is gone: failing {} command(s) on queue {}",
                owner.name(),
                self.in_flight,
                self.qid
            );
            self.fail_all(Status::HOST_PATHING_ERROR, on_completion);
            self.unusable = true;
            return false;
        }
        if csts.cfs() {
            return true;
        }
        for cid in 0..self.trackers.len() as u16 {
            let t = self.trackers[cid as usize];
            if !overdue(&t) {
                continue;
            }
            if t.abort_sent {
                // Still there after its abort completed: reset. While the abort is out, the
                // abort's own timeout (the admin timeout) covers it.
                if self.aborts.iter().any(|&(c, _)| c == cid) {
                    continue;
                }
                return true;
            }
            if self.aborts.len() >= MAX_ABORTS {
                break;
            }
            match owner.submit_admin(Sqe::abort(self.qid, cid), self.generation) {
                Ok(Some(ticket)) => {
                    log::warn!(
                        "{}: command {cid} on queue {} did not complete within {} ms: aborting it",
                        owner.name(),
                        self.qid,
                        timeout / 1_000_000
                    );
                    self.trackers[cid as usize].abort_sent = true;
                    self.trackers[cid as usize].started_ns = now;
                    self.aborts.push((cid, ticket));
                }
                // the admin queue is busy (or a reset began): the next scan tries again
                Ok(None) => break,
                Err(e) => {
                    log::warn!(
                        "{}: abort failed ({e}): resetting the controller",
                        owner.name()
                    );
                    return true;
                }
            }
        }
        false
    }

    /// Picks up the outcomes of the aborts sent; returns whether one failed (then reset).
    fn reap_aborts(&mut self, owner: &dyn QueueOwner, now: u64) -> bool {
        if self.lost_queues_of(owner) {
            // a reset voided them; `reconnect` starts over
            self.forget_aborts(owner);
            return false;
        }
        let mut failed = false;
        let mut i = 0;
        while i < self.aborts.len() {
            let (cid, ticket) = self.aborts[i];
            let Some(result) = owner.admin_result(ticket) else {
                i += 1;
                continue;
            };
            self.aborts.swap_remove(i);
            match result {
                Ok(dw0) => {
                    log::debug!(
                        "{}: abort of command {cid} on queue {}: {}",
                        owner.name(),
                        self.qid,
                        if dw0 & 1 == 0 { "aborted" } else { "not found" }
                    );
                    // it has another timeout to come back, aborted or not
                    let t = &mut self.trackers[cid as usize];
                    if t.busy && t.abort_sent {
                        t.started_ns = now;
                    }
                }
                Err(e) if !self.lost_queues_of(owner) => {
                    log::warn!(
                        "{}: abort of command {cid} on queue {} failed ({e}): resetting the controller",
                        owner.name(),
                        self.qid
                    );
                    failed = true;
                }
                Err(_) => {}
            }
        }
        failed
    }
}
