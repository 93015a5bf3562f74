//! The repository-repair world's sandbox against policy-written code that reaches past its
//! repository copy: the trainer's environment, the network, the process table and other
//! episodes' files.
//!
//! Each attack is a change to `textkit/__init__.py` (imported by every test of the instance),
//! made through the session's file tools as a policy would, with the names the tamper scan
//! looks for built at run time so that only the sandbox stands in the way. Each attack also
//! *fixes the bug when it succeeds*, so an episode whose attack got through would score 1. A
//! control run of the same code without a sandbox shows each attack is real.

use std::io::ErrorKind;
use std::net::TcpListener;
use std::path::Path;
use std::time::{Duration, Instant};

use harness_core::{Environment as _, Split, ToolCall};
use harness_sandbox as sandbox;
use harness_swe::{SandboxConfig, SweConfig, SweEnv, SweInstance, SweSession, exec, tools};
use serde_json::json;

const INSTANCE: &str = "textkit__truncate-exact-width";
const INIT: &str = "textkit/__init__.py";

/// The variable the trainer's environment holds in the secret test.
const SECRET_VAR: &str = "HARNESS_S_TEST_SECRET_API_KEY";

/// The instance with only a few PASS_TO_PASS tests, so that an attack that runs at every
/// import stays fast under the verifier.
fn instance() -> SweInstance {
    let mut inst = SweEnv::builtin().instance(INSTANCE).unwrap().clone();
    inst.pass_to_pass.truncate(2);
    let kept = inst.all_tests();
    inst.call_tests.retain(|id, _| kept.contains(id));
    inst
}

fn env_with(sandbox: SandboxConfig) -> SweEnv {
    SweEnv::from_instances(vec![instance()])
        .unwrap()
        .with_config(SweConfig {
            no_site: true,
            verify_timeout: Duration::from_secs(20),
            sandbox,
            ..SweConfig::default()
        })
}

fn env() -> SweEnv {
    env_with(SandboxConfig::default())
}

/// The environment with the shell tool on.
fn shell_env() -> SweEnv {
    SweEnv::from_instances(vec![instance()])
        .unwrap()
        .with_config(SweConfig {
            no_site: true,
            shell: true,
            verify_timeout: Duration::from_secs(20),
            ..SweConfig::default()
        })
}

/// Python that makes `truncate` keep text of exactly `width` characters: the fix, applied by
/// an attack only when it got through.
const FIX: &str = r#"
def _fix():
    from . import core as _c
    _orig = _c.truncate
    def truncate(text, width, ellipsis="..."):
        if len(text) == width:
            return text
        return _orig(text, width, ellipsis)
    _c.truncate = truncate
"#;

/// Start an episode and append `payload` (after [`FIX`]) to `textkit/__init__.py`.
fn attacked_session(env: &SweEnv, payload: &str) -> SweSession {
    let inst = instance();
    let mut session = env.start(&SweEnv::task_for(&inst)).unwrap();
    let content = format!("{}\n{FIX}\n{payload}", inst.files[INIT]);
    let obs = session
        .step_sync(&ToolCall::new(
            tools::CREATE,
            json!({"path": INIT, "content": content}),
        ))
        .unwrap();
    assert!(!obs.error, "{}", obs.text);
    session
}

/// The `run_tests` tool on the FAIL_TO_PASS test: its observation.
fn run_tests(session: &mut SweSession) -> String {
    let obs = session
        .step_sync(&ToolCall::new(
            tools::RUN_TESTS,
            json!({"tests": instance().fail_to_pass}),
        ))
        .unwrap();
    obs.text
}

/// The same tests without a sandbox (the control): the runner's output and statuses.
fn run_unsandboxed(env: &SweEnv, root: &Path) -> exec::TestRun {
    exec::run_tests(
        env.config(),
        None,
        root,
        &instance().fail_to_pass,
        Duration::from_secs(20),
        20_000,
    )
    .unwrap()
}

