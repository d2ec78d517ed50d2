//! The commands and their answers: Connect and its refusals, the SQ head, writes in the
//! capsule and by R2T, reads, bad commands, Dataset Management, SMART from the drives, a
//! shutdown's flushes, the drives' events reaching held Asynchronous Event Requests.

use usnvme_driver::spec::command::FeatureId;
use usnvme_driver::spec::fabrics::CATTR_DISABLE_SQ_FLOW;
use usnvme_driver::spec::log::LogPageId;

use super::*;

#[test]
fn responses_report_the_sq_head_and_without_sq_flow_control_a_read_ends_with_its_data() {
    let mut admin = Bed::new(None, Digests::default());
    let nqn = admin.sub.nqn.clone();
    // the Connect is the admin queue's first command: the head is past it
    let connected = admin.connect(0, 0xffff, &nqn, HOST);
    assert_eq!((connected.status(), connected.sqhd), (Status::SUCCESS, 1));
    let cntlid = connected.dw0 as u16;
    admin.enable();
    let read_of = |io: &mut Bed, cid: u16| {
        let mut sqe = io.io(IoOpcode::Read, 0, 8, 4096);
        sqe.set_cid(cid);
        io.capsule(&sqe, &[]);
        io.take()
    };
    // SQ flow control kept: data, then a response whose SQ head wraps at the queue's 16
    let mut io = Bed::new(None, Digests::default());
    io.conn.registry = admin.conn.registry.clone();
    assert_eq!(io.connect(1, cntlid, &nqn, HOST).sqhd, 1);
    for cid in 0..16u16 {
        match &read_of(&mut io, cid)[..] {
            [Got::Data(d, _), Got::Resp(c)] => {
                assert_eq!((d.cccid, c.cid, c.status()), (cid, cid, Status::SUCCESS));
                assert_eq!(c.sqhd, (cid + 2) % 16, "command {cid}");
            }
            other => panic!("{other:?}"),
        }
    }
    assert!(io.c2h_flags.iter().all(|f| f & flags::SUCCESS == 0));
    // disabled: the C2HData carries SUCCESS and LAST_PDU, and no response follows
    let mut io = Bed::new(None, Digests::default());
    io.conn.registry = admin.conn.registry.clone();
    let c = io.connect_with(2, cntlid, &nqn, HOST, CATTR_DISABLE_SQ_FLOW);
    assert_eq!((c.status(), c.sqhd), (Status::SUCCESS, 0));
    match &read_of(&mut io, 5)[..] {
        [Got::Data(d, data)] => assert_eq!((d.cccid, data.len()), (5, 4096)),
        other => panic!("{other:?}"),
    }
    assert_eq!(io.c2h_flags, [flags::LAST_PDU | flags::SUCCESS]);
    assert_eq!(
        io.backend.buffers_held(),
        0,
        "the read's buffer is back once sent"
    );
    // a failed read still gets its response
    let mut sqe = io.io(IoOpcode::Read, 1 << 40, 8, 4096);
    sqe.set_cid(6);
    io.capsule(&sqe, &[]);
    match &io.take()[..] {
        [Got::Resp(c)] => assert_eq!(c.status(), Status::LBA_OUT_OF_RANGE.with_dnr()),
        other => panic!("{other:?}"),
    }
}

