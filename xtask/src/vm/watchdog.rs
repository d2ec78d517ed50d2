//! Telling a hung guest from a busy one, and asking it why it hangs.
//!
//! Under TCG the guest has, a few times in many runs, sat idle mid-suite with every vCPU asleep,
//! while the program it ran never sleeps for long (perf's reactors spin); once, too, with one
//! vCPU spinning in its kernel with interrupts off and the other halted. Waiting out the run's
//! time limit then costs a quarter of an hour. A guest whose QEMU burns almost no CPU for a
//! whole window while its program should be running ([`IdleWatch`]), or one of whose vCPUs
//! stays in its kernel with interrupts off for a whole window ([`StuckWatch`]), is hung: before
//! it is killed, the guest's kernel is asked (magic SysRq through the emulated keyboard) to
//! print its blocked tasks and every CPU's backtrace on the console, so the run's log says
//! where it stuck.

use std::io::{BufRead, BufReader, Write};
use std::os::unix::net::UnixStream;
use std::path::Path;
use std::time::{Duration, Instant};

/// QEMU's CPU time (user + system, all threads) so far, from /proc; None once it is gone.
pub fn cpu_time(pid: u32) -> Option<Duration> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // The command name (field 2) may hold spaces: the fields after it start past its ')'.
    let rest = &stat[stat.rfind(')')? + 1..];
    let fields: Vec<&str> = rest.split_whitespace().collect();
    // fields[0] is field 3 (state): utime and stime are fields 14 and 15.
    let ticks: u64 = fields.get(11)?.parse::<u64>().ok()? + fields.get(12)?.parse::<u64>().ok()?;
    // In USER_HZ, which Linux fixes at 100 on x86-64 whatever the kernel's own tick.
    Some(Duration::from_millis(ticks * 10))
}

/// Below this share of one host core over a whole window, the guest is idle: an emulated guest
/// that runs anything at all keeps QEMU far busier. (Idle, with 24 emulated drives, QEMU still
/// spends about 8 % of a core on timers and devices: a CI boot sat so for 17 minutes unseen
/// under a 5 % bound.)
const IDLE_SHARE: f64 = 0.20;

/// Watches QEMU's CPU use over a sliding window of `window`.
pub struct IdleWatch {
    pid: u32,
    window: Duration,
    /// (when, QEMU's CPU time then), oldest first, spanning at most one window.
    samples: std::collections::VecDeque<(Instant, Duration)>,
}

impl IdleWatch {
    pub fn new(pid: u32, window: Duration) -> IdleWatch {
        IdleWatch {
            pid,
            window,
            samples: Default::default(),
        }
    }

    /// Takes a sample; true when QEMU used less than IDLE_SHARE of a core over the last window.
    pub fn idle(&mut self, now: Instant) -> bool {
        let Some(cpu) = cpu_time(self.pid) else {
            return false;
        };
        self.samples.push_back((now, cpu));
        while self
            .samples
            .get(1)
            .is_some_and(|&(t, _)| now.duration_since(t) >= self.window)
        {
            self.samples.pop_front();
        }
        let Some(&(first, first_cpu)) = self.samples.front() else {
            return false;
        };
        let span = now.duration_since(first);
        span >= self.window
            && cpu.saturating_sub(first_cpu).as_secs_f64() < IDLE_SHARE * span.as_secs_f64()
    }
}

/// The vCPUs that run kernel code with interrupts off (CPL 0, RFLAGS.IF clear, not halted), by
/// index, from HMP's `info registers -a`.
fn spinning_with_interrupts_off(registers: &str) -> Vec<usize> {
    let mut cpu = None;
    let mut out = Vec::new();
    for line in registers.lines().map(str::trim) {
        if let Some(n) = line.strip_prefix("CPU#") {
            cpu = n.trim().parse::<usize>().ok();
        }
        let field = |name: &str| {
            line.split_whitespace()
                .find_map(|w| w.strip_prefix(name))
                .map(str::to_owned)
        };
        if let (Some(c), Some(rfl), Some(cpl), Some(hlt)) =
            (cpu, field("RFL="), field("CPL="), field("HLT="))
        {
            let interrupts_on = u64::from_str_radix(&rfl, 16).map_or(true, |f| f & 0x200 != 0);
            if !interrupts_on && cpl == "0" && hlt == "0" {
                out.push(c);
            }
        }
    }
    out
}

