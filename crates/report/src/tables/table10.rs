//! Table 10: each method's whole pipeline, harness search and policy adaptation together:
//! search rollouts, training rollouts, calibration rollouts, wall seconds of each, and
//! external-model tokens per role.
//!
//! A method's row adds its own `train/<method>/stage_cost.json` to the seed's shared stages it
//! names there (`shared`): evolution (`evolve/stage_cost.json`: the pool a rescue, mixture or
//! router draws on) and the first calibration (`calibration/stage_cost.json`). So Harness-S's
//! search rollouts are evolution's, Meta-Harness's and WHALE's their own searches', and plain
//! GRPO has none. Shared stages are counted in every row that uses them, as each row is the
//! cost of running that method alone.

use std::collections::{BTreeMap, BTreeSet};

use serde::{Deserialize, Serialize};

use crate::layout::{Run, SeedRun, StageCost, Tokens};
use crate::render::TextTable;
use crate::stats::{Stat, fmt_stat};

/// The rollout and seconds kinds of Table 10, in column order.
pub const KINDS: [&str; 3] = ["search", "training", "calibration"];

/// One method's row.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Table10Row {
    /// The method.
    pub method: String,
    /// Its display label.
    pub label: String,
    /// Rollouts by kind ([`KINDS`]) over seeds.
    pub rollouts: BTreeMap<String, Stat>,
    /// Wall seconds by kind over seeds.
    pub seconds: BTreeMap<String, Stat>,
    /// External tokens (prompt + completion) by role over seeds.
    pub tokens: BTreeMap<String, Stat>,
    /// All roles' tokens together over seeds (Table 10's "API tokens").
    pub api_tokens: Stat,
    /// The shared stages counted in the row.
    pub shared: Vec<String>,
    /// Harness-search proposals over seeds: evolution's budget for a method that uses the
    /// pool, every proposal its own searches made (scored or not) for Meta-Harness and WHALE;
    /// `None` without a search.
    #[serde(default)]
    pub proposals: Option<Stat>,
}

/// What a Meta-Harness or WHALE search spent against its budget, summed over its rounds and
/// seeds (`search.jsonl`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct SearchSpend {
    /// The method.
    pub method: String,
    /// Its label.
    pub label: String,
    /// Candidates its searches could score.
    pub budget: usize,
    /// Candidates they scored.
    pub scored: usize,
    /// Proposals that scored nothing (refused, duplicates, slots left empty).
    pub unscored: usize,
    /// Search rounds.
    pub rounds: usize,
    /// Rounds that stopped before their budget was spent.
    pub stopped_early: usize,
}

/// Table 10 of a run.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Table10 {
    /// One row per method with a `stage_cost.json`, in display order.
    pub rows: Vec<Table10Row>,
    /// The search methods' spend against their budgets.
    #[serde(default)]
    pub searches: Vec<SearchSpend>,
    /// Every role with tokens in some row, in name order.
    pub roles: Vec<String>,
    /// Seeds in the run.
    pub seeds: usize,
}

/// One seed's total for `method`: its own stage cost plus the shared stages it names.
pub fn seed_pipeline_cost(seed: &SeedRun, method: &str) -> Option<StageCost> {
    let own = seed.methods.get(method)?.stage_cost.as_ref()?;
    let mut total = StageCost {
        stage: "pipeline".into(),
        shared: own.shared.clone(),
        ..StageCost::default()
    };
    // `calibrate_outcomes`: the first calibration's rollouts and seconds without its tokens
    // (a method that reads its validation outcomes and no profile).
    let outcomes_only = seed.calibration_cost.as_ref().map(|c| StageCost {
        tokens: Default::default(),
        ..c.clone()
    });
    let shared = own.shared.iter().filter_map(|s| match s.as_str() {
        "evolve" => seed.evolve_cost.as_ref(),
        "calibrate" => seed.calibration_cost.as_ref(),
        "calibrate_outcomes" => outcomes_only.as_ref(),
        _ => None,
    });
    for part in std::iter::once(own).chain(shared) {
        if let Some(p) = part.proposals {
            *total.proposals.get_or_insert(0) += p;
        }
        for (k, n) in &part.rollouts {
            *total.rollouts.entry(k.clone()).or_default() += n;
        }
        for (k, s) in &part.seconds {
            *total.seconds.entry(k.clone()).or_default() += s;
        }
        for (role, t) in &part.tokens {
            let sum = total.tokens.entry(role.clone()).or_default();
            sum.calls += t.calls;
            sum.prompt_tokens += t.prompt_tokens;
            sum.completion_tokens += t.completion_tokens;
        }
    }
    Some(total)
}

