//! Kernel module dependency order for the guest's initramfs, read from each module's `.modinfo`
//! (`depends=` and `softdep=pre:`), since the Debian package ships no `modules.dep` and busybox
//! `insmod` resolves nothing.

use std::collections::HashMap;
use std::io::Read;
use std::path::{Path, PathBuf};

use anyhow::{bail, Context, Result};

/// Modules the guest needs, besides what they depend on. Order is kept for equal depth.
pub const WANTED: &[&str] = &[
    // crypto providers that crc-t10dif / crc64-rocksoft look up at init (soft dependencies)
    "crct10dif_generic",
    "crc64_rocksoft_generic",
    "vfio_iommu_type1",
    "vfio_pci",
    "virtio_pci",
    "9pnet_virtio",
    "9p",
    // last: loaded by /init only when some drives stay on the kernel driver
    "nvme",
    // NVMe/TCP, loaded by /init after the drives are bound: the kernel's initiator and target
    // (the fabric tests' counterparts), and the CRC32C they use for digests
    "crc32c_intel",
    "crc32c_generic",
    "nvme_fabrics",
    "nvme_tcp",
    "nvmet",
    "nvmet_tcp",
    // NVMe over RDMA on soft-RoCE: the RDMA core and its user-space interfaces (rdma-core's
    // libibverbs and librdmacm in the guest), rxe with the "crc32" hash it computes each packet's
    // ICRC with (rxe fails to add a device without it; the guest has no modprobe), the kernel's
    // initiator and target, and `dummy`, the netdev rxe runs on (no wire: nothing leaves the guest)
    "crc32_generic",
    "ib_core",
    "ib_uverbs",
    "iw_cm",
    "rdma_cm",
    "rdma_ucm",
    "rdma_rxe",
    "dummy",
    "nvme_rdma",
    "nvmet_rdma",
];

/// Modules without which the guest cannot work at all.
const REQUIRED: &[&str] = &[
    "vfio_iommu_type1",
    "vfio_pci",
    "virtio_pci",
    "9pnet_virtio",
    "9p",
];

/// Module names treat '-' and '_' alike.
fn canonical(name: &str) -> String {
    name.replace('-', "_")
}

/// The module files under `kernel_dir` (`lib/modules/VER/kernel`) by canonical name.
pub fn index(kernel_dir: &Path) -> Result<HashMap<String, PathBuf>> {
    let mut map = HashMap::new();
    let mut stack = vec![kernel_dir.to_path_buf()];
    while let Some(dir) = stack.pop() {
        for entry in
            std::fs::read_dir(&dir).with_context(|| format!("reading {}", dir.display()))?
        {
            let path = entry?.path();
            if path.is_dir() {
                stack.push(path);
            } else if let Some(name) = module_name(&path) {
                map.insert(canonical(&name), path);
            }
        }
    }
    Ok(map)
}

/// `nvme-core` for `.../nvme-core.ko` or `.ko.xz`.
fn module_name(path: &Path) -> Option<String> {
    let file = path.file_name()?.to_str()?;
    let stem = file
        .strip_suffix(".ko")
        .or_else(|| file.strip_suffix(".ko.xz"))?;
    Some(stem.to_string())
}

/// Reads a module, decompressing `.ko.xz`.
pub fn read_module(path: &Path) -> Result<Vec<u8>> {
    let raw = std::fs::read(path).with_context(|| format!("reading {}", path.display()))?;
    if path.extension().is_some_and(|e| e == "xz") {
        let mut out = Vec::new();
        xz2::read::XzDecoder::new(raw.as_slice())
            .read_to_end(&mut out)
            .with_context(|| format!("decompressing {}", path.display()))?;
        return Ok(out);
    }
    Ok(raw)
}

/// The `key=value` strings of a module's `.modinfo` section for `key`.
fn modinfo<'a>(module: &'a [u8], key: &str) -> Vec<&'a str> {
    let needle = format!("{key}=");
    module
        .split(|&b| b == 0)
        .filter_map(|s| std::str::from_utf8(s).ok())
        .filter_map(|s| s.strip_prefix(needle.as_str()))
        .collect()
}

/// Hard and soft (pre) dependencies of a module, by canonical name.
fn dependencies(module: &[u8]) -> Vec<String> {
    let mut deps = Vec::new();
    for soft in modinfo(module, "softdep") {
        // "pre: a b post: c": only "pre" modules must be there first
        let mut pre = false;
        for word in soft.split_whitespace() {
            match word {
                "pre:" => pre = true,
                "post:" => pre = false,
                w if pre => deps.push(canonical(w)),
                _ => {}
            }
        }
    }
    for hard in modinfo(module, "depends") {
        deps.extend(hard.split(',').filter(|d| !d.is_empty()).map(canonical));
    }
    deps
}

