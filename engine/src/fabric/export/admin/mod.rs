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

use usnvme_driver::spec::command::{AdminOpcode, Cns, FeatureId};
use usnvme_driver::spec::identify::Oncs;
use usnvme_driver::spec::log::LogPageId;
use usnvme_driver::spec::registers::{reg, Cap, Cc, Csts, ShutdownStatus, Vs};
use usnvme_driver::spec::{
    put_ascii, ErrorLogEntry, FirmwareSlotLog, IdentifyController, IdentifyNamespace, LbaFormat,
    NamespaceList, SmartLog, Sqe, Status,
};

use super::{ExportedNamespace, Listener, SubsystemInfo, DISCOVERY_NQN};

/// The NVMe version both controllers implement. 1.3 is the least that makes the Linux host ask
/// for the Namespace Identification Descriptor list (CNS 3), where it finds each namespace's
/// NGUID; 1.2 or later also makes it ask for the I/O command set's Identify Controller (CNS 6).
pub const VERSION: Vs = Vs::new(1, 3, 0);

/// Asynchronous Event Requests a controller holds at once (AERL + 1).
pub const ASYNC_EVENT_LIMIT: usize = 4;

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

/// Bytes of a Connect command's data.
pub const CONNECT_DATA_BYTES: usize = 1024;

/// Opcode of every Fabrics command.
pub const FABRICS_OPCODE: u8 = AdminOpcode::FabricsCommands as u8;

/// Fabrics command types (FCTYPE, byte 4 of the command).
pub mod fctype {
    pub const PROPERTY_SET: u8 = 0x00;
    pub const CONNECT: u8 = 0x01;
    pub const PROPERTY_GET: u8 = 0x04;
    pub const DISCONNECT: u8 = 0x08;
}

/// Error Information log entries the controller keeps (ELPE + 1): it records none, but a log of
/// at least one entry must exist.
const ERROR_LOG_ENTRIES: usize = 1;

/// Keep Alive Support: KATO granularity in 100 ms units. The connection times Keep Alive in
/// milliseconds, so 100 ms is a granularity it keeps.
const KAS: u16 = 1;

/// CAP.TO: how long a host waits for CSTS.RDY to follow CC.EN, in 500 ms units (7.5 s). We are
/// ready at once; the value only bounds a host's patience.
const READY_TIMEOUT: u64 = 15;

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

