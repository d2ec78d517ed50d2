//! The real driver (`Controller`, `QueuePair`) against the simulated controller, plus a few
//! register-level checks with a hand-made host where the driver cannot misbehave on purpose.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use usnvme_hugepages::{BufferPool, DmaBuffer, DmaRegion, Memory, NoIommu, PageSize};
use vm_memory::Bytes;

use super::*;
use crate::protection::{Guard, PiChecks, PiFields, PiFormat, PiType};
use crate::spec::command::{Cns, FeatureId, FeatureSelect, QueuePriority, SGL_BIT_BUCKET};
use crate::spec::identify::{ControllerList, Oacs};
use crate::spec::registers::{cq_head_doorbell, sq_tail_doorbell};
use crate::spec::{
    AdminOpcode, Aqa, Cqe, IdentifyController, IdentifyNamespace, IoOpcode, LogPageId,
    NamespaceList, SglDescriptor, Sqe,
};
use crate::{
    Completion, IoBuffer, MetadataIo, NamespaceChanges, QueuePair, QueuePairOptions, SubmitError,
};

const NSID: u32 = 1;

fn ram(block_size: u32, blocks: u64) -> SimConfig {
    SimConfig {
        namespaces: vec![SimNamespace {
            block_size,
            blocks,
            metadata: MetadataFormat::default(),
        }],
        backend: Backend::Ram,
        ..SimConfig::default()
    }
}

fn options() -> ControllerOptions {
    ControllerOptions {
        io_queues: 4,
        admin_depth: 16,
        admin_timeout: Duration::from_secs(5),
        page: PageSize::Small4K,
        // off by default; these tests keep the shadow doorbell path tested
        shadow_doorbells: true,
        ..ControllerOptions::default()
    }
}

fn start_with(config: SimConfig, options: ControllerOptions) -> (Arc<SimController>, Controller) {
    let space = iova_space();
    let sim = SimController::new(config, space.clone());
    let irq = Some(sim.clone() as Arc<dyn Interrupts>);
    let ctrl = Controller::init("sim:t".into(), sim.clone(), irq, space, None, None, options)
        .expect("bring-up");
    (sim, ctrl)
}

fn start(config: SimConfig) -> (Arc<SimController>, Controller) {
    start_with(config, options())
}

fn queue(ctrl: &Controller, depth: u16) -> QueuePair {
    ctrl.create_queue_pair(QueuePairOptions {
        depth,
        ..QueuePairOptions::default()
    })
    .expect("queue pair")
}

fn pool(size: usize, count: usize) -> BufferPool {
    BufferPool::new(&iova_space(), size, count, PageSize::Small4K, None).expect("buffer pool")
}

fn span(buf: &DmaBuffer, offset: usize, len: usize) -> IoBuffer {
    IoBuffer {
        iova: buf.iova_at(offset),
        len: len as u32,
    }
}

fn pattern(seed: u64, len: usize) -> Vec<u8> {
    let mut data = vec![0u8; len];
    fastrand::Rng::with_seed(seed).fill(&mut data);
    data
}

/// Polls until one completion arrives. The limit is a hang guard: on a busy machine the
/// timeout tests' commands (40 ms) take seconds, as a poll delayed past half a timeout restarts
/// their clocks.
fn wait(qp: &mut QueuePair) -> Completion {
    let started = Instant::now();
    loop {
        let mut done = None;
        qp.poll(|c| done = Some(c));
        if let Some(c) = done {
            return c;
        }
        assert!(started.elapsed() < Duration::from_secs(60), "no completion");
        std::thread::yield_now();
    }
}

/// Submits one command and waits for its completion; returns its status.
fn run(
    qp: &mut QueuePair,
    submit: impl FnOnce(&mut QueuePair) -> Result<(), SubmitError>,
) -> Status {
    submit(qp).expect("submitted");
    let c = wait(qp);
    assert_eq!(c.token, 7, "the token comes back");
    c.status
}

/// Polls a few times and returns what completed.
fn drain(qp: &mut QueuePair) -> Vec<Completion> {
    let mut all = Vec::new();
    for _ in 0..5 {
        qp.poll(|c| all.push(c));
    }
    all
}

fn command_status(e: Error) -> Status {
    match e {
        Error::Command { status, .. } => status.code(),
        other => panic!("expected a command error, got {other}"),
    }
}

#[test]
fn bring_up_identify_and_logs_through_sim_open() {
    let spec: SimSpec = "sim:0-1,backend=ram".parse().expect("spec");
    let ctrls = open(&spec, options()).expect("open");
    assert_eq!(ctrls.len(), 2);
    for (k, ctrl) in ctrls.iter().enumerate() {
        assert_eq!(ctrl.name(), format!("sim:{k}"));
        let id = ctrl.identify();
        assert_eq!(id.serial(), format!("sim{k}"));
        assert_eq!(
            (id.model().as_str(), id.firmware().as_str()),
            ("usnvme sim", "1.0")
        );
        assert_eq!(ctrl.version().to_string(), "1.4.0");
        assert_eq!((ctrl.cap().mqes(), ctrl.cap().to()), (2047, 20));
        let ns = ctrl.namespace(NSID).expect("namespace 1");
        assert_eq!((ns.block_size, ns.capacity_bytes()), (512, 1 << 30));
        assert_eq!(
            ns.identify.dlfeat & 7,
            1,
            "deallocated blocks read as zeroes"
        );
        assert_eq!(ctrl.max_transfer(), 512 << 10);
        assert_eq!(ctrl.io_queues_granted(), 4);
        assert!(ctrl.shadow_doorbells());
        let smart = ctrl.smart_log().expect("SMART");
        assert_eq!(smart.temperature_celsius(), 40);
        assert_eq!(smart.critical_warnings().0, 0);
        let fw = ctrl.firmware_log().expect("firmware log");
        assert_eq!(
            (fw.active_slot(), fw.revision(1).as_deref()),
            (1, Some("1.0"))
        );
        assert!(ctrl.error_log(4).expect("error log").is_empty());
        let nqueues = ctrl
            .admin(Sqe::get_features(
                FeatureId::NumberOfQueues,
                FeatureSelect::Current,
            ))
            .expect("get features");
        assert_eq!(nqueues, 0x0003_0003);
        let (_, list) = ctrl
            .admin_read(Sqe::identify(Cns::NamespaceDescriptorList, 1), 4096)
            .expect("descriptors");
        assert_eq!(&list[..2], &[2, 16], "an NGUID");
    }

    let spec: SimSpec = "sim:2-3,bs=4096,size=64M,ns=2,queues=2,mdts=5,sgl=off,dbbuf=off,mqes=63"
        .parse()
        .expect("spec");
    let ctrls = open(
        &spec,
        ControllerOptions {
            sgl: true,
            ..options()
        },
    )
    .expect("open");
    for ctrl in &ctrls {
        assert_eq!(ctrl.namespaces().len(), 2);
        assert_eq!(ctrl.namespace(2).expect("ns 2").block_size, 4096);
        assert_eq!(ctrl.namespace(2).expect("ns 2").capacity_bytes(), 64 << 20);
        assert_eq!(ctrl.io_queues_granted(), 2);
        assert_eq!(ctrl.max_transfer(), 128 << 10);
        assert!(!ctrl.shadow_doorbells() && !ctrl.uses_sgl());
        assert_eq!(ctrl.cap().mqes(), 63);
        let a = queue(ctrl, 64);
        let b = queue(ctrl, 64);
        assert!(matches!(
            ctrl.create_queue_pair(QueuePairOptions::default()),
            Err(Error::NoQueue { granted: 2, .. })
        ));
        drop((a, b));
    }
}

/// Every PRP shape (PRP1 only, PRP1 + PRP2, lists) and mid-page buffers, with PRPs and SGLs, on
/// 512-byte and 4 KiB blocks.
#[test]
fn data_round_trips_through_every_data_pointer_shape() {
    for (bs, sgl) in [(512u32, false), (4096, false), (512, true), (4096, true)] {
        let (sim, ctrl) = start_with(
            ram(bs, (64 << 20) / bs as u64),
            ControllerOptions { sgl, ..options() },
        );
        assert_eq!(ctrl.uses_sgl(), sgl);
        let mdts = ctrl.max_transfer() as usize;
        let mut qp = queue(&ctrl, 16);
        let mut buffers = pool(1 << 20, 2);
        let (w, r) = (
            buffers.alloc().expect("buffer"),
            buffers.alloc().expect("buffer"),
        );
        let bs = bs as usize;
        let mut lba = 8u64;
        for size in [512, 4096, 8192, 128 << 10, mdts] {
            if size < bs {
                continue;
            }
            for offset in [0usize, 512, 3584] {
                let data = pattern(lba, size);
                w.write_from(&data, offset).expect("fill");
                r.fill(0xee);
                let st = run(&mut qp, |q| q.write(NSID, lba, span(&w, offset, size), 7));
                assert!(st.is_success(), "write {size} at +{offset}: {st}");
                let st = run(&mut qp, |q| {
                    q.read(NSID, lba, span(&r, offset + 4, size), 7)
                });
                assert!(st.is_success(), "read {size} at +{offset}: {st}");
                let mut back = vec![0u8; size];
                r.read_into(&mut back, offset + 4).expect("read back");
                assert!(
                    back == data,
                    "bs {bs}, sgl {sgl}: {size} bytes at +{offset} differ"
                );
                lba += (size / bs) as u64 + 1;
            }
        }
        assert!(run(&mut qp, |q| q.flush_cache(NSID, 7)).is_success());
        assert!(sim.stored_chunks(NSID) > 0);
        assert_eq!((sim.dma_faults(), sim.invalid_doorbells()), (0, 0));
        buffers.free(w).expect("own");
        buffers.free(r).expect("own");
    }
}

#[test]
fn write_zeroes_and_deallocate_read_back_zeroes_and_free_memory() {
    for bs in [512usize, 4096] {
        let (sim, ctrl) = start(ram(bs as u32, 4096));
        let mut qp = queue(&ctrl, 8);
        let mut buffers = pool(64 << 10, 1);
        let buf = buffers.alloc().expect("buffer");
        // 8 KiB-aligned, so that deallocation frees whole 4 KiB chunks
        let (lba, len) = ((8192 / bs) as u64 * 100, 16 * bs);
        let expect = pattern(99, len);
        buf.write_from(&expect, 0).expect("fill");
        assert!(run(&mut qp, |q| q.write(NSID, lba, span(&buf, 0, len), 7)).is_success());
        assert!(run(&mut qp, |q| q.write_zeroes(NSID, lba + 4, 8, 7)).is_success());
        buf.fill(0xaa);
        assert!(run(&mut qp, |q| q.read(NSID, lba, span(&buf, 0, len), 7)).is_success());
        let mut back = vec![0u8; len];
        buf.read_into(&mut back, 0).expect("read back");
        assert_eq!(back[..4 * bs], expect[..4 * bs]);
        assert!(back[4 * bs..12 * bs].iter().all(|&b| b == 0));
        assert_eq!(back[12 * bs..], expect[12 * bs..]);
        let held = sim.stored_chunks(NSID);
        assert!(held > 0);
        assert!(run(&mut qp, |q| q.deallocate(NSID, lba, 16, 7)).is_success());
        assert!(sim.stored_chunks(NSID) < held, "the ram backend forgets");
        assert!(run(&mut qp, |q| q.read(NSID, lba, span(&buf, 0, len), 7)).is_success());
        buf.read_into(&mut back, 0).expect("read back");
        assert!(back.iter().all(|&b| b == 0));
        let st = run(&mut qp, |q| q.deallocate(NSID, 4090, 16, 7));
        assert_eq!(st.code(), Status::LBA_OUT_OF_RANGE);
        buffers.free(buf).expect("own");
    }
}

/// Three commands in flight on rings of 68 entries (depth 4 and the spare entries that let the
/// CQ head doorbell wait for 64 completions): the rings wrap 176 times; phase tags toggle each
/// time; every token comes back once.
#[test]
fn queue_wraps_around_thousands_of_times() {
    for dbbuf in [true, false] {
        let (_sim, ctrl) = start(SimConfig {
            doorbell_buffer: dbbuf,
            ..ram(512, 1024)
        });
        let mut qp = queue(&ctrl, 4);
        let mut buffers = pool(4096, 1);
        let buf = buffers.alloc().expect("buffer");
        let total = 12_000u64;
        let (mut next, mut done) = (0u64, 0u64);
        while done < total {
            while next < total && qp.in_flight() < 3 {
                let lba = next % 1024;
                let r = if next % 2 == 0 {
                    qp.write(NSID, lba, span(&buf, 0, 512), next)
                } else {
                    qp.read(NSID, lba, span(&buf, 512, 512), next)
                };
                r.expect("room for three");
                next += 1;
            }
            qp.poll(|c| {
                assert!(c.status.is_success(), "{}", c.status);
                assert_eq!(c.token, done, "inline mode completes in order");
                done += 1;
            });
        }
        let s = qp.stats();
        assert_eq!((s.submitted, s.completed, s.garbage), (total, total, 0));
        assert_eq!(qp.depth(), 68);
        if dbbuf {
            // with shadow doorbells the CQ head is written to MMIO only when it crosses
            // EventIdx (0): once a lap
            assert!(s.cq_doorbells <= total / 68 + 1, "{s:?}");
        } else {
            // once per 64 to 66 completions (one poll takes up to three)
            assert!((total / 67..=total / 64).contains(&s.cq_doorbells), "{s:?}");
        }
        buffers.free(buf).expect("own");
    }
}

#[test]
fn a_full_queue_refuses_then_one_poll_takes_everything() {
    let (_sim, ctrl) = start(ram(512, 1024));
    let mut qp = queue(&ctrl, 8);
    for t in 0..7 {
        qp.flush_cache(NSID, t).expect("room");
    }
    assert_eq!(
        qp.flush_cache(NSID, 7),
        Err(SubmitError::QueueFull { in_flight: 7 })
    );
    let mut tokens = Vec::new();
    assert_eq!(qp.poll(|c| tokens.push(c.token)), 7);
    assert_eq!(tokens, (0..7).collect::<Vec<_>>());
    qp.flush_cache(NSID, 8).expect("room again");
    assert_eq!(wait(&mut qp).token, 8);
}

