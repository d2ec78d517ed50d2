//! Identify: the controller (an I/O or the discovery controller), its namespaces, the active
//! namespace list and the namespace identification descriptors.

use usnvme_driver::spec::command::Cns;
use usnvme_driver::spec::fabrics::{put_nqn, DISCOVERY_NQN};
use usnvme_driver::spec::identify::{Oncs, CTRATT_TBKAS};
use usnvme_driver::spec::{
    put_ascii, IdentifyController, IdentifyNamespace, LbaFormat, NamespaceList, Sqe, Status,
};

use super::super::{ExportedNamespace, SubsystemInfo, ANA_GROUPS, MAX_NAMESPACES};
use super::properties::{IOCQES, IOSQES};
use super::{
    ASYNC_EVENT_LIMIT, ERROR_LOG_ENTRIES, IDENTIFY_BYTES, INVALID_FIELD, INVALID_NAMESPACE, VERSION,
};

/// Keep Alive Support: KATO granularity in 100 ms units. The connection times Keep Alive in
/// milliseconds, so 100 ms is a granularity it keeps.
const KAS: u16 = 1;

/// Controller types (CNTRLTYPE).
const CNTRLTYPE_IO: u8 = 1;
const CNTRLTYPE_DISCOVERY: u8 = 2;
/// CMIC: several ports may reach the subsystem, and it has several controllers (one per
/// association): with it Linux accepts a second controller of the same subsystem (multipath).
const CMIC_MULTI_PORT: u8 = 1 << 0;
const CMIC_MULTI_CONTROLLER: u8 = 1 << 1;
/// CMIC bit 3: Asymmetric Namespace Access reporting (each port's state in the ANA log).
const CMIC_ANA: u8 = 1 << 3;
/// ANACAP: the optimized, non-optimized and inaccessible states are reported (bits 0-2); a
/// namespace's ANA group does not change while it is attached (bit 6).
const ANACAP: u8 = 0b0100_0111;
/// ANATT: a state change takes effect at once; hosts wait this long (seconds) at most.
const ANATT_SECONDS: u8 = 10;
/// OAES bit 8: Namespace Attribute Changed notices (namespaces added and removed while the
/// target runs); bit 11: Asymmetric Namespace Access Change notices.
const OAES_NAMESPACE_ATTRIBUTE: u32 = 1 << 8;
const OAES_ANA_CHANGE: u32 = 1 << 11;
const OAES_DISCOVERY_LOG_CHANGE: u32 = 1 << 31;
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
/// SGLS bit 2: Keyed SGL Data Blocks are supported (NVMe/RDMA; the Linux RDMA host requires it).
const SGLS_KEYED: u32 = 1 << 2;
/// OFCS bit 0: the Disconnect command is supported.
const OFCS_DISCONNECT: u16 = 1 << 0;
/// Namespace Identifier Types of Namespace Identification Descriptors: NGUID and UUID, 16
/// bytes each.
const NIDT_NGUID: u8 = 2;
const NIDT_UUID: u8 = 3;
const NIDL_16: u8 = 16;
/// Identify CNS 06h, the I/O command set's Identify Controller data (served besides the
/// [`Cns`] values).
const CNS_IO_COMMAND_SET_CONTROLLER: u8 = 0x06;
/// Command Set Identifier of the NVM command set (CDW11 bits 31:24).
const CSI_NVM: u8 = 0;

/// MDTS for a largest transfer of `max_transfer` bytes, in 4 KiB pages as a power of two
/// (rounded down). MDTS 0 means "no limit", so 4 KiB cannot be said: the least is 1 (8 KiB),
/// and `max_transfer` should be at least that.
pub(super) fn mdts(max_transfer: u32) -> u8 {
    let pages = (max_transfer / 4096).max(2);
    pages.ilog2() as u8
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
    // Traffic-based Keep Alive: I/O on any queue counts as the host's sign of life (a host
    // busy with I/O may send its Keep Alive late, or not at all).
    id.ctratt = CTRATT_TBKAS;
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
    put_nqn(&mut id.subnqn, nqn);
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
        // its host may ask to hear when the log changes (Linux does, on a persistent one)
        id.oaes = OAES_DISCOVERY_LOG_CHANGE;
        return id;
    }
    id.cntrltype = CNTRLTYPE_IO;
    id.cmic = CMIC_MULTI_PORT | CMIC_MULTI_CONTROLLER | CMIC_ANA;
    id.anatt = ANATT_SECONDS;
    id.anacap = ANACAP;
    id.anagrpmax = ANA_GROUPS;
    id.nanagrpid = ANA_GROUPS;
    id.oaes = OAES_NAMESPACE_ATTRIBUTE | OAES_ANA_CHANGE;
    id.acl = 3; // 0's based; Abort is answered "not aborted"
    id.frmw = FRMW_ONE_READ_ONLY_SLOT;
    id.elpe = (ERROR_LOG_ENTRIES - 1) as u8;
    id.sqes = (IOSQES << 4) | IOSQES;
    id.cqes = (IOCQES << 4) | IOCQES;
    // NN: every ID a namespace added while the target runs may take, so that it is valid
    // from the start. MNAN: Linux refuses an ANA-reporting controller without it (it sizes
    // its ANA log buffer by it, so it must cover every namespace there may be).
    id.nn = MAX_NAMESPACES;
    id.mnan = MAX_NAMESPACES;
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
    id.anagrpid = ns.ana_group;
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

