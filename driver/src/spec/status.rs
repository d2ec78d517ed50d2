//! Completion status (NVMe Base 2.0, section 4.2.3; NVM Command Set 1.0, section 3.3.1).

use core::fmt;

/// Status Code Type (SCT).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum StatusCodeType {
    /// 0: Generic Command Status.
    Generic,
    /// 1: Command Specific Status.
    CommandSpecific,
    /// 2: Media and Data Integrity Errors.
    MediaAndDataIntegrity,
    /// 3: Path Related Status.
    PathRelated,
    /// 7: Vendor Specific.
    VendorSpecific,
    /// 4..=6: reserved values.
    Reserved(u8),
}

impl StatusCodeType {
    /// Decodes the 3-bit SCT field.
    pub const fn from_raw(sct: u8) -> StatusCodeType {
        match sct & 7 {
            0 => StatusCodeType::Generic,
            1 => StatusCodeType::CommandSpecific,
            2 => StatusCodeType::MediaAndDataIntegrity,
            3 => StatusCodeType::PathRelated,
            7 => StatusCodeType::VendorSpecific,
            other => StatusCodeType::Reserved(other),
        }
    }

    /// The 3-bit SCT value.
    pub const fn raw(self) -> u8 {
        match self {
            StatusCodeType::Generic => 0,
            StatusCodeType::CommandSpecific => 1,
            StatusCodeType::MediaAndDataIntegrity => 2,
            StatusCodeType::PathRelated => 3,
            StatusCodeType::VendorSpecific => 7,
            StatusCodeType::Reserved(other) => other & 7,
        }
    }
}

/// The 15-bit Status Field of a completion queue entry (the CQE's upper status word without the
/// phase tag): SC in bits 7:0, SCT 10:8, CRD 12:11, More 13, DNR 14.
///
/// The constants hold SCT and SC only; compare a completion's [`Status::code`] with them:
/// `match status.code() { Status::LBA_OUT_OF_RANGE => ..., _ => ... }`.
#[derive(Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct Status(u16);

/// Defines one `Status` constant per code and `Status::name` from the same table. An entry may
/// carry a second constant and name after `|`: the command specific codes 80h and up mean one
/// thing for NVM command set I/O commands and another for Fabrics commands (Connect), and a
/// status word does not say which command it answers.
macro_rules! status_codes {
    ($($sct:literal => {
        $($sc:literal $constant:ident $text:literal $(| $alias:ident $alias_text:literal)?,)*
    })*) => {
        impl Status {
            $($(
                #[doc = $text] pub const $constant: Status = Status::new($sct, $sc);
                $(#[doc = $alias_text] pub const $alias: Status = Status::new($sct, $sc);)?
            )*)*

            /// The specification's name for this SCT/SC pair, or "Unknown status". For a code
            /// with two meanings, the first (see [`Status::alternate_name`]).
            pub const fn name(self) -> &'static str {
                match (self.sct(), self.sc()) {
                    $($(($sct, $sc) => $text,)*)*
                    (7, _) => "Vendor Specific",
                    _ => UNKNOWN,
                }
            }

            /// The other meaning of a command specific code that Fabrics commands use
            /// differently (`CONNECT_INVALID_PARAMETERS` is `WRITE_TO_READ_ONLY_RANGE`).
            pub const fn alternate_name(self) -> Option<&'static str> {
                match (self.sct(), self.sc()) {
                    $($($(($sct, $sc) => Some($alias_text),)?)*)*
                    _ => None,
                }
            }
        }
    };
}

const UNKNOWN: &str = "Unknown status";

