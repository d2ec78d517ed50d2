//! The byte stream: malformed PDUs, data straight into and out of the commands' buffers,
//! back pressure on a host that does not read, many reads in one write, data digests.

use super::*;

#[test]
fn malformed_pdus_end_the_connection_with_a_term_req_naming_the_field() {
    // (bytes to send after the ICReq, FES, FEI)
    let mut wrong_hlen = OutHeader::capsule_cmd(&Sqe::new(0), 0, Digests::default()).bytes;
    wrong_hlen[2] = 70;
    let mut oversized = OutHeader::capsule_cmd(&Sqe::new(0), 0, Digests::default()).bytes;
    oversized[4..8].copy_from_slice(&(1u32 << 30).to_le_bytes());
    oversized[3] = 72;
    let stray_data = OutHeader::data(
        PduType::H2CData,
        &DataHeader {
            cccid: 1,
            ttag: 3,
            offset: 0,
            length: 4,
        },
        flags::LAST_PDU,
        Digests::default(),
        0,
    );
    let mut stray = stray_data.as_slice().to_vec();
    stray.extend_from_slice(&[1, 2, 3, 4]);
    let cases: Vec<(Vec<u8>, u16, u32)> = vec![
        (wrong_hlen[..72].to_vec(), 1, 2),
        (oversized[..72].to_vec(), 5, 0),
        (stray, 1, 10),
        (
            IcReq {
                pfv: 0,
                hpda: 0,
                digests: Digests::default(),
                maxr2t: 0,
            }
            .encode()
            .to_vec(),
            2,
            0,
        ),
        ([0x42u8, 0, 24, 0, 24, 0, 0, 0].to_vec(), 1, 0),
    ];
    for (bytes, fes, fei) in cases {
        let mut bed = Bed::new(None, Digests::default());
        bed.send(&bytes);
        let got = bed.take();
        assert!(
            matches!(got.last(), Some(Got::Term(f, i)) if (*f, *i) == (fes, fei)),
            "{bytes:?}: {got:?}"
        );
        assert!(bed.conn.finished().is_some());
        // nothing more is read once it is closing
        assert_eq!(bed.conn.receive(&[0; 8], &mut bed.backend), 0);
    }
    // a header digest mismatch
    let mut bed = Bed::new(None, both());
    let mut h = OutHeader::capsule_cmd(&Sqe::new(0), 0, both());
    h.bytes[20] ^= 1;
    bed.send(h.as_slice());
    assert!(matches!(bed.take().last(), Some(Got::Term(3, _))));
}

#[test]
fn write_data_is_received_into_the_buffer_and_read_data_sent_from_it() {
    for digests in [Digests::default(), both()] {
        let mut io = Bed::io_queue(digests);
        let capacity = io.conn.tx_capacity();
        for round in 0..4u32 {
            // in-capsule, 8 KiB at LBA 16
            let small: Vec<u8> = (0..8192u32).map(|i| (i * 3 + round) as u8).collect();
            let sqe = io.io(IoOpcode::Write, 16, 16, 0);
            io.capsule_whole(&sqe, &small);
            assert_eq!(io.status(), Status::SUCCESS);
            // R2T: 12 KiB at LBA 200 in three H2CData PDUs, all sent at once
            let big: Vec<u8> = (0..12288u32).map(|i| (i / 5 + round) as u8).collect();
            let mut sqe = io.io(IoOpcode::Write, 200, 24, 12288);
            sqe.set_cid(4);
            io.capsule_whole(&sqe, &[]);
            let Some(Got::R2T(r2t)) = io.take().first().map(|g| g.clone_r2t()) else {
                panic!("an R2T");
            };
            let mut pdus = Vec::new();
            for (i, part) in big.chunks(4096).enumerate() {
                let at = i as u32 * 4096;
                pdus.extend(h2c_pdu(4, r2t.ttag, at, part, i == 2, digests));
            }
            io.send_whole(&pdus);
            assert_eq!(io.status(), Status::SUCCESS);
            assert_eq!(io.conn.copied(), 0, "no data copied in round {round}");
            // read both back: the data waits in the buffer, not in the transmit queue
            for (slba, want) in [(16u64, &small), (200, &big)] {
                let len = want.len() as u32;
                let sqe = io.io(IoOpcode::Read, slba, len / 512, len);
                io.capsule_whole(&sqe, &[]);
                assert!(io.conn.tx.pending() < want.len(), "headers only are queued");
                assert_eq!(io.backend.buffers_held(), 1, "held until sent");
                match &io.take()[..] {
                    [Got::Data(d, data), Got::Resp(c)] => {
                        assert_eq!((d.length, c.status()), (len, Status::SUCCESS));
                        assert_eq!(data, want);
                    }
                    other => panic!("{other:?}"),
                }
                assert_eq!(io.backend.buffers_held(), 0);
            }
        }
        assert_eq!(
            io.conn.tx_capacity(),
            capacity,
            "the transmit queue never grew"
        );
    }
}

