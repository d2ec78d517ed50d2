//! Namespace management: the namespaces the sim's NVM subsystem has allocated, which of them
//! are attached to its one controller, and the commands that change that (Namespace Management
//! create and delete, Namespace Attachment), with the Namespace Attribute Changed event and the
//! Changed Namespace List log they raise, as NVMe Base 2.0 sections 5.22-5.23 say.

use super::queue::Sq;
use super::{io, AsyncEventSpec, Ctx, Outcome, SimNamespace};
use crate::protection::{Guard, MetadataFormat, PiFormat, PiType};
use crate::spec::identify::ControllerList;
use crate::spec::{IdentifyNamespace, LbaFormat, NamespaceList, Sqe, Status};

/// The largest namespace ID (Identify Controller NN) unless more namespaces are configured.
pub(super) const NAMESPACE_SLOTS: usize = 32;
/// The sim's controller ID, the one entry of its subsystem's controller list.
pub(super) const CNTLID: u16 = 1;
/// Formats a namespace may be created with (the common Identify Namespace, NSID FFFFFFFFh):
/// (log2 of the data size, metadata bytes).
pub(super) const FORMATS: [(u8, u16); 7] = [
    (9, 0),
    (9, 8),
    (9, 16),
    (12, 0),
    (12, 8),
    (12, 16),
    (12, 64),
];

/// One allocated namespace.
#[derive(Debug, Clone, Copy)]
pub(super) struct Allocated {
    pub ns: SimNamespace,
    pub attached: bool,
}

/// Namespaces by ID - 1, and the IDs whose attributes changed since the host last read the
/// Changed Namespace List.
#[derive(Debug)]
pub(super) struct NamespaceTable {
    pub slots: Vec<Option<Allocated>>,
    changed: Vec<u32>,
    /// A Namespace Attribute Changed event is waiting or was reported and its log not read:
    /// no second one until then.
    event_outstanding: bool,
}

impl NamespaceTable {
    /// The configured namespaces, attached, and free IDs up to [`NAMESPACE_SLOTS`].
    pub fn new(configured: &[SimNamespace]) -> NamespaceTable {
        let mut slots: Vec<Option<Allocated>> = configured
            .iter()
            .map(|&ns| Some(Allocated { ns, attached: true }))
            .collect();
        slots.resize(configured.len().max(NAMESPACE_SLOTS), None);
        NamespaceTable {
            slots,
            changed: Vec::new(),
            event_outstanding: false,
        }
    }

    /// The largest namespace ID.
    pub fn nn(&self) -> u32 {
        self.slots.len() as u32
    }

    /// Namespace `nsid` if it is allocated.
    pub fn allocated(&self, nsid: u32) -> Option<Allocated> {
        let i = nsid.checked_sub(1)? as usize;
        self.slots.get(i).copied().flatten()
    }

    /// Namespace `nsid` if it is attached (active): its index and geometry.
    pub fn active(&self, nsid: u32) -> Option<(usize, SimNamespace)> {
        self.allocated(nsid)
            .filter(|a| a.attached)
            .map(|a| (nsid as usize - 1, a.ns))
    }

    /// IDs above `after` that `keep` keeps, ascending.
    pub fn ids(&self, after: u32, keep: impl Fn(&Allocated) -> bool) -> NamespaceList {
        NamespaceList::from_ids(
            self.slots
                .iter()
                .enumerate()
                .filter(|(_, a)| a.as_ref().is_some_and(&keep))
                .map(|(i, _)| i as u32 + 1)
                .filter(|&id| id > after),
        )
    }

    /// Bytes the allocated namespaces take.
    pub fn allocated_bytes(&self) -> u128 {
        self.slots
            .iter()
            .flatten()
            .map(|a| u128::from(a.ns.blocks) * u128::from(a.ns.block_size))
            .sum()
    }

    /// Notes that `nsid`'s attributes changed; true if an event is to be raised for it.
    fn changed(&mut self, nsid: u32) -> bool {
        if !self.changed.contains(&nsid) {
            self.changed.push(nsid);
        }
        !std::mem::replace(&mut self.event_outstanding, true)
    }

    /// The Changed Namespace List log (1024 IDs; FFFFFFFFh first when more changed), cleared
    /// unless `retain`.
    pub fn changed_log(&mut self, retain: bool) -> NamespaceList {
        let mut ids = self.changed.clone();
        ids.sort_unstable();
        let list = if ids.len() > 1024 {
            NamespaceList::from_ids([u32::MAX])
        } else {
            NamespaceList::from_ids(ids)
        };
        if !retain {
            self.changed.clear();
            self.event_outstanding = false;
        }
        list
    }
}

