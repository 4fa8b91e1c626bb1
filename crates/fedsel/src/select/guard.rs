//! What stands between a selector and its clients, in a simulation as in a deployment.
//!
//! A real server can reach only the clients that are available, and cannot trust what they
//! send: a client's report may be non-finite (a diverged local model, a faulty or hostile
//! node) or of the wrong shape. Selectors are written for well-formed, finite input (a NaN
//! in a Ward distance or a loss ranking has no meaning), so the checks live here, once, in
//! front of every selector: the engine and the Python bindings route every request and
//! every round's outcome through them.
//!
//! Two policies, by who asked:
//! - **A selector's own request** (held-out losses, probes, updates, gradients, Gram
//!   entries) answered with a non-finite value or the wrong count or length is an error
//!   ([`Error::Report`]) naming the client, what was asked and the value: the selector
//!   cannot choose without the answer it asked for, and guessing one would bias it.
//! - **A round's outcome** ([`Feedback`]): an entry whose training loss or update is not
//!   finite is left out of what the selector learns that round, and returned as
//!   [`Rejected`] for the caller to log and book. The engine likewise drops a non-finite
//!   local model from the aggregate with weight 0, so the selector and the model see the
//!   same round.

use crate::error::{Error, Result};
use crate::select::{ClientQuery, Feedback, GradientScope, Selector};

/// A selector's requests, checked: any request that names an unavailable client is an
/// error, never a silent answer, and so is an answer no selector can use. Stale values for
/// unavailable clients are the selector's own business.
pub struct AvailableOnly<'q> {
    /// The query that answers.
    pub inner: &'q mut dyn ClientQuery,
    /// Clients reachable now, ascending.
    pub available: &'q [usize],
    /// The asking selector's name, for the error.
    pub selector: &'static str,
    /// Round index, for the error.
    pub round: usize,
}

impl AvailableOnly<'_> {
    fn check(&self, clients: &[usize]) -> Result<()> {
        match clients
            .iter()
            .find(|k| self.available.binary_search(k).is_err())
        {
            Some(k) => Err(self.refused(format!(
                "asked client {k} for a report, but it is not available"
            ))),
            None => Ok(()),
        }
    }

    fn refused(&self, reason: String) -> Error {
        Error::Selection {
            selector: self.selector.into(),
            round: self.round,
            reason,
        }
    }

    fn unusable(&self, client: usize, what: &str, reason: String) -> Error {
        Error::Report {
            selector: self.selector.into(),
            round: self.round,
            client,
            what: what.into(),
            reason,
        }
    }

    fn count<T>(&self, what: &str, got: &[T], want: usize) -> Result<()> {
        if got.len() == want {
            return Ok(());
        }
        Err(self.refused(format!(
            "the answer to a request for {what} holds {} values for {want} clients",
            got.len()
        )))
    }

    /// One finite scalar per client of `clients`.
    fn scalars(&self, what: &str, clients: &[usize], got: Vec<f64>) -> Result<Vec<f64>> {
        self.count(what, &got, clients.len())?;
        if let Some((&k, v)) = clients.iter().zip(&got).find(|(_, v)| !v.is_finite()) {
            return Err(self.unusable(k, what, format!("{v} is not finite")));
        }
        Ok(got)
    }

    /// One non-empty finite vector per client of `clients`, all of one length (`len`, when
    /// the request fixes it).
    fn vectors<T: Copy + Into<f64>>(
        &self,
        what: &str,
        clients: &[usize],
        got: Vec<Vec<T>>,
        len: Option<usize>,
    ) -> Result<Vec<Vec<T>>> {
        self.count(what, &got, clients.len())?;
        let want = len.or_else(|| got.first().map(Vec::len));
        for (&k, v) in clients.iter().zip(&got) {
            if let Some(reason) = vector_fault(v, want) {
                return Err(self.unusable(k, what, reason));
            }
        }
        Ok(got)
    }
}

