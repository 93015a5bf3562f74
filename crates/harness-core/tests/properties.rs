//! Property tests of the loop and of harness data: limits always hold and every termination
//! reason is right; hooks fire exactly when their condition holds; harness JSON round-trips with
//! a stable id; an edit followed by its inverse gives back the same harness.

use std::collections::BTreeMap;

use async_trait::async_trait;
use futures::executor::block_on;
use harness_core::{
    EditOp, EnvSession, Environment, Harness, HarnessEdit, Observation, Outcome, Result, Role,
    Source, Split, Task, Termination, ToolCall, ToolKind, ToolSpec, run_episode,
};
use harness_testkit::ScriptedPolicy;
use proptest::prelude::*;
use serde_json::{Value, json};

/// Tools whose observations are fixed by name: `page` is paginated, `bad` fails, `lookup` is a
/// schema lookup, `submit` ends the episode, `ok` just succeeds.
struct ProbeEnv;

struct ProbeSession;

const TOOLS: [&str; 5] = ["ok", "page", "bad", "lookup", "submit"];

#[async_trait]
impl Environment for ProbeEnv {
    fn name(&self) -> &str {
        "probe"
    }
    async fn reset(&self, _task: &Task, _seed: u64) -> Result<Box<dyn EnvSession>> {
        Ok(Box::new(ProbeSession))
    }
}

#[async_trait]
impl EnvSession for ProbeSession {
    fn tools(&self) -> Vec<ToolSpec> {
        TOOLS
            .iter()
            .map(|name| {
                let kind = match *name {
                    "lookup" => ToolKind::Lookup,
                    "submit" => ToolKind::Submit,
                    _ => ToolKind::Action,
                };
                ToolSpec::new(
                    *name,
                    "probe tool",
                    json!({"type": "object", "properties": {"x": {"type": "integer"}}}),
                )
                .with_kind(kind)
            })
            .collect()
    }
    async fn step(&mut self, call: &ToolCall) -> Result<Observation> {
        Ok(match call.name.as_str() {
            "page" => Observation::ok("page 1 of 3").paginated(),
            "bad" => Observation::error("failed"),
            "submit" => Observation::ok("submitted").finished(),
            _ => Observation::ok("fine"),
        })
    }
    async fn verify(&mut self, _final_answer: Option<&str>) -> Result<Outcome> {
        Ok(Outcome::failure(Value::Null))
    }
}

#[derive(Debug, Clone)]
enum Turn {
    Call(usize, u8),
    Unknown,
    Invalid,
    Final,
}

impl Turn {
    fn text(&self) -> String {
        match self {
            Turn::Call(tool, x) => {
                ToolCall::new(TOOLS[*tool], json!({"x": x})).to_tool_call_block()
            }
            Turn::Unknown => ToolCall::new("nope", json!({})).to_tool_call_block(),
            Turn::Invalid => "<tool_call>{broken".into(),
            Turn::Final => "all done".into(),
        }
    }
}

fn turn() -> impl Strategy<Value = Turn> {
    prop_oneof![
        6 => (0..4usize, 0..2u8).prop_map(|(t, x)| Turn::Call(t, x)),
        1 => (0..2u8).prop_map(|x| Turn::Call(4, x)),
        1 => Just(Turn::Unknown),
        1 => Just(Turn::Invalid),
        1 => Just(Turn::Final),
    ]
}

fn base(max_calls: u32, max_actions: u32) -> Harness {
    let mut h = Harness::new("probe-base", "Use the tools.");
    h.limits.max_model_calls = max_calls;
    h.limits.max_env_actions = max_actions;
    h
}

fn task() -> Task {
    Task::new("probe-1", "probe", Split::Train, "probe the tools", 0)
}

/// The loop's contract, written independently: what should end the episode, and when.
fn expected_termination(
    script: &[Turn],
    max_calls: u32,
    max_actions: u32,
) -> (Termination, u32, u32) {
    let (mut calls, mut actions) = (0u32, 0u32);
    loop {
        if calls == max_calls {
            return (Termination::MaxModelCalls, calls, actions);
        }
        let turn = script
            .get(calls as usize)
            .or(script.last())
            .cloned()
            .unwrap_or(Turn::Final);
        calls += 1;
        match turn {
            Turn::Final => return (Termination::PolicyFinished, calls, actions),
            Turn::Invalid | Turn::Unknown => {}
            Turn::Call(tool, _) => {
                actions += 1;
                if TOOLS[tool] == "submit" {
                    return (Termination::EnvDone, calls, actions);
                }
                if actions == max_actions {
                    return (Termination::MaxEnvActions, calls, actions);
                }
            }
        }
    }
}

