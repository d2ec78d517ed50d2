//! A controller's namespaces, read the same way over any transport (PCIe or NVMe/TCP): the
//! Active Namespace ID list (every ID up to NN on a controller without one, NVMe 1.0), then
//! Identify Namespace for each, keeping the active ones with a usable LBA format.

use crate::controller::Namespace;
use crate::spec::command::Cns;
use crate::spec::{IdentifyNamespace, NamespaceList, Sqe};

/// Namespace IDs above this are not supported (the I/O path indexes a table by NSID).
pub const MAX_NSID: u32 = 4096;

/// Bytes an Identify command returns.
pub const IDENTIFY_BYTES: usize = 4096;

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
        if let Some(ns) = usable(name, nsid, id) {
            namespaces.push(ns);
        }
    }
    Ok(namespaces)
}

/// Namespace `nsid` as Identify Namespace describes it, if it is active and its LBA format
/// usable (blocks of 512 bytes to 64 KiB).
fn usable(name: &str, nsid: u32, id: IdentifyNamespace) -> Option<Namespace> {
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
        metadata_size: id.metadata_size(),
        identify: Box::new(id),
    })
}
