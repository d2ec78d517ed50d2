//! Side by side in one boot: 24 emulated drives, the first 12 on the kernel's nvme driver, the
//! other 12 on vfio-pci. `usnvme perf` runs on the vfio-pci drives, fio with io_uring (and
//! io_uring polled I/O, the test bed loads nvme with poll queues) on the kernel's, with the same
//! pattern, queue depth per drive per core, cores and drive count.

use std::path::Path;

use anyhow::{Context, Result};

use crate::cmd::sh_quote;
use crate::vm::run;

/// What one cell of the comparison ran.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Tool {
    Usnvme,
    FioIoUring,
    FioIoUringPolled,
}

impl Tool {
    pub const ALL: [Tool; 3] = [Tool::Usnvme, Tool::FioIoUring, Tool::FioIoUringPolled];

    fn key(self) -> &'static str {
        match self {
            Tool::Usnvme => "usnvme",
            Tool::FioIoUring => "fio",
            Tool::FioIoUringPolled => "fio-hipri",
        }
    }
}

#[derive(Debug, Clone, Copy)]
pub struct Case {
    pub tool: Tool,
    pub qd: u32,
    pub cores: u32,
    pub drives: u32,
}

impl Case {
    fn file(&self) -> String {
        format!(
            "{}-qd{}-c{}-d{}.json",
            self.tool.key(),
            self.qd,
            self.cores,
            self.drives
        )
    }
}

/// Everything the boot measured.
#[derive(Debug, Default)]
pub struct VmResults {
    /// (case, IOPS; None when that run failed or printed nothing usable)
    pub cells: Vec<(Case, Option<f64>)>,
    /// Seconds `usnvme identify` took to bring up and identify the 12 vfio-pci drives.
    pub attach_12_s: Option<f64>,
    /// The guest's exit status (124: vm-run's time limit ended it).
    pub exit_code: u8,
    pub script: String,
}

pub fn cases(quick: bool) -> Vec<Case> {
    let (qds, cores, drives): (&[u32], &[u32], &[u32]) = if quick {
        (&[32], &[1], &[1])
    } else {
        (&[1, 32, 128], &[1, 2], &[1, 12])
    };
    let mut out = Vec::new();
    for &drives in drives {
        for &cores in cores {
            for &qd in qds {
                for tool in Tool::ALL {
                    out.push(Case {
                        tool,
                        qd,
                        cores,
                        drives,
                    });
                }
            }
        }
    }
    out
}

/// The guest script: one command per case, each writing its JSON into `out`.
fn script(cases: &[Case], usnvme: &str, out: &str, seconds: u32) -> String {
    let limit = seconds * 5 + 30;
    let mut s = String::from(
        "# kernel drives: nvme block devices; ours: the controllers on vfio-pci\n\
         KDEVS=$(ls /sys/block | grep -E '^nvme[0-9]+n[0-9]+$' | sort -V)\n\
         VDEVS=$(ls /sys/bus/pci/drivers/vfio-pci | grep '^0000:' | sort)\n\
         first() { echo \"$1\" | head -n \"$2\"; }\n\
         up() { cut -d' ' -f1 /proc/uptime; }\n\
         t0=$(up); ",
    );
    s.push_str(&format!(
        "{usnvme} identify $(first \"$VDEVS\" 12) > /dev/null && echo \"$t0 $(up)\" > {out}/attach.txt\n"
    ));
    for c in cases {
        let file = sh_quote(&format!("{out}/{}", c.file()));
        let cpus = format!("0-{}", c.cores - 1);
        let line = match c.tool {
            Tool::Usnvme => format!(
                "{usnvme} perf -q {qd} -o 4k -w randread -t {seconds} -a 1 -c {cpus} \
                 $(first \"$VDEVS\" {d} | sed 's/^/-r /') --json {file} > /dev/null",
                qd = c.qd,
                d = c.drives,
            ),
            Tool::FioIoUring | Tool::FioIoUringPolled => format!(
                // the same number of commands in flight per core as usnvme: QD per drive
                "fio --name=bench --ioengine=io_uring --direct=1 --rw=randread --bs=4k \
                 --iodepth={depth} --numjobs={cores} --cpus_allowed={cpus} \
                 --cpus_allowed_policy=split --time_based --runtime={seconds} --ramp_time=1 \
                 --group_reporting {hipri}--output-format=json --output={file} \
                 --filename=$(first \"$KDEVS\" {d} | sed 's|^|/dev/|' | tr '\\n' : | sed 's/:$//') > /dev/null",
                depth = c.qd * c.drives,
                cores = c.cores,
                hipri = if c.tool == Tool::FioIoUringPolled {
                    "--hipri "
                } else {
                    ""
                },
                d = c.drives,
            ),
        };
        // a case that does not finish in time is stopped like Ctrl-C, and the next one runs
        s.push_str(&format!(
            "echo '{}: qd {} cores {} drives {}'; timeout -s INT {limit} {line} || echo FAILED\n",
            c.tool.key(),
            c.qd,
            c.cores,
            c.drives
        ));
    }
    s
}

