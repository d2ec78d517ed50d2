//! The kernel block devices on NVMe controllers bound to `nvme` (namespaces, with their
//! partitions and native multipath heads), and whether they are mounted, active swap, or held by
//! LVM/md/dm.
//!
//! Used by `usnvme list` (its BLOCK DEVICES column, also shown by `usnvme setup status`, and the
//! `block_devices` of `--json`) and by `usnvme setup bind` (which refuses drives in use). Like the driver's PCI discovery, it reads
//! `sys/` and `proc/` under a root directory (`/`, or a fake tree in tests), and whatever is
//! missing or unreadable counts as absent or unused rather than failing the command.

use std::fs;
use std::path::{Path, PathBuf};

use serde::Serialize;
use usnvme_driver::pci::{attr, dir_names, natural_cmp};

/// A kernel block device on a controller (a namespace such as `nvme0n1`) and whether it is used.
/// Serialized as an element of the `block_devices` array of `usnvme list --json`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct BlockDeviceInfo {
    /// The kernel name, e.g. `nvme0n1`.
    pub name: String,
    /// Its size in bytes (`size` counts 512-byte sectors whatever the LBA size); `None` if unreadable.
    pub size_bytes: Option<u64>,
    /// Its partitions, e.g. `nvme0n1p1`.
    pub partitions: Vec<String>,
    /// Where it or one of its partitions is mounted.
    pub mounted_at: Vec<String>,
    /// Whether it or one of its partitions is active swap.
    pub swap: bool,
    /// The devices stacked on it or its partitions (LVM/dm, md), e.g. `dm-0`.
    pub holders: Vec<String>,
}

/// A mount, from `/proc/self/mounts` or `/proc/self/mountinfo`.
#[derive(Debug)]
struct Mount {
    /// The kernel name of the source device, when it is one (`nvme0n1p1`).
    source: Option<String>,
    /// Its `major:minor` (mountinfo only): catches `/dev/root` and other unhelpful names.
    devno: Option<String>,
    target: String,
}

/// A disk in `sys/block` and the sysfs directories that tie it to a PCI device.
#[derive(Debug)]
struct Disk {
    name: String,
    /// Its canonical directory, its `device` link, and the paths of a multipath head.
    anchors: Vec<PathBuf>,
}

/// What is needed to tell which block devices sit on a controller and whether they are in use:
/// `sys/block`, the mounts and the swap areas, read once per command by [`UsageScan::new`], then
/// asked about each controller with [`UsageScan::block_devices_of`].
#[derive(Debug)]
pub struct UsageScan {
    block_dir: PathBuf,
    disks: Vec<Disk>,
    mounts: Vec<Mount>,
    swaps: Vec<String>,
}

impl UsageScan {
    /// Reads `sys/block`, `proc/self/mounts`, `proc/self/mountinfo` and `proc/swaps` under
    /// `root`; what cannot be read is taken as empty.
    pub fn new(root: &Path) -> Self {
        let block_dir = root.join("sys/block");
        let names = dir_names(&block_dir);
        // The per-path devices of native NVMe multipath (nvme0c0n1) are hidden: not usable, and
        // their head (nvme0n1) is what gets mounted.
        let (paths, disks): (Vec<String>, Vec<String>) = names.into_iter().partition(|name| {
            nvme_path_head(name).is_some()
                || attr(&block_dir.join(name), "hidden").as_deref() == Some("1")
        });
        let disks = disks
            .into_iter()
            .map(|name| {
                let dir = block_dir.join(&name);
                let mut anchors: Vec<PathBuf> = [dir.clone(), dir.join("device")]
                    .iter()
                    .filter_map(|p| fs::canonicalize(p).ok())
                    .collect();
                // A multipath head lives under the virtual nvme-subsystem; its path devices
                // (listed in its `multipath` folder since Linux 6.x, named after it always:
                // nvme0c1n1 is a path of nvme0n1) lie under the controllers.
                let multipath = dir.join("multipath");
                let path_dirs = dir_names(&multipath)
                    .into_iter()
                    .map(|p| multipath.join(p))
                    .chain(
                        paths
                            .iter()
                            .filter(|p| nvme_path_head(p).as_deref() == Some(name.as_str()))
                            .map(|p| block_dir.join(p)),
                    );
                anchors.extend(path_dirs.filter_map(|p| fs::canonicalize(p).ok()));
                Disk { name, anchors }
            })
            .collect();
        let mut mounts = parse_mounts(root, &read_optional(&root.join("proc/self/mounts")));
        mounts.extend(parse_mountinfo(&read_optional(
            &root.join("proc/self/mountinfo"),
        )));
        let swaps = parse_swaps(root, &read_optional(&root.join("proc/swaps")));
        Self {
            block_dir,
            disks,
            mounts,
            swaps,
        }
    }

