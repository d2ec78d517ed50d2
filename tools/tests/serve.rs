//! `usnvme serve` on `sim:` drives over 127.0.0.1, reached with the project's NVMe/TCP host
//! side (`usnvme_engine::transport::tcp::initiator`): discovery, connect, identify, data written and read
//! back over in-capsule and R2T writes, with and without digests, refusals by name, SIGTERM,
//! SMART reads that do not hold I/O up, shutdowns that flush, and no memory kept per connection.

use std::io::Read;
use std::net::TcpStream;
use std::process::Command;
use std::time::{Duration, Instant};

use usnvme_driver::spec::{IdentifyController, IdentifyNamespace, Sqe, Status};
use usnvme_engine::fabric::export::DISCOVERY_NQN;
use usnvme_engine::fabric::pdu::Digests;
use usnvme_engine::transport::tcp::initiator::{CommandQueue, HostError, HostOptions};
use usnvme_tests::signal;

#[path = "common/serve.rs"]
mod target;
use target::{Serve, HOST, NQN};

fn identify(q: &mut CommandQueue, cns: u32, nsid: u32) -> Vec<u8> {
    let mut sqe = Sqe::new(0x06);
    sqe.nsid = nsid;
    sqe.cdw10 = cns;
    let (cqe, data) = q.admin(sqe, 4096).expect("identify");
    assert_eq!(cqe.status(), Status::SUCCESS);
    data
}

fn options(digests: Digests) -> HostOptions {
    HostOptions {
        digests,
        host_nqn: HOST.into(),
        ..HostOptions::default()
    }
}

#[test]
fn a_host_discovers_connects_and_reads_back_what_it_wrote_with_and_without_digests() {
    let serve = Serve::start(&["--allow-host", HOST]);
    for digests in [
        Digests::default(),
        Digests {
            header: true,
            data: true,
        },
    ] {
        let opts = options(digests);
        // Discovery: the log names the subsystem at the listener.
        let (mut disc, _) = serve.admin(DISCOVERY_NQN, &opts);
        let mut sqe = Sqe::new(0x02);
        sqe.cdw10 = 0x70 | ((3072 / 4 - 1) << 16);
        let (cqe, log) = disc.admin(sqe, 3072).expect("discovery log");
        assert_eq!(cqe.status(), Status::SUCCESS);
        assert_eq!(
            u64::from_le_bytes(log[8..16].try_into().unwrap()),
            2,
            "the discovery subsystem and ours"
        );
        for (entry, subtype, nqn) in [
            (&log[1024..2048], 3, DISCOVERY_NQN),
            (&log[2048..3072], 2, NQN),
        ] {
            assert_eq!((entry[0], entry[2]), (3, subtype), "TCP, subsystem type");
            let subnqn = String::from_utf8_lossy(&entry[256..512]);
            assert_eq!(subnqn.trim_end_matches('\0'), nqn);
            let port = String::from_utf8_lossy(&entry[32..64]);
            assert_eq!(port.trim(), serve.addr.port().to_string());
        }
        disc.disconnect();

        // The subsystem: identify, then an I/O queue.
        let (mut admin, cntlid) = serve.admin(NQN, &opts);
        let id = IdentifyController::from_slice(&identify(&mut admin, 1, 0)).expect("4096 bytes");
        assert_eq!(id.subnqn(), NQN);
        assert_eq!(id.cntlid, cntlid);
        assert_ne!(id.sgls, 0);
        assert_eq!(
            id.mdts, 8,
            "1 MiB: a host's 512 KiB or 1 MiB I/O is one command"
        );
        let in_capsule = (id.ioccsz as usize * 16).saturating_sub(64);
        let ns = IdentifyNamespace::from_slice(&identify(&mut admin, 0, 2)).expect("4096 bytes");
        assert_eq!(ns.nsze, 16 << 20 >> 9, "16 MiB of 512-byte blocks");
        let (mut io, _) =
            CommandQueue::connect(serve.addr, NQN, 1, 32, cntlid, &opts).expect("I/O queue");
        io.set_in_capsule_limit(in_capsule);
        for (nsid, slba, len) in [
            (1u32, 8u64, 4096usize),
            (2, 1000, 64 << 10),
            (1, 30000, 128 << 10),
            // beyond the reactor's usual 128 KiB buffers: one of its large ones
            (2, 4096, 1 << 20),
        ] {
            let data: Vec<u8> = (0..len)
                .map(|i| (i * 7 + nsid as usize + slba as usize) as u8)
                .collect();
            io.write(nsid, slba, (len / 512) as u32, &data)
                .expect("write");
            let mut back = vec![0u8; len];
            io.read(nsid, slba, (len / 512) as u32, &mut back)
                .expect("read");
            assert!(back == data, "nsid {nsid} LBA {slba}: read back differs");
        }
        // the other namespace at the same LBA was not written
        let mut other = vec![0xAAu8; 4096];
        io.read(2, 8, 8, &mut other).expect("read");
        assert!(other.iter().all(|&b| b == 0));
        // past the end: a status by name, and the queue goes on
        let mut buf = vec![0u8; 4096];
        match io.read(1, (16 << 20 >> 9) - 4, 8, &mut buf) {
            Err(HostError::Status { status, .. }) => {
                assert_eq!(status, Status::LBA_OUT_OF_RANGE.with_dnr())
            }
            other => panic!("{other:?}"),
        }
        io.read(1, 8, 1, &mut buf[..512]).expect("still usable");
        io.disconnect();
        admin.disconnect();
    }
}

