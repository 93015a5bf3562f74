//! Failure analysis: the [`Analyst`] seam and the built-in rule-based analyst.
//!
//! The paper's analysis prompt requires every valid failure to be grouped by root cause or
//! marked unresolved, following "the earliest decision or tool result explaining the failed
//! check" (appendix "Directional Harness Evolution: Prompts and Settings"). [`RuleAnalyst`] does
//! this offline: each detector below recognises one failure mode of the built-in environments
//! from the trajectory and the verifier's details and reports where in the episode its evidence
//! starts; the earliest finding explains the failure.

use std::collections::BTreeMap;
use std::sync::OnceLock;

use async_trait::async_trait;
use harness_core::{Harness, Source, Termination, ToolCall, Trajectory, canonical_json};
use regex::Regex;
use serde_json::Value;

use crate::cause::{CAUSE_KINDS, Cause, FailureAnalysis, cause_info};
use crate::error::Result;
use crate::trace::{Step, TextTurn, steps, submitted};
use crate::usage::RoleUsage;

/// Groups a parent's failed episodes by root cause.
///
/// # Design
/// One required method over plain data: the parent and its failed trajectories (verifier
/// details included) in, a [`FailureAnalysis`] out. An implementation must account for every
/// failure it is given: grouped under a cause, marked unresolved, or listed as skipped when it
/// could not judge it (an LLM whose answers stayed malformed); `Err` is for infrastructure only.
/// LLM-backed analysts report their token use through [`Analyst::usage`] so that the round can
/// account external tokens per role.
#[async_trait]
pub trait Analyst: Send + Sync {
    /// A short name for reports.
    fn name(&self) -> &str;

    /// Analyse `failures`, the failed episodes of `parent` in one round.
    async fn analyse(&self, parent: &Harness, failures: &[Trajectory]) -> Result<FailureAnalysis>;

    /// Cumulative external-model usage (zero for offline analysts).
    fn usage(&self) -> RoleUsage {
        RoleUsage::default()
    }
}

/// A finding of one detector: the cause, where its evidence starts, and why.
#[derive(Debug, Clone, PartialEq)]
pub struct Finding {
    /// The cause kind (a catalogue name).
    pub kind: &'static str,
    /// Message index of the earliest evidence.
    pub at: usize,
    /// One line of evidence.
    pub evidence: String,
    /// Tools involved (the listing tool, the write tool).
    pub tools: Vec<String>,
}

/// The built-in, offline analyst: detectors for the known failure modes of the built-in
/// environments (AppWorld-style apps, DBBench, the repository world) and the test kit's
/// scripted environment.
#[derive(Debug, Clone, Copy, Default)]
pub struct RuleAnalyst;

#[async_trait]
impl Analyst for RuleAnalyst {
    fn name(&self) -> &str {
        "rule-analyst"
    }

    async fn analyse(&self, _parent: &Harness, failures: &[Trajectory]) -> Result<FailureAnalysis> {
        Ok(analyse_rules(failures))
    }
}

/// The rule-based analysis of `failures` (successful trajectories among them are ignored).
pub fn analyse_rules(failures: &[Trajectory]) -> FailureAnalysis {
    let mut analysis = FailureAnalysis::default();
    let mut groups: BTreeMap<&'static str, Cause> = BTreeMap::new();
    for trajectory in failures.iter().filter(|t| !t.is_success()) {
        analysis.failures += 1;
        match diagnose(trajectory) {
            Some(finding) => {
                let info = cause_info(finding.kind)
                    .unwrap_or_else(|| unreachable!("detectors name catalogue causes"));
                let cause = groups.entry(finding.kind).or_insert_with(|| Cause {
                    kind: finding.kind.to_string(),
                    summary: info.description.to_string(),
                    tasks: Vec::new(),
                    evidence: Vec::new(),
                    tools: Vec::new(),
                });
                cause.tasks.push(trajectory.task_id.clone());
                cause
                    .evidence
                    .push(format!("{}: {}", trajectory.task_id, finding.evidence));
                cause.tools.extend(finding.tools);
            }
            None => analysis.unresolved.push(trajectory.task_id.clone()),
        }
    }
    analysis.causes = groups.into_values().collect();
    analysis.normalise();
    analysis
}

