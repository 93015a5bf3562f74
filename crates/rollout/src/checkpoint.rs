//! Crash-safe checkpoints of a run. Each is a folder `checkpoints/update-NNNNNNNN/` holding
//! `state.json` (the loop's position, counters, offsets, the calibrator's snapshot) and
//! `learner/` (whatever [`harness_core::Learner::save_checkpoint`] writes: weights, optimizer,
//! RNG). A checkpoint is written into `.update-NNNNNNNN.partial/`, renamed into place when
//! complete, and only then named by `checkpoints/latest` (replaced atomically); older ones are
//! pruned after that, so a crash at any moment leaves the previous complete checkpoint loadable.

use std::path::{Path, PathBuf};

use harness_core::{HarnessId, Learner};
use serde::{Deserialize, Serialize};

use crate::error::{Error, Result};
use crate::files::{CHECKPOINT_DIR, Offsets};
use crate::metrics::Cost;
use crate::order::Cursor;

/// The pointer file naming the latest complete checkpoint.
pub const LATEST_FILE: &str = "latest";
/// The loop's state inside a checkpoint folder (written last).
pub const STATE_FILE: &str = "state.json";
/// The learner's folder inside a checkpoint folder.
pub const LEARNER_DIR: &str = "learner";
/// The `format` of [`CheckpointState`].
pub const CHECKPOINT_FORMAT: u32 = 1;

/// Everything besides the learner that the next update depends on.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CheckpointState {
    /// Always [`CHECKPOINT_FORMAT`].
    pub format: u32,
    /// Updates applied.
    pub update: u64,
    /// Position in the task order. Every other random draw of the loop is derived from the run
    /// seed and this position (see [`crate::seed`]), so this is the loop's whole RNG state; the
    /// learner's RNG is in `learner/`.
    pub cursor: Cursor,
    /// Position in the stream of extra draws ([`crate::order::TaskOrder::extra`], dynamic
    /// sampling's); left out while unused, so other strategies write what they wrote before.
    #[serde(default, skip_serializing_if = "is_start")]
    pub extra_cursor: Cursor,
    /// The policy version rollouts use next.
    pub policy_version: u64,
    /// Calibrations taken (the next one's index).
    pub calibrations: u32,
    /// Whether the final re-anchoring has run (the run is complete).
    pub finished: bool,
    /// Lengths of the JSONL files after this update.
    pub offsets: Offsets,
    /// Cost totals so far.
    pub cost: Cost,
    /// The calibrator's [`harness_core::Calibrate::snapshot`].
    pub calibrator: serde_json::Value,
    /// The run's config, to refuse resuming with another.
    pub config: serde_json::Value,
    /// The pool's members in order, to refuse resuming with another pool.
    pub pool: Vec<HarnessId>,
}

fn is_start(c: &Cursor) -> bool {
    *c == Cursor::default()
}

/// The learner folder of the checkpoint taken after `update` updates, when it exists: the
/// policy a calibration at that point measures.
pub fn learner_dir_at(run_dir: &Path, update: u64) -> Option<PathBuf> {
    let dir = run_dir
        .join(CHECKPOINT_DIR)
        .join(folder_name(update))
        .join(LEARNER_DIR);
    dir.is_dir().then_some(dir)
}

fn folder_name(update: u64) -> String {
    format!("update-{update:08}")
}

/// Write a checkpoint of `state` and `learner` under `run_dir`, keep the newest `keep`
/// complete ones, and return the new folder.
pub fn write_checkpoint(
    run_dir: &Path,
    state: &CheckpointState,
    learner: &dyn Learner,
    keep: usize,
) -> Result<PathBuf> {
    let root = run_dir.join(CHECKPOINT_DIR);
    std::fs::create_dir_all(&root).map_err(|e| Error::io(&root, e))?;
    let name = folder_name(state.update);
    let partial = root.join(format!(".{name}.partial"));
    if partial.exists() {
        std::fs::remove_dir_all(&partial).map_err(|e| Error::io(&partial, e))?;
    }
    let learner_dir = partial.join(LEARNER_DIR);
    std::fs::create_dir_all(&learner_dir).map_err(|e| Error::io(&learner_dir, e))?;
    learner.save_checkpoint(&learner_dir)?;
    let json = serde_json::to_vec_pretty(state)
        .unwrap_or_else(|_| unreachable!("the state is plain data"));
    harness_core::fsutil::write_atomic(&partial.join(STATE_FILE), &json)?;
    sync_dir(&partial);
    let target = root.join(&name);
    // The final checkpoint of a run can land on the update of a periodic one. The old folder
    // is moved aside (not deleted) until the new one is in place: a crash between the two
    // renames leaves `.update-N.old`, which the loader still accepts.
    let old = root.join(format!(".{name}.old"));
    if target.exists() {
        if old.exists() {
            std::fs::remove_dir_all(&old).map_err(|e| Error::io(&old, e))?;
        }
        std::fs::rename(&target, &old).map_err(|e| Error::io(&old, e))?;
    }
    std::fs::rename(&partial, &target).map_err(|e| Error::io(&target, e))?;
    sync_dir(&root);
    if old.exists() {
        std::fs::remove_dir_all(&old).map_err(|e| Error::io(&old, e))?;
    }
    harness_core::fsutil::write_atomic(&root.join(LATEST_FILE), name.as_bytes())?;
    prune(&root, keep)?;
    Ok(target)
}

