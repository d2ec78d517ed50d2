//! `usnvme health`: the SMART / Health Information log of each controller and its PCIe link, as
//! a server's management console shows them, with a one-line verdict.

use std::io::Write;

use anyhow::Result;
use serde::Serialize;
use usnvme_driver::pci::Sysfs;
use usnvme_driver::spec::log::CriticalWarning;
use usnvme_driver::spec::SmartLog;
use usnvme_driver::vfio::PcieLink;
use usnvme_engine::transport::{Controller, ControllerError, Reach};

use crate::format::{names_or_none, si_bytes, Fields};
use crate::open;

/// Arguments of `usnvme health`: the drives, and `--json`.
pub type Args = open::Targets;

pub fn run(sysfs: &Sysfs, args: &Args, out: &mut dyn Write) -> Result<()> {
    open::report(sysfs, args, out, report, render)
}

/// One controller's health, as `--json` prints it. Counters are the log's, unscaled, except
/// `bytes_read`/`bytes_written` (data units times 512 000).
#[derive(Debug, Clone, Serialize)]
pub struct HealthReport {
    pub address: String,
    pub model: String,
    pub serial: String,
    /// `OK` or `WARNING`.
    pub verdict: &'static str,
    /// Why the verdict is `WARNING`; empty for `OK`.
    pub warnings: Vec<String>,
    pub temperature_celsius: i16,
    /// WCTEMP and CCTEMP of Identify Controller, when the controller reports them.
    pub warning_temperature_celsius: Option<i32>,
    pub critical_temperature_celsius: Option<i32>,
    /// Percent of the rated endurance used; may exceed 100.
    pub percentage_used: u8,
    pub available_spare: u8,
    pub available_spare_threshold: u8,
    pub available_spare_below_threshold: bool,
    /// Critical Warning bits set, by name.
    pub critical_warnings: Vec<&'static str>,
    pub media_errors: u128,
    pub error_log_entries: u128,
    pub power_on_hours: u128,
    pub power_cycles: u128,
    pub unsafe_shutdowns: u128,
    pub data_units_read: u128,
    pub data_units_written: u128,
    pub bytes_read: u128,
    pub bytes_written: u128,
    pub host_read_commands: u128,
    pub host_write_commands: u128,
    pub controller_busy_minutes: u128,
    /// `null` when the device has no PCI Express capability (or is remote).
    pub pcie_link: Option<LinkReport>,
    /// `pcie` for a local controller, `tcp` for a remote one.
    pub transport: &'static str,
    /// Asynchronous events the controller reported while usnvme held it (one it kept for the
    /// first Asynchronous Event Request included); local controllers only.
    pub async_events: Vec<String>,
}

/// The PCIe link: current and maximum, as text (`32 GT/s x4`) and as numbers.
#[derive(Debug, Clone, Serialize)]
pub struct LinkReport {
    pub current: String,
    pub max: String,
    pub downgraded: bool,
    #[serde(flatten)]
    pub link: PcieLink,
}

impl LinkReport {
    fn new(link: PcieLink) -> LinkReport {
        // PcieLink displays the maximum only when it differs: show each on its own.
        let current = PcieLink {
            max_speed_gts_x10: link.speed_gts_x10,
            max_width: link.width,
            ..link
        };
        let max = PcieLink {
            speed_gts_x10: link.max_speed_gts_x10,
            width: link.max_width,
            ..link
        };
        LinkReport {
            current: current.to_string(),
            max: max.to_string(),
            downgraded: (link.speed_gts_x10, link.width)
                != (link.max_speed_gts_x10, link.max_width),
            link,
        }
    }
}

/// Reads the SMART / Health log of `ctrl` (a remote one's: the target's, for the whole
/// subsystem).
pub fn report(ctrl: &mut Controller<'_>) -> Result<HealthReport, ControllerError> {
    let smart = ctrl.smart_log()?;
    let id = ctrl.identify()?;
    let link = match ctrl.reach() {
        Reach::Pcie { link, .. } => link,
        Reach::Tcp { .. } => None,
    };
    let mut report = HealthReport::new(
        &ctrl.name(),
        &id.model(),
        &id.serial(),
        &smart,
        (id.wctemp, id.cctemp),
        link,
    );
    match ctrl {
        Controller::Tcp { .. } => report.transport = "tcp",
        Controller::Pcie(c) => {
            report.async_events = c.events().iter().map(|e| e.to_string()).collect()
        }
    }
    Ok(report)
}

/// Kelvin to Celsius; `None` for 0, which means "not reported".
fn threshold_celsius(kelvin: u16) -> Option<i32> {
    (kelvin != 0).then(|| i32::from(kelvin) - 273)
}

