//! The ChatML template renders exactly as `transformers` renders the Jinja template we save with
//! checkpoints, and the built-in tokenizer tokenizes the result exactly as `transformers` does.
//! Fixture: `scripts/make_reference.py --chat-template DIR` on a checkpoint saved by the
//! `tiny_policy` example.

use grpo_candle::ChatTemplate;
use grpo_candle::model::chat_template::CHATML_JINJA;
use grpo_candle::model::tokenizer::{encode, tiny_tokenizer};
use harness_core::{ChatMessage, ToolSpec};
use serde_json::Value;

#[test]
fn chatml_matches_transformers_token_for_token() {
    let path = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/tests/fixtures/chat_template_reference.json"
    );
    let fixture: Value = serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap();
    assert_eq!(
        fixture["chat_template"].as_str().unwrap(),
        CHATML_JINJA,
        "the saved Jinja template changed: regenerate the fixture"
    );
    let tokenizer = tiny_tokenizer(grpo_candle::TinySpec::default().num_merges).unwrap();
    let cases = fixture["cases"].as_array().unwrap();
    assert!(cases.len() >= 16);
    for (i, case) in cases.iter().enumerate() {
        let messages: Vec<ChatMessage> = serde_json::from_value(case["messages"].clone()).unwrap();
        let tools: Vec<ToolSpec> = case["tools"]
            .as_array()
            .unwrap()
            .iter()
            .map(|t| {
                let f = &t["function"];
                ToolSpec::new(
                    f["name"].as_str().unwrap(),
                    f["description"].as_str().unwrap(),
                    f["parameters"].clone(),
                )
            })
            .collect();
        let generation = case["add_generation_prompt"].as_bool().unwrap();
        let rendered = ChatTemplate::ChatMl.render(&messages, &tools, generation);
        assert_eq!(rendered, case["rendered"].as_str().unwrap(), "case {i}");
        let ids: Vec<u32> = serde_json::from_value(case["token_ids"].clone()).unwrap();
        assert_eq!(
            encode(&tokenizer, &rendered).unwrap(),
            ids,
            "case {i}: token ids"
        );
    }
}
