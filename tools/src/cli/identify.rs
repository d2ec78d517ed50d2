//! `usnvme identify`: what each controller and namespace says about itself (Identify Controller,
//! Identify Namespace) and what the driver negotiated with it, as text or JSON.

use std::io::Write;

use anyhow::Result;
use serde::Serialize;
use usnvme_driver::pci::Sysfs;
use usnvme_driver::protection::{Guard, PiType};
use usnvme_driver::spec::identify::{IdentifyNamespace, SglSupport};
use usnvme_driver::Namespace;
use usnvme_engine::fabric::pdu::Digests;
use usnvme_engine::transport::{Controller, ControllerError, Reach};

use crate::format::{iec_bytes, names_or_none, percent, si_bytes, Fields};
use crate::open;

/// Arguments of `usnvme identify`: the drives, and `--json`.
pub type Args = open::Targets;

pub fn run(sysfs: &Sysfs, args: &Args, out: &mut dyn Write) -> Result<()> {
    open::report(sysfs, args, out, report, render)
}

/// One controller, as `--json` prints it.
#[derive(Debug, Clone, Serialize)]
pub struct ControllerReport {
    pub address: String,
    pub model: String,
    pub serial: String,
    pub firmware: String,
    /// PCI Vendor ID and Subsystem Vendor ID.
    pub vendor_id: u16,
    pub subsystem_vendor_id: u16,
    pub controller_id: u16,
    /// From the VS register.
    pub nvme_version: String,
    /// Maximum Data Transfer Size; `null`: no limit.
    pub mdts_bytes: Option<u64>,
    /// The largest transfer the driver issues in one command (MDTS, capped by the driver).
    pub max_transfer_bytes: u64,
    /// NN: the largest namespace ID the controller supports.
    pub number_of_namespaces: u32,
    /// Optional Admin Command Support, by name.
    pub oacs: Vec<&'static str>,
    /// Optional NVM Command Support, by name.
    pub oncs: Vec<&'static str>,
    /// `none`, `byte aligned` or `dword aligned` (`reserved` for the reserved value).
    pub sgl_support: &'static str,
    pub volatile_write_cache: bool,
    /// I/O queue pairs the controller granted (the driver asks for 64).
    pub io_queue_pairs: u16,
    /// Doorbell Buffer Config in use.
    pub shadow_doorbells: bool,
    pub subsystem_nqn: String,
    /// The firmware slots of a local controller (Firmware Slot Information log).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub firmware_slots: Option<FirmwareReport>,
    /// The active namespaces.
    pub namespaces: Vec<NamespaceReport>,
    /// How a remote controller is reached; absent for a local one.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub fabric: Option<FabricReport>,
}

/// A remote controller's transport, as negotiated.
#[derive(Debug, Clone, Serialize)]
pub struct FabricReport {
    /// `tcp`.
    pub transport: &'static str,
    /// `IP:PORT` of the target.
    pub target: String,
    pub header_digest: bool,
    pub data_digest: bool,
    /// In-capsule data an I/O command may carry (IOCCSZ * 16 - 64).
    pub in_capsule_bytes: u64,
    /// The most data the target takes in one H2CData PDU.
    pub maxh2cdata_bytes: u32,
}

#[derive(Debug, Clone, Serialize)]
pub struct NamespaceReport {
    pub nsid: u32,
    /// Data bytes per block and metadata bytes per block of the LBA format in use.
    pub block_size: u32,
    pub metadata_size: u16,
    /// The metadata travels after each block's data (extended LBA), else in a buffer apart.
    pub metadata_extended: bool,
    /// The protection information of the format in use, if any.
    pub protection: Option<ProtectionReport>,
    /// NSZE: the size in blocks, and in bytes.
    pub blocks: u64,
    pub capacity_bytes: u64,
    /// NCAP: blocks that may be allocated.
    pub capacity_blocks: u64,
    /// NUSE: blocks allocated.
    pub utilization_blocks: u64,
    pub lba_format_in_use: usize,
    pub lba_formats: Vec<LbaFormatReport>,
}

