//! The built-in analyst finds the planted cause on trajectories of each environment's failure
//! modes. Every trajectory is a real episode of a built-in environment driven by a scripted
//! policy that plants one mistake, so the verifier details are the environment's own.

use harness_core::{
    Environment, Harness, Policy, PolicyRequest, Role, Split, Task, ToolCall, Trajectory,
    run_episode,
};
use harness_envs::{appworld, dbbench, swe};
use harness_evolve::analyst::{analyse_rules, diagnose};
use harness_testkit::FnPolicy;
use serde_json::{Value, json};

fn call(name: &str, args: Value) -> String {
    ToolCall::new(name, args).to_tool_call_block()
}

fn api(app: &str, api: &str, args: Value) -> String {
    call(
        "call_api",
        json!({"app": app, "api": api, "arguments": args}),
    )
}

/// A policy that says `turns[k]` at its k-th turn (the last one again after that); each turn
/// may read the request (to find the user's email, say).
/// One scripted turn.
type Turn = Box<dyn Fn(&PolicyRequest) -> String + Send + Sync>;

fn scripted(turns: Vec<Turn>) -> impl Policy {
    FnPolicy::new("planted", move |request: &PolicyRequest| {
        let k = request
            .messages
            .iter()
            .filter(|m| m.role == Role::Assistant)
            .count();
        turns[k.min(turns.len() - 1)](request)
    })
}

fn say(text: String) -> Turn {
    Box::new(move |_| text.clone())
}

async fn episode(
    env: &dyn Environment,
    harness: &Harness,
    task: &Task,
    policy: &dyn Policy,
) -> Trajectory {
    let t = run_episode(policy, harness, env, task, 7).await.unwrap();
    assert!(
        !t.is_success(),
        "the planted mistake should fail {}:\n{}",
        task.id,
        t.transcript()
    );
    t
}

fn kind_of(t: &Trajectory) -> &'static str {
    diagnose(t).map_or("unresolved", |f| f.kind)
}

fn appworld_task(template: &str) -> Vec<Task> {
    appworld::AppWorld::new()
        .tasks(Split::Train)
        .unwrap()
        .into_iter()
        .filter(|t| t.metadata["template"] == template)
        .collect()
}

#[tokio::test]
async fn appworld_failure_modes() {
    let env = appworld::AppWorld::new();
    let h0 = appworld::base_harness();
    // Stopped paging: one full page of the inbox, then an answer.
    let mut found_full_page = false;
    for task in appworld_task("mail_count").into_iter().take(12) {
        let policy = scripted(vec![
            say(api(
                "mail",
                "list_emails",
                json!({"folder": "inbox", "page": 1}),
            )),
            say(call("complete_task", json!({"answer": "999"}))),
        ]);
        let t = episode(&env, &h0, &task, &policy).await;
        let obs = &t
            .messages
            .iter()
            .find(|m| m.role == Role::Tool)
            .unwrap()
            .content;
        let full = serde_json::from_str::<Value>(obs)
            .ok()
            .and_then(|v| v["emails"].as_array().map(|a| a.len() == 5))
            == Some(true);
        if full {
            found_full_page = true;
            assert_eq!(kind_of(&t), "stopped-paging", "{}", t.transcript());
            break;
        }
    }
    assert!(found_full_page, "no mail task with a full first page");

    // Union instead of intersection: titles outside the requested intersection.
    let task = appworld_task("liked_intersection").remove(0);
    let policy = scripted(vec![say(call(
        "complete_task",
        json!({"answer": "Song That Is Not There, Another Extra"}),
    ))]);
    let t = episode(&env, &h0, &task, &policy).await;
    assert_eq!(kind_of(&t), "union-not-intersection", "{}", t.transcript());

    // Budget before completion: documentation reads until the action limit.
    let mut tight = h0.clone();
    tight.limits.max_env_actions = 3;
    let policy = scripted(vec![say(call("api_docs_list_apps", json!({})))]);
    let t = episode(&env, &tight, &task, &policy).await;
    assert_eq!(
        kind_of(&t),
        "budget-before-completion",
        "{}",
        t.transcript()
    );

    // A text answer instead of complete_task.
    let policy = scripted(vec![say("The answer is 3.".into())]);
    let t = episode(&env, &h0, &task, &policy).await;
    assert_eq!(kind_of(&t), "finished-without-submit", "{}", t.transcript());

    // An API call with wrong arguments before any documentation.
    let policy = scripted(vec![
        say(api("music", "show_playlist", json!({"playlist": "x"}))),
        say(call("complete_task", json!({"answer": "x"}))),
    ]);
    let t = episode(&env, &h0, &task, &policy).await;
    assert_eq!(kind_of(&t), "call-without-docs", "{}", t.transcript());

    // The same failing call twice (after reading the documentation).
    let policy = scripted(vec![
        say(call(
            "api_docs_show_api",
            json!({"app": "music", "api": "show_playlist"}),
        )),
        say(api("music", "show_playlist", json!({"playlist": "x"}))),
        say(api("music", "show_playlist", json!({"playlist": "x"}))),
        say(call("complete_task", json!({"answer": "x"}))),
    ]);
    let t = episode(&env, &h0, &task, &policy).await;
    assert_eq!(kind_of(&t), "repeated-failing-call", "{}", t.transcript());

    // A stale or made-up reset code.
    let task = appworld_task("account_recovery").remove(0);
    let app = task.metadata["spec"]["app"]
        .as_str()
        .unwrap_or("payments")
        .to_string();
    let email = |r: &PolicyRequest| {
        let text: String = r
            .messages
            .iter()
            .map(|m| m.content.clone())
            .collect::<Vec<_>>()
            .join("\n");
        regex::Regex::new(r"\(([^()\s]+@[^()\s]+)\)")
            .unwrap()
            .captures(&text)
            .map(|c| c[1].to_string())
            .unwrap_or_default()
    };
    let app2 = app.clone();
    let policy = scripted(vec![
        say(call("api_docs_list_apis", json!({"app": app.clone()}))),
        Box::new(move |r| api(&app, "send_password_reset_code", json!({"email": email(r)}))),
        Box::new(move |r| {
            api(
                &app2,
                "reset_password",
                json!({"email": email(r), "code": "000000", "new_password": "brand-new-pass"}),
            )
        }),
        say(call("complete_task", json!({"answer": "0"}))),
    ]);
    let t = episode(&env, &h0, &task, &policy).await;
    assert_eq!(kind_of(&t), "stale-code", "{}", t.transcript());
}

