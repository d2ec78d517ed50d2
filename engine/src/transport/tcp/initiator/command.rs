//! One command at a time on a polled queue: each call of [`CommandQueue`] submits a command to
//! an [`IoQueue`] (the host's one NVMe/TCP PDU engine) and polls it to completion, waiting on
//! the socket in between, within a deadline. The admin queue of a remote controller runs on it
//! (Connect, Property Get/Set, Identify, logs, features, Keep Alive), and tests drive targets
//! with it (I/O queues too).
//!
//! Data moves through a buffer of the queue's own ([`MAX_DATA`] bytes): admin data is small
//! and this path is not the block layer's, so a copy costs nothing that matters.
//!
//! A command the target does not answer in time fails with [`HostError::Timeout`] and ends
//! the queue (it may still be carried out, so the queue cannot be trusted any more); later
//! calls fail with [`HostError::Closed`].

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use usnvme_driver::spec::{Cqe, PropertyCommand, PropertySize, Sqe, Status};
use usnvme_driver::{IoBuffer, SubmitError};
use usnvme_hugepages::IovaMemory;
use vm_memory::{Bytes, GuestAddress};

use super::options::{HostError, HostOptions};
use super::queue::Buffers;
use super::session::{Data, QueueParams, ADMIN_IN_CAPSULE};
use crate::transport::fabric_queue::FabricQueue;

/// The most data one command moves here: a Discovery Log Page of 1023 records and its header.
pub const MAX_DATA: u32 = 1 << 20;
/// Where the queue's buffer is in its (private) address space.
const BUFFER_IOVA: u64 = 0x1000;

/// A command's data, in the caller's memory.
#[derive(Debug)]
pub enum Payload<'a> {
    None,
    /// Sent in the capsule when it fits the in-capsule size, else when the target asks (R2T).
    ToController(&'a [u8]),
    /// Filled by the target's C2HData PDUs.
    FromController(&'a mut [u8]),
}

impl Payload<'_> {
    fn len(&self) -> usize {
        match self {
            Payload::None => 0,
            Payload::ToController(d) => d.len(),
            Payload::FromController(d) => d.len(),
        }
    }
}

/// One NVMe/TCP queue (admin or I/O) of a controller, connected, one command at a time.
#[derive(Debug)]
pub struct CommandQueue {
    queue: FabricQueue,
    buffer: Arc<IovaMemory>,
    token: u64,
    timeout: Duration,
}

impl CommandQueue {
    /// Connects queue `qid` (0: admin) of `entries` entries to subsystem `subnqn` at `addr`:
    /// TCP, ICReq/ICResp, then Fabrics Connect. `cntlid` is 0xFFFF on an admin queue (the
    /// target picks one), the admin queue's controller on an I/O queue. Returns the queue and
    /// the controller ID.
    pub fn connect(
        addr: SocketAddr,
        subnqn: &str,
        qid: u16,
        entries: u16,
        cntlid: u16,
        opts: &HostOptions,
    ) -> Result<(CommandQueue, u16), HostError> {
        let params = QueueParams {
            subnqn: subnqn.to_owned(),
            qid,
            cntlid,
            entries,
            // unused: every command comes whole to submit_command
            nsid: 0,
            block_size: 512,
            in_capsule: if qid == 0 { ADMIN_IN_CAPSULE } else { 0 },
            max_transfer: MAX_DATA,
            timeout_ns: u64::try_from(opts.timeout.as_nanos()).unwrap_or(u64::MAX),
        };
        let buffer = IovaMemory::from_ranges(&[(GuestAddress(BUFFER_IOVA), MAX_DATA as usize)])
            .map_err(std::io::Error::other)?;
        let buffer = Arc::new(buffer);
        let queue = FabricQueue::connect(addr, params, opts, Buffers::Memory(buffer.clone()))?;
        let cntlid = queue.cntlid();
        let q = CommandQueue {
            queue,
            buffer,
            token: 0,
            timeout: opts.timeout,
        };
        Ok((q, cntlid))
    }

    /// Sets the in-capsule data size of an I/O queue (IOCCSZ * 16 - 64 from Identify
    /// Controller); larger writes wait for R2Ts.
    pub fn set_in_capsule_limit(&mut self, bytes: usize) {
        let bytes = u32::try_from(bytes).unwrap_or(u32::MAX);
        self.queue.set_in_capsule(bytes);
    }

