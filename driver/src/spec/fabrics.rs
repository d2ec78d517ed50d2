//! NVMe over Fabrics structures (NVMe over Fabrics 1.1; NVMe Base 2.0, section 6): the Fabrics
//! commands (Connect, Property Get/Set, Disconnect), the Connect data and response, the SGL
//! identifiers of command capsules, and the Discovery Log Page. Every Fabrics constant of the
//! project lives here, so the host and the target agree by construction.
//!
//! A Fabrics command is an [`Sqe`] with opcode 7Fh whose byte 4 (where other commands keep
//! the NSID) is the Fabrics Command Type; its fields from byte 40 on are command specific.
//! Constructors build it, typed views ([`ConnectCommand`], [`PropertyCommand`]) read it back.

use core::mem::offset_of;
use static_assertions::const_assert_eq;
use zerocopy::{FromBytes, Immutable, IntoBytes};

use super::command::{AdminOpcode, SglDescriptor, Sqe};
use super::completion::Cqe;

/// The opcode of every Fabrics command.
pub const FABRICS_OPCODE: u8 = AdminOpcode::FabricsCommands as u8;

spec_enum! {
    /// Fabrics Command Types (FCTYPE, byte 4 of a Fabrics command).
    pub enum FabricsType: u8 {
        PropertySet = 0x00 => "Property Set",
        Connect = 0x01 => "Connect",
        PropertyGet = 0x04 => "Property Get",
        AuthenticationSend = 0x05 => "Authentication Send",
        AuthenticationReceive = 0x06 => "Authentication Receive",
        Disconnect = 0x08 => "Disconnect",
    }
}

/// FCTYPE of Property Set.
pub const FCTYPE_PROPERTY_SET: u8 = FabricsType::PropertySet as u8;
/// FCTYPE of Connect.
pub const FCTYPE_CONNECT: u8 = FabricsType::Connect as u8;
/// FCTYPE of Property Get.
pub const FCTYPE_PROPERTY_GET: u8 = FabricsType::PropertyGet as u8;
/// FCTYPE of Disconnect.
pub const FCTYPE_DISCONNECT: u8 = FabricsType::Disconnect as u8;

/// SGL identifier of a Data Block descriptor with an offset into the capsule's in-capsule
/// data (type 0h, subtype 1h).
pub const SGL_IN_CAPSULE: u8 = 0x01;
/// SGL identifier of a Transport SGL Data Block (type 5h, subtype Ah): the data moves in
/// transport PDUs (for TCP, R2T/H2CData or C2HData).
pub const SGL_TRANSPORT: u8 = 0x5a;
/// SGL identifier of a Keyed SGL Data Block (type 4h, subtype 0h: address): NVMe/RDMA's data
/// in the host's memory, which the target reads or writes with RDMA under the key.
pub const SGL_KEYED: u8 = 0x40;

/// Connect CNTLID (admin queue): the target picks any controller.
pub const CNTLID_DYNAMIC: u16 = 0xffff;
/// Connect CNTLID (admin queue): the static controller model.
pub const CNTLID_STATIC: u16 = 0xfffe;

/// Connect CATTR bit 2: the host disables SQ flow control (it needs no SQ head in the
/// responses; on TCP a read may then end with its C2HData and no response capsule).
pub const CATTR_DISABLE_SQ_FLOW: u8 = 1 << 2;

/// Bytes of the Connect data, of an NQN field, and of an NQN at most (the field ends in NUL).
pub const CONNECT_DATA: usize = 1024;
pub const NQN_FIELD: usize = 256;
pub const MAX_NQN: usize = NQN_FIELD - 1;

/// The well-known NQN of discovery controllers.
pub const DISCOVERY_NQN: &str = "nqn.2014-08.org.nvmexpress.discovery";

impl Sqe {
    /// A Fabrics command of type `fctype`, its data (if any) described by SGLs (PSDT 01b, as
    /// every command on a fabric), every other field zero.
    pub const fn fabrics(fctype: u8) -> Sqe {
        let mut sqe = Sqe::new(FABRICS_OPCODE);
        sqe.cdw0 |= (super::command::PSDT_SGL as u32) << 14;
        sqe.nsid = fctype as u32; // byte 4, the rest of the dword reserved
        sqe
    }

