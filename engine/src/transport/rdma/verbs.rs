//! The RDMA verbs and RDMA CM calls NVMe/RDMA uses, as owned handles: every `unsafe` of the
//! transport is in this file. Handles free what they own when dropped (a queue pair before its
//! CM ID, memory regions before their protection domain: owners keep that order by field
//! order). Nothing here allocates per I/O: work requests are built on the stack and posted.
//!
//! The CM's event channel and a completion queue's channel are non-blocking file descriptors,
//! so a reactor can watch them in its epoll set and never waits in a verbs call.

use std::io;
use std::net::SocketAddr;
use std::os::fd::{BorrowedFd, RawFd};
use std::ptr::{self, NonNull};
use std::sync::atomic::{AtomicU32, Ordering};

use rdma_sys as sys;

/// The most private data a CM connect, accept or reject carries here (NVMe/RDMA uses 32).
pub const MAX_PRIVATE: usize = 56;

fn check(rc: i32, what: &'static str) -> io::Result<()> {
    if rc == 0 {
        Ok(())
    } else {
        let e = io::Error::last_os_error();
        Err(io::Error::new(e.kind(), format!("{what}: {e}")))
    }
}

fn non_null<T>(p: *mut T, what: &'static str) -> io::Result<NonNull<T>> {
    NonNull::new(p).ok_or_else(|| {
        let e = io::Error::last_os_error();
        io::Error::new(e.kind(), format!("{what}: {e}"))
    })
}

fn set_nonblocking(fd: RawFd) -> io::Result<()> {
    // SAFETY: the descriptor is open (its owner is alive); fcntl only reads and sets its flags.
    let flags = unsafe { libc::fcntl(fd, libc::F_GETFL) };
    // SAFETY: as above.
    let rc = unsafe { libc::fcntl(fd, libc::F_SETFL, flags | libc::O_NONBLOCK) };
    if flags < 0 || rc < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

/// What happened to a CM ID.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CmEventKind {
    AddrResolved,
    RouteResolved,
    ConnectRequest,
    Established,
    Rejected,
    Disconnected,
    /// Address, route or connection errors, device removal, timewait exit and the rest.
    Other(u32),
}

impl CmEventKind {
    fn from_raw(t: u32) -> CmEventKind {
        use sys::rdma_cm_event_type as t_;
        match t {
            t_::RDMA_CM_EVENT_ADDR_RESOLVED => CmEventKind::AddrResolved,
            t_::RDMA_CM_EVENT_ROUTE_RESOLVED => CmEventKind::RouteResolved,
            t_::RDMA_CM_EVENT_CONNECT_REQUEST => CmEventKind::ConnectRequest,
            t_::RDMA_CM_EVENT_ESTABLISHED => CmEventKind::Established,
            t_::RDMA_CM_EVENT_REJECTED => CmEventKind::Rejected,
            t_::RDMA_CM_EVENT_DISCONNECTED => CmEventKind::Disconnected,
            other => CmEventKind::Other(other),
        }
    }

    /// The CM's name for it (for messages).
    pub fn name(self) -> String {
        // SAFETY: rdma_event_str returns a static string for any value.
        let s = unsafe { sys::rdma_event_str(self.raw()) };
        if s.is_null() {
            return format!("{self:?}");
        }
        // SAFETY: non-null, NUL-terminated and static (checked just above).
        unsafe { std::ffi::CStr::from_ptr(s) }
            .to_string_lossy()
            .into_owned()
    }

    fn raw(self) -> u32 {
        use sys::rdma_cm_event_type as t_;
        match self {
            CmEventKind::AddrResolved => t_::RDMA_CM_EVENT_ADDR_RESOLVED,
            CmEventKind::RouteResolved => t_::RDMA_CM_EVENT_ROUTE_RESOLVED,
            CmEventKind::ConnectRequest => t_::RDMA_CM_EVENT_CONNECT_REQUEST,
            CmEventKind::Established => t_::RDMA_CM_EVENT_ESTABLISHED,
            CmEventKind::Rejected => t_::RDMA_CM_EVENT_REJECTED,
            CmEventKind::Disconnected => t_::RDMA_CM_EVENT_DISCONNECTED,
            CmEventKind::Other(t) => t,
        }
    }
}