    /// The longest one command may take from now on.
    pub fn set_timeout(&mut self, timeout: Duration) {
        if !timeout.is_zero() {
            self.timeout = timeout;
            let ns = u64::try_from(timeout.as_nanos()).unwrap_or(u64::MAX);
            self.queue.set_timeout(ns);
        }
    }

    pub fn qid(&self) -> u16 {
        self.queue.qid()
    }

    /// The controller (on an admin queue, the one the target granted).
    pub fn cntlid(&self) -> u16 {
        self.queue.cntlid()
    }

    /// The most data the target takes in one H2CData PDU.
    pub fn maxh2cdata(&self) -> u32 {
        self.queue.maxh2cdata()
    }

    /// Property Get: the controller register at `offset` (CAP, VS, CC, CSTS), 4 or 8 bytes.
    pub fn property_get(&mut self, offset: u32, eight_bytes: bool) -> Result<u64, HostError> {
        let size = property_size(eight_bytes);
        let cqe = self.execute(Sqe::property_get(offset, size), Payload::None)?;
        if !cqe.status().is_success() {
            return Err(HostError::status("Property Get", cqe.status(), true));
        }
        Ok(PropertyCommand::value_of(&cqe, size))
    }

    /// Property Set: writes `value` to the controller register at `offset`.
    pub fn property_set(
        &mut self,
        offset: u32,
        eight_bytes: bool,
        value: u64,
    ) -> Result<(), HostError> {
        let sqe = Sqe::property_set(offset, property_size(eight_bytes), value);
        let cqe = self.execute(sqe, Payload::None)?;
        if !cqe.status().is_success() {
            return Err(HostError::status("Property Set", cqe.status(), true));
        }
        Ok(())
    }

    /// A command that returns `data_in_len` bytes (Identify, Get Log Page, Get Features);
    /// check `cqe.status()`.
    pub fn admin(&mut self, sqe: Sqe, data_in_len: usize) -> Result<(Cqe, Vec<u8>), HostError> {
        let mut data = vec![0; data_in_len];
        let cqe = self.command(sqe, Payload::FromController(&mut data))?;
        Ok((cqe, data))
    }

    /// Any command; its CID and SGL are filled in here. Check `cqe.status()`.
    pub fn command(&mut self, sqe: Sqe, payload: Payload<'_>) -> Result<Cqe, HostError> {
        self.execute(sqe, payload)
    }

    /// Reads `blocks` blocks (1..=65536) from `slba` into `buf` (blocks times the block size).
    pub fn read(
        &mut self,
        nsid: u32,
        slba: u64,
        blocks: u32,
        buf: &mut [u8],
    ) -> Result<(), HostError> {
        let cqe = self.command(Sqe::read(nsid, slba, blocks), Payload::FromController(buf))?;
        match cqe.status() {
            s if s.is_success() => Ok(()),
            s => Err(HostError::status("Read", s, false)),
        }
    }

    /// Writes `data` (`blocks` blocks, 1..=65536) at `slba`.
    pub fn write(
        &mut self,
        nsid: u32,
        slba: u64,
        blocks: u32,
        data: &[u8],
    ) -> Result<(), HostError> {
        let cqe = self.command(Sqe::write(nsid, slba, blocks), Payload::ToController(data))?;
        match cqe.status() {
            s if s.is_success() => Ok(()),
            s => Err(HostError::status("Write", s, false)),
        }
    }

    /// Closes the connection (no Fabrics Disconnect: closing the admin queue's connection ends
    /// the controller on the target anyway).
    pub fn disconnect(mut self) {
        self.queue.close(|_| {});
    }

