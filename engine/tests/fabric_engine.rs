//! A remote NVMe/TCP namespace runs on the engine's reactors like a local one: a job writes
//! and verifies blocks through a remote `NamespaceDevice` (its channel on a polled I/O queue) against
//! the target's connection state machine on a loopback socket, and the reactor's statistics
//! count its I/O.

use std::net::{SocketAddr, TcpListener, TcpStream};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use usnvme_driver::spec::command::Cns;
use usnvme_driver::spec::log::LogPageId;
use usnvme_driver::spec::{NamespaceList, Sqe, Status};
use usnvme_driver::{pci::Sysfs, ControllerOptions, DeviceSpec, IoBuffer, Opener};
use usnvme_engine::block::remote::RemoteSubsystem;
use usnvme_engine::block::{DmaTarget, NamespaceDevice};
use usnvme_engine::fabric::address::TcpAddress;
use usnvme_engine::fabric::export::connection::{Connection, ConnectionLimits, Receive};
use usnvme_engine::fabric::export::live::{
    LiveTarget, NamespaceRequest, NewDevice, SubsystemRequest,
};
use usnvme_engine::fabric::export::memory::{test_subsystem, MemoryBackend};
use usnvme_engine::fabric::export::registry::Registry;
use usnvme_engine::fabric::export::server::{
    Counters, IdleMode, Inbox, Incoming, ReactorBuffers, ServeJob, Shared, SmartService,
};
use usnvme_engine::fabric::export::{ExportedNamespace, Listener, SubsystemInfo, Subsystems};
use usnvme_engine::fabric::pdu::Digests;
use usnvme_engine::placement::Policy;
use usnvme_engine::stats::{OpKind, Snapshot};
use usnvme_engine::topology::Topology;
use usnvme_engine::transport::tcp::initiator::queue::{Buffers, IoQueue};
use usnvme_engine::transport::tcp::initiator::{CommandQueue, HostOptions};
use usnvme_engine::transport::tcp::initiator::{Failure, QueueParams};
use usnvme_engine::transport::tcp::queues::RemotePath;
use usnvme_engine::transport::{
    ControllerLink, QueueIds, QueueNamespace, ReconnectPolicy, RemoteQueues,
};
use usnvme_engine::{
    attach, BlockDevice, ChannelOptions, Engine, EngineOptions, Job, Op, ReactorContext,
};
use usnvme_hugepages::{BufferPool, DmaBuffer, IovaMemory, IovaSpace, NoIommu, PageSize};
use vm_memory::{Bytes, GuestAddress};