#[test]
fn a_host_that_does_not_read_its_responses_is_paused_and_the_transmit_buffer_never_grows() {
    let (mut admin, _) = Bed::admin_queue(Digests::default());
    let capacity = admin.conn.tx_capacity();
    let one = OutHeader::capsule_cmd(&identify_controller(), 0, Digests::default());
    let many: Vec<u8> = (0..100).flat_map(|_| one.as_slice().to_vec()).collect();
    // 100 Identify answers are 400 KiB: reading stops once 16 KiB wait to be sent
    let taken = admin.conn.receive(&many, &mut admin.backend);
    assert!(taken < many.len() / 10, "took {taken} bytes");
    assert_eq!(admin.conn.tx_capacity(), capacity);
    // the host reads, and the rest is served
    let mut answered = 0;
    let mut rest = &many[taken..];
    loop {
        let got = admin.take();
        answered += got
            .iter()
            .filter(|g| matches!(g, Got::Resp(c) if c.status() == Status::SUCCESS))
            .count();
        if rest.is_empty() && got.is_empty() {
            break;
        }
        let n = admin.conn.receive(rest, &mut admin.backend);
        rest = &rest[n..];
    }
    assert_eq!(answered, 100);
    assert_eq!(
        admin.conn.tx_capacity(),
        capacity,
        "the transmit buffer never grew"
    );
}

#[test]
fn a_full_queue_of_reads_is_sent_from_the_buffers_in_order() {
    let mut io = Bed::io_queue(both());
    for (i, b) in io.backend.namespaces[0].iter_mut().enumerate() {
        *b = (i / 512 * 7 + i % 512) as u8;
    }
    // 32 reads (every queue entry) of one block each, completed at once: more parts
    // (header, data, response) than one writev takes
    let mut pdus = Vec::new();
    for i in 0..32u16 {
        let mut sqe = io.io(IoOpcode::Read, u64::from(i) * 3, 1, 512);
        sqe.set_cid(100 + i);
        let h = OutHeader::capsule_cmd(&sqe, 0, both());
        pdus.extend_from_slice(h.as_slice());
    }
    io.send_whole(&pdus);
    assert_eq!(
        io.backend.buffers_held(),
        32,
        "every buffer held until sent"
    );
    let got = io.take();
    assert_eq!(got.len(), 64);
    for (i, pair) in got.chunks(2).enumerate() {
        let lba = i * 3;
        match pair {
            [Got::Data(d, data), Got::Resp(c)] => {
                assert_eq!((d.cccid, c.cid), (100 + i as u16, 100 + i as u16));
                assert_eq!(data[..], io.backend.namespaces[0][lba * 512..][..512]);
            }
            other => panic!("{other:?}"),
        }
    }
    assert_eq!(io.backend.buffers_held(), 0);
}

#[test]
fn a_bad_data_digest_on_data_for_the_drives_ends_the_connection() {
    let mut io = Bed::io_queue(both());
    let sqe = io.io(IoOpcode::Write, 0, 8, 4096);
    io.capsule_whole(&sqe, &[]);
    let Some(Got::R2T(r2t)) = io.take().first().map(|g| g.clone_r2t()) else {
        panic!("an R2T");
    };
    let mut pdu = h2c_pdu(sqe.cid(), r2t.ttag, 0, &[7; 4096], true, both());
    let n = pdu.len();
    pdu[n - 1] ^= 1;
    io.send_whole(&pdu);
    assert!(matches!(io.take().last(), Some(Got::Term(1, 0))));
    assert_eq!(io.backend.buffers_held(), 0);
    assert!(io.conn.finished().is_some());
    assert!(io.backend.namespaces[0][..4096].iter().all(|&b| b == 0));
}
