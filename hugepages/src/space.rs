//! The IOVA address space: DMA mapping through an IOMMU (or none), modelled with vm-memory so that
//! the software controller translates device addresses exactly as an IOMMU would.

use std::fmt;
use std::io;
use std::ops::Range;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use parking_lot::Mutex;
use vm_memory::{
    GuestAddress, GuestMemoryBackend, GuestMemoryMmap, GuestRegionMmap, VolatileMemory,
    VolatileMemoryError, VolatileSlice,
};

use crate::iova::IovaAllocator;
use crate::memory::{Memory, PageSize};

/// Why a DMA mapping could not be made or removed.
#[derive(Debug, thiserror::Error)]
pub enum MapError {
    #[error(
        "no free IOVA range of {len:#x} bytes aligned to {align:#x} (valid ranges: {ranges:x?})"
    )]
    NoIova {
        len: u64,
        align: u64,
        ranges: Vec<Range<u64>>,
    },
    #[error("IOVA range {iova:#x}+{len:#x} is outside the IOMMU's valid ranges")]
    OutOfRange { iova: u64, len: u64 },
    #[error("DMA map of {len:#x} bytes at IOVA {iova:#x} failed: {source}")]
    Map {
        iova: u64,
        len: u64,
        source: io::Error,
    },
    #[error("DMA unmap of {len:#x} bytes at IOVA {iova:#x} failed: {source}")]
    Unmap {
        iova: u64,
        len: u64,
        source: io::Error,
    },
    #[error("cannot register IOVA range {iova:#x}+{len:#x} in the address space: {reason}")]
    AddressSpace { iova: u64, len: u64, reason: String },
}

/// Makes host memory reachable by devices at an IOVA (VFIO's type1 IOMMU in the driver).
pub trait DmaMapper: Send + Sync + fmt::Debug {
    /// Maps `[iova, iova+len)` to the host memory at `host`.
    ///
    /// # Safety
    /// `[host, host+len)` stays valid and is not unmapped until `unmap` of the same range.
    unsafe fn map(&self, iova: u64, host: *mut u8, len: usize) -> Result<(), MapError>;
    /// Removes the mapping of `[iova, iova+len)` made by `map`.
    fn unmap(&self, iova: u64, len: usize) -> Result<(), MapError>;
    /// The IOVA ranges the IOMMU accepts.
    fn iova_ranges(&self) -> Vec<Range<u64>>;
}

/// The mapper for the software controller: maps nothing in hardware; accepts `[4 GiB, 2^39)`, which
/// leaves out IOVA 0 and low addresses so that an untranslated or zero address never resolves.
#[derive(Debug, Default, Clone, Copy)]
pub struct NoIommu;

impl NoIommu {
    pub const RANGE: Range<u64> = (4 << 30)..(1 << 39);
}

impl DmaMapper for NoIommu {
    unsafe fn map(&self, iova: u64, _host: *mut u8, len: usize) -> Result<(), MapError> {
        let end = iova.checked_add(len as u64);
        if len == 0 || iova < Self::RANGE.start || end.is_none_or(|e| e > Self::RANGE.end) {
            return Err(MapError::OutOfRange {
                iova,
                len: len as u64,
            });
        }
        Ok(())
    }

    fn unmap(&self, _iova: u64, _len: usize) -> Result<(), MapError> {
        Ok(())
    }

    fn iova_ranges(&self) -> Vec<Range<u64>> {
        vec![Self::RANGE]
    }
}

/// The process-wide IOVA space of one IOMMU container: allocation, mapping, and a vm-memory model
/// of everything mapped now.
#[derive(Debug)]
pub struct IovaSpace {
    mapper: Arc<dyn DmaMapper>,
    /// Taken to map, unmap and snapshot: the setup path, never per I/O in the driver.
    state: Mutex<State>,
    /// How many times the mapped memory changed (written under `state`): a [`MemoryView`]
    /// is brought up to date only when this moved, so that reading one is a load of a line
    /// written by map and unmap alone, not a lock and a reference count every user shares.
    changes: AtomicU64,
    /// Snapshots taken ([`IovaSpace::memory`], [`IovaSpace::view`]): each one a lock and a
    /// shared reference count; a software controller takes none per command.
    snapshots: AtomicU64,
}

