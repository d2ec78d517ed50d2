//! The I/O path allocates nothing after start-up: a counting global allocator watches the
//! submitting thread through tens of thousands of reads and writes, on a simulated drive (in
//! `cargo test`) and on a real one (in the VM). The simulated controller runs threaded, so its
//! own allocations happen on its thread and are not counted.

use std::alloc::{GlobalAlloc, Layout, System};
use std::cell::Cell;

use usnvme_driver::vfio::Vfio;
use usnvme_driver::{sim, Controller, ControllerOptions, IoBuffer, QueuePair, QueuePairOptions};
use usnvme_hugepages::{BufferPool, PageSize};
use usnvme_tests::vfio_controllers;

struct Counting;

thread_local! {
    static ALLOCATIONS: Cell<u64> = const { Cell::new(0) };
}

fn count() {
    // `try_with`: during thread teardown the counter may already be gone.
    let _ = ALLOCATIONS.try_with(|c| c.set(c.get() + 1));
}

// SAFETY: forwards to the system allocator unchanged; only counts calls.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        count();
        // SAFETY: same contract as the caller's.
        unsafe { System.alloc(layout) }
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        // SAFETY: same contract as the caller's.
        unsafe { System.dealloc(ptr, layout) }
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        count();
        // SAFETY: same contract as the caller's.
        unsafe { System.realloc(ptr, layout, new_size) }
    }
}

#[global_allocator]
static GLOBAL: Counting = Counting;

/// `count` 8 KiB writes and reads, 64 in flight; returns how many failed.
fn io(qp: &mut QueuePair, buf: IoBuffer, blocks: u64, count: u64) -> u64 {
    let (mut submitted, mut completed, mut failed) = (0u64, 0u64, 0u64);
    while completed < count {
        while submitted < count && qp.in_flight() < 64 {
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
    failed
}

/// Warms up, then counts the allocations of `count` I/Os on `ctrl`.
fn allocations_of_io(ctrl: &Controller, page: PageSize, count: u64) -> u64 {
    let bs = ctrl.namespace(1).expect("namespace").block_size as u64;
    let mut qp = ctrl
        .create_queue_pair(QueuePairOptions {
            depth: 128,
            ..Default::default()
        })
        .expect("queue pair");
    let pool = BufferPool::new(ctrl.iova_space(), 8192, 1, page, None).expect("pool");
    let buf = IoBuffer {
        iova: pool.region().iova(),
        len: 8192,
    };
    // Start-up: first use of each lock and thread-local. parking_lot allocates a thread's
    // parking data the first time it waits on a contended lock (the simulated controller's
    // locks, under load): make this thread wait once now.
    let lock = std::sync::Arc::new(parking_lot::Mutex::new(()));
    let (locked_tx, locked_rx) = std::sync::mpsc::channel();
    let holder = {
        let lock = lock.clone();
        std::thread::spawn(move || {
            let held = lock.lock();
            let _ = locked_tx.send(());
            std::thread::sleep(std::time::Duration::from_millis(20));
            drop(held);
        })
    };
    let _ = locked_rx.recv();
    drop(lock.lock()); // waits: this thread parks once
    let _ = holder.join();
    assert_eq!(io(&mut qp, buf, 8192 / bs, 5_000), 0);
    let before = ALLOCATIONS.with(Cell::get);
    assert_eq!(io(&mut qp, buf, 8192 / bs, count), 0);
    let allocated = ALLOCATIONS.with(Cell::get) - before;
    // the counter works: an allocation on this thread is seen
    let v = vec![1u8; 10];
    assert!(ALLOCATIONS.with(Cell::get) > before + allocated, "{v:?}");
    allocated
}

#[test]
fn submitting_and_polling_allocate_nothing_on_sim() {
    let spec = "sim:0,mode=threaded,latency=0us,backend=null"
        .parse()
        .expect("sim spec");
    let ctrl = sim::open(&spec, ControllerOptions::default())
        .expect("sim drive")
        .remove(0);
    let allocated = allocations_of_io(&ctrl, PageSize::Small4K, 50_000);
    assert_eq!(
        allocated, 0,
        "the I/O path allocated {allocated} times in 50 000 I/Os"
    );
}

#[test]
#[ignore = "VM: run by `cargo xtask vm-test`"]
fn submitting_and_polling_allocate_nothing_on_a_real_drive() {
    let vfio = Vfio::new("/sys").expect("VFIO container");
    let ctrl =
        Controller::open(&vfio, vfio_controllers()[3], ControllerOptions::default()).expect("open");
    let allocated = allocations_of_io(&ctrl, PageSize::Huge2M, 20_000);
    assert_eq!(
        allocated, 0,
        "the I/O path allocated {allocated} times in 20 000 I/Os"
    );
}
