//! Identify data structures (NVMe Base 2.0, section 5.17.2; NVM Command Set 1.0, section 4.1.5).

use core::fmt;
use core::mem::offset_of;
use zerocopy::{FromBytes, Immutable, IntoBytes};

use super::ascii_field;
use super::registers::Vs;
use crate::protection::{Guard, PiFormat, PiType};

spec_flags! {
    /// Optional Admin Command Support (OACS) of Identify Controller.
    pub struct Oacs(u16) {
        SECURITY = 0 => "Security Send/Receive",
        FORMAT_NVM = 1 => "Format NVM",
        FIRMWARE = 2 => "Firmware Download/Commit",
        NS_MANAGEMENT = 3 => "Namespace Management",
        DEVICE_SELF_TEST = 4 => "Device Self-test",
        DIRECTIVES = 5 => "Directives",
        NVME_MI = 6 => "NVMe-MI Send/Receive",
        VIRTUALIZATION_MANAGEMENT = 7 => "Virtualization Management",
        DOORBELL_BUFFER_CONFIG = 8 => "Doorbell Buffer Config",
        GET_LBA_STATUS = 9 => "Get LBA Status",
        LOCKDOWN = 10 => "Command and Feature Lockdown",
    }
}

spec_flags! {
    /// Optional NVM Command Support (ONCS) of Identify Controller.
    pub struct Oncs(u16) {
        COMPARE = 0 => "Compare",
        WRITE_UNCORRECTABLE = 1 => "Write Uncorrectable",
        DATASET_MANAGEMENT = 2 => "Dataset Management",
        WRITE_ZEROES = 3 => "Write Zeroes",
        SAVE_SELECT = 4 => "Save and Select in Set/Get Features",
        RESERVATIONS = 5 => "Reservations",
        TIMESTAMP = 6 => "Timestamp",
        VERIFY = 7 => "Verify",
        COPY = 8 => "Copy",
    }
}

/// SGL support of the NVM command set (SGLS bits 1:0).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SglSupport {
    /// SGLs are not supported: use PRPs.
    Unsupported,
    /// SGLs are supported with any byte alignment and granularity.
    Any,
    /// SGLs are supported; data blocks must be dword aligned and sized.
    DwordAligned,
    /// The reserved value 11b.
    Reserved,
}

/// CTRATT: Traffic Based Keep Alive Support — a command completed on any queue of the
/// controller counts as a Keep Alive, so a host whose I/O flows need send none.
pub const CTRATT_TBKAS: u32 = 1 << 6;