#[derive(Debug)]
struct State {
    allocator: IovaAllocator,
    memory: Arc<GuestMemoryMmap>,
}

impl IovaSpace {
    pub fn new(mapper: Arc<dyn DmaMapper>) -> Arc<IovaSpace> {
        let allocator = IovaAllocator::new(&mapper.iova_ranges());
        let state = Mutex::new(State {
            allocator,
            memory: Arc::new(GuestMemoryMmap::new()),
        });
        Arc::new(IovaSpace {
            mapper,
            state,
            changes: AtomicU64::new(0),
            snapshots: AtomicU64::new(0),
        })
    }

    pub fn mapper(&self) -> &Arc<dyn DmaMapper> {
        &self.mapper
    }

    /// Maps `memory` at a fresh IOVA aligned to its page size, as one mapping, and registers it in
    /// the address space.
    pub fn map(self: &Arc<Self>, memory: Memory) -> Result<DmaRegion, MapError> {
        let len = memory.len() as u64;
        let align = memory.page_size().bytes() as u64;
        let mut state = self.state.lock();
        let Some(iova) = state.allocator.alloc(len, align) else {
            return Err(MapError::NoIova {
                len,
                align,
                ranges: state.allocator.ranges().to_vec(),
            });
        };
        let region =
            GuestRegionMmap::with_arc(Arc::clone(memory.mmap_region()), GuestAddress(iova))
                .ok_or_else(|| "address overflow".to_string())
                .and_then(|r| {
                    state
                        .memory
                        .insert_region(Arc::new(r))
                        .map_err(|e| e.to_string())
                });
        let result = match region {
            Err(reason) => Err(MapError::AddressSpace { iova, len, reason }),
            Ok(collection) => {
                // SAFETY: the returned DmaRegion owns `memory` and unmaps this range in its Drop
                // before releasing it (and leaks the memory if the unmap fails).
                let mapped = unsafe { self.mapper.map(iova, memory.as_ptr(), memory.len()) };
                mapped.map(|()| collection)
            }
        };
        match result {
            Ok(collection) => {
                state.memory = Arc::new(collection);
                self.changes.fetch_add(1, Ordering::Release);
                log::debug!(
                    "mapped {len:#x} bytes of {} pages at IOVA {iova:#x}",
                    memory.page_size()
                );
                drop(state);
                Ok(DmaRegion {
                    space: Arc::clone(self),
                    memory,
                    iova,
                })
            }
            Err(e) => {
                if let Err(free) = state.allocator.free(iova, len) {
                    log::error!("releasing IOVA after a failed map: {free}");
                }
                Err(e)
            }
        }
    }

    /// A snapshot of everything mapped now, addressed by IOVA (for the software controller's PRP and
    /// SGL translation). A snapshot keeps its regions' pages mapped in this process, but a region
    /// unmapped since may still appear in it: take a fresh one per command.
    pub fn memory(&self) -> Arc<GuestMemoryMmap> {
        self.snapshots.fetch_add(1, Ordering::Relaxed);
        Arc::clone(&self.state.lock().memory)
    }

    /// How many snapshots were taken so far (memory and views).
    pub fn snapshots(&self) -> u64 {
        self.snapshots.load(Ordering::Relaxed)
    }

    /// A [`MemoryView`] of everything mapped now.
    pub fn view(&self) -> MemoryView {
        self.snapshots.fetch_add(1, Ordering::Relaxed);
        let state = self.state.lock();
        MemoryView {
            seen: self.changes.load(Ordering::Relaxed),
            memory: Arc::clone(&state.memory),
        }
    }

