//! `usnvme perf` and `sweep` over NVMe/TCP: `usnvme serve` on `sim:` RAM drives over
//! 127.0.0.1 is the target. Data written through the fabric reads back verified (both address
//! forms, digests, stripes over remote namespaces and mixed with a local drive); a target that
//! dies or goes silent mid-run fails its I/Os by kind while the local drive runs to the end;
//! every mistake a user can make is named before any I/O.

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{Shutdown, SocketAddr, TcpListener, TcpStream};
use std::path::Path;
use std::process::{Command, Output, Stdio};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::time::Duration;

use serde_json::Value;

#[allow(dead_code)] // its `usnvme` runs on a fake sysfs root: not here
mod common;
use common::{stderr, stdout};

#[path = "common/serve.rs"]
mod target;
use target::{Serve, HOST, NQN};

/// A directory for the JSON files.
fn host_root() -> tempfile::TempDir {
    tempfile::tempdir().expect("a temp dir")
}

/// `usnvme ARGS` on this machine (its CPUs), as the host serve allows unless `--hostnqn` is
/// given.
fn usnvme(_root: &Path, args: &[&str]) -> Output {
    usnvme_command(args).output().expect("usnvme runs")
}

fn usnvme_command(args: &[&str]) -> Command {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_usnvme"));
    cmd.args(args).env_remove("RUST_LOG");
    if !args.contains(&"--hostnqn") {
        cmd.args(["--hostnqn", HOST]);
    }
    cmd
}

fn text(out: &Output) -> String {
    format!(
        "status {:?}\nstdout:\n{}\nstderr:\n{}",
        out.status.code(),
        stdout(out),
        stderr(out)
    )
}

/// `usnvme perf ARGS --json FILE`: the output and the document (if written).
fn perf(root: &Path, args: &[&str]) -> (Output, Value) {
    perf_then(root, args, || {})
}

/// [`perf`], calling `when_measuring` once perf says it is measuring: its devices, the remote
/// ones too, are attached and their I/O starts (an event, not a delay a busy machine outruns).
fn perf_then(root: &Path, args: &[&str], when_measuring: impl FnOnce()) -> (Output, Value) {
    perf_then_with_pid(root, args, |_| when_measuring())
}

/// [`perf_then`], `when_measuring` given perf's process ID.
fn perf_then_with_pid(
    root: &Path,
    args: &[&str],
    when_measuring: impl FnOnce(u32),
) -> (Output, Value) {
    let path = root.join("perf.json");
    let mut all = vec!["perf"];
    all.extend(args);
    all.extend(["--json", path.to_str().expect("UTF-8 temp path")]);
    let mut child = usnvme_command(&all)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("usnvme runs");
    let mut stdout = child.stdout.take().expect("piped");
    let reader = std::thread::spawn(move || {
        let mut s = Vec::new();
        let _ = stdout.read_to_end(&mut s);
        s
    });
    let mut err = BufReader::new(child.stderr.take().expect("piped"));
    let mut stderr = Vec::new();
    let mut when_measuring = Some(when_measuring);
    let mut line = Vec::new();
    while err.read_until(b'\n', &mut line).is_ok_and(|n| n > 0) {
        if line.windows(9).any(|w| w == b"measuring") {
            if let Some(f) = when_measuring.take() {
                f(child.id());
            }
        }
        stderr.append(&mut line);
    }
    let status = child.wait().expect("usnvme ends");
    let out = Output {
        status,
        stdout: reader.join().expect("stdout reader"),
        stderr,
    };
    let doc = std::fs::read(&path)
        .ok()
        .and_then(|b| serde_json::from_slice(&b).ok())
        .unwrap_or(Value::Null);
    let _ = std::fs::remove_file(&path);
    (out, doc)
}

fn ios(job: &Value, dir: &str) -> u64 {
    job[dir]["total_ios"].as_u64().unwrap_or(0)
}

/// A write pass then a read pass, both verified with one seed, over `region` of every device:
/// the read pass checked blocks and found every one as written.
fn write_then_verify(root: &Path, devices: &[&str], extra: &[&str]) {
    let mut base: Vec<&str> = Vec::new();
    for d in devices {
        base.extend(["-r", d]);
    }
    base.extend([
        "--verify", "--seed", "77", "--offset", "64k", "--size", "1M", "-c", "0",
    ]);
    base.extend(extra);
    let mut write = base.clone();
    write.extend(["-w", "write", "-q", "8", "--io-count", "64"]);
    let (out, doc) = perf(root, &write);
    assert!(out.status.success(), "{}", text(&out));
    assert!(ios(&doc["total"], "write") > 0, "{doc:#}");
    let mut read = base.clone();
    read.extend(["-w", "read", "-q", "8", "--io-count", "64"]);
    let (out, doc) = perf(root, &read);
    assert!(out.status.success(), "{}", text(&out));
    assert!(ios(&doc["total"], "read") > 0, "{doc:#}");
    assert!(doc["verified_blocks"].as_u64() > Some(0), "{doc:#}");
}

#[test]
fn data_written_over_tcp_reads_back_verified_in_both_address_forms_and_with_digests() {
    let serve = Serve::start(&["--allow-host", HOST]);
    let root = host_root();
    let short = format!("tcp://{}/{NQN}", serve.addr);
    let spdk = format!(
        "trtype:TCP adrfam:IPv4 traddr:{} trsvcid:{} subnqn:{NQN}",
        serve.addr.ip(),
        serve.addr.port()
    );
    write_then_verify(root.path(), &[&short], &[]);
    write_then_verify(root.path(), &[&spdk], &["--hdr-digest", "--data-digest"]);
    // -n picks one namespace; -L percentiles; the rows name the remote namespaces
    let (out, doc) = perf(
        root.path(),
        &[
            "-r", &short, "-n", "2", "-t", "1", "-q", "4", "-c", "0", "-L", "-o", "64k",
        ],
    );
    assert!(out.status.success(), "{}", text(&out));
    let jobs = doc["jobs"].as_array().expect("jobs");
    assert_eq!(jobs.len(), 1, "{doc:#}");
    assert_eq!(jobs[0]["device"], format!("{short}/ns2"), "{doc:#}");
    assert!(ios(&jobs[0], "read") > 0, "{doc:#}");
    assert!(
        stdout(&out).contains("p99.99"),
        "percentiles: {}",
        text(&out)
    );
}

