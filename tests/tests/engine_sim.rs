//! The engine on simulated drives: attach, placement, reactors, stripes, verified random I/O,
//! failing parts, shutdown with I/O in flight.

use std::sync::Arc;
use std::time::{Duration, Instant};

use usnvme_driver::pci::Sysfs;
use usnvme_driver::sim::{self, Fault, FaultAction, FaultWhen, SimController};
use usnvme_driver::spec::{IoOpcode, Status};
use usnvme_driver::{ControllerOptions, DeviceSpec, IoBuffer, Opener};
use usnvme_engine::topology::{NumaNode, Topology};
use usnvme_engine::{
    attach, BlockDevice, Drive, Engine, EngineOptions, IoError, Job, NamespaceDevice, Op,
    ReactorContext, Share, StripeDevice,
};
use usnvme_hugepages::{BufferPool, DmaBuffer};
use usnvme_tests::verify::verify_job;

/// Two CPUs, one per fake node (the reactors pin to CPUs 0 and 1, which exist here).
fn two_nodes() -> Topology {
    Topology::new(
        vec![
            NumaNode {
                id: 0,
                cpus: vec![0],
            },
            NumaNode {
                id: 1,
                cpus: vec![1],
            },
        ],
        vec![0, 1],
    )
}

/// `n` simulated drives with data kept, and their controllers' sim handles.
fn sim_drives(n: u32, size: &str) -> (Vec<Drive>, Vec<Arc<SimController>>) {
    let spec: sim::SimSpec = format!("sim:0-{},backend=ram,size={size}", n - 1)
        .parse()
        .expect("sim spec");
    let opened = sim::open_with_handles(&spec, ControllerOptions::default()).expect("sim drives");
    let mut drives = Vec::new();
    let mut sims = Vec::new();
    for (i, (controller, sim)) in opened.into_iter().enumerate() {
        let spec = format!("sim:{i}").parse().expect("spec");
        drives.push(Drive {
            spec,
            controller,
            node: Some(u32::from(i as u32 >= n / 2)),
        });
        sims.push(sim);
    }
    (drives, sims)
}

fn options() -> EngineOptions {
    EngineOptions {
        cores: vec![0, 1],
        numa_memory: false,
        ..Default::default()
    }
}

#[test]
fn twenty_four_drives_two_cores_two_stripes_of_twelve_verified() {
    let (drives, sims) = sim_drives(24, "64M");
    let engine = Engine::new(two_nodes(), drives, options()).expect("engine");
    let ns = engine.namespaces();
    assert_eq!(ns.len(), 24);
    let stripe = |name: &str, members: &[Arc<dyn BlockDevice>]| -> Arc<dyn BlockDevice> {
        Arc::new(StripeDevice::new(name, members.to_vec(), 128 << 10).expect("stripe"))
    };
    let stripes = vec![stripe("stripe0", &ns[..12]), stripe("stripe1", &ns[12..])];
    assert_eq!(stripes[0].info().size_bytes, 12 * (64 << 20));
    // drives 0-11 are on node 0 and 12-23 on node 1: each stripe is served by its node's core
    let run = engine
        .start(
            stripes,
            verify_job(600, 1, vec![4096, 16 << 10, 128 << 10, 256 << 10]),
        )
        .expect("start");
    let reactors = run.reactors();
    assert_eq!(reactors.len(), 2);
    assert_eq!((reactors[0].cpu, reactors[0].devices.clone()), (0, vec![0]));
    assert_eq!((reactors[1].cpu, reactors[1].devices.clone()), (1, vec![1]));
    let results = run.wait().expect("reactors");
    for r in &results {
        let (done, mismatches, errors) = &r.output;
        assert_eq!(*done, 600, "core {}", r.info.cpu);
        assert_eq!(
            *mismatches, 0,
            "core {}: data read back differs from the model",
            r.info.cpu
        );
        assert!(errors.is_empty(), "{errors:?}");
        let total = r.stats.total();
        assert_eq!(total.errors(), 0);
        assert_eq!(total.total_ios(), 600);
    }
    // the queue pairs are gone after the run; every drive took part
    for s in &sims {
        assert_eq!(s.io_queues(), (0, 0));
        assert!(s.commands() > 0);
    }
}

