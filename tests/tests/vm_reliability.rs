//! Reliability on the test bed's drives: one owner per drive, Ctrl-C, a controller reset under
//! load, the removal of a drive under perf (through sysfs, the kernel's own hot-unplug path), and
//! data integrity (perf's verify stamps, checked in the image files by the host after the guest
//! exits). The hot removal of a drive by QEMU is a harness test (`xtask/tests/vm_run.rs`): QMP
//! is on the host.

use std::collections::HashMap;
use std::io::Read;
use std::path::PathBuf;
use std::process::{Child, Command, Output, Stdio};
use std::thread::JoinHandle;
use std::time::Instant;

use serde_json::Value;
use usnvme_tests::{drive_index, expect_stamps_on_host, signal, vfio_controllers, VmBed};

fn text(out: &Output) -> String {
    format!(
        "status {:?}\nstdout:\n{}\nstderr:\n{}",
        out.status.code(),
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    )
}

/// Starts `usnvme ARGS` and returns once it says it is measuring (its drives are attached and
/// locked), with its standard error so far and a thread that collects the rest of it.
fn start_perf(bed: &VmBed, args: &[&str]) -> (Child, String, JoinHandle<String>) {
    let mut child = Command::new(&bed.usnvme)
        .args(args)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap_or_else(|e| panic!("cannot run {}: {e}", bed.usnvme.display()));
    let mut stderr = child.stderr.take().expect("piped");
    let mut seen = Vec::new();
    let mut byte = [0u8; 1];
    while !String::from_utf8_lossy(&seen).contains("measuring") {
        match stderr.read(&mut byte) {
            Ok(1) => seen.push(byte[0]),
            _ => panic!(
                "usnvme {args:?} ended before measuring:\n{}",
                String::from_utf8_lossy(&seen)
            ),
        }
    }
    let rest = std::thread::spawn(move || {
        let mut rest = Vec::new();
        let _ = stderr.read_to_end(&mut rest);
        String::from_utf8_lossy(&rest).into_owned()
    });
    (child, String::from_utf8_lossy(&seen).into_owned(), rest)
}

fn json_file(name: &str) -> PathBuf {
    std::env::temp_dir().join(format!("reliability-{name}.json"))
}

