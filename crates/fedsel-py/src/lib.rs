//! Python bindings of fedsel: the `fedsel._fedsel` extension module.
//!
//! The Python package (`python/fedsel`) adapts these functions to Python's idioms (result
//! objects, NumPy arrays, keyword arguments); everything that decides what a run does stays
//! in the `fedsel` crate, so a run from Python and one from the CLI are the same run.

mod convert;
mod selector;
mod user;

use std::path::{Path, PathBuf};

use indicatif::{ProgressBar, ProgressStyle};
use pyo3::create_exception;
use pyo3::exceptions::PyException;
use pyo3::prelude::*;
use pyo3::types::PyDict;

use fedsel::config::Config;
use fedsel::data::locate;
use fedsel::engine::{self, Experiment, Observer, RoundRecord};
use fedsel::error::Error;
use fedsel::output::RunWriter;

create_exception!(
    _fedsel,
    FedselError,
    PyException,
    "A fedsel error: a bad config, missing data, a failed run. The message is the CLI's."
);

/// A fedsel error as the Python exception, with the CLI's message.
pub(crate) fn py_err(e: impl std::fmt::Display) -> PyErr {
    FedselError::new_err(e.to_string())
}

/// Reads a config the way the CLI does; exactly one of `path`, `text`, `table` may be given,
/// none meaning the built-in default. A dict is laid over the default like a TOML file.
fn load_config(
    path: Option<PathBuf>,
    text: Option<String>,
    table: Option<&Bound<'_, PyDict>>,
    overrides: &[String],
) -> PyResult<Config> {
    let config = match (path, text, table) {
        (Some(p), None, None) => Config::load(Some(&p), overrides),
        (None, Some(t), None) => Config::from_toml_str(&t, "config string", overrides),
        (None, None, Some(d)) => {
            Config::from_table(convert::table(d, "")?, "config dict", overrides)
        }
        (None, None, None) => Config::load(None, overrides),
        _ => return Err(py_err("give one of a config path, TOML text or dict")),
    };
    config.map_err(py_err)
}

/// How a run shows its progress; the Python side decides from `progress=` and whether
/// stderr is a terminal.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Display {
    /// Nothing (a notebook's or a service's logs stay clean).
    Off,
    /// An indicatif bar on the terminal.
    Bar,
    /// A line through Python's `sys.stderr` every tenth of the run (a notebook that asked).
    Lines,
}

impl Display {
    fn parse(s: &str) -> PyResult<Self> {
        match s {
            "off" => Ok(Self::Off),
            "bar" => Ok(Self::Bar),
            "lines" => Ok(Self::Lines),
            other => Err(py_err(format!(
                "progress display `{other}`: use off, bar or lines"
            ))),
        }
    }
}

/// Writes the run's files, shows progress, and between rounds lets Python handle its
/// signals: a pending Ctrl-C stops the run after the round just written.
struct PyObserver {
    writer: RunWriter,
    bar: Option<ProgressBar>,
    display: Display,
    rounds: usize,
    /// The Python exception that stopped the run: KeyboardInterrupt, or one `on_round` raised.
    interrupt: Option<PyErr>,
    /// `fedsel.run(on_round=...)`: called with each round's metrics as a dict.
    on_round: Option<Py<PyAny>>,
}

/// The `metrics.csv` columns that hold fractions; the others are counts, given to Python
/// as ints.
fn is_float_column(name: &str) -> bool {
    matches!(
        name,
        "test_acc" | "test_loss" | "train_loss" | "lr" | "elapsed_s" | "round_s" | "clock_s"
    ) || name.starts_with("client_acc_")
}

/// A round's metrics as `metrics.csv` has them: column -> value, `None` for an empty cell.
fn round_dict<'py>(py: Python<'py>, r: &RoundRecord) -> PyResult<Bound<'py, PyDict>> {
    let d = PyDict::new(py);
    for (name, v) in fedsel::output::metric_values(r) {
        match v {
            None => d.set_item(name, py.None())?,
            Some(v) if is_float_column(name) => d.set_item(name, v)?,
            Some(v) => d.set_item(name, v as u64)?,
        }
    }
    Ok(d)
}

