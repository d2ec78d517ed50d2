//! `usnvme perf` run as a process on simulated drives: no root, no VFIO, a second or two each.

use std::collections::BTreeSet;
use std::path::PathBuf;
use std::process::{Command, Output, Stdio};
use std::time::Duration;

use serde_json::Value;
use usnvme_driver::pci::fake::FakeSysfs;
use usnvme_tests::signal;

fn usnvme(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_usnvme"))
        .arg("perf")
        .args(args)
        .env_remove("RUST_LOG")
        .output()
        .expect("usnvme runs")
}

fn text(out: &Output) -> String {
    format!(
        "status {:?}\nstdout:\n{}\nstderr:\n{}",
        out.status.code(),
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    )
}

fn json_path(name: &str) -> PathBuf {
    std::env::temp_dir().join(format!("usnvme-perf-{}-{name}.json", std::process::id()))
}

/// Runs perf with `--json` and returns the document.
fn perf_json(name: &str, args: &[&str]) -> Value {
    let path = json_path(name);
    let path_str = path.to_str().expect("UTF-8 temp path");
    let mut all = args.to_vec();
    all.extend(["--json", path_str]);
    let out = usnvme(&all);
    assert!(out.status.success(), "{}", text(&out));
    take_json(&path)
}

/// The `--json` document perf wrote at `path`, which is then removed.
fn take_json(path: &std::path::Path) -> Value {
    let doc = std::fs::read(path).expect("the JSON file");
    let _ = std::fs::remove_file(path);
    serde_json::from_slice(&doc).expect("JSON")
}

/// A job's reads and writes.
fn total_ios(job: &Value) -> u64 {
    job["read"]["total_ios"].as_u64().unwrap_or(0) + job["write"]["total_ios"].as_u64().unwrap_or(0)
}

fn f(v: &Value) -> f64 {
    v.as_f64().expect("a number")
}

#[test]
fn bad_input_exits_2_naming_the_flag_before_any_io() {
    let cases: &[(&[&str], &str)] = &[
        (&["-q", "0"], "'0' for '--queue-depth"),
        (&["-q", "100000"], "-q 100000"),
        (&["-q", "300", "-r", "sim:1,mqes=255"], "-q 300"),
        (&["-o", "4097"], "-o 4097"),
        (&["-o", "4x"], "'4x' for '--io-size"),
        (&["-o", "3M"], "-o 3M"),
        (&["-w", "rw", "-M", "101"], "'101' for '--rwmixread"),
        (&["-w", "sideways"], "'sideways' for '--workload"),
        (&["-c", "4095"], "-c 4095"),
        (&["-c", "0xZ"], "-c"),
        (&["-c", "1-0"], "-c"),
        (&["-r", "sim:0"], "sim:0 is given twice"),
        (&["-t", "0"], "'0' for '--time"),
        (&["--stripe", "x"], "'x' for '--stripe"),
        (
            &["--seed", "7"],
            "required arguments were not provided: --verify",
        ),
        (&["--stripe", "3"], "--stripe 3"),
    ];
    for (args, flag) in cases {
        let mut all = vec!["-r", "sim:0", "-t", "1"];
        if args.contains(&"-t") {
            all.truncate(2);
        }
        all.extend_from_slice(args);
        let out = usnvme(&all);
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{args:?}: {}", text(&out));
        assert!(
            stderr.contains(flag),
            "{args:?} should name {flag}: {stderr}"
        );
        assert_eq!(
            stderr.trim().lines().count(),
            1,
            "{args:?}: one line: {stderr}"
        );
        assert!(
            out.stdout.is_empty(),
            "{args:?}: no results: {}",
            text(&out)
        );
    }
}

#[test]
fn a_drive_not_on_vfio_is_a_usage_error() {
    let fake = FakeSysfs::new();
    fake.add_pci_device("0000:02:00.0", 0x010802, 0x1b36, 0x0010)
        .bind("nvme");
    fake.write("sys/devices/system/cpu/online", "0-1\n");
    fake.write(
        "proc/self/status",
        "Name:\tusnvme\nCpus_allowed_list:\t0-1\n",
    );
    let out = Command::new(env!("CARGO_BIN_EXE_usnvme"))
        .args(["perf", "-r", "0000:02:00.0", "-t", "1"])
        .env("USNVME_SYSFS_ROOT", fake.root())
        .env_remove("RUST_LOG")
        .output()
        .expect("usnvme runs");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{}", text(&out));
    assert!(
        stderr.contains("-r 0000:02:00.0") && stderr.contains("vfio-pci"),
        "{stderr}"
    );
}

