//! External harnesses: the standard-library Python agent (`agents/dbbench_agent.py`) solves
//! DBBench tasks through the recording proxy and the environment server, its trajectories
//! hold the tokens the policy sampled, and a crashing, a hanging and a never-finishing
//! program each give a failed episode with its reason and leave no process behind. In the
//! sandbox (bubblewrap) the agent still solves its tasks, a child that left the session with
//! `setsid` and a hanging program are gone after the episode, and a file outside the
//! sandbox's binds cannot be read.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use harness_core::{Split, Task, Termination};
use harness_envs::dbbench::{self, DbBench, GeneratorConfig};
use harness_external::envserver::client::RemoteEnv;
use harness_external::envserver::server::{EnvServer, EnvServerConfig, EnvServerHandle};
use harness_external::program::{
    ExternalHarness, ExternalKind, ProgramFailure, ProgramLimits, ProgramRunner, RunnerSettings,
    program_sandbox,
};
use harness_external::proxy::{ProxyConfig, ProxyHandle, RecordingProxy};
use harness_sandbox::{Sandbox, SandboxConfig};
use harness_testkit::{FnPolicy, byte_tokens};

/// `python3`, or `None` to skip. Under CI (`CI=true`) it must be there.
fn python() -> Option<&'static str> {
    let found = std::process::Command::new("python3")
        .arg("--version")
        .output()
        .is_ok_and(|o| o.status.success());
    if found {
        return Some("python3");
    }
    assert!(
        !ci(),
        "python3 is not on PATH and CI=true: the external-harness tests need it"
    );
    println!("skipping: python3 is not on PATH (under CI=true this fails)");
    None
}

fn ci() -> bool {
    std::env::var("CI").is_ok_and(|v| matches!(v.trim(), "true" | "1"))
}

/// The program sandbox (bubblewrap with a network of its own, where only the servers are
/// reachable), or `None` to skip when bwrap is not installed. Under CI (`CI=true`) it must be there; where it is, the sandbox must work.
fn sandbox(python: &str) -> Option<Arc<Sandbox>> {
    let found = std::process::Command::new("bwrap")
        .arg("--version")
        .output()
        .is_ok_and(|o| o.status.success());
    if !found {
        assert!(
            !ci(),
            "bwrap is not on PATH and CI=true: the sandboxed program tests need bubblewrap"
        );
        println!("skipping: bwrap is not on PATH (under CI=true this fails)");
        return None;
    }
    Some(program_sandbox(&SandboxConfig::default(), python).unwrap())
}

struct Rig {
    _env: EnvServerHandle,
    proxy: ProxyHandle,
    runner: ProgramRunner,
    local: DbBench,
}

/// DBBench served, and a proxy in front of a policy that plays each task's oracle: it finds
/// the task by its instruction and says the oracle's next turn, with byte tokens of a
/// prefix-stable rendering of the conversation (testkit's `FnPolicy`).
async fn rig() -> Rig {
    rig_with(None).await
}

/// [`rig`] whose programs run in `sandbox`.
async fn rig_with(sandbox: Option<Arc<Sandbox>>) -> Rig {
    let local = DbBench::generated(&GeneratorConfig {
        seed: 21,
        train: 4,
        validation: 2,
        test: 2,
    });
    // The runner holds the server's runner token; programs get their sessions' tokens.
    let runner_token = harness_external::envserver::fresh_token();
    let server = EnvServer::new(
        Arc::new(local.clone()),
        EnvServerConfig {
            runner_token: Some(runner_token.clone()),
            ..EnvServerConfig::default()
        },
    )
    .unwrap();
    let env = EnvServerHandle::spawn("127.0.0.1:0".parse().unwrap(), server)
        .await
        .unwrap();
    let oracles: Vec<(String, Vec<String>)> = local
        .all_tasks()
        .iter()
        .map(|t| {
            (
                t.instruction.clone(),
                dbbench::oracle_turns(t, false).unwrap(),
            )
        })
        .collect();
    let policy = FnPolicy::new("oracle", move |request| {
        let asked = request
            .messages
            .iter()
            .find(|m| m.role == harness_core::Role::User)
            .map(|m| m.content.clone())
            .unwrap_or_default();
        let done = request
            .messages
            .iter()
            .filter(|m| m.role == harness_core::Role::Assistant)
            .count();
        oracles
            .iter()
            .find(|(instruction, _)| asked.starts_with(instruction.as_str()))
            .and_then(|(_, turns)| turns.get(done).cloned())
            .unwrap_or_else(|| "I do not know this task.".into())
    });
    let proxy = RecordingProxy::new(Arc::new(policy), ProxyConfig::new("policy")).unwrap();
    let proxy = ProxyHandle::spawn("127.0.0.1:0".parse().unwrap(), proxy)
        .await
        .unwrap();
    let remote = RemoteEnv::connect_as(env.base_url(), runner_token)
        .await
        .unwrap();
    let runner = ProgramRunner::new(
        remote,
        proxy.proxy().clone(),
        proxy.base_url(),
        "oracle",
        RunnerSettings {
            path: std::env::var("PATH").unwrap_or_default(),
            sandbox,
            ..RunnerSettings::default()
        },
    );
    Rig {
        _env: env,
        proxy,
        runner,
        local,
    }
}

