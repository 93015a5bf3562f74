//! # An AppWorld-style world of apps and people
//!
//! A simulated user with a mailbox (inbox, spam, archive, sent), a music account (library,
//! liked songs, playlists), a payments account (balance, transactions, fees, password reset by
//! emailed code), a shopping account (orders, returns with dates) and a `supervisor` app that
//! knows the user's profile and saved passwords. Tasks are generated from seeds (six templates,
//! three difficulty levels, train/validation/test splits) and judged AppWorld-style from
//! state: the answer, the intended final state, and that nothing else changed.
//!
//! ## Tools
//! - `api_docs_list_apps{}`, `api_docs_list_apis{app}`, `api_docs_show_api{app, api}`
//!   ([`ToolKind::Lookup`]): the documentation, so `no_schema_lookup_before_first_call` means
//!   "the policy called an API before reading any documentation".
//! - `call_api{app, api, arguments}` ([`ToolKind::Action`]): one API call. Listings take
//!   `page` and `page_size` (default 5, at most 20) and return no total; every page of a
//!   listing with more than one page sets [`Observation::pagination`], which drives the
//!   `pagination_present` hook condition.
//! - `complete_task{answer}` ([`ToolKind::Submit`]): the supervisor's completion API; it ends
//!   the episode, and `before_finish` hooks apply to it.
//!
//! ## Tasks
//! [`AppWorld::tasks`] gives 300 train, 102 validation and 102 test tasks; the template cycles
//! with the task index and the difficulty with every sixth index, so every split holds all
//! six templates at all three levels. Each task's world comes from its seed alone, with a
//! fixed "today" that the initial observation states.
//!
//! | template | behaviour needed | level 2 adds | level 3 adds |
//! |---|---|---|---|
//! | `mail_count` | page through a folder, match the sender | the spam folder | archive too, a namesake sender |
//! | `liked_intersection` | liked *and* in a playlist | a genre condition | email the list (write) |
//! | `playlist_build` | filter liked songs, create and fill a playlist, read it back | a genre condition | a release-date condition (one `show_song` per candidate) |
//! | `returns_window` | log in, page through returns, filter by product and date | the last 14 or 30 days | last calendar month, more pages |
//! | `account_recovery` | request a code, read it from mail, reset, log in, answer | save the password in supervisor | stale codes in the inbox, the new one filtered to spam |
//! | `transfer_readback` | send money, read the balance back (fees apply) | find the amount by a relative date | pay back everyone in a 7-day window |
//!
//! ## Verification
//! The verifier keeps the world as it was at reset and compares it with the final world
//! ([`world::diff`]): the answer given to `complete_task` must match the ground truth computed
//! from the initial world ([`templates::expected`]), the intended changes must be there (a
//! password, a playlist, payments, an email), and every other difference is collateral damage
//! that fails the task. [`Outcome::details`] lists each check with what was expected and found.
//!
//! ```
//! use harness_core::{Environment, Split, run_episode};
//! use harness_appworld::{AppWorld, OraclePolicy, base_harness};
//!
//! let env = AppWorld::new();
//! let task = env.tasks(Split::Validation)?.remove(0);
//! let oracle = OraclePolicy::new(&task);
//! let trajectory = futures::executor::block_on(run_episode(&oracle, &base_harness(), &env, &task, 1))?;
//! assert!(trajectory.is_success());
//! # Ok::<(), harness_core::Error>(())
//! ```

pub mod apps;
pub mod date;
pub mod generate;
pub mod labels;
mod oracle;
pub mod templates;
pub mod world;

use std::collections::BTreeMap;

use async_trait::async_trait;
use harness_core::{
    EnvSession, Environment, Error, Harness, HookAction, HookEvent, HookSpec, Observation, Outcome,
    PromptRule, Result, Split, Task, ToolCall, ToolKind, ToolSpec,
};
use rand::SeedableRng;
use rand_chacha::ChaCha8Rng;
use serde_json::{Value, json};

pub use oracle::OraclePolicy;
pub use templates::{Spec, Template};

use apps::{APIS, APPS, Runtime};
use world::World;

/// The environment's name (tasks refer to it in [`Task::env`]).
pub const ENV_NAME: &str = "appworld";

/// Tool names.
pub mod tool {
    /// Lists the apps.
    pub const LIST_APPS: &str = "api_docs_list_apps";
    /// Lists the APIs of one app.
    pub const LIST_APIS: &str = "api_docs_list_apis";
    /// Shows one API's documentation and parameter schema.
    pub const SHOW_API: &str = "api_docs_show_api";
    /// Calls one API.
    pub const CALL_API: &str = "call_api";
    /// Finishes the task with an answer.
    pub const COMPLETE_TASK: &str = "complete_task";
}

