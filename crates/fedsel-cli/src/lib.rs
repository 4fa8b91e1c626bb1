//! The `fedsel` command line. It is a library so that the `fedsel` binary and the Python
//! package's `fedsel` script run the same code ([`main_with_args`]): one CLI, two doors.

mod signals;

use std::ffi::OsString;
use std::io::{IsTerminal, Write};
use std::path::{Path, PathBuf};
use std::time::Instant;

use anyhow::{Context, Result};
use clap::{Parser, Subcommand};
use indicatif::{ProgressBar, ProgressStyle};

use fedsel::config::Config;
use fedsel::data::{cifar, fmnist, locate, shakespeare};
use fedsel::engine::{self, Experiment, Observer, RoundRecord};
use fedsel::output::RunWriter;

/// `fedsel --version`: the version and the commit of the build ([`fedsel::build_commit`]).
static VERSION_LINE: std::sync::LazyLock<String> =
    std::sync::LazyLock::new(|| format!("{} ({})", fedsel::VERSION, fedsel::build_commit()));

const SCHEMA: &str = "\
CONFIG SCHEMA (TOML; every key optional, defaults = the built-in experiment):
  name, seed, rounds, targets = [acc, ...], data_dir, device = \"flex\"|\"cuda\", verify_checksums, checkpoint_every
  [dataset]       kind = synthetic (alpha, beta, users, dim, classes, test_fraction)
                       | fmnist (normalize = mnist|half) | cifar10 | cifar100
                       | shakespeare (train_fraction, min_samples, max_clients, max_samples_per_client)
                       | leaf (path, holdout = leaf_test|split, shape, classes) | flgo (path, source, shape, classes)
  [partition]     clients, holdout_fraction
  [partition.scheme] kind = natural | iid | shards (shards_per_client) | dirichlet_qp (alpha)
                       | class_dirichlet (alphas = [..]) | labels (labels_per_client)
                       | lognormal_dirichlet (sigma, alpha)
  [model]         kind = logreg | mlp | cnn_fmnist | cnn_hics | cnn_hics_code | cnn_cifar | char_lstm, dropout,
                  zero_bias, init = default|xavier_relu
  [train]         optimizer = sgd|adam, lr, momentum, weight_decay, beta1, beta2, eps,
                  work = { steps = N } | { epochs = N }, batch_size, prox_mu, persistent_state,
                  schedule = { kind = constant | step (milestones, gamma) | exponential (gamma) }
  [server]        aggregation = auto|mean|data_size|selector, optimizer = replace|sgd|adam, lr, beta1, beta2, tau
  [selection]     strategy = uniform|md|powd|cpowd|rpowd|afl|fedcor|fedgp|fedgs|f3ast|hics|cs1|cs2|divfl|oort|fedcs
                             |tifl|refl|fedbalancer|pyramidfl,
                  clients_per_round (0 = use fraction), fraction, client_size = train|local;
                  per-strategy tables
                  [selection.powd|afl|fedcor|fedgs|f3ast|hics|divfl|oort|fedcs|tifl|refl|fedbalancer|pyramidfl]
                  (see docs/configuration.md)
  [availability]  kind = always | idl | mdf | ldf | ymf | yc | ln | sln | scarce | home_device | uneven | smartphones | trace
  [budget]        kind = constant | periodic (values, hold) | random (min, max)
  [eval]          every, batch_size, max_test_samples, per_client
  [system]        kind = none | lognormal (mean_ms_per_sample, tail_skew, bandwidth_kbps, bandwidth_skew) | csv (path) | fedscale (path), behave_trace, augmentation,
                  idle_s (a round that trains nobody, without deadline or trace; default the median round trip)
  [system.round]  policy = wait_all | overcommit (overcommit) | deadline (deadline_s)
                  | fedbuff (concurrency, buffer_size: both required)
  [system.stale]  stale_update (rounds a late update may wait; -1 no limit), stale_factor, stale_beta, scale_coff
  [output]        tensorboard (a directory of event files; not part of the config's hash)
Override any key with --set key=value, e.g. --set train.lr=0.05 --set partition.scheme.kind=iid";

#[derive(Parser)]
#[command(name = "fedsel", version = VERSION_LINE.as_str(), about = "Federated learning with client selection", after_help = SCHEMA)]
struct Cli {
    #[command(subcommand)]
    command: Option<Command>,
}

#[derive(Subcommand)]
enum Command {
    /// Run one experiment (the built-in default when no CONFIG is given).
    #[command(after_help = SCHEMA)]
    Run(RunArgs),
    /// Run every cell of a sweep (skipping finished ones), then write its report.
    Sweep {
        /// Sweep file.
        sweep: PathBuf,
        /// Output directory.
        #[arg(long)]
        out: PathBuf,
        /// Cells run at once [default: the number of cores]; each gets cores / jobs threads.
        #[arg(long)]
        jobs: Option<usize>,
        /// Dataset directory.
        #[arg(long)]
        data_dir: Option<PathBuf>,
        /// List the cells (and whether each is already finished) without running anything.
        #[arg(long)]
        dry_run: bool,
        /// Override a key in every cell, before the axes: --set eval.every=5 (repeatable).
        /// The cells' configs, and so their directories, change with it.
        #[arg(long = "set", value_name = "KEY=VALUE")]
        set: Vec<String>,
        /// Rounds of every cell (same as --set rounds=N), e.g. to try a paper grid briefly.
        #[arg(long)]
        rounds: Option<usize>,
        /// Run only part I of N of the grid (e.g. 3/8, one per job of a Slurm array), into
        /// the same --out as the other parts; the report is written once every cell is done.
        #[arg(long, value_name = "I/N")]
        shard: Option<fedsel_workbench::sweep::Shard>,
        /// Run every cell even when the first two fail with the same config or data error
        /// (which otherwise stops the sweep: the other cells would fail alike).
        #[arg(long)]
        keep_going: bool,
        /// Write each cell's TensorBoard event files into DIR/<cell directory> (same as
        /// --set output.tensorboard=DIR).
        #[arg(long, value_name = "DIR")]
        tensorboard: Option<PathBuf>,
    },
    /// Write report.md (or report.tex) and the table CSVs for a sweep directory, or one
    /// comparison of any run directories (runs differing only by seed form one arm; runs of
    /// different tasks are refused, runs cut short are left out and named).
    Report {
        /// One sweep's output directory, or run directories.
        #[arg(required = true, value_name = "DIR")]
        dirs: Vec<PathBuf>,
        /// Where to write [default: a sweep's own directory; for runs, ./report].
        #[arg(long)]
        out: Option<PathBuf>,
        /// markdown (report.md, with figures) or latex (report.tex, the tables as LaTeX
        /// table floats).
        #[arg(long, default_value = "markdown")]
        format: fedsel_workbench::report::Format,
        /// Smooth the figures' curves with a Savitzky–Golay filter of this (odd) window.
        #[arg(long, value_name = "WINDOW")]
        smooth: Option<usize>,
        /// Compare run directories of different tasks (dataset, partition, model.kind or
        /// targets differ), which are refused otherwise: their seeds are paired and their
        /// targets share numbered columns all the same.
        #[arg(long)]
        allow_mixed: bool,
    },
    /// The per-seed results behind docs/results.md: collect a sweep's rows into results/,
    /// render the page's verdict tables from them, or check that it still matches
    /// (docs/reproducing.md states the verdict rule).
    Results {
        #[command(subcommand)]
        action: ResultsAction,
    },
    /// List the datasets and whether their files were found.
    Datasets {
        /// Dataset directory.
        #[arg(long)]
        data_dir: Option<PathBuf>,
    },
    /// Measure per-step times of every model and ms per round of the FedCor FMNIST workload.
    Bench {
        /// Rounds of the FedCor workload to time.
        #[arg(long, default_value_t = 50)]
        rounds: usize,
        /// Dataset directory.
        #[arg(long)]
        data_dir: Option<PathBuf>,
        /// Time only the models whose name contains this, and skip the selection and
        /// round timings (for alternating with a PyTorch reference).
        #[arg(long, value_name = "NAME")]
        only: Option<String>,
        /// Time the training steps only: no comparison with the autodiff paths, no
        /// evaluation, selection or round timings (the quick half of a before/after pair).
        #[arg(long, conflicts_with = "selection_only")]
        steps_only: bool,
        /// Time only the selectors: each strategy's selection time per round at each
        /// `--clients` size.
        #[arg(long)]
        selection_only: bool,
        /// Time only the virtual clock's cost: the FedCor FMNIST workload's rounds with and
        /// without `[system] kind = "lognormal"`.
        #[arg(long, conflicts_with_all = ["selection_only", "steps_only"])]
        clock_only: bool,
        /// Client counts of the selection timings.
        #[arg(long, value_delimiter = ',', default_values_t = [100, 1000, 10_000])]
        clients: Vec<usize>,
        /// Strategies of the selection timings (default: all).
        #[arg(long, value_delimiter = ',')]
        strategies: Vec<String>,
    },
}

/// Prints progress: a bar on a terminal, a plain line every tenth of the run otherwise.
struct Progress {
    writer: RunWriter,
    bar: Option<ProgressBar>,
    rounds: usize,
    best: f64,
    /// SIGINT and SIGTERM, caught while the run lasts.
    stop: signals::Stop,
}

impl Observer for Progress {
    fn on_round(&mut self, r: &RoundRecord) -> fedsel::error::Result<()> {
        self.writer.on_round(r)?;
        if let Some(a) = r.test_acc {
            self.best = self.best.max(a);
        }
        let msg = format!(
            "acc {} best {:.4} loss {}",
            r.test_acc.map_or("-".into(), |a| format!("{a:.4}")),
            self.best,
            r.test_loss.map_or("-".into(), |l| format!("{l:.4}"))
        );
        match &self.bar {
            Some(bar) => {
                bar.set_position(r.round as u64 + 1);
                bar.set_message(msg);
            }
            None => {
                let every = (self.rounds / 10).max(1);
                if (r.round + 1).is_multiple_of(every) || r.round + 1 == self.rounds {
                    println!(
                        "round {:>5} ({}/{} done) {msg} ({:.1}s)",
                        r.round,
                        r.round + 1,
                        self.rounds,
                        r.elapsed_s
                    );
                }
            }
        }
        match self.stop.caught() {
            Some(_) => Err(fedsel::error::Error::Interrupted { round: r.round }),
            None => Ok(()),
        }
    }

    fn on_checkpoint(&mut self, cp: &fedsel::checkpoint::Checkpoint) -> fedsel::error::Result<()> {
        self.writer.on_checkpoint(cp)
    }

    fn on_reports(&mut self, files: &[(String, String)]) -> fedsel::error::Result<()> {
        self.writer.on_reports(files)
    }
}

/// What `fedsel run` was asked to do.
#[derive(clap::Args, Default)]
struct RunArgs {
    /// TOML config file.
    config: Option<PathBuf>,
    /// Output directory [default: runs/<name>-s<seed>].
    #[arg(long)]
    out: Option<PathBuf>,
    /// Override a config key: --set train.lr=0.1 (repeatable).
    #[arg(long = "set", value_name = "KEY=VALUE")]
    set: Vec<String>,
    /// Seed (same as --set seed=N).
    #[arg(long)]
    seed: Option<u64>,
    /// Dataset directory (beats the config's data_dir and FEDSEL_DATA).
    #[arg(long)]
    data_dir: Option<PathBuf>,
    /// Continue the run in DIR from its last checkpoint.
    #[arg(long, value_name = "DIR")]
    resume: Option<PathBuf>,
    /// Replace the run already in the output directory (it is cleared first).
    #[arg(long)]
    overwrite: bool,
    /// Also write TensorBoard event files into DIR (the config's `output.tensorboard`):
    /// every metrics.csv column by round, and by virtual time where the clock runs.
    #[arg(long, value_name = "DIR")]
    tensorboard: Option<PathBuf>,
}

/// The rounds of the run in `dir` when its `summary.json` says it finished.
fn finished_rounds(dir: &Path) -> Option<u64> {
    let text = std::fs::read_to_string(dir.join("summary.json")).ok()?;
    let v: serde_json::Value = serde_json::from_str(&text).ok()?;
    (v["status"] == "finished").then(|| v["rounds"].as_u64().unwrap_or(0))
}

/// A run that a signal stopped; its exit status is 128 + the signal's number, as a shell
/// reports a process the signal killed.
#[derive(Debug)]
struct Interrupted {
    signal: i32,
    message: String,
}

impl std::fmt::Display for Interrupted {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.message)
    }
}

