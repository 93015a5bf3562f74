//! The paper's GRPO objective (DESIGN section 4; paper Eqs. 6 and 13-16).
//!
//! * Group advantage (Eq. 6): `a_j = (R_j - mean R) / max(std_pop R, eps)`, `eps = 1e-6`.
//! * Ratio (Eq. 13): `rho = exp(logp_new - logp_old)` per policy token in its own generating
//!   context.
//! * Clipped token objective (Eq. 7/14): `min(rho A, clip(rho, 1 - eta_minus, 1 + eta_plus) A)`.
//! * Detached correction (Eq. 16): `w = clip(exp(logp_old - logp_rollout), 0, 2)`.
//! * Aggregation (Eq. 15): mean over the valid policy tokens of a task, then equally over the
//!   tasks of the batch; a task with no tokens contributes zero (but still counts in `|B|`).
//!
//! * The `h0` rescue objective ([`guide_loss`], after Guide, arXiv 2506.13923): tokens of a
//!   rescued trajectory re-scored under H0's context, `r = pi_theta(y | c_H0) / q(y | c_H)`,
//!   shaped `r / (r + gamma)` with `gamma` the batch's 90th percentile of `r` ([`quantile`]), no
//!   clipping, aggregated as Eq. 15.
//!
//! The loss returned is `-J` (we minimise). Because the per-token coefficient `1 / (|B| N_x)` is
//! known before any forward pass, the loss is a plain sum over tokens and gradient accumulation
//! over micro-batches is exact.

use candle_core::{DType, Tensor};

/// Hyper-parameters of the objective.
#[derive(Debug, Clone, Copy, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct GrpoConfig {
    /// `eta_-`: the ratio is clipped below at `1 - clip_low` (paper: 0.20).
    pub clip_low: f64,
    /// `eta_+`: the ratio is clipped above at `1 + clip_high` (paper: 0.28).
    pub clip_high: f64,
    /// Upper bound of the detached rollout-correction weight (paper: 2).
    pub weight_cap: f64,
    /// Epsilon of the advantage normalisation (paper: 1e-6).
    pub adv_eps: f64,
}

impl Default for GrpoConfig {
    fn default() -> Self {
        Self {
            clip_low: 0.20,
            clip_high: 0.28,
            weight_cap: 2.0,
            adv_eps: 1e-6,
        }
    }
}

/// Group-relative advantages (Eq. 6), computed in f64: population standard deviation, and
/// `max(std, eps)` in the denominator.
pub fn group_advantages(rewards: &[f32], eps: f64) -> Vec<f32> {
    if rewards.is_empty() {
        return Vec::new();
    }
    let n = rewards.len() as f64;
    let mean = rewards.iter().map(|&r| r as f64).sum::<f64>() / n;
    let var = rewards
        .iter()
        .map(|&r| (r as f64 - mean).powi(2))
        .sum::<f64>()
        / n;
    let denom = var.sqrt().max(eps);
    rewards
        .iter()
        .map(|&r| ((r as f64 - mean) / denom) as f32)
        .collect()
}

/// Per-token inputs of the loss for one micro-batch, all `[T]` f32 on the training device and
/// without gradient.
#[derive(Debug, Clone)]
pub struct TokenTerms {
    /// `log pi_old(y | c_H)`.
    pub logp_old: Tensor,
    /// `log q(y | c_H)`, recorded by the rollout backend.
    pub logp_rollout: Tensor,
    /// The trajectory's advantage `A_{x,j}`, repeated for each of its tokens.
    pub advantage: Tensor,
    /// `1 / (|B| N_x)`: the token's share in Eq. 15.
    pub coef: Tensor,
}

