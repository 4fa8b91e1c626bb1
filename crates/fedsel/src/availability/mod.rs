//! Client availability: which clients can be reached in a round, and the
//! communication budget K_t.
//!
//! Every model is a pure function of (seed, round, client): a client's draw in
//! round t comes from the stream keyed by (seed, Availability, t, k), and
//! per-run draws (log-normal rates) from the key (seed, Availability, RUN, k).
//! For a given seed every strategy therefore faces the same availability
//! (FedGS App. C), and a resumed run sees the rounds it would have seen.
//!
//! A model's options (e.g. [`fedgs::MdfConfig`]) are defined in its module, beside the
//! rates that read them, with their defaults and their part of
//! [`Config::validate`](crate::config::Config::validate); [`AvailabilityConfig`] names
//! each model by its `kind`.

pub mod always;
pub mod budget;
pub mod f3ast;
pub mod fedgs;
pub mod trace;

use rand::Rng as _;
use rand_distr::{Distribution, LogNormal};

use crate::error::Result;
use crate::rng::{Purpose, stream};
use budget::BudgetConfig;
use f3ast::{HomeDeviceConfig, ScarceConfig, SmartphonesConfig};
use fedgs::{LdfConfig, LnConfig, MdfConfig, SlnConfig, YcConfig, YmfConfig};
use serde::{Deserialize, Serialize};
use trace::TraceConfig;

/// Availability model: which clients can be reached in a round.
///
/// The FedGS modes follow FedGS Table 1 with β as their `beta`; the F3AST
/// models follow F3AST §4.1 and App. D.4. Log-normal parameters are the σ of
/// the underlying normal (numpy's `lognormal(0, σ)`). A model's options are
/// defined in its module under [`availability`](crate::availability).
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case", deny_unknown_fields)]
pub enum AvailabilityConfig {
    /// Every client, every round (FedGS IDL, F3AST Always).
    #[default]
    #[serde(alias = "idl")]
    Always,
    /// FedGS MoreDataFirst.
    Mdf(MdfConfig),
    /// FedGS LessDataFirst.
    Ldf(LdfConfig),
    /// FedGS YMaxFirst.
    Ymf(YmfConfig),
    /// FedGS YCycle.
    Yc(YcConfig),
    /// FedGS LogNormal.
    Ln(LnConfig),
    /// FedGS SinLogNormal.
    Sln(SlnConfig),
    /// F3AST Scarce.
    Scarce(ScarceConfig),
    /// F3AST HomeDevice.
    HomeDevice(HomeDeviceConfig),
    /// F3AST Uneven: q_k ∝ 1/p_k, scaled so that the largest is 1.
    Uneven,
    /// F3AST SmartPhones.
    Smartphones(SmartphonesConfig),
    /// A recorded trace.
    Trace(TraceConfig),
}

impl AvailabilityConfig {
    /// Short name, for labels.
    pub fn name(&self) -> &'static str {
        match self {
            Self::Always => "always",
            Self::Mdf { .. } => "mdf",
            Self::Ldf { .. } => "ldf",
            Self::Ymf { .. } => "ymf",
            Self::Yc { .. } => "yc",
            Self::Ln { .. } => "ln",
            Self::Sln { .. } => "sln",
            Self::Scarce { .. } => "scarce",
            Self::HomeDevice { .. } => "home_device",
            Self::Uneven => "uneven",
            Self::Smartphones { .. } => "smartphones",
            Self::Trace { .. } => "trace",
        }
    }
}

/// Round key of the per-run draws (never a real round).
const RUN: u64 = u64::MAX;

/// The clients a round can use.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RoundAvailability {
    /// Available clients, ascending.
    pub active: Vec<usize>,
    /// Budget K_t: how many the server may select.
    pub budget: usize,
}

/// Which clients are active in a round.
pub trait Availability: Send + Sync {
    /// The active clients of round `t`, ascending.
    fn active(&self, t: usize) -> Vec<usize>;
}

/// A model where each client is active independently with a probability that
/// may depend on the round (every FedGS Table 1 mode and F3AST model).
pub trait ActivityRate: Send + Sync {
    /// P(client k is active in round t), before the at-least-one redraw.
    fn rate(&self, t: usize, k: usize) -> f64;
}

