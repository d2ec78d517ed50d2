//! Host PDUs built by hand, byte by byte, for the allocation tests that play a host against
//! the target's connection: capsules, SGLs, the Fabrics Connect, CC.EN.

use usnvme_driver::spec::Sqe;
use usnvme_engine::fabric::pdu::{self, Digests, OutHeader};

/// Without digests, and with both.
pub const DIGESTS: [Digests; 2] = [
    Digests {
        header: false,
        data: false,
    },
    Digests {
        header: true,
        data: true,
    },
];

/// A command capsule: header, padding, `data` in it, its digest.
pub fn capsule(sqe: &Sqe, data: &[u8], digests: Digests) -> Vec<u8> {
    // PSDT 01b (SGLs), as a host's transport writes into every command it sends
    let mut sqe = *sqe;
    let b: &mut [u8; 64] = zerocopy::IntoBytes::as_mut_bytes(&mut sqe)
        .try_into()
        .expect("64 bytes");
    b[1] = (b[1] & 0x3f) | 0x40;
    let h = OutHeader::capsule_cmd(&sqe, data.len(), digests);
    let mut pdu = h.as_slice().to_vec();
    pdu.resize(pdu.len() + h.pad(), 0);
    pdu.extend_from_slice(data);
    if digests.data && !data.is_empty() {
        pdu.extend_from_slice(&pdu::crc32c(data).to_le_bytes());
    }
    pdu
}

/// Sets the SGL: its identifier (`kind`) and length.
pub fn sgl(sqe: &mut Sqe, kind: u8, len: u32) {
    let b: &mut [u8; 64] = zerocopy::IntoBytes::as_mut_bytes(sqe)
        .try_into()
        .expect("64 bytes");
    b[39] = kind;
    b[32..36].copy_from_slice(&len.to_le_bytes());
}

/// The Connect capsule of queue `qid` (32 entries) to controller `cntlid` (0xFFFF: a new
/// one) of `subnqn`, for host `host`.
pub fn connect(qid: u16, cntlid: u16, subnqn: &str, host: &str, digests: Digests) -> Vec<u8> {
    let mut sqe = Sqe::new(0x7f);
    let b: &mut [u8; 64] = zerocopy::IntoBytes::as_mut_bytes(&mut sqe)
        .try_into()
        .expect("64 bytes");
    b[4] = 0x01;
    b[42..44].copy_from_slice(&qid.to_le_bytes());
    b[44..46].copy_from_slice(&31u16.to_le_bytes());
    sgl(&mut sqe, 0x01, 1024);
    let mut data = [0u8; 1024];
    data[16..18].copy_from_slice(&cntlid.to_le_bytes());
    data[256..256 + subnqn.len()].copy_from_slice(subnqn.as_bytes());
    data[512..512 + host.len()].copy_from_slice(host.as_bytes());
    capsule(&sqe, &data, digests)
}

/// Property Set of CC: enabled, with 64-byte SQ and 16-byte CQ entries.
pub fn enable() -> Sqe {
    let mut cc = Sqe::new(0x7f);
    let b: &mut [u8; 64] = zerocopy::IntoBytes::as_mut_bytes(&mut cc)
        .try_into()
        .expect("64 bytes");
    b[44..48].copy_from_slice(&0x14u32.to_le_bytes());
    b[48..56].copy_from_slice(&(1u64 | 6 << 16 | 4 << 20).to_le_bytes());
    cc
}