/// Sums over a micro-batch's tokens, for metrics; combine micro-batches with [`LossStats::merge`].
#[derive(Debug, Clone, Copy, PartialEq, Default, serde::Serialize, serde::Deserialize)]
pub struct LossStats {
    /// Tokens seen.
    pub tokens: usize,
    /// Tokens whose lower clip bound was active (`A < 0` and `rho < 1 - eta_-`).
    pub clipped_low: usize,
    /// Tokens whose upper clip bound was active (`A > 0` and `rho > 1 + eta_+`).
    pub clipped_high: usize,
    /// Sum, min and max of `rho`.
    pub ratio_sum: f64,
    /// Smallest `rho`.
    pub ratio_min: f64,
    /// Largest `rho`.
    pub ratio_max: f64,
    /// Sum, min and max of `w`.
    pub weight_sum: f64,
    /// Smallest `w`.
    pub weight_min: f64,
    /// Largest `w`.
    pub weight_max: f64,
    /// Tokens whose `pi_old / q` exceeded the cap (their `w` was clipped).
    #[serde(default)]
    pub weight_clipped: usize,
}

impl LossStats {
    /// Adds another micro-batch's sums.
    pub fn merge(&mut self, o: &LossStats) {
        if o.tokens == 0 {
            return;
        }
        if self.tokens == 0 {
            *self = *o;
            return;
        }
        self.tokens += o.tokens;
        self.clipped_low += o.clipped_low;
        self.clipped_high += o.clipped_high;
        self.ratio_sum += o.ratio_sum;
        self.ratio_min = self.ratio_min.min(o.ratio_min);
        self.ratio_max = self.ratio_max.max(o.ratio_max);
        self.weight_sum += o.weight_sum;
        self.weight_min = self.weight_min.min(o.weight_min);
        self.weight_max = self.weight_max.max(o.weight_max);
        self.weight_clipped += o.weight_clipped;
    }
}

/// The micro-batch's share of `-J` (Eq. 15) as a differentiable scalar, and its statistics.
///
/// `logp_new` is `[T]` (any float dtype; computed in f32) and carries the gradient. Inside the
/// clip region the token term is `w A rho`; where the active bound clips it, the term is the
/// constant `w A clip(rho)` and receives no gradient, exactly as `min(rho A, clip(rho) A)` does.
/// `w` is computed from `logp_old` and `logp_rollout` only, so no gradient can pass through it.
pub fn grpo_loss(
    logp_new: &Tensor,
    terms: &TokenTerms,
    cfg: &GrpoConfig,
) -> candle_core::Result<(Tensor, LossStats)> {
    let t = logp_new.dims1()?;
    let f32_ = |x: &Tensor| -> candle_core::Result<Tensor> { x.detach().to_dtype(DType::F32) };
    let logp_old = f32_(&terms.logp_old)?;
    let logp_rollout = f32_(&terms.logp_rollout)?;
    let adv = f32_(&terms.advantage)?;
    let coef = f32_(&terms.coef)?;
    for (name, x) in [
        ("logp_old", &logp_old),
        ("logp_rollout", &logp_rollout),
        ("advantage", &adv),
        ("coef", &coef),
    ] {
        if x.dims1()? != t {
            candle_core::bail!("grpo_loss: {name} has {} tokens, logp_new {t}", x.dims1()?);
        }
    }
    let logp_new = logp_new.to_dtype(DType::F32)?;
    let ratio = (&logp_new - &logp_old)?.exp()?;

    // Host-side decisions and statistics (T is a micro-batch's policy tokens: small).
    let r: Vec<f32> = ratio.detach().to_vec1()?;
    let a: Vec<f32> = adv.to_vec1()?;
    let lo: Vec<f32> = logp_old.to_vec1()?;
    let lq: Vec<f32> = logp_rollout.to_vec1()?;
    let (lo_b, hi_b) = (1.0 - cfg.clip_low, 1.0 + cfg.clip_high);
    let mut stats = LossStats {
        tokens: t,
        ratio_min: f64::INFINITY,
        ratio_max: f64::NEG_INFINITY,
        weight_min: f64::INFINITY,
        weight_max: f64::NEG_INFINITY,
        ..LossStats::default()
    };
    let mut free = Vec::with_capacity(t); // 1 where rho keeps its gradient
    let mut clipped_const = Vec::with_capacity(t); // clip(rho) A where a bound is active, else 0
    let mut w = Vec::with_capacity(t);
    for k in 0..t {
        let rho = r[k] as f64;
        let ak = a[k] as f64;
        let low = ak < 0.0 && rho < lo_b;
        let high = ak > 0.0 && rho > hi_b;
        stats.clipped_low += low as usize;
        stats.clipped_high += high as usize;
        if low || high {
            free.push(0f32);
            clipped_const.push((rho.clamp(lo_b, hi_b) * ak) as f32);
        } else {
            free.push(1f32);
            clipped_const.push(0f32);
        }
        let wk = importance_weight(lo[k] as f64, lq[k] as f64, cfg.weight_cap);
        stats.weight_clipped += ((lo[k] as f64 - lq[k] as f64).exp() > cfg.weight_cap) as usize;
        w.push(wk as f32);
        stats.ratio_sum += rho;
        stats.ratio_min = stats.ratio_min.min(rho);
        stats.ratio_max = stats.ratio_max.max(rho);
        stats.weight_sum += wk;
        stats.weight_min = stats.weight_min.min(wk);
        stats.weight_max = stats.weight_max.max(wk);
    }
    if t == 0 {
        stats = LossStats::default();
    }
    let dev = logp_new.device();
    let free = Tensor::from_vec(free, t, dev)?;
    let clipped_const = Tensor::from_vec(clipped_const, t, dev)?;
    let w = Tensor::from_vec(w, t, dev)?;
    // term = free * rho * A + clipped_const, per token; J_part = sum coef w term.
    let term = ((ratio * (&free * &adv)?)? + clipped_const)?;
    let scale = (&coef * &w)?;
    let loss = (term * scale)?.sum_all()?.neg()?;
    Ok((loss, stats))
}

