//! PCIe hot plug in the test bed (`usnvme_tests::hotplug`): a drive vm-run hot-adds at the
//! guest's request appears on the guest's PCI bus and goes again when it is deleted; and
//! `usnvme serve` exports a drive bound to vfio-pci while it runs, to a connected kernel host,
//! and lets it go when it is hot removed while fio runs on the other namespace.

use std::path::Path;
use std::process::Command;
use std::time::Instant;

use usnvme_tests::hotplug::{self, RemoveOnDrop, LIMIT, POLL};
use usnvme_tests::kernel_host::{
    block_bytes, fio_verifies, kernel_namespaces, serve, Connected, FIO,
};
use usnvme_tests::{signal, vfio_controllers, KillOnDrop, VmBed};

/// Waits (bounded) until `done` holds; panics saying `what` did not happen.
fn wait_for(what: &str, done: impl Fn() -> bool) {
    let deadline = Instant::now() + LIMIT;
    while !done() {
        assert!(
            Instant::now() < deadline,
            "{what}: not within {} s",
            LIMIT.as_secs()
        );
        std::thread::sleep(POLL);
    }
}

fn driver_of(dir: &Path) -> Option<String> {
    let link = std::fs::read_link(dir.join("driver")).ok()?;
    Some(link.file_name()?.to_string_lossy().into_owned())
}

/// The state of the kernel nvme controller of the PCI function at `dir` (`live` once up).
fn controller_state(dir: &Path) -> Option<String> {
    let controller = std::fs::read_dir(dir.join("nvme")).ok()?.next()?.ok()?;
    let state = std::fs::read_to_string(controller.path().join("state")).ok()?;
    Some(state.trim().to_string())
}

#[test]
#[ignore = "VM: run by `cargo xtask vm-test`"]
fn a_drive_added_through_qmp_appears_in_the_guest_and_goes_when_deleted() {
    let asked = Instant::now();
    let bdf = hotplug::add_drive(0);
    let added = asked.elapsed();
    let dir = Path::new("/sys/bus/pci/devices").join(&bdf);
    let read = |attr: &str| {
        std::fs::read_to_string(dir.join(attr))
            .unwrap_or_else(|e| panic!("{bdf}: cannot read {attr}: {e}"))
            .trim()
            .to_string()
    };
    assert_eq!(
        (read("vendor"), read("device")),
        ("0x1b36".into(), "0x0010".into()),
        "{bdf} is not QEMU's NVMe controller"
    );
    // Only the kernel's nvme driver matches it, and the bed loads that driver only where some
    // drives stay on it (or a test loaded it): then it takes the new drive, else nothing does.
    let kernel_nvme = Path::new("/sys/bus/pci/drivers/nvme").exists();
    if kernel_nvme {
        wait_for(&format!("{bdf} bound to nvme"), || {
            driver_of(&dir).as_deref() == Some("nvme")
        });
        // and up: its bring-up runs on after the probe, and a removal in the middle of it is a
        // race of the kernel's (one guest oops seen so), not what this test is about
        wait_for(&format!("{bdf}'s nvme controller live"), || {
            controller_state(&dir).as_deref() == Some("live")
        });
    } else {
        assert_eq!(
            driver_of(&dir),
            None,
            "{bdf}: bound with no nvme driver loaded"
        );
    }

    let asked = Instant::now();
    hotplug::remove_drive(0, &bdf);
    wait_for(&format!("{bdf} gone after `hotplug del 0`"), || {
        !dir.exists()
    });
    println!(
        "hot-added drive at {bdf} (driver: {}) after {:.1} s; gone {:.1} s after its removal was asked",
        if kernel_nvme { "nvme" } else { "none" },
        added.as_secs_f64(),
        asked.elapsed().as_secs_f64()
    );
}

/// The subsystem the hot-plug test serves, and its drive from the start.
const SERVE_NQN: &str = "nqn.2024-01.io.usnvme:vm-hotplug";
const SERVE_DRIVE: usize = 6;
/// Where fio works on that drive all along: clear of what the host checks in its image.
const FIO_OFFSET: u64 = 704 << 20;
const FIO_SIZE: u64 = 16 << 20;

