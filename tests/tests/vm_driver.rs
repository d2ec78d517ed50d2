//! The VFIO driver on the test bed's emulated drives (file backend, 512 B and 4 KiB blocks).

use std::collections::HashMap;
use std::path::Path;
use std::sync::Arc;

use usnvme_driver::pci::PciAddress;
use usnvme_driver::spec::Status;
use usnvme_driver::vfio::{Vfio, VfioError};
use usnvme_driver::{
    Completion, Controller, ControllerOptions, Error, IoBuffer, QueuePair, QueuePairOptions,
    SubmitError,
};
use usnvme_hugepages::{BufferPool, DmaBuffer, PageSize};
use usnvme_tests::{drive_index, expect_on_host, pattern, vfio_controllers, VmBed};

const NSID: u32 = 1;

/// Shadow doorbells on (off by default): these suites keep that path tested on QEMU's NVMe.
fn open(vfio: &Arc<Vfio>, addr: PciAddress) -> Controller {
    let options = ControllerOptions {
        shadow_doorbells: true,
        ..ControllerOptions::default()
    };
    Controller::open(vfio, addr, options).unwrap_or_else(|e| panic!("{addr}: {e}"))
}

fn open_all() -> (Arc<Vfio>, Vec<Controller>) {
    let vfio = Vfio::new("/sys").expect("VFIO container");
    let ctrls = vfio_controllers()
        .into_iter()
        .map(|a| open(&vfio, a))
        .collect();
    (vfio, ctrls)
}

fn pool(ctrl: &Controller, size: usize, count: usize) -> BufferPool {
    BufferPool::new(ctrl.iova_space(), size, count, PageSize::Huge2M, None).expect("buffer pool")
}

/// Submits one command and polls until it completes; returns its status.
fn wait_one(
    qp: &mut QueuePair,
    submit: impl FnOnce(&mut QueuePair) -> Result<(), SubmitError>,
) -> Status {
    submit(qp).expect("submitted");
    let mut done: Option<Completion> = None;
    let started = std::time::Instant::now();
    while done.is_none() {
        qp.poll(|c| done = Some(c));
        assert!(
            started.elapsed().as_secs() < 30,
            "no completion within 30 s"
        );
    }
    let c = done.expect("completion");
    assert_eq!(c.token, 7, "the token comes back");
    c.status
}

fn span(buf: &DmaBuffer, offset: usize, len: usize) -> IoBuffer {
    IoBuffer {
        iova: buf.iova_at(offset),
        len: len as u32,
    }
}

#[test]
#[ignore = "VM: run by `cargo xtask vm-test`"]
fn every_drive_is_identified_and_its_health_log_read() {
    let bed = VmBed::from_env();
    let (_vfio, ctrls) = open_all();
    assert_eq!(ctrls.len(), bed.drives - bed.kernel_drives);
    for ctrl in &ctrls {
        let id = ctrl.identify();
        let k = drive_index(&id.serial())
            .unwrap_or_else(|| panic!("{}: serial {:?}", ctrl.name(), id.serial()));
        assert_eq!(id.model(), "QEMU NVMe Ctrl", "{}", ctrl.name());
        assert_eq!(ctrl.namespaces().len(), 1);
        let ns = &ctrl.namespaces()[0];
        assert_eq!(ns.block_size, bed.block_size_of(k), "drive {k}");
        assert_eq!(ns.capacity_bytes(), 1 << 30);
        assert!(ctrl.io_queues_granted() >= 2);
        let smart = ctrl.smart_log().expect("SMART log");
        let celsius = smart.temperature_celsius();
        assert!((-20..=100).contains(&celsius), "temperature {celsius}");
        assert!(smart.critical_warnings().0 == 0);
    }
}