    /// FCTYPE, if this is a Fabrics command.
    pub const fn fctype(&self) -> Option<u8> {
        if self.opcode() == FABRICS_OPCODE {
            Some(self.nsid as u8)
        } else {
            None
        }
    }

    /// Connect queue `qid` (0: admin) of `entries` entries (1's based here; SQSIZE is 0's
    /// based) with attributes `cattr` and, on an admin queue, Keep Alive Timeout `kato_ms`.
    /// The data (a [`ConnectData`]) goes in the capsule: see [`SglDescriptor::in_capsule`].
    pub const fn connect(qid: u16, entries: u16, cattr: u8, kato_ms: u32) -> Sqe {
        ConnectCommand {
            recfmt: 0,
            qid,
            sqsize: entries.saturating_sub(1),
            cattr,
            kato: kato_ms,
        }
        .sqe()
    }

    /// Property Get of the `size` property at `offset` (a controller register: CAP, VS, CC,
    /// CSTS).
    pub const fn property_get(offset: u32, size: PropertySize) -> Sqe {
        PropertyCommand {
            size,
            offset,
            value: 0,
        }
        .sqe(FabricsType::PropertyGet)
    }

    /// Property Set of the `size` property at `offset` to `value`.
    pub const fn property_set(offset: u32, size: PropertySize, value: u64) -> Sqe {
        PropertyCommand {
            size,
            offset,
            value,
        }
        .sqe(FabricsType::PropertySet)
    }

    /// Disconnect (of the queue the command is sent on).
    pub const fn disconnect() -> Sqe {
        Sqe::fabrics(FCTYPE_DISCONNECT)
    }
}

impl SglDescriptor {
    /// `length` bytes of data in the command capsule, right after the SQE (offset 0).
    pub const fn in_capsule(length: u32) -> SglDescriptor {
        let mut d = SglDescriptor::data_block(0, length);
        d.identifier = SGL_IN_CAPSULE;
        d
    }

    /// `length` bytes moved by the transport's data PDUs.
    pub const fn transport(length: u32) -> SglDescriptor {
        let mut d = SglDescriptor::data_block(0, length);
        d.identifier = SGL_TRANSPORT;
        d
    }

    /// A Keyed SGL Data Block: `length` bytes (at most 16 MiB - 1) at `address` of the host's
    /// memory registered under `key`. Its bytes 8..11 are the length, 11..15 the key.
    pub fn keyed(address: u64, length: u32, key: u32) -> SglDescriptor {
        let mut bytes = [0u8; 16];
        bytes[..8].copy_from_slice(&address.to_le_bytes());
        bytes[8..11].copy_from_slice(&length.to_le_bytes()[..3]);
        bytes[11..15].copy_from_slice(&key.to_le_bytes());
        bytes[15] = SGL_KEYED;
        SglDescriptor::read_from_bytes(&bytes).unwrap_or_default()
    }

    /// A Keyed SGL Data Block's length and key (None for other descriptors).
    pub fn keyed_parts(&self) -> Option<(u32, u32)> {
        if self.identifier >> 4 != SGL_KEYED >> 4 {
            return None;
        }
        let bytes = self.as_bytes();
        let length = u32::from_le_bytes([bytes[8], bytes[9], bytes[10], 0]);
        let key = u32::from_le_bytes([bytes[11], bytes[12], bytes[13], bytes[14]]);
        Some((length, key))
    }
}

/// The command-specific fields of Connect (bytes 40..52 of the SQE).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ConnectCommand {
    /// Record Format: 0.
    pub recfmt: u16,
    /// Queue ID: 0 for the admin queue.
    pub qid: u16,
    /// Submission Queue Size, 0's based.
    pub sqsize: u16,
    /// Connect Attributes ([`CATTR_DISABLE_SQ_FLOW`], priority class in bits 1:0).
    pub cattr: u8,
    /// Keep Alive Timeout in milliseconds (admin queue; 0 disables it).
    pub kato: u32,
}

