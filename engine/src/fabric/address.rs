//! Addresses of NVMe over Fabrics targets (NVMe/TCP and NVMe/RDMA), as users type them: SPDK's
//! transport ID strings (`trtype:TCP adrfam:IPv4 traddr:127.0.0.1 trsvcid:4420 subnqn:nqn....`,
//! as `spdk_nvme_perf -r` takes them; `trtype:RDMA` likewise) and a short form,
//! `tcp://127.0.0.1:4420/NQN` or `rdma://…` (`tcp://[::1]:4420/NQN` for IPv6; the port defaults
//! to 4420, the NQN may be left out where a command needs none).
//!
//! Every malformed address gets an error that says what is wrong and shows a correct example.

use std::fmt;
use std::net::{IpAddr, SocketAddr};
use std::str::FromStr;

/// The NVMe/TCP port IANA assigned (NVMe/TCP transport binding, 7.4.8).
pub const DEFAULT_PORT: u16 = 4420;
pub use usnvme_driver::spec::fabrics::{check_nqn, MAX_NQN_BYTES};

/// Examples shown with every error.
const SHORT_EXAMPLE: &str = "tcp://127.0.0.1:4420/nqn.2024-01.io.usnvme:host1";
const SPDK_EXAMPLE: &str =
    "'trtype:TCP adrfam:IPv4 traddr:127.0.0.1 trsvcid:4420 subnqn:nqn.2024-01.io.usnvme:host1'";

/// The fabric a target is reached over.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash)]
pub enum Transport {
    #[default]
    Tcp,
    Rdma,
}

impl Transport {
    /// Its scheme in the short form, and its name in logs (`tcp`, `rdma`).
    pub fn scheme(self) -> &'static str {
        match self {
            Transport::Tcp => "tcp",
            Transport::Rdma => "rdma",
        }
    }
}

/// A target's transport and socket address and, optionally, the subsystem wanted there.
/// (Named for the transport it first had; it names RDMA targets as well.)
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct TcpAddress {
    pub transport: Transport,
    pub addr: SocketAddr,
    pub subnqn: Option<String>,
}

impl TcpAddress {
    /// An NVMe/TCP target at `addr`.
    pub fn tcp(addr: SocketAddr, subnqn: Option<String>) -> TcpAddress {
        TcpAddress {
            transport: Transport::Tcp,
            addr,
            subnqn,
        }
    }

    /// Whether `s` is meant as a remote address (then its parse error is the one to show):
    /// `tcp://...`, `rdma://...`, or a transport ID with a `trtype` key.
    pub fn looks_remote(s: &str) -> bool {
        let lower = s.trim_start().to_ascii_lowercase();
        lower.starts_with("tcp://") || lower.starts_with("rdma://") || is_transport_id(&lower)
    }

    /// The same target with another subsystem NQN.
    pub fn with_subnqn(&self, subnqn: &str) -> TcpAddress {
        TcpAddress {
            transport: self.transport,
            addr: self.addr,
            subnqn: Some(subnqn.to_owned()),
        }
    }
}

/// What is wrong with an address; the message includes a correct example.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{what} (example: {example})")]
pub struct AddressError {
    pub what: String,
    example: &'static str,
}

fn short_error(what: impl Into<String>) -> AddressError {
    AddressError {
        what: what.into(),
        example: SHORT_EXAMPLE,
    }
}

fn spdk_error(what: impl Into<String>) -> AddressError {
    AddressError {
        what: what.into(),
        example: SPDK_EXAMPLE,
    }
}

impl FromStr for TcpAddress {
    type Err = AddressError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let s = s.trim();
        if s.is_empty() {
            return Err(short_error("empty NVMe/TCP address"));
        }
        match (s.get(..6), s.get(..7)) {
            (Some(scheme), _) if scheme.eq_ignore_ascii_case("tcp://") => {
                parse_short(Transport::Tcp, &s[6..])
            }
            (_, Some(scheme)) if scheme.eq_ignore_ascii_case("rdma://") => {
                parse_short(Transport::Rdma, &s[7..])
            }
            _ if s.contains("://") => Err(short_error(format!(
                "{s:?}: only tcp:// and rdma:// addresses are supported"
            ))),
            _ if is_transport_id(s) => parse_spdk(s),
            _ => Err(short_error(format!(
                "{s:?} is not an NVMe/TCP address: write tcp://ADDR:PORT/NQN or an SPDK \
                 transport ID"
            ))),
        }
    }
}