#[test]
fn the_table_has_a_row_per_device_and_core_and_a_total() {
    let out = usnvme(&["-r", "sim:0-1", "-c", "0", "-q", "8", "-t", "1", "-LL"]);
    assert!(out.status.success(), "{}", text(&out));
    let stdout = String::from_utf8_lossy(&out.stdout);
    for needle in ["sim:0@core0", "sim:1@core0", "Total", "p99.99", "Histogram"] {
        assert!(stdout.contains(needle), "{needle}: {stdout}");
    }
}

#[test]
fn json_totals_are_the_sums_of_the_jobs() {
    let doc = perf_json(
        "sums",
        &[
            "-r", "sim:0-2", "-w", "randrw", "-M", "70", "-q", "8", "-t", "1", "-o", "8k",
        ],
    );
    let jobs = doc["jobs"].as_array().expect("jobs");
    assert!(jobs.len() >= 3, "{doc:#}");
    for dir in ["read", "write"] {
        let total = &doc["total"][dir];
        for key in ["io_bytes", "total_ios"] {
            let sum: u64 = jobs
                .iter()
                .map(|j| j[dir][key].as_u64().expect("u64"))
                .sum();
            assert_eq!(total[key].as_u64(), Some(sum), "{dir}.{key}: {doc:#}");
        }
        let iops: f64 = jobs.iter().map(|j| f(&j[dir]["iops"])).sum();
        assert!(
            (f(&total["iops"]) - iops).abs() <= 1e-6 * iops.max(1.0),
            "{doc:#}"
        );
        assert!(
            total["lat_ns"]["percentile"]["99.990000"].is_u64(),
            "{doc:#}"
        );
    }
    let (r, w) = (
        f(&doc["total"]["read"]["total_ios"]),
        f(&doc["total"]["write"]["total_ios"]),
    );
    assert!(r > w && w > 0.0, "a 70 % read mix: {r} reads, {w} writes");
    assert!(jobs[0]["jobname"].as_str().expect("name").contains("@core"));
    // the reactors polled: CPU time was measured, within what their cores can give
    let cpu = |v: &Value| f(&v["usr_cpu"]) + f(&v["sys_cpu"]);
    let reactors = jobs
        .iter()
        .map(|j| j["core"].as_u64())
        .collect::<std::collections::BTreeSet<_>>()
        .len() as f64;
    assert!(
        cpu(&doc["total"]) > 0.0 && cpu(&doc["total"]) <= 100.0 * reactors * 1.05,
        "{doc:#}"
    );
}

#[test]
fn percentiles_of_a_known_latency_come_out_right() {
    let doc = perf_json(
        "latency",
        &[
            "-r",
            "sim:0,mode=threaded,latency=200us",
            "-c",
            "0",
            "-q",
            "1",
            "-t",
            "1",
            "-L",
        ],
    );
    let lat = &doc["total"]["read"]["lat_ns"];
    let min = lat["min"].as_u64().expect("min");
    let p50 = lat["percentile"]["50.000000"].as_u64().expect("p50");
    assert!(min >= 200_000, "no I/O is faster than the drive: {lat:#}");
    let mean = lat["mean"].as_f64().expect("mean");
    assert!(mean >= 200_000.0, "{lat:#}");
    // Upper bounds would be timing assertions (the simulator's thread wakes late on a busy
    // machine): check the shape instead — the percentiles are ordered and the median and max lie
    // at or above the drive's latency.
    let pct = |k: &str| lat["percentile"][k].as_u64().expect(k);
    let (p90, p99, max) = (
        pct("90.000000"),
        pct("99.000000"),
        lat["max"].as_u64().expect("max"),
    );
    assert!(
        200_000 <= p50 && p50 <= p90 && p90 <= p99 && p99 <= max,
        "{lat:#}"
    );
}

#[test]
fn rate_holds_within_a_few_percent() {
    let doc = perf_json(
        "rate",
        &[
            "-r", "sim:0-1", "-c", "0", "-q", "16", "-t", "2", "--rate", "3000",
        ],
    );
    let iops = f(&doc["total"]["read"]["iops"]);
    // never above the cap (a few percent for the token bucket's start); the lower bound is loose
    // so that a loaded machine does not fail a test about pacing
    assert!(
        (3000.0 * 0.75..=3000.0 * 1.05).contains(&iops),
        "{iops} IOPS"
    );
}

