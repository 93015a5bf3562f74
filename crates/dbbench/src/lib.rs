//! # DBBench on SQLite
//!
//! AgentBench's DBBench: the policy answers a question about one table (or changes the table as
//! asked) by running SQL, one statement per turn, and then commits its answer. Every episode
//! gets its own in-memory SQLite database holding the task's table with all columns TEXT.
//!
//! - Tasks come from a seeded [generator](generate) (the default: tables and questions of all
//!   eleven types with ground truth computed by running SQL, in train/validation/test splits),
//!   or from AgentBench's JSONL format through [`DbBench::from_jsonl`].
//! - Tools: `execute_sql{query}` (one statement; the observation is the rows printed as the
//!   MySQL connector's Python result, e.g. `[('Giza',)]`, or the error, cut to
//!   [`OBSERVATION_CHARS`] characters) and `commit_final_answer{answers}` (a submit tool that
//!   ends the episode). [`base_harness`] calls them in [`TOOL_FORMAT`]
//!   (`tool_view.format = "dbbench_tool_call"`): `<tool_call>` blocks as in the default format,
//!   but, as in AgentBench's function-calling DBBench, a turn without a tool call is answered
//!   with an error and the episode goes on. The classic text format (`Action: Operation` + a
//!   ```sql block, `Action: Answer` + `Final Answer: [...]`) is available as [`TEXT_FORMAT`]
//!   (`tool_view.format = "dbbench_text"`); see [`text_harness`].
//! - Only a committed answer is scored. In the tool formats that is a `commit_final_answer`
//!   call: an answer written in prose, or the right change made without a commit, scores 0, and
//!   so does an episode that reaches the round limit. Only a session whose harness uses the
//!   classic text format also reads a closing text as the answer (a `Final Answer: [...]` part,
//!   else the whole text), as AgentBench's text-format evaluation does.
//! - The verifier scores as AgentBench does: question answers are normalised and compared
//!   ([`answer`]: numbers within 1e-2, lists as sets); INSERT/UPDATE/DELETE tasks compare
//!   AgentBench's table hash (per row, `md5(concat_ws(',', cells))` cut to 5 hex digits; sorted,
//!   joined with `,`, and hashed with md5 again) with the task's `answer_md5`.
//!
//! ## MySQL on SQLite
//! DBBench's SQL is MySQL. The session translates each statement and sets the database up so
//! that the behaviours the data relies on carry over:
//! - string literals: backslash escapes (`'Don\'t'`, `\n`, `\\`), `''`, and double-quoted
//!   strings (`"text"`) as MySQL reads them; a double-quoted name of an existing table or column
//!   is taken as an identifier instead (what SQLite users mean);
//! - backticked identifiers, unquoted identifiers that start with a digit (`2nd_leg`), `#` and
//!   `--` comments, `<=>`, `&&`, `RLIKE`/`REGEXP`;
//! - text comparison (`=`, `<`, `ORDER BY`, `GROUP BY`, `DISTINCT`, `MIN`/`MAX`, `LIKE`) is
//!   case- and accent-insensitive through a collation on the task's columns and a MySQL-style
//!   `LIKE` (with `\` as its default escape);
//! - a column compared with a numeric literal (`Goal < 17`, `Year IN (2001, 2002)`,
//!   `x BETWEEN 1 AND 5`) is converted to a number first, with MySQL's rules (`'12abc'` is 12,
//!   `'abc'` is 0);
//! - `SHOW TABLES`, `DESCRIBE t`, `SHOW COLUMNS FROM t`, `SHOW CREATE TABLE t` and `USE db`
//!   are answered by the session; `LEFT`, `RIGHT`, `LOCATE`, `LCASE`, `UCASE`, `CHAR_LENGTH`
//!   and `MD5` exist as functions.
//!
//! What remains different from MySQL:
//! - only the patterns above are translated: a number compared with a computed text expression
//!   (`SUBSTR(x, 1, 4) > 1990`) compares as SQLite does (text sorts after numbers); string
//!   literals compared with each other (`'a' = 'A'`) and columns of tables the policy creates
//!   itself compare case-sensitively;
//! - accent folding covers the Latin letters of Latin-1 and Latin Extended-A, not the full
//!   Unicode collation algorithm; comparisons ignore no trailing spaces (MySQL 8's NO PAD);
//! - `||` is string concatenation (SQLite), not `OR`; MySQL-only syntax such as
//!   `ON DUPLICATE KEY UPDATE`, `STR_TO_DATE`, `DATE_FORMAT`, user variables and `LIMIT` inside
//!   `UPDATE`/`DELETE` is unsupported; SQLite accepts some SQL MySQL refuses (a single-quoted
//!   table name after `FROM`, `[name]` identifiers);
//! - error messages are SQLite's, and a change reports `Query OK, n rows affected` where
//!   AgentBench's MySQL printed `[]`; aggregates print as SQLite computes them (`SUM` over
//!   integer-looking TEXT prints `2011` where MySQL prints `2011.0`; the verifier compares
//!   numbers, so both are accepted);
//! - the table hash cuts the row-hash list at MySQL's default `group_concat_max_len` (1024
//!   bytes, reached at 171 rows), as AgentBench's MySQL would.
//!
//! ## Safety
//! `ATTACH`, virtual tables, extension loading, temporary tables, views, triggers and indexes
//! (`CREATE TEMP ...`, which would grow a second database beside the capped one) and every
//! `PRAGMA` except the read-only `table_info`-style ones are refused (authorizer,
//! `SQLITE_LIMIT_ATTACHED = 0`), each with an error observation saying what is disabled;
//! temporary storage stays in memory, so nothing touches files. Each statement runs under a
//! time limit and an instruction budget (progress handler), strings are capped at 1 MiB, the
//! database at 32 MiB and the rows read at 10,000; SQLite's hard heap limit (1 GiB by default,
//! process-wide since SQLite has no per-connection one) bounds what a sort or a materialised
//! subquery may hold. A statement that runs away (a recursive CTE, a sort of huge rows) is
//! stopped and reported as an error observation, and the session goes on. This is a guard
//! against accidents and runaway queries, not a hardened sandbox.