#[test]
fn writes_in_capsule_and_by_r2t_read_back_with_and_without_digests() {
    for digests in [Digests::default(), both()] {
        let mut io = Bed::io_queue(digests);
        // in-capsule: 4 KiB at LBA 8
        let small: Vec<u8> = (0..4096u32).map(|i| i as u8).collect();
        let sqe = io.io(IoOpcode::Write, 8, 8, 0);
        io.capsule(&sqe, &small);
        assert_eq!(io.status(), Status::SUCCESS);
        // R2T: 12 KiB at LBA 100, sent in three H2CData PDUs of MAXH2CDATA (4 KiB)
        let big: Vec<u8> = (0..12288u32).map(|i| (i / 7) as u8).collect();
        let mut sqe = io.io(IoOpcode::Write, 100, 24, 12288);
        sqe.set_cid(9);
        io.capsule(&sqe, &[]);
        let got = io.take();
        let Some(Got::R2T(r2t)) = got.first() else {
            panic!("an R2T: {got:?}");
        };
        assert_eq!((r2t.cccid, r2t.offset, r2t.length), (9, 0, 12288));
        for (i, part) in big.chunks(4096).enumerate() {
            let d = DataHeader {
                cccid: 9,
                ttag: r2t.ttag,
                offset: i as u32 * 4096,
                length: 4096,
            };
            let last = if i == 2 { flags::LAST_PDU } else { 0 };
            let h = OutHeader::data(PduType::H2CData, &d, last, digests, 0);
            let mut pdu = h.as_slice().to_vec();
            pdu.resize(pdu.len() + h.pad(), 0);
            pdu.extend_from_slice(part);
            if digests.data {
                pdu.extend_from_slice(&pdu::crc32c(part).to_le_bytes());
            }
            io.send(&pdu);
        }
        assert_eq!(io.status(), Status::SUCCESS);
        assert_eq!(
            &io.backend.namespaces[0][100 * 512..100 * 512 + 12288],
            &big[..]
        );
        // read both back
        for (slba, want) in [(8u64, &small), (100, &big)] {
            let len = want.len() as u32;
            let sqe = io.io(IoOpcode::Read, slba, len / 512, len);
            io.capsule(&sqe, &[]);
            let got = io.take();
            match &got[..] {
                [Got::Data(d, data), Got::Resp(c)] => {
                    assert_eq!(d.length, len);
                    assert_eq!(data, want);
                    assert_eq!(c.status(), Status::SUCCESS);
                }
                other => panic!("{other:?}"),
            }
        }
        assert_eq!(io.backend.buffers_held(), 0);
    }
}

#[test]
fn bad_commands_fail_by_status_and_the_connection_goes_on() {
    let mut io = Bed::io_queue(Digests::default());
    let sqe = io.io(IoOpcode::Read, 2047, 2, 1024); // past the end (2048 blocks)
    io.capsule(&sqe, &[]);
    assert_eq!(io.status(), Status::LBA_OUT_OF_RANGE.with_dnr()); // the same command would fail again
    let mut sqe = io.io(IoOpcode::Read, 0, 1, 512);
    sqe.nsid = 9;
    io.capsule(&sqe, &[]);
    assert_eq!(io.status(), Status::INVALID_NAMESPACE.with_dnr()); // the same command would fail again
    let sqe = io.io(IoOpcode::Read, 0, 2, 512); // SGL says 512 bytes, the command 1024
    io.capsule(&sqe, &[]);
    assert_eq!(io.status(), Status::DATA_SGL_LENGTH_INVALID.with_dnr()); // the same command would fail again
    let sqe = io.io(0x55u8, 0, 1, 512);
    io.capsule(&sqe, &[]);
    assert_eq!(io.status(), Status::INVALID_OPCODE.with_dnr()); // the same command would fail again
    let sqe = io.io(IoOpcode::Flush, 0, 1, 0);
    io.capsule(&sqe, &[]);
    assert_eq!(io.status(), Status::SUCCESS);
}

