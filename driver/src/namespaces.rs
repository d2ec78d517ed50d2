//! A controller's namespaces, read the same way over any transport (PCIe or NVMe/TCP): the
//! Active Namespace ID list (every ID up to NN on a controller without one, NVMe 1.0), then
//! Identify Namespace for each, keeping the active ones with a usable LBA format; for one with
//! protection information, the NVM command set's Identify Namespace too (the guard's width).
//! Also the [`Namespace`] type itself, the set a controller keeps, and what a rescan changed.

use std::sync::Arc;

use crate::protection::{Guard, MetadataFormat};
use crate::queue::NamespaceGeometry;
use crate::spec::command::Cns;
use crate::spec::identify::nvm_format_guard;
use crate::spec::{IdentifyNamespace, NamespaceList, Sqe};

/// Namespace IDs above this are not supported (the I/O path indexes a table by NSID).
pub const MAX_NSID: u32 = 4096;

/// Bytes an Identify command returns.
pub const IDENTIFY_BYTES: usize = 4096;

/// A namespace as Identify Namespace describes it.
#[derive(Debug, Clone)]
pub struct Namespace {
    pub nsid: u32,
    /// Bytes per logical block of the LBA format in use.
    pub block_size: u32,
    pub blocks: u64,
    /// Metadata bytes per block, where they travel, and the protection information in them.
    pub metadata: MetadataFormat,
    pub identify: Box<IdentifyNamespace>,
}

impl Namespace {
    pub fn capacity_bytes(&self) -> u64 {
        self.blocks.saturating_mul(self.block_size as u64)
    }
}

/// Why an Identify command gave no data.
#[derive(Debug)]
pub enum IdentifyFailure<E> {
    /// The controller completed it with an error status (in the transport's words).
    Status(E),
    /// It did not complete: the transport's error, which ends the scan.
    Transport(E),
}

/// The namespaces of the controller `name` (which reports `nn` in Identify Controller), by
/// `identify`: runs one Identify command, its data into the buffer.
pub fn scan<E>(
    name: &str,
    nn: u32,
    mut identify: impl FnMut(Sqe, &mut [u8]) -> Result<(), IdentifyFailure<E>>,
) -> Result<Vec<Namespace>, E> {
    let mut buf = vec![0u8; IDENTIFY_BYTES];
    let mut ids: Vec<u32> = match identify(Sqe::identify(Cns::ActiveNamespaceList, 0), &mut buf) {
        Ok(()) => NamespaceList::from_slice(&buf)
            .map(|l| l.iter().collect())
            .unwrap_or_default(),
        Err(IdentifyFailure::Status(_)) => (1..=nn.min(1024)).collect(),
        Err(IdentifyFailure::Transport(e)) => return Err(e),
    };
    // The list is ascending by the spec; a broken one must not make a namespace appear twice.
    ids.sort_unstable();
    ids.dedup();
    let mut namespaces = Vec::new();
    for nsid in ids {
        if nsid > MAX_NSID {
            log::warn!("{name}: namespace {nsid}: IDs above {MAX_NSID} are not supported; skipped");
            continue;
        }
        buf.fill(0);
        // a namespace the controller lists but will not describe: an error, not a guess
        match identify(Sqe::identify(Cns::Namespace, nsid), &mut buf) {
            Ok(()) => {}
            Err(IdentifyFailure::Status(e) | IdentifyFailure::Transport(e)) => return Err(e),
        }
        let Some(id) = IdentifyNamespace::from_slice(&buf) else {
            continue;
        };
        // the guard's width: 16 bits unless the NVM command set's structure says otherwise (a
        // controller without it has only 16-bit guards)
        let mut guard = Some(Guard::Crc16);
        if id.dps & 7 != 0 {
            buf.fill(0);
            match identify(Sqe::identify(Cns::NvmNamespace, nsid), &mut buf) {
                Ok(()) => guard = nvm_format_guard(&buf, id.formatted_lba_index()),
                Err(IdentifyFailure::Status(_)) => {}
                Err(IdentifyFailure::Transport(e)) => return Err(e),
            }
        }
        if let Some(ns) = usable(name, nsid, id, guard) {
            namespaces.push(ns);
        }
    }
    Ok(namespaces)
}

