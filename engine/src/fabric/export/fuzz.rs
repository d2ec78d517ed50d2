//! The bodies of the target's fuzz targets (`driver/fuzz`: `nvme_tcp_target`,
//! `nvme_tcp_commands`), run on the connection's state machine over the memory backend:
//!
//! - [`fuzz_connection`]: arbitrary bytes from a host. Nothing panics, every buffer comes back.
//! - [`fuzz_commands`]: arbitrary commands — any opcode, NSID, dwords, PSDT, FUSE and SGL —
//!   sent by a host whose transport is well behaved (it frames every capsule right, answers
//!   every R2T, keeps to its queues' sizes) on an admin queue and an I/O queue of one
//!   controller, with buffers and the device queue made scarce. Every command gets exactly
//!   one response (a held Asynchronous Event Request when the controller goes away), no
//!   well-framed capsule ends the connection, and data PDUs go only to commands that asked for
//!   data, within what their SGL describes, never empty.

use std::sync::Arc;
use std::time::Instant;

use usnvme_driver::spec::command::PSDT_SGL;
use usnvme_driver::spec::fabrics::{
    ConnectData, PropertySize, CNTLID_DYNAMIC, FABRICS_OPCODE, SGL_TRANSPORT,
};
use usnvme_driver::spec::{Cqe, SglDescriptor, Sqe, Status};

use super::connection::{Connection, ConnectionLimits};
use super::memory::{test_subsystem, MemoryBackend};
use super::registry::Registry;
use super::{SubsystemInfo, Subsystems};
use crate::fabric::pdu::{flags, DataHeader, Digests, IcReq, OutHeader, PduType};

/// Most data in one H2CData PDU the target takes (the fuzzed connections' MAXH2CDATA).
const MAXH2CDATA: u32 = 16384;

/// `bytes` from a host, fed in pieces of the sizes its first bytes choose, I/O completed
/// between pieces. Must never panic, and what the connection holds stays bounded.
pub fn fuzz_connection(bytes: &[u8]) {
    let sub = Arc::new(test_subsystem(2));
    let mut backend = MemoryBackend::new(&sub);
    let mut conn = Connection::new(
        Subsystems::one(sub.clone()),
        Arc::new(Registry::new()),
        ConnectionLimits {
            maxh2cdata: MAXH2CDATA,
        },
        "fuzz".into(),
    );
    let (sizes, mut rest) = bytes.split_at(bytes.len().min(4));
    let mut turn = 0usize;
    while !rest.is_empty() {
        let size = 1 + *sizes.get(turn % sizes.len().max(1)).unwrap_or(&255) as usize * 8;
        let (piece, after) = rest.split_at(rest.len().min(size));
        conn.receive(piece, &mut backend);
        backend.complete_all(&mut conn);
        conn.tick(Instant::now(), &mut backend);
        let _ = conn.transmit(&mut Vec::new(), &mut backend);
        rest = after;
        turn += 1;
    }
    conn.peer_gone("the fuzzer ended", &mut backend);
    backend.complete_all(&mut conn);
    assert_eq!(backend.buffers_held(), 0, "every buffer came back");
    assert!(conn.finished().is_some(), "a closed connection drains");
}

/// Bytes of input per command: a byte of choices, then the 64-byte SQE.
const COMMAND_BYTES: usize = 65;
/// The choices byte: the command goes to the I/O queue (else the admin queue) ...
const TO_IO_QUEUE: u8 = 1;
/// ... its PSDT and SGL stay as fuzzed, and nothing rides in the capsule (else they are set
/// as a host's transport sets them: PSDT 01b, the data in the capsule or a transport block)
const RAW_TRANSPORT: u8 = 1 << 1;
/// ... the transport block is as long as a read or write of the command's blocks needs
const LENGTH_OF_BLOCKS: u8 = 1 << 2;
/// ... its starting LBA falls in the namespaces (2048 blocks)
const LBA_IN_RANGE: u8 = 1 << 3;
/// ... the backend completes what it has and the queue is served before the next command
const SERVE_AFTER: u8 = 1 << 4;
/// ... with bits 5-6: 0, 512, 4096 or 8192 bytes of data in the capsule.
const DATA_SHIFT: u8 = 5;

/// A command sent and not answered yet.
#[derive(Debug, Clone, Copy)]
struct Sent {
    cid: u16,
    /// The transport data block's length, 0 without one: data PDUs must fit it.
    transport: u32,
    /// A Fabrics Disconnect: its queue ends once it is answered.
    disconnect: bool,
}

