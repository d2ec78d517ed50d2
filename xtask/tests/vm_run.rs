//! The VM harness's own tests: each boots a guest. Run by `cargo xtask vm-test`, which builds the
//! programs they run first (`usnvme`, `vm-probe`).

use std::io::{BufRead, BufReader};
use std::path::PathBuf;
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

fn target_dir() -> PathBuf {
    std::env::var_os("CARGO_TARGET_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../target"))
}

/// A program built by `cargo xtask vm-test` before these tests run.
fn program(name: &str) -> String {
    let p = target_dir().join("debug").join(name);
    assert!(
        p.exists(),
        "{} is missing: run these tests through `cargo xtask vm-test`",
        p.display()
    );
    p.display().to_string()
}

/// `cargo xtask vm-run OPTIONS -- PROGRAM...`. QEMU itself crashing under TCG (a segfault or
/// an assertion of its own, not the guest's doing) is the emulator's failure, not the test's:
/// such a run is tried once more, as `vm-test` does with the guest suites.
fn vm_run(options: &[&str], program_and_args: &[&str]) -> Output {
    let run = || {
        Command::new(env!("CARGO_BIN_EXE_xtask"))
            .arg("vm-run")
            .args(options)
            .arg("--")
            .args(program_and_args)
            .output()
            .expect("xtask runs")
    };
    let out = run();
    let qemu_crashed = text(&out.stderr).contains("without reporting an exit code (QEMU signal");
    if !qemu_crashed {
        return out;
    }
    eprintln!(
        "QEMU crashed under the run (not the program): once more\n{}",
        text(&out.stderr)
    );
    run()
}

fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

#[test]
#[ignore = "boots QEMU: run by `cargo xtask vm-test`"]
fn exit_codes_come_back_exactly() {
    let probe = program("vm-probe");
    for (args, code, says) in [
        (&["exit", "0"][..], 0, "exiting with 0"),
        (&["exit", "1"][..], 1, "exiting with 1"),
        (&["panic"][..], 101, "panicking on purpose"),
    ] {
        let mut cmd = vec![probe.as_str()];
        cmd.extend_from_slice(args);
        let out = vm_run(&["--drives", "1"], &cmd);
        let (stdout, stderr) = (text(&out.stdout), text(&out.stderr));
        assert_eq!(
            out.status.code(),
            Some(code),
            "{args:?}\nstdout:\n{stdout}\nstderr:\n{stderr}"
        );
        assert!(
            stdout.contains(says),
            "{args:?}: program output missing:\n{stdout}"
        );
        assert!(
            !stdout.contains("USNVME-VM:"),
            "harness lines leak into the output:\n{stdout}"
        );
    }
}

#[test]
#[ignore = "boots QEMU: run by `cargo xtask vm-test`"]
fn a_guest_kernel_panic_is_reported_not_hung() {
    let out = vm_run(
        &["--drives", "1", "--timeout", "120"],
        &[&program("vm-probe"), "kernel-panic"],
    );
    let stderr = text(&out.stderr);
    assert_eq!(out.status.code(), Some(125), "stderr:\n{stderr}");
    assert!(stderr.contains("kernel panicked"), "stderr:\n{stderr}");
}

#[test]
#[ignore = "boots QEMU: run by `cargo xtask vm-test`"]
fn output_is_streamed_while_the_program_runs() {
    let mut child = Command::new(env!("CARGO_BIN_EXE_xtask"))
        .args(["vm-run", "--drives", "1", "--"])
        .args([&program("vm-probe"), "stream"])
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .expect("xtask runs");
    let stdout = child.stdout.take().expect("piped");
    let mut lines = BufReader::new(stdout).lines();
    let first = lines.find_map(|l| l.ok().filter(|l| l.contains("first line")));
    assert!(first.is_some(), "the first line never came");
    // The probe sleeps 3 s before its second line: vm-run must still be running now.
    assert!(
        child.try_wait().expect("wait").is_none(),
        "the first line arrived only after the run ended"
    );
    assert!(lines.any(|l| l.is_ok_and(|l| l.contains("second line"))));
    assert!(child.wait().expect("wait").success());
}

