//! Active Federated Learning (Goetz et al. 2019), as the FedCor code runs it.
//!
//! Each client has a valuation v_k = (held-out loss) × √n_k (algorithms.md §1.10, §6).
//! The FedCor code values every client from the initial model, which it can because every
//! client is always available there. A server may only query available clients, so here a
//! client is valued the first time it is available, with the loss of the model of that
//! round: under full availability this is the FedCor code exactly. After that, the selected
//! clients' valuations are replaced by the loss of the model they receive (before training
//! on it), and everyone else's stay stale, unavailable clients' included.
//!
//! Each round, among the available clients: drop the ⌊α1·|A|⌋ lowest valuations, draw
//! ⌊(1−α3)·m⌋ clients without replacement with probability softmax(α2·v) over the rest,
//! and fill the remaining picks uniformly without replacement from the other available
//! clients, the dropped ones included.

use rand::seq::index::sample;
use serde::{Deserialize, Serialize};

use super::{ClientQuery, RoundContext, Selection, Selector, Setup, weighted_without_replacement};
use crate::error::{ConfigError, Error};
use crate::rng::Rng;
use crate::validate::{check_pos, check_prob};

/// Active Federated Learning (Goetz et al. 2019), as FedCor ran it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct AflConfig {
    /// Fraction of clients with the lowest valuations dropped.
    pub alpha1: f64,
    /// Softmax temperature on the valuations.
    pub alpha2: f64,
    /// Fraction of the m picks made uniformly instead of by softmax.
    pub alpha3: f64,
}

impl Default for AflConfig {
    fn default() -> Self {
        Self {
            alpha1: 0.75,
            alpha2: 0.01,
            alpha3: 0.1,
        }
    }
}

impl AflConfig {
    /// Rejects values no run can use, naming the key: the `selection.afl` part of
    /// [`Config::validate`](crate::config::Config::validate).
    pub(crate) fn validate(&self) -> Result<(), ConfigError> {
        check_prob(self.alpha1, "selection.afl.alpha1", false, true)?;
        check_pos(self.alpha2, "selection.afl.alpha2")?;
        check_prob(self.alpha3, "selection.afl.alpha3", false, false)
    }
}

/// The Active FL selector.
#[derive(Debug, Clone)]
pub struct ActiveFl {
    cfg: AflConfig,
    sqrt_sizes: Vec<f64>,
    /// v_k, `None` until k is first available.
    values: Vec<Option<f64>>,
}

impl ActiveFl {
    /// A selector with the given α1, α2, α3.
    pub fn new(cfg: AflConfig) -> Self {
        Self {
            cfg,
            sqrt_sizes: Vec::new(),
            values: Vec::new(),
        }
    }

    /// Values every client of `avail` that has no valuation yet, with the current model,
    /// and returns them.
    fn value_unseen(
        &mut self,
        avail: &[usize],
        query: &mut dyn ClientQuery,
    ) -> Result<Vec<usize>, Error> {
        let unseen: Vec<usize> = avail
            .iter()
            .copied()
            .filter(|&k| self.values[k].is_none())
            .collect();
        if !unseen.is_empty() {
            let losses = query.holdout_losses(&unseen)?;
            for (&k, l) in unseen.iter().zip(losses) {
                self.values[k] = Some(l * self.sqrt_sizes[k]);
            }
        }
        Ok(unseen)
    }

    /// Selection probabilities of the softmax stage over `avail` (0 for dropped clients).
    /// Every client of `avail` must have a valuation.
    fn softmax_probabilities(&self, avail: &[usize]) -> Vec<f64> {
        let v: Vec<f64> = avail
            .iter()
            .map(|&k| self.values[k].expect("available clients are valued first"))
            .collect();
        let mut order: Vec<usize> = (0..avail.len()).collect();
        order.sort_by(|&a, &b| v[a].total_cmp(&v[b]));
        let n_drop = (self.cfg.alpha1 * avail.len() as f64).floor() as usize;
        let kept = &order[n_drop.min(avail.len())..];
        let max = kept
            .iter()
            .map(|&i| self.cfg.alpha2 * v[i])
            .fold(f64::NEG_INFINITY, f64::max);
        let mut p = vec![0.0; avail.len()];
        for &i in kept {
            p[i] = (self.cfg.alpha2 * v[i] - max).exp();
        }
        let s: f64 = p.iter().sum();
        p.iter_mut().for_each(|x| *x /= s);
        p
    }
}

