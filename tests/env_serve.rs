//! `harness-s env-serve`: the command serves DBBench over HTTP (a `RemoteEnv` connects, lists
//! the generated tasks and runs a session), and refuses bad flags naming them.

use std::io::{BufRead, BufReader};
use std::process::{Child, Command, Stdio};

use harness_core::{Environment, Split, ToolCall};
use harness_external::envserver::client::RemoteEnv;
use serde_json::json;

/// Ends the server when the test ends, passed or not.
struct Killed(Child);

impl Drop for Killed {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

#[tokio::test]
async fn env_serve_serves_dbbench() {
    let mut child = Command::new(env!("CARGO_BIN_EXE_harness-s"))
        .args([
            "env-serve",
            "--env",
            "dbbench",
            "--seed",
            "5",
            "--port",
            "0",
        ])
        .env("RUST_LOG", "error")
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .expect("the binary runs");
    let stdout = child.stdout.take().unwrap();
    let server = Killed(child);
    let mut line = String::new();
    BufReader::new(stdout).read_line(&mut line).unwrap();
    assert!(line.contains("serving environment `dbbench`"), "{line}");
    let url = line
        .split_whitespace()
        .find(|w| w.starts_with("http://"))
        .expect("the address is printed")
        .to_string();
    let env = RemoteEnv::connect(url).await.unwrap();
    assert_eq!(env.name(), "dbbench");
    let train = env.tasks(Split::Train).unwrap();
    assert_eq!(train.len(), 220, "the generator's default train split");
    assert!(line.contains("220 train"), "{line}");
    let mut session = env.reset(&train[0], 1).await.unwrap();
    let obs = session
        .step(&ToolCall::new("execute_sql", json!({"query": "SELECT 1"})))
        .await
        .unwrap();
    assert!(!obs.error, "{obs:?}");
    let outcome = session.verify(None).await.unwrap();
    assert_eq!(outcome.reward, 0.0);
    drop(server);
}

#[test]
fn env_serve_refuses_bad_flags_by_name() {
    for (args, needle) in [
        (vec!["env-serve", "--env", "nope"], "--env nope"),
        (
            vec!["env-serve", "--idle-timeout-s", "0", "--port", "0"],
            "--idle-timeout-s",
        ),
        (
            vec![
                "env-serve",
                "--env",
                "appworld",
                "--dbbench-data",
                "x.jsonl",
            ],
            "--dbbench-data",
        ),
        (
            vec![
                "env-serve",
                "--dbbench-data",
                "/no/such/dev.jsonl",
                "--port",
                "0",
            ],
            "/no/such/dev.jsonl",
        ),
    ] {
        let out = Command::new(env!("CARGO_BIN_EXE_harness-s"))
            .args(&args)
            .env("RUST_LOG", "error")
            .output()
            .unwrap();
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success(), "{args:?} was accepted");
        assert!(err.contains(needle), "{args:?}: {err}");
    }
}
