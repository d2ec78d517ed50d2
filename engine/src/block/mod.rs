//! The block layer: a `BlockDevice` (an NVMe namespace, or a stripe over block devices) hands
//! each reactor its own `Channel`, which submits I/O by byte offset and polls for completions.
//! Large I/Os are split (at the controller's maximum transfer, at stripe chunks) and complete
//! once, when every part has; a part that fails fails the whole I/O with the part's error.

mod namespace;
pub mod remote;
mod split;
mod stripe;

use std::os::fd::BorrowedFd;
use std::sync::Arc;

use usnvme_driver::spec::Status;
use usnvme_driver::{IoBuffer, SubmitError};

pub use crate::transport::{ChannelOptions, DmaTarget, Op};
use crate::transport::{NamespaceProtection, Queues};

pub use namespace::{NamespaceChannel, NamespaceDevice, PiMode};
pub use stripe::{StripeChannel, StripeDevice};

/// The largest token a caller may give an I/O (60 bits). The bits above are the block
/// layer's: the op kind for statistics (63-62), and the marks of an I/O split at a namespace
/// (61) or over a stripe (60), whose parts carry the index of their parent instead. One token
/// travels from the caller to the driver's tracker and back; no layer keeps a table of its
/// own for an I/O that is one command.
pub const MAX_TOKEN: u64 = (1 << 60) - 1;
pub(crate) const NAMESPACE_PARENT: u64 = 1 << 61;
pub(crate) const STRIPE_PARENT: u64 = 1 << 60;

/// The shape of a block device.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BlockInfo {
    pub name: String,
    pub size_bytes: u64,
    pub block_size: u32,
    /// The I/O size that performs best (a stripe: its chunk; a namespace: its block size, or
    /// the namespace's optimal I/O boundary where reported).
    pub optimal_io: u64,
    /// The largest I/O one command carries; larger ones are split.
    pub max_io: u64,
    /// A namespace formatted with metadata, driven with it: what its buffers hold besides the
    /// data ([`NamespaceProtection::layout`]) and the protection asked of every command.
    pub protection: Option<NamespaceProtection>,
}

impl BlockInfo {
    /// Bytes an I/O of `len` data bytes needs in its buffer: its blocks' metadata too where it
    /// travels.
    pub fn buffer_bytes(&self, len: u64) -> u64 {
        match self.protection {
            Some(p) => {
                let (stride, apart) = p.layout(self.block_size);
                len / u64::from(self.block_size.max(1)) * (stride + apart)
            }
            None => len,
        }
    }
}

/// A block device: anything that can give a reactor a channel.
pub trait BlockDevice: Send + Sync + std::fmt::Debug {
    fn info(&self) -> &BlockInfo;
    /// Where buffers for this device's I/O come from.
    fn dma(&self) -> DmaTarget;
    /// The drives (by the engine's index) whose queue pairs a channel uses.
    fn drives(&self) -> Vec<usize>;
    /// The namespace ID when the device is one namespace of one local drive (`drives()`);
    /// None for a stripe or a remote namespace.
    fn local_nsid(&self) -> Option<u32> {
        None
    }
    /// A channel for the calling thread, on its queues to the controllers under the device
    /// (the reactor's `queues`, shared with its other devices on those controllers).
    fn channel(
        &self,
        queues: &mut Queues,
        options: &ChannelOptions,
    ) -> Result<Channel, usnvme_driver::Error>;
}

/// Why an I/O failed, by kind: what callers match on. Each kind names the device (the member
/// of a stripe) it failed on; [`IoError::status`] is the NVMe status it completed with.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum IoError {
    /// A controller reset aborted it (a command timed out, the controller failed, or a reset
    /// was asked for): it may or may not have been carried out, and may be retried.
    #[error("{device}: aborted by a controller reset (Command Aborted By Host)")]
    AbortedByReset { device: Arc<str> },
    /// The device is gone (surprise removal, or it failed for good): nothing more completes on it.
    #[error("{device}: the device is gone (Host Pathing Error)")]
    Removed { device: Arc<str> },
    /// It outlived the command timeout and was aborted on the device.
    #[error("{device}: timed out and was aborted (Command Abort Requested)")]
    TimedOut { device: Arc<str> },
    /// The device completed it with an error status.
    #[error("{device}: {status}")]
    Device { device: Arc<str>, status: Status },
}