// NVMe Base 2.0 figures 101-104, NVM Command Set 1.0 and Zoned Namespace 1.1 (SC 80h-BFh); the
// Fabrics command codes after `|` (NVMe over Fabrics 1.1, Connect and Fabrics status values).
status_codes! {
    0 => {
        0x00 SUCCESS "Successful Completion",
        0x01 INVALID_OPCODE "Invalid Command Opcode",
        0x02 INVALID_FIELD "Invalid Field in Command",
        0x03 CID_CONFLICT "Command ID Conflict",
        0x04 DATA_TRANSFER_ERROR "Data Transfer Error",
        0x05 ABORTED_POWER_LOSS "Commands Aborted due to Power Loss Notification",
        0x06 INTERNAL_ERROR "Internal Error",
        0x07 ABORT_REQUESTED "Command Abort Requested",
        0x08 ABORTED_SQ_DELETION "Command Aborted due to SQ Deletion",
        0x09 ABORTED_FAILED_FUSED "Command Aborted due to Failed Fused Command",
        0x0a ABORTED_MISSING_FUSED "Command Aborted due to Missing Fused Command",
        0x0b INVALID_NAMESPACE "Invalid Namespace or Format",
        0x0c COMMAND_SEQUENCE_ERROR "Command Sequence Error",
        0x0d INVALID_SGL_SEGMENT_DESCRIPTOR "Invalid SGL Segment Descriptor",
        0x0e INVALID_SGL_DESCRIPTOR_COUNT "Invalid Number of SGL Descriptors",
        0x0f DATA_SGL_LENGTH_INVALID "Data SGL Length Invalid",
        0x10 METADATA_SGL_LENGTH_INVALID "Metadata SGL Length Invalid",
        0x11 SGL_DESCRIPTOR_TYPE_INVALID "SGL Descriptor Type Invalid",
        0x12 INVALID_CMB_USE "Invalid Use of Controller Memory Buffer",
        0x13 PRP_OFFSET_INVALID "PRP Offset Invalid",
        0x14 ATOMIC_WRITE_UNIT_EXCEEDED "Atomic Write Unit Exceeded",
        0x15 OPERATION_DENIED "Operation Denied",
        0x16 SGL_OFFSET_INVALID "SGL Offset Invalid",
        0x18 HOST_ID_INCONSISTENT_FORMAT "Host Identifier Inconsistent Format",
        0x19 KEEP_ALIVE_EXPIRED "Keep Alive Timer Expired",
        0x1a KEEP_ALIVE_TIMEOUT_INVALID "Keep Alive Timeout Invalid",
        0x1b ABORTED_PREEMPT_AND_ABORT "Command Aborted due to Preempt and Abort",
        0x1c SANITIZE_FAILED "Sanitize Failed",
        0x1d SANITIZE_IN_PROGRESS "Sanitize In Progress",
        0x1e SGL_DATA_BLOCK_GRANULARITY_INVALID "SGL Data Block Granularity Invalid",
        0x1f NOT_SUPPORTED_FOR_CMB_QUEUE "Command Not Supported for Queue in CMB",
        0x20 NAMESPACE_WRITE_PROTECTED "Namespace is Write Protected",
        0x21 COMMAND_INTERRUPTED "Command Interrupted",
        0x22 TRANSIENT_TRANSPORT_ERROR "Transient Transport Error",
        0x23 PROHIBITED_BY_LOCKDOWN "Command Prohibited by Command and Feature Lockdown",
        0x24 ADMIN_COMMAND_MEDIA_NOT_READY "Admin Command Media Not Ready",
        0x80 LBA_OUT_OF_RANGE "LBA Out of Range",
        0x81 CAPACITY_EXCEEDED "Capacity Exceeded",
        0x82 NAMESPACE_NOT_READY "Namespace Not Ready",
        0x83 RESERVATION_CONFLICT "Reservation Conflict",
        0x84 FORMAT_IN_PROGRESS "Format In Progress",
    }
    1 => {
        0x00 CQ_INVALID "Completion Queue Invalid",
        0x01 INVALID_QID "Invalid Queue Identifier",
        0x02 INVALID_QUEUE_SIZE "Invalid Queue Size",
        0x03 ABORT_LIMIT_EXCEEDED "Abort Command Limit Exceeded",
        0x05 AER_LIMIT_EXCEEDED "Asynchronous Event Request Limit Exceeded",
        0x06 INVALID_FIRMWARE_SLOT "Invalid Firmware Slot",
        0x07 INVALID_FIRMWARE_IMAGE "Invalid Firmware Image",
        0x08 INVALID_INTERRUPT_VECTOR "Invalid Interrupt Vector",
        0x09 INVALID_LOG_PAGE "Invalid Log Page",
        0x0a INVALID_FORMAT "Invalid Format",
        0x0b FW_NEEDS_CONVENTIONAL_RESET "Firmware Activation Requires Conventional Reset",
        0x0c INVALID_QUEUE_DELETION "Invalid Queue Deletion",
        0x0d FEATURE_NOT_SAVEABLE "Feature Identifier Not Saveable",
        0x0e FEATURE_NOT_CHANGEABLE "Feature Not Changeable",
        0x0f FEATURE_NOT_NAMESPACE_SPECIFIC "Feature Not Namespace Specific",
        0x10 FW_NEEDS_SUBSYSTEM_RESET "Firmware Activation Requires NVM Subsystem Reset",
        0x11 FW_NEEDS_CONTROLLER_RESET "Firmware Activation Requires Controller Level Reset",
        0x12 FW_NEEDS_MAX_TIME_VIOLATION "Firmware Activation Requires Maximum Time Violation",
        0x13 FW_ACTIVATION_PROHIBITED "Firmware Activation Prohibited",
        0x14 OVERLAPPING_RANGE "Overlapping Range",
        0x15 NAMESPACE_INSUFFICIENT_CAPACITY "Namespace Insufficient Capacity",
        0x16 NAMESPACE_ID_UNAVAILABLE "Namespace Identifier Unavailable",
        0x18 NAMESPACE_ALREADY_ATTACHED "Namespace Already Attached",
        0x19 NAMESPACE_IS_PRIVATE "Namespace Is Private",
        0x1a NAMESPACE_NOT_ATTACHED "Namespace Not Attached",
        0x1b THIN_PROVISIONING_NOT_SUPPORTED "Thin Provisioning Not Supported",
        0x1c CONTROLLER_LIST_INVALID "Controller List Invalid",
        0x1d SELF_TEST_IN_PROGRESS "Device Self-test In Progress",
        0x1e BOOT_PARTITION_WRITE_PROHIBITED "Boot Partition Write Prohibited",
        0x1f INVALID_CONTROLLER_ID "Invalid Controller Identifier",
        0x20 INVALID_SECONDARY_CONTROLLER_STATE "Invalid Secondary Controller State",
        0x21 INVALID_CONTROLLER_RESOURCE_COUNT "Invalid Number of Controller Resources",
        0x22 INVALID_RESOURCE_ID "Invalid Resource Identifier",
        0x23 SANITIZE_PROHIBITED_WITH_PMR "Sanitize Prohibited While Persistent Memory Region is Enabled",
        0x24 ANA_GROUP_ID_INVALID "ANA Group Identifier Invalid",
        0x25 ANA_ATTACH_FAILED "ANA Attach Failed",
        0x26 INSUFFICIENT_CAPACITY "Insufficient Capacity",
        0x27 NAMESPACE_ATTACHMENT_LIMIT_EXCEEDED "Namespace Attachment Limit Exceeded",
        0x28 PROHIBITION_NOT_SUPPORTED "Prohibition of Command Execution Not Supported",
        0x29 IO_COMMAND_SET_NOT_SUPPORTED "I/O Command Set Not Supported",
        0x2a IO_COMMAND_SET_NOT_ENABLED "I/O Command Set Not Enabled",
        0x2b IO_COMMAND_SET_COMBINATION_REJECTED "I/O Command Set Combination Rejected",
        0x2c INVALID_IO_COMMAND_SET "Invalid I/O Command Set",
        0x2d IDENTIFIER_UNAVAILABLE "Identifier Unavailable",
        0x7f STREAM_RESOURCE_ALLOCATION_FAILED "Stream Resource Allocation Failed",
        0x80 CONFLICTING_ATTRIBUTES "Conflicting Attributes"
            | CONNECT_INCOMPATIBLE_FORMAT "Connect Incompatible Format",
        0x81 INVALID_PROTECTION_INFORMATION "Invalid Protection Information"
            | CONNECT_CONTROLLER_BUSY "Connect Controller Busy",
        0x82 WRITE_TO_READ_ONLY_RANGE "Attempted Write to Read Only Range"
            | CONNECT_INVALID_PARAMETERS "Connect Invalid Parameters",
        0x83 COMMAND_SIZE_LIMIT_EXCEEDED "Command Size Limit Exceeded"
            | CONNECT_RESTART_DISCOVERY "Connect Restart Discovery",
        0x84 CONNECT_INVALID_HOST "Connect Invalid Host",
        0x85 INVALID_QUEUE_TYPE "Invalid Queue Type",
        0xb8 ZONE_BOUNDARY_ERROR "Zone Boundary Error",
        0xb9 ZONE_IS_FULL "Zone Is Full",
        0xba ZONE_IS_READ_ONLY "Zone Is Read Only",
        0xbb ZONE_IS_OFFLINE "Zone Is Offline",
        0xbc ZONE_INVALID_WRITE "Zone Invalid Write",
        0xbd TOO_MANY_ACTIVE_ZONES "Too Many Active Zones",
        0xbe TOO_MANY_OPEN_ZONES "Too Many Open Zones",
        0xbf INVALID_ZONE_STATE_TRANSITION "Invalid Zone State Transition",
    }
    2 => {
        0x80 WRITE_FAULT "Write Fault",
        0x81 UNRECOVERED_READ_ERROR "Unrecovered Read Error",
        0x82 GUARD_CHECK_ERROR "End-to-end Guard Check Error",
        0x83 APPLICATION_TAG_CHECK_ERROR "End-to-end Application Tag Check Error",
        0x84 REFERENCE_TAG_CHECK_ERROR "End-to-end Reference Tag Check Error",
        0x85 COMPARE_FAILURE "Compare Failure",
        0x86 ACCESS_DENIED "Access Denied",
        0x87 DEALLOCATED_OR_UNWRITTEN_BLOCK "Deallocated or Unwritten Logical Block",
        0x88 STORAGE_TAG_CHECK_ERROR "End-to-end Storage Tag Check Error",
    }
    3 => {
        0x00 INTERNAL_PATH_ERROR "Internal Path Error",
        0x01 ANA_PERSISTENT_LOSS "Asymmetric Access Persistent Loss",
        0x02 ANA_INACCESSIBLE "Asymmetric Access Inaccessible",
        0x03 ANA_TRANSITION "Asymmetric Access Transition",
        0x60 CONTROLLER_PATHING_ERROR "Controller Pathing Error",
        0x70 HOST_PATHING_ERROR "Host Pathing Error",
        0x71 ABORTED_BY_HOST "Command Aborted By Host",
    }
}

