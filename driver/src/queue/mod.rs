//! A polled submission/completion queue pair, owned by one thread (`Send`, not `Sync`).
//!
//! Hot path: a command takes a tracker (indexed by command id, each with its own PRP-list slot
//! allocated up front), is built on the stack and copied into the SQ ring with one 64-byte store,
//! and waits for `flush`/`poll` to ring the SQ tail doorbell once per batch. `poll` consumes
//! completions by phase tag, frees trackers, takes the SQ head from `sqhd`, hands the caller's
//! token back, and rings the CQ head doorbell once. No allocation, lock or system call per I/O. With shadow doorbells (Doorbell Buffer
//! Config) MMIO is written only when the controller's EventIdx asks for it.
//!
//! A queue pair made with interrupts (`QueuePairOptions::interrupts`) is polled the same way;
//! its CQ also raises an MSI-X vector, whose eventfd its owner may sleep on when it has nothing
//! else to do: [`QueuePair::interrupt`], [`QueuePair::clear_interrupt`].

mod recovery;
mod ring;

use std::os::fd::{AsFd, BorrowedFd};
use std::sync::atomic::{fence, Ordering};
use std::sync::Arc;
use std::time::Instant;

use nix::sys::eventfd::EventFd;

use usnvme_hugepages::DmaRegion;
use vm_memory::Bytes;

use crate::error::{Error, SubmitError};
use crate::mmio::Doorbell;
use crate::protection::{Guard, MetadataFormat, PiFields};
use crate::prp::{self, PrpLayout, PAGE};
use crate::regs::Registers;
use crate::spec::command::MAX_BLOCKS_PER_COMMAND;
use crate::spec::{Csts, DsmRange, SglDescriptor, Sqe, Status};
use ring::{Rings, ShadowEntry};

const SQE_BYTES: usize = 64;
const CQE_BYTES: usize = 16;
/// Timeouts are checked every this many polls, not on every one: a poll that finds nothing
/// costs a few instructions, and timeouts are seconds long.
const TIMEOUT_CHECK_POLLS: u32 = 64;

/// A buffer for one command: IOVA-contiguous DMA memory (e.g. from a `BufferPool`).
/// The memory must stay mapped and untouched until the command completes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct IoBuffer {
    pub iova: u64,
    pub len: u32,
}

/// The buffers and protection fields of a read or write on a namespace formatted with
/// metadata: the data (with each block's metadata after its data on an extended-LBA format),
/// the metadata apart on other formats (None where the command moves none: see
/// [`MetadataFormat::bytes_per_block`]), PRACT, PRCHK and the tags.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MetadataIo {
    pub data: IoBuffer,
    pub metadata: Option<IoBuffer>,
    pub pi: PiFields,
}

/// One completed command.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Completion {
    /// The caller's token, as given at submission.
    pub token: u64,
    pub status: Status,
    /// Command specific result (CQE dword 0).
    pub dw0: u32,
    /// The queue pair's clock when the command was submitted (nanoseconds, see
    /// [`QueuePair::set_now`]): the caller's latency stamp, kept in the tracker.
    pub submitted_ns: u64,
    /// Bytes the command transferred (0 without data).
    pub bytes: u32,
}

/// The geometry of a namespace the queue pair checks I/O against (indexed by nsid - 1).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct NamespaceGeometry {
    pub nsid: u32,
    pub block_size: u32,
    pub blocks: u64,
    /// The metadata of its format: a namespace with metadata takes no plain read or write
    /// (data without its metadata would land in the wrong place, or fail the drive's checks),
    /// only [`QueuePair::read_with_metadata`] and [`QueuePair::write_with_metadata`].
    pub metadata: MetadataFormat,
}

/// Counters kept without atomics: the owner reads them.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct QueueStats {
    pub submitted: u64,
    pub completed: u64,
    pub sq_doorbells: u64,
    pub cq_doorbells: u64,
    /// Completions that named no command in flight, or an impossible SQ head: ignored.
    pub garbage: u64,
}

/// The one per-command context: the caller's token, its submission stamp and size (handed back
/// with the completion), and what recovery needs. 32 bytes: two trackers per cache line.
#[derive(Debug, Clone, Copy, Default)]
struct Tracker {
    token: u64,
    /// The queue pair's clock at submission, in nanoseconds (reset when its abort is sent).
    started_ns: u64,
    /// Where the command went in the SQ, counted from the queue's creation (wrapping).
    sq_position: u32,
    bytes: u32,
    busy: bool,
    abort_sent: bool,
}

// Two trackers per cache line.
const _: () = assert!(std::mem::size_of::<Tracker>() == 32);

/// A namespace as the queue pair checks commands against it, derived once from its geometry
/// and the largest transfer, so that the I/O path tests a read or write with one lookup and
/// three comparisons: whole blocks (`block_mask`), 1 to `max_blocks` of them (the 16-bit block
/// count and MDTS in one), inside the namespace. An nsid without a usable geometry has `nsid`
/// and `max_blocks` 0: every I/O fails the test, and the full checks (`blocks_for`) name what
/// is wrong.
#[derive(Debug, Clone, Copy, Default)]
struct IoLimits {
    nsid: u32,
    block_shift: u32,
    block_mask: u64,
    max_blocks: u64,
    blocks: u64,
    /// Non-zero: the namespace has metadata, and `max_blocks` is 0 (see NamespaceGeometry).
    metadata_size: u16,
}

