//! Across-seed aggregation: a cell is the mean of its per-seed values with their sample
//! standard deviation (n - 1 in the denominator, as the paper's "mean ± std over three runs");
//! and bootstrap confidence intervals for the difference of two methods, paired by test task
//! (or training group) and resampled over seeds and units, so that a claimed direction is called
//! a result only when its interval excludes zero.

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

/// A two-sided percentile confidence interval.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct Interval {
    /// Lower bound.
    pub low: f64,
    /// Upper bound.
    pub high: f64,
    /// Coverage (0.95 for a 95% interval).
    pub level: f64,
    /// Bootstrap replicates drawn.
    pub replicates: usize,
    /// Units behind it (paired differences, or records of both samples).
    pub units: usize,
}

impl Interval {
    /// Whether the interval lies strictly above zero.
    pub fn above_zero(&self) -> bool {
        self.low > 0.0
    }

    /// Whether the interval lies strictly below zero.
    pub fn below_zero(&self) -> bool {
        self.high < 0.0
    }
}

/// How the bootstrap runs.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct BootstrapSettings {
    /// Replicates (default 4,000).
    pub replicates: usize,
    /// Coverage (default 0.95).
    pub level: f64,
    /// The generator's seed: the same files give the same interval.
    pub seed: u64,
}

impl Default for BootstrapSettings {
    fn default() -> Self {
        BootstrapSettings {
            replicates: 4000,
            level: 0.95,
            seed: 0x000b_0075_72a9,
        }
    }
}

/// SplitMix64: a small, fixed generator, so intervals depend on nothing but the files.
struct SplitMix(u64);

impl SplitMix {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    /// Uniform in `0..n` (`n > 0`), by rejection so that no index is favoured.
    fn below(&mut self, n: usize) -> usize {
        let n = n as u64;
        let zone = u64::MAX - u64::MAX % n;
        loop {
            let x = self.next();
            if x < zone {
                return (x % n) as usize;
            }
        }
    }
}

/// The `q` quantile of sorted `values` (linear interpolation between order statistics).
fn quantile(sorted: &[f64], q: f64) -> f64 {
    let pos = q.clamp(0.0, 1.0) * (sorted.len() - 1) as f64;
    let (lo, hi) = (pos.floor() as usize, pos.ceil() as usize);
    sorted[lo] + (sorted[hi] - sorted[lo]) * (pos - lo as f64)
}

fn percentile_interval(
    mut stats: Vec<f64>,
    settings: &BootstrapSettings,
    units: usize,
) -> Interval {
    stats.sort_by(|a, b| a.total_cmp(b));
    let tail = (1.0 - settings.level) / 2.0;
    Interval {
        low: quantile(&stats, tail),
        high: quantile(&stats, 1.0 - tail),
        level: settings.level,
        replicates: stats.len(),
        units,
    }
}

/// A paired bootstrap interval for the mean difference: `diffs[s]` holds seed `s`'s paired
/// differences (one per test task, A's value minus B's). Each replicate draws as many seeds as
/// there are, with replacement, and within each drawn seed as many of its units, with
/// replacement; its statistic is the mean over every drawn unit. `None` without any unit.
pub fn paired_bootstrap(diffs: &[Vec<f64>], settings: &BootstrapSettings) -> Option<Interval> {
    let seeds: Vec<&Vec<f64>> = diffs.iter().filter(|d| !d.is_empty()).collect();
    let units: usize = seeds.iter().map(|d| d.len()).sum();
    if units == 0 || settings.replicates == 0 {
        return None;
    }
    let mut rng = SplitMix(settings.seed);
    let stats = (0..settings.replicates)
        .map(|_| {
            let (mut sum, mut n) = (0.0, 0usize);
            for _ in 0..seeds.len() {
                let seed = seeds[rng.below(seeds.len())];
                for _ in 0..seed.len() {
                    sum += seed[rng.below(seed.len())];
                }
                n += seed.len();
            }
            sum / n as f64
        })
        .collect();
    Some(percentile_interval(stats, settings, units))
}

