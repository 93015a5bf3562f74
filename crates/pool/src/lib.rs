//! # harness-pool
//!
//! The *Sibling Harness Pool* of harness-s (paper Eq. 4 and "Complementary Harness Rescue
//! Training"): the base harness H0 and the auxiliary harnesses descended from it, each with its
//! lineage (parent, generation, repair direction, targeted root causes, editor notes, local
//! evaluation). Directional evolution (`harness-evolve`) writes pools; rescue training
//! (`harness-rollout`) and the router (`harness-router`) read them. The paper fixes the pool
//! during training: a [frozen](SiblingPool::freeze) pool refuses additions.
//!
//! Members are addressed by their content-hash [`HarnessId`](harness_core::HarnessId) and keep the order in which they
//! were added, base first. On disk a pool is a directory:
//!
//! ```text
//! pool/
//!   pool.json              {"format": 1, "base": id, "members": [ids...], "frozen": bool, "settings": {...}}
//!   harnesses/<id>.json    one harness per member, named by its id
//! ```
//!
//! ```
//! use harness_core::Harness;
//! use harness_pool::SiblingPool;
//!
//! let base = Harness::new("H0", "You solve tasks with tools.");
//! let mut sibling = base.clone();
//! sibling.name = "S1-short-budget".into();
//! sibling.limits.max_env_actions = 10;
//!
//! let mut pool = SiblingPool::new(base)?;
//! let id = pool.add_sibling(sibling, 1, Some("spend fewer actions".into()))?;
//! pool.freeze();
//! assert_eq!(pool.auxiliaries().count(), 1);
//! assert_eq!(pool.get(&id).unwrap().lineage.parent, Some(pool.base_id().clone()));
//! assert!(pool.add(Harness::new("late", "too late")).is_err());
//!
//! let dir = tempfile::tempdir().unwrap();
//! pool.save(dir.path())?;
//! assert_eq!(SiblingPool::load(dir.path())?, pool);
//! # Ok::<(), harness_pool::Error>(())
//! ```

mod error;
mod lineage;
mod pool;
pub mod sibling;

pub use error::{Error, Result};
pub use pool::{HARNESS_DIR, POOL_FILE, POOL_FORMAT, PoolFile, SiblingPool};

// The README's examples compile and run as doctests.
#[cfg(doctest)]
#[doc = include_str!("../README.md")]
struct ReadmeDoctests;