impl IoLimits {
    fn of(g: &NamespaceGeometry, nsid: u32, max_transfer: u64) -> IoLimits {
        if g.nsid != nsid || !g.block_size.is_power_of_two() {
            return IoLimits::default();
        }
        if g.metadata.size > 0 {
            return IoLimits {
                nsid,
                metadata_size: g.metadata.size,
                ..IoLimits::default()
            };
        }
        let block_shift = g.block_size.trailing_zeros();
        IoLimits {
            nsid,
            block_mask: u64::from(g.block_size) - 1,
            block_shift,
            max_blocks: (max_transfer >> block_shift).min(MAX_BLOCKS_PER_COMMAND),
            blocks: g.blocks,
            metadata_size: 0,
        }
    }
}

/// Where the doorbells of this queue are: the MMIO registers, and the shadow doorbell /
/// EventIdx entries when Doorbell Buffer Config is on. Found once, when the queue is created.
#[derive(Debug)]
pub(crate) struct Doorbells {
    sq_tail: Doorbell,
    cq_head: Doorbell,
    shadow: Option<ShadowDoorbells>,
}

#[derive(Debug)]
struct ShadowDoorbells {
    sq_tail: ShadowEntry,
    cq_head: ShadowEntry,
    /// Write MMIO always, also keep the shadow current (the admin queue).
    always_mmio: bool,
}

impl Doorbells {
    /// The registers at byte offsets `sq_tail` and `cq_head` of `regs`.
    pub fn new(
        regs: &Arc<dyn Registers>,
        sq_tail: usize,
        cq_head: usize,
        shadow: Option<Shadow>,
    ) -> Doorbells {
        Doorbells {
            sq_tail: Doorbell::new(regs.clone(), sq_tail),
            cq_head: Doorbell::new(regs.clone(), cq_head),
            shadow: shadow.map(|s| ShadowDoorbells {
                sq_tail: ShadowEntry::new(s.pages.clone(), s.sq_tail, s.eventidx),
                cq_head: ShadowEntry::new(s.pages, s.cq_head, s.eventidx),
                always_mmio: s.always_mmio,
            }),
        }
    }
}

/// Shadow doorbell page and EventIdx page (one region of two pages) and this queue's offsets.
#[derive(Debug, Clone)]
pub(crate) struct Shadow {
    pub pages: Arc<DmaRegion>,
    pub sq_tail: usize,
    pub cq_head: usize,
    /// Offset of the EventIdx page in `pages`.
    pub eventidx: usize,
    /// Write MMIO always, also keep the shadow current (the admin queue).
    pub always_mmio: bool,
}

/// The MSI-X vector a queue pair's CQ raises, and the eventfd that vector signals.
#[derive(Debug)]
pub(crate) struct Interrupt {
    pub vector: u16,
    pub fd: Arc<EventFd>,
}

/// Completions between two writes of an I/O queue's CQ head doorbell, at least, where the
/// controller allows rings that large (see [`ring_entries`]).
const CQ_HEAD_BATCH: u16 = 64;

/// Ring entries for an I/O queue pair that keeps up to `depth - 1` commands in flight: as many
/// again, and at least [`CQ_HEAD_BATCH`] more, within `max_entries` (CAP.MQES + 1). A controller
/// needs the CQ head only to know where it may post: with spare entries beyond what can be in
/// flight, the driver writes the CQ head doorbell once per that many completions instead of
/// after every poll (at queue depth 1, half the doorbell writes).
pub(crate) fn ring_entries(depth: u16, max_entries: u16) -> u16 {
    let spare = depth.max(CQ_HEAD_BATCH);
    (u32::from(depth) + u32::from(spare)).min(u32::from(max_entries)) as u16
}

/// The memory layout of one queue pair: SQ ring, CQ ring, then one PRP-list slot per command id.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Layout {
    /// Entries of each ring.
    pub depth: u16,
    /// Command ids: at most this many commands in flight, fewer than `depth`.
    pub commands: u16,
    pub sq: usize,
    pub cq: usize,
    pub prp: usize,
    pub prp_slot: usize,
    pub bytes: usize,
}

impl Layout {
    /// Rings of `depth` entries for up to `commands` (at most `depth - 1`) commands in flight;
    /// `max_pages`: PRP entries the biggest transfer needs (MDTS / page + 1).
    pub fn new(depth: u16, commands: u16, max_pages: u64) -> Layout {
        let commands = commands.clamp(1, depth.saturating_sub(1).max(1));
        let round = |n: usize| n.div_ceil(PAGE as usize) * PAGE as usize;
        let sq = 0;
        let cq = round(depth as usize * SQE_BYTES);
        let prp = cq + round(depth as usize * CQE_BYTES);
        // a slot holds the PRP list (or the DSM ranges) of one command and never crosses a page
        let entries = (max_pages as usize).max(2); // at least one 16-byte DSM range
        let prp_slot = (entries * 8).next_power_of_two().clamp(64, PAGE as usize);
        let bytes = prp + commands as usize * prp_slot;
        Layout {
            depth,
            commands,
            sq,
            cq,
            prp,
            prp_slot,
            bytes,
        }
    }

    /// Most PRP entries a slot holds (beyond PRP1).
    pub fn slot_entries(&self) -> u64 {
        (self.prp_slot / 8) as u64
    }
}

// One thread owns a queue pair (moved to it, never shared): the hot path takes no lock.
static_assertions::assert_impl_all!(QueuePair: Send);
static_assertions::assert_not_impl_any!(QueuePair: Sync);