/// Per-token inputs of the Guide-shaped loss of the `h0` rescue objective, `[T]` f32 without
/// gradient.
#[derive(Debug, Clone)]
pub struct GuideTerms {
    /// `log pi_old(y | c_H)`: the sampling policy under the sibling's (generating) context, i.e.
    /// the recorded rollout log-prob `q` of the token.
    pub logp_behaviour: Tensor,
    /// The trajectory's advantage within its rescue group (Eq. 6).
    pub advantage: Tensor,
    /// `1 / (|B| N_x)`: the token's share in Eq. 15.
    pub coef: Tensor,
}

/// Sums over a micro-batch's Guide tokens, for metrics.
#[derive(Debug, Clone, Copy, PartialEq, Default, serde::Serialize, serde::Deserialize)]
pub struct GuideStats {
    /// Tokens scored under H0's context.
    pub tokens: usize,
    /// Sum of `r = pi_theta(y | c_H0) / pi_old(y | c_H)`.
    pub ratio_sum: f64,
}

impl GuideStats {
    /// Adds another micro-batch's sums.
    pub fn merge(&mut self, o: &GuideStats) {
        self.tokens += o.tokens;
        self.ratio_sum += o.ratio_sum;
    }
}

/// The 90th percentile of the H0-context ratios: Guide's `gamma`.
pub const GUIDE_PERCENTILE: f64 = 0.9;

/// The `p`-quantile of `values` with linear interpolation between order statistics (numpy's and
/// torch's default): `x[floor(h)] + (h - floor(h)) (x[floor(h) + 1] - x[floor(h)])` at
/// `h = (n - 1) p` on the sorted values. `None` for no values.
pub fn quantile(values: &[f64], p: f64) -> Option<f64> {
    if values.is_empty() {
        return None;
    }
    let mut v = values.to_vec();
    v.sort_by(f64::total_cmp);
    let h = (v.len() - 1) as f64 * p.clamp(0.0, 1.0);
    let lo = h.floor() as usize;
    let hi = (lo + 1).min(v.len() - 1);
    Some(v[lo] + (h - lo as f64) * (v[hi] - v[lo]))
}

