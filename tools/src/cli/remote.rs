//! Remote NVMe/TCP targets on the command line: the flags that say who this host is and how it
//! talks (`--hostnqn`, `--hdr-digest`, `--data-digest`, named as nvme-cli names them), the
//! drive-or-remote argument of `identify` and `health`, connecting, and the errors a user can
//! act on, each on one line with what to do.

use std::path::Path;

use usnvme_engine::fabric::address::{check_nqn, TcpAddress};
use usnvme_engine::fabric::identity::host_identity_or;
use usnvme_engine::fabric::pdu::Digests;
use usnvme_engine::transport::tcp::HostOptions;
use usnvme_engine::transport::ControllerError;
use usnvme_engine::transport::{RemoteController, RemoteError};

/// How this host reaches remote targets.
#[derive(Debug, Clone, Default, clap::Args)]
pub struct RemoteArgs {
    /// Host NQN to connect to remote targets as (default: /etc/nvme/hostnqn, else one derived
    /// from /etc/machine-id).
    #[arg(long, value_name = "NQN", value_parser = parse_nqn)]
    pub hostnqn: Option<String>,
    /// Ask remote targets for header digests (CRC32C over each PDU header).
    #[arg(long)]
    pub hdr_digest: bool,
    /// Ask remote targets for data digests (CRC32C over each PDU's data).
    #[arg(long)]
    pub data_digest: bool,
}

fn parse_nqn(s: &str) -> Result<String, String> {
    check_nqn(s)
        .map(|()| s.to_owned())
        .map_err(|e| format!("{e} (example: nqn.2014-08.org.nvmexpress:uuid:UUID)"))
}

impl RemoteArgs {
    /// The host options: the NQN given, or the one of this machine (files under `root`).
    pub fn host_options(&self, root: &Path) -> anyhow::Result<HostOptions> {
        let (host_nqn, host_id) =
            host_identity_or(self.hostnqn.as_deref(), root).map_err(anyhow::Error::msg)?;
        Ok(HostOptions {
            digests: Digests {
                header: self.hdr_digest,
                data: self.data_digest,
            },
            host_nqn,
            host_id,
            ..HostOptions::default()
        })
    }
}

/// A drive of `identify` / `health`: local (PCI, `sim:`) or a remote subsystem (the engine's
/// one device name grammar).
pub use usnvme_engine::transport::DeviceName as Target;

/// Connects to the subsystem of `target` (its NQN, or `subnqn` when given) and enables its
/// controller; a failure comes back as one line naming the target and what to do.
pub fn connect(
    target: &TcpAddress,
    subnqn: &str,
    opts: &HostOptions,
) -> anyhow::Result<RemoteController> {
    let opts = HostOptions {
        transport: target.transport,
        ..opts.clone()
    };
    RemoteController::connect(target.addr, subnqn, &opts).map_err(|e| explain(e, target))
}

/// A remote error as the user sees it: what happened, by name, and what to do about it.
pub fn explain(e: RemoteError, target: &TcpAddress) -> anyhow::Error {
    let discover = TcpAddress {
        subnqn: None,
        ..target.clone()
    };
    let text = match &e {
        RemoteError::Refused { addr } => format!(
            "connection refused by {addr}: is the target running, and listening on port {}?",
            addr.port()
        ),
        RemoteError::HostNotAllowed {
            subnqn, host_nqn, ..
        } => format!(
            "host not allowed (Connect Invalid Host): {subnqn} does not allow host {host_nqn}: \
             pass --hostnqn with a host NQN the target allows, or have the target allow this \
             one (usnvme serve: --allow-host {host_nqn}; the kernel's nvmet: a hosts/ entry \
             linked into the subsystem's allowed_hosts/)"
        ),
        RemoteError::UnknownSubsystem { subnqn, .. } => format!(
            "unknown NQN (Connect Invalid Parameters): the target has no subsystem {subnqn}: \
             `usnvme discover {discover}` lists the subsystems it offers"
        ),
        RemoteError::DigestsRefused { asked, .. } => format!(
            "digest mismatch: the target does not grant the digests asked for ({asked}): \
             leave those flags out, or turn digests on at the target"
        ),
        RemoteError::DigestMismatch { header, during } => format!(
            "{} digest mismatch during {during}: what arrived is not what the target sent, or \
             the target computes digests wrongly: try again, or leave {} out",
            if *header { "header" } else { "data" },
            if *header {
                "--hdr-digest"
            } else {
                "--data-digest"
            },
        ),
        RemoteError::Closed { during } => format!(
            "the target closed the connection during {during}: is it still running? (its log \
             says why)"
        ),
        other => other.to_string(),
    };
    anyhow::anyhow!("{target}: {text}")
}

