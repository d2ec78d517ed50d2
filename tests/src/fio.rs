//! Running fio with usnvme's engine (`tools/fio`, built by `cargo xtask fio-engine`, found
//! through `USNVME_FIO_ENGINE`) and reading its JSON report.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};

use serde_json::Value;

pub const FIO: &str = "fio";

/// The engine library (`USNVME_FIO_ENGINE`, set by `cargo xtask ci` and `cargo xtask vm-test`).
pub fn engine() -> PathBuf {
    let path = std::env::var_os("USNVME_FIO_ENGINE").map(PathBuf::from).unwrap_or_else(|| {
        panic!("USNVME_FIO_ENGINE is not set: build the engine with `cargo xtask fio-engine` and set it to target/fio/libusnvme_fio.so")
    });
    assert!(path.is_file(), "{} is not there", path.display());
    path
}

/// The `usnvme` command (`USNVME_BIN`, set by `cargo xtask ci`): the targets fio's remote
/// jobs run against.
pub fn usnvme() -> PathBuf {
    let path = std::env::var_os("USNVME_BIN").map(PathBuf::from).unwrap_or_else(|| {
        panic!("USNVME_BIN is not set: build usnvme (cargo build -p usnvme-tools) and set it to target/debug/usnvme")
    });
    assert!(path.is_file(), "{} is not there", path.display());
    path
}

/// `usnvme serve` on a `sim:` drive that keeps data, over 127.0.0.1, allowing only `host`;
/// its log (connections at info level) goes to a file. Killed when dropped.
#[derive(Debug)]
pub struct Target {
    child: Child,
    pub addr: std::net::SocketAddr,
    pub log: PathBuf,
}

impl Target {
    pub fn start(dir: &Path, nqn: &str, host: &str) -> Target {
        use std::io::{BufRead, BufReader};
        std::fs::create_dir_all(dir).expect("the target's folder");
        let log = dir.join("serve.log");
        let log_file = std::fs::File::create(&log).expect("serve's log");
        let mut child = Command::new(usnvme())
            .args(["serve", "-r", "sim:0,backend=ram,size=64M", "-c", "0"])
            .args([
                "--listen",
                "127.0.0.1:0",
                "--nqn",
                nqn,
                "--allow-host",
                host,
            ])
            .env("RUST_LOG", "info")
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(log_file)
            .spawn()
            .unwrap_or_else(|e| panic!("cannot run usnvme serve: {e}"));
        let stdout = child.stdout.take().expect("piped");
        // serve says where it listens, then which hosts it allows: ready
        let mut addr = None;
        for line in BufReader::new(stdout).lines().map_while(Result::ok) {
            if let Some(rest) = line.strip_prefix("listening on ") {
                addr = addr.or(rest.split_whitespace().next().and_then(|a| a.parse().ok()));
            }
            if line.starts_with("hosts:") {
                break;
            }
        }
        let Some(addr) = addr else {
            let _ = child.kill();
            let _ = child.wait();
            let log = std::fs::read_to_string(&log).unwrap_or_default();
            panic!("usnvme serve never said where it listens:\n{log}");
        };
        Target { child, addr, log }
    }

    /// What serve logged so far.
    pub fn logged(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }
}

impl Drop for Target {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// What a fio run gave: its exit status, its error output, and its JSON report.
#[derive(Debug)]
pub struct FioRun {
    pub ok: bool,
    pub stderr: String,
    pub report: Value,
}

impl FioRun {
    /// The report's jobs (`client_stats` under `--client`).
    pub fn jobs(&self) -> &[Value] {
        let key = if self.report.get("client_stats").is_some() {
            "client_stats"
        } else {
            "jobs"
        };
        self.report[key].as_array().map_or(&[], Vec::as_slice)
    }

