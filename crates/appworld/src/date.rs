//! Calendar dates as day numbers, with the little arithmetic the apps and tasks need.
//!
//! Dates are counted in days since 1970-01-01 (proleptic Gregorian calendar), so "N days ago"
//! is a subtraction and comparisons are integer comparisons.

use std::fmt;

use serde::{Deserialize, Deserializer, Serialize, Serializer};

/// A calendar date.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Date(pub i32);

impl Date {
    /// The date of `year-month-day` (month and day are 1-based and assumed valid).
    pub fn from_ymd(year: i32, month: u32, day: u32) -> Date {
        // Shift the year to start in March so the leap day is the last day of the year.
        let y = if month <= 2 { year - 1 } else { year };
        let era = y.div_euclid(400);
        let year_of_era = y - era * 400;
        let m = month as i32;
        let day_of_year = (153 * (if m > 2 { m - 3 } else { m + 9 }) + 2) / 5 + day as i32 - 1;
        let day_of_era = year_of_era * 365 + year_of_era / 4 - year_of_era / 100 + day_of_year;
        Date(era * 146_097 + day_of_era - 719_468)
    }

    /// The date's year, month and day.
    pub fn ymd(self) -> (i32, u32, u32) {
        let z = self.0 + 719_468;
        let era = z.div_euclid(146_097);
        let day_of_era = z - era * 146_097;
        let year_of_era =
            (day_of_era - day_of_era / 1460 + day_of_era / 36_524 - day_of_era / 146_096) / 365;
        let day_of_year = day_of_era - (365 * year_of_era + year_of_era / 4 - year_of_era / 100);
        let mp = (5 * day_of_year + 2) / 153;
        let day = (day_of_year - (153 * mp + 2) / 5 + 1) as u32;
        let month = if mp < 10 { mp + 3 } else { mp - 9 } as u32;
        let year = year_of_era + era * 400 + i32::from(month <= 2);
        (year, month, day)
    }

    /// The date `days` later (earlier when negative).
    pub fn plus_days(self, days: i32) -> Date {
        Date(self.0 + days)
    }

    /// The first day of this date's month.
    pub fn month_start(self) -> Date {
        let (y, m, _) = self.ymd();
        Date::from_ymd(y, m, 1)
    }

    /// The first day of the previous month.
    pub fn previous_month_start(self) -> Date {
        let (y, m, _) = self.ymd();
        if m == 1 {
            Date::from_ymd(y - 1, 12, 1)
        } else {
            Date::from_ymd(y, m - 1, 1)
        }
    }

    /// The first day of this date's year.
    pub fn year_start(self) -> Date {
        Date::from_ymd(self.ymd().0, 1, 1)
    }

    /// Parse `YYYY-MM-DD`.
    pub fn parse(text: &str) -> Option<Date> {
        let mut parts = text.trim().splitn(3, '-');
        let y: i32 = parts.next()?.parse().ok()?;
        let m: u32 = parts.next()?.parse().ok()?;
        let d: u32 = parts.next()?.parse().ok()?;
        if !(1..=12).contains(&m) || d == 0 || d > 31 {
            return None;
        }
        let date = Date::from_ymd(y, m, d);
        (date.ymd() == (y, m, d)).then_some(date)
    }

    /// The English name of the date's weekday.
    pub fn weekday(self) -> &'static str {
        // 1970-01-01 was a Thursday.
        const NAMES: [&str; 7] = [
            "Thursday",
            "Friday",
            "Saturday",
            "Sunday",
            "Monday",
            "Tuesday",
            "Wednesday",
        ];
        NAMES[self.0.rem_euclid(7) as usize]
    }

    /// The English name of the date's month.
    pub fn month_name(self) -> &'static str {
        const NAMES: [&str; 12] = [
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
        NAMES[self.ymd().1 as usize - 1]
    }
}

impl fmt::Display for Date {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let (y, m, d) = self.ymd();
        write!(f, "{y:04}-{m:02}-{d:02}")
    }
}

impl Serialize for Date {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.collect_str(self)
    }
}

impl<'de> Deserialize<'de> for Date {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        let text = String::deserialize(deserializer)?;
        Date::parse(&text)
            .ok_or_else(|| serde::de::Error::custom(format!("`{text}` is not a YYYY-MM-DD date")))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trips_through_ymd_and_text() {
        assert_eq!(Date::from_ymd(1970, 1, 1), Date(0));
        assert_eq!(Date::from_ymd(2000, 3, 1).to_string(), "2000-03-01");
        for day in -1000..30_000 {
            let date = Date(day);
            let (y, m, d) = date.ymd();
            assert_eq!(Date::from_ymd(y, m, d), date);
            assert_eq!(Date::parse(&date.to_string()), Some(date));
        }
        assert_eq!(Date::parse("2023-02-29"), None);
        assert_eq!(
            Date::parse("2024-02-29").map(|d| d.weekday()),
            Some("Thursday")
        );
    }

    #[test]
    fn month_arithmetic_crosses_years() {
        let d = Date::parse("2024-01-15").unwrap();
        assert_eq!(d.month_start().to_string(), "2024-01-01");
        assert_eq!(d.previous_month_start().to_string(), "2023-12-01");
        assert_eq!(d.year_start().to_string(), "2024-01-01");
        assert_eq!(d.month_name(), "January");
    }
}