#[test]
fn placement_on_a_faked_two_node_topology_serves_each_drive_from_its_node() {
    let (drives, _sims) = sim_drives(4, "16M");
    let engine = Engine::new(
        two_nodes(),
        drives,
        EngineOptions {
            numa_memory: true,
            ..options()
        },
    )
    .expect("engine");
    let p = engine.placement();
    assert_eq!(p.reactors[0].drives, vec![0, 1]);
    assert_eq!(p.reactors[1].drives, vec![2, 3]);
    assert!(p.remote.is_empty());
    assert_eq!(
        p.to_string().lines().next(),
        Some("core 0 (node 0): drives 0-1")
    );
    // each namespace is served by its node's core, whose memory node is that node
    let plan: Vec<(usize, Option<u32>)> = engine
        .placement()
        .reactors
        .iter()
        .map(|r| (r.cpu, r.node))
        .collect();
    assert_eq!(plan, vec![(0, Some(0)), (1, Some(1))]);
    // only node 0 cores: node 1 drives are remote, served by both
    let (drives, _sims) = sim_drives(4, "16M");
    let engine = Engine::new(
        two_nodes(),
        drives,
        EngineOptions {
            cores: vec![0],
            ..options()
        },
    )
    .expect("engine");
    assert_eq!(engine.placement().remote.len(), 2);
}

#[test]
fn an_io_over_three_chunks_splits_onto_three_drives_and_at_mdts() {
    let (drives, _sims) = sim_drives(4, "16M");
    let engine = Engine::new(
        two_nodes(),
        drives,
        EngineOptions {
            cores: vec![0],
            ..options()
        },
    )
    .expect("engine");
    let ns = engine.namespaces();
    let chunk = 1 << 20; // larger than MDTS (512 KiB): each chunk part splits again
    let stripe: Arc<dyn BlockDevice> =
        Arc::new(StripeDevice::new("s", ns.clone(), chunk).expect("stripe"));
    let mut devices = vec![stripe];
    devices.extend(ns.iter().cloned());
    let run = engine
        .start(devices, move |_| OneShot { step: 0 })
        .expect("start");
    let results = run.wait().expect("reactors");
    assert_eq!(results[0].output, Ok(()), "{:?}", results[0].output);
}

/// Writes 2.5 MiB at 1.5 MiB into the stripe (chunks 1, 2 and 3: members 1, 2, 3), then reads
/// each member directly and checks the bytes landed where the layout says.
struct OneShot {
    step: u32,
}

impl Job for OneShot {
    type Output = Result<(), String>;

    fn turn(&mut self, ctx: &mut ReactorContext) -> bool {
        let chunk = 1u64 << 20;
        let (offset, len) = (chunk + chunk / 2, 2 * chunk + chunk / 2);
        let pool = ctx.devices[0].buffer_pool(4 << 20, 2).expect("pool");
        let (mut pool, data) = (pool, (0..len).map(|i| (i % 253) as u8).collect::<Vec<u8>>());
        let (w, r) = (pool.alloc().expect("buffer"), pool.alloc().expect("buffer"));
        w.write_from(&data, 0).expect("fill");
        let wait = |dev: &mut usnvme_engine::engine::DeviceChannel| -> Result<(), IoError> {
            let started = Instant::now();
            let mut result = None;
            while result.is_none() {
                dev.poll(|c| result = Some(c.result()));
                assert!(started.elapsed() < Duration::from_secs(10));
            }
            result.expect("a completion")
        };
        ctx.devices[0]
            .submit(
                Op::Write,
                offset,
                len,
                Some(IoBuffer {
                    iova: w.iova(),
                    len: len as u32,
                }),
                1,
            )
            .expect("submit");
        wait(&mut ctx.devices[0]).expect("striped write");
        // member m holds chunk (m + 4 * row); our I/O covers the second half of chunk 1, chunk 2
        // and chunk 3, at member offset 0 of row 0
        let expect = [
            (1usize, chunk / 2, 0u64, chunk / 2),
            (2, 0, chunk / 2, chunk),
            (3, 0, chunk + chunk / 2, chunk),
        ];
        for (member, member_offset, at, n) in expect {
            let dev = &mut ctx.devices[1 + member];
            dev.submit(
                Op::Read,
                member_offset,
                n,
                Some(IoBuffer {
                    iova: r.iova(),
                    len: n as u32,
                }),
                2,
            )
            .expect("submit");
            wait(dev).expect("member read");
            let mut got = vec![0u8; n as usize];
            r.read_into(&mut got, 0).expect("read back");
            if got[..] != data[at as usize..(at + n) as usize] {
                return false_with(&mut self.step, format!("member {member}: wrong bytes"));
            }
        }
        self.step = 1;
        false
    }

