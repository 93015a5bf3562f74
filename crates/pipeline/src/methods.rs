//! The methods of the comparison as data.
//!
//! [`METHODS`] is one table from each value of `train.methods` to everything the stages need to
//! know about it: how it forms its retained groups ([`StrategyKind`], built into a
//! harness-rollout [`Strategy`] once the run's group size, pool and first calibration are
//! known), which harness selector its rescue asks and how that selector's evidence is
//! re-anchored ([`SelectorKind`]), whether it updates weights at all, how its policy is
//! evaluated on the test tasks ([`EvalMode`]), its label in the report's tables, and the paper's
//! row it reproduces. The stages read only the entry; none names a method. Adding a method is
//! adding one entry here and its test (the tests below check every entry against docs/MAIN_JOB.md's
//! method table and `--help`).
//!
//! A [`Method`] is a handle on one entry; it is written into files and configurations as its
//! [`MethodSpec::name`].

use std::collections::BTreeMap;
use std::fmt;

use harness_core::{Harness, HarnessId};
use harness_pool::SiblingPool;
use harness_report::EvalMode;
use harness_rollout::config::PAPER_GROUP_SIZE;
use harness_rollout::{Allocation, MixtureEntry, Strategy};
use harness_router::ReanchorMode;
use serde::de::{self, SeqAccess, Visitor};
use serde::{Deserialize, Deserializer, Serialize, Serializer};

/// Rollouts on each selected harness of the paper's LLM Router 4 x 2 ("Rescue allocation
/// variants": it "allocates two rollouts to each of four selected harnesses"; with K = 8 that
/// is four harnesses).
pub const PAPER_ROUTER_PAIRS: usize = 2;
/// Siblings of the paper's Top-4 fixed mixture (Table 1, "GRPO Mixed Harness (DSH H0 + Top-4)":
/// "combines DSH H0 with four selected siblings throughout training").
pub const PAPER_MIXTURE_SIBLINGS: usize = 4;
/// Rollouts under H0 in a fixed mixture's group of [`PAPER_GROUP_SIZE`] ("The Claude Code
/// mixture allocates four rollouts to DSH H0 and four to Claude Code"); another group size
/// keeps the share (half, the odd rollout to H0).
pub const PAPER_MIXTURE_H0_ROLLOUTS: usize = 4;
/// Task batches dynamic sampling may draw for one update. DAPO draws until the batch holds
/// enough groups with reward variance; this caps the draws. Not a paper setting: the paper has
/// no dynamic-sampling row.
pub const DYNAMIC_SAMPLING_MAX_BATCHES: usize = 3;

/// How a method forms its retained groups, before the run's group size, pool and first
/// calibration are known.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StrategyKind {
    /// No policy update: the initial checkpoint is evaluated as it is.
    Frozen,
    /// Plain GRPO under H0.
    Grpo,
    /// An all-failure group is replaced by K fresh H0 rollouts.
    H0Rescue,
    /// Rescue with K distinct siblings drawn at random.
    RandomHarness,
    /// Rescue with the siblings the method's selector ranks first, `per_harness` rollouts on
    /// each: 1 is Top-K (the paper's Top-8), [`PAPER_ROUTER_PAIRS`] the LLM Router 4 x 2. A pool
    /// with fewer siblings than that needs gets Top-m x n with the most siblings m that divide
    /// K ([`allocation`]), and the label says so.
    Router {
        /// Rollouts on each selected sibling.
        per_harness: usize,
    },
    /// A fixed mixture on every task, without waiting for an all-failure group: the paper's H0
    /// share of the group under H0 ([`mixture_split`]), the rest spread evenly over the
    /// `siblings` best siblings by the first calibration's validation success (fewer when the
    /// group or the pool is smaller; the label names the members that ran).
    Mixture {
        /// Siblings wanted.
        siblings: usize,
        /// Only agent programs (external harnesses) count as siblings: the paper's mixture
        /// with another agent system (Claude Code) as the other harness.
        programs: bool,
    },
    /// DAPO-style dynamic sampling: groups without reward variance are dropped and more tasks
    /// drawn, at most `max_batches` batches per update.
    DynamicSampling {
        /// Task batches per update at most.
        max_batches: usize,
    },
    /// Meta-Harness: the initial policy stays frozen while a proposer revises the harness from
    /// the history of scored candidates; one H_best by training success is kept
    /// ([`crate::stages`]' search stage, `harness_evolve::meta_harness`).
    MetaHarness,
    /// WHALE: `search.whale_rounds` rounds of a Meta-Harness search with the current policy,
    /// each followed by rejection-sampling fine-tuning (SFT on the successful rollouts) under
    /// the round's H_best; the final policy is evaluated under its H_best.
    Whale,
}

