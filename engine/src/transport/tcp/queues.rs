//! Where a remote (NVMe/TCP) subsystem's I/O queues come from: its controllers, one per path
//! (address), each with its association ([`ControllerLink`]: controller ID, reconnects, ANA
//! state) and the I/O queue IDs it granted, one per reactor; and a reactor's queue to it
//! ([`RemoteQueue`]), one connection per path, which outlives its connections.
//!
//! When a connection ends, its path keeps the I/Os the target had not finished; another path
//! takes them at once, or the same one once the controller thread made a new association
//! (none is lost, none doubled: only I/Os the target never completed go again). I/O goes to
//! every optimized path in turn (non-optimized ones when none is); an I/O the target refuses
//! for a path-related reason (ANA inaccessible, ...) goes the other way.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use parking_lot::Mutex;
use usnvme_driver::spec::Status;
use usnvme_driver::{Completion, IoBuffer, SubmitError};

use super::link::{AnaState, ControllerLink, LinkState};
use crate::transport::fabric_queue::{FabricQueue, FabricQueueSetup};
use crate::transport::tcp::initiator::queue::Buffers;
use crate::transport::tcp::initiator::session::MAX_ENTRIES;
use crate::transport::tcp::initiator::{self, Failure, HostOptions, IoNamespace, Unfinished};
use crate::transport::tcp::initiator::{HostError, QueueParams};
use crate::transport::QueueNamespace;
use crate::transport::{ChannelOptions, DmaTarget, Op};

/// What the owner learned from a remote subsystem (the admin queues of its controllers),
/// shared by the devices of its namespaces: enough to connect I/O queues to it.
#[derive(Debug, Clone)]
pub struct RemoteQueues {
    /// The subsystem's name in messages (e.g. `tcp://127.0.0.1:4420/nqn…`: its first path).
    pub name: String,
    pub subnqn: String,
    pub host: HostOptions,
    /// In-capsule data of an I/O command (IOCCSZ * 16 - 64).
    pub in_capsule: u32,
    /// The largest transfer (MDTS).
    pub max_transfer: u32,
    /// Entries an I/O queue may have (CAP.MQES + 1).
    pub max_entries: u16,
    /// How many of its namespaces the run uses: a reactor's queue holds commands for each.
    pub namespaces: u16,
    /// Where I/O buffers come from (any DMA space: no device reaches them).
    pub dma: DmaTarget,
    /// Its controllers, one per path.
    pub paths: Vec<RemotePath>,
}

/// One path to a remote subsystem: a controller at an address.
#[derive(Debug, Clone)]
pub struct RemotePath {
    pub addr: SocketAddr,
    /// The I/O queue IDs it granted: one per reactor.
    pub qids: Arc<QueueIds>,
    /// The association: the controller ID, reconnects, ANA state, whether it is lost.
    pub link: Arc<ControllerLink>,
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

/// A reactor's NVMe/TCP I/O queue to a remote subsystem: a connection per path, across
/// reconnects.
#[derive(Debug)]
pub struct RemoteQueue {
    paths: Vec<PathQueue>,
    /// The path the next I/O tries first (round robin over the usable ones).
    next: usize,
    /// Why the queue takes no more I/O, once every path was given up.
    lost: Option<String>,
    source: Arc<RemoteQueues>,
}

/// A reactor's connection on one path.
#[derive(Debug)]
struct PathQueue {
    /// Its index in the source's paths.
    index: usize,
    queue: FabricQueue,
    /// The association `queue` belongs to ([`ControllerLink::generation`]).
    generation: u64,
    /// `queue` ended: its unfinished I/Os are in `held` until the next association.
    disconnected: bool,
    /// I/Os to send (again): from a connection that ended, or refused for a path-related
    /// reason (the queue's entries at most).
    held: Vec<Unfinished>,
    /// How it connects (the controller ID is the current association's).
    params: QueueParams,
    /// Its connection to the association `generation`, being set up (see
    /// [`PathQueue::reconnect`]).
    connecting: Option<FabricQueueSetup>,
    now_ns: u64,
    reconnects: u32,
    /// The path was given up.
    lost: Option<String>,
}

impl Drop for RemoteQueue {
    fn drop(&mut self) {
        for p in &self.paths {
            self.source.paths[p.index].qids.give(p.params.qid);
        }
    }
}

impl RemoteQueue {
    /// Queues an I/O to namespace `ns` on the next usable path (see [`FabricQueue::submit_to`]);
    /// while no path is usable (reconnecting, ANA inaccessible) the queue is full.
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
        let path = match self.paths.as_mut_slice() {
            [only] if !only.disconnected => only,
            _ => match self.choose() {
                Some(i) => &mut self.paths[i],
                None if self.ended().is_some() => return Err(SubmitError::Dead),
                None => {
                    return Err(SubmitError::QueueFull {
                        in_flight: self.in_flight().min(usize::from(u16::MAX)) as u16,
                    })
                }
            },
        };
        path.queue.submit_to(ns, op, lba, blocks, buf, token)
    }

