//! What a guest program makes the emulated NVMe controllers do, counted from QEMU's own trace
//! events: doorbell writes, register reads, shadow doorbell and EventIdx traffic, interrupts,
//! per command. The guest marks the stretch to count (a request file on the work share, see
//! [`GUEST_FUNCTION`]); a host thread turns the events on through QMP, and off again after,
//! and counts the trace log's lines in between. The events cost QEMU time while on: the
//! counted stretch is not a timed one.

use std::collections::BTreeMap;
use std::io::{BufRead, BufReader, Seek, SeekFrom};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::Duration;

use anyhow::{bail, Context, Result};

use super::watchdog::qmp;

/// The events counted, and what each is. `pci_nvme_io_cmd` (one per I/O command the controller
/// takes) is what the others are divided by.
pub const EVENTS: [(&str, &str); 10] = [
    ("pci_nvme_io_cmd", "I/O commands"),
    ("pci_nvme_mmio_doorbell_sq", "SQ tail doorbell writes"),
    ("pci_nvme_mmio_doorbell_cq", "CQ head doorbell writes"),
    ("pci_nvme_mmio_read", "register reads"),
    (
        "pci_nvme_mmio_write",
        "MMIO writes (doorbells and registers)",
    ),
    (
        "pci_nvme_update_sq_tail",
        "shadow SQ tail reads by the controller",
    ),
    (
        "pci_nvme_update_cq_head",
        "shadow CQ head reads by the controller",
    ),
    ("pci_nvme_update_sq_eventidx", "SQ EventIdx updates"),
    ("pci_nvme_update_cq_eventidx", "CQ EventIdx updates"),
    ("pci_nvme_irq_msix", "MSI-X interrupts"),
];

/// The shell function a guest script calls around what it wants counted:
/// `count_device_ops NAME` before, `count_device_ops off` after. `$TRACE_DIR` is a folder on the
/// work share. It waits for the host's answer (a file), never for a fixed time.
pub const GUEST_FUNCTION: &str = "\
count_device_ops() {
  echo \"$1\" > \"$TRACE_DIR/trace.req.tmp\" && mv \"$TRACE_DIR/trace.req.tmp\" \"$TRACE_DIR/trace.req\"
  while [ ! -e \"$TRACE_DIR/trace.ack\" ]; do sleep 0.1; done
  rm -f \"$TRACE_DIR/trace.ack\"
}
";

/// Each counted stretch's events, by the name the guest gave it.
pub type Counts = BTreeMap<String, BTreeMap<String, u64>>;

/// The host side: answers the guest's requests until [`Counter::finish`].
pub struct Counter {
    stop: Arc<AtomicBool>,
    thread: JoinHandle<Result<Counts>>,
}

impl Counter {
    /// Serves requests in `dir` for the QEMU at `qmp_socket` writing its trace log to `log`.
    pub fn start(dir: PathBuf, qmp_socket: PathBuf, log: PathBuf) -> Counter {
        let stop = Arc::new(AtomicBool::new(false));
        let thread = {
            let stop = stop.clone();
            std::thread::spawn(move || serve(&dir, &qmp_socket, &log, &stop))
        };
        Counter { stop, thread }
    }

    /// Stops serving (the guest is done) and hands back what was counted.
    pub fn finish(self) -> Result<Counts> {
        self.stop.store(true, Ordering::Relaxed);
        match self.thread.join() {
            Ok(r) => r,
            Err(_) => bail!("the trace counter panicked"),
        }
    }
}

/// Answers every request, also one that failed (the guest must never wait for an answer that
/// does not come); the first failure is what the counting gives back.
fn serve(dir: &Path, socket: &Path, log: &Path, stop: &AtomicBool) -> Result<Counts> {
    let (request, ack) = (dir.join("trace.req"), dir.join("trace.ack"));
    let mut counts = Counts::new();
    let mut failure = None;
    // the stretch being counted: its name and where the log stood when it began
    let mut open: Option<(String, u64)> = None;
    while !stop.load(Ordering::Relaxed) {
        let Ok(text) = std::fs::read_to_string(&request) else {
            // the guest writes a request when it reaches one: look again soon
            std::thread::sleep(Duration::from_millis(50));
            continue;
        };
        let _ = std::fs::remove_file(&request);
        let name = text.trim().to_string();
        let answered = if name == "off" {
            set_events(socket, false).and_then(|()| {
                if let Some((name, from)) = open.take() {
                    counts.insert(name, count_events(log, from)?);
                }
                Ok(())
            })
        } else {
            let from = std::fs::metadata(log).map_or(0, |m| m.len());
            open = Some((name, from));
            set_events(socket, true)
        };
        if let Err(e) = answered {
            failure.get_or_insert(e);
        }
        std::fs::write(&ack, "")?;
    }
    match failure {
        Some(e) => Err(e),
        None => Ok(counts),
    }
}