/// Boots the guest once and runs every case.
pub fn side_by_side(usnvme: &Path, quick: bool, seconds: u32) -> Result<VmResults> {
    let out = crate::vm::vm_dir().join("work/bench");
    let _ = std::fs::remove_dir_all(&out);
    std::fs::create_dir_all(&out)?;
    let cases = cases(quick);
    let body = script(
        &cases,
        &sh_quote(&usnvme.display().to_string()),
        &out.display().to_string(),
        seconds,
    );
    let mut args = super::guest_script(&out, &body)?;
    args.kernel_nvme = Some("12".into());
    args.timeout = 600 + cases.len() as u64 * (seconds as u64 + 15);
    // Whatever finished counts, also when the guest did not end cleanly.
    let code = run::run(&args)?;
    let mut results = VmResults {
        script: body,
        exit_code: code,
        ..Default::default()
    };
    let attach = std::fs::read_to_string(out.join("attach.txt")).unwrap_or_default();
    let mut times = attach.split_whitespace().map(str::parse::<f64>);
    if let (Some(Ok(a)), Some(Ok(b))) = (times.next(), times.next()) {
        results.attach_12_s = Some(b - a);
    }
    for c in cases {
        let iops = std::fs::read_to_string(out.join(c.file()))
            .ok()
            .and_then(|json| iops_of(c.tool, &json));
        results.cells.push((c, iops));
    }
    Ok(results)
}

/// Read IOPS from usnvme's or fio's JSON.
fn iops_of(tool: Tool, json: &str) -> Option<f64> {
    // fio may print warnings before its JSON
    let doc: serde_json::Value = serde_json::from_str(&json[json.find('{')?..]).ok()?;
    match tool {
        Tool::Usnvme => doc["total"]["read"]["iops"].as_f64(),
        Tool::FioIoUring | Tool::FioIoUringPolled => doc["jobs"]
            .as_array()?
            .iter()
            .map(|j| j["read"]["iops"].as_f64())
            .sum(),
    }
}

/// The IOPS of a case, by its parameters.
pub fn lookup(results: &VmResults, tool: Tool, qd: u32, cores: u32, drives: u32) -> Option<f64> {
    results
        .cells
        .iter()
        .find(|(c, _)| c.tool == tool && c.qd == qd && c.cores == cores && c.drives == drives)
        .and_then(|(_, iops)| *iops)
        .context("missing")
        .ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_iops_from_both_tools() {
        let usnvme = r#"{"total": {"read": {"iops": 1234.5}}}"#;
        assert_eq!(iops_of(Tool::Usnvme, usnvme), Some(1234.5));
        let fio = "fio: some warning\n{\"jobs\": [{\"read\": {\"iops\": 100.0}}, {\"read\": {\"iops\": 50.5}}]}";
        assert_eq!(iops_of(Tool::FioIoUring, fio), Some(150.5));
        assert_eq!(iops_of(Tool::FioIoUring, "not json"), None);
    }

    #[test]
    fn the_script_gives_fio_the_same_commands_in_flight_per_core() {
        let cases = [Case {
            tool: Tool::FioIoUringPolled,
            qd: 32,
            cores: 2,
            drives: 12,
        }];
        let s = script(&cases, "/u", "/o", 5);
        assert!(
            s.contains("--iodepth=384 --numjobs=2 --cpus_allowed=0-1"),
            "{s}"
        );
        assert!(s.contains("--hipri "), "{s}");
        let ours = script(
            &[Case {
                tool: Tool::Usnvme,
                qd: 32,
                cores: 2,
                drives: 12,
            }],
            "/u",
            "/o",
            5,
        );
        assert!(
            ours.contains("/u perf -q 32 -o 4k -w randread -t 5 -a 1 -c 0-1"),
            "{ours}"
        );
    }
}
