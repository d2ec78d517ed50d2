//! What the target makes of a Fabrics command: the spec's typed views
//! ([`ConnectCommand`], [`PropertyCommand`], [`ConnectData`]), with the statuses a target
//! answers for what it does not take.

use usnvme_driver::spec::fabrics::{
    ConnectCommand, ConnectData, PropertyCommand, FCTYPE_CONNECT, FCTYPE_DISCONNECT,
    FCTYPE_PROPERTY_GET, FCTYPE_PROPERTY_SET,
};
use usnvme_driver::spec::{Sqe, Status};

use super::{
    CONNECT_INCOMPATIBLE_FORMAT, CONNECT_INVALID_PARAMETERS, DATA_SGL_LENGTH_INVALID,
    INVALID_FIELD, INVALID_OPCODE,
};

/// A Fabrics command (opcode 7Fh) the target serves.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FabricsCommand {
    Connect(ConnectCommand),
    PropertySet(PropertyCommand),
    PropertyGet(PropertyCommand),
    Disconnect,
}

impl FabricsCommand {
    /// Decodes a Fabrics command. Other opcodes and the FCTYPEs we do not serve
    /// (authentication) are "Invalid Command Opcode", as Linux's target answers them; a
    /// Connect record format other than 0 is "Connect Incompatible Format"; a reserved
    /// property size (ATTRIB) is "Invalid Field".
    pub fn from_sqe(sqe: &Sqe) -> Result<FabricsCommand, Status> {
        match sqe.fctype() {
            Some(FCTYPE_CONNECT) => {
                let connect = ConnectCommand::from_sqe(sqe).ok_or(INVALID_OPCODE)?;
                if connect.recfmt != 0 {
                    return Err(CONNECT_INCOMPATIBLE_FORMAT);
                }
                Ok(FabricsCommand::Connect(connect))
            }
            Some(FCTYPE_PROPERTY_SET) => PropertyCommand::from_sqe(sqe)
                .map(FabricsCommand::PropertySet)
                .ok_or(INVALID_FIELD),
            Some(FCTYPE_PROPERTY_GET) => PropertyCommand::from_sqe(sqe)
                .map(FabricsCommand::PropertyGet)
                .ok_or(INVALID_FIELD),
            Some(FCTYPE_DISCONNECT) => Ok(FabricsCommand::Disconnect),
            _ => Err(INVALID_OPCODE),
        }
    }
}

/// A Connect's data: exactly 1024 bytes, else "Data SGL Length Invalid".
pub fn connect_data(bytes: &[u8]) -> Result<ConnectData, Status> {
    ConnectData::from_slice(bytes).ok_or(DATA_SGL_LENGTH_INVALID)
}

/// The subsystem and host NQNs of a Connect's data. Each must be UTF-8 and end with a NUL
/// inside its 256 bytes, and the subsystem's must not be empty; otherwise "Connect Invalid
/// Parameters". The host's may be (SPDK's `spdk_nvme_perf` sends none unless told one; Linux's
/// and SPDK's targets take it where any host may connect, and so do we).
pub fn connect_nqns(data: &ConnectData) -> Result<(&str, &str), Status> {
    let host = data.hostnqn().ok_or(CONNECT_INVALID_PARAMETERS)?;
    Ok((checked_nqn(data.subnqn())?, host))
}

fn checked_nqn(nqn: Option<&str>) -> Result<&str, Status> {
    nqn.filter(|text| !text.is_empty())
        .ok_or(CONNECT_INVALID_PARAMETERS)
}