#[test]
#[ignore = "VM: run by `cargo xtask vm-test`"]
fn data_round_trips_through_every_prp_shape_and_lands_in_the_image() {
    let (_vfio, ctrls) = open_all();
    for ctrl in &ctrls {
        let k = drive_index(&ctrl.identify().serial()).expect("test bed serial");
        let bs = ctrl.namespace(NSID).expect("namespace 1").block_size as usize;
        let mdts = ctrl.max_transfer() as usize;
        let mut qp = ctrl
            .create_queue_pair(QueuePairOptions::default())
            .expect("queue pair");
        let mut buffers = pool(ctrl, 2 << 20, 2);
        let (wbuf, rbuf) = (
            buffers.alloc().expect("buffer"),
            buffers.alloc().expect("buffer"),
        );
        let mut lba = 8u64;
        // sizes x buffer offsets: PRP1 only, PRP1 + PRP2, PRP lists, and buffers starting mid-page
        for size in [512, 4096, 8192, 128 << 10, mdts] {
            if size < bs {
                continue;
            }
            for offset in [0usize, 512, 3584] {
                let seed = (k as u64) << 32 | lba;
                let data = pattern(seed, size);
                wbuf.write_from(&data, offset).expect("fill");
                rbuf.fill(0xee);
                let st = wait_one(&mut qp, |q| {
                    q.write(NSID, lba, span(&wbuf, offset, size), 7)
                });
                assert!(
                    st.is_success(),
                    "{}: write {size} at +{offset}: {st}",
                    ctrl.name()
                );
                let st = wait_one(&mut qp, |q| {
                    q.read(NSID, lba, span(&rbuf, offset + 4, size), 7)
                });
                assert!(
                    st.is_success(),
                    "{}: read {size} at +{offset}: {st}",
                    ctrl.name()
                );
                let mut back = vec![0u8; size];
                rbuf.read_into(&mut back, offset + 4).expect("read back");
                assert!(
                    back == data,
                    "{}: {size} bytes at buffer offset {offset}: data differs",
                    ctrl.name()
                );
                expect_on_host(k, lba * bs as u64, &data);
                lba += (size / bs) as u64 + 1;
            }
        }
        let st = wait_one(&mut qp, |q| q.flush_cache(NSID, 7));
        assert!(st.is_success(), "flush: {st}");
        buffers.free(wbuf).expect("own buffer");
        buffers.free(rbuf).expect("own buffer");
    }
}

#[test]
#[ignore = "VM: run by `cargo xtask vm-test`"]
fn write_zeroes_reads_back_zeroes_and_deallocate_is_accepted() {
    let (_vfio, ctrls) = open_all();
    let ctrl = &ctrls[0];
    let bs = ctrl.namespace(NSID).expect("namespace").block_size as usize;
    let mut qp = ctrl
        .create_queue_pair(QueuePairOptions::default())
        .expect("queue pair");
    let mut buffers = pool(ctrl, 64 << 10, 1);
    let buf = buffers.alloc().expect("buffer");
    let lba = 100_000u64;
    let len = 16 * bs;
    buf.write_from(&pattern(99, len), 0).expect("fill");
    assert!(wait_one(&mut qp, |q| q.write(NSID, lba, span(&buf, 0, len), 7)).is_success());
    assert!(wait_one(&mut qp, |q| q.write_zeroes(NSID, lba + 4, 8, 7)).is_success());
    buf.fill(0xaa);
    assert!(wait_one(&mut qp, |q| q.read(NSID, lba, span(&buf, 0, len), 7)).is_success());
    let mut back = vec![0u8; len];
    buf.read_into(&mut back, 0).expect("read back");
    let expect = pattern(99, len);
    assert_eq!(
        back[..4 * bs],
        expect[..4 * bs],
        "blocks before the zeroed range are kept"
    );
    assert!(
        back[4 * bs..12 * bs].iter().all(|b| *b == 0),
        "zeroed blocks read back as zeroes"
    );
    assert_eq!(
        back[12 * bs..],
        expect[12 * bs..],
        "blocks after the zeroed range are kept"
    );
    let st = wait_one(&mut qp, |q| q.deallocate(NSID, lba, 16, 7));
    assert!(st.is_success(), "deallocate: {st}");
    // DLFEAT 001b: deallocated blocks read as zeroes
    if ctrl.namespace(NSID).expect("namespace").identify.dlfeat & 7 == 1 {
        assert!(wait_one(&mut qp, |q| q.read(NSID, lba, span(&buf, 0, len), 7)).is_success());
        buf.read_into(&mut back, 0).expect("read back");
        assert!(
            back.iter().all(|b| *b == 0),
            "deallocated blocks read as zeroes"
        );
    }
    buffers.free(buf).expect("own buffer");
}

