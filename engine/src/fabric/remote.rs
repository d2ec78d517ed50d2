//! A remote NVMe/TCP controller, blocking-looking, on top of a [`CommandQueue`] (the polled
//! queue, one command at a time, each within the command timeout): the admin queue connected, CAP and VS read, the controller enabled (CC.EN, then CSTS.RDY within CAP.TO),
//! Identify Controller, the active namespaces, SMART / Health, the Discovery Log Page, and a
//! clean shutdown (CC.SHN, then CSTS.SHST complete) when done. `usnvme discover`, `identify`
//! and `health` use it on remote targets.
//!
//! The controller logic is the driver's, the same the PCIe controller runs
//! ([`usnvme_driver::bringup`]): this module gives it its register access (Property Get / Set)
//! and its admin path (the connected admin queue, polled), and keeps what only NVMe/TCP has:
//! the connection, ICReq, digests, the Discovery Log Page.
//!
//! Errors a user can act on come out by kind ([`RemoteError`]): refused connection, a host
//! the target does not allow, an unknown subsystem, a digest mismatch, a target that goes
//! away in the middle of a command.

use std::net::SocketAddr;
use std::path::Path;
use std::time::Duration;

use usnvme_driver::bringup::{
    self, AdminCommand, AdminPath, Data, Failed, Fault, Faults, Reg, RegisterAccess,
};
use usnvme_driver::spec::fabrics::{self as f, padded_text, CNTLID_DYNAMIC};
use usnvme_driver::spec::{
    Cap, Cc, DiscoveryLogEntry, DiscoveryLogHeader, ErrorLogEntry, FirmwareSlotLog,
    IdentifyController, LogPageId, SmartLog, Status, Vs,
};
use usnvme_driver::Namespace;

use uuid::Uuid;

use super::initiator::{CommandQueue, HostError, HostOptions, Payload};
use super::pdu::Digests;

pub use usnvme_driver::spec::fabrics::DISCOVERY_NQN;

/// Admin queue entries asked for in Connect.
const ADMIN_ENTRIES: u16 = 32;
/// Discovery log records read at most (1 MiB of log).
const MAX_DISCOVERY_RECORDS: u64 = 1023;
/// Times the discovery log is read again when it changed while being read.
const DISCOVERY_RETRIES: usize = 10;
/// Between two reads of CSTS while waiting: the target answers at once, no need to spin.
const POLL_INTERVAL: Duration = Duration::from_millis(2);

