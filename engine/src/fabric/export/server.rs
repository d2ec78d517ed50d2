//! The target on the engine's reactors: each reactor runs a [`ServeJob`] that owns the
//! connections handed to it (non-blocking sockets, no thread per connection), feeds their
//! bytes to their [`Connection`]s, submits their commands on its own channels to the block
//! devices, and writes their responses. Data moves between the sockets and the reactor's DMA
//! buffers with no copy (`readv`/`writev`, see [`crate::fabric::framing::socket`]).

use std::net::TcpStream;
use std::os::fd::AsFd;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use crossbeam_channel::Receiver;
use nix::sys::eventfd::{EfdFlags, EventFd};
use usnvme_driver::spec::{SmartLog, Status};
use usnvme_driver::IoBuffer;
use usnvme_hugepages::{BufferPool, DmaBuffer};
use vm_memory::VolatileSlice;

use super::connection::{Backend, Connection, ConnectionLimits, Receive, Refused, Request};
use super::namespaces::NamespaceChange;
use super::registry::Registry;
use super::waiting::Waiting;
use super::{Listener, SubsystemInfo};
use crate::block::{BlockError, IoError};
use crate::engine::{DeviceChannel, Job, ReactorContext, INTERRUPT};

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
    pub subsystem: Arc<SubsystemInfo>,
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
            .field("subsystem", &self.subsystem.nqn)
            .finish()
    }
}

/// SMART reads queued to the worker at most (more wait in the hosts, answered "busy").
const SMART_QUEUE: usize = 64;

/// The thread that reads SMART / Health from the drives for the connections, so that no
/// reactor waits on a drive's admin queue: a connection's request goes to it with the
/// connection's answer slot, which the connection polls.
#[derive(Clone)]
pub struct SmartService {
    requests: crossbeam_channel::Sender<Arc<SmartSlot>>,
    /// Reads asked for and not answered yet.
    pending: Arc<AtomicU64>,
}

/// Where the SMART thread leaves one connection's answer.
#[derive(Debug, Default)]
pub struct SmartSlot {
    answer: parking_lot::Mutex<Option<SmartLog>>,
}

impl std::fmt::Debug for SmartService {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SmartService")
            .field("pending", &self.pending())
            .finish()
    }
}

impl SmartService {
    /// Starts the thread; `read` reads and aggregates the drives' logs. The thread ends when
    /// the last handle goes.
    pub fn start(read: impl Fn() -> SmartLog + Send + 'static) -> std::io::Result<SmartService> {
        let (requests, queue) = crossbeam_channel::bounded::<Arc<SmartSlot>>(SMART_QUEUE);
        let pending = Arc::new(AtomicU64::new(0));
        let done = pending.clone();
        std::thread::Builder::new()
            .name("usnvme-smart".into())
            .spawn(move || {
                while let Ok(slot) = queue.recv() {
                    let log = read();
                    *slot.answer.lock() = Some(log);
                    done.fetch_sub(1, Ordering::Release);
                }
            })?;
        Ok(SmartService { requests, pending })
    }

    /// Queues a read whose answer goes to `slot`; false when the queue is full.
    fn request(&self, slot: &Arc<SmartSlot>) -> bool {
        self.pending.fetch_add(1, Ordering::AcqRel);
        let sent = self.requests.try_send(slot.clone()).is_ok();
        if !sent {
            self.pending.fetch_sub(1, Ordering::AcqRel);
        }
        sent
    }

    /// SMART reads asked for and not answered yet.
    pub fn pending(&self) -> u64 {
        self.pending.load(Ordering::Acquire)
    }
}

