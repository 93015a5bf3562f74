//! DBBench tasks and AgentBench's JSONL format.

use std::path::Path;

use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::error::{Error, Result};

/// One table of a task: a name, column names (every column is TEXT) and rows of cell texts.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct DbTable {
    /// The table's name.
    pub name: String,
    /// Column names, in order.
    pub columns: Vec<String>,
    /// Rows; each has one cell per column.
    pub rows: Vec<Vec<String>>,
}

/// The kinds of DBBench questions (AgentBench's `type` field).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum QuestionType {
    /// Insert rows; scored by the table hash.
    Insert,
    /// Update rows; scored by the table hash.
    Update,
    /// Delete rows; scored by the table hash.
    Delete,
    /// Look up a value.
    Other,
    /// Count rows.
    Counting,
    /// Filter with comparisons.
    Comparison,
    /// Order and pick the top or bottom.
    Ranking,
    /// A sum.
    AggregationSum,
    /// A minimum.
    AggregationMin,
    /// A maximum.
    AggregationMax,
    /// An average.
    AggregationAvg,
}

impl QuestionType {
    /// Every type, in the order reports list them.
    pub const ALL: [QuestionType; 11] = [
        QuestionType::Insert,
        QuestionType::Update,
        QuestionType::Delete,
        QuestionType::Other,
        QuestionType::Counting,
        QuestionType::Comparison,
        QuestionType::Ranking,
        QuestionType::AggregationSum,
        QuestionType::AggregationMin,
        QuestionType::AggregationMax,
        QuestionType::AggregationAvg,
    ];

    /// The name AgentBench's data uses.
    pub fn as_str(self) -> &'static str {
        match self {
            QuestionType::Insert => "INSERT",
            QuestionType::Update => "UPDATE",
            QuestionType::Delete => "DELETE",
            QuestionType::Other => "other",
            QuestionType::Counting => "counting",
            QuestionType::Comparison => "comparison",
            QuestionType::Ranking => "ranking",
            QuestionType::AggregationSum => "aggregation-SUM",
            QuestionType::AggregationMin => "aggregation-MIN",
            QuestionType::AggregationMax => "aggregation-MAX",
            QuestionType::AggregationAvg => "aggregation-AVG",
        }
    }

    /// The type named `name`, if it is one of AgentBench's.
    pub fn parse(name: &str) -> Option<QuestionType> {
        QuestionType::ALL.into_iter().find(|t| t.as_str() == name)
    }

    /// Whether the task changes the table (scored by hash) rather than asks a question.
    pub fn is_modification(self) -> bool {
        matches!(
            self,
            QuestionType::Insert | QuestionType::Update | QuestionType::Delete
        )
    }
}

/// Whether a type name (possibly one this crate does not know) is a modification task. Like
/// AgentBench, every type other than INSERT, UPDATE and DELETE is scored as a question.
pub fn is_modification_type(name: &str) -> bool {
    QuestionType::parse(name).is_some_and(QuestionType::is_modification)
}

/// A DBBench task: the question, the tables and the ground truth. Stored as a task's metadata.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct DbTask {
    /// The question or instruction (`description`).
    pub question: String,
    /// The sentence naming the table and its columns (`add_description`).
    #[serde(default)]
    pub table_info: String,
    /// Extra evidence shown with the question (`evidence`, used by some AgentBench splits).
    #[serde(default)]
    pub evidence: String,
    /// The question type as the data names it (`type[0]`).
    pub kind: String,
    /// The tables the episode's database starts with.
    pub tables: Vec<DbTable>,
    /// Question tasks: the accepted answers (`label`).
    #[serde(default)]
    pub label: Vec<String>,
    /// Modification tasks: the expected table hash (from `answer_md5`); when absent the
    /// verifier replays `gold_sql` to compute it.
    #[serde(default)]
    pub answer_md5: Option<String>,
    /// SQL that solves the task (modification tasks: `label[0]`; generated tasks: always).
    #[serde(default)]
    pub gold_sql: Option<String>,
}

impl DbTask {
    /// Whether the task is scored by the table hash.
    pub fn is_modification(&self) -> bool {
        is_modification_type(&self.kind)
    }

    /// The table information shown at the start of an episode.
    pub fn describe_tables(&self) -> String {
        if !self.table_info.trim().is_empty() {
            return self.table_info.trim().to_string();
        }
        let parts: Vec<String> = self
            .tables
            .iter()
            .map(|t| {
                format!(
                    "The name of this table is {}, and the headers of this table are {}.",
                    t.name,
                    t.columns.join(",")
                )
            })
            .collect();
        parts.join(" ")
    }
}

