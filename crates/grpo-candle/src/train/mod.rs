//! The training layer, at the top: the GRPO objective ([`objective`]) and trainer ([`trainer`]),
//! the warm start (a reference solver's turns recorded by [`teacher`], fitted by [`sft`]) and
//! harness-core's `Learner` ([`learner`]). It may use every layer below, including
//! [`crate::sample`]'s `CandlePolicy`.

pub mod learner;
pub mod objective;
pub mod sft;
pub mod teacher;
pub mod trainer;
