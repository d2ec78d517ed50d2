use std::sync::Arc;

use usnvme_driver::spec::fabrics::CONNECT_DATA;
use usnvme_driver::spec::{Cqe, SglDescriptor, Sqe};
use usnvme_driver::SubmitError;
use vm_memory::Bytes;

use super::*;
use crate::fabric::export::connection::{Connection, ConnectionLimits};
use crate::fabric::export::memory::{test_subsystem, MemoryBackend};
use crate::fabric::export::registry::Registry;
use crate::fabric::export::Subsystems;
use crate::fabric::pdu::{flags, DataHeader, IcResp, OutHeader, PduType};
use crate::transport::tcp::initiator::testing::{append_pdu, pattern};
use crate::transport::tcp::initiator::Gated;
use crate::transport::Op;
use usnvme_driver::spec::fabrics::CNTLID_DYNAMIC;
use usnvme_driver::spec::PropertySize;

const BASE: u64 = 0x10_0000;
const BOTH: pdu::Digests = pdu::Digests {
    header: true,
    data: true,
};

/// A capsule of `sqe` with `data` in it.
fn capsule(sqe: &Sqe, data: &[u8], digests: pdu::Digests) -> Vec<u8> {
    let mut out = Vec::new();
    append_pdu(
        &mut out,
        &OutHeader::capsule_cmd(sqe, data.len(), digests),
        data,
        digests,
    );
    out
}

/// An enabled controller (1) on the target, through an admin connection driven by hand.
fn admin(sub: &Arc<crate::fabric::export::SubsystemInfo>, registry: &Arc<Registry>) -> Connection {
    let mut backend = MemoryBackend::new(sub);
    let limits = ConnectionLimits { maxh2cdata: 16384 };
    let mut a = Connection::new(
        Subsystems::one(sub.clone()),
        registry.clone(),
        limits,
        "admin".into(),
    );
    let ic = IcReq {
        pfv: PFV_1_0,
        hpda: 0,
        digests: pdu::Digests::default(),
        maxr2t: 0,
    };
    a.receive(&ic.encode(), &mut backend);
    let mut sqe = Sqe::connect(0, 32, 0, 0);
    sqe.set_sgl(SglDescriptor::in_capsule(CONNECT_DATA as u32));
    let host = HostOptions::default();
    let data =
        ConnectData::new(host.host_id, CNTLID_DYNAMIC, &sub.nqn, &host.host_nqn).expect("data");
    let data = data.as_bytes();
    a.receive(&capsule(&sqe, data, pdu::Digests::default()), &mut backend);
    let mut cc = Sqe::property_set(0x14, PropertySize::Four, 0x46_0001);
    cc.set_cid(1);
    a.receive(&capsule(&cc, &[], pdu::Digests::default()), &mut backend);
    let mut out = Vec::new();
    a.transmit(&mut out, &mut backend).expect("memory");
    a
}

/// The target's I/O connection and our session over memory.
struct Bed {
    _admin: Connection,
    conn: Connection,
    backend: MemoryBackend,
    session: Session,
    mem: IovaMemory,
    done: Vec<Completion>,
    /// Bytes the target sent.
    received: usize,
}

fn params(sub: &crate::fabric::export::SubsystemInfo) -> QueueParams {
    QueueParams {
        subnqn: sub.nqn.clone(),
        qid: 1,
        cntlid: 1,
        entries: 32,
        nsid: 1,
        block_size: 512,
        in_capsule: sub.in_capsule_bytes,
        max_transfer: sub.max_transfer,
        timeout_ns: 1_000_000_000,
    }
}

impl Bed {
    fn new(digests: pdu::Digests) -> Bed {
        let sub = Arc::new(test_subsystem(1));
        let registry = Arc::new(Registry::new());
        let admin = admin(&sub, &registry);
        let backend = MemoryBackend::new(&sub);
        let limits = ConnectionLimits { maxh2cdata: 16384 };
        let conn = Connection::new(Subsystems::one(sub.clone()), registry, limits, "io".into());
        let host = HostOptions {
            digests,
            ..HostOptions::default()
        };
        let session = Session::new(params(&sub), &host).expect("a session");
        let mem = IovaMemory::from_ranges(&[(GuestAddress(BASE), 4 << 20)]).expect("memory");
        let mut bed = Bed {
            _admin: admin,
            conn,
            backend,
            session,
            mem,
            done: Vec::new(),
            received: 0,
        };
        bed.pump();
        assert!(bed.session.ready(), "{:?}", bed.session.ended());
        assert_eq!(bed.session.negotiated(), (digests, 16384));
        bed
    }

