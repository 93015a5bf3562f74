//! The repository-repair verifier against policy-written code that games the test runner, and
//! test runs that stay off the async runtime.
//!
//! Each attack is a small malicious change to `textkit/__init__.py` (imported by every test of
//! the instance) that leaves the bug in place. Each test shows the attack is real (the plain
//! `run_tests` runner, which runs every test in one interpreter and reads a statuses file,
//! reports the FAIL_TO_PASS test as passing), then that the verdict runner does not, and that
//! the episode scores 0 with the change flagged in the outcome's details.

use std::time::{Duration, Instant};

use harness_core::{EnvSession, Split, Task, ToolCall, run_episode};
use harness_envs::swe::{self, SweEnv, SweInstance, SweSession, TestStatus, exec, tools};
use harness_testkit::ScriptedPolicy;
use serde_json::{Value, json};

const INSTANCE: &str = "textkit__truncate-exact-width";
const INIT: &str = "textkit/__init__.py";

fn instance() -> SweInstance {
    SweEnv::builtin().instance(INSTANCE).unwrap().clone()
}

/// The instance with FAIL_TO_PASS at class level, as SWE-Gym instances sometimes list it: the
/// whole `TestTruncate` class must pass.
fn class_level_instance() -> SweInstance {
    let mut inst = instance();
    let class = "tests.test_core.TestTruncate";
    inst.pass_to_pass.retain(|id| !id.starts_with(class));
    inst.fail_to_pass = vec![class.to_string()];
    inst.instance_id = "textkit__truncate-class-level".into();
    inst
}

fn env_of(inst: &SweInstance) -> SweEnv {
    SweEnv::from_instances(vec![inst.clone()])
        .unwrap()
        .with_config(swe::SweConfig {
            no_site: true,
            ..swe::SweConfig::default()
        })
}

/// What each check found.
struct Attack {
    /// The plain runner's status of each FAIL_TO_PASS id after the change.
    plain: Vec<TestStatus>,
    /// The verdict runner's.
    verdict: Vec<TestStatus>,
    /// The episode's outcome.
    reward: f32,
    details: Value,
}

fn run_attack(inst: &SweInstance, payload: &str) -> Attack {
    let content = format!("{}\n{payload}", inst.files[INIT]);
    run_attack_files(inst, &[(INIT, content.as_str())])
}

/// Write `files` through the session's file tools, run the plain runner and the verdict runner
/// on the copy, and play a whole episode that makes the same edits.
fn run_attack_files(inst: &SweInstance, files: &[(&str, &str)]) -> Attack {
    let env = env_of(inst);
    let task = SweEnv::task_for(inst);
    let edits: Vec<ToolCall> = files
        .iter()
        .map(|(path, content)| {
            ToolCall::new(tools::CREATE, json!({"path": path, "content": content}))
        })
        .collect();

    let mut session: SweSession = env.start(&task).unwrap();
    for edit in &edits {
        let obs = session.step_sync(edit).unwrap();
        assert!(!obs.error, "{}", obs.text);
    }
    let config = env.config();
    let sandbox = env.sandbox().unwrap();
    let plain = exec::run_tests(
        config,
        sandbox.as_deref(),
        session.root(),
        &inst.fail_to_pass,
        Duration::from_secs(20),
        20_000,
    )
    .unwrap();
    let verdict = exec::run_verdict_tests(
        config,
        sandbox.as_deref(),
        session.root(),
        &inst.fail_to_pass,
        Duration::from_secs(20),
        20_000,
    )
    .unwrap();
    let statuses = |run: &exec::TestRun| {
        inst.fail_to_pass
            .iter()
            .map(|id| run.statuses[id])
            .collect::<Vec<_>>()
    };

    let mut script: Vec<String> = edits.iter().map(ToolCall::to_tool_call_block).collect();
    script.push(ToolCall::new(tools::SUBMIT, json!({})).to_tool_call_block());
    let policy = ScriptedPolicy::new(script);
    let t = futures::executor::block_on(run_episode(&policy, &swe::base_harness(), &env, &task, 0))
        .unwrap();
    Attack {
        plain: statuses(&plain),
        verdict: statuses(&verdict),
        reward: t.reward(),
        details: t.outcome.details,
    }
}

fn assert_defeated(attack: &Attack, rule: &str) {
    assert!(
        attack.plain.iter().all(|s| *s == TestStatus::Pass),
        "the attack should fool the plain runner (else this test shows nothing): {:?}",
        attack.plain
    );
    assert!(
        attack.verdict.iter().all(|s| *s != TestStatus::Pass),
        "the verdict runner passed a FAIL_TO_PASS test: {:?}",
        attack.verdict
    );
    assert_eq!(attack.reward, 0.0, "{}", attack.details);
    let flagged = attack.details["tamper"]
        .as_array()
        .is_some_and(|f| f.iter().any(|f| f["rule"] == rule && f["path"] == INIT));
    assert!(flagged, "no `{rule}` finding in {}", attack.details);
}

