//! PyramidFL (Li, Zeng, Zhang & Cao, MobiCom'22): Oort's selection from the server's view,
//! refined inside the selected set with what the server knows of each client's device and
//! its last update. Code: liecn/PyramidFL @ dd1d143, `training/param_server.py`
//! (`prune_client_tasks`, the score registration in `run`), `training/learner.py`
//! (`run_client`) and `oort/oort.py`; its option names and defaults (`training/argParser.py`)
//! are the keys of `[selection.pyramidfl]`.
//!
//! Each round, with K the round's budget:
//! 1. **Rank (Oort).** Oort's training selector picks ⌊K·`overcommit`⌋ clients (the code's
//!    `resampleClients(int(total_worker · overcommit))`). fedsel's [`Oort`] runs it, as it
//!    is, with the options of `[selection.pyramidfl.oort]`, whose defaults are PyramidFL's
//!    (its `argParser.py` differs from FedScale's: ε decays by 0.95 to 0.2, T at the 10th
//!    percentile, clip at 0.98, cut-off 0.7).
//! 2. **Keep the fastest.** Of those, the K whose registered round trip ([`DeviceReport`],
//!    the code's `getCompletionTime` from the device profile) is shortest train; the others
//!    are not run (`prune_client_tasks` step 3).
//! 3. **Upload dropout** (`enable_dropout`). The kept clients are ranked by gradient
//!    utility, highest first, ties sharing the higher rank (the code's
//!    `rewardListSorted.index`); the client of rank r drops the fraction
//!    `dropout_low` + r·(`dropout_high` − `dropout_low`)/K of its update, so the clients
//!    whose updates move the model most send the most (param_server.py lines 171-180). Its
//!    predicted round trip becomes t_k = download + compute + (1 − r_k)·upload, and the
//!    round's T their maximum.
//! 4. **Local work** (`enable_adapt_local_epoch`). A client that would wait for the round
//!    trains more: with c_k its compute for its E_k steps of `train.work`, it gets the
//!    multiplier m_k = min(10, β·⌊(T − t_k)/(c_k/E_k)⌋/E_k) + 1 (param_server.py line 185,
//!    β = `adaptive_epoch_beta`), capped where ⌊E_k·m_k⌋ steps would exceed
//!    max(5·⌈n_k/B⌉, E_k), the client's own cap of five passes over its data
//!    (learner.py line 232). β ≤ 1 keeps every kept client within T.
//!
//! The engine carries out the orders ([`ClientOrder`]): ⌊E_k·m_k⌋ steps, the dropout as
//! [`UploadDropout`], the clock charged for both, and the dropped coordinates aggregated as
//! no change under the client's full weight, as the code's server sums the zeroed deltas.
//!
//! **Utilities.** The statistical utility, durations and exploration are Oort's
//! ([`Oort::observe`]: n_k·|ℓ̄| and the measured round trips). The gradient utility of a
//! client that reported is ‖Δ_k‖·min(n_k, s_k)/100, s_k the samples it trained this round,
//! and n_k before it trained (the code's `registerScore` with `size_of_sample_bin`,
//! param_server.py lines 337-346, and its prior `gradient: size` in `clientSampler.py`).
//!
//! **Protocols**, where the paper and the code differ: the dropout rule. `paper` drops the
//! fraction r_k of the update's coordinates whose change is smallest
//! ([`UploadDropout::Smallest`]), the magnitude-based dropout issue 42 describes for the
//! paper (not checked against the paper's text here); `code` drops each parameter tensor
//! whole with probability r_k ([`UploadDropout::Layers`]), as learner.py line 419 does.
//!
//! **Departures from the code**, each because fedsel's server cannot or need not do what
//! the code does:
//! - *Statistical utility.* The code registers √ℓ·min(n_k, s_k) (param_server.py line
//!   345, its `iteration_loss` being the client's reported loss); fedsel's Oort keeps
//!   n_k·|ℓ̄| (see its module doc), which PyramidFL calls here rather than restating.
//! - *Gradient norm.* The code's norm is ‖Δ_k − w‖ (param_server.py line 331 subtracts the
//!   broadcast model from the delta), which is nearly ‖w‖ for every client; here ‖Δ_k‖, the
//!   gradient norm the code's variable names mean. A selector is not handed the model.
//! - *Pruned clients.* The code registers each over-committed client it did not run with
//!   the round's mean utility, as if it had trained; here they are left as they were, and
//!   Oort's registered durations keep penalising the slow ones.
//! - *Download.* The code's transfer time is one term, scaled by 1 − r_k; here the
//!   download is whole and only the upload shrinks.
//! - *Oort.* fedsel's Oort is FedScale's (see its module doc); PyramidFL's copy of
//!   `oort.py` admits exploitation candidates down to `cut_off_util` × the K-th utility
//!   without FedScale's floor of 10K candidates.
//! - *Availability.* The code also drops candidates that a behave trace says will be
//!   offline when they finish, which a server cannot foresee; here the engine loses them.

