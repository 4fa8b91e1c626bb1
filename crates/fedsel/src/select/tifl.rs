//! TiFL (Chai, Ali, Zawad, Truex, Anwar, Baracaldo, Zhou, Ludwig, Yan & Cheng, HPDC'20,
//! "TiFL: A Tier-based Federated Learning System"): the clients are grouped into tiers of
//! similar latency; each round one tier is drawn, with credits bounding how often each
//! tier may be drawn and probabilities that favour the tiers whose model accuracy lags,
//! and the round's clients are drawn uniformly within that tier.
//!
//! There is no official code. The `code` protocol follows FLGo's unofficial
//! implementation, `flgo/algorithm/TiFL.py` (PyPI `flgo` 0.4.4, itself after bacox/fltk),
//! cited below as `TiFL.py:LINE`; its option names and defaults are the keys of
//! `[selection.tifl]`: `T` tiers (5), interval `I` (10) and credit skew `C` (0)
//! (`TiFL.py:16`). The `paper` protocol follows the paper's Alg. 1 (profiling and tiering)
//! and Alg. 2 (adaptive tier selection). The paper's text was not at hand when this was
//! written: its algorithm lines are cited as they are commonly read, not quoted.
//!
//! **The rule, both protocols.**
//! 1. *Tiering* (Alg. 1; `TiFL.py:20-25`): the clients are sorted by latency (ties by id)
//!    and split into `T` tiers of consecutive clients, fastest first, as
//!    `np.array_split` does (FLGo's `np.split` refuses N not divisible by T; here the first
//!    N mod T tiers hold one client more). Each tier's latency is its clients' mean.
//! 2. *Credits* (Alg. 2 `Credits_t`; `TiFL.py:33-43`): shares are drawn from a symmetric
//!    Dirichlet of concentration p = (−4·ln(C + 10⁻⁷))⁴, rounded to 3 decimals,
//!    renormalised and sorted ascending; a run of R rounds is cut at ⌊R·cumsum⌋ into
//!    credits, and the slowest tier gets the fewest. `C = 0` gives p ≈ 1.7·10⁷, so every
//!    tier gets R / T credits (to rounding).
//! 3. *Tier choice* (Alg. 2 lines 6-10; `TiFL.py:60-65`): a tier is drawn by its
//!    probability among the tiers with credits left, and loses one credit. A tier whose
//!    credits are spent is never drawn (both redraw until a tier with credits comes up,
//!    which is the same law). A tier none of whose clients is available this round is not
//!    drawn either (FLGo ignores availability); when no tier has both credits and an
//!    available client, the round selects nobody (FLGo would loop forever).
//! 4. *Clients* (Alg. 2 line 11; `TiFL.py:66`): min(K_t, |tier|) of the tier's available
//!    clients, uniformly (see the protocols for replacement).
//! 5. *Probabilities* (Alg. 2 `ChangeProbs`; `TiFL.py:69-82`): probabilities start at 1/T.
//!    When they change, the n tiers with credits left are ranked by accuracy ascending,
//!    and the i-th (0-based) gets (n − i) / D with D = n(n + 1)/2; a tier without credits
//!    gets 0. The tier that lags most is thus drawn n times as often as the one that leads.
//!
//! **Accuracy is a held-out loss here.** The selector's query API ([`ClientQuery`]) gives
//! the current global model's held-out *loss* per client, not its accuracy. A tier's
//! "accuracy" is therefore its held-out loss, and "accuracy ascending" reads "loss
//! descending": the tier with the highest loss ranks first. A tier never evaluated ranks as
//! the worst (FLGo starts every tier at accuracy 0.0, `TiFL.py:29`). Only available clients
//! can be asked; a tier none of whose clients is available keeps its last value. Each asked
//! client is one broadcast, one evaluation and one report in the run's ledger.
//!
//! **When the probabilities change, and who is evaluated.** Rounds are 0-based (r). The
//! evaluation at round r is of the global model round r starts from, which is the model
//! FLGo evaluates at the end of round r − 1 (`TiFL.py:54-56`) and Alg. 2 line 17 calls
//! A^{r}. FLGo evaluates every client every round but reads the values only at rounds
//! r ≥ I with r mod I = 0 (`TiFL.py:48`); fedsel asks the available clients only at those
//! rounds, which gives FLGo's choices at a fraction of its evaluations.
//!
//! **Protocols** (decisions.md), where the paper and FLGo differ:
//! - *latency*: `paper` measures it (Alg. 1 profiles every client before training; the
//!   latency is what the server timed). Here profiling is by real rounds: while some
//!   available client was never timed, the round takes up to K_t never-timed available
//!   clients uniformly (the rest of the budget uniformly from the other available
//!   clients), and a client's latency is the mean of the round trips the server measured
//!   ([`Feedback::durations`]); a client the round policy dropped counts with the censored
//!   bound it is known to exceed ([`Feedback::dropped`]; the paper's T_max timeout). Tiers are
//!   built at the first round in which every available client was timed; a client never
//!   seen by then ranks slowest. `code` reads each client's latency before the first round
//!   as FLGo reads the simulator's `c._latency` (`TiFL.py:22`): the round trip its device
//!   reports when it registers ([`Setup::durations`]). Without a clock nobody has a
//!   latency: every latency is 0 and the tiers are the clients by id.
//! - *when probabilities change*: `paper` changes them only when the last tier drawn did
//!   not improve since the previous evaluation I rounds earlier (Alg. 2 line 4,
//!   A^r_current ≤ A^{r−I}_current; here its loss did not fall), and the first evaluation
//!   after tiering only records; `code` changes them at every evaluation (`TiFL.py:48-49`).
//! - *a tier's accuracy*: `paper` evaluates on the tier's pooled test data (Alg. 2
//!   `TestData_t`), here the tier's per-client losses weighted by each client's reported
//!   size n_k (the held-out sizes are not given to selectors; they are proportional to n_k
//!   under a fixed held-out fraction); `code` takes the plain mean of its clients' values
//!   (`TiFL.py:56`).
//! - *clients within a tier*: `paper` draws a set without replacement (Alg. 2 line 11,
//!   "random set of |C| clients"); `code` draws with replacement (`np.random.choice`'s
//!   default, `TiFL.py:66`), and FLGo's `communicate` trains each distinct client once
//!   (`fedbase.py:379`, `list(set(selected_clients))`), so a round may have fewer clients.
//!
//! Credits (rule 2) follow FLGo under both protocols: Alg. 2 takes `Credits_t` as given.
//! Aggregation is the run's rule; `auto` gives the unweighted mean, FLGo's default
//! (`aggregate = "uniform"`); the paper's FedAvg weighs by data size (`data_size`).

