//! Checks of values that parse but make no sense, naming the file, the field and what was
//! expected.

use super::*;

impl RunConfig {
    /// Check values that parse but cannot run; `file` names the document in errors.
    pub fn validate(&self, file: Option<&Path>) -> Result<()> {
        let file = file.map_or_else(|| PathBuf::from("<run config>"), Path::to_path_buf);
        let bad = |field: &str, message: String| {
            Err(Error::Config {
                file: file.clone(),
                field: field.to_string(),
                message,
            })
        };
        if self.seeds == 0 {
            return bad("seeds", "expected at least 1 seed".into());
        }
        // Each seed is a whole run of the job, and the seeds are listed up front.
        if self.seeds > MAX_SEEDS {
            return bad(
                "seeds",
                format!("expected at most {MAX_SEEDS} seeds, found {}", self.seeds),
            );
        }
        if self.seed.checked_add(self.seeds as u64 - 1).is_none() {
            return bad(
                "seeds",
                format!(
                    "seeds {}..{} run past the largest seed, {}; expected a smaller seed",
                    self.seed,
                    self.seed as u128 + self.seeds as u128,
                    u64::MAX
                ),
            );
        }
        if self.policy.threads == Some(0) {
            return bad(
                "policy.threads",
                "expected at least 1 thread, or the setting left out (one for the embedded policy, all cores for a checkpoint)".into(),
            );
        }
        if !["default", "dbbench", "appworld", "swe", "tau-retail"]
            .contains(&self.env.name.as_str())
        {
            return bad(
                "env.name",
                format!(
                    "unknown environment `{}`; expected default, dbbench, appworld, swe or tau-retail",
                    self.env.name
                ),
            );
        }
        if self.env.tau_retail_data.is_some() && self.env.name != "tau-retail" {
            return bad(
                "env.tau_retail_data",
                "a retail data folder needs env.name = \"tau-retail\"".into(),
            );
        }
        let retail = self.env.name == "tau-retail";
        for (field, asks, what) in [
            (
                "env.tau_user",
                self.env.tau_user == TauUser::Llm,
                "the LLM customer",
            ),
            ("env.tau_nl_judge", self.env.tau_nl_judge, "the LLM judge"),
        ] {
            if asks && !retail {
                return bad(
                    field,
                    format!(
                        "{what} plays in the retail world only: it needs env.name = \"tau-retail\""
                    ),
                );
            }
            if asks && self.roles.llm.is_none() {
                return bad(
                    field,
                    format!(
                        "{what} asks the LLM roles' endpoint: set roles.llm (--llm, an OpenAI-compatible base URL ending in /v1) and roles.llm_model; roles.llm_roles = [] keeps the analyst, editor, labeller, profiler, proposer and voters built-in"
                    ),
                );
            }
        }
        if self.env.tau_llm_attempts == 0 {
            return bad(
                "env.tau_llm_attempts",
                "expected at least 1 request per customer reply or verdict, found 0".into(),
            );
        }
        if self.env.dbbench_data.is_some() && self.env.name != "dbbench" {
            return bad(
                "env.dbbench_data",
                "a DBBench file needs env.name = \"dbbench\"".into(),
            );
        }
        for (field, value) in [
            ("env.train_tasks", self.env.train_tasks),
            ("env.validation_tasks", self.env.validation_tasks),
            ("env.test_tasks", self.env.test_tasks),
            ("train.group_size", self.train.group_size),
            ("train.batch_tasks", self.train.batch_tasks),
            ("train.eval_k", self.train.eval_k),
            ("eval.k", self.eval.k),
            ("eval.ranks", self.eval.ranks),
            ("roles.voters", self.roles.voters),
            ("evolve.analyst_batch", self.evolve.analyst_batch),
            ("roles.max_tokens", self.roles.max_tokens.unwrap_or(1)),
            ("roles.timeout_s", self.roles.timeout_s as usize),
            ("rollout.concurrency", self.rollout.concurrency),
            ("evolve.parent_slots", self.evolve.parent_slots),
            (
                "evolve.train_tasks_per_round",
                self.evolve.train_tasks_per_round,
            ),
        ] {
            if value == 0 {
                return bad(field, "expected at least 1, found 0".into());
            }
        }
        if let Some(bad_role) = self
            .roles
            .llm_roles
            .iter()
            .find(|r| !LLM_ROLES.contains(&r.as_str()))
        {
            return bad(
                "roles.llm_roles",
                format!("unknown role `{bad_role}`; expected some of {LLM_ROLES:?}"),
            );
        }
        if let Err(message) = keys::check_key_env(&self.roles.llm_key_env) {
            return bad("roles.llm_key_env", message);
        }
        for (field, url) in [
            ("roles.llm", &self.roles.llm),
            ("rollout.engine_url", &self.rollout.engine_url),
        ] {
            if let Some(url) = url
                && let Err(message) = keys::Endpoint::parse(url)
            {
                return bad(field, message);
            }
        }
        if self.train.updates == 0 {
            return bad("train.updates", "expected at least 1, found 0".into());
        }
        if self.train.methods.is_empty() {
            return bad("train.methods", "expected at least one method".into());
        }
        let whale = self
            .train
            .methods
            .iter()
            .any(|m| m.spec().strategy == crate::methods::StrategyKind::Whale);
        if self.search.whale_rounds == 0
            || (whale && self.search.whale_rounds as u64 > self.train.updates)
        {
            return bad(
                "search.whale_rounds",
                format!(
                    "expected 1 to train.updates ({}) rounds (whale alternates once per round at least), found {}",
                    self.train.updates, self.search.whale_rounds
                ),
            );
        }
        // WHALE searches whale_rounds + 1 times and splits search.proposals over the searches:
        // each needs at least one candidate.
        if let Some(p) = self.search.proposals
            && whale
            && p < self.search.whale_rounds + 1
        {
            return bad(
                "search.proposals",
                format!(
                    "WHALE runs search.whale_rounds + 1 = {} searches and splits the budget over them; expected at least {} candidates, found {p}",
                    self.search.whale_rounds + 1,
                    self.search.whale_rounds + 1
                ),
            );
        }
        for (i, h) in self.eval.harnesses.iter().enumerate() {
            if h == "unseen" && self.env.name != "default" {
                return bad(
                    &format!("eval.harnesses[{i}]"),
                    format!(
                        "`unseen` is the embedded default's unseen set and env `{}` has none: expected \"builtin\", a pool directory or a harness JSON file",
                        self.env.name
                    ),
                );
            }
            if h != "builtin" && h != "unseen" && !Path::new(h).exists() {
                return bad(
                    &format!("eval.harnesses[{i}]"),
                    format!(
                        "expected \"unseen\", \"builtin\", a pool directory or a harness JSON file, found `{h}`, which does not exist"
                    ),
                );
            }
        }
        self.validate_external(&file)?;
        self.validate_tinker(&file)?;
        if self.search.proposals == Some(0) {
            return bad("search.proposals", "expected at least 1, found 0".into());
        }
        if let Some(m) = self.train.methods.iter().find(|m| {
            matches!(
                m.spec().strategy,
                crate::methods::StrategyKind::Mixture { .. }
            )
        }) && crate::methods::mixture_split(self.train.group_size).1 == 0
        {
            return bad(
                "train.group_size",
                format!(
                    "{m} splits each group between H0 and siblings: expected at least 2, found {}",
                    self.train.group_size
                ),
            );
        }
        if self.calibration.rollouts_per_task == 0 {
            return bad(
                "calibration.rollouts_per_task",
                "expected at least 1, found 0".into(),
            );
        }
        // Settings that must be positive and finite: (field, value, what is expected).
        let ratio = format!(
            "a positive multiple of evolution's budget (paper: {PAPER_META_HARNESS_BUDGET_RATIO:.3})"
        );
        for (field, value, expected) in [
            (
                "policy.learning_rate",
                self.policy.learning_rate,
                "a positive number",
            ),
            (
                "rollout.temperature",
                f64::from(self.rollout.temperature),
                "a positive temperature (GRPO samples)",
            ),
            (
                "search.meta_harness_budget_ratio",
                self.search.meta_harness_budget_ratio,
                ratio.as_str(),
            ),
            (
                "search.whale_sft_learning_rate",
                self.search.whale_sft_learning_rate,
                "a positive step size",
            ),
        ] {
            if !(value > 0.0 && value.is_finite()) {
                return bad(field, format!("expected {expected}, found {value}"));
            }
        }
        for (field, value) in [
            ("search.history_candidates", self.search.history_candidates),
            ("search.history_traces", self.search.history_traces),
            (
                "search.history_trace_chars",
                self.search.history_trace_chars,
            ),
            (
                "search.max_unscored_in_a_row",
                self.search.max_unscored_in_a_row,
            ),
        ] {
            if value == 0 {
                return bad(field, "expected at least 1, found 0".into());
            }
        }
        if self.rollout.engine != RolloutEngine::Local && self.rollout.engine_url.is_none() {
            return bad(
                "rollout.engine_url",
                "a vllm or sglang engine needs its server URL".into(),
            );
        }
        if self.rollout.engine != RolloutEngine::Local && self.policy.model.is_none() {
            return bad(
                "policy.model",
                "a remote engine serves a checkpoint: give the same checkpoint here".into(),
            );
        }
        if let Some(pool) = &self.pool
            && !pool.join(harness_pool::POOL_FILE).is_file()
        {
            return bad(
                "pool",
                format!(
                    "expected a pool directory holding {}, but {} has none",
                    harness_pool::POOL_FILE,
                    pool.display()
                ),
            );
        }
        if self.env.name == "tau-retail" {
            let Some(dir) = self.env.tau_retail_data.clone() else {
                return bad(
                    "env.tau_retail_data",
                    format!("env.name = \"tau-retail\" needs {TAU_RETAIL_SOURCE}"),
                );
            };
            if let Some(missing) = ["db.json", "policy.md", "tasks.json", "split_tasks.json"]
                .into_iter()
                .find(|f| !dir.join(f).is_file())
            {
                return bad(
                    "env.tau_retail_data",
                    format!(
                        "expected tau2-bench's retail domain folder, found no {missing} in {}",
                        dir.display()
                    ),
                );
            }
        }
        if let Some(data) = &self.env.dbbench_data
            && !data.is_file()
        {
            return bad(
                "env.dbbench_data",
                format!(
                    "expected a DBBench JSONL file, found no file at {}",
                    data.display()
                ),
            );
        }
        Ok(())
    }

    /// Whether the API keys the binary found may go to their endpoints: over https, or over
    /// plain http to the loopback host, unless the section's `allow_insecure_http` is set.
    /// `llm_key` and `engine_key` say which keys are set.
    pub fn check_key_transport(&self, llm_key: bool, engine_key: bool) -> Result<()> {
        let endpoints = [
            (
                llm_key,
                "roles.llm",
                &self.roles.llm,
                self.roles.allow_insecure_http,
            ),
            (
                engine_key && self.rollout.engine != RolloutEngine::Local,
                "rollout.engine_url",
                &self.rollout.engine_url,
                self.rollout.allow_insecure_http,
            ),
        ];
        for (key, field, url, allowed) in endpoints {
            let (true, Some(url)) = (key, url) else {
                continue;
            };
            keys::Endpoint::parse(url)
                .and_then(|endpoint| endpoint.check_key_transport(allowed))
                .map_err(|message| Error::Config {
                    file: PathBuf::from("<run config>"),
                    field: field.to_string(),
                    message,
                })?;
        }
        Ok(())
    }
}