/// What the simulated environment knows about the clients. Availability models
/// may depend on it (MDF, YMF, ...); selectors never see it through here.
#[derive(Debug, Clone)]
pub struct ClientInfo {
    /// Training-set size n_k.
    pub sizes: Vec<usize>,
    /// The distinct labels of each client's data (train and held-out), ascending.
    pub labels: Vec<Vec<usize>>,
    /// Number of labels in the task.
    pub classes: usize,
}

/// Fixed per-client rates (MDF, LDF, YMF, LN, Scarce, HomeDevice, Uneven).
#[derive(Debug, Clone)]
pub struct StaticRates(pub Vec<f64>);

impl ActivityRate for StaticRates {
    fn rate(&self, _t: usize, k: usize) -> f64 {
        self.0[k]
    }
}

/// `values / max(values)`, so that the most available client has rate 1.
pub(crate) fn scale_to_max(values: Vec<f64>) -> Vec<f64> {
    let max = values.iter().copied().fold(0.0, f64::max);
    if max > 0.0 {
        values.into_iter().map(|v| v / max).collect()
    } else {
        values
    }
}

/// T_k / max T with T_k ~ LogNormal(0, σ), one draw per client for the whole run.
pub(crate) fn lognormal_rates(clients: usize, sigma: f64, seed: u64) -> Vec<f64> {
    let dist = LogNormal::new(0.0, sigma).expect("σ is validated to be finite and >= 0");
    scale_to_max(
        (0..clients)
            .map(|k| dist.sample(&mut stream(seed, Purpose::Availability, RUN, k as u64)))
            .collect(),
    )
}

/// Independent Bernoulli activity with per-(round, client) rates. A pass that
/// leaves nobody active is redrawn (FedGS code), so a round always has a client
/// unless every rate is zero.
pub struct Independent {
    rates: Box<dyn ActivityRate>,
    clients: usize,
    seed: u64,
}

impl Independent {
    /// Wraps a rate model for `clients` clients.
    pub fn new(rates: Box<dyn ActivityRate>, clients: usize, seed: u64) -> Self {
        Self {
            rates,
            clients,
            seed,
        }
    }
}

impl Availability for Independent {
    fn active(&self, t: usize) -> Vec<usize> {
        let rates: Vec<f64> = (0..self.clients).map(|k| self.rates.rate(t, k)).collect();
        if rates.iter().all(|&r| r <= 0.0) {
            return Vec::new();
        }
        let mut rngs: Vec<_> = (0..self.clients)
            .map(|k| stream(self.seed, Purpose::Availability, t as u64, k as u64))
            .collect();
        loop {
            let active: Vec<usize> = rngs
                .iter_mut()
                .zip(&rates)
                .enumerate()
                .filter_map(|(k, (rng, &r))| (rng.random::<f64>() < r).then_some(k))
                .collect();
            if !active.is_empty() {
                return active;
            }
        }
    }
}

/// Availability and budget together: what the round loop asks each round.
pub struct Environment {
    model: Box<dyn Availability>,
    budget: budget::Budget,
}

impl Environment {
    /// Builds the availability model and budget a config names. A trace already read
    /// (`trace`) is used as it is; otherwise the one the config names is read.
    pub fn new(
        cfg: &AvailabilityConfig,
        budget: &BudgetConfig,
        per_round: usize,
        info: &ClientInfo,
        seed: u64,
        trace: Option<&trace::Trace>,
    ) -> Result<Self> {
        let n = info.sizes.len();
        let rates = |r: Box<dyn ActivityRate>| -> Box<dyn Availability> {
            Box::new(Independent::new(r, n, seed))
        };
        use AvailabilityConfig as A;
        let model: Box<dyn Availability> = match cfg {
            A::Always => Box::new(always::Always { clients: n }),
            A::Trace(t) => Box::new(match trace {
                Some(read) => read.clone(),
                None => trace::Trace::load(&t.trace, n)?,
            }),
            A::Mdf(_) | A::Ldf(_) | A::Ymf(_) | A::Yc(_) | A::Ln(_) | A::Sln(_) => {
                rates(fedgs::build(cfg, info, seed))
            }
            A::Scarce(_) | A::HomeDevice(_) | A::Uneven | A::Smartphones(_) => {
                rates(f3ast::build(cfg, info, seed))
            }
        };
        Ok(Self {
            model,
            budget: budget::Budget::new(budget.clone(), per_round, seed),
        })
    }

