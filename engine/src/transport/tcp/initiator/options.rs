//! Who the host is ([`HostOptions`]) and why a connection or a command failed
//! ([`HostError`]), for every NVMe/TCP queue the host side opens.

use std::net::SocketAddr;
use std::time::Duration;

use usnvme_driver::spec::Status;

use super::session::Failure;
use crate::fabric::address::Transport;
use crate::fabric::pdu::{Digests, FatalError};

/// Who this host is and how it talks.
#[derive(Debug, Clone)]
pub struct HostOptions {
    /// Digests to ask for; the target must grant exactly these.
    pub digests: Digests,
    pub host_nqn: String,
    pub host_id: [u8; 16],
    /// Keep Alive Timeout for an admin queue, ms; 0 disables it (this client sends no Keep
    /// Alive by itself).
    pub kato_ms: u32,
    /// The longest the TCP connect, the connection set-up or one command may take.
    pub timeout: Duration,
    /// The fabric to connect over (NVMe/TCP unless an `rdma://` address says otherwise).
    pub transport: Transport,
}

/// A fixed host identity (a UUID NQN matching the host ID), no digests, no keep-alive.
impl Default for HostOptions {
    fn default() -> Self {
        HostOptions {
            digests: Digests::default(),
            host_nqn: "nqn.2014-08.org.nvmexpress:uuid:75736e76-6d65-4000-8000-686f73743031"
                .to_owned(),
            host_id: [
                0x75, 0x73, 0x6e, 0x76, 0x6d, 0x65, 0x40, 0x00, 0x80, 0x00, 0x68, 0x6f, 0x73, 0x74,
                0x30, 0x31,
            ],
            kato_ms: 0,
            timeout: Duration::from_secs(10),
            transport: Transport::Tcp,
        }
    }
}

/// Why a connection or a command failed.
#[derive(Debug, thiserror::Error)]
pub enum HostError {
    #[error("NVMe/TCP connection: {0}")]
    Io(#[from] std::io::Error),
    #[error("connection refused by {addr}: is a target listening there?")]
    Refused { addr: SocketAddr },
    #[error("timed out waiting for the target")]
    Timeout,
    #[error("the connection is closed (by the target, or after an earlier error)")]
    Closed,
    /// The target sent a malformed or unexpected PDU; we answered with an H2CTermReq.
    #[error("the target broke the NVMe/TCP protocol: {what}")]
    Protocol { what: FatalError },
    /// The target ended the connection with a C2HTermReq.
    #[error("the target ended the connection: C2HTermReq {} (FES {fes}, FEI {fei})", fes_name(*.fes))]
    Terminated { fes: u16, fei: u32 },
    /// A header digest mismatch ends the connection; a data digest mismatch fails the command.
    #[error("{} digest mismatch", if *.header { "header" } else { "data" })]
    Digest { header: bool },
    #[error("{command} failed: {name} (SCT {:#x}, SC {:#x})", .status.sct(), .status.sc())]
    Status {
        command: &'static str,
        name: &'static str,
        status: Status,
    },
    #[error("invalid argument: {0}")]
    InvalidArgument(&'static str),
    /// An NVMe/RDMA set-up or transport failure, in words (the CM's event, a reject's status,
    /// a failed work request).
    #[error("NVMe/RDMA: {0}")]
    Rdma(String),
}

impl HostError {
    /// A failed command; Fabrics commands give some command specific codes other meanings.
    pub(crate) fn status(command: &'static str, status: Status, fabrics: bool) -> HostError {
        let name = match status.alternate_name() {
            Some(name) if fabrics => name,
            _ => status.name(),
        };
        HostError::Status {
            command,
            name,
            status,
        }
    }
}

fn fes_name(fes: u16) -> &'static str {
    match fes {
        1 => "Invalid PDU Header Field",
        2 => "PDU Sequence Error",
        3 => "Header Digest Error",
        4 => "Data Transfer Out of Range",
        5 => "Data Transfer Limit Exceeded",
        6 => "Unsupported Parameter",
        _ => "with an unknown status",
    }
}

/// How a command that failed on a polled queue fails a blocking call.
impl From<Failure> for HostError {
    fn from(failure: Failure) -> HostError {
        match failure {
            Failure::Status(status) => HostError::status("command", status, false),
            Failure::TimedOut => HostError::Timeout,
            // one command at a time: only the owner ends the queue under it
            Failure::Aborted | Failure::Closed => HostError::Closed,
            Failure::Protocol(FatalError::HeaderDigest) => HostError::Digest { header: true },
            Failure::Protocol(what) => HostError::Protocol { what },
            Failure::Terminated { fes, fei } => HostError::Terminated { fes, fei },
            Failure::DataDigest => HostError::Digest { header: false },
        }
    }
}
