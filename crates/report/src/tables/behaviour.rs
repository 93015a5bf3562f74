//! Behaviour under H0 and routing by task family, from `eval/behaviour.jsonl` and
//! `eval/routing.jsonl`:
//!
//! - Table 3's shape: for each task family and decision point, how often each checkpoint's H0
//!   test episodes took the good choice and the planted one there (an episode counts once per
//!   point it reached), pooled over seeds, with the counts;
//! - Table 3b: each checkpoint's probability of the good decision at each family's decision
//!   point, on fixed contexts (the `probe` of `eval/behaviour.jsonl`), mean +- std over seeds
//!   and its change from the initial policy;
//! - the router's Rank-1 choices by task family before and after training: which harnesses it
//!   picks for which kind of task, and how often H0.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use crate::layout::{RankStage, Run};
use crate::render::TextTable;
use crate::stats::Stat;

/// The good and the planted choice at a decision point, as harness-envs defines them (`None`
/// for an unknown point).
pub fn good_and_planted(point: &str) -> Option<(&'static str, &'static str)> {
    let (good, planted) = harness_envs::labels::DecisionPoint::parse(point)?.good_and_planted();
    Some((good.as_str(), planted.as_str()))
}

/// One method's counts at one (family, point).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ChoiceShare {
    /// Episodes that reached the point.
    pub reached: usize,
    /// Of which took the good choice.
    pub good: usize,
    /// Of which took the planted choice.
    pub planted: usize,
}

impl ChoiceShare {
    /// The good choice's share (`None` when never reached).
    pub fn good_rate(&self) -> Option<f64> {
        (self.reached > 0).then(|| self.good as f64 / self.reached as f64)
    }

    /// The planted choice's share.
    pub fn planted_rate(&self) -> Option<f64> {
        (self.reached > 0).then(|| self.planted as f64 / self.reached as f64)
    }
}

/// One row of Table 3: a family and a decision point, each method's shares.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct BehaviourRow {
    /// The task family.
    pub family: String,
    /// The decision point.
    pub point: String,
    /// The good choice.
    pub good: String,
    /// The planted choice.
    pub planted: String,
    /// Per method, in the table's method order.
    pub shares: Vec<ChoiceShare>,
}

/// Table 3 of a run.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Table3 {
    /// Methods (file names) in display order.
    pub methods: Vec<String>,
    /// Their labels.
    pub labels: Vec<String>,
    /// Rows by family, then point.
    pub rows: Vec<BehaviourRow>,
}

/// Compute Table 3, pooling every seed's counts (empty rows: not run).
pub fn table3(run: &Run) -> Table3 {
    let mut methods: Vec<String> = run
        .seeds
        .iter()
        .flat_map(|s| s.behaviour.iter().flatten().map(|b| b.method.clone()))
        .collect();
    methods.sort_by_key(|m| crate::layout::method_rank(m));
    methods.dedup();
    // (family, point) -> method -> share
    let mut cells: BTreeMap<(String, String), BTreeMap<String, ChoiceShare>> = BTreeMap::new();
    for line in run.seeds.iter().flat_map(|s| s.behaviour.iter().flatten()) {
        for (family, points) in &line.choices {
            for (point, choices) in points {
                let Some((good, planted)) = good_and_planted(point) else {
                    continue;
                };
                let cell = cells
                    .entry((family.clone(), point.clone()))
                    .or_default()
                    .entry(line.method.clone())
                    .or_default();
                cell.reached += choices.values().sum::<usize>();
                cell.good += choices.get(good).copied().unwrap_or(0);
                cell.planted += choices.get(planted).copied().unwrap_or(0);
            }
        }
    }
    let rows = cells
        .into_iter()
        .map(|((family, point), by_method)| {
            let (good, planted) = good_and_planted(&point).unwrap_or(("", ""));
            BehaviourRow {
                shares: methods
                    .iter()
                    .map(|m| by_method.get(m).copied().unwrap_or_default())
                    .collect(),
                family,
                point,
                good: good.into(),
                planted: planted.into(),
            }
        })
        .collect();
    Table3 {
        labels: methods.iter().map(|m| run.label(m)).collect(),
        methods,
        rows,
    }
}

