//! DBBench: the conformance suite on generated tasks and on AgentBench's dev split, MySQL
//! behaviours, safety limits, concurrency and fuzzing of the action parser and the SQL tool.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use harness_core::{
    ActionParser, EnvSession, Environment, Harness, ParsedAction, Policy, Split, Task, ToolCall,
    run_episode,
};
use harness_dbbench::{
    self as dbbench, COMMIT_TOOL, DbBench, DbBenchTextParser, DbLimits, DbSession, GeneratorConfig,
    MAX_ROUNDS, OBSERVATION_CHARS, QuestionType, SQL_TOOL, base_harness, text_harness,
};
use harness_testkit::ScriptedPolicy;
use harness_testkit::conformance::{ConformanceConfig, check_environment};
use harness_testkit::data::{DBBENCH_DEV_DATA, external_data};
use proptest::prelude::*;
use serde_json::json;

/// The dev split (`HARNESS_DBBENCH_DEV`, test data outside the repository), or `None` to
/// skip; under `CI=true` an unset variable fails the test.
fn dev_split() -> Option<PathBuf> {
    external_data(&DBBENCH_DEV_DATA)
}

fn small_env() -> DbBench {
    DbBench::generated(&GeneratorConfig {
        seed: 11,
        train: 11,
        validation: 11,
        test: 11,
    })
}

fn all_tasks(env: &DbBench) -> Vec<Task> {
    env.all_tasks().to_vec()
}

fn oracle(task: &Task) -> Box<dyn Policy> {
    Box::new(dbbench::OraclePolicy::new(task).expect("a DBBench task"))
}

fn text_oracle(task: &Task) -> Box<dyn Policy> {
    Box::new(dbbench::OraclePolicy::text_format(task).expect("a DBBench task"))
}

fn config(harness: Harness) -> ConformanceConfig {
    ConformanceConfig {
        harness,
        ..ConformanceConfig::default()
    }
}

#[tokio::test]
async fn conformance_on_generated_tasks() {
    let env = small_env();
    let tasks = all_tasks(&env);
    assert_eq!(tasks.len(), 33);
    let report = check_environment(&env, &tasks, &oracle, &config(base_harness())).await;
    assert!(report.failures.is_empty(), "{:#?}", report.failures);
    assert!(report.episodes > 100);
}

#[tokio::test]
async fn conformance_on_generated_tasks_in_the_text_format() {
    let env = small_env();
    let tasks: Vec<Task> = env.tasks(Split::Validation).unwrap();
    let report = check_environment(&env, &tasks, &text_oracle, &config(text_harness())).await;
    assert!(report.failures.is_empty(), "{:#?}", report.failures);
}

#[tokio::test]
async fn conformance_on_the_dev_split() {
    let Some(path) = dev_split() else { return };
    let env = DbBench::from_jsonl(&path, Split::Test).unwrap();
    let tasks = env.tasks(Split::Test).unwrap();
    assert_eq!(tasks.len(), 60);
    let report = check_environment(&env, &tasks, &oracle, &config(base_harness())).await;
    assert!(report.failures.is_empty(), "{:#?}", report.failures);
}

#[tokio::test]
async fn text_format_oracle_solves_the_dev_split() {
    let Some(path) = dev_split() else { return };
    let env = DbBench::from_jsonl(&path, Split::Test).unwrap();
    let harness = text_harness();
    for task in env.tasks(Split::Test).unwrap() {
        let policy = text_oracle(&task);
        let trajectory = run_episode(policy.as_ref(), &harness, &env, &task, 1)
            .await
            .unwrap();
        assert!(
            trajectory.is_success(),
            "{}: {}",
            task.id,
            trajectory.outcome.details
        );
    }
}

#[test]
fn every_split_has_every_type_and_the_default_has_no_downloads() {
    let env = DbBench::new();
    for split in Split::ALL {
        let tasks = env.tasks(split).unwrap();
        assert!(!tasks.is_empty());
        for kind in QuestionType::ALL {
            assert!(
                tasks
                    .iter()
                    .any(|t| dbbench::db_task(t).unwrap().kind == kind.as_str()),
                "{split} lacks {}",
                kind.as_str()
            );
        }
    }
}