    /// Moves bytes both ways until both sides are quiet.
    fn pump(&mut self) {
        for _ in 0..64 {
            let mut wire = Vec::new();
            self.session.transmit(&mut wire, &self.mem).expect("memory");
            if !wire.is_empty() {
                self.conn.receive(&wire, &mut self.backend);
            }
            self.backend.complete_all(&mut self.conn);
            let mut back = Vec::new();
            self.conn
                .transmit(&mut back, &mut self.backend)
                .expect("memory");
            self.received += back.len();
            let done = &mut self.done;
            let mut on_done = |c| done.push(c);
            self.session
                .receive_from(&mut Gated(&back), &self.mem, &mut on_done);
            self.session.deliver(&mut on_done);
            if wire.is_empty() && back.is_empty() {
                return;
            }
        }
        panic!("the queue never went quiet");
    }

    fn io(&mut self, op: Op, slba: u64, blocks: u32, at: u64, token: u64) {
        let buf = op.has_data().then_some(IoBuffer {
            iova: BASE + at,
            len: blocks * 512,
        });
        self.session
            .submit(op, slba, blocks, buf, token, &self.mem)
            .expect("submitted");
    }

    fn results(&mut self) -> Vec<(u64, Result<(), Failure>)> {
        let mut r: Vec<_> = self.done.drain(..).map(|c| (c.token, c.result)).collect();
        r.sort_by_key(|x| x.0);
        r
    }
}

#[test]
fn writes_in_the_capsule_and_by_r2t_read_back_with_and_without_digests() {
    for digests in [pdu::Digests::default(), BOTH] {
        let mut bed = Bed::new(digests);
        let small = pattern(4096, 1); // in the capsule (8 KiB at most)
        let big = pattern(64 << 10, 2); // R2T, four H2CData of 16 KiB
        bed.mem
            .write_slice(&small, GuestAddress(BASE))
            .expect("write");
        bed.mem
            .write_slice(&big, GuestAddress(BASE + 0x10000))
            .expect("write");
        bed.io(Op::Write, 8, 8, 0, 1);
        bed.io(Op::Write, 100, 128, 0x10000, 2);
        bed.pump();
        assert_eq!(bed.results(), [(1, Ok(())), (2, Ok(()))]);
        let disk = &bed.backend.namespaces[0];
        assert_eq!(&disk[8 * 512..8 * 512 + 4096], &small[..]);
        assert_eq!(&disk[100 * 512..100 * 512 + big.len()], &big[..]);

        // both back, at once, into other buffers
        bed.io(Op::Read, 8, 8, 0x40000, 3);
        bed.io(Op::Read, 100, 128, 0x80000, 4);
        bed.pump();
        assert_eq!(bed.results(), [(3, Ok(())), (4, Ok(()))]);
        let mut got = vec![0u8; big.len()];
        bed.mem
            .read_slice(&mut got[..4096], GuestAddress(BASE + 0x40000))
            .expect("read");
        assert_eq!(&got[..4096], &small[..]);
        bed.mem
            .read_slice(&mut got, GuestAddress(BASE + 0x80000))
            .expect("read");
        assert_eq!(got, big);

        // Write Zeroes, Deallocate, Flush
        bed.io(Op::WriteZeroes, 8, 4, 0, 5);
        bed.io(Op::Deallocate, 12, 4, 0, 6);
        bed.io(Op::Flush, 0, 0, 0, 7);
        bed.pump();
        assert_eq!(bed.results(), [(5, Ok(())), (6, Ok(())), (7, Ok(()))]);
        assert!(bed.backend.namespaces[0][8 * 512..16 * 512]
            .iter()
            .all(|&b| b == 0));
        assert_eq!(bed.backend.flushes[0], 1);
        assert_eq!(bed.session.in_flight(), 0);
    }
}

