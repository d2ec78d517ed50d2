//! Where a remote (NVMe/TCP) controller's I/O queues come from: its address, the association
//! its admin queue made (subsystem, the controller's [`ControllerLink`]), its limits, and the
//! I/O queue IDs it granted, one per reactor; and a reactor's queue to it ([`RemoteQueue`]),
//! which outlives its connections: when one ends, it keeps the I/Os the target had not
//! finished, connects again once the controller thread made a new association, and sends
//! them again (none is lost, none doubled: only I/Os the target never completed go again).

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use parking_lot::Mutex;
use usnvme_driver::spec::Status;
use usnvme_driver::{Completion, IoBuffer, SubmitError};

use super::link::{ControllerLink, LinkState};
use crate::block::{ChannelOptions, DmaTarget, Op};
use crate::fabric::initiator::queue::Buffers;
use crate::fabric::initiator::session::MAX_ENTRIES;
use crate::fabric::initiator::{self, Failure, HostOptions, IoNamespace, Unfinished};
use crate::fabric::initiator::{IoQueue, QueueParams};
use crate::transport::QueueNamespace;

/// What the owner learned from a remote controller (its admin queue), shared by the devices
/// of its namespaces: enough to connect I/O queues to it.
#[derive(Debug, Clone)]
pub struct RemoteQueues {
    /// The controller's name in messages (e.g. `tcp://127.0.0.1:4420/nqn…`).
    pub name: String,
    pub addr: SocketAddr,
    pub subnqn: String,
    pub host: HostOptions,
    /// In-capsule data of an I/O command (IOCCSZ * 16 - 64).
    pub in_capsule: u32,
    /// The largest transfer (MDTS).
    pub max_transfer: u32,
    /// Entries an I/O queue may have (CAP.MQES + 1).
    pub max_entries: u16,
    /// The I/O queue IDs it granted: one per reactor.
    pub qids: Arc<QueueIds>,
    /// How many of its namespaces the run uses: a reactor's queue holds commands for each.
    pub namespaces: u16,
    /// The association: the controller ID, reconnects, whether it is lost for good.
    pub link: Arc<ControllerLink>,
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

/// A reactor's NVMe/TCP I/O queue to a remote controller, across reconnects; gives its queue
/// ID back when it goes.
#[derive(Debug)]
pub struct RemoteQueue {
    queue: IoQueue,
    /// The association `queue` belongs to ([`ControllerLink::generation`]).
    generation: u64,
    /// `queue` ended: its unfinished I/Os are in `held` until the next association.
    disconnected: bool,
    /// I/Os taken from a connection that ended, sent again on the next (its entries at most).
    held: Vec<Unfinished>,
    /// How to connect it again (the controller ID is the new association's).
    params: QueueParams,
    now_ns: u64,
    reconnects: u32,
    /// Why the controller was given up, once it was (no more I/O).
    lost: Option<String>,
    source: Arc<RemoteQueues>,
}

impl Drop for RemoteQueue {
    fn drop(&mut self) {
        self.source.qids.give(self.params.qid);
    }
}

impl RemoteQueue {
    /// Queues an I/O to namespace `ns` (see [`IoQueue::submit_to`]); while reconnecting the
    /// queue is full.
    #[inline]
    pub fn submit(
        &mut self,
        ns: IoNamespace,
        op: Op,
        lba: u64,
        blocks: u32,
        buf: Option<IoBuffer>,
        token: u64,
    ) -> Result<(), SubmitError> {
        if self.disconnected && self.lost.is_none() {
            return Err(SubmitError::QueueFull {
                in_flight: self.in_flight().min(usize::from(u16::MAX)) as u16,
            });
        }
        self.queue.submit_to(ns, op, lba, blocks, buf, token)
    }

    /// Sends what was queued and hands completions to `on_done`; a connection that ended, or
    /// an association that changed, goes to [`RemoteQueue::recover`].
    #[inline]
    pub fn poll(&mut self, mut on_done: impl FnMut(Completion)) -> usize {
        if !self.disconnected && self.source.link.generation() == self.generation {
            let done = self.queue.poll(|c| on_done(completion(c, false)));
            if self.queue.ended().is_none() {
                return done;
            }
            return done + self.recover(on_done);
        }
        self.recover(on_done)
    }

