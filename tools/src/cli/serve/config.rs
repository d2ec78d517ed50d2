//! `usnvme serve --config FILE`: the target as a JSON document — the drives it opens, its
//! ports, and its NVM subsystems with their hosts and namespaces — and what `usnvme target
//! save` writes back (the running target, so that a restart gives hosts the same identities).
//! The flags (`-r`, `--nqn`, `--allow-host`, `--listen`, …) are the short form of a config
//! with one subsystem that exports every device.

use std::net::SocketAddr;
use std::path::Path;
use usnvme_engine::fabric::address::Transport;

use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use usnvme_driver::spec::fabrics::check_nqn;

use usnvme_engine::fabric::export::live::NamespaceRequest;
use usnvme_engine::fabric::export::registry::AnaState;
use usnvme_engine::fabric::export::ANA_GROUPS;

/// The whole target.
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TargetConfig {
    /// Drives to open, as `-r` takes them (a BDF, `sim:N[-M][,options]`); none: every NVMe
    /// controller bound to vfio-pci.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub devices: Vec<String>,
    /// Stripes of the drives' namespaces, as `--stripe` takes them (`N[:CHUNK]`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub stripe: Option<String>,
    /// Reactor cores, as `-c` takes them.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cores: Option<String>,
    /// Where hosts reach the target (every subsystem on every port).
    pub ports: Vec<PortConfig>,
    #[serde(default)]
    pub subsystems: Vec<SubsystemConfig>,
}

/// A listener.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PortConfig {
    /// `tcp` or `rdma`.
    #[serde(default = "tcp")]
    pub transport: String,
    /// `ADDR:PORT`.
    pub address: SocketAddr,
    /// Its Asymmetric Namespace Access state for every ANA group: optimized (the default),
    /// non-optimized or inaccessible.
    #[serde(default = "optimized")]
    pub ana_state: String,
    /// Groups in another state than `ana_state` at this port, by group ID.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub ana_groups: BTreeMap<u32, String>,
    /// The subsystems hosts reach through it, by NQN; absent: every subsystem.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub subsystems: Option<Vec<String>>,
}

impl PortConfig {
    /// Its transport.
    pub fn transport(&self) -> Result<Transport, String> {
        match self.transport.to_ascii_lowercase().as_str() {
            "tcp" => Ok(Transport::Tcp),
            "rdma" => Ok(Transport::Rdma),
            other => Err(format!("transport {other:?}: tcp or rdma")),
        }
    }

    /// The states it sets: every group's (None), then each group given apart.
    pub fn ana_states(&self) -> Result<Vec<(Option<u32>, AnaState)>, String> {
        let mut states = vec![(None, self.ana_state.parse()?)];
        for (&group, state) in &self.ana_groups {
            check_ana_group(group)?;
            states.push((Some(group), state.parse()?));
        }
        Ok(states)
    }
}

/// A group ID as the target has them: 1 to 32.
pub fn check_ana_group(group: u32) -> Result<(), String> {
    if group == 0 || group > ANA_GROUPS {
        return Err(format!("ANA group {group}: give 1 to {ANA_GROUPS}"));
    }
    Ok(())
}

fn tcp() -> String {
    "tcp".into()
}

fn optimized() -> String {
    AnaState::Optimized.name().into()
}

/// An NVM subsystem.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SubsystemConfig {
    pub nqn: String,
    /// Serial number (20 ASCII characters at most); default: derived from the NQN.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub serial: Option<String>,
    /// Model (40 ASCII characters at most); default: usnvme.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub model: Option<String>,
    /// Any host may connect (else only those in `hosts`).
    #[serde(default)]
    pub allow_any_host: bool,
    #[serde(default)]
    pub hosts: Vec<String>,
    #[serde(default)]
    pub namespaces: Vec<NamespaceConfig>,
}

