//! Per-reactor, per-device I/O statistics, merged on request.
//!
//! Each reactor owns one [`IoStats`] per device it serves and calls [`IoStats::record`] from its
//! completion handler: plain counters and a preallocated HDR histogram per op kind, so recording
//! takes no lock, no atomic and no allocation. On a stats request the reactor sends a [`Snapshot`]
//! (a copy, made off the I/O path) to the control thread, which merges snapshots per device and
//! into a machine total.
//!
//! Latencies are kept in nanoseconds in log-linear histograms from 1 ns to 1 hour with 3
//! significant digits (every value within 0.1 %); a longer latency is clamped to 1 hour, never
//! lost. Count, sum, min and max are kept exactly, so mean, min and max are exact. Failed I/Os only
//! count as errors: I/Os, bytes and latencies describe successful I/O. Memory: about 264 KiB per
//! histogram, three per [`IoStats`], touched once at creation so that no page faults on the I/O path.

use std::collections::BTreeMap;
use std::time::Duration;

use hdrhistogram::Histogram;
use serde::ser::{SerializeMap, Serializer};
use serde::Serialize;

/// Longest latency recorded as such (1 hour); longer ones are recorded as this.
pub const MAX_LATENCY_NS: u64 = 3_600 * 1_000_000_000;
/// The percentiles reported by default, as `spdk_nvme_perf -L` and fio do.
pub const DEFAULT_PERCENTILES: [f64; 5] = [50.0, 90.0, 99.0, 99.9, 99.99];
const SIGNIFICANT_DIGITS: u8 = 3;
/// Histogram dump resolution: buckets per doubling of latency (each about 9 % wide).
const BUCKETS_PER_OCTAVE: f64 = 8.0;

/// What an I/O was, for statistics. Block-layer reads map to `Read`, writes to `Write`; flush,
/// write zeroes and deallocate map to `Other`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum OpKind {
    Read,
    Write,
    Other,
}

impl OpKind {
    pub const ALL: [OpKind; 3] = [OpKind::Read, OpKind::Write, OpKind::Other];

    pub fn name(self) -> &'static str {
        match self {
            OpKind::Read => "read",
            OpKind::Write => "write",
            OpKind::Other => "other",
        }
    }
}

/// Counters and latencies of one op kind.
#[derive(Clone, Debug)]
struct Lane {
    ios: u64,
    bytes: u64,
    lat_sum_ns: u128,
    /// Sum of squared latencies: the standard deviation without a histogram.
    lat_sq_sum_ns: u128,
    lat_min_ns: u64,
    lat_max_ns: u64,
    /// Percentiles, when asked for (`-L`): recording costs more than everything else here.
    hist: Option<Histogram<u64>>,
}

impl Lane {
    fn new(histogram: bool) -> Self {
        let hist = histogram.then(|| {
            let mut hist = Histogram::new_with_bounds(1, MAX_LATENCY_NS, SIGNIFICANT_DIGITS)
                .expect("constant histogram bounds are valid");
            // The counts come zeroed from the allocator, possibly as untouched pages: write
            // them once now so that the first I/O landing on a page does not take a page fault.
            hist.reset();
            hist
        });
        Lane {
            ios: 0,
            bytes: 0,
            lat_sum_ns: 0,
            lat_sq_sum_ns: 0,
            lat_min_ns: u64::MAX,
            lat_max_ns: 0,
            hist,
        }
    }

    fn reset(&mut self) {
        self.ios = 0;
        self.bytes = 0;
        self.lat_sum_ns = 0;
        self.lat_sq_sum_ns = 0;
        self.lat_min_ns = u64::MAX;
        self.lat_max_ns = 0;
        if let Some(h) = &mut self.hist {
            h.reset();
        }
    }

