//! The flags checked: everything that does not need the drives (a bad one is a usage error).

use super::*;

/// The checked flags.
#[derive(Debug)]
pub(crate) struct Settings {
    pub(crate) plan: Plan,
    pub(super) cores: Vec<usize>,
    pub(super) specs: Vec<DeviceSpec>,
    pub(super) stripe: Option<(usize, u64)>,
    pub(super) namespace: Option<u32>,
    /// `--offset` and `--size` in bytes, each with the text given (for errors).
    pub(super) offset: Option<(u64, String)>,
    pub(super) size: Option<(u64, String)>,
    pub(super) reset_after: Option<Duration>,
    /// `--remove`: the simulated drive and when.
    pub(super) remove: Option<(String, Duration)>,
}

/// Seconds as given on the command line (`1`, `2.5`), positive and finite.
pub(super) fn parse_seconds(s: f64) -> Option<Duration> {
    (s.is_finite() && s > 0.0 && s < 1e9).then(|| Duration::from_secs_f64(s))
}

/// Checks everything that does not need the drives.
pub(super) fn settings(args: &Args, topology: &Topology) -> Result<Settings> {
    if args.depth == 0 {
        return Err(usage("-q 0: the queue depth must be at least 1"));
    }
    let io_size = usnvme_driver::parse_size(&args.io_size)
        .filter(|&s| s > 0)
        .ok_or_else(|| {
            usage(format!(
                "-o {}: not an I/O size; give bytes like 4096, 4k, 128K or 1M",
                args.io_size
            ))
        })?;
    let (random, read_pct) = match args.workload.as_str() {
        "read" => (false, 100),
        "write" => (false, 0),
        "randread" => (true, 100),
        "randwrite" => (true, 0),
        "rw" => (false, args.read_pct),
        "randrw" => (true, args.read_pct),
        w => {
            return Err(usage(format!(
                "-w {w}: unknown pattern; valid: read, write, randread, randwrite, rw, randrw"
            )))
        }
    };
    if args.read_pct > 100 {
        return Err(usage(format!(
            "-M {}: the read percentage must be 0-100",
            args.read_pct
        )));
    }
    if args.time == 0 {
        return Err(usage("-t 0: the run time must be at least 1 second"));
    }
    if args.io_count == Some(0) {
        return Err(usage("--io-count 0: give at least 1 I/O"));
    }
    if args.rate == Some(0) {
        return Err(usage("--rate 0: give a rate of at least 1 IOPS"));
    }
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
    for given in &args.devices {
        let spec: DeviceSpec = given
            .parse()
            .map_err(|e| usage(format!("-r {given}: {e}")))?;
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
    let stripe = match &args.stripe {
        None => None,
        Some(s) => {
            let bad = || {
                usage(format!(
                    "--stripe {s}: expected N or N:CHUNK, e.g. 12 or 12:128K (N >= 1)"
                ))
            };
            let (n, chunk) = s.split_once(':').unwrap_or((s, "128K"));
            let n: usize = n.parse().ok().filter(|&n| n > 0).ok_or_else(bad)?;
            let chunk = usnvme_driver::parse_size(chunk)
                .filter(|&c| c > 0)
                .ok_or_else(bad)?;
            Some((n, chunk))
        }
    };
    let width = stripe.map_or(1, |(n, _)| n as u64);
    if io_size > MAX_SPLIT * width {
        return Err(usage(format!(
            "-o {}: at most {} bytes ({} MiB per drive of a device)",
            args.io_size,
            MAX_SPLIT * width,
            MAX_SPLIT >> 20
        )));
    }
    if args.corrupt_after.is_some() && !args.verify {
        return Err(usage("--corrupt-after needs --verify"));
    }
    if args.seed.is_some() && !args.verify {
        return Err(usage("--seed needs --verify"));
    }
    if args.namespace == Some(0) {
        return Err(usage("-n 0: namespace IDs start at 1"));
    }
    let bytes = |flag: &str, given: &Option<String>| -> Result<Option<(u64, String)>> {
        match given {
            None => Ok(None),
            Some(g) => usnvme_driver::parse_size(g)
                .map(|b| Some((b, g.clone())))
                .ok_or_else(|| {
                    usage(format!(
                        "{flag} {g}: not a size; give bytes like 4096, 4k, 128M or 1G"
                    ))
                }),
        }
    };
    let offset = bytes("--offset", &args.offset)?;
    let size = bytes("--size", &args.size)?;
    if let Some((0, given)) = &size {
        return Err(usage(format!("--size {given}: give at least one I/O")));
    }
    let reset_after = match args.reset_after {
        None => None,
        Some(s) => {
            let after = parse_seconds(s).ok_or_else(|| {
                usage(format!(
                    "--reset-after {s}: give the seconds into the measurement, e.g. 2 or 1.5"
                ))
            })?;
            if args.io_count.is_none() && after >= Duration::from_secs(args.time) {
                return Err(usage(format!(
                    "--reset-after {s}: the run measures {} s; reset inside it",
                    args.time
                )));
            }
            Some(after)
        }
    };
    let remove = match &args.remove {
        None => None,
        Some(r) => {
            let bad = || {
                usage(format!(
                    "--remove {r}: expected sim:N@SECONDS, e.g. sim:2@1.5"
                ))
            };
            let (device, at) = r.rsplit_once('@').ok_or_else(bad)?;
            let at = at
                .parse::<f64>()
                .ok()
                .and_then(parse_seconds)
                .ok_or_else(bad)?;
            match device.parse::<DeviceSpec>() {
                Ok(DeviceSpec::Sim(sim)) if sim.drives.len() == 1 => {
                    Some((format!("sim:{}", sim.drives[0]), at))
                }
                _ => return Err(bad()),
            }
        }
    };
    let plan = Plan {
        io_size,
        depth: args.depth as usize,
        random,
        read_pct,
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
    };
    Ok(Settings {
        plan,
        cores,
        specs,
        stripe,
        namespace: args.namespace,
        offset,
        size,
        reset_after,
        remove,
    })
}
