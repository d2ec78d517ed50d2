//! What a controller of the target answers without touching a drive: the properties of a
//! fabrics controller (CAP, VS, CC, CSTS), Identify, features, log pages (SMART aggregated from
//! the drives, the discovery log) and the Fabrics commands' own fields (Connect, Property
//! Get/Set, Disconnect).
//!
//! Sans-IO and pure: each function takes the subsystem description and the command and returns
//! the data and completion DW0 to send, or the status to fail with. The connection owns the
//! state ([`ControllerRegisters`], [`Features`]) and the transport; Keep Alive and
//! Asynchronous Event Request are its own too (they need its timers and held commands).
//!
//! Everything the host sends is checked before it is used: no input panics, and answers are
//! built in the caller's buffer of [`MAX_ADMIN_DATA`] bytes (nothing is allocated per command;
//! a longer Get Log Page is refused). Refusals carry Do Not Retry, since the same command
//! would fail again.
//!
//! Sources: NVMe Base 2.0 (Identify, Get Log Page, Set/Get Features), NVMe over Fabrics 1.1
//! (Connect, properties, the discovery log), and what the Linux 6.1 host reads.
//!
//! One file per part: `properties` (CAP, VS, CC, CSTS), `identify`, `features`, `log_pages`
//! (Error Information, SMART, Firmware Slot, the discovery log), `fabrics` (the Fabrics
//! commands the target serves, from the spec's typed views, and Connect's data checked);
//! [`execute`], here, runs an admin command.

mod fabrics;
mod features;
mod identify;
mod log_pages;
mod properties;

use usnvme_driver::spec::command::AdminOpcode;
use usnvme_driver::spec::registers::Vs;
use usnvme_driver::spec::{SmartLog, Sqe, Status};

use super::SubsystemInfo;
pub use fabrics::{connect_data, connect_nqns, FabricsCommand};
pub use features::Features;
use features::{FID_ASYNC_EVENT_CONFIGURATION, FID_KEEP_ALIVE_TIMER};
pub use identify::{
    active_namespaces, identify, identify_controller, identify_namespace, namespace_descriptors,
};
pub use log_pages::{aggregate_smart, log_page, DiscoveryAsker};
pub use properties::ControllerRegisters;

/// The NVMe version both controllers implement. 1.3 is the least that makes the Linux host ask
/// for the Namespace Identification Descriptor list (CNS 3), where it finds each namespace's
/// NGUID; 1.2 or later also makes it ask for the I/O command set's Identify Controller (CNS 6).
pub const VERSION: Vs = Vs::new(1, 3, 0);

/// What a controller's ANA log reports: the state of each ANA group at the controller's port
/// (by group ID - 1), and the number of state changes so far.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct AnaView {
    pub states: [super::registry::AnaState; super::ANA_GROUPS as usize],
    pub changes: u64,
}

impl AnaView {
    /// Every group in `state`.
    pub fn all(state: super::registry::AnaState, changes: u64) -> AnaView {
        AnaView {
            states: [state; super::ANA_GROUPS as usize],
            changes,
        }
    }

    /// The state of group `group` (1-based).
    pub fn state(&self, group: u32) -> super::registry::AnaState {
        let i = (group as usize).saturating_sub(1);
        self.states
            .get(i)
            .copied()
            .unwrap_or(super::registry::AnaState::Optimized)
    }
}

/// Asynchronous Event Requests a controller holds at once (AERL + 1).
pub const ASYNC_EVENT_LIMIT: usize = 4;

/// Whether Asynchronous Event Configuration `aec` lets event `dw0` (CQE dword 0) through:
/// a SMART / health event by its critical warning's bit (bits 7:0), a notice by its own
/// (bits 8 and up); error events always go.
pub fn event_enabled(aec: u32, dw0: u32) -> bool {
    let (kind, info) = (dw0 & 7, (dw0 >> 8) & 0xff);
    let bit = match (kind, info) {
        (0, _) => return true,
        (1, 0) => 1 << 2, // NVM subsystem reliability
        (1, 1) => 1 << 1, // temperature
        (1, 2) => 1 << 0, // spare
        (2, 0..=3) => 1 << (8 + info),
        (2, 0xf0) => 1 << 31, // discovery log change
        _ => return false,
    };
    aec & bit != 0
}

/// The most data one admin command's answer carries: the size of each connection's admin
/// buffer, preallocated, into which the answer is built (no allocation per command). Identify
/// is 4 KiB; every log of ours is shorter than this (the discovery log is 3 KiB at most),
/// and hosts read logs in pieces of 4 KiB (libnvme) or less.
pub const MAX_ADMIN_DATA: usize = 16 << 10;
/// The largest Get Log Page transfer answered (a longer one reads zeroes past the log's end);
/// a larger NUMD is refused.
pub const MAX_LOG_BYTES: usize = MAX_ADMIN_DATA;

