//! Harnesses as validated data.
//!
//! A [`Harness`] is everything around the model: the system prompt and its slots, named prompt
//! rules, skills, how history is rendered, memory, hooks, the tool view and execution limits.
//! It is plain serde data stored as JSON; unknown fields are rejected, and [`Harness::validate`]
//! checks every cross-reference. Its [`HarnessId`] is a content hash of the behaviour-defining
//! components, independent of key order and whitespace.

mod edit;
mod hooks;
pub mod mechanism;
mod template;
mod validate;
mod view;

use std::collections::BTreeMap;
use std::path::Path;

use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

use crate::error::{Error, Location, Result};

pub use edit::{EditOp, HarnessEdit};
pub use hooks::{CONDITIONS, CompiledHook, Condition, HookAction, HookEvent, HookSpec, HookState};
pub use template::{BUILTIN_PLACEHOLDERS, TemplateVars, render_template};

/// A harness's identity: the first 16 hex digits of the SHA-256 of its canonical content.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(transparent)]
pub struct HarnessId(pub String);

impl HarnessId {
    /// Digits in an id: the first 8 bytes of the SHA-256, in lower-case hex.
    pub const LEN: usize = 16;

    /// Whether this has an id's form (16 lower-case hex digits), which is what makes it safe
    /// to use as a file name (`harnesses/<id>.json`): no separator, no `..`.
    pub fn is_well_formed(&self) -> bool {
        self.0.len() == Self::LEN
            && self
                .0
                .bytes()
                .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b))
    }
}

impl std::fmt::Display for HarnessId {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

/// A complete harness configuration. Every component may be empty in a base harness.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Harness {
    /// A human name (`H0`, `S6-pagination`). Not part of the id.
    pub name: String,
    /// What the harness does differently, for people and routers. Not part of the id.
    #[serde(default)]
    pub description: String,
    /// The system and user templates and their slots.
    pub prompt: PromptSpec,
    /// Named rules appended to a slot of the system prompt.
    #[serde(default)]
    pub prompt_rules: BTreeMap<String, PromptRule>,
    /// Named procedures added to the system prompt, always or when their trigger matches.
    #[serde(default)]
    pub skills: BTreeMap<String, Skill>,
    /// How history is rendered into the context.
    #[serde(default)]
    pub context: ContextPolicy,
    /// The note store the harness keeps across steps.
    #[serde(default)]
    pub memory: MemoryPolicy,
    /// Named hooks that fire on loop events.
    #[serde(default)]
    pub hooks: BTreeMap<String, HookSpec>,
    /// Which tools are shown and how.
    #[serde(default)]
    pub tool_view: ToolView,
    /// Execution limits.
    #[serde(default)]
    pub limits: Limits,
    /// Where the harness came from. Not part of the id.
    #[serde(default)]
    pub lineage: Lineage,
    /// Set when the harness is an agent program (an *external* harness): the program acts in
    /// the episode instead of this crate's loop, and the environment runs it
    /// ([`crate::Environment::run_program`]). The prompt, hooks and tool view are then unused;
    /// `limits` still apply (the program's model calls, actions and tokens).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub program: Option<ProgramSpec>,
}

/// An agent program run once per episode: what an external harness is.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ProgramSpec {
    /// The program and its arguments.
    pub command: Vec<String>,
    /// Extra environment variables it gets.
    #[serde(default)]
    pub env: BTreeMap<String, String>,
    /// Wall-clock seconds before it is killed.
    pub timeout_s: f64,
}

/// The prompt templates. Placeholders are `{name}`; `{{` and `}}` are literal braces.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PromptSpec {
    /// The system message template. May use slots and the built-in placeholders.
    pub system: String,
    /// The first user message template.
    #[serde(default = "default_user_template")]
    pub user: String,
    /// Named slots and their base text; rules append to them.
    #[serde(default)]
    pub slots: BTreeMap<String, String>,
}

fn default_user_template() -> String {
    "{instruction}".to_string()
}

/// A rule appended to a slot (paper: `state.prompt_rules.<name> = {slot, text}`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PromptRule {
    /// The slot it extends.
    pub slot: String,
    /// The rule's text.
    pub text: String,
}

/// A named procedure inserted into the system prompt.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Skill {
    /// The procedure.
    pub text: String,
    /// A case-insensitive regular expression over the task instruction; `None` means always.
    /// Like every pattern in a harness, it must compile within 1 MiB (`validate` refuses more).
    #[serde(default)]
    pub trigger: Option<String>,
}

/// How history is rendered.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ContextPolicy {
    /// Keep only the last N environment observations verbatim; older ones are replaced by
    /// `elision_text`. `None` keeps all.
    #[serde(default)]
    pub keep_last_observations: Option<u32>,
    /// What replaces an elided observation.
    #[serde(default = "default_elision")]
    pub elision_text: String,
}

fn default_elision() -> String {
    "[earlier observation omitted]".to_string()
}