#[derive(Debug, Clone, Serialize)]
pub struct FirmwareReport {
    /// The slot running, and the one that runs from the next reset (if one is set).
    pub active_slot: u8,
    pub next_reset_slot: Option<u8>,
    /// Each slot's revision (`null`: empty), slot 1 first.
    pub revisions: Vec<Option<String>>,
    /// Slot 1 cannot be written.
    pub slot1_read_only: bool,
}

#[derive(Debug, Clone, Serialize)]
pub struct ProtectionReport {
    /// End-to-end protection type: 1, 2 or 3.
    #[serde(rename = "type")]
    pub pi_type: u8,
    /// The guard's width in bits: 16 (CRC-16/T10-DIF) or 64 (CRC-64/NVME).
    pub guard_bits: u8,
    /// Where the tuple is in the metadata: "first" or "last" bytes.
    pub location: &'static str,
}

#[derive(Debug, Clone, Serialize)]
pub struct LbaFormatReport {
    pub index: usize,
    /// Data bytes per block; `null` for an invalid format.
    pub data_size: Option<u64>,
    pub metadata_size: u16,
    /// RP: 0 best, 1 better, 2 good, 3 degraded.
    pub relative_performance: u8,
    pub performance: &'static str,
    pub in_use: bool,
}

/// The facts of `ctrl`, local or remote (a remote one has no I/O queues here: those lines are
/// left out, and its transport is shown).
pub fn report(ctrl: &mut Controller<'_>) -> Result<ControllerReport, ControllerError> {
    let id = ctrl.identify()?;
    let namespaces = ctrl.namespaces(&id)?;
    let mdts_bytes = id.mdts_bytes(ctrl.cap().min_page_size());
    let (max_transfer_bytes, io_queue_pairs, shadow_doorbells, fabric) = match ctrl.reach() {
        Reach::Pcie {
            io_queue_pairs,
            max_transfer,
            shadow_doorbells,
            ..
        } => (max_transfer, io_queue_pairs, shadow_doorbells, None),
        Reach::Tcp {
            transport,
            target,
            digests,
            maxh2cdata,
        } => {
            let fabric = FabricReport {
                transport: transport.scheme(),
                target,
                header_digest: digests.header,
                data_digest: digests.data,
                in_capsule_bytes: (u64::from(id.ioccsz) * 16).saturating_sub(64),
                maxh2cdata_bytes: maxh2cdata,
            };
            (mdts_bytes.unwrap_or(0), 0, false, Some(fabric))
        }
    };
    Ok(ControllerReport {
        address: ctrl.name(),
        model: id.model(),
        serial: id.serial(),
        firmware: id.firmware(),
        vendor_id: id.vid,
        subsystem_vendor_id: id.ssvid,
        controller_id: id.cntlid,
        nvme_version: ctrl.version().to_string(),
        mdts_bytes,
        max_transfer_bytes,
        number_of_namespaces: id.nn,
        oacs: id.oacs().names().collect(),
        oncs: id.oncs().names().collect(),
        sgl_support: sgl_name(id.sgl_support()),
        volatile_write_cache: id.vwc_present(),
        io_queue_pairs,
        shadow_doorbells,
        subsystem_nqn: id.subnqn(),
        firmware_slots: ctrl.firmware_log()?.map(|log| {
            let slots = ((id.frmw >> 1) & 7).max(1);
            FirmwareReport {
                active_slot: log.active_slot(),
                next_reset_slot: log.next_reset_slot(),
                revisions: (1..=slots).map(|s| log.revision(s)).collect(),
                slot1_read_only: id.frmw & 1 != 0,
            }
        }),
        namespaces: namespaces.iter().map(namespace).collect(),
        fabric,
    })
}

fn sgl_name(sgl: SglSupport) -> &'static str {
    match sgl {
        SglSupport::Unsupported => "none",
        SglSupport::Any => "byte aligned",
        SglSupport::DwordAligned => "dword aligned",
        SglSupport::Reserved => "reserved",
    }
}