pub mod answer;
pub mod data;
pub mod db;
pub mod error;
pub mod generate;
pub mod labels;
pub mod oracle;
mod sql;
pub mod text_format;

use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use async_trait::async_trait;
use harness_core::{
    ActionParser, EnvSession, Environment, Harness, HookAction, HookEvent, HookSpec, Observation,
    Outcome, ParsedAction, Split, Task, ToolCall, ToolCallParser, ToolKind, ToolSpec, cut_text,
};
use harness_pool::sibling::{hook_spec as hook, one_hook_sibling};
use serde_json::{Value, json};

pub use answer::{answers_match, normalize, parse_answer_list};
pub use data::{DbTable, DbTask, QuestionType, load_jsonl, parse_jsonl};
pub use db::{Database, DbLimits};
pub use error::{Error, Result};
pub use generate::{GeneratorConfig, generate_tasks};
pub use oracle::{OraclePolicy, oracle_turns};
pub use text_format::{DbBenchTextParser, TEXT_FORMAT};

/// The action format of [`base_harness`]: `<tool_call>` blocks, where a turn without a tool
/// call is a failed round instead of the end of the episode (AgentBench's function-calling
/// DBBench answers such a turn with an error and goes on).
pub const TOOL_FORMAT: &str = "dbbench_tool_call";

/// The environment's name (tasks' `env`).
pub const ENV_NAME: &str = "dbbench";
/// The SQL tool.
pub const SQL_TOOL: &str = "execute_sql";
/// The submit tool.
pub const COMMIT_TOOL: &str = "commit_final_answer";
/// Rounds (policy turns, and so statements) per episode, as in AgentBench.
pub const MAX_ROUNDS: u32 = 15;
/// Observations are cut to this many characters, as in AgentBench.
pub const OBSERVATION_CHARS: usize = 800;

/// The DBBench environment: generated tasks, or tasks loaded from AgentBench JSONL.
#[derive(Debug, Clone)]
pub struct DbBench {
    tasks: Vec<Task>,
    limits: DbLimits,
}

impl Default for DbBench {
    fn default() -> Self {
        DbBench::new()
    }
}

impl DbBench {
    /// Generated tasks with the default [`GeneratorConfig`].
    pub fn new() -> Self {
        DbBench::generated(&GeneratorConfig::default())
    }

    /// Tasks generated from `config`'s seed.
    pub fn generated(config: &GeneratorConfig) -> Self {
        DbBench {
            tasks: generate_tasks(config),
            limits: DbLimits::default(),
        }
    }