/// The Identify Namespace of namespace `nsid`, from its geometry.
pub(super) fn identify(ns: &SimNamespace, unique: [u8; 8], nsid: u32) -> IdentifyNamespace {
    let mut id = IdentifyNamespace::zeroed();
    id.nsze = ns.blocks;
    id.ncap = ns.blocks;
    id.nuse = ns.blocks;
    let md = ns.metadata;
    id.lbaf[0] = LbaFormat::new(ns.block_size.trailing_zeros() as u8, md.size);
    id.flbas = if md.extended { 0x10 } else { 0 };
    id.mc = 0b11; // metadata after each block's data, or apart
    id.dpc = 0b1_1111; // types 1 to 3, the tuple first or last
    if let Some(pi) = md.protection {
        id.dps = match pi.pi_type {
            PiType::Type1 => 1,
            PiType::Type2 => 2,
            PiType::Type3 => 3,
        } | if pi.first { 8 } else { 0 };
    }
    id.nmic = 1; // may be shared
    id.dlfeat = 0b1001; // deallocated blocks read as zeroes; Write Zeroes may deallocate
    id.nvmcap = (ns.blocks as u128 * ns.block_size as u128).to_le_bytes();
    id.nguid[..8].copy_from_slice(&unique);
    id.nguid[8..].copy_from_slice(&u64::from(nsid).to_be_bytes());
    id.eui64 = unique;
    id
}

/// The common Identify Namespace (NSID FFFFFFFFh): the formats namespaces are created with.
pub(super) fn identify_common() -> IdentifyNamespace {
    let mut id = IdentifyNamespace::zeroed();
    for (slot, &(lbads, ms)) in id.lbaf.iter_mut().zip(&FORMATS) {
        *slot = LbaFormat::new(lbads, ms);
    }
    id.nlbaf = FORMATS.len() as u8 - 1;
    id.mc = 0b11;
    id.dpc = 0b1_1111;
    id
}

/// Namespace Management (SEL 0 create, 1 delete).
pub(super) fn management(ctx: &Ctx, sq: &mut Sq, sqe: &Sqe) -> Result<Outcome, Outcome> {
    match sqe.cdw10 & 0xf {
        0 => create(ctx, sq, sqe),
        1 => delete(ctx, sq, sqe),
        _ => Err(Outcome::fail(Status::INVALID_FIELD).at(40)),
    }
}

/// Create: a namespace of the size and format the data's Identify Namespace fields say, at
/// the lowest free ID, detached.
fn create(ctx: &Ctx, sq: &mut Sq, sqe: &Sqe) -> Result<Outcome, Outcome> {
    if sqe.cdw11 >> 24 != 0 {
        // CSI: only the NVM command set
        return Err(Outcome::fail(Status::INVALID_FIELD).at(47));
    }
    let bytes = IdentifyNamespace::SIZE as u64;
    io::data_segments(ctx, sqe, bytes, &mut sq.segs)?;
    io::gather(ctx, &sq.segs, bytes, &mut sq.data)?;
    let Some(asked) = IdentifyNamespace::from_slice(&sq.data[..IdentifyNamespace::SIZE]) else {
        return Err(Outcome::fail(Status::INVALID_FIELD).at(24));
    };
    let index = asked.formatted_lba_index();
    let Some(&(lbads, ms)) = FORMATS.get(index) else {
        return Err(Outcome::fail(Status::INVALID_FORMAT).at(24));
    };
    let pi_type = match asked.dps & 7 {
        0 => None,
        1 => Some(PiType::Type1),
        2 => Some(PiType::Type2),
        3 => Some(PiType::Type3),
        _ => return Err(Outcome::fail(Status::INVALID_FORMAT).at(24)),
    };
    if pi_type.is_some() && ms < 8 {
        return Err(Outcome::fail(Status::INVALID_FORMAT).at(24));
    }
    if asked.nsze == 0 {
        return Err(Outcome::fail(Status::INVALID_FIELD).at(24));
    }
    if asked.ncap != asked.nsze {
        return Err(Outcome::fail(Status::THIN_PROVISIONING_NOT_SUPPORTED).at(24));
    }
    let ns = SimNamespace {
        block_size: 1 << lbads,
        blocks: asked.nsze,
        metadata: MetadataFormat {
            size: ms,
            extended: asked.metadata_extended(),
            protection: pi_type.map(|pi_type| PiFormat {
                pi_type,
                guard: Guard::Crc16,
                first: asked.dps & 8 != 0,
            }),
        },
    };
    let mut table = ctx.inner.namespaces.write();
    let wanted = u128::from(ns.blocks) * u128::from(ns.block_size);
    if table.allocated_bytes() + wanted > ctx.inner.config.capacity() {
        return Err(Outcome::fail(Status::NAMESPACE_INSUFFICIENT_CAPACITY).at(24));
    }
    let Some(free) = table.slots.iter().position(Option::is_none) else {
        return Err(Outcome::fail(Status::NAMESPACE_ID_UNAVAILABLE));
    };
    table.slots[free] = Some(Allocated {
        ns,
        attached: false,
    });
    // a fresh namespace holds nothing: what an earlier one of this ID kept is gone
    ctx.inner.stores[free].clear();
    ctx.inner.metadata_stores[free].clear();
    Ok(Outcome::ok(free as u32 + 1))
}

