//! `usnvme format`: Format NVM on drives bound to vfio-pci (nvme-cli cannot reach them there):
//! a namespace, or all of them, to the LBA format with the data and metadata sizes asked for,
//! with protection information, optionally erasing securely. Every block's data is lost: the
//! command runs only with `--yes`. A drive another process holds is refused when it is opened.

use std::io::Write;
use std::time::Duration;

use anyhow::{bail, Result};
use usnvme_driver::pci::Sysfs;
use usnvme_driver::spec::command::Cns;
use usnvme_driver::spec::identify::Oacs;
use usnvme_driver::spec::{AdminOpcode, IdentifyNamespace, Sqe};
use usnvme_driver::{Controller, DeviceSpec};

use crate::perf::{exit_on_usage, usage};
use crate::{namespace, open};

/// How long a format may take: a secure erase of a large drive takes minutes.
const FORMAT_TIMEOUT: Duration = Duration::from_secs(600);

#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Erase {
    /// No secure erase.
    None,
    /// User Data Erase.
    User,
    /// Cryptographic Erase.
    Crypto,
}

#[derive(Debug, clap::Args)]
pub struct Args {
    /// Drives: PCI addresses (0000:01:00.0) or simulated ones (sim:0).
    #[arg(value_name = "DEVICE", required = true)]
    devices: Vec<DeviceSpec>,
    /// The namespace to format (default: every namespace of the drive).
    #[arg(short = 'n', long = "namespace", value_name = "NSID",
          value_parser = clap::value_parser!(u32).range(1..0xffff_ffff))]
    namespace: Option<u32>,
    #[command(flatten)]
    format: LbaFormatArgs,
    /// Erase the data securely while formatting.
    #[arg(long, value_enum, default_value_t = Erase::None)]
    erase: Erase,
    /// Yes, destroy every block of the namespaces formatted.
    #[arg(long)]
    yes: bool,
}

/// An LBA format and its protection information, as `format` and `ns create` take them.
#[derive(Debug, clap::Args)]
pub struct LbaFormatArgs {
    /// Data bytes per block, e.g. 512 or 4096.
    #[arg(long = "block-size", value_name = "BYTES")]
    pub block_size: u64,
    /// Metadata bytes per block.
    #[arg(long = "metadata", value_name = "BYTES", default_value_t = 0)]
    pub metadata: u16,
    /// The metadata follows each block's data (extended LBA) rather than a buffer apart.
    #[arg(long)]
    pub extended: bool,
    /// End-to-end protection information type: 0 (none), 1, 2 or 3 (needs metadata).
    #[arg(long = "pi", value_name = "TYPE", default_value_t = 0,
          value_parser = clap::value_parser!(u8).range(0..=3))]
    pub pi: u8,
    /// The protection information in the first bytes of the metadata (default: the last).
    #[arg(long)]
    pub pi_first: bool,
}

impl LbaFormatArgs {
    /// A [`usage`] error for protection information without room for it.
    pub fn check(&self) -> Result<()> {
        if self.pi > 0 && self.metadata < 8 {
            return Err(usage(format!(
                "--pi {}: protection information needs at least 8 bytes of metadata per block (--metadata 8)",
                self.pi
            )));
        }
        Ok(())
    }

    /// The index of the format asked for among those `id` lists, or an error naming them.
    pub fn index_in(&self, name: &str, id: &IdentifyNamespace) -> Result<usize> {
        let count = id.number_of_lba_formats().min(id.lbaf.len());
        let formats = &id.lbaf[..count];
        if let Some(i) = formats
            .iter()
            .position(|f| f.data_size() == Some(self.block_size) && f.ms == self.metadata)
        {
            return Ok(i);
        }
        let offered: Vec<String> = formats
            .iter()
            .filter_map(|f| Some(format!("{}+{}", f.data_size()?, f.ms)))
            .collect();
        bail!(
            "{name}: no LBA format of {} B data + {} B metadata; this drive offers {}",
            self.block_size,
            self.metadata,
            offered.join(", ")
        )
    }
}

/// Formats; a [`usage`] error has been printed and exits the process with status 2.
pub fn main(sysfs: &Sysfs, args: &Args, out: &mut dyn Write) -> Result<()> {
    let result = run(sysfs, args, out);
    exit_on_usage(&result, out);
    result
}

fn run(sysfs: &Sysfs, args: &Args, out: &mut dyn Write) -> Result<()> {
    let which = args
        .namespace
        .map_or("every namespace".to_owned(), |n| format!("namespace {n}"));
    if !args.yes {
        let drives: Vec<String> = args.devices.iter().map(|d| d.to_string()).collect();
        return Err(usage(format!(
            "format destroys every block of {which} of {}: add --yes to go ahead",
            drives.join(", ")
        )));
    }
    args.format.check()?;
    open::each_line(sysfs, &args.devices, out, |ctrl| format(ctrl, args))
}

/// Formats the namespace(s) of `ctrl`; a line per namespace saying its new format.
fn format(ctrl: &Controller, args: &Args) -> Result<String> {
    let name = ctrl.name();
    if !ctrl.identify().oacs().contains(Oacs::FORMAT_NVM) {
        bail!("{name}: the controller does not support Format NVM (OACS bit 1 is clear)");
    }
    let nsids: Vec<u32> = match args.namespace {
        Some(n) => vec![ctrl.namespace(n)?.nsid],
        None => ctrl.namespaces().iter().map(|n| n.nsid).collect(),
    };
    let Some(&first) = nsids.first() else {
        bail!("{name}: no active namespace to format");
    };
    let index = args
        .format
        .index_in(name, &ctrl.namespace(first)?.identify)?;
    let f = &args.format;
    let ses = match args.erase {
        Erase::None => 0,
        Erase::User => 1,
        Erase::Crypto => 2,
    };
    let mut sqe = Sqe::new(AdminOpcode::FormatNvm as u8);
    sqe.nsid = args.namespace.unwrap_or(u32::MAX);
    sqe.cdw10 = (index as u32 & 0xf)
        | u32::from(f.extended) << 4
        | u32::from(f.pi) << 5
        | u32::from(f.pi_first) << 8
        | ses << 9
        | ((index as u32 >> 4) & 3) << 12;
    ctrl.admin_waiting(sqe, FORMAT_TIMEOUT)?;
    nsids
        .iter()
        .map(|&nsid| {
            let (_, data) = ctrl.admin_read(Sqe::identify(Cns::Namespace, nsid), 4096)?;
            let id = IdentifyNamespace::from_slice(&data)
                .ok_or_else(|| anyhow::anyhow!("{name}: namespace {nsid}: no Identify data"))?;
            Ok(format!(
                "{name}: namespace {nsid} formatted: {}",
                namespace::describe(&id)
            ))
        })
        .collect::<Result<Vec<String>>>()
        .map(|lines| lines.join("\n"))
}
