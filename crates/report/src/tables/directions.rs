//! The directions the paper claims, checked on this run and reported whichever way they fall:
//!
//! - EG rate: Harness-S > GRPO (H0 rescue) > GRPO (Figure 3a), each the mean of `eg_rate` over
//!   the method's update records;
//! - H0 test Avg@k: Harness-S > GRPO (Table 1);
//! - after training, Rank-1 >= H0 in Pass@k and in Avg@k (Table 5's "after" report of
//!   `eval/rank.jsonl`, or Harness-S's `rank1` and `h0` test lines without one);
//! - rescue success over the whole run: adaptive profiles (`harness_s`) > fixed profiles
//!   (`harness_s_fixed`) (Table 2);
//! - per planted family, the good choice at its decision point under H0 after training:
//!   Harness-S > GRPO, both as the share of test episodes that took it (Table 3; intervals
//!   unpaired over episodes) and as the probe's probability of it on fixed contexts (Table 3b;
//!   intervals paired by test task). Both methods start from the same checkpoint, so a higher
//!   value after training is the behaviour moving more.
//!
//! A row gives the means (± sample std over seeds), how many seeds the direction holds in on
//! its own values, and for each adjacent pair of the claim a 95% bootstrap interval of the
//! difference: paired by test task (Avg@k, Rank-1) or by training group (EG rate, the same task
//! at the same update) and resampled over seeds and tasks; rescue success, measured on the tasks
//! each method rescued, gets an unpaired interval. The verdict is the intervals': a direction
//! holds only when every interval excludes zero in the claimed direction, is "within noise" when
//! one includes zero, and does not hold when one excludes zero the other way.

use serde::{Deserialize, Serialize};

use std::collections::BTreeMap;

use crate::layout::{EvalMode, RankStage, Run, SeedRun};
use crate::render::TextTable;
use crate::stats::{
    BootstrapSettings, Interval, Stat, mean, paired_bootstrap, pct, unpaired_bootstrap,
};
use crate::tables::table2::rescue_count;

/// Whether a direction holds, by its bootstrap intervals.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum Verdict {
    /// Every interval excludes zero in the claimed direction.
    Holds,
    /// Some interval includes zero: the run cannot tell.
    WithinNoise,
    /// Some interval excludes zero the other way.
    DoesNotHold,
    /// A compared value, or the per-unit data for an interval, is missing.
    NotRun,
}

impl Verdict {
    /// The report's word for it.
    pub fn as_str(self) -> &'static str {
        match self {
            Verdict::Holds => "holds",
            Verdict::WithinNoise => "within noise",
            Verdict::DoesNotHold => "does not hold",
            Verdict::NotRun => "not run",
        }
    }
}

/// One compared quantity.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Compared {
    /// What it is ("Harness-S").
    pub label: String,
    /// Its value over seeds.
    pub value: Option<Stat>,
}

/// One claimed direction.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct DirectionRow {
    /// The claim, e.g. "EG rate: Harness-S > GRPO (H0 rescue) > GRPO".
    pub claim: String,
    /// The values in the claim's order, each required to exceed (or, `strict == false`, to
    /// reach) the next.
    pub compared: Vec<Compared>,
    /// `>` or `>=`.
    pub strict: bool,
    /// Seeds where every value is present and the direction holds.
    pub seeds_holding: usize,
    /// Seeds where every value is present.
    pub seeds_compared: usize,
    /// Whether the means are in the claimed order.
    pub means_ordered: Option<bool>,
    /// For each adjacent pair of `compared`, the interval of the first minus the second.
    pub intervals: Vec<Option<Interval>>,
    /// By the intervals.
    pub verdict: Verdict,
    /// Where the values came from.
    pub source: String,
}

fn ordered(values: &[f64], strict: bool) -> bool {
    values
        .windows(2)
        .all(|w| if strict { w[0] > w[1] } else { w[0] >= w[1] })
}

/// Per seed, the units of one comparison: paired differences, or the two samples.
enum Units {
    /// `diffs[seed]`: one difference per paired unit.
    Paired(Vec<Vec<f64>>),
    /// `(a[seed], b[seed])`: each method's own units.
    Unpaired(Vec<Vec<f64>>, Vec<Vec<f64>>),
}