fn pct1(x: Option<f64>) -> String {
    x.map_or("—".into(), |v| format!("{:.1}", v * 100.0))
}

impl Table3 {
    /// As text.
    pub fn to_text(&self) -> TextTable {
        let mut header = vec!["Family".to_string(), "Decision point".into()];
        header.extend(self.labels.iter().cloned());
        let rows = self
            .rows
            .iter()
            .map(|r| {
                let mut cells = vec![
                    r.family.clone(),
                    format!("{} ({} / {})", r.point, r.good, r.planted),
                ];
                cells.extend(r.shares.iter().map(|s| {
                    if s.reached == 0 {
                        "—".into()
                    } else {
                        format!(
                            "{} / {} (n={})",
                            pct1(s.good_rate()),
                            pct1(s.planted_rate()),
                            s.reached
                        )
                    }
                }));
                cells
            })
            .collect();
        let mut notes = vec![
            "Each cell: the share of H0 test episodes that took the good choice / the planted one at that decision point, in percent, with n the episodes that reached it (eval/behaviour.jsonl, pooled over seeds). after_change: commit / check the table again; after_result: commit / run the same query again; after_name_error: retry with quoted names / repeat the failed statement.".to_string(),
        ];
        if self.rows.is_empty() {
            notes.push(
                "Not run: no eval/behaviour.jsonl (decision points are read from DBBench episodes)."
                    .into(),
            );
        }
        TextTable {
            title: "Table 3. Behaviour at the decision points under H0, before and after training"
                .into(),
            header,
            rows,
            notes,
        }
    }
}

/// One family's row of Table 3b: per method, the probe's `p_good` over seeds.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ProbeRow {
    /// The task family.
    pub family: String,
    /// Test tasks probed per seed (the first seed's count).
    pub tasks: usize,
    /// Per method, in the table's method order: `p_good` over seeds (`None`: not probed).
    pub p_good: Vec<Option<Stat>>,
    /// Per method: the mean over seeds of `p_good` minus the initial policy's on the same seed
    /// (`None` where either is missing).
    pub change: Vec<Option<Stat>>,
}

/// Table 3b of a run.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Table3b {
    /// Methods (file names) in display order.
    pub methods: Vec<String>,
    /// Their labels.
    pub labels: Vec<String>,
    /// One row per probed family.
    pub rows: Vec<ProbeRow>,
}

/// Compute Table 3b from every seed's probe (no rows: not probed).
pub fn table3b(run: &Run) -> Table3b {
    let mut methods: Vec<String> = run
        .seeds
        .iter()
        .flat_map(|s| s.behaviour.iter().flatten())
        .filter(|b| !b.probe.is_empty())
        .map(|b| b.method.clone())
        .collect();
    methods.sort_by_key(|m| crate::layout::method_rank(m));
    methods.dedup();
    let families: std::collections::BTreeSet<&String> = run
        .seeds
        .iter()
        .flat_map(|s| s.behaviour.iter().flatten())
        .flat_map(|b| b.probe.keys())
        .collect();
    fn probe<'a>(
        seed: &'a crate::layout::SeedRun,
        method: &str,
        family: &str,
    ) -> Option<&'a crate::layout::ProbeCell> {
        seed.behaviour
            .iter()
            .flatten()
            .find(|b| b.method == method)
            .and_then(|b| b.probe.get(family))
    }
    let rows = families
        .into_iter()
        .map(|family| {
            let tasks = run
                .seeds
                .iter()
                .find_map(|s| methods.iter().find_map(|m| probe(s, m, family)))
                .map_or(0, |c| c.tasks);
            let p_good = methods
                .iter()
                .map(|m| {
                    Stat::of_present(
                        run.seeds
                            .iter()
                            .map(|s| probe(s, m, family).map(|c| c.p_good)),
                    )
                })
                .collect();
            let change = methods
                .iter()
                .map(|m| {
                    Stat::of_present(run.seeds.iter().map(|s| {
                        let after = probe(s, m, family)?.p_good;
                        let before = probe(s, "initial", family)?.p_good;
                        Some(after - before)
                    }))
                })
                .collect();
            ProbeRow {
                family: family.clone(),
                tasks,
                p_good,
                change,
            }
        })
        .collect();
    Table3b {
        labels: methods.iter().map(|m| run.label(m)).collect(),
        methods,
        rows,
    }
}

