//! The control socket of a running target: JSON-RPC 2.0 over a Unix socket only its owner may
//! use (as SPDK's `nvmf_tgt` is driven), one request per line and one response per line.
//! `usnvme target …` speaks it; so may any script. Each change applies at once: the reactors
//! take it, then the connected hosts are told (see `usnvme_engine::fabric::export::live`).
//!
//! Methods: `status`; `save` (the running target as a `--config` file);
//! `subsystem_add {nqn, serial?, model?, hosts?, allow_any_host?}`, `subsystem_remove {nqn}`,
//! `subsystem_ports {nqn, ports}` (listener addresses, or null: every port);
//! `namespace_add {nqn, device?, nsid?, uuid?, nguid?, ana_group?}`, `namespace_remove {nqn,
//! nsid}`, `namespace_rescan {nqn, nsid}` (its drive's namespace changed: resized, formatted);
//! `host_allow {nqn, host}`, `host_deny {nqn, host}`, `allow_any_host {nqn, allow}`;
//! `listener_add {address, transport}` (`tcp`, the default, or `rdma`), `listener_remove
//! {address}`; `ana_set {address, state}`.

use std::io::{BufRead, BufReader, Write};
use std::net::SocketAddr;
use std::os::unix::fs::PermissionsExt;
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::Duration;

use anyhow::Context;
use parking_lot::Mutex;
use serde::Deserialize;
use serde_json::{json, Value};
use usnvme_driver::spec::fabrics::check_nqn;
use usnvme_engine::fabric::address::Transport;
use usnvme_engine::fabric::export::live::{LiveTarget, NamespaceRequest, SubsystemRequest};
use usnvme_engine::fabric::export::registry::{AnaState, Registry};
use usnvme_engine::fabric::export::{
    ExportedNamespace, Listener, SubsystemInfo, ANA_GROUPS, DEFAULT_ANA_GROUP,
};

use super::config::{
    check_ana_group, nguid_text, parse_nguid, parse_uuid, uuid_text, NamespaceConfig, PortConfig,
    SubsystemConfig, TargetConfig,
};

/// Where `usnvme serve --config` listens for `usnvme target`, unless told otherwise.
pub const DEFAULT_SOCKET: &str = "/run/usnvme/target.sock";

/// The longest request line taken (a config is a few KiB).
const MOST_REQUEST_BYTES: u64 = 1 << 20;

/// How the target was started: what a saved config repeats but a running target cannot change.
#[derive(Debug, Clone)]
pub struct StartOptions {
    pub devices: Vec<String>,
    pub stripe: Option<String>,
    pub cores: Option<String>,
}

/// What the control socket (and SIGHUP) change.
pub struct Operator {
    pub live: Arc<LiveTarget>,
    pub registry: Arc<Registry>,
    /// The listeners the acceptor polls (it takes the lock once per turn).
    pub listeners: Arc<Mutex<Vec<(super::PortSocket, Listener)>>>,
    pub start: StartOptions,
    /// The drives under it (a namespace's drive is read again when the operator says it
    /// changed).
    pub drives: super::hotplug::Drives,
    /// The target's status, as `--json-status` writes it.
    pub status: Box<dyn Fn() -> Value + Send + Sync>,
}

/// A JSON-RPC error: its code and a message that says what is wrong and what to do.
#[derive(Debug)]
pub struct RpcError {
    code: i64,
    message: String,
}

const PARSE_ERROR: i64 = -32700;
const INVALID_REQUEST: i64 = -32600;
const METHOD_NOT_FOUND: i64 = -32601;
const INVALID_PARAMS: i64 = -32602;
/// The request was well formed; the target refused it (the message says why).
const REFUSED: i64 = -32000;

