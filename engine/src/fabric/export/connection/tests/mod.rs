use std::sync::Arc;
use std::time::Instant;

use usnvme_driver::spec::command::Cns;
use usnvme_driver::spec::fabrics::{ConnectData, PropertySize, CNTLID_DYNAMIC};
use usnvme_driver::spec::{Cqe, IoOpcode, SglDescriptor, Sqe, Status};

use super::super::memory::{test_subsystem, MemoryBackend};
use super::*;
use crate::fabric::pdu::{
    self, flags, parse_term_req, DataHeader, Digests, IcReq, OutHeader, PduType, DIGEST,
    SHORT_HEADER,
};

mod commands;
mod ending;
mod rdma;
mod stream;
mod waiting;

const HOST: &str = "nqn.2024-01.io.usnvme:host-a";

/// A connection, its backend, and the host side of the test.
struct Bed {
    conn: Connection,
    backend: MemoryBackend,
    digests: Digests,
    sub: Arc<SubsystemInfo>,
    /// The flags of every C2HData PDU taken, in order.
    c2h_flags: Vec<u8>,
}

/// What the target sent, PDU by PDU.
#[derive(Debug)]
enum Got {
    Resp(Cqe),
    Data(DataHeader, Vec<u8>),
    R2T(DataHeader),
    Term(u16, u32),
    IcResp,
}

impl Got {
    fn clone_r2t(&self) -> Got {
        match self {
            Got::R2T(d) => Got::R2T(*d),
            _ => Got::IcResp,
        }
    }
}

impl Bed {
    fn new(allowed: Option<Vec<String>>, digests: Digests) -> Bed {
        let sub = Arc::new(SubsystemInfo {
            allowed_hosts: allowed,
            ..test_subsystem(2)
        });
        let backend = MemoryBackend::new(&sub);
        let conn = Connection::new(
            Subsystems::one(sub.clone()),
            Arc::new(Registry::new()),
            ConnectionLimits { maxh2cdata: 4096 },
            "test".into(),
        );
        let mut bed = Bed {
            conn,
            backend,
            digests,
            sub,
            c2h_flags: Vec::new(),
        };
        let req = IcReq {
            pfv: 0,
            hpda: 0,
            digests,
            maxr2t: 0,
        };
        bed.send(&req.encode());
        assert!(matches!(bed.take()[..], [Got::IcResp]));
        bed
    }

    fn send(&mut self, bytes: &[u8]) {
        // in odd pieces: the state machine must not care how TCP cuts the stream
        for piece in bytes.chunks(7) {
            self.conn.receive(piece, &mut self.backend);
        }
        self.backend.complete_all(&mut self.conn);
    }

    /// All at once, as a socket with everything arrived gives it.
    fn send_whole(&mut self, bytes: &[u8]) {
        assert_eq!(self.conn.receive(bytes, &mut self.backend), bytes.len());
        self.backend.complete_all(&mut self.conn);
    }

    /// A command capsule with `data` in it, as this bed's host sends it (its digests; PSDT
    /// 01b, which a host's transport writes into every command it sends).
    fn capsule_pdu(&self, sqe: &Sqe, data: &[u8]) -> Vec<u8> {
        let mut sqe = *sqe;
        sqe.set_psdt(usnvme_driver::spec::command::PSDT_SGL);
        self.capsule_raw_pdu(&sqe, data)
    }

    /// A command capsule with `sqe` as it is.
    fn capsule_raw_pdu(&self, sqe: &Sqe, data: &[u8]) -> Vec<u8> {
        let h = OutHeader::capsule_cmd(sqe, data.len(), self.digests);
        let mut pdu = h.as_slice().to_vec();
        pdu.resize(pdu.len() + h.pad(), 0);
        pdu.extend_from_slice(data);
        if self.digests.data && !data.is_empty() {
            pdu.extend_from_slice(&pdu::crc32c(data).to_le_bytes());
        }
        pdu
    }

    fn capsule_whole(&mut self, sqe: &Sqe, data: &[u8]) {
        let pdu = self.capsule_pdu(sqe, data);
        self.send_whole(&pdu);
    }

    fn capsule(&mut self, sqe: &Sqe, data: &[u8]) {
        let pdu = self.capsule_pdu(sqe, data);
        self.send(&pdu);
    }