fn agent_path() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("agents/dbbench_agent.py")
}

fn program(command: &[&str], timeout_s: f64) -> ExternalHarness {
    ExternalHarness {
        kind: ExternalKind::External,
        name: "test-program".into(),
        description: String::new(),
        command: command.iter().map(|s| s.to_string()).collect(),
        env: Default::default(),
        limits: ProgramLimits {
            max_model_calls: 15,
            max_env_actions: 15,
            timeout_s,
            ..ProgramLimits::default()
        },
    }
}

/// Live (not zombie) processes whose process group is `pgid`.
fn group_members(pgid: u32) -> Vec<u32> {
    let mut out = Vec::new();
    for entry in std::fs::read_dir("/proc").unwrap().flatten() {
        let Ok(pid) = entry.file_name().to_string_lossy().parse::<u32>() else {
            continue;
        };
        let Ok(stat) = std::fs::read_to_string(entry.path().join("stat")) else {
            continue;
        };
        // pid (comm) state ppid pgrp ...
        let Some(rest) = stat.rsplit_once(')').map(|(_, r)| r) else {
            continue;
        };
        let fields: Vec<&str> = rest.split_whitespace().collect();
        if fields.len() > 2 && fields[0] != "Z" && fields[2] == pgid.to_string() {
            out.push(pid);
        }
    }
    out
}

fn assert_nothing_left(pgid: u32) {
    assert!(pgid > 0);
    let start = Instant::now();
    while !group_members(pgid).is_empty() && start.elapsed() < Duration::from_secs(3) {
        std::thread::sleep(Duration::from_millis(20));
    }
    assert_eq!(
        group_members(pgid),
        Vec::<u32>::new(),
        "processes left behind"
    );
}

/// A marker no other process carries: a sleep duration (`1000.<digits>`) unique to this call.
fn marker() -> String {
    static COUNT: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);
    let n = COUNT.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .subsec_nanos();
    format!("1000.{}{n}{nanos:09}", std::process::id())
}

/// Live processes whose command line holds `marker`.
fn marked(marker: &str) -> Vec<u32> {
    let mut out = Vec::new();
    for entry in std::fs::read_dir("/proc").unwrap().flatten() {
        let Ok(pid) = entry.file_name().to_string_lossy().parse::<u32>() else {
            continue;
        };
        let Ok(cmdline) = std::fs::read(entry.path().join("cmdline")) else {
            continue;
        };
        if String::from_utf8_lossy(&cmdline).contains(marker) {
            out.push(pid);
        }
    }
    out
}

fn assert_no_marked(marker: &str) {
    let start = Instant::now();
    while !marked(marker).is_empty() && start.elapsed() < Duration::from_secs(3) {
        std::thread::sleep(Duration::from_millis(20));
    }
    assert_eq!(marked(marker), Vec::<u32>::new(), "processes left behind");
}

fn tasks(rig: &Rig, split: Split) -> Vec<Task> {
    rig.local
        .all_tasks()
        .iter()
        .filter(|t| t.split == split)
        .cloned()
        .collect()
}

