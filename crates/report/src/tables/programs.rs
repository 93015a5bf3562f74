//! Agent programs in the pool (external harnesses): what each method's training drew from
//! them, and how much history their programs rewrote (the recording proxy's prefix check).
//!
//! A program is a pool member whose harness file has a `program` (harness-external); a
//! seed's `programs.json` lists those of the pool it trained on. For each method that trained,
//! a program's rollouts are its rescue rollouts (`groups.jsonl`'s `rescue_harnesses` and
//! `rescue_rewards`) and its share of the other kept groups (`retained_harnesses`: a fixed
//! mixture, or H0's when H0 is one);
//! its successes are those with reward 1. The prefix breaks are the method's
//! (`metrics.jsonl`'s `prefix_breaks`, summed over updates): turns whose prompt tokens did not
//! extend the previous turn's context and completion, counted over every program episode of
//! the method's training rollouts. Groups a rescue replaced keep no record of their base
//! harness, so a program H0's rollouts in them are not counted.

use std::collections::BTreeMap;

use harness_core::{GroupOrigin, HarnessId};
use serde::{Deserialize, Serialize};

use crate::layout::Run;
use crate::render::TextTable;
use crate::stats::{Stat, fmt_stat};

/// One method's use of one program.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ProgramRow {
    /// The method.
    pub method: String,
    /// Its display label.
    pub label: String,
    /// The program's name.
    pub program: String,
    /// Its training rollouts (rescue and mixture) over seeds.
    pub rollouts: Stat,
    /// Of which successful, over seeds.
    pub successes: Stat,
    /// The method's prefix breaks over seeds (every program episode of its training).
    pub prefix_breaks: Stat,
}

/// A program's paired outcomes against H0 at the first calibration.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ProgramCalibration {
    /// The program's name.
    pub program: String,
    /// Validation tasks it solves where H0 fails, over seeds.
    pub repaired: Stat,
    /// Validation tasks H0 solves where it fails, over seeds.
    pub regressed: Stat,
}

/// The agent-program table of a run.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ProgramTable {
    /// Programs in some seed's pool, by name.
    pub programs: Vec<String>,
    /// One row per method that trained and program.
    pub rows: Vec<ProgramRow>,
    /// The first calibration's paired outcomes of each program.
    pub calibration: Vec<ProgramCalibration>,
    /// Seeds in the run.
    pub seeds: usize,
}

/// Compute the table.
pub fn programs(run: &Run) -> ProgramTable {
    let mut names: Vec<String> = run
        .seeds
        .iter()
        .flat_map(|s| s.programs.values().cloned())
        .collect();
    names.sort();
    names.dedup();
    let mut rows = Vec::new();
    for method in run.methods() {
        for program in &names {
            let mut rollouts = Vec::new();
            let mut successes = Vec::new();
            let mut breaks = Vec::new();
            for seed in &run.seeds {
                let pool: &BTreeMap<HarnessId, String> = &seed.programs;
                let Some(m) = seed.methods.get(&method) else {
                    continue;
                };
                // Only methods whose groups ran some program (rescue, mixture, or H0 itself).
                if !m.groups.iter().any(|g| {
                    g.rescue_harnesses
                        .iter()
                        .chain(&g.retained_harnesses)
                        .any(|h| pool.contains_key(h))
                }) {
                    continue;
                }
                let ids: Vec<&HarnessId> = pool
                    .iter()
                    .filter(|(_, n)| *n == program)
                    .map(|(id, _)| id)
                    .collect();
                let (mut n, mut ok) = (0usize, 0usize);
                for g in &m.groups {
                    let mut count = |hs: &[HarnessId], rs: &[f32]| {
                        for (h, r) in hs.iter().zip(rs) {
                            if ids.contains(&h) {
                                n += 1;
                                ok += usize::from(*r >= 1.0);
                            }
                        }
                    };
                    count(&g.rescue_harnesses, &g.rescue_rewards);
                    if g.origin != GroupOrigin::Rescue {
                        // A kept base group (a program H0's) or a mixture.
                        count(&g.retained_harnesses, &g.retained_rewards);
                    }
                }
                rollouts.push(n as f64);
                successes.push(ok as f64);
                breaks.push(m.updates.iter().map(|u| u.prefix_breaks).sum::<u64>() as f64);
            }
            if let (Some(rollouts), Some(successes), Some(prefix_breaks)) =
                (Stat::of(&rollouts), Stat::of(&successes), Stat::of(&breaks))
            {
                rows.push(ProgramRow {
                    label: run.label(&method),
                    method: method.clone(),
                    program: program.clone(),
                    rollouts,
                    successes,
                    prefix_breaks,
                });
            }
        }
    }
    let calibration = names
        .iter()
        .filter_map(|program| {
            let pairs: Vec<(f64, f64)> = run
                .seeds
                .iter()
                .filter_map(|s| s.first_calibration.first())
                .filter_map(|c| c.siblings.get(program))
                .map(|&(a, b)| (a as f64, b as f64))
                .collect();
            Some(ProgramCalibration {
                program: program.clone(),
                repaired: Stat::of(&pairs.iter().map(|p| p.0).collect::<Vec<_>>())?,
                regressed: Stat::of(&pairs.iter().map(|p| p.1).collect::<Vec<_>>())?,
            })
        })
        .collect();
    ProgramTable {
        programs: names,
        rows,
        calibration,
        seeds: run.seeds.len(),
    }
}

impl ProgramTable {
    /// As text.
    pub fn to_text(&self) -> TextTable {
        let n = self.seeds;
        let count = |s: &Stat| fmt_stat(Some(s), 1.0, 1, n);
        let rows = self
            .rows
            .iter()
            .map(|r| {
                let rate = if r.rollouts.mean > 0.0 {
                    format!("{:.1}%", 100.0 * r.successes.mean / r.rollouts.mean)
                } else {
                    "—".into()
                };
                vec![
                    r.label.clone(),
                    r.program.clone(),
                    count(&r.rollouts),
                    count(&r.successes),
                    rate,
                    count(&r.prefix_breaks),
                ]
            })
            .collect();
        let mut notes = vec![
            "Agent programs are external harnesses: each episode runs the program against the environment served over HTTP, and every model call goes through a recording proxy in front of the training policy, so the trajectory is the tokens the policy sampled. Rollouts: the program's rescue rollouts and its share of the other kept groups (a fixed mixture, or H0's when H0 is a program), in groups.jsonl; successes: those with reward 1. Prefix breaks: the method's turns whose prompt did not extend the previous turn's context plus completion (metrics.jsonl), over all its program episodes; such a turn is trained in its own context, or its episode masked with external.prefix = \"mask_episode\".".to_string(),
        ];
        for c in &self.calibration {
            notes.push(format!(
                "First calibration: {} solves {} validation tasks H0 fails and fails {} H0 solves.",
                c.program,
                count(&c.repaired),
                count(&c.regressed)
            ));
        }
        if n > 1 {
            notes.push(format!(
                "Mean ± sample standard deviation (n - 1) over {n} seeds."
            ));
        }
        if self.programs.is_empty() {
            notes.push(
                "Not run: the pool holds no agent program (external.harnesses, external.python_sibling).".into(),
            );
        }
        TextTable {
            title: "Agent programs in the pool: training rollouts and the prefix check".into(),
            header: vec![
                "Method".into(),
                "Program".into(),
                "Rollouts".into(),
                "Successes".into(),
                "Success rate".into(),
                "Prefix breaks".into(),
            ],
            rows,
            notes,
        }
    }
}
