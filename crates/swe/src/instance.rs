//! Repository-repair instances in the SWE-Gym shape and the JSONL loader for user-supplied ones.
//!
//! A line of an instance file is one JSON object:
//!
//! | field | type | meaning |
//! |---|---|---|
//! | `instance_id` | string | unique id |
//! | `repo` | string, optional | a name for the repository |
//! | `problem_statement` | string | the issue text shown to the policy |
//! | `hints_text` | string, optional | kept, never shown |
//! | `files` | object path -> text | the repository's files at the base commit, or: |
//! | `repo_path` | string | a directory with those files, relative to the JSONL file |
//! | `patch` | string | the gold patch (unified diff) |
//! | `test_patch` | string, optional | applied before verification, never shown |
//! | `FAIL_TO_PASS` | list of test ids, or a string holding a JSON list (SWE-bench style) | tests the fix must make pass |
//! | `PASS_TO_PASS` | same | tests that must keep passing |
//! | `split` | `train`, `validation` or `test`, optional | the instance's split |
//! | `call_tests` | object test id -> list of steps, optional | the hidden tests as calls, judged outside the policy's process (see below) |
//!
//! `call_tests`, when given, must hold every FAIL_TO_PASS and PASS_TO_PASS id and nothing
//! else. Each id's steps make the calls its unittest method makes, in the call language of
//! [`super::judge`]: `{"let": "c", "do": {"call": "pkg.mod:LRUCache", "args": [2]}}`,
//! `{"see": {"method": [{"var": "c"}, "get"], "args": ["a"]}}`, `{"do": ..., "raises": true}`
//! for a call the test expects to raise. The verifier runs them on the gold-patched files once
//! to learn the expected observations, and judges the policy's repository by comparing its
//! observations with those, in a process that never imports the policy's code. An instance
//! without `call_tests` can be verified only by the in-process unittest runner, whose verdict
//! the policy's code can forge; the environment refuses it unless
//! `SweConfig::allow_in_process_verdict` is set.
//!
//! Other fields of SWE-Gym records (`base_commit`, `version`, `created_at`, ...) are accepted
//! and ignored. Test ids are `unittest` names (`tests.test_core.TestSlug.test_digits`).

use std::collections::BTreeMap;
use std::path::{Component, Path};

use harness_core::{Error, Location, Result, Split};
use serde::{Deserialize, Serialize};
use serde_json::Value;

use super::diff;

/// One repository-repair instance.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct SweInstance {
    /// Unique id, e.g. `textkit__truncate-exact-width`.
    pub instance_id: String,
    /// A name for the repository.
    #[serde(default)]
    pub repo: String,
    /// The issue the policy must fix.
    pub problem_statement: String,
    /// Extra hints (never shown by the environment).
    #[serde(default)]
    pub hints_text: String,
    /// The repository's files (relative path -> UTF-8 text) before the fix.
    pub files: BTreeMap<String, String>,
    /// The gold patch (unified diff).
    pub patch: String,
    /// A patch applied to the final state before verification (hidden tests); may be empty.
    #[serde(default)]
    pub test_patch: String,
    /// Tests that fail before the fix and must pass after it.
    #[serde(rename = "FAIL_TO_PASS")]
    pub fail_to_pass: Vec<String>,
    /// Tests that pass before the fix and must keep passing.
    #[serde(rename = "PASS_TO_PASS")]
    pub pass_to_pass: Vec<String>,
    /// The split the instance belongs to.
    pub split: Split,
    /// The hidden tests as calls (test id -> steps), judged outside the policy's process;
    /// empty when the instance has none (see the module docs).
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub call_tests: BTreeMap<String, Vec<Value>>,
}

impl SweInstance {
    /// The repository after the gold patch (and the test patch, when `with_tests`).
    pub fn fixed_files(
        &self,
        with_tests: bool,
    ) -> std::result::Result<BTreeMap<String, String>, String> {
        let mut files = self.files.clone();
        diff::apply_to_files(&mut files, &self.patch).map_err(|e| format!("patch: {e}"))?;
        if with_tests && !self.test_patch.trim().is_empty() {
            diff::apply_to_files(&mut files, &self.test_patch)
                .map_err(|e| format!("test_patch: {e}"))?;
        }
        Ok(files)
    }