impl Selector for ActiveFl {
    fn name(&self) -> &'static str {
        "afl"
    }

    fn setup(&mut self, setup: &Setup) {
        self.sqrt_sizes = setup.sizes.iter().map(|&n| (n as f64).sqrt()).collect();
        self.values = vec![None; setup.sizes.len()];
    }

    fn select(
        &mut self,
        ctx: &RoundContext<'_>,
        query: &mut dyn ClientQuery,
        rng: &mut Rng,
    ) -> Result<Selection, Error> {
        let avail = ctx.available;
        let fresh = self.value_unseen(avail, query)?;
        let m = ctx.budget.min(avail.len());
        let p = self.softmax_probabilities(avail);
        let n_soft = ((1.0 - self.cfg.alpha3) * m as f64).floor() as usize;
        let mut chosen = weighted_without_replacement(avail, &p, n_soft, rng);
        let rest: Vec<usize> = avail
            .iter()
            .copied()
            .filter(|k| !chosen.contains(k))
            .collect();
        chosen.extend(
            sample(rng, rest.len(), m - chosen.len())
                .into_iter()
                .map(|i| rest[i]),
        );
        // The selected clients value the model they receive before training on it; those
        // valued this round already did.
        let stale: Vec<usize> = chosen
            .iter()
            .copied()
            .filter(|k| !fresh.contains(k))
            .collect();
        if !stale.is_empty() {
            let losses = query.holdout_losses(&stale)?;
            for (&k, l) in stale.iter().zip(losses) {
                self.values[k] = Some(l * self.sqrt_sizes[k]);
            }
        }
        Ok(Selection {
            clients: chosen,
            weights: None,
        })
    }

    fn save(&self) -> serde_json::Value {
        // Clients not valued yet are null.
        serde_json::json!({ "values": self.values })
    }

    fn load(&mut self, state: &serde_json::Value) -> Result<(), Error> {
        let values: Vec<Option<f64>> = super::load_state("afl", &state["values"])?;
        if values.len() != self.sqrt_sizes.len() {
            return Err(Error::Selection {
                selector: "afl".into(),
                round: 0,
                reason: format!(
                    "checkpoint holds {} valuations for {} clients",
                    values.len(),
                    self.sqrt_sizes.len()
                ),
            });
        }
        self.values = values;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::rng::{Purpose, stream};
    use crate::select::testing::{Recording, setup};

    fn afl(alpha1: f64, alpha2: f64, alpha3: f64, sizes: &[usize]) -> ActiveFl {
        let mut s = ActiveFl::new(AflConfig {
            alpha1,
            alpha2,
            alpha3,
        });
        let n = sizes.len();
        s.setup(&Setup {
            sizes: sizes.to_vec(),
            ..setup(&vec![1.0 / n as f64; n])
        });
        s
    }

    fn ctx(round: usize, available: &[usize], budget: usize) -> RoundContext<'_> {
        RoundContext {
            round,
            available,
            budget,
            clock_s: None,
        }
    }

    #[test]
    fn the_square_root_of_the_size_reorders_the_valuations() {
        // Losses (3, 1, 2, 0.8) and sizes (1, 25, 1, 16): v = loss·√n = (3, 5, 2, 3.2).
        // α1 = 0.5 drops the two lowest, clients 2 and 0, although client 0 has the highest
        // loss (by loss alone, 3 and 1 would go). α2 = 1: softmax over (v_1, v_3) = (5, 3.2).
        let mut s = afl(0.5, 1.0, 0.0, &[1, 25, 1, 16]);
        let avail = [0, 1, 2, 3];
        let mut q = Recording::new(vec![3.0, 1.0, 2.0, 0.8], vec![]);
        let mut rng = stream(1, Purpose::Selection, 0, 0);
        let picked = s.select(&ctx(0, &avail, 1), &mut q, &mut rng).unwrap();
        assert!(picked.clients == [1] || picked.clients == [3]);
        let p = s.softmax_probabilities(&avail);
        let e = (1.8f64).exp();
        let expected = [0.0, e / (1.0 + e), 0.0, 1.0 / (1.0 + e)];
        for (got, want) in p.iter().zip(expected) {
            assert!((got - want).abs() < 1e-12, "{p:?}");
        }
    }

    #[test]
    fn alpha3_leaves_the_last_picks_to_a_uniform_draw() {
        // 40 clients with equal sizes and losses 1..=40: α1 = 0.75 drops 30, so only the 10
        // highest (clients 30..40) have softmax weight. m = 10, α3 = 0.1: ⌊0.9 · 10⌋ = 9
        // softmax picks from those 10, then 1 uniform pick from the 31 others, a dropped
        // client with probability 30/31. Without the uniform stage no dropped client could
        // ever be picked; with 2 uniform picks, 2 could.
        let losses: Vec<f64> = (1..=40).map(f64::from).collect();
        let avail: Vec<usize> = (0..40).collect();
        let trials = 200;
        let mut with_dropped = 0;
        for seed in 0..trials {
            let mut s = afl(0.75, 0.01, 0.1, &[1; 40]);
            let mut q = Recording::new(losses.clone(), vec![]);
            let mut rng = stream(seed, Purpose::Selection, 0, 0);
            let mut picked = s
                .select(&ctx(0, &avail, 10), &mut q, &mut rng)
                .unwrap()
                .clients;
            picked.sort_unstable();
            picked.dedup();
            assert_eq!(picked.len(), 10);
            let dropped = picked.iter().filter(|&&k| k < 30).count();
            assert!(dropped <= 1, "{picked:?}");
            with_dropped += dropped;
        }
        // Expected 200 · 30/31 ≈ 193.5; the binomial std is about 2.5.
        assert!(with_dropped >= 180, "{with_dropped} of {trials}");
    }

    #[test]
    fn valuations_refresh_with_the_model_each_selected_client_receives() {
        // Sizes 1, 4, 9, 16 (√n = 1, 2, 3, 4). Round 0 sees clients 0..3 and the model with
        // losses L0; round 1 sees 1..4, a new model with losses L1, and client 3 for the
        // first time. Budget 1, α1 = 0, α3 = 0.
        let mut s = afl(0.0, 0.01, 0.0, &[1, 4, 9, 16]);
        let l0 = vec![1.0, 2.0, 3.0, 4.0];
        let l1 = vec![0.5, 0.25, 0.125, 0.0625];
        let mut rng = stream(3, Purpose::Selection, 0, 0);
        let mut q0 = Recording::new(l0.clone(), vec![]);
        let k0 = s
            .select(&ctx(0, &[0, 1, 2], 1), &mut q0, &mut rng)
            .unwrap()
            .clients[0];
        // Everyone available was valued once with this model; the pick among them was
        // valued with the model it receives already, so it is not asked again.
        assert_eq!(q0.calls.len(), 1);
        assert_eq!(q0.calls[0].1, vec![0, 1, 2]);
        let sqrt = [1.0, 2.0, 3.0, 4.0];
        let mut want: Vec<Option<f64>> = (0..3).map(|k| Some(l0[k] * sqrt[k])).collect();
        want.push(None);
        assert_eq!(s.values, want);
        let mut q1 = Recording::new(l1.clone(), vec![]);
        let k1 = s
            .select(&ctx(1, &[1, 2, 3], 1), &mut q1, &mut rng)
            .unwrap()
            .clients[0];
        // Client 3 is valued on its first availability, with round 1's model.
        assert_eq!(q1.calls[0].1, vec![3]);
        want[3] = Some(l1[3] * sqrt[3]);
        if k1 != 3 {
            // The pick had a stale valuation: it is refreshed with the model it receives.
            assert_eq!(q1.calls[1].1, vec![k1]);
            want[k1] = Some(l1[k1] * sqrt[k1]);
        }
        // Everyone else, client 0 (unavailable) and round 0's pick included, stays stale.
        assert_eq!(s.values, want, "round 0 picked {k0}, round 1 picked {k1}");
    }

    #[test]
    fn only_available_clients_are_ever_queried() {
        let mut s = afl(0.5, 0.01, 0.5, &[3, 5, 8, 13, 21, 34]);
        let mut rng = stream(4, Purpose::Selection, 0, 0);
        let rounds: [&[usize]; 5] = [&[0, 2], &[1, 2, 4], &[5], &[0, 3, 4, 5], &[1, 3]];
        for (t, avail) in rounds.iter().enumerate() {
            let mut q = Recording::new(vec![1.0, 2.0, 0.5, 3.0, 1.5, 0.7], vec![]);
            let picked = s.select(&ctx(t, avail, 2), &mut q, &mut rng).unwrap();
            assert!(picked.clients.iter().all(|k| avail.contains(k)));
            for (_, named) in &q.calls {
                assert!(
                    named.iter().all(|k| avail.contains(k)),
                    "round {t}: {named:?}"
                );
            }
        }
        assert!(s.values.iter().all(Option::is_some));
    }
}