#[test]
fn deallocate_zeroes_each_range() {
    let mut io = Bed::io_queue(Digests::default());
    io.backend.namespaces[0].fill(0xEE);
    let mut sqe = io.io(IoOpcode::DatasetManagement, 0, 1, 0);
    sqe.cdw10 = 1; // two ranges
    sqe.cdw11 = usnvme_driver::spec::command::DSM_DEALLOCATE;
    sqe.set_sgl(SglDescriptor::in_capsule(32));
    let mut ranges = [0u8; 32];
    ranges[4..8].copy_from_slice(&4u32.to_le_bytes()); // 4 blocks at LBA 0
    ranges[20..24].copy_from_slice(&2u32.to_le_bytes()); // 2 blocks at LBA 10
    ranges[24..32].copy_from_slice(&10u64.to_le_bytes());
    io.capsule(&sqe, &ranges);
    assert_eq!(io.status(), Status::SUCCESS);
    let disk = &io.backend.namespaces[0];
    assert!(disk[..4 * 512].iter().all(|&b| b == 0));
    assert!(disk[4 * 512..10 * 512].iter().all(|&b| b == 0xEE));
    assert!(disk[10 * 512..12 * 512].iter().all(|&b| b == 0));
    assert_eq!(disk[12 * 512], 0xEE);
    // as Linux sends one range: in a 4 KiB page, the rest of it not ranges
    io.backend.namespaces[0].fill(0xEE);
    let mut sqe = io.io(IoOpcode::DatasetManagement, 0, 1, 0);
    sqe.cdw10 = 0; // one range
    sqe.cdw11 = usnvme_driver::spec::command::DSM_DEALLOCATE;
    sqe.set_sgl(SglDescriptor::in_capsule(4096));
    let mut page = [0xffu8; 4096];
    page[..16].fill(0);
    page[4..8].copy_from_slice(&3u32.to_le_bytes()); // 3 blocks at LBA 0
    io.capsule(&sqe, &page);
    assert_eq!(io.status(), Status::SUCCESS);
    let disk = &io.backend.namespaces[0];
    assert!(disk[..3 * 512].iter().all(|&b| b == 0));
    assert_eq!(disk[3 * 512], 0xEE, "what follows the range is not one");
    // fewer bytes than the ranges: refused by name
    let mut sqe = io.io(IoOpcode::DatasetManagement, 0, 1, 0);
    sqe.cdw10 = 1; // two ranges
    sqe.cdw11 = usnvme_driver::spec::command::DSM_DEALLOCATE;
    sqe.set_sgl(SglDescriptor::in_capsule(16));
    io.capsule(&sqe, &page[..16]);
    assert_eq!(io.status().code(), Status::DATA_SGL_LENGTH_INVALID);
}

#[test]
fn refusals_by_name() {
    let mut bed = Bed::new(Some(vec![HOST.into()]), Digests::default());
    let nqn = bed.sub.nqn.clone();
    let c = bed.connect(0, 0xffff, &nqn, "nqn.2024-01.io.usnvme:stranger");
    assert_eq!(c.status(), Status::CONNECT_INVALID_HOST);
    let c = bed.connect(0, 0xffff, "nqn.2024-01.io.usnvme:nothing-here", HOST);
    assert_eq!(c.status(), Status::CONNECT_INVALID_PARAMETERS);
    // a subsystem reached through port 2 only is not there at port 1 (the connection's)
    let on_port_2 = SubsystemInfo {
        ports: Some(vec![2]),
        ..(*bed.sub).clone()
    };
    bed.conn
        .set_subsystems(Subsystems::one(Arc::new(on_port_2)));
    let c = bed.connect(0, 0xffff, &nqn, HOST);
    assert_eq!(c.status(), Status::CONNECT_INVALID_PARAMETERS);
    bed.conn.set_subsystems(Subsystems::one(bed.sub.clone()));
    // an I/O queue of a controller that does not exist
    let c = bed.connect(1, 7, &nqn, HOST);
    assert_eq!(c.status(), Status::CONNECT_INVALID_PARAMETERS);
    // admin commands before the controller is enabled
    let c = bed.connect(0, 0xffff, &nqn, HOST);
    assert_eq!(c.status(), Status::SUCCESS);
    let identify = identify_controller();
    bed.capsule(&identify, &[]);
    assert_eq!(bed.status(), Status::COMMAND_SEQUENCE_ERROR);
    bed.enable();
    bed.capsule(&identify, &[]);
    match &bed.take()[..] {
        [Got::Data(d, data), Got::Resp(c)] => {
            assert_eq!((d.length, c.status()), (4096, Status::SUCCESS));
            let id = usnvme_driver::spec::IdentifyController::from_slice(data).unwrap();
            assert_eq!(id.subnqn(), nqn);
            assert_ne!(id.sgls, 0, "the Linux host insists on SGL support");
        }
        other => panic!("{other:?}"),
    }
}

