//! `fedsel.Selector`: a core selector driven from Python, without the simulator.
//!
//! The caller plays the engine's part: it says who is available, answers the selector's
//! requests through a Python object (the query), trains the chosen clients itself and
//! reports back. The selector is the core's own (`fedsel::select::build`), behind the same
//! availability guard the engine puts in front of every query, so it behaves here as it
//! does in a fedsel run.

use std::sync::Mutex;

use pyo3::prelude::*;
use pyo3::types::{PyDict, PyTuple};

use fedsel::config::Config;
use fedsel::engine::AvailableOnly;
use fedsel::error::Error;
use fedsel::rng::{Purpose, stream};
use fedsel::select::{
    self, ClientQuery, Feedback, GradientScope, Needs, RoundContext, Selector, Setup, UpdateKind,
};

use crate::{FedselError, convert, py_err};

/// The config table a strategy's own options live in (`[selection.<table>]`); strategies
/// without options have none.
fn options_table(strategy: &str) -> Option<&'static str> {
    match strategy {
        "powd" | "cpowd" | "rpowd" => Some("powd"),
        "fedcor" | "fedgp" => Some("fedcor"),
        "afl" => Some("afl"),
        "fedgs" => Some("fedgs"),
        "f3ast" => Some("f3ast"),
        "hics" => Some("hics"),
        "divfl" => Some("divfl"),
        _ => None,
    }
}

/// What the selector learned and what the caller must report back; behind a mutex because
/// Python may share the object between threads, while a selector is `Send` only.
struct State {
    inner: Box<dyn Selector>,
    /// The initial phase (FedGS's graph) ran, or a loaded state made it unnecessary.
    initialised: bool,
    /// The round of the last `select`, which `observe` reports on.
    last_round: Option<usize>,
    /// The last selection's aggregation weights, when the strategy gives its own (F3AST).
    weights: Option<Vec<f64>>,
}

/// A fedsel selection strategy, used without the simulator.
///
/// `Selector(strategy, sizes=[n_0, ...], per_round=m, rounds=T, seed=0, **options)`.
/// `options` are the strategy's config keys (`[selection.<strategy>]` in a fedsel config),
/// e.g. `Selector("powd", ..., d=10)`. `classes` is the output layer's width, needed by
/// strategies that read output-layer updates (HiCS-FL). `oracle_features` and
/// `oracle_label_histograms` are only for strategies defined with oracle knowledge (FedGS's
/// oracle graph).
#[pyclass(name = "Selector", module = "fedsel")]
pub struct PySelector {
    state: Mutex<State>,
    name: &'static str,
    clients: usize,
    seed: u64,
    needs: Needs,
    aggregation: &'static str,
}

impl PySelector {
    fn lock(&self) -> PyResult<std::sync::MutexGuard<'_, State>> {
        self.state.try_lock().map_err(|_| {
            py_err("the selector is in use (a query method called back into it, or another thread)")
        })
    }
}

#[pymethods]
impl PySelector {
    #[new]
    #[pyo3(signature = (strategy, *, sizes, per_round, rounds, seed=0, classes=0, oracle_features=None, oracle_label_histograms=None, **options))]
    #[allow(clippy::too_many_arguments)]
    fn new(
        strategy: &str,
        sizes: Vec<usize>,
        per_round: usize,
        rounds: usize,
        seed: u64,
        classes: usize,
        oracle_features: Option<Vec<Vec<f64>>>,
        oracle_label_histograms: Option<Vec<Vec<usize>>>,
        options: Option<&Bound<'_, PyDict>>,
    ) -> PyResult<Self> {
        let mut selection = toml::Table::new();
        selection.insert("strategy".into(), strategy.into());
        selection.insert("clients_per_round".into(), (per_round as i64).into());
        if let Some(opts) = options.filter(|o| !o.is_empty()) {
            let table = options_table(strategy)
                .ok_or_else(|| py_err(format!("strategy `{strategy}` takes no options")))?;
            selection.insert(
                table.into(),
                convert::table(opts, &format!("selection.{table}"))?.into(),
            );
        }
        let mut root = toml::Table::new();
        root.insert("rounds".into(), (rounds as i64).into());
        root.insert("selection".into(), selection.into());
        let config = Config::from_table(root, "Selector options", &[]).map_err(py_err)?;
        let mut inner = select::build(&config.selection).map_err(py_err)?;
        let needs = inner.needs();
        let n = sizes.len();
        if n == 0 {
            return Err(py_err("`sizes` names no client"));
        }
        if needs.updates == UpdateKind::OutputLayer && classes == 0 {
            return Err(py_err(format!(
                "strategy `{strategy}` reads output-layer updates: give `classes`, the output layer's width"
            )));
        }
        if needs.oracle_features && oracle_features.as_ref().map(Vec::len) != Some(n) {
            return Err(py_err(format!(
                "strategy `{strategy}` as configured needs `oracle_features`, one per client"
            )));
        }
        if needs.oracle_label_histograms
            && oracle_label_histograms.as_ref().map(Vec::len) != Some(n)
        {
            return Err(py_err(format!(
                "strategy `{strategy}` as configured needs `oracle_label_histograms`, one per client"
            )));
        }
        let total: f64 = sizes.iter().sum::<usize>() as f64;
        inner.setup(&Setup {
            weights: sizes.iter().map(|&s| s as f64 / total).collect(),
            sizes,
            per_round: config.selection.per_round(n),
            rounds,
            num_params: 0,
            classes,
            oracle_label_histograms: oracle_label_histograms
                .filter(|_| needs.oracle_label_histograms),
            oracle_features: oracle_features.filter(|_| needs.oracle_features),
        });
        Ok(Self {
            name: inner.name(),
            aggregation: select::own_aggregation(inner.name()).name(),
            state: Mutex::new(State {
                inner,
                initialised: false,
                last_round: None,
                weights: None,
            }),
            clients: n,
            seed,
            needs,
        })
    }

