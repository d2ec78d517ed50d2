//! A global allocator that counts the allocations of each thread: a test binary that includes
//! this module has it (the engine's allocation tests, the VM's NVMe/RDMA one).

use std::alloc::{GlobalAlloc, Layout, System};
use std::cell::Cell;

thread_local! {
    static ALLOCATIONS: Cell<u64> = const { Cell::new(0) };
}

/// The system allocator, counting this thread's allocations.
struct Counting;

// SAFETY: every call is passed unchanged to the system allocator, which upholds the
// GlobalAlloc contract; the count is a thread-local Cell, which allocates nothing.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        ALLOCATIONS.with(|c| c.set(c.get() + 1));
        // SAFETY: the caller's layout, as GlobalAlloc::alloc requires.
        unsafe { System.alloc(layout) }
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        // SAFETY: `ptr` came from System with this layout (every allocation goes there).
        unsafe { System.dealloc(ptr, layout) }
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        ALLOCATIONS.with(|c| c.set(c.get() + 1));
        // SAFETY: `ptr` came from System with `layout`; the caller's new size.
        unsafe { System.realloc(ptr, layout, new_size) }
    }
}

#[global_allocator]
static ALLOCATOR: Counting = Counting;

/// Checks that this binary's allocator counts: one allocation, one more.
pub fn assert_counting() {
    let before = allocations();
    drop(std::hint::black_box(Box::new(7u64)));
    assert_eq!(allocations(), before + 1, "the counter counts");
}

/// The allocations (and reallocations) of the calling thread so far.
pub fn allocations() -> u64 {
    ALLOCATIONS.with(Cell::get)
}
