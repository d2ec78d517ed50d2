//! What the initiator's unit tests (and those of the remote controller and the fuzz body)
//! share: test data, PDUs as a target sends them, a scripted target's set-up.

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::thread::JoinHandle;

use usnvme_driver::spec::{Cqe, Status};

use crate::fabric::pdu::{self, Digests, IcResp, OutHeader};

/// `len` bytes that differ from byte to byte and from seed to seed.
pub(crate) fn pattern(len: usize, seed: u8) -> Vec<u8> {
    (0..len)
        .map(|i| (i as u8).wrapping_mul(13).wrapping_add(seed))
        .collect()
}

/// Appends one PDU to `out`: header, padding up to PDO, data, data digest.
pub(crate) fn append_pdu(out: &mut Vec<u8>, header: &OutHeader, data: &[u8], digests: Digests) {
    out.extend_from_slice(header.as_slice());
    out.resize(out.len() + header.pad(), 0);
    out.extend_from_slice(data);
    if digests.data && !data.is_empty() {
        out.extend_from_slice(&pdu::crc32c(data).to_le_bytes());
    }
}

/// A scripted target on a loopback port: it accepts one connection, sets it up
/// ([`accept_connect`], controller 1) and runs `script` on it.
pub(crate) fn connected_target(
    script: impl FnOnce(TcpStream) + Send + 'static,
) -> (SocketAddr, JoinHandle<()>) {
    let listener = TcpListener::bind("127.0.0.1:0").expect("bind");
    let addr = listener.local_addr().expect("address");
    let handle = std::thread::spawn(move || {
        let (mut s, _) = listener.accept().expect("accept");
        accept_connect(&mut s, 1);
        script(s);
    });
    (addr, handle)
}

/// A scripted target's set-up on an accepted socket, without digests: ICReq in, ICResp out,
/// the Connect in, its success out (granting controller `cntlid`).
fn accept_connect(s: &mut TcpStream, cntlid: u16) {
    let mut ic = [0u8; pdu::IC_HEADER];
    s.read_exact(&mut ic).expect("ICReq");
    let resp = IcResp {
        pfv: 0,
        cpda: 0,
        digests: Digests::default(),
        maxh2cdata: 8192,
    };
    s.write_all(&resp.encode()).expect("ICResp");
    let mut connect = vec![0u8; pdu::CAPSULE_CMD_HEADER + 1024];
    s.read_exact(&mut connect).expect("Connect");
    let cqe = Cqe::new(u32::from(cntlid), 0, 0, 0, Status::SUCCESS, false);
    let h = OutHeader::capsule_resp(&cqe, Digests::default());
    s.write_all(h.as_slice()).expect("the response");
}
