//! The submission and completion rings in DMA memory, accessed through raw pointers.
//!
//! This is the hot path's only device-shared memory access: one 64-byte volatile store per
//! command and two volatile loads per completion, without the per-access slice construction and
//! bounds checks of `vm-memory` (the ring geometry is checked once, here, at creation).

use std::ptr::NonNull;

use usnvme_hugepages::DmaRegion;

use crate::spec::{Cqe, Sqe};

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
            // Sqe is 64 bytes, repr(C), and the slot is 64-byte aligned. Volatile: the device reads it.
            unsafe { slot.write_volatile(*sqe) }
        }
    }

    /// The status word (phase tag in bit 0) of CQ slot `index`.
    #[inline]
    pub fn cqe_status(&self, index: u16) -> Option<u16> {
        (index < self.depth).then(|| {
            let status = self
                .cq
                .as_ptr()
                .wrapping_add(index as usize)
                .cast::<u8>()
                .wrapping_add(std::mem::offset_of!(Cqe, status))
                .cast::<u16>();
            // SAFETY: `index < depth`, in the region as above; the status word is the 2-byte
            // aligned field at offset 14. Volatile: the device writes it.
            unsafe { status.read_volatile() }
        })
    }

    /// The whole entry in CQ slot `index` (read after its phase tag was seen to be new).
    #[inline]
    pub fn read_cqe(&self, index: u16) -> Option<Cqe> {
        (index < self.depth).then(|| {
            let slot = self.cq.as_ptr().wrapping_add(index as usize);
            // SAFETY: in range as above; Cqe is 16 bytes, repr(C), in 16-byte aligned slots.
            unsafe { slot.read_volatile() }
        })
    }
}
