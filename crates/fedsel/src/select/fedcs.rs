//! FedCS (Nishio & Yonetani, ICC'19, "Client Selection for Federated Learning with
//! Heterogeneous Resources in Mobile Edge"): the server takes as many clients as fit the
//! round's deadline, greedily, the one that lengthens the round least first.
//!
//! **The paper's Alg. 2.** Among the clients that answered its resource request, the server
//! repeatedly takes the client x whose addition increases the estimated elapsed time Θ of
//! the scheduled update-and-upload phase the least (argmax 1 / (Θ' − Θ)), removes it from
//! the candidates, and keeps it if the round still ends before T_round. Uploads share one
//! channel there, so Θ' = Θ + max(0, t^UD_x − Θ) + t^UL_x is computed incrementally. This
//! module follows the algorithm as the paper describes it; its text was not at hand, so
//! the equations above are the well-known reading, not a quotation.
//!
//! **On fedsel's clock.** Every client has its own link (`system/clock.rs`): its update
//! arrives t_x after the broadcast, whatever the others do, so the set's elapsed time is
//! Θ_S = max_{x∈S} t_x and the increment of adding x is max(0, t_x − Θ). Taking the least
//! increment first is then taking the clients in ascending t_x, and the round fits the
//! deadline D while t_x ≤ D: FedCS selects the fastest clients that fit, at most the
//! round's budget K_t (the paper maximises |S| with no cap; fedsel's contract is K_t).
//!
//! **Estimates.** FedCS asks clients for their resources; a real server only measures.
//! t_x is the duration the server last measured for x ([`Feedback::durations`]). A client
//! selected but not heard of (its update missed the deadline, or over-commitment dropped
//! it) is *late*: it took longer than the round allowed, so it never fits a deadline and is
//! ranked after every measured client. The prior for a never-measured client is
//! exploration: the never-measured available clients are selected first, at random, so
//! every client is measured once before the greedy ranks it (FedCS's resource request,
//! learned by measuring). Without a clock no duration is ever measured, and FedCS selects
//! uniformly at random.
//!
//! **Deadline.** `selection.fedcs.deadline_s`, FedCS's T_round after the broadcast. Left
//! out, it is the round policy's `deadline_s` when `[system.round]` has one (filled in by
//! [`Config::resolve`](crate::config::Config::resolve), so the resolved config records
//! it), and otherwise there is none: FedCS then takes the K_t fastest estimates.

use serde::{Deserialize, Serialize};

use super::{ClientQuery, Feedback, RoundContext, Selection, Selector, Setup};
use crate::error::{ConfigError, Error};
use crate::rng::Rng;
use crate::validate::check_pos;

/// FedCS's options.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct FedCsConfig {
    /// Seconds after the broadcast by which a selected client's update must arrive
    /// (T_round); see the module doc for its default.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub deadline_s: Option<f64>,
}

impl FedCsConfig {
    /// Whether every option has its default (the config then leaves the table out).
    pub(crate) fn is_default(&self) -> bool {
        *self == Self::default()
    }

    /// Checks every option, naming the key it refuses.
    pub(crate) fn validate(&self) -> Result<(), ConfigError> {
        match self.deadline_s {
            Some(d) => check_pos(d, "selection.fedcs.deadline_s"),
            None => Ok(()),
        }
    }
}

/// What the server knows of a client's time.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
enum Estimate {
    /// Never measured.
    Unknown,
    /// The duration last measured, in seconds.
    Measured(f64),
    /// Selected last time and not heard of: slower than the round allowed.
    Late,
}

/// FedCS.
#[derive(Debug, Clone)]
pub struct FedCs {
    cfg: FedCsConfig,
    estimate: Vec<Estimate>,
    /// The clients of the last selection, so that those not heard of are known late.
    pending: Vec<usize>,
}

impl FedCs {
    /// FedCS with `cfg`'s deadline.
    pub fn new(cfg: FedCsConfig) -> Self {
        Self {
            cfg,
            estimate: Vec::new(),
            pending: Vec::new(),
        }
    }

    /// Whether a client of estimated time `e` fits the deadline (an unknown one is
    /// explored, so it is never asked).
    fn fits(&self, e: Estimate) -> bool {
        let deadline = self.cfg.deadline_s;
        match e {
            Estimate::Measured(t) => deadline.is_none_or(|d| t <= d),
            Estimate::Late => deadline.is_none(),
            Estimate::Unknown => true,
        }
    }
}