fn sync_dir(dir: &Path) {
    // Best effort: makes the renames durable across power loss; a process crash does not need it.
    if let Ok(f) = std::fs::File::open(dir) {
        let _ = f.sync_all();
    }
}

/// Complete checkpoint folders, oldest first. A folder moved aside by an interrupted swap
/// (`.update-N.old`) counts, below a complete `update-N`.
fn complete(root: &Path) -> Result<Vec<(u64, PathBuf)>> {
    let mut out: Vec<(u64, bool, PathBuf)> = Vec::new();
    let entries = match std::fs::read_dir(root) {
        Ok(e) => e,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Vec::new()),
        Err(e) => return Err(Error::io(root, e)),
    };
    for entry in entries.flatten() {
        let name = entry.file_name().to_string_lossy().into_owned();
        let moved_aside = name.strip_prefix('.').and_then(|n| n.strip_suffix(".old"));
        let Some(n) = moved_aside
            .unwrap_or(&name)
            .strip_prefix("update-")
            .and_then(|n| n.parse::<u64>().ok())
        else {
            continue;
        };
        if entry.path().join(STATE_FILE).is_file() {
            out.push((n, moved_aside.is_none(), entry.path()));
        }
    }
    out.sort();
    Ok(out.into_iter().map(|(n, _, path)| (n, path)).collect())
}

fn prune(root: &Path, keep: usize) -> Result<()> {
    let all = complete(root)?;
    let drop = all.len().saturating_sub(keep.max(1));
    for (_, path) in &all[..drop] {
        std::fs::remove_dir_all(path).map_err(|e| Error::io(path, e))?;
    }
    // Partial folders of crashed writes.
    for entry in std::fs::read_dir(root)
        .map_err(|e| Error::io(root, e))?
        .flatten()
    {
        let name = entry.file_name().to_string_lossy().into_owned();
        if name.starts_with('.') && name.ends_with(".partial") {
            let _ = std::fs::remove_dir_all(entry.path());
        }
    }
    Ok(())
}

/// The latest complete checkpoint of `run_dir`: the folder `latest` names when it is complete,
/// else the newest complete folder. `None` when there is none.
pub fn latest_checkpoint(run_dir: &Path) -> Result<Option<(PathBuf, CheckpointState)>> {
    let root = run_dir.join(CHECKPOINT_DIR);
    let pointer = root.join(LATEST_FILE);
    let named = match std::fs::read_to_string(&pointer) {
        Ok(text) => {
            let name = text.trim();
            // The pointer names a folder beside it; anything else (`../x`, `/x`) would load
            // a checkpoint from outside the run.
            let plain = name != "." && name != ".." && !name.contains(['/', '\\', '\0']);
            if !plain {
                return Err(Error::run_dir(
                    &pointer,
                    format!(
                        "expected the name of a checkpoint folder beside it (no `/`, `\\` or \
                         `..`), found `{}`",
                        name.escape_debug()
                    ),
                ));
            }
            // An empty pointer dangles like one naming a removed folder.
            Some(root.join(name)).filter(|p| !name.is_empty() && p.join(STATE_FILE).is_file())
        }
        Err(_) => None,
    };
    let dir = match named {
        Some(dir) => dir,
        None => match complete(&root)?.pop() {
            Some((_, dir)) => dir,
            None => return Ok(None),
        },
    };
    let state_path = dir.join(STATE_FILE);
    let text = std::fs::read_to_string(&state_path).map_err(|e| Error::io(&state_path, e))?;
    let de = &mut serde_json::Deserializer::from_str(&text);
    let state: CheckpointState = serde_path_to_error::deserialize(de).map_err(|e| {
        let at = e.path().to_string();
        Error::run_dir(&state_path, format!("at `{at}`: {}", e.into_inner()))
    })?;
    if state.format != CHECKPOINT_FORMAT {
        return Err(Error::run_dir(
            &state_path,
            format!(
                "checkpoint format {} is not the supported {CHECKPOINT_FORMAT}",
                state.format
            ),
        ));
    }
    Ok(Some((dir, state)))
}

#[cfg(test)]
mod tests {
    use super::*;

    struct Tiny;