impl std::error::Error for Interrupted {}

fn run(args: RunArgs) -> Result<()> {
    let t0 = Instant::now();
    // Installed before the data loads, so a signal during a long preparation stops the run
    // at its first round rather than killing it without a summary.
    let stop = signals::Stop::install().context("installing the SIGINT and SIGTERM handlers")?;
    let (config, out, checkpoint) = match &args.resume {
        Some(dir) => {
            anyhow::ensure!(
                args.config.is_none()
                    && !args.overwrite
                    && args.set.is_empty()
                    && args.seed.is_none()
                    && args.out.is_none(),
                "--resume takes the config and output directory of the run it continues; drop CONFIG, --set, --seed, --out and --overwrite"
            );
            if let Some(rounds) = finished_rounds(dir) {
                println!(
                    "{}: the run is finished ({rounds} rounds); nothing to resume",
                    dir.display()
                );
                return Ok(());
            }
            let config = Config::load(Some(&dir.join("config.resolved.toml")), &[])?;
            let cp = fedsel::checkpoint::load(dir)?;
            engine::check_resumable(&config, &cp)
                .with_context(|| format!("resuming {}", dir.display()))?;
            (config, dir.clone(), Some(cp))
        }
        None => {
            let mut set = args.set;
            if let Some(s) = args.seed {
                set.push(format!("seed={s}"));
            }
            let config = Config::load(args.config.as_deref(), &set)?;
            // The default directory carries a short hash of the resolved config, so runs
            // that differ only by --set overrides do not share it.
            let out = args.out.unwrap_or_else(|| {
                PathBuf::from("runs").join(format!(
                    "{}-s{}-{}",
                    config.name,
                    config.seed,
                    &config.hash()[..8]
                ))
            });
            if args.overwrite && out.exists() {
                std::fs::remove_dir_all(&out)
                    .with_context(|| format!("clearing {} for --overwrite", out.display()))?;
            }
            (config, out, None)
        }
    };
    let mut config = config;
    if let Some(tb) = args.tensorboard {
        config.output.tensorboard = Some(tb);
    }
    let dir = locate::data_dir(args.data_dir, config.data_dir.clone());
    let exp = Experiment::prepare(config.clone(), &dir)
        .with_context(|| format!("preparing `{}`", config.name))?;
    for w in config.warnings(exp.clients.len()) {
        tracing::warn!("{w}");
    }
    let clock = config
        .system
        .as_ref()
        .and_then(|s| s.describe())
        .map_or(String::new(), |c| format!("; {c}"));
    println!(
        "fedsel {}: {} on {} ({} clients, {} train / {} test examples, {} parameters), {} rounds{clock} -> {}",
        fedsel::VERSION,
        config.selection.strategy,
        exp.data.name,
        exp.clients.len(),
        exp.sizes().iter().sum::<usize>(),
        exp.test_idx.len(),
        exp.layout.total,
        config.rounds,
        out.display()
    );
    if let Some(cp) = &checkpoint {
        engine::check_resume(&exp, cp).with_context(|| format!("resuming {}", out.display()))?;
    }
    let writer = match &checkpoint {
        Some(cp) => {
            println!(
                "resuming at round {} from {}",
                cp.next_round,
                fedsel::checkpoint::dir(&out).display()
            );
            RunWriter::resume(&out, cp.next_round)?.with_trackers(&exp.config)?
        }
        None => RunWriter::create(&out, &exp.config).map_err(|e| match e {
            fedsel::error::Error::RunExists { .. } => anyhow::anyhow!(
                "{e}; pass --overwrite to replace it, or --resume {} to continue it",
                out.display()
            ),
            e => e.into(),
        })?,
    };
    let bar = std::io::stdout().is_terminal().then(|| {
        let b = ProgressBar::new(config.rounds as u64);
        b.set_style(
            ProgressStyle::with_template("{bar:40} {pos}/{len} [{elapsed_precise}<{eta}] {msg}")
                .expect("valid template"),
        );
        b
    });
    let mut progress = Progress {
        writer,
        bar,
        rounds: config.rounds,
        best: 0.0,
        stop,
    };
    let result = match checkpoint {
        Some(cp) => engine::resume(&exp, &mut progress, cp),
        None => engine::run(&exp, &mut progress),
    };
    if let Some(b) = &progress.bar {
        b.finish_and_clear();
    }
    let summary = match result {
        Ok(s) => s,
        Err(e) => {
            let done = std::fs::read_to_string(out.join("metrics.csv"))
                .map_or(0, |m| m.lines().count().saturating_sub(1));
            progress.writer.fail(&e, done)?;
            if let (fedsel::error::Error::Interrupted { .. }, Some(signal)) =
                (&e, progress.stop.caught())
            {
                let next = if fedsel::checkpoint::load(&out).is_ok() {
                    format!(
                        "`fedsel run --resume {}` continues it from its last checkpoint",
                        out.display()
                    )
                } else {
                    format!(
                        "it has no checkpoint yet (one every {} rounds) to resume from",
                        config.checkpoint_every
                    )
                };
                return Err(Interrupted {
                    signal,
                    message: format!(
                        "{}: {e} to {}; {next}",
                        signals::name(signal),
                        out.display()
                    ),
                }
                .into());
            }
            if done == 0 {
                return Err(e).context(format!(
                    "run failed before its first round finished; {} keeps only the error (a rerun replaces it)",
                    out.display()
                ));
            }
            return Err(e).context(format!(
                "run failed after {done} rounds; finished rounds are in {}",
                out.display()
            ));
        }
    };
    progress.writer.finish(&summary)?;
    let f = |x: Option<f64>| x.map_or("-".into(), |v| format!("{v:.4}"));
    println!(
        "done in {:.1}s ({:.1}s of rounds over every session of the run): final acc {}, best acc {} (round {}), final loss {}, best loss {}",
        t0.elapsed().as_secs_f64(),
        summary.wall_s,
        f(summary.final_acc),
        f(summary.best_acc),
        summary.best_acc_round,
        f(summary.final_loss),
        f(summary.best_loss)
    );
    if let Some(t) = summary.diverged_at {
        println!(
            "  DIVERGED: from round {t} the test loss is over {} times ln C, the loss of predicting every class alike (summary.json: diverged_at); lower the learning rate",
            engine::DIVERGENCE_FACTOR
        );
    }
    for (t, r) in &summary.rounds_to_target {
        println!(
            "  rounds to {:.0}%: {}",
            t * 100.0,
            r.map_or("not reached".into(), |r| r.to_string())
        );
    }
    if let Some(c) = &summary.clock {
        println!(
            "  virtual time: {} ({:.1} s); wasted trainings {}; rounds without updates {}",
            clock_time(c.clock_s),
            c.clock_s,
            c.wasted_trainings,
            c.rounds_without_updates
        );
        for (t, s) in &c.time_to_target_s {
            println!(
                "  virtual time to {:.0}%: {}",
                t * 100.0,
                s.map_or("not reached".into(), |s| format!(
                    "{} ({s:.1} s)",
                    clock_time(s)
                ))
            );
        }
    }
    for (stem, s) in fedsel_workbench::inspect::embeddings(&out)? {
        println!(
            "  {stem}: silhouette of dominant-label groups on normalised embeddings {s:.3} ({stem}_pca.png)"
        );
    }
    if let Some(c) = fedsel_workbench::inspect::entropy(&out)? {
        let ((t0, r0), (t1, r1)) = (c.first, c.last);
        println!(
            "  estimated vs true label entropy, Spearman: {r0:.3} at round {t0} (after warm-up), {r1:.3} at round {t1} (entropy.png), mean {:.3} over rounds {t0}-{t1}",
            c.mean
        );
        if let Some(g) = c.group {
            let ((t0, a0), (t1, a1)) = (g.auc_first, g.auc_last);
            println!(
                "  high-entropy group ({} of {} clients, true entropy > {:.3}): AUC of the estimate {a0:.3} at round {t0}, {a1:.3} at round {t1}, mean {:.3}; mean share of selections {:.3} (of clients {:.3})",
                g.size,
                g.clients,
                g.threshold,
                g.auc_mean,
                g.share_mean,
                g.size as f64 / g.clients as f64
            );
        }
    }
    if let Some(w) = fedsel_workbench::report::f3ast_weight_mean(&out)? {
        println!(
            "  F3AST aggregation weights: Σ_S p_k/r_k averages {w:.4} per round (f3ast_weights.csv)"
        );
    }
    if let Ok(t) = std::fs::read_to_string(out.join("selector_time.csv"))
        && let Some((fit, sel)) = t.lines().nth(1).and_then(|l| l.split_once(','))
    {
        let ms = |v: &str| v.parse::<f64>().unwrap_or(f64::NAN);
        let overhead = (ms(fit) + ms(sel)) / 1e3;
        println!(
            "  selector overhead: GP fits {fit} ms + selection {sel} ms = {:.1}% of the run",
            100.0 * overhead / summary.wall_s
        );
    }
    println!(
        "  cost ledger: {} model broadcasts, {} uploads, {} client trainings, {} client loss reports (held-out evaluations a strategy asked for); the server evaluated the test set {} times; outputs in {}",
        summary.cost.broadcasts,
        summary.cost.uploads,
        summary.cost.trainings + summary.cost.extra_trainings + summary.cost.probe_trainings,
        summary.cost.evaluations,
        config.rounds.div_ceil(config.eval.every),
        out.display()
    );
    Ok(())
}

