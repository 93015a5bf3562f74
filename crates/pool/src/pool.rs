//! [`SiblingPool`]: the members, their order, the frozen flag, and the directory format.

use std::collections::{BTreeMap, HashMap};
use std::path::{Path, PathBuf};

use harness_core::{Harness, HarnessId};
use serde::{Deserialize, Serialize};

use crate::error::{Error, Result};

/// The pool's index file inside a pool directory.
pub const POOL_FILE: &str = "pool.json";
/// The folder of member harnesses inside a pool directory (`<id>.json` each).
pub const HARNESS_DIR: &str = "harnesses";
/// The `format` written into `pool.json`.
pub const POOL_FORMAT: u32 = 1;

/// The contents of `pool.json`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PoolFile {
    /// Always [`POOL_FORMAT`].
    pub format: u32,
    /// The base harness H0 (a member).
    pub base: HarnessId,
    /// Every member, base included, in pool order.
    pub members: Vec<HarnessId>,
    /// Whether the pool is fixed (no additions).
    pub frozen: bool,
    /// The settings that produced the pool (evolution config, starter name, ...).
    #[serde(default)]
    pub settings: serde_json::Value,
}

/// The base harness H0 and its auxiliary siblings (paper: `H = {H0, H1, ..., HM}`).
#[derive(Debug, Clone, PartialEq)]
pub struct SiblingPool {
    base: HarnessId,
    members: Vec<Harness>,
    index: HashMap<HarnessId, usize>,
    frozen: bool,
    settings: serde_json::Value,
}

impl SiblingPool {
    /// A pool holding only `base`, which must be a valid harness.
    pub fn new(base: Harness) -> Result<Self> {
        base.validate()
            .map_err(|e| Error::Member(format!("base harness `{}`: {e}", base.name)))?;
        let id = base.id();
        Ok(SiblingPool {
            base: id.clone(),
            index: HashMap::from([(id, 0)]),
            members: vec![base],
            frozen: false,
            settings: serde_json::Value::Null,
        })
    }

    /// A starter pool: `base` and hand-written `siblings` of generation 1 (each gets `base` as
    /// its parent when it names none), frozen, with `settings` recorded.
    pub fn starter(
        base: Harness,
        siblings: impl IntoIterator<Item = Harness>,
        settings: serde_json::Value,
    ) -> Result<Self> {
        let mut pool = SiblingPool::new(base)?;
        for sibling in siblings {
            let direction = (!sibling.description.is_empty()).then(|| sibling.description.clone());
            pool.add_sibling(sibling, 1, direction)?;
        }
        pool.set_settings(settings)?;
        pool.freeze();
        Ok(pool)
    }

    /// Add a member. Refused when the pool is frozen, when the harness is invalid, or when a
    /// member with the same content (the same id) is already there.
    pub fn add(&mut self, harness: Harness) -> Result<HarnessId> {
        if self.frozen {
            return Err(Error::Frozen(format!(
                "cannot add harness `{}`; build a new pool instead",
                harness.name
            )));
        }
        harness
            .validate()
            .map_err(|e| Error::Member(format!("harness `{}` is invalid: {e}", harness.name)))?;
        let id = harness.id();
        if let Some(&i) = self.index.get(&id) {
            return Err(Error::Member(format!(
                "harness `{}` has id {id}, the same content as member `{}`",
                harness.name, self.members[i].name
            )));
        }
        self.index.insert(id.clone(), self.members.len());
        self.members.push(harness);
        Ok(id)
    }

    /// Add a sibling descended from the base: its lineage gets the base as parent (unless it
    /// names one), `generation` and `direction` (unless it has one).
    pub fn add_sibling(
        &mut self,
        mut harness: Harness,
        generation: u32,
        direction: Option<String>,
    ) -> Result<HarnessId> {
        if harness.lineage.parent.is_none() {
            harness.lineage.parent = Some(self.base.clone());
        }
        harness.lineage.generation = generation;
        if harness.lineage.direction.is_none() {
            harness.lineage.direction = direction;
        }
        self.add(harness)
    }

    /// Fix the pool: later additions are refused.
    pub fn freeze(&mut self) {
        self.frozen = true;
    }

    /// Whether the pool is fixed.
    pub fn is_frozen(&self) -> bool {
        self.frozen
    }

    /// The settings that produced the pool.
    pub fn settings(&self) -> &serde_json::Value {
        &self.settings
    }

    /// Record the settings that produced the pool (refused once frozen).
    pub fn set_settings(&mut self, settings: serde_json::Value) -> Result<()> {
        if self.frozen {
            return Err(Error::Frozen("cannot change its settings".into()));
        }
        self.settings = settings;
        Ok(())
    }

    /// The base harness H0.
    pub fn base(&self) -> &Harness {
        &self.members[self.index[&self.base]]
    }

    /// H0's id.
    pub fn base_id(&self) -> &HarnessId {
        &self.base
    }

    /// Every member, base included, in pool order.
    pub fn members(&self) -> &[Harness] {
        &self.members
    }

    /// The auxiliary harnesses (every member but H0), in pool order: the candidates of rescue
    /// (Eq. 10).
    pub fn auxiliaries(&self) -> impl Iterator<Item = &Harness> {
        self.members.iter().filter(move |h| h.id() != self.base)
    }

