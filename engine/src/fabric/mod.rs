//! NVMe over Fabrics on TCP (NVMe/TCP): the wire format ([`pdu`]) and its one [`framing`]
//! (receive and transmit, over the [`framing::socket`] traits), shared by the target that
//! exports the engine's block devices ([`export`], behind `usnvme serve`) and the host side
//! (`crate::transport::tcp`), the Discovery Log Page ([`discovery`]), who this host is
//! ([`identity`]) and the addresses users give ([`address`]). The Fabrics structures
//! themselves (Connect, Property Get/Set, the discovery log) are the driver's
//! (`usnvme_driver::spec::fabrics`).

pub mod address;
pub mod discovery;
pub mod export;
pub mod framing;
pub mod identity;
pub mod pdu;
