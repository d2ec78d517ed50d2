//! `usnvme discover`, `identify` and `health` on remote NVMe/TCP subsystems: `usnvme serve` on
//! `sim:` drives over 127.0.0.1 (and, for the failures serve does not make, a scripted
//! listener): the discovery log, the namespaces and their sizes, SMART, both address forms,
//! digests, and every error by name on one line.

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener};
use std::path::Path;
use std::process::Output;

use usnvme_driver::spec::{Cqe, Status};
use usnvme_engine::fabric::pdu::{flags, DataHeader, Digests, IcResp, OutHeader, PduType};

mod common;
use common::{stderr, stdout, usnvme};

#[path = "common/serve.rs"]
mod target;
use target::{Serve, HOST, NQN};

/// A root whose etc/nvme/hostnqn is the host serve allows: the default host NQN comes from it.
fn host_root() -> tempfile::TempDir {
    let root = tempfile::tempdir().expect("a temp dir");
    std::fs::create_dir_all(root.path().join("etc/nvme")).expect("etc/nvme");
    std::fs::write(root.path().join("etc/nvme/hostnqn"), format!("{HOST}\n")).expect("hostnqn");
    root
}

fn run(root: &Path, args: &[&str]) -> Output {
    usnvme(root, args)
}

/// The JSON printed by a command that succeeded and said nothing else (a controller that did
/// not shut down cleanly would be warned about).
fn json(out: &Output) -> serde_json::Value {
    assert!(out.status.success(), "{}", stderr(out));
    assert_eq!(stderr(out), "", "nothing on standard error");
    serde_json::from_slice(&out.stdout).expect("JSON")
}

/// The short and the SPDK form of serve's subsystem.
fn addresses(addr: SocketAddr) -> [String; 2] {
    [
        format!("tcp://{addr}/{NQN}"),
        format!(
            "trtype:TCP adrfam:IPv4 traddr:{} trsvcid:{} subnqn:{NQN}",
            addr.ip(),
            addr.port()
        ),
    ]
}

/// One `usnvme: error:` line containing every one of `says`, and exit 1.
fn fails_with(out: &Output, says: &[&str]) {
    let err = stderr(out);
    assert_eq!(out.status.code(), Some(1), "{err}");
    assert_eq!(err.trim_end().lines().count(), 1, "{err}");
    assert!(err.starts_with("usnvme: error: "), "{err}");
    for s in says {
        assert!(err.contains(s), "{s:?} not in: {err}");
    }
}

#[test]
fn discover_lists_serves_subsystem_at_its_port_as_a_table_and_as_json() {
    let serve = Serve::start(&["--allow-host", HOST]);
    let root = host_root();
    let port = serve.addr.port().to_string();
    let out = run(root.path(), &["discover", &format!("tcp://{}", serve.addr)]);
    assert!(out.status.success(), "{}", stderr(&out));
    let text = stdout(&out);
    let lines: Vec<&str> = text.lines().collect();
    assert_eq!(lines.len(), 3, "{text}");
    for heading in [
        "SUBSYSTEM NQN",
        "TYPE",
        "TRANSPORT",
        "ADDRESS",
        "SERVICE ID",
        "PORT ID",
        "SECTYPE",
        "TRANSPORT REQUIREMENTS",
    ] {
        assert!(lines[0].contains(heading), "{text}");
    }
    let cells = |line: &str| -> Vec<String> {
        line.split("  ")
            .map(str::trim)
            .filter(|c| !c.is_empty())
            .map(str::to_owned)
            .collect()
    };
    // the discovery subsystem answering, then the NVM subsystem, as nvmet lists them
    for (line, (nqn, kind)) in lines[1..].iter().zip([
        (
            "nqn.2014-08.org.nvmexpress.discovery",
            "current discovery subsystem",
        ),
        (NQN, "nvme subsystem"),
    ]) {
        assert_eq!(
            cells(line),
            [
                nqn,
                kind,
                "tcp",
                "127.0.0.1",
                port.as_str(),
                "1",
                "none",
                "not specified, sq flow control disable supported"
            ],
            "{text}"
        );
    }

    // the SPDK form, with digests: the same log
    let spdk = format!("trtype:tcp traddr:127.0.0.1 trsvcid:{port}");
    let log = json(&run(
        root.path(),
        &["discover", &spdk, "--json", "--hdr-digest", "--data-digest"],
    ));
    assert_eq!(log["numrec"], 2, "{log:#}");
    let record = &log["records"][1];
    assert_eq!(record["subnqn"], NQN, "{log:#}");
    assert_eq!(
        record["treq"],
        "not specified, sq flow control disable supported"
    );
    assert_eq!(record["sectype"], "none");
    assert_eq!(record["trtype"], "tcp");
    assert_eq!(record["adrfam"], "ipv4");
    assert_eq!(record["traddr"], "127.0.0.1");
    assert_eq!(record["trsvcid"], port.as_str());
}

