//! NVMe/TCP PDUs (NVMe/TCP Transport Specification 1.0, section 3.6): the 8-byte common
//! header, each PDU type's header, the header and data digests (CRC32C), and the checks a
//! receiver makes before it trusts a length.
//!
//! Parsing never trusts the peer: a header is checked against the PDU type's fixed header
//! length, the digests agreed at connection set-up, the data alignment (PDO) and the limits the
//! receiver advertised, and a bad one becomes a [`FatalError`] that names the field, which the
//! receiver sends back in a TermReq before it closes the connection.

use usnvme_driver::spec::{Cqe, Sqe};

/// Bytes of the common header (type, flags, HLEN, PDO, PLEN).
pub const COMMON_HEADER: usize = 8;
/// Bytes of a header or data digest.
pub const DIGEST: usize = 4;
/// ICReq and ICResp header length.
pub const IC_HEADER: usize = 128;
/// CapsuleCmd header length (common header and a 64-byte SQE).
pub const CAPSULE_CMD_HEADER: usize = 72;
/// CapsuleResp, H2CData, C2HData, R2T and TermReq header length.
pub const SHORT_HEADER: usize = 24;
/// The most header bytes any PDU has (ICReq and ICResp), with a digest.
pub const MAX_HEADER: usize = IC_HEADER + DIGEST;
/// A TermReq carries at most this many bytes of the PDU header that caused it.
pub const TERM_REQ_MAX_DATA: usize = 128;
/// Of the bytes received from where a bad PDU starts, those a TermReq carries back: its first
/// bytes, at most [`TERM_REQ_MAX_DATA`], not past its PLEN (what was read ahead after it is
/// not part of it).
pub fn offending(pending: &[u8]) -> &[u8] {
    let mut len = pending.len().min(TERM_REQ_MAX_DATA);
    if len >= COMMON_HEADER {
        let plen = u32::from_le_bytes([pending[4], pending[5], pending[6], pending[7]]);
        len = len.min(plen.max(COMMON_HEADER as u32) as usize);
    }
    &pending[..len]
}

/// PDU Format Version 1.0.
pub const PFV_1_0: u16 = 0;
/// The smallest MAXH2CDATA a controller may advertise.
pub const MIN_MAXH2CDATA: u32 = 4096;

/// PDU types.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u8)]
pub enum PduType {
    IcReq = 0x00,
    IcResp = 0x01,
    H2CTermReq = 0x02,
    C2HTermReq = 0x03,
    CapsuleCmd = 0x04,
    CapsuleResp = 0x05,
    H2CData = 0x06,
    C2HData = 0x07,
    R2T = 0x09,
}

impl PduType {
    pub fn from_raw(raw: u8) -> Option<PduType> {
        Some(match raw {
            0x00 => PduType::IcReq,
            0x01 => PduType::IcResp,
            0x02 => PduType::H2CTermReq,
            0x03 => PduType::C2HTermReq,
            0x04 => PduType::CapsuleCmd,
            0x05 => PduType::CapsuleResp,
            0x06 => PduType::H2CData,
            0x07 => PduType::C2HData,
            0x09 => PduType::R2T,
            _ => return None,
        })
    }

    /// The fixed header length (HLEN) of this type.
    pub fn header_len(self) -> usize {
        match self {
            PduType::IcReq | PduType::IcResp => IC_HEADER,
            PduType::CapsuleCmd => CAPSULE_CMD_HEADER,
            _ => SHORT_HEADER,
        }
    }

    /// Whether the PDU may carry data after its header.
    pub fn has_data(self) -> bool {
        matches!(
            self,
            PduType::CapsuleCmd
                | PduType::H2CData
                | PduType::C2HData
                | PduType::H2CTermReq
                | PduType::C2HTermReq
        )
    }

    /// Whether header digests apply (never to the connection set-up and teardown PDUs).
    pub fn digestible(self) -> bool {
        !matches!(
            self,
            PduType::IcReq | PduType::IcResp | PduType::H2CTermReq | PduType::C2HTermReq
        )
    }
}