    /// The next path for an I/O: an optimized one in turn, else a non-optimized one; none
    /// while every path is reconnecting or inaccessible.
    fn choose(&mut self) -> Option<usize> {
        let n = self.paths.len();
        for wanted in [AnaState::Optimized, AnaState::NonOptimized] {
            for k in 0..n {
                let i = (self.next + k) % n;
                let p = &self.paths[i];
                if !p.disconnected && self.source.paths[p.index].link.ana() == wanted {
                    self.next = (i + 1) % n;
                    return Some(i);
                }
            }
        }
        None
    }

    /// Sends what was queued and hands completions to `on_done`: every path's; then the
    /// I/Os a path holds go to another (or, alone, wait for its reconnect).
    #[inline]
    pub fn poll(&mut self, mut on_done: impl FnMut(Completion)) -> usize {
        let alone = self.paths.len() == 1;
        let mut done = 0;
        for p in &mut self.paths {
            done += p.poll(&self.source, alone, &mut on_done);
        }
        if !alone
            && self.lost.is_none()
            && self
                .paths
                .iter()
                .any(|p| !p.held.is_empty() || p.lost.is_some())
        {
            done += self.fail_over(&mut on_done);
        }
        done
    }

    /// Sends the I/Os paths hold on the paths usable now; once every path was given up,
    /// fails them and takes no more.
    #[cold]
    #[inline(never)]
    fn fail_over(&mut self, on_done: &mut impl FnMut(Completion)) -> usize {
        if self.paths.iter().all(|p| p.lost.is_some()) {
            let why = self
                .paths
                .iter()
                .find_map(|p| p.lost.clone())
                .unwrap_or_default();
            let mut done = 0;
            for p in &mut self.paths {
                done += fail_held(&mut p.held, on_done);
            }
            self.lost = Some(why);
            return done;
        }
        for from in 0..self.paths.len() {
            while let Some(&u) = self.paths[from].held.last() {
                let Some(to) = self.choose() else {
                    return 0; // no usable path yet: they wait
                };
                let path = &mut self.paths[to];
                if path.queue.resubmit(u).is_err() {
                    return 0; // full for now: the rest go at a later poll
                }
                self.paths[from].held.pop();
            }
        }
        0
    }

    #[inline]
    pub fn flush(&mut self) {
        for p in &mut self.paths {
            p.queue.flush();
        }
    }

    #[inline]
    pub fn set_now(&mut self, now_ns: u64) {
        for p in &mut self.paths {
            p.now_ns = now_ns;
            p.queue.set_now(now_ns);
        }
    }

    /// Commands in flight, those held to be sent again too.
    #[inline]
    pub fn in_flight(&self) -> usize {
        self.paths
            .iter()
            .map(|p| p.queue.in_flight() + p.held.len())
            .sum()
    }

    /// Commands that can be submitted now: the queue's entries (shared by its paths) less
    /// those in flight, while a path takes I/O.
    #[inline]
    pub fn free(&self) -> usize {
        match self.paths.as_slice() {
            [only] if !only.disconnected => only.queue.free(),
            paths if paths.iter().any(|p| !p.disconnected) => {
                let entries = usize::from(paths[0].params.entries);
                entries.saturating_sub(self.in_flight())
            }
            _ => 0,
        }
    }