    /// Availability and budget of round `t`.
    pub fn round(&self, t: usize) -> RoundAvailability {
        RoundAvailability {
            active: self.model.active(t),
            budget: self.budget.at(t),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::f3ast::{HomeDeviceConfig, ScarceConfig, SmartphonesConfig};
    use super::fedgs::{LdfConfig, LnConfig, MdfConfig, SlnConfig, SlnPhase, YcConfig, YmfConfig};
    use super::*;

    fn info() -> ClientInfo {
        ClientInfo {
            sizes: (0..40).map(|k| 20 + 7 * k).collect(),
            labels: (0..40).map(|k| vec![k % 10, (k + 3) % 10]).collect(),
            classes: 10,
        }
    }

    /// Each model's empirical activity rate matches its formula within 5 standard
    /// errors. The at-least-one redraw is negligible here (40 clients).
    #[test]
    fn empirical_activity_rates_match_the_formulas() {
        let info = info();
        let rounds = 4800;
        let models = [
            AvailabilityConfig::Mdf(MdfConfig { beta: 0.7 }),
            AvailabilityConfig::Ldf(LdfConfig { beta: 0.7 }),
            AvailabilityConfig::Ymf(YmfConfig { beta: 0.9 }),
            AvailabilityConfig::Yc(YcConfig {
                beta: 0.9,
                period: None,
            }),
            AvailabilityConfig::Ln(LnConfig { beta: 0.5 }),
            AvailabilityConfig::Sln(SlnConfig {
                beta: 0.5,
                period: 24,
                phase: SlnPhase::Code,
            }),
            AvailabilityConfig::Scarce(ScarceConfig { q: 0.2 }),
            AvailabilityConfig::HomeDevice(HomeDeviceConfig { sigma: 0.5 }),
            AvailabilityConfig::Uneven,
            AvailabilityConfig::Smartphones(SmartphonesConfig {
                sigma: 0.25,
                period: 24,
            }),
        ];
        for cfg in models {
            let rates: Box<dyn ActivityRate> = match &cfg {
                AvailabilityConfig::Scarce(_)
                | AvailabilityConfig::HomeDevice(_)
                | AvailabilityConfig::Uneven
                | AvailabilityConfig::Smartphones(_) => f3ast::build(&cfg, &info, 7),
                _ => fedgs::build(&cfg, &info, 7),
            };
            let env = Environment::new(&cfg, &BudgetConfig::Constant, 5, &info, 7, None).unwrap();
            let mut counts = vec![0usize; 40];
            for t in 0..rounds {
                for k in env.round(t).active {
                    counts[k] += 1;
                }
            }
            for (k, &c) in counts.iter().enumerate() {
                let expected: f64 =
                    (0..rounds).map(|t| rates.rate(t, k)).sum::<f64>() / rounds as f64;
                let var: f64 = (0..rounds)
                    .map(|t| {
                        let r = rates.rate(t, k);
                        r * (1.0 - r)
                    })
                    .sum::<f64>();
                let se = var.sqrt() / rounds as f64;
                let f = c as f64 / rounds as f64;
                assert!(
                    (f - expected).abs() <= 5.0 * se + 1e-9,
                    "{}: client {k} active {f:.4} vs rate {expected:.4}",
                    cfg.name()
                );
            }
        }
    }

    #[test]
    fn availability_depends_only_on_seed_round_and_client() {
        let info = info();
        let cfg = AvailabilityConfig::Ln(LnConfig { beta: 0.5 });
        let a = Environment::new(&cfg, &BudgetConfig::Constant, 5, &info, 3, None).unwrap();
        let b = Environment::new(&cfg, &BudgetConfig::Constant, 9, &info, 3, None).unwrap();
        let c = Environment::new(&cfg, &BudgetConfig::Constant, 5, &info, 4, None).unwrap();
        assert_eq!(a.round(17).active, b.round(17).active);
        assert_ne!(
            (0..5).map(|t| a.round(t).active).collect::<Vec<_>>(),
            (0..5).map(|t| c.round(t).active).collect::<Vec<_>>()
        );
    }

    #[test]
    fn a_round_is_redrawn_until_someone_is_active() {
        let info = ClientInfo {
            sizes: vec![10, 10],
            labels: vec![vec![0], vec![1]],
            classes: 2,
        };
        let env = Environment::new(
            &AvailabilityConfig::Scarce(ScarceConfig { q: 0.05 }),
            &BudgetConfig::Constant,
            1,
            &info,
            1,
            None,
        )
        .unwrap();
        assert!((0..500).all(|t| !env.round(t).active.is_empty()));
    }
}
