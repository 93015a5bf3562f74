//! Teacher forcing: a teacher decides what to say, the student's tokens record it.
//!
//! A randomly initialised tiny policy never writes a valid `<tool_call>`, so every reward is 0 and
//! GRPO has nothing to learn from. The warm start records demonstrations instead: a *teacher*
//! [`Policy`] (an environment's scripted oracle, a bigger model behind an API, a human script)
//! chooses each turn's text, and [`TeacherForcedPolicy`] re-expresses that text in the *student*
//! [`CandlePolicy`]'s tokens, exactly as if the student had sampled it:
//!
//! * `context_tokens` are the student's prompt ([`CandlePolicy::prompt_tokens`]);
//! * `tokens` are the student's tokenization of the text followed by the end-of-turn token
//!   (`<|im_end|>`) the student's sampler stops on, cut at `max_new_tokens` (and then ending
//!   by [`FinishReason::Length`]) like a real sample;
//! * `text` is what the sampler would report for those tokens: their decoding without the
//!   end-of-turn token (the teacher's text, up to the student tokenizer's normalisation and the
//!   cut);
//! * `logprobs` are the student's own (temperature 1, full vocabulary) log-probs of those tokens,
//!   from one forward pass, so that Eq. 16's weight `clip(pi_old / q, 0, 2)` is 1 for the
//!   weights the demonstration was recorded under;
//! * a prompt over `max_context_tokens` (or the model's positions) is a
//!   [`FinishReason::ContextOverflow`] with no tokens, whatever the teacher said.
//!
//! The request's limits count the *student's* tokens. The teacher counts in its own (a scripted
//! oracle's fake byte tokens are several times more numerous than the student's BPE tokens), so
//! it is asked with both limits multiplied by [`TeacherForcedPolicy::with_teacher_limit_factor`]
//! (default 8) and the student's limits are enforced afterwards on the student's tokens.
//!
//! The text is tokenized as part of `prompt text + turn text`, so the tokens are the ones a
//! fresh tokenization of the next prompt (which renders the turn as history) will contain: the
//! next turn's context extends this turn's context + tokens and the trainers pack the turns of
//! an episode into one sequence. Trajectories recorded under a [`TeacherForcedPolicy`] are
//! therefore valid training data for the student: supervised fine-tuning ([`crate::train::sft`])
//! or, with their rewards, GRPO.
//!
//! # Example
//! ```
//! use std::sync::Arc;
//! use candle_core::{DType, Device};
//! use grpo_candle::{CandlePolicy, PolicyModel, PolicyOptions, TeacherForcedPolicy, TinySpec};
//! use harness_core::{ChatMessage, Policy, PolicyRequest, PolicyTurn, SamplingParams};
//!
//! struct Oracle;
//! #[async_trait::async_trait]
//! impl Policy for Oracle {
//!     fn name(&self) -> &str { "oracle" }
//!     async fn generate(&self, _: PolicyRequest) -> harness_core::Result<PolicyTurn> {
//!         Ok(PolicyTurn {
//!             text: "The answer is 42.".into(),
//!             context_tokens: vec![],
//!             tokens: vec![1, 2, 3], // whatever the teacher's ids are: they are replaced
//!             logprobs: vec![0.0; 3],
//!             finish: harness_core::FinishReason::Stop,
//!         })
//!     }
//! }
//!
//! let spec = TinySpec { num_merges: 16, ..TinySpec::default() };
//! let student = Arc::new(CandlePolicy::new(
//!     PolicyModel::tiny(&spec, DType::F32, &Device::Cpu)?,
//!     PolicyOptions::default(),
//! ));
//! let forced = TeacherForcedPolicy::new(Arc::new(Oracle), Arc::clone(&student));
//! let request = PolicyRequest {
//!     messages: vec![ChatMessage::user("What is the answer?")],
//!     tools: vec![],
//!     max_new_tokens: 64,
//!     max_context_tokens: 1024,
//!     sampling: SamplingParams::greedy(),
//!     seed: 0,
//! };
//! let turn = forced.generate_blocking(request.clone())?;
//! assert_eq!(turn.text, "The answer is 42.");
//! assert_eq!(turn.context_tokens, student.prompt_tokens(&request)?);
//! assert_eq!(turn.tokens.len(), turn.logprobs.len());
//! # Ok::<(), grpo_candle::Error>(())
//! ```

use std::sync::Arc;

use async_trait::async_trait;
use harness_core::{FinishReason, Policy, PolicyRequest, PolicyTurn};