/// Watches, through QMP, for a vCPU that stays in its kernel with interrupts off: QEMU is
/// busy, so [`IdleWatch`] sees nothing, but a guest kernel never keeps interrupts off for
/// seconds, let alone a window (a spinlock deadlock, or a wait on emulated hardware that
/// never answers).
pub struct StuckWatch {
    socket: std::path::PathBuf,
    window: Duration,
    /// Since when each vCPU has been seen spinning with interrupts off in every sample.
    since: Vec<Option<Instant>>,
}

impl StuckWatch {
    pub fn new(socket: &Path, window: Duration) -> StuckWatch {
        StuckWatch {
            socket: socket.to_path_buf(),
            window,
            since: Vec::new(),
        }
    }

    /// Takes a sample (a few times a window is enough); true when a vCPU has spun with
    /// interrupts off in every sample over the last window.
    pub fn stuck(&mut self, now: Instant) -> bool {
        let registers = qmp(
            &self.socket,
            &[serde_json::json!({"execute": "human-monitor-command",
                                 "arguments": {"command-line": "info registers -a"}})],
        );
        let Some(text) = registers.ok().and_then(|r| {
            r.first()
                .and_then(|r| r["return"].as_str().map(str::to_owned))
        }) else {
            return false;
        };
        self.observe(now, &spinning_with_interrupts_off(&text))
    }

    fn observe(&mut self, now: Instant, spinning: &[usize]) -> bool {
        let most = spinning.iter().max().map_or(0, |m| m + 1);
        if self.since.len() < most {
            self.since.resize(most, None);
        }
        for (cpu, since) in self.since.iter_mut().enumerate() {
            *since = if spinning.contains(&cpu) {
                Some(since.unwrap_or(now))
            } else {
                None
            };
        }
        self.since
            .iter()
            .flatten()
            .any(|&t| now.duration_since(t) >= self.window)
    }
}

/// Sends QMP commands to the QEMU at `socket`; returns each command's reply (events skipped).
pub fn qmp(
    socket: &Path,
    commands: &[serde_json::Value],
) -> anyhow::Result<Vec<serde_json::Value>> {
    use anyhow::Context;
    let stream = UnixStream::connect(socket)
        .with_context(|| format!("no QMP socket at {}", socket.display()))?;
    stream.set_read_timeout(Some(Duration::from_secs(10)))?;
    let mut reader = BufReader::new(stream.try_clone()?);
    let mut writer = stream;
    let mut read = || -> anyhow::Result<serde_json::Value> {
        let mut line = String::new();
        reader.read_line(&mut line).context("QMP: no reply")?;
        serde_json::from_str(&line).with_context(|| format!("QMP: not JSON: {line:?}"))
    };
    read()?; // the greeting
    let mut replies = Vec::new();
    let hello = serde_json::json!({"execute": "qmp_capabilities"});
    for (i, c) in std::iter::once(&hello).chain(commands).enumerate() {
        writeln!(writer, "{c}")?;
        let reply = loop {
            let r = read()?;
            if r.get("event").is_none() {
                break r;
            }
        };
        if i > 0 {
            replies.push(reply);
        }
    }
    Ok(replies)
}

/// The QMP command that presses Alt+SysRq+`key` on the guest's keyboard.
fn sysrq(key: &str) -> serde_json::Value {
    let keys: Vec<serde_json::Value> = ["alt", "sysrq", key]
        .iter()
        .map(|k| serde_json::json!({"type": "qcode", "data": k}))
        .collect();
    serde_json::json!({"execute": "send-key", "arguments": {"keys": keys}})
}