impl Observer for PyObserver {
    fn on_round(&mut self, r: &RoundRecord) -> fedsel::error::Result<()> {
        self.writer.on_round(r)?;
        let acc = r.test_acc.map_or("-".into(), |a| format!("{a:.4}"));
        if let Some(bar) = &self.bar {
            bar.set_position(r.round as u64 + 1);
            bar.set_message(format!("acc {acc}"));
        }
        let every = (self.rounds / 10).max(1);
        let line = (self.display == Display::Lines
            && ((r.round + 1).is_multiple_of(every) || r.round + 1 == self.rounds))
            .then(|| {
                format!(
                    "round {} ({}/{} done) acc {acc}\n",
                    r.round,
                    r.round + 1,
                    self.rounds
                )
            });
        let signal = Python::attach(|py| {
            if let Some(line) = line {
                // Progress is best effort: a closed stderr must not fail the run.
                let _ = py
                    .import("sys")
                    .and_then(|sys| sys.getattr("stderr"))
                    .and_then(|err| err.call_method1("write", (line,)));
            }
            py.check_signals()?;
            match &self.on_round {
                Some(cb) => cb.call1(py, (round_dict(py, r)?,)).map(drop),
                None => Ok(()),
            }
        });
        match signal {
            Ok(()) => Ok(()),
            Err(e) => {
                self.interrupt = Some(e);
                Err(Error::Interrupted { round: r.round })
            }
        }
    }

    fn on_checkpoint(&mut self, cp: &fedsel::checkpoint::Checkpoint) -> fedsel::error::Result<()> {
        self.writer.on_checkpoint(cp)
    }

    fn on_reports(&mut self, files: &[(String, String)]) -> fedsel::error::Result<()> {
        self.writer.on_reports(files)
    }
}

/// Why a run stopped early.
enum Failure {
    /// A fedsel error, with the CLI's message.
    Fedsel(String),
    /// A Python exception raised between rounds (KeyboardInterrupt).
    Python(PyErr),
}

/// Where `resume=True` starts a run.
enum Start {
    /// From round 0: the output directory holds no run.
    Fresh,
    /// Nowhere: the run there is finished.
    Finished,
    /// From the checkpoint of the unfinished run there.
    Checkpoint(Box<fedsel::checkpoint::Checkpoint>),
}

/// What `resume=True` does with the run in `out`, refusing one of another config.
fn resume_point(out: &Path, config: &Config) -> PyResult<Start> {
    let empty = std::fs::read_dir(out).map_or(true, |mut entries| entries.next().is_none());
    if empty || fedsel::output::failed_before_round_one(out) {
        return Ok(Start::Fresh);
    }
    let theirs = Config::load(Some(&out.join("config.resolved.toml")), &[]).map_err(py_err)?;
    if theirs.hash() != config.hash() {
        return Err(py_err(format!(
            "{}: holds a run of another config than this one; pass overwrite=True to replace it, or another out",
            out.display()
        )));
    }
    let finished = std::fs::read_to_string(out.join("summary.json"))
        .ok()
        .and_then(|s| serde_json::from_str::<serde_json::Value>(&s).ok())
        .is_some_and(|v| v["status"] == "finished");
    if finished {
        return Ok(Start::Finished);
    }
    let cp = fedsel::checkpoint::load(out)
        .map_err(|e| py_err(format!("{e}; pass overwrite=True to start the run over")))?;
    engine::check_resumable(config, &cp).map_err(py_err)?;
    Ok(Start::Checkpoint(Box::new(cp)))
}

