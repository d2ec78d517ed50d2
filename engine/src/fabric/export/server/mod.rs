//! The target on the engine's reactors: each reactor runs a [`ServeJob`] that owns the
//! connections handed to it (non-blocking sockets, no thread per connection), feeds their
//! bytes to their [`Connection`]s, submits their commands on its own channels to the block
//! devices, and writes their responses. Data moves between the sockets and the reactor's DMA
//! buffers with no copy (`readv`/`writev`, see [`crate::fabric::framing::socket`]).

// (without the `rdma` feature a connection's `Link` is always TCP)
#![cfg_attr(not(feature = "rdma"), allow(irrefutable_let_patterns))]

use std::net::TcpStream;
use std::os::fd::AsFd;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use usnvme_driver::spec::Status;
use usnvme_hugepages::DmaBuffer;

use super::connection::{Connection, ConnectionLimits, Receive};
use super::registry::Registry;
use super::waiting::Waiting;
use super::{Listener, Subsystems};
use crate::engine::{Job, ReactorContext, INTERRUPT};
use crate::fabric::address::Transport;

mod backend;
mod counters;
mod inbox;
#[cfg(feature = "rdma")]
mod rdma;
mod smart;

use backend::{Pools, ReactorBackend};
pub use counters::Counters;
use counters::{thread_cpu_ns, BusyClock};
#[cfg(feature = "rdma")]
pub use inbox::IncomingRdma;
use inbox::BELL;
pub use inbox::{Inbox, Incoming};
#[cfg(not(feature = "rdma"))]
pub use no_rdma::RdmaListener;
#[cfg(feature = "rdma")]
pub use rdma::RdmaListener;

/// A build without NVMe/RDMA: an RDMA port cannot be had, and says how to get one.
#[cfg(not(feature = "rdma"))]
mod no_rdma {
    use super::{Inbox, Listener};

    /// An NVMe/RDMA port, which this build cannot make.
    #[derive(Debug)]
    pub struct RdmaListener {
        never: std::convert::Infallible,
    }

    impl RdmaListener {
        pub fn bind(address: std::net::SocketAddr, _port_id: u16) -> std::io::Result<RdmaListener> {
            Err(std::io::Error::other(format!(
                "rdma:{address}: this usnvme was built without NVMe/RDMA: install rdma-core's \
                 development files (Debian: apt-get install libibverbs-dev librdmacm-dev \
                 libclang-dev pkg-config) and build with `cargo build --release --features \
                 usnvme-tools/rdma`"
            )))
        }

        pub fn port(&self) -> &Listener {
            match self.never {}
        }

        pub fn as_fd(&self) -> std::os::fd::BorrowedFd<'_> {
            match self.never {}
        }

        pub fn accept(&self, _max: u16, _inboxes: &[Inbox], _next: &mut usize) -> bool {
            match self.never {}
        }
    }
}
pub use smart::{SmartService, SmartSlot};

/// How long a stopping target waits for connections to drain and flush.
const STOP_GRACE: Duration = Duration::from_secs(5);
/// Connection tokens: the engine token is the connection's slot here, then the command's.
const TOKEN_BITS: u32 = 16;

/// How a reactor spends a stretch without work.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum IdleMode {
    /// Polls on: the lowest latency, a whole core per reactor even with no host.
    Poll,
    /// Polls while there is work; after [`IDLE_AFTER`] without any, with nothing in flight on
    /// the drives and nothing waiting to be sent, sleeps in `epoll_wait` on its sockets (at most
    /// [`SLEEP_AT_MOST`] at a time, for its timers and new connections).
    #[default]
    Adaptive,
    /// The drives' queue pairs raise interrupts (an MSI-X vector each, an eventfd through
    /// VFIO): a reactor sleeps as soon as a turn finds nothing to do, also with I/O in flight on
    /// the drives, until a socket, its inbox or a drive's completion wakes it (at most
    /// [`SLEEP_AT_MOST`]). The least CPU; each wake-up costs a few microseconds of latency.
    Interrupt,
}