fn namespace(ns: &Namespace) -> NamespaceReport {
    let id: &IdentifyNamespace = &ns.identify;
    let in_use = id.formatted_lba_index();
    let count = id.number_of_lba_formats().min(id.lbaf.len());
    NamespaceReport {
        nsid: ns.nsid,
        block_size: ns.block_size,
        metadata_size: ns.metadata.size,
        metadata_extended: ns.metadata.extended,
        protection: ns.metadata.protection.map(|pi| ProtectionReport {
            pi_type: match pi.pi_type {
                PiType::Type1 => 1,
                PiType::Type2 => 2,
                PiType::Type3 => 3,
            },
            guard_bits: match pi.guard {
                Guard::Crc16 => 16,
                Guard::Crc64 => 64,
            },
            location: if pi.first { "first" } else { "last" },
        }),
        blocks: ns.blocks,
        capacity_bytes: ns.capacity_bytes(),
        capacity_blocks: id.ncap,
        utilization_blocks: id.nuse,
        lba_format_in_use: in_use,
        lba_formats: id.lbaf[..count]
            .iter()
            .enumerate()
            .map(|(index, f)| LbaFormatReport {
                index,
                data_size: f.data_size(),
                metadata_size: f.ms,
                relative_performance: f.rp & 3,
                performance: performance_name(f.rp),
                in_use: index == in_use,
            })
            .collect(),
    }
}

fn performance_name(rp: u8) -> &'static str {
    match rp & 3 {
        0 => "best",
        1 => "better",
        2 => "good",
        _ => "degraded",
    }
}

/// The text form of one controller.
pub fn render(c: &ControllerReport) -> String {
    let mut f = Fields::new();
    f.heading(0, &c.address);
    f.field(1, "Model", &c.model);
    f.field(1, "Serial", &c.serial);
    f.field(1, "Firmware", &c.firmware);
    if let Some(fw) = &c.firmware_slots {
        let slots: Vec<String> = (1u8..)
            .zip(&fw.revisions)
            .map(|(slot, rev)| {
                let mut text = format!("{slot}: {}", rev.as_deref().unwrap_or("empty"));
                if slot == fw.active_slot {
                    text.push_str(" (running)");
                }
                if Some(slot) == fw.next_reset_slot {
                    text.push_str(" (from the next reset)");
                }
                if slot == 1 && fw.slot1_read_only {
                    text.push_str(" (read-only)");
                }
                text
            })
            .collect();
        f.field(1, "Firmware slots", slots.join(", "));
    }
    f.field(
        1,
        "PCI vendor",
        format!(
            "{:04x} (subsystem vendor {:04x})",
            c.vendor_id, c.subsystem_vendor_id
        ),
    );
    f.field(1, "Controller ID", c.controller_id);
    f.field(1, "NVMe version", &c.nvme_version);
    let mut mdts = c
        .mdts_bytes
        .map_or_else(|| "no limit".to_owned(), |b| iec_bytes(b.into()));
    if c.fabric.is_none() && c.mdts_bytes != Some(c.max_transfer_bytes) {
        mdts.push_str(&format!(
            " (the driver issues up to {} per command)",
            iec_bytes(c.max_transfer_bytes.into())
        ));
    }
    f.field(1, "Max transfer (MDTS)", mdts);
    f.field(
        1,
        "Namespaces",
        format!(
            "{} active (NN {})",
            c.namespaces.len(),
            c.number_of_namespaces
        ),
    );
    f.field(
        1,
        "Admin features (OACS)",
        names_or_none(c.oacs.iter().copied()),
    );
    f.field(
        1,
        "NVM features (ONCS)",
        names_or_none(c.oncs.iter().copied()),
    );
    let sgl = match c.sgl_support {
        "none" => "no".to_owned(),
        how => format!("yes, {how}"),
    };
    f.field(1, "SGL support", sgl);
    let vwc = if c.volatile_write_cache {
        "present"
    } else {
        "none"
    };
    f.field(1, "Volatile write cache", vwc);
    match &c.fabric {
        None => {
            f.field(
                1,
                "I/O queue pairs",
                format!("{} granted", c.io_queue_pairs),
            );
            f.field(
                1,
                "Shadow doorbells",
                if c.shadow_doorbells { "on" } else { "off" },
            );
        }
        Some(fabric) => {
            let digests = Digests {
                header: fabric.header_digest,
                data: fabric.data_digest,
            };
            let in_capsule = iec_bytes(fabric.in_capsule_bytes.into());
            if fabric.transport == "rdma" {
                f.field(1, "Transport", format!("NVMe/RDMA to {}", fabric.target));
                f.field(1, "In-capsule data", in_capsule);
            } else {
                f.field(
                    1,
                    "Transport",
                    format!("NVMe/TCP to {}, {digests}", fabric.target),
                );
                f.field(
                    1,
                    "In-capsule data",
                    format!(
                        "{in_capsule} (H2CData up to {})",
                        iec_bytes(fabric.maxh2cdata_bytes.into())
                    ),
                );
            }
        }
    }
    if !c.subsystem_nqn.is_empty() {
        f.field(1, "Subsystem NQN", &c.subsystem_nqn);
    }
    if c.namespaces.is_empty() {
        f.field(1, "Active namespaces", "none");
    }
    for ns in &c.namespaces {
        render_namespace(&mut f, ns);
    }
    f.render()
}

