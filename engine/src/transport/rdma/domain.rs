//! The host's protection domains: one per RDMA device for the whole process, shared by every
//! queue on it (of any core, controller or path), with each region of DMA memory registered
//! on it once however many queues use it. A registration lives while a queue holds it, and
//! keeps the memory it registered mapped that long (an address range unmapped and mapped
//! again must never reach the adapter under the old registration).
//!
//! Only queue set-up and the first use of newly mapped memory come here (under a lock); the
//! I/O path uses the keys its queue keeps.

use std::io;
use std::sync::{Arc, Weak};

use parking_lot::Mutex;
use usnvme_hugepages::IovaMemory;

use super::verbs::{CmId, MemoryRegion, ProtectionDomain};

/// The live domains, by device.
static DOMAINS: Mutex<Vec<Weak<Domain>>> = Mutex::new(Vec::new());

/// A device's protection domain and what is registered on it.
#[derive(Debug)]
pub struct Domain {
    device: usize,
    /// The registrations queues hold.
    registered: Mutex<Vec<Weak<Registration>>>,
    pd: ProtectionDomain,
}

/// A region of DMA memory registered on a domain: IOVAs `start..end` under these keys. Field
/// order is drop order: deregistered before the memory and the domain may go.
#[derive(Debug)]
pub struct Registration {
    pub start: u64,
    pub end: u64,
    pub lkey: u32,
    pub rkey: u32,
    host: usize,
    _mr: MemoryRegion,
    _memory: Arc<IovaMemory>,
    _domain: Arc<Domain>,
}

impl Domain {
    /// The domain of connection `id`'s device (made on first use).
    pub fn of(id: &CmId) -> io::Result<Arc<Domain>> {
        let device = id.device();
        let mut domains = DOMAINS.lock();
        domains.retain(|d| d.strong_count() > 0);
        if let Some(d) = domains
            .iter()
            .filter_map(Weak::upgrade)
            .find(|d| d.device == device)
        {
            return Ok(d);
        }
        let domain = Arc::new(Domain {
            device,
            registered: Mutex::new(Vec::new()),
            pd: id.alloc_pd()?,
        });
        domains.push(Arc::downgrade(&domain));
        Ok(domain)
    }

    pub fn pd(&self) -> &ProtectionDomain {
        &self.pd
    }

    /// The registration of `memory`'s region at IOVA `start` (`len` bytes at host address
    /// `host`): the one there is, or a new one.
    pub fn register(
        self: &Arc<Self>,
        memory: &Arc<IovaMemory>,
        start: u64,
        host: *mut u8,
        len: usize,
    ) -> io::Result<Arc<Registration>> {
        let mut registered = self.registered.lock();
        registered.retain(|r| r.strong_count() > 0);
        let end = start + len as u64;
        if let Some(r) = registered
            .iter()
            .filter_map(Weak::upgrade)
            .find(|r| r.start == start && r.end == end && r.host == host as usize)
        {
            return Ok(r);
        }
        let mr = self.pd.register(host, len, start)?;
        let r = Arc::new(Registration {
            start,
            end,
            lkey: mr.lkey(),
            rkey: mr.rkey(),
            host: host as usize,
            _mr: mr,
            _memory: memory.clone(),
            _domain: self.clone(),
        });
        registered.push(Arc::downgrade(&r));
        Ok(r)
    }
}

/// The regions registered in this process now, on all devices (each once, however many
/// queues use it).
pub fn registered_regions() -> usize {
    let domains: Vec<_> = DOMAINS.lock().iter().filter_map(Weak::upgrade).collect();
    domains
        .iter()
        .map(|d| {
            d.registered
                .lock()
                .iter()
                .filter(|r| r.strong_count() > 0)
                .count()
        })
        .sum()
}
