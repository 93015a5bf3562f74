//! `[external]`: agent programs in the pool, their sandbox and the recording proxy.

use super::*;

/// Agent programs in the pool: external harnesses (harness-external), each run once per
/// episode against the run's environment served over HTTP and a recording proxy in front of the
/// acting policy.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct ExternalConfig {
    /// External pool members: JSON files `{"kind": "external", "name", "command": [...],
    /// "env": {...}, "limits": {...}}`, joined to the pool as siblings after evolution (or
    /// after the built-in siblings).
    pub harnesses: Vec<PathBuf>,
    /// An external H0: a program the policy is trained for (needs `evolve.source = "builtin"`:
    /// evolution edits declarative harnesses, not programs).
    pub h0: Option<PathBuf>,
    /// The bundled standard-library Python DBBench agent joins the pool as an external
    /// sibling, speaking H0's prompts and carrying the hook `python_sibling_hook`: unset means
    /// on for `env.name = "default"` and off elsewhere.
    pub python_sibling: Option<bool>,
    /// The hook (by name) of the built-in sibling whose behaviour the bundled agent carries.
    pub python_sibling_hook: String,
    /// The Python interpreter of the bundled agent.
    pub python: String,
    /// What a turn whose prompt rewrites the program's history gets (the prefix check):
    /// `own_context` (trained in its own recorded context) or `mask_episode` (the episode keeps
    /// its reward and none of its tokens is scored).
    pub prefix: PrefixMode,
    /// Whether programs run inside the bubblewrap sandbox of policy-caused commands: `auto`
    /// (when bubblewrap works, else unsandboxed with a warning), `on` (refuse to run without
    /// it) or `off`.
    pub sandbox: SandboxMode,
    /// Wall-clock seconds one program episode may take before it is killed (the bundled
    /// agent's; a member file's own `limits.timeout_s` applies to it).
    pub timeout_s: f64,
    /// Requests one program may have in flight at once, at the environment server and at the
    /// recording proxy each; one more is refused at once (default 4).
    #[serde(skip_serializing_if = "is_default_requests_in_flight")]
    pub requests_in_flight: usize,
    /// Seconds one request of a program to the environment server or the proxy may take,
    /// reading its body and a verification included (default 600).
    #[serde(skip_serializing_if = "is_default_request_timeout_s")]
    pub request_timeout_s: f64,
}

impl Default for ExternalConfig {
    fn default() -> Self {
        ExternalConfig {
            harnesses: Vec::new(),
            h0: None,
            python_sibling: None,
            python_sibling_hook: "low-budget-commit".into(),
            python: "python3".into(),
            prefix: PrefixMode::OwnContext,
            sandbox: SandboxMode::Auto,
            timeout_s: 120.0,
            requests_in_flight: DEFAULT_REQUESTS_IN_FLIGHT,
            request_timeout_s: DEFAULT_REQUEST_TIMEOUT_S,
        }
    }
}

/// `external.requests_in_flight`'s default.
pub(crate) const DEFAULT_REQUESTS_IN_FLIGHT: usize = 4;
/// `external.request_timeout_s`'s default.
pub(crate) const DEFAULT_REQUEST_TIMEOUT_S: f64 = 600.0;

/// Defaults stay out of `run.json`, so a run saved before these settings existed still
/// matches its configuration.
pub(crate) fn is_default_requests_in_flight(value: &usize) -> bool {
    *value == DEFAULT_REQUESTS_IN_FLIGHT
}

pub(crate) fn is_default_request_timeout_s(value: &f64) -> bool {
    *value == DEFAULT_REQUEST_TIMEOUT_S
}

impl ExternalConfig {
    /// Whether the bundled Python agent joins the pool of a run on `env`.
    pub fn wants_python_sibling(&self, env: &str) -> bool {
        self.python_sibling.unwrap_or(env == "default")
    }
}

/// `external.prefix`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum PrefixMode {
    /// A turn that rewrote history is trained in its own recorded context.
    #[default]
    OwnContext,
    /// An episode with such a turn keeps its reward, but none of its tokens is scored.
    MaskEpisode,
}

/// `external.sandbox`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum SandboxMode {
    /// The sandbox when bubblewrap works here, else none (with a warning).
    #[default]
    Auto,
    /// The sandbox, or the run is refused.
    On,
    /// No sandbox: programs run with the trainer's user, files and network.
    Off,
}

impl RunConfig {
    /// The `[external]` settings: member files that exist, an external H0 only without
    /// evolution, the bundled agent only on a DBBench world, a positive timeout.
    pub(crate) fn validate_external(&self, file: &Path) -> Result<()> {
        let x = &self.external;
        let bad = |field: String, message: String| {
            Err(Error::Config {
                file: file.to_path_buf(),
                field,
                message,
            })
        };
        for (i, path) in x.harnesses.iter().enumerate() {
            if !path.is_file() {
                return bad(
                    format!("external.harnesses[{i}]"),
                    format!(
                        "expected an external harness JSON file ({{\"kind\": \"external\", ...}}), found no file at {}",
                        path.display()
                    ),
                );
            }
        }
        if let Some(h0) = &x.h0 {
            if !h0.is_file() {
                return bad(
                    "external.h0".into(),
                    format!(
                        "expected an external harness JSON file, found no file at {}",
                        h0.display()
                    ),
                );
            }
            if let Some(m) = self.train.methods.iter().find(|m| m.searches()) {
                return bad(
                    "external.h0".into(),
                    format!(
                        "{m} searches for a harness by editing H0, and an agent program cannot be edited: leave {m} out of train.methods"
                    ),
                );
            }
            if self.evolve.source != PoolSource::Builtin && self.pool.is_none() {
                return bad(
                    "external.h0".into(),
                    "an external H0 cannot be evolved (evolution edits declarative harnesses): set evolve.source = \"builtin\", or give a saved pool whose H0 is that program".into(),
                );
            }
        }
        if x.python_sibling == Some(true) && x.h0.is_some() {
            return bad(
                "external.python_sibling".into(),
                "the bundled Python agent mirrors a declarative H0, and external.h0 makes H0 a program: leave one of them out".into(),
            );
        }
        if x.python_sibling == Some(true)
            && !matches!(self.env.name.as_str(), "default" | "dbbench")
        {
            return bad(
                "external.python_sibling".into(),
                format!(
                    "the bundled Python agent acts on DBBench worlds (env.name = \"default\" or \"dbbench\"), not `{}`",
                    self.env.name
                ),
            );
        }
        if x.python.trim().is_empty() {
            return bad(
                "external.python".into(),
                "expected a Python interpreter, such as \"python3\"".into(),
            );
        }
        if x.python_sibling_hook.trim().is_empty() {
            return bad(
                "external.python_sibling_hook".into(),
                "expected the name of a built-in sibling's hook, such as \"low-budget-commit\""
                    .into(),
            );
        }
        if !(x.timeout_s.is_finite() && x.timeout_s > 0.0) {
            return bad(
                "external.timeout_s".into(),
                format!("expected seconds above zero, found {}", x.timeout_s),
            );
        }
        if x.requests_in_flight == 0 {
            return bad(
                "external.requests_in_flight".into(),
                "expected at least 1 request in flight per program".into(),
            );
        }
        if !(x.request_timeout_s.is_finite() && x.request_timeout_s > 0.0) {
            return bad(
                "external.request_timeout_s".into(),
                format!("expected seconds above zero, found {}", x.request_timeout_s),
            );
        }
        Ok(())
    }
}
