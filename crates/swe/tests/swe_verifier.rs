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
use harness_swe::{self as swe, SweEnv, SweInstance, SweSession, TestStatus, exec, tools};
use harness_testkit::ScriptedPolicy;
use serde_json::{Value, json};

const INSTANCE: &str = "textkit__truncate-exact-width";
const INIT: &str = "textkit/__init__.py";

fn instance() -> SweInstance {
    SweEnv::builtin().instance(INSTANCE).unwrap().clone()
}

/// The instance with FAIL_TO_PASS at class level, as SWE-Gym instances sometimes list it: the
/// whole `TestTruncate` class must pass.
/// It has no call specs (they are per test method), so its episodes are verified by the
/// in-process unittest runner, which [`env_of`] allows.
fn class_level_instance() -> SweInstance {
    let mut inst = instance();
    let class = "tests.test_core.TestTruncate";
    inst.pass_to_pass.retain(|id| !id.starts_with(class));
    inst.fail_to_pass = vec![class.to_string()];
    inst.instance_id = "textkit__truncate-class-level".into();
    inst.call_tests.clear();
    inst
}

/// The instance's environment. Instances with call specs (the built-in one) are judged outside
/// the policy's process; the in-process runner is allowed for those without.
fn env_of(inst: &SweInstance) -> SweEnv {
    SweEnv::from_instances(vec![inst.clone()])
        .unwrap()
        .with_config(swe::SweConfig {
            no_site: true,
            allow_in_process_verdict: true,
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
// Routes from the test process to the verdict (issue 25, item 2). Each attack builds the names
// the tamper scan looks for at run time, so only the runner's design stands in the way; each
// first shows it is real by forging the plain runner's report.

/// The generic forger the route attacks share: given frames and objects a route reached, it
/// forges a verdict of the verifier's earlier runner (its child's key and verdict pipe were
/// locals of a frame below the tests), turns every recorded failure into a success, writes
/// passes for every test id to every file descriptor the frames name, and leaves at once.
const FORGE: &str = r#"
import json as _j, os as _o, sys as _s
_ex = getattr(_o, "_e" + "xit")
_F = "f_"
def _forge(frames, objects=()):
    ids = [a for a in _s.argv[1:] if a.startswith("tests.")]
    fds = set()
    objects = list(objects)
    for fr in frames:
        for scope in (getattr(fr, _F + "locals"), getattr(fr, _F + "globals")):
            if "key" in scope and "verdict_fd" in scope:
                line = {"key": scope["key"], "status": "pass", "tests": {}, "problems": []}
                _o.write(scope["verdict_fd"], (_j.dumps(line) + "\n").encode())
                _ex(0)
            for name, value in list(scope.items()):
                if type(value) is int and name.endswith("_fd"):
                    fds.add(value)
            objects += list(scope.values())
    for obj in objects:
        try:
            if type(obj) is dict and "fail" in obj.values():
                for k in list(obj):
                    if obj[k] in ("fail", "error"):
                        obj[k] = "pass"
            for attr in ("failures", "errors"):
                if type(getattr(obj, attr, None)) is list:
                    getattr(obj, attr).clear()
        except Exception:
            pass
    forged = [_j.dumps({"id": i, "test": i, "status": "pass"}) for i in ids]
    forged.append(_j.dumps({"ids": {i: "pass" for i in ids}, "tests": {}}))
    data = ("\n".join(forged) + "\n").encode()
    for fd in sorted(fds):
        try:
            _o.write(fd, data)
        except OSError:
            pass
    _ex(0)
"#;

fn assert_runtime_defeated(attack: &Attack, plain_fooled: bool) {
    if plain_fooled {
        assert!(
            attack.plain.iter().all(|s| *s == TestStatus::Pass),
            "the attack should fool the plain runner (else this test shows nothing): {:?}",
            attack.plain
        );
    }
    assert!(
        attack.verdict.iter().all(|s| *s != TestStatus::Pass),
        "the verdict runner passed a FAIL_TO_PASS test: {:?}",
        attack.verdict
    );
    assert_eq!(attack.reward, 0.0, "{}", attack.details);
    assert!(
        attack.details.get("tamper").is_none(),
        "the scan caught it, so this test shows nothing of the runner: {}",
        attack.details
    );
}

/// A module planted in a cache or hidden folder, where the tamper scan used not to look,
/// carries code that walks the frames (plainly written: no scan reads it there). The
/// repository imports it, so the plain runner is fooled; the verifier's copy holds no hidden
/// or cache folders, so the import fails there.
#[test]
fn a_module_planted_in_a_cache_folder_scores_zero() {
    let planted = format!(
        "{FORGE}\nimport sys\n_frames = []\n_f = sys._getframe(0)\nwhile _f is not None:\n    _frames.append(_f)\n    _f = _f.f_back\n_forge(_frames)\n"
    );
    for (folder, import) in [
        (
            "textkit/__pycache__",
            "from .__pycache__ import _speedups\n",
        ),
        (
            "textkit/.git",
            "import importlib.util as _u, os as _p\n_spec = _u.spec_from_file_location('textkit._speedups', _p.path.join(_p.path.dirname(__file__), '.git', '_speedups.py'))\n_spec.loader.exec_module(_u.module_from_spec(_spec))\n",
        ),
    ] {
        let inst = instance();
        let init = format!("{}\n{import}", inst.files[INIT]);
        let module = format!("{folder}/_speedups.py");
        let attack = run_attack_files(
            &inst,
            &[(module.as_str(), planted.as_str()), (INIT, init.as_str())],
        );
        assert_runtime_defeated(&attack, true);
        let left_out = attack.details["left_out"].to_string();
        assert!(
            left_out.contains(&format!("{folder}/")),
            "{}",
            attack.details
        );
    }
}

/// Introspection through `inspect` and `sys._getframe`: every frame below the repository's
/// import, its locals and globals.
#[test]
fn introspection_through_inspect_and_getframe_scores_zero() {
    let payload = format!(
        r#"{FORGE}
import inspect as _i
_frames = [_fi.frame for _fi in _i.stack(0)]
_f = getattr(_s, "_get" + "frame")(0)
while _f is not None:
    _frames.append(_f)
    _f = getattr(_f, _F + "back")
_forge(_frames)
"#
    );
    let attack = run_attack(&instance(), &payload);
    assert_runtime_defeated(&attack, true);
}

/// Objects that hold frames: a running generator's frame, a traceback's frame and whatever the
/// garbage collector tracks (frames, generators, result objects, tables of outcomes).
#[test]
fn objects_holding_frames_score_zero() {
    let payload = format!(
        r#"{FORGE}
_frames = []
def _walk(f):
    while f is not None:
        _frames.append(f)
        f = getattr(f, _F + "back")
_holder = []
def _gen():
    _walk(getattr(getattr(_holder[0], "gi_" + "frame"), _F + "back"))
    yield
_holder.append(_gen())
next(_holder[0])
try:
    raise ValueError("frames")
except ValueError as _e:
    _walk(getattr(_e.__traceback__, "tb_" + "frame"))
import gc as _gc
_objects = getattr(_gc, "get_" + "objects")()
for _obj in _objects:
    if type(_obj).__name__ == "frame":
        _walk(_obj)
    elif type(_obj).__name__ == "generator" and getattr(_obj, "gi_" + "frame", None) is not None:
        _walk(getattr(_obj, "gi_" + "frame"))
_forge(_frames, _objects)
"#
    );
    let attack = run_attack(&instance(), &payload);
    assert_runtime_defeated(&attack, true);
}

/// File-descriptor discovery: every descriptor in `/proc/self/fd` is read (without blocking)
/// for anything that could be a key, and every one is written with forged verdicts in the
/// earlier runner's format and this one's (each test passing, sealed with every key found).
#[test]
fn file_descriptor_discovery_scores_zero() {
    let payload = r#"
import json as _j, os as _o, sys as _s
_fd_dir = "/" + "proc/self/fd"
_found = {}
for _name in _o.listdir(_fd_dir):
    _fd = int(_name)
    try:
        _o.set_blocking(_fd, False)
        _found[_fd] = _o.read(_fd, 4096)
    except OSError:
        _found[_fd] = b""
_keys = [_v.strip().decode("ascii", "replace") for _v in _found.values() if _v.strip()]
_ids = [_a for _a in _s.argv[1:] if _a.startswith("tests.")]
_lines = []
for _i in _ids:
    for _k in _keys + [""]:
        _lines.append({"key": _k, "status": "pass", "tests": {}, "problems": []})
        _lines.append({"id": _i, "loaded": [_i]})
        _lines.append({"id": _i, "test": _i, "status": "pass"})
        _lines.append({"id": _i, "done": 2})
        _lines.append({"id": _i, "seal": _k, "lines": 3})
_lines.append({"ids": {_i: "pass" for _i in _ids}, "tests": {}})
_data = "".join(_j.dumps(_l) + "\n" for _l in _lines).encode()
for _fd in _found:
    try:
        _o.write(_fd, _data)
    except OSError:
        pass
getattr(_o, "_e" + "xit")(0)
"#;
    let attack = run_attack(&instance(), payload);
    assert_runtime_defeated(&attack, true);
}

/// Names built at run time: `exit` through builtins, `os._exit`, a disarmed assertion in
/// unittest, and the test method swapped for one that passes (by a profile hook that rewrites
/// the test class the moment its module has loaded). None is in the scan's sight.
#[test]
fn names_built_at_run_time_score_zero() {
    let attacks = [
        (
            "import importlib as _il\ngetattr(_il.import_module('bu' + 'iltins'), 'ex' + 'it')(0)\n",
            false,
        ),
        (
            "import importlib as _il\ngetattr(_il.import_module('o' + 's'), '_e' + 'xit')(0)\n",
            false,
        ),
        (
            "import importlib as _il\n_tc = _il.import_module('unit' + 'test').TestCase\n_tc.assertEqual = lambda self, first, second, msg=None: None\n",
            true,
        ),
        (
            r#"
import importlib as _il
_sy = _il.import_module("s" + "ys")
_setp = getattr(_sy, "set" + "profile")
def _watch(frame, event, arg):
    if event == "return" and frame.f_code.co_name == "<module>":
        scope = getattr(frame, "f_" + "globals")
        if scope.get("__name__") == "tests.test_core":
            setattr(scope["TestTruncate"], "test_exact_width_unchanged", lambda self: None)
            _setp(None)
_setp(_watch)
"#,
            true,
        ),
    ];
    for (payload, plain_fooled) in attacks {
        let attack = run_attack(&instance(), payload);
        assert_runtime_defeated(&attack, plain_fooled);
    }
}

// ---------------------------------------------------------------------------------------------
// Test runs off the async runtime.

/// An instance whose only PASS_TO_PASS test takes 0.4 s (as a unittest method, and as calls
/// for the judge).
fn slow_instance() -> SweInstance {
    let mut inst = instance();
    inst.files.insert(
        "tests/test_slow.py".into(),
        "import time\nimport unittest\n\n\nclass TestSlow(unittest.TestCase):\n    def test_slow(self):\n        time.sleep(0.4)\n".into(),
    );
    let slow = "tests.test_slow.TestSlow.test_slow".to_string();
    inst.pass_to_pass = vec![slow.clone()];
    inst.call_tests
        .retain(|id, _| inst.fail_to_pass.contains(id));
    inst.call_tests.insert(
        slow,
        vec![json!({"see": {"call": "time:sleep", "args": [0.4]}})],
    );
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