    /// `view` brought up to date: what is mapped now (as [`IovaSpace::memory`], without a lock
    /// or a shared reference count unless something was mapped or unmapped since).
    #[inline]
    pub fn refresh<'a>(&self, view: &'a mut MemoryView) -> &'a GuestMemoryMmap {
        if self.changes.load(Ordering::Acquire) != view.seen {
            *view = self.view();
        }
        &view.memory
    }

    /// How many mappings are live (one per [`DmaRegion`]).
    pub fn mappings(&self) -> usize {
        self.state.lock().memory.num_regions()
    }

    fn release(&self, iova: u64, memory: &Memory) {
        let len = memory.len() as u64;
        let mut state = self.state.lock();
        match state.memory.remove_region(GuestAddress(iova), len) {
            Ok((collection, _)) => {
                state.memory = Arc::new(collection);
                self.changes.fetch_add(1, Ordering::Release);
            }
            Err(e) => log::error!("IOVA {iova:#x}+{len:#x} missing from the address space: {e}"),
        }
        if let Err(e) = self.mapper.unmap(iova, memory.len()) {
            // A device may still reach these pages: never reuse them or their IOVA.
            log::error!("{e}; leaking the {len:#x} bytes and their IOVA range");
            memory.leak();
            return;
        }
        if let Err(e) = state.allocator.free(iova, len) {
            log::error!("{e}");
        }
    }
}

/// One user's copy of what an [`IovaSpace`] maps ([`IovaSpace::refresh`] keeps it current): a
/// software controller's queue translates its commands' addresses through its own, so that
/// queues on many cores share no lock or reference count per command. Like a snapshot, it
/// keeps the pages it shows mapped in this process until it is refreshed or dropped.
#[derive(Debug)]
pub struct MemoryView {
    seen: u64,
    memory: Arc<GuestMemoryMmap>,
}

/// A [`Memory`] mapped at an IOVA. Dropping it unregisters, unmaps and frees the IOVA.
#[derive(Debug)]
pub struct DmaRegion {
    space: Arc<IovaSpace>,
    memory: Memory,
    iova: u64,
}

impl DmaRegion {
    pub fn iova(&self) -> u64 {
        self.iova
    }

    pub fn len(&self) -> usize {
        self.memory.len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    pub fn as_ptr(&self) -> *mut u8 {
        self.memory.as_ptr()
    }

    pub fn node(&self) -> Option<u32> {
        self.memory.node()
    }

    pub fn page_size(&self) -> PageSize {
        self.memory.page_size()
    }

    /// A bounds-checked volatile view of `[offset, offset+len)`: the device may write this memory
    /// at any time, so it is never handed out as `&[u8]`.
    pub fn slice(
        &self,
        offset: usize,
        len: usize,
    ) -> Result<VolatileSlice<'_>, VolatileMemoryError> {
        self.memory.mmap_region().get_slice(offset, len)
    }

    /// The IOVA of the byte at `offset` (`offset <= len`).
    pub fn iova_of(&self, offset: usize) -> u64 {
        debug_assert!(
            offset <= self.len(),
            "offset {offset:#x} past a region of {:#x}",
            self.len()
        );
        self.iova + offset as u64
    }

    /// The IOVA of a host address inside this region, if it is inside.
    pub fn translate(&self, host: *const u8) -> Option<u64> {
        let offset = (host as usize).checked_sub(self.as_ptr() as usize)?;
        (offset < self.len()).then(|| self.iova + offset as u64)
    }
}

impl Drop for DmaRegion {
    fn drop(&mut self) {
        self.space.release(self.iova, &self.memory);
    }
}