#[test]
fn a_smart_read_waits_for_the_drives_while_other_commands_are_served() {
    let (mut admin, cntlid) = Bed::admin_queue(Digests::default());
    let nqn = admin.sub.nqn.clone();
    admin.backend.smart_held = true; // the drives are slow to answer
    admin.backend.smart.temperature_sensors[0] = 321;
    let mut smart = Sqe::get_log_page(LogPageId::SmartHealth, u32::MAX, 512, 0);
    smart.set_cid(40);
    smart.set_sgl(SglDescriptor::transport(512));
    admin.capsule(&smart, &[]);
    admin.conn.tick(Instant::now(), &mut admin.backend);
    assert!(
        admin.take().is_empty(),
        "no answer while the drives have none"
    );
    assert_eq!(admin.backend.smart_asked, 1);
    // meanwhile: an Identify on the same queue, and I/O on a queue of the controller
    admin.capsule(&identify_controller(), &[]);
    assert_eq!(admin.status(), Status::SUCCESS);
    let mut io = Bed::new(None, Digests::default());
    io.conn.registry = admin.conn.registry.clone();
    assert_eq!(io.connect(1, cntlid, &nqn, HOST).status(), Status::SUCCESS);
    let sqe = io.io(IoOpcode::Write, 0, 8, 0);
    io.capsule(&sqe, &[9; 4096]);
    assert_eq!(io.status(), Status::SUCCESS);
    // the drives answer: the command completes with their log
    admin.conn.tick(Instant::now(), &mut admin.backend);
    assert!(admin.take().is_empty());
    admin.backend.smart_held = false;
    admin.conn.tick(Instant::now(), &mut admin.backend);
    match &admin.take()[..] {
        [Got::Data(d, data), Got::Resp(c)] => {
            assert_eq!((d.cccid, c.cid, c.status()), (40, 40, Status::SUCCESS));
            let log = usnvme_driver::spec::SmartLog::from_slice(data).expect("512 bytes");
            assert_eq!(log.temperature_sensors[0], 321);
        }
        other => panic!("{other:?}"),
    }
    assert_eq!(admin.backend.smart_asked, 0);
}

#[test]
fn a_shutdown_flushes_every_namespace_before_it_reports_complete() {
    let (mut admin, _) = Bed::admin_queue(Digests::default());
    // CC written, or CSTS read
    let property = |set: Option<u64>| {
        let sqe = match set {
            Some(cc) => Sqe::property_set(0x14, PropertySize::Four, cc),
            None => Sqe::property_get(0x1c, PropertySize::Four),
        };
        OutHeader::capsule_cmd(&sqe, 0, Digests::default()).bytes[..72].to_vec()
    };
    let csts = |bed: &mut Bed| {
        bed.conn.receive(&property(None), &mut bed.backend); // (nothing completes)
        match &bed.take()[..] {
            [Got::Resp(c)] => c.dw0,
            other => panic!("{other:?}"),
        }
    };
    let cc = 1u64 | 6 << 16 | 4 << 20;
    // an Asynchronous Event Request held over the shutdown
    let mut aer = Sqe::async_event_request();
    aer.set_cid(3);
    admin.capsule(&aer, &[]);
    assert!(admin.take().is_empty());
    admin
        .conn
        .receive(&property(Some(cc | 1 << 14)), &mut admin.backend); // SHN normal
                                                                     // the Property Set's answer only: SPDK's host ends its held requests itself before it
                                                                     // shuts down, and sends the shutdown's commands with their IDs (an answer to CID 3 now
                                                                     // would name a command it no longer has, and it fails the controller)
    assert!(matches!(&admin.take()[..], [Got::Resp(c)] if c.status() == Status::SUCCESS));
    assert_eq!(admin.backend.flushes, [1, 1], "a Flush to every namespace");
    assert_eq!(
        csts(&mut admin) >> 2 & 3,
        0b01,
        "SHST: processing, flushes pending"
    );
    admin.backend.complete_all(&mut admin.conn);
    assert!(admin.take().is_empty(), "no response of its own");
    assert_eq!(
        csts(&mut admin) >> 2 & 3,
        0b10,
        "SHST: complete once flushed"
    );
    // written again: no second round of flushes
    admin
        .conn
        .receive(&property(Some(cc | 1 << 14)), &mut admin.backend);
    admin.backend.complete_all(&mut admin.conn);
    assert!(matches!(&admin.take()[..], [Got::Resp(c)] if c.status() == Status::SUCCESS));
    assert_eq!(admin.backend.flushes, [1, 1]);
    assert_eq!(csts(&mut admin) >> 2 & 3, 0b10);
    // a drive's event after the shutdown does not answer it either
    admin.conn.registry.raise_event(1 | 1 << 8);
    admin.conn.tick(Instant::now(), &mut admin.backend);
    assert!(admin.take().is_empty(), "no event after a shutdown");
    // the target stopping answers it (its host has not ended the association)
    admin.conn.shut_down(&mut admin.backend);
    match &admin.take()[..] {
        [Got::Resp(c)] => assert_eq!((c.cid, c.status()), (3, Status::ABORT_REQUESTED)),
        other => panic!("{other:?}"),
    }
}