/// Which harness selector a method's rescue asks, and how its evidence is re-anchored.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SelectorKind {
    /// No selector.
    None,
    /// harness-rollout's random selector (Table 2's "Random Harness").
    Random,
    /// harness-router's `RuleRouter`: siblings ranked by success on the most similar validation
    /// tasks, no profiles (Table 2's "Rule Router (w/o Profile)"); its evidence is the
    /// calibrator's, re-anchored as `reanchor` says.
    Rule {
        /// Whether later calibrations replace the first.
        reanchor: ReanchorMode,
    },
    /// The Adaptive Harness Router: profiles and a panel of voters (Eqs. 8-10; the built-in
    /// offline voters on the default, LLM voters with `roles.llm`).
    Voters {
        /// Whether later calibrations replace the first.
        reanchor: ReanchorMode,
    },
}

impl SelectorKind {
    /// The calibrator's mode, for the selectors that read calibrated evidence.
    pub fn reanchor(self) -> Option<ReanchorMode> {
        match self {
            SelectorKind::Rule { reanchor } | SelectorKind::Voters { reanchor } => Some(reanchor),
            SelectorKind::None | SelectorKind::Random => None,
        }
    }
}

/// One method of the comparison.
#[derive(Debug, Clone, Copy)]
pub struct MethodSpec {
    /// The value of `train.methods`, and the folder `train/<name>/`.
    pub name: &'static str,
    /// The label before the pool is known.
    pub label: &'static str,
    /// The label of the strategy that ran, with `{alloc}` (a router's allocation, `Top-4` or
    /// `Top-2 x 2`), `{mixture}` (a fixed mixture's members and rollouts, `4 H0 + 4 name`),
    /// `{siblings}` (the mixture's sibling count) and `{batches}` (dynamic sampling's draws)
    /// filled in; `None`: [`MethodSpec::label`].
    pub ran: Option<&'static str>,
    /// The paper's row this reproduces.
    pub paper_row: &'static str,
    /// How groups are formed.
    pub strategy: StrategyKind,
    /// The rescue's selector.
    pub selector: SelectorKind,
    /// The test evaluations, in the order they run.
    pub eval: &'static [EvalMode],
    /// Table 5: the router's ranks before and after training, and `eval/routing.jsonl`.
    pub rank_table: bool,
}

