//! The body of the fuzz target `nvme_tcp_host`: arbitrary bytes from a target, fed to the host
//! side's one PDU engine ([`Session`]) on an admin queue: ICResp, the Connect response, then
//! CapsuleResp, C2HData, R2T and C2HTermReq for up to four commands in flight. Only the socket
//! is replaced (bytes in memory, handed over in pieces as a socket would). Must never panic;
//! every command must complete exactly once.

use usnvme_driver::spec::fabrics::CNTLID_DYNAMIC;
use usnvme_driver::spec::{PropertySize, Sqe};
use usnvme_driver::IoBuffer;
use usnvme_hugepages::IovaMemory;
use vm_memory::{Bytes, GuestAddress};

use crate::fabric::discovery::parse_discovery_log;
use crate::fabric::pdu::Digests;
use crate::transport::tcp::initiator::session::{
    Completion, Data, QueueParams, Session, ADMIN_IN_CAPSULE,
};
use crate::transport::tcp::initiator::{Gated, HostOptions};

/// Where command `k`'s buffer is: 16 KiB each.
const BASE: u64 = 0x10_0000;
const SPAN: u64 = 0x4000;
/// The most bytes the target's side hands over at once.
const PIECE: usize = 700;

/// Command `kind`: Property Get, a 4 KiB read, a 512-byte write in the capsule, a 16 KiB
/// write by R2T.
fn command(kind: u8, slot: u64) -> (Sqe, Data) {
    let at = |len| IoBuffer {
        iova: BASE + slot * SPAN,
        len,
    };
    match kind {
        0 => (Sqe::property_get(0, PropertySize::Eight), Data::None),
        1 => (Sqe::new(0x02), Data::FromController(at(4096))),
        2 => (Sqe::write(1, 0, 1), Data::ToController(at(512))),
        _ => (Sqe::write(1, 0, 32), Data::ToController(at(16384))),
    }
}

/// Runs the fuzz input: byte 0 chooses the digests asked for, byte 1 the commands (two bits
/// each), the rest is what the target sends. Returns how many commands succeeded.
pub fn fuzz_host(bytes: &[u8]) -> usize {
    let (&[digests, kinds], stream) = bytes.split_at(bytes.len().min(2)) else {
        return 0;
    };
    let host = HostOptions {
        digests: Digests {
            header: digests & 1 != 0,
            data: digests & 2 != 0,
        },
        ..HostOptions::default()
    };
    let params = QueueParams {
        subnqn: "nqn.2024-01.dev.usnvme:fuzz".into(),
        qid: 0,
        cntlid: CNTLID_DYNAMIC,
        entries: 4,
        nsid: 1,
        block_size: 512,
        in_capsule: ADMIN_IN_CAPSULE,
        max_transfer: SPAN as u32,
        timeout_ns: u64::MAX,
    };
    let (Ok(mut s), Ok(mem)) = (
        Session::new(params, &host),
        IovaMemory::from_ranges(&[(GuestAddress(BASE), 4 * SPAN as usize)]),
    ) else {
        return 0;
    };
    let mut results = [None; 4];
    let mut on_done = |c: Completion| {
        if let Some(r) = results.get_mut(c.token as usize) {
            assert!(r.is_none(), "command {} completed twice", c.token);
            *r = Some(c.result.is_ok());
        }
    };
    let mut submitted = false;
    let mut rest = stream;
    loop {
        // what the host sends goes nowhere
        if s.transmit(&mut Vec::new(), &mem).is_err() {
            break;
        }
        if s.ready() && !submitted {
            submitted = true;
            for k in 0..4u8 {
                let (sqe, data) = command((kinds >> (2 * k)) & 3, u64::from(k));
                assert!(s.submit_command(sqe, data, u64::from(k), &mem).is_ok());
            }
            continue;
        }
        s.deliver(&mut on_done);
        if rest.is_empty() || s.ended().is_some() {
            break;
        }
        // until the commands are out, a byte at a time: what follows the Connect response
        // answers them
        let most = if submitted { PIECE } else { 1 };
        let (piece, after) = rest.split_at(rest.len().min(most));
        let mut wire = Gated(piece);
        s.receive_from(&mut wire, &mem, &mut on_done);
        rest = after;
    }
    s.close();
    s.deliver(&mut on_done);
    if submitted {
        assert!(results.iter().all(Option::is_some), "{results:?}");
        assert_eq!(s.in_flight(), 0);
    }
    // what a read returned goes through the log parser the remote controller uses
    let mut read = vec![0u8; 4096];
    if mem.read_slice(&mut read, GuestAddress(BASE + SPAN)).is_ok() {
        let _ = parse_discovery_log(&read);
    }
    results.iter().filter(|r| **r == Some(true)).count()
}

#[cfg(test)]
mod tests {
    use usnvme_driver::spec::{Cqe, Status};

    use super::*;
    use crate::fabric::pdu::{flags, term_req, DataHeader, FatalError, IcResp, OutHeader, PduType};
    use crate::transport::tcp::initiator::testing::append_pdu;

    const BOTH: Digests = Digests {
        header: true,
        data: true,
    };
    /// Command `k`'s ID: slot `k` in its first generation.
    const fn cid(k: u16) -> u16 {
        k | 1 << 10
    }

