//! Selectors written in Python: a class a config names (`py:module:Class`, constructed with
//! `[selection.params]`) or an object handed to `fedsel.run(selector=...)`, run by the
//! engine exactly where a built-in strategy runs (docs/your-selector.md).
//!
//! The crossing is one call a round with batched NumPy arrays: the context (`ctx`) of
//! `select` / `plan`, and the feedback of `observe`. The GIL is taken only for those calls
//! and released again while a query the selector makes (losses, probes, updates) runs in
//! the engine, so sweep cells with Python selectors still run side by side.

use std::cell::{Cell, RefCell};
use std::collections::HashSet;
use std::sync::{Mutex, OnceLock};

use pyo3::conversion::FromPyObjectOwned;
use pyo3::exceptions::PyKeyboardInterrupt;
use pyo3::prelude::*;
use pyo3::types::{PyBool, PyBytes, PyDict, PyFloat, PyString};

use fedsel::aggregate::AggregationRule;
use fedsel::error::{ConfigError, Error};
use fedsel::rng::Rng;
use fedsel::select::{
    ClientOrder, ClientQuery, Feedback, GradientScope, Needs, Planned, RoundContext, Selection,
    SelectionConfig, Selector, Setup, UpdateKind, UploadDropout, registry,
    weighted_without_replacement,
};

use crate::py_err;

/// Lets `fedsel.run`'s Python classes be named in configs as `py:module:Class`; called when
/// the extension is imported, so the package's `fedsel` command, `fedsel.run`, sweeps and
/// Ray workers all know them. Importing twice (a second interpreter) keeps the first.
pub(crate) fn register() {
    let _ = registry::register_family("py", AggregationRule::Mean, |cfg: &SelectionConfig| {
        Python::attach(|py| UserSelector::from_config(py, cfg))
            .map(|s| Box::new(s) as Box<dyn Selector>)
    });
}

/// A strategy name that lives as long as the process: [`Selector::name`] is `'static`.
/// Names are interned, so a notebook that runs one class a thousand times keeps one copy.
fn intern(name: String) -> &'static str {
    static NAMES: OnceLock<Mutex<HashSet<&'static str>>> = OnceLock::new();
    let mut names = NAMES
        .get_or_init(Default::default)
        .lock()
        .expect("the name table is never poisoned");
    if let Some(&n) = names.get(name.as_str()) {
        return n;
    }
    let leaked: &'static str = Box::leak(name.into_boxed_str());
    names.insert(leaked);
    leaked
}

/// `py:module:Class` for an object's class: how a run of it is named in configs, sweeps and
/// reports.
pub(crate) fn class_path(obj: &Bound<'_, PyAny>) -> PyResult<String> {
    let class = obj.get_type();
    let module: String = class.getattr("__module__")?.extract()?;
    let qualname: String = class.getattr("__qualname__")?.extract()?;
    Ok(format!("py:{module}:{qualname}"))
}

/// An exception as its traceback's text, the way Python prints it.
fn traceback(py: Python<'_>, e: &PyErr) -> String {
    py.import("traceback")
        .and_then(|tb| {
            tb.call_method1(
                "format_exception",
                (e.get_type(py), e.value(py), e.traceback(py)),
            )
        })
        .and_then(|lines| lines.extract::<Vec<String>>())
        .map_or_else(|_| e.to_string(), |lines| lines.concat())
        .trim_end()
        .to_string()
}

/// A value's `repr`, shortened for an error message.
fn shown(value: &Bound<'_, PyAny>) -> String {
    let r = value
        .repr()
        .map_or_else(|_| "<no repr>".into(), |r| r.to_string());
    if r.chars().count() > 200 {
        format!("{}…", r.chars().take(200).collect::<String>())
    } else {
        r
    }
}

/// What the server knows before round 0, kept as the arrays `ctx` shows.
struct Known {
    sizes: Py<PyAny>,
    weights: Py<PyAny>,
    durations: Option<Py<PyAny>>,
    per_round: usize,
    rounds: usize,
    classes: usize,
    num_params: usize,
    clients: usize,
}

