//! The I/O path allocates nothing after start-up: a counting global allocator watches the
//! submitting thread through 50 000 reads and writes on a simulated drive. The simulated
//! controller runs threaded, so its own allocations happen on its thread and are not counted.

use std::alloc::{GlobalAlloc, Layout, System};
use std::cell::Cell;

use usnvme_driver::{sim, ControllerOptions, IoBuffer, QueuePairOptions};
use usnvme_hugepages::{BufferPool, PageSize};

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

#[test]
fn submitting_and_polling_allocate_nothing() {
    let spec = "sim:0,mode=threaded,latency=0us,backend=null"
        .parse()
        .expect("sim spec");
    let ctrl = sim::open(&spec, ControllerOptions::default())
        .expect("sim drive")
        .remove(0);
    let bs = ctrl.namespace(1).expect("namespace").block_size;
    let mut qp = ctrl
        .create_queue_pair(QueuePairOptions {
            depth: 128,
            ..Default::default()
        })
        .expect("queue pair");
    let pool = BufferPool::new(ctrl.iova_space(), 8192, 1, PageSize::Small4K, None).expect("pool");
    let buf = IoBuffer {
        iova: pool.region().iova(),
        len: 8192,
    };
    let blocks = 8192 / bs as u64;

    let mut io = |count: u64| {
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
    };
    // Start-up: first use of each lock and thread-local (parking_lot allocates its per-thread
    // parking data the first time a lock is contended).
    assert_eq!(io(5_000), 0);
    let before = ALLOCATIONS.with(Cell::get);
    let failed = io(50_000);
    let allocated = ALLOCATIONS.with(Cell::get) - before;
    assert_eq!(failed, 0);
    assert_eq!(
        allocated, 0,
        "the I/O path allocated {allocated} times in 50 000 I/Os"
    );
    // the check itself works: an allocation on this thread is seen
    let v = vec![1u8; 10];
    assert!(ALLOCATIONS.with(Cell::get) > before + allocated, "{v:?}");
}