/// Common header flags.
pub mod flags {
    /// A header digest follows the header.
    pub const HDGST: u8 = 1 << 0;
    /// A data digest follows the data.
    pub const DDGST: u8 = 1 << 1;
    /// H2CData / C2HData: the last PDU of this transfer.
    pub const LAST_PDU: u8 = 1 << 2;
    /// C2HData: the command succeeded; no CapsuleResp follows.
    pub const SUCCESS: u8 = 1 << 3;
}

/// The digests a connection agreed on in ICReq/ICResp.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Digests {
    pub header: bool,
    pub data: bool,
}

/// As a person reads it: "no digests", "header digest", "header and data digests".
impl std::fmt::Display for Digests {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match (self.header, self.data) {
            (false, false) => "no digests",
            (true, false) => "header digest",
            (false, true) => "data digest",
            (true, true) => "header and data digests",
        })
    }
}

impl Digests {
    /// From the ICReq/ICResp DGST field.
    pub fn from_bits(bits: u8) -> Digests {
        Digests {
            header: bits & 1 != 0,
            data: bits & 2 != 0,
        }
    }

    pub fn bits(self) -> u8 {
        u8::from(self.header) | (u8::from(self.data) << 1)
    }

    /// The common-header flags a digestible PDU carries (a data digest only with data).
    pub fn flags(self, with_data: bool) -> u8 {
        let mut f = 0;
        if self.header {
            f |= flags::HDGST;
        }
        if self.data && with_data {
            f |= flags::DDGST;
        }
        f
    }
}

/// CRC32C of `bytes`, as the digests carry it.
pub fn crc32c(bytes: &[u8]) -> u32 {
    crc32c::crc32c(bytes)
}

/// CRC32C of DMA memory. DMA memory is never borrowed as `&[u8]` (a device may share it), so
/// it is read through volatile copies, a page at a time into a buffer on the stack that stays
/// in the L1 cache.
pub fn crc32c_volatile(data: &vm_memory::VolatileSlice<'_>) -> u32 {
    let mut piece = [0u8; 4096];
    let mut crc = 0;
    let mut at = 0;
    while at < data.len() {
        let n = (data.len() - at).min(piece.len());
        if let Ok(part) = data.subslice(at, n) {
            part.copy_to(&mut piece[..n]);
        }
        crc = crc32c::crc32c_append(crc, &piece[..n]);
        at += n;
    }
    crc
}

