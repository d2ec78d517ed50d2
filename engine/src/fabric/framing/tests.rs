//! The framing on its own: streams of PDUs received cut at every byte, sent through sinks
//! that take a few bytes at a time, digests, budgets and the transmit buffer's limits.

use std::io;

use usnvme_driver::spec::{Cqe, Status};
use vm_memory::VolatileSlice;

use super::*;
use crate::fabric::framing::socket::{ReadWire, WriteWire};
use crate::fabric::pdu::{
    self, flags, DataHeader, Digests, FatalError, Limits, OutHeader, PduType, DIGEST, SHORT_HEADER,
};

const BOTH: Digests = Digests {
    header: true,
    data: true,
};
/// What a host receives.
const HOST: &[PduType] = &[
    PduType::CapsuleResp,
    PduType::C2HData,
    PduType::C2HTermReq,
    PduType::R2T,
];

fn rules(digests: Digests) -> Rules<'static> {
    Rules {
        known: HOST,
        now: HOST,
        out_of_sequence: "",
        limits: Limits {
            digests: Some(digests),
            max_data: 1 << 16,
            alignment: 3,
        },
    }
}

fn resp(cid: u16, digests: Digests) -> Vec<u8> {
    let cqe = Cqe::new(0, 0, 1, cid, Status::SUCCESS, false);
    OutHeader::capsule_resp(&cqe, digests).as_slice().to_vec()
}

/// A C2HData PDU with `data` at `offset`, padded to 16 bytes; with a wrong data digest if
/// `bad_digest`.
fn c2h(offset: u32, data: &[u8], digests: Digests, bad_digest: bool) -> Vec<u8> {
    let d = DataHeader {
        cccid: 1,
        ttag: 0,
        offset,
        length: data.len() as u32,
    };
    let h = OutHeader::data(PduType::C2HData, &d, flags::LAST_PDU, digests, 3);
    let mut out = h.as_slice().to_vec();
    out.resize(out.len() + h.pad(), 0);
    out.extend_from_slice(data);
    if digests.data {
        let crc = pdu::crc32c(data) ^ u32::from(bad_digest);
        out.extend_from_slice(&crc.to_le_bytes());
    }
    out
}

fn pattern(len: usize, seed: u8) -> Vec<u8> {
    (0..len)
        .map(|i| (i as u8).wrapping_mul(31) ^ seed)
        .collect()
}

/// Bytes from memory, a few at a time: at most `each` per read, and `WouldBlock` once when
/// the reader reaches `pause`.
struct Trickle<'a> {
    bytes: &'a [u8],
    taken: usize,
    each: usize,
    pause: usize,
    paused: bool,
}

