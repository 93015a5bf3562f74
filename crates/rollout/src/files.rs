//! The run directory's JSONL files and their byte offsets. A checkpoint records the offsets
//! after its update; resuming truncates the files to them, so the lines of an update that was
//! cut short by a crash disappear and are written again, identically.

use std::io::Write;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use crate::error::{Error, Result};

/// One line per update, plus `eval` and `calibration` lines.
pub const METRICS_FILE: &str = "metrics.jsonl";
/// One line per task per update.
pub const GROUPS_FILE: &str = "groups.jsonl";
/// Every training rollout (discarded base attempts included), one trajectory per line.
pub const TRAJECTORIES_FILE: &str = "trajectories.jsonl";
/// The cost totals (Tables 9 and 10).
pub const COST_FILE: &str = "cost.json";
/// The folder of checkpoints.
pub const CHECKPOINT_DIR: &str = "checkpoints";

/// Byte lengths of the JSONL files at a checkpoint.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Offsets {
    /// `metrics.jsonl`.
    pub metrics: u64,
    /// `groups.jsonl`.
    pub groups: u64,
    /// `trajectories.jsonl`.
    pub trajectories: u64,
}

/// The JSONL files of a run directory.
#[derive(Debug, Clone)]
pub(crate) struct RunFiles {
    dir: PathBuf,
}

impl RunFiles {
    pub(crate) fn new(dir: &Path) -> Result<Self> {
        std::fs::create_dir_all(dir).map_err(|e| Error::io(dir, e))?;
        Ok(RunFiles {
            dir: dir.to_path_buf(),
        })
    }

    pub(crate) fn path(&self, name: &str) -> PathBuf {
        self.dir.join(name)
    }

    /// Append records as JSON lines in one write.
    pub(crate) fn append<T: Serialize>(&self, name: &str, records: &[T]) -> Result<()> {
        if records.is_empty() {
            return Ok(());
        }
        let path = self.path(name);
        let mut buf = Vec::new();
        for r in records {
            serde_json::to_writer(&mut buf, r)
                .unwrap_or_else(|_| unreachable!("records are plain data"));
            buf.push(b'\n');
        }
        let mut file = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&path)
            .map_err(|e| Error::io(&path, e))?;
        file.write_all(&buf).map_err(|e| Error::io(&path, e))
    }

    /// The current lengths, synced to disk (called when a checkpoint is taken).
    pub(crate) fn offsets(&self) -> Result<Offsets> {
        let len = |name: &str| -> Result<u64> {
            let path = self.path(name);
            match std::fs::File::open(&path) {
                Ok(f) => {
                    f.sync_all().map_err(|e| Error::io(&path, e))?;
                    Ok(f.metadata().map_err(|e| Error::io(&path, e))?.len())
                }
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(0),
                Err(e) => Err(Error::io(&path, e)),
            }
        };
        Ok(Offsets {
            metrics: len(METRICS_FILE)?,
            groups: len(GROUPS_FILE)?,
            trajectories: len(TRAJECTORIES_FILE)?,
        })
    }

    /// Cut every file back to `offsets` (what a checkpoint saw).
    pub(crate) fn truncate_to(&self, offsets: &Offsets) -> Result<()> {
        for (name, offset) in [
            (METRICS_FILE, offsets.metrics),
            (GROUPS_FILE, offsets.groups),
            (TRAJECTORIES_FILE, offsets.trajectories),
        ] {
            let path = self.path(name);
            let file = match std::fs::OpenOptions::new().write(true).open(&path) {
                Ok(f) => f,
                Err(e) if e.kind() == std::io::ErrorKind::NotFound && offset == 0 => continue,
                Err(e) => return Err(Error::io(&path, e)),
            };
            let len = file.metadata().map_err(|e| Error::io(&path, e))?.len();
            if len < offset {
                return Err(Error::run_dir(
                    &path,
                    format!(
                        "is {len} bytes long but the checkpoint recorded {offset}; the file was cut outside the run, so it cannot be resumed"
                    ),
                ));
            }
            file.set_len(offset).map_err(|e| Error::io(&path, e))?;
        }
        Ok(())
    }

    /// Whether any run file has content (a fresh run refuses such a directory).
    pub(crate) fn has_content(&self) -> bool {
        [METRICS_FILE, GROUPS_FILE, TRAJECTORIES_FILE]
            .iter()
            .any(|n| std::fs::metadata(self.path(n)).is_ok_and(|m| m.len() > 0))
            || self.dir.join(CHECKPOINT_DIR).exists()
    }
}
