//! Running the repository-repair world's Python tests: the test runner and the verdict runner,
//! on top of harness-sandbox's limited commands.

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;
use std::process::Command;
use std::time::Duration;

pub(crate) use harness_sandbox::exec::run_with_input;
pub use harness_sandbox::exec::{CommandOutput, command_env, run_command, run_limited};
use harness_sandbox::exec::{Report, ReportSpec, run_wired};

use super::sandbox::{Sandbox, UidLease};

/// The outcome of one test id.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum TestStatus {
    /// Every test under the id ran and passed.
    Pass,
    /// An assertion failed.
    Fail,
    /// The test raised, could not be imported, or the id names no test.
    Error,
    /// Every test under the id was skipped.
    Skipped,
    /// The run ended (timeout, crash) before the id reported.
    NotRun,
}

impl TestStatus {
    /// The status in lower case.
    pub fn as_str(self) -> &'static str {
        match self {
            TestStatus::Pass => "pass",
            TestStatus::Fail => "fail",
            TestStatus::Error => "error",
            TestStatus::Skipped => "skipped",
            TestStatus::NotRun => "not_run",
        }
    }
}

/// One run of the test runner.
#[derive(Debug, Clone)]
pub struct TestRun {
    /// The status of each requested id (every requested id appears).
    pub statuses: BTreeMap<String, TestStatus>,
    /// The status of each individual test that ran (a module or class id expands to many).
    pub tests: BTreeMap<String, TestStatus>,
    /// Why an id has no trustworthy verdict (no verdict, several, tampered test machinery),
    /// by id; only [`run_verdict_tests`] fills it.
    pub problems: BTreeMap<String, Vec<String>>,
    /// The runner's report and the tests' own output, capped.
    pub command: CommandOutput,
}

impl TestRun {
    /// Whether every requested id passed.
    pub fn all_pass(&self) -> bool {
        self.statuses.values().all(|s| *s == TestStatus::Pass)
    }
}

/// A command of the policy's: `program args` in `cwd`, inside `sandbox` when there is one
/// (where `cwd` is the only folder of the host it sees, writable when `writable`), otherwise
/// directly with [`command_env`]. `python` stands for the configured interpreter. Keep the
/// lease until the command has ended.
pub(crate) fn policy_command(
    config: &super::SweConfig,
    sandbox: Option<&Sandbox>,
    cwd: &Path,
    writable: bool,
    program: Program,
    args: &[&str],
) -> std::io::Result<(Command, Option<UidLease>)> {
    match sandbox {
        Some(sandbox) => {
            let python = sandbox.python().display().to_string();
            let program = match program {
                Program::Python => python.as_str(),
                Program::Shell => "sh",
            };
            sandbox.command(cwd, writable, program, args)
        }
        None => {
            let program = match program {
                Program::Python => config.python.as_str(),
                Program::Shell => "sh",
            };
            let mut command = Command::new(program);
            command
                .args(args)
                .current_dir(cwd)
                .env_clear()
                .envs(command_env(cwd));
            Ok((command, None))
        }
    }
}

/// What a policy's command starts.
#[derive(Debug, Clone, Copy)]
pub(crate) enum Program {
    /// The configured Python interpreter.
    Python,
    /// `sh`.
    Shell,
}

/// Run `sh -c <script>` in `cwd` for the policy (the `run_shell` tool): inside `sandbox` when
/// there is one, with `cwd` writable; stdout and stderr merged.
pub fn run_shell(
    config: &super::SweConfig,
    sandbox: Option<&Sandbox>,
    cwd: &Path,
    script: &str,
    timeout: Duration,
    cap: usize,
) -> std::io::Result<CommandOutput> {
    let (command, _lease) =
        policy_command(config, sandbox, cwd, true, Program::Shell, &["-c", script])?;
    run_command(command, timeout, cap)
}

