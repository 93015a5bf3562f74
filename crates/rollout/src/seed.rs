//! Seeds: every random draw of a run is a pure function of the run seed and where it happens,
//! so a run is reproducible from its config and a resumed run needs no RNG stream state.

/// What a derived seed is for. Each phase gets its own stream, so a rescue rollout never gets
/// the seed of a base rollout of the same task and slot.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[repr(u64)]
pub enum Phase {
    /// The K initial rollouts under H0 (and a fixed mixture's rollouts).
    Base = 1,
    /// Fresh rescue rollouts.
    Rescue = 2,
    /// The seed handed to a selector, or to the random-harness draw.
    Select = 3,
    /// Validation rollouts.
    Eval = 4,
    /// The task order of an epoch.
    Order = 5,
    /// A calibration's paired validation executions.
    Calibrate = 6,
}

/// One SplitMix64 step: a bijection on u64 with good avalanche.
pub fn mix(mut z: u64) -> u64 {
    z = z.wrapping_add(0x9E37_79B9_7F4A_7C15);
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

/// FNV-1a of a task id, so seeds depend on the task itself rather than its position.
pub fn task_hash(task_id: &str) -> u64 {
    task_id.bytes().fold(0xcbf2_9ce4_8422_2325u64, |h, b| {
        (h ^ u64::from(b)).wrapping_mul(0x0000_0100_0000_01B3)
    })
}

/// The seed of one draw: run seed, phase, update, task (its id and its draw number in the task
/// order, so a task drawn twice in one update gets fresh seeds) and slot.
pub fn derive_seed(
    run_seed: u64,
    phase: Phase,
    update: u64,
    task_id: &str,
    draw: u64,
    slot: u64,
) -> u64 {
    let mut h = mix(run_seed ^ mix(phase as u64));
    h = mix(h ^ update);
    h = mix(h ^ task_hash(task_id));
    h = mix(h ^ draw);
    mix(h ^ slot)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn phases_update_tasks_and_slots_all_change_the_seed() {
        let s = derive_seed(7, Phase::Base, 3, "t", 0, 1);
        assert_ne!(s, derive_seed(7, Phase::Rescue, 3, "t", 0, 1));
        assert_ne!(s, derive_seed(7, Phase::Base, 4, "t", 0, 1));
        assert_ne!(s, derive_seed(7, Phase::Base, 3, "u", 0, 1));
        assert_ne!(s, derive_seed(7, Phase::Base, 3, "t", 1, 1));
        assert_ne!(s, derive_seed(7, Phase::Base, 3, "t", 0, 2));
        assert_ne!(s, derive_seed(8, Phase::Base, 3, "t", 0, 1));
        assert_eq!(s, derive_seed(7, Phase::Base, 3, "t", 0, 1));
    }
}
