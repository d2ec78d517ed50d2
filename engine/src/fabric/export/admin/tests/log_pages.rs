//! Log pages: SMART aggregated, lengths and offsets, the discovery log field by field.

use super::*;

#[test]
fn smart_logs_aggregate() {
    let (a, b) = (smart_log(1), smart_log(2));
    let all = aggregate_smart(&[a, b]);
    assert_eq!(all.critical_warning, 0b11, "OR of 0b01 and 0b10");
    assert_eq!(all.temperature_kelvin(), 302, "the hotter");
    assert_eq!(
        (all.available_spare, all.available_spare_threshold),
        (98, 12),
        "the lower"
    );
    assert_eq!(all.percentage_used, 4);
    assert_eq!(all.data_units_read(), 3000);
    assert_eq!(all.data_units_written(), u128::MAX, "saturates");
    assert_eq!(all.host_read_commands(), 14);
    assert_eq!(all.host_write_commands(), 1 << 71);
    assert_eq!(all.controller_busy_time(), 6);
    assert_eq!(all.power_cycles(), 3);
    assert_eq!(all.power_on_hours(), 200, "the longest");
    assert_eq!(all.unsafe_shutdowns(), 2);
    assert_eq!(all.media_errors(), 3);
    assert_eq!(all.error_log_entries(), 4);
    assert_eq!(all.warning_temperature_time, 2);
    assert_eq!(all.sensor_celsius(1), None, "sensors are per drive");
    assert_eq!(aggregate_smart(&[a]).as_bytes()[..200], a.as_bytes()[..200]);
    assert_eq!(aggregate_smart(&[]), SmartLog::zeroed());
}

#[test]
fn the_ana_log_lists_group_1_and_each_group_with_namespaces_in_its_state_at_the_port() {
    use crate::fabric::export::registry::AnaState;
    let mut sub = subsystem(); // namespaces 1 and 3
    sub.namespaces.push(namespace(4, 512, 8));
    sub.namespaces[1].ana_group = 7;
    sub.namespaces[2].ana_group = 7;
    let mut ana = AnaView::all(AnaState::Optimized, 5);
    ana.states[6] = AnaState::Inaccessible;
    let read = |rgo: bool| {
        let mut sqe = get_log(0x0c, 0, 4096, 0);
        sqe.cdw10 |= u32::from(rgo) << 8;
        let mut out = vec![0xEE; MAX_ADMIN_DATA];
        let asked = Asked {
            cntlid: 1,
            discovery: None,
            ana,
            changed_namespaces: &[],
            keyed_sgls: false,
        };
        let n = super::super::log_page(&sub, asked, &sqe, &mut || smart_log(1), &mut out)
            .expect("the ANA log");
        out.truncate(n);
        out
    };
    let log = read(false);
    let le32 = |at: usize| u32::from_le_bytes(log[at..at + 4].try_into().expect("4 bytes"));
    assert_eq!(
        u64::from_le_bytes(log[..8].try_into().expect("8")),
        5,
        "change count"
    );
    assert_eq!(u16::from_le_bytes([log[8], log[9]]), 2, "groups 1 and 7");
    // group 1: namespace 1, optimized; then group 7: namespaces 3 and 4, inaccessible
    assert_eq!(
        (le32(16), le32(20), log[32]),
        (1, 1, AnaState::Optimized as u8)
    );
    assert_eq!(le32(48), 1);
    assert_eq!(
        (le32(52), le32(56), log[68]),
        (7, 2, AnaState::Inaccessible as u8)
    );
    assert_eq!((le32(84), le32(88)), (3, 4));
    assert!(
        log[92..].iter().all(|&b| b == 0),
        "nothing after the last group"
    );
    // groups only (RGO): the descriptors, no namespace lists
    let log = read(true);
    let le32 = |at: usize| u32::from_le_bytes(log[at..at + 4].try_into().expect("4 bytes"));
    assert_eq!((le32(16), le32(20), le32(48), le32(52)), (1, 0, 7, 0));
    // Identify Namespace names each one's group
    let id = super::super::identify::identify_namespace(&sub.namespaces[2]);
    assert_eq!(id.anagrpid, 7);
}

