//! Why a direction falls as it does: the rescue diagnostics of each trained method, made from
//! its training files (`train/<method>/groups.jsonl` and `trajectories.jsonl`) and written to
//! `eval/diagnostics.jsonl`, one line per method.
//!
//! The paper trains a rescued trajectory in its generating context (Eqs. 13-16). Whether what
//! rescue rewards carries over to H0 depends on where the sibling's help enters the episode:
//!
//! - **Pre-intervention credit.** A sibling *intervenes* where its context first differs from
//!   what H0 would have shown the policy: at token 0 when its prompt (system prompt, rules,
//!   skills, tool view) renders differently from H0's, else at its first harness message after
//!   the first policy turn (a hook's warning or refusal). The policy tokens generated before that
//!   point were sampled in a context identical to H0's, so a successful rescue gives their
//!   choices, planted mistakes included, positive advantage under H0's context. Reported: the
//!   share of rescue rollouts' policy tokens (all, and those with positive advantage) before the
//!   intervention, how the interventions split (prompt, message, none), and per task family how
//!   many successful rescue rollouts made the family's planted mistake before the intervention
//!   (DBBench's decision points, [`harness_envs::labels::dbbench_decisions`]).
//! - **GRPO's own signal.** Per family, how many of the method's training groups held at least
//!   one H0 success among their initial rollouts: where this is high, plain GRPO has a gradient
//!   of its own and rescue adds little.
//!
//! The third diagnostic, the context lock (the good decision's probability under H0 and under
//! each sibling's context, before and after training), is the decision-point probe of
//! `eval/behaviour.jsonl` run under every declarative sibling as well as H0.

use std::collections::BTreeMap;

use harness_core::{GroupOrigin, Source, Trajectory};
use harness_rollout::{GROUPS_FILE, GroupRecord, TRAJECTORIES_FILE};

pub use harness_report::layout::{DiagnosticsLine, FamilyDiagnostics, InterventionCounts};

use crate::config::Method;
use crate::error::{Error, Result, StageExt};
use crate::setup::Workbench;

/// Where a rescue rollout's context first differs from H0's.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Intervention {
    /// The first prompt already differs (system prompt, rules, skills, tool view): every
    /// policy token was generated in a context H0 never shows.
    Prompt,
    /// The message at this index is the first harness message after the first policy turn (a
    /// hook's message, a refusal).
    Message(usize),
    /// The rollout's contexts never differ from what H0 would show.
    None,
}

/// Where `trajectory` first departs from H0, given the first context H0 renders for the same
/// task (`h0_first_context`, the prompt tokens of an H0 rollout's first turn; `None` when
/// unknown, then the prompt is taken as H0's).
pub fn first_intervention(
    trajectory: &Trajectory,
    h0_first_context: Option<&[u32]>,
) -> Intervention {
    if let (Some(h0), Some(first)) = (h0_first_context, trajectory.turns.first())
        && first.context_tokens.as_slice() != h0
    {
        return Intervention::Prompt;
    }
    let first_policy = trajectory
        .messages
        .iter()
        .position(|m| m.source == Source::Policy);
    let Some(first_policy) = first_policy else {
        return Intervention::None;
    };
    trajectory
        .messages
        .iter()
        .enumerate()
        .skip(first_policy + 1)
        .find(|(_, m)| m.source == Source::Harness)
        .map_or(Intervention::None, |(i, _)| Intervention::Message(i))
}

/// Policy tokens of `trajectory` generated before `intervention` (all of them for
/// [`Intervention::None`], none for [`Intervention::Prompt`]).
pub fn tokens_before(trajectory: &Trajectory, intervention: Intervention) -> usize {
    match intervention {
        Intervention::Prompt => 0,
        Intervention::None => trajectory.policy_tokens(),
        Intervention::Message(at) => trajectory
            .turns
            .iter()
            .filter(|t| t.message_index.is_some_and(|i| i < at))
            .map(|t| t.tokens.len())
            .sum(),
    }
}

/// Whether `trajectory` made a planted choice (the bad one at a DBBench decision point) before
/// `intervention`: the decisions of the episode cut just before the sibling's first message.
pub fn planted_before(trajectory: &Trajectory, intervention: Intervention) -> bool {
    let cut = match intervention {
        Intervention::Prompt => return false,
        Intervention::None => trajectory.messages.len(),
        Intervention::Message(at) => at,
    };
    let mut head = trajectory.clone();
    head.messages.truncate(cut);
    harness_envs::labels::dbbench_decisions(&head)
        .iter()
        .any(|d| d.choice == d.point.good_and_planted().1)
}