    fn merge(&mut self, other: &Lane) {
        self.ios += other.ios;
        self.bytes += other.bytes;
        self.lat_sum_ns += other.lat_sum_ns;
        self.lat_sq_sum_ns += other.lat_sq_sum_ns;
        self.lat_min_ns = self.lat_min_ns.min(other.lat_min_ns);
        self.lat_max_ns = self.lat_max_ns.max(other.lat_max_ns);
        match (&mut self.hist, &other.hist) {
            (Some(mine), Some(theirs)) => merge_histograms(mine, theirs),
            (None, Some(theirs)) if self.ios == other.ios => self.hist = Some(theirs.clone()),
            _ => {}
        }
    }

    fn stdev_ns(&self) -> f64 {
        if self.ios == 0 {
            return 0.0;
        }
        let n = self.ios as f64;
        let mean = self.lat_sum_ns as f64 / n;
        (self.lat_sq_sum_ns as f64 / n - mean * mean)
            .max(0.0)
            .sqrt()
    }
}

/// Adds `theirs` into `mine`. Same bounds, so `add` cannot fail; should it, value by value.
fn merge_histograms(mine: &mut Histogram<u64>, theirs: &Histogram<u64>) {
    if mine.add(theirs).is_err() {
        for v in theirs.iter_recorded() {
            mine.saturating_record_n(v.value_iterated_to(), v.count_at_value());
        }
    }
}

/// Statistics of one device as seen by one reactor (or, once merged, by several).
#[derive(Clone, Debug)]
pub struct IoStats {
    lanes: [Lane; 3],
    errors: u64,
    /// The longest stretch with I/O in flight and no completion (jitter: a reactor held up,
    /// a device that paused), noted once per batch of completions.
    longest_gap_ns: u64,
}

impl Default for IoStats {
    fn default() -> Self {
        Self::new()
    }
}

impl IoStats {
    /// With latency histograms (about 800 KiB, allocated now: before I/O starts).
    pub fn new() -> Self {
        Self::with_histograms(true)
    }

    /// Counters, latency sum, min, max and deviation always; percentiles only with `histograms`.
    pub fn with_histograms(histograms: bool) -> Self {
        IoStats {
            lanes: [
                Lane::new(histograms),
                Lane::new(histograms),
                Lane::new(histograms),
            ],
            errors: 0,
            longest_gap_ns: 0,
        }
    }

    /// A batch of completions came `gap_ns` after the previous one (or after the device was
    /// given its first I/O) with I/O in flight all along.
    #[inline]
    pub fn note_gap(&mut self, gap_ns: u64) {
        self.longest_gap_ns = self.longest_gap_ns.max(gap_ns);
    }

    /// The longest stretch with I/O in flight and no completion, in nanoseconds.
    pub fn longest_gap_ns(&self) -> u64 {
        self.longest_gap_ns
    }

    /// Whether latency percentiles are kept.
    pub fn has_histograms(&self) -> bool {
        self.lanes.iter().all(|l| l.hist.is_some())
    }

    /// Records one completed I/O. No allocation, no lock; latencies above 1 hour are clamped.
    /// (Always inlined: it runs once per I/O, in the completion loop.)
    #[inline(always)]
    pub fn record(&mut self, kind: OpKind, bytes: u64, latency_ns: u64, ok: bool) {
        if !ok {
            self.errors += 1;
            return;
        }
        let lat = latency_ns.min(MAX_LATENCY_NS);
        let lane = &mut self.lanes[kind as usize];
        lane.ios += 1;
        lane.bytes += bytes;
        lane.lat_sum_ns += u128::from(lat);
        lane.lat_sq_sum_ns += u128::from(lat) * u128::from(lat);
        lane.lat_min_ns = lane.lat_min_ns.min(lat);
        lane.lat_max_ns = lane.lat_max_ns.max(lat);
        if let Some(h) = &mut lane.hist {
            h.saturating_record(lat);
        }
    }

    /// Adds `other` into `self` (off the I/O path).
    pub fn merge(&mut self, other: &IoStats) {
        for (lane, o) in self.lanes.iter_mut().zip(&other.lanes) {
            lane.merge(o);
        }
        self.errors += other.errors;
        self.longest_gap_ns = self.longest_gap_ns.max(other.longest_gap_ns);
    }