/// A Python object that selects: the engine's [`Selector`], calling the object's `select`
/// (or `plan`), `observe`, `state` and `load_state`.
pub(crate) struct UserSelector {
    obj: Py<PyAny>,
    name: &'static str,
    needs: Needs,
    plans: bool,
    observes: bool,
    keeps_state: bool,
    setup: Option<Setup>,
    known: Option<Known>,
    /// An error of a hook that returns none (`observe`, `state`), until the engine asks.
    failure: RefCell<Option<Error>>,
}

impl UserSelector {
    /// The class `selection.strategy` names, constructed with `[selection.params]` as its
    /// keyword arguments.
    pub(crate) fn from_config(py: Python<'_>, cfg: &SelectionConfig) -> Result<Self, ConfigError> {
        let name = &cfg.strategy;
        let bad =
            |why: String| ConfigError::invalid("selection.strategy", format!("`{name}`: {why}"));
        let path = name.strip_prefix("py:").unwrap_or(name);
        let (module, class) = path.split_once(':').ok_or_else(|| {
            bad("name a class as `py:module:Class` (e.g. `py:my_selectors:Greedy`)".into())
        })?;
        let mut target = py
            .import(module)
            .map_err(|e| {
                bad(format!(
                    "cannot import module `{module}`: {}",
                    traceback(py, &e)
                ))
            })?
            .into_any();
        for part in class.split('.') {
            target = target
                .getattr(part)
                .map_err(|_| bad(format!("module `{module}` has no `{class}`")))?;
        }
        let kwargs = params(py, &cfg.params).map_err(|e| {
            ConfigError::invalid("selection.params", format!("cannot be read: {e}"))
        })?;
        let obj = target.call((), Some(&kwargs)).map_err(|e| {
            ConfigError::invalid(
                "selection.params",
                format!("`{name}`({}) raised: {}", shown(&kwargs), traceback(py, &e)),
            )
        })?;
        Self::new(&obj, name.clone())
    }

    /// An object the caller made; it is named by its class.
    pub(crate) fn from_object(obj: &Bound<'_, PyAny>) -> Result<Self, ConfigError> {
        let name = class_path(obj).map_err(|e| {
            ConfigError::invalid("selector", format!("its class has no module or name: {e}"))
        })?;
        Self::new(obj, name)
    }

    fn new(obj: &Bound<'_, PyAny>, name: String) -> Result<Self, ConfigError> {
        let bad =
            |why: String| ConfigError::invalid("selection.strategy", format!("`{name}`: {why}"));
        let callable = |attr: &str| obj.getattr(attr).is_ok_and(|a| a.is_callable());
        if !callable("select") && !callable("plan") {
            return Err(bad("the class has no `select(self, ctx)` method".into()));
        }
        if callable("state") != callable("load_state") {
            return Err(bad(
                "define both `state(self)` and `load_state(self, state)`, or neither".into(),
            ));
        }
        let needs = match obj.getattr("needs") {
            Ok(n) if !n.is_none() => parse_needs(&n).map_err(bad)?,
            _ => Needs::default(),
        };
        Ok(Self {
            obj: obj.clone().unbind(),
            name: intern(name),
            needs,
            plans: callable("plan"),
            observes: callable("observe"),
            keeps_state: callable("state"),
            setup: None,
            known: None,
            failure: RefCell::new(None),
        })
    }

    fn error(&self, round: usize, reason: String) -> Error {
        Error::Selection {
            selector: self.name.into(),
            round,
            reason,
        }
    }

    /// Keeps the first failure of a hook without a result.
    fn fail(&self, e: Error) {
        self.failure.borrow_mut().get_or_insert(e);
    }

    /// The arrays of the setup, made on the first round (the setup has no GIL to spare).
    fn known(&mut self, py: Python<'_>) -> PyResult<&Known> {
        if self.known.is_none() {
            let s = self.setup.as_ref().expect("set up before the first round");
            let np = py.import("numpy")?;
            self.known = Some(Known {
                sizes: ints(&np, s.sizes.iter().copied())?.unbind(),
                weights: floats(&np, &s.weights)?.unbind(),
                durations: s
                    .durations
                    .as_deref()
                    .map(|d| floats(&np, d).map(Bound::unbind))
                    .transpose()?,
                per_round: s.per_round,
                rounds: s.rounds,
                classes: s.classes,
                num_params: s.num_params,
                clients: s.sizes.len(),
            });
        }
        Ok(self.known.as_ref().expect("made above"))
    }