/// How many tasks each split holds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct AppWorldConfig {
    /// Training tasks.
    pub train: usize,
    /// Validation tasks.
    pub validation: usize,
    /// Test tasks.
    pub test: usize,
    /// Mixed into every task seed, so a different value gives a different task set.
    pub base_seed: u64,
}

impl Default for AppWorldConfig {
    fn default() -> Self {
        AppWorldConfig {
            train: 300,
            validation: 102,
            test: 102,
            base_seed: 0x00A9_9C0D_E5EE_D001,
        }
    }
}

/// The app world environment. Stateless: every episode owns its own copy of the world.
#[derive(Debug, Clone, Default)]
pub struct AppWorld {
    config: AppWorldConfig,
}

fn mix(seed: u64) -> u64 {
    let mut z = seed.wrapping_add(0x9E37_79B9_7F4A_7C15);
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

impl AppWorld {
    /// The environment with the default split sizes (300 / 102 / 102).
    pub fn new() -> Self {
        Self::default()
    }

    /// The environment with other split sizes or another task seed.
    pub fn with_config(config: AppWorldConfig) -> Self {
        AppWorld { config }
    }

    /// The split sizes.
    pub fn config(&self) -> AppWorldConfig {
        self.config
    }

    /// The `index`-th task of `split`: templates cycle fastest, then the difficulty (1 to 3).
    pub fn task(&self, split: Split, index: usize) -> Task {
        let template = Template::ALL[index % Template::ALL.len()];
        let difficulty = ((index / Template::ALL.len()) % 3) as u8 + 1;
        let tag = match split {
            Split::Train => 1u64,
            Split::Validation => 2,
            Split::Test => 3,
        };
        let seed = mix(self.config.base_seed ^ (tag << 56) ^ index as u64);
        make_task(template, difficulty, split, index, seed)
    }
}

/// A task of `template` at `difficulty` generated from `seed` (ids look like
/// `appworld/train-007-mail_count-d2`).
pub fn make_task(
    template: Template,
    difficulty: u8,
    split: Split,
    index: usize,
    seed: u64,
) -> Task {
    let generated = templates::generate(template, difficulty, seed);
    let mut task = Task::new(
        format!(
            "{ENV_NAME}/{split}-{index:03}-{}-d{difficulty}",
            template.as_str()
        ),
        ENV_NAME,
        split,
        generated.instruction,
        seed,
    );
    task.metadata = json!({
        "template": template.as_str(),
        "difficulty": difficulty,
        "behaviour": template.behaviour(),
        "now": generated.world.now,
        "spec": generated.spec,
    });
    task
}

/// The template and difficulty a task's metadata names.
pub fn task_kind(task: &Task) -> Result<(Template, u8)> {
    let template = task
        .metadata
        .get("template")
        .and_then(Value::as_str)
        .and_then(Template::parse)
        .ok_or_else(|| {
            let names: Vec<&str> = Template::ALL.iter().map(|t| t.as_str()).collect();
            Error::invalid(
                format!("task `{}`: metadata.template", task.id),
                format!("expected one of: {}", names.join(", ")),
            )
        })?;
    let difficulty = task
        .metadata
        .get("difficulty")
        .and_then(Value::as_u64)
        .filter(|d| (1..=3).contains(d))
        .ok_or_else(|| {
            Error::invalid(
                format!("task `{}`: metadata.difficulty", task.id),
                "expected an integer from 1 to 3",
            )
        })? as u8;
    Ok((template, difficulty))
}

#[async_trait]
impl Environment for AppWorld {
    fn name(&self) -> &str {
        ENV_NAME
    }

    async fn reset(&self, task: &Task, seed: u64) -> Result<Box<dyn EnvSession>> {
        let (template, difficulty) = task_kind(task)?;
        // The world comes from the task's seed alone; the episode seed only draws login
        // tokens and reset codes.
        let generated = templates::generate(template, difficulty, task.seed);
        Ok(Box::new(AppSession {
            spec: generated.spec,
            difficulty,
            initial: generated.world.clone(),
            world: generated.world,
            runtime: Runtime {
                tokens: BTreeMap::new(),
                codes: BTreeMap::new(),
                rng: ChaCha8Rng::seed_from_u64(seed ^ task.seed.rotate_left(17)),
            },
            submitted: None,
            done: false,
        }))
    }

    fn tasks(&self, split: Split) -> Result<Vec<Task>> {
        let count = match split {
            Split::Train => self.config.train,
            Split::Validation => self.config.validation,
            Split::Test => self.config.test,
        };
        Ok((0..count).map(|i| self.task(split, i)).collect())
    }
}

/// One episode: the world, its initial snapshot and the submission.
struct AppSession {
    spec: Spec,
    difficulty: u8,
    initial: World,
    world: World,
    runtime: Runtime,
    submitted: Option<String>,
    done: bool,
}

fn object_schema(properties: Value, required: &[&str]) -> Value {
    json!({"type": "object", "properties": properties, "required": required})
}

/// The tools of every episode.
pub fn tool_specs() -> Vec<ToolSpec> {
    vec![
        ToolSpec::new(
            tool::LIST_APPS,
            "api_docs: list the apps you can use, with a line about each.",
            object_schema(json!({}), &[]),
        )
        .with_kind(ToolKind::Lookup),
        ToolSpec::new(
            tool::LIST_APIS,
            "api_docs: list the APIs of one app, with a line about each.",
            object_schema(json!({"app": {"type": "string", "description": "The app's name."}}), &["app"]),
        )
        .with_kind(ToolKind::Lookup),
        ToolSpec::new(
            tool::SHOW_API,
            "api_docs: show one API's description, parameters (a JSON schema) and result shape.",
            object_schema(
                json!({
                    "app": {"type": "string", "description": "The app's name."},
                    "api": {"type": "string", "description": "The API's name."}
                }),
                &["app", "api"],
            ),
        )
        .with_kind(ToolKind::Lookup),
        ToolSpec::new(
            tool::CALL_API,
            "Call one API of an app. The result is JSON, or an error message.",
            object_schema(
                json!({
                    "app": {"type": "string", "description": "The app's name, e.g. `mail`."},
                    "api": {"type": "string", "description": "The API's name, e.g. `list_emails`."},
                    "arguments": {"type": "object", "description": "The API's arguments as a JSON object."}
                }),
                &["app", "api"],
            ),
        ),
        ToolSpec::new(
            tool::COMPLETE_TASK,
            "supervisor.complete_task: finish the task. Put the answer in `answer` when the task asks for one. Ends the episode.",
            object_schema(
                json!({"answer": {"type": "string", "description": "The answer to the user's question."}}),
                &["answer"],
            ),
        )
        .with_kind(ToolKind::Submit),
    ]
}

fn string_arg<'a>(
    args: &'a serde_json::Map<String, Value>,
    name: &str,
) -> std::result::Result<&'a str, String> {
    match args.get(name) {
        Some(Value::String(s)) => Ok(s),
        Some(_) => Err(format!("`{name}` must be a string.")),
        None => Err(format!("missing the argument `{name}`.")),
    }
}