struct SweepBar(Option<ProgressBar>);

impl fedsel_workbench::sweep::SweepProgress for SweepBar {
    fn cell_done(&self, label: &str, done: usize, total: usize, ok: bool) {
        match &self.0 {
            Some(b) => {
                b.set_position(done as u64);
                b.set_message(label.to_string());
            }
            None => println!(
                "[{done}/{total}] {label} {}",
                if ok { "finished" } else { "FAILED" }
            ),
        }
    }
}

#[allow(clippy::too_many_arguments)]
fn sweep(
    path: PathBuf,
    set: &[String],
    out: PathBuf,
    shard: fedsel_workbench::sweep::Shard,
    jobs: Option<usize>,
    data_dir: Option<PathBuf>,
    dry_run: bool,
    keep_going: bool,
) -> Result<()> {
    let sweep = fedsel_workbench::sweep::Sweep::load(&path, set)
        .with_context(|| format!("sweep {}", path.display()))?;
    if dry_run {
        let cells = sweep.cells()?;
        let mine = shard.part(&cells);
        for c in &mine {
            let done = fedsel_workbench::sweep::is_finished(&out.join("cells").join(&c.dir_name));
            let state = if done { "finished" } else { "to run" };
            println!("{:<40} {state:<10} {}", c.label, c.dir_name);
        }
        println!(
            "{} cells (part {shard} of a grid of {})",
            mine.len(),
            cells.len()
        );
        return Ok(());
    }
    let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
    let jobs = jobs.unwrap_or(cores).max(1);
    let threads = (cores / jobs).max(1);
    let dir = locate::data_dir(data_dir, None);
    let cells = sweep.cells()?;
    let (grid, total) = (cells.len(), shard.part(&cells).len());
    println!(
        "sweep `{}`: {total} cells{}, {jobs} at a time with {threads} thread(s) each -> {}",
        sweep.name,
        if total == grid {
            String::new()
        } else {
            format!(" (part {shard} of a grid of {grid})")
        },
        out.display()
    );
    let bar = std::io::stdout().is_terminal().then(|| {
        let b = ProgressBar::new(total as u64);
        b.set_style(
            ProgressStyle::with_template(
                "{bar:40} {pos}/{len} cells [{elapsed_precise}<{eta}] {msg}",
            )
            .expect("valid template"),
        );
        b
    });
    let t0 = Instant::now();
    let outcome = fedsel_workbench::sweep::run(
        &sweep,
        &out,
        &dir,
        shard,
        jobs,
        threads,
        keep_going,
        &SweepBar(bar.clone()),
    )?;
    if let Some(b) = bar {
        b.finish_and_clear();
    }
    println!(
        "{} cells: {} already finished, {} run now, {} left to another process, {} failed ({:.1}s)",
        outcome.shard_cells,
        outcome.skipped,
        outcome.ran,
        outcome.busy,
        outcome.failed.len(),
        t0.elapsed().as_secs_f64()
    );
    match &outcome.stopped {
        // The error is the same for every failed cell: said once, below.
        Some(_) => {
            let labels: Vec<&str> = outcome.failed.iter().map(|(l, _)| l.as_str()).collect();
            println!("  failed: {}", labels.join(", "));
        }
        None => {
            for (label, err) in &outcome.failed {
                println!("  {label}: {err}");
            }
        }
    }
    // A part of a sharded grid reports only once the whole grid is done (the last part to
    // finish writes it); an unsharded sweep reports what finished, naming what did not.
    if shard == fedsel_workbench::sweep::Shard::ALL || outcome.unfinished.is_empty() {
        fedsel_workbench::report::write(&out, None)?;
        println!("report: {}", out.join("report.md").display());
    } else {
        println!(
            "{} of the grid's {} cells are not finished yet (other parts): `fedsel report {}` once they are; not finished: {}",
            outcome.unfinished.len(),
            outcome.total,
            out.display(),
            outcome.unfinished.join(", ")
        );
    }
    if let Some(err) = &outcome.stopped {
        anyhow::bail!(
            "the sweep stopped: the first two cells it ran failed with the same error, so {} cells were not started (--keep-going runs them): {err}",
            outcome.not_run
        );
    }
    anyhow::ensure!(
        outcome.failed.is_empty(),
        "{} cells failed",
        outcome.failed.len()
    );
    Ok(())
}

