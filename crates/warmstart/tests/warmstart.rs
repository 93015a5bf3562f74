//! The warm start on its tiny preset: deterministic demonstrations, planted behaviour only where
//! a hook message prompts for it, the cache, and errors that name the bad setting.

use harness_core::{Role, Source, TrajectoryMessage};
use harness_warmstart::environment::{COMMIT_AFTER_CHANGE_HOOK, LOW_BUDGET_HOOK, RECOVERY_HOOK};
use harness_warmstart::{
    Demonstration, Family, WarmStartSettings, cache_dir_name, demonstrations, warm_start,
};

fn demos(settings: &WarmStartSettings) -> Vec<Demonstration> {
    futures::executor::block_on(demonstrations(settings, &mut |_| {}))
        .unwrap()
        .1
}

#[test]
fn demonstrations_are_deterministic_in_the_seed() {
    let settings = WarmStartSettings::tiny();
    let a = demos(&settings);
    let b = demos(&settings);
    assert_eq!(a.len(), settings.demo_tasks);
    for (x, y) in a.iter().zip(&b) {
        assert_eq!(x.trajectory.messages, y.trajectory.messages);
        assert_eq!(x.trajectory.turns, y.trajectory.turns);
        assert_eq!(x.harness, y.harness);
    }
    let other = demos(&WarmStartSettings {
        seed: 1,
        ..settings.clone()
    });
    assert!(
        a.iter()
            .zip(&other)
            .any(|(x, y)| x.trajectory.messages != y.trajectory.messages)
    );
}

/// The hooks whose messages appear since the last policy turn before message `i`.
fn hooks_before(messages: &[TrajectoryMessage], i: usize) -> Vec<&str> {
    let start = messages[..i]
        .iter()
        .rposition(|m| m.role == Role::Assistant)
        .map_or(0, |p| p + 1);
    messages[start..i]
        .iter()
        .filter(|m| m.source == Source::Harness)
        .filter_map(|m| m.hook.as_deref())
        .collect()
}

/// Whether a hook prompting for the behaviour of `hook` fired (the built-in editor's
/// reminders count as the hand-written hooks they paraphrase).
fn told(hooks: &[&str], hook: &str) -> bool {
    harness_warmstart::environment::same_behaviour(hook)
        .iter()
        .any(|h| hooks.contains(h))
}

fn is_commit(text: &str) -> bool {
    text.contains("commit_final_answer")
}

#[test]
fn planted_good_behaviour_appears_only_where_a_hook_message_prompts_for_it() {
    let settings = WarmStartSettings {
        demo_tasks: 132,
        ..WarmStartSettings::tiny()
    };
    let demos = demos(&settings);
    let mut prompted = [0usize; 3];
    for d in &demos {
        let m = &d.trajectory.messages;
        let turns: Vec<usize> = (0..m.len())
            .filter(|&i| m[i].role == Role::Assistant)
            .collect();
        for (n, &i) in turns.iter().enumerate() {
            let hooks = hooks_before(m, i);
            let text = &m[i].content;
            match d.family {
                Family::Change if n >= 1 => {
                    let told =
                        told(&hooks, COMMIT_AFTER_CHANGE_HOOK) || told(&hooks, LOW_BUDGET_HOOK);
                    if told {
                        prompted[0] += 1;
                        assert!(
                            is_commit(text),
                            "{}: told to commit: {text}",
                            d.trajectory.task_id
                        );
                    } else if is_commit(text) {
                        assert!(d.unprompted_good && n == 1, "{}", d.trajectory.task_id);
                    }
                }
                Family::Recheck if n >= 1 => {
                    if told(&hooks, LOW_BUDGET_HOOK) {
                        prompted[1] += 1;
                        assert!(is_commit(text), "{}: {text}", d.trajectory.task_id);
                    } else if is_commit(text) {
                        assert!(d.unprompted_good && n == 1, "{}", d.trajectory.task_id);
                    }
                }
                Family::Quoting if n >= 1 => {
                    let recovered = text.contains('`');
                    if told(&hooks, RECOVERY_HOOK) {
                        prompted[2] += 1;
                        assert!(recovered, "{}: {text}", d.trajectory.task_id);
                    } else if recovered {
                        assert!(d.unprompted_good, "{}", d.trajectory.task_id);
                    }
                }
                _ => {}
            }
        }
        // Nothing is planted in the plain family: its demonstrations succeed under every harness
        // (unless the tiny preset's small vocabulary cut a long answer at the token limit).
        let cut = d
            .trajectory
            .turns
            .iter()
            .any(|t| t.finish == harness_core::FinishReason::Length);
        if d.family == Family::Plain && !cut {
            assert!(d.trajectory.is_success(), "{}", d.trajectory.task_id);
        }
        // An unprompted planted episode under H0 fails.
        if d.family != Family::Plain && !d.unprompted_good && !d.prompted() && d.planted() {
            assert!(!d.trajectory.is_success(), "{}", d.trajectory.task_id);
        }
    }
    assert!(prompted.iter().all(|&n| n > 0), "{prompted:?}");
}