/// Whether some blank-separated pair of `s` starts with a transport ID key.
fn is_transport_id(s: &str) -> bool {
    s.split_whitespace().any(|pair| {
        let key = pair.split([':', '=']).next().unwrap_or(pair);
        SPDK_KEYS.iter().any(|k| k.eq_ignore_ascii_case(key)) && key.len() < pair.len()
    })
}

const SPDK_KEYS: [&str; 5] = ["trtype", "adrfam", "traddr", "trsvcid", "subnqn"];

/// `ADDR[:PORT][/NQN]`, ADDR an IPv4 address or a bracketed IPv6 one.
fn parse_short(transport: Transport, rest: &str) -> Result<TcpAddress, AddressError> {
    let (host_port, nqn) = match rest.split_once('/') {
        Some((hp, nqn)) => (hp, Some(nqn)),
        None => (rest, None),
    };
    let (ip, port) = if let Some(v6) = host_port.strip_prefix('[') {
        let (ip, after) = v6
            .split_once(']')
            .ok_or_else(|| short_error(format!("{host_port:?}: an IPv6 address needs its ']'")))?;
        let ip: IpAddr = ip
            .parse()
            .ok()
            .filter(IpAddr::is_ipv6)
            .ok_or_else(|| short_error(format!("{ip:?} is not an IPv6 address")))?;
        let port = match after {
            "" => None,
            p => Some(p.strip_prefix(':').ok_or_else(|| {
                short_error(format!("{after:?} after the IPv6 address: expected :PORT"))
            })?),
        };
        (ip, port)
    } else {
        if host_port.matches(':').count() > 1 {
            return Err(AddressError {
                what: format!("{host_port:?}: an IPv6 address goes in brackets"),
                example: "tcp://[::1]:4420/nqn.2024-01.io.usnvme:host1",
            });
        }
        let (ip, port) = match host_port.split_once(':') {
            Some((ip, port)) => (ip, Some(port)),
            None => (host_port, None),
        };
        if ip.is_empty() {
            return Err(short_error("the address has no host"));
        }
        let ip: IpAddr = ip.parse().ok().filter(IpAddr::is_ipv4).ok_or_else(|| {
            short_error(format!(
                "{ip:?} is not an IP address (host names are not looked up)"
            ))
        })?;
        (ip, port)
    };
    let port = match port {
        None => DEFAULT_PORT,
        Some(p) => parse_port(p).map_err(short_error)?,
    };
    let subnqn = match nqn {
        None | Some("") => None,
        Some(nqn) => {
            check_nqn(nqn).map_err(short_error)?;
            Some(nqn.to_owned())
        }
    };
    Ok(TcpAddress {
        transport,
        addr: SocketAddr::new(ip, port),
        subnqn,
    })
}

fn parse_port(p: &str) -> Result<u16, String> {
    match p.parse::<u16>() {
        Ok(0) | Err(_) => Err(format!("port {p:?} is not a number from 1 to 65535")),
        Ok(port) => Ok(port),
    }
}

