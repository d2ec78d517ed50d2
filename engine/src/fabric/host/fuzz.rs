//! The body of the fuzz target `nvme_tcp_host`: arbitrary bytes from a target, fed to the host
//! side's own checks (ICResp, then CapsuleResp, C2HData, R2T and C2HTermReq for a run of
//! commands). Only the socket is replaced: the bytes are framed into PDUs as
//! `Connection::receive` frames them, and go through the same `decode`, `check_ic_resp` and
//! `Exchange` the blocking client uses. Must never panic; every PDU consumes input, so it ends.

use super::*;
use crate::fabric::remote::parse_discovery_log;

/// Why the host stops reading: the bytes ran out (a closed socket), or it sent a TermReq.
#[derive(Debug)]
struct Stop;

/// The target's bytes, as the socket would hand them over.
#[derive(Debug)]
struct Wire<'a> {
    bytes: &'a [u8],
}

impl<'a> Wire<'a> {
    fn take(&mut self, n: usize) -> Result<&'a [u8], Stop> {
        if n > self.bytes.len() {
            return Err(Stop);
        }
        let (taken, rest) = self.bytes.split_at(n);
        self.bytes = rest;
        Ok(taken)
    }

    /// One PDU of a type in `allowed` with at most `max_data` bytes of data, framed as
    /// `Connection::receive` frames it; a bad layout is answered with an H2CTermReq.
    fn receive(
        &mut self,
        digests: Option<Digests>,
        allowed: &[PduType],
        max_data: u32,
    ) -> Result<Pdu, Stop> {
        let mut common = [0u8; COMMON_HEADER];
        common.copy_from_slice(self.take(COMMON_HEADER)?);
        let limits = Limits {
            digests,
            max_data,
            alignment: HPDA,
        };
        let checked =
            CommonHeader::parse(&common, allowed).and_then(|c| Ok((c, c.layout(&limits)?)));
        let (parsed, layout) = checked.map_err(|e| abort(&e, &common))?;
        let mut pdu = Pdu {
            common: parsed,
            layout,
            header: [0; MAX_HEADER],
            body: Vec::new(),
        };
        pdu.header[..COMMON_HEADER].copy_from_slice(&common);
        let Some(rest) = pdu.header.get_mut(COMMON_HEADER..layout.header_bytes) else {
            return Err(abort(&field(2, "HLEN"), &common));
        };
        rest.copy_from_slice(self.take(rest.len())?);
        pdu.body = self.take(layout.rest())?.to_vec();
        Ok(pdu)
    }
}

/// The H2CTermReq the host would send (built, to run that code too), and the end.
fn abort(error: &FatalError, offending: &[u8]) -> Stop {
    let req = term_req(PduType::H2CTermReq, error, offending);
    debug_assert!(req.len() >= SHORT_HEADER);
    Stop
}

/// Runs the fuzz input: byte 0 chooses the digests asked for, byte 1 the commands (two bits
/// each: Property Get, a 4 KiB read, a 512-byte write in the capsule, a 16 KiB write by R2T),
/// the rest is what the target sends. Returns how many commands completed.
pub fn fuzz_host(bytes: &[u8]) -> usize {
    let (&[digests, kinds], stream) = bytes.split_at(bytes.len().min(2)) else {
        return 0;
    };
    let asked = Digests {
        header: digests & 1 != 0,
        data: digests & 2 != 0,
    };
    let mut wire = Wire { bytes: stream };
    let Ok(link) = setup(&mut wire, asked) else {
        return 0;
    };
    let mut completed = 0;
    let mut cid = 0u16;
    while !wire.bytes.is_empty() {
        let kind = (kinds >> (2 * (completed % 4))) & 3;
        if command(&mut wire, link, kind, cid).is_err() {
            break;
        }
        cid = cid.wrapping_add(1);
        completed += 1;
    }
    completed
}

/// ICResp in, checked against what was asked.
fn setup(wire: &mut Wire<'_>, asked: Digests) -> Result<Negotiated, Stop> {
    let pdu = wire.receive(None, SETUP, 0)?;
    match decode(&pdu) {
        Ok(Incoming::IcResp(resp)) => {
            check_ic_resp(&resp, asked).map_err(|e| abort(&e, pdu.header()))
        }
        Ok(_) => Err(Stop), // a C2HTermReq
        Err(e) => Err(abort(&e, pdu.header())),
    }
}