    /// The tasks of an AgentBench DBBench JSONL file, all in `split`. Task ids are
    /// `dbbench/<file stem>-<line>`.
    pub fn from_jsonl(path: impl AsRef<Path>, split: Split) -> Result<Self> {
        let path = path.as_ref();
        let stem = path
            .file_stem()
            .map(|s| s.to_string_lossy().into_owned())
            .unwrap_or_else(|| "tasks".into());
        let tasks = load_jsonl(path)?;
        Ok(DbBench::from_tasks(&stem, split, tasks))
    }

    /// Wrap DBBench tasks (`prefix` names them: `dbbench/<prefix>-<index>`).
    pub fn from_tasks(prefix: &str, split: Split, tasks: Vec<DbTask>) -> Self {
        let tasks = tasks
            .into_iter()
            .enumerate()
            .map(|(i, t)| to_task(&format!("{ENV_NAME}/{prefix}-{i}"), split, i as u64, &t))
            .collect();
        DbBench {
            tasks,
            limits: DbLimits::default(),
        }
    }

    /// The same environment with other database limits.
    pub fn with_limits(mut self, limits: DbLimits) -> Self {
        self.limits = limits;
        self
    }

    /// Every task, all splits.
    pub fn all_tasks(&self) -> &[Task] {
        &self.tasks
    }
}

/// A harness task for a DBBench task.
pub fn to_task(id: &str, split: Split, seed: u64, task: &DbTask) -> Task {
    let mut instruction = task.question.trim().to_string();
    if !task.evidence.trim().is_empty() {
        instruction = format!("{instruction}\nEvidence: {}", task.evidence.trim());
    }
    let mut out = Task::new(id, ENV_NAME, split, instruction, seed);
    out.metadata = serde_json::to_value(task).unwrap_or(Value::Null);
    out
}

/// The DBBench task a harness task carries in its metadata.
pub fn db_task(task: &Task) -> Result<DbTask> {
    serde_json::from_value(task.metadata.clone()).map_err(|e| Error::Task {
        task: task.id.clone(),
        field: String::new(),
        message: format!("expected a DBBench task ({e})"),
    })
}

#[async_trait]
impl Environment for DbBench {
    fn name(&self) -> &str {
        ENV_NAME
    }

    async fn reset(&self, task: &Task, _seed: u64) -> harness_core::Result<Box<dyn EnvSession>> {
        Ok(Box::new(DbSession::new(task, self.limits)?))
    }

    fn tasks(&self, split: Split) -> harness_core::Result<Vec<Task>> {
        Ok(self
            .tasks
            .iter()
            .filter(|t| t.split == split)
            .cloned()
            .collect())
    }
}

/// The tools of every DBBench episode.
pub fn tool_specs() -> Vec<ToolSpec> {
    vec![
        ToolSpec::new(
            SQL_TOOL,
            "Run one SQL statement (MySQL dialect) on the database. Returns the result rows, e.g. [('a', 1), ('b', 2)], or the error message.",
            json!({
                "type": "object",
                "properties": {
                    "query": {"type": "string", "description": "Exactly one SQL statement."}
                },
                "required": ["query"]
            }),
        ),
        ToolSpec::new(
            COMMIT_TOOL,
            "Commit the final answer and end the episode. For a question, give every answer value as a string; for a task that changes the table, give an empty list after making the change.",
            json!({
                "type": "object",
                "properties": {
                    "answers": {
                        "type": "array",
                        "items": {"type": "string"},
                        "description": "The answer values, e.g. [\"Giza\"] or [\"3\", \"7\"]."
                    }
                },
                "required": ["answers"]
            }),
        )
        .with_kind(ToolKind::Submit),
    ]
}

/// One DBBench episode.
#[derive(Debug)]
pub struct DbSession {
    task_id: String,
    task: DbTask,
    db: Database,
    limits: DbLimits,
    committed: Option<Vec<String>>,
    /// Whether the episode runs in the classic text format (set when the loop asks for its
    /// parser). Only then is a closing text read as the answer.
    text_format: AtomicBool,
}

impl DbSession {
    /// A fresh database for `task`.
    pub fn new(task: &Task, limits: DbLimits) -> Result<DbSession> {
        let db_task = db_task(task)?;
        let db = Database::create(&db_task.tables, limits).map_err(|e| Error::Task {
            task: task.id.clone(),
            field: "tables".into(),
            message: format!("the tables cannot be created in SQLite: {e}"),
        })?;
        Ok(DbSession {
            task_id: task.id.clone(),
            task: db_task,
            db,
            limits,
            committed: None,
            text_format: AtomicBool::new(false),
        })
    }