    fn take(&mut self) -> Vec<Got> {
        let mut out = Vec::new();
        self.conn
            .transmit(&mut out, &mut self.backend)
            .expect("memory takes all");
        let mut got = Vec::new();
        let mut at = 0;
        while at < out.len() {
            let plen = u32::from_le_bytes(out[at + 4..at + 8].try_into().unwrap()) as usize;
            let pdu = &out[at..at + plen];
            let hd = if pdu[1] & flags::HDGST != 0 {
                DIGEST
            } else {
                0
            };
            got.push(match PduType::from_raw(pdu[0]) {
                Some(PduType::IcResp) => Got::IcResp,
                Some(PduType::CapsuleResp) => {
                    if hd > 0 {
                        pdu::check_header_digest(pdu, SHORT_HEADER).expect("digest");
                    }
                    Got::Resp(Cqe::from_slice(&pdu[8..24]).unwrap())
                }
                Some(PduType::C2HData) => {
                    self.c2h_flags.push(pdu[1]);
                    let d = DataHeader::parse(pdu).unwrap();
                    let from = pdu[3] as usize;
                    let data = pdu[from..from + d.length as usize].to_vec();
                    if pdu[1] & flags::DDGST != 0 {
                        let dd = &pdu[from + data.len()..from + data.len() + 4];
                        assert_eq!(
                            u32::from_le_bytes(dd.try_into().unwrap()),
                            pdu::crc32c(&data)
                        );
                    }
                    Got::Data(d, data)
                }
                Some(PduType::R2T) => Got::R2T(DataHeader::parse(pdu).unwrap()),
                Some(PduType::C2HTermReq) => {
                    let (fes, fei) = parse_term_req(pdu).unwrap();
                    Got::Term(fes, fei)
                }
                other => panic!("unexpected {other:?}"),
            });
            at += plen;
        }
        got
    }

    fn status(&mut self) -> Status {
        match self.take().last() {
            Some(Got::Resp(c)) => c.status(),
            other => panic!("no response: {other:?}"),
        }
    }

    fn connect(&mut self, qid: u16, cntlid: u16, subnqn: &str, host: &str) -> Cqe {
        self.connect_with(qid, cntlid, subnqn, host, 0)
    }

    /// A Connect with connect attributes `cattr`.
    fn connect_with(&mut self, qid: u16, cntlid: u16, subnqn: &str, host: &str, cattr: u8) -> Cqe {
        // 16 entries, no Keep Alive
        let mut sqe = Sqe::connect(qid, 16, cattr, 0);
        sqe.set_sgl(SglDescriptor::in_capsule(ConnectData::SIZE as u32));
        let data = ConnectData::new([0; 16], cntlid, subnqn, host).expect("NQNs that fit");
        self.capsule(&sqe, data.as_bytes());
        match self.take().last() {
            Some(Got::Resp(c)) => *c,
            other => panic!("no response: {other:?}"),
        }
    }

    /// CC.EN with the NVM command set and 64/16-byte queue entries.
    fn enable(&mut self) {
        let cc = 1u64 | 6 << 16 | 4 << 20;
        let sqe = Sqe::property_set(0x14, PropertySize::Four, cc);
        self.capsule(&sqe, &[]);
        assert_eq!(self.status(), Status::SUCCESS);
    }

    /// An I/O command on namespace 1: its data in the capsule (`transport` 0, the SGL as
    /// long as the blocks) or `transport` bytes moved by the transport.
    fn io(&mut self, opcode: impl Into<u8>, slba: u64, blocks: u32, transport: u32) -> Sqe {
        let mut sqe = Sqe::new(opcode.into());
        sqe.nsid = 1;
        sqe.cdw10 = slba as u32;
        sqe.cdw11 = (slba >> 32) as u32;
        sqe.cdw12 = blocks - 1;
        sqe.set_sgl(if transport > 0 {
            SglDescriptor::transport(transport)
        } else {
            SglDescriptor::in_capsule(blocks * 512)
        });
        sqe
    }

    /// A connection whose admin queue is connected and enabled; the controller's ID.
    fn admin_queue(digests: Digests) -> (Bed, u16) {
        let mut admin = Bed::new(None, digests);
        let nqn = admin.sub.nqn.clone();
        let connected = admin.connect(0, CNTLID_DYNAMIC, &nqn, HOST);
        assert_eq!(connected.status(), Status::SUCCESS);
        admin.enable();
        (admin, connected.dw0 as u16)
    }

    /// An admin queue connected and enabled, then an I/O queue on a second connection.
    fn io_queue(digests: Digests) -> Bed {
        let (admin, cntlid) = Bed::admin_queue(digests);
        let mut io = Bed::new(None, digests);
        io.conn.registry = admin.conn.registry.clone();
        let cqe = io.connect(1, cntlid, &io.sub.nqn.clone(), HOST);
        assert_eq!(cqe.status(), Status::SUCCESS);
        io
    }
}

/// Identify Controller, its 4 KiB sent by C2HData.
fn identify_controller() -> Sqe {
    let mut sqe = Sqe::identify(Cns::Controller, 0);
    sqe.set_sgl(SglDescriptor::transport(4096));
    sqe
}

fn both() -> Digests {
    Digests {
        header: true,
        data: true,
    }
}

/// One H2CData PDU with `data` at `offset` of transfer `ttag` of command `cid`.
fn h2c_pdu(cid: u16, ttag: u16, offset: u32, data: &[u8], last: bool, dg: Digests) -> Vec<u8> {
    let d = DataHeader {
        cccid: cid,
        ttag,
        offset,
        length: data.len() as u32,
    };
    let flag = if last { flags::LAST_PDU } else { 0 };
    let h = OutHeader::data(PduType::H2CData, &d, flag, dg, 0);
    let mut pdu = h.as_slice().to_vec();
    pdu.resize(pdu.len() + h.pad(), 0);
    pdu.extend_from_slice(data);
    if dg.data {
        pdu.extend_from_slice(&pdu::crc32c(data).to_le_bytes());
    }
    pdu
}
