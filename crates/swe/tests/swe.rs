//! The repository-repair world against `python3`: instance soundness, the conformance suite with
//! the oracle, isolation, path confinement, command limits and argument fuzzing.

use std::sync::Arc;
use std::time::{Duration, Instant};

use harness_core::{
    EnvSession, Environment, Observation, Policy, Split, Task, ToolCall, run_episode,
};
use harness_swe::{self as swe, SweConfig, SweEnv, SweSession, tools};
use harness_testkit::ScriptedPolicy;
use harness_testkit::conformance::{ConformanceConfig, check_environment};
use proptest::prelude::*;
use serde_json::{Value, json};

fn all_tasks(env: &SweEnv) -> Vec<Task> {
    Split::ALL
        .iter()
        .flat_map(|s| env.tasks(*s).unwrap())
        .collect()
}

fn step(session: &mut SweSession, name: &str, args: Value) -> Observation {
    session.step_sync(&ToolCall::new(name, args)).unwrap()
}

fn block_on<F: std::future::Future>(f: F) -> F::Output {
    futures::executor::block_on(f)
}

#[test]
fn every_builtin_instance_fails_before_and_passes_after_its_gold_patch() {
    let env = SweEnv::builtin();
    let ids: Vec<String> = env.instances().map(|i| i.instance_id.clone()).collect();
    let workers = 4;
    let problems: Vec<String> = std::thread::scope(|scope| {
        let handles: Vec<_> = (0..workers)
            .map(|w| {
                let env = &env;
                let ids = &ids;
                scope.spawn(move || {
                    let mut problems = Vec::new();
                    for id in ids.iter().skip(w).step_by(workers) {
                        let report = env.validate_instance(id).unwrap();
                        for p in report.problems {
                            problems.push(format!("{id}: {p}"));
                        }
                        // Sanity: the FAIL_TO_PASS tests really ran before the patch.
                        let instance = env.instance(id).unwrap();
                        for t in &instance.fail_to_pass {
                            let s = report.before.statuses[t];
                            if !matches!(s, swe::TestStatus::Fail | swe::TestStatus::Error) {
                                problems.push(format!("{id}: {t} was {s:?} before the patch"));
                            }
                        }
                    }
                    problems
                })
            })
            .collect();
        handles
            .into_iter()
            .flat_map(|h| h.join().unwrap())
            .collect()
    });
    assert!(problems.is_empty(), "{}", problems.join("\n"));
}