    /// Submits `sqe` and polls until it completes or the deadline passes.
    fn execute(&mut self, sqe: Sqe, payload: Payload<'_>) -> Result<Cqe, HostError> {
        let len = u32::try_from(payload.len())
            .ok()
            .filter(|&l| l <= MAX_DATA)
            .ok_or(HostError::InvalidArgument(
                "a command moves at most 1 MiB here",
            ))?;
        let deadline = Instant::now()
            .checked_add(self.timeout)
            .ok_or(HostError::InvalidArgument("the timeout is too long"))?;
        let buf = IoBuffer {
            iova: BUFFER_IOVA,
            len,
        };
        let data = match &payload {
            Payload::None => Data::None,
            Payload::ToController(d) => {
                self.buffer
                    .write_slice(d, GuestAddress(BUFFER_IOVA))
                    .map_err(std::io::Error::other)?;
                Data::ToController(buf)
            }
            Payload::FromController(_) => Data::FromController(buf),
        };
        self.token = self.token.wrapping_add(1);
        let token = self.token;
        match self.queue.submit_command(sqe, data, token) {
            Ok(()) => {}
            Err(SubmitError::Dead) => return Err(HostError::Closed),
            Err(_) => return Err(HostError::InvalidArgument("the command does not fit")),
        }
        let done = loop {
            let mut done = None;
            self.queue.poll(|c| {
                if c.token == token {
                    done = Some(c);
                }
            });
            if let Some(c) = done {
                break c;
            }
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                // it may still be carried out: the queue cannot go on
                self.queue.close(|_| {});
                return Err(HostError::Timeout);
            }
            if let Err(e) = self.queue.wait(left) {
                self.queue.close(|_| {});
                return Err(e);
            }
        };
        let status = match done.result {
            Ok(()) => Status::SUCCESS,
            Err(super::Failure::Status(status)) => status,
            Err(failure) => return Err(HostError::from(failure)),
        };
        if let Payload::FromController(out) = payload {
            if status.is_success() {
                self.buffer
                    .read_slice(out, GuestAddress(BUFFER_IOVA))
                    .map_err(std::io::Error::other)?;
            }
        }
        let mut cqe = Cqe::new(done.dw0, 0, self.qid(), 0, status, false);
        cqe.dw1 = done.dw1;
        Ok(cqe)
    }
}

fn property_size(eight_bytes: bool) -> PropertySize {
    if eight_bytes {
        PropertySize::Eight
    } else {
        PropertySize::Four
    }
}
#[cfg(test)]
mod tests {
    use super::*;
    use crate::transport::tcp::initiator::testing::{append_pdu, pattern};
    use std::io::{Read, Write};
    use std::net::{TcpListener, TcpStream};
    use std::thread::JoinHandle;

    use crate::fabric::pdu::{
        check_header_digest, crc32c, flags, parse_term_req, term_req, CommonHeader, DataHeader,
        Digests, FatalError, IcReq, IcResp, Limits, OutHeader, PduType, CAPSULE_CMD_HEADER,
        COMMON_HEADER, SHORT_HEADER,
    };
    use usnvme_driver::spec::fabrics::{
        CONNECT_DATA, FABRICS_OPCODE as FABRICS, FCTYPE_CONNECT, FCTYPE_PROPERTY_GET,
        FCTYPE_PROPERTY_SET, SGL_IN_CAPSULE, SGL_TRANSPORT,
    };

    const SUBNQN: &str = "nqn.2024-01.dev.usnvme:test";
    const TARGET_RECEIVES: &[PduType] = &[
        PduType::IcReq,
        PduType::H2CTermReq,
        PduType::CapsuleCmd,
        PduType::H2CData,
    ];
    const MAXH2CDATA: u32 = 8192;
    const BOTH: Digests = Digests {
        header: true,
        data: true,
    };

    /// A PDU the fake target received, digests already checked.
    struct Rx {
        pdu_type: PduType,
        flags: u8,
        header: Vec<u8>,
        data: Vec<u8>,
    }

    /// A scripted target: one connection, driven step by step by the test.
    struct Fake {
        s: TcpStream,
        digests: Option<Digests>,
    }

    impl Fake {
        fn recv(&mut self) -> Rx {
            let mut common = [0u8; COMMON_HEADER];
            self.s.read_exact(&mut common).expect("a common header");
            let c = CommonHeader::parse(&common, TARGET_RECEIVES).expect("a host PDU type");
            let limits = Limits {
                digests: self.digests,
                max_data: 1 << 20,
                alignment: 0,
            };
            let layout = c.layout(&limits).expect("a good layout");
            let mut header = vec![0u8; layout.header_bytes];
            header[..COMMON_HEADER].copy_from_slice(&common);
            self.s
                .read_exact(&mut header[COMMON_HEADER..])
                .expect("the header");
            let mut rest = vec![0u8; layout.rest()];
            self.s.read_exact(&mut rest).expect("the data");
            if c.flags & flags::HDGST != 0 {
                check_header_digest(&header, c.hlen as usize).expect("header digest");
            }
            let data = rest[layout.pad..layout.pad + layout.data].to_vec();
            if layout.data_digest {
                let digest = &rest[layout.pad + layout.data..];
                assert_eq!(digest, crc32c(&data).to_le_bytes(), "data digest");
            }
            Rx {
                pdu_type: c.pdu_type,
                flags: c.flags,
                header,
                data,
            }
        }