/// A controller that posts every completion twice fills the spare CQ entries the driver counts
/// on before it tells the CQ head: the duplicates count as consumed entries, the head is told,
/// nothing stalls.
#[test]
fn duplicate_completions_do_not_stall_a_lazily_told_cq_head() {
    let (sim, ctrl) = start(SimConfig {
        doorbell_buffer: false,
        ..ram(512, 1024)
    });
    let mut qp = queue(&ctrl, 8);
    assert_eq!(qp.depth(), 72, "depth 8 and 64 spare entries");
    sim.inject(Fault::new(FaultWhen::any_io(), FaultAction::Duplicate).times(0));
    let mut done = 0u64;
    for round in 0..40u64 {
        for t in 0..7 {
            qp.flush_cache(NSID, round * 7 + t).expect("room");
        }
        for _ in 0..100 {
            if done == (round + 1) * 7 {
                break;
            }
            done += qp.poll(|c| assert!(c.status.is_success())) as u64;
        }
        assert_eq!(done, (round + 1) * 7, "round {round} stalled");
    }
    let s = qp.stats();
    assert_eq!(s.garbage, 280, "every duplicate is detected");
    assert!(s.cq_doorbells >= 560 / 72, "{s:?}");
}

/// Duplicates fill the CQ beyond what one poll takes; the rest waits in the controller until
/// the host frees entries, and comes in the next poll.
#[test]
fn more_completions_than_one_poll_takes() {
    // rings of 8 entries (MQES 7): no spare entries, the CQ head is told after every poll
    let (sim, ctrl) = start(SimConfig {
        doorbell_buffer: false,
        mqes: 7,
        ..ram(512, 1024)
    });
    let mut qp = queue(&ctrl, 8);
    assert_eq!(qp.depth(), 8);
    sim.inject(Fault::new(FaultWhen::any_io(), FaultAction::Duplicate).times(0));
    for t in 0..7 {
        qp.flush_cache(NSID, t).expect("room");
    }
    let first = qp.poll(|_| {});
    assert!(first < 7, "one poll cannot take 14 entries");
    let mut rest = first;
    for _ in 0..3 {
        rest += qp.poll(|_| {});
    }
    assert_eq!(rest, 7);
    assert_eq!(qp.stats().garbage, 7, "every duplicate is detected");
    assert!(sim.completions() >= 14);
}

/// Threaded mode: completions out of order and late, matched to their tokens; data intact.
#[test]
fn threaded_out_of_order_completions_match_their_tokens() {
    let (sim, ctrl) = start(SimConfig {
        mode: SimMode::Threaded {
            latency: Duration::from_micros(20),
            out_of_order: true,
        },
        ..ram(512, 1 << 16)
    });
    let mut qp = queue(&ctrl, 64);
    let mut buffers = pool(4096, 64);
    let mut outstanding: HashMap<u64, (DmaBuffer, u64, bool)> = HashMap::new();
    let (total, mut issued, mut completed, mut token) = (2000u64, 0u64, 0u64, 0u64);
    let (mut inversions, mut last) = (0u64, 0u64);
    let started = Instant::now();
    while completed < total {
        while issued < total && qp.in_flight() < 63 {
            let buf = buffers.alloc().expect("buffer");
            let lba = (issued % 1000) * 8;
            let write = (issued / 1000) == 0;
            if write {
                buf.write_from(&pattern(lba, 4096), 0).expect("fill");
            }
            let b = span(&buf, 0, 4096);
            let r = if write {
                qp.write(NSID, lba, b, token)
            } else {
                qp.read(NSID, lba, b, token)
            };
            r.expect("submit");
            outstanding.insert(token, (buf, lba, write));
            token += 1;
            issued += 1;
        }
        qp.poll(|c| {
            let (buf, lba, write) = outstanding.remove(&c.token).expect("a token given once");
            assert!(c.status.is_success(), "{}", c.status);
            if !write {
                let mut back = vec![0u8; 4096];
                buf.read_into(&mut back, 0).expect("read back");
                assert!(back == pattern(lba, 4096), "lba {lba}");
            }
            if c.token < last {
                inversions += 1;
            }
            last = c.token;
            buffers.free(buf).expect("own");
            completed += 1;
        });
        assert!(started.elapsed() < Duration::from_secs(10), "stuck");
    }
    assert!(inversions > 0, "out of order");
    assert_eq!(qp.stats().garbage, 0);
    assert_eq!(sim.invalid_doorbells(), 0);
}

#[test]
fn two_threads_each_with_a_queue_pair_on_one_controller() {
    let (_sim, ctrl) = start(ram(4096, 1 << 14));
    std::thread::scope(|s| {
        for t in 0..2u64 {
            let ctrl = ctrl.clone();
            s.spawn(move || {
                let mut qp = queue(&ctrl, 32);
                let mut buffers = pool(4096, 2);
                let (w, r) = (
                    buffers.alloc().expect("buffer"),
                    buffers.alloc().expect("buffer"),
                );
                for i in 0..300u64 {
                    let lba = t * 8192 + i;
                    let data = pattern(lba, 4096);
                    w.write_from(&data, 0).expect("fill");
                    assert!(run(&mut qp, |q| q.write(NSID, lba, span(&w, 0, 4096), 7)).is_success());
                    assert!(run(&mut qp, |q| q.read(NSID, lba, span(&r, 0, 4096), 7)).is_success());
                    let mut back = vec![0u8; 4096];
                    r.read_into(&mut back, 0).expect("read back");
                    assert!(back == data);
                }
                buffers.free(w).expect("own");
                buffers.free(r).expect("own");
            });
        }
    });
}

/// Shadow doorbells: the SQ tail is rung once per batch (EventIdx asks for it), the CQ head
/// never; a queue id used again does not see the stale shadow values of its predecessor.
#[test]
fn shadow_doorbells_and_a_queue_id_used_again() {
    let (sim, ctrl) = start(ram(512, 1024));
    for round in 0..3 {
        let mut qp = queue(&ctrl, 16);
        assert_eq!(qp.qid(), 1);
        for i in 0..50 + round {
            assert!(
                run(&mut qp, |q| q.flush_cache(NSID, 7)).is_success(),
                "round {round} i {i}"
            );
        }
        let s = qp.stats();
        assert_eq!(s.sq_doorbells, 50 + round as u64);
        assert!(s.cq_doorbells <= 1 + (50 + round as u64) / 16, "{s:?}");
    }
    assert_eq!(sim.invalid_doorbells(), 0);
}

fn crafted(qp: &mut QueuePair, sqe: Sqe) -> Status {
    run(qp, |q| q.submit(sqe, 7))
}

#[test]
fn bad_data_pointers_are_refused_by_name() {
    let (sim, ctrl) = start(ram(512, 1 << 16));
    let mut qp = queue(&ctrl, 16);
    let mut buffers = pool(64 << 10, 2);
    let (buf, list) = (
        buffers.alloc().expect("buffer"),
        buffers.alloc().expect("buffer"),
    );
    let with = |mut sqe: Sqe, prp1: u64, prp2: u64| {
        sqe.prp1 = prp1;
        sqe.prp2 = prp2;
        sqe
    };
    let base = buf.iova();
    // 8 KiB: PRP1 + PRP2
    let st = crafted(&mut qp, with(Sqe::read(1, 0, 16), base, base + 4096));
    assert!(st.is_success(), "{st}");
    let st = crafted(&mut qp, with(Sqe::read(1, 0, 16), base, base + 4096 + 8));
    assert_eq!(
        st.code(),
        Status::PRP_OFFSET_INVALID,
        "PRP2 not page aligned"
    );
    assert!(st.dnr());
    let st = crafted(&mut qp, with(Sqe::read(1, 0, 1), base + 2, 0));
    assert_eq!(
        st.code(),
        Status::PRP_OFFSET_INVALID,
        "PRP1 not dword aligned"
    );
    // 12 KiB: PRP1 + a list of two entries
    let entries = |a: u64, b: u64| [a.to_le_bytes(), b.to_le_bytes()].concat();
    list.write_from(&entries(base + 4096, base + 8192), 0)
        .expect("list");
    let st = crafted(&mut qp, with(Sqe::read(1, 0, 24), base, list.iova()));
    assert!(st.is_success(), "{st}");
    list.write_from(&entries(base + 4096, base + 8192 + 16), 0)
        .expect("list");
    let st = crafted(&mut qp, with(Sqe::read(1, 0, 24), base, list.iova()));
    assert_eq!(
        st.code(),
        Status::PRP_OFFSET_INVALID,
        "list entry not page aligned"
    );
    let st = crafted(&mut qp, with(Sqe::read(1, 0, 24), base, list.iova() + 4));
    assert_eq!(
        st.code(),
        Status::PRP_OFFSET_INVALID,
        "list pointer not qword aligned"
    );
    // unmapped memory: what an IOMMU would fault on
    let faults = sim.dma_faults();
    let st = crafted(&mut qp, with(Sqe::read(1, 0, 1), 0x1000, 0));
    assert_eq!(st.code(), Status::DATA_TRANSFER_ERROR);
    list.write_from(&entries(base + 4096, 1 << 40), 0)
        .expect("list");
    let st = crafted(&mut qp, with(Sqe::write(1, 0, 24), base, list.iova()));
    assert_eq!(
        st.code(),
        Status::DATA_TRANSFER_ERROR,
        "unmapped list entry"
    );
    assert_eq!(sim.dma_faults(), faults + 2);
    // larger than MDTS (512 KiB), never mind the data pointer
    let st = crafted(&mut qp, with(Sqe::read(1, 0, 2048), base, 0));
    assert_eq!(st.code(), Status::INVALID_FIELD);
    // SGL on a controller asked to use PRPs is fine (the controller supports them) ...
    let mut sgl = Sqe::read(1, 0, 8);
    sgl.set_sgl(SglDescriptor::data_block(base + 3, 4096));
    assert!(
        crafted(&mut qp, sgl).is_success(),
        "byte-aligned SGL data block"
    );
    // ... but not on one without SGL support
    let (_sim2, ctrl2) = start(SimConfig {
        sgl: false,
        ..ram(512, 1024)
    });
    let mut qp2 = queue(&ctrl2, 4);
    assert_eq!(crafted(&mut qp2, sgl).code(), Status::INVALID_FIELD);
    buffers.free(buf).expect("own");
    buffers.free(list).expect("own");
}

#[test]
fn sgl_segments_are_walked_and_checked() {
    let (_sim, ctrl) = start(ram(512, 1 << 16));
    let mut qp = queue(&ctrl, 16);
    let mut buffers = pool(64 << 10, 3);
    let (w, r, descs) = (
        buffers.alloc().expect("buffer"),
        buffers.alloc().expect("buffer"),
        buffers.alloc().expect("buffer"),
    );
    let data = pattern(5, 8192);
    w.write_from(&data, 0).expect("fill");
    // a segment of two data blocks in reverse order, then a last segment with one
    let put = |at: usize, d: SglDescriptor| descs.write_from(d.as_bytes(), at).expect("desc");
    put(0, SglDescriptor::data_block(w.iova_at(4096), 2048));
    put(16, SglDescriptor::data_block(w.iova_at(6144), 2048));
    put(32, SglDescriptor::last_segment(descs.iova_at(256), 16));
    put(256, SglDescriptor::data_block(w.iova_at(0), 4096));
    let mut sqe = Sqe::write(1, 40, 16);
    sqe.set_sgl(SglDescriptor::segment(descs.iova(), 48));
    assert!(crafted(&mut qp, sqe).is_success());
    assert!(run(&mut qp, |q| q.read(NSID, 40, span(&r, 0, 8192), 7)).is_success());
    let mut back = vec![0u8; 8192];
    r.read_into(&mut back, 0).expect("read back");
    assert_eq!(back[..4096], data[4096..]);
    assert_eq!(back[4096..], data[..4096]);

    let mut short = Sqe::write(1, 40, 17);
    short.set_sgl(SglDescriptor::segment(descs.iova(), 48));
    assert_eq!(
        crafted(&mut qp, short).code(),
        Status::DATA_SGL_LENGTH_INVALID
    );
    let mut bucket = Sqe::read(1, 0, 1);
    bucket.set_sgl(SglDescriptor::new(SGL_BIT_BUCKET, 0, 512));
    assert_eq!(
        crafted(&mut qp, bucket).code(),
        Status::SGL_DESCRIPTOR_TYPE_INVALID
    );
    put(16, SglDescriptor::segment(descs.iova_at(512), 16)); // a segment that is not last
    let mut nested = Sqe::write(1, 40, 16);
    nested.set_sgl(SglDescriptor::segment(descs.iova(), 48));
    assert_eq!(
        crafted(&mut qp, nested).code(),
        Status::INVALID_SGL_SEGMENT_DESCRIPTOR
    );
    for b in [w, r, descs] {
        buffers.free(b).expect("own");
    }
}

#[test]
fn bad_commands_fail_by_name_and_are_logged() {
    let (sim, ctrl) = start(ram(512, 1 << 16));
    let mut qp = queue(&ctrl, 16);
    let mut buffers = pool(4096, 1);
    let buf = buffers.alloc().expect("buffer");
    // the driver refuses a read past the end; the controller answers a crafted one by name
    assert_eq!(
        qp.read(NSID, 1 << 16, span(&buf, 0, 512), 7),
        Err(SubmitError::LbaRange {
            slba: 1 << 16,
            blocks: 1,
            capacity: 1 << 16
        })
    );
    let mut past = Sqe::read(1, 1 << 16, 1);
    past.prp1 = buf.iova();
    let st = crafted(&mut qp, past);
    assert_eq!(st.code(), Status::LBA_OUT_OF_RANGE);
    assert_eq!(st.name(), "LBA Out of Range");
    let mut wrap = Sqe::read(1, u64::MAX, 2);
    wrap.prp1 = buf.iova();
    assert_eq!(
        crafted(&mut qp, wrap).code(),
        Status::LBA_OUT_OF_RANGE,
        "slba + nlb overflows"
    );
    let mut other = Sqe::read(9, 0, 1);
    other.prp1 = buf.iova();
    assert_eq!(crafted(&mut qp, other).code(), Status::INVALID_NAMESPACE);
    assert_eq!(
        crafted(&mut qp, Sqe::flush(0)).code(),
        Status::INVALID_NAMESPACE
    );
    assert!(
        crafted(&mut qp, Sqe::flush(u32::MAX)).is_success(),
        "broadcast flush"
    );
    let mut odd = Sqe::new(0x7d);
    odd.nsid = 1;
    assert_eq!(crafted(&mut qp, odd).code(), Status::INVALID_OPCODE);
    let mut fused = Sqe::flush(1);
    fused.set_fuse(1);
    assert_eq!(crafted(&mut qp, fused).code(), Status::INVALID_FIELD);

    let log = ctrl.error_log(8).expect("error log");
    assert_eq!(log.len(), 6);
    assert_eq!(
        log[0].status().code(),
        Status::INVALID_FIELD,
        "newest first"
    );
    let lba = log.last().expect("oldest");
    assert_eq!(
        (lba.status().code(), lba.lba, lba.sqid, lba.nsid),
        (Status::LBA_OUT_OF_RANGE, 1 << 16, qp.qid(), 1)
    );
    assert_eq!(lba.parameter_error(), Some((40, 0)));
    assert_eq!(sim.error_log().len(), 6);
    assert_eq!(ctrl.smart_log().expect("smart").error_log_entries(), 6);

    // admin
    let e = ctrl.admin(Sqe::new(0xc4)).expect_err("unknown opcode");
    assert_eq!(command_status(e), Status::INVALID_OPCODE);
    let e = ctrl
        .admin_read(Sqe::identify(Cns::Namespace, 33), 4096)
        .map(|(dw0, _)| dw0)
        .expect_err("no namespace 33: NN is 32");
    assert_eq!(command_status(e), Status::INVALID_NAMESPACE);
    let e = ctrl
        .log_page(LogPageId::TelemetryHostInitiated, u32::MAX, 512)
        .expect_err("unsupported log");
    assert_eq!(command_status(e), Status::INVALID_LOG_PAGE);
    let e = ctrl
        .admin(Sqe::set_num_queues(8, 8))
        .expect_err("queues exist");
    assert_eq!(command_status(e), Status::COMMAND_SEQUENCE_ERROR);
    buffers.free(buf).expect("own");
}

