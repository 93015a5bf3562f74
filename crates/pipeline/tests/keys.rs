//! The run's API keys never leave over plain http to another host: setting up a run with a
//! key for a plain-http endpoint elsewhere is refused before anything else happens.

use harness_pipeline::{Progress, RunConfig, Secrets, Workbench};

#[test]
fn a_key_for_a_plain_http_endpoint_elsewhere_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let mut cfg = RunConfig {
        out: dir.path().join("run"),
        ..RunConfig::default()
    };
    cfg.policy.cache_dir = dir.path().join("cache");
    cfg.set("roles.llm", "\"http://api.example.com/v1\"")
        .unwrap();
    let secrets = Secrets {
        llm_api_key: Some("sk-hunter2".into()),
        engine_api_key: None,
        tinker_api_key: None,
    };
    let Err(err) = Workbench::new(cfg, secrets, Progress::hidden()) else {
        panic!("a key over plain http to another host was accepted");
    };
    let err = err.to_string();
    assert!(
        err.contains("roles.llm") && err.contains("allow_insecure_http"),
        "{err}"
    );
    assert!(!err.contains("hunter2"), "{err}");
    assert!(!dir.path().join("run").exists());
}