    /// Every member's id, in pool order.
    pub fn ids(&self) -> Vec<HarnessId> {
        self.members.iter().map(Harness::id).collect()
    }

    /// The member with this id.
    pub fn get(&self, id: &HarnessId) -> Option<&Harness> {
        self.index.get(id).map(|&i| &self.members[i])
    }

    /// Whether a member has this id.
    pub fn contains(&self, id: &HarnessId) -> bool {
        self.index.contains_key(id)
    }

    /// Members, base included.
    pub fn len(&self) -> usize {
        self.members.len()
    }

    /// Never true: a pool always holds its base.
    pub fn is_empty(&self) -> bool {
        self.members.is_empty()
    }

    /// The `pool.json` contents of this pool.
    pub fn pool_file(&self) -> PoolFile {
        PoolFile {
            format: POOL_FORMAT,
            base: self.base.clone(),
            members: self.ids(),
            frozen: self.frozen,
            settings: self.settings.clone(),
        }
    }

    /// Write the pool into `dir`: every member to `harnesses/<id>.json`, then `pool.json`, each
    /// atomically, so that a reader sees the old index or the complete new pool.
    pub fn save(&self, dir: impl AsRef<Path>) -> Result<()> {
        let dir = dir.as_ref();
        let harness_dir = dir.join(HARNESS_DIR);
        for harness in &self.members {
            harness.save(harness_dir.join(format!("{}.json", harness.id())))?;
        }
        let mut text = serde_json::to_string_pretty(&self.pool_file())
            .unwrap_or_else(|_| unreachable!("the pool index is plain data"));
        text.push('\n');
        harness_core::fsutil::write_atomic(&dir.join(POOL_FILE), text.as_bytes())?;
        Ok(())
    }

    /// Read and validate a pool directory. Every error names the file at fault: a missing
    /// `pool.json` or member file, a malformed index, a member whose content hash differs from
    /// its file name, a member listed twice, a base that is not a member, an invalid harness.
    pub fn load(dir: impl AsRef<Path>) -> Result<Self> {
        let dir = dir.as_ref();
        let index_path = dir.join(POOL_FILE);
        let text = std::fs::read_to_string(&index_path).map_err(|e| Error::Invalid {
            file: index_path.clone(),
            message: format!("cannot read the pool index ({e}); a pool directory holds {POOL_FILE} and {HARNESS_DIR}/<id>.json"),
        })?;
        let deserializer = &mut serde_json::Deserializer::from_str(&text);
        let file: PoolFile = serde_path_to_error::deserialize(deserializer).map_err(|e| {
            let path = e.path().to_string();
            Error::Invalid {
                file: index_path.clone(),
                message: format!("at `{path}`: {}", e.into_inner()),
            }
        })?;
        if file.format != POOL_FORMAT {
            return Err(invalid(
                &index_path,
                format!("at `format`: expected {POOL_FORMAT}, found {}", file.format),
            ));
        }
        // Ids become file names (`harnesses/<id>.json`): one that is not an id's form could
        // name a file outside the pool (`../../x`).
        for (field, id) in std::iter::once(("base", &file.base))
            .chain(file.members.iter().map(|id| ("members", id)))
        {
            if !id.is_well_formed() {
                return Err(invalid(
                    &index_path,
                    format!(
                        "at `{field}`: `{id}` is not a harness id; expected {} lower-case hex digits",
                        HarnessId::LEN
                    ),
                ));
            }
        }
        let mut seen: BTreeMap<&HarnessId, usize> = BTreeMap::new();
        for (i, id) in file.members.iter().enumerate() {
            if let Some(first) = seen.insert(id, i) {
                return Err(invalid(
                    &index_path,
                    format!("at `members`: id {id} is listed twice (positions {first} and {i})"),
                ));
            }
        }
        if !seen.contains_key(&file.base) {
            return Err(invalid(
                &index_path,
                format!(
                    "at `base`: {} is not a member; the base harness must be listed in `members`",
                    file.base
                ),
            ));
        }
        let mut members = Vec::with_capacity(file.members.len());
        for (i, id) in file.members.iter().enumerate() {
            let path = member_path(dir, id);
            if !path.is_file() {
                // The index is at fault (or the folder lost a file): name both.
                return Err(invalid(
                    &index_path,
                    format!(
                        "at `members[{i}]`: member {id} is listed but its file {} is missing",
                        path.display()
                    ),
                ));
            }
            let harness = Harness::load(&path)?;
            let actual = harness.id();
            if &actual != id {
                return Err(invalid(
                    &path,
                    format!(
                        "content hash is {actual} but the file is named {id}: the harness was edited after it was pooled"
                    ),
                ));
            }
            members.push(harness);
        }
        let index = file
            .members
            .iter()
            .enumerate()
            .map(|(i, id)| (id.clone(), i))
            .collect();
        Ok(SiblingPool {
            base: file.base,
            members,
            index,
            frozen: file.frozen,
            settings: file.settings,
        })
    }

    /// A readable lineage tree: every member under its parent, with generation, direction and
    /// targeted causes.
    pub fn render_lineage(&self) -> String {
        crate::lineage::render(self)
    }
}

fn member_path(dir: &Path, id: &HarnessId) -> PathBuf {
    dir.join(HARNESS_DIR).join(format!("{id}.json"))
}

fn invalid(file: &Path, message: String) -> Error {
    Error::Invalid {
        file: file.to_path_buf(),
        message,
    }
}
