//! The `ClientQuery` every strategy asks through while it selects (held-out and mini-batch
//! losses, probes, local updates, gradients, the secure Gram matrix), each request booked in
//! the cost ledger and on the clock. It answers the selector; it never selects.

use super::*;

impl Query<'_> {
    /// Adds one query to the round's query phase on the clock: the server waits for the
    /// slowest of its clients' `work` before it goes on.
    pub(super) fn stage(&mut self, work: impl IntoIterator<Item = (usize, QueryWork)>) {
        if let Some(clock) = &self.exp.clock {
            *self.query_s += clock.stage_s(work);
        }
    }

    /// Local trainings a strategy asks for beyond the round's own (probes, FedGP's extra
    /// step, FedGS's graph building), with their broadcasts and uploads: booked as
    /// `extra_trainings` when they feed the global model, as `probe_trainings` otherwise. They draw
    /// from Probe streams keyed by `key_offset + k` and start without persistent optimizer
    /// state, so they leave the round's own trainings untouched.
    pub(super) fn train_extra(
        &mut self,
        clients: &[usize],
        key_offset: usize,
        feeds_global: bool,
    ) -> Vec<train::LocalUpdate> {
        let exp = self.exp;
        let trainer = exp.trainer();
        let (seed, t) = (exp.config.seed, self.round as u64);
        let global: &[f32] = self.global;
        let updates: Vec<train::LocalUpdate> = clients
            .par_iter()
            .map(|&k| {
                trainer.train(
                    global,
                    &exp.clients[k].train,
                    self.lr,
                    &mut stream(seed, Purpose::Probe, t, (key_offset + k) as u64),
                    None,
                )
            })
            .collect();
        let m = clients.len() as u64;
        self.ledger.broadcasts += m;
        self.ledger.uploads += m;
        if feeds_global {
            self.ledger.extra_trainings += m;
        } else {
            self.ledger.probe_trainings += m;
        }
        self.ledger.train_steps += updates.iter().map(|u| u.steps as u64).sum::<u64>();
        let batch = exp.config.train.batch_size as u64;
        let work = |u: &train::LocalUpdate| QueryWork::training(u.steps as u64 * batch);
        self.stage(clients.iter().zip(&updates).map(|(&k, u)| (k, work(u))));
        updates
    }

    /// Trains `clients` from the global model and aggregates them by the run's rule (the
    /// mean where the rule needs selector weights, which a probe does not have).
    pub(super) fn aggregated_delta(
        &mut self,
        clients: &[usize],
        key_offset: usize,
        feeds_global: bool,
    ) -> Vec<f32> {
        let updates = self.train_extra(clients, key_offset, feeds_global);
        let locals: Vec<&[f32]> = updates.iter().map(|u| u.params.as_slice()).collect();
        let rule = match self.rule {
            AggregationRule::Selector => AggregationRule::Mean,
            r => r,
        };
        let w = aggregate::weights(rule, clients, self.sizes, None);
        aggregate::delta(self.global, &locals, &w)
    }

    /// Books the evaluations of `clients` with their broadcasts and scalar reports, and
    /// their stage on the clock, and returns the losses.
    pub(super) fn booked_losses(&mut self, clients: &[usize], evals: Vec<Evaluation>) -> Vec<f64> {
        let n = evals.len() as u64;
        let ledger = &mut *self.ledger;
        ledger.broadcasts += n;
        ledger.evaluations += n;
        ledger.scalar_reports += n;
        ledger.eval_examples += evals.iter().map(|e| e.examples as u64).sum::<u64>();
        let work = |e: &Evaluation| QueryWork::evaluation(e.examples as u64);
        self.stage(clients.iter().zip(&evals).map(|(&k, e)| (k, work(e))));
        evals.into_iter().map(|e| e.loss).collect()
    }
}

