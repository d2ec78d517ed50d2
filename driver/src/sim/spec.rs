//! `sim:` device addresses: `sim:0`, `sim:0-23`, then options, e.g.
//! `sim:3,bs=4096,size=1G,ns=2,backend=ram,mdts=5,queues=4,sgl=off,dbbuf=off,mqes=255,mode=threaded,latency=100us`.
//! Fault options (`misdirect=N`, `corrupt=N`, `nodata=N`) make the drive misbehave silently from
//! its Nth write or read on, for tests of data checks; `logdelay=DURATION` and
//! `flushdelay=DURATION` make every Get Log Page or Flush complete that much later (threaded
//! mode: on time), for tests of what waits on them.

use std::fmt;
use std::str::FromStr;
use std::time::Duration;

use super::{
    AsyncEventSpec, Backend, Fault, FaultAction, FaultWhen, SimConfig, SimMode, SimNamespace,
};
use crate::protection::{Guard, MetadataFormat, PiFormat, PiType};
use crate::spec::IoOpcode;

/// The drives a `sim:` address names and how they are configured.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SimSpec {
    /// Drive indices: drive N is `sim:N` with serial `simN`.
    pub drives: Vec<u32>,
    /// The configuration of each (its serial is set per drive).
    pub config: SimConfig,
}

/// Why a `sim:` address does not parse.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SimSpecError {
    #[error("`{0}` is not a sim address: expected sim:N or sim:N-M, then options, e.g. sim:0-3,bs=4096,backend=ram")]
    NotSim(String),
    #[error("bad drive range `{0}`: expected N or N-M with N <= M and at most 4096 drives, e.g. sim:0 or sim:0-23")]
    Drives(String),
    #[error("unknown sim option `{name}`; valid options: {VALID}")]
    UnknownOption { name: String },
    #[error("bad value `{value}` for sim option `{name}`: expected {expected}")]
    Value {
        name: String,
        value: String,
        expected: &'static str,
    },
}

const VALID: &str =
    "bs=512|4096, ms=0|8|16|64 (metadata bytes per block), mset=0|1 (1: after each block's data), \
pi=0|1|2|3 (protection type), pil=0|1 (1: the tuple first in the metadata), pif=0|2 (16- or 64-bit guard), size=<bytes, e.g. 1G>, ns=<count>, backend=null|ram, mdts=<0-20>, \
queues=<1-65534>, msix=<0-2048 MSI-X vectors>, sgl=on|off, dbbuf=on|off, mqes=<1-65535>, mode=inline|threaded, \
latency=<e.g. 100us>, ooo=on|off, misdirect=<N: from the Nth write on, writes land one block off>, \
corrupt=<N: from the Nth read on, reads deliver a byte flipped mid-block>, \
nodata=<N: from the Nth read on, reads complete without moving data>, \
logdelay=<e.g. 100ms: Get Log Page completes that much later>, \
flushdelay=<e.g. 100ms: Flush completes that much later>, \
warn=reliability|temperature|spare[@N] (a SMART warning raised before power-on, or by the Nth write, reported by event), \
spare=<bytes no namespace holds, for ns create, e.g. 1G>";

impl SimSpec {
    /// Whether `s` is meant as a sim address (then parse it for the details).
    pub fn is_sim(s: &str) -> bool {
        s.starts_with("sim:")
    }

    /// Whether the drives keep what is written (`backend=ram`): a data check needs it, as
    /// `backend=null` reads move no data.
    pub fn keeps_data(&self) -> bool {
        self.config.backend == Backend::Ram
    }
}

impl fmt::Display for SimSpec {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match (self.drives.first(), self.drives.last()) {
            (Some(a), Some(b)) if a != b => write!(f, "sim:{a}-{b}"),
            (Some(a), _) => write!(f, "sim:{a}"),
            _ => write!(f, "sim:"),
        }
    }
}

fn value_error(name: &str, value: &str, expected: &'static str) -> SimSpecError {
    SimSpecError::Value {
        name: name.into(),
        value: value.into(),
        expected,
    }
}