    /// The episode's database (for tests and tools that inspect the end state).
    pub fn database(&self) -> &Database {
        &self.db
    }

    /// Run one statement as the `execute_sql` tool does.
    pub fn execute_sql(&self, query: &str) -> Observation {
        let outcome = self.db.execute(query);
        let text = cut_text(&outcome.text, OBSERVATION_CHARS);
        if outcome.error {
            Observation::error(text)
        } else {
            Observation::ok(text)
        }
    }

    fn expected_hash(&self) -> std::result::Result<String, String> {
        if let Some(hash) = &self.task.answer_md5 {
            return Ok(hash.clone());
        }
        let gold = self
            .task
            .gold_sql
            .as_deref()
            .ok_or("the task has neither answer_md5 nor gold SQL")?;
        let replay = Database::create(&self.task.tables, self.limits)
            .map_err(|e| format!("cannot create the gold database: {e}"))?;
        let outcome = replay.execute(gold);
        if outcome.error {
            return Err(format!("the gold SQL fails: {}", outcome.text));
        }
        replay.tables_hash(&self.task.tables)
    }

    fn judge(&self, answers: Option<Vec<String>>) -> harness_core::Result<Outcome> {
        let Some(answers) = answers else {
            return Ok(Outcome::failure(json!({
                "type": self.task.kind,
                "reason": "no answer was committed",
            })));
        };
        if self.task.is_modification() {
            let expected =
                self.expected_hash()
                    .map_err(|message| harness_core::Error::Environment {
                        env: ENV_NAME.into(),
                        message: format!("task `{}`: {message}", self.task_id),
                    })?;
            let details = |actual: &str| json!({"type": self.task.kind, "expected_hash": expected, "table_hash": actual});
            return Ok(match self.db.tables_hash(&self.task.tables) {
                Ok(actual) if actual == expected => Outcome::success(details(&actual)),
                Ok(actual) => Outcome::failure(details(&actual)),
                Err(reason) => Outcome::failure(json!({
                    "type": self.task.kind,
                    "expected_hash": expected,
                    "reason": reason,
                })),
            });
        }
        let details = json!({
            "type": self.task.kind,
            "answers": answers,
            "label": self.task.label,
        });
        Ok(if answers_match(&answers, &self.task.label) {
            Outcome::success(details)
        } else {
            Outcome::failure(details)
        })
    }
}

/// The answers of a `commit_final_answer` call, or why its arguments are unusable.
fn committed_answers(arguments: &Value) -> std::result::Result<Vec<String>, String> {
    let expected = "expected {\"answers\": [\"...\", ...]}";
    let Some(object) = arguments.as_object() else {
        return Err(format!("the arguments must be a JSON object; {expected}"));
    };
    // AgentBench reads the first argument whatever its name; we ask for `answers` but also
    // accept a single other argument.
    let value = object.get("answers").or_else(|| {
        (object.len() == 1)
            .then(|| object.values().next())
            .flatten()
    });
    match value {
        None => Err(format!("missing `answers`; {expected}")),
        Some(Value::Array(items)) => items
            .iter()
            .map(|item| match item {
                Value::Array(_) | Value::Object(_) => Err(format!(
                    "each answer must be a string or a number; {expected}"
                )),
                scalar => Ok(data::python_text(scalar)),
            })
            .collect(),
        Some(Value::String(text)) => Ok(parse_answer_list(text)),
        Some(scalar @ (Value::Number(_) | Value::Bool(_) | Value::Null)) => {
            Ok(vec![data::python_text(scalar)])
        }
        Some(Value::Object(_)) => Err(format!("`answers` must be a list; {expected}")),
    }
}

/// The answers in a closing text: a `Final Answer: [...]` part if there is one, else the text.
fn answers_from_text(text: &str) -> Vec<String> {
    match DbBenchTextParser.parse(text, &[]) {
        harness_core::ParsedAction::Calls(calls)
            if calls.len() == 1 && calls[0].name == COMMIT_TOOL =>
        {
            committed_answers(&calls[0].arguments).unwrap_or_default()
        }
        _ => parse_answer_list(text),
    }
}

#[async_trait]
impl EnvSession for DbSession {
    fn tools(&self) -> Vec<ToolSpec> {
        tool_specs()
    }

