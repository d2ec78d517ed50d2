//! The properties of a fabrics controller (CAP, VS, CC, CSTS), as Property Get/Set read and
//! write them: CC.EN makes the controller ready, CC.SHN starts a shutdown.

use usnvme_driver::spec::fabrics::PropertySize;
use usnvme_driver::spec::registers::{reg, Cap, Cc, Csts, ShutdownStatus, Vs};
use usnvme_driver::spec::Status;

use super::super::SubsystemInfo;
use super::{INVALID_FIELD, VERSION};

/// CAP.TO: how long a host waits for CSTS.RDY to follow CC.EN, in 500 ms units (7.5 s). We are
/// ready at once; the value only bounds a host's patience.
const READY_TIMEOUT: u64 = 15;

/// Property offsets (the PCIe register offsets), as Property Get/Set carry them.
const CAP: u32 = reg::CAP as u32;
const VS: u32 = reg::VS as u32;
const CC: u32 = reg::CC as u32;
const CSTS: u32 = reg::CSTS as u32;

/// CAP fields we set (NVMe Base 2.0, section 3.1.4.1); MPSMIN = MPSMAX = 0 (4 KiB pages only),
/// DSTRD 0 and AMS 0 (round robin only) are zero.
const CAP_CQR: u64 = 1 << 16;
const CAP_TO_SHIFT: u32 = 24;
const CAP_CSS_NVM: u64 = 1 << 37;

/// CC.IOSQES / CC.IOCQES: the entry sizes of fabrics I/O queues (64 and 16 bytes, log2).
pub(super) const IOSQES: u8 = 6;
pub(super) const IOCQES: u8 = 4;

/// The properties of one fabrics controller. Only CC is writable; CSTS follows it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ControllerRegisters {
    cap: Cap,
    vs: Vs,
    cc: Cc,
    csts: Csts,
    discovery: bool,
}

impl ControllerRegisters {
    /// A disabled controller of `sub` (the discovery controller if `discovery`).
    pub fn new(sub: &SubsystemInfo, discovery: bool) -> ControllerRegisters {
        let mqes = u64::from(sub.queue_entries.saturating_sub(1).max(1));
        ControllerRegisters {
            cap: Cap(mqes | CAP_CQR | (READY_TIMEOUT << CAP_TO_SHIFT) | CAP_CSS_NVM),
            vs: VERSION,
            cc: Cc::new(),
            csts: Csts::default(),
            discovery,
        }
    }

    /// Property Get: CAP is 8 bytes, VS, CC and CSTS are 4; any other offset, or a size that is
    /// not the property's, is an invalid field.
    pub fn property_get(&self, offset: u32, size: PropertySize) -> Result<u64, Status> {
        match (offset, size) {
            (CAP, PropertySize::Eight) => Ok(self.cap.0),
            (VS, PropertySize::Four) => Ok(u64::from(self.vs.0)),
            (CC, PropertySize::Four) => Ok(u64::from(self.cc.0)),
            (CSTS, PropertySize::Four) => Ok(u64::from(self.csts.0)),
            _ => Err(INVALID_FIELD),
        }
    }

    /// Property Set: only CC (4 bytes). CC.EN 0→1 makes the controller ready once its
    /// configuration is one we support; EN 1→0 resets it (not ready); a shutdown notification
    /// (SHN) starts shutdown processing (CSTS.SHST 01b), which [`Self::shutdown_complete`]
    /// ends. A refused write leaves CC as it was.
    pub fn property_set(
        &mut self,
        offset: u32,
        size: PropertySize,
        value: u64,
    ) -> Result<(), Status> {
        if offset != CC || size != PropertySize::Four {
            return Err(INVALID_FIELD);
        }
        // a 4-byte property: the upper half of VALUE is reserved
        let new = Cc(value as u32);
        let old = self.cc;
        if new.en() && !old.en() {
            self.check_enable(new)?;
        }
        self.cc = new;
        if new.en() != old.en() {
            self.csts = self.csts.with_rdy(new.en());
        }
        if new.shn() != Cc::SHN_NONE && old.shn() == Cc::SHN_NONE {
            // Processing: the connection flushes the drives' volatile write caches, then
            // calls `shutdown_complete`.
            self.csts = self.csts.with_shst(ShutdownStatus::Occurring);
        } else if new.shn() == Cc::SHN_NONE && old.shn() != Cc::SHN_NONE {
            self.csts = self.csts.with_shst(ShutdownStatus::Normal);
        }
        Ok(())
    }

    /// The configuration a host enables must be one CAP offers: the NVM command set, 4 KiB
    /// pages, round robin, and (on an I/O controller) 64/16-byte queue entries. A discovery
    /// controller has no I/O queues: the specification wants its IOSQES/IOCQES zero, Linux sets
    /// them anyway, so either is taken.
    fn check_enable(&self, cc: Cc) -> Result<(), Status> {
        if cc.css() != Cc::CSS_NVM || cc.mps() != 0 || cc.ams() != Cc::AMS_ROUND_ROBIN {
            return Err(INVALID_FIELD);
        }
        let sizes = (cc.iosqes(), cc.iocqes());
        let sizes_ok = sizes == (IOSQES, IOCQES) || (self.discovery && sizes == (0, 0));
        if !sizes_ok {
            return Err(INVALID_FIELD);
        }
        Ok(())
    }

    /// CSTS.RDY: commands other than Fabrics ones may be served, I/O queues may connect.
    pub fn ready(&self) -> bool {
        self.csts.rdy()
    }

    /// The host announced a shutdown (CC.SHN): held Asynchronous Event Requests should end.
    pub fn shutdown_requested(&self) -> bool {
        self.cc.shn() != Cc::SHN_NONE
    }

    /// Shutdown processing is under way (SHN written, not yet complete).
    pub fn shutting_down(&self) -> bool {
        self.csts.shst() == ShutdownStatus::Occurring
    }

    /// Shutdown processing is done (the drives' caches are flushed): CSTS.SHST 10b.
    pub fn shutdown_complete(&mut self) {
        if self.shutting_down() {
            self.csts = self.csts.with_shst(ShutdownStatus::Complete);
        }
    }

    pub fn cap(&self) -> Cap {
        self.cap
    }

    pub fn cc(&self) -> Cc {
        self.cc
    }

    pub fn csts(&self) -> Csts {
        self.csts
    }
}