#[test]
#[ignore = "boots QEMU: run by `cargo xtask vm-test`"]
fn a_timeout_kills_its_own_qemu_and_nothing_else() {
    let started = Instant::now();
    let out = vm_run(
        &["--drives", "1", "--timeout", "25"],
        &["/bin/sleep", "600"],
    );
    let stderr = text(&out.stderr);
    assert_eq!(out.status.code(), Some(124), "stderr:\n{stderr}");
    assert!(started.elapsed() < Duration::from_secs(120));
    let pid: u32 = stderr
        .split("qemu pid ")
        .nth(1)
        .and_then(|s| s.split_whitespace().next())
        .and_then(|p| p.parse().ok())
        .expect("vm-run names its QEMU's pid");
    assert!(
        !PathBuf::from(format!("/proc/{pid}")).exists(),
        "QEMU {pid} is still there"
    );
    assert!(
        stderr.contains(&format!("QEMU (pid {pid}) killed")),
        "stderr:\n{stderr}"
    );
}

#[test]
#[ignore = "boots QEMU: run by `cargo xtask vm-test`"]
fn an_idle_guest_is_taken_for_hung_after_it_dumps_its_tasks_but_a_busy_one_is_not() {
    // 30 s of work (longer than --hang-after), then asleep for good.
    let program = "end=$(($(date +%s)+30)); while [ $(date +%s) -lt $end ]; do :; done; \
                   echo busy-done; exec sleep 600";
    let out = vm_run(
        &["--drives", "1", "--hang-after", "15", "--timeout", "400"],
        &["/bin/sh", "-c", program],
    );
    let (stdout, stderr) = (text(&out.stdout), text(&out.stderr));
    assert_eq!(
        out.status.code(),
        Some(122),
        "stdout:\n{stdout}\nstderr:\n{stderr}"
    );
    assert!(
        stdout.contains("busy-done"),
        "the busy guest was taken for hung:\n{stdout}\n{stderr}"
    );
    // the guest's kernel answered the SysRq keys on the console
    for dump in ["sysrq: Show Blocked State", "sysrq: Show State"] {
        assert!(stdout.contains(dump), "no {dump:?}:\n{stdout}\n{stderr}");
    }
    assert!(stderr.contains("HLT=1"), "the vCPUs' state: {stderr}");
    assert!(stderr.contains("the guest hung"), "{stderr}");
}

#[test]
#[ignore = "boots QEMU: run by `cargo xtask vm-test`"]
fn a_dma_fault_fails_the_run_and_names_the_device() {
    let probe = program("vm-probe");
    let out = vm_run(&["--drives", "2"], &[&probe, "dma-fault", "0000:01:00.0"]);
    let (stdout, stderr) = (text(&out.stdout), text(&out.stderr));
    assert!(
        stdout.contains("fetched from unmapped IOVA"),
        "the probe did not run:\n{stdout}\n{stderr}"
    );
    assert_eq!(out.status.code(), Some(123), "stderr:\n{stderr}");
    assert!(stderr.contains("DMA fault"), "stderr:\n{stderr}");
    assert!(
        stderr.contains("device 0000:01:00.0"),
        "the faulting device is not named:\n{stderr}"
    );

    let out = vm_run(
        &["--drives", "1", "--allow-dma-faults"],
        &[&probe, "dma-fault"],
    );
    assert_eq!(out.status.code(), Some(0), "stderr:\n{}", text(&out.stderr));
    assert!(
        text(&out.stderr).contains("DMA fault"),
        "still reported when allowed"
    );
}