#[test]
fn io_count_stops_after_n_ios_per_device() {
    let doc = perf_json(
        "count",
        &["-r", "sim:0-1", "-c", "0", "-q", "8", "--io-count", "500"],
    );
    for job in doc["jobs"].as_array().expect("jobs") {
        assert_eq!(job["read"]["total_ios"].as_u64(), Some(500), "{job:#}");
    }
}

#[test]
fn warm_up_is_not_counted() {
    let doc = perf_json(
        "warmup",
        &["-r", "sim:0", "-c", "0", "-q", "4", "-t", "1", "-a", "2"],
    );
    // the measured second only: counting the warm-up too would make it three (a busy machine
    // may end the window late, not by 2 s)
    let ms = doc["total"]["elapsed_ms"].as_u64().expect("elapsed");
    assert!((1000..3000).contains(&ms), "measured {ms} ms of a 1 s run");
}

#[test]
fn verify_passes_on_a_ram_drive_and_catches_a_corruption() {
    let args = [
        "-r",
        "sim:0-1,backend=ram,size=4M",
        "-w",
        "randrw",
        "-q",
        "8",
        "-t",
        "1",
        "--verify",
    ];
    let out = usnvme(&args);
    assert!(out.status.success(), "{}", text(&out));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!stderr.contains("checked no block"), "{stderr}");
    let mut bad = args.to_vec();
    bad.extend(["--corrupt-after", "50"]);
    let out = usnvme(&bad);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{}", text(&out));
    assert!(
        stderr.contains("verify: sim:") && stderr.contains("LBA"),
        "{stderr}"
    );
    assert!(String::from_utf8_lossy(&out.stdout).contains("Total"));
}

#[test]
fn two_stripes_of_twelve_run() {
    let doc = perf_json(
        "stripe",
        &[
            "-r", "sim:0-23", "--stripe", "12", "-o", "128k", "-q", "4", "-t", "1",
        ],
    );
    let jobs = doc["jobs"].as_array().expect("jobs");
    let names: Vec<&str> = jobs.iter().filter_map(|j| j["device"].as_str()).collect();
    assert!(
        names.contains(&"stripe0") && names.contains(&"stripe1"),
        "{names:?}"
    );
    assert!(doc["total"]["read"]["total_ios"].as_u64() > Some(0));
}

#[test]
fn sigterm_stops_the_run_and_prints_partial_results() {
    // once perf says it measures (its drives are up), not after a guessed time
    let (child, _) = start_until(
        &["perf", "-r", "sim:0", "-c", "0", "-q", "4", "-t", "30"],
        "measuring for 30 s",
    );
    signal(&child, "TERM");
    let out = child.wait_with_output().expect("usnvme exits");
    assert_eq!(out.status.code(), Some(143), "{}", text(&out));
    assert!(
        String::from_utf8_lossy(&out.stdout).contains("Total"),
        "{}",
        text(&out)
    );
}