/// Bytes of every Identify data structure.
pub const IDENTIFY_BYTES: usize = 4096;

/// Error Information log entries the controller keeps (ELPE + 1): it records none, but a log of
/// at least one entry must exist.
const ERROR_LOG_ENTRIES: usize = 1;

// The refusals, with Do Not Retry.
const INVALID_OPCODE: Status = Status::INVALID_OPCODE.with_dnr();
const INVALID_FIELD: Status = Status::INVALID_FIELD.with_dnr();
const INVALID_NAMESPACE: Status = Status::INVALID_NAMESPACE.with_dnr();
const INVALID_LOG_PAGE: Status = Status::INVALID_LOG_PAGE.with_dnr();
const FEATURE_NOT_SAVEABLE: Status = Status::FEATURE_NOT_SAVEABLE.with_dnr();
const FEATURE_NOT_CHANGEABLE: Status = Status::FEATURE_NOT_CHANGEABLE.with_dnr();
const DATA_SGL_LENGTH_INVALID: Status = Status::DATA_SGL_LENGTH_INVALID.with_dnr();
const CONNECT_INVALID_PARAMETERS: Status = Status::CONNECT_INVALID_PARAMETERS.with_dnr();
const CONNECT_INCOMPATIBLE_FORMAT: Status = Status::CONNECT_INCOMPATIBLE_FORMAT.with_dnr();

/// Abort's DW0 bit 0: the command was not aborted (we never abort: commands run to the end).
const ABORT_NOT_ABORTED: u32 = 1;

/// The controller an admin command is for: its ID, how a discovery controller's host reads
/// the discovery log (None for an I/O controller), the ANA state at its port, and its Changed
/// Namespace List log.
#[derive(Debug, Clone, Copy)]
pub struct Asked<'a> {
    pub cntlid: u16,
    pub discovery: Option<DiscoveryAsker<'a>>,
    pub ana: AnaView,
    pub changed_namespaces: &'a [u32],
    /// The transport takes Keyed SGL Data Blocks (NVMe/RDMA): Identify Controller says so.
    pub keyed_sgls: bool,
}

/// Runs an admin command of controller `asked` (a discovery controller or an I/O one);
/// returns the completion's DW0 and the data to send (empty for none). The discovery controller
/// serves Identify, Get Log Page and the Keep Alive Timer and Asynchronous Event Configuration
/// features; an I/O controller also Abort and the other features. Anything else is "Invalid
/// Command Opcode" (queue creation and deletion are Connect's and Disconnect's on fabrics).
/// Keep Alive and Asynchronous Event Request are the caller's.
pub fn execute(
    sub: &SubsystemInfo,
    asked: Asked,
    features: &mut Features,
    sqe: &Sqe,
    smart: &mut dyn FnMut() -> SmartLog,
    out: &mut [u8],
) -> Result<(u32, usize), Status> {
    let (cntlid, is_discovery) = (asked.cntlid, asked.discovery.is_some());
    let feature_served = |sqe: &Sqe| {
        let fid = sqe.cdw10 as u8;
        !is_discovery || fid == FID_KEEP_ALIVE_TIMER || fid == FID_ASYNC_EVENT_CONFIGURATION
    };
    match AdminOpcode::from_raw(sqe.opcode()) {
        Some(AdminOpcode::Identify) => {
            let page = identify(sub, cntlid, is_discovery, asked.keyed_sgls, sqe)?;
            let dst = out.get_mut(..IDENTIFY_BYTES).ok_or(INVALID_FIELD)?;
            dst.copy_from_slice(&page);
            Ok((0, IDENTIFY_BYTES))
        }
        Some(AdminOpcode::GetLogPage) => log_page(sub, asked, sqe, smart, out).map(|len| (0, len)),
        Some(AdminOpcode::SetFeatures) if feature_served(sqe) => {
            features.set_feature(sqe).map(|dw0| (dw0, 0))
        }
        Some(AdminOpcode::GetFeatures) if feature_served(sqe) => {
            features.get_feature(sqe).map(|dw0| (dw0, 0))
        }
        Some(AdminOpcode::SetFeatures | AdminOpcode::GetFeatures) => Err(INVALID_FIELD),
        Some(AdminOpcode::Abort) if !is_discovery => Ok((ABORT_NOT_ABORTED, 0)),
        _ => Err(INVALID_OPCODE),
    }
}

#[cfg(test)]
mod tests;
