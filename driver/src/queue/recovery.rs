//! When commands do not complete: abort what timed out, reset the controller when an abort does
//! not help or the controller reports a fatal status, re-create the queues after a reset, and
//! fail everything when the device is gone. Detection runs on the owning thread, from `poll`,
//! off the fast path; the reset itself runs on a thread of its own (`Controller::start_reset`),
//! so a reactor never waits for one: its queue pairs on that controller wait, the rest go on.

use super::{Completion, QueuePair, CQE_BYTES};
use crate::spec::Status;

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
                    nsid: t.nsid,
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
            self.cq_phase,
        ) = (0, 0, 0, 0, true);
    }

    /// After a controller reset: the commands in flight were lost with the old queues; they come
    /// back as "Command Aborted By Host", and the queues are created again. While the reset is
    /// still under way (an odd generation) nothing happens: the queue pair waits, ringing
    /// nothing, and its owner's other queue pairs go on. After a failed reset everything held
    /// fails with "Host Pathing Error" and the queue pair is unusable.
    pub(super) fn reconnect(&mut self, on_completion: &mut dyn FnMut(Completion)) {
        let Some(owner) = self.owner.clone() else {
            return;
        };
        let generation = owner.generation();
        if generation % 2 == 1 {
            return;
        }
        self.generation = generation;
        if owner.failed() {
            log::error!(
                "{}: the reset failed: queue {} fails {} command(s) and takes no more",
                owner.name(),
                self.qid,
                self.in_flight
            );
            self.fail_all(Status::HOST_PATHING_ERROR, on_completion);
            self.unusable = true;
            return;
        }
        self.fail_all(Status::ABORTED_BY_HOST, on_completion);
        self.reset_rings();
        if self.unusable {
            return;
        }
        let (sq, cq) = (self.sq_iova(), self.cq_iova());
        match owner.create_queues(self.qid, self.depth, sq, cq) {
            Ok(()) => log::info!(
                "{}: queue {} re-created after a reset",
                owner.name(),
                self.qid
            ),
            Err(e) => {
                log::error!(
                    "{}: queue {} cannot be re-created after a reset: {e}",
                    owner.name(),
                    self.qid
                );
                self.unusable = true;
            }
        }
    }

    /// Aborts commands older than the timeout; resets the controller when a command is still
    /// there after its abort, or CSTS.CFS is set; fails everything when the device is gone.
    /// Runs every few dozen polls, on the owner's clock (or one read of its own); scans the
    /// trackers a few times per timeout.
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
        if self.in_flight == 0 || now < self.next_scan_ns {
            return;
        }
        self.next_scan_ns = now + (timeout / 4).clamp(1_000_000, 100_000_000);
        let overdue = |t: &super::Tracker| t.busy && now.saturating_sub(t.started_ns) > timeout;
        if !self.trackers.iter().any(overdue) {
            return;
        }
        let Some(owner) = self.owner.clone() else {
            return;
        };
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
            return;
        }
        let mut reset = csts.cfs();
        for cid in 0..self.trackers.len() {
            if reset {
                break;
            }
            let t = self.trackers[cid];
            if !overdue(&t) {
                continue;
            }
            if t.abort_sent {
                reset = true;
                break;
            }
            log::warn!(
                "{}: command {cid} on queue {} did not complete within {} ms: aborting it",
                owner.name(),
                self.qid,
                timeout / 1_000_000
            );
            self.trackers[cid].abort_sent = true;
            self.trackers[cid].started_ns = now;
            if let Err(e) = owner.abort(self.qid, cid as u16) {
                log::warn!(
                    "{}: abort failed ({e}): resetting the controller",
                    owner.name()
                );
                reset = true;
            }
        }
        if reset {
            // On a thread of its own: this reactor's other devices keep being served; this
            // queue pair waits (see `reconnect`).
            owner.start_reset();
        }
    }
}