    async fn step(&mut self, call: &ToolCall) -> harness_core::Result<Observation> {
        if self.committed.is_some() {
            return Ok(Observation::error(
                "The episode is over: the final answer was already committed.",
            ));
        }
        Ok(match call.name.as_str() {
            SQL_TOOL => match call.arguments.get("query") {
                Some(Value::String(query)) => self.execute_sql(query),
                Some(_) => Observation::error(
                    "`query` must be a string holding one SQL statement; expected {\"query\": \"SELECT ...\"}",
                ),
                None => Observation::error(
                    "missing `query`; expected {\"query\": \"SELECT ...\"} with one SQL statement",
                ),
            },
            COMMIT_TOOL => match committed_answers(&call.arguments) {
                Ok(answers) => {
                    self.committed = Some(answers);
                    Observation::ok("Your final answer has been committed.").finished()
                }
                Err(reason) => Observation::error(reason),
            },
            other => Observation::error(format!(
                "There is no tool named `{other}`. Available tools: {SQL_TOOL}, {COMMIT_TOOL}."
            )),
        })
    }

    async fn verify(&mut self, final_answer: Option<&str>) -> harness_core::Result<Outcome> {
        // In the tool formats a closing text is not an answer: reading one would reward prose
        // answers, and a right change followed by "Done.", that were never committed.
        let text_answer = || {
            final_answer
                .filter(|_| self.text_format.load(Ordering::Relaxed))
                .map(answers_from_text)
        };
        let answers = self.committed.clone().or_else(text_answer);
        self.judge(answers)
    }

    fn initial_observation(&self) -> String {
        let mut text = self.task.describe_tables();
        text.push_str(" All columns are TEXT.");
        text
    }

    fn action_parser(&self, format: &str) -> Option<Arc<dyn ActionParser>> {
        match format {
            TEXT_FORMAT => {
                self.text_format.store(true, Ordering::Relaxed);
                Some(Arc::new(DbBenchTextParser))
            }
            TOOL_FORMAT => Some(Arc::new(DbBenchToolParser)),
            _ => None,
        }
    }
}

/// The parser of [`TOOL_FORMAT`]: the `<tool_call>` format, with a turn without a tool call
/// read as invalid (a failed round) instead of as a final answer.
#[derive(Debug, Clone, Copy, Default)]
pub struct DbBenchToolParser;

impl ActionParser for DbBenchToolParser {
    fn format(&self) -> &str {
        TOOL_FORMAT
    }

    fn parse(&self, text: &str, tools: &[ToolSpec]) -> ParsedAction {
        match ToolCallParser.parse(text, tools) {
            ParsedAction::Final(_) => ParsedAction::Invalid(format!(
                "it has no tool call. Every turn must call a tool: `{SQL_TOOL}` to run SQL, or `{COMMIT_TOOL}` to commit the final answer (the answer counts only when committed). Call a tool with <tool_call>{{\"name\": ..., \"arguments\": {{...}}}}</tool_call>"
            )),
            other => other,
        }
    }
}

const SYSTEM_PROMPT: &str = "You are working with a MySQL database to help a user with a question about one of its tables, or to change that table as the user asks.

Work step by step. Look at the table when you need to (its name and columns are given), run SQL to find what you need, and read each result carefully before the next step. {action_guidance}

Rules:
- Run exactly one SQL statement per step, written on one line. Quote table and column names that contain spaces or symbols with backticks, e.g. `Home team`.
- Every column is TEXT: compare numbers with numbers (e.g. `Points` > 10) and text with quoted strings.
- You have at most {max_env_actions} steps, so do not waste them.
- When the question asks for values, commit exactly the values asked for (one string per value, no extra words); when the task is to insert, update or delete rows, make the change and then commit an empty answer.
- Commit only once, when you are sure.";

/// The base harness H0 for DBBench in the `<tool_call>` format ([`TOOL_FORMAT`]: a turn
/// without a tool call is a failed round), with AgentBench's limit of [`MAX_ROUNDS`] rounds.
pub fn base_harness() -> Harness {
    let mut harness = Harness::new("dbbench-H0", SYSTEM_PROMPT);
    harness.description =
        "Base harness for DBBench: SQL through execute_sql, answers through commit_final_answer."
            .into();
    harness.tool_view.format = TOOL_FORMAT.into();
    harness.prompt.slots.insert(
        "action_guidance".into(),
        format!(
            "Call `{SQL_TOOL}` to run SQL and `{COMMIT_TOOL}` to give your final answer. Every reply must call one of them: an answer counts only when it is committed."
        ),
    );
    harness.limits.max_model_calls = MAX_ROUNDS;
    harness.limits.max_env_actions = MAX_ROUNDS;
    harness
}