/// Create/Delete I/O queue rules, through the driver's admin queue.
#[test]
fn queue_creation_rules() {
    let (sim, ctrl) = start(SimConfig {
        mqes: 63,
        ..ram(512, 1024)
    });
    let space = iova_space();
    let rings: DmaRegion = space
        .map(Memory::allocate(8 << 10, PageSize::Small4K, None).expect("memory"))
        .expect("map");
    let (cq_at, sq_at) = (rings.iova(), rings.iova() + 4096);
    let fails = |sqe: Sqe| command_status(ctrl.admin(sqe).expect_err("refused"));
    assert_eq!(fails(Sqe::create_io_cq(0, 16, cq_at)), Status::INVALID_QID);
    assert_eq!(
        fails(Sqe::create_io_cq(5, 16, cq_at)),
        Status::INVALID_QID,
        "beyond the 4 granted"
    );
    assert_eq!(
        fails(Sqe::create_io_cq(1, 1, cq_at)),
        Status::INVALID_QUEUE_SIZE
    );
    assert_eq!(
        fails(Sqe::create_io_cq(1, 65, cq_at)),
        Status::INVALID_QUEUE_SIZE,
        "MQES 63"
    );
    assert_eq!(
        fails(Sqe::create_io_cq(1, 16, cq_at + 512)),
        Status::PRP_OFFSET_INVALID
    );
    let mut not_contiguous = Sqe::create_io_cq(1, 16, cq_at);
    not_contiguous.cdw11 &= !1;
    assert_eq!(fails(not_contiguous), Status::INVALID_FIELD);
    assert_eq!(
        fails(Sqe::create_io_cq(1, 16, 1 << 40)),
        Status::DATA_TRANSFER_ERROR
    );
    let sq = |qid, cqid| Sqe::create_io_sq(qid, 16, sq_at, cqid, QueuePriority::Urgent);
    assert_eq!(fails(sq(1, 1)), Status::CQ_INVALID, "no CQ yet");
    ctrl.admin(Sqe::create_io_cq(1, 16, cq_at)).expect("CQ 1");
    assert_eq!(
        fails(Sqe::create_io_cq(1, 16, cq_at)),
        Status::INVALID_QID,
        "exists"
    );
    assert_eq!(fails(sq(1, 2)), Status::CQ_INVALID);
    ctrl.admin(sq(1, 1)).expect("SQ 1");
    assert_eq!(fails(sq(1, 1)), Status::INVALID_QID, "exists");
    assert_eq!(sim.io_queues(), (1, 1));
    assert_eq!(fails(Sqe::delete_io_cq(1)), Status::INVALID_QUEUE_DELETION);
    assert_eq!(fails(Sqe::delete_io_sq(2)), Status::INVALID_QID);
    assert_eq!(fails(Sqe::delete_io_sq(0)), Status::INVALID_QID);
    ctrl.admin(Sqe::delete_io_sq(1)).expect("delete SQ");
    ctrl.admin(Sqe::delete_io_cq(1)).expect("delete CQ");
    assert_eq!(sim.io_queues(), (0, 0));
    assert_eq!(fails(Sqe::delete_io_cq(1)), Status::INVALID_QID);
    assert_eq!(
        fails(Sqe::doorbell_buffer_config(rings.iova() + 8, rings.iova())),
        Status::INVALID_FIELD
    );
}

#[test]
fn fault_fail_comes_back_by_name_once() {
    let (sim, ctrl) = start(ram(512, 1024));
    let mut qp = queue(&ctrl, 8);
    let mut buffers = pool(4096, 1);
    let buf = buffers.alloc().expect("buffer");
    sim.inject(Fault::new(
        FaultWhen::opcode(IoOpcode::Read as u8).with_lba(0..8),
        FaultAction::Fail(Status::UNRECOVERED_READ_ERROR),
    ));
    assert!(run(&mut qp, |q| q.read(NSID, 100, span(&buf, 0, 512), 7)).is_success());
    let st = run(&mut qp, |q| q.read(NSID, 4, span(&buf, 0, 1024), 7));
    assert_eq!(st.code(), Status::UNRECOVERED_READ_ERROR);
    assert_eq!(st.name(), "Unrecovered Read Error");
    assert!(run(&mut qp, |q| q.read(NSID, 4, span(&buf, 0, 512), 7)).is_success());
    assert_eq!(sim.faults_armed(), 0);
    let log = ctrl.error_log(1).expect("error log");
    assert_eq!(log[0].status().code(), Status::UNRECOVERED_READ_ERROR);
    // an admin command too
    sim.inject(Fault::new(
        FaultWhen::admin(AdminOpcode::GetLogPage as u8),
        FaultAction::Fail(Status::INTERNAL_ERROR),
    ));
    assert_eq!(
        command_status(ctrl.smart_log().expect_err("fails")),
        Status::INTERNAL_ERROR
    );
    buffers.free(buf).expect("own");
}

#[test]
fn fault_delay_inline_completes_at_a_later_doorbell() {
    let (sim, ctrl) = start(ram(512, 1024));
    let mut qp = queue(&ctrl, 8);
    sim.inject(Fault::new(
        FaultWhen::opcode(IoOpcode::Flush as u8),
        FaultAction::Delay(Duration::from_millis(30)),
    ));
    qp.flush_cache(NSID, 1).expect("submit");
    assert!(drain(&mut qp).is_empty());
    assert_eq!(qp.in_flight(), 1);
    assert_eq!(sim.held(qp.qid()).len(), 1);
    std::thread::sleep(Duration::from_millis(35));
    assert!(
        drain(&mut qp).is_empty(),
        "inline: no doorbell, no completion"
    );
    qp.flush_cache(NSID, 2).expect("submit");
    let mut tokens: Vec<u64> = drain(&mut qp).iter().map(|c| c.token).collect();
    tokens.sort_unstable();
    assert_eq!(tokens, [1, 2]);
}

#[test]
fn fault_delay_threaded_completes_on_time_and_abort_finds_it() {
    let (sim, ctrl) = start(SimConfig {
        mode: SimMode::Threaded {
            latency: Duration::ZERO,
            out_of_order: false,
        },
        ..ram(512, 1024)
    });
    let mut qp = queue(&ctrl, 8);
    sim.inject(Fault::new(
        FaultWhen::opcode(IoOpcode::Flush as u8),
        FaultAction::Delay(Duration::from_millis(20)),
    ));
    let started = Instant::now();
    let st = run(&mut qp, |q| q.flush_cache(NSID, 7));
    assert!(st.is_success());
    assert!(started.elapsed() >= Duration::from_millis(20));

    sim.inject(Fault::new(
        FaultWhen::opcode(IoOpcode::Flush as u8),
        FaultAction::Delay(Duration::from_secs(3600)),
    ));
    qp.flush_cache(NSID, 8).expect("submit");
    qp.flush();
    let held = sim.held(qp.qid());
    while sim.held(qp.qid()).is_empty() {
        std::thread::yield_now();
    }
    let held = if held.is_empty() {
        sim.held(qp.qid())
    } else {
        held
    };
    assert_eq!(held.len(), 1);
    assert!(
        !ctrl.abort(qp.qid(), held[0] ^ 1).expect("abort"),
        "no such command"
    );
    assert!(ctrl.abort(qp.qid(), held[0]).expect("abort"), "aborted");
    let c = wait(&mut qp);
    assert_eq!((c.token, c.status.code()), (8, Status::ABORT_REQUESTED));
}

#[test]
fn fault_drop_leaves_the_command_in_flight_and_abort_cannot_help() {
    let (sim, ctrl) = start(ram(512, 1024));
    let mut qp = queue(&ctrl, 8);
    sim.inject(Fault::new(FaultWhen::any_io(), FaultAction::Drop));
    qp.flush_cache(NSID, 1).expect("submit");
    assert!(drain(&mut qp).is_empty());
    assert_eq!(qp.in_flight(), 1);
    let held = sim.held(qp.qid());
    assert_eq!(held.len(), 1);
    assert!(!ctrl.abort(qp.qid(), held[0]).expect("abort"));
    assert!(
        run(&mut qp, |q| q.flush_cache(NSID, 7)).is_success(),
        "others go on"
    );
    assert_eq!(qp.in_flight(), 1);
}

#[test]
fn fault_fatal_sets_cfs_and_admin_commands_fail_until_a_reset() {
    let (sim, ctrl) = start(ram(512, 1024));
    let mut qp = queue(&ctrl, 8);
    sim.inject(Fault::new(
        FaultWhen::opcode(IoOpcode::Flush as u8),
        FaultAction::Fatal,
    ));
    qp.flush_cache(NSID, 1).expect("submit");
    assert!(drain(&mut qp).is_empty());
    assert!(ctrl.status().cfs());
    let e = ctrl.smart_log().expect_err("fatal");
    assert!(matches!(e, Error::Fatal { .. }), "{e}");
    // the driver's reset: CC.EN 1 -> 0 clears CFS and every queue; the queue pair reconnects
    ctrl.reset().expect("reset");
    let csts = ctrl.status();
    assert!(csts.rdy() && !csts.cfs());
    assert_eq!(sim.io_queues(), (0, 0), "a reset forgets the queues");
    let c = wait(&mut qp);
    assert_eq!((c.token, c.status.code()), (1, Status::ABORTED_BY_HOST));
    assert!(run(&mut qp, |q| q.flush_cache(NSID, 7)).is_success());
    assert_eq!(sim.io_queues(), (1, 1), "re-created");

    let (sim, ctrl) = start(ram(512, 1024));
    sim.set_fatal();
    let e = ctrl.admin(Sqe::get_features(
        FeatureId::Arbitration,
        FeatureSelect::Current,
    ));
    assert!(matches!(e, Err(Error::Fatal { .. })), "{e:?}");
}

fn timed_queue(ctrl: &Controller) -> QueuePair {
    ctrl.create_queue_pair(QueuePairOptions {
        depth: 8,
        timeout: Some(Duration::from_millis(40)),
        ..QueuePairOptions::default()
    })
    .expect("queue pair")
}

/// The driver's timeouts against the sim: an abort that helps, one that does not (then a reset),
/// and a device that is gone.
#[test]
fn driver_timeouts_abort_then_reset() {
    for threaded in [false, true] {
        let mode = if threaded {
            SimMode::Threaded {
                latency: Duration::ZERO,
                out_of_order: false,
            }
        } else {
            SimMode::Inline
        };
        let (sim, ctrl) = start(SimConfig {
            mode,
            ..ram(512, 1024)
        });
        let mut qp = timed_queue(&ctrl);
        // held by the controller: the abort finds it
        sim.inject(Fault::new(
            FaultWhen::opcode(IoOpcode::Flush as u8),
            FaultAction::Delay(Duration::from_secs(3600)),
        ));
        let st = run(&mut qp, |q| q.flush_cache(NSID, 7));
        assert_eq!(st.code(), Status::ABORT_REQUESTED, "threaded {threaded}");
        // lost by the controller: the abort does not help, a reset does
        sim.inject(Fault::new(FaultWhen::any_io(), FaultAction::Drop));
        let st = run(&mut qp, |q| q.flush_cache(NSID, 7));
        assert_eq!(st.code(), Status::ABORTED_BY_HOST, "threaded {threaded}");
        assert!(
            run(&mut qp, |q| q.flush_cache(NSID, 7)).is_success(),
            "works after the reset"
        );
        assert_eq!(ctrl.resets(), 1);
    }
}

#[test]
fn driver_fails_commands_when_the_device_is_gone() {
    let (sim, ctrl) = start(ram(512, 1024));
    let mut qp = timed_queue(&ctrl);
    sim.inject(Fault::new(FaultWhen::any_io(), FaultAction::Remove));
    let st = run(&mut qp, |q| q.flush_cache(NSID, 7));
    assert_eq!(st.code(), Status::HOST_PATHING_ERROR);
    assert_eq!(qp.flush_cache(NSID, 8), Err(SubmitError::Dead));
}

#[test]
fn fault_remove_reads_all_ones_and_nothing_hangs() {
    for how in ["remove()", "fault"] {
        let started = Instant::now();
        let (sim, ctrl) = start(ram(512, 1024));
        let mut qp = queue(&ctrl, 8);
        if how == "fault" {
            sim.inject(Fault::new(FaultWhen::any_io(), FaultAction::Remove));
            qp.flush_cache(NSID, 1).expect("submit");
            assert!(drain(&mut qp).is_empty());
        } else {
            sim.remove();
        }
        assert_eq!(ctrl.status().0, u32::MAX);
        assert_eq!(sim.read32(reg::CAP), u32::MAX);
        let e = ctrl.smart_log().expect_err("gone");
        assert!(matches!(e, Error::Gone { .. }), "{how}: {e}");
        let e = ctrl.admin(Sqe::new(0x0a)).expect_err("gone");
        assert!(!matches!(e, Error::Command { .. }), "{e}");
        let _ = qp.flush_cache(NSID, 2);
        assert!(drain(&mut qp).is_empty());
        drop(qp);
        drop(ctrl);
        // none of it waited for the 10 s admin command timeout (a busy machine may take seconds)
        assert!(started.elapsed() < Duration::from_secs(9), "{how}: bounded");
    }
}

