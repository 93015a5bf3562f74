//! The call judge: hidden tests as calls whose results a process that never imports the
//! policy's code compares with the gold code's.
//!
//! A hidden test is a list of steps ([`CallSpecs`], the instance's `call_tests`): construct
//! objects, call functions and methods with plain-data arguments, read attributes, take `len`,
//! `in`, `bool`, iterate, and pass a few driver-made callables (a memoised function's body that
//! records its calls). The driver (`call_driver.py`) runs in the sandbox, imports the policy's
//! repository, makes the calls and writes back only plain data: each `see` step's result as a
//! tagged snapshot (JSON scalars and arrays only for the exact built-in types; an object of the
//! repository's classes as its class name and public attributes), each step that raised as the
//! exception's class, its MRO and message. It holds no expected value, no verdict and no key.
//! Classes are named by identity, not by their own `__module__`/`__qualname__`/`mro()`: only
//! the real built-in classes (taken before the repository is imported) are `builtins.*`, and
//! the MRO lists only classes the exception's class really derives from (through
//! `__bases__`). Each id's child reports through a pipe of its own, so a line it writes can
//! only be its own id's.
//!
//! The copy the calls run in holds no test file ([`is_test_path`]; the calls name package code
//! only, and [`check_steps`] refuses a reference into a test module or `unittest`): the values
//! the tests assert are not on disk for the policy's code to read. A snapshot cut short in the
//! driver (a string, bytes or container over its bound, too deep, too many values) carries
//! `"cut"` with the reason: for the policy's code that id is an error, never compared (equal
//! prefixes are not equal values), and a gold observation with a cut refuses the spec.
//!
//! The expected observations are what the gold code produces for the same steps
//! ([`gold_expectations`]: the driver run on the instance's gold-patched files, in a sandbox
//! the policy's code never reaches), computed once per instance and held here, in the trainer.
//! [`judge`] compares: an id passes when every step's observation matches the gold one (a value
//! equal as plain data; an exception whose MRO holds the class the gold code raised, as
//! `assertRaises` would accept). So nothing the policy's code does in its own process (replace
//! unittest, find the running test through `inspect`, forge report lines, hook audit events,
//! return an object that equals anything) reaches the verdict: the only way to pass is to
//! return what the gold code returns for these calls.
//!
//! What this leaves (docs/SECURITY.md): the calls themselves are visible to the
//! policy's process at run time (they mirror the repository's own tests), so code that
//! special-cases those exact inputs passes, as it would any test suite; and the snapshot
//! compares public attributes, so a correct fix that adds a public attribute to a returned
//! object fails.

use std::collections::BTreeMap;
use std::path::Path;
use std::time::Duration;

use serde_json::{Value, json};

use super::exec::{self, CommandOutput, Program, TestRun, TestStatus};
use super::instance::SweInstance;
use super::sandbox::Sandbox;
use super::session::is_test_path;

/// Hidden tests as calls: test id -> steps.
pub type CallSpecs = BTreeMap<String, Vec<Value>>;

/// Expected observations: test id -> one observation per step, from the gold code.
pub type Expectations = BTreeMap<String, Vec<Value>>;

/// The driver, run with `python -c`.
const DRIVER: &str = include_str!("call_driver.py");

/// The most steps one test may have.
pub const MAX_STEPS: usize = 200;

/// Callables the driver makes for tests that pass one in (`{"fn": ...}`).
const HELPERS: &[&str] = &["square", "power", "none"];

/// Binary operators of `{"op": ...}`.
const OPS: &[&str] = &["+", "-", "@", "=="];

fn is_identifier(name: &str) -> bool {
    let mut chars = name.chars();
    chars
        .next()
        .is_some_and(|c| c == '_' || c.is_ascii_alphabetic())
        && chars.all(|c| c == '_' || c.is_ascii_alphanumeric())
}

/// A `module:attr.path` reference.
fn is_reference(text: &str) -> bool {
    let (module, attrs) = text.split_once(':').unwrap_or((text, ""));
    !module.is_empty()
        && module.split('.').all(is_identifier)
        && (attrs.is_empty() || attrs.split('.').all(is_identifier))
}