/// The micro-batch's share of `-J` for tokens re-scored under H0's context (the `h0` rescue
/// objective, after Guide, arXiv 2506.13923): per token `coef * A * r / (r + gamma)` with
/// `r = exp(logp_new - logp_behaviour)`, where `logp_new` is `log pi_theta(y | c_H0)`.
///
/// `gamma` is a constant (the batch's 90th percentile of `r` under the weights at the start of
/// the update, detached): the shaping `r / (r + gamma)` is bounded by 1, so there is no clipping,
/// and its gradient `gamma / (r + gamma)^2 * dr` shrinks for tokens the current policy already
/// prefers under H0 far more than the sibling-context sampler did. No Eq. 16 weight: the ratio's
/// denominator is the sampler's own probability.
pub fn guide_loss(
    logp_new: &Tensor,
    terms: &GuideTerms,
    gamma: f64,
) -> candle_core::Result<(Tensor, GuideStats)> {
    let t = logp_new.dims1()?;
    let f32_ = |x: &Tensor| -> candle_core::Result<Tensor> { x.detach().to_dtype(DType::F32) };
    let behaviour = f32_(&terms.logp_behaviour)?;
    let adv = f32_(&terms.advantage)?;
    let coef = f32_(&terms.coef)?;
    for (name, x) in [
        ("logp_behaviour", &behaviour),
        ("advantage", &adv),
        ("coef", &coef),
    ] {
        if x.dims1()? != t {
            candle_core::bail!("guide_loss: {name} has {} tokens, logp_new {t}", x.dims1()?);
        }
    }
    if !(gamma > 0.0 && gamma.is_finite()) {
        candle_core::bail!("guide_loss: gamma must be positive and finite, got {gamma}");
    }
    let ratio = (logp_new.to_dtype(DType::F32)? - &behaviour)?.exp()?;
    let stats = GuideStats {
        tokens: t,
        ratio_sum: ratio
            .detach()
            .to_dtype(DType::F64)?
            .sum_all()?
            .to_scalar::<f64>()?,
    };
    let shaped = (&ratio / (&ratio + gamma)?)?;
    let loss = ((shaped * adv)? * coef)?.sum_all()?.neg()?;
    Ok((loss, stats))
}

/// Eq. 16: `clip(pi_old / q, 0, cap)` from log-probs.
pub fn importance_weight(logp_old: f64, logp_rollout: f64, cap: f64) -> f64 {
    (logp_old - logp_rollout).exp().clamp(0.0, cap)
}

#[cfg(test)]
mod tests {
    use super::*;
    use candle_core::{Device, Var};
    use proptest::prelude::*;

    /// One trajectory for the reference: reward and per-token (logp_new, logp_old, logp_rollout).
    #[derive(Debug, Clone)]
    struct RefTraj {
        reward: f32,
        tokens: Vec<(f64, f64, f64)>,
    }

    /// Plain f64 transcription of Eqs. 6, 13-16 (returns J, not -J).
    fn reference_objective(groups: &[Vec<RefTraj>], cfg: &GrpoConfig) -> f64 {
        let b = groups.len() as f64;
        let mut total = 0.0;
        for g in groups {
            let rewards: Vec<f64> = g.iter().map(|t| t.reward as f64).collect();
            let n = rewards.len() as f64;
            let mean = rewards.iter().sum::<f64>() / n;
            let std = (rewards.iter().map(|r| (r - mean) * (r - mean)).sum::<f64>() / n).sqrt();
            let nx: usize = g.iter().map(|t| t.tokens.len()).sum();
            if nx == 0 {
                continue;
            }
            let mut task_sum = 0.0;
            for (traj, r) in g.iter().zip(&rewards) {
                let a = (r - mean) / std.max(cfg.adv_eps);
                for &(new, old, q) in &traj.tokens {
                    let rho = (new - old).exp();
                    let clipped = rho.clamp(1.0 - cfg.clip_low, 1.0 + cfg.clip_high);
                    let l = (rho * a).min(clipped * a);
                    let w = ((old - q).exp()).clamp(0.0, cfg.weight_cap);
                    task_sum += w * l;
                }
            }
            total += task_sum / nx as f64;
        }
        total / b
    }