    /// The strategy's name.
    #[getter]
    fn strategy(&self) -> &'static str {
        self.name
    }

    /// The aggregation rule the strategy's paper uses: `mean`, `data_size` or `selector`
    /// (then `weights` holds the last selection's weights).
    #[getter]
    fn aggregation(&self) -> &'static str {
        self.aggregation
    }

    /// Which part of each update `observe` needs: `none`, `full` or `output_layer` (the
    /// output layer's bias, then its weight, flattened).
    #[getter]
    fn updates(&self) -> &'static str {
        match self.needs.updates {
            UpdateKind::None => "none",
            UpdateKind::Full => "full",
            UpdateKind::OutputLayer => "output_layer",
        }
    }

    /// The last selection's aggregation weights, one per selected entry, when the strategy
    /// gives its own (F3AST's p_k / r_k); otherwise `None`.
    #[getter]
    fn weights(&self) -> PyResult<Option<Vec<f64>>> {
        Ok(self.lock()?.weights.clone())
    }

    /// Chooses the clients of `round` among `available`, at most `budget` of them.
    ///
    /// The selector's requests go to `query`, an object with whichever of these methods
    /// the strategy uses: `losses(clients)` (held-out losses), `minibatch_losses(clients)`,
    /// `probe(clients, evaluate)`, `advance(clients, evaluate)`, `updates(clients)`,
    /// `gradients(clients, scope)`, `noise_responses(updates, batch)`, `gram(clients)`.
    /// Asking about a client outside `available` is an error, as it is in a fedsel run;
    /// only the first call's initial phase (FedGS) may reach every client. The draws are
    /// the run's own (seed, round), so a caller that answers as the simulator does gets the
    /// simulator's choices.
    #[pyo3(signature = (round, available, budget, query))]
    fn select(
        &self,
        py: Python<'_>,
        round: usize,
        mut available: Vec<usize>,
        budget: usize,
        query: Py<PyAny>,
    ) -> PyResult<Vec<usize>> {
        available.sort_unstable();
        available.dedup();
        if let Some(&k) = available.iter().find(|&&k| k >= self.clients) {
            return Err(py_err(format!(
                "available client {k} is out of range: the selector knows {} clients",
                self.clients
            )));
        }
        let mut state = self.lock()?;
        let name = self.name;
        let mut q = PyQuery {
            obj: &query,
            strategy: name,
            error: None,
        };
        let seed = self.seed;
        let clients = self.clients;
        let st: &mut State = &mut state;
        let result = py.detach(|| -> Result<select::Selection, Error> {
            if !st.initialised {
                let all: Vec<usize> = (0..clients).collect();
                st.inner.initial_phase(&mut AvailableOnly {
                    inner: &mut q,
                    available: &all,
                    selector: name,
                    round,
                })?;
                st.initialised = true;
            }
            let ctx = RoundContext {
                round,
                available: &available,
                budget,
            };
            let mut guarded = AvailableOnly {
                inner: &mut q,
                available: &available,
                selector: name,
                round,
            };
            let mut rng = stream(seed, Purpose::Selection, round as u64, 0);
            st.inner.select(&ctx, &mut guarded, &mut rng)
        });
        let selection = match (result, q.error) {
            (Err(_), Some(e)) => return Err(e),
            (Err(e), None) => return Err(py_err(e)),
            (Ok(s), _) => s,
        };
        if let Some(&k) = selection
            .clients
            .iter()
            .find(|k| available.binary_search(k).is_err())
        {
            return Err(py_err(Error::Selection {
                selector: name.into(),
                round,
                reason: format!("chose client {k}, which is not available"),
            }));
        }
        state.last_round = Some(round);
        state.weights = selection.weights;
        Ok(selection.clients)
    }

    /// Reports the last selection's outcome: `selected` as `select` returned it, each
    /// entry's mean training loss, and its update (`updates` says which part) when the
    /// strategy learns from updates.
    #[pyo3(signature = (selected, *, updates=None, train_losses=None))]
    fn observe(
        &self,
        selected: Vec<usize>,
        updates: Option<Vec<Vec<f32>>>,
        train_losses: Option<Vec<f64>>,
    ) -> PyResult<()> {
        let mut state = self.lock()?;
        let round = state
            .last_round
            .ok_or_else(|| py_err("observe before any select: there is no round to report on"))?;
        let train_losses = train_losses.unwrap_or_else(|| vec![0.0; selected.len()]);
        if train_losses.len() != selected.len() {
            return Err(py_err(format!(
                "{} train_losses for {} selected clients",
                train_losses.len(),
                selected.len()
            )));
        }
        match (&updates, self.needs.updates) {
            (None, UpdateKind::None) => {}
            (None, kind) => {
                return Err(py_err(format!(
                    "strategy `{}` learns from the selected clients' updates ({}): pass `updates`",
                    self.name,
                    if kind == UpdateKind::Full {
                        "the whole update x_k - w"
                    } else {
                        "the output layer's bias then weight, of x_k - w"
                    }
                )));
            }
            (Some(u), _) if u.len() != selected.len() => {
                return Err(py_err(format!(
                    "{} updates for {} selected clients",
                    u.len(),
                    selected.len()
                )));
            }
            (Some(_), _) => {}
        }
        state.inner.observe(&Feedback {
            round,
            selected: &selected,
            train_losses: &train_losses,
            updates: updates
                .as_deref()
                .filter(|_| self.needs.updates != UpdateKind::None),
        });
        Ok(())
    }

    /// Everything the selector learned, as JSON-able data, for a checkpoint.
    fn state<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyAny>> {
        let text = serde_json::to_string(&self.lock()?.inner.save()).map_err(py_err)?;
        py.import("json")?.call_method1("loads", (text,))
    }

    /// Restores what `state()` returned (into a selector built with the same arguments).
    /// The initial phase is not run again: what it learned is in the state.
    fn load_state(&self, py: Python<'_>, state: &Bound<'_, PyAny>) -> PyResult<()> {
        let text: String = py
            .import("json")?
            .call_method1("dumps", (state,))?
            .extract()?;
        let value: serde_json::Value = serde_json::from_str(&text).map_err(py_err)?;
        let mut s = self.lock()?;
        s.inner.load(&value).map_err(py_err)?;
        s.initialised = true;
        Ok(())
    }

    fn __repr__(&self) -> String {
        format!(
            "Selector({}, clients={}, seed={})",
            self.name, self.clients, self.seed
        )
    }
}