/// The UUIDs serve's status gives its namespaces, by NSID.
fn namespace_uuids(serve: &Serve) -> Vec<(u64, String)> {
    let status = serve.wait_for_status("a status", |s| s["namespaces"].is_array());
    status["namespaces"]
        .as_array()
        .expect("namespaces")
        .iter()
        .map(|n| {
            let uuid = n["uuid"].as_str().expect("a UUID").to_string();
            (n["nsid"].as_u64().expect("an NSID"), uuid)
        })
        .collect()
}

#[test]
fn each_namespace_has_a_uuid_descriptor_beside_its_nguid_the_same_after_a_restart() {
    let opts = options(Digests::default());
    let mut seen = Vec::new();
    for _run in 0..2 {
        let serve = Serve::start(&["--allow-host", HOST]);
        let uuids = namespace_uuids(&serve);
        assert_eq!(uuids.len(), 2, "{uuids:?}");
        assert_ne!(uuids[0].1, uuids[1].1, "each namespace its own UUID");
        let (mut admin, _) = serve.admin(NQN, &opts);
        for (nsid, uuid) in &uuids {
            // CNS 03h: NGUID (type 2), then UUID (type 3), 16 bytes each, then the end
            let list = identify(&mut admin, 3, *nsid as u32);
            assert_eq!((list[0], list[1], list[20], list[21]), (2, 16, 3, 16));
            let nguid = IdentifyNamespace::from_slice(&identify(&mut admin, 0, *nsid as u32))
                .expect("4096 bytes")
                .nguid;
            assert_eq!(list[4..20], nguid, "the NGUID Identify Namespace gives");
            let wire = uuid::Uuid::from_slice(&list[24..40]).expect("16 bytes");
            assert_eq!(&wire.hyphenated().to_string(), uuid, "NSID {nsid}");
            assert_eq!(list[40], 0, "the list ends");
        }
        admin.disconnect();
        seen.push(uuids);
    }
    assert_eq!(seen[0], seen[1], "the same UUIDs after a restart");
}

