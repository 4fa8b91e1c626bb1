//! The run's state across rounds and the loop's bookkeeping: building and restoring it, the
//! selector's calls and feedback, the ledger, the metrics row and checkpoints. It drives the
//! phases in order; it trains and aggregates through the other rooms.

use super::*;

/// What each client reports of its device when it registers ([`DeviceReport`]).
pub(super) fn device_reports(exp: &Experiment, clock: &Clock) -> Vec<DeviceReport> {
    let cfg = &exp.config.train;
    let batch = cfg.batch_size.max(1);
    exp.clients
        .iter()
        .enumerate()
        .map(|(k, c)| {
            let n = c.train.len();
            DeviceReport {
                download_s: clock.transfer_s(k),
                compute_s: clock.compute_s(k, cfg.work.samples(n, batch)),
                upload_s: clock.transfer_s(k),
                steps: client_steps(cfg, n),
                epoch_steps: n.div_ceil(batch),
                batch,
            }
        })
        .collect()
}

impl<'a> Run<'a> {
    /// Sets the selector up and builds the environment, starting from the initial model.
    pub(super) fn new(
        exp: &'a Experiment,
        mut selector: Box<dyn select::Selector>,
    ) -> Result<Self> {
        let cfg = &exp.config;
        let seed = cfg.seed;
        let n = exp.clients.len();
        let sizes = exp.sizes();
        let reported = exp.reported_sizes();
        let total: f64 = reported.iter().sum::<usize>() as f64;
        let per_round = cfg.selection.per_round(n);
        let needs = selector.needs();
        selector.setup(&Setup {
            weights: reported.iter().map(|&s| s as f64 / total).collect(),
            sizes: reported,
            per_round,
            rounds: cfg.rounds,
            num_params: exp.layout.total,
            classes: exp.data.train.classes,
            oracle_label_histograms: needs.oracle_label_histograms.then(|| {
                exp.clients
                    .iter()
                    .map(|c| exp.data.train.histogram(Some(&c.train)))
                    .collect()
            }),
            oracle_features: needs.oracle_features.then(|| exp.oracle_features()),
            durations: exp.clock.as_ref().map(|clock| {
                let (work, batch) = (cfg.train.work, cfg.train.batch_size);
                exp.clients
                    .iter()
                    .enumerate()
                    .map(|(k, c)| clock.finish_s(k, work.samples(c.train.len(), batch)))
                    .collect()
            }),
        });
        if let Some(clock) = &exp.clock {
            selector.register_devices(&device_reports(exp, clock));
        }
        let env = availability::Environment::new(
            &cfg.availability,
            &cfg.budget,
            per_round,
            &exp.client_info(),
            seed,
            exp.trace.as_ref(),
        )?;
        let name = selector.name();
        let rule = match cfg.server.aggregation {
            AggregationRule::Auto => select::own_aggregation(name),
            r => r,
        };
        if let Some(warning) = select::aggregation_override(rule, name) {
            tracing::warn!("{warning}");
        }
        let summary = RunSummary {
            strategy: name.into(),
            seed,
            rounds: 0,
            final_acc: None,
            final_loss: None,
            best_acc: None,
            best_acc_round: 0,
            best_loss: None,
            rounds_to_target: cfg.targets.iter().map(|&t| (t, None)).collect(),
            diverged_at: None,
            wall_s: 0.0,
            cost: Ledger::default(),
            version: crate::VERSION.into(),
            cpu: crate::cpu::isa().name().into(),
            commit: crate::build_commit(),
            clock: exp.clock.as_ref().map(|_| ClockSummary {
                clock_s: 0.0,
                time_to_target_s: cfg.targets.iter().map(|&t| (t, None)).collect(),
                wasted_trainings: 0,
                rounds_without_updates: 0,
            }),
        };
        Ok(Run {
            exp,
            selector,
            needs,
            env,
            trainer: exp.trainer(),
            rule,
            sizes,
            config_hash: cfg.hash(),
            global: {
                let mut g = exp.layout.init(seed);
                if cfg.model.zero_bias {
                    g[exp.layout.output_bias()].fill(0.0);
                }
                g
            },
            server: Server::new(&cfg.server),
            states: vec![None; n],
            query_s: 0.0,
            summary,
            start_s: 0.0,
            book: InFlight::default(),
            fresh_late: Vec::new(),
            broadcast_s: 0.0,
            idle_rounds: 0,
        })
    }

    /// Replaces the initial state with a checkpoint's; returns the round to continue from.
    pub(super) fn restore(&mut self, cp: Checkpoint) -> Result<usize> {
        check_resumable(&self.exp.config, &cp)?;
        self.selector.load(&cp.selector)?;
        self.global = cp.global;
        self.server = Server::with_moments(&self.exp.config.server, cp.server_m, cp.server_v);
        self.states = cp.client_states;
        self.summary = cp.summary;
        self.book = cp.in_flight;
        self.summary
            .resumed_on(crate::cpu::isa().name(), &crate::build_commit());
        Ok(cp.next_round)
    }