    /// Flattens groups into the loss's token tensors (the way the trainer does).
    fn flatten(groups: &[Vec<RefTraj>], cfg: &GrpoConfig) -> (Var, TokenTerms) {
        let b = groups.len() as f64;
        let (mut new, mut old, mut q, mut adv, mut coef) = (vec![], vec![], vec![], vec![], vec![]);
        for g in groups {
            let rewards: Vec<f32> = g.iter().map(|t| t.reward).collect();
            let a = group_advantages(&rewards, cfg.adv_eps);
            let nx: usize = g.iter().map(|t| t.tokens.len()).sum();
            for (traj, &aj) in g.iter().zip(&a) {
                for &(n, o, qq) in &traj.tokens {
                    new.push(n as f32);
                    old.push(o as f32);
                    q.push(qq as f32);
                    adv.push(aj);
                    coef.push((1.0 / (b * nx as f64)) as f32);
                }
            }
        }
        let dev = Device::Cpu;
        let t = new.len();
        let mk = |v: Vec<f32>| Tensor::from_vec(v, t, &dev).unwrap();
        (
            Var::from_tensor(&mk(new)).unwrap(),
            TokenTerms {
                logp_old: mk(old),
                logp_rollout: mk(q),
                advantage: mk(adv),
                coef: mk(coef),
            },
        )
    }

    fn traj_strategy() -> impl Strategy<Value = RefTraj> {
        (
            prop_oneof![Just(0f32), Just(1f32)],
            prop::collection::vec((-3.0f64..-0.01, -0.5f64..0.5, -0.5f64..0.5), 0..6),
        )
            .prop_map(|(reward, toks)| RefTraj {
                reward,
                // new = old + delta; rollout = old + eps: ratios and weights around 1, both sides
                // of the clip bounds.
                tokens: toks
                    .into_iter()
                    .map(|(old, d, e)| {
                        (
                            (old + d) as f32 as f64,
                            old as f32 as f64,
                            (old + e) as f32 as f64,
                        )
                    })
                    .collect(),
            })
    }

    fn groups_strategy() -> impl Strategy<Value = Vec<Vec<RefTraj>>> {
        prop::collection::vec(prop::collection::vec(traj_strategy(), 1..6), 1..4)
    }

    proptest! {
        #[test]
        fn advantages_are_mean_zero_and_shift_invariant(
            rewards in prop::collection::vec(-5.0f32..5.0, 1..10),
            shift in -3.0f32..3.0,
        ) {
            let a = group_advantages(&rewards, 1e-6);
            let mean: f64 = a.iter().map(|&x| x as f64).sum::<f64>() / a.len() as f64;
            prop_assert!(mean.abs() < 1e-4, "mean {}", mean);
            let shifted: Vec<f32> = rewards.iter().map(|r| r + shift).collect();
            let b = group_advantages(&shifted, 1e-6);
            for (x, y) in a.iter().zip(&b) {
                prop_assert!((x - y).abs() < 1e-3 * (1.0 + x.abs()), "{} vs {}", x, y);
            }
        }

        #[test]
        fn loss_equals_f64_reference(groups in groups_strategy()) {
            let cfg = GrpoConfig::default();
            let (new, terms) = flatten(&groups, &cfg);
            let (loss, stats) = grpo_loss(new.as_tensor(), &terms, &cfg).unwrap();
            let got = loss.to_scalar::<f32>().unwrap() as f64;
            let want = -reference_objective(&groups, &cfg);
            prop_assert!((got - want).abs() < 1e-5 * (1.0 + want.abs()), "{} vs {}", got, want);
            prop_assert_eq!(stats.tokens, new.as_tensor().dims1().unwrap());
        }

        #[test]
        fn gradient_matches_reference_and_vanishes_where_clipped(groups in groups_strategy()) {
            let cfg = GrpoConfig::default();
            let (new, terms) = flatten(&groups, &cfg);
            let (loss, _) = grpo_loss(new.as_tensor(), &terms, &cfg).unwrap();
            let grads = loss.backward().unwrap();
            let t = new.as_tensor().dims1().unwrap();
            if t == 0 {
                return Ok(());
            }
            let g: Vec<f32> = grads.get(new.as_tensor()).unwrap().to_vec1().unwrap();
            let lnew: Vec<f32> = new.as_tensor().to_vec1().unwrap();
            let lold: Vec<f32> = terms.logp_old.to_vec1().unwrap();
            let lq: Vec<f32> = terms.logp_rollout.to_vec1().unwrap();
            let a: Vec<f32> = terms.advantage.to_vec1().unwrap();
            let c: Vec<f32> = terms.coef.to_vec1().unwrap();
            for k in 0..t {
                let rho = ((lnew[k] - lold[k]) as f64).exp();
                let ak = a[k] as f64;
                let clipped = (ak < 0.0 && rho < 1.0 - cfg.clip_low) || (ak > 0.0 && rho > 1.0 + cfg.clip_high);
                let w = importance_weight(lold[k] as f64, lq[k] as f64, cfg.weight_cap);
                // d(-J)/d logp_new = -coef w A rho inside the region, 0 where clipped.
                let want = if clipped { 0.0 } else { -(c[k] as f64) * w * ak * rho };
                prop_assert!((g[k] as f64 - want).abs() < 1e-5 * (1.0 + want.abs()), "token {}: {} vs {}", k, g[k], want);
                if clipped {
                    prop_assert_eq!(g[k], 0.0);
                }
            }
        }
    }

