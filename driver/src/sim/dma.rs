//! The controller's DMA through the IOVA space, on its fast path: almost every access lies in
//! one mapping, so one region lookup and one bounds check do; an access that crosses mappings
//! (or misses them) takes `vm-memory`'s general path, which decides.

use vm_memory::{ByteValued, Bytes, GuestAddress, GuestMemoryBackend};

use super::IovaMemory;

/// Reads a `T` at `addr`.
pub(super) fn read_obj<T: ByteValued>(mem: &IovaMemory, addr: u64) -> Option<T> {
    match mem.get_slice(GuestAddress(addr), size_of::<T>()) {
        Ok(slice) => slice.read_obj(0).ok(),
        Err(_) => mem.read_obj(GuestAddress(addr)).ok(),
    }
}

/// Writes `bytes` at `addr`; false when any of it is not mapped.
pub(super) fn write(mem: &IovaMemory, addr: u64, bytes: &[u8]) -> bool {
    match mem.get_slice(GuestAddress(addr), bytes.len()) {
        Ok(slice) => slice.write_slice(bytes, 0).is_ok(),
        Err(_) => mem.write_slice(bytes, GuestAddress(addr)).is_ok(),
    }
}

/// Stores `value` at `addr` with Release ordering (the phase tag a host polls).
pub(super) fn store_u16(mem: &IovaMemory, addr: u64, value: u16) -> bool {
    let ordering = std::sync::atomic::Ordering::Release;
    match mem.get_slice(GuestAddress(addr), 2) {
        Ok(slice) => slice.store(value, 0, ordering).is_ok(),
        Err(_) => mem.store(value, GuestAddress(addr), ordering).is_ok(),
    }
}

/// Whether `[addr, addr + len)` is mapped.
pub(super) fn mapped(mem: &IovaMemory, addr: u64, len: usize) -> bool {
    mem.get_slice(GuestAddress(addr), len).is_ok() || mem.check_range(GuestAddress(addr), len)
}