/// Fatal Error Status of a TermReq, with the information the specification attaches.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum FatalError {
    /// FES 1: a header field is invalid; FEI is its byte offset in the PDU.
    #[error("invalid PDU header field at byte {offset} ({field})")]
    InvalidHeaderField { offset: u32, field: &'static str },
    /// FES 2: a PDU that may not come now (before ICReq, or a data PDU for no transfer).
    #[error("PDU sequence error: {0}")]
    Sequence(&'static str),
    /// FES 3: the header digest does not match.
    #[error("header digest mismatch")]
    HeaderDigest,
    /// FES 4: data outside the range of the command's transfer.
    #[error("data outside the command's transfer: {0}")]
    DataOutOfRange(&'static str),
    /// FES 5: more data than advertised (MAXH2CDATA, the in-capsule size).
    #[error("data limit exceeded: {0}")]
    DataLimitExceeded(&'static str),
    /// FES 6: a parameter this side does not support; FEI is its byte offset.
    #[error("unsupported parameter at byte {offset} ({field})")]
    UnsupportedParameter { offset: u32, field: &'static str },
}

impl FatalError {
    pub fn fes(&self) -> u16 {
        match self {
            FatalError::InvalidHeaderField { .. } => 1,
            FatalError::Sequence(_) => 2,
            FatalError::HeaderDigest => 3,
            FatalError::DataOutOfRange(_) => 4,
            FatalError::DataLimitExceeded(_) => 5,
            FatalError::UnsupportedParameter { .. } => 6,
        }
    }

    pub fn fei(&self) -> u32 {
        match self {
            FatalError::InvalidHeaderField { offset, .. }
            | FatalError::UnsupportedParameter { offset, .. } => *offset,
            _ => 0,
        }
    }

    pub(crate) fn field(offset: u32, field: &'static str) -> FatalError {
        FatalError::InvalidHeaderField { offset, field }
    }
}

/// The common header.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CommonHeader {
    pub pdu_type: PduType,
    pub flags: u8,
    pub hlen: u8,
    pub pdo: u8,
    pub plen: u32,
}

/// Where a received PDU's parts are, once its common header is checked: its header (with the
/// digest, if any) is `header_bytes` long; then `pad` bytes up to PDO, `data` bytes of data
/// and a data digest if `data_digest`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Layout {
    pub header_bytes: usize,
    pub pad: usize,
    pub data: usize,
    pub data_digest: bool,
}

impl Layout {
    /// Everything after the header.
    pub fn rest(&self) -> usize {
        self.pad + self.data + if self.data_digest { DIGEST } else { 0 }
    }
}

/// What a receiver accepts: the digests agreed (None before ICReq/ICResp), the largest data
/// a PDU may carry, and the PDU types that may come from the peer.
#[derive(Debug, Clone, Copy)]
pub struct Limits {
    pub digests: Option<Digests>,
    pub max_data: u32,
    /// Data alignment the receiver asked for (CPDA / HPDA), in dwords, 0's based.
    pub alignment: u8,
}

impl CommonHeader {
    /// Decodes the common header; the type must be one this side receives (`allowed`).
    pub fn parse(bytes: &[u8; COMMON_HEADER], allowed: &[PduType]) -> Result<Self, FatalError> {
        let pdu_type = PduType::from_raw(bytes[0])
            .filter(|t| allowed.contains(t))
            .ok_or(FatalError::field(0, "PDU-Type"))?;
        Ok(CommonHeader {
            pdu_type,
            flags: bytes[1],
            hlen: bytes[2],
            pdo: bytes[3],
            plen: u32::from_le_bytes([bytes[4], bytes[5], bytes[6], bytes[7]]),
        })
    }

    /// Checks HLEN, flags, PDO and PLEN against the type and `limits`; the PDU's layout.
    pub fn layout(&self, limits: &Limits) -> Result<Layout, FatalError> {
        let t = self.pdu_type;
        let hlen = t.header_len();
        if self.hlen as usize != hlen {
            return Err(FatalError::field(2, "HLEN"));
        }
        let digests = limits.digests.unwrap_or_default();
        let hdgst = t.digestible() && digests.header;
        if (self.flags & flags::HDGST != 0) != hdgst {
            return Err(FatalError::field(1, "FLAGS (HDGSTF)"));
        }
        let header_bytes = hlen + if hdgst { DIGEST } else { 0 };
        let plen = self.plen as usize;
        if plen < header_bytes {
            return Err(FatalError::field(4, "PLEN"));
        }
        let after = plen - header_bytes;
        if !t.has_data() || matches!(t, PduType::H2CTermReq | PduType::C2HTermReq) {
            // TermReq data is the offending header, at most 128 bytes, no digest or padding.
            if self.pdo != 0 {
                return Err(FatalError::field(3, "PDO"));
            }
            let most = if t.has_data() { TERM_REQ_MAX_DATA } else { 0 };
            if after > most {
                return Err(FatalError::field(4, "PLEN"));
            }
            return Ok(Layout {
                header_bytes,
                pad: 0,
                data: after,
                data_digest: false,
            });
        }
        if after == 0 {
            // no data: PDO must be 0 and no data digest flagged
            if self.pdo != 0 {
                return Err(FatalError::field(3, "PDO"));
            }
            if self.flags & flags::DDGST != 0 {
                return Err(FatalError::field(1, "FLAGS (DDGSTF)"));
            }
            if matches!(t, PduType::H2CData | PduType::C2HData) {
                return Err(FatalError::field(4, "PLEN"));
            }
            return Ok(Layout {
                header_bytes,
                pad: 0,
                data: 0,
                data_digest: false,
            });
        }
        if (self.flags & flags::DDGST != 0) != digests.data {
            return Err(FatalError::field(1, "FLAGS (DDGSTF)"));
        }
        let pdo = self.pdo as usize;
        let align = (limits.alignment as usize + 1) * 4;
        if pdo < header_bytes || pdo > plen || !pdo.is_multiple_of(align) && pdo != header_bytes {
            return Err(FatalError::field(3, "PDO"));
        }
        let ddgst = if digests.data { DIGEST } else { 0 };
        let data = plen
            .checked_sub(pdo + ddgst)
            .filter(|&d| d > 0)
            .ok_or(FatalError::field(4, "PLEN"))?;
        if data > limits.max_data as usize {
            return Err(FatalError::DataLimitExceeded(
                "more data in one PDU than advertised",
            ));
        }
        Ok(Layout {
            header_bytes,
            pad: pdo - header_bytes,
            data,
            data_digest: digests.data,
        })
    }
}

/// Checks the header digest of `header` (HLEN bytes followed by the 4-byte digest).
pub fn check_header_digest(header: &[u8], hlen: usize) -> Result<(), FatalError> {
    let (bytes, digest) = header.split_at(hlen);
    let got = digest
        .get(..DIGEST)
        .and_then(|d| <[u8; 4]>::try_from(d).ok())
        .map(u32::from_le_bytes)
        .ok_or(FatalError::HeaderDigest)?;
    if got != crc32c(bytes) {
        return Err(FatalError::HeaderDigest);
    }
    Ok(())
}

/// ICReq (host to controller).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct IcReq {
    pub pfv: u16,
    /// Host PDU data alignment, dwords, 0's based (0..=31).
    pub hpda: u8,
    pub digests: Digests,
    /// Most outstanding R2Ts per command, 0's based.
    pub maxr2t: u32,
}

/// ICResp (controller to host).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct IcResp {
    pub pfv: u16,
    /// Controller PDU data alignment, dwords, 0's based.
    pub cpda: u8,
    pub digests: Digests,
    /// The most data one H2CData PDU may carry.
    pub maxh2cdata: u32,
}