/// Delete: namespace `nsid` (or every one), detached first; its data is gone.
fn delete(ctx: &Ctx, sq: &mut Sq, sqe: &Sqe) -> Result<Outcome, Outcome> {
    let mut table = ctx.inner.namespaces.write();
    let nsids: Vec<u32> = if sqe.nsid == u32::MAX {
        table.ids(0, |_| true).iter().collect()
    } else {
        match table.allocated(sqe.nsid) {
            Some(_) => vec![sqe.nsid],
            None => return Err(Outcome::fail(Status::INVALID_NAMESPACE).at(4)),
        }
    };
    let mut notify = false;
    for nsid in nsids {
        let i = nsid as usize - 1;
        if table.slots[i].take().is_some_and(|a| a.attached) {
            notify |= table.changed(nsid);
        }
        ctx.inner.stores[i].clear();
        ctx.inner.metadata_stores[i].clear();
    }
    drop(table);
    if notify {
        attribute_changed(ctx, sq);
    }
    Ok(Outcome::ok(0))
}

/// Namespace Attachment (SEL 0 attach, 1 detach) of `nsid` to the controllers of the data: the
/// sim's subsystem has one controller, [`CNTLID`].
pub(super) fn attachment(ctx: &Ctx, sq: &mut Sq, sqe: &Sqe) -> Result<Outcome, Outcome> {
    let attach = match sqe.cdw10 & 0xf {
        0 => true,
        1 => false,
        _ => return Err(Outcome::fail(Status::INVALID_FIELD).at(40)),
    };
    let bytes = ControllerList::SIZE as u64;
    io::data_segments(ctx, sqe, bytes, &mut sq.segs)?;
    io::gather(ctx, &sq.segs, bytes, &mut sq.data)?;
    let Some(list) = ControllerList::from_slice(&sq.data[..ControllerList::SIZE]) else {
        return Err(Outcome::fail(Status::INVALID_FIELD).at(24));
    };
    if list.count == 0 || list.iter().any(|id| id != CNTLID) {
        return Err(Outcome::fail(Status::CONTROLLER_LIST_INVALID).at(24));
    }
    let mut table = ctx.inner.namespaces.write();
    let nsid = sqe.nsid;
    let Some(slot) = nsid
        .checked_sub(1)
        .and_then(|i| table.slots.get_mut(i as usize))
        .and_then(Option::as_mut)
    else {
        return Err(Outcome::fail(Status::INVALID_NAMESPACE).at(4));
    };
    match (attach, slot.attached) {
        (true, true) => return Err(Outcome::fail(Status::NAMESPACE_ALREADY_ATTACHED)),
        (false, false) => return Err(Outcome::fail(Status::NAMESPACE_NOT_ATTACHED)),
        _ => slot.attached = attach,
    }
    let notify = table.changed(nsid);
    drop(table);
    if notify {
        attribute_changed(ctx, sq);
    }
    Ok(Outcome::ok(0))
}

/// Raises the Namespace Attribute Changed notice: into a held Asynchronous Event Request if
/// one is outstanding, else kept for the next.
fn attribute_changed(ctx: &Ctx, sq: &mut Sq) {
    ctx.inner.note_event(AsyncEventSpec {
        kind: 2, // notice
        info: 0, // namespace attribute changed
        log_page: 4,
        critical_warning: 0,
    });
    ctx.inner.deliver_events(ctx, sq);
}