#[test]
fn stripes_over_remote_namespaces_and_mixed_with_a_local_drive_read_back_verified() {
    let serve = Serve::start(&["--allow-host", HOST]);
    let root = host_root();
    let remote = format!("tcp://{}/{NQN}", serve.addr);
    // 64 KiB I/Os over 16 KiB chunks: every I/O spans both members
    let stripe = ["--stripe", "2:16k", "-o", "64k"];
    write_then_verify(root.path(), &[&remote], &stripe);
    let mut mixed = stripe.to_vec();
    mixed.extend(["-n", "1"]);
    write_then_verify(root.path(), &["sim:6,backend=ram,size=4M", &remote], &mixed);
}

#[test]
fn rate_warm_up_mix_and_histograms_work_over_tcp() {
    let serve = Serve::start(&["--allow-host", HOST]);
    let root = host_root();
    let remote = format!("tcp://{}/{NQN}", serve.addr);
    let (out, doc) = perf(
        root.path(),
        &[
            "-r", &remote, "-n", "1", "-c", "0", "-q", "8", "-w", "randrw", "-M", "70", "-a", "1",
            "-t", "2", "--rate", "1000", "-LL",
        ],
    );
    assert!(out.status.success(), "{}", text(&out));
    let total = &doc["total"];
    let (reads, writes) = (ios(total, "read"), ios(total, "write"));
    // 2 s at 1000 IOPS after the warm-up (which would add 1000), about 70 % reads. Only the
    // upper bound is the limiter's: a loaded machine may fall short of the rate (how far is
    // not this test's to say), never above it.
    assert!(reads + writes <= 2100, "{doc:#}");
    assert!(
        reads > writes && writes > 0,
        "{reads} reads, {writes} writes"
    );
    assert!(
        doc["jobs"][0]["read_buckets"]
            .as_array()
            .is_some_and(|b| !b.is_empty()),
        "{doc:#}"
    );
    assert!(stdout(&out).contains("Histogram"), "{}", text(&out));
}

#[test]
fn sweep_runs_over_tcp() {
    let serve = Serve::start(&["--allow-host", HOST]);
    let root = host_root();
    let remote = format!("tcp://{}/{NQN}", serve.addr);
    let out = usnvme(
        root.path(),
        &[
            "sweep",
            "-r",
            &remote,
            "-n",
            "1",
            "-c",
            "0",
            "-t",
            "1",
            "--sizes",
            "4k,128k",
            "--patterns",
            "randread,write",
            "--out",
            root.path().to_str().expect("UTF-8 temp path"),
        ],
    );
    assert!(out.status.success(), "{}", text(&out));
    let table = stdout(&out);
    for point in ["4K", "128K", "randread", "write"] {
        assert!(table.contains(point), "{point} missing: {}", text(&out));
    }
}

/// How long perf runs beside a target that goes away: long enough that, on a loaded machine
/// too, the target goes while perf still sends it I/O (with 3 s, a CI run once killed the
/// target only after perf's time was up, and no I/O was left to fail).
const BESIDE_SECONDS: u64 = 10;

/// The core perf runs on beside serve: one of its own. (Sharing the target's, serve polling
/// core 0, the remote I/O trickled under load, 11 IOPS, at times with none in flight.)
fn perf_core() -> &'static str {
    let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
    if cores > 1 {
        "1"
    } else {
        "0"
    }
}

/// [`BESIDE_SECONDS`] of perf on a local RAM drive and namespace 1 of `remote`, one core (not
/// the target's), QD 8.
fn beside_a_local_drive(
    root: &Path,
    remote: &str,
    extra: &[&str],
    when_measuring: impl FnOnce(),
) -> (Output, Value) {
    let seconds = BESIDE_SECONDS.to_string();
    perf_then(root, &beside_args(remote, &seconds, extra), when_measuring)
}

/// Perf's flags for `seconds` on a local RAM drive and namespace 1 of `remote`, one core (not
/// the target's), QD 8, then `extra`.
fn beside_args<'a>(remote: &'a str, seconds: &'a str, extra: &[&'a str]) -> Vec<&'a str> {
    let mut args = vec![
        "-r",
        "sim:6,backend=ram,size=4M",
        "-r",
        remote,
        "-n",
        "1",
        "-c",
        perf_core(),
        "-t",
        seconds,
        "-q",
        "8",
    ];
    args.extend(extra);
    args
}

/// Perf on a local RAM drive and namespace 1 of `remote` as [`beside_a_local_drive`], with no
/// time of its own: `stimulus` runs once perf measures and must return only once the remote
/// I/O flows again; perf is then stopped (SIGINT), so that however late a busy machine runs the
/// stimulus, the run holds all of it. (The time given perf is a hang guard.)
fn beside_a_local_drive_through(
    root: &Path,
    remote: &str,
    extra: &[&str],
    stimulus: impl FnOnce(),
) -> (Output, Value) {
    perf_then_with_pid(root, &beside_args(remote, "600", extra), |pid| {
        stimulus();
        let pid = nix::unistd::Pid::from_raw(pid as i32);
        nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGINT).expect("SIGINT");
    })
}

/// Waits until `serve` has answered another 200 commands from now (the host's I/O goes on).
fn io_resumes(serve: &Serve) {
    let now = serve.wait_for_status("a status", |_| true)["commands"]
        .as_u64()
        .unwrap_or(0);
    serve.wait_for_status("answering I/O again", |s| {
        s["commands"].as_u64() >= Some(now + 200)
    });
}

