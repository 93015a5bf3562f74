//! A calibration: the router's evidence at checkpoint s (paper Eq. 11), as plain data.
//!
//! It records which policy it measured (checkpoint path and content hash), when (calibration
//! index s and update), the paired validation outcomes per task and harness, the validation
//! success per harness, and every sibling's profile. It is saved as JSON in a calibration
//! directory (`calibration-0003.json`) and validated on load: a file that names unknown
//! harnesses, rates outside [0, 1], success rates that disagree with the per-task outcomes,
//! profile support from tasks it never ran, or any test task, is refused with its file and field.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

use harness_core::{CalibrationPoint, CalibrationSummary, HarnessId, Split, Task, Usage};
use harness_pool::SiblingPool;
use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

use crate::error::{Error, Result};
use crate::features::FeatureSource;
use crate::paired::{PairedLimits, PairedRun, PairedSettings};
use crate::profile::Profile;

/// The calibration file format version.
pub const CALIBRATION_FORMAT: u32 = 1;

/// The file name of calibration `index` inside a calibration directory.
pub fn calibration_file_name(index: u32) -> String {
    format!("calibration-{index:04}.json")
}

/// The policy checkpoint a calibration measured.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CheckpointRef {
    /// Where it was.
    pub path: PathBuf,
    /// SHA-256 (hex) of its content: a file's bytes, or a directory's files (relative path and
    /// bytes, in sorted order).
    pub sha256: String,
}

impl CheckpointRef {
    /// Hash the checkpoint at `path` (a file or a directory).
    pub fn of(path: &Path) -> Result<Self> {
        let mut hasher = Sha256::new();
        let meta = std::fs::metadata(path).map_err(|e| harness_core::Error::io(path, e))?;
        if meta.is_dir() {
            let mut files = Vec::new();
            collect_files(path, path, &mut files)?;
            files.sort();
            for rel in files {
                let bytes = std::fs::read(path.join(&rel))
                    .map_err(|e| harness_core::Error::io(path.join(&rel), e))?;
                hasher.update(rel.to_string_lossy().as_bytes());
                hasher.update([0]);
                hasher.update((bytes.len() as u64).to_le_bytes());
                hasher.update(&bytes);
            }
        } else {
            let bytes = std::fs::read(path).map_err(|e| harness_core::Error::io(path, e))?;
            hasher.update(&bytes);
        }
        Ok(CheckpointRef {
            path: path.to_path_buf(),
            sha256: hasher
                .finalize()
                .iter()
                .map(|b| format!("{b:02x}"))
                .collect(),
        })
    }
}

fn collect_files(root: &Path, dir: &Path, out: &mut Vec<PathBuf>) -> Result<()> {
    let entries = std::fs::read_dir(dir).map_err(|e| harness_core::Error::io(dir, e))?;
    for entry in entries {
        let entry = entry.map_err(|e| harness_core::Error::io(dir, e))?;
        let path = entry.path();
        let kind = entry
            .file_type()
            .map_err(|e| harness_core::Error::io(&path, e))?;
        if kind.is_dir() {
            collect_files(root, &path, out)?;
        } else if kind.is_file() {
            out.push(path.strip_prefix(root).unwrap_or(&path).to_path_buf());
        }
    }
    Ok(())
}

/// Successes out of attempts of one harness on one task.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TaskOutcome {
    /// Episodes with R = 1.
    pub successes: u32,
    /// Episodes run.
    pub attempts: u32,
}

impl TaskOutcome {
    /// successes / attempts (0 without attempts).
    pub fn rate(&self) -> f64 {
        if self.attempts == 0 {
            0.0
        } else {
            f64::from(self.successes) / f64::from(self.attempts)
        }
    }
}

/// A pool member as a calibration knows it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct MemberInfo {
    /// Its id.
    pub id: HarnessId,
    /// Its name.
    pub name: String,
    /// Its description (the "execution description" voters see, H0's included).
    #[serde(default)]
    pub description: String,
}

/// How profiling went.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ProfilerStats {
    /// The profiler's name.
    pub profiler: String,
    /// Siblings left with an empty profile because the profiler's answers stayed malformed.
    pub failures: usize,
    /// Malformed answers rejected (retried or final).
    pub rejected_answers: usize,
    /// External tokens the profiler spent.
    #[serde(default)]
    pub usage: Usage,
}

