//! FedGS's client availability modes (FedGS Table 1 and App. C).
//!
//! β controls the global unavailability: a larger β leaves most clients less
//! often active. The paper's Table 2 values are IDL, LN0.5, SLN0.5, LDF0.7,
//! MDF0.7, YMF0.9 and YC0.9.

use std::f64::consts::PI;

use serde::{Deserialize, Serialize};

use super::AvailabilityConfig;
use super::{ActivityRate, ClientInfo, StaticRates, lognormal_rates, scale_to_max};
use crate::error::ConfigError;
use crate::validate::{check, check_prob};

/// FedGS MoreDataFirst: n_k^β / max n^β.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct MdfConfig {
    /// β.
    pub beta: f64,
}

impl Default for MdfConfig {
    fn default() -> Self {
        Self { beta: 0.7 }
    }
}

impl MdfConfig {
    /// Rejects values no run can use, naming the key: this model's part of
    /// [`Config::validate`](crate::config::Config::validate).
    pub(crate) fn validate(&self) -> Result<(), ConfigError> {
        check(
            self.beta.is_finite() && self.beta >= 0.0,
            "availability.beta",
            format!("{} must be >= 0", self.beta),
        )
    }
}

/// FedGS LessDataFirst: n_k^−β / max n^−β.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct LdfConfig {
    /// β.
    pub beta: f64,
}

impl Default for LdfConfig {
    fn default() -> Self {
        Self { beta: 0.7 }
    }
}

impl LdfConfig {
    /// Rejects values no run can use, naming the key: this model's part of
    /// [`Config::validate`](crate::config::Config::validate).
    pub(crate) fn validate(&self) -> Result<(), ConfigError> {
        check(
            self.beta.is_finite() && self.beta >= 0.0,
            "availability.beta",
            format!("{} must be >= 0", self.beta),
        )
    }
}

/// FedGS YMaxFirst: β · min label of k / max label + (1 − β).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct YmfConfig {
    /// β.
    pub beta: f64,
}

impl Default for YmfConfig {
    fn default() -> Self {
        Self { beta: 0.9 }
    }
}

impl YmfConfig {
    /// Rejects values no run can use, naming the key: this model's part of
    /// [`Config::validate`](crate::config::Config::validate).
    pub(crate) fn validate(&self) -> Result<(), ConfigError> {
        check_prob(self.beta, "availability.beta", false, false)
    }
}

/// FedGS YCycle: β · 1[(1 + t mod T_p)/T_p falls in a label's bin] + (1 − β).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct YcConfig {
    /// β.
    pub beta: f64,
    /// Period T_p in rounds; unset means the authors' 10·L (one 10-round window per
    /// label).
    pub period: Option<usize>,
}

impl Default for YcConfig {
    fn default() -> Self {
        Self {
            beta: 0.9,
            period: None,
        }
    }
}

impl YcConfig {
    /// Rejects values no run can use, naming the key: this model's part of
    /// [`Config::validate`](crate::config::Config::validate).
    pub(crate) fn validate(&self) -> Result<(), ConfigError> {
        check_prob(self.beta, "availability.beta", false, false)?;
        check(
            self.period.is_none_or(|p| p > 0),
            "availability.period",
            "must be at least 1",
        )
    }
}

/// FedGS LogNormal: c_k / max c, c_k ~ LogNormal(0, ln 1/(1−β)) drawn once.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct LnConfig {
    /// β.
    pub beta: f64,
}

impl Default for LnConfig {
    fn default() -> Self {
        Self { beta: 0.5 }
    }
}

impl LnConfig {
    /// Rejects values no run can use, naming the key: this model's part of
    /// [`Config::validate`](crate::config::Config::validate).
    pub(crate) fn validate(&self) -> Result<(), ConfigError> {
        check_prob(self.beta, "availability.beta", true, true)
    }
}

/// FedGS SinLogNormal: the LN rate times 0.4 sin(θ_t) + 0.5.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct SlnConfig {
    /// β.
    pub beta: f64,
    /// Period T_p in rounds.
    pub period: usize,
    /// Where in its cycle round t is (see [`SlnPhase`]).
    pub phase: SlnPhase,
}

impl Default for SlnConfig {
    fn default() -> Self {
        Self {
            beta: 0.5,
            period: 24,
            phase: SlnPhase::Paper,
        }
    }
}

/// The phase θ_t of SinLogNormal's sine: the paper and the authors' code differ.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum SlnPhase {
    /// FedGS App. C: θ_t = 2π (1 + t mod T_p) / T_p.
    #[default]
    Paper,
    /// The authors' `utils/systemic_simulator.py`, which produced Table 2:
    /// θ_t = `linspace(0, 2π, T_p)[t mod T_p]` = 2π (t mod T_p) / (T_p − 1), both ends of
    /// the cycle included, so the first and last round of a cycle share sin θ = 0.
    Code,
}

impl SlnConfig {
    /// Rejects values no run can use, naming the key: this model's part of
    /// [`Config::validate`](crate::config::Config::validate).
    pub(crate) fn validate(&self) -> Result<(), ConfigError> {
        check_prob(self.beta, "availability.beta", true, true)?;
        check(self.period > 0, "availability.period", "must be at least 1")
    }
}