/// Idle this long, an adaptive reactor sleeps: longer than the gaps between a busy host's
/// commands, so that under load it never does.
const IDLE_AFTER: Duration = Duration::from_millis(2);
/// The longest sleep: the Keep Alive timers, SMART answers and drive events are seen within
/// this (a socket's news, a new connection and a stop wake the reactor at once).
const SLEEP_AT_MOST: Duration = Duration::from_millis(250);

/// What every reactor's job shares.
#[derive(Clone)]
pub struct Shared {
    pub subsystems: Arc<Subsystems>,
    pub registry: Arc<Registry>,
    pub limits: ConnectionLimits,
    /// Reads SMART / Health of the drives on its own thread (it takes milliseconds).
    pub smart: SmartService,
    pub idle: IdleMode,
    /// Set when the target stops.
    pub stop: Arc<AtomicBool>,
    pub counters: Arc<Counters>,
}

impl std::fmt::Debug for Shared {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Shared")
            .field("subsystems", &self.subsystems.list.len())
            .finish()
    }
}

/// How a connection reaches its host.
enum Link {
    Tcp(TcpStream),
    #[cfg(feature = "rdma")]
    Rdma(rdma::QueuePair),
}

/// A connection on this reactor.
struct Conn {
    link: Link,
    conn: Connection,
    /// Each command slot's DMA buffer while it has one.
    buffers: Vec<Option<DmaBuffer>>,
    /// Where its SMART answers arrive, and whether one is asked for.
    smart: Arc<SmartSlot>,
    smart_asked: bool,
    /// Worth a receive this turn: the socket has bytes (or news: end, error), or the last
    /// receive paused with bytes of its own left to process.
    readable: bool,
}

/// The DMA buffers each reactor keeps for its commands' data: `count` of `size` bytes, and
/// `large` of the subsystem's largest transfer for the commands beyond `size` (a few: hosts
/// send most I/O small; a 1 MiB buffer for each of the many would take 8 times the memory).
#[derive(Debug, Clone, Copy)]
pub struct ReactorBuffers {
    pub size: usize,
    pub count: usize,
    pub large: usize,
}

/// The job of one reactor.
pub struct ServeJob {
    shared: Shared,
    inbox: Inbox,
    conns: Vec<Option<Conn>>,
    pools: Option<Pools>,
    buffers: ReactorBuffers,
    completions: Vec<(u64, Result<(), Status>)>,
    stopping_since: Option<Instant>,
    busy: BusyClock,
    /// Since when (the reactor's clock) no turn did work.
    idle_since: Option<Duration>,
    /// Devices whose namespaces were removed, to let go of once nothing is in flight on them.
    letting_go: Vec<usize>,
    /// Commands waiting for a DMA buffer or room in their device's queue, in arrival order.
    waiting: Waiting,
    /// The reactor's NVMe/RDMA side, from its first RDMA connection on.
    #[cfg(feature = "rdma")]
    rdma: Option<rdma::RdmaSide>,
}

impl std::fmt::Debug for ServeJob {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let open = self.conns.iter().filter(|c| c.is_some()).count();
        f.debug_struct("ServeJob")
            .field("connections", &open)
            .finish()
    }
}

impl ServeJob {
    /// `inbox`: where the acceptor gives this reactor its connections; `buffers`: the DMA
    /// buffers this reactor keeps for its commands' data.
    pub fn new(shared: Shared, inbox: Inbox, buffers: ReactorBuffers) -> Self {
        ServeJob {
            shared,
            inbox,
            conns: Vec::new(),
            pools: None,
            buffers,
            completions: Vec::with_capacity(1024),
            stopping_since: None,
            busy: BusyClock::default(),
            idle_since: None,
            letting_go: Vec::new(),
            waiting: Waiting::default(),
            #[cfg(feature = "rdma")]
            rdma: None,
        }
    }