// ---------------------------------------------------------------------------------------------
// Properties

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
const IOSQES: u8 = 6;
const IOCQES: u8 = 4;

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
    pub fn property_get(&self, offset: u32, eight_bytes: bool) -> Result<u64, Status> {
        match (offset, eight_bytes) {
            (CAP, true) => Ok(self.cap.0),
            (VS, false) => Ok(u64::from(self.vs.0)),
            (CC, false) => Ok(u64::from(self.cc.0)),
            (CSTS, false) => Ok(u64::from(self.csts.0)),
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
        eight_bytes: bool,
        value: u64,
    ) -> Result<(), Status> {
        if offset != CC || eight_bytes {
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

// ---------------------------------------------------------------------------------------------
// Identify

/// Controller types (CNTRLTYPE).
const CNTRLTYPE_IO: u8 = 1;
const CNTRLTYPE_DISCOVERY: u8 = 2;
/// CMIC: several ports may reach the subsystem, and it has several controllers (one per
/// association): with it Linux accepts a second controller of the same subsystem (multipath).
const CMIC_MULTI_PORT: u8 = 1 << 0;
const CMIC_MULTI_CONTROLLER: u8 = 1 << 1;
/// NMIC: a namespace may be reached through several controllers (needed with the above).
const NMIC_SHARED: u8 = 1 << 0;
/// FRMW: slot 1 is read-only, one slot.
const FRMW_ONE_READ_ONLY_SLOT: u8 = (1 << 0) | (1 << 1);
/// LPA bit 2: extended data for Get Log Page (NUMDU and the log page offset).
const LPA_EXTENDED_DATA: u8 = 1 << 2;
/// VWC bit 0: a volatile write cache is present, so hosts send Flush.
const VWC_PRESENT: u8 = 1 << 0;
/// SGLS bit 0: SGLs supported, no alignment rule (Linux refuses a fabrics controller without).
const SGLS_SUPPORTED: u32 = 1 << 0;
/// SGLS bit 20: an SGL Data Block descriptor's address may be an offset, which is how a
/// command points at its in-capsule data.
const SGLS_OFFSET: u32 = 1 << 20;
/// OFCS bit 0: the Disconnect command is supported.
const OFCS_DISCONNECT: u16 = 1 << 0;
/// Namespace Identifier Type of a Namespace Identification Descriptor: NGUID, 16 bytes.
const NIDT_NGUID: u8 = 2;
const NIDL_NGUID: u8 = 16;
/// Identify CNS values served; 06h is the I/O command set's Identify Controller data.
const CNS_NAMESPACE: u8 = Cns::Namespace as u8;
const CNS_CONTROLLER: u8 = Cns::Controller as u8;
const CNS_ACTIVE_NAMESPACES: u8 = Cns::ActiveNamespaceList as u8;
const CNS_DESCRIPTORS: u8 = Cns::NamespaceDescriptorList as u8;
const CNS_IO_COMMAND_SET_CONTROLLER: u8 = 0x06;
/// Command Set Identifier of the NVM command set (CDW11 bits 31:24).
const CSI_NVM: u8 = 0;

/// MDTS for a largest transfer of `max_transfer` bytes, in 4 KiB pages as a power of two
/// (rounded down). MDTS 0 means "no limit", so 4 KiB cannot be said: the least is 1 (8 KiB),
/// and `max_transfer` should be at least that.
fn mdts(max_transfer: u32) -> u8 {
    let pages = (max_transfer / 4096).max(2);
    pages.ilog2() as u8
}

/// The largest namespace ID (NN: every ID up to it is valid, active or not).
fn max_nsid(sub: &SubsystemInfo) -> u32 {
    sub.namespaces.iter().map(|ns| ns.nsid).max().unwrap_or(0)
}

/// Writes a NUL-padded UTF-8 string (an NQN), truncated so that a NUL ends it: Linux takes
/// an Identify SUBNQN without one as absent.
fn put_nul_padded(field: &mut [u8], text: &str) {
    field.fill(0);
    let len = text.len().min(field.len().saturating_sub(1));
    if let (Some(dst), Some(src)) = (field.get_mut(..len), text.as_bytes().get(..len)) {
        dst.copy_from_slice(src);
    }
}

/// Identify Controller (CNS 01h) of controller `cntlid`: an I/O controller of `sub`, or the
/// discovery controller, which leaves the NVM command set's fields zero.
pub fn identify_controller(
    sub: &SubsystemInfo,
    cntlid: u16,
    discovery: bool,
) -> IdentifyController {
    let mut id = IdentifyController::zeroed();
    put_ascii(&mut id.sn, &sub.serial);
    put_ascii(&mut id.mn, &sub.model);
    put_ascii(&mut id.fr, &sub.firmware);
    id.mdts = mdts(sub.max_transfer);
    id.cntlid = cntlid;
    id.ver = VERSION.0;
    id.oacs = 0; // no optional admin commands
    id.aerl = (ASYNC_EVENT_LIMIT - 1) as u8;
    id.lpa = LPA_EXTENDED_DATA;
    id.kas = KAS;
    id.maxcmd = sub.queue_entries;
    id.sgls = SGLS_SUPPORTED;
    if sub.in_capsule_bytes > 0 {
        id.sgls |= SGLS_OFFSET;
    }
    let nqn = if discovery {
        DISCOVERY_NQN
    } else {
        sub.nqn.as_str()
    };
    put_nul_padded(&mut id.subnqn, nqn);
    // A command capsule is the 64-byte SQE and the in-capsule data; a response capsule the
    // 16-byte CQE only; data starts right after the SQE (ICDOFF 0, which Linux requires); one
    // SGL descriptor per command (NVMe/TCP).
    id.ioccsz = 64u32.saturating_add(sub.in_capsule_bytes) / 16;
    id.iorcsz = 1;
    id.icdoff = 0;
    id.fcatt = 0; // dynamic controller model
    id.msdbd = 1;
    id.ofcs = OFCS_DISCONNECT;
    if discovery {
        id.cntrltype = CNTRLTYPE_DISCOVERY;
        return id;
    }
    id.cntrltype = CNTRLTYPE_IO;
    id.cmic = CMIC_MULTI_PORT | CMIC_MULTI_CONTROLLER;
    id.acl = 3; // 0's based; Abort is answered "not aborted"
    id.frmw = FRMW_ONE_READ_ONLY_SLOT;
    id.elpe = (ERROR_LOG_ENTRIES - 1) as u8;
    id.sqes = (IOSQES << 4) | IOSQES;
    id.cqes = (IOCQES << 4) | IOCQES;
    id.nn = max_nsid(sub);
    id.oncs = Oncs::DATASET_MANAGEMENT | Oncs::WRITE_ZEROES;
    id.vwc = VWC_PRESENT;
    id
}

/// Identify Namespace (CNS 00h) of an active namespace: one LBA format, no metadata.
pub fn identify_namespace(ns: &ExportedNamespace) -> IdentifyNamespace {
    let mut id = IdentifyNamespace::zeroed();
    id.nsze = ns.blocks;
    id.ncap = ns.blocks;
    id.nuse = ns.blocks;
    id.nlbaf = 0;
    id.flbas = 0;
    id.nmic = NMIC_SHARED;
    // DLFEAT 0: whether deallocated blocks read back as zeroes depends on the drives under
    // the namespace (several, for a stripe), so it is not promised.
    id.dlfeat = 0;
    id.noiob = 0;
    id.nvmcap = (u128::from(ns.blocks) * u128::from(ns.block_size)).to_le_bytes();
    id.nguid = ns.nguid;
    // block sizes are powers of two: LBADS is their log2
    id.lbaf[0] = LbaFormat::new(ns.block_size.trailing_zeros() as u8, 0);
    id
}

/// Active Namespace ID list (CNS 02h): the IDs above `after_nsid`, ascending, 1024 at most.
pub fn active_namespaces(sub: &SubsystemInfo, after_nsid: u32) -> NamespaceList {
    let mut ids: Vec<u32> = sub
        .namespaces
        .iter()
        .map(|ns| ns.nsid)
        .filter(|&nsid| nsid > after_nsid)
        .collect();
    ids.sort_unstable();
    ids.dedup();
    NamespaceList::from_ids(ids)
}

/// Namespace Identification Descriptor list (CNS 03h): the NGUID, then a zero descriptor
/// that ends the list.
pub fn namespace_descriptors(ns: &ExportedNamespace) -> [u8; IDENTIFY_BYTES] {
    let mut page = [0u8; IDENTIFY_BYTES];
    page[0] = NIDT_NGUID;
    page[1] = NIDL_NGUID;
    page[4..20].copy_from_slice(&ns.nguid);
    page
}

/// Identify, by CNS (CDW10 bits 7:0). The discovery controller answers only CNS 01h. An NSID
/// up to NN that names no namespace is inactive: CNS 00h gives zeroes for it; other NSIDs
/// (0, beyond NN, the broadcast value) are invalid.
pub fn identify(
    sub: &SubsystemInfo,
    cntlid: u16,
    discovery: bool,
    sqe: &Sqe,
) -> Result<[u8; IDENTIFY_BYTES], Status> {
    let cns = sqe.cdw10 as u8;
    if discovery && cns != CNS_CONTROLLER {
        return Err(INVALID_FIELD);
    }
    let nsid = sqe.nsid;
    let active = sub.namespaces.iter().find(|ns| ns.nsid == nsid);
    match cns {
        CNS_CONTROLLER => Ok(*identify_controller(sub, cntlid, discovery).as_bytes()),
        CNS_NAMESPACE => match active {
            Some(ns) => Ok(*identify_namespace(ns).as_bytes()),
            None if nsid != 0 && nsid <= max_nsid(sub) => Ok([0; IDENTIFY_BYTES]),
            None => Err(INVALID_NAMESPACE),
        },
        CNS_ACTIVE_NAMESPACES => {
            if nsid >= 0xffff_fffe {
                return Err(INVALID_NAMESPACE);
            }
            Ok(*active_namespaces(sub, nsid).as_bytes())
        }
        CNS_DESCRIPTORS => active.map(namespace_descriptors).ok_or(INVALID_NAMESPACE),
        CNS_IO_COMMAND_SET_CONTROLLER => {
            // All zero for the NVM command set: no Verify, Write Zeroes or Dataset Management
            // size limits beyond MDTS. Linux asks for it when VS is 1.2 or later.
            if (sqe.cdw11 >> 24) as u8 != CSI_NVM {
                return Err(INVALID_FIELD);
            }
            Ok([0; IDENTIFY_BYTES])
        }
        _ => Err(INVALID_FIELD),
    }
}

// ---------------------------------------------------------------------------------------------
// Features

/// Set Features CDW10 bit 31: save the value across resets (nothing is saveable).
const FEATURE_SAVE: u32 = 1 << 31;
/// Get Features with SEL 3: bit 2 of DW0 says the feature is changeable.
const FEATURE_CHANGEABLE: u32 = 1 << 2;
/// Asynchronous Event Configuration bits a host may enable: the SMART / Health critical
/// warnings (7:0), which every controller may report. We raise no event, so enabling one
/// costs nothing.
const AEC_SUPPORTED: u32 = 0xff;

const FID_VOLATILE_WRITE_CACHE: u8 = FeatureId::VolatileWriteCache as u8;
const FID_NUMBER_OF_QUEUES: u8 = FeatureId::NumberOfQueues as u8;
const FID_ASYNC_EVENT_CONFIGURATION: u8 = FeatureId::AsyncEventConfiguration as u8;
const FID_KEEP_ALIVE_TIMER: u8 = FeatureId::KeepAliveTimer as u8;

/// The features of one controller, as Set/Get Features see them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Features {
    /// The most I/O queues of each kind Number of Queues grants.
    io_queues: u16,
    /// I/O submission and completion queues granted (not 0's based).
    queues: (u16, u16),
    keep_alive_ms: u32,
    async_events: u32,
}

/// Number of Queues DW0: submission queues (15:0) and completion queues (31:16), 0's based.
fn queues_dw0((sq, cq): (u16, u16)) -> u32 {
    u32::from(sq.saturating_sub(1)) | (u32::from(cq.saturating_sub(1)) << 16)
}

impl Features {
    /// A new controller's features: all of `sub`'s I/O queues until the host asks for fewer,
    /// no keep-alive timeout, no asynchronous event enabled.
    pub fn new(sub: &SubsystemInfo) -> Features {
        let io_queues = sub.io_queues.max(1);
        Features {
            io_queues,
            queues: (io_queues, io_queues),
            keep_alive_ms: 0,
            async_events: 0,
        }
    }

    /// Set Features (FID in CDW10 bits 7:0, value in CDW11); the completion's DW0.
    pub fn set_feature(&mut self, sqe: &Sqe) -> Result<u32, Status> {
        if sqe.cdw10 & FEATURE_SAVE != 0 {
            return Err(FEATURE_NOT_SAVEABLE);
        }
        match sqe.cdw10 as u8 {
            FID_NUMBER_OF_QUEUES => {
                // NSQR (15:0) and NCQR (31:16), 0's based; 65535 would ask for 65536
                let (nsqr, ncqr) = (sqe.cdw11 & 0xffff, sqe.cdw11 >> 16);
                if nsqr == 0xffff || ncqr == 0xffff {
                    return Err(INVALID_FIELD);
                }
                let grant = |requested: u32| (requested + 1).min(u32::from(self.io_queues)) as u16;
                self.queues = (grant(nsqr), grant(ncqr));
                Ok(queues_dw0(self.queues))
            }
            FID_KEEP_ALIVE_TIMER => {
                self.keep_alive_ms = sqe.cdw11;
                Ok(0)
            }
            FID_ASYNC_EVENT_CONFIGURATION => {
                if sqe.cdw11 & !AEC_SUPPORTED != 0 {
                    return Err(INVALID_FIELD);
                }
                self.async_events = sqe.cdw11;
                Ok(0)
            }
            // the drives' caches stay as they are
            FID_VOLATILE_WRITE_CACHE => Err(FEATURE_NOT_CHANGEABLE),
            _ => Err(INVALID_FIELD),
        }
    }

    /// Get Features (FID in CDW10 bits 7:0, SEL in 10:8); the completion's DW0.
    pub fn get_feature(&self, sqe: &Sqe) -> Result<u32, Status> {
        let (current, default, changeable) = match sqe.cdw10 as u8 {
            FID_NUMBER_OF_QUEUES => (
                queues_dw0(self.queues),
                queues_dw0((self.io_queues, self.io_queues)),
                true,
            ),
            FID_KEEP_ALIVE_TIMER => (self.keep_alive_ms, 0, true),
            FID_ASYNC_EVENT_CONFIGURATION => (self.async_events, 0, true),
            FID_VOLATILE_WRITE_CACHE => (1, 1, false), // enabled
            _ => return Err(INVALID_FIELD),
        };
        match (sqe.cdw10 >> 8) & 7 {
            0 => Ok(current),
            // nothing is saveable: the saved value is the default
            1 | 2 => Ok(default),
            3 if changeable => Ok(FEATURE_CHANGEABLE),
            3 => Ok(0),
            _ => Err(INVALID_FIELD),
        }
    }

    /// I/O submission and completion queues granted.
    pub fn io_queues_granted(&self) -> (u16, u16) {
        self.queues
    }

    /// Keep Alive Timeout, milliseconds (0: none).
    pub fn keep_alive_ms(&self) -> u32 {
        self.keep_alive_ms
    }

    /// Records the KATO a Connect gave, so Get Features reports it.
    pub fn set_keep_alive_ms(&mut self, ms: u32) {
        self.keep_alive_ms = ms;
    }

    /// Asynchronous Event Configuration the host set.
    pub fn async_event_config(&self) -> u32 {
        self.async_events
    }
}

// ---------------------------------------------------------------------------------------------
// Log pages

const LID_ERROR_INFORMATION: u8 = LogPageId::ErrorInformation as u8;
const LID_SMART: u8 = LogPageId::SmartHealth as u8;
const LID_FIRMWARE_SLOT: u8 = LogPageId::FirmwareSlot as u8;
const LID_DISCOVERY: u8 = LogPageId::Discovery as u8;

/// Discovery log layout (NVMe over Fabrics 1.1, Discovery Log Page): a 1024-byte header, then
/// one 1024-byte entry per record. Every field is written as Linux's nvmet writes it
/// (`drivers/nvme/target/discovery.c`), the reference every host is tested against.
const DISCOVERY_HEADER: usize = 1024;
const DISCOVERY_ENTRY: usize = 1024;
/// GENCTR: the log never changes while the target runs.
const DISCOVERY_GENCTR: u64 = 1;
/// TRTYPE 3: TCP.
const TRTYPE_TCP: u8 = 3;
/// ADRFAM: IPv4, IPv6.
const ADRFAM_IPV4: u8 = 1;
const ADRFAM_IPV6: u8 = 2;
/// SUBTYPE 2: an NVM subsystem; 3: the current discovery subsystem, the one answering (nvmet
/// lists it first, and since NVMe-oF 1.1 hosts expect it: nvme-cli skips it when connecting).
const SUBTYPE_NVME: u8 = 2;
const SUBTYPE_CURRENT_DISCOVERY: u8 = 3;
/// TREQ: bits 1:0 00b, secure channel requirements not specified (we offer no TLS: 01b
/// "required" or 10b "not required" both make libnvme 1.3 add `tls` to the connect options,
/// which Linux 6.1 refuses), and bit 2, SQ flow control disable supported (we honour CATTR
/// bit 2 in Connect). This is what nvmet writes for a TCP port.
const TREQ_SQ_FLOW_CONTROL_DISABLE: u8 = 1 << 2;
/// CNTLID FFFFh: the dynamic controller model (any controller ID).
const CNTLID_DYNAMIC: u16 = 0xffff;
/// ASQSZ: the admin queue entries a host may use: 32, nvmet's NVME_AQ_DEPTH (and the least
/// the specification allows).
const DISCOVERY_ASQSZ: u16 = 32;
// EFLAGS (bytes 10..12) stay 0, as nvmet leaves them: no duplicate-information or explicit
// persistent-connection claims. TSAS (768..1024) stays 0: for TCP its first byte is SECTYPE,
// 0 = no security, as nvmet writes for a port without TLS.

/// Who reads the discovery log: the port (listener) its connection came in on, as the host
/// reached it (the address is the connection's local one, never a wildcard), and whether the
/// host may use the subsystem. As nvmet, the log describes that port only, and names the NVM
/// subsystem only to a host allowed to connect to it.
#[derive(Debug, Clone, Copy)]
pub struct DiscoveryAsker<'a> {
    pub port: &'a Listener,
    pub host_allowed: bool,
}

impl DiscoveryAsker<'_> {
    fn records(&self) -> usize {
        1 + usize::from(self.host_allowed)
    }
}

