//! Identify: the bytes Linux reads, MDTS, NQNs, dispatch by CNS and NSID.

use usnvme_driver::spec::NamespaceList;

use super::super::identify::mdts;
use super::*;
use crate::fabric::export::DISCOVERY_NQN;

#[test]
fn identify_controller_bytes_where_linux_reads_them() {
    let sub = subsystem();
    let id = identify_controller(&sub, 7, false);
    let b = id.as_bytes();
    assert_eq!(&b[4..24], b"USN0001             ");
    assert_eq!(&b[24..30], b"usnvme");
    assert!(b[30..64].iter().all(|&c| c == b' '));
    assert_eq!(&b[64..72], b"0.1.0   ");
    assert_eq!(
        b[76], 0b1011,
        "CMIC: multi-port, multi-controller, ANA reporting"
    );
    assert_eq!(
        le32(b, 92),
        1 << 8 | 1 << 11,
        "OAES: namespace attribute and ANA change notices"
    );
    assert_eq!((b[342], b[343]), (10, 0b0100_0111), "ANATT, ANACAP");
    assert_eq!(
        (le32(b, 344), le32(b, 348)),
        (32, 32),
        "ANAGRPMAX, NANAGRPID"
    );
    assert_eq!(le32(b, 540), le32(b, 516), "MNAN: NN");
    assert_eq!(b[77], 5, "MDTS: 2^5 4 KiB pages = 128 KiB");
    assert_eq!(le16(b, 78), 7, "CNTLID");
    assert_eq!(le32(b, 80), 0x0001_0300, "VER 1.3.0");
    assert_eq!(b[111], 1, "CNTRLTYPE: I/O");
    assert_eq!(le16(b, 256), 0, "OACS");
    assert_eq!((b[258], b[259]), (3, 3), "ACL, AERL");
    assert_eq!(b[260], 0b11, "FRMW");
    assert_eq!(b[261], 1 << 2, "LPA: extended data");
    assert_eq!(b[262], 0, "ELPE");
    assert_eq!(le16(b, 320), 1, "KAS: 100 ms");
    assert_eq!((b[512], b[513]), (0x66, 0x44), "SQES, CQES");
    assert_eq!(le16(b, 514), 128, "MAXCMD");
    assert_eq!(le32(b, 516), 1024, "NN: every ID a namespace may take");
    assert_eq!(le16(b, 520), (1 << 2) | (1 << 3), "ONCS: DSM, Write Zeroes");
    assert_eq!(b[525], 1, "VWC present");
    assert_eq!(le32(b, 536), 1 | (1 << 20), "SGLS");
    assert_eq!(c_string(&b[768..1024]), "nqn.2024-01.io.usnvme:test");
    assert_eq!(le32(b, 1792), (64 + 8192) / 16, "IOCCSZ");
    assert_eq!(le32(b, 1796), 1, "IORCSZ");
    assert_eq!(le16(b, 1800), 0, "ICDOFF");
    assert_eq!((b[1802], b[1803]), (0, 1), "FCATT, MSDBD");
    assert_eq!(le16(b, 1804), 1, "OFCS: Disconnect");
    assert_eq!(id.mdts_bytes(4096), Some(128 << 10));

    let d = identify_controller(&sub, 9, true);
    let b = d.as_bytes();
    assert_eq!(b[111], 2, "CNTRLTYPE: discovery");
    assert_eq!(le32(b, 92), 1 << 31, "OAES: Discovery Log Page Change");
    assert_eq!(le16(b, 78), 9);
    assert_eq!(c_string(&b[768..1024]), DISCOVERY_NQN);
    assert_eq!((le32(b, 516), le16(b, 520), b[525], b[76]), (0, 0, 0, 0));
    assert_eq!((le16(b, 320), le16(b, 514)), (1, 128), "KAS, MAXCMD");
    assert_ne!(le32(b, 536), 0, "SGLS");
}

#[test]
fn mdts_rounds_down_and_never_says_no_limit() {
    assert_eq!(mdts(0), 1);
    assert_eq!(mdts(4096), 1);
    assert_eq!(mdts(8192), 1);
    assert_eq!(mdts(128 << 10), 5);
    assert_eq!(mdts(3 << 20), 9); // 2 MiB
    assert_eq!(mdts(u32::MAX), 19);
}

#[test]
fn long_nqn_keeps_a_terminating_nul() {
    let mut sub = subsystem();
    sub.nqn = "n".repeat(300);
    let id = identify_controller(&sub, 1, false);
    assert_eq!(c_string(&id.subnqn).len(), 255);
}