/// The longest text a scripted [`Turn`] can have, in bytes (a scripted policy's pseudo tokens).
fn longest_turn_text() -> usize {
    let mut all = vec![Turn::Unknown, Turn::Invalid, Turn::Final];
    all.extend((0..TOOLS.len()).flat_map(|t| (0..2u8).map(move |x| Turn::Call(t, x))));
    all.iter().map(|t| t.text().len()).max().unwrap_or(0)
}

/// Output limits: mostly above every scripted text, so that the episode is compared with the
/// independent model; 1 case in 32 small enough to cut turns (which must still respect every
/// limit).
const UNCUT_OUTPUT: u32 = 128;

#[test]
fn limits_hold_and_termination_is_right() {
    use proptest::test_runner::{Config, RngAlgorithm, TestRng, TestRunner};
    use std::cell::Cell;
    assert!(
        longest_turn_text() < UNCUT_OUTPUT as usize,
        "a scripted turn of {} bytes would be cut at {UNCUT_OUTPUT} tokens",
        longest_turn_text()
    );
    let strategy = (
        prop::collection::vec(turn(), 1..40),
        1u32..12,
        1u32..12,
        prop_oneof![1 => 1u32..64, 31 => UNCUT_OUTPUT..512],
    );
    let (cases, compared, cut_cases) = (Cell::new(0u32), Cell::new(0u32), Cell::new(0u32));
    let mut runner = TestRunner::new_with_rng(
        Config::with_cases(256),
        TestRng::deterministic_rng(RngAlgorithm::ChaCha),
    );
    let result = runner.run(&strategy, |(script, max_calls, max_actions, max_output)| {
        cases.set(cases.get() + 1);
        let mut harness = base(max_calls, max_actions);
        harness.limits.max_output_tokens = max_output;
        let texts: Vec<String> = script.iter().map(Turn::text).collect();
        let policy = ScriptedPolicy::new(texts);
        let t = block_on(run_episode(&policy, &harness, &ProbeEnv, &task(), 3)).expect("runs");
        prop_assert!(t.counts.model_calls <= max_calls);
        prop_assert!(t.counts.env_actions <= max_actions);
        prop_assert!(
            t.turns
                .iter()
                .all(|turn| turn.tokens.len() <= max_output as usize)
        );
        // Long turns are cut at the output limit and may no longer parse, so only compare the
        // termination when no turn was cut.
        let cut = t
            .turns
            .iter()
            .any(|turn| turn.finish == harness_core::FinishReason::Length);
        if cut {
            cut_cases.set(cut_cases.get() + 1);
        } else {
            compared.set(compared.get() + 1);
            let (termination, calls, actions) =
                expected_termination(&script, max_calls, max_actions);
            prop_assert_eq!(t.termination, termination);
            prop_assert_eq!(t.counts.model_calls, calls);
            prop_assert_eq!(t.counts.env_actions, actions);
        }
        Ok(())
    });
    if let Err(e) = result {
        panic!("{e}");
    }
    // Shrinking reruns cases only on failure, so these count the 256 drawn cases.
    let (n, c) = (cases.get(), compared.get());
    assert!(
        10 * c >= 9 * n,
        "only {c} of {n} cases reached the comparison with the termination model"
    );
    assert!(cut_cases.get() > 0, "no case exercised cut turns");
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(256))]

    #[test]
    fn context_limit_is_enforced(limit in 1u32..200) {
        let mut harness = base(5, 5);
        harness.limits.max_context_tokens = limit;
        let policy = ScriptedPolicy::new(vec![Turn::Call(0, 0).text()]);
        let t = block_on(run_episode(&policy, &harness, &ProbeEnv, &task(), 3)).expect("runs");
        prop_assert!(t.turns.iter().all(|turn| turn.tokens.is_empty() || turn.context_tokens.len() <= limit as usize));
        if t.termination == Termination::ContextLimit {
            prop_assert!(t.turns.last().is_some_and(|turn| turn.context_tokens.len() > limit as usize));
        }
    }

    #[test]
    fn after_tool_hooks_fire_exactly_when_their_condition_holds(
        calls in prop::collection::vec((0..4usize, 0..2u8), 1..16),
        threshold in 0u32..6,
        n in 2u32..4,
    ) {
        let mut harness = base(40, 30);
        let hook = |condition: &str, parameters: Value| {
            serde_json::from_value(json!({"action": "warn", "event": "after_tool", "condition": condition,
                "message": format!("{condition} fired"), "parameters": parameters})).expect("hook")
        };
        harness.hooks.insert("pag".into(), hook("pagination_present", json!({})));
        harness.hooks.insert("err".into(), hook("tool_error", json!({})));
        harness.hooks.insert("low".into(), hook("remaining_steps_lte", json!({"threshold": threshold})));
        harness.hooks.insert("rep".into(), hook("repeated_action", json!({"n": n})));
        harness.hooks.insert("nolookup".into(), hook("no_schema_lookup_before_first_call", json!({})));
        harness.validate().expect("valid");
        let mut texts: Vec<String> = calls.iter().map(|(t, x)| Turn::Call(*t, *x).text()).collect();
        texts.push(Turn::Final.text());
        let t = block_on(run_episode(&ScriptedPolicy::new(texts), &harness, &ProbeEnv, &task(), 3)).expect("runs");
        prop_assert_eq!(t.counts.env_actions as usize, calls.len());

        let mut step = 0usize;
        for (i, m) in t.messages.iter().enumerate() {
            if !(m.source == Source::Environment && m.role == Role::Tool) {
                continue;
            }
            step += 1;
            let fired: Vec<&str> = t.messages[i + 1..]
                .iter()
                .take_while(|m| m.hook.is_some())
                .filter_map(|m| m.hook.as_deref())
                .collect();
            let (tool, _) = calls[step - 1];
            let mut expected = Vec::new();
            if TOOLS[tool] == "bad" { expected.push("err"); }
            if 30 - step as u32 <= threshold { expected.push("low"); }
            if step == 1 && TOOLS[tool] != "lookup" { expected.push("nolookup"); }
            if TOOLS[tool] == "page" { expected.push("pag"); }
            let window = n as usize;
            if step >= window && calls[step - window..step].iter().all(|c| *c == calls[step - 1]) {
                expected.push("rep");
            }
            let mut fired_sorted = fired.clone();
            fired_sorted.sort_unstable();
            expected.sort_unstable();
            prop_assert_eq!(fired_sorted, expected, "step {}", step);
        }
        prop_assert_eq!(step, calls.len());
    }
}