/// Live figures for the status line.
#[derive(Debug, Default)]
pub struct Counters {
    pub connections: AtomicU64,
    pub commands: AtomicU64,
    /// Bytes sent to hosts.
    pub bytes: AtomicU64,
    /// DMA buffers held by commands now (0 when nothing is in flight: none leaked).
    pub buffers_in_use: AtomicU64,
    /// Commands that could not start when they came (no DMA buffer free, or no room in their
    /// device's queue) and waited for it, so far.
    pub commands_waited: AtomicU64,
    /// Write data that was read ahead with a header and copied into a DMA buffer, over the
    /// connections closed so far (the rest went straight from the socket into the buffers).
    pub data_copied: AtomicU64,
    /// Reactor time, summed over the reactors, and the part of it spent in turns that did
    /// work (bytes arrived, commands completed, responses went out): a polling reactor owns
    /// its core whole, but this is the share of it the target needed.
    pub reactor_ns: AtomicU64,
    pub reactor_busy_ns: AtomicU64,
    /// CPU time the reactor threads used (user and system): what sleeping saves.
    pub reactor_cpu_ns: AtomicU64,
}

/// How much reactor time a job gathers before it adds it to the shared counters (one shared
/// write per reactor every few milliseconds, not one per turn).
const PUBLISH_NS: u64 = 10_000_000;

/// One reactor's busy and total time since it last published them.
#[derive(Debug, Default)]
struct BusyClock {
    /// The reactor's clock at the previous turn, and whether that turn did work.
    last_turn_ns: Option<u64>,
    last_busy: bool,
    total_ns: u64,
    busy_ns: u64,
    /// The thread's CPU time when last published.
    cpu_ns: u64,
}

/// CPU time (user and system) of the calling thread, in nanoseconds.
fn thread_cpu_ns() -> u64 {
    use nix::sys::resource::{getrusage, UsageWho};
    getrusage(UsageWho::RUSAGE_THREAD).map_or(0, |u| {
        let ns = |t: nix::sys::time::TimeVal| {
            t.tv_sec() as u64 * 1_000_000_000 + t.tv_usec() as u64 * 1000
        };
        ns(u.user_time()) + ns(u.system_time())
    })
}

impl BusyClock {
    /// Charges the time since the previous turn to that turn; `busy`: this turn did work.
    fn turn(&mut self, now_ns: u64, busy: bool, counters: &Counters) {
        if let Some(last) = self.last_turn_ns {
            let spent = now_ns.saturating_sub(last);
            self.total_ns += spent;
            if self.last_busy {
                self.busy_ns += spent;
            }
        }
        self.last_turn_ns = Some(now_ns);
        self.last_busy = busy;
        if self.total_ns >= PUBLISH_NS {
            self.publish(counters);
        }
    }

    fn publish(&mut self, counters: &Counters) {
        counters
            .reactor_ns
            .fetch_add(std::mem::take(&mut self.total_ns), Ordering::Relaxed);
        counters
            .reactor_busy_ns
            .fetch_add(std::mem::take(&mut self.busy_ns), Ordering::Relaxed);
        let cpu = thread_cpu_ns();
        counters
            .reactor_cpu_ns
            .fetch_add(cpu.saturating_sub(self.cpu_ns), Ordering::Relaxed);
        self.cpu_ns = cpu;
    }
}

/// A connection on this reactor.
struct Conn {
    stream: TcpStream,
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

/// A connection the acceptor hands a reactor: its socket, the peer (for logs) and the ID of
/// the port (listener) it came in on.
#[derive(Debug)]
pub struct Incoming {
    pub stream: TcpStream,
    pub peer: String,
    pub port_id: u16,
}

/// A reactor's inbox of new connections and namespace changes: the sender's end sends and
/// rings the reactor's eventfd (which wakes it from an idle sleep); the reactor's end takes
/// them.
#[derive(Debug, Clone)]
pub struct Inbox {
    queue: crossbeam_channel::Sender<Incoming>,
    rx: Receiver<Incoming>,
    changes: crossbeam_channel::Sender<NamespaceChange>,
    changes_rx: Receiver<NamespaceChange>,
    bell: Arc<EventFd>,
}

impl Inbox {
    pub fn new() -> std::io::Result<Inbox> {
        let (queue, rx) = crossbeam_channel::unbounded();
        let (changes, changes_rx) = crossbeam_channel::unbounded();
        let bell =
            EventFd::from_value_and_flags(0, EfdFlags::EFD_NONBLOCK | EfdFlags::EFD_CLOEXEC)?;
        Ok(Inbox {
            queue,
            rx,
            changes,
            changes_rx,
            bell: Arc::new(bell),
        })
    }