#[test]
fn a_drive_event_completes_a_held_request_once_the_host_enabled_it() {
    let (mut admin, _) = Bed::admin_queue(Digests::default());
    let temperature = 1 | 1 << 8 | 2 << 16;
    let mut aer = Sqe::async_event_request();
    aer.set_cid(50);
    admin.capsule(&aer, &[]);
    admin.conn.tick(Instant::now(), &mut admin.backend);
    assert!(admin.take().is_empty(), "held: no event yet");
    // SMART warnings are enabled after Connect; a host that turns them off gets none
    let mut aec = Sqe::set_features(FeatureId::AsyncEventConfiguration, 0);
    aec.set_cid(51);
    admin.capsule(&aec, &[]);
    assert_eq!(admin.status(), Status::SUCCESS);
    admin.conn.registry.raise_event(temperature);
    admin.conn.tick(Instant::now(), &mut admin.backend);
    assert!(
        admin.take().is_empty(),
        "a temperature warning the host turned off"
    );
    aec.cdw11 = 0b10;
    admin.capsule(&aec, &[]);
    assert_eq!(admin.status(), Status::SUCCESS);
    assert_eq!(admin.conn.registry.raise_event(temperature), 1);
    admin.conn.tick(Instant::now(), &mut admin.backend);
    match &admin.take()[..] {
        [Got::Resp(c)] => assert_eq!(
            (c.cid, c.status(), c.dw0),
            (50, Status::SUCCESS, temperature)
        ),
        other => panic!("{other:?}"),
    }
    // no request held: the next event waits for one
    admin.conn.registry.raise_event(temperature);
    admin.conn.tick(Instant::now(), &mut admin.backend);
    assert!(admin.take().is_empty());
    aer.set_cid(52);
    admin.capsule(&aer, &[]);
    admin.conn.tick(Instant::now(), &mut admin.backend);
    match &admin.take()[..] {
        [Got::Resp(c)] => assert_eq!((c.cid, c.dw0), (52, temperature)),
        other => panic!("{other:?}"),
    }
}

/// The ANA log as the controller behind `admin` reads it: (change count, state, NSIDs).
fn ana_log(admin: &mut Bed) -> (u64, u8, Vec<u32>) {
    let mut sqe = Sqe::get_log_page(LogPageId::AsymmetricNamespaceAccess, 0, 64, 0);
    sqe.set_cid(60);
    sqe.set_sgl(SglDescriptor::transport(64));
    admin.capsule(&sqe, &[]);
    match &admin.take()[..] {
        [Got::Data(_, log), Got::Resp(c)] => {
            assert_eq!(c.status(), Status::SUCCESS);
            let le32 = |at: usize| u32::from_le_bytes(log[at..at + 4].try_into().expect("4"));
            assert_eq!(
                (u16::from_le_bytes([log[8], log[9]]), le32(16)),
                (1, 1),
                "one group: 1"
            );
            let nsids = (0..le32(20) as usize).map(|i| le32(48 + 4 * i)).collect();
            (
                u64::from_le_bytes(log[..8].try_into().expect("8")),
                log[32],
                nsids,
            )
        }
        other => panic!("{other:?}"),
    }
}