/// A submission/completion queue pair. Dropping an I/O queue pair has the controller delete its
/// queues (without waiting for it).
pub struct QueuePair {
    // (Rust lays the fields out as it sees fit: their order here is for reading only.)
    sq_tail: u16,
    sq_head: u16,
    /// Commands written to the SQ, and the SQ head, counted from the queue's creation
    /// (wrapping): a completion's SQ head is checked against them.
    sq_written: u32,
    sq_fetched: u32,
    sq_tail_rung: u16,
    cq_head: u16,
    /// The CQ head the controller was last told (see `ring_entries`), and how far the head may
    /// run ahead of it: ring entries beyond what can be in flight.
    cq_head_rung: u16,
    cq_slack: u16,
    cq_phase: bool,
    depth: u16,
    in_flight: u16,
    unusable: bool,
    free_cids: Vec<u16>,
    trackers: Box<[Tracker]>,
    rings: Rings,
    /// The namespaces, indexed by nsid - 1: as the I/O path checks them, and whole (for
    /// namespaces with metadata).
    limits: Box<[IoLimits]>,
    namespaces: Arc<[NamespaceGeometry]>,
    max_transfer: u64,
    use_sgl: bool,
    layout: Layout,
    memory: DmaRegion,
    doorbells: Doorbells,
    stats: QueueStats,
    /// The clock commands are stamped with, in nanoseconds: given by the owner once per turn
    /// ([`QueuePair::set_now`]), else read from `clock` when timeouts are checked.
    now_ns: u64,
    /// Polls since the last timeout check, and how many make one.
    polls: u32,
    timeout_check_polls: u32,
    /// When `check_timeouts` last ran, and when it next scans the trackers.
    checked_ns: u64,
    next_scan_ns: u64,
    timeout_ns: u64,
    /// The owner sets `now_ns`.
    owner_clock: bool,
    clock: Instant,
    /// The controller's reset generation this queue pair's queues belong to.
    generation: u64,
    qid: u16,
    /// The controller that owns the queues (None for the admin queue).
    owner: Option<Arc<dyn QueueOwner>>,
    /// Re-creating the queues after a reset, when under way (see `recovery`).
    recreate: Option<recovery::Recreate>,
    /// Aborts submitted and not completed yet: command id and ticket.
    aborts: Vec<(u16, Ticket)>,
    /// The interrupt the CQ raises (None: polled only).
    interrupt: Option<Interrupt>,
}

impl std::fmt::Debug for QueuePair {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("QueuePair")
            .field("qid", &self.qid)
            .field("depth", &self.depth)
            .field("in_flight", &self.in_flight)
            .field("stats", &self.stats)
            .finish()
    }
}

/// An admin command submitted without waiting: its outcome is asked for with this.
pub(crate) type Ticket = u64;

/// What a dropped queue pair leaves on the controller: which of its queues to delete, after
/// which outstanding creation command.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct Release {
    pub delete_sq: bool,
    pub delete_cq: bool,
    pub after: Option<Ticket>,
}

/// What an I/O queue pair needs of the controller that owns its queues, for the cold paths:
/// noticing a reset, admin commands (re-creating its queues after one, aborting), starting a
/// reset, giving its queues back. None of it waits: the owning thread polls many devices.
/// The controller implements it; this module knows no controller.
pub(crate) trait QueueOwner: Send + Sync {
    fn name(&self) -> &str;
    /// Even while the controller is ready, odd while a reset is under way.
    fn generation(&self) -> u64;
    /// The last reset failed.
    fn failed(&self) -> bool;
    fn status(&self) -> Csts;
    /// Returns at once; the reset runs elsewhere.
    fn start_reset(&self);
    /// Submits an admin command if that can be done now, for a controller still at
    /// `generation`; `Ok(None)`: try again later.
    fn submit_admin(&self, sqe: Sqe, generation: u64) -> Result<Option<Ticket>, Error>;
    /// The command's CQE dword 0 or error, once known (None: not yet).
    fn admin_result(&self, ticket: Ticket) -> Option<Result<u32, Error>>;
    fn forget_admin(&self, ticket: Ticket);
    /// Gives the queue id back once the queues `release` names are deleted.
    fn release_queue(&self, qid: u16, release: Release);
}

/// What the controller gives a new queue pair.
pub(crate) struct QueueSetup {
    pub qid: u16,
    pub layout: Layout,
    pub memory: DmaRegion,
    pub doorbells: Doorbells,
    pub namespaces: Arc<[NamespaceGeometry]>,
    pub max_transfer: u64,
    pub use_sgl: bool,
    /// Commands older than this are aborted, then the controller is reset (None: never).
    pub timeout: Option<std::time::Duration>,
    pub generation: u64,
    pub owner: Option<Arc<dyn QueueOwner>>,
    /// The MSI-X vector the CQ was created with, and its eventfd (None: polled only).
    pub interrupt: Option<Interrupt>,
}

impl QueuePair {
    pub(crate) fn new(setup: QueueSetup) -> QueuePair {
        let (depth, commands) = (setup.layout.depth, setup.layout.commands);
        // At most depth - 1: one slot stays empty so that a full SQ differs from an empty one.
        let free_cids: Vec<u16> = (0..commands).rev().collect();
        let rings = Rings::new(&setup.memory, setup.layout.sq, setup.layout.cq, depth);
        let limits = (1..)
            .zip(setup.namespaces.iter())
            .map(|(nsid, g)| IoLimits::of(g, nsid, setup.max_transfer))
            .collect();
        QueuePair {
            sq_tail: 0,
            sq_head: 0,
            sq_written: 0,
            sq_fetched: 0,
            sq_tail_rung: 0,
            cq_head: 0,
            cq_head_rung: 0,
            // With interrupts the controller is told the head after every poll that consumed
            // entries: a controller may send no new MSI-X message for a vector until the host
            // has acknowledged what was posted, and the owner sleeps after its last poll.
            cq_slack: match setup.interrupt {
                Some(_) => 0,
                None => depth - 1 - commands,
            },
            cq_phase: true,
            depth,
            in_flight: 0,
            // cannot happen: the controller sizes the region for the rings
            unusable: !rings.is_valid(),
            free_cids,
            trackers: vec![Tracker::default(); commands as usize].into_boxed_slice(),
            rings,
            limits,
            namespaces: setup.namespaces,
            max_transfer: setup.max_transfer,
            use_sgl: setup.use_sgl,
            layout: setup.layout,
            memory: setup.memory,
            doorbells: setup.doorbells,
            stats: QueueStats::default(),
            now_ns: 0,
            polls: 0,
            // An owner that sleeps until an interrupt polls once per wake-up, not in a loop:
            // there every poll checks (on the owner's clock; a scan is still rare).
            timeout_check_polls: match setup.interrupt {
                Some(_) => 1,
                None => TIMEOUT_CHECK_POLLS,
            },
            checked_ns: 0,
            next_scan_ns: 0,
            timeout_ns: setup.timeout.map_or(0, |t| {
                t.as_nanos().clamp(1_000_000, u64::MAX as u128 / 4) as u64
            }),
            owner_clock: false,
            clock: Instant::now(),
            generation: setup.generation,
            qid: setup.qid,
            owner: setup.owner,
            recreate: None,
            aborts: Vec::new(),
            interrupt: setup.interrupt,
        }
    }