    pub fn reset(&mut self) {
        self.lanes.iter_mut().for_each(Lane::reset);
        self.errors = 0;
        self.longest_gap_ns = 0;
    }

    /// Successful I/Os of `kind`.
    pub fn ios(&self, kind: OpKind) -> u64 {
        self.lanes[kind as usize].ios
    }

    /// Bytes moved by successful I/Os of `kind`.
    pub fn bytes(&self, kind: OpKind) -> u64 {
        self.lanes[kind as usize].bytes
    }

    /// Failed I/Os of all kinds.
    pub fn errors(&self) -> u64 {
        self.errors
    }

    pub fn total_ios(&self) -> u64 {
        self.lanes.iter().map(|l| l.ios).sum()
    }

    pub fn total_bytes(&self) -> u64 {
        self.lanes.iter().map(|l| l.bytes).sum()
    }

    pub fn iops(&self, kind: OpKind, elapsed: Duration) -> f64 {
        per_second(self.ios(kind), elapsed)
    }

    pub fn mib_per_s(&self, kind: OpKind, elapsed: Duration) -> f64 {
        per_second(self.bytes(kind), elapsed) / (1024.0 * 1024.0)
    }

    /// Latency summary of `kind` with the [`DEFAULT_PERCENTILES`].
    pub fn latency(&self, kind: OpKind) -> LatencySummary {
        self.latency_at(kind, &DEFAULT_PERCENTILES)
    }

    /// Latency summary of `kind` with the given percentiles (0..=100); no percentiles without
    /// histograms.
    pub fn latency_at(&self, kind: OpKind, percentiles: &[f64]) -> LatencySummary {
        let lane = &self.lanes[kind as usize];
        let percentiles = if lane.hist.is_some() {
            percentiles
        } else {
            &[]
        };
        if lane.ios == 0 {
            return LatencySummary {
                percentiles: percentiles.iter().map(|&p| (p, 0)).collect(),
                ..LatencySummary::default()
            };
        }
        let (min, max) = (lane.lat_min_ns, lane.lat_max_ns);
        LatencySummary {
            count: lane.ios,
            min_ns: min,
            max_ns: max,
            mean_ns: lane.lat_sum_ns as f64 / lane.ios as f64,
            stdev_ns: lane.stdev_ns(),
            // A histogram value is the top of its bucket: keep it within what was really seen.
            percentiles: lane.hist.as_ref().map_or(Vec::new(), |h| {
                percentiles
                    .iter()
                    .map(|&p| (p, h.value_at_percentile(p).clamp(min, max)))
                    .collect()
            }),
        }
    }

    /// The non-empty buckets of `kind`'s latency histogram, log-spaced, for a `-LL` dump (none
    /// without histograms).
    pub fn buckets(&self, kind: OpKind) -> Vec<Bucket> {
        let Some(hist) = &self.lanes[kind as usize].hist else {
            return Vec::new();
        };
        let mut low_ns = 0;
        let mut out = Vec::new();
        for v in hist.iter_log(1, 2f64.powf(1.0 / BUCKETS_PER_OCTAVE)) {
            let high_ns = v.value_iterated_to();
            if v.count_since_last_iteration() > 0 {
                out.push(Bucket {
                    low_ns,
                    high_ns,
                    count: v.count_since_last_iteration(),
                    cumulative_percent: v.percentile(),
                });
            }
            low_ns = low_ns.max(high_ns + 1);
        }
        out
    }

    /// A fio-style summary of one direction over `elapsed`.
    pub fn direction(&self, kind: OpKind, elapsed: Duration, percentiles: &[f64]) -> Direction {
        let bytes = self.bytes(kind);
        let bw_bytes = per_second(bytes, elapsed);
        Direction {
            io_bytes: bytes,
            io_kbytes: bytes / 1024,
            bw_bytes: bw_bytes as u64,
            bw: (bw_bytes / 1024.0) as u64,
            iops: self.iops(kind, elapsed),
            runtime: elapsed.as_millis() as u64,
            total_ios: self.ios(kind),
            lat_ns: self.latency_at(kind, percentiles),
        }
    }
}

