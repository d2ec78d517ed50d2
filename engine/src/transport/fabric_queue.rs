//! A host queue of a remote controller over either fabric: NVMe/TCP's
//! ([`tcp::initiator::IoQueue`](crate::transport::tcp::initiator::IoQueue)) or NVMe/RDMA's
//! ([`rdma::IoQueue`](crate::transport::rdma::IoQueue), with the `rdma` feature). Both take
//! the same commands and give the same completions; the remote controller, its I/O queues,
//! reconnects and paths (`tcp::{controller, queues}`) run on this one type, whatever carries it.
//! An enum: the I/O path dispatches with a match, no virtual call.

use std::net::SocketAddr;
use std::time::Duration;

use usnvme_driver::spec::{Sqe, Status};
use usnvme_driver::{IoBuffer, SubmitError};

use crate::fabric::address::Transport;
use crate::transport::tcp::initiator::queue::Buffers;
use crate::transport::tcp::initiator::{
    self as tcp, Completion, Data, Failure, HostError, HostOptions, IoNamespace, QueueParams,
    Unfinished,
};
use crate::transport::Op;

#[cfg(feature = "rdma")]
use crate::transport::rdma;

/// One queue of a remote controller (admin or I/O).
#[derive(Debug)]
pub enum FabricQueue {
    Tcp(tcp::IoQueue),
    #[cfg(feature = "rdma")]
    Rdma(rdma::IoQueue),
}

/// A queue being set up without waiting ([`FabricQueueSetup::step`] in a reactor's turns).
#[derive(Debug)]
pub enum FabricQueueSetup {
    Tcp(tcp::QueueSetup),
    #[cfg(feature = "rdma")]
    Rdma(rdma::QueueSetup),
}

/// What an `rdma://` address gets from a build without NVMe/RDMA.
#[cfg(not(feature = "rdma"))]
fn no_rdma() -> HostError {
    HostError::Rdma(
        "this usnvme was built without NVMe/RDMA: install rdma-core's development files \
         (Debian: apt-get install libibverbs-dev librdmacm-dev libclang-dev pkg-config) and \
         build with `cargo build --release --features usnvme-tools/rdma`"
            .to_owned(),
    )
}

/// Runs `$body` on the queue inside whichever variant it is.
macro_rules! each {
    ($self:expr, $q:ident => $body:expr) => {
        match $self {
            FabricQueue::Tcp($q) => $body,
            #[cfg(feature = "rdma")]
            FabricQueue::Rdma($q) => $body,
        }
    };
}

impl FabricQueueSetup {
    /// Starts setting up queue `params.qid` at `addr` over `host.transport`.
    pub fn start(
        addr: SocketAddr,
        params: QueueParams,
        host: &HostOptions,
        buffers: Buffers,
    ) -> Result<FabricQueueSetup, HostError> {
        match host.transport {
            Transport::Tcp => Ok(FabricQueueSetup::Tcp(tcp::QueueSetup::start(
                addr, params, host, buffers,
            )?)),
            #[cfg(feature = "rdma")]
            Transport::Rdma => Ok(FabricQueueSetup::Rdma(rdma::QueueSetup::start(
                addr, params, host, buffers,
            )?)),
            #[cfg(not(feature = "rdma"))]
            Transport::Rdma => Err(no_rdma()),
        }
    }

    /// Moves the set-up on without waiting: true once the queue is connected.
    pub fn step(&mut self) -> Result<bool, HostError> {
        match self {
            FabricQueueSetup::Tcp(s) => s.step(),
            #[cfg(feature = "rdma")]
            FabricQueueSetup::Rdma(s) => s.step(),
        }
    }

    /// Sleeps until the set-up may move on (at most until its deadline).
    pub fn wait(&mut self) -> Result<(), HostError> {
        match self {
            FabricQueueSetup::Tcp(s) => s.wait(),
            #[cfg(feature = "rdma")]
            FabricQueueSetup::Rdma(s) => s.wait(),
        }
    }

    pub fn into_queue(self) -> FabricQueue {
        match self {
            FabricQueueSetup::Tcp(s) => FabricQueue::Tcp(s.into_queue()),
            #[cfg(feature = "rdma")]
            FabricQueueSetup::Rdma(s) => FabricQueue::Rdma(s.into_queue()),
        }
    }
}