/// One command of `kind`, fed the target's PDUs until it completes.
fn command(wire: &mut Wire<'_>, link: Negotiated, kind: u8, cid: u16) -> Result<(), Stop> {
    let mut read = vec![0u8; 4096];
    let write = vec![0x5au8; if kind == 2 { 512 } else { 16384 }];
    let (sqe, payload, in_capsule) = match kind {
        0 => (Sqe::property_get(0, PropertySize::Eight), Payload::None, 0),
        1 => (Sqe::new(0x02), Payload::FromController(&mut read), 0),
        2 => (Sqe::write(1, 0, 1), Payload::ToController(&write), 8192),
        _ => (Sqe::write(1, 0, 32), Payload::ToController(&write), 0),
    };
    let mut out = Vec::new();
    let Ok(mut exchange) =
        Exchange::start(sqe, cid, 1, payload, in_capsule, link.digests, &mut out)
    else {
        return Err(Stop);
    };
    loop {
        let pdu = wire.receive(Some(link.digests), READY, exchange.max_data())?;
        let incoming = decode(&pdu).map_err(|e| abort(&e, pdu.header()))?;
        if let Incoming::TermReq { .. } = incoming {
            return Err(Stop);
        }
        out.clear();
        match exchange.on_pdu(incoming, link, &mut out) {
            Err(e) => return Err(abort(&e, pdu.header())),
            Ok(Progress::Pending) => {}
            // a data digest mismatch fails only the command: the queue goes on
            Ok(Progress::Done(_)) => break,
        }
    }
    if kind == 1 {
        // what a read returned goes through the log parser the remote controller uses
        let _ = parse_discovery_log(&read);
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    const BOTH: Digests = Digests {
        header: true,
        data: true,
    };

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
        let cqe = Cqe::new(0, 1, 1, cid, Status::SUCCESS, false);
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

    /// Every command kind once (0b11_10_01_00: Property Get, read, small write, R2T write),
    /// answered as a good target would.
    fn good_session(digests: Digests) -> Vec<u8> {
        let selector = u8::from(digests.header) | u8::from(digests.data) << 1;
        let mut b = vec![selector, 0b11_10_01_00];
        b.extend_from_slice(&ic_resp(digests));
        resp(&mut b, 0, digests);
        c2h(&mut b, 1, 0, &[7u8; 2048], 0, digests);
        c2h(
            &mut b,
            1,
            2048,
            &[7u8; 2048],
            flags::LAST_PDU | flags::SUCCESS,
            digests,
        );
        resp(&mut b, 2, digests);
        r2t(&mut b, 3, 0, 8192, digests);
        r2t(&mut b, 3, 8192, 8192, digests);
        resp(&mut b, 3, digests);
        b
    }

    #[test]
    fn a_good_session_completes_every_command() {
        for digests in [Digests::default(), BOTH] {
            assert_eq!(fuzz_host(&good_session(digests)), 4, "{digests:?}");
        }
    }

    #[test]
    fn bad_pdus_stop_the_session_where_they_are() {
        let good = good_session(Digests::default());
        let ic_end = 2 + 128;
        // cut anywhere: the commands before the cut complete, nothing panics
        for cut in 0..good.len() {
            assert!(fuzz_host(&good[..cut]) <= 4);
        }
        // digests asked, none granted: ICResp refused
        let mut b = good.clone();
        b[0] = 3;
        assert_eq!(fuzz_host(&b), 0);
        // a CapsuleResp for another command, a wrong HLEN, a C2HTermReq
        let mut b = good.clone();
        b[ic_end + 8 + 12] ^= 0xff; // CID of the first CapsuleResp (CQE byte 12)
        assert_eq!(fuzz_host(&b), 0);
        let mut b = good.clone();
        b[ic_end + 2] = 23;
        assert_eq!(fuzz_host(&b), 0);
        let mut b = good[..ic_end].to_vec();
        let e = FatalError::InvalidHeaderField {
            offset: 0,
            field: "PDU-Type",
        };
        b.extend_from_slice(&term_req(PduType::C2HTermReq, &e, &[0u8; 8]));
        assert_eq!(fuzz_host(&b), 0);
        // a C2HData far beyond the read, an R2T beyond the write
        let mut b = vec![0, 0b01];
        b.extend_from_slice(&ic_resp(Digests::default()));
        c2h(
            &mut b,
            0,
            8192,
            &[0u8; 64],
            flags::LAST_PDU,
            Digests::default(),
        );
        assert_eq!(fuzz_host(&b), 0);
        let mut b = vec![0, 0b11];
        b.extend_from_slice(&ic_resp(Digests::default()));
        r2t(&mut b, 0, 16000, 8192, Digests::default());
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
                // often a valid ICResp, so the fuzz reaches the commands
                if rng.bool() && b.len() >= 2 {
                    b[0] &= !3;
                    b.splice(2..2, ic_resp(Digests::default()));
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
