//! The NVMe/TCP target allocates nothing per command: after a warm-up, reads, in-capsule and
//! R2T writes, Identify, Get Log Page (SMART, answered asynchronously) and a TermReq run through a connection (on its memory
//! backend, the same state machine the reactors drive) with no heap allocation on this
//! thread, counted by a global allocator that only this test binary has.

use std::sync::Arc;

use usnvme_driver::spec::{Cqe, Sqe, Status};
use usnvme_engine::fabric::export::connection::{Connection, ConnectionLimits};
use usnvme_engine::fabric::export::memory::{test_subsystem, MemoryBackend};
use usnvme_engine::fabric::export::registry::Registry;
use usnvme_engine::fabric::export::Subsystems;
use usnvme_engine::fabric::pdu::{
    self, flags, DataHeader, IcReq, OutHeader, PduType, SHORT_HEADER,
};

mod common;
use common::pdus::{capsule, connect, enable, sgl, DIGESTS};
use common::{allocations, assert_counting};

const HOST: &str = "nqn.2024-01.io.usnvme:host-a";

/// The responses' statuses in `out` (CapsuleResp PDUs only), and the C2HData bytes seen.
fn statuses(out: &[u8], into: &mut Vec<Status>) -> usize {
    let (mut at, mut data) = (0, 0);
    while at + 8 <= out.len() {
        let plen = u32::from_le_bytes(out[at + 4..at + 8].try_into().expect("4")) as usize;
        match PduType::from_raw(out[at]) {
            Some(PduType::CapsuleResp) => {
                let cqe = Cqe::from_slice(&out[at + 8..at + 24]).expect("a CQE");
                into.push(cqe.status());
            }
            Some(PduType::C2HData) => data += plen,
            _ => {}
        }
        at += plen;
    }
    data
}

#[test]
fn commands_allocate_nothing_once_warm() {
    assert_counting();
    for digests in DIGESTS {
        let sub = Arc::new(test_subsystem(1));
        let registry = Arc::new(Registry::new());
        let limits = ConnectionLimits { maxh2cdata: 16384 };
        let ic = IcReq {
            pfv: 0,
            hpda: 0,
            digests,
            maxr2t: 0,
        }
        .encode();
        let mut backend = MemoryBackend::new(&sub);
        let mut out = Vec::with_capacity(1 << 20);
        let mut seen = Vec::with_capacity(1 << 16);

        // an admin queue, enabled
        let mut admin = Connection::new(
            Subsystems::one(sub.clone()),
            registry.clone(),
            limits,
            "a".into(),
        );
        admin.receive(&ic, &mut backend);
        admin.receive(&connect(0, 0xffff, &sub.nqn, HOST, digests), &mut backend);
        admin.receive(&capsule(&enable(), &[], digests), &mut backend);
        admin.transmit(&mut out, &mut backend).expect("memory");
        // (the controller ID of the first controller is 1)
        let mut io = Connection::new(
            Subsystems::one(sub.clone()),
            registry.clone(),
            limits,
            "i".into(),
        );
        io.receive(&ic, &mut backend);
        io.receive(&connect(1, 1, &sub.nqn, HOST, digests), &mut backend);
        out.clear();
        io.transmit(&mut out, &mut backend).expect("memory");
        seen.clear();
        statuses(&out, &mut seen);
        assert_eq!(seen, [Status::SUCCESS], "the I/O queue connected");

        // What one round sends: identify and SMART on the admin queue; on the I/O queue an
        // in-capsule write, an R2T write (its H2CData built from the R2T's TTAG, which is
        // slot 0 once the first write is done), a read of each.
        let mut identify = Sqe::new(0x06);
        identify.cdw10 = 1;
        sgl(&mut identify, 0x5a, 4096);
        let mut smart = Sqe::get_log_page_raw(2, u32::MAX, 512, 0);
        sgl(&mut smart, 0x5a, 512);
        let admin_pdus = [
            capsule(&identify, &[], digests),
            capsule(&smart, &[], digests),
        ];
        let io_cmd = |opcode: u8, slba: u64, blocks: u32, transport: bool, cid: u16| {
            let mut sqe = Sqe::new(opcode);
            sqe.nsid = 1;
            sqe.cdw10 = slba as u32;
            sqe.cdw12 = blocks - 1;
            sqe.set_cid(cid);
            sgl(&mut sqe, if transport { 0x5a } else { 0x01 }, blocks * 512);
            sqe
        };
        let small = vec![0x11u8; 4096];
        let big = vec![0x22u8; 16384];
        let write_small = capsule(&io_cmd(0x01, 0, 8, false, 1), &small, digests);
        let write_big = capsule(&io_cmd(0x01, 64, 32, true, 2), &[], digests);
        let d = DataHeader {
            cccid: 2,
            ttag: 0,
            offset: 0,
            length: big.len() as u32,
        };
        let h = OutHeader::data(PduType::H2CData, &d, flags::LAST_PDU, digests, 0);
        let mut h2c = h.as_slice().to_vec();
        h2c.resize(h2c.len() + h.pad(), 0);
        h2c.extend_from_slice(&big);
        if digests.data {
            h2c.extend_from_slice(&pdu::crc32c(&big).to_le_bytes());
        }
        let reads = [
            capsule(&io_cmd(0x02, 0, 8, true, 3), &[], digests),
            capsule(&io_cmd(0x02, 64, 32, true, 4), &[], digests),
        ];

        let mut round = |backend: &mut MemoryBackend, out: &mut Vec<u8>, seen: &mut Vec<Status>| {
            for p in &admin_pdus {
                admin.receive(p, backend);
            }
            admin.tick(std::time::Instant::now(), backend); // (SMART's answer comes here)
            io.receive(&write_small, backend);
            backend.complete_all(&mut io);
            io.receive(&write_big, backend);
            io.receive(&h2c, backend);
            backend.complete_all(&mut io);
            for r in &reads {
                io.receive(r, backend);
            }
            backend.complete_all(&mut io);
            out.clear();
            admin.transmit(out, backend).expect("memory");
            io.transmit(out, backend).expect("memory");
            statuses(out, seen)
        };
        for _ in 0..3 {
            round(&mut backend, &mut out, &mut seen); // warm-up
        }
        seen.clear();
        let before = allocations();
        let mut data = 0;
        for _ in 0..100 {
            data += round(&mut backend, &mut out, &mut seen);
        }
        let allocated = allocations() - before;
        assert_eq!(
            allocated, 0,
            "heap allocations in 100 rounds, digests {digests:?}"
        );
        assert_eq!(seen.len(), 100 * 6);
        assert!(seen.iter().all(|s| *s == Status::SUCCESS), "{seen:?}");
        let hd = if digests.header { 4 } else { 0 };
        let dd = if digests.data { 4 } else { 0 };
        let per_round = [4096, 512, 4096, 16384]
            .iter()
            .map(|n| SHORT_HEADER + hd + n + dd)
            .sum::<usize>();
        assert_eq!(data, 100 * per_round, "every C2HData came");
        assert_eq!(backend.buffers_held(), 0);

        // a malformed PDU: the TermReq is built without allocating either
        let before = allocations();
        io.receive(&[0x42, 0, 24, 0, 24, 0, 0, 0], &mut backend);
        out.clear();
        io.transmit(&mut out, &mut backend).expect("memory");
        assert_eq!(PduType::from_raw(out[0]), Some(PduType::C2HTermReq));
        // (closing logs why: one String per connection, not per command)
        assert!(allocations() - before <= 2, "the TermReq allocated");
    }
}
