//! The I/O path allocates nothing: a counting global allocator watches 20 000 reads and writes
//! on a real (emulated) drive after start-up.

use std::alloc::{GlobalAlloc, Layout, System};
use std::sync::atomic::{AtomicU64, Ordering};

use usnvme_driver::vfio::Vfio;
use usnvme_driver::{Controller, ControllerOptions, IoBuffer, QueuePairOptions};
use usnvme_hugepages::{BufferPool, PageSize};
use usnvme_tests::vfio_controllers;

struct Counting;

static ALLOCATIONS: AtomicU64 = AtomicU64::new(0);

// SAFETY: forwards to the system allocator unchanged; only counts calls.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        ALLOCATIONS.fetch_add(1, Ordering::Relaxed);
        // SAFETY: same contract as the caller's.
        unsafe { System.alloc(layout) }
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        // SAFETY: same contract as the caller's.
        unsafe { System.dealloc(ptr, layout) }
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        ALLOCATIONS.fetch_add(1, Ordering::Relaxed);
        // SAFETY: same contract as the caller's.
        unsafe { System.realloc(ptr, layout, new_size) }
    }
}

#[global_allocator]
static GLOBAL: Counting = Counting;

#[test]
#[ignore = "VM: run by `cargo xtask vm-test`"]
fn submitting_and_polling_allocate_nothing() {
    let vfio = Vfio::new("/sys").expect("VFIO container");
    let ctrl =
        Controller::open(&vfio, vfio_controllers()[3], ControllerOptions::default()).expect("open");
    let bs = ctrl.namespace(1).expect("namespace").block_size;
    let mut qp = ctrl
        .create_queue_pair(QueuePairOptions {
            depth: 128,
            ..Default::default()
        })
        .expect("queue pair");
    let buffers =
        BufferPool::new(ctrl.iova_space(), 8192, 1, PageSize::Huge2M, None).expect("pool");
    let buf = IoBuffer {
        iova: buffers.region().iova(),
        len: 8192,
    };
    let blocks = 8192 / bs as u64;

    let before = ALLOCATIONS.load(Ordering::Relaxed);
    let (mut submitted, mut completed, mut failed) = (0u64, 0u64, 0u64);
    while completed < 20_000 {
        while submitted < 20_000 && qp.in_flight() < 64 {
            let lba = (submitted % 1000) * blocks;
            let r = if submitted % 2 == 0 {
                qp.write(1, lba, buf, submitted)
            } else {
                qp.read(1, lba, buf, submitted)
            };
            if r.is_err() {
                break;
            }
            submitted += 1;
        }
        qp.poll(|c| {
            completed += 1;
            failed += u64::from(!c.status.is_success());
        });
    }
    let allocated = ALLOCATIONS.load(Ordering::Relaxed) - before;
    assert_eq!(failed, 0);
    assert_eq!(
        allocated, 0,
        "the I/O path allocated {allocated} times in 20 000 I/Os"
    );
}
