//! A remote NVMe/TCP namespace runs on the engine's reactors like a local one: a job writes
//! and verifies blocks through a `TcpNamespaceDevice` (its channel a polled I/O queue) against
//! the target's connection state machine on a loopback socket, and the reactor's statistics
//! count its I/O.

use std::net::{SocketAddr, TcpListener, TcpStream};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use usnvme_driver::{pci::Sysfs, ControllerOptions, DeviceSpec, IoBuffer, Opener};
use usnvme_engine::block::{DmaTarget, TcpNamespaceDevice, TcpNamespaceSpec};
use usnvme_engine::fabric::host::{HostOptions, Queue};
use usnvme_engine::fabric::target::connection::{Connection, ConnectionLimits, Receive};
use usnvme_engine::fabric::target::memory::{test_subsystem, MemoryBackend};
use usnvme_engine::fabric::target::registry::Registry;
use usnvme_engine::fabric::target::SubsystemInfo;
use usnvme_engine::stats::{OpKind, Snapshot};
use usnvme_engine::topology::Topology;
use usnvme_engine::{attach, BlockDevice, Engine, EngineOptions, Job, Op, ReactorContext};
use usnvme_hugepages::{BufferPool, DmaBuffer, IovaSpace, NoIommu, PageSize};

/// The target's connection state machine on a socket, over memory namespaces.
fn serve(mut stream: TcpStream, sub: Arc<SubsystemInfo>, registry: Arc<Registry>) {
    stream.set_nonblocking(true).expect("non-blocking");
    let mut backend = MemoryBackend::new(&sub);
    let limits = ConnectionLimits { maxh2cdata: 16384 };
    let mut conn = Connection::new(sub, registry, limits, "test".into());
    loop {
        match conn.receive_from(&mut stream, &mut backend) {
            Ok(Receive::Ended) | Err(_) => conn.peer_gone("gone", &mut backend),
            Ok(_) => {}
        }
        backend.complete_all(&mut conn);
        conn.tick(Instant::now(), &mut backend);
        if conn.transmit(&mut stream, &mut backend).is_err() {
            conn.peer_gone("gone", &mut backend);
        }
        if conn.finished().is_some() {
            return;
        }
        std::thread::sleep(Duration::from_micros(20));
    }
}

fn target(connections: usize) -> (SocketAddr, Arc<SubsystemInfo>, JoinHandle<()>) {
    let listener = TcpListener::bind("127.0.0.1:0").expect("bind");
    let addr = listener.local_addr().expect("address");
    let sub = Arc::new(test_subsystem(1));
    let registry = Arc::new(Registry::new(None));
    let s = sub.clone();
    let handle = std::thread::spawn(move || {
        let mut served = Vec::new();
        for _ in 0..connections {
            let (stream, _) = listener.accept().expect("accept");
            let (sub, registry) = (s.clone(), registry.clone());
            served.push(std::thread::spawn(move || serve(stream, sub, registry)));
        }
        for t in served {
            t.join().expect("a connection");
        }
    });
    (addr, sub, handle)
}

const BLOCKS: u64 = 64;
const IO: usize = 4096;

/// Writes `BLOCKS` 4 KiB blocks (each stamped with its number), then reads them back; the
/// blocks that did not read back as written.
struct WriteVerify {
    pool: Option<BufferPool>,
    buffers: Vec<DmaBuffer>,
    next: u64,
    reading: bool,
    bad: u64,
    failed: u64,
}

impl Job for WriteVerify {
    type Output = (u64, u64);

    fn prepare(&mut self, ctx: &mut ReactorContext) -> Result<(), String> {
        let dev = &ctx.devices[0];
        let mut pool = dev
            .buffer_pool(IO, BLOCKS as usize)
            .map_err(|e| e.to_string())?;
        for i in 0..BLOCKS {
            let b = pool.alloc().ok_or("a buffer")?;
            b.fill(i as u8 + 1);
            self.buffers.push(b);
        }
        self.pool = Some(pool);
        Ok(())
    }