#[test]
fn fault_unknown_cid_and_duplicate_are_garbage_to_the_driver() {
    let (sim, ctrl) = start(ram(512, 1024));
    let mut qp = queue(&ctrl, 8);
    sim.inject(Fault::new(FaultWhen::any_io(), FaultAction::UnknownCid));
    qp.flush_cache(NSID, 1).expect("submit");
    assert!(drain(&mut qp).is_empty());
    assert_eq!((qp.stats().garbage, qp.in_flight()), (1, 1));

    sim.inject(Fault::new(FaultWhen::any_io(), FaultAction::Duplicate));
    qp.flush_cache(NSID, 2).expect("submit");
    let got = drain(&mut qp);
    assert_eq!(got.len(), 1);
    assert_eq!(got[0].token, 2);
    assert_eq!(qp.stats().garbage, 2);
}

/// A host that writes registers, rings and doorbells by hand: for what the driver never does.
struct RawHost {
    sim: Arc<SimController>,
    mem: DmaRegion,
    admin: RawQueue,
    io: RawQueue,
}

/// Queue `qid`: SQ at `sq`, CQ at `cq` (offsets in the host memory), `depth` entries each.
struct RawQueue {
    qid: u16,
    sq: usize,
    cq: usize,
    depth: u16,
    tail: u16,
    head: u16,
    phase: bool,
}

impl RawQueue {
    fn new(qid: u16, sq: usize, cq: usize, depth: u16) -> RawQueue {
        RawQueue {
            qid,
            sq,
            cq,
            depth,
            tail: 0,
            head: 0,
            phase: true,
        }
    }
}

impl RawHost {
    fn new(config: SimConfig) -> RawHost {
        let space = iova_space();
        let mem = space
            .map(Memory::allocate(32 << 10, PageSize::Small4K, None).expect("memory"))
            .expect("map");
        RawHost {
            sim: SimController::new(config, space),
            mem,
            admin: RawQueue::new(0, 0, 4096, 8),
            io: RawQueue::new(1, 8192, 12288, 8),
        }
    }

    fn cc() -> Cc {
        Cc::new().with_iosqes(6).with_iocqes(4).with_en(true)
    }

    /// Programs the admin queue and sets CC; returns CSTS.
    fn enable_with(&mut self, cc: Cc, asq: u64, aqa: Aqa) -> Csts {
        self.admin = RawQueue::new(0, 0, 4096, 8);
        self.io = RawQueue::new(1, 8192, 12288, 8);
        self.mem
            .slice(0, 32 << 10)
            .expect("all")
            .write_slice(&[0; 32 << 10], 0)
            .expect("zero");
        self.sim.write32(reg::AQA, aqa.0);
        self.sim.write64(reg::ASQ, asq);
        self.sim.write64(reg::ACQ, self.mem.iova() + 4096);
        self.sim.write32(reg::CC, cc.0);
        Csts(self.sim.read32(reg::CSTS))
    }

    fn enable(&mut self) -> Csts {
        let asq = self.mem.iova();
        self.enable_with(RawHost::cc(), asq, Aqa::new(8, 8))
    }

    fn submit(&mut self, io: bool, sqe: Sqe) {
        let q = if io { &mut self.io } else { &mut self.admin };
        let at = q.sq + q.tail as usize * 64;
        self.mem
            .slice(at, 64)
            .expect("sqe")
            .write_obj(sqe, 0)
            .expect("write");
        q.tail = (q.tail + 1) % q.depth;
        self.sim.write32(sq_tail_doorbell(q.qid, 0), q.tail as u32);
    }

    fn reap(&mut self, io: bool) -> Option<Cqe> {
        let q = if io { &mut self.io } else { &mut self.admin };
        let cqe: Cqe = self
            .mem
            .slice(q.cq + q.head as usize * 16, 16)
            .expect("cqe")
            .read_obj(0)
            .expect("read");
        if cqe.phase() != q.phase {
            return None;
        }
        q.head = (q.head + 1) % q.depth;
        if q.head == 0 {
            q.phase = !q.phase;
        }
        self.sim.write32(cq_head_doorbell(q.qid, 0), q.head as u32);
        Some(cqe)
    }

    fn admin(&mut self, mut sqe: Sqe, cid: u16) -> Cqe {
        sqe.set_cid(cid);
        self.submit(false, sqe);
        self.reap(false).expect("inline admin completes at once")
    }

    fn create_io(&mut self) -> (Cqe, Cqe) {
        let base = self.mem.iova();
        let cq = self.admin(Sqe::create_io_cq(1, 8, base + 12288), 1);
        let sq = self.admin(
            Sqe::create_io_sq(1, 8, base + 8192, 1, QueuePriority::Urgent),
            2,
        );
        (cq, sq)
    }
}

#[test]
fn enable_checks_the_admin_queue_configuration() {
    let mut host = RawHost::new(SimConfig::default());
    let base = host.mem.iova();
    let bad = [
        ("ASQ misaligned", RawHost::cc(), base + 64, Aqa::new(8, 8)),
        ("ASQ unmapped", RawHost::cc(), 1 << 40, Aqa::new(8, 8)),
        ("one-entry admin SQ", RawHost::cc(), base, Aqa::new(1, 8)),
        ("IOSQES", RawHost::cc().with_iosqes(7), base, Aqa::new(8, 8)),
        ("MPS", RawHost::cc().with_mps(5), base, Aqa::new(8, 8)),
        (
            "CSS",
            RawHost::cc().with_css(Cc::CSS_ADMIN_ONLY),
            base,
            Aqa::new(8, 8),
        ),
    ];
    for (what, cc, asq, aqa) in bad {
        let csts = host.enable_with(cc, asq, aqa);
        assert!(csts.cfs() && !csts.rdy(), "{what}: {csts:?}");
        host.sim.write32(reg::CC, 0);
        assert_eq!(
            Csts(host.sim.read32(reg::CSTS)),
            Csts(0),
            "{what}: reset clears CFS"
        );
    }
    assert_eq!(host.sim.dma_faults(), 1);
    let csts = host.enable();
    assert!(csts.rdy() && !csts.cfs());
    assert_eq!(host.sim.read64(reg::ASQ), base);
    assert_eq!(host.sim.read32(reg::VS), 0x0001_0400);
    // shutdown notification
    host.sim
        .write32(reg::CC, RawHost::cc().with_shn(Cc::SHN_NORMAL).0);
    assert_eq!(
        Csts(host.sim.read32(reg::CSTS)).shst(),
        ShutdownStatus::Complete
    );
}

#[test]
fn a_reset_forgets_every_queue_so_enable_starts_clean() {
    let mut host = RawHost::new(SimConfig::default());
    assert!(host.enable().rdy());
    let (cq, sq) = host.create_io();
    assert!(cq.status().is_success() && sq.status().is_success());
    assert_eq!(host.sim.io_queues(), (1, 1));
    host.sim.write32(reg::CC, 0);
    assert!(!Csts(host.sim.read32(reg::CSTS)).rdy());
    assert_eq!(host.sim.io_queues(), (0, 0));
    assert!(host.enable().rdy());
    let (cq, sq) = host.create_io();
    assert!(cq.status().is_success(), "{}", cq.status());
    assert!(sq.status().is_success(), "{}", sq.status());
    host.submit(true, Sqe::flush(1));
    assert!(host.reap(true).expect("completion").status().is_success());
}

#[test]
fn command_id_conflicts_and_invalid_doorbells() {
    let mut host = RawHost::new(ram(512, 1024));
    host.enable();
    host.create_io();
    host.sim.inject(Fault::new(
        FaultWhen::opcode(IoOpcode::Flush as u8),
        FaultAction::Delay(Duration::from_secs(3600)),
    ));
    let mut first = Sqe::flush(1);
    first.set_cid(5);
    host.submit(true, first);
    assert!(host.reap(true).is_none(), "held");
    let mut second = Sqe::write_zeroes(1, 0, 1);
    second.set_cid(5);
    host.submit(true, second);
    let cqe = host.reap(true).expect("conflict reported");
    assert_eq!((cqe.cid, cqe.status().code()), (5, Status::CID_CONFLICT));
    assert_eq!(host.sim.held(1), [5], "the first keeps its id");

    let before = host.sim.invalid_doorbells();
    host.sim.write32(sq_tail_doorbell(1, 0), 8); // the queue has 8 entries: 0..=7
    host.sim.write32(cq_head_doorbell(1, 0), 5); // one completion was posted
    host.sim.write32(sq_tail_doorbell(3, 0), 1); // no such queue
    host.sim.write32(sq_tail_doorbell(70, 0), 1); // beyond every queue
    assert_eq!(host.sim.invalid_doorbells(), before + 4);
    // the queue still works
    host.sim.clear_faults();
    let mut third = Sqe::flush(1);
    third.set_cid(6);
    host.submit(true, third);
    let cqe = host.reap(true).expect("completion");
    assert_eq!((cqe.cid, cqe.sqhd), (6, 3));
    assert!(cqe.status().is_success());
    // Asynchronous Event Requests are held, up to the limit
    for cid in 10..14 {
        host.submit(false, {
            let mut s = Sqe::async_event_request();
            s.set_cid(cid);
            s
        });
        assert!(host.reap(false).is_none());
    }
    let cqe = host.admin(Sqe::async_event_request(), 14);
    assert_eq!(cqe.status().code(), Status::AER_LIMIT_EXCEEDED);
}

#[test]
fn the_controller_shuts_down_and_disables_when_the_driver_drops_it() {
    let (sim, ctrl) = start(SimConfig::default());
    let qp = queue(&ctrl, 8);
    assert_eq!(sim.io_queues(), (1, 1));
    drop(qp);
    assert_eq!(
        sim.io_queues(),
        (0, 0),
        "queues deleted with the queue pair"
    );
    drop(ctrl);
    let csts = Csts(sim.read32(reg::CSTS));
    assert!(!csts.rdy());
    assert_eq!(csts.shst(), ShutdownStatus::Complete);
    assert!(!Cc(sim.read32(reg::CC)).en());
}

mod model {
    //! Random sequences of reads, writes, write-zeroes, deallocates and failures against a model
    //! of the disk: what is read back always equals the model.

    use proptest::prelude::*;

    use super::*;

    #[derive(Debug, Clone)]
    enum Op {
        Write {
            lba: u64,
            blocks: u32,
            seed: u64,
        },
        Read {
            lba: u64,
            blocks: u32,
        },
        Zeroes {
            lba: u64,
            blocks: u32,
        },
        Deallocate {
            lba: u64,
            blocks: u32,
        },
        /// The next write fails (and so changes nothing).
        FailNextWrite,
    }

    const BLOCKS: u64 = 256;

    fn op() -> impl Strategy<Value = Op> {
        let range = (0..BLOCKS).prop_flat_map(|lba| (Just(lba), 1..=(BLOCKS - lba).min(16) as u32));
        prop_oneof![
            4 => (range.clone(), any::<u64>())
                .prop_map(|((lba, blocks), seed)| Op::Write { lba, blocks, seed }),
            4 => range.clone().prop_map(|(lba, blocks)| Op::Read { lba, blocks }),
            1 => range.clone().prop_map(|(lba, blocks)| Op::Zeroes { lba, blocks }),
            1 => range.prop_map(|(lba, blocks)| Op::Deallocate { lba, blocks }),
            1 => Just(Op::FailNextWrite),
        ]
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(32))]

        #[test]
        fn reads_always_equal_the_model(
            block_size in prop_oneof![Just(512usize), Just(4096)],
            threaded in any::<bool>(),
            ops in proptest::collection::vec(op(), 1..40),
        ) {
            let mode = if threaded {
                SimMode::Threaded { latency: Duration::ZERO, out_of_order: true }
            } else {
                SimMode::Inline
            };
            let (sim, ctrl) = start(SimConfig { mode, ..ram(block_size as u32, BLOCKS) });
            let mut qp = queue(&ctrl, 8);
            let mut buffers = pool(64 << 10, 1);
            let buf = buffers.alloc().expect("buffer");
            let mut model = vec![0u8; BLOCKS as usize * block_size];
            let mut fail_next = false;
            for op in ops {
                match op {
                    Op::Write { lba, blocks, seed } => {
                        let len = blocks as usize * block_size;
                        let data = pattern(seed, len);
                        buf.write_from(&data, 0).expect("fill");
                        let st = run(&mut qp, |q| q.write(NSID, lba, span(&buf, 0, len), 7));
                        if std::mem::take(&mut fail_next) {
                            prop_assert_eq!(st.code(), Status::WRITE_FAULT);
                        } else {
                            prop_assert!(st.is_success(), "{}", st);
                            let at = lba as usize * block_size;
                            model[at..at + len].copy_from_slice(&data);
                        }
                    }
                    Op::Read { lba, blocks } => {
                        let len = blocks as usize * block_size;
                        buf.fill(0x5a);
                        let st = run(&mut qp, |q| q.read(NSID, lba, span(&buf, 0, len), 7));
                        prop_assert!(st.is_success(), "{}", st);
                        let mut back = vec![0u8; len];
                        buf.read_into(&mut back, 0).expect("read back");
                        let at = lba as usize * block_size;
                        prop_assert!(back == model[at..at + len], "lba {} blocks {}", lba, blocks);
                    }
                    Op::Zeroes { lba, blocks } | Op::Deallocate { lba, blocks } => {
                        let st = if matches!(op, Op::Zeroes { .. }) {
                            run(&mut qp, |q| q.write_zeroes(NSID, lba, blocks, 7))
                        } else {
                            run(&mut qp, |q| q.deallocate(NSID, lba, blocks, 7))
                        };
                        prop_assert!(st.is_success(), "{}", st);
                        let at = lba as usize * block_size;
                        model[at..at + blocks as usize * block_size].fill(0);
                    }
                    Op::FailNextWrite => {
                        if !fail_next {
                            sim.inject(Fault::new(
                                FaultWhen::opcode(IoOpcode::Write as u8),
                                FaultAction::Fail(Status::WRITE_FAULT),
                            ));
                            fail_next = true;
                        }
                    }
                }
            }
            // everything, at the end
            for chunk in 0..(BLOCKS as usize * block_size).div_ceil(64 << 10) {
                let at = chunk * (64 << 10);
                let len = (model.len() - at).min(64 << 10);
                let lba = (at / block_size) as u64;
                prop_assert!(run(&mut qp, |q| q.read(NSID, lba, span(&buf, 0, len), 7)).is_success());
                let mut back = vec![0u8; len];
                buf.read_into(&mut back, 0).expect("read back");
                prop_assert!(back == model[at..at + len]);
            }
            prop_assert_eq!(sim.dma_faults(), 0);
            buffers.free(buf).expect("own");
        }
    }
}

