//! Every malformed harness file in `tests/data/bad_harnesses` fails to load with an error that
//! names the file, the JSON path and what was expected; none panics.

use std::path::PathBuf;

use harness_core::Harness;

/// File name, then fragments the error message must contain.
const EXPECTED: &[(&str, &[&str])] = &[
    (
        "unknown_field.json",
        &["unknown field `hookz`", "expected one of", "`prompt_rules`"],
    ),
    (
        "wrong_type.json",
        &[
            "at `limits.max_model_calls`",
            "invalid type: string \"thirty\", expected u32",
        ],
    ),
    (
        "unknown_condition.json",
        &[
            "at `hooks.pager.condition`",
            "unknown condition `pages_left`",
            "pagination_present",
        ],
    ),
    (
        "unknown_event.json",
        &[
            "at `hooks.pager.event`",
            "unknown variant `after_model`",
            "`after_tool`",
        ],
    ),
    (
        "dangling_slot.json",
        &[
            "at `prompt.system`",
            "`{action_guidance}` is a dangling slot",
        ],
    ),
    (
        "rule_missing_slot.json",
        &[
            "at `prompt_rules.intersect.slot`",
            "missing slot `action_guidance`",
            "guidance",
        ],
    ),
    ("truncated.json", &["EOF while parsing"]),
    (
        "zero_limit.json",
        &[
            "at `limits.max_env_actions`",
            "expected a limit of at least 1",
        ],
    ),
    (
        "missing_parameter.json",
        &[
            "at `hooks.low-budget.parameters`",
            "needs parameter `threshold`",
        ],
    ),
    (
        "bad_parameter_type.json",
        &[
            "at `hooks.low-budget.parameters.threshold`",
            "expected an integer >= 0, found -3",
        ],
    ),
    (
        "block_after_tool.json",
        &["at `hooks.stop.event`", "`before_tool` or `before_finish`"],
    ),
    (
        "bad_regex.json",
        &[
            "at `skills.paging.trigger`",
            "not a valid regular expression",
        ],
    ),
    (
        "unbalanced_brace.json",
        &["at `prompt.system`", "not a placeholder name"],
    ),
    (
        "unused_slot.json",
        &["at `prompt.slots.guidance`", "never used"],
    ),
    (
        "not_an_object.json",
        &["at the document root", "expected struct Harness"],
    ),
];

#[test]
fn every_malformed_file_gives_its_expected_error() {
    let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/data/bad_harnesses");
    let mut seen = 0;
    for entry in std::fs::read_dir(&dir).expect("fixture directory") {
        let path = entry.expect("entry").path();
        let file = path
            .file_name()
            .and_then(|n| n.to_str())
            .expect("name")
            .to_string();
        let (_, fragments) = EXPECTED
            .iter()
            .find(|(name, _)| *name == file)
            .unwrap_or_else(|| panic!("{file} has no expected error in this test"));
        let error = Harness::load(&path).expect_err(&file).to_string();
        assert!(
            error.starts_with(&path.display().to_string()),
            "{file}: error does not name the file: {error}"
        );
        for fragment in *fragments {
            assert!(
                error.contains(fragment),
                "{file}: `{error}` lacks `{fragment}`"
            );
        }
        seen += 1;
    }
    assert_eq!(seen, EXPECTED.len(), "every expected case has a file");
}

#[test]
fn missing_file_names_the_path() {
    let error = Harness::load("/nonexistent/h0.json")
        .expect_err("missing")
        .to_string();
    assert!(error.contains("/nonexistent/h0.json"), "{error}");
}

#[test]
fn paper_table7_hooks_and_rules_parse() {
    let h = Harness::from_json(
        r#"{"name": "S6", "prompt": {"system": "{action_guidance}", "slots": {"action_guidance": ""}},
            "prompt_rules": {"reconcile-before-side-effect": {"slot": "action_guidance",
                "text": "If the request combines conditions, fetch each separately and intersect."}},
            "hooks": {
              "pagination-completion-guidance": {"action": "warn", "condition": "pagination_present",
                "event": "after_tool", "message": "Pagination metadata is present.", "parameters": {}},
              "low-budget-completion": {"action": "warn", "condition": "remaining_steps_lte",
                "event": "after_tool", "message": "Budget is low.", "parameters": {"threshold": 3}}}}"#,
    )
    .expect("parses");
    h.validate().expect("valid");
    assert_eq!(h.compile_hooks().expect("compiles").len(), 2);
}
