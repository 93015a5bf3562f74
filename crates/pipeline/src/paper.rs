//! How a run configuration differs from the paper: every setting whose value is not the
//! paper's, and every setting the paper does not give, each with the reason
//! (`harness-s run --preset paper --explain` prints the list).
//!
//! The paper's values are the ones it states: Table 8 (evolution and its execution limits),
//! Table 9 (40 updates of 8 tasks at G = 8), Table 6 (split sizes per environment), the
//! evaluation protocol (three rollouts per task, three router ranks, three randomized runs) and
//! its comparison rows (Tables 1 and 2). What it leaves open (the learning rate, the rollout
//! temperature, the voter count, WHALE's alternations and SFT step, the development tasks per
//! round) is listed as "not given" with the value this run uses.

use std::fmt;

use crate::config::{ExecutionLimits, PAPER_META_HARNESS_BUDGET_RATIO, Preset, RunConfig};
use crate::methods::Method;

/// One setting that is not the paper's, or that the paper does not give.
#[derive(Debug, Clone, PartialEq)]
pub struct PaperDifference {
    /// The dotted setting (`policy.learning_rate`).
    pub field: String,
    /// Its value in this run.
    pub value: String,
    /// The paper's value, or `not given`.
    pub paper: String,
    /// Why the run differs, or what it uses where the paper is silent.
    pub reason: String,
}

impl fmt::Display for PaperDifference {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{}: {} (paper: {}): {}",
            self.field, self.value, self.paper, self.reason
        )
    }
}

/// The paper's three environments (Table 6).
const PAPER_ENVS: [&str; 3] = ["appworld", "dbbench", "swe"];

