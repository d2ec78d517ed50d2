//! How new connections and changes of the target reach a reactor, and its wake-up bell.

use std::net::TcpStream;
use std::sync::Arc;

use crossbeam_channel::Receiver;
use nix::sys::eventfd::{EfdFlags, EventFd};

use crate::fabric::export::live::TargetChange;

/// A connection the acceptor hands a reactor: its socket, the peer (for logs) and the ID of
/// the port (listener) it came in on.
#[derive(Debug)]
pub struct Incoming {
    pub stream: TcpStream,
    pub peer: String,
    pub port_id: u16,
}

/// An NVMe/RDMA connection the acceptor hands a reactor: its CM ID (a connect request, not
/// accepted yet), what the host asked for, the peer and the port it came in on.
#[cfg(feature = "rdma")]
#[derive(Debug)]
pub struct IncomingRdma {
    pub id: crate::transport::rdma::verbs::CmId,
    pub request: usnvme_driver::spec::rdma::CmRequest,
    pub peer: String,
    pub port: crate::fabric::export::Listener,
}

/// A reactor's inbox of new connections and changes of the target: the sender's end sends and
/// rings the reactor's eventfd (which wakes it from an idle sleep); the reactor's end takes
/// them.
#[derive(Debug, Clone)]
pub struct Inbox {
    queue: crossbeam_channel::Sender<Incoming>,
    pub(super) rx: Receiver<Incoming>,
    #[cfg(feature = "rdma")]
    rdma: crossbeam_channel::Sender<IncomingRdma>,
    #[cfg(feature = "rdma")]
    pub(super) rdma_rx: Receiver<IncomingRdma>,
    changes: crossbeam_channel::Sender<TargetChange>,
    pub(super) changes_rx: Receiver<TargetChange>,
    pub(super) bell: Arc<EventFd>,
}

impl Inbox {
    pub fn new() -> std::io::Result<Inbox> {
        let (queue, rx) = crossbeam_channel::unbounded();
        let (changes, changes_rx) = crossbeam_channel::unbounded();
        #[cfg(feature = "rdma")]
        let (rdma, rdma_rx) = crossbeam_channel::unbounded();
        let bell =
            EventFd::from_value_and_flags(0, EfdFlags::EFD_NONBLOCK | EfdFlags::EFD_CLOEXEC)?;
        Ok(Inbox {
            queue,
            rx,
            changes,
            changes_rx,
            #[cfg(feature = "rdma")]
            rdma,
            #[cfg(feature = "rdma")]
            rdma_rx,
            bell: Arc::new(bell),
        })
    }

    /// Hands the reactor a connection, and wakes it.
    pub fn send(&self, incoming: Incoming) {
        let _ = self.queue.send(incoming);
        self.wake();
    }

    /// Hands the reactor an NVMe/RDMA connection, and wakes it.
    #[cfg(feature = "rdma")]
    pub fn send_rdma(&self, incoming: IncomingRdma) {
        let _ = self.rdma.send(incoming);
        self.wake();
    }

    /// Hands the reactor a change of the target, and wakes it.
    pub(in crate::fabric::export) fn change(&self, change: TargetChange) {
        let _ = self.changes.send(change);
        self.wake();
    }

    /// Wakes the reactor (a stop, say).
    pub fn wake(&self) {
        let _ = self.bell.write(1);
    }

    /// Connections handed and not taken yet.
    pub fn len(&self) -> usize {
        #[cfg(feature = "rdma")]
        let rdma = self.rdma.len();
        #[cfg(not(feature = "rdma"))]
        let rdma = 0;
        self.queue.len() + rdma
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0 && self.changes.is_empty()
    }
}

/// The wait token of the inbox's eventfd (the sockets' is their slot).
pub(super) const BELL: u64 = u64::MAX - 1;