/// Every method, in the report's order (the paper's Table 1 and 2 rows; harness-report's
/// `METHOD_ORDER` lists the same names).
pub const METHODS: &[MethodSpec] = &[
    MethodSpec {
        name: "grpo",
        label: "GRPO",
        ran: None,
        paper_row: "Tables 1, 2 and 9: GRPO",
        strategy: StrategyKind::Grpo,
        selector: SelectorKind::None,
        eval: &[EvalMode::H0],
        rank_table: false,
    },
    MethodSpec {
        name: "h0_rescue",
        label: "GRPO (H0 rescue)",
        ran: None,
        paper_row: "Tables 1 and 9: GRPO (H0 rescue)",
        strategy: StrategyKind::H0Rescue,
        selector: SelectorKind::None,
        eval: &[EvalMode::H0],
        rank_table: false,
    },
    MethodSpec {
        name: "mixture_sibling",
        label: "GRPO mixed harness (H0 + best sibling)",
        ran: Some("GRPO mixed harness ({mixture}; the best sibling by validation success)"),
        paper_row: "Tables 1 and 9: GRPO Mixed Harness (DSH H0 + Claude Code), with the best single sibling in Claude Code's place",
        strategy: StrategyKind::Mixture {
            siblings: 1,
            programs: false,
        },
        selector: SelectorKind::None,
        eval: &[EvalMode::H0],
        rank_table: false,
    },
    MethodSpec {
        name: "mixture_top4",
        label: "GRPO mixed harness (H0 + up to Top-4 siblings)",
        ran: Some("GRPO mixed harness ({mixture}; Top-{siblings} by validation success)"),
        paper_row: "Tables 1 and 9: GRPO Mixed Harness (DSH H0 + Top-4)",
        strategy: StrategyKind::Mixture {
            siblings: PAPER_MIXTURE_SIBLINGS,
            programs: false,
        },
        selector: SelectorKind::None,
        eval: &[EvalMode::H0],
        rank_table: false,
    },
    MethodSpec {
        name: "mixture_program",
        label: "GRPO mixed harness (H0 + agent program)",
        ran: Some("GRPO mixed harness ({mixture}; an agent program as the other harness)"),
        paper_row: "Tables 1 and 9: GRPO Mixed Harness (DSH H0 + Claude Code), with an agent program of the pool (an external harness) as the other agent system",
        strategy: StrategyKind::Mixture {
            siblings: 1,
            programs: true,
        },
        selector: SelectorKind::None,
        eval: &[EvalMode::H0],
        rank_table: false,
    },
    MethodSpec {
        name: "dynamic_sampling",
        label: "Dynamic sampling (DAPO filter; not a paper row)",
        ran: Some(
            "Dynamic sampling (DAPO filter, at most {batches} task batches; not a paper row)",
        ),
        paper_row: "none: DAPO-style dynamic sampling, a comparison outside the paper",
        strategy: StrategyKind::DynamicSampling {
            max_batches: DYNAMIC_SAMPLING_MAX_BATCHES,
        },
        selector: SelectorKind::None,
        eval: &[EvalMode::H0],
        rank_table: false,
    },
    MethodSpec {
        name: "random_harness",
        label: "Random-harness rescue",
        ran: None,
        paper_row: "Table 2: Random Harness",
        strategy: StrategyKind::RandomHarness,
        selector: SelectorKind::Random,
        eval: &[EvalMode::H0],
        rank_table: false,
    },
    MethodSpec {
        name: "rule_router",
        label: "Rule-router rescue (Top-K, adaptive re-anchoring)",
        ran: Some("Rule-router rescue ({alloc}, no profiles, adaptive re-anchoring)"),
        paper_row: "Table 2: Rule Router (w/o Profile)",
        strategy: StrategyKind::Router { per_harness: 1 },
        selector: SelectorKind::Rule {
            reanchor: ReanchorMode::Adaptive,
        },
        eval: &[EvalMode::H0],
        rank_table: false,
    },
    MethodSpec {
        name: "router_4x2",
        label: "Voter router (Top-K/2 x 2, adaptive)",
        ran: Some("{router} ({alloc}, adaptive)"),
        paper_row: "Table 2: LLM Router (Top-4 x 2)",
        strategy: StrategyKind::Router {
            per_harness: PAPER_ROUTER_PAIRS,
        },
        selector: SelectorKind::Voters {
            reanchor: ReanchorMode::Adaptive,
        },
        eval: &[EvalMode::H0],
        rank_table: false,
    },
    MethodSpec {
        name: "harness_s_fixed",
        label: "Top-K, fixed profiles",
        ran: Some("{alloc}, fixed profiles"),
        paper_row: "Table 2: Top-8 Fixed",
        strategy: StrategyKind::Router { per_harness: 1 },
        selector: SelectorKind::Voters {
            reanchor: ReanchorMode::Fixed,
        },
        eval: &[EvalMode::H0],
        rank_table: false,
    },
    MethodSpec {
        name: "meta_harness",
        label: "Meta-Harness (frozen policy, H_best)",
        ran: None,
        paper_row: "Tables 1 and 10: Meta-Harness, the frozen initial policy under H_best",
        strategy: StrategyKind::MetaHarness,
        selector: SelectorKind::None,
        eval: &[EvalMode::HBest],
        rank_table: false,
    },
    MethodSpec {
        name: "he_only",
        label: "Harness-S (HE only)",
        ran: None,
        paper_row: "Table 1: Harness-S (HE only), the initial policy under H_rank1",
        strategy: StrategyKind::Frozen,
        selector: SelectorKind::None,
        eval: &[EvalMode::Rank1],
        rank_table: false,
    },
    MethodSpec {
        name: "whale",
        label: "WHALE (search + rejection-sampling SFT, H_best)",
        ran: None,
        paper_row: "Tables 1 and 10: WHALE, the final policy under its H_best",
        strategy: StrategyKind::Whale,
        selector: SelectorKind::None,
        eval: &[EvalMode::HBest],
        rank_table: false,
    },
    MethodSpec {
        name: "harness_s",
        label: "Harness-S (Top-K, adaptive)",
        ran: Some("Harness-S ({alloc}, adaptive)"),
        paper_row: "Tables 1, 2, 5 and 9: Harness-S (Top-8 Adaptive), under H0 and H_rank1",
        strategy: StrategyKind::Router { per_harness: 1 },
        selector: SelectorKind::Voters {
            reanchor: ReanchorMode::Adaptive,
        },
        eval: &[EvalMode::H0, EvalMode::Rank1],
        rank_table: true,
    },
];

/// A method of the comparison: a handle on its [`METHODS`] entry (the variant's position in
/// the table), written as its name. A new method is a variant here, in table order, and its
/// entry in [`METHODS`]; `the_variants_are_the_table_in_order` checks that the two agree.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Method {
    /// `grpo`.
    Grpo,
    /// `h0_rescue`.
    H0Rescue,
    /// `mixture_sibling`.
    MixtureSibling,
    /// `mixture_top4`.
    MixtureTop4,
    /// `mixture_program`.
    MixtureProgram,
    /// `dynamic_sampling`.
    DynamicSampling,
    /// `random_harness`.
    RandomHarness,
    /// `rule_router`.
    RuleRouter,
    /// `router_4x2`.
    Router4x2,
    /// `harness_s_fixed`.
    HarnessSFixed,
    /// `meta_harness`.
    MetaHarness,
    /// `he_only`.
    HeOnly,
    /// `whale`.
    Whale,
    /// `harness_s`.
    HarnessS,
}

impl Method {
    /// Every method, in table order (what `train.methods = "all"` trains).
    pub const ALL: [Method; 14] = [
        Method::Grpo,
        Method::H0Rescue,
        Method::MixtureSibling,
        Method::MixtureTop4,
        Method::MixtureProgram,
        Method::DynamicSampling,
        Method::RandomHarness,
        Method::RuleRouter,
        Method::Router4x2,
        Method::HarnessSFixed,
        Method::MetaHarness,
        Method::HeOnly,
        Method::Whale,
        Method::HarnessS,
    ];