/// Runs one experiment as `fedsel run` does and returns its output directory and the
/// config's warnings. The GIL is released while Rust runs.
#[pyfunction]
#[pyo3(signature = (*, path=None, text=None, table=None, overrides=Vec::new(), out=None, data_dir=None, progress="off", overwrite=false, resume=false, on_round=None, selector=None))]
#[allow(clippy::too_many_arguments)]
fn run(
    py: Python<'_>,
    path: Option<PathBuf>,
    text: Option<String>,
    table: Option<&Bound<'_, PyDict>>,
    overrides: Vec<String>,
    out: Option<PathBuf>,
    data_dir: Option<PathBuf>,
    progress: &str,
    overwrite: bool,
    resume: bool,
    on_round: Option<Py<PyAny>>,
    selector: Option<Py<PyAny>>,
) -> PyResult<(PathBuf, Vec<String>)> {
    let display = Display::parse(progress)?;
    if overwrite && resume {
        return Err(py_err(
            "overwrite=True replaces the run that resume=True would continue: pass one of them",
        ));
    }
    let config = load_config(path, text, table, &overrides)?;
    // The CLI's default directory: a short hash of the resolved config keeps runs that
    // differ only by overrides apart.
    let out = out.unwrap_or_else(|| {
        PathBuf::from("runs").join(format!(
            "{}-s{}-{}",
            config.name,
            config.seed,
            &config.hash()[..8]
        ))
    });
    if overwrite && out.exists() {
        std::fs::remove_dir_all(&out)
            .map_err(|e| py_err(format!("clearing {} for overwrite: {e}", out.display())))?;
    }
    let start = if resume {
        resume_point(&out, &config)?
    } else {
        Start::Fresh
    };
    if let Start::Finished = start {
        return Ok((out, Vec::new()));
    }
    let dir = locate::data_dir(data_dir, config.data_dir.clone());
    let result = py.detach(|| -> Result<Vec<String>, Failure> {
        let exp = Experiment::prepare(config.clone(), &dir)
            .map_err(|e| Failure::Fedsel(format!("preparing `{}`: {e}", config.name)))?;
        let warnings = config
            .warnings(exp.clients.len())
            .iter()
            .map(ToString::to_string)
            .collect();
        // A selector object given by the caller, else the one the config names.
        let build = || -> fedsel::error::Result<Box<dyn fedsel::select::Selector>> {
            match &selector {
                Some(obj) => Python::attach(|py| user::UserSelector::from_object(obj.bind(py)))
                    .map(|s| Box::new(s) as Box<dyn fedsel::select::Selector>)
                    .map_err(Error::from),
                None => fedsel::select::build(&config.selection).map_err(Error::from),
            }
        };
        let writer = match &start {
            Start::Checkpoint(cp) => build()
                .and_then(|s| engine::check_resume_with(&exp, s, cp))
                .and_then(|()| RunWriter::resume(&out, cp.next_round))
                .and_then(|w| w.with_trackers(&exp.config)),
            _ => RunWriter::create(&out, &exp.config),
        }
        .map_err(|e| match e {
            Error::RunExists { .. } => Failure::Fedsel(format!(
                "{e}; pass overwrite=True to replace it, or resume=True to continue it"
            )),
            e => Failure::Fedsel(e.to_string()),
        })?;
        let bar = (display == Display::Bar).then(|| {
            let b = ProgressBar::new(config.rounds as u64);
            b.set_style(
                ProgressStyle::with_template(
                    "{bar:40} {pos}/{len} [{elapsed_precise}<{eta}] {msg}",
                )
                .expect("valid template"),
            );
            b
        });
        let mut observer = PyObserver {
            writer,
            bar,
            display,
            rounds: config.rounds,
            interrupt: None,
            on_round,
        };
        let result = build().and_then(|s| match start {
            Start::Checkpoint(cp) => engine::run_with(&exp, s, &mut observer, Some(*cp)),
            _ => engine::run_with(&exp, s, &mut observer, None),
        });
        if let Some(b) = &observer.bar {
            b.finish_and_clear();
        }
        match result {
            Ok(summary) => {
                observer
                    .writer
                    .finish(&summary)
                    .map_err(|e| Failure::Fedsel(e.to_string()))?;
                Ok(warnings)
            }
            Err(e) => {
                let done = std::fs::read_to_string(out.join("metrics.csv"))
                    .map_or(0, |m| m.lines().count().saturating_sub(1));
                observer
                    .writer
                    .fail(&e, done)
                    .map_err(|e| Failure::Fedsel(e.to_string()))?;
                Err(match observer.interrupt.take() {
                    Some(interrupt) => Failure::Python(interrupt),
                    None => Failure::Fedsel(format!(
                        "run failed after {done} rounds; finished rounds are in {}: {e}",
                        out.display()
                    )),
                })
            }
        }
    });
    match result {
        Ok(warnings) => Ok((out, warnings)),
        Err(Failure::Fedsel(message)) => Err(py_err(message)),
        Err(Failure::Python(e)) => Err(e),
    }
}