/// Every built-in task (all splits of the default generator): the gold SQL and label score 1,
/// committing nothing, "0" or "none" right away scores 0.
#[tokio::test]
async fn every_default_task_is_solved_by_its_oracle_and_not_by_a_guess() {
    let env = DbBench::new();
    assert_eq!(env.all_tasks().len(), 308);
    for task in env.all_tasks() {
        let db_task = dbbench::db_task(task).unwrap();
        let mut session = env.reset(task, 0).await.unwrap();
        let gold = db_task.gold_sql.clone().unwrap();
        let observation = session
            .step(&ToolCall::new(SQL_TOOL, json!({ "query": gold })))
            .await
            .unwrap();
        assert!(!observation.error, "{}: {}", task.id, observation.text);
        let answers = if db_task.is_modification() {
            json!([])
        } else {
            json!(db_task.label)
        };
        session
            .step(&ToolCall::new(COMMIT_TOOL, json!({ "answers": answers })))
            .await
            .unwrap();
        let outcome = session.verify(None).await.unwrap();
        assert!(outcome.is_success(), "{}: {}", task.id, outcome.details);
        for guess in [json!([]), json!(["0"]), json!(["none"])] {
            let mut session = env.reset(task, 0).await.unwrap();
            session
                .step(&ToolCall::new(COMMIT_TOOL, json!({ "answers": guess })))
                .await
                .unwrap();
            let outcome = session.verify(None).await.unwrap();
            assert!(!outcome.is_success(), "{} with {guess}", task.id);
        }
    }
}

#[tokio::test]
async fn immediate_submission_scores_zero() {
    let env = small_env();
    for task in all_tasks(&env) {
        for turn in [
            ToolCall::new(COMMIT_TOOL, json!({"answers": []})).to_tool_call_block(),
            ToolCall::new(COMMIT_TOOL, json!({"answers": ["0"]})).to_tool_call_block(),
            "I do not know.".to_string(),
        ] {
            let policy = ScriptedPolicy::new(vec![turn.clone()]);
            let t = run_episode(&policy, &base_harness(), &env, &task, 3)
                .await
                .unwrap();
            assert_eq!(t.reward(), 0.0, "{} with {turn}", task.id);
        }
    }
}

#[tokio::test]
async fn an_episode_without_a_commit_scores_zero_even_after_the_right_change() {
    let env = small_env();
    let task = all_tasks(&env)
        .into_iter()
        .find(|t| dbbench::db_task(t).unwrap().is_modification())
        .unwrap();
    let gold = dbbench::db_task(&task).unwrap().gold_sql.unwrap();
    let sql = ToolCall::new(SQL_TOOL, json!({ "query": gold })).to_tool_call_block();
    let mut harness = base_harness();
    harness.limits.max_model_calls = 1;
    let t = run_episode(&ScriptedPolicy::new(vec![sql]), &harness, &env, &task, 0)
        .await
        .unwrap();
    assert_eq!(t.reward(), 0.0);
}