/// Keeps `depth` I/Os in flight on `qp` until `total` completed: writes of a pattern, each read
/// back and checked; every completion matched to its token exactly once.
fn hammer(
    qp: &mut QueuePair,
    bs: usize,
    first_lba: u64,
    total: usize,
    depth: usize,
    pool: &mut BufferPool,
) {
    let io = 4096usize;
    let blocks = (io / bs) as u64;
    let mut outstanding: HashMap<u64, (DmaBuffer, u64, bool)> = HashMap::new();
    let (mut issued, mut completed, mut next_token) = (0usize, 0usize, 1u64);
    while completed < total {
        while outstanding.len() < depth && issued < total {
            let Some(buf) = pool.alloc() else { break };
            let slot = (issued % 512) as u64;
            let lba = first_lba + slot * blocks;
            let is_write = (issued / 512) % 2 == 0;
            if is_write {
                buf.write_from(&pattern(lba, io), 0).expect("fill");
            }
            let b = IoBuffer {
                iova: buf.iova(),
                len: io as u32,
            };
            let r = if is_write {
                qp.write(NSID, lba, b, next_token)
            } else {
                qp.read(NSID, lba, b, next_token)
            };
            match r {
                Ok(()) => {
                    outstanding.insert(next_token, (buf, lba, is_write));
                    next_token += 1;
                    issued += 1;
                }
                Err(SubmitError::QueueFull { .. }) => {
                    pool.free(buf).expect("own buffer");
                    break;
                }
                Err(e) => panic!("submit: {e}"),
            }
        }
        qp.poll(|c| {
            let (buf, lba, is_write) = outstanding
                .remove(&c.token)
                .expect("a token that was given, once");
            assert!(c.status.is_success(), "lba {lba}: {}", c.status);
            if !is_write {
                let mut back = vec![0u8; io];
                buf.read_into(&mut back, 0).expect("read back");
                assert!(
                    back == pattern(lba, io),
                    "lba {lba}: read differs from what was written"
                );
            }
            pool.free(buf).expect("own buffer");
            completed += 1;
        });
    }
    assert!(outstanding.is_empty());
    assert_eq!(qp.in_flight(), 0);
}

#[test]
#[ignore = "VM: run by `cargo xtask vm-test`"]
fn two_threads_each_with_a_queue_pair_on_one_drive() {
    let (_vfio, ctrls) = open_all();
    let ctrl = ctrls[1].clone();
    let bs = ctrl.namespace(NSID).expect("namespace").block_size as usize;
    std::thread::scope(|s| {
        for t in 0..2u64 {
            let ctrl = ctrl.clone();
            s.spawn(move || {
                let mut qp = ctrl
                    .create_queue_pair(QueuePairOptions {
                        depth: 256,
                        ..Default::default()
                    })
                    .expect("queue pair");
                let mut buffers = pool(&ctrl, 4096, 256);
                let first = ctrl.namespace(NSID).expect("namespace").blocks / 4 * (t + 1);
                hammer(&mut qp, bs, first, 4096, 255, &mut buffers);
            });
        }
    });
}

