//! Receiving: PDUs read from the wire and acted on. C2HData lands in its command's buffer,
//! a CapsuleResp completes its command, an R2T is answered, a C2HTermReq ends the queue; a
//! malformed PDU ends it with an H2CTermReq.

use usnvme_driver::spec::{Cqe, Status};
use usnvme_hugepages::IovaMemory;
use vm_memory::VolatileSlice;

use super::{
    field, slice, Completion, Dir, Failure, Phase, Session, Slot, HPDA, MAX_ENTRIES, RX_BATCH,
    SLOT_BITS,
};
use crate::fabric::framing::socket::ReadWire;
use crate::fabric::framing::{Ahead, Need, Read, Rules, Step};
use crate::fabric::pdu::{
    self, flags, DataHeader, FatalError, Limits, PduType, DIGEST, SHORT_HEADER,
};

/// Most bytes one [`Session::receive_from`] takes before it lets the caller do other work.
const READ_BUDGET: usize = 1 << 20;

/// PDU types the host receives before and after ICResp.
const SETUP: &[PduType] = &[PduType::IcResp, PduType::C2HTermReq];
const READY: &[PduType] = &[
    PduType::C2HTermReq,
    PduType::CapsuleResp,
    PduType::C2HData,
    PduType::R2T,
];

/// How a [`Session::receive_from`] ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Receive {
    /// Nothing more is there now (or this turn's budget is used up).
    Drained,
    /// The queue ended (the source closed, or a protocol error): see [`Session::ended`].
    Ended,
}

/// Where a C2HData's data goes: its command's buffer from `offset`.
#[derive(Debug, Clone, Copy)]
pub(super) struct Transfer {
    slot: u16,
    offset: u32,
    flags: u8,
}

/// The end of a C2HData's or R2T's range: it starts at `next`, where the last one ended (else
/// the error `not_next`), and stays within the command's `len` bytes (else `beyond`).
pub(super) fn range_end(
    d: &DataHeader,
    next: u32,
    len: u32,
    not_next: &'static str,
    beyond: &'static str,
) -> Result<u32, FatalError> {
    if d.offset != next {
        return Err(FatalError::DataOutOfRange(not_next));
    }
    d.offset
        .checked_add(d.length)
        .filter(|&e| e <= len)
        .ok_or(FatalError::DataOutOfRange(beyond))
}

/// The `len` bytes of its command's buffer a C2HData fills.
fn destination<'m>(
    mem: &'m IovaMemory,
    slots: &'m [Slot],
) -> impl Fn(&Transfer, usize) -> Option<VolatileSlice<'m>> {
    move |t, len| slice(mem, slots.get(t.slot as usize)?.iova, t.offset, len)
}

impl Session {
    /// Reads from `src` and acts on what came, until it has nothing more now or the queue
    /// ends; completions go to `on_done`. Read data goes into the DMA buffers (copied once
    /// from the receive buffer, or read straight in).
    pub fn receive_from<R: ReadWire + ?Sized>(
        &mut self,
        src: &mut R,
        mem: &IovaMemory,
        on_done: &mut impl FnMut(Completion),
    ) -> Receive {
        let mut budget = READ_BUDGET;
        loop {
            if self.phase == Phase::Ended {
                return Receive::Ended;
            }
            let need = match self.step(mem, on_done) {
                Ok(None) => continue,
                Ok(Some(need)) => need,
                Err(e) => {
                    self.protocol_error(e);
                    continue;
                }
            };
            let hdgst = if self.link.digests.header { DIGEST } else { 0 };
            let ahead = Ahead {
                // every PDU a host receives in I/O has a 24-byte header: a response and the
                // header after it
                peek: 2 * (SHORT_HEADER + hdgst),
                // many PDUs per read once connected (set-up reads exactly what it waits for)
                batch: if self.phase == Phase::Ready {
                    RX_BATCH
                } else {
                    0
                },
            };
            let dest = destination(mem, &self.slots);
            match self.rx.read(src, need, ahead, &mut budget, dest) {
                Ok(Read::Got(_)) => {}
                Ok(Read::Drained) => return Receive::Drained,
                Ok(Read::Ended) => self.end(Failure::Closed),
                Err(e) => {
                    log::log!(self.log_level(), "NVMe/TCP queue {}: {e}", self.params.qid);
                    self.end(Failure::Closed);
                }
            }
        }
    }

    /// Acts on what the receive buffer holds: None when something was done (call again), else
    /// what is needed to go on.
    fn step(
        &mut self,
        mem: &IovaMemory,
        on_done: &mut impl FnMut(Completion),
    ) -> Result<Option<Need>, FatalError> {
        let setup = self.phase == Phase::AwaitIcResp;
        let allowed = if setup { SETUP } else { READY };
        let rules = Rules {
            known: allowed,
            now: allowed,
            out_of_sequence: "",
            limits: Limits {
                digests: (!setup).then_some(self.link.digests),
                max_data: self.params.max_transfer,
                alignment: HPDA,
            },
        };
        match self.rx.step(&rules, destination(mem, &self.slots))? {
            Step::Need(need) => return Ok(Some(need)),
            Step::Header(header, layout) if header.pdu_type == PduType::C2HData => {
                let head = &self.rx.pending()[..layout.header_bytes + layout.pad];
                let t = self.c2h_data(head, layout.data, header.flags)?;
                self.rx.receive_data(t, &layout);
            }
            // the rest is kept whole: at most a TermReq's 152 bytes
            Step::Header(header, layout) => self.rx.keep_whole(header, layout)?,
            Step::Whole(header, _) => {
                self.on_pdu(header.pdu_type, header.plen as usize, mem, on_done)?;
                if self.phase != Phase::Ended {
                    self.rx.next_pdu();
                }
            }
            Step::Data {
                tag: t,
                len,
                digest_ok,
            } => {
                self.rx.next_pdu();
                let s = &mut self.slots[t.slot as usize];
                s.received = t.offset + len as u32;
                s.corrupt |= !digest_ok;
                if t.flags & flags::SUCCESS != 0 {
                    // the target skipped the CapsuleResp: this is the command's completion
                    self.complete(t.slot, Status::SUCCESS, [0, 0], on_done);
                }
            }
        }
        Ok(None)
    }