#[test]
fn a_host_not_allowed_is_refused_by_name_and_sigterm_stops_the_target() {
    let mut serve = Serve::start(&["--allow-host", HOST]);
    let stranger = HostOptions {
        host_nqn: "nqn.2024-01.io.usnvme:stranger".into(),
        ..HostOptions::default()
    };
    match CommandQueue::connect(serve.addr, NQN, 0, 32, 0xffff, &stranger) {
        Err(HostError::Status { status, .. }) => assert_eq!(status, Status::CONNECT_INVALID_HOST),
        other => panic!("{:?}", other.map(|(_, c)| c)),
    }
    // an unknown subsystem
    match CommandQueue::connect(
        serve.addr,
        "nqn.2024-01.io.usnvme:nothing",
        0,
        32,
        0xffff,
        &options(Digests::default()),
    ) {
        Err(HostError::Status { status, .. }) => {
            assert_eq!(status, Status::CONNECT_INVALID_PARAMETERS)
        }
        other => panic!("{:?}", other.map(|(_, c)| c)),
    }
    // a connected host does not keep the target from stopping
    let (_admin, _) = serve.admin(NQN, &options(Digests::default()));
    signal(&serve.child, "TERM");
    let status = serve.child.wait().expect("serve exits");
    assert_eq!(status.code(), Some(143));
}

#[test]
fn serve_refuses_bad_flags_before_touching_a_drive() {
    for (args, says) in [
        (
            &["--nqn", "not-an-nqn"][..],
            "--nqn: NQN \"not-an-nqn\" does not start with \"nqn.\"",
        ),
        (
            &["--allow-host", "x", "--allow-any-host"],
            "--allow-any-host",
        ),
        (&["--listen", "nowhere"], "--listen"),
        (&["--json-status-every", "0.5"], "--json-status"),
        (
            &["--json-status", "/tmp/x.json", "--json-status-every", "0"],
            "--json-status-every",
        ),
    ] {
        let out = Command::new(env!("CARGO_BIN_EXE_usnvme"))
            .args(["serve", "-r", "sim:0"])
            .args(args)
            .output()
            .expect("usnvme runs");
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{args:?}: {stderr}");
        assert!(stderr.contains(says), "{args:?}: {stderr}");
        assert_eq!(stderr.trim().lines().count(), 1, "{args:?}: {stderr}");
    }
}