/// The router's evidence at one checkpoint.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Calibration {
    /// [`CALIBRATION_FORMAT`].
    pub format: u32,
    /// The calibration index s.
    pub index: u32,
    /// Policy updates applied before it.
    pub update: u64,
    /// Whether it re-anchored the final policy.
    pub is_final: bool,
    /// The paired executions' seed.
    pub seed: u64,
    /// The policy checkpoint measured, when one was written.
    #[serde(default)]
    pub checkpoint: Option<CheckpointRef>,
    /// H0's id.
    pub base: HarnessId,
    /// Every member, H0 first.
    pub members: Vec<MemberInfo>,
    /// Which limits the paired executions ran under.
    pub limits: PairedLimits,
    /// Episodes per (harness, task).
    pub rollouts_per_task: u32,
    /// The validation tasks.
    pub tasks: Vec<Task>,
    /// Validation success per harness, H0 included: the mean of its per-task rates.
    pub validation_success: BTreeMap<HarnessId, f64>,
    /// Per task id, per harness, the outcome.
    pub outcomes: BTreeMap<String, BTreeMap<HarnessId, TaskOutcome>>,
    /// Per sibling, its profile (H0 has none: profiles are relative to H0).
    pub profiles: BTreeMap<HarnessId, Profile>,
    /// How profiling went.
    #[serde(default)]
    pub profiler: ProfilerStats,
    /// Where the profiles' and the similarity index's task features came from.
    #[serde(default)]
    pub features: FeatureSource,
}

impl Calibration {
    /// Assemble a calibration from a paired run and the siblings' profiles.
    pub fn from_run(
        point: &CalibrationPoint,
        checkpoint: Option<CheckpointRef>,
        pool: &SiblingPool,
        run: &PairedRun,
        paired: &PairedSettings,
        profiles: BTreeMap<HarnessId, Profile>,
        profiler: ProfilerStats,
    ) -> Self {
        let mut outcomes: BTreeMap<String, BTreeMap<HarnessId, TaskOutcome>> = BTreeMap::new();
        for task in &run.tasks {
            let row = outcomes.entry(task.id.clone()).or_default();
            for member in &run.members {
                let episodes = run.of(member, &task.id);
                row.insert(
                    member.clone(),
                    TaskOutcome {
                        successes: episodes.iter().filter(|t| t.is_success()).count() as u32,
                        attempts: episodes.len() as u32,
                    },
                );
            }
        }
        let validation_success = success_from_outcomes(&run.members, &outcomes);
        Calibration {
            format: CALIBRATION_FORMAT,
            index: point.index,
            update: point.update,
            is_final: point.is_final,
            seed: point.seed,
            checkpoint,
            base: pool.base_id().clone(),
            members: pool
                .members()
                .iter()
                .map(|h| MemberInfo {
                    id: h.id(),
                    name: h.name.clone(),
                    description: h.description.clone(),
                })
                .collect(),
            limits: paired.limits,
            rollouts_per_task: paired.rollouts_per_task,
            tasks: run.tasks.clone(),
            validation_success,
            outcomes,
            profiles,
            profiler,
            features: FeatureSource::default(),
        }
    }

    /// The member ids, H0 first.
    pub fn member_ids(&self) -> Vec<HarnessId> {
        self.members.iter().map(|m| m.id.clone()).collect()
    }

    /// A member's validation success (0 when unknown).
    pub fn success(&self, id: &HarnessId) -> f64 {
        self.validation_success.get(id).copied().unwrap_or(0.0)
    }

    /// A member's success rate on one validation task.
    pub fn task_success(&self, task_id: &str, id: &HarnessId) -> Option<f64> {
        self.outcomes.get(task_id)?.get(id).map(TaskOutcome::rate)
    }

    /// The metrics record of this calibration.
    pub fn summary(&self, rollouts: usize, seconds: f64) -> CalibrationSummary {
        CalibrationSummary {
            index: self.index,
            update: self.update,
            rollouts,
            validation_success: self.validation_success.clone(),
            usage: BTreeMap::from([("profiler".to_string(), self.profiler.usage)]),
            seconds,
        }
    }