fn check_keys(
    args: &serde_json::Map<String, Value>,
    tool: &str,
    allowed: &[&str],
) -> std::result::Result<(), String> {
    match args.keys().find(|k| !allowed.contains(&k.as_str())) {
        Some(extra) => Err(format!(
            "`{tool}` has no argument `{}`; it takes: {}.",
            apps::truncate(extra, 60),
            if allowed.is_empty() {
                "nothing".to_string()
            } else {
                allowed.join(", ")
            }
        )),
        None => Ok(()),
    }
}

/// The answer as text: strings as given, numbers and lists written out.
fn answer_text(value: Option<&Value>) -> String {
    match value {
        None | Some(Value::Null) => String::new(),
        Some(Value::String(s)) => s.clone(),
        Some(Value::Array(items)) => items
            .iter()
            .map(|v| match v {
                Value::String(s) => s.clone(),
                other => other.to_string(),
            })
            .collect::<Vec<_>>()
            .join(", "),
        Some(other) => other.to_string(),
    }
}

impl AppSession {
    fn docs(
        &self,
        call: &ToolCall,
        args: &serde_json::Map<String, Value>,
    ) -> std::result::Result<Value, String> {
        match call.name.as_str() {
            tool::LIST_APPS => {
                check_keys(args, &call.name, &[])?;
                let mut apps: Vec<Value> = APPS
                    .iter()
                    .map(|(n, d)| json!({"app": n, "description": d}))
                    .collect();
                apps.insert(0, json!({"app": "api_docs", "description": "This documentation (the api_docs_* tools)."}));
                Ok(json!({"apps": apps}))
            }
            tool::LIST_APIS => {
                check_keys(args, &call.name, &["app"])?;
                let app = string_arg(args, "app")?.trim();
                if app == "api_docs" {
                    let list: Vec<Value> = tool_specs()
                        .into_iter()
                        .filter(|t| t.kind == ToolKind::Lookup)
                        .map(|t| json!({"api": t.name, "description": t.description, "note": "a tool of its own, not reached through call_api"}))
                        .collect();
                    return Ok(json!({"app": app, "apis": list}));
                }
                if !APPS.iter().any(|(n, _)| *n == app) {
                    let names: Vec<&str> = APPS.iter().map(|(n, _)| *n).collect();
                    return Err(format!(
                        "Unknown app `{}`. Apps: {}.",
                        apps::truncate(app, 60),
                        names.join(", ")
                    ));
                }
                let list: Vec<Value> = APIS
                    .iter()
                    .filter(|a| a.app == app)
                    .map(|a| json!({"api": a.name, "description": a.description}))
                    .collect();
                Ok(json!({"app": app, "apis": list}))
            }
            _ => {
                check_keys(args, &call.name, &["app", "api"])?;
                let app = string_arg(args, "app")?.trim();
                let api = string_arg(args, "api")?.trim();
                apps::find_api(app, api).map(|a| a.doc()).ok_or_else(|| {
                    format!(
                        "No API `{}` in app `{}`. Use `{}` to list an app's APIs.",
                        apps::truncate(api, 60),
                        apps::truncate(app, 60),
                        tool::LIST_APIS
                    )
                })
            }
        }
    }
}

