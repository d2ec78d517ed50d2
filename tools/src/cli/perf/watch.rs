//! Waiting for a run: Ctrl-C / SIGTERM, the live progress line, and the drives' asynchronous
//! events (collected once a second: each is logged as it is found).

use super::*;

/// Waits for the run: stops it on Ctrl-C / SIGTERM (a remote target being reconnected is then
/// given up: its I/Os fail rather than keep the run waiting), shows progress where a person
/// watches (see `progress::wanted`), and collects the `controllers`' asynchronous events.
pub(super) fn watch(
    run: &usnvme_engine::Run<Vec<workload::DeviceResult>>,
    live: bool,
    controllers: &[Controller],
    links: &[Arc<ControllerLink>],
) {
    let tty = live && usnvme_tools::progress::wanted();
    let mut last = (Instant::now(), 0u64, 0u64);
    let mut next_progress = Instant::now() + Duration::from_secs(1);
    let mut next_events = Instant::now() + Duration::from_secs(1);
    while !run.is_finished() {
        if let Some(signal) = signals::received() {
            let why = format!("interrupted by {}", signals::name(signal));
            links.iter().for_each(|l| l.stop_reconnecting(&why));
            run.stop();
            break;
        }
        std::thread::sleep(Duration::from_millis(50));
        if Instant::now() >= next_events {
            next_events += Duration::from_secs(1);
            // (each event is logged as the driver files it; its log page read clears it)
            controllers.iter().for_each(|c| drop(c.events()));
        }
        if tty && Instant::now() >= next_progress {
            next_progress += Duration::from_secs(1);
            let snaps = run.stats();
            let total = usnvme_engine::stats::Snapshot::aggregate(&snaps).total();
            let (ios, bytes) = (total.total_ios(), total.total_bytes());
            let dt = last.0.elapsed().as_secs_f64().max(1e-3);
            eprint!(
                "\r{:>12.0} IOPS {:>8.2} GB/s   ",
                ios.saturating_sub(last.1) as f64 / dt,
                bytes.saturating_sub(last.2) as f64 / dt / 1e9
            );
            last = (Instant::now(), ios, bytes);
        }
    }
    if tty {
        eprint!("\r{:60}\r", "");
    }
}
