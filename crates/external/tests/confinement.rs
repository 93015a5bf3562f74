//! Agent programs confined to their own episode, tested as an attacker would: a hostile
//! standard-library Python program (`tests/attacks.py`) tries each route out of its episode,
//! and every test runs the same attack twice: against the defence (the environment server's
//! authority with a runner token, the servers' bounds, the sandbox's own network and
//! script-only binds) and, as the control, without it (an open server, a sandbox sharing the
//! host's network, no sandbox), where the route works. A program that deletes its session or
//! floods the servers fails its own episode only: the runner's next episodes go on.

use std::io::{Read as _, Write as _};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use harness_core::{
    EnvSession, Environment, Observation, Outcome, Policy, PolicyRequest, PolicyTurn, Split, Task,
    ToolCall, ToolSpec,
};
use harness_envs::dbbench::{self, DbBench, GeneratorConfig};
use harness_external::envserver::client::RemoteEnv;
use harness_external::envserver::fresh_token;
use harness_external::envserver::server::{EnvServer, EnvServerConfig, EnvServerHandle};
use harness_external::program::{
    ExternalHarness, ExternalKind, ProgramEpisode, ProgramFailure, ProgramLimits, ProgramRunner,
    RunnerSettings, program_sandbox,
};
use harness_external::proxy::{ProxyConfig, ProxyHandle, RecordingProxy};
use harness_sandbox::{Sandbox, SandboxConfig};
use harness_testkit::FnPolicy;
use serde_json::{Value, json};

fn ci() -> bool {
    std::env::var("CI").is_ok_and(|v| matches!(v.trim(), "true" | "1"))
}

/// `python3`, or `None` to skip. Under CI (`CI=true`) it must be there.
fn python() -> Option<&'static str> {
    let found = std::process::Command::new("python3")
        .arg("--version")
        .output()
        .is_ok_and(|o| o.status.success());
    assert!(
        found || !ci(),
        "python3 is not on PATH and CI=true: the confinement tests need it"
    );
    found.then_some("python3")
}

/// Whether bubblewrap is here. Under CI (`CI=true`) it must be.
fn bwrap() -> bool {
    let found = std::process::Command::new("bwrap")
        .arg("--version")
        .output()
        .is_ok_and(|o| o.status.success());
    assert!(
        found || !ci(),
        "bwrap is not on PATH and CI=true: the confinement tests need bubblewrap"
    );
    if !found {
        println!("skipping: bwrap is not on PATH (under CI=true this fails)");
    }
    found
}

/// The program sandbox: a network of its own, only the servers reachable.
fn confined(python: &str) -> Arc<Sandbox> {
    program_sandbox(&SandboxConfig::default(), python).unwrap()
}

/// The control's sandbox: the same, but with the host's network (no relay).
fn host_network(python: &str) -> Arc<Sandbox> {
    let config = SandboxConfig {
        share_network: true,
        ..SandboxConfig::default()
    };
    Arc::new(Sandbox::new(&config, python).unwrap())
}

/// A policy that waits `delay` before each answer (asynchronously, as an engine would).
struct Slow<P>(P, Duration);

#[async_trait]
impl<P: Policy> Policy for Slow<P> {
    fn name(&self) -> &str {
        self.0.name()
    }

    async fn generate(&self, request: PolicyRequest) -> harness_core::Result<PolicyTurn> {
        tokio::time::sleep(self.1).await;
        self.0.generate(request).await
    }
}

/// DBBench whose `execute_sql` of a query holding `SLOW` takes a second: requests that stay
/// in flight.
struct SlowSteps(DbBench);

struct SlowSession(Box<dyn EnvSession>);

#[async_trait]
impl EnvSession for SlowSession {
    fn tools(&self) -> Vec<ToolSpec> {
        self.0.tools()
    }

    async fn step(&mut self, call: &ToolCall) -> harness_core::Result<Observation> {
        if call.arguments.to_string().contains("SLOW") {
            tokio::time::sleep(Duration::from_secs(1)).await;
        }
        self.0.step(call).await
    }

    async fn verify(&mut self, final_answer: Option<&str>) -> harness_core::Result<Outcome> {
        self.0.verify(final_answer).await
    }