/// One job per device; the local one ran the whole time without a failure, the remote ones
/// were lost with `why` and failed I/Os.
fn check_lost_remote(out: &Output, doc: &Value, remote: &str, why: &str) {
    assert_eq!(out.status.code(), Some(1), "{}", text(out));
    let err = stderr(out);
    assert!(
        err.contains("removed during the run")
            && err.contains("the other 1 device(s) ran to the end"),
        "{err}"
    );
    assert!(
        stdout(out).contains(&format!("the target is gone: {why}")),
        "{}",
        text(out)
    );
    for job in doc["jobs"].as_array().expect("jobs") {
        if job["device"]
            .as_str()
            .is_some_and(|d| d.starts_with(remote))
        {
            assert_eq!(job["removed"], true, "{job:#}");
        } else {
            assert_eq!(job["removed"], false, "{job:#}");
            assert_eq!(job["failed_ios"], 0, "{job:#}");
            assert!(ios(job, "read") + ios(job, "write") > 0, "{job:#}");
            assert!(
                job["elapsed_ms"].as_u64() >= Some(BESIDE_SECONDS * 1000 - 100),
                "{job:#}"
            );
        }
    }
    let failed: u64 = doc["jobs"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|j| j["failed_ios"].as_u64())
        .sum();
    assert!(
        failed > 0,
        "the I/Os in flight to the target failed: {}\n{doc:#}",
        text(out)
    );
}

/// Waits until perf's I/O queue is connected to `serve` and its I/O flows (`commands` counts
/// I/O commands only): then the target has I/Os in flight to lose.
fn io_flows_to(serve: &Serve) {
    serve.wait_for_status("serving perf's I/O", |s| {
        s["connections"].as_u64() >= Some(2) && s["commands"].as_u64() >= Some(50)
    });
}

#[test]
fn a_target_killed_mid_run_fails_its_ios_and_the_local_drive_runs_to_the_end() {
    let mut serve = Serve::start(&["--allow-host", HOST, "--json-status-every", "0.05"]);
    let root = host_root();
    let remote = format!("tcp://{}/{NQN}", serve.addr);
    let extra = ["-w", "randrw", "--verify", "--ctrl-loss-tmo", "0"];
    let (out, doc) = beside_a_local_drive(root.path(), &remote, &extra, || {
        io_flows_to(&serve);
        let _ = serve.child.kill(); // SIGKILL: no clean shutdown
    });
    check_lost_remote(&out, &doc, &remote, "the target closed the connection");
}

#[test]
fn ctrl_c_while_a_target_is_being_reconnected_ends_perf_at_once() {
    let mut serve = Serve::start(&["--allow-host", HOST, "--json-status-every", "0.05"]);
    let root = host_root();
    let remote = format!("tcp://{}/{NQN}", serve.addr);
    let mut interrupted = None;
    // the default policy: an attempt every 10 s for 600 s
    let args = ["-r", &remote, "-c", perf_core(), "-t", "60", "-q", "8"];
    let (out, _) = perf_then_with_pid(root.path(), &args, |pid| {
        io_flows_to(&serve);
        let _ = serve.child.kill();
        let _ = serve.child.wait();
        let pid = nix::unistd::Pid::from_raw(pid as i32);
        nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGINT).expect("SIGINT");
        interrupted = Some(std::time::Instant::now());
    });
    let waited = interrupted.expect("perf measured").elapsed();
    assert_eq!(out.status.code(), Some(130), "{}", text(&out));
    assert!(
        stdout(&out).contains("interrupted by SIGINT: not reconnecting"),
        "{}",
        text(&out)
    );
    // not after the first attempt (10 s), nor the drain's limit
    assert!(
        waited < Duration::from_secs(10),
        "{waited:?}: {}",
        text(&out)
    );
}

/// A TCP relay in front of a target: it can go silent ([`Relay::freeze`]: nothing more is
/// forwarded (what comes is counted), every connection stays open: a cut cable, a hung host)
/// or drop every connection and refuse new ones ([`Relay::cut`]: a target that went away)
/// until [`Relay::restore`].
///
/// It forwards whole NVMe/TCP PDUs and reads what it needs from them: which queue each
/// connection's Connect named, the commands a host sent and the completions passed back on
/// each. So it can hold back an I/O queue's completions ([`Relay::stall_io_completions`]: the
/// host has I/O in flight that cannot complete) and hold the Connect of a new I/O queue, and
/// only that ([`Relay::hold_io_connects`]: a target whose process does not answer yet).
struct Relay {
    addr: SocketAddr,
    /// Bytes forwarded from the host to the target.
    bytes: Arc<AtomicU64>,
    frozen: Arc<AtomicBool>,
    refusing: Arc<AtomicBool>,
    open: Arc<Mutex<Vec<TcpStream>>>,
    /// What the PDUs told, and the holds; the condition variable signals every change.
    state: Arc<(Mutex<RelayState>, Condvar)>,
}

#[derive(Default)]
struct RelayState {
    /// Every connection taken, in order.
    conns: Vec<RelayedConn>,
    /// I/O queue Connects (QID above 0) are held, not forwarded, until [`Relay::release`].
    holding: bool,
    /// Each I/O queue Connect held: how long it was (`None` while it still is).
    held: Vec<Option<Duration>>,
}

#[derive(Default)]
struct RelayedConn {
    /// The queue its Connect named (0: admin), once seen.
    qid: Option<u16>,
    /// Command capsules read from the host (it sent at least these).
    commands: u64,
    /// Completions passed to the host, counted before they are written (it got at most these).
    completions: u64,
    /// Completions to the host are held back (the target's answers wait in the relay).
    stalled: bool,
}

impl RelayedConn {
    /// Commands the host sent that it cannot have seen completed: at least this many.
    fn surely_in_flight(&self) -> u64 {
        self.commands.saturating_sub(self.completions)
    }
}

/// NVMe/TCP PDU types the relay looks at.
const PDU_CAPSULE_CMD: u8 = 0x04;
const PDU_CAPSULE_RESP: u8 = 0x05;
const PDU_C2H_DATA: u8 = 0x07;
/// C2HData's SUCCESS flag: it ends its command, no CapsuleResp follows.
const PDU_FLAG_SUCCESS: u8 = 1 << 3;

