//! The experiment a run trains: the federation's data and clients, the model and its
//! parameter layout, the device, the test and held-out sets and the clock. It builds and
//! evaluates; it runs no round and never reads a selector's state.

use super::*;

/// A prepared run: data, clients, model.
pub struct Experiment {
    /// The resolved configuration.
    pub config: Config,
    /// The dataset.
    pub data: FederatedData,
    /// The clients' train / held-out index lists.
    pub clients: Vec<ClientData>,
    /// The network.
    pub arch: Box<dyn Architecture>,
    /// Its parameter layout.
    pub layout: ParamLayout,
    /// Compute device.
    pub device: Device,
    /// Global test examples evaluated each round.
    pub test_idx: Vec<usize>,
    /// Those examples, batched on the device once for the whole run; none where the
    /// architecture evaluates on host slices ([`train::evaluate_flat`]), which reads
    /// them in place.
    pub(super) test_batches: Vec<(model::Batch, Tensor<1, Int>)>,
    /// Each client's held-out examples as a dataset of their own, made on first use
    /// where the architecture evaluates on host slices: evaluation reads them in place
    /// rather than gathering them from the training pool every round (the per-client
    /// accuracies of the FedCor MLP round spent a tenth of it there), for the memory of
    /// the held-out part once more.
    pub(super) holdout_sets: OnceLock<Vec<Dataset>>,
    /// The availability trace, read and checked against the partition once, before any
    /// output directory is made (`availability.kind = "trace"` only).
    pub(super) trace: Option<crate::availability::trace::Trace>,
    /// The virtual clock, with every client's device (`[system]` with a profile only),
    /// built here so that a bad profile file fails before any output directory is made.
    pub(super) clock: Option<Clock>,
    /// The clients whose accuracies the per-client columns summarise: every client, or
    /// at most `eval.per_client_clients` of them drawn once from the data seed.
    pub(super) fairness_clients: Vec<usize>,
    /// The held-out examples of the measured clients that hold any, pooled in client
    /// order as one dataset, with each client's count: made on first use, so that one pass
    /// in whole batches measures them all (a federation of 10,000 clients of a few
    /// held-out examples each took 10,000 tiny passes).
    pub(super) fairness_pool: OnceLock<(Dataset, Vec<usize>)>,
}

pub(super) fn device_for(name: &str) -> Result<Device> {
    match name {
        "flex" => Ok(Device::flex()),
        #[cfg(feature = "cuda")]
        "cuda" => Ok(Device::cuda(0)),
        other => Err(ConfigError::invalid(
            "device",
            format!(
                "`{other}` is not available in this build (the cuda device needs `--features cuda`)"
            ),
        )
        .into()),
    }
}

impl Experiment {
    /// Loads the data a config names from `data_dir` and prepares the run.
    pub fn prepare(config: Config, data_dir: &Path) -> Result<Self> {
        let data = data::load(&config, data_dir)?;
        Self::from_data(config, data)
    }

