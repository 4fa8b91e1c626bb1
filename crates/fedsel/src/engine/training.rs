//! The round's local training: the distinct selected clients in parallel, the orders a
//! strategy gives (local work, upload dropout), the sample pass and the finite checks of what
//! comes back. It trains and checks; it aggregates nothing.

use super::*;

/// Client `k`'s sample-selection pass of round `t` ([`select::SampleRule`]): the loss of the
/// received model `global` on each of its training examples (in batches of the evaluation
/// batch size), handed to the rule with the client's device and its own stream (Probe,
/// keyed 5N + k, apart from every other query's).
pub(super) fn sample_pass(
    exp: &Experiment,
    rule: &dyn select::SampleRule,
    global: &[f32],
    t: usize,
    k: usize,
) -> select::SampleChoice {
    let losses = train::example_losses(
        exp.arch.as_ref(),
        &exp.layout,
        global,
        &exp.data.train,
        &exp.clients[k].train,
        exp.config.eval.batch_size,
        &exp.device,
    );
    let batch_size = exp.config.train.batch_size;
    let device = exp.clock.as_ref().map(|c| {
        let work = |inference_samples, training_samples| QueryWork {
            transfers: 0,
            inference_samples,
            training_samples,
        };
        select::DeviceTiming {
            batch_s: c.query_s(k, work(0, batch_size as u64)),
            sample_inference_s: c.query_s(k, work(1, 0)),
            transfer_s: c.transfer_s(k),
        }
    });
    let key = (5 * exp.clients.len() + k) as u64;
    let mut rng = stream(exp.config.seed, Purpose::Probe, t as u64, key);
    let (epochs, fixed_steps) = match exp.config.train.work {
        LocalWork::Epochs(e) => (Some(e), 0),
        LocalWork::Steps(s) => (None, s),
    };
    let plan = select::ClientPlan {
        epochs,
        fixed_steps,
        batch_size,
        device,
    };
    rule.choose(k, &losses, &plan, &mut rng)
}

/// Gives weight 0 in `w` to each model of `models`, as (index in `w`, client, model),
/// that holds a non-finite value (F3AST's code, TFF's `zero_all_if_any_non_finite`),
/// logging each drop, and returns how many models it was given; when it was given some and
/// dropped them all, the round has nothing to aggregate and the run has diverged.
pub(super) fn check_finite<'m>(
    t: usize,
    models: impl Iterator<Item = (usize, usize, &'m [f32])>,
    w: &mut [f64],
) -> Result<usize> {
    let (mut given, mut dropped) = (0, 0);
    for (i, client, x) in models {
        given += 1;
        if x.iter().any(|v| !v.is_finite()) {
            tracing::warn!(
                "round {t}: client {client} sent a non-finite model; dropped with weight 0"
            );
            w[i] = 0.0;
            dropped += 1;
        }
    }
    if given > 0 && dropped == given {
        return Err(Error::Diverged {
            round: t,
            what: "every local model of the round".into(),
        });
    }
    Ok(given)
}

/// Mini-batch steps of a client of `n` training examples under `train.work`.
pub(super) fn client_steps(cfg: &TrainConfig, n: usize) -> usize {
    let batch = cfg.batch_size.max(1);
    (cfg.work.samples(n, batch) / batch as u64) as usize
}

/// Checks a selector's orders: one per entry, work finite and > 0, dropout rates in
/// [0, 1), and the same order on every entry of one client (its entries share a training).
pub(super) fn check_orders(
    clients: &[usize],
    orders: &[ClientOrder],
) -> std::result::Result<(), String> {
    if orders.len() != clients.len() {
        return Err(format!(
            "gave {} orders for {} selected clients",
            orders.len(),
            clients.len()
        ));
    }
    for (i, (&k, o)) in clients.iter().zip(orders).enumerate() {
        if !(o.work.is_finite() && o.work > 0.0) {
            return Err(format!(
                "ordered client {k} a work of {}, not finite and > 0",
                o.work
            ));
        }
        if let Some(d) = o.dropout
            && !(0.0..1.0).contains(&d.rate())
        {
            return Err(format!(
                "ordered client {k} an upload dropout of {}, outside [0, 1)",
                d.rate()
            ));
        }
        if let Some(j) = clients[..i].iter().position(|&c| c == k)
            && orders[j] != *o
        {
            return Err(format!("gave client {k}'s entries different orders"));
        }
    }
    Ok(())
}