    /// Calls `select` or `plan` with the round's context and reads its answer.
    fn choose(
        &mut self,
        ctx: &RoundContext<'_>,
        query: &mut dyn ClientQuery,
        rng: &mut Rng,
    ) -> Result<Planned, Error> {
        let t = ctx.round;
        let method = if self.plans { "plan" } else { "select" };
        Python::attach(|py| {
            let made = (|| -> PyResult<_> {
                let np = py.import("numpy")?;
                let known = self.known(py)?;
                let stream = Bound::new(py, Stream::lend(rng, t))?;
                let asked = Bound::new(py, Query::lend(query, t))?;
                let kwargs = PyDict::new(py);
                kwargs.set_item("round", t)?;
                kwargs.set_item("available", ints(&np, ctx.available.iter().copied())?)?;
                kwargs.set_item("budget", ctx.budget)?;
                kwargs.set_item("clock_s", ctx.clock_s)?;
                kwargs.set_item("sizes", known.sizes.bind(py))?;
                kwargs.set_item("weights", known.weights.bind(py))?;
                kwargs.set_item("durations", known.durations.as_ref().map(|d| d.bind(py)))?;
                kwargs.set_item("per_round", known.per_round)?;
                kwargs.set_item("rounds", known.rounds)?;
                kwargs.set_item("classes", known.classes)?;
                kwargs.set_item("num_params", known.num_params)?;
                kwargs.set_item("clients", known.clients)?;
                kwargs.set_item("rng", &stream)?;
                kwargs.set_item("query", &asked)?;
                let ns = py
                    .import("types")?
                    .getattr("SimpleNamespace")?
                    .call((), Some(&kwargs))?;
                Ok((ns, stream, asked))
            })();
            let (ns, stream, asked) =
                made.map_err(|e| self.error(t, format!("building its context: {e}")))?;
            let answer = self.obj.bind(py).call_method1(method, (ns,));
            // What the round lent is taken back, whatever the call did with it.
            stream.borrow().rng.set(None);
            asked.borrow().query.set(None);
            let answer = answer.map_err(|e| {
                if e.is_instance_of::<PyKeyboardInterrupt>(py) {
                    Error::Interrupted { round: t }
                } else {
                    self.error(t, format!("{method}() raised:\n{}", traceback(py, &e)))
                }
            })?;
            let n = self.setup.as_ref().map_or(0, |s| s.sizes.len());
            read_choice(&answer, ctx, n).map_err(|why| {
                self.error(t, format!("{method}() returned {}: {why}", shown(&answer)))
            })
        })
    }
}

/// `needs` as the engine's [`Needs`]: `"updates"` (whole updates), `"output_layer"` (its
/// bias and weight) and `"losses"` (training losses, always given).
fn parse_needs(n: &Bound<'_, PyAny>) -> Result<Needs, String> {
    let items: Vec<String> = if n.is_instance_of::<PyString>() {
        vec![n.extract().map_err(|e| format!("`needs`: {e}"))?]
    } else {
        n.extract()
            .map_err(|_| format!("`needs` is {}: give a list of strings", shown(n)))?
    };
    let mut needs = Needs::default();
    for item in &items {
        let kind = match item.as_str() {
            "updates" => UpdateKind::Full,
            "output_layer" => UpdateKind::OutputLayer,
            "losses" => continue,
            other => {
                return Err(format!(
                    "`needs` holds `{other}`: use \"updates\", \"output_layer\" or \"losses\""
                ));
            }
        };
        if needs.updates != UpdateKind::None && needs.updates != kind {
            return Err("`needs` holds both \"updates\" and \"output_layer\": ask for one".into());
        }
        needs.updates = kind;
    }
    Ok(needs)
}

/// `[selection.params]` as the constructor's keyword arguments.
fn params<'py>(py: Python<'py>, table: &toml::Table) -> PyResult<Bound<'py, PyDict>> {
    let text = serde_json::to_string(table).map_err(py_err)?;
    Ok(py
        .import("json")?
        .call_method1("loads", (text,))?
        .cast_into::<PyDict>()?)
}