        fn send(&mut self, header: &OutHeader, data: &[u8]) {
            let mut out = Vec::new();
            append_pdu(&mut out, header, data, self.digests.unwrap_or_default());
            self.s.write_all(&out).expect("send");
        }

        fn send_raw(&mut self, bytes: &[u8]) {
            self.s.write_all(bytes).expect("send");
        }

        /// ICReq in; ICResp granting `grant` (the asked digests when None) out.
        fn handshake(&mut self, grant: Option<Digests>) {
            let rx = self.recv();
            assert_eq!(rx.pdu_type, PduType::IcReq);
            let req = IcReq::parse(&rx.header).expect("an ICReq");
            assert_eq!((req.pfv, req.hpda, req.maxr2t), (0, 0, 0));
            let digests = grant.unwrap_or(req.digests);
            let resp = IcResp {
                pfv: 0,
                cpda: 0,
                digests,
                maxh2cdata: MAXH2CDATA,
            };
            self.send_raw(&resp.encode());
            self.digests = Some(digests);
        }

        fn command(&mut self) -> (Sqe, Vec<u8>) {
            let rx = self.recv();
            assert_eq!(rx.pdu_type, PduType::CapsuleCmd);
            let sqe = Sqe::from_slice(&rx.header[8..CAPSULE_CMD_HEADER]).expect("an SQE");
            (sqe, rx.data)
        }

        fn respond(&mut self, sqe: &Sqe, dw0: u32, dw1: u32, status: Status) {
            let mut cqe = Cqe::new(dw0, 1, 0, sqe.cid(), status, false);
            cqe.dw1 = dw1;
            let h = OutHeader::capsule_resp(&cqe, self.digests.unwrap_or_default());
            self.send(&h, &[]);
        }

        fn c2h(&mut self, sqe: &Sqe, offset: u32, data: &[u8], extra: u8) {
            let d = DataHeader {
                cccid: sqe.cid(),
                ttag: 0,
                offset,
                length: data.len() as u32,
            };
            let h = OutHeader::data(
                PduType::C2HData,
                &d,
                extra,
                self.digests.unwrap_or_default(),
                0,
            );
            self.send(&h, data);
        }

        /// Checks the admin Connect and grants controller 1.
        fn connect(&mut self, kato: u32) {
            let (sqe, data) = self.command();
            assert_eq!((sqe.opcode(), sqe.as_bytes()[4]), (FABRICS, FCTYPE_CONNECT));
            let b = sqe.as_bytes();
            assert_eq!(&b[40..48], &[0, 0, 0, 0, 31, 0, 0, 0]); // recfmt, qid, sqsize, cattr
            assert_eq!(sqe.cdw12, kato);
            assert_eq!(
                (sqe.sgl().identifier, sqe.sgl().address, sqe.sgl().length),
                (SGL_IN_CAPSULE, 0, 1024)
            );
            assert_eq!(data.len(), CONNECT_DATA);
            assert_eq!(&data[..16], &HostOptions::default().host_id);
            assert_eq!(&data[16..18], &[0xff, 0xff]);
            assert_eq!(&data[256..256 + SUBNQN.len()], SUBNQN.as_bytes());
            assert_eq!(data[256 + SUBNQN.len()], 0);
            let host = HostOptions::default().host_nqn;
            assert_eq!(&data[512..512 + host.len()], host.as_bytes());
            self.respond(&sqe, 1, 0, Status::SUCCESS);
        }

        /// Reads until the host closes; the H2CTermReq it sent, if any.
        fn term_req(&mut self) -> Option<(u16, u32)> {
            let rx = self.recv();
            assert_eq!(rx.pdu_type, PduType::H2CTermReq);
            parse_term_req(&rx.header)
        }
    }