use rand::Rng as _;
use rand_distr::{Distribution, Gamma};
use serde::{Deserialize, Serialize};

use super::{
    ClientQuery, Feedback, Protocol, RoundContext, Selection, Selector, Setup,
    weighted_without_replacement,
};
use crate::error::{ConfigError, Error};
use crate::rng::Rng;
use crate::validate::check;

/// TiFL's options, under FLGo's names and defaults (`TiFL.py:16`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct TiflConfig {
    /// Where the paper and FLGo differ (see the module doc); defaults to `paper`.
    pub protocol: Protocol,
    /// Number of tiers T (5).
    #[serde(rename = "T")]
    pub tiers: usize,
    /// Interval I in rounds between changes of the tier probabilities (10).
    #[serde(rename = "I")]
    pub interval: usize,
    /// Credit skew C in [0, 1): 0 shares the credits evenly; larger gives the slow tiers
    /// fewer (0).
    #[serde(rename = "C")]
    pub credit_skew: f64,
}

impl Default for TiflConfig {
    fn default() -> Self {
        Self {
            protocol: Protocol::Paper,
            tiers: 5,
            interval: 10,
            credit_skew: 0.0,
        }
    }
}

impl TiflConfig {
    /// Whether every option has its default (the config then leaves the table out).
    pub(crate) fn is_default(&self) -> bool {
        *self == Self::default()
    }

    /// Checks every option, naming the key it refuses.
    pub(crate) fn validate(&self) -> Result<(), ConfigError> {
        check(self.tiers >= 1, "selection.tifl.T", "must be at least 1")?;
        check(self.interval >= 1, "selection.tifl.I", "must be at least 1")?;
        check(
            (0.0..1.0).contains(&self.credit_skew),
            "selection.tifl.C",
            "must be in [0, 1)",
        )
    }
}

/// One tier.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
struct Tier {
    /// Its clients, fastest first.
    clients: Vec<usize>,
    /// Its clients' mean latency in seconds.
    latency: f64,
    /// Times it may still be drawn.
    credit: usize,
    /// Its probability of being drawn.
    prob: f64,
    /// Its last held-out loss (the accuracy's stand-in); `None` before any evaluation.
    loss: Option<f64>,
}

/// What TiFL learns, checkpointed.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
struct State {
    /// Per client, the sum and count of the round trips measured (`paper`'s profiling).
    timed_sum: Vec<f64>,
    timed: Vec<u32>,
    /// The tiers, once built.
    tiers: Option<Vec<Tier>>,
    /// The tier drawn last.
    current: Option<usize>,
    /// Whether `paper` has evaluated since tiering (its first evaluation only records).
    evaluated: bool,
}

/// TiFL.
#[derive(Debug, Clone)]
pub struct Tifl {
    cfg: TiflConfig,
    sizes: Vec<f64>,
    rounds: usize,
    registered: Option<Vec<f64>>,
    state: State,
}