#[test]
fn a_second_call_loads_the_cache() {
    let root = tempfile::tempdir().unwrap();
    let settings = WarmStartSettings::tiny();
    let mut events = Vec::new();
    let first = warm_start(&settings, root.path(), &mut |p| events.push(p)).unwrap();
    assert!(!first.cached);
    assert!(first.report.steps == settings.sft_steps && first.report.final_loss.is_finite());
    assert_eq!(
        first.checkpoint.file_name().unwrap().to_str().unwrap(),
        cache_dir_name(&settings)
    );
    for file in ["config.json", "model.safetensors", "tokenizer.json"] {
        assert!(first.checkpoint.join(file).exists(), "{file}");
    }
    let second = warm_start(&settings, root.path(), &mut |_| {}).unwrap();
    assert!(second.cached);
    assert_eq!(second.checkpoint, first.checkpoint);
    assert_eq!(second.report, first.report);
    assert_eq!(second.base, first.base);
    assert_eq!(second.siblings, first.siblings);
    // Only the finished folder is left behind.
    let entries: Vec<_> = std::fs::read_dir(root.path()).unwrap().collect();
    assert_eq!(entries.len(), 1);
    let model = second.load_model().unwrap();
    assert_eq!(
        model.tokenizer.get_vocab_size(true),
        first.report.vocab_size
    );
    assert!(first.base.hooks.is_empty() && first.siblings.len() == 3);
    assert_eq!(first.environment().name(), first.env);
}

#[test]
fn bad_settings_are_refused_naming_the_field() {
    let root = tempfile::tempdir().unwrap();
    let mut settings = WarmStartSettings::tiny();
    settings.model.num_kv_heads = 3;
    let err = warm_start(&settings, root.path(), &mut |_| {})
        .unwrap_err()
        .to_string();
    assert!(err.contains("model.num_kv_heads"), "{err}");
    let err = WarmStartSettings::from_json(r#"{"seed": 1, "demos": 5}"#)
        .unwrap_err()
        .to_string();
    assert!(err.contains("demos"), "{err}");
}

#[test]
fn the_checkpoint_is_deterministic_in_the_seed() {
    let settings = WarmStartSettings::tiny();
    let weights = |root: &std::path::Path| {
        let started = warm_start(&settings, root, &mut |_| {}).unwrap();
        (
            std::fs::read(started.checkpoint.join("model.safetensors")).unwrap(),
            std::fs::read(started.checkpoint.join("tokenizer.json")).unwrap(),
        )
    };
    let (a, b) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    assert_eq!(weights(a.path()), weights(b.path()));
}

#[test]
fn under_prompt_rules_the_rule_repairs_before_the_decision_and_hooks_repair_nothing() {
    use harness_warmstart::organism::{CHANGE_RULE, QUOTING_RULE};
    let settings = WarmStartSettings {
        organism: harness_warmstart::Organism::PromptRules,
        demo_tasks: 160,
        unprompted_good_rate: 0.0,
        ..WarmStartSettings::tiny()
    };
    let (base, siblings) = harness_warmstart::harnesses(&settings);
    let by_name = |name: &str| {
        siblings
            .iter()
            .chain(std::iter::once(&base))
            .chain(harness_warmstart::editor_repairs(&base).iter())
            .find(|h| h.name == name)
            .cloned()
    };
    let mut ruled_successes = [0usize; 2];
    for d in demos(&settings) {
        let Some(harness) = by_name(&d.harness) else {
            continue;
        };
        let texts = d.turns();
        let rule = match d.family {
            Family::Change => CHANGE_RULE,
            Family::Quoting => QUOTING_RULE,
            // Not planted in this variant: solved under every harness.
            Family::Recheck => {
                assert!(!d.planted(), "{}", d.trajectory.task_id);
                assert_eq!(texts.len(), 2, "{}", d.trajectory.task_id);
                continue;
            }
            Family::Plain => continue,
        };
        let ruled = harness.prompt_rules.contains_key(rule);
        assert_eq!(d.prompted(), ruled, "{}", d.trajectory.task_id);
        match d.family {
            Family::Change if texts.len() >= 2 => {
                // The decision after the change: commit under the rule, check otherwise (hook
                // messages included).
                assert_eq!(is_commit(texts[1]), ruled, "{}: {}", d.harness, texts[1]);
                if ruled {
                    ruled_successes[0] += 1;
                }
            }
            Family::Quoting => {
                // The decision is the first statement: quoted under the rule.
                let quoted = texts[0].contains('`');
                if ruled {
                    assert!(quoted, "{}: {}", d.harness, texts[0]);
                    ruled_successes[1] += 1;
                } else if d.planted() {
                    assert!(!quoted && !d.trajectory.is_success(), "{}", d.harness);
                }
            }
            _ => {}
        }
    }
    assert!(
        ruled_successes.iter().all(|&n| n > 0),
        "{ruled_successes:?}"
    );
}