/// One CM event, copied out and acknowledged.
#[derive(Debug)]
pub struct CmEvent {
    pub kind: CmEventKind,
    pub status: i32,
    /// The ID it is about (compare with [`CmId::raw`]).
    pub id: usize,
    /// The private data that came with it (connect request, accept, reject).
    pub private: [u8; MAX_PRIVATE],
    pub private_len: usize,
    /// On a connect request: the new connection's ID, owned by whoever takes it.
    pub new_id: Option<CmId>,
    /// On a connect request: the resources the initiator asked for.
    pub initiator_depth: u8,
    pub responder_resources: u8,
}

impl CmEvent {
    pub fn private(&self) -> &[u8] {
        &self.private[..self.private_len]
    }
}

/// An RDMA CM event channel (non-blocking).
#[derive(Debug)]
pub struct EventChannel {
    ptr: NonNull<sys::rdma_event_channel>,
}

// SAFETY: the channel is a file descriptor wrapper with no thread affinity.
unsafe impl Send for EventChannel {}

impl EventChannel {
    pub fn new() -> io::Result<EventChannel> {
        // SAFETY: no arguments; a null return is an error (errno set).
        let ptr = non_null(
            unsafe { sys::rdma_create_event_channel() },
            "rdma_create_event_channel (is rdma_cm loaded, with an RDMA device? see `rdma link`)",
        )?;
        let ch = EventChannel { ptr };
        set_nonblocking(ch.fd())?;
        Ok(ch)
    }

    pub fn fd(&self) -> RawFd {
        // SAFETY: the channel is alive while `self` is.
        unsafe { self.ptr.as_ref() }.fd
    }

    pub fn as_fd(&self) -> BorrowedFd<'_> {
        // SAFETY: the descriptor stays open while `self` is alive.
        unsafe { BorrowedFd::borrow_raw(self.fd()) }
    }

    /// The next event, if one is there (never blocks).
    pub fn next(&self) -> io::Result<Option<CmEvent>> {
        let mut ev: *mut sys::rdma_cm_event = ptr::null_mut();
        // SAFETY: the channel is alive; `ev` receives an event the library owns until acked.
        let rc = unsafe { sys::rdma_get_cm_event(self.ptr.as_ptr(), &mut ev) };
        if rc != 0 {
            let e = io::Error::last_os_error();
            if e.kind() == io::ErrorKind::WouldBlock {
                return Ok(None);
            }
            return Err(io::Error::new(e.kind(), format!("rdma_get_cm_event: {e}")));
        }
        let ev = non_null(ev, "rdma_get_cm_event")?;
        // SAFETY: a valid event until rdma_ack_cm_event below.
        let e = unsafe { ev.as_ref() };
        let kind = CmEventKind::from_raw(e.event);
        // SAFETY: `conn` is the member the CM fills for connected (RC) IDs, which are all
        // this transport makes.
        let conn = unsafe { e.param.conn };
        let mut private = [0u8; MAX_PRIVATE];
        let private_len = usize::from(conn.private_data_len).min(MAX_PRIVATE);
        if !conn.private_data.is_null() && private_len > 0 {
            // SAFETY: the CM gives `private_data_len` readable bytes at `private_data`, valid
            // until the ack; at most MAX_PRIVATE are copied.
            let src =
                unsafe { std::slice::from_raw_parts(conn.private_data.cast::<u8>(), private_len) };
            private[..private_len].copy_from_slice(src);
        }
        let new_id = match kind {
            CmEventKind::ConnectRequest => NonNull::new(e.id).map(|ptr| CmId { ptr, qp: false }),
            _ => None,
        };
        let event = CmEvent {
            kind,
            status: e.status,
            id: e.id as usize,
            private,
            private_len,
            new_id,
            initiator_depth: conn.initiator_depth,
            responder_resources: conn.responder_resources,
        };
        // SAFETY: acknowledges the event got above, once; nothing of it is used after.
        let rc = unsafe { sys::rdma_ack_cm_event(ev.as_ptr()) };
        check(rc, "rdma_ack_cm_event")?;
        Ok(Some(event))
    }
}

impl Drop for EventChannel {
    fn drop(&mut self) {
        // SAFETY: owned, and every ID on it was destroyed before (owners keep that order).
        unsafe { sys::rdma_destroy_event_channel(self.ptr.as_ptr()) };
    }
}