impl ClientQuery for Query<'_> {
    fn holdout_losses(&mut self, clients: &[usize]) -> Result<Vec<f64>> {
        let evals = self.exp.holdout_losses(self.global, clients);
        Ok(self.booked_losses(clients, evals))
    }

    fn minibatch_losses(&mut self, clients: &[usize]) -> Result<Vec<f64>> {
        let exp = self.exp;
        let (seed, bs, t) = (
            exp.config.seed,
            exp.config.train.batch_size,
            self.round as u64,
        );
        let global: &[f32] = self.global;
        let evals: Vec<Evaluation> = clients
            .par_iter()
            .map(|&k| {
                let train = &exp.clients[k].train;
                let mut rng = stream(seed, Purpose::Probe, t, k as u64);
                let idx = rand::seq::index::sample(&mut rng, train.len(), bs.min(train.len()))
                    .into_iter()
                    .map(|i| train[i])
                    .collect::<Vec<_>>();
                let p = exp.layout.to_tensors(global, &exp.device);
                train::evaluate(
                    exp.arch.as_ref(),
                    &p,
                    &exp.data.train,
                    &idx,
                    bs,
                    &exp.device,
                )
            })
            .collect();
        Ok(self.booked_losses(clients, evals))
    }

    fn probe(&mut self, clients: &[usize], evaluate: &[usize]) -> Result<Vec<f64>> {
        let n_clients = self.exp.clients.len();
        let delta = self.aggregated_delta(clients, n_clients, false);
        let probe: Vec<f32> = self.global.iter().zip(&delta).map(|(g, d)| g + d).collect();
        let evals = self.exp.holdout_losses(&probe, evaluate);
        Ok(self.booked_losses(evaluate, evals))
    }

    fn advance(&mut self, clients: &[usize], evaluate: &[usize]) -> Result<Vec<f64>> {
        let n_clients = self.exp.clients.len();
        let delta = self.aggregated_delta(clients, 4 * n_clients, true);
        self.server.step(self.global, &delta);
        if self.global.iter().any(|x| !x.is_finite()) {
            return Err(Error::Diverged {
                round: self.round,
                what: "parameters after the selector's extra training step".into(),
            });
        }
        self.holdout_losses(evaluate)
    }

    fn local_updates(&mut self, clients: &[usize]) -> Result<Vec<Vec<f32>>> {
        let updates = self.train_extra(clients, 2 * self.exp.clients.len(), false);
        Ok(updates
            .into_iter()
            .map(|u| {
                u.params
                    .iter()
                    .zip(self.global.iter())
                    .map(|(x, w)| x - w)
                    .collect()
            })
            .collect())
    }

    fn noise_responses(&mut self, updates: &[Vec<f32>], batch: usize) -> Result<Vec<Vec<f64>>> {
        let exp = self.exp;
        let test = &exp.data.test;
        let (shape, values) = match &test.inputs {
            data::Inputs::Dense { shape, values } => (shape, values),
            data::Inputs::Tokens { .. } => {
                return Err(ConfigError::invalid(
                    "selection.fedgs.graph",
                    "functional similarity needs real-valued inputs; token data has none",
                )
                .into());
            }
        };
        let dim: usize = shape.iter().product();
        let reference = &values[..(batch * dim).min(values.len())];
        let count = reference.len().max(1) as f64;
        let mean = reference.iter().map(|&v| v as f64).sum::<f64>() / count;
        let var = reference
            .iter()
            .map(|&v| (v as f64 - mean).powi(2))
            .sum::<f64>()
            / count;
        let normal = rand_distr::Normal::new(mean, var.sqrt().max(1e-12))
            .expect("finite mean and positive std");
        let mut rng = stream(exp.config.seed, Purpose::Probe, self.round as u64, u64::MAX);
        let noise: Vec<f32> = (0..batch * dim)
            .map(|_| rand_distr::Distribution::sample(&normal, &mut rng) as f32)
            .collect();
        let x = Tensor::<2>::from_data(
            burn::tensor::TensorData::new(noise, [batch, dim]),
            &exp.device,
        );
        Ok(updates
            .par_iter()
            .map(|u| {
                let m: Vec<f32> = self.global.iter().zip(u).map(|(w, d)| w + d).collect();
                let p = exp.layout.to_tensors(&m, &exp.device);
                let logits = exp.arch.forward(&p, model::Batch::Dense(x.clone()), None);
                let mean: Vec<f32> = logits
                    .mean_dim(0)
                    .into_data()
                    .try_into_vec::<f32>()
                    .expect("f32 logits");
                mean.into_iter().map(f64::from).collect()
            })
            .collect())
    }

    fn gradients(&mut self, clients: &[usize], scope: GradientScope) -> Result<Vec<Vec<f32>>> {
        let exp = self.exp;
        let trainer = exp.trainer();
        let (seed, t, n) = (exp.config.seed, self.round as u64, exp.clients.len());
        let g: Vec<train::Gradient> = clients
            .par_iter()
            .map(|&k| {
                trainer.gradient(
                    self.global,
                    &exp.clients[k].train,
                    scope,
                    &mut stream(seed, Purpose::Probe, t, (3 * n + k) as u64),
                )
            })
            .collect();
        let m = clients.len() as u64;
        self.ledger.broadcasts += m;
        self.ledger.gradients += m;
        self.ledger.gradient_examples += g.iter().map(|g| g.examples as u64).sum::<u64>();
        self.ledger.uploads += m;
        let work = |g: &train::Gradient| QueryWork::training(g.examples as u64);
        self.stage(clients.iter().zip(&g).map(|(&k, g)| (k, work(g))));
        Ok(g.into_iter().map(|g| g.values).collect())
    }

    fn secure_gram(&mut self, clients: &[usize]) -> Result<Vec<Vec<f64>>> {
        // The features stay on the client side of this simulation: only the
        // protocol's outputs reach the selector.
        let features = self.exp.oracle_features();
        let (seed, t) = (self.exp.config.seed, self.round as u64);
        let m = clients.len();
        let mut gram = vec![vec![0.0; m]; m];
        for i in 0..m {
            let a = &features[clients[i]];
            gram[i][i] = a.iter().map(|x| x * x).sum();
            for j in i + 1..m {
                let key = (clients[i] * features.len() + clients[j]) as u64;
                let (p, _) = crate::sspp::scalar_product(
                    a,
                    &features[clients[j]],
                    &mut stream(seed, Purpose::Strategy, t, key),
                    &mut stream(seed, Purpose::Probe, t, key),
                );
                gram[i][j] = p;
                gram[j][i] = p;
                self.ledger.protocol_messages += crate::sspp::MESSAGES_PER_PRODUCT;
            }
        }
        self.ledger.scalar_reports += m as u64;
        Ok(gram)
    }
}