#[tokio::test]
async fn the_python_agent_solves_dbbench_through_the_proxy_and_the_env_server() {
    let Some(python) = python() else { return };
    let rig = rig().await;
    let agent = agent_path();
    let harness = program(&[python, agent.to_str().unwrap()], 60.0);
    for task in tasks(&rig, Split::Train) {
        let episode = rig.runner.run(&harness, &task, 5).await.unwrap();
        let t = &episode.trajectory;
        assert_eq!(episode.run.failure, None, "{:?}", episode.run);
        assert_eq!(episode.run.exit_code, Some(0));
        assert!(t.is_success(), "{}\n{:?}", t.transcript(), episode.run);
        assert_eq!(t.termination, Termination::EnvDone);
        assert_eq!(t.harness_name, "test-program");
        assert_eq!(t.harness_id, harness.id());
        // The turns are the policy's own tokens, one per oracle turn, and the agent kept its
        // history as it was answered: no prefix break.
        let oracle = dbbench::oracle_turns(&task, false).unwrap();
        assert_eq!(t.turns.len(), oracle.len());
        for (turn, text) in t.turns.iter().zip(&oracle) {
            assert_eq!(turn.tokens, byte_tokens(text));
            assert!(!turn.context_tokens.is_empty());
        }
        assert_eq!(
            episode.record.prefix_breaks, 0,
            "{:?}",
            episode.record.extends_previous
        );
        assert_eq!(t.counts.env_actions as usize, oracle.len());
        assert_nothing_left(episode.run.pid);
    }
    let stats = rig.proxy.proxy().stats();
    assert_eq!(stats.episodes, 4);
    assert_eq!(stats.prefix_breaks, 0);
    assert_eq!(rig.proxy.proxy().open_episodes(), 0);
}

#[tokio::test]
async fn the_python_agents_hook_messages_are_recorded_as_hooks() {
    let Some(python) = python() else { return };
    let rig = rig().await;
    let agent = agent_path();
    let hook = |name: Option<&str>| {
        let mut h = serde_json::json!({
            "event": "after_tool",
            "condition": "always",
            "message": "Check the result before you commit."
        });
        if let Some(name) = name {
            h["name"] = name.into();
        }
        h
    };
    let task = tasks(&rig, Split::Train).remove(0);
    let mut harness = program(&[python, agent.to_str().unwrap()], 60.0);
    harness.env.insert(
        "AGENT_HOOKS".into(),
        serde_json::json!([hook(Some("check"))]).to_string(),
    );
    let t = rig.runner.run(&harness, &task, 5).await.unwrap().trajectory;
    assert!(t.is_success(), "{}", t.transcript());
    let hooks: Vec<&harness_core::TrajectoryMessage> =
        t.messages.iter().filter(|m| m.hook.is_some()).collect();
    // One warning after each action but the last (the episode ends with it).
    assert_eq!(
        hooks.len(),
        t.counts.env_actions as usize - 1,
        "{}",
        t.transcript()
    );
    assert!(hooks.iter().all(|m| m.hook.as_deref() == Some("check")
        && m.source == harness_core::Source::Harness
        && m.content == "Check the result before you commit."));
    assert_eq!(t.counts.hook_messages as usize, hooks.len());
    // Control: the same hook without a name is sent unmarked and recorded without a hook.
    harness.env.insert(
        "AGENT_HOOKS".into(),
        serde_json::json!([hook(None)]).to_string(),
    );
    let t = rig.runner.run(&harness, &task, 5).await.unwrap().trajectory;
    assert!(t.messages.iter().all(|m| m.hook.is_none()));
    assert!(
        t.messages
            .iter()
            .any(|m| m.content == "Check the result before you commit."),
        "{}",
        t.transcript()
    );
}