/// `count` events over `elapsed`, per second (0 for an empty interval).
pub fn per_second(count: u64, elapsed: Duration) -> f64 {
    let secs = elapsed.as_secs_f64();
    if secs > 0.0 {
        count as f64 / secs
    } else {
        0.0
    }
}

/// fio's percentile key: `99.99` → `"99.990000"`.
pub fn fio_key(percent: f64) -> String {
    format!("{percent:.6}")
}

/// Latency statistics in ns; serializes as fio's `lat_ns` object
/// (`min`, `max`, `mean`, `stddev`, `N`, `percentile: { "99.990000": ns, … }`).
#[derive(Clone, Debug, Default, PartialEq, Serialize)]
pub struct LatencySummary {
    #[serde(rename = "N")]
    pub count: u64,
    #[serde(rename = "min")]
    pub min_ns: u64,
    #[serde(rename = "max")]
    pub max_ns: u64,
    #[serde(rename = "mean")]
    pub mean_ns: f64,
    #[serde(rename = "stddev")]
    pub stdev_ns: f64,
    /// (percent, ns), in the order requested.
    #[serde(rename = "percentile", serialize_with = "fio_map")]
    pub percentiles: Vec<(f64, u64)>,
}

impl LatencySummary {
    /// The percentiles keyed as fio keys them, in the order requested.
    pub fn fio_percentiles(&self) -> Vec<(String, u64)> {
        self.percentiles
            .iter()
            .map(|&(p, ns)| (fio_key(p), ns))
            .collect()
    }
}

fn fio_map<S: Serializer>(percentiles: &[(f64, u64)], s: S) -> Result<S::Ok, S::Error> {
    let mut map = s.serialize_map(Some(percentiles.len()))?;
    for &(p, ns) in percentiles {
        map.serialize_entry(&fio_key(p), &ns)?;
    }
    map.end()
}

/// One bucket of a latency histogram dump: `count` I/Os took `low_ns..=high_ns`, and
/// `cumulative_percent` of all took at most `high_ns`.
#[derive(Clone, Copy, Debug, PartialEq, Serialize)]
pub struct Bucket {
    pub low_ns: u64,
    pub high_ns: u64,
    pub count: u64,
    pub cumulative_percent: f64,
}

/// One direction of a job as fio's JSON writes it (`read` / `write` / `trim` objects):
/// bytes, KiB, B/s, KiB/s, IOPS, runtime in ms, I/O count and latency.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Direction {
    pub io_bytes: u64,
    pub io_kbytes: u64,
    pub bw_bytes: u64,
    pub bw: u64,
    pub iops: f64,
    pub runtime: u64,
    pub total_ios: u64,
    pub lat_ns: LatencySummary,
}

/// What a reactor sends the control thread: its statistics per device index, and how long it ran.
#[derive(Clone, Debug, Default)]
pub struct Snapshot {
    pub elapsed: Duration,
    pub devices: BTreeMap<usize, IoStats>,
}

impl Snapshot {
    pub fn new(elapsed: Duration) -> Self {
        Snapshot {
            elapsed,
            devices: BTreeMap::new(),
        }
    }

    /// Adds `stats` of `device` (copied, or merged with what is there).
    pub fn add(&mut self, device: usize, stats: &IoStats) {
        match self.devices.get_mut(&device) {
            Some(s) => s.merge(stats),
            None => {
                self.devices.insert(device, stats.clone());
            }
        }
    }

    /// Merges another reactor's snapshot: per device; reactors run side by side, so the elapsed
    /// time is the longer of the two.
    pub fn merge(&mut self, other: &Snapshot) {
        self.elapsed = self.elapsed.max(other.elapsed);
        for (&device, stats) in &other.devices {
            self.add(device, stats);
        }
    }