fn list_json(out: &Output) -> Vec<serde_json::Value> {
    let stdout = text(&out.stdout);
    assert_eq!(
        out.status.code(),
        Some(0),
        "stdout:\n{stdout}\nstderr:\n{}",
        text(&out.stderr)
    );
    let start = stdout.find('[').expect("a JSON array");
    serde_json::from_str::<Vec<serde_json::Value>>(&stdout[start..]).expect("valid JSON")
}

#[test]
#[ignore = "boots QEMU: run by `cargo xtask vm-test`"]
fn two_numa_nodes_put_twelve_drives_on_each() {
    let out = vm_run(
        &["--drives", "24", "--numa-nodes", "2"],
        &[&program("usnvme"), "list", "--json"],
    );
    let controllers = list_json(&out);
    assert_eq!(controllers.len(), 24);
    let on = |node: u64| {
        controllers
            .iter()
            .filter(|c| c["numa_node"] == node)
            .count()
    };
    assert_eq!((on(0), on(1)), (12, 12), "{controllers:#?}");
    assert!(controllers.iter().all(|c| c["driver"] == "vfio-pci"));
}

#[test]
#[ignore = "boots QEMU: run by `cargo xtask vm-test`"]
fn kernel_nvme_leaves_the_first_drives_on_the_kernel_driver() {
    let out = vm_run(
        &["--drives", "4", "--kernel-nvme", "2"],
        &[&program("usnvme"), "list", "--json"],
    );
    let controllers = list_json(&out);
    assert_eq!(controllers.len(), 4);
    for (i, c) in controllers.iter().enumerate() {
        if i < 2 {
            assert_eq!(c["driver"], "nvme", "{c:#}");
            let blocks = c["block_devices"].as_array().expect("block devices");
            assert_eq!(blocks.len(), 1, "{c:#}");
            assert!(
                blocks[0]["name"]
                    .as_str()
                    .is_some_and(|n| n.starts_with("nvme")),
                "{c:#}"
            );
        } else {
            assert_eq!(c["driver"], "vfio-pci", "{c:#}");
        }
    }
}

#[test]
#[ignore = "boots QEMU: run by `cargo xtask vm-test`"]
fn namespaces_with_metadata_are_made_seen_and_left_out_by_name() {
    let usnvme = program("usnvme");
    let script = format!(
        "{usnvme} identify --json && echo '=== perf' && {usnvme} perf -q 4 -o 4k -w randread -t 1"
    );
    let out = vm_run(
        &[
            "--drives",
            "2",
            "--ns",
            "bs=512",
            "--ns",
            "bs=4096,ms=8,pi=1,size=64M",
        ],
        &["/bin/sh", "-c", &script],
    );
    let (stdout, stderr) = (text(&out.stdout), text(&out.stderr));
    assert_eq!(out.status.code(), Some(0), "{stdout}\n{stderr}");
    let (identify, perf) = stdout.split_once("=== perf").expect("both ran");
    let controllers: Vec<serde_json::Value> = serde_json::from_str(identify).expect("JSON");
    assert_eq!(controllers.len(), 2);
    for c in &controllers {
        let ns: Vec<(u64, u64, u64)> = c["namespaces"]
            .as_array()
            .expect("namespaces")
            .iter()
            .map(|n| {
                let num = |k: &str| n[k].as_u64().unwrap_or(0);
                (num("nsid"), num("block_size"), num("metadata_size"))
            })
            .collect();
        assert_eq!(ns, [(1, 512, 0), (2, 4096, 8)], "{c:#}");
    }
    // perf runs on the plain namespaces and names the ones it leaves out
    assert!(perf.contains("2 device(s)"), "{perf}\n{stderr}");
    // (the guest's standard error reaches vm-run's standard output)
    assert_eq!(
        perf.matches("namespace 2 is formatted with 8 bytes of metadata per block")
            .count(),
        2,
        "{perf}"
    );
}