#[test]
fn a_read_ends_with_its_data_and_no_response_capsule() {
    let mut bed = Bed::new(pdu::Digests::default());
    bed.received = 0;
    bed.io(Op::Read, 0, 8, 0, 1);
    bed.pump();
    assert_eq!(bed.results(), [(1, Ok(()))]);
    // one C2HData (LAST_PDU | SUCCESS): its 24-byte header and 4 KiB, no CapsuleResp
    assert_eq!(bed.received, 24 + 4096);
    // a write is still answered by a response capsule
    bed.received = 0;
    bed.io(Op::Write, 0, 8, 0, 2);
    bed.pump();
    assert_eq!(bed.results(), [(2, Ok(()))]);
    assert_eq!(bed.received, 24);
}

#[test]
fn a_failed_command_names_its_status_and_the_queue_goes_on() {
    let mut bed = Bed::new(pdu::Digests::default());
    bed.io(Op::Read, 2047, 2, 0, 1); // past the end of the 2048-block namespace
    bed.pump();
    let r = bed.results();
    let Err(Failure::Status(status)) = r[0].1 else {
        panic!("{r:?}");
    };
    assert_eq!(status.code(), Status::LBA_OUT_OF_RANGE);
    assert_eq!(status.name(), "LBA Out of Range");
    bed.io(Op::Read, 0, 1, 0, 2);
    bed.pump();
    assert_eq!(bed.results(), [(2, Ok(()))]);
}

#[test]
fn the_queue_refuses_what_it_cannot_send() {
    let mut bed = Bed::new(pdu::Digests::default());
    let mem = &bed.mem;
    let s = &mut bed.session;
    let buf = |len| Some(IoBuffer { iova: BASE, len });
    assert!(matches!(
        s.submit(Op::Read, 0, 512, buf(256 << 10), 1, mem),
        Err(SubmitError::ExceedsMdts { .. })
    ));
    assert!(matches!(
        s.submit(Op::Read, 0, 2, buf(512), 1, mem),
        Err(SubmitError::Misaligned { .. })
    ));
    let outside = Some(IoBuffer {
        iova: 0x1000,
        len: 512,
    });
    assert!(matches!(
        s.submit(Op::Write, 0, 1, outside, 1, mem),
        Err(SubmitError::Misaligned { .. })
    ));
    for token in 0..32 {
        s.submit(Op::Read, 0, 1, buf(512), token, mem)
            .expect("room");
    }
    assert!(matches!(
        s.submit(Op::Read, 0, 1, buf(512), 99, mem),
        Err(SubmitError::QueueFull { in_flight: 32 })
    ));
    bed.pump();
    assert_eq!(bed.results().len(), 32);
}

/// A session ready on memory whose target the test plays by hand.
fn scripted(digests: pdu::Digests) -> (Session, IovaMemory) {
    let sub = test_subsystem(1);
    let host = HostOptions {
        digests,
        ..HostOptions::default()
    };
    let mut s = Session::new(params(&sub), &host).expect("a session");
    let mem = IovaMemory::from_ranges(&[(GuestAddress(BASE), 1 << 20)]).expect("memory");
    let resp = IcResp {
        pfv: 0,
        cpda: 0,
        digests,
        maxh2cdata: 8192,
    };
    let mut none = |_| {};
    s.transmit(&mut Vec::new(), &mem).expect("memory");
    s.receive_from(&mut Gated(&resp.encode()), &mem, &mut none);
    let cqe = Cqe::new(0, 0, 1, CONNECT_CID, Status::SUCCESS, false);
    let h = OutHeader::capsule_resp(&cqe, digests);
    s.receive_from(&mut Gated(h.as_slice()), &mem, &mut none);
    assert!(s.ready(), "{:?}", s.ended());
    (s, mem)
}

