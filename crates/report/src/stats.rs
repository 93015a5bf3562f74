//! Across-seed aggregation: a cell is the mean of its per-seed values with their sample
//! standard deviation (n - 1 in the denominator, as the paper's "mean ± std over three runs").

use serde::{Deserialize, Serialize};

/// The mean of a cell's per-seed values and their spread.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct Stat {
    /// The mean.
    pub mean: f64,
    /// The sample standard deviation (n - 1); `None` with a single value.
    pub std: Option<f64>,
    /// Values aggregated (seeds that have the cell).
    pub n: usize,
}

impl Stat {
    /// Aggregate `values` (`None` when there are none).
    pub fn of(values: &[f64]) -> Option<Stat> {
        let n = values.len();
        if n == 0 {
            return None;
        }
        let mean = values.iter().sum::<f64>() / n as f64;
        let std = (n > 1).then(|| {
            (values.iter().map(|v| (v - mean).powi(2)).sum::<f64>() / (n - 1) as f64).sqrt()
        });
        Some(Stat { mean, std, n })
    }

    /// Aggregate the present values of `values`.
    pub fn of_present(values: impl IntoIterator<Item = Option<f64>>) -> Option<Stat> {
        let v: Vec<f64> = values.into_iter().flatten().collect();
        Stat::of(&v)
    }
}

/// The mean of `values` (0 for none).
pub(crate) fn mean(values: impl IntoIterator<Item = f64>) -> Option<f64> {
    let v: Vec<f64> = values.into_iter().collect();
    (!v.is_empty()).then(|| v.iter().sum::<f64>() / v.len() as f64)
}

/// How a cell is written: `scale` multiplies (100 for percentages), `seeds` is the run's seed
/// count (a cell aggregated over fewer seeds says how many).
pub(crate) fn fmt_stat(stat: Option<&Stat>, scale: f64, decimals: usize, seeds: usize) -> String {
    let Some(s) = stat else {
        return "not run".into();
    };
    let mut out = format!("{:.*}", decimals, s.mean * scale);
    if let Some(sd) = s.std {
        out.push_str(&format!(" ± {:.*}", decimals, sd * scale));
    }
    if s.n < seeds {
        out.push_str(&format!(" ({} of {seeds} seeds)", s.n));
    }
    out
}

/// A percentage cell.
pub(crate) fn pct(stat: Option<&Stat>, seeds: usize) -> String {
    fmt_stat(stat, 100.0, 2, seeds)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sample_std_uses_n_minus_one() {
        let s = Stat::of(&[0.5, 0.6, 0.7]).unwrap();
        assert!((s.mean - 0.6).abs() < 1e-12);
        assert!((s.std.unwrap() - 0.1).abs() < 1e-12);
        assert_eq!(s.n, 3);
        assert_eq!(Stat::of(&[0.25]).unwrap().std, None);
        assert_eq!(Stat::of(&[]), None);
        assert_eq!(pct(Stat::of(&[0.5, 0.6, 0.7]).as_ref(), 3), "60.00 ± 10.00");
        assert_eq!(pct(Stat::of(&[0.5]).as_ref(), 3), "50.00 (1 of 3 seeds)");
        assert_eq!(pct(None, 1), "not run");
    }
}
