//! The warm start itself: demonstrations, tokenizer, model, fine-tuning, and the cache.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Instant;

use candle_core::{DType, Device};
use grpo_candle::train::sft::{SftConfig, SftTrainer, sft_sequences};
use grpo_candle::train::trainer::{DecayKind, Schedule};
use grpo_candle::{CandlePolicy, ChatTemplate, PolicyModel, PolicyOptions, TeacherForcedPolicy};
use harness_core::{ChatMessage, Environment, FinishReason, Harness, Policy};
use harness_envs::dbbench::{DbBench, GeneratorConfig};
use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

use crate::demo::{self, Demonstration, FamilyCounts};
use crate::environment::{self, CompactDbBench, ENV_NAME};
use crate::error::{Error, Result};
use crate::settings::WarmStartSettings;
use crate::tokenizer::fit_tokenizer;

/// Bumped whenever the warm start's procedure changes, so old caches are not reused.
pub const CACHE_VERSION: u32 = 5;

/// The file in a warm-start folder that describes it.
pub const REPORT_FILE: &str = "warmstart.json";

/// What a warm start reports as it goes.
#[derive(Debug, Clone, PartialEq)]
pub enum WarmStartProgress {
    /// The cached checkpoint at this path is loaded instead of training.
    Cached(PathBuf),
    /// The checkpoint shipped with the crate for these settings ([`crate::shipped`]) is
    /// installed at this path instead of training.
    Shipped(PathBuf),
    /// Demonstrations recorded so far (`pass` 1: the script alone, for the tokenizer; 2: in
    /// the student's tokens).
    Demos {
        /// Which pass.
        pass: u8,
        /// Recorded so far.
        done: usize,
        /// To record.
        total: usize,
    },
    /// The tokenizer is fitted.
    Tokenizer {
        /// Its tokens.
        vocab: usize,
    },
    /// One fine-tuning update is done.
    Step {
        /// Updates done.
        step: usize,
        /// Updates in all.
        total: usize,
        /// The update's mean NLL (before it).
        loss: f64,
    },
    /// The checkpoint is written here.
    Saved(PathBuf),
}

/// What the warm start did.
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
pub struct WarmStartReport {
    /// Fine-tuning updates.
    pub steps: usize,
    /// Mean NLL of the first update's batch (before it).
    pub first_loss: f64,
    /// Mean NLL of the last update's batch (before it).
    pub final_loss: f64,
    /// Mean NLL over the last 10% of updates.
    pub tail_loss: f64,
    /// Demonstrations recorded.
    pub demos: usize,
    /// Training sequences (one per demonstration: its turns pack into one).
    pub sequences: usize,
    /// Scored (policy) tokens over all sequences.
    pub policy_tokens: usize,
    /// Tokens over all sequences.
    pub sequence_tokens: usize,
    /// The longest sequence.
    pub max_sequence_tokens: usize,
    /// Demonstration turns cut at the output-token limit.
    pub truncated_turns: usize,
    /// The tokenizer's tokens.
    pub vocab_size: usize,
    /// The model's parameters.
    pub parameters: usize,
    /// Demonstrations per family: counts of planted, prompted and unprompted-good episodes.
    pub families: BTreeMap<String, FamilyCounts>,
    /// Demonstrations per harness.
    pub harnesses: BTreeMap<String, usize>,
    /// Seconds spent recording demonstrations and fitting the tokenizer.
    pub demo_seconds: f64,
    /// Seconds spent fine-tuning.
    pub train_seconds: f64,
}

/// A warm-started checkpoint and the harnesses it was trained under.
#[derive(Debug, Clone)]
pub struct WarmStarted {
    /// The checkpoint folder (`config.json`, `model.safetensors`, `tokenizer.json`):
    /// [`PolicyModel::load_dir`] loads it.
    pub checkpoint: PathBuf,
    /// The compact H0.
    pub base: Harness,
    /// DBBench's siblings re-based on the compact H0.
    pub siblings: Vec<Harness>,
    /// The environment's name.
    pub env: String,
    /// The seed the tasks were generated from ([`environment::default_environment`]).
    pub task_seed: u64,
    /// Seconds this call took (loading, when cached).
    pub seconds: f64,
    /// Whether the checkpoint came from the cache (or was installed from the crate's shipped
    /// checkpoints: then [`WarmStarted::shipped`] is set too).
    pub cached: bool,
    /// Whether the checkpoint was installed from the crate's shipped checkpoints in this call.
    pub shipped: bool,
    /// What the warm start did (when it ran, possibly in an earlier call).
    pub report: WarmStartReport,
}

