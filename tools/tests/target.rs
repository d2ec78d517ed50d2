//! `usnvme serve` as a configured target changed while it runs: several subsystems each with
//! its own hosts (`--config`), namespaces and hosts added and removed through the control
//! socket (`usnvme target`) while a host's I/O flows, `save` and a restart giving hosts the
//! same identities, SIGHUP applying a changed config, JSON-RPC errors by code, and blktests'
//! control protocol.

use std::io::{BufRead, BufReader, Write};
use std::os::unix::net::UnixStream;
use std::time::Duration;

use serde_json::{json, Value};
use usnvme_driver::spec::{IdentifyController, Sqe, Status};
use usnvme_engine::fabric::export::registry::NAMESPACE_ATTRIBUTE_CHANGED;
use usnvme_engine::fabric::export::DISCOVERY_NQN;
use usnvme_engine::transport::tcp::initiator::{CommandQueue, HostError, HostOptions};

#[path = "common/serve.rs"]
mod target;
use target::{Serve, HOST};

const A: &str = "nqn.2024-01.io.usnvme:sub-a";
const B: &str = "nqn.2024-01.io.usnvme:sub-b";
const OTHER_HOST: &str = "nqn.2024-01.io.usnvme:other-host";
const DEVICES: &str = "sim:0-2,backend=ram,size=16M";

fn host(nqn: &str) -> HostOptions {
    HostOptions {
        host_nqn: nqn.into(),
        ..HostOptions::default()
    }
}

/// Subsystem A open to HOST (namespace 1 on sim:0), B open to OTHER_HOST (namespace 5 on
/// sim:1, its UUID given); sim:2 free.
fn two_subsystems() -> Value {
    json!({
        "devices": [DEVICES],
        "cores": "0",
        "ports": [{"address": "127.0.0.1:0"}],
        "subsystems": [
            {"nqn": A, "hosts": [HOST], "namespaces": [{"nsid": 1, "device": "sim:0"}]},
            {"nqn": B, "hosts": [OTHER_HOST],
             "namespaces": [{"nsid": 5, "device": "sim:1", "uuid": "91fdba0d-f87b-4c25-b80f-db7be1418b9e"}]}
        ]
    })
}

/// Connects an admin queue to `subnqn` as `host`, enabled; or the Connect's status.
fn connect(serve: &Serve, subnqn: &str, host_nqn: &str) -> Result<(CommandQueue, u16), Status> {
    connect_at(serve.addr, subnqn, host_nqn)
}

/// The same through the listener at `addr`.
fn connect_at(
    addr: std::net::SocketAddr,
    subnqn: &str,
    host_nqn: &str,
) -> Result<(CommandQueue, u16), Status> {
    match CommandQueue::connect(addr, subnqn, 0, 32, 0xffff, &host(host_nqn)) {
        Ok((mut q, cntlid)) => {
            q.property_set(0x14, false, 1 | 6 << 16 | 4 << 20)
                .expect("CC.EN");
            Ok((q, cntlid))
        }
        Err(HostError::Status { status, .. }) => Err(status),
        Err(e) => panic!("connect to {subnqn}: {e}"),
    }
}

/// The NQNs of the NVM subsystems the discovery log lists to `host_nqn`, and its GENCTR.
fn discovered(serve: &Serve, host_nqn: &str) -> (Vec<String>, u64) {
    discovered_at(serve.addr, host_nqn)
}

/// The same through the listener at `addr`.
fn discovered_at(addr: std::net::SocketAddr, host_nqn: &str) -> (Vec<String>, u64) {
    let (mut disc, _) = connect_at(addr, DISCOVERY_NQN, host_nqn).expect("discovery");
    let mut sqe = Sqe::new(0x02);
    sqe.cdw10 = 0x70 | ((4096 / 4 - 1) << 16);
    let (cqe, log) = disc.admin(sqe, 4096).expect("discovery log");
    assert_eq!(cqe.status(), Status::SUCCESS);
    let genctr = u64::from_le_bytes(log[0..8].try_into().expect("8 bytes"));
    let records = u64::from_le_bytes(log[8..16].try_into().expect("8 bytes")) as usize;
    let nqns = (1..=records.min(3))
        .map(|i| &log[1024 * i..1024 * (i + 1)])
        .filter(|entry| entry[2] == 2) // NVM subsystems, not the discovery one
        .map(|entry| {
            String::from_utf8_lossy(&entry[256..512])
                .trim_end_matches('\0')
                .to_string()
        })
        .collect();
    disc.disconnect();
    (nqns, genctr)
}

