//! The strategies a config may name: every built-in one, and those a program registers
//! before it runs (a crate that depends on fedsel, with its own `main`; see the example
//! under `examples/ucb-cs`). [`build`](super::build) and the config's check of
//! `selection.strategy` both read this one table, so a registered strategy runs everywhere
//! a built-in one does: `run`, `sweep`, `report`, `results`, checkpoints and resume.
//!
//! The built-ins register the same way, through [`Strategy`] entries made here; nothing
//! else in the engine knows their names.

use std::collections::BTreeMap;
use std::sync::{Arc, OnceLock, RwLock};

use super::{
    SelectionConfig, Selector, afl, clustered, divfl, f3ast, fedbalancer, fedcor, fedcs, fedgs,
    hics, md, oort, powd, pyramidfl, refl, tifl, uniform,
};
use crate::aggregate::AggregationRule;
use crate::error::ConfigError;

/// Makes a strategy's selector from the `[selection]` table (its own sub-table, or
/// `selection.params` for a registered one).
pub type Factory =
    Arc<dyn Fn(&SelectionConfig) -> Result<Box<dyn Selector>, ConfigError> + Send + Sync>;

/// One strategy of the table.
#[derive(Clone)]
pub struct Strategy {
    /// How its selector is made.
    pub factory: Factory,
    /// The aggregation rule `server.aggregation = "auto"` gives it: its paper's.
    pub aggregation: AggregationRule,
    /// Whether fedsel ships it (a registered one reads `selection.params`; a built-in one
    /// refuses them).
    pub builtin: bool,
}

fn table() -> &'static RwLock<BTreeMap<String, Strategy>> {
    static TABLE: OnceLock<RwLock<BTreeMap<String, Strategy>>> = OnceLock::new();
    TABLE.get_or_init(|| RwLock::new(builtins()))
}

/// Adds a strategy under `name`, which configs then name as `selection.strategy`; its
/// options come from `[selection.params]` ([`SelectionConfig::params`]). `aggregation` is
/// the rule `server.aggregation = "auto"` resolves to for it. A name already in the table
/// (built-in or registered) is refused, as is one that is not a plain identifier (letters,
/// digits, `-` and `_`): it also names run and sweep directories.
pub fn register<F>(name: &str, aggregation: AggregationRule, factory: F) -> Result<(), ConfigError>
where
    F: Fn(&SelectionConfig) -> Result<Box<dyn Selector>, ConfigError> + Send + Sync + 'static,
{
    let plain = !name.is_empty()
        && name
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '_');
    if !plain {
        return Err(ConfigError::invalid(
            "selection.strategy",
            format!("`{name}` cannot be registered: use letters, digits, `-` and `_`"),
        ));
    }
    if matches!(aggregation, AggregationRule::Auto) {
        return Err(ConfigError::invalid(
            "selection.strategy",
            format!("`{name}`: register it with its own aggregation rule, not `auto`"),
        ));
    }
    let mut t = table()
        .write()
        .expect("the strategy table is never poisoned");
    if t.contains_key(name) {
        return Err(ConfigError::invalid(
            "selection.strategy",
            format!("`{name}` is already a strategy: register yours under another name"),
        ));
    }
    t.insert(
        name.to_string(),
        Strategy {
            factory: Arc::new(factory),
            aggregation,
            builtin: false,
        },
    );
    Ok(())
}

/// Families of strategies named `prefix:rest`, whose factory reads `rest` from
/// `selection.strategy` itself: the Python package registers `py`, so that
/// `py:my_package.module:MySelector` names a class to import and construct.
fn families() -> &'static RwLock<BTreeMap<String, (Factory, AggregationRule)>> {
    static FAMILIES: OnceLock<RwLock<BTreeMap<String, (Factory, AggregationRule)>>> =
        OnceLock::new();
    FAMILIES.get_or_init(|| RwLock::new(BTreeMap::new()))
}

/// Adds a family of strategies: every `selection.strategy` of the form `prefix:rest` is
/// made by `factory`, which reads the whole name (and `[selection.params]`) from the
/// `[selection]` table it is given. `aggregation` is the rule `auto` resolves to for each.
/// A prefix registered twice is refused.
pub fn register_family<F>(
    prefix: &str,
    aggregation: AggregationRule,
    factory: F,
) -> Result<(), ConfigError>
where
    F: Fn(&SelectionConfig) -> Result<Box<dyn Selector>, ConfigError> + Send + Sync + 'static,
{
    let plain = !prefix.is_empty() && prefix.chars().all(|c| c.is_ascii_alphanumeric());
    if !plain || matches!(aggregation, AggregationRule::Auto) {
        return Err(ConfigError::invalid(
            "selection.strategy",
            format!(
                "family `{prefix}:` cannot be registered: use letters and digits, and a rule other than `auto`"
            ),
        ));
    }
    let mut f = families()
        .write()
        .expect("the family table is never poisoned");
    if f.contains_key(prefix) {
        return Err(ConfigError::invalid(
            "selection.strategy",
            format!("family `{prefix}:` is already registered"),
        ));
    }
    f.insert(prefix.to_string(), (Arc::new(factory), aggregation));
    Ok(())
}