/// Get Log Page: the `len` bytes at `offset` of log LID (CDW10 bits 7:0). The length is NUMD,
/// 0's based dwords from NUMDL (CDW10 bits 31:16) and NUMDU (CDW11 bits 15:0); the offset is
/// CDW12/13 and must be a dword multiple. Bytes past the log's end read as zero; an offset past
/// it is refused. The discovery controller has only the discovery log (70h); an I/O
/// controller has Error Information (01h, empty), SMART / Health (02h, from `smart`, asked only
/// for it, controller-wide: NSID 0 or FFFFFFFFh) and Firmware Slot Information (03h).
pub fn log_page(
    sub: &SubsystemInfo,
    discovery: Option<DiscoveryAsker>,
    sqe: &Sqe,
    smart: &mut dyn FnMut() -> SmartLog,
    out: &mut [u8],
) -> Result<usize, Status> {
    let numd = ((sqe.cdw11 & 0xffff) << 16) | (sqe.cdw10 >> 16);
    let len = (u64::from(numd) + 1) * 4;
    let len = usize::try_from(len)
        .ok()
        .filter(|&len| len <= MAX_LOG_BYTES.min(out.len()))
        .ok_or(INVALID_FIELD)?;
    let offset = u64::from(sqe.cdw12) | (u64::from(sqe.cdw13) << 32);
    if offset % 4 != 0 {
        return Err(INVALID_FIELD);
    }
    let log_len = match (discovery, sqe.cdw10 as u8) {
        (Some(asker), LID_DISCOVERY) => DISCOVERY_HEADER + DISCOVERY_ENTRY * asker.records(),
        (Some(_), _) => return Err(INVALID_LOG_PAGE),
        (None, LID_ERROR_INFORMATION) => ERROR_LOG_ENTRIES * ErrorLogEntry::SIZE,
        (None, LID_SMART) => {
            if sqe.nsid != 0 && sqe.nsid != u32::MAX {
                return Err(INVALID_FIELD); // no per-namespace SMART (LPA bit 0 clear)
            }
            SmartLog::SIZE
        }
        (None, LID_FIRMWARE_SLOT) => FirmwareSlotLog::SIZE,
        _ => return Err(INVALID_LOG_PAGE),
    };
    let offset = usize::try_from(offset)
        .ok()
        .filter(|&at| at <= log_len)
        .ok_or(INVALID_FIELD)?;
    // `out` shows the log from `offset`: zeroes, then each part of the log where it falls
    let out = &mut out[..len];
    out.fill(0);
    match (sqe.cdw10 as u8, discovery) {
        (LID_DISCOVERY, Some(asker)) => {
            let mut part = [0u8; DISCOVERY_ENTRY];
            discovery_header(&mut part, asker.records());
            put_log_part(out, offset, 0, &part);
            let records = [
                (SUBTYPE_CURRENT_DISCOVERY, super::DISCOVERY_NQN),
                (SUBTYPE_NVME, sub.nqn.as_str()),
            ];
            for (i, (subtype, nqn)) in records.into_iter().take(asker.records()).enumerate() {
                part.fill(0);
                discovery_entry(&mut part, subtype, nqn, asker.port);
                put_log_part(out, offset, DISCOVERY_HEADER + i * DISCOVERY_ENTRY, &part);
            }
        }
        (LID_SMART, _) => put_log_part(out, offset, 0, smart().as_bytes()),
        (LID_FIRMWARE_SLOT, _) => put_log_part(out, offset, 0, firmware_slot_log(sub).as_bytes()),
        _ => {} // the error log: no errors recorded, all zero
    }
    Ok(len)
}

/// Copies `part`, which is at byte `at` of a log, into `out`, which shows the log from byte
/// `offset` on (whatever of `part` falls inside it).
fn put_log_part(out: &mut [u8], offset: usize, at: usize, part: &[u8]) {
    let (from, to) = if at >= offset {
        (0, at - offset)
    } else {
        (offset - at, 0)
    };
    if from >= part.len() || to >= out.len() {
        return;
    }
    let n = (part.len() - from).min(out.len() - to);
    out[to..to + n].copy_from_slice(&part[from..from + n]);
}

/// One firmware slot, read-only and active, holding the usnvme version.
fn firmware_slot_log(sub: &SubsystemInfo) -> FirmwareSlotLog {
    let mut log = FirmwareSlotLog::zeroed();
    log.afi = 1;
    put_ascii(&mut log.frs[0], &sub.firmware);
    log
}

/// The discovery log's header (its first 1024 bytes).
fn discovery_header(header: &mut [u8], records: usize) {
    header[0..8].copy_from_slice(&DISCOVERY_GENCTR.to_le_bytes());
    header[8..16].copy_from_slice(&(records as u64).to_le_bytes());
    // RECFMT (16..18) 0
}

/// Fills one 1024-byte discovery log entry: `nqn`, of type `subtype`, at `port`.
fn discovery_entry(entry: &mut [u8], subtype: u8, nqn: &str, port: &Listener) {
    entry[0] = TRTYPE_TCP;
    entry[1] = if port.address.is_ipv4() {
        ADRFAM_IPV4
    } else {
        ADRFAM_IPV6
    };
    entry[2] = subtype;
    entry[3] = TREQ_SQ_FLOW_CONTROL_DISABLE;
    entry[4..6].copy_from_slice(&port.port_id.to_le_bytes());
    entry[6..8].copy_from_slice(&CNTLID_DYNAMIC.to_le_bytes());
    entry[8..10].copy_from_slice(&DISCOVERY_ASQSZ.to_le_bytes());
    // TRSVCID and TRADDR are ASCII, space padded; SUBNQN is UTF-8, NUL padded
    put_ascii(&mut entry[32..64], &port.address.port().to_string());
    put_nul_padded(&mut entry[256..512], nqn);
    put_ascii(&mut entry[512..768], &port.address.ip().to_string());
}

/// The SMART / Health log of the subsystem from its drives': counters add up (saturating),
/// power-on hours and time at temperature are the longest, temperature and percentage used
/// the highest, critical warnings and endurance group summaries combine, and the available
/// spare is the lowest (with that drive's threshold, so the pair agrees with the warnings).
/// Per-sensor temperatures are a drive's own and are left out. No drives: an all-zero log.
pub fn aggregate_smart(logs: &[SmartLog]) -> SmartLog {
    let mut out = SmartLog::zeroed();
    let sum = |counter: fn(&SmartLog) -> u128| {
        logs.iter()
            .map(counter)
            .fold(0u128, u128::saturating_add)
            .to_le_bytes()
    };
    out.data_units_read = sum(SmartLog::data_units_read);
    out.data_units_written = sum(SmartLog::data_units_written);
    out.host_read_commands = sum(SmartLog::host_read_commands);
    out.host_write_commands = sum(SmartLog::host_write_commands);
    out.controller_busy_time = sum(SmartLog::controller_busy_time);
    out.power_cycles = sum(SmartLog::power_cycles);
    out.unsafe_shutdowns = sum(SmartLog::unsafe_shutdowns);
    out.media_errors = sum(SmartLog::media_errors);
    out.error_log_entries = sum(SmartLog::error_log_entries);
    let hours = logs.iter().map(SmartLog::power_on_hours).max();
    out.power_on_hours = hours.unwrap_or(0).to_le_bytes();
    for log in logs {
        out.critical_warning |= log.critical_warning;
        out.endurance_group_summary |= log.endurance_group_summary;
        out.percentage_used = out.percentage_used.max(log.percentage_used);
        if log.temperature_kelvin() > out.temperature_kelvin() {
            out.composite_temperature = log.composite_temperature;
        }
        out.warning_temperature_time = out
            .warning_temperature_time
            .max(log.warning_temperature_time);
        out.critical_temperature_time = out
            .critical_temperature_time
            .max(log.critical_temperature_time);
    }
    if let Some(least) = logs.iter().min_by_key(|log| log.available_spare) {
        out.available_spare = least.available_spare;
        out.available_spare_threshold = least.available_spare_threshold;
    }
    out
}