/// Reads one PDU (its common header's PLEN says how long) into `pdu`; false at the end of the
/// stream or on an error.
fn read_pdu(from: &mut TcpStream, pdu: &mut Vec<u8>) -> bool {
    pdu.resize(8, 0);
    if from.read_exact(pdu).is_err() {
        return false;
    }
    let plen = u32::from_le_bytes([pdu[4], pdu[5], pdu[6], pdu[7]]) as usize;
    if !(8..=64 << 20).contains(&plen) {
        return false; // not NVMe/TCP: this relay serves nothing else
    }
    pdu.resize(plen, 0);
    from.read_exact(&mut pdu[8..]).is_ok()
}

/// The queue a Fabrics Connect capsule names (its SQE after the 8-byte header: opcode 0x7f,
/// FCTYPE 0x01, QID in CDW10's upper half), if `pdu` is one.
fn connect_qid(pdu: &[u8]) -> Option<u16> {
    let sqe = pdu.get(8..72)?;
    (pdu[0] == PDU_CAPSULE_CMD && sqe[0] == 0x7f && sqe[4] == 0x01)
        .then(|| u16::from_le_bytes([sqe[42], sqe[43]]))
}

/// Whether `pdu` (from the target) ends a command.
fn is_completion(pdu: &[u8]) -> bool {
    pdu[0] == PDU_CAPSULE_RESP || (pdu[0] == PDU_C2H_DATA && pdu[1] & PDU_FLAG_SUCCESS != 0)
}

impl Relay {
    fn to(target: SocketAddr) -> Relay {
        let listener = TcpListener::bind("127.0.0.1:0").expect("bind");
        let relay = Relay {
            addr: listener.local_addr().expect("address"),
            bytes: Arc::default(),
            frozen: Arc::default(),
            refusing: Arc::default(),
            open: Arc::default(),
            state: Arc::default(),
        };
        let (frozen, refusing, open, bytes, state) = (
            relay.frozen.clone(),
            relay.refusing.clone(),
            relay.open.clone(),
            relay.bytes.clone(),
            relay.state.clone(),
        );
        std::thread::spawn(move || {
            for client in listener.incoming() {
                let Ok(client) = client else { return };
                if refusing.load(Ordering::Relaxed) {
                    continue; // dropped: closed at once
                }
                let Ok(server) = TcpStream::connect(target) else {
                    return;
                };
                let index = {
                    let mut st = state.0.lock().expect("not poisoned");
                    st.conns.push(RelayedConn::default());
                    st.conns.len() - 1
                };
                for s in [&client, &server] {
                    open.lock()
                        .expect("not poisoned")
                        .push(s.try_clone().expect("clone"));
                }
                for (mut from, mut into, to_target) in [
                    (
                        client.try_clone().expect("clone"),
                        server.try_clone().expect("clone"),
                        true,
                    ),
                    (server, client, false),
                ] {
                    let (frozen, bytes, state) = (frozen.clone(), bytes.clone(), state.clone());
                    std::thread::spawn(move || {
                        let (lock, changed) = &*state;
                        let mut pdu = Vec::new();
                        while read_pdu(&mut from, &mut pdu) {
                            if to_target {
                                bytes.fetch_add(pdu.len() as u64, Ordering::Relaxed);
                            }
                            if frozen.load(Ordering::Relaxed) {
                                // silent: what comes is taken and dropped, the connection
                                // stays open
                                continue;
                            }
                            let mut st = lock.lock().expect("not poisoned");
                            if to_target && pdu[0] == PDU_CAPSULE_CMD {
                                st.conns[index].commands += 1;
                                if let Some(qid) = connect_qid(&pdu) {
                                    st.conns[index].qid = Some(qid);
                                    if qid > 0 && st.holding {
                                        let since = std::time::Instant::now();
                                        st.held.push(None);
                                        let n = st.held.len() - 1;
                                        changed.notify_all();
                                        while st.holding {
                                            st = changed.wait(st).expect("not poisoned");
                                        }
                                        st.held[n] = Some(since.elapsed());
                                    }
                                }
                            } else if !to_target && is_completion(&pdu) {
                                while st.conns[index].stalled {
                                    st = changed.wait(st).expect("not poisoned");
                                }
                                st.conns[index].completions += 1;
                            }
                            changed.notify_all();
                            drop(st);
                            if into.write_all(&pdu).is_err() {
                                break;
                            }
                        }
                        if !frozen.load(Ordering::Relaxed) {
                            let _ = into.shutdown(Shutdown::Both);
                        }
                    });
                }
            }
        });
        relay
    }

    fn freeze(&self) {
        self.frozen.store(true, Ordering::Relaxed);
    }

    /// Drops every connection (both ends see it closed) and refuses new ones; completions
    /// held back by [`Relay::stall_io_completions`] go nowhere.
    fn cut(&self) {
        self.refusing.store(true, Ordering::Relaxed);
        for s in self.open.lock().expect("not poisoned").drain(..) {
            let _ = s.shutdown(Shutdown::Both);
        }
        let (lock, changed) = &*self.state;
        let mut st = lock.lock().expect("not poisoned");
        st.conns.iter_mut().for_each(|c| c.stalled = false);
        changed.notify_all();
    }

    fn restore(&self) {
        self.refusing.store(false, Ordering::Relaxed);
    }

    /// Holds back the target's completions on the I/O queue connections there are now, and
    /// returns once the host surely has I/O in flight on one: commands it sent whose
    /// completions it cannot have had (they wait here).
    fn stall_io_completions(&self) {
        let (lock, _) = &*self.state;
        let mut st = lock.lock().expect("not poisoned");
        st.conns
            .iter_mut()
            .filter(|c| c.qid.is_some_and(|q| q > 0))
            .for_each(|c| c.stalled = true);
        let _in_flight = self.wait(st, "I/O in flight behind held completions", |st| {
            st.conns
                .iter()
                .any(|c| c.stalled && c.surely_in_flight() > 0)
        });
    }

