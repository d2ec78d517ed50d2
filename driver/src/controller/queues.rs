//! I/O queue pairs: their creation (queue ids, rings, shadow doorbells, MSI-X vectors) and
//! the deletion of their queues once dropped, without anyone waiting.

use std::sync::Arc;
use std::time::{Duration, Instant};

use vm_memory::Bytes;

use crate::error::Error;
use crate::prp::PAGE;
use crate::queue::{
    ring_entries, Doorbells, Interrupt, Layout, QueuePair, QueueSetup, Release, Shadow, Ticket,
};
use crate::spec::command::QueuePriority;
use crate::spec::registers::{cq_head_doorbell, reg, sq_tail_doorbell};
use crate::spec::{Csts, Sqe, Status};

use super::admin::{Admin, Outcome};
use super::{invalid, map, Controller, QueuePairOptions, Shared};

/// A dropped queue pair's queues, deleted without anyone waiting: the SQ first, then the CQ (the
/// spec's order), after the creation command it may have left outstanding. Its queue id is given
/// back only when they are gone, so no new queue pair can take it meanwhile.
#[derive(Debug)]
pub(super) struct Deletion {
    pub(super) qid: u16,
    /// The command to wait for before deleting (an outstanding Create I/O CQ or SQ).
    after: Option<Ticket>,
    sq: bool,
    cq: bool,
    /// The Delete I/O SQ or CQ under way.
    sent: Option<Ticket>,
    /// A deletion timed out: the queue id stays taken until a reset clears every queue.
    pub(super) stuck: bool,
}

impl Controller {
    /// Creates an I/O queue pair for the calling thread: its queues exist on the controller
    /// when it returns (two admin commands, which take milliseconds).
    pub fn create_queue_pair(&self, opts: QueuePairOptions) -> Result<QueuePair, Error> {
        self.queue_pair(opts, true)
    }

    /// An I/O queue pair for the calling thread, at once: its queues are created on the
    /// controller by its own polls (Create I/O CQ, then SQ, each submitted and picked up on a
    /// later poll, as after a reset), so that a thread that polls other devices never waits
    /// for it. I/O submitted meanwhile waits in the SQ and goes out once they exist; a
    /// controller that refuses them leaves the queue pair refusing I/O.
    pub fn open_queue_pair(&self, opts: QueuePairOptions) -> Result<QueuePair, Error> {
        self.queue_pair(opts, false)
    }

    fn queue_pair(&self, opts: QueuePairOptions, create_now: bool) -> Result<QueuePair, Error> {
        let s = &self.shared;
        let depth = opts
            .depth
            .clamp(2, s.cap.max_queue_entries().min(u16::MAX as u32) as u16);
        // Deletions that finished give their ids back first. The id of a deletion still under
        // way is not taken again; only when every id is taken are those waited for.
        s.progress(&mut s.admin.lock());
        let qid = match s.take_qid() {
            Some(qid) => qid,
            None => {
                s.finish_deletions();
                s.take_qid().ok_or_else(|| Error::NoQueue {
                    device: s.name.clone(),
                    granted: s.granted,
                })?
            }
        };
        let release = |s: &Shared| s.qids.lock()[qid as usize] = false;
        let interrupt = match opts.interrupts.then(|| s.interrupt_for(qid)).transpose() {
            Ok(i) => i,
            Err(e) => {
                release(s);
                return Err(e);
            }
        };
        let max_entries = s.cap.max_queue_entries().min(u16::MAX as u32) as u16;
        let layout = Layout::new(
            ring_entries(depth, max_entries),
            depth - 1,
            s.max_transfer / PAGE + 1,
        );
        let node = opts.node.or(s.options.node);
        let memory = match map(&s.name, &s.space, layout.bytes, &s.options, node) {
            Ok(m) => m,
            Err(e) => {
                release(s);
                return Err(e);
            }
        };
        // A queue id used before may have left shadow doorbell and EventIdx values behind; the
        // controller must see this queue start from zero (a reset clears all of them).
        if let Some(pages) = &s.shadow {
            let stride = s.cap.doorbell_stride();
            for entry in [2 * qid as usize * stride, (2 * qid as usize + 1) * stride] {
                for offset in [entry, PAGE as usize + entry] {
                    if pages
                        .slice(offset, 4)
                        .and_then(|p| p.write_obj(0u32, 0))
                        .is_err()
                    {
                        release(s);
                        return Err(invalid(&s.name, "shadow doorbell page"));
                    }
                }
            }
        }
        // The generation before creating: a reset racing with us makes the queue pair reconnect.
        let generation = self.generation();
        let (sq_iova, cq_iova) = (memory.iova_of(layout.sq), memory.iova_of(layout.cq));
        let vector = interrupt.as_ref().map(|i| i.vector);
        if create_now {
            if let Err(e) = self.create_queues(qid, layout.depth, sq_iova, cq_iova, vector) {
                release(s);
                return Err(e);
            }
        }
        let stride = s.cap.doorbell_stride();
        let shadow = s.shadow.as_ref().map(|pages| Shadow {
            pages: pages.clone(),
            sq_tail: 2 * qid as usize * stride,
            cq_head: (2 * qid as usize + 1) * stride,
            eventidx: PAGE as usize,
            always_mmio: false,
        });
        Ok(QueuePair::new(QueueSetup {
            qid,
            layout,
            memory,
            doorbells: Doorbells::new(
                &s.regs,
                sq_tail_doorbell(qid, s.cap.dstrd()),
                cq_head_doorbell(qid, s.cap.dstrd()),
                shadow,
            ),
            namespaces: s.namespaces.lock().geometry.clone(),
            max_transfer: s.max_transfer,
            use_sgl: s.sgl,
            timeout: opts.timeout,
            generation,
            created: create_now,
            owner: Some(Arc::new(self.clone())),
            interrupt,
        }))
    }

