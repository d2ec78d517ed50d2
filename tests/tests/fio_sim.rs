//! fio with usnvme's engine on software controllers (`sim:` drives, in fio's own process):
//! fio's job files, its verify, its client/server mode and its errors, on the host.
//!
//! They need the engine built for the installed fio (`cargo xtask fio-engine`): `cargo xtask ci`
//! builds it and runs them with `--ignored` (and USNVME_FIO_ENGINE set).

use std::path::PathBuf;

use usnvme_tests::fio::{
    self, assert_clients_add_up, assert_three_jobs, job_error, three_jobs, FioServer, Target,
};

fn dir(test: &str) -> PathBuf {
    std::env::temp_dir().join(format!("usnvme-fio-sim-{}-{test}", std::process::id()))
}

/// The global section of every job here: the engine, threads, sim drives that keep data.
fn global(extra: &str) -> String {
    format!(
        "[global]\nioengine=external:{}\nthread=1\nbs=4k\n{extra}\n",
        fio::engine().display()
    )
}

/// Two sim drives that keep what is written, as fio file names (':' escaped).
const DRIVES: &str = "sim\\:0,backend=ram:sim\\:1,backend=ram";

#[test]
#[ignore = "fio: needs the engine (cargo xtask fio-engine); cargo xtask ci runs it"]
fn job_files_read_write_verify_and_mix_through_the_engine() {
    // size= is the job's, over its files: 4 MiB of each drive
    let run = fio::run(
        &dir("jobs"),
        "jobs",
        &(global("") + &three_jobs(DRIVES, "8m")),
        &[],
    );
    assert_three_jobs(&run, 8 << 20);
}

#[test]
#[ignore = "fio: needs the engine (cargo xtask fio-engine); cargo xtask ci runs it"]
fn a_paced_job_keeps_its_rate_and_completes_every_io() {
    // fio sleeps between the I/Os of a rate-limited job (the engine rings its doorbells at
    // commit: an I/O must not wait out fio's sleep unsubmitted)
    let job = format!(
        "{}[paced]\nfilename=sim\\:0,backend=ram,mode=threaded\nrw=randwrite\niodepth=4\n\
         rate_iops=200\nnumber_ios=200\nverify=crc32c\n",
        global("")
    );
    let run = fio::run(&dir("paced"), "paced", &job, &[]);
    assert!(run.ok, "{}\n{:#}", run.stderr, run.report);
    let j = run.job("paced");
    assert_eq!(job_error(j), 0, "{j:#}");
    assert_eq!(j["write"]["total_ios"].as_u64(), Some(200), "{j:#}");
    // 200 I/Os at 200 per second take about a second: fio paced them
    let runtime_ms = j["write"]["runtime"].as_u64().unwrap_or(0);
    assert!(
        runtime_ms >= 900,
        "200 I/Os at rate_iops=200 in {runtime_ms} ms"
    );
}

#[test]
#[ignore = "fio: needs the engine (cargo xtask fio-engine); cargo xtask ci runs it"]
fn a_drive_that_corrupts_reads_fails_fios_verify() {
    // from its 100th read on, the drive flips a byte in every block it delivers
    let job = format!(
        "{}[bad]\nfilename=sim\\:0,backend=ram,corrupt=100\nrw=write\nsize=4m\niodepth=4\n\
         verify=crc32c\n",
        global("")
    );
    let run = fio::run(&dir("corrupt"), "corrupt", &job, &[]);
    assert!(!run.ok, "verify must fail: {:#}", run.report);
    assert!(
        run.stderr.contains("verify failed at file sim:0"),
        "{}",
        run.stderr
    );
    assert_ne!(job_error(run.job("bad")), 0);
}

#[test]
#[ignore = "fio: needs the engine (cargo xtask fio-engine); cargo xtask ci runs it"]
fn two_fio_servers_report_to_one_client_whose_aggregate_is_their_sum() {
    let job = format!(
        "{}[load]\nfilename={DRIVES}\nrw=randrw\nrwmixread=70\niodepth=16\nsize=8m\n\
         time_based=1\nruntime=1\n",
        global("")
    );
    let base = 20000 + (std::process::id() % 20000) as u16;
    let servers = [
        FioServer::start(base, None),
        FioServer::start(base + 1, None),
    ];
    let clients: Vec<String> = servers.iter().map(FioServer::client_arg).collect();
    let args: Vec<&str> = clients.iter().map(String::as_str).collect();
    let run = fio::run(&dir("clients"), "clients", &job, &args);
    let ios = assert_clients_add_up(&run, servers.len());
    assert!(ios > 0);
}