impl ConnectCommand {
    /// The Connect command with these fields (CID and SGL left to the sender).
    pub const fn sqe(&self) -> Sqe {
        let mut sqe = Sqe::fabrics(FCTYPE_CONNECT);
        sqe.cdw10 = self.recfmt as u32 | (self.qid as u32) << 16;
        sqe.cdw11 = self.sqsize as u32 | (self.cattr as u32) << 16;
        sqe.cdw12 = self.kato;
        sqe
    }

    /// The fields of a Connect command; None for any other command.
    pub const fn from_sqe(sqe: &Sqe) -> Option<ConnectCommand> {
        match sqe.fctype() {
            Some(FCTYPE_CONNECT) => Some(ConnectCommand {
                recfmt: sqe.cdw10 as u16,
                qid: (sqe.cdw10 >> 16) as u16,
                sqsize: sqe.cdw11 as u16,
                cattr: (sqe.cdw11 >> 16) as u8,
                kato: sqe.cdw12,
            }),
            _ => None,
        }
    }

    /// Queue entries (SQSIZE + 1).
    pub const fn entries(&self) -> u32 {
        self.sqsize as u32 + 1
    }
}

/// What a Connect response says: the controller (DW0 bits 15:0) and whether the host must
/// authenticate (AUTHREQ, bits 17:16), next to the status.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ConnectResponse {
    pub cntlid: u16,
    pub authreq: u8,
}

impl ConnectResponse {
    pub const fn from_cqe(cqe: &Cqe) -> ConnectResponse {
        ConnectResponse {
            cntlid: cqe.dw0 as u16,
            authreq: ((cqe.dw0 >> 16) & 3) as u8,
        }
    }

    /// DW0 of the response.
    pub const fn dw0(&self) -> u32 {
        self.cntlid as u32 | ((self.authreq & 3) as u32) << 16
    }
}

/// A property's size (Property Get/Set ATTRIB bits 2:0).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u8)]
pub enum PropertySize {
    Four = 0,
    Eight = 1,
}

impl PropertySize {
    /// 8 bytes for CAP, 4 for the others.
    pub const fn of(offset: u32) -> PropertySize {
        if offset == super::registers::reg::CAP as u32 {
            PropertySize::Eight
        } else {
            PropertySize::Four
        }
    }

    pub const fn bytes(self) -> usize {
        match self {
            PropertySize::Four => 4,
            PropertySize::Eight => 8,
        }
    }
}

/// The fields of Property Get/Set: ATTRIB (byte 40), OFST (44..48), VALUE (48..56, Set only).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PropertyCommand {
    pub size: PropertySize,
    pub offset: u32,
    pub value: u64,
}

impl PropertyCommand {
    const fn sqe(&self, fctype: FabricsType) -> Sqe {
        let mut sqe = Sqe::fabrics(fctype as u8);
        sqe.cdw10 = self.size as u32;
        sqe.cdw11 = self.offset;
        sqe.cdw12 = self.value as u32;
        sqe.cdw13 = (self.value >> 32) as u32;
        sqe
    }

    /// The fields of a Property Get or Set; None for any other command, or a reserved size.
    pub const fn from_sqe(sqe: &Sqe) -> Option<PropertyCommand> {
        match sqe.fctype() {
            Some(FCTYPE_PROPERTY_GET | FCTYPE_PROPERTY_SET) => {}
            _ => return None,
        }
        let size = match sqe.cdw10 & 7 {
            0 => PropertySize::Four,
            1 => PropertySize::Eight,
            _ => return None,
        };
        Some(PropertyCommand {
            size,
            offset: sqe.cdw11,
            value: (sqe.cdw13 as u64) << 32 | sqe.cdw12 as u64,
        })
    }

    /// The value a Property Get response carries: DW0, and DW1 above it for 8 bytes.
    pub const fn value_of(cqe: &Cqe, size: PropertySize) -> u64 {
        match size {
            PropertySize::Four => cqe.dw0 as u64,
            PropertySize::Eight => (cqe.dw1 as u64) << 32 | cqe.dw0 as u64,
        }
    }

