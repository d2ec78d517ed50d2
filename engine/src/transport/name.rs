//! The one grammar of device names: every command and the fio engine take a device as
//! [`DeviceName`] — a local drive ([`DeviceSpec`]: a PCI function bound to vfio-pci, `sim:`
//! drives) or a remote NVMe/TCP subsystem ([`TcpAddress`]: `tcp://ADDR[:PORT]/NQN`, or an SPDK
//! transport ID such as `trtype:TCP traddr:ADDR trsvcid:PORT subnqn:NQN`).

use std::fmt;
use std::str::FromStr;

use usnvme_driver::DeviceSpec;

use crate::fabric::address::TcpAddress;

/// A device as a person names it: local, or a remote subsystem.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum DeviceName {
    Local(DeviceSpec),
    Remote(TcpAddress),
}

impl FromStr for DeviceName {
    type Err = String;

    /// A remote subsystem must be named by its NQN (the error says how to find it).
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        if !TcpAddress::looks_remote(s) {
            return s
                .parse()
                .map(DeviceName::Local)
                .map_err(|e: usnvme_driver::device::DeviceSpecError| e.to_string());
        }
        let addr: TcpAddress = s.parse().map_err(|e| format!("{e}"))?;
        if addr.subnqn.is_none() {
            return Err(format!(
                "{addr} names no subsystem: add /NQN, or subnqn:NQN in a transport ID \
                 (`usnvme discover {addr}` lists the subsystems there; example: \
                 {addr}/nqn.2024-01.io.usnvme:host1)"
            ));
        }
        Ok(DeviceName::Remote(addr))
    }
}

impl fmt::Display for DeviceName {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            DeviceName::Local(spec) => spec.fmt(f),
            DeviceName::Remote(addr) => addr.fmt(f),
        }
    }
}

impl DeviceName {
    /// One name per drive: `sim:0-3` gives `sim:0` … `sim:3`; a remote subsystem is one.
    pub fn drives(&self) -> Vec<DeviceName> {
        match self {
            DeviceName::Local(spec) => spec.drives().into_iter().map(DeviceName::Local).collect(),
            DeviceName::Remote(_) => vec![self.clone()],
        }
    }

    pub fn local(&self) -> Option<&DeviceSpec> {
        match self {
            DeviceName::Local(spec) => Some(spec),
            DeviceName::Remote(_) => None,
        }
    }

    pub fn remote(&self) -> Option<&TcpAddress> {
        match self {
            DeviceName::Remote(addr) => Some(addr),
            DeviceName::Local(_) => None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn local_or_remote() {
        assert!(matches!("sim:0".parse(), Ok(DeviceName::Local(_))));
        assert!(matches!("01:00.0".parse(), Ok(DeviceName::Local(_))));
        let remote: TcpAddress = "tcp://127.0.0.1:4420/nqn.2024-01.io.usnvme:t"
            .parse()
            .expect("an address");
        assert_eq!(
            "trtype:tcp traddr:127.0.0.1 subnqn:nqn.2024-01.io.usnvme:t".parse(),
            Ok(DeviceName::Remote(remote))
        );
        let err = "tcp://1.2.3.4".parse::<DeviceName>().expect_err("no NQN");
        assert!(err.contains("usnvme discover tcp://1.2.3.4:4420"), "{err}");
        let err = "tcp://1.2.3.4:x"
            .parse::<DeviceName>()
            .expect_err("bad port");
        assert!(err.contains("example"), "{err}");
        let sims: Vec<String> = "sim:0-1"
            .parse::<DeviceName>()
            .expect("sims")
            .drives()
            .iter()
            .map(ToString::to_string)
            .collect();
        assert_eq!(sims.len(), 2);
    }
}