/// Python's `str()` of a JSON scalar, which is how AgentBench turns cells and labels into text
/// (`1.0` stays `1.0`, `null` becomes `None`, `true` becomes `True`).
pub fn python_text(value: &Value) -> String {
    match value {
        Value::Null => "None".into(),
        Value::Bool(true) => "True".into(),
        Value::Bool(false) => "False".into(),
        Value::Number(n) => match (n.as_i64(), n.as_u64(), n.as_f64()) {
            (Some(i), _, _) => i.to_string(),
            (None, Some(u), _) => u.to_string(),
            (_, _, Some(f)) => super::db::python_float(f),
            _ => n.to_string(),
        },
        Value::String(s) => s.clone(),
        other => other.to_string(),
    }
}

/// Extracts the hash from AgentBench's `answer_md5` (`"[('<hex>',)]"`, or the bare hex).
pub fn parse_answer_md5(text: &str) -> Option<String> {
    let cleaned = text
        .trim()
        .trim_start_matches('[')
        .trim_end_matches(']')
        .trim()
        .trim_start_matches('(')
        .trim_end_matches(')');
    let first = cleaned.split(',').next()?.trim().trim_matches(['\'', '"']);
    (!first.is_empty()).then(|| first.to_string())
}

struct Record<'a> {
    path: &'a Path,
    line: usize,
}