#[test]
fn an_inaccessible_port_refuses_io_by_ana_status_and_its_hosts_hear_of_the_change() {
    use crate::fabric::export::registry::AnaState;
    let (mut admin, cntlid) = Bed::admin_queue(Digests::default());
    let nqn = admin.sub.nqn.clone();
    assert_eq!(
        ana_log(&mut admin),
        (0, 1, vec![1, 2]),
        "optimized, both namespaces"
    );
    let mut aer = Sqe::async_event_request();
    aer.set_cid(61);
    admin.capsule(&aer, &[]);
    // an I/O queue of the same controller through port 2
    let mut io = Bed::new(None, Digests::default());
    io.conn.registry = admin.conn.registry.clone();
    io.conn.port.port_id = 2;
    assert_eq!(io.connect(1, cntlid, &nqn, HOST).status(), Status::SUCCESS);
    let registry = admin.conn.registry.clone();
    assert!(registry.set_ana_state(2, None, AnaState::Inaccessible));
    assert!(
        !registry.set_ana_state(2, None, AnaState::Inaccessible),
        "no change"
    );
    let write = io.io(IoOpcode::Write, 0, 8, 0);
    io.capsule(&write, &[5; 4096]);
    let refused = io.status();
    assert_eq!(refused.code(), Status::ANA_INACCESSIBLE);
    assert!(
        !refused.dnr(),
        "the host may retry, on another path or later"
    );
    // the admin queue's port (1) is still optimized; the notice reached its held request
    admin.conn.tick(Instant::now(), &mut admin.backend);
    match &admin.take()[..] {
        [Got::Resp(c)] => assert_eq!((c.cid, c.dw0), (61, 2 | 3 << 8 | 0x0c << 16)),
        other => panic!("{other:?}"),
    }
    assert_eq!(ana_log(&mut admin), (1, 1, vec![1, 2]));
    // back to optimized: the I/O goes through
    assert!(registry.set_ana_state(2, None, AnaState::Optimized));
    io.capsule(&write, &[5; 4096]);
    assert_eq!(io.status(), Status::SUCCESS);
    // namespace 2 in group 2, that group inaccessible at port 2: its I/O is refused there,
    // namespace 1's (group 1) goes on
    let mut sub = (*io.sub).clone();
    sub.namespaces[1].ana_group = 2;
    io.conn
        .set_subsystems(Subsystems::one(std::sync::Arc::new(sub)));
    assert!(registry.set_ana_state(2, Some(2), AnaState::Inaccessible));
    assert_eq!(registry.ana_state(2, 1), AnaState::Optimized);
    let mut write2 = io.io(IoOpcode::Write, 0, 8, 0);
    write2.nsid = 2;
    io.capsule(&write2, &[6; 4096]);
    assert_eq!(io.status().code(), Status::ANA_INACCESSIBLE);
    io.capsule(&write, &[5; 4096]);
    assert_eq!(io.status(), Status::SUCCESS);
}

/// The Changed Namespace List as the controller behind `admin` reads it (`retain`: with
/// Retain Asynchronous Event): the IDs before the first zero.
fn changed_namespaces(admin: &mut Bed, retain: bool) -> Vec<u32> {
    let mut sqe = Sqe::get_log_page(LogPageId::ChangedNamespaceList, u32::MAX, 4096, 0);
    sqe.set_cid(70);
    sqe.set_sgl(SglDescriptor::transport(4096));
    if retain {
        sqe.cdw10 |= 1 << 15;
    }
    admin.capsule(&sqe, &[]);
    match &admin.take()[..] {
        [Got::Data(_, log), Got::Resp(c)] => {
            assert_eq!((c.status(), log.len()), (Status::SUCCESS, 4096));
            let ids = log
                .chunks(4)
                .map(|b| u32::from_le_bytes([b[0], b[1], b[2], b[3]]));
            ids.take_while(|&id| id != 0).collect()
        }
        other => panic!("{other:?}"),
    }
}