#[test]
fn identify_and_health_report_serves_namespaces_in_both_address_forms_and_with_digests() {
    let serve = Serve::start_on(
        "sim:0-1,backend=ram,size=32M,bs=4096",
        &["--allow-host", HOST],
    );
    let root = host_root();
    let [short, spdk] = addresses(serve.addr);
    let mut reports = Vec::new();
    for (address, digests) in [
        (&short, &[][..]),
        (&spdk, &[][..]),
        (&short, &["--hdr-digest", "--data-digest"][..]),
    ] {
        let mut args = vec!["identify", "--json", address.as_str()];
        args.extend_from_slice(digests);
        let mut id = json(&run(root.path(), &args));
        let c = &mut id[0];
        assert_eq!(c["address"], short.as_str(), "{c:#}");
        assert_eq!(c["subsystem_nqn"], NQN);
        assert_eq!(c["fabric"]["transport"], "tcp");
        assert_eq!(c["fabric"]["header_digest"], !digests.is_empty());
        assert_eq!(c["fabric"]["data_digest"], !digests.is_empty());
        let namespaces = c["namespaces"].as_array().expect("namespaces");
        assert_eq!(namespaces.len(), 2, "{c:#}");
        for (i, ns) in namespaces.iter().enumerate() {
            assert_eq!(ns["nsid"], i + 1);
            assert_eq!(ns["block_size"], 4096);
            assert_eq!(ns["blocks"], 32 << 20 >> 12);
            assert_eq!(ns["capacity_bytes"], 32 << 20);
        }
        // each connection gets a controller of its own; the rest is the same
        c["controller_id"] = serde_json::Value::Null;
        c["fabric"]["header_digest"] = serde_json::Value::Null;
        c["fabric"]["data_digest"] = serde_json::Value::Null;
        reports.push(id);
    }
    assert_eq!(
        reports[0], reports[1],
        "the SPDK form reaches the same controller"
    );
    assert_eq!(reports[0], reports[2], "digests change nothing reported");

    let text = stdout(&run(root.path(), &["identify", &spdk]));
    assert!(text.starts_with(&format!("{short}\n")), "{text}");
    assert!(
        text.contains(
            "Namespace 2\n    Size:                 33.6 MB (32 MiB): 8192 blocks of 4096 B"
        ),
        "{text}"
    );
    assert!(
        text.contains("Transport:              NVMe/TCP to"),
        "{text}"
    );

    for address in [&short, &spdk] {
        let health = json(&run(
            root.path(),
            &["health", "--json", "--hdr-digest", address],
        ));
        assert_eq!(health[0]["address"], short.as_str());
        assert_eq!(health[0]["verdict"], "OK", "{health:#}");
        assert_eq!(health[0]["transport"], "tcp");
        assert_eq!(health[0]["pcie_link"], serde_json::Value::Null);
    }
    let text = stdout(&run(root.path(), &["health", &short]));
    assert!(text.contains("Health:                      OK"), "{text}");
}

#[test]
fn an_ipv6_listener_is_discovered_and_reached_in_both_address_forms() {
    // a machine (or container) without IPv6 loopback has nothing to test here
    if let Err(e) = TcpListener::bind("[::1]:0") {
        eprintln!("skipped: no IPv6 loopback ({e})");
        return;
    }
    let serve = Serve::start(&["--allow-host", HOST, "--listen", "[::1]:0"]);
    let root = host_root();
    let v6 = *serve.listeners.get(1).expect("the [::1] listener");
    assert!(v6.is_ipv6(), "{v6}");
    let log = json(&run(
        root.path(),
        &["discover", "--json", &format!("tcp://{v6}")],
    ));
    let records = log["records"].as_array().expect("records");
    let port = v6.port().to_string();
    // the discovery and NVM subsystems at the port asked on, as nvmet lists them
    assert_eq!(records.len(), 2, "{log:#}");
    assert!(
        records.iter().all(|r| r["adrfam"] == "ipv6"
            && r["traddr"] == "::1"
            && r["trsvcid"].as_str() == Some(port.as_str())
            && r["portid"] == 2),
        "{log:#}"
    );
    assert_eq!(records[1]["subnqn"], NQN, "{log:#}");
    let spdk = format!(
        "trtype:TCP adrfam:IPv6 traddr:::1 trsvcid:{} subnqn:{NQN}",
        v6.port()
    );
    for address in [format!("tcp://{v6}/{NQN}"), spdk] {
        let id = json(&run(root.path(), &["identify", "--json", &address]));
        assert_eq!(id[0]["address"], format!("tcp://{v6}/{NQN}"));
        assert_eq!(id[0]["namespaces"].as_array().map(Vec::len), Some(2));
    }
}

