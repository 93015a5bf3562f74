//! Running commands with a time limit and an output cap, and running Python tests.
//!
//! Every command starts in its own process group with a cleared environment, stdin closed and
//! stdout and stderr merged into one pipe. When the time limit passes, the whole group is
//! killed (so `sleep 100 &` inside a shell dies too). Output beyond the cap is drained and
//! counted but not kept. None of this is a security sandbox: the command runs as the same user
//! with the same file-system and network access as the caller.

use std::collections::BTreeMap;
use std::io::Read;
use std::os::unix::process::CommandExt;
use std::path::Path;
use std::process::{Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

/// What a limited command did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CommandOutput {
    /// The exit code (`None` when killed by a signal, including on timeout).
    pub status: Option<i32>,
    /// The time limit was reached and the process group was killed.
    pub timed_out: bool,
    /// Merged stdout and stderr, at most the cap (cut at a character boundary).
    pub output: String,
    /// Bytes of output beyond the cap that were dropped.
    pub dropped_bytes: usize,
    /// Wall-clock time.
    pub elapsed: Duration,
}

impl CommandOutput {
    /// The output with a note on dropped bytes and how the command ended.
    pub fn describe(&self) -> String {
        let mut text = self.output.clone();
        if self.dropped_bytes > 0 {
            if !text.ends_with('\n') {
                text.push('\n');
            }
            text.push_str(&format!(
                "[... {} more bytes of output dropped]\n",
                self.dropped_bytes
            ));
        }
        if self.timed_out {
            text.push_str(&format!(
                "[killed after the time limit of {:.1} s]\n",
                self.elapsed.as_secs_f64()
            ));
        } else {
            match self.status {
                Some(code) => text.push_str(&format!("[exit code {code}]\n")),
                None => text.push_str("[terminated by a signal]\n"),
            }
        }
        text
    }
}

/// Run `program args` in `cwd` with only the variables in `env`, killing its process group
/// after `timeout`, keeping at most `cap` bytes of output.
pub fn run_limited(
    program: &str,
    args: &[&str],
    cwd: &Path,
    env: &BTreeMap<String, String>,
    timeout: Duration,
    cap: usize,
) -> std::io::Result<CommandOutput> {
    let start = Instant::now();
    let (mut reader, writer) = std::io::pipe()?;
    let mut command = Command::new(program);
    command
        .args(args)
        .current_dir(cwd)
        .env_clear()
        .envs(env)
        .stdin(Stdio::null())
        .stdout(writer.try_clone()?)
        .stderr(writer)
        .process_group(0);
    let mut child = command.spawn()?;
    // The command value holds the parent's copies of the pipe's write end; drop them so the
    // reader sees end-of-file once the children are gone.
    drop(command);
    let pid = child.id();

    let (done_tx, done_rx) = mpsc::channel();
    std::thread::spawn(move || {
        let mut kept = Vec::new();
        let mut dropped = 0usize;
        let mut buf = [0u8; 8192];
        loop {
            match reader.read(&mut buf) {
                Ok(0) => break,
                Ok(n) => {
                    let room = cap.saturating_sub(kept.len());
                    kept.extend_from_slice(&buf[..n.min(room)]);
                    dropped += n.saturating_sub(room);
                }
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
                Err(_) => break,
            }
        }
        let _ = done_tx.send((kept, dropped));
    });

    let mut timed_out = false;
    let mut pause = Duration::from_millis(1);
    let status = loop {
        if let Some(status) = child.try_wait()? {
            // Whatever the command left running in its group goes with it.
            kill_group(pid);
            break status;
        }
        if start.elapsed() >= timeout {
            timed_out = true;
            kill_group(pid);
            let _ = child.kill();
            break child.wait()?;
        }
        std::thread::sleep(pause.min(timeout.saturating_sub(start.elapsed())));
        pause = (pause * 2).min(Duration::from_millis(20));
    };
    // Background processes the command left behind may still hold the pipe open.
    let (kept, dropped) = match done_rx.recv_timeout(Duration::from_secs(2)) {
        Ok(result) => result,
        Err(_) => {
            kill_group(pid);
            done_rx
                .recv_timeout(Duration::from_secs(1))
                .unwrap_or_else(|_| {
                    (
                        b"[output unavailable: a process outside the command's group kept it open]"
                            .to_vec(),
                        0,
                    )
                })
        }
    };
    let output = String::from_utf8_lossy(&kept).into_owned();
    Ok(CommandOutput {
        status: if timed_out { None } else { status.code() },
        timed_out,
        output,
        dropped_bytes: dropped,
        elapsed: start.elapsed(),
    })
}