impl Tifl {
    /// TiFL with `cfg`.
    pub fn new(cfg: TiflConfig) -> Self {
        Self {
            cfg,
            sizes: Vec::new(),
            rounds: 0,
            registered: None,
            state: State::default(),
        }
    }

    /// Each client's latency as the protocol knows it when the tiers are built.
    fn latencies(&self) -> Vec<f64> {
        let n = self.sizes.len();
        match (self.cfg.protocol, &self.registered) {
            (Protocol::Code, Some(d)) => d.clone(),
            (Protocol::Code, None) => vec![0.0; n],
            (Protocol::Paper, _) => (0..n)
                .map(|k| match self.state.timed[k] {
                    0 => f64::INFINITY,
                    c => self.state.timed_sum[k] / f64::from(c),
                })
                .collect(),
        }
    }

    /// Builds the tiers and their credits (rules 1 and 2).
    fn build_tiers(&mut self, rng: &mut Rng) {
        let groups = tiering(&self.latencies(), self.cfg.tiers);
        let credit = credits(groups.len(), self.rounds, self.cfg.credit_skew, rng);
        let prob = 1.0 / groups.len() as f64;
        let mut tiers: Vec<Tier> = groups
            .into_iter()
            .map(|(clients, latency)| Tier {
                clients,
                latency,
                credit: 0,
                prob,
                loss: None,
            })
            .collect();
        // The slowest tier gets the fewest credits (`TiFL.py:41-43`, a stable sort).
        let mut slowest_first: Vec<usize> = (0..tiers.len()).collect();
        slowest_first.sort_by(|&a, &b| tiers[b].latency.total_cmp(&tiers[a].latency));
        for (t, c) in slowest_first.into_iter().zip(credit) {
            tiers[t].credit = c;
        }
        self.state.tiers = Some(tiers);
    }

    /// Asks the available clients for their held-out losses and updates each tier's; then
    /// changes the probabilities as the protocol says (rule 5).
    fn evaluate(&mut self, available: &[usize], query: &mut dyn ClientQuery) -> Result<(), Error> {
        let losses = query.holdout_losses(available)?;
        let n = self.sizes.len();
        let mut loss = vec![None; n];
        for (&k, &l) in available.iter().zip(&losses) {
            loss[k] = Some(l);
        }
        let protocol = self.cfg.protocol;
        let sizes = &self.sizes;
        let current = self.state.current;
        let tiers = self.state.tiers.as_mut().expect("tiers are built");
        let before = current.and_then(|t| tiers[t].loss);
        for tier in tiers.iter_mut() {
            let known: Vec<(f64, f64)> = tier
                .clients
                .iter()
                .filter_map(|&k| loss[k].map(|l| (sizes[k], l)))
                .collect();
            if let Some(l) = tier_loss(protocol, &known) {
                tier.loss = Some(l);
            }
        }
        let change = match protocol {
            Protocol::Code => true,
            Protocol::Paper => {
                let after = current.and_then(|t| tiers[t].loss);
                let first = !self.state.evaluated;
                self.state.evaluated = true;
                !first && !improved(before, after)
            }
        };
        if change {
            change_probs(tiers);
        }
        Ok(())
    }
}

/// Whether a tier's held-out loss fell from `before` to `after` (its accuracy rose).
fn improved(before: Option<f64>, after: Option<f64>) -> bool {
    matches!((before, after), (Some(b), Some(a)) if a < b)
}

/// A tier's loss from its evaluated clients' (size, loss): the size-weighted mean under
/// `paper` (its pooled test data), the plain mean under `code` (`TiFL.py:56`).
fn tier_loss(protocol: Protocol, known: &[(f64, f64)]) -> Option<f64> {
    if known.is_empty() {
        return None;
    }
    Some(match protocol {
        Protocol::Paper => {
            let total: f64 = known.iter().map(|x| x.0).sum();
            if total > 0.0 {
                known.iter().map(|x| x.0 * x.1).sum::<f64>() / total
            } else {
                known.iter().map(|x| x.1).sum::<f64>() / known.len() as f64
            }
        }
        Protocol::Code => known.iter().map(|x| x.1).sum::<f64>() / known.len() as f64,
    })
}

/// Rule 1: the clients sorted by latency (ties by id) and split into at most `t` tiers of
/// consecutive clients as `np.array_split` splits, each with its mean latency.
fn tiering(latency: &[f64], t: usize) -> Vec<(Vec<usize>, f64)> {
    let mut order: Vec<usize> = (0..latency.len()).collect();
    order.sort_by(|&a, &b| latency[a].total_cmp(&latency[b]).then(a.cmp(&b)));
    let t = t.min(order.len()).max(1);
    let (base, extra) = (order.len() / t, order.len() % t);
    let mut out = Vec::with_capacity(t);
    let mut start = 0;
    for i in 0..t {
        let len = base + usize::from(i < extra);
        let clients = order[start..start + len].to_vec();
        start += len;
        let mean = clients.iter().map(|&k| latency[k]).sum::<f64>() / len.max(1) as f64;
        out.push((clients, mean));
    }
    out
}

