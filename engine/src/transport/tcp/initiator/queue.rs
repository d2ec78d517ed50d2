//! An NVMe/TCP queue on a socket, owned by one reactor thread: [`QueueSetup`] sets it up
//! without waiting (TCP, ICReq/ICResp, Fabrics Connect; [`IoQueue::connect`] waits on it for
//! callers that may), then the socket is polled: [`IoQueue::submit`] only queues, [`IoQueue::poll`]
//! sends everything queued in one `writev` (headers and write data gathered straight from the
//! DMA buffers), receives what came (many PDUs per `readv`, read data into the DMA buffers,
//! copied once at most) and hands completions to the caller; a turn asks the socket only
//! where the thread's readiness watch (one `epoll_wait` a turn for all its queues) says it
//! has something. No allocation, lock or system call per I/O beyond those. [`IoQueue::wait`]
//! sleeps until the socket has something for `poll`: the admin queue's client
//! ([`super::command::CommandQueue`]) waits on it for one command.

use std::io::ErrorKind;
use std::net::{Shutdown, SocketAddr, TcpStream};
use std::os::fd::AsFd;
use std::sync::Arc;
use std::time::{Duration, Instant};

use nix::sys::epoll::{Epoll, EpollCreateFlags, EpollEvent, EpollFlags, EpollTimeout};
use usnvme_driver::spec::Sqe;
use usnvme_driver::{IoBuffer, SubmitError};
use usnvme_hugepages::{IovaMemory, IovaSpace};
use vm_memory::VolatileSlice;

use crate::fabric::framing::socket::ReadWire;

use super::options::{HostError, HostOptions};
use super::readiness::Watched;
use super::session::{
    Completion, Data, Failure, IoNamespace, QueueParams, Receive, Session, Unfinished,
};
use crate::transport::Op;

/// Where the queue's I/O buffers live.
#[derive(Debug, Clone)]
pub enum Buffers {
    /// An IOVA space: buffers are its DMA regions (taken again when a buffer mapped after the
    /// last snapshot is submitted).
    Space(Arc<IovaSpace>),
    /// A fixed address space (tests).
    Memory(Arc<IovaMemory>),
}

impl Buffers {
    pub(crate) fn snapshot(&self) -> Arc<IovaMemory> {
        match self {
            Buffers::Space(space) => space.memory(),
            Buffers::Memory(mem) => mem.clone(),
        }
    }
}

/// One I/O queue of a remote controller.
#[derive(Debug)]
pub struct IoQueue {
    stream: TcpStream,
    /// The socket in its polling thread's readiness watch (joined on the first turn with the
    /// owner's clock), and whether it tried.
    watched: Option<Watched>,
    watch_tried: bool,
    /// The owner's clock reading for this turn: names the turn.
    turn: u64,
    session: Session,
    buffers: Buffers,
    memory: Arc<IovaMemory>,
    epoch: Instant,
    /// The owner gives the clock ([`IoQueue::set_now`]); else `poll` reads it.
    owner_clock: bool,
    /// The socket was shut down (the queue ended and its I/Os were failed).
    closed: bool,
    /// For [`IoQueue::wait`], made on its first call, and whether it watches for room to send.
    waiter: Option<(Epoll, bool)>,
}

/// An I/O queue being set up without waiting: the TCP connect under way (a non-blocking
/// socket), then ICReq / ICResp and the Fabrics Connect as PDUs, moved on by
/// [`QueueSetup::step`], which never blocks. A reactor that reconnects a queue calls it in its
/// turns, so that its other devices are served meanwhile; [`IoQueue::connect`] waits on it.
#[derive(Debug)]
pub struct QueueSetup {
    queue: IoQueue,
    addr: SocketAddr,
    deadline: Instant,
}

impl QueueSetup {
    /// Starts setting up queue `params.qid` of controller `params.cntlid` at `addr` (QID 0: an
    /// admin queue, the controller is the target's choice); `host.timeout` bounds it.
    pub fn start(
        addr: SocketAddr,
        params: QueueParams,
        host: &HostOptions,
        buffers: Buffers,
    ) -> Result<QueueSetup, HostError> {
        if host.timeout.is_zero() {
            return Err(HostError::InvalidArgument("the timeout must not be zero"));
        }
        let deadline = Instant::now()
            .checked_add(host.timeout)
            .ok_or(HostError::InvalidArgument("the timeout is too long"))?;
        let session = Session::new(params, host)?;
        let stream = connect_nonblocking(addr)?;
        let memory = buffers.snapshot();
        let queue = IoQueue {
            stream,
            watched: None,
            watch_tried: false,
            turn: 0,
            session,
            buffers,
            memory,
            epoch: Instant::now(),
            owner_clock: false,
            closed: false,
            waiter: None,
        };
        Ok(QueueSetup {
            queue,
            addr,
            deadline,
        })
    }