/// The lines vm-run streams up to perf's `measuring` line, which must come.
fn until_measuring(
    stdout: &mut std::io::Lines<BufReader<std::process::ChildStdout>>,
    measuring: &str,
) -> Vec<String> {
    let mut seen = Vec::new();
    for line in stdout.by_ref().map_while(Result::ok) {
        let started = line.contains(measuring);
        seen.push(line);
        if started {
            return seen;
        }
    }
    panic!("perf never started:\n{}", seen.join("\n"));
}

/// Sends QMP commands on `socket` (retrying the connect while QEMU starts) and returns the replies.
fn qmp(socket: &std::path::Path, commands: &[serde_json::Value]) -> Vec<serde_json::Value> {
    use std::io::Write;
    let deadline = Instant::now() + Duration::from_secs(60);
    let stream = loop {
        match std::os::unix::net::UnixStream::connect(socket) {
            Ok(s) => break s,
            Err(e) if Instant::now() > deadline => {
                panic!("no QMP socket at {}: {e}", socket.display())
            }
            Err(_) => std::thread::sleep(Duration::from_millis(100)),
        }
    };
    let mut reader = BufReader::new(stream.try_clone().expect("clone"));
    let mut writer = stream;
    let mut read = || {
        let mut line = String::new();
        reader.read_line(&mut line).expect("QMP reply");
        serde_json::from_str::<serde_json::Value>(&line).expect("QMP JSON")
    };
    assert!(read().get("QMP").is_some(), "QMP greeting");
    let mut replies = Vec::new();
    for c in std::iter::once(&serde_json::json!({"execute": "qmp_capabilities"})).chain(commands) {
        writeln!(writer, "{c}").expect("QMP write");
        // skip asynchronous events until the command's own reply
        let reply = loop {
            let r = read();
            if r.get("event").is_none() {
                break r;
            }
        };
        replies.push(reply);
    }
    replies
}

#[test]
#[ignore = "boots QEMU: run by `cargo xtask vm-test`"]
fn the_qmp_socket_hot_removes_a_drive_from_the_running_guest() {
    let socket = std::env::temp_dir().join(format!("usnvme-qmp-{}.sock", std::process::id()));
    // The guest program waits (bounded) until only one controller is left on vfio-pci.
    let wait_for_removal = "for i in $(seq 600); do \
        [ $(ls /sys/bus/pci/drivers/vfio-pci | grep -c :) = 1 ] && { echo removed; exit 0; }; sleep 0.1; done; exit 1";
    let mut child = Command::new(env!("CARGO_BIN_EXE_xtask"))
        .args(["vm-run", "--drives", "2", "--qmp"])
        .arg(&socket)
        .args(["--", "/bin/sh", "-c", wait_for_removal])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("xtask runs");
    // Remove only once the guest has bound both drives: before its PCIe hotplug driver runs, the
    // request is lost.
    let mut stderr = BufReader::new(child.stderr.take().expect("piped")).lines();
    let bound = stderr
        .by_ref()
        .map_while(Result::ok)
        .any(|l| l.contains("drives bound to vfio-pci"));
    assert!(bound, "the guest never bound its drives");
    let replies = qmp(
        &socket,
        &[serde_json::json!({"execute": "device_del", "arguments": {"id": "nvme1"}})],
    );
    assert!(
        replies.iter().all(|r| r.get("return").is_some()),
        "{replies:?}"
    );
    let rest: Vec<String> = stderr.map_while(Result::ok).collect();
    let out = child.wait_with_output().expect("wait");
    assert_eq!(out.status.code(), Some(0), "stderr:\n{}", rest.join("\n"));
    assert!(text(&out.stdout).contains("removed"));
    let _ = std::fs::remove_file(&socket);
}