impl Units {
    fn interval(&self, settings: &BootstrapSettings) -> Option<Interval> {
        match self {
            Units::Paired(d) => paired_bootstrap(d, settings),
            Units::Unpaired(a, b) => unpaired_bootstrap(a, b, settings),
        }
    }
}

/// The verdict of a claim's intervals.
fn verdict_of(intervals: &[Option<Interval>]) -> Verdict {
    let Some(all) = intervals.iter().copied().collect::<Option<Vec<Interval>>>() else {
        return Verdict::NotRun;
    };
    if all.iter().any(Interval::below_zero) {
        Verdict::DoesNotHold
    } else if all.iter().all(Interval::above_zero) {
        Verdict::Holds
    } else {
        Verdict::WithinNoise
    }
}

/// Build a row from per-seed values of each compared quantity and, for each adjacent pair, the
/// units its interval is drawn from.
fn row(
    claim: String,
    series: Vec<(String, Vec<Option<f64>>)>,
    units: Vec<Units>,
    strict: bool,
    source: String,
) -> DirectionRow {
    let seeds = series.first().map_or(0, |(_, v)| v.len());
    let mut holding = 0;
    let mut compared = 0;
    for s in 0..seeds {
        let v: Option<Vec<f64>> = series.iter().map(|(_, vals)| vals[s]).collect();
        if let Some(v) = v {
            compared += 1;
            holding += usize::from(ordered(&v, strict));
        }
    }
    let stats: Vec<Compared> = series
        .iter()
        .map(|(label, vals)| Compared {
            label: label.clone(),
            value: Stat::of_present(vals.iter().copied()),
        })
        .collect();
    let means: Option<Vec<f64>> = stats.iter().map(|c| c.value.map(|s| s.mean)).collect();
    let means_ordered = means.as_ref().map(|m| ordered(m, strict));
    let settings = BootstrapSettings::default();
    let intervals: Vec<Option<Interval>> = units.iter().map(|u| u.interval(&settings)).collect();
    let verdict = if means.is_none() {
        Verdict::NotRun
    } else {
        verdict_of(&intervals)
    };
    DirectionRow {
        claim,
        compared: stats,
        strict,
        seeds_holding: holding,
        seeds_compared: compared,
        means_ordered,
        intervals,
        verdict,
        source,
    }
}

/// Whether a retained group holds both a success and a failure.
fn effective(rewards: &[f32]) -> bool {
    rewards.iter().any(|r| *r > 0.0) && rewards.iter().any(|r| *r <= 0.0)
}

/// Per seed, 1 or 0 per training group of `a` minus the same for `b`'s group of the same task
/// at the same update (groups only one method formed are left out).
fn eg_units(run: &Run, a: &str, b: &str) -> Units {
    let per_seed = run
        .seeds
        .iter()
        .map(|s| {
            let by_key = |m: &str| -> BTreeMap<(u64, String), f64> {
                s.methods
                    .get(m)
                    .map(|r| {
                        r.groups
                            .iter()
                            .filter(|g| g.retained)
                            .map(|g| {
                                let e = f64::from(u8::from(effective(&g.retained_rewards)));
                                ((g.update, g.task_id.clone()), e)
                            })
                            .collect()
                    })
                    .unwrap_or_default()
            };
            let (ga, gb) = (by_key(a), by_key(b));
            ga.iter()
                .filter_map(|(k, va)| gb.get(k).map(|vb| va - vb))
                .collect()
        })
        .collect();
    Units::Paired(per_seed)
}

/// A test evaluation's per-task values (`pass`: solved at least once, else the success rate).
fn per_task(seed: &SeedRun, method: &str, mode: EvalMode, pass: bool) -> BTreeMap<String, f64> {
    seed.test_eval(method, mode)
        .map(|t| {
            t.per_task
                .iter()
                .filter(|o| o.attempts > 0)
                .map(|o| {
                    let v = if pass {
                        f64::from(u8::from(o.successes > 0))
                    } else {
                        f64::from(o.successes) / f64::from(o.attempts)
                    };
                    (o.task.clone(), v)
                })
                .collect()
        })
        .unwrap_or_default()
}

