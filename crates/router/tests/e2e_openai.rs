//! End to end over HTTP on 127.0.0.1: harness-openai's own OpenAI-compatible server serves a
//! scripted token generator that answers profiler and voter prompts; the LLM profiler and LLM
//! voters reach it through harness-openai's `ChatClient`, and the tokens counted per role from
//! each response agree with the client's usage ledger.

mod common;

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::AtomicU8;
use std::time::Duration;

use async_trait::async_trait;
use common::*;
use harness_core::{
    CalibrationPoint, ChatMessage, ChatModel, FinishReason, Policy, Result, SelectionMode, Split,
    ToolSpec,
};
use harness_openai::server::ServerHandle;
use harness_openai::{
    ChatClient, ChatClientConfig, PromptEncoder, ServerConfig, ServerState, TokenGenerator,
    TokenOutput, TokenRequest, UsageLedger,
};
use harness_router::{
    AdaptiveRouter, Calibrator, CalibratorSettings, EvidenceCell, LlmProfiler, LlmProfilerSettings,
    LlmVoter, LlmVoterSettings, PROFILER_ROLE, RouterSettings, TokenCounter, VOTER_ROLE, Voter,
};
use serde_json::json;

const MODEL: &str = "scripted-router-model";

/// One token per byte; messages as `<|role|>content\n`, then `<|assistant|>`.
struct Bytes;

impl PromptEncoder for Bytes {
    fn encode(&self, messages: &[ChatMessage], _tools: &[ToolSpec]) -> Result<Vec<u32>> {
        let mut text = String::new();
        for m in messages {
            text.push_str(&format!("<|{:?}|>{}\n", m.role, m.content));
        }
        text.push_str("<|assistant|>");
        Ok(text.bytes().map(u32::from).collect())
    }

    fn decode(&self, tokens: &[u32]) -> Result<String> {
        let bytes: Vec<u8> = tokens
            .iter()
            .filter(|t| **t < 256)
            .map(|t| *t as u8)
            .collect();
        Ok(String::from_utf8_lossy(&bytes).into_owned())
    }
}

/// Answers a voter prompt with its first four candidates and a profiler prompt with one entry
/// citing the first task shown; anything else gets prose.
struct RouterRoles;

fn answer(prompt: &str) -> String {
    let ids: Vec<&str> = prompt
        .lines()
        .filter_map(|l| l.strip_prefix("- id "))
        .filter_map(|l| l.split_whitespace().next())
        .collect();
    if !ids.is_empty() {
        return json!({"ranking": ids.into_iter().take(4).collect::<Vec<_>>()}).to_string();
    }
    let task = prompt
        .lines()
        .find_map(|l| l.strip_prefix("=== task "))
        .and_then(|l| l.split_whitespace().next());
    match task {
        Some(task) => json!({
            "prefer": [{"when": "the listing spans several pages", "behavior": "reads every page before submitting", "support": [task]}],
            "avoid": []
        })
        .to_string(),
        None => "I cannot help with that.".into(),
    }
}

#[async_trait]
impl TokenGenerator for RouterRoles {
    fn vocab_size(&self) -> usize {
        256
    }

    async fn generate(&self, request: TokenRequest) -> Result<TokenOutput> {
        let prompt = Bytes.decode(&request.prompt)?;
        let mut tokens: Vec<u32> = answer(&prompt).bytes().map(u32::from).collect();
        let finish = if tokens.len() > request.max_new_tokens {
            tokens.truncate(request.max_new_tokens);
            FinishReason::Length
        } else {
            FinishReason::Stop
        };
        Ok(TokenOutput {
            logprobs: vec![-0.1; tokens.len()],
            tokens,
            finish,
        })
    }
}

#[tokio::test]
async fn llm_profiler_and_voters_against_the_projects_own_openai_compatible_server() {
    let state = Arc::new(ServerState::new(
        ServerConfig::new(MODEL, 1 << 20),
        Arc::new(Bytes),
        Arc::new(RouterRoles),
    ));
    let server = ServerHandle::spawn(SocketAddr::from(([127, 0, 0, 1], 0)), state)
        .await
        .expect("bind 127.0.0.1");
    let mut config = ChatClientConfig::new(format!("{}/v1", server.base_url()), MODEL);
    config.endpoint.timeout = Duration::from_secs(20);
    let ledger = UsageLedger::new();
    let client: Arc<dyn ChatModel> =
        Arc::new(ChatClient::with_ledger(config, ledger.clone()).unwrap());

    let tokens = TokenCounter::new();
    let pool = Arc::new(pool());
    let policy: Arc<dyn Policy> =
        Arc::new(phased_policy(Arc::new(AtomicU8::new(0)), default_script));
    let evidence = EvidenceCell::new();
    let calibrator = Calibrator::new(
        pool.clone(),
        policy,
        envs(),
        validation_tasks(),
        Arc::new(LlmProfiler::new(
            client.clone(),
            LlmProfilerSettings::default(),
            tokens.clone(),
        )),
        evidence.clone(),
        CalibratorSettings::default(),
    )
    .unwrap();
    let (calibration, _) = calibrator
        .run(&CalibrationPoint {
            index: 0,
            update: 0,
            is_final: false,
            seed: 1,
            checkpoint: None,
        })
        .await
        .unwrap();
    let a = id_of(&pool, "S-A");
    assert_eq!(calibration.profiler.failures, 0);
    assert_eq!(
        calibration.profiles[&a].prefer[0].behavior,
        "reads every page before submitting"
    );

    let voters: Vec<Arc<dyn Voter>> = (0..2)
        .map(|v| {
            Arc::new(LlmVoter::new(
                format!("http-{v}"),
                client.clone(),
                v,
                LlmVoterSettings::default(),
                tokens.clone(),
            )) as Arc<dyn Voter>
        })
        .collect();
    let router = AdaptiveRouter::new(evidence, voters, RouterSettings::default()).unwrap();
    let routed = router
        .route(
            &task("train-mail", Split::Train, "mail", 9),
            4,
            SelectionMode::Rescue,
            2,
        )
        .await
        .unwrap();
    assert_eq!(
        routed.ballots.len(),
        2,
        "both ballots came back valid over HTTP"
    );
    assert_eq!(routed.selection.ids.len(), 4);
    assert!(!routed.selection.ids.contains(pool.base_id()));

    // Tokens per role, counted by the router from each response, match the client's ledger.
    for role in [PROFILER_ROLE, VOTER_ROLE] {
        let ours = tokens.role(role);
        let theirs = ledger.role(role);
        assert!(ours.requests > 0, "{role}");
        assert_eq!(ours.requests, theirs.requests, "{role}");
        assert_eq!(ours.usage.prompt_tokens, theirs.prompt_tokens, "{role}");
        assert_eq!(
            ours.usage.completion_tokens, theirs.completion_tokens,
            "{role}"
        );
        assert!(theirs.prompt_tokens > 0);
    }
    assert_eq!(
        router.stats().voter_usage.prompt_tokens,
        ledger.role(VOTER_ROLE).prompt_tokens
    );
    assert_eq!(
        calibration.profiler.usage.prompt_tokens,
        ledger.role(PROFILER_ROLE).prompt_tokens
    );
    server.shutdown().await.unwrap();
}
