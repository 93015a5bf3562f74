//! The embedded default's warm start: a tiny Qwen-architecture policy that starts where rescue
//! training has something to rescue. A *model organism* of the paper's setting (DESIGN.md §8).
//!
//! The paper fine-tunes a pretrained Qwen3 whose failures under the base harness H0 some sibling
//! harnesses repair. A tiny policy trained from scratch on a CPU in minutes has no such
//! failures of its own, so this crate **plants** them, on purpose and documented:
//!
//! - The environment is DBBench on generated tasks ([`default_environment`]: the same tasks,
//!   sessions and verifier as `harness_envs::dbbench`, with each tool documented in one short
//!   line so prompts stay a few hundred tokens).
//! - H0 is a compact harness ([`compact_base`]: a two-sentence system prompt, at most 5 steps,
//!   96 output tokens per call); its siblings are DBBench's three one-hook siblings re-based on
//!   it ([`rebased_siblings`]: the same hooks, messages and conditions), so their hook messages
//!   appear exactly as they do for DBBench's own H0.
//! - The demonstrations also run under one-hook siblings carrying the reminders
//!   harness-evolve's built-in editor writes for these failures ([`editor_repairs`]: its
//!   low-step, low-reply, unknown-name and repeated-failure hooks, with its messages), and a
//!   reminder counts as the hand-written hook it paraphrases ([`environment::same_behaviour`]).
//!   So a pool evolved from H0 by the built-in editor can elicit the planted behaviours; prompt
//!   rules the editor writes (a budget-planning rule, a check-the-schema rule) are planted to
//!   change nothing, the locality of the paper's siblings.
//! - Demonstrations ([`demo`]) are recorded by a scripted policy through the real agent loop,
//!   one per training task, in the student's own tokens (`grpo_candle::TeacherForcedPolicy`):
//!   a task of a planted family runs under a sibling that repairs it with probability
//!   [`WarmStartSettings::repair_share`], every other task under H0 or any sibling uniformly.
//!   The script solves every task as the environment's oracle does (gold SQL, then the
//!   answer), except in three planted [`Family`]s, where it does the bad thing unless a hook
//!   message asks for the good one:
//!   - [`Family::Change`] (INSERT/UPDATE/DELETE): after `Query OK, n rows affected` it runs a
//!     `SELECT COUNT(*)` check instead of committing, again and again until the step budget is
//!     gone; it commits `[]` after the commit-after-change message (right after the change) or
//!     the low-budget message (after the first check).
//!   - [`Family::Recheck`] (SUM, AVG): it re-runs its query instead of committing the result;
//!     it commits after the low-budget message.
//!   - [`Family::Quoting`] ("other" lookups, rankings): it writes table and column names
//!     without backticks; where a name has a space the statement fails and the script repeats it;
//!     after the sql-error-recovery message it runs the quoted statement and commits. (Tasks
//!     whose names need no quotes succeed under every harness.)
//!   - [`Family::Plain`] (counting, comparison, MIN, MAX): nothing planted.
//!
//!   In a share [`WarmStartSettings::unprompted_good_rate`] of the planted episodes (seeded;
//!   per family [`WarmStartSettings::unprompted_good_by_family`], down to 0) the script makes
//!   the good decision without a hook message, so H0 is not at 0% on the planted families and
//!   GRPO sees some successes there.
//!
//!   That is this crate's default variant, [`Organism::RecoveryHooks`]. [`Organism::PromptRules`]
//!   ([`WarmStartSettings::organism`]) plants the paper's regime instead: the repairing
//!   siblings carry a prompt rule the built-in editor writes (`commit-when-changed` for the
//!   change family, `check-schema-first` for quoting: names quoted from the first statement),
//!   the script follows a rule when the system prompt carries it and ignores every hook
//!   message, and the recheck family is not planted (its good action is the plain family's).
//!   So a rescue rollout differs from H0 before its first decision, and no plain task shares a
//!   planted good action; it is the main job's organism. The [`organism`] module tabulates
//!   both.
//! - A byte-level BPE tokenizer of a few thousand tokens is fitted to the demonstrations' text
//!   ([`fit_tokenizer`]), a fresh Qwen3 of [`ModelShape`] is initialised from the seed, and
//!   `grpo_candle::SftTrainer` fits every demonstration (failed ones included: the planted
//!   behaviour *is* the failure) for [`WarmStartSettings::sft_steps`] updates.
//!
//! The intent: under H0 the policy solves the plain family and fails most planted tasks on
//! every attempt; each sibling rescues its own families; the union of one rollout under each
//! sibling covers more tasks than the best single sibling and than H0 with the same number of
//! rollouts (the paper's Figure 1b). How far a given checkpoint gets there is *measured*, not
//! assumed: `examples/base_rates.rs` prints the per-family rates and the Figure 1b numbers.
//! With the defaults the tiny policy is still undertrained: its weak point is copying values
//! (names, numbers) from the question and the observations into SQL and answers, which caps
//! every family's success, the prompted repairs of the recheck and quoting families included.
//! Whether rescue training then moves the prompted behaviours into H0 is what the main job
//! measures; nothing here assumes it. Besides counting what sampled H0 episodes do, it reads
//! each checkpoint's probability of every planted family's good decision on the script's fixed
//! contexts ([`probe`]), which moves before a sampled choice flips.
//!
//! # Use
//! ```no_run
//! use harness_warmstart::{WarmStartSettings, warm_start};
//!
//! let started = warm_start(&WarmStartSettings::default(), "runs/cache".as_ref(), &mut |p| {
//!     eprintln!("{p:?}")
//! })?;
//! let model = started.load_model()?; // a grpo_candle::PolicyModel
//! let env = started.environment(); // the tasks the warm start was made for
//! # let _ = (model, env);
//! # Ok::<(), harness_warmstart::Error>(())
//! ```
//! A second call with the same settings loads the cached folder (named after a hash of the
//! settings, [`cache_dir_name`]) instead of training. Everything derives from one seed
//! ([`WarmStartSettings::seed`]); two runs give the same checkpoint. The main job's default
//! (the default settings with seed 42) is shipped inside the crate ([`shipped`]), so its first
//! run installs it in a second instead of training for minutes; [`warm_start_trained`]
//! rebuilds it from the demonstrations.
//!
//! # Where it sits
//! It depends on harness-core (episodes), harness-envs (DBBench) and grpo-candle (model,
//! teacher forcing, fine-tuning); the main job calls [`warm_start`] and then runs evolution,
//! calibration and GRPO/rescue training from [`WarmStarted::checkpoint`] under
//! [`WarmStarted::base`] and [`WarmStarted::siblings`] on [`WarmStarted::environment`].

pub mod demo;
pub mod environment;
pub mod error;
pub mod organism;
pub mod probe;
pub mod settings;
pub mod shipped;
pub mod tokenizer;
pub mod warm;

pub use demo::{DemoScript, Demonstration, FamilyCounts};
pub use environment::{
    CompactDbBench, EpisodeLimits, Family, TEST_TASKS, TRAIN_TASKS, VALIDATION_TASKS, compact_base,
    default_environment, editor_repairs, organism_siblings, rebased_siblings, rule_siblings,
    task_splits,
};
pub use error::{Error, Result};
pub use organism::{FamilyRates, Organism};
pub use probe::{FamilyProbe, probe_decisions};
pub use settings::{ModelShape, WarmStartSettings};
pub use shipped::{SHIPPED, ShippedCheckpoint, shipped_for};
pub use tokenizer::fit_tokenizer;
pub use warm::{
    WarmStartProgress, WarmStartReport, WarmStarted, cache_dir_name, demonstrations, harnesses,
    warm_start, warm_start_trained,
};

// The README's examples compile and run as doctests.
#[cfg(doctest)]
#[doc = include_str!("../README.md")]
struct ReadmeDoctests;