fn read_json(path: &PathBuf) -> Value {
    let data = std::fs::read(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    serde_json::from_slice(&data).expect("JSON")
}

#[test]
#[ignore = "VM: run by `cargo xtask vm-test`"]
fn a_drive_in_use_is_refused_naming_its_owner_until_it_is_released() {
    let bed = VmBed::from_env();
    let drive = vfio_controllers()[0].to_string();
    let (perf, _, _) = start_perf(&bed, &["perf", "-r", &drive, "-q", "1", "-t", "5"]);
    let pid = perf.id();

    let out = bed.usnvme(&["identify", &drive]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{}", text(&out));
    assert!(
        stderr.contains(&format!(
            "{drive} is in use by usnvme PID {pid} (usnvme perf -r {drive}"
        )) && stderr.contains("stop it first"),
        "{stderr}"
    );
    // a second perf is refused the same way, and leaves the first one alone
    let out = bed.usnvme(&["perf", "-r", &drive, "-t", "1"]);
    assert_eq!(out.status.code(), Some(1), "{}", text(&out));
    assert!(
        String::from_utf8_lossy(&out.stderr).contains(&format!("usnvme PID {pid}")),
        "{}",
        text(&out)
    );

    let out = perf.wait_with_output().expect("perf ends");
    assert!(out.status.success(), "the owner ran on: {}", text(&out));
    let out = bed.usnvme(&["identify", &drive]);
    assert!(
        out.status.success(),
        "free once its owner ended: {}",
        text(&out)
    );
}

#[test]
#[ignore = "VM: run by `cargo xtask vm-test`"]
fn ctrl_c_stops_perf_and_a_second_one_exits_at_once_leaving_the_drives_usable() {
    let bed = VmBed::from_env();
    let drives = vfio_controllers();
    let (a, b) = (drives[0].to_string(), drives[1].to_string());
    let args = [
        "perf",
        "-r",
        a.as_str(),
        "-r",
        b.as_str(),
        "-q",
        "4",
        "-t",
        "60",
    ];

    // One Ctrl-C: the partial results, exit 130, the controllers shut down.
    let (perf, _, _) = start_perf(&bed, &args);
    signal(&perf, "INT");
    let out = perf.wait_with_output().expect("perf ends");
    assert_eq!(out.status.code(), Some(130), "{}", text(&out));
    assert!(
        String::from_utf8_lossy(&out.stdout).contains("Total"),
        "{}",
        text(&out)
    );

    // Two: exit 130 at once, without a report; the controllers were disabled on the way out.
    let (perf, _, _) = start_perf(&bed, &args);
    signal(&perf, "INT");
    signal(&perf, "INT");
    let out = perf.wait_with_output().expect("perf ends");
    assert_eq!(out.status.code(), Some(130), "{}", text(&out));

    // Either way the drives come up again for the next owner.
    let out = bed.usnvme(&["identify", &a, &b]);
    assert!(out.status.success(), "{}", text(&out));
}

#[test]
#[ignore = "VM: run by `cargo xtask vm-test`"]
fn a_reset_under_load_loses_no_data_and_io_resumes() {
    let bed = VmBed::from_env();
    let drives = vfio_controllers();
    // two drives of each NUMA node (512-byte and 4 KiB blocks) where there are two nodes
    let picks: Vec<String> = [0, 1, drives.len() / 2, drives.len() / 2 + 1]
        .iter()
        .filter_map(|&i| drives.get(i).map(|d| d.to_string()))
        .collect();
    let path = json_file("reset");
    let mut args: Vec<&str> = vec![
        "perf",
        "-w",
        "randrw",
        "-q",
        "8",
        "-t",
        "6",
        "--verify",
        "--offset",
        "512M",
        "--size",
        "8M",
        "--reset-after",
        "2",
        "--json",
        path.to_str().expect("UTF-8 path"),
    ];
    for d in &picks {
        args.extend(["-r", d.as_str()]);
    }
    let out = bed.usnvme(&args);
    let (stdout, stderr) = (
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr),
    );
    assert_eq!(out.status.code(), Some(0), "{}", text(&out));
    assert!(
        !stderr.contains("verify:") && !stderr.contains("checked no block"),
        "{stderr}"
    );
    assert!(
        stdout.contains(&format!("Reset: {0} of {0} controller(s)", picks.len())),
        "{stdout}"
    );
    let doc = read_json(&path);
    let resets = doc["reset"]["controllers"].as_array().expect("resets");
    assert_eq!(resets.len(), picks.len(), "{doc:#}");
    assert!(resets.iter().all(|r| r["ok"] == true), "{doc:#}");
    for job in doc["jobs"].as_array().expect("jobs") {
        assert!(
            job["ios_after_reset"].as_u64() > Some(0),
            "no I/O after the reset: {job:#}"
        );
        assert_eq!(job["failed_ios"], job["aborted_ios"], "{job:#}");
    }
}

/// Each drive's SMART "Host Write Commands", by PCI address.
fn write_commands(bed: &VmBed) -> HashMap<String, u64> {
    let out = bed.usnvme(&["health", "--json"]);
    assert!(out.status.success(), "{}", text(&out));
    let reports: Vec<Value> = serde_json::from_slice(&out.stdout).expect("JSON");
    reports
        .iter()
        .map(|r| {
            (
                r["address"].as_str().expect("address").to_string(),
                r["host_write_commands"].as_u64().expect("a count"),
            )
        })
        .collect()
}

#[test]
#[ignore = "VM: run by `cargo xtask vm-test`"]
fn a_region_beyond_capacity_or_a_missing_namespace_is_refused_leaving_every_drive_as_it_was() {
    let bed = VmBed::from_env();
    let before = write_commands(&bed);
    assert_eq!(before.len(), bed.drives - bed.kernel_drives);
    let cases: [(&[&str], &str); 2] = [
        (&["--offset", "2G"], "--offset 2G: beyond the end of 0000:"),
        (
            &["-n", "2"],
            "namespace 2 does not exist (active namespaces: [1])",
        ),
    ];
    for (flags, says) in cases {
        let mut args = vec!["perf", "-w", "write", "-t", "1"];
        args.extend_from_slice(flags);
        let out = bed.usnvme(&args);
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{flags:?}: {}", text(&out));
        assert!(stderr.contains(says), "{flags:?}: {stderr}");
        assert!(out.stdout.is_empty(), "{flags:?}: {}", text(&out));
    }
    // not one write reached any drive
    assert_eq!(write_commands(&bed), before);
}

/// Where the integrity test writes on every drive: no suite that runs after this one (by name:
/// vm_tools, then vm_driver, whose own writes the host checks) writes there.
const STAMPED: u64 = 896 << 20;

/// Each drive's image index and block size, by PCI address (from `usnvme identify --json`).
fn drive_map(bed: &VmBed) -> HashMap<String, (usize, u32)> {
    let out = bed.usnvme(&["identify", "--json"]);
    assert!(out.status.success(), "{}", text(&out));
    let controllers: Vec<Value> = serde_json::from_slice(&out.stdout).expect("JSON");
    controllers
        .iter()
        .map(|c| {
            let address = c["address"].as_str().expect("address").to_string();
            let k = drive_index(c["serial"].as_str().expect("serial")).expect("usnvme{k}");
            let bs = c["namespaces"][0]["block_size"]
                .as_u64()
                .expect("block size") as u32;
            (address, (k, bs))
        })
        .collect()
}

/// Runs perf with `args` and `--json`; returns its document (asserting exit 0, no mismatch).
fn perf_verify(bed: &VmBed, name: &str, args: &[&str]) -> Value {
    let path = json_file(name);
    let mut all = vec!["perf", "--verify"];
    all.extend_from_slice(args);
    all.extend(["--json", path.to_str().expect("UTF-8 path")]);
    let out = bed.usnvme(&all);
    assert_eq!(out.status.code(), Some(0), "{name}: {}", text(&out));
    assert!(
        !String::from_utf8_lossy(&out.stderr).contains("checked no block"),
        "{name}: {}",
        text(&out)
    );
    read_json(&path)
}

/// The devices of a perf document and its seed.
fn devices_and_seed(doc: &Value) -> (Vec<String>, u64) {
    let mut devices: Vec<String> = doc["jobs"]
        .as_array()
        .expect("jobs")
        .iter()
        .filter_map(|j| j["device"].as_str().map(str::to_owned))
        .collect();
    devices.sort();
    devices.dedup();
    (devices, doc["options"]["seed"].as_u64().expect("seed"))
}

#[test]
#[ignore = "VM: run by `cargo xtask vm-test`"]
fn verify_runs_of_mixed_sizes_and_patterns_leave_stamps_the_host_checks() {
    let bed = VmBed::from_env();
    let map = drive_map(&bed);
    let started = Instant::now();
    let mb = |m: u64| m << 20;
    let offset = |m: u64| format!("{}", STAMPED + mb(m));

    // A: sequential 64 KiB writes over the whole of [+0, +4M) of every drive (an I/O count of
    // one pass per reactor's share: every block written, at least once).
    let a = perf_verify(
        &bed,
        "stamps-a",
        &[
            "-w",
            "write",
            "-o",
            "64k",
            "-q",
            "4",
            "--offset",
            &offset(0),
            "--size",
            "4M",
            "--io-count",
            "64",
        ],
    );
    // B: 4 KiB random reads and writes (30 % reads) in [+8M, +16M).
    let b = perf_verify(
        &bed,
        "stamps-b",
        &[
            "-w",
            "randrw",
            "-M",
            "30",
            "-o",
            "4k",
            "-q",
            "8",
            "--offset",
            &offset(8),
            "--size",
            "8M",
            "-t",
            "2",
        ],
    );
    // C: 128 KiB random writes in [+16M, +24M).
    let c = perf_verify(
        &bed,
        "stamps-c",
        &[
            "-w",
            "randwrite",
            "-o",
            "128k",
            "-q",
            "4",
            "--offset",
            &offset(16),
            "--size",
            "8M",
            "-t",
            "2",
        ],
    );
    // D: A's blocks read back in the guest (16 KiB reads) and checked against A's seed.
    let seed_a = a["options"]["seed"].as_u64().expect("seed").to_string();
    perf_verify(
        &bed,
        "stamps-d",
        &[
            "--seed",
            &seed_a,
            "-w",
            "read",
            "-o",
            "16k",
            "-q",
            "4",
            "--offset",
            &offset(0),
            "--size",
            "4M",
            "-t",
            "1",
        ],
    );

    for (doc, start, len, all) in [
        (&a, STAMPED, mb(4), true),
        (&b, STAMPED + mb(8), mb(8), false),
        (&c, STAMPED + mb(16), mb(8), false),
    ] {
        let (devices, seed) = devices_and_seed(doc);
        assert_eq!(devices.len(), bed.drives - bed.kernel_drives, "{doc:#}");
        for d in &devices {
            let (k, bs) = *map
                .get(d)
                .unwrap_or_else(|| panic!("{d} is not in `usnvme identify`: {map:?}"));
            expect_stamps_on_host(k, start, len, bs, seed, all);
        }
    }
    eprintln!(
        "four verify runs on {} drives in {:.0?}",
        map.len(),
        started.elapsed()
    );
}