#[test]
fn a_fatal_status_under_io_resets_the_controller_and_io_resumes() {
    let (sim, ctrl) = start(ram(512, 1024));
    let mut qp = timed_queue(&ctrl);
    let mut other = timed_queue(&ctrl);
    sim.inject(Fault::new(FaultWhen::any_io(), FaultAction::Fatal));
    let st = run(&mut qp, |q| q.flush_cache(NSID, 7));
    assert_eq!(st.code(), Status::ABORTED_BY_HOST, "{st}");
    assert_eq!(
        ctrl.resets(),
        1,
        "CSTS.CFS was seen and the controller reset"
    );
    assert!(!ctrl.status().cfs());
    for q in [&mut qp, &mut other] {
        assert!(
            run(q, |q| q.flush_cache(NSID, 7)).is_success(),
            "both queue pairs work again"
        );
    }
}

#[test]
fn a_command_submitted_after_a_long_idle_gap_is_timed_from_then() {
    let (_sim, ctrl) = start(SimConfig {
        mode: SimMode::Threaded {
            latency: Duration::from_millis(25),
            out_of_order: false,
        },
        ..ram(512, 1024)
    });
    let mut qp = timed_queue(&ctrl); // 40 ms timeout
    assert!(run(&mut qp, |q| q.flush_cache(NSID, 7)).is_success());
    // no poll for many timeouts, then a command that takes 25 ms: not a timeout
    std::thread::sleep(Duration::from_millis(200));
    assert!(run(&mut qp, |q| q.flush_cache(NSID, 7)).is_success());
    assert_eq!(ctrl.resets(), 0, "no reset");
}

/// Polls `qp` once and keeps the slowest poll seen: a poll that waited for an admin command
/// (which only this thread can release) would take the whole admin timeout.
fn timed_poll(qp: &mut QueuePair, slowest: &mut Duration, on: impl FnMut(Completion)) -> usize {
    let started = Instant::now();
    let n = qp.poll(on);
    *slowest = (*slowest).max(started.elapsed());
    n
}

/// No poll waits longer than this (the admin timeout of these tests is 10 s).
const QUICK: Duration = Duration::from_secs(1);

/// 24 drives polled by one thread, as on a reactor. Drive 0 is reset while I/O runs on all of
/// them, and each admin command of its recovery (the reset's, and its queue pair's Create I/O CQ
/// and SQ) is held by the sim until the other 23 drives have completed more I/O. Only this
/// thread releases them, so a poll that waited for one would never return.
#[test]
fn a_reset_under_load_never_blocks_the_polling_thread() {
    const DRIVES: usize = 24;
    let opts = ControllerOptions {
        io_queues: 2,
        admin_timeout: Duration::from_secs(10),
        ..options()
    };
    let drives: Vec<_> = (0..DRIVES)
        .map(|_| start_with(ram(512, 1024), opts.clone()))
        .collect();
    let mut qps: Vec<QueuePair> = drives.iter().map(|(_, c)| queue(c, 16)).collect();
    let mut buffers = pool(4096, DRIVES + 2);
    let bufs: Vec<DmaBuffer> = (0..DRIVES)
        .map(|_| buffers.alloc().expect("buffer"))
        .collect();
    let (sim0, ctrl0) = (&drives[0].0, &drives[0].1);

    // Data written before the reset, read back after it.
    let (w, r) = (
        buffers.alloc().expect("buffer"),
        buffers.alloc().expect("buffer"),
    );
    let before = pattern(1, 4096);
    w.write_from(&before, 0).expect("fill");
    assert!(run(&mut qps[0], |q| q.write(NSID, 0, span(&w, 0, 4096), 7)).is_success());
    // Two writes the controller holds when the reset comes.
    sim0.inject(Fault::new(FaultWhen::any_io(), FaultAction::Hold).times(2));
    for (lba, token) in [(16, 100), (24, 101)] {
        qps[0]
            .write(NSID, lba, span(&w, 0, 4096), token)
            .expect("submit");
    }
    assert!(drain(&mut qps[0]).is_empty());
    assert_eq!(sim0.held(qps[0].qid()).len(), 2);

    // From now on drive 0's admin commands complete only when this thread releases them.
    sim0.inject(Fault::new(FaultWhen::any_admin(), FaultAction::Hold).times(0));
    ctrl0.start_reset();

    let mut slowest = Duration::ZERO;
    let mut done = [0u64; DRIVES];
    let mut drive0: Vec<Completion> = Vec::new();
    let mut released: Vec<u8> = Vec::new();
    // The others' completions when drive 0's held admin command was first seen.
    let mut held_at: Option<[u64; DRIVES]> = None;
    let started = Instant::now();
    while !released.contains(&(AdminOpcode::CreateIoSq as u8)) {
        assert!(
            started.elapsed() < Duration::from_secs(60),
            "recovery stuck; released {released:02x?}"
        );
        // one turn: every queue pair polled once, the others kept busy with writes
        for (d, qp) in qps.iter_mut().enumerate() {
            if d == 0 {
                timed_poll(qp, &mut slowest, |c| drive0.push(c));
                continue;
            }
            if qp.in_flight() == 0 {
                let lba = (done[d] % 64) * 8;
                qp.write(NSID, lba, span(&bufs[d], 0, 4096), d as u64)
                    .expect("submit");
            }
            timed_poll(qp, &mut slowest, |c| {
                assert!(c.status.is_success(), "drive {d}: {}", c.status);
                done[d] += 1;
            });
        }
        let held = !sim0.held(0).is_empty();
        match held_at {
            None if held => held_at = Some(done),
            // every other drive went on while drive 0's admin command was outstanding
            Some(at) if (1..DRIVES).all(|d| done[d] >= at[d] + 3) => {
                released.extend(sim0.release(0));
                held_at = None;
            }
            _ => {}
        }
    }
    assert_eq!(
        released,
        [
            AdminOpcode::SetFeatures as u8,
            AdminOpcode::DoorbellBufferConfig as u8,
            // events enabled and requested again
            AdminOpcode::SetFeatures as u8,
            AdminOpcode::AsyncEventRequest as u8,
            AdminOpcode::CreateIoCq as u8,
            AdminOpcode::CreateIoSq as u8
        ],
        "the reset's commands, then the queue pair's, each held with I/O going on elsewhere"
    );
    assert!(slowest < QUICK, "a poll took {slowest:?}");
    sim0.clear_faults();

    // What was in flight on drive 0 came back aborted by the host; new I/O works and reads
    // back, as does what was written before the reset.
    let after = pattern(2, 4096);
    w.write_from(&after, 0).expect("fill");
    assert!(run(&mut qps[0], |q| q.write(NSID, 32, span(&w, 0, 4096), 7)).is_success());
    let mut aborted: Vec<(u64, Status)> = drive0.iter().map(|c| (c.token, c.status)).collect();
    aborted.sort_unstable_by_key(|a| a.0);
    assert_eq!(
        aborted,
        [
            (100, Status::ABORTED_BY_HOST),
            (101, Status::ABORTED_BY_HOST)
        ]
    );
    for (lba, data) in [(32, &after), (0, &before)] {
        assert!(run(&mut qps[0], |q| q.read(NSID, lba, span(&r, 0, 4096), 7)).is_success());
        let mut back = vec![0u8; 4096];
        r.read_into(&mut back, 0).expect("read back");
        assert!(back == *data, "LBA {lba}");
    }
    assert_eq!(ctrl0.resets(), 1);
    for (d, (sim, ctrl)) in drives.iter().enumerate() {
        assert_eq!(sim.invalid_doorbells(), 0, "drive {d}");
        if d > 0 {
            assert_eq!(ctrl.resets(), 0, "drive {d}");
            assert!(done[d] >= 12, "drive {d}: {} writes", done[d]);
        }
    }
    for b in bufs.into_iter().chain([w, r]) {
        buffers.free(b).expect("own");
    }
}

/// A queue pair's turns: a write kept in flight (token 2), one poll; the flush (token 1) kept.
#[derive(Default)]
struct Turns {
    slowest: Duration,
    writes: u64,
    flush: Option<Completion>,
}

impl Turns {
    fn turn(&mut self, qp: &mut QueuePair, io: IoBuffer) {
        if qp.in_flight() < 2 {
            qp.write(NSID, 8, io, 2).expect("submit");
        }
        let (writes, flush) = (&mut self.writes, &mut self.flush);
        timed_poll(qp, &mut self.slowest, |c| match c.token {
            1 => *flush = Some(c),
            _ => {
                assert!(c.status.is_success(), "{}", c.status);
                *writes += 1;
            }
        });
    }
}

/// A command times out while another thread holds the admin queue (its own command held by the
/// sim), then while its Abort is held: polls return at once throughout, I/O goes on, no reset
/// comes of the wait, and once released the abort ends the command.
#[test]
fn an_abort_of_a_timed_out_command_does_not_block_poll() {
    let (sim, ctrl) = start_with(
        ram(512, 1024),
        ControllerOptions {
            admin_timeout: Duration::from_secs(10),
            ..options()
        },
    );
    let mut qp = timed_queue(&ctrl); // 40 ms timeout
    let mut buffers = pool(4096, 1);
    let buf = buffers.alloc().expect("buffer");
    let io = span(&buf, 0, 4096);
    let mut t = Turns::default();
    let three_timeouts = Duration::from_millis(120);

    // Another thread's admin command holds the admin queue (and its lock).
    sim.inject(Fault::new(
        FaultWhen::admin(AdminOpcode::GetFeatures as u8),
        FaultAction::Hold,
    ));
    let busy = {
        let ctrl = ctrl.clone();
        std::thread::spawn(move || {
            ctrl.admin(Sqe::get_features(
                FeatureId::Arbitration,
                FeatureSelect::Current,
            ))
        })
    };
    let deadline = Instant::now() + Duration::from_secs(10);
    while sim.held(0).is_empty() {
        assert!(Instant::now() < deadline, "the admin command never came");
        std::thread::yield_now();
    }
    sim.inject(Fault::new(
        FaultWhen::opcode(IoOpcode::Flush as u8),
        FaultAction::Hold,
    ));
    sim.inject(Fault::new(
        FaultWhen::admin(AdminOpcode::Abort as u8),
        FaultAction::Hold,
    ));
    qp.flush_cache(NSID, 1).expect("submit");
    // The flush times out; its abort cannot be submitted while the lock is held elsewhere.
    let started = Instant::now();
    while started.elapsed() < three_timeouts {
        t.turn(&mut qp, io);
    }
    assert_eq!(sim.held(0).len(), 1, "only the other thread's command");
    assert_eq!(sim.release(0), [AdminOpcode::GetFeatures as u8]);
    busy.join().expect("thread").expect("get features");

    // Now the abort goes out (and is held); polls go on, and no reset comes of its wait.
    let deadline = Instant::now() + Duration::from_secs(10);
    while sim.held(0).is_empty() {
        assert!(Instant::now() < deadline, "no abort was sent");
        // (`held` reads every command id: not on every turn, or the polls would be far apart)
        for _ in 0..16 {
            t.turn(&mut qp, io);
        }
    }
    let started = Instant::now();
    let at = t.writes;
    while started.elapsed() < three_timeouts || t.writes < at + 10 {
        t.turn(&mut qp, io);
    }
    assert!(t.flush.is_none() && ctrl.resets() == 0);
    assert_eq!(sim.release(0), [AdminOpcode::Abort as u8]);
    let deadline = Instant::now() + Duration::from_secs(10);
    while t.flush.is_none() {
        assert!(Instant::now() < deadline, "the flush never came back");
        t.turn(&mut qp, io);
    }
    assert_eq!(t.flush.map(|c| c.status), Some(Status::ABORT_REQUESTED));
    assert!(t.slowest < QUICK, "a poll took {:?}", t.slowest);
    assert_eq!(ctrl.resets(), 0);
    buffers.free(buf).expect("own");
}

/// A dropped queue pair's deletion is submitted, not waited for; its queue id is not taken
/// again until the controller has deleted both queues.
#[test]
fn a_dropped_queue_pair_is_deleted_without_waiting() {
    let (sim, ctrl) = start(ram(512, 1024));
    let qp = queue(&ctrl, 8);
    assert_eq!(qp.qid(), 1);
    sim.inject(Fault::new(
        FaultWhen::admin(AdminOpcode::DeleteIoSq as u8),
        FaultAction::Hold,
    ));
    drop(qp);
    assert_eq!(sim.held(0).len(), 1, "Delete I/O SQ submitted and held");
    assert_eq!(sim.io_queues(), (1, 1));
    let second = queue(&ctrl, 8);
    assert_eq!(second.qid(), 2, "queue 1 is still being deleted");
    assert_eq!(sim.release(0), [AdminOpcode::DeleteIoSq as u8]);
    // the next admin poller moves the deletion on: Delete I/O CQ, then queue 1 is free
    let third = queue(&ctrl, 8);
    assert_eq!(third.qid(), 1);
    assert_eq!(sim.io_queues(), (2, 2));
    drop((second, third));
    assert_eq!(sim.io_queues(), (0, 0));
}

#[test]
fn a_read_or_write_the_driver_refuses_gets_the_error_of_what_is_wrong() {
    let (_sim, ctrl) = start(ram(512, 1 << 18));
    let max = ctrl.max_transfer();
    let mut qp = queue(&ctrl, 16);
    let mut buffers = pool(4096, 1);
    let buf = buffers.alloc().expect("buffer");
    let at = |len: u64| IoBuffer {
        iova: buf.iova(),
        len: len as u32,
    };
    type Submit = fn(&mut QueuePair, u32, u64, IoBuffer, u64) -> Result<(), SubmitError>;
    for (what, submit) in [
        ("read", QueuePair::read as Submit),
        ("write", QueuePair::write as Submit),
    ] {
        let mut refused = |nsid: u32, slba: u64, buf: IoBuffer| {
            submit(&mut qp, nsid, slba, buf, 7).expect_err(what)
        };
        for nsid in [0, 2, u32::MAX] {
            assert_eq!(
                refused(nsid, 0, at(512)),
                SubmitError::InvalidNamespace { nsid }
            );
        }
        for bytes in [0, 100, 4000] {
            assert_eq!(
                refused(NSID, 0, at(bytes)),
                SubmitError::NotBlockMultiple {
                    bytes,
                    block_size: 512
                }
            );
        }
        for slba in [(1 << 18) - 1, u64::MAX] {
            assert_eq!(
                refused(NSID, slba, at(1024)),
                SubmitError::LbaRange {
                    slba,
                    blocks: 2,
                    capacity: 1 << 18
                }
            );
        }
        // past the end and too large: the range is named first
        assert!(matches!(
            refused(NSID, 1 << 18, at(max + 512)),
            SubmitError::LbaRange { .. }
        ));
        assert_eq!(
            refused(NSID, 0, at(max + 512)),
            SubmitError::ExceedsMdts {
                bytes: max + 512,
                max
            }
        );
        let odd = IoBuffer {
            iova: buf.iova() + 2,
            len: 512,
        };
        assert_eq!(
            refused(NSID, 0, odd),
            SubmitError::Misaligned { iova: odd.iova }
        );
        assert_eq!(qp.in_flight(), 0, "nothing refused went out");
    }
    // the last block is inside
    let st = run(&mut qp, |q| q.read(NSID, (1 << 18) - 1, at(512), 7));
    assert!(st.is_success(), "{st}");
    buffers.free(buf).expect("own");
}