// ---- harness data ----

fn name() -> impl Strategy<Value = String> {
    "[a-z][a-z0-9_-]{0,8}"
}

fn hook_value() -> impl Strategy<Value = Value> {
    prop_oneof![
        (0u32..10).prop_map(
            |t| json!({"action": "warn", "condition": "remaining_steps_lte", "event": "after_tool",
            "message": "Budget is low.", "parameters": {"threshold": t}})
        ),
        Just(
            json!({"action": "warn", "condition": "pagination_present", "event": "after_tool",
            "message": "Keep paginating.", "parameters": {}})
        ),
        (2u32..5).prop_map(
            |n| json!({"action": "block", "condition": "repeated_action", "event": "before_tool",
            "message": "Stop repeating.", "parameters": {"n": n}})
        ),
        Just(
            json!({"action": "require", "condition": "tool_called", "event": "before_finish",
            "message": "Verify first.", "parameters": {"name": "verify"}})
        ),
        "[a-z ]{1,12}".prop_map(
            |p| json!({"action": "warn", "condition": "observation_matches", "event": "on_error",
            "message": "Read the error.", "parameters": {"pattern": p}})
        ),
    ]
}

prop_compose! {
    fn harness()(
        name in name(),
        slots in prop::collection::btree_map(name(), "[A-Za-z .]{0,20}", 1..4),
        rules in prop::collection::vec((name(), "[A-Za-z][A-Za-z .]{0,29}", any::<prop::sample::Index>()), 0..4),
        hooks in prop::collection::btree_map(name(), hook_value(), 0..4),
        skills in prop::collection::btree_map(name(), ("[A-Za-z][A-Za-z .]{0,19}", prop::option::of("[a-z]{1,6}")), 0..3),
        keep in prop::option::of(1u32..10),
        calls in 1u32..64,
        actions in 1u32..64,
    ) -> Harness {
        let slot_names: Vec<String> = slots.keys().cloned().collect();
        let system = slot_names.iter().map(|s| format!("{{{s}}}")).collect::<Vec<_>>().join("\n");
        let mut value = json!({
            "name": name,
            "prompt": {"system": format!("You act. {{{{literal}}}}\n{system}"), "slots": slots},
            "prompt_rules": rules.into_iter().map(|(n, text, idx)| {
                (n, json!({"slot": slot_names[idx.index(slot_names.len())], "text": text}))
            }).collect::<BTreeMap<_, _>>(),
            "hooks": hooks,
            "skills": skills.into_iter().map(|(n, (text, trigger))| (n, json!({"text": text, "trigger": trigger}))).collect::<BTreeMap<_, _>>(),
            "context": {"keep_last_observations": keep},
            "limits": {"max_model_calls": calls, "max_env_actions": actions},
        });
        value["lineage"] = json!({"generation": 1, "notes": ["generated"]});
        let h = Harness::from_value(value).expect("generated harness parses");
        h.validate().expect("generated harness is valid");
        h
    }
}

