//! The flags checked. clap checks each flag on its own (ranges, sizes, patterns, what needs
//! `--verify`); [`settings`] checks what depends on several flags or on the machine. Either way
//! a bad flag is a usage error: one line naming it, exit 2, no drive opened.

use serde::Serialize;

use super::*;

/// The checked flags.
#[derive(Debug)]
pub(crate) struct Settings {
    pub(crate) run: RunSpec,
    pub(super) cores: Vec<usize>,
    pub(super) specs: Vec<DeviceSpec>,
    /// Remote NVMe/TCP subsystems (`-r tcp://…`).
    pub(super) remotes: Vec<TcpAddress>,
    pub(super) stripe: Option<(usize, u64)>,
    pub(super) namespace: Option<u32>,
    pub(super) offset: Option<Given<u64>>,
    pub(super) size: Option<Given<u64>>,
    pub(super) reset_after: Option<Duration>,
    /// `--remove`: the simulated drive and when.
    pub(super) remove: Option<(String, Duration)>,
    /// `--hotplug`: drives bound to vfio-pci during a run join it.
    pub(super) hotplug: bool,
    /// `--add`: a simulated drive that joins the run, and when.
    pub(super) add: Option<(DeviceSpec, Duration)>,
    /// `--pi`: how namespaces formatted with metadata are driven (None: left out).
    pub(super) pi: Option<PiMode>,
}

/// The application tag `--pi` writes and checks: "US".
pub(crate) const PI_APP_TAG: u16 = 0x5553;

/// `--pi` / `-e`, as SPDK's perf takes it: `PRACT=0|1[,PRCHK=GUARD|REFTAG|APPTAG]` (any case;
/// PRCHK lists what the drive checks, `|`-separated).
pub(crate) fn pi_mode(s: &str) -> Result<PiMode, String> {
    const FORM: &str = "PRACT=0|1[,PRCHK=GUARD|REFTAG|APPTAG], e.g. PRACT=0,PRCHK=GUARD|REFTAG";
    let mut action = None;
    let mut checks = PiChecks::NONE;
    for pair in s.split(',').filter(|p| !p.is_empty()) {
        let (key, value) = pair
            .split_once('=')
            .ok_or_else(|| format!("{pair:?} is not KEY=VALUE: {FORM}"))?;
        match (key.to_ascii_uppercase().as_str(), value) {
            ("PRACT", "0") => action = Some(false),
            ("PRACT", "1") => action = Some(true),
            ("PRCHK", list) => {
                for check in list.split('|') {
                    match check.to_ascii_uppercase().as_str() {
                        "GUARD" => checks.guard = true,
                        "REFTAG" => checks.ref_tag = true,
                        "APPTAG" => checks.app_tag = true,
                        _ => {
                            return Err(format!(
                                "PRCHK: {check:?}: expected GUARD, REFTAG or APPTAG"
                            ))
                        }
                    }
                }
            }
            _ => return Err(format!("{pair:?}: {FORM}")),
        }
    }
    let action = action.ok_or_else(|| format!("PRACT is missing: {FORM}"))?;
    Ok(PiMode {
        action,
        checks,
        app_tag: PI_APP_TAG,
    })
}

/// `-w`: the access pattern.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum, Serialize)]
#[serde(rename_all = "lowercase")]
pub(crate) enum Pattern {
    Read,
    Write,
    Randread,
    Randwrite,
    Rw,
    Randrw,
}

impl Pattern {
    fn is_random(self) -> bool {
        matches!(
            self,
            Pattern::Randread | Pattern::Randwrite | Pattern::Randrw
        )
    }

    /// The share of reads, in percent (`mix`: `-M`, for the mixed patterns).
    fn read_pct(self, mix: u32) -> u32 {
        match self {
            Pattern::Read | Pattern::Randread => 100,
            Pattern::Write | Pattern::Randwrite => 0,
            Pattern::Rw | Pattern::Randrw => mix,
        }
    }
}