    /// Moves the set-up on as far as it goes now: true once the Connect is answered (then
    /// [`QueueSetup::into_queue`]); an error once it failed or ran out of time.
    pub fn step(&mut self) -> Result<bool, HostError> {
        let q = &mut self.queue;
        if let Some(e) = q.stream.take_error()? {
            return Err(match e.kind() {
                ErrorKind::ConnectionRefused => HostError::Refused { addr: self.addr },
                _ => HostError::Io(e),
            });
        }
        // (while TCP connects, sending would block: the ICReq waits in the session)
        q.session.transmit(&mut q.stream, &q.memory)?;
        q.session
            .receive_from(&mut q.stream, &q.memory, &mut |_| {});
        if let Some(why) = q.session.ended() {
            // best effort: a TermReq for a bad ICResp or Connect response
            let _ = q.session.transmit(&mut q.stream, &q.memory);
            let _ = q.stream.shutdown(Shutdown::Both);
            return Err(setup_error(why));
        }
        if q.session.ready() {
            return Ok(true);
        }
        if Instant::now() >= self.deadline {
            return Err(HostError::Timeout);
        }
        Ok(false)
    }

    /// Sleeps until the socket has news for [`QueueSetup::step`] (at most until the deadline).
    pub fn wait(&mut self) -> Result<(), HostError> {
        let left = self.deadline.saturating_duration_since(Instant::now());
        self.queue.wait(left)
    }

    /// The queue, once [`QueueSetup::step`] said it is ready.
    pub fn into_queue(self) -> IoQueue {
        self.queue
    }
}

/// Receive and send buffer of an I/O queue's socket, bytes.
const SOCKET_BUFFER: usize = 2 << 20;

/// A TCP socket to `addr`, non-blocking, its connect started (it completes on its own).
fn connect_nonblocking(addr: SocketAddr) -> Result<TcpStream, HostError> {
    use nix::sys::socket::{
        connect, setsockopt, socket, sockopt, AddressFamily, SockFlag, SockType, SockaddrStorage,
    };
    use std::os::fd::AsRawFd;
    let family = if addr.is_ipv4() {
        AddressFamily::Inet
    } else {
        AddressFamily::Inet6
    };
    let flags = SockFlag::SOCK_NONBLOCK | SockFlag::SOCK_CLOEXEC;
    let fd = socket(family, SockType::Stream, flags, None).map_err(std::io::Error::from)?;
    // room for a queue's worth of transfers in flight both ways (2 MiB, as SPDK's sockets),
    // set before the connect so that the window scale covers it (best effort: the kernel caps
    // it at net.core.rmem_max / wmem_max)
    let _ = setsockopt(&fd, sockopt::RcvBuf, &SOCKET_BUFFER);
    let _ = setsockopt(&fd, sockopt::SndBuf, &SOCKET_BUFFER);
    match connect(fd.as_raw_fd(), &SockaddrStorage::from(addr)) {
        Ok(()) | Err(nix::errno::Errno::EINPROGRESS) => {}
        Err(nix::errno::Errno::ECONNREFUSED) => return Err(HostError::Refused { addr }),
        Err(e) => return Err(HostError::Io(e.into())),
    }
    let stream = TcpStream::from(fd);
    // commands are small PDUs sent in batches: do not let Nagle hold them back
    stream.set_nodelay(true)?;
    Ok(stream)
}

impl IoQueue {
    /// Connects queue `params.qid` of controller `params.cntlid` at `addr` (QID 0: an admin
    /// queue, the controller is the target's choice). Waits (at most `host.timeout`) until the
    /// Connect is answered: for callers that may (a controller's own thread, tools); a reactor
    /// uses [`QueueSetup`].
    pub fn connect(
        addr: SocketAddr,
        params: QueueParams,
        host: &HostOptions,
        buffers: Buffers,
    ) -> Result<IoQueue, HostError> {
        let mut setup = QueueSetup::start(addr, params, host, buffers)?;
        while !setup.step()? {
            setup.wait()?;
        }
        Ok(setup.into_queue())
    }