    /// The device is gone: every command in flight and held fails, and the queue takes no more.
    pub fn abandon(&mut self, mut on_done: impl FnMut(Completion)) -> usize {
        let mut n = 0;
        for p in &mut self.paths {
            p.queue.keep_unfinished(false);
            n += p.queue.close(|c| on_done(completion(c, true)));
            n += fail_held(&mut p.held, &mut on_done);
            p.lost = Some("abandoned".into());
        }
        n
    }

    /// Why the queue takes no more I/O, once it does not: every path was given up.
    pub fn ended(&self) -> Option<String> {
        match self.paths.as_slice() {
            [only] => only.lost.clone(),
            _ => self.lost.clone(),
        }
    }

    /// How many times its connections connected again.
    pub fn reconnects(&self) -> u32 {
        self.paths.iter().map(|p| p.reconnects).sum()
    }
}

impl PathQueue {
    fn link<'a>(&self, source: &'a RemoteQueues) -> &'a ControllerLink {
        &source.paths[self.index].link
    }

    /// Polls the connection; one that ended, or an association that changed, goes to
    /// [`PathQueue::recover`]. I/Os refused for a path-related reason are held (the path's
    /// ANA state noted) when there are other paths.
    #[inline]
    fn poll(
        &mut self,
        source: &RemoteQueues,
        alone: bool,
        on_done: &mut impl FnMut(Completion),
    ) -> usize {
        let link = self.link(source);
        if !self.disconnected && link.generation() == self.generation {
            let done = self.queue.poll(|c| on_done(completion(c, false)));
            if done > 0 {
                link.note_traffic();
            }
            if !alone {
                let held = &mut self.held;
                self.queue.take_rerouted(|u, status| {
                    if let Some(state) = AnaState::from_status(status) {
                        link.set_ana(state);
                    }
                    held.push(u);
                });
            }
            if self.queue.ended().is_none() {
                return done;
            }
            return done + self.recover(source, alone, on_done);
        }
        self.recover(source, alone, on_done)
    }

    /// The connection ended or the association changed: keeps the unfinished I/Os, reports
    /// the association down, and once there is a new one connects to it and sends them again;
    /// once the path is given up, fails them (alone) or leaves them to the other paths.
    #[cold]
    #[inline(never)]
    fn recover(
        &mut self,
        source: &RemoteQueues,
        alone: bool,
        on_done: &mut impl FnMut(Completion),
    ) -> usize {
        let mut done = 0;
        let link = self.link(source);
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
                source.paths[self.index].addr,
                self.params.qid,
                self.held.len()
            );
            link.report_down(self.generation, &why);
        }
        let generation = link.generation();
        if self.connecting.is_some() && generation == self.generation {
            self.reconnect(source);
            return done;
        }
        // (a connection being set up to an association gone meanwhile is dropped)
        self.connecting = None;
        if generation == self.generation || self.lost.is_some() {
            return done; // still waiting for the next association, or given up
        }
        match link.state() {
            LinkState::Lost { why } => {
                if alone {
                    done += fail_held(&mut self.held, on_done);
                }
                self.lost = Some(why);
            }
            LinkState::Live { cntlid } => {
                self.params.cntlid = cntlid;
                let path = &source.paths[self.index];
                let buffers = Buffers::Space(source.dma.space.clone());
                self.generation = generation;
                let params = self.params.clone();
                match FabricQueueSetup::start(path.addr, params, &source.host, buffers) {
                    Ok(setup) => {
                        self.connecting = Some(setup);
                        self.reconnect(source);
                    }
                    Err(e) => self.connect_failed(source, &e),
                }
            }
            // the association went down again before this queue saw it live
            LinkState::Down { .. } => {}
        }
        done
    }

    /// Moves the connection to the new association on, one step each poll (the reactor's
    /// other devices are served meanwhile): once it is set up, sends the held I/Os on it.
    fn reconnect(&mut self, source: &RemoteQueues) {
        let Some(setup) = self.connecting.as_mut() else {
            return;
        };
        match setup.step() {
            Ok(false) => return,
            Ok(true) => {}
            Err(e) => {
                self.connecting = None;
                self.connect_failed(source, &e);
                return;
            }
        }
        let Some(setup) = self.connecting.take() else {
            return;
        };
        let mut queue = setup.into_queue();
        let path = &source.paths[self.index];
        queue.keep_unfinished(true);
        if source.paths.len() > 1 {
            queue.reroute_path_errors();
        }
        queue.set_now(self.now_ns);
        for u in self.held.drain(..) {
            if let Err(e) = queue.resubmit(u) {
                // the queue has the entries the old one had: this does not happen
                log::error!("{}: could not send an I/O again: {e}", path.addr);
            }
        }
        self.queue = queue;
        self.disconnected = false;
        self.reconnects += 1;
        log::info!(
            "{}: I/O queue {} reconnected (controller {})",
            path.addr,
            self.params.qid,
            self.params.cntlid
        );
    }

    /// The connection to the association could not be made: the association is down again
    /// (the controller thread tries anew).
    fn connect_failed(&mut self, source: &RemoteQueues, e: &HostError) {
        let why = format!("I/O queue {}: {e}", self.params.qid);
        self.link(source).report_down(self.generation, &why);
    }
}