    /// Its entry of [`METHODS`].
    pub fn spec(self) -> &'static MethodSpec {
        &METHODS[self as usize]
    }

    /// The name used in files and directories (`train/<name>/`).
    pub fn name(self) -> &'static str {
        self.spec().name
    }

    /// Every method with a row in the paper's Tables 1 and 2, in table order (the paper
    /// preset's `train.methods`); dynamic sampling, a comparison outside the paper, is left out.
    pub fn paper_rows() -> Vec<Method> {
        Method::ALL
            .into_iter()
            .filter(|m| !m.spec().paper_row.starts_with("none"))
            .collect()
    }

    /// The label of the tables, before the pool is known (`Top-K` for the routed methods).
    pub fn label(self) -> &'static str {
        self.spec().label
    }

    /// The label of the tables for the strategy that runs: a routed method names its
    /// allocation (`Harness-S (Top-4, adaptive)`, or `Harness-S (Top-2 x 2, adaptive)` when the
    /// pool has fewer than K = `group_size` siblings) and, for the voter router of Table 2,
    /// whether its voters were LLM calls (`llm_voters`: "LLM router") or the built-in offline
    /// voters ("Router with built-in voters"); a fixed mixture names its members, never more
    /// than ran. Never another strategy than its own.
    pub fn label_for(self, strategy: &Strategy, group_size: usize, llm_voters: bool) -> String {
        let spec = self.spec();
        let Some(template) = spec.ran else {
            return spec.label.to_string();
        };
        let mut fills: Vec<(&str, String)> = vec![(
            "{router}",
            if llm_voters {
                "LLM router"
            } else {
                "Router with built-in voters"
            }
            .to_string(),
        )];
        match strategy {
            Strategy::Router {
                allocation: Allocation::TopK,
            } => fills.push(("{alloc}", format!("Top-{group_size}"))),
            Strategy::Router {
                allocation: Allocation::TopMXN { m, n },
            } => fills.push(("{alloc}", format!("Top-{m} x {n}"))),
            Strategy::FixedMixture { mixture } => {
                let parts: Vec<String> = mixture
                    .iter()
                    .map(|e| {
                        let who: &str = if e.harness == "base" {
                            "H0"
                        } else {
                            &e.harness
                        };
                        format!("{} {who}", e.rollouts)
                    })
                    .collect();
                fills.push(("{mixture}", parts.join(" + ")));
                let siblings = mixture.iter().filter(|e| e.harness != "base").count();
                fills.push(("{siblings}", siblings.to_string()));
            }
            Strategy::DynamicSampling { max_batches } => {
                fills.push(("{batches}", max_batches.to_string()));
            }
            Strategy::Grpo | Strategy::H0Rescue | Strategy::RandomHarness => {}
        }
        let mut label = template.to_string();
        for (slot, value) in fills {
            label = label.replace(slot, &value);
        }
        if label.contains('{') {
            // The template asks for what this strategy does not have.
            return spec.label.to_string();
        }
        label
    }

    /// Whether the method's rescue asks a router (a `Strategy::Router`).
    pub fn uses_router(self) -> bool {
        matches!(self.spec().strategy, StrategyKind::Router { .. })
    }

    /// Whether the method updates the policy's weights (a trained checkpoint in
    /// `train/<name>/final/`).
    pub fn updates_weights(self) -> bool {
        !matches!(
            self.spec().strategy,
            StrategyKind::Frozen | StrategyKind::MetaHarness
        )
    }

    /// Whether the method has a training stage (`harness-s train`): every method that updates
    /// weights, and Meta-Harness, whose search for H_best is its training stage.
    pub fn has_training_stage(self) -> bool {
        self.spec().strategy != StrategyKind::Frozen
    }

    /// Whether the method searches for one harness H_best (Meta-Harness, WHALE) instead of
    /// rescue-training on the pool.
    pub fn searches(self) -> bool {
        matches!(
            self.spec().strategy,
            StrategyKind::MetaHarness | StrategyKind::Whale
        )
    }

    /// The seed's shared stages the method's pipeline runs on (Table 10 counts their cost in
    /// its row): `evolve` when it rescues, mixes or routes with the pool's siblings, and
    /// `calibrate` when it reads the first calibration (its router's evidence, a mixture's
    /// sibling ranking, Rank-1 of an untrained policy), `calibrate_outcomes` when it reads only
    /// its validation outcomes (the rule router: no profile tokens charged).
    pub fn shared_stages(self) -> Vec<String> {
        let spec = self.spec();
        let pool = matches!(
            spec.strategy,
            StrategyKind::RandomHarness
                | StrategyKind::Router { .. }
                | StrategyKind::Mixture { .. }
        ) || spec.eval.contains(&EvalMode::Rank1);
        let calibration = spec.selector.reanchor().is_some()
            || matches!(spec.strategy, StrategyKind::Mixture { .. })
            || spec.eval.contains(&EvalMode::Rank1);
        let mut out = Vec::new();
        if pool {
            out.push("evolve".to_string());
        }
        if calibration {
            // The rule router reads the first calibration's validation outcomes, never its
            // profiles: its row counts the calibration's rollouts and seconds, not the
            // profiler's tokens.
            out.push(if matches!(spec.selector, SelectorKind::Rule { .. }) {
                "calibrate_outcomes".to_string()
            } else {
                "calibrate".to_string()
            });
        }
        out
    }

    /// Whether the method needs an agent program (an external harness) among the pool's
    /// siblings: the mixture with another agent system.
    pub fn needs_program(self) -> bool {
        matches!(
            self.spec().strategy,
            StrategyKind::Mixture { programs: true, .. }
        )
    }

    /// Parse a method name.
    pub fn parse(name: &str) -> Option<Method> {
        Method::ALL.into_iter().find(|m| m.name() == name)
    }

    /// Every method's name, comma-separated, for error messages.
    pub fn names() -> String {
        METHODS
            .iter()
            .map(|m| m.name)
            .collect::<Vec<_>>()
            .join(", ")
    }

    /// The distinct siblings (pool members besides H0) the method needs with `siblings`
    /// available: K for random-harness and Top-K rescue, m for Top-m x n, one for a fixed
    /// mixture, none for the others. The main job skips a method its pool cannot serve.
    pub fn siblings_needed(self, group_size: usize, siblings: usize) -> usize {
        match self.spec().strategy {
            StrategyKind::RandomHarness => group_size,
            StrategyKind::Router { per_harness } => {
                match allocation(group_size, per_harness, siblings) {
                    Allocation::TopK => group_size,
                    Allocation::TopMXN { m, .. } => m,
                }
            }
            StrategyKind::Mixture { .. } => 1,
            StrategyKind::Frozen
            | StrategyKind::Grpo
            | StrategyKind::H0Rescue
            | StrategyKind::DynamicSampling { .. }
            | StrategyKind::MetaHarness
            | StrategyKind::Whale => 0,
        }
    }

    /// The harness-rollout strategy of the method for a group of `group_size` on `pool`
    /// (`None` for a method that does not rescue-train: one that updates no weights, and the
    /// search methods, which train their own way). A fixed mixture picks its siblings by
    /// `validation_success` (the first calibration's, per member id); an error says what is
    /// missing.
    pub fn strategy(
        self,
        group_size: usize,
        pool: &SiblingPool,
        validation_success: Option<&BTreeMap<HarnessId, f64>>,
    ) -> Result<Option<Strategy>, String> {
        let siblings = pool.auxiliaries().count();
        Ok(Some(match self.spec().strategy {
            StrategyKind::Frozen | StrategyKind::MetaHarness | StrategyKind::Whale => {
                return Ok(None);
            }
            StrategyKind::Grpo => Strategy::Grpo,
            StrategyKind::H0Rescue => Strategy::H0Rescue,
            StrategyKind::RandomHarness => Strategy::RandomHarness,
            StrategyKind::Router { per_harness } => Strategy::Router {
                allocation: allocation(group_size, per_harness, siblings),
            },
            StrategyKind::Mixture {
                siblings: wanted,
                programs,
            } => {
                let success = validation_success.ok_or_else(|| {
                    format!(
                        "{} picks its siblings by validation success: it needs the first calibration",
                        self.name()
                    )
                })?;
                Strategy::FixedMixture {
                    mixture: mixture(group_size, wanted, programs, pool, success)?,
                }
            }
            StrategyKind::DynamicSampling { max_batches } => {
                Strategy::DynamicSampling { max_batches }
            }
        }))
    }
}

