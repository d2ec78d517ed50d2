//! `usnvme setup` run as a process against fake sysfs/procfs trees (`USNVME_SYSFS_ROOT`): the
//! files it writes, what it refuses, and that a refusal leaves every file as it was.

use std::collections::BTreeMap;
use std::fs;
use std::path::{Path, PathBuf};

use usnvme_driver::lock::OwnerLock;
use usnvme_driver::pci::fake::FakeSysfs;

mod common;
use common::{stderr, stdout, usnvme};

fn read(fake: &FakeSysfs, rel: &str) -> String {
    fs::read_to_string(fake.root().join(rel)).unwrap_or_else(|e| panic!("{rel}: {e}"))
}

/// Every file and symlink under the root with its contents or target: equal snapshots mean
/// that nothing was written, no driver changed.
fn snapshot(fake: &FakeSysfs) -> BTreeMap<PathBuf, String> {
    fn walk(dir: &Path, root: &Path, out: &mut BTreeMap<PathBuf, String>) {
        for entry in fs::read_dir(dir).expect("read_dir").flatten() {
            let path = entry.path();
            let rel = path.strip_prefix(root).expect("under root").to_owned();
            let meta = fs::symlink_metadata(&path).expect("metadata");
            if meta.file_type().is_symlink() {
                let target = fs::read_link(&path).expect("readlink");
                out.insert(rel, format!("-> {}", target.display()));
            } else if meta.is_dir() {
                walk(&path, root, out);
            } else {
                out.insert(rel, fs::read_to_string(&path).expect("read"));
            }
        }
    }
    let mut out = BTreeMap::new();
    walk(fake.root(), fake.root(), &mut out);
    out
}

/// Runs `usnvme ARGS`, which must fail with exit status 1, change nothing, and say `error`.
fn refused(fake: &FakeSysfs, args: &[&str], error: &str) -> String {
    let before = snapshot(fake);
    let out = usnvme(fake.root(), args);
    assert_eq!(out.status.code(), Some(1), "{args:?}: {out:?}");
    let err = stderr(&out);
    assert!(err.contains(error), "{args:?}: {err}");
    assert!(before == snapshot(fake), "{args:?} changed files");
    err
}

const DEV: &str = "sys/devices/pci0000:00";

/// A root user's view of an Intel server with the IOMMU on, vfio-pci and nvme loaded, 512
/// hugepages on node 0, hugetlbfs mounted and no memlock limit, and:
/// 01:00.0 on nvme (idle namespace), 02:00.0 on vfio-pci, 03:00.0 on nvme with a file system
/// mounted at /data, and a VGA card at 00:02.0. Each controller is alone in its IOMMU group.
fn server() -> FakeSysfs {
    let fake = FakeSysfs::new();
    fake.euid(0);
    fake.memlock(None);
    fake.write(
        "proc/cpuinfo",
        "processor\t: 0\nvendor_id\t: GenuineIntel\n",
    );
    fake.write(
        "proc/cmdline",
        "BOOT_IMAGE=/vmlinuz ro intel_iommu=on iommu=pt\n",
    );
    fake.add_iommu("dmar0");
    fake.add_driver("vfio-pci");
    fake.add_driver("nvme");
    fake.mkdir("sys/devices/system/node/node0");
    fake.hugepages(Some(0), 2048, 512, 512);
    fake.hugepages(None, 2048, 512, 512);
    fake.add_nvme_controller("0000:01:00.0")
        .bind("nvme")
        .numa_node("0")
        .iommu_group(1)
        .namespace("nvme0", "nvme0n1", 2048, "259:0");
    fake.add_nvme_controller("0000:02:00.0")
        .bind("vfio-pci")
        .attr("driver_override", "vfio-pci")
        .numa_node("0")
        .iommu_group(2);
    fake.add_nvme_controller("0000:03:00.0")
        .bind("nvme")
        .numa_node("0")
        .iommu_group(3)
        .namespace("nvme1", "nvme1n1", 2048, "259:1");
    fake.add_partition("nvme1n1", "nvme1n1p1", "259:2");
    fake.add_pci_device("0000:00:02.0", 0x030000, 0x1234, 0x1111)
        .iommu_group(0);
    fake.write(
        "proc/self/mounts",
        "proc /proc proc rw 0 0\n/dev/nvme1n1p1 /data ext4 rw 0 0\n\
         hugetlbfs /dev/hugepages hugetlbfs rw,pagesize=2M 0 0\n",
    );
    fake
}

