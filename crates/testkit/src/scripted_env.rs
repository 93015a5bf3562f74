//! A small deterministic environment for protocol tests.

use async_trait::async_trait;
use harness_core::{
    EnvSession, Environment, Observation, Outcome, Result, Split, Task, ToolCall, ToolKind,
    ToolSpec,
};
use serde_json::{Value, json};

/// Items per page of the `list_items` tool.
pub const PAGE_SIZE: usize = 3;

/// An environment with a paginated listing. Its tools:
/// `list_items{page}` (pages of `PAGE_SIZE` (3) items, flagged as paginated), `echo{text}`,
/// `fail{}` (always an error), `docs{}` (a lookup) and `submit{answer}` (ends the episode).
/// The verifier accepts the task's `metadata.answer`, submitted or given as the final answer.
#[derive(Debug, Clone)]
pub struct ScriptedEnv {
    pages: usize,
}

impl ScriptedEnv {
    /// An environment whose listing has `pages` pages (the last one short).
    pub fn new(pages: usize) -> Self {
        ScriptedEnv {
            pages: pages.max(1),
        }
    }

    /// Total items in the listing.
    pub fn item_count(&self) -> usize {
        self.pages * PAGE_SIZE - 1
    }

    /// A task whose accepted answer is `answer`.
    pub fn task(&self, id: &str, answer: &str) -> Task {
        let mut task = Task::new(
            id,
            "scripted",
            Split::Train,
            format!("Find the answer for {id}."),
            0,
        );
        task.metadata = json!({ "answer": answer });
        task
    }

    /// The tools of every episode.
    pub fn tool_specs() -> Vec<ToolSpec> {
        let object = |props: Value, required: Value| json!({"type": "object", "properties": props, "required": required});
        vec![
            ToolSpec::new(
                "list_items",
                "List items, one page at a time.",
                object(
                    json!({"page": {"type": "integer", "minimum": 1}}),
                    json!(["page"]),
                ),
            ),
            ToolSpec::new(
                "echo",
                "Echo text back.",
                object(json!({"text": {"type": "string"}}), json!(["text"])),
            ),
            ToolSpec::new("fail", "Always fails.", object(json!({}), json!([]))),
            ToolSpec::new(
                "docs",
                "Show tool documentation.",
                object(json!({}), json!([])),
            )
            .with_kind(ToolKind::Lookup),
            ToolSpec::new(
                "submit",
                "Submit the answer and end the episode.",
                object(json!({"answer": {"type": "string"}}), json!(["answer"])),
            )
            .with_kind(ToolKind::Submit),
        ]
    }
}

#[async_trait]
impl Environment for ScriptedEnv {
    fn name(&self) -> &str {
        "scripted"
    }

    async fn reset(&self, task: &Task, seed: u64) -> Result<Box<dyn EnvSession>> {
        let answer = task
            .metadata
            .get("answer")
            .and_then(Value::as_str)
            .unwrap_or_default()
            .to_string();
        Ok(Box::new(ScriptedSession {
            pages: self.pages,
            seed,
            answer,
            submitted: None,
            done: false,
        }))
    }

    fn tasks(&self, split: Split) -> Result<Vec<Task>> {
        let count = self.item_count().to_string();
        Ok((0..4)
            .map(|i| {
                let mut task = self.task(&format!("scripted/{split}-{i}"), &count);
                task.split = split;
                task.instruction = "Count every item in the listing and submit the count.".into();
                task.seed = i;
                task
            })
            .collect())
    }
}

struct ScriptedSession {
    pages: usize,
    seed: u64,
    answer: String,
    submitted: Option<String>,
    done: bool,
}

#[async_trait]
impl EnvSession for ScriptedSession {
    fn tools(&self) -> Vec<ToolSpec> {
        ScriptedEnv::tool_specs()
    }

    fn initial_observation(&self) -> String {
        format!(
            "The listing has {} pages. Episode seed {}.",
            self.pages, self.seed
        )
    }

    async fn step(&mut self, call: &ToolCall) -> Result<Observation> {
        if self.done {
            return Ok(Observation::error("The episode has already ended."));
        }
        let Some(args) = call.arguments.as_object() else {
            return Ok(Observation::error("Arguments must be a JSON object."));
        };
        Ok(match call.name.as_str() {
            "list_items" => match args.get("page").and_then(Value::as_u64) {
                Some(page) if page >= 1 && (page as usize) <= self.pages => {
                    let start = (page as usize - 1) * PAGE_SIZE;
                    let end = (start + PAGE_SIZE).min(self.pages * PAGE_SIZE - 1);
                    let items: Vec<String> = (start..end).map(|i| format!("item-{i}")).collect();
                    let obs = Observation::ok(format!(
                        "page {page} of {}: {}",
                        self.pages,
                        items.join(", ")
                    ));
                    if self.pages > 1 { obs.paginated() } else { obs }
                }
                _ => Observation::error(format!(
                    "`page` must be an integer from 1 to {}.",
                    self.pages
                )),
            },
            "echo" => match args.get("text").and_then(Value::as_str) {
                Some(text) if text.len() <= 10_000 => Observation::ok(text),
                Some(_) => Observation::error("`text` is longer than 10000 bytes."),
                None => Observation::error("`text` must be a string."),
            },
            "fail" => Observation::error("This tool always fails."),
            "docs" => {
                Observation::ok("list_items{page}, echo{text}, fail{}, docs{}, submit{answer}")
            }
            "submit" => match args.get("answer").and_then(Value::as_str) {
                Some(answer) if answer.len() <= 10_000 => {
                    self.submitted = Some(answer.to_string());
                    self.done = true;
                    Observation::ok("Submitted.").finished()
                }
                _ => Observation::error("`answer` must be a string of at most 10000 bytes."),
            },
            other => Observation::error(format!("Unknown tool `{other}`.")),
        })
    }

    async fn verify(&mut self, final_answer: Option<&str>) -> Result<Outcome> {
        let given = self.submitted.as_deref().or(final_answer).map(str::trim);
        let details = json!({"expected": self.answer, "given": given});
        Ok(if given == Some(self.answer.as_str()) {
            Outcome::success(details)
        } else {
            Outcome::failure(details)
        })
    }
}