#[test]
fn local_and_remote_drives_report_in_the_order_given() {
    let serve = Serve::start(&["--allow-host", HOST]);
    let root = host_root();
    let [short, _] = addresses(serve.addr);
    let id = json(&run(root.path(), &["identify", "--json", &short, "sim:0"]));
    assert_eq!(id[0]["address"], short.as_str());
    assert_eq!(id[1]["serial"], "sim0");
    assert!(id[1].get("fabric").is_none(), "{id:#}");
}

#[test]
fn refused_port_host_not_allowed_and_unknown_nqn_each_say_what_to_do() {
    let serve = Serve::start(&["--allow-host", HOST]);
    let root = host_root();
    let [short, _] = addresses(serve.addr);
    // nobody listens on a port just freed
    let free = TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .expect("a free port");
    for command in ["identify", "health"] {
        let refused = run(root.path(), &[command, &format!("tcp://{free}/{NQN}")]);
        fails_with(
            &refused,
            &[
                "connection refused",
                "is the target running",
                &free.port().to_string(),
            ],
        );
        let stranger = run(
            root.path(),
            &[
                command,
                "--hostnqn",
                "nqn.2024-01.io.usnvme:stranger",
                &short,
            ],
        );
        fails_with(
            &stranger,
            &[
                "host not allowed (Connect Invalid Host)",
                "nqn.2024-01.io.usnvme:stranger",
                "--hostnqn",
                "--allow-host",
            ],
        );
        let unknown = run(
            root.path(),
            &[
                command,
                &format!("tcp://{}/nqn.2024-01.io.usnvme:nothing", serve.addr),
            ],
        );
        fails_with(
            &unknown,
            &[
                "unknown NQN (Connect Invalid Parameters)",
                "nqn.2024-01.io.usnvme:nothing",
                &format!("usnvme discover tcp://{}", serve.addr),
            ],
        );
    }
    let refused = run(root.path(), &["discover", &format!("tcp://{free}")]);
    fails_with(&refused, &["connection refused"]);
}

/// A listener that answers one connection with `script` (after reading its ICReq).
fn scripted(script: impl FnOnce(&mut std::net::TcpStream) + Send + 'static) -> SocketAddr {
    let listener = TcpListener::bind("127.0.0.1:0").expect("bind");
    let addr = listener.local_addr().expect("address");
    std::thread::spawn(move || {
        if let Ok((mut s, _)) = listener.accept() {
            let mut icreq = [0u8; 128];
            if s.read_exact(&mut icreq).is_ok() {
                script(&mut s);
            }
        }
    });
    addr
}

#[test]
fn digests_refused_and_a_target_closing_during_connect_are_named() {
    let root = host_root();
    // a target that grants no digests when both are asked for
    let addr = scripted(|s| {
        let resp = IcResp {
            pfv: 0,
            cpda: 0,
            digests: Digests::default(),
            maxh2cdata: 8192,
        };
        let _ = s.write_all(&resp.encode());
        let _ = s.read(&mut [0u8; 256]); // until the host gives up
    });
    let out = run(
        root.path(),
        &[
            "identify",
            "--hdr-digest",
            "--data-digest",
            &format!("tcp://{addr}/{NQN}"),
        ],
    );
    fails_with(
        &out,
        &[
            "digest mismatch",
            "--hdr-digest, --data-digest",
            "leave those flags out",
        ],
    );

    // a target that takes the ICReq, then goes away
    let addr = scripted(|_| {});
    let out = run(root.path(), &["health", &format!("tcp://{addr}/{NQN}")]);
    fails_with(
        &out,
        &[
            "the target closed the connection during Connect",
            "is it still running",
        ],
    );
}

/// What the scripted controller does on the first admin command after bring-up.
#[derive(Debug, Clone, Copy)]
enum FirstAdmin {
    /// Closes the connection.
    Close,
    /// Sends the data with a wrong data digest (digests on), then waits.
    CorruptData,
}