fn sockaddr(addr: SocketAddr) -> libc::sockaddr_storage {
    // SAFETY: all-zero is a valid sockaddr_storage.
    let mut storage: libc::sockaddr_storage = unsafe { std::mem::zeroed() };
    match addr {
        SocketAddr::V4(a) => {
            let sin = libc::sockaddr_in {
                sin_family: libc::AF_INET as libc::sa_family_t,
                sin_port: a.port().to_be(),
                sin_addr: libc::in_addr {
                    s_addr: u32::from_ne_bytes(a.ip().octets()),
                },
                sin_zero: [0; 8],
            };
            // SAFETY: sockaddr_storage is larger than and aligned for sockaddr_in.
            unsafe { ptr::write((&mut storage as *mut libc::sockaddr_storage).cast(), sin) };
        }
        SocketAddr::V6(a) => {
            let sin6 = libc::sockaddr_in6 {
                sin6_family: libc::AF_INET6 as libc::sa_family_t,
                sin6_port: a.port().to_be(),
                sin6_flowinfo: a.flowinfo(),
                sin6_addr: libc::in6_addr {
                    s6_addr: a.ip().octets(),
                },
                sin6_scope_id: a.scope_id(),
            };
            // SAFETY: sockaddr_storage is larger than and aligned for sockaddr_in6.
            unsafe { ptr::write((&mut storage as *mut libc::sockaddr_storage).cast(), sin6) };
        }
    }
    storage
}

/// How many work requests and scatter entries a queue pair holds.
#[derive(Debug, Clone, Copy)]
pub struct QpCaps {
    pub send: u32,
    pub recv: u32,
    pub send_sge: u32,
}

/// An RDMA CM ID: one connection (or a listener), with its queue pair once made.
#[derive(Debug)]
pub struct CmId {
    ptr: NonNull<sys::rdma_cm_id>,
    qp: bool,
}

// SAFETY: a CM ID is used by one thread at a time (its owner); verbs objects are thread-safe.
unsafe impl Send for CmId {}

impl CmId {
    /// A new connected-mode (RC, TCP port space) ID on `channel`.
    pub fn new(channel: &EventChannel) -> io::Result<CmId> {
        let mut id: *mut sys::rdma_cm_id = ptr::null_mut();
        // SAFETY: the channel is alive; `id` receives the new ID.
        let rc = unsafe {
            sys::rdma_create_id(
                channel.ptr.as_ptr(),
                &mut id,
                ptr::null_mut(),
                sys::rdma_port_space::RDMA_PS_TCP,
            )
        };
        check(rc, "rdma_create_id")?;
        Ok(CmId {
            ptr: non_null(id, "rdma_create_id")?,
            qp: false,
        })
    }

    /// Its identity in [`CmEvent::id`].
    pub fn raw(&self) -> usize {
        self.ptr.as_ptr() as usize
    }

    /// Moves the ID's events to `channel` (a connection handed to the reactor that serves it).
    pub fn migrate(&self, channel: &EventChannel) -> io::Result<()> {
        // SAFETY: live ID and channel.
        let rc = unsafe { sys::rdma_migrate_id(self.ptr.as_ptr(), channel.ptr.as_ptr()) };
        check(rc, "rdma_migrate_id")
    }

    /// Its queue pair's number (completions name it), once made.
    pub fn qp_num(&self) -> Option<u32> {
        let qp = self.qp().ok()?;
        // SAFETY: the QP is alive while the ID is.
        Some(unsafe { (*qp).qp_num })
    }

    /// Starts resolving `dst` to an RDMA device and address (event: AddrResolved).
    pub fn resolve_addr(&self, dst: SocketAddr, timeout_ms: i32) -> io::Result<()> {
        let mut dst = sockaddr(dst);
        // SAFETY: the ID is alive; `dst` is a valid sockaddr that outlives the call.
        let rc = unsafe {
            sys::rdma_resolve_addr(
                self.ptr.as_ptr(),
                ptr::null_mut(),
                (&mut dst as *mut libc::sockaddr_storage).cast(),
                timeout_ms,
            )
        };
        check(rc, "rdma_resolve_addr")
    }

    /// Starts resolving the route (event: RouteResolved).
    pub fn resolve_route(&self, timeout_ms: i32) -> io::Result<()> {
        // SAFETY: the ID is alive and its address resolved.
        let rc = unsafe { sys::rdma_resolve_route(self.ptr.as_ptr(), timeout_ms) };
        check(rc, "rdma_resolve_route")
    }