    /// Runs `script` as the target of one connection on a loopback port.
    fn target(script: impl FnOnce(Fake) + Send + 'static) -> (SocketAddr, JoinHandle<()>) {
        let listener = TcpListener::bind("127.0.0.1:0").expect("bind");
        let addr = listener.local_addr().expect("address");
        let handle = std::thread::spawn(move || {
            let (s, _) = listener.accept().expect("accept");
            script(Fake { s, digests: None });
        });
        (addr, handle)
    }

    fn options(digests: Digests) -> HostOptions {
        HostOptions {
            digests,
            kato_ms: 5000,
            timeout: Duration::from_secs(5),
            ..HostOptions::default()
        }
    }

    /// A target that sets up the admin queue, then runs `script`.
    fn connected(
        digests: Digests,
        script: impl FnOnce(&mut Fake) + Send + 'static,
    ) -> (CommandQueue, JoinHandle<()>) {
        let (addr, handle) = target(|mut f| {
            f.handshake(None);
            f.connect(5000);
            script(&mut f);
        });
        let (queue, cntlid) =
            CommandQueue::connect(addr, SUBNQN, 0, 32, 0xffff, &options(digests)).expect("connect");
        assert_eq!(cntlid, 1);
        (queue, handle)
    }

    #[test]
    fn commands_with_and_without_digests() {
        for digests in [Digests::default(), BOTH] {
            let (mut q, target) = connected(digests, |f| {
                // Property Get CAP (8 bytes), Property Set CC (4 bytes)
                let (sqe, _) = f.command();
                assert_eq!(
                    (sqe.as_bytes()[4], sqe.cdw10, sqe.cdw11),
                    (FCTYPE_PROPERTY_GET, 1, 0)
                );
                f.respond(&sqe, 0x1234_5678, 0x9, Status::SUCCESS);
                let (sqe, _) = f.command();
                assert_eq!(sqe.as_bytes()[4], FCTYPE_PROPERTY_SET);
                assert_eq!(
                    (sqe.cdw10, sqe.cdw11, sqe.cdw12, sqe.cdw13),
                    (0, 0x14, 0x46_0001, 0)
                );
                f.respond(&sqe, 0, 0, Status::SUCCESS);

                // Identify: C2HData with LAST_PDU, then the CapsuleResp
                let (sqe, data) = f.command();
                assert!(data.is_empty());
                assert_eq!(
                    (sqe.sgl().identifier, sqe.sgl().length),
                    (SGL_TRANSPORT, 4096)
                );
                f.c2h(&sqe, 0, &pattern(4096, 1), flags::LAST_PDU);
                f.respond(&sqe, 0, 0, Status::SUCCESS);

                // Read: two C2HData, the second ends the command (no CapsuleResp)
                let (sqe, _) = f.command();
                assert_eq!(
                    (sqe.opcode(), sqe.nsid, sqe.cdw10, sqe.cdw11, sqe.cdw12),
                    (2, 1, 8, 0, 7)
                );
                let data = pattern(4096, 2);
                f.c2h(&sqe, 0, &data[..2048], 0);
                f.c2h(&sqe, 2048, &data[2048..], flags::LAST_PDU | flags::SUCCESS);

                // Small write: in the capsule
                let (sqe, data) = f.command();
                assert_eq!(
                    (sqe.opcode(), sqe.sgl().identifier, sqe.sgl().length),
                    (1, SGL_IN_CAPSULE, 512)
                );
                assert_eq!(data, pattern(512, 3));
                f.respond(&sqe, 0, 0, Status::SUCCESS);

                // Large write: two R2Ts, the first answered in MAXH2CDATA pieces
                let (sqe, data) = f.command();
                assert_eq!(
                    (sqe.sgl().identifier, sqe.sgl().length),
                    (SGL_TRANSPORT, 16384)
                );
                assert!(data.is_empty());
                let expect = pattern(16384, 4);
                let mut got = Vec::new();
                for (ttag, offset, length, pieces) in [(7, 0, 12288, 2), (8, 12288, 4096, 1)] {
                    let r2t = DataHeader {
                        cccid: sqe.cid(),
                        ttag,
                        offset,
                        length,
                    };
                    f.send(&OutHeader::r2t(&r2t, f.digests.unwrap_or_default()), &[]);
                    for piece in 0..pieces {
                        let rx = f.recv();
                        assert_eq!(rx.pdu_type, PduType::H2CData);
                        let d = DataHeader::parse(&rx.header).expect("H2CData");
                        assert_eq!((d.cccid, d.ttag), (sqe.cid(), ttag));
                        // the R2Ts cover the data in order, so each piece starts where
                        // the previous one ended
                        assert_eq!(d.offset as usize, got.len());
                        assert!(d.length <= MAXH2CDATA);
                        let last = piece + 1 == pieces;
                        assert_eq!(rx.flags & flags::LAST_PDU != 0, last);
                        got.extend_from_slice(&rx.data);
                    }
                    assert_eq!(got.len(), (offset + length) as usize);
                }
                assert_eq!(got, expect);
                f.respond(&sqe, 0, 0, Status::SUCCESS);

                // A read that fails
                let (sqe, _) = f.command();
                f.respond(&sqe, 0, 0, Status::LBA_OUT_OF_RANGE.with_dnr());
            });
            assert_eq!(q.property_get(0, true).expect("CAP"), 0x9_1234_5678);
            q.property_set(0x14, false, 0x46_0001).expect("CC");
            let (cqe, id) = q.admin(Sqe::new(0x06), 4096).expect("identify");
            assert!(cqe.status().is_success());
            assert_eq!(id, pattern(4096, 1));
            let mut buf = vec![0u8; 4096];
            q.read(1, 8, 8, &mut buf).expect("read");
            assert_eq!(buf, pattern(4096, 2));
            q.set_in_capsule_limit(4096);
            q.write(1, 0, 1, &pattern(512, 3)).expect("small write");
            q.write(1, 0, 32, &pattern(16384, 4)).expect("large write");
            let err = q
                .read(1, 1 << 40, 1, &mut buf[..512])
                .expect_err("out of range");
            assert!(
                matches!(err, HostError::Status { status, .. } if status.code() == Status::LBA_OUT_OF_RANGE)
            );
            assert_eq!(
                err.to_string(),
                "Read failed: LBA Out of Range (SCT 0x0, SC 0x80)"
            );
            target.join().expect("the fake target");
            q.disconnect();
        }
    }