    /// I/O queue Connects from now on are held (taken, not forwarded) until
    /// [`Relay::release`]; an admin queue's goes through.
    fn hold_io_connects(&self) {
        let (lock, _) = &*self.state;
        lock.lock().expect("not poisoned").holding = true;
    }

    /// Waits until an I/O queue Connect is held.
    fn wait_for_held_io_connect(&self) {
        let (lock, _) = &*self.state;
        let st = lock.lock().expect("not poisoned");
        let _held = self.wait(st, "an I/O queue Connect held", |st| !st.held.is_empty());
    }

    /// Forwards the held Connects; how long each was held.
    fn release(&self) -> Vec<Duration> {
        let (lock, changed) = &*self.state;
        let mut st = lock.lock().expect("not poisoned");
        st.holding = false;
        changed.notify_all();
        let st = self.wait(st, "the held Connects forwarded", |st| {
            st.held.iter().all(Option::is_some)
        });
        st.held.iter().flatten().copied().collect()
    }

    /// Waits (a minute at most: a hang guard, not a window) until `done` holds.
    fn wait<'a>(
        &self,
        mut st: std::sync::MutexGuard<'a, RelayState>,
        what: &str,
        done: impl Fn(&RelayState) -> bool,
    ) -> std::sync::MutexGuard<'a, RelayState> {
        let deadline = std::time::Instant::now() + Duration::from_secs(60);
        while !done(&st) {
            let left = deadline.saturating_duration_since(std::time::Instant::now());
            assert!(!left.is_zero(), "after 60 s still no {what}");
            st = self.state.1.wait_timeout(st, left).expect("not poisoned").0;
        }
        st
    }
}

#[test]
fn a_target_gone_silent_is_lost_by_keep_alive_and_the_local_drive_runs_to_the_end() {
    let serve = Serve::start(&["--allow-host", HOST, "--json-status-every", "0.05"]);
    let root = host_root();
    let relay = Relay::to(serve.addr);
    let remote = format!("tcp://{}/{NQN}", relay.addr);
    let started = std::time::Instant::now();
    let (out, doc) = beside_a_local_drive(
        root.path(),
        &remote,
        &["--keep-alive-tmo", "1", "--ctrl-loss-tmo", "0"],
        || {
            io_flows_to(&serve);
            relay.freeze()
        },
    );
    // lost by keep alive (the reason checked above), not by the I/O queues' own 30 s command
    // timeout; the time is a hang guard only (the run takes 10 s)
    check_lost_remote(&out, &doc, &remote, "keep-alive lost");
    assert!(
        started.elapsed() < Duration::from_secs(100),
        "{:?}",
        started.elapsed()
    );
}

/// A write pass over every block of a region, the target going away in the middle and coming
/// back: the write pass ends with no failure and one reconnect; a read pass then finds every
/// block of the region written and intact (a write lost in the reconnect would read as zeroes,
/// unchecked; one sent twice to the wrong place, as a mismatch).
#[test]
fn a_target_that_goes_away_and_comes_back_gets_its_unfinished_ios_again_and_loses_none() {
    let serve = Serve::start_on(
        "sim:0,backend=ram,size=16M,bs=4096",
        &["--allow-host", HOST, "--json-status-every", "0.05"],
    );
    let root = host_root();
    let relay = Relay::to(serve.addr);
    let remote = format!("tcp://{}/{NQN}", relay.addr);
    // 1024 I/Os of 4 KiB: every block of 4 MiB once, over 5 s (the rate) to go away in
    let pass = |workload: &str| {
        vec![
            "-r",
            &remote,
            "-c",
            "0",
            "-w",
            workload,
            "--verify",
            "--seed",
            "5",
            "--size",
            "4M",
            "--io-count",
            "1024",
            "--rate",
            "200",
            "-q",
            "8",
            "--reconnect-delay",
            "1",
            "--ctrl-loss-tmo",
            "30",
        ]
        .into_iter()
        .map(str::to_owned)
        .collect::<Vec<String>>()
    };
    let args = pass("write");
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let (out, doc) = perf_then(root.path(), &args, || {
        io_flows_to(&serve);
        relay.cut();
        // the target saw its host go: then let the reconnect through
        serve.wait_for_status("the host's connections gone", |s| {
            s["connections"].as_u64() == Some(0)
        });
        relay.restore();
    });
    assert!(out.status.success(), "{}", text(&out));
    let job = &doc["jobs"][0];
    assert_eq!(
        (job["failed_ios"].as_u64(), job["reconnects"].as_u64()),
        (Some(0), Some(1)),
        "{}",
        text(&out)
    );
    assert_eq!(ios(job, "write"), 1024, "{job:#}");
    assert!(
        stdout(&out).contains("reconnected 1 time(s)"),
        "{}",
        text(&out)
    );

    let args = pass("read");
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let (out, doc) = perf(root.path(), &args);
    assert!(out.status.success(), "{}", text(&out));
    assert_eq!(
        doc["verified_blocks"].as_u64(),
        Some(1024),
        "{}",
        text(&out)
    );
}

/// `usnvme serve` with two ports (and `extra`), a relay in front of each, and the subsystem's
/// address through each relay.
fn two_ports(extra: &[&str]) -> (Serve, [Relay; 2], [String; 2]) {
    let mut args = vec![
        "--allow-host",
        HOST,
        "--json-status-every",
        "0.05",
        "--listen",
        "127.0.0.1:0",
    ];
    args.extend(extra);
    let serve = Serve::start(&args);
    let relays = [Relay::to(serve.listeners[0]), Relay::to(serve.listeners[1])];
    let addresses = [0, 1].map(|i| format!("tcp://{}/{NQN}", relays[i].addr));
    (serve, relays, addresses)
}