/// The UUID of namespace `nsid` as the host reads it (Namespace Identification Descriptor 3).
fn namespace_uuid(q: &mut CommandQueue, nsid: u32) -> Option<String> {
    let mut sqe = Sqe::new(0x06);
    sqe.nsid = nsid;
    sqe.cdw10 = 3;
    let (cqe, data) = q.admin(sqe, 4096).expect("identify descriptors");
    if cqe.status() != Status::SUCCESS {
        return None;
    }
    let mut at = 0;
    while at + 4 <= data.len() && data[at] != 0 {
        let (kind, len) = (data[at], data[at + 1] as usize);
        if kind == 3 {
            let bytes: [u8; 16] = data[at + 4..at + 20].try_into().expect("16 bytes");
            return Some(uuid::Uuid::from_bytes(bytes).hyphenated().to_string());
        }
        at += 4 + len;
    }
    None
}

#[test]
fn two_subsystems_each_with_its_own_hosts_and_a_host_allowed_later_connects_without_a_restart() {
    let serve = Serve::with_config(&two_subsystems(), &[]);
    let (mut a, _) = connect(&serve, A, HOST).expect("HOST to A");
    let id = IdentifyController::from_slice(&{
        let mut sqe = Sqe::new(0x06);
        sqe.cdw10 = 1;
        a.admin(sqe, 4096).expect("identify").1
    })
    .expect("4096 bytes");
    assert_eq!(id.subnqn(), A);
    assert_eq!(
        connect(&serve, B, HOST).err(),
        Some(Status::CONNECT_INVALID_HOST),
        "B is OTHER_HOST's"
    );
    assert!(connect(&serve, B, OTHER_HOST).is_ok());
    assert_eq!(
        connect(&serve, "nqn.2024-01.io.usnvme:none", HOST).err(),
        Some(Status::CONNECT_INVALID_PARAMETERS)
    );
    assert_eq!(namespace_uuid(&mut a, 5), None, "B's namespace is not A's");
    // each host's discovery log lists its own subsystem only
    let (seen, genctr) = discovered(&serve, HOST);
    assert_eq!(seen, [A]);
    assert_eq!(discovered(&serve, OTHER_HOST).0, [B]);

    // HOST is allowed to B: it connects, with no restart, and its discovery log has moved on
    serve.target_ok(&["host", "allow", B, HOST]);
    let (mut b, _) = connect(&serve, B, HOST).expect("HOST to B once allowed");
    assert_eq!(
        namespace_uuid(&mut b, 5).as_deref(),
        Some("91fdba0d-f87b-4c25-b80f-db7be1418b9e")
    );
    let (seen, later) = discovered(&serve, HOST);
    assert_eq!(seen, [A, B]);
    assert!(later > genctr, "GENCTR moved on: {genctr} then {later}");
    // and denied again: new connections are refused, the one made stays
    serve.target_ok(&["host", "deny", B, HOST]);
    assert_eq!(
        connect(&serve, B, HOST).err(),
        Some(Status::CONNECT_INVALID_HOST)
    );
    assert_eq!(
        namespace_uuid(&mut b, 5).as_deref(),
        Some("91fdba0d-f87b-4c25-b80f-db7be1418b9e")
    );
    // A untouched throughout
    assert!(namespace_uuid(&mut a, 1).is_some());
}