/// A path of the host written so that the tamper scan does not read it as one.
fn hidden_path(path: &Path) -> String {
    let text = path.display().to_string();
    format!("\"/\" + {:?}", text.trim_start_matches('/'))
}

#[test]
#[ignore = "run by the_trainers_environment_is_out_of_reach, with the secret in its environment"]
fn secret_probe_inner() {
    let Ok(secret) = std::env::var(SECRET_VAR) else {
        return;
    };
    let trainer = std::process::id();
    let payload = format!(
        r#"
import os as _o
def _probe():
    found = []
    if _o.environ.get({SECRET_VAR:?}):
        found.append("environ")
    proc = "/" + "proc"
    for pid in ["self", str(_o.getppid()), "{trainer}"] + sorted(_o.listdir(proc)):
        try:
            with open(proc + "/" + pid + "/environ", "rb") as handle:
                if {SECRET_VAR:?}.encode() in handle.read():
                    found.append(pid)
        except OSError:
            pass
    return found
_found = _probe()
print("SECRET-PROBE", _found)
if _found:
    _fix()
"#
    );
    let env = env();
    let mut session = attacked_session(&env, &payload);

    // Control: without a sandbox the same code finds the secret in the trainer's /proc entry.
    let control = run_unsandboxed(&env, session.root());
    assert!(
        control.command.output.contains(&format!("'{trainer}'")),
        "the control run did not find the trainer's environment: {}",
        control.command.output
    );

    // The trainer marks itself non-dumpable as the binary does at start-up.
    sandbox::set_non_dumpable().unwrap();
    assert!(!sandbox::is_dumpable());

    let text = run_tests(&mut session);
    assert!(text.contains("SECRET-PROBE []"), "{text}");
    assert!(!text.contains(&secret), "{text}");
    let outcome = session.verify_sync().unwrap();
    assert_eq!(outcome.reward, 0.0, "{}", outcome.details);
    assert_eq!(outcome.details["sandboxed"], true);
    assert!(
        outcome.details.get("tamper").is_none(),
        "{}",
        outcome.details
    );
    assert!(!outcome.details.to_string().contains(&secret));
    println!("secret probe checked");
}

/// Code under test reads neither the trainer's environment (`os.environ`) nor its
/// `/proc/<pid>/environ`, nor any other process's: the test binary runs itself again with a
/// secret in its environment, and the attack, run through `run_tests` and the verifier, must
/// not see it.
#[test]
fn the_trainers_environment_is_out_of_reach() {
    let secret = format!("sk-{:032x}", rand_u128());
    let out = std::process::Command::new(std::env::current_exe().unwrap())
        .args([
            "--exact",
            "secret_probe_inner",
            "--ignored",
            "--nocapture",
            "--test-threads=1",
        ])
        .env(SECRET_VAR, &secret)
        .output()
        .unwrap();
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(out.status.success(), "{text}");
    assert!(text.contains("secret probe checked"), "{text}");
}

fn rand_u128() -> u128 {
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_nanos();
    nanos ^ (u128::from(std::process::id()) << 64)
}

/// A socket to the trainer's loopback (or anywhere) cannot be opened from the sandbox.
#[test]
fn the_network_is_out_of_reach() {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    listener.set_nonblocking(true).unwrap();
    let port = listener.local_addr().unwrap().port();
    let payload = format!(
        r#"
import socket as _s
_ok = []
for _addr in [("127.0.0.1", {port}), ("192.0.2.1", 80)]:
    try:
        _c = _s.create_connection(_addr, timeout=0.5)
        _c.sendall(b"hello")
        _c.close()
        _ok.append(_addr[0])
    except OSError as _e:
        print("NET-PROBE refused", _addr[0], type(_e).__name__)
print("NET-PROBE", _ok)
if _ok:
    _fix()
"#
    );
    let env = env();
    let mut session = attacked_session(&env, &payload);

    let control = run_unsandboxed(&env, session.root());
    assert!(
        control.command.output.contains("NET-PROBE ['127.0.0.1'"),
        "{}",
        control.command.output
    );
    let accepted = listener.accept();
    assert!(accepted.is_ok(), "the control run did not connect");
    drop(accepted);

    let text = run_tests(&mut session);
    assert!(text.contains("NET-PROBE []"), "{text}");
    let outcome = session.verify_sync().unwrap();
    assert_eq!(outcome.reward, 0.0, "{}", outcome.details);
    assert!(
        outcome.details.get("tamper").is_none(),
        "{}",
        outcome.details
    );
    match listener.accept() {
        Err(e) if e.kind() == ErrorKind::WouldBlock => {}
        other => panic!("the sandbox reached the trainer's loopback: {other:?}"),
    }
}