    fn initial_observation(&self) -> String {
        self.0.initial_observation()
    }
}

#[async_trait]
impl Environment for SlowSteps {
    fn name(&self) -> &str {
        self.0.name()
    }

    async fn reset(&self, task: &Task, seed: u64) -> harness_core::Result<Box<dyn EnvSession>> {
        Ok(Box::new(SlowSession(self.0.reset(task, seed).await?)))
    }

    fn tasks(&self, split: Split) -> harness_core::Result<Vec<Task>> {
        self.0.tasks(split)
    }
}

/// How a [`Rig`] is built.
struct Setup {
    /// A runner token on the environment server (the defence), or an open server (the
    /// control).
    secured: bool,
    sandbox: Option<Arc<Sandbox>>,
    env: EnvServerConfig,
    proxy: ProxyConfig,
    /// Each model call waits this long.
    slow_policy: Option<Duration>,
}

impl Setup {
    fn defended(sandbox: Option<Arc<Sandbox>>) -> Self {
        Setup {
            secured: true,
            sandbox,
            env: EnvServerConfig::default(),
            proxy: ProxyConfig::new("policy"),
            slow_policy: None,
        }
    }

    fn open(sandbox: Option<Arc<Sandbox>>) -> Self {
        Setup {
            secured: false,
            ..Setup::defended(sandbox)
        }
    }
}

struct Rig {
    env: EnvServerHandle,
    proxy: ProxyHandle,
    runner: ProgramRunner,
    /// The runner's own client (its credential): what the test opens other sessions with.
    remote: RemoteEnv,
    local: DbBench,
    runner_token: Option<String>,
}

fn generated() -> DbBench {
    DbBench::generated(&GeneratorConfig {
        seed: 21,
        train: 4,
        validation: 2,
        test: 4,
    })
}

