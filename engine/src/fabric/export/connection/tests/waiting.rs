//! Commands that find no buffer or no room in their device's queue wait, in arrival order, and
//! start when room comes: none is refused, data goes where it belongs, nothing is left held.
//! Also what every command must say on a fabric (PSDT, FUSE), and the command a fuzzer of
//! SPDK's found unanswered.

use super::*;

/// Reads `blocks` of 512 bytes at `slba` on namespace 1, by C2HData, with CID `cid`.
fn read(io: &mut Bed, cid: u16, slba: u64, blocks: u32) -> Sqe {
    let mut sqe = io.io(IoOpcode::Read, slba, blocks, blocks * 512);
    sqe.set_cid(cid);
    sqe
}

/// Sends what the target wants sent and completes what the backend has, until the connection
/// has nothing more to say; what it said, in order.
fn drain(io: &mut Bed) -> Vec<Got> {
    let mut got = Vec::new();
    for _ in 0..64 {
        let more = io.take();
        io.backend.complete_all(&mut io.conn);
        let quiet = !io.conn.has_outgoing()
            && io.conn.in_flight_submitted() == 0
            && io.backend.waiting() == 0;
        if more.is_empty() && quiet {
            break;
        }
        got.extend(more);
    }
    got
}

/// The CIDs of the successful responses and C2HData PDUs in `got`, with each read's data.
fn answers(got: &[Got]) -> (Vec<u16>, Vec<(u16, Vec<u8>)>) {
    let mut done = Vec::new();
    let mut data = Vec::new();
    for g in got {
        match g {
            Got::Resp(c) => {
                assert_eq!(c.status(), Status::SUCCESS, "CID {}", c.cid);
                done.push(c.cid);
            }
            Got::Data(d, bytes) => data.push((d.cccid, bytes.clone())),
            other => panic!("unexpected {other:?}"),
        }
    }
    (done, data)
}

#[test]
fn reads_that_find_no_buffer_wait_and_start_in_arrival_order() {
    let mut io = Bed::io_queue(Digests::default());
    for (lba, b) in io.backend.namespaces[0].chunks_mut(512).enumerate() {
        b.fill(lba as u8);
    }
    io.backend.buffer_limit = 2;
    for cid in 0..8u16 {
        let sqe = read(&mut io, cid, u64::from(cid) * 3, 2);
        io.capsule(&sqe, &[]);
    }
    // two have buffers (their data waits to be sent), six wait
    assert_eq!(io.backend.waiting(), 6);
    let (done, data) = answers(&drain(&mut io));
    assert_eq!(
        done,
        (0..8).collect::<Vec<u16>>(),
        "every read, in the order sent"
    );
    for (cid, bytes) in data {
        let lba = usize::from(cid) * 3;
        assert_eq!(bytes[0], lba as u8, "CID {cid}");
        assert_eq!(bytes[512], (lba + 1) as u8, "CID {cid}");
    }
    assert_eq!(io.backend.buffers_held(), 0);
}

#[test]
fn writes_that_find_no_buffer_keep_their_data_aside_or_are_asked_for_it_later() {
    let mut io = Bed::io_queue(both());
    io.backend.buffer_limit = 1;
    // a read holds the one buffer until its data is sent
    let hold = read(&mut io, 1, 0, 1);
    io.capsule(&hold, &[]);
    // an in-capsule write and an R2T write: neither can have a buffer now
    let small: Vec<u8> = (0..4096u32).map(|i| (i * 7) as u8).collect();
    let mut in_capsule = io.io(IoOpcode::Write, 100, 8, 0);
    in_capsule.set_cid(2);
    io.capsule(&in_capsule, &small);
    let big: Vec<u8> = (0..8192u32).map(|i| (i / 3) as u8).collect();
    let mut by_r2t = io.io(IoOpcode::Write, 300, 16, 8192);
    by_r2t.set_cid(3);
    io.capsule(&by_r2t, &[]);
    assert_eq!(io.backend.waiting(), 2);
    // the read's data goes, then the in-capsule write (data from the holding area), then the
    // R2T write asks for its data
    let got = drain(&mut io);
    let r2t = got
        .iter()
        .find_map(|g| match g {
            Got::R2T(d) => Some(*d),
            _ => None,
        })
        .expect("an R2T once a buffer is free");
    assert_eq!((r2t.cccid, r2t.length), (3, 8192));
    let resps: Vec<u16> = got
        .iter()
        .filter_map(|g| match g {
            Got::Resp(c) => Some(c.cid),
            _ => None,
        })
        .collect();
    assert_eq!(resps, [1, 2]);
    io.send(&h2c_pdu(3, r2t.ttag, 0, &big, true, both()));
    let (done, _) = answers(&drain(&mut io));
    assert_eq!(done, [3]);
    let disk = &io.backend.namespaces[0];
    assert_eq!(&disk[100 * 512..108 * 512], &small[..]);
    assert_eq!(&disk[300 * 512..316 * 512], &big[..]);
    assert!(io.conn.copied() >= 4096, "the held data was copied once");
    assert_eq!(io.backend.buffers_held(), 0);
}

