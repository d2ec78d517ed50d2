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
use std::time::Duration;

use usnvme_driver::bringup::{
    self, AdminCommand, AdminPath, Data, Failed, Fault, Faults, Reg, RegisterAccess,
};
use usnvme_driver::spec::fabrics::CNTLID_DYNAMIC;
use usnvme_driver::spec::{
    Cap, Cc, ErrorLogEntry, FirmwareSlotLog, IdentifyController, LogPageId, SmartLog, Status, Vs,
};
use usnvme_driver::Namespace;

use super::link::AnaState;
use crate::fabric::address::Transport;
use crate::fabric::discovery::{parse_discovery_log, DiscoveryLog, DISCOVERY_RECORD};
use crate::fabric::pdu::Digests;
use crate::transport::tcp::initiator::{CommandQueue, HostError, HostOptions, Payload};

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
    transport: Transport,
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
            transport: opts.transport,
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

    /// The fabric it is reached over.
    pub fn transport(&self) -> Transport {
        self.transport
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

    /// The ANA state of the first ANA group (a target of one group, as `usnvme serve` and the
    /// kernel's nvmet by default are): the ANA log's header and first group descriptor.
    pub fn ana_state(&mut self) -> Result<AnaState, RemoteError> {
        const NAME: &str = "Get Log Page Asymmetric Namespace Access";
        // header (16 bytes), then the descriptor: group ID, NSIDs, change count, state (byte 16)
        let raw = bringup::log_page(
            &mut self.fabric(),
            NAME,
            LogPageId::AsymmetricNamespaceAccess,
            u32::MAX,
            48,
        )?;
        match (raw.get(8..10), raw.get(32)) {
            (Some(&[lo, hi]), Some(&state)) if u16::from_le_bytes([lo, hi]) > 0 => {
                Ok(AnaState::from_log(state))
            }
            _ => Err(RemoteError::Malformed {
                during: NAME,
                what: "no ANA group",
            }),
        }
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

    /// The connection is lost: close it without a shutdown (its commands could only time out).
    pub fn abandon(mut self) {
        self.shut_down = true;
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

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Read;

    use crate::fabric::pdu;
    use crate::transport::tcp::initiator::testing::connected_target;

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
}
