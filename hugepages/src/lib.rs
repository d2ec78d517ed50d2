//! Hugepage DMA memory on a NUMA node, IOVA allocation, DMA mapping and buffer pools.
//!
//! - [`Memory`]: a populated, locked mapping of 2 MiB / 1 GiB hugepages bound to a NUMA node.
//! - [`IovaAllocator`]: first-fit IOVA ranges inside what the IOMMU accepts.
//! - [`IovaSpace`]: maps each [`Memory`] once through a [`DmaMapper`] and models every mapping in a
//!   vm-memory [`GuestMemoryMmap`](vm_memory::GuestMemoryMmap) addressed by IOVA, through which the
//!   software controller translates device addresses: only what is mapped is reachable.
//! - [`BufferPool`]: per-owner fixed-size [`DmaBuffer`]s from one region; O(1), lock-free.
//! - [`readv_volatile`] / [`writev_volatile`]: socket I/O straight into and out of DMA memory.

mod iova;
mod memory;
mod pool;
mod space;
mod vectored;

pub use iova::{IovaAllocator, IovaError};
pub use memory::{hugepage_status, Memory, MemoryError, NodeHugepages, PageSize};
pub use pool::{BufferPool, DmaBuffer, ForeignBuffer, PoolError};
pub use space::{DmaMapper, DmaRegion, IovaSpace, MapError, MemoryView, NoIommu};
pub use vectored::{readv_volatile, writev_volatile, MAX_PARTS};

/// The vm-memory address space of an [`IovaSpace`]: a [`vm_memory::GuestAddress`] is an IOVA.
pub type IovaMemory = vm_memory::GuestMemoryMmap;
