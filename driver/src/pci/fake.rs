//! A fake sysfs/procfs tree in a temporary directory, laid out as the kernel does (device
//! directories under `sys/devices`, symlinks from `sys/bus/pci/devices`, `driver` and
//! `iommu_group` links, namespaces under `nvme/nvmeX/`, `sys/block` links), for the tests of
//! this crate and, with the `fake-sysfs` feature, of the crates above it. Setup failures panic:
//! it is a test fixture. The tree is removed on drop.

use std::fs;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{SystemTime, UNIX_EPOCH};

use super::Sysfs;

/// A fake root directory: pass [`FakeSysfs::root`] (or [`FakeSysfs::sysfs`]) to the code
/// under test.
#[derive(Debug)]
pub struct FakeSysfs {
    root: PathBuf,
}

impl Default for FakeSysfs {
    fn default() -> Self {
        Self::new()
    }
}

impl Drop for FakeSysfs {
    fn drop(&mut self) {
        let _ = fs::remove_dir_all(&self.root);
    }
}

impl FakeSysfs {
    /// An empty root in a fresh directory under [`std::env::temp_dir`].
    pub fn new() -> Self {
        static NEXT: AtomicU64 = AtomicU64::new(0);
        let n = NEXT.fetch_add(1, Ordering::Relaxed);
        let nanos = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0, |d| d.subsec_nanos());
        let root = std::env::temp_dir().join(format!(
            "usnvme-fake-sysfs-{}-{n}-{nanos}",
            std::process::id()
        ));
        let _ = fs::remove_dir_all(&root);
        fs::create_dir_all(&root).expect("create the fake sysfs root");
        Self { root }
    }

    /// The root directory.
    pub fn root(&self) -> &Path {
        &self.root
    }

    /// A [`Sysfs`] reading this tree.
    pub fn sysfs(&self) -> Sysfs {
        Sysfs::with_root(&self.root)
    }

    /// Creates the directory `rel` (relative to the root) and its parents.
    pub fn mkdir(&self, rel: impl AsRef<Path>) {
        let path = self.root.join(rel);
        fs::create_dir_all(&path).unwrap_or_else(|e| panic!("mkdir {}: {e}", path.display()));
    }

    /// Writes `contents` to the file `rel`, creating its directory.
    pub fn write(&self, rel: impl AsRef<Path>, contents: &str) {
        let path = self.root.join(rel);
        if let Some(parent) = path.parent() {
            fs::create_dir_all(parent)
                .unwrap_or_else(|e| panic!("mkdir {}: {e}", parent.display()));
        }
        fs::write(&path, contents).unwrap_or_else(|e| panic!("write {}: {e}", path.display()));
    }

    /// Makes `link` a symlink to `target` (both relative to the root), creating the
    /// directory of `link`.
    pub fn symlink(&self, link: impl AsRef<Path>, target: impl AsRef<Path>) {
        let link = self.root.join(link);
        if let Some(parent) = link.parent() {
            fs::create_dir_all(parent)
                .unwrap_or_else(|e| panic!("mkdir {}: {e}", parent.display()));
        }
        std::os::unix::fs::symlink(self.root.join(target), &link)
            .unwrap_or_else(|e| panic!("symlink {}: {e}", link.display()));
    }

    /// Adds the PCI device `address` with its `class`, `vendor` and `device` attributes,
    /// unbound, without NUMA node, IOMMU group or link attributes.
    pub fn add_pci_device(
        &self,
        address: &str,
        class: u32,
        vendor: u16,
        device: u16,
    ) -> FakeDevice<'_> {
        let dir = PathBuf::from("sys/devices/pci0000:00").join(address);
        self.write(dir.join("class"), &format!("{class:#08x}\n"));
        self.write(dir.join("vendor"), &format!("{vendor:#06x}\n"));
        self.write(dir.join("device"), &format!("{device:#06x}\n"));
        // What the kernel shows before any override; `usnvme setup` writes it.
        self.write(dir.join("driver_override"), "(null)\n");
        self.symlink(format!("sys/bus/pci/devices/{address}"), &dir);
        self.write_if_absent("sys/bus/pci/drivers_probe");
        FakeDevice {
            fake: self,
            dir,
            address: address.to_owned(),
        }
    }

    /// Adds an NVMe controller (class `0x010802`, QEMU's vendor and device IDs): see
    /// [`Self::add_pci_device`].
    pub fn add_nvme_controller(&self, address: &str) -> FakeDevice<'_> {
        self.add_pci_device(address, 0x010802, 0x1b36, 0x0010)
    }

    /// Adds the partition `part` (`major:minor` `devno`) to the disk `disk` of `sys/block`.
    pub fn add_partition(&self, disk: &str, part: &str, devno: &str) {
        let dir = PathBuf::from("sys/block").join(disk).join(part);
        self.write(dir.join("partition"), "1\n");
        self.write(dir.join("dev"), &format!("{devno}\n"));
        self.write(dir.join("size"), "2048\n");
        self.mkdir(dir.join("holders"));
    }

    /// Writes an empty file `rel` unless it exists (a sysfs trigger file such as `unbind`).
    fn write_if_absent(&self, rel: impl AsRef<Path>) {
        if fs::symlink_metadata(self.root.join(rel.as_ref())).is_err() {
            self.write(rel, "");
        }
    }

    /// Adds the PCI driver `name` (`sys/bus/pci/drivers/<name>` with its `bind` and `unbind`
    /// files), as loading its module does.
    pub fn add_driver(&self, name: &str) {
        let dir = PathBuf::from("sys/bus/pci/drivers").join(name);
        self.write_if_absent(dir.join("bind"));
        self.write_if_absent(dir.join("unbind"));
    }

    /// Adds the IOMMU unit `name` (e.g. `dmar0`) to `sys/class/iommu`.
    pub fn add_iommu(&self, name: &str) {
        self.mkdir(format!("sys/class/iommu/{name}"));
    }

    /// Sets the pool of hugepages of `page_kb` KiB (2048, 1048576) on `node` (`None`: the global
    /// pool of `sys/kernel/mm/hugepages`): `nr_hugepages` and `free_hugepages`.
    pub fn hugepages(&self, node: Option<u32>, page_kb: u64, total: u64, free: u64) {
        let dir = match node {
            Some(n) => format!("sys/devices/system/node/node{n}/hugepages/hugepages-{page_kb}kB"),
            None => format!("sys/kernel/mm/hugepages/hugepages-{page_kb}kB"),
        };
        self.write(format!("{dir}/nr_hugepages"), &format!("{total}\n"));
        self.write(format!("{dir}/free_hugepages"), &format!("{free}\n"));
    }

    /// Makes `proc/self/status` say that the process runs with effective user ID `uid`.
    pub fn euid(&self, uid: u32) {
        self.write(
            "proc/self/status",
            &format!("Name:\tusnvme\nUid:\t{uid}\t{uid}\t{uid}\t{uid}\nGid:\t0\t0\t0\t0\n"),
        );
    }

    /// Makes `proc/self/limits` give RLIMIT_MEMLOCK `bytes` (`None`: unlimited).
    pub fn memlock(&self, bytes: Option<u64>) {
        let value = bytes.map_or_else(|| "unlimited".to_owned(), |b| b.to_string());
        self.write(
            "proc/self/limits",
            &format!(
                "Limit                     Soft Limit           Hard Limit           Units     \n\
                 Max open files            1024                 1048576              files     \n\
                 Max locked memory         {value:<20} {value:<20} bytes     \n"
            ),
        );
    }

    /// Gives process `pid` (named `comm`) the open file `fd` on `target`, an absolute path
    /// outside the fake tree, e.g. `/dev/vfio/12`.
    pub fn open_file(&self, pid: u32, comm: &str, fd: u32, target: &str) {
        self.write(format!("proc/{pid}/comm"), &format!("{comm}\n"));
        let link = self.root.join(format!("proc/{pid}/fd/{fd}"));
        if let Some(parent) = link.parent() {
            fs::create_dir_all(parent)
                .unwrap_or_else(|e| panic!("mkdir {}: {e}", parent.display()));
        }
        std::os::unix::fs::symlink(target, &link)
            .unwrap_or_else(|e| panic!("symlink {}: {e}", link.display()));
    }

    /// Stacks the device-mapper device `holder` (e.g. `dm-0`, named `dm_name`, with the
    /// `dm/uuid` `dm_uuid`: `LVM-...` for LVM) on `block`, see [`Self::add_holder`], and
    /// lists it in `sys/block`.
    pub fn add_dm_holder(&self, block: &str, holder: &str, dm_name: &str, dm_uuid: &str) {
        self.add_holder(block, holder);
        let dir = format!("sys/devices/virtual/block/{holder}");
        self.write(format!("{dir}/dm/name"), &format!("{dm_name}\n"));
        self.write(format!("{dir}/dm/uuid"), &format!("{dm_uuid}\n"));
        if fs::symlink_metadata(self.root.join(format!("sys/block/{holder}"))).is_err() {
            self.symlink(format!("sys/block/{holder}"), dir);
        }
    }

    /// Stacks `holder` (e.g. `dm-0`) on the block device at `block` (a disk of `sys/block`
    /// or `disk/partition`).
    pub fn add_holder(&self, block: &str, holder: &str) {
        let holder_dir = format!("sys/devices/virtual/block/{holder}");
        self.mkdir(&holder_dir);
        self.symlink(format!("sys/block/{block}/holders/{holder}"), holder_dir);
    }
}