/// Why a reference's module may not be named in a call, if it may not: `unittest` (its
/// machinery is the in-process runner's, not the package's) and any test module, by the rule of
/// [`is_test_path`] applied to the module's file (`a/b.py`) and package (`a/b/__init__.py`).
/// Test files are not in the copy the calls run in: the values they assert would be readable
/// there by the policy's code.
fn refused_module(reference: &str) -> Option<String> {
    let module = reference.split_once(':').map_or(reference, |(m, _)| m);
    if module == "unittest" || module.starts_with("unittest.") {
        return Some(format!(
            "`{module}` is the unittest machinery; calls name the package's own code"
        ));
    }
    let file = module.replace('.', "/");
    [format!("{file}.py"), format!("{file}/__init__.py")]
        .iter()
        .any(|path| is_test_path(path))
        .then(|| {
            format!(
                "`{module}` is a test module (test files are not in the copy the calls run in); calls name the package's own code"
            )
        })
}

/// Check one test's steps; the error names the place (`<path>[i].see.args[0]`) and what was
/// expected.
pub fn check_steps(steps: &[Value], path: &str) -> Result<(), String> {
    if steps.is_empty() {
        return Err(format!("{path}: expected at least one step"));
    }
    if steps.len() > MAX_STEPS {
        return Err(format!("{path}: more than {MAX_STEPS} steps"));
    }
    for (i, step) in steps.iter().enumerate() {
        let at = format!("{path}[{i}]");
        let Value::Object(fields) = step else {
            return Err(format!(
                "{at}: expected a step object such as {{\"see\": <expression>}}"
            ));
        };
        if let Some(key) = fields
            .keys()
            .find(|k| !["let", "do", "see", "raises"].contains(&k.as_str()))
        {
            return Err(format!(
                "{at}: unknown key `{key}`; a step has `do` or `see`, and optionally `let` and `raises`"
            ));
        }
        let body = match (fields.get("do"), fields.get("see")) {
            (Some(expr), None) => ("do", expr),
            (None, Some(expr)) => ("see", expr),
            _ => {
                return Err(format!(
                    "{at}: expected exactly one of `do` (run, observe only whether it raised) and `see` (observe the result)"
                ));
            }
        };
        if let Some(name) = fields.get("let")
            && !name.as_str().is_some_and(is_identifier)
        {
            return Err(format!("{at}.let: expected a variable name"));
        }
        if let Some(flag) = fields.get("raises")
            && !flag.is_boolean()
        {
            return Err(format!("{at}.raises: expected true or false"));
        }
        check_expr(body.1, &format!("{at}.{}", body.0), 0)?;
    }
    Ok(())
}

fn check_args(
    fields: &serde_json::Map<String, Value>,
    at: &str,
    depth: usize,
) -> Result<(), String> {
    if let Some(args) = fields.get("args") {
        let Value::Array(items) = args else {
            return Err(format!("{at}.args: expected a list of expressions"));
        };
        for (i, item) in items.iter().enumerate() {
            check_expr(item, &format!("{at}.args[{i}]"), depth + 1)?;
        }
    }
    if let Some(kwargs) = fields.get("kwargs") {
        let Value::Object(items) = kwargs else {
            return Err(format!(
                "{at}.kwargs: expected an object of name -> expression"
            ));
        };
        for (name, item) in items {
            if !is_identifier(name) {
                return Err(format!("{at}.kwargs: `{name}` is not a keyword name"));
            }
            check_expr(item, &format!("{at}.kwargs.{name}"), depth + 1)?;
        }
    }
    Ok(())
}