impl Status {
    /// A status with the given Status Code Type and Status Code, all other bits clear.
    pub const fn new(sct: u8, sc: u8) -> Status {
        Status((((sct & 7) as u16) << 8) | sc as u16)
    }

    /// From the 15-bit Status Field (bit 15 ignored).
    pub const fn from_field(field: u16) -> Status {
        Status(field & 0x7fff)
    }

    /// From the CQE's 16-bit status word (or an Error Information entry's Status Field), whose
    /// bit 0 is the phase tag.
    pub const fn from_word(word: u16) -> Status {
        Status(word >> 1)
    }

    /// The 15-bit Status Field.
    pub const fn field(self) -> u16 {
        self.0
    }

    /// The CQE status word for this status with the given phase tag.
    pub const fn to_word(self, phase: bool) -> u16 {
        (self.0 << 1) | phase as u16
    }

    /// Status Code.
    pub const fn sc(self) -> u8 {
        self.0 as u8
    }

    /// Status Code Type, the raw 3-bit value.
    pub const fn sct(self) -> u8 {
        ((self.0 >> 8) & 7) as u8
    }

    /// Status Code Type.
    pub const fn code_type(self) -> StatusCodeType {
        StatusCodeType::from_raw(self.sct())
    }

    /// Command Retry Delay: 0, or which of Identify Controller CRDT1..3 to wait before a retry.
    pub const fn crd(self) -> u8 {
        ((self.0 >> 11) & 3) as u8
    }