/// The selector's requests, answered by methods of a Python object.
struct PyQuery<'a> {
    obj: &'a Py<PyAny>,
    strategy: &'static str,
    /// The Python exception behind the last failed request, raised to the caller instead
    /// of the core's generic error.
    error: Option<PyErr>,
}

impl PyQuery<'_> {
    /// Calls `method` with the arguments `args` builds and converts its answer with
    /// `extract`; a missing method or a failed call is kept as the Python exception.
    fn call<R>(
        &mut self,
        method: &'static str,
        what: &str,
        args: impl FnOnce(Python<'_>) -> PyResult<Bound<'_, PyTuple>>,
        extract: impl FnOnce(&Bound<'_, PyAny>) -> PyResult<R>,
    ) -> Result<R, Error> {
        let strategy = self.strategy;
        let answer = Python::attach(|py| {
            let obj = self.obj.bind(py);
            if !obj.hasattr(method)? {
                return Err(FedselError::new_err(format!(
                    "strategy `{strategy}` asks for {what}, but the query object ({}) has no method `{method}`",
                    obj.get_type().name()?
                )));
            }
            let value = obj.call_method1(method, args(py)?)?;
            extract(&value).map_err(|e| {
                FedselError::new_err(format!(
                    "query method `{method}` ({what}) returned something unusable: {e}"
                ))
            })
        });
        answer.map_err(|e| {
            self.error = Some(e);
            Error::Selection {
                selector: strategy.into(),
                round: 0,
                reason: format!("the query method `{method}` failed"),
            }
        })
    }

    /// One answer per client asked about, or an error naming the method.
    fn per_client<T>(
        &mut self,
        method: &'static str,
        got: Vec<T>,
        want: usize,
    ) -> Result<Vec<T>, Error> {
        if got.len() == want {
            return Ok(got);
        }
        let e = FedselError::new_err(format!(
            "query method `{method}` returned {} values for {want} clients",
            got.len()
        ));
        self.error = Some(e);
        Err(Error::Selection {
            selector: self.strategy.into(),
            round: 0,
            reason: format!("the query method `{method}` answered for the wrong clients"),
        })
    }
}

impl ClientQuery for PyQuery<'_> {
    fn holdout_losses(&mut self, clients: &[usize]) -> Result<Vec<f64>, Error> {
        let got = self.call(
            "losses",
            "held-out losses",
            |py| PyTuple::new(py, [clients.to_vec()]),
            |v| v.extract::<Vec<f64>>(),
        )?;
        self.per_client("losses", got, clients.len())
    }

    fn minibatch_losses(&mut self, clients: &[usize]) -> Result<Vec<f64>, Error> {
        let got = self.call(
            "minibatch_losses",
            "mini-batch losses",
            |py| PyTuple::new(py, [clients.to_vec()]),
            |v| v.extract::<Vec<f64>>(),
        )?;
        self.per_client("minibatch_losses", got, clients.len())
    }

    fn probe(&mut self, clients: &[usize], evaluate: &[usize]) -> Result<Vec<f64>, Error> {
        let got = self.call(
            "probe",
            "a probe training",
            |py| PyTuple::new(py, [clients.to_vec(), evaluate.to_vec()]),
            |v| v.extract::<Vec<f64>>(),
        )?;
        self.per_client("probe", got, evaluate.len())
    }

    fn advance(&mut self, clients: &[usize], evaluate: &[usize]) -> Result<Vec<f64>, Error> {
        let got = self.call(
            "advance",
            "an extra training step",
            |py| PyTuple::new(py, [clients.to_vec(), evaluate.to_vec()]),
            |v| v.extract::<Vec<f64>>(),
        )?;
        self.per_client("advance", got, evaluate.len())
    }

    fn local_updates(&mut self, clients: &[usize]) -> Result<Vec<Vec<f32>>, Error> {
        let got = self.call(
            "updates",
            "local updates",
            |py| PyTuple::new(py, [clients.to_vec()]),
            |v| v.extract::<Vec<Vec<f32>>>(),
        )?;
        self.per_client("updates", got, clients.len())
    }

    fn noise_responses(
        &mut self,
        updates: &[Vec<f32>],
        batch: usize,
    ) -> Result<Vec<Vec<f64>>, Error> {
        let got = self.call(
            "noise_responses",
            "noise responses",
            |py| {
                let u = updates.to_vec().into_pyobject(py)?;
                PyTuple::new(py, [u.into_any(), batch.into_pyobject(py)?.into_any()])
            },
            |v| v.extract::<Vec<Vec<f64>>>(),
        )?;
        self.per_client("noise_responses", got, updates.len())
    }

    fn secure_gram(&mut self, clients: &[usize]) -> Result<Vec<Vec<f64>>, Error> {
        let got = self.call(
            "gram",
            "secure Gram entries",
            |py| PyTuple::new(py, [clients.to_vec()]),
            |v| v.extract::<Vec<Vec<f64>>>(),
        )?;
        self.per_client("gram", got, clients.len())
    }

    fn gradients(
        &mut self,
        clients: &[usize],
        scope: GradientScope,
    ) -> Result<Vec<Vec<f32>>, Error> {
        let scope = match scope {
            GradientScope::Full => "full",
            GradientScope::Minibatch => "minibatch",
        };
        let got = self.call(
            "gradients",
            "client gradients",
            |py| {
                let c = clients.to_vec().into_pyobject(py)?;
                PyTuple::new(py, [c.into_any(), scope.into_pyobject(py)?.into_any()])
            },
            |v| v.extract::<Vec<Vec<f32>>>(),
        )?;
        self.per_client("gradients", got, clients.len())
    }
}

/// Adds `Selector` to the module.
pub fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_class::<PySelector>()
}