// ---------------------------------------------------------------------------------------------
// Fabrics commands

/// The fields of a Connect command (NVMe over Fabrics 1.1, Connect command).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ConnectCommand {
    /// Record Format (byte 40): 0 is the only one.
    pub recfmt: u16,
    /// Queue ID (byte 42): 0 for the admin queue.
    pub qid: u16,
    /// Submission queue size (byte 44), 0's based.
    pub sqsize: u16,
    /// Connect Attributes (byte 46): bit 2 asks to disable SQ flow control.
    pub cattr: u8,
    /// Keep Alive Timeout (byte 48), milliseconds; 0 for none.
    pub kato: u32,
}

impl ConnectCommand {
    /// The Connect in `sqe`; a record format other than 0 is "Connect Incompatible Format".
    pub fn from_sqe(sqe: &Sqe) -> Result<ConnectCommand, Status> {
        if sqe.opcode() != FABRICS_OPCODE || fabrics_type(sqe) != fctype::CONNECT {
            return Err(INVALID_OPCODE);
        }
        let connect = ConnectCommand {
            recfmt: sqe.cdw10 as u16,
            qid: (sqe.cdw10 >> 16) as u16,
            sqsize: sqe.cdw11 as u16,
            cattr: (sqe.cdw11 >> 16) as u8,
            kato: sqe.cdw12,
        };
        if connect.recfmt != 0 {
            return Err(CONNECT_INCOMPATIBLE_FORMAT);
        }
        Ok(connect)
    }
}

/// FCTYPE, byte 4 of a Fabrics command (where other commands have the NSID).
fn fabrics_type(sqe: &Sqe) -> u8 {
    sqe.as_bytes()[4]
}

/// A Fabrics command (opcode 7Fh).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FabricsCommand {
    Connect(ConnectCommand),
    /// Property Set: ATTRIB (byte 40) gives the size, OFST (44) the property, VALUE (48).
    PropertySet {
        offset: u32,
        eight_bytes: bool,
        value: u64,
    },
    /// Property Get: ATTRIB (byte 40), OFST (44).
    PropertyGet {
        offset: u32,
        eight_bytes: bool,
    },
    Disconnect,
}

impl FabricsCommand {
    /// Decodes a Fabrics command; other opcodes and the FCTYPEs we do not serve
    /// (authentication) are "Invalid Command Opcode", as Linux's target answers them.
    pub fn from_sqe(sqe: &Sqe) -> Result<FabricsCommand, Status> {
        if sqe.opcode() != FABRICS_OPCODE {
            return Err(INVALID_OPCODE);
        }
        match fabrics_type(sqe) {
            fctype::CONNECT => ConnectCommand::from_sqe(sqe).map(FabricsCommand::Connect),
            fctype::PROPERTY_SET => Ok(FabricsCommand::PropertySet {
                offset: sqe.cdw11,
                eight_bytes: property_size(sqe)?,
                value: u64::from(sqe.cdw12) | (u64::from(sqe.cdw13) << 32),
            }),
            fctype::PROPERTY_GET => Ok(FabricsCommand::PropertyGet {
                offset: sqe.cdw11,
                eight_bytes: property_size(sqe)?,
            }),
            fctype::DISCONNECT => Ok(FabricsCommand::Disconnect),
            _ => Err(INVALID_OPCODE),
        }
    }
}

/// ATTRIB bits 2:0 of Property Get/Set: 0 for a 4-byte property, 1 for an 8-byte one; the other
/// values are reserved.
fn property_size(sqe: &Sqe) -> Result<bool, Status> {
    match sqe.cdw10 & 7 {
        0 => Ok(false),
        1 => Ok(true),
        _ => Err(INVALID_FIELD),
    }
}

/// The data of a Connect command (NVMe over Fabrics 1.1, Connect command data).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ConnectData {
    /// Host Identifier (bytes 0..16).
    pub hostid: [u8; 16],
    /// Controller ID (bytes 16..18): FFFFh on an admin queue (any controller), the controller
    /// the admin queue's Connect gave on an I/O queue.
    pub cntlid: u16,
    /// NVM Subsystem NQN (bytes 256..512).
    pub subnqn: String,
    /// Host NQN (bytes 512..768).
    pub hostnqn: String,
}

impl ConnectData {
    /// Parses the 1024 bytes of Connect data. Each NQN must be UTF-8, not empty, and end with
    /// a NUL inside its 256 bytes; otherwise "Connect Invalid Parameters". Data of another
    /// length is "Data SGL Length Invalid".
    pub fn parse(bytes: &[u8]) -> Result<ConnectData, Status> {
        let bytes: &[u8; CONNECT_DATA_BYTES] =
            bytes.try_into().map_err(|_| DATA_SGL_LENGTH_INVALID)?;
        let mut hostid = [0u8; 16];
        hostid.copy_from_slice(&bytes[0..16]);
        Ok(ConnectData {
            hostid,
            cntlid: u16::from_le_bytes([bytes[16], bytes[17]]),
            subnqn: nqn(&bytes[256..512])?,
            hostnqn: nqn(&bytes[512..768])?,
        })
    }
}

/// An NQN field: UTF-8 up to the first NUL.
fn nqn(field: &[u8]) -> Result<String, Status> {
    let end = field
        .iter()
        .position(|&b| b == 0)
        .ok_or(CONNECT_INVALID_PARAMETERS)?;
    let text = std::str::from_utf8(&field[..end]).map_err(|_| CONNECT_INVALID_PARAMETERS)?;
    if text.is_empty() {
        return Err(CONNECT_INVALID_PARAMETERS);
    }
    Ok(text.to_owned())
}

// ---------------------------------------------------------------------------------------------
// Admin commands

/// Abort's DW0 bit 0: the command was not aborted (we never abort: commands run to the end).
const ABORT_NOT_ABORTED: u32 = 1;