    #[test]
    fn quantile_interpolates_like_numpy() {
        // np.quantile([1, 2, 3, 4, 10], 0.9) = 4 + 0.6 * (10 - 4) = 7.6
        assert!((quantile(&[10.0, 1.0, 3.0, 2.0, 4.0], 0.9).unwrap() - 7.6).abs() < 1e-12);
        assert_eq!(quantile(&[2.5], 0.9), Some(2.5));
        assert_eq!(quantile(&[], 0.9), None);
    }

    /// The `h0` objective against a hand computation: two groups, |B| = 2.
    ///
    /// Group A (a rescue group re-scored under H0): rewards (1, 0), so advantages (+1, -1);
    /// trajectory 1 has two tokens with log pi_theta(y | c_H0) = ln 0.6, ln 0.3 and recorded
    /// log q = ln 0.3, ln 0.3 (r = 2, 1); trajectory 2 one token with ln 0.1 against ln 0.2
    /// (r = 0.5). N_A = 3. Group B is empty of H0 tokens here (its tokens go to the paper's
    /// loss), so gamma is the 90th percentile of (2, 1, 0.5) = 1 + 0.8 * (2 - 1) = 1.8.
    /// J_A = (1/3) [ 2/3.8 + 1/2.8 - 0.5/2.3 ] = (1/3) (0.526316 + 0.357143 - 0.217391)
    ///     = 0.222022...; the loss is -J_A / |B| = -0.111011...
    #[test]
    fn guide_loss_matches_a_hand_computation() {
        let dev = Device::Cpu;
        let ln = |x: f32| x.ln();
        let new = Var::new(&[ln(0.6), ln(0.3), ln(0.1)], &dev).unwrap();
        let q = Tensor::new(&[ln(0.3), ln(0.3), ln(0.2)], &dev).unwrap();
        let ratios = [2.0, 1.0, 0.5];
        let gamma = quantile(&ratios, GUIDE_PERCENTILE).unwrap();
        assert!((gamma - 1.8).abs() < 1e-12);
        let terms = GuideTerms {
            logp_behaviour: q,
            advantage: Tensor::new(&[1.0f32, 1.0, -1.0], &dev).unwrap(),
            coef: Tensor::new(&[1.0f32 / 6.0; 3], &dev).unwrap(),
        };
        let (loss, stats) = guide_loss(new.as_tensor(), &terms, gamma).unwrap();
        let want: f64 = -(2.0 / 3.8 + 1.0 / 2.8 - 0.5 / 2.3) / 6.0;
        assert!((want - -0.111_011_4).abs() < 1e-6, "hand value {want}");
        let got = loss.to_scalar::<f32>().unwrap() as f64;
        assert!((got - want).abs() < 1e-6, "{got} vs {want}");
        assert_eq!(stats.tokens, 3);
        assert!((stats.ratio_sum - 3.5).abs() < 1e-5);
        // d(-J)/d logp_new = -coef A gamma r / (r + gamma)^2 (no clipping anywhere).
        let grads = loss.backward().unwrap();
        let g: Vec<f32> = grads.get(new.as_tensor()).unwrap().to_vec1().unwrap();
        for (k, (r, a)) in [(2.0, 1.0), (1.0, 1.0), (0.5, -1.0)]
            .into_iter()
            .enumerate()
        {
            let want = -(1.0 / 6.0) * a * gamma * r / ((r + gamma) * (r + gamma));
            assert!(
                (g[k] as f64 - want).abs() < 1e-6,
                "token {k}: {} vs {want}",
                g[k]
            );
        }
        // Control: the paper's clipped ratio on the same tokens gives another loss.
        let paper = TokenTerms {
            logp_old: terms.logp_behaviour.clone(),
            logp_rollout: terms.logp_behaviour.clone(),
            advantage: terms.advantage.clone(),
            coef: terms.coef.clone(),
        };
        let (p, _) = grpo_loss(new.as_tensor(), &paper, &GrpoConfig::default()).unwrap();
        // r = 2 is clipped to 1.28 (A > 0), r = 0.5 to 0.8 (A < 0): (1.28 + 1 - 0.8) / 6.
        assert!((p.to_scalar::<f32>().unwrap() as f64 + (1.28 + 1.0 - 0.8) / 6.0).abs() < 1e-6);
        assert!(guide_loss(new.as_tensor(), &terms, 0.0).is_err());
    }