    /// The block devices whose sysfs paths lie under the PCI device directory `device_dir`
    /// (see [`usnvme_driver::pci::Sysfs::pci_device_path`]), in natural order (`nvme0n2` before
    /// `nvme0n10`); none for a controller that is not bound to `nvme`.
    pub fn block_devices_of(&self, device_dir: &Path) -> Vec<BlockDeviceInfo> {
        let Ok(device_dir) = fs::canonicalize(device_dir) else {
            return Vec::new();
        };
        self.disks
            .iter()
            .filter(|disk| disk.anchors.iter().any(|a| a.starts_with(&device_dir)))
            .map(|disk| self.describe(&disk.name))
            .collect()
    }

    fn describe(&self, name: &str) -> BlockDeviceInfo {
        let dir = self.block_dir.join(name);
        let partitions: Vec<String> = dir_names(&dir)
            .into_iter()
            .filter(|p| dir.join(p).join("partition").exists())
            .collect();
        // The disk and its partitions: a use of any of them is a use of the disk.
        let mut names = vec![name.to_owned()];
        names.extend(partitions.iter().cloned());
        let dirs: Vec<PathBuf> = std::iter::once(dir.clone())
            .chain(partitions.iter().map(|p| dir.join(p)))
            .collect();
        let devnos: Vec<String> = dirs.iter().filter_map(|d| attr(d, "dev")).collect();
        let mut holders: Vec<String> = dirs
            .iter()
            .flat_map(|d| dir_names(&d.join("holders")))
            .collect();
        holders.sort_by(|a, b| natural_cmp(a, b));
        holders.dedup();
        let mut mounted_at: Vec<String> = Vec::new();
        for mount in &self.mounts {
            let by_name = mount.source.as_ref().is_some_and(|s| names.contains(s));
            let by_devno = mount.devno.as_ref().is_some_and(|d| devnos.contains(d));
            if (by_name || by_devno) && !mounted_at.contains(&mount.target) {
                mounted_at.push(mount.target.clone());
            }
        }
        BlockDeviceInfo {
            name: name.to_owned(),
            size_bytes: attr(&dir, "size")
                .and_then(|s| s.parse::<u64>().ok())
                .and_then(|sectors| sectors.checked_mul(512)),
            partitions,
            mounted_at,
            swap: self.swaps.iter().any(|s| names.contains(s)),
            holders,
        }
    }
}

/// The head `nvme<subsys>n<ns>` of `nvme<subsys>c<ctrl>n<ns>`, a hidden path device of native
/// NVMe multipath; `None` for any other name.
fn nvme_path_head(name: &str) -> Option<String> {
    let digits = |s: &str| !s.is_empty() && s.bytes().all(|b| b.is_ascii_digit());
    let (subsys, rest) = name.strip_prefix("nvme")?.split_once('c')?;
    let (ctrl, ns) = rest.split_once('n')?;
    (digits(subsys) && digits(ctrl) && digits(ns)).then(|| format!("nvme{subsys}n{ns}"))
}

/// A file under /proc; empty if missing or unreadable (then nothing counts as mounted).
fn read_optional(path: &Path) -> String {
    fs::read_to_string(path).unwrap_or_else(|e| {
        log::debug!("cannot read {}: {e}", path.display());
        String::new()
    })
}