/// The runner: loads each id with `unittest`, runs it, prints a line per id with the failures'
/// tracebacks, and writes `{"ids": {id: status}, "tests": {test: status}}` as JSON on its
/// stdout, which it first moves away from the tests (their prints go to stderr). With no ids
/// it discovers `test*.py` under `tests/` (or the root) and runs each test found. It drops
/// the working directory from `sys.path` until its own imports are done, so modules in the
/// repository cannot shadow `unittest` or `json`.
const RUNNER: &str = r#"
import sys
sys.path[:] = [p for p in sys.path if p not in ("", ".")]
import json, os, traceback, unittest
report_fd = os.dup(1)
os.dup2(2, 1)
ids = sys.argv[1:]
root = os.getcwd()
sys.path.insert(0, root)
loader = unittest.TestLoader()
tests = {}

class Recorder(unittest.TestResult):
    def note(self, test, status):
        if tests.get(test.id()) in (None, "pass", "skipped"):
            tests[test.id()] = status
    def addSuccess(self, test):
        super().addSuccess(test)
        self.note(test, "pass")
    def addFailure(self, test, err):
        super().addFailure(test, err)
        self.note(test, "fail")
    def addError(self, test, err):
        super().addError(test, err)
        self.note(test, "error")
    def addSkip(self, test, reason):
        super().addSkip(test, reason)
        self.note(test, "skipped")
    def addExpectedFailure(self, test, err):
        super().addExpectedFailure(test, err)
        self.note(test, "pass")
    def addUnexpectedSuccess(self, test):
        super().addUnexpectedSuccess(test)
        self.note(test, "fail")
    def addSubTest(self, test, subtest, err):
        super().addSubTest(test, subtest, err)
        if err is not None:
            self.note(test, "fail" if issubclass(err[0], test.failureException) else "error")

def flatten(suite):
    for item in suite:
        if isinstance(item, unittest.TestSuite):
            yield from flatten(item)
        else:
            yield item

if not ids:
    start = "tests" if os.path.isdir("tests") else "."
    try:
        found = loader.discover(start, pattern="test*.py", top_level_dir=root)
        ids = sorted(t.id() for t in flatten(found))
    except Exception as exc:
        print("ERROR discovery: %s" % exc)
    if not ids:
        print("no tests found")
statuses = {}
for test_id in ids:
    try:
        suite = loader.loadTestsFromName(test_id)
    except Exception:
        statuses[test_id] = "error"
        tests[test_id] = "error"
        print("ERROR %s\n%s" % (test_id, traceback.format_exc(limit=3)))
        continue
    result = Recorder()
    result.buffer = True
    suite.run(result)
    problems = [("FAIL", t, tb) for t, tb in result.failures] + [("ERROR", t, tb) for t, tb in result.errors]
    problems += [("FAIL", t, "unexpected success\n") for t in result.unexpectedSuccesses]
    if result.testsRun == 0:
        status = "error"
        tests[test_id] = "error"
        print("ERROR %s\nno test found under this id\n" % test_id)
    elif result.errors:
        status = "error"
    elif result.failures or result.unexpectedSuccesses:
        status = "fail"
    elif len(result.skipped) == result.testsRun:
        status = "skipped"
    else:
        status = "pass"
    statuses[test_id] = status
    if problems:
        for kind, test, tb in problems:
            print("%s %s\n%s" % (kind, test.id(), tb))
    else:
        print("%s %s" % (status.upper(), test_id))
    sys.stdout.flush()
sys.stdout.flush()
report = (json.dumps({"ids": statuses, "tests": tests}) + "\n").encode()
while report:
    report = report[os.write(report_fd, report):]
"#;