#[test]
fn a_subsystem_is_reached_through_the_ports_it_is_on_only() {
    // A through both ports; B through the second only
    let mut config = two_subsystems();
    config["ports"] =
        json!([{"address": "127.0.0.1:0", "subsystems": [A]}, {"address": "127.0.0.2:0"}]);
    config["subsystems"][0]["hosts"] = json!([HOST, OTHER_HOST]);
    config["subsystems"][1]["hosts"] = json!([HOST, OTHER_HOST]);
    let serve = Serve::with_config(&config, &[]);
    let [first, second] = serve.listeners[..] else {
        panic!("two listeners: {:?}", serve.listeners);
    };
    assert_eq!(
        connect_at(first, B, HOST).err(),
        Some(Status::CONNECT_INVALID_PARAMETERS)
    );
    assert!(connect_at(second, B, HOST).is_ok());
    assert!(connect_at(first, A, HOST).is_ok());
    assert_eq!(discovered_at(first, HOST).0, [A]);
    assert_eq!(discovered_at(second, HOST).0, [A, B]);
    let saved: Value = serde_json::from_str(&serve.target_ok(&["save"])).expect("JSON");
    assert_eq!(saved["ports"][0]["subsystems"], json!([A]));
    assert!(
        saved["ports"][1].get("subsystems").is_none(),
        "every subsystem: {saved}"
    );
    // B on every port from now on; then on the first only
    serve.target_ok(&["subsystem", "ports", B]);
    assert!(connect_at(first, B, HOST).is_ok());
    assert_eq!(discovered_at(first, HOST).0, [A, B]);
    serve.target_ok(&["subsystem", "ports", B, &first.to_string()]);
    assert_eq!(
        connect_at(second, B, HOST).err(),
        Some(Status::CONNECT_INVALID_PARAMETERS)
    );
    let (code, _, err) = serve.target(&["subsystem", "ports", B, "127.0.0.1:1"]);
    assert_eq!(code, Some(1));
    assert!(err.contains("does not listen on 127.0.0.1:1"), "{err}");
}

#[test]
fn namespaces_added_and_removed_while_a_host_writes_another_are_told_and_lose_nothing() {
    let serve = Serve::with_config(&two_subsystems(), &[]);
    let (mut admin, cntlid) = connect(&serve, A, HOST).expect("admin");
    let (mut io, _) =
        CommandQueue::connect(serve.addr, A, 1, 32, cntlid, &host(HOST)).expect("I/O queue");
    // the host waits for an event as Linux does: an Asynchronous Event Request held
    let (events, event) = std::sync::mpsc::channel();
    let (mut waiter, _) = connect(&serve, A, HOST).expect("another controller");
    let aer = std::thread::spawn(move || {
        let (cqe, _) = waiter.admin(Sqe::new(0x0c), 0).expect("an event");
        events.send(cqe.dw0).expect("sent");
        waiter
    });
    let mut written = 0u64;
    let mut write_and_check = |io: &mut CommandQueue| {
        let data: Vec<u8> = (0..4096).map(|i| (i as u64 * 31 + written) as u8).collect();
        io.write(1, written * 8, 8, &data).expect("write");
        let mut back = vec![0u8; 4096];
        io.read(1, written * 8, 8, &mut back).expect("read");
        assert!(back == data, "block {written}: read back differs");
        written += 1;
    };
    for _ in 0..20 {
        write_and_check(&mut io);
    }
    // the free device (sim:2) becomes namespace 2 of A
    let added = serve.target_ok(&["namespace", "add", A]);
    assert!(
        added.starts_with(&format!("namespace 2 of {A}: sim:2")),
        "{added}"
    );
    let dw0 = event
        .recv_timeout(Duration::from_secs(30))
        .expect("an event");
    assert_eq!(dw0, NAMESPACE_ATTRIBUTE_CHANGED);
    let _waiter = aer.join().expect("the waiter");
    // the Changed Namespace List names it, and the host uses it at once
    let mut sqe = Sqe::new(0x02);
    sqe.cdw10 = 0x04 | ((4096 / 4 - 1) << 16);
    let (_, list) = admin.admin(sqe, 4096).expect("changed namespace list");
    assert_eq!(
        u32::from_le_bytes(list[0..4].try_into().expect("4 bytes")),
        2
    );
    let data = vec![0x5au8; 4096];
    io.write(2, 0, 8, &data)
        .expect("write to the new namespace");
    for _ in 0..20 {
        write_and_check(&mut io);
    }
    // taken away: its I/O is refused by name, namespace 1's goes on
    serve.target_ok(&["namespace", "remove", A, "2"]);
    let mut buf = vec![0u8; 4096];
    match io.read(2, 0, 8, &mut buf) {
        Err(HostError::Status { status, .. }) => {
            assert_eq!(status.code(), Status::INVALID_NAMESPACE)
        }
        other => panic!("{other:?}"),
    }
    for _ in 0..20 {
        write_and_check(&mut io);
    }
    // every block written is still there
    for block in 0..written {
        let mut back = vec![0u8; 4096];
        io.read(1, block * 8, 8, &mut back).expect("read");
        let data: Vec<u8> = (0..4096).map(|i| (i as u64 * 31 + block) as u8).collect();
        assert!(back == data, "block {block} changed");
    }
    // the device is free again: exported anew with the same identity it derives
    let again = serve.target_ok(&["namespace", "add", A, "--device", "sim:2", "--nsid", "7"]);
    assert!(
        again.starts_with(&format!("namespace 7 of {A}: sim:2")),
        "{again}"
    );
    let mut back = vec![0u8; 4096];
    io.read(7, 0, 8, &mut back)
        .expect("read the device under its new ID");
    assert!(
        back == data,
        "what was written through namespace 2 is on the device"
    );
}

