//! Checks repository-repair instances against `python3`: for each instance, every FAIL_TO_PASS
//! test must fail and every PASS_TO_PASS test pass on the original repository, all must pass
//! after the gold patch, and the oracle (the gold patch replayed through the tools) must score
//! 1 under the base harness. Without a file it checks the built-in instances.
//!
//! ```text
//! cargo run -p harness-envs --example swe_check                       # built-in instances
//! cargo run -p harness-envs --example swe_check -- instances.jsonl    # your own
//! # instances without call specs (`call_tests`), with the forgeable in-process verdict:
//! cargo run -p harness-envs --example swe_check -- instances.jsonl --allow-in-process-verdict
//! cargo run -p harness-envs --example swe_check -- --export out.jsonl # write the built-ins
//! ```

use std::io::Write;
use std::process::ExitCode;

use harness_core::{Split, run_episode};
use harness_envs::swe::{self, SweEnv};

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let env = match args.as_slice() {
        [] => SweEnv::builtin(),
        [flag, out] if flag == "--export" => return export(out),
        [path] | [path, _] if args.len() == 1 || args[1] == "--allow-in-process-verdict" => {
            match SweEnv::load(path, Split::Test) {
                Ok(env) => {
                    let config = swe::SweConfig {
                        allow_in_process_verdict: args.len() == 2,
                        ..env.config().clone()
                    };
                    env.with_config(config)
                }
                Err(e) => {
                    eprintln!("error: {e}");
                    return ExitCode::from(2);
                }
            }
        }
        _ => {
            eprintln!(
                "usage: swe_check [file.jsonl [--allow-in-process-verdict]] | swe_check --export <file.jsonl>"
            );
            return ExitCode::from(2);
        }
    };
    let ids: Vec<String> = env.instances().map(|i| i.instance_id.clone()).collect();
    let workers = std::thread::available_parallelism().map_or(2, |n| n.get());
    let results: Vec<(String, Vec<String>)> = std::thread::scope(|scope| {
        let handles: Vec<_> = (0..workers)
            .map(|w| {
                let (env, ids) = (&env, &ids);
                scope.spawn(move || {
                    ids.iter()
                        .skip(w)
                        .step_by(workers)
                        .map(|id| (id.clone(), check(env, id)))
                        .collect::<Vec<_>>()
                })
            })
            .collect();
        handles
            .into_iter()
            .flat_map(|h| h.join().unwrap_or_default())
            .collect()
    });
    let mut ok = 0;
    for (id, problems) in &results {
        if problems.is_empty() {
            ok += 1;
        } else {
            for p in problems {
                println!("{id}: {p}");
            }
        }
    }
    for split in Split::ALL {
        let n = env.instances().filter(|i| i.split == split).count();
        println!("{split}: {n} instances");
    }
    println!("reproduced {ok}/{}", results.len());
    if ok == results.len() {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    }
}

fn check(env: &SweEnv, id: &str) -> Vec<String> {
    let mut problems = match env.validate_instance(id) {
        Ok(report) => report.problems,
        Err(e) => return vec![format!("error: {e}")],
    };
    let Some(instance) = env.instance(id) else {
        return vec!["missing".into()];
    };
    let task = SweEnv::task_for(instance);
    let oracle = match env.oracle(&task) {
        Ok(oracle) => oracle,
        Err(e) => return vec![format!("oracle: {e}")],
    };
    let mut harness = swe::base_harness();
    let needed = oracle.calls().len() as u32 + 2;
    harness.limits.max_env_actions = harness.limits.max_env_actions.max(needed);
    harness.limits.max_model_calls = harness.limits.max_model_calls.max(needed);
    match futures::executor::block_on(run_episode(&oracle, &harness, env, &task, 0)) {
        Ok(t) if t.is_success() => {}
        Ok(t) => problems.push(format!("oracle scored 0: {}", t.outcome.details)),
        Err(e) => problems.push(format!("oracle episode failed: {e}")),
    }
    problems
}

fn export(path: &str) -> ExitCode {
    let write = || -> std::io::Result<usize> {
        let mut file = std::io::BufWriter::new(std::fs::File::create(path)?);
        let instances = swe::builtin_instances();
        for instance in &instances {
            let line = serde_json::to_string(instance).map_err(std::io::Error::other)?;
            writeln!(file, "{line}")?;
        }
        file.flush()?;
        Ok(instances.len())
    };
    match write() {
        Ok(n) => {
            println!("wrote {n} instances to {path}");
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("error: {path}: {e}");
            ExitCode::from(2)
        }
    }
}