impl<'a> Trickle<'a> {
    fn new(bytes: &'a [u8], each: usize, pause: usize) -> Trickle<'a> {
        Trickle {
            bytes,
            taken: 0,
            each,
            pause,
            paused: false,
        }
    }
}

impl ReadWire for Trickle<'_> {
    fn read_parts(&mut self, parts: &[VolatileSlice<'_>]) -> io::Result<usize> {
        if self.taken == self.pause && !self.paused {
            self.paused = true;
            return Err(io::ErrorKind::WouldBlock.into());
        }
        let mut stop = self.taken.saturating_add(self.each).min(self.bytes.len());
        if self.taken < self.pause {
            stop = stop.min(self.pause);
        }
        let mut window = &self.bytes[self.taken..stop];
        let n = window.read_parts(parts)?;
        self.taken += n;
        Ok(n)
    }
}

/// What a receiver handed to its owner.
#[derive(Debug, PartialEq, Eq)]
enum Got {
    Whole(PduType, Vec<u8>),
    Data { offset: usize, len: usize, ok: bool },
}

/// Receives all of `src` as an initiator would (C2HData into `dst` at its offset, the rest
/// kept whole), with `batch` bytes read ahead; what came, or the first error.
fn receive_all(
    rx: &mut Receiver<usize>,
    src: &mut impl ReadWire,
    dst: VolatileSlice<'_>,
    digests: Digests,
    batch: usize,
) -> Result<Vec<Got>, FatalError> {
    let dest = |at: &usize, len| dst.subslice(*at, len).ok();
    let ahead = Ahead {
        peek: 2 * (SHORT_HEADER + DIGEST),
        batch,
    };
    let mut got = Vec::new();
    loop {
        match rx.step(&rules(digests), dest)? {
            Step::Need(need) => {
                let mut budget = usize::MAX;
                match rx.read(src, need, ahead, &mut budget, dest).expect("read") {
                    Read::Got(n) => assert!(n > 0),
                    Read::Drained => {}
                    Read::Ended => return Ok(got),
                }
            }
            Step::Header(header, layout) if header.pdu_type == PduType::C2HData => {
                let d = DataHeader::parse(rx.pending()).expect("a data header");
                rx.receive_data(d.offset as usize, &layout);
            }
            Step::Header(header, layout) => rx.keep_whole(header, layout)?,
            Step::Whole(header, _) => {
                let plen = header.plen as usize;
                got.push(Got::Whole(header.pdu_type, rx.pending()[..plen].to_vec()));
                rx.next_pdu();
            }
            Step::Data {
                tag,
                len,
                digest_ok,
            } => {
                got.push(Got::Data {
                    offset: tag,
                    len,
                    ok: digest_ok,
                });
                rx.next_pdu();
            }
        }
    }
}

#[test]
fn a_stream_cut_at_every_byte_is_received_the_same() {
    for digests in [Digests::default(), BOTH] {
        let (first, second) = (pattern(300, 1), pattern(77, 2));
        let term = pdu::TermReq::new(PduType::C2HTermReq, &FatalError::HeaderDigest, &[9; 40]);
        let mut stream = resp(5, digests);
        stream.extend(c2h(0, &first, digests, false));
        stream.extend(c2h(300, &second, digests, false));
        stream.extend(resp(6, digests));
        stream.extend_from_slice(term.as_slice());
        let want = vec![
            Got::Whole(PduType::CapsuleResp, resp(5, digests)),
            Got::Data {
                offset: 0,
                len: 300,
                ok: true,
            },
            Got::Data {
                offset: 300,
                len: 77,
                ok: true,
            },
            Got::Whole(PduType::CapsuleResp, resp(6, digests)),
            Got::Whole(PduType::C2HTermReq, term.as_slice().to_vec()),
        ];
        for (each, batch) in [(usize::MAX, 0), (1, 0), (7, 0), (usize::MAX, 4096)] {
            for pause in 0..=stream.len() {
                let mut buf = vec![0u8; 377];
                let mut rx = Receiver::new(4096 + pdu::MAX_HEADER + 256);
                let mut src = Trickle::new(&stream, each, pause);
                let dst = VolatileSlice::from(&mut buf[..]);
                let got = receive_all(&mut rx, &mut src, dst, digests, batch);
                let case = format!("{digests:?}, {each} a read, batch {batch}, cut at {pause}");
                assert_eq!(got.as_ref(), Ok(&want), "{case}");
                assert_eq!(&buf[..300], &first[..], "{case}");
                assert_eq!(&buf[300..], &second[..], "{case}");
                assert_eq!(rx.received(), stream.len() as u64, "{case}");
                assert!(!rx.mid_pdu(), "{case}");
                if batch == 0 && each == usize::MAX && pause == 0 {
                    // (the second PDU's header is read ahead with the first's digest, and
                    // with it some of its data)
                    assert!(rx.copied() <= 77, "the first data went straight in");
                }
            }
        }
    }
}

/// A source that counts the reads asked of it (system calls, on a socket).
struct Counting<'a> {
    inner: Trickle<'a>,
    reads: usize,
}

impl ReadWire for Counting<'_> {
    fn read_parts(&mut self, parts: &[VolatileSlice<'_>]) -> io::Result<usize> {
        self.reads += 1;
        self.inner.read_parts(parts)
    }
}

#[test]
fn batched_reads_take_many_pdus_at_once_and_copy_no_data_byte_twice() {
    for digests in [Digests::default(), BOTH] {
        let blocks: Vec<Vec<u8>> = (0..16).map(|i| pattern(4096, i as u8)).collect();
        let mut stream = Vec::new();
        for (i, block) in blocks.iter().enumerate() {
            stream.extend(c2h((i * 4096) as u32, block, digests, false));
            stream.extend(resp(i as u16, digests));
        }
        // the source hands out at most 10 000 bytes a read: most reads end inside a data
        let each = 10_000;
        let mut buf = vec![0u8; blocks.len() * 4096];
        let mut rx = Receiver::new(64 * 1024 + pdu::MAX_HEADER + 256);
        let mut src = Counting {
            inner: Trickle::new(&stream, each, usize::MAX),
            reads: 0,
        };
        let dst = VolatileSlice::from(&mut buf[..]);
        let got = receive_all(&mut rx, &mut src, dst, digests, 64 * 1024).expect("good");
        assert_eq!(got.len(), 2 * blocks.len(), "{digests:?}");
        assert_eq!(
            buf,
            blocks.concat(),
            "{digests:?}: every block where it belongs"
        );
        // every read took all it could (the last one finds the end)
        assert!(
            src.reads <= stream.len().div_ceil(each) + 1,
            "{digests:?}: {} reads for {} bytes",
            src.reads,
            stream.len()
        );
        // a data the read ended in comes straight into its destination with the next read:
        // what was copied from the receive buffer, it was once
        assert!(rx.copied() < buf.len() as u64, "{digests:?}");
        assert!(rx.copied() > 0, "{digests:?}");
    }
}

