//! The NVMe/TCP initiator's I/O queue allocates nothing per command: after a warm-up,
//! in-capsule and R2T writes, reads, Write Zeroes, Deallocate and Flush run through its
//! session (against the target's connection state machine, in memory) with no heap allocation
//! on this thread, counted by a global allocator that only this test binary has.

use std::sync::Arc;

use usnvme_driver::IoBuffer;
use usnvme_engine::block::Op;
use usnvme_engine::fabric::export::connection::{Connection, ConnectionLimits};
use usnvme_engine::fabric::export::memory::{test_subsystem, MemoryBackend};
use usnvme_engine::fabric::export::registry::Registry;
use usnvme_engine::fabric::export::Subsystems;
use usnvme_engine::fabric::pdu::{Digests, IcReq};
use usnvme_engine::transport::tcp::initiator::session::{Completion, QueueParams, Session};
use usnvme_engine::transport::tcp::initiator::{Gated, HostOptions};
use usnvme_hugepages::IovaMemory;
use vm_memory::GuestAddress;

mod common;
use common::pdus::{capsule, connect, enable, DIGESTS};
use common::{allocations, assert_counting};

const BASE: u64 = 0x10_0000;

/// An admin queue's Connect (controller 0xFFFF: a new one) and CC.EN, as raw PDUs.
fn admin_pdus(subnqn: &str) -> [Vec<u8>; 3] {
    let plain = Digests::default();
    let ic = IcReq {
        pfv: 0,
        hpda: 0,
        digests: plain,
        maxr2t: 0,
    }
    .encode()
    .to_vec();
    let host = HostOptions::default().host_nqn;
    [
        ic,
        connect(0, 0xffff, subnqn, &host, plain),
        capsule(&enable(), &[], plain),
    ]
}

#[test]
fn submit_and_poll_allocate_nothing_once_warm() {
    assert_counting();
    for digests in DIGESTS {
        let sub = Arc::new(test_subsystem(1));
        let registry = Arc::new(Registry::new());
        let limits = ConnectionLimits { maxh2cdata: 16384 };
        let mut backend = MemoryBackend::new(&sub);
        let mut admin = Connection::new(
            Subsystems::one(sub.clone()),
            registry.clone(),
            limits,
            "a".into(),
        );
        for p in admin_pdus(&sub.nqn) {
            admin.receive(&p, &mut backend);
        }
        admin
            .transmit(&mut Vec::new(), &mut backend)
            .expect("memory");

        let mut conn = Connection::new(
            Subsystems::one(sub.clone()),
            registry.clone(),
            limits,
            "i".into(),
        );
        let params = QueueParams {
            subnqn: sub.nqn.clone(),
            qid: 1,
            cntlid: 1,
            entries: 32,
            nsid: 1,
            block_size: 512,
            in_capsule: sub.in_capsule_bytes,
            max_transfer: sub.max_transfer,
            timeout_ns: u64::MAX,
        };
        let host = HostOptions {
            digests,
            ..HostOptions::default()
        };
        let mut session = Session::new(params, &host).expect("a session");
        let mem = IovaMemory::from_ranges(&[(GuestAddress(BASE), 1 << 20)]).expect("memory");
        let mut wire = Vec::with_capacity(1 << 20);
        let mut back = Vec::with_capacity(1 << 20);
        let mut done: Vec<Completion> = Vec::with_capacity(1 << 16);

        // moves bytes both ways until both sides are quiet
        let mut pump = |session: &mut Session,
                        conn: &mut Connection,
                        backend: &mut MemoryBackend,
                        done: &mut Vec<Completion>| {
            for _ in 0..16 {
                wire.clear();
                back.clear();
                session.transmit(&mut wire, &mem).expect("memory");
                if !wire.is_empty() {
                    conn.receive(&wire, backend);
                }
                backend.complete_all(conn);
                conn.transmit(&mut back, backend).expect("memory");
                let mut on_done = |c| done.push(c);
                session.receive_from(&mut Gated(&back), &mem, &mut on_done);
                session.deliver(&mut on_done);
                if wire.is_empty() && back.is_empty() {
                    break;
                }
            }
        };
        pump(&mut session, &mut conn, &mut backend, &mut done);
        assert!(session.ready(), "{:?}", session.ended());
        let capacity = session.tx_capacity();

        let buf = |at: u64, len: u32| {
            Some(IoBuffer {
                iova: BASE + at,
                len,
            })
        };
        let mut round = |session: &mut Session,
                         conn: &mut Connection,
                         backend: &mut MemoryBackend,
                         done: &mut Vec<Completion>| {
            let ios = [
                (Op::Write, 0, 8, buf(0, 4096)),
                (Op::Write, 64, 128, buf(0x10000, 64 << 10)),
                (Op::Read, 0, 8, buf(0x40000, 4096)),
                (Op::Read, 64, 128, buf(0x80000, 64 << 10)),
                (Op::WriteZeroes, 300, 8, None),
                (Op::Deallocate, 400, 8, None),
                (Op::Flush, 0, 0, None),
            ];
            for (token, (op, slba, blocks, b)) in ios.into_iter().enumerate() {
                session
                    .submit(op, slba, blocks, b, token as u64, &mem)
                    .expect("submitted");
            }
            pump(session, conn, backend, done);
        };
        for _ in 0..3 {
            round(&mut session, &mut conn, &mut backend, &mut done); // warm-up
        }
        done.clear();
        let before = allocations();
        for _ in 0..100 {
            round(&mut session, &mut conn, &mut backend, &mut done);
        }
        let allocated = allocations() - before;
        assert_eq!(allocated, 0, "heap allocations in 100 rounds, {digests:?}");
        assert_eq!(done.len(), 700);
        assert!(done.iter().all(|c| c.result.is_ok()), "{:?}", done[0]);
        assert_eq!(session.tx_capacity(), capacity, "the transmit queue grew");
        assert_eq!(session.in_flight(), 0);
    }
}
