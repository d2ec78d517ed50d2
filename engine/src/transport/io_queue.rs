//! One I/O queue API over both transports. An enum, not a trait object: the I/O path
//! dispatches with a match and inlines down to the queue pair.

use std::os::fd::OwnedFd;

use usnvme_driver::protection::{MetadataFormat, PiChecks, PiFields, PiType};
use usnvme_driver::{Completion, IoBuffer, MetadataIo, QueuePair, SubmitError};

use super::tcp::RemoteQueue;
use super::SharedQueue;
use crate::transport::tcp::initiator::IoNamespace;
use crate::transport::Op;

/// The namespace a command goes to: its ID and shape, and how its metadata is moved.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct QueueNamespace {
    pub nsid: u32,
    pub block_size: u32,
    pub blocks: u64,
    /// Set for a namespace formatted with metadata (None: it has none).
    pub protection: Option<NamespaceProtection>,
}

impl QueueNamespace {
    /// A namespace without metadata.
    pub fn plain(nsid: u32, block_size: u32, blocks: u64) -> QueueNamespace {
        QueueNamespace {
            nsid,
            block_size,
            blocks,
            protection: None,
        }
    }
}

/// How the engine reads and writes a namespace formatted with metadata (perf and sweep `--pi`):
/// its format, PRACT, PRCHK and the application tag of every command. The reference tag of a
/// command follows from its LBA (types 1 and 2: the LBA, as type 1 requires; type 3: 0 for
/// every block, which a drive keeps as given), so that any read finds the tags any write left.
///
/// A read or write buffer holds, per block, `stride` bytes (its data, then its metadata on an
/// extended-LBA format), then the metadata apart (`apart` bytes per block) after all of them;
/// where PRACT strips a tuple that is all the metadata, buffers hold the data only.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct NamespaceProtection {
    pub format: MetadataFormat,
    pub action: bool,
    pub checks: PiChecks,
    pub app_tag: u16,
}

impl NamespaceProtection {
    /// Bytes per block in the buffer: interleaved with the data, and apart after it.
    pub fn layout(&self, block_size: u32) -> (u64, u64) {
        self.format.bytes_per_block(block_size, self.action)
    }

    /// Whether any metadata travels (else buffers are as for a namespace without).
    pub fn moves_metadata(&self, block_size: u32) -> bool {
        self.layout(block_size) != (u64::from(block_size), 0)
    }

    /// The reference tag of the command at `lba` (see the type's doc): the namespace's own
    /// LBA, so each member of a stripe tags its blocks with its LBAs, not the stripe's (perf's
    /// stripe tests with PRCHK=REFTAG on type 1 check it: the drive refuses any other tag).
    pub fn ref_tag(&self, lba: u64) -> u64 {
        match self.format.protection {
            Some(pi) if pi.pi_type != PiType::Type3 => lba & pi.ref_tag_mask(),
            _ => 0,
        }
    }

    /// The PI fields of a command at `lba` (none on a format without PI).
    pub fn fields(&self, lba: u64) -> PiFields {
        if self.format.protection.is_none() {
            return PiFields::default();
        }
        PiFields {
            action: self.action,
            checks: self.checks,
            ref_tag: self.ref_tag(lba),
            app_tag: self.app_tag,
            app_mask: 0xffff,
        }
    }

    /// A command's buffers, carved from `buf` (a whole number of blocks laid out as above).
    fn io(&self, ns: &QueueNamespace, lba: u64, buf: IoBuffer) -> (u32, MetadataIo) {
        let (stride, apart) = self.layout(ns.block_size);
        let blocks = u64::from(buf.len) / (stride + apart);
        let data = IoBuffer {
            iova: buf.iova,
            len: (blocks * stride) as u32,
        };
        let metadata = (apart > 0).then(|| IoBuffer {
            iova: buf.iova + blocks * stride,
            len: (blocks * apart) as u32,
        });
        let io = MetadataIo {
            data,
            metadata,
            pi: self.fields(lba),
        };
        (blocks as u32, io)
    }
}

/// A polled I/O queue of one controller: commands for any of its namespaces go in with a
/// token and come back with it and their status.
// The PCIe variant is large (its queue pair) and kept inline: no pointer to chase per I/O.
#[allow(clippy::large_enum_variant)]
#[derive(Debug)]
pub enum IoQueue {
    /// A queue pair on a local controller.
    Pcie(QueuePair),
    /// An NVMe/TCP I/O queue of a remote controller.
    Tcp(RemoteQueue),
    /// One of those, shared with the channels of the controller's other namespaces on the
    /// reactor: this handle is namespace `nsid`'s channel's, with its commands in flight.
    Shared {
        queue: SharedQueue,
        nsid: u32,
        in_flight: usize,
    },
}