/// Rule 2 (`TiFL.py:33-40`): `t` credit counts summing to `rounds`, ascending.
fn credits(t: usize, rounds: usize, skew: f64, rng: &mut Rng) -> Vec<usize> {
    let p = (-4.0 * (skew + 10e-8).ln()).powi(4);
    let gamma = Gamma::new(p, 1.0).expect("a positive concentration");
    let draws: Vec<f64> = (0..t).map(|_| gamma.sample(rng)).collect();
    let total: f64 = draws.iter().sum();
    let shares: Vec<f64> = draws
        .iter()
        .map(|x| (x / total * 1000.0).round_ties_even() / 1000.0)
        .collect();
    shares_to_credits(&shares, rounds)
}

/// The rounding, normalisation, sort and split of `TiFL.py:35-40`, from Dirichlet shares.
fn shares_to_credits(shares: &[f64], rounds: usize) -> Vec<usize> {
    let total: f64 = shares.iter().sum();
    let mut shares: Vec<f64> = shares.iter().map(|s| s / total).collect();
    shares.sort_by(f64::total_cmp);
    let mut cum = 0.0;
    let mut cuts = Vec::with_capacity(shares.len());
    for s in &shares[..shares.len() - 1] {
        cum += s;
        cuts.push(((cum * rounds as f64) as usize).min(rounds));
    }
    cuts.push(rounds);
    let mut last = 0;
    cuts.into_iter()
        .map(|c| {
            let c = c.max(last);
            let n = c - last;
            last = c;
            n
        })
        .collect()
}

/// Rule 5 (`TiFL.py:69-82`): the tiers with credits, ranked by loss descending (accuracy
/// ascending; never evaluated first; ties by tier), get (n − rank) / D.
fn change_probs(tiers: &mut [Tier]) {
    let n = tiers.iter().filter(|t| t.credit > 0).count();
    let d = (n * (n + 1)) as f64 / 2.0;
    let mut order: Vec<usize> = (0..tiers.len()).collect();
    let key = |t: &Tier| t.loss.unwrap_or(f64::INFINITY);
    order.sort_by(|&a, &b| key(&tiers[b]).total_cmp(&key(&tiers[a])).then(a.cmp(&b)));
    let mut rank = 0;
    for t in order {
        if tiers[t].credit > 0 {
            tiers[t].prob = (n - rank) as f64 / d;
            rank += 1;
        } else {
            tiers[t].prob = 0.0;
        }
    }
}