/// The root cause of one failed episode: the finding with the earliest evidence (ties by the
/// catalogue's order), or `None` when no detector recognises the failure.
pub fn diagnose(trajectory: &Trajectory) -> Option<Finding> {
    let (steps, text_turns) = steps(trajectory);
    let ctx = Ctx {
        trajectory,
        steps: &steps,
        text_turns: &text_turns,
    };
    let detectors: [fn(&Ctx<'_>) -> Option<Finding>; 15] = [
        stopped_paging,
        union_not_intersection,
        budget_before_completion,
        rerun_instead_of_commit,
        finished_without_submit,
        repeated_failing_call,
        unknown_schema_name,
        call_without_docs,
        stale_code,
        no_readback,
        no_commit_after_change,
        edit_without_retest,
        edited_tests,
        context_overflow,
        malformed_action,
    ];
    let rank = |kind: &str| {
        CAUSE_KINDS
            .iter()
            .position(|c| c.kind == kind)
            .unwrap_or(usize::MAX)
    };
    detectors.iter().filter_map(|d| d(&ctx)).min_by(|a, b| {
        a.at.cmp(&b.at)
            .then_with(|| rank(a.kind).cmp(&rank(b.kind)))
    })
}

struct Ctx<'a> {
    trajectory: &'a Trajectory,
    steps: &'a [Step],
    text_turns: &'a [TextTurn],
}

fn finding(kind: &'static str, at: usize, evidence: String, tools: Vec<String>) -> Option<Finding> {
    Some(Finding {
        kind,
        at,
        evidence,
        tools,
    })
}