#[test]
fn log_page_length_and_offset() {
    let sub = subsystem();
    let smart = smart_log(1);
    let mut calls = 0;
    let mut source = || {
        calls += 1;
        smart
    };
    let mut io = |sqe: &Sqe| log_page(&sub, false, sqe, &mut source);

    assert_eq!(
        io(&get_log(2, u32::MAX, 512, 0)).as_deref(),
        Ok(&smart.as_bytes()[..])
    );
    assert_eq!(
        io(&get_log(2, 0, 8, 32)).as_deref(),
        Ok(&smart.as_bytes()[32..40])
    );
    let long = io(&get_log(2, u32::MAX, 1024, 0)).expect("SMART");
    assert_eq!((&long[..512], long.len()), (&smart.as_bytes()[..], 1024));
    assert!(long[512..].iter().all(|&b| b == 0), "past the log: zeroes");
    assert_eq!(
        io(&get_log(2, u32::MAX, 4, 512)),
        Ok(vec![0; 4]),
        "at its end: zeroes"
    );
    let code = |r: Result<Vec<u8>, Status>| r.map(|_| ()).map_err(|s| s.code());
    assert_eq!(
        code(io(&get_log(2, u32::MAX, 4, 516))),
        Err(Status::INVALID_FIELD)
    );
    assert_eq!(
        code(io(&get_log(2, u32::MAX, 4, 1 << 40))),
        Err(Status::INVALID_FIELD)
    );
    assert_eq!(
        code(io(&get_log(2, u32::MAX, 8, 2))),
        Err(Status::INVALID_FIELD),
        "unaligned"
    );
    assert_eq!(
        code(io(&get_log(2, 1, 512, 0))),
        Err(Status::INVALID_FIELD),
        "per namespace"
    );
    // NUMD at its largest (16 GiB): refused before anything is allocated
    let mut huge = get_log(2, u32::MAX, 4, 0);
    huge.cdw10 |= 0xffff << 16;
    huge.cdw11 = 0xffff;
    assert_eq!(code(io(&huge)), Err(Status::INVALID_FIELD));
    assert_eq!(
        code(io(&get_log(2, u32::MAX, (MAX_LOG_BYTES + 4) as u32, 0))),
        Err(Status::INVALID_FIELD)
    );

    assert_eq!(
        io(&get_log(1, 0, 64, 0)),
        Ok(vec![0; 64]),
        "no errors recorded"
    );
    assert_eq!(
        io(&get_log(1, 0, 4096, 0)),
        Ok(vec![0; 4096]),
        "as long as asked"
    );
    let fw = io(&get_log(3, 0, 512, 0)).expect("firmware slots");
    assert_eq!((fw[0], &fw[8..16]), (1, &b"0.1.0   "[..]));
    assert_eq!(
        code(io(&get_log(0x70, 0, 1024, 0))),
        Err(Status::INVALID_LOG_PAGE)
    );
    assert_eq!(
        code(io(&get_log(0x05, 0, 4096, 0))),
        Err(Status::INVALID_LOG_PAGE)
    );
    assert_eq!(
        calls, 4,
        "SMART asked for by each read of it past the NUMD, NSID and offset checks"
    );

    // the discovery controller has only the discovery log
    let disc = |sqe: &Sqe| log_page(&sub, true, sqe, &mut no_smart);
    assert_eq!(
        code(disc(&get_log(2, u32::MAX, 512, 0))),
        Err(Status::INVALID_LOG_PAGE)
    );
    // longer than the log: the log, then zeroes
    let log = disc(&get_log(0x70, 0, 8192, 0)).expect("discovery log");
    assert_eq!(log.len(), 8192);
    assert_eq!(log[..3072], discovery_log(&sub)[..]);
    assert!(log[3072..].iter().all(|&b| b == 0));
    // a length that needs NUMDU (NUMD 10000h) is beyond the admin buffer
    let big = get_log(0x70, 0, 0x4_0004, 0);
    assert_eq!((big.cdw10 >> 16, big.cdw11), (0, 1));
    assert_eq!(code(disc(&big)), Err(Status::INVALID_FIELD));
    // the entries alone, then the header alone, as libnvme reads them
    let entries = disc(&get_log(0x70, 0, 2048, 1024)).expect("entries");
    assert_eq!(entries[..], discovery_log(&sub)[1024..]);
    let header = disc(&get_log(0x70, 0, 16, 0)).expect("header");
    assert_eq!((le64(&header, 0), le64(&header, 8)), (1, 2));
}