/// The target's connection state machine on a socket, over memory namespaces.
fn serve(mut stream: TcpStream, sub: Arc<SubsystemInfo>, registry: Arc<Registry>) {
    stream.set_nonblocking(true).expect("non-blocking");
    let mut backend = MemoryBackend::new(&sub);
    let limits = ConnectionLimits { maxh2cdata: 16384 };
    let mut conn = Connection::new(Subsystems::one(sub), registry, limits, "test".into());
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

/// A target with one namespace that serves `connections` connections, then no more.
fn target(connections: usize) -> (SocketAddr, Arc<SubsystemInfo>, JoinHandle<()>) {
    target_of(connections, 1)
}

/// The same with `namespaces` namespaces.
fn target_of(
    connections: usize,
    namespaces: u32,
) -> (SocketAddr, Arc<SubsystemInfo>, JoinHandle<()>) {
    target_with(connections, namespaces, Arc::new(Registry::new()))
}

/// The same with its controllers in `registry`.
fn target_with(
    connections: usize,
    namespaces: u32,
    registry: Arc<Registry>,
) -> (SocketAddr, Arc<SubsystemInfo>, JoinHandle<()>) {
    let listener = TcpListener::bind("127.0.0.1:0").expect("bind");
    let addr = listener.local_addr().expect("address");
    let sub = Arc::new(test_subsystem(namespaces));
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

/// An engine (it is built on drives: a simulated one stands by) whose reactors run on the first
/// `cores` CPUs this process may use, without NUMA memory placement.
fn sim_engine(cores: usize, options: EngineOptions) -> Engine {
    // (room for a namespace made while a test runs)
    let specs: Vec<DeviceSpec> = vec!["sim:0,backend=ram,spare=16M".parse().expect("a spec")];
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
    let cores = topology.allowed.iter().copied().take(cores).collect();
    let options = EngineOptions {
        cores,
        numa_memory: false,
        ..options
    };
    Engine::new(topology, drives, options).expect("an engine")
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
            if c.result().is_err() {
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
    let engine = sim_engine(1, EngineOptions::default());

    let (addr, sub, server) = target(2);
    let host = HostOptions {
        timeout: Duration::from_secs(5),
        ..HostOptions::default()
    };
    let (mut admin, cntlid) =
        CommandQueue::connect(addr, &sub.nqn, 0, 32, 0xffff, &host).expect("admin");
    admin.property_set(0x14, false, 0x46_0001).expect("CC.EN");
    let ns = &sub.namespaces[0];
    let queues = RemoteQueues {
        name: format!("tcp://{addr}/{}", sub.nqn),
        subnqn: sub.nqn.clone(),
        host,
        in_capsule: sub.in_capsule_bytes,
        max_transfer: sub.max_transfer,
        max_entries: sub.queue_entries,
        namespaces: 1,
        dma: DmaTarget {
            space: IovaSpace::new(Arc::new(NoIommu)),
            page: PageSize::Small4K,
        },
        paths: vec![RemotePath {
            addr,
            qids: Arc::new(QueueIds::new(sub.io_queues)),
            link: Arc::new(ControllerLink::new("t".into(), cntlid)),
        }],
    };
    let device = NamespaceDevice::remote(
        queues.name.clone(),
        Arc::new(queues),
        QueueNamespace::plain(ns.nsid, ns.block_size, ns.blocks),
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

/// The real target (`usnvme serve`'s reactor job) on a simulated drive, in this process.
struct SimTarget {
    addr: SocketAddr,
    sub: Arc<SubsystemInfo>,
    stop: Arc<std::sync::atomic::AtomicBool>,
    run: usnvme_engine::Run<()>,
    live: Arc<LiveTarget>,
    /// The simulated drive's controller (namespace 1 is exported as namespace 1).
    drive: usnvme_driver::Controller,
}

impl SimTarget {
    fn stop(self) {
        self.stop.store(true, std::sync::atomic::Ordering::Release);
        self.run.wait().expect("the target stops");
    }
}

fn serve_sim() -> SimTarget {
    let options = EngineOptions {
        policy: Policy::AllToAll,
        channel: ChannelOptions {
            depth: 64,
            ..ChannelOptions::default()
        },
        ..EngineOptions::default()
    };
    let engine = sim_engine(1, options);
    let devices = engine.namespaces();
    let drive = engine.drives()[0].controller.clone();
    let listener = TcpListener::bind("127.0.0.1:0").expect("bind");
    let addr = listener.local_addr().expect("address");
    let info = devices[0].info();
    let nqn = "nqn.2024-01.io.usnvme:sim".to_string();
    let sub = Arc::new(SubsystemInfo {
        namespaces: vec![ExportedNamespace {
            nsid: 1,
            name: info.name.clone(),
            block_size: info.block_size,
            blocks: info.size_bytes / u64::from(info.block_size),
            nguid: [1; 16],
            uuid: [2; 16],
            ana_group: 1,
            device: 0,
        }],
        listeners: vec![Listener {
            address: addr,
            port_id: 1,
            transport: usnvme_engine::fabric::address::Transport::Tcp,
        }],
        serial: "sim".into(),
        model: "usnvme".into(),
        firmware: "test".into(),
        nqn,
        in_capsule_bytes: 8192,
        max_transfer: 128 << 10,
        queue_entries: 64,
        io_queues: 8,
        allowed_hosts: None,
        ports: None,
    });
    let subsystems = Subsystems::one(sub.clone());
    let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let registry = Arc::new(Registry::new());
    let shared = Shared {
        subsystems: subsystems.clone(),
        registry: registry.clone(),
        limits: ConnectionLimits { maxh2cdata: 32768 },
        smart: SmartService::start(usnvme_driver::spec::SmartLog::zeroed).expect("SMART"),
        idle: IdleMode::Adaptive,
        stop: stop.clone(),
        counters: Arc::new(Counters::default()),
    };
    let inbox = Inbox::new().expect("inbox");
    let tx = inbox.clone();
    let live = Arc::new(LiveTarget::new(
        subsystems,
        &devices,
        vec![inbox.clone()],
        registry,
    ));
    let run = engine
        .start(devices, move |_| {
            ServeJob::new(
                shared.clone(),
                inbox.clone(),
                ReactorBuffers {
                    size: 64 << 10,
                    count: 64,
                    large: 4,
                },
            )
        })
        .expect("the target's reactors");
    let accepting = stop.clone();
    listener.set_nonblocking(true).expect("non-blocking");
    std::thread::spawn(move || {
        while !accepting.load(std::sync::atomic::Ordering::Acquire) {
            match listener.accept() {
                Ok((s, peer)) => {
                    tx.send(Incoming {
                        stream: s,
                        peer: peer.to_string(),
                        port_id: 1,
                    });
                }
                Err(_) => std::thread::sleep(Duration::from_millis(1)),
            }
        }
    });
    SimTarget {
        addr,
        sub,
        stop,
        run,
        live,
        drive,
    }
}

#[test]
fn the_io_queue_moves_data_through_the_real_target_on_a_sim_drive() {
    let target = serve_sim();
    let (addr, sub) = (target.addr, target.sub.clone());
    const BASE: u64 = 0x10_0000;
    for digests in [
        Digests::default(),
        Digests {
            header: true,
            data: true,
        },
    ] {
        let host = HostOptions {
            digests,
            timeout: Duration::from_secs(5),
            ..HostOptions::default()
        };
        let (mut admin, cntlid) =
            CommandQueue::connect(addr, &sub.nqn, 0, 32, 0xffff, &host).expect("admin");
        admin.property_set(0x14, false, 0x46_0001).expect("CC.EN");
        let mem =
            Arc::new(IovaMemory::from_ranges(&[(GuestAddress(BASE), 4 << 20)]).expect("memory"));
        let params = QueueParams {
            subnqn: sub.nqn.clone(),
            qid: 1,
            cntlid,
            entries: 32,
            nsid: 1,
            block_size: sub.namespaces[0].block_size,
            in_capsule: sub.in_capsule_bytes,
            max_transfer: sub.max_transfer,
            timeout_ns: 5_000_000_000,
        };
        let bs = params.block_size;
        let mut q =
            IoQueue::connect(addr, params, &host, Buffers::Memory(mem.clone())).expect("I/O queue");
        // 16 writes at once: half in the capsule (4 KiB), half by R2T (128 KiB: beyond the
        // reactor's 64 KiB buffers, eight commands for its four large ones, so some wait)
        let size = |i: u64| {
            if i.is_multiple_of(2) {
                4096u32
            } else {
                128 << 10
            }
        };
        let at = |i: u64| i * (128 << 10);
        for i in 0..16u64 {
            let data: Vec<u8> = (0..size(i)).map(|b| (b as u64 * 3 + i) as u8).collect();
            mem.write_slice(&data, GuestAddress(BASE + at(i)))
                .expect("fill");
            let buf = IoBuffer {
                iova: BASE + at(i),
                len: size(i),
            };
            q.submit(Op::Write, at(i) / u64::from(bs), size(i) / bs, Some(buf), i)
                .expect("write");
        }
        let wait = |q: &mut IoQueue| {
            let mut done = Vec::new();
            let deadline = Instant::now() + Duration::from_secs(10);
            while q.in_flight() > 0 {
                assert!(Instant::now() < deadline, "I/O never completed");
                q.poll(|c| done.push((c.token, c.result)));
            }
            done.sort_by_key(|d| d.0);
            done
        };
        let ok: Vec<(u64, Result<(), Failure>)> = (0..16).map(|i| (i, Ok(()))).collect();
        assert_eq!(wait(&mut q), ok);
        // read each back into a buffer of its own, all at once
        for i in 0..16u64 {
            let buf = IoBuffer {
                iova: BASE + (2 << 20) + at(i),
                len: size(i),
            };
            q.submit(Op::Read, at(i) / u64::from(bs), size(i) / bs, Some(buf), i)
                .expect("read");
        }
        assert_eq!(wait(&mut q), ok);
        for i in 0..16u64 {
            let mut got = vec![0u8; size(i) as usize];
            mem.read_slice(&mut got, GuestAddress(BASE + (2 << 20) + at(i)))
                .expect("read");
            let want: Vec<u8> = (0..size(i)).map(|b| (b as u64 * 3 + i) as u8).collect();
            assert!(
                got == want,
                "I/O {i} read back what was written ({digests:?})"
            );
        }
        drop(q);
        admin.disconnect();
    }
    target.stop();
}

#[test]
fn a_drive_added_to_a_running_target_is_its_next_namespace_until_it_is_removed() {
    let target = serve_sim();
    let (mut admin, mut io) = connect_host(&target);
    assert_eq!(active(&mut admin), [1]);
    // a second simulated drive, brought up while the target runs
    let opened = Opener::new("/sys")
        .open(
            &"sim:1,backend=ram".parse().expect("a spec"),
            ControllerOptions::default(),
        )
        .expect("sim:1");
    let controller = opened[0].clone();
    let devices = usnvme_engine::drive_namespaces(1, &controller, None);
    let new = devices
        .into_iter()
        .map(|device| NewDevice {
            device,
            controllers: vec![controller.clone()],
        })
        .collect();
    let added = target.live.add(new).expect("exported");
    assert_eq!((added.len(), added[0].nsid, added[0].device), (1, 2, 1));
    assert_eq!(active(&mut admin), [1, 2], "the host sees it");
    assert_eq!(changed(&mut admin), [2]);
    // data written to namespace 2 is on sim:1, and namespace 1 is still sim:0
    let ones = vec![0x11u8; 4096];
    let twos = vec![0x22u8; 4096];
    io.write(1, 0, 8, &ones).expect("write to 1");
    io.write(2, 0, 8, &twos).expect("write to 2");
    let mut got = vec![0u8; 4096];
    io.read(2, 0, 8, &mut got).expect("read 2");
    assert!(got == twos, "namespace 2 reads back what was written");
    io.read(1, 0, 8, &mut got).expect("read 1");
    assert!(got == ones, "namespace 1 is untouched");
    // gone: namespace 2 is refused by name, namespace 1 goes on
    let removed = target.live.remove(&[1]);
    assert_eq!(removed.iter().map(|n| n.nsid).collect::<Vec<_>>(), [2]);
    assert_eq!(active(&mut admin), [1]);
    assert_eq!(changed(&mut admin), [2]);
    let refused = io.write(2, 0, 8, &twos).expect_err("namespace 2 is gone");
    assert!(
        refused.to_string().contains("Invalid Namespace"),
        "{refused}"
    );
    io.read(1, 0, 8, &mut got).expect("read 1");
    assert!(got == ones);
    drop(io);
    admin.disconnect();
    target.stop();
}

/// A host connected to `target`: its admin queue (the controller enabled) and one I/O queue.
fn connect_host(target: &SimTarget) -> (CommandQueue, CommandQueue) {
    let host = HostOptions {
        timeout: Duration::from_secs(10),
        ..HostOptions::default()
    };
    let nqn = &target.sub.nqn;
    let (mut admin, cntlid) =
        CommandQueue::connect(target.addr, nqn, 0, 32, 0xffff, &host).expect("admin");
    admin.property_set(0x14, false, 0x46_0001).expect("CC.EN");
    let (io, _) = CommandQueue::connect(target.addr, nqn, 1, 32, cntlid, &host).expect("I/O");
    (admin, io)
}

/// An admin command's data; it must succeed.
fn admin_data(admin: &mut CommandQueue, sqe: Sqe) -> Vec<u8> {
    let (cqe, data) = admin.admin(sqe, 4096).expect("an admin command");
    assert_eq!(cqe.status(), Status::SUCCESS);
    data
}

/// The active namespaces as the host reads them.
fn active(admin: &mut CommandQueue) -> Vec<u32> {
    let list = admin_data(admin, Sqe::identify(Cns::ActiveNamespaceList, 0));
    let list: &[u8; 4096] = list[..].try_into().expect("4 KiB");
    NamespaceList::from_bytes(list).iter().collect()
}

/// The Changed Namespace List as the host reads it.
fn changed(admin: &mut CommandQueue) -> Vec<u32> {
    let sqe = Sqe::get_log_page(LogPageId::ChangedNamespaceList, u32::MAX, 4096, 0);
    let log = admin_data(admin, sqe);
    let ids = log
        .chunks(4)
        .map(|b| u32::from_le_bytes([b[0], b[1], b[2], b[3]]));
    ids.take_while(|&id| id != 0).collect()
}

/// Waits (10 s at most) for `ctrl` to report Namespace Attribute Changed.
fn namespace_change(ctrl: &usnvme_driver::Controller) {
    let deadline = Instant::now() + Duration::from_secs(10);
    while !ctrl.events().iter().any(|e| e.is_namespace_change()) {
        assert!(Instant::now() < deadline, "no Namespace Attribute Changed");
        std::thread::yield_now();
    }
}

#[test]
fn a_namespace_attached_to_a_served_drive_is_exported_until_it_is_detached() {
    use usnvme_driver::spec::identify::ControllerList;
    let target = serve_sim();
    let (mut admin, mut io) = connect_host(&target);
    let ctrl = target.drive.clone();
    let export = |nsid| {
        let device = NamespaceDevice::new(target.drive.clone(), nsid, 0);
        device
            .map(|d| Arc::new(d) as Arc<dyn BlockDevice>)
            .map_err(|e| e.to_string())
    };
    let rescan = || {
        namespace_change(&ctrl);
        target
            .live
            .rescan_drive(0, &ctrl, export)
            .expect("rescanned")
    };
    let attachment = |attach: bool| {
        let list = ControllerList::from_ids([ctrl.identify().cntlid]);
        let sqe = Sqe::namespace_attachment(2, attach);
        ctrl.admin_write(sqe, list.as_bytes())
            .expect("namespace attachment");
    };
    // on the drive (as through another controller of a dual-port drive): 256 blocks of 4 KiB
    let mut create = usnvme_driver::spec::IdentifyNamespace::zeroed();
    (create.nsze, create.ncap, create.flbas) = (256, 256, 3);
    let nsid = ctrl.admin_write(Sqe::namespace_create(), create.as_bytes());
    assert_eq!(nsid.expect("created"), 2);
    attachment(true);
    let found = rescan();
    let added: Vec<_> = found
        .added
        .iter()
        .map(|n| (n.nsid, n.block_size, n.blocks))
        .collect();
    assert_eq!(added, [(2, 4096, 256)]);
    assert!(
        found.removed.is_empty() && found.left.is_empty(),
        "{found:?}"
    );
    assert_eq!(active(&mut admin), [1, 2], "the host sees it");
    assert_eq!(changed(&mut admin), [2]);
    let ones = vec![0x11u8; 4096];
    let twos = vec![0x22u8; 4096];
    io.write(1, 0, 8, &ones).expect("write to 1");
    io.write(2, 3, 1, &twos).expect("write to 2");
    let mut got = vec![0u8; 4096];
    io.read(2, 3, 1, &mut got).expect("read 2");
    assert!(got == twos, "namespace 2 reads back what was written");
    // moved to a second subsystem as its namespace 9, a UUID of its own; changed on the drive
    // (512-byte blocks): exported again there, as the same namespace, in its new shape
    let first = "nqn.2024-01.io.usnvme:sim";
    let second = "nqn.2024-01.io.usnvme:second";
    let request = SubsystemRequest {
        nqn: second.into(),
        serial: None,
        model: None,
        allowed_hosts: None,
        ports: None,
    };
    target
        .live
        .add_subsystem(request)
        .expect("a second subsystem");
    let moved = target
        .live
        .unexport(first, 2)
        .expect("taken from the first");
    let uuid = [7u8; 16];
    let into_second = NamespaceRequest {
        device: Some(moved.name.clone()),
        nsid: Some(9),
        uuid: Some(uuid),
        ..NamespaceRequest::default()
    };
    target
        .live
        .export(second, into_second)
        .expect("exported in the second");
    // (deleted and made again between two looks: the same NSID in another shape)
    attachment(false);
    ctrl.admin(Sqe::namespace_delete(2)).expect("deleted");
    (create.nsze, create.ncap, create.flbas) = (2048, 2048, 0);
    let nsid = ctrl.admin_write(Sqe::namespace_create(), create.as_bytes());
    assert_eq!(nsid.expect("created"), 2);
    attachment(true);
    let found = rescan();
    let again: Vec<_> = found
        .added
        .iter()
        .map(|n| (n.nsid, n.block_size, n.uuid))
        .collect();
    assert_eq!(again, [(9, 512, uuid)], "{found:?}");
    let subsystems = target.live.subsystems();
    let in_second = &subsystems.find(second).expect("the second").namespaces;
    assert_eq!(
        in_second
            .iter()
            .map(|n| (n.nsid, n.blocks))
            .collect::<Vec<_>>(),
        [(9, 2048)]
    );
    assert_eq!(
        subsystems.find(first).expect("the first").namespaces.len(),
        1,
        "not in the first"
    );
    // back in the first, as namespace 2
    let back = target
        .live
        .unexport(second, 9)
        .expect("taken from the second");
    let as_2 = NamespaceRequest {
        device: Some(back.name),
        nsid: Some(2),
        ..NamespaceRequest::default()
    };
    target.live.export(first, as_2).expect("namespace 2 again");
    // detached on the drive: gone for the host, refused by name; namespace 1 goes on
    attachment(false);
    let found = rescan();
    assert_eq!(
        found.removed.iter().map(|n| n.nsid).collect::<Vec<_>>(),
        [2]
    );
    assert!(found.added.is_empty(), "{found:?}");
    assert_eq!(active(&mut admin), [1]);
    assert_eq!(changed(&mut admin), [2]);
    let refused = io.read(2, 3, 1, &mut got).expect_err("namespace 2 is gone");
    assert!(
        refused.to_string().contains("Invalid Namespace"),
        "{refused}"
    );
    io.read(1, 0, 8, &mut got).expect("read 1");
    assert!(got == ones, "namespace 1 is untouched");
    drop(io);
    admin.disconnect();
    target.stop();
}

/// Writes `BLOCKS` 4 KiB blocks to its share of every device, each stamped with its device,
/// block and reactor, then reads them back; counts what did not read back as written, and
/// notes the reactor's queues.
struct StampEvery {
    pool: Option<BufferPool>,
    buffers: Vec<DmaBuffer>,
    next: u64,
    reading: bool,
    bad: u64,
    failed: u64,
}

impl StampEvery {
    fn stamp(ctx: &ReactorContext, device: usize, block: u64) -> u8 {
        (device as u64 * 31 + block * 7 + ctx.info.index as u64 * 101) as u8 | 1
    }
}

impl Job for StampEvery {
    type Output = (u64, u64, usize);

    fn prepare(&mut self, ctx: &mut ReactorContext) -> Result<(), String> {
        let count = BLOCKS as usize * ctx.devices.len();
        let mut pool = ctx.devices[0]
            .buffer_pool(IO, count)
            .map_err(|e| e.to_string())?;
        for _ in 0..count {
            self.buffers.push(pool.alloc().ok_or("a buffer")?);
        }
        self.pool = Some(pool);
        Ok(())
    }

    fn turn(&mut self, ctx: &mut ReactorContext) -> bool {
        let op = if self.reading { Op::Read } else { Op::Write };
        let total = BLOCKS * ctx.devices.len() as u64;
        // I/O number n: device n % devices, block n / devices, in this reactor's share
        while self.next < total {
            let devices = ctx.devices.len() as u64;
            let (d, block) = ((self.next % devices) as usize, self.next / devices);
            let stamp = Self::stamp(ctx, d, block);
            let share = ctx.info.shares[d];
            let dev = &mut ctx.devices[d];
            if dev.in_flight() >= 8 {
                break;
            }
            let b = &self.buffers[self.next as usize];
            b.fill(if self.reading { 0 } else { stamp });
            let io = IoBuffer {
                iova: b.iova(),
                len: IO as u32,
            };
            let offset = (share.index as u64 * BLOCKS + block) * IO as u64;
            if dev
                .submit(op, offset, IO as u64, Some(io), self.next)
                .is_err()
            {
                break;
            }
            self.next += 1;
        }
        let devices = ctx.devices.len() as u64;
        for d in 0..ctx.devices.len() {
            let (buffers, bad, failed, reading) =
                (&self.buffers, &mut self.bad, &mut self.failed, self.reading);
            let stamps: Vec<u8> = (0..BLOCKS).map(|b| Self::stamp(ctx, d, b)).collect();
            ctx.devices[d].poll(|c| {
                if c.result().is_err() {
                    *failed += 1;
                    return;
                }
                if reading {
                    let mut got = [0u8; IO];
                    let want = stamps[(c.token / devices) as usize];
                    let ok = buffers[c.token as usize].read_into(&mut got, 0).is_ok();
                    if !ok || got.iter().any(|&x| x != want) {
                        *bad += 1;
                    }
                }
            });
        }
        if self.next == total && ctx.devices.iter().all(|d| d.in_flight() == 0) {
            if self.reading {
                return false;
            }
            (self.reading, self.next) = (true, 0);
        }
        true
    }

    fn finish(mut self, ctx: &mut ReactorContext) -> Self::Output {
        if let Some(pool) = self.pool.as_mut() {
            for b in self.buffers.drain(..) {
                let _ = pool.free(b);
            }
        }
        (self.bad, self.failed, ctx.queue_count())
    }
}

/// The subsystem `sub` at `addr` attached for `io_queues` I/O queues, with a KATO of
/// `kato_ms` (0: none), never reconnected.
fn attach_remote(
    addr: SocketAddr,
    sub: &SubsystemInfo,
    io_queues: u16,
    kato_ms: u32,
) -> RemoteSubsystem {
    let address: TcpAddress = format!("tcp://{addr}/{}", sub.nqn)
        .parse()
        .expect("address");
    let host = HostOptions {
        timeout: Duration::from_secs(5),
        kato_ms,
        ..HostOptions::default()
    };
    let dma = DmaTarget {
        space: IovaSpace::new(Arc::new(NoIommu)),
        page: PageSize::Small4K,
    };
    RemoteSubsystem::attach(&address, &host, ReconnectPolicy::NEVER, io_queues, dma)
        .expect("attached")
}

#[test]
fn four_remote_namespaces_on_two_cores_use_one_io_queue_per_core() {
    // 4 namespaces of depth 8 fit the target's 32-entry queues together
    four_remote_namespaces_on_two_cores(8, 1);
}

#[test]
fn remote_namespaces_deeper_than_one_queue_get_another_queue() {
    // two of depth 16 fill a 32-entry queue: the other two go on a second one, so that all
    // their I/Os can be in flight at once (as SPDK's perf, which takes one per namespace)
    four_remote_namespaces_on_two_cores(16, 2);
}

/// Four remote namespaces, each on both cores at `depth`: every block written reads back,
/// each core on `queues` I/O queues of the target's (4 * depth entries do not fit one).
fn four_remote_namespaces_on_two_cores(depth: u16, queues: usize) {
    let mut options = EngineOptions {
        policy: Policy::AllToAll,
        ..EngineOptions::default()
    };
    options.channel.depth = depth;
    let engine = sim_engine(2, options);
    let reactors = engine.placement().reactors.len();
    // the target serves the admin queue and `queues` I/O queues per core, and no more: one
    // more I/O queue would never be answered and the run would fail
    let connections = 1 + reactors * queues;
    let (addr, sub, server) = target_of(connections, 4);
    let remote = attach_remote(addr, &sub, 4, 0);
    let devices = remote.devices(None).expect("its namespaces");
    assert_eq!(devices.len(), 4);
    let run = engine
        .start(devices, |_| StampEvery {
            pool: None,
            buffers: Vec::new(),
            next: 0,
            reading: false,
            bad: 0,
            failed: 0,
        })
        .expect("started");
    let results = run.wait().expect("the run");
    assert_eq!(results.len(), reactors);
    for r in &results {
        assert_eq!(r.info.devices, [0, 1, 2, 3], "core {}", r.info.cpu);
        let (bad, failed, used) = r.output;
        assert_eq!(
            (bad, failed),
            (0, 0),
            "core {}: (read back wrong, failed)",
            r.info.cpu
        );
        assert_eq!(used, queues, "core {}: I/O queues", r.info.cpu);
        let total = r.stats.total();
        assert_eq!(total.ios(OpKind::Write), 4 * BLOCKS, "core {}", r.info.cpu);
        assert_eq!(total.ios(OpKind::Read), 4 * BLOCKS, "core {}", r.info.cpu);
    }
    drop(remote);
    server.join().expect("the target served its connections");
}

/// Reads the first block over and over, four at a time, until `until`.
struct ReadUntil {
    pool: Option<BufferPool>,
    buffers: Vec<DmaBuffer>,
    until: Instant,
    failed: u64,
}

impl Job for ReadUntil {
    type Output = u64;

    fn prepare(&mut self, ctx: &mut ReactorContext) -> Result<(), String> {
        let mut pool = ctx.devices[0]
            .buffer_pool(IO, 4)
            .map_err(|e| e.to_string())?;
        for _ in 0..4 {
            self.buffers.push(pool.alloc().ok_or("a buffer")?);
        }
        self.pool = Some(pool);
        Ok(())
    }

    fn turn(&mut self, ctx: &mut ReactorContext) -> bool {
        let dev = &mut ctx.devices[0];
        let reading = Instant::now() < self.until;
        while reading && dev.in_flight() < self.buffers.len() {
            let b = &self.buffers[dev.in_flight()];
            let io = IoBuffer {
                iova: b.iova(),
                len: IO as u32,
            };
            if dev.submit(Op::Read, 0, IO as u64, Some(io), 0).is_err() {
                break;
            }
        }
        let failed = &mut self.failed;
        dev.poll(|c| *failed += u64::from(c.result().is_err()));
        reading || dev.in_flight() > 0
    }

    fn finish(mut self, _ctx: &mut ReactorContext) -> u64 {
        if let Some(pool) = self.pool.as_mut() {
            for b in self.buffers.drain(..) {
                let _ = pool.free(b);
            }
        }
        self.failed
    }
}

#[test]
fn a_host_whose_io_flows_sends_no_keep_alive_to_a_traffic_based_target() {
    let engine = sim_engine(1, EngineOptions::default());
    let registry = Arc::new(Registry::new());
    // the admin queue and one I/O queue
    let (addr, sub, server) = target_with(2, 1, registry.clone());
    // KATO 300 ms: the controller thread's period is 100 ms
    let remote = attach_remote(addr, &sub, 1, 300);
    let devices = remote.devices(None).expect("its namespace");
    let before = registry.keep_alives();
    // 2 s of reads: 20 periods, each with I/O in it
    let run = engine
        .start(devices, |_| ReadUntil {
            pool: None,
            buffers: Vec::new(),
            until: Instant::now() + Duration::from_secs(2),
            failed: 0,
        })
        .expect("started");
    let results = run.wait().expect("the run");
    assert_eq!(results[0].output, 0, "reads failed");
    assert!(results[0].stats.total().ios(OpKind::Read) > 20);
    let during = registry.keep_alives() - before;
    // (the period the run started in, and any a busy machine left without a completion, may
    // send one; without traffic-based Keep Alive all 20 would)
    assert!(during <= 4, "{during} Keep Alives while the I/O flowed");
    // idle, the host sends them again (the hang guard is 100 periods)
    let idle_since = registry.keep_alives();
    let deadline = Instant::now() + Duration::from_secs(10);
    while registry.keep_alives() == idle_since {
        assert!(Instant::now() < deadline, "no Keep Alive from an idle host");
        std::thread::sleep(Duration::from_millis(10));
    }
    drop(remote);
    server.join().expect("the target served its connections");
}