#[test]
fn a_malformed_pdu_ends_the_queue_with_a_term_req_and_fails_what_is_in_flight() {
    let (mut s, mem) = scripted(pdu::Digests::default());
    let buf = Some(IoBuffer {
        iova: BASE,
        len: 512,
    });
    s.submit(Op::Read, 0, 1, buf, 1, &mem).expect("room");
    s.submit(Op::Write, 0, 1, buf, 2, &mem).expect("room");
    let mut wire = Vec::new();
    s.transmit(&mut wire, &mem).expect("memory");
    let cqe = Cqe::new(0, 0, 1, 1, Status::SUCCESS, false);
    let mut h = OutHeader::capsule_resp(&cqe, pdu::Digests::default());
    h.bytes[2] = 23; // HLEN
    let mut done = Vec::new();
    let mut on_done = |c: Completion| done.push((c.token, c.result));
    assert_eq!(
        s.receive_from(&mut Gated(h.as_slice()), &mem, &mut on_done),
        Receive::Ended
    );
    let mut term = Vec::new();
    s.transmit(&mut term, &mem).expect("memory");
    assert_eq!(PduType::from_raw(term[0]), Some(PduType::H2CTermReq));
    assert_eq!(pdu::parse_term_req(&term), Some((1, 2)));
    s.deliver(&mut on_done);
    done.sort_by_key(|d| d.0);
    let hlen = Failure::Protocol(field(2, "HLEN"));
    assert_eq!(done, [(1, Err(hlen)), (2, Err(hlen))]);
    assert!(Failure::Protocol(field(2, "HLEN"))
        .to_string()
        .contains("HLEN"));
    assert!(matches!(
        s.submit(Op::Read, 0, 1, buf, 3, &mem),
        Err(SubmitError::Dead)
    ));
}

#[test]
fn c2h_data_is_checked_against_its_command() {
    // (offset, length, CID change, FES): out of order, beyond the command, unknown command
    let cases: [(u32, u32, u16, u16); 3] = [(512, 512, 0, 4), (0, 1024, 0, 4), (0, 512, 9, 1)];
    for (offset, length, cid_delta, fes) in cases {
        let (mut s, mem) = scripted(pdu::Digests::default());
        let buf = Some(IoBuffer {
            iova: BASE,
            len: 512,
        });
        s.submit(Op::Read, 0, 1, buf, 1, &mem).expect("room");
        let d = DataHeader {
            cccid: (1 << SLOT_BITS) + cid_delta, // slot 0, generation 1
            ttag: 0,
            offset,
            length,
        };
        let h = OutHeader::data(
            PduType::C2HData,
            &d,
            flags::LAST_PDU,
            pdu::Digests::default(),
            0,
        );
        let mut bytes = h.as_slice().to_vec();
        bytes.resize(bytes.len() + length as usize, 0xaa);
        let mut done = Vec::new();
        let mut on_done = |c: Completion| done.push(c.result);
        s.receive_from(&mut Gated(&bytes), &mem, &mut on_done);
        s.deliver(&mut on_done);
        let [Err(Failure::Protocol(e))] = done[..] else {
            panic!("{done:?}");
        };
        assert_eq!(e.fes(), fes, "{e}");
    }
}

#[test]
fn a_data_digest_mismatch_fails_only_its_command() {
    let (mut s, mem) = scripted(BOTH);
    let buf = Some(IoBuffer {
        iova: BASE,
        len: 512,
    });
    s.submit(Op::Read, 0, 1, buf, 1, &mem).expect("room");
    let d = DataHeader {
        cccid: 1 << SLOT_BITS,
        ttag: 0,
        offset: 0,
        length: 512,
    };
    let h = OutHeader::data(
        PduType::C2HData,
        &d,
        flags::LAST_PDU | flags::SUCCESS,
        BOTH,
        0,
    );
    let mut bytes = h.as_slice().to_vec();
    bytes.extend_from_slice(&[7u8; 512]);
    bytes.extend_from_slice(&(pdu::crc32c(&[7u8; 512]) ^ 1).to_le_bytes());
    let mut done = Vec::new();
    let mut on_done = |c: Completion| done.push(c.result);
    s.receive_from(&mut Gated(&bytes), &mem, &mut on_done);
    assert_eq!(done, [Err(Failure::DataDigest)]);
    assert!(s.ready());
}

#[test]
fn a_command_past_its_timeout_ends_the_queue() {
    let (mut s, mem) = scripted(pdu::Digests::default());
    let buf = Some(IoBuffer {
        iova: BASE,
        len: 512,
    });
    s.set_now(10);
    s.submit(Op::Read, 0, 1, buf, 1, &mem).expect("room");
    s.set_now(500_000_000);
    s.submit(Op::Read, 0, 1, buf, 2, &mem).expect("room");
    s.check_timeouts();
    assert_eq!(s.ended(), None);
    s.set_now(1_100_000_000);
    s.check_timeouts();
    let mut done = Vec::new();
    s.deliver(&mut |c: Completion| done.push((c.token, c.result)));
    done.sort_by_key(|d| d.0);
    assert_eq!(
        done,
        [(1, Err(Failure::TimedOut)), (2, Err(Failure::Aborted))]
    );
}