/// Run the test `ids` (all discovered tests when empty) with the configured Python in `cwd`,
/// all in one interpreter, inside `sandbox` when there is one (`cwd` writable). This is the
/// `run_tests` tool's runner: its statuses are feedback for the policy, and code under test can
/// rewrite them; verdicts come from [`run_verdict_tests`].
pub fn run_tests(
    config: &super::SweConfig,
    sandbox: Option<&Sandbox>,
    cwd: &Path,
    ids: &[String],
    timeout: Duration,
    cap: usize,
) -> std::io::Result<TestRun> {
    // `-B`: no bytecode files in the copy; `-s`: no user site-packages. Not `-I`, which would
    // also ignore PYTHONHASHSEED and so make set ordering differ between runs.
    let mut args: Vec<&str> = vec!["-B", "-s"];
    if config.no_site {
        args.push("-S");
    }
    args.extend(["-c", RUNNER]);
    args.extend(ids.iter().map(String::as_str));
    let (command, _lease) = policy_command(config, sandbox, cwd, true, Program::Python, &args)?;
    let spec = ReportSpec {
        cap: 4 << 20,
        answer: None,
        input: None,
    };
    let (command, report) = run_wired(command, timeout, cap, Some(spec))?;
    #[derive(serde::Deserialize, Default)]
    struct Statuses {
        ids: BTreeMap<String, TestStatus>,
        tests: BTreeMap<String, TestStatus>,
    }
    let Statuses {
        ids: reported,
        tests,
    } = String::from_utf8_lossy(&report.bytes)
        .lines()
        .last()
        .and_then(|line| serde_json::from_str(line).ok())
        .unwrap_or_default();
    let statuses = if ids.is_empty() {
        reported
    } else {
        ids.iter()
            .map(|id| {
                (
                    id.clone(),
                    reported.get(id).copied().unwrap_or(TestStatus::NotRun),
                )
            })
            .collect()
    };
    Ok(TestRun {
        statuses,
        tests,
        problems: BTreeMap::new(),
        command,
    })
}

/// The verifier's runner ([`run_verdict_tests`]).
const VERDICT_RUNNER: &str = include_str!("verdict_runner.py");

/// Run the test `ids` with unittest for a verdict, inside `sandbox` when there is one, with
/// `cwd` read-only there. The verdict is produced in the process that imports the policy's
/// code, so code that knows this protocol (or unittest's internals) can forge it: the verifier
/// uses it only for instances without call specs, and only when
/// `SweConfig::allow_in_process_verdict` allows it; otherwise the call judge decides
/// ([`super::judge`]). `crates/swe/tests/swe_judge.rs` shows routes that beat it.
///
/// A runner process that never imports repository code forks one test process per id; only
/// that process loads the repository. It sends each test's outcome on the report channel (its
/// stdout; the tests' own prints go to stderr, the output) the moment unittest records it, and
/// any tampering it finds (builtins, unittest, the runner's own functions, test methods
/// defined outside the test files). When its tests are done it forks a reporter and exits,
/// ending every thread the repository's code started. The reporter waits until the test
/// process is gone, checks that nothing else the tests started still runs, and writes `done`
/// with the number of lines sent for the id. Only then does this function make the id's key
/// and send it on the runner's stdin; the reporter seals the id's lines with it. So until the
/// tests have ended, the key exists nowhere in the sandbox: not in a frame, a closure, an
/// object the garbage collector holds, `/proc/self` or a pipe.
///
/// An id passes only when its lines hold one `loaded` list, an outcome for each loaded test and
/// all of them `pass`, no problem, one `done` counting every line before it, and one seal, last,
/// with this id's key and the count of lines before it; and the runner finished on its own
/// (exit code 0, no timeout, report not cut off). `timeout` bounds the whole run; `cap` the
/// output kept.
pub fn run_verdict_tests(
    config: &super::SweConfig,
    sandbox: Option<&Sandbox>,
    cwd: &Path,
    ids: &[String],
    timeout: Duration,
    cap: usize,
) -> std::io::Result<TestRun> {
    let mut args: Vec<&str> = vec!["-B", "-s"];
    if config.no_site {
        args.push("-S");
    }
    args.extend([
        "-c",
        VERDICT_RUNNER,
        if sandbox.is_some() {
            "sandboxed"
        } else {
            "unsandboxed"
        },
    ]);
    args.extend(ids.iter().map(String::as_str));
    let (command, _lease) = policy_command(config, sandbox, cwd, false, Program::Python, &args)?;
    let keys: std::sync::Arc<std::sync::Mutex<BTreeMap<String, String>>> = Default::default();
    let wanted: BTreeSet<String> = ids.iter().cloned().collect();
    let issued = std::sync::Arc::clone(&keys);
    let answer = move |line: &[u8]| -> Option<Vec<u8>> {
        let value: serde_json::Value = serde_json::from_slice(line).ok()?;
        let id = value.get("id")?.as_str()?;
        value.get("done")?;
        if !wanted.contains(id) {
            return None;
        }
        let mut keys = issued.lock().unwrap_or_else(|e| e.into_inner());
        if keys.contains_key(id) {
            return None;
        }
        let key: String = rand::random::<[u8; 16]>()
            .iter()
            .map(|b| format!("{b:02x}"))
            .collect();
        keys.insert(id.to_string(), key.clone());
        Some(format!("{key}\n").into_bytes())
    };
    let spec = ReportSpec {
        cap: 4 << 20,
        answer: Some(Box::new(answer)),
        input: None,
    };
    let (command, report) = run_wired(command, timeout, cap, Some(spec))?;
    let keys = keys.lock().unwrap_or_else(|e| e.into_inner()).clone();
    Ok(parse_verdicts(ids, &report, &keys, command))
}