    /// All reactors' snapshots merged per device.
    pub fn aggregate<'a>(snapshots: impl IntoIterator<Item = &'a Snapshot>) -> Snapshot {
        let mut all = Snapshot::default();
        snapshots.into_iter().for_each(|s| all.merge(s));
        all
    }

    /// Every device merged into one.
    pub fn total(&self) -> IoStats {
        let histograms = self.devices.values().all(IoStats::has_histograms);
        let mut total = IoStats::with_histograms(histograms);
        self.devices.values().for_each(|s| total.merge(s));
        total
    }
}

// A reactor's statistics travel to the thread that asked for them.
static_assertions::assert_impl_all!(Snapshot: Send);

#[cfg(test)]
mod tests {
    use super::*;

    fn within(actual: u64, expected: u64, rel: f64) -> bool {
        (actual as f64 - expected as f64).abs() <= expected as f64 * rel
    }

    #[test]
    fn uniform_latencies_give_known_percentiles() {
        let mut s = IoStats::new();
        for us in 1..=10_000u64 {
            s.record(OpKind::Read, 4096, us * 1000, true);
        }
        let l = s.latency(OpKind::Read);
        assert_eq!((l.count, l.min_ns, l.max_ns), (10_000, 1_000, 10_000_000));
        assert!((l.mean_ns - 5_000_500.0).abs() < 1e-6);
        assert!(
            (l.stdev_ns - 2_886_751.0).abs() < 2_886_751.0 * 0.001,
            "{}",
            l.stdev_ns
        );
        let expect = [5_000_000, 9_000_000, 9_900_000, 9_990_000, 9_999_000];
        for (&(p, ns), want) in l.percentiles.iter().zip(expect) {
            assert!(within(ns, want, 0.001), "p{p}: {ns} vs {want}");
        }
        assert_eq!(
            s.latency_at(OpKind::Read, &[100.0]).percentiles,
            [(100.0, 10_000_000)]
        );
        assert_eq!(
            (s.ios(OpKind::Read), s.bytes(OpKind::Read)),
            (10_000, 40_960_000)
        );
        assert_eq!(
            (s.ios(OpKind::Write), s.latency(OpKind::Write).count),
            (0, 0)
        );
        assert!((s.iops(OpKind::Read, Duration::from_secs(2)) - 5_000.0).abs() < 1e-9);
    }

    #[test]
    fn merge_equals_recording_both() {
        let (mut a, mut b, mut both) = (IoStats::new(), IoStats::new(), IoStats::new());
        for i in 1..=5_000u64 {
            let (kind, lat) = if i % 3 == 0 {
                (OpKind::Write, i * 7)
            } else {
                (OpKind::Read, i * 13)
            };
            let part = if i % 2 == 0 { &mut a } else { &mut b };
            part.record(kind, 512, lat, i % 100 != 0);
            both.record(kind, 512, lat, i % 100 != 0);
        }
        a.merge(&b);
        for k in OpKind::ALL {
            assert_eq!(a.latency(k), both.latency(k));
            assert_eq!(a.buckets(k), both.buckets(k));
            assert_eq!((a.ios(k), a.bytes(k)), (both.ios(k), both.bytes(k)));
        }
        assert_eq!(a.errors(), 50);
        a.reset();
        assert_eq!(
            (a.total_ios(), a.errors(), a.buckets(OpKind::Read).len()),
            (0, 0, 0)
        );
    }

    #[test]
    fn over_an_hour_is_clamped_and_errors_are_apart() {
        let mut s = IoStats::new();
        s.record(OpKind::Other, 0, 2 * MAX_LATENCY_NS, true);
        s.record(OpKind::Other, 0, 5, false);
        let l = s.latency(OpKind::Other);
        assert_eq!((l.count, l.max_ns, s.errors()), (1, MAX_LATENCY_NS, 1));
        assert_eq!(l.percentiles[4].1, MAX_LATENCY_NS);
    }

