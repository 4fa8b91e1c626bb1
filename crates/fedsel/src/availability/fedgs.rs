//! FedGS's client availability modes (FedGS Table 1 and App. C).
//!
//! β controls the global unavailability: a larger β leaves most clients less
//! often active. The paper's Table 2 values are IDL, LN0.5, SLN0.5, LDF0.7,
//! MDF0.7, YMF0.9 and YC0.9.

use std::f64::consts::PI;

use super::{ActivityRate, ClientInfo, StaticRates, lognormal_rates, scale_to_max};
use crate::config::AvailabilityConfig;

/// SinLogNormal: c_k / max c · (0.4 sin(2π (1 + t mod T_p)/T_p) + 0.5).
struct SinLogNormal {
    base: Vec<f64>,
    period: usize,
}

impl ActivityRate for SinLogNormal {
    fn rate(&self, t: usize, k: usize) -> f64 {
        let phase = (1 + t % self.period) as f64 / self.period as f64;
        self.base[k] * (0.4 * (2.0 * PI * phase).sin() + 0.5)
    }
}

/// YCycle: β · 1[∪_y (1 + t mod T_p)/T_p ∈ [y/numY, (y+1)/numY)] + (1 − β).
struct YCycle {
    beta: f64,
    period: usize,
    labels: Vec<Vec<usize>>,
    classes: usize,
}

impl ActivityRate for YCycle {
    fn rate(&self, t: usize, k: usize) -> f64 {
        let rho = (1 + t % self.period) as f64 / self.period as f64;
        let c = self.classes as f64;
        let on = self.labels[k]
            .iter()
            .any(|&y| rho >= y as f64 / c && rho < (y + 1) as f64 / c);
        self.beta * f64::from(u8::from(on)) + 1.0 - self.beta
    }
}

/// The rate model of a FedGS mode. Panics on a non-FedGS config (the caller dispatches).
pub fn build(cfg: &AvailabilityConfig, info: &ClientInfo, seed: u64) -> Box<dyn ActivityRate> {
    let n = info.sizes.len();
    let sizes = || info.sizes.iter().map(|&s| s as f64);
    match *cfg {
        AvailabilityConfig::Mdf { beta } => Box::new(StaticRates(scale_to_max(
            sizes().map(|s| s.powf(beta)).collect(),
        ))),
        AvailabilityConfig::Ldf { beta } => Box::new(StaticRates(scale_to_max(
            sizes().map(|s| s.max(1.0).powf(-beta)).collect(),
        ))),
        AvailabilityConfig::Ymf { beta } => {
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
        AvailabilityConfig::Yc { beta, period } => Box::new(YCycle {
            beta,
            period,
            labels: info.labels.clone(),
            classes: info.classes,
        }),
        AvailabilityConfig::Ln { beta } => Box::new(StaticRates(lognormal_rates(
            n,
            (1.0 / (1.0 - beta)).ln(),
            seed,
        ))),
        AvailabilityConfig::Sln { beta, period } => Box::new(SinLogNormal {
            base: lognormal_rates(n, (1.0 / (1.0 - beta)).ln(), seed),
            period,
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
        let mdf = build(&AvailabilityConfig::Mdf { beta: 0.5 }, &info, 1);
        assert!((mdf.rate(0, 0) - 0.5).abs() < 1e-12 && mdf.rate(0, 1) == 1.0);
        let ldf = build(&AvailabilityConfig::Ldf { beta: 0.5 }, &info, 1);
        assert!(ldf.rate(0, 0) == 1.0 && (ldf.rate(0, 1) - 0.5).abs() < 1e-12);
        // YMF 0.9: client 0 (min label 0) 0.1; client 1 (min label 6, max label 9) 0.9·6/9 + 0.1.
        let ymf = build(&AvailabilityConfig::Ymf { beta: 0.9 }, &info, 1);
        assert!((ymf.rate(0, 0) - 0.1).abs() < 1e-12);
        assert!((ymf.rate(0, 1) - (0.6 + 0.1)).abs() < 1e-12);
        // YC with T_p = 10: ρ_t = (1 + t)/10; client 0 holds labels 0 and 3, bins
        // [0, 0.1) and [0.3, 0.4): on at ρ = 0.3 (t = 2) only, off at ρ = 0.1 (t = 0).
        let yc = build(
            &AvailabilityConfig::Yc {
                beta: 0.9,
                period: 10,
            },
            &info,
            1,
        );
        assert!((yc.rate(2, 0) - 1.0).abs() < 1e-12);
        assert!((yc.rate(0, 0) - 0.1).abs() < 1e-12);
        assert!((yc.rate(12, 0) - 1.0).abs() < 1e-12);
    }
}