    /// The selector's initial phase (FedCor's warm-up, FedGS's graph), with every client
    /// reachable; its costs go to `cost`.
    pub(super) fn initial_phase(&mut self, cost: &mut Ledger) -> Result<()> {
        let all: Vec<usize> = (0..self.exp.clients.len()).collect();
        let lr = self
            .exp
            .config
            .train
            .schedule
            .rate(self.exp.config.train.lr, 0);
        self.with_query(0, lr, &all, cost, |selector, query| {
            selector.initial_phase(query)
        })
    }

    /// Lets the selector act on a query of round `t` that reaches only `available` and
    /// books to `cost`: the one way its initial phase and its selections see clients.
    pub(super) fn with_query<T>(
        &mut self,
        t: usize,
        lr: f64,
        available: &[usize],
        cost: &mut Ledger,
        act: impl FnOnce(&mut dyn select::Selector, &mut dyn ClientQuery) -> Result<T>,
    ) -> Result<T> {
        let name = self.selector.name();
        let mut query = Query {
            exp: self.exp,
            global: &mut self.global,
            server: &mut self.server,
            rule: self.rule,
            ledger: cost,
            query_s: &mut self.query_s,
            round: t,
            lr,
            sizes: &self.sizes,
        };
        act(
            self.selector.as_mut(),
            &mut AvailableOnly {
                inner: &mut query,
                available,
                selector: name,
                round: t,
            },
        )
    }

    /// Asks the selector for the round's clients and orders, answering its queries, and
    /// checks that it chose only available clients, under the `selector` rule gave their
    /// weights, and gave valid orders ([`check_orders`]).
    pub(super) fn select(
        &mut self,
        ctx: &RoundContext,
        lr: f64,
        cost: &mut Ledger,
    ) -> Result<Planned> {
        let t = ctx.round;
        let name = self.selector.name();
        let seed = self.exp.config.seed;
        let planned = self.with_query(t, lr, ctx.available, cost, |selector, query| {
            selector.plan(
                ctx,
                query,
                &mut stream(seed, Purpose::Selection, t as u64, 0),
            )
        })?;
        let selection = &planned.selection;
        if let Some(orders) = &planned.orders {
            check_orders(&selection.clients, orders).map_err(|reason| Error::Selection {
                selector: name.into(),
                round: t,
                reason,
            })?;
        }
        // Within the budget as listed, or (with clients drawn more than once) as distinct.
        let distinct = if selection.clients.len() <= ctx.budget {
            selection.clients.len()
        } else {
            let mut d = selection.clients.clone();
            d.sort_unstable();
            d.dedup();
            d.len()
        };
        if distinct > ctx.budget {
            return Err(Error::Selection {
                selector: name.into(),
                round: t,
                reason: format!(
                    "chose {distinct} distinct clients, over the round's budget K_t = {}",
                    ctx.budget
                ),
            });
        }
        if let Some(&k) = selection
            .clients
            .iter()
            .find(|k| ctx.available.binary_search(k).is_err())
        {
            return Err(Error::Selection {
                selector: name.into(),
                round: t,
                reason: format!("chose client {k}, which is not available"),
            });
        }
        if self.rule == AggregationRule::Selector
            && selection.weights.as_ref().map(Vec::len) != Some(selection.clients.len())
        {
            return Err(Error::Selection {
                selector: name.into(),
                round: t,
                reason: "the `selector` aggregation rule needs one weight per selected client"
                    .into(),
            });
        }
        Ok(planned)
    }

    /// Logs the last round, whose test evaluation ran beside this round's training
    /// (`assessed`), or evaluates it now when it did not.
    pub(super) fn log_pending(
        &mut self,
        pending: Option<(Vec<f32>, RoundRecord)>,
        assessed: Option<Assessment>,
        started: Instant,
        observer: &mut dyn Observer,
    ) -> Result<()> {
        if let Some((global, mut record)) = pending {
            let assessment = assessed.unwrap_or_else(|| assess(self.exp, &global, record.round));
            record.elapsed_s = started.elapsed().as_secs_f64();
            self.log(record, Some(assessment), observer)?;
        }
        Ok(())
    }

    /// Ends round `t`: books it, then evaluates, logs and checkpoints it, or leaves it
    /// `pending` so that its evaluation runs beside the next round's training.
    pub(super) fn end_round(
        &mut self,
        t: usize,
        mut record: RoundRecord,
        pending: &mut Option<(Vec<f32>, RoundRecord)>,
        started: Instant,
        observer: &mut dyn Observer,
    ) -> Result<()> {
        self.book(&record);
        let assessment = if !self.evaluates(t) {
            None
        } else if t + 1 < self.exp.config.rounds && !self.checkpoint_due(t) {
            *pending = Some((self.global.clone(), record));
            return Ok(());
        } else {
            Some(assess(self.exp, &self.global, t))
        };
        record.elapsed_s = started.elapsed().as_secs_f64();
        self.log(record, assessment, observer)?;
        self.checkpoint(t, observer)
    }

