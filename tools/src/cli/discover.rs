//! `usnvme discover ADDR`: what an NVMe/TCP target offers, from its discovery subsystem's
//! Discovery Log Page, as a table or JSON (nvme-cli's field names).

use std::io::Write;

use anyhow::{Context, Result};
use serde::Serialize;
use usnvme_driver::pci::Sysfs;
use usnvme_engine::fabric::address::TcpAddress;
use usnvme_engine::fabric::discovery::{DiscoveryEntry, DiscoveryLog, DISCOVERY_NQN};

use crate::remote::{with_controller, RemoteArgs};

/// Arguments of `usnvme discover`.
#[derive(Debug, clap::Args)]
pub struct Args {
    /// The target: tcp://ADDR[:PORT] or rdma://ADDR[:PORT] (port 4420 by default) or an SPDK
    /// transport ID ('trtype:TCP traddr:ADDR trsvcid:PORT'); an NQN given is used as the discovery
    /// subsystem's (default nqn.2014-08.org.nvmexpress.discovery).
    #[arg(value_name = "ADDRESS")]
    pub target: TcpAddress,
    /// Print JSON (genctr and records) instead of a table.
    #[arg(long)]
    pub json: bool,
    #[command(flatten)]
    pub remote: RemoteArgs,
}

/// One record, as `--json` prints it: nvme-cli's fields and words (`nvme discover -o json`),
/// then the controller ID and admin queue size.
#[derive(Debug, Serialize)]
struct Record<'a> {
    trtype: &'static str,
    adrfam: &'static str,
    subtype: &'static str,
    treq: String,
    portid: u16,
    trsvcid: &'a str,
    subnqn: &'a str,
    traddr: &'a str,
    eflags: String,
    /// TCP's security type (nvme-cli prints it for TCP records only)
    #[serde(skip_serializing_if = "Option::is_none")]
    sectype: Option<&'static str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    rdma_prtype: Option<&'static str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    rdma_qptype: Option<&'static str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    rdma_cms: Option<&'static str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    rdma_pkey: Option<u16>,
    cntlid: u16,
    asqsz: u16,
}

#[derive(Debug, Serialize)]
struct Report<'a> {
    target: String,
    genctr: u64,
    numrec: u64,
    records: Vec<Record<'a>>,
}

pub fn run(sysfs: &Sysfs, args: &Args, out: &mut dyn Write) -> Result<()> {
    let opts = args.remote.host_options(sysfs.root())?;
    let target = match &args.target.subnqn {
        Some(_) => args.target.clone(),
        None => args.target.with_subnqn(DISCOVERY_NQN),
    };
    let log = with_controller(&target, &opts, |c| Ok(c.discovery_log()?))?;
    let text = if args.json {
        let report = Report {
            target: args.target.to_string(),
            genctr: log.genctr,
            numrec: log.numrec,
            records: log.entries.iter().map(record).collect(),
        };
        let mut text =
            serde_json::to_string_pretty(&report).context("cannot encode the log as JSON")?;
        text.push('\n');
        text
    } else {
        table(&log)
    };
    out.write_all(text.as_bytes())
        .context("cannot write to standard output")
}

fn record(e: &DiscoveryEntry) -> Record<'_> {
    Record {
        trtype: e.transport_name(),
        adrfam: e.address_family_name(),
        subtype: e.subtype_name(),
        treq: e.treq_text(),
        portid: e.port_id,
        trsvcid: &e.trsvcid,
        subnqn: &e.subnqn,
        traddr: &e.traddr,
        eflags: e.eflags_text(),
        sectype: e.rdma.is_none().then(|| e.sectype_name()),
        rdma_prtype: e.rdma.map(|r| r.prtype_name()),
        rdma_qptype: e.rdma.map(|r| r.qptype_name()),
        rdma_cms: e.rdma.map(|r| r.cms_name()),
        rdma_pkey: e.rdma.map(|r| r.pkey),
        cntlid: e.cntlid,
        asqsz: e.asqsz,
    }
}

const HEADINGS: [&str; 8] = [
    "SUBSYSTEM NQN",
    "TYPE",
    "TRANSPORT",
    "ADDRESS",
    "SERVICE ID",
    "PORT ID",
    "SECTYPE",
    "TRANSPORT REQUIREMENTS",
];