impl Table3b {
    /// As text.
    pub fn to_text(&self) -> TextTable {
        let mut header = vec!["Family".to_string(), "Tasks".into()];
        header.extend(self.labels.iter().cloned());
        let fmt = |s: &Option<Stat>, signed: bool| match s {
            None => "—".to_string(),
            Some(s) => {
                let mut out = if signed {
                    format!("{:+.3}", s.mean)
                } else {
                    format!("{:.3}", s.mean)
                };
                if let Some(sd) = s.std {
                    out.push_str(&format!(" ± {sd:.3}"));
                }
                out
            }
        };
        let rows = self
            .rows
            .iter()
            .map(|r| {
                let mut cells = vec![r.family.clone(), r.tasks.to_string()];
                cells.extend(self.methods.iter().enumerate().map(|(i, m)| {
                    let p = fmt(&r.p_good[i], false);
                    if m == "initial" || r.change[i].is_none() {
                        p
                    } else {
                        format!("{p} ({})", fmt(&r.change[i], true))
                    }
                }));
                cells
            })
            .collect();
        let mut notes = vec![
            "Each cell: the checkpoint's two-way probability of the good decision at the family's decision point under H0, sigmoid(log p(good) - log p(planted)) at the first token where the good and the planted turn part, on the demonstration script's fixed contexts over the test tasks; mean ± std over seeds, and in brackets the change from the initial policy on the same seed (eval/behaviour.jsonl, probe). change: commit / check the table; recheck: commit / run the query again; quoting: quote the names / repeat the failed statement.".to_string(),
        ];
        if self.rows.is_empty() {
            notes.push("Not run: no probe in eval/behaviour.jsonl (the probe reads the embedded default's planted families).".into());
        }
        TextTable {
            title: "Table 3b. Probability of the good decision at the decision points under H0"
                .into(),
            header,
            rows,
            notes,
        }
    }
}

/// Rank-1 choices of one family at one stage.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct FamilyRouting {
    /// The family.
    pub family: String,
    /// Before or after training.
    pub stage: RankStage,
    /// Tasks (over seeds).
    pub tasks: usize,
    /// Rank-1 harness name -> tasks, most chosen first.
    pub choices: Vec<(String, usize)>,
    /// Tasks with H0 at Rank-1.
    pub h0: usize,
}

/// The router's Rank-1 choices by family and stage (empty: not run).
pub fn routing_by_family(run: &Run) -> Vec<FamilyRouting> {
    // (family, stage) -> (tasks, tasks with H0 first, Rank-1 name -> tasks)
    type Counts = (usize, usize, BTreeMap<String, usize>);
    let mut groups: BTreeMap<(String, RankStage), Counts> = BTreeMap::new();
    for line in run.seeds.iter().flat_map(|s| s.routing.iter().flatten()) {
        let g = groups.entry((line.family.clone(), line.stage)).or_default();
        g.0 += 1;
        g.1 += usize::from(line.rank1_is_h0);
        *g.2.entry(line.rank1_name.clone()).or_default() += 1;
    }
    groups
        .into_iter()
        .map(|((family, stage), (tasks, h0, by_name))| {
            let mut choices: Vec<(String, usize)> = by_name.into_iter().collect();
            choices.sort_by(|a, b| b.1.cmp(&a.1).then_with(|| a.0.cmp(&b.0)));
            FamilyRouting {
                family,
                stage,
                tasks,
                choices,
                h0,
            }
        })
        .collect()
}

