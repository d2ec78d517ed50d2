//! Get Log Page: Error Information (empty), SMART / Health (aggregated from the drives),
//! Firmware Slot Information, and the discovery log.

use usnvme_driver::spec::fabrics::{
    put_nqn, DiscoveryLogEntry, DiscoveryLogHeader, ADRFAM_IPV4, ADRFAM_IPV6, CNTLID_DYNAMIC,
    DISCOVERY_NQN, SUBTYPE_CURRENT_DISCOVERY, SUBTYPE_NVME, TREQ_SQ_FLOW_CONTROL_DISABLE,
    TRTYPE_RDMA, TRTYPE_TCP,
};
use usnvme_driver::spec::log::LogPageId;
use usnvme_driver::spec::rdma::{
    RDMA_CMS_RDMA_CM, RDMA_PRTYPE_NOT_SPECIFIED, RDMA_QPTYPE_CONNECTED,
};
use usnvme_driver::spec::{put_ascii, ErrorLogEntry, FirmwareSlotLog, SmartLog, Sqe, Status};

use super::super::{Listener, SubsystemInfo, ANA_GROUPS, DEFAULT_ANA_GROUP};
use super::{AnaView, Asked, ERROR_LOG_ENTRIES, INVALID_FIELD, INVALID_LOG_PAGE, MAX_LOG_BYTES};
use crate::fabric::address::Transport;
use crate::fabric::export::registry::CHANGED_LIST_ENTRIES;

// The discovery log (NVMe over Fabrics 1.1, Discovery Log Page): a header, then one entry
// per record. Every field is written as Linux's nvmet writes it
// (`drivers/nvme/target/discovery.c`), the reference every host is tested against.

/// ASQSZ: the admin queue entries a host may use: 32, nvmet's NVME_AQ_DEPTH (and the least
/// the specification allows).
const DISCOVERY_ASQSZ: u16 = 32;

/// Who reads the discovery log: the port (listener) its connection came in on, as the host
/// reached it (the address is the connection's local one, never a wildcard), and the NVM
/// subsystems the host may connect to. As nvmet, the log describes that port only, and names
/// an NVM subsystem only to a host allowed to connect to it.
#[derive(Debug, Clone, Copy)]
pub struct DiscoveryAsker<'a> {
    pub port: &'a Listener,
    pub subsystems: &'a [&'a str],
    /// GENCTR: changes whenever the log does.
    pub generation: u64,
}

impl DiscoveryAsker<'_> {
    fn records(&self) -> usize {
        1 + self.subsystems.len()
    }
}

/// Get Log Page: the `len` bytes at `offset` of log LID (CDW10 bits 7:0). The length is NUMD,
/// 0's based dwords from NUMDL (CDW10 bits 31:16) and NUMDU (CDW11 bits 15:0); the offset is
/// CDW12/13 and must be a dword multiple. Bytes past the log's end read as zero; an offset past
/// it is refused. The discovery controller has only the discovery log (70h); an I/O
/// controller has Error Information (01h, empty), SMART / Health (02h, from `smart`, asked only
/// for it, controller-wide: NSID 0 or FFFFFFFFh), Firmware Slot Information (03h), the Changed
/// Namespace List (04h, from `asked`) and the ANA log (0Ch).
pub fn log_page(
    sub: &SubsystemInfo,
    asked: Asked,
    sqe: &Sqe,
    smart: &mut dyn FnMut() -> SmartLog,
    out: &mut [u8],
) -> Result<usize, Status> {
    let numd = ((sqe.cdw11 & 0xffff) << 16) | (sqe.cdw10 >> 16);
    let len = (u64::from(numd) + 1) * 4;
    let len = usize::try_from(len)
        .ok()
        .filter(|&len| len <= MAX_LOG_BYTES.min(out.len()))
        .ok_or(INVALID_FIELD)?;
    let offset = u64::from(sqe.cdw12) | (u64::from(sqe.cdw13) << 32);
    if offset % 4 != 0 {
        return Err(INVALID_FIELD);
    }
    let (discovery, ana) = (asked.discovery, asked.ana);
    let lid = LogPageId::from_raw(sqe.cdw10 as u8);
    let log_len = match (discovery, lid) {
        (Some(asker), Some(LogPageId::Discovery)) => discovery_log_len(asker.records()),
        (Some(_), _) => return Err(INVALID_LOG_PAGE),
        (None, Some(LogPageId::ErrorInformation)) => ERROR_LOG_ENTRIES * ErrorLogEntry::SIZE,
        (None, Some(LogPageId::SmartHealth)) => {
            if sqe.nsid != 0 && sqe.nsid != u32::MAX {
                return Err(INVALID_FIELD); // no per-namespace SMART (LPA bit 0 clear)
            }
            SmartLog::SIZE
        }
        (None, Some(LogPageId::FirmwareSlot)) => FirmwareSlotLog::SIZE,
        (None, Some(LogPageId::ChangedNamespaceList)) => 4 * CHANGED_LIST_ENTRIES,
        (None, Some(LogPageId::AsymmetricNamespaceAccess)) => ana_log_len(sub, rgo(sqe)),
        _ => return Err(INVALID_LOG_PAGE),
    };
    let offset = usize::try_from(offset)
        .ok()
        .filter(|&at| at <= log_len)
        .ok_or(INVALID_FIELD)?;
    // `out` shows the log from `offset`: zeroes, then each part of the log where it falls
    let out = &mut out[..len];
    out.fill(0);
    match (lid, discovery) {
        (Some(LogPageId::Discovery), Some(asker)) => {
            // the current discovery subsystem first, as nvmet lists it (since NVMe-oF 1.1
            // hosts expect it: nvme-cli skips it when connecting)
            let header = DiscoveryLogHeader::new(asker.generation, asker.records() as u64);
            put_log_part(out, offset, 0, header.as_bytes());
            let current = std::iter::once((SUBTYPE_CURRENT_DISCOVERY, DISCOVERY_NQN));
            let nvm = asker.subsystems.iter().map(|n| (SUBTYPE_NVME, *n));
            for (i, (subtype, nqn)) in current.chain(nvm).enumerate() {
                let entry = discovery_entry(subtype, nqn, asker.port);
                put_log_part(out, offset, discovery_log_len(i), entry.as_bytes());
            }
        }
        (Some(LogPageId::SmartHealth), _) => put_log_part(out, offset, 0, smart().as_bytes()),
        (Some(LogPageId::FirmwareSlot), _) => {
            put_log_part(out, offset, 0, firmware_slot_log(sub).as_bytes())
        }
        (Some(LogPageId::AsymmetricNamespaceAccess), _) => {
            put_ana_log(out, offset, sub, ana, rgo(sqe))
        }
        (Some(LogPageId::ChangedNamespaceList), _) => {
            for (i, nsid) in asked.changed_namespaces.iter().enumerate() {
                put_log_part(out, offset, 4 * i, &nsid.to_le_bytes());
            }
        }
        _ => {} // the error log: no errors recorded, all zero
    }
    Ok(len)
}