    /// Puts `value` in a Property Get response, as [`Self::value_of`] reads it: DW0, and DW1
    /// for 8 bytes (DW1 of a 4-byte property is reserved and left as it is).
    pub const fn put_value(cqe: &mut Cqe, size: PropertySize, value: u64) {
        cqe.dw0 = value as u32;
        if let PropertySize::Eight = size {
            cqe.dw1 = (value >> 32) as u32;
        }
    }
}

/// NQNs are at most 223 bytes (NVMe Base 2.0, 4.5).
pub const MAX_NQN_BYTES: usize = 223;

/// The one rule for an NQN given by a person (a subsystem's, a host's): `nqn.` first, at most
/// 223 bytes, no blanks or control characters; else what is wrong with it.
pub fn check_nqn(nqn: &str) -> Result<(), String> {
    if !nqn.starts_with("nqn.") {
        return Err(format!(
            "NQN {nqn:?} does not start with \"nqn.\" (e.g. nqn.2024-01.com.example:storage1)"
        ));
    }
    if nqn.len() > MAX_NQN_BYTES {
        return Err(format!(
            "NQN {nqn:?} is {} bytes long, more than the {MAX_NQN_BYTES} allowed",
            nqn.len()
        ));
    }
    if nqn.chars().any(|c| c.is_whitespace() || c.is_control()) {
        return Err(format!(
            "NQN {nqn:?} has blanks or control characters in it"
        ));
    }
    Ok(())
}

/// Why an NQN cannot go in its field.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum NqnError {
    #[error("an NQN is at most 255 bytes")]
    TooLong,
    #[error("an NQN has no NUL byte in it")]
    Nul,
}

/// `nqn` in a NUL-padded 256-byte field.
fn nqn_field(nqn: &str) -> Result<[u8; NQN_FIELD], NqnError> {
    if nqn.len() > MAX_NQN {
        return Err(NqnError::TooLong);
    }
    if nqn.as_bytes().contains(&0) {
        return Err(NqnError::Nul);
    }
    let mut field = [0u8; NQN_FIELD];
    field[..nqn.len()].copy_from_slice(nqn.as_bytes());
    Ok(field)
}

/// Writes `nqn` NUL-padded into `field`, cut short if needed so that a NUL ends it (Linux
/// takes a SUBNQN without one as absent): for a target's own NQN, which it must always answer
/// with, where [`ConnectData::new`] refuses an NQN that does not fit.
pub fn put_nqn(field: &mut [u8; NQN_FIELD], nqn: &str) {
    field.fill(0);
    let len = nqn.len().min(MAX_NQN);
    field[..len].copy_from_slice(&nqn.as_bytes()[..len]);
}

/// The NQN in a NUL-padded field: None without a terminating NUL, or when it is not UTF-8.
pub fn nqn_of(field: &[u8; NQN_FIELD]) -> Option<&str> {
    let end = field.iter().position(|&b| b == 0)?;
    core::str::from_utf8(&field[..end]).ok()
}

/// A fixed-width text field of a discovery log entry: up to the first NUL, trailing blanks
/// dropped (targets pad with either), invalid UTF-8 replaced.
pub fn padded_text(field: &[u8]) -> String {
    let end = field.iter().position(|&b| b == 0).unwrap_or(field.len());
    String::from_utf8_lossy(&field[..end]).trim_end().to_owned()
}

/// The Connect command's data, 1024 bytes in its capsule.
#[repr(C)]
#[derive(Debug, Clone, Copy, PartialEq, Eq, FromBytes, IntoBytes, Immutable)]
pub struct ConnectData {
    /// Host Identifier (a UUID).
    pub host_id: [u8; 16],
    /// Controller ID: [`CNTLID_DYNAMIC`] on an admin queue, the admin queue's on an I/O queue.
    pub cntlid: u16,
    rsvd18: [u8; 238],
    /// Subsystem NQN, NUL-padded.
    pub subnqn: [u8; NQN_FIELD],
    /// Host NQN, NUL-padded.
    pub hostnqn: [u8; NQN_FIELD],
    rsvd768: [u8; 256],
}