/// Identify Controller data structure (CNS 01h). Fields carry the specification's mnemonics;
/// `rsvd<offset>` fields are reserved.
#[repr(C)]
#[derive(Clone, Copy, PartialEq, Eq, FromBytes, IntoBytes, Immutable)]
pub struct IdentifyController {
    pub vid: u16,      // PCI Vendor ID
    pub ssvid: u16,    // PCI Subsystem Vendor ID
    pub sn: [u8; 20],  // Serial Number (ASCII, space padded)
    pub mn: [u8; 40],  // Model Number (ASCII, space padded)
    pub fr: [u8; 8],   // Firmware Revision (ASCII, space padded)
    pub rab: u8,       // Recommended Arbitration Burst
    pub ieee: [u8; 3], // IEEE OUI Identifier
    pub cmic: u8,      // Controller Multi-Path I/O and Namespace Sharing Capabilities
    pub mdts: u8,      // Maximum Data Transfer Size: `2 ^ mdts` minimum pages; 0 means no limit
    pub cntlid: u16,   // Controller ID
    pub ver: u32,      // Version
    pub rtd3r: u32,    // RTD3 Resume Latency (microseconds)
    pub rtd3e: u32,    // RTD3 Entry Latency (microseconds)
    pub oaes: u32,     // Optional Asynchronous Events Supported
    pub ctratt: u32,   // Controller Attributes (CTRATT_*)
    pub rrls: u16,     // Read Recovery Levels Supported
    rsvd102: [u8; 9],
    pub cntrltype: u8,   // Controller Type (1 I/O, 2 discovery, 3 administrative)
    pub fguid: [u8; 16], // FRU Globally Unique Identifier
    pub crdt: [u16; 3],  // Command Retry Delay Times 1..3, in 100 ms units
    rsvd134: [u8; 119],
    pub nvmsr: u8,         // NVM Subsystem Report
    pub vwci: u8,          // VPD Write Cycle Information
    pub mec: u8,           // Management Endpoint Capabilities
    pub oacs: u16,         // Optional Admin Command Support; see [`Oacs`]
    pub acl: u8,           // Abort Command Limit (0's based)
    pub aerl: u8,          // Asynchronous Event Request Limit (0's based)
    pub frmw: u8,          // Firmware Updates
    pub lpa: u8,           // Log Page Attributes
    pub elpe: u8,          // Error Log Page Entries (0's based)
    pub npss: u8,          // Number of Power States Support (0's based)
    pub avscc: u8,         // Admin Vendor Specific Command Configuration
    pub apsta: u8,         // Autonomous Power State Transition Attributes
    pub wctemp: u16,       // Warning Composite Temperature Threshold (kelvin)
    pub cctemp: u16,       // Critical Composite Temperature Threshold (kelvin)
    pub mtfa: u16,         // Maximum Time for Firmware Activation (100 ms units)
    pub hmpre: u32,        // Host Memory Buffer Preferred Size (4 KiB units)
    pub hmmin: u32,        // Host Memory Buffer Minimum Size (4 KiB units)
    pub tnvmcap: [u8; 16], // Total NVM Capacity in bytes (128-bit little-endian)
    pub unvmcap: [u8; 16], // Unallocated NVM Capacity in bytes (128-bit little-endian)
    pub rpmbs: u32,        // Replay Protected Memory Block Support
    pub edstt: u16,        // Extended Device Self-test Time (minutes)
    pub dsto: u8,          // Device Self-test Options
    pub fwug: u8,          // Firmware Update Granularity (4 KiB units)
    pub kas: u16,          // Keep Alive Support (100 ms units)
    pub hctma: u16,        // Host Controlled Thermal Management Attributes
    pub mntmt: u16,        // Minimum Thermal Management Temperature
    pub mxtmt: u16,        // Maximum Thermal Management Temperature
    pub sanicap: u32,      // Sanitize Capabilities
    pub hmminds: u32,      // Host Memory Buffer Minimum Descriptor Entry Size
    pub hmmaxd: u16,       // Host Memory Maximum Descriptors Entries
    pub nsetidmax: u16,    // NVM Set Identifier Maximum
    pub endgidmax: u16,    // Endurance Group Identifier Maximum
    pub anatt: u8,         // ANA Transition Time
    pub anacap: u8,        // Asymmetric Namespace Access Capabilities
    pub anagrpmax: u32,    // ANA Group Identifier Maximum
    pub nanagrpid: u32,    // Number of ANA Group Identifiers
    pub pels: u32,         // Persistent Event Log Size (64 KiB units)
    pub domainid: u16,     // Domain Identifier
    rsvd358: [u8; 10],
    pub megcap: [u8; 16], // Max Endurance Group Capacity
    rsvd384: [u8; 128],
    pub sqes: u8, // Submission Queue Entry Size: required (3:0) and maximum (7:4), log2 of bytes
    pub cqes: u8, // Completion Queue Entry Size: required (3:0) and maximum (7:4), log2 of bytes
    pub maxcmd: u16, // Maximum Outstanding Commands (fabrics)
    pub nn: u32,  // Number of Namespaces: the largest valid namespace ID
    pub oncs: u16, // Optional NVM Command Support; see [`Oncs`]
    pub fuses: u16, // Fused Operation Support
    pub fna: u8,  // Format NVM Attributes
    pub vwc: u8,  // Volatile Write Cache
    pub awun: u16, // Atomic Write Unit Normal (0's based, blocks)
    pub awupf: u16, // Atomic Write Unit Power Fail (0's based, blocks)
    pub icsvscc: u8, // I/O Command Set Vendor Specific Command Configuration
    pub nwpc: u8, // Namespace Write Protection Capabilities
    pub acwu: u16, // Atomic Compare & Write Unit
    pub ocfs: u16, // Optional Copy Formats Supported
    pub sgls: u32, // SGL Support; see [`IdentifyController::sgl_support`]
    pub mnan: u32, // Maximum Number of Allowed Namespaces
    pub maxdna: [u8; 16], // Maximum Domain Namespace Attachments
    pub maxcna: u32, // Maximum I/O Controller Namespace Attachments
    rsvd564: [u8; 204],
    pub subnqn: [u8; 256], // NVM Subsystem NVMe Qualified Name (UTF-8, NUL padded)
    rsvd1024: [u8; 768],
    // NVMe over Fabrics attributes (NVMe over Fabrics 1.1, Identify Controller fields)
    pub ioccsz: u32, // I/O Queue Command Capsule Supported Size (16-byte units, SQE included)
    pub iorcsz: u32, // I/O Queue Response Capsule Supported Size (16-byte units)
    pub icdoff: u16, // In Capsule Data Offset (16-byte units after the SQE)
    pub fcatt: u8,   // Fabrics Controller Attributes (bit 0: static controller model)
    pub msdbd: u8,   // Maximum SGL Data Block Descriptors (0: no limit)
    pub ofcs: u16,   // Optional Fabric Commands Support (bit 0: Disconnect)
    rsvd1806: [u8; 242],
    pub psd: [[u8; 32]; 32], // Power State Descriptors 0..31
    pub vs: [u8; 1024],      // Vendor Specific
}

