//! The NVMe/TCP initiator's I/O queue allocates nothing per command: after a warm-up,
//! in-capsule and R2T writes, reads, Write Zeroes, Deallocate and Flush run through its
//! session (against the target's connection state machine, in memory) with no heap allocation
//! on this thread, counted by a global allocator that only this test binary has.

use std::io;
use std::sync::Arc;

use usnvme_driver::spec::Sqe;
use usnvme_driver::IoBuffer;
use usnvme_engine::block::Op;
use usnvme_engine::fabric::export::connection::{Connection, ConnectionLimits};
use usnvme_engine::fabric::export::memory::{test_subsystem, MemoryBackend};
use usnvme_engine::fabric::export::registry::Registry;
use usnvme_engine::fabric::export::wire::ReadWire;
use usnvme_engine::fabric::initiator::session::{Completion, QueueParams, Session};
use usnvme_engine::fabric::initiator::HostOptions;
use usnvme_engine::fabric::pdu::{Digests, IcReq, OutHeader};
use usnvme_hugepages::IovaMemory;
use vm_memory::{GuestAddress, VolatileSlice};

mod common;
use common::allocations;

const BASE: u64 = 0x10_0000;

/// Bytes in memory; `WouldBlock` once consumed (a quiet socket).
struct Pipe<'a>(&'a [u8]);

impl ReadWire for Pipe<'_> {
    fn read_parts(&mut self, parts: &[VolatileSlice<'_>]) -> io::Result<usize> {
        if self.0.is_empty() {
            return Err(io::ErrorKind::WouldBlock.into());
        }
        self.0.read_parts(parts)
    }
}

fn capsule(sqe: &Sqe, data: &[u8]) -> Vec<u8> {
    let h = OutHeader::capsule_cmd(sqe, data.len(), Digests::default());
    let mut pdu = h.as_slice().to_vec();
    pdu.extend_from_slice(data);
    pdu
}

fn sgl(sqe: &mut Sqe, kind: u8, len: u32) {
    let b: &mut [u8; 64] = zerocopy::IntoBytes::as_mut_bytes(sqe)
        .try_into()
        .expect("64 bytes");
    b[39] = kind;
    b[32..36].copy_from_slice(&len.to_le_bytes());
}

/// An admin queue's Connect (controller 0xFFFF: a new one) and CC.EN, as raw PDUs.
fn admin_pdus(subnqn: &str) -> [Vec<u8>; 3] {
    let ic = IcReq {
        pfv: 0,
        hpda: 0,
        digests: Digests::default(),
        maxr2t: 0,
    }
    .encode()
    .to_vec();
    let mut sqe = Sqe::new(0x7f);
    let b: &mut [u8; 64] = zerocopy::IntoBytes::as_mut_bytes(&mut sqe)
        .try_into()
        .expect("64 bytes");
    b[4] = 0x01;
    b[44..46].copy_from_slice(&31u16.to_le_bytes());
    sgl(&mut sqe, 0x01, 1024);
    let mut data = [0u8; 1024];
    data[16..18].copy_from_slice(&0xffffu16.to_le_bytes());
    data[256..256 + subnqn.len()].copy_from_slice(subnqn.as_bytes());
    let host = HostOptions::default().host_nqn;
    data[512..512 + host.len()].copy_from_slice(host.as_bytes());
    let connect = capsule(&sqe, &data);
    let mut cc = Sqe::new(0x7f);
    let b: &mut [u8; 64] = zerocopy::IntoBytes::as_mut_bytes(&mut cc)
        .try_into()
        .expect("64 bytes");
    b[44..48].copy_from_slice(&0x14u32.to_le_bytes());
    b[48..56].copy_from_slice(&(1u64 | 6 << 16 | 4 << 20).to_le_bytes());
    [ic, connect, capsule(&cc, &[])]
}

#[test]
fn submit_and_poll_allocate_nothing_once_warm() {
    let before = allocations();
    drop(std::hint::black_box(Box::new(7u64)));
    assert_eq!(allocations(), before + 1, "the counter counts");
    for digests in [
        Digests::default(),
        Digests {
            header: true,
            data: true,
        },
    ] {
        let sub = Arc::new(test_subsystem(1));
        let registry = Arc::new(Registry::new(None));
        let limits = ConnectionLimits { maxh2cdata: 16384 };
        let mut backend = MemoryBackend::new(&sub);
        let mut admin = Connection::new(sub.clone(), registry.clone(), limits, "a".into());
        for p in admin_pdus(&sub.nqn) {
            admin.receive(&p, &mut backend);
        }
        admin
            .transmit(&mut Vec::new(), &mut backend)
            .expect("memory");

        let mut conn = Connection::new(sub.clone(), registry.clone(), limits, "i".into());
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
                session.receive_from(&mut Pipe(&back), &mem, &mut on_done);
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