    fn finish(self, _ctx: &mut ReactorContext) -> Self::Output {
        if self.step == 1 {
            Ok(())
        } else {
            Err(format!("failed at step {}", self.step))
        }
    }
}

fn false_with(step: &mut u32, why: String) -> bool {
    eprintln!("{why}");
    *step = 2;
    false
}

#[test]
fn a_failing_part_fails_the_whole_io_with_its_error() {
    let (drives, sims) = sim_drives(3, "16M");
    let engine = Engine::new(
        two_nodes(),
        drives,
        EngineOptions {
            cores: vec![0],
            ..options()
        },
    )
    .expect("engine");
    let ns = engine.namespaces();
    let stripe: Arc<dyn BlockDevice> =
        Arc::new(StripeDevice::new("s", ns, 64 << 10).expect("stripe"));
    // the part on member 2 fails
    sims[2].inject(Fault::new(
        FaultWhen::opcode(IoOpcode::Write as u8),
        FaultAction::Fail(Status::WRITE_FAULT),
    ));
    let run = engine
        .start(vec![stripe], |_| Once { result: None })
        .expect("start");
    let results = run.wait().expect("reactors");
    let result = results[0].output.clone().expect("a completion");
    let Err(IoError::Device { device, status }) = result else {
        panic!("the I/O must fail: {result:?}")
    };
    assert_eq!(&*device, "sim:2");
    assert_eq!(status.code(), Status::WRITE_FAULT);
    assert_eq!(results[0].stats.total().errors(), 1);
}

#[test]
fn a_late_io_fails_as_timed_out_and_a_lost_one_as_aborted_by_a_reset() {
    for (action, expected) in [
        // still in the controller: the Abort finds it ("Command Abort Requested")
        (FaultAction::Delay(Duration::from_secs(5)), "timed out"),
        // forgotten: the Abort finds nothing, the reset after a second timeout fails it
        (FaultAction::Drop, "aborted by a reset"),
    ] {
        let (drives, sims) = sim_drives(1, "16M");
        let mut opts = options();
        opts.cores = vec![0];
        opts.channel.timeout = Some(Duration::from_millis(200));
        let engine = Engine::new(two_nodes(), drives, opts).expect("engine");
        let ns = engine.namespaces();
        sims[0].inject(Fault::new(FaultWhen::opcode(IoOpcode::Write as u8), action));
        let run = engine
            .start(vec![ns[0].clone()], |_| OneWrite::default())
            .expect("start");
        let results = run.wait().expect("reactors");
        let result = results[0].output.clone().expect("a completion");
        let kind = match &result {
            Err(IoError::TimedOut { .. }) => "timed out",
            Err(IoError::AbortedByReset { .. }) => "aborted by a reset",
            _ => "something else",
        };
        assert_eq!(kind, expected, "{result:?}");
        let device = result.expect_err("failed").device().clone();
        assert_eq!(&*device, "sim:0");
    }
}

/// Keeps 4 reads in flight on every device of its reactor and counts each device's completions
/// (successful or not) where the test thread can read them.
struct CountingReads {
    counts: Arc<Vec<std::sync::atomic::AtomicU64>>,
    pools: Vec<(BufferPool, Vec<DmaBuffer>)>,
    free: Vec<Vec<u64>>,
}

impl Job for CountingReads {
    type Output = ();