/// A PCI device of a [`FakeSysfs`], to configure further.
#[derive(Debug)]
pub struct FakeDevice<'a> {
    fake: &'a FakeSysfs,
    dir: PathBuf,
    address: String,
}

impl FakeDevice<'_> {
    /// The device's directory, relative to the root.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// Writes the attribute `name`.
    pub fn attr(self, name: &str, value: &str) -> Self {
        self.fake.write(self.dir.join(name), &format!("{value}\n"));
        self
    }

    /// Binds it to `driver`.
    pub fn bind(self, driver: &str) -> Self {
        let driver_dir = format!("sys/bus/pci/drivers/{driver}");
        self.fake.add_driver(driver);
        self.fake.symlink(self.dir.join("driver"), driver_dir);
        self
    }

    /// Sets `numa_node` (e.g. `"1"`, or `"-1"` for unknown).
    pub fn numa_node(self, node: &str) -> Self {
        self.attr("numa_node", node)
    }

    /// Puts it in IOMMU group `group`.
    pub fn iommu_group(self, group: u32) -> Self {
        let group_dir = format!("sys/kernel/iommu_groups/{group}");
        self.fake
            .symlink(format!("{group_dir}/devices/{}", self.address), &self.dir);
        self.fake.symlink(self.dir.join("iommu_group"), group_dir);
        self
    }

    /// Sets the link attributes, e.g. `("16.0 GT/s PCIe", "4", "32.0 GT/s PCIe", "4")`.
    pub fn link(
        self,
        current_speed: &str,
        current_width: &str,
        max_speed: &str,
        max_width: &str,
    ) -> Self {
        self.attr("current_link_speed", current_speed)
            .attr("current_link_width", current_width)
            .attr("max_link_speed", max_speed)
            .attr("max_link_width", max_width)
    }

    /// Adds the namespace block device `name` (`major:minor` `devno`, `sectors` of 512
    /// bytes) to the kernel controller `ctrl` (e.g. `nvme0`) of this device, linked from
    /// `sys/block/<name>` and `sys/class/nvme/<ctrl>`.
    pub fn namespace(self, ctrl: &str, name: &str, sectors: u64, devno: &str) -> Self {
        let ctrl_dir = self.dir.join("nvme").join(ctrl);
        let ns_dir = ctrl_dir.join(name);
        self.fake
            .write(ns_dir.join("size"), &format!("{sectors}\n"));
        self.fake.write(ns_dir.join("dev"), &format!("{devno}\n"));
        self.fake.mkdir(ns_dir.join("holders"));
        self.fake.symlink(ns_dir.join("device"), &ctrl_dir);
        self.fake.symlink(format!("sys/block/{name}"), &ns_dir);
        let class_link = format!("sys/class/nvme/{ctrl}");
        if fs::symlink_metadata(self.fake.root.join(&class_link)).is_err() {
            self.fake.symlink(class_link, &ctrl_dir);
        }
        self
    }
}