/// A read-only int64 array of `values`.
fn ints<'py>(
    np: &Bound<'py, PyModule>,
    values: impl Iterator<Item = usize>,
) -> PyResult<Bound<'py, PyAny>> {
    let bytes: Vec<u8> = values.flat_map(|v| (v as i64).to_ne_bytes()).collect();
    np.call_method1("frombuffer", (PyBytes::new(np.py(), &bytes), "int64"))
}

/// A read-only float64 array of `values`.
fn floats<'py>(np: &Bound<'py, PyModule>, values: &[f64]) -> PyResult<Bound<'py, PyAny>> {
    let bytes: Vec<u8> = values.iter().flat_map(|v| v.to_ne_bytes()).collect();
    np.call_method1("frombuffer", (PyBytes::new(np.py(), &bytes), "float64"))
}

/// A read-only float32 matrix, one row per vector (all of one length).
fn rows<'py>(np: &Bound<'py, PyModule>, vectors: &[Vec<f32>]) -> PyResult<Bound<'py, PyAny>> {
    let width = vectors.first().map_or(0, Vec::len);
    let bytes: Vec<u8> = vectors
        .iter()
        .flatten()
        .flat_map(|v| v.to_ne_bytes())
        .collect();
    np.call_method1("frombuffer", (PyBytes::new(np.py(), &bytes), "float32"))?
        .call_method1("reshape", (vectors.len(), width))
}

/// A float64 matrix of rows.
fn matrix<'py>(np: &Bound<'py, PyModule>, m: &[Vec<f64>]) -> PyResult<Bound<'py, PyAny>> {
    let width = m.first().map_or(0, Vec::len);
    let flat: Vec<f64> = m.iter().flatten().copied().collect();
    floats(np, &flat)?.call_method1("reshape", (m.len(), width))
}

/// One client id from Python: an int (or NumPy integer), never a float or a bool.
fn client_id(item: &Bound<'_, PyAny>) -> Result<i64, String> {
    if item.is_instance_of::<PyBool>() || item.is_instance_of::<PyFloat>() {
        return Err(format!("{} is not a client id (an int)", shown(item)));
    }
    item.extract::<i64>()
        .map_err(|_| format!("{} is not a client id (an int)", shown(item)))
}

/// The selection `select` / `plan` returned: a sequence of distinct available client ids
/// within the budget, or a dict of `clients` with optional `weights` (one per client, for
/// `server.aggregation = "selector"`) and `orders` (one per client: `None` or a dict of
/// `work`, `drop_smallest`, `drop_layers`).
fn read_choice(
    answer: &Bound<'_, PyAny>,
    ctx: &RoundContext<'_>,
    n: usize,
) -> Result<Planned, String> {
    if answer.is_none() {
        return Err("return a sequence of client ids".into());
    }
    let (clients, weights, orders) = match answer.cast::<PyDict>() {
        Ok(d) => {
            for key in d.keys() {
                let key: String = key.extract().unwrap_or_default();
                if !matches!(key.as_str(), "clients" | "weights" | "orders") {
                    return Err(format!(
                        "the dict holds `{key}`: its keys are clients, weights and orders"
                    ));
                }
            }
            let clients = d
                .get_item("clients")
                .map_err(|e| e.to_string())?
                .ok_or("the dict has no `clients`")?;
            let weights = d.get_item("weights").map_err(|e| e.to_string())?;
            let orders = d.get_item("orders").map_err(|e| e.to_string())?;
            (clients, weights, orders)
        }
        Err(_) => (answer.clone(), None, None),
    };
    if clients.is_instance_of::<PyString>() || clients.is_none() {
        return Err("return a sequence of client ids".into());
    }
    let items = clients
        .try_iter()
        .map_err(|_| "return a sequence of client ids".to_string())?;
    let mut chosen = Vec::new();
    for item in items {
        let item = item.map_err(|e| e.to_string())?;
        let k = client_id(&item)?;
        let k = usize::try_from(k).ok().filter(|&k| k < n).ok_or_else(|| {
            format!(
                "client {k} is out of range: the clients are 0..{}",
                n.saturating_sub(1)
            )
        })?;
        if chosen.contains(&k) {
            return Err(format!("client {k} is chosen twice"));
        }
        if ctx.available.binary_search(&k).is_err() {
            return Err(format!("client {k} is not available in this round"));
        }
        chosen.push(k);
    }
    if chosen.len() > ctx.budget {
        return Err(format!(
            "{} clients, over the round's budget K_t = {}",
            chosen.len(),
            ctx.budget
        ));
    }
    let weights = weights
        .filter(|w| !w.is_none())
        .map(|w| {
            let w: Vec<f64> = sequence("weights", &w, "floats").map_err(|e| e.to_string())?;
            if w.len() != chosen.len() || w.iter().any(|x| !x.is_finite() || *x < 0.0) {
                return Err(format!(
                    "`weights` has {} values for {} clients: give one finite weight ≥ 0 per client",
                    w.len(),
                    chosen.len()
                ));
            }
            Ok(w)
        })
        .transpose()?;
    let orders = orders
        .filter(|o| !o.is_none())
        .map(|o| read_orders(&o, chosen.len()))
        .transpose()?;
    Ok(Planned {
        selection: Selection {
            clients: chosen,
            weights,
        },
        orders,
    })
}