/// Every difference of `cfg` from the paper, in settings order.
pub fn paper_differences(cfg: &RunConfig) -> Vec<PaperDifference> {
    let mut out = Vec::new();
    let mut push = |field: &str, value: String, paper: &str, reason: &str| {
        out.push(PaperDifference {
            field: field.into(),
            value,
            paper: paper.into(),
            reason: reason.into(),
        })
    };
    let paper = RunConfig::preset(Preset::Paper);
    if !PAPER_ENVS.contains(&cfg.env.name.as_str()) {
        push(
            "env.name",
            cfg.env.name.clone(),
            "appworld, dbbench or swe",
            "not one of the paper's environments: `default` is the embedded model organism (harness-warmstart), `tau-retail` tau2-bench's retail world",
        );
    } else {
        // Table 6's split sizes for the environment (the paper preset sets them per env).
        let mut sized = paper.clone();
        if sized
            .set("env.name", &format!("\"{}\"", cfg.env.name))
            .is_ok()
        {
            for (field, value, want) in [
                (
                    "env.train_tasks",
                    cfg.env.train_tasks,
                    sized.env.train_tasks,
                ),
                (
                    "env.validation_tasks",
                    cfg.env.validation_tasks,
                    sized.env.validation_tasks,
                ),
                ("env.test_tasks", cfg.env.test_tasks, sized.env.test_tasks),
            ] {
                if value != want {
                    push(
                        field,
                        value.to_string(),
                        &want.to_string(),
                        "a smaller split than Table 6's",
                    );
                }
            }
        }
    }
    match &cfg.policy.model {
        None => push(
            "policy.model",
            "the embedded tiny policy".into(),
            "Qwen3.5-4B or Qwen3.5-9B",
            "a fresh clone trains in minutes on a CPU; give a checkpoint to train a real model",
        ),
        Some(m) => push(
            "policy.model",
            m.clone(),
            "Qwen3.5-4B or Qwen3.5-9B",
            "a checkpoint of your choice: the paper's are Qwen3.5 models",
        ),
    }
    if cfg.seeds != 3 {
        push(
            "seeds",
            cfg.seeds.to_string(),
            "3",
            "the paper averages three independent randomized runs",
        );
    }
    push(
        "policy.learning_rate",
        cfg.policy.learning_rate.to_string(),
        "not given",
        "the paper states no learning rate; the quick preset's tiny policy needs 1e-3 to move in 16 updates, the paper preset uses 1e-6 for 4B-scale models",
    );
    push(
        "rollout.temperature",
        cfg.rollout.temperature.to_string(),
        "not given",
        "the paper states no rollout temperature; 1.0 samples the policy as it is",
    );
    push(
        "roles.voters",
        cfg.roles.voters.to_string(),
        "not given (V voters, Eq. 9)",
        "the paper names no voter count",
    );
    if cfg.roles.llm.is_none() {
        push(
            "roles.llm",
            "none (built-in offline roles)".into(),
            "LLM analyst and editor (GLM-5.3, Table 8), several LLM voters, an LLM labeller (Table 3)",
            "without an endpoint the analyst, editor, Meta-Harness proposer, Table 3 labeller, profiler and voters are the built-in rule-based ones (Table 3 then has the rule labeller's table only)",
        );
    }
    push(
        "search.whale_rounds",
        cfg.search.whale_rounds.to_string(),
        "not given",
        "the paper gives no alternation count for WHALE; the paper preset alternates at the re-anchoring cadence (40 updates, every 10)",
    );
    push(
        "search.whale_sft_learning_rate",
        cfg.search.whale_sft_learning_rate.to_string(),
        "not given",
        "the paper gives no SFT step size for WHALE",
    );
    push(
        "search.max_unscored_in_a_row",
        cfg.search.max_unscored_in_a_row.to_string(),
        "not given",
        "the paper does not say when a search whose proposer repeats itself stops; here a run of proposals that score nothing (refused, duplicates, empty) ends it before its budget is spent",
    );
    push(
        "search.history_candidates",
        format!(
            "{} candidates, {} traces each, {} characters per trace",
            cfg.search.history_candidates,
            cfg.search.history_traces,
            cfg.search.history_trace_chars
        ),
        "not bounded (the proposer reads every candidate from files)",
        "a proposer prompt is bounded: the best-ranked candidates with a sample of their traces (search.history_candidates, search.history_traces, search.history_trace_chars); every candidate is listed with its score",
    );
    push(
        "evolve.train_tasks_per_round",
        cfg.evolve.train_tasks_per_round.to_string(),
        "not given (sampled from the training set, Table 8)",
        "development tasks scored per evolution round and per search round",
    );
    if cfg.env.execution_limits != ExecutionLimits::Paper {
        push(
            "env.execution_limits",
            "harness".into(),
            "paper (Table 8: 32 model calls, 30 environment actions, 65,532 context and 8,192 output tokens per call)",
            "each harness keeps its own limits (the embedded default's compact H0 keeps episodes short)",
        );
    }
    let same = |a: f64, b: f64| (a - b).abs() <= 1e-9 * b.abs().max(1.0);
    if !same(
        cfg.search.meta_harness_budget_ratio,
        PAPER_META_HARNESS_BUDGET_RATIO,
    ) || cfg.search.proposals.is_some()
    {
        push(
            "search.meta_harness_budget_ratio",
            match cfg.search.proposals {
                Some(p) => format!("{p} scored candidates (search.proposals)"),
                None => format!("{:.3}", cfg.search.meta_harness_budget_ratio),
            },
            &format!("{PAPER_META_HARNESS_BUDGET_RATIO:.3} (Table 10: 8,000 / 4,010)"),
            "Meta-Harness's search budget is not the paper's multiple of evolution's",
        );
    }
    let numbers: [(&str, String, String, &str); 10] = [
        (
            "train.updates",
            cfg.train.updates.to_string(),
            paper.train.updates.to_string(),
            "Table 9: 40 updates",
        ),
        (
            "train.group_size",
            cfg.train.group_size.to_string(),
            paper.train.group_size.to_string(),
            "Table 9: G = 8 (Top-8 rescue)",
        ),
        (
            "train.batch_tasks",
            cfg.train.batch_tasks.to_string(),
            paper.train.batch_tasks.to_string(),
            "Table 9: 8 tasks per update (2,560 plain-GRPO rollouts)",
        ),
        (
            "calibration.every",
            cfg.calibration.every.to_string(),
            paper.calibration.every.to_string(),
            "re-anchoring every 10 updates (four stages, Table 2)",
        ),
        (
            "evolve.proposal_budgets",
            format!("{:?}", cfg.evolve.proposal_budgets),
            format!("{:?}", paper.evolve.proposal_budgets),
            "Table 8: budgets 7 / 8 / 8",
        ),
        (
            "evolve.parent_slots",
            cfg.evolve.parent_slots.to_string(),
            paper.evolve.parent_slots.to_string(),
            "Table 8: B = 4",
        ),
        (
            "evolve.local_eval_tasks",
            cfg.evolve.local_eval_tasks.to_string(),
            paper.evolve.local_eval_tasks.to_string(),
            "Table 8: at most 30 local tasks",
        ),
        (
            "evolve.local_eval_controls",
            cfg.evolve.local_eval_controls.to_string(),
            paper.evolve.local_eval_controls.to_string(),
            "Table 8: at most 10 successful controls",
        ),
        (
            "eval.k",
            cfg.eval.k.to_string(),
            paper.eval.k.to_string(),
            "Pass@3 / Avg@3",
        ),
        (
            "eval.ranks",
            cfg.eval.ranks.to_string(),
            paper.eval.ranks.to_string(),
            "Table 5: three router ranks",
        ),
    ];
    for (field, value, want, why) in numbers {
        if value != want {
            push(
                field,
                value,
                &want,
                &format!("smaller than the paper's ({why})"),
            );
        }
    }
    if cfg.eval.harnesses.is_empty() {
        push(
            "eval.harnesses",
            "none".into(),
            "Figure 4: Claude Code and OpenClaw",
            "no harness outside the training pool is evaluated, so the run has no Figure 4 (name \"unseen\" on the embedded default, or harness files)",
        );
    }
    let missing: Vec<&str> = Method::paper_rows()
        .into_iter()
        .filter(|m| !cfg.train.methods.contains(m))
        .map(Method::name)
        .collect();
    if !missing.is_empty() {
        push(
            "train.methods",
            format!("{} methods", cfg.train.methods.len()),
            "every row of Tables 1 and 2",
            &format!("leaves out {}", missing.join(", ")),
        );
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn fields(d: &[PaperDifference]) -> Vec<&str> {
        d.iter().map(|d| d.field.as_str()).collect()
    }

    #[test]
    fn the_paper_preset_lists_only_what_the_paper_does_not_give_or_this_machine_cannot_be() {
        let mut cfg = RunConfig::preset(Preset::Paper);
        cfg.set("env.name", "\"appworld\"").unwrap();
        let d = paper_differences(&cfg);
        let f = fields(&d);
        // Every row of Tables 1 and 2, Table 8's limits, Meta-Harness at its budget: none of
        // these is a difference.
        for not in [
            "train.methods",
            "env.execution_limits",
            "search.meta_harness_budget_ratio",
            "train.updates",
            "env.train_tasks",
        ] {
            assert!(!f.contains(&not), "{not} listed: {f:?}");
        }
        // What the paper leaves open is listed with the value used.
        for open in [
            "policy.learning_rate",
            "rollout.temperature",
            "roles.voters",
            "search.whale_rounds",
            "search.whale_sft_learning_rate",
            "search.max_unscored_in_a_row",
        ] {
            let row = d.iter().find(|r| r.field == open).unwrap();
            assert!(row.paper.starts_with("not given"), "{row}");
        }
        assert!(f.contains(&"seeds") && f.contains(&"roles.llm"), "{f:?}");
        assert!(cfg.train.methods.contains(&Method::MetaHarness));
        assert!(!cfg.train.methods.contains(&Method::DynamicSampling));
        assert_eq!(
            cfg.env.execution_limits.limits().unwrap().max_model_calls,
            32
        );
    }

    #[test]
    fn the_quick_preset_says_how_it_is_smaller() {
        let d = paper_differences(&RunConfig::preset(Preset::Quick));
        let f = fields(&d);
        for field in [
            "env.name",
            "policy.model",
            "env.execution_limits",
            "train.updates",
            "train.group_size",
            "train.methods",
            "evolve.proposal_budgets",
        ] {
            assert!(f.contains(&field), "{field} missing: {f:?}");
        }
        let methods = d.iter().find(|r| r.field == "train.methods").unwrap();
        assert!(methods.reason.contains("meta_harness"), "{methods}");
    }
}