#[tokio::test]
async fn dbbench_failure_modes() {
    let env = dbbench::DbBench::new();
    let h0 = dbbench::base_harness();
    let tasks = env.tasks(Split::Train).unwrap();
    let question = tasks
        .iter()
        .find(|t| !dbbench::db_task(t).unwrap().is_modification())
        .unwrap();
    let db = dbbench::db_task(question).unwrap();
    let table = db.tables[0].name.clone();

    // A column that does not exist, then a guess.
    let policy = scripted(vec![
        say(call(
            "execute_sql",
            json!({"query": format!("SELECT no_such_column FROM `{table}`")}),
        )),
        say(call("commit_final_answer", json!({"answers": ["a guess"]}))),
    ]);
    let t = episode(&env, &h0, question, &policy).await;
    assert_eq!(kind_of(&t), "unknown-schema-name", "{}", t.transcript());

    // A table name with spaces written without quotes: SQLite reports a syntax error next to
    // the name's second word, and the analyst reads it as a name the schema gives, unquoted.
    let generated = dbbench::DbBench::generated(&dbbench::GeneratorConfig {
        seed: 5,
        train: 40,
        validation: 0,
        test: 0,
    });
    let (spaced, bare) = generated
        .tasks(Split::Train)
        .unwrap()
        .into_iter()
        .find_map(|t| {
            let db = dbbench::db_task(&t).unwrap();
            let gold = db.gold_sql.clone()?;
            let bare = gold.replace('`', "");
            let name = &db.tables[0].name;
            (!db.is_modification() && name.contains(' ') && bare.contains(&format!("FROM {name} ")))
                .then_some((t, bare))
        })
        .expect("a generated question on a table whose name has a space");
    let policy = scripted(vec![
        say(call("execute_sql", json!({ "query": bare }))),
        say(call("commit_final_answer", json!({"answers": ["a guess"]}))),
    ]);
    let t = episode(&generated, &h0, &spaced, &policy).await;
    let finding = diagnose(&t).unwrap();
    assert_eq!(finding.kind, "unknown-schema-name", "{}", t.transcript());
    assert!(
        finding.evidence.contains("without quotes"),
        "{}",
        finding.evidence
    );
    // A syntax error that is not about a name is not this cause.
    let policy = scripted(vec![
        say(call("execute_sql", json!({"query": "SELEC 1"}))),
        say(call("commit_final_answer", json!({"answers": ["a guess"]}))),
    ]);
    let t = episode(&generated, &h0, &spaced, &policy).await;
    assert_ne!(
        diagnose(&t).map(|f| f.kind),
        Some("unknown-schema-name"),
        "{}",
        t.transcript()
    );

    // The label plus rows that do not meet every condition.
    let mut answers = db.label.clone();
    answers.push("an extra row".into());
    let policy = scripted(vec![say(call(
        "commit_final_answer",
        json!({"answers": answers}),
    ))]);
    let t = episode(&env, &h0, question, &policy).await;
    assert_eq!(kind_of(&t), "union-not-intersection", "{}", t.transcript());

    // Answers in prose: never committed.
    let policy = scripted(vec![say("The answer is 42.".into())]);
    let t = episode(&env, &h0, question, &policy).await;
    assert_eq!(kind_of(&t), "finished-without-submit", "{}", t.transcript());

    // A change that is never read back.
    let change = tasks
        .iter()
        .find(|t| dbbench::db_task(t).unwrap().is_modification())
        .unwrap();
    let ctable = dbbench::db_task(change).unwrap().tables[0].name.clone();
    let policy = scripted(vec![
        say(call(
            "execute_sql",
            json!({"query": format!("DELETE FROM `{ctable}`")}),
        )),
        say(call("commit_final_answer", json!({"answers": []}))),
    ]);
    let t = episode(&env, &h0, change, &policy).await;
    assert_eq!(kind_of(&t), "no-readback", "{}", t.transcript());

    // The change succeeds, then the table is checked until the budget runs out: the decision
    // not to commit after the change explains it, not the exhausted budget.
    let gold = dbbench::db_task(change).unwrap().gold_sql.clone().unwrap();
    let check = format!("SELECT COUNT(*) FROM `{ctable}`");
    let policy = scripted(vec![
        say(call("execute_sql", json!({"query": gold}))),
        say(call("execute_sql", json!({"query": check}))),
    ]);
    let t = episode(&env, &h0, change, &policy).await;
    let finding = diagnose(&t).unwrap();
    assert_eq!(finding.kind, "no-commit-after-change", "{}", t.transcript());
    let first_check = t
        .messages
        .iter()
        .position(|m| m.content.contains("SELECT COUNT(*)"))
        .unwrap();
    assert_eq!(finding.at, first_check, "{}", t.transcript());

    // The right query, run again instead of committing its result.
    let gold = db.gold_sql.clone().unwrap();
    let policy = scripted(vec![say(call("execute_sql", json!({"query": gold})))]);
    let t = episode(&env, &h0, question, &policy).await;
    assert_eq!(kind_of(&t), "rerun-instead-of-commit", "{}", t.transcript());
    let analysis = analyse_rules(std::slice::from_ref(&t));
    assert_eq!(analysis.causes.len(), 1);
    assert_eq!(analysis.causes[0].kind, "rerun-instead-of-commit");
}