/// One queue of the fuzzed host: its connection, backend and commands in flight.
struct Queue {
    conn: Connection,
    backend: MemoryBackend,
    sent: Vec<Sent>,
    /// The queue ended (a Disconnect answered, or its controller gone): what it had in flight
    /// is not owed an answer.
    ended: bool,
}

/// Entries of each fuzzed queue (Connect's SQSIZE + 1).
const ENTRIES: usize = 32;

impl Queue {
    fn new(sub: &Arc<SubsystemInfo>, registry: &Arc<Registry>, choices: &[u8]) -> Queue {
        let mut backend = MemoryBackend::new(sub);
        backend.buffer_limit = 1 + choices.first().map_or(31, |&b| usize::from(b % 32));
        backend.queue_limit = 1 + choices.get(1).map_or(7, |&b| usize::from(b % 8));
        let limits = ConnectionLimits {
            maxh2cdata: MAXH2CDATA,
        };
        let conn = Connection::new(
            Subsystems::one(sub.clone()),
            registry.clone(),
            limits,
            "fuzz".into(),
        );
        Queue {
            conn,
            backend,
            sent: Vec::with_capacity(ENTRIES),
            ended: false,
        }
    }

    /// ICReq and Connect of queue `qid` of controller `cntlid`; the controller's ID.
    fn connect(&mut self, now: Instant, qid: u16, cntlid: u16, nqn: &str) -> u16 {
        let ic = IcReq {
            pfv: 0,
            hpda: 0,
            digests: Digests::default(),
            maxr2t: 0,
        };
        self.conn.receive(&ic.encode(), &mut self.backend);
        let mut sqe = Sqe::connect(qid, ENTRIES as u16, 0, 0);
        sqe.set_sgl(SglDescriptor::in_capsule(ConnectData::SIZE as u32));
        let host = "nqn.2024-01.io.usnvme:fuzz-host";
        let data = ConnectData::new([0; 16], cntlid, nqn, host).expect("NQNs that fit");
        let cqe = self.command(now, sqe, data.as_bytes());
        assert_eq!(cqe.status(), Status::SUCCESS, "Connect of queue {qid}");
        cqe.dw0 as u16
    }

    /// Sends one command and serves the queue until it is answered.
    fn command(&mut self, now: Instant, sqe: Sqe, data: &[u8]) -> Cqe {
        let mut answer = None;
        self.sent.push(Sent {
            cid: sqe.cid(),
            transport: 0,
            disconnect: false,
        });
        self.send(&sqe, data);
        for _ in 0..8 {
            self.serve(now, &mut |cqe| answer = Some(*cqe));
        }
        answer.expect("an answer")
    }

    fn send(&mut self, sqe: &Sqe, data: &[u8]) {
        let h = OutHeader::capsule_cmd(sqe, data.len(), Digests::default());
        let mut pdu = h.as_slice().to_vec();
        pdu.resize(pdu.len() + h.pad(), 0);
        pdu.extend_from_slice(data);
        let taken = self.conn.receive(&pdu, &mut self.backend);
        assert!(
            taken == pdu.len() || self.ended,
            "the capsule of CID {} was not taken whole",
            sqe.cid()
        );
    }

    /// Completes what the backend has, runs the timers (at `now`, so that none expires) and
    /// takes what the target sends: each response is checked against what was sent and handed
    /// to `answered`, each R2T answered with its data. True when anything happened.
    fn serve(&mut self, now: Instant, answered: &mut dyn FnMut(&Cqe)) -> bool {
        self.backend.complete_all(&mut self.conn);
        self.conn.tick(now, &mut self.backend);
        let mut out = Vec::new();
        let _ = self.conn.transmit(&mut out, &mut self.backend);
        let mut at = 0;
        while at + 8 <= out.len() {
            let plen = u32::from_le_bytes([out[at + 4], out[at + 5], out[at + 6], out[at + 7]]);
            let pdu = &out[at..at + plen as usize];
            at += plen as usize;
            match PduType::from_raw(pdu[0]) {
                Some(PduType::CapsuleResp) => {
                    let cqe = Cqe::from_slice(&pdu[8..24]).expect("a CQE");
                    self.answered(&cqe);
                    answered(&cqe);
                }
                Some(PduType::C2HData) => {
                    let d = DataHeader::parse(pdu).expect("a C2HData header");
                    let sent = self.find(d.cccid).expect("C2HData for a command in flight");
                    assert!(d.length > 0, "a C2HData PDU without data: {d:?}");
                    assert!(
                        d.offset + d.length <= sent.transport,
                        "C2HData beyond the SGL's {} bytes: {d:?}",
                        sent.transport
                    );
                    assert_eq!(pdu[1] & flags::SUCCESS, 0, "SQ flow control is on");
                }
                Some(PduType::R2T) => {
                    let d = DataHeader::parse(pdu).expect("an R2T");
                    let sent = self.find(d.cccid).expect("an R2T for a command in flight");
                    assert!(
                        d.length > 0 && d.offset + d.length <= sent.transport,
                        "{d:?}"
                    );
                    self.send_data(d);
                }
                Some(PduType::IcResp) => {} // (to the ICReq of `connect`)
                other => panic!("a well-framed command ended the connection: {other:?}"),
            }
        }
        if self.conn.finished().is_some() {
            self.ended = true;
        }
        !out.is_empty()
    }