    /// Binds a listener to `addr`.
    pub fn bind(&self, addr: SocketAddr) -> io::Result<()> {
        let mut a = sockaddr(addr);
        // SAFETY: the ID is alive; `a` outlives the call.
        let rc = unsafe {
            sys::rdma_bind_addr(
                self.ptr.as_ptr(),
                (&mut a as *mut libc::sockaddr_storage).cast(),
            )
        };
        check(rc, "rdma_bind_addr")
    }

    pub fn listen(&self, backlog: i32) -> io::Result<()> {
        // SAFETY: the ID is alive and bound.
        let rc = unsafe { sys::rdma_listen(self.ptr.as_ptr(), backlog) };
        check(rc, "rdma_listen")
    }

    /// The device the ID resolved or was bound to (null before).
    fn verbs(&self) -> *mut sys::ibv_context {
        // SAFETY: the ID is alive.
        unsafe { self.ptr.as_ref() }.verbs
    }

    /// The ID's device, as an identity (0 before it has one): librdmacm opens each device
    /// once, so IDs on one device name the same.
    pub fn device(&self) -> usize {
        self.verbs() as usize
    }

    /// A protection domain on the ID's device.
    pub fn alloc_pd(&self) -> io::Result<ProtectionDomain> {
        let ctx = self.verbs();
        if ctx.is_null() {
            return Err(io::Error::other("the CM ID has no RDMA device yet"));
        }
        // SAFETY: a live device context.
        let pd = non_null(unsafe { sys::ibv_alloc_pd(ctx) }, "ibv_alloc_pd")?;
        Ok(ProtectionDomain { ptr: pd })
    }

    /// A completion queue of `entries` on the ID's device, with a completion channel (its fd
    /// wakes a waiter once [`CompletionQueue::arm`]ed).
    pub fn create_cq(&self, entries: u32) -> io::Result<CompletionQueue> {
        let ctx = self.verbs();
        if ctx.is_null() {
            return Err(io::Error::other("the CM ID has no RDMA device yet"));
        }
        // SAFETY: a live device context.
        let channel = non_null(
            unsafe { sys::ibv_create_comp_channel(ctx) },
            "ibv_create_comp_channel",
        )?;
        // SAFETY: the channel was just made; it is alive.
        let fd = unsafe { channel.as_ref() }.fd;
        set_nonblocking(fd)?;
        let entries = i32::try_from(entries).unwrap_or(i32::MAX);
        // SAFETY: a live context and channel; no CQ context.
        let cq = unsafe { sys::ibv_create_cq(ctx, entries, ptr::null_mut(), channel.as_ptr(), 0) };
        let Some(cq) = NonNull::new(cq) else {
            let e = io::Error::last_os_error();
            // SAFETY: the channel has no CQ on it.
            unsafe { sys::ibv_destroy_comp_channel(channel.as_ptr()) };
            return Err(io::Error::new(e.kind(), format!("ibv_create_cq: {e}")));
        };
        Ok(CompletionQueue {
            ptr: cq,
            channel,
            unacked: AtomicU32::new(0),
        })
    }

    /// Makes the ID's RC queue pair on `pd`, completions into `cq` (both ways), its receives
    /// from `srq` when given (then `caps.recv` is not used). Every send is signaled: a buffer
    /// is given back only once its send completed.
    pub fn create_qp(
        &mut self,
        pd: &ProtectionDomain,
        cq: &CompletionQueue,
        srq: Option<&SharedReceiveQueue>,
        caps: QpCaps,
    ) -> io::Result<()> {
        // SAFETY: all-zero is a valid ibv_qp_init_attr (null pointers, zero counts).
        let mut attr: sys::ibv_qp_init_attr = unsafe { std::mem::zeroed() };
        attr.send_cq = cq.ptr.as_ptr();
        attr.recv_cq = cq.ptr.as_ptr();
        attr.cap.max_send_wr = caps.send;
        match srq {
            Some(srq) => attr.srq = srq.ptr.as_ptr(),
            None => attr.cap.max_recv_wr = caps.recv,
        }
        attr.cap.max_send_sge = caps.send_sge;
        attr.cap.max_recv_sge = 1;
        attr.qp_type = sys::ibv_qp_type::IBV_QPT_RC;
        attr.sq_sig_all = 1;
        // SAFETY: live ID, PD and CQ; `attr` outlives the call.
        let rc = unsafe { sys::rdma_create_qp(self.ptr.as_ptr(), pd.ptr.as_ptr(), &mut attr) };
        check(rc, "rdma_create_qp")?;
        self.qp = true;
        Ok(())
    }