/// The routing table as text.
pub fn routing_text(rows: &[FamilyRouting]) -> TextTable {
    let distinct_overall: std::collections::BTreeSet<(&RankStage, &String)> = rows
        .iter()
        .flat_map(|r| r.choices.first().map(|c| (&r.stage, &c.0)))
        .collect();
    let text_rows = rows
        .iter()
        .map(|r| {
            let shares = r
                .choices
                .iter()
                .map(|(name, n)| format!("{name} {:.0}%", 100.0 * *n as f64 / r.tasks as f64))
                .collect::<Vec<_>>()
                .join(", ");
            vec![
                r.family.clone(),
                format!("{:?}", r.stage).to_lowercase(),
                r.tasks.to_string(),
                shares,
                format!("{:.0}%", 100.0 * r.h0 as f64 / r.tasks.max(1) as f64),
            ]
        })
        .collect();
    let mut notes = vec![
        "The harness the router ranked first for each test task (eval/routing.jsonl), grouped by the task's family; the family is reported here only, the router never sees it.".to_string(),
    ];
    if rows.is_empty() {
        notes.push("Not run: no eval/routing.jsonl.".into());
    } else {
        for stage in [RankStage::Before, RankStage::After] {
            let firsts: Vec<&String> = distinct_overall
                .iter()
                .filter(|(s, _)| **s == stage)
                .map(|(_, n)| *n)
                .collect();
            if !firsts.is_empty() {
                notes.push(format!(
                    "{}: the most chosen Rank-1 harness differs across families: {} ({} distinct).",
                    format!("{stage:?}").to_lowercase(),
                    if firsts.len() > 1 { "yes" } else { "no" },
                    firsts.len()
                ));
            }
        }
    }
    TextTable {
        title: "Rank-1 choices by task family".into(),
        header: vec![
            "Family".into(),
            "Stage".into(),
            "Tasks".into(),
            "Rank-1 harnesses (share of tasks)".into(),
            "H0 at Rank-1".into(),
        ],
        rows: text_rows,
        notes,
    }
}

/// Figure 1c of one seed: each sibling's paired outcome against H0 at each calibration of a
/// routed method's training (the first calibration, the re-anchorings, the final one).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Nonstationarity {
    /// The seed's name.
    pub seed: String,
    /// The method whose calibrations these are.
    pub method: String,
    /// The updates of the calibrations, in order.
    pub updates: Vec<u64>,
    /// H0's validation success at each.
    pub h0_success: Vec<f64>,
    /// Per sibling name, (repaired, regressed) at each calibration.
    pub siblings: BTreeMap<String, Vec<(usize, usize)>>,
}

impl Nonstationarity {
    /// Siblings whose Delta Solved (repaired minus regressed) changed sign or fell by at least
    /// two tasks between the first calibration and the last.
    pub fn shifted(&self) -> Vec<&str> {
        self.siblings
            .iter()
            .filter(|(_, v)| {
                let (Some(a), Some(b)) = (v.first(), v.last()) else {
                    return false;
                };
                let (da, db) = (a.0 as i64 - a.1 as i64, b.0 as i64 - b.1 as i64);
                da.signum() != db.signum() || db <= da - 2
            })
            .map(|(n, _)| n.as_str())
            .collect()
    }
}

/// The paired view per seed for `harness_s` (empty: no calibrations recorded).
pub fn nonstationarity(run: &Run) -> Vec<Nonstationarity> {
    run.seeds
        .iter()
        .filter_map(|s| {
            let method = "harness_s";
            let checkpoints: Vec<&crate::layout::PairedCheckpoint> = s
                .first_calibration
                .iter()
                .chain(s.methods.get(method).map_or(&[][..], |m| &m.checkpoints))
                .collect();
            if checkpoints.len() < 2 {
                return None;
            }
            let mut siblings: BTreeMap<String, Vec<(usize, usize)>> = BTreeMap::new();
            for (i, c) in checkpoints.iter().enumerate() {
                for (name, v) in &c.siblings {
                    let row = siblings.entry(name.clone()).or_default();
                    row.resize(i, (0, 0));
                    row.push(*v);
                }
            }
            Some(Nonstationarity {
                seed: s.name(),
                method: method.into(),
                updates: checkpoints.iter().map(|c| c.update).collect(),
                h0_success: checkpoints.iter().map(|c| c.h0_success).collect(),
                siblings,
            })
        })
        .collect()
}