/// What the kernel does after `drivers_probe`: the device moves to `driver`.
fn kernel_binds(fake: &FakeSysfs, address: &str, driver: &str) {
    let link = format!("{DEV}/{address}/driver");
    fs::remove_file(fake.root().join(&link)).expect("unlink driver");
    fake.symlink(link, format!("sys/bus/pci/drivers/{driver}"));
}

#[test]
fn bind_writes_override_unbind_and_probe() {
    let fake = server();
    let out = usnvme(fake.root(), &["setup", "bind", "01:00.0"]);
    assert!(out.status.success(), "{out:?}");
    assert_eq!(stdout(&out), "0000:01:00.0: nvme -> vfio-pci\n");
    assert_eq!(stderr(&out), "");
    assert_eq!(
        read(&fake, &format!("{DEV}/0000:01:00.0/driver_override")),
        "vfio-pci\n"
    );
    assert_eq!(
        read(&fake, "sys/bus/pci/drivers/nvme/unbind"),
        "0000:01:00.0\n"
    );
    assert_eq!(read(&fake, "sys/bus/pci/drivers_probe"), "0000:01:00.0\n");
    // The other drives were not touched.
    assert_eq!(
        read(&fake, &format!("{DEV}/0000:03:00.0/driver_override")),
        "(null)\n"
    );
    assert_eq!(read(&fake, "sys/bus/pci/drivers/vfio-pci/unbind"), "");

    // Once the kernel has bound it, a second bind finds nothing to do.
    kernel_binds(&fake, "0000:01:00.0", "vfio-pci");
    let before = snapshot(&fake);
    let out = usnvme(fake.root(), &["setup", "bind", "0000:01:00.0", "02:00.0"]);
    assert!(out.status.success(), "{out:?}");
    assert_eq!(
        stdout(&out),
        "0000:01:00.0: already on vfio-pci\n0000:02:00.0: already on vfio-pci\n"
    );
    assert!(before == snapshot(&fake), "a no-op bind wrote files");
}

#[test]
fn dry_run_prints_the_plan_and_changes_nothing() {
    let fake = server();
    fake.euid(1000); // a dry run needs no root
    let before = snapshot(&fake);
    let out = usnvme(fake.root(), &["setup", "bind", "all", "--dry-run"]);
    assert!(out.status.success(), "{out:?}");
    let expected = "\
0000:01:00.0: nvme -> vfio-pci
  echo vfio-pci > /sys/bus/pci/devices/0000:01:00.0/driver_override
  echo 0000:01:00.0 > /sys/bus/pci/devices/0000:01:00.0/driver/unbind
  echo 0000:01:00.0 > /sys/bus/pci/drivers_probe
0000:02:00.0: already on vfio-pci
0000:03:00.0: left on nvme: nvme1n1 is mounted at /data: unmount it first (umount /data)
dry run: nothing was changed
";
    assert_eq!(stdout(&out), expected);
    assert!(before == snapshot(&fake), "a dry run wrote files");
}

#[test]
fn bind_all_leaves_drives_in_use_and_binds_the_rest() {
    let fake = server();
    let out = usnvme(fake.root(), &["setup", "bind", "all"]);
    assert!(out.status.success(), "{out:?}");
    let text = stdout(&out);
    assert!(text.contains("0000:01:00.0: nvme -> vfio-pci\n"), "{text}");
    assert!(
        text.contains("0000:03:00.0: left on nvme: nvme1n1 is mounted at /data"),
        "{text}"
    );
    assert_eq!(
        read(&fake, &format!("{DEV}/0000:01:00.0/driver_override")),
        "vfio-pci\n"
    );
    assert_eq!(
        read(&fake, &format!("{DEV}/0000:03:00.0/driver_override")),
        "(null)\n"
    );
    assert_eq!(
        read(&fake, "sys/bus/pci/drivers/nvme/unbind"),
        "0000:01:00.0\n"
    );
}