const _: () = {
    assert!(offset_of!(IdentifyController, sn) == 4);
    assert!(offset_of!(IdentifyController, mn) == 24);
    assert!(offset_of!(IdentifyController, fr) == 64);
    assert!(offset_of!(IdentifyController, mdts) == 77);
    assert!(offset_of!(IdentifyController, ver) == 80);
    assert!(offset_of!(IdentifyController, cntrltype) == 111);
    assert!(offset_of!(IdentifyController, crdt) == 128);
    assert!(offset_of!(IdentifyController, oacs) == 256);
    assert!(offset_of!(IdentifyController, wctemp) == 266);
    assert!(offset_of!(IdentifyController, tnvmcap) == 280);
    assert!(offset_of!(IdentifyController, sanicap) == 328);
    assert!(offset_of!(IdentifyController, megcap) == 368);
    assert!(offset_of!(IdentifyController, sqes) == 512);
    assert!(offset_of!(IdentifyController, nn) == 516);
    assert!(offset_of!(IdentifyController, oncs) == 520);
    assert!(offset_of!(IdentifyController, vwc) == 525);
    assert!(offset_of!(IdentifyController, sgls) == 536);
    assert!(offset_of!(IdentifyController, maxcna) == 560);
    assert!(offset_of!(IdentifyController, subnqn) == 768);
    assert!(offset_of!(IdentifyController, ioccsz) == 1792);
    assert!(offset_of!(IdentifyController, iorcsz) == 1796);
    assert!(offset_of!(IdentifyController, icdoff) == 1800);
    assert!(offset_of!(IdentifyController, fcatt) == 1802);
    assert!(offset_of!(IdentifyController, msdbd) == 1803);
    assert!(offset_of!(IdentifyController, ofcs) == 1804);
    assert!(offset_of!(IdentifyController, psd) == 2048);
    assert!(offset_of!(IdentifyController, vs) == 3072);
};

impl IdentifyController {
    /// Serial Number, trimmed.
    pub fn serial(&self) -> String {
        ascii_field(&self.sn)
    }