impl Record<'_> {
    fn error(&self, field: &str, message: impl Into<String>) -> Error {
        Error::Data {
            path: self.path.to_path_buf(),
            line: self.line,
            field: field.to_string(),
            message: message.into(),
        }
    }

    fn string(&self, object: &Value, field: &str, path: &str) -> Result<String> {
        match object.get(field) {
            Some(Value::String(s)) => Ok(s.clone()),
            Some(other) => {
                Err(self.error(path, format!("expected a string, found {}", kind_of(other))))
            }
            None => Err(self.error(path, "missing; expected a string")),
        }
    }

    fn optional_string(&self, object: &Value, field: &str) -> Result<String> {
        match object.get(field) {
            None | Some(Value::Null) => Ok(String::new()),
            Some(Value::String(s)) => Ok(s.clone()),
            Some(other) => Err(self.error(
                field,
                format!("expected a string, found {}", kind_of(other)),
            )),
        }
    }

    fn table(&self, value: &Value, path: &str) -> Result<DbTable> {
        if !value.is_object() {
            return Err(self.error(
                path,
                format!(
                    "expected an object with `table_name` and `table_info`, found {}",
                    kind_of(value)
                ),
            ));
        }
        let name = self.string(value, "table_name", &format!("{path}.table_name"))?;
        if name.is_empty() {
            return Err(self.error(
                &format!("{path}.table_name"),
                "expected a non-empty table name",
            ));
        }
        let info_path = format!("{path}.table_info");
        let info = value
            .get("table_info")
            .filter(|v| v.is_object())
            .ok_or_else(|| {
                self.error(
                    &info_path,
                    "missing or not an object; expected `{columns, rows}`",
                )
            })?;
        let columns_path = format!("{info_path}.columns");
        let Some(Value::Array(raw_columns)) = info.get("columns") else {
            return Err(self.error(
                &columns_path,
                "missing or not an array; expected [{name, type}, ...]",
            ));
        };
        if raw_columns.is_empty() {
            return Err(self.error(&columns_path, "expected at least one column"));
        }
        let mut columns: Vec<String> = Vec::with_capacity(raw_columns.len());
        for (i, column) in raw_columns.iter().enumerate() {
            let column_path = format!("{columns_path}[{i}]");
            // Columns are objects with a `name`; a bare string is accepted as the name.
            let name = match column {
                Value::String(s) => s.clone(),
                Value::Object(_) => self.string(column, "name", &format!("{column_path}.name"))?,
                other => {
                    return Err(self.error(
                        &column_path,
                        format!("expected an object with `name`, found {}", kind_of(other)),
                    ));
                }
            };
            // MySQL would refuse duplicate column names; keep the task usable by renaming.
            let mut unique = name.clone();
            let mut n = 2;
            while columns.iter().any(|c| c.eq_ignore_ascii_case(&unique)) {
                unique = format!("{name}_{n}");
                n += 1;
            }
            columns.push(unique);
        }
        let rows_path = format!("{info_path}.rows");
        let raw_rows = match info.get("rows") {
            None | Some(Value::Null) => Vec::new(),
            Some(Value::Array(rows)) => rows.clone(),
            Some(other) => {
                return Err(self.error(
                    &rows_path,
                    format!("expected an array of rows, found {}", kind_of(other)),
                ));
            }
        };
        let mut rows = Vec::with_capacity(raw_rows.len());
        for (i, row) in raw_rows.iter().enumerate() {
            let row_path = format!("{rows_path}[{i}]");
            let Value::Array(cells) = row else {
                return Err(self.error(
                    &row_path,
                    format!("expected an array of cells, found {}", kind_of(row)),
                ));
            };
            if cells.len() != columns.len() {
                return Err(self.error(
                    &row_path,
                    format!(
                        "expected {} cells (one per column), found {}",
                        columns.len(),
                        cells.len()
                    ),
                ));
            }
            let mut texts = Vec::with_capacity(cells.len());
            for (j, cell) in cells.iter().enumerate() {
                if cell.is_array() || cell.is_object() {
                    return Err(self.error(
                        &format!("{row_path}[{j}]"),
                        format!("expected a string, number or null, found {}", kind_of(cell)),
                    ));
                }
                texts.push(python_text(cell));
            }
            rows.push(texts);
        }
        Ok(DbTable {
            name,
            columns,
            rows,
        })
    }

    fn task(&self, value: &Value) -> Result<DbTask> {
        if !value.is_object() {
            return Err(self.error(
                "",
                format!("expected a JSON object, found {}", kind_of(value)),
            ));
        }
        let question = self.string(value, "description", "description")?;
        let kind = match value.get("type") {
            Some(Value::String(s)) => s.clone(),
            Some(Value::Array(items)) => match items.first() {
                Some(Value::String(s)) => s.clone(),
                _ => {
                    return Err(self.error(
                        "type",
                        "expected a non-empty list whose first item is a type name",
                    ));
                }
            },
            Some(other) => {
                return Err(self.error(
                    "type",
                    format!(
                        "expected a list like [\"INSERT\"], found {}",
                        kind_of(other)
                    ),
                ));
            }
            None => {
                return Err(self.error(
                    "type",
                    "missing; expected a list like [\"counting\"] or [\"UPDATE\"]",
                ));
            }
        };
        let tables = match value.get("table") {
            Some(table @ Value::Object(_)) => vec![self.table(table, "table")?],
            Some(Value::Array(tables)) if !tables.is_empty() => tables
                .iter()
                .enumerate()
                .map(|(i, t)| self.table(t, &format!("table[{i}]")))
                .collect::<Result<Vec<_>>>()?,
            Some(other) => {
                return Err(self.error(
                    "table",
                    format!(
                        "expected a table object or a non-empty list of them, found {}",
                        kind_of(other)
                    ),
                ));
            }
            None => return Err(self.error("table", "missing; expected a table object")),
        };
        for (i, table) in tables.iter().enumerate() {
            if tables[..i]
                .iter()
                .any(|t| t.name.eq_ignore_ascii_case(&table.name))
            {
                return Err(self.error(
                    &format!("table[{i}].table_name"),
                    format!("table `{}` appears twice", table.name),
                ));
            }
        }
        let label: Vec<String> = match value.get("label") {
            None | Some(Value::Null) => Vec::new(),
            Some(Value::Array(items)) => {
                for (i, item) in items.iter().enumerate() {
                    if item.is_array() || item.is_object() {
                        return Err(self.error(
                            &format!("label[{i}]"),
                            format!("expected a string, number or null, found {}", kind_of(item)),
                        ));
                    }
                }
                items.iter().map(python_text).collect()
            }
            Some(scalar @ (Value::String(_) | Value::Number(_))) => vec![python_text(scalar)],
            Some(other) => {
                return Err(self.error(
                    "label",
                    format!("expected a list of answers, found {}", kind_of(other)),
                ));
            }
        };
        let modification = is_modification_type(&kind);
        let answer_md5 =
            match value.get("answer_md5") {
                None | Some(Value::Null) => None,
                Some(Value::String(s)) if s.trim().is_empty() => None,
                Some(Value::String(s)) => Some(parse_answer_md5(s).ok_or_else(|| {
                    self.error("answer_md5", "expected \"[('<32 hex digits>',)]\"")
                })?),
                Some(other) => {
                    return Err(self.error(
                        "answer_md5",
                        format!("expected a string, found {}", kind_of(other)),
                    ));
                }
            };
        let sql_query = value
            .get("sql")
            .and_then(|s| s.get("query"))
            .and_then(Value::as_str)
            .map(str::to_string);
        let gold_sql = if modification {
            label.first().cloned().or(sql_query)
        } else {
            None
        };
        if modification && answer_md5.is_none() && gold_sql.is_none() {
            return Err(self.error(
                "answer_md5",
                format!(
                    "a {kind} task needs `answer_md5`, or gold SQL in `label[0]` to compute it"
                ),
            ));
        }
        if !modification && value.get("label").is_none() {
            return Err(self.error(
                "label",
                "missing; a question task needs a list of accepted answers",
            ));
        }
        Ok(DbTask {
            question,
            table_info: self.optional_string(value, "add_description")?,
            evidence: self.optional_string(value, "evidence")?,
            kind,
            tables,
            label: if modification { Vec::new() } else { label },
            answer_md5,
            gold_sql,
        })
    }
}