    /// Applies the changes of the target handed to this reactor: channels to added devices are
    /// opened (before any connection can name them), the connections get the new subsystems,
    /// and removed devices are let go of once nothing is in flight on them.
    fn apply_changes(&mut self, ctx: &mut ReactorContext) {
        while let Ok(change) = self.inbox.changes_rx.try_recv() {
            let mut result = Ok(());
            for (index, new) in change.added {
                let opened = if index == ctx.devices.len() {
                    ctx.add_device(index, &new.device, new.controllers)
                } else {
                    // (cannot happen: every reactor takes every change, in order)
                    Err(format!(
                        "{}: out of step: device {index} added to a reactor with {} devices",
                        new.device.info().name,
                        ctx.devices.len()
                    ))
                };
                result = result.and(opened);
            }
            self.waiting.size_for(0, ctx.devices.len());
            self.letting_go.extend(change.removed);
            for c in self.conns.iter_mut().flatten() {
                c.conn.set_subsystems(change.subsystems.clone());
            }
            self.shared.subsystems = change.subsystems;
            let _ = change.done.send(result);
        }
        // (a removed drive's I/Os in flight are failed within the stall probe)
        let letting_go = std::mem::take(&mut self.letting_go);
        for i in letting_go {
            if !ctx.let_go(i, "its namespace was removed") {
                self.letting_go.push(i);
            }
        }
    }

    /// How long the next readiness poll may wait: an adaptive reactor idle for [`IDLE_AFTER`],
    /// with nothing in flight, to send or to accept, sleeps until a socket has news; one on
    /// interrupts sleeps after any turn without work, I/O in flight or not (a drive's
    /// completion wakes it).
    fn sleep(&self, now: Duration) -> Duration {
        let idle_for = |at_least: Duration| {
            self.idle_since
                .is_some_and(|since| now.saturating_sub(since) >= at_least)
        };
        let (idle, drives_wake_us) = match self.shared.idle {
            IdleMode::Poll => (false, false),
            IdleMode::Adaptive => (idle_for(IDLE_AFTER), false),
            IdleMode::Interrupt => (idle_for(Duration::ZERO), true),
        };
        let quiet = idle
            && self.stopping_since.is_none()
            && self.inbox.is_empty()
            && self.waiting.is_empty()
            && self.conns.iter().flatten().all(|c| {
                // (a reactor with RDMA connections polls its completion queue: no sleep)
                matches!(c.link, Link::Tcp(_))
                    && !c.readable
                    && !c.smart_asked
                    && !c.conn.has_outgoing()
                    && (drives_wake_us || c.conn.in_flight_submitted() == 0)
            });
        if quiet {
            SLEEP_AT_MOST
        } else {
            Duration::ZERO
        }
    }

    /// Waits (at most `timeout`) on the reactor's wait and marks the connections whose sockets
    /// have something to read; true when one has, or the inbox rang. (A drive's interrupt
    /// only ends the wait: the drives are polled every turn anyway.)
    fn poll_readiness(&mut self, ctx: &mut ReactorContext, timeout: Duration) -> bool {
        let (conns, bell) = (&mut self.conns, &self.inbox.bell);
        let mut news = false;
        ctx.wait(timeout, |token| match token {
            INTERRUPT => {}
            BELL => {
                news = true;
                let _ = bell.read(); // (accept looks at the inbox anyway)
            }
            slot => {
                news = true;
                if let Some(Some(c)) = conns.get_mut(slot as usize) {
                    c.readable = true;
                }
            }
        });
        news
    }

    fn accept(&mut self, ctx: &ReactorContext) {
        while let Ok(Incoming {
            stream,
            peer,
            port_id,
        }) = self.inbox.rx.try_recv()
        {
            let set_up = stream
                .set_nonblocking(true)
                .and_then(|()| stream.set_nodelay(true))
                .and_then(|()| stream.local_addr());
            let address = match set_up {
                Ok(address) => address,
                Err(e) => {
                    log::warn!("{peer}: cannot set up the socket: {e}");
                    continue;
                }
            };
            let conn = Connection::new(
                self.shared.subsystems.clone(),
                self.shared.registry.clone(),
                self.shared.limits,
                peer,
            )
            .on_port(Listener {
                address,
                port_id,
                transport: Transport::Tcp,
            });
            let entries = self.shared.subsystems.base.queue_entries as usize;
            let c = Conn {
                link: Link::Tcp(stream),
                conn,
                buffers: (0..entries).map(|_| None).collect(),
                smart: Arc::new(SmartSlot::default()),
                smart_asked: false,
                readable: true,
            };
            let slot = self.free_slot();
            if let Link::Tcp(stream) = &c.link {
                if let Err(e) = ctx.watch(stream.as_fd(), slot as u64) {
                    log::warn!("{:?}: cannot watch the socket: {e}", c.conn);
                    continue;
                }
            }
            self.add_conn(slot, c);
        }
        #[cfg(feature = "rdma")]
        self.accept_rdma();
    }