const_assert_eq!(offset_of!(ConnectData, cntlid), 16);
const_assert_eq!(offset_of!(ConnectData, subnqn), 256);
const_assert_eq!(offset_of!(ConnectData, hostnqn), 512);
const_assert_eq!(offset_of!(ConnectData, rsvd768), 768);

impl ConnectData {
    pub fn new(
        host_id: [u8; 16],
        cntlid: u16,
        subnqn: &str,
        hostnqn: &str,
    ) -> Result<ConnectData, NqnError> {
        let mut data = ConnectData::zeroed();
        data.host_id = host_id;
        data.cntlid = cntlid;
        data.subnqn = nqn_field(subnqn)?;
        data.hostnqn = nqn_field(hostnqn)?;
        Ok(data)
    }

    /// The subsystem NQN; None unless NUL-terminated UTF-8.
    pub fn subnqn(&self) -> Option<&str> {
        nqn_of(&self.subnqn)
    }

    /// The host NQN; None unless NUL-terminated UTF-8.
    pub fn hostnqn(&self) -> Option<&str> {
        nqn_of(&self.hostnqn)
    }
}

/// Discovery Log Page (LID 70h) header: 1024 bytes, the entries follow it.
#[repr(C)]
#[derive(Debug, Clone, Copy, PartialEq, Eq, FromBytes, IntoBytes, Immutable)]
pub struct DiscoveryLogHeader {
    /// Generation Counter: changes whenever the log does.
    pub genctr: u64,
    /// Number of Records.
    pub numrec: u64,
    /// Record Format: 0.
    pub recfmt: u16,
    rsvd18: [u8; 1006],
}

const_assert_eq!(offset_of!(DiscoveryLogHeader, numrec), 8);
const_assert_eq!(offset_of!(DiscoveryLogHeader, recfmt), 16);

impl DiscoveryLogHeader {
    pub fn new(genctr: u64, numrec: u64) -> DiscoveryLogHeader {
        let mut h = DiscoveryLogHeader::zeroed();
        h.genctr = genctr;
        h.numrec = numrec;
        h
    }
}

/// Transport types (TRTYPE).
pub const TRTYPE_RDMA: u8 = 1;
pub const TRTYPE_FC: u8 = 2;
pub const TRTYPE_TCP: u8 = 3;
pub const TRTYPE_LOOP: u8 = 254;
/// Address families (ADRFAM).
pub const ADRFAM_IPV4: u8 = 1;
pub const ADRFAM_IPV6: u8 = 2;
pub const ADRFAM_IB: u8 = 3;
pub const ADRFAM_FC: u8 = 4;
pub const ADRFAM_LOOP: u8 = 254;
/// Subsystem types (SUBTYPE).
pub const SUBTYPE_REFERRAL: u8 = 1;
pub const SUBTYPE_NVME: u8 = 2;
pub const SUBTYPE_CURRENT_DISCOVERY: u8 = 3;
/// TREQ bits 1:0, secure channel: not specified, required, not required.
pub const TREQ_SECURE_MASK: u8 = 3;
pub const TREQ_SECURE_REQUIRED: u8 = 1;
pub const TREQ_SECURE_NOT_REQUIRED: u8 = 2;
/// TREQ bit 2: the controller lets a host disable SQ flow control.
pub const TREQ_SQ_FLOW_CONTROL_DISABLE: u8 = 1 << 2;
/// EFLAGS bits.
pub const EFLAGS_DUPLICATE_RETURN_INFO: u16 = 1 << 0;
pub const EFLAGS_EXPLICIT_PERSISTENT_CONNECTION: u16 = 1 << 1;
pub const EFLAGS_NO_CDC_CONNECTIVITY: u16 = 1 << 2;
/// TCP security types (TSAS byte 0).
pub const SECTYPE_NONE: u8 = 0;
pub const SECTYPE_TLS12: u8 = 1;
pub const SECTYPE_TLS13: u8 = 2;