#[test]
#[ignore = "VM: run by `cargo xtask vm-test`"]
fn one_thread_with_queue_pairs_on_every_drive() {
    let (_vfio, ctrls) = open_all();
    let mut qps: Vec<(QueuePair, usize, u64, BufferPool)> = ctrls
        .iter()
        .map(|c| {
            let ns = c.namespace(NSID).expect("namespace");
            let qp = c
                .create_queue_pair(QueuePairOptions {
                    depth: 64,
                    ..Default::default()
                })
                .expect("queue pair");
            (qp, ns.block_size as usize, ns.blocks / 2, pool(c, 4096, 64))
        })
        .collect();
    for (qp, bs, middle, buffers) in &mut qps {
        hammer(qp, *bs, *middle, 1024, 63, buffers);
    }
}

#[test]
#[ignore = "VM: run by `cargo xtask vm-test`"]
fn errors_come_back_by_name_and_kind() {
    let (vfio, ctrls) = open_all();
    let ctrl = &ctrls[0];
    let ns = ctrl.namespace(NSID).expect("namespace");
    let mut qp = ctrl
        .create_queue_pair(QueuePairOptions::default())
        .expect("queue pair");
    let mut buffers = pool(ctrl, 4 << 20, 1);
    let buf = buffers.alloc().expect("buffer");
    let bs = ns.block_size as usize;

    // a read past the end never leaves the driver; the drive answers a Write Zeroes past it
    let e = qp
        .read(NSID, ns.blocks, span(&buf, 0, bs), 7)
        .expect_err("past the end");
    assert!(matches!(e, SubmitError::LbaRange { .. }), "{e}");
    let st = wait_one(&mut qp, |q| q.write_zeroes(NSID, ns.blocks, 1, 7));
    assert_eq!(st.code(), Status::LBA_OUT_OF_RANGE, "{st}");
    assert_eq!(st.name(), "LBA Out of Range");

    let too_big = ctrl.max_transfer() as usize + bs;
    let e = qp
        .read(NSID, 0, span(&buf, 0, too_big), 7)
        .expect_err("larger than MDTS");
    assert!(matches!(e, SubmitError::ExceedsMdts { .. }), "{e}");
    let e = qp
        .read(2, 0, span(&buf, 0, bs), 7)
        .expect_err("no namespace 2");
    assert_eq!(e, SubmitError::InvalidNamespace { nsid: 2 });
    let e = ctrl.namespace(2).expect_err("no namespace 2");
    assert!(matches!(e, Error::NoNamespace { nsid: 2, .. }), "{e}");

    let nowhere: PciAddress = "0000:7f:1f.7".parse().expect("address");
    let e =
        Controller::open(&vfio, nowhere, ControllerOptions::default()).expect_err("no such device");
    assert!(matches!(e, Error::Vfio(VfioError::NoDevice { .. })), "{e}");
    assert!(e.to_string().contains("usnvme list"), "{e}");
    buffers.free(buf).expect("own buffer");
}

#[test]
#[ignore = "VM: run by `cargo xtask vm-test`"]
fn a_drive_not_bound_to_vfio_is_refused_with_the_fix() {
    let addr = *vfio_controllers().last().expect("a drive");
    let dev = Path::new("/sys/bus/pci/devices").join(addr.to_string());
    std::fs::write(dev.join("driver/unbind"), addr.to_string()).expect("unbind");
    let vfio = Vfio::new("/sys").expect("VFIO container");
    let e =
        Controller::open(&vfio, addr, ControllerOptions::default()).expect_err("not on vfio-pci");
    // give the drive back to vfio-pci before asserting, so later tests see all drives
    std::fs::write("/sys/bus/pci/drivers_probe", addr.to_string()).expect("rebind");
    assert!(matches!(e, Error::Vfio(VfioError::NotVfio { .. })), "{e}");
    assert!(e.to_string().contains("usnvme setup bind"), "{e}");
}

#[test]
#[ignore = "VM: run by `cargo xtask vm-test`"]
fn no_hugepages_reserved_is_an_error_that_says_how_to_reserve_them() {
    let nr = Path::new("/proc/sys/vm/nr_hugepages");
    let before = std::fs::read_to_string(nr).expect("nr_hugepages");
    std::fs::write(nr, "0").expect("release hugepages");
    let vfio = Vfio::new("/sys").expect("VFIO container");
    let addr = vfio_controllers()[0];
    let result = Controller::open(&vfio, addr, ControllerOptions::default());
    std::fs::write(nr, before.trim()).expect("restore hugepages");
    let e = result.expect_err("no hugepages");
    assert!(matches!(e, Error::Memory { .. }), "{e}");
    assert!(e.to_string().contains("usnvme setup --hugepages"), "{e}");
}