fn datasets(data_dir: Option<PathBuf>) {
    let dir = locate::data_dir(data_dir, None);
    println!(
        "data directory: {} (flag > config data_dir > ${} > {})",
        dir.display(),
        locate::ENV_VAR,
        locate::default_dir().display()
    );
    let rows: [(&str, bool, String); 5] = [
        ("synthetic", true, "built in".into()),
        (
            "fmnist",
            fmnist::available(&dir.join(fmnist::DIR)),
            dir.join(fmnist::DIR).display().to_string(),
        ),
        (
            "cifar10",
            cifar::available10(&dir.join(cifar::DIR10)),
            dir.join(cifar::DIR10).display().to_string(),
        ),
        (
            "cifar100",
            cifar::available100(&dir.join(cifar::DIR100)),
            dir.join(cifar::DIR100).display().to_string(),
        ),
        (
            "shakespeare",
            shakespeare::available(&dir.join(shakespeare::DIR)),
            dir.join(shakespeare::DIR)
                .join(shakespeare::FILE)
                .display()
                .to_string(),
        ),
    ];
    for (name, found, where_) in rows {
        println!(
            "{name:<12} {:<9} {where_}",
            if found { "found" } else { "missing" }
        );
    }
    // Not under the data directory: a config names their directory (relative to the
    // config file), so there is nothing here to look for.
    for (name, what) in [
        (
            "leaf",
            "[dataset] kind = \"leaf\", path = \"DIR\" (LEAF's data directory, with train/*.json and test/*.json)",
        ),
        (
            "flgo",
            "[dataset] kind = \"flgo\", path = \"TASK_DIR\" (an FLGo or easyFL task, with data.json; index tasks add source = \"fmnist\" | \"cifar10\" | \"cifar100\", read from the data directory)",
        ),
    ] {
        println!("{name:<12} {:<9} {what}", "by path");
    }
    println!(
        "  (leaf and flgo: docs/experiments.md, \"Federated datasets as researchers have them\")"
    );
}