/// What the report says of one id.
#[derive(Default)]
struct IdReport {
    lines: Vec<serde_json::Value>,
}

impl IdReport {
    /// The id's status and what is wrong with its report, if anything.
    fn judge(
        &self,
        key: Option<&String>,
    ) -> (TestStatus, BTreeMap<String, TestStatus>, Vec<String>) {
        let mut problems = Vec::new();
        let mut loaded: Option<Vec<String>> = None;
        let mut outcomes: BTreeMap<String, TestStatus> = BTreeMap::new();
        let mut done_at = None;
        let mut sealed = false;
        let last = self.lines.len().saturating_sub(1);
        for (i, line) in self.lines.iter().enumerate() {
            if sealed {
                problems.push("lines after the seal".to_string());
                break;
            }
            if let Some(n) = line.get("done") {
                if done_at.is_some() {
                    problems.push("more than one `done`".into());
                } else if n.as_u64() != Some(i as u64) {
                    problems.push(format!(
                        "`done` counts {n} lines, but {i} arrived before it (lines were added or lost)"
                    ));
                }
                done_at = Some(i);
            } else if let Some(seal) = line.get("seal") {
                sealed = true;
                if i != last {
                    problems.push("the seal is not the last line".into());
                }
                if done_at != Some(i.wrapping_sub(1)) {
                    problems.push("the seal does not follow `done`".into());
                }
                if line.get("lines").and_then(|n| n.as_u64()) != Some(i as u64) {
                    problems.push("the seal's line count does not match".into());
                }
                if key.is_none() || seal.as_str() != key.map(String::as_str) {
                    problems.push("the seal does not carry this id's key".into());
                }
            } else if done_at.is_some() {
                problems.push("lines between `done` and the seal".into());
            } else if let Some(list) = line.get("loaded") {
                let names: Option<Vec<String>> = list.as_array().and_then(|items| {
                    items
                        .iter()
                        .map(|v| v.as_str().map(str::to_string))
                        .collect()
                });
                match (names, &loaded) {
                    (Some(names), None) => loaded = Some(names),
                    _ => problems.push("a second or malformed list of loaded tests".into()),
                }
            } else if let (Some(test), Some(status)) = (
                line.get("test").and_then(|t| t.as_str()),
                line.get("status")
                    .and_then(|s| serde_json::from_value::<TestStatus>(s.clone()).ok()),
            ) {
                let entry = outcomes.entry(test.to_string()).or_insert(status);
                if status.rank() > entry.rank() {
                    *entry = status;
                }
            } else if let Some(problem) = line.get("problem") {
                problems.push(
                    problem
                        .as_str()
                        .unwrap_or("a malformed problem")
                        .to_string(),
                );
            } else {
                problems.push(format!(
                    "an unreadable report line: {}",
                    line.to_string().chars().take(200).collect::<String>()
                ));
            }
        }
        if !sealed {
            problems.push(
                "no sealed verdict: the tests did not finish, or tampered with the report".into(),
            );
        }
        let loaded = loaded.unwrap_or_default();
        if loaded.is_empty() {
            problems.push("no test found under this id".into());
        }
        let missing: Vec<&str> = loaded
            .iter()
            .filter(|t| !outcomes.contains_key(*t))
            .map(String::as_str)
            .collect();
        if !missing.is_empty() {
            problems.push(format!(
                "no outcome for {}",
                missing
                    .iter()
                    .take(10)
                    .copied()
                    .collect::<Vec<_>>()
                    .join(", ")
            ));
        }
        if outcomes.keys().any(|t| !loaded.contains(t)) {
            problems.push("outcomes for tests that were not loaded".into());
        }
        let status = if !problems.is_empty() {
            TestStatus::Error
        } else {
            outcomes
                .values()
                .copied()
                .max_by_key(|s| s.rank())
                .unwrap_or(TestStatus::Error)
        };
        (status, outcomes, problems)
    }
}