/// The base harness in the classic text format ([`TEXT_FORMAT`]).
pub fn text_harness() -> Harness {
    let mut harness = base_harness();
    harness.name = "dbbench-H0-text".into();
    harness.description =
        "Base harness for DBBench in the classic Action: Operation / Action: Answer text format."
            .into();
    harness.tool_view.format = TEXT_FORMAT.into();
    harness.prompt.slots.insert(
        "action_guidance".into(),
        "To run SQL, end your message with\nAction: Operation\n```sql\nSELECT ...;\n```\nTo finish, end your message with\nAction: Answer\nFinal Answer: [\"value 1\", \"value 2\"]\n(for a change to the table: Final Answer: [])."
            .into(),
    );
    harness
}

/// Built-in siblings of [`base_harness`], each with hooks that can fire on DBBench (whose
/// observations are never paginated) within its [`MAX_ROUNDS`] rounds:
/// - `dbbench-sql-error-recovery`: after a failed step (a statement or a reply without a tool
///   call), how to recover;
/// - `dbbench-low-budget`: with three statements left, commit the best answer;
/// - `dbbench-commit-after-change`: after an INSERT/UPDATE/DELETE, commit an empty answer.
pub fn siblings() -> Vec<Harness> {
    let base = base_harness();
    let sibling = |name: &str, description: &str, hook: &str, spec: HookSpec| {
        one_hook_sibling(&base, name, description, hook, spec)
    };
    vec![
        sibling(
            "dbbench-sql-error-recovery",
            "Explains how to recover from a failed SQL statement.",
            "sql-error-recovery",
            hook(
                HookAction::Warn,
                HookEvent::OnError,
                "tool_error",
                json!({}),
                "The last step failed; read the error. A reply needs a tool call (execute_sql or commit_final_answer). For a failed statement: quote table and column names that contain spaces with backticks, use the column names given in the table description, and compare numbers with numbers, then run a corrected statement.",
            ),
        ),
        sibling(
            "dbbench-low-budget",
            "Warns when few statements remain so that an answer is still committed.",
            "low-budget-commit",
            hook(
                HookAction::Warn,
                HookEvent::AfterTool,
                "remaining_steps_lte",
                json!({"threshold": 3}),
                "Only a few steps are left. Commit your best answer now with commit_final_answer; an answer that is never committed scores nothing.",
            ),
        ),
        sibling(
            "dbbench-commit-after-change",
            "Reminds the policy to commit after changing the table.",
            "commit-after-change",
            hook(
                HookAction::Warn,
                HookEvent::AfterTool,
                "observation_matches",
                json!({"pattern": "^Query OK, \\d+ rows? affected"}),
                "The change is made. If it is the change the task asks for, commit an empty answer now with commit_final_answer and [] as the answers.",
            ),
        ),
    ]
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn siblings_validate_and_differ_from_h0() {
        let h0 = base_harness();
        for sibling in siblings() {
            sibling.validate().unwrap();
            sibling.validate_for_tools(&tool_specs()).unwrap();
            sibling.compile_hooks().unwrap();
            assert_ne!(sibling.id(), h0.id(), "{}", sibling.name);
        }
    }

    #[test]
    fn base_harnesses_validate() {
        for harness in [base_harness(), text_harness()] {
            harness.validate().unwrap();
            assert_eq!(harness.limits.max_model_calls, MAX_ROUNDS);
            harness.validate_for_tools(&tool_specs()).unwrap();
        }
    }

    #[test]
    fn commit_arguments() {
        assert_eq!(
            committed_answers(&json!({"answers": ["a", 1, 2.5, null]})).unwrap(),
            vec!["a", "1", "2.5", "None"]
        );
        assert_eq!(
            committed_answers(&json!({"answer": "[\"x\", \"y\"]"})).unwrap(),
            vec!["x", "y"]
        );
        assert!(committed_answers(&json!(42)).is_err());
        assert!(committed_answers(&json!({"answers": [[1]]})).is_err());
        assert!(committed_answers(&json!({})).is_err());
    }
}

// The README's examples compile and run as doctests.
#[cfg(doctest)]
#[doc = include_str!("../README.md")]
struct ReadmeDoctests;