#[tokio::test]
async fn crashing_hanging_and_unfinished_programs_fail_with_their_reason() {
    let Some(python) = python() else { return };
    let rig = rig().await;
    let task = tasks(&rig, Split::Test)[0].clone();
    let crash = program(
        &[
            python,
            "-c",
            "import sys; sys.stderr.write('agent exploded\\n'); sys.exit(3)",
        ],
        30.0,
    );
    // A program that starts a grandchild and hangs: both must be gone afterwards.
    let hang = program(&["sh", "-c", "sleep 600 & sleep 600"], 1.0);
    let unfinished = program(&[python, "-c", "pass"], 30.0);
    // The agent itself, killed by its time limit before it can finish: the policy answers
    // every call, but the program has almost no time.
    let cases = [
        (crash, ProgramFailure::Crashed, "exited with status 3"),
        (hang, ProgramFailure::TimedOut, "past its limit of 1 s"),
        (
            unfinished,
            ProgramFailure::Unfinished,
            "without finishing its session",
        ),
    ];
    for (harness, failure, reason) in cases {
        let start = Instant::now();
        let episode = rig.runner.run(&harness, &task, 1).await.unwrap();
        assert!(
            start.elapsed() < Duration::from_secs(20),
            "{:?}",
            start.elapsed()
        );
        let t = &episode.trajectory;
        assert_eq!(episode.run.failure, Some(failure), "{:?}", episode.run);
        assert!(
            episode.run.reason.as_deref().unwrap().contains(reason),
            "{:?}",
            episode.run
        );
        assert_eq!(t.reward(), 0.0);
        assert_eq!(t.termination, Termination::ProgramFailed);
        let details = &t.outcome.details["external"];
        assert_eq!(details["failure"], serde_json::to_value(failure).unwrap());
        assert!(
            details["reason"].as_str().unwrap().contains(reason),
            "{details}"
        );
        assert_nothing_left(episode.run.pid);
    }
    // The crash's stderr is kept for the transcript.
    let episode = rig
        .runner
        .run(
            &program(
                &[
                    python,
                    "-c",
                    "import sys; sys.stderr.write('agent exploded\\n'); sys.exit(3)",
                ],
                30.0,
            ),
            &task,
            1,
        )
        .await
        .unwrap();
    assert!(
        episode.run.stderr_tail.contains("agent exploded"),
        "{:?}",
        episode.run
    );
    assert_eq!(episode.run.exit_code, Some(3));

    // A program that cannot be started is an infrastructure error naming it.
    let err = rig
        .runner
        .run(&program(&["/no/such/agent-binary"], 5.0), &task, 1)
        .await
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("/no/such/agent-binary") && err.contains("command"),
        "{err}"
    );
    // Every proxy episode was closed, whatever happened.
    assert_eq!(rig.proxy.proxy().open_episodes(), 0);
}

#[tokio::test]
async fn the_python_agent_solves_dbbench_in_the_sandbox() {
    let Some(python) = python() else { return };
    let Some(sandbox) = sandbox(python) else {
        return;
    };
    let rig = rig_with(Some(sandbox)).await;
    // A path relative to the runner's folder (the crate's, under cargo test): the runner
    // binds the script alone and hands the program the absolute path.
    assert!(Path::new("agents/dbbench_agent.py").is_file());
    let harness = program(&[python, "agents/dbbench_agent.py"], 60.0);
    for task in tasks(&rig, Split::Train).into_iter().take(2) {
        let episode = rig.runner.run(&harness, &task, 5).await.unwrap();
        let t = &episode.trajectory;
        assert_eq!(episode.run.failure, None, "{:?}", episode.run);
        assert!(t.is_success(), "{}\n{:?}", t.transcript(), episode.run);
        assert_eq!(t.termination, Termination::EnvDone);
        let oracle = dbbench::oracle_turns(&task, false).unwrap();
        assert_eq!(t.turns.len(), oracle.len());
        assert_eq!(episode.record.prefix_breaks, 0);
    }
    assert_eq!(rig.proxy.proxy().open_episodes(), 0);
}

