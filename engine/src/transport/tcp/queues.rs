//! Where a remote (NVMe/TCP) controller's I/O queues come from: its address, the association
//! its admin queue made (subsystem, controller ID), its limits, and the I/O queue IDs it
//! granted, one per reactor.

use std::net::SocketAddr;
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use parking_lot::Mutex;

use crate::block::{ChannelOptions, DmaTarget};
use crate::fabric::initiator::queue::Buffers;
use crate::fabric::initiator::session::MAX_ENTRIES;
use crate::fabric::initiator::HostOptions;
use crate::fabric::initiator::{IoQueue, QueueParams};
use crate::transport::QueueNamespace;

/// What the owner learned from a remote controller (its admin queue), shared by the devices
/// of its namespaces: enough to connect I/O queues to it.
#[derive(Debug, Clone)]
pub struct RemoteQueues {
    /// The controller's name in messages (e.g. `tcp://127.0.0.1:4420/nqn…`).
    pub name: String,
    pub addr: SocketAddr,
    pub subnqn: String,
    /// The admin queue's controller ID.
    pub cntlid: u16,
    pub host: HostOptions,
    /// In-capsule data of an I/O command (IOCCSZ * 16 - 64).
    pub in_capsule: u32,
    /// The largest transfer (MDTS).
    pub max_transfer: u32,
    /// Entries an I/O queue may have (CAP.MQES + 1).
    pub max_entries: u16,
    /// The I/O queue IDs it granted: one per reactor.
    pub qids: Arc<QueueIds>,
    /// How many of its namespaces the run uses: a reactor's queue holds commands for each.
    pub namespaces: u16,
    /// Set, once, when the controller is lost (its keep-alive failed), with why: every queue
    /// of it ends at its next poll.
    pub lost: Arc<OnceLock<String>>,
    /// Where I/O buffers come from (any DMA space: no device reaches them).
    pub dma: DmaTarget,
}

/// The I/O queue IDs of one remote controller: a reactor's queue takes the lowest one free and
/// gives it back when it goes (a sweep starts its reactors again for every point).
#[derive(Debug)]
pub struct QueueIds {
    granted: u16,
    in_use: Mutex<Vec<u16>>,
}

impl QueueIds {
    /// IDs 1 ..= `granted` (what Set Features Number of Queues gave).
    pub fn new(granted: u16) -> QueueIds {
        QueueIds {
            granted,
            in_use: Mutex::new(Vec::new()),
        }
    }

    fn take(&self) -> Option<u16> {
        let mut in_use = self.in_use.lock();
        let qid = (1..=self.granted).find(|q| !in_use.contains(q))?;
        in_use.push(qid);
        Some(qid)
    }

    fn give(&self, qid: u16) {
        self.in_use.lock().retain(|&q| q != qid);
    }
}

/// A reactor's NVMe/TCP I/O queue to a remote controller; gives its queue ID back when it goes.
#[derive(Debug)]
pub struct RemoteQueue {
    pub(crate) queue: IoQueue,
    pub(crate) lost: Arc<OnceLock<String>>,
    qid: u16,
    source: Arc<RemoteQueues>,
}

impl Drop for RemoteQueue {
    fn drop(&mut self) {
        self.source.qids.give(self.qid);
    }
}

impl RemoteQueues {
    /// Entries for a reactor's queue: `options`' depth for each namespace the run uses, within
    /// what the controller and the initiator allow.
    pub fn queue_entries(&self, options: &ChannelOptions) -> u16 {
        let most = self.max_entries.clamp(2, MAX_ENTRIES);
        let per_namespace = options.queue_entries(u64::from(self.max_transfer), most - 1);
        (u32::from(per_namespace) * u32::from(self.namespaces.max(1))).clamp(2, u32::from(most))
            as u16
    }

    /// Connects an I/O queue of `entries` entries on the lowest queue ID free; `ns` is the
    /// namespace its Connect names (any of those it carries).
    pub fn connect(
        self: &Arc<Self>,
        ns: QueueNamespace,
        entries: u16,
        options: &ChannelOptions,
    ) -> Result<RemoteQueue, usnvme_driver::Error> {
        let invalid = |what: String| usnvme_driver::Error::Invalid {
            device: self.name.clone(),
            what,
        };
        let Some(qid) = self.qids.take() else {
            return Err(invalid(format!(
                "the controller grants {} I/O queues: one per reactor; use fewer cores (-c)",
                self.qids.granted
            )));
        };
        let timeout = options.timeout.unwrap_or(Duration::from_secs(30));
        let block_size = u64::from(ns.block_size.max(1));
        let params = QueueParams {
            subnqn: self.subnqn.clone(),
            qid,
            cntlid: self.cntlid,
            entries,
            nsid: ns.nsid,
            block_size: ns.block_size,
            in_capsule: self.in_capsule,
            max_transfer: (u64::from(self.max_transfer) / block_size * block_size).max(block_size)
                as u32,
            timeout_ns: timeout.as_nanos().min(u128::from(u64::MAX)) as u64,
        };
        let buffers = Buffers::Space(self.dma.space.clone());
        match IoQueue::connect(self.addr, params, &self.host, buffers) {
            Ok(queue) => Ok(RemoteQueue {
                queue,
                lost: self.lost.clone(),
                qid,
                source: self.clone(),
            }),
            Err(e) => {
                self.qids.give(qid);
                Err(invalid(format!("I/O queue {qid}: {e}")))
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn queue_ids_are_the_lowest_free_of_those_granted_and_come_back() {
        let ids = QueueIds::new(2);
        assert_eq!(
            (ids.take(), ids.take(), ids.take()),
            (Some(1), Some(2), None)
        );
        ids.give(1);
        assert_eq!(ids.take(), Some(1));
        assert_eq!(QueueIds::new(0).take(), None);
    }
}