fn render_namespace(f: &mut Fields, ns: &NamespaceReport) {
    f.heading(1, format!("Namespace {}", ns.nsid));
    f.field(
        2,
        "Size",
        format!(
            "{} ({}): {} blocks of {} B",
            si_bytes(ns.capacity_bytes.into()),
            iec_bytes(ns.capacity_bytes.into()),
            ns.blocks,
            ns.block_size
        ),
    );
    if ns.metadata_size > 0 {
        let place = if ns.metadata_extended {
            "after each block's data (extended LBA)"
        } else {
            "in a buffer apart"
        };
        f.field(
            2,
            "Metadata",
            format!("{} B per block, {place}", ns.metadata_size),
        );
        let protection = ns.protection.as_ref().map_or_else(
            || "none".to_owned(),
            |pi| {
                format!(
                    "type {}, {}-bit guard, in the {} bytes of the metadata",
                    pi.pi_type, pi.guard_bits, pi.location
                )
            },
        );
        f.field(2, "Protection information", protection);
    }
    f.field(
        2,
        "Capacity (NCAP)",
        format!(
            "{} blocks ({}% of size)",
            ns.capacity_blocks,
            percent(ns.capacity_blocks, ns.blocks)
        ),
    );
    f.field(
        2,
        "Utilization (NUSE)",
        format!(
            "{} blocks ({}% of size)",
            ns.utilization_blocks,
            percent(ns.utilization_blocks, ns.blocks)
        ),
    );
    for lbaf in &ns.lba_formats {
        f.field(
            2,
            format!("LBA format {}", lbaf.index),
            lba_format_text(lbaf),
        );
    }
}