#[test]
fn verify_catches_writes_the_simulated_drive_misdirects() {
    let out = usnvme(&[
        "-r",
        "sim:0,backend=ram,size=1M,misdirect=20",
        "-w",
        "randrw",
        "-M",
        "50",
        "-q",
        "4",
        "-o",
        "4k",
        "-t",
        "1",
        "--verify",
    ]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{err}");
    assert!(
        err.contains("usnvme: verify: sim:0: LBA")
            && err.contains("holds the block of byte offset"),
        "{err}"
    );
    // the same run without the fault is clean
    let out = usnvme(&[
        "-r",
        "sim:0,backend=ram,size=1M",
        "-w",
        "randrw",
        "-M",
        "50",
        "-q",
        "4",
        "-o",
        "4k",
        "-t",
        "1",
        "--verify",
    ]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

#[test]
fn verify_on_a_drive_that_keeps_no_data_is_refused_before_any_io() {
    // backend=null reads move no data: each would "mismatch" whatever the buffer held before.
    let out = usnvme(&[
        "-r", "sim:0-23", "-c", "0,1", "-w", "randrw", "-t", "1", "--verify",
    ]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{}", text(&out));
    assert!(
        stderr.contains("--verify")
            && stderr.contains("sim:0-23")
            && stderr.contains("backend=ram"),
        "{stderr}"
    );
    assert_eq!(stderr.trim().lines().count(), 1, "one line: {stderr}");
    assert!(out.stdout.is_empty(), "no I/O, no results: {}", text(&out));
}

#[test]
fn verify_on_healthy_ram_drives_from_two_cores_finds_no_mismatch() {
    let doc = perf_json(
        "healthy",
        &[
            "-r",
            "sim:0-3,backend=ram,size=2M",
            "-c",
            "0,1",
            "-w",
            "randrw",
            "-q",
            "16",
            "-t",
            "1",
            "--verify",
        ],
    );
    // (perf_json asserted exit status 0: no mismatch) and both directions ran on every drive
    for job in doc["jobs"].as_array().expect("jobs") {
        assert!(f(&job["read"]["total_ios"]) > 0.0, "{job:#}");
        assert!(f(&job["write"]["total_ios"]) > 0.0, "{job:#}");
    }
}

/// A randrw --verify run on one RAM drive with the sim options `faults`; exit status and
/// standard error.
fn verify_with_fault(faults: &str, block_size: &str) -> (Option<i32>, String) {
    let device = format!("sim:0,backend=ram,size=1M,bs={block_size},{faults}");
    let out = usnvme(&[
        "-r", &device, "-w", "randrw", "-q", "4", "-o", "8k", "-t", "1", "--verify",
    ]);
    (
        out.status.code(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

#[test]
fn verify_catches_one_byte_flipped_in_the_middle_of_a_block() {
    // The drive flips the middle byte of the first block of every read from the 50th on: past
    // any header, so only a check of the whole block sees it.
    for (bs, middle) in [("512", 256), ("4096", 2048)] {
        let (code, err) = verify_with_fault("corrupt=50", bs);
        assert_eq!(code, Some(1), "bs {bs}: {err}");
        let want =
            format!("1 of {bs} bytes differ from what was written, the first at byte {middle}");
        assert!(
            err.contains("usnvme: verify: sim:0: LBA") && err.contains(&want),
            "bs {bs}: {err}"
        );
    }
}

#[test]
fn verify_reports_a_read_that_brings_no_data_as_such() {
    // From the 50th read on, reads complete successfully without moving any data (QEMU's NVMe
    // on a DMA to an unmapped IOVA): the buffer still holds what the run put there.
    let (code, err) = verify_with_fault("nodata=50", "512");
    assert_eq!(code, Some(1), "{err}");
    assert!(
        err.contains("usnvme: verify: sim:0: LBA")
            && err.contains("read brought no data (buffer still poisoned)"),
        "{err}"
    );
    // not mistaken for stale data: no other kind of mismatch is reported
    assert!(
        !err.contains("holds the block") && !err.contains("differ from what was written"),
        "{err}"
    );
}

/// Starts `usnvme ARGS` and returns it once it has said it is measuring (or, for a sweep, once
/// `ready` appears on its standard error), with the rest of its standard error.
fn start_until(args: &[&str], ready: &str) -> (std::process::Child, String) {
    use std::io::Read;
    let mut child = Command::new(env!("CARGO_BIN_EXE_usnvme"))
        .args(args)
        .env_remove("RUST_LOG")
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("usnvme runs");
    let mut stderr = child.stderr.take().expect("piped");
    let mut seen = String::new();
    let mut byte = [0u8; 1];
    while !seen.contains(ready) {
        match stderr.read(&mut byte) {
            Ok(1) => seen.push(byte[0] as char),
            _ => panic!("usnvme ended before {ready:?}:\n{seen}"),
        }
    }
    // keep draining standard error so that the child never blocks on it (the thread ends with
    // the child)
    std::thread::spawn(move || std::io::copy(&mut stderr, &mut std::io::sink()));
    (child, seen)
}

#[test]
fn a_reset_under_load_aborts_ios_without_corruption_and_io_resumes() {
    // Every command takes 2 ms, so that the reset certainly finds I/O in flight.
    let doc = perf_json(
        "reset",
        &[
            "-r",
            "sim:0-3,backend=ram,size=4M,mode=threaded,latency=2ms",
            "-w",
            "randrw",
            "-q",
            "8",
            "-t",
            "3",
            "--verify",
            "--reset-after",
            "1",
        ],
    );
    let controllers = doc["reset"]["controllers"].as_array().expect("resets");
    assert_eq!(controllers.len(), 4, "{doc:#}");
    assert!(controllers.iter().all(|c| c["ok"] == true), "{doc:#}");
    let jobs = doc["jobs"].as_array().expect("jobs");
    let aborted: u64 = jobs.iter().filter_map(|j| j["aborted_ios"].as_u64()).sum();
    assert!(aborted > 0, "the reset aborted nothing: {doc:#}");
    for job in jobs {
        assert!(
            job["ios_after_reset"].as_u64() > Some(0),
            "no I/O after the reset: {job:#}"
        );
        assert_eq!(job["removed"], false);
        // only aborted I/Os failed
        assert_eq!(job["failed_ios"], job["aborted_ios"], "{job:#}");
    }
    // (perf_json asserted exit status 0: no verify mismatch, no other failure)
}

#[test]
fn a_reset_outside_the_measurement_is_a_usage_error() {
    let out = usnvme(&["-r", "sim:0", "-t", "2", "--reset-after", "2"]);
    assert_eq!(out.status.code(), Some(2), "{}", text(&out));
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("--reset-after 2"),
        "{}",
        text(&out)
    );
}

#[test]
fn a_removed_drive_fails_its_ios_and_the_others_run_to_the_end() {
    let path = json_path("removed");
    let started = std::time::Instant::now();
    let out = usnvme(&[
        "-r",
        "sim:0-3,backend=ram,size=4M",
        "-w",
        "randrw",
        "-q",
        "8",
        "-t",
        "3",
        "--verify",
        "--remove",
        "sim:2@1",
        "--json",
        path.to_str().expect("UTF-8 temp path"),
    ]);
    let took = started.elapsed();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{}", text(&out));
    assert!(
        stderr.contains("usnvme: error: sim:2 removed during the run: ")
            && stderr.contains("the other 3 device(s) ran to the end"),
        "{stderr}"
    );
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        stdout.contains("Total") && stdout.contains("removed during the run (sim:2 is gone)"),
        "{stdout}"
    );
    let doc = take_json(&path);
    for job in doc["jobs"].as_array().expect("jobs") {
        let ios = total_ios(job);
        assert!(ios > 0, "{job:#}");
        if job["device"] == "sim:2" {
            assert_eq!(job["removed"], true, "{job:#}");
            assert!(job["failed_ios"].as_u64() > Some(0), "{job:#}");
        } else {
            assert_eq!(job["removed"], false, "{job:#}");
            assert_eq!(job["failed_ios"], 0, "{job:#}");
            // the others measured the whole 3 s
            assert!(job["elapsed_ms"].as_u64() >= Some(2900), "{job:#}");
        }
    }
    // A hang guard (the run takes 3 s). That the removal, not the queue pairs' own 30 s command
    // timeout, ended the stuck I/Os is what the rows say: removed, not timed out.
    assert!(took < Duration::from_secs(60), "took {took:?}");
}

#[test]
fn a_drive_that_joins_the_run_is_driven_and_verified_from_then_on() {
    // (the debug --add joins a simulated drive as --hotplug joins one bound to vfio-pci)
    let path = json_path("joined");
    // one reactor: every row's window ends at the same turn
    let out = usnvme(&[
        "-r",
        "sim:0-1,backend=ram,size=4M",
        "-c",
        "0",
        "-w",
        "randrw",
        "-q",
        "8",
        "-t",
        "3",
        "--verify",
        "--add",
        "sim:2,backend=ram,size=4M@1",
        "--json",
        path.to_str().expect("UTF-8 temp path"),
    ]);
    assert!(out.status.success(), "{}", text(&out));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("sim:2 joined the run"), "{stderr}");
    let doc = take_json(&path);
    let jobs = doc["jobs"].as_array().expect("jobs");
    let devices: BTreeSet<&str> = jobs.iter().filter_map(|j| j["device"].as_str()).collect();
    assert_eq!(
        devices,
        BTreeSet::from(["sim:0", "sim:1", "sim:2"]),
        "{doc:#}"
    );
    let elapsed = |device: &str| {
        let job = jobs.iter().find(|j| j["device"] == device).expect("a row");
        job["elapsed_ms"].as_u64().expect("elapsed")
    };
    for job in jobs {
        let ios = total_ios(job);
        assert!(ios > 0, "{job:#}");
        assert_eq!(job["failed_ios"], 0, "{job:#}");
        if job["device"] == "sim:2" {
            // measured from when it joined (perf says when: 1 s into the 3, or later on a
            // busy machine), to the end of everyone's window
            let joined = job["joined_ms"].as_u64().expect("when it joined");
            assert!(joined >= 1000, "{job:#}");
            assert!(
                (elapsed("sim:0") - joined).abs_diff(elapsed("sim:2")) <= 1,
                "{doc:#}"
            );
        } else {
            assert!(job.get("joined_ms").is_none(), "{job:#}");
        }
    }
}

#[test]
fn with_interrupts_a_reactor_sleeps_while_its_drives_work_and_the_data_verifies() {
    // each command takes the drive 1 ms: a polling reactor spins through it, this one sleeps
    let doc = perf_json(
        "interrupts",
        &[
            "-r",
            "sim:0-1,backend=ram,size=4M,mode=threaded,latency=1ms",
            "-c",
            "0",
            "-w",
            "randrw",
            "-q",
            "4",
            "-t",
            "2",
            "--verify",
            "--interrupts",
        ],
    );
    for job in doc["jobs"].as_array().expect("jobs") {
        let ios = total_ios(job);
        assert!(ios > 100, "{job:#}");
        assert_eq!(job["failed_ios"], 0, "{job:#}");
        let cpu = job["usr_cpu"].as_f64().expect("usr") + job["sys_cpu"].as_f64().expect("sys");
        assert!(
            cpu < 20.0,
            "the reactor on the CPU {cpu} % of the run: {job:#}"
        );
    }
    // an NVMe/TCP target's queues have no interrupts: refused by name, before any I/O
    let out = usnvme(&["-r", "tcp://127.0.0.1:9/nqn.x:y", "-t", "1", "--interrupts"]);
    assert_eq!(out.status.code(), Some(2), "{}", text(&out));
    assert!(
        String::from_utf8_lossy(&out.stderr)
            .contains("--interrupts: tcp://127.0.0.1:9/nqn.x:y is an NVMe/TCP target"),
        "{}",
        text(&out)
    );
}

#[test]
fn with_interrupts_queue_pairs_share_the_vectors_a_drive_has_too_few_of() {
    // every core of this machine on both drives, each drive with one I/O vector (msix=2: the
    // admin queue's and one more): every reactor's queue pair on a drive wakes on that one
    let doc = perf_json(
        "shared-vectors",
        &[
            "-r",
            "sim:0-1,backend=ram,size=4M,mode=threaded,latency=1ms,msix=2",
            "-w",
            "randrw",
            "-q",
            "4",
            "--io-count",
            "300",
            "--verify",
            "--interrupts",
        ],
    );
    let jobs = doc["jobs"].as_array().expect("jobs");
    let cores: BTreeSet<u64> = jobs.iter().filter_map(|j| j["core"].as_u64()).collect();
    let allowed = std::thread::available_parallelism().map_or(1, |n| n.get());
    assert_eq!(cores.len(), allowed, "every core: {doc:#}");
    for job in jobs {
        assert_eq!(total_ios(job), 300, "{job:#}");
        assert_eq!(job["failed_ios"], 0, "{job:#}");
    }
    assert!(doc["verified_blocks"].as_u64() > Some(0), "{doc:#}");
}

#[test]
fn a_missing_namespace_or_a_region_beyond_capacity_is_refused_before_any_io() {
    let cases: &[(&[&str], &[&str])] = &[
        (
            &["-r", "sim:0-1,ns=2,size=4M", "-n", "3"],
            &[
                "-n 3: sim:0: namespace 3 does not exist",
                "active namespaces: [1, 2]",
            ],
        ),
        (
            &["-r", "sim:0-1,size=4M", "--offset", "8M"],
            &["--offset 8M: beyond the end of sim:0 (4194304 bytes)"],
        ),
        (
            &["-r", "sim:0,size=4M", "--offset", "1M", "--size", "4M"],
            &["--size 4M: past the end of sim:0 (4194304 bytes) from offset 1048576"],
        ),
        (
            &["-r", "sim:0,bs=4096,size=4M", "--offset", "512"],
            &["--offset 512: not a multiple of the 4096-byte block size of sim:0"],
        ),
        (&["-r", "sim:0", "-n", "0"], &["'0' for '--namespace"]),
    ];
    for (args, says) in cases {
        let mut all = args.to_vec();
        all.extend(["-w", "write", "-t", "1"]);
        let out = usnvme(&all);
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{args:?}: {}", text(&out));
        for s in *says {
            assert!(stderr.contains(s), "{args:?} should say {s:?}: {stderr}");
        }
        assert_eq!(stderr.trim().lines().count(), 1, "{args:?}: {stderr}");
        assert!(out.stdout.is_empty(), "{args:?}: no I/O: {}", text(&out));
    }
    // The good cases of the same flags run.
    let doc = perf_json(
        "namespace",
        &[
            "-r",
            "sim:0-1,ns=2,size=4M",
            "-n",
            "2",
            "-c",
            "0",
            "-t",
            "1",
            "-q",
            "4",
        ],
    );
    let names: Vec<&str> = doc["jobs"]
        .as_array()
        .expect("jobs")
        .iter()
        .filter_map(|j| j["device"].as_str())
        .collect();
    assert_eq!(names, ["sim:0/ns2", "sim:1/ns2"]);
    perf_json(
        "region",
        &[
            "-r",
            "sim:0,backend=ram,size=4M",
            "--offset",
            "1M",
            "--size",
            "1M",
            "-w",
            "randrw",
            "--verify",
            "-t",
            "1",
            "-q",
            "4",
        ],
    );
}

#[test]
fn a_second_ctrl_c_exits_at_once_without_waiting_for_the_drives() {
    // Every I/O takes 20 s: a first Ctrl-C waits for those in flight; a second one does not.
    let (child, _) = start_until(
        &[
            "perf",
            "-r",
            "sim:0,mode=threaded,latency=20s",
            "-c",
            "0",
            "-q",
            "2",
            "-t",
            "60",
        ],
        "measuring",
    );
    signal(&child, "INT");
    let second = std::time::Instant::now();
    signal(&child, "INT");
    let out = child.wait_with_output().expect("usnvme exits");
    assert_eq!(out.status.code(), Some(130), "{}", text(&out));
    assert!(
        second.elapsed() < Duration::from_secs(10),
        "exited {:?} after the second Ctrl-C",
        second.elapsed()
    );
    assert!(
        !String::from_utf8_lossy(&out.stdout).contains("Total"),
        "exited at once, before any report: {}",
        text(&out)
    );
}

#[test]
fn ctrl_c_during_a_sweep_keeps_the_points_measured() {
    let dir = std::env::temp_dir().join(format!("usnvme-sweep-int-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    let (child, _) = start_until(
        &[
            "sweep",
            "-r",
            "sim:0",
            "-c",
            "0",
            "-q",
            "4",
            "-t",
            "1",
            "--sizes",
            "4k,8k,16k,32k",
            "--patterns",
            "read",
            "--out",
            dir.to_str().expect("UTF-8 path"),
        ],
        "1/4 points",
    );
    signal(&child, "INT");
    let out = child.wait_with_output().expect("usnvme exits");
    assert_eq!(out.status.code(), Some(130), "{}", text(&out));
    let csv = std::fs::read_to_string(dir.join("sweep.csv")).expect("sweep.csv");
    let points = csv.lines().count() - 1;
    assert!((1..4).contains(&points), "{csv}");
    assert!(
        String::from_utf8_lossy(&out.stdout).contains("block size"),
        "{}",
        text(&out)
    );
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn drives_with_fewer_queues_than_cores_are_served_by_as_many_cores_as_they_granted() {
    // Two cores, drives granting one queue pair each (an SR-IOV function, QEMU max_ioqpairs=1):
    // each is served from one core, spread over both, and the run says so once.
    let doc = perf_json(
        "few-queues",
        &[
            "-r",
            "sim:0-1,queues=1",
            "-r",
            "sim:2",
            "-c",
            "0-1",
            "-t",
            "1",
        ],
    );
    let jobs = doc["jobs"].as_array().expect("jobs");
    let cores_of = |dev: &str| -> Vec<u64> {
        jobs.iter()
            .filter(|j| j["device"] == dev)
            .map(|j| j["core"].as_u64().expect("core"))
            .collect()
    };
    assert_eq!(cores_of("sim:0"), [0], "{doc:#}");
    assert_eq!(cores_of("sim:1"), [1], "{doc:#}");
    assert_eq!(cores_of("sim:2"), [0, 1], "{doc:#}");
    for j in jobs {
        assert!(f(&j["read"]["total_ios"]) > 0.0, "{j:#}");
    }
    let out = usnvme(&["-r", "sim:0,queues=1", "-c", "0-1", "--io-count", "10"]);
    assert!(out.status.success(), "{}", text(&out));
    let said = String::from_utf8_lossy(&out.stderr);
    assert_eq!(
        said.matches("sim:0 granted 1 I/O queue pair(s): served from core(s) 0 only, not 0-1")
            .count(),
        1,
        "{}",
        text(&out)
    );
}

/// perf `--pi` on one RAM drive of format `format` (sim options), then its exit status and
/// standard error.
fn pi_run(format: &str, pi: &str, extra: &[&str]) -> (Option<i32>, String) {
    let device = format!("sim:0,backend=ram,size=2M,{format}");
    let mut args = vec![
        "-r", &device, "--pi", pi, "-w", "randrw", "-q", "4", "-o", "8k", "-t", "1",
    ];
    args.extend_from_slice(extra);
    let out = usnvme(&args);
    (
        out.status.code(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

#[test]
fn pi_in_software_or_by_the_drive_round_trips_with_every_check_on_dif_and_dix_formats() {
    let formats = [
        "ms=8,pi=1,mset=1",                // 512+8 DIF, type 1
        "ms=8,pi=1",                       // 512+8 DIX
        "ms=16,pi=2,pil=1",                // the tuple first in 16 bytes, type 2
        "bs=4096,ms=64,mset=1,pi=3,pif=2", // 4096+64 extended, type 3, 64-bit guard
        "bs=4096,ms=64,pi=3,pif=2",
        "ms=16", // metadata without protection information
    ];
    for format in formats {
        for pi in [
            "PRACT=0,PRCHK=GUARD|REFTAG|APPTAG",
            "PRACT=1,PRCHK=GUARD|REFTAG|APPTAG",
            "pract=0",
        ] {
            let (code, err) = pi_run(format, pi, &["--verify"]);
            assert_eq!(code, Some(0), "{format} {pi}: {err}");
            assert!(!err.contains("checked no block"), "{format} {pi}: {err}");
        }
    }
}

#[test]
fn pi_made_by_perf_catches_a_byte_flipped_on_the_way_and_names_the_block() {
    // the drive's checks pass (the byte flips after them, on the way to the host); perf's own
    // check of the tuple sees the data no longer matches its guard
    let (code, err) = pi_run(
        "ms=8,pi=1,mset=1,corrupt=50",
        "PRACT=0,PRCHK=GUARD|REFTAG|APPTAG",
        &[],
    );
    assert_eq!(code, Some(1), "{err}");
    assert!(
        err.contains("usnvme: verify: sim:0: LBA") && err.contains("protection information: guard"),
        "{err}"
    );
}

#[test]
fn a_namespace_with_metadata_is_left_out_without_pi_and_a_bad_pi_is_a_usage_error() {
    let out = usnvme(&["-r", "sim:0,ms=8,pi=1", "-t", "1"]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{err}");
    assert!(
        err.contains("namespace 1 skipped")
            && err.contains("8 bytes of metadata per block")
            && err.contains("--pi"),
        "{err}"
    );
    for (pi, says) in [
        ("PRACT=2", "PRACT=0|1"),
        ("PRCHK=GUARD", "PRACT is missing"),
        ("PRACT=0,PRCHK=CRC", "expected GUARD, REFTAG or APPTAG"),
    ] {
        let out = usnvme(&["-r", "sim:0,ms=8,pi=1", "-t", "1", "--pi", pi]);
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{pi}: {err}");
        assert!(err.contains(says), "{pi}: {err}");
    }
}

#[test]
fn a_stripe_over_pi_drives_runs_with_the_drive_inserting_pi_and_refuses_metadata_that_travels() {
    let device = "sim:0-1,backend=ram,size=2M,ms=8,pi=1,mset=1";
    let common = [
        "-r", device, "--stripe", "2:16k", "-w", "randrw", "-q", "4", "-o", "32k", "-t", "1",
    ];
    let mut args = common.to_vec();
    args.extend(["--pi", "PRACT=1,PRCHK=GUARD|REFTAG|APPTAG", "--verify"]);
    let out = usnvme(&args);
    assert!(out.status.success(), "{}", text(&out));
    let mut args = common.to_vec();
    args.extend(["--pi", "PRACT=0,PRCHK=GUARD"]);
    let out = usnvme(&args);
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{err}");
    assert!(err.contains("moves metadata with its data"), "{err}");
}
