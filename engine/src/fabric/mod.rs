//! NVMe over Fabrics on TCP (NVMe/TCP): the wire format ([`pdu`]) and its one [`framing`]
//! (receive and transmit), shared by the target that exports the engine's block devices
//! ([`export`], behind `usnvme serve`) and the host side that reaches such targets
//! ([`initiator`], the polled queues, admin and I/O alike; [`remote`], a remote controller on
//! its admin queue; [`subsystem`], a remote subsystem's namespaces as block devices), and the
//! addresses users give ([`address`]). The Fabrics structures themselves (Connect, Property
//! Get/Set, the discovery log) are the driver's (`usnvme_driver::spec::fabrics`).

pub mod address;
pub mod export;
pub mod framing;
pub mod initiator;
pub mod pdu;
pub mod remote;
pub mod subsystem;