/// A namespace of a subsystem.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct NamespaceConfig {
    /// Its ID (1 to 1024); default: the lowest free.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub nsid: Option<u32>,
    /// The target's device it is: a drive's namespace as `usnvme serve` names it
    /// (`0000:01:00.0`, `0000:01:00.0/ns2`, `sim:3`) or a stripe (`stripe0`).
    pub device: String,
    /// Its UUID (`8-4-4-4-12` hex); default: derived from its NGUID.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub uuid: Option<String>,
    /// Its NGUID (32 hex digits); default: derived from the subsystem and device names.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub nguid: Option<String>,
    /// Its ANA group (1 to 32); default: 1.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ana_group: Option<u32>,
}

impl TargetConfig {
    /// Reads and checks `path`; the error names the file and what is wrong where.
    pub fn read(path: &Path) -> Result<TargetConfig, String> {
        let text = std::fs::read_to_string(path)
            .map_err(|e| format!("{}: cannot read it: {e}", path.display()))?;
        let config: TargetConfig = serde_json::from_str(&text)
            .map_err(|e| format!("{}: not a target configuration: {e}", path.display()))?;
        config
            .check()
            .map_err(|e| format!("{}: {e}", path.display()))?;
        Ok(config)
    }

    /// What is wrong with it, if anything: NQNs, IDs and names each well formed and unique.
    pub fn check(&self) -> Result<(), String> {
        if self.ports.is_empty() {
            return Err(
                "no ports: give at least one, e.g. {\"address\": \"127.0.0.1:4420\"}".into(),
            );
        }
        for (i, port) in self.ports.iter().enumerate() {
            port.transport()
                .map_err(|e| format!("port {}: {e}", port.address))?;
            port.ana_states()
                .map_err(|e| format!("port {}: {e}", port.address))?;
            if self.ports[..i].iter().any(|p| p.address == port.address) {
                return Err(format!("port {} is given twice", port.address));
            }
        }
        for port in &self.ports {
            let named = port.subsystems.iter().flatten();
            if let Some(nqn) = named
                .into_iter()
                .find(|n| self.subsystems.iter().all(|s| &s.nqn != *n))
            {
                return Err(format!(
                    "port {}: subsystem {nqn} is not in the config",
                    port.address
                ));
            }
        }
        let mut devices = Vec::new();
        for (i, sub) in self.subsystems.iter().enumerate() {
            if self.subsystems[..i].iter().any(|s| s.nqn == sub.nqn) {
                return Err(format!("subsystem {} is given twice", sub.nqn));
            }
            sub.check()?;
            for ns in &sub.namespaces {
                if devices.contains(&&ns.device) {
                    return Err(format!(
                        "device {} is in two namespaces (one namespace per device)",
                        ns.device
                    ));
                }
                devices.push(&ns.device);
            }
        }
        Ok(())
    }
}

impl TargetConfig {
    /// The addresses of the ports subsystem `nqn` is reached through; None: every port.
    pub fn ports_of(&self, nqn: &str) -> Option<Vec<SocketAddr>> {
        let on = |p: &&PortConfig| {
            p.subsystems
                .as_ref()
                .is_none_or(|s| s.iter().any(|n| n == nqn))
        };
        let ports: Vec<SocketAddr> = self.ports.iter().filter(on).map(|p| p.address).collect();
        (ports.len() < self.ports.len()).then_some(ports)
    }
}

impl SubsystemConfig {
    pub fn check(&self) -> Result<(), String> {
        let nqn = &self.nqn;
        check_subsystem_nqn(nqn)?;
        let ascii = |what: &str, value: &Option<String>, most: usize| match value {
            Some(v)
                if v.is_empty()
                    || v.len() > most
                    || !v.bytes().all(|b| (0x20..0x7f).contains(&b)) =>
            {
                Err(format!(
                    "subsystem {nqn}: {what} {v:?}: give 1 to {most} printable ASCII characters"
                ))
            }
            _ => Ok(()),
        };
        ascii("serial", &self.serial, 20)?;
        ascii("model", &self.model, 40)?;
        for host in &self.hosts {
            check_nqn(host).map_err(|e| format!("subsystem {nqn}: host {host:?}: {e}"))?;
        }
        if self.allow_any_host && !self.hosts.is_empty() {
            return Err(format!(
                "subsystem {nqn}: give hosts or allow_any_host, not both"
            ));
        }
        for (i, ns) in self.namespaces.iter().enumerate() {
            ns.request()
                .map_err(|e| format!("subsystem {nqn}, device {}: {e}", ns.device))?;
            if let Some(nsid) = ns.nsid {
                if self.namespaces[..i].iter().any(|o| o.nsid == Some(nsid)) {
                    return Err(format!("subsystem {nqn}: namespace {nsid} is given twice"));
                }
            }
        }
        Ok(())
    }

