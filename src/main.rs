//! `harness-s`: the Harness-S main job from the command line.
//!
//! ```text
//! harness-s run                                   # the whole loop on the embedded default
//! harness-s evolve    --config configs/compare.toml # evolution into <out>/evolve/pool
//! harness-s calibrate --config configs/compare.toml # the router's first calibration
//! harness-s train     --config configs/compare.toml --method harness_s [--resume]
//! harness-s eval      --config configs/compare.toml --method harness_s
//! harness-s report    --config configs/compare.toml
//! harness-s serve     --config configs/compare.toml --method harness_s --port 8000
//! harness-s env-serve --env dbbench --port 8100  # an environment over HTTP (harness-external)
//! ```
//!
//! Every subcommand reads one run configuration (`--config`, TOML or JSON, every setting listed
//! by `--help`), with flags and `--set path=value` overriding it. Only this binary reads flags
//! and environment variables (the LLM roles' API key, from `roles.llm_key_env`).

use std::net::SocketAddr;

use anyhow::Result;
use clap::Parser;
use harness_pipeline::{Method, Workbench, stages};

// The default allocator spends much of a CPU training step in page faults; mimalloc reuses
// the large tensor buffers.
#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

mod cli;
mod sweep_jobs;
mod threads;

use cli::{Cli, Command, Common, method, serve_key};

fn main() -> Result<()> {
    // Before any thread starts and any key is read: other processes of this user (a test of
    // the repository-repair world run without its sandbox, say) can then neither attach to
    // this process nor read its /proc entries, and so not its environment with the API keys.
    if let Err(e) = harness_sandbox::set_non_dumpable() {
        eprintln!("warning: cannot mark the process non-dumpable: {e}");
    }
    let cli = Cli::parse();
    threads::set_unless_given(|| cpu_threads(&cli));
    run(cli)
}

/// The process's CPU threads from the configuration (`policy.threads`, see
/// `PolicyConfig::cpu_threads`); for a sweep run in this process, when every cell agrees
/// (`sweep --jobs N` gives each child process its share instead). A configuration that does
/// not load is left to the command to report.
fn cpu_threads(cli: &Cli) -> Option<usize> {
    match &cli.command {
        Command::Run { common, .. }
        | Command::Train { common, .. }
        | Command::Eval { common, .. }
        | Command::Serve { common, .. }
        | Command::Evolve(common)
        | Command::Calibrate(common)
        | Command::Report(common) => common.config().ok()?.policy.cpu_threads(),
        Command::Sweep { jobs, .. } if *jobs > 1 => None,
        Command::Sweep { file, .. } => {
            let sweep = harness_pipeline::sweep::SweepConfig::load(file).ok()?;
            harness_pipeline::sweep::cpu_threads(&sweep.cells(file).ok()?)
        }
        Command::EnvServe(_) => None,
    }
}