use crate::error::{Error, Result};
pub use crate::model::decoder::score_continuation;
use crate::model::tokenizer::{self, IM_END};
use crate::ops::logprob::LogProbConfig;
use crate::sample::policy::CandlePolicy;

/// A [`Policy`] whose turns say what a teacher says, in a student's tokens (see the
/// [module docs](self)).
///
/// # Design
/// The teacher is any [`Policy`]: only its `text` (and whether it overflowed or ran out of
/// tokens) is used; its token ids and log-probs are discarded. The student is shared in an
/// [`Arc`] so the same model can be recorded under, fine-tuned
/// ([`crate::train::sft::SftTrainer`]) and then sampled from. The student's forward pass runs on
/// tokio's blocking pool when called on a tokio runtime, inline otherwise.
pub struct TeacherForcedPolicy {
    name: String,
    teacher: Arc<dyn Policy>,
    student: Arc<CandlePolicy>,
    logprob: LogProbConfig,
    teacher_limit_factor: usize,
    scoring: bool,
}

impl std::fmt::Debug for TeacherForcedPolicy {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TeacherForcedPolicy")
            .field("name", &self.name)
            .field("teacher", &self.teacher.name())
            .field("student", &self.student)
            .finish()
    }
}

impl TeacherForcedPolicy {
    /// Record `teacher`'s turns in `student`'s tokens. The policy's name is
    /// `"<teacher>-forced-<student>"`.
    pub fn new(teacher: Arc<dyn Policy>, student: Arc<CandlePolicy>) -> Self {
        let name = format!("{}-forced-{}", teacher.name(), student.name());
        TeacherForcedPolicy {
            name,
            teacher,
            student,
            logprob: LogProbConfig::default(),
            teacher_limit_factor: 8,
            scoring: true,
        }
    }

    /// Skip the student's forward pass and report log-prob 0 for every token. The turns are then
    /// demonstrations for supervised updates only (their `q` is meaningless for GRPO), and
    /// recording them costs no model work, which matters for long contexts.
    pub fn without_scoring(mut self) -> Self {
        self.scoring = false;
        self
    }

    /// Ask the teacher with `max_new_tokens` and `max_context_tokens` multiplied by `factor`
    /// (saturating; at least 1): the teacher's tokens are not the student's.
    pub fn with_teacher_limit_factor(mut self, factor: usize) -> Self {
        self.teacher_limit_factor = factor.max(1);
        self
    }

    /// The request the teacher is asked (the student's limits scaled for the teacher's tokens).
    fn teacher_request(&self, request: &PolicyRequest) -> PolicyRequest {
        let f = self.teacher_limit_factor;
        PolicyRequest {
            max_new_tokens: request.max_new_tokens.saturating_mul(f),
            max_context_tokens: request.max_context_tokens.saturating_mul(f),
            ..request.clone()
        }
    }

    /// Report `name` from [`Policy::name`] instead.
    pub fn with_name(mut self, name: impl Into<String>) -> Self {
        self.name = name.into();
        self
    }

    /// Chunk the student's log-prob pass with `cfg`.
    pub fn with_logprob_config(mut self, cfg: LogProbConfig) -> Self {
        self.logprob = cfg;
        self
    }

    /// The student.
    pub fn student(&self) -> &Arc<CandlePolicy> {
        &self.student
    }

    /// The teacher.
    pub fn teacher(&self) -> &Arc<dyn Policy> {
        &self.teacher
    }