/// Starts `setsid sleep <marker>` with its output elsewhere, waits until the child runs
/// `sleep` in a session of its own, reports that and its working folder, and exits.
const DETACH: &str = r#"
import os, subprocess, sys, time
child = subprocess.Popen(["setsid", "sleep", sys.argv[1]], stdin=subprocess.DEVNULL,
                         stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
deadline = time.time() + 10
while time.time() < deadline:
    try:
        with open("/proc/%d/cmdline" % child.pid, "rb") as handle:
            if handle.read().startswith(b"sleep\0") and os.getsid(child.pid) != os.getsid(0):
                break
    except OSError:
        pass
    time.sleep(0.01)
else:
    sys.exit("the child never detached")
sys.stderr.write("detached %d in %s\n" % (child.pid, os.getcwd()))
"#;

#[tokio::test]
async fn a_sandboxed_program_leaves_nothing_behind_even_after_setsid() {
    let Some(python) = python() else { return };
    let Some(sandbox) = sandbox(python) else {
        return;
    };
    // The control: without the sandbox the detached child outlives the episode.
    let rig = rig().await;
    let task = tasks(&rig, Split::Test)[0].clone();
    let escaped = marker();
    let episode = rig
        .runner
        .run(&program(&[python, "-c", DETACH, &escaped], 30.0), &task, 1)
        .await
        .unwrap();
    assert!(
        episode.run.stderr_tail.contains("detached"),
        "{:?}",
        episode.run
    );
    let left = marked(&escaped);
    assert_eq!(left.len(), 1, "the control's child did not outlive it");
    for pid in left {
        let _ = std::process::Command::new("kill")
            .args(["-KILL", &pid.to_string()])
            .status();
    }

    let rig = rig_with(Some(sandbox)).await;
    let inside = marker();
    let episode = rig
        .runner
        .run(&program(&[python, "-c", DETACH, &inside], 30.0), &task, 1)
        .await
        .unwrap();
    // It detached inside, then exited without finishing its session.
    assert_eq!(
        episode.run.failure,
        Some(ProgramFailure::Unfinished),
        "{:?}",
        episode.run
    );
    let line = episode
        .run
        .stderr_tail
        .lines()
        .find(|l| l.starts_with("detached"))
        .unwrap_or_else(|| panic!("{:?}", episode.run))
        .to_string();
    assert_no_marked(&inside);
    // Its working folder was its own, and it is gone.
    let workdir = line.rsplit(" in ").next().unwrap();
    assert!(workdir.contains("harness-program-"), "{line}");
    assert!(!Path::new(workdir).exists(), "{line}");
}

#[tokio::test]
async fn a_hanging_sandboxed_program_is_killed_at_its_limit_with_everything_inside() {
    let Some(python) = python() else { return };
    let Some(sandbox) = sandbox(python) else {
        return;
    };
    let rig = rig_with(Some(sandbox)).await;
    let task = tasks(&rig, Split::Test)[0].clone();
    let marker = marker();
    let script = format!("sleep {marker} & setsid sleep {marker} & sleep {marker}");
    let start = Instant::now();
    let episode = rig
        .runner
        .run(&program(&["sh", "-c", &script], 1.0), &task, 1)
        .await
        .unwrap();
    assert!(
        start.elapsed() < Duration::from_secs(10),
        "{:?}",
        start.elapsed()
    );
    assert_eq!(
        episode.run.failure,
        Some(ProgramFailure::TimedOut),
        "{:?}",
        episode.run
    );
    assert!(
        episode
            .run
            .reason
            .as_deref()
            .unwrap()
            .contains("past its limit of 1 s"),
        "{:?}",
        episode.run
    );
    assert_eq!(episode.trajectory.termination, Termination::ProgramFailed);
    assert_no_marked(&marker);
}

#[tokio::test]
async fn a_sandboxed_program_cannot_read_files_outside_its_binds() {
    let Some(python) = python() else { return };
    let Some(sandbox) = sandbox(python) else {
        return;
    };
    // A readable file in a fresh folder of the host, out of /tmp (private inside anyway).
    let dir = tempfile::Builder::new()
        .prefix("program-secret-")
        .tempdir_in(env!("CARGO_TARGET_TMPDIR"))
        .unwrap();
    let secret = dir.path().join("secret.txt");
    std::fs::write(&secret, "the host's secret").unwrap();
    use std::os::unix::fs::PermissionsExt as _;
    std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
    std::fs::set_permissions(&secret, std::fs::Permissions::from_mode(0o644)).unwrap();
    // The path goes in a variable, not an argument (whose folder would be bound).
    let mut reader = program(
        &[
            python,
            "-c",
            "import os, sys\ntry:\n    sys.stderr.write('read: ' + open(os.environ['SECRET_FILE']).read())\nexcept OSError as e:\n    sys.exit('cannot open: ' + type(e).__name__)\n",
        ],
        30.0,
    );
    reader
        .env
        .insert("SECRET_FILE".into(), secret.display().to_string());
    let task = tasks(&rig().await, Split::Test)[0].clone();

    let control = rig().await.runner.run(&reader, &task, 1).await.unwrap();
    assert!(
        control.run.stderr_tail.contains("read: the host's secret"),
        "{:?}",
        control.run
    );
    let episode = rig_with(Some(sandbox))
        .await
        .runner
        .run(&reader, &task, 1)
        .await
        .unwrap();
    assert_eq!(
        episode.run.failure,
        Some(ProgramFailure::Crashed),
        "{:?}",
        episode.run
    );
    assert!(
        episode
            .run
            .stderr_tail
            .contains("cannot open: FileNotFoundError"),
        "{:?}",
        episode.run
    );
    assert!(
        !episode.run.stderr_tail.contains("secret"),
        "{:?}",
        episode.run
    );
}

#[test]
fn a_missing_sandbox_is_an_error_naming_the_setting_and_the_fix() {
    let config = SandboxConfig {
        bwrap: "/nonexistent/bwrap".into(),
        ..SandboxConfig::default()
    };
    let err = program_sandbox(&config, "python3").unwrap_err().to_string();
    assert!(err.contains("runner.sandbox"), "{err}");
    assert!(err.contains("apt-get install bubblewrap"), "{err}");
}

#[test]
fn external_harness_files_are_checked_and_errors_name_file_and_field() {
    let file = Path::new("pool/members/agent.json");
    let good = r#"{"kind": "external", "name": "a", "command": ["python3", "agent.py"],
                   "env": {"STYLE": "terse"}, "limits": {"max_model_calls": 8, "timeout_s": 30}}"#;
    let harness = ExternalHarness::from_json(good, Some(file)).unwrap();
    assert_eq!(harness.limits.max_model_calls, 8);
    assert_eq!(
        harness.limits.max_env_actions,
        ProgramLimits::default().max_env_actions
    );
    // The id is a content hash: the name does not change it, the command does.
    let renamed = ExternalHarness {
        name: "b".into(),
        ..harness.clone()
    };
    assert_eq!(renamed.id(), harness.id());
    let other = ExternalHarness {
        command: vec!["python3".into(), "other.py".into()],
        ..harness.clone()
    };
    assert_ne!(other.id(), harness.id());
    for (text, needle) in [
        (
            r#"{"kind": "internal", "name": "a", "command": ["x"]}"#,
            "kind",
        ),
        (r#"{"kind": "external", "name": "a"}"#, "command"),
        (
            r#"{"kind": "external", "name": "a", "command": []}"#,
            "command",
        ),
        (
            r#"{"kind": "external", "name": "a", "command": [""]}"#,
            "command[0]",
        ),
        (
            r#"{"kind": "external", "name": "a", "command": ["x"], "env": {"HARNESS_PROXY_KEY": "k"}}"#,
            "env.HARNESS_PROXY_KEY",
        ),
        (
            r#"{"kind": "external", "name": "a", "command": ["x"], "limits": {"timeout_s": 0}}"#,
            "limits.timeout_s",
        ),
        (
            r#"{"kind": "external", "name": "a", "command": ["x"], "limits": {"max_model_calls": 0}}"#,
            "limits.max_model_calls",
        ),
        (
            r#"{"kind": "external", "name": "a", "command": ["x"], "limitz": {}}"#,
            "limitz",
        ),
    ] {
        let err = ExternalHarness::from_json(text, Some(file))
            .unwrap_err()
            .to_string();
        assert!(err.contains("pool/members/agent.json"), "{err}");
        assert!(err.contains(needle), "{text}: {err}");
    }
    let err = ExternalHarness::load("/no/such/member.json")
        .unwrap_err()
        .to_string();
    assert!(err.contains("/no/such/member.json"), "{err}");
}
