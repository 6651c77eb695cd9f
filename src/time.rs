//! Conversions between the time types of the crates agentrun builds on: `chrono` (the RunState's
//! Python-compatible timestamps, the controller's clock) and `jiff` (Kubernetes' `metav1.Time`).

use chrono::{DateTime, Utc};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use k8s_openapi::jiff::Timestamp;

/// A `metav1.Time` as a chrono time (the Unix epoch if it is out of chrono's range).
pub fn from_k8s(time: &Time) -> DateTime<Utc> {
    from_jiff(&time.0)
}

/// A `metav1.Time` as a chrono time, `None` when it is out of chrono's range.
pub fn try_from_k8s(time: &Time) -> Option<DateTime<Utc>> {
    let ts = &time.0;
    DateTime::from_timestamp(
        ts.as_second(),
        u32::try_from(ts.subsec_nanosecond()).unwrap_or(0),
    )
}

/// A jiff timestamp as a chrono time (the Unix epoch if it is out of chrono's range).
pub fn from_jiff(ts: &Timestamp) -> DateTime<Utc> {
    try_from_k8s(&Time(*ts)).unwrap_or_default()
}

/// A chrono time as a `metav1.Time` (the Unix epoch if it is out of jiff's range).
pub fn to_k8s(time: DateTime<Utc>) -> Time {
    Time(
        Timestamp::new(time.timestamp(), time.timestamp_subsec_nanos() as i32)
            .unwrap_or(Timestamp::UNIX_EPOCH),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn times_round_trip_between_chrono_and_kubernetes() {
        let t = DateTime::from_timestamp(1_700_000_000, 123_456_789).unwrap();
        assert_eq!(from_k8s(&to_k8s(t)), t);
        assert_eq!(to_k8s(t).0.to_string(), "2023-11-14T22:13:20.123456789Z");
    }
}
