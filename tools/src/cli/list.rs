//! `usnvme list`: the NVMe controllers as a table, or as JSON with `--json`.

use std::io::Write;

use anyhow::{Context, Result};
use serde::Serialize;
use usnvme_driver::pci::{Driver, NvmeControllerInfo, Sysfs};

use crate::usage::{BlockDeviceInfo, UsageScan};

/// Arguments of `usnvme list`.
#[derive(Debug, clap::Args)]
pub struct Args {
    /// Print a JSON array of the controllers instead of a table.
    #[arg(long)]
    pub json: bool,
}

/// A controller as `usnvme list` shows it: what the driver's PCI discovery knows of it and the
/// kernel block devices on it. In JSON, one object: the controller's fields, then
/// `block_devices`.
#[derive(Debug, Serialize)]
struct Listed {
    #[serde(flatten)]
    controller: NvmeControllerInfo,
    block_devices: Vec<BlockDeviceInfo>,
}

/// Every NVMe controller with its block devices (from one scan of sysfs and procfs).
fn listed(sysfs: &Sysfs) -> Result<Vec<Listed>> {
    let controllers = sysfs
        .list_nvme_controllers()
        .context("cannot list the NVMe controllers")?;
    let usage = UsageScan::new(sysfs.root());
    Ok(controllers
        .into_iter()
        .map(|controller| Listed {
            block_devices: usage.block_devices_of(&sysfs.pci_device_path(controller.address)),
            controller,
        })
        .collect())
}

/// Lists the controllers on `out`.
pub fn run(sysfs: &Sysfs, args: &Args, out: &mut dyn Write) -> Result<()> {
    let controllers = listed(sysfs)?;
    let text = if args.json {
        let mut json = serde_json::to_string_pretty(&controllers)
            .context("cannot encode the controllers as JSON")?;
        json.push('\n');
        json
    } else if controllers.is_empty() {
        "no NVMe controllers found\n".to_owned()
    } else {
        format!("{}{}\n", table(&controllers), summary(&controllers))
    };
    out.write_all(text.as_bytes())
        .context("cannot write to standard output")
}

const HEADERS: [&str; 7] = [
    "BDF",
    "VID:DID",
    "DRIVER",
    "NUMA",
    "IOMMU GROUP",
    "LINK (CURRENT / MAX)",
    "BLOCK DEVICES",
];

/// The table, one line per controller, columns as wide as their content.
fn table(controllers: &[Listed]) -> String {
    let rows: Vec<[String; 7]> = controllers.iter().map(row).collect();
    let mut widths = HEADERS.map(|h| h.chars().count());
    for row in &rows {
        for (width, cell) in widths.iter_mut().zip(row) {
            *width = (*width).max(cell.chars().count());
        }
    }
    let mut text = String::new();
    for cells in std::iter::once(HEADERS.map(str::to_owned)).chain(rows) {
        let mut line = String::new();
        for (cell, width) in cells.iter().zip(widths) {
            line.push_str(cell);
            let pad = width - cell.chars().count();
            line.extend(std::iter::repeat_n(' ', pad + 2));
        }
        text.push_str(line.trim_end());
        text.push('\n');
    }
    text
}

fn row(listed: &Listed) -> [String; 7] {
    let c = &listed.controller;
    let hex = |id: Option<u16>| id.map_or_else(|| "????".to_owned(), |id| format!("{id:04x}"));
    let group = match c.iommu_group {
        None => "none".to_owned(),
        Some(group) if c.iommu_group_viable => format!("{group} viable"),
        Some(group) if c.iommu_group_blockers.is_empty() => format!("{group} not viable"),
        Some(group) => format!("{group} not viable ({})", join(&c.iommu_group_blockers)),
    };
    let mut link = c.link.to_string();
    if c.link.is_downgraded() {
        link.push_str(" (downgraded)");
    }
    let blocks = if listed.block_devices.is_empty() {
        "-".to_owned()
    } else {
        let blocks: Vec<String> = listed.block_devices.iter().map(block_device).collect();
        blocks.join(", ")
    };
    [
        c.address.to_string(),
        format!("{}:{}", hex(c.vendor_id), hex(c.device_id)),
        c.driver.name().unwrap_or("-").to_owned(),
        c.numa_node
            .map_or_else(|| "-".to_owned(), |n| n.to_string()),
        group,
        link,
        blocks,
    ]
}

/// `nvme0n1 (mounted at /data) (in use: swap) (holders: dm-0)`.
fn block_device(b: &BlockDeviceInfo) -> String {
    let mut text = b.name.clone();
    if !b.mounted_at.is_empty() {
        text.push_str(&format!(" (mounted at {})", b.mounted_at.join(", ")));
    }
    if b.swap {
        text.push_str(" (in use: swap)");
    }
    if !b.holders.is_empty() {
        text.push_str(&format!(" (holders: {})", b.holders.join(", ")));
    }
    text
}

fn join(items: &[impl std::fmt::Display]) -> String {
    items
        .iter()
        .map(ToString::to_string)
        .collect::<Vec<_>>()
        .join(", ")
}

/// `24 NVMe controllers: 24 on vfio-pci, 0 on nvme, 0 unbound` (and the others, if any).
fn summary(controllers: &[Listed]) -> String {
    let count = |want: fn(&Driver) -> bool| {
        controllers
            .iter()
            .filter(|c| want(&c.controller.driver))
            .count()
    };
    let n = controllers.len();
    let mut text = format!(
        "{n} NVMe controller{}: {} on vfio-pci, {} on nvme, {} unbound",
        if n == 1 { "" } else { "s" },
        count(|d| *d == Driver::VfioPci),
        count(|d| *d == Driver::Nvme),
        count(|d| *d == Driver::None),
    );
    let mut others: Vec<&str> = controllers
        .iter()
        .filter_map(|c| match &c.controller.driver {
            Driver::Other(name) => Some(name.as_str()),
            _ => None,
        })
        .collect();
    if !others.is_empty() {
        let total = others.len();
        others.sort_unstable();
        others.dedup();
        text.push_str(&format!(
            ", {total} on other drivers ({})",
            others.join(", ")
        ));
    }
    text
}

#[cfg(test)]
mod tests {
    use usnvme_driver::pci::fake::FakeSysfs;

    use super::*;

    #[test]
    fn columns_align_and_summary_counts() {
        let fake = FakeSysfs::new();
        fake.add_pci_device("0000:01:00.0", 0x010802, 0x1b36, 0x0010)
            .bind("vfio-pci");
        fake.add_pci_device("0000:0a:00.0", 0x010802, 0x144d, 0xa80a)
            .bind("uio_pci_generic")
            .numa_node("1");
        let list = listed(&fake.sysfs()).expect("list");
        let text = table(&list);
        let lines: Vec<&str> = text.lines().collect();
        assert_eq!(lines.len(), 3);
        let col = |line: &str, word: &str| line.find(word).expect(word);
        assert_eq!(col(lines[0], "DRIVER"), col(lines[1], "vfio-pci"));
        assert_eq!(col(lines[0], "NUMA"), col(lines[2], "1 "));
        assert!(lines[2].starts_with("0000:0a:00.0  144d:a80a  uio_pci_generic"));
        assert_eq!(
            summary(&list),
            "2 NVMe controllers: 1 on vfio-pci, 0 on nvme, 0 unbound, 1 on other drivers (uio_pci_generic)"
        );
        assert!(summary(&list[..1]).starts_with("1 NVMe controller: "));
    }
}