/// Why a remote controller could not be used, by kind.
#[derive(Debug, thiserror::Error)]
pub enum RemoteError {
    #[error("connection refused by {addr}")]
    Refused { addr: SocketAddr },
    /// The target's Connect status "Connect Invalid Host".
    #[error("Connect Invalid Host: {subnqn} at {addr} does not allow host {host_nqn}")]
    HostNotAllowed {
        addr: SocketAddr,
        subnqn: String,
        host_nqn: String,
    },
    /// The target's Connect status "Connect Invalid Parameters": for an admin queue with
    /// well-formed NQNs, the subsystem NQN it does not know.
    #[error("Connect Invalid Parameters: {addr} has no subsystem {subnqn}")]
    UnknownSubsystem { addr: SocketAddr, subnqn: String },
    /// The target did not grant the digests asked for in ICReq.
    #[error("{addr} does not grant the digests asked for ({asked})")]
    DigestsRefused { addr: SocketAddr, asked: String },
    #[error("{} digest mismatch during {during}", if *.header { "header" } else { "data" })]
    DigestMismatch { header: bool, during: &'static str },
    /// The connection ended (reset, or closed by the target) in the middle of a command.
    #[error("the target closed the connection during {during}")]
    Closed { during: &'static str },
    /// The target did not answer a command within the command timeout (the admin queue was
    /// closed: the command may still be carried out).
    #[error("the target did not answer {during} within {ms} ms")]
    TimedOut { during: &'static str, ms: u128 },
    #[error("the controller did not become ready within {ms} ms (CAP.TO)")]
    NotReady { ms: u64 },
    #[error("the controller did not become disabled (CSTS.RDY = 0) within {ms} ms (CAP.TO)")]
    NotDisabled { ms: u64 },
    /// Its registers read all ones.
    #[error("the controller's registers read all ones: it is gone")]
    Gone,
    #[error("the controller did not report its shutdown complete (CSTS.SHST) within {ms} ms")]
    ShutdownTimeout { ms: u128 },
    #[error("the controller reports a fatal status (CSTS.CFS) during {during}")]
    ControllerFatal { during: &'static str },
    #[error("cannot start the keep-alive thread: {0}")]
    Thread(#[source] std::io::Error),
    #[error("{during}: {what}")]
    Malformed {
        during: &'static str,
        what: &'static str,
    },
    #[error("{during}: {source}")]
    Host {
        during: &'static str,
        #[source]
        source: HostError,
    },
}

impl RemoteError {
    /// A host-side error during `during`, by kind.
    fn host(during: &'static str, source: HostError, timeout: Duration) -> RemoteError {
        match source {
            HostError::Digest { header } => RemoteError::DigestMismatch { header, during },
            HostError::Closed => RemoteError::Closed { during },
            HostError::Timeout => RemoteError::TimedOut {
                during,
                ms: timeout.as_millis(),
            },
            HostError::Io(e) if is_connection_lost(&e) => RemoteError::Closed { during },
            source => RemoteError::Host { during, source },
        }
    }
}

fn is_connection_lost(e: &std::io::Error) -> bool {
    use std::io::ErrorKind::*;
    matches!(
        e.kind(),
        ConnectionReset | ConnectionAborted | BrokenPipe | UnexpectedEof | NotConnected
    )
}

/// The digests asked for, as nvme-cli names their flags.
fn digest_names(d: Digests) -> String {
    match (d.header, d.data) {
        (true, true) => "--hdr-digest, --data-digest".into(),
        (true, false) => "--hdr-digest".into(),
        (false, true) => "--data-digest".into(),
        (false, false) => "none".into(),
    }
}

/// A controller of a remote subsystem, enabled, with its admin queue connected.
#[derive(Debug)]
pub struct RemoteController {
    admin: CommandQueue,
    addr: SocketAddr,
    subnqn: String,
    cntlid: u16,
    cap: Cap,
    vs: Vs,
    cc: Cc,
    digests: Digests,
    /// How long the shutdown may take.
    timeout: Duration,
    /// How long one admin command may take.
    command_timeout: Duration,
    shut_down: bool,
}

impl RemoteController {
    /// Connects to `subnqn` at `addr`, reads CAP and VS, and enables the controller.
    pub fn connect(
        addr: SocketAddr,
        subnqn: &str,
        opts: &HostOptions,
    ) -> Result<RemoteController, RemoteError> {
        let (mut admin, cntlid) =
            CommandQueue::connect(addr, subnqn, 0, ADMIN_ENTRIES, CNTLID_DYNAMIC, opts)
                .map_err(|e| connect_error(e, addr, subnqn, opts))?;
        let (cap, vs) = bringup::read_cap_vs(&mut Fabric::new(&mut admin, opts.timeout))?;
        let mut ctrl = RemoteController {
            admin,
            addr,
            subnqn: subnqn.to_owned(),
            cntlid,
            cap,
            vs,
            cc: Cc::new(),
            digests: opts.digests,
            timeout: opts.timeout,
            command_timeout: opts.timeout,
            // nothing to shut down until enabled
            shut_down: true,
        };
        ctrl.enable()?;
        Ok(ctrl)
    }

    /// The admin queue as the shared controller logic sees it.
    fn fabric(&mut self) -> Fabric<'_> {
        Fabric::new(&mut self.admin, self.command_timeout)
    }

    /// CC.EN = 1 (NVM command set, 4 KiB pages, 64/16-byte entries), then CSTS.RDY within
    /// CAP.TO ([`bringup::enable`]).
    fn enable(&mut self) -> Result<(), RemoteError> {
        let timeout = bringup::ready_timeout(self.cap);
        let mut fabric = self.fabric();
        let result = bringup::enable(&mut fabric, bringup::host_configuration(), timeout);
        // once CC.EN is set, the controller is shut down when done (also if it never
        // becomes ready)
        let written = fabric.cc;
        if let Some(cc) = written {
            self.cc = cc;
            self.shut_down = false;
        }
        result.map(|_| ())
    }

    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    pub fn subnqn(&self) -> &str {
        &self.subnqn
    }

    pub fn cntlid(&self) -> u16 {
        self.cntlid
    }

    pub fn cap(&self) -> Cap {
        self.cap
    }

    pub fn version(&self) -> Vs {
        self.vs
    }

    pub fn digests(&self) -> Digests {
        self.digests
    }

    /// The most data the target takes in one H2CData PDU (from ICResp).
    pub fn maxh2cdata(&self) -> u32 {
        self.admin.maxh2cdata()
    }

    /// Set Features Number of Queues: asks for `wanted` I/O queues (submission and completion
    /// alike); the number of pairs the controller grants (at most `wanted`).
    pub fn set_io_queues(&mut self, wanted: u16) -> Result<u16, RemoteError> {
        Ok(bringup::set_number_of_queues(&mut self.fabric(), wanted)?.pairs)
    }

    /// The longest one admin command may take from now on (a Keep Alive answered later
    /// than KATO is lost).
    pub fn set_command_timeout(&mut self, timeout: Duration) {
        if !timeout.is_zero() {
            self.admin.set_timeout(timeout);
            self.command_timeout = timeout;
        }
    }

    /// Keep Alive: tells the controller the host is still there (within KATO).
    pub fn keep_alive(&mut self) -> Result<(), RemoteError> {
        bringup::keep_alive(&mut self.fabric())
    }

    pub fn identify_controller(&mut self) -> Result<IdentifyController, RemoteError> {
        bringup::identify_controller(&mut self.fabric()).map(|id| *id)
    }

    /// The active namespaces with a usable LBA format, read as the local driver reads them.
    pub fn namespaces(&mut self, nn: u32) -> Result<Vec<Namespace>, RemoteError> {
        let name = self.addr.to_string();
        bringup::namespaces(&mut self.fabric(), &name, nn)
    }

    /// SMART / Health Information of the whole controller (NSID FFFFFFFFh).
    pub fn smart_log(&mut self) -> Result<SmartLog, RemoteError> {
        bringup::smart_log(&mut self.fabric())
    }

    /// The newest `count` Error Information entries (`elpe`: Identify Controller's ELPE).
    pub fn error_log(&mut self, elpe: u8, count: usize) -> Result<Vec<ErrorLogEntry>, RemoteError> {
        bringup::error_log(&mut self.fabric(), elpe, count)
    }

    pub fn firmware_log(&mut self) -> Result<FirmwareSlotLog, RemoteError> {
        bringup::firmware_log(&mut self.fabric())
    }

    /// The Discovery Log Page (0x70): the header, then every record, read again while its
    /// generation counter changes under us.
    pub fn discovery_log(&mut self) -> Result<DiscoveryLog, RemoteError> {
        let during = "Get Log Page Discovery";
        let mut fabric = self.fabric();
        let mut read = |len| bringup::log_page(&mut fabric, during, LogPageId::Discovery, 0, len);
        for _ in 0..DISCOVERY_RETRIES {
            let header = read(DISCOVERY_RECORD)?;
            let head = parse_discovery_log(&header)
                .map_err(|what| RemoteError::Malformed { during, what })?;
            let records = head.numrec.min(MAX_DISCOVERY_RECORDS);
            if records == 0 {
                return Ok(head);
            }
            let full = read(DISCOVERY_RECORD * (1 + records as usize))?;
            let log = parse_discovery_log(&full)
                .map_err(|what| RemoteError::Malformed { during, what })?;
            if log.genctr == head.genctr {
                return Ok(log);
            }
        }
        Err(RemoteError::Malformed {
            during,
            what: "the log kept changing while being read",
        })
    }

    /// Normal shutdown: CC.SHN, then CSTS.SHST complete (within the queue's timeout), then
    /// the connection closes.
    pub fn shutdown(mut self) -> Result<(), RemoteError> {
        self.shut_down_controller()
    }

    fn shut_down_controller(&mut self) -> Result<(), RemoteError> {
        if self.shut_down {
            return Ok(());
        }
        self.shut_down = true;
        let (cc, limit) = (self.cc, self.timeout);
        bringup::shutdown(&mut self.fabric(), cc, limit)
    }
}

impl Drop for RemoteController {
    /// A controller dropped without [`RemoteController::shutdown`] is shut down anyway (best
    /// effort: on a dead connection this fails at once).
    fn drop(&mut self) {
        if let Err(e) = self.shut_down_controller() {
            log::debug!("{}: shutdown: {e}", self.addr);
        }
    }
}

/// The admin queue of a remote controller as the shared controller logic
/// ([`usnvme_driver::bringup`]) sees it: registers by Property Get / Set, admin commands run
/// one at a time, polled to completion within the command timeout.
struct Fabric<'a> {
    admin: &'a mut CommandQueue,
    /// The command timeout, for the errors that name it.
    timeout: Duration,
    /// CC as last written (Property Set succeeded).
    cc: Option<Cc>,
}

impl<'a> Fabric<'a> {
    fn new(admin: &'a mut CommandQueue, timeout: Duration) -> Fabric<'a> {
        Fabric {
            admin,
            timeout,
            cc: None,
        }
    }
}

/// What a Property Get (`set` false) or Set of the shared logic's step `during` is called in
/// errors.
fn property_step(set: bool, during: &'static str) -> &'static str {
    match (set, during) {
        (false, "CAP") => "Property Get CAP",
        (false, "VS") => "Property Get VS",
        (false, "CSTS.RDY") => "waiting for CSTS.RDY",
        (false, "CSTS.SHST") => "waiting for CSTS.SHST",
        (false, "CC") => "Property Get CC",
        (false, _) => "Property Get CSTS",
        (true, "CC.EN") => "Property Set CC.EN",
        (true, "CC.SHN") => "Property Set CC.SHN",
        (true, _) => "Property Set CC",
    }
}

impl Faults for Fabric<'_> {
    type Error = RemoteError;
    fn fault(&self, fault: Fault) -> RemoteError {
        match fault {
            Fault::Gone => RemoteError::Gone,
            Fault::Fatal { during } => RemoteError::ControllerFatal { during },
            Fault::ReadyTimeout {
                ready: true, after, ..
            } => RemoteError::NotReady {
                ms: after.as_millis() as u64,
            },
            Fault::ReadyTimeout {
                ready: false,
                after,
                ..
            } => RemoteError::NotDisabled {
                ms: after.as_millis() as u64,
            },
            Fault::ShutdownTimeout { after } => RemoteError::ShutdownTimeout {
                ms: after.as_millis(),
            },
            Fault::Status {
                command, status, ..
            } => RemoteError::Host {
                during: command,
                source: HostError::Status {
                    command,
                    name: status.name(),
                    status,
                },
            },
            Fault::Malformed { command, .. } => RemoteError::Malformed {
                during: command,
                what: "short data",
            },
        }
    }
}

impl RegisterAccess for Fabric<'_> {
    fn read(&mut self, reg: Reg, during: &'static str) -> Result<u64, RemoteError> {
        let value = self
            .admin
            .property_get(reg.offset() as u32, reg.eight_bytes())
            .map_err(|e| RemoteError::host(property_step(false, during), e, self.timeout))?;
        Ok(match reg.eight_bytes() {
            true => value,
            false => value & u64::from(u32::MAX),
        })
    }

    fn write(&mut self, reg: Reg, value: u64, during: &'static str) -> Result<(), RemoteError> {
        self.admin
            .property_set(reg.offset() as u32, reg.eight_bytes(), value)
            .map_err(|e| RemoteError::host(property_step(true, during), e, self.timeout))?;
        if reg == Reg::Cc {
            self.cc = Some(Cc(value as u32));
        }
        Ok(())
    }

    /// The target answers at once: no need to spin.
    fn poll_interval(&self) -> Duration {
        POLL_INTERVAL
    }
}

impl AdminPath for Fabric<'_> {
    fn admin(&mut self, command: AdminCommand<'_>) -> Result<u32, Failed<RemoteError>> {
        let payload = match command.data {
            Data::None => Payload::None,
            Data::FromController(buf) => Payload::FromController(buf),
            Data::ToController(buf) => Payload::ToController(buf),
        };
        match self.admin.command(command.sqe, payload) {
            Ok(cqe) if cqe.status().is_success() => Ok(cqe.dw0),
            Ok(cqe) => Err(Failed::Status(cqe.status())),
            Err(e) => Err(Failed::Transport(RemoteError::host(
                command.name,
                e,
                self.timeout,
            ))),
        }
    }
}

/// A failed admin Connect, by kind.
fn connect_error(e: HostError, addr: SocketAddr, subnqn: &str, opts: &HostOptions) -> RemoteError {
    match e {
        HostError::Refused { addr } => RemoteError::Refused { addr },
        HostError::Status { status, .. } if status.code() == Status::CONNECT_INVALID_HOST => {
            RemoteError::HostNotAllowed {
                addr,
                subnqn: subnqn.to_owned(),
                host_nqn: opts.host_nqn.clone(),
            }
        }
        HostError::Status { status, .. } if status.code() == Status::CONNECT_INVALID_PARAMETERS => {
            RemoteError::UnknownSubsystem {
                addr,
                subnqn: subnqn.to_owned(),
            }
        }
        // check_ic_resp names the DGST field when the digests granted differ
        HostError::Protocol { what } if what.to_string().contains("DGST") => {
            RemoteError::DigestsRefused {
                addr,
                asked: digest_names(opts.digests),
            }
        }
        e => RemoteError::host("Connect", e, opts.timeout),
    }
}

/// The size of the Discovery Log Page's header and of each of its records.
const DISCOVERY_RECORD: usize = DiscoveryLogEntry::SIZE;
const _: () = assert!(DiscoveryLogHeader::SIZE == DISCOVERY_RECORD);

/// A Discovery Log Page: its generation counter, record count, and the records read.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct DiscoveryLog {
    pub genctr: u64,
    pub numrec: u64,
    pub entries: Vec<DiscoveryEntry>,
}

/// One Discovery Log Page Entry (NVMe over Fabrics 1.1, figure 38).
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct DiscoveryEntry {
    pub trtype: u8,
    pub adrfam: u8,
    pub subtype: u8,
    pub treq: u8,
    pub port_id: u16,
    pub cntlid: u16,
    pub asqsz: u16,
    pub eflags: u16,
    /// Transport service identifier: for TCP, the port.
    pub trsvcid: String,
    pub subnqn: String,
    pub traddr: String,
    /// For TCP, the first byte of the transport specific address subtype (TSAS): the
    /// security type.
    pub sectype: u8,
}

impl DiscoveryEntry {
    pub fn transport_name(&self) -> &'static str {
        match self.trtype {
            f::TRTYPE_RDMA => "rdma",
            f::TRTYPE_FC => "fc",
            f::TRTYPE_TCP => "tcp",
            f::TRTYPE_LOOP => "loop",
            _ => "unknown",
        }
    }