/// Copies `part`, which is at byte `at` of a log, into `out`, which shows the log from byte
/// `offset` on (whatever of `part` falls inside it).
fn put_log_part(out: &mut [u8], offset: usize, at: usize, part: &[u8]) {
    let (from, to) = if at >= offset {
        (0, at - offset)
    } else {
        (offset - at, 0)
    };
    if from >= part.len() || to >= out.len() {
        return;
    }
    let n = (part.len() - from).min(out.len() - to);
    out[to..to + n].copy_from_slice(&part[from..from + n]);
}

/// Get Log Page's LSP bit 0 for the ANA log: Return Groups Only (no namespace lists).
fn rgo(sqe: &Sqe) -> bool {
    sqe.cdw10 & (1 << 8) != 0
}

/// The ANA log (NVMe Base 2.0, 5.16.1.13): the change count, then a group descriptor for each
/// group listed (group 1, and every other group with namespaces of this subsystem, ascending:
/// nvmet too lists its enabled groups, empty or not) in the port's state for it, each followed
/// by its namespace IDs unless `groups_only`. Its length, and each part put where it falls in
/// `out` (no allocation).
fn ana_log_len(sub: &SubsystemInfo, groups_only: bool) -> usize {
    let listed = listed_groups(sub).count();
    ANA_HEADER
        + listed * ANA_DESCRIPTOR
        + if groups_only {
            0
        } else {
            4 * sub.namespaces.len()
        }
}

const ANA_HEADER: usize = 16;
const ANA_DESCRIPTOR: usize = 32;

/// The ANA groups the log lists, each with its namespaces' count.
fn listed_groups(sub: &SubsystemInfo) -> impl Iterator<Item = (u32, usize)> + '_ {
    (1..=ANA_GROUPS).filter_map(move |group| {
        let members = sub
            .namespaces
            .iter()
            .filter(|ns| ns.ana_group == group)
            .count();
        (group == DEFAULT_ANA_GROUP || members > 0).then_some((group, members))
    })
}

fn put_ana_log(
    out: &mut [u8],
    offset: usize,
    sub: &SubsystemInfo,
    ana: AnaView,
    groups_only: bool,
) {
    let mut header = [0u8; ANA_HEADER];
    header[..8].copy_from_slice(&ana.changes.to_le_bytes());
    let groups = listed_groups(sub).count() as u16;
    header[8..10].copy_from_slice(&groups.to_le_bytes());
    put_log_part(out, offset, 0, &header);
    let mut at = ANA_HEADER;
    for (group, members) in listed_groups(sub) {
        let listed = if groups_only { 0 } else { members };
        let mut descriptor = [0u8; ANA_DESCRIPTOR];
        descriptor[..4].copy_from_slice(&group.to_le_bytes());
        descriptor[4..8].copy_from_slice(&(listed as u32).to_le_bytes());
        descriptor[8..16].copy_from_slice(&ana.changes.to_le_bytes());
        descriptor[16] = ana.state(group) as u8;
        put_log_part(out, offset, at, &descriptor);
        at += ANA_DESCRIPTOR;
        let members = sub.namespaces.iter().filter(|ns| ns.ana_group == group);
        for ns in members.take(listed) {
            put_log_part(out, offset, at, &ns.nsid.to_le_bytes());
            at += 4;
        }
    }
}

