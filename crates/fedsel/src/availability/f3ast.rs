//! F3AST's availability models (F3AST §4.1, App. D.4; decisions.md).

use std::f64::consts::PI;

use serde::{Deserialize, Serialize};

use super::AvailabilityConfig;
use super::{ActivityRate, ClientInfo, StaticRates, lognormal_rates, scale_to_max};
use crate::error::ConfigError;
use crate::validate::{check, check_prob};

/// F3AST Scarce: every client with probability q.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct ScarceConfig {
    /// q.
    pub q: f64,
}

impl Default for ScarceConfig {
    fn default() -> Self {
        Self { q: 0.2 }
    }
}

impl ScarceConfig {
    /// Rejects values no run can use, naming the key: this model's part of
    /// [`Config::validate`](crate::config::Config::validate).
    pub(crate) fn validate(&self) -> Result<(), ConfigError> {
        check_prob(self.q, "availability.q", true, false)
    }
}

/// F3AST HomeDevice: q_k = T_k / max T, T_k ~ LogNormal(0, σ) drawn once.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct HomeDeviceConfig {
    /// σ.
    pub sigma: f64,
}

impl Default for HomeDeviceConfig {
    fn default() -> Self {
        Self { sigma: 0.5 }
    }
}

impl HomeDeviceConfig {
    /// Rejects values no run can use, naming the key: this model's part of
    /// [`Config::validate`](crate::config::Config::validate).
    pub(crate) fn validate(&self) -> Result<(), ConfigError> {
        check(
            self.sigma.is_finite() && self.sigma >= 0.0,
            "availability.sigma",
            "must be >= 0",
        )
    }
}

/// F3AST SmartPhones: f_t · q_k with q_k as HomeDevice and
/// f_t = 0.4 sin(2π (t mod T)/T) + 0.5.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct SmartphonesConfig {
    /// σ of the log-normal q_k.
    pub sigma: f64,
    /// Period T in rounds.
    pub period: usize,
}

impl Default for SmartphonesConfig {
    fn default() -> Self {
        Self {
            sigma: 0.25,
            period: 24,
        }
    }
}

impl SmartphonesConfig {
    /// Rejects values no run can use, naming the key: this model's part of
    /// [`Config::validate`](crate::config::Config::validate).
    pub(crate) fn validate(&self) -> Result<(), ConfigError> {
        check(
            self.sigma.is_finite() && self.sigma >= 0.0,
            "availability.sigma",
            "must be >= 0",
        )?;
        check(self.period > 0, "availability.period", "must be at least 1")
    }
}

/// SmartPhones: f_t · q_k with f_t = 0.4 sin(2π (t mod T)/T) + 0.5.
struct Smartphones {
    q: Vec<f64>,
    period: usize,
}

impl ActivityRate for Smartphones {
    fn rate(&self, t: usize, k: usize) -> f64 {
        let phase = (t % self.period) as f64 / self.period as f64;
        (0.4 * (2.0 * PI * phase).sin() + 0.5) * self.q[k]
    }
}

/// The rate model of an F3AST model. Panics on a non-F3AST config (the caller dispatches).
pub fn build(cfg: &AvailabilityConfig, info: &ClientInfo, seed: u64) -> Box<dyn ActivityRate> {
    let n = info.sizes.len();
    match *cfg {
        AvailabilityConfig::Scarce(ScarceConfig { q }) => Box::new(StaticRates(vec![q; n])),
        AvailabilityConfig::HomeDevice(HomeDeviceConfig { sigma }) => {
            Box::new(StaticRates(lognormal_rates(n, sigma, seed)))
        }
        // q_k ∝ 1/p_k = Σn / n_k: the smallest client is always available.
        AvailabilityConfig::Uneven => Box::new(StaticRates(scale_to_max(
            info.sizes.iter().map(|&s| 1.0 / s.max(1) as f64).collect(),
        ))),
        AvailabilityConfig::Smartphones(SmartphonesConfig { sigma, period }) => {
            Box::new(Smartphones {
                q: lognormal_rates(n, sigma, seed),
                period,
            })
        }
        _ => unreachable!("not an F3AST availability model: {}", cfg.name()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn uneven_and_smartphones_match_their_formulas() {
        let info = ClientInfo {
            sizes: vec![50, 100, 200],
            labels: vec![vec![0]; 3],
            classes: 2,
        };
        let u = build(&AvailabilityConfig::Uneven, &info, 1);
        let got: Vec<f64> = (0..3).map(|k| u.rate(0, k)).collect();
        assert_eq!(got, vec![1.0, 0.5, 0.25]);
        let s = build(
            &AvailabilityConfig::Smartphones(SmartphonesConfig {
                sigma: 0.0,
                period: 24,
            }),
            &info,
            1,
        );
        // σ = 0: every q_k = 1, so the rate is f_t: 0.5 at t = 0, 0.9 at t = 6, 0.1 at t = 18.
        assert!((s.rate(0, 1) - 0.5).abs() < 1e-12);
        assert!((s.rate(6, 1) - 0.9).abs() < 1e-12);
        assert!((s.rate(18, 2) - 0.1).abs() < 1e-12);
        assert!((s.rate(30, 2) - 0.9).abs() < 1e-12);
    }

    /// HomeDevice: q_k = T_k / max T with T_k ~ LogNormal(0, σ), here σ = 0.5: the
    /// largest rate is exactly 1, and for the same seed the log-rates are those of
    /// σ = 0.25 doubled (the draws are shared), so the spread follows σ as specified.
    #[test]
    fn home_device_follows_its_lognormal() {
        let n = 10;
        let info = ClientInfo {
            sizes: vec![10; n],
            labels: vec![vec![0]; n],
            classes: 2,
        };
        let home = |sigma| {
            build(
                &AvailabilityConfig::HomeDevice(HomeDeviceConfig { sigma }),
                &info,
                4,
            )
        };
        let (a, b) = (home(0.25), home(0.5));
        let ra: Vec<f64> = (0..n).map(|k| a.rate(7, k)).collect();
        let rb: Vec<f64> = (0..n).map(|k| b.rate(7, k)).collect();
        assert_eq!(rb.iter().copied().fold(0.0, f64::max), 1.0);
        for (x, y) in ra.iter().zip(&rb) {
            assert!((2.0 * x.ln() - y.ln()).abs() < 1e-9, "{x} {y}");
        }
        // Constant over rounds.
        assert_eq!(b.rate(0, 3), b.rate(99, 3));
    }
}