fn set_events(socket: &Path, enable: bool) -> Result<()> {
    let commands: Vec<serde_json::Value> = EVENTS
        .iter()
        .map(|(name, _)| {
            serde_json::json!({"execute": "trace-event-set-state",
                               "arguments": {"name": name, "enable": enable}})
        })
        .collect();
    for (reply, (name, _)) in qmp(socket, &commands)?.iter().zip(EVENTS) {
        if let Some(e) = reply.get("error") {
            bail!("QEMU cannot trace {name}: {e}");
        }
    }
    Ok(())
}

/// The key of the register reads over the whole stretch (start-up and shutdown included).
pub const READS_WHOLE_RUN: &str = "register reads, whole run";

/// Counts the trace log's lines of each event from byte `from` on, in steady state: from the
/// first I/O command to the last (a program's start-up and shutdown read registers and use the
/// admin queue before and after its I/O). The register reads of the whole stretch are kept
/// under [`READS_WHOLE_RUN`].
fn count_events(log: &Path, from: u64) -> Result<BTreeMap<String, u64>> {
    let mut file =
        std::fs::File::open(log).with_context(|| format!("trace log {}", log.display()))?;
    file.seek(SeekFrom::Start(from))?;
    let zero = || -> BTreeMap<String, u64> {
        EVENTS
            .iter()
            .map(|(name, _)| (name.to_string(), 0))
            .collect()
    };
    // what came since the last I/O command: counted once another I/O command follows
    let (mut counts, mut pending, mut reads) = (zero(), zero(), 0);
    let io_cmd = EVENTS[0].0;
    for line in BufReader::new(file).lines() {
        let line = line?;
        let Some(event) = event_of(&line) else {
            continue;
        };
        reads += u64::from(event == "pci_nvme_mmio_read");
        if let Some(n) = pending.get_mut(event) {
            *n += 1;
        }
        if event == io_cmd {
            let since_last = std::mem::replace(&mut pending, zero());
            if counts[io_cmd] == 0 {
                // the first: what came before it was start-up
                counts.insert(io_cmd.to_string(), 1);
                continue;
            }
            for (name, n) in since_last {
                *counts.entry(name).or_default() += n;
            }
        }
    }
    counts.insert(READS_WHOLE_RUN.to_string(), reads);
    Ok(counts)
}

/// The event a log line is of: `1234@1700000000.000001:pci_nvme_mmio_read addr 0x1c size 4`
/// (QEMU's log backend, with or without its pid@time prefix).
fn event_of(line: &str) -> Option<&str> {
    let body = match line.split_once(':') {
        Some((prefix, rest)) if prefix.contains('@') => rest,
        _ => line,
    };
    body.split_whitespace().next()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_the_event_of_a_log_line_with_or_without_its_prefix() {
        assert_eq!(
            event_of("1234@1700000000.000001:pci_nvme_mmio_read addr 0x1c size 4"),
            Some("pci_nvme_mmio_read")
        );
        assert_eq!(
            event_of("pci_nvme_mmio_doorbell_sq sqid 1 new_tail 5"),
            Some("pci_nvme_mmio_doorbell_sq")
        );
        assert_eq!(event_of(""), None);
    }

    #[test]
    fn counts_the_steady_state_of_the_stretch() {
        let dir = std::env::temp_dir().join(format!("usnvme-trace-{}", std::process::id()));
        std::fs::create_dir_all(&dir).expect("a folder");
        let log = dir.join("log");
        let before = "1@1.0:pci_nvme_mmio_doorbell_sq sqid 1 new_tail 1\n";
        let after = "1@1.1:pci_nvme_mmio_read addr 0x0 size 8\n\
                     1@1.2:pci_nvme_mmio_doorbell_sq sqid 1 new_tail 2\n\
                     1@1.3:pci_nvme_io_cmd cid 1 nsid 1 sqid 1 opc 0x2\n\
                     1@1.4:pci_nvme_mmio_doorbell_sq sqid 1 new_tail 3\n\
                     1@1.5:vtd_dmar_fault something\n\
                     1@1.6:pci_nvme_io_cmd cid 2 nsid 1 sqid 1 opc 0x2\n\
                     1@1.7:pci_nvme_mmio_doorbell_cq cqid 1 new_head 2\n\
                     1@1.8:pci_nvme_mmio_read addr 0x1c size 4\n";
        std::fs::write(&log, format!("{before}{after}")).expect("a log");
        let counts = count_events(&log, before.len() as u64).expect("counted");
        // from the first I/O command to the last
        assert_eq!(counts["pci_nvme_io_cmd"], 2);
        assert_eq!(counts["pci_nvme_mmio_doorbell_sq"], 1);
        assert_eq!(counts["pci_nvme_mmio_doorbell_cq"], 0);
        assert_eq!(counts["pci_nvme_mmio_read"], 0);
        assert_eq!(counts[READS_WHOLE_RUN], 2);
        let _ = std::fs::remove_dir_all(&dir);
    }
}