    /// Every test the verifier runs: FAIL_TO_PASS then PASS_TO_PASS.
    pub fn all_tests(&self) -> Vec<String> {
        self.fail_to_pass
            .iter()
            .chain(&self.pass_to_pass)
            .cloned()
            .collect()
    }

    /// Check the instance's shape: a non-empty id and statement, safe file paths, valid test
    /// ids, at least one FAIL_TO_PASS test, and patches that parse and apply. Returns the
    /// offending field and what was expected.
    pub fn check(&self) -> std::result::Result<(), (&'static str, String)> {
        if self.instance_id.trim().is_empty() {
            return Err(("instance_id", "expected a non-empty string".into()));
        }
        if self.problem_statement.trim().is_empty() {
            return Err(("problem_statement", "expected a non-empty string".into()));
        }
        if self.files.is_empty() {
            return Err(("files", "expected at least one file".into()));
        }
        for path in self.files.keys() {
            if let Err(why) = check_relative_path(path) {
                return Err(("files", format!("path `{path}`: {why}")));
            }
        }
        if self.fail_to_pass.is_empty() {
            return Err(("FAIL_TO_PASS", "expected at least one test id".into()));
        }
        for (field, ids) in [
            ("FAIL_TO_PASS", &self.fail_to_pass),
            ("PASS_TO_PASS", &self.pass_to_pass),
        ] {
            if let Some(bad) = ids.iter().find(|id| !is_test_id(id)) {
                return Err((
                    field,
                    format!(
                        "`{bad}` is not a unittest id (dotted Python names such as `tests.test_mod.TestCase.test_name`; pytest ids `path.py::Class::test` are converted, parametrised ones are not supported)"
                    ),
                ));
            }
        }
        if !self.call_tests.is_empty() {
            let all = self.all_tests();
            if let Some(missing) = all.iter().find(|id| !self.call_tests.contains_key(*id)) {
                return Err((
                    "call_tests",
                    format!(
                        "has no steps for `{missing}`; expected steps for every FAIL_TO_PASS and PASS_TO_PASS id"
                    ),
                ));
            }
            for (id, steps) in &self.call_tests {
                if !all.contains(id) {
                    return Err((
                        "call_tests",
                        format!("`{id}` is neither in FAIL_TO_PASS nor in PASS_TO_PASS"),
                    ));
                }
                super::judge::check_steps(steps, &format!("call_tests.{id}"))
                    .map_err(|e| ("call_tests", e))?;
            }
        }
        let touched = diff::parse_patch(&self.patch).map_err(|e| ("patch", e))?;
        if touched.is_empty() {
            return Err((
                "patch",
                "expected a unified diff with at least one file".into(),
            ));
        }
        for fp in &touched {
            check_relative_path(fp.path())
                .map_err(|e| ("patch", format!("`{}`: {e}", fp.path())))?;
        }
        let mut files = self.files.clone();
        diff::apply_to_files(&mut files, &self.patch)
            .map_err(|e| ("patch", format!("does not apply: {e}")))?;
        if !self.test_patch.trim().is_empty() {
            for fp in diff::parse_patch(&self.test_patch).map_err(|e| ("test_patch", e))? {
                check_relative_path(fp.path())
                    .map_err(|e| ("test_patch", format!("`{}`: {e}", fp.path())))?;
            }
            let mut files = self.files.clone();
            diff::apply_to_files(&mut files, &self.test_patch)
                .map_err(|e| ("test_patch", format!("does not apply: {e}")))?;
        }
        Ok(())
    }
}