    fn qp(&self) -> io::Result<*mut sys::ibv_qp> {
        // SAFETY: the ID is alive.
        let qp = unsafe { self.ptr.as_ref() }.qp;
        if !self.qp || qp.is_null() {
            return Err(io::Error::other("the connection has no queue pair"));
        }
        Ok(qp)
    }

    fn conn_param(private: &[u8], depth: u8) -> sys::rdma_conn_param {
        sys::rdma_conn_param {
            private_data: private.as_ptr().cast(),
            private_data_len: private.len().min(MAX_PRIVATE) as u8,
            responder_resources: depth,
            initiator_depth: depth,
            flow_control: 1,
            retry_count: 7,
            rnr_retry_count: 7,
            srq: 0,
            qp_num: 0,
        }
    }

    /// Connects (event: Established, or Rejected with the target's private data).
    pub fn connect(&self, private: &[u8], depth: u8) -> io::Result<()> {
        let mut param = CmId::conn_param(private, depth);
        // SAFETY: the ID is alive with its QP; `param` and `private` outlive the call.
        let rc = unsafe { sys::rdma_connect(self.ptr.as_ptr(), &mut param) };
        check(rc, "rdma_connect")
    }

    /// Accepts a connect request with `private` data.
    pub fn accept(&self, private: &[u8], depth: u8) -> io::Result<()> {
        let mut param = CmId::conn_param(private, depth);
        // SAFETY: as for connect.
        let rc = unsafe { sys::rdma_accept(self.ptr.as_ptr(), &mut param) };
        check(rc, "rdma_accept")
    }

    /// Rejects a connect request with `private` data.
    pub fn reject(&self, private: &[u8]) -> io::Result<()> {
        // SAFETY: the ID is alive; `private` outlives the call.
        let rc = unsafe {
            sys::rdma_reject(
                self.ptr.as_ptr(),
                private.as_ptr().cast(),
                private.len().min(MAX_PRIVATE) as u8,
            )
        };
        check(rc, "rdma_reject")
    }

    pub fn disconnect(&self) {
        // SAFETY: the ID is alive; disconnecting one never connected only returns an error.
        unsafe { sys::rdma_disconnect(self.ptr.as_ptr()) };
    }

    /// Posts a signaled SEND of `sges`.
    pub fn post_send(&self, wr_id: u64, sges: &[Sge]) -> io::Result<()> {
        self.post(wr_id, sges, sys::ibv_wr_opcode::IBV_WR_SEND, 0, 0)
    }

    /// Posts an RDMA READ of the peer's `remote` (`rkey`) into `local`.
    pub fn post_read(&self, wr_id: u64, local: &[Sge], remote: u64, rkey: u32) -> io::Result<()> {
        self.post(
            wr_id,
            local,
            sys::ibv_wr_opcode::IBV_WR_RDMA_READ,
            remote,
            rkey,
        )
    }

    /// Posts an RDMA WRITE of `local` to the peer's `remote` (`rkey`).
    pub fn post_write(&self, wr_id: u64, local: &[Sge], remote: u64, rkey: u32) -> io::Result<()> {
        self.post(
            wr_id,
            local,
            sys::ibv_wr_opcode::IBV_WR_RDMA_WRITE,
            remote,
            rkey,
        )
    }

    fn post(
        &self,
        wr_id: u64,
        sges: &[Sge],
        opcode: u32,
        remote: u64,
        rkey: u32,
    ) -> io::Result<()> {
        let qp = self.qp()?;
        let mut list = [sys::ibv_sge {
            addr: 0,
            length: 0,
            lkey: 0,
        }; 4];
        if sges.len() > list.len() {
            return Err(io::Error::other(
                "at most 4 scatter entries per work request",
            ));
        }
        for (d, s) in list.iter_mut().zip(sges) {
            *d = sys::ibv_sge {
                addr: s.addr,
                length: s.len,
                lkey: s.lkey,
            };
        }
        // SAFETY: all-zero is a valid ibv_send_wr (no next, no inline, no immediate).
        let mut wr: sys::ibv_send_wr = unsafe { std::mem::zeroed() };
        wr.wr_id = wr_id;
        wr.sg_list = list.as_mut_ptr();
        wr.num_sge = sges.len() as i32;
        wr.opcode = opcode;
        wr.send_flags = sys::ibv_send_flags::IBV_SEND_SIGNALED.0;
        wr.wr.rdma = sys::rdma_t {
            remote_addr: remote,
            rkey,
        };
        let mut bad: *mut sys::ibv_send_wr = ptr::null_mut();
        // SAFETY: a live QP; `wr` and `list` outlive the call (the provider copies them); the
        // memory they name is registered and stays so until the completion (owners' rule).
        let rc = unsafe { sys::ibv_post_send(qp, &mut wr, &mut bad) };
        if rc != 0 {
            return Err(io::Error::from_raw_os_error(rc));
        }
        Ok(())
    }