/// Drops part of a trained model's update before upload ([`UploadDropout`]): each dropped
/// coordinate of `params` is set back to the broadcast `global`'s value, so the server
/// aggregates it as no change. Returns how many coordinates were dropped.
pub(super) fn drop_upload(
    params: &mut [f32],
    global: &[f32],
    layout: &ParamLayout,
    dropout: UploadDropout,
    rng: &mut crate::rng::Rng,
) -> usize {
    match dropout {
        UploadDropout::Smallest(f) => {
            let n = (f * params.len() as f64).floor() as usize;
            let mut order: Vec<usize> = (0..params.len()).collect();
            let change = |i: usize| (params[i] - global[i]).abs();
            order.sort_by(|&a, &b| change(a).total_cmp(&change(b)).then(a.cmp(&b)));
            for &i in &order[..n] {
                params[i] = global[i];
            }
            n
        }
        UploadDropout::Layers(p) => {
            use rand::Rng as _;
            let mut dropped = 0;
            for i in 0..layout.specs.len() {
                // The code keeps a tensor when its draw is at least the ratio.
                if rng.random::<f64>() < p {
                    let r = layout.range(i);
                    dropped += r.len();
                    params[r.clone()].copy_from_slice(&global[r]);
                }
            }
            dropped
        }
    }
}

/// The items of the entries the round policy `kept`, in entry order.
pub(super) fn kept_entries<T>(items: Vec<T>, kept: &[bool]) -> Vec<T> {
    items
        .into_iter()
        .zip(kept)
        .filter_map(|(x, &k)| k.then_some(x))
        .collect()
}

/// The aggregation weights of the entries the round policy `kept`, computed over those
/// alone (so the mean and data-size rules weigh the arrivals among themselves; a
/// selector's own weights are kept as given), and 0 for the others.
pub(super) fn kept_weights(
    rule: AggregationRule,
    selection: &select::Selection,
    sizes: &[usize],
    kept: &[bool],
) -> Vec<f64> {
    let entries: Vec<usize> = (0..kept.len()).filter(|&i| kept[i]).collect();
    let clients: Vec<usize> = entries.iter().map(|&i| selection.clients[i]).collect();
    let own: Option<Vec<f64>> = selection
        .weights
        .as_ref()
        .map(|w| entries.iter().map(|&i| w[i]).collect());
    let mut w = vec![0.0; kept.len()];
    for (&i, x) in entries
        .iter()
        .zip(aggregate::weights(rule, &clients, sizes, own.as_deref()))
    {
        w[i] = x;
    }
    w
}

impl Trained {
    /// The update of selected client `k`.
    pub(super) fn of(&self, k: usize) -> &train::LocalUpdate {
        let i = self
            .distinct
            .binary_search(&k)
            .expect("selected clients are in `distinct`");
        &self.updates[i]
    }

    /// The fraction of selected client `k`'s update that it uploaded.
    pub(super) fn sent_of(&self, k: usize) -> f64 {
        let i = self
            .distinct
            .binary_search(&k)
            .expect("selected clients are in `distinct`");
        self.sent[i]
    }

    /// Seconds selected client `k` spent on its sample-selection pass (one forward pass
    /// per example), or `None` when it ran none.
    pub(super) fn pass_s(&self, clock: &Clock, k: usize) -> Option<f64> {
        let i = self
            .distinct
            .binary_search(&k)
            .expect("selected clients are in `distinct`");
        let n = *self.inferred.get(i)?;
        (n > 0).then(|| {
            clock.query_s(
                k,
                QueryWork {
                    transfers: 0,
                    inference_samples: n,
                    training_samples: 0,
                },
            )
        })
    }

    /// Mean training loss over the selection's entries, duplicates counted as selected.
    pub(super) fn mean_loss(&self) -> f64 {
        self.losses.iter().sum::<f64>() / self.losses.len().max(1) as f64
    }
}