/// `orders`: one per client, `None` (the run's own work, a whole upload) or a dict.
fn read_orders(o: &Bound<'_, PyAny>, clients: usize) -> Result<Vec<ClientOrder>, String> {
    let list: Vec<Bound<'_, PyAny>> =
        sequence("orders", o, "orders, one per client").map_err(|e| e.to_string())?;
    if list.len() != clients {
        return Err(format!(
            "`orders` has {} entries for {clients} clients",
            list.len()
        ));
    }
    list.iter()
        .map(|entry| {
            if entry.is_none() {
                return Ok(ClientOrder::FULL);
            }
            let d = entry
                .cast::<PyDict>()
                .map_err(|_| format!("the order {} is not a dict", shown(entry)))?;
            let mut order = ClientOrder::FULL;
            for (key, value) in d.iter() {
                let key: String = key.extract().unwrap_or_default();
                let x: f64 = value
                    .extract()
                    .map_err(|_| format!("order `{key}` is {}: give a number", shown(&value)))?;
                match key.as_str() {
                    "work" => order.work = x,
                    "drop_smallest" => order.dropout = Some(UploadDropout::Smallest(x)),
                    "drop_layers" => order.dropout = Some(UploadDropout::Layers(x)),
                    other => {
                        return Err(format!(
                            "an order holds `{other}`: its keys are work, drop_smallest and drop_layers"
                        ));
                    }
                }
            }
            Ok(order)
        })
        .collect()
}

