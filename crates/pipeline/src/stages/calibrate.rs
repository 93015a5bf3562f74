//! Stage 2: the router's first calibration with the initial policy (paired validation runs and
//! behaviour profiles, Eqs. 8 and 11), into `calibration/`.

use harness_core::CalibrationPoint;
use harness_pool::SiblingPool;
use harness_router::{Calibration, EvidenceCell, ReanchorMode, TokenCounter};

use super::cost::{self, StageCost, counted_tokens};
use super::roles::{calibrator, roles};
use crate::error::{Result, StageExt};
use crate::setup::Workbench;

/// The first calibration with the initial policy, into `calibration/`.
pub async fn calibrate(wb: &Workbench, pool: &SiblingPool) -> Result<Calibration> {
    let policy = wb.local_policy(&wb.checkpoint, "initial-policy")?;
    let tokens = TokenCounter::new();
    let (profiler, _) = roles(wb, wb.cfg.seed, &tokens);
    let cal = calibrator(
        wb,
        pool,
        policy,
        profiler,
        EvidenceCell::new(),
        ReanchorMode::Adaptive,
        wb.layout.calibration(),
    )
    .await?;
    let bar = wb.progress.spinner(format!(
        "calibration: {} members x {} validation tasks",
        pool.len(),
        wb.validation.len()
    ));
    let started = std::time::Instant::now();
    let (calibration, rollouts) = cal
        .run(&CalibrationPoint {
            index: 0,
            update: 0,
            is_final: false,
            seed: harness_rollout::seed::derive_seed(
                wb.cfg.seed,
                harness_rollout::seed::Phase::Calibrate,
                0,
                "",
                0,
                0,
            ),
            checkpoint: Some(wb.checkpoint.clone()),
        })
        .await
        .at("calibrate")?;
    bar.finish_and_clear();
    cost::write(
        &StageCost {
            stage: "calibrate".into(),
            rollouts: [("calibration".to_string(), rollouts as u64)].into(),
            seconds: [("calibration".to_string(), started.elapsed().as_secs_f64())].into(),
            tokens: counted_tokens(&tokens),
            shared: Vec::new(),
            proposals: None,
        },
        &wb.layout.calibration(),
    )?;
    let mut rates: Vec<String> = calibration
        .validation_success
        .iter()
        .map(|(id, rate)| {
            let name = pool.get(id).map_or(id.to_string(), |h| h.name.clone());
            format!("{name} {:.2}", rate)
        })
        .collect();
    rates.sort();
    wb.progress.println(format!(
        "calibration: {rollouts} paired rollouts; validation success: {}",
        rates.join(", ")
    ));
    let p = &calibration.profiler;
    if p.rejected_answers > 0 || p.failures > 0 || p.usage != Default::default() {
        wb.progress.println(format!(
            "calibration profiler {}: {} malformed answers rejected and asked again; {} siblings \
             left with an empty profile after the retry budget",
            p.profiler, p.rejected_answers, p.failures
        ));
    }
    Ok(calibration)
}