#[tokio::test]
async fn swe_failure_modes() {
    let env = swe::SweEnv::builtin();
    let h0 = swe::base_harness();
    let task = env.tasks(Split::Train).unwrap().remove(0);

    // An edit, then submit without re-running the tests.
    let policy = scripted(vec![
        say(call(
            "create_file",
            json!({"path": "notes.py", "content": "# looked at the issue\n"}),
        )),
        say(call("submit", json!({}))),
    ]);
    let t = episode(&env, &h0, &task, &policy).await;
    assert_eq!(kind_of(&t), "edit-without-retest", "{}", t.transcript());

    // Editing a test file instead of the code.
    let policy = scripted(vec![
        say(call(
            "create_file",
            json!({"path": "tests/test_planted.py", "content": "import unittest\n"}),
        )),
        say(call("submit", json!({}))),
    ]);
    let t = episode(&env, &h0, &task, &policy).await;
    assert_eq!(kind_of(&t), "edited-tests", "{}", t.transcript());

    // Reading until the budget runs out.
    let mut tight = h0.clone();
    tight.limits.max_env_actions = 2;
    let policy = scripted(vec![say(call("search", json!({"pattern": "def "})))]);
    let t = episode(&env, &tight, &task, &policy).await;
    assert_eq!(
        kind_of(&t),
        "budget-before-completion",
        "{}",
        t.transcript()
    );

    // Grouping: two failures of one cause form one group; a successful run is ignored.
    let policy = scripted(vec![
        say(call(
            "create_file",
            json!({"path": "notes.py", "content": "x = 1\n"}),
        )),
        say(call("submit", json!({}))),
    ]);
    let a = episode(&env, &h0, &task, &policy).await;
    let mut b = a.clone();
    b.task_id = "swe/other".into();
    let analysis = analyse_rules(&[a, b, t]);
    assert_eq!(analysis.failures, 3);
    assert_eq!(analysis.causes[0].kind, "edit-without-retest");
    assert_eq!(analysis.causes[0].tasks.len(), 2);
    assert!(analysis.unresolved.is_empty());
}