/// Each strategy's selection time per round at each client count (FMNIST iid, logistic
/// regression, 10 clients a round, 10 rounds after warm-up), a line each as it is
/// measured. A size is skipped, with the reason, where the strategy's N × N matrices
/// would take more than `MATRIX_BYTES`, or, beyond 1,000 clients, where its growth
/// (`Scaling::predict`) from its last size predicts more than [`SKIP_S`] seconds; a
/// super-linear strategy asked for a size beyond 1,000 first is measured at 1,000 for
/// that prediction (not printed).
fn selection_bench(clients: &[usize], strategies: &[String]) -> Result<()> {
    use fedsel::bench::{MATRIX_BYTES, STRATEGIES, SelectionWorkload, scaling, selection_time};
    let names: Vec<&str> = if strategies.is_empty() {
        STRATEGIES.to_vec()
    } else {
        strategies.iter().map(String::as_str).collect()
    };
    if let Some(bad) = names
        .iter()
        .find(|s| !STRATEGIES.contains(s) && fedsel::select::registry::get(s).is_none())
    {
        anyhow::bail!(
            "--strategies: `{bad}` is not one of {}, nor a registered strategy ({})",
            STRATEGIES.join(", "),
            fedsel::select::registry::unknown(bad)
        );
    }
    println!(
        "select: ms per round (select + observe), 10 rounds after warm-up, k = 10; setup = graph / initial phase"
    );
    let workload = |n: usize| SelectionWorkload {
        n,
        k: 10.min(n),
        rounds: 10,
    };
    let measure = |name: &str, n: usize| -> Result<(fedsel::bench::SelectionTime, f64)> {
        let started = std::time::Instant::now();
        let t = selection_time(name, workload(n))?;
        Ok((t, started.elapsed().as_secs_f64()))
    };
    for name in names {
        let scale = scaling(name).expect("every strategy has its scaling");
        // The last measurement's clients, setup seconds and total seconds.
        let mut last: Option<(usize, f64, f64)> = None;
        for &n in clients {
            let bytes = scale.matrix_bytes(n);
            if bytes > MATRIX_BYTES {
                println!(
                    "select {name:<8} N={n:>6}: skipped, {} N x N matrices would take {:.0} GB (O({}) a round)",
                    scale.matrices,
                    bytes / 1e9,
                    scale.round
                );
                continue;
            }
            if n > 1000 {
                if last.is_none() && scale.power > 1 {
                    let (t, total) = measure(name, 1000)?;
                    last = Some((1000, t.setup_s, total));
                }
                if let Some((m, setup, total)) = last {
                    let predicted = scale.predict(m, setup, total, n);
                    if predicted > SKIP_S {
                        println!(
                            "select {name:<8} N={n:>6}: skipped, about {predicted:.0} s predicted from N={m} (O({}) a round)",
                            scale.round
                        );
                        continue;
                    }
                }
            }
            let (t, total) = measure(name, n)?;
            last = Some((n, t.setup_s, total));
            println!(
                "select {name:<8} N={n:>6}: {:>10.3} ms mean, {:>10.3} ms max per round, setup {:.3} s, O({}) a round",
                t.mean_ms, t.max_ms, t.setup_s, scale.round
            );
        }
    }
    Ok(())
}