/// Kill every process of the group `pgid` (the group leader's pid). The workspace forbids
/// `unsafe`, so this asks the system's `kill` program rather than calling `kill(2)` directly.
fn kill_group(pgid: u32) {
    let _ = Command::new("kill")
        .args(["-KILL", "--", &format!("-{pgid}")])
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status();
}

/// The environment commands see: a fixed `PATH` from the caller plus deterministic settings.
pub fn command_env(home: &Path) -> BTreeMap<String, String> {
    let mut env = BTreeMap::new();
    env.insert(
        "PATH".to_string(),
        // invariant-exception: the child inherits the caller's PATH to find python3; this is not configuration.
        std::env::var("PATH").unwrap_or_else(|_| "/usr/local/bin:/usr/bin:/bin".to_string()),
    );
    env.insert("HOME".to_string(), home.display().to_string());
    env.insert("LANG".to_string(), "C.UTF-8".to_string());
    env.insert("PYTHONDONTWRITEBYTECODE".to_string(), "1".to_string());
    env.insert("PYTHONHASHSEED".to_string(), "0".to_string());
    env.insert("PYTHONIOENCODING".to_string(), "utf-8".to_string());
    env.insert("PYTHONNOUSERSITE".to_string(), "1".to_string());
    env
}

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

/// The runner: loads each id with `unittest`, runs it, prints a line per id with the failures'
/// tracebacks, and writes `{id: status}` as JSON to the file named by its first argument. With
/// no ids it discovers `test*.py` under `tests/` (or the root) and runs each test found. It
/// drops the working directory from `sys.path` until its own imports are done, so modules in
/// the repository cannot shadow `unittest` or `json`.
const RUNNER: &str = r#"
import sys
sys.path[:] = [p for p in sys.path if p not in ("", ".")]
import json, os, traceback, unittest
out_path, ids = sys.argv[1], sys.argv[2:]
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
with open(out_path, "w") as handle:
    json.dump({"ids": statuses, "tests": tests}, handle)
"#;

