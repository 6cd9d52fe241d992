//! Times in query strings: a UTC date (`2026-11-01`) or an RFC 3339 date-time, with any
//! offset. A time without an offset is read as UTC, as it always was here.

use super::error::ApiError;

/// Unix milliseconds of `text`; times before 1970 count as 1970 (the ledger starts there).
pub(super) fn parse_time(field: &'static str, text: &str) -> Result<u64, ApiError> {
    parse(text).map(|ms| u64::try_from(ms).unwrap_or(0)).ok_or_else(|| {
        ApiError::bad_request(
            "invalid_query",
            format!("{field}: {text:?} is not a date like 2026-11-01 or an RFC 3339 time"),
        )
    })
}

fn parse(text: &str) -> Option<i64> {
    let b = text.as_bytes();
    let (date, rest) = (b.get(..10)?, &b[10..]);
    if date[4] != b'-' || date[7] != b'-' {
        return None;
    }
    let (year, month, day) = (digits(&date[..4])?, digits(&date[5..7])?, digits(&date[8..10])?);
    if !(1..=12).contains(&month) || day == 0 || day > days_in_month(year, month) {
        return None;
    }
    let midnight = days_from_civil(year, month, day) * 86_400_000;
    if rest.is_empty() {
        return Some(midnight);
    }
    if !matches!(rest[0], b'T' | b't' | b' ') || rest.len() < 9 || rest[3] != b':' || rest[6] != b':' {
        return None;
    }
    let (hour, minute, second) = (digits(&rest[1..3])?, digits(&rest[4..6])?, digits(&rest[7..9])?);
    // 60 is a leap second, which Unix time folds into the next one.
    if hour > 23 || minute > 59 || second > 60 {
        return None;
    }
    let mut tail = &rest[9..];
    let mut millis = 0;
    if let Some(fraction) = tail.strip_prefix(b".") {
        let len = fraction.iter().take_while(|c| c.is_ascii_digit()).count();
        if len == 0 {
            return None;
        }
        let mut scaled: Vec<u8> = fraction[..len.min(3)].to_vec();
        scaled.resize(3, b'0');
        millis = digits(&scaled)?;
        tail = &fraction[len..];
    }
    let offset_minutes = match tail {
        [] | [b'Z' | b'z'] => 0,
        [sign @ (b'+' | b'-'), h1, h2, b':', m1, m2] => {
            let (h, m) = (digits(&[*h1, *h2])?, digits(&[*m1, *m2])?);
            if h > 23 || m > 59 {
                return None;
            }
            if *sign == b'+' { h * 60 + m } else { -(h * 60 + m) }
        }
        _ => return None,
    };
    let local = ((hour * 60 + minute) * 60 + second) * 1000 + millis;
    Some(midnight + local - offset_minutes * 60_000)
}

fn digits(bytes: &[u8]) -> Option<i64> {
    bytes.iter().try_fold(0i64, |n, &c| c.is_ascii_digit().then(|| n * 10 + i64::from(c - b'0')))
}

fn days_in_month(year: i64, month: i64) -> i64 {
    let leap = year % 4 == 0 && (year % 100 != 0 || year % 400 == 0);
    match month {
        2 if leap => 29,
        2 => 28,
        4 | 6 | 9 | 11 => 30,
        _ => 31,
    }
}

/// Days from 1970-01-01 to a proleptic Gregorian date (the civil-from-days inverse).
fn days_from_civil(year: i64, month: i64, day: i64) -> i64 {
    let y = if month <= 2 { year - 1 } else { year };
    let era = y.div_euclid(400);
    let year_of_era = y - era * 400;
    let shifted_month = if month > 2 { month - 3 } else { month + 9 };
    let day_of_year = (153 * shifted_month + 2) / 5 + day - 1;
    let day_of_era = year_of_era * 365 + year_of_era / 4 - year_of_era / 100 + day_of_year;
    era * 146_097 + day_of_era - 719_468
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ms(text: &str) -> Option<i64> {
        parse(text)
    }

    #[test]
    fn dates_and_times_agree_with_known_instants() {
        assert_eq!(ms("1970-01-01"), Some(0));
        assert_eq!(ms("2026-11-01"), Some(1_793_491_200_000));
        assert_eq!(ms("2026-11-01T00:00:00Z"), Some(1_793_491_200_000));
        assert_eq!(ms("2026-11-01T00:00:00"), Some(1_793_491_200_000));
        assert_eq!(ms("2026-11-01 00:00:00z"), Some(1_793_491_200_000));
        assert_eq!(ms("2026-11-01T02:00:00+02:00"), Some(1_793_491_200_000));
        assert_eq!(ms("2026-10-31T19:30:00-04:30"), Some(1_793_491_200_000));
        assert_eq!(ms("2000-02-29T12:34:56.7891Z"), Some(951_827_696_789));
        assert_eq!(ms("1969-12-31T23:59:59Z"), Some(-1000));
    }

    #[test]
    fn impossible_dates_and_malformed_times_are_refused() {
        for bad in [
            "",
            "2026-11",
            "2026/11/01",
            "2026-13-01",
            "2026-02-29",
            "1900-02-29",
            "2026-04-31",
            "2026-11-01T",
            "2026-11-01T24:00:00Z",
            "2026-11-01T00:00:00.Z",
            "2026-11-01T00:00:00+2:00",
            "2026-11-01T00:00:00+24:00",
            "2026-11-01T00:00:00ZZ",
            "+026-11-01",
            "2026-11-01x",
        ] {
            assert_eq!(ms(bad), None, "{bad:?}");
        }
    }

    #[test]
    fn times_before_1970_clamp_to_zero() {
        assert_eq!(parse_time("from", "0001-01-01").ok(), Some(0));
        assert!(parse_time("from", "nope").is_err());
    }
}
