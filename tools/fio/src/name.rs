//! fio file names, as the engine takes them. fio splits `filename=` at every ':' (a '\:' is a
//! colon kept), so the forms are those of SPDK's fio plugin and ours with that in mind:
//!
//! - a local drive: `0000.01.00.0` (dots for the colons), `0000\:01\:00.0`, or `sim\:0` (a
//!   software controller, for tests);
//! - a remote NVMe/TCP or NVMe/RDMA subsystem: `tcp\://127.0.0.1\:4420/NQN`,
//!   `rdma\://192.0.2.1\:4420/NQN`;
//! - SPDK's plugin's transport IDs: `trtype=PCIe traddr=0000.01.00.0`,
//!   `trtype=TCP adrfam=IPv4 traddr=127.0.0.1 trsvcid=4420 subnqn=NQN` (or `trtype=RDMA`);
//!
//! each optionally followed by ` ns=N` (the namespace; without it, a controller must have one).

use std::str::FromStr;

use usnvme_engine::transport::DeviceName;

/// Shown with every error: what a file name may be.
const FORMS: &str =
    "file names: 0000.01.00.0, tcp\\://ADDR\\:PORT/NQN (or rdma\\://…) or an SPDK transport ID \
     ('trtype=PCIe traddr=0000.01.00.0'), then ' ns=N' for a namespace";

/// One fio file: a namespace of a controller (the only one, when `nsid` is not given).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FileName {
    pub controller: DeviceName,
    pub nsid: Option<u32>,
}

impl FromStr for FileName {
    type Err = String;

    fn from_str(name: &str) -> Result<FileName, String> {
        let fail = |what: String| format!("file name {name:?}: {what} ({FORMS})");
        let mut nsid = None;
        let mut rest: Vec<&str> = Vec::new();
        for word in name.split_whitespace() {
            match word.strip_prefix("ns=") {
                Some(n) => {
                    let n: u32 = n
                        .parse()
                        .ok()
                        .filter(|&n| n > 0 && n != u32::MAX)
                        .ok_or_else(|| fail(format!("{n:?} is not a namespace ID")))?;
                    nsid = Some(n);
                }
                None => rest.push(word),
            }
        }
        if rest.is_empty() {
            return Err(fail("no controller named".into()));
        }
        let controller = if rest.iter().any(|w| is_transport_key(w)) {
            transport_id(&rest).map_err(fail)?
        } else {
            controller(&rest.join(" ")).map_err(fail)?
        };
        Ok(FileName { controller, nsid })
    }
}

/// SPDK's transport ID keys.
const KEYS: [&str; 5] = ["trtype", "adrfam", "traddr", "trsvcid", "subnqn"];

/// Whether `word` is a `key=value` of a transport ID.
fn is_transport_key(word: &str) -> bool {
    word.split_once('=')
        .is_some_and(|(k, _)| KEYS.iter().any(|key| key.eq_ignore_ascii_case(k)))
}

/// `0000.01.00.0` (fio's way past its ':' splitting), or any device name.
fn controller(s: &str) -> Result<DeviceName, String> {
    let name: DeviceName = pci_with_dots(s)
        .unwrap_or_else(|| s.to_owned())
        .parse()
        .map_err(|e| {
            let split = if s.len() <= 4 && s.bytes().all(|b| b.is_ascii_hexdigit()) {
                " (fio split a name at its ':'s: write 0000.01.00.0, or '\\:' for each ':')"
            } else {
                ""
            };
            format!("{e}{split}")
        })?;
    if name.drives().len() != 1 {
        return Err(format!(
            "{name} names several drives: one file is one drive (list them with ':' between)"
        ));
    }
    Ok(name)
}

/// `DDDD.BB.DD.F` (SPDK's way past fio's ':' splitting) as `DDDD:BB:DD.F`.
fn pci_with_dots(s: &str) -> Option<String> {
    let parts: Vec<&str> = s.split('.').collect();
    let hex = |p: &str, len| p.len() == len && p.bytes().all(|b| b.is_ascii_hexdigit());
    match parts.as_slice() {
        [d, b, s, f] if hex(d, 4) && hex(b, 2) && hex(s, 2) && hex(f, 1) => {
            Some(format!("{d}:{b}:{s}.{f}"))
        }
        _ => None,
    }
}