    #[async_trait::async_trait]
    impl Learner for Tiny {
        async fn update(
            &mut self,
            _: &[harness_core::Group],
        ) -> harness_core::Result<harness_core::UpdateReport> {
            Ok(Default::default())
        }
        fn save_checkpoint(&self, dir: &Path) -> harness_core::Result<()> {
            std::fs::write(dir.join("w"), b"1").map_err(|e| harness_core::Error::io(dir, e))
        }
        fn load_checkpoint(&mut self, _: &Path) -> harness_core::Result<()> {
            Ok(())
        }
    }

    fn state(update: u64) -> CheckpointState {
        CheckpointState {
            format: CHECKPOINT_FORMAT,
            update,
            cursor: Cursor::default(),
            extra_cursor: Cursor::default(),
            policy_version: update,
            calibrations: 0,
            finished: false,
            offsets: Offsets::default(),
            cost: Cost::default(),
            calibrator: serde_json::Value::Null,
            config: serde_json::Value::Null,
            pool: Vec::new(),
        }
    }

    #[test]
    fn the_newest_complete_checkpoints_are_kept_and_a_dangling_latest_falls_back() {
        let dir = tempfile::tempdir().unwrap();
        assert!(latest_checkpoint(dir.path()).unwrap().is_none());
        for u in 1..=4 {
            write_checkpoint(dir.path(), &state(u), &Tiny, 2).unwrap();
        }
        let root = dir.path().join(CHECKPOINT_DIR);
        let mut names: Vec<String> = std::fs::read_dir(&root)
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .collect();
        names.sort();
        assert_eq!(names, vec!["latest", "update-00000003", "update-00000004"]);
        assert_eq!(latest_checkpoint(dir.path()).unwrap().unwrap().1.update, 4);
        // A crash between removing a folder and renaming its replacement: `latest` dangles.
        std::fs::remove_dir_all(root.join("update-00000004")).unwrap();
        assert_eq!(latest_checkpoint(dir.path()).unwrap().unwrap().1.update, 3);
        // Rewriting the same update replaces it.
        let mut again = state(3);
        again.finished = true;
        write_checkpoint(dir.path(), &again, &Tiny, 2).unwrap();
        assert!(latest_checkpoint(dir.path()).unwrap().unwrap().1.finished);
    }

    /// The pointer names a folder beside it: one that leads out of the checkpoints (`../x`,
    /// an absolute path) is an error naming the pointer, never loaded.
    #[test]
    fn a_latest_pointer_that_escapes_the_checkpoints_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        let run = dir.path().join("run");
        write_checkpoint(&run, &state(1), &Tiny, 2).unwrap();
        // A complete checkpoint outside the run that an escaping pointer would reach.
        let elsewhere = dir.path().join("elsewhere");
        write_checkpoint(&elsewhere, &state(9), &Tiny, 2).unwrap();
        let target = elsewhere.join(CHECKPOINT_DIR).join("update-00000009");
        let pointer = run.join(CHECKPOINT_DIR).join(LATEST_FILE);
        for name in [
            "../../elsewhere/checkpoints/update-00000009".to_string(),
            target.display().to_string(),
            "..".to_string(),
            "..\\..\\elsewhere".to_string(),
        ] {
            std::fs::write(&pointer, &name).unwrap();
            let err = latest_checkpoint(&run).unwrap_err().to_string();
            assert!(
                err.contains(&pointer.display().to_string())
                    && err.contains("checkpoint folder beside it"),
                "{name}: {err}"
            );
        }
        std::fs::write(&pointer, "update-00000001\n").unwrap();
        assert_eq!(latest_checkpoint(&run).unwrap().unwrap().1.update, 1);
    }

    #[test]
    fn a_swap_interrupted_between_its_renames_keeps_the_previous_checkpoint() {
        // keep = 1: the only checkpoint is the one being replaced by the final one.
        let dir = tempfile::tempdir().unwrap();
        write_checkpoint(dir.path(), &state(4), &Tiny, 1).unwrap();
        let root = dir.path().join(CHECKPOINT_DIR);
        // What the swap leaves after its first rename: the old folder moved aside, the new
        // one not yet in place.
        std::fs::rename(
            root.join("update-00000004"),
            root.join(".update-00000004.old"),
        )
        .unwrap();
        let (path, loaded) = latest_checkpoint(dir.path())
            .unwrap()
            .expect("the old one loads");
        assert_eq!(loaded.update, 4);
        assert!(path.ends_with(".update-00000004.old"));
        // The next write completes the swap and leaves no folder aside.
        let mut last = state(4);
        last.finished = true;
        write_checkpoint(dir.path(), &last, &Tiny, 1).unwrap();
        assert!(latest_checkpoint(dir.path()).unwrap().unwrap().1.finished);
        assert!(!root.join(".update-00000004.old").exists());
        // A completed swap replaces in place, removing the folder it moved aside.
        write_checkpoint(dir.path(), &state(4), &Tiny, 1).unwrap();
        let names: Vec<String> = std::fs::read_dir(&root)
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .collect();
        assert!(!names.iter().any(|n| n.ends_with(".old")), "{names:?}");
    }
}
