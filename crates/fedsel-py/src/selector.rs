//! `fedsel.Selector`: a core selector driven from Python, without the simulator.
//!
//! The caller plays the engine's part: it says who is available, answers the selector's
//! requests through a Python object (the query), trains the chosen clients itself and
//! reports back. The selector is the core's own (`fedsel::select::build`), behind the same
//! availability guard the engine puts in front of every query, so it behaves here as it
//! does in a fedsel run.

use std::panic::{AssertUnwindSafe, catch_unwind};
use std::sync::Mutex;

use pyo3::conversion::FromPyObjectOwned;
use pyo3::exceptions::PyRuntimeWarning;
use pyo3::prelude::*;
use pyo3::types::{PyDict, PyTuple};

use fedsel::config::Config;
use fedsel::error::Error;
use fedsel::rng::{Purpose, stream};
use fedsel::select::guard::{self, AvailableOnly};
use fedsel::select::{
    self, ClientOrder, ClientQuery, DeviceReport, Dropped, Feedback, GradientScope, Needs,
    RoundContext, Selector, Setup, UpdateKind,
};

use crate::{FedselError, convert, py_err};

/// The config table a strategy's own options live in (`[selection.<table>]`); strategies
/// without options have none.
fn options_table(strategy: &str) -> Option<&'static str> {
    if strategy.starts_with("py:") {
        return Some("params");
    }
    match strategy {
        "powd" | "cpowd" | "rpowd" => Some("powd"),
        "fedcor" | "fedgp" => Some("fedcor"),
        "afl" => Some("afl"),
        "fedgs" => Some("fedgs"),
        "f3ast" => Some("f3ast"),
        "hics" => Some("hics"),
        "divfl" => Some("divfl"),
        "oort" => Some("oort"),
        "fedcs" => Some("fedcs"),
        "tifl" => Some("tifl"),
        "refl" => Some("refl"),
        "fedbalancer" => Some("fedbalancer"),
        "pyramidfl" => Some("pyramidfl"),
        _ => None,
    }
}

/// An argument converted to what the core takes, or a `FedselError` naming it: Python's own
/// conversion errors (an `OverflowError` for a negative count) say neither which argument
/// nor which entry was wrong.
fn arg<'py, T: FromPyObjectOwned<'py>>(name: &str, value: &Bound<'py, PyAny>) -> PyResult<T> {
    value.extract::<T>().map_err(|e| {
        let e: PyErr = e.into();
        py_err(format!("`{name}`: {e}"))
    })
}

/// A count (a size, a budget, a round) as `usize`, or an error naming it and its value.
fn count(name: &str, value: i64) -> PyResult<usize> {
    usize::try_from(value).map_err(|_| py_err(format!("`{name}` is {value}: it must be ≥ 0")))
}

/// Client ids as the core's indices, each checked against the federation's size.
fn client_ids(name: &str, ids: &[i64], clients: usize) -> PyResult<Vec<usize>> {
    ids.iter()
        .enumerate()
        .map(|(i, &k)| match usize::try_from(k) {
            Ok(k) if k < clients => Ok(k),
            _ => Err(py_err(format!(
                "`{name}[{i}]` is client {k}, which is out of range: the selector knows {clients} clients (0..{})",
                clients.saturating_sub(1)
            ))),
        })
        .collect()
}

/// Runs `f`, turning a panic into a `FedselError` that says it is a bug: no Rust panic may
/// cross into Python as a `PanicException`, which `except Exception` does not catch.
fn no_panic<R>(strategy: &str, during: &str, f: impl FnOnce() -> PyResult<R>) -> PyResult<R> {
    catch_unwind(AssertUnwindSafe(f)).unwrap_or_else(|payload| {
        let message = payload
            .downcast_ref::<&str>()
            .map(|m| (*m).to_string())
            .or_else(|| payload.downcast_ref::<String>().cloned())
            .unwrap_or_else(|| "no message".into());
        Err(py_err(format!(
            "internal error in strategy `{strategy}` during {during}: {message}. This is a bug in fedsel; please report it with the call that caused it"
        )))
    })
}

/// One row per client of an oracle argument, all of one length.
fn oracle_rows<'py, T: FromPyObjectOwned<'py>>(
    name: &str,
    value: &Bound<'py, PyAny>,
    clients: usize,
) -> PyResult<Vec<Vec<T>>> {
    let rows: Vec<Vec<T>> = arg(name, value)?;
    if rows.len() != clients {
        return Err(py_err(format!(
            "`{name}` has {} rows for {clients} clients",
            rows.len()
        )));
    }
    if let Some(k) = rows.iter().position(|r| r.len() != rows[0].len()) {
        return Err(py_err(format!(
            "`{name}[{k}]` has {} values, `{name}[0]` {}",
            rows[k].len(),
            rows[0].len()
        )));
    }
    Ok(rows)
}

