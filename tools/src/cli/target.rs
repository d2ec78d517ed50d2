//! `usnvme target`: change a running `usnvme serve` through its control socket — subsystems,
//! namespaces, hosts, listeners, ANA states — and save it as a `--config` file. Each change
//! applies at once, and the connected hosts are told.

use std::io::Write;
use std::net::SocketAddr;
use std::path::PathBuf;

use anyhow::Result;
use serde_json::{json, Value};

use crate::serve::{control_request as request, DEFAULT_SOCKET};

mod blktests;

/// Change a running target (`usnvme serve --config`, or with --control): subsystems,
/// namespaces, hosts, listeners, ANA states; save it.
#[derive(Debug, clap::Args)]
pub struct Args {
    /// The target's control socket.
    #[arg(long, value_name = "PATH", default_value = DEFAULT_SOCKET, global = true)]
    socket: PathBuf,
    #[command(subcommand)]
    what: What,
}

#[derive(Debug, clap::Subcommand)]
enum What {
    /// The target as it runs: subsystems, namespaces, hosts, devices, listeners, counters
    /// (JSON).
    Status,
    /// Write the running target as a config `usnvme serve --config` reads (to FILE, or
    /// standard output): a restart with it gives hosts the same identities.
    Save { file: Option<PathBuf> },
    /// Add or remove an NVM subsystem.
    #[command(subcommand)]
    Subsystem(SubsystemCommand),
    /// Export a device as a namespace of a subsystem, or take one away.
    #[command(subcommand)]
    Namespace(NamespaceCommand),
    /// Let a host connect to a subsystem, or no longer (hosts connected stay).
    #[command(subcommand)]
    Host(HostCommand),
    /// Listen on another address, or no longer.
    #[command(subcommand)]
    Listener(ListenerCommand),
    /// Set a port's Asymmetric Namespace Access state.
    #[command(subcommand)]
    Ana(AnaCommand),
    /// blktests' NVME_TARGET_CONTROL protocol (config / setup / cleanup) on this target: run
    /// blktests' nvme group against `usnvme serve` (README: "blktests").
    BlktestsControl(blktests::Args),
}

#[derive(Debug, clap::Subcommand)]
enum SubsystemCommand {
    /// A new subsystem, with no namespaces yet.
    Add {
        nqn: String,
        /// A host NQN that may connect (repeatable); none and no --allow-any-host: no host yet.
        #[arg(
            long = "allow-host",
            value_name = "HOSTNQN",
            conflicts_with = "allow_any_host"
        )]
        allow_host: Vec<String>,
        #[arg(long)]
        allow_any_host: bool,
        /// Serial number (default: derived from the NQN).
        #[arg(long)]
        serial: Option<String>,
        /// Model (default: usnvme).
        #[arg(long)]
        model: Option<String>,
    },
    /// Remove a subsystem: its hosts are disconnected, its devices free for others.
    Remove { nqn: String },
    /// Let hosts reach subsystem NQN through these listeners only (none: every listener).
    Ports {
        nqn: String,
        #[arg(value_name = "ADDR:PORT")]
        addresses: Vec<SocketAddr>,
    },
}

#[derive(Debug, clap::Subcommand)]
enum NamespaceCommand {
    /// Export a device of the target as a namespace of subsystem NQN.
    Add {
        nqn: String,
        /// The device (as `usnvme target status` lists it); default: the first no namespace
        /// uses.
        #[arg(long)]
        device: Option<String>,
        /// Its namespace ID (default: the lowest free).
        #[arg(long)]
        nsid: Option<u32>,
        /// Its UUID (default: derived from its NGUID).
        #[arg(long)]
        uuid: Option<String>,
        /// Its NGUID, 32 hex digits (default: derived from the subsystem and device names).
        #[arg(long)]
        nguid: Option<String>,
        /// Its ANA group, 1 to 32 (default: 1).
        #[arg(long)]
        ana_group: Option<u32>,
    },
    /// Take namespace NSID away from subsystem NQN (its device stays, free to export again).
    Remove { nqn: String, nsid: u32 },
    /// Namespace NSID changed on its drive (resized, formatted): read it again, and export it
    /// in its new shape as the same namespace (hosts are told).
    Rescan { nqn: String, nsid: u32 },
}

#[derive(Debug, clap::Subcommand)]
enum HostCommand {
    /// Let HOSTNQN connect to subsystem NQN.
    Allow { nqn: String, host: String },
    /// No longer let HOSTNQN connect to subsystem NQN.
    Deny { nqn: String, host: String },
    /// Let any host connect to subsystem NQN (on), or only those allowed (off).
    Any {
        nqn: String,
        #[arg(value_parser = ["on", "off"])]
        allow: String,
    },
}

#[derive(Debug, clap::Subcommand)]
enum ListenerCommand {
    /// Listen on ADDR:PORT (NVMe/TCP) or rdma:ADDR:PORT (NVMe/RDMA) too.
    Add {
        #[arg(value_name = "[rdma:]ADDR:PORT", value_parser = crate::serve::parse_listen)]
        address: (usnvme_engine::fabric::address::Transport, SocketAddr),
    },
    Remove {
        address: SocketAddr,
    },
}

#[derive(Debug, clap::Subcommand)]
enum AnaCommand {
    /// STATE: optimized, non-optimized or inaccessible; of every ANA group at the port, or
    /// of one.
    Set {
        address: SocketAddr,
        state: String,
        #[arg(long)]
        group: Option<u32>,
    },
}