    /// Queues any command with `data` in the queue's buffers (see [`Session::submit_command`]).
    pub fn submit_command(&mut self, sqe: Sqe, data: Data, token: u64) -> Result<(), SubmitError> {
        if !self.owner_clock {
            // stamped now, not at the last poll (a queue may idle long between commands)
            self.session.set_now(self.epoch.elapsed().as_nanos() as u64);
        }
        self.session.submit_command(sqe, data, token, &self.memory)
    }

    /// Sleeps until the socket has something to read (or, while something waits to be sent,
    /// room to send it), at most `timeout`; then [`IoQueue::poll`] has work.
    pub fn wait(&mut self, timeout: Duration) -> Result<(), HostError> {
        if self.closed {
            return Ok(());
        }
        let sending = self.session.has_outgoing();
        let mut interest = EpollFlags::EPOLLIN | EpollFlags::EPOLLRDHUP;
        if sending {
            interest |= EpollFlags::EPOLLOUT;
        }
        let mut event = EpollEvent::new(interest, 0);
        match &mut self.waiter {
            Some((epoll, watched)) => {
                if *watched != sending {
                    epoll
                        .modify(&self.stream, &mut event)
                        .map_err(std::io::Error::from)?;
                    *watched = sending;
                }
            }
            None => {
                let epoll =
                    Epoll::new(EpollCreateFlags::EPOLL_CLOEXEC).map_err(std::io::Error::from)?;
                epoll
                    .add(&self.stream, event)
                    .map_err(std::io::Error::from)?;
                self.waiter = Some((epoll, sending));
            }
        }
        let Some((epoll, _)) = &self.waiter else {
            return Ok(());
        };
        // epoll takes milliseconds: round up, so that a short wait is not a spin
        let ms = timeout.as_micros().div_ceil(1000);
        let timeout = EpollTimeout::try_from(ms).unwrap_or(EpollTimeout::MAX);
        match epoll.wait(&mut [EpollEvent::empty()], timeout) {
            Ok(_) | Err(nix::errno::Errno::EINTR) => Ok(()),
            Err(e) => Err(std::io::Error::from(e).into()),
        }
    }

    /// Queues `op` on `blocks` blocks from `slba` (`buf` for reads and writes), all or
    /// nothing; it goes out on the next [`IoQueue::poll`] or [`IoQueue::flush`].
    pub fn submit(
        &mut self,
        op: Op,
        slba: u64,
        blocks: u32,
        buf: Option<IoBuffer>,
        token: u64,
    ) -> Result<(), SubmitError> {
        let ns = self.session.namespace();
        self.submit_to(ns, op, slba, blocks, buf, token)
    }

    /// [`IoQueue::submit`] to namespace `ns` of the controller.
    pub fn submit_to(
        &mut self,
        ns: IoNamespace,
        op: Op,
        slba: u64,
        blocks: u32,
        buf: Option<IoBuffer>,
        token: u64,
    ) -> Result<(), SubmitError> {
        match self
            .session
            .submit_to(ns, op, slba, blocks, buf, token, &self.memory)
        {
            Err(SubmitError::Misaligned { iova }) if buf.is_some() => {
                // a buffer mapped since the last snapshot of the address space (cold path)
                let fresh = self.buffers.snapshot();
                if Arc::ptr_eq(&fresh, &self.memory) {
                    return Err(SubmitError::Misaligned { iova });
                }
                self.memory = fresh;
                self.session
                    .submit_to(ns, op, slba, blocks, buf, token, &self.memory)
            }
            other => other,
        }
    }

    /// Sends again an I/O another queue of the controller had not finished (see
    /// [`Session::resubmit`]).
    pub fn resubmit(&mut self, u: Unfinished) -> Result<(), SubmitError> {
        // (cold: a buffer may have been mapped since the last snapshot)
        self.memory = self.buffers.snapshot();
        self.session.resubmit(u, &self.memory)
    }

    /// Sends what was queued.
    pub fn flush(&mut self) {
        if self.closed || !self.session.has_outgoing() {
            return;
        }
        if let Err(e) = self.session.transmit(&mut self.stream, &self.memory) {
            log::warn!("NVMe/TCP I/O queue: {e}");
            self.session.peer_gone();
        }
    }