/// `512 B data + 8 B metadata, best performance (in use)`.
fn lba_format_text(lbaf: &LbaFormatReport) -> String {
    let data = lbaf
        .data_size
        .map_or_else(|| "invalid".to_owned(), |size| format!("{size} B"));
    let mut text = format!(
        "{data} data + {} B metadata, {} performance",
        lbaf.metadata_size, lbaf.performance
    );
    if lbaf.in_use {
        text.push_str(" (in use)");
    }
    text
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample() -> ControllerReport {
        let lbaf = |index, data_size, metadata_size, rp, in_use| LbaFormatReport {
            index,
            data_size,
            metadata_size,
            relative_performance: rp,
            performance: performance_name(rp),
            in_use,
        };
        ControllerReport {
            address: "0000:01:00.0".into(),
            model: "QEMU NVMe Ctrl".into(),
            serial: "usnvme0".into(),
            firmware: "9.2.0".into(),
            vendor_id: 0x1b36,
            subsystem_vendor_id: 0x1af4,
            controller_id: 0,
            nvme_version: "1.4.0".into(),
            mdts_bytes: Some(512 << 10),
            max_transfer_bytes: 512 << 10,
            number_of_namespaces: 256,
            oacs: vec!["Format NVM", "Doorbell Buffer Config"],
            oncs: vec![],
            sgl_support: "byte aligned",
            volatile_write_cache: true,
            io_queue_pairs: 64,
            shadow_doorbells: true,
            subsystem_nqn: String::new(),
            firmware_slots: Some(FirmwareReport {
                active_slot: 1,
                next_reset_slot: Some(2),
                revisions: vec![Some("9.2.0".into()), Some("9.3.0".into())],
                slot1_read_only: true,
            }),
            namespaces: vec![NamespaceReport {
                nsid: 1,
                block_size: 4096,
                metadata_size: 0,
                metadata_extended: false,
                protection: None,
                blocks: 262_144,
                capacity_bytes: 1 << 30,
                capacity_blocks: 262_144,
                utilization_blocks: 65_536,
                lba_format_in_use: 1,
                lba_formats: vec![
                    lbaf(0, Some(512), 0, 0, false),
                    lbaf(1, Some(4096), 0, 0, true),
                    lbaf(2, None, 8, 3, false),
                ],
            }],
            fabric: None,
        }
    }

    #[test]
    fn text_layout() {
        let text = render(&sample());
        let expect = "\
0000:01:00.0
  Model:                  QEMU NVMe Ctrl
  Serial:                 usnvme0
  Firmware:               9.2.0
  Firmware slots:         1: 9.2.0 (running) (read-only), 2: 9.3.0 (from the next reset)
  PCI vendor:             1b36 (subsystem vendor 1af4)
  Controller ID:          0
  NVMe version:           1.4.0
  Max transfer (MDTS):    512 KiB
  Namespaces:             1 active (NN 256)
  Admin features (OACS):  Format NVM, Doorbell Buffer Config
  NVM features (ONCS):    none
  SGL support:            yes, byte aligned
  Volatile write cache:   present
  I/O queue pairs:        64 granted
  Shadow doorbells:       on
  Namespace 1
    Size:                 1.07 GB (1 GiB): 262144 blocks of 4096 B
    Capacity (NCAP):      262144 blocks (100% of size)
    Utilization (NUSE):   65536 blocks (25% of size)
    LBA format 0:         512 B data + 0 B metadata, best performance
    LBA format 1:         4096 B data + 0 B metadata, best performance (in use)
    LBA format 2:         invalid data + 8 B metadata, degraded performance
";
        assert_eq!(text, expect);
    }

    #[test]
    fn mdts_notes_the_driver_cap() {
        let mut c = sample();
        c.mdts_bytes = None;
        c.max_transfer_bytes = 2 << 20;
        assert!(render(&c).contains(
            "Max transfer (MDTS):    no limit (the driver issues up to 2 MiB per command)"
        ));
    }

    #[test]
    fn a_remote_controller_shows_its_transport_instead_of_queues() {
        let mut c = sample();
        c.address = "tcp://127.0.0.1:4420/nqn.2024-01.io.usnvme:t".into();
        c.max_transfer_bytes = 0;
        c.fabric = Some(FabricReport {
            transport: "tcp",
            target: "127.0.0.1:4420".into(),
            header_digest: true,
            data_digest: false,
            in_capsule_bytes: 8192,
            maxh2cdata_bytes: 131072,
        });
        let text = render(&c);
        assert!(
            text.contains(
                "  Transport:              NVMe/TCP to 127.0.0.1:4420, header digest\n\
             \x20 In-capsule data:        8 KiB (H2CData up to 128 KiB)\n"
            ),
            "{text}"
        );
        assert!(text.contains("Max transfer (MDTS):    512 KiB\n"), "{text}");
        assert!(
            !text.contains("I/O queue pairs") && !text.contains("Shadow"),
            "{text}"
        );
        let json = serde_json::to_value(&c).expect("JSON");
        assert_eq!(json["fabric"]["transport"], "tcp");
        assert!(serde_json::to_value(sample())
            .expect("JSON")
            .get("fabric")
            .is_none());
    }

    #[test]
    fn json_numbers_are_numbers() {
        let json = serde_json::to_value(sample()).expect("JSON");
        assert_eq!(json["vendor_id"], 0x1b36);
        assert_eq!(json["mdts_bytes"], 512 << 10);
        assert_eq!(json["namespaces"][0]["capacity_bytes"], 1u64 << 30);
        assert_eq!(json["namespaces"][0]["lba_formats"][1]["in_use"], true);
        assert_eq!(
            json["namespaces"][0]["lba_formats"][2]["data_size"],
            serde_json::Value::Null
        );
    }
}