/// A data PDU (H2CData, C2HData) or an R2T: which command, which transfer, which bytes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DataHeader {
    /// Command Capsule CID.
    pub cccid: u16,
    /// Transfer tag (R2T, H2CData); 0 in C2HData.
    pub ttag: u16,
    /// Offset of the data from the start of the command's data.
    pub offset: u32,
    pub length: u32,
}

impl IcReq {
    pub fn parse(header: &[u8]) -> Result<IcReq, FatalError> {
        let h = header
            .get(..IC_HEADER)
            .ok_or(FatalError::field(2, "HLEN"))?;
        let req = IcReq {
            pfv: u16::from_le_bytes([h[8], h[9]]),
            hpda: h[10],
            digests: Digests::from_bits(h[11]),
            maxr2t: u32::from_le_bytes([h[12], h[13], h[14], h[15]]),
        };
        if req.pfv != PFV_1_0 {
            return Err(FatalError::UnsupportedParameter {
                offset: 8,
                field: "PFV",
            });
        }
        if req.hpda > 31 {
            return Err(FatalError::field(10, "HPDA"));
        }
        if h[11] & !3 != 0 {
            return Err(FatalError::field(11, "DGST"));
        }
        Ok(req)
    }

    pub fn encode(&self) -> [u8; IC_HEADER] {
        let mut b = [0u8; IC_HEADER];
        common(&mut b, PduType::IcReq, 0, IC_HEADER, 0, IC_HEADER);
        b[8..10].copy_from_slice(&self.pfv.to_le_bytes());
        b[10] = self.hpda;
        b[11] = self.digests.bits();
        b[12..16].copy_from_slice(&self.maxr2t.to_le_bytes());
        b
    }
}

impl IcResp {
    pub fn parse(header: &[u8]) -> Result<IcResp, FatalError> {
        let h = header
            .get(..IC_HEADER)
            .ok_or(FatalError::field(2, "HLEN"))?;
        let resp = IcResp {
            pfv: u16::from_le_bytes([h[8], h[9]]),
            cpda: h[10],
            digests: Digests::from_bits(h[11]),
            maxh2cdata: u32::from_le_bytes([h[12], h[13], h[14], h[15]]),
        };
        if resp.pfv != PFV_1_0 {
            return Err(FatalError::UnsupportedParameter {
                offset: 8,
                field: "PFV",
            });
        }
        if resp.cpda > 31 {
            return Err(FatalError::field(10, "CPDA"));
        }
        if resp.maxh2cdata < MIN_MAXH2CDATA || !resp.maxh2cdata.is_multiple_of(4) {
            return Err(FatalError::field(12, "MAXH2CDATA"));
        }
        Ok(resp)
    }