/// One selected entry's order as Python sees it: its work multiplier and dropout fraction.
type Order = (f64, Option<f64>);

/// Strategies that rank clients by their devices (they refuse to select without
/// [`DeviceReport`]s).
fn needs_devices(strategy: &str) -> bool {
    strategy == "pyramidfl"
}

/// One [`DeviceReport`] per client from `devices`, a list of dicts with the keys
/// `download_s`, `compute_s`, `upload_s` (seconds) and `steps`, `epoch_steps`, `batch`.
fn device_reports(value: &Bound<'_, PyAny>, clients: usize) -> PyResult<Vec<DeviceReport>> {
    let rows: Vec<Bound<'_, PyDict>> = arg("devices", value)?;
    if rows.len() != clients {
        return Err(py_err(format!(
            "`devices` has {} entries for {clients} clients: give one dict per client",
            rows.len()
        )));
    }
    const KEYS: [&str; 6] = [
        "download_s",
        "compute_s",
        "upload_s",
        "steps",
        "epoch_steps",
        "batch",
    ];
    rows.iter()
        .enumerate()
        .map(|(i, row)| {
            for key in row.keys() {
                let key: String = key.extract()?;
                if !KEYS.contains(&key.as_str()) {
                    return Err(py_err(format!(
                        "`devices[{i}]` has the key `{key}`; a device has {}",
                        KEYS.join(", ")
                    )));
                }
            }
            let get = |key: &str| {
                row.get_item(key)?
                    .ok_or_else(|| py_err(format!("`devices[{i}]` has no `{key}`")))
            };
            let seconds = |key: &str| -> PyResult<f64> {
                let v: f64 = arg(&format!("devices[{i}][\"{key}\"]"), &get(key)?)?;
                if v.is_finite() && v >= 0.0 {
                    Ok(v)
                } else {
                    Err(py_err(format!(
                        "`devices[{i}][\"{key}\"]` is {v}: a time is finite and non-negative, in seconds"
                    )))
                }
            };
            let steps = |key: &str| -> PyResult<usize> {
                let name = format!("devices[{i}][\"{key}\"]");
                count(&name, arg(&name, &get(key)?)?)
            };
            let report = DeviceReport {
                download_s: seconds("download_s")?,
                compute_s: seconds("compute_s")?,
                upload_s: seconds("upload_s")?,
                steps: steps("steps")?,
                epoch_steps: steps("epoch_steps")?,
                batch: steps("batch")?,
            };
            if report.steps == 0 || report.batch == 0 {
                return Err(py_err(format!(
                    "`devices[{i}]` has steps = {} and batch = {}: both must be at least 1",
                    report.steps, report.batch
                )));
            }
            Ok(report)
        })
        .collect()
}

/// What the selector learned and what the caller must report back; behind a mutex because
/// Python may share the object between threads, while a selector is `Send` only.
struct State {
    inner: Box<dyn Selector>,
    /// The initial phase (FedGS's graph) ran, or a loaded state made it unnecessary.
    initialised: bool,
    /// The round of the last `select`, which `observe` reports on; a later `select` must
    /// name a later round.
    last_round: Option<usize>,
    /// The round `observe` last reported on: each selection is reported once, or a
    /// selector that counts trainings (Oort's blacklist) would count them twice.
    observed: Option<usize>,
    /// The last selection's aggregation weights, when the strategy gives its own (F3AST).
    weights: Option<Vec<f64>>,
    /// The last selection's orders, when the strategy gives them (PyramidFL).
    orders: Option<Vec<ClientOrder>>,
    /// The last selection, which `observe` may report on in part, never beyond.
    last_selection: Vec<usize>,
    /// The update length of every report so far, fixed by the first one.
    update_len: Option<usize>,
    /// Entries left out of what the selector learned, for a non-finite report.
    rejected: usize,
}