fn re(cell: &'static OnceLock<Regex>, pattern: &str) -> &'static Regex {
    cell.get_or_init(|| Regex::new(pattern).unwrap_or_else(|e| unreachable!("fixed pattern: {e}")))
}

/// The API name of an AppWorld-style `call_api` call, else the tool's name.
fn api_name(call: &ToolCall) -> String {
    match call.arguments.get("api").and_then(Value::as_str) {
        Some(api) if call.name == "call_api" => api.to_string(),
        _ => call.name.clone(),
    }
}

/// A listing call's identity without its page, its page and its page size.
fn page_of(call: &ToolCall) -> Option<(String, u64, Option<u64>)> {
    let mut args = call.arguments.clone();
    let target = if args.get("page").is_some() {
        &mut args
    } else {
        args.get_mut("arguments")
            .filter(|a| a.get("page").is_some())?
    };
    let map = target.as_object_mut()?;
    let page = map.remove("page")?.as_u64()?;
    let size = map.get("page_size").and_then(Value::as_u64);
    Some((
        format!("{}({})", call.name, canonical_json(&args)),
        page,
        size,
    ))
}

/// Whether an observation says that more pages follow: `page p of n` with `p < n`, or a JSON
/// listing whose page came back full (AppWorld-style listings return no total).
fn more_pages(observation: &str, page: u64, size: Option<u64>) -> Option<String> {
    static PAGE_OF: OnceLock<Regex> = OnceLock::new();
    if let Some(c) = re(&PAGE_OF, r"(?i)page (\d+) of (\d+)").captures(observation) {
        let p: u64 = c[1].parse().ok()?;
        let n: u64 = c[2].parse().ok()?;
        return (p < n).then(|| format!("page {p} of {n}"));
    }
    let value: Value = serde_json::from_str(observation).ok()?;
    let items = match &value {
        Value::Array(items) => items.len(),
        Value::Object(map) => map.values().find_map(Value::as_array)?.len(),
        _ => return None,
    } as u64;
    // The listing's own page size when it reports one, else the request's, else AppWorld's
    // default of 5.
    let size = value
        .get("page_size")
        .and_then(Value::as_u64)
        .or(size)
        .unwrap_or(5);
    (items >= size && items > 0).then(|| format!("page {page} came back full ({items} items)"))
}

fn stopped_paging(ctx: &Ctx<'_>) -> Option<Finding> {
    for (i, step) in ctx.steps.iter().enumerate() {
        let Some((key, page, size)) = page_of(&step.call) else {
            continue;
        };
        if step.error {
            continue;
        }
        let Some(why) = more_pages(step.observation.as_deref()?, page, size) else {
            continue;
        };
        let continued = ctx.steps[i + 1..]
            .iter()
            .any(|s| page_of(&s.call).is_some_and(|(k, p, _)| k == key && p == page + 1));
        if !continued {
            return finding(
                "stopped-paging",
                step.message,
                format!(
                    "{} returned {why}; page {} was never requested",
                    api_name(&step.call),
                    page + 1
                ),
                vec![step.call.name.clone()],
            );
        }
    }
    None
}

fn string_set(value: &Value) -> Option<std::collections::BTreeSet<String>> {
    value.as_array().map(|items| {
        items
            .iter()
            .map(|v| match v {
                Value::String(s) => s.trim().to_lowercase(),
                other => other.to_string(),
            })
            .collect()
    })
}

fn union_not_intersection(ctx: &Ctx<'_>) -> Option<Finding> {
    let details = &ctx.trajectory.outcome.details;
    let end = ctx.trajectory.messages.len();
    // AppWorld-style checks: the answer check lists the given items that were not expected.
    if let Some(checks) = details.get("checks").and_then(Value::as_array) {
        for check in checks {
            if check.get("check") == Some(&Value::from("answer"))
                && check.get("ok") == Some(&Value::Bool(false))
                && let Some(extra) = check.pointer("/detail/extra").and_then(Value::as_array)
                && !extra.is_empty()
            {
                return finding(
                    "union-not-intersection",
                    end,
                    format!(
                        "the answer holds {} item(s) outside the requested intersection",
                        extra.len()
                    ),
                    Vec::new(),
                );
            }
        }
    }
    // DBBench: the committed answers strictly contain the label.
    if let (Some(given), Some(label)) = (
        details.get("answers").and_then(string_set),
        details.get("label").and_then(string_set),
    ) && !label.is_empty()
        && label.is_subset(&given)
        && given.len() > label.len()
    {
        return finding(
            "union-not-intersection",
            end,
            format!(
                "committed {} answers where {} satisfy every condition",
                given.len(),
                label.len()
            ),
            Vec::new(),
        );
    }
    None
}

fn budget_before_completion(ctx: &Ctx<'_>) -> Option<Finding> {
    let t = ctx.trajectory;
    let hit = matches!(
        t.termination,
        Termination::MaxEnvActions | Termination::MaxModelCalls
    );
    (hit && !submitted(ctx.steps)).then(|| Finding {
        kind: "budget-before-completion",
        at: t.messages.len(),
        evidence: format!(
            "ended by {:?} after {} actions without a completion call",
            t.termination, t.counts.env_actions
        ),
        tools: Vec::new(),
    })
}

/// A SQL statement that had succeeded, run again unchanged, in an episode that never
/// committed: the result was there, the commit was not.
fn rerun_instead_of_commit(ctx: &Ctx<'_>) -> Option<Finding> {
    if submitted(ctx.steps) {
        return None;
    }
    let mut done: Vec<String> = Vec::new();
    // SQL statements only: elsewhere a repeated read is exploration that ran out of budget.
    for step in ctx
        .steps
        .iter()
        .filter(|s| s.call.name == "execute_sql" && !s.error && !is_write(s))
    {
        let key = step.call.canonical();
        if done.contains(&key) {
            return finding(
                "rerun-instead-of-commit",
                step.message,
                format!(
                    "re-ran {} after it had succeeded, and never committed",
                    cut(&key, 120)
                ),
                vec![step.call.name.clone()],
            );
        }
        done.push(key);
    }
    None
}

fn finished_without_submit(ctx: &Ctx<'_>) -> Option<Finding> {
    if submitted(ctx.steps) {
        return None;
    }
    let first_text = ctx.text_turns.iter().find(|t| !t.malformed)?;
    finding(
        "finished-without-submit",
        first_text.message,
        "answered in text; the completion/commit tool was never called".into(),
        Vec::new(),
    )
}

fn repeated_failing_call(ctx: &Ctx<'_>) -> Option<Finding> {
    let mut failed: BTreeMap<String, usize> = BTreeMap::new();
    for step in ctx.steps {
        if !step.error {
            continue;
        }
        let key = step.call.canonical();
        if let Some(times) = failed.get_mut(&key) {
            *times += 1;
            return finding(
                "repeated-failing-call",
                step.message,
                format!("repeated the failing call {}", cut(&key, 120)),
                vec![step.call.name.clone()],
            );
        }
        failed.insert(key, 1);
    }
    None
}

fn unknown_schema_name(ctx: &Ctx<'_>) -> Option<Finding> {
    static RE: OnceLock<Regex> = OnceLock::new();
    let pattern = re(
        &RE,
        r"(?i)no such (column|table)|unknown column|table `[^`]*` doesn't exist",
    );
    let (step, evidence) = ctx.steps.iter().find_map(|s| {
        if !s.error {
            return None;
        }
        let observation = s.observation.as_deref()?;
        if pattern.is_match(observation) {
            return Some((s, format!("failed: {}", cut(observation, 120))));
        }
        unquoted_name(ctx.trajectory, s).map(|name| {
            (
                s,
                format!(
                    "wrote the name `{name}` without quotes: {}",
                    cut(observation, 120)
                ),
            )
        })
    })?;
    finding(
        "unknown-schema-name",
        step.message,
        format!("{} {evidence}", cut(&step.call.canonical(), 120)),
        vec![step.call.name.clone()],
    )
}

/// The name with spaces that `step`'s statement wrote unquoted, read from a syntax error
/// `near "X"` where the statement has `W X` and `W X` is a name an earlier message of the
/// episode (the task, its schema, an observation) gives. A table called `League Table`
/// written bare reads as the table `League` followed by a stray word.
fn unquoted_name(trajectory: &Trajectory, step: &Step) -> Option<String> {
    static NEAR: OnceLock<Regex> = OnceLock::new();
    let near = re(&NEAR, r#"(?i)near "([^"]+)": syntax error"#);
    let token = near
        .captures(step.observation.as_deref()?)?
        .get(1)?
        .as_str();
    let statement: Vec<&str> = step
        .call
        .arguments
        .as_object()?
        .values()
        .filter_map(Value::as_str)
        .collect();
    let preceding = Regex::new(&format!(r"([\w]+)\s+{}\b", regex::escape(token))).ok()?;
    let given: Vec<&str> = trajectory.messages[..step.message]
        .iter()
        .filter(|m| m.source != Source::Policy)
        .map(|m| m.content.as_str())
        .collect();
    statement.iter().find_map(|text| {
        preceding.captures_iter(text).find_map(|c| {
            let name = format!("{} {token}", c.get(1)?.as_str());
            given.iter().any(|g| g.contains(&name)).then_some(name)
        })
    })
}

fn is_lookup(name: &str) -> bool {
    name.contains("docs") || name.contains("schema")
}

fn call_without_docs(ctx: &Ctx<'_>) -> Option<Finding> {
    let first_error = ctx
        .steps
        .iter()
        .position(|s| s.error && s.call.name == "call_api")?;
    if ctx.steps[..first_error]
        .iter()
        .any(|s| is_lookup(&s.call.name))
    {
        return None;
    }
    let step = &ctx.steps[first_error];
    finding(
        "call-without-docs",
        step.message,
        format!(
            "called {} before reading any documentation: {}",
            api_name(&step.call),
            cut(step.observation.as_deref().unwrap_or_default(), 120)
        ),
        vec![step.call.name.clone()],
    )
}

fn stale_code(ctx: &Ctx<'_>) -> Option<Finding> {
    static RE: OnceLock<Regex> = OnceLock::new();
    let pattern = re(
        &RE,
        r"(?i)\bcode\b.*\b(wrong|expired|invalid)\b|\b(wrong|expired|invalid)\b.*\bcode\b",
    );
    let step = ctx.steps.iter().find(|s| {
        s.error
            && s.observation
                .as_deref()
                .is_some_and(|o| pattern.is_match(o))
    })?;
    finding(
        "stale-code",
        step.message,
        format!(
            "{} was refused: the code was stale or wrong",
            api_name(&step.call)
        ),
        vec![step.call.name.clone()],
    )
}

/// Whether a step changes state (an AppWorld write API, a DBBench INSERT/UPDATE/DELETE).
fn is_write(step: &Step) -> bool {
    static API: OnceLock<Regex> = OnceLock::new();
    static SQL: OnceLock<Regex> = OnceLock::new();
    if step.call.name == "call_api" {
        return re(
            &API,
            r"^(send_|create_|add_|remove_|like_|unlike_|reset_|update_)",
        )
        .is_match(&api_name(&step.call));
    }
    if step.call.name == "execute_sql" {
        let query = step
            .call
            .arguments
            .get("query")
            .and_then(Value::as_str)
            .unwrap_or("");
        return re(&SQL, r"(?i)^\s*(insert|update|delete)\b").is_match(query);
    }
    false
}

fn is_read(step: &Step) -> bool {
    static API: OnceLock<Regex> = OnceLock::new();
    static SQL: OnceLock<Regex> = OnceLock::new();
    if step.call.name == "call_api" {
        return re(&API, r"^(show_|list_|get_|search_)").is_match(&api_name(&step.call));
    }
    if step.call.name == "execute_sql" {
        let query = step
            .call
            .arguments
            .get("query")
            .and_then(Value::as_str)
            .unwrap_or("");
        return re(&SQL, r"(?i)^\s*select\b").is_match(query);
    }
    false
}

fn no_readback(ctx: &Ctx<'_>) -> Option<Finding> {
    let last_write = ctx.steps.iter().rposition(|s| is_write(s) && !s.error)?;
    if ctx.steps[last_write + 1..]
        .iter()
        .any(|s| is_read(s) && !s.error)
    {
        return None;
    }
    let step = &ctx.steps[last_write];
    // The explaining decision is finishing without a read, so the evidence sits at the end.
    finding(
        "no-readback",
        ctx.trajectory.messages.len(),
        format!(
            "{} changed state and nothing read the result back",
            api_name(&step.call)
        ),
        vec![step.call.name.clone()],
    )
}

/// After its last successful SQL change the episode only read, at least twice, and never
/// committed: checking the finished change took the place of the commit (one read-back is a
/// check; a second is the decision not to commit).
fn no_commit_after_change(ctx: &Ctx<'_>) -> Option<Finding> {
    if submitted(ctx.steps) {
        return None;
    }
    let last_write = ctx
        .steps
        .iter()
        .rposition(|s| s.call.name == "execute_sql" && is_write(s) && !s.error)?;
    let after = &ctx.steps[last_write + 1..];
    if after.len() < 2 || !after.iter().all(|s| is_read(s) && !s.error) {
        return None;
    }
    let change = &ctx.steps[last_write];
    finding(
        "no-commit-after-change",
        after[0].message,
        format!(
            "{} succeeded ({}), then {} checks and no commit",
            cut(&change.call.canonical(), 120),
            cut(change.observation.as_deref().unwrap_or_default(), 60),
            after.len()
        ),
        vec![change.call.name.clone()],
    )
}

fn edit_path(step: &Step) -> Option<&str> {
    matches!(step.call.name.as_str(), "replace" | "create_file")
        .then(|| step.call.arguments.get("path").and_then(Value::as_str))
        .flatten()
}

fn is_test_file(path: &str) -> bool {
    static RE: OnceLock<Regex> = OnceLock::new();
    re(&RE, r"(^|/)tests?/|(^|/)test_[^/]*\.py$|_test\.py$").is_match(path)
}

fn edit_without_retest(ctx: &Ctx<'_>) -> Option<Finding> {
    let last_edit = ctx
        .steps
        .iter()
        .rposition(|s| !s.error && edit_path(s).is_some_and(|p| !is_test_file(p)))?;
    if ctx.steps[last_edit + 1..]
        .iter()
        .any(|s| s.call.name == "run_tests")
    {
        return None;
    }
    let step = &ctx.steps[last_edit];
    // As for read-back: the decision that explains the failure is finishing untested.
    finding(
        "edit-without-retest",
        ctx.trajectory.messages.len(),
        format!(
            "edited {} and never re-ran the failing tests afterwards",
            edit_path(step).unwrap_or_default()
        ),
        vec!["run_tests".to_string()],
    )
}

fn edited_tests(ctx: &Ctx<'_>) -> Option<Finding> {
    let step = ctx
        .steps
        .iter()
        .find(|s| !s.error && edit_path(s).is_some_and(is_test_file))?;
    finding(
        "edited-tests",
        step.message,
        format!(
            "edited the test file {} instead of the code",
            edit_path(step).unwrap_or_default()
        ),
        vec![step.call.name.clone()],
    )
}

fn context_overflow(ctx: &Ctx<'_>) -> Option<Finding> {
    let t = ctx.trajectory;
    (t.termination == Termination::ContextLimit).then(|| Finding {
        kind: "context-overflow",
        at: t.messages.len(),
        evidence: format!(
            "the context passed its token limit after {} actions",
            t.counts.env_actions
        ),
        tools: Vec::new(),
    })
}

fn malformed_action(ctx: &Ctx<'_>) -> Option<Finding> {
    let malformed: Vec<&TextTurn> = ctx.text_turns.iter().filter(|t| t.malformed).collect();
    (malformed.len() >= 2).then(|| Finding {
        kind: "malformed-action",
        at: malformed[0].message,
        evidence: format!(
            "{} turns held tool calls that could not be parsed",
            malformed.len()
        ),
        tools: Vec::new(),
    })
}

fn cut(text: &str, max: usize) -> String {
    if text.chars().count() <= max {
        text.to_string()
    } else {
        format!("{}...", text.chars().take(max).collect::<String>())
    }
}