    /// More: the Error Information log page holds more about this error.
    pub const fn more(self) -> bool {
        self.0 & (1 << 13) != 0
    }

    /// Do Not Retry: the same command would fail again.
    pub const fn dnr(self) -> bool {
        self.0 & (1 << 14) != 0
    }

    /// Whether the command succeeded (SCT 0, SC 0; CRD/More/DNR are ignored).
    pub const fn is_success(self) -> bool {
        self.code().0 == 0
    }

    /// SCT and SC only, for comparing with the constants.
    pub const fn code(self) -> Status {
        Status(self.0 & 0x7ff)
    }

    /// This status with Do Not Retry set.
    pub const fn with_dnr(self) -> Status {
        Status(self.0 | (1 << 14))
    }

    /// This status with More set.
    pub const fn with_more(self) -> Status {
        Status(self.0 | (1 << 13))
    }

    /// This status with Command Retry Delay `crd` (0..=3).
    pub const fn with_crd(self, crd: u8) -> Status {
        Status((self.0 & !(3 << 11)) | (((crd & 3) as u16) << 11))
    }
}

/// "LBA Out of Range (SCT 0x0, SC 0x80)", with ", DNR" / ", More" inside the parentheses when
/// those bits are set; both names of a code with two meanings ("Attempted Write to Read Only
/// Range / Connect Invalid Parameters (SCT 0x1, SC 0x82)").
impl fmt::Display for Status {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())?;
        if let Some(other) = self.alternate_name() {
            write!(f, " / {other}")?;
        }
        write!(f, " (SCT {:#x}, SC {:#x}", self.sct(), self.sc())?;
        if self.dnr() {
            f.write_str(", DNR")?;
        }
        if self.more() {
            f.write_str(", More")?;
        }
        f.write_str(")")
    }
}