/// Prints the memory bandwidth that bounds the passes without multiply-adds.
fn print_bandwidth() {
    let memory = fedsel::bench::bandwidth(MEMORY_PROBE_BYTES);
    println!(
        "memory: {:.1} GB/s read, {:.1} GB/s copied (read + written), {} MB buffers, best of 3, {} threads",
        memory.read / 1e9,
        memory.copy / 1e9,
        memory.bytes >> 20,
        rayon::current_num_threads()
    );
}

/// Bytes of each buffer of the bandwidth probe: far past any cache, as the selectors'
/// N × N matrices at thousands of clients are.
const MEMORY_PROBE_BYTES: usize = 256 << 20;

/// Predicted seconds above which `fedsel bench` skips a selection size.
const SKIP_S: f64 = 1800.0;

fn bench(
    rounds: usize,
    data_dir: Option<PathBuf>,
    only: Option<&str>,
    steps_only: bool,
    clients: &[usize],
    strategies: &[String],
) -> Result<()> {
    use fedsel::bench::{random_dataset, side_by_side_step_time, step_time_and_flops};
    let device = burn::tensor::Device::flex();
    let threads = rayon::current_num_threads();
    println!(
        "fedsel {} bench, flex backend, {threads} rayon threads",
        fedsel::VERSION
    );
    let kernels = fedsel::bench::kernels();
    println!("kernels: glue {}, gemm {}", kernels.glue, kernels.gemm);
    let peak = fedsel::bench::peak();
    let peak_flops = peak.per_core * threads as f64;
    println!(
        "peak: {:.0} GFLOP/s = {:.1} GFLOP/s per core (measured: {}-lane f32 FMA chains, best of 5) x {threads} threads{}",
        peak_flops / 1e9,
        peak.per_core / 1e9,
        peak.lanes,
        match (peak.nominal_ghz, peak.fma_per_cycle()) {
            (Some(ghz), Some(per_cycle)) =>
                format!("; {per_cycle:.1} FMAs per cycle of the nominal {ghz:.2} GHz clock"),
            _ => String::new(),
        }
    );
    print_bandwidth();
    let cases = fedsel::bench::seed_steps();
    let cases: Vec<_> = cases
        .into_iter()
        .filter(|c| only.is_none_or(|o| c.0.contains(o)))
        .collect();
    for (name, arch, data, batch) in &cases {
        let (t, flops) = step_time_and_flops(arch.as_ref(), data, *batch, 5, 5, &device);
        let rate = if flops == 0 {
            "burn ops, FLOPs not counted".to_string()
        } else {
            let gflops = flops as f64 / t.as_secs_f64() / 1e9;
            format!(
                "{:.1} MFLOP in products, {gflops:.1} GFLOP/s, {:.0} % of peak",
                flops as f64 / 1e6,
                1e11 * gflops / peak_flops
            )
        };
        println!(
            "step  {name:<18} batch {batch:>3}: {:>8.3} ms  ({rate})",
            t.as_secs_f64() * 1e3
        );
        if flops > 0 && threads > 1 {
            // Runs of at least 20 ms: a shorter one would time the workers' waking.
            let steps = ((0.02 / t.as_secs_f64()).ceil() as usize).clamp(5, 1000);
            let side = side_by_side_step_time(arch.as_ref(), data, *batch, steps, 5, &device);
            let gflops = flops as f64 / side.step.as_secs_f64() / 1e9;
            let of_peak = 1e9 * gflops / peak_flops;
            println!(
                "      side by side, a client to each of the {threads} threads as in a round: {:>8.3} ms a step ({gflops:.1} GFLOP/s, {:.0} % of peak); products {:.0} % of the cores' time, at {:.0} % of peak",
                side.step.as_secs_f64() * 1e3,
                100.0 * of_peak,
                100.0 * side.products_share,
                100.0 * of_peak / side.products_share
            );
        }
    }
    if steps_only {
        return Ok(());
    }
    for (name, arch, data, batch) in cases.iter().filter(|c| c.1.loss_gradient().is_some()) {
        let reference = fedsel::model::AutodiffOnly(arch.as_ref());
        let t =
            fedsel::bench::step_times(&[arch.as_ref(), &reference], data, *batch, 5, 7, &device);
        println!(
            "step  {name} fused vs autodiff, interleaved: {:.3} ms vs {:.3} ms ({:.1}x)",
            t[0].as_secs_f64() * 1e3,
            t[1].as_secs_f64() * 1e3,
            t[1].as_secs_f64() / t[0].as_secs_f64()
        );
        if arch.fused_logits().is_none() {
            continue;
        }
        // The char-LSTM's test set is evaluated in the Shakespeare configs' batches of 500.
        let (test, eval_batch) = match &data.inputs {
            fedsel::data::Inputs::Dense { shape, .. } => {
                (random_dataset(shape, None, 10_000, 10), 1000)
            }
            fedsel::data::Inputs::Tokens { len, .. } => {
                (random_dataset(&[], Some(*len), 10_000, data.classes), 500)
            }
        };
        let t =
            fedsel::bench::eval_times(&[arch.as_ref(), &reference], &test, eval_batch, 3, &device);
        println!(
            "eval  {name} 10k examples, batch {eval_batch}, fused vs burn, interleaved: {:.1} ms vs {:.1} ms ({:.1}x)",
            t[0].as_secs_f64() * 1e3,
            t[1].as_secs_f64() * 1e3,
            t[1].as_secs_f64() / t[0].as_secs_f64()
        );
    }
    if only.is_some() {
        return Ok(());
    }
    selection_bench(clients, strategies)?;
    let Some((config, dir)) = fedcor_fmnist(rounds, data_dir)? else {
        return Ok(());
    };
    let parts = fedsel::bench::round_parts(&config, &dir)?;
    println!(
        "round fedcor fmnist 2spc (5 clients x 20 steps x 64 + 10k test eval): {:.1} ms/round over {rounds} rounds",
        parts.round_ms
    );
    println!(
        "      of which, timed alone after the run: training {:.1} ms, test evaluation {:.1} ms (it runs beside the next round's training), the rest {:.1} ms (selection, aggregation, bookkeeping, less the overlap)",
        parts.training_ms,
        parts.evaluation_ms,
        parts.rest_ms()
    );
    print_clock_overhead(&config, &dir)
}