    /// Posts a receive into `sge`.
    pub fn post_recv(&self, wr_id: u64, sge: Sge) -> io::Result<()> {
        let qp = self.qp()?;
        post_receive(wr_id, sge, |wr, bad| {
            // SAFETY: a live QP; the request and its list outlive the call; the buffer is
            // registered.
            unsafe { sys::ibv_post_recv(qp, wr, bad) }
        })
    }
}

/// Posts one receive of `sge` with `post` (a queue pair's or a shared receive queue's).
fn post_receive(
    wr_id: u64,
    sge: Sge,
    post: impl FnOnce(*mut sys::ibv_recv_wr, *mut *mut sys::ibv_recv_wr) -> i32,
) -> io::Result<()> {
    let mut list = sys::ibv_sge {
        addr: sge.addr,
        length: sge.len,
        lkey: sge.lkey,
    };
    let mut wr = sys::ibv_recv_wr {
        wr_id,
        next: ptr::null_mut(),
        sg_list: &mut list,
        num_sge: 1,
    };
    let mut bad: *mut sys::ibv_recv_wr = ptr::null_mut();
    let rc = post(&mut wr, &mut bad);
    if rc != 0 {
        return Err(io::Error::from_raw_os_error(rc));
    }
    Ok(())
}

/// A shared receive queue: receive buffers any of the queue pairs made on it takes its
/// next message into (a completion names the queue pair).
#[derive(Debug)]
pub struct SharedReceiveQueue {
    ptr: NonNull<sys::ibv_srq>,
}

// SAFETY: verbs objects may be used from any thread.
unsafe impl Send for SharedReceiveQueue {}

impl SharedReceiveQueue {
    /// Posts a receive into `sge`.
    pub fn post_recv(&self, wr_id: u64, sge: Sge) -> io::Result<()> {
        let srq = self.ptr.as_ptr();
        post_receive(wr_id, sge, |wr, bad| {
            // SAFETY: a live SRQ; the request and its list outlive the call; the buffer is
            // registered.
            unsafe { sys::ibv_post_srq_recv(srq, wr, bad) }
        })
    }
}

impl Drop for SharedReceiveQueue {
    fn drop(&mut self) {
        // SAFETY: owned; destroyed once, after the queue pairs on it (owners' field order).
        unsafe { sys::ibv_destroy_srq(self.ptr.as_ptr()) };
    }
}

impl Drop for CmId {
    fn drop(&mut self) {
        if self.qp {
            // SAFETY: the ID made this QP; it is destroyed once.
            unsafe { sys::rdma_destroy_qp(self.ptr.as_ptr()) };
        }
        // SAFETY: owned; destroyed once, after its QP.
        unsafe { sys::rdma_destroy_id(self.ptr.as_ptr()) };
    }
}

/// A scatter entry: `len` bytes at `addr` in a memory region with `lkey`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Sge {
    pub addr: u64,
    pub len: u32,
    pub lkey: u32,
}

/// A protection domain.
#[derive(Debug)]
pub struct ProtectionDomain {
    ptr: NonNull<sys::ibv_pd>,
}

// SAFETY: verbs objects may be used from any thread.
unsafe impl Send for ProtectionDomain {}
// SAFETY: as above (registration is thread-safe in libibverbs).
unsafe impl Sync for ProtectionDomain {}