impl<'a> Run<'a> {
    /// Broadcasts the global model and trains: each distinct client trains once, in
    /// parallel, and duplicates share its update. `beside` (the last round's evaluation)
    /// runs in the same pool, queued after the trainings: a client's training cannot be
    /// split and the evaluation can, so the threads take the trainings first, in client
    /// order, and whichever runs out of them first moves on to the evaluation, which the
    /// other joins when its last training ends.
    ///
    /// A client with an order ([`ClientOrder`]) trains its ordered steps and drops what it
    /// was told to from its upload.
    pub(super) fn train(
        &mut self,
        t: usize,
        lr: f64,
        selected: &[usize],
        orders: Option<&[ClientOrder]>,
        cost: &mut Ledger,
        beside: impl FnOnce() + Send,
    ) -> Trained {
        let seed = self.exp.config.seed;
        let mut distinct = selected.to_vec();
        distinct.sort_unstable();
        distinct.dedup();
        let order_of = |k: usize| {
            orders.map_or(ClientOrder::FULL, |o| {
                o[selected
                    .iter()
                    .position(|&s| s == k)
                    .expect("a selected client")]
            })
        };
        let distinct_orders: Vec<ClientOrder> = distinct.iter().map(|&k| order_of(k)).collect();
        // The work of a client told to train more or less, as steps of its own.
        let works: Vec<Option<TrainConfig>> = distinct
            .iter()
            .zip(&distinct_orders)
            .map(|(&k, o)| self.ordered_work(k, o.work))
            .collect();
        let taken: Vec<Option<OptimizerState>> =
            distinct.iter().map(|&k| self.states[k].take()).collect();
        let (exp, trainer, global) = (self.exp, &self.trainer, &self.global);
        let rule = self.selector.sample_rule();
        let rule = rule.as_deref();
        let mut slots: Vec<Option<(train::LocalUpdate, Option<Vec<f64>>)>> =
            distinct.iter().map(|_| None).collect();
        rayon::scope_fifo(|s| {
            for (((slot, &k), state), work) in
                slots.iter_mut().zip(&distinct).zip(taken).zip(&works)
            {
                s.spawn_fifo(move |_| {
                    let mut rng = stream(seed, Purpose::Training, t as u64, k as u64);
                    let trainer = match work {
                        Some(cfg) => Trainer { cfg, ..*trainer },
                        None => *trainer,
                    };
                    let own = &exp.clients[k].train;
                    *slot = Some(match rule {
                        None => (trainer.train(global, own, lr, &mut rng, state), None),
                        Some(rule) => {
                            let choice = sample_pass(exp, rule, global, t, k);
                            let idx: Vec<usize> = choice.keep.iter().map(|&i| own[i]).collect();
                            let u = trainer.train(global, &idx, lr, &mut rng, state);
                            (u, Some(choice.report))
                        }
                    });
                });
            }
            s.spawn_fifo(|_| beside());
        });
        let (mut updates, reports): (Vec<train::LocalUpdate>, Vec<Option<Vec<f64>>>) = slots
            .into_iter()
            .map(|u| u.expect("every training ran in the scope"))
            .unzip();
        let total = self.global.len();
        let mut sent = vec![1.0; distinct.len()];
        for (i, (&k, o)) in distinct.iter().zip(&distinct_orders).enumerate() {
            if let Some(dropout) = o.dropout {
                let mut rng = stream(seed, Purpose::Upload, t as u64, k as u64);
                let layout = &self.exp.layout;
                let dropped =
                    drop_upload(&mut updates[i].params, global, layout, dropout, &mut rng);
                cost.dropped_params += dropped as u64;
                sent[i] = (total - dropped) as f64 / total as f64;
            }
        }
        let d = distinct.len() as u64;
        cost.broadcasts += d;
        cost.uploads += d;
        cost.trainings += d;
        cost.train_steps += updates.iter().map(|u| u.steps as u64).sum::<u64>();
        let inferred: Vec<u64> = match rule {
            Some(_) => distinct
                .iter()
                .map(|&k| exp.clients[k].train.len() as u64)
                .collect(),
            None => Vec::new(),
        };
        cost.sample_examples += inferred.iter().sum::<u64>();
        cost.scalar_reports += reports
            .iter()
            .flatten()
            .map(|r| r.len() as u64)
            .sum::<u64>();
        let mut trained = Trained {
            distinct,
            updates,
            sent,
            losses: Vec::new(),
            deltas: None,
            durations: None,
            dropped: None,
            samples: None,
            inferred,
        };
        trained.losses = selected.iter().map(|&k| trained.of(k).mean_loss).collect();
        if rule.is_some() {
            trained.samples = Some(
                selected
                    .iter()
                    .map(|&k| {
                        let i = trained.distinct.binary_search(&k).expect("selected");
                        reports[i].clone().unwrap_or_default()
                    })
                    .collect(),
            );
        }
        trained.deltas = (self.needs.updates != UpdateKind::None).then(|| {
            selected
                .iter()
                .map(|&k| self.delta(&trained.of(k).params))
                .collect()
        });
        trained
    }

    /// The training settings of client `k` told to do `work` times its own local work
    /// ([`ClientOrder::work`]): ⌊E·`work`⌋ steps, at least one, E being its steps under
    /// `train.work`. `None` for `work` = 1, the run's own settings, and for a client with
    /// no steps to scale (no training examples under epochs). Steps over its data
    /// reshuffle at each pass as epochs do, so E steps of an epoch-based run are its epochs.
    pub(super) fn ordered_work(&self, k: usize, work: f64) -> Option<TrainConfig> {
        let cfg = &self.exp.config.train;
        let base = client_steps(cfg, self.exp.clients[k].train.len());
        if work == 1.0 || base == 0 {
            return None;
        }
        let steps = ((base as f64 * work).floor() as usize).max(1);
        Some(TrainConfig {
            work: LocalWork::Steps(steps),
            ..cfg.clone()
        })
    }
}
