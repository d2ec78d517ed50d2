//! The submission and completion rings in DMA memory, accessed through raw pointers.
//!
//! The per-command accesses to device-shared memory: one 64-byte store per command, four
//! volatile loads per completion, and the shadow doorbell entries, without the per-access slice
//! construction and bounds checks of `vm-memory` (the geometry is checked once, at creation).
//! PRP lists and SGL segments (only for transfers that need them) are written through
//! `vm-memory` by the queue pair.

use std::mem::offset_of;
use std::ptr::NonNull;
use std::sync::atomic::{fence, Ordering};
use std::sync::Arc;

use usnvme_hugepages::DmaRegion;

use crate::spec::{Cqe, Sqe, Status};

/// Pointers to the SQ and CQ rings of one queue pair. Valid while the `DmaRegion` they were made
/// from lives: the queue pair owns both and drops the region last.
#[derive(Debug)]
pub(crate) struct Rings {
    sq: NonNull<Sqe>,
    cq: NonNull<Cqe>,
    /// Entries in each ring; 0 when the region could not hold the rings (every access is refused).
    depth: u16,
}

// SAFETY: the pointers address DMA memory owned by the same queue pair (its `DmaRegion`), which
// moves between threads with it; the queue pair is not `Sync`, so one thread accesses them at a time.
unsafe impl Send for Rings {}

impl Rings {
    /// The rings of `depth` entries at byte offsets `sq` and `cq` of `memory`.
    pub fn new(memory: &DmaRegion, sq: usize, cq: usize, depth: u16) -> Rings {
        let entries = depth as usize;
        let fits = |offset: usize, entry: usize| {
            offset.is_multiple_of(entry) && offset + entries * entry <= memory.len()
        };
        let ok = fits(sq, size_of::<Sqe>()) && fits(cq, size_of::<Cqe>());
        let base = memory.as_ptr();
        // inside the region when `ok` (checked above); unused otherwise (depth 0)
        let (sq_ptr, cq_ptr) = (base.wrapping_add(sq), base.wrapping_add(cq));
        Rings {
            sq: NonNull::new(sq_ptr.cast()).unwrap_or(NonNull::dangling()),
            cq: NonNull::new(cq_ptr.cast()).unwrap_or(NonNull::dangling()),
            depth: if ok && !base.is_null() { depth } else { 0 },
        }
    }

    /// Whether the rings are usable.
    pub fn is_valid(&self) -> bool {
        self.depth > 0
    }

    /// Writes `sqe` into SQ slot `index`.
    #[inline]
    pub fn write_sqe(&self, index: u16, sqe: &Sqe) {
        if index < self.depth {
            let slot = self.sq.as_ptr().wrapping_add(index as usize);
            // SAFETY: `index < depth` and `new` checked that `depth` entries fit in the region;
            // Sqe is 64 bytes, repr(C), and the slot is 64-byte aligned. A plain store (a few
            // vector moves, where a volatile one is eight): the device reads the entry only after
            // the doorbell, which `flush` writes after a release fence, as SPDK and Linux do.
            unsafe { slot.write(*sqe) }
        }
    }

    /// The entry in CQ slot `index` if its phase tag is `phase` (posted since the head last
    /// passed): the status word first, the rest only once the entry is known to be new, and
    /// only the fields the queue pair uses (one bounds check, four loads).
    #[inline]
    pub fn new_cqe(&self, index: u16, phase: bool) -> Option<NewCqe> {
        if index >= self.depth {
            return None;
        }
        let slot = self.cq.as_ptr().wrapping_add(index as usize).cast::<u8>();
        let field = |offset: usize| slot.wrapping_add(offset);
        // SAFETY: `index < depth` and `new` checked that `depth` entries fit in the region; the
        // status word is the 2-byte aligned field at offset 14. Volatile: the device writes it.
        let status = unsafe { field(offset_of!(Cqe, status)).cast::<u16>().read_volatile() };
        if (status & 1 == 1) != phase {
            return None;
        }
        // the rest of the entry only after its phase tag (the device writes that last)
        fence(Ordering::Acquire);
        // SAFETY: in the entry as above; dword 0 is 4-byte aligned at offset 0.
        let dw0 = unsafe { field(offset_of!(Cqe, dw0)).cast::<u32>().read_volatile() };
        // SAFETY: as above; the SQ head is 2-byte aligned at offset 8.
        let sqhd = unsafe { field(offset_of!(Cqe, sqhd)).cast::<u16>().read_volatile() };
        // SAFETY: as above; the command id is 2-byte aligned at offset 12.
        let cid = unsafe { field(offset_of!(Cqe, cid)).cast::<u16>().read_volatile() };
        Some(NewCqe {
            dw0,
            sqhd,
            cid,
            status: Status::from_word(status),
        })
    }
}

/// What the queue pair uses of a completion entry.
#[derive(Debug, Clone, Copy)]
pub(crate) struct NewCqe {
    pub dw0: u32,
    pub sqhd: u16,
    pub cid: u16,
    pub status: Status,
}

/// One queue's shadow doorbell entry and the controller's EventIdx entry for it, in the Doorbell
/// Buffer Config pages (found once, checked once, like the rings).
#[derive(Debug, Clone)]
pub(crate) struct ShadowEntry {
    /// Keeps the pages (and so the pointers) alive.
    _pages: Arc<DmaRegion>,
    /// `None` when the offsets lie outside the pages: nothing is written and the EventIdx reads
    /// as "ring the register".
    entries: Option<(NonNull<u32>, NonNull<u32>)>,
}

// SAFETY: the pointers address the shared pages this entry keeps alive; the queue pair that owns
// it is not `Sync`, so one thread uses them at a time (the controller is the other party).
unsafe impl Send for ShadowEntry {}

impl ShadowEntry {
    /// The entry at byte `entry` of the shadow page, and its EventIdx at `eventidx + entry`.
    pub fn new(pages: Arc<DmaRegion>, entry: usize, eventidx: usize) -> ShadowEntry {
        let fits = |offset: usize| {
            offset.is_multiple_of(4) && offset.checked_add(4).is_some_and(|end| end <= pages.len())
        };
        let base = pages.as_ptr();
        let entries = (fits(entry) && eventidx.checked_add(entry).is_some_and(fits))
            .then(|| {
                Some((
                    NonNull::new(base.wrapping_add(entry).cast::<u32>())?,
                    NonNull::new(base.wrapping_add(eventidx + entry).cast::<u32>())?,
                ))
            })
            .flatten();
        ShadowEntry {
            _pages: pages,
            entries,
        }
    }

    /// Writes the shadow doorbell value; false if there is no entry.
    #[inline]
    pub fn write(&self, value: u32) -> bool {
        let Some((shadow, _)) = self.entries else {
            return false;
        };
        // SAFETY: checked in `new` to be an aligned u32 inside the pages, alive with `_pages`.
        // Volatile: the controller reads it.
        unsafe { shadow.as_ptr().write_volatile(value) };
        true
    }

    /// The controller's EventIdx for this doorbell (`u32::MAX` if there is no entry).
    #[inline]
    pub fn event_idx(&self) -> u32 {
        match self.entries {
            // SAFETY: as in `write`; volatile: the controller writes it.
            Some((_, event_idx)) => unsafe { event_idx.as_ptr().read_volatile() },
            None => u32::MAX,
        }
    }
}