fn kind_of(value: &Value) -> &'static str {
    match value {
        Value::Null => "null",
        Value::Bool(_) => "a boolean",
        Value::Number(_) => "a number",
        Value::String(_) => "a string",
        Value::Array(_) => "a list",
        Value::Object(_) => "an object",
    }
}

/// Parse AgentBench DBBench JSONL text (one task object per line; blank lines are skipped).
/// `path` only names the source in errors.
pub fn parse_jsonl(text: &str, path: &Path) -> Result<Vec<DbTask>> {
    let mut tasks = Vec::new();
    for (index, line) in text.lines().enumerate() {
        if line.trim().is_empty() {
            continue;
        }
        let record = Record {
            path,
            line: index + 1,
        };
        let value: Value = serde_json::from_str(line).map_err(|e| {
            record.error(
                "",
                format!("not valid JSON ({e}); expected one task object per line"),
            )
        })?;
        tasks.push(record.task(&value)?);
    }
    Ok(tasks)
}

/// Read an AgentBench DBBench JSONL file.
pub fn load_jsonl(path: impl AsRef<Path>) -> Result<Vec<DbTask>> {
    let path = path.as_ref();
    let text = std::fs::read_to_string(path).map_err(|source| Error::Io {
        path: path.to_path_buf(),
        source,
    })?;
    parse_jsonl(&text, path)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(line: &str) -> Result<Vec<DbTask>> {
        parse_jsonl(line, Path::new("tasks.jsonl"))
    }

    const TABLE: &str = r#"{"table_name": "T", "table_info": {"columns": [{"name": "a", "type": "TEXT"}, {"name": "b", "type": "INT"}], "rows": [["x", 1], ["y", null]]}}"#;

    #[test]
    fn parses_a_question_and_a_modification() {
        let text = format!(
            "{{\"description\": \"q\", \"label\": [\"1.0\", 2], \"type\": [\"counting\"], \"table\": {TABLE}}}\n\n{{\"description\": \"u\", \"label\": [\"UPDATE T SET a = 'z'\"], \"type\": [\"UPDATE\"], \"answer_md5\": \"[('0123456789abcdef0123456789abcdef',)]\", \"table\": {TABLE}}}"
        );
        let tasks = parse(&text).unwrap();
        assert_eq!(tasks.len(), 2);
        assert_eq!(tasks[0].label, vec!["1.0", "2"]);
        assert_eq!(tasks[0].tables[0].rows[1], vec!["y", "None"]);
        assert!(!tasks[0].is_modification());
        assert!(tasks[1].is_modification());
        assert_eq!(
            tasks[1].answer_md5.as_deref(),
            Some("0123456789abcdef0123456789abcdef")
        );
        assert_eq!(tasks[1].gold_sql.as_deref(), Some("UPDATE T SET a = 'z'"));
    }

    #[test]
    fn errors_name_line_and_field() {
        let bad_row = TABLE.replace("[\"y\", null]", "[\"y\"]");
        let text = format!(
            "{{\"description\": \"q\", \"label\": [], \"type\": [\"other\"], \"table\": {TABLE}}}\n{{\"description\": \"q\", \"label\": [], \"type\": [\"other\"], \"table\": {bad_row}}}"
        );
        let message = parse(&text).unwrap_err().to_string();
        assert!(message.contains("tasks.jsonl:2"), "{message}");
        assert!(message.contains("table.table_info.rows[1]"), "{message}");
        assert!(message.contains("expected 2 cells"), "{message}");

        let message = parse("{\"label\": []}").unwrap_err().to_string();
        assert!(message.contains(":1: field `description`"), "{message}");
        let message = parse("not json").unwrap_err().to_string();
        assert!(message.contains("not valid JSON"), "{message}");
        let text =
            format!("{{\"description\": \"u\", \"type\": [\"INSERT\"], \"table\": {TABLE}}}");
        let message = parse(&text).unwrap_err().to_string();
        assert!(message.contains("answer_md5"), "{message}");
    }

    #[test]
    fn answer_md5_forms() {
        assert_eq!(parse_answer_md5("[('abc',)]").as_deref(), Some("abc"));
        assert_eq!(parse_answer_md5("abc").as_deref(), Some("abc"));
        assert_eq!(parse_answer_md5("[]"), None);
    }
}