/// A fedsel selection strategy, used without the simulator.
///
/// `Selector(strategy, sizes=[n_0, ...], per_round=m, rounds=T, seed=0, **options)`.
/// `strategy` is a strategy's name (`py:module:Class` for a class written in Python) or a
/// selector object written in Python (docs/your-selector.md). `options` are the strategy's
/// config keys (`[selection.<strategy>]` in a fedsel config), e.g. `Selector("powd", ...,
/// d=10)`, or a Python class's constructor arguments. `classes` is the output layer's width, needed by
/// strategies that read output-layer updates (HiCS-FL). `oracle_features` and
/// `oracle_label_histograms` are only for strategies defined with oracle knowledge (FedGS's
/// oracle graph). `devices`, one dict per client (`download_s`, `compute_s`, `upload_s`,
/// `steps`, `epoch_steps`, `batch`: fedsel's `DeviceReport`), is what each client reports of
/// its device at registration, for the strategies that rank devices (PyramidFL); its
/// `orders` then say what each selected client is to do.
#[pyclass(name = "Selector", module = "fedsel")]
pub struct PySelector {
    state: Mutex<State>,
    name: &'static str,
    clients: usize,
    rounds: usize,
    classes: usize,
    seed: u64,
    needs: Needs,
    aggregation: &'static str,
}

impl PySelector {
    /// The length every update of this call has, checked against the output layer's shape
    /// and the earlier reports' length.
    fn update_length(
        &self,
        kind: UpdateKind,
        updates: &[Vec<f32>],
        earlier: Option<usize>,
    ) -> PyResult<usize> {
        let want = earlier
            .or_else(|| updates.first().map(Vec::len))
            .unwrap_or(0);
        if let Some((i, u)) = updates.iter().enumerate().find(|(_, u)| u.len() != want) {
            return Err(py_err(format!(
                "`updates[{i}]` has {} values where {want} are expected{}",
                u.len(),
                if earlier.is_some() {
                    " (the length of the earlier reports)"
                } else {
                    " (the length of `updates[0]`)"
                }
            )));
        }
        let c = self.classes;
        if kind == UpdateKind::OutputLayer && (want < 2 * c || !want.is_multiple_of(c)) {
            return Err(py_err(format!(
                "`updates` have {want} values: an output layer of {c} classes has a bias of {c} then a weight of {c} × d values (d ≥ 1), so a multiple of {c} of at least {}",
                2 * c
            )));
        }
        if want == 0 {
            return Err(py_err("`updates` are empty"));
        }
        Ok(want)
    }

    fn lock(&self) -> PyResult<std::sync::MutexGuard<'_, State>> {
        self.state.try_lock().map_err(|_| {
            py_err("the selector is in use (a query method called back into it, or another thread)")
        })
    }
}

