//! The host's completion queues: one per reactor (thread) and RDMA device, shared by the I/O
//! queue pairs the reactor makes on that device — of all its controllers and paths — so that a
//! reactor's turn polls one completion queue for all of them, as SPDK's poll groups do.
//!
//! A queue pair joins its thread's shared queue when it is made ([`join`]) and takes a route:
//! an inbox sized for every work request it may have outstanding. Whichever queue pair polls
//! takes a batch, keeps its own completions and hands the others to their inboxes (lock-free:
//! handing over never waits, fails or allocates); each then takes its inbox first when it
//! polls. A route names its queue pair and a tag of its join, which the queue puts in its work
//! request IDs: a late completion of a queue pair gone is dropped, never taken by the next to
//! join with the same number.
//!
//! An admin queue has a completion queue of its own ([`own`]): it is polled from whichever
//! thread runs its controller, which would otherwise share a queue with another thread's.

use std::cell::RefCell;
use std::io;
use std::sync::atomic::{AtomicU16, AtomicU32, Ordering};
use std::sync::{Arc, Weak};

use crossbeam_queue::ArrayQueue;

use super::verbs::{largest, CmId, CompletionQueue, Wc, WcOpcode, POLL_BATCH};
use crate::transport::tcp::initiator::session::MAX_ENTRIES;

/// Queue pairs on one shared completion queue at most.
const ROUTES: usize = 16;
/// Completions a shared queue is made for (fewer where the device takes fewer): every work
/// request of its queue pairs may be outstanding at once.
const ENTRIES: u32 = 1 << 15;
/// A route claimed by a queue pair not yet made (queue pair numbers have 24 bits).
const CLAIMED: u32 = u32::MAX;

thread_local! {
    /// This thread's shared completion queues.
    static SHARED: RefCell<Vec<Weak<Hub>>> = const { RefCell::new(Vec::new()) };
}

/// A completion queue and the queue pairs' routes on it.
#[derive(Debug)]
struct Hub {
    cq: CompletionQueue,
    device: usize,
    /// Completion entries promised to the queue pairs on it, of `capacity`.
    reserved: AtomicU32,
    capacity: u32,
    routes: Box<[Route]>,
    next_tag: AtomicU16,
}

#[derive(Debug)]
struct Route {
    /// The queue pair (0: free; no RC queue pair has number 0; [`CLAIMED`]: joining).
    qp_num: AtomicU32,
    /// Its completions another queue pair polled.
    inbox: ArrayQueue<Wc>,
}

/// A queue pair's place on a completion queue, shared or its own. Dropped after the queue
/// pair is destroyed (its owner's field order): the route is free, the entries given back.
#[derive(Debug)]
pub struct Member {
    hub: Arc<Hub>,
    route: usize,
    /// Its join's tag (15 bits), for the work request IDs.
    tag: u16,
    entries: u32,
    qp_num: u32,
}

/// A place for a queue pair of `entries` entries (a send and a receive each) of connection
/// `id` on this thread's shared completion queue of its device (a new one if none has room).
pub fn join(id: &CmId, entries: u32) -> io::Result<Member> {
    let need = 2 * entries;
    let device = id.device();
    let found = SHARED.with_borrow_mut(|hubs| {
        hubs.retain(|h| h.strong_count() > 0);
        let mut live = hubs.iter().filter_map(Weak::upgrade);
        live.find_map(|hub| {
            (hub.device == device)
                .then(|| Hub::enter(&hub, need))
                .flatten()
        })
    });
    if let Some(member) = found {
        return Ok(member);
    }
    let hub = Hub::new(id, ENTRIES, ROUTES)?;
    SHARED.with_borrow_mut(|hubs| hubs.push(Arc::downgrade(&hub)));
    Hub::enter(&hub, need).ok_or_else(|| too_many(need, hub.capacity))
}

/// A completion queue of its own for a queue pair of `entries` entries of connection `id`.
pub fn own(id: &CmId, entries: u32) -> io::Result<Member> {
    let need = 2 * entries;
    let hub = Hub::new(id, need, 1)?;
    Hub::enter(&hub, need).ok_or_else(|| too_many(need, hub.capacity))
}

fn too_many(need: u32, capacity: u32) -> io::Error {
    io::Error::other(format!(
        "the RDMA device takes completion queues of {capacity} entries, a queue needs {need}"
    ))
}