/// The strategy named `name`, if the table has it or a registered family makes it.
pub fn get(name: &str) -> Option<Strategy> {
    if let Some(s) = table()
        .read()
        .expect("the strategy table is never poisoned")
        .get(name)
    {
        return Some(s.clone());
    }
    let (prefix, rest) = name.split_once(':')?;
    if rest.is_empty() {
        return None;
    }
    families()
        .read()
        .expect("the family table is never poisoned")
        .get(prefix)
        .map(|(factory, aggregation)| Strategy {
            factory: factory.clone(),
            aggregation: *aggregation,
            builtin: false,
        })
}

/// Why `name` names no strategy, for the config error: a `py:` name run by a binary
/// without Python says how to get the one that has it.
pub fn unknown(name: &str) -> String {
    if name.starts_with("py:") && get("py:x").is_none() {
        return format!(
            "`{name}` is a selector written in Python, and this fedsel has no Python: install the Python package (`pip install ./python` in fedsel's repository) and run its `fedsel` command, or `fedsel.run(...)` from Python (docs/your-selector.md)"
        );
    }
    format!(
        "unknown strategy `{name}`: the strategies are {}{}",
        names().join(", "),
        if families().read().map_or(true, |f| f.is_empty()) {
            String::new()
        } else {
            ", or a Python class as `py:module:Class`".into()
        }
    )
}

/// Every name in the table, in order.
pub fn names() -> Vec<String> {
    table()
        .read()
        .expect("the strategy table is never poisoned")
        .keys()
        .cloned()
        .collect()
}

/// The built-in strategies: the default table.
fn builtins() -> BTreeMap<String, Strategy> {
    let mut t = BTreeMap::new();
    let mut add = |name: &str, aggregation: AggregationRule, factory: Factory| {
        t.insert(
            name.to_string(),
            Strategy {
                factory,
                aggregation,
                builtin: true,
            },
        );
    };
    use AggregationRule::{DataSize, Mean, Selector as Own};
    add(
        "uniform",
        Mean,
        Arc::new(|_| Ok(Box::new(uniform::Uniform))),
    );
    add(
        "md",
        Mean,
        Arc::new(|c| Ok(Box::new(md::MdSampling::new(c.md.clone())))),
    );
    for (name, source) in [
        ("powd", powd::LossSource::Holdout),
        ("cpowd", powd::LossSource::MiniBatch),
        ("rpowd", powd::LossSource::Stale),
    ] {
        add(
            name,
            Mean,
            Arc::new(move |c| Ok(Box::new(powd::PowerOfChoice::new(c.powd.clone(), source)))),
        );
    }
    add(
        "afl",
        Mean,
        Arc::new(|c| Ok(Box::new(afl::ActiveFl::new(c.afl.clone())))),
    );
    for (name, variant) in [
        ("fedcor", fedcor::Variant::FedCor),
        ("fedgp", fedcor::Variant::FedGp),
    ] {
        add(
            name,
            Mean,
            Arc::new(move |c| Ok(Box::new(fedcor::FedCor::new(c.fedcor.clone(), variant)))),
        );
    }
    add(
        "fedgs",
        DataSize,
        Arc::new(|c| Ok(Box::new(fedgs::FedGs::new(c.fedgs.clone())))),
    );
    add(
        "f3ast",
        Own,
        Arc::new(|c| Ok(Box::new(f3ast::F3ast::new(c.f3ast.clone())))),
    );
    add(
        "hics",
        Mean,
        Arc::new(|c| {
            Ok(Box::new(
                hics::Hics::new(c.hics.clone()).with_ward_distances(c.ward_distances),
            ))
        }),
    );
    add(
        "cs1",
        Mean,
        Arc::new(|_| {
            Ok(Box::new(clustered::ClusteredSampling::new(
                clustered::Variant::Sizes,
            )))
        }),
    );
    add(
        "cs2",
        Mean,
        Arc::new(|c| {
            Ok(Box::new(
                clustered::ClusteredSampling::new(clustered::Variant::Similarity)
                    .with_ward_distances(c.ward_distances),
            ))
        }),
    );
    add(
        "divfl",
        DataSize,
        Arc::new(|c| Ok(Box::new(divfl::DivFl::new(c.divfl.clone())))),
    );
    add(
        "oort",
        Mean,
        Arc::new(|c| Ok(Box::new(oort::Oort::new(c.oort.clone())))),
    );
    add(
        "fedcs",
        Mean,
        Arc::new(|c| Ok(Box::new(fedcs::FedCs::new(c.fedcs.clone())))),
    );
    add(
        "tifl",
        Mean,
        Arc::new(|c| Ok(Box::new(tifl::Tifl::new(c.tifl.clone())))),
    );
    add(
        "refl",
        Mean,
        Arc::new(|c| Ok(Box::new(refl::Refl::new(c.refl.clone())))),
    );
    add(
        "fedbalancer",
        Mean,
        Arc::new(|c| {
            Ok(Box::new(fedbalancer::FedBalancer::new(
                c.fedbalancer.clone(),
                c.oort.clone(),
            )))
        }),
    );
    add(
        "pyramidfl",
        Mean,
        Arc::new(|c| Ok(Box::new(pyramidfl::PyramidFl::new(c.pyramidfl.clone())))),
    );
    t
}