/// What a good target sends for a read (slot 0), an in-capsule write (1) and an R2T
/// write (2), all in generation 1.
fn good_answers(digests: pdu::Digests) -> Vec<u8> {
    let g = 1 << SLOT_BITS;
    let mut out = Vec::new();
    let mut pdu_with = |h: OutHeader, data: &[u8]| append_pdu(&mut out, &h, data, digests);
    let d = |cccid, offset, length| DataHeader {
        cccid,
        ttag: 5,
        offset,
        length,
    };
    pdu_with(
        OutHeader::data(PduType::C2HData, &d(g, 0, 512), flags::LAST_PDU, digests, 0),
        &[3u8; 512],
    );
    pdu_with(OutHeader::r2t(&d(g + 2, 0, 16384), digests), &[]);
    for cid in [g, g + 1, g + 2] {
        let cqe = Cqe::new(0, 0, 1, cid, Status::SUCCESS, false);
        pdu_with(OutHeader::capsule_resp(&cqe, digests), &[]);
    }
    out
}

#[test]
fn mutated_target_streams_never_panic_and_every_io_completes_once() {
    let mut rng = fastrand::Rng::with_seed(16);
    for round in 0..3000 {
        let digests = if round % 2 == 0 {
            BOTH
        } else {
            pdu::Digests::default()
        };
        let (mut s, mem) = scripted(digests);
        let buf = |at: u64, len| {
            Some(IoBuffer {
                iova: BASE + at,
                len,
            })
        };
        s.submit(Op::Read, 0, 1, buf(0, 512), 0, &mem)
            .expect("room");
        s.submit(Op::Write, 0, 1, buf(0x1000, 512), 1, &mem)
            .expect("room");
        s.submit(Op::Write, 0, 32, buf(0x10000, 16384), 2, &mem)
            .expect("room");
        s.transmit(&mut Vec::new(), &mem).expect("memory");
        let mut stream = good_answers(digests);
        if round > 0 {
            for _ in 0..rng.usize(1..4) {
                let at = rng.usize(..stream.len());
                match rng.u8(..3) {
                    0 => stream[at] ^= 1 << rng.u8(..8),
                    1 => stream[at] = rng.u8(..),
                    _ => stream.truncate(at),
                }
                if stream.is_empty() {
                    break;
                }
            }
        }
        let mut done = Vec::new();
        let mut on_done = |c: Completion| done.push((c.token, c.result));
        let mut rest = &stream[..];
        while !rest.is_empty() && s.ended().is_none() {
            let n = rng.usize(1..=rest.len().min(700));
            s.receive_from(&mut Gated(&rest[..n]), &mem, &mut on_done);
            s.transmit(&mut Vec::new(), &mem).expect("memory");
            s.deliver(&mut on_done);
            rest = &rest[n..];
        }
        s.close();
        s.deliver(&mut on_done);
        done.sort_by_key(|d| d.0);
        let tokens: Vec<u64> = done.iter().map(|d| d.0).collect();
        assert_eq!(tokens, [0, 1, 2], "round {round}: every I/O completes once");
        if round == 0 {
            assert!(done.iter().all(|d| d.1.is_ok()), "{done:?}");
        }
        assert_eq!(s.in_flight(), 0);
    }
}

/// The CIDs of the command capsules in `wire` (no digests), the Connect's left out.
fn capsule_cids(wire: &[u8]) -> Vec<u16> {
    let mut cids = Vec::new();
    let mut at = 0;
    while at + 8 + 64 <= wire.len() {
        let plen = u32::from_le_bytes([wire[at + 4], wire[at + 5], wire[at + 6], wire[at + 7]]);
        let cid = u16::from_le_bytes([wire[at + 10], wire[at + 11]]);
        if cid != CONNECT_CID {
            cids.push(cid);
        }
        at += plen as usize;
    }
    cids
}