/// The FedCor FMNIST workload of the round timing, or `None` (said) without Fashion-MNIST:
/// the config's training and test evaluation, what `bench/torch_fedcor_round.py` does.
/// The per-client accuracies (`eval.per_client`, on by default since they were added)
/// are left out: 12,000 more forward passes a round, half again the round's arithmetic,
/// that the PyTorch loop does not do.
fn fedcor_fmnist(rounds: usize, data_dir: Option<PathBuf>) -> Result<Option<(Config, PathBuf)>> {
    let path =
        Path::new(env!("CARGO_MANIFEST_DIR")).join("../../configs/fedcor/fmnist_2spc_rand.toml");
    let dir = locate::data_dir(data_dir, None);
    if !fmnist::available(&dir.join(fmnist::DIR)) {
        println!(
            "round fedcor fmnist 2spc: skipped, Fashion-MNIST not found under {}",
            dir.display()
        );
        return Ok(None);
    }
    Ok(Some((
        Config::load(
            Some(&path),
            &[format!("rounds={rounds}"), "eval.per_client=false".into()],
        )?,
        dir,
    )))
}

/// `fedsel bench --clock-only`.
fn clock_bench(rounds: usize, data_dir: Option<PathBuf>) -> Result<()> {
    match fedcor_fmnist(rounds, data_dir)? {
        Some((config, dir)) => print_clock_overhead(&config, &dir),
        None => Ok(()),
    }
}

/// The clock's cost on the FedCor FMNIST workload: median ms per round with and without
/// log-normal devices, 7 runs of each, alternating (issue 30: at most 2 %).
fn print_clock_overhead(config: &Config, dir: &Path) -> Result<()> {
    let reps = 7;
    let t = fedsel::bench::clock_overhead(config, dir, reps)?;
    println!(
        "clock fedcor fmnist 2spc, median ms/round of {reps} x {} rounds: no clock {:.2}, lognormal wait_all {:.2} ({:+.2} %; paired runs {:+.2} %)",
        config.rounds,
        t.plain_ms,
        t.wait_all_ms,
        (t.wait_all_ms / t.plain_ms - 1.0) * 100.0,
        (t.paired_ratio - 1.0) * 100.0
    );
    let (k, more) = t.trained;
    println!(
        "clock lognormal overcommit 0.3: {:.2} ms/round training {more} clients instead of {k} ({:.2} vs {:.2} ms per trained client)",
        t.overcommit_ms,
        t.overcommit_ms / more as f64,
        t.plain_ms / k as f64
    );
    Ok(())
}

/// Sends the core's warnings to stderr, as plain text unless stderr is a terminal (a log
/// file or a notebook's captured stderr gets no colour codes), filtered by `RUST_LOG`
/// (default: warnings). An embedding program's subscriber, installed first, stays.
pub fn init_logging() {
    let _ = tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env().unwrap_or_else(|_| "warn".into()),
        )
        .with_writer(std::io::stderr)
        .with_ansi(std::io::stderr().is_terminal())
        .try_init();
}

/// Runs the command line on `args`, the program's name first (as
/// [`std::env::args_os`] gives them), and returns the process's exit status: 0 on
/// success, 1 for an error (printed to stderr), 2 for bad arguments, 128 + the signal's
/// number for a run that SIGINT or SIGTERM stopped. It never exits the process itself
/// (a second signal during a run does), so an embedding program such as the Python
/// package's `fedsel` script gets the status back.
pub fn main_with_args<I, T>(args: I) -> u8
where
    I: IntoIterator<Item = T>,
    T: Into<OsString> + Clone,
{
    init_logging();
    let status = match Cli::try_parse_from(args) {
        Err(e) => {
            let _ = e.print();
            u8::try_from(e.exit_code()).unwrap_or(2)
        }
        Ok(cli) => match dispatch(cli) {
            Ok(()) => 0,
            Err(e) => match e.downcast_ref::<Interrupted>() {
                Some(i) => {
                    eprintln!("{i}");
                    u8::try_from(128 + i.signal).unwrap_or(1)
                }
                None => {
                    eprintln!("Error: {e:?}");
                    1
                }
            },
        },
    };
    // Nothing flushes Rust's stdout at exit when Python is the program.
    let _ = std::io::stdout().flush();
    status
}

#[derive(Subcommand)]
enum ResultsAction {
    /// Add one row per finished cell of a sweep (its seed's value of --metric) to
    /// RESULTS/SECTION.csv.
    Collect {
        /// The sweep's output directory.
        dir: PathBuf,
        /// The page's section the rows belong to (the CSV's and the block's name).
        #[arg(long)]
        section: String,
        /// The paper's table the cells are from.
        #[arg(long)]
        table: String,
        /// rounds_to_target, time_to_target_s, final_acc, final_loss, best_acc or best_loss;
        /// or edge_f1, edge_precision, edge_recall or edge_f1_offdiag (FedGS Table 3, from
        /// fedgs_graph.csv).
        #[arg(long)]
        metric: String,
        /// For rounds_to_target and time_to_target_s: the target, when the runs have several.
        #[arg(long)]
        target: Option<f64>,
        /// The commit the sweep ran at: by default the one its runs record (the build's);
        /// given, it must agree with them. Needed only for runs from before fedsel recorded
        /// it.
        #[arg(long)]
        commit: Option<String>,
        /// The command that ran the sweep.
        #[arg(long)]
        command: String,
        /// A method added after the comparison was planned: its rows explain and are never
        /// counted (repeatable).
        #[arg(long, value_name = "METHOD")]
        unplanned: Vec<String>,
        /// The results directory.
        #[arg(long, default_value = "results")]
        results: PathBuf,
    },
    /// Rewrite the page's generated blocks from the results directory, the claims block
    /// from its claims/*.toml included (appending a block for each section the page lacks).
    Render {
        /// The results directory.
        #[arg(long, default_value = "results")]
        results: PathBuf,
        /// The page.
        #[arg(long, default_value = "docs/results.md")]
        doc: PathBuf,
    },
    /// Fail when the page's blocks (the claims block included) no longer match the results
    /// directory, or a section's code paths changed after the commit that ran it without a
    /// note; name each claim written after its runs (post hoc), from the git history.
    Check {
        /// The results directory.
        #[arg(long, default_value = "results")]
        results: PathBuf,
        /// The page.
        #[arg(long, default_value = "docs/results.md")]
        doc: PathBuf,
    },
}