#[async_trait]
impl EnvSession for AppSession {
    fn tools(&self) -> Vec<ToolSpec> {
        tool_specs()
    }

    fn initial_observation(&self) -> String {
        let user = self.world.user();
        format!(
            "You are acting for {} ({}). Today is {}, {}.",
            user.full_name(),
            user.email,
            self.world.now.weekday(),
            self.world.now
        )
    }

    async fn step(&mut self, call: &ToolCall) -> Result<Observation> {
        let mut observation = self.dispatch(call);
        // The policy sees only the text, so failures say so in words too.
        if observation.error && !observation.text.starts_with("Error") {
            observation.text = format!("Error: {}", observation.text);
        }
        Ok(observation)
    }

    async fn verify(&mut self, final_answer: Option<&str>) -> Result<Outcome> {
        let (ok, details) = templates::verify(
            &self.spec,
            self.difficulty,
            &self.initial,
            &self.world,
            self.submitted.as_deref(),
            final_answer,
        );
        Ok(if ok {
            Outcome::success(details)
        } else {
            Outcome::failure(details)
        })
    }
}

impl AppSession {
    fn dispatch(&mut self, call: &ToolCall) -> Observation {
        if self.done {
            return Observation::error(
                "The task was already completed; no more calls are accepted.",
            );
        }
        let parsed;
        let args = match &call.arguments {
            Value::Object(map) => map,
            Value::Null => {
                parsed = serde_json::Map::new();
                &parsed
            }
            _ => return Observation::error("Tool arguments must be a JSON object."),
        };
        match call.name.as_str() {
            tool::LIST_APPS | tool::LIST_APIS | tool::SHOW_API => match self.docs(call, args) {
                Ok(v) => Observation::ok(v.to_string()),
                Err(e) => Observation::error(e),
            },
            tool::CALL_API => {
                let checked = check_keys(args, &call.name, &["app", "api", "arguments"])
                    .and_then(|()| Ok((string_arg(args, "app")?, string_arg(args, "api")?)));
                match checked {
                    Err(e) => Observation::error(e),
                    Ok((app, api)) => {
                        let arguments = match args.get("arguments") {
                            // Some models send the arguments as a JSON string.
                            Some(Value::String(s)) => {
                                serde_json::from_str(s).unwrap_or(Value::String(s.clone()))
                            }
                            Some(v) => v.clone(),
                            None => Value::Null,
                        };
                        apps::call(
                            &mut self.world,
                            &mut self.runtime,
                            app.trim(),
                            api.trim(),
                            &arguments,
                        )
                    }
                }
            }
            tool::COMPLETE_TASK => match check_keys(args, &call.name, &["answer"]) {
                Err(e) => Observation::error(e),
                Ok(()) => {
                    let answer = answer_text(args.get("answer"));
                    if answer.chars().count() > apps::MAX_STRING_CHARS {
                        Observation::error(format!(
                            "`answer` must have at most {} characters.",
                            apps::MAX_STRING_CHARS
                        ))
                    } else {
                        self.submitted = Some(answer);
                        self.done = true;
                        Observation::ok("Task completed.").finished()
                    }
                }
            },
            other => Observation::error(format!(
                "Unknown tool `{}`. Tools: {}.",
                apps::truncate(other, 60),
                tool_specs()
                    .iter()
                    .map(|t| t.name.clone())
                    .collect::<Vec<_>>()
                    .join(", ")
            )),
        }
    }
}