/// SinLogNormal: c_k / max c · (0.4 sin θ_t + 0.5).
struct SinLogNormal {
    base: Vec<f64>,
    period: usize,
    phase: SlnPhase,
}

impl SinLogNormal {
    fn theta(&self, t: usize) -> f64 {
        let p = self.period;
        match self.phase {
            SlnPhase::Paper => 2.0 * PI * (1 + t % p) as f64 / p as f64,
            // numpy's linspace(0, 2π, 1) is [0].
            SlnPhase::Code if p == 1 => 0.0,
            SlnPhase::Code => 2.0 * PI * (t % p) as f64 / (p - 1) as f64,
        }
    }
}

impl ActivityRate for SinLogNormal {
    fn rate(&self, t: usize, k: usize) -> f64 {
        self.base[k] * (0.4 * self.theta(t).sin() + 0.5)
    }
}

/// YCycle: β · 1[∪_y ρ_t ∈ (y/L, (y+1)/L]] + (1 − β) with ρ_t = (1 + t mod T_p)/T_p, as
/// the authors' code bins it. With their period T_p = 10·L every label owns exactly ten
/// consecutive rounds of each cycle and every round belongs to one label. The bins are
/// compared in integers, (1 + t mod T_p)·L ∈ (y·T_p, (y+1)·T_p], so no round falls
/// between two bins by rounding.
struct YCycle {
    beta: f64,
    period: usize,
    labels: Vec<Vec<usize>>,
    classes: usize,
}

impl ActivityRate for YCycle {
    fn rate(&self, t: usize, k: usize) -> f64 {
        let x = (1 + t % self.period) * self.classes;
        let on = self.labels[k]
            .iter()
            .any(|&y| x > y * self.period && x <= (y + 1) * self.period);
        self.beta * f64::from(u8::from(on)) + 1.0 - self.beta
    }
}