/// Run the test `ids` (all discovered tests when empty) with the configured Python in `cwd`,
/// all in one interpreter. This is the `run_tests` tool's runner: its statuses are feedback
/// for the policy, and code under test can rewrite them; verdicts come from
/// [`run_verdict_tests`].
pub fn run_tests(
    config: &super::SweConfig,
    cwd: &Path,
    ids: &[String],
    timeout: Duration,
    cap: usize,
) -> std::io::Result<TestRun> {
    let out_dir = tempfile::tempdir()?;
    let out_path = out_dir.path().join("statuses.json");
    let out_arg = out_path.display().to_string();
    // `-B`: no bytecode files in the copy; `-s`: no user site-packages. Not `-I`, which would
    // also ignore PYTHONHASHSEED and so make set ordering differ between runs.
    let mut args: Vec<&str> = vec!["-B", "-s"];
    if config.no_site {
        args.push("-S");
    }
    args.extend(["-c", RUNNER, &out_arg]);
    args.extend(ids.iter().map(String::as_str));
    let command = run_limited(&config.python, &args, cwd, &command_env(cwd), timeout, cap)?;
    #[derive(serde::Deserialize, Default)]
    struct Report {
        ids: BTreeMap<String, TestStatus>,
        tests: BTreeMap<String, TestStatus>,
    }
    let Report {
        ids: reported,
        tests,
    } = std::fs::read_to_string(&out_path)
        .ok()
        .and_then(|text| serde_json::from_str(&text).ok())
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

/// Run the test `ids` for a verdict the repository's code cannot forge by the usual means.
///
/// A runner process that never imports repository code forks one child per id (a fresh copy
/// of the pristine interpreter); only the child loads the repository. The child's output goes
/// to a pipe the runner reads, so it has no handle on the stream read here; its verdict comes
/// once, tagged with a key made for that child, and counts only when the child then exits
/// normally. The child checks that builtins, unittest and `sys.exit`/`os._exit` are as the
/// runner found them, and that every test it loaded reported. Here, an id passes only when
/// exactly one verdict line names it, says `pass`, and the runner finished on its own
/// (`@@done`, exit code 0): a missing, repeated or skipped verdict, or a runner that was killed
/// or timed out, is not a pass. `timeout` bounds the whole run; `cap` the output kept.
pub fn run_verdict_tests(
    config: &super::SweConfig,
    cwd: &Path,
    ids: &[String],
    timeout: Duration,
    cap: usize,
) -> std::io::Result<TestRun> {
    let cap_arg = cap.to_string();
    let mut args: Vec<&str> = vec!["-B", "-s"];
    if config.no_site {
        args.push("-S");
    }
    args.extend(["-c", VERDICT_RUNNER, &cap_arg]);
    args.extend(ids.iter().map(String::as_str));
    // Room for the verdict lines beyond the children's output, which the runner caps at `cap`.
    let room = cap + 1024 + ids.iter().map(|id| 2 * id.len() + 512).sum::<usize>();
    let command = run_limited(&config.python, &args, cwd, &command_env(cwd), timeout, room)?;
    Ok(parse_verdicts(ids, command))
}

/// One `@@verdict` line of the verifier's runner.
#[derive(serde::Deserialize)]
struct VerdictLine {
    id: String,
    status: TestStatus,
    #[serde(default)]
    tests: BTreeMap<String, TestStatus>,
    #[serde(default)]
    problems: Vec<String>,
}

fn parse_verdicts(ids: &[String], command: CommandOutput) -> TestRun {
    let mut seen: BTreeMap<String, Vec<VerdictLine>> = BTreeMap::new();
    let mut done = false;
    for line in command.output.lines() {
        if let Some(json) = line.strip_prefix("@@verdict ") {
            match serde_json::from_str::<VerdictLine>(json) {
                Ok(v) => seen.entry(v.id.clone()).or_default().push(v),
                Err(_) => seen.entry(String::new()).or_default().push(VerdictLine {
                    id: String::new(),
                    status: TestStatus::Error,
                    tests: BTreeMap::new(),
                    problems: vec!["an unreadable verdict line".into()],
                }),
            }
        } else if line.strip_prefix("@@done ") == Some(&ids.len().to_string()) {
            done = true;
        }
    }
    let finished = done && !command.timed_out && command.status == Some(0);
    let stray = seen.keys().any(|id| !ids.contains(id));
    let mut statuses = BTreeMap::new();
    let mut tests = BTreeMap::new();
    let mut problems: BTreeMap<String, Vec<String>> = BTreeMap::new();
    for id in ids {
        let mut why = Vec::new();
        let status = match seen.remove(id).as_deref() {
            None | Some([]) => {
                why.push("no verdict was reported for this id".to_string());
                TestStatus::NotRun
            }
            Some([one]) => {
                why.extend(one.problems.iter().cloned());
                tests.extend(one.tests.iter().map(|(k, v)| (k.clone(), *v)));
                one.status
            }
            Some(several) => {
                why.push(format!(
                    "{} verdicts were reported for this id; expected one",
                    several.len()
                ));
                TestStatus::Error
            }
        };
        let status = if status == TestStatus::Pass && !finished {
            why.push("the runner did not finish on its own, so no verdict is trusted".into());
            TestStatus::NotRun
        } else if status == TestStatus::Pass && stray {
            why.push("the output holds verdicts for ids that were not asked for".into());
            TestStatus::Error
        } else {
            status
        };
        statuses.insert(id.clone(), status);
        if !why.is_empty() {
            problems.insert(id.clone(), why);
        }
    }
    TestRun {
        statuses,
        tests,
        problems,
        command,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sh(script: &str, timeout: Duration, cap: usize) -> CommandOutput {
        let dir = tempfile::tempdir().unwrap();
        run_limited(
            "sh",
            &["-c", script],
            dir.path(),
            &command_env(dir.path()),
            timeout,
            cap,
        )
        .unwrap()
    }

    #[test]
    fn captures_merged_output_and_exit_code() {
        let out = sh(
            "echo out; echo err >&2; exit 3",
            Duration::from_secs(5),
            1000,
        );
        assert_eq!(out.status, Some(3));
        assert!(out.output.contains("out\n") && out.output.contains("err\n"));
        assert!(!out.timed_out);
    }

    #[test]
    fn kills_the_whole_group_on_timeout() {
        let out = sh("sleep 30 & sleep 30", Duration::from_millis(300), 1000);
        assert!(out.timed_out);
        assert!(out.elapsed < Duration::from_secs(5), "{:?}", out.elapsed);
        assert!(out.describe().contains("time limit"));
    }

    #[test]
    fn background_processes_die_with_the_command() {
        let dir = tempfile::tempdir().unwrap();
        let marker = dir.path().join("marker");
        let script = format!("(sleep 1; touch {}) > /dev/null 2>&1 &", marker.display());
        let out = sh(&script, Duration::from_secs(5), 1000);
        assert_eq!(out.status, Some(0));
        std::thread::sleep(Duration::from_millis(1500));
        assert!(!marker.exists(), "the background process survived");
    }

    #[test]
    fn caps_output() {
        let out = sh("yes | head -c 1000000", Duration::from_secs(10), 100);
        assert_eq!(out.output.len(), 100);
        assert_eq!(out.dropped_bytes, 1_000_000 - 100);
    }

    #[test]
    fn environment_is_cleared() {
        let out = sh("echo \"[$CARGO]\"", Duration::from_secs(5), 1000);
        assert!(out.output.starts_with("[]"), "{}", out.output);
    }
}