/// Eq. 6 within a group: `(R - mean) / max(std, 1e-6)`.
fn advantages(rewards: &[f32]) -> Vec<f64> {
    let n = rewards.len().max(1) as f64;
    let mean = rewards.iter().map(|&r| r as f64).sum::<f64>() / n;
    let var = rewards
        .iter()
        .map(|&r| (r as f64 - mean).powi(2))
        .sum::<f64>()
        / n;
    let std = var.sqrt().max(1e-6);
    rewards.iter().map(|&r| (r as f64 - mean) / std).collect()
}

/// The diagnostics of `method` from its training files.
pub(crate) fn diagnostics(wb: &Workbench, method: Method, label: &str) -> Result<DiagnosticsLine> {
    let run = wb.layout.train(method);
    let groups_path = run.join(GROUPS_FILE);
    let groups: Vec<GroupRecord> =
        harness_report::layout::read_jsonl(&groups_path, "a harness-rollout GroupRecord")
            .at("evaluate")?
            .unwrap_or_default()
            .into_iter()
            .map(|(_, g)| g)
            .collect();
    let family_of: BTreeMap<&str, String> = wb
        .train
        .iter()
        .map(|t| (t.id.as_str(), wb.family_of(t)))
        .collect();
    let mut line = DiagnosticsLine {
        method: method.name().to_string(),
        label: label.to_string(),
        ..DiagnosticsLine::default()
    };
    let path = run.join(TRAJECTORIES_FILE);
    let text = if groups.iter().any(GroupRecord::rescued) {
        std::fs::read_to_string(&path)
            .map_err(|e| Error::input("evaluate", &path, e.to_string()))?
    } else {
        String::new()
    };
    let lines: Vec<&str> = text.lines().filter(|l| !l.trim().is_empty()).collect();
    let read = |n: usize, task: &str, update: u64| -> Result<Trajectory> {
        let Some(text) = lines.get(n) else {
            return Err(Error::input(
                "evaluate",
                &path,
                format!(
                    "{} lines, fewer than groups.jsonl's rollouts (line {} is due for task `{task}` at update {update})",
                    lines.len(),
                    n + 1
                ),
            ));
        };
        let t: Trajectory = serde_json::from_str(text)
            .map_err(|e| Error::input("evaluate", &path, format!("line {}: {e}", n + 1)))?;
        if t.task_id != task {
            return Err(Error::input(
                "evaluate",
                &path,
                format!(
                    "line {} is task `{}`, expected `{task}` (groups.jsonl and trajectories.jsonl disagree)",
                    n + 1,
                    t.task_id
                ),
            ));
        }
        Ok(t)
    };
    // `trajectories.jsonl` holds each group's rollouts, base then rescue, in groups.jsonl's order.
    let mut at = 0usize;
    for g in &groups {
        let base = at..at + g.base_rewards.len();
        let rescue = base.end..base.end + g.rescue_rewards.len();
        at = rescue.end;
        let family = family_of
            .get(g.task_id.as_str())
            .cloned()
            .unwrap_or_else(|| "all".into());
        let f = line.families.entry(family).or_default();
        f.groups += 1;
        if g.origin != GroupOrigin::Mixture && g.base_rewards.iter().any(|&r| r >= 1.0) {
            f.groups_with_h0_success += 1;
        }
        if !(g.rescued() && g.retained) || lines.is_empty() {
            continue;
        }
        f.rescued_groups += 1;
        let h0_context = match base.clone().next() {
            Some(n) => read(n, &g.task_id, g.update)?
                .turns
                .first()
                .map(|t| t.context_tokens.clone()),
            None => None,
        };
        let adv = advantages(&g.rescue_rewards);
        for (j, n) in rescue.enumerate() {
            let t = read(n, &g.task_id, g.update)?;
            let intervention = first_intervention(&t, h0_context.as_deref());
            let before = tokens_before(&t, intervention);
            let tokens = t.policy_tokens();
            line.rescue_rollouts += 1;
            line.policy_tokens += tokens;
            line.tokens_before += before;
            match intervention {
                Intervention::Prompt => line.interventions.prompt += 1,
                Intervention::Message(_) => line.interventions.message += 1,
                Intervention::None => line.interventions.none += 1,
            }
            if adv.get(j).is_some_and(|&a| a > 0.0) {
                line.positive_tokens += tokens;
                line.positive_tokens_before += before;
            }
            if t.is_success() {
                line.successful_rescues += 1;
                f.successful_rescues += 1;
                if t.env == harness_envs::dbbench::ENV_NAME && planted_before(&t, intervention) {
                    f.planted_before_intervention += 1;
                }
            }
        }
    }
    Ok(line)
}