/// perf on both addresses of one subsystem (two paths), verified random reads and writes until
/// interrupted or gone, and `extra`.
fn two_path_args<'a>(a: &'a str, b: &'a str, extra: &[&'a str]) -> Vec<&'a str> {
    let mut args = vec![
        "-r",
        a,
        "-r",
        b,
        "-n",
        "1",
        "-c",
        perf_core(),
        "-t",
        "120",
        "-q",
        "8",
        "-w",
        "randrw",
        "--verify",
        // 64 blocks: reads soon find blocks this run wrote, however short a loaded machine
        // makes the run (over 16 MiB, 190 reads once verified none)
        "--size",
        "256k",
    ];
    args.extend(extra);
    args
}

/// A target with two ports, a relay in front of each, and perf given both addresses of its
/// NQN: one subsystem on two paths, verified random reads and writes, reconnecting only after
/// 30 s. `then` runs once I/O flows on both; what goes on after it goes the other way. Once
/// `then` saw it, Ctrl-C ends perf (an event, not a run time a loaded machine outlasts). The
/// run must end clean: no I/O failed (one left on a path given up at Ctrl-C would), blocks
/// read back verified.
fn two_paths(extra_serve: &[&str], then: impl FnOnce(&Serve, &[Relay; 2])) {
    let (serve, relays, [a, b]) = two_ports(extra_serve);
    let root = host_root();
    let mut interrupted = None;
    let (out, doc) = perf_then_with_pid(
        root.path(),
        &two_path_args(
            &a,
            &b,
            &["--reconnect-delay", "30", "--ctrl-loss-tmo", "60"],
        ),
        |pid| {
            io_flows_to(&serve);
            for r in &relays {
                let before = r.bytes.load(Ordering::Relaxed);
                wait_for("I/O on both paths", || {
                    r.bytes.load(Ordering::Relaxed) > before + (64 << 10)
                });
            }
            then(&serve, &relays);
            let pid = nix::unistd::Pid::from_raw(pid as i32);
            nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGINT).expect("SIGINT");
            interrupted = Some(std::time::Instant::now());
        },
    );
    assert_eq!(out.status.code(), Some(130), "{}", text(&out));
    assert!(stderr(&out).contains("2 paths"), "{}", text(&out));
    // an I/O left on the path that went would keep perf draining (up to 90 s)
    let drained = interrupted.expect("perf measured").elapsed();
    assert!(
        drained < Duration::from_secs(30),
        "{drained:?}: {}",
        text(&out)
    );
    assert_eq!(doc["total"]["failed_ios"], 0, "{}", text(&out));
    assert!(doc["verified_blocks"].as_u64() > Some(0), "{doc:#}");
}

