//! The time-varying communication budget K_t (F3AST §3: the server may select
//! at most K_t clients in round t, and F3AST must adapt to it).

use rand::Rng as _;

use crate::rng::{Purpose, stream};
use serde::{Deserialize, Serialize};

/// The communication budget K_t: how many clients the server may select in round t.
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case", deny_unknown_fields)]
pub enum BudgetConfig {
    /// K_t = m, the selection's clients per round.
    #[default]
    Constant,
    /// K_t = values[(t / hold) mod len]: a repeating schedule.
    Periodic {
        /// The budgets, in order.
        values: Vec<usize>,
        /// Rounds each value holds.
        #[serde(default = "one")]
        hold: usize,
    },
    /// K_t uniform in min..=max, drawn per round from the budget's own stream.
    Random {
        /// Smallest budget.
        min: usize,
        /// Largest budget.
        max: usize,
    },
}

fn one() -> usize {
    1
}

/// K_t for every round.
#[derive(Debug, Clone)]
pub struct Budget {
    cfg: BudgetConfig,
    per_round: usize,
    seed: u64,
}

impl Budget {
    /// A budget schedule; `per_round` is the constant budget m.
    pub fn new(cfg: BudgetConfig, per_round: usize, seed: u64) -> Self {
        Self {
            cfg,
            per_round,
            seed,
        }
    }

    /// K_t.
    pub fn at(&self, t: usize) -> usize {
        match &self.cfg {
            BudgetConfig::Constant => self.per_round,
            BudgetConfig::Periodic { values, hold } => values[(t / hold) % values.len()],
            BudgetConfig::Random { min, max } => {
                stream(self.seed, Purpose::Budget, t as u64, 0).random_range(*min..=*max)
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn schedules_follow_their_definitions() {
        let c = Budget::new(BudgetConfig::Constant, 7, 1);
        assert!((0..10).all(|t| c.at(t) == 7));
        let p = Budget::new(
            BudgetConfig::Periodic {
                values: vec![2, 5],
                hold: 3,
            },
            7,
            1,
        );
        let got: Vec<usize> = (0..8).map(|t| p.at(t)).collect();
        assert_eq!(got, vec![2, 2, 2, 5, 5, 5, 2, 2]);
        let r = Budget::new(BudgetConfig::Random { min: 3, max: 6 }, 7, 1);
        let draws: Vec<usize> = (0..400).map(|t| r.at(t)).collect();
        assert!(draws.iter().all(|&k| (3..=6).contains(&k)));
        for k in 3..=6 {
            let share = draws.iter().filter(|&&d| d == k).count() as f64 / 400.0;
            assert!((share - 0.25).abs() < 0.1, "K = {k} drawn {share}");
        }
        assert_eq!(r.at(11), r.at(11));
    }
}
