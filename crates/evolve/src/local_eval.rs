//! Local evaluation of a candidate (appendix "Directional Harness Evolution: Prompts and
//! Settings"): the host runs the child on at most 30 training tasks, including the targeted
//! failures and at most 10 successful controls, and reports repaired and regressed tasks
//! against the parent; the self-review is written from these measurements only.

use std::collections::BTreeMap;

use harness_core::{Harness, LocalEval, Task, Trajectory};

use crate::direction::Direction;
use crate::editor::Feedback;
use crate::error::Result;
use crate::exec::Executor;
use crate::settings::EvolveSettings;

/// The tasks of one local evaluation.
#[derive(Debug, Clone, PartialEq)]
pub struct LocalPlan {
    /// Tasks to run, targeted failures first, then controls, then other failures.
    pub tasks: Vec<Task>,
    /// How many are targeted failures.
    pub targeted: usize,
    /// How many are successful controls.
    pub controls: usize,
}

/// Choose the tasks: every targeted failure (up to the task budget less the controls that fit),
/// at most `local_eval_controls` of the parent's successes, then other parent failures while
/// the budget lasts (Table 8, "Local evaluation": at most 30 tasks, at most 10 controls).
pub fn plan_local_eval(
    direction: &Direction,
    parent_runs: &[(Task, Trajectory)],
    settings: &EvolveSettings,
) -> LocalPlan {
    let budget = settings.local_eval_tasks;
    let targeted_ids = direction.targeted_tasks();
    let successes: Vec<&Task> = parent_runs
        .iter()
        .filter(|(_, t)| t.is_success())
        .map(|(task, _)| task)
        .collect();
    let controls_wanted = settings
        .local_eval_controls
        .min(successes.len())
        .min(budget);
    let targeted: Vec<&Task> = parent_runs
        .iter()
        .filter(|(task, t)| !t.is_success() && targeted_ids.contains(&task.id))
        .map(|(task, _)| task)
        .take(budget - controls_wanted)
        .collect();
    let controls: Vec<&Task> = successes.into_iter().take(controls_wanted).collect();
    let mut tasks: Vec<Task> = targeted
        .iter()
        .chain(controls.iter())
        .map(|t| (*t).clone())
        .collect();
    for (task, t) in parent_runs {
        if tasks.len() >= budget {
            break;
        }
        if !t.is_success() && !targeted_ids.contains(&task.id) {
            tasks.push(task.clone());
        }
    }
    LocalPlan {
        targeted: targeted.len(),
        controls: controls.len(),
        tasks,
    }
}

/// Run `child` on the plan with the parent's episode seeds and compare task by task.
pub async fn run_local_eval(
    executor: &Executor,
    child: &Harness,
    plan: &LocalPlan,
    parent_success: &BTreeMap<String, bool>,
    round_seed: u64,
) -> Result<(LocalEval, Vec<Trajectory>)> {
    let runs = executor.run(child, &plan.tasks, round_seed).await?;
    let mut eval = LocalEval {
        tasks: plan.tasks.len(),
        targeted_failures: plan.targeted,
        controls: plan.controls,
        ..LocalEval::default()
    };
    let mut solved = 0usize;
    for t in &runs {
        let before = parent_success.get(&t.task_id).copied().unwrap_or(false);
        let after = t.is_success();
        solved += usize::from(after);
        match (before, after) {
            (false, true) => eval.repaired.push(t.task_id.clone()),
            (true, false) => eval.regressed.push(t.task_id.clone()),
            _ => {}
        }
    }
    eval.success_rate = if runs.is_empty() {
        0.0
    } else {
        solved as f64 / runs.len() as f64
    };
    Ok((eval, runs))
}

/// Repaired minus regressed.
pub fn net(eval: &LocalEval) -> i64 {
    eval.repaired.len() as i64 - eval.regressed.len() as i64
}

/// What the editor's revision sees: the figures and the targeted failures still failing.
pub fn feedback(direction: &Direction, eval: &LocalEval) -> Feedback {
    let unrepaired: Vec<String> = direction
        .targeted_tasks()
        .into_iter()
        .filter(|t| !eval.repaired.contains(t))
        .collect();
    let unrepaired_causes = direction
        .causes
        .iter()
        .filter(|c| !c.tasks.iter().any(|t| eval.repaired.contains(t)))
        .map(|c| c.kind.clone())
        .collect();
    Feedback {
        local_eval: eval.clone(),
        unrepaired,
        unrepaired_causes,
    }
}

/// The candidate's self-review, generated from measured outcomes only (the paper's submission
/// instruction: "summarize observed gains, regressions and unresolved causes; never claim unrun
/// tests"): every number and task id below comes from `eval`; nothing is claimed about tasks
/// that were not run.
pub fn self_review(
    direction: &Direction,
    eval: &LocalEval,
    ran: &[String],
    revision: Option<&str>,
) -> String {
    let list = |ids: &[String]| {
        if ids.is_empty() {
            "none".to_string()
        } else {
            ids.join(", ")
        }
    };
    let mut out = format!(
        "Measured on {} training tasks ({} targeted failures, {} successful controls): repaired {} ({}); regressed {} ({}); success rate {:.3}.",
        eval.tasks,
        eval.targeted_failures,
        eval.controls,
        eval.repaired.len(),
        list(&eval.repaired),
        eval.regressed.len(),
        list(&eval.regressed),
        eval.success_rate
    );
    for cause in &direction.causes {
        let run: Vec<&String> = cause.tasks.iter().filter(|t| ran.contains(t)).collect();
        let repaired = run.iter().filter(|t| eval.repaired.contains(t)).count();
        let status = if repaired == 0 { " (unresolved)" } else { "" };
        let not_run = cause.tasks.len() - run.len();
        let not_run = if not_run > 0 {
            format!(", {not_run} not run")
        } else {
            String::new()
        };
        out.push_str(&format!(
            " Cause {}: {repaired} of {} run failed tasks repaired{status}{not_run}.",
            cause.kind,
            run.len()
        ));
    }
    if let Some(revision) = revision {
        out.push(' ');
        out.push_str(revision);
    }
    out
}
