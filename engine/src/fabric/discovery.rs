//! The Discovery Log Page (log 70h) as a host reads it: its records, with the names of their
//! transport, address family, subsystem type, requirements and flags. The target builds its
//! own from the same structures (`usnvme_driver::spec::fabrics`).

use usnvme_driver::spec::fabrics::{self as f, padded_text};
use usnvme_driver::spec::{DiscoveryLogEntry, DiscoveryLogHeader};

pub use usnvme_driver::spec::fabrics::DISCOVERY_NQN;

/// The size of the Discovery Log Page's header and of each of its records.
pub(crate) const DISCOVERY_RECORD: usize = DiscoveryLogEntry::SIZE;
const _: () = assert!(DiscoveryLogHeader::SIZE == DISCOVERY_RECORD);

/// A Discovery Log Page: its generation counter, record count, and the records read.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct DiscoveryLog {
    pub genctr: u64,
    pub numrec: u64,
    pub entries: Vec<DiscoveryEntry>,
}

/// One Discovery Log Page Entry (NVMe over Fabrics 1.1, figure 38).
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct DiscoveryEntry {
    pub trtype: u8,
    pub adrfam: u8,
    pub subtype: u8,
    pub treq: u8,
    pub port_id: u16,
    pub cntlid: u16,
    pub asqsz: u16,
    pub eflags: u16,
    /// Transport service identifier: for TCP, the port.
    pub trsvcid: String,
    pub subnqn: String,
    pub traddr: String,
    /// For TCP, the first byte of the transport specific address subtype (TSAS): the
    /// security type.
    pub sectype: u8,
    /// For RDMA, the TSAS: queue pair type, provider type, connection management service and
    /// partition key.
    pub rdma: Option<RdmaTsas>,
}

/// The RDMA transport specific address subtype of a discovery log entry.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
pub struct RdmaTsas {
    pub qptype: u8,
    pub prtype: u8,
    pub cms: u8,
    pub pkey: u16,
}

impl RdmaTsas {
    /// From the TSAS bytes: QPTYPE, PRTYPE, CMS, five reserved, PKEY.
    pub fn from_tsas(tsas: &[u8]) -> RdmaTsas {
        let byte = |i: usize| tsas.get(i).copied().unwrap_or(0);
        RdmaTsas {
            qptype: byte(0),
            prtype: byte(1),
            cms: byte(2),
            pkey: u16::from_le_bytes([byte(8), byte(9)]),
        }
    }

    /// Its fields in nvme-cli's words (`rdma_qptype`, `rdma_prtype`, `rdma_cms`).
    pub fn qptype_name(&self) -> &'static str {
        match self.qptype {
            1 => "connected",
            2 => "datagram",
            _ => "unrecognized",
        }
    }

    pub fn prtype_name(&self) -> &'static str {
        match self.prtype {
            1 => "not specified",
            2 => "infiniband",
            3 => "roce",
            4 => "roce-v2",
            5 => "iwarp",
            _ => "unrecognized",
        }
    }

    pub fn cms_name(&self) -> &'static str {
        match self.cms {
            1 => "rdma-cm",
            _ => "unrecognized",
        }
    }
}

impl DiscoveryEntry {
    pub fn transport_name(&self) -> &'static str {
        match self.trtype {
            f::TRTYPE_RDMA => "rdma",
            f::TRTYPE_FC => "fc",
            f::TRTYPE_TCP => "tcp",
            f::TRTYPE_LOOP => "loop",
            _ => "unknown",
        }
    }

    pub fn address_family_name(&self) -> &'static str {
        match self.adrfam {
            f::ADRFAM_IPV4 => "ipv4",
            f::ADRFAM_IPV6 => "ipv6",
            f::ADRFAM_IB => "ib",
            f::ADRFAM_FC => "fc",
            f::ADRFAM_LOOP => "loop",
            _ => "unknown",
        }
    }

    /// Subsystem type, as nvme-cli names it.
    pub fn subtype_name(&self) -> &'static str {
        match self.subtype {
            f::SUBTYPE_REFERRAL => "discovery subsystem referral",
            f::SUBTYPE_NVME => "nvme subsystem",
            f::SUBTYPE_CURRENT_DISCOVERY => "current discovery subsystem",
            _ => "unknown",
        }
    }

    /// Transport requirements, in nvme-cli's words: the secure channel requirement (bits
    /// 1:0), then whether SQ flow control may be disabled (bit 2).
    pub fn treq_text(&self) -> String {
        let secure = match self.treq & f::TREQ_SECURE_MASK {
            0 => "not specified",
            f::TREQ_SECURE_REQUIRED => "required",
            f::TREQ_SECURE_NOT_REQUIRED => "not required",
            _ => "reserved",
        };
        if self.treq & f::TREQ_SQ_FLOW_CONTROL_DISABLE != 0 {
            format!("{secure}, sq flow control disable supported")
        } else {
            secure.to_owned()
        }
    }

    /// Entry flags, in nvme-cli's words.
    pub fn eflags_text(&self) -> String {
        let names: Vec<&str> = [
            (
                f::EFLAGS_EXPLICIT_PERSISTENT_CONNECTION,
                "explicit discovery connections",
            ),
            (
                f::EFLAGS_DUPLICATE_RETURN_INFO,
                "duplicate discovery information",
            ),
            (f::EFLAGS_NO_CDC_CONNECTIVITY, "no cdc connectivity"),
        ]
        .iter()
        .filter(|(bit, _)| self.eflags & bit != 0)
        .map(|(_, name)| *name)
        .collect();
        if names.is_empty() {
            "none".to_owned()
        } else {
            names.join(", ")
        }
    }

    /// The TCP security type, in nvme-cli's words.
    pub fn sectype_name(&self) -> &'static str {
        match self.sectype {
            f::SECTYPE_NONE => "none",
            f::SECTYPE_TLS12 => "tls",
            f::SECTYPE_TLS13 => "tls13",
            _ => "unknown",
        }
    }
}