    /// A free connection slot.
    fn free_slot(&mut self) -> usize {
        match self.conns.iter().position(Option::is_none) {
            Some(free) => free,
            None => {
                self.conns.push(None);
                self.conns.len() - 1
            }
        }
    }

    fn add_conn(&mut self, slot: usize, c: Conn) {
        let entries = self.shared.subsystems.base.queue_entries as usize;
        self.conns[slot] = Some(c);
        // every command of every connection may have to wait: room for all of them
        self.waiting.size_for(self.conns.len() * entries, 0);
        self.shared
            .counters
            .connections
            .fetch_add(1, Ordering::Relaxed);
    }

    /// The NVMe/RDMA connections handed to this reactor: each gets its queue pair on the
    /// reactor's protection domain and completion queue, and is accepted.
    #[cfg(feature = "rdma")]
    fn accept_rdma(&mut self) {
        while let Ok(incoming) = self.inbox.rdma_rx.try_recv() {
            let Some(pools) = &self.pools else {
                return;
            };
            if self.rdma.is_none() {
                // a completion per send and receive of every connection the reactor may have
                let in_capsule = self.shared.subsystems.base.in_capsule_bytes;
                match rdma::RdmaSide::new(&incoming.id, pools, 1 << 15, in_capsule) {
                    Ok(side) => self.rdma = Some(side),
                    Err(e) => {
                        log::warn!("{}: RDMA on this reactor: {e}", incoming.peer);
                        rdma::reject_no_resources(&incoming.id);
                        continue;
                    }
                }
            }
            let slot = self.free_slot();
            let Some(side) = &mut self.rdma else {
                continue;
            };
            let qp = match rdma::QueuePair::accept(side, incoming.id, incoming.request, slot) {
                Ok(qp) => qp,
                Err(e) => {
                    log::warn!("{}: cannot accept the RDMA connection: {e}", incoming.peer);
                    continue;
                }
            };
            log::info!(
                "{}: connected over RDMA (queue {})",
                incoming.peer,
                incoming.request.qid
            );
            let conn = Connection::new(
                self.shared.subsystems.clone(),
                self.shared.registry.clone(),
                self.shared.limits,
                incoming.peer,
            )
            .on_port(incoming.port)
            .rdma();
            let entries = self.shared.subsystems.base.queue_entries as usize;
            let c = Conn {
                link: Link::Rdma(qp),
                conn,
                buffers: (0..entries).map(|_| None).collect(),
                smart: Arc::new(SmartSlot::default()),
                smart_asked: false,
                readable: false,
            };
            self.add_conn(slot, c);
        }
    }

    /// The RDMA completions of this turn, to their connections, and the CM's news (a host
    /// that disconnected).
    #[cfg(feature = "rdma")]
    fn poll_rdma(&mut self, ctx: &mut ReactorContext) -> bool {
        let Some(side) = self.rdma.as_mut() else {
            return false;
        };
        let (Some(pool), conns, waiting, shared) = (
            self.pools.as_mut(),
            &mut self.conns,
            &mut self.waiting,
            &self.shared,
        ) else {
            return false;
        };
        while let Ok(Some(ev)) = side.channel.next() {
            if ev.kind != crate::transport::rdma::verbs::CmEventKind::Disconnected {
                continue;
            }
            for (slot, entry) in conns.iter_mut().enumerate() {
                let Some(c) = entry else { continue };
                let Link::Rdma(qp) = &mut c.link else {
                    continue;
                };
                if qp.cm_id() != ev.id {
                    continue;
                }
                qp.disconnect();
                let (conn, _, mut backend) =
                    ReactorBackend::new(&mut ctx.devices, pool, c, slot, shared, waiting);
                conn.peer_gone("the host disconnected", &mut backend);
            }
        }
        let mut busy = false;
        loop {
            let polled = side.poll(|side, wc| {
                let conn = side.slot_of(&wc).and_then(|slot| {
                    let c = conns.get_mut(slot)?.as_mut()?;
                    match &c.link {
                        Link::Rdma(qp) if qp.qp_num() == wc.qp_num => Some((slot, c)),
                        _ => None,
                    }
                });
                let Some((slot, c)) = conn else {
                    side.unclaimed(wc); // a late one of a connection gone
                    return;
                };
                let (conn, link, mut backend) =
                    ReactorBackend::new(&mut ctx.devices, pool, c, slot, shared, waiting);
                if let Link::Rdma(qp) = link {
                    qp.on_completion(wc, slot, conn, &mut backend, side);
                }
            });
            match polled {
                Ok(n) if n > 0 => busy = true,
                Ok(_) => break,
                Err(e) => {
                    log::warn!("RDMA completions: {e}");
                    break;
                }
            }
        }
        busy
    }
}