impl Selector for UserSelector {
    fn name(&self) -> &'static str {
        self.name
    }

    fn needs(&self) -> Needs {
        self.needs
    }

    fn setup(&mut self, setup: &Setup) {
        self.setup = Some(setup.clone());
        self.known = None;
    }

    fn select(
        &mut self,
        ctx: &RoundContext<'_>,
        query: &mut dyn ClientQuery,
        rng: &mut Rng,
    ) -> Result<Selection, Error> {
        self.choose(ctx, query, rng).map(|p| p.selection)
    }

    fn plan(
        &mut self,
        ctx: &RoundContext<'_>,
        query: &mut dyn ClientQuery,
        rng: &mut Rng,
    ) -> Result<Planned, Error> {
        self.choose(ctx, query, rng)
    }

    fn observe(&mut self, f: &Feedback<'_>) {
        if !self.observes {
            return;
        }
        let outcome = Python::attach(|py| -> PyResult<()> {
            let np = py.import("numpy")?;
            let kwargs = PyDict::new(py);
            kwargs.set_item("round", f.round)?;
            kwargs.set_item("clients", ints(&np, f.selected.iter().copied())?)?;
            kwargs.set_item("train_losses", floats(&np, f.train_losses)?)?;
            kwargs.set_item("updates", f.updates.map(|u| rows(&np, u)).transpose()?)?;
            kwargs.set_item(
                "durations",
                f.durations.map(|d| floats(&np, d)).transpose()?,
            )?;
            let ns = py.import("types")?.getattr("SimpleNamespace")?;
            let dropped = f
                .dropped
                .map(|d| -> PyResult<_> {
                    let k = PyDict::new(py);
                    k.set_item("clients", ints(&np, d.clients.iter().copied())?)?;
                    k.set_item("at_least_s", floats(&np, d.at_least_s)?)?;
                    ns.call((), Some(&k))
                })
                .transpose()?;
            kwargs.set_item("dropped", dropped)?;
            let feedback = ns.call((), Some(&kwargs))?;
            self.obj
                .bind(py)
                .call_method1("observe", (feedback,))
                .map(drop)
        });
        if let Err(e) = outcome {
            let reason = Python::attach(|py| traceback(py, &e));
            self.fail(self.error(f.round, format!("observe() raised:\n{reason}")));
        }
    }

    fn save(&self) -> serde_json::Value {
        if !self.keeps_state {
            return serde_json::json!({ "stateless": self.name });
        }
        let saved = Python::attach(|py| -> PyResult<String> {
            let state = self.obj.bind(py).call_method0("state")?;
            let kwargs = PyDict::new(py);
            kwargs.set_item("allow_nan", false)?;
            py.import("json")?
                .call_method("dumps", (state,), Some(&kwargs))?
                .extract()
        })
        .map_err(|e| {
            let reason = Python::attach(|py| traceback(py, &e));
            format!("state() gave no JSON (a dict of lists, numbers and strings, no NaN): {reason}")
        })
        .and_then(|text| {
            serde_json::from_str::<serde_json::Value>(&text).map_err(|e| e.to_string())
        });
        match saved {
            Ok(v) => serde_json::json!({ "python": v }),
            Err(reason) => {
                self.fail(self.error(0, reason));
                serde_json::Value::Null
            }
        }
    }

    fn load(&mut self, state: &serde_json::Value) -> Result<(), Error> {
        if let Some(v) = state.get("python").filter(|_| self.keeps_state) {
            return Python::attach(|py| -> PyResult<()> {
                let value = py.import("json")?.call_method1("loads", (v.to_string(),))?;
                self.obj
                    .bind(py)
                    .call_method1("load_state", (value,))
                    .map(drop)
            })
            .map_err(|e| {
                let reason = Python::attach(|py| traceback(py, &e));
                self.error(0, format!("load_state() raised:\n{reason}"))
            });
        }
        Err(self.error(
            0,
            if state.get("stateless").is_some() {
                "cannot resume: the class defines no `state(self)` and `load_state(self, state)`, so what it learned before the checkpoint is lost. Define them (docs/your-selector.md), or run again from round 0 (overwrite)".into()
            } else {
                "cannot resume: the checkpoint holds no state of a Python selector (was it written by another strategy?)".into()
            },
        ))
    }

    fn take_failure(&mut self) -> Option<Error> {
        self.failure.get_mut().take()
    }
}

/// The round's own selection stream, lent to Python for one call of `select` / `plan`: the
/// draws the built-in strategies make, so a Python strategy can make the same ones.
#[pyclass(unsendable, module = "fedsel", name = "SelectionStream")]
pub(crate) struct Stream {
    rng: Cell<Option<*mut Rng>>,
    round: usize,
}

impl Stream {
    fn lend(rng: &mut Rng, round: usize) -> Self {
        Self {
            rng: Cell::new(Some(rng as *mut Rng)),
            round,
        }
    }

    fn with<R>(&self, f: impl FnOnce(&mut Rng) -> R) -> PyResult<R> {
        let p = self.rng.get().ok_or_else(|| {
            py_err(format!(
                "ctx.rng of round {} is used after its round: draw inside select() or plan()",
                self.round
            ))
        })?;
        // SAFETY: the pointer is set only while the engine's `&mut Rng` for this round is
        // lent to the Python call (`UserSelector::choose` clears it when the call returns),
        // and the class is unsendable, so no other thread holds it.
        Ok(f(unsafe { &mut *p }))
    }
}

/// A sequence from Python as a `Vec`: a list, a tuple or a NumPy array (which PyO3 does
/// not take as a sequence, hence its `tolist`).
fn sequence<'py, T: FromPyObjectOwned<'py>>(
    name: &str,
    values: &Bound<'py, PyAny>,
    what: &str,
) -> PyResult<Vec<T>> {
    let values = match values.getattr("tolist") {
        Ok(tolist) if !values.is_instance_of::<PyString>() => tolist.call0()?,
        _ => values.clone(),
    };
    values.extract().map_err(|_| {
        py_err(format!(
            "`{name}` is {}: give a sequence of {what}",
            shown(&values)
        ))
    })
}