fn check_pair(value: &Value, at: &str, depth: usize, second_is_name: bool) -> Result<(), String> {
    match value.as_array().map(Vec::as_slice) {
        Some([first, second]) => {
            check_expr(first, &format!("{at}[0]"), depth + 1)?;
            if second_is_name {
                if !second.as_str().is_some_and(is_identifier) {
                    return Err(format!("{at}[1]: expected an attribute name"));
                }
                Ok(())
            } else {
                check_expr(second, &format!("{at}[1]"), depth + 1)
            }
        }
        _ => Err(format!(
            "{at}: expected a list of two: {}",
            if second_is_name {
                "[<expression>, \"name\"]"
            } else {
                "[<expression>, <expression>]"
            }
        )),
    }
}

/// Check an expression of the call language (see `call_driver.py`).
fn check_expr(expr: &Value, at: &str, depth: usize) -> Result<(), String> {
    if depth > 32 {
        return Err(format!("{at}: nested more than 32 levels"));
    }
    let fields = match expr {
        Value::Null | Value::Bool(_) | Value::Number(_) | Value::String(_) => return Ok(()),
        Value::Array(items) => {
            for (i, item) in items.iter().enumerate() {
                check_expr(item, &format!("{at}[{i}]"), depth + 1)?;
            }
            return Ok(());
        }
        Value::Object(fields) => fields,
    };
    let form = ["var", "ref", "call", "method", "attr", "len", "truth", "list", "in", "tuple", "dict", "op", "fn", "log"]
        .into_iter()
        .find(|k| fields.contains_key(*k))
        .ok_or_else(|| {
            format!(
                "{at}: expected an expression: a JSON literal, a list, or an object with one of var, ref, call, method, attr, len, truth, list, in, tuple, dict, op, fn, log"
            )
        })?;
    let allowed: &[&str] = match form {
        "call" | "method" => &["args", "kwargs"],
        "op" => &["args"],
        "fn" => &["log"],
        _ => &[],
    };
    if let Some(key) = fields
        .keys()
        .find(|k| k.as_str() != form && !allowed.contains(&k.as_str()))
    {
        return Err(format!("{at}: unexpected key `{key}` beside `{form}`"));
    }
    let value = &fields[form];
    let sub = format!("{at}.{form}");
    match form {
        "var" | "log" => value
            .as_str()
            .filter(|n| is_identifier(n))
            .map(|_| ())
            .ok_or_else(|| format!("{sub}: expected a name")),
        "ref" => match value.as_str().filter(|r| is_reference(r)) {
            Some(r) => refused_module(r).map_or(Ok(()), |why| Err(format!("{sub}: {why}"))),
            None => Err(format!("{sub}: expected `module.path:attribute.path`")),
        },
        "call" => {
            match value {
                Value::String(r) if is_reference(r) => {
                    if let Some(why) = refused_module(r) {
                        return Err(format!("{sub}: {why}"));
                    }
                }
                Value::String(_) => {
                    return Err(format!("{sub}: expected `module.path:attribute.path`"));
                }
                other => check_expr(other, &sub, depth + 1)?,
            }
            check_args(fields, at, depth)
        }
        "method" => {
            check_pair(value, &sub, depth, true)?;
            check_args(fields, at, depth)
        }
        "attr" => check_pair(value, &sub, depth, true),
        "in" => check_pair(value, &sub, depth, false),
        "len" | "truth" | "list" => check_expr(value, &sub, depth + 1),
        "tuple" => match value {
            Value::Array(_) => check_expr(value, &sub, depth + 1),
            _ => Err(format!("{sub}: expected a list of expressions")),
        },
        "dict" => match value.as_array() {
            Some(pairs) => pairs
                .iter()
                .enumerate()
                .try_for_each(|(i, pair)| check_pair(pair, &format!("{sub}[{i}]"), depth, false)),
            None => Err(format!("{sub}: expected a list of [key, value] pairs")),
        },
        "op" => {
            if !value.as_str().is_some_and(|o| OPS.contains(&o)) {
                return Err(format!("{sub}: expected one of {}", OPS.join(" ")));
            }
            match fields.get("args") {
                Some(args) => check_pair(args, &format!("{at}.args"), depth, false),
                None => Err(format!("{at}.args: missing; expected [<left>, <right>]")),
            }
        }
        "fn" => {
            if !value.as_str().is_some_and(|f| HELPERS.contains(&f)) {
                return Err(format!("{sub}: expected one of {}", HELPERS.join(", ")));
            }
            match fields.get("log") {
                None => Ok(()),
                Some(log) if log.as_str().is_some_and(is_identifier) => Ok(()),
                Some(_) => Err(format!("{at}.log: expected a name")),
            }
        }
        _ => unreachable!("every form is handled"),
    }
}