/// One Discovery Log Page Entry, 1024 bytes.
#[repr(C)]
#[derive(Debug, Clone, Copy, PartialEq, Eq, FromBytes, IntoBytes, Immutable)]
pub struct DiscoveryLogEntry {
    pub trtype: u8,
    pub adrfam: u8,
    pub subtype: u8,
    pub treq: u8,
    pub portid: u16,
    pub cntlid: u16,
    /// Admin Max SQ Size.
    pub asqsz: u16,
    pub eflags: u16,
    rsvd12: [u8; 20],
    /// Transport Service Identifier (for TCP, the port), padded.
    pub trsvcid: [u8; 32],
    rsvd64: [u8; 192],
    /// Subsystem NQN, NUL-padded.
    pub subnqn: [u8; NQN_FIELD],
    /// Transport Address, padded.
    pub traddr: [u8; 256],
    /// Transport Specific Address Subtype; for TCP, byte 0 is SECTYPE.
    pub tsas: [u8; 256],
}

const_assert_eq!(offset_of!(DiscoveryLogEntry, portid), 4);
const_assert_eq!(offset_of!(DiscoveryLogEntry, cntlid), 6);
const_assert_eq!(offset_of!(DiscoveryLogEntry, asqsz), 8);
const_assert_eq!(offset_of!(DiscoveryLogEntry, eflags), 10);
const_assert_eq!(offset_of!(DiscoveryLogEntry, trsvcid), 32);
const_assert_eq!(offset_of!(DiscoveryLogEntry, subnqn), 256);
const_assert_eq!(offset_of!(DiscoveryLogEntry, traddr), 512);
const_assert_eq!(offset_of!(DiscoveryLogEntry, tsas), 768);

impl DiscoveryLogEntry {
    /// The TCP security type (TSAS byte 0).
    pub fn sectype(&self) -> u8 {
        self.tsas[0]
    }

    pub fn set_sectype(&mut self, sectype: u8) {
        self.tsas[0] = sectype;
    }

    pub fn trsvcid_text(&self) -> String {
        padded_text(&self.trsvcid)
    }

    pub fn traddr_text(&self) -> String {
        padded_text(&self.traddr)
    }

    pub fn subnqn_text(&self) -> String {
        padded_text(&self.subnqn)
    }

    /// Sets TRSVCID to `text`, space-padded as the specification's ASCII strings are.
    pub fn set_trsvcid(&mut self, text: &str) {
        super::put_ascii(&mut self.trsvcid, text);
    }

    /// Sets TRADDR to `text`, space-padded.
    pub fn set_traddr(&mut self, text: &str) {
        super::put_ascii(&mut self.traddr, text);
    }

    /// Sets SUBNQN, NUL-padded.
    pub fn set_subnqn(&mut self, nqn: &str) -> Result<(), NqnError> {
        self.subnqn = nqn_field(nqn)?;
        Ok(())
    }
}

pod!(
    ConnectData = 1024,
    DiscoveryLogHeader = 1024,
    DiscoveryLogEntry = 1024
);

#[cfg(test)]
mod tests {
    use super::*;
    use crate::spec::Status;

    #[test]
    fn a_keyed_sgl_puts_length_and_key_where_nvme_rdma_reads_them() {
        let d = SglDescriptor::keyed(0x1122_3344_5566_7788, 0x01_2345, 0xdead_beef);
        let b = d.as_bytes();
        assert_eq!(&b[..8], &0x1122_3344_5566_7788u64.to_le_bytes());
        assert_eq!(&b[8..11], &[0x45, 0x23, 0x01]);
        assert_eq!(&b[11..15], &0xdead_beefu32.to_le_bytes());
        assert_eq!(b[15], SGL_KEYED);
        assert_eq!(d.keyed_parts(), Some((0x01_2345, 0xdead_beef)));
        assert_eq!(SglDescriptor::in_capsule(64).keyed_parts(), None);
    }