#[test]
fn refuses_a_drive_with_a_mounted_file_system() {
    let fake = server();
    let err = refused(
        &fake,
        &["setup", "bind", "03:00.0", "01:00.0"],
        "refusing 0000:03:00.0: nvme1n1 is mounted at /data: unmount it first (umount /data)",
    );
    assert_eq!(err.lines().count(), 1, "{err}");
    assert!(err.starts_with("usnvme: error: "), "{err}");
}

#[test]
fn refuses_root_swap_lvm_and_md_and_says_which() {
    let fake = server();
    let add = |address: &str, ctrl: &str, disk: &str, devno: &str, group: u32| {
        fake.add_nvme_controller(address)
            .bind("nvme")
            .iommu_group(group)
            .namespace(ctrl, disk, 2048, devno);
    };
    add("0000:04:00.0", "nvme2", "nvme2n1", "259:4", 4);
    add("0000:05:00.0", "nvme3", "nvme3n1", "259:5", 5);
    add("0000:06:00.0", "nvme4", "nvme4n1", "259:6", 6);
    add("0000:07:00.0", "nvme5", "nvme5n1", "259:7", 7);
    // The root file system, seen through mountinfo's device number as /dev/root.
    fake.add_partition("nvme2n1", "nvme2n1p2", "259:8");
    fake.write(
        "proc/self/mountinfo",
        "22 1 259:8 / / rw - ext4 /dev/root rw\n",
    );
    fake.write(
        "proc/swaps",
        "Filename\tType\tSize\tUsed\tPriority\n/dev/nvme3n1 partition 1020 0 -2\n",
    );
    fake.add_dm_holder("nvme4n1", "dm-0", "vg0-data", "LVM-k3WjPSYq");
    fake.add_holder("nvme5n1", "md127");
    let err = refused(
        &fake,
        &[
            "setup", "bind", "04:00.0", "05:00.0", "06:00.0", "07:00.0", "01:00.0",
        ],
        "refusing",
    );
    let lines: Vec<&str> = err.lines().collect();
    assert_eq!(
        lines,
        [
            "usnvme: error: refusing 0000:04:00.0: nvme2n1 holds the root file system: it is the system disk, leave it on nvme",
            "usnvme: error: refusing 0000:05:00.0: nvme3n1 is active swap: turn it off first (swapoff /dev/nvme3n1)",
            "usnvme: error: refusing 0000:06:00.0: nvme4n1 is held by LVM volume vg0-data (dm-0): deactivate its volume group first (vgchange -an VG)",
            "usnvme: error: refusing 0000:07:00.0: nvme5n1 is held by md RAID md127: stop it first (mdadm --stop /dev/md127)",
        ],
        "{err}"
    );
}

#[test]
fn nonexistent_and_non_nvme_devices_are_errors() {
    let fake = server();
    let err = refused(&fake, &["setup", "bind", "0000:09:00.0"], "0000:09:00.0");
    assert_eq!(
        err,
        "usnvme: error: no PCI device at 0000:09:00.0 (run `usnvme list` to see the NVMe controllers)\n"
    );
    let err = refused(&fake, &["setup", "reset", "00:02.0", "01:00.0"], "00:02.0");
    assert!(
        err.starts_with("usnvme: error: 0000:00:02.0 is not an NVMe controller (class 0x030000)"),
        "{err}"
    );
}

#[test]
fn usage_errors_exit_2() {
    let fake = server();
    let before = snapshot(&fake);
    for args in [
        &["setup", "bind"][..],
        &["setup", "bind", "0000:1:00.0"],
        &["setup", "bind", "all", "01:00.0"],
        &["setup", "reset", "nonsense"],
        &["setup", "--hugepages", "3M"],
        &["setup", "--hugepages", "2G,node=x"],
        &["setup", "frobnicate"],
    ] {
        let out = usnvme(fake.root(), args);
        assert_eq!(out.status.code(), Some(2), "{args:?}: {out:?}");
        let err = stderr(&out);
        assert!(err.starts_with("usnvme: error: "), "{args:?}: {err}");
        assert_eq!(err.trim().lines().count(), 1, "{args:?}: one line: {err}");
    }
    let err = stderr(&usnvme(fake.root(), &["setup", "bind", "all", "01:00.0"]));
    assert!(err.contains("`all` stands alone"), "{err}");
    let err = stderr(&usnvme(fake.root(), &["setup", "--hugepages", "3M"]));
    assert!(err.contains("not a whole number of 2M pages"), "{err}");
    assert!(before == snapshot(&fake));
}

