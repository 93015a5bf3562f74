//! The paper's GRPO objective (Eqs. 6, 13-16) and its gradient with respect to each policy
//! token's log-prob, in f64 — what the learner turns into per-token loss weights.
//!
//! For a policy token `k` of trajectory `j` of task `x` in a batch `B`:
//!
//! * advantage (Eq. 6): `A_j = (R_j - mean R) / max(std_pop R, eps)`, `eps = 1e-6`;
//! * ratio (Eq. 13): `rho_k = exp(logp_new_k - logp_old_k)`;
//! * clipped term (Eq. 14): `l_k = min(rho_k A_j, clip(rho_k, 1 - 0.20, 1 + 0.28) A_j)`;
//! * detached weight (Eq. 16): `w_k = clip(exp(logp_old_k - logp_q_k), 0, 2)`;
//! * Eq. 15: `J = 1/|B| sum_x 1/N_x sum_k w_k l_k` (a task without tokens adds 0 but counts
//!   in `|B|`), no KL term.
//!
//! `J` depends on the weights only through `logp_new`, so its gradient is the chain
//! `dJ/dtheta = sum_k (dJ/dlogp_new_k) dlogp_new_k/dtheta`, with
//! `d(-J)/dlogp_new_k = -coef_k w_k A_j rho_k` inside the clip region and `0` where the active
//! bound clips (`A > 0, rho > 1.28` or `A < 0, rho < 0.80`), `coef_k = 1 / (|B| N_x)`. A
//! server that back-propagates `sum_k c_k logp_new_k` for constants `c_k = -d(-J)/dlogp_new_k`
//! (the `cross_entropy` loss with `weights = c`) therefore applies exactly the gradient of
//! Eq. 15.

use serde::{Deserialize, Serialize};

/// The objective's hyper-parameters (the paper's values by default).
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct GrpoSettings {
    /// `eta_-`: the ratio is clipped below at `1 - clip_low` (paper: 0.20).
    pub clip_low: f64,
    /// `eta_+`: the ratio is clipped above at `1 + clip_high` (paper: 0.28).
    pub clip_high: f64,
    /// Upper bound of the detached correction weight of Eq. 16 (paper: 2).
    pub weight_cap: f64,
    /// Epsilon of the advantage normalisation (Eq. 6, paper: 1e-6).
    pub adv_eps: f64,
}

impl Default for GrpoSettings {
    fn default() -> Self {
        GrpoSettings {
            clip_low: 0.20,
            clip_high: 0.28,
            weight_cap: 2.0,
            adv_eps: 1e-6,
        }
    }
}

/// Group-relative advantages (Eq. 6): population standard deviation, `max(std, eps)`.
pub fn group_advantages(rewards: &[f32], eps: f64) -> Vec<f64> {
    if rewards.is_empty() {
        return Vec::new();
    }
    let n = rewards.len() as f64;
    let mean = rewards.iter().map(|&r| f64::from(r)).sum::<f64>() / n;
    let var = rewards
        .iter()
        .map(|&r| (f64::from(r) - mean).powi(2))
        .sum::<f64>()
        / n;
    let denom = var.sqrt().max(eps);
    rewards
        .iter()
        .map(|&r| (f64::from(r) - mean) / denom)
        .collect()
}

/// One policy token's inputs to Eq. 15.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct TokenTerm {
    /// `log pi_theta` now.
    pub logp_new: f64,
    /// `log pi_old` (the policy before the update).
    pub logp_old: f64,
    /// `log q`, recorded by the rollout backend.
    pub logp_rollout: f64,
    /// The trajectory's advantage `A_j`.
    pub advantage: f64,
    /// `1 / (|B| N_x)`.
    pub coef: f64,
}