impl Default for ContextPolicy {
    fn default() -> Self {
        ContextPolicy {
            keep_last_observations: None,
            elision_text: default_elision(),
        }
    }
}

/// The harness's note store.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct MemoryPolicy {
    /// Whether the harness keeps notes at all.
    #[serde(default)]
    pub enabled: bool,
    /// Record one note per environment action (tool, arguments, start of the result).
    #[serde(default)]
    pub auto_notes: bool,
    /// Offer the policy a `note` tool that stores a note.
    #[serde(default)]
    pub note_tool: bool,
    /// Keep at most this many notes (oldest dropped first).
    #[serde(default = "default_max_notes")]
    pub max_notes: u32,
    /// Cut each note to this many characters.
    #[serde(default = "default_note_chars")]
    pub note_chars: u32,
}

fn default_max_notes() -> u32 {
    20
}

fn default_note_chars() -> u32 {
    200
}

impl Default for MemoryPolicy {
    fn default() -> Self {
        MemoryPolicy {
            enabled: false,
            auto_notes: false,
            note_tool: false,
            max_notes: default_max_notes(),
            note_chars: default_note_chars(),
        }
    }
}

/// The name of the memory tool offered when `memory.note_tool` is set.
pub const NOTE_TOOL: &str = "note";

/// Which tools the policy sees and how.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ToolView {
    /// Show only these tools (`None` shows all the environment offers).
    #[serde(default)]
    pub include: Option<Vec<String>>,
    /// Hide these tools.
    #[serde(default)]
    pub hide: Vec<String>,
    /// Extra documentation appended to a tool's description.
    #[serde(default)]
    pub docs: BTreeMap<String, String>,
    /// Cut every observation to this many characters.
    #[serde(default)]
    pub max_observation_chars: Option<u32>,
    /// The action format: `tool_call` (Qwen `<tool_call>` blocks) or one the environment defines.
    #[serde(default = "default_format")]
    pub format: String,
}

fn default_format() -> String {
    crate::action::TOOL_CALL_FORMAT.to_string()
}

impl Default for ToolView {
    fn default() -> Self {
        ToolView {
            include: None,
            hide: Vec::new(),
            docs: BTreeMap::new(),
            max_observation_chars: None,
            format: default_format(),
        }
    }
}

/// Execution limits (paper, Table 8: 32 model calls, 30 environment actions, 65,532 context
/// tokens, 8,192 output tokens per call).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Limits {
    /// Policy calls per episode.
    #[serde(default = "default_model_calls")]
    pub max_model_calls: u32,
    /// Environment actions per episode.
    #[serde(default = "default_env_actions")]
    pub max_env_actions: u32,
    /// Prompt tokens per call.
    #[serde(default = "default_context_tokens")]
    pub max_context_tokens: u32,
    /// Generated tokens per call.
    #[serde(default = "default_output_tokens")]
    pub max_output_tokens: u32,
}

fn default_model_calls() -> u32 {
    32
}
fn default_env_actions() -> u32 {
    30
}
fn default_context_tokens() -> u32 {
    65_532
}
fn default_output_tokens() -> u32 {
    8_192
}

impl Default for Limits {
    fn default() -> Self {
        Limits {
            max_model_calls: default_model_calls(),
            max_env_actions: default_env_actions(),
            max_context_tokens: default_context_tokens(),
            max_output_tokens: default_output_tokens(),
        }
    }
}

/// Where a harness came from.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Lineage {
    /// The parent's id (`None` for a base harness).
    #[serde(default)]
    pub parent: Option<HarnessId>,
    /// The evolution round that produced it (0 for a base harness).
    #[serde(default)]
    pub generation: u32,
    /// The repair direction it addresses.
    #[serde(default)]
    pub direction: Option<String>,
    /// The editor's notes and self-review.
    #[serde(default)]
    pub notes: Vec<String>,
    /// The root causes (failure-analysis labels) the edit targets.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub causes: Vec<String>,
    /// What local evaluation measured when the harness came from evolution.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub local_eval: Option<LocalEval>,
}

/// A candidate harness's local evaluation against its parent (paper appendix "Directional
/// Harness Evolution: Prompts and Settings": at most 30 tasks, at most 10 successful controls).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct LocalEval {
    /// Tasks run.
    pub tasks: usize,
    /// Of which the parent's targeted failures.
    pub targeted_failures: usize,
    /// Of which tasks the parent solved (controls).
    pub controls: usize,
    /// Task ids the parent failed and the candidate solved.
    pub repaired: Vec<String>,
    /// Task ids the parent solved and the candidate failed.
    pub regressed: Vec<String>,
    /// The candidate's success rate on the tasks run.
    pub success_rate: f64,
}