/// Measured clients by ascending time, then the late ones; ties by client id.
fn rank(e: Estimate) -> (u8, f64) {
    match e {
        Estimate::Measured(t) => (0, t),
        Estimate::Late | Estimate::Unknown => (1, 0.0),
    }
}

impl Selector for FedCs {
    fn name(&self) -> &'static str {
        "fedcs"
    }

    fn setup(&mut self, setup: &Setup) {
        self.estimate = vec![Estimate::Unknown; setup.sizes.len()];
        self.pending.clear();
    }

    fn select(
        &mut self,
        ctx: &RoundContext<'_>,
        _query: &mut dyn ClientQuery,
        rng: &mut Rng,
    ) -> Result<Selection, Error> {
        let (unknown, mut known): (Vec<usize>, Vec<usize>) = ctx
            .available
            .iter()
            .partition(|&&k| self.estimate[k] == Estimate::Unknown);
        let explore = ctx.budget.min(unknown.len());
        let mut clients: Vec<usize> = rand::seq::index::sample(rng, unknown.len(), explore)
            .into_iter()
            .map(|i| unknown[i])
            .collect();
        known.sort_by(|&a, &b| {
            let (ra, rb) = (rank(self.estimate[a]), rank(self.estimate[b]));
            ra.0.cmp(&rb.0).then(ra.1.total_cmp(&rb.1)).then(a.cmp(&b))
        });
        let room = ctx.budget - clients.len();
        clients.extend(
            known
                .into_iter()
                .filter(|&k| self.fits(self.estimate[k]))
                .take(room),
        );
        self.pending.clone_from(&clients);
        Ok(Selection {
            clients,
            weights: None,
        })
    }

    /// Each reported client's estimate becomes its measured duration; a client selected
    /// and not reported is late. Without durations (no clock) nothing is learned.
    fn observe(&mut self, f: &Feedback<'_>) {
        let pending = std::mem::take(&mut self.pending);
        let Some(durations) = f.durations else {
            return;
        };
        for &k in &pending {
            if !f.selected.contains(&k) {
                self.estimate[k] = Estimate::Late;
            }
        }
        for (&k, &d) in f.selected.iter().zip(durations) {
            self.estimate[k] = Estimate::Measured(d);
        }
    }

    fn save(&self) -> serde_json::Value {
        super::save_state(&self.estimate)
    }

    fn load(&mut self, state: &serde_json::Value) -> Result<(), Error> {
        let loaded: Vec<Estimate> = super::load_state("fedcs", state)?;
        super::check_loaded("fedcs", "estimates", loaded.len(), self.estimate.len())?;
        self.estimate = loaded;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::rng::{Purpose, stream};
    use crate::select::testing::{FixedLosses, setup};

    fn fedcs(deadline_s: Option<f64>, n: usize) -> FedCs {
        let mut s = FedCs::new(FedCsConfig { deadline_s });
        s.setup(&setup(&vec![1.0 / n as f64; n]));
        s
    }

    fn select(s: &mut FedCs, round: usize, available: &[usize], budget: usize) -> Vec<usize> {
        let ctx = RoundContext {
            round,
            available,
            budget,
            clock_s: None,
        };
        let mut rng = stream(7, Purpose::Selection, round as u64, 0);
        s.select(&ctx, &mut FixedLosses(vec![0.0; 8]), &mut rng)
            .unwrap()
            .clients
    }

    fn report(s: &mut FedCs, selected: &[usize], durations: &[f64]) {
        s.observe(&Feedback {
            round: 0,
            selected,
            train_losses: &vec![1.0; selected.len()],
            updates: None,
            durations: Some(durations),
            dropped: None,
        });
    }

    /// Clients 0..6 measured at 5, 1, 4, 2, 9, 3 s; deadline 4 s, budget 3.
    /// The greedy takes the least increment first: 1 (1 s, Θ = 1), 3 (2 s, Θ = 2),
    /// 5 (3 s, Θ = 3), and stops at the budget; with budget 5 it adds 2 (4 s ≤ 4) and skips
    /// 0 (5 s) and 4 (9 s), which do not fit.
    #[test]
    fn the_greedy_takes_the_fastest_that_fit_the_deadline() {
        let all = [0, 1, 2, 3, 4, 5];
        let mut s = fedcs(Some(4.0), 6);
        let first = select(&mut s, 0, &all, 6);
        let mut sorted = first.clone();
        sorted.sort_unstable();
        assert_eq!(sorted, all, "every unmeasured client is explored first");
        let times = [5.0, 1.0, 4.0, 2.0, 9.0, 3.0];
        report(
            &mut s,
            &first,
            &first.iter().map(|&k| times[k]).collect::<Vec<_>>(),
        );
        assert_eq!(select(&mut s, 1, &all, 3), [1, 3, 5]);
        assert_eq!(select(&mut s, 2, &all, 5), [1, 3, 5, 2]);
        // Only the available clients count: without 1 and 3, the next fit.
        assert_eq!(select(&mut s, 3, &[0, 2, 4, 5], 3), [5, 2]);
        // Without a deadline, the budget's fastest, whatever their time.
        let mut s = fedcs(None, 6);
        let first = select(&mut s, 0, &all, 6);
        report(
            &mut s,
            &first,
            &first.iter().map(|&k| times[k]).collect::<Vec<_>>(),
        );
        assert_eq!(select(&mut s, 1, &all, 5), [1, 3, 5, 2, 0]);
    }

    /// Unmeasured clients come first (at random), the greedy fills the rest; a client
    /// selected and not heard of is late: never within a deadline, last without one.
    #[test]
    fn unmeasured_clients_first_and_late_clients_last() {
        let all = [0, 1, 2, 3];
        let mut s = fedcs(Some(10.0), 4);
        select(&mut s, 0, &[0, 1], 2);
        report(&mut s, &[0], &[2.0]);
        // Client 0 took 2 s; client 1 was not heard of.
        let mut picked = select(&mut s, 1, &all, 3);
        assert_eq!(picked.pop(), Some(0), "the greedy fills after the explored");
        picked.sort_unstable();
        assert_eq!(picked, [2, 3]);
        report(&mut s, &[2, 3, 0], &[3.0, 1.0, 2.0]);
        assert_eq!(
            select(&mut s, 2, &all, 4),
            [3, 0, 2],
            "late client 1 never fits"
        );
        let mut s = fedcs(None, 4);
        select(&mut s, 0, &all, 4);
        report(&mut s, &[0, 2, 3], &[3.0, 1.0, 2.0]);
        assert_eq!(select(&mut s, 1, &all, 4), [2, 3, 0, 1]);
    }

    #[test]
    fn without_a_clock_it_explores_forever_and_the_state_round_trips() {
        let mut s = fedcs(Some(1.0), 5);
        let picked = select(&mut s, 0, &[0, 1, 2, 3, 4], 2);
        s.observe(&Feedback {
            round: 0,
            selected: &picked,
            train_losses: &[1.0, 1.0],
            updates: None,
            durations: None,
            dropped: None,
        });
        assert!(s.estimate.iter().all(|&e| e == Estimate::Unknown));
        report(&mut s, &[3], &[0.5]);
        let saved = s.save();
        let mut t = fedcs(Some(1.0), 5);
        t.load(&saved).unwrap();
        assert_eq!(t.estimate, s.estimate);
        let mut short = fedcs(Some(1.0), 4);
        assert!(
            short
                .load(&saved)
                .unwrap_err()
                .to_string()
                .contains("estimates")
        );
        assert!(
            FedCsConfig {
                deadline_s: Some(0.0)
            }
            .validate()
            .unwrap_err()
            .to_string()
            .contains("selection.fedcs.deadline_s")
        );
    }

    /// Left out, the deadline is the round policy's, and the resolved config records it;
    /// a given one stays; other strategies' resolved configs leave the table out.
    #[test]
    fn the_deadline_defaults_to_the_round_policy_s() {
        use crate::config::Config;
        let load = |set: &[&str]| {
            let set: Vec<String> = set.iter().map(|s| s.to_string()).collect();
            Config::load(None, &set).unwrap()
        };
        let fedcs = "selection.strategy=\"fedcs\"";
        let lognormal = "system.kind=\"lognormal\"";
        let deadline = "system.round={policy=\"deadline\", deadline_s=2.5}";
        let c = load(&[fedcs, lognormal, deadline]);
        assert_eq!(c.selection.fedcs.deadline_s, Some(2.5));
        assert!(c.to_resolved_toml().contains("[selection.fedcs]"));
        let given = load(&[fedcs, lognormal, deadline, "selection.fedcs.deadline_s=4"]);
        assert_eq!(given.selection.fedcs.deadline_s, Some(4.0));
        assert_eq!(load(&[fedcs, lognormal]).selection.fedcs.deadline_s, None);
        let uniform = load(&[lognormal, deadline]);
        assert_eq!(uniform.selection.fedcs.deadline_s, None);
        assert!(!uniform.to_resolved_toml().contains("fedcs"));
    }
}