/// A test id in unittest form: pytest-style node ids (`tests/test_mod.py::TestCase::test_x`)
/// and file paths (`tests/test_mod.py`) become dotted names (`tests.test_mod.TestCase.test_x`);
/// other ids are returned unchanged. Parametrised pytest ids (`test_x[1]`) and module-level
/// pytest functions have no unittest equivalent.
pub fn normalize_test_id(id: &str) -> String {
    let id = id.trim();
    if !id.contains("::") && !id.ends_with(".py") {
        return id.to_string();
    }
    let mut parts = id.split("::");
    let path = parts.next().unwrap_or_default();
    let module = path
        .strip_suffix(".py")
        .unwrap_or(path)
        .trim_start_matches("./")
        .replace('/', ".");
    std::iter::once(module)
        .chain(parts.map(str::to_string))
        .collect::<Vec<_>>()
        .join(".")
}

/// Whether `id` looks like a unittest name: dot-separated Python identifiers.
pub fn is_test_id(id: &str) -> bool {
    !id.is_empty()
        && id.len() <= 500
        && id.split('.').all(|part| {
            let mut chars = part.chars();
            chars
                .next()
                .is_some_and(|c| c == '_' || c.is_ascii_alphabetic())
                && chars.all(|c| c == '_' || c.is_ascii_alphanumeric())
        })
}

/// Check that `path` is relative, non-empty and never climbs out (`..`).
pub fn check_relative_path(path: &str) -> std::result::Result<(), String> {
    if path.is_empty() {
        return Err("the path is empty".into());
    }
    if path.contains('\0') {
        return Err("the path contains a NUL byte".into());
    }
    let p = Path::new(path);
    for component in p.components() {
        match component {
            Component::Normal(_) | Component::CurDir => {}
            Component::ParentDir => return Err("`..` is not allowed".into()),
            Component::RootDir | Component::Prefix(_) => {
                return Err(
                    "absolute paths are not allowed; give a path relative to the repository root"
                        .into(),
                );
            }
        }
    }
    if p.components().all(|c| matches!(c, Component::CurDir)) {
        return Err("the path names the repository root, not a file".into());
    }
    Ok(())
}

fn parse_error(file: &Path, line: usize, field: &str, message: String) -> Error {
    Error::Parse {
        location: Location::at(field).in_file(file),
        message: format!("line {line}: {message}"),
    }
}

/// Load instances from a JSONL file (one object per line; blank lines and lines starting with
/// `#` are skipped). Instances without a `split` field get `default_split`. Errors name the
/// file, the line, the field and what was expected.
pub fn load_jsonl(path: impl AsRef<Path>, default_split: Split) -> Result<Vec<SweInstance>> {
    let path = path.as_ref();
    let text = std::fs::read_to_string(path).map_err(|e| Error::io(path, e))?;
    let base = path.parent().unwrap_or(Path::new("."));
    let mut instances = Vec::new();
    let mut seen = BTreeMap::new();
    for (index, line) in text.lines().enumerate() {
        let line_no = index + 1;
        let trimmed = line.trim();
        if trimmed.is_empty() || trimmed.starts_with('#') {
            continue;
        }
        let value: Value = serde_json::from_str(trimmed)
            .map_err(|e| parse_error(path, line_no, "", format!("expected a JSON object ({e})")))?;
        let instance = instance_from_value(&value, base, default_split)
            .map_err(|(field, message)| parse_error(path, line_no, &field, message))?;
        instance
            .check()
            .map_err(|(field, message)| parse_error(path, line_no, field, message))?;
        if let Some(first) = seen.insert(instance.instance_id.clone(), line_no) {
            return Err(parse_error(
                path,
                line_no,
                "instance_id",
                format!(
                    "`{}` was already used on line {first}; expected unique ids",
                    instance.instance_id
                ),
            ));
        }
        instances.push(instance);
    }
    Ok(instances)
}

type FieldError = (String, String);

