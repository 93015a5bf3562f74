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

use harness_core::objective::{Intervention, first_intervention};
use harness_core::{GroupOrigin, Harness, Source, Task, Trajectory};
use harness_pool::SiblingPool;
use harness_rollout::{GROUPS_FILE, GroupRecord, TRAJECTORIES_FILE};

pub use harness_report::layout::{DiagnosticsLine, FamilyDiagnostics, InterventionCounts};

use crate::config::Method;
use crate::error::{Error, Result, StageExt};
use crate::setup::Workbench;

/// Where `trajectory` (generated under `sibling`) first departs from what H0 would have shown,
/// by [`harness_core::objective::first_intervention`], the definition the `masked` rescue
/// objective uses. An agent program renders its own prompts, which that definition counts as a
/// difference at token 0 without looking; here its first prompt is compared with H0's
/// (`h0_first_context`, the prompt tokens of an H0 rollout's first turn on the same task), and
/// when they agree its first hook-marked message (a program marks its own hooks, see
/// harness-external's proxy) is the intervention.
pub fn intervention_of(
    trajectory: &Trajectory,
    h0: &Harness,
    sibling: &Harness,
    task: &Task,
    h0_first_context: Option<&[u32]>,
) -> Result<Option<Intervention>> {
    if !(sibling.is_external() || h0.is_external()) {
        return first_intervention(trajectory, h0, sibling, task).at("evaluate");
    }
    if let (Some(h0_context), Some(first)) = (h0_first_context, trajectory.turns.first())
        && first.context_tokens.as_slice() != h0_context
    {
        return Ok(Some(Intervention::Prompt {
            component: "program".into(),
        }));
    }
    Ok(trajectory
        .messages
        .iter()
        .enumerate()
        .find(|(_, m)| m.source == Source::Harness && m.hook.is_some())
        .map(|(i, m)| Intervention::Message {
            message: i,
            hook: m.hook.clone().unwrap_or_default(),
        }))
}

/// Policy tokens of `trajectory` generated before `intervention` (all of them when there is
/// none).
pub fn tokens_before(trajectory: &Trajectory, intervention: Option<&Intervention>) -> usize {
    intervention.map_or_else(
        || trajectory.policy_tokens(),
        |i| i.tokens_before(trajectory),
    )
}