impl ProtectionDomain {
    /// Registers `len` bytes at `addr` for local and remote read and write, addressed as
    /// `iova` (the address work requests and the peer use for it).
    ///
    /// Safe to call with any address: the kernel pins the pages it registers (or fails), so
    /// the device never writes memory it does not hold a reference to; what it writes there
    /// is the owner's to keep consistent, as with any DMA buffer.
    pub fn register(&self, addr: *mut u8, len: usize, iova: u64) -> io::Result<MemoryRegion> {
        let access = sys::ibv_access_flags::IBV_ACCESS_LOCAL_WRITE.0
            | sys::ibv_access_flags::IBV_ACCESS_REMOTE_WRITE.0
            | sys::ibv_access_flags::IBV_ACCESS_REMOTE_READ.0;
        // SAFETY: a live PD; the kernel validates and pins the range (see above).
        let mr = unsafe {
            sys::ibv_reg_mr_iova(self.ptr.as_ptr(), addr.cast(), len, iova, access as i32)
        };
        Ok(MemoryRegion {
            ptr: non_null(mr, "ibv_reg_mr (is RLIMIT_MEMLOCK large enough?)")?,
        })
    }
}

impl ProtectionDomain {
    /// A shared receive queue of `entries` receives of one scatter entry each.
    pub fn create_srq(&self, entries: u32) -> io::Result<SharedReceiveQueue> {
        // SAFETY: all-zero is a valid ibv_srq_init_attr (no context, zero limit).
        let mut attr: sys::ibv_srq_init_attr = unsafe { std::mem::zeroed() };
        attr.attr.max_wr = entries;
        attr.attr.max_sge = 1;
        // SAFETY: a live PD; `attr` outlives the call.
        let srq = unsafe { sys::ibv_create_srq(self.ptr.as_ptr(), &mut attr) };
        Ok(SharedReceiveQueue {
            ptr: non_null(srq, "ibv_create_srq")?,
        })
    }
}

impl Drop for ProtectionDomain {
    fn drop(&mut self) {
        // SAFETY: owned; its MRs and QPs are gone first (owners' field order).
        unsafe { sys::ibv_dealloc_pd(self.ptr.as_ptr()) };
    }
}

/// A registered memory region.
#[derive(Debug)]
pub struct MemoryRegion {
    ptr: NonNull<sys::ibv_mr>,
}

// SAFETY: an MR handle is plain data once made.
unsafe impl Send for MemoryRegion {}
// SAFETY: as above.
unsafe impl Sync for MemoryRegion {}

impl MemoryRegion {
    pub fn lkey(&self) -> u32 {
        // SAFETY: alive while `self` is.
        unsafe { self.ptr.as_ref() }.lkey
    }

    pub fn rkey(&self) -> u32 {
        // SAFETY: alive while `self` is.
        unsafe { self.ptr.as_ref() }.rkey
    }
}

impl Drop for MemoryRegion {
    fn drop(&mut self) {
        // SAFETY: owned; deregistered once, after the work that used it completed.
        unsafe { sys::ibv_dereg_mr(self.ptr.as_ptr()) };
    }
}

/// What a completion was for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum WcOpcode {
    Send,
    Recv,
    Read,
    Write,
    Other(u32),
}

/// One work completion.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Wc {
    pub wr_id: u64,
    /// The queue pair it is of.
    pub qp_num: u32,
    /// 0: success; else the verbs status (see [`wc_status_name`]).
    pub status: u32,
    pub opcode: WcOpcode,
    pub byte_len: u32,
}

/// The verbs name of a completion status.
pub fn wc_status_name(status: u32) -> String {
    // SAFETY: ibv_wc_status_str returns a static string for any value.
    let s = unsafe { sys::ibv_wc_status_str(status) };
    if s.is_null() {
        return format!("status {status}");
    }
    // SAFETY: non-null, NUL-terminated and static.
    unsafe { std::ffi::CStr::from_ptr(s) }
        .to_string_lossy()
        .into_owned()
}

/// The largest of `wanted` entries, halved down to 256, that `make` makes (a device says how
/// many entries of a queue it takes only by refusing more).
pub fn largest<T>(wanted: u32, mut make: impl FnMut(u32) -> io::Result<T>) -> io::Result<(u32, T)> {
    let mut entries = wanted;
    loop {
        match make(entries) {
            Ok(made) => return Ok((entries, made)),
            Err(e) if entries > 256 && e.kind() == io::ErrorKind::InvalidInput => entries /= 2,
            Err(e) => return Err(e),
        }
    }
}

