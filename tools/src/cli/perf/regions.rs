//! The run's block devices and the region of each that each reactor works on.

use super::*;

/// The run's block devices: every namespace (or namespace `nsid`) of every drive, then of every
/// remote subsystem, or stripes of `n` of them (a stripe may mix local and remote ones); those
/// formatted with metadata driven as `pi` says (left out without it).
pub(crate) fn devices(
    engine: &Engine,
    remotes: &[RemoteSubsystem],
    stripe: Option<(usize, u64)>,
    nsid: Option<u32>,
    pi: Option<PiMode>,
) -> Result<Vec<Arc<dyn BlockDevice>>> {
    stripes(namespaces(engine, remotes, nsid, pi)?, stripe)
}

/// Every namespace (or namespace `nsid`) of every drive, then of every remote subsystem.
pub(crate) fn namespaces(
    engine: &Engine,
    remotes: &[RemoteSubsystem],
    nsid: Option<u32>,
    pi: Option<PiMode>,
) -> Result<Vec<Arc<dyn BlockDevice>>> {
    let mut namespaces = match nsid {
        None => engine.namespaces_with_pi(pi),
        Some(nsid) => {
            let mut chosen: Vec<Arc<dyn BlockDevice>> = Vec::new();
            for (i, d) in engine.drives().iter().enumerate() {
                let ns = NamespaceDevice::with_pi(d.controller.clone(), nsid, i, pi)
                    .map_err(|e| usage(format!("-n {nsid}: {e}")))?;
                chosen.push(Arc::new(ns));
            }
            chosen
        }
    };
    for r in remotes {
        let Some(remote) = r.devices(nsid) else {
            let nsids: Vec<String> = r.nsids().iter().map(u32::to_string).collect();
            return Err(usage(format!(
                "-n {}: {} has no namespace {0} (its namespaces: {})",
                nsid.unwrap_or_default(),
                r.address(),
                nsids.join(", ")
            )));
        };
        namespaces.extend(remote);
    }
    Ok(namespaces)
}

/// `namespaces` as they are, or in stripes of `n` (`stripe`: `n` and the chunk).
pub(crate) fn stripes(
    namespaces: Vec<Arc<dyn BlockDevice>>,
    stripe: Option<(usize, u64)>,
) -> Result<Vec<Arc<dyn BlockDevice>>> {
    let devices: Vec<Arc<dyn BlockDevice>> = match stripe {
        None => namespaces,
        Some((n, chunk)) => {
            if !namespaces.len().is_multiple_of(n) {
                return Err(usage(format!(
                    "--stripe {n}: {} namespaces do not make stripes of {n}; give a divisor of {}",
                    namespaces.len(),
                    namespaces.len()
                )));
            }
            let mut stripes: Vec<Arc<dyn BlockDevice>> = Vec::new();
            for (i, members) in namespaces.chunks(n).enumerate() {
                let s = StripeDevice::new(&format!("stripe{i}"), members.to_vec(), chunk)
                    .map_err(|e| usage(format!("--stripe: {e}")))?;
                stripes.push(Arc::new(s));
            }
            stripes
        }
    };
    Ok(devices)
}

/// Each device's I/O region: `--offset` (default 0) and `--size` (default: to the end). An
/// offset beyond a device's capacity, or a region past its end, is a usage error naming the
/// device: nothing has been written yet.
pub(super) fn spans(devices: &[Arc<dyn BlockDevice>], settings: &Settings) -> Result<Vec<Region>> {
    let mut spans = Vec::with_capacity(devices.len());
    for d in devices {
        let info = d.info();
        let (start, len) = match (&settings.offset, &settings.size) {
            (None, None) => (0, info.size_bytes),
            (offset, size) => {
                let start = offset.as_ref().map_or(0, |o| o.value);
                if let Some(given) = offset {
                    if start >= info.size_bytes {
                        return Err(usage(format!(
                            "--offset {given}: beyond the end of {} ({} bytes); give an offset below its capacity",
                            info.name, info.size_bytes
                        )));
                    }
                    if !start.is_multiple_of(u64::from(info.block_size)) {
                        return Err(usage(format!(
                            "--offset {given}: not a multiple of the {}-byte block size of {}",
                            info.block_size, info.name
                        )));
                    }
                }
                let len = size.as_ref().map_or(info.size_bytes - start, |s| s.value);
                if let Some(given) = size {
                    if start
                        .checked_add(len)
                        .is_none_or(|end| end > info.size_bytes)
                    {
                        return Err(usage(format!(
                            "--size {given}: past the end of {} ({} bytes) from offset {start}",
                            info.name, info.size_bytes
                        )));
                    }
                }
                (start, len)
            }
        };
        spans.push(Region { start, len });
    }
    Ok(spans)
}

/// `given`: the flag and value the size came from, e.g. `-o 4k`.
pub(super) fn check_io_size(
    devices: &[Arc<dyn BlockDevice>],
    spans: &[Region],
    io_size: u64,
    given: &str,
) -> Result<()> {
    for (d, span) in devices.iter().zip(spans) {
        let info = d.info();
        if !io_size.is_multiple_of(u64::from(info.block_size)) || io_size > info.size_bytes {
            return Err(usage(format!(
                "{given}: {} needs a multiple of its {}-byte block size, at most {} bytes",
                info.name, info.block_size, info.size_bytes
            )));
        }
        if io_size > span.len {
            return Err(usage(format!(
                "{given}: larger than the {}-byte region of {} (--size)",
                span.len, info.name
            )));
        }
    }
    Ok(())
}

/// A reactor's region of a device's span: the `share.index`-th of `share.of` equal parts, in
/// whole I/Os (at least one I/O each).
pub(super) fn region(span: Region, share: Share, io_size: u64) -> Region {
    let ios = span.len / io_size;
    let per = (ios / share.of.max(1) as u64).max(1);
    let first = (share.index as u64 * per).min(ios.saturating_sub(1));
    Region {
        start: span.start + first * io_size,
        len: per * io_size,
    }
}
