//! Timestamps as Python's `datetime.isoformat()` writes them (see the [module docs](super)).

use chrono::{DateTime, NaiveDateTime, Timelike, Utc};

pub(super) fn truncate_to_micros(ts: DateTime<Utc>) -> DateTime<Utc> {
    let nanos = ts.nanosecond();
    // Leap-second nanos (>= 1e9) are folded into the last microsecond of the second.
    let micros_nanos = (nanos.min(999_999_999) / 1_000) * 1_000;
    ts.with_nanosecond(micros_nanos).unwrap_or(ts)
}

/// `datetime.isoformat()` of an aware UTC datetime.
pub fn format_timestamp(ts: &DateTime<Utc>) -> String {
    let ts = truncate_to_micros(*ts);
    let micros = ts.nanosecond() / 1_000;
    if micros == 0 {
        ts.format("%Y-%m-%dT%H:%M:%S+00:00").to_string()
    } else {
        format!("{}.{micros:06}+00:00", ts.format("%Y-%m-%dT%H:%M:%S"))
    }
}

/// Parses a timestamp as written by Python's `datetime.isoformat()`: any UTC offset (converted to
/// UTC), `Z`, `T` or a space between date and time, 0 to 9 fraction digits (truncated to
/// microseconds), or no offset at all (a naive timestamp from an older payload, taken as UTC).
/// The error says what is wrong; the caller adds the field path.
pub(super) fn parse_timestamp(t: &str) -> Result<DateTime<Utc>, String> {
    let parsed = DateTime::parse_from_rfc3339(t)
        .map(|dt| dt.with_timezone(&Utc))
        .or_else(|_| {
            // Offsets without a colon (`+0530`) or without seconds in the time.
            [
                "%Y-%m-%dT%H:%M:%S%.f%z",
                "%Y-%m-%d %H:%M:%S%.f%z",
                "%Y-%m-%dT%H:%M%z",
            ]
            .iter()
            .find_map(|fmt| DateTime::parse_from_str(t, fmt).ok())
            .map(|dt| dt.with_timezone(&Utc))
            .ok_or(())
        })
        .or_else(|_| {
            [
                "%Y-%m-%dT%H:%M:%S%.f",
                "%Y-%m-%d %H:%M:%S%.f",
                "%Y-%m-%dT%H:%M",
                "%Y-%m-%d %H:%M",
            ]
            .iter()
            .find_map(|fmt| NaiveDateTime::parse_from_str(t, fmt).ok())
            .map(|naive| naive.and_utc())
            .ok_or(())
        })
        .map_err(|()| {
            "expected an ISO 8601 date-time such as 2026-12-02T19:30:25.123456+00:00".to_owned()
        })?;
    if parsed.nanosecond() >= 1_000_000_000 {
        return Err("leap seconds are not supported".to_owned());
    }
    let year = chrono::Datelike::year(&parsed);
    if !(1..=9999).contains(&year) {
        return Err(format!("year {year} is outside 1..=9999"));
    }
    Ok(truncate_to_micros(parsed))
}