/// AgentBench's function-calling DBBench scores only `commit_final_answer`: the right answer in
/// prose, or the right change followed by a closing text, scores 0.
#[tokio::test]
async fn only_a_committed_answer_scores_in_the_tool_format() {
    let env = small_env();
    let tasks = all_tasks(&env);
    let question = tasks
        .iter()
        .find(|t| !dbbench::db_task(t).unwrap().is_modification())
        .unwrap();
    let label = dbbench::db_task(question).unwrap().label;
    let prose = [
        format!("The answer is {}.", label.join(", ")),
        json!(label).to_string(),
        format!("Action: Answer\nFinal Answer: {}", json!(label)),
    ];
    for text in &prose {
        let policy = ScriptedPolicy::new(vec![text.clone()]);
        let t = run_episode(&policy, &base_harness(), &env, question, 0)
            .await
            .unwrap();
        assert_eq!(t.reward(), 0.0, "{text}: {}", t.outcome.details);
        // The turn was a failed round and the episode went on to the round limit.
        assert_eq!(t.counts.parse_failures, MAX_ROUNDS, "{text}");
        assert_eq!(t.termination, harness_core::Termination::MaxModelCalls);
    }
    // The same session type with a closing text and no commit, judged directly.
    let mut session = env.reset(question, 0).await.unwrap();
    assert!(
        !session
            .verify(Some(&json!(label).to_string()))
            .await
            .unwrap()
            .is_success()
    );

    let change = tasks
        .iter()
        .find(|t| dbbench::db_task(t).unwrap().is_modification())
        .unwrap();
    let gold = dbbench::db_task(change).unwrap().gold_sql.unwrap();
    let sql = ToolCall::new(SQL_TOOL, json!({ "query": gold })).to_tool_call_block();
    let policy = ScriptedPolicy::new(vec![sql.clone(), "Done.".into()]);
    let t = run_episode(&policy, &base_harness(), &env, change, 0)
        .await
        .unwrap();
    assert_eq!(t.reward(), 0.0, "{}", t.outcome.details);
    // A plain `tool_call` harness ends the episode on the closing text; still no commit, no reward.
    let mut plain = base_harness();
    plain.tool_view.format = harness_core::TOOL_CALL_FORMAT.into();
    let t = run_episode(&policy, &plain, &env, change, 0).await.unwrap();
    assert_eq!(t.termination, harness_core::Termination::PolicyFinished);
    assert_eq!(t.reward(), 0.0, "{}", t.outcome.details);
}

/// A turn without a tool call is answered with an error and the episode goes on: a commit on
/// a later turn still counts.
#[tokio::test]
async fn a_turn_without_a_tool_call_is_a_failed_round_not_the_end() {
    let env = small_env();
    let task = all_tasks(&env)
        .into_iter()
        .find(|t| !dbbench::db_task(t).unwrap().is_modification())
        .unwrap();
    let label = dbbench::db_task(&task).unwrap().label;
    let commit = ToolCall::new(COMMIT_TOOL, json!({ "answers": label })).to_tool_call_block();
    let policy = ScriptedPolicy::new(vec!["Let me think about it.".into(), commit]);
    let t = run_episode(&policy, &base_harness(), &env, &task, 0)
        .await
        .unwrap();
    assert!(t.is_success(), "{}", t.outcome.details);
    assert_eq!(t.counts.parse_failures, 1);
    assert_eq!(t.counts.model_calls, 2);
    let error = t
        .messages
        .iter()
        .find(|m| m.content.contains("has no tool call"))
        .expect("an error message for the turn without a tool call");
    assert!(error.content.contains(COMMIT_TOOL), "{}", error.content);
}

/// The classic text format keeps the text fallback: a closing text is read as the answer.
#[tokio::test]
async fn the_text_format_reads_a_closing_text_as_the_answer() {
    let env = small_env();
    let task = all_tasks(&env)
        .into_iter()
        .find(|t| !dbbench::db_task(t).unwrap().is_modification())
        .unwrap();
    let label = dbbench::db_task(&task).unwrap().label;
    let mut session = env.reset(&task, 0).await.unwrap();
    assert!(session.action_parser(dbbench::TEXT_FORMAT).is_some());
    let closing = format!("Final Answer: {}", json!(label));
    assert!(session.verify(Some(&closing)).await.unwrap().is_success());
}

