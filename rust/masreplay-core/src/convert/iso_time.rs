//! ISO-8601 times as Python's `datetime.fromisoformat(text).timestamp()` reads them (3.11):
//! a date `YYYY-MM-DD` or `YYYYMMDD`, optionally any one separator character and a time
//! `HH[:MM[:SS[.f...]]]` (or `HHMMSS`; fraction after `.` or `,`, cut to microseconds), and an
//! offset `Z` or `±HH[:MM[:SS[.f]]]`. A time without an offset is read as UTC (Python reads
//! it in the machine's zone; the project's machines run in UTC). Week dates are not read.

/// Seconds since the Unix epoch, or `None` when `text` is no such time.
pub fn seconds(text: &str) -> Option<f64> {
    let bytes = text.as_bytes();
    let (date, rest) =
        if bytes.get(4) == Some(&b'-') { (text.get(..10)?, text.get(10..)?) } else { (text.get(..8)?, text.get(8..)?) };
    let (year, month, day) = parse_date(date)?;
    let mut micros = i128::from(days_from_civil(year, month, day)) * 86_400_000_000;
    if !rest.is_empty() {
        let mut chars = rest.chars();
        chars.next()?; // the separator: any one character
        let time = chars.as_str();
        let (clock, offset) = split_offset(time)?;
        micros += parse_clock(clock)?;
        if let Some((sign, offset)) = offset {
            let shift = if offset == "Z" { 0 } else { parse_clock(offset)? };
            if shift >= 86_400_000_000 {
                return None;
            }
            micros -= sign * shift;
        }
    }
    // Python divides the whole microseconds by 10**6 once, correctly rounded; so does this
    // for any time whose microseconds fit in 2^53 (years up to about 2255 before and after 1970).
    Some(micros as f64 / 1e6)
}

fn digits(text: &str) -> Option<i64> {
    (!text.is_empty() && text.bytes().all(|b| b.is_ascii_digit())).then(|| text.parse().ok()).flatten()
}

fn parse_date(date: &str) -> Option<(i64, i64, i64)> {
    let (year, month, day) = if date.len() == 10 {
        (date.get(..4)?, date.get(5..7)?, date.get(8..10).filter(|_| date.as_bytes()[7] == b'-')?)
    } else {
        (date.get(..4)?, date.get(4..6)?, date.get(6..8)?)
    };
    let (year, month, day) = (digits(year)?, digits(month)?, digits(day)?);
    let leap = year % 4 == 0 && (year % 100 != 0 || year % 400 == 0);
    let days_in_month = match month {
        1 | 3 | 5 | 7 | 8 | 10 | 12 => 31,
        4 | 6 | 9 | 11 => 30,
        2 if leap => 29,
        2 => 28,
        _ => return None,
    };
    (year >= 1 && (1..=days_in_month).contains(&day)).then_some((year, month, day))
}

/// The clock part and the offset (its sign, and `Z` or its digits).
fn split_offset(time: &str) -> Option<(&str, Option<(i128, &str)>)> {
    if let Some(clock) = time.strip_suffix('Z') {
        return Some((clock, Some((1, "Z"))));
    }
    match time.find(['+', '-']) {
        Some(at) => {
            let sign = if time.as_bytes()[at] == b'+' { 1 } else { -1 };
            Some((&time[..at], Some((sign, &time[at + 1..]))))
        }
        None => Some((time, None)),
    }
}

/// `HH[:MM[:SS[.f]]]` or `HH[MM[SS[.f]]]` (a clock or an offset) in microseconds.
fn parse_clock(clock: &str) -> Option<i128> {
    let (whole, fraction) = match clock.find(['.', ',']) {
        Some(at) => (&clock[..at], Some(&clock[at + 1..])),
        None => (clock, None),
    };
    let extended = whole.contains(':');
    let (mut rest, mut parts, mut micros) = (whole, 0, 0i128);
    while !rest.is_empty() {
        if parts == 3 {
            return None;
        }
        let part = rest.get(..2)?;
        let value = digits(part)?;
        if value > [23, 59, 59][parts] {
            return None;
        }
        micros += i128::from(value) * [3_600_000_000, 60_000_000, 1_000_000][parts];
        parts += 1;
        rest = &rest[2..];
        if extended && !rest.is_empty() {
            rest = rest.strip_prefix(':').filter(|rest| !rest.is_empty())?;
        }
    }
    if parts == 0 {
        return None;
    }
    if let Some(fraction) = fraction {
        if parts != 3 || !fraction.bytes().all(|b| b.is_ascii_digit()) {
            return None;
        }
        // Cut to microseconds: the first six digits, padded with zeros.
        let mut value = 0i128;
        for position in 0..6 {
            value = value * 10 + fraction.as_bytes().get(position).map_or(0, |digit| i128::from(digit - b'0'));
        }
        micros += value;
    }
    Some(micros)
}

/// Days from 1970-01-01 to a proleptic Gregorian date (Howard Hinnant's algorithm).
fn days_from_civil(year: i64, month: i64, day: i64) -> i64 {
    let year = if month <= 2 { year - 1 } else { year };
    let era = year.div_euclid(400);
    let year_of_era = year - era * 400;
    let month_index = (month + 9) % 12;
    let day_of_year = (153 * month_index + 2) / 5 + day - 1;
    let day_of_era = year_of_era * 365 + year_of_era / 4 - year_of_era / 100 + day_of_year;
    era * 146_097 + day_of_era - 719_468
}

#[cfg(test)]
mod tests {
    use super::seconds;

    #[test]
    fn reads_the_forms_python_reads() {
        // Expected values from Python 3.11's datetime.fromisoformat(...).timestamp() in UTC.
        let cases = [
            ("2026-01-01T00:00:00.1234567Z", Some(1767225600.123456)),
            ("2026-01-01T00:00:00.12Z", Some(1767225600.12)),
            ("2026-01-01", Some(1767225600.0)),
            ("20260101", Some(1767225600.0)),
            ("2026-01-01T00", Some(1767225600.0)),
            ("2026-01-01T00:00", Some(1767225600.0)),
            ("2026-01-01 00:00:00+05:30", Some(1767205800.0)),
            ("2026-01-01T000000", Some(1767225600.0)),
            ("2026-01-01T00:00:00,5Z", Some(1767225600.5)),
            ("2026-01-01T00:00:00+0530", Some(1767205800.0)),
            ("2026-01-01T00:00:00.Z", Some(1767225600.0)),
            ("2026-01-01T00:00:00+05:30:10.5", Some(1767205789.5)),
            ("2026-01-01T00:00:00-00:00", Some(1767225600.0)),
            ("2026-01-01T00:00:00+05", Some(1767207600.0)),
            ("0001-01-01T00:00:00+05:00", Some(-62135614800.0)),
            ("2024-02-29T12:00:00Z", Some(1709208000.0)),
            ("2026-01-01T24:00:00", None),
            ("2026-01-01T00:00:00Z+", None),
            (" 2026-01-01", None),
            ("2026-01-01T00:00:00 ", None),
            ("2025-02-29", None),
            ("2026-13-01", None),
            ("", None),
            ("not a time", None),
            ("2026-01-01T", None),
            ("2026-01-01Té", None),
        ];
        for (text, expected) in cases {
            assert_eq!(seconds(text), expected, "{text:?}");
        }
    }
}