    pub fn address_family_name(&self) -> &'static str {
        match self.adrfam {
            f::ADRFAM_IPV4 => "ipv4",
            f::ADRFAM_IPV6 => "ipv6",
            f::ADRFAM_IB => "ib",
            f::ADRFAM_FC => "fc",
            f::ADRFAM_LOOP => "loop",
            _ => "unknown",
        }
    }

    /// Subsystem type, as nvme-cli names it.
    pub fn subtype_name(&self) -> &'static str {
        match self.subtype {
            f::SUBTYPE_REFERRAL => "discovery subsystem referral",
            f::SUBTYPE_NVME => "nvme subsystem",
            f::SUBTYPE_CURRENT_DISCOVERY => "current discovery subsystem",
            _ => "unknown",
        }
    }

    /// Transport requirements, in nvme-cli's words: the secure channel requirement (bits
    /// 1:0), then whether SQ flow control may be disabled (bit 2).
    pub fn treq_text(&self) -> String {
        let secure = match self.treq & f::TREQ_SECURE_MASK {
            0 => "not specified",
            f::TREQ_SECURE_REQUIRED => "required",
            f::TREQ_SECURE_NOT_REQUIRED => "not required",
            _ => "reserved",
        };
        if self.treq & f::TREQ_SQ_FLOW_CONTROL_DISABLE != 0 {
            format!("{secure}, sq flow control disable supported")
        } else {
            secure.to_owned()
        }
    }

    /// Entry flags, in nvme-cli's words.
    pub fn eflags_text(&self) -> String {
        let names: Vec<&str> = [
            (
                f::EFLAGS_EXPLICIT_PERSISTENT_CONNECTION,
                "explicit discovery connections",
            ),
            (
                f::EFLAGS_DUPLICATE_RETURN_INFO,
                "duplicate discovery information",
            ),
            (f::EFLAGS_NO_CDC_CONNECTIVITY, "no cdc connectivity"),
        ]
        .iter()
        .filter(|(bit, _)| self.eflags & bit != 0)
        .map(|(_, name)| *name)
        .collect();
        if names.is_empty() {
            "none".to_owned()
        } else {
            names.join(", ")
        }
    }

    /// The TCP security type, in nvme-cli's words.
    pub fn sectype_name(&self) -> &'static str {
        match self.sectype {
            f::SECTYPE_NONE => "none",
            f::SECTYPE_TLS12 => "tls",
            f::SECTYPE_TLS13 => "tls13",
            _ => "unknown",
        }
    }
}

