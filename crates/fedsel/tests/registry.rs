//! A strategy registered by a program runs as a built-in one does: named in a config, with
//! its options from `[selection.params]`, checkpointed and resumed; the table refuses what
//! it cannot hold, naming it.

#[allow(dead_code)]
mod common;

use fedsel::aggregate::AggregationRule;
use fedsel::config::Config;
use fedsel::error::Error;
use fedsel::rng::Rng;
use fedsel::select::{self, ClientQuery, Feedback, RoundContext, Selection, Selector, registry};

/// The `stride` available clients from a rotating start: deterministic, with state (the
/// start) that a resume must restore.
struct Rotate {
    stride: usize,
    start: usize,
}

impl Selector for Rotate {
    fn name(&self) -> &'static str {
        "rotate"
    }

    fn select(
        &mut self,
        ctx: &RoundContext<'_>,
        _: &mut dyn ClientQuery,
        _: &mut Rng,
    ) -> Result<Selection, Error> {
        let n = ctx.available.len();
        let clients = (0..ctx.budget.min(n))
            .map(|i| ctx.available[(self.start + i * self.stride) % n])
            .collect::<std::collections::BTreeSet<_>>()
            .into_iter()
            .collect();
        Ok(Selection {
            clients,
            weights: None,
        })
    }

    fn observe(&mut self, f: &Feedback<'_>) {
        self.start += f.selected.len();
    }

    fn save(&self) -> serde_json::Value {
        serde_json::json!({ "start": self.start })
    }

    fn load(&mut self, state: &serde_json::Value) -> Result<(), Error> {
        self.start = state["start"].as_u64().unwrap_or(0) as usize;
        Ok(())
    }
}

fn register_rotate() {
    static ONCE: std::sync::Once = std::sync::Once::new();
    ONCE.call_once(|| {
        registry::register("rotate", AggregationRule::DataSize, |cfg| {
            let stride = cfg
                .params
                .get("stride")
                .and_then(|v| v.as_integer())
                .ok_or_else(|| {
                    fedsel::error::ConfigError::invalid(
                        "selection.params.stride",
                        "rotate needs a whole stride ≥ 1",
                    )
                })?;
            Ok(Box::new(Rotate {
                stride: stride.max(1) as usize,
                start: 0,
            }))
        })
        .unwrap();
    });
}

#[test]
fn a_registered_strategy_runs_with_its_params_and_resumes_exactly() {
    register_rotate();
    let exp = common::synthetic(&[
        "rounds=12",
        "checkpoint_every=4",
        "selection.strategy=\"rotate\"",
        "selection.params={stride=7}",
    ]);
    // `auto` resolves to the rule it was registered with.
    assert_eq!(exp.config.server.aggregation, AggregationRule::DataSize);
    let rows = common::run(&exp);
    // Round 0 starts at client 0 and takes every 7th of the 30 clients: 0, 7, 14, 21, 28,
    // 5 (35 mod 30) for K = 6.
    assert_eq!(rows[0].selected, [0, 5, 7, 14, 21, 28]);
    // Round 1 starts 6 further on: 6, 13, 20, 27, 4, 11.
    assert_eq!(rows[1].selected, [4, 6, 11, 13, 20, 27]);
    common::Resumed::run(&exp, 9, 8).assert_same("rotate");
    // The resolved config keeps the params, and reads back to the same hash.
    let text = exp.config.to_resolved_toml();
    assert!(text.contains("stride = 7"), "{text}");
}

#[test]
fn the_table_refuses_what_it_cannot_hold_by_name() {
    register_rotate();
    let err = |set: &[&str]| {
        let set: Vec<String> = set.iter().map(|s| s.to_string()).collect();
        Config::load(None, &set).unwrap_err().to_string()
    };
    // A built-in strategy gets no params: it would ignore them.
    let e = err(&[
        "selection.strategy=\"uniform\"",
        "selection.params={stride=2}",
    ]);
    assert!(
        e.contains("selection.params") && e.contains("uniform"),
        "{e}"
    );
    // An unknown name lists the table, registered strategies included.
    let e = err(&["selection.strategy=\"rotat\""]);
    assert!(
        e.contains("`rotat`") && e.contains("rotate") && e.contains("fedcor"),
        "{e}"
    );
    // A factory's own error names its key.
    let exp = common::synthetic(&["selection.strategy=\"rotate\""]);
    let e = select::build(&exp.config.selection)
        .err()
        .unwrap()
        .to_string();
    assert!(e.contains("selection.params.stride"), "{e}");
    // Names taken, unusable as directory names, or registered with `auto` are refused.
    for (name, rule) in [
        ("fedcor", AggregationRule::Mean),
        ("rotate", AggregationRule::Mean),
        ("my method", AggregationRule::Mean),
        ("fine", AggregationRule::Auto),
    ] {
        let e = registry::register(name, rule, |_| Ok(Box::new(select::uniform::Uniform)))
            .unwrap_err()
            .to_string();
        assert!(e.contains("selection.strategy"), "{name}: {e}");
    }
    assert!(registry::names().iter().any(|n| n == "rotate"));
}

/// Every available client from round 2 on: more than the budget, as a sampler that draws
/// each client independently can.
struct Overshoot;

impl Selector for Overshoot {
    fn name(&self) -> &'static str {
        "overshoot"
    }

    fn select(
        &mut self,
        ctx: &RoundContext<'_>,
        _: &mut dyn ClientQuery,
        _: &mut Rng,
    ) -> Result<Selection, Error> {
        let take = if ctx.round < 2 {
            ctx.budget
        } else {
            ctx.available.len()
        };
        Ok(Selection {
            clients: ctx.available[..take].to_vec(),
            weights: None,
        })
    }
}

/// A Rust selector is held to the budget as one written in Python is: more distinct clients
/// than K_t stop the run, naming the strategy, the round and the count, and the rounds
/// before it stand. Duplicates (sampling with replacement) count once.
#[test]
fn a_selection_over_the_budget_stops_the_run_naming_round_and_count() {
    static ONCE: std::sync::Once = std::sync::Once::new();
    ONCE.call_once(|| {
        registry::register("overshoot", AggregationRule::DataSize, |_| {
            Ok(Box::new(Overshoot))
        })
        .unwrap();
    });
    let exp = common::synthetic(&["rounds=5", "selection.strategy=\"overshoot\""]);
    let mut rows = common::Collect::default();
    let e = fedsel::engine::run(&exp, &mut rows)
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("overshoot")
            && e.contains("round 2")
            && e.contains("chose 30 distinct clients, over the round's budget K_t = 6"),
        "{e}"
    );
    assert_eq!(rows.0.len(), 2);
}