/// The header of a discovery log and the complete records that follow it in `bytes` (at most
/// NUMREC of them).
pub fn parse_discovery_log(bytes: &[u8]) -> Result<DiscoveryLog, &'static str> {
    let header = bytes
        .get(..DISCOVERY_RECORD)
        .and_then(DiscoveryLogHeader::from_slice)
        .ok_or("the discovery log is shorter than its header")?;
    let entries = bytes
        .get(DISCOVERY_RECORD..)
        .unwrap_or_default()
        .chunks_exact(DISCOVERY_RECORD)
        .take(usize::try_from(header.numrec).unwrap_or(usize::MAX))
        .filter_map(DiscoveryLogEntry::from_slice)
        .map(|e| DiscoveryEntry {
            trtype: e.trtype,
            adrfam: e.adrfam,
            subtype: e.subtype,
            treq: e.treq,
            port_id: e.portid,
            cntlid: e.cntlid,
            asqsz: e.asqsz,
            eflags: e.eflags,
            trsvcid: padded_text(&e.trsvcid),
            subnqn: padded_text(&e.subnqn),
            traddr: padded_text(&e.traddr),
            sectype: e.sectype(),
            rdma: (e.trtype == f::TRTYPE_RDMA).then(|| RdmaTsas::from_tsas(&e.tsas)),
        })
        .collect();
    Ok(DiscoveryLog {
        genctr: header.genctr,
        numrec: header.numrec,
        entries,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn discovery_log_entries() {
        let mut log = vec![0u8; 3 * 1024];
        log[0] = 5;
        log[8] = 2;
        let e = &mut log[1024..2048];
        e[..4].copy_from_slice(&[3, 1, 2, 3]);
        e[4] = 7;
        e[6..8].copy_from_slice(&0xffffu16.to_le_bytes());
        e[10] = 2; // EFLAGS: explicit persistent connections
        e[768] = 1; // TSAS: SECTYPE TLS
        e[32..64].copy_from_slice(&[b' '; 32]);
        e[32..36].copy_from_slice(b"4420");
        e[256..265].copy_from_slice(b"nqn.x:sub");
        e[512..768].copy_from_slice(&[b' '; 256]);
        e[512..521].copy_from_slice(b"127.0.0.1");
        let parsed = parse_discovery_log(&log).expect("a log");
        assert_eq!((parsed.genctr, parsed.numrec), (5, 2));
        assert_eq!(parsed.entries.len(), 2);
        let e = &parsed.entries[0];
        assert_eq!(
            (
                e.transport_name(),
                e.address_family_name(),
                e.subtype_name()
            ),
            ("tcp", "ipv4", "nvme subsystem")
        );
        assert_eq!((e.port_id, e.cntlid), (7, 0xffff));
        assert_eq!(
            (e.treq_text(), e.eflags_text(), e.sectype_name()),
            (
                "reserved".to_owned(), // TREQ 3: both secure channel bits
                "explicit discovery connections".to_owned(),
                "tls"
            )
        );
        assert_eq!(
            (e.trsvcid.as_str(), e.subnqn.as_str(), e.traddr.as_str()),
            ("4420", "nqn.x:sub", "127.0.0.1")
        );
        // fewer records than NUMREC says, a partial one, a header cut short
        assert_eq!(
            parse_discovery_log(&log[..2500])
                .expect("log")
                .entries
                .len(),
            1
        );
        assert!(parse_discovery_log(&log[..12]).is_err());
    }
}