/// Items given as client ids, for the draws.
fn items(name: &str, values: &Bound<'_, PyAny>) -> PyResult<Vec<usize>> {
    let raw: Vec<i64> = sequence(name, values, "ints")?;
    raw.into_iter()
        .map(|v| usize::try_from(v).map_err(|_| py_err(format!("`{name}` holds {v}: ids are ≥ 0"))))
        .collect()
}

#[pymethods]
impl Stream {
    /// `k` distinct entries of `items`, uniformly: the draw of the built-in `uniform`
    /// (`rand::seq::index::sample`).
    fn sample(&self, items: &Bound<'_, PyAny>, k: usize) -> PyResult<Vec<usize>> {
        let items = self::items("items", items)?;
        if k > items.len() {
            return Err(py_err(format!(
                "sample(k={k}) of {} items: k is at most the number of items",
                items.len()
            )));
        }
        self.with(|rng| {
            rand::seq::index::sample(rng, items.len(), k)
                .into_iter()
                .map(|i| items[i])
                .collect()
        })
    }

    /// `k` distinct entries of `items` drawn one at a time with probability ∝ `weights`,
    /// renormalised after each draw: the draw of the built-in `powd` (numpy's
    /// `choice(replace=False, p=...)`).
    fn weighted_sample(
        &self,
        items: &Bound<'_, PyAny>,
        weights: &Bound<'_, PyAny>,
        k: usize,
    ) -> PyResult<Vec<usize>> {
        let items = self::items("items", items)?;
        let weights: Vec<f64> = sequence("weights", weights, "floats")?;
        if weights.len() != items.len() || weights.iter().any(|w| !w.is_finite() || *w < 0.0) {
            return Err(py_err(format!(
                "weighted_sample: {} weights for {} items; give one finite weight ≥ 0 per item",
                weights.len(),
                items.len()
            )));
        }
        if k > items.len() {
            return Err(py_err(format!(
                "weighted_sample(k={k}) of {} items: k is at most the number of items",
                items.len()
            )));
        }
        self.with(|rng| weighted_without_replacement(&items, &weights, k, rng))
    }

    /// A float in [0, 1).
    fn random(&self) -> PyResult<f64> {
        self.with(rand::Rng::random::<f64>)
    }

    /// An int in [low, high).
    fn integers(&self, low: i64, high: i64) -> PyResult<i64> {
        if low >= high {
            return Err(py_err(format!(
                "integers({low}, {high}): low must be below high"
            )));
        }
        self.with(|rng| rand::Rng::random_range(rng, low..high))
    }

    /// A `numpy.random.Generator` seeded with one draw of this stream: NumPy's whole
    /// toolbox, still reproducible and equal on resume.
    fn numpy<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyAny>> {
        let seed = self.with(rand::Rng::random::<u64>)?;
        py.import("numpy")?
            .getattr("random")?
            .call_method1("default_rng", (seed,))
    }
}

