//! Percentiles and ratios of latency samples.

/// The `p`-th percentile (0–100) of sorted values, by the nearest-rank method; `None` when there
/// are no values or `p` is out of range.
pub fn percentile(sorted: &[f64], p: f64) -> Option<f64> {
    if sorted.is_empty() || !(0.0..=100.0).contains(&p) {
        return None;
    }
    let rank = ((p / 100.0) * sorted.len() as f64).ceil() as usize;
    Some(sorted[rank.clamp(1, sorted.len()) - 1])
}

/// p50, p95 and p99 of a sample (milliseconds in this benchmark).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Percentiles {
    /// How many values.
    pub count: usize,
    /// The median.
    pub p50: f64,
    /// The 95th percentile.
    pub p95: f64,
    /// The 99th percentile.
    pub p99: f64,
}

impl Percentiles {
    /// The percentiles of `values` (NaNs ignored); `None` for an empty sample.
    pub fn of(values: &[f64]) -> Option<Percentiles> {
        let mut sorted: Vec<f64> = values.iter().copied().filter(|v| !v.is_nan()).collect();
        sorted.sort_by(f64::total_cmp);
        Some(Percentiles {
            count: sorted.len(),
            p50: percentile(&sorted, 50.0)?,
            p95: percentile(&sorted, 95.0)?,
            p99: percentile(&sorted, 99.0)?,
        })
    }
}

/// `ours / baseline`, when the baseline is above zero.
pub fn ratio(ours: f64, baseline: f64) -> Option<f64> {
    (baseline > 0.0).then(|| ours / baseline)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nearest_rank_percentiles() {
        let values: Vec<f64> = (1..=100).map(f64::from).collect();
        assert_eq!(percentile(&values, 50.0), Some(50.0));
        assert_eq!(percentile(&values, 95.0), Some(95.0));
        assert_eq!(percentile(&values, 99.0), Some(99.0));
        assert_eq!(percentile(&values, 100.0), Some(100.0));
        assert_eq!(percentile(&values, 0.0), Some(1.0));
        assert_eq!(percentile(&[], 50.0), None);
        assert_eq!(percentile(&values, 101.0), None);
        // Unsorted input with a NaN: sorted, NaN dropped.
        let p = Percentiles::of(&[3.0, f64::NAN, 1.0, 2.0]).unwrap();
        assert_eq!((p.count, p.p50, p.p95, p.p99), (3, 2.0, 3.0, 3.0));
        assert_eq!(Percentiles::of(&[]), None);
        let one = Percentiles::of(&[7.5]).unwrap();
        assert_eq!((one.p50, one.p99), (7.5, 7.5));
        assert_eq!(ratio(3.0, 1.5), Some(2.0));
        assert_eq!(ratio(3.0, 0.0), None);
    }
}
