//! The NVMe/RDMA transport binding's RDMA CM private data (NVMe over Fabrics 1.1, section
//! 7.3): what a host's connect request carries (the queue and its sizes), what a target's
//! accept answers (its receive queue size) and why it rejects one.

use thiserror::Error;

/// Bytes of the private data of a request, an accept and a reject.
pub const PRIVATE_DATA: usize = 32;
/// The record format this binding defines.
pub const RECFMT: u16 = 0;
/// An admin queue's entries at most (the Linux target's limit, NVME_AQ_DEPTH).
pub const ADMIN_QUEUE_MAX: u16 = 32;

/// A discovery log entry's RDMA transport specific address subtype (TSAS bytes 0..3): queue
/// pair type (reliable connected), provider type (none named), connection management (the
/// RDMA CM).
pub const RDMA_QPTYPE_CONNECTED: u8 = 1;
pub const RDMA_PRTYPE_NOT_SPECIFIED: u8 = 1;
pub const RDMA_CMS_RDMA_CM: u8 = 1;

/// A host's RDMA_CM_REQUEST private data.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CmRequest {
    pub qid: u16,
    /// Receive buffers the host posted for responses (HRQSIZE).
    pub hrqsize: u16,
    /// The host's submission queue size, 0's based, as in the Connect command (HSQSIZE).
    pub hsqsize: u16,
}

/// Why a target rejected a connect request (the reject's STS), or why a request is invalid.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Error)]
pub enum CmRejectStatus {
    #[error("invalid private data length")]
    InvalidPrivateDataLength,
    #[error("invalid record format")]
    InvalidRecfmt,
    #[error("invalid queue ID")]
    InvalidQid,
    #[error("invalid host submission queue size (HSQSIZE)")]
    InvalidHsqsize,
    #[error("invalid host receive queue size (HRQSIZE)")]
    InvalidHrqsize,
    #[error("no resources")]
    NoResources,
    #[error("invalid IRD")]
    InvalidIrd,
    #[error("invalid ORD")]
    InvalidOrd,
    #[error("status {0}")]
    Other(u16),
}

impl CmRejectStatus {
    pub fn code(self) -> u16 {
        match self {
            CmRejectStatus::InvalidPrivateDataLength => 1,
            CmRejectStatus::InvalidRecfmt => 2,
            CmRejectStatus::InvalidQid => 3,
            CmRejectStatus::InvalidHsqsize => 4,
            CmRejectStatus::InvalidHrqsize => 5,
            CmRejectStatus::NoResources => 6,
            CmRejectStatus::InvalidIrd => 7,
            CmRejectStatus::InvalidOrd => 8,
            CmRejectStatus::Other(c) => c,
        }
    }

    pub fn from_code(code: u16) -> CmRejectStatus {
        match code {
            1 => CmRejectStatus::InvalidPrivateDataLength,
            2 => CmRejectStatus::InvalidRecfmt,
            3 => CmRejectStatus::InvalidQid,
            4 => CmRejectStatus::InvalidHsqsize,
            5 => CmRejectStatus::InvalidHrqsize,
            6 => CmRejectStatus::NoResources,
            7 => CmRejectStatus::InvalidIrd,
            8 => CmRejectStatus::InvalidOrd,
            c => CmRejectStatus::Other(c),
        }
    }

    /// A reject's private data: RECFMT, STS.
    pub fn encode(self) -> [u8; PRIVATE_DATA] {
        let mut b = [0u8; PRIVATE_DATA];
        b[..2].copy_from_slice(&RECFMT.to_le_bytes());
        b[2..4].copy_from_slice(&self.code().to_le_bytes());
        b
    }

    /// The status of a reject's private data (None when there is none to read).
    pub fn decode(b: &[u8]) -> Option<CmRejectStatus> {
        let sts = b.get(2..4)?;
        Some(CmRejectStatus::from_code(u16::from_le_bytes([
            sts[0], sts[1],
        ])))
    }
}

fn le16(b: &[u8], at: usize) -> u16 {
    u16::from_le_bytes([b[at], b[at + 1]])
}