    /// Hands the reactor a connection, and wakes it.
    pub fn send(&self, incoming: Incoming) {
        let _ = self.queue.send(incoming);
        self.wake();
    }

    /// Hands the reactor a change of the namespaces, and wakes it.
    pub(super) fn change(&self, change: NamespaceChange) {
        let _ = self.changes.send(change);
        self.wake();
    }

    /// Wakes the reactor (a stop, say).
    pub fn wake(&self) {
        let _ = self.bell.write(1);
    }

    /// Connections handed and not taken yet.
    pub fn len(&self) -> usize {
        self.queue.len()
    }

    pub fn is_empty(&self) -> bool {
        self.queue.is_empty() && self.changes.is_empty()
    }
}

/// The wait token of the inbox's eventfd (the sockets' is their slot).
const BELL: u64 = u64::MAX - 1;

/// The job of one reactor.
pub struct ServeJob {
    shared: Shared,
    inbox: Inbox,
    conns: Vec<Option<Conn>>,
    pool: Option<BufferPool>,
    buffers_per_reactor: usize,
    completions: Vec<(u64, Result<(), Status>)>,
    stopping_since: Option<Instant>,
    busy: BusyClock,
    /// Since when (the reactor's clock) no turn did work.
    idle_since: Option<Duration>,
    /// Devices whose namespaces were removed, to let go of once nothing is in flight on them.
    letting_go: Vec<usize>,
    /// Commands waiting for a DMA buffer or room in their device's queue, in arrival order.
    waiting: Waiting,
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
    /// `inbox`: where the acceptor gives this reactor its connections; `buffers`: DMA buffers
    /// of `max_transfer` bytes this reactor keeps for its commands' data.
    pub fn new(shared: Shared, inbox: Inbox, buffers: usize) -> Self {
        ServeJob {
            shared,
            inbox,
            conns: Vec::new(),
            pool: None,
            buffers_per_reactor: buffers,
            completions: Vec::with_capacity(1024),
            stopping_since: None,
            busy: BusyClock::default(),
            idle_since: None,
            letting_go: Vec::new(),
            waiting: Waiting::default(),
        }
    }

    /// Applies the namespace changes handed to this reactor: channels to added devices are
    /// opened (before any connection can name them), the connections get the new subsystem,
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
                c.conn.set_subsystem(change.subsystem.clone());
            }
            self.shared.subsystem = change.subsystem;
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
                !c.readable
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
                self.shared.subsystem.clone(),
                self.shared.registry.clone(),
                self.shared.limits,
                peer,
            )
            .on_port(Listener { address, port_id });
            let entries = self.shared.subsystem.queue_entries as usize;
            let c = Conn {
                stream,
                conn,
                buffers: (0..entries).map(|_| None).collect(),
                smart: Arc::new(SmartSlot::default()),
                smart_asked: false,
                readable: true,
            };
            let slot = match self.conns.iter().position(Option::is_none) {
                Some(free) => free,
                None => {
                    self.conns.push(None);
                    self.conns.len() - 1
                }
            };
            if let Err(e) = ctx.watch(c.stream.as_fd(), slot as u64) {
                log::warn!("{:?}: cannot watch the socket: {e}", c.conn);
                continue;
            }
            self.conns[slot] = Some(c);
            // every command of every connection may have to wait: room for all of them
            self.waiting.size_for(self.conns.len() * entries, 0);
            self.shared
                .counters
                .connections
                .fetch_add(1, Ordering::Relaxed);
        }
    }
}

/// A connection's view of the reactor: its channels and buffers.
struct ReactorBackend<'a> {
    devices: &'a mut [DeviceChannel],
    pool: &'a mut BufferPool,
    buffers: &'a mut [Option<DmaBuffer>],
    slot: usize,
    waiting: &'a mut Waiting,
    smart: &'a SmartService,
    smart_slot: &'a Arc<SmartSlot>,
    smart_asked: &'a mut bool,
    in_use: &'a AtomicU64,
}

