use std::net::SocketAddr;

use usnvme_driver::spec::command::{Cns, FeatureId, FeatureSelect};

use super::super::{ExportedNamespace, Listener};
use super::log_pages::discovery_log_len;
use super::*;

mod fabrics;
mod features;
mod identify;
mod log_pages;
mod properties;

/// The discovery controller's asker: a host allowed to connect to `OPEN` on the first
/// listener.
fn asker(sub: &SubsystemInfo, discovery: bool) -> Option<DiscoveryAsker<'_>> {
    discovery.then(|| DiscoveryAsker {
        port: &sub.listeners[0],
        subsystems: OPEN,
        generation: 1,
    })
}

/// The one subsystem of the tests' target.
const OPEN: &[&str] = &["nqn.2024-01.io.usnvme:test"];

/// [`super::log_page`] into a buffer of its own, as a Vec.
fn log_page(
    sub: &SubsystemInfo,
    discovery: bool,
    sqe: &Sqe,
    smart: &mut dyn FnMut() -> SmartLog,
) -> Result<Vec<u8>, Status> {
    let mut out = vec![0xEE; MAX_ADMIN_DATA];
    let asked = Asked {
        cntlid: 1,
        discovery: asker(sub, discovery),
        ana: OPTIMIZED,
        changed_namespaces: &[],
        keyed_sgls: false,
    };
    super::log_page(sub, asked, sqe, smart, &mut out).map(|n| out[..n].to_vec())
}

/// An optimized path, its state never changed.
const OPTIMIZED: AnaView = AnaView {
    states: [crate::fabric::export::registry::AnaState::Optimized; 32],
    changes: 0,
};

/// [`super::execute`] into a buffer of its own, as a Vec.
fn execute(
    sub: &SubsystemInfo,
    cntlid: u16,
    discovery: bool,
    features: &mut Features,
    sqe: &Sqe,
    smart: &mut dyn FnMut() -> SmartLog,
) -> Result<(u32, Vec<u8>), Status> {
    let mut out = vec![0xEE; MAX_ADMIN_DATA];
    let asked = Asked {
        cntlid,
        discovery: asker(sub, discovery),
        ana: OPTIMIZED,
        changed_namespaces: &[],
        keyed_sgls: false,
    };
    super::execute(sub, asked, features, sqe, smart, &mut out)
        .map(|(dw0, n)| (dw0, out[..n].to_vec()))
}

/// The whole discovery log, as an allowed host on the first listener reads it.
fn discovery_log(sub: &SubsystemInfo) -> Vec<u8> {
    discovery_log_for(sub, asker(sub, true).expect("an asker"))
}

fn discovery_log_for(sub: &SubsystemInfo, asker: DiscoveryAsker) -> Vec<u8> {
    let len = discovery_log_len(2);
    let mut out = vec![0xEE; MAX_ADMIN_DATA];
    let sqe = get_log(0x70, 0, len as u32, 0);
    let asked = Asked {
        cntlid: 1,
        discovery: Some(asker),
        ana: OPTIMIZED,
        changed_namespaces: &[],
        keyed_sgls: false,
    };
    let n = super::log_page(sub, asked, &sqe, &mut no_smart, &mut out).expect("log");
    let records = le64(&out, 8) as usize;
    out[..n.min(discovery_log_len(records))].to_vec()
}

fn namespace(nsid: u32, block_size: u32, blocks: u64) -> ExportedNamespace {
    let mut nguid = [0u8; 16];
    nguid[0] = 0xab;
    nguid[15] = nsid as u8;
    ExportedNamespace {
        nsid,
        name: format!("sim:{nsid}"),
        block_size,
        blocks,
        nguid,
        uuid: crate::fabric::export::uuid_of_nguid(&nguid),
        ana_group: 1,
        device: nsid as usize - 1,
    }
}

fn listener(address: &str, port_id: u16) -> Listener {
    Listener {
        address: address.parse::<SocketAddr>().expect("an address"),
        port_id,
        transport: crate::fabric::address::Transport::Tcp,
    }
}

fn subsystem() -> SubsystemInfo {
    SubsystemInfo {
        allowed_hosts: None,
        ports: None,
        nqn: "nqn.2024-01.io.usnvme:test".into(),
        serial: "USN0001".into(),
        model: "usnvme".into(),
        firmware: "0.1.0".into(),
        namespaces: vec![namespace(1, 512, 1 << 21), namespace(3, 4096, 1000)],
        listeners: vec![
            listener("192.0.2.10:4420", 1),
            listener("[2001:db8::1]:4421", 2),
        ],
        in_capsule_bytes: 8192,
        max_transfer: 128 << 10,
        queue_entries: 128,
        io_queues: 8,
    }
}