/// Namespace Identification Descriptor list (CNS 03h): the NGUID and the UUID (each a
/// 4-byte header and 16 bytes), then a zero descriptor that ends the list.
pub fn namespace_descriptors(ns: &ExportedNamespace) -> [u8; IDENTIFY_BYTES] {
    let mut page = [0u8; IDENTIFY_BYTES];
    for (at, nidt, id) in [(0, NIDT_NGUID, &ns.nguid), (20, NIDT_UUID, &ns.uuid)] {
        page[at] = nidt;
        page[at + 1] = NIDL_16;
        page[at + 4..at + 20].copy_from_slice(id);
    }
    page
}

/// Identify, by CNS (CDW10 bits 7:0). The discovery controller answers only CNS 01h. An NSID
/// up to NN that names no namespace is inactive: CNS 00h gives zeroes for it; other NSIDs
/// (0, beyond NN, the broadcast value) are invalid.
pub fn identify(
    sub: &SubsystemInfo,
    cntlid: u16,
    discovery: bool,
    keyed_sgls: bool,
    sqe: &Sqe,
) -> Result<[u8; IDENTIFY_BYTES], Status> {
    let cns = sqe.cdw10 as u8;
    if discovery && Cns::from_raw(cns) != Some(Cns::Controller) {
        return Err(INVALID_FIELD);
    }
    let nsid = sqe.nsid;
    let active = sub.namespaces.iter().find(|ns| ns.nsid == nsid);
    match Cns::from_raw(cns) {
        Some(Cns::Controller) => {
            let mut id = identify_controller(sub, cntlid, discovery);
            if keyed_sgls {
                id.sgls |= SGLS_KEYED;
            }
            Ok(*id.as_bytes())
        }
        Some(Cns::Namespace) => match active {
            Some(ns) => Ok(*identify_namespace(ns).as_bytes()),
            None if nsid != 0 && nsid <= MAX_NAMESPACES => Ok([0; IDENTIFY_BYTES]),
            None => Err(INVALID_NAMESPACE),
        },
        Some(Cns::ActiveNamespaceList) => {
            if nsid >= 0xffff_fffe {
                return Err(INVALID_NAMESPACE);
            }
            Ok(*active_namespaces(sub, nsid).as_bytes())
        }
        Some(Cns::NamespaceDescriptorList) => {
            active.map(namespace_descriptors).ok_or(INVALID_NAMESPACE)
        }
        Some(Cns::NvmNamespace) => {
            // All zero: exported namespaces carry no protection information (16-bit guard
            // formats, no storage tag).
            if (sqe.cdw11 >> 24) as u8 != CSI_NVM {
                return Err(INVALID_FIELD);
            }
            active.map(|_| [0; IDENTIFY_BYTES]).ok_or(INVALID_NAMESPACE)
        }
        // no namespace management over the fabric (OACS bit 3 clear)
        Some(
            Cns::AllocatedNamespaceList
            | Cns::AllocatedNamespace
            | Cns::NamespaceControllerList
            | Cns::ControllerList,
        ) => Err(INVALID_FIELD),
        None if cns == CNS_IO_COMMAND_SET_CONTROLLER => {
            // All zero for the NVM command set: no Verify, Write Zeroes or Dataset Management
            // size limits beyond MDTS. Linux asks for it when VS is 1.2 or later.
            if (sqe.cdw11 >> 24) as u8 != CSI_NVM {
                return Err(INVALID_FIELD);
            }
            Ok([0; IDENTIFY_BYTES])
        }
        None => Err(INVALID_FIELD),
    }
}