impl fmt::Debug for Status {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Status({self})")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn decodes_cqe_status_word() {
        // SCT 0, SC 0x80, DNR, phase 1.
        let word: u16 = (1 << 15) | (0x80 << 1) | 1;
        let status = Status::from_word(word);
        assert_eq!(status.sc(), 0x80);
        assert_eq!(status.code_type(), StatusCodeType::Generic);
        assert!(status.dnr() && !status.more() && !status.is_success());
        assert_eq!(status.name(), "LBA Out of Range");
        assert_eq!(status.code(), Status::LBA_OUT_OF_RANGE);
        assert_eq!(status.to_word(true), word);
        assert_eq!(
            status.to_string(),
            "LBA Out of Range (SCT 0x0, SC 0x80, DNR)"
        );
        assert_eq!(
            Status::LBA_OUT_OF_RANGE.to_string(),
            "LBA Out of Range (SCT 0x0, SC 0x80)"
        );
    }

    #[test]
    fn fields_round_trip() {
        let status = Status::new(2, 0x81).with_more().with_crd(2);
        assert_eq!((status.sct(), status.sc(), status.crd()), (2, 0x81, 2));
        assert!(status.more() && !status.dnr());
        assert_eq!(Status::from_field(status.field()), status);
        assert_eq!(status.code(), Status::UNRECOVERED_READ_ERROR);
        assert!(Status::SUCCESS.with_more().is_success());
        assert!(matches!(Status::from_word(0x0001).code(), Status::SUCCESS));
    }

    #[test]
    fn names_and_unknowns() {
        assert_eq!(Status::INVALID_QID.name(), "Invalid Queue Identifier");
        assert_eq!(
            Status::CONFLICTING_ATTRIBUTES.name(),
            "Conflicting Attributes"
        );
        assert_eq!(
            Status::DEALLOCATED_OR_UNWRITTEN_BLOCK.name(),
            "Deallocated or Unwritten Logical Block"
        );
        assert_eq!(Status::INTERNAL_PATH_ERROR.name(), "Internal Path Error");
        assert_eq!(Status::INTERNAL_PATH_ERROR.alternate_name(), None);
        assert_eq!(Status::new(7, 0x12).name(), "Vendor Specific");
        assert_eq!(
            Status::new(4, 0x12).code_type(),
            StatusCodeType::Reserved(4)
        );
        assert_eq!(
            Status::new(4, 0x12).to_string(),
            "Unknown status (SCT 0x4, SC 0x12)"
        );
        assert_eq!(
            Status::new(0, 0x17).to_string(),
            "Unknown status (SCT 0x0, SC 0x17)"
        );
        for sct in [0, 1, 2, 3, 7] {
            assert_eq!(StatusCodeType::from_raw(sct).raw(), sct);
        }
    }

    #[test]
    fn fabrics_connect_codes_show_their_names() {
        assert_eq!(Status::CONNECT_INVALID_PARAMETERS, Status::new(1, 0x82));
        assert_eq!(Status::CONNECT_CONTROLLER_BUSY, Status::new(1, 0x81));
        assert_eq!(Status::CONNECT_INCOMPATIBLE_FORMAT, Status::new(1, 0x80));
        assert_eq!(Status::CONNECT_RESTART_DISCOVERY, Status::new(1, 0x83));
        assert_eq!(Status::CONNECT_INVALID_HOST, Status::new(1, 0x84));
        assert_eq!(Status::INVALID_QUEUE_TYPE, Status::new(1, 0x85));
        // a code shared with the NVM command set shows both meanings
        assert_eq!(
            Status::CONNECT_INVALID_PARAMETERS.with_dnr().to_string(),
            "Attempted Write to Read Only Range / Connect Invalid Parameters \
             (SCT 0x1, SC 0x82, DNR)"
        );
        assert_eq!(
            Status::CONFLICTING_ATTRIBUTES.alternate_name(),
            Some("Connect Incompatible Format")
        );
        assert_eq!(
            Status::CONNECT_INVALID_HOST.to_string(),
            "Connect Invalid Host (SCT 0x1, SC 0x84)"
        );
        assert_eq!(Status::INVALID_QUEUE_TYPE.name(), "Invalid Queue Type");
    }
}
