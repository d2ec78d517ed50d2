//! A reactor's I/O queues: one per controller, shared by the channels of that controller's
//! namespaces on the reactor (a drive with four namespaces served from two cores uses two
//! queues, not eight), as long as the queue holds every namespace's depth at once: a
//! controller that grants small queues (a fabric target's 128 entries against eight
//! namespaces at depth 32) gets another queue for the namespaces that do not fit, so that
//! the depth asked for is in flight. The reactor makes them ([`Queues`]) as it sets up its
//! channels; each channel holds its queue as an [`IoQueue`]: its own when no other channel
//! uses it (the I/O path then reaches it directly), else [`IoQueue::Shared`], where a
//! completion that comes for another namespace while one channel polls waits in that
//! namespace's inbox.

use std::cell::RefCell;
use std::collections::VecDeque;
use std::os::fd::OwnedFd;
use std::rc::Rc;
use std::sync::Arc;

use usnvme_driver::{Completion, Controller, IoBuffer, QueuePairOptions, SubmitError};

use super::{IoQueue, QueueNamespace, RemoteQueues};
use crate::transport::{ChannelOptions, Op};

/// Where a controller's I/O queues come from.
#[derive(Debug, Clone)]
pub enum QueueSource {
    /// A local controller, the engine's drive `drive`.
    Pcie { ctrl: Controller, drive: usize },
    /// A remote controller.
    Tcp(Arc<RemoteQueues>),
}

impl QueueSource {
    /// Whether both are the same controller: the engine's drive index, or one remote
    /// controller's queue source.
    fn same_controller(&self, other: &QueueSource) -> bool {
        match (self, other) {
            (QueueSource::Pcie { drive: a, .. }, QueueSource::Pcie { drive: b, .. }) => a == b,
            (QueueSource::Tcp(a), QueueSource::Tcp(b)) => Arc::ptr_eq(a, b),
            _ => false,
        }
    }

    /// Entries one namespace's channel takes on a queue for `options`.
    fn namespace_depth(&self, options: &ChannelOptions) -> usize {
        let entries = match self {
            QueueSource::Pcie { ctrl, .. } => {
                options.queue_entries(ctrl.max_transfer(), ctrl.cap().mqes())
            }
            QueueSource::Tcp(remote) => remote.namespace_entries(options),
        };
        usize::from(entries)
    }

    /// The largest transfer of one command, in bytes.
    pub fn max_transfer(&self) -> u64 {
        match self {
            QueueSource::Pcie { ctrl, .. } => ctrl.max_transfer(),
            QueueSource::Tcp(remote) => u64::from(remote.max_transfer),
        }
    }

    /// A new I/O queue for a reactor, sized for `options` on each of the controller's
    /// namespaces the run may use; `ns` is the namespace asking for it. `at_once`: a local
    /// queue pair is had without waiting, its queues created by its own polls.
    fn create(
        &self,
        ns: QueueNamespace,
        options: &ChannelOptions,
        at_once: bool,
    ) -> Result<IoQueue, usnvme_driver::Error> {
        match self {
            QueueSource::Pcie { ctrl, .. } => {
                let per_namespace = options.queue_entries(ctrl.max_transfer(), ctrl.cap().mqes());
                let namespaces = ctrl.namespaces().len().max(1) as u64;
                let entries = (u64::from(per_namespace) * namespaces)
                    .min(u64::from(ctrl.cap().mqes()) + 1)
                    .min(u64::from(u16::MAX)) as u16;
                let opts = QueuePairOptions {
                    depth: entries,
                    node: options.node,
                    timeout: options.timeout,
                    interrupts: options.interrupts,
                };
                let qp = match at_once {
                    true => ctrl.open_queue_pair(opts)?,
                    false => ctrl.create_queue_pair(opts)?,
                };
                Ok(IoQueue::Pcie(qp))
            }
            // (a socket, not an interrupt: `options.interrupts` does not apply)
            QueueSource::Tcp(remote) => {
                let entries = remote.queue_entries(options);
                Ok(IoQueue::Tcp(remote.connect(ns, entries, options)?))
            }
        }
    }
}

/// A reactor's queues, by controller, while its channels are set up.
#[derive(Debug, Default)]
pub struct Queues {
    queues: Vec<(QueueSource, SharedQueue)>,
    /// Local queue pairs are had at once, their queues created by their polls.
    at_once: bool,
}

impl Queues {
    /// Queues for a reactor about to run: each local queue pair exists on its controller when
    /// its channel is made (set-up errors show before any I/O).
    pub fn new() -> Queues {
        Queues::default()
    }