fn results(action: ResultsAction) -> Result<()> {
    use fedsel_workbench::results;
    match action {
        ResultsAction::Collect {
            dir,
            section,
            table,
            metric,
            target,
            commit,
            command,
            unplanned,
            results: out,
        } => {
            let args = results::CollectArgs {
                section,
                table,
                metric,
                target,
                command,
                commit,
                unplanned,
            };
            let c = results::collect(&dir, &out, &args)?;
            println!("{} rows added to {}", c.added, c.file.display());
            if !c.unfinished.is_empty() {
                eprintln!("left out, not finished: {}", c.unfinished.join(", "));
            }
            Ok(())
        }
        ResultsAction::Render { results: dir, doc } => {
            let r = results::render_doc(&dir, &doc)?;
            if let Some(why) = &r.claims_kept {
                eprintln!("the claims block was left as it was: {why}");
            }
            println!(
                "{}: {} blocks rewritten{}",
                doc.display(),
                r.updated.len(),
                if r.appended.is_empty() {
                    String::new()
                } else {
                    format!(", appended at the end: {}", r.appended.join(", "))
                }
            );
            Ok(())
        }
        ResultsAction::Check { results: dir, doc } => {
            let checked = results::check(&dir, &doc)?;
            for n in &checked.notes {
                println!("note: {n}");
            }
            let problems = checked.problems;
            if problems.is_empty() {
                println!("{} matches {}", doc.display(), dir.display());
                return Ok(());
            }
            for p in &problems {
                eprintln!("{p}");
            }
            anyhow::bail!("{} results problems", problems.len())
        }
    }
}

fn dispatch(cli: Cli) -> Result<()> {
    match cli.command {
        None => run(RunArgs::default()),
        Some(Command::Run(args)) => run(args),
        Some(Command::Sweep {
            sweep: path,
            out,
            jobs,
            data_dir,
            dry_run,
            mut set,
            rounds,
            shard,
            keep_going,
            tensorboard,
        }) => {
            set.extend(rounds.map(|r| format!("rounds={r}")));
            set.extend(tensorboard.map(|dir| {
                let dir = toml::Value::String(dir.to_string_lossy().into_owned());
                format!("output.tensorboard={dir}")
            }));
            let shard = shard.unwrap_or(fedsel_workbench::sweep::Shard::ALL);
            sweep(path, &set, out, shard, jobs, data_dir, dry_run, keep_going)
        }
        Some(Command::Report {
            dirs,
            out,
            format,
            smooth,
            allow_mixed,
        }) => {
            let (file, text) = fedsel_workbench::report::report(
                &dirs,
                out.as_deref(),
                smooth,
                format,
                allow_mixed,
            )
            .map_err(|e| match e {
                fedsel_workbench::error::Error::MixedTasks { .. } => {
                    anyhow::anyhow!("{e}; pass --allow-mixed to compare them anyway")
                }
                e => e.into(),
            })?;
            print!("{text}");
            eprintln!("report: {}", file.display());
            Ok(())
        }
        Some(Command::Results { action }) => results(action),
        Some(Command::Datasets { data_dir }) => {
            datasets(data_dir);
            Ok(())
        }
        Some(Command::Bench {
            selection_only: true,
            clients,
            strategies,
            ..
        }) => {
            print_bandwidth();
            selection_bench(&clients, &strategies)
        }
        Some(Command::Bench {
            clock_only: true,
            rounds,
            data_dir,
            ..
        }) => clock_bench(rounds, data_dir),
        Some(Command::Bench {
            rounds,
            data_dir,
            only,
            steps_only,
            clients,
            strategies,
            ..
        }) => bench(
            rounds,
            data_dir,
            only.as_deref(),
            steps_only,
            &clients,
            &strategies,
        ),
    }
}

/// Virtual seconds as hours, minutes and seconds (`2h 05m 07s`, `3m 20s`, `12.5s`); below
/// 0.1 s and above a year in seconds with six significant digits (`4.20000e-7s`,
/// `3.15600e8s (10.0 years)`), where hours would print 0.0 or a count no one reads.
fn clock_time(s: f64) -> String {
    const YEAR_S: f64 = 365.25 * 86_400.0;
    if !s.is_finite() || s < 0.1 {
        return format!("{}s", fedsel::system::clock::show_s(s));
    }
    if s >= YEAR_S {
        return format!(
            "{}s ({} years)",
            fedsel::system::clock::show_s(s),
            fedsel::system::clock::show_s(s / YEAR_S)
        );
    }
    if s < 60.0 {
        return format!("{s:.1}s");
    }
    let whole = s.round() as u64;
    let (h, m, sec) = (whole / 3600, whole / 60 % 60, whole % 60);
    if h > 0 {
        format!("{h}h {m:02}m {sec:02}s")
    } else {
        format!("{m}m {sec:02}s")
    }
}

#[cfg(test)]
mod tests {
    use super::clock_time;

    #[test]
    fn console_times_neither_vanish_nor_saturate() {
        assert_eq!(clock_time(4.2e-7), "4.20000e-7s");
        assert_eq!(clock_time(12.54), "12.5s");
        assert_eq!(clock_time(200.0), "3m 20s");
        assert_eq!(clock_time(7507.0), "2h 05m 07s");
        assert_eq!(
            clock_time(1.844_674_407_370_955_2e19),
            "1.84467e19s (5.84542e11 years)"
        );
    }
}
