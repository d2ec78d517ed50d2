//! The Fabrics commands the target serves, and Connect's data checked.

use usnvme_driver::spec::fabrics::{ConnectCommand, PropertyCommand, PropertySize};

use super::*;

/// A 64-byte Fabrics command with `fctype` and the given bytes from byte 40 on.
fn fabrics(fctype: u8, tail: &[(usize, &[u8])]) -> Sqe {
    let mut bytes = [0u8; 64];
    bytes[0] = 0x7f;
    bytes[2..4].copy_from_slice(&0x1234u16.to_le_bytes());
    bytes[4] = fctype;
    for (at, field) in tail {
        bytes[*at..*at + field.len()].copy_from_slice(field);
    }
    Sqe::from_bytes(&bytes)
}

#[test]
fn fabrics_commands_decode_at_their_byte_offsets() {
    let connect = fabrics(
        0x01,
        &[
            (42, &3u16.to_le_bytes()),
            (44, &127u16.to_le_bytes()),
            (46, &[0x04]),
            (48, &15_000u32.to_le_bytes()),
        ],
    );
    let expected = ConnectCommand {
        recfmt: 0,
        qid: 3,
        sqsize: 127,
        cattr: 0x04,
        kato: 15_000,
    };
    assert_eq!(
        FabricsCommand::from_sqe(&connect),
        Ok(FabricsCommand::Connect(expected))
    );
    let format1 = fabrics(0x01, &[(40, &1u16.to_le_bytes())]);
    let refused = FabricsCommand::from_sqe(&format1).expect_err("RECFMT 1");
    assert_eq!(refused.code(), Status::CONNECT_INCOMPATIBLE_FORMAT);
    assert!(refused.dnr());

    let set = fabrics(
        0x00,
        &[
            (40, &[1]),
            (44, &0x14u32.to_le_bytes()),
            (48, &0x0123_4567_89ab_cdefu64.to_le_bytes()),
        ],
    );
    assert_eq!(
        FabricsCommand::from_sqe(&set),
        Ok(FabricsCommand::PropertySet(PropertyCommand {
            size: PropertySize::Eight,
            offset: 0x14,
            value: 0x0123_4567_89ab_cdef,
        }))
    );
    let get = fabrics(0x04, &[(40, &[0]), (44, &0x1cu32.to_le_bytes())]);
    assert_eq!(
        FabricsCommand::from_sqe(&get),
        Ok(FabricsCommand::PropertyGet(PropertyCommand {
            size: PropertySize::Four,
            offset: 0x1c,
            value: 0,
        }))
    );
    let reserved_size = fabrics(0x04, &[(40, &[3])]);
    assert_eq!(
        FabricsCommand::from_sqe(&reserved_size).map_err(|s| s.code()),
        Err(Status::INVALID_FIELD)
    );
    assert_eq!(
        FabricsCommand::from_sqe(&fabrics(0x08, &[])),
        Ok(FabricsCommand::Disconnect)
    );
    for unserved in [0x05, 0x06, 0x02, 0xff] {
        assert_eq!(
            FabricsCommand::from_sqe(&fabrics(unserved, &[])).map_err(|s| s.code()),
            Err(Status::INVALID_OPCODE)
        );
    }
    let not_fabrics = Sqe::identify(Cns::Controller, 0);
    assert_eq!(
        FabricsCommand::from_sqe(&not_fabrics).map_err(|s| s.code()),
        Err(Status::INVALID_OPCODE)
    );
}

fn connect_data(subnqn: &[u8], hostnqn: &[u8]) -> Vec<u8> {
    let mut data = vec![0u8; 1024];
    data[..16].copy_from_slice(&[0x11; 16]);
    data[16..18].copy_from_slice(&0xffffu16.to_le_bytes());
    data[256..256 + subnqn.len()].copy_from_slice(subnqn);
    data[512..512 + hostnqn.len()].copy_from_slice(hostnqn);
    data
}

#[test]
fn connect_data_checks() {
    let host = b"nqn.2014-08.org.nvmexpress:uuid:0f0e0d0c";
    let data = super::connect_data(&connect_data(b"nqn.2024-01.io.usnvme:test", host))
        .expect("1024 bytes");
    assert_eq!(data.host_id, [0x11; 16]);
    assert_eq!(data.cntlid, 0xffff);
    assert_eq!(
        connect_nqns(&data),
        Ok((
            "nqn.2024-01.io.usnvme:test",
            "nqn.2014-08.org.nvmexpress:uuid:0f0e0d0c"
        ))
    );

    let refused = |bytes: &[u8]| {
        let data = super::connect_data(bytes)?;
        connect_nqns(&data).map(|_| ())
    };
    let refused = |bytes: &[u8]| refused(bytes).map_err(|s| s.code());
    // an NQN filling its 256 bytes has no NUL
    assert_eq!(
        refused(&connect_data(&[b'a'; 256], host)),
        Err(Status::CONNECT_INVALID_PARAMETERS)
    );
    assert_eq!(
        refused(&connect_data(
            b"nqn.2024-01.io.usnvme:test",
            b"nqn.\xff\xfe"
        )),
        Err(Status::CONNECT_INVALID_PARAMETERS),
        "not UTF-8"
    );
    assert_eq!(
        refused(&connect_data(b"", host)),
        Err(Status::CONNECT_INVALID_PARAMETERS)
    );
    let mut short = connect_data(b"nqn.a", host);
    short.truncate(768);
    assert_eq!(refused(&short), Err(Status::DATA_SGL_LENGTH_INVALID));
    assert_eq!(refused(&[]), Err(Status::DATA_SGL_LENGTH_INVALID));
    let empty = super::connect_data(&[0; 1024]).expect("1024 bytes");
    assert!(connect_nqns(&empty).expect_err("empty").dnr());
    // no host NQN (as spdk_nvme_perf sends unless told one): a host without a name
    let nameless =
        super::connect_data(&connect_data(b"nqn.2024-01.io.usnvme:test", b"")).expect("1024 bytes");
    assert_eq!(
        connect_nqns(&nameless),
        Ok(("nqn.2024-01.io.usnvme:test", ""))
    );
}
