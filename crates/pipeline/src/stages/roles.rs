//! What the router's stages share: the profiler and voters (built-in, or LLM ones on the
//! configured endpoint), the calibrator, and the first calibration.

use std::path::PathBuf;
use std::sync::Arc;

use harness_core::{Policy, call_seed};
use harness_pool::SiblingPool;
use harness_router::{
    BuiltinProfiler, BuiltinVoter, Calibration, Calibrator, CalibratorSettings, EvidenceCell,
    LlmProfiler, LlmProfilerSettings, LlmVoter, LlmVoterSettings, PairedSettings, Profiler,
    ReanchorMode, TokenCounter, Voter,
};

use crate::error::{Error, Result, StageExt};
use crate::setup::Workbench;

/// The router's profiler and voters: built-in, or LLM ones on the configured endpoint.
pub(crate) fn roles(
    wb: &Workbench,
    seed: u64,
    tokens: &TokenCounter,
) -> (Arc<dyn Profiler>, Vec<Arc<dyn Voter>>) {
    let voters = wb.cfg.roles.voters;
    let roles_max_tokens = wb.cfg.roles.max_tokens;
    let profiler: Arc<dyn Profiler> = match &wb.chat {
        Some(chat) if wb.cfg.roles.asks_llm("profiler") => Arc::new(LlmProfiler::new(
            chat.clone(),
            LlmProfilerSettings {
                seed,
                max_tokens: roles_max_tokens.unwrap_or(LlmProfilerSettings::default().max_tokens),
                ..LlmProfilerSettings::default()
            },
            tokens.clone(),
        )),
        _ => Arc::new(BuiltinProfiler::new(
            harness_envs::labels::builtin_labellers(),
        )),
    };
    let panel: Vec<Arc<dyn Voter>> = match &wb.chat {
        Some(chat) if wb.cfg.roles.asks_llm("voters") => (0..voters)
            .map(|v| {
                Arc::new(LlmVoter::new(
                    format!("llm-{v}"),
                    chat.clone(),
                    call_seed(seed, v as u32),
                    LlmVoterSettings {
                        max_tokens: roles_max_tokens
                            .unwrap_or(LlmVoterSettings::default().max_tokens),
                        ..LlmVoterSettings::default()
                    },
                    tokens.clone(),
                )) as Arc<dyn Voter>
            })
            .collect(),
        _ => BuiltinVoter::panel(voters, seed)
            .into_iter()
            .map(|v| Arc::new(v) as Arc<dyn Voter>)
            .collect(),
    };
    (profiler, panel)
}

/// The calibrator of a routed run: paired validation runs of every member with `policy`, the
/// profiles, and `evidence` re-anchored as `mode` says, its files in `dir`.
pub(crate) async fn calibrator(
    wb: &Workbench,
    pool: &SiblingPool,
    policy: Arc<dyn Policy>,
    profiler: Arc<dyn Profiler>,
    evidence: EvidenceCell,
    mode: ReanchorMode,
    dir: PathBuf,
) -> Result<Calibrator> {
    let environments = wb.environments_for(pool, policy.clone()).await?;
    Calibrator::new(
        Arc::new(pool.clone()),
        policy,
        environments,
        wb.validation.clone(),
        profiler,
        evidence,
        CalibratorSettings {
            paired: PairedSettings {
                rollouts_per_task: wb.cfg.calibration.rollouts_per_task,
                concurrency: wb.cfg.rollout.concurrency,
                ..PairedSettings::default()
            },
            mode,
            dir: Some(dir),
            features: wb.cfg.calibration.task_features,
            ..CalibratorSettings::default()
        },
    )
    .at("calibrate")
}

/// The first calibration (the `calibrate` stage's, with the initial policy), which `stage`
/// needs.
pub(crate) fn first_calibration(wb: &Workbench, stage: &'static str) -> Result<Calibration> {
    Calibration::load_latest(&wb.layout.calibration())
        .at(stage)?
        .ok_or_else(|| {
            Error::input(
                stage,
                wb.layout.calibration(),
                "no calibration here: run `harness-s calibrate` first",
            )
        })
}