/// A sweep's progress: the bar's position, or nothing.
struct SweepBar(Option<ProgressBar>);

impl fedsel_workbench::sweep::SweepProgress for SweepBar {
    fn cell_done(&self, label: &str, done: usize, _total: usize, _ok: bool) {
        if let Some(b) = &self.0 {
            b.set_position(done as u64);
            b.set_message(label.to_string());
        }
    }
}

/// A sweep's outcome: cells, already finished, run now, failed as (label, error), the
/// error that stopped it early and the cells it did not start then.
type SweepCounts = (
    usize,
    usize,
    usize,
    Vec<(String, String)>,
    Option<String>,
    usize,
);

/// Runs every unfinished cell of a sweep file and writes its report, as `fedsel sweep`
/// does, and returns its outcome.
#[pyfunction]
#[pyo3(signature = (path, out, *, jobs=None, data_dir=None, overrides=Vec::new(), progress=false, keep_going=false))]
#[allow(clippy::too_many_arguments)]
fn sweep(
    py: Python<'_>,
    path: PathBuf,
    out: PathBuf,
    jobs: Option<usize>,
    data_dir: Option<PathBuf>,
    overrides: Vec<String>,
    progress: bool,
    keep_going: bool,
) -> PyResult<SweepCounts> {
    let sweep = fedsel_workbench::sweep::Sweep::load(&path, &overrides)
        .map_err(|e| py_err(format!("sweep {}: {e}", path.display())))?;
    let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
    let jobs = jobs.unwrap_or(cores).max(1);
    let threads = (cores / jobs).max(1);
    let dir = locate::data_dir(data_dir, None);
    py.detach(|| {
        let total = sweep.cells()?.len();
        let bar = SweepBar(progress.then(|| ProgressBar::new(total as u64)));
        let outcome = fedsel_workbench::sweep::run(
            &sweep,
            &out,
            &dir,
            fedsel_workbench::sweep::Shard::ALL,
            jobs,
            threads,
            keep_going,
            &bar,
        )?;
        if let Some(b) = &bar.0 {
            b.finish_and_clear();
        }
        fedsel_workbench::report::write(&out, None)?;
        Ok::<_, Error>((
            outcome.total,
            outcome.skipped,
            outcome.ran,
            outcome.failed,
            outcome.stopped,
            outcome.not_run,
        ))
    })
    .map_err(py_err)
}

/// Resolves a sweep's grid and writes its index under `out`, for an executor that runs the
/// cells itself (Ray); returns each cell's (label, directory name) in grid order.
#[pyfunction]
#[pyo3(signature = (path, out, *, overrides=Vec::new()))]
fn sweep_prepare(
    py: Python<'_>,
    path: PathBuf,
    out: PathBuf,
    overrides: Vec<String>,
) -> PyResult<Vec<(String, String)>> {
    let sweep = fedsel_workbench::sweep::Sweep::load(&path, &overrides)
        .map_err(|e| py_err(format!("sweep {}: {e}", path.display())))?;
    py.detach(|| fedsel_workbench::sweep::prepare(&sweep, &out))
        .map(|cells| cells.into_iter().map(|c| (c.label, c.dir_name)).collect())
        .map_err(py_err)
}

/// Runs the one cell of a prepared sweep whose directory is `dir_name`, on `threads`
/// threads, under the cell's own lock; returns "ran", "finished" (it already was) or
/// "busy" (another live process is running it). The sweep file, `out` and the data must be
/// at the same paths wherever this runs (a shared file system, for Ray on many machines).
#[pyfunction]
#[pyo3(signature = (path, out, dir_name, *, overrides=Vec::new(), data_dir=None, threads=1))]
fn sweep_cell(
    py: Python<'_>,
    path: PathBuf,
    out: PathBuf,
    dir_name: String,
    overrides: Vec<String>,
    data_dir: Option<PathBuf>,
    threads: usize,
) -> PyResult<&'static str> {
    use fedsel_workbench::sweep::CellRun;
    let sweep = fedsel_workbench::sweep::Sweep::load(&path, &overrides)
        .map_err(|e| py_err(format!("sweep {}: {e}", path.display())))?;
    let dir = locate::data_dir(data_dir, None);
    py.detach(|| {
        let cells = sweep.cells()?;
        let cell = cells
            .iter()
            .find(|c| c.dir_name == dir_name)
            .ok_or_else(|| {
                fedsel::error::ConfigError::invalid(
                    "dir_name",
                    format!("`{dir_name}` is no cell of sweep {}", path.display()),
                )
            })?;
        let pool = rayon::ThreadPoolBuilder::new()
            .num_threads(threads.max(1))
            .build()
            .expect("a thread pool");
        pool.install(|| fedsel_workbench::sweep::run_cell(cell, &out, &dir))
    })
    .map(|r| match r {
        CellRun::Ran => "ran",
        CellRun::AlreadyFinished => "finished",
        CellRun::Busy => "busy",
    })
    .map_err(py_err)
}