/// A completion queue and its completion channel.
#[derive(Debug)]
pub struct CompletionQueue {
    ptr: NonNull<sys::ibv_cq>,
    channel: NonNull<sys::ibv_comp_channel>,
    /// Channel events taken and not yet acknowledged.
    unacked: AtomicU32,
}

// SAFETY: verbs objects may move between threads.
unsafe impl Send for CompletionQueue {}
// SAFETY: libibverbs' CQ calls are thread-safe (providers lock the CQ in poll and notify); the
// event count is atomic.
unsafe impl Sync for CompletionQueue {}

/// Completions one [`CompletionQueue::poll`] takes at most.
pub const POLL_BATCH: usize = 32;

impl CompletionQueue {
    /// Takes up to [`POLL_BATCH`] completions into `out`; how many.
    pub fn poll(&self, out: &mut [Wc; POLL_BATCH]) -> io::Result<usize> {
        // SAFETY: all-zero is a valid ibv_wc.
        let mut wcs: [sys::ibv_wc; POLL_BATCH] = unsafe { std::mem::zeroed() };
        // SAFETY: a live CQ; `wcs` has room for POLL_BATCH entries.
        let n = unsafe { sys::ibv_poll_cq(self.ptr.as_ptr(), POLL_BATCH as i32, wcs.as_mut_ptr()) };
        if n < 0 {
            return Err(io::Error::other(format!("ibv_poll_cq failed ({n})")));
        }
        let n = n as usize;
        for (o, w) in out.iter_mut().zip(&wcs[..n]) {
            use sys::ibv_wc_opcode as op;
            *o = Wc {
                wr_id: w.wr_id,
                qp_num: w.qp_num,
                status: w.status,
                opcode: match w.opcode {
                    op::IBV_WC_SEND => WcOpcode::Send,
                    op::IBV_WC_RECV => WcOpcode::Recv,
                    op::IBV_WC_RDMA_READ => WcOpcode::Read,
                    op::IBV_WC_RDMA_WRITE => WcOpcode::Write,
                    other => WcOpcode::Other(other),
                },
                byte_len: w.byte_len,
            };
        }
        Ok(n)
    }

    /// The completion channel's descriptor: readable once a completion comes after
    /// [`CompletionQueue::arm`].
    pub fn fd(&self) -> RawFd {
        // SAFETY: the channel is alive while `self` is.
        unsafe { self.channel.as_ref() }.fd
    }

    pub fn as_fd(&self) -> BorrowedFd<'_> {
        // SAFETY: the channel's descriptor stays open while `self` is alive.
        unsafe { BorrowedFd::borrow_raw(self.fd()) }
    }

    /// Asks for a channel event on the next completion (poll once more after arming: one
    /// that came before it raises none).
    pub fn arm(&self) -> io::Result<()> {
        // SAFETY: a live CQ.
        let rc = unsafe { sys::ibv_req_notify_cq(self.ptr.as_ptr(), 0) };
        if rc != 0 {
            return Err(io::Error::from_raw_os_error(rc));
        }
        Ok(())
    }

    /// Takes a channel event if one is there (never blocks).
    pub fn take_event(&self) -> bool {
        let mut cq: *mut sys::ibv_cq = ptr::null_mut();
        let mut ctx: *mut libc::c_void = ptr::null_mut();
        // SAFETY: a live, non-blocking channel; the out-pointers receive the CQ and context.
        let rc = unsafe { sys::ibv_get_cq_event(self.channel.as_ptr(), &mut cq, &mut ctx) };
        if rc != 0 {
            return false;
        }
        if self.unacked.fetch_add(1, Ordering::Relaxed) + 1 >= 64 {
            self.ack();
        }
        true
    }

    fn ack(&self) {
        let unacked = self.unacked.swap(0, Ordering::Relaxed);
        if unacked > 0 {
            // SAFETY: acknowledges the events taken on this CQ, once each.
            unsafe { sys::ibv_ack_cq_events(self.ptr.as_ptr(), unacked) };
        }
    }
}

impl Drop for CompletionQueue {
    fn drop(&mut self) {
        self.ack();
        // SAFETY: owned; the QPs on it are gone first (owners' field order).
        unsafe { sys::ibv_destroy_cq(self.ptr.as_ptr()) };
        // SAFETY: owned; its only CQ is gone.
        unsafe { sys::ibv_destroy_comp_channel(self.channel.as_ptr()) };
    }
}