    /// Sends what was queued, receives what came, checks the command timeout (the clock is
    /// read once here) and hands finished I/Os to `on_done`; returns how many.
    pub fn poll(&mut self, mut on_done: impl FnMut(Completion)) -> usize {
        if self.closed {
            return 0;
        }
        if !self.owner_clock {
            let now = self.epoch.elapsed().as_nanos() as u64;
            self.session.set_now(now);
        }
        let mut count = 0;
        let mut handler = |c: Completion| {
            count += 1;
            on_done(c);
        };
        self.flush();
        let mut source = Gate {
            open: self.readable(),
            stream: &mut self.stream,
        };
        if self
            .session
            .receive_from(&mut source, &self.memory, &mut handler)
            == Receive::Drained
        {
            // R2Ts were answered: send their data now
            self.flush();
        }
        self.session.check_timeouts();
        if self.session.ended().is_some() {
            // best effort: the TermReq, if any (nothing more goes from the buffers after it)
            let _ = self.session.transmit(&mut self.stream, &self.memory);
            let _ = self.stream.shutdown(Shutdown::Both);
            self.closed = true;
        }
        self.session.deliver(&mut handler);
        count
    }

    /// The owner's clock (nanoseconds), once per turn: submissions are stamped with it and
    /// the timeout measured against it (from then on `poll` does not read a clock itself).
    pub fn set_now(&mut self, now_ns: u64) {
        self.owner_clock = true;
        self.turn = now_ns;
        self.session.set_now(now_ns);
    }

    /// Whether the socket may have something to read this turn: the thread's watch says, for
    /// a queue whose owner names its turns (see [`readiness`](super::readiness)).
    fn readable(&mut self) -> bool {
        if !self.owner_clock {
            return true;
        }
        if !self.watch_tried {
            self.watch_tried = true;
            self.watched = Watched::join(self.stream.as_fd());
        }
        self.watched.as_ref().is_none_or(|w| w.readable(self.turn))
    }

    /// Commands in flight.
    pub fn in_flight(&self) -> usize {
        self.session.in_flight()
    }

    /// Commands that can be submitted now.
    pub fn free(&self) -> usize {
        self.session.free()
    }

    /// Why the queue ended, once it has (its I/Os failed with this kind).
    pub fn ended(&self) -> Option<Failure> {
        self.session.ended()
    }

    /// The protocol state (for tests).
    pub fn session(&self) -> &Session {
        &self.session
    }

    /// The protocol state, for settings made between commands.
    pub(crate) fn session_mut(&mut self) -> &mut Session {
        &mut self.session
    }

    /// When the queue ends, keep its unfinished I/Os for [`IoQueue::take_unfinished`].
    pub fn keep_unfinished(&mut self, keep: bool) {
        self.session.keep_unfinished(keep);
    }

    /// Keep I/Os refused for a path-related reason for [`IoQueue::take_rerouted`].
    pub fn reroute_path_errors(&mut self) {
        self.session.reroute_path_errors();
    }

    /// The I/Os the target refused for a path-related reason since the last call.
    pub fn take_rerouted(&mut self, take: impl FnMut(Unfinished, usnvme_driver::spec::Status)) {
        self.session.take_rerouted(take);
    }

    /// Once the queue ended, the I/Os it had not finished (see [`Session::take_unfinished`]).
    pub fn take_unfinished(&mut self, take: impl FnMut(Unfinished)) {
        self.session.take_unfinished(take);
    }

    /// Ends the queue: what is in flight fails as aborted (handed to `on_done`).
    pub fn close(&mut self, on_done: impl FnMut(Completion)) -> usize {
        self.session.close();
        self.poll(on_done)
    }
}

impl Drop for IoQueue {
    fn drop(&mut self) {
        if let Some(w) = self.watched.take() {
            w.leave(&self.stream);
        }
        let _ = self.stream.shutdown(Shutdown::Both);
    }
}

/// The socket, or nothing to read (no system call) where the watch says it has nothing.
struct Gate<'a> {
    stream: &'a mut TcpStream,
    open: bool,
}

impl ReadWire for Gate<'_> {
    fn read_parts(&mut self, parts: &[VolatileSlice<'_>]) -> std::io::Result<usize> {
        if !self.open {
            return Err(ErrorKind::WouldBlock.into());
        }
        self.stream.read_parts(parts)
    }
}