/// `100us`, `1ms`, `2s`, `500ns`, `0`.
fn parse_duration(s: &str) -> Option<Duration> {
    let split = s.find(|c: char| !c.is_ascii_digit()).unwrap_or(s.len());
    let (digits, unit) = s.split_at(split);
    let n: u64 = digits.parse().ok()?;
    Some(match unit {
        "ns" => Duration::from_nanos(n),
        "us" | "µs" => Duration::from_micros(n),
        "ms" => Duration::from_millis(n),
        "s" => Duration::from_secs(n),
        "" if n == 0 => Duration::ZERO,
        _ => return None,
    })
}

/// `0` or `1`, as QEMU's namespace properties take them.
fn parse_flag(name: &str, value: &str) -> Result<bool, SimSpecError> {
    match value {
        "0" => Ok(false),
        "1" => Ok(true),
        _ => Err(value_error(name, value, "0 or 1")),
    }
}

fn parse_switch(name: &str, value: &str) -> Result<bool, SimSpecError> {
    match value {
        "on" | "true" | "1" | "yes" => Ok(true),
        "off" | "false" | "0" | "no" => Ok(false),
        _ => Err(value_error(name, value, "on or off")),
    }
}

impl FromStr for SimSpec {
    type Err = SimSpecError;

    fn from_str(s: &str) -> Result<SimSpec, SimSpecError> {
        let rest = s
            .strip_prefix("sim:")
            .ok_or_else(|| SimSpecError::NotSim(s.into()))?;
        let mut parts = rest.split(',');
        let range = parts.next().unwrap_or_default();
        let drives_error = || SimSpecError::Drives(range.into());
        let (a, b) = match range.split_once('-') {
            Some((a, b)) => (a, b),
            None => (range, range),
        };
        let (a, b): (u32, u32) = (
            a.parse().map_err(|_| drives_error())?,
            b.parse().map_err(|_| drives_error())?,
        );
        if a > b || b - a >= 4096 {
            return Err(drives_error());
        }
        let mut config = SimConfig::default();
        let (mut block_size, mut size, mut count) = (512u32, 1u64 << 30, 1usize);
        let mut metadata = MetadataFormat::default();
        let (mut pi_type, mut pi_first, mut guard) = (None, false, Guard::Crc16);
        let (mut threaded, mut latency, mut ooo) = (false, Duration::ZERO, false);
        for option in parts {
            let (name, value) = option.split_once('=').unwrap_or((option, ""));
            let bad = |expected| value_error(name, value, expected);
            match name {
                "bs" => {
                    block_size = match value {
                        "512" => 512,
                        "4096" | "4k" | "4K" => 4096,
                        _ => return Err(bad("512 or 4096")),
                    }
                }
                "size" => {
                    size = crate::parse_size(value)
                        .filter(|&s| s > 0)
                        .ok_or_else(|| bad("a size in bytes, e.g. 64M or 1G"))?
                }
                "spare" => {
                    config.spare_capacity =
                        crate::parse_size(value).ok_or_else(|| bad("a size in bytes, e.g. 1G"))?
                }
                "warn" => {
                    // KIND at power-on, or KIND@N: raised by the Nth write
                    let (kind, nth) = match value.split_once('@') {
                        Some((kind, n)) => (kind, Some(n)),
                        None => (value, None),
                    };
                    let expected =
                        "reliability, temperature or spare, then @N to raise it at the Nth write";
                    let event = AsyncEventSpec::smart(match kind {
                        "reliability" => 0,
                        "temperature" => 1,
                        "spare" => 2,
                        _ => return Err(bad(expected)),
                    });
                    match nth {
                        None => config.events.push(event),
                        Some(n) => {
                            let n = n
                                .parse()
                                .ok()
                                .filter(|&n| n > 0)
                                .ok_or_else(|| bad(expected))?;
                            let write = FaultWhen::opcode(IoOpcode::Write as u8).with_nth(n);
                            config
                                .faults
                                .push(Fault::new(write, FaultAction::RaiseEvent(event)));
                        }
                    }
                }
                "mset" => metadata.extended = parse_flag(name, value)?,
                "pi" => {
                    pi_type = match value {
                        "0" => None,
                        "1" => Some(PiType::Type1),
                        "2" => Some(PiType::Type2),
                        "3" => Some(PiType::Type3),
                        _ => return Err(bad("0 (none), 1, 2 or 3 (the protection type)")),
                    }
                }
                "pil" => pi_first = parse_flag(name, value)?,
                "pif" => {
                    guard = match value {
                        "0" => Guard::Crc16,
                        "2" => Guard::Crc64,
                        _ => return Err(bad("0 (16-bit guard) or 2 (64-bit guard)")),
                    }
                }
                "ms" => {
                    metadata.size = match value {
                        "0" => 0,
                        "8" => 8,
                        "16" => 16,
                        "64" => 64,
                        _ => return Err(bad("0, 8, 16 or 64 (metadata bytes per block)")),
                    }
                }
                "ns" => {
                    count = value
                        .parse()
                        .ok()
                        .filter(|n| (1..=1024).contains(n))
                        .ok_or_else(|| bad("a namespace count from 1 to 1024"))?
                }
                "backend" => {
                    config.backend = match value {
                        "null" => Backend::Null,
                        "ram" => Backend::Ram,
                        _ => return Err(bad("null or ram")),
                    }
                }
                "mdts" => {
                    config.mdts = value
                        .parse()
                        .ok()
                        .filter(|m| *m <= 20)
                        .ok_or_else(|| bad("0 (no limit) to 20: transfers of 4 KiB << mdts"))?
                }
                "queues" => {
                    config.io_queues = value
                        .parse()
                        .ok()
                        .filter(|q| (1..u16::MAX).contains(q))
                        .ok_or_else(|| bad("a number of I/O queue pairs from 1 to 65534"))?
                }
                "msix" => {
                    config.msix_vectors = value
                        .parse()
                        .ok()
                        .filter(|v| *v <= 2048)
                        .ok_or_else(|| bad("0 to 2048 MSI-X vectors (0: none)"))?
                }
                "mqes" => {
                    config.mqes =
                        value.parse().ok().filter(|q| *q >= 1).ok_or_else(|| {
                            bad("1 to 65535 (0's based: queues of mqes + 1 entries)")
                        })?
                }
                "misdirect" => {
                    config.misdirect_write =
                        Some(value.parse().ok().filter(|n| *n >= 1).ok_or_else(|| {
                            bad("N >= 1: from the Nth write on, writes land one block off")
                        })?)
                }
                "corrupt" | "nodata" => {
                    let (action, expected) = if name == "corrupt" {
                        (
                            FaultAction::CorruptRead,
                            "N >= 1: from the Nth read on, reads deliver a byte flipped mid-block",
                        )
                    } else {
                        (
                            FaultAction::ReadNoData,
                            "N >= 1: from the Nth read on, reads complete without moving data",
                        )
                    };
                    let nth = value
                        .parse()
                        .ok()
                        .filter(|n| *n >= 1)
                        .ok_or_else(|| bad(expected))?;
                    let reads = FaultWhen::opcode(IoOpcode::Read as u8).with_nth(nth);
                    config.faults.push(Fault::new(reads, action).times(0));
                }
                "sgl" => config.sgl = parse_switch(name, value)?,
                "dbbuf" => config.doorbell_buffer = parse_switch(name, value)?,
                "ooo" => ooo = parse_switch(name, value)?,
                "mode" => {
                    threaded = match value {
                        "inline" => false,
                        "threaded" => true,
                        _ => return Err(bad("inline or threaded")),
                    }
                }
                "logdelay" | "flushdelay" => {
                    let delay = parse_duration(value)
                        .ok_or_else(|| bad("a duration, e.g. 100ms, 3600s"))?;
                    let which = if name == "logdelay" {
                        FaultWhen::admin(crate::spec::AdminOpcode::GetLogPage as u8)
                    } else {
                        FaultWhen::opcode(IoOpcode::Flush as u8)
                    };
                    config
                        .faults
                        .push(Fault::new(which, FaultAction::Delay(delay)).times(0));
                }
                "latency" => {
                    latency =
                        parse_duration(value).ok_or_else(|| bad("a duration, e.g. 100us, 1ms"))?
                }
                _ => {
                    return Err(SimSpecError::UnknownOption { name: name.into() });
                }
            }
        }
        metadata.protection = pi_type.map(|pi_type| PiFormat {
            pi_type,
            guard,
            first: pi_first,
        });
        if let Some(pi) = metadata.protection {
            if pi.offset(metadata.size.into()).is_none() {
                return Err(value_error(
                    "ms",
                    &metadata.size.to_string(),
                    "at least 8 bytes (16 with pif=2): the protection information tuple",
                ));
            }
        }
        if size % block_size as u64 != 0 {
            return Err(value_error(
                "size",
                &size.to_string(),
                "a multiple of the block size",
            ));
        }
        config.namespaces = vec![
            SimNamespace {
                block_size,
                blocks: size / block_size as u64,
                metadata,
            };
            count
        ];
        if threaded || !latency.is_zero() || ooo {
            config.mode = SimMode::Threaded {
                latency,
                out_of_order: ooo,
            };
        }
        Ok(SimSpec {
            drives: (a..=b).collect(),
            config,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn addresses_with_and_without_options() {
        let one: SimSpec = "sim:0".parse().expect("sim:0");
        assert_eq!(one.drives, [0]);
        assert_eq!(one.config, SimConfig::default());
        assert_eq!(one.to_string(), "sim:0");
        let many: SimSpec = "sim:0-23".parse().expect("range");
        assert_eq!(many.drives.len(), 24);
        assert_eq!(many.to_string(), "sim:0-23");

        let full: SimSpec = "sim:3,bs=4096,size=1G,ns=2,backend=ram,mdts=5,queues=4,msix=3,sgl=off,dbbuf=off,mqes=255,mode=threaded,latency=100us"
            .parse()
            .expect("every option");
        assert_eq!(full.drives, [3]);
        let c = &full.config;
        assert_eq!(
            c.namespaces,
            vec![
                SimNamespace {
                    block_size: 4096,
                    blocks: 262_144,
                    metadata: MetadataFormat::default(),
                };
                2
            ]
        );
        assert_eq!(
            (
                c.backend,
                c.mdts,
                c.io_queues,
                c.sgl,
                c.doorbell_buffer,
                c.mqes,
                c.msix_vectors
            ),
            (Backend::Ram, 5, 4, false, false, 255, 3)
        );
        assert_eq!(
            c.mode,
            SimMode::Threaded {
                latency: Duration::from_micros(100),
                out_of_order: false
            }
        );
        assert!(full.keeps_data() && !one.keeps_data());
        let faulty: SimSpec = "sim:0,backend=ram,corrupt=3,nodata=5"
            .parse()
            .expect("faults");
        let read = FaultWhen::opcode(IoOpcode::Read as u8);
        assert_eq!(
            faulty.config.faults,
            [
                Fault::new(read.clone().with_nth(3), FaultAction::CorruptRead).times(0),
                Fault::new(read.with_nth(5), FaultAction::ReadNoData).times(0),
            ]
        );
        let sized: SimSpec = "sim:1,size=64MiB,ooo=on".parse().expect("ooo");
        assert_eq!(sized.config.namespaces[0].blocks, (64 << 20) / 512);
        assert!(matches!(
            sized.config.mode,
            SimMode::Threaded {
                out_of_order: true,
                ..
            }
        ));
    }

    #[test]
    fn metadata_and_protection_options_make_the_format() {
        let spec: SimSpec = "sim:0,bs=4096,ms=64,mset=1,pi=3,pif=2,pil=1"
            .parse()
            .expect("a PI format");
        assert_eq!(
            spec.config.namespaces[0].metadata,
            MetadataFormat {
                size: 64,
                extended: true,
                protection: Some(PiFormat {
                    pi_type: PiType::Type3,
                    guard: Guard::Crc64,
                    first: true,
                }),
            }
        );
        let plain: SimSpec = "sim:0,ms=16".parse().expect("metadata only");
        assert_eq!(plain.config.namespaces[0].metadata.protection, None);
    }

    #[test]
    fn warnings_at_power_on_or_at_a_write_and_spare_capacity() {
        let spec: SimSpec = "sim:0,warn=spare,warn=temperature@8,spare=1G"
            .parse()
            .expect("valid");
        assert_eq!(spec.config.events, [AsyncEventSpec::smart(2)]);
        let write = FaultWhen::opcode(IoOpcode::Write as u8).with_nth(8);
        assert_eq!(
            spec.config.faults,
            [Fault::new(
                write,
                FaultAction::RaiseEvent(AsyncEventSpec::smart(1))
            )]
        );
        assert_eq!(spec.config.spare_capacity, 1 << 30);
        for bad in [
            "sim:0,warn=temperature@0",
            "sim:0,warn=hot@8",
            "sim:0,warn=spare@x",
        ] {
            let e = bad.parse::<SimSpec>().expect_err(bad).to_string();
            assert!(e.contains("then @N to raise it at the Nth write"), "{e}");
        }
    }

    #[test]
    fn errors_name_the_option_and_what_is_valid() {
        let e = "sim:0,colour=blue".parse::<SimSpec>().expect_err("unknown");
        let text = e.to_string();
        assert!(
            text.contains("`colour`") && text.contains("backend=null|ram"),
            "{text}"
        );
        let e = "sim:0,bs=1000".parse::<SimSpec>().expect_err("bad bs");
        assert_eq!(
            e.to_string(),
            "bad value `1000` for sim option `bs`: expected 512 or 4096"
        );
        let e = "sim:0,ms=8,pi=1,pif=2"
            .parse::<SimSpec>()
            .expect_err("tuple too big");
        assert_eq!(
            e.to_string(),
            "bad value `8` for sim option `ms`: expected at least 8 bytes (16 with pif=2): the protection information tuple"
        );
        let e = "sim:0,ms=8,mset=yes".parse::<SimSpec>().expect_err("flag");
        assert!(e.to_string().ends_with("expected 0 or 1"), "{e}");
        let e = "sim:0,latency=fast"
            .parse::<SimSpec>()
            .expect_err("bad latency");
        assert!(e.to_string().contains("`latency`"), "{e}");
        let e = "sim:0,size=1000"
            .parse::<SimSpec>()
            .expect_err("not block multiple");
        assert!(e.to_string().contains("multiple of the block size"), "{e}");
        assert!(matches!(
            "sim:5-2".parse::<SimSpec>(),
            Err(SimSpecError::Drives(_))
        ));
        assert!(matches!(
            "sim:x".parse::<SimSpec>(),
            Err(SimSpecError::Drives(_))
        ));
        assert!(matches!(
            "0000:01:00.0".parse::<SimSpec>(),
            Err(SimSpecError::NotSim(_))
        ));
        assert!(SimSpec::is_sim("sim:0") && !SimSpec::is_sim("0000:01:00.0"));
        let e = "sim:0,nodata=0".parse::<SimSpec>().expect_err("nodata 0");
        assert!(e.to_string().contains("`nodata`"), "{e}");
        let two_tib = "sim:0,size=2TiB".parse::<SimSpec>().expect("2 TiB");
        assert_eq!(two_tib.config.namespaces[0].blocks, (2 << 40) / 512);
        assert_eq!(parse_duration("0"), Some(Duration::ZERO));
        assert_eq!(parse_duration("3ms"), Some(Duration::from_millis(3)));
    }
}