/// SPDK's `key=value` transport ID.
fn transport_id(words: &[&str]) -> Result<DeviceName, String> {
    let mut trtype = None;
    let mut traddr = None;
    let mut pairs = Vec::new();
    for word in words {
        let (key, value) = word
            .split_once('=')
            .ok_or_else(|| format!("{word:?} is not key=value"))?;
        match key.to_ascii_lowercase().as_str() {
            "trtype" => trtype = Some(value.to_ascii_lowercase()),
            "traddr" => traddr = Some(value),
            k if KEYS.contains(&k) => {}
            _ => {
                return Err(format!(
                    "unknown key {key:?} (a transport ID has {})",
                    KEYS.join(", ")
                ))
            }
        }
        pairs.push(format!("{key}:{value}"));
    }
    match trtype.as_deref() {
        Some("pcie") => {
            let addr = traddr.ok_or("trtype=PCIe needs traddr=DDDD.BB.DD.F")?;
            controller(addr)
        }
        Some("tcp" | "rdma") => pairs.join(" ").parse(),
        Some(other) => Err(format!(
            "transport {other:?} is not supported (PCIe, TCP and RDMA are)"
        )),
        None => Err("a transport ID needs trtype=PCIe, trtype=TCP or trtype=RDMA".into()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn local(s: &str) -> DeviceName {
        DeviceName::Local(s.parse().expect("a drive"))
    }

    #[test]
    fn takes_drives_in_the_forms_fio_lets_through() {
        let parse = |s: &str| s.parse::<FileName>().expect(s);
        let drive = local("0000:01:00.0");
        for name in [
            "0000.01.00.0",
            "0000:01:00.0",
            "trtype=PCIe traddr=0000.01.00.0",
            "trtype=pcie traddr=0000:01:00.0",
        ] {
            assert_eq!(parse(name).controller, drive, "{name}");
            assert_eq!(parse(name).nsid, None, "{name}");
        }
        let two = parse("trtype=PCIe traddr=0000.01.00.0 ns=2");
        assert_eq!((two.controller, two.nsid), (drive, Some(2)));
        assert_eq!(parse("sim:3").controller, local("sim:3"));
        assert_eq!(parse("sim:3 ns=4").nsid, Some(4));
        assert_eq!(
            parse("sim:3,backend=ram").controller,
            local("sim:3,backend=ram")
        );
    }

    #[test]
    fn takes_remote_subsystems_in_both_forms() {
        let nqn = "nqn.2024-01.io.usnvme:sub0";
        let short = format!("tcp://127.0.0.1:4420/{nqn}");
        let spdk = format!("trtype=TCP adrfam=IPv4 traddr=127.0.0.1 trsvcid=4420 subnqn={nqn}");
        let a = short.parse::<FileName>().expect("short form");
        let b = format!("{spdk} ns=1").parse::<FileName>().expect("SPDK's");
        assert_eq!(a.controller, b.controller);
        let DeviceName::Remote(addr) = &a.controller else {
            panic!("remote: {a:?}")
        };
        assert_eq!(addr.subnqn.as_deref(), Some(nqn));
        assert_eq!((a.nsid, b.nsid), (None, Some(1)));
        let rdma = format!("rdma://192.0.2.1:4420/{nqn}")
            .parse::<FileName>()
            .expect("rdma short form");
        let rdma_spdk = format!("trtype=RDMA adrfam=IPv4 traddr=192.0.2.1 subnqn={nqn}")
            .parse::<FileName>()
            .expect("rdma transport ID");
        assert_eq!(rdma.controller, rdma_spdk.controller);
        assert_eq!(
            rdma.controller.to_string(),
            format!("rdma://192.0.2.1:4420/{nqn}")
        );
    }

    #[test]
    fn says_what_is_wrong_with_a_name() {
        let err = |s: &str| s.parse::<FileName>().expect_err(s);
        // what fio leaves of an unescaped 0000:01:00.0
        assert!(err("0000").contains("fio split a name"), "{}", err("0000"));
        assert!(err("tcp://127.0.0.1:4420").contains("names no subsystem"));
        assert!(err("trtype=FC traddr=1.2.3.4").contains("\"fc\" is not supported"));
        assert!(err("trtype=PCIe").contains("needs traddr"));
        assert!(err("0000.01.00.0 ns=0").contains("not a namespace ID"));
        assert!(err("ns=1").contains("no controller named"));
        assert!(err("sim:0-3").contains("names several drives"));
        assert!(err("trtype=PCIe traddr=0000.01.00.0 color=blue").contains("unknown key"));
        // every error shows the forms
        assert!(
            err("nonsense").contains("0000.01.00.0"),
            "{}",
            err("nonsense")
        );
    }
}
