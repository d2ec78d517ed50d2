//! `usnvme target blktests-control`: blktests' external-target protocol (`NVME_TARGET_CONTROL`,
//! see blktests' `common/nvme`) on a running `usnvme serve`. blktests runs
//! `$NVME_TARGET_CONTROL config --show-…` once for where and as whom to connect, then per test
//! `setup --subsysnqn S --subsys-uuid U --hostnqn H` (a subsystem S whose one namespace has UUID
//! U, open to host H) and `cleanup --subsysnqn S` (S gone). Set
//! `NVME_TARGET_CONTROL="usnvme target --socket PATH blktests-control"`.

use std::io::Write;
use std::path::Path;

use anyhow::Result;
use serde_json::json;

use crate::serve::control_request as request;

/// blktests' default subsystem NQN and namespace UUID (`def_subsysnqn`, `def_subsys_uuid`).
const SUBSYSTEM: &str = "blktests-subsystem-1";
const SUBSYSTEM_UUID: &str = "91fdba0d-f87b-4c25-b80f-db7be1418b9e";

#[derive(Debug, clap::Args)]
pub struct Args {
    #[command(subcommand)]
    step: Step,
}

#[derive(Debug, clap::Subcommand)]
enum Step {
    /// Prints one setting.
    Config {
        #[arg(long)]
        show_blkdev_type: bool,
        #[arg(long)]
        show_trtype: bool,
        #[arg(long)]
        show_hostnqn: bool,
        #[arg(long)]
        show_hostid: bool,
        #[arg(long)]
        show_host_traddr: bool,
        #[arg(long)]
        show_traddr: bool,
        #[arg(long)]
        show_trsvid: bool,
        #[arg(long)]
        show_subsysnqn: bool,
        #[arg(long)]
        show_subsys_uuid: bool,
    },
    /// Makes subsystem SUBSYSNQN, open to HOSTNQN, with one namespace (the first device no
    /// namespace uses) whose UUID is SUBSYS_UUID.
    Setup(TestSubsystem),
    /// More ports for a subsystem: every subsystem is on every port already.
    AddPorts {
        #[arg(long)]
        ports: u32,
        #[command(flatten)]
        subsystem: TestSubsystem,
    },
    /// Removes subsystem SUBSYSNQN.
    Cleanup {
        #[arg(long)]
        subsysnqn: String,
    },
}

/// The subsystem a test asks for.
#[derive(Debug, clap::Args)]
struct TestSubsystem {
    #[arg(long)]
    subsysnqn: String,
    #[arg(long)]
    subsys_uuid: String,
    #[arg(long)]
    hostnqn: String,
    /// (authentication: not served)
    #[arg(long, default_value = "")]
    hostkey: String,
    /// (blktests passes `--ctrkey`)
    #[arg(long, alias = "ctrkey", default_value = "")]
    ctrlkey: String,
}

pub fn main(socket: &Path, args: &Args, out: &mut dyn Write) -> Result<()> {
    match &args.step {
        Step::Config {
            show_blkdev_type,
            show_trtype,
            show_hostnqn,
            show_hostid,
            show_host_traddr,
            show_traddr,
            show_trsvid,
            show_subsysnqn,
            show_subsys_uuid,
        } => {
            let listener = || -> Result<std::net::SocketAddr> {
                let status = request(socket, "status", json!({}))?;
                let first = status["listeners"][0].as_str().unwrap_or_default();
                first
                    .parse()
                    .map_err(|_| anyhow::anyhow!("the target listens nowhere: add a listener"))
            };
            let host = || usnvme_engine::fabric::identity::host_identity(Path::new("/"));
            let value = if *show_blkdev_type {
                "device".to_string()
            } else if *show_trtype {
                "tcp".to_string()
            } else if *show_hostnqn {
                host().map_err(anyhow::Error::msg)?.0
            } else if *show_hostid {
                uuid::Uuid::from_bytes(host().map_err(anyhow::Error::msg)?.1)
                    .hyphenated()
                    .to_string()
            } else if *show_host_traddr || *show_traddr {
                listener()?.ip().to_string()
            } else if *show_trsvid {
                listener()?.port().to_string()
            } else if *show_subsysnqn {
                SUBSYSTEM.to_string()
            } else if *show_subsys_uuid {
                SUBSYSTEM_UUID.to_string()
            } else {
                anyhow::bail!(crate::perf::usage("config: give one --show-… flag"));
            };
            writeln!(out, "{value}")?;
        }
        Step::Setup(subsystem) | Step::AddPorts { subsystem, .. } => {
            let TestSubsystem {
                subsysnqn,
                subsys_uuid,
                hostnqn,
                hostkey,
                ctrlkey,
            } = subsystem;
            if !hostkey.is_empty() || !ctrlkey.is_empty() {
                anyhow::bail!("NVMe in-band authentication (--hostkey, --ctrlkey) is not served");
            }
            if matches!(args.step, Step::AddPorts { .. }) {
                return Ok(()); // every subsystem is on every port
            }
            let params = json!({"nqn": subsysnqn, "hosts": [hostnqn]});
            request(socket, "subsystem_add", params)?;
            let params = json!({"nqn": subsysnqn, "uuid": subsys_uuid});
            if let Err(e) = request(socket, "namespace_add", params) {
                let _ = request(socket, "subsystem_remove", json!({"nqn": subsysnqn}));
                return Err(e);
            }
        }
        Step::Cleanup { subsysnqn } => {
            request(socket, "subsystem_remove", json!({"nqn": subsysnqn}))?;
        }
    }
    Ok(())
}