    /// Prepares a run on data already in memory.
    pub fn from_data(config: Config, data: FederatedData) -> Result<Self> {
        config.validate()?;
        let clients = partition::build(&config.partition, &data, config.data_seed())?;
        let m = config.selection.clients_per_round;
        if m > clients.len() {
            return Err(ConfigError::invalid(
                "selection.clients_per_round",
                format!(
                    "{m} is more than the {} clients of the partition",
                    clients.len()
                ),
            )
            .into());
        }
        // A trace is read here, not at round 0, so that a trace naming a client the
        // partition does not have fails before any output directory is made.
        let trace = match &config.availability {
            crate::config::AvailabilityConfig::Trace(t) => Some(
                crate::availability::trace::Trace::load(&t.trace, clients.len())?,
            ),
            _ => None,
        };
        let arch = model::build(&config.model, &data.train)?;
        let layout = ParamLayout::of(arch.as_ref()).with_init(config.model.init);
        let clock = match &config.system {
            Some(system) => {
                let train = &config.train;
                let samples: Vec<u64> = clients
                    .iter()
                    .map(|c| train.work.samples(c.train.len(), train.batch_size))
                    .collect();
                system.clock(&samples, config.rounds, layout.total, config.data_seed())?
            }
            None => None,
        };
        let device = device_for(&config.device)?;
        let fairness_clients = {
            let (n, max) = (clients.len(), config.eval.per_client_clients);
            if max == 0 || max >= n {
                (0..n).collect()
            } else {
                let mut rng = stream(config.data_seed(), Purpose::Dataset, 2, 0);
                let mut idx = rand::seq::index::sample(&mut rng, n, max).into_vec();
                idx.sort_unstable();
                idx
            }
        };
        let n_test = data.test.len();
        let test_idx = if config.eval.max_test_samples > 0 && config.eval.max_test_samples < n_test
        {
            let mut rng = stream(config.data_seed(), Purpose::Dataset, 1, 0);
            let mut idx =
                rand::seq::index::sample(&mut rng, n_test, config.eval.max_test_samples).into_vec();
            idx.sort_unstable();
            idx
        } else {
            (0..n_test).collect()
        };
        let test_batches = if train::evaluates_on_host(arch.as_ref(), &data.test, &device) {
            Vec::new()
        } else {
            test_idx
                .chunks(config.eval.batch_size)
                .map(|c| model::batch(&data.test, c, &device))
                .collect()
        };
        Ok(Self {
            config,
            data,
            clients,
            arch,
            layout,
            device,
            test_idx,
            test_batches,
            holdout_sets: OnceLock::new(),
            trace,
            clock,
            fairness_clients,
            fairness_pool: OnceLock::new(),
        })
    }

    /// **Oracle** data-distribution features: on Synthetic data with its natural
    /// partition each client's generating model (W_k, b_k), otherwise its training
    /// label distribution (FedGS's oracle 3DG, FedGS §4.1 and its code).
    pub fn oracle_features(&self) -> Vec<Vec<f64>> {
        use crate::config::PartitionScheme;
        match (&self.data.user_models, &self.config.partition.scheme) {
            (Some(models), PartitionScheme::Natural) => models.clone(),
            _ => self
                .clients
                .iter()
                .map(|c| {
                    let h = self.data.train.histogram(Some(&c.train));
                    let n = c.train.len().max(1) as f64;
                    h.into_iter().map(|x| x as f64 / n).collect()
                })
                .collect(),
        }
    }

    /// What the simulated environment knows of the clients (availability models
    /// such as MDF or YMF depend on it).
    pub fn client_info(&self) -> availability::ClientInfo {
        let labels = self
            .clients
            .iter()
            .map(|c| {
                let mut l: Vec<usize> = c
                    .train
                    .iter()
                    .chain(&c.holdout)
                    .map(|&i| self.data.train.labels[i] as usize)
                    .collect();
                l.sort_unstable();
                l.dedup();
                l
            })
            .collect();
        availability::ClientInfo {
            sizes: self.sizes(),
            labels,
            classes: self.data.train.classes,
        }
    }

    /// `clients.csv`: each client's sizes, dominant label and label entropy (nats) of its
    /// training part. Diagnostics only: selectors never see it.
    pub fn client_summary(&self) -> String {
        let mut out = String::from("client,n_train,n_holdout,dominant_label,label_entropy\n");
        for (k, c) in self.clients.iter().enumerate() {
            let h = self.data.train.histogram(Some(&c.train));
            let dominant = h
                .iter()
                .enumerate()
                .max_by_key(|(i, v)| (**v, std::cmp::Reverse(*i)))
                .map_or(0, |x| x.0);
            let entropy = crate::diagnostics::shannon_entropy(
                &h.iter().map(|&v| v as f64).collect::<Vec<_>>(),
            );
            out.push_str(&format!(
                "{k},{},{},{dominant},{entropy:.6}\n",
                c.train.len(),
                c.holdout.len()
            ));
        }
        out
    }