#[test]
fn builtin_splits_and_counts() {
    let env = SweEnv::builtin();
    let counts: Vec<usize> = Split::ALL
        .iter()
        .map(|s| env.tasks(*s).unwrap().len())
        .collect();
    eprintln!("swe built-in instances (train, validation, test): {counts:?}");
    assert!(counts.iter().all(|c| *c >= 5), "{counts:?}");
    assert_eq!(counts.iter().sum::<usize>(), env.instances().count());
    let tasks = all_tasks(&env);
    for task in &tasks {
        assert_eq!(task.env, "swe");
        assert!(task.id.starts_with("swe/"));
        assert!(
            task.metadata["FAIL_TO_PASS"]
                .as_array()
                .is_some_and(|a| !a.is_empty())
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn oracle_scores_one_on_every_builtin_instance() {
    let env = Arc::new(SweEnv::builtin());
    let harness = Arc::new(swe::base_harness());
    let handles: Vec<_> = all_tasks(&env)
        .into_iter()
        .map(|task| {
            let env = Arc::clone(&env);
            let harness = Arc::clone(&harness);
            tokio::spawn(async move {
                let oracle = env.oracle(&task).unwrap();
                let t = run_episode(&oracle, &harness, env.as_ref(), &task, 3)
                    .await
                    .unwrap();
                (task.id, t.reward(), t.outcome.details)
            })
        })
        .collect();
    for handle in handles {
        let (id, reward, details) = handle.await.unwrap();
        assert_eq!(reward, 1.0, "{id}: {details}");
    }
}

#[test]
fn conformance_suite_with_the_oracle() {
    let env = SweEnv::builtin();
    // Two tasks per split keep the suite fast; the oracle is checked on every instance above.
    let tasks: Vec<Task> = Split::ALL
        .iter()
        .flat_map(|s| env.tasks(*s).unwrap().into_iter().take(2))
        .collect();
    let oracle = |task: &Task| -> Box<dyn Policy> { Box::new(env.oracle(task).unwrap()) };
    let config = ConformanceConfig::default();
    let started = Instant::now();
    let report = block_on(check_environment(&env, &tasks, &oracle, &config));
    eprintln!(
        "conformance: {} episodes, {} probes in {:.1} s",
        report.episodes,
        report.probes,
        started.elapsed().as_secs_f64()
    );
    assert!(report.failures.is_empty(), "{}", report.failures.join("\n"));
    assert!(report.episodes >= tasks.len() * 3 + 2 * config.concurrency);
    assert_eq!(config.concurrency, 16);
}

#[test]
fn oracle_solves_under_the_base_harness_and_immediate_submission_fails() {
    let env = SweEnv::builtin();
    let harness = swe::base_harness();
    harness.validate().unwrap();
    for task in env.tasks(Split::Test).unwrap().iter().take(3) {
        let oracle = env.oracle(task).unwrap();
        let t = block_on(run_episode(&oracle, &harness, &env, task, 1)).unwrap();
        assert!(t.is_success(), "{}: {}", task.id, t.outcome.details);
        assert_eq!(t.outcome.details["submitted"], json!(true));

        let submit = ScriptedPolicy::new(vec![
            ToolCall::new(tools::SUBMIT, json!({})).to_tool_call_block(),
        ]);
        let t = block_on(run_episode(&submit, &harness, &env, task, 1)).unwrap();
        assert_eq!(t.reward(), 0.0, "{}", task.id);
        assert!(!t.outcome.details["failed"].as_array().unwrap().is_empty());
    }
}

#[test]
fn the_final_state_is_judged_even_without_submit() {
    let env = SweEnv::builtin();
    let task = &env.tasks(Split::Train).unwrap()[0];
    let oracle = env.oracle(task).unwrap();
    let mut session = env.start(task).unwrap();
    for call in oracle.calls().iter().filter(|c| c.name != tools::SUBMIT) {
        let obs = session.step_sync(call).unwrap();
        assert!(!obs.error, "{}", obs.text);
    }
    let outcome = block_on(session.verify(Some("done"))).unwrap();
    assert!(outcome.is_success(), "{}", outcome.details);
    assert_eq!(outcome.details["submitted"], json!(false));
}

#[test]
fn editing_the_tests_does_not_count() {
    let env = SweEnv::builtin();
    let task = Task::clone(
        &all_tasks(&env)
            .into_iter()
            .find(|t| t.id == "swe/textkit__truncate-exact-width")
            .unwrap(),
    );
    let mut session = env.start(&task).unwrap();
    // Make the failing test vacuous instead of fixing the code.
    let obs = step(
        &mut session,
        tools::REPLACE,
        json!({"path": "tests/test_core.py",
               "old": "self.assertEqual(truncate(\"hello\", 5), \"hello\")",
               "new": "pass"}),
    );
    assert!(!obs.error, "{}", obs.text);
    let obs = step(
        &mut session,
        tools::RUN_TESTS,
        json!({"tests": ["tests.test_core.TestTruncate.test_exact_width_unchanged"]}),
    );
    assert!(obs.text.contains("1 passed"), "{}", obs.text);
    let outcome = session.verify_sync().unwrap();
    assert_eq!(outcome.reward, 0.0, "{}", outcome.details);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn sixteen_concurrent_episodes_work_in_separate_copies() {
    let env = Arc::new(SweEnv::builtin());
    let tasks = all_tasks(&env);
    let harness = Arc::new(swe::base_harness());
    let mut handles = Vec::new();
    for i in 0..16u64 {
        let env = Arc::clone(&env);
        let harness = Arc::clone(&harness);
        // Pairs of episodes share a task: one solves it, one submits at once.
        let task = tasks[(i as usize / 2) * 3 % tasks.len()].clone();
        let solve = i % 2 == 0;
        handles.push(tokio::spawn(async move {
            let policy: Box<dyn Policy> = if solve {
                Box::new(env.oracle(&task).unwrap())
            } else {
                Box::new(ScriptedPolicy::new(vec![
                    ToolCall::new(tools::SUBMIT, json!({})).to_tool_call_block(),
                ]))
            };
            let t = run_episode(policy.as_ref(), &harness, env.as_ref(), &task, i)
                .await
                .unwrap();
            (task.id, solve, t.reward())
        }));
    }
    for handle in handles {
        let (id, solve, reward) = handle.await.unwrap();
        assert_eq!(reward, if solve { 1.0 } else { 0.0 }, "{id} solve={solve}");
    }
    // Sessions started together get distinct directories.
    let task = &tasks[0];
    let sessions: Vec<SweSession> = (0..16).map(|_| env.start(task).unwrap()).collect();
    let mut roots: Vec<_> = sessions.iter().map(|s| s.root().to_path_buf()).collect();
    roots.sort();
    roots.dedup();
    assert_eq!(roots.len(), 16);
    let kept = roots[0].clone();
    drop(sessions);
    assert!(!kept.exists(), "the copy is removed with its session");
}

#[test]
fn paths_outside_the_copy_are_refused() {
    let env = SweEnv::builtin();
    let task = &all_tasks(&env)[0];
    let mut session = env.start(task).unwrap();
    let outside = tempfile::tempdir().unwrap();
    let secret = outside.path().join("secret.txt");
    std::fs::write(&secret, "top secret\n").unwrap();
    std::os::unix::fs::symlink(outside.path(), session.root().join("escape")).unwrap();
    std::os::unix::fs::symlink(&secret, session.root().join("link.txt")).unwrap();
    let escapes = [
        "../secret.txt",
        "/etc/passwd",
        "a/../../b",
        "escape/secret.txt",
        "escape",
        "link.txt",
        "escape/new.txt",
        "escape/sub/new.txt",
    ];
    for path in escapes {
        for (tool, args) in [
            (tools::VIEW, json!({"path": path})),
            (tools::CREATE, json!({"path": path, "content": "pwned"})),
            (
                tools::REPLACE,
                json!({"path": path, "old": "top", "new": "pwned"}),
            ),
            (tools::SEARCH, json!({"pattern": "secret", "path": path})),
        ] {
            let obs = step(&mut session, tool, args);
            assert!(obs.error, "{tool} on {path} was allowed: {}", obs.text);
            assert!(!obs.text.contains("top secret"), "{tool} on {path} leaked");
        }
    }
    assert_eq!(std::fs::read_to_string(&secret).unwrap(), "top secret\n");
    // The verifier restores the tests without following a planted link.
    std::fs::remove_dir_all(session.root().join("tests")).unwrap();
    std::os::unix::fs::symlink(outside.path(), session.root().join("tests")).unwrap();
    let outcome = session.verify_sync().unwrap();
    assert_eq!(outcome.reward, 0.0);
    assert!(session.root().join("tests").is_dir());
    let leaked: Vec<_> = std::fs::read_dir(outside.path()).unwrap().collect();
    assert_eq!(leaked.len(), 1, "only secret.txt is outside");
    assert!(!outside.path().join("new.txt").exists());
    // A search over the whole copy does not follow the links either.
    let obs = step(
        &mut session,
        tools::SEARCH,
        json!({"pattern": "top secret"}),
    );
    assert!(obs.text.starts_with("No matches"), "{}", obs.text);
    // Paths inside still work, including new directories.
    let obs = step(
        &mut session,
        tools::CREATE,
        json!({"path": "notes/new/file.txt", "content": "hello\n"}),
    );
    assert!(!obs.error, "{}", obs.text);
    let obs = step(
        &mut session,
        tools::VIEW,
        json!({"path": "./notes/new/file.txt"}),
    );
    assert!(obs.text.contains("1 | hello"), "{}", obs.text);
}

fn shell_env(timeout: Duration, cap: usize) -> SweEnv {
    SweEnv::builtin().with_config(SweConfig {
        shell: true,
        command_timeout: timeout,
        output_cap: cap,
        ..SweConfig::default()
    })
}

#[test]
fn commands_past_the_time_limit_are_killed() {
    let env = shell_env(Duration::from_millis(800), 4000);
    let task = &all_tasks(&env)[0];
    let mut session = env.start(task).unwrap();
    let started = Instant::now();
    let obs = step(
        &mut session,
        tools::SHELL,
        json!({"command": "sleep 30 & echo started; sleep 30"}),
    );
    assert!(obs.error && obs.text.contains("time limit"), "{}", obs.text);
    assert!(obs.text.contains("started"));
    assert!(started.elapsed() < Duration::from_secs(5));

    // A test that hangs is killed too, and reported as not run.
    let obs = step(
        &mut session,
        tools::CREATE,
        json!({"path": "tests/test_hang.py",
               "content": "import time, unittest\n\nclass T(unittest.TestCase):\n    def test_hang(self):\n        time.sleep(30)\n"}),
    );
    assert!(!obs.error, "{}", obs.text);
    let started = Instant::now();
    let obs = step(
        &mut session,
        tools::RUN_TESTS,
        json!({"tests": ["tests.test_hang.T.test_hang"]}),
    );
    assert!(
        obs.text.contains("time limit")
            && obs
                .text
                .contains("Not run (time limit or crash): tests.test_hang"),
        "{}",
        obs.text
    );
    assert!(started.elapsed() < Duration::from_secs(5));
}

#[test]
fn huge_output_is_capped() {
    let env = shell_env(Duration::from_secs(20), 2000);
    let task = &all_tasks(&env)[0];
    let mut session = env.start(task).unwrap();
    let obs = step(
        &mut session,
        tools::SHELL,
        json!({"command": "yes 'a line of output' | head -c 20000000"}),
    );
    assert!(obs.text.len() < 2300, "{}", obs.text.len());
    assert!(
        obs.text.contains("more bytes of output dropped"),
        "{}",
        &obs.text[1900..]
    );
    // Tests that print a lot are capped as well.
    step(
        &mut session,
        tools::CREATE,
        json!({"path": "tests/test_loud.py",
               "content": "import unittest\n\nclass T(unittest.TestCase):\n    def test_loud(self):\n        print('x' * 5_000_000)\n        self.fail('boom')\n"}),
    );
    let obs = step(
        &mut session,
        tools::RUN_TESTS,
        json!({"tests": ["tests.test_loud"]}),
    );
    assert!(obs.text.len() < 2300, "{}", obs.text.len());
    assert!(obs.text.contains("1 failed"), "{}", obs.text);
}

#[test]
fn shell_is_offered_only_when_enabled_and_hidden_by_the_base_harness() {
    let plain = SweEnv::builtin();
    let task = &all_tasks(&plain)[0];
    let mut session = plain.start(task).unwrap();
    assert!(!session.tools().iter().any(|t| t.name == tools::SHELL));
    let obs = step(&mut session, tools::SHELL, json!({"command": "echo hi"}));
    assert!(obs.error);

    let harness = swe::base_harness();
    harness.validate_for_tools(&session.tools()).unwrap();
    let mut with_shell = harness.clone();
    with_shell
        .tool_view
        .include
        .as_mut()
        .unwrap()
        .push(tools::SHELL.to_string());
    assert!(with_shell.validate_for_tools(&session.tools()).is_err());

    let env = shell_env(Duration::from_secs(5), 4000);
    let mut session = env.start(task).unwrap();
    let tools_offered = session.tools();
    assert!(tools_offered.iter().any(|t| t.name == tools::SHELL));
    assert!(
        !harness
            .visible_tools(&tools_offered)
            .iter()
            .any(|t| t.name == tools::SHELL)
    );
    assert!(
        with_shell
            .visible_tools(&tools_offered)
            .iter()
            .any(|t| t.name == tools::SHELL)
    );
    let obs = step(&mut session, tools::SHELL, json!({"command": "pwd; ls"}));
    assert!(!obs.error, "{}", obs.text);
    // The copy's location is written as `.` so observations repeat across episodes.
    assert!(obs.text.starts_with(".\n"), "{}", obs.text);
    assert!(!obs.text.contains(&session.root().display().to_string()));
    assert!(obs.text.contains("README.md"));
}

#[test]
fn tools_report_misuse_as_error_observations() {
    let env = SweEnv::builtin();
    let task = all_tasks(&env)
        .into_iter()
        .find(|t| t.id == "swe/spans__contains-end")
        .unwrap();
    let mut session = env.start(&task).unwrap();
    let cases = [
        (
            tools::REPLACE,
            json!({"path": "spans/interval.py", "old": "no such text", "new": "x"}),
        ),
        (
            tools::REPLACE,
            json!({"path": "spans/interval.py", "old": "self", "new": "this"}),
        ),
        (
            tools::REPLACE,
            json!({"path": "spans/interval.py", "old": "", "new": "x"}),
        ),
        (
            tools::REPLACE,
            json!({"path": "missing.py", "old": "a", "new": "b"}),
        ),
        (
            tools::VIEW,
            json!({"path": "spans/interval.py", "start_line": 999}),
        ),
        (
            tools::VIEW,
            json!({"path": "spans/interval.py", "start_line": 5, "end_line": 2}),
        ),
        (tools::VIEW, json!({"path": "nope.py"})),
        (
            tools::VIEW,
            json!({"path": "spans/interval.py", "extra": 1}),
        ),
        (tools::SEARCH, json!({"pattern": "("})),
        (tools::RUN_TESTS, json!({"tests": ["not a test id"]})),
        (tools::RUN_TESTS, json!({"tests": "tests.test_dates"})),
        (tools::CREATE, json!({"path": "spans", "content": "x"})),
        (tools::SUBMIT, json!({"unexpected": true})),
        ("no_such_tool", json!({})),
    ];
    for (tool, args) in cases {
        let obs = step(&mut session, tool, args.clone());
        assert!(obs.error, "{tool} {args} was accepted: {}", obs.text);
        assert!(!obs.done);
    }
    let obs = step(
        &mut session,
        tools::REPLACE,
        json!({"path": "spans/interval.py", "old": "self", "new": "this"}),
    );
    assert!(obs.text.contains("occurs"), "{}", obs.text);
    // Correct use.
    let obs = step(
        &mut session,
        tools::VIEW,
        json!({"path": "spans/interval.py", "start_line": 16, "end_line": 18}),
    );
    assert!(
        !obs.error && obs.text.contains("lines 16-18"),
        "{}",
        obs.text
    );
    let obs = step(&mut session, tools::VIEW, json!({"path": "."}));
    assert!(
        obs.text.contains("spans/interval.py") && obs.text.contains("tests/"),
        "{}",
        obs.text
    );
    let obs = step(
        &mut session,
        tools::SEARCH,
        json!({"pattern": "def contains", "path": "spans"}),
    );
    assert!(obs.text.contains("spans/interval.py:"), "{}", obs.text);
    let obs = step(
        &mut session,
        tools::RUN_TESTS,
        json!({"tests": ["tests.test_interval.TestInterval"]}),
    );
    assert!(
        obs.text
            .contains("FAIL tests.test_interval.TestInterval.test_contains_end_excluded"),
        "{}",
        obs.text
    );
    assert!(
        obs.text.contains("File \"tests/test_interval.py\""),
        "{}",
        obs.text
    );
    assert!(!obs.text.contains(&session.root().display().to_string()));
    let obs = step(
        &mut session,
        tools::RUN_TESTS,
        json!({"tests": ["tests/test_dates.py::TestLeap"]}),
    );
    assert!(
        obs.text.contains("Tests: 4 passed, 0 failed"),
        "{}",
        obs.text
    );
    let obs = step(&mut session, tools::RUN_TESTS, json!({"tests": []}));
    assert!(
        obs.text.contains("Tests: 26 passed, 1 failed, 0 errors"),
        "{}",
        obs.text
    );
    let obs = step(
        &mut session,
        tools::REPLACE,
        json!({"path": "spans/interval.py", "old": "self.start <= x <= self.end", "new": "self.start <= x < self.end"}),
    );
    assert!(!obs.error, "{}", obs.text);
    let obs = step(&mut session, tools::SUBMIT, json!({}));
    assert!(obs.done && !obs.error);
    let obs = step(&mut session, tools::VIEW, json!({"path": "README.md"}));
    assert!(obs.error, "steps after submit are refused");
    assert!(session.verify_sync().unwrap().is_success());
}

/// `tests.test_mod.Class.test` as pytest writes it: `tests/test_mod.py::Class::test`.
fn pytest_id(id: &str) -> String {
    let parts: Vec<&str> = id.split('.').collect();
    format!("{}.py::{}", parts[..2].join("/"), parts[2..].join("::"))
}

#[test]
fn loader_reads_the_swe_gym_shape_and_names_errors() {
    let dir = tempfile::tempdir().unwrap();
    let env = SweEnv::builtin();
    let inst = env.instance("lrukit__memoize-kwargs").unwrap();
    // SWE-bench style: test lists as JSON text, extra fields, files on disk via repo_path.
    let repo = dir.path().join("repos/lru");
    for (path, text) in &inst.files {
        let target = repo.join(path);
        std::fs::create_dir_all(target.parent().unwrap()).unwrap();
        std::fs::write(target, text).unwrap();
    }
    let mut inline = serde_json::to_value(inst).unwrap();
    inline["instance_id"] = json!("user__inline");
    inline.as_object_mut().unwrap().remove("split");
    let on_disk = json!({
        "instance_id": "user__on-disk",
        "repo": "someone/lru",
        "base_commit": "abc123",
        "problem_statement": inst.problem_statement,
        "repo_path": "repos/lru",
        "patch": inst.patch,
        // pytest node ids are converted to unittest names.
        "FAIL_TO_PASS": serde_json::to_string(&inst.fail_to_pass.iter().map(|id| pytest_id(id)).collect::<Vec<_>>()).unwrap(),
        "PASS_TO_PASS": serde_json::to_string(&inst.pass_to_pass).unwrap(),
        "split": "validation",
        // Call specs keyed by pytest ids are converted too.
        "call_tests": inst.call_tests.iter().map(|(id, steps)| (pytest_id(id), json!(steps))).collect::<serde_json::Map<String, Value>>(),
    });
    let file = dir.path().join("instances.jsonl");
    std::fs::write(&file, format!("{inline}\n\n{on_disk}\n")).unwrap();
    let loaded = SweEnv::load(&file, Split::Test).unwrap();
    assert_eq!(loaded.tasks(Split::Test).unwrap().len(), 1);
    assert_eq!(loaded.tasks(Split::Validation).unwrap().len(), 1);
    let on_disk = loaded.instance("user__on-disk").unwrap();
    assert_eq!(on_disk.files, inst.files);
    assert_eq!(on_disk.fail_to_pass, inst.fail_to_pass);
    assert_eq!(on_disk.call_tests, inst.call_tests);
    assert!(
        loaded
            .validate_instance("user__on-disk")
            .unwrap()
            .problems
            .is_empty()
    );
    let task = SweEnv::task_for(on_disk);
    let oracle = loaded.oracle(&task).unwrap();
    let t = block_on(run_episode(
        &oracle,
        &swe::base_harness(),
        &loaded,
        &task,
        0,
    ))
    .unwrap();
    assert!(t.is_success(), "{}", t.outcome.details);

    let bad_lines = [
        ("{not json", "", "JSON"),
        (r#"{"instance_id": "x"}"#, "problem_statement", "missing"),
        (
            r#"{"instance_id": "x", "problem_statement": "p", "files": {"a.py": 3}}"#,
            "files.a.py",
            "string",
        ),
        (
            r#"{"instance_id": "x", "problem_statement": "p", "files": {"../a.py": "x"}, "patch": "", "FAIL_TO_PASS": ["t.a"]}"#,
            "files",
            "..",
        ),
        (
            r#"{"instance_id": "x", "problem_statement": "p", "files": {"a.py": "x\n"}, "patch": "--- a/a.py\n+++ b/a.py\n@@ -1,1 +1,1 @@\n-y\n+z\n", "FAIL_TO_PASS": ["t.a"]}"#,
            "patch",
            "does not apply",
        ),
        (
            r#"{"instance_id": "x", "problem_statement": "p", "files": {"a.py": "x\n"}, "patch": "--- a/a.py\n+++ b/a.py\n@@ -1,1 +1,1 @@\n-x\n+z\n", "FAIL_TO_PASS": "[1]"}"#,
            "FAIL_TO_PASS[0]",
            "test id",
        ),
        (
            r#"{"instance_id": "x", "problem_statement": "p", "files": {"a.py": "x\n"}, "patch": "--- a/a.py\n+++ b/a.py\n@@ -1,1 +1,1 @@\n-x\n+z\n", "FAIL_TO_PASS": ["t.a"], "split": "later"}"#,
            "split",
            "train, validation or test",
        ),
        (
            r#"{"instance_id": "x", "problem_statement": "p", "files": {"a.py": "x\n"}, "patch": "--- a/a.py\n+++ b/a.py\n@@ -1,1 +1,1 @@\n-x\n+z\n", "FAIL_TO_PASS": ["t.a"], "call_tests": {"t.a": {"see": 1}}}"#,
            "call_tests.t.a",
            "expected a list of steps",
        ),
        (
            r#"{"instance_id": "x", "problem_statement": "p", "files": {"a.py": "x\n"}, "patch": "--- a/a.py\n+++ b/a.py\n@@ -1,1 +1,1 @@\n-x\n+z\n", "FAIL_TO_PASS": ["t.a"], "call_tests": {"t.a": [{"see": {"call": "a:f"}, "expect": 1}]}}"#,
            "call_tests",
            "unknown key `expect`",
        ),
        (
            r#"{"instance_id": "x", "problem_statement": "p", "files": {"a.py": "x\n"}, "patch": "--- a/a.py\n+++ b/a.py\n@@ -1,1 +1,1 @@\n-x\n+z\n", "FAIL_TO_PASS": ["t.a"], "call_tests": {"t.b": [{"see": 1}]}}"#,
            "call_tests",
            "has no steps for `t.a`",
        ),
    ];
    for (line, field, expected) in bad_lines {
        std::fs::write(&file, format!("# comment\n{line}\n")).unwrap();
        let message = SweEnv::load(&file, Split::Train).unwrap_err().to_string();
        assert!(message.contains("instances.jsonl"), "{message}");
        assert!(message.contains("line 2"), "{message}");
        assert!(
            message.contains(&format!("`{field}`")) || field.is_empty(),
            "{message}"
        );
        assert!(message.contains(expected), "{message}");
    }
    let twice = format!("{inline}\n{inline}\n");
    std::fs::write(&file, twice).unwrap();
    let message = SweEnv::load(&file, Split::Train).unwrap_err().to_string();
    assert!(message.contains("already used on line 1"), "{message}");
}

#[test]
fn hidden_tests_are_judged_with_package_calls_only() {
    let env = SweEnv::builtin();
    let mut inst = env.instance("textkit__slugify-digits").unwrap().clone();
    // Move the failing test out of the visible repository into a hidden test patch.
    let visible = inst.files["tests/test_core.py"].clone();
    let hidden = visible.replace(
        "self.assertEqual(slugify(\"Release 2 of 10\"), \"release-2-of-10\")",
        "self.assertEqual(slugify(\"Route 66\"), \"route-66\")",
    );
    assert_ne!(visible, hidden);
    let extra = "import unittest\n\n\nclass TestExtra(unittest.TestCase):\n    def test_ok(self):\n        pass\n";
    inst.test_patch =
        swe::diff::unified_diff("tests/test_core.py", Some(&visible), Some(&hidden), 3)
            + &swe::diff::unified_diff("tests/test_extra.py", None, Some(extra), 3);
    inst.pass_to_pass
        .push("tests.test_extra.TestExtra.test_ok".into());
    // The judge's calls follow the hidden tests: the changed one, and the new file's test.
    // The calls name package code only: a call into the test module the patch creates is
    // refused when the instance is loaded, naming the place (test files are not in the copy
    // the judge's calls run in).
    inst.call_tests.insert(
        "tests.test_core.TestSlugify.test_digits_are_kept".into(),
        vec![json!({"see": {"call": "textkit.core:slugify", "args": ["Route 66"]}})],
    );
    inst.call_tests.insert(
        "tests.test_extra.TestExtra.test_ok".into(),
        vec![json!({"see": {"method": [{"call": "tests.test_extra:TestExtra", "args": ["test_ok"]}, "test_ok"]}})],
    );
    inst.instance_id = "textkit__hidden".into();
    let Err(err) = SweEnv::from_instances(vec![inst.clone()]) else {
        panic!("a call into a test module is refused");
    };
    let err = err.to_string();
    assert!(
        err.contains("call_tests.tests.test_extra.TestExtra.test_ok[0].see.method[0].call")
            && err.contains("test module"),
        "{err}"
    );
    inst.call_tests.insert(
        "tests.test_extra.TestExtra.test_ok".into(),
        vec![json!({"see": {"call": "textkit.core:slugify", "args": ["Extra Words Here"]}})],
    );
    let env = SweEnv::from_instances(vec![inst.clone()]).unwrap();
    assert!(
        env.validate_instance("textkit__hidden")
            .unwrap()
            .problems
            .is_empty()
    );
    let task = SweEnv::task_for(&inst);
    let mut session = env.start(&task).unwrap();
    let obs = step(&mut session, tools::SEARCH, json!({"pattern": "Route 66"}));
    assert!(
        obs.text.starts_with("No matches"),
        "the hidden test is not visible"
    );
    // A file the policy puts where the test patch creates one is replaced, not an error.
    let obs = step(
        &mut session,
        tools::CREATE,
        json!({"path": "tests/test_extra.py", "content": "raise SystemExit(1)\n"}),
    );
    assert!(!obs.error);
    for call in env.oracle(&task).unwrap().calls() {
        assert!(!session.step_sync(call).unwrap().error);
    }
    let outcome = session.verify_sync().unwrap();
    assert!(outcome.is_success(), "{}", outcome.details);
    let t = block_on(run_episode(
        &env.oracle(&task).unwrap(),
        &swe::base_harness(),
        &env,
        &task,
        0,
    ))
    .unwrap();
    assert!(t.is_success(), "{}", t.outcome.details);
}

fn arg_value() -> impl Strategy<Value = Value> {
    let leaf = prop_oneof![
        Just(Value::Null),
        any::<bool>().prop_map(Value::from),
        any::<i64>().prop_map(Value::from),
        (0u64..2000).prop_map(Value::from),
        "[a-z_./]{0,12}".prop_map(Value::from),
        prop_oneof![
            Just("../x"),
            Just("/etc/passwd"),
            Just("textkit/core.py"),
            Just("tests"),
            Just("."),
            Just("tests.test_core.TestWrap"),
            Just("(?P<"),
            Just("def "),
            Just("\0"),
        ]
        .prop_map(Value::from),
        ".{0,40}".prop_map(Value::from),
    ];
    leaf.prop_recursive(2, 8, 4, |inner| {
        prop_oneof![
            proptest::collection::vec(inner.clone(), 0..4).prop_map(Value::from),
            proptest::collection::btree_map("[a-z]{1,5}", inner, 0..3)
                .prop_map(|m| Value::Object(m.into_iter().collect())),
        ]
    })
}

fn arguments() -> impl Strategy<Value = Value> {
    let keys = prop_oneof![
        Just("path"),
        Just("start_line"),
        Just("end_line"),
        Just("pattern"),
        Just("old"),
        Just("new"),
        Just("content"),
        Just("tests"),
        Just("command"),
        Just("bogus"),
    ];
    prop_oneof![
        4 => proptest::collection::btree_map(keys, arg_value(), 0..5)
            .prop_map(|m| Value::Object(m.into_iter().map(|(k, v)| (k.to_string(), v)).collect())),
        1 => arg_value(),
    ]
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 96, .. ProptestConfig::default() })]

    #[test]
    fn fuzzed_tool_arguments_never_panic(
        calls in proptest::collection::vec(
            (prop_oneof![
                Just(tools::VIEW), Just(tools::SEARCH), Just(tools::REPLACE),
                Just(tools::CREATE), Just(tools::RUN_TESTS), Just(tools::SUBMIT),
                Just(tools::SHELL), Just("other"),
            ], arguments()),
            1..6,
        )
    ) {
        let env = SweEnv::builtin();
        let task = &all_tasks(&env)[0];
        let mut session = env.start(task).unwrap();
        let root = session.root().to_path_buf();
        for (name, args) in calls {
            // `run_tests` with a valid list is slow (it runs Python); keep fuzzing to the checks.
            let args = if name == tools::RUN_TESTS && args.get("tests").is_some_and(Value::is_array) {
                json!({"tests": args["tests"], "bogus": 1})
            } else {
                args
            };
            let obs = session.step_sync(&ToolCall::new(name, args)).unwrap();
            prop_assert!(obs.error || !obs.text.is_empty());
        }
        // Whatever happened, nothing was written outside the copy's root.
        prop_assert!(root.exists());
    }
}