#[test]
fn sixteen_episodes_on_a_multi_thread_runtime_do_not_interfere() {
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(4)
        .build()
        .unwrap();
    let env = Arc::new(small_env());
    let tasks = all_tasks(&env);
    let harness = Arc::new(base_harness());
    runtime.block_on(async {
        let mut handles = Vec::new();
        for i in 0..16 {
            let env = Arc::clone(&env);
            let harness = Arc::clone(&harness);
            let task = tasks[i % tasks.len()].clone();
            handles.push(tokio::spawn(async move {
                let policy = oracle(&task);
                run_episode(policy.as_ref(), &harness, env.as_ref(), &task, 5).await
            }));
        }
        for (i, handle) in handles.into_iter().enumerate() {
            let concurrent = handle.await.unwrap().unwrap();
            let task = &tasks[i % tasks.len()];
            let policy = oracle(task);
            let sequential = run_episode(policy.as_ref(), &harness, env.as_ref(), task, 5)
                .await
                .unwrap();
            assert!(concurrent.is_success(), "{}", task.id);
            assert_eq!(concurrent.messages, sequential.messages, "{}", task.id);
        }
    });
}

#[test]
fn base_harness_limits_follow_agentbench() {
    let harness = base_harness();
    assert_eq!(MAX_ROUNDS, 15);
    assert_eq!(harness.limits.max_model_calls, MAX_ROUNDS);
    assert_eq!(harness.limits.max_env_actions, MAX_ROUNDS);
    assert_eq!(text_harness().tool_view.format, dbbench::TEXT_FORMAT);
    assert_eq!(harness.tool_view.format, dbbench::TOOL_FORMAT);
}

// ---------------------------------------------------------------------------------------------
// The SQL tool: MySQL behaviours and safety.

const PEOPLE: &str = r#"{"description": "q", "label": ["x"], "type": ["other"], "table": {"table_name": "People List", "table_info": {"columns": [{"name": "Name", "type": "TEXT"}, {"name": "Goals", "type": "INT"}, {"name": "2nd leg", "type": "TEXT"}], "rows": [["José Müller", "17", "a"], ["anna", "9", "b"], ["Bob", "120", "c"], ["O'Neil", "abc", "d"]]}}}"#;

fn session_with(limits: DbLimits) -> DbSession {
    let tasks = dbbench::parse_jsonl(PEOPLE, std::path::Path::new("people.jsonl")).unwrap();
    let env = DbBench::from_tasks("people", Split::Test, tasks);
    DbSession::new(&env.all_tasks()[0], limits).unwrap()
}

fn session() -> DbSession {
    session_with(DbLimits::default())
}

fn run(session: &DbSession, sql: &str) -> String {
    let observation = session.execute_sql(sql);
    assert!(!observation.error, "{sql}: {}", observation.text);
    observation.text
}

fn fails(session: &DbSession, sql: &str) -> String {
    let observation = session.execute_sql(sql);
    assert!(observation.error, "{sql} should fail: {}", observation.text);
    observation.text
}

#[test]
fn mysql_string_literals_and_identifiers() {
    let s = session();
    assert_eq!(
        run(&s, r"SELECT Name FROM `People List` WHERE Name = 'O\'Neil'"),
        "[(\"O'Neil\",)]"
    );
    assert_eq!(
        run(
            &s,
            r#"SELECT "Name" FROM "People List" WHERE Name = "Bob";"#
        ),
        "[('Bob',)]"
    );
    assert_eq!(
        run(&s, "SELECT `2nd leg` FROM `People List` WHERE Name = 'Bob'"),
        "[('c',)]"
    );
    assert_eq!(run(&s, r"SELECT 'a\tb', 'c\\d'"), r"[('a\tb', 'c\\d')]");
}

#[test]
fn text_comparison_ignores_case_and_accents() {
    let s = session();
    assert_eq!(
        run(
            &s,
            "SELECT Name FROM `People List` WHERE Name = 'jose muller'"
        ),
        "[('José Müller',)]"
    );
    assert_eq!(
        run(
            &s,
            "SELECT Name FROM `People List` WHERE Name LIKE '%MULL%'"
        ),
        "[('José Müller',)]"
    );
    assert_eq!(
        run(&s, "SELECT Name FROM `People List` ORDER BY Name"),
        "[('anna',), ('Bob',), ('José Müller',), (\"O'Neil\",)]"
    );
    assert_eq!(
        run(
            &s,
            "SELECT COUNT(*) FROM `People List` WHERE Name IN ('ANNA', 'bob')"
        ),
        "[(2,)]"
    );
}