#[test]
#[ignore = "VM: run by `cargo xtask vm-test`"]
fn sgl_data_blocks_carry_data_like_prps() {
    let vfio = Vfio::new("/sys").expect("VFIO container");
    for addr in vfio_controllers().into_iter().take(2) {
        let ctrl = Controller::open(
            &vfio,
            addr,
            ControllerOptions {
                sgl: true,
                ..Default::default()
            },
        )
        .expect("open");
        assert!(ctrl.uses_sgl(), "{addr}: QEMU's NVMe supports SGLs");
        let ns = ctrl.namespace(NSID).expect("namespace");
        let bs = ns.block_size as usize;
        // away from the blocks whose contents the host checks after the run
        let lba = ns.blocks / 4 * 3;
        let mut qp = ctrl
            .create_queue_pair(QueuePairOptions::default())
            .expect("queue pair");
        let mut buffers = pool(&ctrl, 1 << 20, 2);
        let (w, r) = (
            buffers.alloc().expect("buffer"),
            buffers.alloc().expect("buffer"),
        );
        for (size, offset) in [(bs, 0), (64 << 10, 512), (ctrl.max_transfer() as usize, 0)] {
            let data = pattern(size as u64 + offset as u64, size);
            w.write_from(&data, offset).expect("fill");
            assert!(
                wait_one(&mut qp, |q| q.write(NSID, lba, span(&w, offset, size), 7)).is_success()
            );
            assert!(
                wait_one(&mut qp, |q| q.read(NSID, lba, span(&r, offset, size), 7)).is_success()
            );
            let mut back = vec![0u8; size];
            r.read_into(&mut back, offset).expect("read back");
            assert!(back == data, "{addr}: {size} bytes through an SGL differ");
        }
        buffers.free(w).expect("own buffer");
        buffers.free(r).expect("own buffer");
    }
}

#[test]
#[ignore = "VM: run by `cargo xtask vm-test`"]
fn a_full_queue_is_an_error_never_an_overwrite() {
    let (_vfio, ctrls) = open_all();
    let ctrl = &ctrls[2];
    assert!(
        ctrl.shadow_doorbells(),
        "QEMU offers Doorbell Buffer Config"
    );
    let mut qp = ctrl
        .create_queue_pair(QueuePairOptions {
            depth: 16,
            ..Default::default()
        })
        .expect("queue pair");
    for token in 0..15 {
        qp.flush_cache(NSID, token)
            .expect("room for depth - 1 commands");
    }
    assert_eq!(
        qp.flush_cache(NSID, 99),
        Err(SubmitError::QueueFull { in_flight: 15 })
    );
    let mut tokens = Vec::new();
    let started = std::time::Instant::now();
    while tokens.len() < 15 {
        qp.poll(|c| tokens.push(c.token));
        assert!(
            started.elapsed().as_secs() < 30,
            "completions missing: {tokens:?}"
        );
    }
    tokens.sort();
    assert_eq!(
        tokens,
        (0..15).collect::<Vec<_>>(),
        "each token once, 99 never"
    );
    // the ring wraps around many times with the queue kept full
    for round in 0..50u64 {
        for i in 0..15 {
            qp.flush_cache(NSID, round * 100 + i)
                .expect("room after completions");
        }
        let mut n = 0;
        while n < 15 {
            n += qp.poll(|_| {});
        }
    }
    assert_eq!(qp.stats().garbage, 0);
    assert_eq!(qp.stats().completed, 15 * 51);
}