/// An unpaired bootstrap interval for mean(A) - mean(B) when the two methods' units differ
/// (rescue success is measured on the tasks each method rescued): per replicate, seeds are drawn
/// with replacement and, within each, A's and B's values independently. `None` when either
/// sample is empty.
pub fn unpaired_bootstrap(
    a: &[Vec<f64>],
    b: &[Vec<f64>],
    settings: &BootstrapSettings,
) -> Option<Interval> {
    let seeds: Vec<(&Vec<f64>, &Vec<f64>)> = a
        .iter()
        .zip(b)
        .filter(|(x, y)| !x.is_empty() && !y.is_empty())
        .collect();
    let units: usize = seeds.iter().map(|(x, y)| x.len() + y.len()).sum();
    if seeds.is_empty() || settings.replicates == 0 {
        return None;
    }
    let mut rng = SplitMix(settings.seed);
    let draw = |values: &Vec<f64>, rng: &mut SplitMix| -> f64 {
        (0..values.len())
            .map(|_| values[rng.below(values.len())])
            .sum::<f64>()
    };
    let stats = (0..settings.replicates)
        .map(|_| {
            let (mut sa, mut na, mut sb, mut nb) = (0.0, 0usize, 0.0, 0usize);
            for _ in 0..seeds.len() {
                let (x, y) = seeds[rng.below(seeds.len())];
                sa += draw(x, &mut rng);
                na += x.len();
                sb += draw(y, &mut rng);
                nb += y.len();
            }
            sa / na as f64 - sb / nb as f64
        })
        .collect();
    Some(percentile_interval(stats, settings, units))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The exact percentile interval of the one-seed bootstrap, by enumerating every resample
    /// (n^n equally likely draws).
    fn exact_interval(values: &[f64], level: f64) -> (f64, f64) {
        let n = values.len();
        let total = n.pow(n as u32);
        let mut means: Vec<f64> = (0..total)
            .map(|mut code| {
                let mut sum = 0.0;
                for _ in 0..n {
                    sum += values[code % n];
                    code /= n;
                }
                sum / n as f64
            })
            .collect();
        means.sort_by(|a, b| a.total_cmp(b));
        let tail = (1.0 - level) / 2.0;
        (quantile(&means, tail), quantile(&means, 1.0 - tail))
    }

    #[test]
    fn the_paired_bootstrap_matches_the_exact_resampling_distribution() {
        let diffs = vec![-1.0 / 3.0, 0.0, 1.0 / 3.0, 2.0 / 3.0, 1.0, 0.0];
        let (lo, hi) = exact_interval(&diffs, 0.9);
        let settings = BootstrapSettings {
            replicates: 200_000,
            level: 0.9,
            seed: 7,
        };
        let ci = paired_bootstrap(std::slice::from_ref(&diffs), &settings).unwrap();
        // One resampled mean moves in steps of 1/18; the bootstrap lands within one step.
        assert!((ci.low - lo).abs() <= 1.0 / 18.0 + 1e-9, "{ci:?} vs {lo}");
        assert!((ci.high - hi).abs() <= 1.0 / 18.0 + 1e-9, "{ci:?} vs {hi}");
        assert_eq!(ci.units, 6);
        assert!(ci.low < ci.high);
    }

    #[test]
    fn bootstrap_intervals_collapse_on_constant_differences_and_need_data() {
        let s = BootstrapSettings::default();
        let ci = paired_bootstrap(&[vec![0.25; 10], vec![0.25; 4]], &s).unwrap();
        assert!((ci.low - 0.25).abs() < 1e-12 && (ci.high - 0.25).abs() < 1e-12);
        assert!(ci.above_zero() && !ci.below_zero());
        assert_eq!(paired_bootstrap(&[vec![], vec![]], &s), None);
        let ci = unpaired_bootstrap(&[vec![1.0; 5]], &[vec![0.0; 3]], &s).unwrap();
        assert_eq!((ci.low, ci.high), (1.0, 1.0));
        assert_eq!(unpaired_bootstrap(&[vec![1.0]], &[vec![]], &s), None);
        // Same inputs, same interval.
        let d = vec![vec![0.1, -0.2, 0.3, 0.0], vec![0.5, 0.1]];
        assert_eq!(paired_bootstrap(&d, &s), paired_bootstrap(&d, &s));
    }

    #[test]
    fn a_noisy_difference_straddles_zero_and_a_clear_one_does_not() {
        let s = BootstrapSettings::default();
        let noisy: Vec<f64> = (0..30)
            .map(|i| if i % 2 == 0 { 0.4 } else { -0.3 })
            .collect();
        let ci = paired_bootstrap(&[noisy], &s).unwrap();
        assert!(ci.low < 0.0 && ci.high > 0.0, "{ci:?}");
        let clear: Vec<f64> = (0..30)
            .map(|i| if i % 3 == 0 { 0.0 } else { 0.34 })
            .collect();
        let ci = paired_bootstrap(&[clear], &s).unwrap();
        assert!(ci.above_zero(), "{ci:?}");
    }

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