/// Commands serve has completed so far, from its `--json-status` file (the kernel's multipath
/// head devices count no I/O of their own).
fn commands_served(status: &Path) -> u64 {
    std::fs::read(status)
        .ok()
        .and_then(|b| serde_json::from_slice::<serde_json::Value>(&b).ok())
        .and_then(|s| s["commands"].as_u64())
        .unwrap_or(0)
}

#[test]
#[ignore = "VM: run by `cargo xtask vm-test`"]
fn serve_exports_a_drive_bound_while_it_runs_and_lets_it_go_when_it_is_removed() {
    let bed = VmBed::from_env();
    let base = vfio_controllers()[SERVE_DRIVE].to_string();
    let status = std::env::temp_dir().join("usnvme-vm-hotplug-status.json");
    let status_arg = status.display().to_string();
    let serve_args = [
        "--hotplug",
        "-c",
        "0",
        "--json-status",
        &status_arg,
        "--json-status-every",
        "0.1",
    ];
    let (target, namespaces) = serve(&bed, SERVE_NQN, &[base], &serve_args);
    let mut target = KillOnDrop(target);
    assert_eq!(namespaces.len(), 1, "{namespaces:?}");
    let _connected = Connected::new(SERVE_NQN, &[]);
    let first = kernel_namespaces(SERVE_NQN, 1)[&1].clone();

    // A drive hot added, then handed to vfio-pci as a user would: serve exports it, and the
    // kernel host, told by a Namespace Attribute Changed event, shows it without reconnecting.
    let bdf = hotplug::add_drive(0);
    let _remove = RemoveOnDrop(0, bdf.clone());
    let bound = bed.usnvme(&["setup", "bind", &bdf]);
    assert!(
        bound.status.success(),
        "{}",
        String::from_utf8_lossy(&bound.stderr)
    );
    let since_bind = Instant::now();
    let devices = kernel_namespaces(SERVE_NQN, 2);
    println!(
        "{bdf}: namespace 2 on the kernel host {:.1} s after the bind",
        since_bind.elapsed().as_secs_f64()
    );
    let new = devices[&2].clone();
    assert_eq!(block_bytes(&new), 256 << 20, "{}", new.display());
    fio_verifies(&new, "16m");

    // fio verifying on namespace 1 all along while the new drive goes
    let report = std::env::temp_dir().join("usnvme-vm-hotplug-fio.json");
    let fio = Command::new(FIO)
        .args([
            "--thread", // one process: killed whole if the test fails
            "--name=first",
            &format!("--filename={}", first.display()),
            "--ioengine=io_uring",
            "--direct=1",
            "--rw=randwrite",
            "--bs=4k",
            &format!("--offset={FIO_OFFSET}"),
            &format!("--size={FIO_SIZE}"),
            "--iodepth=4",
            "--verify=crc32c",
            "--verify_backlog=32",
            "--verify_fatal=1",
            "--verify_state_save=0",
            "--time_based",
            "--runtime=600",
            "--output-format=json",
            &format!("--output={}", report.display()),
        ])
        .spawn()
        .expect("fio runs");
    let fio = KillOnDrop(fio);
    let before = commands_served(&status);
    wait_for("fio writing to namespace 1", || {
        commands_served(&status) > before + 100
    });
    let asked = Instant::now();
    hotplug::remove_drive(0, &bdf);
    kernel_namespaces(SERVE_NQN, 1);
    println!(
        "{bdf}: namespace 2 gone from the kernel host {:.1} s after its removal was asked",
        asked.elapsed().as_secs_f64()
    );
    let served = commands_served(&status);
    wait_for("fio writing on to namespace 1", || {
        commands_served(&status) > served + 100
    });
    let mut fio = fio;
    signal(&fio.0, "INT");
    let status = fio.0.wait().expect("fio ends");
    let text =
        std::fs::read_to_string(&report).unwrap_or_else(|e| panic!("fio's report: {e} ({status})"));
    // (a fio stopped by a signal says so above its JSON)
    let json = text.find('{').map_or("", |at| &text[at..]);
    let report: serde_json::Value = serde_json::from_str(json)
        .unwrap_or_else(|e| panic!("fio's JSON report: {e} ({status}): {text}"));
    let job = &report["jobs"][0];
    assert_eq!(job["error"], 0, "fio on namespace 1: {job:#}");
    assert!(job["write"]["io_bytes"].as_u64() > Some(0), "{job:#}");
    // the same drive again, in the same slot: the same namespace ID and NGUID, a new device
    let again = hotplug::add_drive(0);
    assert_eq!(again, bdf);
    let bound = bed.usnvme(&["setup", "bind", &bdf]);
    assert!(
        bound.status.success(),
        "{}",
        String::from_utf8_lossy(&bound.stderr)
    );
    let devices = kernel_namespaces(SERVE_NQN, 2);
    fio_verifies(&devices[&2], "4m");
    hotplug::remove_drive(0, &bdf);
    kernel_namespaces(SERVE_NQN, 1);
    // serve runs on, and stops cleanly
    assert!(
        target.0.try_wait().expect("serve's status").is_none(),
        "serve ended"
    );
    drop(_connected);
    signal(&target.0, "INT");
    assert_eq!(target.0.wait().expect("serve ends").code(), Some(130));
}