impl Harness {
    /// A harness with only a system prompt and default components.
    pub fn new(name: impl Into<String>, system: impl Into<String>) -> Self {
        Harness {
            name: name.into(),
            description: String::new(),
            prompt: PromptSpec {
                system: system.into(),
                user: default_user_template(),
                slots: BTreeMap::new(),
            },
            prompt_rules: BTreeMap::new(),
            skills: BTreeMap::new(),
            context: ContextPolicy::default(),
            memory: MemoryPolicy::default(),
            hooks: BTreeMap::new(),
            tool_view: ToolView::default(),
            limits: Limits::default(),
            lineage: Lineage::default(),
            program: None,
        }
    }

    /// Whether the harness is an agent program ([`Harness::program`]).
    pub fn is_external(&self) -> bool {
        self.program.is_some()
    }

    /// Parse a harness from JSON text. Errors name the JSON path and what was expected.
    pub fn from_json(text: &str) -> Result<Harness> {
        let deserializer = &mut serde_json::Deserializer::from_str(text);
        let harness: Harness = serde_path_to_error::deserialize(deserializer).map_err(|e| {
            let path = e.path().to_string();
            let path = if path == "." { String::new() } else { path };
            Error::Parse {
                location: Location::at(path),
                message: e.into_inner().to_string(),
            }
        })?;
        Ok(harness)
    }

    /// Parse and validate a JSON value.
    pub fn from_value(value: serde_json::Value) -> Result<Harness> {
        let harness: Harness = serde_path_to_error::deserialize(value).map_err(|e| {
            let path = e.path().to_string();
            let path = if path == "." { String::new() } else { path };
            Error::Parse {
                location: Location::at(path),
                message: e.into_inner().to_string(),
            }
        })?;
        Ok(harness)
    }

    /// Read, parse and validate a harness file; errors name the file.
    pub fn load(path: impl AsRef<Path>) -> Result<Harness> {
        let path = path.as_ref();
        let text = std::fs::read_to_string(path).map_err(|e| Error::io(path, e))?;
        let harness = Harness::from_json(&text).map_err(|e| e.in_file(path))?;
        harness.validate().map_err(|e| e.in_file(path))?;
        Ok(harness)
    }

    /// Write the harness as pretty JSON, atomically (temporary file, then rename).
    pub fn save(&self, path: impl AsRef<Path>) -> Result<()> {
        let path = path.as_ref();
        let text = self.to_json_pretty();
        crate::fsutil::write_atomic(path, text.as_bytes())
    }

    /// Pretty JSON with keys in a stable order.
    pub fn to_json_pretty(&self) -> String {
        let value = self.to_value();
        let mut text = serde_json::to_string_pretty(&sort_value(&value))
            .unwrap_or_else(|_| unreachable!("a JSON value always serialises"));
        text.push('\n');
        text
    }

    /// The harness as a JSON value.
    pub fn to_value(&self) -> serde_json::Value {
        serde_json::to_value(self).unwrap_or_else(|_| unreachable!("harness fields are plain data"))
    }

    /// The content hash of the behaviour-defining components (everything except `name`,
    /// `description` and `lineage`), independent of key order and whitespace.
    pub fn id(&self) -> HarnessId {
        let mut value = self.to_value();
        if let serde_json::Value::Object(map) = &mut value {
            map.remove("name");
            map.remove("description");
            map.remove("lineage");
        }
        let digest = Sha256::digest(canonical_json(&value).as_bytes());
        let hex: String = digest.iter().take(8).map(|b| format!("{b:02x}")).collect();
        HarnessId(hex)
    }
}

/// A JSON value's canonical text: object keys sorted, no whitespace.
pub fn canonical_json(value: &serde_json::Value) -> String {
    let mut out = String::new();
    write_canonical(value, &mut out);
    out
}

fn write_canonical(value: &serde_json::Value, out: &mut String) {
    match value {
        serde_json::Value::Object(map) => {
            let mut keys: Vec<&String> = map.keys().collect();
            keys.sort();
            out.push('{');
            for (i, key) in keys.into_iter().enumerate() {
                if i > 0 {
                    out.push(',');
                }
                out.push_str(&serde_json::Value::String(key.clone()).to_string());
                out.push(':');
                write_canonical(&map[key], out);
            }
            out.push('}');
        }
        serde_json::Value::Array(items) => {
            out.push('[');
            for (i, item) in items.iter().enumerate() {
                if i > 0 {
                    out.push(',');
                }
                write_canonical(item, out);
            }
            out.push(']');
        }
        other => out.push_str(&other.to_string()),
    }
}

/// A copy of `value` with object keys in sorted order (for stable pretty printing even when
/// serde_json keeps insertion order).
fn sort_value(value: &serde_json::Value) -> serde_json::Value {
    match value {
        serde_json::Value::Object(map) => {
            let mut entries: Vec<(&String, &serde_json::Value)> = map.iter().collect();
            entries.sort_by(|a, b| a.0.cmp(b.0));
            serde_json::Value::Object(
                entries
                    .into_iter()
                    .map(|(k, v)| (k.clone(), sort_value(v)))
                    .collect(),
            )
        }
        serde_json::Value::Array(items) => {
            serde_json::Value::Array(items.iter().map(sort_value).collect())
        }
        other => other.clone(),
    }
}