pub fn main(args: &Args, out: &mut dyn Write) -> Result<()> {
    let call = |method: &str, params: Value| request(&args.socket, method, params);
    match &args.what {
        What::Status => writeln!(
            out,
            "{}",
            serde_json::to_string_pretty(&call("status", json!({}))?)?
        )?,
        What::Save { file } => {
            let config = serde_json::to_string_pretty(&call("save", json!({}))?)? + "\n";
            match file {
                Some(path) => {
                    // whole or not at all: a reader (or the next start) never sees half of it
                    let tmp = crate::serve::beside(path, ".tmp");
                    std::fs::write(&tmp, &config)
                        .and_then(|()| std::fs::rename(&tmp, path))
                        .map_err(|e| anyhow::anyhow!("{}: cannot write it: {e}", path.display()))?;
                    writeln!(out, "saved to {}", path.display())?;
                }
                None => out.write_all(config.as_bytes())?,
            }
        }
        What::Subsystem(SubsystemCommand::Add {
            nqn,
            allow_host,
            allow_any_host,
            serial,
            model,
        }) => {
            let mut params =
                json!({"nqn": nqn, "hosts": allow_host, "allow_any_host": allow_any_host});
            if let Some(serial) = serial {
                params["serial"] = json!(serial);
            }
            if let Some(model) = model {
                params["model"] = json!(model);
            }
            let added = call("subsystem_add", params)?;
            writeln!(
                out,
                "subsystem {nqn} added (serial {})",
                added["serial"].as_str().unwrap_or("?")
            )?;
        }
        What::Subsystem(SubsystemCommand::Ports { nqn, addresses }) => {
            let ports = (!addresses.is_empty()).then_some(addresses);
            call("subsystem_ports", json!({"nqn": nqn, "ports": ports}))?;
            match ports {
                Some(a) => {
                    let list: Vec<String> = a.iter().map(|a| a.to_string()).collect();
                    writeln!(out, "{nqn} is reached through {}", list.join(", "))?
                }
                None => writeln!(out, "{nqn} is reached through every listener")?,
            }
        }
        What::Subsystem(SubsystemCommand::Remove { nqn }) => {
            call("subsystem_remove", json!({"nqn": nqn}))?;
            writeln!(out, "subsystem {nqn} removed")?;
        }
        What::Namespace(NamespaceCommand::Add {
            nqn,
            device,
            nsid,
            uuid,
            nguid,
            ana_group,
        }) => {
            let mut params = json!({"nqn": nqn});
            for (key, value) in [("device", device), ("uuid", uuid), ("nguid", nguid)] {
                if let Some(v) = value {
                    params[key] = json!(v);
                }
            }
            if let Some(nsid) = nsid {
                params["nsid"] = json!(nsid);
            }
            if let Some(group) = ana_group {
                params["ana_group"] = json!(group);
            }
            let ns = call("namespace_add", params)?;
            writeln!(
                out,
                "namespace {} of {nqn}: {}, uuid {}",
                ns["nsid"],
                text(&ns["device"]),
                text(&ns["uuid"])
            )?;
        }
        What::Namespace(NamespaceCommand::Rescan { nqn, nsid }) => {
            let found = call("namespace_rescan", json!({"nqn": nqn, "nsid": nsid}))?;
            let count = |k: &str| found[k].as_array().map_or(0, Vec::len);
            writeln!(
                out,
                "namespace {nsid} of {nqn} read again: {} removed, {} exported",
                count("removed"),
                count("added")
            )?;
        }
        What::Namespace(NamespaceCommand::Remove { nqn, nsid }) => {
            let ns = call("namespace_remove", json!({"nqn": nqn, "nsid": nsid}))?;
            writeln!(
                out,
                "namespace {nsid} of {nqn} ({}) removed",
                text(&ns["device"])
            )?;
        }
        What::Host(HostCommand::Allow { nqn, host }) => {
            call("host_allow", json!({"nqn": nqn, "host": host}))?;
            writeln!(out, "{host} may connect to {nqn}")?;
        }
        What::Host(HostCommand::Deny { nqn, host }) => {
            call("host_deny", json!({"nqn": nqn, "host": host}))?;
            writeln!(out, "{host} may no longer connect to {nqn}")?;
        }
        What::Host(HostCommand::Any { nqn, allow }) => {
            call(
                "allow_any_host",
                json!({"nqn": nqn, "allow": allow == "on"}),
            )?;
            let who = if allow == "on" {
                "any host"
            } else {
                "only the hosts allowed"
            };
            writeln!(out, "{who} may connect to {nqn}")?;
        }
        What::Listener(ListenerCommand::Add {
            address: (transport, address),
        }) => {
            let added = call(
                "listener_add",
                json!({"address": address, "transport": transport.scheme()}),
            )?;
            writeln!(
                out,
                "listening on {}:{}",
                text(&added["transport"]),
                text(&added["address"])
            )?;
        }
        What::Listener(ListenerCommand::Remove { address }) => {
            call("listener_remove", json!({"address": address}))?;
            writeln!(out, "no longer listening on {address}")?;
        }
        What::Ana(AnaCommand::Set {
            address,
            state,
            group,
        }) => {
            call(
                "ana_set",
                json!({"address": address, "state": state, "group": group}),
            )?;
            match group {
                Some(g) => writeln!(out, "{address}: ANA group {g} {state}")?,
                None => writeln!(out, "{address}: ANA state {state} (every group)")?,
            }
        }
        What::BlktestsControl(b) => blktests::main(&args.socket, b, out)?,
    }
    Ok(())
}

fn text(v: &Value) -> &str {
    v.as_str().unwrap_or("?")
}