    /// Availability and budget of round `t`, and when it starts on the clock: with a
    /// behave trace, only the clients online then are available.
    /// The round's available clients A_t (less those in flight under FedBuff), its budget
    /// K_t, and FedBuff's (concurrency, buffer size) when it is the round policy.
    pub(super) fn round_availability(
        &mut self,
        t: usize,
    ) -> (Vec<usize>, usize, Option<(usize, usize)>) {
        let availability::RoundAvailability { mut active, budget } = self.available(t);
        let fedbuff = self.fedbuff();
        if fedbuff.is_some() {
            self.not_in_flight(&mut active);
        }
        (active, budget, fedbuff)
    }

    /// What the selector is told of round `t`: the available clients, how many it may
    /// select (FedBuff's free flights, or the policy's selection budget), the clock.
    pub(super) fn round_context<'c>(
        &self,
        t: usize,
        active: &'c [usize],
        budget: usize,
        fedbuff: Option<(usize, usize)>,
    ) -> RoundContext<'c> {
        RoundContext {
            round: t,
            available: active,
            budget: match fedbuff {
                Some((c, k)) => {
                    round::fedbuff_budget(c, k, self.book.flights.len()).min(active.len())
                }
                None => self.selection_budget(budget, active.len()),
            },
            clock_s: self.exp.clock.is_some().then_some(self.start_s),
        }
    }

    pub(super) fn available(&mut self, t: usize) -> availability::RoundAvailability {
        let mut round = self.env.round(t);
        if let (Some(clock), Some(total)) = (&self.exp.clock, &self.summary.clock) {
            (self.start_s, round.active) = clock.online(total.clock_s, round.active);
        }
        round
    }

    /// The budget the selector is given for a round of budget `k` with `available` clients:
    /// `k`, or more under over-commitment.
    pub(super) fn selection_budget(&self, k: usize, available: usize) -> usize {
        self.exp
            .clock
            .as_ref()
            .map_or(k, |c| c.selection_budget(k, available))
    }

    /// Whether round `t` tests the global model: every `eval.every` rounds and the last.
    pub(super) fn evaluates(&self, t: usize) -> bool {
        let cfg = &self.exp.config;
        (t + 1).is_multiple_of(cfg.eval.every) || t + 1 == cfg.rounds
    }

    /// Reports the round to the selector and keeps each trained client's optimizer state.
    /// An entry with a non-finite loss or update is not reported ([`guard::observe_usable`]),
    /// as [`Run::aggregate`] gives its model weight 0.
    pub(super) fn feedback(
        &mut self,
        t: usize,
        selected: &[usize],
        trained: Trained,
    ) -> Result<()> {
        let update_len = match self.needs.updates {
            UpdateKind::None => None,
            UpdateKind::Full => Some(self.global.len()),
            UpdateKind::OutputLayer => {
                Some(self.exp.layout.output_bias().len() + self.exp.layout.output_weight().len())
            }
        };
        let feedback = Feedback {
            round: t,
            selected,
            train_losses: &trained.losses,
            updates: trained.deltas.as_deref(),
            durations: trained.durations.as_deref(),
            dropped: trained
                .dropped
                .as_ref()
                .map(|(clients, at_least_s)| Dropped {
                    clients,
                    at_least_s,
                }),
        };
        for r in guard::observe_usable(self.selector.as_mut(), &feedback, update_len) {
            tracing::warn!(
                "round {t}: client {} (selection entry {}) not reported to the selector: {}",
                r.client,
                r.entry,
                r.reason
            );
        }
        if let Some(reports) = &trained.samples {
            self.selector.observe_samples(t, selected, reports);
        }
        for (k, u) in trained.distinct.iter().zip(trained.updates) {
            self.states[*k] = u.state;
        }
        self.failed()
    }

    /// The error a selector's hook without a result raised, if any
    /// ([`Selector::take_failure`](select::Selector::take_failure)).
    pub(super) fn failed(&mut self) -> Result<()> {
        self.selector.take_failure().map_or(Ok(()), Err)
    }

    /// Books the round's costs and virtual time, which the next round's availability and
    /// clock start from, before its evaluation is done.
    /// A round that selected clients but aggregated no update is counted, and said once
    /// on the console: a deadline no client meets would otherwise repeat one warning every
    /// round.
    pub(super) fn book(&mut self, record: &RoundRecord) {
        let summary = &mut self.summary;
        summary.cost.add(&record.cost);
        if let (Some(total), Some(c)) = (&mut summary.clock, &record.clock) {
            total.clock_s = c.clock_s;
            total.wasted_trainings = summary.cost.wasted_trainings;
            if c.aggregated == 0 && record.n_selected > 0 {
                if total.rounds_without_updates == self.idle_rounds {
                    tracing::warn!(
                        "round {}: no update arrived in time (lost offline or late); the model stays as it was and the round lasted {} virtual seconds. Later rounds like it are counted in the summary's rounds_without_updates, not logged",
                        record.round,
                        clock::show_s(c.round_s)
                    );
                }
                total.rounds_without_updates += 1;
            } else if c.aggregated == 0 {
                // Nobody trained: the round still took time (Run::time) and is counted. Said
                // at the first such round and at every tenfold after it, so that a run whose
                // selector picks nobody for many rounds says so without a line a round.
                self.idle_rounds += 1;
                total.rounds_without_updates += 1;
                if is_power_of_ten(self.idle_rounds) {
                    tracing::warn!(
                        "round {}: nobody trained ({} available, {} selected); the round lasted {} virtual seconds, waiting for the server's next decision point (the deadline, the next availability change or system.idle_s). {} round(s) so far without training, counted in rounds_without_updates",
                        record.round,
                        record.n_available,
                        record.n_selected,
                        clock::show_s(c.round_s),
                        self.idle_rounds
                    );
                }
            }
        }
    }

    /// Folds the round's evaluation into the summary and hands its record, completed
    /// with it, to the observer; a non-finite test loss ends the run.
    pub(super) fn log(
        &mut self,
        mut record: RoundRecord,
        assessment: Option<Assessment>,
        observer: &mut dyn Observer,
    ) -> Result<()> {
        let t = record.round;
        let summary = &mut self.summary;
        if let Some(Assessment { test: e, clients }) = assessment {
            record.test_acc = Some(e.accuracy);
            record.test_loss = Some(e.loss);
            record.client_acc = clients;
            if !e.loss.is_finite() {
                return Err(Error::Diverged {
                    round: t,
                    what: "test loss".into(),
                });
            }
            summary.final_acc = Some(e.accuracy);
            summary.final_loss = Some(e.loss);
            if summary.best_acc.is_none_or(|b| e.accuracy > b) {
                summary.best_acc = Some(e.accuracy);
                summary.best_acc_round = t;
            }
            let uniform = (self.exp.data.train.classes as f64).ln();
            if summary.diverged_at.is_none() && e.loss > DIVERGENCE_FACTOR * uniform {
                summary.diverged_at = Some(t);
                tracing::warn!(
                    "round {t}: test loss {:.4e} is over {DIVERGENCE_FACTOR} times ln C = {uniform:.3}, the loss of predicting every class alike: the run is diverging (lower the learning rate)",
                    e.loss
                );
            }
            summary.best_loss = Some(summary.best_loss.map_or(e.loss, |b| b.min(e.loss)));
            for (i, (target, reached)) in summary.rounds_to_target.iter_mut().enumerate() {
                if reached.is_none() && e.accuracy >= *target {
                    *reached = Some(t + 1);
                    if let (Some(total), Some(c)) = (&mut summary.clock, &record.clock) {
                        total.time_to_target_s[i].1 = Some(c.clock_s);
                    }
                }
            }
        }
        summary.rounds = t + 1;
        summary.wall_s = record.elapsed_s;
        observer.on_round(&record)
    }

    /// Whether round `t` ends with a checkpoint: every `checkpoint_every` rounds, except
    /// the last.
    pub(super) fn checkpoint_due(&self, t: usize) -> bool {
        let cfg = &self.exp.config;
        cfg.checkpoint_every != 0
            && (t + 1).is_multiple_of(cfg.checkpoint_every)
            && t + 1 < cfg.rounds
    }

    /// Hands the observer a checkpoint every `checkpoint_every` rounds, except after the last.
    /// The updates in flight are lent to it, not copied: they may hold a model per client.
    pub(super) fn checkpoint(&mut self, t: usize, observer: &mut dyn Observer) -> Result<()> {
        if !self.checkpoint_due(t) {
            return Ok(());
        }
        let (m, v) = self.server.moments();
        let cp = Checkpoint {
            next_round: t + 1,
            config_hash: self.config_hash.clone(),
            global: self.global.clone(),
            server_m: m.to_vec(),
            server_v: v.to_vec(),
            client_states: self.states.clone(),
            selector: self.selector.save(),
            summary: self.summary.clone(),
            in_flight: std::mem::take(&mut self.book),
        };
        if let Err(e) = self.failed() {
            self.book = cp.in_flight;
            return Err(e);
        }
        let written = observer.on_checkpoint(&cp);
        self.book = cp.in_flight;
        written
    }
}