impl IoError {
    /// The kind of a failed completion. The driver reports the failures it detects itself with
    /// statuses of their own: a reset's aborts as "Command Aborted By Host", a removed or dead
    /// device as "Host Pathing Error", and a timed-out command is aborted on the device, which
    /// completes it with "Command Abort Requested".
    pub fn from_status(device: Arc<str>, status: Status) -> IoError {
        match status.code() {
            Status::ABORTED_BY_HOST => IoError::AbortedByReset { device },
            Status::HOST_PATHING_ERROR => IoError::Removed { device },
            Status::ABORT_REQUESTED => IoError::TimedOut { device },
            _ => IoError::Device { device, status },
        }
    }

    /// The NVMe status the I/O completed with.
    pub fn status(&self) -> Status {
        match self {
            IoError::AbortedByReset { .. } => Status::ABORTED_BY_HOST,
            IoError::Removed { .. } => Status::HOST_PATHING_ERROR,
            IoError::TimedOut { .. } => Status::ABORT_REQUESTED,
            IoError::Device { status, .. } => *status,
        }
    }

    /// The device (the member of a stripe) the I/O failed on.
    pub fn device(&self) -> &Arc<str> {
        match self {
            IoError::AbortedByReset { device }
            | IoError::Removed { device }
            | IoError::TimedOut { device }
            | IoError::Device { device, .. } => device,
        }
    }
}

/// A finished I/O: its token and, when it failed, how ([`IoCompletion::result`] gives the
/// error of its kind, made only then).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct IoCompletion {
    pub token: u64,
    /// None when it succeeded.
    pub failure: Option<Failure>,
}

impl IoCompletion {
    /// How it went, as the error of its kind.
    #[inline]
    pub fn result(&self) -> Result<(), IoError> {
        Failure::result(&self.failure)
    }
}

/// How an I/O failed, as it travels up from the queue pair: the device (the member of a
/// stripe) and the NVMe status. The [`IoError`] of its kind is made from it when asked for
/// ([`Failure::error`]); an I/O that went well carries none (nothing to move, clone or drop
/// per I/O but a null pointer).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Failure {
    pub device: Arc<str>,
    pub status: Status,
}

impl Failure {
    /// The error of its kind (see [`IoError::from_status`]).
    pub fn error(self) -> IoError {
        IoError::from_status(self.device, self.status)
    }

    /// How an I/O that carries `failure` went, as the error of its kind.
    #[inline]
    pub fn result(failure: &Option<Failure>) -> Result<(), IoError> {
        match failure {
            None => Ok(()),
            Some(f) => Err(f.clone().error()),
        }
    }
}

/// A finished I/O as a channel hands it up: the token it was given, how it went, and when it
/// was submitted (the queue pair's clock) and how many bytes it moved, for statistics.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Finished {
    pub token: u64,
    /// None when it succeeded.
    pub failure: Option<Failure>,
    pub submitted_ns: u64,
    pub bytes: u64,
}

impl Finished {
    /// How it went, as the error of its kind.
    #[inline]
    pub fn result(&self) -> Result<(), IoError> {
        Failure::result(&self.failure)
    }
}

/// Why an I/O was not submitted (nothing was queued; the token is not returned).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum BlockError {
    #[error("{device}: offset {offset} and length {len} must be multiples of the {block_size}-byte block size")]
    Misaligned {
        device: Arc<str>,
        offset: u64,
        len: u64,
        block_size: u32,
    },
    #[error(
        "{device}: {len} bytes at offset {offset} go past the end of the device ({size} bytes)"
    )]
    OutOfRange {
        device: Arc<str>,
        offset: u64,
        len: u64,
        size: u64,
    },
    #[error("{device}: {op:?} needs a buffer of at least {len} bytes")]
    Buffer { device: Arc<str>, op: Op, len: u64 },
    #[error("{device}: no room for {needed} more commands now: poll for completions first")]
    Busy { device: Arc<str>, needed: usize },
    #[error("{device}: {source}")]
    Submit {
        device: Arc<str>,
        source: SubmitError,
    },
    #[error("{device}: token {token:#x} is larger than the block layer's {MAX_TOKEN:#x}")]
    Token { device: Arc<str>, token: u64 },
}

impl BlockError {
    /// `device` has no room for `needed` more commands until it is polled.
    pub(crate) fn busy(device: &Arc<str>, needed: usize) -> Self {
        BlockError::Busy {
            device: device.clone(),
            needed,
        }
    }

