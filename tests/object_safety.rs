//! The seams used as trait objects at run time stay object safe (tower's `_obj_safe` trick):
//! this file only compiles while they are.

use std::sync::Arc;

use harness_core::{
    ActionParser, Calibrate, ChatModel, EnvSession, Environment, HarnessSelector, Learner, Policy,
};
use harness_envs::tau_retail::{NlJudge, UserSimulator};

#[allow(dead_code)]
fn _obj_safe(
    _: &dyn Environment,
    _: Box<dyn EnvSession>,
    _: Arc<dyn Policy>,
    _: Arc<dyn ChatModel>,
    _: Arc<dyn HarnessSelector>,
    _: Arc<dyn ActionParser>,
) {
}

/// The training loop's seams: the router's re-anchoring and the policy update.
#[allow(dead_code)]
fn _training_obj_safe(_: Arc<dyn Calibrate>, _: Box<dyn Learner>) {}

/// The retail world's customer and NL-assertion judge (the LLM ones are injected at run time).
#[allow(dead_code)]
fn _retail_obj_safe(_: Arc<dyn UserSimulator>, _: Arc<dyn NlJudge>) {}

#[test]
fn seams_are_object_safe_and_thread_safe() {
    fn assert_send_sync<T: Send + Sync + ?Sized>() {}
    assert_send_sync::<dyn Environment>();
    assert_send_sync::<dyn Policy>();
    assert_send_sync::<dyn ChatModel>();
    assert_send_sync::<dyn HarnessSelector>();
    assert_send_sync::<dyn ActionParser>();
    assert_send_sync::<dyn Calibrate>();
    assert_send_sync::<dyn UserSimulator>();
    assert_send_sync::<dyn NlJudge>();
    fn assert_send<T: Send + ?Sized>() {}
    assert_send::<dyn EnvSession>();
    assert_send::<dyn Learner>();
}