/// One firmware slot, read-only and active, holding the usnvme version.
fn firmware_slot_log(sub: &SubsystemInfo) -> FirmwareSlotLog {
    let mut log = FirmwareSlotLog::zeroed();
    log.afi = 1;
    put_ascii(&mut log.frs[0], &sub.firmware);
    log
}

/// Bytes of a discovery log of `records` entries (RECFMT 0), which is also where entry
/// `records` starts.
pub(super) fn discovery_log_len(records: usize) -> usize {
    DiscoveryLogHeader::SIZE + records * DiscoveryLogEntry::SIZE
}

/// One discovery log entry: `nqn`, of type `subtype`, at `port`.
fn discovery_entry(subtype: u8, nqn: &str, port: &Listener) -> DiscoveryLogEntry {
    let mut entry = DiscoveryLogEntry::zeroed();
    entry.trtype = match port.transport {
        Transport::Tcp => TRTYPE_TCP,
        Transport::Rdma => TRTYPE_RDMA,
    };
    entry.adrfam = if port.address.is_ipv4() {
        ADRFAM_IPV4
    } else {
        ADRFAM_IPV6
    };
    entry.subtype = subtype;
    // TREQ: secure channel not specified (we offer no TLS: "required" or "not required" both
    // make libnvme 1.3 add `tls` to the connect options, which Linux 6.1 refuses), and SQ flow
    // control disable supported (we honour CATTR bit 2 in Connect), as nvmet writes for TCP
    entry.treq = TREQ_SQ_FLOW_CONTROL_DISABLE;
    entry.portid = port.port_id;
    entry.cntlid = CNTLID_DYNAMIC;
    entry.asqsz = DISCOVERY_ASQSZ;
    // EFLAGS stay 0, as nvmet leaves them (no duplicate-information or explicit
    // persistent-connection claims); TSAS: for TCP 0 (SECTYPE none, a port without TLS), for
    // RDMA what nvmet writes: a reliable connected queue pair, no provider type named, the
    // RDMA CM
    if port.transport == Transport::Rdma {
        entry.tsas[0] = RDMA_QPTYPE_CONNECTED;
        entry.tsas[1] = RDMA_PRTYPE_NOT_SPECIFIED;
        entry.tsas[2] = RDMA_CMS_RDMA_CM;
    }
    entry.set_trsvcid(&port.address.port().to_string());
    entry.set_traddr(&port.address.ip().to_string());
    put_nqn(&mut entry.subnqn, nqn);
    entry
}

/// The SMART / Health log of the subsystem from its drives': counters add up (saturating),
/// power-on hours and time at temperature are the longest, temperature and percentage used
/// the highest, critical warnings and endurance group summaries combine, and the available
/// spare is the lowest (with that drive's threshold, so the pair agrees with the warnings).
/// Per-sensor temperatures are a drive's own and are left out. No drives: an all-zero log.
pub fn aggregate_smart(logs: &[SmartLog]) -> SmartLog {
    let mut out = SmartLog::zeroed();
    let sum = |counter: fn(&SmartLog) -> u128| {
        logs.iter()
            .map(counter)
            .fold(0u128, u128::saturating_add)
            .to_le_bytes()
    };
    out.data_units_read = sum(SmartLog::data_units_read);
    out.data_units_written = sum(SmartLog::data_units_written);
    out.host_read_commands = sum(SmartLog::host_read_commands);
    out.host_write_commands = sum(SmartLog::host_write_commands);
    out.controller_busy_time = sum(SmartLog::controller_busy_time);
    out.power_cycles = sum(SmartLog::power_cycles);
    out.unsafe_shutdowns = sum(SmartLog::unsafe_shutdowns);
    out.media_errors = sum(SmartLog::media_errors);
    out.error_log_entries = sum(SmartLog::error_log_entries);
    let hours = logs.iter().map(SmartLog::power_on_hours).max();
    out.power_on_hours = hours.unwrap_or(0).to_le_bytes();
    for log in logs {
        out.critical_warning |= log.critical_warning;
        out.endurance_group_summary |= log.endurance_group_summary;
        out.percentage_used = out.percentage_used.max(log.percentage_used);
        if log.temperature_kelvin() > out.temperature_kelvin() {
            out.composite_temperature = log.composite_temperature;
        }
        out.warning_temperature_time = out
            .warning_temperature_time
            .max(log.warning_temperature_time);
        out.critical_temperature_time = out
            .critical_temperature_time
            .max(log.critical_temperature_time);
    }
    if let Some(least) = logs.iter().min_by_key(|log| log.available_spare) {
        out.available_spare = least.available_spare;
        out.available_spare_threshold = least.available_spare_threshold;
    }
    out
}
