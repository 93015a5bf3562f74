//! Every built-in sibling can act: each of its hooks fires at least once on its environment's
//! tasks under a scripted policy, both under the sibling's own limits and under the budget
//! `examples/full_pipeline.rs` runs with (8 model calls, environment actions capped to the
//! same number). A sibling whose hooks cannot fire is H0 under another name.

use std::collections::BTreeSet;

use harness_core::{Environment, Harness, Split, Task, ToolCall, Trajectory, run_episode};
use harness_envs::{appworld, dbbench, swe, tau_retail};
use harness_testkit::ScriptedPolicy;
use serde_json::json;

/// The embedded pipeline's per-episode budget (`max_model_calls` in its default config, with
/// `max_env_actions` capped to the same number so that step-budget hooks can fire).
const PIPELINE_CALLS: u32 = 8;

fn pipeline_limits(mut h: Harness) -> Harness {
    h.limits.max_model_calls = h.limits.max_model_calls.min(PIPELINE_CALLS);
    h.limits.max_env_actions = h.limits.max_env_actions.min(PIPELINE_CALLS);
    h
}

fn block_on<F: std::future::Future>(f: F) -> F::Output {
    futures::executor::block_on(f)
}

fn fired(t: &Trajectory) -> BTreeSet<String> {
    t.messages.iter().filter_map(|m| m.hook.clone()).collect()
}

/// Run each script under every sibling (with both budgets) on every task; each hook of each
/// sibling must fire in at least one episode of each budget.
fn check_siblings(
    env: &dyn Environment,
    siblings: &[Harness],
    tasks: &[Task],
    scripts: &[Vec<String>],
) {
    assert!(!siblings.is_empty());
    for sibling in siblings {
        for (budget, harness) in [
            ("its own limits", sibling.clone()),
            ("the pipeline's limits", pipeline_limits(sibling.clone())),
        ] {
            let mut seen = BTreeSet::new();
            for task in tasks {
                for script in scripts {
                    let policy = ScriptedPolicy::new(script.clone());
                    let t = block_on(run_episode(&policy, &harness, env, task, 3)).unwrap();
                    seen.extend(fired(&t));
                }
            }
            for hook in harness.hooks.keys() {
                assert!(
                    seen.contains(hook),
                    "{}: hook `{hook}` never fired under {budget} ({:?})",
                    sibling.name,
                    harness.limits
                );
            }
        }
    }
}

fn call(name: &str, arguments: serde_json::Value) -> String {
    ToolCall::new(name, arguments).to_tool_call_block()
}

#[test]
fn every_dbbench_sibling_hook_fires() {
    let env = dbbench::DbBench::new();
    let task = env
        .tasks(Split::Validation)
        .unwrap()
        .into_iter()
        .find(|t| dbbench::db_task(t).unwrap().is_modification())
        .unwrap();
    let gold = dbbench::db_task(&task).unwrap().gold_sql.unwrap();
    // A failing statement, the change, then statements until the budget runs low.
    let script = vec![
        call(
            dbbench::SQL_TOOL,
            json!({"query": "SELECT nope FROM nowhere"}),
        ),
        call(dbbench::SQL_TOOL, json!({ "query": gold })),
        call(dbbench::SQL_TOOL, json!({"query": "SELECT 1"})),
    ];
    check_siblings(&env, &dbbench::siblings(), &[task], &[script]);
}

#[test]
fn every_app_world_sibling_hook_fires() {
    let env = appworld::AppWorld::new();
    let tasks: Vec<Task> = (0..3).map(|i| env.task(Split::Validation, i)).collect();
    // One page of a listing, then documentation lookups until the budget runs low.
    let script = vec![
        call(
            appworld::tool::CALL_API,
            json!({"app": "mail", "api": "list_emails", "arguments": {"folder": "inbox", "page": 1, "page_size": 1}}),
        ),
        call(appworld::tool::LIST_APPS, json!({})),
    ];
    check_siblings(
        &env,
        &appworld::siblings(),
        &tasks,
        std::slice::from_ref(&script),
    );

    // The control: with 8 model calls but the world's 30 actions left in place (the pipeline's
    // budget before the actions were capped with the calls), the step-budget hook cannot fire.
    let s8 = appworld::siblings()
        .into_iter()
        .find(|h| h.hooks.contains_key("low-budget-completion"))
        .unwrap();
    let mut calls_only = s8.clone();
    calls_only.limits.max_model_calls = PIPELINE_CALLS;
    let policy = ScriptedPolicy::new(script);
    let t = block_on(run_episode(&policy, &calls_only, &env, &tasks[0], 3)).unwrap();
    assert!(!fired(&t).contains("low-budget-completion"));
}

#[test]
fn every_repository_repair_sibling_hook_fires() {
    let env = swe::SweEnv::builtin();
    let task = env.tasks(Split::Train).unwrap().remove(0);
    let failed_edit = call(
        swe::tools::REPLACE,
        json!({"path": "README.md", "old": "no such text", "new": "x"}),
    );
    let view = call(swe::tools::VIEW, json!({"path": "README.md"}));
    // A failing edit and a submission before any test run; and a failing edit, then reading
    // until the budget runs low (a harness without the submission guard ends at the submit).
    let scripts = [
        vec![
            failed_edit.clone(),
            call(swe::tools::SUBMIT, json!({})),
            view.clone(),
        ],
        vec![failed_edit, view],
    ];
    check_siblings(&env, &swe::siblings(), &[task], &scripts);
}

/// The retail data (the folder `HARNESS_TAU2_RETAIL` names), or `None` to skip; under
/// `CI=true` an unset variable fails the test.
fn tau_retail_env() -> Option<tau_retail::TauRetail> {
    let dir = harness_testkit::data::external_data(&harness_testkit::data::TAU2_RETAIL_DATA)?;
    Some(tau_retail::TauRetail::load(dir).unwrap())
}

#[test]
fn every_retail_sibling_hook_fires() {
    use tau_retail::tools::name;
    let Some(env) = tau_retail_env() else { return };
    let task = env.tasks(Split::Validation).unwrap().remove(0);
    let delivered = env
        .data()
        .db
        .orders
        .values()
        .find(|o| o.status == "delivered")
        .unwrap()
        .order_id
        .clone();
    // A lookup that finds nobody, a cancellation the order's status refuses, then order
    // lookups until the budget runs low.
    let script = vec![
        call(
            name::FIND_USER_ID_BY_EMAIL,
            json!({"email": "nobody@example.com"}),
        ),
        call(
            name::CANCEL_PENDING_ORDER,
            json!({"order_id": delivered, "reason": "no longer needed"}),
        ),
        call(name::GET_ORDER_DETAILS, json!({ "order_id": delivered })),
    ];
    let base = env.base_harness();
    check_siblings(&env, &tau_retail::siblings_of(&base), &[task], &[script]);
}

/// The built-in siblings differ from their environment's H0 and from each other.
#[test]
fn siblings_are_distinct_harnesses() {
    for (h0, siblings) in [
        (dbbench::base_harness(), dbbench::siblings()),
        (appworld::base_harness(), appworld::siblings()),
        (swe::base_harness(), swe::siblings()),
        (tau_retail::base_harness(), tau_retail::siblings()),
    ] {
        let mut ids = BTreeSet::new();
        for sibling in &siblings {
            sibling.validate().unwrap();
            assert_ne!(sibling.id(), h0.id(), "{}", sibling.name);
            assert!(
                ids.insert(sibling.id()),
                "{} repeats a sibling",
                sibling.name
            );
        }
    }
}