    /// A driver's refusal, by kind: the caller's offset or length, the range, a full queue.
    fn from_driver(
        device: &Arc<str>,
        offset: u64,
        len: u64,
        e: SubmitError,
        info: &BlockInfo,
    ) -> Self {
        let device = device.clone();
        match e {
            SubmitError::NotBlockMultiple { block_size, .. } => BlockError::Misaligned {
                device,
                offset,
                len,
                block_size,
            },
            SubmitError::LbaRange { .. } => BlockError::OutOfRange {
                device,
                offset,
                len,
                size: info.size_bytes,
            },
            SubmitError::QueueFull { .. } => BlockError::busy(&device, 1),
            source => BlockError::Submit { device, source },
        }
    }
}

/// One reactor's path to a block device, owned by one thread. An enum rather than a trait
/// object: the I/O path dispatches with a match and inlines down to the queue pair.
// The namespace variant is large (its queue pair) and kept inline: no pointer to chase per I/O.
#[allow(clippy::large_enum_variant)]
#[derive(Debug)]
pub enum Channel {
    /// A namespace, local or remote.
    Namespace(NamespaceChannel),
    Stripe(StripeChannel),
    /// The device was found gone: takes nothing, completes nothing.
    Gone(Arc<str>),
}

impl Channel {
    /// Queues `op` on `len` bytes at byte `offset` (`buf` for reads and writes), all or
    /// nothing. Doorbells ring on `flush` or `poll`.
    #[inline]
    pub fn submit(
        &mut self,
        op: Op,
        offset: u64,
        len: u64,
        buf: Option<IoBuffer>,
        token: u64,
    ) -> Result<(), BlockError> {
        match self {
            Channel::Namespace(c) => c.submit(op, offset, len, buf, token),
            Channel::Stripe(c) => c.submit(op, offset, len, buf, token),
            Channel::Gone(name) => Err(BlockError::Submit {
                device: name.clone(),
                source: SubmitError::Dead,
            }),
        }
    }

    /// Rings what was queued and hands finished I/Os up; returns how many.
    #[inline]
    pub fn poll(&mut self, on_finished: impl FnMut(Finished)) -> usize {
        match self {
            Channel::Namespace(c) => c.poll(on_finished),
            Channel::Stripe(c) => c.poll(on_finished),
            Channel::Gone(_) => 0,
        }
    }

    /// Rings the doorbells of what was queued since the last time.
    #[inline]
    pub fn flush(&mut self) {
        match self {
            Channel::Namespace(c) => c.flush(),
            Channel::Stripe(c) => c.flush(),
            Channel::Gone(_) => {}
        }
    }

    /// The owner's clock (nanoseconds), once per turn: the submission stamp of what follows.
    #[inline]
    pub fn set_now(&mut self, now_ns: u64) {
        match self {
            Channel::Namespace(c) => c.set_now(now_ns),
            Channel::Stripe(c) => c.set_now(now_ns),
            Channel::Gone(_) => {}
        }
    }

    /// Whether commands are queued or in flight below.
    #[inline]
    pub fn busy(&self) -> bool {
        match self {
            Channel::Namespace(c) => c.busy(),
            Channel::Stripe(c) => c.busy(),
            Channel::Gone(_) => false,
        }
    }

    /// Commands that can be queued now (on the fullest queue below).
    pub fn free_commands(&self) -> usize {
        match self {
            Channel::Namespace(c) => c.free_commands(),
            Channel::Stripe(c) => c.free_commands(),
            Channel::Gone(_) => 0,
        }
    }

    /// The device is gone: every I/O in flight finishes with "Host Pathing Error", and the
    /// channel takes no more.
    pub fn abandon(&mut self, on_finished: impl FnMut(Finished)) -> usize {
        let name = match self {
            Channel::Namespace(c) => c.name().clone(),
            Channel::Stripe(c) => c.name().clone(),
            Channel::Gone(_) => return 0,
        };
        let failed = match self {
            Channel::Namespace(c) => c.abandon(on_finished),
            Channel::Stripe(c) => c.abandon(on_finished),
            Channel::Gone(_) => 0,
        };
        match self {
            Channel::Namespace(c) => c.leave(),
            Channel::Stripe(c) => c.leave(),
            Channel::Gone(_) => {}
        }
        *self = Channel::Gone(name);
        failed
    }

    /// Every channel of the reactor is set up and its [`Queues`] released: each queue that
    /// only this channel uses becomes its own (no shared cell on its I/O path).
    pub fn settle(self) -> Channel {
        match self {
            Channel::Namespace(c) => Channel::Namespace(c.settle()),
            Channel::Stripe(c) => Channel::Stripe(c.settle()),
            gone => gone,
        }
    }

