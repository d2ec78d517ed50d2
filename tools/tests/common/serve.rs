//! `usnvme serve` on `sim:` drives over 127.0.0.1, started and stopped for a test: the
//! target the NVMe/TCP tests (`serve.rs`, `remote.rs`) run against. Each test binary uses a
//! part of it.
#![allow(dead_code)]

use std::io::{BufRead, BufReader};
use std::net::SocketAddr;
use std::process::{Child, Command, Stdio};

use usnvme_engine::transport::tcp::initiator::{CommandQueue, HostOptions};

/// The host NQN the tests connect as (`HostOptions::default()`'s).
pub const HOST: &str = "nqn.2014-08.org.nvmexpress:uuid:75736e76-6d65-4000-8000-686f73743031";
/// The subsystem serve exports.
pub const NQN: &str = "nqn.2024-01.io.usnvme:test-serve";

/// A running `usnvme serve` and where it listens.
pub struct Serve {
    pub child: Child,
    /// Where it listens first (127.0.0.1), and every listener (`--listen` in `extra` adds some).
    pub addr: SocketAddr,
    pub listeners: Vec<SocketAddr>,
    pub status: std::path::PathBuf,
    /// Its control socket (`usnvme target --socket`), and its config file if it has one.
    pub control: std::path::PathBuf,
    pub config: Option<std::path::PathBuf>,
}

/// A number of its own for each target a test process starts.
fn next_target() -> usize {
    static STARTED: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
    STARTED.fetch_add(1, std::sync::atomic::Ordering::Relaxed)
}

impl Serve {
    pub fn start(extra: &[&str]) -> Serve {
        Serve::start_on("sim:0-1,backend=ram,size=16M", extra)
    }

    /// `usnvme serve` on one reactor (core 0) exporting the `sim:` drives `device`.
    pub fn start_on(device: &str, extra: &[&str]) -> Serve {
        let args = [
            "-r",
            device,
            "-c",
            "0",
            "--listen",
            "127.0.0.1:0",
            "--nqn",
            NQN,
        ];
        Serve::spawn(&args, extra, None)
    }

    /// `usnvme serve --config` of `config` (written to a file of its own: `config_file`),
    /// with a control socket of its own (`control`).
    pub fn with_config(config: &serde_json::Value, extra: &[&str]) -> Serve {
        let nth = next_target();
        let file =
            std::env::temp_dir().join(format!("serve-config-{}-{nth}.json", std::process::id()));
        std::fs::write(&file, config.to_string()).expect("the config written");
        let path = file.to_str().expect("UTF-8 temp path").to_string();
        Serve::spawn(&["--config", &path], extra, Some(file))
    }

    fn spawn(args: &[&str], extra: &[&str], config: Option<std::path::PathBuf>) -> Serve {
        // one status file and control socket per target: tests run at once, and two sharing
        // a file made one target fail to write it and exit (a host then saw its connection
        // reset)
        let nth = next_target();
        // (the status file's own name ends in .json: serve writes it through NAME.tmp)
        let name = |what: &str| {
            std::env::temp_dir().join(format!("serve-{}-{nth}-{what}", std::process::id()))
        };
        let (status, control) = (name("status.json"), name("control.sock"));
        let mut child = Command::new(env!("CARGO_BIN_EXE_usnvme"))
            .arg("serve")
            .args(args)
            .args([
                "--json-status",
                status.to_str().expect("UTF-8 temp path"),
                "--control",
                control.to_str().expect("UTF-8 temp path"),
            ])
            .args(extra)
            .env_remove("RUST_LOG")
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .expect("usnvme runs");
        let stdout = child.stdout.take().expect("piped");
        let mut listeners = Vec::new();
        for line in BufReader::new(stdout).lines() {
            let line = line.expect("a line");
            if let Some(rest) = line.strip_prefix("listening on ") {
                listeners.extend(
                    rest.split_whitespace()
                        .next()
                        .and_then(|a| a.parse::<SocketAddr>().ok()),
                );
            }
            if line.starts_with("hosts:") {
                break;
            }
        }
        let addr = *listeners.first().expect("serve says where it listens");
        Serve {
            child,
            addr,
            listeners,
            status,
            control,
            config,
        }
    }

    /// `usnvme target --socket (this target's) ARGS`: its exit status, output and errors.
    pub fn target(&self, args: &[&str]) -> (Option<i32>, String, String) {
        let out = Command::new(env!("CARGO_BIN_EXE_usnvme"))
            .args(["target", "--socket", self.control.to_str().expect("UTF-8")])
            .args(args)
            .output()
            .expect("usnvme target runs");
        let text = |b: &[u8]| String::from_utf8_lossy(b).into_owned();
        (out.status.code(), text(&out.stdout), text(&out.stderr))
    }

    /// `usnvme target ARGS`, which must succeed: its output.
    pub fn target_ok(&self, args: &[&str]) -> String {
        let (code, out, err) = self.target(args);
        assert_eq!(code, Some(0), "usnvme target {args:?}: {err}");
        out
    }

    /// Waits (at most 20 s) until the status file says `done`; returns that status.
    pub fn wait_for_status(
        &self,
        what: &str,
        done: impl Fn(&serde_json::Value) -> bool,
    ) -> serde_json::Value {
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(20);
        loop {
            let status = std::fs::read(&self.status)
                .ok()
                .and_then(|b| serde_json::from_slice::<serde_json::Value>(&b).ok());
            if let Some(status) = status.as_ref().filter(|s| done(s)) {
                return status.clone();
            }
            assert!(
                std::time::Instant::now() < deadline,
                "after 20 s still not {what}: {status:?}"
            );
            std::thread::sleep(std::time::Duration::from_millis(50));
        }
    }

    /// An admin queue to `subnqn`, enabled (CC.EN, then CSTS.RDY).
    pub fn admin(&self, subnqn: &str, opts: &HostOptions) -> (CommandQueue, u16) {
        let (mut q, cntlid) =
            CommandQueue::connect(self.addr, subnqn, 0, 32, 0xffff, opts).expect("admin connect");
        q.property_set(0x14, false, 1 | 6 << 16 | 4 << 20)
            .expect("CC.EN");
        let csts = q.property_get(0x1c, false).expect("CSTS");
        assert_eq!(csts & 1, 1, "CSTS.RDY");
        (q, cntlid)
    }
}

impl Drop for Serve {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        let _ = std::fs::remove_file(&self.status);
        if let Some(config) = &self.config {
            let _ = std::fs::remove_file(config);
        }
    }
}