/// Every held I/O fails as from a removed device.
fn fail_held(held: &mut Vec<Unfinished>, on_done: &mut impl FnMut(Completion)) -> usize {
    let n = held.len();
    for u in held.drain(..) {
        on_done(Completion {
            token: u.token,
            status: Status::HOST_PATHING_ERROR,
            dw0: 0,
            submitted_ns: u.since_ns,
            bytes: u.buf.map_or(0, |b| b.len),
        });
    }
    n
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
        let per_namespace = self.namespace_entries(options);
        (u32::from(per_namespace) * u32::from(self.namespaces.max(1))).clamp(2, u32::from(most))
            as u16
    }

    /// Entries one namespace's channel takes on a queue: `options`' depth, within what the
    /// controller and the initiator allow.
    pub fn namespace_entries(&self, options: &ChannelOptions) -> u16 {
        let most = self.max_entries.clamp(2, MAX_ENTRIES);
        options.queue_entries(u64::from(self.max_transfer), most - 1)
    }

    /// Connects an I/O queue of `entries` entries on each path, on the lowest queue ID free
    /// there; `ns` is the namespace its Connect names (any of those it carries).
    pub fn connect(
        self: &Arc<Self>,
        ns: QueueNamespace,
        entries: u16,
        options: &ChannelOptions,
    ) -> Result<RemoteQueue, usnvme_driver::Error> {
        let mut queue = RemoteQueue {
            paths: Vec::with_capacity(self.paths.len()),
            next: 0,
            lost: None,
            source: self.clone(),
        };
        for index in 0..self.paths.len() {
            // (on an error, the queue IDs taken so far go back as `queue` drops)
            let path = self.connect_path(index, ns, entries, options)?;
            queue.paths.push(path);
        }
        Ok(queue)
    }

    fn connect_path(
        &self,
        index: usize,
        ns: QueueNamespace,
        entries: u16,
        options: &ChannelOptions,
    ) -> Result<PathQueue, usnvme_driver::Error> {
        let path = &self.paths[index];
        let invalid = |what: String| usnvme_driver::Error::Invalid {
            device: format!("tcp://{}/{}", path.addr, self.subnqn),
            what,
        };
        let Some(qid) = path.qids.take() else {
            return Err(invalid(format!(
                "the controller grants {} I/O queues: one per reactor; use fewer cores (-c)",
                path.qids.granted
            )));
        };
        let timeout = options.timeout.unwrap_or(Duration::from_secs(30));
        let block_size = u64::from(ns.block_size.max(1));
        let generation = path.link.generation();
        let LinkState::Live { cntlid } = path.link.state() else {
            path.qids.give(qid);
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
        match FabricQueue::connect(path.addr, params.clone(), &self.host, buffers) {
            Ok(mut queue) => {
                queue.keep_unfinished(true);
                if self.paths.len() > 1 {
                    queue.reroute_path_errors();
                }
                Ok(PathQueue {
                    index,
                    queue,
                    generation,
                    disconnected: false,
                    held: Vec::with_capacity(usize::from(entries)),
                    params,
                    connecting: None,
                    now_ns: 0,
                    reconnects: 0,
                    lost: None,
                })
            }
            Err(e) => {
                path.qids.give(qid);
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
