//! Protection information on drives formatted with it, against the emulated controller's own
//! checks, and Format NVM. A bed of its own (`cargo xtask vm-test` boots it after the main one): 2 drives, each
//! with namespace 1 plain (512 B blocks), 2 formatted 512+8 with PI type 1 (metadata in a
//! buffer apart), 3 formatted 4096+64 with PI type 3 and a 64-bit guard (extended LBAs), and 4
//! (4096 B blocks) allocated in the drive's NVM subsystem but attached to no controller; and
//! `serve` following a namespace attached through a second controller hot added into drive
//! 1's subsystem (a dual-port drive's other port).

use usnvme_tests::VmBed;

const TYPE_1_DIX: &str = "2";
const TYPE_3_DIF_64: &str = "3";

/// `usnvme ARGS`: exit code, standard output and error.
fn usnvme(bed: &VmBed, args: &[&str]) -> (Option<i32>, String, String) {
    let out = bed.usnvme(args);
    (
        out.status.code(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

/// `usnvme ARGS`, which must succeed: its standard error.
fn ok(bed: &VmBed, args: &[&str]) -> String {
    let (code, stdout, stderr) = usnvme(bed, args);
    assert_eq!(code, Some(0), "usnvme {args:?}\n{stdout}\n{stderr}");
    stderr
}

/// `usnvme ARGS`, which must succeed: its standard output.
fn ok_stdout(bed: &VmBed, args: &[&str]) -> String {
    let (code, stdout, stderr) = usnvme(bed, args);
    assert_eq!(code, Some(0), "usnvme {args:?}\n{stdout}\n{stderr}");
    stdout
}

/// Every controller as `usnvme identify --json` reports it.
fn controllers(bed: &VmBed) -> Vec<serde_json::Value> {
    let (code, stdout, stderr) = usnvme(bed, &["identify", "--json"]);
    assert_eq!(code, Some(0), "{stderr}");
    serde_json::from_str(&stdout).expect("identify JSON")
}

/// The PCI address of drive `k` (serial `usnvme{k}`).
fn drive(bed: &VmBed, k: usize) -> String {
    controllers(bed)
        .iter()
        .find(|c| c["serial"].as_str().and_then(usnvme_tests::drive_index) == Some(k))
        .and_then(|c| c["address"].as_str().map(str::to_owned))
        .unwrap_or_else(|| panic!("no drive with serial usnvme{k}"))
}

#[test]
#[ignore = "VM: run by `cargo xtask vm-test` (its protection bed)"]
fn the_formats_are_seen_as_the_bed_made_them() {
    let bed = VmBed::from_env();
    let controllers = controllers(&bed);
    assert_eq!(controllers.len(), bed.drives);
    for c in &controllers {
        let ns = c["namespaces"].as_array().expect("namespaces");
        let shape = |n: &serde_json::Value| {
            (
                n["block_size"].as_u64(),
                n["metadata_size"].as_u64(),
                n["metadata_extended"].as_bool(),
                n["protection"]["type"].as_u64(),
                n["protection"]["guard_bits"].as_u64(),
            )
        };
        assert_eq!(
            ns.iter().map(shape).collect::<Vec<_>>(),
            [
                (Some(512), Some(0), Some(false), None, None),
                (Some(512), Some(8), Some(false), Some(1), Some(16)),
                (Some(4096), Some(64), Some(true), Some(3), Some(64)),
            ],
            "{c:#}"
        );
    }
}

#[test]
#[ignore = "VM: run by `cargo xtask vm-test` (its protection bed)"]
fn perf_pi_writes_then_reads_back_with_every_prchk_on_type_1_and_type_3_drives() {
    let bed = VmBed::from_env();
    let mut modes: Vec<String> = ["GUARD", "REFTAG", "APPTAG", "GUARD|REFTAG|APPTAG"]
        .iter()
        .map(|c| format!("PRACT=0,PRCHK={c}"))
        .collect();
    modes.push("PRACT=1,PRCHK=GUARD|REFTAG|APPTAG".into());
    for nsid in [TYPE_1_DIX, TYPE_3_DIF_64] {
        for (seed, pi) in (1u64..).zip(&modes) {
            let seed = seed.to_string();
            for workload in ["randwrite", "randread"] {
                let stderr = ok(
                    &bed,
                    &[
                        "perf", "-n", nsid, "--pi", pi, "-w", workload, "-q", "4", "-o", "8k",
                        "-t", "1", "--offset", "1M", "--size", "4M", "--verify", "--seed", &seed,
                    ],
                );
                assert!(
                    !stderr.contains("checked no block"),
                    "ns {nsid} {pi} {workload}: {stderr}"
                );
            }
        }
    }
}

#[test]
#[ignore = "VM: run by `cargo xtask vm-test` (its protection bed)"]
fn a_block_corrupted_in_the_image_behind_our_back_is_a_guard_error_naming_its_lba() {
    let bed = VmBed::from_env();
    // the host changed a byte of this block's data in drive 0's image before the boot: its
    // protection information (all zeroes there) no longer matches
    let lba: u64 = std::env::var("USNVME_VM_CORRUPTED_LBA")
        .expect("the bed's corrupted block")
        .parse()
        .expect("an LBA");
    let address = drive(&bed, 0);
    let pi = "PRACT=1,PRCHK=GUARD";
    let one = |workload: &str, lba: u64| {
        let offset = (lba * 512).to_string();
        usnvme(
            &bed,
            &[
                "perf",
                "-r",
                &address,
                "-n",
                TYPE_1_DIX,
                "--pi",
                pi,
                "-c",
                "0",
                "-w",
                workload,
                "-q",
                "1",
                "-o",
                "512",
                "--offset",
                &offset,
                "--size",
                "512",
                "--io-count",
                "1",
            ],
        )
    };
    let (code, stdout, stderr) = one("read", lba);
    assert_eq!(code, Some(1), "{stdout}\n{stderr}");
    let named = format!("Read of {address}/ns2 LBAs {lba}..={lba}");
    assert!(
        stderr.contains("End-to-end Guard Check Error") && stderr.contains(&named),
        "{stderr}"
    );
    // its neighbours read back clean; the block rewritten (the drive makes its PI) too
    for (workload, lba) in [
        ("read", lba - 1),
        ("read", lba + 1),
        ("write", lba),
        ("read", lba),
    ] {
        let (code, stdout, stderr) = one(workload, lba);
        assert_eq!(code, Some(0), "{workload} LBA {lba}: {stdout}\n{stderr}");
    }
}

#[test]
#[ignore = "VM: run by `cargo xtask vm-test` (its protection bed)"]
fn a_stripe_over_pi_drives_verifies_each_member_tagging_its_own_lbas() {
    let bed = VmBed::from_env();
    // type 1 checks every block's reference tag against its member's LBA. Writes, then reads:
    // the emulated drive writes data and PI apart, so a read racing a write of the same block
    // could see them torn (a real drive writes a block and its PI as one).
    for workload in ["randwrite", "randread"] {
        let stderr = ok(
            &bed,
            &[
                "perf",
                "-n",
                TYPE_1_DIX,
                "--stripe",
                "2:16k",
                "--pi",
                "PRACT=1,PRCHK=GUARD|REFTAG|APPTAG",
                "-w",
                workload,
                "-q",
                "4",
                "-o",
                "64k",
                "--offset",
                "1M",
                "-t",
                "2",
                "--verify",
                "--seed",
                "11",
            ],
        );
        assert!(!stderr.contains("checked no block"), "{workload}: {stderr}");
    }
}

#[test]
#[ignore = "VM: run by `cargo xtask vm-test` (its protection bed)"]
fn the_kernel_initiator_verifies_through_serve_exporting_a_pi_namespace_as_plain_blocks() {
    use usnvme_tests::kernel_host::{block_bytes, kernel_namespaces, run, serve, Connected, FIO};
    const NQN: &str = "nqn.2024-01.io.usnvme:vm-protection";
    let bed = VmBed::from_env();
    let addresses: Vec<String> = usnvme_tests::vfio_controllers()
        .iter()
        .map(|a| a.to_string())
        .collect();
    let (mut target, namespaces) = serve(&bed, NQN, &addresses, &[]);
    // namespaces 1 (plain) and 2 (PI the drive inserts and strips) of each drive; namespace 3,
    // whose 64 bytes of metadata per block would have to travel, is left out by name
    let mut names: Vec<&str> = namespaces.iter().map(|n| n.name.as_str()).collect();
    names.sort_unstable();
    let expected: Vec<String> = addresses
        .iter()
        .flat_map(|a| [format!("{a}/ns1"), format!("{a}/ns2")])
        .collect();
    assert_eq!(names, expected, "{namespaces:?}");
    let connected = Connected::new(NQN, &[]);
    let devices = kernel_namespaces(NQN, namespaces.len());
    let mut fio: Vec<String> = [
        "--ioengine=io_uring",
        "--direct=1",
        "--rw=randwrite",
        "--bsrange=4k-128k",
        "--iodepth=8",
        "--verify=crc32c",
        "--do_verify=1",
        "--offset=1M",
        "--size=8M",
    ]
    .iter()
    .map(|s| s.to_string())
    .collect();
    for usnvme_tests::kernel_host::Exported {
        nsid, name, bytes, ..
    } in &namespaces
    {
        let dev = &devices[nsid];
        assert_eq!(block_bytes(dev), *bytes, "{name} as {}", dev.display());
        fio.extend([
            format!("--name=ns{nsid}"),
            format!("--filename={}", dev.display()),
        ]);
    }
    let args: Vec<&str> = fio.iter().map(String::as_str).collect();
    let out = run(FIO, &args);
    assert!(!out.contains("verify: bad"), "{out}");
    drop(connected);
    usnvme_tests::signal(&target, "TERM");
    let status = target.wait().expect("serve exits");
    assert_eq!(status.code(), Some(143));
}

#[test]
#[ignore = "VM: run by `cargo xtask vm-test` (its protection bed)"]
fn format_from_512_to_4096_and_back_then_perf_verifies_and_a_drive_in_use_is_refused() {
    let bed = VmBed::from_env();
    let address = drive(&bed, 1);
    let block_size = |bed: &VmBed| {
        controllers(bed)
            .iter()
            .find(|c| c["address"] == address.as_str())
            .map(|c| c["namespaces"][0]["block_size"].as_u64())
            .expect("the drive")
    };
    for (bs, blocks) in [("4096", "16384"), ("512", "131072")] {
        let out = ok_stdout(
            &bed,
            &["format", &address, "-n", "1", "--block-size", bs, "--yes"],
        );
        assert!(
            out.contains(&format!("namespace 1 formatted: {blocks} blocks of {bs} B")),
            "{out}"
        );
        assert_eq!(block_size(&bed), bs.parse().ok());
        for workload in ["randwrite", "randread"] {
            ok(
                &bed,
                &[
                    "perf", "-r", &address, "-n", "1", "-w", workload, "-q", "4", "-o", "4k", "-t",
                    "1", "--size", "4M", "--verify", "--seed", bs,
                ],
            );
        }
    }
    // a drive another process holds is not formatted
    let mut perf = std::process::Command::new(&bed.usnvme)
        .args(["perf", "-r", &address, "-t", "60", "-q", "1"])
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("perf runs");
    let mut stderr = std::io::BufReader::new(perf.stderr.take().expect("piped"));
    let mut line = String::new();
    while !line.contains("measuring") {
        line.clear();
        let n = std::io::BufRead::read_line(&mut stderr, &mut line).expect("perf's stderr");
        assert!(n > 0, "perf ended before measuring");
    }
    let (code, _, err) = usnvme(&bed, &["format", &address, "--block-size", "4096", "--yes"]);
    usnvme_tests::signal(&perf, "INT");
    let _ = perf.wait();
    assert_eq!(code, Some(1), "{err}");
    assert!(err.contains("is in use by"), "{err}");
    assert_eq!(block_size(&bed), Some(512), "nothing formatted");
}

#[test]
#[ignore = "VM: run by `cargo xtask vm-test` (its protection bed)"]
fn sanitize_self_test_and_firmware_update_are_refused_by_name_on_qemus_controller() {
    // QEMU 10's NVMe controller offers no sanitize (SANICAP 0) and no Device Self-test (OACS
    // bit 4 clear); the sim implements both, and the host tests run them there
    let bed = VmBed::from_env();
    let address = drive(&bed, 1);
    let (code, _, err) = usnvme(&bed, &["self-test", &address]);
    assert_eq!(code, Some(1), "{err}");
    assert!(err.contains("does not support Device Self-test"), "{err}");
    let (code, _, err) = usnvme(
        &bed,
        &["sanitize", &address, "--action", "block-erase", "--yes"],
    );
    assert_eq!(code, Some(1), "{err}");
    assert!(
        err.contains("does not support a block erase sanitize"),
        "{err}"
    );
    // nor firmware update (OACS bit 2), though it reports its slots
    let (code, _, err) = usnvme(&bed, &["fw", "commit", &address, "--action", "activate"]);
    assert_eq!(code, Some(1), "{err}");
    assert!(err.contains("does not support firmware update"), "{err}");
    let slots = controllers(&bed)
        .into_iter()
        .find(|c| c["address"] == address.as_str())
        .map(|c| c["firmware_slots"]["active_slot"].clone());
    assert_eq!(slots, Some(serde_json::json!(1)));
}

#[test]
#[ignore = "VM: run by `cargo xtask vm-test` (its protection bed)"]
fn a_detached_namespace_is_attached_driven_with_verify_and_detached_again() {
    let bed = VmBed::from_env();
    let address = drive(&bed, 0);
    let listed = ok_stdout(&bed, &["ns", "list", &address]);
    for line in [
        "namespace 1: attached, 131072 blocks of 512 B",
        "4096 B + 64 B metadata (extended LBA), protection information type 3",
        "namespace 4: detached, 8192 blocks of 4096 B",
        "4 namespaces allocated",
    ] {
        assert!(listed.contains(line), "{listed}");
    }
    let inactive = |bed: &VmBed| {
        let (code, _, err) = usnvme(bed, &["perf", "-r", &address, "-n", "4", "-t", "1"]);
        assert_eq!(code, Some(2), "{err}");
        assert!(err.contains("namespace 4 does not exist"), "{err}");
    };
    inactive(&bed);

    let out = ok_stdout(&bed, &["ns", "attach", &address, "-n", "4"]);
    assert!(
        out.contains(&format!("{address}: namespace 4 attached")),
        "{out}"
    );
    let (code, _, err) = usnvme(&bed, &["ns", "attach", &address, "-n", "4"]);
    assert_eq!(code, Some(1), "{err}");
    assert!(err.contains("Namespace Already Attached"), "{err}");
    for workload in ["randwrite", "randread"] {
        let stderr = ok(
            &bed,
            &[
                "perf", "-r", &address, "-n", "4", "-w", workload, "-q", "4", "-o", "4k", "-t",
                "1", "--size", "8M", "--verify", "--seed", "4",
            ],
        );
        assert!(!stderr.contains("checked no block"), "{workload}: {stderr}");
    }

    let out = ok_stdout(&bed, &["ns", "detach", &address, "-n", "4"]);
    assert!(
        out.contains(&format!("{address}: namespace 4 detached")),
        "{out}"
    );
    let listed = ok_stdout(&bed, &["ns", "list", &address]);
    assert!(listed.contains("namespace 4: detached"), "{listed}");
    inactive(&bed);

    // QEMU 10 attaches and detaches, but creates and deletes no namespace: Namespace
    // Management answers Invalid Command Opcode (the sim implements both; the host tests
    // create, attach, write, detach, delete and create again there)
    for args in [
        &[
            "ns",
            "create",
            &address,
            "--size",
            "16M",
            "--block-size",
            "512",
        ][..],
        &["ns", "delete", &address, "-n", "4", "--yes"][..],
    ] {
        let (code, _, err) = usnvme(&bed, args);
        assert_eq!(code, Some(1), "{args:?}: {err}");
        assert!(err.contains("Invalid Command Opcode"), "{args:?}: {err}");
    }
    assert!(ok_stdout(&bed, &["ns", "list", &address]).contains("namespace 4: detached"));
}

#[test]
#[ignore = "VM: run by `cargo xtask vm-test` (its protection bed)"]
fn serve_exports_a_namespace_attached_through_the_drives_other_port_until_it_is_detached() {
    use usnvme_tests::hotplug::{self, RemoveOnDrop};
    use usnvme_tests::kernel_host::Connected;
    use usnvme_tests::kernel_host::{block_bytes, fio_verifies, kernel_namespaces, serve};
    const NQN: &str = "nqn.2024-01.io.usnvme:vm-dual-port";
    let bed = VmBed::from_env();
    let address = drive(&bed, 1);
    let cntlid = controllers(&bed)
        .iter()
        .find(|c| c["address"].as_str() == Some(address.as_str()))
        .and_then(|c| c["controller_id"].as_u64())
        .expect("drive 1's controller ID")
        .to_string();
    // drive 1 as a dual-port drive: its NVM subsystem's second controller, hot added, then
    // handed to vfio-pci; serve exports the first
    let port = hotplug::add_port(0, 1);
    let _remove = RemoveOnDrop(0, port.clone());
    ok(&bed, &["setup", "bind", &port]);
    let (target, namespaces) = serve(&bed, NQN, std::slice::from_ref(&address), &["-c", "0"]);
    let mut target = usnvme_tests::KillOnDrop(target);
    assert_eq!(namespaces.len(), 2, "namespaces 1 and 2: {namespaces:?}");
    let connected = Connected::new(NQN, &[]);
    kernel_namespaces(NQN, 2);

    // namespace 4 attached to the first controller through the second: the drive tells serve
    // (Namespace Attribute Changed), serve tells the host, which shows it and verifies on it
    let attach = ["ns", "attach", &port, "-n", "4", "--controller", &cntlid];
    let out = ok_stdout(&bed, &attach);
    assert!(
        out.contains(&format!(
            "{port}: namespace 4 attached (controller {cntlid})"
        )),
        "{out}"
    );
    let attached = std::time::Instant::now();
    let devices = kernel_namespaces(NQN, 3);
    println!(
        "namespace 3 on the kernel host {:.1} s after the attachment",
        attached.elapsed().as_secs_f64()
    );
    assert_eq!(block_bytes(&devices[&3]), 32 << 20, "{devices:?}");
    fio_verifies(&devices[&3], "8m");

    // detached the same way: gone from the host, namespaces 1 and 2 still there
    let detach = ["ns", "detach", &port, "-n", "4", "--controller", &cntlid];
    ok_stdout(&bed, &detach);
    let devices = kernel_namespaces(NQN, 2);
    assert!(
        devices.contains_key(&1) && devices.contains_key(&2),
        "{devices:?}"
    );
    assert!(
        target.0.try_wait().expect("serve's status").is_none(),
        "serve ended"
    );
    drop(connected);
    usnvme_tests::signal(&target.0, "INT");
    assert_eq!(target.0.wait().expect("serve ends").code(), Some(130));
}