    fn find(&self, cid: u16) -> Option<Sent> {
        self.sent.iter().find(|s| s.cid == cid).copied()
    }

    fn answered(&mut self, cqe: &Cqe) {
        let at = self.sent.iter().position(|s| s.cid == cqe.cid);
        let Some(at) = at else {
            panic!("a response to no command in flight (or a second one): {cqe:?}");
        };
        let sent = self.sent.swap_remove(at);
        if sent.disconnect && cqe.status().is_success() {
            self.ended = true;
        }
    }

    /// The data an R2T asks for, in H2CData PDUs of MAXH2CDATA at most.
    fn send_data(&mut self, r2t: DataHeader) {
        let mut offset = r2t.offset;
        let end = r2t.offset + r2t.length;
        while offset < end {
            let length = (end - offset).min(MAXH2CDATA);
            let d = DataHeader {
                cccid: r2t.cccid,
                ttag: r2t.ttag,
                offset,
                length,
            };
            let last = if offset + length == end {
                flags::LAST_PDU
            } else {
                0
            };
            let h = OutHeader::data(PduType::H2CData, &d, last, Digests::default(), 0);
            let mut pdu = h.as_slice().to_vec();
            pdu.resize(pdu.len() + h.pad(), 0);
            pdu.resize(pdu.len() + length as usize, offset as u8);
            self.conn.receive(&pdu, &mut self.backend);
            offset += length;
        }
    }

    /// Serves the queue until nothing more happens.
    fn settle(&mut self, now: Instant) {
        for _ in 0..64 {
            if !self.serve(now, &mut |_| {}) && self.backend.waiting() == 0 {
                self.serve(now, &mut |_| {});
                break;
            }
        }
    }
}

/// The data a capsule carries, by the choices byte.
fn capsule_data(choices: u8) -> &'static [u8] {
    static DATA: [u8; 8192] = [0xA5; 8192];
    let len = [0, 512, 4096, 8192][usize::from(choices >> DATA_SHIFT) & 3];
    &DATA[..len]
}

