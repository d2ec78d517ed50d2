//! fio with usnvme's engine in the test bed: fio's job files on every drive on vfio-pci, on a
//! remote subsystem of `usnvme serve`, and two fio servers loading one `serve` through fio's
//! client/server mode.
//!
//! The drives' bytes [640 MiB, 720 MiB) are this suite's: the other suites check theirs elsewhere.

use std::io::{BufRead, BufReader};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};

use usnvme_tests::fio::{self, assert_clients_add_up, assert_three_jobs, three_jobs, FioServer};
use usnvme_tests::{signal, vfio_controllers, VmBed};

const NQN: &str = "nqn.2024-01.io.usnvme:vm-fio";
const PORT: u16 = 4425;
/// Where the local jobs write (each file: 1 MiB from here).
const LOCAL_OFFSET: &str = "640m";
/// Where the remote jobs write.
const REMOTE_OFFSET: &str = "704m";

fn dir(test: &str) -> PathBuf {
    let base = std::env::var_os("USNVME_VM_WORK").map_or_else(std::env::temp_dir, PathBuf::from);
    base.join(format!("fio-{test}"))
}

/// fio's name of a PCI function: SPDK's dots for its colons.
fn file_name(address: &str) -> String {
    address.replace(':', ".")
}

/// The global section: the engine, threads, 4 KiB blocks (both block sizes of the bed divide it).
fn global(offset: &str) -> String {
    format!(
        "[global]\nioengine=external:{}\nthread=1\nbs=4k\noffset={offset}\n",
        fio::engine().display()
    )
}

#[test]
#[ignore = "VM: fio's job files through the engine on every drive on vfio-pci"]
fn fio_job_files_run_through_the_engine_on_every_drive() {
    let bed = VmBed::from_env();
    let drives = vfio_controllers();
    assert_eq!(drives.len(), bed.drives - bed.kernel_drives);
    let files: Vec<String> = drives.iter().map(|a| file_name(&a.to_string())).collect();
    // one MiB of each drive
    let size = format!("{}m", files.len());
    let job = global(LOCAL_OFFSET) + &three_jobs(&files.join(":"), &size);
    let run = fio::run(&dir("local"), "local", &job, &[]);
    assert_three_jobs(&run, (files.len() as u64) << 20);
    eprintln!(
        "fio through the engine on {} drives: {} reads, {} writes in the mixed job",
        files.len(),
        run.job("mixed")["read"]["total_ios"],
        run.job("mixed")["write"]["total_ios"]
    );
}

/// `usnvme serve` exporting `drives` as namespaces 1.. of [`NQN`] on [`PORT`]; stopped (SIGINT)
/// when dropped.
struct Serve(Child);

impl Serve {
    fn start(bed: &VmBed, drives: &[String]) -> Serve {
        let listen = format!("127.0.0.1:{PORT}");
        let mut args = vec![
            "serve",
            "--nqn",
            NQN,
            "--allow-any-host",
            "--listen",
            &listen,
        ];
        for d in drives {
            args.extend(["-r", d.as_str()]);
        }
        let mut child = Command::new(&bed.usnvme)
            .args(&args)
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .expect("usnvme serve runs");
        let mut lines = BufReader::new(child.stdout.take().expect("piped")).lines();
        // ready once it prints who may connect
        let ready = lines
            .by_ref()
            .map_while(Result::ok)
            .any(|l| l.starts_with("hosts:"));
        assert!(ready, "usnvme serve ended before it was ready");
        // keep its output flowing
        std::thread::spawn(move || lines.map_while(Result::ok).for_each(drop));
        Serve(child)
    }
}

impl Drop for Serve {
    fn drop(&mut self) {
        signal(&self.0, "INT");
        let _ = self.0.wait();
    }
}

/// The remote namespaces as fio file names, in both forms the engine takes (every ':' escaped,
/// the NQN's too: fio splits file names at the others).
fn remote_files(namespaces: usize) -> String {
    let nqn = NQN.replace(':', "\\:");
    (1..=namespaces)
        .map(|ns| {
            if ns % 2 == 1 {
                format!("tcp\\://127.0.0.1\\:{PORT}/{nqn} ns={ns}")
            } else {
                format!(
                    "trtype=TCP adrfam=IPv4 traddr=127.0.0.1 trsvcid={PORT} subnqn={nqn} ns={ns}"
                )
            }
        })
        .collect::<Vec<_>>()
        .join(":")
}

/// The last four drives on vfio-pci, for `serve`.
fn exported() -> Vec<String> {
    let drives = vfio_controllers();
    drives[drives.len() - 4..]
        .iter()
        .map(ToString::to_string)
        .collect()
}

#[test]
#[ignore = "VM: fio's job files through the engine on a remote subsystem of usnvme serve"]
fn fio_job_files_run_through_the_engine_on_a_remote_subsystem() {
    let bed = VmBed::from_env();
    let drives = exported();
    let _serve = Serve::start(&bed, &drives);
    let job = global(REMOTE_OFFSET) + &three_jobs(&remote_files(drives.len()), "4m");
    let run = fio::run(&dir("remote"), "remote", &job, &[]);
    assert_three_jobs(&run, 4 << 20);
}

#[test]
#[ignore = "VM: two fio servers, each on its own core, load one usnvme serve; one client sums them"]
fn two_fio_servers_load_one_target_and_the_client_adds_them_up() {
    let bed = VmBed::from_env();
    let drives = exported();
    let _serve = Serve::start(&bed, &drives);
    let servers = [
        FioServer::start(8765, Some(0)),
        FioServer::start(8766, Some(1)),
    ];
    let job = global(REMOTE_OFFSET)
        + &format!(
            "[load]\nfilename={}\nrw=randrw\nrwmixread=70\niodepth=16\nsize=4m\n\
             time_based=1\nruntime=3\n",
            remote_files(drives.len())
        );
    let clients: Vec<String> = servers.iter().map(FioServer::client_arg).collect();
    let args: Vec<&str> = clients.iter().map(String::as_str).collect();
    let run = fio::run(&dir("clients"), "clients", &job, &args);
    let ios = assert_clients_add_up(&run, servers.len());
    eprintln!("two fio servers against one usnvme serve: {ios} I/Os in all");
}