#[cfg(test)]
#[allow(clippy::single_range_in_vec_init)] // IOVA ranges, not a range of values
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
    use vm_memory::Bytes;

    /// Counts maps and unmaps; can be told to fail them.
    #[derive(Debug, Default)]
    pub(crate) struct CountingMapper {
        pub maps: AtomicUsize,
        pub unmaps: AtomicUsize,
        pub fail_map: AtomicBool,
        pub fail_unmap: AtomicBool,
    }

    impl DmaMapper for CountingMapper {
        unsafe fn map(&self, iova: u64, _host: *mut u8, len: usize) -> Result<(), MapError> {
            if self.fail_map.load(Ordering::Relaxed) {
                return Err(MapError::Map {
                    iova,
                    len: len as u64,
                    source: io::Error::from_raw_os_error(libc::ENOSPC),
                });
            }
            self.maps.fetch_add(1, Ordering::Relaxed);
            Ok(())
        }

        fn unmap(&self, iova: u64, len: usize) -> Result<(), MapError> {
            if self.fail_unmap.load(Ordering::Relaxed) {
                return Err(MapError::Unmap {
                    iova,
                    len: len as u64,
                    source: io::Error::from_raw_os_error(libc::EIO),
                });
            }
            self.unmaps.fetch_add(1, Ordering::Relaxed);
            Ok(())
        }

        fn iova_ranges(&self) -> Vec<Range<u64>> {
            NoIommu.iova_ranges()
        }
    }

    fn setup() -> (Arc<CountingMapper>, Arc<IovaSpace>) {
        let mapper = Arc::new(CountingMapper::default());
        let space = IovaSpace::new(mapper.clone());
        (mapper, space)
    }

    fn small(len: usize) -> Memory {
        Memory::allocate(len, PageSize::Small4K, None).expect("allocate")
    }

    #[test]
    fn two_regions_two_mappings_translated_like_an_iommu() {
        let (mapper, space) = setup();
        let a = space.map(small(8192)).expect("map a");
        let b = space.map(small(4096)).expect("map b");
        assert_eq!(
            (space.mappings(), mapper.maps.load(Ordering::Relaxed)),
            (2, 2)
        );
        assert!(a.iova() >= NoIommu::RANGE.start && b.iova() >= a.iova() + 8192);
        assert_eq!(a.iova_of(4100), a.iova() + 4100);
        assert_eq!(
            a.translate(a.as_ptr().wrapping_add(10)),
            Some(a.iova() + 10)
        );
        assert_eq!(a.translate(b.as_ptr()), None);

        a.slice(4100, 5)
            .expect("slice a")
            .write_slice(b"hello", 0)
            .expect("write a");
        b.slice(0, 4096)
            .expect("slice b")
            .write_slice(b"world", 4091)
            .expect("write b");
        let memory = space.memory();
        let mut buf = [0u8; 5];
        memory
            .read_slice(&mut buf, GuestAddress(a.iova() + 4100))
            .expect("read a via IOVA");
        assert_eq!(&buf, b"hello");
        memory
            .read_slice(&mut buf, GuestAddress(b.iova() + 4091))
            .expect("read b via IOVA");
        assert_eq!(&buf, b"world");

        let end = b.iova() + 4096;
        for unmapped in [0, 4096, a.iova() - 1, end, end + (2 << 20)] {
            assert!(
                memory.read_slice(&mut buf, GuestAddress(unmapped)).is_err(),
                "{unmapped:#x}"
            );
        }
        assert!(
            memory.read_slice(&mut buf, GuestAddress(end - 2)).is_err(),
            "crosses the end"
        );
        assert!(a.slice(8190, 4).is_err(), "bounds-checked");
    }

    #[test]
    fn a_view_follows_every_map_and_unmap_and_is_kept_while_nothing_changes() {
        let (_mapper, space) = setup();
        let a = space.map(small(4096)).expect("map a");
        let mut view = space.view();
        let seen = |view: &mut MemoryView, iova: u64| {
            space.refresh(view).get_slice(GuestAddress(iova), 8).is_ok()
        };
        assert!(seen(&mut view, a.iova()));
        // nothing changed: the same snapshot, not a new one
        let before: *const GuestMemoryMmap = space.refresh(&mut view);
        assert!(std::ptr::eq(before, space.refresh(&mut view)));
        let b = space.map(small(4096)).expect("map b");
        assert!(seen(&mut view, b.iova()), "a mapping made since");
        let gone = a.iova();
        drop(a);
        assert!(
            !seen(&mut view, gone),
            "an unmapped region still translated"
        );
        assert!(seen(&mut view, b.iova()));
    }

    #[test]
    fn drop_unregisters_unmaps_and_frees_the_iova() {
        let (mapper, space) = setup();
        let a = space.map(small(4096)).expect("map");
        let iova = a.iova();
        a.slice(0, 2)
            .expect("slice")
            .write_slice(b"ok", 0)
            .expect("write");
        let snapshot = space.memory();
        drop(a);
        assert_eq!(
            (space.mappings(), mapper.unmaps.load(Ordering::Relaxed)),
            (0, 1)
        );
        assert!(space
            .memory()
            .read_slice(&mut [0u8; 2], GuestAddress(iova))
            .is_err());
        // An old snapshot still holds the pages: stale, but never a dangling pointer.
        let mut buf = [0u8; 2];
        snapshot
            .read_slice(&mut buf, GuestAddress(iova))
            .expect("snapshot");
        assert_eq!(&buf, b"ok");
        assert_eq!(
            space.map(small(4096)).expect("remap").iova(),
            iova,
            "IOVA reused"
        );
    }

    #[test]
    fn failed_unmap_leaks_memory_and_iova() {
        let (mapper, space) = setup();
        let a = space.map(small(4096)).expect("map");
        let iova = a.iova();
        mapper.fail_unmap.store(true, Ordering::Relaxed);
        drop(a);
        mapper.fail_unmap.store(false, Ordering::Relaxed);
        assert_eq!(space.mappings(), 0);
        assert_ne!(
            space.map(small(4096)).expect("map").iova(),
            iova,
            "a still-mapped IOVA is never reused"
        );
    }

    #[test]
    fn failed_map_releases_the_iova() {
        let (mapper, space) = setup();
        mapper.fail_map.store(true, Ordering::Relaxed);
        let err = space.map(small(4096)).expect_err("map fails");
        assert!(matches!(err, MapError::Map { .. }), "{err}");
        assert_eq!(space.mappings(), 0);
        mapper.fail_map.store(false, Ordering::Relaxed);
        assert_eq!(
            space.map(small(4096)).expect("map").iova(),
            NoIommu::RANGE.start
        );
    }

    #[test]
    fn no_iommu_accepts_only_its_range_and_space_runs_out() {
        let host = std::ptr::null_mut();
        // SAFETY: NoIommu never dereferences `host`.
        assert!(unsafe { NoIommu.map(0, host, 4096) }.is_err());
        // SAFETY: as above.
        assert!(unsafe { NoIommu.map((1 << 39) - 4096, host, 8192) }.is_err());
        // SAFETY: as above.
        assert!(unsafe { NoIommu.map(4 << 30, host, 4096) }.is_ok());

        #[derive(Debug)]
        struct Tiny;
        impl DmaMapper for Tiny {
            unsafe fn map(&self, _: u64, _: *mut u8, _: usize) -> Result<(), MapError> {
                Ok(())
            }
            fn unmap(&self, _: u64, _: usize) -> Result<(), MapError> {
                Ok(())
            }
            fn iova_ranges(&self) -> Vec<Range<u64>> {
                vec![0x1000..0x3000]
            }
        }
        let space = IovaSpace::new(Arc::new(Tiny));
        let _a = space.map(small(8192)).expect("fits");
        let err = space.map(small(4096)).expect_err("full");
        assert!(matches!(err, MapError::NoIova { len: 4096, .. }), "{err}");
    }

    #[test]
    #[ignore = "VM: needs reserved hugepages; run by cargo xtask vm-test"]
    fn real_2m_hugepages_mapped_once() {
        let node = std::path::Path::new("/sys/devices/system/node/node0")
            .is_dir()
            .then_some(0);
        let memory =
            Memory::allocate(4 << 20, PageSize::Huge2M, node).expect("4 MiB of 2 MiB hugepages");
        assert_eq!(
            (memory.len(), memory.page_size(), memory.node()),
            (4 << 20, PageSize::Huge2M, node)
        );
        assert_eq!(memory.as_ptr() as usize % (2 << 20), 0);
        let (mapper, space) = setup();
        let region = space.map(memory).expect("map");
        assert_eq!(region.iova() % (2 << 20), 0);
        assert_eq!(
            (space.mappings(), mapper.maps.load(Ordering::Relaxed)),
            (1, 1)
        );
        let offset = (3 << 20) + 17;
        region
            .slice(offset, 6)
            .expect("slice")
            .write_slice(b"usnvme", 0)
            .expect("write");
        let mut buf = [0u8; 6];
        space
            .memory()
            .read_slice(&mut buf, GuestAddress(region.iova_of(offset)))
            .expect("read via IOVA");
        assert_eq!(&buf, b"usnvme");
        drop(region);
        assert_eq!(
            (space.mappings(), mapper.unmaps.load(Ordering::Relaxed)),
            (0, 1)
        );
    }
}