    pub fn encode(&self) -> [u8; IC_HEADER] {
        let mut b = [0u8; IC_HEADER];
        common(&mut b, PduType::IcResp, 0, IC_HEADER, 0, IC_HEADER);
        b[8..10].copy_from_slice(&self.pfv.to_le_bytes());
        b[10] = self.cpda;
        b[11] = self.digests.bits();
        b[12..16].copy_from_slice(&self.maxh2cdata.to_le_bytes());
        b
    }
}

impl DataHeader {
    /// From the bytes of an H2CData, C2HData or R2T header.
    pub fn parse(header: &[u8]) -> Result<DataHeader, FatalError> {
        let h = header
            .get(..SHORT_HEADER)
            .ok_or(FatalError::field(2, "HLEN"))?;
        let u32_at = |at: usize| u32::from_le_bytes([h[at], h[at + 1], h[at + 2], h[at + 3]]);
        Ok(DataHeader {
            cccid: u16::from_le_bytes([h[8], h[9]]),
            ttag: u16::from_le_bytes([h[10], h[11]]),
            offset: u32_at(12),
            length: u32_at(16),
        })
    }
}

/// The header (and header digest) of a PDU this side sends, ready to write: `len` bytes of
/// `bytes`.
#[derive(Debug, Clone, Copy)]
pub struct OutHeader {
    pub bytes: [u8; CAPSULE_CMD_HEADER + DIGEST],
    pub len: usize,
}

impl OutHeader {
    pub fn as_slice(&self) -> &[u8] {
        &self.bytes[..self.len]
    }

    /// A header of `hlen` bytes whose type-specific part `fill` writes, for a PDU with
    /// `data` bytes of data; the PDO and the digests follow `digests` and `alignment` (the
    /// peer's PDA, dwords, 0's based).
    fn build(
        pdu_type: PduType,
        extra_flags: u8,
        hlen: usize,
        data: usize,
        digests: Digests,
        alignment: u8,
        fill: impl FnOnce(&mut [u8]),
    ) -> OutHeader {
        let mut bytes = [0u8; CAPSULE_CMD_HEADER + DIGEST];
        let hdgst = digests.header && pdu_type.digestible();
        let header_bytes = hlen + if hdgst { DIGEST } else { 0 };
        let (pdo, plen) = if data == 0 {
            (0, header_bytes)
        } else {
            let align = (alignment as usize + 1) * 4;
            let pdo = header_bytes.div_ceil(align) * align;
            let ddgst = if digests.data { DIGEST } else { 0 };
            (pdo, pdo + data + ddgst)
        };
        let flags = extra_flags
            | Digests::flags(
                Digests {
                    header: hdgst,
                    data: digests.data,
                },
                data > 0,
            );
        common(&mut bytes, pdu_type, flags, hlen, pdo, plen);
        fill(&mut bytes[..hlen]);
        if hdgst {
            let digest = crc32c(&bytes[..hlen]);
            bytes[hlen..hlen + DIGEST].copy_from_slice(&digest.to_le_bytes());
        }
        OutHeader {
            bytes,
            len: header_bytes,
        }
    }

    /// Padding between this header and its data (up to PDO).
    pub fn pad(&self) -> usize {
        let pdo = self.bytes[3] as usize;
        pdo.saturating_sub(self.len)
    }

    /// CapsuleCmd with `data` bytes of in-capsule data.
    pub fn capsule_cmd(sqe: &Sqe, data: usize, digests: Digests) -> OutHeader {
        Self::build(
            PduType::CapsuleCmd,
            0,
            CAPSULE_CMD_HEADER,
            data,
            digests,
            0,
            |h| h[8..72].copy_from_slice(sqe.as_bytes()),
        )
    }

    /// CapsuleResp.
    pub fn capsule_resp(cqe: &Cqe, digests: Digests) -> OutHeader {
        Self::build(PduType::CapsuleResp, 0, SHORT_HEADER, 0, digests, 0, |h| {
            h[8..24].copy_from_slice(cqe.as_bytes())
        })
    }

    /// H2CData or C2HData carrying `d.length` bytes; `extra_flags`: LAST_PDU, SUCCESS.
    pub fn data(
        pdu_type: PduType,
        d: &DataHeader,
        extra_flags: u8,
        digests: Digests,
        alignment: u8,
    ) -> OutHeader {
        Self::build(
            pdu_type,
            extra_flags,
            SHORT_HEADER,
            d.length as usize,
            digests,
            alignment,
            |h| data_fields(h, d),
        )
    }