/// A target that brings a controller up (ICResp granting `digests`, Connect, CAP, VS, CC,
/// CSTS.RDY), then does `then` on the first admin command.
fn controller(s: &mut std::net::TcpStream, digests: Digests, then: FirstAdmin) {
    let resp = IcResp {
        pfv: 0,
        cpda: 0,
        digests,
        maxh2cdata: 8192,
    };
    if s.write_all(&resp.encode()).is_err() {
        return;
    }
    loop {
        let mut common = [0u8; 8];
        if s.read_exact(&mut common).is_err() {
            return;
        }
        let plen = u32::from_le_bytes([common[4], common[5], common[6], common[7]]) as usize;
        let mut rest = vec![0u8; plen.saturating_sub(8)];
        if common[0] != 0x04 || plen < 72 || s.read_exact(&mut rest).is_err() {
            return; // not a CapsuleCmd
        }
        let sqe = &rest[..64];
        let cid = u16::from_le_bytes([sqe[2], sqe[3]]);
        let cdw11 = u32::from_le_bytes([sqe[44], sqe[45], sqe[46], sqe[47]]);
        let dw0 = match (sqe[0], sqe[4], cdw11) {
            (0x7f, 0x01, _) => 1,               // Connect: controller 1
            (0x7f, 0x04, 0x00) => 1 << 24 | 31, // CAP: TO 500 ms, MQES 31
            (0x7f, 0x04, 0x08) => 0x1_0300,     // VS 1.3
            (0x7f, 0x04, 0x1c) => 1,            // CSTS.RDY
            (0x7f, 0x00, _) => 0,               // Property Set
            _ => {
                if let FirstAdmin::CorruptData = then {
                    // the SGL's length
                    let len = u32::from_le_bytes([sqe[32], sqe[33], sqe[34], sqe[35]]);
                    let d = DataHeader {
                        cccid: cid,
                        ttag: 0,
                        offset: 0,
                        length: len,
                    };
                    let last = flags::LAST_PDU | flags::SUCCESS;
                    let h = OutHeader::data(PduType::C2HData, &d, last, digests, 0);
                    let mut pdu = h.as_slice().to_vec();
                    pdu.resize(pdu.len() + h.pad() + len as usize, 0);
                    pdu.extend_from_slice(&[0xde, 0xad, 0xbe, 0xef]); // not the CRC32C of zeros
                    let _ = s.write_all(&pdu);
                    let _ = s.read(&mut [0u8; 256]); // until the host gives up
                }
                return;
            }
        };
        let cqe = Cqe::new(dw0, 0, 0, cid, Status::SUCCESS, false);
        if s.write_all(OutHeader::capsule_resp(&cqe, digests).as_slice())
            .is_err()
        {
            return;
        }
    }
}

#[test]
fn a_data_digest_mismatch_is_named_with_the_command() {
    let root = host_root();
    let both = Digests {
        header: true,
        data: true,
    };
    let addr = scripted(move |s| controller(s, both, FirstAdmin::CorruptData));
    let out = run(
        root.path(),
        &[
            "identify",
            "--hdr-digest",
            "--data-digest",
            &format!("tcp://{addr}/{NQN}"),
        ],
    );
    fails_with(
        &out,
        &[
            "data digest mismatch during Identify Controller",
            "--data-digest",
        ],
    );
}

#[test]
fn a_target_closing_in_the_middle_of_a_command_is_named_with_the_command() {
    let root = host_root();
    for (command, during) in [
        ("identify", "Identify Controller"),
        ("health", "Get Log Page SMART / Health"),
    ] {
        let addr = scripted(|s| controller(s, Digests::default(), FirstAdmin::Close));
        let out = run(root.path(), &[command, &format!("tcp://{addr}/{NQN}")]);
        fails_with(
            &out,
            &[
                &format!("the target closed the connection during {during}"),
                "is it still running",
            ],
        );
    }
}

#[test]
fn bad_addresses_are_usage_errors_with_an_example() {
    let root = host_root();
    for (args, says) in [
        (
            &["identify", "tcp://127.0.0.1:99999/nqn.a:b"][..],
            "port \"99999\"",
        ),
        (&["health", "tcp://127.0.0.1:4420"], "names no subsystem"),
        (
            &["identify", "trtype:TCP trsvcid:4420"],
            "traddr is missing",
        ),
        (&["health", "tcp://[::1:4420/nqn.a:b"], "needs its ']'"),
        (&["discover", "tcp://host.example"], "not an IP address"),
        (&["discover", "trtype:FC traddr:1.2.3.4"], "TCP or RDMA"),
        (
            &["identify", "--hostnqn", "me", "sim:0"],
            "does not start with \"nqn.\"",
        ),
    ] {
        let out = run(root.path(), args);
        let err = stderr(&out);
        assert_eq!(out.status.code(), Some(2), "{args:?}: {err}");
        assert_eq!(err.trim_end().lines().count(), 1, "{args:?}: {err}");
        assert!(err.contains(says), "{args:?}: {err}");
        assert!(err.contains("example"), "{args:?}: {err}");
    }
}