/// Per seed, `a`'s per-task value minus `b`'s on the same test task.
fn task_units(run: &Run, a: (&str, EvalMode), b: (&str, EvalMode), pass: bool) -> Units {
    Units::Paired(
        run.seeds
            .iter()
            .map(|s| {
                let (va, vb) = (per_task(s, a.0, a.1, pass), per_task(s, b.0, b.1, pass));
                va.iter()
                    .filter_map(|(t, x)| vb.get(t).map(|y| x - y))
                    .collect()
            })
            .collect(),
    )
}

/// Per seed, 1 or 0 per rescued group of a method: whether a rescue rollout succeeded.
fn rescue_units(run: &Run, method: &str) -> Vec<Vec<f64>> {
    run.seeds
        .iter()
        .map(|s| {
            s.methods
                .get(method)
                .map(|r| {
                    r.groups
                        .iter()
                        .filter(|g| g.rescued())
                        .map(|g| f64::from(u8::from(g.rescue_rewards.iter().any(|x| *x > 0.0))))
                        .collect()
                })
                .unwrap_or_default()
        })
        .collect()
}

/// Mean `eg_rate` over a method's update records in one seed.
pub fn mean_eg_rate(seed: &SeedRun, method: &str) -> Option<f64> {
    mean(seed.methods.get(method)?.updates.iter().map(|u| u.eg_rate))
}

/// Rescue success over all of a method's updates in one seed (pooled over records).
pub fn overall_rescue_success(seed: &SeedRun, method: &str) -> Option<f64> {
    rescue_count(&seed.methods.get(method)?.groups, 1, u64::MAX).rate()
}

/// After training: H0's and Rank-1's (Pass@k, Avg@k) in one seed, and their source.
struct AfterTraining {
    h0: (f64, f64),
    rank1: (f64, f64),
    source: &'static str,
}

fn after_training(seed: &SeedRun) -> Option<AfterTraining> {
    let afters: Vec<_> = seed
        .rank
        .iter()
        .flatten()
        .filter(|r| r.stage == RankStage::After)
        .collect();
    let rank = afters
        .iter()
        .find(|r| r.method == "harness_s")
        .or(afters.first());
    if let Some(r) = rank {
        let get = |label: &str| {
            r.report
                .rows
                .iter()
                .find(|row| row.label == label)
                .map(|row| (row.pass_at_k, row.avg_at_k))
        };
        if let (Some(h0), Some(r1)) = (get("H0"), get("Rank-1")) {
            return Some(AfterTraining {
                h0,
                rank1: r1,
                source: "eval/rank.jsonl (after)",
            });
        }
    }
    let h0 = seed.test_eval("harness_s", EvalMode::H0)?;
    let r1 = seed.test_eval("harness_s", EvalMode::Rank1)?;
    Some(AfterTraining {
        h0: (h0.pass_at_k, h0.avg_at_k),
        rank1: (r1.pass_at_k, r1.avg_at_k),
        source: "eval/test.jsonl (harness_s)",
    })
}

/// The test `k` of the run's evaluations (3 when none is recorded).
pub fn test_k(run: &Run) -> usize {
    run.seeds
        .iter()
        .flat_map(|s| s.test.iter().flatten())
        .map(|t| t.k)
        .next()
        .unwrap_or(3)
}

/// "H0 test Avg@k: `a` > `b`": each method's H0 Avg@k per seed (`eval/test.jsonl`, mode h0),
/// with a bootstrap interval of `a - b` paired by test task over seeds and tasks.
pub fn h0_avg_direction(run: &Run, a: &str, b: &str) -> DirectionRow {
    let avg = |m: &str| -> Vec<Option<f64>> {
        run.seeds
            .iter()
            .map(|s| s.test_eval(m, EvalMode::H0).map(|t| t.avg_at_k))
            .collect()
    };
    let (la, lb) = (run.label(a), run.label(b));
    row(
        format!("H0 test Avg@{}: {la} > {lb}", test_k(run)),
        vec![(la, avg(a)), (lb, avg(b))],
        vec![task_units(run, (a, EvalMode::H0), (b, EvalMode::H0), false)],
        true,
        "eval/test.jsonl (mode h0); intervals paired by test task".into(),
    )
}