/// DBBench (with slow `SLOW` steps) served, and a proxy in front of a policy that plays each
/// task's oracle.
async fn rig(setup: Setup) -> Rig {
    let local = generated();
    let runner_token = setup.secured.then(fresh_token);
    let server = EnvServer::new(
        Arc::new(SlowSteps(local.clone())),
        EnvServerConfig {
            runner_token: runner_token.clone(),
            ..setup.env
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
    let oracle = FnPolicy::new("oracle", move |request: &PolicyRequest| {
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
    let policy: Arc<dyn Policy> = match setup.slow_policy {
        Some(delay) => Arc::new(Slow(oracle, delay)),
        None => Arc::new(oracle),
    };
    let proxy = RecordingProxy::new(policy, setup.proxy).unwrap();
    let proxy = ProxyHandle::spawn("127.0.0.1:0".parse().unwrap(), proxy)
        .await
        .unwrap();
    let runner = ProgramRunner::new(
        connect(&env, &runner_token).await,
        proxy.proxy().clone(),
        proxy.base_url(),
        "oracle",
        RunnerSettings {
            path: std::env::var("PATH").unwrap_or_default(),
            sandbox: setup.sandbox,
            ..RunnerSettings::default()
        },
    );
    let remote = connect(&env, &runner_token).await;
    Rig {
        env,
        proxy,
        runner,
        remote,
        local,
        runner_token,
    }
}

/// A client of the server: the runner's (with its token) or, open, anyone's.
async fn connect(env: &EnvServerHandle, token: &Option<String>) -> RemoteEnv {
    match token {
        Some(token) => RemoteEnv::connect_as(env.base_url(), token.clone()).await,
        None => RemoteEnv::connect(env.base_url()).await,
    }
    .unwrap()
}

impl Rig {
    fn tasks(&self, split: Split) -> Vec<Task> {
        self.local
            .all_tasks()
            .iter()
            .filter(|t| t.split == split)
            .cloned()
            .collect()
    }

    /// A question task (its verifier's details carry the gold `label`) and its label.
    async fn question_task(&self) -> (Task, Value) {
        for task in self.tasks(Split::Test) {
            let mut session = self.local.reset(&task, 1).await.unwrap();
            session
                .step(&ToolCall::new(
                    "commit_final_answer",
                    json!({"answers": ["not the answer"]}),
                ))
                .await
                .unwrap();
            let outcome = session.verify(None).await.unwrap();
            if let Some(label) = outcome.details.get("label") {
                return (task, label.clone());
            }
        }
        panic!("no question task among the generated test tasks");
    }

    async fn attack(&self, route: &str, env: &[(&str, String)]) -> (ProgramEpisode, Value) {
        self.attack_with(&attacks_path(), route, env).await
    }

    /// Run `attacks.py ROUTE` (at `script`) on a question task; its episode and its report.
    async fn attack_with(
        &self,
        script: &Path,
        route: &str,
        env: &[(&str, String)],
    ) -> (ProgramEpisode, Value) {
        let (task, _) = self.question_task().await;
        let mut program = program(&["python3", script.to_str().unwrap(), route]);
        for (name, value) in env {
            program.env.insert(name.to_string(), value.clone());
        }
        let episode = self.runner.run(&program, &task, 1).await.unwrap();
        let report = report_of(&episode);
        (episode, report)
    }

    /// The bundled agent's episode on `task`: it must succeed.
    async fn honest(&self, task: &Task) -> ProgramEpisode {
        let agent = Path::new(env!("CARGO_MANIFEST_DIR")).join("agents/dbbench_agent.py");
        let episode = self
            .runner
            .run(&program(&["python3", agent.to_str().unwrap()]), task, 5)
            .await
            .unwrap();
        assert!(
            episode.trajectory.is_success(),
            "{}\n{:?}",
            episode.trajectory.transcript(),
            episode.run
        );
        episode
    }
}

fn attacks_path() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/attacks.py")
}

fn program(command: &[&str]) -> ExternalHarness {
    ExternalHarness {
        kind: ExternalKind::External,
        name: "attacker".into(),
        description: String::new(),
        command: command.iter().map(|s| s.to_string()).collect(),
        env: Default::default(),
        limits: ProgramLimits {
            max_model_calls: 20,
            max_env_actions: 15,
            timeout_s: 60.0,
            ..ProgramLimits::default()
        },
    }
}

/// The `REPORT {...}` line of an attack's stderr.
fn report_of(episode: &ProgramEpisode) -> Value {
    let line = episode
        .run
        .stderr_tail
        .lines()
        .find_map(|l| l.strip_prefix("REPORT "))
        .unwrap_or_else(|| panic!("no report: {:?}", episode.run));
    serde_json::from_str(line).unwrap()
}

#[tokio::test]
async fn a_program_cannot_list_tasks_nor_read_its_sessions_outcome_route() {
    if python().is_none() {
        return;
    }
    let defended = rig(Setup::defended(None)).await;
    let (_, report) = defended.attack("list", &[]).await;
    assert_eq!(report["list"], json!([403, 403, 403]), "{report}");
    let (_, report) = defended.attack("status", &[]).await;
    assert_eq!(report["own_status"], 403, "{report}");
    // The runner's credential reads both.
    assert_eq!(defended.remote.tasks(Split::Test).unwrap().len(), 4);

    // The control: an open server answers the program.
    let open = rig(Setup::open(None)).await;
    let (_, report) = open.attack("list", &[]).await;
    assert_eq!(report["list"], json!([200, 200, 200]), "{report}");
    let (_, report) = open.attack("status", &[]).await;
    assert_eq!(report["own_status"], 200, "{report}");
}

#[tokio::test]
async fn a_program_cannot_open_a_side_session_nor_read_the_gold_answer() {
    if python().is_none() {
        return;
    }
    let defended = rig(Setup::defended(None)).await;
    let (episode, report) = defended.attack("side", &[]).await;
    assert_eq!(report["side_open"], 403, "{report}");
    assert!(report.get("gold").is_none(), "{report}");
    // The program did not finish its own session: its episode alone failed.
    assert_eq!(episode.run.failure, Some(ProgramFailure::Unfinished));

    // The control: on an open server the side session opens (201), finishes and hands over
    // the verifier's details, gold answers included.
    let open = rig(Setup::open(None)).await;
    let (_, label) = open.question_task().await;
    let (_, report) = open.attack("side", &[]).await;
    assert_eq!(report["side_open"], 201, "{report}");
    assert_eq!(report["side_finish"], 200, "{report}");
    assert_eq!(report["gold"], label, "{report}");
}

#[tokio::test]
async fn a_program_cannot_read_step_or_delete_another_session() {
    if python().is_none() {
        return;
    }
    for secured in [true, false] {
        let rig = rig(if secured {
            Setup::defended(None)
        } else {
            Setup::open(None)
        })
        .await;
        // Another episode's session, opened by the runner.
        let other_task = rig.tasks(Split::Train)[0].clone();
        let other = rig.remote.start(&other_task.id, 3, None).await.unwrap();
        let (_, report) = rig
            .attack("other", &[("OTHER_SESSION", other.id().to_string())])
            .await;
        let status = rig.remote.status(other.id()).await;
        if secured {
            for route in [
                "other_episode",
                "other_status",
                "other_step",
                "other_delete",
            ] {
                assert_eq!(report[route], 403, "{route}: {report}");
            }
            let status = status.unwrap();
            assert_eq!(status.steps, 0, "the other session was stepped");
        } else {
            // The control: every route works on an open server, and the session is gone.
            assert_eq!(report["other_episode"], 200, "{report}");
            assert_eq!(report["other_status"], 200, "{report}");
            assert_eq!(report["other_step"], 200, "{report}");
            assert_eq!(report["other_delete"], 204, "{report}");
            let err = status.unwrap_err().to_string();
            assert!(err.contains("404"), "{err}");
        }
    }
}

#[tokio::test]
async fn a_program_that_deletes_its_session_fails_only_its_own_episode() {
    if python().is_none() {
        return;
    }
    let defended = rig(Setup::defended(None)).await;
    let (episode, report) = defended.attack("delete", &[]).await;
    assert_eq!(report["own_delete"], 403, "{report}");
    assert_eq!(
        episode.run.failure,
        Some(ProgramFailure::Unfinished),
        "{:?}",
        episode.run
    );
    defended.honest(&defended.tasks(Split::Train)[0]).await;

    // The control: on an open server the delete goes through (204). The runner's read of the
    // outcome then answers 404, which used to end the whole run ("GET .../v1/sessions/<id>
    // failed (HTTP 404)"); now it is this episode's failure, and the next episode runs.
    let open = rig(Setup::open(None)).await;
    let (episode, report) = open.attack("delete", &[]).await;
    assert_eq!(report["own_delete"], 204, "{report}");
    assert_eq!(
        episode.run.failure,
        Some(ProgramFailure::SessionGone),
        "{:?}",
        episode.run
    );
    assert!(
        episode.run.reason.as_deref().unwrap().contains("HTTP 404"),
        "{:?}",
        episode.run
    );
    assert_eq!(episode.trajectory.reward(), 0.0);
    assert_eq!(
        episode.trajectory.outcome.details["external"]["failure"],
        "session_gone"
    );
    open.honest(&open.tasks(Split::Train)[0]).await;
}

/// The server's session count once it reaches `expected` (the runner closes an episode's
/// session in the background), or after 3 s.
async fn settled_sessions(env: &EnvServerHandle, expected: usize) -> usize {
    let start = std::time::Instant::now();
    while env.server().session_count() != expected && start.elapsed() < Duration::from_secs(3) {
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    env.server().session_count()
}

#[tokio::test]
async fn a_program_cannot_flood_the_servers_sessions() {
    if python().is_none() {
        return;
    }
    let small = EnvServerConfig {
        max_sessions: 6,
        ..EnvServerConfig::default()
    };
    let defended = rig(Setup {
        env: small.clone(),
        ..Setup::defended(None)
    })
    .await;
    let (_, report) = defended.attack("flood", &[("FLOOD", "20".into())]).await;
    assert_eq!(report["flood_opened"], 0, "{report}");
    // Only the runner's own session was there, and it is closed once the episode ends.
    assert_eq!(settled_sessions(&defended.env, 0).await, 0);
    defended.honest(&defended.tasks(Split::Train)[0]).await;

    // The control: on an open server the program fills the server (its own session and 5
    // more), and its 5 outlive its episode: one more session fills the server again, and
    // the next episode cannot start.
    let open = rig(Setup {
        env: small,
        ..Setup::open(None)
    })
    .await;
    let (_, report) = open.attack("flood", &[("FLOOD", "20".into())]).await;
    assert_eq!(report["flood_opened"], 5, "{report}");
    assert_eq!(settled_sessions(&open.env, 5).await, 5);
    let task = open.tasks(Split::Train)[0].clone();
    let _held = open.remote.start(&task.id, 1, None).await.unwrap();
    let err = open
        .runner
        .run(&program(&["python3", "-c", "pass"]), &task, 1)
        .await
        .err()
        .map(|e| e.to_string())
        .unwrap_or_default();
    assert!(err.contains("503"), "{err}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn each_program_has_a_bound_on_model_calls_in_flight() {
    if python().is_none() {
        return;
    }
    let flood = [("PROXY_FLOOD", "8".to_string())];
    let slow = Some(Duration::from_millis(1500));
    let defended = rig(Setup {
        proxy: ProxyConfig {
            max_requests_per_episode: 2,
            ..ProxyConfig::new("policy")
        },
        slow_policy: slow,
        ..Setup::defended(None)
    })
    .await;
    let (_, report) = defended.attack("proxy_flood", &flood).await;
    let statuses: Vec<u64> = report["proxy_flood"]
        .as_array()
        .unwrap()
        .iter()
        .map(|v| v.as_u64().unwrap())
        .collect();
    let served = statuses.iter().filter(|s| **s == 200).count();
    let refused = statuses.iter().filter(|s| **s == 429).count();
    assert!(
        (1..=2).contains(&served) && served + refused == 8,
        "{statuses:?}"
    );

    // The control: with room for every call, all eight are served.
    let roomy = rig(Setup {
        proxy: ProxyConfig {
            max_requests_per_episode: 16,
            ..ProxyConfig::new("policy")
        },
        slow_policy: slow,
        ..Setup::defended(None)
    })
    .await;
    let (_, report) = roomy.attack("proxy_flood", &flood).await;
    assert_eq!(report["proxy_flood"], json!(vec![200; 8]), "{report}");
}

/// Send `n` `SLOW` steps on `session` at once with `token`; their statuses, sorted.
async fn slow_steps(base: &str, session: &str, token: &str, n: usize) -> Vec<u16> {
    let http = harness_openai::http_client();
    let url = format!("{base}/v1/sessions/{session}/step");
    let calls = (0..n).map(|_| {
        http.post(&url)
            .bearer_auth(token)
            .json(&json!({"name": "execute_sql", "arguments": {"query": "SELECT 'SLOW'"}}))
            .send()
    });
    let mut statuses: Vec<u16> = futures::future::join_all(calls)
        .await
        .into_iter()
        .map(|r| r.unwrap().status().as_u16())
        .collect();
    statuses.sort();
    statuses
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn the_env_server_bounds_a_programs_requests_in_flight_but_not_the_runners() {
    let rig = rig(Setup {
        env: EnvServerConfig {
            max_requests_per_program: 2,
            ..EnvServerConfig::default()
        },
        ..Setup::defended(None)
    })
    .await;
    let task = rig.tasks(Split::Train)[0].clone();
    let session = rig.remote.start(&task.id, 1, None).await.unwrap();
    let token = session.started().token.clone().unwrap();
    let base = rig.env.base_url();
    // The program's token: two in flight, the other four refused at once.
    let statuses = slow_steps(&base, session.id(), &token, 6).await;
    assert_eq!(statuses, vec![200, 200, 429, 429, 429, 429]);
    // The control: the runner's credential is not bounded (programs cannot crowd it out).
    let runner = rig.runner_token.clone().unwrap();
    let statuses = slow_steps(&base, session.id(), &runner, 6).await;
    assert_eq!(statuses, vec![200; 6]);
}

/// Send a request whose body never arrives; the status line answered within `wait`, if any.
fn stalled_request(addr: std::net::SocketAddr, path: &str, wait: Duration) -> Option<String> {
    let mut stream = std::net::TcpStream::connect(addr).unwrap();
    write!(
        stream,
        "POST {path} HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: 100\r\n\r\n{{"
    )
    .unwrap();
    stream.set_read_timeout(Some(wait)).unwrap();
    let mut answer = [0u8; 64];
    match stream.read(&mut answer) {
        Ok(n) if n > 0 => Some(
            String::from_utf8_lossy(&answer[..n])
                .lines()
                .next()
                .unwrap_or("")
                .to_string(),
        ),
        _ => None,
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn both_servers_bound_the_time_of_a_request() {
    for limit in [Duration::from_millis(300), Duration::from_secs(60)] {
        let rig = rig(Setup {
            env: EnvServerConfig {
                request_timeout: limit,
                ..EnvServerConfig::default()
            },
            proxy: ProxyConfig {
                request_timeout: limit,
                ..ProxyConfig::new("policy")
            },
            ..Setup::defended(None)
        })
        .await;
        let env = rig.env.addr();
        let proxy = rig.proxy.addr();
        let (env_answer, proxy_answer) = tokio::task::spawn_blocking(move || {
            (
                stalled_request(env, "/v1/sessions/x/step", Duration::from_secs(2)),
                stalled_request(proxy, "/v1/chat/completions", Duration::from_secs(2)),
            )
        })
        .await
        .unwrap();
        if limit < Duration::from_secs(1) {
            for answer in [env_answer, proxy_answer] {
                assert!(
                    answer.as_deref().is_some_and(|a| a.contains("503")),
                    "{answer:?}"
                );
            }
        } else {
            // The control: with a long limit the stalled request holds its handler.
            assert_eq!((env_answer, proxy_answer), (None, None));
        }
    }
}

/// A service of the host's loopback that is neither server: it greets every connection.
fn loopback_service() -> u16 {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    std::thread::spawn(move || {
        for mut stream in listener.incoming().flatten() {
            let _ = stream.write_all(b"hello from the host");
        }
    });
    port
}

#[tokio::test]
async fn a_sandboxed_program_reaches_the_servers_and_no_other_loopback_service() {
    let Some(python) = python() else { return };
    if !bwrap() {
        return;
    }
    let port = [("PROBE_PORT", loopback_service().to_string())];
    let defended = rig(Setup::defended(Some(confined(python)))).await;
    let (_, report) = defended.attack("loopback", &port).await;
    assert_eq!(
        report["loopback"], "refused: ConnectionRefusedError",
        "{report}"
    );
    // The servers are reachable in the same sandbox: the agent solves its task.
    defended.honest(&defended.tasks(Split::Train)[1]).await;

    // The control: a sandbox sharing the host's network reaches the service.
    let shared = rig(Setup::defended(Some(host_network(python)))).await;
    let (_, report) = shared.attack("loopback", &port).await;
    assert_eq!(report["loopback"], "hello from the host", "{report}");
}

#[tokio::test]
async fn a_sandboxed_program_sees_its_script_but_not_the_scripts_folder() {
    let Some(python) = python() else { return };
    if !bwrap() {
        return;
    }
    // The script in a folder with a secret beside it, out of /tmp (private inside anyway),
    // readable by the sandbox's user.
    let dir = tempfile::Builder::new()
        .prefix("program-folder-")
        .tempdir_in(env!("CARGO_TARGET_TMPDIR"))
        .unwrap();
    let script = dir.path().join("attacks.py");
    std::fs::copy(attacks_path(), &script).unwrap();
    std::fs::write(dir.path().join("secret.txt"), "instance files").unwrap();
    use std::os::unix::fs::PermissionsExt as _;
    for (path, mode) in [
        (dir.path().to_path_buf(), 0o755),
        (script.clone(), 0o644),
        (dir.path().join("secret.txt"), 0o644),
    ] {
        std::fs::set_permissions(path, std::fs::Permissions::from_mode(mode)).unwrap();
    }
    let defended = rig(Setup::defended(Some(confined(python)))).await;
    let (_, report) = defended.attack_with(&script, "neighbour", &[]).await;
    assert_eq!(
        report["neighbour"], "unreadable: FileNotFoundError",
        "{report}"
    );

    // The control: without the sandbox the folder is there to read.
    let bare = rig(Setup::defended(None)).await;
    let (_, report) = bare.attack_with(&script, "neighbour", &[]).await;
    assert_eq!(report["neighbour"], "instance files", "{report}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_hostile_program_gains_nothing_and_the_other_episodes_go_on() {
    let Some(python) = python() else { return };
    if !bwrap() {
        return;
    }
    let port = loopback_service().to_string();
    for defended in [true, false] {
        let rig = if defended {
            rig(Setup::defended(Some(confined(python)))).await
        } else {
            // The control: an open server, no sandbox.
            rig(Setup::open(None)).await
        };
        let (task, label) = rig.question_task().await;
        let train = rig.tasks(Split::Train);
        let other = rig.remote.start(&train[3].id, 3, None).await.unwrap();
        let mut hostile = program(&["python3", attacks_path().to_str().unwrap(), "all"]);
        hostile
            .env
            .insert("OTHER_SESSION".into(), other.id().to_string());
        hostile.env.insert("PROBE_PORT".into(), port.clone());
        hostile.env.insert("FLOOD".into(), "5".into());
        // The hostile episode runs beside honest ones of the same runner.
        let (attack, first, second) = tokio::join!(
            rig.runner.run(&hostile, &task, 1),
            rig.honest(&train[0]),
            rig.honest(&train[1]),
        );
        let attack = attack.unwrap();
        let report = report_of(&attack);
        let other_status = rig.remote.status(other.id()).await;
        assert_eq!(first.run.failure, None);
        assert_eq!(second.run.failure, None);
        if defended {
            assert_eq!(attack.trajectory.reward(), 0.0, "{report}");
            assert!(!attack.trajectory.is_success(), "{report}");
            assert_eq!(report["list"], json!([403, 403, 403]), "{report}");
            assert_eq!(report["side_open"], 403, "{report}");
            assert!(report.get("gold").is_none(), "{report}");
            for route in [
                "other_episode",
                "other_status",
                "other_step",
                "other_delete",
            ] {
                assert_eq!(report[route], 403, "{route}: {report}");
            }
            assert_eq!(report["own_status"], 403, "{report}");
            assert_eq!(report["flood_opened"], 0, "{report}");
            assert_eq!(report["loopback"], "refused: ConnectionRefusedError");
            // It finished its session and was told nothing of the verdict; the runner holds
            // the verifier's details.
            assert_eq!(report["own_finish"], 200, "{report}");
            assert_eq!(report["own_outcome"], Value::Null, "{report}");
            assert_eq!(attack.trajectory.outcome.details["label"], label);
            assert_eq!(other_status.unwrap().steps, 0);
        } else {
            // Without the defences the same program steals the gold answer and scores.
            assert_eq!(report["gold"], label, "{report}");
            assert_eq!(report["loopback"], "hello from the host", "{report}");
            assert!(attack.trajectory.is_success(), "{report}");
            assert!(
                report["own_outcome"]["details"]["label"].is_array(),
                "{report}"
            );
            assert!(
                other_status.is_err(),
                "the other session survived the control"
            );
        }
    }
}

#[test]
fn the_librarys_default_runner_settings_sandbox_where_bubblewrap_works() {
    let Some(python) = python() else { return };
    let settings = RunnerSettings::default();
    if bwrap() {
        let sandbox = settings.sandbox.as_ref().expect("bubblewrap works here");
        assert!(!sandbox.config().share_network);
        assert_eq!(
            settings.sandbox_kind(),
            "bubblewrap (own network: env server and proxy only)"
        );
        // The control's sandbox says that it shares the host's network.
        let shared = RunnerSettings {
            sandbox: Some(host_network(python)),
            ..RunnerSettings::default()
        };
        assert_eq!(shared.sandbox_kind(), "bubblewrap (host network)");
    } else {
        assert!(settings.sandbox.is_none());
        assert_eq!(settings.sandbox_kind(), "none");
    }
    let bare = RunnerSettings {
        sandbox: None,
        ..RunnerSettings::default()
    };
    assert_eq!(bare.sandbox_kind(), "none");
}
