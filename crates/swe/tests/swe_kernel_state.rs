//! Nothing a sandboxed run leaves in the kernel reaches a later run, and the verifier's copy
//! is capped: the attacks of issue 40 against the sandbox, each with a control that shows it
//! working without the defence.
//!
//! - A run stores a secret in its user's kernel keyring (`add_key`) and a later, separate run
//!   with the same leased user reads it back: possible when commands share the host's user
//!   namespace and there is no seccomp filter (the old arrangement, kept behind the unsafe
//!   settings `own_user_namespace = false` and `seccomp = false`), refused otherwise.
//! - The seccomp filter refuses the keyring, `ptrace`, `bpf`, `perf_event_open`, mount,
//!   `unshare`, `setns` and namespace-making `clone` calls with `EPERM`; without it the same
//!   calls fail otherwise (they are made with arguments the kernel rejects before any
//!   permission check) or succeed.
//! - A policy that writes many files, or many bytes, fails verification with the reason;
//!   under the caps the same files are copied and the fixed repository passes.
//!
//! The calls are made from Python through `ctypes`, with the call numbers of this machine
//! passed in, so that only the sandbox stands in the way.

use std::path::Path;
use std::time::Duration;

use harness_core::ToolCall;
use harness_sandbox::Sandbox;
use harness_swe::{SandboxConfig, SweConfig, SweEnv, SweInstance, diff, exec, tools};
use serde_json::json;

const INSTANCE: &str = "textkit__truncate-exact-width";

fn is_root() -> bool {
    std::fs::metadata("/proc/self")
        .map(|m| std::os::unix::fs::MetadataExt::uid(&m) == 0)
        .unwrap_or(false)
}

/// Whether the controls that need root can run; under `CI=true` (CI runs as root) not being
/// root is a failure, so that a control is never skipped there unnoticed.
fn controls_need_root(what: &str) -> bool {
    if is_root() {
        return true;
    }
    assert!(
        std::env::var("CI").as_deref() != Ok("true"),
        "CI=true but not root: the control `{what}` needs root and would be skipped"
    );
    eprintln!("not root: the control `{what}` is skipped");
    false
}

/// A sandbox whose every command runs as the one user `uid` (when the trainer is root), so
/// that two runs certainly share it.
fn sandbox(uid: u32, own_user_namespace: bool, seccomp: bool) -> Sandbox {
    let config = SandboxConfig {
        first_uid: uid,
        uid_count: 1,
        own_user_namespace,
        seccomp,
        ..SandboxConfig::default()
    };
    Sandbox::new(&config, "python3").unwrap_or_else(|e| panic!("{e}"))
}

/// Run `script` with Python in a fresh folder inside `sandbox`: its merged output.
fn run(sandbox: &Sandbox, script: &str, args: &[&str]) -> String {
    let work = tempfile::tempdir().unwrap();
    let root = work.path().canonicalize().unwrap();
    let python = sandbox.python().display().to_string();
    let mut all = vec!["-c", script];
    all.extend_from_slice(args);
    let (command, _lease) = sandbox.command(&root, true, &python, &all).unwrap();
    let out = exec::run_command(command, Duration::from_secs(30), 20_000).unwrap();
    assert_eq!(out.status, Some(0), "{}", out.describe());
    out.output
}

/// Python that calls the kernel directly: `call(name, *args)` returns the result or `-errno`.
const CALLS: &str = r#"
import ctypes, os, sys
_libc = ctypes.CDLL(None, use_errno=True)
_libc.syscall.restype = ctypes.c_long
NR = dict(arg.split("=") for arg in sys.argv[1:] if "=" in arg)
def call(name, *args):
    conv = [a if isinstance(a, bytes) or a is None else ctypes.c_long(a) for a in args]
    ctypes.set_errno(0)
    rc = _libc.syscall(ctypes.c_long(int(NR[name])), *conv)
    return -ctypes.get_errno() if rc == -1 else rc
"#;

/// The call numbers the scripts use, as `name=number` arguments.
fn numbers() -> Vec<String> {
    [
        ("add_key", libc::SYS_add_key),
        ("keyctl", libc::SYS_keyctl),
        ("ptrace", libc::SYS_ptrace),
        ("bpf", libc::SYS_bpf),
        ("perf_event_open", libc::SYS_perf_event_open),
        ("mount", libc::SYS_mount),
        ("umount2", libc::SYS_umount2),
        ("unshare", libc::SYS_unshare),
        ("setns", libc::SYS_setns),
        ("clone", libc::SYS_clone),
        ("clone3", libc::SYS_clone3),
    ]
    .iter()
    .map(|(name, nr)| format!("{name}={nr}"))
    .collect()
}