#[pymethods]
impl PySelector {
    #[new]
    #[pyo3(signature = (strategy, *, sizes, per_round, rounds, seed=None, classes=None, oracle_features=None, oracle_label_histograms=None, durations=None, devices=None, **options))]
    #[allow(clippy::too_many_arguments)]
    fn new(
        strategy: &Bound<'_, PyAny>,
        sizes: &Bound<'_, PyAny>,
        per_round: &Bound<'_, PyAny>,
        rounds: &Bound<'_, PyAny>,
        seed: Option<&Bound<'_, PyAny>>,
        classes: Option<&Bound<'_, PyAny>>,
        oracle_features: Option<&Bound<'_, PyAny>>,
        oracle_label_histograms: Option<&Bound<'_, PyAny>>,
        durations: Option<&Bound<'_, PyAny>>,
        devices: Option<&Bound<'_, PyAny>>,
        options: Option<&Bound<'_, PyDict>>,
    ) -> PyResult<Self> {
        // A strategy's name, or a selector object written in Python (docs/your-selector.md).
        let object = (!strategy.is_instance_of::<pyo3::types::PyString>()).then_some(strategy);
        let strategy: String = match object {
            Some(obj) => crate::user::class_path(obj)?,
            None => strategy.extract()?,
        };
        let strategy = strategy.as_str();
        let sizes = arg::<Vec<i64>>("sizes", sizes)?
            .iter()
            .enumerate()
            .map(|(i, &n)| count(&format!("sizes[{i}]"), n))
            .collect::<PyResult<Vec<usize>>>()?;
        let n = sizes.len();
        if n == 0 {
            return Err(py_err("`sizes` names no client"));
        }
        let total: f64 = sizes.iter().sum::<usize>() as f64;
        if total == 0.0 {
            return Err(py_err(
                "`sizes` are all 0: the selectors weigh clients by n_k / Σ n",
            ));
        }
        let per_round = count("per_round", arg("per_round", per_round)?)?;
        if !(1..=n).contains(&per_round) {
            return Err(py_err(format!(
                "`per_round` is {per_round}: it must be between 1 and the {n} clients"
            )));
        }
        let rounds = count("rounds", arg("rounds", rounds)?)?;
        if rounds == 0 {
            return Err(py_err("`rounds` is 0: a selector plays at least one round"));
        }
        let seed: u64 = seed.map_or(Ok(0), |s| {
            arg("seed", s)
                .map_err(|_| py_err(format!("`seed` is {s}: it must be an integer in 0..2^64")))
        })?;
        let classes = match classes {
            Some(c) => count("classes", arg("classes", c)?)?,
            None => 0,
        };
        let durations: Option<Vec<f64>> = durations.map(|d| arg("durations", d)).transpose()?;
        if let Some(d) = &durations {
            if d.len() != n {
                return Err(py_err(format!(
                    "{} durations for {n} clients: give one registered round trip per client",
                    d.len()
                )));
            }
            if let Some((k, v)) = d
                .iter()
                .enumerate()
                .find(|(_, v)| !(v.is_finite() && **v >= 0.0))
            {
                return Err(py_err(format!(
                    "`durations[{k}]` is {v}: a round trip is a finite, non-negative time in seconds"
                )));
            }
        }
        let devices = devices.map(|d| device_reports(d, n)).transpose()?;
        if devices.is_none() && needs_devices(strategy) {
            return Err(py_err(format!(
                "strategy `{strategy}` ranks clients by their devices: give `devices`, one dict \
                 per client with download_s, compute_s, upload_s, steps, epoch_steps and batch"
            )));
        }
        let mut selection = toml::Table::new();
        selection.insert("strategy".into(), strategy.into());
        selection.insert("clients_per_round".into(), (per_round as i64).into());
        let mut opts = match options.filter(|o| !o.is_empty()) {
            Some(o) => {
                let table = options_table(strategy)
                    .ok_or_else(|| py_err(format!("strategy `{strategy}` takes no options")))?;
                Some((table, convert::table(o, &format!("selection.{table}"))?))
            }
            None => None,
        };
        // A real server has no label histograms: HiCS-FL's entropy diagnostics, which
        // compare its estimate with them, are off here unless asked for.
        if strategy == "hics" {
            let (_, t) = opts.get_or_insert_with(|| ("hics", toml::Table::new()));
            t.entry("entropy_report").or_insert(false.into());
        }
        if let Some((table, t)) = opts {
            selection.insert(table.into(), t.into());
        }
        let mut root = toml::Table::new();
        // The config checks that HiCS-FL's `code` protocol is run in the authors' training
        // regime (each client's optimizer kept, SGD with momentum). Here the caller's
        // clients train, not fedsel, so the regime is the caller's to keep (docs/python.md)
        // and the check is given the protocol's own regime.
        let hics_code = selection
            .get("hics")
            .and_then(|t| t.get("protocol"))
            .and_then(toml::Value::as_str)
            == Some("code");
        if strategy == "hics" && hics_code {
            let mut train = toml::Table::new();
            train.insert("persistent_state".into(), true.into());
            train.insert("momentum".into(), 0.9.into());
            root.insert("train".into(), train.into());
        }
        // The config checks that a strategy that ranks devices runs with a clock; here the
        // caller's `devices` are the clock's reports, so the check is given one.
        if needs_devices(strategy) {
            let mut system = toml::Table::new();
            system.insert("kind".into(), "lognormal".into());
            root.insert("system".into(), system.into());
        }
        root.insert("rounds".into(), (rounds as i64).into());
        root.insert("selection".into(), selection.into());
        let config = Config::from_table(root, "Selector options", &[]).map_err(py_err)?;
        let mut inner: Box<dyn Selector> = match object {
            Some(obj) => Box::new(crate::user::UserSelector::from_object(obj).map_err(py_err)?),
            None => select::build(&config.selection).map_err(py_err)?,
        };
        let needs = inner.needs();
        if needs.updates == UpdateKind::OutputLayer && classes == 0 {
            return Err(py_err(format!(
                "strategy `{strategy}` reads output-layer updates: give `classes`, the output layer's width"
            )));
        }
        let oracle_features = match oracle_features.filter(|_| needs.oracle_features) {
            Some(f) => {
                let rows = oracle_rows::<f64>("oracle_features", f, n)?;
                if let Some((k, v)) = rows
                    .iter()
                    .enumerate()
                    .find_map(|(k, r)| r.iter().find(|v| !v.is_finite()).map(|v| (k, v)))
                {
                    return Err(py_err(format!(
                        "`oracle_features[{k}]` holds {v}: features must be finite"
                    )));
                }
                Some(rows)
            }
            None if needs.oracle_features => {
                return Err(py_err(format!(
                    "strategy `{strategy}` as configured needs `oracle_features`, one per client (oracle knowledge a real server does not have)"
                )));
            }
            None => None,
        };
        let oracle_label_histograms = match oracle_label_histograms
            .filter(|_| needs.oracle_label_histograms)
        {
            Some(h) => Some(
                oracle_rows::<i64>("oracle_label_histograms", h, n)?
                    .iter()
                    .enumerate()
                    .map(|(k, row)| {
                        row.iter()
                            .enumerate()
                            .map(|(c, &v)| count(&format!("oracle_label_histograms[{k}][{c}]"), v))
                            .collect::<PyResult<Vec<usize>>>()
                    })
                    .collect::<PyResult<Vec<_>>>()?,
            ),
            None if needs.oracle_label_histograms => {
                let hint = if strategy == "hics" {
                    ": `entropy_report=True` compares HiCS-FL's estimate with the true label entropies, which a real server cannot see; without it (the default) HiCS-FL selects as a real server does"
                } else {
                    " (oracle knowledge a real server does not have)"
                };
                return Err(py_err(format!(
                    "strategy `{strategy}` as configured needs `oracle_label_histograms`, one per client{hint}"
                )));
            }
            None => None,
        };
        let setup = Setup {
            weights: sizes.iter().map(|&s| s as f64 / total).collect(),
            sizes,
            per_round: config.selection.per_round(n),
            rounds,
            num_params: 0,
            classes,
            oracle_label_histograms,
            oracle_features,
            durations,
        };
        let name = inner.name();
        no_panic(name, "setup", || {
            inner.setup(&setup);
            if let Some(d) = &devices {
                inner.register_devices(d);
            }
            Ok(())
        })?;
        Ok(Self {
            name,
            aggregation: select::own_aggregation(name).name(),
            state: Mutex::new(State {
                inner,
                initialised: false,
                last_round: None,
                observed: None,
                weights: None,
                orders: None,
                last_selection: Vec::new(),
                update_len: None,
                rejected: 0,
            }),
            clients: n,
            rounds,
            classes,
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

    /// The last selection's orders, one `(work, dropout)` per selected entry, when the
    /// strategy gives them (PyramidFL); otherwise `None`. The entry trains ⌊E·`work`⌋
    /// mini-batch steps, E its steps of the run's own work, and leaves the fraction
    /// `dropout` of its update out of its upload (`None`: it uploads it whole).
    #[getter]
    fn orders(&self) -> PyResult<Option<Vec<Order>>> {
        Ok(self.lock()?.orders.as_ref().map(|o| {
            o.iter()
                .map(|c| (c.work, c.dropout.map(|d| d.rate())))
                .collect()
        }))
    }

    /// Chooses the clients of `round` among `available`, at most `budget` of them.
    ///
    /// The selector's requests go to `query`, an object with whichever of these methods
    /// the strategy uses: `losses(clients)` (held-out losses), `minibatch_losses(clients)`,
    /// `probe(clients, evaluate)`, `advance(clients, evaluate)`, `updates(clients)`,
    /// `gradients(clients, scope)`, `noise_responses(updates, batch)`, `gram(clients)`.
    /// Asking about a client outside `available` is an error, as it is in a fedsel run;
    /// only the first call's initial phase (FedGS) may reach every client. An answer with
    /// a non-finite value, or the wrong count or length, is an error naming the client and
    /// the value (the selector cannot choose without it). The draws are the run's own
    /// (seed, round), so a caller that answers as the simulator does gets the simulator's
    /// choices.
    #[pyo3(signature = (round, available, budget, query))]
    fn select(
        &self,
        py: Python<'_>,
        round: &Bound<'_, PyAny>,
        available: &Bound<'_, PyAny>,
        budget: &Bound<'_, PyAny>,
        query: Py<PyAny>,
    ) -> PyResult<Vec<usize>> {
        let round = count("round", arg("round", round)?)?;
        if round >= self.rounds {
            return Err(py_err(format!(
                "`round` is {round}, past the last round of this selector's `rounds={}` (rounds are 0..{})",
                self.rounds,
                self.rounds - 1
            )));
        }
        let mut available = client_ids(
            "available",
            &arg::<Vec<i64>>("available", available)?,
            self.clients,
        )?;
        available.sort_unstable();
        available.dedup();
        let budget = count("budget", arg("budget", budget)?)?;
        let mut state = self.lock()?;
        if let Some(last) = state.last_round.filter(|&last| round <= last) {
            return Err(py_err(format!(
                "`round` is {round}, but round {last} was selected already: rounds go forward, \
                 each selected once (a restarted server restores `state()`, which carries the round)"
            )));
        }
        let name = self.name;
        let mut q = PyQuery {
            obj: &query,
            strategy: name,
            error: None,
        };
        let seed = self.seed;
        let clients = self.clients;
        let st: &mut State = &mut state;
        let result = py.detach(|| {
            no_panic(name, &format!("the selection of round {round}"), || {
                Ok(select_round(
                    st, &mut q, name, clients, seed, round, &available, budget,
                ))
            })
        })?;
        let planned = match (result, q.error) {
            (Err(_), Some(e)) => return Err(e),
            (Err(e), None) => return Err(py_err(e)),
            (Ok(s), _) => s,
        };
        let selection = planned.selection;
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
        state.orders = planned.orders;
        state.last_selection.clone_from(&selection.clients);
        Ok(selection.clients)
    }

    /// Reports the last selection's outcome: `selected`, the entries of the last selection
    /// that trained (all of them, or those whose reply came back), each one's mean training
    /// loss, and its update (`updates` says which part) when the strategy learns from
    /// updates.
    ///
    /// An entry whose training loss or update is not finite is left out of what the
    /// selector learns this round, with a `RuntimeWarning` naming it: a real server cannot
    /// trust every client, and the simulator drops such a model from its aggregate too.
    /// Returns the clients so left out (counted in `rejected`). A malformed call (an entry
    /// that was not selected, an update of another length) is a `FedselError`.
    ///
    /// `durations`, when the server measures them, is each entry's round trip in seconds
    /// (the model's broadcast to the update's arrival): system-aware strategies (Oort)
    /// prefer clients that finish fast. An entry with a negative or non-finite duration is
    /// left out like one with a non-finite loss.
    ///
    /// `dropped` names entries of the last selection whose update the server did not use
    /// (stragglers it stopped waiting for), and `dropped_durations` each one's lower bound
    /// in seconds: the time from the broadcast until the round closed without it. Oort
    /// raises such a client's duration to at least the bound (a censored observation).
    #[pyo3(signature = (selected, *, updates=None, train_losses=None, durations=None, dropped=None, dropped_durations=None))]
    #[allow(clippy::too_many_arguments)]
    fn observe(
        &self,
        py: Python<'_>,
        selected: &Bound<'_, PyAny>,
        updates: Option<&Bound<'_, PyAny>>,
        train_losses: Option<&Bound<'_, PyAny>>,
        durations: Option<&Bound<'_, PyAny>>,
        dropped: Option<&Bound<'_, PyAny>>,
        dropped_durations: Option<&Bound<'_, PyAny>>,
    ) -> PyResult<Vec<usize>> {
        let selected = client_ids(
            "selected",
            &arg::<Vec<i64>>("selected", selected)?,
            self.clients,
        )?;
        let updates: Option<Vec<Vec<f32>>> = updates.map(|u| arg("updates", u)).transpose()?;
        let durations: Option<Vec<f64>> = durations.map(|d| arg("durations", d)).transpose()?;
        let dropped: Option<Vec<usize>> = dropped
            .map(|d| client_ids("dropped", &arg::<Vec<i64>>("dropped", d)?, self.clients))
            .transpose()?;
        let at_least: Option<Vec<f64>> = dropped_durations
            .map(|d| arg("dropped_durations", d))
            .transpose()?;
        let train_losses: Vec<f64> = match train_losses {
            Some(l) => arg("train_losses", l)?,
            None => vec![0.0; selected.len()],
        };
        let mut state = self.lock()?;
        let round = state
            .last_round
            .ok_or_else(|| py_err("observe before any select: there is no round to report on"))?;
        if state.observed == Some(round) {
            return Err(py_err(format!(
                "round {round} was observed already: `observe` reports each selection once, \
                 after the `select` of its round (the last was round {round})"
            )));
        }
        let mut left = state.last_selection.clone();
        for (i, k) in selected.iter().enumerate() {
            match left.iter().position(|x| x == k) {
                Some(p) => {
                    left.swap_remove(p);
                }
                None => {
                    return Err(py_err(format!(
                        "`selected[{i}]` is client {k}, which the selection of round {round} ({:?}) does not hold (once more)",
                        state.last_selection
                    )));
                }
            }
        }
        let dropped = match (dropped, at_least) {
            (None, None) => None,
            (Some(d), Some(b)) => {
                if b.len() != d.len() {
                    return Err(py_err(format!(
                        "{} dropped_durations for {} dropped clients",
                        b.len(),
                        d.len()
                    )));
                }
                for (i, (k, v)) in d.iter().zip(&b).enumerate() {
                    if !(v.is_finite() && *v >= 0.0) {
                        return Err(py_err(format!(
                            "`dropped_durations[{i}]` is {v}: a bound is a finite, non-negative time in seconds"
                        )));
                    }
                    match left.iter().position(|x| x == k) {
                        Some(p) => {
                            left.swap_remove(p);
                        }
                        None => {
                            return Err(py_err(format!(
                                "`dropped[{i}]` is client {k}, which the selection of round {round} ({:?}) does not hold beside `selected` (once more)",
                                state.last_selection
                            )));
                        }
                    }
                }
                Some((d, b))
            }
            (Some(_), None) => {
                return Err(py_err(
                    "`dropped` without `dropped_durations`: give each dropped client's lower bound, the seconds until the round closed without it",
                ));
            }
            (None, Some(_)) => {
                return Err(py_err("`dropped_durations` without `dropped`"));
            }
        };
        if train_losses.len() != selected.len() {
            return Err(py_err(format!(
                "{} train_losses for {} selected clients",
                train_losses.len(),
                selected.len()
            )));
        }
        if let Some(d) = durations.as_ref().filter(|d| d.len() != selected.len()) {
            return Err(py_err(format!(
                "{} durations for {} selected clients",
                d.len(),
                selected.len()
            )));
        }
        let update_len = match (&updates, self.needs.updates) {
            (None, UpdateKind::None) => None,
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
            (Some(_), UpdateKind::None) => None,
            (Some(u), kind) => Some(self.update_length(kind, u, state.update_len)?),
        };
        let name = self.name;
        let st: &mut State = &mut state;
        let rejected = no_panic(name, &format!("the report of round {round}"), || {
            Ok(guard::observe_usable(
                st.inner.as_mut(),
                &Feedback {
                    round,
                    selected: &selected,
                    train_losses: &train_losses,
                    updates: updates
                        .as_deref()
                        .filter(|_| self.needs.updates != UpdateKind::None),
                    durations: durations.as_deref(),
                    dropped: dropped.as_ref().map(|(clients, at_least_s)| Dropped {
                        clients,
                        at_least_s,
                    }),
                },
                update_len,
            ))
        })?;
        state.observed = Some(round);
        if update_len.is_some() && rejected.len() < selected.len() {
            state.update_len = update_len;
        }
        state.rejected += rejected.len();
        for r in &rejected {
            PyErr::warn(
                py,
                &py.get_type::<PyRuntimeWarning>(),
                &std::ffi::CString::new(format!(
                    "fedsel: round {round}: client {} (entry {}) left out of what `{name}` learns: {}",
                    r.client, r.entry, r.reason
                ))
                .expect("no NUL in the message"),
                1,
            )?;
        }
        Ok(rejected.iter().map(|r| r.client).collect())
    }

    /// How many reported entries `observe` has left out so far for a non-finite value.
    #[getter]
    fn rejected(&self) -> PyResult<usize> {
        Ok(self.lock()?.rejected)
    }

    /// Everything the selector learned, as JSON-able data, for a checkpoint: the strategy,
    /// the federation's size and the strategy's own state.
    fn state<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyAny>> {
        let s = self.lock()?;
        let value = serde_json::json!({
            "strategy": self.name,
            "clients": self.clients,
            "classes": self.classes,
            "update_len": s.update_len,
            "last_round": s.last_round,
            "observed": s.observed,
            "selector": s.inner.save(),
        });
        let text = serde_json::to_string(&value).map_err(py_err)?;
        py.import("json")?.call_method1("loads", (text,))
    }

    /// Restores what `state()` returned, into a selector of the same strategy over as many
    /// clients (and classes); anything else is refused, naming what differs. The initial
    /// phase is not run again: what it learned is in the state.
    fn load_state(&self, py: Python<'_>, state: &Bound<'_, PyAny>) -> PyResult<()> {
        let text: String = py
            .import("json")?
            .call_method1("dumps", (state,))
            .map_err(|e| py_err(format!("`state` is not JSON-able data: {e}")))?
            .extract()?;
        let value: serde_json::Value = serde_json::from_str(&text).map_err(py_err)?;
        let field = |key: &str| {
            value.get(key).ok_or_else(|| {
                py_err(format!(
                    "`state` has no `{key}`: it is not what `Selector.state()` returns"
                ))
            })
        };
        let expect = |key: &str, want: serde_json::Value| -> PyResult<()> {
            let got = field(key)?;
            if *got != want {
                return Err(py_err(format!(
                    "`state` is for {key} {got}, this selector's is {want}"
                )));
            }
            Ok(())
        };
        expect("strategy", self.name.into())?;
        expect("clients", self.clients.into())?;
        expect("classes", self.classes.into())?;
        let update_len: Option<usize> = serde_json::from_value(field("update_len")?.clone())
            .map_err(|e| py_err(format!("`state['update_len']`: {e}")))?;
        // Absent from states saved before the rounds were kept: then any round may follow.
        let round = |key: &str| -> PyResult<Option<usize>> {
            value.get(key).map_or(Ok(None), |v| {
                serde_json::from_value(v.clone())
                    .map_err(|e| py_err(format!("`state['{key}']`: {e}")))
            })
        };
        let (last_round, observed) = (round("last_round")?, round("observed")?);
        let inner = field("selector")?;
        let mut s = self.lock()?;
        let name = self.name;
        no_panic(name, "load_state", || s.inner.load(inner).map_err(py_err))?;
        s.update_len = update_len;
        s.last_round = last_round;
        s.observed = observed;
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

/// One round's selection: the initial phase first, on the first call, then the round's
/// own, every request through the availability and answer checks.
#[allow(clippy::too_many_arguments)]
fn select_round(
    st: &mut State,
    q: &mut PyQuery<'_>,
    name: &'static str,
    clients: usize,
    seed: u64,
    round: usize,
    available: &[usize],
    budget: usize,
) -> Result<select::Planned, Error> {
    if !st.initialised {
        let all: Vec<usize> = (0..clients).collect();
        st.inner.initial_phase(&mut AvailableOnly {
            inner: q,
            available: &all,
            selector: name,
            round,
        })?;
        st.initialised = true;
    }
    let ctx = RoundContext {
        round,
        available,
        budget,
        clock_s: None,
    };
    let mut guarded = AvailableOnly {
        inner: q,
        available,
        selector: name,
        round,
    };
    let mut rng = stream(seed, Purpose::Selection, round as u64, 0);
    st.inner.plan(&ctx, &mut guarded, &mut rng)
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
}

impl ClientQuery for PyQuery<'_> {
    fn holdout_losses(&mut self, clients: &[usize]) -> Result<Vec<f64>, Error> {
        self.call(
            "losses",
            "held-out losses",
            |py| PyTuple::new(py, [clients.to_vec()]),
            |v| v.extract::<Vec<f64>>(),
        )
    }

    fn minibatch_losses(&mut self, clients: &[usize]) -> Result<Vec<f64>, Error> {
        self.call(
            "minibatch_losses",
            "mini-batch losses",
            |py| PyTuple::new(py, [clients.to_vec()]),
            |v| v.extract::<Vec<f64>>(),
        )
    }

    fn probe(&mut self, clients: &[usize], evaluate: &[usize]) -> Result<Vec<f64>, Error> {
        self.call(
            "probe",
            "a probe training",
            |py| PyTuple::new(py, [clients.to_vec(), evaluate.to_vec()]),
            |v| v.extract::<Vec<f64>>(),
        )
    }

    fn advance(&mut self, clients: &[usize], evaluate: &[usize]) -> Result<Vec<f64>, Error> {
        self.call(
            "advance",
            "an extra training step",
            |py| PyTuple::new(py, [clients.to_vec(), evaluate.to_vec()]),
            |v| v.extract::<Vec<f64>>(),
        )
    }

    fn local_updates(&mut self, clients: &[usize]) -> Result<Vec<Vec<f32>>, Error> {
        self.call(
            "updates",
            "local updates",
            |py| PyTuple::new(py, [clients.to_vec()]),
            |v| v.extract::<Vec<Vec<f32>>>(),
        )
    }

    fn noise_responses(
        &mut self,
        updates: &[Vec<f32>],
        batch: usize,
    ) -> Result<Vec<Vec<f64>>, Error> {
        self.call(
            "noise_responses",
            "noise responses",
            |py| {
                let u = updates.to_vec().into_pyobject(py)?;
                PyTuple::new(py, [u.into_any(), batch.into_pyobject(py)?.into_any()])
            },
            |v| v.extract::<Vec<Vec<f64>>>(),
        )
    }

    fn secure_gram(&mut self, clients: &[usize]) -> Result<Vec<Vec<f64>>, Error> {
        self.call(
            "gram",
            "secure Gram entries",
            |py| PyTuple::new(py, [clients.to_vec()]),
            |v| v.extract::<Vec<Vec<f64>>>(),
        )
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
        self.call(
            "gradients",
            "client gradients",
            |py| {
                let c = clients.to_vec().into_pyobject(py)?;
                PyTuple::new(py, [c.into_any(), scope.into_pyobject(py)?.into_any()])
            },
            |v| v.extract::<Vec<Vec<f32>>>(),
        )
    }
}

/// Adds `Selector` to the module.
pub fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_class::<PySelector>()
}