/// Per seed, `a`'s H0 test Avg@k per task minus `b`'s on the same task: the units
/// [`h0_avg_direction`]'s interval resamples.
pub fn h0_avg_differences(run: &Run, a: &str, b: &str) -> Vec<Vec<f64>> {
    match task_units(run, (a, EvalMode::H0), (b, EvalMode::H0), false) {
        Units::Paired(d) => d,
        Units::Unpaired(..) => unreachable!("task units are paired"),
    }
}

/// Check every direction on the run.
pub fn directions(run: &Run) -> Vec<DirectionRow> {
    let per_seed = |f: &dyn Fn(&SeedRun) -> Option<f64>| -> Vec<Option<f64>> {
        run.seeds.iter().map(f).collect()
    };
    let l = |m: &str| run.label(m);
    let mut rows = Vec::new();
    rows.push(row(
        format!(
            "EG rate: {} > {} > {}",
            l("harness_s"),
            l("h0_rescue"),
            l("grpo")
        ),
        ["harness_s", "h0_rescue", "grpo"]
            .iter()
            .map(|m| (l(m), per_seed(&|s| mean_eg_rate(s, m))))
            .collect(),
        vec![
            eg_units(run, "harness_s", "h0_rescue"),
            eg_units(run, "h0_rescue", "grpo"),
        ],
        true,
        "metrics.jsonl: mean eg_rate over update records; intervals paired by (update, task) in groups.jsonl".into(),
    ));
    rows.push(h0_avg_direction(run, "harness_s", "grpo"));
    let k = test_k(run);
    let mut source: Vec<&str> = run
        .seeds
        .iter()
        .filter_map(|s| after_training(s).map(|a| a.source))
        .collect();
    source.sort_unstable();
    source.dedup();
    let source = if source.is_empty() {
        "eval/rank.jsonl or eval/test.jsonl".to_string()
    } else {
        source.join(", ")
    };
    for (metric, pick, pass) in [
        (
            format!("Pass@{k}"),
            (|p: (f64, f64)| p.0) as fn((f64, f64)) -> f64,
            true,
        ),
        (format!("Avg@{k}"), |p| p.1, false),
    ] {
        rows.push(row(
            format!("After training, Rank-1 {metric} >= H0 {metric}"),
            vec![
                (
                    "Rank-1".into(),
                    per_seed(&|s| after_training(s).map(|a| pick(a.rank1))),
                ),
                (
                    "H0".into(),
                    per_seed(&|s| after_training(s).map(|a| pick(a.h0))),
                ),
            ],
            vec![task_units(
                run,
                ("harness_s", EvalMode::Rank1),
                ("harness_s", EvalMode::H0),
                pass,
            )],
            false,
            format!("{source}; intervals paired by test task in eval/test.jsonl (harness_s)"),
        ));
    }
    rows.push(row(
        format!(
            "Rescue success (whole run): {} > {}",
            l("harness_s"),
            l("harness_s_fixed")
        ),
        ["harness_s", "harness_s_fixed"]
            .iter()
            .map(|m| (l(m), per_seed(&|s| overall_rescue_success(s, m))))
            .collect(),
        vec![Units::Unpaired(
            rescue_units(run, "harness_s"),
            rescue_units(run, "harness_s_fixed"),
        )],
        true,
        "groups.jsonl: rescued records with a successful rescue rollout / rescued records".into(),
    ));
    rows.extend(behaviour_rows(run, "harness_s", "grpo"));
    rows
}

/// Per seed, 1 or 0 per H0 test episode of `method` that reached `point` in `family`: whether
/// it took the good choice.
fn choice_units(run: &Run, method: &str, family: &str, point: &str, good: &str) -> Vec<Vec<f64>> {
    run.seeds
        .iter()
        .map(|s| {
            let Some(choices) = s
                .behaviour
                .iter()
                .flatten()
                .find(|b| b.method == method)
                .and_then(|b| b.choices.get(family)?.get(point))
            else {
                return Vec::new();
            };
            choices
                .iter()
                .flat_map(|(choice, n)| {
                    std::iter::repeat_n(f64::from(u8::from(choice == good)), *n)
                })
                .collect()
        })
        .collect()
}

