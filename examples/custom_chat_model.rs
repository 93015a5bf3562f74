//! Your own model for the LLM roles: implement [`ChatModel`] (text in, text out) and hand it to
//! a role: here the Adaptive Harness Router's LLM voter.
//!
//! ```text
//! cargo run --release --example custom_chat_model
//! ```
//!
//! The model here is a local program: each request goes to its standard input as JSON
//! (`{"purpose", "messages": [{"role", "content"}], "temperature", "max_tokens", "seed"}`) and
//! its standard output is the answer, so a command-line engine or a script can serve the voter,
//! profiler, labeller, analyst, editor and proposer roles without an HTTP server. The program in
//! this example is a few lines of Python that ranks the voter's candidates by the validation
//! success the prompt shows them with (python3 must be on `PATH`). An OpenAI-compatible endpoint
//! needs no code: harness-openai's `ChatClient` is the `ChatModel` the main job uses for
//! `roles.llm`.

use std::process::Stdio;
use std::sync::Arc;

use async_trait::async_trait;
use harness_core::{
    ChatModel, ChatRequest, ChatResponse, Error, Harness, Result, SelectionMode, Split, Task,
};
use harness_router::{
    Candidate, FeatureSource, LlmVoter, LlmVoterSettings, TokenCounter, VoteRequest, Voter,
};
use serde_json::json;
use tokio::io::AsyncWriteExt;
use tokio::process::Command;

/// A chat model served by a local program, one process per request.
pub struct CommandChat {
    name: String,
    program: String,
    args: Vec<String>,
}

impl CommandChat {
    /// A model that runs `program args...` for each request.
    pub fn new(program: impl Into<String>, args: Vec<String>) -> Self {
        let program = program.into();
        CommandChat {
            name: format!("command:{program}"),
            program,
            args,
        }
    }

    fn error(&self, message: String) -> Error {
        Error::Chat {
            model: self.name.clone(),
            message,
        }
    }
}

#[async_trait]
impl ChatModel for CommandChat {
    fn name(&self) -> &str {
        &self.name
    }

    async fn complete(&self, request: ChatRequest) -> Result<ChatResponse> {
        let input = json!({
            "purpose": request.purpose,
            "messages": request.messages.iter().map(|m| json!({
                "role": m.role, "content": m.content,
            })).collect::<Vec<_>>(),
            "temperature": request.temperature,
            "max_tokens": request.max_tokens,
            "seed": request.seed,
        });
        let mut child = Command::new(&self.program)
            .args(&self.args)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .kill_on_drop(true)
            .spawn()
            .map_err(|e| self.error(format!("cannot start `{}`: {e}", self.program)))?;
        let mut stdin = child.stdin.take().expect("stdin is piped");
        stdin
            .write_all(input.to_string().as_bytes())
            .await
            .map_err(|e| self.error(format!("writing the request: {e}")))?;
        drop(stdin);
        let output = child
            .wait_with_output()
            .await
            .map_err(|e| self.error(format!("waiting for the program: {e}")))?;
        if !output.status.success() {
            return Err(self.error(format!(
                "exited with {}: {}",
                output.status,
                String::from_utf8_lossy(&output.stderr).trim()
            )));
        }
        Ok(ChatResponse {
            text: String::from_utf8_lossy(&output.stdout).trim().to_string(),
            // A program that reports no token counts costs nothing in Table 10's accounting.
            usage: None,
        })
    }
}

/// The example's voter program: read the request, rank the candidates listed as
/// `- id <id> | ... | validation success <s>` by `s`, answer `{"ranking": [...]}`.
const RANKER: &str = r#"
import json, re, sys
request = json.load(sys.stdin)
system, user = request["messages"][0]["content"], request["messages"][-1]["content"]
n = int(re.search(r"Rank exactly (\d+)", system).group(1))
found = re.findall(r"^- id (\S+) \|.*validation success ([0-9.]+)", user, re.M)
ranked = sorted(found, key=lambda c: -float(c[1]))
print(json.dumps({"ranking": [c[0] for c in ranked[:n]]}))
"#;

fn candidate(harness: &Harness, is_base: bool, validation_success: f64) -> Candidate {
    Candidate {
        id: harness.id(),
        name: harness.name.clone(),
        description: harness.description.clone(),
        is_base,
        validation_success,
        profile: None,
    }
}

/// Ask the command-backed voter for a rescue ballot of two; the ballot and the names of the
/// candidates it lists.
pub async fn run() -> anyhow::Result<Vec<String>> {
    let model: Arc<dyn ChatModel> = Arc::new(CommandChat::new(
        "python3",
        vec!["-c".into(), RANKER.into()],
    ));
    let voter = LlmVoter::new(
        "command-voter",
        model,
        7,
        LlmVoterSettings::default(),
        TokenCounter::new(),
    );
    let siblings = [
        (Harness::new("notes", "Keep notes of what you found."), 0.41),
        (
            Harness::new("recheck", "Check a result before you commit it."),
            0.77,
        ),
        (
            Harness::new("paging", "Read every page of a listing."),
            0.63,
        ),
    ];
    let request = VoteRequest {
        task: Task::new(
            "demo-1",
            "dbbench",
            Split::Train,
            "How many orders shipped late?",
            0,
        ),
        mode: SelectionMode::Rescue,
        candidates: siblings
            .iter()
            .map(|(h, s)| candidate(h, false, *s))
            .collect(),
        similar: Vec::new(),
        features: FeatureSource::Text,
        ballot_len: 2,
        seed: 1,
        attempt: 0,
    };
    let answer = voter.vote(&request).await?;
    let ballot = answer
        .ballot
        .map_err(|e| anyhow::anyhow!("the program's ballot was refused: {e:?}"))?;
    let names = ballot
        .iter()
        .map(|id| {
            siblings
                .iter()
                .find(|(h, _)| h.id().to_string() == *id)
                .map_or_else(|| id.clone(), |(h, _)| h.name.clone())
        })
        .collect();
    Ok(names)
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let ballot = run().await?;
    println!("the command-backed voter ranks: {}", ballot.join(", "));
    Ok(())
}
