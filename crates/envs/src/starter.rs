//! Starter sibling pools: each built-in environment's base harness H0 with its hand-written
//! siblings (the paper's Table 7 edits for the app world; siblings whose hooks fire on DBBench
//! the repository world and the retail world), frozen, so that rescue training can run before directional
//! evolution (`harness-evolve`) has grown a pool. Evolution writes pools in the same format.

use harness_pool::SiblingPool;

use crate::{appworld, dbbench, swe, tau_retail};

/// The names [`starter_pool`] accepts, in a stable order.
pub const STARTER_ENVIRONMENTS: [&str; 4] = [
    appworld::ENV_NAME,
    dbbench::ENV_NAME,
    swe::ENV_NAME,
    tau_retail::ENV_NAME,
];

/// The frozen starter pool of the built-in environment `env` (as named by
/// [`harness_core::Environment::name`]), or an error listing the known names. The retail
/// world's pool is built on [`tau_retail::base_harness`], whose domain rules are this
/// project's summary of the policy; [`tau_retail::starter_pool_with_policy`] builds it on the
/// benchmark's policy text.
pub fn starter_pool(env: &str) -> harness_pool::Result<SiblingPool> {
    let (base, siblings) = match env {
        appworld::ENV_NAME => (appworld::base_harness(), appworld::siblings()),
        dbbench::ENV_NAME => (dbbench::base_harness(), dbbench::siblings()),
        swe::ENV_NAME => (swe::base_harness(), swe::siblings()),
        tau_retail::ENV_NAME => (tau_retail::base_harness(), tau_retail::siblings()),
        other => {
            return Err(harness_pool::Error::Member(format!(
                "no starter pool for environment `{other}`; expected one of {STARTER_ENVIRONMENTS:?}"
            )));
        }
    };
    SiblingPool::starter(
        base,
        siblings,
        serde_json::json!({"starter": env, "source": "harness-envs built-in siblings"}),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_environment_has_a_frozen_starter_pool_that_round_trips() {
        for env in STARTER_ENVIRONMENTS {
            let pool = starter_pool(env).unwrap();
            assert!(pool.is_frozen(), "{env}");
            assert!(pool.auxiliaries().count() >= 3, "{env}");
            for aux in pool.auxiliaries() {
                assert_eq!(aux.lineage.parent.as_ref(), Some(pool.base_id()), "{env}");
                assert_eq!(aux.lineage.generation, 1, "{env}");
            }
            let dir = tempfile::tempdir().unwrap();
            pool.save(dir.path()).unwrap();
            assert_eq!(SiblingPool::load(dir.path()).unwrap(), pool, "{env}");
        }
    }

    #[test]
    fn an_unknown_environment_names_the_known_ones() {
        let err = starter_pool("webshop").unwrap_err().to_string();
        assert!(err.contains("webshop") && err.contains("appworld"), "{err}");
    }
}