fn with_metadata(block_size: u32, metadata: MetadataFormat) -> SimConfig {
    let mut config = ram(block_size, 1 << 10);
    config.namespaces[0].metadata = metadata;
    config
}

const T1_16_LAST: PiFormat = PiFormat {
    pi_type: PiType::Type1,
    guard: Guard::Crc16,
    first: false,
};

fn md_io(data: IoBuffer, metadata: Option<IoBuffer>, pi: PiFields) -> MetadataIo {
    MetadataIo { data, metadata, pi }
}

/// Reads `blocks` blocks at `slba` of a namespace with metadata into `data` (and `metadata`),
/// with `pi`; the status.
fn read_md(
    qp: &mut QueuePair,
    slba: u64,
    blocks: u32,
    data: IoBuffer,
    metadata: Option<IoBuffer>,
    pi: PiFields,
) -> Status {
    run(qp, |q| {
        q.read_with_metadata(NSID, slba, blocks, md_io(data, metadata, pi), 7)
    })
}

/// Every check, the application tag 0x0a0b, the reference tag of LBA `slba`.
fn checked(slba: u64) -> PiFields {
    PiFields {
        action: false,
        checks: PiChecks::ALL,
        ref_tag: slba,
        app_tag: 0x0a0b,
        app_mask: 0xffff,
    }
}

#[test]
fn a_namespace_formatted_with_metadata_takes_no_plain_read_or_write() {
    // 512 + 8: data without its metadata would be misplaced (extended LBAs) or fail the
    // drive's checks, so the driver refuses it by name
    let metadata = MetadataFormat {
        size: 8,
        extended: true,
        protection: None,
    };
    let (_sim, ctrl) = start(with_metadata(512, metadata));
    assert_eq!(ctrl.namespace(NSID).expect("namespace").metadata, metadata);
    let mut qp = queue(&ctrl, 4);
    let mut buffers = pool(4096, 1);
    let buf = buffers.alloc().expect("buffer");
    let io = span(&buf, 0, 512);
    let refused = SubmitError::Metadata {
        nsid: NSID,
        bytes: 8,
    };
    assert_eq!(qp.read(NSID, 0, io, 1), Err(refused.clone()));
    assert_eq!(qp.write(NSID, 0, io, 2), Err(refused.clone()));
    assert!(refused
        .to_string()
        .contains("8 bytes of metadata per block"));
    assert_eq!(qp.in_flight(), 0, "nothing refused went out");
    // commands that move no data take it
    assert!(run(&mut qp, |q| q.flush_cache(NSID, 7)).is_success());
    assert!(run(&mut qp, |q| q.write_zeroes(NSID, 0, 8, 7)).is_success());
    assert!(run(&mut qp, |q| q.deallocate(NSID, 8, 8, 7)).is_success());
    buffers.free(buf).expect("own");
}

#[test]
fn extended_lba_type_1_round_trips_with_software_pi_and_the_drive_checks_every_field() {
    let format = MetadataFormat {
        size: 8,
        extended: true,
        protection: Some(T1_16_LAST),
    };
    let (sim, ctrl) = start(with_metadata(512, format));
    let ns = ctrl.namespace(NSID).expect("namespace");
    assert_eq!(
        ns.metadata, format,
        "DPS, FLBAS and the format as the sim reports them"
    );
    let mut qp = queue(&ctrl, 4);
    let mut buffers = pool(16 << 10, 2);
    let (buf, back) = (
        buffers.alloc().expect("buffer"),
        buffers.alloc().expect("buffer"),
    );
    // 4 blocks at LBA 10, each 512 bytes of data then its tuple, made in software
    let (slba, blocks) = (10u64, 4usize);
    let data = pattern(3, blocks * 512);
    let mut wire = Vec::new();
    for (i, block) in data.chunks(512).enumerate() {
        let mut tuple = [0u8; 8];
        T1_16_LAST.generate(block, &mut tuple, slba + i as u64, 0x0a0b);
        wire.extend_from_slice(block);
        wire.extend_from_slice(&tuple);
    }
    buf.write_from(&wire, 0).expect("fill");
    let fields = checked(slba);
    let io = span(&buf, 0, wire.len());
    let st = run(&mut qp, |q| {
        q.write_with_metadata(NSID, slba, 4, md_io(io, None, fields), 7)
    });
    assert!(st.is_success(), "{st}");
    // back with every check: data and tuples as written
    let st = read_md(&mut qp, slba, 4, span(&back, 0, wire.len()), None, fields);
    assert!(st.is_success(), "{st}");
    let mut got = vec![0u8; wire.len()];
    back.read_into(&mut got, 0).expect("read back");
    assert_eq!(got, wire);
    // PRACT: the drive checks and strips the tuples; the data alone comes back
    let strip = PiFields {
        action: true,
        ..fields
    };
    let st = read_md(&mut qp, slba, 4, span(&back, 0, data.len()), None, strip);
    assert!(st.is_success(), "{st}");
    let mut got = vec![0u8; data.len()];
    back.read_into(&mut got, 0).expect("read back");
    assert_eq!(got, data);

    // each field the drive checks, by its status
    let read_status = |qp: &mut QueuePair, fields: PiFields| {
        read_md(qp, slba, 4, span(&back, 0, wire.len()), None, fields).code()
    };
    let other_app = PiFields {
        app_tag: 0x0a0c,
        ..fields
    };
    assert_eq!(
        read_status(&mut qp, other_app),
        Status::APPLICATION_TAG_CHECK_ERROR
    );
    let wrong_ref = PiFields {
        ref_tag: slba + 1,
        ..fields
    };
    assert_eq!(
        read_status(&mut qp, wrong_ref),
        Status::INVALID_PROTECTION_INFORMATION,
        "type 1 wants the command's reference tag to be its LBA"
    );
    // a block corrupted on the medium behind the host's back: a guard error at its LBA
    assert!(sim.overwrite_data(NSID, (slba + 2) * 512 + 100, &[0xee]));
    assert_eq!(read_status(&mut qp, fields), Status::GUARD_CHECK_ERROR);
    let log = ctrl.error_log(1).expect("error log");
    assert_eq!(log[0].lba, slba + 2, "the error names the corrupt block");
    let unchecked = PiFields {
        checks: PiChecks::NONE,
        ..fields
    };
    assert_eq!(
        read_status(&mut qp, unchecked),
        Status::SUCCESS,
        "no check asked: none made"
    );
    // a write whose tuple does not match its data is refused, nothing stored
    buf.write_from(&[0x77], 600).expect("spoil block 1's data");
    let st = run(&mut qp, |q| {
        q.write_with_metadata(NSID, slba, 4, md_io(io, None, fields), 7)
    });
    assert_eq!(st.code(), Status::GUARD_CHECK_ERROR);
    // never-written blocks carry all-ones tuples, which escape every check
    let st = read_md(
        &mut qp,
        500,
        4,
        span(&back, 0, wire.len()),
        None,
        checked(500),
    );
    assert!(st.is_success(), "{st}");
    for b in [buf, back] {
        buffers.free(b).expect("own");
    }
}

#[test]
fn separate_metadata_type_3_with_a_64_bit_guard_is_inserted_by_the_drive_and_checked_on_read() {
    let pi = PiFormat {
        pi_type: PiType::Type3,
        guard: Guard::Crc64,
        first: false,
    };
    let format = MetadataFormat {
        size: 64,
        extended: false,
        protection: Some(pi),
    };
    let (_sim, ctrl) = start(with_metadata(4096, format));
    assert_eq!(
        ctrl.namespace(NSID).expect("namespace").metadata,
        format,
        "the 64-bit guard from the NVM command set's Identify Namespace"
    );
    let mut qp = queue(&ctrl, 4);
    let mut buffers = pool(16 << 10, 3);
    let (buf, md, back) = (
        buffers.alloc().expect("buffer"),
        buffers.alloc().expect("buffer"),
        buffers.alloc().expect("buffer"),
    );
    let data = pattern(9, 2 * 4096);
    buf.write_from(&data, 0).expect("fill");
    // PRACT on a write: the drive fills in the tuples of the metadata the host gives (64
    // bytes a block: more than the tuple, so the metadata still travels)
    let user: Vec<u8> = (0..128).map(|i| i as u8).collect();
    md.write_from(&user, 0).expect("metadata");
    let insert = PiFields {
        action: true,
        checks: PiChecks::NONE,
        ref_tag: 0x1_0000_0001, // 48 bits: CDW3 carries the high ones
        app_tag: 0x00aa,
        app_mask: 0xffff,
    };
    let st = run(&mut qp, |q| {
        q.write_with_metadata(
            NSID,
            7,
            2,
            md_io(span(&buf, 0, data.len()), Some(span(&md, 0, 128)), insert),
            7,
        )
    });
    assert!(st.is_success(), "{st}");
    // type 3 takes no reference tag check: asked for one, the drive refuses the command
    let all = PiFields {
        action: false,
        checks: PiChecks::ALL,
        ..insert
    };
    let st = read_md(
        &mut qp,
        7,
        2,
        span(&back, 0, data.len()),
        Some(span(&md, 4096, 128)),
        all,
    );
    assert_eq!(st.code(), Status::INVALID_PROTECTION_INFORMATION);
    // read it back with every check type 3 allows, the metadata apart
    let check = PiFields {
        checks: pi.allowed(PiChecks::ALL),
        ..all
    };
    let st = read_md(
        &mut qp,
        7,
        2,
        span(&back, 0, data.len()),
        Some(span(&md, 4096, 128)),
        check,
    );
    assert!(st.is_success(), "{st}");
    let mut got = vec![0u8; data.len()];
    back.read_into(&mut got, 0).expect("data");
    assert_eq!(got, data);
    let mut metadata = vec![0u8; 128];
    md.read_into(&mut metadata, 4096).expect("metadata");
    for (i, block_md) in metadata.chunks(64).enumerate() {
        assert_eq!(
            block_md[..48],
            user[i * 64..i * 64 + 48],
            "the host's metadata kept"
        );
        let tuple = pi.read_tuple(&block_md[48..]).expect("tuple");
        let guard = pi.guard_of(&data[i * 4096..][..4096], &block_md[..48]);
        assert_eq!(
            (tuple.guard, tuple.app_tag, tuple.ref_tag),
            (guard, 0x00aa, 0x1_0000_0001),
            "type 3 keeps the command's reference tag in every block"
        );
    }
    let other_app = PiFields {
        app_tag: 0x00ab,
        ..check
    };
    let st = read_md(
        &mut qp,
        7,
        2,
        span(&back, 0, data.len()),
        Some(span(&md, 4096, 128)),
        other_app,
    );
    assert_eq!(st.code(), Status::APPLICATION_TAG_CHECK_ERROR);
    for b in [buf, md, back] {
        buffers.free(b).expect("own");
    }
}

#[test]
fn metadata_commands_that_do_not_fit_the_format_are_refused_by_name() {
    let (_sim, ctrl) = start(with_metadata(
        512,
        MetadataFormat {
            size: 16,
            extended: false,
            protection: None,
        },
    ));
    let mut qp = queue(&ctrl, 4);
    let mut buffers = pool(4096, 1);
    let buf = buffers.alloc().expect("buffer");
    let none = PiFields::default();
    let (data, md) = (span(&buf, 0, 1024), span(&buf, 2048, 32));
    let mut submit =
        |data, md, fields| qp.write_with_metadata(NSID, 0, 2, md_io(data, md, fields), 1);
    assert_eq!(
        submit(data, None, none),
        Err(SubmitError::MetadataLength {
            bytes: 0,
            expected: 32
        })
    );
    assert_eq!(
        submit(span(&buf, 0, 1040), Some(md), none),
        Err(SubmitError::DataLength {
            bytes: 1040,
            expected: 1024
        }),
        "apart: the data buffer holds data only"
    );
    assert_eq!(
        submit(data, Some(md), checked(0)),
        Err(SubmitError::NoProtection { nsid: NSID })
    );
    assert_eq!(submit(data, Some(md), none), Ok(()));
    let (_sim, plain) = start(ram(512, 64));
    let mut qp = queue(&plain, 4);
    assert_eq!(
        qp.read_with_metadata(NSID, 0, 1, md_io(span(&buf, 0, 512), None, none), 1),
        Err(SubmitError::NoMetadata { nsid: NSID })
    );
    buffers.free(buf).expect("own");
}