    /// The connection ended or the association changed: keeps the unfinished I/Os, reports
    /// the association down, and once there is a new one connects to it and sends them again;
    /// once the controller is given up, fails them.
    #[cold]
    #[inline(never)]
    fn recover(&mut self, mut on_done: impl FnMut(Completion)) -> usize {
        let mut done = 0;
        if !self.disconnected {
            if self.queue.ended().is_none() {
                // a new association (or none): this connection's controller is gone
                self.queue.close(|c| {
                    done += 1;
                    on_done(completion(c, false))
                });
            }
            let why = self
                .queue
                .ended()
                .map_or_else(|| "closed".to_owned(), |f| f.to_string());
            let held = &mut self.held;
            self.queue.take_unfinished(|u| held.push(u));
            self.disconnected = true;
            log::debug!(
                "{}: I/O queue {}: {why}: {} I/O(s) kept to send again",
                self.source.name,
                self.params.qid,
                self.held.len()
            );
            self.source.link.report_down(self.generation, &why);
        }
        let generation = self.source.link.generation();
        if generation == self.generation || self.lost.is_some() {
            return done; // still waiting for the next association, or given up
        }
        match self.source.link.state() {
            LinkState::Lost { why } => done + self.fail_held(why, on_done),
            LinkState::Live { cntlid } => {
                self.reconnect(generation, cntlid);
                done
            }
            // the association went down again before this queue saw it live
            LinkState::Down { .. } => done,
        }
    }

    /// Connects to controller `cntlid` of association `generation` and sends the held I/Os.
    fn reconnect(&mut self, generation: u64, cntlid: u16) {
        let params = QueueParams {
            cntlid,
            ..self.params.clone()
        };
        let buffers = Buffers::Space(self.source.dma.space.clone());
        self.generation = generation;
        let mut queue = match IoQueue::connect(self.source.addr, params, &self.source.host, buffers)
        {
            Ok(q) => q,
            Err(e) => {
                let why = format!("I/O queue {}: {e}", self.params.qid);
                self.source.link.report_down(generation, &why);
                return;
            }
        };
        queue.keep_unfinished(true);
        queue.set_now(self.now_ns);
        for u in self.held.drain(..) {
            if let Err(e) = queue.resubmit(u) {
                // the queue has the entries the old one had: this does not happen
                log::error!("{}: could not send an I/O again: {e}", self.source.name);
            }
        }
        self.queue = queue;
        self.disconnected = false;
        self.reconnects += 1;
        log::info!(
            "{}: I/O queue {} reconnected (controller {cntlid})",
            self.source.name,
            self.params.qid
        );
    }

    /// The controller was given up: every held I/O fails as from a removed device.
    fn fail_held(&mut self, why: String, mut on_done: impl FnMut(Completion)) -> usize {
        let n = self.held.len();
        for u in self.held.drain(..) {
            on_done(Completion {
                token: u.token,
                status: Status::HOST_PATHING_ERROR,
                dw0: 0,
                submitted_ns: u.since_ns,
                bytes: u.buf.map_or(0, |b| b.len),
            });
        }
        self.lost = Some(why);
        n
    }

    #[inline]
    pub fn flush(&mut self) {
        self.queue.flush();
    }

    #[inline]
    pub fn set_now(&mut self, now_ns: u64) {
        self.now_ns = now_ns;
        self.queue.set_now(now_ns);
    }

    /// Commands in flight, those held for the next connection too.
    #[inline]
    pub fn in_flight(&self) -> usize {
        self.queue.in_flight() + self.held.len()
    }

    #[inline]
    pub fn free(&self) -> usize {
        if self.disconnected {
            0
        } else {
            self.queue.free()
        }
    }

