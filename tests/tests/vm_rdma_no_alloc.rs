//! The NVMe/RDMA host's I/O queue allocates nothing per command (VM: soft-RoCE, the kernel's
//! nvmet-rdma target): once warm, in-capsule and keyed writes, reads, Deallocate (its range keyed)
//! and Flush go through a queue with no heap allocation on this thread, counted by the
//! engine's counting allocator (which this test binary alone has), and what is read back is
//! what was written.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use usnvme_driver::IoBuffer;
use usnvme_engine::block::Op;
use usnvme_engine::fabric::address::Transport;
use usnvme_engine::transport::fabric_queue::FabricQueue;
use usnvme_engine::transport::rdma::completions::shared_completion_queues;
use usnvme_engine::transport::rdma::domain::registered_regions;
use usnvme_engine::transport::tcp::initiator::queue::Buffers;
use usnvme_engine::transport::tcp::initiator::{Completion, HostOptions, IoNamespace, QueueParams};
use usnvme_engine::transport::RemoteController;
use usnvme_hugepages::IovaMemory;
use usnvme_tests::rdma::{or_kernel_log, rdma_address, NvmetRdma};
use vm_memory::{Bytes, GuestAddress};

/// The engine's counting allocator.
#[path = "../../engine/tests/common/counting.rs"]
mod common;

const NQN: &str = "nqn.2024-01.io.usnvme:vm-rdma-no-alloc";
const PORT_ID: u32 = 45;
const TRSVCID: u16 = 4424;
const BASE: u64 = 0x10_0000;