    /// The hosts that may connect: None for any.
    pub fn allowed_hosts(&self) -> Option<Vec<String>> {
        (!self.allow_any_host).then(|| self.hosts.clone())
    }
}

/// A subsystem's NQN as nvmet takes it: 1 to 223 bytes, no blanks or control characters
/// (`nqn.…` is the form hosts expect; blktests names its subsystems `blktests-subsystem-N`).
pub fn check_subsystem_nqn(nqn: &str) -> Result<(), String> {
    if nqn.starts_with("nqn.") {
        return check_nqn(nqn).map_err(|e| format!("subsystem {e}"));
    }
    let fits = !nqn.is_empty() && nqn.len() <= usnvme_driver::spec::fabrics::MAX_NQN_BYTES;
    if !fits || nqn.chars().any(|c| c.is_whitespace() || c.is_control()) {
        return Err(format!("subsystem NQN {nqn:?}: give 1 to 223 bytes without blanks, e.g. nqn.2024-01.com.example:storage1"));
    }
    Ok(())
}

impl NamespaceConfig {
    /// The namespace as the target is asked for it: NSID (checked: 1 to 1024), UUID and NGUID
    /// (parsed), ANA group (checked).
    pub fn request(&self) -> Result<NamespaceRequest, String> {
        let most = usnvme_engine::fabric::export::MAX_NAMESPACES;
        if let Some(nsid) = self.nsid.filter(|&n| n == 0 || n > most) {
            return Err(format!("namespace ID {nsid}: give 1 to {most}"));
        }
        if let Some(group) = self.ana_group {
            check_ana_group(group)?;
        }
        Ok(NamespaceRequest {
            device: Some(self.device.clone()),
            nsid: self.nsid,
            uuid: self.uuid.as_deref().map(parse_uuid).transpose()?,
            nguid: self.nguid.as_deref().map(parse_nguid).transpose()?,
            ana_group: self.ana_group,
        })
    }
}

pub fn parse_uuid(s: &str) -> Result<[u8; 16], String> {
    uuid::Uuid::try_parse(s)
        .map(|u| u.into_bytes())
        .map_err(|_| format!("UUID {s:?}: expected 8-4-4-4-12 hex digits, e.g. 91fdba0d-f87b-4c25-b80f-db7be1418b9e"))
}

pub fn parse_nguid(s: &str) -> Result<[u8; 16], String> {
    let bad =
        || format!("NGUID {s:?}: expected 32 hex digits, e.g. 0123456789abcdef0123456789abcdef");
    let digits: String = s.chars().filter(|&c| c != '-').collect();
    if digits.len() != 32 {
        return Err(bad());
    }
    let mut g = [0u8; 16];
    for (i, byte) in g.iter_mut().enumerate() {
        *byte = u8::from_str_radix(&digits[2 * i..2 * i + 2], 16).map_err(|_| bad())?;
    }
    Ok(g)
}

pub fn uuid_text(bytes: &[u8; 16]) -> String {
    uuid::Uuid::from_bytes(*bytes).hyphenated().to_string()
}