#[test]
fn iommu_off_names_the_kernel_argument() {
    let fake = server();
    // No IOMMU: no groups, and no device links to one.
    fs::remove_dir_all(fake.root().join("sys/kernel/iommu_groups")).expect("rm groups");
    for device in [
        "0000:00:02.0",
        "0000:01:00.0",
        "0000:02:00.0",
        "0000:03:00.0",
    ] {
        fs::remove_file(fake.root().join(format!("{DEV}/{device}/iommu_group"))).expect("rm link");
    }
    fake.write("proc/cmdline", "BOOT_IMAGE=/vmlinuz ro quiet\n");
    let err = refused(&fake, &["setup", "bind", "01:00.0"], "the IOMMU is off");
    assert_eq!(err.lines().count(), 1, "{err}");
    assert!(
        err.contains("add `intel_iommu=on iommu=pt` to the kernel command line"),
        "{err}"
    );
    assert!(
        err.contains("does not use vfio's unsafe no-IOMMU mode"),
        "{err}"
    );
    fake.write("proc/cpuinfo", "vendor_id\t: AuthenticAMD\n");
    let err = refused(&fake, &["setup", "bind", "all"], "the IOMMU is off");
    assert!(err.contains("add `amd_iommu=on iommu=pt`"), "{err}");
    // Status says so too; a drive already on vfio-pci needs nothing.
    let out = usnvme(fake.root(), &["setup", "status"]);
    assert!(stdout(&out).contains("IOMMU:"), "{out:?}");
    assert!(
        stdout(&out).contains("off: add `amd_iommu=on iommu=pt`"),
        "{out:?}"
    );
    assert!(usnvme(fake.root(), &["setup", "bind", "02:00.0"])
        .status
        .success());
}

#[test]
fn only_whole_viable_iommu_groups() {
    let fake = server();
    // Group 8: a drive and a NIC in use. Group 9: two drives on nvme.
    fake.add_nvme_controller("0000:08:00.0")
        .bind("nvme")
        .iommu_group(8);
    fake.add_pci_device("0000:08:00.1", 0x020000, 0x8086, 0x10d3)
        .bind("e1000e")
        .iommu_group(8);
    fake.add_nvme_controller("0000:09:00.0")
        .bind("nvme")
        .iommu_group(9);
    fake.add_nvme_controller("0000:09:00.1")
        .bind("nvme")
        .iommu_group(9);
    refused(
        &fake,
        &["setup", "bind", "08:00.0"],
        "refusing 0000:08:00.0: VFIO takes whole IOMMU groups and group 8 also holds 0000:08:00.1 \
         on e1000e, which usnvme does not unbind",
    );
    refused(
        &fake,
        &["setup", "bind", "09:00.0"],
        "refusing 0000:09:00.0: VFIO takes whole IOMMU groups and group 9 also holds NVMe \
         controller 0000:09:00.1 (on nvme): bind it too",
    );
    let out = usnvme(
        fake.root(),
        &["setup", "bind", "09:00.0", "09:00.1", "--dry-run"],
    );
    assert!(out.status.success(), "{out:?}");
    let text = stdout(&out);
    assert!(text.contains("0000:09:00.0: nvme -> vfio-pci\n"), "{text}");
    assert!(text.contains("0000:09:00.1: nvme -> vfio-pci\n"), "{text}");
}

#[test]
fn without_root_says_root_is_needed() {
    let fake = server();
    fake.euid(1000);
    let err = refused(&fake, &["setup", "bind", "01:00.0"], "needs root");
    assert_eq!(
        err,
        "usnvme: error: usnvme setup bind needs root (it writes to /sys): run it with sudo, or add --dry-run to see what it would do\n"
    );
    refused(
        &fake,
        &["setup", "--hugepages", "2G"],
        "usnvme setup --hugepages needs root",
    );
    // Nothing to do needs no root; neither does status.
    assert!(usnvme(fake.root(), &["setup", "bind", "02:00.0"])
        .status
        .success());
    assert!(usnvme(fake.root(), &["setup", "status"]).status.success());
}

