//! Drives hot-added and hot-removed at a guest test's request. The guest writes
//! `USNVME-VM: hotplug add N`, `USNVME-VM: hotplug port N K` or `USNVME-VM: hotplug del N` on
//! its console (N < `SPARE_PORTS`); vm-run answers through QMP, as an operator's PCIe hot plug
//! would happen: `add` puts an NVMe controller (serial `usnvme-hotN`, a 256 MiB image in the run
//! folder) into the empty root port `spareN`; `port` puts a second controller of drive K's NVM
//! subsystem there (the other port of a dual-port drive: drive K's serial, no namespace of its
//! own, the subsystem's shared ones attached; drive K must be in a subsystem, as a bed with a
//! detached namespace makes every drive); `del` asks for it back (`device_del`) and, once the
//! guest has let it go, drops its block node, so that the same N can be added again. The guest
//! sees the device come and go on its own PCI bus; what vm-run does is only ever reported on its
//! stderr.

use std::path::PathBuf;
use std::time::{Duration, Instant};

use anyhow::{anyhow, bail, Context, Result};
use serde_json::{json, Value};

use super::qemu::{spare_port, SPARE_PORTS};
use super::watchdog::qmp;

/// The size of a hot-added drive's image (sparse).
const IMAGE_SIZE: u64 = 256 << 20;
/// How long the guest may take to let a drive go after `device_del`. q35 signals hot plug on its
/// root ports through ACPI (Linux's acpiphp, built into the guest kernel), which ejects at once;
/// native PCIe hot plug (pciehp) would wait 5 s for an operator to change their mind.
const RELEASE_TIMEOUT: Duration = Duration::from_secs(60);

/// What the guest asks for.
#[derive(Debug, PartialEq, Eq)]
pub enum Request {
    Add(usize),
    /// A second controller of drive K's subsystem in spare port N: (N, K).
    Port(usize, usize),
    Del(usize),
}

const FORMS: &str = "expected `add N`, `port N K` or `del N`";

/// `add N`, `port N K` or `del N`, the part of the console line after `USNVME-VM: hotplug `.
pub fn parse(request: &str) -> Result<Request> {
    let (verb, n, k) = match request.split_whitespace().collect::<Vec<_>>()[..] {
        [verb, n] if verb != "port" => (verb, n, None),
        ["port", n, k] => ("port", n, Some(k)),
        _ => bail!("{request:?}: {FORMS}"),
    };
    let n: usize = n
        .parse()
        .ok()
        .filter(|n| *n < SPARE_PORTS)
        .with_context(|| format!("{request:?}: N is a spare port, 0 to {}", SPARE_PORTS - 1))?;
    match (verb, k) {
        ("add", _) => Ok(Request::Add(n)),
        ("del", _) => Ok(Request::Del(n)),
        ("port", Some(k)) => {
            let k = k
                .parse()
                .with_context(|| format!("{request:?}: K is a drive's index"))?;
            Ok(Request::Port(n, k))
        }
        _ => bail!("{request:?}: {FORMS}"),
    }
}

/// Carries out the guest's requests on the QEMU behind `socket`, one at a time, in order (a `del`
/// is done, block node and all, before a later `add` of the same N begins).
pub struct Hotplug {
    pub socket: PathBuf,
    /// The run's folder, where the images are made.
    pub run_dir: PathBuf,
}

impl Hotplug {
    /// Carries out one request line; says on stderr what was done or why it failed.
    pub fn handle(&self, request: &str) {
        let started = Instant::now();
        let done = parse(request).and_then(|r| match r {
            Request::Add(n) => self.add(n),
            Request::Port(n, k) => self.port(n, k),
            Request::Del(n) => self.del(n),
        });
        match done {
            Ok(what) => eprintln!(
                "vm-run: hotplug: {request}: {what} ({:.1} s)",
                started.elapsed().as_secs_f64()
            ),
            Err(e) => eprintln!("vm-run: hotplug: {request} FAILED: {e:#}"),
        }
    }

