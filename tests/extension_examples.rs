//! The extension-point examples (`examples/custom_*.rs`) compile and do what their docs say:
//! each is included here as a module and its `run` is called and checked (`custom_policy.rs`
//! through `custom_learner.rs`, which trains its policy).

#[allow(dead_code)]
#[path = "../examples/custom_environment.rs"]
mod custom_environment;

#[allow(dead_code)]
#[path = "../examples/custom_learner.rs"]
mod custom_learner;

#[allow(dead_code)]
#[path = "../examples/custom_router.rs"]
mod custom_router;

#[allow(dead_code)]
#[path = "../examples/custom_chat_model.rs"]
mod custom_chat_model;

#[tokio::test]
async fn a_custom_environment_passes_the_conformance_suite_and_runs_an_episode() {
    let (report, trajectory) = custom_environment::run().await.expect("the example runs");
    assert!(report.failures.is_empty(), "{:#?}", report.failures);
    assert!(report.episodes > 0 && report.probes > 0, "{report:?}");
    // The counting policy lists the warehouses, reads the three stocks and submits the sum.
    assert!(trajectory.is_success(), "{:?}", trajectory.outcome);
    assert_eq!(trajectory.counts.env_actions, 5);
}

#[tokio::test]
async fn a_broken_environment_fails_the_conformance_suite() {
    // The suite can fail: an oracle that submits a wrong total is reported, naming the check.
    use harness_core::{Environment, Split, ToolCall};
    use harness_testkit::ScriptedPolicy;
    use harness_testkit::conformance::{ConformanceConfig, check_environment};
    let env = custom_environment::StockRoom;
    let tasks = env.tasks(Split::Train).unwrap();
    let wrong = |task: &harness_core::Task| -> Box<dyn harness_core::Policy> {
        let total = custom_environment::StockRoom::total(task) + 1;
        let submit = ToolCall::new("submit", serde_json::json!({ "total": total }));
        Box::new(ScriptedPolicy::new(vec![submit.to_tool_call_block()]))
    };
    let report = check_environment(&env, &tasks, &wrong, &ConformanceConfig::default()).await;
    assert!(
        report.failures.iter().any(|f| f.contains("oracle")),
        "{:#?}",
        report.failures
    );
}

#[tokio::test]
async fn a_custom_policy_samples_reproducibly_and_is_scored() {
    let (pass, avg) = custom_learner::custom_policy::run()
        .await
        .expect("the example runs");
    // The prior puts about one episode in five on the right answer.
    assert!(avg > 0.0 && avg < 0.6, "Avg@3 {avg}");
    // Some task is solved on one attempt of three and failed on another.
    assert!(pass > avg, "Pass@3 {pass}, Avg@3 {avg}");
}

#[tokio::test(flavor = "multi_thread")]
async fn a_custom_learner_trains_the_policy_in_the_rescue_loop() {
    let dir = tempfile::tempdir().unwrap();
    let (before, after, updates) = custom_learner::run(dir.path())
        .await
        .expect("the example runs");
    assert_eq!(updates, 15);
    assert!(before < 0.5, "Avg@3 before training {before}");
    assert!(after > before + 0.3, "Avg@3 {before} -> {after}");
    assert!(dir.path().join("metrics.jsonl").is_file());
}

#[tokio::test(flavor = "multi_thread")]
async fn a_custom_router_sends_each_task_to_the_sibling_that_cures_it() {
    let dir = tempfile::tempdir().unwrap();
    let rescues = custom_router::run(dir.path())
        .await
        .expect("the example runs");
    assert!(!rescues.is_empty());
    for (tag, harness) in &rescues {
        let expected = match tag.as_str() {
            "paging" => "pager",
            "text" => "submitter",
            other => panic!("unexpected tag {other}"),
        };
        assert_eq!(harness, expected, "{rescues:?}");
    }
    // Both kinds of task were rescued.
    assert!(rescues.iter().any(|(t, _)| t == "paging"));
    assert!(rescues.iter().any(|(t, _)| t == "text"));
}

#[tokio::test]
async fn a_custom_chat_model_serves_the_llm_voter() {
    let ballot = custom_chat_model::run().await.expect("the example runs");
    // The program ranks by validation success: recheck (0.77), then paging (0.63).
    assert_eq!(ballot, ["recheck", "paging"]);
}