/// What a failed set-up says to its caller.
fn setup_error(why: Failure) -> HostError {
    match why {
        Failure::Status(status) => HostError::status("Connect", status, true),
        Failure::TimedOut => HostError::Timeout,
        other => HostError::from(other),
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use std::io::Read;
    use std::net::TcpListener;
    use std::thread::JoinHandle;

    use vm_memory::{Bytes, GuestAddress};

    use super::*;
    use crate::fabric::export::connection::{Connection, ConnectionLimits, Receive};
    use crate::fabric::export::memory::{test_subsystem, MemoryBackend};
    use crate::fabric::export::registry::Registry;
    use crate::fabric::export::{SubsystemInfo, Subsystems};
    use crate::fabric::pdu::{self, Digests};
    use crate::transport::tcp::initiator::testing::{connected_target, pattern};
    use crate::transport::tcp::initiator::CommandQueue;

    const BASE: u64 = 0x10_0000;

    /// The target's connection state machine on a real socket, over memory namespaces.
    pub(crate) fn serve(stream: TcpStream, sub: Arc<SubsystemInfo>, registry: Arc<Registry>) {
        let mut stream = stream;
        stream.set_nonblocking(true).expect("non-blocking");
        let mut backend = MemoryBackend::new(&sub);
        let limits = ConnectionLimits { maxh2cdata: 16384 };
        let mut conn = Connection::new(Subsystems::one(sub), registry, limits, "test".into());
        loop {
            match conn.receive_from(&mut stream, &mut backend) {
                Ok(Receive::Ended) | Err(_) => conn.peer_gone("gone", &mut backend),
                Ok(_) => {}
            }
            backend.complete_all(&mut conn);
            conn.tick(Instant::now(), &mut backend);
            if conn.transmit(&mut stream, &mut backend).is_err() {
                conn.peer_gone("gone", &mut backend);
            }
            if conn.finished().is_some() {
                return;
            }
            std::thread::sleep(Duration::from_micros(20));
        }
    }

    /// A target on a loopback port serving `connections` connections.
    pub(crate) fn target(connections: usize) -> (SocketAddr, Arc<SubsystemInfo>, JoinHandle<()>) {
        target_of(connections, 1)
    }

    /// The same with `namespaces` namespaces (each connection has memory of its own).
    pub(crate) fn target_of(
        connections: usize,
        namespaces: u32,
    ) -> (SocketAddr, Arc<SubsystemInfo>, JoinHandle<()>) {
        let listener = TcpListener::bind("127.0.0.1:0").expect("bind");
        let addr = listener.local_addr().expect("address");
        let sub = Arc::new(test_subsystem(namespaces));
        let registry = Arc::new(Registry::new());
        let s = sub.clone();
        let handle = std::thread::spawn(move || {
            let mut served = Vec::new();
            for _ in 0..connections {
                let (stream, _) = listener.accept().expect("accept");
                let (sub, registry) = (s.clone(), registry.clone());
                served.push(std::thread::spawn(move || serve(stream, sub, registry)));
            }
            for t in served {
                t.join().expect("a connection");
            }
        });
        (addr, sub, handle)
    }

    fn params(sub: &SubsystemInfo, cntlid: u16) -> QueueParams {
        QueueParams {
            subnqn: sub.nqn.clone(),
            qid: 1,
            cntlid,
            entries: 32,
            nsid: 1,
            block_size: 512,
            in_capsule: sub.in_capsule_bytes,
            max_transfer: sub.max_transfer,
            timeout_ns: 5_000_000_000,
        }
    }

    fn memory() -> Arc<IovaMemory> {
        Arc::new(IovaMemory::from_ranges(&[(GuestAddress(BASE), 1 << 20)]).expect("memory"))
    }

    /// Polls until nothing is in flight; the results by token.
    fn wait(q: &mut IoQueue) -> Vec<(u64, Result<(), Failure>)> {
        let deadline = Instant::now() + Duration::from_secs(10);
        let mut done = Vec::new();
        while q.in_flight() > 0 {
            assert!(Instant::now() < deadline, "I/O never completed");
            q.poll(|c| done.push((c.token, c.result)));
        }
        done.sort_by_key(|d| d.0);
        done
    }

    fn buf(at: u64, len: u32) -> Option<IoBuffer> {
        Some(IoBuffer {
            iova: BASE + at,
            len,
        })
    }

    #[test]
    fn data_written_over_loopback_reads_back_with_and_without_digests() {
        for digests in [
            Digests::default(),
            Digests {
                header: true,
                data: true,
            },
        ] {
            let (addr, sub, target) = target(2);
            let host = HostOptions {
                digests,
                timeout: Duration::from_secs(5),
                ..HostOptions::default()
            };
            let (mut admin, cntlid) =
                CommandQueue::connect(addr, &sub.nqn, 0, 32, 0xffff, &host).expect("admin");
            admin.property_set(0x14, false, 0x46_0001).expect("CC.EN");
            let mem = memory();
            let mut q = IoQueue::connect(
                addr,
                params(&sub, cntlid),
                &host,
                Buffers::Memory(mem.clone()),
            )
            .expect("I/O queue");
            let small = pattern(4096, 1);
            let big = pattern(96 << 10, 2); // R2T: six H2CData of 16 KiB
            mem.write_slice(&small, GuestAddress(BASE)).expect("fill");
            mem.write_slice(&big, GuestAddress(BASE + 0x10000))
                .expect("fill");
            q.submit(Op::Write, 0, 8, buf(0, 4096), 1).expect("write");
            q.submit(Op::Write, 64, 192, buf(0x10000, 96 << 10), 2)
                .expect("write");
            assert_eq!(wait(&mut q), [(1, Ok(())), (2, Ok(()))]);
            q.submit(Op::Read, 0, 8, buf(0x40000, 4096), 3)
                .expect("read");
            q.submit(Op::Read, 64, 192, buf(0x80000, 96 << 10), 4)
                .expect("read");
            // past the end: the target's status, by name
            q.submit(Op::Read, 2040, 16, buf(0xc0000, 8192), 5)
                .expect("read");
            let done = wait(&mut q);
            assert_eq!(done[..2], [(3, Ok(())), (4, Ok(()))]);
            let Err(Failure::Status(status)) = done[2].1 else {
                panic!("{done:?}");
            };
            assert_eq!(status.name(), "LBA Out of Range");
            let mut got = vec![0u8; big.len()];
            mem.read_slice(&mut got[..4096], GuestAddress(BASE + 0x40000))
                .expect("read");
            assert_eq!(&got[..4096], &small[..]);
            mem.read_slice(&mut got, GuestAddress(BASE + 0x80000))
                .expect("read");
            assert_eq!(got, big);
            drop(q);
            admin.disconnect();
            target.join().expect("the target");
        }
    }

    #[test]
    fn a_target_that_closes_mid_io_fails_what_is_in_flight_as_closed() {
        let (addr, target) = connected_target(|mut s| {
            // two reads come; the target goes away without answering
            let mut cmds = [0u8; 2 * pdu::CAPSULE_CMD_HEADER];
            s.read_exact(&mut cmds).expect("the commands");
        });
        let sub = test_subsystem(1);
        let host = HostOptions {
            timeout: Duration::from_secs(5),
            ..HostOptions::default()
        };
        let mut q = IoQueue::connect(addr, params(&sub, 1), &host, Buffers::Memory(memory()))
            .expect("I/O queue");
        q.submit(Op::Read, 0, 1, buf(0, 512), 1).expect("read");
        q.submit(Op::Read, 1, 1, buf(512, 512), 2).expect("read");
        assert_eq!(
            wait(&mut q),
            [(1, Err(Failure::Closed)), (2, Err(Failure::Closed))]
        );
        assert_eq!(q.ended(), Some(Failure::Closed));
        assert!(matches!(
            q.submit(Op::Read, 0, 1, buf(0, 512), 3),
            Err(SubmitError::Dead)
        ));
        target.join().expect("the target");
    }

    #[test]
    fn a_refused_connect_names_the_status() {
        let (addr, sub, target) = target(1);
        let host = HostOptions::default();
        // no admin queue made controller 7
        let err = IoQueue::connect(addr, params(&sub, 7), &host, Buffers::Memory(memory()))
            .expect_err("no such controller");
        assert!(
            err.to_string()
                .starts_with("Connect failed: Connect Invalid Parameters"),
            "{err}"
        );
        target.join().expect("the target");
    }
}