    /// Returns what was done.
    fn add(&self, n: usize) -> Result<String> {
        let image = self.run_dir.join(format!("hotplug{n}.img"));
        if !image.exists() {
            let f = std::fs::File::create(&image)
                .with_context(|| format!("creating {}", image.display()))?;
            f.set_len(IMAGE_SIZE)
                .with_context(|| format!("sizing {}", image.display()))?;
        }
        let filename = image
            .to_str()
            .with_context(|| format!("{}: not UTF-8", image.display()))?;
        let node = node(n);
        self.execute(json!({"execute": "blockdev-add", "arguments": {
            "driver": "raw", "node-name": node,
            "file": {"driver": "file", "filename": filename}}}))?;
        let added = self.execute(json!({"execute": "device_add", "arguments": {
            "driver": "nvme", "id": device(n), "serial": format!("usnvme-hot{n}"),
            "drive": node, "bus": spare_port(n)}}));
        if added.is_err() {
            // so that the next `add N` starts clean
            let _ =
                self.execute(json!({"execute": "blockdev-del", "arguments": {"node-name": node}}));
        }
        added.map(|()| format!("{} in port {}", device(n), spare_port(n)))
    }

    /// Returns what was done.
    fn port(&self, n: usize, k: usize) -> Result<String> {
        // QEMU takes a controller into a subsystem only with the subsystem's serial
        self.execute(json!({"execute": "device_add", "arguments": {
            "driver": "nvme", "id": device(n), "serial": format!("usnvme{k}"),
            "subsys": format!("subsys{k}"), "bus": spare_port(n)}}))?;
        Ok(format!(
            "{}, a second controller of drive {k}'s subsystem, in port {}",
            device(n),
            spare_port(n)
        ))
    }

    /// Returns what was done.
    fn del(&self, n: usize) -> Result<String> {
        self.execute(json!({"execute": "device_del", "arguments": {"id": device(n)}}))?;
        // QEMU removes the device once the guest has ejected it, and lets go of its block node
        // some time after that (seen: the device gone from QOM, its node still "in use"):
        // dropping the node is what tells the device is gone for good. A second port has no
        // node: the device gone from QOM is.
        let drop_node = json!({"execute": "blockdev-del", "arguments": {"node-name": node(n)}});
        let present = json!({"execute": "qom-get", "arguments": {
            "path": format!("/machine/peripheral/{}", device(n)), "property": "type"}});
        let deadline = Instant::now() + RELEASE_TIMEOUT;
        loop {
            let (Ok(dropped), Ok(present)) = (self.send(&drop_node), self.send(&present)) else {
                // the guest asked and ended: with QEMU gone there is nothing left to clean up
                return Ok(format!("{} asked back; the run ended first", device(n)));
            };
            match dropped {
                Ok(()) => return Ok(format!("{} gone", device(n))),
                Err(why) if why.starts_with("Failed to find node") && present.is_err() => {
                    return Ok(format!("{} gone", device(n)))
                }
                Err(why) if Instant::now() >= deadline => bail!(
                    "{} not released {} s after device_del: the guest did not let it go \
                     (blockdev-del: {why})",
                    device(n),
                    RELEASE_TIMEOUT.as_secs()
                ),
                Err(_) => std::thread::sleep(Duration::from_millis(100)),
            }
        }
    }

    /// Sends one QMP command; QEMU refusing it is an error too.
    fn execute(&self, command: Value) -> Result<()> {
        self.send(&command)?
            .map_err(|why| anyhow!("{}: {why}", command["execute"]))
    }

    /// Sends one QMP command: Err when QEMU cannot be asked, Ok(Err(its reason)) when it refuses.
    fn send(&self, command: &Value) -> Result<Result<(), String>> {
        let replies = qmp(&self.socket, std::slice::from_ref(command))?;
        let reply = replies.first().context("no QMP reply")?;
        Ok(match reply.get("return") {
            Some(_) => Ok(()),
            None => Err(reply["error"]["desc"]
                .as_str()
                .unwrap_or("no reason given")
                .to_string()),
        })
    }
}

/// The QEMU id of hot-added drive `n`.
fn device(n: usize) -> String {
    format!("hotnvme{n}")
}

/// The block node of hot-added drive `n`.
fn node(n: usize) -> String {
    format!("hotnvm{n}")
}

#[cfg(test)]
mod tests {
    use super::{parse, Request};

    #[test]
    fn requests_name_a_spare_port() {
        assert_eq!(parse("add 0").ok(), Some(Request::Add(0)));
        assert_eq!(parse("del 1").ok(), Some(Request::Del(1)));
        assert_eq!(parse("port 1 3").ok(), Some(Request::Port(1, 3)));
        for bad in [
            "add", "add 2", "add x", "remove 0", "add 0 1", "", "port 0", "port 2 1", "port 0 x",
        ] {
            assert!(parse(bad).is_err(), "{bad:?}");
        }
    }
}