/// Arbitrary commands on an admin and an I/O queue of one controller, each answered exactly
/// once (see the module's description). The first two bytes choose how scarce buffers and
/// device room are; then 65 bytes per command: a byte of choices, the SQE.
pub fn fuzz_commands(bytes: &[u8]) {
    let sub = Arc::new(test_subsystem(2));
    let registry = Arc::new(Registry::new());
    let (choices, commands) = bytes.split_at(bytes.len().min(2));
    // the one clock reading: no timer expires (the Keep Alive timeout a command set, say)
    let now = Instant::now();
    let mut admin = Queue::new(&sub, &registry, choices);
    let mut io = Queue::new(&sub, &registry, choices);
    let cntlid = admin.connect(now, 0, CNTLID_DYNAMIC, &sub.nqn);
    let cc = Sqe::property_set(0x14, PropertySize::Four, 1 | 6 << 16 | 4 << 20);
    assert_eq!(admin.command(now, cc, &[]).status(), Status::SUCCESS);
    io.connect(now, 1, cntlid, &sub.nqn);

    for (n, command) in commands.chunks_exact(COMMAND_BYTES).enumerate() {
        let choice = command[0];
        let q = if choice & TO_IO_QUEUE != 0 {
            &mut io
        } else {
            &mut admin
        };
        if q.ended {
            break; // the association ended (a Disconnect, a controller gone)
        }
        // a host keeps to its queue's size: the oldest commands are answered first
        if q.sent.len() >= ENTRIES - 1 {
            q.settle(now);
            assert!(
                q.sent.len() < ENTRIES - 1,
                "commands unanswered: {:?}",
                q.sent
            );
        }
        let mut sqe = Sqe::from_bytes(command[1..].try_into().expect("64 bytes"));
        let cid = n as u16;
        sqe.set_cid(cid);
        let mut data = capsule_data(choice);
        if choice & LBA_IN_RANGE != 0 {
            sqe.cdw10 %= 2048;
            sqe.cdw11 = 0;
        }
        if choice & RAW_TRANSPORT != 0 {
            data = &[];
        } else {
            sqe.set_psdt(PSDT_SGL);
            let blocks = (sqe.cdw12 & 0xffff) + 1;
            let length = if choice & LENGTH_OF_BLOCKS != 0 {
                blocks * 512
            } else {
                sqe.sgl().length % (256 << 10)
            };
            sqe.set_sgl(if data.is_empty() {
                SglDescriptor::transport(length)
            } else {
                SglDescriptor::in_capsule(data.len() as u32)
            });
        }
        let sgl = sqe.sgl();
        let disconnect = sqe.opcode() == FABRICS_OPCODE && sqe.nsid as u8 == 0x08;
        q.sent.push(Sent {
            cid,
            transport: if sgl.identifier == SGL_TRANSPORT {
                sgl.length
            } else {
                0
            },
            disconnect,
        });
        q.send(&sqe, data);
        if choice & SERVE_AFTER != 0 {
            q.serve(now, &mut |_| {});
        }
        // a queue of a controller gone (its admin queue disconnected) ends too
        if admin.ended {
            io.settle(now);
            io.ended = true;
        }
    }
    admin.settle(now);
    io.settle(now);
    // Everything answered but the Asynchronous Event Requests the admin queue holds; the
    // controller going away answers those.
    if !io.ended {
        assert!(io.sent.is_empty(), "I/O commands unanswered: {:?}", io.sent);
    }
    if !admin.ended {
        assert!(
            admin.sent.len() <= 4,
            "admin commands unanswered: {:?}",
            admin.sent
        );
        admin.conn.shut_down(&mut admin.backend);
        admin.settle(now);
        assert!(
            admin.sent.is_empty(),
            "held events unanswered: {:?}",
            admin.sent
        );
    }
    for q in [&mut admin, &mut io] {
        q.conn.peer_gone("the fuzzer ended", &mut q.backend);
        q.backend.complete_all(&mut q.conn);
        assert_eq!(q.backend.buffers_held(), 0, "every buffer came back");
        assert!(q.conn.finished().is_some(), "a closed connection drains");
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Commands of `opcode` with the choices `choice`, a few of each shape.
    fn input(limits: [u8; 2], commands: &[(u8, Sqe)]) -> Vec<u8> {
        let mut bytes = limits.to_vec();
        for (choice, sqe) in commands {
            bytes.push(*choice);
            bytes.extend_from_slice(zerocopy::IntoBytes::as_bytes(sqe));
        }
        bytes
    }

    #[test]
    fn reads_writes_and_admin_commands_with_scarce_buffers_are_each_answered_once() {
        let mut read = Sqe::read(1, 10, 8);
        read.cdw12 = 7;
        let write = Sqe::write(2, 100, 8);
        let mut commands = Vec::new();
        for _ in 0..40 {
            commands.push((TO_IO_QUEUE | LENGTH_OF_BLOCKS | LBA_IN_RANGE, read));
            commands.push((TO_IO_QUEUE | LENGTH_OF_BLOCKS | LBA_IN_RANGE, write));
            commands.push((TO_IO_QUEUE | 2 << DATA_SHIFT | LBA_IN_RANGE, write));
        }
        commands.push((0, Sqe::async_event_request()));
        commands.push((
            0,
            Sqe::identify(usnvme_driver::spec::command::Cns::Controller, 0),
        ));
        commands.push((RAW_TRANSPORT, Sqe::new(0xB8)));
        fuzz_commands(&input([0, 0], &commands)); // one buffer, one command on the device
        fuzz_commands(&input([31, 7], &commands));
    }

    #[test]
    fn random_commands_are_each_answered_once() {
        let mut rng = fastrand::Rng::with_seed(39);
        for _ in 0..300 {
            let len = 2 + COMMAND_BYTES * rng.usize(1..80);
            let mut bytes: Vec<u8> = (0..len).map(|_| rng.u8(..)).collect();
            // mostly reads and writes in range on the I/O queue, the rest anything
            for command in bytes[2..].chunks_exact_mut(COMMAND_BYTES) {
                if rng.u8(..4) != 0 {
                    command[0] |= TO_IO_QUEUE | LENGTH_OF_BLOCKS | LBA_IN_RANGE;
                    command[0] &= !RAW_TRANSPORT;
                    command[1] = rng.u8(1..3);
                    command[5..9].copy_from_slice(&rng.u32(1..4).to_le_bytes()); // NSID
                    command[49] = rng.u8(..64); // CDW12: blocks - 1
                    command[50] = 0;
                }
            }
            fuzz_commands(&bytes);
        }
    }
}