    /// R2T asking for `d.length` bytes at `d.offset`.
    pub fn r2t(d: &DataHeader, digests: Digests) -> OutHeader {
        Self::build(PduType::R2T, 0, SHORT_HEADER, 0, digests, 0, |h| {
            data_fields(h, d)
        })
    }
}

fn data_fields(h: &mut [u8], d: &DataHeader) {
    h[8..10].copy_from_slice(&d.cccid.to_le_bytes());
    h[10..12].copy_from_slice(&d.ttag.to_le_bytes());
    h[12..16].copy_from_slice(&d.offset.to_le_bytes());
    h[16..20].copy_from_slice(&d.length.to_le_bytes());
}

fn common(b: &mut [u8], t: PduType, flags: u8, hlen: usize, pdo: usize, plen: usize) {
    b[0] = t as u8;
    b[1] = flags;
    b[2] = hlen as u8;
    b[3] = pdo as u8;
    b[4..8].copy_from_slice(&(plen as u32).to_le_bytes());
}

/// A TermReq (`pdu_type`: H2CTermReq or C2HTermReq) for `error`, carrying up to 128 bytes of
/// the offending PDU's header; built in place (no allocation).
pub fn term_req(pdu_type: PduType, error: &FatalError, offending: &[u8]) -> TermReq {
    TermReq::new(pdu_type, error, offending)
}

/// An encoded TermReq: its header and the offending bytes, [`TermReq::as_slice`].
#[derive(Debug, Clone, Copy)]
pub struct TermReq {
    bytes: [u8; SHORT_HEADER + TERM_REQ_MAX_DATA],
    len: usize,
}

impl TermReq {
    pub fn new(pdu_type: PduType, error: &FatalError, offending: &[u8]) -> TermReq {
        let data = &offending[..offending.len().min(TERM_REQ_MAX_DATA)];
        let len = SHORT_HEADER + data.len();
        let mut b = [0u8; SHORT_HEADER + TERM_REQ_MAX_DATA];
        common(&mut b, pdu_type, 0, SHORT_HEADER, 0, len);
        b[8..10].copy_from_slice(&error.fes().to_le_bytes());
        b[10..14].copy_from_slice(&error.fei().to_le_bytes());
        b[SHORT_HEADER..len].copy_from_slice(data);
        TermReq { bytes: b, len }
    }

    pub fn as_slice(&self) -> &[u8] {
        &self.bytes[..self.len]
    }
}

impl std::ops::Deref for TermReq {
    type Target = [u8];

    fn deref(&self) -> &[u8] {
        self.as_slice()
    }
}