/// The shared completion queues of this thread (for tests).
pub fn shared_completion_queues() -> usize {
    SHARED.with_borrow(|hubs| hubs.iter().filter(|h| h.strong_count() > 0).count())
}

impl Hub {
    fn new(id: &CmId, entries: u32, routes: usize) -> io::Result<Arc<Hub>> {
        let (capacity, cq) = largest(entries, |n| id.create_cq(n))?;
        let inbox = 2 * usize::from(MAX_ENTRIES);
        Ok(Arc::new(Hub {
            cq,
            device: id.device(),
            reserved: AtomicU32::new(0),
            capacity,
            routes: (0..routes)
                .map(|_| Route {
                    qp_num: AtomicU32::new(0),
                    inbox: ArrayQueue::new(inbox),
                })
                .collect(),
            next_tag: AtomicU16::new(0),
        }))
    }

    /// A route and `need` entries on `hub`, if it has them.
    fn enter(hub: &Arc<Hub>, need: u32) -> Option<Member> {
        let reserved = hub.reserved.fetch_add(need, Ordering::AcqRel);
        let route = hub.routes.iter().position(|r| {
            r.qp_num
                .compare_exchange(0, CLAIMED, Ordering::AcqRel, Ordering::Acquire)
                .is_ok()
        });
        match route {
            Some(route) if reserved + need <= hub.capacity => Some(Member {
                hub: hub.clone(),
                route,
                tag: hub.next_tag.fetch_add(1, Ordering::Relaxed) & 0x7fff,
                entries: need,
                qp_num: CLAIMED,
            }),
            other => {
                if let Some(route) = other {
                    hub.routes[route].qp_num.store(0, Ordering::Release);
                }
                hub.reserved.fetch_sub(need, Ordering::AcqRel);
                None
            }
        }
    }

    /// Gives `wc` to the inbox of the queue pair it is for (none: a late one of a queue pair
    /// gone, dropped).
    fn hand_over(&self, wc: Wc) {
        if let Some(r) = self
            .routes
            .iter()
            .find(|r| r.qp_num.load(Ordering::Acquire) == wc.qp_num)
        {
            // (sized for all its work requests: never full)
            let _ = r.inbox.push(wc);
        }
    }
}

impl Member {
    pub fn cq(&self) -> &CompletionQueue {
        &self.hub.cq
    }

    /// Its join's tag, which its work request IDs carry in bits 48..63.
    pub fn tag(&self) -> u64 {
        u64::from(self.tag) << 48
    }

    /// Whether work request ID `wr_id` is of this join.
    pub fn is_mine(&self, wr_id: u64) -> bool {
        (wr_id >> 48) & 0x7fff == u64::from(self.tag)
    }

    /// The queue pair is made: its number routes its completions.
    pub fn bind(&mut self, qp_num: u32) {
        self.qp_num = qp_num;
        self.hub.routes[self.route]
            .qp_num
            .store(qp_num, Ordering::Release);
    }

    /// Takes the queue pair's completions: those other queue pairs polled, then the
    /// completion queue's, handing others' over. Hands each of its own to `on`; how many
    /// were its own, and whether any went to another.
    pub fn poll(&self, mut on: impl FnMut(&Wc)) -> io::Result<(usize, bool)> {
        let mut own = 0;
        let inbox = &self.hub.routes[self.route].inbox;
        while let Some(wc) = inbox.pop() {
            on(&wc);
            own += 1;
        }
        let mut wcs = [Wc {
            wr_id: 0,
            qp_num: 0,
            status: 0,
            opcode: WcOpcode::Send,
            byte_len: 0,
        }; POLL_BATCH];
        let mut others = false;
        loop {
            let n = self.hub.cq.poll(&mut wcs)?;
            for wc in &wcs[..n] {
                if wc.qp_num == self.qp_num {
                    on(wc);
                    own += 1;
                } else {
                    self.hub.hand_over(*wc);
                    others = true;
                }
            }
            if n < POLL_BATCH {
                return Ok((own, others));
            }
        }
    }
}

impl Drop for Member {
    fn drop(&mut self) {
        let route = &self.hub.routes[self.route];
        // emptied before it is free (so that nothing of the next to join is emptied with it);
        // one handed over in between stays, and the next to join drops it by its tag
        while route.inbox.pop().is_some() {}
        route.qp_num.store(0, Ordering::Release);
        self.hub.reserved.fetch_sub(self.entries, Ordering::AcqRel);
    }
}