/// The probe's per-task `p_good` of `method` in `family`, per seed.
fn probe_of(seed: &SeedRun, method: &str, family: &str) -> Option<BTreeMap<String, f64>> {
    seed.behaviour
        .iter()
        .flatten()
        .find(|b| b.method == method)
        .and_then(|b| b.probe.get(family))
        .map(|c| c.per_task.clone())
}

/// The good choice at each planted decision point: `a` > `b` in episode shares and in the
/// probe's probability.
fn behaviour_rows(run: &Run, a: &str, b: &str) -> Vec<DirectionRow> {
    let l = |m: &str| run.label(m);
    let mut points: std::collections::BTreeSet<(String, String)> = Default::default();
    let mut families: std::collections::BTreeSet<String> = Default::default();
    for line in run.seeds.iter().flat_map(|s| s.behaviour.iter().flatten()) {
        for (family, by_point) in &line.choices {
            points.extend(by_point.keys().map(|p| (family.clone(), p.clone())));
        }
        families.extend(line.probe.keys().cloned());
    }
    let mut rows = Vec::new();
    for (family, point) in points {
        let Some((good, _)) = crate::tables::behaviour::good_and_planted(&point) else {
            continue;
        };
        let (ua, ub) = (
            choice_units(run, a, &family, &point, good),
            choice_units(run, b, &family, &point, good),
        );
        let rate = |units: &[Vec<f64>]| -> Vec<Option<f64>> {
            units.iter().map(|u| mean(u.iter().copied())).collect()
        };
        rows.push(row(
            format!("H0 test episodes choosing `{good}` at {point} ({family}): {} > {}", l(a), l(b)),
            vec![(l(a), rate(&ua)), (l(b), rate(&ub))],
            vec![Units::Unpaired(ua, ub)],
            true,
            "eval/behaviour.jsonl choices; intervals unpaired over the episodes that reached the point".into(),
        ));
    }
    for family in families {
        let per_seed = |m: &str| -> Vec<Option<f64>> {
            run.seeds
                .iter()
                .map(|s| probe_of(s, m, &family).and_then(|t| mean(t.values().copied())))
                .collect()
        };
        let diffs = run
            .seeds
            .iter()
            .map(
                |s| match (probe_of(s, a, &family), probe_of(s, b, &family)) {
                    (Some(x), Some(y)) => x
                        .iter()
                        .filter_map(|(t, v)| y.get(t).map(|w| v - w))
                        .collect(),
                    _ => Vec::new(),
                },
            )
            .collect();
        rows.push(row(
            format!(
                "Probability of the good decision ({family}, probe): {} > {}",
                l(a),
                l(b)
            ),
            vec![(l(a), per_seed(a)), (l(b), per_seed(b))],
            vec![Units::Paired(diffs)],
            true,
            "eval/behaviour.jsonl probe; intervals paired by test task".into(),
        ));
    }
    rows
}