use serde::{Deserialize, Serialize};

use super::oort::{Oort, OortConfig};
use super::{
    ClientOrder, ClientQuery, DeviceReport, Feedback, Needs, Planned, Protocol, RoundContext,
    Selection, Selector, Setup, UpdateKind, UploadDropout,
};
use crate::error::{ConfigError, Error};
use crate::rng::Rng;
use crate::validate::{check, check_prob};

/// PyramidFL's options: the code's names and defaults (`training/argParser.py`), with both
/// of its mechanisms on, as every `conf_ours.yml` of the repository runs it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct PyramidflConfig {
    /// The dropout rule (see the module doc). Defaults to `code`: it produced the tables.
    pub protocol: Protocol,
    /// Oort picks ⌊K·overcommit⌋ clients and the K fastest train (1.3).
    pub overcommit: f64,
    /// Fast clients train more local steps (on in every `conf_ours.yml`; off in argParser).
    pub enable_adapt_local_epoch: bool,
    /// β of the step multiplier (1).
    pub adaptive_epoch_beta: f64,
    /// Clients drop part of their update by gradient utility (on in every
    /// `conf_ours.yml`; off in argParser).
    pub enable_dropout: bool,
    /// The dropout of the highest gradient utility (0.1).
    pub dropout_low: f64,
    /// The dropout the ranks climb towards (0.6).
    pub dropout_high: f64,
    /// Oort's options, with PyramidFL's defaults.
    pub oort: OortConfig,
}

impl Default for PyramidflConfig {
    fn default() -> Self {
        Self {
            protocol: Protocol::Code,
            overcommit: 1.3,
            enable_adapt_local_epoch: true,
            adaptive_epoch_beta: 1.0,
            enable_dropout: true,
            dropout_low: 0.1,
            dropout_high: 0.6,
            oort: OortConfig {
                exploration_factor: 0.9,
                exploration_decay: 0.95,
                exploration_min: 0.2,
                round_threshold: 10.0,
                round_penalty: 2.0,
                clip_bound: 0.98,
                blacklist_rounds: -1,
                blacklist_max_len: 0.3,
                cut_off_util: 0.7,
                pacer_delta: 5.0,
                pacer_step: 20,
                sample_window: 5.0,
                ..OortConfig::default()
            },
        }
    }
}

impl PyramidflConfig {
    /// Whether every option has its default (the config then leaves the table out).
    pub(crate) fn is_default(&self) -> bool {
        *self == Self::default()
    }

    /// Checks every option, naming the key it refuses.
    pub(crate) fn validate(&self) -> Result<(), ConfigError> {
        check(
            self.overcommit.is_finite() && self.overcommit >= 1.0,
            "selection.pyramidfl.overcommit",
            format!("{} must be finite and ≥ 1", self.overcommit),
        )?;
        check(
            self.adaptive_epoch_beta.is_finite() && self.adaptive_epoch_beta >= 0.0,
            "selection.pyramidfl.adaptive_epoch_beta",
            format!("{} must be finite and ≥ 0", self.adaptive_epoch_beta),
        )?;
        check_prob(
            self.dropout_low,
            "selection.pyramidfl.dropout_low",
            false,
            true,
        )?;
        check_prob(
            self.dropout_high,
            "selection.pyramidfl.dropout_high",
            false,
            true,
        )?;
        check(
            self.dropout_low <= self.dropout_high,
            "selection.pyramidfl.dropout_low",
            format!(
                "{} is above dropout_high = {}",
                self.dropout_low, self.dropout_high
            ),
        )?;
        self.oort.validate().map_err(|e| match e {
            ConfigError::Invalid { key, reason } => ConfigError::Invalid {
                key: key.replace("selection.oort", "selection.pyramidfl.oort"),
                reason,
            },
            other => other,
        })
    }
}