/// Decodes the octal escapes (`\040` for a space) that /proc uses in paths.
fn unescape_octal(s: &str) -> String {
    let bytes = s.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        let code = match bytes.get(i..i + 4) {
            Some([b'\\', digits @ ..]) if digits.iter().all(|d| (b'0'..=b'7').contains(d)) => {
                std::str::from_utf8(digits)
                    .ok()
                    .and_then(|d| u8::from_str_radix(d, 8).ok())
            }
            _ => None,
        };
        match code {
            Some(code) => {
                out.push(code);
                i += 4;
            }
            None => {
                out.push(bytes[i]);
                i += 1;
            }
        }
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// The kernel name of the device a /proc path names: `/dev/nvme0n1p1` gives `nvme0n1p1`;
/// symlinks (`/dev/disk/by-uuid/...`, `/dev/mapper/...`) are followed under `root`.
fn device_name(root: &Path, path: &str) -> Option<String> {
    let rel = path.strip_prefix("/dev/")?;
    let dev_dir = fs::canonicalize(root.join("dev")).ok();
    if let (Ok(target), Some(dev_dir)) = (fs::canonicalize(root.join("dev").join(rel)), dev_dir) {
        if target.parent() == Some(dev_dir.as_path()) {
            return target.file_name()?.to_str().map(str::to_owned);
        }
    }
    (!rel.contains('/')).then(|| rel.to_owned())
}

fn parse_mounts(root: &Path, text: &str) -> Vec<Mount> {
    text.lines()
        .filter_map(|line| {
            let mut fields = line.split_whitespace();
            let source = unescape_octal(fields.next()?);
            let target = unescape_octal(fields.next()?);
            Some(Mount {
                source: device_name(root, &source),
                devno: None,
                target,
            })
        })
        .collect()
}

fn parse_mountinfo(text: &str) -> Vec<Mount> {
    // `36 35 98:0 /mnt1 /mnt/parent rw,noatime master:1 - ext3 /dev/root rw`
    text.lines()
        .filter_map(|line| {
            let fields: Vec<&str> = line.split_whitespace().collect();
            let devno = fields.get(2)?;
            let target = fields.get(4)?;
            Some(Mount {
                source: None,
                devno: Some((*devno).to_owned()),
                target: unescape_octal(target),
            })
        })
        .collect()
}

fn parse_swaps(root: &Path, text: &str) -> Vec<String> {
    // `Filename  Type  Size  Used  Priority` then one line per swap area.
    text.lines()
        .skip(1)
        .filter_map(|line| line.split_whitespace().next())
        .filter_map(|path| device_name(root, &unescape_octal(path)))
        .collect()
}

#[cfg(test)]
mod tests {
    use usnvme_driver::pci::fake::FakeSysfs;

    use super::*;

    /// The block devices of the PCI devices at `addresses`, from one scan of the tree, as the
    /// commands ask.
    fn block_devices(fake: &FakeSysfs, addresses: &[&str]) -> Vec<Vec<BlockDeviceInfo>> {
        let scan = UsageScan::new(fake.root());
        let sysfs = fake.sysfs();
        addresses
            .iter()
            .map(|a| {
                let address = a.parse().expect("valid address");
                scan.block_devices_of(&sysfs.pci_device_path(address))
            })
            .collect()
    }

    /// Whether unbinding the controller would pull the disk out from under something.
    fn in_use(b: &BlockDeviceInfo) -> bool {
        !b.mounted_at.is_empty() || b.swap || !b.holders.is_empty()
    }

    #[test]
    fn block_devices_and_their_use() {
        let fake = FakeSysfs::new();
        fake.add_nvme_controller("0000:01:00.0")
            .bind("nvme")
            .namespace("nvme0", "nvme0n1", 2_000_000, "259:0")
            .namespace("nvme0", "nvme0n2", 1000, "259:1")
            .namespace("nvme0", "nvme0n10", 1000, "259:2")
            .namespace("nvme0", "nvme0n3", 1000, "259:3")
            .namespace("nvme0", "nvme0n4", 1000, "259:4");
        fake.add_nvme_controller("0000:02:00.0")
            .bind("nvme")
            .namespace("nvme1", "nvme1n1", 1000, "259:9");
        fake.add_nvme_controller("0000:03:00.0").bind("vfio-pci");
        // nvme0n1p1 mounted (escaped space), nvme0n1p2 held by dm-0, nvme0n2 swap, nvme0n3 the
        // root filesystem seen as /dev/root, nvme0n10 and nvme0n4 idle, nvme1n1 mounted via a
        // /dev/disk/by-uuid symlink.
        fake.add_partition("nvme0n1", "nvme0n1p1", "259:5");
        fake.add_partition("nvme0n1", "nvme0n1p2", "259:6");
        fake.add_holder("nvme0n1/nvme0n1p2", "dm-0");
        fake.mkdir("dev/disk/by-uuid");
        fake.write("dev/nvme1n1", "");
        fake.symlink("dev/disk/by-uuid/1234", "dev/nvme1n1");
        fake.write(
            "proc/self/mounts",
            "sysfs /sys sysfs rw 0 0\n\
             /dev/nvme0n1p1 /mnt/my\\040data ext4 rw 0 0\n\
             /dev/root / ext4 rw 0 0\n\
             /dev/disk/by-uuid/1234 /srv xfs rw 0 0\n\
             /dev/nvme0n10000 /elsewhere ext4 rw 0 0\n",
        );
        fake.write(
            "proc/self/mountinfo",
            "22 1 259:3 / / rw,relatime - ext4 /dev/root rw\n\
             23 22 0:21 / /sys rw - sysfs sysfs rw\n",
        );
        fake.write(
            "proc/swaps",
            "Filename\t\t\t\tType\t\tSize\t\tUsed\t\tPriority\n\
             /dev/nvme0n2                            partition\t499996\t\t0\t\t-2\n",
        );
        let list = block_devices(&fake, &["0000:01:00.0", "0000:02:00.0", "0000:03:00.0"]);
        let c0 = &list[0];
        let names: Vec<&str> = c0.iter().map(|b| b.name.as_str()).collect();
        assert_eq!(
            names,
            ["nvme0n1", "nvme0n2", "nvme0n3", "nvme0n4", "nvme0n10"]
        );
        let [n1, n2, n3, n4, n10] = &c0[..] else {
            panic!("5 namespaces expected");
        };
        assert_eq!(n1.size_bytes, Some(2_000_000 * 512));
        assert_eq!(n1.partitions, ["nvme0n1p1", "nvme0n1p2"]);
        assert_eq!(n1.mounted_at, ["/mnt/my data"]);
        assert_eq!(n1.holders, ["dm-0"]);
        assert!(!n1.swap && in_use(n1));
        assert!(n2.swap && n2.mounted_at.is_empty() && n2.holders.is_empty() && in_use(n2));
        assert_eq!(n3.mounted_at, ["/"]);
        assert!(!in_use(n4) && !in_use(n10));
        assert_eq!(list[1].len(), 1);
        assert_eq!(list[1][0].mounted_at, ["/srv"]);
        assert!(list[2].is_empty());
        // A device that is not there has none.
        assert!(block_devices(&fake, &["0000:09:00.0"])[0].is_empty());
    }

    #[test]
    fn multipath_head_belongs_to_its_controllers() {
        let fake = FakeSysfs::new();
        let ctrl = fake.add_nvme_controller("0000:01:00.0").bind("nvme");
        // Native multipath: the head nvme0n1 lives under the virtual subsystem, the hidden path
        // device nvme0c0n1 under the controller.
        let path_dir = ctrl.dir().join("nvme/nvme0/nvme0c0n1");
        fake.write(path_dir.join("size"), "1000\n");
        fake.symlink("sys/block/nvme0c0n1", &path_dir);
        let head = "sys/devices/virtual/nvme-subsystem/nvme-subsys0/nvme0n1";
        fake.write(format!("{head}/size"), "1000\n");
        fake.symlink(format!("{head}/multipath/nvme0c0n1"), &path_dir);
        fake.symlink("sys/block/nvme0n1", head);
        // Linux 6.1 (the guest's): no `multipath` folder in the head; only the names tie the
        // head nvme1n2 to its path nvme1c1n2 on the second controller.
        let ctrl = fake.add_nvme_controller("0000:02:00.0").bind("nvme");
        let path_dir = ctrl.dir().join("nvme/nvme1/nvme1c1n2");
        fake.write(path_dir.join("size"), "1000\n");
        fake.symlink("sys/block/nvme1c1n2", &path_dir);
        let head = "sys/devices/virtual/nvme-subsystem/nvme-subsys1/nvme1n2";
        fake.write(format!("{head}/size"), "1000\n");
        fake.symlink("sys/block/nvme1n2", head);
        fake.add_nvme_controller("0000:03:00.0").bind("nvme");
        let list = block_devices(&fake, &["0000:01:00.0", "0000:02:00.0", "0000:03:00.0"]);
        let names = |i: usize| -> Vec<&str> { list[i].iter().map(|b| b.name.as_str()).collect() };
        assert_eq!(names(0), ["nvme0n1"]);
        assert_eq!(names(1), ["nvme1n2"]);
        assert!(list[2].is_empty());
        assert_eq!(nvme_path_head("nvme12c3n45").as_deref(), Some("nvme12n45"));
        assert_eq!(nvme_path_head("nvme0n1"), None);
        assert_eq!(nvme_path_head("nvmecn1"), None);
        assert_eq!(nvme_path_head("nvme0c0n"), None);
    }

    #[test]
    fn octal_escapes() {
        assert_eq!(unescape_octal(r"/a\040b\011c\134d\08"), "/a b\tc\\d\\08");
        assert_eq!(unescape_octal(r"end\04"), r"end\04");
    }
}