/// Namespace `nsid` as Identify Namespace describes it, if it is active and its LBA format
/// usable (blocks of 512 bytes to 64 KiB). `guard`: the width of its protection information's
/// guard (None: one usnvme does not know, 32 bits).
fn usable(name: &str, nsid: u32, id: IdentifyNamespace, guard: Option<Guard>) -> Option<Namespace> {
    if id.nsze == 0 {
        return None; // inactive
    }
    let Some(block_size) = id.lba_size_bytes().filter(|b| (512..=1 << 16).contains(b)) else {
        log::warn!("{name}: namespace {nsid} has an unusable LBA format; skipped");
        return None;
    };
    Some(Namespace {
        nsid,
        block_size: block_size as u32,
        blocks: id.nsze,
        metadata: MetadataFormat {
            size: id.metadata_size(),
            extended: id.metadata_extended(),
            protection: match guard {
                Some(g) => id
                    .protection(g)
                    .filter(|pi| pi.offset(id.metadata_size().into()).is_some()),
                None => {
                    log::warn!("{name}: namespace {nsid}: its protection information has a guard usnvme does not know (32 bits): its tuples are neither made nor checked");
                    None
                }
            },
        },
        identify: Box::new(id),
    })
}

/// The active namespaces, and their geometry as the queue pairs check it.
pub(crate) struct NamespaceSet {
    pub(crate) list: Arc<[Namespace]>,
    pub(crate) geometry: Arc<[NamespaceGeometry]>,
}

impl NamespaceSet {
    pub(crate) fn new(list: Vec<Namespace>) -> NamespaceSet {
        NamespaceSet {
            geometry: geometry_table(&list),
            list: Arc::from(list),
        }
    }
}

/// What a rescan of the active namespaces found, by namespace ID.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct NamespaceChanges {
    /// Active now, not before (attached).
    pub added: Vec<u32>,
    /// Active before, not now (detached or deleted).
    pub removed: Vec<u32>,
    /// Active before and now, but not the same: another size, block size or metadata (formatted
    /// or resized), or another namespace at the same ID (another NGUID or EUI-64).
    pub changed: Vec<u32>,
}

impl NamespaceChanges {
    pub(crate) fn between(before: &[Namespace], now: &[Namespace]) -> NamespaceChanges {
        let find = |list: &[Namespace], nsid| list.iter().find(|n| n.nsid == nsid).cloned();
        let mut changes = NamespaceChanges::default();
        for n in now {
            match find(before, n.nsid) {
                None => changes.added.push(n.nsid),
                Some(b) if !same_namespace(&b, n) => changes.changed.push(n.nsid),
                Some(_) => {}
            }
        }
        let gone = before.iter().filter(|b| find(now, b.nsid).is_none());
        changes.removed = gone.map(|b| b.nsid).collect();
        changes
    }

    pub fn is_empty(&self) -> bool {
        self.added.is_empty() && self.removed.is_empty() && self.changed.is_empty()
    }
}

/// Whether two reads of one namespace ID describe the same namespace in the same shape.
fn same_namespace(a: &Namespace, b: &Namespace) -> bool {
    (a.block_size, a.blocks, a.metadata) == (b.block_size, b.blocks, b.metadata)
        && (a.identify.nguid, a.identify.eui64) == (b.identify.nguid, b.identify.eui64)
}

/// Geometry indexed by nsid - 1, for O(1) checks on the I/O path.
fn geometry_table(namespaces: &[Namespace]) -> Arc<[NamespaceGeometry]> {
    let len = namespaces
        .iter()
        .map(|n| n.nsid)
        .max()
        .unwrap_or(0)
        .min(MAX_NSID) as usize;
    let mut table = vec![
        NamespaceGeometry {
            nsid: 0,
            block_size: 0,
            blocks: 0,
            metadata: MetadataFormat::default(),
        };
        len
    ];
    for n in namespaces.iter().filter(|n| (n.nsid as usize) <= len) {
        table[n.nsid as usize - 1] = NamespaceGeometry {
            nsid: n.nsid,
            block_size: n.block_size,
            blocks: n.blocks,
            metadata: n.metadata,
        };
    }
    Arc::from(table)
}