/// The steps as the driver gets them: the `raises` marks (what the test expects) left out.
fn driver_steps(steps: &[Value]) -> Vec<Value> {
    steps
        .iter()
        .map(|step| {
            let mut step = step.clone();
            if let Value::Object(fields) = &mut step {
                fields.remove("raises");
            }
            step
        })
        .collect()
}

/// What the driver reported.
#[derive(Debug, Clone)]
pub struct CallRun {
    /// The observations of each id that reported exactly once.
    pub observations: BTreeMap<String, Vec<Value>>,
    /// Why an id has no observations to judge, by id.
    pub problems: BTreeMap<String, Vec<String>>,
    /// The repository's output (capped) and how the driver ended.
    pub command: CommandOutput,
}

/// Run the calls of `ids` (each must be in `specs`) with the configured Python in `cwd`,
/// inside `sandbox` when there is one (`cwd` read-only there). The calls go to the driver on
/// its stdin, never on disk.
pub fn run_calls(
    config: &super::SweConfig,
    sandbox: Option<&Sandbox>,
    cwd: &Path,
    specs: &CallSpecs,
    ids: &[String],
    timeout: Duration,
    cap: usize,
) -> std::io::Result<CallRun> {
    let tests: Vec<Value> = ids
        .iter()
        .filter_map(|id| {
            specs
                .get(id)
                .map(|steps| json!({"id": id, "steps": driver_steps(steps)}))
        })
        .collect();
    let input = serde_json::to_vec(&json!({ "tests": tests }))
        .unwrap_or_else(|e| unreachable!("JSON values serialise: {e}"));
    let mut args: Vec<&str> = vec!["-B", "-s"];
    if config.no_site {
        args.push("-S");
    }
    args.extend(["-c", DRIVER]);
    let (command, _lease) =
        exec::policy_command(config, sandbox, cwd, false, Program::Python, &args)?;
    let (command, report, overflow) = exec::run_with_input(command, timeout, cap, input)?;
    let mut seen: BTreeMap<String, Vec<Vec<Value>>> = BTreeMap::new();
    for line in String::from_utf8_lossy(&report).lines() {
        let Ok(value) = serde_json::from_str::<Value>(line) else {
            continue;
        };
        if let (Some(id), Some(Value::Array(observations))) = (
            value.get("id").and_then(Value::as_str),
            value.get("observations"),
        ) && ids.iter().any(|i| i == id)
        {
            seen.entry(id.to_string())
                .or_default()
                .push(observations.clone());
        }
    }
    let mut observations = BTreeMap::new();
    let mut problems: BTreeMap<String, Vec<String>> = BTreeMap::new();
    for id in ids {
        let why = match seen.remove(id) {
            Some(mut lines) if lines.len() == 1 => {
                observations.insert(id.clone(), lines.remove(0));
                continue;
            }
            Some(lines) => format!(
                "{} report lines for this id; exactly one was expected",
                lines.len()
            ),
            None if !specs.contains_key(id) => "no call spec for this id".to_string(),
            None if command.timed_out => {
                "no verdict: the run reached its time limit before this id reported".to_string()
            }
            None if overflow => "no verdict: the report was cut off before this id".to_string(),
            None => {
                "no verdict: no observations were reported for this id (its process ended early)"
                    .to_string()
            }
        };
        problems.entry(id.clone()).or_default().push(why);
    }
    Ok(CallRun {
        observations,
        problems,
        command,
    })
}