    /// Model Number, trimmed.
    pub fn model(&self) -> String {
        ascii_field(&self.mn)
    }

    /// Firmware Revision, trimmed.
    pub fn firmware(&self) -> String {
        ascii_field(&self.fr)
    }

    /// NVM Subsystem NVMe Qualified Name.
    pub fn subnqn(&self) -> String {
        ascii_field(&self.subnqn)
    }

    /// The version the controller implements (0.0.0 before NVMe 1.2).
    pub const fn version(&self) -> Vs {
        Vs(self.ver)
    }

    /// Maximum data transfer size in bytes, given CAP's minimum page size; `None` when the
    /// controller sets no limit (MDTS 0) or the limit does not fit in 64 bits.
    pub const fn mdts_bytes(&self, min_page_size: u64) -> Option<u64> {
        if self.mdts == 0 || self.mdts >= 64 {
            return None;
        }
        min_page_size.checked_mul(1 << self.mdts)
    }

    /// Optional Admin Command Support.
    pub const fn oacs(&self) -> Oacs {
        Oacs(self.oacs)
    }

    /// Optional NVM Command Support.
    pub const fn oncs(&self) -> Oncs {
        Oncs(self.oncs)
    }

    /// Whether and how the NVM command set supports SGLs.
    pub const fn sgl_support(&self) -> SglSupport {
        match self.sgls & 3 {
            0 => SglSupport::Unsupported,
            1 => SglSupport::Any,
            2 => SglSupport::DwordAligned,
            _ => SglSupport::Reserved,
        }
    }

    /// A volatile write cache is present (Flush matters).
    pub const fn vwc_present(&self) -> bool {
        self.vwc & 1 != 0
    }

    /// Required and maximum submission queue entry sizes, log2 of bytes.
    pub const fn sqes_range(&self) -> (u8, u8) {
        (self.sqes & 0xf, self.sqes >> 4)
    }

    /// Required and maximum completion queue entry sizes, log2 of bytes.
    pub const fn cqes_range(&self) -> (u8, u8) {
        (self.cqes & 0xf, self.cqes >> 4)
    }

    /// Total NVM Capacity in bytes (0 when not reported).
    pub const fn total_capacity(&self) -> u128 {
        u128::from_le_bytes(self.tnvmcap)
    }
}

impl fmt::Debug for IdentifyController {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("IdentifyController")
            .field("vid", &format_args!("{:#06x}", self.vid))
            .field("sn", &self.serial())
            .field("mn", &self.model())
            .field("fr", &self.firmware())
            .field("ver", &format_args!("{}", self.version()))
            .field("mdts", &self.mdts)
            .field("cntlid", &self.cntlid)
            .field("oacs", &format_args!("{:#x}", self.oacs))
            .field("nn", &self.nn)
            .field("oncs", &format_args!("{:#x}", self.oncs))
            .field("vwc", &self.vwc)
            .field("sgls", &format_args!("{:#x}", self.sgls))
            .field("subnqn", &self.subnqn())
            .finish_non_exhaustive()
    }
}

/// An LBA Format descriptor.
#[repr(C)]
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash, FromBytes, IntoBytes, Immutable)]
pub struct LbaFormat {
    /// Metadata Size in bytes per block.
    pub ms: u16,
    /// LBA Data Size: blocks are `2 ^ lbads` bytes (9 or more when the format is valid).
    pub lbads: u8,
    /// Relative Performance (bits 1:0, 0 best).
    pub rp: u8,
}

impl LbaFormat {
    /// A format with `2 ^ lbads`-byte blocks and `ms` bytes of metadata.
    pub const fn new(lbads: u8, ms: u16) -> LbaFormat {
        LbaFormat { ms, lbads, rp: 0 }
    }