    /// The eventfd the controller signals when it posts a completion to this queue pair's CQ
    /// (its MSI-X vector's), for the owner's epoll or poll; None for a polled queue pair.
    ///
    /// The owner with nothing else to do sleeps until it is readable, then calls
    /// [`QueuePair::clear_interrupt`] and only then [`QueuePair::poll`]: a completion posted
    /// after that poll raises it again, so no wake-up is lost. A device that is removed raises
    /// nothing more: sleep with a timeout, and poll after it (timeouts and removal are found by
    /// polls).
    pub fn interrupt(&self) -> Option<BorrowedFd<'_>> {
        self.interrupt.as_ref().map(|i| i.fd.as_fd())
    }

    /// The MSI-X vector the CQ raises (None for a polled queue pair).
    pub fn interrupt_vector(&self) -> Option<u16> {
        self.interrupt.as_ref().map(|i| i.vector)
    }

    /// Clears the interrupt (reads its eventfd without blocking); returns whether it was
    /// raised. One system call: after a wake-up, before polling, never on the I/O path.
    pub fn clear_interrupt(&self) -> bool {
        self.interrupt.as_ref().is_some_and(|i| i.fd.read().is_ok())
    }

    /// Raises the interrupt as the controller would, so that the owner's next sleep ends at once.
    fn raise_interrupt(&self) {
        if let Some(i) = &self.interrupt {
            // only fails when the counter would overflow: it is raised then
            let _ = i.fd.write(1);
        }
    }

    pub fn qid(&self) -> u16 {
        self.qid
    }

    /// Ring entries.
    pub fn depth(&self) -> u16 {
        self.depth
    }

    /// Most commands in flight at once (fewer than the ring entries).
    pub fn capacity(&self) -> u16 {
        self.trackers.len() as u16
    }

    pub fn in_flight(&self) -> u16 {
        self.in_flight
    }

    pub fn stats(&self) -> QueueStats {
        self.stats
    }

    /// The time, in nanoseconds on the owner's monotonic clock: commands submitted from now on
    /// carry it as their stamp, and timeouts are measured on it. An owner that polls in a loop
    /// reads its clock once per turn and passes it here, so the queue pair reads none itself.
    #[inline]
    pub fn set_now(&mut self, now_ns: u64) {
        self.now_ns = now_ns;
        self.owner_clock = true;
    }

    /// Memory this queue pair holds: DMA (rings and PRP-list slots) and host (trackers).
    pub fn memory_bytes(&self) -> (usize, usize) {
        let host = std::mem::size_of::<Self>()
            + self.trackers.len() * std::mem::size_of::<Tracker>()
            + self.free_cids.capacity() * 2
            + self.aborts.capacity() * std::mem::size_of::<(u16, Ticket)>();
        (self.memory.len(), host)
    }

    /// The largest transfer one command may carry, in bytes.
    pub fn max_transfer(&self) -> u64 {
        self.max_transfer
    }

    pub(crate) fn sq_iova(&self) -> u64 {
        self.memory.iova_of(self.layout.sq)
    }

    pub(crate) fn cq_iova(&self) -> u64 {
        self.memory.iova_of(self.layout.cq)
    }

    /// Marks the queue pair unusable (controller failed or removed): submissions are refused.
    pub(crate) fn make_unusable(&mut self) {
        self.unusable = true;
    }

    /// Whether the controller was reset since this queue pair's queues were created.
    fn lost_queues(&self) -> bool {
        self.owner
            .as_ref()
            .is_some_and(|o| self.lost_queues_of(&**o))
    }

    fn lost_queues_of(&self, owner: &dyn QueueOwner) -> bool {
        owner.generation() != self.generation
    }

    /// Read `buf.len` bytes at `slba` into `buf`.
    #[inline]
    pub fn read(
        &mut self,
        nsid: u32,
        slba: u64,
        buf: IoBuffer,
        token: u64,
    ) -> Result<(), SubmitError> {
        let blocks = self.io_blocks(nsid, slba, buf.len)?;
        self.submit_io(Sqe::read(nsid, slba, blocks), buf, token)
    }

    /// Write `buf.len` bytes from `buf` at `slba`.
    #[inline]
    pub fn write(
        &mut self,
        nsid: u32,
        slba: u64,
        buf: IoBuffer,
        token: u64,
    ) -> Result<(), SubmitError> {
        let blocks = self.io_blocks(nsid, slba, buf.len)?;
        self.submit_io(Sqe::write(nsid, slba, blocks), buf, token)
    }

    /// Read `blocks` blocks at `slba` of a namespace formatted with metadata, into the
    /// buffers of `io`, with its PRACT, PRCHK and tags.
    pub fn read_with_metadata(
        &mut self,
        nsid: u32,
        slba: u64,
        blocks: u32,
        io: MetadataIo,
        token: u64,
    ) -> Result<(), SubmitError> {
        let sqe = self.metadata_command(Sqe::read(nsid, slba, blocks), io)?;
        self.submit_io(sqe, io.data, token)
    }

    /// Write `blocks` blocks at `slba` of a namespace formatted with metadata, from the
    /// buffers of `io`, with its PRACT, PRCHK and tags.
    pub fn write_with_metadata(
        &mut self,
        nsid: u32,
        slba: u64,
        blocks: u32,
        io: MetadataIo,
        token: u64,
    ) -> Result<(), SubmitError> {
        let sqe = self.metadata_command(Sqe::write(nsid, slba, blocks), io)?;
        self.submit_io(sqe, io.data, token)
    }

    /// The namespace `nsid` as this queue pair checks I/O against it.
    pub fn namespace_geometry(&self, nsid: u32) -> Option<NamespaceGeometry> {
        let g = self.namespaces.get(nsid.checked_sub(1)? as usize)?;
        (g.nsid == nsid).then_some(*g)
    }

    /// `sqe` (a read or write) checked against its namespace's format and completed with the
    /// metadata pointer and the protection fields.
    fn metadata_command(&self, mut sqe: Sqe, io: MetadataIo) -> Result<Sqe, SubmitError> {
        let MetadataIo { data, metadata, pi } = io;
        let (nsid, slba, blocks) = (sqe.nsid, sqe.slba(), u64::from(sqe.blocks()));
        let g = self
            .namespace_geometry(nsid)
            .ok_or(SubmitError::InvalidNamespace { nsid })?;
        let format = g.metadata;
        if format.size == 0 {
            return Err(SubmitError::NoMetadata { nsid });
        }
        if format.protection.is_none() && (pi.action || pi.cdw12() != 0) {
            return Err(SubmitError::NoProtection { nsid });
        }
        check_block_count(blocks)?;
        if slba.checked_add(blocks).is_none_or(|end| end > g.blocks) {
            return Err(SubmitError::LbaRange {
                slba,
                blocks,
                capacity: g.blocks,
            });
        }
        let (per_block, metadata_per_block) = format.bytes_per_block(g.block_size, pi.action);
        let bytes = u64::from(data.len);
        if bytes != blocks * per_block {
            return Err(SubmitError::DataLength {
                bytes,
                expected: blocks * per_block,
            });
        }
        if bytes > self.max_transfer {
            return Err(SubmitError::ExceedsMdts {
                bytes,
                max: self.max_transfer,
            });
        }
        let expected = blocks * metadata_per_block;
        sqe.mptr = match metadata {
            None if expected == 0 => 0,
            Some(m) if u64::from(m.len) == expected && expected > 0 && m.iova.is_multiple_of(4) => {
                m.iova
            }
            other => {
                return Err(SubmitError::MetadataLength {
                    bytes: other.map_or(0, |m| u64::from(m.len)),
                    expected,
                })
            }
        };
        sqe.cdw12 |= pi.cdw12();
        sqe.cdw14 = pi.ref_tag as u32;
        if format.protection.is_some_and(|p| p.guard == Guard::Crc64) {
            sqe.cdw3 = ((pi.ref_tag >> 32) & 0xffff) as u32;
        }
        sqe.cdw15 = u32::from(pi.app_tag) | u32::from(pi.app_mask) << 16;
        Ok(sqe)
    }

    /// The device is gone (surprise removal): hands every command in flight back with "Host
    /// Pathing Error" and refuses more. Its queues are not deleted (nothing would answer).
    pub fn abandon(&mut self, mut on_completion: impl FnMut(Completion)) {
        self.unusable = true;
        self.fail_all(Status::HOST_PATHING_ERROR, &mut on_completion);
    }

    pub fn flush_cache(&mut self, nsid: u32, token: u64) -> Result<(), SubmitError> {
        self.namespace(nsid)?;
        self.submit(Sqe::flush(nsid), token)
    }

    /// Zero `blocks` blocks at `slba` without a data transfer.
    pub fn write_zeroes(
        &mut self,
        nsid: u32,
        slba: u64,
        blocks: u32,
        token: u64,
    ) -> Result<(), SubmitError> {
        self.namespace(nsid)?;
        check_block_count(blocks as u64)?;
        self.submit(Sqe::write_zeroes(nsid, slba, blocks), token)
    }

    /// Deallocate (trim) `blocks` blocks at `slba`: Dataset Management with one range.
    pub fn deallocate(
        &mut self,
        nsid: u32,
        slba: u64,
        blocks: u32,
        token: u64,
    ) -> Result<(), SubmitError> {
        self.namespace(nsid)?;
        if blocks == 0 {
            return Err(SubmitError::BlockCount { blocks: 0 });
        }
        let cid = self.take_cid()?;
        // The range list lives in the command's own PRP-list slot.
        let offset = self.slot_offset(cid);
        let range = DsmRange::new(slba, blocks);
        if self.memory_write(offset, range).is_err() {
            self.free_cids.push(cid);
            return Err(SubmitError::Dead);
        }
        let mut sqe = Sqe::dataset_management(nsid, 1, true);
        sqe.prp1 = self.memory.iova_of(offset);
        self.push(sqe, cid, token, 0);
        Ok(())
    }

    /// Any command without data (admin commands use this too).
    pub fn submit(&mut self, sqe: Sqe, token: u64) -> Result<(), SubmitError> {
        let cid = self.take_cid()?;
        self.push(sqe, cid, token, 0);
        Ok(())
    }

    /// Any command with a data buffer.
    pub fn submit_data(&mut self, sqe: Sqe, buf: IoBuffer, token: u64) -> Result<(), SubmitError> {
        if buf.len as u64 > self.max_transfer {
            return Err(SubmitError::ExceedsMdts {
                bytes: buf.len as u64,
                max: self.max_transfer,
            });
        }
        if buf.len == 0 {
            return Err(SubmitError::Misaligned { iova: buf.iova });
        }
        self.submit_io(sqe, buf, token)
    }

    /// A command with a data buffer of 1 to `max_transfer` bytes.
    // Always inlined into `read` and `write` (the I/O path); PRP lists go out of line.
    #[inline(always)]
    fn submit_io(&mut self, mut sqe: Sqe, buf: IoBuffer, token: u64) -> Result<(), SubmitError> {
        // (an IOVA range that wraps the address space would make the PRP arithmetic wrap)
        if !buf.iova.is_multiple_of(4) || buf.iova > u64::MAX - (2 << 20) {
            return Err(SubmitError::Misaligned { iova: buf.iova });
        }
        let cid = self.take_cid()?;
        if let Err(e) = self.describe_data(&mut sqe, cid, buf) {
            self.free_cids.push(cid);
            return Err(e);
        }
        self.push(sqe, cid, token, buf.len);
        Ok(())
    }

    /// PRP1 (and PRP2) for one or two pages; beyond that one SGL data block where the
    /// controller takes SGLs, else a PRP list in the command's slot.
    #[inline]
    fn describe_data(&mut self, sqe: &mut Sqe, cid: u16, buf: IoBuffer) -> Result<(), SubmitError> {
        match prp::layout(buf.iova, buf.len) {
            PrpLayout::One { prp1 } => (sqe.prp1, sqe.prp2) = (prp1, 0),
            PrpLayout::Two { prp1, prp2 } => (sqe.prp1, sqe.prp2) = (prp1, prp2),
            PrpLayout::List { .. } if self.use_sgl => {
                sqe.set_sgl(SglDescriptor::data_block(buf.iova, buf.len))
            }
            PrpLayout::List {
                prp1,
                first_entry,
                entries,
            } => (sqe.prp1, sqe.prp2) = (prp1, self.prp_list(cid, buf, first_entry, entries)?),
        }
        Ok(())
    }

    /// Writes the PRP list of a transfer over more than two pages into the command's slot;
    /// its IOVA (PRP2).
    #[inline(never)]
    fn prp_list(
        &mut self,
        cid: u16,
        buf: IoBuffer,
        first_entry: u64,
        entries: u32,
    ) -> Result<u64, SubmitError> {
        if entries as u64 > self.layout.slot_entries() {
            return Err(SubmitError::ExceedsMdts {
                bytes: buf.len as u64,
                max: self.max_transfer,
            });
        }
        let offset = self.slot_offset(cid);
        let slot = self
            .memory
            .slice(offset, entries as usize * 8)
            .map_err(|_| SubmitError::Dead)?;
        for i in 0..entries as usize {
            slot.write_obj(first_entry + i as u64 * PAGE, i * 8)
                .map_err(|_| SubmitError::Dead)?;
        }
        Ok(self.memory.iova_of(offset))
    }

    #[inline]
    fn namespace(&self, nsid: u32) -> Result<IoLimits, SubmitError> {
        nsid.checked_sub(1)
            .and_then(|i| self.limits.get(i as usize))
            .filter(|l| l.nsid == nsid)
            .copied()
            .ok_or(SubmitError::InvalidNamespace { nsid })
    }

    /// The block count of a read or write of `bytes` at `slba`: whole blocks, within the
    /// namespace, within the largest transfer. The one place a read or write is checked
    /// against the namespace: the fast test (see [`IoLimits`]), and when it fails, the full
    /// checks, which say what is wrong.
    #[inline(always)]
    fn io_blocks(&self, nsid: u32, slba: u64, bytes: u32) -> Result<u32, SubmitError> {
        let bytes = u64::from(bytes);
        if let Some(l) = self.limits.get(nsid.wrapping_sub(1) as usize) {
            let blocks = bytes >> l.block_shift;
            if bytes & l.block_mask == 0
                && blocks.wrapping_sub(1) < l.max_blocks
                && slba.checked_add(blocks).is_some_and(|end| end <= l.blocks)
            {
                return Ok(blocks as u32);
            }
        }
        Err(self.io_error(nsid, slba, bytes))
    }

    /// Why a read or write failed the fast test of `io_blocks`.
    #[cold]
    #[inline(never)]
    fn io_error(&self, nsid: u32, slba: u64, bytes: u64) -> SubmitError {
        match self.blocks_for(nsid, slba, bytes) {
            Err(e) => e,
            // whole blocks inside the namespace, more than one command may carry
            Ok(_) => SubmitError::ExceedsMdts {
                bytes,
                max: self.max_transfer,
            },
        }
    }

    /// The block count of `bytes` at `slba`: whole blocks, within the namespace.
    fn blocks_for(&self, nsid: u32, slba: u64, bytes: u64) -> Result<u32, SubmitError> {
        let ns = self.namespace(nsid)?;
        // (Flush, Write Zeroes and Dataset Management move no data: they take such namespaces)
        if ns.metadata_size > 0 {
            return Err(SubmitError::Metadata {
                nsid,
                bytes: ns.metadata_size,
            });
        }
        if bytes & ns.block_mask != 0 || bytes == 0 {
            return Err(SubmitError::NotBlockMultiple {
                bytes,
                block_size: 1 << ns.block_shift,
            });
        }
        let blocks = bytes >> ns.block_shift;
        check_block_count(blocks)?;
        if slba.checked_add(blocks).is_none_or(|end| end > ns.blocks) {
            return Err(SubmitError::LbaRange {
                slba,
                blocks,
                capacity: ns.blocks,
            });
        }
        Ok(blocks as u32)
    }

    #[inline]
    fn take_cid(&mut self) -> Result<u16, SubmitError> {
        // An idle queue pair catches up with a controller reset here (nothing to fail); a busy
        // one does in `poll`, where its commands in flight can be handed back.
        if self.in_flight == 0 && self.lost_queues() {
            self.reconnect(&mut |_| {});
        }
        if self.unusable {
            return Err(SubmitError::Dead);
        }
        // A free command id means a free SQ slot: there are depth - 1 ids for depth slots,
        // and the SQ holds only commands in flight (a completion's SQ head lies past its
        // command; every other way an id comes back resets the rings or makes the queue
        // pair unusable). So the id pool is the one test of a full queue.
        let cid = self.free_cids.pop().ok_or(SubmitError::QueueFull {
            in_flight: self.in_flight,
        })?;
        debug_assert!(
            self.next(self.sq_tail) != self.sq_head,
            "SQ full with a free id"
        );
        Ok(cid)
    }

    /// The count of fetched commands an SQ head of `sqhd` means, if it lies between the last
    /// head and the tail.
    #[inline]
    fn fetched_after(&self, sqhd: u16) -> Option<u32> {
        if sqhd >= self.depth {
            return None;
        }
        // ring distance from the last head, without a division
        let ahead = if sqhd >= self.sq_head {
            (sqhd - self.sq_head) as u32
        } else {
            sqhd as u32 + self.depth as u32 - self.sq_head as u32
        };
        let fetched = self.sq_fetched.wrapping_add(ahead);
        (self.sq_written.wrapping_sub(fetched) as i32 >= 0).then_some(fetched)
    }

    /// CQ entries consumed since the controller was last told the head.
    #[inline]
    fn cq_unacknowledged(&self) -> u16 {
        if self.cq_head >= self.cq_head_rung {
            self.cq_head - self.cq_head_rung
        } else {
            self.cq_head + self.depth - self.cq_head_rung
        }
    }

    /// The ring index after `index` (no division on the hot path).
    #[inline]
    fn next(&self, index: u16) -> u16 {
        if index + 1 == self.depth {
            0
        } else {
            index + 1
        }
    }

    fn slot_offset(&self, cid: u16) -> usize {
        self.layout.prp + cid as usize * self.layout.prp_slot
    }

    fn memory_write<T: vm_memory::ByteValued>(&self, offset: usize, value: T) -> Result<(), ()> {
        let slice = self
            .memory
            .slice(offset, std::mem::size_of::<T>())
            .map_err(|_| ())?;
        slice.write_obj(value, 0).map_err(|_| ())
    }

    /// Copies the SQE into the ring at the tail; the doorbell waits for `flush`/`poll`.
    #[inline]
    fn push(&mut self, mut sqe: Sqe, cid: u16, token: u64, bytes: u32) {
        sqe.set_cid(cid);
        self.rings.write_sqe(self.sq_tail, &sqe);
        self.trackers[cid as usize] = Tracker {
            token,
            started_ns: self.now_ns,
            sq_position: self.sq_written,
            bytes,
            busy: true,
            abort_sent: false,
        };
        self.sq_written = self.sq_written.wrapping_add(1);
        self.sq_tail = self.next(self.sq_tail);
        self.in_flight += 1;
        self.stats.submitted += 1;
    }

    /// Rings the SQ tail doorbell if commands were queued since the last time.
    pub fn flush(&mut self) {
        // After a controller reset the queues are gone until `poll` re-creates them.
        if self.sq_tail != self.sq_tail_rung && !self.lost_queues() {
            // SQEs must be visible in memory before the controller hears of them.
            fence(Ordering::Release);
            let (old, new) = (self.sq_tail_rung, self.sq_tail);
            let shadow = self
                .doorbells
                .shadow
                .as_ref()
                .map(|s| (&s.sq_tail, s.always_mmio));
            if ring(&self.doorbells.sq_tail, shadow, old, new) {
                self.stats.sq_doorbells += 1;
            }
            self.sq_tail_rung = new;
        }
    }

    /// Rings queued commands, then hands every available completion (at most one ring's worth)
    /// to `on_completion`. Returns how many completed.
    pub fn poll(&mut self, mut on_completion: impl FnMut(Completion)) -> usize {
        if self.lost_queues() {
            self.reconnect(&mut on_completion);
            if self.lost_queues() {
                // Re-creating the queues takes one admin command per poll, whose completion
                // raises no I/O vector: an owner asleep until an interrupt must come back.
                if self.recreating() {
                    self.raise_interrupt();
                }
                return 0; // a reset is under way: no doorbells, nothing to reap
            }
        }
        self.flush();
        let mut done = 0usize;
        let mut consumed = false;
        // Never more than one ring's worth per poll, so the head cannot lap the controller.
        for _ in 0..self.depth {
            // Phase first; the rest of the entry only after it is known to be new.
            let Some(cqe) = self.rings.new_cqe(self.cq_head, self.cq_phase) else {
                break;
            };
            self.cq_head += 1;
            if self.cq_head == self.depth {
                self.cq_head = 0;
                self.cq_phase = !self.cq_phase;
            }
            consumed = true;
            let cid = cqe.cid;
            // The SQ head a completion reports does not move back and not past the tail, and
            // lies past the command (a controller fetches a command before completing it). A
            // late copy of an older completion whose id was reused since fails the last test.
            let fetched = self.fetched_after(cqe.sqhd);
            let known = self.trackers.get(cid as usize).is_some_and(|t| {
                t.busy && fetched.is_some_and(|f| f.wrapping_sub(t.sq_position) as i32 > 0)
            });
            if !known {
                self.stats.garbage += 1;
                log::error!(
                    "queue {}: completion for command id {cid} (sqhd {}) that is not in flight: ignored",
                    self.qid,
                    cqe.sqhd
                );
                continue;
            }
            self.sq_head = cqe.sqhd;
            self.sq_fetched = fetched.unwrap_or(self.sq_fetched);
            let tracker = &mut self.trackers[cid as usize];
            tracker.busy = false;
            let t = *tracker;
            self.free_cids.push(cid);
            self.in_flight -= 1;
            self.stats.completed += 1;
            done += 1;
            on_completion(Completion {
                token: t.token,
                status: cqe.status,
                dw0: cqe.dw0,
                submitted_ns: t.started_ns,
                bytes: t.bytes,
            });
        }
        if self.in_flight == 0 {
            // every command written has completed, so the controller fetched them all
            (self.sq_head, self.sq_fetched) = (self.sq_tail, self.sq_written);
        }
        // The controller is told the head once it ran `cq_slack` entries ahead of what it was
        // told: until then the controller still has room for every command that can be in
        // flight (see `ring_entries`).
        if consumed && self.cq_unacknowledged() >= self.cq_slack {
            let shadow = self
                .doorbells
                .shadow
                .as_ref()
                .map(|s| (&s.cq_head, s.always_mmio));
            if ring(
                &self.doorbells.cq_head,
                shadow,
                self.cq_head_rung,
                self.cq_head,
            ) {
                self.stats.cq_doorbells += 1;
            }
            self.cq_head_rung = self.cq_head;
        }
        if self.timeout_ns > 0 {
            self.polls += 1;
            if self.polls >= self.timeout_check_polls {
                self.polls = 0;
                self.check_timeouts(&mut on_completion);
            }
        }
        done
    }
}