#[test]
fn loads_the_driver_module_when_missing() {
    let fake = server();
    fs::remove_dir_all(fake.root().join("sys/bus/pci/drivers/nvme")).expect("rm nvme");
    let out = usnvme(fake.root(), &["setup", "reset", "02:00.0", "--dry-run"]);
    assert!(out.status.success(), "{out:?}");
    assert!(
        stdout(&out)
            .starts_with("nvme: not loaded\n  modprobe nvme\n0000:02:00.0: vfio-pci -> nvme\n"),
        "{}",
        stdout(&out)
    );
}

#[test]
fn reset_gives_drives_back_to_nvme() {
    let fake = server();
    let out = usnvme(fake.root(), &["setup", "reset", "02:00.0", "01:00.0"]);
    assert!(out.status.success(), "{out:?}");
    assert_eq!(
        stdout(&out),
        "0000:01:00.0: already on nvme\n0000:02:00.0: vfio-pci -> nvme\n"
    );
    // The override is cleared (as `echo > driver_override` does), then the kernel reprobes.
    assert_eq!(
        read(&fake, &format!("{DEV}/0000:02:00.0/driver_override")),
        "\n"
    );
    assert_eq!(
        read(&fake, "sys/bus/pci/drivers/vfio-pci/unbind"),
        "0000:02:00.0\n"
    );
    assert_eq!(read(&fake, "sys/bus/pci/drivers_probe"), "0000:02:00.0\n");
    assert_eq!(read(&fake, "sys/bus/pci/drivers/nvme/unbind"), "");
}

#[test]
fn reset_refuses_a_drive_a_process_has_open() {
    let fake = server();
    fake.open_file(4242, "usnvme", 7, "/dev/vfio/2");
    fake.open_file(4243, "bash", 0, "/dev/pts/0");
    refused(
        &fake,
        &["setup", "reset", "02:00.0"],
        "refusing 0000:02:00.0: usnvme (pid 4242) has /dev/vfio/2 open: stop it first",
    );
    // `reset all` leaves it and says why.
    let out = usnvme(fake.root(), &["setup", "reset", "all"]);
    assert!(out.status.success(), "{out:?}");
    assert!(
        stdout(&out)
            .contains("0000:02:00.0: left on vfio-pci: usnvme (pid 4242) has /dev/vfio/2 open"),
        "{}",
        stdout(&out)
    );
}

#[test]
fn reset_refuses_a_drive_naming_the_owner_its_lock_names() {
    let fake = server();
    fake.open_file(4242, "usnvme", 7, "/dev/vfio/2");
    // The owner's lock, held (by this test) in the root's lock folder, naming usnvme perf.
    let addr = "0000:02:00.0".parse().expect("address");
    let lock = OwnerLock::acquire_in(&fake.root().join("run/usnvme"), addr).expect("lock");
    fs::write(lock.path(), "4242 usnvme perf -t 60 -r 02:00.0\n").expect("owner line");
    let says = "in use by usnvme PID 4242 (usnvme perf -t 60 -r 02:00.0): stop it first";
    refused(
        &fake,
        &["setup", "reset", "02:00.0"],
        &format!("usnvme: error: refusing 0000:02:00.0: {says}"),
    );
    let out = usnvme(fake.root(), &["setup", "reset", "all"]);
    assert!(out.status.success(), "{out:?}");
    assert!(
        stdout(&out).contains(&format!("0000:02:00.0: left on vfio-pci: {says}")),
        "{}",
        stdout(&out)
    );

    // A lock nobody holds names nobody (its owner was killed): back to who has the group open.
    drop(lock);
    fs::write(
        fake.root().join("run/usnvme/0000:02:00.0.lock"),
        "4242 usnvme perf -t 60 -r 02:00.0\n",
    )
    .expect("a stale line");
    refused(
        &fake,
        &["setup", "reset", "02:00.0"],
        "refusing 0000:02:00.0: usnvme (pid 4242) has /dev/vfio/2 open: stop it first",
    );
}