impl HealthReport {
    /// The report from a SMART log, Identify Controller's (WCTEMP, CCTEMP) in kelvin and the link.
    pub fn new(
        address: &str,
        model: &str,
        serial: &str,
        smart: &SmartLog,
        (wctemp, cctemp): (u16, u16),
        link: Option<PcieLink>,
    ) -> HealthReport {
        let mut report = HealthReport {
            address: address.to_owned(),
            model: model.to_owned(),
            serial: serial.to_owned(),
            verdict: "OK",
            warnings: Vec::new(),
            temperature_celsius: smart.temperature_celsius(),
            warning_temperature_celsius: threshold_celsius(wctemp),
            critical_temperature_celsius: threshold_celsius(cctemp),
            percentage_used: smart.percentage_used,
            available_spare: smart.available_spare,
            available_spare_threshold: smart.available_spare_threshold,
            available_spare_below_threshold: smart.available_spare
                < smart.available_spare_threshold,
            critical_warnings: smart.critical_warnings().names().collect(),
            media_errors: smart.media_errors(),
            error_log_entries: smart.error_log_entries(),
            power_on_hours: smart.power_on_hours(),
            power_cycles: smart.power_cycles(),
            unsafe_shutdowns: smart.unsafe_shutdowns(),
            data_units_read: smart.data_units_read(),
            data_units_written: smart.data_units_written(),
            bytes_read: smart.bytes_read(),
            bytes_written: smart.bytes_written(),
            host_read_commands: smart.host_read_commands(),
            host_write_commands: smart.host_write_commands(),
            controller_busy_minutes: smart.controller_busy_time(),
            pcie_link: link.map(LinkReport::new),
            transport: "pcie",
            async_events: Vec::new(),
        };
        report.warnings = warnings(smart, report.warning_temperature_celsius);
        if !report.warnings.is_empty() {
            report.verdict = "WARNING";
        }
        report
    }
}

/// Why a drive needs attention, one reason each; none means OK:
/// - every Critical Warning bit the controller sets;
/// - available spare below its threshold;
/// - percentage used at 100 or more (the rated endurance is used up);
/// - the composite temperature at or above the warning threshold (WCTEMP), when reported.
///
/// The spare and temperature checks are skipped when the controller already flags them with a
/// Critical Warning bit, so that one cause gives one reason.
pub fn warnings(smart: &SmartLog, warning_celsius: Option<i32>) -> Vec<String> {
    let flags = smart.critical_warnings();
    let mut reasons: Vec<String> = flags
        .names()
        .map(|name| format!("critical warning: {name}"))
        .collect();
    if smart.available_spare < smart.available_spare_threshold
        && !flags.contains(CriticalWarning::AVAILABLE_SPARE)
    {
        reasons.push(format!(
            "available spare {}% is below its threshold of {}%",
            smart.available_spare, smart.available_spare_threshold
        ));
    }
    if smart.percentage_used >= 100 {
        reasons.push(format!(
            "percentage used {}%: the rated endurance is used up",
            smart.percentage_used
        ));
    }
    let celsius = i32::from(smart.temperature_celsius());
    if let Some(limit) = warning_celsius {
        if celsius >= limit && !flags.contains(CriticalWarning::TEMPERATURE) {
            reasons.push(format!(
                "temperature {celsius} °C is at or above the warning threshold of {limit} °C"
            ));
        }
    }
    reasons
}

/// The text form of one controller.
pub fn render(h: &HealthReport) -> String {
    let mut f = Fields::new();
    f.heading(0, &h.address);
    f.field(1, "Model", &h.model);
    f.field(1, "Serial", &h.serial);
    let verdict = if h.warnings.is_empty() {
        h.verdict.to_owned()
    } else {
        format!("{}: {}", h.verdict, h.warnings.join("; "))
    };
    f.field(1, "Health", verdict);
    let mut temperature = format!("{} °C", h.temperature_celsius);
    let limits: Vec<String> = [
        ("warning", h.warning_temperature_celsius),
        ("critical", h.critical_temperature_celsius),
    ]
    .into_iter()
    .filter_map(|(what, c)| Some(format!("{what} at {} °C", c?)))
    .collect();
    if !limits.is_empty() {
        temperature.push_str(&format!(" ({})", limits.join(", ")));
    }
    f.field(1, "Temperature", temperature);
    f.field(1, "Percentage used", format!("{}%", h.percentage_used));
    let mut spare = format!(
        "{}% (threshold {}%)",
        h.available_spare, h.available_spare_threshold
    );
    if h.available_spare_below_threshold {
        spare.push_str(", below threshold");
    }
    f.field(1, "Available spare", spare);
    f.field(
        1,
        "Critical warnings",
        names_or_none(h.critical_warnings.iter().copied()),
    );
    if !h.async_events.is_empty() {
        f.field(1, "Asynchronous events", h.async_events.join("; "));
    }
    f.field(1, "Media and integrity errors", h.media_errors);
    f.field(1, "Error log entries", h.error_log_entries);
    f.field(1, "Power-on hours", h.power_on_hours);
    f.field(1, "Power cycles", h.power_cycles);
    f.field(1, "Unsafe shutdowns", h.unsafe_shutdowns);
    f.field(1, "Data read", data_units(h.bytes_read, h.data_units_read));
    f.field(
        1,
        "Data written",
        data_units(h.bytes_written, h.data_units_written),
    );
    f.field(1, "Host read commands", h.host_read_commands);
    f.field(1, "Host write commands", h.host_write_commands);
    f.field(
        1,
        "Controller busy time",
        format!("{} min", h.controller_busy_minutes),
    );
    let link = h.pcie_link.as_ref().map_or_else(
        || "unknown (no PCI Express capability)".to_owned(),
        |l| {
            let mut text = format!("{} (max {})", l.current, l.max);
            if l.downgraded {
                text.push_str(", downgraded");
            }
            text
        },
    );
    if h.transport == "tcp" {
        f.field(1, "Transport", "NVMe/TCP");
    } else {
        f.field(1, "PCIe link", link);
    }
    f.render()
}