    #[test]
    fn connect_command_fields_at_their_offsets() {
        let sqe = Sqe::connect(3, 128, CATTR_DISABLE_SQ_FLOW, 15_000);
        let b = sqe.as_bytes();
        assert_eq!((b[0], b[4]), (0x7f, 0x01));
        assert_eq!(&b[40..42], &[0, 0]); // RECFMT
        assert_eq!(&b[42..44], &[3, 0]); // QID
        assert_eq!(&b[44..46], &[127, 0]); // SQSIZE, 0's based
        assert_eq!(b[46], 0x04); // CATTR
        assert_eq!(&b[48..52], &15_000u32.to_le_bytes()); // KATO
        let c = ConnectCommand::from_sqe(&Sqe::from_bytes(b)).expect("a Connect");
        assert_eq!(
            (c.recfmt, c.qid, c.sqsize, c.cattr, c.kato),
            (0, 3, 127, 4, 15_000)
        );
        assert_eq!(c.entries(), 128);
        assert_eq!(c.sqe(), sqe);
        assert_eq!(sqe.fctype(), Some(FCTYPE_CONNECT));
        assert_eq!(
            ConnectCommand::from_sqe(&Sqe::property_get(0, PropertySize::Four)),
            None
        );
        assert_eq!(Sqe::read(1, 0, 1).fctype(), None);
        assert_eq!(FabricsType::from_raw(8), Some(FabricsType::Disconnect));
        assert_eq!(Sqe::disconnect().as_bytes()[4], 0x08);
    }

    #[test]
    fn connect_data_round_trips_and_pads_nqns() {
        let host_id = [7u8; 16];
        let d = ConnectData::new(host_id, CNTLID_DYNAMIC, "nqn.x:sub", "nqn.x:host").expect("ok");
        let b = d.as_bytes();
        assert_eq!(&b[..16], &host_id);
        assert_eq!(&b[16..18], &[0xff, 0xff]);
        assert_eq!(&b[256..265], b"nqn.x:sub");
        assert!(b[265..512].iter().all(|&x| x == 0));
        assert_eq!(&b[512..522], b"nqn.x:host");
        let back = ConnectData::from_bytes(b);
        assert_eq!(back, d);
        assert_eq!(
            (back.subnqn(), back.hostnqn()),
            (Some("nqn.x:sub"), Some("nqn.x:host"))
        );

        let longest = "n".repeat(MAX_NQN);
        let d = ConnectData::new(host_id, 1, &longest, "h").expect("255 bytes fit");
        assert_eq!(d.subnqn(), Some(longest.as_str()));
        let too_long = "n".repeat(NQN_FIELD);
        assert_eq!(
            ConnectData::new(host_id, 1, &too_long, "h"),
            Err(NqnError::TooLong)
        );
        assert_eq!(
            ConnectData::new(host_id, 1, "a\0b", "h"),
            Err(NqnError::Nul)
        );
        // a field with no NUL, or not UTF-8, has no NQN
        let mut bad = d;
        bad.hostnqn = [b'x'; NQN_FIELD];
        bad.subnqn[0] = 0xff;
        assert_eq!((bad.hostnqn(), bad.subnqn()), (None, None));
    }

    #[test]
    fn connect_response() {
        let cqe = Cqe::new(0x2_0042, 0, 0, 0, Status::SUCCESS, false);
        let r = ConnectResponse::from_cqe(&cqe);
        assert_eq!((r.cntlid, r.authreq), (0x42, 2));
        assert_eq!(r.dw0(), 0x2_0042);
    }

