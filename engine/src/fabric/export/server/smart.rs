//! The SMART / Health reader thread, so that no reactor waits on a drive's admin queue.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use usnvme_driver::spec::SmartLog;

/// SMART reads queued to the worker at most (more wait in the hosts, answered "busy").
const SMART_QUEUE: usize = 64;

/// The thread that reads SMART / Health from the drives for the connections, so that no
/// reactor waits on a drive's admin queue: a connection's request goes to it with the
/// connection's answer slot, which the connection polls.
#[derive(Clone)]
pub struct SmartService {
    requests: crossbeam_channel::Sender<Arc<SmartSlot>>,
    /// Reads asked for and not answered yet.
    pending: Arc<AtomicU64>,
}

/// Where the SMART thread leaves one connection's answer.
#[derive(Debug, Default)]
pub struct SmartSlot {
    pub(super) answer: parking_lot::Mutex<Option<SmartLog>>,
}

impl std::fmt::Debug for SmartService {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SmartService")
            .field("pending", &self.pending())
            .finish()
    }
}

impl SmartService {
    /// Starts the thread; `read` reads and aggregates the drives' logs. The thread ends when
    /// the last handle goes.
    pub fn start(read: impl Fn() -> SmartLog + Send + 'static) -> std::io::Result<SmartService> {
        let (requests, queue) = crossbeam_channel::bounded::<Arc<SmartSlot>>(SMART_QUEUE);
        let pending = Arc::new(AtomicU64::new(0));
        let done = pending.clone();
        std::thread::Builder::new()
            .name("usnvme-smart".into())
            .spawn(move || {
                while let Ok(slot) = queue.recv() {
                    let log = read();
                    *slot.answer.lock() = Some(log);
                    done.fetch_sub(1, Ordering::Release);
                }
            })?;
        Ok(SmartService { requests, pending })
    }

    /// Queues a read whose answer goes to `slot`; false when the queue is full.
    pub(super) fn request(&self, slot: &Arc<SmartSlot>) -> bool {
        self.pending.fetch_add(1, Ordering::AcqRel);
        let sent = self.requests.try_send(slot.clone()).is_ok();
        if !sent {
            self.pending.fetch_sub(1, Ordering::AcqRel);
        }
        sent
    }

    /// SMART reads asked for and not answered yet.
    pub fn pending(&self) -> u64 {
        self.pending.load(Ordering::Acquire)
    }
}
