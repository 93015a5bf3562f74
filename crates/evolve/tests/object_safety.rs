//! The seams of harness-evolve are object safe: runs wire them as trait objects.

use std::sync::Arc;

use harness_evolve::meta_harness::Proposer;
use harness_evolve::{Analyst, BuiltinEditor, Editor, PolicySource, RuleAnalyst};

fn _analyst(_: &dyn Analyst) {}
fn _editor(_: &dyn Editor) {}
fn _proposer(_: &dyn Proposer) {}
fn _policy_source(_: &dyn PolicySource) {}

#[test]
fn seams_are_object_safe() {
    let analyst: Arc<dyn Analyst> = Arc::new(RuleAnalyst);
    let editor: Arc<dyn Editor> = Arc::new(BuiltinEditor);
    assert_eq!(analyst.name(), "rule-analyst");
    assert_eq!(editor.name(), "builtin-editor");
    assert_eq!(analyst.usage().calls + editor.usage().calls, 0);
}