impl IoQueue {
    /// Queues `op` on namespace `ns` from block `lba`: a read or write of `buf` (its length in
    /// whole blocks), Write Zeroes or Deallocate of `blocks` blocks, a flush; it goes out on
    /// the next flush or poll. Each transport checks the command against the namespace (a
    /// local queue pair knows its geometry).
    // A local read or write, the I/O path, is inlined down to the queue pair; the rest goes
    // out of line, so that what is inlined stays small enough for the queue pair's own code to
    // be inlined too.
    #[inline(always)]
    pub fn submit(
        &mut self,
        ns: QueueNamespace,
        op: Op,
        lba: u64,
        blocks: u32,
        buf: Option<IoBuffer>,
        token: u64,
    ) -> Result<(), SubmitError> {
        match (self, op, buf) {
            (IoQueue::Pcie(qp), Op::Read, Some(b)) => qp.read(ns.nsid, lba, b, token),
            (IoQueue::Pcie(qp), Op::Write, Some(b)) => qp.write(ns.nsid, lba, b, token),
            (queue, op, buf) => queue.submit_other(ns, op, lba, blocks, buf, token),
        }
    }

    /// [`IoQueue::submit`], or [`IoQueue::submit_protected`] for a read or write of a
    /// namespace with metadata: what the paths off the I/O path call (splits, shared queues).
    pub fn submit_any(
        &mut self,
        ns: QueueNamespace,
        op: Op,
        lba: u64,
        blocks: u32,
        buf: Option<IoBuffer>,
        token: u64,
    ) -> Result<(), SubmitError> {
        match (ns.protection, buf) {
            (Some(_), Some(b)) if op.has_data() => self.submit_protected(ns, op, lba, b, token),
            _ => self.submit(ns, op, lba, blocks, buf, token),
        }
    }

    /// A read or write of a namespace with metadata, `buf` laid out as its
    /// [`NamespaceProtection`] says (its blocks follow from its length). Out of line: the
    /// channel of such a namespace sends its reads and writes here, never down the I/O path.
    #[inline(never)]
    pub fn submit_protected(
        &mut self,
        ns: QueueNamespace,
        op: Op,
        lba: u64,
        buf: IoBuffer,
        token: u64,
    ) -> Result<(), SubmitError> {
        let (Some(p), Op::Read | Op::Write) = (ns.protection, op) else {
            return self.submit(ns, op, lba, 0, Some(buf), token);
        };
        match self {
            IoQueue::Pcie(qp) => {
                let (blocks, io) = p.io(&ns, lba, buf);
                if op == Op::Write {
                    qp.write_with_metadata(ns.nsid, lba, blocks, io, token)
                } else {
                    qp.read_with_metadata(ns.nsid, lba, blocks, io, token)
                }
            }
            IoQueue::Tcp(_) => Err(SubmitError::Unsupported {
                what: "metadata or protection information over NVMe/TCP",
            }),
            IoQueue::Shared {
                queue, in_flight, ..
            } => {
                queue.submit(ns, op, lba, 0, Some(buf), token)?;
                *in_flight += 1;
                Ok(())
            }
        }
    }

    /// Everything but a local read or write (see [`IoQueue::submit`]).
    #[inline(never)]
    fn submit_other(
        &mut self,
        ns: QueueNamespace,
        op: Op,
        lba: u64,
        blocks: u32,
        buf: Option<IoBuffer>,
        token: u64,
    ) -> Result<(), SubmitError> {
        match self {
            IoQueue::Pcie(qp) => match (op, buf) {
                (Op::Read, Some(b)) => qp.read(ns.nsid, lba, b, token),
                (Op::Write, Some(b)) => qp.write(ns.nsid, lba, b, token),
                (Op::Flush, _) => qp.flush_cache(ns.nsid, token),
                (Op::WriteZeroes, _) => qp.write_zeroes(ns.nsid, lba, blocks, token),
                (Op::Deallocate, _) => qp.deallocate(ns.nsid, lba, blocks, token),
                (Op::Read | Op::Write, None) => Err(SubmitError::Unsupported {
                    what: "a read or write without a buffer",
                }),
            },
            IoQueue::Tcp(q) => {
                let blocks = match (op, buf) {
                    (Op::Read | Op::Write, Some(b)) => b.len >> ns.block_size.trailing_zeros(),
                    _ => blocks,
                };
                check_remote(ns, op, lba, blocks, buf)?;
                let to = IoNamespace {
                    nsid: ns.nsid,
                    block_size: ns.block_size,
                };
                q.submit(to, op, lba, blocks, buf, token)
            }
            IoQueue::Shared {
                queue, in_flight, ..
            } => {
                queue.submit(ns, op, lba, blocks, buf, token)?;
                *in_flight += 1;
                Ok(())
            }
        }
    }

    /// Commands in flight.
    #[inline]
    pub fn in_flight(&self) -> usize {
        match self {
            IoQueue::Pcie(qp) => usize::from(qp.in_flight()),
            IoQueue::Tcp(q) => q.in_flight(),
            IoQueue::Shared { in_flight, .. } => *in_flight,
        }
    }

    /// Sends what was queued and hands every completion that came to `on_done`; returns how
    /// many.
    #[inline]
    pub fn poll(&mut self, on_done: impl FnMut(Completion)) -> usize {
        match self {
            IoQueue::Pcie(qp) => qp.poll(on_done),
            IoQueue::Tcp(q) => q.poll(on_done),
            IoQueue::Shared {
                queue,
                nsid,
                in_flight,
            } => {
                let done = queue.poll(*nsid, on_done);
                *in_flight = in_flight.saturating_sub(done);
                done
            }
        }
    }