impl WarmStarted {
    /// The environment the checkpoint was warm-started for.
    pub fn environment(&self) -> Arc<dyn Environment> {
        environment::default_environment(self.task_seed)
    }

    /// Load the checkpoint as a policy model (f32 on the CPU).
    pub fn load_model(&self) -> Result<PolicyModel> {
        Ok(PolicyModel::load_dir(
            &self.checkpoint,
            DType::F32,
            &Device::Cpu,
        )?)
    }
}

#[derive(Serialize, Deserialize)]
struct Stored {
    version: u32,
    settings: WarmStartSettings,
    base: Harness,
    siblings: Vec<Harness>,
    report: WarmStartReport,
}

/// The cache folder name of `settings`: `warmstart-<16 hex digits of a SHA-256 of the settings
/// and [`CACHE_VERSION`]>`.
pub fn cache_dir_name(settings: &WarmStartSettings) -> String {
    let text = serde_json::to_string(&(CACHE_VERSION, settings)).unwrap_or_default();
    let digest = Sha256::digest(text.as_bytes());
    let hex: String = digest.iter().take(8).map(|b| format!("{b:02x}")).collect();
    format!("warmstart-{hex}")
}

/// The compact H0 and its siblings for `settings`.
pub fn harnesses(settings: &WarmStartSettings) -> (Harness, Vec<Harness>) {
    let base = environment::compact_base(&settings.limits);
    let siblings = environment::organism_siblings(settings.organism, &base);
    (base, siblings)
}

/// Build the warm-started checkpoint for `settings` under `cache_root`, or load it when a
/// previous call built it (see the [crate docs](crate)). Deterministic in `settings`; the
/// folder appears atomically (trained in a temporary folder, then renamed).
///
/// The episodes are driven by a plain executor (`futures::executor::block_on`): nothing in
/// them needs a tokio reactor, so this may be called from anywhere, inside a runtime too (it
/// blocks the calling thread).
///
/// Settings for which the crate ships the finished folder ([`crate::shipped`]: the main job's
/// default) install it instead of training; [`warm_start_trained`] always trains.
pub fn warm_start(
    settings: &WarmStartSettings,
    cache_root: &Path,
    progress: &mut dyn FnMut(WarmStartProgress),
) -> Result<WarmStarted> {
    run(settings, cache_root, true, progress)
}

/// [`warm_start`] without the shipped checkpoints: a folder missing from the cache is always
/// trained (how a shipped checkpoint is made, and checked).
pub fn warm_start_trained(
    settings: &WarmStartSettings,
    cache_root: &Path,
    progress: &mut dyn FnMut(WarmStartProgress),
) -> Result<WarmStarted> {
    run(settings, cache_root, false, progress)
}