/// The system prompt of [`base_harness`]; `{action_guidance}` is its one slot.
pub const BASE_SYSTEM_PROMPT: &str = "You are a capable assistant who carries out requests for one person by operating their apps: mail, music, payments, shopping, and a supervisor app that holds their profile and saved passwords. You can only act through tools.

Tools:
- api_docs_list_apps, api_docs_list_apis and api_docs_show_api read the documentation of the apps and of each API (parameters and results).
- call_api calls one API of an app: give the app, the API name, and its arguments as a JSON object.
- complete_task ends the task. When the request asks a question, put the answer in `answer`; the task is judged by the final state of the apps and by that answer.

How to act:
{action_guidance}

You can make at most {max_env_actions} tool calls and {max_model_calls} replies in this task.";

/// The base text of the `action_guidance` slot.
pub const BASE_ACTION_GUIDANCE: &str = "Make one tool call per reply and read its result before deciding the next step. Change only what the request asks you to change. When you are done, call complete_task.";

/// The base harness H0 of the app world: the system prompt above with an `action_guidance`
/// slot, no rules, skills, hooks or memory, and the paper's limits (32 model calls, 30
/// environment actions).
pub fn base_harness() -> Harness {
    let mut harness = Harness::new("H0", BASE_SYSTEM_PROMPT);
    harness.description =
        "AppWorld base harness: API documentation and call tools, no extra rules or hooks.".into();
    harness
        .prompt
        .slots
        .insert("action_guidance".into(), BASE_ACTION_GUIDANCE.into());
    harness.limits.max_model_calls = 32;
    harness.limits.max_env_actions = 30;
    harness
}

/// The built-in siblings of the app world: [`table7_siblings`] (every hook there can fire on
/// these tasks within the base limits).
pub fn siblings() -> Vec<Harness> {
    table7_siblings()
}

/// The three sibling edits of the paper's Table 7 applied to [`base_harness`], written in our
/// own words: S6 (an after-tool pagination reminder), S7 (an intersection rule in
/// `action_guidance`) and S8 (a low-budget reminder to reserve a step for `complete_task`).
pub fn table7_siblings() -> Vec<Harness> {
    let base = base_harness();
    let mut s6 = base.clone();
    s6.name = "S6-pagination".into();
    s6.description = "Reminds the policy to keep paginating after every listing page.".into();
    s6.hooks.insert(
        "pagination-completion-guidance".into(),
        HookSpec {
            action: HookAction::Warn,
            condition: "pagination_present".into(),
            event: HookEvent::AfterTool,
            message: "This result is one page of a longer listing. Keep requesting pages until one comes back empty or shorter than page_size; the first page is not the whole list.".into(),
            parameters: BTreeMap::new(),
        },
    );
    let mut s7 = base.clone();
    s7.name = "S7-intersection".into();
    s7.description = "Asks for the intersection of all conditions of a request.".into();
    s7.prompt_rules.insert(
        "reconcile-before-side-effect".into(),
        PromptRule {
            slot: "action_guidance".into(),
            text: "When a request combines several conditions, collect the records for each condition and keep only those that meet all of them; never widen a match to a whole containing collection.".into(),
        },
    );
    let mut s8 = base;
    s8.name = "S8-low-budget".into();
    s8.description = "Warns when few tool calls remain so complete_task is not missed.".into();
    s8.hooks.insert(
        "low-budget-completion".into(),
        HookSpec {
            action: HookAction::Warn,
            condition: "remaining_steps_lte".into(),
            event: HookEvent::AfterTool,
            message: "Only a few tool calls are left. Finish the checks you need and keep one call for complete_task; skip anything else.".into(),
            parameters: BTreeMap::from([("threshold".to_string(), json!(3))]),
        },
    );
    vec![s6, s7, s8]
}

// The README's examples compile and run as doctests.
#[cfg(doctest)]
#[doc = include_str!("../README.md")]
struct ReadmeDoctests;