/// One row per record under the headings, columns as wide as their widest cell.
fn table(log: &DiscoveryLog) -> String {
    if log.entries.is_empty() {
        return "no discovery log records\n".to_owned();
    }
    let rows: Vec<[String; 8]> = log
        .entries
        .iter()
        .map(|e| {
            [
                e.subnqn.clone(),
                e.subtype_name().to_owned(),
                e.transport_name().to_owned(),
                e.traddr.clone(),
                e.trsvcid.clone(),
                e.port_id.to_string(),
                if e.rdma.is_some() {
                    "-".to_owned()
                } else {
                    e.sectype_name().to_owned()
                },
                e.treq_text(),
            ]
        })
        .collect();
    let mut widths = HEADINGS.map(str::len);
    for row in &rows {
        for (w, cell) in widths.iter_mut().zip(row) {
            *w = (*w).max(cell.chars().count());
        }
    }
    let line = |cells: &[&str]| {
        let padded: Vec<String> = cells
            .iter()
            .zip(widths)
            .map(|(c, w)| format!("{c:<w$}"))
            .collect();
        format!("{}\n", padded.join("  ").trim_end())
    };
    let mut text = line(&HEADINGS);
    for row in &rows {
        let cells: Vec<&str> = row.iter().map(String::as_str).collect();
        text.push_str(&line(&cells));
    }
    text
}

#[cfg(test)]
mod tests {
    use super::*;
    use usnvme_engine::fabric::discovery::RdmaTsas;

    fn entry(nqn: &str, port: &str) -> DiscoveryEntry {
        DiscoveryEntry {
            trtype: 3,
            adrfam: 1,
            subtype: 2,
            treq: 4,
            port_id: 1,
            cntlid: 0xffff,
            asqsz: 32,
            eflags: 0,
            trsvcid: port.into(),
            subnqn: nqn.into(),
            traddr: "127.0.0.1".into(),
            sectype: 0,
            rdma: None,
        }
    }

    #[test]
    fn an_rdma_record_has_nvme_clis_rdma_fields_and_no_sectype() {
        let tsas = [1u8, 1, 1, 0, 0, 0, 0, 0, 0xff, 0xff];
        let e = DiscoveryEntry {
            trtype: 1,
            rdma: Some(RdmaTsas::from_tsas(&tsas)),
            ..entry("nqn.c", "4420")
        };
        let json = serde_json::to_value(record(&e)).expect("JSON");
        assert_eq!(json["trtype"], "rdma");
        assert_eq!(json["rdma_qptype"], "connected");
        assert_eq!(json["rdma_prtype"], "not specified");
        assert_eq!(json["rdma_cms"], "rdma-cm");
        assert_eq!(json["rdma_pkey"], 0xffff);
        assert!(json.get("sectype").is_none(), "{json}");
        let tcp = serde_json::to_value(record(&entry("nqn.d", "4420"))).expect("JSON");
        assert_eq!(tcp["sectype"], "none");
        assert!(tcp.get("rdma_qptype").is_none(), "{tcp}");
    }

    #[test]
    fn table_layout() {
        let log = DiscoveryLog {
            genctr: 1,
            numrec: 2,
            entries: vec![
                entry("nqn.2024-01.io.usnvme:a", "4420"),
                entry("nqn.b", "44201"),
            ],
        };
        let expect = "\
SUBSYSTEM NQN            TYPE            TRANSPORT  ADDRESS    SERVICE ID  PORT ID  SECTYPE  TRANSPORT REQUIREMENTS
nqn.2024-01.io.usnvme:a  nvme subsystem  tcp        127.0.0.1  4420        1        none     not specified, sq flow control disable supported
nqn.b                    nvme subsystem  tcp        127.0.0.1  44201       1        none     not specified, sq flow control disable supported
";
        assert_eq!(table(&log), expect);
        let empty = DiscoveryLog {
            genctr: 0,
            numrec: 0,
            entries: vec![],
        };
        assert_eq!(table(&empty), "no discovery log records\n");
        let json = serde_json::to_value(record(&log.entries[0])).expect("JSON");
        assert_eq!(json["subnqn"], "nqn.2024-01.io.usnvme:a");
        assert_eq!(json["trtype"], "tcp");
        assert_eq!(json["portid"], 1);
        assert_eq!(
            json["treq"],
            "not specified, sq flow control disable supported"
        );
        assert_eq!(
            (&json["sectype"], &json["eflags"]),
            (&"none".into(), &"none".into())
        );
    }

    #[test]
    fn treq_eflags_and_sectype_read_as_nvme_cli_prints_them() {
        let mut e = entry("nqn.a", "4420");
        for (treq, text) in [
            (0, "not specified"),
            (1, "required"),
            (2, "not required"),
            (4, "not specified, sq flow control disable supported"),
            (6, "not required, sq flow control disable supported"),
        ] {
            e.treq = treq;
            assert_eq!(e.treq_text(), text);
        }
        for (eflags, text) in [
            (0, "none"),
            (2, "explicit discovery connections"),
            (
                3,
                "explicit discovery connections, duplicate discovery information",
            ),
        ] {
            e.eflags = eflags;
            assert_eq!(e.eflags_text(), text);
        }
        for (sectype, name) in [(0, "none"), (1, "tls"), (2, "tls13"), (9, "unknown")] {
            e.sectype = sectype;
            assert_eq!(e.sectype_name(), name);
        }
    }
}