/// A flag's value and the text it was given as: later errors and the JSON options quote the
/// text (`--offset 1G`, not 1073741824).
#[derive(Debug, Clone)]
pub(crate) struct Given<T> {
    pub(crate) value: T,
    pub(crate) text: String,
}

impl<T> std::fmt::Display for Given<T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.text)
    }
}

impl<T> Serialize for Given<T> {
    fn serialize<S: serde::Serializer>(&self, s: S) -> std::result::Result<S::Ok, S::Error> {
        s.serialize_str(&self.text)
    }
}

/// clap's parser of sizes in bytes (`4096`, `4k`, `128K`, `1M`, `1G`).
pub(super) fn size(s: &str) -> std::result::Result<Given<u64>, String> {
    let value = usnvme_driver::parse_size(s)
        .ok_or("not a size; give bytes like 4096, 4k, 128K, 1M or 1G")?;
    Ok(Given {
        value,
        text: s.into(),
    })
}

/// [`size`], at least one byte.
pub(super) fn positive_size(s: &str) -> std::result::Result<Given<u64>, String> {
    size(s).and_then(|g| match g.value {
        0 => Err("give at least one byte, e.g. 4k".into()),
        _ => Ok(g),
    })
}

/// `--stripe N[:CHUNK]`: N >= 1 drives, CHUNK bytes each (default 128K).
pub(crate) fn stripe(s: &str) -> std::result::Result<Given<(usize, u64)>, String> {
    let bad = || "expected N or N:CHUNK, e.g. 12 or 12:128K (N >= 1)".to_string();
    let (n, chunk) = s.split_once(':').unwrap_or((s, "128K"));
    let n: usize = n.parse().ok().filter(|&n| n > 0).ok_or_else(bad)?;
    let chunk = usnvme_driver::parse_size(chunk)
        .filter(|&c| c > 0)
        .ok_or_else(bad)?;
    Ok(Given {
        value: (n, chunk),
        text: s.into(),
    })
}

/// Seconds (`1`, `2.5`): positive and finite.
pub(super) fn seconds(s: &str) -> std::result::Result<f64, String> {
    s.parse::<f64>()
        .ok()
        .filter(|&s| parse_seconds(s).is_some())
        .ok_or_else(|| "give seconds, e.g. 2 or 1.5".into())
}

/// `--remove sim:N@SECONDS`: one simulated drive and when.
pub(super) fn removal(s: &str) -> std::result::Result<(String, f64), String> {
    let bad = || "expected sim:N@SECONDS, e.g. sim:2@1.5".to_string();
    let (device, at) = s.rsplit_once('@').ok_or_else(bad)?;
    let at = seconds(at).map_err(|_| bad())?;
    match device.parse::<DeviceSpec>() {
        Ok(DeviceSpec::Sim(sim)) if sim.drives.len() == 1 => {
            Ok((format!("sim:{}", sim.drives[0]), at))
        }
        _ => Err(bad()),
    }
}

/// `--add sim:N[,options]@SECONDS`: one simulated drive and when.
pub(super) fn addition(s: &str) -> std::result::Result<(DeviceSpec, f64), String> {
    let bad = || "expected sim:N[,options]@SECONDS, e.g. sim:4,backend=ram@1.5".to_string();
    let (device, at) = s.rsplit_once('@').ok_or_else(bad)?;
    let at = seconds(at).map_err(|_| bad())?;
    match device.parse::<DeviceSpec>() {
        Ok(spec @ DeviceSpec::Sim(_)) if spec.drives().len() == 1 => Ok((spec, at)),
        _ => Err(bad()),
    }
}

/// Seconds as given on the command line (`1`, `2.5`), positive and finite.
pub(super) fn parse_seconds(s: f64) -> Option<Duration> {
    (s.is_finite() && s > 0.0 && s < 1e9).then(|| Duration::from_secs_f64(s))
}