/// Compute Table 10.
pub fn table10(run: &Run) -> Table10 {
    let mut roles = BTreeSet::new();
    let rows: Vec<Table10Row> = run
        .methods()
        .into_iter()
        .filter_map(|m| {
            let costs: Vec<StageCost> = run
                .seeds
                .iter()
                .filter_map(|s| seed_pipeline_cost(s, &m))
                .collect();
            let first = costs.first()?;
            let by = |get: &dyn Fn(&StageCost) -> f64| {
                Stat::of(&costs.iter().map(get).collect::<Vec<_>>())
            };
            let mut rollouts = BTreeMap::new();
            let mut seconds = BTreeMap::new();
            for kind in KINDS {
                if let Some(s) = by(&|c| c.rollouts.get(kind).copied().unwrap_or(0) as f64) {
                    rollouts.insert(kind.to_string(), s);
                }
                if let Some(s) = by(&|c| c.seconds.get(kind).copied().unwrap_or(0.0)) {
                    seconds.insert(kind.to_string(), s);
                }
            }
            let row_roles: BTreeSet<String> = costs
                .iter()
                .flat_map(|c| c.tokens.keys().cloned())
                .collect();
            let mut tokens = BTreeMap::new();
            for role in row_roles {
                if let Some(s) = by(&|c| c.tokens.get(&role).map_or(0.0, |t| t.total() as f64)) {
                    tokens.insert(role.clone(), s);
                }
                roles.insert(role);
            }
            let api_tokens = by(&|c| c.tokens.values().map(Tokens::total).sum::<u64>() as f64)?;
            let proposals = costs
                .iter()
                .any(|c| c.proposals.is_some())
                .then(|| by(&|c| c.proposals.unwrap_or(0) as f64))
                .flatten();
            Some(Table10Row {
                proposals,
                api_tokens,
                label: run.label(&m),
                shared: first.shared.clone(),
                rollouts,
                seconds,
                tokens,
                method: m,
            })
        })
        .collect();
    let searches = run
        .methods()
        .into_iter()
        .filter_map(|m| {
            let rounds: Vec<&crate::layout::SearchRound> = run
                .seeds
                .iter()
                .filter_map(|s| s.methods.get(&m))
                .flat_map(|r| &r.searches)
                .collect();
            (!rounds.is_empty()).then(|| SearchSpend {
                label: run.label(&m),
                budget: rounds.iter().map(|r| r.budget).sum(),
                scored: rounds.iter().map(|r| r.scored()).sum(),
                unscored: rounds.iter().map(|r| r.rejected + r.empty).sum(),
                rounds: rounds.len(),
                stopped_early: rounds.iter().filter(|r| r.stopped_unscored).count(),
                method: m,
            })
        })
        .collect();
    Table10 {
        rows,
        searches,
        roles: roles.into_iter().collect(),
        seeds: run.seeds.len(),
    }
}