#[test]
fn data_read_ahead_with_its_header_is_copied_over_and_counted() {
    let data = pattern(100, 3);
    let stream = c2h(0, &data, Digests::default(), false);
    let mut buf = vec![0u8; 100];
    let mut rx = Receiver::new(4096);
    let mut src = Trickle::new(&stream, usize::MAX, usize::MAX);
    let dst = VolatileSlice::from(&mut buf[..]);
    let got = receive_all(&mut rx, &mut src, dst, Digests::default(), 4096).expect("good");
    assert_eq!(got.len(), 1);
    assert_eq!(buf, data);
    assert_eq!(rx.copied(), 100, "all of it came with the header");
}

#[test]
fn a_bad_data_digest_is_reported_and_the_stream_goes_on() {
    let mut stream = c2h(0, &pattern(64, 4), BOTH, true);
    stream.extend(resp(1, BOTH));
    let mut buf = [0u8; 64];
    let mut rx = Receiver::new(4096);
    let mut src = Trickle::new(&stream, 5, 30);
    let dst = VolatileSlice::from(&mut buf[..]);
    let got = receive_all(&mut rx, &mut src, dst, BOTH, 0).expect("no fatal error");
    assert_eq!(
        got,
        vec![
            Got::Data {
                offset: 0,
                len: 64,
                ok: false
            },
            Got::Whole(PduType::CapsuleResp, resp(1, BOTH)),
        ]
    );
}

#[test]
fn a_bad_header_digest_ends_the_stream_at_its_pdu() {
    let mut stream = resp(1, BOTH);
    let mut bad = resp(2, BOTH);
    bad[SHORT_HEADER] ^= 1;
    stream.extend_from_slice(&bad);
    for pause in 0..=stream.len() {
        let mut rx = Receiver::new(4096);
        let mut src = Trickle::new(&stream, 3, pause);
        let got = receive_all(&mut rx, &mut src, VolatileSlice::from(&mut [][..]), BOTH, 0);
        assert_eq!(got, Err(FatalError::HeaderDigest), "cut at {pause}");
        assert_eq!(rx.pending(), &bad[..], "the bad PDU is what is pending");
        rx.reset();
        assert!(!rx.mid_pdu());
    }
}

#[test]
fn a_pdu_kept_whole_has_its_data_digest_checked() {
    // a target keeps small in-capsule data whole
    let target = [PduType::CapsuleCmd];
    let rules = Rules {
        known: &target,
        now: &target,
        out_of_sequence: "",
        limits: Limits {
            digests: Some(BOTH),
            max_data: 4096,
            alignment: 0,
        },
    };
    let sqe = usnvme_driver::spec::Sqe::new(0x01);
    let data = pattern(16, 5);
    let h = OutHeader::capsule_cmd(&sqe, data.len(), BOTH);
    let mut pdu_bytes = h.as_slice().to_vec();
    pdu_bytes.extend_from_slice(&data);
    pdu_bytes.extend_from_slice(&pdu::crc32c(&data).to_le_bytes());
    for corrupt in [false, true] {
        let mut bytes = pdu_bytes.clone();
        if corrupt {
            bytes[h.as_slice().len()] ^= 0x80;
        }
        let mut rx: Receiver<()> = Receiver::new(4096);
        let mut src = Trickle::new(&bytes, usize::MAX, usize::MAX);
        let none = |_: &(), _| None;
        let ahead = Ahead { peek: 0, batch: 0 };
        let mut budget = usize::MAX;
        let outcome = loop {
            match rx.step(&rules, none) {
                Ok(Step::Need(need)) => {
                    let read = rx.read(&mut src, need, ahead, &mut budget, none);
                    assert!(matches!(read, Ok(Read::Got(_))), "{read:?}");
                }
                Ok(Step::Header(header, layout)) => {
                    rx.keep_whole(header, layout).expect("fits");
                }
                other => break other,
            }
        };
        if corrupt {
            assert_eq!(outcome, Err(FatalError::field(0, "data digest")));
        } else {
            let Ok(Step::Whole(header, layout)) = outcome else {
                panic!("{outcome:?}");
            };
            assert_eq!(header.plen as usize, bytes.len());
            let at = layout.header_bytes + layout.pad;
            assert_eq!(&rx.pending()[at..at + layout.data], &data[..]);
        }
    }
}