/// Asks the guest's kernel for its blocked tasks (SysRq w) and every task's state and stack
/// (SysRq t) on the console, after raising its console log level (SysRq 9: the guest boots with
/// `loglevel=1`, which would print the dumps' headers alone), and returns what QEMU says of its
/// vCPUs: where each is, whether it is halted, and its local APIC's interrupts in service (ISR),
/// pending (IRR) and priority (PPR), which tell a guest waiting for an interrupt that never
/// comes.
pub fn ask_why(socket: &Path) -> anyhow::Result<String> {
    let hmp = |line: &str| {
        serde_json::json!({"execute": "human-monitor-command",
                           "arguments": {"command-line": line}})
    };
    let replies = qmp(
        socket,
        &[
            serde_json::json!({"execute": "query-status"}),
            hmp("info registers -a"),
        ],
    )?;
    let status = replies
        .first()
        .map(|r| r["return"]["status"].to_string())
        .unwrap_or_default();
    let registers = replies
        .get(1)
        .and_then(|r| r["return"].as_str())
        .unwrap_or_default();
    let mut s = format!("QEMU status {status}");
    let mut cpus = 0;
    for line in registers.lines() {
        let line = line.trim();
        cpus += usize::from(line.starts_with("CPU#"));
        if line.starts_with("CPU#") || line.starts_with("RIP=") || line.contains("HLT=") {
            s += &format!("; {line}");
        }
    }
    let apics: Vec<serde_json::Value> =
        (0..cpus).map(|c| hmp(&format!("info lapic {c}"))).collect();
    for (cpu, reply) in qmp(socket, &apics)?.iter().enumerate() {
        let text = reply["return"].as_str().unwrap_or_default();
        s += &format!("\nlocal APIC of CPU {cpu}: {}", lapic_summary(text));
    }
    qmp(socket, &[sysrq("9"), sysrq("w"), sysrq("t")])?;
    Ok(s)
}

/// Injects an NMI into every vCPU: a guest whose interrupts are stuck (it cannot read SysRq
/// keys) panics on it (`unknown_nmi_panic`), and its panic prints every task's stack.
pub fn inject_nmi(socket: &Path) -> anyhow::Result<()> {
    qmp(socket, &[serde_json::json!({"execute": "inject-nmi"})]).map(|_| ())
}

/// The lines of HMP's `info lapic` that say which interrupts wait: the timer, ISR, IRR and the
/// priorities (PPR).
fn lapic_summary(text: &str) -> String {
    text.lines()
        .map(str::trim)
        .filter(|l| {
            let first = l.split_whitespace().next().unwrap_or_default();
            ["LVTT", "Timer", "ISR", "IRR", "APR"].contains(&first)
        })
        .map(|l| l.split_whitespace().collect::<Vec<_>>().join(" "))
        .collect::<Vec<_>>()
        .join("; ")
}

#[cfg(test)]
mod tests {
    use super::{cpu_time, lapic_summary, spinning_with_interrupts_off, IdleWatch, StuckWatch};
    use std::time::{Duration, Instant};