/// The anonymous memory (heap and thread stacks; not the program's file pages) a process has
/// resident, in KiB: RssAnon in /proc/PID/status.
fn anon_rss_kib(pid: u32) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).expect("its status");
    status
        .lines()
        .find_map(|l| l.strip_prefix("RssAnon:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .expect("RssAnon in /proc/PID/status")
}

#[test]
fn a_hundred_connect_io_disconnect_cycles_leave_no_connection_controller_or_buffer_behind() {
    /// Cycles that warm the target up (its allocator's pools, the drives' queues) before its
    /// memory is measured, then the cycles measured.
    const WARM_UP: u64 = 20;
    const CYCLES: u64 = 100;
    /// What the target may grow by over CYCLES cycles: nothing a connection holds may stay.
    const GROWTH_KIB: u64 = 256;
    let serve = Serve::start(&["--allow-any-host"]);
    let opts = options(Digests::default());
    let cycle = |cycle: u64| {
        let (admin, cntlid) = serve.admin(NQN, &opts);
        let (mut io, _) =
            CommandQueue::connect(serve.addr, NQN, 1, 32, cntlid, &opts).expect("I/O queue");
        io.set_in_capsule_limit(8192);
        // Other data every cycle, on the same blocks: the RAM drives' pages, touched once,
        // are not what is measured.
        let data: Vec<u8> = (0..(64 << 10))
            .map(|i: usize| (i % 251) as u8 ^ cycle as u8)
            .collect();
        let slba = (cycle % 4) * 128;
        io.write(1, slba, 128, &data).expect("write (R2T)");
        io.write(2, slba, 16, &data[..8192])
            .expect("write (in-capsule)");
        let mut back = vec![0u8; 64 << 10];
        io.read(1, slba, 128, &mut back).expect("read");
        assert!(back == data, "cycle {cycle}: read back differs");
        io.disconnect();
        admin.disconnect();
    };
    let drained = |created: u64| {
        move |s: &serde_json::Value| {
            s["controllers_created"] == created
                && s["connections"] == 0
                && s["controllers"] == 0
                && s["buffers_in_use"] == 0
                // every write's data went straight from the socket into a DMA buffer
                && s["data_copied"] == 0
        }
    };
    (0..WARM_UP).for_each(cycle);
    serve.wait_for_status("drained after the warm-up", drained(WARM_UP));
    let before = anon_rss_kib(serve.child.id());
    (WARM_UP..WARM_UP + CYCLES).for_each(cycle);
    serve.wait_for_status("drained", drained(WARM_UP + CYCLES));
    let after = anon_rss_kib(serve.child.id());
    assert!(
        after <= before + GROWTH_KIB,
        "serve's anonymous memory grew from {before} KiB to {after} KiB over {CYCLES} cycles"
    );
    eprintln!("serve's anonymous memory: {before} KiB after {WARM_UP} cycles, {after} KiB after {CYCLES} more");
    // Its reactor time: some of it went to the cycles' work, never more than there was.
    serve.wait_for_status("reactor time with busy turns", |s| {
        let (busy, total) = (
            s["reactor_busy_seconds"].as_f64().unwrap_or(0.0),
            s["reactor_seconds"].as_f64().unwrap_or(0.0),
        );
        busy > 0.0 && busy <= total
    });
}

#[test]
fn io_on_the_same_reactor_keeps_completing_while_a_smart_read_waits_on_the_drives() {
    // Every Get Log Page the drives get takes an hour (past the driver's admin timeout):
    // the SMART read is pending for the whole test.
    let serve = Serve::start_on(
        "sim:0-1,backend=ram,size=16M,mode=threaded,logdelay=3600s",
        &["--allow-any-host"],
    );
    let opts = options(Digests::default());
    let (mut admin, cntlid) = serve.admin(NQN, &opts);
    // (one reactor, -c 0, serves both queues)
    let (mut io, _) =
        CommandQueue::connect(serve.addr, NQN, 1, 32, cntlid, &opts).expect("I/O queue");
    io.set_in_capsule_limit(8192);
    let smart = std::thread::spawn(move || {
        let mut sqe = Sqe::new(0x02);
        sqe.nsid = u32::MAX;
        sqe.cdw10 = 0x02 | ((512 / 4 - 1) << 16);
        admin.admin(sqe, 512).map(|(cqe, _)| cqe.status())
    });
    serve.wait_for_status("a SMART read pending", |s| s["smart_reads_pending"] == 1);
    for round in 0..20u64 {
        let data: Vec<u8> = (0..8192).map(|i: u64| (i * 13 + round) as u8).collect();
        io.write(1, round * 16, 16, &data).expect("write");
        let mut back = vec![0u8; 8192];
        io.read(1, round * 16, 16, &mut back).expect("read");
        assert!(back == data, "round {round}: read back differs");
    }
    serve.wait_for_status("the SMART read still pending", |s| {
        s["smart_reads_pending"] == 1
    });
    assert!(
        !smart.is_finished(),
        "the SMART Get Log Page is still unanswered: it did not hold the I/O up"
    );
    io.disconnect();
    drop(serve);
    let _ = smart.join(); // (the target is gone: an error)
}

/// CSTS.SHST of the controller behind `admin`.
fn shutdown_status(admin: &mut CommandQueue) -> u64 {
    admin.property_get(0x1c, false).expect("CSTS") >> 2 & 3
}

#[test]
fn a_shutdown_reports_complete_only_once_the_drives_are_flushed() {
    const CC_SHN_NORMAL: u64 = 1 << 14;
    let enabled = 1 | 6 << 16 | 4 << 20;
    let opts = options(Digests::default());
    // Flushes that take an hour: the shutdown is still processing when asked.
    let slow = Serve::start_on(
        "sim:0-1,backend=ram,size=16M,mode=threaded,flushdelay=3600s",
        &["--allow-any-host"],
    );
    let (mut admin, _) = slow.admin(NQN, &opts);
    admin
        .property_set(0x14, false, enabled | CC_SHN_NORMAL)
        .expect("CC.SHN");
    assert_eq!(
        shutdown_status(&mut admin),
        0b01,
        "processing: the flushes are pending"
    );
    drop(slow);
    // Drives that flush at once: SHST becomes complete (the flushes completed on the reactor).
    let serve = Serve::start(&["--allow-any-host"]);
    let (mut admin, cntlid) = serve.admin(NQN, &opts);
    let (mut io, _) =
        CommandQueue::connect(serve.addr, NQN, 1, 32, cntlid, &opts).expect("I/O queue");
    io.write(1, 0, 8, &[0x5a; 4096]).expect("write");
    admin
        .property_set(0x14, false, enabled | CC_SHN_NORMAL)
        .expect("CC.SHN");
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(20);
    while shutdown_status(&mut admin) != 0b10 {
        assert!(
            std::time::Instant::now() < deadline,
            "no shutdown complete after 20 s"
        );
    }
    let mut back = [0u8; 4096];
    io.read(1, 0, 8, &mut back).expect("read");
    assert!(back.iter().all(|&b| b == 0x5a));
}

#[test]
fn an_association_without_keep_alive_ends_after_kato() {
    let serve = Serve::start(&["--allow-any-host"]);
    let opts = HostOptions {
        kato_ms: 300, // and this client sends no Keep Alive
        ..options(Digests::default())
    };
    let (mut admin, _) = serve.admin(NQN, &opts);
    serve.wait_for_status("the controller gone", |s| {
        s["controllers_created"] == 1 && s["controllers"] == 0 && s["connections"] == 0
    });
    let mut sqe = Sqe::new(0x06);
    sqe.cdw10 = 1;
    assert!(
        admin.admin(sqe, 4096).is_err(),
        "the target closed the admin queue"
    );
}

/// Reads from a connection the target should close: true when it did (end of stream, or
/// reset), within `limit`.
fn closed_by_target(stream: &mut TcpStream, limit: Duration) -> bool {
    stream.set_read_timeout(Some(limit)).expect("timeout");
    let mut byte = [0u8; 1];
    match stream.read(&mut byte) {
        Ok(0) => true,
        Err(e) => e.kind() == std::io::ErrorKind::ConnectionReset,
        Ok(_) => panic!("the target sent something unasked"),
    }
}

#[test]
fn silent_connections_are_closed_after_ten_seconds_and_max_connections_refuses_the_next() {
    let serve = Serve::start(&[
        "--allow-host",
        HOST,
        "--max-connections",
        "4",
        "--json-status-every",
        "0.05",
    ]);
    // a host at work, and three connections that never send their ICReq: four open
    let opts = options(Digests::default());
    let (mut admin, _) = serve.admin(NQN, &opts);
    let opened = Instant::now();
    let mut silent: Vec<TcpStream> = (0..3)
        .map(|_| TcpStream::connect(serve.addr).expect("connect"))
        .collect();
    serve.wait_for_status("four connections open", |s| s["connections"] == 4);
    // the fifth is refused: closed at once (long before the silent ones' 10 s are up)
    let mut fifth = TcpStream::connect(serve.addr).expect("the kernel accepts it");
    assert!(closed_by_target(&mut fifth, Duration::from_secs(30)));
    for s in &mut silent {
        s.set_nonblocking(true).expect("non-blocking");
        let still_open =
            matches!(s.read(&mut [0u8; 1]), Err(e) if e.kind() == std::io::ErrorKind::WouldBlock);
        assert!(
            still_open,
            "the fifth was refused only when the silent ones timed out"
        );
        s.set_nonblocking(false).expect("blocking");
    }
    // the silent ones are closed once 10 s have passed, not before
    for s in &mut silent {
        assert!(closed_by_target(s, Duration::from_secs(100)));
    }
    assert!(opened.elapsed() >= Duration::from_secs(10));
    serve.wait_for_status("the host's connection alone", |s| s["connections"] == 1);
    // the host at work was not touched, and new hosts are served again
    assert_eq!(
        admin.property_get(0x1c, false).expect("CSTS") & 1,
        1,
        "CSTS.RDY"
    );
    let (mut other, _) = serve.admin(NQN, &opts);
    identify(&mut other, 1, 0);
    other.disconnect();
    admin.disconnect();
}

#[test]
fn a_drives_smart_warning_reaches_the_hosts_held_event_request() {
    // the drive heats up at its 8th write: a SMART temperature event, passed on by serve
    let serve = Serve::start_on(
        "sim:0,backend=ram,size=16M,warn=temperature@8",
        &["--allow-any-host"],
    );
    let opts = options(Digests::default());
    let (mut admin, cntlid) = serve.admin(NQN, &opts);
    // the host enables temperature warnings (Asynchronous Event Configuration bit 1)
    let mut aec = Sqe::new(0x09);
    (aec.cdw10, aec.cdw11) = (0x0b, 0b10);
    assert_eq!(
        admin.admin(aec, 0).expect("set features").0.status(),
        Status::SUCCESS
    );
    admin.set_timeout(Duration::from_secs(60));
    let request = std::thread::spawn(move || {
        let cqe = admin
            .admin(Sqe::async_event_request(), 0)
            .map(|(cqe, _)| cqe);
        (admin, cqe)
    });
    let (mut io, _) =
        CommandQueue::connect(serve.addr, NQN, 1, 32, cntlid, &opts).expect("I/O queue");
    for lba in 0..8 {
        io.write(1, lba, 1, &[lba as u8; 512]).expect("write");
    }
    let (mut admin, cqe) = request.join().expect("the request's thread");
    let cqe = cqe.expect("the event request completes");
    assert_eq!(cqe.status(), Status::SUCCESS);
    assert_eq!(
        cqe.dw0,
        1 | 1 << 8 | 2 << 16,
        "SMART / health, temperature, log page 02h"
    );
    // the SMART log the host then reads carries the drive's warning
    let mut smart = Sqe::new(0x02);
    smart.nsid = u32::MAX;
    smart.cdw10 = 0x02 | ((512 / 4 - 1) << 16);
    let (_, log) = admin.admin(smart, 512).expect("SMART log");
    assert_eq!(log[0] & 0b10, 0b10, "critical warning: temperature");
    io.disconnect();
}

#[test]
fn an_idle_target_sleeps_instead_of_polling_and_says_what_cpu_it_used() {
    let serve = Serve::start(&["--allow-any-host"]);
    // two seconds of reactor time with no host: an adaptive reactor sleeps through nearly all
    // of it (a polling one would use all of it)
    let status = serve.wait_for_status("two seconds of reactor time", |s| {
        s["reactor_seconds"].as_f64().is_some_and(|t| t >= 2.0)
    });
    let (reactor, cpu) = (
        status["reactor_seconds"].as_f64().expect("reactor time"),
        status["reactor_cpu_seconds"]
            .as_f64()
            .expect("reactor CPU time"),
    );
    assert!(
        cpu < reactor / 5.0,
        "{cpu} s of CPU in {reactor} s: {status}"
    );
    assert!(
        status["process_cpu_seconds"]
            .as_f64()
            .is_some_and(|p| p >= cpu),
        "{status}"
    );
    // and a host that comes now is served at once
    let (mut admin, _) = serve.admin(NQN, &options(Digests::default()));
    assert_eq!(identify(&mut admin, 1, 0).len(), 4096);
}

/// The share of its time the reactor of `serve` spent on the CPU while `work` ran (and for
/// at least 1.5 s of reactor time).
fn reactor_cpu_share(serve: &Serve, work: impl FnOnce()) -> (f64, serde_json::Value) {
    let cpu_at = |s: &serde_json::Value| s["reactor_cpu_seconds"].as_f64().expect("CPU time");
    let time_at = |s: &serde_json::Value| s["reactor_seconds"].as_f64().expect("reactor time");
    let started = serve.wait_for_status("the target up", |_| true);
    work();
    let ended = serve.wait_for_status("the reactor's time published", |s| {
        time_at(s) >= time_at(&started) + 1.5
    });
    let share = (cpu_at(&ended) - cpu_at(&started)) / (time_at(&ended) - time_at(&started));
    (share, ended)
}

/// 50 writes then 50 reads of 4 KiB on namespace 1, one at a time, each read checked.
fn one_at_a_time(io: &mut CommandQueue) {
    for lba in 0..50u64 {
        io.write(1, lba * 8, 8, &[lba as u8 | 1; 4096])
            .expect("write");
    }
    let mut back = vec![0u8; 4096];
    for lba in 0..50u64 {
        io.read(1, lba * 8, 8, &mut back).expect("read");
        assert!(back.iter().all(|&b| b == lba as u8 | 1), "block {lba}");
    }
}

#[test]
fn on_interrupts_a_reactor_sleeps_while_the_drive_works_and_wakes_for_each_completion() {
    // every command takes the drive 20 ms: a polling reactor would spin through all of them
    let slow = "sim:0,backend=ram,size=16M,mode=threaded,latency=20ms";
    // completed as soon as submitted: the interrupt is raised before the reactor could sleep
    let inline = "sim:0,backend=ram,size=16M";
    for (drive, work_too) in [(slow, true), (inline, false)] {
        let serve = Serve::start_on(drive, &["--allow-any-host", "--idle", "interrupt"]);
        let opts = options(Digests::default());
        let (admin, cntlid) = serve.admin(NQN, &opts);
        let (mut io, _) =
            CommandQueue::connect(serve.addr, NQN, 1, 32, cntlid, &opts).expect("I/O");
        let (share, status) = if work_too {
            reactor_cpu_share(&serve, || one_at_a_time(&mut io))
        } else {
            // the interrupts raised meanwhile are cleared: the idle reactor sleeps after
            one_at_a_time(&mut io);
            reactor_cpu_share(&serve, || {})
        };
        assert!(
            share < 0.2,
            "{drive}: the reactor on the CPU {share:.3} of its time: {status}"
        );
        drop(io);
        admin.disconnect();
    }
}

#[test]
fn a_port_made_inaccessible_refuses_io_through_it_and_the_other_serves_on() {
    let states = std::env::temp_dir().join(format!("usnvme-ana-{}.txt", std::process::id()));
    std::fs::write(&states, "# every port optimized\n").expect("state file");
    let serve = Serve::start(&[
        "--allow-any-host",
        "--listen",
        "127.0.0.1:0",
        "--ana-state-file",
        states.to_str().expect("UTF-8"),
    ]);
    let (a, b) = (serve.listeners[0], serve.listeners[1]);
    let opts = options(Digests::default());
    let (mut admin, cntlid) = serve.admin(NQN, &opts);
    // one controller, an I/O queue through each port
    let (mut through_a, _) =
        CommandQueue::connect(a, NQN, 1, 32, cntlid, &opts).expect("I/O via a");
    let (mut through_b, _) =
        CommandQueue::connect(b, NQN, 2, 32, cntlid, &opts).expect("I/O via b");
    std::fs::write(&states, format!("{b} inaccessible\n{a} bogus\n")).expect("state file");
    serve.wait_for_status("port b inaccessible", |s| {
        s["ana_states"][b.to_string()] == "inaccessible"
    });
    let refused = through_b
        .write(1, 0, 1, &[7; 512])
        .expect_err("refused through b");
    assert!(
        matches!(&refused, HostError::Status { status, .. } if status.code() == Status::ANA_INACCESSIBLE),
        "{refused}"
    );
    through_a
        .write(1, 0, 1, &[7; 512])
        .expect("written through a");
    let mut back = [0u8; 512];
    through_a.read(1, 0, 1, &mut back).expect("read through a");
    assert_eq!(back, [7; 512]);
    // the ANA log: one change; the admin queue came in through a, still optimized (the
    // malformed line changed nothing)
    let mut sqe = Sqe::new(0x02);
    sqe.cdw10 = 0x0c | ((64 / 4 - 1) << 16);
    let (cqe, log) = admin.admin(sqe, 64).expect("ANA log");
    assert_eq!(cqe.status(), Status::SUCCESS);
    assert_eq!((log[0], log[32]), (1, 1), "change count 1; state optimized");
    let _ = std::fs::remove_file(&states);
}
