//! What arrives when, with a clock: the round policy's answer (which updates are in time,
//! which dropped, how long the round lasted), stale updates and FedBuff's buffer, through the
//! in-flight book of `system::inflight`. It times and books; it trains nothing.

use super::*;

impl<'a> Run<'a> {
    /// `[system.stale]`, when the run folds late updates.
    pub(super) fn stale(&self) -> Option<StaleConfig> {
        self.exp.config.system.as_ref().and_then(|s| s.stale)
    }

    /// Each selection entry's finish time on the virtual clock (its client's steps × batch
    /// samples, from the training broadcast), and the round policy's verdict for a round of
    /// budget `k` after the selector's query phase. `None` without a clock.
    /// The entries the policy discards are recorded in `trained` with the censored bound
    /// on their durations: the round's length after its query phase, when it closed.
    pub(super) fn time(
        &mut self,
        selected: &[usize],
        trained: &mut Trained,
        k: usize,
    ) -> Option<RoundTiming> {
        let query_s = std::mem::take(&mut self.query_s);
        let clock = self.exp.clock.as_ref()?;
        let batch = self.exp.config.train.batch_size as u64;
        let finish: Vec<f64> = selected
            .iter()
            .map(|&c| {
                let samples = trained.of(c).steps as u64 * batch;
                let f = clock.finish_sending_s(c, samples, trained.sent_of(c));
                trained.pass_s(clock, c).map_or(f, |p| p + f)
            })
            .collect();
        self.broadcast_s = self.start_s + query_s;
        let own_deadline = self.selector.round_deadline_s();
        let mut timing = match (clock.policy(), own_deadline) {
            (RoundPolicy::Deadline { .. }, Some(deadline_s)) => {
                let arrives = clock.arrives(self.start_s, query_s, selected, &finish);
                let mut r = round::deadline(&finish, &arrives, deadline_s);
                r.round_s += query_s;
                r
            }
            _ => clock.round(self.start_s, query_s, selected, &finish, k),
        };
        if selected.is_empty() {
            // Nobody trains: the round lasts until the server's next decision point.
            let deadline = match clock.policy() {
                RoundPolicy::Deadline { deadline_s } => Some(own_deadline.unwrap_or(deadline_s)),
                _ => own_deadline,
            };
            timing.round_s += clock.idle_s(self.broadcast_s, deadline);
        }
        self.fresh_late.clear();
        if self.stale().is_some() {
            let arrives = clock.arrives(self.start_s, query_s, selected, &finish);
            self.fresh_late = (0..selected.len())
                .filter(|&i| arrives[i] && !timing.kept[i])
                .map(|i| (i, self.start_s + query_s + finish[i]))
                .collect();
        }
        let closed_s = (timing.round_s - query_s).max(0.0);
        let dropped: Vec<usize> = selected
            .iter()
            .zip(&timing.kept)
            .filter(|(_, kept)| !**kept)
            .map(|(&c, _)| c)
            .collect();
        let bounds = vec![closed_s; dropped.len()];
        trained.dropped = Some((dropped, bounds));
        Some(timing)
    }