    fn turn(&mut self, ctx: &mut ReactorContext) -> bool {
        let dev = &mut ctx.devices[0];
        let op = if self.reading { Op::Read } else { Op::Write };
        while self.next < BLOCKS && dev.in_flight() < 16 {
            let b = &self.buffers[self.next as usize];
            if self.reading {
                b.fill(0);
            }
            let io = IoBuffer {
                iova: b.iova(),
                len: IO as u32,
            };
            let offset = self.next * IO as u64;
            if dev
                .submit(op, offset, IO as u64, Some(io), self.next)
                .is_err()
            {
                break;
            }
            self.next += 1;
        }
        let (buffers, bad, failed, reading) =
            (&self.buffers, &mut self.bad, &mut self.failed, self.reading);
        dev.poll(|c| {
            if c.result.is_err() {
                *failed += 1;
                return;
            }
            if reading {
                let mut got = [0u8; IO];
                let ok = buffers[c.token as usize].read_into(&mut got, 0).is_ok();
                if !ok || got.iter().any(|&x| x != c.token as u8 + 1) {
                    *bad += 1;
                }
            }
        });
        if self.next == BLOCKS && dev.in_flight() == 0 {
            if self.reading {
                return false;
            }
            (self.reading, self.next) = (true, 0);
        }
        true
    }

    fn finish(mut self, _ctx: &mut ReactorContext) -> (u64, u64) {
        if let Some(pool) = self.pool.as_mut() {
            for b in self.buffers.drain(..) {
                let _ = pool.free(b);
            }
        }
        (self.bad, self.failed)
    }
}

#[test]
fn a_job_writes_and_verifies_a_remote_namespace_on_a_reactor() {
    // the engine is built on drives; a simulated one stands by
    let specs: Vec<DeviceSpec> = vec!["sim:0,backend=ram".parse().expect("a spec")];
    let drives = attach(
        &Opener::new("/sys"),
        &Sysfs::new(),
        &specs,
        &ControllerOptions::default(),
    )
    .into_iter()
    .collect::<Result<Vec<_>, _>>()
    .expect("the sim drive");
    let topology = Topology::from_sysfs("/".as_ref()).expect("topology");
    let core = *topology.allowed.first().expect("a core");
    let engine = Engine::new(
        topology,
        drives,
        EngineOptions {
            cores: vec![core],
            numa_memory: false,
            ..EngineOptions::default()
        },
    )
    .expect("an engine");

    let (addr, sub, server) = target(2);
    let host = HostOptions {
        timeout: Duration::from_secs(5),
        ..HostOptions::default()
    };
    let (mut admin, cntlid) = Queue::connect(addr, &sub.nqn, 0, 32, 0xffff, &host).expect("admin");
    admin.property_set(0x14, false, 0x46_0001).expect("CC.EN");
    let ns = &sub.namespaces[0];
    let device = TcpNamespaceDevice::new(
        TcpNamespaceSpec {
            name: format!("tcp://{addr}/{}", sub.nqn),
            addr,
            subnqn: sub.nqn.clone(),
            cntlid,
            host,
            nsid: ns.nsid,
            block_size: ns.block_size,
            blocks: ns.blocks,
            in_capsule: sub.in_capsule_bytes,
            max_transfer: sub.max_transfer,
            max_entries: sub.queue_entries,
            io_queues: sub.io_queues,
            qids: Arc::new(std::sync::atomic::AtomicU16::new(1)),
            dma: DmaTarget {
                space: IovaSpace::new(Arc::new(NoIommu)),
                page: PageSize::Small4K,
            },
        },
        None,
    );
    let devices: Vec<Arc<dyn BlockDevice>> = vec![Arc::new(device)];
    let run = engine
        .start(devices, |_| WriteVerify {
            pool: None,
            buffers: Vec::new(),
            next: 0,
            reading: false,
            bad: 0,
            failed: 0,
        })
        .expect("started");
    let results = run.wait().expect("the run");
    assert_eq!(results.len(), 1, "one reactor");
    assert_eq!(
        results[0].output,
        (0, 0),
        "(blocks read back wrong, I/Os failed)"
    );
    let total = Snapshot::aggregate(results.iter().map(|r| &r.stats)).total();
    assert_eq!(total.ios(OpKind::Write), BLOCKS);
    assert_eq!(total.ios(OpKind::Read), BLOCKS);
    admin.disconnect();
    server.join().expect("the target");
}