    #[test]
    fn weight_is_detached() {
        // logp_old and logp_rollout as variables: the loss must not send them any gradient.
        let dev = Device::Cpu;
        let new = Var::new(&[-1.0f32, -2.0, -0.5], &dev).unwrap();
        let old = Var::new(&[-1.1f32, -1.9, -0.4], &dev).unwrap();
        let q = Var::new(&[-1.5f32, -1.0, -0.45], &dev).unwrap();
        let terms = TokenTerms {
            logp_old: old.as_tensor().clone(),
            logp_rollout: q.as_tensor().clone(),
            advantage: Tensor::new(&[1.0f32, -1.0, 0.5], &dev).unwrap(),
            coef: Tensor::new(&[0.5f32, 0.25, 0.25], &dev).unwrap(),
        };
        let (loss, stats) = grpo_loss(new.as_tensor(), &terms, &GrpoConfig::default()).unwrap();
        let grads = loss.backward().unwrap();
        assert!(grads.get(new.as_tensor()).is_some());
        assert!(grads.get(old.as_tensor()).is_none());
        assert!(grads.get(q.as_tensor()).is_none());
        // exp(-1.1 + 1.5) = 1.49; exp(-1.9 + 1.0) = 0.41; exp(0.05) = 1.05.
        assert!((stats.weight_max - (0.4f64).exp()).abs() < 1e-5);
        // The weight is capped at 2.
        assert_eq!(importance_weight(0.0, -5.0, 2.0), 2.0);
        assert_eq!(importance_weight(-50.0, 0.0, 2.0), (-50f64).exp());
    }

    #[test]
    fn uniform_rewards_give_zero_advantage_and_empty_tasks_contribute_zero() {
        assert_eq!(group_advantages(&[1.0; 8], 1e-6), vec![0.0; 8]);
        assert_eq!(group_advantages(&[0.0; 8], 1e-6), vec![0.0; 8]);
        let cfg = GrpoConfig::default();
        let empty = vec![
            RefTraj {
                reward: 1.0,
                tokens: vec![],
            },
            RefTraj {
                reward: 0.0,
                tokens: vec![],
            },
        ];
        let full = vec![
            RefTraj {
                reward: 1.0,
                tokens: vec![(-1.0, -1.0, -1.0)],
            },
            RefTraj {
                reward: 0.0,
                tokens: vec![(-2.0, -2.0, -2.0)],
            },
        ];
        // Two tasks, one empty: J = (0 + J_full) / 2.
        let both = reference_objective(&[empty.clone(), full.clone()], &cfg);
        let one = reference_objective(std::slice::from_ref(&full), &cfg);
        assert!((both - one / 2.0).abs() < 1e-12);
        let (new, terms) = flatten(&[empty, full], &cfg);
        let (loss, _) = grpo_loss(new.as_tensor(), &terms, &cfg).unwrap();
        assert!((loss.to_scalar::<f32>().unwrap() as f64 + both).abs() < 1e-6);
    }
}