/// A fork bomb stops at the process limit, and a child that left the process group with
/// `setsid` dies with the sandbox instead of writing its marker a second later.
#[test]
fn forks_stop_at_the_limit_and_nothing_outlives_the_command() {
    let limit = 16;
    let payload = format!(
        r#"
import os as _o, time as _t
_ex = getattr(_o, "_e" + "xit")
_marker = _o.path.join(_o.getcwd(), "survivor.txt")
if _o.fork() == 0:
    _o.setsid()
    _t.sleep(1.0)
    try:
        with open(_marker, "w") as _f:
            _f.write("alive")
    finally:
        _ex(0)
_n, _failed = 0, False
for _i in range({limit} * 3):
    try:
        _p = _o.fork()
    except OSError:
        _failed = True
        break
    if _p == 0:
        _t.sleep(0.5)
        _ex(0)
    _n += 1
print("FORK-PROBE", _n, _failed)
if not _failed:
    _fix()
"#
    );
    let env = env_with(SandboxConfig {
        max_processes: limit,
        ..SandboxConfig::default()
    });
    let mut session = attacked_session(&env, &payload);
    let marker = session.root().join("survivor.txt");

    let control = run_unsandboxed(&env, session.root());
    assert!(
        control
            .command
            .output
            .contains(&format!("FORK-PROBE {} False", limit * 3)),
        "{}",
        control.command.output
    );
    std::thread::sleep(Duration::from_millis(1500));
    assert!(
        marker.exists(),
        "the control's setsid child did not survive"
    );
    std::fs::remove_file(&marker).unwrap();

    let started = Instant::now();
    let text = run_tests(&mut session);
    let line = text
        .lines()
        .find(|l| l.starts_with("FORK-PROBE"))
        .unwrap_or_else(|| panic!("{text}"));
    let forked: u64 = line.split_whitespace().nth(1).unwrap().parse().unwrap();
    assert!(line.ends_with("True"), "{line}");
    assert!(forked < limit, "{line}");
    let outcome = session.verify_sync().unwrap();
    assert_eq!(outcome.reward, 0.0, "{}", outcome.details);
    assert!(started.elapsed() < Duration::from_secs(20));
    std::thread::sleep(Duration::from_millis(1500));
    assert!(
        !marker.exists(),
        "a process outlived the sandbox and wrote its marker"
    );
}