    /// Creates I/O completion queue `qid` (raising MSI-X `vector`, if one is given) and its
    /// submission queue on the controller.
    pub(crate) fn create_queues(
        &self,
        qid: u16,
        depth: u16,
        sq_iova: u64,
        cq_iova: u64,
        vector: Option<u16>,
    ) -> Result<(), Error> {
        self.admin(Sqe::create_io_cq_with(qid, depth as u32, cq_iova, vector))?;
        let sq = Sqe::create_io_sq(qid, depth as u32, sq_iova, qid, QueuePriority::Urgent);
        if let Err(e) = self.admin(sq) {
            let _ = self.admin(Sqe::delete_io_cq(qid));
            return Err(e);
        }
        Ok(())
    }

    /// Sees the I/O queue deletions under way through (at most the admin timeout): what a
    /// thread that dropped its queue pairs does when its run is over, so that none is left
    /// for the next admin user (a deletion parked while another thread held the admin queue).
    pub fn finish_deletions(&self) {
        self.shared.finish_deletions();
    }

    /// A queue pair is done with `qid`: its queues are deleted as `release` says, without
    /// waiting (see `Deletion`); the id is free again once they are gone.
    pub(crate) fn release_queue(&self, qid: u16, release: Release) {
        let s = &self.shared;
        if !release.delete_sq && !release.delete_cq {
            if let Some(t) = release.after {
                self.forget_admin(t);
            }
            s.free_qid(qid);
            return;
        }
        let d = Deletion {
            qid,
            after: release.after,
            sq: release.delete_sq,
            cq: release.delete_cq,
            sent: None,
            stuck: false,
        };
        match s.admin.try_lock() {
            Some(mut admin) => {
                admin.deletions.push(d);
                s.progress(&mut admin);
            }
            None => s.handoff.lock().push(d),
        }
    }
}

impl Admin {
    /// Moves deletion `d` on as far as it goes without waiting; true when it is done.
    pub(super) fn advance(&mut self, name: &str, d: &mut Deletion) -> bool {
        loop {
            if d.stuck {
                return false;
            }
            if let Some(t) = d.after {
                match self.take(t) {
                    Ok(None) => return false,
                    _ => d.after = None,
                }
            }
            if let Some(t) = d.sent {
                match self.take(t) {
                    Ok(None) => return false,
                    Ok(Some(Outcome::TimedOut)) => {
                        log::error!(
                            "{name}: deleting I/O queue {}: no completion: its id stays taken until a reset",
                            d.qid
                        );
                        d.stuck = true;
                        return false;
                    }
                    // Invalid Queue Identifier: the creation it followed had failed
                    Ok(Some(Outcome::Done { status, .. }))
                        if !status.is_success() && status.code() != Status::INVALID_QID =>
                    {
                        log::warn!("{name}: deleting I/O queue {}: {status}", d.qid)
                    }
                    _ => {}
                }
                d.sent = None;
            }
            let sqe = match (d.sq, d.cq) {
                (true, _) => Sqe::delete_io_sq(d.qid),
                (false, true) => Sqe::delete_io_cq(d.qid),
                (false, false) => return true,
            };
            match self.submit(name, sqe) {
                Ok(Some(t)) => {
                    d.sent = Some(t);
                    if d.sq {
                        d.sq = false;
                    } else {
                        d.cq = false;
                    }
                }
                Ok(None) => return false,
                Err(e) => {
                    // the admin queue is unusable: the controller is gone or failed
                    log::warn!("{name}: deleting I/O queue {}: {e}", d.qid);
                    return true;
                }
            }
        }
    }
}