/// Run the driver on the instance's gold-patched files (without test files, as the policy's
/// copy) in a fresh copy,
/// and check that every id reported one observation per step, that the gold code raised
/// exactly at the steps marked `raises`, that no result was cut short (a cut value cannot be
/// compared), and that no step named an unknown variable. These
/// are the expected observations; they stay in this process.
pub fn gold_expectations(
    config: &super::SweConfig,
    sandbox: Option<&Sandbox>,
    instance: &SweInstance,
) -> Result<Expectations, String> {
    // The gold code runs as the policy's does: the package without its test files.
    let mut files = instance.fixed_files(false)?;
    files.retain(|path, _| !is_test_path(path));
    let dir = tempfile::Builder::new()
        .prefix("harness-swe-gold-")
        .tempdir()
        .map_err(|e| format!("cannot create a temporary directory: {e}"))?;
    let root = dir
        .path()
        .canonicalize()
        .map_err(|e| format!("{}: {e}", dir.path().display()))?;
    for (path, text) in &files {
        let target = root.join(path);
        if let Some(parent) = target.parent() {
            std::fs::create_dir_all(parent).map_err(|e| format!("{}: {e}", parent.display()))?;
        }
        std::fs::write(&target, text).map_err(|e| format!("{}: {e}", target.display()))?;
    }
    let ids = instance.all_tests();
    let run = run_calls(
        config,
        sandbox,
        &root,
        &instance.call_tests,
        &ids,
        config.verify_timeout,
        config.output_cap,
    )
    .map_err(|e| format!("cannot run `{}`: {e}", config.python))?;
    let mut problems: Vec<String> = run
        .problems
        .iter()
        .map(|(id, why)| format!("{id}: {}", why.join("; ")))
        .collect();
    for (id, observed) in &run.observations {
        let steps = &instance.call_tests[id];
        if observed.len() != steps.len() {
            problems.push(format!(
                "{id}: {} observations for {} steps",
                observed.len(),
                steps.len()
            ));
            continue;
        }
        for (i, (step, seen)) in steps.iter().zip(observed).enumerate() {
            let marked = step.get("raises").and_then(Value::as_bool).unwrap_or(false);
            let raised = seen.get("raised");
            if let Some(name) = seen.get("unbound") {
                problems.push(format!("{id}: step {i} names the unknown variable {name}"));
            } else if let Some(why) = seen.get("cut") {
                problems.push(format!(
                    "{id}: step {i}: the gold code's result was cut short in the driver ({why}); a cut value cannot be compared, so observe something smaller"
                ));
            } else if seen.get("driver_error").is_some() {
                problems.push(format!("{id}: step {i}: the driver failed: {seen}"));
            } else if marked && raised.is_none() {
                problems.push(format!(
                    "{id}: step {i} is marked `raises`, but the gold code did not raise"
                ));
            } else if let (false, Some(raised)) = (marked, raised) {
                problems.push(format!(
                    "{id}: step {i} raised {} with the gold code; mark it `raises` if the test expects that",
                    raised["type"]
                ));
            }
        }
    }
    if problems.is_empty() {
        Ok(run.observations)
    } else {
        let tail: String = run.command.output.chars().rev().take(1500).collect();
        let tail: String = tail.chars().rev().collect();
        Err(format!(
            "the gold code does not run the call specs as written: {}\n{tail}",
            problems.join("; ")
        ))
    }
}

/// Whether an observation matches the gold code's: a value or a completed `do` step equal as
/// plain data; a raise whose MRO holds the class the gold code raised (what `assertRaises`
/// accepts; the message is not compared).
fn matches(expected: &Value, observed: &Value) -> bool {
    match expected.get("raised") {
        Some(gold) => {
            let want = &gold["type"];
            observed
                .get("raised")
                .and_then(|r| r.get("mro"))
                .and_then(Value::as_array)
                .is_some_and(|mro| mro.contains(want))
        }
        None => expected == observed,
    }
}