#[test]
fn numbers_compare_with_text_columns_as_in_mysql() {
    let s = session();
    // As strings '9' > '17' and '120' < '17'; MySQL compares numbers.
    assert_eq!(
        run(
            &s,
            "SELECT Name FROM `People List` WHERE Goals < 17 ORDER BY Name"
        ),
        "[('anna',), (\"O'Neil\",)]"
    );
    assert_eq!(
        run(&s, "SELECT Name FROM `People List` WHERE Goals > 17"),
        "[('Bob',)]"
    );
    assert_eq!(
        run(
            &s,
            "SELECT COUNT(*) FROM `People List` WHERE Goals IN (9, 120)"
        ),
        "[(2,)]"
    );
    assert_eq!(
        run(
            &s,
            "SELECT Name FROM `People List` WHERE Goals BETWEEN 10 AND 20"
        ),
        "[('José Müller',)]"
    );
    assert_eq!(
        run(&s, "SELECT SUM(Goals) FROM `People List`"),
        "[(146.0,)]"
    );
}

#[test]
fn mysql_functions_and_casts() {
    let s = session();
    assert_eq!(
        run(
            &s,
            "SELECT Name FROM `People List` ORDER BY CAST(Goals AS UNSIGNED) DESC LIMIT 1"
        ),
        "[('Bob',)]"
    );
    assert_eq!(
        run(
            &s,
            "SELECT COUNT(*) FROM `People List` WHERE Name REGEXP '^(an|bo)'"
        ),
        "[(2,)]"
    );
    assert_eq!(
        run(
            &s,
            "SELECT LEFT(Name, 2), RIGHT(Name, 2), LOCATE('b', Name) FROM `People List` WHERE Name RLIKE 'bob'"
        ),
        "[('Bo', 'ob', 1)]"
    );
    assert_eq!(
        run(&s, "SELECT MD5('abc')"),
        "[('900150983cd24fb0d6963f7d28e17f72',)]"
    );
    assert_eq!(run(&s, "USE whatever"), "Database changed");
}

#[test]
fn changes_and_inspection_commands() {
    let s = session();
    assert_eq!(
        run(
            &s,
            "UPDATE `People List` SET Goals = 18 WHERE Name = 'ANNA'"
        ),
        "Query OK, 1 row affected"
    );
    assert_eq!(
        run(&s, "SELECT Goals FROM `People List` WHERE Name = 'anna'"),
        "[('18',)]"
    );
    assert_eq!(run(&s, "SHOW TABLES"), "[('People List',)]");
    assert!(run(&s, "DESCRIBE `People List`").starts_with("[('Name', 'text'"));
    fails(&s, "DESCRIBE nothing_here");
    let message = fails(&s, "SELECT Name FROM `People List` WHERE Goals = 1 AND (");
    assert!(!message.contains("mysql_num"), "{message}");
    fails(&s, "SELEC 1");
    fails(&s, "SELECT 1; SELECT 2");
}

#[test]
fn attach_extensions_and_pragmas_are_refused() {
    let s = session();
    let message = fails(&s, "ATTACH DATABASE '/tmp/x.db' AS other");
    assert!(message.contains("not authorized"), "{message}");
    fails(&s, "ATTACH 'file:other?mode=memory' AS other");
    fails(&s, "SELECT load_extension('/tmp/evil')");
    fails(&s, "PRAGMA writable_schema = 1");
    fails(&s, "VACUUM INTO '/tmp/copy.db'");
    fails(&s, "CREATE VIRTUAL TABLE v USING fts5(x)");
    assert!(run(&s, "PRAGMA table_info(`People List`)").contains("Name"));
}