    #[test]
    fn wrong_hlen_is_a_protocol_error_answered_with_a_term_req() {
        let (mut q, target) = connected(Digests::default(), |f| {
            let (sqe, _) = f.command();
            let cqe = Cqe::new(0, 0, 0, sqe.cid(), Status::SUCCESS, false);
            let mut h = OutHeader::capsule_resp(&cqe, Digests::default());
            h.bytes[2] = 23; // HLEN
            f.send(&h, &[]);
            assert_eq!(f.term_req(), Some((1, 2)));
        });
        let err = q.property_get(0, true).expect_err("bad HLEN");
        assert!(
            matches!(
                err,
                HostError::Protocol {
                    what: FatalError::InvalidHeaderField { field: "HLEN", .. }
                }
            ),
            "{err}"
        );
        assert!(err.to_string().contains("HLEN"), "{err}");
        target.join().expect("the fake target");
        assert!(matches!(q.property_get(0, true), Err(HostError::Closed)));
    }

    #[test]
    fn c2h_term_req_surfaces_as_terminated() {
        let (mut q, target) = connected(Digests::default(), |f| {
            let (_sqe, _) = f.command();
            let e = FatalError::InvalidHeaderField {
                offset: 3,
                field: "PDO",
            };
            f.send_raw(&term_req(PduType::C2HTermReq, &e, &[0u8; 24]));
        });
        let err = q.read(1, 0, 1, &mut [0u8; 512]).expect_err("terminated");
        assert!(
            matches!(err, HostError::Terminated { fes: 1, fei: 3 }),
            "{err}"
        );
        assert!(
            err.to_string().contains("Invalid PDU Header Field"),
            "{err}"
        );
        target.join().expect("the fake target");
    }

    #[test]
    fn data_digest_mismatch_fails_the_command_not_the_queue() {
        let (mut q, target) = connected(BOTH, |f| {
            let (sqe, _) = f.command();
            let data = pattern(512, 5);
            let d = DataHeader {
                cccid: sqe.cid(),
                ttag: 0,
                offset: 0,
                length: 512,
            };
            let h = OutHeader::data(PduType::C2HData, &d, flags::LAST_PDU, BOTH, 0);
            let mut out = Vec::new();
            append_pdu(&mut out, &h, &data, BOTH);
            let at = out.len() - 1;
            out[at] ^= 0xff; // the data digest
            f.send_raw(&out);
            f.respond(&sqe, 0, 0, Status::SUCCESS);
            // the queue goes on
            let (sqe, _) = f.command();
            f.respond(&sqe, 7, 0, Status::SUCCESS);
        });
        let err = q.read(1, 0, 1, &mut [0u8; 512]).expect_err("bad digest");
        assert!(matches!(err, HostError::Digest { header: false }), "{err}");
        assert_eq!(q.property_get(8, false).expect("VS"), 7);
        target.join().expect("the fake target");
    }