    #[test]
    fn a_vcpu_spinning_in_its_kernel_with_interrupts_off_for_a_window_is_stuck() {
        // what `info registers -a` printed for a guest stuck so: CPU 0 spins, CPU 1 halts
        let regs = "CPU#0\nRAX=0 RBX=0\nRIP=ffffffff816d6e12 RFL=00000093 [--S-A-C] CPL=0 II=0 A20=1 SMM=0 HLT=0\n\
                    CPU#1\nRIP=ffffffff81a592eb RFL=00000216 [----AP-] CPL=0 II=0 A20=1 SMM=0 HLT=1\n";
        assert_eq!(spinning_with_interrupts_off(regs), [0]);
        // interrupts on, user mode, or halted: not stuck
        for busy in [
            "CPU#0\nRIP=1 RFL=00000293 [] CPL=0 II=0 A20=1 SMM=0 HLT=0\n",
            "CPU#0\nRIP=1 RFL=00000093 [] CPL=3 II=0 A20=1 SMM=0 HLT=0\n",
            "CPU#0\nRIP=1 RFL=00000093 [] CPL=0 II=0 A20=1 SMM=0 HLT=1\n",
        ] {
            assert!(spinning_with_interrupts_off(busy).is_empty(), "{busy}");
        }
        let mut watch = StuckWatch::new("/nonexistent".as_ref(), Duration::from_secs(60));
        let t0 = Instant::now();
        assert!(!watch.observe(t0, &[0]));
        assert!(!watch.observe(t0 + Duration::from_secs(59), &[0]));
        // a sample in between where it ran with interrupts on starts the window again
        assert!(!watch.observe(t0 + Duration::from_secs(60), &[]));
        assert!(!watch.observe(t0 + Duration::from_secs(61), &[0]));
        assert!(watch.observe(t0 + Duration::from_secs(121), &[0]));
        // no QMP socket: nothing is known, nothing is stuck
        assert!(!watch.stuck(Instant::now()));
    }

    #[test]
    fn the_local_apic_summary_keeps_what_says_which_interrupt_waits() {
        // what `info lapic 0` printed for a guest hung under multi-threaded TCG (issue 22)
        let text = "dumping local APIC state for CPU 0 \r\n\r\n\
                    LVT0\t 0x00010700 active-hi edge  masked  ExtINT (vec 0)\r\n\
                    LVTTHMR\t 0x00010000 active-hi edge  masked  Fixed  (vec 0)\r\n\
                    LVTT\t 0x000000ec active-hi edge   one-shot     Fixed  (vec 236)\r\n\
                    Timer\t DCR=0x3 (divide by 16) initial_count = 92045 current_count = 0\r\n\
                    SPIV\t 0x000001ff APIC enabled, focus=off, spurious vec 255\r\n\
                    ISR\t 236 \r\nIRR\t 52 236 \r\n\r\nAPR 0x00 TPR 0x10 DFR 0x0f LDR 0x01 PPR 0xe0\r\n";
        assert_eq!(
            lapic_summary(text),
            "LVTT 0x000000ec active-hi edge one-shot Fixed (vec 236); \
             Timer DCR=0x3 (divide by 16) initial_count = 92045 current_count = 0; \
             ISR 236; IRR 52 236; APR 0x00 TPR 0x10 DFR 0x0f LDR 0x01 PPR 0xe0"
        );
    }

    #[test]
    fn a_busy_process_is_not_idle_and_a_sleeping_one_is() {
        // This test process burns CPU in a loop: never idle over the window.
        let me = std::process::id();
        assert!(cpu_time(me).is_some());
        let mut watch = IdleWatch::new(me, Duration::from_millis(300));
        let start = Instant::now();
        let mut spins = 0u64;
        let mut seen_idle = false;
        while start.elapsed() < Duration::from_millis(700) {
            for _ in 0..100_000 {
                spins = std::hint::black_box(spins.wrapping_add(1));
            }
            seen_idle |= watch.idle(Instant::now());
        }
        assert!(!seen_idle, "a spinning process was taken for idle");
        // A child that sleeps uses no CPU: idle once a whole window has passed.
        let mut child = std::process::Command::new("sleep")
            .arg("5")
            .spawn()
            .expect("sleep");
        let mut watch = IdleWatch::new(child.id(), Duration::from_millis(300));
        let start = Instant::now();
        assert!(!watch.idle(start), "idle before a window has passed");
        let mut idle = false;
        while !idle && start.elapsed() < Duration::from_secs(4) {
            std::thread::sleep(Duration::from_millis(50));
            idle = watch.idle(Instant::now());
        }
        let _ = child.kill();
        let _ = child.wait();
        assert!(idle, "a sleeping process was never taken for idle");
        assert!(cpu_time(u32::MAX).is_none());
    }
}