fn run(
    settings: &WarmStartSettings,
    cache_root: &Path,
    use_shipped: bool,
    progress: &mut dyn FnMut(WarmStartProgress),
) -> Result<WarmStarted> {
    let started = Instant::now();
    settings.validate()?;
    let name = cache_dir_name(settings);
    let dir = cache_root.join(&name);
    // A shipped checkpoint is installed as the cache folder, then loaded like any cached one.
    let shipped = match use_shipped
        .then(|| crate::shipped::shipped_for(settings))
        .flatten()
    {
        Some(found) if !dir.join(REPORT_FILE).exists() => {
            let tmp = fresh_tmp(cache_root, &name)?;
            found.write_to(&tmp)?;
            move_in(&tmp, &dir, settings)?;
            true
        }
        _ => false,
    };
    if let Some(found) = load_cached(&dir, settings)? {
        progress(if shipped {
            WarmStartProgress::Shipped(dir.clone())
        } else {
            WarmStartProgress::Cached(dir.clone())
        });
        return Ok(WarmStarted {
            seconds: started.elapsed().as_secs_f64(),
            shipped,
            ..found
        });
    }
    let tmp = fresh_tmp(cache_root, &name)?;
    let (model, report) = futures::executor::block_on(train(settings, progress))?;
    model.save_hf(&tmp)?;
    let (base, siblings) = harnesses(settings);
    let stored = Stored {
        version: CACHE_VERSION,
        settings: settings.clone(),
        base: base.clone(),
        siblings: siblings.clone(),
        report: report.clone(),
    };
    let json = serde_json::to_string_pretty(&stored).map_err(|e| Error::io(&tmp, e))?;
    let report_path = tmp.join(REPORT_FILE);
    harness_core::fsutil::write_atomic(&report_path, json.as_bytes())
        .map_err(|e| Error::io(&report_path, e))?;
    move_in(&tmp, &dir, settings)?;
    progress(WarmStartProgress::Saved(dir.clone()));
    Ok(WarmStarted {
        checkpoint: dir,
        base,
        siblings,
        env: ENV_NAME.into(),
        task_seed: settings.seed,
        seconds: started.elapsed().as_secs_f64(),
        cached: false,
        shipped: false,
        report,
    })
}

/// A new empty temporary folder under `cache_root` for the cache folder `name`, this call's
/// own (process id and a per-process counter; created exclusively), so two warm starts of the
/// same settings, in two processes or two threads, never write into one folder.
fn fresh_tmp(cache_root: &Path, name: &str) -> Result<PathBuf> {
    static CALLS: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
    std::fs::create_dir_all(cache_root).map_err(|e| Error::io(cache_root, e))?;
    loop {
        let call = CALLS.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let tmp = cache_root.join(format!(".{name}.tmp-{}-{call}", std::process::id()));
        match std::fs::create_dir(&tmp) {
            Ok(()) => return Ok(tmp),
            // Left behind by a killed process that had the same id: clear it and take the next.
            Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {
                std::fs::remove_dir_all(&tmp).map_err(|e| Error::io(&tmp, e))?;
            }
            Err(e) => return Err(Error::io(&tmp, e)),
        }
    }
}

/// Rename the finished temporary folder `tmp` to `dir`.
fn move_in(tmp: &Path, dir: &Path, settings: &WarmStartSettings) -> Result<()> {
    harness_core::fsutil::sync_dir(tmp).map_err(|e| Error::io(tmp, e))?;
    if let Err(e) = std::fs::rename(tmp, dir) {
        // Another process may have finished the same warm start first: use its folder.
        let _ = std::fs::remove_dir_all(tmp);
        if load_cached(dir, settings)?.is_none() {
            return Err(Error::io(
                dir,
                format!("cannot move the checkpoint in: {e}"),
            ));
        }
    }
    if let Some(parent) = dir.parent() {
        harness_core::fsutil::sync_dir(parent).map_err(|e| Error::io(parent, e))?;
    }
    Ok(())
}

fn load_cached(dir: &Path, settings: &WarmStartSettings) -> Result<Option<WarmStarted>> {
    let path = dir.join(REPORT_FILE);
    if !path.exists() {
        return Ok(None);
    }
    let text = std::fs::read_to_string(&path).map_err(|e| Error::io(&path, e))?;
    let stored: Stored = serde_json::from_str(&text)
        .map_err(|e| Error::io(&path, format!("not a warm-start description: {e}")))?;
    if stored.version != CACHE_VERSION || stored.settings != *settings {
        return Err(Error::io(
            &path,
            "the cached warm start was made with other settings (hash collision or an edited file)",
        ));
    }
    Ok(Some(WarmStarted {
        checkpoint: dir.to_path_buf(),
        base: stored.base,
        siblings: stored.siblings,
        env: ENV_NAME.into(),
        task_seed: settings.seed,
        seconds: 0.0,
        cached: true,
        shipped: false,
        report: stored.report,
    }))
}

