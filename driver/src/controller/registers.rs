//! How the shared controller logic (`bringup`) reaches a PCIe controller: its registers over
//! MMIO, the admin queue, enable / disable, and its faults worded as the driver's errors.

use std::time::Duration;

use crate::bringup::{self, AdminCommand, AdminPath, Failed, Fault, Faults, Reg, RegisterAccess};
use crate::error::Error;
use crate::queue::QueuePair;
use crate::regs::Registers;
use crate::spec::registers::reg;
use crate::spec::Aqa;

use super::admin::Admin;
use super::invalid;

/// Programs the admin queue (AQA, ASQ, ACQ), then enables the controller as every transport
/// does ([`bringup::enable`]: the host's configuration, CC.EN, CSTS.RDY within CAP.TO).
pub(super) fn enable(
    name: &str,
    regs: &dyn Registers,
    admin: &QueuePair,
    timeout: Duration,
) -> Result<(), Error> {
    regs.write32(reg::AQA, Aqa::new(admin.depth(), admin.depth()).0);
    regs.write64(reg::ASQ, admin.sq_iova());
    regs.write64(reg::ACQ, admin.cq_iova());
    bringup::enable(
        &mut Mmio::new(name, regs),
        bringup::host_configuration(),
        timeout,
    )
    .map(|_| ())
}

/// CC.EN = 0 and wait for CSTS.RDY = 0 ([`bringup::disable`]).
pub(super) fn disable(name: &str, regs: &dyn Registers, timeout: Duration) -> Result<(), Error> {
    bringup::disable(&mut Mmio::new(name, regs), timeout)
}

/// The shared controller logic's faults, as the driver's errors.
fn pcie_fault(name: &str, fault: Fault) -> Error {
    let device = name.to_owned();
    match fault {
        Fault::Gone => Error::Gone { device },
        Fault::Fatal { during } => Error::Fatal {
            device,
            during: during.into(),
        },
        Fault::ReadyTimeout { during, after, .. } => Error::Timeout {
            device,
            what: format!("controller {during} (CSTS.RDY)"),
            after,
        },
        Fault::ShutdownTimeout { after } => Error::Timeout {
            device,
            what: "shutdown (CSTS.SHST)".into(),
            after,
        },
        Fault::Status { opcode, status, .. } => Error::Command {
            device,
            command: opcode,
            status,
        },
        Fault::Malformed { data, .. } => invalid(name, data),
    }
}

/// The controller's registers over MMIO, for the shared logic: they cannot fail, but a device
/// that is gone reads all ones (the logic checks CAP and CSTS for it).
pub(super) struct Mmio<'a> {
    name: &'a str,
    regs: &'a dyn Registers,
}

impl<'a> Mmio<'a> {
    pub(super) fn new(name: &'a str, regs: &'a dyn Registers) -> Mmio<'a> {
        Mmio { name, regs }
    }
}

impl Faults for Mmio<'_> {
    type Error = Error;
    fn fault(&self, fault: Fault) -> Error {
        pcie_fault(self.name, fault)
    }
}

impl RegisterAccess for Mmio<'_> {
    fn read(&mut self, reg: Reg, _during: &'static str) -> Result<u64, Error> {
        Ok(match reg.eight_bytes() {
            true => self.regs.read64(reg.offset()),
            false => u64::from(self.regs.read32(reg.offset())),
        })
    }

    fn write(&mut self, reg: Reg, value: u64, _during: &'static str) -> Result<(), Error> {
        match reg.eight_bytes() {
            true => self.regs.write64(reg.offset(), value),
            false => self.regs.write32(reg.offset(), value as u32),
        }
        Ok(())
    }

    fn poll_interval(&self) -> Duration {
        Duration::from_micros(200)
    }
}

/// The admin queue in DMA memory, polled, for the shared logic (the lock held).
pub(super) struct AdminAccess<'a> {
    pub(super) name: &'a str,
    pub(super) regs: &'a dyn Registers,
    pub(super) admin: &'a mut Admin,
    pub(super) timeout: Duration,
}

impl Faults for AdminAccess<'_> {
    type Error = Error;
    fn fault(&self, fault: Fault) -> Error {
        pcie_fault(self.name, fault)
    }
}

impl AdminPath for AdminAccess<'_> {
    fn admin(&mut self, command: AdminCommand<'_>) -> Result<u32, Failed<Error>> {
        self.admin
            .execute(
                self.name,
                self.regs,
                command.sqe,
                command.data,
                self.timeout,
            )
            .map_err(|e| match e {
                Error::Command { status, .. } => Failed::Status(status),
                e => Failed::Transport(e),
            })
    }
}