    /// Block size in bytes; `None` for an unused or invalid format (LBADS below 9 or absurd).
    pub const fn data_size(&self) -> Option<u64> {
        if self.lbads < 9 || self.lbads >= 64 {
            return None;
        }
        Some(1 << self.lbads)
    }
}

/// Identify Namespace data structure of the NVM command set (CNS 00h), fields named by the
/// specification's mnemonics.
#[repr(C)]
#[derive(Clone, Copy, PartialEq, Eq, FromBytes, IntoBytes, Immutable)]
pub struct IdentifyNamespace {
    pub nsze: u64,        // Namespace Size in blocks
    pub ncap: u64,        // Namespace Capacity in blocks
    pub nuse: u64,        // Namespace Utilization in blocks
    pub nsfeat: u8,       // Namespace Features
    pub nlbaf: u8,        // Number of LBA Formats (0's based)
    pub flbas: u8,        // Formatted LBA Size; see [`IdentifyNamespace::formatted_lba_index`]
    pub mc: u8,           // Metadata Capabilities
    pub dpc: u8,          // End-to-end Data Protection Capabilities
    pub dps: u8,          // End-to-end Data Protection Type Settings
    pub nmic: u8,         // Namespace Multi-path I/O and Namespace Sharing Capabilities
    pub rescap: u8,       // Reservation Capabilities
    pub fpi: u8,          // Format Progress Indicator
    pub dlfeat: u8,       // Deallocate Logical Block Features
    pub nawun: u16,       // Namespace Atomic Write Unit Normal
    pub nawupf: u16,      // Namespace Atomic Write Unit Power Fail
    pub nacwu: u16,       // Namespace Atomic Compare & Write Unit
    pub nabsn: u16,       // Namespace Atomic Boundary Size Normal
    pub nabo: u16,        // Namespace Atomic Boundary Offset
    pub nabspf: u16,      // Namespace Atomic Boundary Size Power Fail
    pub noiob: u16,       // Namespace Optimal I/O Boundary (blocks)
    pub nvmcap: [u8; 16], // NVM Capacity in bytes (128-bit little-endian)
    pub npwg: u16,        // Namespace Preferred Write Granularity (0's based, blocks)
    pub npwa: u16,        // Namespace Preferred Write Alignment (0's based, blocks)
    pub npdg: u16,        // Namespace Preferred Deallocate Granularity
    pub npda: u16,        // Namespace Preferred Deallocate Alignment
    pub nows: u16,        // Namespace Optimal Write Size (0's based, blocks)
    pub mssrl: u16,       // Maximum Single Source Range Length (Copy)
    pub mcl: u32,         // Maximum Copy Length
    pub msrc: u8,         // Maximum Source Range Count
    rsvd81: u8,
    pub nulbaf: u8, // Number of Unique Capability LBA Formats
    rsvd83: [u8; 9],
    pub anagrpid: u32, // ANA Group Identifier
    rsvd96: [u8; 3],
    pub nsattr: u8,            // Namespace Attributes
    pub nvmsetid: u16,         // NVM Set Identifier
    pub endgid: u16,           // Endurance Group Identifier
    pub nguid: [u8; 16],       // Namespace Globally Unique Identifier
    pub eui64: [u8; 8],        // IEEE Extended Unique Identifier
    pub lbaf: [LbaFormat; 64], // LBA Formats 0..63
    pub vs: [u8; 3712],        // Vendor Specific
}

const _: () = {
    assert!(offset_of!(IdentifyNamespace, nsfeat) == 24);
    assert!(offset_of!(IdentifyNamespace, flbas) == 26);
    assert!(offset_of!(IdentifyNamespace, noiob) == 46);
    assert!(offset_of!(IdentifyNamespace, nvmcap) == 48);
    assert!(offset_of!(IdentifyNamespace, nows) == 72);
    assert!(offset_of!(IdentifyNamespace, mcl) == 76);
    assert!(offset_of!(IdentifyNamespace, nulbaf) == 82);
    assert!(offset_of!(IdentifyNamespace, anagrpid) == 92);
    assert!(offset_of!(IdentifyNamespace, nsattr) == 99);
    assert!(offset_of!(IdentifyNamespace, nguid) == 104);
    assert!(offset_of!(IdentifyNamespace, eui64) == 120);
    assert!(offset_of!(IdentifyNamespace, lbaf) == 128);
    assert!(offset_of!(IdentifyNamespace, vs) == 384);
};

