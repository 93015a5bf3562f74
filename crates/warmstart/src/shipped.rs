//! Checkpoints shipped inside the crate, so the main job's default starts in seconds.
//!
//! The warm start of the main job's default ([`WarmStartSettings::default`] with seed 42, the
//! run configuration's default seed) takes about fifteen minutes on two CPU cores. Its result is
//! small (0.7 M f32 parameters, 2.8 MB), so the folder it writes is compiled into this crate
//! and [`crate::warm_start`] installs it into the cache instead of training when the settings
//! hash to its name ([`crate::cache_dir_name`]). Any other settings or seed train as before.
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

/// One shipped warm-start folder: its name (`warmstart-<hash>`) and its files.
#[derive(Debug, Clone, Copy)]
pub struct ShippedCheckpoint {
    /// The cache folder name ([`cache_dir_name`] of the settings it was made with).
    pub name: &'static str,
    /// The seed of the settings it was made with (the other settings are the defaults).
    pub seed: u64,
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

/// The checkpoints shipped with this version of the crate.
pub const SHIPPED: &[ShippedCheckpoint] = &[ShippedCheckpoint {
    name: "warmstart-ec575d556536a13b",
    seed: 42,
    files: &[
        shipped_file!("warmstart-ec575d556536a13b", "config.json"),
        shipped_file!("warmstart-ec575d556536a13b", "generation_config.json"),
        shipped_file!("warmstart-ec575d556536a13b", "model.safetensors"),
        shipped_file!("warmstart-ec575d556536a13b", "tokenizer.json"),
        shipped_file!("warmstart-ec575d556536a13b", "tokenizer_config.json"),
        shipped_file!("warmstart-ec575d556536a13b", "warmstart.json"),
    ],
}];

/// The shipped checkpoint made with `settings`, if any.
pub fn shipped_for(settings: &WarmStartSettings) -> Option<&'static ShippedCheckpoint> {
    let name = cache_dir_name(settings);
    SHIPPED.iter().find(|s| s.name == name)
}

impl ShippedCheckpoint {
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