    /// The device is gone: every command in flight and held fails, and the queue takes no more.
    pub fn abandon(&mut self, mut on_done: impl FnMut(Completion)) -> usize {
        self.queue.keep_unfinished(false);
        let n = self.queue.close(|c| on_done(completion(c, true)));
        n + self.fail_held("abandoned".into(), on_done)
    }

    /// Why the queue takes no more I/O, once it does not: the controller was given up.
    pub fn ended(&self) -> Option<String> {
        self.lost.clone()
    }

    /// How many times this queue connected again.
    pub fn reconnects(&self) -> u32 {
        self.reconnects
    }
}

/// An NVMe/TCP completion in the driver's terms: a queue that ended fails its commands as
/// from a removed device; a timed-out one as aborted on request; the target's status as is.
#[inline]
fn completion(c: initiator::Completion, removed: bool) -> Completion {
    let status = match c.result {
        Ok(()) => Status::SUCCESS,
        Err(_) if removed => Status::HOST_PATHING_ERROR,
        Err(Failure::Status(status)) => status,
        Err(Failure::TimedOut) => Status::ABORT_REQUESTED,
        Err(Failure::Aborted) => Status::ABORTED_BY_HOST,
        Err(Failure::Closed | Failure::Protocol(_) | Failure::Terminated { .. }) => {
            Status::HOST_PATHING_ERROR
        }
        Err(Failure::DataDigest) => Status::DATA_TRANSFER_ERROR,
    };
    Completion {
        token: c.token,
        status,
        dw0: 0,
        submitted_ns: c.submitted_ns,
        bytes: c.bytes,
    }
}

impl RemoteQueues {
    /// Entries for a reactor's queue: `options`' depth for each namespace the run uses, within
    /// what the controller and the initiator allow.
    pub fn queue_entries(&self, options: &ChannelOptions) -> u16 {
        let most = self.max_entries.clamp(2, MAX_ENTRIES);
        let per_namespace = options.queue_entries(u64::from(self.max_transfer), most - 1);
        (u32::from(per_namespace) * u32::from(self.namespaces.max(1))).clamp(2, u32::from(most))
            as u16
    }

    /// Connects an I/O queue of `entries` entries on the lowest queue ID free; `ns` is the
    /// namespace its Connect names (any of those it carries).
    pub fn connect(
        self: &Arc<Self>,
        ns: QueueNamespace,
        entries: u16,
        options: &ChannelOptions,
    ) -> Result<RemoteQueue, usnvme_driver::Error> {
        let invalid = |what: String| usnvme_driver::Error::Invalid {
            device: self.name.clone(),
            what,
        };
        let Some(qid) = self.qids.take() else {
            return Err(invalid(format!(
                "the controller grants {} I/O queues: one per reactor; use fewer cores (-c)",
                self.qids.granted
            )));
        };
        let timeout = options.timeout.unwrap_or(Duration::from_secs(30));
        let block_size = u64::from(ns.block_size.max(1));
        let generation = self.link.generation();
        let LinkState::Live { cntlid } = self.link.state() else {
            self.qids.give(qid);
            return Err(invalid("the controller is not connected".into()));
        };
        let params = QueueParams {
            subnqn: self.subnqn.clone(),
            qid,
            cntlid,
            entries,
            nsid: ns.nsid,
            block_size: ns.block_size,
            in_capsule: self.in_capsule,
            max_transfer: (u64::from(self.max_transfer) / block_size * block_size).max(block_size)
                as u32,
            timeout_ns: timeout.as_nanos().min(u128::from(u64::MAX)) as u64,
        };
        let buffers = Buffers::Space(self.dma.space.clone());
        match IoQueue::connect(self.addr, params.clone(), &self.host, buffers) {
            Ok(mut queue) => {
                queue.keep_unfinished(true);
                Ok(RemoteQueue {
                    queue,
                    generation,
                    disconnected: false,
                    held: Vec::with_capacity(usize::from(entries)),
                    params,
                    now_ns: 0,
                    reconnects: 0,
                    lost: None,
                    source: self.clone(),
                })
            }
            Err(e) => {
                self.qids.give(qid);
                Err(invalid(format!("I/O queue {qid}: {e}")))
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

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
}