impl<'a> ReactorBackend<'a> {
    fn new(
        devices: &'a mut [DeviceChannel],
        pool: &'a mut BufferPool,
        c: &'a mut Conn,
        slot: usize,
        shared: &'a Shared,
        waiting: &'a mut Waiting,
    ) -> (&'a mut Connection, &'a mut TcpStream, Self) {
        let backend = ReactorBackend {
            devices,
            pool,
            buffers: &mut c.buffers,
            slot,
            waiting,
            smart: &shared.smart,
            smart_slot: &c.smart,
            smart_asked: &mut c.smart_asked,
            in_use: &shared.counters.buffers_in_use,
        };
        (&mut c.conn, &mut c.stream, backend)
    }
}

impl Backend for ReactorBackend<'_> {
    fn reserve(&mut self, token: u16, len: usize) -> bool {
        let Some(entry) = self.buffers.get_mut(token as usize) else {
            return false;
        };
        // (never larger: the pool's buffers are of the largest transfer the target lets in)
        debug_assert!(len <= self.pool.buffer_size());
        if entry.is_none() {
            // none taken ahead of a command that waits for one
            if !self.waiting.gate.buffers_open() {
                return false;
            }
            *entry = self.pool.alloc();
            match entry {
                Some(_) => {
                    self.in_use.fetch_add(1, Ordering::Relaxed);
                }
                None => self.waiting.gate.no_buffer(),
            }
        }
        entry.is_some()
    }

    fn buffer(&self, token: u16) -> Option<VolatileSlice<'_>> {
        self.buffers
            .get(token as usize)?
            .as_ref()
            .map(DmaBuffer::as_volatile_slice)
    }

    fn submit(&mut self, token: u16, request: Request) -> Result<(), Refused> {
        let Request { op, len, .. } = request;
        // none submitted ahead of a command that waits for room on the same device
        if !self.waiting.gate.room_open(request.device) {
            return Err(Refused::Busy);
        }
        let buf = match self.buffers.get(token as usize) {
            Some(Some(b)) if op.has_data() => Some(IoBuffer {
                iova: b.iova(),
                len: len as u32,
            }),
            _ => None,
        };
        let engine_token = ((self.slot as u64) << TOKEN_BITS) | u64::from(token);
        let device = self
            .devices
            .get_mut(request.device)
            .ok_or(Refused::Failed(Status::INVALID_NAMESPACE))?;
        let Err(e) = device.submit(op, request.offset, len, buf, engine_token) else {
            return Ok(());
        };
        if let BlockError::Busy { needed, .. } = e {
            // Room comes as the reactor's I/O completes; with none in flight, a command of
            // several parts that finds no room never will (more parts than the queue holds).
            let idle = self.devices.iter().all(|d| d.in_flight() == 0);
            if needed < 2 || !idle {
                self.waiting.gate.no_room(request.device);
                return Err(Refused::Busy);
            }
            log::error!("{e}, and nothing in flight frees any: the command fails");
            return Err(Refused::Failed(Status::INTERNAL_ERROR));
        }
        log::warn!("{e}");
        Err(Refused::Failed(refusal_status(&e)))
    }

    fn wait(&mut self, token: u16) {
        self.waiting.push(self.slot as u32, token);
    }

    fn release(&mut self, token: u16) {
        if let Some(entry) = self.buffers.get_mut(token as usize) {
            if let Some(b) = entry.take() {
                self.in_use.fetch_sub(1, Ordering::Relaxed);
                let _ = self.pool.free(b);
                self.waiting.gate.freed();
            }
        }
    }

    fn smart_request(&mut self) -> bool {
        if !*self.smart_asked {
            *self.smart_asked = self.smart.request(self.smart_slot);
        }
        *self.smart_asked
    }

    fn smart_answer(&mut self) -> Option<SmartLog> {
        if !*self.smart_asked {
            return None;
        }
        let answer = self.smart_slot.answer.lock().take();
        *self.smart_asked = answer.is_none();
        answer
    }
}

impl Job for ServeJob {
    type Output = ();