/// Runs an admin command of controller `cntlid` (the discovery controller if `discovery`);
/// returns the completion's DW0 and the data to send (empty for none). The discovery controller
/// serves Identify, Get Log Page and the Keep Alive Timer and Asynchronous Event Configuration
/// features; an I/O controller also Abort and the other features. Anything else is "Invalid
/// Command Opcode" (queue creation and deletion are Connect's and Disconnect's on fabrics).
/// Keep Alive and Asynchronous Event Request are the caller's.
pub fn execute(
    sub: &SubsystemInfo,
    cntlid: u16,
    discovery: Option<DiscoveryAsker>,
    features: &mut Features,
    sqe: &Sqe,
    smart: &mut dyn FnMut() -> SmartLog,
    out: &mut [u8],
) -> Result<(u32, usize), Status> {
    let is_discovery = discovery.is_some();
    let feature_served = |sqe: &Sqe| {
        let fid = sqe.cdw10 as u8;
        !is_discovery || fid == FID_KEEP_ALIVE_TIMER || fid == FID_ASYNC_EVENT_CONFIGURATION
    };
    match AdminOpcode::from_raw(sqe.opcode()) {
        Some(AdminOpcode::Identify) => {
            let page = identify(sub, cntlid, is_discovery, sqe)?;
            let dst = out.get_mut(..IDENTIFY_BYTES).ok_or(INVALID_FIELD)?;
            dst.copy_from_slice(&page);
            Ok((0, IDENTIFY_BYTES))
        }
        Some(AdminOpcode::GetLogPage) => {
            log_page(sub, discovery, sqe, smart, out).map(|len| (0, len))
        }
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
mod tests {
    use super::*;

    /// The discovery controller's asker: an allowed host on the first listener.
    fn asker(sub: &SubsystemInfo, discovery: bool) -> Option<DiscoveryAsker<'_>> {
        discovery.then(|| DiscoveryAsker {
            port: &sub.listeners[0],
            host_allowed: true,
        })
    }

    /// [`super::log_page`] into a buffer of its own, as a Vec.
    fn log_page(
        sub: &SubsystemInfo,
        discovery: bool,
        sqe: &Sqe,
        smart: &mut dyn FnMut() -> SmartLog,
    ) -> Result<Vec<u8>, Status> {
        let mut out = vec![0xEE; MAX_ADMIN_DATA];
        super::log_page(sub, asker(sub, discovery), sqe, smart, &mut out).map(|n| out[..n].to_vec())
    }

    /// [`super::execute`] into a buffer of its own, as a Vec.
    fn execute(
        sub: &SubsystemInfo,
        cntlid: u16,
        discovery: bool,
        features: &mut Features,
        sqe: &Sqe,
        smart: &mut dyn FnMut() -> SmartLog,
    ) -> Result<(u32, Vec<u8>), Status> {
        let mut out = vec![0xEE; MAX_ADMIN_DATA];
        super::execute(
            sub,
            cntlid,
            asker(sub, discovery),
            features,
            sqe,
            smart,
            &mut out,
        )
        .map(|(dw0, n)| (dw0, out[..n].to_vec()))
    }

    /// The whole discovery log, as an allowed host on the first listener reads it.
    fn discovery_log(sub: &SubsystemInfo) -> Vec<u8> {
        discovery_log_for(sub, asker(sub, true).expect("an asker"))
    }

    fn discovery_log_for(sub: &SubsystemInfo, asker: DiscoveryAsker) -> Vec<u8> {
        let len = DISCOVERY_HEADER + DISCOVERY_ENTRY * 2;
        let mut out = vec![0xEE; MAX_ADMIN_DATA];
        let sqe = get_log(0x70, 0, len as u32, 0);
        let n = super::log_page(sub, Some(asker), &sqe, &mut no_smart, &mut out).expect("log");
        let records = le64(&out, 8) as usize;
        out[..n.min(DISCOVERY_HEADER + DISCOVERY_ENTRY * records)].to_vec()
    }
    use std::net::SocketAddr;
    use usnvme_driver::spec::command::FeatureSelect;

    fn namespace(nsid: u32, block_size: u32, blocks: u64) -> ExportedNamespace {
        let mut nguid = [0u8; 16];
        nguid[0] = 0xab;
        nguid[15] = nsid as u8;
        ExportedNamespace {
            nsid,
            name: format!("sim:{nsid}"),
            block_size,
            blocks,
            nguid,
        }
    }

    fn listener(address: &str, port_id: u16) -> Listener {
        Listener {
            address: address.parse::<SocketAddr>().expect("an address"),
            port_id,
        }
    }

    fn subsystem() -> SubsystemInfo {
        SubsystemInfo {
            nqn: "nqn.2024-01.io.usnvme:test".into(),
            serial: "USN0001".into(),
            model: "usnvme".into(),
            firmware: "0.1.0".into(),
            namespaces: vec![namespace(1, 512, 1 << 21), namespace(3, 4096, 1000)],
            listeners: vec![
                listener("192.0.2.10:4420", 1),
                listener("[2001:db8::1]:4421", 2),
            ],
            in_capsule_bytes: 8192,
            max_transfer: 128 << 10,
            queue_entries: 128,
            io_queues: 8,
        }
    }

    fn le16(b: &[u8], at: usize) -> u16 {
        u16::from_le_bytes([b[at], b[at + 1]])
    }

    fn le32(b: &[u8], at: usize) -> u32 {
        u32::from_le_bytes(b[at..at + 4].try_into().expect("4 bytes"))
    }

    fn le64(b: &[u8], at: usize) -> u64 {
        u64::from_le_bytes(b[at..at + 8].try_into().expect("8 bytes"))
    }

    /// The text of a NUL-terminated field.
    fn c_string(field: &[u8]) -> &str {
        let end = field.iter().position(|&b| b == 0).expect("a NUL");
        std::str::from_utf8(&field[..end]).expect("UTF-8")
    }

    fn no_smart() -> SmartLog {
        panic!("SMART asked for where it is not needed")
    }

    #[test]
    fn identify_controller_bytes_where_linux_reads_them() {
        let sub = subsystem();
        let id = identify_controller(&sub, 7, false);
        let b = id.as_bytes();
        assert_eq!(&b[4..24], b"USN0001             ");
        assert_eq!(&b[24..30], b"usnvme");
        assert!(b[30..64].iter().all(|&c| c == b' '));
        assert_eq!(&b[64..72], b"0.1.0   ");
        assert_eq!(b[76], 0b11, "CMIC: multi-port, multi-controller");
        assert_eq!(b[77], 5, "MDTS: 2^5 4 KiB pages = 128 KiB");
        assert_eq!(le16(b, 78), 7, "CNTLID");
        assert_eq!(le32(b, 80), 0x0001_0300, "VER 1.3.0");
        assert_eq!(b[111], 1, "CNTRLTYPE: I/O");
        assert_eq!(le16(b, 256), 0, "OACS");
        assert_eq!((b[258], b[259]), (3, 3), "ACL, AERL");
        assert_eq!(b[260], 0b11, "FRMW");
        assert_eq!(b[261], 1 << 2, "LPA: extended data");
        assert_eq!(b[262], 0, "ELPE");
        assert_eq!(le16(b, 320), 1, "KAS: 100 ms");
        assert_eq!((b[512], b[513]), (0x66, 0x44), "SQES, CQES");
        assert_eq!(le16(b, 514), 128, "MAXCMD");
        assert_eq!(le32(b, 516), 3, "NN: the largest NSID");
        assert_eq!(le16(b, 520), (1 << 2) | (1 << 3), "ONCS: DSM, Write Zeroes");
        assert_eq!(b[525], 1, "VWC present");
        assert_eq!(le32(b, 536), 1 | (1 << 20), "SGLS");
        assert_eq!(c_string(&b[768..1024]), "nqn.2024-01.io.usnvme:test");
        assert_eq!(le32(b, 1792), (64 + 8192) / 16, "IOCCSZ");
        assert_eq!(le32(b, 1796), 1, "IORCSZ");
        assert_eq!(le16(b, 1800), 0, "ICDOFF");
        assert_eq!((b[1802], b[1803]), (0, 1), "FCATT, MSDBD");
        assert_eq!(le16(b, 1804), 1, "OFCS: Disconnect");
        assert_eq!(id.mdts_bytes(4096), Some(128 << 10));

        let d = identify_controller(&sub, 9, true);
        let b = d.as_bytes();
        assert_eq!(b[111], 2, "CNTRLTYPE: discovery");
        assert_eq!(le16(b, 78), 9);
        assert_eq!(c_string(&b[768..1024]), DISCOVERY_NQN);
        assert_eq!((le32(b, 516), le16(b, 520), b[525], b[76]), (0, 0, 0, 0));
        assert_eq!((le16(b, 320), le16(b, 514)), (1, 128), "KAS, MAXCMD");
        assert_ne!(le32(b, 536), 0, "SGLS");
    }

    #[test]
    fn mdts_rounds_down_and_never_says_no_limit() {
        assert_eq!(mdts(0), 1);
        assert_eq!(mdts(4096), 1);
        assert_eq!(mdts(8192), 1);
        assert_eq!(mdts(128 << 10), 5);
        assert_eq!(mdts(3 << 20), 9); // 2 MiB
        assert_eq!(mdts(u32::MAX), 19);
    }

    #[test]
    fn long_nqn_keeps_a_terminating_nul() {
        let mut sub = subsystem();
        sub.nqn = "n".repeat(300);
        let id = identify_controller(&sub, 1, false);
        assert_eq!(c_string(&id.subnqn).len(), 255);
    }

    #[test]
    fn identify_namespace_bytes() {
        let ns = namespace(3, 4096, 1000);
        let id = identify_namespace(&ns);
        let b = id.as_bytes();
        assert_eq!((le64(b, 0), le64(b, 8), le64(b, 16)), (1000, 1000, 1000));
        assert_eq!((b[25], b[26]), (0, 0), "NLBAF, FLBAS");
        assert_eq!(b[30], 1, "NMIC: shared");
        assert_eq!(b[33], 0, "DLFEAT");
        assert_eq!(le16(b, 46), 0, "NOIOB");
        assert_eq!(&b[104..120], &ns.nguid);
        assert_eq!(
            (le16(b, 128), b[130]),
            (0, 12),
            "LBA format 0: no metadata, 4 KiB"
        );
        assert_eq!(id.capacity_bytes(), Some(4096 * 1000));
        assert_eq!(identify_namespace(&namespace(1, 512, 8)).lbaf[0].lbads, 9);
    }

    #[test]
    fn identify_dispatch_by_cns_and_nsid() {
        let sub = subsystem(); // NSIDs 1 and 3: 2 is inactive, NN is 3
        let ask = |cns: u8, nsid: u32| {
            let mut sqe = Sqe::new(AdminOpcode::Identify as u8);
            sqe.cdw10 = u32::from(cns);
            sqe.nsid = nsid;
            identify(&sub, 1, false, &sqe)
        };
        let code = |r: Result<[u8; IDENTIFY_BYTES], Status>| r.map(|_| ()).map_err(|s| s.code());

        let ns1 = ask(0, 1).expect("NSID 1");
        assert_eq!(le64(&ns1, 0), 1 << 21);
        assert_eq!(ask(0, 2), Ok([0; IDENTIFY_BYTES]), "inactive: zeroes");
        for nsid in [0, 4, u32::MAX] {
            assert_eq!(code(ask(0, nsid)), Err(Status::INVALID_NAMESPACE), "{nsid}");
        }
        assert!(ask(0, 4).expect_err("invalid").dnr());

        let list = |after| NamespaceList::from_bytes(&ask(2, after).expect("a list"));
        assert_eq!(list(0).iter().collect::<Vec<_>>(), [1, 3]);
        assert_eq!(list(1).iter().collect::<Vec<_>>(), [3]);
        assert_eq!(list(3).iter().count(), 0);
        assert_eq!(code(ask(2, 0xffff_fffe)), Err(Status::INVALID_NAMESPACE));

        let descriptors = ask(3, 3).expect("descriptors");
        assert_eq!(
            (descriptors[0], descriptors[1]),
            (2, 16),
            "NIDT NGUID, NIDL 16"
        );
        assert_eq!(&descriptors[4..20], &sub.namespaces[1].nguid);
        assert!(
            descriptors[20..].iter().all(|&b| b == 0),
            "ended by a zero descriptor"
        );
        assert_eq!(code(ask(3, 2)), Err(Status::INVALID_NAMESPACE));

        assert_eq!(
            ask(6, 0),
            Ok([0; IDENTIFY_BYTES]),
            "NVM command set: no limits"
        );
        let mut zns = Sqe::new(AdminOpcode::Identify as u8);
        zns.cdw10 = 6;
        zns.cdw11 = 2 << 24;
        assert_eq!(
            identify(&sub, 1, false, &zns)
                .map_err(|s| s.code())
                .map(|_| ()),
            Err(Status::INVALID_FIELD)
        );
        assert_eq!(code(ask(0x10, 0)), Err(Status::INVALID_FIELD));

        let ctrl = ask(1, 0).expect("controller");
        assert_eq!(le16(&ctrl, 78), 1);
        // the discovery controller answers CNS 01h only
        let mut sqe = Sqe::identify(Cns::Namespace, 1);
        assert_eq!(
            identify(&sub, 1, true, &sqe)
                .map(|_| ())
                .map_err(|s| s.code()),
            Err(Status::INVALID_FIELD)
        );
        sqe.cdw10 = 1;
        let disc = identify(&sub, 1, true, &sqe).expect("discovery controller");
        assert_eq!(disc[111], 2);
    }

    #[test]
    fn properties_follow_the_linux_enable_and_shutdown_sequence() {
        let sub = subsystem();
        let mut r = ControllerRegisters::new(&sub, false);
        let cap = Cap(r.property_get(0x0, true).expect("CAP"));
        assert_eq!(cap.mqes(), 127);
        assert!(cap.cqr() && cap.css_nvm() && !cap.css_io_command_sets());
        assert_eq!((cap.to(), cap.to_ms()), (15, 7500));
        assert_eq!(
            (cap.dstrd(), cap.mpsmin(), cap.mpsmax(), cap.ams()),
            (0, 0, 0, 0)
        );
        assert_eq!(r.property_get(0x8, false), Ok(0x0001_0300));
        assert_eq!(r.property_get(0x14, false), Ok(0));
        assert_eq!(r.property_get(0x1c, false), Ok(0));
        // sizes must be the property's
        assert_eq!(
            r.property_get(0x0, false).map_err(|s| s.code()),
            Err(Status::INVALID_FIELD)
        );
        assert_eq!(
            r.property_get(0x14, true).map_err(|s| s.code()),
            Err(Status::INVALID_FIELD)
        );
        assert_eq!(
            r.property_get(0x24, false).map_err(|s| s.code()),
            Err(Status::INVALID_FIELD)
        );

        // Linux: CC with the entry sizes, read back, then EN
        let cc = Cc::new().with_iosqes(6).with_iocqes(4);
        assert_eq!(r.property_set(0x14, false, u64::from(cc.0)), Ok(()));
        assert!(!r.ready());
        assert_eq!(r.property_get(0x14, false), Ok(u64::from(cc.0)));
        // the upper half of a 4-byte VALUE is ignored
        let enabled = cc.with_en(true);
        assert_eq!(
            r.property_set(0x14, false, (0xdead << 32) | u64::from(enabled.0)),
            Ok(())
        );
        assert!(r.ready());
        assert_eq!(r.property_get(0x1c, false), Ok(1), "CSTS.RDY");
        assert_eq!(r.property_get(0x14, false), Ok(u64::from(enabled.0)));

        // shutdown: SHST occurring until the caller says it is complete (the drives'
        // caches flushed), written again meanwhile it stays so; RDY stays until EN clears
        let shutdown = enabled.with_shn(Cc::SHN_NORMAL);
        assert_eq!(r.property_set(0x14, false, u64::from(shutdown.0)), Ok(()));
        assert!(r.shutdown_requested() && r.shutting_down());
        assert_eq!(r.property_get(0x1c, false), Ok(0b0101));
        assert_eq!(r.property_set(0x14, false, u64::from(shutdown.0)), Ok(()));
        assert_eq!(r.csts().shst(), ShutdownStatus::Occurring);
        r.shutdown_complete();
        assert_eq!(r.csts().shst(), ShutdownStatus::Complete);
        assert_eq!(r.property_get(0x1c, false), Ok(0b1001));
        // reset after the shutdown: not ready, shutdown status normal
        assert_eq!(r.property_set(0x14, false, u64::from(cc.0)), Ok(()));
        assert!(!r.ready() && !r.shutdown_requested());
        assert_eq!(r.property_get(0x1c, false), Ok(0));
        // enabled again, then reset with EN 1→0
        assert_eq!(r.property_set(0x14, false, u64::from(enabled.0)), Ok(()));
        assert!(r.ready());
        assert_eq!(r.property_set(0x14, false, 0), Ok(()));
        assert!(!r.ready());

        // read-only properties, unknown offsets, 8-byte CC
        for (offset, eight) in [
            (0x0, true),
            (0x8, false),
            (0x1c, false),
            (0x24, false),
            (0x14, true),
        ] {
            let refused = r.property_set(offset, eight, 1).expect_err("refused");
            assert_eq!(refused.code(), Status::INVALID_FIELD, "{offset:#x}");
            assert!(refused.dnr());
        }
    }

    #[test]
    fn enabling_an_unsupported_configuration_is_refused() {
        let sub = subsystem();
        let good = Cc::new().with_iosqes(6).with_iocqes(4).with_en(true);
        let bad = [
            good.with_mps(1),
            good.with_css(Cc::CSS_ADMIN_ONLY),
            good.with_css(Cc::CSS_ALL_IO),
            good.with_ams(Cc::AMS_WEIGHTED_ROUND_ROBIN),
            good.with_iosqes(7),
            good.with_iocqes(0),
        ];
        for cc in bad {
            let mut r = ControllerRegisters::new(&sub, false);
            let refused = r.property_set(0x14, false, u64::from(cc.0));
            assert_eq!(
                refused.map_err(|s| s.code()),
                Err(Status::INVALID_FIELD),
                "{cc:?}"
            );
            assert!(!r.ready());
            assert_eq!(r.cc(), Cc::new(), "CC unchanged");
        }
        // the discovery controller takes zero entry sizes (or the I/O ones)
        let mut d = ControllerRegisters::new(&sub, true);
        assert_eq!(
            d.property_set(0x14, false, u64::from(Cc::new().with_en(true).0)),
            Ok(())
        );
        assert!(d.ready());
        let mut d = ControllerRegisters::new(&sub, true);
        assert_eq!(d.property_set(0x14, false, u64::from(good.0)), Ok(()));
        // an I/O controller does not
        let mut r = ControllerRegisters::new(&sub, false);
        assert!(r
            .property_set(0x14, false, u64::from(Cc::new().with_en(true).0))
            .is_err());
    }

    fn set_features(fid: FeatureId, cdw11: u32) -> Sqe {
        Sqe::set_features(fid, cdw11)
    }

    fn get_features(fid: FeatureId, select: FeatureSelect) -> Sqe {
        Sqe::get_features(fid, select)
    }

    #[test]
    fn features_number_of_queues_keep_alive_and_events() {
        let sub = subsystem(); // 8 I/O queues
        let mut f = Features::new(&sub);
        let current = |f: &Features, fid| f.get_feature(&get_features(fid, FeatureSelect::Current));
        assert_eq!(current(&f, FeatureId::NumberOfQueues), Ok(0x0007_0007));

        // asked for more than there are: granted the most
        let granted = f.set_feature(&Sqe::set_num_queues(16, 32));
        assert_eq!(granted, Ok(0x0007_0007));
        // asked for fewer: granted as asked
        assert_eq!(f.set_feature(&Sqe::set_num_queues(2, 4)), Ok(0x0003_0001));
        assert_eq!(f.io_queues_granted(), (2, 4));
        assert_eq!(current(&f, FeatureId::NumberOfQueues), Ok(0x0003_0001));
        let default = get_features(FeatureId::NumberOfQueues, FeatureSelect::Default);
        assert_eq!(f.get_feature(&default), Ok(0x0007_0007));
        let too_many = set_features(FeatureId::NumberOfQueues, 0x0000_ffff);
        assert_eq!(
            f.set_feature(&too_many).map_err(|s| s.code()),
            Err(Status::INVALID_FIELD)
        );

        assert_eq!(
            f.set_feature(&set_features(FeatureId::KeepAliveTimer, 5000)),
            Ok(0)
        );
        assert_eq!(f.keep_alive_ms(), 5000);
        assert_eq!(current(&f, FeatureId::KeepAliveTimer), Ok(5000));

        let aec = set_features(FeatureId::AsyncEventConfiguration, 0xff);
        assert_eq!(f.set_feature(&aec), Ok(0));
        assert_eq!(current(&f, FeatureId::AsyncEventConfiguration), Ok(0xff));
        let namespace_notices = set_features(FeatureId::AsyncEventConfiguration, 1 << 8);
        assert_eq!(
            f.set_feature(&namespace_notices).map_err(|s| s.code()),
            Err(Status::INVALID_FIELD)
        );
        assert_eq!(f.async_event_config(), 0xff, "unchanged by a refused set");

        assert_eq!(current(&f, FeatureId::VolatileWriteCache), Ok(1));
        let vwc_off = set_features(FeatureId::VolatileWriteCache, 0);
        assert_eq!(
            f.set_feature(&vwc_off).map_err(|s| s.code()),
            Err(Status::FEATURE_NOT_CHANGEABLE)
        );

        let caps = |fid| f.get_feature(&get_features(fid, FeatureSelect::SupportedCapabilities));
        assert_eq!(caps(FeatureId::NumberOfQueues), Ok(1 << 2), "changeable");
        assert_eq!(caps(FeatureId::VolatileWriteCache), Ok(0));

        let mut saved = set_features(FeatureId::KeepAliveTimer, 1000);
        saved.cdw10 |= 1 << 31;
        assert_eq!(
            f.set_feature(&saved).map_err(|s| s.code()),
            Err(Status::FEATURE_NOT_SAVEABLE)
        );
        let mut reserved_select = get_features(FeatureId::KeepAliveTimer, FeatureSelect::Current);
        reserved_select.cdw10 |= 4 << 8;
        assert!(f.get_feature(&reserved_select).is_err());
        let arbitration = set_features(FeatureId::Arbitration, 0);
        assert_eq!(
            f.set_feature(&arbitration).map_err(|s| s.code()),
            Err(Status::INVALID_FIELD)
        );
        let power = get_features(FeatureId::PowerManagement, FeatureSelect::Current);
        assert_eq!(
            f.get_feature(&power).map_err(|s| s.code()),
            Err(Status::INVALID_FIELD)
        );
    }

    fn smart_log(seed: u8) -> SmartLog {
        let mut log = SmartLog::zeroed();
        log.critical_warning = seed & 0x3;
        log.composite_temperature = (300 + u16::from(seed)).to_le_bytes();
        log.available_spare = 100 - seed;
        log.available_spare_threshold = 10 + seed;
        log.percentage_used = seed * 2;
        log.data_units_read = (1000 * u128::from(seed)).to_le_bytes();
        log.data_units_written = (u128::MAX - 1).to_le_bytes();
        log.host_read_commands = 7u128.to_le_bytes();
        log.host_write_commands = (1u128 << 70).to_le_bytes();
        log.controller_busy_time = 3u128.to_le_bytes();
        log.power_cycles = u128::from(seed).to_le_bytes();
        log.power_on_hours = (100 * u128::from(seed)).to_le_bytes();
        log.unsafe_shutdowns = 1u128.to_le_bytes();
        log.media_errors = u128::from(seed).to_le_bytes();
        log.error_log_entries = 2u128.to_le_bytes();
        log.warning_temperature_time = u32::from(seed);
        log.temperature_sensors[0] = 290;
        log
    }

    #[test]
    fn smart_logs_aggregate() {
        let (a, b) = (smart_log(1), smart_log(2));
        let all = aggregate_smart(&[a, b]);
        assert_eq!(all.critical_warning, 0b11, "OR of 0b01 and 0b10");
        assert_eq!(all.temperature_kelvin(), 302, "the hotter");
        assert_eq!(
            (all.available_spare, all.available_spare_threshold),
            (98, 12),
            "the lower"
        );
        assert_eq!(all.percentage_used, 4);
        assert_eq!(all.data_units_read(), 3000);
        assert_eq!(all.data_units_written(), u128::MAX, "saturates");
        assert_eq!(all.host_read_commands(), 14);
        assert_eq!(all.host_write_commands(), 1 << 71);
        assert_eq!(all.controller_busy_time(), 6);
        assert_eq!(all.power_cycles(), 3);
        assert_eq!(all.power_on_hours(), 200, "the longest");
        assert_eq!(all.unsafe_shutdowns(), 2);
        assert_eq!(all.media_errors(), 3);
        assert_eq!(all.error_log_entries(), 4);
        assert_eq!(all.warning_temperature_time, 2);
        assert_eq!(all.sensor_celsius(1), None, "sensors are per drive");
        assert_eq!(aggregate_smart(&[a]).as_bytes()[..200], a.as_bytes()[..200]);
        assert_eq!(aggregate_smart(&[]), SmartLog::zeroed());
    }

    /// Get Log Page of `lid`: `len` bytes at `offset`.
    fn get_log(lid: u8, nsid: u32, len: u32, offset: u64) -> Sqe {
        Sqe::get_log_page_raw(lid, nsid, len, offset)
    }

    #[test]
    fn log_page_length_and_offset() {
        let sub = subsystem();
        let smart = smart_log(1);
        let mut calls = 0;
        let mut source = || {
            calls += 1;
            smart
        };
        let mut io = |sqe: &Sqe| log_page(&sub, false, sqe, &mut source);

        assert_eq!(
            io(&get_log(2, u32::MAX, 512, 0)).as_deref(),
            Ok(&smart.as_bytes()[..])
        );
        assert_eq!(
            io(&get_log(2, 0, 8, 32)).as_deref(),
            Ok(&smart.as_bytes()[32..40])
        );
        let long = io(&get_log(2, u32::MAX, 1024, 0)).expect("SMART");
        assert_eq!((&long[..512], long.len()), (&smart.as_bytes()[..], 1024));
        assert!(long[512..].iter().all(|&b| b == 0), "past the log: zeroes");
        assert_eq!(
            io(&get_log(2, u32::MAX, 4, 512)),
            Ok(vec![0; 4]),
            "at its end: zeroes"
        );
        let code = |r: Result<Vec<u8>, Status>| r.map(|_| ()).map_err(|s| s.code());
        assert_eq!(
            code(io(&get_log(2, u32::MAX, 4, 516))),
            Err(Status::INVALID_FIELD)
        );
        assert_eq!(
            code(io(&get_log(2, u32::MAX, 4, 1 << 40))),
            Err(Status::INVALID_FIELD)
        );
        assert_eq!(
            code(io(&get_log(2, u32::MAX, 8, 2))),
            Err(Status::INVALID_FIELD),
            "unaligned"
        );
        assert_eq!(
            code(io(&get_log(2, 1, 512, 0))),
            Err(Status::INVALID_FIELD),
            "per namespace"
        );
        // NUMD at its largest (16 GiB): refused before anything is allocated
        let mut huge = get_log(2, u32::MAX, 4, 0);
        huge.cdw10 |= 0xffff << 16;
        huge.cdw11 = 0xffff;
        assert_eq!(code(io(&huge)), Err(Status::INVALID_FIELD));
        assert_eq!(
            code(io(&get_log(2, u32::MAX, (MAX_LOG_BYTES + 4) as u32, 0))),
            Err(Status::INVALID_FIELD)
        );

        assert_eq!(
            io(&get_log(1, 0, 64, 0)),
            Ok(vec![0; 64]),
            "no errors recorded"
        );
        assert_eq!(
            io(&get_log(1, 0, 4096, 0)),
            Ok(vec![0; 4096]),
            "as long as asked"
        );
        let fw = io(&get_log(3, 0, 512, 0)).expect("firmware slots");
        assert_eq!((fw[0], &fw[8..16]), (1, &b"0.1.0   "[..]));
        assert_eq!(
            code(io(&get_log(0x70, 0, 1024, 0))),
            Err(Status::INVALID_LOG_PAGE)
        );
        assert_eq!(
            code(io(&get_log(0x05, 0, 4096, 0))),
            Err(Status::INVALID_LOG_PAGE)
        );
        assert_eq!(
            calls, 4,
            "SMART asked for by each read of it past the NUMD, NSID and offset checks"
        );

        // the discovery controller has only the discovery log
        let disc = |sqe: &Sqe| log_page(&sub, true, sqe, &mut no_smart);
        assert_eq!(
            code(disc(&get_log(2, u32::MAX, 512, 0))),
            Err(Status::INVALID_LOG_PAGE)
        );
        // longer than the log: the log, then zeroes
        let log = disc(&get_log(0x70, 0, 8192, 0)).expect("discovery log");
        assert_eq!(log.len(), 8192);
        assert_eq!(log[..3072], discovery_log(&sub)[..]);
        assert!(log[3072..].iter().all(|&b| b == 0));
        // a length that needs NUMDU (NUMD 10000h) is beyond the admin buffer
        let big = get_log(0x70, 0, 0x4_0004, 0);
        assert_eq!((big.cdw10 >> 16, big.cdw11), (0, 1));
        assert_eq!(code(disc(&big)), Err(Status::INVALID_FIELD));
        // the entries alone, then the header alone, as libnvme reads them
        let entries = disc(&get_log(0x70, 0, 2048, 1024)).expect("entries");
        assert_eq!(entries[..], discovery_log(&sub)[1024..]);
        let header = disc(&get_log(0x70, 0, 16, 0)).expect("header");
        assert_eq!((le64(&header, 0), le64(&header, 8)), (1, 2));
    }

    /// What Linux 6.1's nvmet writes for one TCP port (`discovery.c`,
    /// `nvmet_format_discovery_entry`; `nvme discover` against it in the bed prints the same):
    /// the current discovery subsystem first, then the NVM subsystem, both at the port asked on.
    #[test]
    fn the_discovery_log_is_what_nvmet_writes_field_by_field() {
        let sub = subsystem();
        // (field, its first byte in an entry, the current discovery subsystem's bytes, the NVM
        // subsystem's); ADRFAM and PORTID are the port's, checked per port below
        type Field = (&'static str, usize, &'static [u8], &'static [u8]);
        let nvmet: [Field; 6] = [
            ("TRTYPE tcp", 0, &[3], &[3]),
            ("SUBTYPE current discovery / nvme subsystem", 2, &[3], &[2]),
            (
                "TREQ not specified, sq flow control disable supported",
                3,
                &[4],
                &[4],
            ),
            ("CNTLID dynamic", 6, &[0xff, 0xff], &[0xff, 0xff]),
            ("ASQSZ 32", 8, &[32, 0], &[32, 0]),
            ("EFLAGS none", 10, &[0, 0], &[0, 0]),
        ];
        for (port, adrfam, trsvcid, traddr) in [
            (0, 1u8, "4420", "192.0.2.10"),
            (1, 2, "4421", "2001:db8::1"),
        ] {
            let asker = DiscoveryAsker {
                port: &sub.listeners[port],
                host_allowed: true,
            };
            let log = discovery_log_for(&sub, asker);
            assert_eq!(log.len(), 3 * 1024);
            assert_eq!(le64(&log, 0), 1, "GENCTR");
            assert_eq!(le64(&log, 8), 2, "NUMREC");
            assert_eq!(le16(&log, 16), 0, "RECFMT");
            assert!(log[18..1024].iter().all(|&b| b == 0));
            for (i, subnqn) in [DISCOVERY_NQN_FOR_TEST, "nqn.2024-01.io.usnvme:test"]
                .into_iter()
                .enumerate()
            {
                let e = &log[1024 * (i + 1)..1024 * (i + 2)];
                for (field, at, current, nvme) in nvmet {
                    let want = if i == 0 { current } else { nvme };
                    assert_eq!(&e[at..at + want.len()], want, "{field} (entry {i})");
                }
                assert_eq!(e[1], adrfam, "ADRFAM (entry {i})");
                assert_eq!(le16(e, 4), port as u16 + 1, "PORTID (entry {i})");
                assert!(e[12..32].iter().all(|&b| b == 0), "reserved");
                assert_eq!(
                    &e[32..64],
                    format!("{trsvcid:<32}").as_bytes(),
                    "TRSVCID, space padded"
                );
                assert!(e[64..256].iter().all(|&b| b == 0), "reserved");
                assert_eq!(c_string(&e[256..512]), subnqn, "SUBNQN");
                assert!(e[256 + subnqn.len()..512].iter().all(|&b| b == 0));
                assert_eq!(
                    &e[512..768],
                    format!("{traddr:<256}").as_bytes(),
                    "TRADDR, space padded"
                );
                assert!(e[768..1024].iter().all(|&b| b == 0), "TSAS: SECTYPE none");
            }
        }
        // a host that may not use the subsystem sees the discovery subsystem alone (nvmet
        // skips subsystems whose allowed hosts exclude it)
        let stranger = DiscoveryAsker {
            port: &sub.listeners[0],
            host_allowed: false,
        };
        let log = discovery_log_for(&sub, stranger);
        assert_eq!((log.len(), le64(&log, 8)), (2048, 1));
        assert_eq!(
            (log[1024 + 2], c_string(&log[1024 + 256..1536])),
            (3, DISCOVERY_NQN_FOR_TEST)
        );
    }

    const DISCOVERY_NQN_FOR_TEST: &str = "nqn.2014-08.org.nvmexpress.discovery";

    /// A 64-byte Fabrics command with `fctype` and the given bytes from byte 40 on.
    fn fabrics(fctype: u8, tail: &[(usize, &[u8])]) -> Sqe {
        let mut bytes = [0u8; 64];
        bytes[0] = 0x7f;
        bytes[2..4].copy_from_slice(&0x1234u16.to_le_bytes());
        bytes[4] = fctype;
        for (at, field) in tail {
            bytes[*at..*at + field.len()].copy_from_slice(field);
        }
        Sqe::from_bytes(&bytes)
    }

    #[test]
    fn fabrics_commands_decode_at_their_byte_offsets() {
        let connect = fabrics(
            0x01,
            &[
                (42, &3u16.to_le_bytes()),
                (44, &127u16.to_le_bytes()),
                (46, &[0x04]),
                (48, &15_000u32.to_le_bytes()),
            ],
        );
        let expected = ConnectCommand {
            recfmt: 0,
            qid: 3,
            sqsize: 127,
            cattr: 0x04,
            kato: 15_000,
        };
        assert_eq!(
            FabricsCommand::from_sqe(&connect),
            Ok(FabricsCommand::Connect(expected))
        );
        assert_eq!(ConnectCommand::from_sqe(&connect), Ok(expected));
        let format1 = fabrics(0x01, &[(40, &1u16.to_le_bytes())]);
        let refused = FabricsCommand::from_sqe(&format1).expect_err("RECFMT 1");
        assert_eq!(refused.code(), Status::CONNECT_INCOMPATIBLE_FORMAT);
        assert!(refused.dnr());

        let set = fabrics(
            0x00,
            &[
                (40, &[1]),
                (44, &0x14u32.to_le_bytes()),
                (48, &0x0123_4567_89ab_cdefu64.to_le_bytes()),
            ],
        );
        assert_eq!(
            FabricsCommand::from_sqe(&set),
            Ok(FabricsCommand::PropertySet {
                offset: 0x14,
                eight_bytes: true,
                value: 0x0123_4567_89ab_cdef,
            })
        );
        let get = fabrics(0x04, &[(40, &[0]), (44, &0x1cu32.to_le_bytes())]);
        assert_eq!(
            FabricsCommand::from_sqe(&get),
            Ok(FabricsCommand::PropertyGet {
                offset: 0x1c,
                eight_bytes: false,
            })
        );
        let reserved_size = fabrics(0x04, &[(40, &[3])]);
        assert_eq!(
            FabricsCommand::from_sqe(&reserved_size).map_err(|s| s.code()),
            Err(Status::INVALID_FIELD)
        );
        assert_eq!(
            FabricsCommand::from_sqe(&fabrics(0x08, &[])),
            Ok(FabricsCommand::Disconnect)
        );
        for unserved in [0x05, 0x06, 0x02, 0xff] {
            assert_eq!(
                FabricsCommand::from_sqe(&fabrics(unserved, &[])).map_err(|s| s.code()),
                Err(Status::INVALID_OPCODE)
            );
        }
        let not_fabrics = Sqe::identify(Cns::Controller, 0);
        assert_eq!(
            FabricsCommand::from_sqe(&not_fabrics).map_err(|s| s.code()),
            Err(Status::INVALID_OPCODE)
        );
        assert!(
            ConnectCommand::from_sqe(&get).is_err(),
            "a Property Get is no Connect"
        );
    }

    fn connect_data(subnqn: &[u8], hostnqn: &[u8]) -> Vec<u8> {
        let mut data = vec![0u8; 1024];
        data[..16].copy_from_slice(&[0x11; 16]);
        data[16..18].copy_from_slice(&0xffffu16.to_le_bytes());
        data[256..256 + subnqn.len()].copy_from_slice(subnqn);
        data[512..512 + hostnqn.len()].copy_from_slice(hostnqn);
        data
    }

    #[test]
    fn connect_data_parsing() {
        let host = b"nqn.2014-08.org.nvmexpress:uuid:0f0e0d0c";
        let data = ConnectData::parse(&connect_data(b"nqn.2024-01.io.usnvme:test", host))
            .expect("valid data");
        assert_eq!(data.hostid, [0x11; 16]);
        assert_eq!(data.cntlid, 0xffff);
        assert_eq!(data.subnqn, "nqn.2024-01.io.usnvme:test");
        assert_eq!(data.hostnqn, "nqn.2014-08.org.nvmexpress:uuid:0f0e0d0c");

        let refused = |bytes: &[u8]| ConnectData::parse(bytes).map(|_| ()).map_err(|s| s.code());
        // an NQN filling its 256 bytes has no NUL
        assert_eq!(
            refused(&connect_data(&[b'a'; 256], host)),
            Err(Status::CONNECT_INVALID_PARAMETERS)
        );
        assert_eq!(
            refused(&connect_data(
                b"nqn.2024-01.io.usnvme:test",
                b"nqn.\xff\xfe"
            )),
            Err(Status::CONNECT_INVALID_PARAMETERS),
            "not UTF-8"
        );
        assert_eq!(
            refused(&connect_data(b"", host)),
            Err(Status::CONNECT_INVALID_PARAMETERS)
        );
        let mut short = connect_data(b"nqn.a", host);
        short.truncate(768);
        assert_eq!(refused(&short), Err(Status::DATA_SGL_LENGTH_INVALID));
        assert_eq!(refused(&[]), Err(Status::DATA_SGL_LENGTH_INVALID));
        assert!(ConnectData::parse(&[0; 1024]).expect_err("empty").dnr());
    }

    #[test]
    fn execute_dispatches_per_controller_type() {
        let sub = subsystem();
        let mut features = Features::new(&sub);
        let run = |discovery: bool, sqe: &Sqe, features: &mut Features| {
            execute(&sub, 5, discovery, features, sqe, &mut || smart_log(1))
        };

        let (dw0, page) = run(true, &Sqe::identify(Cns::Controller, 0), &mut features).expect("id");
        assert_eq!((dw0, page.len(), page[111]), (0, 4096, 2));
        let (_, log) = run(true, &get_log(0x70, 0, 3072, 0), &mut features).expect("log");
        assert_eq!(log, discovery_log(&sub));
        let kato = set_features(FeatureId::KeepAliveTimer, 120_000);
        assert_eq!(run(true, &kato, &mut features), Ok((0, Vec::new())));
        let queues = Sqe::set_num_queues(4, 4);
        assert_eq!(
            run(true, &queues, &mut features).map_err(|s| s.code()),
            Err(Status::INVALID_FIELD),
            "no I/O queues on the discovery controller"
        );
        assert_eq!(
            run(true, &Sqe::abort(0, 1), &mut features).map_err(|s| s.code()),
            Err(Status::INVALID_OPCODE)
        );

        assert_eq!(
            run(false, &queues, &mut features),
            Ok((0x0003_0003, Vec::new()))
        );
        let (_, smart) = run(false, &get_log(2, u32::MAX, 512, 0), &mut features).expect("SMART");
        assert_eq!(smart, smart_log(1).as_bytes());
        assert_eq!(
            run(false, &Sqe::abort(0, 1), &mut features),
            Ok((1, Vec::new())),
            "not aborted"
        );
        let create = Sqe::create_io_sq(
            1,
            64,
            0,
            1,
            usnvme_driver::spec::command::QueuePriority::Low,
        );
        assert_eq!(
            run(false, &create, &mut features).map_err(|s| s.code()),
            Err(Status::INVALID_OPCODE),
            "queues come from Connect on fabrics"
        );
        let (_, ns) = run(false, &Sqe::identify(Cns::Namespace, 3), &mut features).expect("ns");
        assert_eq!(le64(&ns, 0), 1000);
    }
}