    /// Queues for a reactor that is running (a device added to the run): a local queue pair
    /// creates its queues on the controller over its first polls (admin commands submitted and
    /// picked up without waiting), so that the reactor's other devices never stop for it.
    pub fn while_running() -> Queues {
        Queues {
            at_once: true,
            ..Queues::default()
        }
    }

    /// This reactor's queue to `source`'s controller, for namespace `ns`: one it has with
    /// room for `ns`'s depth, unless a channel of `ns` is on it already, else a new one (or,
    /// where the controller grants no more queues, the one with the most room).
    pub fn queue_for(
        &mut self,
        source: &QueueSource,
        ns: QueueNamespace,
        options: &ChannelOptions,
    ) -> Result<IoQueue, usnvme_driver::Error> {
        let depth = source.namespace_depth(options);
        let mut open = self
            .queues
            .iter()
            .filter(|(s, q)| s.same_controller(source) && !q.carries(ns.nsid))
            .map(|(_, q)| q);
        let roomiest = open.clone().max_by_key(|q| q.room());
        let queue = match open.find(|q| q.room() >= depth) {
            Some(q) => q.clone(),
            None => match (source.create(ns, options, self.at_once), roomiest) {
                (Ok(queue), _) => {
                    let q = SharedQueue::new(queue);
                    self.queues.push((source.clone(), q.clone()));
                    q
                }
                (Err(e), Some(q)) => {
                    log::debug!("another I/O queue for namespace {}: {e}; sharing", ns.nsid);
                    q.clone()
                }
                (Err(e), None) => return Err(e),
            },
        };
        queue.add_route(ns.nsid, depth);
        Ok(IoQueue::Shared {
            queue,
            nsid: ns.nsid,
            in_flight: 0,
        })
    }

    /// How many queues the reactor made.
    pub fn len(&self) -> usize {
        self.queues.len()
    }

    pub fn is_empty(&self) -> bool {
        self.queues.is_empty()
    }

    /// Every channel is set up: the reactor lets go of the queues (the channels hold them),
    /// so that a queue used by one channel only can become that channel's own.
    pub fn release(&mut self) {
        self.queues.clear();
    }
}

/// One queue of a controller on a reactor, shared by the channels of its namespaces.
#[derive(Debug, Clone)]
pub struct SharedQueue(Rc<RefCell<Shared>>);

impl SharedQueue {
    /// The queue itself when no other channel holds it any more (after [`Queues::release`]).
    pub(super) fn into_own(self) -> Result<IoQueue, SharedQueue> {
        Rc::try_unwrap(self.0)
            .map(|cell| cell.into_inner().queue)
            .map_err(SharedQueue)
    }
}

#[derive(Debug)]
struct Shared {
    queue: IoQueue,
    /// The namespaces whose channels use the queue, each with the completions that came for
    /// it while another channel polled (sized for the whole queue: pushing never allocates).
    routes: Vec<Route>,
    /// Each command in flight: its namespace and its channel's token. The queue carries the
    /// index here as the command's token, so that a completion finds its namespace without
    /// the queue below keeping one (only a shared queue pays for sharing).
    slots: Vec<(u32, u64)>,
    free: Vec<u32>,
    /// Entries the namespaces' channels take together (see [`QueueSource::namespace_depth`]).
    depths: usize,
}

#[derive(Debug)]
struct Route {
    nsid: u32,
    inbox: VecDeque<Completion>,
}

impl SharedQueue {
    fn new(queue: IoQueue) -> SharedQueue {
        let capacity = queue.free() + 1;
        SharedQueue(Rc::new(RefCell::new(Shared {
            queue,
            routes: Vec::new(),
            slots: vec![(0, 0); capacity],
            free: (0..capacity as u32).rev().collect(),
            depths: 0,
        })))
    }

    /// Entries the queue has beyond its namespaces' depths (entries, as
    /// [`QueueSource::namespace_depth`] counts them: a ring's empty one included).
    fn room(&self) -> usize {
        let s = self.0.borrow();
        s.slots.len().saturating_sub(s.depths)
    }

    fn carries(&self, nsid: u32) -> bool {
        self.0.borrow().routes.iter().any(|r| r.nsid == nsid)
    }

    fn add_route(&self, nsid: u32, depth: usize) {
        let mut s = self.0.borrow_mut();
        s.depths += depth;
        let room = s.slots.len();
        s.routes.push(Route {
            nsid,
            inbox: VecDeque::with_capacity(room),
        });
    }

