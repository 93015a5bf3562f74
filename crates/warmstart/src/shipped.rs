//! Checkpoints shipped inside the crate, so the main job's default starts in seconds.
//!
//! The warm start of [`WarmStartSettings::default`] with seed 42 (the run configuration's
//! default seed; the recovery-hooks organism) takes about fifteen minutes on two CPU cores. Its
//! result is small (0.7 M f32 parameters, 2.8 MB), so the folder it writes is compiled into this
//! crate and [`crate::warm_start`] installs it into the cache instead of training when the
//! settings hash to its name ([`crate::cache_dir_name`]). So are the organism variants
//! `docs/STUDY.md`'s study reports, the main job's among them (the prompt-rules organism with
//! unprompted rate 0.1; [`SHIPPED`] lists each with its settings). Any other settings or seed
//! train as before.
//!
//! A shipped checkpoint is nothing but a cached one made by this crate's own code: rebuild it
//! with `cargo run -p harness-warmstart --release --example base_rates -- --train --cache
//! runs/fresh --settings s.json` (`s.json` = `{"seed": 42}`; the folder appears under
//! `runs/fresh`), and
//! `HARNESS_SLOW_TESTS=1 cargo test --release -p harness-warmstart --test shipped` trains it
//! again and compares the bytes.

use std::path::Path;

use crate::error::{Error, Result};
use crate::settings::WarmStartSettings;
use crate::warm::cache_dir_name;

/// One shipped warm-start folder: its name (`warmstart-<hash>`), the settings it was made
/// with and its files.
#[derive(Debug, Clone, Copy)]
pub struct ShippedCheckpoint {
    /// The cache folder name ([`cache_dir_name`] of the settings it was made with).
    pub name: &'static str,
    /// The settings it was made with, as the JSON document over the defaults that
    /// [`WarmStartSettings::from_json`] reads (`{"seed": 42}` for the main job's default).
    pub settings: &'static str,
    /// The folder's files, as written by the warm start.
    pub files: &'static [(&'static str, &'static [u8])],
}

macro_rules! shipped_file {
    ($dir:literal, $file:literal) => {
        (
            $file,
            include_bytes!(concat!("../shipped/", $dir, "/", $file)) as &[u8],
        )
    };
}

/// A shipped folder `$dir` made with `$settings`, with the six files a warm start writes.
macro_rules! shipped_checkpoint {
    ($dir:literal, $settings:expr) => {
        ShippedCheckpoint {
            name: $dir,
            settings: $settings,
            files: &[
                shipped_file!($dir, "config.json"),
                shipped_file!($dir, "generation_config.json"),
                shipped_file!($dir, "model.safetensors"),
                shipped_file!($dir, "tokenizer.json"),
                shipped_file!($dir, "tokenizer_config.json"),
                shipped_file!($dir, "warmstart.json"),
            ],
        }
    };
}

/// The checkpoints shipped with this version of the crate: the main job's default, and the
/// prompt-rules organism with unprompted good rate 0 and 0.1 (`docs/STUDY.md`), each with seed
/// 42.
pub const SHIPPED: &[ShippedCheckpoint] = &[
    shipped_checkpoint!("warmstart-ec575d556536a13b", r#"{"seed": 42}"#),
    shipped_checkpoint!(
        "warmstart-d56b47a518749634",
        r#"{"seed": 42, "organism": "prompt_rules", "unprompted_good_rate": 0.0}"#
    ),
    shipped_checkpoint!(
        "warmstart-8eba49613f465378",
        r#"{"seed": 42, "organism": "prompt_rules", "unprompted_good_rate": 0.1}"#
    ),
];

/// The shipped checkpoint made with `settings`, if any.
pub fn shipped_for(settings: &WarmStartSettings) -> Option<&'static ShippedCheckpoint> {
    let name = cache_dir_name(settings);
    SHIPPED.iter().find(|s| s.name == name)
}

impl ShippedCheckpoint {
    /// The settings it was made with.
    pub fn settings(&self) -> Result<WarmStartSettings> {
        WarmStartSettings::from_json(self.settings)
    }

    /// Write the folder's files into `dir` (created).
    pub fn write_to(&self, dir: &Path) -> Result<()> {
        std::fs::create_dir_all(dir).map_err(|e| Error::io(dir, e))?;
        for (file, bytes) in self.files {
            let path = dir.join(file);
            harness_core::fsutil::write_atomic(&path, bytes).map_err(|e| Error::io(&path, e))?;
        }
        Ok(())
    }
}