    fn ic_resp(digests: Digests) -> Vec<u8> {
        IcResp {
            pfv: 0,
            cpda: 0,
            digests,
            maxh2cdata: 8192,
        }
        .encode()
        .to_vec()
    }

    fn resp(out: &mut Vec<u8>, cid: u16, digests: Digests) {
        let cqe = Cqe::new(1, 1, 0, cid, Status::SUCCESS, false);
        append_pdu(out, &OutHeader::capsule_resp(&cqe, digests), &[], digests);
    }

    fn c2h(out: &mut Vec<u8>, cid: u16, offset: u32, data: &[u8], f: u8, digests: Digests) {
        let d = DataHeader {
            cccid: cid,
            ttag: 0,
            offset,
            length: data.len() as u32,
        };
        let h = OutHeader::data(PduType::C2HData, &d, f, digests, 0);
        append_pdu(out, &h, data, digests);
    }

    fn r2t(out: &mut Vec<u8>, cid: u16, offset: u32, length: u32, digests: Digests) {
        let d = DataHeader {
            cccid: cid,
            ttag: 1,
            offset,
            length,
        };
        append_pdu(out, &OutHeader::r2t(&d, digests), &[], digests);
    }

    /// The set-up answered (ICResp, the Connect response) as a good target would.
    fn connected(selector: u8, kinds: u8, digests: Digests) -> Vec<u8> {
        let mut b = vec![selector, kinds];
        b.extend_from_slice(&ic_resp(digests));
        resp(&mut b, 0, digests);
        b
    }

    /// Every command kind once (0b11_10_01_00: Property Get, read, small write, R2T write),
    /// answered as a good target would.
    fn good_session(digests: Digests) -> Vec<u8> {
        let selector = u8::from(digests.header) | u8::from(digests.data) << 1;
        let mut b = connected(selector, 0b11_10_01_00, digests);
        resp(&mut b, cid(0), digests);
        c2h(&mut b, cid(1), 0, &[7u8; 2048], 0, digests);
        let last = flags::LAST_PDU | flags::SUCCESS;
        c2h(&mut b, cid(1), 2048, &[7u8; 2048], last, digests);
        resp(&mut b, cid(2), digests);
        // one R2T at a time (MAXR2T 0): all of it, sent as two H2CData of MAXH2CDATA
        r2t(&mut b, cid(3), 0, 16384, digests);
        resp(&mut b, cid(3), digests);
        b
    }

    #[test]
    fn a_good_session_completes_every_command() {
        for digests in [Digests::default(), BOTH] {
            assert_eq!(fuzz_host(&good_session(digests)), 4, "{digests:?}");
        }
    }

    #[test]
    fn bad_pdus_end_the_session_where_they_are() {
        let plain = Digests::default();
        let good = good_session(plain);
        // cut anywhere: what was answered before the cut completes, nothing panics
        for cut in 0..good.len() {
            assert!(fuzz_host(&good[..cut]) <= 4);
        }
        // digests asked, none granted: ICResp refused
        let mut b = good.clone();
        b[0] = 3;
        assert_eq!(fuzz_host(&b), 0);
        // a response for a command not in flight, a wrong HLEN, a C2HTermReq
        let first = connected(0, 0, plain).len();
        let mut b = good.clone();
        b[first + 8 + 12] ^= 0x7f; // CID of the first CapsuleResp (CQE byte 12)
        assert_eq!(fuzz_host(&b), 0);
        let mut b = good.clone();
        b[first + 2] = 23;
        assert_eq!(fuzz_host(&b), 0);
        let mut b = good[..first].to_vec();
        let e = FatalError::InvalidHeaderField {
            offset: 0,
            field: "PDU-Type",
        };
        b.extend_from_slice(&term_req(PduType::C2HTermReq, &e, &[0u8; 8]));
        assert_eq!(fuzz_host(&b), 0);
        // a C2HData far beyond the read, an R2T beyond the write
        let mut b = connected(0, 0b01_01_01_01, plain);
        c2h(&mut b, cid(0), 8192, &[0u8; 64], flags::LAST_PDU, plain);
        assert_eq!(fuzz_host(&b), 0);
        let mut b = connected(0, 0b11_11_11_11, plain);
        r2t(&mut b, cid(0), 16000, 8192, plain);
        assert_eq!(fuzz_host(&b), 0);
    }

    #[test]
    fn random_bytes_never_panic() {
        let mut rng = fastrand::Rng::with_seed(16);
        let good = good_session(BOTH);
        for _ in 0..2000 {
            let mut b = if rng.bool() {
                good.clone()
            } else {
                let len = rng.usize(0..600);
                let mut b: Vec<u8> = (0..len).map(|_| rng.u8(..)).collect();
                // often a valid set-up, so the fuzz reaches the commands
                if rng.bool() && b.len() >= 2 {
                    let head = connected(b[0] & !3, b[1], Digests::default());
                    b.splice(..2, head);
                }
                b
            };
            for _ in 0..rng.usize(0..4) {
                if !b.is_empty() {
                    let at = rng.usize(..b.len());
                    b[at] = rng.u8(..);
                }
            }
            fuzz_host(&b);
        }
    }
}