/// The header of a discovery log and the complete records that follow it in `bytes` (at most
/// NUMREC of them).
pub fn parse_discovery_log(bytes: &[u8]) -> Result<DiscoveryLog, &'static str> {
    let header = bytes
        .get(..DISCOVERY_RECORD)
        .and_then(DiscoveryLogHeader::from_slice)
        .ok_or("the discovery log is shorter than its header")?;
    let entries = bytes
        .get(DISCOVERY_RECORD..)
        .unwrap_or_default()
        .chunks_exact(DISCOVERY_RECORD)
        .take(usize::try_from(header.numrec).unwrap_or(usize::MAX))
        .filter_map(DiscoveryLogEntry::from_slice)
        .map(|e| DiscoveryEntry {
            trtype: e.trtype,
            adrfam: e.adrfam,
            subtype: e.subtype,
            treq: e.treq,
            port_id: e.portid,
            cntlid: e.cntlid,
            asqsz: e.asqsz,
            eflags: e.eflags,
            trsvcid: padded_text(&e.trsvcid),
            subnqn: padded_text(&e.subnqn),
            traddr: padded_text(&e.traddr),
            sectype: e.sectype(),
        })
        .collect();
    Ok(DiscoveryLog {
        genctr: header.genctr,
        numrec: header.numrec,
        entries,
    })
}