    /// The job called `name`.
    pub fn job(&self, name: &str) -> &Value {
        self.jobs()
            .iter()
            .find(|j| j["jobname"] == name)
            .unwrap_or_else(|| panic!("no job {name} in fio's report: {:#}", self.report))
    }
}

/// Bytes a job moved in direction `dir` (`read`, `write`, `trim`).
pub fn io_bytes(job: &Value, dir: &str) -> u64 {
    job[dir]["io_bytes"]
        .as_u64()
        .unwrap_or_else(|| panic!("no {dir}.io_bytes in {job:#}"))
}

/// The error fio gives a job (0: none).
pub fn job_error(job: &Value) -> i64 {
    job["error"].as_i64().unwrap_or(-1)
}

/// Runs `fio JOBFILE` (`job` written to `dir`) with `args` and the JSON report in `dir`.
pub fn run(dir: &Path, name: &str, job: &str, args: &[&str]) -> FioRun {
    std::fs::create_dir_all(dir).expect("fio's folder");
    let job_file = dir.join(format!("{name}.fio"));
    std::fs::write(&job_file, job).expect("a job file");
    let report = dir.join(format!("{name}.json"));
    let _ = std::fs::remove_file(&report);
    let out = Command::new(FIO)
        .args(args)
        .arg("--output-format=json")
        .arg(format!("--output={}", report.display()))
        .arg(&job_file)
        // fio leaves its verify state files (`*-verify.state`) in its working folder
        .current_dir(dir)
        .stdin(Stdio::null())
        .output()
        .unwrap_or_else(|e| panic!("cannot run fio: {e}"));
    let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    let text = std::fs::read_to_string(&report).unwrap_or_default();
    // fio writes its own complaints before the JSON; the report starts at the first '{'
    let report = text
        .find('{')
        .and_then(|at| serde_json::from_str(&text[at..]).ok())
        .unwrap_or(Value::Null);
    FioRun {
        ok: out.status.success(),
        stderr: format!("{stderr}{}", text.split('{').next().unwrap_or("")),
        report,
    }
}

/// `fio --server` on `port` (loopback), on `cpu` when given; killed when dropped.
#[derive(Debug)]
pub struct FioServer {
    child: Child,
    pub port: u16,
}

impl FioServer {
    pub fn start(port: u16, cpu: Option<usize>) -> FioServer {
        let mut cmd = match cpu {
            Some(cpu) => {
                let mut c = Command::new("taskset");
                c.args(["-c", &cpu.to_string(), FIO]);
                c
            }
            None => Command::new(FIO),
        };
        let child = cmd
            .arg(format!("--server=ip:127.0.0.1,{port}"))
            .current_dir(std::env::temp_dir())
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .spawn()
            .unwrap_or_else(|e| panic!("cannot start fio --server: {e}"));
        // ready when it listens: the client's connection would be refused before
        let started = std::time::Instant::now();
        while std::net::TcpStream::connect(("127.0.0.1", port)).is_err() {
            assert!(
                started.elapsed() < std::time::Duration::from_secs(60),
                "fio --server on port {port} never listened"
            );
            std::thread::yield_now();
        }
        FioServer { child, port }
    }

    /// `--client=127.0.0.1,PORT`.
    pub fn client_arg(&self) -> String {
        format!("--client=127.0.0.1,{}", self.port)
    }
}

impl Drop for FioServer {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Checks the report of `fio --client` to several servers: every server's job ran without
/// error, and the "All clients" aggregate is the sum of the servers' reports, I/O by I/O.
pub fn assert_clients_add_up(run: &FioRun, servers: usize) -> u64 {
    assert!(run.ok, "fio --client failed: {}", run.stderr);
    let jobs = run.jobs();
    let (all, each): (Vec<&Value>, Vec<&Value>) =
        jobs.iter().partition(|j| j["jobname"] == "All clients");
    assert_eq!(
        each.len(),
        servers,
        "one report per server: {:#}",
        run.report
    );
    assert_eq!(all.len(), 1, "one aggregate: {:#}", run.report);
    for j in &each {
        assert_eq!(job_error(j), 0, "{j:#}");
        assert!(io_bytes(j, "read") + io_bytes(j, "write") > 0, "{j:#}");
    }
    for dir in ["read", "write"] {
        for key in ["io_bytes", "total_ios"] {
            let sum: u64 = each.iter().map(|j| j[dir][key].as_u64().unwrap_or(0)).sum();
            assert_eq!(
                all[0][dir][key].as_u64(),
                Some(sum),
                "{dir}.{key}: {:#}",
                run.report
            );
        }
    }
    all[0]["read"]["total_ios"].as_u64().unwrap_or(0)
        + all[0]["write"]["total_ios"].as_u64().unwrap_or(0)
}

/// The three job files of the issue as one, in turn: random writes fio verifies (crc32c),
/// random reads from two threads, a 70/30 mix.
pub fn three_jobs(files: &str, size: &str) -> String {
    format!(
        "size={size}\n\
         [randwrite-verify]\nfilename={files}\nrw=randwrite\niodepth=16\nverify=crc32c\n\
         [randread]\nstonewall\nfilename={files}\nrw=randread\niodepth=32\nnumjobs=2\n\
         [mixed]\nstonewall\nfilename={files}\nrw=randrw\nrwmixread=70\niodepth=16\n\
         time_based=1\nruntime=2\n"
    )
}

/// Checks the report of [`three_jobs`] over `bytes` bytes.
pub fn assert_three_jobs(run: &FioRun, bytes: u64) {
    assert!(run.ok, "{}\n{:#}", run.stderr, run.report);
    let w = run.job("randwrite-verify");
    assert_eq!(job_error(w), 0, "{w:#}");
    assert_eq!(io_bytes(w, "write"), bytes, "{w:#}");
    assert_eq!(
        io_bytes(w, "read"),
        bytes,
        "fio's verify read back every block: {w:#}"
    );
    let reads: Vec<_> = run
        .jobs()
        .iter()
        .filter(|j| j["jobname"] == "randread")
        .collect();
    assert_eq!(reads.len(), 2, "{:#}", run.report);
    for r in reads {
        assert_eq!((job_error(r), io_bytes(r, "read")), (0, bytes), "{r:#}");
    }
    let m = run.job("mixed");
    let (read, write) = (io_bytes(m, "read"), io_bytes(m, "write"));
    assert_eq!(job_error(m), 0, "{m:#}");
    let share = read as f64 / (read + write).max(1) as f64;
    assert!(
        (0.6..0.8).contains(&share),
        "70/30: {read} read, {write} written"
    );
}