/// Run A: store `secret` in the user keyring (and the session keyring), in a key's
/// description, which the key's user may read back without holding the key.
const STORE: &str = r#"
KEY_SPEC_SESSION_KEYRING, KEY_SPEC_USER_KEYRING = -3, -4
secret, name = sys.argv[1].encode(), sys.argv[2].encode()
for ring, label in ((KEY_SPEC_USER_KEYRING, "user"), (KEY_SPEC_SESSION_KEYRING, "session")):
    rc = call("add_key", b"user", name + b":" + secret, b"x", 1, ring)
    print("STORE", label, "added" if rc > 0 else "refused %d" % -rc)
"#;

/// Run B: list the user and session keyrings and print the secret of a key named `name`.
const FETCH: &str = r#"
import struct
KEY_SPEC_SESSION_KEYRING, KEY_SPEC_USER_KEYRING = -3, -4
KEYCTL_DESCRIBE, KEYCTL_READ, KEYCTL_INVALIDATE = 6, 11, 21
name = sys.argv[2]
for ring, label in ((KEY_SPEC_USER_KEYRING, "user"), (KEY_SPEC_SESSION_KEYRING, "session")):
    buf = ctypes.create_string_buffer(4096)
    size = call("keyctl", KEYCTL_READ, ring, ctypes.addressof(buf), 4096)
    if size < 0:
        print("FETCH", label, "missing %d" % -size)
        continue
    found = None
    for key in struct.unpack("%di" % (size // 4), buf.raw[:size]):
        text = ctypes.create_string_buffer(512)
        n = call("keyctl", KEYCTL_DESCRIBE, key, ctypes.addressof(text), 512)
        description = text.raw[:max(n - 1, 0)].decode(errors="replace").split(";", 4)[-1]
        if description.startswith(name + ":"):
            found = description.split(":", 1)[1]
            call("keyctl", KEYCTL_INVALIDATE, key)
    print("FETCH", label, "found " + found if found else "missing, %d keys" % (size // 4))
"#;

/// The keyring route of issue 40: run A stores a secret, a later run of the same user reads it.
/// Returns the two runs' outputs.
fn keyring_attack(sandbox: &Sandbox) -> (String, String) {
    let nonce = format!(
        "{:x}{:x}",
        std::process::id(),
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_nanos()
    );
    let secret = format!("hidden-tests-{nonce}");
    let name = format!("harness-test-{nonce}");
    let mut args = vec![secret.as_str(), name.as_str()];
    let numbers = numbers();
    args.extend(numbers.iter().map(String::as_str));
    let stored = run(sandbox, &format!("{CALLS}{STORE}"), &args);
    let fetched = run(sandbox, &format!("{CALLS}{FETCH}"), &args);
    let fetched = fetched.replace(&secret, "THE-SECRET");
    eprintln!("{}{}", stored, fetched);
    (stored, fetched)
}

/// A secret one run stores in the kernel keyring is gone for the next run of the same leased
/// user: refused by the seccomp filter, and without the filter kept in a user namespace that
/// ends with the run. Control: commands in the host's user namespace without the filter (the
/// old arrangement) hand the secret on.
#[test]
fn a_keyring_secret_does_not_reach_a_later_run() {
    // Both defences on (the default): the keyring calls are refused outright.
    let (stored, fetched) = keyring_attack(&sandbox(61_100, true, true));
    assert!(stored.contains("STORE user refused 1"), "{stored}");
    assert!(stored.contains("STORE session refused 1"), "{stored}");
    assert!(fetched.contains("FETCH user missing 1"), "{fetched}");
    assert!(!fetched.contains("THE-SECRET"), "{fetched}");

    // Without the filter, the namespace alone: the key is stored, and is gone with the run.
    let (stored, fetched) = keyring_attack(&sandbox(61_101, true, false));
    assert!(stored.contains("STORE user added"), "{stored}");
    assert!(stored.contains("STORE session added"), "{stored}");
    assert!(fetched.contains("FETCH user missing"), "{fetched}");
    assert!(fetched.contains("FETCH session missing"), "{fetched}");
    assert!(!fetched.contains("THE-SECRET"), "{fetched}");

    // bwrap always makes a user namespace unless root: the shared-namespace control needs it.
    if !controls_need_root("keyrings in the host's user namespace") {
        return;
    }
    // The filter alone, in the host's user namespace: refused.
    let (stored, fetched) = keyring_attack(&sandbox(61_102, false, true));
    assert!(stored.contains("STORE user refused 1"), "{stored}");
    assert!(!fetched.contains("THE-SECRET"), "{fetched}");

    // Control: both off, the route of issue 40 works (and the secret is read back).
    let (stored, fetched) = keyring_attack(&sandbox(61_103, false, false));
    assert!(stored.contains("STORE user added"), "{stored}");
    assert!(
        fetched.contains("FETCH user found THE-SECRET"),
        "the control did not hand the secret on: {fetched}"
    );
    // The session keyring is the command's own even then.
    assert!(fetched.contains("FETCH session missing"), "{fetched}");
}

/// Each refused call, made with arguments the kernel rejects before any permission check
/// (so that without the filter it fails with another error, or succeeds), and what threads
/// and forks need still works.
const SYSCALLS: &str = r#"
import subprocess, threading
CLONE_NEWUSER, CLONE_FS, SIGCHLD = 0x10000000, 0x200, 17
results = {
    "ptrace": call("ptrace", -1, 0, 0, 0),
    "bpf": call("bpf", 1000, None, 0),
    "perf_event_open": call("perf_event_open", None, 0, -1, -1, 0),
    "mount": call("mount", None, None, None, 0, None),
    "umount2": call("umount2", b"/", 0xFFFF),
    "unshare": call("unshare", 1),
    "setns": call("setns", -1, 0),
    "keyctl": call("keyctl", 0, -3, 0),
    "add_key": call("add_key", b"user", b"probe", b"x", 1, -3),
    "clone-newuser": call("clone", CLONE_NEWUSER | CLONE_FS | SIGCHLD, 0, 0, 0, 0),
    "clone3": call("clone3", None, 0),
}
for name, rc in sorted(results.items()):
    print("CALL", name, rc)
box = []
t = threading.Thread(target=lambda: box.append(1))
t.start(); t.join()
print("THREAD", box == [1])
print("SUBPROCESS", subprocess.run(["true"]).returncode)
pid = os.fork()
if pid == 0:
    os._exit(7)
print("FORK", os.waitpid(pid, 0)[1] >> 8)
"#;

/// The calls' results: name to return value (negative: `-errno`).
fn syscall_results(sandbox: &Sandbox) -> (std::collections::BTreeMap<String, i64>, String) {
    let numbers = numbers();
    let args: Vec<&str> = numbers.iter().map(String::as_str).collect();
    let out = run(sandbox, &format!("{CALLS}{SYSCALLS}"), &args);
    let results = out
        .lines()
        .filter_map(|l| l.strip_prefix("CALL "))
        .map(|l| {
            let (name, rc) = l.split_once(' ').unwrap();
            (name.to_string(), rc.trim().parse().unwrap())
        })
        .collect();
    (results, out)
}

/// The seccomp filter refuses ptrace, bpf, perf_event_open, mount, umount, unshare, setns,
/// the keyring calls and `clone` with namespace flags with EPERM, and `clone3` with ENOSYS;
/// threads, `subprocess` and `fork` still work. Control: without the filter none of these
/// calls fails with EPERM.
#[test]
fn the_seccomp_filter_refuses_kernel_state_and_namespace_calls() {
    let eperm = -i64::from(libc::EPERM);
    let (on, out) = syscall_results(&sandbox(61_110, true, true));
    assert_eq!(on.len(), 11, "{out}");
    for (name, rc) in &on {
        let expected = if name == "clone3" {
            -i64::from(libc::ENOSYS)
        } else {
            eperm
        };
        assert_eq!(*rc, expected, "{name} under the filter: {out}");
    }
    for line in ["THREAD True", "SUBPROCESS 0", "FORK 7"] {
        assert!(out.contains(line), "{line}: {out}");
    }

    let (off, out) = syscall_results(&sandbox(61_111, true, false));
    assert_eq!(off.len(), 11, "{out}");
    for (name, rc) in &off {
        assert_ne!(*rc, eperm, "{name} without the filter: {out}");
    }
    assert_ne!(off["clone3"], -i64::from(libc::ENOSYS), "{out}");
}

/// As root, a command's user is the leased user on the host, in a user namespace of its own
/// (not the host's, where `uid_map` maps every id to itself). Control: with
/// `own_user_namespace` off, it shares the host's.
#[test]
fn commands_run_in_a_user_namespace_of_their_own() {
    let script =
        "print(open('/proc/self/uid_map').read().split()); import os; print('UID', os.getuid())";
    let own = run(&sandbox(61_120, true, true), script, &[]);
    assert!(!own.contains("4294967295"), "{own}");
    if controls_need_root("a shared user namespace") {
        assert!(own.contains("'61120', '61120', '1'"), "{own}");
        assert!(own.contains("UID 61120"), "{own}");
        let shared = run(&sandbox(61_121, false, true), script, &[]);
        assert!(
            shared.contains("['0', '0', '4294967295']"),
            "the control did not share the host's user namespace: {shared}"
        );
    }
}

/// The instance, its gold patch applied: the files a policy that fixed the bug would leave.
fn fixed_files(inst: &SweInstance) -> Vec<(String, String)> {
    let mut files = inst.files.clone();
    diff::apply_to_files(&mut files, &inst.patch).unwrap();
    files
        .into_iter()
        .filter(|(path, text)| inst.files.get(path) != Some(text))
        .collect()
}

fn capped_env(verify_max_new_files: usize, verify_max_added_bytes: u64) -> SweEnv {
    let mut inst = SweEnv::builtin().instance(INSTANCE).unwrap().clone();
    inst.pass_to_pass.truncate(2);
    let kept = inst.all_tests();
    inst.call_tests.retain(|id, _| kept.contains(id));
    SweEnv::from_instances(vec![inst])
        .unwrap()
        .with_config(SweConfig {
            no_site: true,
            verify_timeout: Duration::from_secs(20),
            verify_max_new_files,
            verify_max_added_bytes,
            ..SweConfig::default()
        })
}

/// Fix the bug with the file tools, add `count` files of `size` bytes under `extra/` (with the
/// file tool when `tool`, else straight on disk as a shell command would) and verify.
fn fix_add_and_verify(env: &SweEnv, count: usize, size: usize, tool: bool) -> serde_json::Value {
    let inst = env.instances().next().unwrap().clone();
    let mut session = env.start(&SweEnv::task_for(&inst)).unwrap();
    for (path, content) in fixed_files(&inst) {
        let obs = session
            .step_sync(&ToolCall::new(
                tools::CREATE,
                json!({"path": path, "content": content}),
            ))
            .unwrap();
        assert!(!obs.error, "{}", obs.text);
    }
    let line = "x".repeat(99) + "\n";
    let content = line.repeat(size / 100);
    let extra = session.root().join("extra");
    std::fs::create_dir_all(&extra).unwrap();
    for i in 0..count {
        let path = format!("extra/f{i:05}.txt");
        if tool {
            let obs = session
                .step_sync(&ToolCall::new(
                    tools::CREATE,
                    json!({"path": path, "content": content}),
                ))
                .unwrap();
            assert!(!obs.error, "{}", obs.text);
        } else {
            std::fs::write(session.root().join(Path::new(&path)), &content).unwrap();
        }
    }
    let outcome = session.verify_sync().unwrap();
    json!({"reward": outcome.reward, "details": outcome.details})
}

/// A policy that writes more files than the cap allows fails verification with the reason,
/// the tests not run; the 10,000 files of issue 40 with the default caps are refused the same
/// way. Control: under the cap the same kind of files are copied and the fix passes.
#[test]
fn too_many_files_fail_verification_with_the_reason() {
    let env = capped_env(20, 32 << 20);
    let under = fix_add_and_verify(&env, 20, 100, true);
    assert_eq!(under["reward"], 1.0, "{under}");
    assert!(under["details"].get("copy_refused").is_none(), "{under}");

    let over = fix_add_and_verify(&env, 21, 100, true);
    assert_eq!(over["reward"], 0.0, "{over}");
    let reason = over["details"]["copy_refused"].as_str().unwrap();
    assert!(reason.contains("swe.verify_max_new_files"), "{reason}");
    assert!(
        over["details"]["error"]
            .as_str()
            .unwrap()
            .contains("too large to copy for verification")
    );
    assert!(over["details"].get("FAIL_TO_PASS").is_none(), "{over}");

    let defaults = capped_env(
        SweConfig::default().verify_max_new_files,
        SweConfig::default().verify_max_added_bytes,
    );
    let flood = fix_add_and_verify(&defaults, 10_000, 100, false);
    assert_eq!(flood["reward"], 0.0, "{flood}");
    let reason = flood["details"]["copy_refused"].as_str().unwrap();
    assert!(reason.contains("more than"), "{reason}");
}

/// A policy whose files add up to more bytes than the cap allows fails verification with the
/// reason. Control: the same files, fewer of them, under the cap, are copied and pass.
#[test]
fn too_many_bytes_fail_verification_with_the_reason() {
    let cap = 1 << 20;
    let env = capped_env(1_000, cap);
    let size = 400 * 1024;
    let under = fix_add_and_verify(&env, 2, size, false);
    assert_eq!(under["reward"], 1.0, "{under}");
    let over = fix_add_and_verify(&env, 3, size, false);
    assert_eq!(over["reward"], 0.0, "{over}");
    let reason = over["details"]["copy_refused"].as_str().unwrap();
    assert!(reason.contains("swe.verify_max_added_bytes"), "{reason}");
    assert!(reason.contains(&cap.to_string()), "{reason}");
}

/// The caps are settings, checked by name.
#[test]
fn copy_caps_are_checked_by_name() {
    let zero = SweConfig {
        verify_max_new_files: 0,
        ..SweConfig::default()
    };
    let err = zero.check().unwrap_err().to_string();
    assert!(err.contains("swe.verify_max_new_files"), "{err}");
    assert!(err.contains("at least 1"), "{err}");
    let small = SweConfig {
        verify_max_added_bytes: 1000,
        ..SweConfig::default()
    };
    let err = small.check().unwrap_err().to_string();
    assert!(err.contains("swe.verify_max_added_bytes"), "{err}");
    assert!(err.contains("max_file_bytes"), "{err}");
    assert!(SweConfig::default().check().is_ok());
}

/// The descriptors a command holds: number and target, one per line.
const DESCRIPTORS: &str = r#"
import os
for fd in sorted(os.listdir("/proc/self/fd"), key=int):
    try:
        print("FD", fd, os.readlink("/proc/self/fd/" + fd))
    except OSError:
        pass
"#;

/// A descriptor the trainer holds without close-on-exec (as one inherited from whatever
/// started it would be) does not reach a sandboxed command, which holds only stdin, stdout,
/// stderr and the user namespace it runs in. Control: an unsandboxed command gets it.
#[test]
#[allow(unsafe_code)]
fn the_trainers_open_descriptors_do_not_reach_the_command() {
    use std::os::fd::AsRawFd;
    let (reader, _writer) = std::io::pipe().unwrap();
    let fd = reader.as_raw_fd();
    // SAFETY: fcntl on a descriptor this test owns; it clears close-on-exec only.
    assert_eq!(unsafe { libc::fcntl(fd, libc::F_SETFD, 0) }, 0);
    let target = std::fs::read_link(format!("/proc/self/fd/{fd}")).unwrap();
    let target = target.display().to_string();

    let work = tempfile::tempdir().unwrap();
    let env = exec::command_env(work.path());
    let control = exec::run_limited(
        "python3",
        &["-c", DESCRIPTORS],
        work.path(),
        &env,
        Duration::from_secs(20),
        20_000,
    )
    .unwrap();
    assert!(
        control.output.contains(&format!("FD {fd} {target}")),
        "the control did not inherit the descriptor: {}",
        control.output
    );

    let inside = run(&sandbox(61_130, true, true), DESCRIPTORS, &[]);
    assert!(!inside.contains(&target), "{inside}");
    for line in inside.lines().filter(|l| l.starts_with("FD ")) {
        let fields: Vec<&str> = line.split_whitespace().collect();
        let number: i32 = fields[1].parse().unwrap();
        assert!(
            number <= 2 || fields[2].starts_with("user:["),
            "a descriptor reached the command: {line}\n{inside}"
        );
    }
}

/// Commands started at the same time from many threads each get their namespace and finish:
/// the short-lived children that make the namespaces never wait on each other.
#[test]
fn many_commands_at_once_each_get_their_own_namespace() {
    let sandbox = std::sync::Arc::new(Sandbox::new(&SandboxConfig::default(), "python3").unwrap());
    let started = std::time::Instant::now();
    let handles: Vec<_> = (0..8)
        .map(|_| {
            let sandbox = std::sync::Arc::clone(&sandbox);
            std::thread::spawn(move || {
                for _ in 0..6 {
                    let work = tempfile::tempdir().unwrap();
                    let root = work.path().canonicalize().unwrap();
                    let (command, _lease) = sandbox
                        .command(&root, true, "cat", &["/proc/self/uid_map"])
                        .unwrap();
                    let out = exec::run_command(command, Duration::from_secs(20), 4000).unwrap();
                    assert_eq!(out.status, Some(0), "{}", out.describe());
                    assert!(!out.output.contains("4294967295"), "{}", out.output);
                }
            })
        })
        .collect();
    for handle in handles {
        handle.join().unwrap();
    }
    assert!(started.elapsed() < Duration::from_secs(60));
}
