//! The engine's side of fio's I/O path (what `queue`, `commit` and `getevents` call) on a
//! simulated drive: data written through fio's buffers reads back as written, and the path
//! allocates nothing once the job is set up (a counting allocator watches this thread; the
//! threaded simulated controller allocates on its own).

use std::alloc::{GlobalAlloc, Layout, System};
use std::cell::Cell;

use usnvme_engine::Op;
use usnvme_fio::job::{Done, Job, Queued};
use usnvme_fio::registry;

struct Counting;

thread_local! {
    static ALLOCATIONS: Cell<u64> = const { Cell::new(0) };
}

// SAFETY: forwards to the system allocator unchanged; only counts calls.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        let _ = ALLOCATIONS.try_with(|c| c.set(c.get() + 1));
        // SAFETY: same contract as the caller's.
        unsafe { System.alloc(layout) }
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        // SAFETY: same contract as the caller's.
        unsafe { System.dealloc(ptr, layout) }
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        let _ = ALLOCATIONS.try_with(|c| c.set(c.get() + 1));
        // SAFETY: same contract as the caller's.
        unsafe { System.realloc(ptr, layout, new_size) }
    }
}

#[global_allocator]
static GLOBAL: Counting = Counting;

const DEPTH: usize = 16;
const BS: usize = 4096;

/// Waits for `n` completions; every one must have succeeded. Returns their tokens.
fn reap(job: &mut Job, n: usize, tokens: &mut Vec<u64>) {
    tokens.clear();
    while tokens.len() < n {
        let done: &[Done] = job.reap(1, DEPTH, None);
        for d in done {
            assert!(
                !d.failed,
                "I/O {} failed: {}",
                d.token,
                usnvme_fio::job::last_failure()
            );
            tokens.push(d.token);
        }
    }
}

/// parking_lot allocates a thread's parking data the first time the thread waits: here on the
/// simulated drive's doorbell lock while the drive's thread holds it, at a moment nobody
/// chooses. Wait once before counting (a condition variable's wait of no time parks).
fn park_once() {
    let lock = parking_lot::Mutex::new(());
    let mut guard = lock.lock();
    let _ = parking_lot::Condvar::new().wait_for(&mut guard, std::time::Duration::ZERO);
}

#[test]
fn what_fio_writes_reads_back_and_the_path_allocates_nothing() {
    let names = vec!["sim:0,backend=ram,mode=threaded".to_string()];
    let devices = registry::open(&names, &Default::default()).expect("the drive opens");
    let mut job = Job::new(&devices, DEPTH as u32, BS as u64, false).expect("the job's queues");
    let start = job.alloc_buffers(DEPTH * BS).expect("fio's buffers");
    // SAFETY: alloc_buffers gave DEPTH * BS bytes at `start`, alive until free_buffers; nothing
    // else touches them while the test writes and reads them between I/Os.
    let buffers = unsafe { std::slice::from_raw_parts_mut(start, DEPTH * BS) };
    let mut tokens = Vec::with_capacity(DEPTH);
    let rounds = 200u64;
    park_once();
    let before = ALLOCATIONS.with(Cell::get);
    for round in 0..rounds {
        // DEPTH writes of a pattern naming the round and the slot, then the reads back
        for (slot, buf) in buffers.chunks_mut(BS).enumerate() {
            buf.fill((round as u8).wrapping_mul(31) ^ slot as u8);
            let offset = (round * DEPTH as u64 + slot as u64) * BS as u64 % (64 << 20);
            let queued = job.queue(0, Op::Write, offset, BS as u64, buf.as_ptr(), slot as u64);
            assert_eq!(queued, Queued::Queued);
        }
        job.commit();
        reap(&mut job, DEPTH, &mut tokens);
        buffers.fill(0);
        for (slot, buf) in buffers.chunks_mut(BS).enumerate() {
            let offset = (round * DEPTH as u64 + slot as u64) * BS as u64 % (64 << 20);
            let queued = job.queue(0, Op::Read, offset, BS as u64, buf.as_ptr(), slot as u64);
            assert_eq!(queued, Queued::Queued);
        }
        job.commit();
        reap(&mut job, DEPTH, &mut tokens);
        for (slot, buf) in buffers.chunks(BS).enumerate() {
            let want = (round as u8).wrapping_mul(31) ^ slot as u8;
            assert!(buf.iter().all(|&b| b == want), "round {round} slot {slot}");
        }
    }
    let allocations = ALLOCATIONS.with(Cell::get) - before;
    assert_eq!(
        allocations,
        0,
        "{} I/Os allocated",
        rounds * 2 * DEPTH as u64
    );
    // a buffer that is not fio's is refused, by name
    let outside = [0u8; BS];
    assert_eq!(
        job.queue(0, Op::Read, 0, BS as u64, outside.as_ptr(), 0),
        Queued::Refused
    );
    assert!(usnvme_fio::job::last_failure().contains("not in the engine's DMA memory"));
    drop(job);
    drop(devices);
    registry::release();
}
