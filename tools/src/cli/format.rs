//! Text helpers shared by the commands: human-readable sizes and an aligned `key: value` layout.

use std::fmt::Display;

const SI_UNITS: [&str; 9] = ["B", "kB", "MB", "GB", "TB", "PB", "EB", "ZB", "YB"];
const IEC_UNITS: [&str; 9] = ["B", "KiB", "MiB", "GiB", "TiB", "PiB", "EiB", "ZiB", "YiB"];

/// Bytes in decimal units, three significant digits: `0 B`, `999 B`, `1.07 GB`, `512 kB`,
/// `1.2 TB`. What drive vendors and SMART tools use for capacities and data written.
pub fn si_bytes(bytes: u128) -> String {
    scaled(bytes, 1000, &SI_UNITS)
}

/// Bytes in binary units, three significant digits: `512 KiB`, `1 GiB`, `1.5 MiB`. Used where
/// the quantity is a power of two by nature (transfer sizes, memory).
pub fn iec_bytes(bytes: u128) -> String {
    scaled(bytes, 1024, &IEC_UNITS)
}

fn scaled(bytes: u128, base: u128, units: &[&str]) -> String {
    if bytes < base {
        return format!("{bytes} {}", units[0]);
    }
    let base_f = base as f64;
    let mut value = bytes as f64;
    let mut unit = 0;
    while value >= base_f && unit + 1 < units.len() {
        value /= base_f;
        unit += 1;
    }
    let mut text = three_digits(value);
    // 999.96 kB rounds to "1000": say 1 MB instead.
    if text.parse::<f64>().is_ok_and(|v| v >= base_f) && unit + 1 < units.len() {
        value /= base_f;
        unit += 1;
        text = three_digits(value);
    }
    format!("{text} {}", units[unit])
}

/// `value` with three significant digits (at least its integer part), trailing zeros dropped.
fn three_digits(value: f64) -> String {
    let decimals = if value >= 100.0 {
        0
    } else if value >= 10.0 {
        1
    } else {
        2
    };
    let text = format!("{value:.decimals$}");
    if text.contains('.') {
        text.trim_end_matches('0').trim_end_matches('.').to_owned()
    } else {
        text
    }
}

/// `part` as a whole percentage of `whole` (rounded down; 0 when `whole` is 0).
pub fn percent(part: u64, whole: u64) -> u64 {
    if whole == 0 {
        return 0;
    }
    (u128::from(part) * 100 / u128::from(whole)) as u64
}

/// Names joined by `, `, or `none`.
pub fn names_or_none<'a>(names: impl IntoIterator<Item = &'a str>) -> String {
    let names: Vec<&str> = names.into_iter().collect();
    if names.is_empty() {
        "none".to_owned()
    } else {
        names.join(", ")
    }
}

/// A block of `key: value` lines with the values aligned in one column, and headings.
#[derive(Debug, Default)]
pub struct Fields {
    lines: Vec<Line>,
}

#[derive(Debug)]
enum Line {
    Heading {
        indent: usize,
        text: String,
    },
    Field {
        indent: usize,
        key: String,
        value: String,
    },
}

/// Spaces per indent level.
const INDENT: usize = 2;

impl Fields {
    pub fn new() -> Fields {
        Fields::default()
    }

    /// A line of its own (`0000:01:00.0`, `Namespace 1`), not part of the alignment.
    pub fn heading(&mut self, indent: usize, text: impl Display) {
        self.lines.push(Line::Heading {
            indent,
            text: text.to_string(),
        });
    }

    /// A `key: value` line.
    pub fn field(&mut self, indent: usize, key: impl Display, value: impl Display) {
        self.lines.push(Line::Field {
            indent,
            key: key.to_string(),
            value: value.to_string(),
        });
    }

    /// The lines, every value starting in the same column.
    pub fn render(&self) -> String {
        let column = self
            .lines
            .iter()
            .filter_map(|line| match line {
                Line::Field { indent, key, .. } => Some(indent * INDENT + key.chars().count() + 1),
                Line::Heading { .. } => None,
            })
            .max()
            .unwrap_or(0)
            + 2;
        let mut text = String::new();
        for line in &self.lines {
            match line {
                Line::Heading {
                    indent,
                    text: heading,
                } => {
                    text.push_str(&" ".repeat(indent * INDENT));
                    text.push_str(heading);
                }
                Line::Field { indent, key, value } => {
                    let start = indent * INDENT + key.chars().count() + 1;
                    text.push_str(&" ".repeat(indent * INDENT));
                    text.push_str(key);
                    text.push(':');
                    if !value.is_empty() {
                        text.push_str(&" ".repeat(column - start));
                        text.push_str(value);
                    }
                }
            }
            text.push('\n');
        }
        text
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn si_sizes_have_three_significant_digits() {
        assert_eq!(si_bytes(0), "0 B");
        assert_eq!(si_bytes(999), "999 B");
        assert_eq!(si_bytes(1000), "1 kB");
        assert_eq!(si_bytes(512_000), "512 kB");
        assert_eq!(si_bytes(1 << 30), "1.07 GB");
        assert_eq!(si_bytes(1_200_000_000_000), "1.2 TB");
        assert_eq!(si_bytes(1_234_567_890_000), "1.23 TB");
        assert_eq!(si_bytes(12_345_678_900_000), "12.3 TB");
        assert_eq!(si_bytes(7_680_000_000_000), "7.68 TB");
        // rounding up into the next unit
        assert_eq!(si_bytes(999_999), "1 MB");
        assert_eq!(si_bytes(999_499), "999 kB");
        // 128-bit SMART counters go beyond 64 bits, and beyond yottabytes the number grows
        assert_eq!(si_bytes(u128::from(u64::MAX) * 512_000), "9.44 YB");
        assert_eq!(si_bytes(u128::MAX), "340282366920938 YB");
    }

    #[test]
    fn iec_sizes() {
        assert_eq!(iec_bytes(512), "512 B");
        assert_eq!(iec_bytes(4096), "4 KiB");
        assert_eq!(iec_bytes(512 << 10), "512 KiB");
        assert_eq!(iec_bytes(1536), "1.5 KiB");
        assert_eq!(iec_bytes(1 << 30), "1 GiB");
        assert_eq!(iec_bytes(3_840_755_982_336), "3.49 TiB");
        assert_eq!(iec_bytes(1023 << 10), "1023 KiB");
    }

    #[test]
    fn percentages_and_name_lists() {
        assert_eq!(percent(1, 3), 33);
        assert_eq!(percent(5, 0), 0);
        assert_eq!(percent(u64::MAX, u64::MAX), 100);
        assert_eq!(names_or_none([]), "none");
        assert_eq!(names_or_none(["Compare", "Copy"]), "Compare, Copy");
    }

    #[test]
    fn fields_align_values_across_indents() {
        let mut f = Fields::new();
        f.heading(0, "0000:01:00.0");
        f.field(1, "Model", "QEMU NVMe Ctrl");
        f.field(1, "Shadow doorbells", "on");
        f.heading(1, "Namespace 1");
        f.field(2, "Size", "1 GiB");
        f.field(1, "Empty", "");
        assert_eq!(
            f.render(),
            "0000:01:00.0\n\
             \x20 Model:             QEMU NVMe Ctrl\n\
             \x20 Shadow doorbells:  on\n\
             \x20 Namespace 1\n\
             \x20   Size:            1 GiB\n\
             \x20 Empty:\n"
        );
    }
}