    /// The entries the selector hears of, and the round on the clock: updates the round
    /// policy discarded are not reported (the server never used them), though their clients
    /// keep the optimizer state of the training they did, and the trainings wasted are
    /// booked in `cost`. Without a clock, every entry. A round whose time the clock cannot
    /// count (durations whose sum overflows) is a config error naming the round.
    pub(super) fn on_time<'s>(
        &self,
        t: usize,
        selected: &'s [usize],
        mut trained: Trained,
        timing: Option<RoundTiming>,
        cost: &mut Ledger,
    ) -> Result<(Cow<'s, [usize]>, Trained, Option<RoundClock>)> {
        let (Some(timing), Some(total)) = (timing, &self.summary.clock) else {
            return Ok((Cow::Borrowed(selected), trained, None));
        };
        let kept = &timing.kept;
        // Under `[system.stale]` a late update is not wasted yet: it is booked when it is
        // folded (`stale_trainings`) or expires (wasted then).
        cost.wasted_trainings += trained
            .distinct
            .iter()
            .filter(|&&c| !selected.iter().zip(kept).any(|(&s, &k)| k && s == c))
            .filter(|&&c| !self.fresh_late.iter().any(|&(i, _)| selected[i] == c))
            .count() as u64;
        let aggregated = kept.iter().filter(|&&k| k).count();
        trained.losses = kept_entries(std::mem::take(&mut trained.losses), kept);
        trained.deltas = trained.deltas.take().map(|d| kept_entries(d, kept));
        trained.samples = trained.samples.take().map(|s| kept_entries(s, kept));
        trained.durations = Some(kept_entries(timing.finish, kept));
        // A wait for someone to come online (a behave trace) is part of the round.
        let round_s = (self.start_s - total.clock_s) + timing.round_s;
        let clock_s = total.clock_s + round_s;
        if !(round_s.is_finite() && clock_s.is_finite()) {
            return Err(ConfigError::invalid(
                "system",
                format!(
                    "round {t} lasts {round_s:e} virtual seconds and ends at {clock_s:e}: the \
                     clock cannot count it (its devices, query stages and behave trace waits add \
                     up past f64); lower system.augmentation, the devices' times or `rounds`"
                ),
            )
            .into());
        }
        let clock = RoundClock {
            round_s,
            clock_s,
            aggregated,
            stale: None,
        };
        Ok((
            Cow::Owned(kept_entries(selected.to_vec(), kept)),
            trained,
            Some(clock),
        ))
    }

    /// Closes round `t`: under FedBuff the buffer's answer; otherwise the round policy's
    /// (which updates are in time), stale updates folded in, the aggregation, and the late
    /// ones kept for later. Returns the clients whose reports the selector hears, the trained
    /// updates and the round's clock; at the last round what is still late or in flight is
    /// booked as wasted.
    pub(super) fn close_round<'s>(
        &mut self,
        t: usize,
        selection: &'s select::Selection,
        mut trained: Trained,
        budget: usize,
        fedbuff: Option<(usize, usize)>,
        cost: &mut Ledger,
    ) -> Result<(Cow<'s, [usize]>, Trained, Option<RoundClock>)> {
        let closed = match fedbuff {
            Some((_, k)) => {
                let (reported, trained, clock) = self.buffer(t, selection, trained, k, cost)?;
                (Cow::Owned(reported), trained, clock)
            }
            None => {
                let timing = self.time(&selection.clients, &mut trained, budget);
                let stale = self.fold_stale(t, &selection.clients, timing.as_ref(), cost);
                self.aggregate(t, selection, &trained, timing.as_ref(), &stale)?;
                self.keep_late(t, selection, &trained);
                let (reported, trained, mut clock) =
                    self.on_time(t, &selection.clients, trained, timing, cost)?;
                if let Some(c) = &mut clock
                    && self.stale().is_some()
                {
                    c.stale = Some(staleness(stale.iter().map(|(_, tau)| *tau)));
                }
                (reported, trained, clock)
            }
        };
        if t + 1 == self.exp.config.rounds {
            // Updates still late or in flight when the run ends were never used.
            cost.wasted_trainings += self.book.unused() as u64;
        }
        Ok(closed)
    }

    /// FedBuff's concurrency and buffer size, when the run's round policy is FedBuff.
    pub(super) fn fedbuff(&self) -> Option<(usize, usize)> {
        match self.exp.clock.as_ref()?.policy() {
            RoundPolicy::Fedbuff {
                concurrency,
                buffer_size,
            } => Some((concurrency, buffer_size)),
            _ => None,
        }
    }

    /// Removes the clients training under FedBuff from `active`: a client trains one
    /// update at a time.
    pub(super) fn not_in_flight(&self, active: &mut Vec<usize>) {
        let busy = self.book.busy();
        active.retain(|k| !busy.contains(k));
    }

    /// One FedBuff round ([`round::fedbuff_round`]): the selection's trainings (done from
    /// this round's model, version `t`) join the clients in flight, the server waits for
    /// `buffer_size` arrivals and aggregates them, each weighted by the run's rule over the
    /// buffer times 1/√(1 + staleness), not renormalised (FedBuff Alg. 1: Δ̄ = Σ s(τ) Δ / K
    /// under the mean rule), Δ being each update minus the model it trained from; then
    /// the server step. Returns the buffer's clients (what the selector hears of), their
    /// losses, updates and durations, and the round on the clock. An update lost offline
    /// is a wasted training.
    pub(super) fn buffer(
        &mut self,
        t: usize,
        selection: &select::Selection,
        trained: Trained,
        buffer_size: usize,
        cost: &mut Ledger,
    ) -> Result<(Vec<usize>, Trained, Option<RoundClock>)> {
        let query_s = std::mem::take(&mut self.query_s);
        let exp = self.exp;
        let clock = exp.clock.as_ref().expect("FedBuff runs on a clock");
        let before_s = self.summary.clock.as_ref().map_or(0.0, |c| c.clock_s);
        let batch = exp.config.train.batch_size as u64;
        let departing: Vec<(Flying, f64)> = selection
            .clients
            .iter()
            .enumerate()
            .map(|(i, &k)| {
                let u = trained.of(k);
                let flying = Flying {
                    client: k,
                    delta: u
                        .params
                        .iter()
                        .zip(&self.global)
                        .map(|(a, b)| a - b)
                        .collect(),
                    loss: trained.losses[i],
                    weight: selection.weights.as_ref().map(|w| w[i]),
                    report: trained.samples.as_ref().map(|s| s[i].clone()),
                };
                let finish = clock.finish_sending_s(k, u.steps as u64 * batch, trained.sent_of(k));
                (
                    flying,
                    trained.pass_s(clock, k).map_or(finish, |p| p + finish),
                )
            })
            .collect();
        for (k, u) in trained.distinct.iter().zip(trained.updates) {
            self.states[*k] = u.state;
        }
        let concurrency = self.fedbuff().map_or(0, |(c, _)| c);
        let r = self.book.fedbuff_round(
            clock,
            departing,
            concurrency,
            self.start_s + query_s,
            t,
            buffer_size,
        );
        cost.wasted_trainings += r.lost as u64;
        let items = r.buffer;
        let clients: Vec<usize> = items.iter().map(|(x, _, _)| x.client).collect();
        let own: Option<Vec<f64>> = (self.rule == AggregationRule::Selector).then(|| {
            items
                .iter()
                .map(|(x, _, _)| x.weight.unwrap_or(1.0))
                .collect()
        });
        let mut w = aggregate::weights(self.rule, &clients, &self.sizes, own.as_deref());
        for (x, (_, _, s)) in w.iter_mut().zip(&items) {
            *x *= round::fedbuff_weight(*s);
        }
        check_finite(
            t,
            items
                .iter()
                .enumerate()
                .map(|(i, (x, _, _))| (i, x.client, x.delta.as_slice())),
            &mut w,
        )?;
        if !items.is_empty() {
            let mut acc = vec![0f64; self.global.len()];
            for ((x, _, _), &wk) in items.iter().zip(&w).filter(|(_, w)| **w != 0.0) {
                for (a, &d) in acc.iter_mut().zip(&x.delta) {
                    *a += wk * d as f64;
                }
            }
            let delta: Vec<f32> = acc.into_iter().map(|a| a as f32).collect();
            self.step(t, &delta)?;
        }
        let round_s = r.close_s - before_s;
        if !(round_s.is_finite() && r.close_s.is_finite()) {
            return Err(ConfigError::invalid(
                "system",
                format!(
                    "round {t} ends at {:e} virtual seconds: the clock cannot count it",
                    r.close_s
                ),
            )
            .into());
        }
        let stale = staleness(items.iter().map(|(_, _, s)| *s).filter(|&s| s > 0));
        let rc = RoundClock {
            round_s,
            clock_s: r.close_s,
            aggregated: items.len(),
            stale: Some(stale),
        };
        let deltas = (self.needs.updates != UpdateKind::None).then(|| {
            items
                .iter()
                .map(|(x, _, _)| match self.needs.updates {
                    UpdateKind::OutputLayer => [
                        &x.delta[exp.layout.output_bias()],
                        &x.delta[exp.layout.output_weight()],
                    ]
                    .concat(),
                    _ => x.delta.clone(),
                })
                .collect()
        });
        let reported = Trained {
            distinct: Vec::new(),
            updates: Vec::new(),
            sent: Vec::new(),
            losses: items.iter().map(|(x, _, _)| x.loss).collect(),
            deltas,
            durations: Some(
                items
                    .iter()
                    .map(|(_, f, _)| f.arrival_s - f.start_s)
                    .collect(),
            ),
            dropped: Some((Vec::new(), Vec::new())),
            samples: trained.samples.as_ref().map(|_| {
                items
                    .iter()
                    .map(|(x, _, _)| x.report.clone().unwrap_or_default())
                    .collect()
            }),
            inferred: Vec::new(),
        };
        Ok((clients, reported, Some(rc)))
    }
}