impl IdentifyNamespace {
    /// Number of LBA formats the namespace supports (NLBAF + 1).
    pub const fn number_of_lba_formats(&self) -> usize {
        self.nlbaf as usize + 1
    }

    /// Index of the format in use: FLBAS bits 3:0, with bits 6:5 as the high bits when there
    /// are more than 16 formats.
    pub const fn formatted_lba_index(&self) -> usize {
        let low = (self.flbas & 0xf) as usize;
        if self.nlbaf > 16 {
            low | ((((self.flbas >> 5) & 3) as usize) << 4)
        } else {
            low
        }
    }

    /// The LBA format in use.
    pub fn lba_format(&self) -> Option<LbaFormat> {
        self.lbaf.get(self.formatted_lba_index()).copied()
    }

    /// Block size in bytes; `None` for an inactive namespace or an invalid format.
    pub fn lba_size_bytes(&self) -> Option<u64> {
        self.lba_format().and_then(|f| f.data_size())
    }

    /// Metadata bytes per block in the format in use.
    pub fn metadata_size(&self) -> u16 {
        self.lba_format().map_or(0, |f| f.ms)
    }

    /// Metadata is transferred at the end of each block's data (FLBAS bit 4) rather than in a
    /// separate buffer.
    pub const fn metadata_extended(&self) -> bool {
        self.flbas & 0x10 != 0
    }

    /// The protection information type and place of the format in use (DPS), if any; the
    /// guard's width comes from [`nvm_format_guard`].
    pub fn protection(&self, guard: Guard) -> Option<PiFormat> {
        let pi_type = match self.dps & 7 {
            1 => PiType::Type1,
            2 => PiType::Type2,
            3 => PiType::Type3,
            _ => return None,
        };
        Some(PiFormat {
            pi_type,
            guard,
            first: self.dps & 8 != 0,
        })
    }

    /// Namespace size in bytes (NSZE times the block size).
    pub fn capacity_bytes(&self) -> Option<u64> {
        self.lba_size_bytes()
            .and_then(|size| self.nsze.checked_mul(size))
    }
}

/// The guard of LBA format `index` as the NVM Command Set's own Identify Namespace (CNS 05h,
/// CSI 00h; its bytes in `data`) gives it in the format's extended LBA format: PIF (ELBAF bits
/// 8:7) 0 is 16 bits, 2 is 64 bits; None for 32 bits (PIF 1), reserved values or short data.
pub fn nvm_format_guard(data: &[u8], index: usize) -> Option<Guard> {
    let at = 12 + 4 * index;
    let elbaf = u32::from_le_bytes(data.get(at..at + 4)?.try_into().ok()?);
    match (elbaf >> 7) & 3 {
        0 => Some(Guard::Crc16),
        2 => Some(Guard::Crc64),
        _ => None,
    }
}

impl fmt::Debug for IdentifyNamespace {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let formats = &self.lbaf[..self.number_of_lba_formats().min(self.lbaf.len())];
        f.debug_struct("IdentifyNamespace")
            .field("nsze", &self.nsze)
            .field("ncap", &self.ncap)
            .field("nuse", &self.nuse)
            .field("nsfeat", &self.nsfeat)
            .field("nlbaf", &self.nlbaf)
            .field("flbas", &self.flbas)
            .field("dlfeat", &self.dlfeat)
            .field("noiob", &self.noiob)
            .field("lbaf", &formats)
            .finish_non_exhaustive()
    }
}