    /// Training-set size of each client.
    pub fn sizes(&self) -> Vec<usize> {
        self.clients.iter().map(|c| c.train.len()).collect()
    }

    /// The size each client reports to the selector, per `selection.client_size`.
    pub fn reported_sizes(&self) -> Vec<usize> {
        match self.config.selection.client_size {
            ClientSize::Train => self.sizes(),
            ClientSize::Local => self
                .clients
                .iter()
                .map(|c| c.train.len() + c.holdout.len())
                .collect(),
        }
    }

    /// The trainer of the experiment's local updates.
    pub(crate) fn trainer(&self) -> Trainer<'_> {
        Trainer {
            arch: self.arch.as_ref(),
            layout: &self.layout,
            data: &self.data.train,
            cfg: &self.config.train,
            dropout: self.config.model.dropout,
            device: &self.device,
        }
    }

    /// Loss of `params` on each client's held-out part, in parallel.
    pub fn holdout_losses(&self, params: &[f32], clients: &[usize]) -> Vec<Evaluation> {
        let bs = self.config.eval.batch_size;
        clients
            .par_iter()
            .map(|&k| {
                let (data, idx) = self.holdout(k);
                train::evaluate_flat(
                    self.arch.as_ref(),
                    &self.layout,
                    params,
                    data,
                    &idx,
                    bs,
                    &self.device,
                )
            })
            .collect()
    }

    /// The examples client `k`'s held-out loss is measured on, and where they are: its
    /// held-out part, or its training part when it holds none out.
    pub(super) fn holdout(&self, k: usize) -> (&Dataset, Cow<'_, [usize]>) {
        let c = &self.clients[k];
        if c.holdout.is_empty() {
            return (&self.data.train, Cow::Borrowed(&c.train));
        }
        if !train::evaluates_on_host(self.arch.as_ref(), &self.data.train, &self.device) {
            return (&self.data.train, Cow::Borrowed(&c.holdout));
        }
        let sets = self.holdout_sets.get_or_init(|| {
            self.clients
                .par_iter()
                .map(|c| self.data.train.subset(&c.holdout))
                .collect()
        });
        (&sets[k], Cow::Owned((0..c.holdout.len()).collect()))
    }

    /// Accuracy of `params` on each measured client's held-out part (every client, or the
    /// fixed sample of `eval.per_client_clients`), in client order, leaving out the clients
    /// that hold none out. The simulator's measurement, as LEAF's: no strategy asks for it,
    /// so no cost is booked.
    pub fn client_accuracies(&self, params: &[f32]) -> Vec<f64> {
        let (pool, counts) = self.fairness_pool.get_or_init(|| {
            let holding = self
                .fairness_clients
                .iter()
                .map(|&k| &self.clients[k].holdout)
                .filter(|h| !h.is_empty());
            let counts = holding.clone().map(Vec::len).collect();
            let idx: Vec<usize> = holding.flatten().copied().collect();
            (self.data.train.subset(&idx), counts)
        });
        let all: Vec<usize> = (0..pool.len()).collect();
        let correct = train::correct_flags(
            self.arch.as_ref(),
            &self.layout,
            params,
            pool,
            &all,
            self.config.eval.batch_size,
            &self.device,
        );
        let mut at = 0;
        counts
            .iter()
            .map(|&n| {
                let right = correct[at..at + n].iter().filter(|&&c| c).count();
                at += n;
                right as f64 / n as f64
            })
            .collect()
    }

    /// Loss and accuracy of `params` on the global test set.
    pub fn test(&self, params: &[f32]) -> Evaluation {
        if train::evaluates_on_host(self.arch.as_ref(), &self.data.test, &self.device) {
            let bs = self.config.eval.batch_size;
            return train::evaluate_flat(
                self.arch.as_ref(),
                &self.layout,
                params,
                &self.data.test,
                &self.test_idx,
                bs,
                &self.device,
            );
        }
        let p = self.layout.to_tensors(params, &self.device);
        train::evaluate_batches(self.arch.as_ref(), &p, &self.test_batches)
    }
}
