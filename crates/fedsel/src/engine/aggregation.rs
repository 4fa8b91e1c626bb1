//! The server's side of a round: each update as a delta, the aggregation rule, the server
//! optimizer's step, and stale updates folded in. It combines what arrived; it decides
//! nothing about who trains.

use super::*;

impl<'a> Run<'a> {
    /// A local model minus the global one, over the part the selector asked for.
    pub(super) fn delta(&self, local: &[f32]) -> Vec<f32> {
        let diff = |r: std::ops::Range<usize>| {
            local[r.clone()]
                .iter()
                .zip(&self.global[r])
                .map(|(a, b)| a - b)
                .collect::<Vec<f32>>()
        };
        match self.needs.updates {
            UpdateKind::OutputLayer => [
                diff(self.exp.layout.output_bias()),
                diff(self.exp.layout.output_weight()),
            ]
            .concat(),
            _ => diff(0..self.global.len()),
        }
    }

    /// Averages the local models into the global one and takes the server step. A
    /// non-finite local model is dropped with weight 0 (F3AST's code, TFF's
    /// `zero_all_if_any_non_finite`), and the drop is logged. On the clock, only the entries
    /// the round policy kept are aggregated, weighted among themselves.
    pub(super) fn aggregate(
        &mut self,
        t: usize,
        selection: &select::Selection,
        trained: &Trained,
        timing: Option<&RoundTiming>,
        stale: &[(LateUpdate, usize)],
    ) -> Result<()> {
        let locals: Vec<&[f32]> = selection
            .clients
            .iter()
            .map(|&k| trained.of(k).params.as_slice())
            .collect();
        let kept = timing.map(|r| r.kept.as_slice());
        if !stale.is_empty() {
            return self.aggregate_with_stale(t, selection, locals, kept, stale);
        }
        let mut w = match kept {
            None => aggregate::weights(
                self.rule,
                &selection.clients,
                &self.sizes,
                selection.weights.as_deref(),
            ),
            Some(kept) => kept_weights(self.rule, selection, &self.sizes, kept),
        };
        let live = check_finite(
            t,
            locals
                .iter()
                .enumerate()
                .filter(|(i, _)| kept.is_none_or(|k| k[*i]))
                .map(|(i, x)| (i, selection.clients[i], *x)),
            &mut w,
        )?;
        // A round with nobody selected (an empty trace round, K_t = 0) or no update in
        // time leaves the model alone.
        if live > 0 {
            let delta = aggregate::delta(&self.global, &locals, &w);
            self.step(t, &delta)?;
        }
        Ok(())
    }

    /// Takes the server step with the aggregated `delta`; parameters that are no longer
    /// finite end the run.
    pub(super) fn step(&mut self, t: usize, delta: &[f32]) -> Result<()> {
        self.server.step(&mut self.global, delta);
        if self.global.iter().any(|x| !x.is_finite()) {
            return Err(Error::Diverged {
                round: t,
                what: "parameters after aggregation".into(),
            });
        }
        Ok(())
    }

    /// The aggregation of a round that folds late updates (`[system.stale]`): the kept
    /// entries and the folded updates weighted by the run's rule over all of them (the
    /// mean and data-size rules renormalised over them; a selector's weights as given, a
    /// late update's from its own round), each folded one's weight times REFL's staleness
    /// factor ([`round::stale_factors`]), and the mean and data-size weights normalised
    /// again to sum to 1, as REFL's `normalize_importance` divides by the importances' sum
    /// (ahmedcs/REFL @ aa7e642, `core/aggregator.py` lines 1162-1175). The late model
    /// enters as a model, Δ = Σ w (x − w_now), as REFL averages models (its
    /// `send_delta` is off by default, `core/argParser.py` line 43).
    pub(super) fn aggregate_with_stale(
        &mut self,
        t: usize,
        selection: &select::Selection,
        locals: Vec<&[f32]>,
        kept: Option<&[bool]>,
        stale: &[(LateUpdate, usize)],
    ) -> Result<()> {
        let cfg = self
            .stale()
            .expect("stale updates come with [system.stale]");
        let entries: Vec<usize> = (0..locals.len())
            .filter(|&i| kept.is_none_or(|k| k[i]))
            .collect();
        let mut clients: Vec<usize> = entries.iter().map(|&i| selection.clients[i]).collect();
        clients.extend(stale.iter().map(|(u, _)| u.client));
        let own: Option<Vec<f64>> = (self.rule == AggregationRule::Selector).then(|| {
            entries
                .iter()
                .map(|&i| selection.weights.as_ref().map_or(1.0, |w| w[i]))
                .chain(stale.iter().map(|(u, _)| u.weight.unwrap_or(1.0)))
                .collect()
        });
        let mut w = aggregate::weights(self.rule, &clients, &self.sizes, own.as_deref());
        // REFL's r, over the fresh models' unweighted sum (its importances are 1).
        let n = entries.len();
        let ratio: Vec<f64> = if cfg.stale_factor == -4.0 && n > 0 {
            let mut sum = vec![0f64; self.global.len()];
            for &i in &entries {
                for (a, &x) in sum.iter_mut().zip(locals[i]) {
                    *a += x as f64;
                }
            }
            stale
                .iter()
                .map(|(u, _)| round::refl_ratio(&sum, n, &u.params))
                .collect()
        } else {
            vec![1.0; stale.len()]
        };
        let taus: Vec<usize> = stale.iter().map(|(_, tau)| *tau).collect();
        let factors = round::stale_factors(&cfg, &taus, &ratio);
        round::fold_weights(&mut w, n, &factors, self.rule != AggregationRule::Selector);
        let mut all: Vec<&[f32]> = entries.iter().map(|&i| locals[i]).collect();
        all.extend(stale.iter().map(|(u, _)| u.params.as_slice()));
        check_finite(
            t,
            all.iter().enumerate().map(|(i, x)| (i, clients[i], *x)),
            &mut w,
        )?;
        let delta = aggregate::delta(&self.global, &all, &w);
        self.step(t, &delta)
    }

    /// The late updates round `t` folds or lets expire (`[system.stale]`,
    /// [`round::stale_due`]), taken out of the waiting list: the folded ones are returned
    /// with their staleness and booked as `stale_trainings`, the expired ones as wasted.
    pub(super) fn fold_stale(
        &mut self,
        t: usize,
        selected: &[usize],
        timing: Option<&RoundTiming>,
        cost: &mut Ledger,
    ) -> Vec<(LateUpdate, usize)> {
        let (Some(cfg), Some(timing)) = (self.stale(), timing) else {
            return Vec::new();
        };
        let close_s = self.start_s + timing.round_s;
        let fresh = timing.kept.iter().any(|&k| k);
        // A client sent this round's model drops the task it was still on (inflight's doc).
        let due = self.book.fold_due(
            t,
            selected,
            self.broadcast_s,
            close_s,
            fresh,
            cfg.stale_update,
        );
        cost.wasted_trainings += (due.superseded + due.expired) as u64;
        cost.stale_trainings += due.folded.len() as u64;
        due.folded
    }

    /// Puts the round's late entries (set by [`Run::time`]) on the waiting list.
    pub(super) fn keep_late(&mut self, t: usize, selection: &select::Selection, trained: &Trained) {
        // `fresh_late` stays for `on_time`, which does not book these as wasted.
        for &(i, arrival_s) in &self.fresh_late {
            let client = selection.clients[i];
            self.book.hold(LateUpdate {
                client,
                origin: t,
                arrival_s,
                params: trained.of(client).params.clone(),
                weight: selection.weights.as_ref().map(|w| w[i]),
            });
        }
    }
}