/// The load order (dependencies first) of `WANTED` and everything it needs.
/// Soft dependencies naming an alias rather than a module are skipped: the wanted list loads the
/// providers explicitly. Missing optional modules are reported and left out.
pub fn load_order(index: &HashMap<String, PathBuf>, builtin: &str) -> Result<Vec<PathBuf>> {
    let mut order = Vec::new();
    let mut state: HashMap<String, bool> = HashMap::new(); // false: visiting, true: done
    for name in WANTED {
        let name = canonical(name);
        if !index.contains_key(&name) {
            if is_builtin(builtin, &name) {
                continue;
            }
            if REQUIRED.contains(&name.as_str()) {
                bail!("the guest kernel has no module {name} (and it is not built in)");
            }
            eprintln!("vm-setup: note: guest kernel module {name} not found; leaving it out");
            continue;
        }
        visit(&name, index, &mut state, &mut order)?;
    }
    Ok(order)
}

fn visit(
    name: &str,
    index: &HashMap<String, PathBuf>,
    state: &mut HashMap<String, bool>,
    order: &mut Vec<PathBuf>,
) -> Result<()> {
    match state.get(name) {
        Some(true) => return Ok(()),
        Some(false) => bail!("module dependency cycle through {name}"),
        None => {}
    }
    // Names that are not module files are built in or crypto aliases: nothing to load.
    let Some(path) = index.get(name) else {
        return Ok(());
    };
    state.insert(name.to_string(), false);
    for dep in dependencies(&read_module(path)?) {
        visit(&dep, index, state, order)?;
    }
    state.insert(name.to_string(), true);
    order.push(path.clone());
    Ok(())
}

fn is_builtin(builtin: &str, name: &str) -> bool {
    builtin
        .lines()
        .filter_map(module_name_of_line)
        .any(|m| canonical(&m) == name)
}

fn module_name_of_line(line: &str) -> Option<String> {
    module_name(Path::new(line.trim()))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn fake_module(info: &[&str]) -> Vec<u8> {
        let mut m = b"\x7fELF junk".to_vec();
        for i in info {
            m.push(0);
            m.extend_from_slice(i.as_bytes());
        }
        m.push(0);
        m
    }

    #[test]
    fn reads_hard_and_pre_soft_dependencies() {
        let m = fake_module(&[
            "softdep=pre: crct10dif post: x",
            "depends=crct10dif_common,crc-64",
        ]);
        assert_eq!(
            dependencies(&m),
            vec!["crct10dif", "crct10dif_common", "crc_64"]
        );
        assert!(dependencies(&fake_module(&["depends="])).is_empty());
    }

    #[test]
    fn orders_dependencies_first_and_skips_missing_optional_modules() {
        let dir = std::env::temp_dir().join(format!("usnvme-kmod-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(dir.join("drivers")).unwrap();
        let write = |name: &str, info: &[&str]| {
            std::fs::write(
                dir.join("drivers").join(format!("{name}.ko")),
                fake_module(info),
            )
            .unwrap();
        };
        write("vfio", &["depends="]);
        write("vfio_iommu_type1", &["depends=vfio"]);
        write("vfio-pci-core", &["depends=vfio,irqbypass"]);
        write("irqbypass", &[]);
        write("vfio-pci", &["depends=vfio-pci-core,vfio"]);
        write("virtio_pci", &[]);
        write("9pnet_virtio", &["depends=9pnet"]);
        write("9pnet", &[]);
        write("9p", &["depends=9pnet"]);
        let idx = index(&dir).unwrap();
        let order: Vec<String> = load_order(&idx, "")
            .unwrap()
            .iter()
            .map(|p| p.file_name().unwrap().to_string_lossy().into_owned())
            .collect();
        let pos = |n: &str| order.iter().position(|o| o == n).unwrap();
        assert!(pos("vfio.ko") < pos("vfio_iommu_type1.ko"));
        assert!(pos("irqbypass.ko") < pos("vfio-pci-core.ko"));
        assert!(pos("vfio-pci-core.ko") < pos("vfio-pci.ko"));
        assert!(pos("9pnet.ko") < pos("9p.ko"));
        assert_eq!(order.iter().filter(|o| *o == "vfio.ko").count(), 1);
        std::fs::remove_file(dir.join("drivers/9p.ko")).unwrap();
        let idx = index(&dir).unwrap();
        assert!(load_order(&idx, "").is_err(), "9p is required");
        assert!(
            load_order(&idx, "kernel/fs/9p/9p.ko\n").is_ok(),
            "unless built in"
        );
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