#[tokio::main(flavor = "multi_thread")]
async fn run(cli: Cli) -> Result<()> {
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env().unwrap_or_else(|_| "warn".into()),
        )
        .with_writer(std::io::stderr)
        .init();
    match cli.command {
        Command::Run { common, explain } => {
            let cfg = common.config()?;
            if explain {
                let differences = harness_pipeline::paper::paper_differences(&cfg);
                println!(
                    "{} settings of this run are not the paper's or are not given by it:",
                    differences.len()
                );
                for d in differences {
                    println!("- {d}");
                }
                return Ok(());
            }
            let summary =
                harness_pipeline::run_main_job(&cfg, &common.secrets(&cfg), &common.progress())
                    .await?;
            println!("{}", summary.tables);
            println!(
                "wrote {} report files under {} in {:.0}s",
                summary.files.len(),
                cfg.out.display(),
                summary.seconds
            );
        }
        Command::Sweep {
            file,
            report_only,
            out,
            export,
            jobs,
            cell,
            quiet,
        } => {
            use harness_pipeline::sweep::{
                CellOutcome, SweepConfig, export_sweep, run_cell, run_sweep, write_sweep_report,
            };
            let mut sweep = SweepConfig::load(&file)?;
            if let Some(out) = out {
                sweep.out = out;
            }
            if let Some(dest) = export {
                let dirs = export_sweep(&sweep, &file, &dest)?;
                println!(
                    "exported {} finished cell-seeds from {} to {}",
                    dirs.len(),
                    sweep.out.display(),
                    dest.display()
                );
                return Ok(());
            }
            if report_only {
                for f in write_sweep_report(&sweep, &file, &[])? {
                    println!("wrote {}", f.display());
                }
                return Ok(());
            }
            let first = sweep.cells(&file)?.remove(0).config;
            let common = Common {
                quiet,
                ..Common::default()
            };
            if let Some(i) = cell {
                let index = i as usize - 1;
                let outcome = run_cell(
                    &sweep,
                    &file,
                    index,
                    &common.secrets(&first),
                    &common.progress(),
                )
                .await?;
                match outcome {
                    CellOutcome::Skipped => println!("sweep: cell-seed {i} had finished"),
                    CellOutcome::Ran(s) => println!("sweep: cell-seed {i} finished in {s:.0}s"),
                    CellOutcome::Failed(e) => anyhow::bail!("cell-seed {i} failed: {e}"),
                }
                return Ok(());
            }
            if jobs > 1 {
                let failed = sweep_jobs::run(&file, &sweep, usize::from(jobs))?;
                for f in write_sweep_report(&sweep, &file, &failed)? {
                    println!("wrote {}", f.display());
                }
                return sweep_jobs::fail_on(&failed);
            }
            let outcome =
                run_sweep(&sweep, &file, &common.secrets(&first), &common.progress()).await?;
            println!(
                "sweep: {} cell-seeds run, {} already finished, {} failed",
                outcome.ran.len(),
                outcome.skipped,
                outcome.failed.len()
            );
            for f in &outcome.files {
                println!("wrote {}", f.display());
            }
            sweep_jobs::fail_on(&outcome.failed)?;
        }
        Command::Evolve(common) => {
            for wb in workbenches(&common)? {
                harness_pipeline::write_run_config(&wb)?;
                let pool = stages::evolve(&wb).await?;
                println!("{}", pool.render_lineage());
                println!("pool: {}", wb.layout.pool().display());
            }
        }
        Command::Calibrate(common) => {
            for wb in workbenches(&common)? {
                let pool = stages::load_pool(&wb)?;
                stages::calibrate(&wb, &pool).await?;
                println!("calibration: {}", wb.layout.calibration().display());
            }
        }
        Command::Train {
            common,
            method: name,
            resume,
        } => {
            for wb in workbenches(&common)? {
                let pool = stages::load_pool(&wb)?;
                let methods = match &name {
                    Some(n) => vec![method(n)?],
                    // A method without a training stage (he_only) has nothing to train.
                    None => wb
                        .cfg
                        .train
                        .methods
                        .iter()
                        .copied()
                        .filter(|m| m.has_training_stage())
                        .collect(),
                };
                for m in methods {
                    let trained = stages::train(&wb, &pool, m, resume).await?;
                    println!(
                        "{}: {} (checkpoint {})",
                        m.name(),
                        trained.run_dir.display(),
                        trained.checkpoint.display()
                    );
                }
            }
        }
        Command::Eval {
            common,
            method: name,
        } => {
            for wb in workbenches(&common)? {
                let pool = stages::load_pool(&wb)?;
                let methods: Vec<Option<Method>> = match name.as_deref() {
                    Some("initial") => vec![None],
                    Some(n) => vec![Some(method(n)?)],
                    None => std::iter::once(None)
                        .chain(wb.cfg.train.methods.iter().copied().map(Some))
                        .collect(),
                };
                for m in methods {
                    stages::evaluate(&wb, &pool, m).await?;
                }
                // Table 4 from every evaluation so far (it needs plain GRPO's).
                if let Some(why) = stages::transfer(&wb, &pool)? {
                    println!("Table 4: not written: {why}");
                }
                println!("results: {}", wb.layout.test_results().display());
            }
        }
        Command::Report(common) => {
            let cfg = common.config()?;
            let files = harness_pipeline::write_report(&cfg)?;
            println!("{}", harness_pipeline::render_tables(&cfg)?);
            for f in files {
                println!("wrote {}", f.display());
            }
        }
        Command::Serve {
            common,
            method: name,
            host,
            port,
            api_key_env,
            api_key,
            reload_root,
        } => {
            let api_key = serve_key(api_key_env.as_deref(), api_key)?;
            if api_key.is_none() && !host.is_loopback() {
                eprintln!(
                    "warning: serving on {host} without an API key: anyone who reaches the \
                     port may use the model (give --api-key-env)"
                );
            }
            let cfg = common.config()?;
            let wb = Workbench::new(cfg.clone(), common.secrets(&cfg), common.progress())?;
            let dir = match name.as_deref() {
                None | Some("initial") => wb.checkpoint.clone(),
                Some(n) => stages::checkpoint_of(&wb, method(n)?)?,
            };
            let served = name.unwrap_or_else(|| "initial".into());
            let server = harness_pipeline::serve::serve(
                &dir,
                &harness_pipeline::serve::ServeSettings {
                    addr: SocketAddr::new(host, port),
                    served_model: served.clone(),
                    max_batch: 32,
                    api_key,
                    reload_root,
                },
            )
            .await?;
            println!(
                "serving `{served}` from {} at {} (OpenAI base URL {}/v1); Ctrl-C stops",
                dir.display(),
                server.base_url(),
                server.base_url()
            );
            tokio::signal::ctrl_c().await?;
            server.shutdown().await?;
        }
        Command::EnvServe(args) => {
            use harness_external::envserver::server::{EnvServer, EnvServerHandle};
            let env = args.environment()?;
            let counts: Vec<String> = harness_core::Split::ALL
                .into_iter()
                .map(|split| Ok(format!("{} {split}", env.tasks(split)?.len())))
                .collect::<Result<_>>()?;
            let server = EnvServer::new(env.clone(), args.config()?)?;
            let handle =
                EnvServerHandle::spawn(SocketAddr::new(args.host, args.port), server).await?;
            println!(
                "serving environment `{}` ({} tasks) at {} (protocol {}); Ctrl-C stops",
                env.name(),
                counts.join(", "),
                handle.base_url(),
                harness_external::envserver::PROTOCOL
            );
            tokio::signal::ctrl_c().await?;
            handle.shutdown().await?;
        }
    }
    Ok(())
}

/// One workbench per seed of the configuration.
fn workbenches(common: &Common) -> Result<Vec<Workbench>> {
    let cfg = common.config()?;
    let secrets = common.secrets(&cfg);
    cfg.seed_list()
        .into_iter()
        .map(|seed| {
            Ok(Workbench::new(
                cfg.with_seed(seed),
                secrets.clone(),
                common.progress(),
            )?)
        })
        .collect()
}
