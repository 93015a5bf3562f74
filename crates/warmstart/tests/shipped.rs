//! The checkpoint shipped with the crate: the main job's default installs it without training,
//! and training it again gives the same bytes (slow: `HARNESS_SLOW_TESTS=1 cargo test --release
//! -p harness-warmstart --test shipped`).

use harness_warmstart::{
    SHIPPED, WarmStartProgress, WarmStartSettings, cache_dir_name, shipped_for, warm_start,
    warm_start_trained,
};

fn main_job_default() -> WarmStartSettings {
    WarmStartSettings {
        seed: 42,
        ..WarmStartSettings::default()
    }
}

const REBUILD: &str = "the default settings or CACHE_VERSION changed: rebuild the shipped checkpoint \
     (cargo run -p harness-warmstart --release --example base_rates -- --train --cache runs/fresh \
     --settings s.json, with s.json = {\"seed\": 42}) and update crates/warmstart/src/shipped.rs";

#[test]
fn the_main_jobs_default_installs_the_shipped_checkpoint_without_training() {
    let settings = main_job_default();
    let shipped = shipped_for(&settings).unwrap_or_else(|| panic!("{REBUILD}"));
    assert_eq!(shipped.name, cache_dir_name(&settings));
    assert_eq!(shipped.settings().unwrap(), settings);

    let root = tempfile::tempdir().unwrap();
    let mut events = Vec::new();
    let first = warm_start(&settings, root.path(), &mut |p| events.push(p)).unwrap();
    assert!(first.shipped && first.cached);
    assert_eq!(
        events,
        vec![WarmStartProgress::Shipped(first.checkpoint.clone())]
    );
    for (file, bytes) in shipped.files {
        assert_eq!(
            std::fs::read(first.checkpoint.join(file)).unwrap(),
            *bytes,
            "{file}"
        );
    }
    // The shipped folder describes a real warm start of these settings.
    assert_eq!(first.report.steps, settings.sft_steps);
    assert_eq!(first.report.demos, settings.demo_tasks);
    let model = first.load_model().unwrap();
    assert_eq!(model.tokenizer.get_vocab_size(true), settings.vocab_size);
    assert_eq!(first.siblings.len(), 3);

    // Afterwards it is an ordinary cached folder.
    let second = warm_start(&settings, root.path(), &mut |_| {}).unwrap();
    assert!(second.cached && !second.shipped);
    assert_eq!(second.checkpoint, first.checkpoint);
}

#[test]
fn other_settings_are_not_shipped() {
    assert!(shipped_for(&WarmStartSettings::default()).is_none());
    assert!(shipped_for(&WarmStartSettings::tiny()).is_none());
    let mut other = main_job_default();
    other.sft_steps += 1;
    assert!(shipped_for(&other).is_none());
    // Training is still what the tiny settings get.
    let root = tempfile::tempdir().unwrap();
    let mut trained = false;
    let got = warm_start(&WarmStartSettings::tiny(), root.path(), &mut |p| {
        trained |= matches!(p, WarmStartProgress::Step { .. })
    })
    .unwrap();
    assert!(trained && !got.shipped && !got.cached);
}

#[test]
fn every_shipped_checkpoint_is_named_after_its_settings() {
    for shipped in SHIPPED {
        let settings = shipped.settings().unwrap();
        assert_eq!(
            shipped.name,
            cache_dir_name(&settings),
            "{}",
            shipped.settings
        );
        assert_eq!(shipped_for(&settings).unwrap().name, shipped.name);
        let report: serde_json::Value = serde_json::from_slice(
            shipped
                .files
                .iter()
                .find(|(f, _)| *f == "warmstart.json")
                .unwrap()
                .1,
        )
        .unwrap();
        // The folder records the settings it was made with.
        let recorded: WarmStartSettings =
            serde_json::from_value(report["settings"].clone()).unwrap();
        assert_eq!(recorded, settings, "{}", shipped.settings);
        assert_eq!(report["report"]["demos"], settings.demo_tasks);
    }
}

/// Minutes per checkpoint in a release build: training each shipped checkpoint from its
/// demonstrations gives the shipped bytes.
#[test]
fn slow_training_again_reproduces_the_shipped_checkpoints() {
    if std::env::var_os("HARNESS_SLOW_TESTS").is_none() {
        eprintln!("skipped: set HARNESS_SLOW_TESTS=1 (and use --release) to run");
        return;
    }
    assert!(shipped_for(&main_job_default()).is_some(), "{REBUILD}");
    for shipped in SHIPPED {
        let settings = shipped.settings().unwrap();
        let root = tempfile::tempdir().unwrap();
        let trained = warm_start_trained(&settings, root.path(), &mut |_| {}).unwrap();
        assert!(!trained.cached && !trained.shipped);
        for file in ["model.safetensors", "tokenizer.json", "config.json"] {
            let (_, bytes) = shipped.files.iter().find(|(f, _)| *f == file).unwrap();
            assert_eq!(
                std::fs::read(trained.checkpoint.join(file)).unwrap(),
                *bytes,
                "{}: {file} differs from the shipped one",
                shipped.settings
            );
        }
    }
}