fn le16(b: &[u8], at: usize) -> u16 {
    u16::from_le_bytes([b[at], b[at + 1]])
}

fn le32(b: &[u8], at: usize) -> u32 {
    u32::from_le_bytes(b[at..at + 4].try_into().expect("4 bytes"))
}

fn le64(b: &[u8], at: usize) -> u64 {
    u64::from_le_bytes(b[at..at + 8].try_into().expect("8 bytes"))
}

/// The text of a NUL-terminated field.
fn c_string(field: &[u8]) -> &str {
    let end = field.iter().position(|&b| b == 0).expect("a NUL");
    std::str::from_utf8(&field[..end]).expect("UTF-8")
}

fn no_smart() -> SmartLog {
    panic!("SMART asked for where it is not needed")
}

fn set_features(fid: FeatureId, cdw11: u32) -> Sqe {
    Sqe::set_features(fid, cdw11)
}

fn get_features(fid: FeatureId, select: FeatureSelect) -> Sqe {
    Sqe::get_features(fid, select)
}

fn smart_log(seed: u8) -> SmartLog {
    let mut log = SmartLog::zeroed();
    log.critical_warning = seed & 0x3;
    log.composite_temperature = (300 + u16::from(seed)).to_le_bytes();
    log.available_spare = 100 - seed;
    log.available_spare_threshold = 10 + seed;
    log.percentage_used = seed * 2;
    log.data_units_read = (1000 * u128::from(seed)).to_le_bytes();
    log.data_units_written = (u128::MAX - 1).to_le_bytes();
    log.host_read_commands = 7u128.to_le_bytes();
    log.host_write_commands = (1u128 << 70).to_le_bytes();
    log.controller_busy_time = 3u128.to_le_bytes();
    log.power_cycles = u128::from(seed).to_le_bytes();
    log.power_on_hours = (100 * u128::from(seed)).to_le_bytes();
    log.unsafe_shutdowns = 1u128.to_le_bytes();
    log.media_errors = u128::from(seed).to_le_bytes();
    log.error_log_entries = 2u128.to_le_bytes();
    log.warning_temperature_time = u32::from(seed);
    log.temperature_sensors[0] = 290;
    log
}

/// Get Log Page of `lid`: `len` bytes at `offset`.
fn get_log(lid: u8, nsid: u32, len: u32, offset: u64) -> Sqe {
    Sqe::get_log_page_raw(lid, nsid, len, offset)
}

#[test]
fn execute_dispatches_per_controller_type() {
    let sub = subsystem();
    let mut features = Features::new(&sub);
    let run = |discovery: bool, sqe: &Sqe, features: &mut Features| {
        execute(&sub, 5, discovery, features, sqe, &mut || smart_log(1))
    };

    let (dw0, page) = run(true, &Sqe::identify(Cns::Controller, 0), &mut features).expect("id");
    assert_eq!((dw0, page.len(), page[111]), (0, 4096, 2));
    let (_, log) = run(true, &get_log(0x70, 0, 3072, 0), &mut features).expect("log");
    assert_eq!(log, discovery_log(&sub));
    let kato = set_features(FeatureId::KeepAliveTimer, 120_000);
    assert_eq!(run(true, &kato, &mut features), Ok((0, Vec::new())));
    let queues = Sqe::set_num_queues(4, 4);
    assert_eq!(
        run(true, &queues, &mut features).map_err(|s| s.code()),
        Err(Status::INVALID_FIELD),
        "no I/O queues on the discovery controller"
    );
    assert_eq!(
        run(true, &Sqe::abort(0, 1), &mut features).map_err(|s| s.code()),
        Err(Status::INVALID_OPCODE)
    );

    assert_eq!(
        run(false, &queues, &mut features),
        Ok((0x0003_0003, Vec::new()))
    );
    let (_, smart) = run(false, &get_log(2, u32::MAX, 512, 0), &mut features).expect("SMART");
    assert_eq!(smart, smart_log(1).as_bytes());
    assert_eq!(
        run(false, &Sqe::abort(0, 1), &mut features),
        Ok((1, Vec::new())),
        "not aborted"
    );
    let create = Sqe::create_io_sq(
        1,
        64,
        0,
        1,
        usnvme_driver::spec::command::QueuePriority::Low,
    );
    assert_eq!(
        run(false, &create, &mut features).map_err(|s| s.code()),
        Err(Status::INVALID_OPCODE),
        "queues come from Connect on fabrics"
    );
    let (_, ns) = run(false, &Sqe::identify(Cns::Namespace, 3), &mut features).expect("ns");
    assert_eq!(le64(&ns, 0), 1000);
}