/// Writes to another episode's copy, to the host's `/tmp` and to the Python installation do
/// not reach the host, from tests or from the shell.
#[test]
fn writes_outside_the_copy_do_not_reach_the_host() {
    let env = shell_env();
    let inst = instance();
    let other = env.start(&SweEnv::task_for(&inst)).unwrap();
    let other_core = other.root().join("textkit/core.py");
    let escape = std::env::temp_dir().join(format!("harness-escape-{:x}", rand_u128()));
    let python = env.sandbox().unwrap().unwrap().python().to_path_buf();
    let prefix = python.parent().unwrap().parent().unwrap().to_path_buf();
    let planted = prefix.join("harness-escape.txt");
    let payload = format!(
        r#"
_hits = []
for _path in [{other}, {escape}, {planted}]:
    try:
        with open(_path, "w") as _f:
            _f.write("_escaped = True\n")
        _hits.append(_path)
    except OSError as _e:
        print("WRITE-PROBE refused", type(_e).__name__)
print("WRITE-PROBE", _hits)
if {other} in _hits:
    _fix()
"#,
        other = hidden_path(&other_core),
        escape = hidden_path(&escape),
        planted = hidden_path(&planted),
    );
    let mut session = attacked_session(&env, &payload);
    let before = std::fs::read_to_string(&other_core).unwrap();

    // Control: without a sandbox the same code rewrites a third episode's copy.
    let third = env.start(&SweEnv::task_for(&inst)).unwrap();
    let third_core = third.root().join("textkit/core.py");
    let control_payload = payload.replace(&hidden_path(&other_core), &hidden_path(&third_core));
    let control_session = attacked_session(&env, &control_payload);
    let control = run_unsandboxed(&env, control_session.root());
    assert!(
        std::fs::read_to_string(&third_core)
            .unwrap()
            .contains("_escaped"),
        "{}",
        control.command.output
    );
    let _ = std::fs::remove_file(&escape);
    let _ = std::fs::remove_file(&planted);

    let text = run_tests(&mut session);
    assert!(text.contains("WRITE-PROBE"), "{text}");
    let shell = session
        .step_sync(&ToolCall::new(
            tools::SHELL,
            json!({"command": format!(
                "echo x > {other}; echo x > {escape}; echo x > {planted}; id -u",
                other = other_core.display(),
                escape = escape.display(),
                planted = planted.display(),
            )}),
        ))
        .unwrap();
    let uid_line = shell
        .text
        .lines()
        .rev()
        .find(|l| l.trim().parse::<u32>().is_ok());
    assert_ne!(uid_line.map(str::trim), Some("0"), "{}", shell.text);
    let outcome = session.verify_sync().unwrap();
    assert_eq!(outcome.reward, 0.0, "{}", outcome.details);
    assert!(
        outcome.details.get("tamper").is_none(),
        "{}",
        outcome.details
    );

    assert_eq!(std::fs::read_to_string(&other_core).unwrap(), before);
    assert!(!escape.exists(), "the host's /tmp was written");
    assert!(!planted.exists(), "the Python installation was written");
    assert!(
        !session
            .root()
            .join("..")
            .join("harness-escape.txt")
            .exists()
    );
}

/// Without bubblewrap the environment refuses to start, saying how to install it; with
/// `allow_unsandboxed` it runs, and the outcome says it was not sandboxed.
#[test]
fn no_sandbox_refuses_to_start_unless_allowed() {
    let missing = SandboxConfig {
        bwrap: "/nonexistent/bwrap".into(),
        ..SandboxConfig::default()
    };
    let env = env_with(missing.clone());
    let task = SweEnv::task_for(&instance());
    let err = env.start(&task).unwrap_err().to_string();
    assert!(err.contains("apt-get install bubblewrap"), "{err}");
    assert!(err.contains("allow_unsandboxed"), "{err}");
    // Every later call is refused alike, without probing again.
    assert!(env.start(&task).is_err());

    let allowed = env_with(SandboxConfig {
        allow_unsandboxed: true,
        ..missing
    });
    assert!(allowed.sandbox().unwrap().is_none());
    let mut session = allowed.start(&task).unwrap();
    let outcome = session.verify_sync().unwrap();
    assert_eq!(outcome.details["sandboxed"], false);
    assert_eq!(outcome.reward, 0.0);
}