/// What PyramidFL adds to Oort's state, checkpointed with it.
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq)]
struct State {
    /// Oort's own state.
    oort: serde_json::Value,
    /// Each client's gradient utility: n_k before it trained.
    gradient: Vec<f64>,
    /// The samples each client was ordered to train in its last selection.
    ordered_samples: Vec<u64>,
}

/// The PyramidFL selector.
#[derive(Debug, Clone)]
pub struct PyramidFl {
    cfg: PyramidflConfig,
    oort: Oort,
    sizes: Vec<usize>,
    devices: Option<Vec<DeviceReport>>,
    gradient: Vec<f64>,
    ordered_samples: Vec<u64>,
}

/// One kept client's orders and the predictions they came from.
#[derive(Debug, Clone, Copy, PartialEq)]
struct Refined {
    /// The fraction of its update it drops (0 without dropout).
    dropout: f64,
    /// Its predicted round trip with that dropout, t_k.
    finish_s: f64,
    /// Its local-work multiplier m_k (1 without adaptation).
    work: f64,
}

impl PyramidFl {
    /// A selector with the given options.
    pub fn new(cfg: PyramidflConfig) -> Self {
        let oort = Oort::new(cfg.oort.clone());
        Self {
            cfg,
            oort,
            sizes: Vec::new(),
            devices: None,
            gradient: Vec::new(),
            ordered_samples: Vec::new(),
        }
    }

    /// Each kept client's dropout, predicted round trip and work multiplier (steps 3 and
    /// 4 of the module doc), for a round of budget `budget` (the code's `total_worker`).
    fn refine(&self, kept: &[usize], devices: &[DeviceReport], budget: usize) -> Vec<Refined> {
        let cfg = &self.cfg;
        let step = (cfg.dropout_high - cfg.dropout_low) / budget.max(1) as f64;
        let mut out: Vec<Refined> = kept
            .iter()
            .map(|&k| {
                let d = &devices[k];
                let dropout = if cfg.enable_dropout {
                    let g = self.gradient[k];
                    let rank = kept.iter().filter(|&&j| self.gradient[j] > g).count();
                    cfg.dropout_low + rank as f64 * step
                } else {
                    0.0
                };
                Refined {
                    dropout,
                    finish_s: d.download_s + d.compute_s + (1.0 - dropout) * d.upload_s,
                    work: 1.0,
                }
            })
            .collect();
        if !cfg.enable_adapt_local_epoch {
            return out;
        }
        let round_s = out.iter().map(|r| r.finish_s).fold(0.0, f64::max);
        for (r, &k) in out.iter_mut().zip(kept) {
            let d = &devices[k];
            let e = d.steps.max(1) as f64;
            let per_step = d.compute_s / e;
            let fits = if per_step > 0.0 {
                ((round_s - r.finish_s) / per_step).floor()
            } else {
                0.0
            };
            let work = (cfg.adaptive_epoch_beta * fits / e).min(10.0) + 1.0;
            r.work = capped(work, d);
        }
        out
    }
}

/// `work` for a client of `device`, lowered where ⌊E·work⌋ steps would pass its cap of
/// max(5·⌈n/B⌉, E) steps (learner.py line 232) to the least multiplier that gives the cap.
fn capped(work: f64, device: &DeviceReport) -> f64 {
    let e = device.steps.max(1);
    let cap = (5 * device.epoch_steps).max(e);
    if (e as f64 * work).floor() as usize <= cap {
        return work;
    }
    let mut w = cap as f64 / e as f64;
    while ((e as f64 * w).floor() as usize) < cap {
        w = w.next_up();
    }
    w
}

