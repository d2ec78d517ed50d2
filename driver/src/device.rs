//! Drive addresses as users write them — a PCI function bound to vfio-pci (`0000:01:00.0`,
//! `01:00.0`) or simulated drives (`sim:0-23,bs=4096`) — and opening them. Everything above the
//! driver takes a `DeviceSpec` wherever it takes a drive, so a `sim` drive and a real one are
//! used the same way.

use std::fmt;
use std::path::PathBuf;
use std::str::FromStr;
use std::sync::Arc;

use parking_lot::Mutex;

use crate::controller::{Controller, ControllerOptions};
use crate::error::Error;
use crate::pci::{AddressParseError, PciAddress};
use crate::sim::{SimController, SimSpec, SimSpecError};
use crate::vfio::Vfio;

/// One or more drives.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum DeviceSpec {
    Pci(PciAddress),
    /// Boxed: the sim's configuration is large, and the other variants (and the enums that
    /// hold a spec) small.
    Sim(Box<SimSpec>),
}

/// Why a drive address does not parse.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum DeviceSpecError {
    #[error("{0} (or a simulated drive: sim:N, sim:N-M with options)")]
    Pci(AddressParseError),
    #[error(transparent)]
    Sim(SimSpecError),
}

impl FromStr for DeviceSpec {
    type Err = DeviceSpecError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        if SimSpec::is_sim(s) {
            s.parse()
                .map(|sim| DeviceSpec::Sim(Box::new(sim)))
                .map_err(DeviceSpecError::Sim)
        } else {
            s.parse().map(DeviceSpec::Pci).map_err(DeviceSpecError::Pci)
        }
    }
}

impl fmt::Display for DeviceSpec {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            DeviceSpec::Pci(addr) => addr.fmt(f),
            DeviceSpec::Sim(spec) => spec.fmt(f),
        }
    }
}

impl DeviceSpec {
    /// One spec per drive: `sim:0-3` gives `sim:0` … `sim:3` with the same options.
    pub fn drives(&self) -> Vec<DeviceSpec> {
        match self {
            DeviceSpec::Pci(_) => vec![self.clone()],
            DeviceSpec::Sim(spec) => spec
                .drives
                .iter()
                .map(|&n| {
                    DeviceSpec::Sim(Box::new(SimSpec {
                        drives: vec![n],
                        config: spec.config.clone(),
                    }))
                })
                .collect(),
        }
    }
}

/// Opens drives: PCI ones through the process's one VFIO container (opened on first need, so
/// that `sim:` drives need neither root nor VFIO), simulated ones in the process's sim space.
#[derive(Debug)]
pub struct Opener {
    sysfs: PathBuf,
    vfio: Mutex<Option<Arc<Vfio>>>,
    /// The simulated controllers opened, by drive name (`sim:3`), for fault injection.
    sims: Mutex<Vec<(String, Arc<SimController>)>>,
}

impl Opener {
    /// `sysfs`: normally `/sys`.
    pub fn new(sysfs: impl Into<PathBuf>) -> Opener {
        Opener {
            sysfs: sysfs.into(),
            vfio: Mutex::new(None),
            sims: Mutex::new(Vec::new()),
        }
    }

    /// The software controller behind simulated drive `name` (`sim:3`) that this opener opened,
    /// to inject faults into (a surprise removal, ...) while it runs.
    pub fn sim_controller(&self, name: &str) -> Option<Arc<SimController>> {
        let sims = self.sims.lock();
        sims.iter().find(|(n, _)| n == name).map(|(_, s)| s.clone())
    }

    /// Brings up every drive of `spec`.
    pub fn open(
        &self,
        spec: &DeviceSpec,
        options: ControllerOptions,
    ) -> Result<Vec<Controller>, Error> {
        match spec {
            DeviceSpec::Pci(addr) => Ok(vec![Controller::open(&self.vfio()?, *addr, options)?]),
            DeviceSpec::Sim(sim) => {
                let opened = crate::sim::open_with_handles(sim, options)?;
                let mut sims = self.sims.lock();
                Ok(opened
                    .into_iter()
                    .map(|(ctrl, sim)| {
                        sims.push((ctrl.name().to_string(), sim));
                        ctrl
                    })
                    .collect())
            }
        }
    }

    fn vfio(&self) -> Result<Arc<Vfio>, Error> {
        let mut vfio = self.vfio.lock();
        if let Some(v) = &*vfio {
            return Ok(v.clone());
        }
        let v = Vfio::new(self.sysfs.clone())?;
        *vfio = Some(v.clone());
        Ok(v)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_both_kinds_and_splits_sim_ranges() {
        let pci: DeviceSpec = "01:00.0".parse().unwrap();
        assert_eq!(pci.to_string(), "0000:01:00.0");
        assert_eq!(pci.drives(), vec![pci.clone()]);
        let sim: DeviceSpec = "sim:2-4,bs=4096".parse().unwrap();
        let drives = sim.drives();
        assert_eq!(drives.len(), 3);
        assert_eq!(drives[1].to_string(), "sim:3");
        let DeviceSpec::Sim(one) = &drives[2] else {
            panic!("sim")
        };
        assert_eq!(one.config.namespaces[0].block_size, 4096);
        let e = "01:00".parse::<DeviceSpec>().unwrap_err();
        assert!(e.to_string().contains("sim:N"), "{e}");
        assert!(matches!(
            "sim:x".parse::<DeviceSpec>(),
            Err(DeviceSpecError::Sim(_))
        ));
    }

    #[test]
    fn opens_simulated_drives_without_vfio() {
        let opener = Opener::new("/nonexistent");
        let ctrls = opener
            .open(&"sim:0-1".parse().unwrap(), ControllerOptions::default())
            .unwrap();
        assert_eq!(ctrls.len(), 2);
        assert_eq!(ctrls[1].name(), "sim:1");
        assert_eq!(ctrls[1].identify().serial(), "sim1");
        let sim = opener.sim_controller("sim:1").expect("a handle");
        assert_eq!(sim.config().serial, "sim1");
        assert!(opener.sim_controller("sim:2").is_none());
    }
}