impl Job for ServeJob {
    type Output = ();

    fn prepare(&mut self, ctx: &mut ReactorContext) -> Result<(), String> {
        let device = ctx.devices.first().ok_or("no device")?;
        let largest = self.shared.subsystems.base.max_transfer as usize;
        let ReactorBuffers { size, count, large } = self.buffers;
        let pool = |size, count| {
            device
                .buffer_pool(size, count)
                .map_err(|e| format!("DMA buffers for the target: {e}"))
        };
        let (usual, large) = if size >= largest || large == 0 {
            (pool(largest, count)?, None)
        } else {
            (pool(size, count)?, Some(pool(largest, large)?))
        };
        self.pools = Some(Pools { usual, large });
        ctx.watch(self.inbox.bell.as_fd(), BELL)
            .map_err(|e| format!("watching the target's inbox: {e}"))?;
        self.waiting.size_for(0, ctx.devices.len());
        // the reactor's CPU time counts from here, its set-up left out
        self.busy.cpu_ns = thread_cpu_ns();
        Ok(())
    }

    fn turn(&mut self, ctx: &mut ReactorContext) -> bool {
        self.apply_changes(ctx);
        if self.stopping_since.is_none() {
            if self.shared.stop.load(Ordering::Acquire) {
                self.stopping_since = Some(Instant::now());
            } else {
                self.accept(ctx); // new connections only while running
            }
        }
        let timeout = self.sleep(ctx.now());
        let mut busy = self.poll_readiness(ctx, timeout);
        #[cfg(feature = "rdma")]
        {
            busy |= self.poll_rdma(ctx);
        }
        let Some(pool) = self.pools.as_mut() else {
            return false;
        };
        let now = Instant::now();
        let shared = &self.shared;
        let stopping = self.stopping_since.is_some();
        for (slot, entry) in self.conns.iter_mut().enumerate() {
            let Some(c) = entry else {
                continue;
            };
            let readable = std::mem::take(&mut c.readable) || stopping;
            let (conn, link, mut backend) =
                ReactorBackend::new(&mut ctx.devices, pool, c, slot, shared, &mut self.waiting);
            if stopping {
                conn.shut_down(&mut backend);
            }
            conn.tick(now, &mut backend);
            let Link::Tcp(stream) = link else {
                continue; // (RDMA capsules come as completions)
            };
            if !readable {
                continue;
            }
            // Read what arrived: headers into the connection, write data straight into the
            // commands' DMA buffers.
            let paused = match conn.receive_from(stream, &mut backend) {
                Ok(Receive::Ended) => {
                    conn.peer_gone("the host closed the connection", &mut backend);
                    false
                }
                Ok(Receive::Drained) => false,
                Ok(Receive::Paused) => true,
                Err(e) => {
                    conn.peer_gone(&format!("connection error: {e}"), &mut backend);
                    false
                }
            };
            // a paused connection has bytes of its own left: receive again next turn,
            // whatever the socket says
            c.readable = paused;
        }
        // Completions of every device, to their connections.
        self.completions.clear();
        for d in ctx.devices.iter_mut() {
            d.flush();
            let completions = &mut self.completions;
            d.poll(|c| {
                let result = match c.result() {
                    Ok(()) => Ok(()),
                    Err(e) => Err(e.status()),
                };
                completions.push((c.token, result));
            });
        }
        if !self.completions.is_empty() {
            busy = true;
            self.waiting.gate.freed(); // room in the devices' queues
        }

        for &(token, result) in &self.completions {
            let slot = (token >> TOKEN_BITS) as usize;
            let command = (token & 0xffff) as u16;
            if let Some(Some(c)) = self.conns.get_mut(slot) {
                let (conn, _, mut backend) =
                    ReactorBackend::new(&mut ctx.devices, pool, c, slot, shared, &mut self.waiting);
                conn.complete(command, result, &mut backend);
                self.shared
                    .counters
                    .commands
                    .fetch_add(1, Ordering::Relaxed);
            }
        }
        // Commands that waited for a buffer or room, in order, now that some may be free.
        let idle = || ctx.devices.iter().all(|d| d.in_flight() == 0);
        let idle = !self.waiting.is_empty() && idle();
        if let Some(mut queue) = self.waiting.begin_retry(idle) {
            let before = queue.len();
            queue.retain(|w| {
                let slot = w.conn as usize;
                let Some(Some(c)) = self.conns.get_mut(slot) else {
                    return false;
                };
                let (conn, _, mut backend) =
                    ReactorBackend::new(&mut ctx.devices, pool, c, slot, shared, &mut self.waiting);
                !conn.resume(w.token, &mut backend)
            });
            busy |= queue.len() < before;
            self.waiting.end_retry(queue);
        }
        let waited = self.waiting.take_waited();
        if waited > 0 {
            let counters = &shared.counters;
            counters
                .commands_waited
                .fetch_add(waited, Ordering::Relaxed);
        }
        // Send, and let go of connections that are over.
        for (slot, entry) in self.conns.iter_mut().enumerate() {
            let Some(c) = entry else {
                continue;
            };
            // Send: headers and read data from the DMA buffers, gathered in one writev.
            // over RDMA: what the connection asked for this turn, posted
            #[cfg(feature = "rdma")]
            if let (Link::Rdma(qp), Some(side)) = (&mut c.link, &self.rdma) {
                qp.carry_out(slot, &mut c.conn, &c.buffers, side);
            }
            let (conn, link, mut backend) =
                ReactorBackend::new(&mut ctx.devices, pool, c, slot, shared, &mut self.waiting);
            if let Link::Tcp(stream) = link {
                match conn.transmit(stream, &mut backend) {
                    Ok(0) => {}
                    Ok(n) => {
                        busy = true;
                        shared.counters.bytes.fetch_add(n as u64, Ordering::Relaxed);
                    }
                    Err(e) => conn.peer_gone(&format!("connection error: {e}"), &mut backend),
                }
            }
            if let Some(why) = c.conn.finished() {
                log::info!("{:?}: closed: {why}", c.conn);
                self.shared
                    .counters
                    .data_copied
                    .fetch_add(c.conn.copied(), Ordering::Relaxed);
                if let Link::Tcp(stream) = &c.link {
                    ctx.unwatch(stream.as_fd());
                    let _ = stream.shutdown(std::net::Shutdown::Both);
                }
                #[cfg(feature = "rdma")]
                let qp_num = match &c.link {
                    Link::Rdma(qp) => Some(qp.qp_num()),
                    Link::Tcp(_) => None,
                };
                *entry = None; // (an RDMA connection's queue pair destroyed)
                #[cfg(feature = "rdma")]
                if let (Some(qp_num), Some(side)) = (qp_num, &mut self.rdma) {
                    side.closed(qp_num);
                }
                self.waiting.forget(slot as u32);
                self.shared
                    .counters
                    .connections
                    .fetch_sub(1, Ordering::Relaxed);
            }
        }
        self.busy
            .turn(ctx.now().as_nanos() as u64, busy, &self.shared.counters);
        if busy {
            self.idle_since = None;
        } else {
            self.idle_since.get_or_insert(ctx.now());
        }
        match self.stopping_since {
            None => true,
            Some(since) => {
                let open = self.conns.iter().any(Option::is_some);
                open && since.elapsed() < STOP_GRACE
            }
        }
    }

    fn finish(mut self, _ctx: &mut ReactorContext) {
        self.busy.publish(&self.shared.counters);
    }
}