    #[test]
    fn property_commands() {
        let get = Sqe::property_get(0, PropertySize::of(0));
        let b = get.as_bytes();
        assert_eq!((b[0], b[4], b[40]), (0x7f, 0x04, 1));
        assert_eq!(&b[44..48], &[0, 0, 0, 0]);
        let set = Sqe::property_set(0x14, PropertySize::of(0x14), 0x46_0001);
        let b = set.as_bytes();
        assert_eq!((b[4], b[40]), (0x00, 0));
        assert_eq!(&b[44..48], &[0x14, 0, 0, 0]);
        assert_eq!(&b[48..56], &0x46_0001u64.to_le_bytes());
        let p = PropertyCommand::from_sqe(&set).expect("a Property Set");
        assert_eq!(
            (p.size, p.offset, p.value),
            (PropertySize::Four, 0x14, 0x46_0001)
        );
        let mut reserved = get;
        reserved.cdw10 = 2;
        assert_eq!(PropertyCommand::from_sqe(&reserved), None);
        let mut cqe = Cqe::new(0x1234_5678, 0, 0, 0, Status::SUCCESS, false);
        cqe.dw1 = 9;
        assert_eq!(
            PropertyCommand::value_of(&cqe, PropertySize::Eight),
            0x9_1234_5678
        );
        assert_eq!(
            PropertyCommand::value_of(&cqe, PropertySize::Four),
            0x1234_5678
        );
        assert_eq!(PropertySize::Eight.bytes(), 8);

        // a response carries what a Get read: DW0, DW1 only for 8 bytes
        let mut resp = Cqe::new(0, 0, 0, 0, Status::SUCCESS, false);
        PropertyCommand::put_value(&mut resp, PropertySize::Eight, 0x9_1234_5678);
        assert_eq!((resp.dw0, resp.dw1), (0x1234_5678, 9));
        let mut resp = Cqe::new(0, 0, 0, 0, Status::SUCCESS, false);
        PropertyCommand::put_value(&mut resp, PropertySize::Four, 0x46_0001);
        assert_eq!((resp.dw0, resp.dw1), (0x46_0001, 0));
        assert_eq!(
            PropertyCommand::value_of(&resp, PropertySize::Four),
            0x46_0001
        );
    }

    #[test]
    fn put_nqn_pads_with_nul_and_keeps_one_at_the_end() {
        let mut field = [0xee; NQN_FIELD];
        put_nqn(&mut field, "nqn.x:sub");
        assert_eq!(nqn_of(&field), Some("nqn.x:sub"));
        assert!(field[9..].iter().all(|&b| b == 0));
        // too long: cut to 255 bytes, the last byte stays NUL
        put_nqn(&mut field, &"n".repeat(NQN_FIELD + 10));
        assert_eq!(nqn_of(&field).map(str::len), Some(MAX_NQN));
        assert_eq!(field[MAX_NQN], 0);
    }

    #[test]
    fn sgl_identifiers() {
        let d = SglDescriptor::in_capsule(1024);
        assert_eq!((d.as_bytes()[15], d.address, d.length), (0x01, 0, 1024));
        assert_eq!(SglDescriptor::transport(4096).as_bytes()[15], 0x5a);
    }

    #[test]
    fn discovery_log_round_trips_at_known_offsets() {
        let h = DiscoveryLogHeader::new(5, 2);
        let b = h.as_bytes();
        assert_eq!((b[0], b[8], b[16]), (5, 2, 0));
        assert_eq!(DiscoveryLogHeader::from_bytes(b), h);

        let mut e = DiscoveryLogEntry::zeroed();
        (e.trtype, e.adrfam, e.subtype, e.treq) = (TRTYPE_TCP, ADRFAM_IPV4, SUBTYPE_NVME, 4);
        (e.portid, e.cntlid, e.asqsz, e.eflags) = (7, CNTLID_DYNAMIC, 32, 2);
        e.set_trsvcid("4420");
        e.set_traddr("127.0.0.1");
        e.set_subnqn("nqn.x:sub").expect("fits");
        e.set_sectype(SECTYPE_TLS12);
        let b = e.as_bytes();
        assert_eq!(&b[..4], &[3, 1, 2, 4]);
        assert_eq!(&b[4..12], &[7, 0, 0xff, 0xff, 32, 0, 2, 0]);
        assert_eq!(&b[32..37], b"4420 ");
        assert_eq!(&b[256..266], b"nqn.x:sub\0");
        assert_eq!(&b[512..522], b"127.0.0.1 ");
        assert_eq!(b[768], 1);
        let back = DiscoveryLogEntry::from_bytes(b);
        assert_eq!(back, e);
        assert_eq!(
            (back.trsvcid_text(), back.traddr_text(), back.subnqn_text()),
            (
                "4420".to_owned(),
                "127.0.0.1".to_owned(),
                "nqn.x:sub".to_owned()
            )
        );
        assert_eq!(back.sectype(), SECTYPE_TLS12);
    }
}