#[test]
fn hugepages_are_reserved_per_node_and_checked() {
    let fake = server();
    fake.mkdir("sys/devices/system/node/node1");
    fake.hugepages(Some(1), 2048, 0, 0);
    fake.write("proc/self/mounts", "proc /proc proc rw 0 0\n");
    let out = usnvme(fake.root(), &["setup", "--hugepages", "4G,node=1"]);
    assert!(out.status.success(), "{out:?}");
    let text = stdout(&out);
    assert!(
        text.starts_with(
            "hugepages on node 1: 0 -> 2048 × 2M\nhugetlbfs: not mounted -> /dev/hugepages\n"
        ),
        "{text}"
    );
    assert_eq!(
        read(
            &fake,
            "sys/devices/system/node/node1/hugepages/hugepages-2048kB/nr_hugepages"
        ),
        "2048\n"
    );
    // Then the status: the table and the system's side.
    assert!(text.contains("\nBDF "), "{text}");
    assert!(
        text.contains("node 0: 512 × 2M (512 free), node 1: 2048 × 2M (0 free)"),
        "{text}"
    );

    // The global pool; and again: nothing to do.
    let out = usnvme(fake.root(), &["setup", "--hugepages", "1G", "--dry-run"]);
    assert!(
        stdout(&out).starts_with("hugepages: already 512 × 2M\n"),
        "{}",
        stdout(&out)
    );
    let out = usnvme(fake.root(), &["setup", "--hugepages", "2G"]);
    assert!(out.status.success(), "{out:?}");
    assert_eq!(
        read(
            &fake,
            "sys/kernel/mm/hugepages/hugepages-2048kB/nr_hugepages"
        ),
        "1024\n"
    );

    refused(
        &fake,
        &["setup", "--hugepages", "2G,node=3", "bind", "01:00.0"],
        "--hugepages: NUMA node 3 does not exist (this machine has node 0, 1)",
    );
    refused(
        &fake,
        &["setup", "--hugepages", "2G,size=1G"],
        "--hugepages: the kernel offers no 1G hugepages (no /sys/kernel/mm/hugepages/hugepages-1048576kB/nr_hugepages)",
    );
}

#[test]
fn no_hugepages_is_an_error_for_hugepages_and_a_warning_for_bind() {
    let fake = server();
    fs::remove_dir_all(fake.root().join("sys/kernel/mm/hugepages")).expect("rm");
    fs::remove_dir_all(fake.root().join("sys/devices/system/node/node0/hugepages")).expect("rm");
    refused(
        &fake,
        &["setup", "--hugepages", "2G"],
        "--hugepages: the kernel offers no 2M hugepages",
    );
    let out = usnvme(fake.root(), &["setup", "bind", "01:00.0"]);
    assert!(out.status.success(), "{out:?}");
    assert_eq!(
        stderr(&out),
        "usnvme: warning: no hugepages are reserved and usnvme needs them for DMA memory: run \
         `usnvme setup --hugepages 2G` (add ,node=N per NUMA node of the drives)\n"
    );
    let status = stdout(&usnvme(fake.root(), &["setup"]));
    assert!(
        status.contains("none reserved: run `usnvme setup --hugepages 2G`"),
        "{status}"
    );
}

#[test]
fn memlock_below_the_hugepages_is_a_warning_with_the_fix() {
    let fake = server();
    fake.memlock(Some(64 << 10));
    let out = usnvme(fake.root(), &["setup", "bind", "01:00.0", "--dry-run"]);
    assert!(out.status.success(), "{out:?}");
    let err = stderr(&out);
    assert_eq!(err.lines().count(), 1, "{err}");
    assert!(
        err.starts_with("usnvme: warning: RLIMIT_MEMLOCK is 64 KiB, below the 1 GiB of hugepages"),
        "{err}"
    );
    assert!(err.contains("run `ulimit -l unlimited`"), "{err}");
    let status = stdout(&usnvme(fake.root(), &["setup", "status"]));
    assert!(status.contains("memlock:    64 KiB"), "{status}");
}

#[test]
fn status_shows_drives_iommu_hugepages_and_memlock() {
    let fake = server();
    let out = usnvme(fake.root(), &["setup", "status"]);
    assert!(out.status.success(), "{out:?}");
    let text = stdout(&out);
    let list = stdout(&usnvme(fake.root(), &["list"]));
    assert!(text.starts_with(&list), "{text}");
    let tail = &text[list.len()..];
    assert_eq!(
        tail,
        "
IOMMU:      on (dmar0, 4 groups)
vfio-pci:   loaded
hugepages:  node 0: 512 × 2M (512 free)
hugetlbfs:  /dev/hugepages
memlock:    unlimited
"
    );
}