/// What Linux 6.1's nvmet writes for one TCP port (`discovery.c`,
/// `nvmet_format_discovery_entry`; `nvme discover` against it in the bed prints the same):
/// the current discovery subsystem first, then the NVM subsystem, both at the port asked on.
#[test]
fn the_discovery_log_is_what_nvmet_writes_field_by_field() {
    let sub = subsystem();
    // (field, its first byte in an entry, the current discovery subsystem's bytes, the NVM
    // subsystem's); ADRFAM and PORTID are the port's, checked per port below
    type Field = (&'static str, usize, &'static [u8], &'static [u8]);
    let nvmet: [Field; 6] = [
        ("TRTYPE tcp", 0, &[3], &[3]),
        ("SUBTYPE current discovery / nvme subsystem", 2, &[3], &[2]),
        (
            "TREQ not specified, sq flow control disable supported",
            3,
            &[4],
            &[4],
        ),
        ("CNTLID dynamic", 6, &[0xff, 0xff], &[0xff, 0xff]),
        ("ASQSZ 32", 8, &[32, 0], &[32, 0]),
        ("EFLAGS none", 10, &[0, 0], &[0, 0]),
    ];
    for (port, adrfam, trsvcid, traddr) in [
        (0, 1u8, "4420", "192.0.2.10"),
        (1, 2, "4421", "2001:db8::1"),
    ] {
        let asker = DiscoveryAsker {
            port: &sub.listeners[port],
            subsystems: &["nqn.2024-01.io.usnvme:test"],
            generation: 1,
        };
        let log = discovery_log_for(&sub, asker);
        assert_eq!(log.len(), 3 * 1024);
        assert_eq!(le64(&log, 0), 1, "GENCTR");
        assert_eq!(le64(&log, 8), 2, "NUMREC");
        assert_eq!(le16(&log, 16), 0, "RECFMT");
        assert!(log[18..1024].iter().all(|&b| b == 0));
        for (i, subnqn) in [DISCOVERY_NQN_FOR_TEST, "nqn.2024-01.io.usnvme:test"]
            .into_iter()
            .enumerate()
        {
            let e = &log[1024 * (i + 1)..1024 * (i + 2)];
            for (field, at, current, nvme) in nvmet {
                let want = if i == 0 { current } else { nvme };
                assert_eq!(&e[at..at + want.len()], want, "{field} (entry {i})");
            }
            assert_eq!(e[1], adrfam, "ADRFAM (entry {i})");
            assert_eq!(le16(e, 4), port as u16 + 1, "PORTID (entry {i})");
            assert!(e[12..32].iter().all(|&b| b == 0), "reserved");
            assert_eq!(
                &e[32..64],
                format!("{trsvcid:<32}").as_bytes(),
                "TRSVCID, space padded"
            );
            assert!(e[64..256].iter().all(|&b| b == 0), "reserved");
            assert_eq!(c_string(&e[256..512]), subnqn, "SUBNQN");
            assert!(e[256 + subnqn.len()..512].iter().all(|&b| b == 0));
            assert_eq!(
                &e[512..768],
                format!("{traddr:<256}").as_bytes(),
                "TRADDR, space padded"
            );
            assert!(e[768..1024].iter().all(|&b| b == 0), "TSAS: SECTYPE none");
        }
    }
    // a host that may not use the subsystem sees the discovery subsystem alone (nvmet
    // skips subsystems whose allowed hosts exclude it)
    let stranger = DiscoveryAsker {
        port: &sub.listeners[0],
        subsystems: &[],
        generation: 1,
    };
    let log = discovery_log_for(&sub, stranger);
    assert_eq!((log.len(), le64(&log, 8)), (2048, 1));
    assert_eq!(
        (log[1024 + 2], c_string(&log[1024 + 256..1536])),
        (3, DISCOVERY_NQN_FOR_TEST)
    );
}

#[test]
fn an_rdma_ports_discovery_entries_say_rdma_and_its_tsas_as_nvmet_writes_it() {
    let sub = subsystem();
    let port = Listener {
        transport: crate::fabric::address::Transport::Rdma,
        ..sub.listeners[0].clone()
    };
    let asker = DiscoveryAsker {
        port: &port,
        subsystems: &["nqn.2024-01.io.usnvme:test"],
        generation: 1,
    };
    let log = discovery_log_for(&sub, asker);
    for i in 1..=2 {
        let e = &log[1024 * i..1024 * (i + 1)];
        assert_eq!(e[0], 1, "TRTYPE rdma");
        assert_eq!(e[3], 4, "TREQ as for TCP");
        // RDMA_QPTYPE connected, RDMA_PRTYPE not specified, RDMA_CMS rdma-cm, PKEY 0
        assert_eq!(&e[768..771], &[1, 1, 1], "TSAS");
        assert!(e[771..1024].iter().all(|&b| b == 0), "TSAS rest");
    }
}

const DISCOVERY_NQN_FOR_TEST: &str = "nqn.2014-08.org.nvmexpress.discovery";