fn instance_from_value(
    value: &Value,
    base: &Path,
    default_split: Split,
) -> std::result::Result<SweInstance, FieldError> {
    let Value::Object(obj) = value else {
        return Err((String::new(), "expected a JSON object".into()));
    };
    let string = |field: &str, required: bool| -> std::result::Result<String, FieldError> {
        match obj.get(field) {
            Some(Value::String(s)) => Ok(s.clone()),
            None | Some(Value::Null) if !required => Ok(String::new()),
            None => Err((field.to_string(), "missing; expected a string".into())),
            Some(other) => Err((
                field.to_string(),
                format!("expected a string, found {}", kind(other)),
            )),
        }
    };
    let instance_id = string("instance_id", true)?;
    let repo = string("repo", false)?;
    let problem_statement = string("problem_statement", true)?;
    let files = match (obj.get("files"), obj.get("repo_path")) {
        (Some(Value::Object(map)), None) => {
            let mut files = BTreeMap::new();
            for (name, content) in map {
                let Value::String(content) = content else {
                    return Err((
                        format!("files.{name}"),
                        format!(
                            "expected the file's text as a string, found {}",
                            kind(content)
                        ),
                    ));
                };
                files.insert(name.clone(), content.clone());
            }
            files
        }
        (None, Some(Value::String(dir))) => {
            read_tree(&base.join(dir)).map_err(|e| ("repo_path".to_string(), e))?
        }
        (Some(_), Some(_)) => {
            return Err((
                "files".into(),
                "give either `files` or `repo_path`, not both".into(),
            ));
        }
        (Some(other), None) => {
            return Err((
                "files".into(),
                format!(
                    "expected an object mapping paths to text, found {}",
                    kind(other)
                ),
            ));
        }
        (None, Some(other)) => {
            return Err((
                "repo_path".into(),
                format!(
                    "expected a directory path as a string, found {}",
                    kind(other)
                ),
            ));
        }
        (None, None) => {
            return Err((
                "files".into(),
                "missing; expected `files` (an object mapping paths to text) or `repo_path` (a directory)"
                    .into(),
            ));
        }
    };
    let split = match obj.get("split") {
        None | Some(Value::Null) => default_split,
        Some(Value::String(s)) => match s.as_str() {
            "train" => Split::Train,
            "validation" | "valid" | "dev" => Split::Validation,
            "test" => Split::Test,
            other => {
                return Err((
                    "split".into(),
                    format!("`{other}` is not a split; expected train, validation or test"),
                ));
            }
        },
        Some(other) => {
            return Err((
                "split".into(),
                format!("expected a string, found {}", kind(other)),
            ));
        }
    };
    Ok(SweInstance {
        instance_id,
        repo,
        problem_statement,
        hints_text: string("hints_text", false)?,
        files,
        patch: string("patch", true)?,
        test_patch: string("test_patch", false)?,
        fail_to_pass: test_list(obj.get("FAIL_TO_PASS"), "FAIL_TO_PASS", true)?,
        pass_to_pass: test_list(obj.get("PASS_TO_PASS"), "PASS_TO_PASS", false)?,
        split,
        call_tests: call_tests(obj.get("call_tests"))?,
    })
}

fn test_list(
    value: Option<&Value>,
    field: &str,
    required: bool,
) -> std::result::Result<Vec<String>, FieldError> {
    let expected = "expected a list of test ids, or a string holding a JSON list of them";
    let list = match value {
        None | Some(Value::Null) if !required => return Ok(Vec::new()),
        None => return Err((field.to_string(), format!("missing; {expected}"))),
        // SWE-bench and SWE-Gym store the lists as JSON text.
        Some(Value::String(text)) => serde_json::from_str::<Value>(text).map_err(|_| {
            (
                field.to_string(),
                format!("{expected}; the string is not JSON"),
            )
        })?,
        Some(other) => other.clone(),
    };
    let Value::Array(items) = list else {
        return Err((
            field.to_string(),
            format!("{expected}, found {}", kind(&list)),
        ));
    };
    items
        .iter()
        .enumerate()
        .map(|(i, item)| match item {
            Value::String(s) => Ok(normalize_test_id(s)),
            other => Err((
                format!("{field}[{i}]"),
                format!("expected a test id string, found {}", kind(other)),
            )),
        })
        .collect()
}