impl fmt::Display for Method {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl Serialize for Method {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.serialize_str(self.name())
    }
}

impl<'de> Deserialize<'de> for Method {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        let name = String::deserialize(deserializer)?;
        Method::parse(&name).ok_or_else(|| {
            de::Error::custom(format!(
                "unknown method `{name}`; expected one of {}",
                Method::names()
            ))
        })
    }
}

/// `train.methods`: a list of method names, or `"all"` for every method of [`METHODS`].
pub fn deserialize_methods<'de, D: Deserializer<'de>>(
    deserializer: D,
) -> Result<Vec<Method>, D::Error> {
    struct Methods;
    impl<'de> Visitor<'de> for Methods {
        type Value = Vec<Method>;

        fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
            write!(f, "a list of methods ({}) or \"all\"", Method::names())
        }

        fn visit_str<E: de::Error>(self, value: &str) -> Result<Vec<Method>, E> {
            if value == "all" {
                Ok(Method::ALL.to_vec())
            } else {
                Err(E::custom(format!(
                    "expected a list of methods or \"all\", found the string `{value}` (methods: {})",
                    Method::names()
                )))
            }
        }

        fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Vec<Method>, A::Error> {
            let mut out = Vec::new();
            while let Some(m) = seq.next_element::<Method>()? {
                out.push(m);
            }
            Ok(out)
        }
    }
    deserializer.deserialize_any(Methods)
}

/// How a router's K rescue rollouts are spread with `per_harness` rollouts wanted on each
/// selected sibling: Top-K (one each) when `per_harness` is 1 and the pool has K siblings;
/// otherwise Top-m x n with the most siblings m, at most K / `per_harness` and at most the
/// pool's, that divide K, so the rescue group keeps K rollouts (the paper's "Top-4 x 2" for
/// K = 8 and two per harness).
pub fn allocation(k: usize, per_harness: usize, siblings: usize) -> Allocation {
    if per_harness <= 1 && siblings >= k {
        return Allocation::TopK;
    }
    let wanted = (k / per_harness.max(1)).max(1);
    let m = (1..=wanted.min(siblings).max(1))
        .rev()
        .find(|m| k.is_multiple_of(*m))
        .unwrap_or(1);
    Allocation::TopMXN { m, n: k / m }
}