#[test]
fn types_out_of_place_are_refused_before_the_rest_of_their_header() {
    let known = [PduType::IcReq, PduType::CapsuleCmd];
    let rules = Rules {
        known: &known,
        now: &[PduType::IcReq],
        out_of_sequence: "ICReq expected first",
        limits: Limits {
            digests: None,
            max_data: 4096,
            alignment: 0,
        },
    };
    let sqe = usnvme_driver::spec::Sqe::new(0x01);
    let h = OutHeader::capsule_cmd(&sqe, 0, Digests::default());
    let none = |_: &(), _| None;
    let mut rx: Receiver<()> = Receiver::new(4096);
    let mut src = Trickle::new(&h.as_slice()[..8], usize::MAX, usize::MAX);
    let mut budget = usize::MAX;
    let ahead = Ahead { peek: 8, batch: 0 };
    assert_eq!(rx.step(&rules, none), Ok(Step::Need(Need::Header)));
    let read = rx.read(&mut src, Need::Header, ahead, &mut budget, none);
    assert_eq!(read.expect("read"), Read::Got(8));
    assert_eq!(
        rx.step(&rules, none),
        Err(FatalError::Sequence("ICReq expected first"))
    );
    // and a type this end never receives is a bad PDU-Type
    let resp = resp(1, Digests::default());
    let mut rx: Receiver<()> = Receiver::new(4096);
    let mut src = Trickle::new(&resp, usize::MAX, usize::MAX);
    let read = rx.read(&mut src, Need::Header, ahead, &mut budget, none);
    assert_eq!(read.expect("read"), Read::Got(8));
    assert_eq!(rx.step(&rules, none), Err(FatalError::field(0, "PDU-Type")));
}

#[test]
fn a_turn_stops_at_its_budget_and_a_closed_source_ends() {
    let stream = [resp(1, Digests::default()), resp(2, Digests::default())].concat();
    let none = |_: &usize, _| None;
    let ahead = Ahead { peek: 0, batch: 0 };
    let mut rx = Receiver::new(4096);
    let mut src = Trickle::new(&stream, usize::MAX, usize::MAX);
    let mut budget = 10;
    let read = rx.read(&mut src, Need::Exact(30), ahead, &mut budget, none);
    assert_eq!(read.expect("read"), Read::Got(30));
    assert_eq!(budget, 0);
    let read = rx.read(&mut src, Need::Exact(18), ahead, &mut budget, none);
    assert_eq!(read.expect("read"), Read::Drained, "the budget is used up");
    let mut budget = 100;
    let read = rx.read(&mut src, Need::Exact(18), ahead, &mut budget, none);
    assert_eq!(read.expect("read"), Read::Got(18));
    assert_eq!(rx.received(), 48);
    let read = rx.read(&mut src, Need::Header, ahead, &mut budget, none);
    assert_eq!(read.expect("read"), Read::Ended);
}

/// A sink taking at most `each` bytes a write, then `WouldBlock` once.
struct Sink {
    out: Vec<u8>,
    each: usize,
    blocked: bool,
}

impl WriteWire for Sink {
    fn write_parts(&mut self, parts: &[VolatileSlice<'_>]) -> io::Result<usize> {
        if self.blocked {
            self.blocked = false;
            return Err(io::ErrorKind::WouldBlock.into());
        }
        let mut all = Vec::new();
        all.write_parts(parts)?;
        let n = all.len().min(self.each);
        self.out.extend_from_slice(&all[..n]);
        self.blocked = true;
        Ok(n)
    }
}

/// Data buffers by index; which were reported sent, in order, and at what output length.
struct Bufs<'a> {
    slices: Vec<VolatileSlice<'a>>,
    sent: Vec<u8>,
}

impl Buffers<u8> for Bufs<'_> {
    fn data(&self, tag: u8, len: usize) -> Option<VolatileSlice<'_>> {
        self.slices.get(tag as usize)?.subslice(0, len).ok()
    }

    fn sent(&mut self, tag: u8) {
        self.sent.push(tag);
    }
}