impl TestStatus {
    /// How bad the status is, for taking the worst of several.
    fn rank(self) -> u8 {
        match self {
            TestStatus::Pass => 0,
            TestStatus::Skipped => 1,
            TestStatus::Fail => 2,
            TestStatus::Error => 3,
            TestStatus::NotRun => 4,
        }
    }
}

fn parse_verdicts(
    ids: &[String],
    report: &Report,
    keys: &BTreeMap<String, String>,
    mut command: CommandOutput,
) -> TestRun {
    let mut reports: BTreeMap<&str, IdReport> = BTreeMap::new();
    // A line that names no requested id goes to the id being reported at the time; before
    // any, it spoils the whole run.
    let mut open: Option<&str> = None;
    let mut stray = false;
    for raw in report.bytes.split(|b| *b == b'\n') {
        if raw.iter().all(u8::is_ascii_whitespace) {
            continue;
        }
        let value = serde_json::from_slice::<serde_json::Value>(raw).ok();
        let id = value
            .as_ref()
            .and_then(|v| v.get("id"))
            .and_then(|v| v.as_str())
            .and_then(|id| ids.iter().find(|i| i.as_str() == id))
            .map(String::as_str);
        let line =
            value.unwrap_or_else(|| serde_json::json!({"problem": "an unreadable report line"}));
        match id.or(open) {
            Some(id) => {
                let sealed = line.get("seal").is_some();
                reports.entry(id).or_default().lines.push(line);
                open = if sealed { None } else { Some(id) };
            }
            None => stray = true,
        }
    }
    let finished = !command.timed_out && command.status == Some(0) && !report.overflow;
    let mut statuses = BTreeMap::new();
    let mut tests = BTreeMap::new();
    let mut problems: BTreeMap<String, Vec<String>> = BTreeMap::new();
    let mut summary = String::new();
    for id in ids {
        let (mut status, outcomes, mut why) = match reports.get(id.as_str()) {
            None => (
                TestStatus::NotRun,
                BTreeMap::new(),
                vec!["no verdict was reported for this id".to_string()],
            ),
            Some(report) => report.judge(keys.get(id)),
        };
        if status == TestStatus::Pass && !finished {
            why.push("the runner did not finish on its own, so no verdict is trusted".into());
            status = TestStatus::NotRun;
        } else if status == TestStatus::Pass && stray {
            why.push("the report holds lines for ids that were not asked for".into());
            status = TestStatus::Error;
        }
        summary.push_str(&format!("{} {id}", status.as_str().to_uppercase()));
        if !why.is_empty() {
            summary.push_str(&format!(": {}", why.join("; ")));
        }
        summary.push('\n');
        tests.extend(outcomes);
        statuses.insert(id.clone(), status);
        if !why.is_empty() {
            problems.insert(id.clone(), why);
        }
    }
    if !command.output.is_empty() && !command.output.ends_with('\n') {
        command.output.push('\n');
    }
    command.output.push_str(&summary);
    TestRun {
        statuses,
        tests,
        problems,
        command,
    }
}