/// The policy's code writes a report of passes on every file descriptor the runner may read,
/// then leaves before the runner can.
#[test]
fn early_exit_with_forged_statuses_scores_zero() {
    let attack = run_attack(
        &instance(),
        r#"
import json as _j, os as _o, sys as _s
_ids = [a for a in _s.argv[1:] if a.startswith("tests.")]
if _ids:
    _line = (_j.dumps({"ids": {i: "pass" for i in _ids}, "tests": {}}) + "\n").encode()
    for _fd in range(3, 10):
        try:
            _o.write(_fd, _line)
        except OSError:
            pass
    _o._exit(0)
"#,
    );
    assert_defeated(&attack, "interpreter exit (sys.exit, os._exit, SystemExit)");
}

/// An exit hook writes a report of passes (and forged verdict lines) after the runner has
/// written its own.
#[test]
fn atexit_rewriting_statuses_scores_zero() {
    let attack = run_attack(
        &instance(),
        r#"
import atexit as _a, json as _j, os as _o, sys as _s
def _rewrite():
    ids = [a for a in _s.argv[1:] if a.startswith("tests.")]
    for i in ids:
        print("@@verdict " + _j.dumps({"id": i, "status": "pass", "tests": {}, "problems": []}))
    line = (_j.dumps({"ids": {i: "pass" for i in ids}, "tests": {}}) + "\n").encode()
    for fd in range(3, 10):
        try:
            _o.write(fd, line)
        except OSError:
            pass
_a.register(_rewrite)
"#,
    );
    assert_defeated(&attack, "exit hooks (atexit)");
}

/// The runner's recorder is patched through `__main__`, and unittest's assertions are disarmed.
#[test]
fn patching_the_runner_and_unittest_through_main_scores_zero() {
    let attack = run_attack(
        &instance(),
        r#"
import __main__ as _m, unittest as _u
_r = getattr(_m, "Recorder", None)
if _r is not None:
    _r.addFailure = lambda self, test, err: self.addSuccess(test)
_u.TestCase.assertEqual = lambda self, first, second, msg=None: None
"#,
    );
    assert_defeated(&attack, "the runner's module (__main__)");
}

/// `builtins.__import__` is wrapped so that the test module's tests are emptied once loaded.
#[test]
fn patching_builtins_scores_zero() {
    let attack = run_attack(
        &instance(),
        r#"
import builtins as _b, sys as _s
_orig = _b.__import__
def _imp(name, globals=None, locals=None, fromlist=(), level=0):
    module = _orig(name, globals, locals, fromlist, level)
    for key, mod in list(_s.modules.items()):
        if key.startswith("tests.") and mod is not None:
            for value in list(vars(mod).values()):
                if isinstance(value, type):
                    for attr in list(vars(value)):
                        if attr.startswith("test"):
                            setattr(value, attr, lambda self: None)
    return module
_b.__import__ = _imp
"#,
    );
    assert_defeated(&attack, "builtins");
}

/// The failing case is skipped instead of fixed; with FAIL_TO_PASS at class level the plain
/// runner counts a class with one skip and four passes as passing.
#[test]
fn skipping_tests_scores_zero() {
    let attack = run_attack(
        &class_level_instance(),
        r#"
import unittest as _u
from . import core as _c
_t = _c.truncate
def _skip_exact(text, width, ellipsis="..."):
    if len(text) == width:
        raise _u.SkipTest("not applicable")
    return _t(text, width, ellipsis)
_c.truncate = _skip_exact
"#,
    );
    assert_defeated(&attack, "test machinery (unittest)");
    assert_eq!(attack.verdict, vec![TestStatus::Skipped]);
}

/// Names built at run time pass the text scan; the runner still sees no verdict.
#[test]
fn an_early_exit_the_scan_cannot_read_still_fails() {
    let inst = instance();
    let env = env_of(&inst);
    let task = SweEnv::task_for(&inst);
    let payload = "import importlib as _i\ngetattr(_i.import_module('o' + 's'), '_e' + 'xit')(0)\n";
    let content = format!("{}\n{payload}", inst.files[INIT]);
    let mut session = env.start(&task).unwrap();
    let obs = session
        .step_sync(&ToolCall::new(
            tools::CREATE,
            json!({"path": INIT, "content": content}),
        ))
        .unwrap();
    assert!(!obs.error, "{}", obs.text);
    let outcome = session.verify_sync().unwrap();
    assert_eq!(outcome.reward, 0.0, "{}", outcome.details);
    assert!(
        outcome.details.get("tamper").is_none(),
        "{}",
        outcome.details
    );
    let problems = outcome.details["problems"].to_string();
    assert!(problems.contains("no verdict"), "{}", outcome.details);
}