impl Selector for PyramidFl {
    fn name(&self) -> &'static str {
        "pyramidfl"
    }

    /// The whole update, for its norm (the gradient utility).
    fn needs(&self) -> Needs {
        Needs {
            updates: UpdateKind::Full,
            ..Needs::default()
        }
    }

    fn setup(&mut self, setup: &Setup) {
        self.oort.setup(setup);
        self.sizes = setup.sizes.clone();
        self.gradient = setup.sizes.iter().map(|&s| s as f64).collect();
        self.ordered_samples = vec![0; setup.sizes.len()];
    }

    fn register_devices(&mut self, devices: &[DeviceReport]) {
        self.devices = Some(devices.to_vec());
    }

    fn select(
        &mut self,
        ctx: &RoundContext<'_>,
        query: &mut dyn ClientQuery,
        rng: &mut Rng,
    ) -> Result<Selection, Error> {
        self.plan(ctx, query, rng).map(|p| p.selection)
    }

    fn plan(
        &mut self,
        ctx: &RoundContext<'_>,
        query: &mut dyn ClientQuery,
        rng: &mut Rng,
    ) -> Result<Planned, Error> {
        let Some(devices) = self.devices.clone() else {
            return Err(Error::Selection {
                selector: "pyramidfl".into(),
                round: ctx.round,
                reason: "needs the clients' device profiles: run it with a [system] clock".into(),
            });
        };
        let k = ctx.budget.min(ctx.available.len());
        let wide = ((ctx.budget as f64 * self.cfg.overcommit) as usize)
            .min(ctx.available.len())
            .max(k);
        let over = RoundContext {
            budget: wide,
            ..*ctx
        };
        let mut candidates = self.oort.select(&over, query, rng)?.clients;
        let trip = |c: usize| devices[c].download_s + devices[c].compute_s + devices[c].upload_s;
        // A stable sort: equal round trips keep Oort's order.
        candidates.sort_by(|&a, &b| trip(a).total_cmp(&trip(b)));
        candidates.truncate(k);
        let refined = self.refine(&candidates, &devices, ctx.budget);
        let orders = refined
            .iter()
            .map(|r| ClientOrder {
                work: r.work,
                dropout: self.cfg.enable_dropout.then_some(match self.cfg.protocol {
                    Protocol::Paper => UploadDropout::Smallest(r.dropout),
                    Protocol::Code => UploadDropout::Layers(r.dropout),
                }),
            })
            .collect();
        for (&c, r) in candidates.iter().zip(&refined) {
            let d = &devices[c];
            let steps = ((d.steps as f64 * r.work).floor() as u64).max(1);
            self.ordered_samples[c] = steps * d.batch as u64;
        }
        Ok(Planned {
            selection: Selection {
                clients: candidates,
                weights: None,
            },
            orders: Some(orders),
        })
    }

    /// Oort learns as it does alone; each reporting client's gradient utility becomes
    /// ‖Δ_k‖·min(n_k, s_k)/100.
    fn observe(&mut self, f: &Feedback<'_>) {
        self.oort.observe(f);
        let Some(updates) = f.updates else {
            return;
        };
        for (&k, u) in f.selected.iter().zip(updates) {
            let norm = u
                .iter()
                .map(|&x| f64::from(x) * f64::from(x))
                .sum::<f64>()
                .sqrt();
            let bin = (self.sizes[k] as u64).min(self.ordered_samples[k]) as f64;
            self.gradient[k] = norm * bin / 100.0;
        }
    }

    fn save(&self) -> serde_json::Value {
        super::save_state(&State {
            oort: self.oort.save(),
            gradient: self.gradient.clone(),
            ordered_samples: self.ordered_samples.clone(),
        })
    }

    fn load(&mut self, state: &serde_json::Value) -> Result<(), Error> {
        let loaded: State = super::load_state("pyramidfl", state)?;
        let n = self.sizes.len();
        super::check_loaded("pyramidfl", "gradient utilities", loaded.gradient.len(), n)?;
        super::check_loaded(
            "pyramidfl",
            "ordered samples",
            loaded.ordered_samples.len(),
            n,
        )?;
        self.oort.load(&loaded.oort)?;
        self.gradient = loaded.gradient;
        self.ordered_samples = loaded.ordered_samples;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::rng::{Purpose, stream};
    use crate::select::testing::{FixedLosses, setup};

    /// Download and upload 1 s each; compute 2, 4, 8 and 20 s for E = 10 steps of batch
    /// 10; 100 steps an epoch (no cap).
    fn devices() -> Vec<DeviceReport> {
        [2.0, 4.0, 8.0, 20.0]
            .iter()
            .map(|&compute_s| DeviceReport {
                download_s: 1.0,
                compute_s,
                upload_s: 1.0,
                steps: 10,
                epoch_steps: 100,
                batch: 10,
            })
            .collect()
    }

    fn pyramid(cfg: PyramidflConfig) -> PyramidFl {
        let mut s = PyramidFl::new(cfg);
        s.setup(&Setup {
            sizes: vec![100, 300, 200, 400],
            ..setup(&[0.25; 4])
        });
        s.register_devices(&devices());
        s
    }

    fn plan(s: &mut PyramidFl, budget: usize) -> Planned {
        let ctx = RoundContext {
            round: 0,
            available: &[0, 1, 2, 3],
            budget,
            clock_s: None,
        };
        let mut rng = stream(1, Purpose::Selection, 0, 0);
        s.plan(&ctx, &mut FixedLosses(vec![1.0; 4]), &mut rng)
            .unwrap()
    }

    /// K = 3 with over-commitment 1.34: Oort's first round explores ⌊3·1.34⌋ = 4 clients,
    /// all of them, and the 3 of shortest round trip (4, 6, 10 s; client 3 takes 22 s) are
    /// kept. Their gradient utilities are still their sizes (100, 300, 200): ranks 2, 0, 1,
    /// dropouts 0.1 + r·0.5/3 = 0.4333, 0.1, 0.2667. Round trips 1 + c + (1 − r)·1 =
    /// 3.5667, 5.9, 9.7333 s, so T = 9.7333 s; at 0.2, 0.4, 0.8 s a step, client 0 fits
    /// ⌊6.1667/0.2⌋ = 30 more steps: m = min(10, 30/10) + 1 = 4; client 1 fits
    /// ⌊3.8333/0.4⌋ = 9: m = 1.9; client 2, the slowest, none: m = 1.
    #[test]
    fn keeps_the_fastest_and_orders_dropout_by_rank_and_steps_by_slack() {
        let cfg = PyramidflConfig {
            overcommit: 1.34,
            ..PyramidflConfig::default()
        };
        let mut s = pyramid(cfg);
        let p = plan(&mut s, 3);
        assert_eq!(p.selection.clients, [0, 1, 2]);
        let orders = p.orders.unwrap();
        let rate = |i: usize| match orders[i].dropout {
            Some(UploadDropout::Layers(r)) => r,
            other => panic!("code protocol drops layers, got {other:?}"),
        };
        let third = 0.5 / 3.0;
        for (i, want) in [0.1 + 2.0 * third, 0.1, 0.1 + third]
            .into_iter()
            .enumerate()
        {
            assert!((rate(i) - want).abs() < 1e-12, "entry {i}: {}", rate(i));
        }
        let works: Vec<f64> = orders.iter().map(|o| o.work).collect();
        assert_eq!(works[0], 4.0);
        assert!((works[1] - 1.9).abs() < 1e-12, "{}", works[1]);
        assert_eq!(works[2], 1.0);
        // The samples each was ordered: ⌊10·m⌋ steps of 10.
        assert_eq!(s.ordered_samples[..3], [400, 190, 100]);
    }

    /// A client of one batch an epoch may train at most max(5·1, E = 10) = 10 steps
    /// (the client's own cap): client 0's m = 4 becomes 1.
    #[test]
    fn the_step_multiplier_stops_at_five_passes_over_the_data() {
        let cfg = PyramidflConfig {
            overcommit: 1.34,
            ..PyramidflConfig::default()
        };
        let mut s = pyramid(cfg);
        let mut d = devices();
        d[0].epoch_steps = 1;
        s.register_devices(&d);
        let orders = plan(&mut s, 3).orders.unwrap();
        assert_eq!(orders[0].work, 1.0);
        // A cap that is not a whole multiple of E: 5·3 = 15 steps of E = 10.
        d[0].epoch_steps = 3;
        let w = capped(4.0, &d[0]);
        assert_eq!((10.0 * w).floor(), 15.0);
        assert!((w - 1.5).abs() < 1e-12);
    }

    /// The gradient utility of a reporting client is ‖Δ‖·min(n_k, s_k)/100: client 0
    /// (n = 100, ordered 400 samples) reports Δ = (3, 4): 5·100/100 = 5; client 1
    /// (n = 300, ordered 190) reports (0, 1): 1·190/100 = 1.9. The next round ranks by
    /// them: client 2 (still its size, 200) first, then 0 and 1.
    #[test]
    fn gradient_utility_is_the_update_norm_times_the_samples_trained() {
        let cfg = PyramidflConfig {
            overcommit: 1.34,
            ..PyramidflConfig::default()
        };
        let mut s = pyramid(cfg);
        plan(&mut s, 3);
        let updates = vec![vec![3.0, 4.0], vec![0.0, 1.0]];
        s.observe(&Feedback {
            round: 0,
            selected: &[0, 1],
            train_losses: &[0.5, 0.5],
            updates: Some(&updates),
            durations: Some(&[3.0, 5.0]),
            dropped: None,
        });
        assert_eq!(s.gradient[0], 5.0);
        assert!((s.gradient[1] - 1.9).abs() < 1e-12);
        assert_eq!(s.gradient[2..], [200.0, 400.0]);
        let r = s.refine(&[0, 1, 2], &devices(), 3);
        let third = 0.5 / 3.0;
        assert!((r[0].dropout - (0.1 + third)).abs() < 1e-12);
        assert!((r[1].dropout - (0.1 + 2.0 * third)).abs() < 1e-12);
        assert!((r[2].dropout - 0.1).abs() < 1e-12);
        // Checkpointed and restored whole.
        let mut again = pyramid(PyramidflConfig::default());
        again.load(&s.save()).unwrap();
        assert_eq!(again.gradient, s.gradient);
        assert_eq!(again.ordered_samples, s.ordered_samples);
        assert_eq!(again.oort.save(), s.oort.save());
    }

    /// `paper` drops the smallest changes; with both mechanisms off, PyramidFL orders
    /// nothing beyond its selection; without a clock it refuses to select.
    #[test]
    fn protocols_switches_and_the_clock_requirement() {
        let mut s = pyramid(PyramidflConfig {
            protocol: Protocol::Paper,
            ..PyramidflConfig::default()
        });
        let orders = plan(&mut s, 2).orders.unwrap();
        assert!(
            orders
                .iter()
                .all(|o| matches!(o.dropout, Some(UploadDropout::Smallest(_))))
        );
        let mut s = pyramid(PyramidflConfig {
            enable_dropout: false,
            enable_adapt_local_epoch: false,
            ..PyramidflConfig::default()
        });
        let orders = plan(&mut s, 2).orders.unwrap();
        assert!(orders.iter().all(|o| *o == ClientOrder::FULL));
        let mut s = PyramidFl::new(PyramidflConfig::default());
        s.setup(&setup(&[0.5, 0.5]));
        let ctx = RoundContext {
            round: 0,
            available: &[0, 1],
            budget: 1,
            clock_s: None,
        };
        let mut rng = stream(1, Purpose::Selection, 0, 0);
        let e = s
            .plan(&ctx, &mut FixedLosses(vec![1.0; 2]), &mut rng)
            .unwrap_err();
        assert!(e.to_string().contains("[system]"), "{e}");
    }

    #[test]
    fn config_errors_name_their_keys() {
        let bad = |cfg: PyramidflConfig| cfg.validate().unwrap_err().to_string();
        let e = bad(PyramidflConfig {
            overcommit: 0.5,
            ..PyramidflConfig::default()
        });
        assert!(e.contains("selection.pyramidfl.overcommit"), "{e}");
        let e = bad(PyramidflConfig {
            dropout_low: 0.7,
            ..PyramidflConfig::default()
        });
        assert!(e.contains("selection.pyramidfl.dropout_low"), "{e}");
        let e = bad(PyramidflConfig {
            dropout_high: 1.0,
            ..PyramidflConfig::default()
        });
        assert!(e.contains("selection.pyramidfl.dropout_high"), "{e}");
        let mut cfg = PyramidflConfig::default();
        cfg.oort.pacer_step = 0;
        assert!(bad(cfg).contains("selection.pyramidfl.oort.pacer_step"));
    }
}
