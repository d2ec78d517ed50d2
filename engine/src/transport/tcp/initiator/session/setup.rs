//! Set-up of a queue: ICReq (queued by [`Session::new`]), ICResp checked, the Fabrics
//! Connect sent and its response taken; and the transmit queue sized for what was granted.

use usnvme_driver::spec::fabrics::{CATTR_DISABLE_SQ_FLOW, CONNECT_DATA};
use usnvme_driver::spec::{ConnectResponse, Cqe, SglDescriptor, Sqe};

use super::{field, Failure, Phase, Session, CONNECT_CID};
use crate::fabric::pdu::{self, FatalError, IcResp, OutHeader, DIGEST, SHORT_HEADER};

/// What ICReq/ICResp settled.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct Negotiated {
    pub(super) digests: pdu::Digests,
    pub(super) maxh2cdata: u32,
}

/// Checks an ICResp against what we asked for.
fn check_ic_resp(resp: &IcResp, asked: pdu::Digests) -> Result<Negotiated, FatalError> {
    if resp.digests != asked {
        return Err(field(11, "DGST"));
    }
    // capsules carry their data right after the header; like Linux, refuse a target that
    // wants it aligned
    if resp.cpda != 0 {
        return Err(FatalError::UnsupportedParameter {
            offset: 10,
            field: "CPDA",
        });
    }
    Ok(Negotiated {
        digests: resp.digests,
        maxh2cdata: resp.maxh2cdata,
    })
}

impl Session {
    /// ICResp (`plen` bytes in the receive buffer): checked, then the Connect goes out.
    pub(super) fn on_ic_resp(&mut self, plen: usize) -> Result<(), FatalError> {
        let resp = IcResp::parse(&self.rx.pending()[..plen])?;
        self.link = check_ic_resp(&resp, self.asked)?;
        self.size_tx();
        let data = self
            .connect
            .take()
            .ok_or(FatalError::Sequence("a second ICResp"))?;
        // a slot frees only on its command's completion: the SQ head is not needed,
        // and a read may then end with its data, one PDU less (an admin queue keeps
        // SQ flow control, as Linux does: a target need not let it go there)
        let cattr = if self.params.qid == 0 {
            0
        } else {
            CATTR_DISABLE_SQ_FLOW
        };
        let (qid, entries) = (self.params.qid, self.params.entries);
        let mut sqe = Sqe::connect(qid, entries, cattr, self.kato_ms);
        sqe.set_cid(CONNECT_CID);
        sqe.set_sgl(SglDescriptor::in_capsule(CONNECT_DATA as u32));
        let digests = self.link.digests;
        let bytes = data.as_bytes();
        let header = OutHeader::capsule_cmd(&sqe, bytes.len(), digests);
        self.push_bytes(header.as_slice());
        self.push_bytes(bytes);
        if digests.data {
            self.push_bytes(&pdu::crc32c(bytes).to_le_bytes());
        }
        self.phase = Phase::AwaitConnect;
        Ok(())
    }

    /// The Connect's response: the queue is ready (an admin queue learns its controller), or
    /// ends with the status.
    pub(super) fn on_connect_resp(&mut self, cqe: &Cqe) -> Result<(), FatalError> {
        if cqe.cid != CONNECT_CID {
            return Err(field(20, "CID"));
        }
        if cqe.status().is_success() {
            if self.params.qid == 0 {
                self.params.cntlid = ConnectResponse::from_cqe(cqe).cntlid;
            }
            self.phase = Phase::Ready;
        } else {
            self.end(Failure::Status(cqe.status()));
        }
        Ok(())
    }

    /// Sizes the transmit queue for what can be queued at once: every command's capsule and
    /// the H2CData of its one outstanding R2T, and a TermReq.
    fn size_tx(&mut self) {
        let chunks = (self.params.max_transfer as usize).div_ceil(self.link.maxh2cdata as usize);
        let entries = self.params.entries as usize;
        let per_command =
            pdu::CAPSULE_CMD_HEADER + 2 * DIGEST + chunks * (SHORT_HEADER + 2 * DIGEST);
        let bytes = entries * per_command
            + pdu::CAPSULE_CMD_HEADER
            + CONNECT_DATA
            + 2 * DIGEST
            + SHORT_HEADER
            + pdu::TERM_REQ_MAX_DATA;
        let segments = entries * (2 + 2 * chunks) + 8;
        self.tx.reserve(bytes, segments);
    }
}