/// Waits (at most 20 s) until `done`.
fn wait_for(what: &str, done: impl Fn() -> bool) {
    let deadline = std::time::Instant::now() + Duration::from_secs(20);
    while !done() {
        assert!(
            std::time::Instant::now() < deadline,
            "after 20 s still no {what}"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

#[test]
fn over_two_paths_the_io_of_a_path_cut_goes_the_other_way_at_once() {
    two_paths(&[], |_, [a, b]| {
        // I/O stuck in flight on A (sent after it went silent), then A's connections gone
        a.freeze();
        let stuck = a.bytes.load(Ordering::Relaxed);
        // (a command capsule: 72 bytes for a read; reads alone may fill the path's share of
        // the queue with less than 1 KiB, found by CI on a busy machine)
        wait_for("I/O sent on the silent path", || {
            a.bytes.load(Ordering::Relaxed) >= stuck + 72
        });
        a.cut();
        let before = b.bytes.load(Ordering::Relaxed);
        wait_for("I/O on the other path", || {
            b.bytes.load(Ordering::Relaxed) > before + (64 << 10)
        });
    });
}

#[test]
fn over_two_paths_the_io_leaves_a_port_made_inaccessible() {
    let states = tempfile::NamedTempFile::new().expect("a state file");
    let file = states.path().to_str().expect("UTF-8 temp path").to_owned();
    two_paths(&["--ana-state-file", &file], |serve, [_, b]| {
        let port = serve.listeners[0];
        std::fs::write(states.path(), format!("{port} inaccessible\n")).expect("written");
        serve.wait_for_status("port A inaccessible", |s| {
            s["ana_states"].to_string().contains("inaccessible")
        });
        let before = b.bytes.load(Ordering::Relaxed);
        wait_for("I/O on the other path", || {
            b.bytes.load(Ordering::Relaxed) > before + (64 << 10)
        });
    });
}

#[test]
fn remote_mistakes_are_named_before_any_io() {
    let serve = Serve::start(&["--allow-host", HOST]);
    let root = host_root();
    let remote = format!("tcp://{}/{NQN}", serve.addr);
    let unknown = format!("tcp://{}/nqn.2024-01.io.usnvme:nothing", serve.addr);
    let closed = {
        let l = TcpListener::bind("127.0.0.1:0").expect("bind");
        l.local_addr().expect("address") // closed when `l` drops here
    };
    let refused = format!("tcp://{closed}/{NQN}");
    let stranger = "nqn.2014-08.org.nvmexpress:uuid:00000000-0000-4000-8000-000000000bad";
    let cases: &[(&[&str], i32, &[&str])] = &[
        (
            &["-r", "tcp://127.0.0.1:4420"],
            2,
            &["names no subsystem", "usnvme discover"],
        ),
        (&["-r", "tcp://127.0.0.1:x/nqn.a:b"], 2, &["example"]),
        (&["-r", &remote, "-r", &remote], 2, &["given twice"]),
        (
            &["-r", &remote, "-n", "9"],
            2,
            &["-n 9:", "no namespace 9", "its namespaces: 1, 2"],
        ),
        (&["-r", &remote, "-q", "4096"], 2, &["-q 4096", "at most"]),
        (
            &["-r", &remote, "--reset-after", "0.5"],
            2,
            &["--reset-after", "NVMe/TCP target"],
        ),
        (&["-r", &refused], 1, &["connection refused"]),
        (&["-r", &unknown], 1, &["unknown NQN", "usnvme discover"]),
        (
            &["-r", &remote, "--hostnqn", stranger],
            1,
            &["host not allowed", stranger],
        ),
    ];
    for (args, code, says) in cases {
        let mut all = vec!["perf", "-t", "1", "-c", "0"];
        all.extend(*args);
        let out = usnvme(root.path(), &all);
        let err = stderr(&out);
        assert_eq!(out.status.code(), Some(*code), "{args:?}: {}", text(&out));
        assert!(err.starts_with("usnvme: error: "), "{args:?}: {err}");
        for s in *says {
            assert!(err.contains(s), "{args:?}: {s:?} not in {err}");
        }
        assert!(
            !stdout(&out).contains("Total"),
            "{args:?}: no I/O ran: {}",
            text(&out)
        );
    }
}

#[test]
fn serve_exports_a_pi_namespace_as_plain_blocks_and_leaves_out_one_whose_metadata_would_travel() {
    // drive 0: 512+8 with PI type 1 (the drive inserts and strips it: exported); drive 1:
    // 512+16 without PI (its metadata would have to travel: left out)
    let serve = Serve::start_on(
        "sim:0,backend=ram,size=16M,ms=8,pi=1",
        &[
            "-r",
            "sim:1,backend=ram,size=16M,ms=16",
            "--allow-host",
            HOST,
        ],
    );
    let root = host_root();
    let remote = format!("tcp://{}/{NQN}", serve.addr);
    write_then_verify(root.path(), &[&remote], &[]);
    let (out, doc) = perf(
        root.path(),
        &["-r", &remote, "-t", "1", "-q", "4", "-c", "0"],
    );
    assert!(out.status.success(), "{}", text(&out));
    let devices: Vec<&str> = doc["jobs"]
        .as_array()
        .expect("jobs")
        .iter()
        .filter_map(|j| j["device"].as_str())
        .collect();
    assert_eq!(
        devices,
        [remote.as_str()],
        "one namespace exported: {doc:#}"
    );
}

#[test]
fn over_two_paths_the_device_fails_only_once_both_paths_are_gone() {
    let (serve, relays, [a, b]) = two_ports(&[]);
    let root = host_root();
    let args = two_path_args(&a, &b, &["--ctrl-loss-tmo", "0"]);
    let (out, doc) = perf_then(root.path(), &args, || {
        io_flows_to(&serve);
        // one path goes: the I/O goes on over the other
        relays[0].cut();
        let before = relays[1].bytes.load(Ordering::Relaxed);
        wait_for("I/O on the other path", || {
            relays[1].bytes.load(Ordering::Relaxed) > before + (64 << 10)
        });
        // then the other: now the device is gone
        relays[1].cut();
    });
    assert_eq!(out.status.code(), Some(1), "{}", text(&out));
    let job = &doc["jobs"][0];
    assert_eq!(job["removed"], true, "{job:#}");
    assert!(
        stdout(&out).contains("the target is gone: the target closed the connection"),
        "{}",
        text(&out)
    );
}

#[test]
fn several_hosts_on_one_reactor_beyond_its_buffers_and_a_small_drive_queue_lose_no_io() {
    // One reactor; the drive's queues hold 8 commands; four hosts with two queues each keep
    // 4 × 2 × 64 commands in flight, beyond the reactor's 256 DMA buffers: commands wait for
    // buffers and room, none fails, every block read back is as written.
    let serve = Serve::start_on(
        "sim:0,backend=ram,size=64M,mqes=7",
        &["--allow-any-host", "--idle", "poll"],
    );
    let short = format!("tcp://{}/{NQN}", serve.addr);
    let runs: Vec<_> = (0..4)
        .map(|h| {
            let short = short.clone();
            std::thread::spawn(move || {
                let root = host_root();
                let host =
                    format!("nqn.2014-08.org.nvmexpress:uuid:75736e76-6d65-4000-8000-68{h:010}");
                let offset = format!("{}M", h * 16);
                let args = [
                    "-r",
                    &short,
                    "--hostnqn",
                    &host,
                    "-c",
                    "0-1",
                    "-q",
                    "64",
                    "-o",
                    "4k",
                    "-w",
                    "randrw",
                    "--verify",
                    "--offset",
                    &offset,
                    "--size",
                    "16M",
                    "--io-count",
                    "3000",
                ];
                let (out, doc) = perf(root.path(), &args);
                (h, out, doc)
            })
        })
        .collect();
    for run in runs {
        let (h, out, doc) = run.join().expect("a host");
        assert!(out.status.success(), "host {h}: {}", text(&out));
        assert_eq!(
            doc["total"]["failed_ios"].as_u64(),
            Some(0),
            "host {h}: {doc:#}"
        );
        assert!(
            ios(&doc["total"], "write") > 0 && ios(&doc["total"], "read") > 0,
            "{doc:#}"
        );
        assert!(
            doc["verified_blocks"].as_u64() > Some(0),
            "host {h}: {doc:#}"
        );
    }
    let status = serve.wait_for_status("idle, every buffer back", |s| {
        s["buffers_in_use"].as_u64() == Some(0) && s["connections"].as_u64() == Some(0)
    });
    assert!(
        status["commands_waited"].as_u64() > Some(0),
        "the commands had to wait: {status:#}"
    );
}

/// How long the relay holds the reconnecting I/O queue's Connect: the stimulus's length. The
/// checks compare with the hold the relay measured, not with this.
const CONNECT_HELD: Duration = Duration::from_secs(5);

#[test]
fn a_reconnect_the_target_answers_late_holds_up_nothing_but_its_own_ios() {
    // One reactor drives a local drive and the remote namespace. The target's answers on the
    // I/O queue are held back until the host surely has I/O in flight there; then the
    // connections are cut. The controller's new admin queue gets through; the reactor's new
    // I/O queue connects, and its Connect is taken but not answered for a while (a target
    // whose process is busy). The set-up is polled in the reactor's turns: the local drive is
    // served all along; the remote I/Os wait for the target, and go again once it answers.
    // (Cut with nothing in flight, as a descheduled reactor once was on a busy CI machine,
    // the remote device would wait just the same, but no I/O of it would show the wait.)
    let serve = Serve::start(&["--allow-host", HOST, "--json-status-every", "0.05"]);
    let root = host_root();
    let relay = Relay::to(serve.addr);
    let remote = format!("tcp://{}/{NQN}", relay.addr);
    let mut held = Vec::new();
    let (out, doc) = beside_a_local_drive_through(
        root.path(),
        &remote,
        &[
            "-w",
            "randrw",
            "--verify",
            "--reconnect-delay",
            "1",
            "--ctrl-loss-tmo",
            "60",
        ],
        || {
            io_flows_to(&serve);
            relay.stall_io_completions();
            relay.hold_io_connects();
            relay.cut();
            relay.restore();
            relay.wait_for_held_io_connect();
            // (the stimulus: the new I/O queue's Connect unanswered for a while)
            std::thread::sleep(CONNECT_HELD);
            held = relay.release();
            io_resumes(&serve);
        },
    );
    assert_eq!(out.status.code(), Some(130), "stopped: {}", text(&out));
    // the reconnect's one I/O queue Connect, nothing else, was held
    let [held] = held[..] else {
        panic!("held Connects: {held:?}: {}", text(&out));
    };
    let held_us = u64::try_from(held.as_micros()).expect("µs");
    eprintln!("the I/O queue's Connect held {held_us} µs");
    assert!(doc["verified_blocks"].as_u64() > Some(0), "{doc:#}");
    for job in doc["jobs"].as_array().expect("jobs") {
        assert_eq!(job["failed_ios"], 0, "{job:#}");
        assert!(ios(job, "read") > 0 && ios(job, "write") > 0, "{job:#}");
        let gap = job["longest_gap_us"].as_u64().expect("longest gap");
        if job["device"] == "sim:6" {
            // a reactor that waited on the set-up would show the whole hold
            assert!(
                gap < held_us,
                "the local drive paused {gap} µs, the Connect was held {held_us} µs: {job:#}"
            );
            eprintln!("the local drive's longest pause: {gap} µs");
        } else {
            assert!(job["reconnects"].as_u64() >= Some(1), "{job:#}");
            // its I/O in flight at the cut completed only once the Connect was answered
            // (and after the reconnect delay before it: perf's clock and the relay's need
            // not agree to the microsecond)
            assert!(
                gap >= held_us,
                "the remote one waited {gap} µs, the Connect was held {held_us} µs: {job:#}"
            );
            eprintln!("the remote one's longest pause: {gap} µs");
        }
    }
}

/// One job per device, none failed, both moved data; the local drive (`sim:6`) never paused
/// more than a busy machine can hold a thread, the remote one paused for its target.
fn local_ran_on_while_remote_paused(out: &Output, doc: &Value, writes_only: bool) {
    assert_eq!(out.status.code(), Some(130), "stopped: {}", text(out));
    for job in doc["jobs"].as_array().expect("jobs") {
        assert_eq!(job["failed_ios"], 0, "{job:#}");
        assert!(ios(job, "write") > 0, "{job:#}");
        assert!(writes_only || ios(job, "read") > 0, "{job:#}");
        let gap = job["longest_gap_us"].as_u64().expect("longest gap");
        if job["device"] == "sim:6" {
            assert!(gap < 1_000_000, "the local drive paused {gap} µs: {job:#}");
            eprintln!("the local drive's longest pause: {gap} µs");
        } else {
            assert!(
                gap >= 1_000_000,
                "the remote one waited for its target: {job:#}"
            );
        }
    }
}

#[test]
fn a_target_stopped_for_5_s_holds_up_nothing_but_its_own_ios_which_then_complete_verified() {
    let serve = Serve::start(&["--allow-host", HOST, "--json-status-every", "0.05"]);
    let root = host_root();
    let remote = format!("tcp://{}/{NQN}", serve.addr);
    let extra = ["-w", "randrw", "--verify"];
    let (out, doc) = beside_a_local_drive_through(root.path(), &remote, &extra, || {
        io_flows_to(&serve);
        let pid = nix::unistd::Pid::from_raw(serve.child.id() as i32);
        nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGSTOP).expect("SIGSTOP");
        // (the stimulus: a target process stopped for 5 s, its sockets open)
        std::thread::sleep(Duration::from_secs(5));
        nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGCONT).expect("SIGCONT");
        io_resumes(&serve);
    });
    local_ran_on_while_remote_paused(&out, &doc, false);
    assert!(doc["verified_blocks"].as_u64() > Some(0), "{doc:#}");
}

#[test]
fn a_target_killed_and_restarted_is_reconnected_without_holding_up_the_local_drive() {
    // a port of its own, so that the target comes back where it was
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .expect("a free port")
        .port()
        .to_string();
    let listen = format!("127.0.0.1:{port}");
    let serve_args = [
        "--allow-host",
        HOST,
        "--json-status-every",
        "0.05",
        "--listen",
        &listen,
    ];
    let mut serve = Serve::start(&serve_args);
    let root = host_root();
    let remote = format!("tcp://{listen}/{NQN}");
    // writes only: the restarted target's RAM drive has lost what was written before
    let extra = [
        "-w",
        "randwrite",
        "--reconnect-delay",
        "1",
        "--ctrl-loss-tmo",
        "60",
    ];
    let mut restarted = None;
    let (out, doc) = beside_a_local_drive_through(root.path(), &remote, &extra, || {
        io_flows_to(&serve);
        let _ = serve.child.kill(); // SIGKILL: no clean shutdown
        let _ = serve.child.wait();
        let again = Serve::start(&serve_args);
        io_flows_to(&again);
        io_resumes(&again);
        restarted = Some(again);
    });
    local_ran_on_while_remote_paused(&out, &doc, true);
    let remote_job = doc["jobs"]
        .as_array()
        .and_then(|jobs| jobs.iter().find(|j| j["device"] != "sim:6"))
        .expect("the remote job");
    assert!(
        remote_job["reconnects"].as_u64() >= Some(1),
        "{remote_job:#}"
    );
    drop(restarted);
}