    #[test]
    fn header_digest_mismatch_ends_the_connection() {
        let (mut q, target) = connected(BOTH, |f| {
            let (sqe, _) = f.command();
            let cqe = Cqe::new(0, 0, 0, sqe.cid(), Status::SUCCESS, false);
            let mut h = OutHeader::capsule_resp(&cqe, BOTH);
            h.bytes[SHORT_HEADER] ^= 1;
            f.send(&h, &[]);
            assert_eq!(f.term_req(), Some((3, 0)));
        });
        let err = q.property_get(0, true).expect_err("bad digest");
        assert!(matches!(err, HostError::Digest { header: true }), "{err}");
        target.join().expect("the fake target");
    }

    #[test]
    fn c2h_data_beyond_the_buffer_or_out_of_order_is_refused() {
        // after 512 bytes of a 1024-byte read: more data than the read (FES 4), a gap (FES 4)
        for (offset, length, fes) in [(512, 1024, 4), (768, 256, 4)] {
            let (mut q, target) = connected(Digests::default(), move |f| {
                let (sqe, _) = f.command();
                f.c2h(&sqe, 0, &[0u8; 512], 0);
                f.c2h(&sqe, offset, &vec![0u8; length], flags::LAST_PDU);
                assert_eq!(f.term_req(), Some((fes, 0)));
            });
            let err = q.read(1, 0, 2, &mut [0u8; 1024]).expect_err("bad C2HData");
            assert!(
                matches!(err, HostError::Protocol { what } if what.fes() == fes),
                "{err}"
            );
            target.join().expect("the fake target");
        }
    }

    #[test]
    fn failed_connect_names_the_status() {
        // 82h is also an NVM command set code: a Connect names its Fabrics meaning
        for (status, text) in [
            (
                Status::CONNECT_INVALID_HOST,
                "Connect Invalid Host (SCT 0x1, SC 0x84)",
            ),
            (
                Status::CONNECT_INVALID_PARAMETERS,
                "Connect Invalid Parameters (SCT 0x1, SC 0x82)",
            ),
        ] {
            let (addr, target) = target(move |mut f| {
                f.handshake(None);
                let (sqe, _) = f.command();
                f.respond(&sqe, 0, 0, status.with_dnr());
            });
            let err =
                CommandQueue::connect(addr, SUBNQN, 0, 32, 0xffff, &options(Digests::default()))
                    .expect_err("refused");
            assert_eq!(err.to_string(), format!("Connect failed: {text}"));
            target.join().expect("the fake target");
        }
    }

    #[test]
    fn ic_resp_must_grant_the_digests_asked() {
        let (addr, target) = target(|mut f| {
            f.handshake(Some(Digests::default()));
            f.digests = None; // the TermReq has no digest either way
            assert_eq!(f.term_req(), Some((1, 11)));
        });
        let err = CommandQueue::connect(addr, SUBNQN, 0, 32, 0xffff, &options(BOTH))
            .expect_err("no digests");
        assert!(err.to_string().contains("DGST"), "{err}");
        target.join().expect("the fake target");
    }

    #[test]
    fn refused_and_timed_out() {
        let addr = TcpListener::bind("127.0.0.1:0")
            .and_then(|l| l.local_addr())
            .expect("a free port");
        let err = CommandQueue::connect(addr, SUBNQN, 0, 32, 0xffff, &options(Digests::default()))
            .expect_err("nobody listens");
        assert!(matches!(err, HostError::Refused { .. }), "{err}");
        assert!(err.to_string().contains("refused"), "{err}");

        // a target that never answers the Connect
        let (addr, target) = target(|mut f| {
            f.handshake(None);
            let _ = f.command();
            let _ = f.s.read(&mut [0u8; 1]); // until the host gives up
        });
        let opts = HostOptions {
            timeout: Duration::from_millis(200),
            ..options(Digests::default())
        };
        let err = CommandQueue::connect(addr, SUBNQN, 0, 32, 0xffff, &opts).expect_err("silence");
        assert!(matches!(err, HostError::Timeout), "{err}");
        target.join().expect("the fake target");
    }