#[test]
fn save_then_restart_with_the_config_gives_hosts_the_same_identities() {
    // started by flags (the short form), changed, saved
    let first = Serve::start_on(DEVICES, &["--allow-host", HOST]);
    first.target_ok(&[
        "subsystem",
        "add",
        B,
        "--allow-host",
        HOST,
        "--serial",
        "SERIAL-B",
    ]);
    first.target_ok(&["namespace", "remove", target::NQN, "3"]);
    first.target_ok(&[
        "namespace",
        "add",
        B,
        "--device",
        "sim:2",
        "--nsid",
        "9",
        "--nguid",
        "0123456789abcdef0123456789abcdef",
    ]);
    // namespace 1 in ANA group 3, which is inaccessible at the port
    first.target_ok(&["namespace", "remove", target::NQN, "1"]);
    first.target_ok(&[
        "namespace",
        "add",
        target::NQN,
        "--device",
        "sim:0",
        "--nsid",
        "1",
        "--ana-group",
        "3",
    ]);
    let port = first.addr.to_string();
    first.target_ok(&["ana", "set", &port, "inaccessible", "--group", "3"]);
    let (q, cntlid) = connect(&first, target::NQN, HOST).expect("connect");
    let (mut io, _) = CommandQueue::connect(first.addr, target::NQN, 1, 32, cntlid, &host(HOST))
        .expect("I/O queue");
    let mut buf = vec![0u8; 4096];
    match io.read(1, 0, 8, &mut buf) {
        Err(HostError::Status { status, .. }) => {
            assert_eq!(status.code(), Status::ANA_INACCESSIBLE)
        }
        other => panic!("group 3 is inaccessible: {other:?}"),
    }
    io.read(2, 0, 8, &mut buf)
        .expect("namespace 2, in group 1, is reachable");
    drop(io);
    q.disconnect();
    let saved = std::env::temp_dir().join(format!("saved-{}.json", std::process::id()));
    first.target_ok(&["save", saved.to_str().expect("UTF-8")]);
    let identities = |serve: &Serve| {
        let status: Value = serde_json::from_str(&serve.target_ok(&["status"])).expect("JSON");
        let subsystems = status["subsystems"].as_array().expect("subsystems").clone();
        let mut seen = Vec::new();
        for s in &subsystems {
            let (mut q, _) =
                connect(serve, s["nqn"].as_str().expect("NQN"), HOST).expect("connect");
            let mut sqe = Sqe::new(0x06);
            sqe.cdw10 = 1;
            let id = IdentifyController::from_slice(&q.admin(sqe, 4096).expect("identify").1)
                .expect("4096 bytes");
            for ns in s["namespaces"].as_array().expect("namespaces") {
                let nsid = ns["nsid"].as_u64().expect("NSID") as u32;
                seen.push((
                    id.subnqn().to_string(),
                    id.serial().to_string(),
                    nsid,
                    namespace_uuid(&mut q, nsid),
                    ns["nguid"].clone(),
                    ns["device"].clone(),
                ));
            }
        }
        seen
    };
    let before = identities(&first);
    assert_eq!(before.len(), 3, "{before:?}");
    assert!(before
        .iter()
        .any(|(nqn, serial, nsid, _, nguid, _)| nqn == B
            && serial == "SERIAL-B"
            && *nsid == 9
            && nguid == "0123456789abcdef0123456789abcdef"));
    drop(first);
    let config: Value =
        serde_json::from_str(&std::fs::read_to_string(&saved).expect("saved")).expect("JSON");
    let _ = std::fs::remove_file(&saved);
    // (listening where the first did: port 0 was saved as the port it was given)
    let second = Serve::with_config(&config, &[]);
    assert_eq!(identities(&second), before);
    // and saved again, the same file: ANA groups and their states too
    let again: Value = serde_json::from_str(&second.target_ok(&["save"])).expect("JSON");
    assert_eq!(again, config);
    assert_eq!(
        config["ports"][0]["ana_groups"]["3"], "inaccessible",
        "{config}"
    );
}