    /// Sends what was queued since the last flush or poll.
    #[inline]
    pub fn flush(&mut self) {
        match self {
            IoQueue::Pcie(qp) => qp.flush(),
            IoQueue::Tcp(q) => q.flush(),
            IoQueue::Shared { queue, .. } => queue.flush(),
        }
    }

    /// The owner's clock (nanoseconds): what is submitted next is stamped with it.
    #[inline]
    pub fn set_now(&mut self, now_ns: u64) {
        match self {
            IoQueue::Pcie(qp) => qp.set_now(now_ns),
            IoQueue::Tcp(q) => q.set_now(now_ns),
            IoQueue::Shared { queue, .. } => queue.set_now(now_ns),
        }
    }

    /// Commands that can be queued now.
    #[inline]
    pub fn free(&self) -> usize {
        match self {
            IoQueue::Pcie(qp) => (qp.capacity() as usize).saturating_sub(qp.in_flight() as usize),
            IoQueue::Tcp(q) => q.free(),
            IoQueue::Shared { queue, .. } => queue.free(),
        }
    }

    /// The device is gone: every command in flight comes back "Host Pathing Error", and the
    /// queue takes no more.
    pub fn abandon(&mut self, mut on_done: impl FnMut(Completion)) -> usize {
        match self {
            IoQueue::Pcie(qp) => {
                let mut n = 0;
                qp.abandon(|c| {
                    n += 1;
                    on_done(c)
                });
                n
            }
            IoQueue::Tcp(q) => q.abandon(on_done),
            IoQueue::Shared {
                queue,
                nsid,
                in_flight,
            } => {
                *in_flight = 0;
                queue.abandon(*nsid, on_done)
            }
        }
    }

    /// Why the queue ended, once it has: a remote target was given up (it went away and
    /// did not come back in time). (A local controller's queue pair does not end: a removed
    /// device is found by its registers.)
    pub fn ended(&self) -> Option<String> {
        match self {
            IoQueue::Pcie(_) => None,
            IoQueue::Tcp(q) => q.ended(),
            IoQueue::Shared { queue, .. } => queue.ended(),
        }
    }

    /// A descriptor of the eventfd that a local queue pair made with interrupts has its
    /// controller raise when it posts a completion (a duplicate, for the caller to keep); None
    /// for a polled queue pair, and for a remote queue: a socket, which tells by itself.
    pub fn interrupt(&self) -> std::io::Result<Option<OwnedFd>> {
        match self {
            IoQueue::Pcie(qp) => qp.interrupt().map(|fd| fd.try_clone_to_owned()).transpose(),
            IoQueue::Tcp(_) => Ok(None),
            IoQueue::Shared { queue, .. } => queue.interrupt(),
        }
    }

    /// How many times a remote queue connected again (0 for a local one).
    pub fn reconnects(&self) -> u32 {
        match self {
            IoQueue::Pcie(_) => 0,
            IoQueue::Tcp(q) => q.reconnects(),
            IoQueue::Shared { queue, .. } => queue.reconnects(),
        }
    }

    /// Every channel of the reactor is set up and its queues released: a shared queue that
    /// only this handle still holds becomes its own (no shared cell on its I/O path).
    pub fn settle(self) -> IoQueue {
        match self {
            IoQueue::Shared {
                queue,
                nsid,
                in_flight,
            } => queue.into_own().unwrap_or_else(|queue| IoQueue::Shared {
                queue,
                nsid,
                in_flight,
            }),
            own => own,
        }
    }

    /// Whether this handle reaches its queue through the shared cell (the queue serves other
    /// channels of the reactor too).
    pub fn is_shared(&self) -> bool {
        matches!(self, IoQueue::Shared { .. })
    }

    /// The channel is going: a shared queue no longer keeps its namespace's completions.
    pub fn leave(&self) {
        if let IoQueue::Shared { queue, nsid, .. } = self {
            queue.remove_route(*nsid);
        }
    }
}

/// What a local queue pair checks itself: the data is whole blocks, within the namespace.
#[inline]
fn check_remote(
    ns: QueueNamespace,
    op: Op,
    lba: u64,
    blocks: u32,
    buf: Option<IoBuffer>,
) -> Result<(), SubmitError> {
    if let (Op::Read | Op::Write, Some(b)) = (op, buf) {
        if u64::from(b.len) != u64::from(blocks) * u64::from(ns.block_size) || blocks == 0 {
            return Err(SubmitError::NotBlockMultiple {
                bytes: u64::from(b.len),
                block_size: ns.block_size,
            });
        }
    }
    if op != Op::Flush
        && lba
            .checked_add(u64::from(blocks))
            .is_none_or(|end| end > ns.blocks)
    {
        return Err(SubmitError::LbaRange {
            slba: lba,
            blocks: u64::from(blocks),
            capacity: ns.blocks,
        });
    }
    Ok(())
}