    #[test]
    fn a_command_a_silent_target_does_not_answer_times_out_and_ends_the_queue() {
        let (mut q, target) = connected(Digests::default(), |f| {
            let _ = f.command();
            // silent until the host gives up and closes
            assert_eq!(f.s.read(&mut [0u8; 1]).expect("EOF"), 0);
        });
        q.set_timeout(Duration::from_millis(200));
        let started = Instant::now();
        let err = q.property_get(0x1c, false).expect_err("silence");
        assert!(matches!(err, HostError::Timeout), "{err}");
        assert!(started.elapsed() >= Duration::from_millis(200));
        assert!(
            started.elapsed() < Duration::from_secs(5),
            "{:?}",
            started.elapsed()
        );
        // the command may still be carried out: the queue does not go on
        assert!(matches!(q.property_get(0, true), Err(HostError::Closed)));
        target.join().expect("the fake target");
    }

    #[test]
    fn admin_connect_grants_the_targets_controller_and_keeps_sq_flow_control() {
        let (addr, target) = target(|mut f| {
            f.handshake(None);
            let (sqe, data) = f.command();
            let c = usnvme_driver::spec::ConnectCommand::from_sqe(&sqe).expect("a Connect");
            assert_eq!((c.qid, c.entries(), c.cattr, c.kato), (0, 32, 0, 5000));
            let data = usnvme_driver::spec::ConnectData::from_slice(&data).expect("1024 bytes");
            assert_eq!(data.cntlid, 0xffff);
            assert_eq!(data.subnqn(), Some(SUBNQN));
            f.respond(&sqe, 0x2a, 0, Status::SUCCESS);
            // an I/O queue's Connect disables SQ flow control; this one is the admin queue's
            assert_eq!(f.s.read(&mut [0u8; 1]).expect("EOF"), 0);
        });
        let (q, cntlid) =
            CommandQueue::connect(addr, SUBNQN, 0, 32, 0xffff, &options(Digests::default()))
                .expect("connect");
        assert_eq!((cntlid, q.cntlid(), q.qid()), (0x2a, 0x2a, 0));
        q.disconnect();
        target.join().expect("the fake target");
    }

    #[test]
    fn a_command_after_an_idle_is_stamped_at_its_submission_not_at_the_last_poll() {
        let (addr, target) = target(|mut f| {
            f.handshake(None);
            f.connect(5000);
            for value in [1, 2] {
                let (sqe, _) = f.command();
                f.respond(&sqe, value, 0, Status::SUCCESS);
            }
        });
        let params = QueueParams {
            subnqn: SUBNQN.into(),
            qid: 0,
            cntlid: 0xffff,
            entries: 32,
            nsid: 0,
            block_size: 512,
            in_capsule: ADMIN_IN_CAPSULE,
            max_transfer: 4096,
            timeout_ns: 5_000_000_000,
        };
        let mem = IovaMemory::from_ranges(&[(GuestAddress(BUFFER_IOVA), 4096)]).expect("memory");
        let opts = options(Digests::default());
        let mut q = super::super::queue::IoQueue::connect(
            addr,
            params,
            &opts,
            Buffers::Memory(Arc::new(mem)),
        )
        .expect("connect");
        let mut stamps = Vec::new();
        for token in [1, 2] {
            if token == 2 {
                // the idle under test (nothing is awaited): no poll for a while
                std::thread::sleep(Duration::from_millis(100));
            }
            let sqe = Sqe::property_get(8, PropertySize::Four);
            q.submit_command(sqe, Data::None, token).expect("room");
            let mut done = None;
            while done.is_none() {
                q.wait(Duration::from_secs(1)).expect("wait");
                q.poll(|c| done = Some(c));
            }
            let c = done.expect("a completion");
            assert_eq!((c.token, c.result, c.dw0), (token, Ok(()), token as u32));
            stamps.push(c.submitted_ns);
        }
        // a stale stamp (the last poll's) would make a command look late at once
        assert!(stamps[1] - stamps[0] >= 100_000_000, "{stamps:?}");
        drop(q);
        target.join().expect("the fake target");
    }
}