#[test]
fn a_sanitize_erases_every_block_refuses_io_while_it_runs_and_reports_its_progress() {
    use crate::spec::log::{SanitizeState, SanitizeStatus, SelfTestStatus, SELF_TEST_LOG_BYTES};
    let mut config = ram(512, 1 << 10);
    config.maintenance_time = Duration::from_secs(3600); // ends when the test says so
    let (sim, ctrl) = start(config);
    let mut qp = queue(&ctrl, 4);
    let mut buffers = pool(4096, 1);
    let buf = buffers.alloc().expect("buffer");
    buf.write_from(&pattern(5, 4096), 0).expect("fill");
    assert!(run(&mut qp, |q| q.write(NSID, 8, span(&buf, 0, 4096), 7)).is_success());
    let sanitize_log = || {
        let log = ctrl
            .log_page(LogPageId::SanitizeStatus, u32::MAX, 512)
            .expect("sanitize log");
        SanitizeStatus::from_slice(&log).expect("status")
    };
    assert_eq!(sanitize_log().state, SanitizeState::Never);
    let mut sqe = Sqe::new(AdminOpcode::Sanitize as u8);
    sqe.cdw10 = 3; // Overwrite: not offered (SANICAP)
    assert_eq!(
        command_status(ctrl.admin(sqe).expect_err("refused")),
        Status::INVALID_FIELD
    );
    sqe.cdw10 = 2; // Block Erase
    ctrl.admin(sqe).expect("sanitize starts");
    let status = sanitize_log();
    assert_eq!(status.state, SanitizeState::InProgress);
    assert!(status.progress < 0xffff);
    assert_eq!(
        run(&mut qp, |q| q.read(NSID, 8, span(&buf, 0, 4096), 7)).code(),
        Status::SANITIZE_IN_PROGRESS
    );
    assert_eq!(
        command_status(ctrl.admin(sqe).expect_err("one at a time")),
        Status::SANITIZE_IN_PROGRESS
    );
    // its time is up: I/O flows again and the block reads as erased
    sim.set_maintenance_time(Duration::ZERO);
    buf.fill(0x5a);
    assert!(run(&mut qp, |q| q.read(NSID, 8, span(&buf, 0, 4096), 7)).is_success());
    let mut back = vec![0xffu8; 4096];
    buf.read_into(&mut back, 0).expect("read back");
    assert!(back.iter().all(|&b| b == 0), "erased");
    assert_eq!(
        sanitize_log(),
        SanitizeStatus {
            progress: 0xffff,
            state: SanitizeState::Completed
        }
    );
    // a self-test: started, aborted, its result kept
    sim.set_maintenance_time(Duration::from_secs(3600));
    let mut test = Sqe::new(AdminOpcode::DeviceSelfTest as u8);
    test.cdw10 = 2;
    ctrl.admin(test).expect("extended self-test");
    assert_eq!(
        command_status(ctrl.admin(test).expect_err("one at a time")),
        Status::SELF_TEST_IN_PROGRESS
    );
    let self_test = || {
        let log = ctrl
            .log_page(LogPageId::DeviceSelfTest, u32::MAX, SELF_TEST_LOG_BYTES)
            .expect("self-test log");
        SelfTestStatus::from_slice(&log).expect("status")
    };
    assert_eq!((self_test().running, self_test().newest), (2, None));
    test.cdw10 = 0xf;
    ctrl.admin(test).expect("abort");
    assert_eq!((self_test().running, self_test().newest), (0, Some((2, 1))));
    buffers.free(buf).expect("own");
}

#[test]
fn firmware_downloaded_and_committed_runs_from_the_next_reset() {
    let (sim, ctrl) = start(ram(512, 64));
    let slots = |ctrl: &Controller| ctrl.firmware_log().expect("firmware slot log");
    let log = slots(&ctrl);
    assert_eq!((log.active_slot(), log.next_reset_slot()), (1, None));
    // an image in two parts (its revision: the first 8 bytes), committed to slot 2 for the
    // next reset
    let mut image = b"SIMFW002".to_vec();
    image.resize(8192, 0xa5);
    for (i, part) in image.chunks(4096).enumerate() {
        let mut sqe = Sqe::new(AdminOpcode::FirmwareDownload as u8);
        sqe.cdw10 = (part.len() / 4 - 1) as u32;
        sqe.cdw11 = (i * 4096 / 4) as u32;
        ctrl.admin_write(sqe, part).expect("downloaded");
    }
    let mut commit = Sqe::new(AdminOpcode::FirmwareCommit as u8);
    commit.cdw10 = 1 | 1 << 3; // slot 1: read-only
    assert_eq!(
        command_status(ctrl.admin(commit).expect_err("read-only slot")),
        Status::INVALID_FIRMWARE_SLOT
    );
    commit.cdw10 = 2 | 1 << 3; // slot 2, activate at the next reset
    ctrl.admin(commit).expect("committed");
    let log = slots(&ctrl);
    assert_eq!((log.active_slot(), log.next_reset_slot()), (1, Some(2)));
    assert_eq!(&log.frs[1], b"SIMFW002");
    assert_eq!(
        ctrl.identify().firmware(),
        sim_firmware(),
        "still the old one"
    );
    ctrl.reset().expect("reset");
    let log = slots(&ctrl);
    assert_eq!((log.active_slot(), log.next_reset_slot()), (2, None));
    let (_, id) = ctrl
        .admin_read(Sqe::identify(Cns::Controller, 0), 4096)
        .expect("identify");
    assert_eq!(&id[64..72], b"SIMFW002", "Identify's FR: the new firmware");
    // a commit with nothing downloaded has no image to put in the slot
    commit.cdw10 = 2;
    assert_eq!(
        command_status(ctrl.admin(commit).expect_err("no image")),
        Status::INVALID_FIRMWARE_IMAGE
    );
    drop(sim);
}

fn sim_firmware() -> String {
    SimConfig::default().firmware
}

#[test]
fn the_driver_keeps_an_event_request_outstanding_and_reports_each_event() {
    use crate::controller::AsyncEvent;
    let (sim, ctrl) = start(ram(512, 64));
    assert_eq!(
        sim.async_events_held(),
        1,
        "one request outstanding after bring-up"
    );
    assert!(ctrl.events().is_empty());
    // a temperature warning: reported, its SMART bit set, the request sent again
    sim.raise_event(AsyncEventSpec {
        kind: 1,
        info: 1,
        log_page: 2,
        critical_warning: 0b10,
    });
    let temperature = AsyncEvent {
        kind: 1,
        info: 1,
        log_page: 2,
    };
    assert_eq!(ctrl.events(), [temperature]);
    assert_eq!(
        temperature.to_string(),
        "SMART / health: temperature threshold (type 1, information 0x01, log page 0x02)"
    );
    assert_eq!(ctrl.smart_log().expect("smart").critical_warning, 0b10);
    assert_eq!(sim.async_events_held(), 1, "armed again");
    // two namespace changes in a row: both come, in order
    let changed = AsyncEventSpec {
        kind: 2,
        info: 0,
        log_page: 4,
        critical_warning: 0,
    };
    sim.raise_event(changed);
    sim.raise_event(changed);
    let mut got = Vec::new();
    let deadline = Instant::now() + Duration::from_secs(60);
    while got.len() < 2 {
        assert!(Instant::now() < deadline, "events: {got:?}");
        got.extend(ctrl.events());
    }
    assert_eq!(
        got[0].to_string(),
        "notice: namespace attribute changed (type 2, information 0x00, log page 0x04)"
    );
    assert_eq!(got, [got[0], got[0]]);
    // a reset voids the request and sends a new one
    ctrl.reset().expect("reset");
    assert_eq!(sim.async_events_held(), 1);
}

/// Namespace Management's data: a namespace of `blocks` blocks of LBA format `format` (an
/// index into the common Identify Namespace's formats).
fn namespace_request(blocks: u64, format: u8) -> Vec<u8> {
    let mut id = IdentifyNamespace::zeroed();
    (id.nsze, id.ncap, id.flbas) = (blocks, blocks, format);
    id.as_bytes().to_vec()
}

fn controller_list(ids: &[u16]) -> Vec<u8> {
    ControllerList::from_ids(ids.iter().copied())
        .as_bytes()
        .to_vec()
}

fn id_list(ctrl: &Controller, cns: Cns) -> Vec<u32> {
    let (_, page) = ctrl
        .admin_read(Sqe::identify(cns, 0), 4096)
        .expect("identify list");
    NamespaceList::from_slice(&page)
        .expect("4 KiB")
        .iter()
        .collect()
}

#[test]
fn namespaces_created_attached_detached_and_deleted_as_the_commands_say() {
    let mut config = ram(512, 2048);
    config.spare_capacity = 1 << 20;
    let (_sim, ctrl) = start(config);
    assert!(ctrl.identify().oacs().contains(Oacs::NS_MANAGEMENT));
    let unallocated = |ctrl: &Controller| {
        let (_, page) = ctrl
            .admin_read(Sqe::identify(Cns::Controller, 0), 4096)
            .expect("identify");
        IdentifyController::from_slice(&page)
            .expect("4 KiB")
            .unvmcap
    };
    assert_eq!(u128::from_le_bytes(unallocated(&ctrl)), 1 << 20);

    // more than the spare, a format the drive lacks, thin provisioning: refused by name
    let refused = |data: &[u8]| {
        command_status(
            ctrl.admin_write(Sqe::namespace_create(), data)
                .expect_err("refused"),
        )
    };
    assert_eq!(
        refused(&namespace_request(4096, 3)),
        Status::NAMESPACE_INSUFFICIENT_CAPACITY
    );
    assert_eq!(refused(&namespace_request(8, 15)), Status::INVALID_FORMAT);
    let mut thin = namespace_request(64, 0);
    thin[8] = 1; // NCAP 1 of NSZE 64
    assert_eq!(refused(&thin), Status::THIN_PROVISIONING_NOT_SUPPORTED);

    // 256 blocks of 4 KiB (format 3): the whole spare, at the lowest free ID, detached
    let nsid = ctrl
        .admin_write(Sqe::namespace_create(), &namespace_request(256, 3))
        .expect("created");
    assert_eq!(nsid, 2);
    assert_eq!(u128::from_le_bytes(unallocated(&ctrl)), 0);
    assert_eq!(id_list(&ctrl, Cns::AllocatedNamespaceList), [1, 2]);
    assert_eq!(id_list(&ctrl, Cns::ActiveNamespaceList), [1]);
    let (_, page) = ctrl
        .admin_read(Sqe::identify(Cns::AllocatedNamespace, 2), 4096)
        .expect("allocated");
    let id = IdentifyNamespace::from_slice(&page).expect("4 KiB");
    assert_eq!((id.nsze, id.lba_size_bytes()), (256, Some(4096)));
    let (_, page) = ctrl
        .admin_read(Sqe::identify(Cns::Namespace, 2), 4096)
        .expect("inactive");
    assert!(
        page.iter().all(|&b| b == 0),
        "an inactive namespace reads as zeroes"
    );

    // I/O to it is refused until it is attached, and again once it is detached
    let mut qp = queue(&ctrl, 8);
    let mut buffers = pool(4096, 1);
    let buf = buffers.alloc().expect("buffer");
    let data = pattern(2, 4096);
    buf.write_from(&data, 0).expect("fill");
    let write = |qp: &mut QueuePair| {
        run(qp, |qp| {
            qp.submit_data(Sqe::write(2, 7, 1), span(&buf, 0, 4096), 7)
        })
    };
    assert_eq!(write(&mut qp).code(), Status::INVALID_NAMESPACE);
    let attach = |attach: bool, ids: &[u16]| {
        ctrl.admin_write(Sqe::namespace_attachment(2, attach), &controller_list(ids))
    };
    let cntlid = ctrl.identify().cntlid;
    assert_eq!(
        command_status(attach(true, &[cntlid + 1]).expect_err("no such controller")),
        Status::CONTROLLER_LIST_INVALID
    );
    attach(true, &[cntlid]).expect("attached");
    assert_eq!(
        command_status(attach(true, &[cntlid]).expect_err("twice")),
        Status::NAMESPACE_ALREADY_ATTACHED
    );
    assert_eq!(id_list(&ctrl, Cns::ActiveNamespaceList), [1, 2]);
    let (_, page) = ctrl
        .admin_read(Sqe::identify(Cns::NamespaceControllerList, 2), 4096)
        .expect("controllers");
    assert_eq!(
        ControllerList::from_slice(&page)
            .expect("4 KiB")
            .iter()
            .collect::<Vec<_>>(),
        [cntlid]
    );
    assert_eq!(write(&mut qp), Status::SUCCESS);
    buf.fill(0);
    let read = run(&mut qp, |qp| {
        qp.submit_data(Sqe::read(2, 7, 1), span(&buf, 0, 4096), 7)
    });
    assert_eq!(read, Status::SUCCESS);
    let mut back = vec![0u8; 4096];
    buf.read_into(&mut back, 0).expect("read back");
    assert_eq!(
        back, data,
        "what was written reads back from the new namespace"
    );

    // the controller reported the change, and the Changed Namespace List names it
    let events = ctrl.events();
    assert!(
        events.iter().any(|e| e
            .to_string()
            .starts_with("notice: namespace attribute changed")),
        "{events:?}"
    );
    attach(false, &[cntlid]).expect("detached");
    assert_eq!(
        command_status(attach(false, &[cntlid]).expect_err("twice")),
        Status::NAMESPACE_NOT_ATTACHED
    );
    let log = ctrl
        .log_page(LogPageId::ChangedNamespaceList, u32::MAX, 4096)
        .expect("changed list");
    assert_eq!(
        NamespaceList::from_slice(&log)
            .expect("4 KiB")
            .iter()
            .collect::<Vec<_>>(),
        [2]
    );
    assert_eq!(write(&mut qp).code(), Status::INVALID_NAMESPACE);

    // deleted, then created again: the same ID, and nothing of the old data
    ctrl.admin(Sqe::namespace_delete(2)).expect("deleted");
    assert_eq!(
        command_status(ctrl.admin(Sqe::namespace_delete(2)).expect_err("gone")),
        Status::INVALID_NAMESPACE
    );
    assert_eq!(id_list(&ctrl, Cns::AllocatedNamespaceList), [1]);
    assert_eq!(
        ctrl.admin_write(Sqe::namespace_create(), &namespace_request(256, 3))
            .expect("created"),
        2
    );
    attach(true, &[cntlid]).expect("attached");
    assert_eq!(
        run(&mut qp, |qp| qp.submit_data(
            Sqe::read(2, 7, 1),
            span(&buf, 0, 4096),
            7
        )),
        Status::SUCCESS
    );
    buf.read_into(&mut back, 0).expect("read back");
    assert!(
        back.iter().all(|&b| b == 0),
        "a new namespace holds nothing of the one deleted"
    );
}