impl CmRequest {
    pub fn encode(&self) -> [u8; PRIVATE_DATA] {
        let mut b = [0u8; PRIVATE_DATA];
        b[..2].copy_from_slice(&RECFMT.to_le_bytes());
        b[2..4].copy_from_slice(&self.qid.to_le_bytes());
        b[4..6].copy_from_slice(&self.hrqsize.to_le_bytes());
        b[6..8].copy_from_slice(&self.hsqsize.to_le_bytes());
        b
    }

    /// A request's private data, checked as a target must (an admin queue of at most
    /// [`ADMIN_QUEUE_MAX`] entries; sizes of at least 2 entries and at most `max_entries`).
    pub fn decode(b: &[u8], max_entries: u16) -> Result<CmRequest, CmRejectStatus> {
        if b.len() < PRIVATE_DATA {
            return Err(CmRejectStatus::InvalidPrivateDataLength);
        }
        if le16(b, 0) != RECFMT {
            return Err(CmRejectStatus::InvalidRecfmt);
        }
        let r = CmRequest {
            qid: le16(b, 2),
            hrqsize: le16(b, 4),
            hsqsize: le16(b, 6),
        };
        let most = if r.qid == 0 {
            ADMIN_QUEUE_MAX.min(max_entries)
        } else {
            max_entries
        };
        if r.hsqsize == 0 || u32::from(r.hsqsize) + 1 > u32::from(most) {
            return Err(CmRejectStatus::InvalidHsqsize);
        }
        if r.hrqsize < 2 || r.hrqsize > most {
            return Err(CmRejectStatus::InvalidHrqsize);
        }
        Ok(r)
    }
}

/// A target's RDMA_CM_ACCEPT private data: its receive queue size (CRQSIZE).
pub fn encode_accept(crqsize: u16) -> [u8; PRIVATE_DATA] {
    let mut b = [0u8; PRIVATE_DATA];
    b[..2].copy_from_slice(&RECFMT.to_le_bytes());
    b[2..4].copy_from_slice(&crqsize.to_le_bytes());
    b
}

/// CRQSIZE of an accept's private data (None when it is too short).
pub fn decode_accept(b: &[u8]) -> Option<u16> {
    (b.len() >= 4).then(|| le16(b, 2))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_request_round_trips_and_bad_ones_are_refused_by_kind() {
        let r = CmRequest {
            qid: 3,
            hrqsize: 128,
            hsqsize: 127,
        };
        let b = r.encode();
        assert_eq!(&b[..8], &[0, 0, 3, 0, 128, 0, 127, 0]);
        assert_eq!(CmRequest::decode(&b, 1024), Ok(r));
        assert_eq!(
            CmRequest::decode(&b[..16], 1024),
            Err(CmRejectStatus::InvalidPrivateDataLength)
        );
        let mut bad = b;
        bad[0] = 1;
        assert_eq!(
            CmRequest::decode(&bad, 1024),
            Err(CmRejectStatus::InvalidRecfmt)
        );
        assert_eq!(
            CmRequest::decode(&b, 64),
            Err(CmRejectStatus::InvalidHsqsize)
        );
        let admin = CmRequest {
            qid: 0,
            hrqsize: 32,
            hsqsize: 32,
        };
        assert_eq!(
            CmRequest::decode(&admin.encode(), 1024),
            Err(CmRejectStatus::InvalidHsqsize)
        );
        let admin = CmRequest {
            hsqsize: 31,
            ..admin
        };
        assert_eq!(CmRequest::decode(&admin.encode(), 1024), Ok(admin));
    }

    #[test]
    fn accepts_and_rejects_carry_their_fields() {
        assert_eq!(decode_accept(&encode_accept(128)), Some(128));
        assert_eq!(decode_accept(&[0]), None);
        let r = CmRejectStatus::InvalidHsqsize.encode();
        assert_eq!(&r[..4], &[0, 0, 4, 0]);
        assert_eq!(
            CmRejectStatus::decode(&r),
            Some(CmRejectStatus::InvalidHsqsize)
        );
        assert_eq!(CmRejectStatus::decode(&[]), None);
        assert_eq!(CmRejectStatus::from_code(99), CmRejectStatus::Other(99));
    }
}