/// What is wrong with one reported vector, if anything: empty, of another length than
/// `want`, or holding a non-finite value.
fn vector_fault<T: Copy + Into<f64>>(v: &[T], want: Option<usize>) -> Option<String> {
    if v.is_empty() {
        return Some("it is empty".into());
    }
    if let Some(n) = want.filter(|&n| n != v.len()) {
        return Some(format!("it has {} values where {n} are expected", v.len()));
    }
    // One pass in the usual case, every value finite; the count only for the message.
    let (i, first) = v
        .iter()
        .enumerate()
        .find(|(_, x)| !(**x).into().is_finite())?;
    let bad = v[i..].iter().filter(|x| !(**x).into().is_finite()).count();
    Some(format!(
        "{bad} of its {} values are not finite (the first, at {i}, is {})",
        v.len(),
        (*first).into()
    ))
}

impl ClientQuery for AvailableOnly<'_> {
    fn holdout_losses(&mut self, clients: &[usize]) -> Result<Vec<f64>> {
        self.check(clients)?;
        let got = self.inner.holdout_losses(clients)?;
        self.scalars("held-out loss", clients, got)
    }

    fn minibatch_losses(&mut self, clients: &[usize]) -> Result<Vec<f64>> {
        self.check(clients)?;
        let got = self.inner.minibatch_losses(clients)?;
        self.scalars("mini-batch loss", clients, got)
    }

    fn probe(&mut self, clients: &[usize], evaluate: &[usize]) -> Result<Vec<f64>> {
        self.check(clients)?;
        self.check(evaluate)?;
        let got = self.inner.probe(clients, evaluate)?;
        self.scalars("held-out loss of the probe model", evaluate, got)
    }

    fn advance(&mut self, clients: &[usize], evaluate: &[usize]) -> Result<Vec<f64>> {
        self.check(clients)?;
        self.check(evaluate)?;
        let got = self.inner.advance(clients, evaluate)?;
        self.scalars("held-out loss after the extra step", evaluate, got)
    }

    fn local_updates(&mut self, clients: &[usize]) -> Result<Vec<Vec<f32>>> {
        self.check(clients)?;
        let got = self.inner.local_updates(clients)?;
        self.vectors("local update", clients, got, None)
    }

    fn noise_responses(&mut self, updates: &[Vec<f32>], batch: usize) -> Result<Vec<Vec<f64>>> {
        let got = self.inner.noise_responses(updates, batch)?;
        self.count("noise responses", &got, updates.len())?;
        let want = got.first().map(Vec::len);
        match got
            .iter()
            .enumerate()
            .find_map(|(i, v)| Some((i, vector_fault(v, want)?)))
        {
            Some((i, reason)) => Err(self.refused(format!(
                "the noise response of update {i} of the request is unusable: {reason}"
            ))),
            None => Ok(got),
        }
    }

    fn secure_gram(&mut self, clients: &[usize]) -> Result<Vec<Vec<f64>>> {
        self.check(clients)?;
        let got = self.inner.secure_gram(clients)?;
        self.vectors(
            "row of secure Gram entries",
            clients,
            got,
            Some(clients.len()),
        )
    }

    fn gradients(&mut self, clients: &[usize], scope: GradientScope) -> Result<Vec<Vec<f32>>> {
        self.check(clients)?;
        let got = self.inner.gradients(clients, scope)?;
        self.vectors("gradient", clients, got, None)
    }
}

/// A selected entry whose report a selector was not given: its training loss or its update
/// was not finite, or its update had another length than the round's others.
#[derive(Debug, Clone, PartialEq)]
pub struct Rejected {
    /// The client.
    pub client: usize,
    /// Its position in the round's selection.
    pub entry: usize,
    /// What was wrong, with the value.
    pub reason: String,
}