/// Writes `report.md` and the table CSVs for a sweep directory and returns the report's
/// text, as `fedsel report` does.
#[pyfunction]
#[pyo3(signature = (dir, *, smooth=None))]
fn report(py: Python<'_>, dir: PathBuf, smooth: Option<usize>) -> PyResult<String> {
    py.detach(|| fedsel_workbench::report::write(&dir, smooth))
        .map_err(py_err)
}

/// One client's (train, held-out) example indices.
type ClientSplit = (Vec<usize>, Vec<usize>);

/// Each client's (train, held-out) example indices as fedsel partitions the config's
/// dataset, so that a Flower ClientApp trains on the clients a fedsel run would.
#[pyfunction]
#[pyo3(signature = (*, path=None, text=None, table=None, overrides=Vec::new(), data_dir=None))]
fn partition(
    py: Python<'_>,
    path: Option<PathBuf>,
    text: Option<String>,
    table: Option<&Bound<'_, PyDict>>,
    overrides: Vec<String>,
    data_dir: Option<PathBuf>,
) -> PyResult<Vec<ClientSplit>> {
    let config = load_config(path, text, table, &overrides)?;
    let dir = locate::data_dir(data_dir, config.data_dir.clone());
    py.detach(|| {
        let data = fedsel::data::load(&config, &dir)?;
        let clients = fedsel::partition::build(&config.partition, &data, config.data_seed())?;
        Ok::<_, Error>(clients.into_iter().map(|c| (c.train, c.holdout)).collect())
    })
    .map_err(py_err)
}

/// `py:module:Class` for a selector object's class: how `fedsel.run(selector=...)` names
/// its run in the config.
#[pyfunction]
fn class_path(selector: &Bound<'_, PyAny>) -> PyResult<String> {
    user::class_path(selector)
}

/// Runs the `fedsel` command line on `argv` (the program's name first) and returns its
/// exit status: the package's `fedsel` script, so that `pip install` puts the same CLI on
/// the PATH as `cargo install`. The GIL is released while it runs. During `fedsel run`
/// SIGINT and SIGTERM are the CLI's (the run stops after its round, status 130 or 143).
#[pyfunction]
fn cli(py: Python<'_>, argv: Vec<std::ffi::OsString>) -> u8 {
    py.detach(|| fedsel_cli::main_with_args(argv))
}

#[pymodule]
fn _fedsel(m: &Bound<'_, PyModule>) -> PyResult<()> {
    // The CLI's logging: warnings (RUST_LOG filters), colour codes only on a terminal.
    fedsel_cli::init_logging();
    m.add("FedselError", m.py().get_type::<FedselError>())?;
    m.add("VERSION", fedsel::VERSION)?;
    m.add_function(wrap_pyfunction!(run, m)?)?;
    m.add_function(wrap_pyfunction!(sweep, m)?)?;
    m.add_function(wrap_pyfunction!(sweep_prepare, m)?)?;
    m.add_function(wrap_pyfunction!(sweep_cell, m)?)?;
    m.add_function(wrap_pyfunction!(report, m)?)?;
    m.add_function(wrap_pyfunction!(partition, m)?)?;
    m.add_function(wrap_pyfunction!(cli, m)?)?;
    selector::register(m)?;
    user::register();
    m.add_class::<user::Stream>()?;
    m.add_class::<user::Query>()?;
    m.add_function(wrap_pyfunction!(class_path, m)?)?;
    Ok(())
}