    fn prepare(&mut self, ctx: &mut ReactorContext) -> Result<(), String> {
        for d in &ctx.devices {
            let mut pool = d.buffer_pool(4096, 4).map_err(|e| e.to_string())?;
            let bufs: Vec<DmaBuffer> = std::iter::from_fn(|| pool.alloc()).collect();
            self.free.push((0..bufs.len() as u64).collect());
            self.pools.push((pool, bufs));
        }
        Ok(())
    }

    fn turn(&mut self, ctx: &mut ReactorContext) -> bool {
        for (i, d) in ctx.devices.iter_mut().enumerate() {
            let device = d.device;
            let (free, counts) = (&mut self.free[i], &self.counts);
            d.poll(|c| {
                counts[device].fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                free.push(c.token);
            });
            while let Some(slot) = self.free[i].pop() {
                let buf = &self.pools[i].1[slot as usize];
                let io = IoBuffer {
                    iova: buf.iova(),
                    len: 4096,
                };
                if d.submit(Op::Read, slot * 4096, 4096, Some(io), slot)
                    .is_err()
                {
                    self.free[i].push(slot);
                    break;
                }
            }
        }
        true
    }

    fn finish(mut self, ctx: &mut ReactorContext) -> Self::Output {
        // what is still in flight comes back before the buffers go
        while ctx.devices.iter().any(|d| d.in_flight() > 0) {
            for d in &mut ctx.devices {
                d.poll(|_| {});
            }
        }
        for (mut pool, bufs) in self.pools.drain(..) {
            for b in bufs {
                let _ = pool.free(b);
            }
        }
    }
}

#[test]
fn a_reset_stalls_only_its_own_drive_on_a_reactor_of_24() {
    use std::sync::atomic::{AtomicU64, Ordering};
    // 24 drives; drive 0's controller takes 300 ms to be ready after a reset (as real ones take
    // time); drive 1 loses a command, so its queue pair's timeout resets it on its own
    let mut spec: sim::SimSpec = "sim:0-23,backend=null,size=16M".parse().expect("spec");
    spec.config.ready_delay = Duration::from_millis(300);
    let opened = sim::open_with_handles(&spec, ControllerOptions::default()).expect("sims");
    let mut drives = Vec::new();
    let mut sims = Vec::new();
    for (i, (controller, sim)) in opened.into_iter().enumerate() {
        drives.push(Drive {
            spec: format!("sim:{i}").parse().expect("spec"),
            controller,
            node: Some(0),
        });
        sims.push(sim);
    }
    let mut opts = options();
    opts.cores = vec![0];
    opts.channel.timeout = Some(Duration::from_millis(100));
    let engine = Engine::new(two_nodes(), drives, opts).expect("engine");
    let ctrls: Vec<_> = engine
        .drives()
        .iter()
        .map(|d| d.controller.clone())
        .collect();
    let counts: Arc<Vec<AtomicU64>> = Arc::new((0..24).map(|_| AtomicU64::new(0)).collect());
    let shared = counts.clone();
    let run = engine
        .start(engine.namespaces(), move |_| CountingReads {
            counts: shared.clone(),
            pools: Vec::new(),
            free: Vec::new(),
        })
        .expect("start");
    let snapshot = || -> Vec<u64> { counts.iter().map(|c| c.load(Ordering::Relaxed)).collect() };
    let wait_for = |what: &str, done: &dyn Fn() -> bool| {
        let deadline = Instant::now() + Duration::from_secs(20);
        while !done() {
            assert!(Instant::now() < deadline, "waited 20 s for {what}");
            std::thread::sleep(Duration::from_millis(1));
        }
    };
    wait_for("I/O on every drive", &|| snapshot().iter().all(|&n| n > 0));

    // A reset asked for (as `perf --reset-after` does), and one the driver starts itself.
    sims[1].inject(Fault::new(FaultWhen::any_io(), FaultAction::Drop));
    for (drive, start) in [(0usize, true), (1, false)] {
        if start {
            ctrls[drive].start_reset();
        }
        wait_for("the reset to start", &|| ctrls[drive].generation() % 2 == 1);
        let at_start = snapshot();
        wait_for("the reset to end", &|| ctrls[drive].generation() % 2 == 0);
        let at_end = snapshot();
        for other in (0..24).filter(|&d| d != drive) {
            assert!(
                at_end[other] > at_start[other],
                "drive {other} completed nothing while drive {drive} was reset: {at_start:?} -> {at_end:?}"
            );
        }
        wait_for("I/O to resume on the reset drive", &|| {
            snapshot()[drive] > at_end[drive]
        });
        assert_eq!(ctrls[drive].resets(), 1);
        assert!(!ctrls[drive].failed());
    }
    run.stop();
    run.wait().expect("reactors");
    // no reactor rang a doorbell of a controller while it was being reset
    let ignored: Vec<u64> = sims.iter().map(|s| s.invalid_doorbells()).collect();
    assert!(ignored.iter().all(|&n| n == 0), "{ignored:?}");
}

