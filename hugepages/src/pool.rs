//! Fixed-size DMA buffers carved from one region: one pool per owner (a reactor thread), no lock,
//! O(1) allocation, free and address translation.

use std::cell::Cell;
use std::marker::PhantomData;
use std::mem::ManuallyDrop;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use vm_memory::{VolatileMemoryError, VolatileSlice};

use crate::memory::{Memory, MemoryError, PageSize};
use crate::space::{DmaRegion, IovaSpace, MapError};

/// Why a [`BufferPool`] could not be made.
#[derive(Debug, thiserror::Error)]
pub enum PoolError {
    #[error(
        "buffer size {0} must be a multiple of 512 that divides 4096 or is a multiple of 4096"
    )]
    BufferSize(usize),
    #[error("buffer count {0} must be between 1 and 2^32 - 1")]
    Count(usize),
    #[error(transparent)]
    Memory(#[from] MemoryError),
    #[error(transparent)]
    Map(#[from] MapError),
}

/// A buffer given back to a pool it does not come from; the buffer is returned inside.
#[derive(Debug, thiserror::Error)]
#[error("buffer {} at IOVA {:#x} was freed to a pool it does not belong to", .0.index, .0.iova)]
pub struct ForeignBuffer(pub DmaBuffer);

static NEXT_POOL_ID: AtomicU64 = AtomicU64::new(1);

// A pool and its buffers move to the reactor that uses them; one thread at a time uses them.
static_assertions::assert_impl_all!(BufferPool: Send);
static_assertions::assert_impl_all!(DmaBuffer: Send);
static_assertions::assert_not_impl_any!(DmaBuffer: Sync, Clone);

/// `count` buffers of `buffer_size` bytes in one mapped [`DmaRegion`]. `Send`, not `Sync`: each
/// owner (reactor) has its own. No buffer straddles a 4 KiB page unless it starts on one, so a
/// buffer's PRP entries are simply `iova_at(k * 4096)`.
#[derive(Debug)]
pub struct BufferPool {
    /// Leaked rather than dropped while buffers are out: they point into it.
    region: ManuallyDrop<DmaRegion>,
    buffer_size: usize,
    count: usize,
    /// Indices of free buffers (a stack: the most recently freed, cache-warm buffer goes out first).
    free: Vec<u32>,
    id: u64,
    _not_sync: PhantomData<Cell<()>>,
}

impl BufferPool {
    pub fn new(
        space: &Arc<IovaSpace>,
        buffer_size: usize,
        count: usize,
        page: PageSize,
        node: Option<u32>,
    ) -> Result<BufferPool, PoolError> {
        let sector_multiple = buffer_size >= 512 && buffer_size.is_multiple_of(512);
        let page_friendly = 4096 % buffer_size.max(1) == 0 || buffer_size.is_multiple_of(4096);
        if !sector_multiple || !page_friendly || buffer_size > u32::MAX as usize {
            return Err(PoolError::BufferSize(buffer_size));
        }
        let count32 = u32::try_from(count)
            .ok()
            .filter(|&c| c > 0 && c < u32::MAX)
            .ok_or(PoolError::Count(count))?;
        let len = buffer_size
            .checked_mul(count)
            .ok_or(PoolError::Count(count))?;
        let region = space.map(Memory::allocate(len, page, node)?)?;
        Ok(BufferPool {
            region: ManuallyDrop::new(region),
            buffer_size,
            count,
            free: (0..count32).rev().collect(),
            id: NEXT_POOL_ID.fetch_add(1, Ordering::Relaxed),
            _not_sync: PhantomData,
        })
    }

    /// A free buffer, or `None` when all are out.
    pub fn alloc(&mut self) -> Option<DmaBuffer> {
        let index = self.free.pop()?;
        let offset = index as usize * self.buffer_size;
        Some(DmaBuffer {
            ptr: self.region.as_ptr().wrapping_add(offset),
            iova: self.region.iova_of(offset),
            len: self.buffer_size as u32,
            index,
            pool: self.id,
        })
    }

    /// Gives `buf` back. A buffer of another pool is refused (and a debug build panics).
    pub fn free(&mut self, buf: DmaBuffer) -> Result<(), ForeignBuffer> {
        if buf.pool != self.id {
            debug_assert!(false, "buffer {} freed to a foreign pool", buf.index);
            return Err(ForeignBuffer(buf));
        }
        debug_assert!(self.free.len() < self.count);
        self.free.push(buf.index);
        Ok(())
    }

    /// How many buffers are free.
    pub fn available(&self) -> usize {
        self.free.len()
    }

    pub fn capacity(&self) -> usize {
        self.count
    }

    pub fn buffer_size(&self) -> usize {
        self.buffer_size
    }

    pub fn region(&self) -> &DmaRegion {
        &self.region
    }

    /// The IOVA of a host address inside this pool's region.
    pub fn iova_of(&self, host: *const u8) -> Option<u64> {
        self.region.translate(host)
    }
}

impl Drop for BufferPool {
    fn drop(&mut self) {
        let out = self.count - self.free.len();
        if out > 0 {
            log::warn!(
                "buffer pool dropped with {out} buffers out: leaking its {:#x} bytes",
                self.region.len()
            );
            return;
        }
        // SAFETY: no buffer is out (none points into the region), and `region` is not used again.
        unsafe { ManuallyDrop::drop(&mut self.region) };
    }
}

/// One buffer of a [`BufferPool`]: a unique handle (not `Clone`), moved back into `free`.
/// Its memory is shared with devices, so it is read and written through volatile copies only.
#[derive(Debug)]
pub struct DmaBuffer {
    ptr: *mut u8,
    iova: u64,
    len: u32,
    index: u32,
    pool: u64,
}

// SAFETY: a DmaBuffer is the only handle to its bytes, which stay mapped for the life of the process
// once handed out (its pool leaks the region rather than unmap it under a live buffer); accesses are
// volatile copies, as for memory a device writes. It is not Sync: one owner at a time.
unsafe impl Send for DmaBuffer {}

impl DmaBuffer {
    pub fn iova(&self) -> u64 {
        self.iova
    }

    pub fn len(&self) -> usize {
        self.len as usize
    }

    /// Always false: pools have no empty buffers.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// The buffer's index in its pool.
    pub fn index(&self) -> u32 {
        self.index
    }

    /// The IOVA of the byte at `offset` (`offset <= len`).
    pub fn iova_at(&self, offset: usize) -> u64 {
        debug_assert!(
            offset <= self.len(),
            "offset {offset} past a buffer of {}",
            self.len
        );
        self.iova + offset as u64
    }

    pub fn as_volatile_slice(&self) -> VolatileSlice<'_> {
        // SAFETY: [ptr, ptr+len) is this buffer's range of a live, mapped region that outlives the
        // handle (see the Send impl); the slice borrows the handle.
        unsafe { VolatileSlice::new(self.ptr, self.len()) }
    }

    /// Copies `dst.len()` bytes from `offset` in the buffer; copies nothing if they do not fit.
    pub fn read_into(&self, dst: &mut [u8], offset: usize) -> Result<(), VolatileMemoryError> {
        self.as_volatile_slice()
            .subslice(offset, dst.len())?
            .copy_to(dst);
        Ok(())
    }

    /// Copies `src` into the buffer at `offset`; copies nothing if it does not fit.
    pub fn write_from(&self, src: &[u8], offset: usize) -> Result<(), VolatileMemoryError> {
        self.as_volatile_slice()
            .subslice(offset, src.len())?
            .copy_from(src);
        Ok(())
    }

    /// Sets every byte to `byte`.
    pub fn fill(&self, byte: u8) {
        let chunk = [byte; 512];
        // Buffer sizes are multiples of 512, so every chunk fits.
        for offset in (0..self.len()).step_by(chunk.len()) {
            let _ = self.write_from(&chunk, offset);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::space::NoIommu;
    use vm_memory::{Bytes, GuestAddress};

    fn pool(size: usize, count: usize) -> (Arc<IovaSpace>, BufferPool) {
        let space = IovaSpace::new(Arc::new(NoIommu));
        let pool = BufferPool::new(&space, size, count, PageSize::Small4K, None).expect("pool");
        (space, pool)
    }

    #[test]
    fn alloc_until_empty_then_free() {
        let (space, mut pool) = pool(4096, 4);
        assert_eq!(space.mappings(), 1, "one mapping for the whole pool");
        let bufs: Vec<DmaBuffer> = std::iter::from_fn(|| pool.alloc()).collect();
        assert_eq!((bufs.len(), pool.available()), (4, 0));
        assert!(pool.alloc().is_none());
        let base = pool.region().iova();
        for (i, b) in bufs.iter().enumerate() {
            assert_eq!(b.index() as usize, i);
            assert_eq!((b.iova(), b.len()), (base + i as u64 * 4096, 4096));
            assert_eq!(b.iova_at(100), b.iova() + 100);
            assert_eq!(
                pool.iova_of(b.as_volatile_slice().ptr_guard().as_ptr()),
                Some(b.iova())
            );
        }
        for b in bufs {
            pool.free(b).expect("own buffer");
        }
        assert_eq!(pool.available(), 4);
        assert_eq!(
            pool.alloc().map(|b| b.index()),
            Some(3),
            "most recently freed first"
        );
    }

    #[test]
    fn data_round_trip_seen_by_the_device_at_its_iova() {
        let (space, mut pool) = pool(512, 16);
        let a = pool.alloc().expect("a");
        let b = pool.alloc().expect("b");
        a.fill(0xA5);
        b.write_from(b"payload", 505).expect("write");
        assert!(
            b.write_from(b"PAYLOAD", 506).is_err(),
            "bounds-checked, and nothing written"
        );
        let mut back = [0u8; 7];
        b.read_into(&mut back, 505).expect("read");
        assert_eq!(&back, b"payload");
        let mut dev = [0u8; 512];
        space
            .memory()
            .read_slice(&mut dev, GuestAddress(a.iova()))
            .expect("device view of a");
        assert!(dev.iter().all(|&x| x == 0xA5));
        space
            .memory()
            .read_slice(&mut back, GuestAddress(b.iova_at(505)))
            .expect("device view of b");
        assert_eq!(&back, b"payload");
    }

    #[test]
    fn rejects_sizes_that_straddle_pages() {
        let space = IovaSpace::new(Arc::new(NoIommu));
        for size in [0, 256, 1000, 3072, 4096 + 512] {
            let r = BufferPool::new(&space, size, 1, PageSize::Small4K, None);
            assert!(
                matches!(r, Err(PoolError::BufferSize(s)) if s == size),
                "{size}"
            );
        }
        assert!(matches!(
            BufferPool::new(&space, 4096, 0, PageSize::Small4K, None),
            Err(PoolError::Count(0))
        ));
        for size in [512, 1024, 2048, 8192, 128 << 10] {
            BufferPool::new(&space, size, 3, PageSize::Small4K, None).expect("valid size");
        }
    }

    #[test]
    #[cfg_attr(debug_assertions, should_panic(expected = "foreign pool"))]
    fn foreign_buffer_is_refused() {
        let (_s1, mut p1) = pool(4096, 1);
        let (_s2, mut p2) = pool(4096, 1);
        let b = p1.alloc().expect("buffer");
        let ForeignBuffer(b) = p2.free(b).expect_err("foreign");
        assert_eq!(p2.available(), 1);
        p1.free(b).expect("home");
    }

    #[test]
    fn pool_dropped_with_buffers_out_leaks_instead_of_unmapping() {
        let (space, mut pool) = pool(4096, 2);
        let b = pool.alloc().expect("buffer");
        drop(pool);
        assert_eq!(space.mappings(), 1, "still mapped");
        b.write_from(b"still valid", 0).expect("write");
        let (space2, mut pool2) = self::pool(4096, 2);
        let c = pool2.alloc().expect("buffer");
        pool2.free(c).expect("free");
        drop(pool2);
        assert_eq!(space2.mappings(), 0, "unmapped when all buffers are home");
    }
}