/// SPDK's transport ID: `key:value` (or `key=value`) pairs separated by blanks, keys in any
/// case; `trtype` and `traddr` are required.
fn parse_spdk(s: &str) -> Result<TcpAddress, AddressError> {
    let mut trtype = None;
    let mut adrfam = None;
    let mut traddr = None;
    let mut trsvcid = None;
    let mut subnqn = None;
    for pair in s.split_whitespace() {
        // the first ':' or '=' ends the key (values such as `::1` or NQNs have colons)
        let Some(at) = pair.find([':', '=']) else {
            return Err(spdk_error(format!("{pair:?} is not a key:value pair")));
        };
        let (key, value) = (&pair[..at], &pair[at + 1..]);
        let slot = match key.to_ascii_lowercase().as_str() {
            "trtype" => &mut trtype,
            "adrfam" => &mut adrfam,
            "traddr" => &mut traddr,
            "trsvcid" => &mut trsvcid,
            "subnqn" => &mut subnqn,
            _ => {
                return Err(spdk_error(format!(
                    "unknown key {key:?} (known: trtype, adrfam, traddr, trsvcid, subnqn)"
                )))
            }
        };
        if slot.is_some() {
            return Err(spdk_error(format!("{key:?} is given twice")));
        }
        if value.is_empty() {
            return Err(spdk_error(format!("{key:?} has no value")));
        }
        *slot = Some(value);
    }
    let transport = match trtype {
        None => return Err(spdk_error("trtype is missing")),
        Some(t) if t.eq_ignore_ascii_case("tcp") => Transport::Tcp,
        Some(t) if t.eq_ignore_ascii_case("rdma") => Transport::Rdma,
        Some(t) => {
            return Err(spdk_error(format!(
                "trtype {t:?} is not supported: TCP or RDMA"
            )))
        }
    };
    let traddr = traddr.ok_or_else(|| spdk_error("traddr is missing"))?;
    let ip: IpAddr = traddr.parse().map_err(|_| {
        spdk_error(format!(
            "traddr {traddr:?} is not an IP address (host names are not looked up)"
        ))
    })?;
    if let Some(family) = adrfam {
        let v6 = match family.to_ascii_lowercase().as_str() {
            "ipv4" => false,
            "ipv6" => true,
            _ => {
                return Err(spdk_error(format!(
                    "adrfam {family:?} is not supported: IPv4 or IPv6"
                )))
            }
        };
        if v6 != ip.is_ipv6() {
            return Err(spdk_error(format!(
                "adrfam {family} does not match traddr {traddr}"
            )));
        }
    }
    let port = match trsvcid {
        None => DEFAULT_PORT,
        Some(p) => parse_port(p).map_err(|e| spdk_error(format!("trsvcid: {e}")))?,
    };
    if let Some(nqn) = subnqn {
        check_nqn(nqn).map_err(|e| spdk_error(format!("subnqn: {e}")))?;
    }
    Ok(TcpAddress {
        transport,
        addr: SocketAddr::new(ip, port),
        subnqn: subnqn.map(str::to_owned),
    })
}