#[test]
fn a_rescan_finds_the_namespaces_attached_detached_and_changed_since_the_last() {
    let mut config = ram(512, 2048);
    config.spare_capacity = 1 << 20;
    let (_sim, ctrl) = start(config);
    let cntlid = ctrl.identify().cntlid;
    let attach = |attach: bool| {
        ctrl.admin_write(
            Sqe::namespace_attachment(2, attach),
            &controller_list(&[cntlid]),
        )
        .expect("namespace attachment");
    };
    let create = |format: u8, blocks: u64| {
        let data = namespace_request(blocks, format);
        let nsid = ctrl.admin_write(Sqe::namespace_create(), &data);
        assert_eq!(nsid.expect("created"), 2);
    };
    let changes = |added: &[u32], removed: &[u32], changed: &[u32]| NamespaceChanges {
        added: added.to_vec(),
        removed: removed.to_vec(),
        changed: changed.to_vec(),
    };
    assert_eq!(
        ctrl.rescan_namespaces().expect("rescan"),
        changes(&[], &[], &[])
    );
    let mut older = queue(&ctrl, 8);

    // 256 blocks of 4 KiB attached: found, and a queue pair made now writes to it
    create(3, 256);
    attach(true);
    assert_eq!(ctrl.namespaces().len(), 1, "known only once rescanned");
    assert_eq!(
        ctrl.rescan_namespaces().expect("rescan"),
        changes(&[2], &[], &[])
    );
    let ns = ctrl.namespace(2).expect("namespace 2");
    assert_eq!((ns.block_size, ns.blocks), (4096, 256));
    let mut qp = queue(&ctrl, 8);
    assert_eq!(
        run(&mut qp, |qp| qp.write_zeroes(2, 7, 1, 7)),
        Status::SUCCESS
    );
    let refused = older.write_zeroes(2, 7, 1, 7);
    assert!(
        refused.is_err(),
        "a queue pair made before knows only namespace 1"
    );

    // detached, deleted and made again in another format before the next rescan: changed
    attach(false);
    ctrl.admin(Sqe::namespace_delete(2)).expect("deleted");
    create(0, 2048);
    attach(true);
    assert_eq!(
        ctrl.rescan_namespaces().expect("rescan"),
        changes(&[], &[], &[2])
    );
    assert_eq!(ctrl.namespace(2).expect("namespace 2").block_size, 512);

    // detached: gone
    attach(false);
    assert_eq!(
        ctrl.rescan_namespaces().expect("rescan"),
        changes(&[], &[2], &[])
    );
    assert!(matches!(
        ctrl.namespace(2),
        Err(Error::NoNamespace { nsid: 2, .. })
    ));
}

fn interrupt_queue(ctrl: &Controller, depth: u16) -> Result<QueuePair, Error> {
    ctrl.create_queue_pair(QueuePairOptions {
        depth,
        interrupts: true,
        ..QueuePairOptions::default()
    })
}

/// Sleeps in poll(2) until the queue pair's interrupt is raised, at most `limit`: whether it was.
fn sleep_until_interrupt(qp: &QueuePair, limit: Duration) -> bool {
    use nix::poll::{PollFd, PollFlags, PollTimeout};
    let fd = qp.interrupt().expect("a queue pair with interrupts");
    let mut fds = [PollFd::new(fd, PollFlags::POLLIN)];
    let timeout = PollTimeout::try_from(limit).expect("a timeout poll(2) takes");
    nix::poll::poll(&mut fds, timeout).expect("poll") == 1
}

/// Takes `count` completions as an owner with nothing else to do does: poll, and when nothing
/// came, sleep until the interrupt, clear it, poll again. Each sleep must end by the interrupt
/// (10 s at most in all). Returns the completions and how many sleeps it took.
fn complete_by_interrupts(qp: &mut QueuePair, count: usize) -> (Vec<Completion>, usize) {
    let deadline = Instant::now() + Duration::from_secs(10);
    let (mut done, mut sleeps) = (Vec::new(), 0);
    loop {
        qp.poll(|c| done.push(c));
        if done.len() >= count {
            return (done, sleeps);
        }
        let left = deadline.saturating_duration_since(Instant::now());
        assert!(
            sleep_until_interrupt(qp, left),
            "no interrupt within 10 s: {} of {count} completions came",
            done.len()
        );
        sleeps += 1;
        qp.clear_interrupt();
    }
}

/// A flush that the drive holds until another thread lets it go, which it does only once this
/// thread found nothing to poll, cleared the interrupt and went to sleep: the completion can
/// reach it only through the CQ's interrupt.
fn flush_completed_by_interrupt(
    sim: &Arc<SimController>,
    qp: &mut QueuePair,
    token: u64,
) -> Completion {
    sim.inject(Fault::new(
        FaultWhen::opcode(IoOpcode::Flush as u8),
        FaultAction::Hold,
    ));
    qp.flush_cache(NSID, token).expect("submitted");
    let (qid, deadline) = (qp.qid(), Instant::now() + Duration::from_secs(10));
    // (polls ring the doorbell, and re-create the queues after a reset)
    while sim.held(qid).is_empty() {
        assert_eq!(qp.poll(|c| panic!("{c:?} completed while held")), 0);
        assert!(Instant::now() < deadline, "the drive never fetched it");
        std::thread::yield_now();
    }
    qp.clear_interrupt(); // whatever was posted before is taken
    let (go, went) = std::sync::mpsc::channel::<()>();
    let releaser = {
        let sim = sim.clone();
        std::thread::spawn(move || {
            went.recv().expect("the owner goes to sleep");
            assert_eq!(sim.release(qid), [IoOpcode::Flush as u8]);
        })
    };
    go.send(()).expect("the releaser waits");
    assert!(
        sleep_until_interrupt(qp, Duration::from_secs(10)),
        "the completion raised the interrupt"
    );
    assert!(qp.clear_interrupt(), "raised");
    let mut done = Vec::new();
    qp.poll(|c| done.push(c));
    releaser.join().expect("released");
    assert_eq!(done.len(), 1, "{done:?}");
    done[0]
}

#[test]
fn a_queue_pair_with_interrupts_sleeps_until_the_drive_thread_completes() {
    let (sim, ctrl) = start(SimConfig {
        mode: SimMode::Threaded {
            latency: Duration::from_millis(2),
            out_of_order: true,
        },
        ..ram(512, 1024)
    });
    let mut qp = interrupt_queue(&ctrl, 16).expect("a queue pair with interrupts");
    assert_eq!(qp.interrupt_vector(), Some(qp.qid()), "a vector of its own");
    let polled = queue(&ctrl, 8);
    assert!(polled.interrupt().is_none() && polled.interrupt_vector().is_none());
    assert!(!polled.clear_interrupt());

    let mut buffers = pool(4096, 8);
    let bufs: Vec<DmaBuffer> = (0..8).map(|_| buffers.alloc().expect("buffer")).collect();
    let mut sleeps = 0;
    for round in 0..10u64 {
        for (i, b) in bufs.iter().enumerate() {
            b.write_from(&pattern(round * 8 + i as u64, 4096), 0)
                .expect("fill");
            qp.write(NSID, i as u64 * 8, span(b, 0, 4096), i as u64)
                .expect("submitted");
        }
        let (done, slept) = complete_by_interrupts(&mut qp, 8);
        sleeps += slept;
        let mut tokens: Vec<u64> = done.iter().map(|c| c.token).collect();
        tokens.sort_unstable();
        assert_eq!(tokens, (0..8).collect::<Vec<_>>(), "round {round}");
        assert!(done.iter().all(|c| c.status.is_success()), "{done:?}");
    }
    assert!(sleeps > 0, "2 ms per command: the owner slept");

    // the completion comes after the owner went to sleep
    let c = flush_completed_by_interrupt(&sim, &mut qp, 99);
    assert_eq!((c.token, c.status.is_success()), (99, true), "{c:?}");
    assert_eq!((qp.stats().garbage, sim.invalid_doorbells()), (0, 0));
    for b in bufs {
        buffers.free(b).expect("own");
    }
}

#[test]
fn queues_beyond_the_vectors_share_them_and_vectors_the_drive_lacks_are_refused() {
    // 3 vectors: 0 for the admin queue, 1 and 2 for the I/O queues of the 4 granted
    let (sim, ctrl) = start(SimConfig {
        msix_vectors: 3,
        ..ram(512, 1024)
    });
    let space = iova_space();
    let rings: DmaRegion = space
        .map(Memory::allocate(4096, PageSize::Small4K, None).expect("memory"))
        .expect("map");
    let cq = |qid, iv| Sqe::create_io_cq_with(qid, 16, rings.iova(), Some(iv));
    let refused = |sqe: Sqe| {
        let e = ctrl.admin(sqe).expect_err("refused");
        assert!(e.to_string().contains("Invalid Interrupt Vector"), "{e}");
        assert_eq!(sim.error_log()[0].parameter_error_location, 46, "IV");
    };
    // MSI-X is off: vector 0 (the pin interrupt) only
    refused(cq(4, 1));
    ctrl.admin(cq(4, 0)).expect("IV 0 without MSI-X");
    ctrl.admin(Sqe::delete_io_cq(4)).expect("deleted");

    let one = interrupt_queue(&ctrl, 8).expect("vector 1");
    let two = interrupt_queue(&ctrl, 8).expect("vector 2");
    let mut three = interrupt_queue(&ctrl, 8).expect("queue 3 shares a vector");
    let vectors = [&one, &two, &three].map(QueuePair::interrupt_vector);
    assert_eq!(vectors, [Some(1), Some(2), Some(1)], "round robin");
    // a completion on queue 3 raises vector 1: queue 1's owner wakes too (each owner watches
    // it, none reads it empty)
    three.flush_cache(NSID, 7).expect("submitted");
    three.flush();
    assert!(sleep_until_interrupt(&one, Duration::from_secs(10)));
    assert!(sleep_until_interrupt(&three, Duration::from_secs(10)));
    let done = drain(&mut three);
    assert_eq!((done.len(), done[0].token), (1, 7));
    // beyond the table of 3 vectors, with MSI-X on
    refused(cq(4, 3));
    refused(cq(4, u16::MAX));
    ctrl.admin(cq(4, 2))
        .expect("a vector in the table (the spec lets CQs share one)");
    ctrl.admin(Sqe::delete_io_cq(4)).expect("deleted");
    drop((one, two, three));

    // a controller with no interrupts to give
    let plain = SimController::new(ram(512, 1024), space.clone());
    let ctrl = Controller::init("sim:p".into(), plain, None, space, None, None, options())
        .expect("bring-up");
    let e = interrupt_queue(&ctrl, 8).expect_err("no MSI-X");
    assert!(e.to_string().contains("no MSI-X"), "{e}");
    assert_eq!(queue(&ctrl, 8).qid(), 1, "the id went back");
}

#[test]
fn interrupts_survive_a_controller_reset() {
    let (sim, ctrl) = start(SimConfig {
        mode: SimMode::Threaded {
            latency: Duration::from_millis(1),
            out_of_order: false,
        },
        ..ram(512, 1024)
    });
    let mut qp = interrupt_queue(&ctrl, 8).expect("a queue pair with interrupts");
    let c = flush_completed_by_interrupt(&sim, &mut qp, 1);
    assert!(c.status.is_success(), "{c:?}");
    // held through the reset: the reset raises the interrupt, the owner finds it aborted
    sim.inject(Fault::new(
        FaultWhen::opcode(IoOpcode::Flush as u8),
        FaultAction::Hold,
    ));
    qp.flush_cache(NSID, 2).expect("submitted");
    qp.flush();
    qp.clear_interrupt();
    ctrl.reset().expect("reset");
    assert!(
        sleep_until_interrupt(&qp, Duration::from_secs(10)),
        "the reset woke the owner"
    );
    qp.clear_interrupt();
    let (done, _) = complete_by_interrupts(&mut qp, 1);
    assert_eq!(done[0].token, 2);
    assert_eq!(done[0].status.code(), Status::ABORTED_BY_HOST);
    sim.clear_faults();
    // re-created with its vector: the next completion wakes the owner again
    let c = flush_completed_by_interrupt(&sim, &mut qp, 3);
    assert!(c.status.is_success(), "{c:?}");
    assert_eq!(qp.interrupt_vector(), Some(qp.qid()));
    assert_eq!((ctrl.resets(), sim.io_queues()), (1, (1, 1)));
}

#[test]
fn a_queue_pair_opened_at_once_creates_its_queues_by_its_polls_and_then_moves_data() {
    let (sim, ctrl) = start(ram(512, 1 << 16));
    // the controller holds Create I/O CQ: a queue pair that waited for it would wait here
    sim.inject(Fault::new(
        FaultWhen::admin(AdminOpcode::CreateIoCq as u8),
        FaultAction::Hold,
    ));
    let mut qp = ctrl
        .open_queue_pair(QueuePairOptions {
            depth: 16,
            ..QueuePairOptions::default()
        })
        .expect("opened without waiting");
    let mut buffers = pool(4096, 2);
    let (w, r) = (
        buffers.alloc().expect("buffer"),
        buffers.alloc().expect("buffer"),
    );
    let data = pattern(9, 4096);
    w.write_from(&data, 0).expect("fill");
    // taken now, sent once the queues exist
    qp.write(NSID, 24, span(&w, 0, 4096), 1).expect("submitted");
    let deadline = Instant::now() + Duration::from_secs(10);
    while sim.held(0).is_empty() {
        assert!(Instant::now() < deadline, "Create I/O CQ never came");
        assert_eq!(
            drain(&mut qp),
            [],
            "nothing completes before the queues exist"
        );
    }
    assert_eq!(sim.io_queues(), (0, 0), "no I/O queue exists yet");
    assert_eq!(sim.release(0), [AdminOpcode::CreateIoCq as u8]);
    let c = wait(&mut qp);
    assert_eq!((c.token, c.status), (1, Status::SUCCESS));
    assert_eq!(sim.io_queues(), (1, 1));
    r.fill(0);
    qp.read(NSID, 24, span(&r, 0, 4096), 2).expect("submitted");
    assert_eq!(wait(&mut qp).status, Status::SUCCESS);
    let mut back = vec![0u8; 4096];
    r.read_into(&mut back, 0).expect("read back");
    assert!(back == data, "the block read back differs");
    assert_eq!(ctrl.resets(), 0);
}

#[test]
fn doorbells_translate_without_a_snapshot_of_the_iova_space_per_command() {
    // a space of its own: the shared one changes as other tests map and unmap
    let space = IovaSpace::new(Arc::new(NoIommu));
    let sim = SimController::new(ram(512, 1024), space.clone());
    let irq = Some(sim.clone() as Arc<dyn Interrupts>);
    let ctrl = Controller::init(
        "sim:s".into(),
        sim,
        irq,
        space.clone(),
        None,
        None,
        options(),
    )
    .expect("bring-up");
    let mut qp = queue(&ctrl, 16);
    let mut buffers = BufferPool::new(&space, 4096, 1, PageSize::Small4K, None).expect("pool");
    let buf = buffers.alloc().expect("buffer");
    // the queue pair's first doorbells take its view
    assert!(run(&mut qp, |q| q.write(NSID, 3, span(&buf, 0, 4096), 7)).is_success());
    let before = space.snapshots();
    for lba in 0..1000 {
        let st = run(&mut qp, |q| q.read(NSID, lba % 1024, span(&buf, 0, 512), 7));
        assert!(st.is_success(), "{st}");
    }
    assert_eq!(
        space.snapshots(),
        before,
        "a lock and a shared count per command"
    );
    buffers.free(buf).expect("own");
}
