//! The decision-point probe reads the policy's preference at each planted family's decision:
//! it covers the families that have a decision point, and fine-tuning on good decisions of one
//! family raises that family's probability of the good decision.

use std::sync::Arc;

use grpo_candle::train::sft::{SftConfig, SftTrainer, sft_sequences};
use grpo_candle::{CandlePolicy, PolicyOptions, TeacherForcedPolicy};
use harness_core::{Environment, EpisodeOptions, Split, run_episode_with};
use harness_envs::dbbench::{DbBench, GeneratorConfig};
use harness_warmstart::Organism;
use harness_warmstart::demo::{Cues, DemoScript};
use harness_warmstart::environment::{CompactDbBench, compact_base};
use harness_warmstart::{Family, WarmStartSettings, demonstrations, probe_decisions};

/// A student with a tokenizer fitted on more demonstrations than the tiny preset's (so that
/// statements fit the episode's output limit in its tokens), H0, and DBBench tasks of seed 3.
async fn rig(
    organism: Organism,
    train: usize,
    test: usize,
) -> (Arc<CandlePolicy>, harness_core::Harness, CompactDbBench) {
    let settings = WarmStartSettings {
        demo_tasks: 88,
        vocab_size: 1200,
        organism,
        ..WarmStartSettings::tiny()
    };
    let (model, _) = demonstrations(&settings, &mut |_| {}).await.unwrap();
    let student = Arc::new(CandlePolicy::new(model, PolicyOptions::default()));
    let h0 = compact_base(&settings.limits);
    let env = CompactDbBench::new(DbBench::generated(&GeneratorConfig {
        seed: 3,
        train,
        validation: 0,
        test,
    }));
    (student, h0, env)
}

#[tokio::test]
async fn the_probe_covers_planted_families_and_follows_fine_tuning_on_good_decisions() {
    let (student, h0, env) = rig(Organism::RecoveryHooks, 66, 22).await;
    let test = env.tasks(Split::Test).unwrap();

    let before = probe_decisions(&student, &h0, &test, 1, Organism::RecoveryHooks)
        .await
        .unwrap();
    // Every family with a decision point is probed on each of its tasks that reach it.
    let count = |f: Family| {
        test.iter()
            .filter(|t| Family::of_task(t) == Some(f))
            .count()
    };
    assert_eq!(before["change"].tasks, count(Family::Change));
    assert_eq!(before["recheck"].tasks, count(Family::Recheck));
    assert!(!before.contains_key("plain"));
    for (family, p) in &before {
        assert!(p.tasks > 0, "{family}");
        assert!(p.p_good > 0.0 && p.p_good < 1.0, "{family}: {p:?}");
    }
    assert_eq!(
        before,
        probe_decisions(&student, &h0, &test, 1, Organism::RecoveryHooks)
            .await
            .unwrap(),
        "the probe is deterministic"
    );

    // Fine-tune on the good decision of the change family only (commit after the change),
    // recorded in the student's own tokens on training tasks.
    let hooks = Cues::of(Organism::RecoveryHooks, std::slice::from_ref(&h0));
    let mut good = Vec::new();
    for (i, task) in env.tasks(Split::Train).unwrap().iter().enumerate() {
        if Family::of_task(task) != Some(Family::Change) {
            continue;
        }
        let script = DemoScript::new(task, Arc::clone(&hooks), true).unwrap();
        let forced = TeacherForcedPolicy::new(Arc::new(script), Arc::clone(&student));
        let t = run_episode_with(
            &forced,
            &h0,
            &env,
            task,
            i as u64,
            &EpisodeOptions::default(),
        )
        .await
        .unwrap();
        assert!(t.is_success(), "{}", t.transcript());
        good.push(t);
    }
    let seqs = sft_sequences(&good, true).unwrap();
    let mut sft = SftTrainer::new(student.model(), SftConfig::default()).unwrap();
    sft.fit_policy(&student, &seqs, 30).unwrap();

    let after = probe_decisions(&student, &h0, &test, 1, Organism::RecoveryHooks)
        .await
        .unwrap();
    assert!(
        after["change"].p_good > before["change"].p_good + 0.1,
        "change: {:?} -> {:?}",
        before["change"],
        after["change"]
    );
    assert!(after["change"].log_ratio > before["change"].log_ratio);
}

#[tokio::test]
async fn under_prompt_rules_the_probe_reads_quoting_at_the_first_statement_and_skips_recheck() {
    let (student, h0, env) = rig(Organism::PromptRules, 0, 44).await;
    let test = env.tasks(Split::Test).unwrap();
    let probe = probe_decisions(&student, &h0, &test, 1, Organism::PromptRules)
        .await
        .unwrap();
    assert!(!probe.contains_key("recheck") && !probe.contains_key("plain"));
    let count = |f: Family| {
        test.iter()
            .filter(|t| Family::of_task(t) == Some(f))
            .count()
    };
    assert_eq!(probe["change"].tasks, count(Family::Change));
    // Quoting is probed on its tasks with a name to quote, at the first statement: the good
    // and the planted statement part at the first name that needs backticks.
    let quoting = probe.get("quoting").map_or(0, |p| p.tasks);
    assert!(
        quoting > 0 && quoting <= count(Family::Quoting),
        "{probe:?}"
    );
    // Under the recovery-hooks variant the same tasks are probed after the failed statement.
    let hooks = probe_decisions(&student, &h0, &test, 1, Organism::RecoveryHooks)
        .await
        .unwrap();
    assert_eq!(hooks["quoting"].tasks, quoting);
    assert_ne!(hooks["quoting"].per_task, probe["quoting"].per_task);
    // The context lock: under the sibling whose rule repairs the change family the same
    // decision is probed in the sibling's context.
    let ruled = &harness_warmstart::rule_siblings(&h0)[0];
    assert!(ruled.prompt_rules.contains_key("commit-when-changed"));
    let under_rule = probe_decisions(&student, ruled, &test, 1, Organism::PromptRules)
        .await
        .unwrap();
    assert_eq!(under_rule["change"].tasks, count(Family::Change));
    assert_ne!(under_rule["change"].per_task, probe["change"].per_task);
}