/// Figure 1c as text, one table per seed.
pub fn nonstationarity_text(views: &[Nonstationarity]) -> Vec<TextTable> {
    if views.is_empty() {
        return vec![TextTable {
            title: "Figure 1c. Paired outcomes against H0 as the policy trains".into(),
            notes: vec!["Not run: no calibrations of harness_s.".into()],
            ..TextTable::default()
        }];
    }
    views
        .iter()
        .map(|v| {
            let mut header = vec!["Sibling".to_string()];
            header.extend(v.updates.iter().map(|u| format!("update {u}")));
            let mut rows = vec![{
                let mut r = vec!["H0 validation success".to_string()];
                r.extend(v.h0_success.iter().map(|s| format!("{:.1}%", s * 100.0)));
                r
            }];
            for (name, cells) in &v.siblings {
                let mut r = vec![name.clone()];
                r.extend(cells.iter().map(|(rep, reg)| {
                    format!("{:+} (+{rep} / -{reg})", *rep as i64 - *reg as i64)
                }));
                rows.push(r);
            }
            let shifted = v.shifted();
            TextTable {
                title: format!(
                    "Figure 1c. Paired outcomes against H0 as the policy trains ({}, {})",
                    v.method, v.seed
                ),
                header,
                rows,
                notes: vec![
                    "Each cell: Delta Solved against H0 (repaired - regressed validation tasks; a task counts as solved when at least half its paired attempts succeed) at the calibration after that many updates, from calibration/ and train/harness_s/calibrations/.".into(),
                    if shifted.is_empty() {
                        "No sibling's advantage shrank by two tasks or changed sign between the first calibration and the last.".into()
                    } else {
                        format!(
                            "Advantage shrank by at least two tasks or changed sign: {}.",
                            shifted.join(", ")
                        )
                    },
                ],
            }
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::layout::{BehaviourLine, RoutingLine, SeedRun};

    fn seed(behaviour: Vec<BehaviourLine>, routing: Vec<RoutingLine>) -> SeedRun {
        SeedRun {
            dir: "s".into(),
            seed: Some(1),
            config: None,
            methods: BTreeMap::new(),
            test: None,
            rank: None,
            behaviour: Some(behaviour),
            routing: Some(routing),
            first_calibration: Vec::new(),
            evolve: None,
            ..SeedRun::default()
        }
    }

    fn line(method: &str, commit: usize, check: usize, other: usize) -> BehaviourLine {
        let choices = BTreeMap::from([(
            "change".to_string(),
            BTreeMap::from([(
                "after_change".to_string(),
                BTreeMap::from([
                    ("commit".to_string(), commit),
                    ("check".to_string(), check),
                    ("other".to_string(), other),
                ]),
            )]),
        )]);
        BehaviourLine {
            method: method.into(),
            label: None,
            mode: "h0".into(),
            episodes: BTreeMap::from([("change".to_string(), commit + check + other)]),
            choices,
            probe: BTreeMap::new(),
            probe_siblings: BTreeMap::new(),
        }
    }

    fn probed(method: &str, p_good: f64) -> BehaviourLine {
        let mut l = line(method, 0, 0, 0);
        l.probe.insert(
            "change".into(),
            crate::layout::ProbeCell {
                tasks: 5,
                p_good,
                ..Default::default()
            },
        );
        l
    }

    #[test]
    fn probe_table_gives_mean_std_over_seeds_and_the_paired_change_from_initial() {
        let run = Run {
            dir: "r".into(),
            seeds: vec![
                seed(vec![probed("initial", 0.2), probed("grpo", 0.3)], vec![]),
                seed(vec![probed("initial", 0.4), probed("grpo", 0.7)], vec![]),
            ],
            shared_evolve: None,
        };
        let t = table3b(&run);
        assert_eq!(t.methods, ["initial", "grpo"]);
        assert_eq!(t.rows.len(), 1);
        let r = &t.rows[0];
        assert_eq!(r.tasks, 5);
        let grpo = r.p_good[1].unwrap();
        assert!((grpo.mean - 0.5).abs() < 1e-12);
        // Paired changes +0.1 and +0.3: mean +0.2, sample std sqrt(0.02).
        let change = r.change[1].unwrap();
        assert!((change.mean - 0.2).abs() < 1e-12);
        assert!((change.std.unwrap() - 0.02f64.sqrt()).abs() < 1e-12);
        let text = t.to_text().to_markdown();
        assert!(
            text.contains("| change | 5 | 0.300 ± 0.141 | 0.500 ± 0.283 (+0.200 ± 0.141) |"),
            "{text}"
        );
        assert!(
            table3b(&Run {
                dir: "r".into(),
                seeds: vec![seed(vec![line("initial", 1, 1, 0)], vec![])],
                shared_evolve: None,
            })
            .rows
            .is_empty()
        );
    }

    fn route(stage: RankStage, family: &str, name: &str) -> RoutingLine {
        RoutingLine {
            stage,
            method: "harness_s".into(),
            task: format!("{family}-{name}"),
            family: family.into(),
            rank1: name.into(),
            rank1_name: name.into(),
            rank1_is_h0: name == "H0",
        }
    }

    #[test]
    fn shares_pool_seeds_and_count_every_choice_as_reached() {
        let run = Run {
            dir: "r".into(),
            seeds: vec![
                seed(
                    vec![line("initial", 1, 8, 1), line("grpo", 2, 7, 1)],
                    vec![],
                ),
                seed(
                    vec![line("initial", 0, 10, 0), line("grpo", 4, 6, 0)],
                    vec![],
                ),
            ],
            shared_evolve: None,
        };
        let t = table3(&run);
        assert_eq!(t.methods, ["initial", "grpo"]);
        assert_eq!(t.rows.len(), 1);
        let (init, grpo) = (t.rows[0].shares[0], t.rows[0].shares[1]);
        assert_eq!((init.reached, init.good, init.planted), (20, 1, 18));
        assert_eq!((grpo.reached, grpo.good, grpo.planted), (20, 6, 13));
        assert!((grpo.good_rate().unwrap() - 0.3).abs() < 1e-12);
        let text = t.to_text().to_markdown();
        assert!(text.contains("| 30.0 / 65.0 (n=20) |"), "{text}");
        assert!(text.contains("after_change (commit / check)"), "{text}");
    }

    #[test]
    fn nonstationarity_lines_up_calibrations_and_finds_shrinking_advantages() {
        use crate::layout::{MethodRun, PairedCheckpoint};
        let cp = |update: u64, a: (usize, usize), b: (usize, usize)| PairedCheckpoint {
            index: update as u32,
            update,
            is_final: false,
            tasks: 24,
            h0_success: 0.2,
            siblings: BTreeMap::from([("A".to_string(), a), ("B".to_string(), b)]),
            features: Default::default(),
        };
        let mut s = seed(vec![], vec![]);
        s.first_calibration = vec![cp(0, (4, 0), (1, 0))];
        s.methods.insert(
            "harness_s".into(),
            MethodRun {
                checkpoints: vec![cp(4, (3, 1), (1, 0)), cp(8, (1, 2), (2, 0))],
                ..MethodRun::default()
            },
        );
        let run = Run {
            dir: "r".into(),
            seeds: vec![s],
            shared_evolve: None,
        };
        let views = nonstationarity(&run);
        assert_eq!(views.len(), 1);
        assert_eq!(views[0].updates, [0, 4, 8]);
        assert_eq!(views[0].siblings["A"], [(4, 0), (3, 1), (1, 2)]);
        // A: +4 -> -1 (sign change); B: +1 -> +2 (grew).
        assert_eq!(views[0].shifted(), ["A"]);
        let text = nonstationarity_text(&views)[0].to_markdown();
        assert!(
            text.contains("| A | +4 (+4 / -0) | +2 (+3 / -1) | -1 (+1 / -2) |"),
            "{text}"
        );
    }

    #[test]
    fn routing_counts_rank1_by_family_and_stage() {
        let run = Run {
            dir: "r".into(),
            seeds: vec![seed(
                vec![],
                vec![
                    route(RankStage::After, "change", "S-commit"),
                    route(RankStage::After, "change", "S-commit"),
                    route(RankStage::After, "change", "H0"),
                    route(RankStage::After, "quoting", "S-quote"),
                ],
            )],
            shared_evolve: None,
        };
        let rows = routing_by_family(&run);
        assert_eq!(rows.len(), 2);
        assert_eq!(rows[0].family, "change");
        assert_eq!(
            rows[0].choices,
            [("S-commit".to_string(), 2), ("H0".into(), 1)]
        );
        assert_eq!((rows[0].tasks, rows[0].h0), (3, 1));
        let text = routing_text(&rows).to_markdown();
        assert!(
            text.contains("| change | after | 3 | S-commit 67%, H0 33% | 33% |"),
            "{text}"
        );
        assert!(
            text.contains("differs across families: yes (2 distinct)"),
            "{text}"
        );
    }
}