/// The temp schema is a second database beside the capped main one: filling a TEMP table
/// statement by statement would grow memory past the page cap, so temp DDL is refused (a
/// trigger's body needs a `;`, which the one-statement rule already refuses).
#[test]
fn temporary_tables_views_and_triggers_are_refused() {
    let s = session();
    for sql in [
        "CREATE TEMP TABLE t (x TEXT)",
        "CREATE TEMPORARY TABLE t AS SELECT * FROM `People List`",
        "CREATE TABLE temp.t (x TEXT)",
        "CREATE TEMP VIEW v AS SELECT Name FROM `People List`",
    ] {
        let message = fails(&s, sql);
        assert!(
            message.contains("not authorized") && message.contains("temporary tables"),
            "{sql}: {message}"
        );
    }
    fails(&s, "PRAGMA temp.max_page_count = 1000000");
    let message = fails(&s, "PRAGMA foreign_keys");
    assert!(
        message.contains("PRAGMA foreign_keys is disabled"),
        "{message}"
    );
    // Regular tables still work, under the main database's page cap.
    run(&s, "CREATE TABLE t (x TEXT)");
    assert_eq!(run(&s, "SELECT COUNT(*) FROM `People List`"), "[(4,)]");
}

#[test]
fn a_statement_reports_only_the_rows_it_changed() {
    let s = session();
    assert_eq!(
        run(&s, "INSERT INTO `People List` (Name) VALUES ('A'), ('B')"),
        "Query OK, 2 rows affected"
    );
    // DDL changes no row, whatever the statement before it changed.
    assert_eq!(
        run(&s, "CREATE TABLE t (x TEXT)"),
        "Query OK, 0 rows affected"
    );
    assert_eq!(
        run(&s, "DELETE FROM `People List` WHERE Name = 'A'"),
        "Query OK, 1 row affected"
    );
}

#[test]
fn a_runaway_statement_is_stopped() {
    let s = session_with(DbLimits {
        statement_time: Duration::from_millis(300),
        statement_ops: u64::MAX,
        ..DbLimits::default()
    });
    let started = std::time::Instant::now();
    let text = fails(
        &s,
        "WITH RECURSIVE c(x) AS (SELECT 1 UNION ALL SELECT x + 1 FROM c) SELECT COUNT(*) FROM c",
    );
    assert!(text.contains("stopped"), "{text}");
    assert!(started.elapsed() < Duration::from_secs(10));
    // The instruction budget stops it deterministically too.
    let s = session_with(DbLimits {
        statement_ops: 2_000_000,
        ..DbLimits::default()
    });
    let text = fails(
        &s,
        "WITH RECURSIVE c(x) AS (SELECT 1 UNION ALL SELECT x + 1 FROM c) SELECT COUNT(*) FROM c",
    );
    assert!(text.contains("steps"), "{text}");
    // The session still works afterwards.
    assert_eq!(run(&s, "SELECT COUNT(*) FROM `People List`"), "[(4,)]");
}

#[test]
fn huge_results_are_capped() {
    let s = session();
    let text = run(
        &s,
        "WITH RECURSIVE c(x) AS (SELECT 1 UNION ALL SELECT x + 1 FROM c LIMIT 1000000) SELECT x FROM c",
    );
    assert!(
        text.chars().count() < OBSERVATION_CHARS + 100,
        "{}",
        text.len()
    );
    assert!(text.contains("characters cut"));
    let text = fails(&s, "SELECT hex(zeroblob(800000))");
    assert!(text.contains("too big"), "{text}");
    fails(&s, "SELECT zeroblob(100000000)");
}