/// The engine's query, lent to Python for one call of `select` / `plan`.
#[pyclass(unsendable, module = "fedsel", name = "ClientQuery")]
pub(crate) struct Query {
    query: Cell<Option<*mut (dyn ClientQuery + 'static)>>,
    round: usize,
}

/// The lent query, carried across a GIL release: the engine's own thread answers it.
struct Lent(*mut (dyn ClientQuery + 'static));
// SAFETY: the query is used by the thread that lent it, with the GIL released only for the
// duration of the call; nothing else holds the pointer then.
unsafe impl Send for Lent {}

impl Query {
    fn lend(query: &mut dyn ClientQuery, round: usize) -> Self {
        let p: *mut (dyn ClientQuery + '_) = query;
        // SAFETY: only the lifetime is erased; `UserSelector::choose` clears the pointer
        // when the call it was lent to returns, before the borrow ends.
        let p: *mut (dyn ClientQuery + 'static) = unsafe { std::mem::transmute(p) };
        Self {
            query: Cell::new(Some(p)),
            round,
        }
    }

    /// Runs `f` on the engine's query with the GIL released (a probe trains clients).
    fn ask<R: Send>(
        &self,
        py: Python<'_>,
        f: impl FnOnce(&mut dyn ClientQuery) -> Result<R, Error> + Send,
    ) -> PyResult<R> {
        let p = self.query.get().ok_or_else(|| {
            py_err(format!(
                "ctx.query of round {} is used after its round: ask inside select() or plan()",
                self.round
            ))
        })?;
        let lent = Lent(p);
        py.detach(move || {
            let lent = lent;
            // SAFETY: see `Lent`.
            f(unsafe { &mut *lent.0 })
        })
        .map_err(py_err)
    }
}

#[pymethods]
impl Query {
    /// The global model's loss on each client's held-out data (Pow-d, FedCor, AFL): a
    /// broadcast, an evaluation and a report each.
    fn losses<'py>(
        &self,
        py: Python<'py>,
        clients: &Bound<'py, PyAny>,
    ) -> PyResult<Bound<'py, PyAny>> {
        let c = items("clients", clients)?;
        let l = self.ask(py, move |q| q.holdout_losses(&c))?;
        floats(&py.import("numpy")?, &l)
    }

    /// The global model's loss on one random mini-batch of each client's training data.
    fn minibatch_losses<'py>(
        &self,
        py: Python<'py>,
        clients: &Bound<'py, PyAny>,
    ) -> PyResult<Bound<'py, PyAny>> {
        let c = items("clients", clients)?;
        let l = self.ask(py, move |q| q.minibatch_losses(&c))?;
        floats(&py.import("numpy")?, &l)
    }

    /// A probe round (FedCor Alg. 2 lines 4-8): `train` train from the global model, their
    /// models are aggregated, and the probe model's held-out loss on each of `evaluate`
    /// comes back; the probe model is discarded.
    fn probe<'py>(
        &self,
        py: Python<'py>,
        train: &Bound<'py, PyAny>,
        evaluate: &Bound<'py, PyAny>,
    ) -> PyResult<Bound<'py, PyAny>> {
        let (t, e) = (items("train", train)?, items("evaluate", evaluate)?);
        let l = self.ask(py, move |q| q.probe(&t, &e))?;
        floats(&py.import("numpy")?, &l)
    }

    /// An extra real training step inside the round (FedGP Alg. 2 line 5): the global model
    /// advances, and its held-out loss on each of `evaluate` comes back.
    fn advance<'py>(
        &self,
        py: Python<'py>,
        train: &Bound<'py, PyAny>,
        evaluate: &Bound<'py, PyAny>,
    ) -> PyResult<Bound<'py, PyAny>> {
        let (t, e) = (items("train", train)?, items("evaluate", evaluate)?);
        let l = self.ask(py, move |q| q.advance(&t, &e))?;
        floats(&py.import("numpy")?, &l)
    }

    /// Each client's update x_k − w, trained from the global model and uploaded: a
    /// float32 matrix, one row per client.
    fn updates<'py>(
        &self,
        py: Python<'py>,
        clients: &Bound<'py, PyAny>,
    ) -> PyResult<Bound<'py, PyAny>> {
        let c = items("clients", clients)?;
        let u = self.ask(py, move |q| q.local_updates(&c))?;
        rows(&py.import("numpy")?, &u)
    }

    /// Each client's gradient of the global model's mean training loss, over all its
    /// examples (`scope="full"`) or one mini-batch (`"minibatch"`).
    #[pyo3(signature = (clients, scope="full"))]
    fn gradients<'py>(
        &self,
        py: Python<'py>,
        clients: &Bound<'py, PyAny>,
        scope: &str,
    ) -> PyResult<Bound<'py, PyAny>> {
        let scope = match scope {
            "full" => GradientScope::Full,
            "minibatch" => GradientScope::Minibatch,
            other => {
                return Err(py_err(format!(
                    "gradients(scope=\"{other}\"): use \"full\" or \"minibatch\""
                )));
            }
        };
        let c = items("clients", clients)?;
        let g = self.ask(py, move |q| q.gradients(&c, scope))?;
        rows(&py.import("numpy")?, &g)
    }

    /// The Gram matrix of the clients' private features by the secure scalar product
    /// protocol (FedGS App. D): the server learns dot products, never a feature.
    fn gram<'py>(
        &self,
        py: Python<'py>,
        clients: &Bound<'py, PyAny>,
    ) -> PyResult<Bound<'py, PyAny>> {
        let c = items("clients", clients)?;
        let g = self.ask(py, move |q| q.secure_gram(&c))?;
        matrix(&py.import("numpy")?, &g)
    }
}