fn call_tests(
    value: Option<&Value>,
) -> std::result::Result<BTreeMap<String, Vec<Value>>, FieldError> {
    let map = match value {
        None | Some(Value::Null) => return Ok(BTreeMap::new()),
        Some(Value::Object(map)) => map,
        Some(other) => {
            return Err((
                "call_tests".into(),
                format!(
                    "expected an object mapping test ids to lists of steps, found {}",
                    kind(other)
                ),
            ));
        }
    };
    map.iter()
        .map(|(id, steps)| match steps {
            Value::Array(steps) => Ok((normalize_test_id(id), steps.clone())),
            other => Err((
                format!("call_tests.{id}"),
                format!("expected a list of steps, found {}", kind(other)),
            )),
        })
        .collect()
}

fn kind(value: &Value) -> &'static str {
    match value {
        Value::Null => "null",
        Value::Bool(_) => "a boolean",
        Value::Number(_) => "a number",
        Value::String(_) => "a string",
        Value::Array(_) => "an array",
        Value::Object(_) => "an object",
    }
}

/// Directories never read into an instance.
const SKIPPED_DIRS: &[&str] = &[".git", "__pycache__", ".hg", ".svn", ".tox", ".venv"];

/// Read a directory's UTF-8 text files (symlinks, binary files and files over 1 MiB are
/// skipped; version-control and cache directories too).
fn read_tree(root: &Path) -> std::result::Result<BTreeMap<String, String>, String> {
    let mut files = BTreeMap::new();
    let mut stack = vec![root.to_path_buf()];
    while let Some(dir) = stack.pop() {
        let entries = std::fs::read_dir(&dir)
            .map_err(|e| format!("cannot read directory {}: {e}", dir.display()))?;
        for entry in entries {
            let entry = entry.map_err(|e| format!("{}: {e}", dir.display()))?;
            let path = entry.path();
            let meta =
                std::fs::symlink_metadata(&path).map_err(|e| format!("{}: {e}", path.display()))?;
            let name = entry.file_name().to_string_lossy().into_owned();
            if meta.is_dir() {
                if !SKIPPED_DIRS.contains(&name.as_str()) {
                    stack.push(path);
                }
            } else if meta.is_file() && meta.len() <= 1 << 20 {
                let Ok(text) = String::from_utf8(
                    std::fs::read(&path).map_err(|e| format!("{}: {e}", path.display()))?,
                ) else {
                    continue;
                };
                let rel = path
                    .strip_prefix(root)
                    .map_err(|_| format!("{} is outside {}", path.display(), root.display()))?;
                let rel: Vec<String> = rel
                    .components()
                    .map(|c| c.as_os_str().to_string_lossy().into_owned())
                    .collect();
                files.insert(rel.join("/"), text);
            }
        }
    }
    if files.is_empty() {
        return Err(format!("no text files found under {}", root.display()));
    }
    Ok(files)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn test_ids_and_paths() {
        assert!(is_test_id("tests.test_core.TestX.test_y"));
        assert_eq!(
            normalize_test_id("tests/test_core.py::TestX::test_y"),
            "tests.test_core.TestX.test_y"
        );
        assert_eq!(normalize_test_id("./tests/test_core.py"), "tests.test_core");
        assert_eq!(
            normalize_test_id("tests.test_core.TestX"),
            "tests.test_core.TestX"
        );
        assert!(!is_test_id(&normalize_test_id(
            "tests/test_a.py::test_b[1-2]"
        )));
        for bad in ["", "a..b", "1abc", "a b", "a/b", "tests.test-x"] {
            assert!(!is_test_id(bad), "{bad}");
        }
        assert!(check_relative_path("pkg/mod.py").is_ok());
        for bad in ["", "/etc/passwd", "../x", "a/../../b", ".", "a\0b"] {
            assert!(check_relative_path(bad).is_err(), "{bad:?}");
        }
    }
}
