//! One controller API over both transports, for what every command asks of a controller:
//! what it says about itself (Identify, its namespaces, CAP and VS) and its health (SMART),
//! whether its admin commands go over PCIe (the driver's admin queue, MMIO registers) or over
//! NVMe/TCP (the admin queue of a polled session, Fabrics properties). The namespaces are read
//! the same way on both ([`usnvme_driver::namespaces::scan`]).

use usnvme_driver::spec::{Cap, FirmwareSlotLog, IdentifyController, SmartLog, Vs};
use usnvme_driver::vfio::PcieLink;
use usnvme_driver::Namespace;

use super::tcp::{RemoteController, RemoteError};
use crate::fabric::address::{TcpAddress, Transport};
use crate::fabric::pdu::Digests;

/// A controller, borrowed from whoever opened it (the engine's attach, or a remote connect).
#[derive(Debug)]
pub enum Controller<'a> {
    /// A local controller on vfio-pci (or simulated).
    Pcie(&'a usnvme_driver::Controller),
    /// A remote controller, reached at `address`.
    Tcp {
        ctrl: &'a mut RemoteController,
        address: &'a TcpAddress,
    },
}

/// Why a controller did not answer, by transport: each error names what failed and what to do.
#[derive(Debug, thiserror::Error)]
pub enum ControllerError {
    #[error(transparent)]
    Pcie(#[from] usnvme_driver::Error),
    #[error(transparent)]
    Tcp(#[from] RemoteError),
}

/// How a controller is reached, and what its transport gives it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Reach {
    Pcie {
        link: Option<PcieLink>,
        /// I/O queue pairs the controller granted.
        io_queue_pairs: u16,
        /// The largest transfer the driver issues in one command.
        max_transfer: u64,
        shadow_doorbells: bool,
    },
    /// A fabric: NVMe/TCP or NVMe/RDMA.
    Tcp {
        transport: Transport,
        /// `IP:PORT` of the target.
        target: String,
        digests: Digests,
        /// The most data the target takes in one H2CData PDU.
        maxh2cdata: u32,
    },
}

impl Controller<'_> {
    /// Its name in reports: the PCI address (or `sim:N`), or the `tcp://` address.
    pub fn name(&self) -> String {
        match self {
            Controller::Pcie(c) => c.name().to_owned(),
            Controller::Tcp { address, .. } => address.to_string(),
        }
    }

    pub fn cap(&self) -> Cap {
        match self {
            Controller::Pcie(c) => c.cap(),
            Controller::Tcp { ctrl, .. } => ctrl.cap(),
        }
    }

    pub fn version(&self) -> Vs {
        match self {
            Controller::Pcie(c) => c.version(),
            Controller::Tcp { ctrl, .. } => ctrl.version(),
        }
    }

    /// Identify Controller (a local controller's, as read when it was brought up).
    pub fn identify(&mut self) -> Result<IdentifyController, ControllerError> {
        match self {
            Controller::Pcie(c) => Ok(*c.identify()),
            Controller::Tcp { ctrl, .. } => Ok(ctrl.identify_controller()?),
        }
    }

    /// The active namespaces with a usable LBA format (`id`: its Identify Controller).
    pub fn namespaces(
        &mut self,
        id: &IdentifyController,
    ) -> Result<Vec<Namespace>, ControllerError> {
        match self {
            Controller::Pcie(c) => Ok(c.namespaces().to_vec()),
            Controller::Tcp { ctrl, .. } => Ok(ctrl.namespaces(id.nn)?),
        }
    }

    /// The SMART / Health Information log of the whole controller.
    pub fn smart_log(&mut self) -> Result<SmartLog, ControllerError> {
        match self {
            Controller::Pcie(c) => Ok(c.smart_log()?),
            Controller::Tcp { ctrl, .. } => Ok(ctrl.smart_log()?),
        }
    }

    /// The Firmware Slot Information log of a local controller (None for a remote one).
    pub fn firmware_log(&mut self) -> Result<Option<FirmwareSlotLog>, ControllerError> {
        match self {
            Controller::Pcie(c) => Ok(Some(c.firmware_log()?)),
            Controller::Tcp { .. } => Ok(None),
        }
    }

    /// How it is reached.
    pub fn reach(&self) -> Reach {
        match self {
            Controller::Pcie(c) => Reach::Pcie {
                link: c.pcie_link(),
                io_queue_pairs: c.io_queues_granted(),
                max_transfer: c.max_transfer(),
                shadow_doorbells: c.shadow_doorbells(),
            },
            Controller::Tcp { ctrl, .. } => Reach::Tcp {
                transport: ctrl.transport(),
                target: ctrl.addr().to_string(),
                digests: ctrl.digests(),
                maxh2cdata: ctrl.maxh2cdata(),
            },
        }
    }
}