/// Whether `trajectory` made a planted choice (the bad one at a DBBench decision point) before
/// `intervention`: the decisions of the episode cut just before the sibling's first message.
pub fn planted_before(trajectory: &Trajectory, intervention: Option<&Intervention>) -> bool {
    let cut = match intervention {
        Some(Intervention::Prompt { .. }) => return false,
        None => trajectory.messages.len(),
        Some(Intervention::Message { message, .. }) => *message,
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
pub(crate) fn diagnostics(
    wb: &Workbench,
    pool: &SiblingPool,
    method: Method,
    label: &str,
) -> Result<DiagnosticsLine> {
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
    let task_of: BTreeMap<&str, &Task> = wb.train.iter().map(|t| (t.id.as_str(), t)).collect();
    let h0 = pool.base();
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
        let task = task_of.get(g.task_id.as_str()).copied();
        for (j, n) in rescue.enumerate() {
            let t = read(n, &g.task_id, g.update)?;
            // H0 rescue's rollouts, and any whose harness or task is unknown here, are H0's.
            let intervention = match (pool.get(&t.harness_id), task) {
                (Some(sibling), Some(task)) if t.harness_id != *pool.base_id() => {
                    intervention_of(&t, h0, sibling, task, h0_context.as_deref())?
                }
                _ => None,
            };
            let before = tokens_before(&t, intervention.as_ref());
            let tokens = t.policy_tokens();
            line.rescue_rollouts += 1;
            line.policy_tokens += tokens;
            line.tokens_before += before;
            match intervention {
                Some(Intervention::Prompt { .. }) => line.interventions.prompt += 1,
                Some(Intervention::Message { .. }) => line.interventions.message += 1,
                None => line.interventions.none += 1,
            }
            if adv.get(j).is_some_and(|&a| a > 0.0) {
                line.positive_tokens += tokens;
                line.positive_tokens_before += before;
            }
            if t.is_success() {
                line.successful_rescues += 1;
                f.successful_rescues += 1;
                if t.env == harness_envs::dbbench::ENV_NAME
                    && planted_before(&t, intervention.as_ref())
                {
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

    fn harnesses() -> (Harness, Harness, Task) {
        let h0 = Harness::new("h0", "You answer with SQL.");
        let mut sibling = h0.clone();
        sibling.name = "low-budget".into();
        sibling.hooks.insert(
            "low-budget".into(),
            serde_json::from_value(serde_json::json!({
                "event": "after_tool",
                "condition": "remaining_steps_lte",
                "parameters": {"threshold": 3},
                "action": "warn",
                "message": "Commit the result now."
            }))
            .unwrap(),
        );
        let task = Task::new(
            "t",
            harness_envs::dbbench::ENV_NAME,
            harness_core::Split::Train,
            "What is the total?",
            1,
        );
        (h0, sibling, task)
    }

    #[test]
    fn a_hook_after_the_planted_mistake_leaves_it_in_the_h0_context() {
        let (h0, sibling, task) = harnesses();
        let t = recheck(vec![1, 2], true);
        let i = intervention_of(&t, &h0, &sibling, &task, Some(&[1, 2])).unwrap();
        assert!(
            matches!(i, Some(Intervention::Message { message: 6, .. })),
            "{i:?}"
        );
        // Both SELECT turns (10 + 10 tokens) come before the hook; the commit (5) after it.
        assert_eq!(tokens_before(&t, i.as_ref()), 20);
        assert!(
            planted_before(&t, i.as_ref()),
            "the repeated SELECT is recheck's planted rerun"
        );
    }

    #[test]
    fn a_prompt_that_differs_intervenes_at_token_zero() {
        let (h0, mut sibling, task) = harnesses();
        sibling.hooks.clear();
        sibling.prompt.system = format!("{} Always quote names.", sibling.prompt.system);
        let t = recheck(vec![9, 9], true);
        let i = intervention_of(&t, &h0, &sibling, &task, Some(&[1, 2])).unwrap();
        assert!(matches!(i, Some(Intervention::Prompt { .. })), "{i:?}");
        assert_eq!(tokens_before(&t, i.as_ref()), 0);
        assert!(!planted_before(&t, i.as_ref()));
    }

    #[test]
    fn a_program_is_compared_by_its_first_prompt_and_its_marked_hooks() {
        let (h0, mut program, task) = harnesses();
        program.hooks.clear();
        program.program = Some(
            serde_json::from_value(
                serde_json::json!({"command": ["python3", "agent.py"], "timeout_s": 60.0}),
            )
            .unwrap(),
        );
        let t = recheck(vec![1, 2], true);
        let same = intervention_of(&t, &h0, &program, &task, Some(&[1, 2])).unwrap();
        assert!(
            matches!(same, Some(Intervention::Message { message: 6, .. })),
            "{same:?}"
        );
        let other = intervention_of(&t, &h0, &program, &task, Some(&[3])).unwrap();
        assert!(
            matches!(other, Some(Intervention::Prompt { .. })),
            "{other:?}"
        );
        let quiet = intervention_of(
            &recheck(vec![1, 2], false),
            &h0,
            &program,
            &task,
            Some(&[1, 2]),
        )
        .unwrap();
        assert_eq!(quiet, None);
    }

    #[test]
    fn without_any_difference_every_token_is_in_the_h0_context() {
        let (h0, _, task) = harnesses();
        let t = recheck(vec![1, 2], false);
        let i = intervention_of(&t, &h0, &h0, &task, Some(&[1, 2])).unwrap();
        assert_eq!(i, None);
        assert_eq!(tokens_before(&t, None), 25);
    }

    #[test]
    fn advantages_follow_eq_6() {
        let a = advantages(&[1.0, 0.0, 0.0, 0.0]);
        assert!((a[0] - 3f64.sqrt()).abs() < 1e-9);
        assert!((a[1] + 1.0 / 3f64.sqrt()).abs() < 1e-9);
        assert!(advantages(&[0.0, 0.0]).iter().all(|&x| x == 0.0));
    }
}