/// Writes 4 KiB once, then polls a turn at a time (the reactor's clock, and so the command
/// timeouts, move between turns) until it completes or 10 s pass.
#[derive(Default)]
struct OneWrite {
    pool: Option<(BufferPool, DmaBuffer)>,
    started: Option<Instant>,
    result: Option<Result<(), IoError>>,
}

impl Job for OneWrite {
    type Output = Option<Result<(), IoError>>;

    fn turn(&mut self, ctx: &mut ReactorContext) -> bool {
        if self.started.is_none() {
            let mut pool = ctx.devices[0].buffer_pool(4096, 1).expect("pool");
            let buf = pool.alloc().expect("buffer");
            let io = IoBuffer {
                iova: buf.iova(),
                len: 4096,
            };
            ctx.devices[0]
                .submit(Op::Write, 0, 4096, Some(io), 7)
                .expect("submit");
            self.pool = Some((pool, buf));
            self.started = Some(Instant::now());
        }
        ctx.devices[0].poll(|c| self.result = Some(c.result()));
        self.result.is_none()
            && self
                .started
                .is_some_and(|t| t.elapsed() < Duration::from_secs(10))
    }

    fn finish(mut self, _ctx: &mut ReactorContext) -> Self::Output {
        if let Some((mut pool, buf)) = self.pool.take() {
            pool.free(buf).expect("its own buffer");
        }
        self.result
    }
}

/// Writes 192 KiB (three 64 KiB chunks, one per member) once.
struct Once {
    result: Option<Result<(), IoError>>,
}

impl Job for Once {
    type Output = Option<Result<(), IoError>>;

    fn turn(&mut self, ctx: &mut ReactorContext) -> bool {
        let mut pool = ctx.devices[0].buffer_pool(192 << 10, 1).expect("pool");
        let buf = pool.alloc().expect("buffer");
        let io = IoBuffer {
            iova: buf.iova(),
            len: 192 << 10,
        };
        ctx.devices[0]
            .submit(Op::Write, 0, 192 << 10, Some(io), 9)
            .expect("submit");
        let started = Instant::now();
        while self.result.is_none() && started.elapsed() < Duration::from_secs(10) {
            ctx.devices[0].poll(|c| {
                assert_eq!(c.token, 9);
                self.result = Some(c.result());
            });
        }
        false
    }

    fn finish(self, _ctx: &mut ReactorContext) -> Self::Output {
        self.result
    }
}

#[test]
fn stopping_with_io_in_flight_drains_and_deletes_the_queues() {
    let spec: sim::SimSpec = "sim:0-1,backend=null,mode=threaded,latency=2ms"
        .parse()
        .expect("spec");
    let opened = sim::open_with_handles(&spec, ControllerOptions::default()).expect("sims");
    let sims: Vec<_> = opened.iter().map(|(_, s)| s.clone()).collect();
    let drives = opened
        .into_iter()
        .enumerate()
        .map(|(i, (controller, _))| Drive {
            spec: format!("sim:{i}").parse().expect("spec"),
            controller,
            node: None,
        })
        .collect();
    let engine = Engine::new(two_nodes(), drives, options()).expect("engine");
    let run = engine
        .start(engine.namespaces(), |_| Endless { bufs: Vec::new() })
        .expect("start");
    // Live statistics while the reactors run: wait until they show I/O.
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let live = run.stats();
        assert_eq!(live.len(), 2, "both reactors answer");
        if live.iter().any(|s| s.total().total_ios() > 0) {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "no I/O in the live statistics after 20 s"
        );
        std::thread::yield_now();
    }
    run.stop();
    let results = run.wait().expect("reactors");
    for r in &results {
        assert!(
            r.output > 0,
            "core {} had I/O in flight when stopped",
            r.info.cpu
        );
    }
    for s in &sims {
        assert_eq!(s.io_queues(), (0, 0), "queues deleted");
    }
    drop(engine);
}