impl FabricQueue {
    /// Connects queue `params.qid` at `addr` over `host.transport`, waiting.
    pub fn connect(
        addr: SocketAddr,
        params: QueueParams,
        host: &HostOptions,
        buffers: Buffers,
    ) -> Result<FabricQueue, HostError> {
        let mut setup = FabricQueueSetup::start(addr, params, host, buffers)?;
        while !setup.step()? {
            setup.wait()?;
        }
        Ok(setup.into_queue())
    }

    /// Queues an I/O to namespace `ns`: all or nothing.
    #[inline]
    pub fn submit_to(
        &mut self,
        ns: IoNamespace,
        op: Op,
        slba: u64,
        blocks: u32,
        buf: Option<IoBuffer>,
        token: u64,
    ) -> Result<(), SubmitError> {
        each!(self, q => q.submit_to(ns, op, slba, blocks, buf, token))
    }

    /// Sends again an I/O another queue of the controller had not finished.
    pub fn resubmit(&mut self, u: Unfinished) -> Result<(), SubmitError> {
        each!(self, q => q.resubmit(u))
    }

    /// Queues any command, its data in the queue's buffers.
    pub fn submit_command(&mut self, sqe: Sqe, data: Data, token: u64) -> Result<(), SubmitError> {
        each!(self, q => q.submit_command(sqe, data, token))
    }

    #[inline]
    pub fn flush(&mut self) {
        each!(self, q => q.flush())
    }

    #[inline]
    pub fn poll(&mut self, on_done: impl FnMut(Completion)) -> usize {
        each!(self, q => q.poll(on_done))
    }

    pub fn wait(&mut self, timeout: Duration) -> Result<(), HostError> {
        each!(self, q => q.wait(timeout))
    }

    #[inline]
    pub fn set_now(&mut self, now_ns: u64) {
        each!(self, q => q.set_now(now_ns))
    }

    pub fn in_flight(&self) -> usize {
        each!(self, q => q.in_flight())
    }

    pub fn free(&self) -> usize {
        each!(self, q => q.free())
    }

    pub fn ended(&self) -> Option<Failure> {
        each!(self, q => q.ended())
    }

    pub fn qid(&self) -> u16 {
        match self {
            FabricQueue::Tcp(q) => q.session().qid(),
            #[cfg(feature = "rdma")]
            FabricQueue::Rdma(q) => q.qid(),
        }
    }

    /// The controller (on an admin queue, the one the target granted).
    pub fn cntlid(&self) -> u16 {
        match self {
            FabricQueue::Tcp(q) => q.session().cntlid(),
            #[cfg(feature = "rdma")]
            FabricQueue::Rdma(q) => q.cntlid(),
        }
    }

    /// The most data the target takes in one H2CData PDU (NVMe/TCP; 0 on RDMA).
    pub fn maxh2cdata(&self) -> u32 {
        match self {
            FabricQueue::Tcp(q) => q.session().negotiated().1,
            #[cfg(feature = "rdma")]
            FabricQueue::Rdma(_) => 0,
        }
    }

    /// Write data up to `bytes` goes in the command capsule from now on.
    pub fn set_in_capsule(&mut self, bytes: u32) {
        match self {
            FabricQueue::Tcp(q) => q.session_mut().set_in_capsule(bytes),
            #[cfg(feature = "rdma")]
            FabricQueue::Rdma(q) => q.set_in_capsule(bytes),
        }
    }

    /// A command not completed within `ns` nanoseconds from now on ends the queue.
    pub fn set_timeout(&mut self, ns: u64) {
        match self {
            FabricQueue::Tcp(q) => q.session_mut().set_timeout(ns),
            #[cfg(feature = "rdma")]
            FabricQueue::Rdma(q) => q.set_timeout(ns),
        }
    }

    pub fn keep_unfinished(&mut self, keep: bool) {
        each!(self, q => q.keep_unfinished(keep))
    }

    pub fn reroute_path_errors(&mut self) {
        each!(self, q => q.reroute_path_errors())
    }

    pub fn take_rerouted(&mut self, take: impl FnMut(Unfinished, Status)) {
        each!(self, q => q.take_rerouted(take))
    }

    pub fn take_unfinished(&mut self, take: impl FnMut(Unfinished)) {
        each!(self, q => q.take_unfinished(take))
    }

    /// Ends the queue: what is in flight fails as aborted.
    pub fn close(&mut self, on_done: impl FnMut(Completion)) -> usize {
        each!(self, q => q.close(on_done))
    }
}