/// Where the host NQN and host ID come from when none is given: nvme-cli's files, else one
/// derived from the machine ID.
pub const HOSTNQN_FILE: &str = "etc/nvme/hostnqn";
pub const HOSTID_FILE: &str = "etc/nvme/hostid";
pub const MACHINE_ID_FILE: &str = "etc/machine-id";

/// This host's NQN and host ID, under the root `root` (`/`): `etc/nvme/hostnqn` (and
/// `etc/nvme/hostid`) when they exist, as nvme-cli uses them; else a UUID NQN derived from
/// `etc/machine-id` (stable on this machine, and not the machine ID itself). The host ID is the
/// NQN's UUID when it has one.
pub fn host_identity(root: &Path) -> Result<(String, [u8; 16]), String> {
    let read = |path: &str| read_setting(root, path);
    let (nqn, uuid) = match read(HOSTNQN_FILE) {
        Some(nqn) => {
            let uuid = uuid_of(&nqn);
            (nqn, uuid)
        }
        None => {
            let machine = read(MACHINE_ID_FILE).ok_or_else(|| {
                format!(
                    "no host NQN: neither /{HOSTNQN_FILE} nor /{MACHINE_ID_FILE} exists; pass \
                     --hostnqn NQN"
                )
            })?;
            // Stable on this machine, and not the machine ID itself (which is not to be shown).
            let uuid = Uuid::new_v5(&HOST_NAMESPACE, machine.as_bytes());
            (
                format!("nqn.2014-08.org.nvmexpress:uuid:{}", uuid.hyphenated()),
                Some(uuid),
            )
        }
    };
    let id = read(HOSTID_FILE)
        .and_then(|s| Uuid::parse_str(&s).ok())
        .or(uuid)
        .unwrap_or_else(|| Uuid::new_v5(&HOST_NAMESPACE, nqn.as_bytes()));
    Ok((nqn, id.into_bytes()))
}