/// Keeps 32 reads in flight on every device until stopped; reports the most it had in flight.
struct Endless {
    bufs: Vec<(BufferPool, DmaBuffer)>,
}

impl Job for Endless {
    type Output = usize;

    fn turn(&mut self, ctx: &mut ReactorContext) -> bool {
        for (i, dev) in ctx.devices.iter_mut().enumerate() {
            if self.bufs.len() <= i {
                let mut pool = dev.buffer_pool(4096, 1).expect("pool");
                let b = pool.alloc().expect("buffer");
                self.bufs.push((pool, b));
            }
            let io = IoBuffer {
                iova: self.bufs[i].1.iova(),
                len: 4096,
            };
            while dev.in_flight() < 32 && dev.submit(Op::Read, 0, 4096, Some(io), 0).is_ok() {}
            dev.poll(|_| {});
        }
        true
    }

    fn finish(self, ctx: &mut ReactorContext) -> Self::Output {
        ctx.devices
            .iter()
            .map(|d| d.stats().total_ios() as usize)
            .sum()
    }
}

#[test]
fn a_drive_that_fails_to_attach_does_not_stop_the_others() {
    let opener = Opener::new("/nonexistent");
    let specs: Vec<DeviceSpec> = vec![
        "sim:0-1".parse().expect("spec"),
        "0000:7f:00.0".parse().expect("spec"),
    ];
    let results = attach(
        &opener,
        &Sysfs::with_root("/nonexistent"),
        &specs,
        &ControllerOptions::default(),
    );
    assert_eq!(results.len(), 3);
    assert!(results[0].is_ok() && results[1].is_ok());
    let e = results[2].as_ref().expect_err("no such PCI device");
    assert!(e.to_string().starts_with("0000:7f:00.0"), "{e}");
}

/// A job that notes the queues its drive's controller has when I/O begins, then runs `inner`.
struct QueuesSeen<J> {
    inner: J,
    sim: Arc<SimController>,
    seen: Option<(usize, usize)>,
}

impl<J: Job> Job for QueuesSeen<J> {
    type Output = (J::Output, Option<(usize, usize)>, usize);

    fn prepare(&mut self, ctx: &mut ReactorContext) -> Result<(), String> {
        self.inner.prepare(ctx)
    }

    fn turn(&mut self, ctx: &mut ReactorContext) -> bool {
        // every reactor made its queues before any turned
        self.seen.get_or_insert_with(|| self.sim.io_queues());
        self.inner.turn(ctx)
    }

    fn finish(self, ctx: &mut ReactorContext) -> Self::Output {
        let queues = ctx.queue_count();
        (self.inner.finish(ctx), self.seen, queues)
    }
}