/// Writes a doorbell: the shadow entry and, when the EventIdx rule says the controller waits for
/// it (or the queue always uses MMIO), the register. Returns whether MMIO was written.
fn ring(mmio: &Doorbell, shadow: Option<(&ShadowEntry, bool)>, old: u16, new: u16) -> bool {
    if let Some((entry, always_mmio)) = shadow {
        if entry.write(new as u32) && !always_mmio {
            // The shadow value must be visible before we read the controller's EventIdx.
            fence(Ordering::SeqCst);
            if !need_event(entry.event_idx() as u16, new, old) {
                return false;
            }
        }
    }
    mmio.write(new as u32);
    true
}

/// The EventIdx rule: ring when the controller's event index lies in [old, new).
/// u16 arithmetic also holds when the index wraps at the queue depth.
fn need_event(event_idx: u16, new: u16, old: u16) -> bool {
    new.wrapping_sub(event_idx).wrapping_sub(1) < new.wrapping_sub(old)
}

fn check_block_count(blocks: u64) -> Result<(), SubmitError> {
    if blocks == 0 || blocks > MAX_BLOCKS_PER_COMMAND {
        return Err(SubmitError::BlockCount { blocks });
    }
    Ok(())
}

impl Drop for QueuePair {
    /// Hands the queues to the controller for deletion (unless a reset already deleted them),
    /// without waiting; the queue id is free again once they are gone.
    fn drop(&mut self) {
        if let Some(owner) = self.owner.take() {
            let release = self.release(&*owner);
            owner.release_queue(self.qid, release);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn event_idx_rule_rings_only_when_the_controller_waits_in_the_range() {
        // controller waits for index 5; we move the tail from 3 to 7: ring
        assert!(need_event(5, 7, 3));
        // it already saw up to 7; moving 7 -> 9: no ring
        assert!(!need_event(9, 9, 7));
        assert!(!need_event(2, 9, 7));
        // wrap at depth 16: old 14 -> new 2; event 15 is inside [14, 2) circularly
        assert!(need_event(15, 2, 14));
        assert!(need_event(0, 2, 14));
        assert!(!need_event(5, 2, 14));
    }

    #[test]
    fn io_limits_fold_the_block_count_and_the_largest_transfer() {
        let g = |nsid, block_size| NamespaceGeometry {
            nsid,
            block_size,
            blocks: 1000,
            metadata: MetadataFormat::default(),
        };
        let l = IoLimits::of(&g(1, 512), 1, 2 << 20);
        assert_eq!((l.block_mask, l.block_shift), (511, 9));
        assert_eq!((l.max_blocks, l.blocks), (4096, 1000));
        // NLB is 16 bits: 65536 blocks at most, whatever the controller takes
        assert_eq!(IoLimits::of(&g(1, 512), 1, 1 << 30).max_blocks, 65536);
        // no I/O passes the fast test of an nsid without a usable geometry, nor any other check
        for (geometry, nsid) in [(g(0, 0), 1), (g(1, 0), 1), (g(1, 1000), 1), (g(1, 512), 2)] {
            let l = IoLimits::of(&geometry, nsid, 2 << 20);
            assert_eq!((l.nsid, l.max_blocks), (0, 0));
        }
    }

    #[test]
    fn layout_keeps_rings_page_aligned_and_slots_inside_a_page() {
        let l = Layout::new(256, 255, 129);
        assert_eq!(l.sq, 0);
        assert_eq!(l.cq, 256 * 64);
        assert_eq!(l.prp, 256 * 64 + 4096);
        assert_eq!(l.prp_slot, 2048);
        assert_eq!(l.slot_entries(), 256);
        assert_eq!(PAGE as usize % l.prp_slot, 0);
        let small = Layout::new(2, 1, 2);
        assert_eq!(small.prp_slot, 64);
        assert_eq!(Layout::new(64, 63, 100_000).prp_slot, 4096);
        // PRP-list slots for the command ids only, not for every ring entry
        let spare = Layout::new(128, 63, 129);
        assert_eq!(spare.bytes, spare.prp + 63 * spare.prp_slot);
    }
}