/// A fixed mixture's group of `group_size` split as the paper splits its G = 8: rollouts under
/// H0 and under the mixture's siblings ([`PAPER_MIXTURE_H0_ROLLOUTS`] of [`PAPER_GROUP_SIZE`]
/// under H0; the odd rollout of an odd group goes to H0).
pub fn mixture_split(group_size: usize) -> (usize, usize) {
    let h0 = (group_size * PAPER_MIXTURE_H0_ROLLOUTS).div_ceil(PAPER_GROUP_SIZE);
    (h0, group_size - h0)
}

/// The pool's siblings by validation success, best first (ties in pool order).
pub fn siblings_by_success<'a>(
    pool: &'a SiblingPool,
    success: &BTreeMap<HarnessId, f64>,
) -> Result<Vec<&'a Harness>, String> {
    let mut ranked = Vec::new();
    for h in pool.auxiliaries() {
        let id = h.id();
        let rate = success.get(&id).copied().ok_or_else(|| {
            format!(
                "the calibration has no validation success for pool member `{}` ({id}): it was made for another pool; calibrate again",
                h.name
            )
        })?;
        ranked.push((h, rate));
    }
    // A stable sort keeps the pool order among equal rates.
    ranked.sort_by(|a, b| b.1.total_cmp(&a.1));
    Ok(ranked.into_iter().map(|(h, _)| h).collect())
}

/// A fixed mixture of `group_size` rollouts: H0's share ([`mixture_split`]) under H0, the rest
/// spread evenly over the best `wanted` siblings by validation success (the most siblings, at
/// most `wanted` and at most the pool's, that divide the siblings' share), among the agent
/// programs when `programs`, else among the declarative siblings. A sibling is named by its name when that is unique in the
/// pool, else by its id.
pub fn mixture(
    group_size: usize,
    wanted: usize,
    programs: bool,
    pool: &SiblingPool,
    success: &BTreeMap<HarnessId, f64>,
) -> Result<Vec<MixtureEntry>, String> {
    let (h0, rest) = mixture_split(group_size);
    if rest == 0 {
        return Err(format!(
            "a fixed mixture splits each group between H0 and siblings: expected a group size of at least 2, found {group_size}"
        ));
    }
    let mut ranked = siblings_by_success(pool, success)?;
    // An agent-program mixture ranks the programs only; the sibling mixtures (the best sibling,
    // Top-4) the declarative siblings only, so that a program never becomes their "best
    // sibling" and the two rows stay different runs.
    ranked.retain(|h| h.is_external() == programs);
    if ranked.is_empty() {
        return Err(if programs {
            "a mixture with an agent program needs one among the pool's siblings; the pool has none (add one with external.harnesses or external.python_sibling)".into()
        } else {
            "a fixed mixture of siblings needs at least one declarative sibling; the pool has none besides H0 and agent programs".into()
        });
    }
    let m = (1..=wanted.min(ranked.len()).min(rest).max(1))
        .rev()
        .find(|m| rest.is_multiple_of(*m))
        .unwrap_or(1);
    let mut entries = vec![MixtureEntry {
        harness: "base".into(),
        rollouts: h0,
    }];
    for h in &ranked[..m] {
        let unique = pool.members().iter().filter(|x| x.name == h.name).count() == 1;
        let harness = if unique && h.name != "base" {
            h.name.clone()
        } else {
            h.id().to_string()
        };
        entries.push(MixtureEntry {
            harness,
            rollouts: rest / m,
        });
    }
    Ok(entries)
}

#[cfg(test)]
mod tests {
    use super::*;
    use harness_rollout::RescueConfig;

    fn pool(siblings: usize) -> SiblingPool {
        SiblingPool::starter(
            Harness::new("H0", "Base."),
            (1..=siblings).map(|i| Harness::new(format!("S{i}"), format!("Sibling {i}."))),
            serde_json::Value::Null,
        )
        .unwrap()
    }

    /// Validation success rising with the sibling's number, H0 at 0.1.
    fn rising(pool: &SiblingPool) -> BTreeMap<HarnessId, f64> {
        pool.members()
            .iter()
            .enumerate()
            .map(|(i, h)| (h.id(), if i == 0 { 0.1 } else { i as f64 / 10.0 }))
            .collect()
    }

    #[test]
    fn the_variants_are_the_table_in_order() {
        assert_eq!(Method::ALL.len(), METHODS.len());
        for (i, m) in Method::ALL.into_iter().enumerate() {
            assert_eq!(m as usize, i);
            let camel: String = m.name().split('_').collect();
            assert_eq!(format!("{m:?}").to_lowercase(), camel);
        }
    }