#[test]
fn writes_cut_anywhere_send_the_same_bytes_and_report_data_once_sent() {
    let (mut a, mut b) = (pattern(200, 6), pattern(50, 7));
    let (a_copy, b_copy) = (a.clone(), b.clone());
    let slices = vec![
        VolatileSlice::from(&mut a[..]),
        VolatileSlice::from(&mut b[..]),
    ];
    let mut want = b"header-1".to_vec();
    want.extend([0, 0, 0]);
    want.extend_from_slice(&a_copy);
    want.extend_from_slice(&pdu::crc32c(&a_copy).to_le_bytes());
    want.extend_from_slice(b"header-2");
    want.extend_from_slice(&b_copy[..40]);
    want.extend_from_slice(b"end");
    for each in 1..=want.len() {
        let mut tx: Transmitter<u8> = Transmitter::new(64, 8);
        let capacity = tx.capacity();
        tx.push(b"header-1");
        tx.push_zeros(3);
        tx.push_data(0, 200, Some(slices[0]), true);
        tx.push(b"header-2");
        tx.push_data(1, 40, Some(slices[1]), false);
        tx.push(b"end");
        assert_eq!(tx.pending(), 8 + 3 + 4 + 8 + 3);
        let mut bufs = Bufs {
            slices: slices.clone(),
            sent: Vec::new(),
        };
        let mut sink = Sink {
            out: Vec::new(),
            each,
            blocked: false,
        };
        let mut rounds = 0;
        while !tx.is_empty() {
            let n = tx.transmit(&mut sink, &mut bufs).expect("sent");
            assert!(n <= each, "one write a turn here");
            let out = sink.out.len();
            // a data segment is reported once its last byte is out, not before
            let past_a = out >= 11 + 200;
            let past_b = out >= 11 + 200 + 4 + 8 + 40;
            let expect: Vec<u8> = [past_a.then_some(0), past_b.then_some(1)]
                .into_iter()
                .flatten()
                .collect();
            assert_eq!(bufs.sent, expect, "{each} a write, {out} out");
            rounds += 1;
            assert!(rounds <= 2 * want.len() + 2, "progress");
        }
        assert_eq!(sink.out, want, "{each} a write");
        assert_eq!(tx.pending(), 0);
        assert_eq!(tx.capacity(), capacity, "nothing grew");
    }
}

#[test]
fn sent_bytes_make_room_and_the_buffer_never_grows() {
    let mut tx: Transmitter<u8> = Transmitter::new(32, 4);
    let capacity = tx.capacity();
    let mut bufs = Bufs {
        slices: Vec::new(),
        sent: Vec::new(),
    };
    let mut sink = Sink {
        out: Vec::new(),
        each: 20,
        blocked: false,
    };
    let mut want = Vec::new();
    for round in 0..20u8 {
        let bytes = [round; 12];
        tx.push(&bytes);
        want.extend_from_slice(&bytes);
        // the owner's back pressure: nothing more is taken while 20 bytes or more wait
        while tx.pending() >= 20 {
            tx.transmit(&mut sink, &mut bufs).expect("sent");
        }
        assert_eq!(tx.capacity(), capacity, "round {round}");
    }
    while !tx.is_empty() {
        tx.transmit(&mut sink, &mut bufs).expect("sent");
    }
    assert_eq!(sink.out, want);
    assert_eq!(tx.capacity(), capacity);
}

#[test]
fn clearing_drops_everything_and_gives_back_the_data_segments() {
    let mut data = pattern(10, 8);
    let slice = VolatileSlice::from(&mut data[..]);
    let mut tx: Transmitter<u8> = Transmitter::new(64, 8);
    tx.push(b"abc");
    tx.push_data(7, 10, Some(slice), true);
    tx.push_data(9, 10, Some(slice), false);
    assert!(!tx.is_empty());
    let mut dropped = Vec::new();
    tx.clear(|tag| dropped.push(tag));
    assert_eq!(dropped, [7, 9]);
    assert!(tx.is_empty());
    assert_eq!(tx.pending(), 0);
    let mut out = Vec::new();
    let mut bufs = Bufs {
        slices: Vec::new(),
        sent: Vec::new(),
    };
    assert_eq!(tx.transmit(&mut out, &mut bufs).expect("nothing"), 0);
    assert!(out.is_empty());
}

#[test]
fn a_data_segment_outside_its_buffer_is_an_error_not_a_panic() {
    let mut tx: Transmitter<u8> = Transmitter::new(64, 8);
    tx.push_data(0, 10, None, false);
    let mut bufs = Bufs {
        slices: Vec::new(),
        sent: Vec::new(),
    };
    let mut out = Vec::new();
    assert!(tx.transmit(&mut out, &mut bufs).is_err());
}