#[test]
#[ignore = "VM: run by `cargo xtask vm-test`"]
fn a_smart_warning_raised_on_qemus_drive_reaches_perf_as_an_asynchronous_event() {
    let pid = std::process::id();
    let socket = std::env::temp_dir().join(format!("usnvme-qmp-event-{pid}.sock"));
    let guest = format!("{} perf -q 1 -t 20", program("usnvme"));
    let mut child = Command::new(env!("CARGO_BIN_EXE_xtask"))
        .args(["vm-run", "--drives", "1", "--timeout", "600", "--qmp"])
        .arg(&socket)
        .args(["--", "/bin/sh", "-c", &guest])
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .expect("xtask runs");
    let mut stdout = BufReader::new(child.stdout.take().expect("piped")).lines();
    let mut seen = until_measuring(&mut stdout, "measuring for 20 s");
    // QEMU raises a temperature warning (its SMART critical warning bit 1) as an event
    let replies = qmp(
        &socket,
        &[serde_json::json!({"execute": "qom-set", "arguments":
            {"path": "/machine/peripheral/nvme0", "property": "smart_critical_warning", "value": 2}})],
    );
    assert!(
        replies.iter().all(|r| r.get("return").is_some()),
        "{replies:?}"
    );
    seen.extend(stdout.map_while(Result::ok));
    let status = child.wait().expect("vm-run ends");
    let _ = std::fs::remove_file(&socket);
    let stdout = seen.join("\n");
    assert_eq!(status.code(), Some(0), "{stdout}");
    assert!(
        stdout.contains("asynchronous event: SMART / health: temperature threshold"),
        "{stdout}"
    );
}