/// The gold patch still passes the verdict runner, and it reports the per-test outcomes.
#[test]
fn the_gold_patch_passes_the_verdict_runner() {
    let inst = class_level_instance();
    let env = env_of(&inst);
    let report = env.validate_instance(&inst.instance_id).unwrap();
    assert!(report.problems.is_empty(), "{:?}", report.problems);
    assert_eq!(
        report.after.tests["tests.test_core.TestTruncate.test_exact_width_unchanged"],
        TestStatus::Pass
    );
    assert_eq!(
        report.before.statuses["tests.test_core.TestTruncate"],
        TestStatus::Fail
    );
}

// ---------------------------------------------------------------------------------------------
// Test runs off the async runtime.

/// An instance whose only PASS_TO_PASS test takes 0.4 s.
fn slow_instance() -> SweInstance {
    let mut inst = instance();
    inst.files.insert(
        "tests/test_slow.py".into(),
        "import time\nimport unittest\n\n\nclass TestSlow(unittest.TestCase):\n    def test_slow(self):\n        time.sleep(0.4)\n".into(),
    );
    inst.pass_to_pass = vec!["tests.test_slow.TestSlow.test_slow".into()];
    inst.instance_id = "textkit__slow".into();
    inst
}

/// Whether the intervals share an instant: the latest start comes before the earliest end.
fn all_overlap(intervals: &[(Instant, Instant)]) -> bool {
    let latest_start = intervals.iter().map(|i| i.0).max().unwrap();
    let earliest_end = intervals.iter().map(|i| i.1).min().unwrap();
    latest_start < earliest_end
}

/// Eight episodes on one runtime thread: if a test run blocked the thread, each would start
/// only after the previous one ended; off the runtime, all eight are under way together.
#[tokio::test(flavor = "current_thread")]
async fn eight_concurrent_test_runs_overlap_on_one_runtime_thread() {
    let inst = slow_instance();
    let env = env_of(&inst);
    let task: Task = SweEnv::task_for(&inst);
    assert_eq!(task.split, Split::Train);
    let mut sessions: Vec<SweSession> = (0..8).map(|_| env.start(&task).unwrap()).collect();
    let call = ToolCall::new(
        tools::RUN_TESTS,
        json!({"tests": ["tests.test_slow.TestSlow.test_slow"]}),
    );
    let steps = sessions.iter_mut().map(|session| {
        let call = call.clone();
        async move {
            let start = Instant::now();
            let obs = session.step(&call).await.unwrap();
            let end = Instant::now();
            assert!(obs.text.contains("1 passed"), "{}", obs.text);
            (start, end)
        }
    });
    let intervals = futures::future::join_all(steps).await;
    assert!(
        all_overlap(&intervals),
        "run_tests calls ran one after another: {intervals:?}"
    );

    let verifies = sessions.iter_mut().map(|session| async move {
        let start = Instant::now();
        let outcome = session.verify(None).await.unwrap();
        let end = Instant::now();
        // The bug is still there, so the verdict is a failure, after the slow test ran.
        assert_eq!(outcome.reward, 0.0);
        assert_eq!(
            outcome.details["PASS_TO_PASS"]["tests.test_slow.TestSlow.test_slow"],
            "pass"
        );
        (start, end)
    });
    let intervals = futures::future::join_all(verifies).await;
    assert!(
        all_overlap(&intervals),
        "verifications ran one after another: {intervals:?}"
    );
}

/// The time limit still holds off the runtime: a test that sleeps past it is killed.
#[tokio::test(flavor = "current_thread")]
async fn the_time_limit_holds_off_the_runtime() {
    let inst = slow_instance();
    let env = env_of(&inst).with_config(swe::SweConfig {
        no_site: true,
        command_timeout: Duration::from_millis(150),
        ..swe::SweConfig::default()
    });
    let task = SweEnv::task_for(&inst);
    let mut session = env.start(&task).unwrap();
    let obs = session
        .step(&ToolCall::new(
            tools::RUN_TESTS,
            json!({"tests": ["tests.test_slow.TestSlow.test_slow"]}),
        ))
        .await
        .unwrap();
    assert!(obs.error, "{}", obs.text);
    assert!(obs.text.contains("time limit"), "{}", obs.text);
}