/// The short form: `tcp://127.0.0.1:4420/NQN`, `tcp://[::1]:4420` (no NQN), `rdma://…`.
impl fmt::Display for TcpAddress {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        // SocketAddr already brackets IPv6 addresses
        write!(f, "{}://{}", self.transport.scheme(), self.addr)?;
        match &self.subnqn {
            Some(nqn) => write!(f, "/{nqn}"),
            None => Ok(()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    const NQN: &str = "nqn.2024-01.io.usnvme:test";

    fn parse(s: &str) -> Result<TcpAddress, AddressError> {
        s.parse()
    }

    fn at(addr: &str, nqn: Option<&str>) -> TcpAddress {
        TcpAddress::tcp(
            addr.parse().expect("a socket address"),
            nqn.map(str::to_owned),
        )
    }

    fn rdma(addr: &str, nqn: Option<&str>) -> TcpAddress {
        TcpAddress {
            transport: Transport::Rdma,
            ..at(addr, nqn)
        }
    }

    #[test]
    fn rdma_in_both_forms() {
        assert_eq!(
            parse(&format!("rdma://10.0.0.2:4421/{NQN}")),
            Ok(rdma("10.0.0.2:4421", Some(NQN)))
        );
        assert_eq!(
            parse(&format!(
                "trtype:RDMA adrfam:IPv4 traddr:10.0.0.2 subnqn:{NQN}"
            )),
            Ok(rdma("10.0.0.2:4420", Some(NQN)))
        );
        assert!(TcpAddress::looks_remote("RDMA://1.2.3.4"));
        assert_eq!(rdma("1.2.3.4:1", None).to_string(), "rdma://1.2.3.4:1");
    }

    #[test]
    fn short_forms() {
        assert_eq!(
            parse(&format!("tcp://127.0.0.1:4421/{NQN}")),
            Ok(at("127.0.0.1:4421", Some(NQN)))
        );
        assert_eq!(parse("TCP://10.0.0.2"), Ok(at("10.0.0.2:4420", None)));
        assert_eq!(parse("tcp://10.0.0.2/"), Ok(at("10.0.0.2:4420", None)));
        assert_eq!(
            parse(&format!("tcp://[::1]:4420/{NQN}")),
            Ok(at("[::1]:4420", Some(NQN)))
        );
        assert_eq!(parse("tcp://[fe80::1]"), Ok(at("[fe80::1]:4420", None)));
    }

    #[test]
    fn spdk_forms() {
        let want = at("127.0.0.1:4420", Some(NQN));
        assert_eq!(
            parse(&format!(
                "trtype:TCP adrfam:IPv4 traddr:127.0.0.1 trsvcid:4420 subnqn:{NQN}"
            )),
            Ok(want.clone())
        );
        // keys and values in any case, `=` as well as `:`, any order, blanks around
        assert_eq!(
            parse(&format!(
                "  SUBNQN={NQN}  TrType=tcp\tTRADDR:127.0.0.1 AdrFam:ipv4 "
            )),
            Ok(want)
        );
        assert_eq!(
            parse("trtype:TCP adrfam:IPv6 traddr:::1 trsvcid:4430"),
            Ok(at("[::1]:4430", None))
        );
    }

    #[test]
    fn every_error_says_what_and_shows_an_example() {
        for (input, says) in [
            ("", "empty"),
            ("http://1.2.3.4", "only tcp:// and rdma://"),
            ("tcp://", "no host"),
            ("tcp://host.example:4420", "not an IP address"),
            ("tcp://1.2.3.4:0", "port \"0\""),
            ("tcp://1.2.3.4:99999", "port \"99999\""),
            ("tcp://1.2.3.4:x/nqn.a", "port \"x\""),
            ("tcp://::1:4420", "in brackets"),
            ("tcp://[::1:4420", "needs its ']'"),
            ("tcp://[1.2.3.4]:4420", "not an IPv6 address"),
            ("tcp://[::1]4420", "expected :PORT"),
            ("tcp://1.2.3.4/not-an-nqn", "does not start with \"nqn.\""),
            ("trtype:TCP", "traddr is missing"),
            ("traddr:1.2.3.4 trsvcid:1", "trtype is missing"),
            ("trtype:FC traddr:1.2.3.4", "TCP or RDMA"),
            ("trtype:TCP traddr:1.2.3.4 adrfam:IPv6", "does not match"),
            ("trtype:TCP traddr:1.2.3.4 adrfam:FC", "IPv4 or IPv6"),
            ("trtype:TCP traddr:1.2.3.4 trsvcid:http", "trsvcid"),
            ("trtype:TCP traddr:1.2.3.4 ns:1", "unknown key \"ns\""),
            ("trtype:TCP traddr:1.2.3.4 traddr:1.2.3.5", "twice"),
            ("trtype:TCP traddr:", "no value"),
            ("trtype:TCP garbage", "not a key:value pair"),
            ("trtype:TCP traddr:1.2.3.4 subnqn:x", "subnqn"),
            ("0000:01:00.0", "not an NVMe/TCP address"),
        ] {
            let err = parse(input).expect_err(input);
            let text = err.to_string();
            assert!(text.contains(says), "{input:?}: {text}");
            assert!(text.contains("(example: "), "{input:?}: {text}");
        }
        let long = format!("tcp://1.2.3.4/nqn.{}", "x".repeat(220));
        assert!(parse(&long).expect_err("long").to_string().contains("223"));
    }

    #[test]
    fn what_looks_remote() {
        assert!(TcpAddress::looks_remote("tcp://1.2.3.4"));
        assert!(TcpAddress::looks_remote("TCP://x"));
        assert!(TcpAddress::looks_remote("TRTYPE:tcp traddr:1.2.3.4"));
        assert!(TcpAddress::looks_remote("traddr:1.2.3.4 trtype=tcp"));
        assert!(TcpAddress::looks_remote("traddr:1.2.3.4"));
        assert!(!TcpAddress::looks_remote("0000:01:00.0"));
        assert!(!TcpAddress::looks_remote("sim:0-3,backend=ram"));
    }

    #[test]
    fn display_is_the_short_form() {
        assert_eq!(
            at("[::1]:4420", Some(NQN)).to_string(),
            format!("tcp://[::1]:4420/{NQN}")
        );
        assert_eq!(at("1.2.3.4:1", None).to_string(), "tcp://1.2.3.4:1");
    }

    fn nqns() -> impl Strategy<Value = Option<String>> {
        proptest::option::of("nqn\\.[0-9]{4}-[0-9]{2}\\.[a-z.]{1,20}:[a-zA-Z0-9:._/-]{0,60}")
    }

    proptest! {
        #[test]
        fn parse_of_display_is_identity(
            ip in any::<IpAddr>(),
            port in 1u16..,
            subnqn in nqns(),
        ) {
            let a = TcpAddress::tcp(SocketAddr::new(ip, port), subnqn);
            prop_assert_eq!(a.to_string().parse::<TcpAddress>(), Ok(a));
        }
    }
}
