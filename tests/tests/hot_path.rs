//! The I/O path allocates nothing after start-up: a counting global allocator watches the
//! submitting thread through tens of thousands of reads and writes, on a simulated drive (in
//! `cargo test`) and on a real one (in the VM), through the driver alone and through the
//! engine (namespace and stripe channels, split I/Os, statistics). The simulated controller runs threaded, so its
//! own allocations happen on its thread and are not counted.

use std::alloc::{GlobalAlloc, Layout, System};
use std::cell::Cell;

use std::sync::Arc;

use usnvme_driver::pci::Sysfs;
use usnvme_driver::vfio::Vfio;
use usnvme_driver::{
    sim, Controller, ControllerOptions, DeviceSpec, IoBuffer, Opener, QueuePair, QueuePairOptions,
};
use usnvme_engine::topology::Topology;
use usnvme_engine::{
    attach, BlockDevice, Engine, EngineOptions, Job, Op, ReactorContext, StripeDevice,
};
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

/// Start-up: parking_lot allocates a thread's parking data the first time it waits on a
/// contended lock (the simulated controller's locks, under load): make this thread wait once
/// (a condition variable's wait of no time parks).
fn park_once() {
    let lock = parking_lot::Mutex::new(());
    let mut guard = lock.lock();
    let _ = parking_lot::Condvar::new().wait_for(&mut guard, std::time::Duration::ZERO);
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
    park_once();
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

/// Through the engine: a job keeps 32 I/Os in flight on a namespace and on a stripe over two
/// drives (4 KiB reads inside a chunk, and 96 KiB writes over chunk boundaries, split and
/// gathered), reaping, refilling and ringing once per turn as `usnvme perf` does. Counts the
/// reactor thread's allocations after a warm-up.
struct CountingJob {
    bufs: Vec<(BufferPool, Vec<usnvme_hugepages::DmaBuffer>)>,
    completed: u64,
    failed: u64,
    counted_from: Option<u64>,
    /// Allocations from the warm-up's end to the last turn.
    allocated: Option<u64>,
}

const ENGINE_WARMUP: u64 = 5_000;
const ENGINE_IOS: u64 = 50_000;

impl Job for CountingJob {
    type Output = (u64, u64, u64);

    fn prepare(&mut self, ctx: &mut ReactorContext) -> Result<(), String> {
        park_once();
        for d in &ctx.devices {
            let mut pool = d.buffer_pool(96 << 10, 32).map_err(|e| e.to_string())?;
            let bufs = (0..32).filter_map(|_| pool.alloc()).collect();
            self.bufs.push((pool, bufs));
        }
        Ok(())
    }

    fn turn(&mut self, ctx: &mut ReactorContext) -> bool {
        if self.counted_from.is_none() && self.completed >= ENGINE_WARMUP {
            self.counted_from = Some(ALLOCATIONS.with(Cell::get));
        }
        for (i, d) in ctx.devices.iter_mut().enumerate() {
            let (completed, failed) = (&mut self.completed, &mut self.failed);
            d.poll(|c| {
                *completed += 1;
                *failed += u64::from(c.result().is_err());
            });
            let bufs = &self.bufs[i].1;
            while d.in_flight() < 32 && self.completed < ENGINE_IOS {
                let n = d.in_flight() as u64 + self.completed;
                let b = &bufs[(n % 32) as usize];
                let (op, offset, len) = if n.is_multiple_of(4) {
                    (Op::Write, (n % 100) * (96 << 10), 96 << 10)
                } else {
                    (Op::Read, (n % 1000) * 4096, 4096)
                };
                let io = IoBuffer {
                    iova: b.iova(),
                    len: len as u32,
                };
                if d.submit(op, offset, len, Some(io), n % 32).is_err() {
                    break;
                }
            }
            d.flush();
        }
        let more = self.completed < ENGINE_IOS || ctx.devices.iter().any(|d| d.in_flight() > 0);
        if !more {
            let from = self.counted_from.unwrap_or(u64::MAX);
            self.allocated = Some(ALLOCATIONS.with(Cell::get).wrapping_sub(from));
        }
        more
    }

    fn finish(mut self, _ctx: &mut ReactorContext) -> Self::Output {
        let allocated = self.allocated.unwrap_or(u64::MAX);
        for (pool, bufs) in &mut self.bufs {
            for b in bufs.drain(..) {
                let _ = pool.free(b);
            }
        }
        (allocated, self.completed, self.failed)
    }
}

#[test]
fn the_engine_path_allocates_nothing_on_sim() {
    let opener = Opener::new("/nonexistent");
    let specs: Vec<DeviceSpec> = vec!["sim:0-1,mode=threaded,latency=0us,backend=null"
        .parse()
        .expect("sim spec")];
    let drives = attach(
        &opener,
        &Sysfs::new(),
        &specs,
        &ControllerOptions::default(),
    )
    .into_iter()
    .collect::<Result<Vec<_>, _>>()
    .expect("attached");
    let topology = Topology::from_sysfs("/".as_ref()).expect("topology");
    let core = topology.allowed[0];
    let engine = Engine::new(
        topology,
        drives,
        EngineOptions {
            cores: vec![core],
            ..EngineOptions::default()
        },
    )
    .expect("engine");
    let namespaces = engine.namespaces();
    let stripe = StripeDevice::new("stripe0", namespaces.clone(), 64 << 10).expect("stripe");
    let devices: Vec<Arc<dyn BlockDevice>> = vec![namespaces[0].clone(), Arc::new(stripe)];
    let run = engine
        .start(devices, |_| CountingJob {
            bufs: Vec::new(),
            completed: 0,
            failed: 0,
            counted_from: None,
            allocated: None,
        })
        .expect("started");
    let results = run.wait().expect("ran");
    let (allocated, completed, failed) = results[0].output;
    assert!(
        completed >= ENGINE_IOS && failed == 0,
        "{completed} I/Os, {failed} failed"
    );
    assert_eq!(
        allocated,
        0,
        "the engine's I/O path allocated {allocated} times in {} I/Os",
        ENGINE_IOS - ENGINE_WARMUP
    );
}
