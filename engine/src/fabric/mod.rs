//! NVMe over Fabrics on TCP (NVMe/TCP): the wire format ([`pdu`]) shared by the target that
//! exports the engine's block devices ([`export`], behind `usnvme serve`) and the host side
//! that reaches such targets ([`host`], one blocking queue; [`remote`], a controller on top of
//! it; [`initiator`], the polled I/O queues; [`subsystem`], a remote subsystem's namespaces as
//! block devices), and the addresses users give ([`address`]). Both ends frame PDUs through
//! one [`framing`].

pub mod address;
pub mod export;
pub mod framing;
pub mod host;
pub mod initiator;
pub mod pdu;
pub mod remote;
pub mod subsystem;
