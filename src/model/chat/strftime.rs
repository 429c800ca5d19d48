//! `strftime_now(format)` for templates that print today's date (Llama 3.2
//! and later write "Today Date: 26 Jul 2024" into the system turn).
//!
//! A small C/Python `strftime` over UTC civil time: the core has no time zone
//! database, and the browser build has no clock of its own (the caller passes
//! the time; see [`super::ChatTemplate::with_now`]).

use std::fmt::Write;

const MONTHS: [&str; 12] = [
    "January",
    "February",
    "March",
    "April",
    "May",
    "June",
    "July",
    "August",
    "September",
    "October",
    "November",
    "December",
];
const WEEKDAYS: [&str; 7] = [
    "Monday",
    "Tuesday",
    "Wednesday",
    "Thursday",
    "Friday",
    "Saturday",
    "Sunday",
];

/// A UTC calendar time broken into fields.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Civil {
    year: i64,
    /// 1..=12
    month: u32,
    /// 1..=31
    day: u32,
    hour: u32,
    minute: u32,
    second: u32,
    /// 0 = Monday .. 6 = Sunday
    weekday: u32,
    /// 1..=366
    yday: u32,
}

/// Days since 1970-01-01 to (year, month, day) in the proleptic Gregorian
/// calendar (Howard Hinnant's `civil_from_days`).
fn civil_from_days(z: i64) -> (i64, u32, u32) {
    let z = z + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = (doy - (153 * mp + 2) / 5 + 1) as u32;
    let month = if mp < 10 { mp + 3 } else { mp - 9 } as u32;
    let year = yoe + era * 400 + i64::from(month <= 2);
    (year, month, day)
}

fn is_leap(year: i64) -> bool {
    (year % 4 == 0 && year % 100 != 0) || year % 400 == 0
}

impl Civil {
    fn from_unix(secs: i64) -> Civil {
        let days = secs.div_euclid(86_400);
        let rem = secs.rem_euclid(86_400) as u32;
        let (year, month, day) = civil_from_days(days);
        const CUMULATIVE: [u32; 12] = [0, 31, 59, 90, 120, 151, 181, 212, 243, 273, 304, 334];
        let leap_shift = u32::from(month > 2 && is_leap(year));
        Civil {
            year,
            month,
            day,
            hour: rem / 3600,
            minute: rem / 60 % 60,
            second: rem % 60,
            // 1970-01-01 was a Thursday (3 when Monday is 0).
            weekday: (days + 3).rem_euclid(7) as u32,
            yday: CUMULATIVE[month as usize - 1] + day + leap_shift,
        }
    }
}

/// Formats `unix_secs` (UTC) with C `strftime` directives: `%Y %y %m %d %e %H
/// %I %M %S %p %j %a %A %b %h %B %F %T %D %R %n %t %%`; the glibc `-` flag drops
/// zero padding (`%-d`). Unknown directives are copied through, as glibc does.
pub(crate) fn strftime(format: &str, unix_secs: i64) -> String {
    let t = Civil::from_unix(unix_secs);
    let mut out = String::new();
    let mut chars = format.chars();
    while let Some(c) = chars.next() {
        if c != '%' {
            out.push(c);
            continue;
        }
        let mut spec = chars.next();
        let pad = spec != Some('-');
        if !pad {
            spec = chars.next();
        }
        match spec {
            Some(s) => write_directive(&mut out, s, &t, pad),
            None => out.push('%'),
        }
    }
    out
}

fn write_directive(out: &mut String, spec: char, t: &Civil, pad: bool) {
    let num = |out: &mut String, v: i64, width: usize| {
        let _ = if pad {
            write!(out, "{v:0width$}")
        } else {
            write!(out, "{v}")
        };
    };
    let hour12 = if t.hour.is_multiple_of(12) {
        12
    } else {
        t.hour % 12
    };
    match spec {
        'Y' => {
            let _ = write!(out, "{}", t.year);
        }
        'y' => num(out, t.year.rem_euclid(100), 2),
        'm' => num(out, t.month.into(), 2),
        'd' => num(out, t.day.into(), 2),
        'e' => {
            let _ = write!(out, "{:2}", t.day);
        }
        'H' => num(out, t.hour.into(), 2),
        'I' => num(out, hour12.into(), 2),
        'M' => num(out, t.minute.into(), 2),
        'S' => num(out, t.second.into(), 2),
        'j' => num(out, t.yday.into(), 3),
        'p' => out.push_str(if t.hour < 12 { "AM" } else { "PM" }),
        'a' => out.push_str(&WEEKDAYS[t.weekday as usize][..3]),
        'A' => out.push_str(WEEKDAYS[t.weekday as usize]),
        'b' | 'h' => out.push_str(&MONTHS[t.month as usize - 1][..3]),
        'B' => out.push_str(MONTHS[t.month as usize - 1]),
        'F' => {
            let _ = write!(out, "{}-{:02}-{:02}", t.year, t.month, t.day);
        }
        'T' => {
            let _ = write!(out, "{:02}:{:02}:{:02}", t.hour, t.minute, t.second);
        }
        'R' => {
            let _ = write!(out, "{:02}:{:02}", t.hour, t.minute);
        }
        'D' => {
            let _ = write!(
                out,
                "{:02}/{:02}/{:02}",
                t.month,
                t.day,
                t.year.rem_euclid(100)
            );
        }
        'n' => out.push('\n'),
        't' => out.push('\t'),
        '%' => out.push('%'),
        other => {
            out.push('%');
            if !pad {
                out.push('-');
            }
            out.push(other);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn formats_known_instants() {
        // Reference strings from Python: datetime.fromtimestamp(t, timezone.utc).strftime(f)
        assert_eq!(strftime("%Y-%m-%d %H:%M:%S", 0), "1970-01-01 00:00:00");
        assert_eq!(strftime("%d %b %Y", 1_721_995_200), "26 Jul 2024");
        assert_eq!(
            strftime("%a %A %B %j %y %I %p %-d %e|%%|%Q", 1_741_520_096),
            "Sun Sunday March 068 25 11 AM 9  9|%|%Q"
        );
        // Leap day, afternoon, day of year past February.
        assert_eq!(
            strftime("%F %T %j %I%p", 1_709_164_800 + 13 * 3600),
            "2024-02-29 13:00:00 060 01PM"
        );
        assert_eq!(strftime("%j", 1_735_603_200), "366"); // 2024-12-31
        assert_eq!(strftime("%F %a", -86_400), "1969-12-31 Wed");
    }
}