    #[test]
    fn names_are_unique_and_parse_back() {
        for (i, spec) in METHODS.iter().enumerate() {
            assert_eq!(Method::parse(spec.name), Some(Method::ALL[i]));
            assert_eq!(Method::ALL[i].name(), spec.name);
            assert!(!spec.eval.is_empty(), "{}", spec.name);
            assert_eq!(
                METHODS.iter().filter(|s| s.name == spec.name).count(),
                1,
                "{} twice",
                spec.name
            );
        }
        assert_eq!(Method::HarnessS.name(), "harness_s");
        assert_eq!(Method::parse("ppo"), None);
    }

    #[test]
    fn a_method_without_weight_updates_is_evaluated_under_rank1_only() {
        let he = Method::parse("he_only").unwrap();
        assert!(!he.updates_weights());
        assert_eq!(he.spec().eval, &[EvalMode::Rank1]);
        assert_eq!(he.strategy(8, &pool(3), None).unwrap(), None);
        assert!(METHODS.iter().all(|s| {
            let frozen = s.strategy == StrategyKind::Frozen;
            // A frozen method has no rescue and no table of its training.
            !frozen || (s.selector == SelectorKind::None && !s.rank_table)
        }));
    }

    #[test]
    fn the_siblings_a_method_needs_are_what_its_rescue_config_asks_of_the_pool() {
        for method in Method::ALL {
            for (k, siblings) in [(8, 9), (8, 5), (4, 3), (2, 3), (4, 0)] {
                let p = pool(siblings);
                let success = rising(&p);
                let Ok(Some(strategy)) = method.strategy(k, &p, Some(&success)) else {
                    continue;
                };
                let rescue = RescueConfig {
                    group_size: k,
                    strategy,
                    ..RescueConfig::default()
                };
                let needed = method.siblings_needed(k, siblings);
                if matches!(method.spec().strategy, StrategyKind::Mixture { .. }) {
                    assert_eq!(needed, 1);
                } else {
                    assert_eq!(needed, rescue.auxiliaries_needed(), "{method} k={k}");
                }
                assert_eq!(
                    rescue.validate(&p).is_ok(),
                    siblings >= needed,
                    "{method} k={k} siblings={siblings}"
                );
            }
        }
    }

    #[test]
    fn the_llm_router_is_top_4_x_2_at_the_papers_group_size() {
        let m = Method::parse("router_4x2").unwrap();
        let on = |k, siblings| m.strategy(k, &pool(siblings), None).unwrap().unwrap();
        let top = |m, n| Strategy::Router {
            allocation: Allocation::TopMXN { m, n },
        };
        assert_eq!(on(8, 19), top(4, 2));
        assert_eq!(on(8, 3), top(2, 4));
        assert_eq!(on(4, 3), top(2, 2));
        assert_eq!(on(2, 3), top(1, 2));
        assert_eq!(
            m.label_for(&on(8, 19), 8, true),
            "LLM router (Top-4 x 2, adaptive)"
        );
        // The default's offline voters are not an LLM router.
        assert_eq!(
            m.label_for(&on(4, 3), 4, false),
            "Router with built-in voters (Top-2 x 2, adaptive)"
        );
        let rule = Method::parse("rule_router").unwrap();
        let on_rule = rule.strategy(4, &pool(5), None).unwrap().unwrap();
        assert_eq!(
            rule.label_for(&on_rule, 4, true),
            "Rule-router rescue (Top-4, no profiles, adaptive re-anchoring)"
        );
        // Top-K rescue keeps the existing allocation.
        assert_eq!(allocation(8, 1, 8), Allocation::TopK);
        assert_eq!(allocation(4, 1, 3), Allocation::TopMXN { m: 2, n: 2 });
        assert_eq!(allocation(3, 1, 2), Allocation::TopMXN { m: 1, n: 3 });
    }