#[test]
fn four_namespaces_on_two_cores_use_one_queue_pair_per_core() {
    let spec: sim::SimSpec = "sim:0,ns=4,backend=ram,size=16M".parse().expect("spec");
    let (controller, sim) = sim::open_with_handles(&spec, ControllerOptions::default())
        .expect("a sim drive")
        .remove(0);
    let drives = vec![Drive {
        spec: "sim:0".parse().expect("spec"),
        controller,
        node: Some(0),
    }];
    let one_node = Topology::new(
        vec![NumaNode {
            id: 0,
            cpus: vec![0, 1],
        }],
        vec![0, 1],
    );
    let engine = Engine::new(one_node, drives, options()).expect("engine");
    let namespaces = engine.namespaces();
    assert_eq!(namespaces.len(), 4);
    let verify = verify_job(200, 2, vec![4096, 64 << 10, 256 << 10]);
    let run = engine
        .start(namespaces, move |info| QueuesSeen {
            inner: verify(info),
            sim: sim.clone(),
            seen: None,
        })
        .expect("start");
    let results = run.wait().expect("reactors");
    assert_eq!(results.len(), 2, "both cores serve the drive");
    for r in &results {
        let ((done, mismatches, errors), seen, queues) = &r.output;
        assert_eq!(r.info.devices, [0, 1, 2, 3], "core {}", r.info.cpu);
        assert_eq!(*done, 4 * 200, "core {}", r.info.cpu);
        assert_eq!(
            *mismatches, 0,
            "core {}: data read back differs",
            r.info.cpu
        );
        assert!(errors.is_empty(), "{errors:?}");
        // two cores, four namespaces: two I/O queue pairs on the controller, not eight
        assert_eq!(*seen, Some((2, 2)), "core {}", r.info.cpu);
        assert_eq!(*queues, 1, "core {}: its one queue", r.info.cpu);
        for d in 0..4 {
            let ios = r.stats.devices.get(&d).map_or(0, |s| s.total_ios());
            assert!(ios > 0, "namespace {} idle on core {}", d + 1, r.info.cpu);
        }
    }
}

/// An engine on `drives` with one reactor, on CPU 0.
fn one_core_engine(drives: Vec<Drive>) -> Engine {
    Engine::new(
        Topology::new(
            vec![NumaNode {
                id: 0,
                cpus: vec![0],
            }],
            vec![0],
        ),
        drives,
        EngineOptions {
            cores: vec![0],
            numa_memory: false,
            ..Default::default()
        },
    )
    .expect("engine")
}

/// Takes devices added while it runs and says, for each, whether its queue is shared with the
/// reactor's other devices; reads once from each so that its queue is really used.
struct TakesAdded {
    shared: Vec<bool>,
}

impl Job for TakesAdded {
    type Output = Vec<bool>;

    fn turn(&mut self, ctx: &mut ReactorContext) -> bool {
        for d in ctx.devices.iter_mut() {
            d.poll(|_| {});
        }
        true
    }

    fn device_added(&mut self, ctx: &mut ReactorContext, _share: Share) -> Result<(), String> {
        let added = ctx.devices.last().ok_or("no device")?;
        self.shared.push(added.shares_queue());
        Ok(())
    }

    fn finish(self, _ctx: &mut ReactorContext) -> Self::Output {
        self.shared
    }
}

#[test]
fn a_device_added_while_running_gets_a_queue_of_its_own() {
    let (mut drives, _sims) = sim_drives(2, "4M");
    let second = drives.pop().expect("two drives");
    let engine = one_core_engine(drives);
    let run = engine
        .start(engine.namespaces(), |_| TakesAdded { shared: Vec::new() })
        .expect("start");
    // the second drive's one namespace, in the same DMA space (every sim drive shares one)
    let added: Arc<dyn BlockDevice> =
        Arc::new(NamespaceDevice::new(second.controller.clone(), 1, 1).expect("namespace 1"));
    run.add_device(1, &added, std::slice::from_ref(&second.controller), &[0])
        .expect("added");
    run.stop();
    let results = run.wait().expect("reactors");
    // not behind the shared-queue cell: nothing else on the reactor uses its queue pair
    assert_eq!(results[0].output, [false]);
}

/// Reads block 0 of every device over and over (two at a time each), counting completions by
/// device in `done`, failures in `failed`.
struct ReadsEverything {
    pool: Option<BufferPool>,
    buffer: Option<DmaBuffer>,
    done: Arc<[std::sync::atomic::AtomicU64; 2]>,
    failed: Arc<std::sync::atomic::AtomicU64>,
}

impl Job for ReadsEverything {
    type Output = ();

    fn prepare(&mut self, ctx: &mut ReactorContext) -> Result<(), String> {
        let mut pool = ctx.devices[0]
            .buffer_pool(4096, 1)
            .map_err(|e| e.to_string())?;
        self.buffer = pool.alloc();
        self.pool = Some(pool);
        Ok(())
    }