/// Runs `job` on the controller of `target`, then shuts it down (CC.SHN); a shutdown that fails
/// after the job succeeded is logged, the job's result stands.
pub fn with_controller<T>(
    target: &TcpAddress,
    opts: &HostOptions,
    job: impl FnOnce(&mut RemoteController) -> Result<T, ControllerError>,
) -> anyhow::Result<T> {
    let subnqn = target.subnqn.as_deref().unwrap_or_default();
    let mut ctrl = connect(target, subnqn, opts)?;
    let result = job(&mut ctrl).map_err(|e| match e {
        ControllerError::Tcp(e) => explain(e, target),
        other => anyhow::Error::new(other),
    })?;
    if let Err(e) = ctrl.shutdown() {
        log::warn!("{target}: {e}");
    }
    Ok(result)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn target() -> TcpAddress {
        "tcp://127.0.0.1:4420/nqn.2024-01.io.usnvme:t"
            .parse()
            .expect("an address")
    }

    #[test]
    fn every_error_names_itself_and_what_to_do() {
        let t = target();
        let addr = t.addr;
        for (e, says) in [
            (
                RemoteError::Refused { addr },
                "connection refused by 127.0.0.1:4420: is the target running",
            ),
            (
                RemoteError::HostNotAllowed {
                    addr,
                    subnqn: "nqn.s".into(),
                    host_nqn: "nqn.h".into(),
                },
                "host not allowed (Connect Invalid Host): nqn.s does not allow host nqn.h: pass \
                 --hostnqn",
            ),
            (
                RemoteError::UnknownSubsystem {
                    addr,
                    subnqn: "nqn.s".into(),
                },
                "unknown NQN (Connect Invalid Parameters): the target has no subsystem nqn.s: \
                 `usnvme discover tcp://127.0.0.1:4420`",
            ),
            (
                RemoteError::DigestsRefused {
                    addr,
                    asked: "--hdr-digest".into(),
                },
                "digest mismatch: the target does not grant the digests asked for (--hdr-digest)",
            ),
            (
                RemoteError::DigestMismatch {
                    header: false,
                    during: "Identify Controller",
                },
                "data digest mismatch during Identify Controller",
            ),
            (
                RemoteError::Closed {
                    during: "Get Log Page SMART / Health",
                },
                "the target closed the connection during Get Log Page SMART / Health: is it \
                 still running?",
            ),
        ] {
            let text = explain(e, &t).to_string();
            assert!(text.starts_with(&format!("{t}: ")), "{text}");
            assert!(text.contains(says), "{text}");
            assert_eq!(text.lines().count(), 1, "{text}");
        }
    }

    #[test]
    fn host_options_from_the_flags() {
        let args = RemoteArgs {
            hostnqn: Some(
                "nqn.2014-08.org.nvmexpress:uuid:00112233-4455-6677-8899-aabbccddeeff".into(),
            ),
            hdr_digest: true,
            data_digest: false,
        };
        let opts = args
            .host_options(Path::new("/nonexistent"))
            .expect("options");
        assert_eq!(opts.host_id[0], 0x00);
        assert_eq!(opts.host_id[15], 0xff);
        assert!(opts.digests.header && !opts.digests.data);
        assert!(parse_nqn("bad").is_err());
    }
}