#[test]
#[ignore = "VM: run by `cargo xtask vm-test`"]
fn an_rdma_io_queue_allocates_nothing_per_command_once_warm() {
    common::assert_counting();
    let address = rdma_address();
    let _nvmet = or_kernel_log("nvmet-rdma port", || {
        NvmetRdma::on_file(NQN, 64 << 20, PORT_ID, address, TRSVCID)
    });
    let addr: SocketAddr = format!("{address}:{TRSVCID}").parse().expect("an address");
    let host = HostOptions {
        transport: Transport::Rdma,
        ..HostOptions::default()
    };
    let mut ctrl = or_kernel_log("admin queue over RDMA", || {
        RemoteController::connect(addr, NQN, &host).expect("the controller")
    });
    let id = ctrl.identify_controller().expect("Identify");
    assert!(ctrl.set_io_queues(2).expect("Number of Queues") >= 2);
    let in_capsule = (id.ioccsz * 16).saturating_sub(64);
    assert!(
        in_capsule >= 4096,
        "nvmet-rdma takes 4 KiB in the capsule: {in_capsule}"
    );
    let mem = Arc::new(IovaMemory::from_ranges(&[(GuestAddress(BASE), 1 << 20)]).expect("memory"));
    let params = QueueParams {
        subnqn: NQN.into(),
        qid: 1,
        cntlid: ctrl.cntlid(),
        entries: 32,
        nsid: 1,
        block_size: 4096,
        in_capsule,
        max_transfer: 128 << 10,
        timeout_ns: 30_000_000_000,
    };
    let mut queue = or_kernel_log("I/O queue over RDMA", || {
        FabricQueue::connect(addr, params.clone(), &host, Buffers::Memory(mem.clone()))
            .expect("I/O queue")
    });
    let ns = IoNamespace {
        nsid: 1,
        block_size: 4096,
    };
    let buf = |at: u64, len: u32| {
        Some(IoBuffer {
            iova: BASE + at,
            len,
        })
    };
    let written: Vec<u8> = (0..(68u32 << 10)).map(|i| (i * 7 + 3) as u8).collect();
    mem.write_slice(&written[..4096], GuestAddress(BASE))
        .expect("memory");
    mem.write_slice(&written[4096..], GuestAddress(BASE + 0x10000))
        .expect("memory");
    let mut done: Vec<Completion> = Vec::with_capacity(1 << 12);
    let round = |queue: &mut FabricQueue, done: &mut Vec<Completion>| {
        let ios = [
            (Op::Write, 0, 1, buf(0, 4096)),             // in the capsule
            (Op::Write, 16, 16, buf(0x10000, 64 << 10)), // keyed: the target reads it
            (Op::Read, 0, 1, buf(0x40000, 4096)),        // keyed: the target writes it
            (Op::Read, 16, 16, buf(0x80000, 64 << 10)),
            // (no Write Zeroes: nvmet's file backend on tmpfs refuses it; it goes as Flush
            // does, with no data)
            (Op::Deallocate, 400, 8, None),
            (Op::Flush, 0, 0, None),
        ];
        let first = done.len();
        // (the writes complete before the reads of the same blocks are sent)
        for (token, (op, slba, blocks, b)) in ios.into_iter().enumerate() {
            queue
                .submit_to(ns, op, slba, blocks, b, token as u64)
                .expect("submitted");
            let deadline = Instant::now() + Duration::from_secs(30);
            while done.len() < first + token + 1 {
                queue.poll(|c| done.push(c));
                assert!(
                    Instant::now() < deadline,
                    "no completion in 30 s: {:?}",
                    queue.ended()
                );
            }
        }
    };
    for _ in 0..3 {
        round(&mut queue, &mut done); // warm-up
    }
    let mut read = vec![0u8; written.len()];
    mem.read_slice(&mut read[..4096], GuestAddress(BASE + 0x40000))
        .expect("memory");
    mem.read_slice(&mut read[4096..], GuestAddress(BASE + 0x80000))
        .expect("memory");
    assert!(
        read == written,
        "the reads over RDMA returned other bytes than the writes sent"
    );
    done.clear();
    let before = common::allocations();
    for _ in 0..50 {
        round(&mut queue, &mut done);
    }
    let allocated = common::allocations() - before;
    assert_eq!(
        allocated, 0,
        "heap allocations in 50 rounds of 6 commands over RDMA"
    );
    assert_eq!(done.len(), 300);
    assert!(
        done.iter().all(|c| c.result.is_ok()),
        "{:?}",
        done.iter().find(|c| c.result.is_err())
    );
    assert_eq!(queue.in_flight(), 0);
    // a second queue on the same memory registers nothing again: each region once per device
    let registered = registered_regions();
    assert!(registered >= 1, "the data memory is registered");
    let second = QueueParams { qid: 2, ..params };
    let mut second = FabricQueue::connect(addr, second, &host, Buffers::Memory(mem.clone()))
        .expect("a second I/O queue");
    assert_eq!(
        registered_regions(),
        registered,
        "a second queue registered the same memory again"
    );
    // and shares the first's completion queue (the thread's, as a reactor's): what one polls
    // for the other reaches the other
    assert_eq!(shared_completion_queues(), 1);
    // both queues at once: each writes a block, then reads the other's back
    for (op, first_at, second_at) in [(Op::Write, 0, 0), (Op::Read, 0x40000, 0x80000)] {
        done.clear();
        let (first_lba, second_lba) = if op == Op::Write {
            (500, 600)
        } else {
            (600, 500)
        };
        for at in [first_at, second_at].into_iter().filter(|_| op == Op::Read) {
            mem.write_slice(&[0u8; 4096], GuestAddress(BASE + at))
                .expect("memory");
        }
        queue
            .submit_to(ns, op, first_lba, 1, buf(first_at, 4096), 1000)
            .expect("submitted");
        second
            .submit_to(ns, op, second_lba, 1, buf(second_at, 4096), 2000)
            .expect("submitted");
        let deadline = Instant::now() + Duration::from_secs(30);
        while done.len() < 2 {
            // the first polled alone until its own is done (any of the second's it takes
            // waits in the second's inbox), then both
            queue.poll(|c| done.push(c));
            if done.iter().any(|c| c.token == 1000) {
                second.poll(|c| done.push(c));
            }
            assert!(Instant::now() < deadline, "no completions in 30 s");
        }
        assert!(done.iter().all(|c| c.result.is_ok()), "{done:?}");
        let mut tokens: Vec<u64> = done.iter().map(|c| c.token).collect();
        tokens.sort_unstable();
        assert_eq!(tokens, [1000, 2000]);
    }
    for at in [0x40000, 0x80000] {
        let mut block = vec![0u8; 4096];
        mem.read_slice(&mut block, GuestAddress(BASE + at))
            .expect("memory");
        assert!(block == written[..4096], "a block read back differs");
    }
    second.close(|_| {});
    queue.close(|_| {});
    ctrl.shutdown().expect("shutdown");
}