/// JSON text with object keys in reverse order and extra whitespace.
fn scrambled(value: &Value) -> String {
    match value {
        Value::Object(map) => {
            let mut keys: Vec<&String> = map.keys().collect();
            keys.reverse();
            let body: Vec<String> = keys
                .into_iter()
                .map(|k| format!("\n  {} :  {}", Value::String(k.clone()), scrambled(&map[k])))
                .collect();
            format!("{{ {} }}", body.join(" ,"))
        }
        Value::Array(items) => format!(
            "[ {} ]",
            items.iter().map(scrambled).collect::<Vec<_>>().join(" , ")
        ),
        other => other.to_string(),
    }
}

fn edit_op(h: &Harness) -> impl Strategy<Value = EditOp> + use<> {
    let hook_names: Vec<String> = h
        .hooks
        .keys()
        .cloned()
        .chain(["fresh".to_string()])
        .collect();
    let rule_names: Vec<String> = h
        .prompt_rules
        .keys()
        .cloned()
        .chain(["fresh".to_string()])
        .collect();
    let slot = h.prompt.slots.keys().next().cloned().unwrap_or_default();
    prop_oneof![
        (prop::sample::select(hook_names.clone()), hook_value())
            .prop_map(|(n, v)| EditOp::set(format!("state.hooks.{n}"), v)),
        prop::sample::select(hook_names).prop_map(|n| EditOp::remove(format!("state.hooks.{n}"))),
        (prop::sample::select(rule_names.clone()), "[a-z][a-z ]{0,9}").prop_map(move |(n, t)| {
            EditOp::set(
                format!("state.prompt_rules.{n}"),
                json!({"slot": slot, "text": t}),
            )
        }),
        prop::sample::select(rule_names)
            .prop_map(|n| EditOp::remove(format!("state.prompt_rules.{n}"))),
        (1u32..50).prop_map(|v| EditOp::set("state.limits.max_env_actions", json!(v))),
        Just(EditOp::remove("state.limits")),
        Just(EditOp::remove("state.context")),
        (name(), "[a-z][a-z ]{0,9}")
            .prop_map(|(n, t)| EditOp::set(format!("state.skills.{n}"), json!({"text": t}))),
    ]
}

fn harness_and_edit() -> impl Strategy<Value = (Harness, HarnessEdit)> {
    harness().prop_flat_map(|h| {
        let ops = prop::collection::vec(edit_op(&h), 1..5);
        (
            Just(h),
            ops.prop_map(|ops| HarnessEdit::new(ops, "random edit")),
        )
    })
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(256))]

    #[test]
    fn harness_json_round_trips_with_stable_id(h in harness()) {
        let text = h.to_json_pretty();
        let back = Harness::from_json(&text).expect("round trip parses");
        prop_assert_eq!(&back, &h);
        prop_assert_eq!(back.id(), h.id());
        let scrambled = Harness::from_json(&scrambled(&h.to_value())).expect("scrambled parses");
        prop_assert_eq!(scrambled.id(), h.id());
        // Name and lineage do not change the id; behaviour does.
        let mut renamed = h.clone();
        renamed.name.push_str("-copy");
        renamed.lineage.generation += 1;
        prop_assert_eq!(renamed.id(), h.id());
        let mut changed = h.clone();
        changed.limits.max_model_calls += 1;
        prop_assert_ne!(changed.id(), h.id());
    }

    #[test]
    fn edit_then_inverse_gives_back_the_harness((h, edit) in harness_and_edit()) {
        // Every generated operation is valid, so the edit must apply.
        let (edited, inverse) = edit.apply_with_inverse(&h).expect("edit applies");
        let restored = inverse.apply(&edited).expect("inverse applies");
        prop_assert_eq!(restored, h.clone());
        // The diff reproduces the edit's effect.
        let diff = HarnessEdit::diff(&h, &edited);
        prop_assert_eq!(diff.is_empty(), edited.id() == h.id() && edited.name == h.name);
        prop_assert_eq!(diff.apply(&h).expect("diff applies"), edited);
    }
}