#[tokio::test]
async fn malformed_tool_calls_are_error_observations() {
    let mut s = session();
    for call in [
        ToolCall::new(SQL_TOOL, json!({})),
        ToolCall::new(SQL_TOOL, json!({"query": 5})),
        ToolCall::new(SQL_TOOL, json!({"query": "x".repeat(2_000_000)})),
        ToolCall::new(COMMIT_TOOL, json!("nope")),
        ToolCall::new(COMMIT_TOOL, json!({"answers": {"a": 1}})),
        ToolCall::new("drop_everything", json!({})),
    ] {
        let observation = s.step(&call).await.unwrap();
        assert!(observation.error, "{call:?}");
        assert!(!observation.done);
    }
    let done = s
        .step(&ToolCall::new(COMMIT_TOOL, json!({"answers": ["x"]})))
        .await
        .unwrap();
    assert!(done.done);
    let after = s
        .step(&ToolCall::new(SQL_TOOL, json!({"query": "SELECT 1"})))
        .await
        .unwrap();
    assert!(after.error);
    assert!(s.verify(None).await.unwrap().is_success());
}

/// Modification tasks without `answer_md5` are scored against the hash of their replayed gold
/// SQL; a task may hold several tables.
#[tokio::test]
async fn gold_sql_replay_and_several_tables() {
    let line = r#"{"description": "Give anna 10 goals.", "label": ["UPDATE `People List` SET Goals = '10' WHERE Name = 'Anna'"], "type": ["UPDATE"], "table": [{"table_name": "People List", "table_info": {"columns": [{"name": "Name"}, {"name": "Goals"}], "rows": [["anna", "9"], ["Bob", "3"]]}}, {"table_name": "Other", "table_info": {"columns": [{"name": "x"}], "rows": [["1"]]}}]}"#;
    let tasks = dbbench::parse_jsonl(line, std::path::Path::new("multi.jsonl")).unwrap();
    assert_eq!(tasks[0].tables.len(), 2);
    assert!(tasks[0].answer_md5.is_none());
    let env = DbBench::from_tasks("multi", Split::Test, tasks);
    let task = &env.all_tasks()[0];
    let report = check_environment(
        &env,
        std::slice::from_ref(task),
        &oracle,
        &config(base_harness()),
    )
    .await;
    assert!(report.failures.is_empty(), "{:#?}", report.failures);
    // A different change (to the other table) does not pass.
    let mut session = env.reset(task, 0).await.unwrap();
    for call in [
        ToolCall::new(
            SQL_TOOL,
            json!({"query": "UPDATE `People List` SET Goals = '10' WHERE Name = 'Anna'"}),
        ),
        ToolCall::new(SQL_TOOL, json!({"query": "DELETE FROM Other"})),
        ToolCall::new(COMMIT_TOOL, json!({"answers": []})),
    ] {
        session.step(&call).await.unwrap();
    }
    assert!(!session.verify(None).await.unwrap().is_success());
}

#[tokio::test]
async fn a_task_of_another_environment_is_an_error_naming_it() {
    let env = small_env();
    let task = Task::new("elsewhere/1", "elsewhere", Split::Test, "do it", 0);
    let message = env.reset(&task, 0).await.err().unwrap().to_string();
    assert!(message.contains("elsewhere/1"), "{message}");
}

#[test]
fn loader_errors_name_the_file_line_and_field() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("broken.jsonl");
    let broken = PEOPLE.replace("\"type\": [\"other\"], ", "");
    std::fs::write(&path, format!("{PEOPLE}\n{broken}\n")).unwrap();
    let message = DbBench::from_jsonl(&path, Split::Test)
        .unwrap_err()
        .to_string();
    assert!(message.contains("broken.jsonl:2"), "{message}");
    assert!(message.contains("`type`"), "{message}");
    let missing = DbBench::from_jsonl(dir.path().join("nope.jsonl"), Split::Test)
        .unwrap_err()
        .to_string();
    assert!(missing.contains("nope.jsonl"), "{missing}");
}

// ---------------------------------------------------------------------------------------------
// Fuzzing.

fn turn_fragment() -> impl Strategy<Value = String> {
    prop_oneof![
        Just("Action: Operation\n".to_string()),
        Just("Action: Answer\n".to_string()),
        Just("Final Answer: ".to_string()),
        Just("```sql\n".to_string()),
        Just("```".to_string()),
        Just("[\"".to_string()),
        Just("']".to_string()),
        Just("<think>".to_string()),
        Just("</think>".to_string()),
        Just("\\".to_string()),
        "[ -~]{0,12}",
        "\\PC{0,6}",
    ]
}