#[cfg(test)]
mod tests {
    use super::*;
    use harness_core::{
        Counts, FinishReason, HarnessId, Outcome, PolicyTurnRecord, Role, Termination,
        TrajectoryMessage,
    };

    fn message(source: Source, role: Role, content: &str, name: Option<&str>) -> TrajectoryMessage {
        TrajectoryMessage {
            role,
            source,
            content: content.into(),
            name: name.map(str::to_string),
            hook: None,
        }
    }

    fn turn(at: usize, context: Vec<u32>, tokens: usize) -> PolicyTurnRecord {
        PolicyTurnRecord {
            message_index: Some(at),
            context_tokens: context,
            tokens: vec![7; tokens],
            logprobs: vec![-0.5; tokens],
            finish: FinishReason::Stop,
            sampling: None,
        }
    }

    fn call(sql: &str) -> String {
        format!(
            "<tool_call>{}</tool_call>",
            serde_json::json!({"name": harness_envs::dbbench::SQL_TOOL, "arguments": {"query": sql}})
        )
    }

    /// A recheck episode: the SELECT, the same SELECT again (the planted mistake), then the
    /// hook's message and the commit.
    fn recheck(first_context: Vec<u32>, with_hook: bool) -> Trajectory {
        let mut messages = vec![
            message(Source::Harness, Role::System, "You answer with SQL.", None),
            message(Source::Task, Role::User, "What is the total?", None),
            message(
                Source::Policy,
                Role::Assistant,
                &call("SELECT SUM(x) FROM t"),
                None,
            ),
            message(
                Source::Environment,
                Role::Tool,
                "[(5,)]",
                Some("execute_sql"),
            ),
            message(
                Source::Policy,
                Role::Assistant,
                &call("SELECT SUM(x) FROM t"),
                None,
            ),
            message(
                Source::Environment,
                Role::Tool,
                "[(5,)]",
                Some("execute_sql"),
            ),
        ];
        let mut turns = vec![turn(2, first_context, 10), turn(4, vec![1, 2, 3], 10)];
        if with_hook {
            let mut hook = message(Source::Harness, Role::User, "Commit the result now.", None);
            hook.hook = Some("low-budget".into());
            messages.push(hook);
        }
        messages.push(message(
            Source::Policy,
            Role::Assistant,
            "<tool_call>{\"name\": \"commit_final_answer\", \"arguments\": {\"answers\": [\"5\"]}}</tool_call>",
            None,
        ));
        turns.push(turn(messages.len() - 1, vec![1, 2, 3, 4], 5));
        Trajectory {
            task_id: "t".into(),
            env: harness_envs::dbbench::ENV_NAME.into(),
            harness_id: HarnessId("h".into()),
            harness_name: "sibling".into(),
            seed: 1,
            policy: "p".into(),
            messages,
            turns,
            final_answer: None,
            outcome: Outcome {
                reward: 1.0,
                details: serde_json::Value::Null,
            },
            termination: Termination::EnvDone,
            counts: Counts::default(),
            policy_version: None,
        }
    }

    #[test]
    fn a_hook_after_the_planted_mistake_leaves_it_in_the_h0_context() {
        let h0 = vec![1, 2];
        let t = recheck(h0.clone(), true);
        let i = first_intervention(&t, Some(&h0));
        assert_eq!(i, Intervention::Message(6));
        // Both SELECT turns (10 + 10 tokens) come before the hook; the commit (5) after it.
        assert_eq!(tokens_before(&t, i), 20);
        assert!(
            planted_before(&t, i),
            "the repeated SELECT is recheck's planted rerun"
        );
    }

    #[test]
    fn a_prompt_that_differs_intervenes_at_token_zero() {
        let t = recheck(vec![9, 9], true);
        let i = first_intervention(&t, Some(&[1, 2]));
        assert_eq!(i, Intervention::Prompt);
        assert_eq!(tokens_before(&t, i), 0);
        assert!(!planted_before(&t, i));
    }

    #[test]
    fn without_any_difference_every_token_is_in_the_h0_context() {
        let t = recheck(vec![1, 2], false);
        let i = first_intervention(&t, Some(&[1, 2]));
        assert_eq!(i, Intervention::None);
        assert_eq!(tokens_before(&t, i), 25);
    }

    #[test]
    fn advantages_follow_eq_6() {
        let a = advantages(&[1.0, 0.0, 0.0, 0.0]);
        assert!((a[0] - 3f64.sqrt()).abs() < 1e-9);
        assert!((a[1] + 1.0 / 3f64.sqrt()).abs() < 1e-9);
        assert!(advantages(&[0.0, 0.0]).iter().all(|&x| x == 0.0));
    }
}