impl Table10 {
    /// As text.
    pub fn to_text(&self) -> TextTable {
        let n = self.seeds;
        let mut header = vec!["Method".to_string()];
        for kind in KINDS {
            header.push(format!("{} rollouts", capitalise(kind)));
        }
        for kind in KINDS {
            header.push(format!("{} s", capitalise(kind)));
        }
        for role in &self.roles {
            header.push(format!("{role} tokens"));
        }
        header.push("API tokens".into());
        let rows = self
            .rows
            .iter()
            .map(|r| {
                let mut cells = vec![r.label.clone()];
                for kind in KINDS {
                    cells.push(fmt_stat(r.rollouts.get(kind), 1.0, 0, n));
                }
                for kind in KINDS {
                    cells.push(fmt_stat(r.seconds.get(kind), 1.0, 1, n));
                }
                for role in &self.roles {
                    cells.push(
                        r.tokens
                            .get(role)
                            .map_or_else(|| "0".into(), |s| fmt_stat(Some(s), 1.0, 0, n)),
                    );
                }
                cells.push(fmt_stat(Some(&r.api_tokens), 1.0, 0, n));
                cells
            })
            .collect();
        let mut notes = vec![
            "Each row is the whole pipeline of one method, from the stage_cost.json files: its own training or search stage plus the seed's shared stages it uses (evolution for a method that rescues, mixes or routes with the pool; the first calibration for one that reads it), so shared stages count in every row that uses them. Search rollouts: evolution's, or a Meta-Harness / WHALE search's; training rollouts include discarded base attempts; calibration rollouts are the paired validation runs of the first calibration and of re-anchoring.".to_string(),
            "Seconds are wall-clock, not GPU-hours. Tokens are prompt + completion tokens that the external model reported per role (0 with the offline built-in roles).".to_string(),
        ];
        if n > 1 {
            notes.push(format!(
                "Mean ± sample standard deviation (n - 1) over {n} seeds."
            ));
        }
        let budgets: Vec<String> = self
            .rows
            .iter()
            .filter_map(|r| {
                let p = r.proposals.as_ref()?;
                Some(format!("{} {}", r.label, fmt_stat(Some(p), 1.0, 0, n)))
            })
            .collect();
        if !budgets.is_empty() {
            notes.push(format!(
                "Search proposals (evolution's budget for a method that uses the pool; every proposal its own searches made, scored, refused or left empty, for Meta-Harness and WHALE; the paper gives Meta-Harness about twice Harness-S's search rollouts, Table 10: 8,000 against 4,010): {}.",
                budgets.join("; ")
            ));
        }
        let spends: Vec<String> = self
            .searches
            .iter()
            .map(|s| {
                let stopped = if s.stopped_early > 0 {
                    format!(
                        "; {} of {} search rounds stopped early, after a run of proposals that scored nothing (search.max_unscored_in_a_row)",
                        s.stopped_early, s.rounds
                    )
                } else {
                    String::new()
                };
                format!(
                    "{}: {} of a budget of {} candidates scored, {} proposals scored nothing (refused, duplicates or left empty; they run no rollout and spend no budget){stopped}",
                    s.label, s.scored, s.budget, s.unscored
                )
            })
            .collect();
        if !spends.is_empty() {
            notes.push(format!(
                "Search budgets as spent (search.jsonl, over every round{}): {}.",
                if n > 1 { " and seed" } else { "" },
                spends.join("; ")
            ));
        }
        if self.rows.is_empty() {
            notes.push("No stage_cost.json under train/<method>/.".into());
        }
        TextTable {
            title: "Table 10. Full-pipeline resources: harness search and policy adaptation".into(),
            header,
            rows,
            notes,
        }
    }
}

fn capitalise(s: &str) -> String {
    let mut c = s.chars();
    c.next()
        .map(|f| f.to_uppercase().chain(c).collect())
        .unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::layout::{MethodRun, SearchRound, SeedRun};

    fn round(budget: usize, scored: usize, rejected: usize, stopped: bool) -> SearchRound {
        SearchRound {
            round: 1,
            budget,
            candidates: vec![serde_json::Value::Null; scored + 1],
            rejected,
            empty: 0,
            stopped_unscored: stopped,
            rollouts: (scored as u64 + 1) * 4,
        }
    }

    #[test]
    fn a_search_that_stopped_early_says_what_it_scored_of_its_budget() {
        let method = |searches: Vec<SearchRound>| MethodRun {
            stage_cost: Some(StageCost {
                stage: "search".into(),
                proposals: Some(20),
                ..StageCost::default()
            }),
            searches,
            ..MethodRun::default()
        };
        let run = Run {
            seeds: vec![SeedRun {
                methods: BTreeMap::from([
                    (
                        "meta_harness".to_string(),
                        method(vec![round(50, 10, 10, true)]),
                    ),
                    (
                        "whale".to_string(),
                        method(vec![round(2, 2, 0, false), round(1, 1, 3, false)]),
                    ),
                    ("grpo".to_string(), method(Vec::new())),
                ]),
                ..SeedRun::default()
            }],
            ..Run::default()
        };
        let t = table10(&run);
        assert_eq!(t.searches.len(), 2, "{:?}", t.searches);
        let meta = t
            .searches
            .iter()
            .find(|s| s.method == "meta_harness")
            .unwrap();
        assert_eq!(
            (meta.budget, meta.scored, meta.unscored, meta.stopped_early),
            (50, 10, 10, 1)
        );
        let whale = t.searches.iter().find(|s| s.method == "whale").unwrap();
        assert_eq!(
            (whale.budget, whale.scored, whale.unscored, whale.rounds),
            (3, 3, 3, 2)
        );
        let text = t.to_text().notes.join("\n");
        assert!(
            text.contains("10 of a budget of 50 candidates scored, 10 proposals scored nothing")
                && text.contains("1 of 1 search rounds stopped early"),
            "{text}"
        );
        assert!(!text.contains("2 search rounds stopped early"), "{text}");
    }
}