#[test]
fn sighup_applies_what_changed_in_the_config_file() {
    let serve = Serve::with_config(&two_subsystems(), &[]);
    let file = serve.config.clone().expect("a config file");
    let mut config = two_subsystems();
    config["ports"] = json!([{"address": serve.addr.to_string()}]);
    // B goes, C comes with the free device, A lets any host in
    config["subsystems"][1] = json!({"nqn": "nqn.2024-01.io.usnvme:sub-c", "allow_any_host": true,
        "namespaces": [{"device": "sim:2"}]});
    config["subsystems"][0]["hosts"] = json!([]);
    config["subsystems"][0]["allow_any_host"] = json!(true);
    std::fs::write(&file, config.to_string()).expect("rewritten");
    usnvme_tests::signal(&serve.child, "HUP");
    let status = serve.wait_for_status("the new config applied", |s| {
        s["subsystems"]
            .as_array()
            .is_some_and(|l| l.iter().any(|s| s["nqn"] == "nqn.2024-01.io.usnvme:sub-c"))
    });
    let nqns: Vec<&str> = status["subsystems"]
        .as_array()
        .expect("list")
        .iter()
        .filter_map(|s| s["nqn"].as_str())
        .collect();
    assert_eq!(nqns, [A, "nqn.2024-01.io.usnvme:sub-c"]);
    assert!(connect(&serve, A, OTHER_HOST).is_ok(), "any host now");
    assert_eq!(
        connect(&serve, B, OTHER_HOST).err(),
        Some(Status::CONNECT_INVALID_PARAMETERS),
        "B is gone"
    );
    // a config that cannot be read changes nothing
    assert_eq!(status["config_reloads"], 1);
    std::fs::write(&file, "{ not json").expect("rewritten");
    usnvme_tests::signal(&serve.child, "HUP");
    serve.wait_for_status("the bad config refused", |s| {
        s["config_reloads_failed"] == 1
    });
    assert!(connect(&serve, "nqn.2024-01.io.usnvme:sub-c", HOST).is_ok());
    assert!(connect(&serve, A, OTHER_HOST).is_ok());
}

/// Sends `line` on the control socket; the JSON answer.
fn rpc(serve: &Serve, line: &str) -> Value {
    let mut socket = UnixStream::connect(&serve.control).expect("the control socket");
    writeln!(socket, "{line}").expect("sent");
    let mut answer = String::new();
    BufReader::new(socket)
        .read_line(&mut answer)
        .expect("an answer");
    serde_json::from_str(&answer).expect("JSON")
}