/// The text of the file `path` under `root`, trimmed; None when it is missing or empty.
pub(crate) fn read_setting(root: &Path, path: &str) -> Option<String> {
    std::fs::read_to_string(root.join(path))
        .ok()
        .map(|s| s.trim().to_owned())
        .filter(|s| !s.is_empty())
}

/// A host ID for a host NQN given by hand: its UUID when it has one, else one derived from it.
pub fn host_id_for(nqn: &str) -> [u8; 16] {
    uuid_of(nqn)
        .unwrap_or_else(|| Uuid::new_v5(&HOST_NAMESPACE, nqn.as_bytes()))
        .into_bytes()
}

/// The UUID of a UUID NQN (`nqn.2014-08.org.nvmexpress:uuid:…`).
fn uuid_of(nqn: &str) -> Option<Uuid> {
    let (_, u) = nqn.rsplit_once(":uuid:")?;
    Uuid::parse_str(u).ok()
}

/// The namespace of the name-based (version 5) UUIDs usnvme derives host identities in: a
/// fixed random UUID, so that no other program's derivation from the machine ID collides.
const HOST_NAMESPACE: Uuid = Uuid::from_u128(0x6f1c_9a3e_5b8d_5c27_9e41_0d2b_7a6f_3c18);

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Read;

    use crate::fabric::initiator::testing::connected_target;
    use crate::fabric::pdu;

    #[test]
    fn an_admin_command_a_silent_target_does_not_answer_fails_as_timed_out() {
        let (addr, target) = connected_target(|mut s| {
            // Property Get CAP comes, and no answer; until the host gives up and closes
            let mut get = [0u8; pdu::CAPSULE_CMD_HEADER];
            s.read_exact(&mut get).expect("Property Get");
            assert_eq!(s.read(&mut [0u8; 1]).expect("EOF"), 0);
        });
        let opts = HostOptions {
            timeout: Duration::from_millis(300),
            ..HostOptions::default()
        };
        let err = RemoteController::connect(addr, "nqn.x:silent", &opts).expect_err("silence");
        assert!(
            matches!(
                err,
                RemoteError::TimedOut {
                    during: "Property Get CAP",
                    ms: 300
                }
            ),
            "{err}"
        );
        assert_eq!(
            err.to_string(),
            "the target did not answer Property Get CAP within 300 ms"
        );
        target.join().expect("the fake target");
    }

    #[test]
    fn host_identity_from_nvme_cli_files_or_the_machine_id() {
        let dir = std::env::temp_dir().join(format!("usnvme-hostnqn-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(dir.join("etc/nvme")).expect("a temp dir");
        assert!(host_identity(&dir)
            .expect_err("nothing")
            .contains("--hostnqn"));

        std::fs::write(
            dir.join(MACHINE_ID_FILE),
            "3d1219c7c4c5404aaa1f6d2a48adfda4\n",
        )
        .expect("write");
        let (nqn, id) = host_identity(&dir).expect("derived");
        assert!(nqn.starts_with("nqn.2014-08.org.nvmexpress:uuid:"), "{nqn}");
        assert!(
            !nqn.contains("3d1219c7"),
            "not the machine ID itself: {nqn}"
        );
        assert_eq!(host_identity(&dir).expect("again"), (nqn.clone(), id));
        assert_eq!(Some(Uuid::from_bytes(id)), uuid_of(&nqn));
        assert_eq!(id[6] >> 4, 5, "a name-based (version 5) UUID");

        let given = "nqn.2014-08.org.nvmexpress:uuid:00112233-4455-6677-8899-aabbccddeeff";
        std::fs::write(dir.join(HOSTNQN_FILE), format!("{given}\n")).expect("write");
        let (nqn, id) = host_identity(&dir).expect("from the file");
        assert_eq!(nqn, given);
        assert_eq!(id[..4], [0x00, 0x11, 0x22, 0x33]);
        std::fs::write(
            dir.join(HOSTID_FILE),
            "ffeeddcc-bbaa-9988-7766-554433221100",
        )
        .expect("write");
        assert_eq!(host_identity(&dir).expect("hostid").1[0], 0xff);
        let _ = std::fs::remove_dir_all(&dir);

        assert_eq!(host_id_for(given)[15], 0xff);
        assert_eq!(host_id_for("nqn.x:y"), host_id_for("nqn.x:y"));
    }

    #[test]
    fn discovery_log_entries() {
        let mut log = vec![0u8; 3 * 1024];
        log[0] = 5;
        log[8] = 2;
        let e = &mut log[1024..2048];
        e[..4].copy_from_slice(&[3, 1, 2, 3]);
        e[4] = 7;
        e[6..8].copy_from_slice(&0xffffu16.to_le_bytes());
        e[10] = 2; // EFLAGS: explicit persistent connections
        e[768] = 1; // TSAS: SECTYPE TLS
        e[32..64].copy_from_slice(&[b' '; 32]);
        e[32..36].copy_from_slice(b"4420");
        e[256..265].copy_from_slice(b"nqn.x:sub");
        e[512..768].copy_from_slice(&[b' '; 256]);
        e[512..521].copy_from_slice(b"127.0.0.1");
        let parsed = parse_discovery_log(&log).expect("a log");
        assert_eq!((parsed.genctr, parsed.numrec), (5, 2));
        assert_eq!(parsed.entries.len(), 2);
        let e = &parsed.entries[0];
        assert_eq!(
            (
                e.transport_name(),
                e.address_family_name(),
                e.subtype_name()
            ),
            ("tcp", "ipv4", "nvme subsystem")
        );
        assert_eq!((e.port_id, e.cntlid), (7, 0xffff));
        assert_eq!(
            (e.treq_text(), e.eflags_text(), e.sectype_name()),
            (
                "reserved".to_owned(), // TREQ 3: both secure channel bits
                "explicit discovery connections".to_owned(),
                "tls"
            )
        );
        assert_eq!(
            (e.trsvcid.as_str(), e.subnqn.as_str(), e.traddr.as_str()),
            ("4420", "nqn.x:sub", "127.0.0.1")
        );
        // fewer records than NUMREC says, a partial one, a header cut short
        assert_eq!(
            parse_discovery_log(&log[..2500])
                .expect("log")
                .entries
                .len(),
            1
        );
        assert!(parse_discovery_log(&log[..12]).is_err());
    }
}