/// The chat messages a trajectory's last context held (for the tokenizer's corpus).
fn conversation_text(demo: &Demonstration, harness: &Harness) -> String {
    let messages: Vec<ChatMessage> = demo
        .trajectory
        .messages
        .iter()
        .map(|m| ChatMessage {
            role: m.role,
            content: m.content.clone(),
            name: m.name.clone(),
        })
        .collect();
    let tools = harness.visible_tools(&environment::compact_tools());
    ChatTemplate::ChatMl.render(&messages, &tools, false)
}

/// The tool list as the chat template renders it into the system turn of `harness`'s prompts
/// (everything after the system prompt), a constant block of every prompt.
pub fn tools_block(harness: &Harness) -> String {
    const MARK: &str = "\u{1}SYSTEM\u{1}";
    let tools = harness.visible_tools(&environment::compact_tools());
    let text = ChatTemplate::ChatMl.render(&[ChatMessage::system(MARK)], &tools, false);
    let start = text.find(MARK).map(|i| i + MARK.len()).unwrap_or(0);
    let rest = &text[start..];
    let rest = rest.trim_start_matches('\n');
    let end = rest.find("<|im_end|>").unwrap_or(rest.len());
    rest[..end].to_string()
}

/// The demonstration environment: DBBench sessions for any generated task.
pub(crate) fn demo_env() -> CompactDbBench {
    CompactDbBench::new(DbBench::generated(&GeneratorConfig {
        seed: 0,
        train: 0,
        validation: 0,
        test: 0,
    }))
}

/// A fresh model with `tokenizer` and the settings' shape.
fn fresh_model(
    settings: &WarmStartSettings,
    tokenizer: tokenizers::Tokenizer,
) -> Result<PolicyModel> {
    let m = &settings.model;
    let spec = grpo_candle::TinySpec {
        seed: settings.seed,
        hidden_size: m.hidden_size,
        num_layers: m.num_layers,
        num_heads: m.num_heads,
        num_kv_heads: m.num_kv_heads,
        head_dim: m.head_dim,
        intermediate_size: m.intermediate_size,
        max_position_embeddings: m.max_position_embeddings,
        tie_word_embeddings: true,
        ..grpo_candle::TinySpec::default()
    };
    Ok(PolicyModel::tiny_with_tokenizer(
        &spec,
        tokenizer,
        DType::F32,
        &Device::Cpu,
    )?)
}

/// Record the demonstrations of `settings` in a fresh student's tokens (the tokenizer fitted
/// on a first, script-only pass), and return the student and the demonstrations.
pub async fn demonstrations(
    settings: &WarmStartSettings,
    progress: &mut dyn FnMut(WarmStartProgress),
) -> Result<(PolicyModel, Vec<Demonstration>)> {
    let (base, siblings) = harnesses(settings);
    let mut all = vec![base.clone()];
    all.extend(siblings);
    // The built-in editor's reminders too: a pool evolved from H0 carries them.
    all.extend(environment::editor_repairs(&base));
    let env = demo_env();
    let specs = demo::plan(settings, &all);
    let total = specs.len();
    let scripted = demo::record(
        &specs,
        &all,
        settings.organism,
        &env,
        &|s| Arc::new(s) as Arc<dyn Policy>,
        &mut |done| {
            if done % 100 == 0 || done == total {
                progress(WarmStartProgress::Demos {
                    pass: 1,
                    done,
                    total,
                });
            }
        },
    )
    .await?;
    let texts: Vec<String> = scripted
        .iter()
        .zip(&specs)
        .map(|(d, s)| conversation_text(d, &all[s.harness]))
        .collect();
    let tokenizer = fit_tokenizer(&texts, settings.vocab_size, &[tools_block(&all[0])])?;
    progress(WarmStartProgress::Tokenizer {
        vocab: tokenizer.get_vocab_size(true),
    });
    let model = fresh_model(settings, tokenizer)?;
    let student = Arc::new(CandlePolicy::new(model.clone(), PolicyOptions::default()));
    let wrap = |s: demo::DemoScript| {
        Arc::new(TeacherForcedPolicy::new(Arc::new(s), Arc::clone(&student)).without_scoring())
            as Arc<dyn Policy>
    };
    let demos = demo::record(&specs, &all, settings.organism, &env, &wrap, &mut |done| {
        if done % 100 == 0 || done == total {
            progress(WarmStartProgress::Demos {
                pass: 2,
                done,
                total,
            });
        }
    })
    .await?;
    Ok((model, demos))
}