#[test]
fn bad_requests_on_the_control_socket_get_json_rpc_errors_naming_the_problem() {
    let serve = Serve::with_config(&two_subsystems(), &[]);
    for (request, code, says) in [
        ("{ not json", -32700, "not JSON"),
        (r#"{"method": "status", "id": 1}"#, -32600, "JSON-RPC 2.0"),
        (r#"{"jsonrpc": "2.0", "id": 1}"#, -32600, "no method"),
        (
            r#"{"jsonrpc": "2.0", "method": "format_everything", "id": 1}"#,
            -32601,
            "subsystem_add",
        ),
        (
            r#"{"jsonrpc": "2.0", "method": "namespace_remove", "params": [1], "id": 1}"#,
            -32602,
            "object",
        ),
        (
            r#"{"jsonrpc": "2.0", "method": "namespace_remove", "params": {"nqn": "x"}, "id": 1}"#,
            -32602,
            "missing field `nsid`",
        ),
        (
            r#"{"jsonrpc": "2.0", "method": "subsystem_add", "params": {"nqn": "x", "colour": 1}, "id": 1}"#,
            -32602,
            "unknown field `colour`",
        ),
        (
            r#"{"jsonrpc": "2.0", "method": "subsystem_add", "params": {"nqn": "nqn.2024-01.io.usnvme:sub-a"}, "id": 1}"#,
            -32000,
            "exists already",
        ),
        (
            r#"{"jsonrpc": "2.0", "method": "subsystem_add", "params": {"nqn": "two words"}, "id": 1}"#,
            -32000,
            "without blanks",
        ),
        (
            r#"{"jsonrpc": "2.0", "method": "namespace_add", "params": {"nqn": "nqn.2024-01.io.usnvme:sub-a", "device": "sim:1"}, "id": 1}"#,
            -32000,
            "namespace 5 of nqn.2024-01.io.usnvme:sub-b already",
        ),
        (
            r#"{"jsonrpc": "2.0", "method": "namespace_add", "params": {"nqn": "nqn.2024-01.io.usnvme:sub-a", "device": "sim:9"}, "id": 1}"#,
            -32000,
            "no device sim:9",
        ),
        (
            r#"{"jsonrpc": "2.0", "method": "namespace_add", "params": {"nqn": "nqn.2024-01.io.usnvme:sub-a", "nsid": 1}, "id": 1}"#,
            -32000,
            "has namespace 1 already",
        ),
        (
            r#"{"jsonrpc": "2.0", "method": "namespace_add", "params": {"nqn": "nqn.2024-01.io.usnvme:sub-a", "uuid": "91fdba0d-f87b-4c25-b80f-db7be1418b9"}, "id": 1}"#,
            -32000,
            "8-4-4-4-12",
        ),
        (
            r#"{"jsonrpc": "2.0", "method": "namespace_remove", "params": {"nqn": "nqn.2024-01.io.usnvme:sub-a", "nsid": 4}, "id": 1}"#,
            -32000,
            "has no namespace 4",
        ),
        (
            r#"{"jsonrpc": "2.0", "method": "host_allow", "params": {"nqn": "nqn.2024-01.io.usnvme:sub-z", "host": "nqn.2024-01.io.usnvme:h"}, "id": 1}"#,
            -32000,
            "no subsystem nqn.2024-01.io.usnvme:sub-z",
        ),
        (
            r#"{"jsonrpc": "2.0", "method": "ana_set", "params": {"address": "127.0.0.1:1", "state": "optimized"}, "id": 1}"#,
            -32000,
            "does not listen on 127.0.0.1:1",
        ),
        (
            r#"{"jsonrpc": "2.0", "method": "ana_set", "params": {"address": "127.0.0.1:1", "state": "fast"}, "id": 1}"#,
            -32000,
            "not an ANA state",
        ),
        (
            r#"{"jsonrpc": "2.0", "method": "listener_add", "params": {"address": "127.0.0.1:0", "transport": "fc"}, "id": 1}"#,
            -32602,
            "unknown variant `fc`, expected `tcp` or `rdma`",
        ),
        (
            // (no RDMA device here; without the rdma feature: how to build it in)
            r#"{"jsonrpc": "2.0", "method": "listener_add", "params": {"address": "127.0.0.1:1", "transport": "rdma"}, "id": 1}"#,
            -32000,
            "listen on rdma:127.0.0.1:1: cannot listen there",
        ),
    ] {
        let answer = rpc(&serve, request);
        assert_eq!(answer["jsonrpc"], "2.0", "{request}: {answer}");
        assert_eq!(answer["error"]["code"], code, "{request}: {answer}");
        let message = answer["error"]["message"].as_str().unwrap_or_default();
        assert!(
            message.contains(says),
            "{request}: {message:?} does not say {says:?}"
        );
    }
    // a good request is answered with its ID; the target is as it was
    let answer = rpc(
        &serve,
        r#"{"jsonrpc": "2.0", "method": "status", "id": "s1"}"#,
    );
    assert_eq!(answer["id"], "s1");
    assert_eq!(
        answer["result"]["subsystems"].as_array().map(Vec::len),
        Some(2)
    );
    // a namespace read again that did not change stays as it is
    let unchanged = serve.target_ok(&["namespace", "rescan", A, "1"]);
    assert!(unchanged.contains("0 removed, 0 exported"), "{unchanged}");
    let answer = rpc(
        &serve,
        r#"{"jsonrpc": "2.0", "method": "namespace_rescan", "params": {"nqn": "nqn.2024-01.io.usnvme:sub-a", "nsid": 3}, "id": 1}"#,
    );
    assert_eq!(answer["error"]["code"], -32000, "{answer}");
    // the client says the target's message, and fails
    let (code, _, err) = serve.target(&["namespace", "remove", A, "4"]);
    assert_eq!(code, Some(1));
    assert!(err.contains("has no namespace 4"), "{err}");
    // a second target on the same socket is refused
    let mut second = std::process::Command::new(env!("CARGO_BIN_EXE_usnvme"))
        .args([
            "serve",
            "-r",
            "sim:0",
            "--listen",
            "127.0.0.1:0",
            "--control",
            serve.control.to_str().expect("UTF-8"),
        ])
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("runs");
    let mut err = String::new();
    std::io::Read::read_to_string(second.stderr.as_mut().expect("piped"), &mut err).expect("read");
    assert_eq!(second.wait().expect("exits").code(), Some(2), "{err}");
    assert!(err.contains("another target answers there"), "{err}");
}

#[test]
fn blktests_control_sets_up_and_cleans_up_the_subsystem_a_test_asks_for() {
    let serve = Serve::with_config(&two_subsystems(), &[]);
    let control = |args: &[&str]| {
        let mut all = vec!["blktests-control"];
        all.extend_from_slice(args);
        serve.target(&all)
    };
    let show = |what: &str| {
        let (code, out, err) = control(&["config", what]);
        assert_eq!(code, Some(0), "{what}: {err}");
        out.trim().to_string()
    };
    assert_eq!(show("--show-trtype"), "tcp");
    assert_eq!(show("--show-blkdev-type"), "device");
    assert_eq!(show("--show-traddr"), "127.0.0.1");
    assert_eq!(show("--show-trsvid"), serve.addr.port().to_string());
    assert_eq!(show("--show-subsysnqn"), "blktests-subsystem-1");
    assert_eq!(
        show("--show-subsys-uuid"),
        "91fdba0d-f87b-4c25-b80f-db7be1418b9e"
    );
    assert!(show("--show-hostnqn").starts_with("nqn."));
    let uuid = "0f01fb42-9f7f-4856-b0b3-51e60b8de349";
    let (code, _, err) = control(&[
        "setup",
        "--subsysnqn",
        "blktests-subsystem-3",
        "--subsys-uuid",
        uuid,
        "--hostnqn",
        OTHER_HOST,
    ]);
    assert_eq!(code, Some(0), "{err}");
    let (mut q, _) =
        connect(&serve, "blktests-subsystem-3", OTHER_HOST).expect("the host blktests named");
    assert_eq!(namespace_uuid(&mut q, 1).as_deref(), Some(uuid));
    assert_eq!(
        connect(&serve, "blktests-subsystem-3", HOST).err(),
        Some(Status::CONNECT_INVALID_HOST)
    );
    // no device left for a second: refused, and nothing half made is left
    let (code, _, err) = control(&[
        "setup",
        "--subsysnqn",
        "blktests-subsystem-4",
        "--subsys-uuid",
        uuid,
        "--hostnqn",
        OTHER_HOST,
    ]);
    assert_eq!(code, Some(1));
    assert!(
        err.contains("every device of the target is exported already"),
        "{err}"
    );
    assert_eq!(
        connect(&serve, "blktests-subsystem-4", OTHER_HOST).err(),
        Some(Status::CONNECT_INVALID_PARAMETERS)
    );
    let (code, _, err) = control(&["cleanup", "--subsysnqn", "blktests-subsystem-3"]);
    assert_eq!(code, Some(0), "{err}");
    assert_eq!(
        connect(&serve, "blktests-subsystem-3", OTHER_HOST).err(),
        Some(Status::CONNECT_INVALID_PARAMETERS)
    );
    // its host's controller went with it: its commands fail, the connection is closed
    let mut sqe = Sqe::new(0x06);
    sqe.cdw10 = 1;
    assert!(
        q.admin(sqe, 4096).is_err(),
        "the removed subsystem's controller is gone"
    );
}