#[test]
#[ignore = "VM: run by `cargo xtask vm-test`"]
fn the_iommu_ranges_come_from_vfio_and_regions_are_mapped_once() {
    let (vfio, ctrls) = open_all();
    let space = vfio.iova_space();
    let ranges = space.mapper().iova_ranges();
    assert!(!ranges.is_empty());
    // the bed's IOMMU has 48 address bits (`aw-bits=48`), less the interrupt window
    assert!(
        ranges.iter().all(|r| r.end <= 1 << 48) && ranges.iter().any(|r| r.end == 1 << 48),
        "the test VM's IOMMU has 48 address bits: {ranges:x?}"
    );
    let before = space.mappings();
    // admin rings, admin data and shadow doorbells: three regions per controller
    assert_eq!(before, 3 * ctrls.len());
    let qps: Vec<QueuePair> = ctrls
        .iter()
        .map(|c| {
            c.create_queue_pair(QueuePairOptions::default())
                .expect("queue pair")
        })
        .collect();
    let buffers = pool(&ctrls[0], 4096, 4096);
    assert_eq!(
        space.mappings(),
        before + qps.len() + 1,
        "one mapping per region, not per buffer"
    );
    let aborted = ctrls[0]
        .abort(qps[0].qid(), 0xfff0)
        .expect("Abort is answered");
    assert!(
        !aborted,
        "a command id that is not in flight cannot be aborted"
    );
    drop(buffers);
    drop(qps);
    assert_eq!(space.mappings(), before);
}

#[test]
#[ignore = "VM: run by `cargo xtask vm-test`"]
fn a_reset_fails_what_was_in_flight_and_the_queue_pairs_keep_working() {
    let (_vfio, ctrls) = open_all();
    let ctrl = &ctrls[4];
    let bs = ctrl.namespace(NSID).expect("namespace").block_size as usize;
    let lba = ctrl.namespace(NSID).expect("namespace").blocks / 8;
    let mut qp = ctrl
        .create_queue_pair(QueuePairOptions::default())
        .expect("queue pair");
    let mut other = ctrl
        .create_queue_pair(QueuePairOptions::default())
        .expect("second queue pair");
    let mut buffers = pool(ctrl, 4096, 64);
    let bufs: Vec<DmaBuffer> = (0..33).map(|_| buffers.alloc().expect("buffer")).collect();
    for (i, b) in bufs.iter().take(32).enumerate() {
        b.write_from(&pattern(i as u64, 4096), 0).expect("fill");
        qp.write(
            NSID,
            lba + (i * 4096 / bs) as u64,
            span(b, 0, 4096),
            i as u64,
        )
        .expect("queued");
    }
    qp.flush();
    let resets = ctrl.resets();
    ctrl.reset().expect("reset");
    assert_eq!(ctrl.resets(), resets + 1);
    // Everything in flight comes back exactly once, aborted by the host or already done.
    let mut seen = [false; 32];
    let started = std::time::Instant::now();
    while seen.iter().any(|s| !s) {
        qp.poll(|c| {
            assert!(!seen[c.token as usize], "token {} twice", c.token);
            seen[c.token as usize] = true;
            assert!(
                c.status.is_success() || c.status.code() == Status::ABORTED_BY_HOST,
                "{}",
                c.status
            );
        });
        assert!(started.elapsed().as_secs() < 30);
    }
    // Both queue pairs were re-created: new I/O works and reads back what it wrote.
    for q in [&mut qp, &mut other] {
        let data = pattern(1234, 4096);
        bufs[32].write_from(&data, 0).expect("fill");
        assert!(wait_one(q, |q| q.write(NSID, lba, span(&bufs[32], 0, 4096), 7)).is_success());
        bufs[32].fill(0);
        assert!(wait_one(q, |q| q.read(NSID, lba, span(&bufs[32], 0, 4096), 7)).is_success());
        let mut back = vec![0u8; 4096];
        bufs[32].read_into(&mut back, 0).expect("read back");
        assert!(back == data, "data after the reset");
    }
    for b in bufs {
        buffers.free(b).expect("own buffer");
    }
}