    /// Whether a queue under the channel is shared with other channels of the reactor (the
    /// namespaces of one controller share its queue pair): its I/O then goes through the
    /// shared cell and its completions through the queue's routing.
    pub fn shares_queue(&self) -> bool {
        match self {
            Channel::Namespace(c) => c.shares_queue(),
            Channel::Stripe(c) => c.shares_queue(),
            Channel::Gone(_) => false,
        }
    }

    /// Why a queue under the channel ended, once one has (a remote target gone or lost: it
    /// has no registers to probe, its queue tells).
    pub fn ended(&self) -> Option<String> {
        match self {
            Channel::Namespace(c) => c.ended(),
            Channel::Stripe(c) => c.ended(),
            Channel::Gone(_) => None,
        }
    }

    /// How many times the remote queues under the channel connected again.
    pub fn reconnects(&self) -> u32 {
        match self {
            Channel::Namespace(c) => c.reconnects(),
            Channel::Stripe(c) => c.reconnects(),
            Channel::Gone(_) => 0,
        }
    }

    /// Adds the eventfds of the local queue pairs under the channel made with interrupts
    /// ([`ChannelOptions::interrupts`]) to `out`.
    pub fn interrupts<'a>(&'a self, out: &mut Vec<BorrowedFd<'a>>) {
        match self {
            Channel::Namespace(c) => out.extend(c.interrupt()),
            Channel::Stripe(c) => c.interrupts(out),
            Channel::Gone(_) => {}
        }
    }
}

/// Checks offset, length and buffer against the device.
pub(crate) fn check(
    info: &BlockInfo,
    device: &Arc<str>,
    op: Op,
    offset: u64,
    len: u64,
    buf: Option<IoBuffer>,
) -> Result<(), BlockError> {
    if op == Op::Flush {
        return Ok(());
    }
    // block sizes are powers of two: masks, not divisions, on the I/O path
    let mask = info.block_size as u64 - 1;
    if offset & mask != 0 || len & mask != 0 || len == 0 {
        return Err(BlockError::Misaligned {
            device: device.clone(),
            offset,
            len,
            block_size: info.block_size,
        });
    }
    if offset
        .checked_add(len)
        .is_none_or(|end| end > info.size_bytes)
    {
        return Err(BlockError::OutOfRange {
            device: device.clone(),
            offset,
            len,
            size: info.size_bytes,
        });
    }
    if op.has_data() && buf.is_none_or(|b| (b.len as u64) < len) {
        return Err(BlockError::Buffer {
            device: device.clone(),
            op,
            len,
        });
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn channels_sized_in_ios_hold_every_part_of_each_within_the_grant() {
        let entries = |depth, io_size| ChannelOptions {
            depth,
            io_size,
            ..ChannelOptions::default()
        };
        // ring entries as given
        assert_eq!(entries(64, None).queue_entries(128 << 10, 1023), 64);
        // 32 I/Os of 4 KiB: up to 2 commands each (a straddled boundary), one entry empty
        assert_eq!(entries(32, Some(4096)).queue_entries(128 << 10, 1023), 65);
        // 1 MiB I/Os on a 128 KiB MDTS: 9 parts each
        assert_eq!(entries(8, Some(1 << 20)).queue_entries(128 << 10, 1023), 73);
        // never more than the drive grants
        assert_eq!(
            entries(256, Some(1 << 20)).queue_entries(128 << 10, 1023),
            1024
        );
    }

    #[test]
    fn failures_the_driver_reports_have_kinds_and_keep_their_status() {
        let device: Arc<str> = Arc::from("0000:01:00.0");
        let kind = |status| IoError::from_status(device.clone(), status);
        assert!(matches!(
            kind(Status::ABORTED_BY_HOST),
            IoError::AbortedByReset { .. }
        ));
        assert!(matches!(
            kind(Status::HOST_PATHING_ERROR),
            IoError::Removed { .. }
        ));
        assert!(matches!(
            kind(Status::ABORT_REQUESTED),
            IoError::TimedOut { .. }
        ));
        assert_eq!(
            kind(Status::WRITE_FAULT),
            IoError::Device {
                device: device.clone(),
                status: Status::WRITE_FAULT
            }
        );
        for status in [
            Status::ABORTED_BY_HOST,
            Status::HOST_PATHING_ERROR,
            Status::ABORT_REQUESTED,
            Status::WRITE_FAULT,
        ] {
            let e = kind(status);
            assert_eq!((e.status(), e.device()), (status, &device));
            assert!(e.to_string().starts_with("0000:01:00.0: "), "{e}");
        }
    }
}