    fn prepare(&mut self, ctx: &mut ReactorContext) -> Result<(), String> {
        let device = ctx.devices.first().ok_or("no device")?;
        let size = self.shared.subsystem.max_transfer as usize;
        let pool = device
            .buffer_pool(size, self.buffers_per_reactor)
            .map_err(|e| format!("DMA buffers for the target: {e}"))?;
        self.pool = Some(pool);
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
        let Some(pool) = self.pool.as_mut() else {
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
            let (conn, stream, mut backend) =
                ReactorBackend::new(&mut ctx.devices, pool, c, slot, shared, &mut self.waiting);
            if stopping {
                conn.shut_down(&mut backend);
            }
            conn.tick(now, &mut backend);
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
                    Err(e) => Err(status_of(&e)),
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
            let (conn, stream, mut backend) =
                ReactorBackend::new(&mut ctx.devices, pool, c, slot, shared, &mut self.waiting);
            match conn.transmit(stream, &mut backend) {
                Ok(0) => {}
                Ok(n) => {
                    busy = true;
                    shared.counters.bytes.fetch_add(n as u64, Ordering::Relaxed);
                }
                Err(e) => conn.peer_gone(&format!("connection error: {e}"), &mut backend),
            }
            if let Some(why) = c.conn.finished() {
                log::info!("{:?}: closed: {why}", c.conn);
                self.shared
                    .counters
                    .data_copied
                    .fetch_add(c.conn.copied(), Ordering::Relaxed);
                ctx.unwatch(c.stream.as_fd());
                let _ = c.stream.shutdown(std::net::Shutdown::Both);
                *entry = None;
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

/// The NVMe status a failed block I/O is answered with.
fn status_of(e: &IoError) -> Status {
    e.status()
}

/// The NVMe status of a block device's refusal to take a request (other than for want of
/// room, which waits).
fn refusal_status(e: &BlockError) -> Status {
    use usnvme_driver::SubmitError;
    match e {
        BlockError::OutOfRange { .. } => Status::LBA_OUT_OF_RANGE,
        BlockError::Submit {
            source: SubmitError::InvalidNamespace { .. },
            ..
        } => Status::INVALID_NAMESPACE,
        // the device is gone or failed (a hot-removed drive, a target given up)
        BlockError::Submit {
            source: SubmitError::Dead,
            ..
        } => Status::NAMESPACE_NOT_READY,
        _ => Status::INTERNAL_ERROR,
    }
}

#[cfg(test)]
mod tests {
    use super::{BusyClock, Counters, PUBLISH_NS};
    use std::sync::atomic::Ordering;

    #[test]
    fn a_turns_time_is_busy_only_when_it_did_work_and_is_published_in_batches() {
        let counters = Counters::default();
        let mut clock = BusyClock::default();
        let ms = 1_000_000;
        // turns at 0, 1, 2, 3 ms: the first and third did work
        clock.turn(0, true, &counters);
        clock.turn(ms, false, &counters);
        clock.turn(2 * ms, true, &counters);
        clock.turn(3 * ms, false, &counters);
        // under PUBLISH_NS gathered: nothing shared yet
        assert_eq!(counters.reactor_ns.load(Ordering::Relaxed), 0);
        // a long idle stretch crosses the batch: published, 2 ms of 3 + 20 busy
        clock.turn(3 * ms + 2 * PUBLISH_NS, false, &counters);
        assert_eq!(
            counters.reactor_ns.load(Ordering::Relaxed),
            3 * ms + 2 * PUBLISH_NS
        );
        assert_eq!(counters.reactor_busy_ns.load(Ordering::Relaxed), 2 * ms);
        // what is left is published at the end
        clock.turn(3 * ms + 2 * PUBLISH_NS + ms, true, &counters);
        clock.publish(&counters);
        assert_eq!(
            counters.reactor_ns.load(Ordering::Relaxed),
            4 * ms + 2 * PUBLISH_NS
        );
        assert_eq!(counters.reactor_busy_ns.load(Ordering::Relaxed), 2 * ms);
    }
}