/// Checks everything that does not need the drives.
pub(super) fn settings(args: &Args, topology: &Topology) -> Result<Settings> {
    let io_size = args.io_size.value;
    let cores = match &args.cores {
        None => Vec::new(),
        Some(c) => {
            let cores = parse_cores(c).map_err(|e| usage(format!("-c: {e}")))?;
            if let Some(bad) = cores.iter().find(|&&c| !topology.is_allowed(c)) {
                return Err(usage(format!(
                    "-c {c}: core {bad} does not exist or is not allowed; allowed cores: {}",
                    format_cpu_list(&topology.allowed)
                )));
            }
            cores
        }
    };
    let mut specs: Vec<DeviceSpec> = Vec::new();
    let mut remotes: Vec<TcpAddress> = Vec::new();
    for given in &args.devices {
        let target: Target = given
            .parse()
            .map_err(|e| usage(format!("-r {given}: {e}")))?;
        let spec = match target {
            Target::Local(spec) => spec,
            Target::Remote(addr) => {
                if remotes.contains(&addr) {
                    return Err(usage(format!(
                        "-r {given}: {addr} is given twice; name each device once"
                    )));
                }
                remotes.push(addr);
                continue;
            }
        };
        // A drive that keeps no data reads back nothing: every check would cry wolf. (A real
        // drive keeps data.)
        if let DeviceSpec::Sim(sim) = &spec {
            if args.verify && !sim.keeps_data() {
                return Err(usage(format!(
                    "--verify: -r {given} keeps no data (sim backend=null: reads move none); give it backend=ram, e.g. -r {given},backend=ram"
                )));
            }
        }
        for drive in spec.drives() {
            if specs.contains(&drive) {
                return Err(usage(format!(
                    "-r {given}: {drive} is given twice; name each device once"
                )));
            }
            specs.push(drive);
        }
    }
    let stripe = args.stripe.as_ref().map(|s| s.value);
    let width = stripe.map_or(1, |(n, _)| n as u64);
    if io_size > MAX_SPLIT * width {
        return Err(usage(format!(
            "-o {}: at most {} bytes ({} MiB per drive of a device)",
            args.io_size,
            MAX_SPLIT * width,
            MAX_SPLIT >> 20
        )));
    }
    if args.interrupts && !remotes.is_empty() {
        return Err(usage(format!(
            "--interrupts: {} is an NVMe/TCP target, whose queues raise no interrupts: give only local drives with it",
            remotes[0]
        )));
    }
    let reset_after = match args.reset_after {
        None => None,
        Some(s) if !remotes.is_empty() => {
            return Err(usage(format!(
                "--reset-after {s}: resets local controllers; {} is an NVMe/TCP target: give only local drives with it",
                remotes[0]
            )));
        }
        Some(s) => {
            let after = Duration::from_secs_f64(s);
            if args.io_count.is_none() && after >= Duration::from_secs(args.time) {
                return Err(usage(format!(
                    "--reset-after {s}: the run measures {} s; reset inside it",
                    args.time
                )));
            }
            Some(after)
        }
    };
    let remove = args
        .remove
        .as_ref()
        .map(|(device, at)| (device.clone(), Duration::from_secs_f64(*at)));
    let run = RunSpec {
        io_size,
        depth: args.depth as usize,
        random: args.workload.is_random(),
        read_pct: args.workload.read_pct(args.read_pct),
        warmup: Duration::from_secs(args.warmup),
        duration: args
            .io_count
            .is_none()
            .then(|| Duration::from_secs(args.time)),
        io_count: args.io_count,
        rate: None,
        verify: args.verify,
        corrupt_after: args.corrupt_after,
        seed: args.seed.unwrap_or(std::process::id() as u64 ^ 0x5eed),
        reset_done: None,
        added_spans: Default::default(),
        interrupts: args.interrupts,
    };
    let add = args
        .add
        .as_ref()
        .map(|(device, at)| (device.clone(), Duration::from_secs_f64(*at)));
    Ok(Settings {
        run,
        cores,
        specs,
        remotes,
        stripe,
        namespace: args.namespace,
        offset: args.offset.clone(),
        size: args.size.clone(),
        reset_after,
        remove,
        hotplug: args.hotplug,
        add,
        pi: args.pi,
    })
}