/// The drive `perf --hotplug` starts on, and where it writes there and on the drive that joins.
const PERF_DRIVE: usize = 8;
const PERF_OFFSET: &str = "200M";
const PERF_SIZE: &str = "8M";

#[test]
#[ignore = "VM: run by `cargo xtask vm-test`"]
fn perf_hotplug_drives_a_drive_bound_while_it_runs() {
    let bed = VmBed::from_env();
    let base = vfio_controllers()[PERF_DRIVE].to_string();
    let json = std::env::temp_dir().join("usnvme-vm-perf-hotplug.json");
    let json_arg = json.display().to_string();
    let mut perf = Command::new(&bed.usnvme)
        .args([
            "perf",
            "-r",
            &base,
            "--hotplug",
            "-c",
            "0",
            "-w",
            "write",
            "-o",
            "4k",
            "-q",
            "8",
            "-t",
            "20",
            "--verify",
            "--offset",
            PERF_OFFSET,
            "--size",
            PERF_SIZE,
            "--json",
            &json_arg,
        ])
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("usnvme perf runs");
    let stderr = perf.stderr.take().expect("piped");
    let (lines, said) = std::sync::mpsc::channel::<String>();
    std::thread::spawn(move || {
        for line in std::io::BufRead::lines(std::io::BufReader::new(stderr)).map_while(Result::ok) {
            eprintln!("{line}");
            let _ = lines.send(line);
        }
    });
    let mut perf = KillOnDrop(perf);
    let wait_for_line = |what: &str| {
        let deadline = Instant::now() + LIMIT;
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            match said.recv_timeout(left) {
                Ok(line) if line.contains(what) => return line,
                Ok(_) => {}
                Err(e) => panic!("perf never said {what:?} ({e})"),
            }
        }
    };
    wait_for_line("measuring for");
    let bdf = hotplug::add_drive(1);
    let _remove = RemoveOnDrop(1, bdf.clone());
    let bound = bed.usnvme(&["setup", "bind", &bdf]);
    assert!(
        bound.status.success(),
        "{}",
        String::from_utf8_lossy(&bound.stderr)
    );
    let joined = wait_for_line("joined the run");
    assert!(joined.contains(&bdf), "{joined}");
    let status = perf.0.wait().expect("perf ends");
    assert!(status.success(), "perf: {status} (its report is above)");
    let doc: serde_json::Value =
        serde_json::from_slice(&std::fs::read(&json).expect("perf's JSON")).expect("JSON");
    let jobs = doc["jobs"].as_array().expect("jobs");
    for device in [&base, &bdf] {
        let job = jobs
            .iter()
            .find(|j| j["device"].as_str() == Some(device.as_str()))
            .unwrap_or_else(|| panic!("no job on {device}: {doc:#}"));
        assert!(job["write"]["total_ios"].as_u64() > Some(0), "{job:#}");
        assert_eq!(job["failed_ios"], 0, "{job:#}");
    }
}