/// Eq. 15 over a batch's tokens and its gradient.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct Eq15 {
    /// `-J`.
    pub loss: f64,
    /// `d(-J) / d logp_new`, per token in input order.
    pub grad: Vec<f64>,
    /// Tokens whose lower bound was active.
    pub clipped_low: usize,
    /// Tokens whose upper bound was active.
    pub clipped_high: usize,
    /// Sum of `w` (Eq. 16).
    pub weight_sum: f64,
    /// Tokens whose `pi_old / q` exceeded the cap.
    pub weight_clipped: usize,
    /// Sum, smallest and largest `rho`.
    pub ratio_sum: f64,
    /// Smallest `rho`.
    pub ratio_min: f64,
    /// Largest `rho`.
    pub ratio_max: f64,
}

/// Eq. 16: `clip(pi_old / q, 0, cap)` from log-probs.
pub fn importance_weight(logp_old: f64, logp_rollout: f64, cap: f64) -> f64 {
    (logp_old - logp_rollout).exp().clamp(0.0, cap)
}

/// `-J` of Eq. 15 and its gradient with respect to each token's `logp_new`.
pub fn eq15(tokens: &[TokenTerm], cfg: &GrpoSettings) -> Eq15 {
    let (lo_b, hi_b) = (1.0 - cfg.clip_low, 1.0 + cfg.clip_high);
    let mut out = Eq15 {
        grad: Vec::with_capacity(tokens.len()),
        ratio_min: f64::INFINITY,
        ratio_max: f64::NEG_INFINITY,
        ..Eq15::default()
    };
    let mut j = 0.0;
    for t in tokens {
        let rho = (t.logp_new - t.logp_old).exp();
        let a = t.advantage;
        let low = a < 0.0 && rho < lo_b;
        let high = a > 0.0 && rho > hi_b;
        let w = importance_weight(t.logp_old, t.logp_rollout, cfg.weight_cap);
        out.weight_clipped += usize::from((t.logp_old - t.logp_rollout).exp() > cfg.weight_cap);
        let term = (rho * a).min(rho.clamp(lo_b, hi_b) * a);
        j += t.coef * w * term;
        out.grad.push(if low || high {
            0.0
        } else {
            -t.coef * w * a * rho
        });
        out.clipped_low += usize::from(low);
        out.clipped_high += usize::from(high);
        out.weight_sum += w;
        out.ratio_sum += rho;
        out.ratio_min = out.ratio_min.min(rho);
        out.ratio_max = out.ratio_max.max(rho);
    }
    if tokens.is_empty() {
        out.ratio_min = 0.0;
        out.ratio_max = 0.0;
    }
    out.loss = -j;
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    /// One trajectory: its reward and its tokens' (logp_new, logp_old, logp_q).
    type Traj = (f32, Vec<(f64, f64, f64)>);

    /// Plain transcription of Eqs. 6, 13-16 over groups of trajectories of
    /// (logp_new, logp_old, logp_q) tokens; returns J.
    fn reference_j(groups: &[Vec<Traj>], cfg: &GrpoSettings) -> f64 {
        let b = groups.len() as f64;
        let mut total = 0.0;
        for g in groups {
            let r: Vec<f64> = g.iter().map(|t| f64::from(t.0)).collect();
            let n = r.len() as f64;
            let mean = r.iter().sum::<f64>() / n;
            let std = (r.iter().map(|x| (x - mean).powi(2)).sum::<f64>() / n).sqrt();
            let nx: usize = g.iter().map(|t| t.1.len()).sum();
            if nx == 0 {
                continue;
            }
            let mut s = 0.0;
            for (traj, rj) in g.iter().zip(&r) {
                let a = (rj - mean) / std.max(cfg.adv_eps);
                for &(new, old, q) in &traj.1 {
                    let rho = (new - old).exp();
                    let l = (rho * a).min(rho.clamp(1.0 - cfg.clip_low, 1.0 + cfg.clip_high) * a);
                    s += ((old - q).exp()).clamp(0.0, cfg.weight_cap) * l;
                }
            }
            total += s / nx as f64;
        }
        total / b
    }

    fn flatten(groups: &[Vec<Traj>], cfg: &GrpoSettings) -> Vec<TokenTerm> {
        let b = groups.len() as f64;
        let mut out = Vec::new();
        for g in groups {
            let adv = group_advantages(&g.iter().map(|t| t.0).collect::<Vec<_>>(), cfg.adv_eps);
            let nx: usize = g.iter().map(|t| t.1.len()).sum();
            for (traj, a) in g.iter().zip(adv) {
                for &(new, old, q) in &traj.1 {
                    out.push(TokenTerm {
                        logp_new: new,
                        logp_old: old,
                        logp_rollout: q,
                        advantage: a,
                        coef: 1.0 / (b * nx as f64),
                    });
                }
            }
        }
        out
    }

    fn groups() -> impl Strategy<Value = Vec<Vec<Traj>>> {
        let traj = (
            prop_oneof![Just(0f32), Just(1f32)],
            // new = old + d: ratios on both sides of both bounds; q = old + e: weights on both
            // sides of the cap.
            prop::collection::vec((-3.0f64..-0.01, -0.6f64..0.6, -1.0f64..1.0), 0..6),
        )
            .prop_map(|(r, toks)| {
                (
                    r,
                    toks.into_iter()
                        .map(|(old, d, e)| (old + d, old, old + e))
                        .collect::<Vec<_>>(),
                )
            });
        prop::collection::vec(prop::collection::vec(traj, 1..6), 1..4)
    }

    proptest! {
        /// The value equals the f64 reference, and each token's gradient equals a central
        /// finite difference of the reference (away from the clip kinks), including clipped
        /// tokens on both sides and tasks with no tokens.
        #[test]
        fn value_and_gradient_match_the_f64_reference(gs in groups()) {
            let cfg = GrpoSettings::default();
            let toks = flatten(&gs, &cfg);
            let got = eq15(&toks, &cfg);
            let want = -reference_j(&gs, &cfg);
            prop_assert!((got.loss - want).abs() < 1e-12 * (1.0 + want.abs()), "{} vs {}", got.loss, want);
            let h = 1e-6;
            let mut k = 0;
            for gi in 0..gs.len() {
                for ti in 0..gs[gi].len() {
                    for si in 0..gs[gi][ti].1.len() {
                        let (new, old, _) = gs[gi][ti].1[si];
                        let rho = (new - old).exp();
                        let near_kink = (rho - 0.8).abs() < 1e-4 || (rho - 1.28).abs() < 1e-4;
                        if !near_kink {
                            let mut plus = gs.clone();
                            plus[gi][ti].1[si].0 += h;
                            let mut minus = gs.clone();
                            minus[gi][ti].1[si].0 -= h;
                            let fd = (-reference_j(&plus, &cfg) + reference_j(&minus, &cfg)) / (2.0 * h);
                            prop_assert!((got.grad[k] - fd).abs() < 1e-6 * (1.0 + fd.abs()), "token {}: {} vs {}", k, got.grad[k], fd);
                        }
                        k += 1;
                    }
                }
            }
            prop_assert_eq!(k, toks.len());
        }
    }

    #[test]
    fn clipped_tokens_get_no_gradient_and_weights_are_capped() {
        let cfg = GrpoSettings::default();
        let t = |new: f64, a: f64| TokenTerm {
            logp_new: new,
            logp_old: 0.0,
            logp_rollout: 0.0,
            advantage: a,
            coef: 1.0,
        };
        // rho = e^0.3 = 1.35 > 1.28 with A > 0: clipped; with A < 0: free.
        let r = eq15(
            &[t(0.3, 1.0), t(0.3, -1.0), t(-0.3, -1.0), t(-0.3, 1.0)],
            &cfg,
        );
        assert_eq!(r.grad[0], 0.0);
        assert!((r.grad[1] - 0.3f64.exp()).abs() < 1e-12);
        // rho = e^-0.3 = 0.74 < 0.8 with A < 0: clipped; with A > 0: free.
        assert_eq!(r.grad[2], 0.0);
        assert!((r.grad[3] + (-0.3f64).exp()).abs() < 1e-12);
        assert_eq!((r.clipped_low, r.clipped_high), (1, 1));
        assert_eq!(importance_weight(0.0, -5.0, 2.0), 2.0);
        let empty = eq15(&[], &cfg);
        assert_eq!(empty.loss, 0.0);
        assert!(empty.grad.is_empty());
    }
}