    #[test]
    fn recording_never_grows_the_histogram() {
        let mut s = IoStats::new();
        let values = |s: &IoStats| s.lanes[0].hist.as_ref().map(|h| h.distinct_values());
        let len = values(&s);
        assert!(len.is_some());
        for i in 0..1_000_000u64 {
            s.record(
                OpKind::Read,
                4096,
                i.wrapping_mul(0x9E37_79B9_7F4A_7C15) >> 20,
                true,
            );
        }
        assert_eq!(values(&s), len);
    }

    #[test]
    fn without_histograms_the_summary_is_exact_and_has_no_percentiles() {
        let mut s = IoStats::with_histograms(false);
        for us in 1..=10_000u64 {
            s.record(OpKind::Read, 4096, us * 1000, true);
        }
        let l = s.latency(OpKind::Read);
        assert_eq!((l.count, l.min_ns, l.max_ns), (10_000, 1_000, 10_000_000));
        assert!((l.mean_ns - 5_000_500.0).abs() < 1e-6);
        // the population standard deviation of 1..=10000 us
        assert!((l.stdev_ns - 2_886_751.2).abs() < 1.0, "{}", l.stdev_ns);
        assert!(l.percentiles.is_empty());
        assert!(s.buckets(OpKind::Read).is_empty());
    }

    #[test]
    fn buckets_cover_everything_in_order() {
        let mut s = IoStats::new();
        for us in [3u64, 10, 10, 11, 250, 9_000] {
            s.record(OpKind::Write, 4096, us * 1000, true);
        }
        let b = s.buckets(OpKind::Write);
        assert_eq!(b.iter().map(|b| b.count).sum::<u64>(), 6);
        assert!(b.windows(2).all(|w| w[0].high_ns < w[1].low_ns));
        assert!(b.iter().all(|b| b.low_ns <= b.high_ns && b.count > 0));
        assert!(b[0].low_ns <= 3_000 && b[0].high_ns >= 3_000 && b[0].high_ns < 3_300);
        assert!((b[b.len() - 1].cumulative_percent - 100.0).abs() < 1e-9);
    }

    #[test]
    fn fio_keys_and_json() {
        assert_eq!(fio_key(99.99), "99.990000");
        assert_eq!(fio_key(50.0), "50.000000");
        let mut s = IoStats::new();
        s.record(OpKind::Read, 4096, 1_000, true);
        let d = s.direction(OpKind::Read, Duration::from_secs(1), &[50.0, 99.99]);
        assert_eq!(
            d.lat_ns.fio_percentiles()[1],
            ("99.990000".to_string(), 1_000)
        );
        let json = serde_json::to_value(&d).expect("serializes");
        assert_eq!(json["bw"], 4);
        assert_eq!(json["lat_ns"]["N"], 1);
        assert_eq!(json["lat_ns"]["percentile"]["99.990000"], 1_000);
        assert_eq!(json["lat_ns"]["stddev"], 0.0);
    }

    #[test]
    fn snapshots_merge_per_device_and_in_total() {
        let one = |n: u64| {
            let mut s = IoStats::new();
            (0..n).for_each(|_| s.record(OpKind::Read, 4096, 10_000, true));
            s
        };
        let mut r0 = Snapshot::new(Duration::from_secs(2));
        r0.add(0, &one(100));
        r0.add(1, &one(200));
        let mut r1 = Snapshot::new(Duration::from_secs(3));
        r1.add(1, &one(300));
        r1.add(2, &one(400));
        let all = Snapshot::aggregate([&r0, &r1]);
        assert_eq!(all.elapsed, Duration::from_secs(3));
        let per_dev: Vec<_> = all
            .devices
            .iter()
            .map(|(&d, s)| (d, s.ios(OpKind::Read)))
            .collect();
        assert_eq!(per_dev, [(0, 100), (1, 500), (2, 400)]);
        let total = all.total();
        assert_eq!((total.total_ios(), total.total_bytes()), (1_000, 4_096_000));
        assert!(
            (total.mib_per_s(OpKind::Read, all.elapsed) - 4_096_000.0 / 3.0 / 1048576.0).abs()
                < 1e-9
        );
    }
}
