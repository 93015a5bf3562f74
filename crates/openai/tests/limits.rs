//! The server under hostile input (issue 25 item 3): the API key on every route, weight reloads
//! confined to an allowed root, request limits (stop strings, a default `max_tokens`, a bounded
//! queue).

mod common;

use std::sync::Arc;
use std::time::Duration;

use common::{ByteEncoder, MODEL, ScriptedGenerator, loopback};
use harness_openai::{ApiKey, ServerConfig, ServerHandle, ServerState, TokenGenerator};
use serde_json::{Value, json};

async fn serve(config: ServerConfig, generator: Arc<dyn TokenGenerator>) -> ServerHandle {
    let state = Arc::new(ServerState::new(config, Arc::new(ByteEncoder), generator));
    ServerHandle::spawn(loopback(), state).await.unwrap()
}

fn scripted() -> Arc<dyn TokenGenerator> {
    Arc::new(ScriptedGenerator::new(Duration::ZERO))
}

async fn send(
    method: reqwest::Method,
    url: &str,
    key: Option<&str>,
    body: Option<&Value>,
) -> (u16, reqwest::header::HeaderMap, Value) {
    let mut request = reqwest::Client::new().request(method, url);
    if let Some(key) = key {
        request = request.bearer_auth(key);
    }
    if let Some(body) = body {
        request = request.json(body);
    }
    let response = request.send().await.unwrap();
    let status = response.status().as_u16();
    let headers = response.headers().clone();
    let value = response.json::<Value>().await.unwrap_or(Value::Null);
    (status, headers, value)
}

#[tokio::test]
async fn with_an_api_key_every_route_refuses_a_missing_or_wrong_key_with_401() {
    let mut config = ServerConfig::new(MODEL, 4096);
    config.api_key = ApiKey::new("sk-test-secret");
    let server = serve(config, scripted()).await;
    let base = server.base_url();
    let completion = json!({"model": MODEL, "prompt": [97, 98], "max_tokens": 4});
    let routes = [
        (reqwest::Method::GET, "/health", None),
        (reqwest::Method::GET, "/v1/models", None),
        (reqwest::Method::POST, "/v1/completions", Some(&completion)),
        (
            reqwest::Method::POST,
            "/v1/chat/completions",
            Some(&completion),
        ),
        (reqwest::Method::POST, "/generate", Some(&completion)),
        (
            reqwest::Method::POST,
            "/update_weights_from_disk",
            Some(&completion),
        ),
        (reqwest::Method::POST, "/collective_rpc", Some(&completion)),
        (reqwest::Method::POST, "/reset_prefix_cache", None),
        (reqwest::Method::GET, "/no/such/route", None),
    ];
    for (method, route, body) in routes {
        let url = format!("{base}{route}");
        for key in [
            None,
            Some("sk-test-secreT"),
            Some("sk-test-secret-longer"),
            Some(""),
        ] {
            let (status, _, value) = send(method.clone(), &url, key, body).await;
            assert_eq!(status, 401, "{method} {route} with {key:?}");
            assert_eq!(value["error"]["type"], "invalid_request_error", "{value}");
            assert!(
                value["error"]["message"]
                    .as_str()
                    .unwrap()
                    .contains("API key"),
                "{value}"
            );
        }
    }
    // The right key passes.
    let (status, _, value) = send(
        reqwest::Method::GET,
        &format!("{base}/health"),
        Some("sk-test-secret"),
        None,
    )
    .await;
    assert_eq!((status, value["status"].as_str()), (200, Some("ok")));
    let (status, _, value) = send(
        reqwest::Method::POST,
        &format!("{base}/v1/completions"),
        Some("sk-test-secret"),
        Some(&completion),
    )
    .await;
    assert_eq!(status, 200, "{value}");
    // Its Debug does not show the key.
    let shown = format!("{:?}", ApiKey::new("sk-test-secret").unwrap());
    assert!(!shown.contains("secret"), "{shown}");
    assert!(ApiKey::new("").is_none());
    server.shutdown().await.unwrap();
}