/// A namespace ID list (CNS 02h): ascending IDs, ended by the first zero.
#[repr(C)]
#[derive(Clone, Copy, PartialEq, Eq, FromBytes, IntoBytes, Immutable)]
pub struct NamespaceList {
    /// Namespace identifiers.
    pub ids: [u32; 1024],
}

impl NamespaceList {
    /// The namespace IDs in the list.
    pub fn iter(&self) -> impl Iterator<Item = u32> + '_ {
        self.ids.iter().copied().take_while(|&id| id != 0)
    }

    /// A list of the first 1024 of `ids` (for a software controller).
    pub fn from_ids(ids: impl IntoIterator<Item = u32>) -> NamespaceList {
        let mut list = NamespaceList::zeroed();
        for (slot, id) in list.ids.iter_mut().zip(ids) {
            *slot = id;
        }
        list
    }
}

impl fmt::Debug for NamespaceList {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_list().entries(self.iter()).finish()
    }
}

/// A controller list (CNS 12h and 13h; the data of Namespace Attachment): a count, then that
/// many ascending controller IDs (at most 2047).
#[repr(C)]
#[derive(Clone, Copy, PartialEq, Eq, FromBytes, IntoBytes, Immutable)]
pub struct ControllerList {
    pub count: u16,
    pub ids: [u16; 2047],
}

impl ControllerList {
    /// The controller IDs in the list.
    pub fn iter(&self) -> impl Iterator<Item = u16> + '_ {
        self.ids.iter().copied().take(usize::from(self.count))
    }

    /// A list of the first 2047 of `ids`.
    pub fn from_ids(ids: impl IntoIterator<Item = u16>) -> ControllerList {
        let mut list = ControllerList::zeroed();
        for (slot, id) in list.ids.iter_mut().zip(ids) {
            *slot = id;
            list.count += 1;
        }
        list
    }
}

impl fmt::Debug for ControllerList {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_list().entries(self.iter()).finish()
    }
}

pod!(
    IdentifyController = 4096,
    IdentifyNamespace = 4096,
    NamespaceList = 4096,
    ControllerList = 4096,
    LbaFormat = 4
);

#[cfg(test)]
mod tests {
    use super::*;
    use crate::spec::put_ascii;

    #[test]
    fn controller_strings_and_limits() {
        let mut bytes = [0u8; 4096];
        bytes[4..24].copy_from_slice(b"deadbeef            ");
        bytes[24..34].copy_from_slice(b"QEMU NVMe ");
        bytes[64..72].copy_from_slice(b"9.1.\xc30\0\0");
        bytes[77] = 7; // MDTS
        bytes[80..84].copy_from_slice(&0x0001_0400u32.to_le_bytes());
        bytes[256] = 0x0a; // OACS: format, NS management
        bytes[257] = 0x01; // OACS bit 8: doorbell buffer config
        bytes[512] = 0x66;
        bytes[513] = 0x44;
        bytes[516] = 32; // NN
        bytes[520] = 0x0d; // ONCS: compare, DSM, write zeroes
        bytes[525] = 0x07; // VWC
        bytes[536] = 0x01; // SGLS: any alignment
        let id = IdentifyController::from_bytes(&bytes);
        assert_eq!(id.serial(), "deadbeef");
        assert_eq!(id.model(), "QEMU NVMe");
        assert_eq!(id.firmware(), "9.1.?0");
        assert_eq!(id.version().to_string(), "1.4.0");
        assert_eq!(id.mdts_bytes(4096), Some(512 * 1024));
        assert!(id
            .oacs()
            .contains(Oacs::DOORBELL_BUFFER_CONFIG | Oacs::FORMAT_NVM));
        assert!(!id.oacs().contains(Oacs::SECURITY));
        assert_eq!(
            id.oacs().names().collect::<Vec<_>>(),
            [
                "Format NVM",
                "Namespace Management",
                "Doorbell Buffer Config"
            ]
        );
        assert!(id
            .oncs()
            .contains(Oncs::DATASET_MANAGEMENT | Oncs::WRITE_ZEROES | Oncs::COMPARE));
        assert!(!id.oncs().contains(Oncs::WRITE_UNCORRECTABLE));
        assert_eq!(id.nn, 32);
        assert_eq!((id.sqes_range(), id.cqes_range()), ((6, 6), (4, 4)));
        assert!(id.vwc_present());
        assert_eq!(id.sgl_support(), SglSupport::Any);
        assert_eq!(id.as_bytes(), &bytes);
        assert!(format!("{id:?}").contains("deadbeef"));
    }

