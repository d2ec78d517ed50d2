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
//!
//! Here: the queue pair, its set-up and accessors; commands in `submit`, their checks in `checks`,
//! doorbells and completions in `poll`, timeouts and resets in `recovery`, the rings in `ring`.

mod checks;
mod poll;
mod recovery;
mod ring;
mod submit;

use std::os::fd::{AsFd, BorrowedFd};
use std::sync::Arc;
use std::time::Instant;

use nix::sys::eventfd::EventFd;

use usnvme_hugepages::DmaRegion;

use crate::error::Error;
use crate::protection::{MetadataFormat, PiFields};
use crate::prp::PAGE;
use crate::spec::{Csts, Sqe, Status};
use checks::IoLimits;
use ring::Rings;

pub(crate) use poll::{Doorbells, Shadow};

const SQE_BYTES: usize = 64;
const CQE_BYTES: usize = 16;
/// Timeouts are checked every this many polls, not on every one: a poll that finds nothing
/// costs a few instructions, and timeouts are seconds long.
const TIMEOUT_CHECK_POLLS: u32 = 64;
/// The generation of a queue pair whose queues are not created yet: no controller's (a
/// generation counts resets, twice each).
const NOT_CREATED: u64 = u64::MAX;

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
    /// Its queues exist on the controller; else its polls create them.
    pub created: bool,
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
            // not created yet: lost to every generation until its polls create them
            generation: match setup.created {
                true => setup.generation,
                false => NOT_CREATED,
            },
            qid: setup.qid,
            owner: setup.owner,
            recreate: (!setup.created).then(|| recovery::Recreate::first(setup.generation)),
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

    /// The device is gone (surprise removal): hands every command in flight back with "Host
    /// Pathing Error" and refuses more. Its queues are not deleted (nothing would answer).
    pub fn abandon(&mut self, mut on_completion: impl FnMut(Completion)) {
        self.unusable = true;
        self.fail_all(Status::HOST_PATHING_ERROR, &mut on_completion);
    }
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