    /// Re-express the teacher's turn `teacher_turn` (made for `request`) in the student's tokens,
    /// without its log-probs (left empty; see [`TeacherForcedPolicy::force_blocking`]).
    fn tokens_of(&self, request: &PolicyRequest, teacher_turn: &PolicyTurn) -> Result<PolicyTurn> {
        let student = &self.student;
        let context = student.prompt_tokens(request)?;
        let positions = student.model().config().max_position_embeddings;
        if teacher_turn.finish == FinishReason::ContextOverflow
            || context.len() > request.max_context_tokens
            || context.len() >= positions
        {
            return Ok(PolicyTurn {
                text: String::new(),
                context_tokens: context,
                tokens: Vec::new(),
                logprobs: Vec::new(),
                finish: FinishReason::ContextOverflow,
            });
        }
        let tok = student.tokenizer();
        let text = &teacher_turn.text;
        // Tokenize the turn as the next prompt will: as a continuation of the rendered prompt.
        // Pieces between special tokens are tokenized independently, so when `context` is the
        // fresh tokenization of the prompt, the turn's tokens are the tail of this encoding.
        let prompt_text = student
            .template()
            .render(&request.messages, &request.tools, true);
        let joint = tokenizer::encode(tok, &format!("{prompt_text}{text}"))?;
        let mut tokens = match joint.strip_prefix(context.as_slice()) {
            Some(tail) => tail.to_vec(),
            // The prompt reused a remembered sampled turn's tokens: tokenize the text alone.
            None => tokenizer::encode(tok, text)?,
        };
        let mut finish = FinishReason::Stop;
        if teacher_turn.finish == FinishReason::Length {
            finish = FinishReason::Length;
        } else {
            let end = tokenizer::token_id(tok, IM_END)
                .ok()
                .or_else(|| student.policy_model().stop_token_ids.first().copied())
                .ok_or_else(|| Error::Tokenizer("the student has no end-of-turn token".into()))?;
            tokens.push(end);
        }
        // The sampler stops at `max_new_tokens` and at the model's last position.
        let room = request
            .max_new_tokens
            .min(positions.saturating_sub(context.len()));
        if tokens.len() > room {
            tokens.truncate(room);
            finish = FinishReason::Length;
        }
        // The text the sampler would report for these tokens (the teacher's text, up to the
        // tokenizer's normalisation and the cut).
        let text = tokenizer::decode(tok, &tokens, true)?;
        Ok(PolicyTurn {
            text,
            context_tokens: context,
            tokens,
            logprobs: Vec::new(),
            finish,
        })
    }

    /// Turn a teacher's turn into the student's turn (tokens and log-probs), on this thread.
    pub fn force_blocking(
        &self,
        request: &PolicyRequest,
        teacher_turn: &PolicyTurn,
    ) -> Result<PolicyTurn> {
        let mut turn = self.tokens_of(request, teacher_turn)?;
        if !self.scoring {
            turn.logprobs = vec![0.0; turn.tokens.len()];
            return Ok(turn);
        }
        turn.logprobs = score_continuation(
            self.student.model(),
            &turn.context_tokens,
            &turn.tokens,
            &self.logprob,
        )?;
        Ok(turn)
    }

    /// `generate` for synchronous callers (drives the teacher with a local executor; do not call
    /// it on an async runtime thread).
    pub fn generate_blocking(&self, request: PolicyRequest) -> Result<PolicyTurn> {
        let teacher_turn = block_on(self.teacher.generate(self.teacher_request(&request)))
            .map_err(|e| Error::Msg(format!("teacher `{}`: {e}", self.teacher.name())))?;
        self.force_blocking(&request, &teacher_turn)
    }
}

/// Drive the teacher's future for [`TeacherForcedPolicy::generate_blocking`]: on the current
/// runtime from one of its blocking threads, else on a throwaway current-thread runtime.
fn block_on<F: std::future::Future>(future: F) -> F::Output {
    match tokio::runtime::Handle::try_current() {
        Ok(handle) => handle.block_on(future),
        Err(_) => tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .expect("build a current-thread tokio runtime")
            .block_on(future),
    }
}

#[async_trait]
impl Policy for TeacherForcedPolicy {
    fn name(&self) -> &str {
        &self.name
    }

    async fn generate(&self, request: PolicyRequest) -> harness_core::Result<PolicyTurn> {
        let to_core = |e: Error| harness_core::Error::Policy {
            policy: self.name.clone(),
            message: e.to_string(),
        };
        let teacher_turn = self
            .teacher
            .generate(self.teacher_request(&request))
            .await?;
        let mut turn = self.tokens_of(&request, &teacher_turn).map_err(to_core)?;
        if turn.tokens.is_empty() {
            return Ok(turn);
        }
        if !self.scoring {
            turn.logprobs = vec![0.0; turn.tokens.len()];
            return Ok(turn);
        }
        // The forward pass is tensor work: keep it off the runtime's worker threads.
        let logprobs = match tokio::runtime::Handle::try_current() {
            Ok(handle) => {
                let student = Arc::clone(&self.student);
                let cfg = self.logprob;
                let context = turn.context_tokens.clone();
                let tokens = turn.tokens.clone();
                handle
                    .spawn_blocking(move || {
                        score_continuation(student.model(), &context, &tokens, &cfg)
                    })
                    .await
                    .map_err(|e| to_core(Error::Msg(format!("the scoring task failed: {e}"))))?
            }
            Err(_) => score_continuation(
                self.student.model(),
                &turn.context_tokens,
                &turn.tokens,
                &self.logprob,
            ),
        };
        turn.logprobs = logprobs.map_err(to_core)?;
        Ok(turn)
    }
}