fn sql_fragment() -> impl Strategy<Value = String> {
    prop_oneof![
        Just("SELECT ".to_string()),
        Just("* FROM `People List` ".to_string()),
        Just("WHERE Goals < ".to_string()),
        Just("17 ".to_string()),
        Just("'it\\'s' ".to_string()),
        Just("\"Name\" ".to_string()),
        Just("; ".to_string()),
        Just("-- c\n".to_string()),
        Just("/* ".to_string()),
        Just("` ".to_string()),
        Just("( ".to_string()),
        Just("IN (1, -2) ".to_string()),
        Just("BETWEEN ".to_string()),
        Just("UPDATE `People List` SET Goals = ".to_string()),
        Just("2nd.x ".to_string()),
        Just("1e+ ".to_string()),
        "[ -~]{0,10}",
        "\\PC{0,4}",
    ]
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 256, ..ProptestConfig::default() })]

    #[test]
    fn the_text_parser_never_panics(parts in proptest::collection::vec(turn_fragment(), 0..12)) {
        let text = parts.concat();
        match DbBenchTextParser.parse(&text, &dbbench::tool_specs()) {
            ParsedAction::Calls(calls) => {
                prop_assert_eq!(calls.len(), 1);
                prop_assert!(calls[0].name == SQL_TOOL || calls[0].name == COMMIT_TOOL);
            }
            ParsedAction::Invalid(reason) => prop_assert!(!reason.is_empty()),
            ParsedAction::Final(_) => {}
        }
    }

    #[test]
    fn execute_sql_never_panics(parts in proptest::collection::vec(sql_fragment(), 0..10)) {
        let query = parts.concat();
        let mut s = session();
        let observation = futures::executor::block_on(
            s.step(&ToolCall::new(SQL_TOOL, json!({ "query": query }))),
        ).unwrap();
        prop_assert!(observation.text.chars().count() <= OBSERVATION_CHARS + 60);
        prop_assert!(!observation.done);
    }

    #[test]
    fn arbitrary_text_as_sql_never_panics(query in "\\PC{0,120}") {
        let s = session();
        let observation = s.execute_sql(&query);
        prop_assert!(observation.text.chars().count() <= OBSERVATION_CHARS + 60);
    }

    #[test]
    fn answer_comparison_is_total_and_reflexive(
        items in proptest::collection::vec("\\PC{0,8}|[0-9]{1,4}(\\.[0-9]{1,3})?", 0..5),
        text in "\\PC{0,40}",
    ) {
        prop_assert!(dbbench::answers_match(&items, &items));
        let parsed = dbbench::parse_answer_list(&text);
        let _ = dbbench::answers_match(&parsed, &items);
    }

    #[test]
    fn execute_sql_arguments_of_any_shape_never_panic(value in any_json()) {
        let mut s = session();
        let observation = futures::executor::block_on(
            s.step(&ToolCall::new(SQL_TOOL, value)),
        ).unwrap();
        prop_assert!(!observation.done);
    }
}

fn any_json() -> impl Strategy<Value = serde_json::Value> {
    let leaf = prop_oneof![
        Just(serde_json::Value::Null),
        any::<bool>().prop_map(serde_json::Value::from),
        any::<i64>().prop_map(serde_json::Value::from),
        "\\PC{0,20}".prop_map(serde_json::Value::from),
    ];
    leaf.prop_recursive(3, 16, 4, |inner| {
        prop_oneof![
            proptest::collection::vec(inner.clone(), 0..4).prop_map(serde_json::Value::from),
            proptest::collection::btree_map(
                prop_oneof![Just("query".to_string()), "[a-z]{1,5}"],
                inner,
                0..3
            )
            .prop_map(|m| serde_json::Value::Object(m.into_iter().collect())),
        ]
    })
}