    #[test]
    fn fabrics_attributes_at_1792() {
        let mut bytes = [0u8; 4096];
        bytes[1792..1796].copy_from_slice(&260u32.to_le_bytes()); // 4 KiB in-capsule data
        bytes[1796..1800].copy_from_slice(&1u32.to_le_bytes());
        bytes[1800..1802].copy_from_slice(&0x0102u16.to_le_bytes());
        bytes[1802] = 1;
        bytes[1803] = 1;
        bytes[1804..1806].copy_from_slice(&1u16.to_le_bytes());
        let id = IdentifyController::from_bytes(&bytes);
        assert_eq!((id.ioccsz, id.iorcsz, id.icdoff), (260, 1, 0x0102));
        assert_eq!((id.fcatt, id.msdbd, id.ofcs), (1, 1, 1));
        assert_eq!(id.as_bytes(), &bytes);
    }

    #[test]
    fn mdts_zero_means_no_limit() {
        let mut id = IdentifyController::zeroed();
        assert_eq!(id.mdts_bytes(4096), None);
        id.mdts = 60;
        assert_eq!(id.mdts_bytes(4096), None);
        id.mdts = 5;
        assert_eq!(id.mdts_bytes(65536), Some(2 * 1024 * 1024));
        assert_eq!(id.sgl_support(), SglSupport::Unsupported);
        put_ascii(&mut id.sn, "SN1");
        assert_eq!(&id.as_bytes()[4..8], b"SN1 ");
    }

    #[test]
    fn namespace_formats() {
        let mut ns = IdentifyNamespace::zeroed();
        assert_eq!(ns.lba_size_bytes(), None);
        ns.nsze = 0x20_0000;
        ns.nlbaf = 1;
        ns.flbas = 0x01;
        ns.lbaf[0] = LbaFormat::new(9, 0);
        ns.lbaf[1] = LbaFormat::new(12, 8);
        assert_eq!(ns.number_of_lba_formats(), 2);
        assert_eq!(ns.formatted_lba_index(), 1);
        assert_eq!(ns.lba_size_bytes(), Some(4096));
        assert_eq!(ns.metadata_size(), 8);
        assert_eq!(ns.capacity_bytes(), Some(8 << 30));
        assert!(!ns.metadata_extended());
        assert_eq!(&ns.as_bytes()[132..136], &[8, 0, 12, 0]);

        // FLBAS bits 6:5 extend the index only with more than 16 formats.
        ns.flbas = 0x22;
        assert_eq!(ns.formatted_lba_index(), 2);
        ns.nlbaf = 20;
        assert_eq!(ns.formatted_lba_index(), 0x12);
        ns.lbaf[0x12] = LbaFormat::new(9, 0);
        assert_eq!(ns.lba_size_bytes(), Some(512));
    }

    #[test]
    fn namespace_list_stops_at_zero() {
        let list = NamespaceList::from_ids([1, 2, 7]);
        assert_eq!(list.iter().collect::<Vec<_>>(), [1, 2, 7]);
        assert_eq!(&list.as_bytes()[8..12], &[7, 0, 0, 0]);
        assert_eq!(NamespaceList::zeroed().iter().count(), 0);
        assert_eq!(format!("{list:?}"), "[1, 2, 7]");
    }
}