#[test]
fn commands_that_find_the_device_queue_full_wait_for_room_part_by_part() {
    let mut io = Bed::io_queue(Digests::default());
    io.backend.namespaces[0].fill(0xEE);
    io.backend.queue_limit = 1;
    // a Dataset Management of three ranges goes to the device one range at a time
    let mut dsm = io.io(IoOpcode::DatasetManagement, 0, 1, 0);
    dsm.set_cid(7);
    dsm.cdw10 = 2; // three ranges
    dsm.cdw11 = usnvme_driver::spec::command::DSM_DEALLOCATE;
    dsm.set_sgl(SglDescriptor::in_capsule(48));
    let mut ranges = [0u8; 48];
    for (i, (slba, blocks)) in [(0u64, 2u32), (10, 1), (20, 3)].into_iter().enumerate() {
        ranges[i * 16 + 4..i * 16 + 8].copy_from_slice(&blocks.to_le_bytes());
        ranges[i * 16 + 8..i * 16 + 16].copy_from_slice(&slba.to_le_bytes());
    }
    let pdu = io.capsule_pdu(&dsm, &ranges);
    io.conn.receive(&pdu, &mut io.backend);
    // and a flush and a write behind it, for the same device
    let mut flush = io.io(IoOpcode::Flush, 0, 1, 0);
    flush.set_cid(8);
    let pdu = io.capsule_pdu(&flush, &[]);
    io.conn.receive(&pdu, &mut io.backend);
    let mut write = io.io(IoOpcode::Write, 40, 1, 0);
    write.set_cid(9);
    let pdu = io.capsule_pdu(&write, &[0x5A; 512]);
    io.conn.receive(&pdu, &mut io.backend);
    assert_eq!(
        io.backend.waiting(),
        3,
        "the DSM's second part, the flush, the write"
    );
    let (done, _) = answers(&drain(&mut io));
    assert_eq!(done, [7, 8, 9]);
    let disk = &io.backend.namespaces[0];
    assert!(disk[..2 * 512].iter().all(|&b| b == 0));
    assert_eq!(disk[2 * 512], 0xEE);
    assert!(disk[10 * 512..11 * 512].iter().all(|&b| b == 0));
    assert!(disk[20 * 512..23 * 512].iter().all(|&b| b == 0));
    assert_eq!(disk[23 * 512], 0xEE);
    assert!(disk[40 * 512..41 * 512].iter().all(|&b| b == 0x5A));
    assert_eq!(io.backend.flushes[0], 1);
}

#[test]
fn a_host_that_goes_away_while_commands_wait_gets_every_buffer_back() {
    let mut io = Bed::io_queue(Digests::default());
    io.backend.buffer_limit = 2;
    io.backend.queue_limit = 1;
    for cid in 0..6u16 {
        let sqe = read(&mut io, cid, u64::from(cid), 1);
        io.capsule(&sqe, &[]);
    }
    let mut write = io.io(IoOpcode::Write, 40, 1, 0);
    write.set_cid(9);
    io.capsule(&write, &[0x5A; 512]);
    assert!(io.backend.waiting() > 0);
    io.conn.peer_gone("test", &mut io.backend);
    for _ in 0..8 {
        io.backend.complete_all(&mut io.conn);
    }
    assert!(io.conn.finished().is_some(), "drained");
    assert_eq!(io.backend.buffers_held(), 0);
    assert_eq!(io.backend.waiting(), 0, "the waiters lapsed");
}

/// The admin command SPDK's nvme_fuzz (v23.01.1, seed 123456) left waiting for an answer:
/// opcode B8h, NSID 2, PSDT 3, CID 30574, CDW10 C281B767h, CDW11 A9BA7874h.
fn fuzzed() -> Sqe {
    let mut sqe = Sqe::new(0xB8);
    sqe.nsid = 2;
    sqe.cdw10 = 0xC281_B767;
    sqe.cdw11 = 0xA9BA_7874;
    sqe.set_cid(30574);
    sqe
}

#[test]
fn the_fuzzers_command_is_answered_however_its_transport_fields_come() {
    for io_queue in [false, true] {
        for fuse in 0..4u8 {
            for psdt in 0..4u8 {
                for sgl in [
                    SglDescriptor::transport(0),
                    SglDescriptor::transport(4096),
                    SglDescriptor::in_capsule(0),
                    SglDescriptor::new(0x00, 0, 4096), // a data block with an address
                ] {
                    let mut bed = if io_queue {
                        Bed::io_queue(Digests::default())
                    } else {
                        Bed::admin_queue(Digests::default()).0
                    };
                    let mut sqe = fuzzed();
                    sqe.set_sgl(sgl);
                    sqe.set_fuse(fuse);
                    sqe.set_psdt(psdt);
                    let pdu = bed.capsule_raw_pdu(&sqe, &[]);
                    bed.send(&pdu);
                    let got = bed.take();
                    let case = format!("I/O queue {io_queue}, FUSE {fuse}, PSDT {psdt}, {sgl:?}");
                    let [Got::Resp(cqe)] = &got[..] else {
                        panic!("{case}: {got:?}");
                    };
                    assert_eq!(cqe.cid, 30574, "{case}");
                    // fused or not SGLs: Invalid Field; else an opcode nobody knows
                    let expected = if fuse != 0 || psdt != 1 {
                        Status::INVALID_FIELD
                    } else {
                        Status::INVALID_OPCODE
                    };
                    assert_eq!(cqe.status().code(), expected, "{case}");
                    assert!(cqe.status().dnr(), "{case}");
                }
            }
        }
    }
}