    /// Namespace `nsid`'s channel is gone: its completions are no longer kept.
    pub(super) fn remove_route(&self, nsid: u32) {
        if let Ok(mut s) = self.0.try_borrow_mut() {
            s.routes.retain(|r| r.nsid != nsid);
        }
    }

    /// Queues a command (see [`IoQueue::submit`]). A queue cannot be reached from inside its
    /// own completion handler: there it reports itself full.
    #[inline]
    pub fn submit(
        &self,
        ns: QueueNamespace,
        op: Op,
        lba: u64,
        blocks: u32,
        buf: Option<IoBuffer>,
        token: u64,
    ) -> Result<(), SubmitError> {
        let Ok(mut s) = self.0.try_borrow_mut() else {
            return Err(SubmitError::QueueFull { in_flight: 0 });
        };
        let Shared {
            queue, slots, free, ..
        } = &mut *s;
        let Some(slot) = free.pop() else {
            return Err(SubmitError::QueueFull { in_flight: 0 });
        };
        match queue.submit_any(ns, op, lba, blocks, buf, u64::from(slot)) {
            Ok(()) => {
                slots[slot as usize] = (ns.nsid, token);
                Ok(())
            }
            Err(e) => {
                free.push(slot);
                Err(e)
            }
        }
    }

    /// Polls the queue and hands namespace `nsid`'s completions to `on_done` (those for the
    /// other namespaces go to their inboxes); returns how many were handed on.
    #[inline]
    pub fn poll(&self, nsid: u32, on_done: impl FnMut(Completion)) -> usize {
        self.reap(nsid, on_done, |queue, on_done| queue.poll(on_done))
    }

    /// Runs `reap` (a poll, or abandoning the queue) and hands namespace `nsid`'s completions
    /// to `on_done`, those that waited in its inbox first; the other namespaces' go to their
    /// inboxes. Returns how many were handed on.
    fn reap(
        &self,
        nsid: u32,
        mut on_done: impl FnMut(Completion),
        reap: impl FnOnce(&mut IoQueue, &mut dyn FnMut(Completion)) -> usize,
    ) -> usize {
        let Ok(mut s) = self.0.try_borrow_mut() else {
            return 0;
        };
        let Shared {
            queue,
            routes,
            slots,
            free,
            ..
        } = &mut *s;
        let mut done = 0;
        for c in routes
            .iter_mut()
            .filter(|r| r.nsid == nsid)
            .flat_map(|r| r.inbox.drain(..))
        {
            done += 1;
            on_done(c);
        }
        reap(queue, &mut |mut c: Completion| {
            // the slot gives the namespace and the channel's token back
            let Some(&(owner, token)) = slots.get(c.token as usize) else {
                log::error!(
                    "shared queue: completion for slot {} that is not in flight: ignored",
                    c.token
                );
                return;
            };
            free.push(c.token as u32);
            c.token = token;
            if owner == nsid {
                done += 1;
                on_done(c);
            } else if let Some(r) = routes.iter_mut().find(|r| r.nsid == owner) {
                r.inbox.push_back(c);
            }
        });
        done
    }

    /// Sends what was queued.
    #[inline]
    pub fn flush(&self) {
        if let Ok(mut s) = self.0.try_borrow_mut() {
            s.queue.flush();
        }
    }

    #[inline]
    pub fn set_now(&self, now_ns: u64) {
        if let Ok(mut s) = self.0.try_borrow_mut() {
            s.queue.set_now(now_ns);
        }
    }

    /// Commands that can be queued now.
    #[inline]
    pub fn free(&self) -> usize {
        self.0.try_borrow().map_or(0, |s| s.queue.free())
    }

    /// The controller is gone: every command in flight on the queue fails with "Host Pathing
    /// Error"; namespace `nsid`'s go to `on_done` now, the others' at their next poll.
    pub fn abandon(&self, nsid: u32, on_done: impl FnMut(Completion)) -> usize {
        self.reap(nsid, on_done, |queue, on_done| queue.abandon(on_done))
    }

    /// Why the queue ended, once it has (a remote target gone or lost).
    pub fn ended(&self) -> Option<String> {
        self.0.try_borrow().ok().and_then(|s| s.queue.ended())
    }

    /// How many times the queue connected again.
    pub fn reconnects(&self) -> u32 {
        self.0.try_borrow().map_or(0, |s| s.queue.reconnects())
    }

    /// The queue's interrupt (see [`IoQueue::interrupt`]).
    pub fn interrupt(&self) -> std::io::Result<Option<OwnedFd>> {
        self.0
            .try_borrow()
            .map_or(Ok(None), |s| s.queue.interrupt())
    }
}
