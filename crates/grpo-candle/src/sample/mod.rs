//! The sampling layer: batched KV-cached decoding with per-token log-probs ([`sampler`]), the
//! prompt prefix cache ([`prefix_cache`]) and [`policy::CandlePolicy`], harness-core's `Policy`
//! on top of them. It uses [`crate::model`] and [`crate::ops`], never [`crate::train`].

pub mod json;
pub mod policy;
pub mod prefix_cache;
pub mod sampler;