/// The FES and FEI of a received TermReq header.
pub fn parse_term_req(header: &[u8]) -> Option<(u16, u32)> {
    let h = header.get(..SHORT_HEADER)?;
    Some((
        u16::from_le_bytes([h[8], h[9]]),
        u32::from_le_bytes([h[10], h[11], h[12], h[13]]),
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    const TARGET_RECEIVES: &[PduType] = &[
        PduType::IcReq,
        PduType::H2CTermReq,
        PduType::CapsuleCmd,
        PduType::H2CData,
    ];

    fn limits(digests: Digests) -> Limits {
        Limits {
            digests: Some(digests),
            max_data: 8192,
            alignment: 0,
        }
    }

    fn header(bytes: &[u8]) -> CommonHeader {
        let b: [u8; 8] = bytes[..8].try_into().expect("8 bytes");
        CommonHeader::parse(&b, TARGET_RECEIVES).expect("a header")
    }

    #[test]
    fn ic_req_round_trips_and_odd_values_are_named() {
        let req = IcReq {
            pfv: 0,
            hpda: 0,
            digests: Digests {
                header: true,
                data: false,
            },
            maxr2t: 0,
        };
        let bytes = req.encode();
        let h = header(&bytes);
        assert_eq!(h.pdu_type, PduType::IcReq);
        let l = h.layout(&Limits {
            digests: None,
            max_data: 0,
            alignment: 0,
        });
        assert_eq!(l.expect("layout").header_bytes, IC_HEADER);
        assert_eq!(IcReq::parse(&bytes), Ok(req));
        let mut bad = bytes;
        bad[8] = 1;
        assert_eq!(
            IcReq::parse(&bad),
            Err(FatalError::UnsupportedParameter {
                offset: 8,
                field: "PFV"
            })
        );
        let mut bad = bytes;
        bad[10] = 32;
        assert_eq!(IcReq::parse(&bad).map_err(|e| e.fei()), Err(10));
    }

    #[test]
    fn capsule_with_in_capsule_data_and_both_digests() {
        let d = Digests {
            header: true,
            data: true,
        };
        let h = OutHeader::capsule_cmd(&Sqe::new(0x01), 4096, d);
        assert_eq!(h.len, CAPSULE_CMD_HEADER + DIGEST);
        let c = header(h.as_slice());
        assert_eq!(c.flags, flags::HDGST | flags::DDGST);
        assert_eq!(c.pdo as usize, 76);
        assert_eq!(c.plen as usize, 76 + 4096 + 4);
        let layout = c.layout(&limits(d)).expect("layout");
        assert_eq!(
            layout,
            Layout {
                header_bytes: 76,
                pad: 0,
                data: 4096,
                data_digest: true
            }
        );
        assert_eq!(
            check_header_digest(h.as_slice(), CAPSULE_CMD_HEADER),
            Ok(())
        );
        let mut corrupt = h;
        corrupt.bytes[20] ^= 1;
        assert_eq!(
            check_header_digest(corrupt.as_slice(), CAPSULE_CMD_HEADER),
            Err(FatalError::HeaderDigest)
        );
    }

    #[test]
    fn bad_headers_are_refused_naming_the_field() {
        let none = Digests::default();
        let ok = OutHeader::capsule_cmd(&Sqe::new(0x02), 0, none);
        let cases: [(usize, u8, FatalError); 4] = [
            (2, 71, FatalError::field(2, "HLEN")),
            (1, flags::HDGST, FatalError::field(1, "FLAGS (HDGSTF)")),
            (3, 72, FatalError::field(3, "PDO")),
            (4, 10, FatalError::field(4, "PLEN")),
        ];
        for (at, value, expect) in cases {
            let mut b = ok.bytes;
            b[at] = value;
            assert_eq!(header(&b).layout(&limits(none)), Err(expect), "byte {at}");
        }
        // an unknown type, and one the target never receives
        for t in [0x08u8, PduType::CapsuleResp as u8] {
            let mut b = [0u8; 8];
            b.copy_from_slice(&ok.bytes[..8]);
            b[0] = t;
            assert_eq!(
                CommonHeader::parse(&b, TARGET_RECEIVES),
                Err(FatalError::field(0, "PDU-Type"))
            );
        }
        // more data in one PDU than advertised
        let big = OutHeader::capsule_cmd(&Sqe::new(0x01), 8196, none);
        assert!(matches!(
            header(big.as_slice()).layout(&limits(none)),
            Err(FatalError::DataLimitExceeded(_))
        ));
    }

    #[test]
    fn data_pdus_are_aligned_to_the_peers_pda() {
        let d = DataHeader {
            cccid: 7,
            ttag: 3,
            offset: 4096,
            length: 512,
        };
        let h = OutHeader::data(PduType::C2HData, &d, flags::LAST_PDU, Digests::default(), 1);
        assert_eq!(h.bytes[3], 24); // PDO: 24 is a multiple of 8
        let h = OutHeader::data(PduType::C2HData, &d, 0, Digests::default(), 3);
        assert_eq!(h.bytes[3], 32); // 16-byte alignment
        assert_eq!(h.pad(), 8);
        assert_eq!(DataHeader::parse(h.as_slice()), Ok(d));
    }

    #[test]
    fn term_req_carries_the_status_and_the_offending_header() {
        let e = FatalError::field(3, "PDO");
        let b = term_req(PduType::C2HTermReq, &e, &[0xAB; 200]);
        assert_eq!(b.len(), SHORT_HEADER + TERM_REQ_MAX_DATA);
        assert_eq!(parse_term_req(&b), Some((1, 3)));
        assert_eq!(&b[SHORT_HEADER..SHORT_HEADER + 2], &[0xAB, 0xAB]);
    }
}