/// The rate model of a FedGS mode. Panics on a non-FedGS config (the caller dispatches).
pub fn build(cfg: &AvailabilityConfig, info: &ClientInfo, seed: u64) -> Box<dyn ActivityRate> {
    let n = info.sizes.len();
    let sizes = || info.sizes.iter().map(|&s| s as f64);
    match *cfg {
        AvailabilityConfig::Mdf(MdfConfig { beta }) => Box::new(StaticRates(scale_to_max(
            sizes().map(|s| s.powf(beta)).collect(),
        ))),
        AvailabilityConfig::Ldf(LdfConfig { beta }) => Box::new(StaticRates(scale_to_max(
            sizes().map(|s| s.max(1.0).powf(-beta)).collect(),
        ))),
        AvailabilityConfig::Ymf(YmfConfig { beta }) => {
            // min label of k over the largest label any client holds (FedGS Table 1).
            let max_label = info
                .labels
                .iter()
                .filter_map(|l| l.last())
                .copied()
                .max()
                .unwrap_or(0)
                .max(1) as f64;
            Box::new(StaticRates(
                info.labels
                    .iter()
                    .map(|l| {
                        let min = l.first().copied().unwrap_or(0) as f64;
                        beta * min / max_label + 1.0 - beta
                    })
                    .collect(),
            ))
        }
        AvailabilityConfig::Yc(YcConfig { beta, period }) => Box::new(YCycle {
            beta,
            period: period.unwrap_or(10 * info.classes),
            labels: info.labels.clone(),
            classes: info.classes,
        }),
        AvailabilityConfig::Ln(LnConfig { beta }) => Box::new(StaticRates(lognormal_rates(
            n,
            (1.0 / (1.0 - beta)).ln(),
            seed,
        ))),
        AvailabilityConfig::Sln(SlnConfig {
            beta,
            period,
            phase,
        }) => Box::new(SinLogNormal {
            base: lognormal_rates(n, (1.0 / (1.0 - beta)).ln(), seed),
            period,
            phase,
        }),
        _ => unreachable!("not a FedGS availability mode: {}", cfg.name()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rates_match_hand_computed_values() {
        let info = ClientInfo {
            sizes: vec![100, 400],
            labels: vec![vec![0, 3], vec![6, 9]],
            classes: 10,
        };
        let mdf = build(&AvailabilityConfig::Mdf(MdfConfig { beta: 0.5 }), &info, 1);
        assert!((mdf.rate(0, 0) - 0.5).abs() < 1e-12 && mdf.rate(0, 1) == 1.0);
        let ldf = build(&AvailabilityConfig::Ldf(LdfConfig { beta: 0.5 }), &info, 1);
        assert!(ldf.rate(0, 0) == 1.0 && (ldf.rate(0, 1) - 0.5).abs() < 1e-12);
        // YMF 0.9: client 0 (min label 0) 0.1; client 1 (min label 6, max label 9) 0.9·6/9 + 0.1.
        let ymf = build(&AvailabilityConfig::Ymf(YmfConfig { beta: 0.9 }), &info, 1);
        assert!((ymf.rate(0, 0) - 0.1).abs() < 1e-12);
        assert!((ymf.rate(0, 1) - (0.6 + 0.1)).abs() < 1e-12);
        // YC with T_p = 10: ρ_t = (1 + t)/10; client 0 holds labels 0 and 3, bins
        // (0, 0.1] and (0.3, 0.4]: on at ρ = 0.1 (t = 0) and 0.4 (t = 3), off at 0.3 (t = 2).
        let yc = build(
            &AvailabilityConfig::Yc(YcConfig {
                beta: 0.9,
                period: Some(10),
            }),
            &info,
            1,
        );
        assert!((yc.rate(0, 0) - 1.0).abs() < 1e-12);
        assert!((yc.rate(3, 0) - 1.0).abs() < 1e-12);
        assert!((yc.rate(2, 0) - 0.1).abs() < 1e-12);
        assert!((yc.rate(13, 0) - 1.0).abs() < 1e-12);
    }

    /// The authors' period 10·L: each of the L labels is on for exactly ten consecutive
    /// rounds of each cycle, in label order, and no round is on for no label.
    #[test]
    fn yc_gives_each_label_one_ten_round_window() {
        let classes = 10;
        let info = ClientInfo {
            sizes: vec![1; classes],
            labels: (0..classes).map(|y| vec![y]).collect(),
            classes,
        };
        let yc = build(
            &AvailabilityConfig::Yc(YcConfig {
                beta: 0.9,
                period: None,
            }),
            &info,
            1,
        );
        for t in 0..2 * 10 * classes {
            let on: Vec<usize> = (0..classes)
                .filter(|&k| (yc.rate(t, k) - 1.0).abs() < 1e-12)
                .collect();
            assert_eq!(on, vec![(t % (10 * classes)) / 10], "round {t}");
        }
    }

    /// LN's rates are c_k / max c with c_k = exp(σ z_k), σ = ln(1/(1 − β)): so the
    /// largest rate is exactly 1 and log-rates scale with σ for the same draws z_k. With
    /// β = 0.5 (σ = ln 2) and β = 0.75 (σ = ln 4 = 2 ln 2), every log-rate doubles. SLN
    /// multiplies the LN rate by 0.4 sin(2π (1 + t mod T)/T) + 0.5: with T = 24 that is
    /// 0.9 at t = 5 (a quarter period), 0.1 at t = 17 and 0.5 at t = 23 and t = 11.
    #[test]
    fn lognormal_modes_match_their_formulas() {
        let n = 8;
        let info = ClientInfo {
            sizes: vec![10; n],
            labels: vec![vec![0]; n],
            classes: 2,
        };
        let ln = |beta| build(&AvailabilityConfig::Ln(LnConfig { beta }), &info, 3);
        let (half, three_quarters) = (ln(0.5), ln(0.75));
        let r1: Vec<f64> = (0..n).map(|k| half.rate(0, k)).collect();
        let r2: Vec<f64> = (0..n).map(|k| three_quarters.rate(0, k)).collect();
        assert_eq!(r1.iter().copied().fold(0.0, f64::max), 1.0);
        assert!(r1.iter().any(|&r| r < 0.9));
        for (a, b) in r1.iter().zip(&r2) {
            assert!((2.0 * a.ln() - b.ln()).abs() < 1e-9, "{a} {b}");
        }
        let sln = build(
            &AvailabilityConfig::Sln(SlnConfig {
                beta: 0.5,
                period: 24,
                phase: SlnPhase::Paper,
            }),
            &info,
            3,
        );
        for (t, factor) in [(5, 0.9), (17, 0.1), (23, 0.5), (11, 0.5), (29, 0.9)] {
            for (k, r) in r1.iter().enumerate() {
                assert!((sln.rate(t, k) - factor * r).abs() < 1e-12, "t {t} k {k}");
            }
        }
    }

    /// The code's phase, linspace(0, 2π, 24)[t mod 24]: 0.5 at the first and last round
    /// of a cycle (θ = 0 and 2π), and sin(2π·6/23) = 0.99767 at t = 6.
    #[test]
    fn sln_code_phase_is_numpys_linspace() {
        let n = 3;
        let info = ClientInfo {
            sizes: vec![10; n],
            labels: vec![vec![0]; n],
            classes: 2,
        };
        let sln = |phase| {
            build(
                &AvailabilityConfig::Sln(SlnConfig {
                    beta: 0.5,
                    period: 24,
                    phase,
                }),
                &info,
                3,
            )
        };
        let (code, paper) = (sln(SlnPhase::Code), sln(SlnPhase::Paper));
        let base: Vec<f64> = (0..n)
            .map(|k| build(&AvailabilityConfig::Ln(LnConfig { beta: 0.5 }), &info, 3).rate(0, k))
            .collect();
        for (k, r) in base.iter().enumerate() {
            for (t, factor) in [
                (0, 0.5),
                (23, 0.5),
                (24, 0.5),
                (6, 0.4 * 0.997_668_769_190_539 + 0.5),
            ] {
                assert!((code.rate(t, k) - factor * r).abs() < 1e-12, "t {t} k {k}");
            }
            assert!((paper.rate(0, k) - code.rate(0, k)).abs() > 0.01);
        }
    }
}