    #[test]
    fn a_mixture_splits_the_group_as_the_paper_does() {
        assert_eq!(mixture_split(8), (4, 4));
        assert_eq!(mixture_split(4), (2, 2));
        assert_eq!(mixture_split(2), (1, 1));
        assert_eq!(mixture_split(3), (2, 1));
        assert_eq!(mixture_split(1), (1, 0));

        let p = pool(6);
        let success = rising(&p);
        // The best single sibling: S6 has the highest validation success.
        let best = mixture(8, 1, false, &p, &success).unwrap();
        let entries: Vec<(&str, usize)> = best
            .iter()
            .map(|e| (e.harness.as_str(), e.rollouts))
            .collect();
        assert_eq!(entries, [("base", 4), ("S6", 4)]);
        // H0 + Top-4: four H0 rollouts and one under each of the four best.
        let top4 = mixture(8, 4, false, &p, &success).unwrap();
        let entries: Vec<(&str, usize)> = top4
            .iter()
            .map(|e| (e.harness.as_str(), e.rollouts))
            .collect();
        assert_eq!(
            entries,
            [("base", 4), ("S6", 1), ("S5", 1), ("S4", 1), ("S3", 1)]
        );
        // A group of 4 has room for two siblings.
        let small = mixture(4, 4, false, &p, &success).unwrap();
        assert_eq!(small.len(), 3);
        // At K = 4 the Top-4 mixture runs H0 + Top-2, and its label says Top-2.
        assert_eq!(
            Method::parse("mixture_top4").unwrap().label_for(
                &Strategy::FixedMixture { mixture: small },
                4,
                false
            ),
            "GRPO mixed harness (2 H0 + 1 S6 + 1 S5; Top-2 by validation success)"
        );
        let label = Method::parse("mixture_top4").unwrap().label_for(
            &Strategy::FixedMixture { mixture: top4 },
            8,
            false,
        );
        assert_eq!(
            label,
            "GRPO mixed harness (4 H0 + 1 S6 + 1 S5 + 1 S4 + 1 S3; Top-4 by validation success)"
        );
        let e = mixture(1, 1, false, &p, &success).unwrap_err();
        assert!(e.contains("at least 2"), "{e}");
        let e = mixture(8, 1, false, &pool(0), &BTreeMap::new()).unwrap_err();
        assert!(e.contains("declarative sibling"), "{e}");
        let e = mixture(8, 1, false, &p, &BTreeMap::new()).unwrap_err();
        assert!(e.contains("another pool"), "{e}");
        // The mixture with an agent program takes the best program, however good the
        // declarative siblings are, and says so when the pool has none.
        let e = mixture(8, 1, true, &p, &success).unwrap_err();
        assert!(e.contains("agent program") && e.contains("external"), "{e}");
        let mut program = Harness::new("agent", "unused");
        program.program = Some(harness_core::ProgramSpec {
            command: vec!["python3".into(), "agent.py".into()],
            env: BTreeMap::new(),
            timeout_s: 60.0,
        });
        let with = SiblingPool::starter(
            p.base().clone(),
            p.auxiliaries().cloned().chain([program.clone()]),
            serde_json::Value::Null,
        )
        .unwrap();
        let mut rates = success.clone();
        rates.insert(program.id(), 0.0);
        let mixed = mixture(8, 1, true, &with, &rates).unwrap();
        assert_eq!(
            mixed
                .iter()
                .map(|e| (e.harness.as_str(), e.rollouts))
                .collect::<Vec<_>>(),
            vec![("base", 4), ("agent", 4)]
        );
        // The sibling mixtures rank declarative siblings only: a program with the best
        // validation success is not their "best sibling" (which would make mixture_sibling
        // the same run as mixture_program).
        rates.insert(program.id(), 1.0);
        let best = mixture(8, 1, false, &with, &rates).unwrap();
        assert_eq!(best[1].harness, "S6");
        let top4 = mixture(8, 4, false, &with, &rates).unwrap();
        assert!(top4.iter().all(|e| e.harness != "agent"), "{top4:?}");
        let only_program =
            SiblingPool::starter(p.base().clone(), [program.clone()], serde_json::Value::Null)
                .unwrap();
        let e = mixture(8, 1, false, &only_program, &rates).unwrap_err();
        assert!(e.contains("declarative sibling"), "{e}");
        assert!(Method::MixtureProgram.needs_program() && !Method::MixtureTop4.needs_program());
        // Every mixture validates against the pool with the group size.
        for k in [2, 3, 4, 8] {
            for wanted in [1, 4] {
                let strategy = Strategy::FixedMixture {
                    mixture: mixture(k, wanted, false, &p, &success).unwrap(),
                };
                RescueConfig {
                    group_size: k,
                    strategy,
                    ..RescueConfig::default()
                }
                .validate(&p)
                .unwrap();
            }
        }
    }

    #[test]
    fn train_methods_takes_a_list_or_all() {
        let parse = |v: serde_json::Value| {
            deserialize_methods(v).map_err(|e: serde_json::Error| e.to_string())
        };
        assert_eq!(
            parse(serde_json::json!("all")).unwrap(),
            Method::ALL.to_vec()
        );
        assert_eq!(
            parse(serde_json::json!(["grpo", "he_only"])).unwrap(),
            vec![Method::Grpo, Method::parse("he_only").unwrap()]
        );
        let e = parse(serde_json::json!(["ppo"])).unwrap_err();
        assert!(e.contains("ppo") && e.contains("rule_router"), "{e}");
        let e = parse(serde_json::json!("some")).unwrap_err();
        assert!(e.contains("\"all\"") && e.contains("some"), "{e}");
    }

    #[test]
    fn the_readme_maps_every_method_to_its_paper_row() {
        let readme = include_str!("../../../docs/MAIN_JOB.md");
        for spec in METHODS {
            let row = format!("| `{}` |", spec.name);
            assert!(
                readme.lines().any(|l| l.starts_with(&row)),
                "docs/MAIN_JOB.md's method table has no row `{row} ...`"
            );
        }
    }

    #[test]
    fn the_help_and_the_report_name_every_method_in_table_order() {
        for spec in METHODS {
            assert!(
                crate::config::SETTINGS_HELP.contains(spec.name),
                "--help does not name {}",
                spec.name
            );
        }
        let names: Vec<&str> = METHODS.iter().map(|s| s.name).collect();
        let report: Vec<&str> = harness_report::layout::METHOD_ORDER
            .iter()
            .copied()
            .filter(|m| *m != "initial")
            .collect();
        assert_eq!(report, names);
    }
}