    /// The slot of command `cid`, if it is in flight.
    pub(super) fn slot_of(&self, cid: u16) -> Option<u16> {
        let index = cid & (MAX_ENTRIES - 1);
        let s = self.slots.get(index as usize)?;
        (s.busy && s.generation == cid >> SLOT_BITS).then_some(index)
    }

    /// The slot of a C2HData's or R2T's command `cccid`: in flight, and moving its data `dir`
    /// (else the error `wrong`).
    pub(super) fn data_slot(
        &self,
        cccid: u16,
        dir: Dir,
        wrong: &'static str,
    ) -> Result<u16, FatalError> {
        let index = self.slot_of(cccid).ok_or(field(8, "CCCID"))?;
        if self.slots[index as usize].dir != dir {
            return Err(FatalError::Sequence(wrong));
        }
        Ok(index)
    }

    /// Checks a C2HData header against its command: where its data goes.
    fn c2h_data(&self, header: &[u8], data: usize, f: u8) -> Result<Transfer, FatalError> {
        let d = DataHeader::parse(header)?;
        let index = self.data_slot(
            d.cccid,
            Dir::FromController,
            "C2HData for a command that reads nothing",
        )?;
        let s = &self.slots[index as usize];
        if d.length as usize != data {
            return Err(field(16, "DATAL"));
        }
        let end = range_end(
            &d,
            s.received,
            s.len,
            "C2HData not at the next offset",
            "C2HData beyond the command's data",
        )?;
        let last = f & flags::LAST_PDU != 0;
        if last && end != s.len {
            return Err(FatalError::DataOutOfRange(
                "LAST_PDU before the end of the data",
            ));
        }
        if f & flags::SUCCESS != 0 && !last {
            return Err(field(1, "FLAGS (SUCCESS without LAST_PDU)"));
        }
        Ok(Transfer {
            slot: index,
            offset: d.offset,
            flags: f,
        })
    }

    /// A whole PDU (not C2HData) in the receive buffer, `plen` bytes.
    fn on_pdu(
        &mut self,
        t: PduType,
        plen: usize,
        mem: &IovaMemory,
        on_done: &mut impl FnMut(Completion),
    ) -> Result<(), FatalError> {
        match t {
            PduType::IcResp => self.on_ic_resp(plen),
            PduType::C2HTermReq => {
                let (fes, fei) = pdu::parse_term_req(&self.rx.pending()[..plen]).unwrap_or((0, 0));
                log::log!(
                    self.log_level(),
                    "NVMe/TCP queue {}: the target ended the connection (FES {fes}, FEI {fei})",
                    self.params.qid
                );
                self.end(Failure::Terminated { fes, fei });
                Ok(())
            }
            PduType::CapsuleResp => {
                let cqe = self
                    .rx
                    .pending()
                    .get(8..SHORT_HEADER)
                    .and_then(Cqe::from_slice)
                    .ok_or(field(2, "HLEN"))?;
                if self.phase == Phase::AwaitConnect {
                    return self.on_connect_resp(&cqe);
                }
                let index = self.slot_of(cqe.cid).ok_or(field(20, "CID"))?;
                let s = self.slots[index as usize];
                let status = cqe.status();
                if status.is_success() {
                    let missing = match s.dir {
                        Dir::FromController => s.received < s.len,
                        Dir::ToController => !s.in_capsule && s.requested < s.len,
                        Dir::None => false,
                    };
                    if missing {
                        return Err(FatalError::DataOutOfRange(
                            "command succeeded before all its data moved",
                        ));
                    }
                }
                self.complete(index, status, [cqe.dw0, cqe.dw1], on_done);
                Ok(())
            }
            PduType::R2T => {
                let d = DataHeader::parse(&self.rx.pending()[..plen])?;
                self.on_r2t(&d, mem)
            }
            _ => Err(field(0, "PDU-Type")),
        }
    }

    /// A malformed PDU: an H2CTermReq naming the field (after what is queued), then the end.
    fn protocol_error(&mut self, error: FatalError) {
        log::log!(
            self.log_level(),
            "NVMe/TCP queue {}: the target broke the protocol: {error} (FES {}, FEI {})",
            self.params.qid,
            error.fes(),
            error.fei()
        );
        let bad = pdu::offending(self.rx.pending());
        let term = pdu::TermReq::new(PduType::H2CTermReq, &error, bad);
        self.push_bytes(term.as_slice());
        self.end(Failure::Protocol(error));
    }
}