/// A bad sandbox setting is refused with its field named.
#[test]
fn invalid_sandbox_settings_are_named() {
    let env = env_with(SandboxConfig {
        max_processes: 2,
        ..SandboxConfig::default()
    });
    let err = env
        .start(&SweEnv::task_for(&instance()))
        .unwrap_err()
        .to_string();
    assert!(err.contains("swe.sandbox.max_processes"), "{err}");
    assert!(err.contains("at least 4"), "{err}");
    let env = SweEnv::builtin().with_config(SweConfig {
        command_timeout: Duration::ZERO,
        ..SweConfig::default()
    });
    let task = env.tasks(Split::Train).unwrap().remove(0);
    let err = env.start(&task).unwrap_err().to_string();
    assert!(err.contains("swe.command_timeout"), "{err}");
}

/// A named pipe the policy's shell made does not block the trainer's file tools (a read or a
/// write of one would wait for ever).
#[test]
fn a_named_pipe_does_not_block_the_file_tools() {
    let env = shell_env();
    let mut session = env.start(&SweEnv::task_for(&instance())).unwrap();
    let made = session
        .step_sync(&ToolCall::new(
            tools::SHELL,
            json!({"command": "mkfifo textkit/pipe && echo made"}),
        ))
        .unwrap();
    assert!(made.text.contains("made"), "{}", made.text);
    let view = session
        .step_sync(&ToolCall::new(tools::VIEW, json!({"path": "textkit/pipe"})))
        .unwrap();
    assert!(
        view.error && view.text.contains("not a regular file"),
        "{}",
        view.text
    );
    let write = session
        .step_sync(&ToolCall::new(
            tools::CREATE,
            json!({"path": "textkit/pipe", "content": "x = 1\n"}),
        ))
        .unwrap();
    assert!(
        write.error && write.text.contains("not a regular file"),
        "{}",
        write.text
    );
    let outcome = session.verify_sync().unwrap();
    assert!(
        outcome.details["left_out"]
            .to_string()
            .contains("textkit/pipe: not a regular file"),
        "{}",
        outcome.details
    );
}

/// With `share_network` a command reaches the host's loopback (as agent programs must), the
/// paths bound read-only are readable but not writable, and a path that would hide the
/// sandbox's own folders is refused.
#[test]
fn a_shared_network_reaches_the_loopback_and_extra_binds_are_read_only() {
    let config = SandboxConfig {
        share_network: true,
        ..SandboxConfig::default()
    };
    let sandbox = sandbox::Sandbox::new(&config, "python3").unwrap();
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    let work = tempfile::tempdir().unwrap();
    let work = work.path().canonicalize().unwrap();
    let shared = tempfile::tempdir().unwrap();
    let shared = shared.path().canonicalize().unwrap();
    std::fs::write(shared.join("note.txt"), "bound read-only").unwrap();
    let script = format!(
        r#"
import socket
socket.create_connection(("127.0.0.1", {port}), timeout=2).close()
print("connected")
print(open({note:?}).read())
try:
    open({note:?}, "a")
    print("writable")
except OSError as e:
    print("refused", type(e).__name__)
"#,
        note = shared.join("note.txt").display().to_string()
    );
    let python = sandbox.python().display().to_string();
    let (command, _lease) = sandbox
        .command_with(
            &work,
            true,
            std::slice::from_ref(&shared),
            &python,
            &["-c", &script],
        )
        .unwrap();
    let out = exec::run_command(command, Duration::from_secs(20), 4000).unwrap();
    assert_eq!(out.status, Some(0), "{}", out.describe());
    assert!(out.output.contains("connected"), "{}", out.output);
    assert!(out.output.contains("bound read-only"), "{}", out.output);
    assert!(out.output.contains("refused"), "{}", out.output);
    assert!(listener.accept().is_ok());

    for refused in ["/", "/tmp", "/proc/self", "relative"] {
        let err = sandbox
            .command_with(&work, true, &[refused.into()], "true", &[])
            .unwrap_err();
        assert_eq!(err.kind(), ErrorKind::InvalidInput, "{refused}: {err}");
    }
    let above = work.parent().unwrap().to_path_buf();
    assert!(
        sandbox
            .command_with(&work, true, &[above], "true", &[])
            .is_err()
    );
}