async fn train(
    settings: &WarmStartSettings,
    progress: &mut dyn FnMut(WarmStartProgress),
) -> Result<(PolicyModel, WarmStartReport)> {
    let demo_started = Instant::now();
    let (model, demos) = demonstrations(settings, progress).await?;
    let mut report = WarmStartReport {
        demos: demos.len(),
        families: demo::family_counts(&demos),
        vocab_size: model.tokenizer.get_vocab_size(true),
        parameters: model.model.config().num_parameters(),
        ..WarmStartReport::default()
    };
    for d in &demos {
        *report.harnesses.entry(d.harness.clone()).or_default() += 1;
        report.truncated_turns += d
            .trajectory
            .turns
            .iter()
            .filter(|t| t.finish == FinishReason::Length)
            .count();
    }
    let trajectories: Vec<_> = demos.into_iter().map(|d| d.trajectory).collect();
    let sequences = sft_sequences(&trajectories, false)?;
    report.sequences = sequences.len();
    report.policy_tokens = sequences.iter().map(|s| s.policy_pos.len()).sum();
    report.sequence_tokens = sequences.iter().map(|s| s.ids.len()).sum();
    report.max_sequence_tokens = sequences.iter().map(|s| s.ids.len()).max().unwrap_or(0);
    report.demo_seconds = demo_started.elapsed().as_secs_f64();

    let train_started = Instant::now();
    let steps = settings.sft_steps;
    let cfg = SftConfig {
        schedule: Schedule {
            lr: settings.learning_rate,
            warmup_steps: settings.warmup_steps as u64,
            total_steps: steps as u64,
            decay: DecayKind::Cosine,
            min_lr_ratio: settings.min_lr_ratio,
        },
        batch_sequences: settings.batch_sequences,
        seed: settings.seed,
        ..SftConfig::default()
    };
    let mut sft = SftTrainer::new(&model.model, cfg)?;
    let mut losses = Vec::with_capacity(steps);
    for step in 0..steps {
        let metrics = sft.fit(&model.model, &sequences, 1)?;
        let loss = metrics.first().map(|m| m.loss).unwrap_or(f64::NAN);
        losses.push(loss);
        progress(WarmStartProgress::Step {
            step: step + 1,
            total: steps,
            loss,
        });
    }
    report.steps = steps;
    report.first_loss = losses.first().copied().unwrap_or(f64::NAN);
    report.final_loss = losses.last().copied().unwrap_or(f64::NAN);
    let tail = (steps / 10).max(1);
    report.tail_loss = losses[steps - tail..].iter().sum::<f64>() / tail as f64;
    report.train_seconds = train_started.elapsed().as_secs_f64();
    tracing::info!(
        steps,
        final_loss = report.final_loss,
        seconds = report.train_seconds,
        "warm start trained"
    );
    Ok((model, report))
}

#[cfg(test)]
mod tests {
    use super::fresh_tmp;

    #[test]
    fn every_call_gets_its_own_empty_temporary_folder() {
        let root = tempfile::tempdir().unwrap();
        let folders: Vec<_> = std::thread::scope(|s| {
            let handles: Vec<_> = (0..4)
                .map(|_| s.spawn(|| fresh_tmp(root.path(), "warmstart-x").unwrap()))
                .collect();
            handles.into_iter().map(|h| h.join().unwrap()).collect()
        });
        let distinct: std::collections::BTreeSet<_> = folders.iter().collect();
        assert_eq!(distinct.len(), folders.len(), "{folders:?}");
        for f in &folders {
            assert!(f.is_dir(), "{}", f.display());
            assert_eq!(std::fs::read_dir(f).unwrap().count(), 0);
        }
    }
}