/// The directions as text.
pub fn directions_text(rows: &[DirectionRow], seeds: usize) -> TextTable {
    let text_rows = rows
        .iter()
        .map(|r| {
            let values = r
                .compared
                .iter()
                .map(|c| format!("{} {}", c.label, pct(c.value.as_ref(), seeds)))
                .collect::<Vec<_>>()
                .join(" vs ");
            let intervals = r
                .intervals
                .iter()
                .map(|i| match i {
                    Some(i) => format!("[{:+.2}, {:+.2}]", i.low * 100.0, i.high * 100.0),
                    None => "no per-unit data".into(),
                })
                .collect::<Vec<_>>()
                .join("; ");
            let mut verdict = r.verdict.as_str().to_string();
            if r.verdict != Verdict::NotRun {
                let order = if r.means_ordered == Some(true) {
                    "in the claimed order"
                } else {
                    "not in the claimed order"
                };
                verdict.push_str(&format!("; means {order}"));
                if seeds > 1 {
                    verdict.push_str(&format!("; {}/{} seeds", r.seeds_holding, r.seeds_compared));
                }
            }
            vec![
                r.claim.clone(),
                values,
                intervals,
                verdict,
                r.source.clone(),
            ]
        })
        .collect();
    let mut notes = vec![
        "The paper's claimed directions, checked on this run's files and reported whichever way they fall. Values in percent.".to_string(),
        "Difference intervals: 95% bootstrap (4,000 replicates) of each adjacent pair's difference in points, paired by test task or training group and resampled over seeds and units (rescue success: unpaired, on each method's rescued tasks). A direction holds only when every interval excludes zero in the claimed direction; within noise when one includes zero.".to_string(),
    ];
    if seeds > 1 {
        notes.push(format!(
            "Mean ± sample standard deviation (n - 1) over {seeds} seeds, with the count of seeds in which the direction holds on that seed's values."
        ));
    }
    TextTable {
        title: "Claimed directions".into(),
        header: vec![
            "Direction".into(),
            "Compared values".into(),
            "Difference, 95% interval".into(),
            "Verdict".into(),
            "Source".into(),
        ],
        rows: text_rows,
        notes,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::layout::{BehaviourLine, ProbeCell};

    fn line(method: &str, commit: usize, check: usize, probe: &[(&str, f64)]) -> BehaviourLine {
        BehaviourLine {
            method: method.into(),
            label: None,
            mode: "h0".into(),
            episodes: BTreeMap::from([("change".to_string(), commit + check)]),
            choices: BTreeMap::from([(
                "change".to_string(),
                BTreeMap::from([(
                    "after_change".to_string(),
                    BTreeMap::from([("commit".to_string(), commit), ("check".to_string(), check)]),
                )]),
            )]),
            probe: BTreeMap::from([(
                "change".to_string(),
                ProbeCell {
                    tasks: probe.len(),
                    per_task: probe.iter().map(|(t, p)| (t.to_string(), *p)).collect(),
                    ..ProbeCell::default()
                },
            )]),
            probe_siblings: BTreeMap::new(),
        }
    }

    fn run(lines: Vec<BehaviourLine>) -> Run {
        Run {
            dir: "r".into(),
            seeds: vec![SeedRun {
                dir: "s".into(),
                seed: Some(1),
                config: None,
                methods: BTreeMap::new(),
                test: None,
                rank: None,
                behaviour: Some(lines),
                routing: None,
                first_calibration: Vec::new(),
                evolve: None,
                ..SeedRun::default()
            }],
            shared_evolve: None,
        }
    }

    #[test]
    fn behaviour_rows_compare_episode_shares_and_the_probe_per_family() {
        let r = run(vec![
            line("harness_s", 18, 2, &[("t1", 0.9), ("t2", 0.8), ("t3", 0.7)]),
            line("grpo", 2, 18, &[("t1", 0.2), ("t2", 0.3), ("t3", 0.1)]),
        ]);
        let rows = behaviour_rows(&r, "harness_s", "grpo");
        assert_eq!(rows.len(), 2);
        let shares = &rows[0];
        assert!(
            shares.claim.contains("`commit` at after_change (change)"),
            "{}",
            shares.claim
        );
        let values: Vec<f64> = shares
            .compared
            .iter()
            .map(|c| c.value.unwrap().mean)
            .collect();
        assert_eq!(values, [0.9, 0.1]);
        assert_eq!(shares.intervals[0].unwrap().units, 40);
        assert_eq!(shares.verdict, Verdict::Holds);
        let probe = &rows[1];
        assert!(probe.claim.contains("(change, probe)"), "{}", probe.claim);
        let diff = probe.intervals[0].unwrap();
        // Paired by task: differences 0.7, 0.5, 0.6; the interval lies within their range.
        assert_eq!(diff.units, 3);
        assert!(
            diff.low >= 0.5 - 1e-12 && diff.high <= 0.7 + 1e-12,
            "{diff:?}"
        );
        assert_eq!(probe.verdict, Verdict::Holds);

        // The other way round the shares do not hold.
        let rows = behaviour_rows(&r, "grpo", "harness_s");
        assert_eq!(rows[0].verdict, Verdict::DoesNotHold);
        // Without behaviour lines there is nothing to compare.
        assert!(behaviour_rows(&run(Vec::new()), "harness_s", "grpo").is_empty());
    }
}
