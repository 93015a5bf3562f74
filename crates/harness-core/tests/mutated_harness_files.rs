//! `Harness::load` on hostile copies of a valid harness file (issue 25 item 5): cuts, bit flips,
//! huge and negative numbers, invalid UTF-8 and nesting bombs are errors naming the file, never
//! panics, and loading stays within a memory budget.

use harness_core::Harness;
use harness_testkit::mutate::{self, Mutant, TrackingAlloc};

#[global_allocator]
static ALLOC: TrackingAlloc = TrackingAlloc;

/// A harness that uses every component, so that mutants reach every part of the loader:
/// templates with slots, rules, a skill with a trigger, context and memory policies, hooks
/// with integer, regex and name parameters, the tool view, limits and lineage.
const VALID: &str = r#"{
  "name": "H0",
  "description": "a harness touching every component",
  "prompt": {
    "system": "Solve the task. {guidance} Limit: {max_env_actions} actions, {max_model_calls} calls. {{literal}}",
    "user": "{instruction} ({environment})",
    "slots": {"guidance": "Look before you act."}
  },
  "prompt_rules": {"schema-first": {"slot": "guidance", "text": "Read the schema first."}},
  "skills": {"paging": {"text": "Follow next_page until it is null.", "trigger": "page|next_[a-z]+"}},
  "context": {"keep_last_observations": 4, "elision_text": "[omitted]"},
  "memory": {"enabled": true, "auto_notes": true, "note_tool": true, "max_notes": 12, "note_chars": 120},
  "hooks": {
    "low-budget": {"action": "warn", "condition": "remaining_steps_lte", "event": "after_tool",
                   "message": "3 actions left", "parameters": {"threshold": 3}},
    "loop": {"action": "block", "condition": "repeated_action", "event": "before_tool",
             "message": "you repeat yourself", "parameters": {"n": 3}},
    "paged": {"action": "warn", "condition": "observation_matches", "event": "after_tool",
              "message": "more pages", "parameters": {"pattern": "next_page\\s*:\\s*\\d+"}},
    "submit": {"action": "require", "condition": "tool_called", "event": "before_finish",
               "message": "look first", "parameters": {"name": "list"}}
  },
  "tool_view": {"include": ["list", "submit"], "hide": [], "docs": {"list": "Lists items."},
                "max_observation_chars": 2000, "format": "tool_call"},
  "limits": {"max_model_calls": 32, "max_env_actions": 30, "max_context_tokens": 65532,
             "max_output_tokens": 8192},
  "lineage": {"parent": "0123456789abcdef", "generation": 2, "direction": "paging",
              "notes": ["from H0"], "causes": ["pagination_missed"],
              "local_eval": {"tasks": 30, "targeted_failures": 10, "controls": 10,
                             "repaired": ["t1"], "regressed": [], "success_rate": 0.5}}
}
"#;

/// Generous for a file of a few kilobytes; a loader that allocates by a count it read would
/// need far more.
const BUDGET: usize = 16 << 20;

#[test]
fn mutated_harness_files_are_errors_never_panics() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("mutated.json");
    std::fs::write(&file, VALID).unwrap();
    Harness::load(&file).expect("the valid harness loads");

    let mut mutants = mutate::text_mutants(VALID.as_bytes(), 25);
    mutants.extend(mutate::json_depth_bombs());
    // Invalid UTF-8 inside a string, and a string with a NUL byte.
    let mut latin1 = VALID.as_bytes().to_vec();
    let at = VALID.find("Solve").unwrap();
    latin1[at] = 0xe9;
    mutants.push(Mutant::new("a Latin-1 byte in the system prompt", latin1));
    mutants.push(Mutant::new(
        "a NUL escape in a hook name",
        VALID.replace("\"loop\"", "\"lo\\u0000op\""),
    ));
    // Hook parameters nested as deep as serde_json allows and deeper.
    for depth in [100, 200, 10_000] {
        let nested = format!("{}3{}", "[".repeat(depth), "]".repeat(depth));
        mutants.push(Mutant::new(
            format!("a hook parameter nested {depth} deep"),
            VALID.replace(
                "{\"threshold\": 3}",
                &format!("{{\"threshold\": {nested}}}"),
            ),
        ));
    }
    let load = |what: &str, bytes: &[u8]| {
        assert!(bytes != VALID.as_bytes(), "{what}: not a mutant");
        std::fs::write(&file, bytes).unwrap();
        mutate::check(what, &file, BUDGET, || Harness::load(&file))
    };
    let mut refused = 0;
    for Mutant { what, bytes } in &mutants {
        if let mutate::MutantOutcome::Refused(_) = load(what, bytes) {
            refused += 1;
        }
    }
    // Most mutants break the file; a run where nothing is refused tests nothing.
    assert!(
        refused * 2 > mutants.len(),
        "{refused} of {}",
        mutants.len()
    );

    // Regular expressions that compile into huge automata are refused by the pattern's size
    // limit, at their field, before they take more than a megabyte or so.
    for pattern in [
        "(a{1000}){1000}",
        "\\\\w{100000}",
        "[\\\\s\\\\S]{65535}{65535}",
    ] {
        for (field, valid) in [
            ("skills.paging.trigger", "page|next_[a-z]+"),
            (
                "hooks.paged.parameters.pattern",
                "next_page\\\\s*:\\\\s*\\\\d+",
            ),
        ] {
            let what = format!("{field} = {pattern}");
            match load(&what, VALID.replace(valid, pattern).as_bytes()) {
                mutate::MutantOutcome::Refused(e) => {
                    assert!(e.contains(field) && e.contains("size limit"), "{what}: {e}")
                }
                mutate::MutantOutcome::Loaded => panic!("{what}: loaded"),
            }
        }
    }
}