#[test]
fn a_namespace_removed_while_a_write_waits_for_its_data_keeps_that_write_on_its_device() {
    use crate::fabric::export::registry::NAMESPACE_ATTRIBUTE_CHANGED;
    let (mut admin, cntlid) = Bed::admin_queue(Digests::default());
    let mut io = Bed::new(None, Digests::default());
    io.conn.registry = admin.conn.registry.clone();
    let nqn = io.sub.nqn.clone();
    assert_eq!(io.connect(1, cntlid, &nqn, HOST).status(), Status::SUCCESS);
    let mut aer = Sqe::async_event_request();
    aer.set_cid(80);
    admin.capsule(&aer, &[]);
    // a write to namespace 2 (device 1) asks for its data by R2T
    let mut write = io.io(IoOpcode::Write, 16, 8, 4096);
    write.nsid = 2;
    write.set_cid(9);
    io.capsule(&write, &[]);
    let got = io.take();
    let Some(Got::R2T(r2t)) = got.first() else {
        panic!("an R2T: {got:?}");
    };
    // namespace 1 goes away meanwhile: namespace 2 is now first in the list
    let without_1 = Arc::new(SubsystemInfo {
        namespaces: io.sub.namespaces[1..].to_vec(),
        ..(*io.sub).clone()
    });
    io.conn.set_subsystems(Subsystems::one(without_1.clone()));
    admin.conn.set_subsystems(Subsystems::one(without_1));
    io.send(&h2c_pdu(
        9,
        r2t.ttag,
        0,
        &[0x5a; 4096],
        true,
        Digests::default(),
    ));
    assert_eq!(io.status(), Status::SUCCESS);
    assert!(
        io.backend.namespaces[1][16 * 512..16 * 512 + 4096]
            .iter()
            .all(|&b| b == 0x5a),
        "on namespace 2's device"
    );
    // and so does a new one, though namespace 2 is first in the list now
    let mut again = io.io(IoOpcode::Write, 32, 8, 0);
    again.nsid = 2;
    io.capsule(&again, &[0xa5; 4096]);
    assert_eq!(io.status(), Status::SUCCESS);
    assert!(io.backend.namespaces[1][32 * 512..32 * 512 + 4096]
        .iter()
        .all(|&b| b == 0xa5));
    assert!(
        io.backend.namespaces[0].iter().all(|&b| b == 0),
        "not on 1's"
    );
    // namespace 1 is refused now, by name
    let write1 = io.io(IoOpcode::Write, 0, 8, 0);
    io.capsule(&write1, &[1; 4096]);
    assert_eq!(io.status().code(), Status::INVALID_NAMESPACE);
    // the host hears of it once, and reads which namespace changed
    assert_eq!(admin.conn.registry.namespaces_changed(&io.sub.nqn, &[1]), 1);
    admin.conn.tick(Instant::now(), &mut admin.backend);
    match &admin.take()[..] {
        [Got::Resp(c)] => assert_eq!((c.cid, c.dw0), (80, NAMESPACE_ATTRIBUTE_CHANGED)),
        other => panic!("{other:?}"),
    }
    assert_eq!(changed_namespaces(&mut admin, true), [1], "retained");
    assert_eq!(changed_namespaces(&mut admin, false), [1]);
    assert!(changed_namespaces(&mut admin, false).is_empty(), "cleared");
    let mut list = Sqe::identify(Cns::ActiveNamespaceList, 0);
    list.set_sgl(SglDescriptor::transport(4096));
    admin.capsule(&list, &[]);
    match &admin.take()[..] {
        [Got::Data(_, ids), Got::Resp(_)] => assert_eq!(&ids[..8], [2, 0, 0, 0, 0, 0, 0, 0]),
        other => panic!("{other:?}"),
    }
}

#[test]
fn an_admin_answers_data_goes_only_where_the_hosts_sgl_points() {
    let (mut admin, _) = Bed::admin_queue(Digests::default());
    // no room described (SPDK's fuzzer sends such Identify commands): refused, and no
    // C2HData PDU of no data (which stalls SPDK's host)
    for sgl in [
        SglDescriptor::transport(0),
        SglDescriptor::in_capsule(0),
        SglDescriptor::new(0x00, 0x1000, 4096),
    ] {
        let mut sqe = Sqe::identify(Cns::Controller, 0);
        sqe.set_sgl(sgl);
        admin.capsule(&sqe, &[]);
        match &admin.take()[..] {
            [Got::Resp(c)] => assert_eq!(
                c.status(),
                Status::DATA_SGL_LENGTH_INVALID.with_dnr(),
                "{sgl:?}"
            ),
            other => panic!("{sgl:?}: {other:?}"),
        }
    }
    // room for part of it: that part
    let mut sqe = Sqe::identify(Cns::Controller, 0);
    sqe.set_sgl(SglDescriptor::transport(512));
    admin.capsule(&sqe, &[]);
    match &admin.take()[..] {
        [Got::Data(d, data), Got::Resp(c)] => {
            assert_eq!((d.length, data.len()), (512, 512));
            assert_eq!(c.status(), Status::SUCCESS);
        }
        other => panic!("{other:?}"),
    }
}