    /// Check internal consistency; errors name the field and what was expected.
    pub fn validate(&self) -> Result<()> {
        fn bad(field: impl Into<String>, message: impl Into<String>) -> Error {
            Error::calibration(field, message)
        }
        if self.format != CALIBRATION_FORMAT {
            return Err(bad(
                "format",
                format!("found {}; expected {CALIBRATION_FORMAT}", self.format),
            ));
        }
        if self.members.first().map(|m| &m.id) != Some(&self.base) {
            return Err(bad(
                "members[0].id",
                format!("expected the base harness `{}` first", self.base),
            ));
        }
        let members: BTreeSet<&HarnessId> = self.members.iter().map(|m| &m.id).collect();
        if members.len() != self.members.len() {
            return Err(bad("members", "expected distinct member ids"));
        }
        if self.rollouts_per_task == 0 {
            return Err(bad("rollouts_per_task", "expected at least 1"));
        }
        if let Some(c) = &self.checkpoint
            && (c.sha256.len() != 64 || !c.sha256.chars().all(|ch| ch.is_ascii_hexdigit()))
        {
            return Err(bad(
                "checkpoint.sha256",
                "expected 64 hexadecimal digits (a SHA-256)",
            ));
        }
        let mut task_ids = BTreeSet::new();
        for (i, task) in self.tasks.iter().enumerate() {
            if task.split == Split::Test {
                return Err(Error::TestTask {
                    task: task.id.clone(),
                    context: format!("calibration field `tasks[{i}]`"),
                });
            }
            if !task_ids.insert(task.id.clone()) {
                return Err(bad(
                    format!("tasks[{i}].id"),
                    format!("task `{}` appears twice; expected distinct tasks", task.id),
                ));
            }
        }
        for (task_id, row) in &self.outcomes {
            if !task_ids.contains(task_id) {
                return Err(bad(
                    format!("outcomes.{task_id}"),
                    "expected outcomes only for the calibration's tasks",
                ));
            }
            for (id, o) in row {
                if !members.contains(id) {
                    return Err(bad(
                        format!("outcomes.{task_id}.{id}"),
                        "names a harness that is not a member",
                    ));
                }
                if o.successes > o.attempts {
                    return Err(bad(
                        format!("outcomes.{task_id}.{id}"),
                        format!(
                            "{} successes out of {} attempts; expected successes <= attempts",
                            o.successes, o.attempts
                        ),
                    ));
                }
            }
        }
        for (id, rate) in &self.validation_success {
            if !members.contains(id) {
                return Err(bad(
                    format!("validation_success.{id}"),
                    "names a harness that is not a member",
                ));
            }
            if !(0.0..=1.0).contains(rate) {
                return Err(bad(
                    format!("validation_success.{id}"),
                    format!("{rate} is outside [0, 1]"),
                ));
            }
        }
        let ids = self.member_ids();
        let derived = success_from_outcomes(&ids, &self.outcomes);
        for id in &ids {
            let stored = self.validation_success.get(id).copied();
            let want = derived.get(id).copied().unwrap_or(0.0);
            if stored.is_none_or(|s| (s - want).abs() > 1e-9) {
                return Err(bad(
                    format!("validation_success.{id}"),
                    format!("found {stored:?}; expected {want}, the mean of its per-task outcomes"),
                ));
            }
        }
        for (id, profile) in &self.profiles {
            if id == &self.base {
                return Err(bad(
                    format!("profiles.{id}"),
                    "H0 has no profile; profiles describe siblings relative to H0",
                ));
            }
            if !members.contains(id) {
                return Err(bad(
                    format!("profiles.{id}"),
                    "names a harness that is not a member",
                ));
            }
            profile.validate(&format!("profiles.{id}"), Some(&task_ids))?;
        }
        Ok(())
    }

    /// Pretty JSON.
    pub fn to_json_pretty(&self) -> String {
        serde_json::to_string_pretty(self).unwrap_or_else(|_| unreachable!("plain data"))
    }

    /// Parse and validate.
    pub fn from_json(text: &str) -> Result<Self> {
        let de = &mut serde_json::Deserializer::from_str(text);
        let calibration: Calibration = serde_path_to_error::deserialize(de)
            .map_err(|e| Error::calibration(e.path().to_string(), e.into_inner().to_string()))?;
        calibration.validate()?;
        Ok(calibration)
    }

    /// Write `calibration-<index>.json` into `dir` (created if needed), atomically; returns the
    /// file's path.
    pub fn save(&self, dir: &Path) -> Result<PathBuf> {
        self.validate()?;
        std::fs::create_dir_all(dir).map_err(|e| harness_core::Error::io(dir, e))?;
        let path = dir.join(calibration_file_name(self.index));
        harness_core::fsutil::write_atomic(&path, self.to_json_pretty().as_bytes())?;
        Ok(path)
    }

    /// Load and validate one calibration file.
    pub fn load(path: &Path) -> Result<Self> {
        let text = std::fs::read_to_string(path).map_err(|e| harness_core::Error::io(path, e))?;
        Self::from_json(&text).map_err(|e| e.in_file(path))
    }

    /// The calibration with the highest index in `dir`, if any.
    pub fn load_latest(dir: &Path) -> Result<Option<Self>> {
        let Ok(entries) = std::fs::read_dir(dir) else {
            return Ok(None);
        };
        let mut best: Option<(u32, PathBuf)> = None;
        for entry in entries.flatten() {
            let name = entry.file_name().to_string_lossy().into_owned();
            let Some(index) = name
                .strip_prefix("calibration-")
                .and_then(|s| s.strip_suffix(".json"))
                .and_then(|s| s.parse::<u32>().ok())
            else {
                continue;
            };
            if best.as_ref().is_none_or(|(b, _)| index > *b) {
                best = Some((index, entry.path()));
            }
        }
        best.map(|(_, path)| Self::load(&path)).transpose()
    }
}

/// Per member, the mean over tasks of its per-task success rate.
fn success_from_outcomes(
    members: &[HarnessId],
    outcomes: &BTreeMap<String, BTreeMap<HarnessId, TaskOutcome>>,
) -> BTreeMap<HarnessId, f64> {
    members
        .iter()
        .map(|id| {
            let rates: Vec<f64> = outcomes
                .values()
                .filter_map(|row| row.get(id))
                .filter(|o| o.attempts > 0)
                .map(TaskOutcome::rate)
                .collect();
            let mean = if rates.is_empty() {
                0.0
            } else {
                rates.iter().sum::<f64>() / rates.len() as f64
            };
            (id.clone(), mean)
        })
        .collect()
}