impl Selector for Tifl {
    fn name(&self) -> &'static str {
        "tifl"
    }

    fn setup(&mut self, setup: &Setup) {
        let n = setup.sizes.len();
        self.sizes = setup.sizes.iter().map(|&s| s as f64).collect();
        self.rounds = setup.rounds;
        self.registered = setup.durations.clone();
        self.state = State {
            timed_sum: vec![0.0; n],
            timed: vec![0; n],
            ..State::default()
        };
    }

    fn select(
        &mut self,
        ctx: &RoundContext<'_>,
        query: &mut dyn ClientQuery,
        rng: &mut Rng,
    ) -> Result<Selection, Error> {
        if self.state.tiers.is_none() {
            if self.cfg.protocol == Protocol::Paper {
                // Profiling (Alg. 1) by real rounds: the never-timed available clients first.
                let (untimed, timed): (Vec<usize>, Vec<usize>) = ctx
                    .available
                    .iter()
                    .partition(|&&k| self.state.timed[k] == 0);
                if !untimed.is_empty() {
                    let take = ctx.budget.min(untimed.len());
                    let mut clients = sample(&untimed, take, rng);
                    let rest = (ctx.budget - take).min(timed.len());
                    clients.extend(sample(&timed, rest, rng));
                    return Ok(Selection {
                        clients,
                        weights: None,
                    });
                }
            }
            self.build_tiers(rng);
        }
        let due = match self.cfg.protocol {
            Protocol::Code => ctx.round >= self.cfg.interval,
            Protocol::Paper => true,
        };
        if due && ctx.round.is_multiple_of(self.cfg.interval) && !ctx.available.is_empty() {
            self.evaluate(ctx.available, query)?;
        }
        let tiers = self.state.tiers.as_mut().expect("tiers are built");
        let mut is_available = vec![false; self.sizes.len()];
        for &k in ctx.available {
            is_available[k] = true;
        }
        let members: Vec<Vec<usize>> = tiers
            .iter()
            .map(|t| {
                t.clients
                    .iter()
                    .copied()
                    .filter(|&k| is_available[k])
                    .collect()
            })
            .collect();
        let eligible: Vec<usize> = (0..tiers.len())
            .filter(|&t| tiers[t].credit > 0 && !members[t].is_empty())
            .collect();
        if eligible.is_empty() || ctx.budget == 0 {
            return Ok(Selection::default());
        }
        let weights: Vec<f64> = eligible.iter().map(|&t| tiers[t].prob).collect();
        let t = weighted_without_replacement(&eligible, &weights, 1, rng)[0];
        tiers[t].credit -= 1;
        self.state.current = Some(t);
        let pool = &members[t];
        let clients = match self.cfg.protocol {
            Protocol::Paper => sample(pool, ctx.budget.min(pool.len()), rng),
            Protocol::Code => {
                let draws = ctx.budget.min(tiers[t].clients.len());
                let mut c: Vec<usize> = (0..draws)
                    .map(|_| pool[rng.random_range(0..pool.len())])
                    .collect();
                c.sort_unstable();
                c.dedup();
                c
            }
        };
        Ok(Selection {
            clients,
            weights: None,
        })
    }

    /// `paper` times its clients until the tiers are built: each kept update's round trip,
    /// each dropped entry's censored bound; without a clock, 0.
    fn observe(&mut self, f: &Feedback<'_>) {
        if self.cfg.protocol != Protocol::Paper || self.state.tiers.is_some() {
            return;
        }
        let mut time = |k: usize, d: f64| {
            self.state.timed_sum[k] += d;
            self.state.timed[k] += 1;
        };
        match f.durations {
            Some(d) => {
                for (&k, &d) in f.selected.iter().zip(d) {
                    time(k, d);
                }
            }
            None => {
                for &k in f.selected {
                    time(k, 0.0);
                }
            }
        }
        if let Some(dropped) = f.dropped {
            for (&k, &d) in dropped.clients.iter().zip(dropped.at_least_s) {
                time(k, d);
            }
        }
    }

    fn save(&self) -> serde_json::Value {
        super::save_state(&self.state)
    }

    fn load(&mut self, state: &serde_json::Value) -> Result<(), Error> {
        let loaded: State = super::load_state("tifl", state)?;
        let n = self.sizes.len();
        super::check_loaded("tifl", "timings", loaded.timed.len(), n)?;
        super::check_loaded("tifl", "timing sums", loaded.timed_sum.len(), n)?;
        if let Some(tiers) = &loaded.tiers
            && let Some(&k) = tiers.iter().flat_map(|t| &t.clients).find(|&&k| k >= n)
        {
            super::check_loaded("tifl", "clients", k + 1, n)?;
        }
        self.state = loaded;
        Ok(())
    }
}