pub fn nguid_text(bytes: &[u8; 16]) -> String {
    uuid::Uuid::from_bytes(*bytes).simple().to_string()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn example() -> TargetConfig {
        serde_json::from_str(
            r#"{
                "devices": ["sim:0-1,backend=ram"],
                "ports": [{"address": "127.0.0.1:4420", "ana_groups": {"2": "inaccessible"}}],
                "subsystems": [
                    {"nqn": "nqn.2024-01.io.example:a", "hosts": ["nqn.2024-01.io.example:host"],
                     "namespaces": [{"nsid": 3, "device": "sim:0", "ana_group": 2,
                                     "uuid": "91fdba0d-f87b-4c25-b80f-db7be1418b9e"}]},
                    {"nqn": "nqn.2024-01.io.example:b", "allow_any_host": true,
                     "namespaces": [{"device": "sim:1", "nguid": "0123456789abcdef0123456789abcdef"}]}
                ]
            }"#,
        )
        .expect("a config")
    }

    #[test]
    fn a_config_reads_with_its_defaults_and_writes_back_the_same() {
        let config = example();
        assert_eq!(config.check(), Ok(()));
        assert_eq!(config.ports[0].transport, "tcp");
        assert_eq!(config.ports[0].ana_state, "optimized");
        let states = config.ports[0].ana_states().expect("states");
        assert_eq!(
            states,
            [
                (None, AnaState::Optimized),
                (Some(2), AnaState::Inaccessible)
            ]
        );
        let a = &config.subsystems[0];
        assert_eq!(
            a.allowed_hosts(),
            Some(vec!["nqn.2024-01.io.example:host".into()])
        );
        assert_eq!(config.subsystems[1].allowed_hosts(), None);
        let request = a.namespaces[0].request().expect("identity");
        assert_eq!(
            (request.nsid, request.nguid, request.ana_group),
            (Some(3), None, Some(2))
        );
        assert_eq!(
            uuid_text(&request.uuid.expect("a UUID")),
            "91fdba0d-f87b-4c25-b80f-db7be1418b9e"
        );
        let nguid = config.subsystems[1].namespaces[0]
            .request()
            .expect("identity")
            .nguid;
        assert_eq!(
            nguid_text(&nguid.expect("an NGUID")),
            "0123456789abcdef0123456789abcdef"
        );
        let text = serde_json::to_string_pretty(&config).expect("json");
        let again: TargetConfig = serde_json::from_str(&text).expect("read back");
        assert_eq!(again, config);
    }

    #[test]
    fn each_mistake_is_named() {
        type Break = fn(&mut TargetConfig);
        let mistakes: [(&str, Break); 12] = [
            ("no ports", |c| c.ports.clear()),
            ("subsystem nqn.x:none is not in the config", |c| {
                c.ports[0].subsystems = Some(vec!["nqn.x:none".into()])
            }),
            ("ANA group 33: give 1 to 32", |c| {
                c.subsystems[0].namespaces[0].ana_group = Some(33)
            }),
            ("ANA group 0: give 1 to 32", |c| {
                c.ports[0].ana_groups.insert(0, "optimized".into());
            }),
            ("tcp or rdma", |c| c.ports[0].transport = "fc".into()),
            ("not an ANA state", |c| c.ports[0].ana_state = "fast".into()),
            ("given twice", |c| {
                c.subsystems[1].nqn = c.subsystems[0].nqn.clone()
            }),
            ("in two namespaces", |c| {
                c.subsystems[1].namespaces[0].device = "sim:0".into()
            }),
            ("give 1 to 1024", |c| {
                c.subsystems[0].namespaces[0].nsid = Some(0)
            }),
            ("8-4-4-4-12", |c| {
                c.subsystems[0].namespaces[0].uuid = Some("x".into())
            }),
            ("32 hex digits", |c| {
                c.subsystems[1].namespaces[0].nguid = Some("12".into())
            }),
            ("not both", |c| c.subsystems[0].allow_any_host = true),
        ];
        for (expected, break_it) in mistakes {
            let mut config = example();
            break_it(&mut config);
            let e = config.check().expect_err(expected);
            assert!(e.contains(expected), "{expected}: {e}");
        }
        let unknown = serde_json::from_str::<TargetConfig>(r#"{"ports": [], "subsystem": []}"#);
        let e = unknown.expect_err("an unknown field").to_string();
        assert!(e.contains("unknown field `subsystem`"), "{e}");
    }
}