impl Shared {
    /// The lowest free I/O queue id, marked taken.
    fn take_qid(&self) -> Option<u16> {
        let mut qids = self.qids.lock();
        let qid = qids.iter().skip(1).position(|used| !used)? + 1;
        qids[qid] = true;
        Some(qid as u16)
    }

    /// The interrupt of I/O queue `qid`: its MSI-X vector and that vector's eventfd. MSI-X is
    /// enabled on the first call, with every vector the queue pairs can use at once (VFIO
    /// re-programs all of them whenever it is enabled). Vector 0 is the admin queue's, which
    /// stays polled; I/O queue `qid` takes vector `qid` while there are enough, else queues
    /// share the I/O vectors round robin (as controllers with fewer vectors than queues are
    /// used). Owners of queues on one vector each wake on its interrupt: they watch it
    /// edge-triggered and never read it (reading it empty would eat the others' wake-ups).
    fn interrupt_for(&self, qid: u16) -> Result<Interrupt, Error> {
        let unavailable = |what: String| Error::Unsupported {
            device: self.name.clone(),
            what,
        };
        let mut msix = self.msix.lock();
        if msix.is_none() {
            let Some(device) = &self.interrupts else {
                return Err(unavailable("interrupts (no MSI-X here)".into()));
            };
            // no more than the queue pairs there can be: one per granted queue, and one per
            // CPU this process may use (a thread per CPU holds one): the system's vectors are
            // few (24 drives of 65 vectors each exhaust a 2-CPU machine's)
            let cpus = std::thread::available_parallelism().map_or(1, |n| n.get());
            let threads = u16::try_from(cpus).unwrap_or(u16::MAX);
            let count = device
                .vectors()
                .min(self.granted.min(threads).saturating_add(1));
            if count < 2 {
                return Err(unavailable(format!(
                    "interrupts for I/O queues ({count} MSI-X vectors)"
                )));
            }
            let fds = device.enable(count).map_err(|e| {
                unavailable(format!("MSI-X interrupts (enabling {count} vectors: {e})"))
            })?;
            *msix = Some(fds);
        }
        let fds = msix.as_deref().unwrap_or_default();
        let io_vectors = fds.len().saturating_sub(1);
        if qid == 0 || io_vectors == 0 {
            return Err(unavailable(format!("an interrupt for queue {qid}")));
        }
        let vector = 1 + (usize::from(qid) - 1) % io_vectors;
        Ok(Interrupt {
            vector: vector as u16,
            fd: fds[vector].clone(),
        })
    }

    /// Raises every I/O queue's vector, as if completions had come (MSI-X survives a controller
    /// reset; the queue pairs on them poll, fail what they held and re-create their queues).
    pub(super) fn raise_interrupts(&self) {
        if let Some(fds) = &*self.msix.lock() {
            for fd in fds.iter().skip(1) {
                // only fails when the counter would overflow: it is raised then
                let _ = fd.write(1);
            }
        }
    }

    pub(super) fn free_qid(&self, qid: u16) {
        if let Some(used) = self.qids.lock().get_mut(qid as usize) {
            *used = false;
        }
    }

    /// Waits for the deletions under way (at most the admin timeout, and not for a controller
    /// that failed or is gone): before a queue id is chosen, and before shutdown.
    pub(super) fn finish_deletions(&self) {
        let mut admin = self.admin.lock();
        let started = Instant::now();
        loop {
            self.progress(&mut admin);
            if admin.deletions.iter().all(|d| d.stuck) {
                return;
            }
            let csts = Csts(self.regs.read32(reg::CSTS));
            if csts.removed() || csts.cfs() || started.elapsed() > self.options.admin_timeout {
                log::warn!("{}: I/O queue deletions left unfinished", self.name);
                return;
            }
            std::thread::sleep(Duration::from_micros(50));
        }
    }
}