/// `k` distinct items of `items`, uniformly, in draw order.
fn sample(items: &[usize], k: usize, rng: &mut Rng) -> Vec<usize> {
    rand::seq::index::sample(rng, items.len(), k)
        .into_iter()
        .map(|i| items[i])
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::rng::{Purpose, stream};
    use crate::select::testing::{Recording, setup};

    fn tifl(protocol: Protocol, durations: Option<Vec<f64>>, n: usize, rounds: usize) -> Tifl {
        let mut s = Tifl::new(TiflConfig {
            protocol,
            tiers: 3,
            interval: 2,
            credit_skew: 0.0,
        });
        s.setup(&Setup {
            durations,
            rounds,
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
    fn tiers_are_consecutive_latencies_fastest_first() {
        // 7 clients, 3 tiers: sizes 3, 2, 2 as np.array_split gives; ties by id.
        let latency = [5.0, 1.0, 9.0, 3.0, 1.0, 7.0, 2.0];
        let tiers = tiering(&latency, 3);
        assert_eq!(tiers[0], (vec![1, 4, 6], 4.0 / 3.0));
        assert_eq!(tiers[1], (vec![3, 0], 4.0));
        assert_eq!(tiers[2], (vec![5, 2], 8.0));
        // More tiers than clients: one client each.
        assert_eq!(tiering(&[2.0, 1.0], 5).len(), 2);
    }

    #[test]
    fn credits_split_the_rounds_slowest_tier_fewest() {
        // Shares (0.5, 0.2, 0.3) of 10 rounds: sorted 0.2, 0.3, 0.5, cut at ⌊2⌋, ⌊5⌋.
        assert_eq!(shares_to_credits(&[0.5, 0.2, 0.3], 10), vec![2, 3, 5]);
        // C = 0: even shares, 100 rounds in 3 tiers: 0.333 each renormalised, cut at
        // ⌊33.33⌋ and ⌊66.67⌋.
        let mut rng = stream(1, Purpose::Selection, 0, 0);
        assert_eq!(credits(3, 100, 0.0, &mut rng), vec![33, 33, 34]);
        assert_eq!(credits(5, 10, 0.0, &mut rng), vec![2; 5]);
        // C near 1 skews them; the sum stays the rounds.
        let c = credits(4, 50, 0.9, &mut rng);
        assert_eq!(c.iter().sum::<usize>(), 50);
        assert!(c.windows(2).all(|w| w[0] <= w[1]));
        // The credits go to the tiers slowest first, fewest first.
        let mut s = tifl(Protocol::Code, Some(vec![9.0, 1.0, 5.0]), 3, 10);
        s.build_tiers(&mut rng);
        let tiers = s.state.tiers.as_ref().unwrap();
        let got: Vec<(Vec<usize>, usize)> = tiers
            .iter()
            .map(|t| (t.clients.clone(), t.credit))
            .collect();
        assert_eq!(got, vec![(vec![1], 4), (vec![2], 3), (vec![0], 3)]);
    }

    #[test]
    fn each_draw_spends_one_credit_and_a_spent_tier_is_never_drawn() {
        // 6 clients, 3 tiers {0,1}, {2,3}, {4,5}; 4 rounds of credits: (1, 1, 2), the
        // fastest tier the most.
        let durations = vec![1.0, 1.0, 2.0, 2.0, 3.0, 3.0];
        let all = [0, 1, 2, 3, 4, 5];
        let mut s = tifl(Protocol::Code, Some(durations), 6, 4);
        let mut rng = stream(7, Purpose::Selection, 0, 0);
        let mut q = Recording::new(vec![0.0; 6], vec![0.0; 6]);
        let mut drawn = Vec::new();
        for r in 0..4 {
            // Round 2 changes the probabilities (equal losses: ranked by tier); the
            // credits bound the draws whatever the probabilities.
            let sel = s.select(&ctx(r, &all, 2), &mut q, &mut rng).unwrap();
            let t = s.state.current.unwrap();
            assert!(
                sel.clients.iter().all(|k| k / 2 == t),
                "{sel:?} in tier {t}"
            );
            drawn.push(t);
        }
        drawn.sort_unstable();
        assert_eq!(drawn, vec![0, 0, 1, 2]);
        let credits: Vec<usize> = s
            .state
            .tiers
            .as_ref()
            .unwrap()
            .iter()
            .map(|t| t.credit)
            .collect();
        assert_eq!(credits, vec![0, 0, 0]);
        // Every credit spent: nobody is selected.
        let sel = s.select(&ctx(4, &all, 2), &mut q, &mut rng).unwrap();
        assert!(sel.clients.is_empty());

        // A tier without credits is never drawn, whatever its probability.
        for seed in 0..200 {
            let mut s = tifl(Protocol::Code, Some(vec![1.0, 2.0, 3.0]), 3, 30);
            let mut rng = stream(seed, Purpose::Selection, 0, 0);
            s.build_tiers(&mut rng);
            let tiers = s.state.tiers.as_mut().unwrap();
            tiers[1].credit = 0;
            tiers[1].prob = 0.98;
            tiers[0].prob = 0.01;
            tiers[2].prob = 0.01;
            let sel = s.select(&ctx(1, &[0, 1, 2], 1), &mut q, &mut rng).unwrap();
            assert_ne!(sel.clients, vec![1]);
        }
    }

    #[test]
    fn probabilities_rank_the_tiers_by_loss_among_those_with_credits() {
        let tier = |loss: Option<f64>, credit: usize| Tier {
            clients: vec![],
            latency: 0.0,
            credit,
            prob: 0.25,
            loss,
        };
        // Losses 0.5, 0.9, 0.1, 0.7 (accuracy ascending = loss descending: 1, 3, 0, 2):
        // n = 4, D = 10, probabilities 4/10, 3/10, 2/10, 1/10.
        let mut tiers = vec![
            tier(Some(0.5), 3),
            tier(Some(0.9), 3),
            tier(Some(0.1), 3),
            tier(Some(0.7), 3),
        ];
        change_probs(&mut tiers);
        let p: Vec<f64> = tiers.iter().map(|t| t.prob).collect();
        assert_eq!(p, vec![0.2, 0.4, 0.1, 0.3]);
        // Tier 1 has no credits: n = 3, D = 6; the others rank 3, 0, 2 → 3/6, 2/6, 1/6;
        // a never-evaluated tier ranks first.
        tiers[1].credit = 0;
        tiers[2].loss = None;
        change_probs(&mut tiers);
        let p: Vec<f64> = tiers.iter().map(|t| t.prob).collect();
        assert_eq!(p, vec![1.0 / 6.0, 0.0, 3.0 / 6.0, 2.0 / 6.0]);
    }

    #[test]
    fn evaluations_set_each_tier_s_loss_and_the_protocols_decide_when_to_change() {
        // Clients 0..6 in tiers {0,1}, {2,3}, {4,5}; client sizes all equal.
        let durations = vec![1.0, 1.0, 2.0, 2.0, 3.0, 3.0];
        let all = [0, 1, 2, 3, 4, 5];
        let losses = vec![0.2, 0.4, 0.9, 0.7, 0.5, 0.5];
        let mut q = Recording::new(losses, vec![0.0; 6]);
        let mut rng = stream(3, Purpose::Selection, 0, 0);
        // code: no evaluation before round I = 2; at round 2 every available client is
        // asked, the tiers' mean losses are 0.3, 0.8, 0.5, and the probabilities change.
        let mut s = tifl(Protocol::Code, Some(durations.clone()), 6, 30);
        s.select(&ctx(0, &all, 2), &mut q, &mut rng).unwrap();
        s.select(&ctx(1, &all, 2), &mut q, &mut rng).unwrap();
        assert!(q.calls.is_empty());
        s.select(&ctx(2, &all, 2), &mut q, &mut rng).unwrap();
        assert_eq!(q.calls, vec![("holdout", all.to_vec())]);
        let tiers = s.state.tiers.as_ref().unwrap();
        let l: Vec<f64> = tiers.iter().map(|t| t.loss.unwrap()).collect();
        assert!((l[0] - 0.3).abs() < 1e-12 && (l[1] - 0.8).abs() < 1e-12 && l[2] == 0.5);
        let p: Vec<f64> = tiers.iter().map(|t| t.prob).collect();
        assert_eq!(p, vec![1.0 / 6.0, 3.0 / 6.0, 2.0 / 6.0]);
        // Only the available clients are asked; round 3 asks nobody.
        s.select(&ctx(3, &all, 2), &mut q, &mut rng).unwrap();
        s.select(&ctx(4, &[0, 2], 2), &mut q, &mut rng).unwrap();
        assert_eq!(q.calls[1], ("holdout", vec![0, 2]));

        // paper: the first evaluation only records; the next changes the probabilities
        // only when the last tier drawn did not improve.
        let mut s = tifl(Protocol::Paper, None, 6, 30);
        s.state.timed = vec![1; 6];
        s.state.timed_sum = durations.clone();
        let mut q = Recording::new(vec![0.2, 0.4, 0.9, 0.7, 0.5, 0.5], vec![0.0; 6]);
        s.select(&ctx(0, &all, 2), &mut q, &mut rng).unwrap();
        let probs = |s: &Tifl| -> Vec<f64> {
            s.state
                .tiers
                .as_ref()
                .unwrap()
                .iter()
                .map(|t| t.prob)
                .collect()
        };
        assert_eq!(q.calls.len(), 1);
        assert_eq!(probs(&s), vec![1.0 / 3.0; 3]);
        s.select(&ctx(1, &all, 2), &mut q, &mut rng).unwrap();
        // Every loss falls: the tier drawn last improved, nothing changes.
        q.holdout = vec![0.1, 0.3, 0.8, 0.6, 0.4, 0.4];
        s.select(&ctx(2, &all, 2), &mut q, &mut rng).unwrap();
        assert_eq!(probs(&s), vec![1.0 / 3.0; 3]);
        // The same losses again: no improvement, so the ranking applies (0.2, 0.7, 0.4).
        s.select(&ctx(3, &all, 2), &mut q, &mut rng).unwrap();
        s.select(&ctx(4, &all, 2), &mut q, &mut rng).unwrap();
        assert_eq!(probs(&s), vec![1.0 / 6.0, 3.0 / 6.0, 2.0 / 6.0]);
        // The paper weighs a tier's clients by size.
        let w = tier_loss(Protocol::Paper, &[(1.0, 0.0), (3.0, 1.0)]).unwrap();
        assert_eq!(w, 0.75);
        assert_eq!(
            tier_loss(Protocol::Code, &[(1.0, 0.0), (3.0, 1.0)]),
            Some(0.5)
        );
    }

    #[test]
    fn paper_times_every_client_before_tiering_and_code_reads_the_registration() {
        let mut rng = stream(5, Purpose::Selection, 0, 0);
        let mut q = Recording::new(vec![0.0; 6], vec![0.0; 6]);
        let all = [0, 1, 2, 3, 4, 5];
        let mut s = tifl(Protocol::Paper, None, 6, 30);
        let mut seen = Vec::new();
        // Budget 4: the first round takes 4 untimed clients, the second the 2 left and 2
        // others; client 5 is dropped with a bound of 9 s.
        for r in 0..2 {
            let sel = s.select(&ctx(r, &all, 4), &mut q, &mut rng).unwrap();
            assert!(s.state.tiers.is_none());
            let kept: Vec<usize> = sel.clients.iter().copied().filter(|&k| k != 5).collect();
            let durations: Vec<f64> = kept.iter().map(|&k| k as f64).collect();
            let dropped: Vec<usize> = sel.clients.iter().copied().filter(|&k| k == 5).collect();
            let bounds = vec![9.0; dropped.len()];
            seen.extend(sel.clients.iter().copied());
            s.observe(&Feedback {
                round: r,
                selected: &kept,
                train_losses: &vec![0.0; kept.len()],
                updates: None,
                durations: Some(&durations),
                dropped: Some(crate::select::Dropped {
                    clients: &dropped,
                    at_least_s: &bounds,
                }),
            });
        }
        seen.sort_unstable();
        seen.dedup();
        assert_eq!(seen, all.to_vec());
        s.select(&ctx(2, &all, 4), &mut q, &mut rng).unwrap();
        let tiers: Vec<Vec<usize>> = s
            .state
            .tiers
            .as_ref()
            .unwrap()
            .iter()
            .map(|t| t.clients.clone())
            .collect();
        assert_eq!(tiers, vec![vec![0, 1], vec![2, 3], vec![4, 5]]);

        // code: tiers from the registered round trips at round 0.
        let mut s = tifl(
            Protocol::Code,
            Some(vec![6.0, 5.0, 4.0, 3.0, 2.0, 1.0]),
            6,
            30,
        );
        let sel = s.select(&ctx(0, &all, 4), &mut q, &mut rng).unwrap();
        let tiers: Vec<Vec<usize>> = s
            .state
            .tiers
            .as_ref()
            .unwrap()
            .iter()
            .map(|t| t.clients.clone())
            .collect();
        assert_eq!(tiers, vec![vec![5, 4], vec![3, 2], vec![1, 0]]);
        // With replacement, deduplicated: at most the tier's 2 clients.
        assert!(!sel.clients.is_empty() && sel.clients.len() <= 2);
    }

    #[test]
    fn the_same_seed_gives_the_same_selections() {
        let run = |seed: u64| -> Vec<Vec<usize>> {
            let mut s = tifl(
                Protocol::Code,
                Some((0..12).map(f64::from).collect()),
                12,
                20,
            );
            let mut q = Recording::new(
                (0..12).map(|k| f64::from(k) / 12.0).collect(),
                vec![0.0; 12],
            );
            let all: Vec<usize> = (0..12).collect();
            (0..20)
                .map(|r| {
                    let mut rng = stream(seed, Purpose::Selection, r as u64, 0);
                    s.select(&ctx(r, &all, 3), &mut q, &mut rng)
                        .unwrap()
                        .clients
                })
                .collect()
        };
        assert_eq!(run(11), run(11));
        assert_ne!(run(11), run(12));
    }

    #[test]
    fn save_and_load_restore_the_tiers() {
        let mut s = tifl(Protocol::Code, Some(vec![1.0, 2.0, 3.0]), 3, 10);
        let mut rng = stream(1, Purpose::Selection, 0, 0);
        let mut q = Recording::new(vec![0.0; 3], vec![0.0; 3]);
        s.select(&ctx(0, &[0, 1, 2], 1), &mut q, &mut rng).unwrap();
        let saved = s.save();
        let mut t = tifl(Protocol::Code, Some(vec![1.0, 2.0, 3.0]), 3, 10);
        t.load(&saved).unwrap();
        assert_eq!(t.state.tiers, s.state.tiers);
        let mut u = tifl(Protocol::Code, None, 2, 10);
        assert!(u.load(&saved).is_err());
    }

    /// TiFL runs on the built-in Synthetic federation under every round policy and both
    /// protocols: each round trains clients of one tier only, once the tiers are built.
    #[test]
    fn runs_under_every_round_policy() {
        use crate::config::Config;
        use crate::engine::{self, Experiment, Observer, RoundRecord};

        #[derive(Default)]
        struct Rows(Vec<RoundRecord>);
        impl Observer for Rows {
            fn on_round(&mut self, r: &RoundRecord) -> crate::error::Result<()> {
                self.0.push(r.clone());
                Ok(())
            }
        }
        let policies = [
            r#"{policy="wait_all"}"#,
            r#"{policy="overcommit", overcommit=0.3}"#,
            r#"{policy="deadline", deadline_s=2.0}"#,
        ];
        for protocol in ["paper", "code"] {
            for policy in policies {
                let set = [
                    "rounds=10".to_string(),
                    "selection.strategy=\"tifl\"".into(),
                    "selection.clients_per_round=4".into(),
                    format!("selection.tifl={{protocol=\"{protocol}\", T=3, I=3}}"),
                    "system.kind=\"lognormal\"".into(),
                    format!("system.round={policy}"),
                ];
                let config = Config::load(None, &set).unwrap();
                let dir = crate::data::locate::data_dir(None, None);
                let exp = Experiment::prepare(config, &dir).unwrap();
                let mut rows = Rows::default();
                engine::run(&exp, &mut rows).unwrap();
                assert_eq!(rows.0.len(), 10, "{protocol} {policy}");
                assert!(
                    rows.0.iter().any(|r| r.cost.evaluations > 0),
                    "{protocol} {policy}: no tier evaluation"
                );
            }
        }
    }
}
