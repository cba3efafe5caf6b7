//! Wall-clock time as UTC calendar fields, for run folder names, summaries and
//! the monitor's header (no time-zone database needed).

use std::fmt;
use std::time::{SystemTime, UNIX_EPOCH};

/// A UTC date and time, to the second.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Utc {
    /// Year.
    pub year: i64,
    /// Month, 1-12.
    pub month: i64,
    /// Day of the month, 1-31.
    pub day: i64,
    /// Hour, 0-23.
    pub hour: i64,
    /// Minute.
    pub minute: i64,
    /// Second.
    pub second: i64,
}

/// Seconds since the Unix epoch, now.
pub fn unix_now() -> f64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0.0, |d| d.as_secs_f64())
}

impl Utc {
    /// The calendar fields of a Unix time (H. Hinnant's days-to-civil, proleptic Gregorian).
    pub fn from_unix(unix: f64) -> Self {
        let secs = unix.max(0.0) as i64;
        let (days, rem) = (secs.div_euclid(86_400), secs.rem_euclid(86_400));
        let z = days + 719_468;
        let era = z.div_euclid(146_097);
        let doe = z - era * 146_097;
        let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
        let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
        let mp = (5 * doy + 2) / 153;
        let month = if mp < 10 { mp + 3 } else { mp - 9 };
        Self {
            year: yoe + era * 400 + i64::from(month <= 2),
            month,
            day: doy - (153 * mp + 2) / 5 + 1,
            hour: rem / 3600,
            minute: rem / 60 % 60,
            second: rem % 60,
        }
    }

    /// `YYYYmmdd-HHMMSS`, sortable, for folder names.
    pub fn stamp(&self) -> String {
        format!(
            "{:04}{:02}{:02}-{:02}{:02}{:02}",
            self.year, self.month, self.day, self.hour, self.minute, self.second
        )
    }
}

impl fmt::Display for Utc {
    /// `YYYY-mm-dd HH:MM:SS UTC`.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{:04}-{:02}-{:02} {:02}:{:02}:{:02} UTC",
            self.year, self.month, self.day, self.hour, self.minute, self.second
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn known_dates() {
        assert_eq!(Utc::from_unix(0.0).stamp(), "19700101-000000");
        assert_eq!(
            Utc::from_unix(1_795_317_005.0).to_string(),
            "2026-11-22 03:10:05 UTC"
        );
        assert_eq!(Utc::from_unix(951_782_400.0).stamp(), "20000229-000000");
    }
}