/// Hands a round's outcome to `selector` without the entries it cannot learn from (the
/// module's second policy), and returns those entries. The common case, every entry
/// usable, passes `feedback` through without a copy.
///
/// The update length every entry must share is `update_len` when the caller knows it (the
/// engine: its model's layout), else the first finite entry's.
pub fn observe_usable(
    selector: &mut dyn Selector,
    feedback: &Feedback<'_>,
    update_len: Option<usize>,
) -> Vec<Rejected> {
    let updates = feedback.updates;
    let want = update_len.or_else(|| {
        updates.and_then(|u| {
            u.iter()
                .find(|v| vector_fault(v, None).is_none())
                .map(Vec::len)
        })
    });
    let rejected: Vec<Rejected> = feedback
        .selected
        .iter()
        .enumerate()
        .filter_map(|(i, &client)| {
            let loss = feedback.train_losses[i];
            let duration = feedback.durations.map(|d| d[i]);
            let reason = if !loss.is_finite() {
                format!("its training loss {loss} is not finite")
            } else if let Some(d) = duration.filter(|d| !(d.is_finite() && *d >= 0.0)) {
                format!("its round duration {d} s is not a finite, non-negative time")
            } else {
                updates
                    .and_then(|u| vector_fault(&u[i], want))
                    .map(|r| format!("its update is unusable: {r}"))?
            };
            Some(Rejected {
                client,
                entry: i,
                reason,
            })
        })
        .collect();
    if rejected.is_empty() {
        selector.observe(feedback);
        return rejected;
    }
    let keep = |i: &usize| rejected.iter().all(|r| r.entry != *i);
    let entries: Vec<usize> = (0..feedback.selected.len()).filter(keep).collect();
    let selected: Vec<usize> = entries.iter().map(|&i| feedback.selected[i]).collect();
    let losses: Vec<f64> = entries.iter().map(|&i| feedback.train_losses[i]).collect();
    let kept_updates: Option<Vec<Vec<f32>>> =
        updates.map(|u| entries.iter().map(|&i| u[i].clone()).collect());
    let kept_durations: Option<Vec<f64>> = feedback
        .durations
        .map(|d| entries.iter().map(|&i| d[i]).collect());
    selector.observe(&Feedback {
        round: feedback.round,
        selected: &selected,
        train_losses: &losses,
        updates: kept_updates.as_deref(),
        durations: kept_durations.as_deref(),
        dropped: feedback.dropped,
    });
    rejected
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::rng::Rng;
    use crate::select::{RoundContext, Selection};

    /// One report: the entries, their losses and their updates.
    type Seen = (Vec<usize>, Vec<f64>, Option<Vec<Vec<f32>>>);

    /// Records what it was told.
    #[derive(Default)]
    struct Recorder {
        seen: Vec<Seen>,
        durations: Vec<Option<Vec<f64>>>,
    }

    impl Selector for Recorder {
        fn name(&self) -> &'static str {
            "recorder"
        }
        fn select(
            &mut self,
            _: &RoundContext<'_>,
            _: &mut dyn ClientQuery,
            _: &mut Rng,
        ) -> Result<Selection> {
            Ok(Selection::default())
        }
        fn observe(&mut self, f: &Feedback<'_>) {
            self.seen.push((
                f.selected.to_vec(),
                f.train_losses.to_vec(),
                f.updates.map(<[Vec<f32>]>::to_vec),
            ));
            self.durations.push(f.durations.map(<[f64]>::to_vec));
        }
    }

    #[test]
    fn unusable_entries_are_left_out_and_named() {
        let mut r = Recorder::default();
        let updates = vec![
            vec![1.0, 2.0],
            vec![f32::NAN, 0.0],
            vec![3.0, 4.0],
            vec![5.0],
            vec![6.0, 7.0],
        ];
        let rejected = observe_usable(
            &mut r,
            &Feedback {
                round: 4,
                selected: &[7, 2, 7, 9, 3],
                train_losses: &[0.5, 0.1, f64::INFINITY, 0.2, 0.3],
                updates: Some(&updates),
                durations: None,
                dropped: None,
            },
            None,
        );
        let named: Vec<(usize, usize)> = rejected.iter().map(|r| (r.client, r.entry)).collect();
        assert_eq!(named, [(2, 1), (7, 2), (9, 3)]);
        assert!(
            rejected[0]
                .reason
                .contains("1 of its 2 values are not finite")
        );
        assert!(rejected[1].reason.contains("inf is not finite"));
        assert!(rejected[2].reason.contains("1 values where 2 are expected"));
        let (selected, losses, kept) = &r.seen[0];
        assert_eq!(selected, &[7, 3]);
        assert_eq!(losses, &[0.5, 0.3]);
        assert_eq!(kept.as_deref(), Some(&[vec![1.0, 2.0], vec![6.0, 7.0]][..]));
    }

    #[test]
    fn entries_with_an_impossible_duration_are_left_out_and_the_rest_keep_theirs() {
        let mut r = Recorder::default();
        let rejected = observe_usable(
            &mut r,
            &Feedback {
                round: 2,
                selected: &[4, 1, 6, 0],
                train_losses: &[0.5, 0.1, 0.2, 0.3],
                updates: None,
                durations: Some(&[12.5, -1.0, f64::NAN, 0.0]),
                dropped: None,
            },
            None,
        );
        let named: Vec<(usize, usize)> = rejected.iter().map(|r| (r.client, r.entry)).collect();
        assert_eq!(named, [(1, 1), (6, 2)]);
        assert!(rejected[0].reason.contains("duration -1 s"));
        assert!(rejected[1].reason.contains("duration NaN s"));
        assert_eq!(r.seen[0].0, [4, 0]);
        assert_eq!(r.seen[0].1, [0.5, 0.3]);
        assert_eq!(r.durations, [Some(vec![12.5, 0.0])]);
    }

    #[test]
    fn a_clean_round_passes_through_whole() {
        let mut r = Recorder::default();
        let rejected = observe_usable(
            &mut r,
            &Feedback {
                round: 0,
                selected: &[1, 0],
                train_losses: &[0.5, 0.25],
                updates: None,
                durations: None,
                dropped: None,
            },
            None,
        );
        assert!(rejected.is_empty());
        assert_eq!(r.seen, [(vec![1, 0], vec![0.5, 0.25], None)]);
    }

    /// Answers with whatever it holds.
    struct Canned {
        losses: Vec<f64>,
        vectors: Vec<Vec<f32>>,
    }

    impl ClientQuery for Canned {
        fn holdout_losses(&mut self, _: &[usize]) -> Result<Vec<f64>> {
            Ok(self.losses.clone())
        }
        fn minibatch_losses(&mut self, _: &[usize]) -> Result<Vec<f64>> {
            Ok(self.losses.clone())
        }
        fn probe(&mut self, _: &[usize], _: &[usize]) -> Result<Vec<f64>> {
            Ok(self.losses.clone())
        }
        fn gradients(&mut self, _: &[usize], _: GradientScope) -> Result<Vec<Vec<f32>>> {
            Ok(self.vectors.clone())
        }
    }

    fn ask(
        losses: Vec<f64>,
        vectors: Vec<Vec<f32>>,
        f: impl FnOnce(&mut AvailableOnly<'_>) -> Result<()>,
    ) -> String {
        let mut q = Canned { losses, vectors };
        let mut g = AvailableOnly {
            inner: &mut q,
            available: &[1, 3, 5],
            selector: "powd",
            round: 2,
        };
        f(&mut g).map_or_else(|e| e.to_string(), |()| "ok".into())
    }

    #[test]
    fn answers_no_selector_can_use_are_errors_naming_the_client() {
        let e = ask(vec![0.1, f64::NAN], vec![], |g| {
            g.holdout_losses(&[1, 5]).map(drop)
        });
        assert_eq!(
            e,
            "selector `powd` in round 2: client 5's held-out loss is unusable: NaN is not finite"
        );
        let e = ask(vec![0.1], vec![], |g| g.minibatch_losses(&[1, 5]).map(drop));
        assert!(e.contains("holds 1 values for 2 clients"), "{e}");
        let e = ask(vec![], vec![vec![1.0, 2.0], vec![1.0]], |g| {
            g.gradients(&[3, 1], GradientScope::Full).map(drop)
        });
        assert!(
            e.contains("client 1's gradient is unusable: it has 1 values where 2"),
            "{e}"
        );
        let e = ask(vec![], vec![vec![], vec![]], |g| {
            g.gradients(&[3, 1], GradientScope::Full).map(drop)
        });
        assert!(
            e.contains("client 3's gradient is unusable: it is empty"),
            "{e}"
        );
        let e = ask(vec![1.0, 2.0], vec![], |g| g.probe(&[1], &[3, 5]).map(drop));
        assert_eq!(e, "ok");
        let e = ask(vec![1.0], vec![], |g| g.holdout_losses(&[2]).map(drop));
        assert!(
            e.contains("asked client 2 for a report, but it is not available"),
            "{e}"
        );
    }
}