#[test]
#[ignore = "fio: needs the engine (cargo xtask fio-engine); cargo xtask ci runs it"]
fn a_job_mixes_a_local_drive_and_a_remote_subsystem_reached_as_its_host_with_digests() {
    const NQN: &str = "nqn.2024-01.io.usnvme:fio-mixed";
    // the only host the target allows
    const HOST: &str = "nqn.2014-08.org.nvmexpress:uuid:0f1e2d3c-4b5a-4978-8695-a4b3c2d1e0f9";
    const OTHER: &str = "nqn.2014-08.org.nvmexpress:uuid:11111111-2222-4333-8444-555555555555";
    let dir = dir("mixed");
    let target = Target::start(&dir, NQN, HOST);
    let remote = format!(
        "tcp\\://127.0.0.1\\:{}/{}",
        target.addr.port(),
        NQN.replace(':', "\\:")
    );
    let job = |host: &str| {
        format!(
            "{}[mixed]\nfilename=sim\\:1,backend=ram:{remote}\nhostnqn={host}\nhdr_digest=1\n\
             data_digest=1\nkeep_alive_tmo=2\nreconnect_delay=1\nctrl_loss_tmo=0\n\
             rw=randwrite\niodepth=8\nsize=8m\nverify=crc32c\n",
            global("")
        )
    };
    let run = fio::run(&dir, "mixed", &job(HOST), &[]);
    assert!(run.ok, "{}\n{:#}", run.stderr, run.report);
    let j = run.job("mixed");
    assert_eq!(job_error(j), 0, "{j:#}");
    // 4 MiB on each file, written and read back verified
    assert_eq!(fio::io_bytes(j, "write"), 8 << 20, "{j:#}");
    assert_eq!(fio::io_bytes(j, "read"), 8 << 20, "{j:#}");
    let logged = target.logged();
    assert!(
        logged.contains(&format!("host {HOST} connected (controller"))
            && logged.contains("header and data digests)"),
        "the target saw no host {HOST} with both digests:\n{logged}"
    );
    // another host NQN: the target refuses it, and the job says which host and why
    let refused = fio::run(&dir, "other-host", &job(OTHER), &[]);
    assert!(!refused.ok, "fio ran: {:#}", refused.report);
    assert!(
        refused
            .stderr
            .contains(&format!("does not allow host {OTHER}")),
        "{}",
        refused.stderr
    );
}

/// Runs a one-line job and returns fio's error output; fio must fail.
fn refused(test: &str, job: &str, args: &[&str]) -> String {
    let run = fio::run(&dir(test), test, job, args);
    assert!(!run.ok, "fio ran: {:#}", run.report);
    run.stderr
}

#[test]
#[ignore = "fio: needs the engine (cargo xtask fio-engine); cargo xtask ci runs it"]
fn bad_jobs_get_fios_error_path_with_one_line_saying_what_is_wrong() {
    let one = |extra: &str, file: &str| {
        format!(
            "[global]\nioengine=external:{}\nbs=4k\nrw=read\nsize=1m\n{extra}\n[j]\nfilename={file}\n",
            fio::engine().display()
        )
    };
    let forked = refused("forked", &one("", "sim\\:0"), &[]);
    assert!(
        forked.contains("fio: usnvme: the engine needs thread=1"),
        "{forked}"
    );
    // fio splits an unescaped PCI address at its colons
    let split = refused("split", &one("thread=1", "0000:01:00.0"), &[]);
    assert!(split.contains("write 0000.01.00.0"), "{split}");
    let bs = refused("bs", &one("thread=1\nbs=512", "sim\\:0,bs=4096"), &[]);
    assert!(
        bs.contains("bs=512 is not a multiple of sim:0's 4096-byte blocks"),
        "{bs}"
    );
    let ns = refused("ns", &one("thread=1", "sim\\:0,ns=2"), &[]);
    assert!(ns.contains("choose one with ' ns=N'"), "{ns}");
    let absent = refused("absent", &one("thread=1", "sim\\:0 ns=7"), &[]);
    assert!(absent.contains("namespace 7 is not active"), "{absent}");
    let nqn = refused("hostnqn", &one("thread=1\nhostnqn=host-a", "sim\\:0"), &[]);
    assert!(nqn.contains("fio: usnvme: hostnqn=host-a: "), "{nqn}");
    let gone = refused("gone", &one("thread=1", "0000.7f.1f.7"), &[]);
    assert!(gone.contains("fio: usnvme: 0000:7f:1f.7"), "{gone}");
}

#[test]
#[ignore = "fio: needs the engine (cargo xtask fio-engine); cargo xtask ci runs it"]
fn an_engine_built_for_another_fio_is_refused_with_what_to_rebuild() {
    let other = std::env::var_os("USNVME_FIO_ENGINE_OTHER_VERSION")
        .map(PathBuf::from)
        .expect(
            "USNVME_FIO_ENGINE_OTHER_VERSION: an engine built for another fio (cargo xtask ci)",
        );
    let job = format!(
        "[j]\nioengine=external:{}\nthread=1\nfilename=sim\\:0\nrw=read\nsize=1m\n",
        other.display()
    );
    let err = refused("other-version", &job, &[]);
    assert!(err.contains("this engine was built for"), "{err}");
    assert!(
        err.contains("rebuild it for this fio with `cargo xtask fio-engine`"),
        "{err}"
    );
}