    fn turn(&mut self, ctx: &mut ReactorContext) -> bool {
        use std::sync::atomic::Ordering::Relaxed;
        let Some(b) = &self.buffer else { return false };
        let io = IoBuffer {
            iova: b.iova(),
            len: 4096,
        };
        for (i, d) in ctx.devices.iter_mut().enumerate().take(2) {
            while d.in_flight() < 2 && d.submit(Op::Read, 0, 4096, Some(io), 0).is_ok() {}
            let (done, failed) = (&self.done[i], &self.failed);
            d.poll(|c| match c.result() {
                Ok(()) => _ = done.fetch_add(1, Relaxed),
                Err(_) => _ = failed.fetch_add(1, Relaxed),
            });
        }
        true
    }

    fn device_added(&mut self, _ctx: &mut ReactorContext, _share: Share) -> Result<(), String> {
        Ok(())
    }

    fn finish(mut self, _ctx: &mut ReactorContext) {
        if let (Some(pool), Some(b)) = (self.pool.as_mut(), self.buffer.take()) {
            let _ = pool.free(b);
        }
    }
}

#[test]
fn a_device_added_while_its_controller_is_slow_to_create_queues_stops_no_other_device() {
    use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
    let (mut drives, sims) = sim_drives(2, "4M");
    let second = drives.pop().expect("two drives");
    let engine = one_core_engine(drives);
    let done = Arc::new([AtomicU64::new(0), AtomicU64::new(0)]);
    let failed = Arc::new(AtomicU64::new(0));
    let (d, f) = (done.clone(), failed.clone());
    let run = engine
        .start(engine.namespaces(), move |_| ReadsEverything {
            pool: None,
            buffer: None,
            done: d.clone(),
            failed: f.clone(),
        })
        .expect("start");
    // the second drive holds its Create I/O CQ until the test releases it
    sims[1].inject(Fault::new(
        FaultWhen::admin(usnvme_driver::spec::AdminOpcode::CreateIoCq as u8),
        FaultAction::Hold,
    ));
    let added: Arc<dyn BlockDevice> =
        Arc::new(NamespaceDevice::new(second.controller.clone(), 1, 1).expect("namespace 1"));
    // answered at once: the reactor does not wait for the queues
    run.add_device(1, &added, std::slice::from_ref(&second.controller), &[0])
        .expect("added");
    let deadline = Instant::now() + Duration::from_secs(30);
    let wait_for = |what: &str, event: &dyn Fn() -> bool| {
        while !event() {
            assert!(Instant::now() < deadline, "{what}");
            std::thread::yield_now();
        }
    };
    wait_for("Create I/O CQ never came", &|| !sims[1].held(0).is_empty());
    // while the controller holds it, the first drive's reads go on
    let before = done[0].load(Relaxed);
    wait_for("the first drive stopped", &|| {
        done[0].load(Relaxed) >= before + 1000
    });
    assert_eq!(done[1].load(Relaxed), 0, "a read done without queues");
    assert_eq!(
        sims[1].release(0),
        [usnvme_driver::spec::AdminOpcode::CreateIoCq as u8]
    );
    wait_for("the added drive's reads never completed", &|| {
        done[1].load(Relaxed) > 0
    });
    run.stop();
    run.wait().expect("reactors");
    assert_eq!(failed.load(Relaxed), 0);
}

/// Says, at its end, which devices were found gone.
struct SeesRemoved;

impl Job for SeesRemoved {
    type Output = Vec<Option<String>>;

    fn turn(&mut self, _ctx: &mut ReactorContext) -> bool {
        false
    }

    fn finish(self, ctx: &mut ReactorContext) -> Self::Output {
        ctx.devices
            .iter()
            .map(|d| d.removed().map(String::from))
            .collect()
    }
}

#[test]
fn a_drive_removed_before_its_reactor_has_queues_fails_alone() {
    let (drives, sims) = sim_drives(2, "4M");
    let engine = one_core_engine(drives);
    // gone after attach, before the reactor creates its queue pairs
    sims[1].remove();
    let run = engine
        .start(engine.namespaces(), |_| SeesRemoved)
        .expect("the run starts without it");
    let results = run.wait().expect("reactors");
    assert_eq!(results[0].output, [None, Some("sim:1 is gone".to_string())]);
}