#[test]
#[ignore = "boots QEMU: run by `cargo xtask vm-test`"]
fn a_drive_hot_removed_under_perf_fails_alone_and_the_report_names_it() {
    let pid = std::process::id();
    let socket = std::env::temp_dir().join(format!("usnvme-qmp-removal-{pid}.sock"));
    // the work folder is shared read-write with the guest at the same path
    let json = target_dir().join(format!("vm/work/hot-removal-{pid}.json"));
    let _ = std::fs::remove_file(&json);
    // In the guest: perf in the background; once a drive has left vfio-pci (perf gave its
    // device back), perf's open files, until no deleted group file is among them or 10 s.
    // perf runs a minute: on a loaded host the removal alone has taken most of 20 s, and perf's
    // files listed as it ended were those of its shutdown, not of its run.
    let guest = format!(
        r#"{usnvme} perf -q 4 -t 60 --json {json} & perf=$!
bound() {{ ls /sys/bus/pci/drivers/vfio-pci | grep -c : ; }}
drives=$(bound)
while [ "$(bound)" -ge "$drives" ] && kill -0 $perf 2>/dev/null; do sleep 0.2; done
files() {{ for f in /proc/$perf/fd/*; do readlink "$f"; done; }}
i=0
while files | grep -q deleted && [ $i -lt 50 ]; do sleep 0.2; i=$((i+1)); done
files | sed 's/^/perf holds: /'
kill -0 $perf 2>/dev/null && echo "perf was still running"
wait $perf"#,
        usnvme = program("usnvme"),
        json = json.display(),
    );
    let started = Instant::now();
    let mut child = Command::new(env!("CARGO_BIN_EXE_xtask"))
        .args(["vm-run", "--drives", "24", "--timeout", "900", "--qmp"])
        .arg(&socket)
        .args(["--", "/bin/sh", "-c", &guest])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("xtask runs");
    let stderr = child.stderr.take().expect("piped");
    let stderr = std::thread::spawn(move || {
        BufReader::new(stderr)
            .lines()
            .map_while(Result::ok)
            .collect::<Vec<_>>()
    });
    // perf says when its 24 drives are attached and the measurement starts: from then on every
    // drive has I/O in flight (QD 4), and the drive goes with some of it
    let mut stdout = BufReader::new(child.stdout.take().expect("piped")).lines();
    let mut seen = until_measuring(&mut stdout, "measuring for 60 s");
    let replies = qmp(
        &socket,
        &[serde_json::json!({"execute": "device_del", "arguments": {"id": "nvme5"}})],
    );
    assert!(
        replies.iter().all(|r| r.get("return").is_some()),
        "{replies:?}"
    );
    seen.extend(stdout.map_while(Result::ok));
    let status = child.wait().expect("vm-run ends");
    let stdout = seen.join("\n");
    let stderr = stderr.join().unwrap_or_default().join("\n");
    let _ = std::fs::remove_file(&socket);
    // perf's convention: a drive lost during the run fails the run (exit 1), after the report
    assert_eq!(
        status.code(),
        Some(1),
        "stdout:\n{stdout}\nstderr:\n{stderr}"
    );
    assert!(
        started.elapsed() < Duration::from_secs(600),
        "took {:?}",
        started.elapsed()
    );
    let doc: serde_json::Value = serde_json::from_slice(
        &std::fs::read(&json).unwrap_or_else(|e| panic!("{}: {e}\n{stdout}", json.display())),
    )
    .expect("perf's JSON");
    let _ = std::fs::remove_file(&json);
    let jobs = doc["jobs"].as_array().expect("jobs");
    let removed: Vec<&str> = jobs
        .iter()
        .filter(|j| j["removed"] == true)
        .filter_map(|j| j["device"].as_str())
        .collect();
    assert!(
        !removed.is_empty() && removed.iter().all(|d| *d == removed[0]),
        "one drive removed: {removed:?}\n{stdout}"
    );
    let gone = removed[0];
    let failed: u64 = jobs
        .iter()
        .filter(|j| j["device"] == gone)
        .filter_map(|j| j["failed_ios"].as_u64())
        .sum();
    eprintln!(
        "hot removal: {gone} removed under perf on 24 drives: {failed} I/O(s) failed; vm-run took {:.0?}",
        started.elapsed()
    );
    for job in jobs {
        let ios = job["read"]["total_ios"].as_u64().unwrap_or(0);
        if job["device"] == gone {
            assert!(job["failed_ios"].as_u64() > Some(0), "{job:#}");
        } else {
            assert!(ios > 0 && job["failed_ios"] == 0, "{job:#}");
        }
    }
    let devices: std::collections::BTreeSet<&str> =
        jobs.iter().filter_map(|j| j["device"].as_str()).collect();
    assert_eq!(devices.len(), 24, "{stdout}");
    assert!(
        stdout.contains(&format!("usnvme: error: {gone} removed during the run: "))
            && stdout.contains("the other 23 device(s) ran to the end"),
        "{stdout}"
    );
    assert!(
        stdout.contains(&format!("removed during the run ({gone} is gone)")),
        "the report names it: {stdout}"
    );
    // perf let go of the removed drive whole (its device file, which the removal waits for, and
    // its group's file, whose node the kernel deleted) and kept the other 23 and its container.
    let held: Vec<&str> = stdout
        .lines()
        .filter_map(|l| l.strip_prefix("perf holds: "))
        .collect();
    let devices = held
        .iter()
        .filter(|f| **f == "anon_inode:[vfio-device]")
        .count();
    assert!(
        stdout.contains("perf was still running"),
        "perf's files were listed after its run (the removal took too long): {stdout}"
    );
    assert!(
        devices == 23
            && held.contains(&"/dev/vfio/vfio")
            && !held
                .iter()
                .any(|f| f.starts_with("/dev/vfio/") && f.ends_with("(deleted)")),
        "perf should hold its container and 23 device files, nothing of {gone}: {held:?}"
    );
    // a panic; vfio-ioctls' error when a group does not leave the container; an unmap failure
    for bad in ["panicked", "Could not unbind", "leaking"] {
        assert!(
            !stderr.contains(bad) && !stdout.contains(bad),
            "{bad:?} in:\n{stdout}\n{stderr}"
        );
    }
}

/// A built tree somewhere else, removed when dropped (symlinks are removed, not followed).
struct Tree(PathBuf);

impl Drop for Tree {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// What a clone under /tmp that was built and set up holds, as far as vm-run needs it: the
/// manifests, `target/debug/{xtask,vm-probe}` and `target/vm` (the big assets as symlinks to
/// ours, which setup has already made current).
fn copy_of_the_built_tree(root: &std::path::Path) -> Tree {
    let tree = Tree(root.to_path_buf());
    let _ = std::fs::remove_dir_all(root);
    let src = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("..");
    let copy = |from: PathBuf, to: PathBuf| {
        if let Some(dir) = to.parent() {
            std::fs::create_dir_all(dir).expect("mkdir");
        }
        std::fs::copy(&from, &to).unwrap_or_else(|e| panic!("{}: {e}", from.display()));
    };
    copy(src.join("Cargo.toml"), root.join("Cargo.toml"));
    copy(src.join("xtask/Cargo.toml"), root.join("xtask/Cargo.toml"));
    let debug = root.join("target/debug");
    copy(env!("CARGO_BIN_EXE_xtask").into(), debug.join("xtask"));
    copy(program("vm-probe").into(), debug.join("vm-probe"));
    let vm = root.join("target/vm");
    std::fs::create_dir_all(&vm).expect("mkdir");
    for entry in std::fs::read_dir(target_dir().join("vm")).expect("target/vm: run vm-setup") {
        let entry = entry.expect("dir entry");
        let name = entry.file_name();
        let name_str = name.to_string_lossy();
        if name_str.ends_with(".from") {
            // stamps are written, not only read: a copy of their own
            copy(entry.path(), vm.join(&name));
        } else if ["cache", "kernel", "vmlinux", "initramfs.cpio.gz"].contains(&&*name_str) {
            std::os::unix::fs::symlink(entry.path(), vm.join(&name)).expect("symlink");
        }
    }
    tree
}

#[test]
#[ignore = "boots QEMU: run by `cargo xtask vm-test`"]
fn a_built_tree_copied_under_tmp_runs_its_own_programs() {
    // The guest mounts its own tmpfs on /tmp; the copied xtask was compiled for our path.
    let tree = copy_of_the_built_tree(&PathBuf::from(format!(
        "/tmp/usnvme-copied-tree-{}",
        std::process::id()
    )));
    let root = &tree.0;
    let probe = root.join("target/debug/vm-probe");
    let out = Command::new(root.join("target/debug/xtask"))
        .args(["vm-run", "--drives", "1", "--"])
        .arg(&probe)
        .args(["exit", "0"])
        .current_dir(root)
        // as when run from the copy by hand (cargo would set them for the copy)
        .env_remove("CARGO_MANIFEST_DIR")
        .env_remove("CARGO_TARGET_DIR")
        .output()
        .expect("the copied xtask runs");
    let (stdout, stderr) = (text(&out.stdout), text(&out.stderr));
    assert_eq!(
        out.status.code(),
        Some(0),
        "stdout:\n{stdout}\nstderr:\n{stderr}"
    );
    assert!(stdout.contains("exiting with 0"), "stdout:\n{stdout}");
    assert!(
        root.join("target/vm/work").is_dir(),
        "the copy's own work share was not used:\n{stderr}"
    );
    assert!(!stderr.contains("error"), "stderr:\n{stderr}");
}

#[test]
#[ignore = "boots QEMU: run by `cargo xtask vm-test`"]
fn perf_in_the_guest_draws_no_live_progress() {
    // The guest console is a terminal, but vm-run's output is a log.
    let out = vm_run(
        &["--drives", "1"],
        &[&program("usnvme"), "perf", "-q", "4", "-t", "3"],
    );
    let (stdout, stderr) = (text(&out.stdout), text(&out.stderr));
    assert_eq!(
        out.status.code(),
        Some(0),
        "stdout:\n{stdout}\nstderr:\n{stderr}"
    );
    assert!(stdout.contains("Total"), "the results:\n{stdout}");
    assert!(!stdout.contains('\r'), "a progress line:\n{stdout:?}");
}

#[test]
#[ignore = "boots QEMU: run by `cargo xtask vm-test`"]
fn drives_granting_one_queue_pair_are_served_from_one_core_each() {
    // QEMU's max_ioqpairs=1: as an SR-IOV virtual function granting a handful of queues would.
    let out = vm_run(
        &["--drives", "2", "--nvme-opts", "max_ioqpairs=1"],
        &[
            &program("usnvme"),
            "perf",
            "-c",
            "0-1",
            "-q",
            "8",
            "-t",
            "2",
        ],
    );
    let (stdout, stderr) = (text(&out.stdout), text(&out.stderr));
    assert_eq!(
        out.status.code(),
        Some(0),
        "stdout:\n{stdout}\nstderr:\n{stderr}"
    );
    // one row per drive, the two drives on different cores, said once each
    let rows: Vec<&str> = stdout.lines().filter(|l| l.contains("@core")).collect();
    assert_eq!(rows.len(), 2, "{stdout}");
    assert!(
        rows[0].contains("@core0") && rows[1].contains("@core1"),
        "{stdout}"
    );
    assert_eq!(
        stdout
            .matches("granted 1 I/O queue pair(s): served from core(s)")
            .count(),
        2,
        "stdout:\n{stdout}\nstderr:\n{stderr}"
    );
}

/// Host threads that each burn a CPU for 3 s, then rest for 1 s, as a build does, until dropped.
struct BusyHost {
    stop: std::sync::Arc<std::sync::atomic::AtomicBool>,
    threads: Vec<std::thread::JoinHandle<()>>,
}

impl BusyHost {
    fn start(threads: usize) -> BusyHost {
        use std::sync::atomic::Ordering;
        let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
        let threads = (0..threads)
            .map(|_| {
                let stop = stop.clone();
                std::thread::spawn(move || {
                    while !stop.load(Ordering::Relaxed) {
                        let busy = Instant::now();
                        while busy.elapsed() < Duration::from_secs(3)
                            && !stop.load(Ordering::Relaxed)
                        {
                            std::hint::spin_loop();
                        }
                        std::thread::sleep(Duration::from_secs(1));
                    }
                })
            })
            .collect();
        BusyHost { stop, threads }
    }
}

impl Drop for BusyHost {
    fn drop(&mut self) {
        self.stop.store(true, std::sync::atomic::Ordering::Relaxed);
        for t in self.threads.drain(..) {
            let _ = t.join();
        }
    }
}

/// Issue 22's reproducer: on a host kept busy by two threads, the guest opens and closes all 24
/// drives again and again (each open and close is a function-level reset and power-state
/// changes: timed sleeps in the guest's kernel), with a short perf run between. Under
/// multi-threaded TCG (`USNVME_VM_TCG_THREADS=multi`) a guest so treated lost a local APIC
/// interrupt and hung with both vCPUs halted in 4 of 6 boots; the watchdog then fails the run.
#[test]
#[ignore = "boots QEMU: run by `cargo xtask vm-test`"]
fn a_busy_host_does_not_hang_a_guest_that_opens_and_closes_every_drive() {
    const ROUNDS: usize = 12;
    let usnvme = program("usnvme");
    let script = format!(
        "for i in $(seq {ROUNDS}); do {usnvme} identify >/dev/null || exit 1; \
         {usnvme} perf -q 8 -t 1 >/dev/null || exit 2; echo opened-and-closed $i; done"
    );
    let _busy = BusyHost::start(2);
    let out = vm_run(
        &[
            "--numa-nodes",
            "2",
            "--hang-after",
            "60",
            "--timeout",
            "1500",
        ],
        &["/bin/sh", "-c", &script],
    );
    let (stdout, stderr) = (text(&out.stdout), text(&out.stderr));
    assert_eq!(
        out.status.code(),
        Some(0),
        "stdout:\n{stdout}\nstderr:\n{stderr}"
    );
    assert!(
        stdout.contains(&format!("opened-and-closed {ROUNDS}")),
        "{stdout}"
    );
}