fn refused(message: impl Into<String>) -> RpcError {
    RpcError {
        code: REFUSED,
        message: message.into(),
    }
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct Nqn {
    nqn: String,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct SubsystemPorts {
    nqn: String,
    /// The listeners' addresses; null: every port.
    ports: Option<Vec<SocketAddr>>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct NamespaceRemove {
    nqn: String,
    nsid: u32,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct NamespaceAdd {
    nqn: String,
    #[serde(default)]
    device: Option<String>,
    #[serde(default)]
    nsid: Option<u32>,
    #[serde(default)]
    uuid: Option<String>,
    #[serde(default)]
    nguid: Option<String>,
    #[serde(default)]
    ana_group: Option<u32>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct Host {
    nqn: String,
    host: String,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct AnyHost {
    nqn: String,
    allow: bool,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct Address {
    address: SocketAddr,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct NewListener {
    address: SocketAddr,
    #[serde(default)]
    transport: TransportName,
}

/// A listener's transport as the socket names it.
#[derive(Deserialize, Default, Clone, Copy)]
#[serde(rename_all = "lowercase")]
enum TransportName {
    #[default]
    Tcp,
    Rdma,
}

impl From<TransportName> for Transport {
    fn from(t: TransportName) -> Transport {
        match t {
            TransportName::Tcp => Transport::Tcp,
            TransportName::Rdma => Transport::Rdma,
        }
    }
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct AnaSet {
    address: SocketAddr,
    state: String,
    /// None: every group.
    #[serde(default)]
    group: Option<u32>,
}

/// `params` as the method's parameters, or "invalid params" naming what is wrong.
fn params<T: serde::de::DeserializeOwned>(method: &str, params: Value) -> Result<T, RpcError> {
    let params = if params.is_null() { json!({}) } else { params };
    serde_json::from_value(params).map_err(|e| RpcError {
        code: INVALID_PARAMS,
        message: format!("{method}: {e}"),
    })
}

impl Operator {
    /// Carries out one method call.
    pub fn call(&self, method: &str, given: Value) -> Result<Value, RpcError> {
        match method {
            "status" => Ok((self.status)()),
            "save" => serde_json::to_value(self.running_config()).map_err(|e| refused(e.to_string())),
            "subsystem_add" => {
                let sub: SubsystemConfig = params(method, given)?;
                let sub = SubsystemConfig {
                    namespaces: Vec::new(),
                    ..sub
                };
                sub.check().map_err(refused)?;
                let added = self.add_subsystem(&sub, None).map_err(refused)?;
                Ok(json!({"nqn": added.nqn, "serial": added.serial}))
            }
            "subsystem_ports" => {
                let SubsystemPorts { nqn, ports } = params(method, given)?;
                let ids = match &ports {
                    Some(addresses) => Some(self.port_ids(addresses).map_err(refused)?),
                    None => None,
                };
                self.live.set_ports(&nqn, ids).map_err(refused)?;
                Ok(json!({"nqn": nqn, "ports": ports}))
            }
            "subsystem_remove" => {
                let Nqn { nqn } = params(method, given)?;
                self.live.remove_subsystem(&nqn).map_err(refused)?;
                log::info!("subsystem {nqn} removed");
                Ok(json!({"nqn": nqn}))
            }
            "namespace_add" => {
                let p: NamespaceAdd = params(method, given)?;
                let uuid = p.uuid.as_deref().map(parse_uuid).transpose().map_err(refused)?;
                let nguid = p.nguid.as_deref().map(parse_nguid).transpose().map_err(refused)?;
                if let Some(group) = p.ana_group {
                    check_ana_group(group).map_err(refused)?;
                }
                let request = NamespaceRequest {
                    device: p.device,
                    nsid: p.nsid,
                    uuid,
                    nguid,
                    ana_group: p.ana_group,
                };
                let ns = self.live.export(&p.nqn, request).map_err(refused)?;
                log::info!("{}: {}", p.nqn, super::namespace_line(&ns));
                Ok(namespace_json(&ns))
            }
            "namespace_rescan" => {
                let NamespaceRemove { nqn, nsid } = params(method, given)?;
                let sub = self.subsystem(&nqn)?;
                let ns = sub.namespaces.iter().find(|n| n.nsid == nsid);
                let ns = ns.ok_or_else(|| refused(format!("{nqn} has no namespace {nsid}")))?;
                let Some((drive, controller)) = super::hotplug::drive_of(&self.drives, ns.device) else {
                    return Err(refused(format!("{nqn} namespace {nsid} ({}) is not one namespace of one drive: a stripe keeps its shape", ns.name)));
                };
                let found = super::hotplug::rescan(&self.drives, drive, &controller, &self.live).map_err(refused)?;
                let list = |l: &[ExportedNamespace]| l.iter().map(namespace_json).collect::<Vec<_>>();
                Ok(json!({"removed": list(&found.removed), "added": list(&found.added), "left": found.left}))
            }
            "namespace_remove" => {
                let NamespaceRemove { nqn, nsid } = params(method, given)?;
                let ns = self.live.unexport(&nqn, nsid).map_err(refused)?;
                log::info!("{nqn}: namespace {nsid} ({}) removed", ns.name);
                Ok(namespace_json(&ns))
            }
            "host_allow" | "host_deny" => {
                let Host { nqn, host } = params(method, given)?;
                check_nqn(&host).map_err(|e| refused(format!("host {host:?}: {e}")))?;
                let sub = self.subsystem(&nqn)?;
                let mut hosts = sub.allowed_hosts.clone().unwrap_or_default();
                if method == "host_allow" {
                    if sub.allowed_hosts.is_none() {
                        return Err(refused(format!("{nqn} lets any host connect: deny that first (allow_any_host false)")));
                    }
                    if !hosts.contains(&host) {
                        hosts.push(host);
                    }
                } else {
                    if sub.allowed_hosts.is_none() {
                        return Err(refused(format!("{nqn} lets any host connect: allow the hosts it should have (allow_any_host false), then deny")));
                    }
                    let before = hosts.len();
                    hosts.retain(|h| h != &host);
                    if hosts.len() == before {
                        return Err(refused(format!("{host} is not allowed to {nqn} already")));
                    }
                }
                self.live.set_hosts(&nqn, Some(hosts.clone())).map_err(refused)?;
                Ok(json!({"nqn": nqn, "hosts": hosts}))
            }
            "allow_any_host" => {
                let AnyHost { nqn, allow } = params(method, given)?;
                self.subsystem(&nqn)?;
                let hosts = if allow { None } else { Some(Vec::new()) };
                self.live.set_hosts(&nqn, hosts).map_err(refused)?;
                Ok(json!({"nqn": nqn, "allow_any_host": allow}))
            }
            "listener_add" => {
                let NewListener { address, transport } = params(method, given)?;
                let transport = Transport::from(transport);
                let bound = self.add_listener(transport, address).map_err(refused)?;
                Ok(json!({"address": bound.to_string(), "transport": transport.scheme()}))
            }
            "listener_remove" => {
                let Address { address } = params(method, given)?;
                self.remove_listener(address).map_err(refused)?;
                Ok(json!({"address": address.to_string()}))
            }
            "ana_set" => {
                let AnaSet { address, state, group } = params(method, given)?;
                let state: AnaState = state.parse().map_err(refused)?;
                if let Some(group) = group {
                    check_ana_group(group).map_err(refused)?;
                }
                let port = self.port_id(address).map_err(refused)?;
                self.registry.set_ana_state(port, group, state);
                Ok(json!({"address": address.to_string(), "state": state.name(), "group": group}))
            }
            _ => Err(RpcError {
                code: METHOD_NOT_FOUND,
                message: format!("no method {method:?}: status, save, subsystem_add, subsystem_remove, namespace_add, namespace_remove, namespace_rescan, host_allow, host_deny, allow_any_host, subsystem_ports, listener_add, listener_remove, ana_set"),
            }),
        }
    }

    fn subsystem(&self, nqn: &str) -> Result<Arc<SubsystemInfo>, RpcError> {
        let subsystems = self.live.subsystems();
        let found = subsystems.find(nqn).cloned();
        found.ok_or_else(|| {
            refused(format!(
                "the target has no subsystem {nqn}: `usnvme target status` lists them"
            ))
        })
    }

    fn add_subsystem(
        &self,
        sub: &SubsystemConfig,
        ports: Option<Vec<u16>>,
    ) -> Result<Arc<SubsystemInfo>, String> {
        let added = self.live.add_subsystem(SubsystemRequest {
            nqn: sub.nqn.clone(),
            serial: sub.serial.clone(),
            model: sub.model.clone(),
            allowed_hosts: sub.allowed_hosts(),
            ports,
        })?;
        log::info!("subsystem {} added", sub.nqn);
        Ok(added)
    }

    fn add_listener(
        &self,
        transport: Transport,
        address: SocketAddr,
    ) -> Result<SocketAddr, String> {
        let mut listeners = self.listeners.lock();
        if listeners.iter().any(|(_, l)| l.address == address) {
            return Err(format!("the target listens on {address} already"));
        }
        let port_id = (1..).find(|id| listeners.iter().all(|(_, l)| l.port_id != *id));
        let (l, listener) =
            super::listen(transport, address, port_id.unwrap_or(1)).map_err(|e| e.to_string())?;
        let bound = listener.address;
        log::info!(
            "listening on {}:{bound} (port {})",
            transport.scheme(),
            listener.port_id
        );
        listeners.push((l, listener));
        Ok(bound)
    }

    fn remove_listener(&self, address: SocketAddr) -> Result<(), String> {
        let mut listeners = self.listeners.lock();
        let before = listeners.len();
        listeners.retain(|(_, l)| l.address != address);
        if listeners.len() == before {
            return Err(format!("the target does not listen on {address}"));
        }
        // (hosts connected through it stay connected, as nvmet's do)
        log::info!("no longer listening on {address}");
        Ok(())
    }

    /// The IDs of the ports at `addresses`.
    fn port_ids(&self, addresses: &[SocketAddr]) -> Result<Vec<u16>, String> {
        addresses.iter().map(|a| self.port_id(*a)).collect()
    }

    fn port_id(&self, address: SocketAddr) -> Result<u16, String> {
        let listeners = self.listeners.lock();
        let port = listeners.iter().find(|(_, l)| l.address == address);
        port.map(|(_, l)| l.port_id)
            .ok_or_else(|| format!("the target does not listen on {address}"))
    }

    /// The running target as a config: restarted with it, the target gives hosts the same
    /// subsystems and namespaces (NQN, serial, NSID, UUID, NGUID).
    pub fn running_config(&self) -> TargetConfig {
        let listeners = self.listeners.lock();
        let subsystems = self.live.subsystems();
        let ports = listeners.iter().map(|(_, l)| {
            // group 1's state for all, and the groups whose state differs from it
            let first = self.registry.ana_state(l.port_id, 1);
            let others = (2..=ANA_GROUPS).map(|g| (g, self.registry.ana_state(l.port_id, g)));
            PortConfig {
                transport: l.transport.scheme().into(),
                address: l.address,
                ana_state: first.name().into(),
                ana_groups: others
                    .filter(|(_, state)| *state != first)
                    .map(|(g, state)| (g, state.name().to_string()))
                    .collect(),
                // named where not every subsystem is reached through it
                subsystems: subsystems
                    .list
                    .iter()
                    .any(|s| !s.on_port(l.port_id))
                    .then(|| {
                        let on = subsystems.list.iter().filter(|s| s.on_port(l.port_id));
                        on.map(|s| s.nqn.clone()).collect()
                    }),
            }
        });
        let subsystems = subsystems.list.iter().map(|s| SubsystemConfig {
            nqn: s.nqn.clone(),
            serial: Some(s.serial.clone()),
            model: Some(s.model.clone()),
            allow_any_host: s.allowed_hosts.is_none(),
            hosts: s.allowed_hosts.clone().unwrap_or_default(),
            namespaces: s.namespaces.iter().map(namespace_config).collect(),
        });
        TargetConfig {
            devices: self.start.devices.clone(),
            stripe: self.start.stripe.clone(),
            cores: self.start.cores.clone(),
            ports: ports.collect(),
            subsystems: subsystems.collect(),
        }
    }

    /// Makes the running target what `new` describes, change by change (SIGHUP); what changed,
    /// in words. What a running target cannot change (its drives, stripes, cores; a
    /// subsystem's serial or model) is said and left.
    pub fn apply_config(&self, new: &TargetConfig) -> Result<Vec<String>, String> {
        let running = self.running_config();
        let mut changes = Vec::new();
        if (&new.devices, &new.stripe, &new.cores)
            != (&running.devices, &running.stripe, &running.cores)
        {
            changes.push(
                "devices, stripe and cores are as the target started (they change with a restart)"
                    .to_string(),
            );
        }
        // (a port whose transport changed goes, and comes back with its new one)
        let same = |a: &PortConfig, b: &PortConfig| {
            a.address == b.address && a.transport().ok() == b.transport().ok()
        };
        for port in &running.ports {
            if !new.ports.iter().any(|p| same(p, port)) {
                self.remove_listener(port.address)?;
                changes.push(format!("listener {} removed", port.address));
            }
        }
        for port in &new.ports {
            if !running.ports.iter().any(|p| same(p, port)) {
                self.add_listener(port.transport()?, port.address)?;
                changes.push(format!(
                    "listener {}:{} added",
                    port.transport, port.address
                ));
            }
            if set_ana_states(&self.registry, self.port_id(port.address)?, port)? {
                changes.push(format!("{}: ANA states changed", port.address));
            }
        }
        for sub in &running.subsystems {
            if !new.subsystems.iter().any(|s| s.nqn == sub.nqn) {
                self.live.remove_subsystem(&sub.nqn)?;
                changes.push(format!("subsystem {} removed", sub.nqn));
            }
        }
        for sub in &new.subsystems {
            let was = running.subsystems.iter().find(|s| s.nqn == sub.nqn);
            let was = match was {
                Some(was) => was.clone(),
                None => {
                    let ports = new
                        .ports_of(&sub.nqn)
                        .map(|a| self.port_ids(&a))
                        .transpose()?;
                    self.add_subsystem(sub, ports)?;
                    changes.push(format!("subsystem {} added", sub.nqn));
                    SubsystemConfig {
                        namespaces: Vec::new(),
                        ..sub.clone()
                    }
                }
            };
            changes.extend(self.apply_subsystem(&was, sub)?);
            let ports = new
                .ports_of(&sub.nqn)
                .map(|a| self.port_ids(&a))
                .transpose()?;
            let running = self.live.subsystems();
            if running.find(&sub.nqn).is_some_and(|s| s.ports != ports) {
                self.live.set_ports(&sub.nqn, ports)?;
                changes.push(format!("{}: ports changed", sub.nqn));
            }
        }
        Ok(changes)
    }

    /// Subsystem `was` (as running) made `new`: hosts, then namespaces removed, then added.
    fn apply_subsystem(
        &self,
        was: &SubsystemConfig,
        new: &SubsystemConfig,
    ) -> Result<Vec<String>, String> {
        let nqn = &new.nqn;
        let mut changes = Vec::new();
        let differs = |a: &Option<String>, b: &Option<String>| b.is_some() && a != b;
        if differs(&was.serial, &new.serial) || differs(&was.model, &new.model) {
            changes.push(format!("{nqn}: serial and model are as the subsystem was made (remove and add it to change them)"));
        }
        if was.allowed_hosts() != new.allowed_hosts() {
            self.live.set_hosts(nqn, new.allowed_hosts())?;
            changes.push(format!(
                "{nqn}: hosts now {}",
                super::hosts_text(new.allowed_hosts().as_deref())
            ));
        }
        // a namespace stays when the new config names its device with the same identity
        let stays = |ns: &NamespaceConfig| {
            new.namespaces.iter().any(|n| {
                n.device == ns.device
                    && n.nsid.is_none_or(|id| Some(id) == ns.nsid)
                    && same_id(&n.uuid, &ns.uuid, parse_uuid)
                    && same_id(&n.nguid, &ns.nguid, parse_nguid)
                    && n.ana_group.unwrap_or(1) == ns.ana_group.unwrap_or(1)
            })
        };
        let mut kept = Vec::new();
        for ns in &was.namespaces {
            if stays(ns) {
                kept.push(ns.device.clone());
                continue;
            }
            let nsid = ns.nsid.unwrap_or_default();
            self.live.unexport(nqn, nsid)?;
            changes.push(format!("{nqn}: namespace {nsid} ({}) removed", ns.device));
        }
        for ns in new.namespaces.iter().filter(|n| !kept.contains(&n.device)) {
            let added = self.live.export(nqn, ns.request()?)?;
            changes.push(format!("{nqn}: {}", super::namespace_line(&added)));
        }
        Ok(changes)
    }
}

/// Whether identity `given` (None: not given, any will do) is `running`'s.
fn same_id(
    given: &Option<String>,
    running: &Option<String>,
    parse: fn(&str) -> Result<[u8; 16], String>,
) -> bool {
    match (given, running) {
        (None, _) => true,
        (Some(g), Some(r)) => parse(g).ok() == parse(r).ok(),
        (Some(_), None) => false,
    }
}

/// Puts each ANA group at port `port_id` in the state `port` gives it (each group on its own:
/// one that keeps its state sees no change); whether any changed.
pub fn set_ana_states(
    registry: &Registry,
    port_id: u16,
    port: &PortConfig,
) -> Result<bool, String> {
    let states = port.ana_states()?;
    let mut changed = false;
    for group in 1..=ANA_GROUPS {
        let given = states
            .iter()
            .rev()
            .find(|(g, _)| g.is_none_or(|g| g == group));
        if let Some((_, state)) = given {
            changed |= registry.set_ana_state(port_id, Some(group), *state);
        }
    }
    Ok(changed)
}

fn namespace_config(ns: &ExportedNamespace) -> NamespaceConfig {
    NamespaceConfig {
        ana_group: (ns.ana_group != DEFAULT_ANA_GROUP).then_some(ns.ana_group),
        nsid: Some(ns.nsid),
        device: ns.name.clone(),
        uuid: Some(uuid_text(&ns.uuid)),
        nguid: Some(nguid_text(&ns.nguid)),
    }
}

fn namespace_json(ns: &ExportedNamespace) -> Value {
    json!({
        "nsid": ns.nsid, "device": ns.name, "blocks": ns.blocks, "block_size": ns.block_size,
        "uuid": uuid_text(&ns.uuid), "nguid": nguid_text(&ns.nguid), "ana_group": ns.ana_group,
    })
}

/// One line of requests' answer: the response to a JSON-RPC request (None for a
/// notification, which has no ID).
pub fn answer(operator: &Operator, line: &str) -> Option<Value> {
    let request: Value = match serde_json::from_str(line) {
        Ok(v) => v,
        Err(e) => {
            return Some(error_response(
                Value::Null,
                PARSE_ERROR,
                format!("not JSON: {e}"),
            ))
        }
    };
    let id = request.get("id").cloned();
    let reply_id = id.clone().unwrap_or(Value::Null);
    if request.get("jsonrpc").and_then(Value::as_str) != Some("2.0") {
        return Some(error_response(reply_id, INVALID_REQUEST, "not a JSON-RPC 2.0 request: give {\"jsonrpc\": \"2.0\", \"method\": …, \"params\": {…}, \"id\": 1}".into()));
    }
    let Some(method) = request.get("method").and_then(Value::as_str) else {
        return Some(error_response(
            reply_id,
            INVALID_REQUEST,
            "no method: give \"method\": \"status\", say".into(),
        ));
    };
    let given = request.get("params").cloned().unwrap_or(Value::Null);
    if !(given.is_null() || given.is_object()) {
        return Some(error_response(
            reply_id,
            INVALID_PARAMS,
            format!("{method}: params must be an object of named parameters"),
        ));
    }
    let result = operator.call(method, given);
    let id = id?;
    Some(match result {
        Ok(result) => json!({"jsonrpc": "2.0", "result": result, "id": id}),
        Err(e) => {
            log::warn!("control: {method}: {}", e.message);
            error_response(id, e.code, e.message)
        }
    })
}

fn error_response(id: Value, code: i64, message: String) -> Value {
    json!({"jsonrpc": "2.0", "error": {"code": code, "message": message}, "id": id})
}

/// The control socket's thread: stopped, and its socket file removed, when dropped.
pub struct ControlSocket {
    path: PathBuf,
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<()>>,
}

impl Drop for ControlSocket {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Release);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
        let _ = std::fs::remove_file(&self.path);
    }
}

/// Listens on `path` (owner only; a stale socket is replaced, a live one refused) and answers
/// each client on a thread of its own until the target stops.
pub fn serve(
    path: &Path,
    operator: Arc<Operator>,
    target_stop: Arc<AtomicBool>,
) -> anyhow::Result<ControlSocket> {
    let listener = bind(path)?;
    listener.set_nonblocking(true)?;
    let stop = Arc::new(AtomicBool::new(false));
    let thread = {
        let stop = stop.clone();
        std::thread::Builder::new()
            .name("usnvme-control".into())
            .spawn(move || {
                while !stop.load(Ordering::Acquire) && !target_stop.load(Ordering::Acquire) {
                    match listener.accept() {
                        Ok((client, _)) => {
                            let operator = operator.clone();
                            let _ = std::thread::Builder::new()
                                .name("usnvme-control-client".into())
                                .spawn(move || answer_client(client, &operator));
                        }
                        Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {
                            wait_readable(&listener, Duration::from_millis(200));
                        }
                        Err(e) => {
                            log::warn!("control socket: {e}");
                            std::thread::sleep(Duration::from_millis(100));
                        }
                    }
                }
            })?
    };
    Ok(ControlSocket {
        path: path.to_path_buf(),
        stop,
        thread: Some(thread),
    })
}

fn wait_readable(listener: &UnixListener, at_most: Duration) {
    use nix::poll::{poll, PollFd, PollFlags, PollTimeout};
    use std::os::fd::AsFd;
    let mut fds = [PollFd::new(listener.as_fd(), PollFlags::POLLIN)];
    let _ = poll(&mut fds, PollTimeout::from(at_most.as_millis() as u16));
}

/// A Unix socket at `path` only this user can connect to.
fn bind(path: &Path) -> anyhow::Result<UnixListener> {
    if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
        if !dir.exists() {
            std::fs::create_dir_all(dir)
                .with_context(|| format!("--control {}: cannot make its folder", path.display()))?;
            std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o700))?;
        }
    }
    if path.exists() {
        if UnixStream::connect(path).is_ok() {
            anyhow::bail!(crate::perf::usage(format!(
                "--control {}: another target answers there; stop it, or give this one another --control path",
                path.display()
            )));
        }
        // left by a target that ended without removing it
        std::fs::remove_file(path).with_context(|| {
            format!(
                "--control {}: cannot replace the stale socket",
                path.display()
            )
        })?;
    }
    let listener = UnixListener::bind(path)
        .with_context(|| format!("--control {}: cannot listen there", path.display()))?;
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o600))?;
    Ok(listener)
}

/// Answers one client's requests, a line each, until it closes.
fn answer_client(client: UnixStream, operator: &Operator) {
    let Ok(mut writer) = client.try_clone() else {
        return;
    };
    let mut reader = BufReader::new(client);
    loop {
        let mut line = String::new();
        match std::io::Read::take(&mut reader, MOST_REQUEST_BYTES).read_line(&mut line) {
            Ok(0) | Err(_) => return,
            Ok(_) => {}
        }
        if line.trim().is_empty() {
            continue;
        }
        let Some(response) = answer(operator, line.trim()) else {
            continue;
        };
        if writeln!(writer, "{response}").is_err() {
            return;
        }
    }
}

/// Sends `method` with `params` to the target at `socket`; its result, or the target's error.
pub fn request(socket: &Path, method: &str, params: Value) -> anyhow::Result<Value> {
    let stream = UnixStream::connect(socket).map_err(|e| {
        anyhow::anyhow!(
            "cannot reach a target at {} ({e}): is `usnvme serve --config …` (or --control {}) running, and are you root?",
            socket.display(),
            socket.display()
        )
    })?;
    let mut writer = stream.try_clone()?;
    let request = json!({"jsonrpc": "2.0", "method": method, "params": params, "id": 1});
    writeln!(writer, "{request}")?;
    let mut line = String::new();
    BufReader::new(stream).read_line(&mut line)?;
    let response: Value = serde_json::from_str(&line)
        .with_context(|| format!("the target's answer is not JSON: {line:?}"))?;
    if let Some(error) = response.get("error") {
        let message = error
            .get("message")
            .and_then(Value::as_str)
            .unwrap_or("(no message)");
        anyhow::bail!("{message}");
    }
    Ok(response.get("result").cloned().unwrap_or(Value::Null))
}