/// The target answers `cid` with `status`.
fn answer(s: &mut Session, mem: &IovaMemory, cid: u16, status: Status) -> Vec<Completion> {
    let cqe = Cqe::new(0, 0, 1, cid, status, false);
    let h = OutHeader::capsule_resp(&cqe, pdu::Digests::default());
    let mut done = Vec::new();
    let mut on_done = |c: Completion| done.push(c);
    s.receive_from(&mut Gated(h.as_slice()), mem, &mut on_done);
    s.deliver(&mut on_done);
    done
}

#[test]
fn unfinished_ios_of_an_ended_queue_are_kept_and_sent_again_with_their_first_stamp() {
    let (mut s, mem) = scripted(pdu::Digests::default());
    s.keep_unfinished(true);
    let buf = Some(IoBuffer {
        iova: BASE,
        len: 512,
    });
    s.set_now(100);
    s.submit(Op::Write, 9, 1, buf, 1, &mem).expect("room");
    s.submit(Op::Flush, 0, 0, None, 2, &mem).expect("room");
    s.submit(Op::Write, 11, 1, buf, 3, &mem).expect("room");
    let mut wire = Vec::new();
    s.transmit(&mut wire, &mem).expect("memory");
    let cids = capsule_cids(&wire);
    assert_eq!(cids.len(), 3, "{cids:?}");
    // the first completes; then the connection goes
    let done = answer(&mut s, &mem, cids[0], Status::SUCCESS);
    assert_eq!(done.len(), 1);
    assert_eq!((done[0].token, done[0].result), (1, Ok(())));
    s.peer_gone();
    let mut failed = Vec::new();
    s.deliver(&mut |c| failed.push(c));
    assert!(failed.is_empty(), "kept, not failed: {failed:?}");
    let mut kept = Vec::new();
    s.take_unfinished(|u| kept.push(u));
    kept.sort_by_key(|u| u.token);
    assert_eq!(s.in_flight(), 0);
    let ns = IoNamespace {
        nsid: 1,
        block_size: 512,
    };
    assert_eq!(
        kept,
        [
            Unfinished {
                ns,
                op: Op::Flush,
                slba: 0,
                blocks: 0,
                buf: None,
                token: 2,
                since_ns: 100
            },
            Unfinished {
                ns,
                op: Op::Write,
                slba: 11,
                blocks: 1,
                buf,
                token: 3,
                since_ns: 100
            },
        ]
    );
    // a new connection sends them again; their latency counts from the first submission
    let (mut again, mem) = scripted(pdu::Digests::default());
    again.set_now(900);
    for u in &kept {
        again.resubmit(*u, &mem).expect("room");
    }
    let mut wire = Vec::new();
    again.transmit(&mut wire, &mem).expect("memory");
    let mut done = Vec::new();
    for cid in capsule_cids(&wire) {
        done.extend(answer(&mut again, &mem, cid, Status::SUCCESS));
    }
    let got: Vec<(u64, u64, Result<(), Failure>)> = done
        .iter()
        .map(|c| (c.token, c.submitted_ns, c.result))
        .collect();
    assert_eq!(got, [(2, 100, Ok(())), (3, 100, Ok(()))]);
}

#[test]
fn with_other_paths_an_io_refused_for_a_path_reason_is_kept_to_go_the_other_way() {
    let (mut s, mem) = scripted(pdu::Digests::default());
    s.reroute_path_errors();
    let buf = Some(IoBuffer {
        iova: BASE,
        len: 512,
    });
    s.submit(Op::Write, 5, 1, buf, 1, &mem).expect("room");
    s.submit(Op::Write, 6, 1, buf, 2, &mem).expect("room");
    let mut wire = Vec::new();
    s.transmit(&mut wire, &mem).expect("memory");
    let cids = capsule_cids(&wire);
    assert!(answer(&mut s, &mem, cids[0], Status::ANA_INACCESSIBLE).is_empty());
    // a status of the command itself completes it as ever
    let done = answer(&mut s, &mem, cids[1], Status::LBA_OUT_OF_RANGE);
    assert_eq!(done.len(), 1);
    assert_eq!(
        (done[0].token, done[0].result),
        (2, Err(Failure::Status(Status::LBA_OUT_OF_RANGE)))
    );
    let mut rerouted = Vec::new();
    s.take_rerouted(|u, status| rerouted.push((u.token, u.slba, status)));
    assert_eq!(rerouted, [(1, 5, Status::ANA_INACCESSIBLE)]);
    assert_eq!(s.in_flight(), 0);
}
