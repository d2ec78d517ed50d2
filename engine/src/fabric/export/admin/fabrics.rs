//! The Fabrics commands' own fields: Connect (and its data), Property Get/Set, Disconnect,
//! decoded from the command capsule.

use usnvme_driver::spec::command::AdminOpcode;
use usnvme_driver::spec::{Sqe, Status};

use super::{
    CONNECT_INCOMPATIBLE_FORMAT, CONNECT_INVALID_PARAMETERS, DATA_SGL_LENGTH_INVALID,
    INVALID_FIELD, INVALID_OPCODE,
};

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