/// Judge `ids`: each passes when it reported one observation per step and every one matches
/// the gold code's ([`matches`]); fails at the first that does not; is an error when it reported
/// nothing judgeable. The command's output gets a line per id.
pub fn judge(ids: &[String], expected: &Expectations, run: CallRun) -> TestRun {
    let CallRun {
        observations,
        mut problems,
        mut command,
    } = run;
    let mut statuses = BTreeMap::new();
    let mut summary = String::new();
    for id in ids {
        let status = match (observations.get(id), expected.get(id)) {
            (_, None) => {
                problems
                    .entry(id.clone())
                    .or_default()
                    .push("no expected observations for this id".into());
                TestStatus::Error
            }
            (None, Some(_)) => {
                if command.timed_out {
                    TestStatus::NotRun
                } else {
                    TestStatus::Error
                }
            }
            (Some(seen), Some(gold)) => {
                let differing = gold.iter().zip(seen).position(|(g, s)| !matches(g, s));
                if seen.len() != gold.len() {
                    problems.entry(id.clone()).or_default().push(format!(
                        "{} observations for {} steps",
                        seen.len(),
                        gold.len()
                    ));
                    TestStatus::Error
                } else if let Some((i, why)) = seen
                    .iter()
                    .enumerate()
                    .find_map(|(i, s)| s.get("cut").map(|why| (i, why)))
                {
                    // Equal prefixes are not equal values: a cut observation is never judged.
                    problems.entry(id.clone()).or_default().push(format!(
                        "step {i}: the result was cut short in the driver ({why}); a cut value is not judged"
                    ));
                    TestStatus::Error
                } else if let Some(i) = differing {
                    // The observed value only: the gold one is the hidden answer.
                    let shown: String = seen[i].to_string().chars().take(300).collect();
                    problems.entry(id.clone()).or_default().push(format!(
                        "step {i} differs from the gold code's result; observed {shown}"
                    ));
                    TestStatus::Fail
                } else {
                    TestStatus::Pass
                }
            }
        };
        summary.push_str(&format!("{} {id}", status.as_str().to_uppercase()));
        if let Some(why) = problems.get(id) {
            summary.push_str(&format!(": {}", why.join("; ")));
        }
        summary.push('\n');
        statuses.insert(id.clone(), status);
    }
    if !command.output.is_empty() && !command.output.ends_with('\n') {
        command.output.push('\n');
    }
    command.output.push_str(&summary);
    TestRun {
        tests: statuses.clone(),
        statuses,
        problems,
        command,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn step_checks_name_the_place() {
        let ok = json!([
            {"let": "c", "do": {"call": "pkg.mod:Cls", "args": [2], "kwargs": {"x": [1, {"tuple": [1]}]}}},
            {"see": {"method": [{"var": "c"}, "get"], "args": ["a"]}},
            {"see": {"in": ["a", {"var": "c"}]}},
            {"do": {"op": "@", "args": [{"var": "c"}, {"var": "c"}]}, "raises": true},
            {"see": {"call": {"call": "pkg:memo", "args": [4]}, "args": [{"fn": "square", "log": "calls"}]}},
            {"see": {"log": "calls"}}
        ]);
        check_steps(ok.as_array().unwrap(), "t").unwrap();
        for (bad, needle) in [
            (json!([]), "at least one step"),
            (json!([{"see": 1, "do": 2}]), "exactly one of"),
            (json!([{"look": 1}]), "unknown key `look`"),
            (json!([{"see": {"call": "no module"}}]), "t[0].see.call"),
            (json!([{"see": {"frob": 1}}]), "expected an expression"),
            (json!([{"see": {"attr": [1]}}]), "t[0].see.attr"),
            (
                json!([{"see": {"op": "**", "args": [1, 2]}}]),
                "t[0].see.op",
            ),
            (json!([{"see": {"fn": "exec"}}]), "t[0].see.fn"),
            (json!([{"let": "a b", "see": 1}]), "t[0].let"),
            (
                json!([{"see": {"var": "x", "extra": 1}}]),
                "unexpected key `extra`",
            ),
            // Test modules and unittest are refused (their files are not in the copy), by
            // the rule of `is_test_path`; package modules named like tests are not.
            (
                json!([{"see": {"call": "tests.test_core:TestX", "args": ["test_a"]}}]),
                "t[0].see.call: `tests.test_core` is a test module",
            ),
            (
                json!([{"do": 1}, {"see": {"ref": "pkg.test_util:EXPECTED"}}]),
                "t[1].see.ref: `pkg.test_util` is a test module",
            ),
            (
                json!([{"see": {"len": {"call": "conftest:values"}}}]),
                "t[0].see.len.call: `conftest` is a test module",
            ),
            (
                json!([{"see": {"call": "pkg.tests:helper"}}]),
                "`pkg.tests` is a test module",
            ),
            (
                json!([{"see": {"call": "unittest.mock:sentinel"}}]),
                "t[0].see.call: `unittest.mock` is the unittest machinery",
            ),
            (
                json!([{"see": {"ref": "unittest:TestCase"}}]),
                "t[0].see.ref: `unittest` is the unittest machinery",
            ),
        ] {
            let err = check_steps(bad.as_array().unwrap(), "t").unwrap_err();
            assert!(err.contains(needle), "{bad}: {err}");
        }
    }

    #[test]
    fn package_modules_named_like_tests_are_allowed() {
        let ok = json!([
            {"see": {"call": "testing:run"}},
            {"see": {"ref": "pkg.tests_util:X"}},
            {"see": {"call": "unittesting:f"}}
        ]);
        check_steps(ok.as_array().unwrap(), "t").unwrap();
    }

    /// A cut observation is an error with the reason, never a match: equal prefixes of a long
    /// string compare equal as plain data (the control below), so comparing them would pass a
    /// result that differs after the cut.
    #[test]
    fn cut_observations_are_errors_not_matches() {
        let ids = vec!["t".to_string()];
        let prefix = json!({"cut": "aaaa"});
        let gold: Expectations = [("t".to_string(), vec![json!({"value": prefix})])].into();
        // The control: as plain data, two cut snapshots with the same prefix are equal.
        assert!(matches(
            &json!({"value": prefix}),
            &json!({"value": prefix})
        ));
        let run = |observed: Value| CallRun {
            observations: [("t".to_string(), vec![observed])].into(),
            problems: BTreeMap::new(),
            command: CommandOutput {
                status: Some(0),
                timed_out: false,
                output: String::new(),
                dropped_bytes: 0,
                elapsed: Duration::ZERO,
            },
        };
        let judged = judge(
            &ids,
            &gold,
            run(json!({"value": prefix, "cut": "a string of more than 100000 characters"})),
        );
        assert_eq!(judged.statuses["t"], TestStatus::Error);
        let why = judged.problems["t"].join("; ");
        assert!(why.contains("step 0") && why.contains("cut short"), "{why}");
        assert!(why.contains("more than 100000 characters"), "{why}");
        // An uncut equal observation still passes.
        let judged = judge(&ids, &gold, run(json!({"value": prefix})));
        assert_eq!(judged.statuses["t"], TestStatus::Pass);
    }

    #[test]
    fn raises_match_by_class_and_values_exactly() {
        let gold = json!({"raised": {"type": "builtins.ValueError", "mro": ["builtins.ValueError"], "message": "x"}});
        let sub = json!({"raised": {"type": "pkg.ParseError", "mro": ["pkg.ParseError", "builtins.ValueError"], "message": "other"}});
        let fake = json!({"raised": {"type": "pkg.ValueError", "mro": ["pkg.ValueError", "builtins.Exception"], "message": "x"}});
        assert!(matches(&gold, &sub));
        assert!(!matches(&gold, &fake));
        assert!(!matches(&gold, &json!({"ok": true})));
        assert!(matches(
            &json!({"value": "hello"}),
            &json!({"value": "hello"})
        ));
        assert!(!matches(
            &json!({"value": "hello"}),
            &json!({"value": {"object": "pkg.AlwaysEqual", "attrs": {}}})
        ));
        assert!(!matches(&json!({"ok": true}), &sub));
    }
}