#[test]
fn identify_namespace_bytes() {
    let ns = namespace(3, 4096, 1000);
    let id = identify_namespace(&ns);
    let b = id.as_bytes();
    assert_eq!((le64(b, 0), le64(b, 8), le64(b, 16)), (1000, 1000, 1000));
    assert_eq!((b[25], b[26]), (0, 0), "NLBAF, FLBAS");
    assert_eq!(b[30], 1, "NMIC: shared");
    assert_eq!(le32(b, 92), 1, "ANAGRPID");
    assert_eq!(b[33], 0, "DLFEAT");
    assert_eq!(le16(b, 46), 0, "NOIOB");
    assert_eq!(&b[104..120], &ns.nguid);
    assert_eq!(
        (le16(b, 128), b[130]),
        (0, 12),
        "LBA format 0: no metadata, 4 KiB"
    );
    assert_eq!(id.capacity_bytes(), Some(4096 * 1000));
    assert_eq!(identify_namespace(&namespace(1, 512, 8)).lbaf[0].lbads, 9);
}

#[test]
fn identify_dispatch_by_cns_and_nsid() {
    let sub = subsystem(); // NSIDs 1 and 3: 2 and 4 are inactive, NN is 1024
    let ask = |cns: u8, nsid: u32| {
        let mut sqe = Sqe::new(AdminOpcode::Identify as u8);
        sqe.cdw10 = u32::from(cns);
        sqe.nsid = nsid;
        identify(&sub, 1, false, false, &sqe)
    };
    let code = |r: Result<[u8; IDENTIFY_BYTES], Status>| r.map(|_| ()).map_err(|s| s.code());

    let ns1 = ask(0, 1).expect("NSID 1");
    assert_eq!(le64(&ns1, 0), 1 << 21);
    for inactive in [2, 4, 1024] {
        assert_eq!(
            ask(0, inactive),
            Ok([0; IDENTIFY_BYTES]),
            "inactive: zeroes"
        );
    }
    for nsid in [0, 1025, u32::MAX] {
        assert_eq!(code(ask(0, nsid)), Err(Status::INVALID_NAMESPACE), "{nsid}");
    }
    assert!(ask(0, 1025).expect_err("invalid").dnr());

    let list = |after| NamespaceList::from_bytes(&ask(2, after).expect("a list"));
    assert_eq!(list(0).iter().collect::<Vec<_>>(), [1, 3]);
    assert_eq!(list(1).iter().collect::<Vec<_>>(), [3]);
    assert_eq!(list(3).iter().count(), 0);
    assert_eq!(code(ask(2, 0xffff_fffe)), Err(Status::INVALID_NAMESPACE));

    let descriptors = ask(3, 3).expect("descriptors");
    assert_eq!(
        (descriptors[0], descriptors[1]),
        (2, 16),
        "NIDT NGUID, NIDL 16"
    );
    assert_eq!(&descriptors[4..20], &sub.namespaces[1].nguid);
    assert_eq!(
        (descriptors[20], descriptors[21]),
        (3, 16),
        "NIDT UUID, NIDL 16"
    );
    let uuid = &descriptors[24..40];
    assert_eq!(uuid, &sub.namespaces[1].uuid);
    assert_ne!(uuid, &sub.namespaces[0].uuid, "each namespace its own");
    assert_eq!(uuid[6] >> 4, 5, "a name-based (version 5) UUID");
    assert!(
        descriptors[40..].iter().all(|&b| b == 0),
        "ended by a zero descriptor"
    );
    assert_eq!(code(ask(3, 2)), Err(Status::INVALID_NAMESPACE));

    assert_eq!(
        ask(6, 0),
        Ok([0; IDENTIFY_BYTES]),
        "NVM command set: no limits"
    );
    let mut zns = Sqe::new(AdminOpcode::Identify as u8);
    zns.cdw10 = 6;
    zns.cdw11 = 2 << 24;
    assert_eq!(
        identify(&sub, 1, false, false, &zns)
            .map_err(|s| s.code())
            .map(|_| ()),
        Err(Status::INVALID_FIELD)
    );
    assert_eq!(code(ask(0x10, 0)), Err(Status::INVALID_FIELD));

    let ctrl = ask(1, 0).expect("controller");
    assert_eq!(le16(&ctrl, 78), 1);
    // the discovery controller answers CNS 01h only
    let mut sqe = Sqe::identify(Cns::Namespace, 1);
    assert_eq!(
        identify(&sub, 1, true, false, &sqe)
            .map(|_| ())
            .map_err(|s| s.code()),
        Err(Status::INVALID_FIELD)
    );
    sqe.cdw10 = 1;
    let disc = identify(&sub, 1, true, false, &sqe).expect("discovery controller");
    assert_eq!(disc[111], 2);
}