/// `1.2 TB (2343750 data units)`.
fn data_units(bytes: u128, units: u128) -> String {
    let plural = if units == 1 { "" } else { "s" };
    format!("{} ({units} data unit{plural})", si_bytes(bytes))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A healthy log: 40 °C, 100% spare (threshold 10%), 3% used.
    fn smart() -> SmartLog {
        let mut s = SmartLog::zeroed();
        s.composite_temperature = 313u16.to_le_bytes();
        s.available_spare = 100;
        s.available_spare_threshold = 10;
        s.percentage_used = 3;
        s.data_units_written = 2_343_750u128.to_le_bytes();
        s
    }

    #[test]
    fn healthy_drive_is_ok() {
        assert!(warnings(&smart(), Some(70)).is_empty());
        assert!(warnings(&smart(), None).is_empty());
        let h = HealthReport::new("0000:01:00.0", "M", "S", &smart(), (343, 358), None);
        assert_eq!(h.verdict, "OK");
        assert_eq!(h.warning_temperature_celsius, Some(70));
        assert_eq!(h.critical_temperature_celsius, Some(85));
        assert_eq!(h.bytes_written, 1_200_000_000_000);
    }

    #[test]
    fn each_cause_gives_one_reason() {
        let mut s = smart();
        s.available_spare = 5;
        assert_eq!(
            warnings(&s, None),
            ["available spare 5% is below its threshold of 10%"]
        );
        // The controller's own flag replaces the computed reason.
        s.critical_warning = CriticalWarning::AVAILABLE_SPARE;
        assert_eq!(
            warnings(&s, None),
            ["critical warning: available spare below threshold"]
        );

        let mut s = smart();
        s.percentage_used = 100;
        assert_eq!(
            warnings(&s, None),
            ["percentage used 100%: the rated endurance is used up"]
        );
        s.percentage_used = 99;
        assert!(warnings(&s, None).is_empty());

        let mut s = smart();
        s.composite_temperature = 343u16.to_le_bytes(); // 70 °C
        assert_eq!(
            warnings(&s, Some(70)),
            ["temperature 70 °C is at or above the warning threshold of 70 °C"]
        );
        assert!(warnings(&s, Some(71)).is_empty());
        assert!(warnings(&s, None).is_empty(), "no threshold reported");
        s.critical_warning = CriticalWarning::TEMPERATURE | CriticalWarning::READ_ONLY;
        assert_eq!(
            warnings(&s, Some(70)),
            [
                "critical warning: temperature",
                "critical warning: read-only"
            ]
        );
        let h = HealthReport::new("0000:01:00.0", "M", "S", &s, (343, 0), None);
        assert_eq!(h.verdict, "WARNING");
        assert_eq!(h.critical_warnings, ["temperature", "read-only"]);
        assert!(render(&h).contains(
            "Health:                      WARNING: critical warning: temperature; critical warning: read-only\n"
        ));
    }

    #[test]
    fn text_layout() {
        let link = PcieLink {
            speed_gts_x10: 160,
            width: 4,
            max_speed_gts_x10: 320,
            max_width: 4,
        };
        let h = HealthReport::new("0000:01:00.0", "M", "S", &smart(), (343, 0), Some(link));
        let expect = "\
0000:01:00.0
  Model:                       M
  Serial:                      S
  Health:                      OK
  Temperature:                 40 °C (warning at 70 °C)
  Percentage used:             3%
  Available spare:             100% (threshold 10%)
  Critical warnings:           none
  Media and integrity errors:  0
  Error log entries:           0
  Power-on hours:              0
  Power cycles:                0
  Unsafe shutdowns:            0
  Data read:                   0 B (0 data units)
  Data written:                1.2 TB (2343750 data units)
  Host read commands:          0
  Host write commands:         0
  Controller busy time:        0 min
  PCIe link:                   16 GT/s x4 (max 32 GT/s x4), downgraded
";
        assert_eq!(render(&h), expect);
        let json = serde_json::to_value(&h).expect("JSON");
        assert_eq!(json["pcie_link"]["current"], "16 GT/s x4");
        assert_eq!(json["pcie_link"]["max_width"], 4);
        assert_eq!(json["bytes_written"], 1_200_000_000_000u64);
        assert_eq!(json["critical_warnings"], serde_json::json!([]));
    }
}
