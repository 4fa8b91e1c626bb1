//! The updates between rounds: late updates waiting to be folded (`[system.stale]`) and
//! FedBuff's clients still training. This book is part of a run's state as much as the
//! global model is, so it goes into every checkpoint ([`InFlight::arrays`],
//! [`InFlight::refill`]) and a resumed asynchronous run continues exactly.
//!
//! It holds updates and their times; it never trains, aggregates or reads a model's
//! meaning: the engine does that, and the clock arithmetic stays in [`super::clock`].
//!
//! **Memory is bounded.** A late update holds a whole model, and under
//! `stale_update = -1` nothing made it expire: with a deadline no update meets, every
//! training waited forever and a run held one model per training (4,000 models over 400
//! rounds of 10). A device trains one task at a time, so the book keeps at most one late
//! update per client: a client selected again while its update is still on its way is sent
//! the new model and drops the old task, whose training is then wasted
//! ([`InFlight::supersede`]). REFL's code also keeps one stale update per client (its
//! `staleWeights` is a dict keyed by client id, ahmedcs/REFL @ aa7e642,
//! `core/aggregator.py` line 89), but never re-selects such a client (lines 682-722);
//! fedsel leaves selection to the selector. So the late updates held are at most the
//! number of clients N, and FedBuff's flights at most its concurrency C: the book's memory
//! is at most (N + C) models, whatever the number of rounds. At the end of a run the
//! updates still in the book were never used, and [`InFlight::unused`] counts them as
//! wasted trainings.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use crate::system::clock::Clock;
use crate::system::round::{self, Flight};

/// An update that missed its round's cut and waits, under `[system.stale]`, to be folded
/// into a later round when it arrives.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct LateUpdate {
    /// Its client.
    pub client: usize,
    /// The round it was trained in.
    pub origin: usize,
    /// The virtual second it arrives.
    pub arrival_s: f64,
    /// The local model (in the checkpoint's tensors, not its metadata).
    #[serde(skip)]
    pub params: Vec<f32>,
    /// The selector's weight for its entry, if it gave any.
    pub weight: Option<f64>,
}

/// A FedBuff update in flight: trained when its client was selected, from the model of
/// that round, and aggregated when it arrives.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Flying {
    /// Its client.
    pub client: usize,
    /// The local model minus the model it trained from (in the checkpoint's tensors).
    #[serde(skip)]
    pub delta: Vec<f32>,
    /// Its mean training loss.
    pub loss: f64,
    /// The selector's weight for its entry, if it gave any.
    pub weight: Option<f64>,
    /// Its client's sample-selection report, when the selector asked for a pass.
    pub report: Option<Vec<f64>>,
}

/// Everything in flight between two rounds.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct InFlight {
    /// Late updates waiting to be folded (`[system.stale]`), oldest first.
    pub late: Vec<LateUpdate>,
    /// FedBuff's clients in flight, in the order they started.
    pub flights: Vec<Flight>,
    /// Their updates, by [`Flight::id`].
    pub flying: BTreeMap<usize, Flying>,
    /// The id the next FedBuff flight gets.
    pub next_flight: usize,
}

/// What [`InFlight::fold_due`] takes out of the book for one round.
#[derive(Debug, Clone, PartialEq)]
pub struct Due {
    /// The late updates folded into this round, each with its staleness τ.
    pub folded: Vec<(LateUpdate, usize)>,
    /// Tasks dropped because their client was sent this round's model: wasted trainings.
    pub superseded: usize,
    /// Late updates past `stale_update`: wasted trainings.
    pub expired: usize,
}

/// What one FedBuff round ([`InFlight::fedbuff_round`]) aggregates.
#[derive(Debug, Clone, PartialEq)]
pub struct Buffered {
    /// The buffer, in arrival order: each update, its flight and its staleness.
    pub buffer: Vec<(Flying, Flight, usize)>,
    /// Updates lost because their client was offline when they arrived: wasted trainings.
    pub lost: usize,
    /// Virtual second of the aggregation.
    pub close_s: f64,
}

impl InFlight {
    /// Whether nothing is in flight and no flight was ever started: a synchronous run's
    /// book, left out of its checkpoint so that such checkpoints read as before.
    pub fn is_empty(&self) -> bool {
        self.late.is_empty() && self.flights.is_empty() && self.next_flight == 0
    }

    /// The models the book holds, in the order [`InFlight::refill`] takes them back: the
    /// late updates' then the flying deltas, by id.
    pub fn arrays(&self) -> impl Iterator<Item = &[f32]> {
        self.late
            .iter()
            .map(|u| u.params.as_slice())
            .chain(self.flying.values().map(|f| f.delta.as_slice()))
    }

    /// The book without its models: what a checkpoint's metadata records (the models go
    /// to its tensors), made without copying them.
    pub fn times(&self) -> Self {
        Self {
            late: self
                .late
                .iter()
                .map(|u| LateUpdate {
                    params: Vec::new(),
                    ..*u
                })
                .collect(),
            flights: self.flights.clone(),
            flying: self
                .flying
                .iter()
                .map(|(&id, f)| {
                    (
                        id,
                        Flying {
                            delta: Vec::new(),
                            report: f.report.clone(),
                            ..*f
                        },
                    )
                })
                .collect(),
            next_flight: self.next_flight,
        }
    }

    /// How many models [`InFlight::arrays`] yields.
    pub fn array_count(&self) -> usize {
        self.late.len() + self.flying.len()
    }

    /// Puts back the models of a book read from a checkpoint's metadata, in
    /// [`InFlight::arrays`] order.
    pub fn refill(&mut self, mut next: impl FnMut() -> Vec<f32>) {
        for u in &mut self.late {
            u.params = next();
        }
        for f in self.flying.values_mut() {
            f.delta = next();
        }
    }

    /// Drops the late updates of `clients` that have not arrived by `broadcast_s`, when
    /// those clients are sent a new model then (module doc); returns how many it dropped,
    /// each a wasted training. An update already at the server waits for its fold.
    pub fn supersede(&mut self, clients: &[usize], broadcast_s: f64) -> usize {
        let before = self.late.len();
        self.late
            .retain(|u| !(u.arrival_s > broadcast_s && clients.contains(&u.client)));
        before - self.late.len()
    }

    /// The trainings whose updates are still in the book: at the end of a run, never used.
    pub fn unused(&self) -> usize {
        self.late.len() + self.flying.len()
    }

    /// The clients training under FedBuff (a client trains one update at a time).
    pub fn busy(&self) -> std::collections::BTreeSet<usize> {
        self.flights
            .iter()
            .map(|f| self.flying[&f.id].client)
            .collect()
    }

    /// Puts an update that missed its round's cut on the waiting list (`[system.stale]`).
    pub fn hold(&mut self, update: LateUpdate) {
        self.late.push(update);
    }

    /// The late updates round `t` folds or lets expire ([`round::stale_due`]), after the
    /// clients of `selected` drop the tasks still on their way at `broadcast_s`
    /// ([`InFlight::supersede`]); the round closes at `close_s`, with a fresh update if
    /// `fresh`. The folded updates leave the book with their staleness; the others stay.
    pub fn fold_due(
        &mut self,
        t: usize,
        selected: &[usize],
        broadcast_s: f64,
        close_s: f64,
        fresh: bool,
        stale_update: i64,
    ) -> Due {
        let superseded = self.supersede(selected, broadcast_s);
        let pending: Vec<(usize, f64)> =
            self.late.iter().map(|u| (u.origin, u.arrival_s)).collect();
        let (folded, expired) = round::stale_due(&pending, t, close_s, fresh, stale_update);
        let mut tau_of: Vec<Option<usize>> = vec![None; self.late.len()];
        for &(i, tau) in &folded {
            tau_of[i] = Some(tau);
        }
        let mut due = Due {
            folded: Vec::with_capacity(folded.len()),
            superseded,
            expired: expired.len(),
        };
        let mut keep = Vec::with_capacity(self.late.len() - folded.len() - expired.len());
        for (i, u) in std::mem::take(&mut self.late).into_iter().enumerate() {
            match tau_of[i] {
                Some(tau) => due.folded.push((u, tau)),
                None if expired.contains(&i) => {}
                None => keep.push(u),
            }
        }
        self.late = keep;
        due
    }

    /// One FedBuff round ([`round::fedbuff_round`]) from `now_s`, at model version
    /// `version`: the `departing` trainings (each update and its seconds until it
    /// arrives) join the flights as the `concurrency` leaves room, the server waits for
    /// `buffer_size` arrivals, and an arrival while its client is offline is lost. The
    /// buffered updates leave the book with their flights and staleness; a round in which
    /// nothing trains or arrives lasts until the server's next decision point.
    pub fn fedbuff_round(
        &mut self,
        clock: &Clock,
        departing: Vec<(Flying, f64)>,
        concurrency: usize,
        now_s: f64,
        version: usize,
        buffer_size: usize,
    ) -> Buffered {
        let free = concurrency.saturating_sub(self.flights.len());
        let mut queue = Vec::with_capacity(departing.len());
        for (flying, finish_s) in departing {
            let id = self.next_flight;
            self.next_flight += 1;
            self.flying.insert(id, flying);
            queue.push((id, finish_s));
        }
        let flying = &self.flying;
        let mut r = round::fedbuff_round(
            &mut self.flights,
            &queue,
            free,
            now_s,
            version,
            buffer_size,
            |id, at| clock.online_at(flying[&id].client, at),
        );
        if r.buffer.is_empty() && r.lost.is_empty() {
            r.close_s += clock.idle_s(r.close_s, None);
        }
        for f in &r.lost {
            self.flying.remove(&f.id);
        }
        let buffer = r
            .buffer
            .into_iter()
            .map(|(f, staleness)| {
                let update = self.flying.remove(&f.id).expect("a buffered update flew");
                (update, f, staleness)
            })
            .collect();
        Buffered {
            buffer,
            lost: r.lost.len(),
            close_s: r.close_s,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn late(client: usize, origin: usize, arrival_s: f64) -> LateUpdate {
        LateUpdate {
            client,
            origin,
            arrival_s,
            params: vec![client as f32; 3],
            weight: None,
        }
    }

    #[test]
    fn a_new_task_supersedes_only_an_update_still_on_its_way() {
        let mut book = InFlight {
            late: vec![late(1, 0, 5.0), late(2, 0, 3.0), late(3, 1, 9.0)],
            ..InFlight::default()
        };
        // Client 1's update arrives at 5 s, after the broadcast at 4 s: dropped. Client 2's
        // arrived at 3 s and waits for its fold. Client 3 is not selected.
        assert_eq!(book.supersede(&[1, 2], 4.0), 1);
        let left: Vec<usize> = book.late.iter().map(|u| u.client).collect();
        assert_eq!(left, [2, 3]);
        assert_eq!(book.unused(), 2);
    }

    /// Round 2 closes at 10 s with a fresh update, `stale_update = 1`, and client 3 is
    /// sent the new model at 8 s: client 1's round-0 update (arrived at 4.3 s, τ = 2,
    /// τ − 1 = 1) folds; client 2's (arriving at 20 s) waits; client 3's (arriving at 9 s,
    /// after the broadcast) is superseded. At round 3 client 2's has τ − 1 = 2 > 1 and
    /// expires before it arrives.
    #[test]
    fn the_book_folds_what_arrived_keeps_what_waits_and_drops_the_superseded_and_expired() {
        let mut book = InFlight {
            late: vec![late(1, 0, 4.3), late(2, 0, 20.0), late(3, 1, 9.0)],
            ..InFlight::default()
        };
        let due = book.fold_due(2, &[3], 8.0, 10.0, true, 1);
        let folded: Vec<(usize, usize)> = due.folded.iter().map(|(u, t)| (u.client, *t)).collect();
        assert_eq!(folded, [(1, 2)]);
        assert_eq!(due.folded[0].0.params, [1.0; 3]);
        assert_eq!((due.superseded, due.expired), (1, 0));
        assert_eq!(book.late.iter().map(|u| u.client).collect::<Vec<_>>(), [2]);
        let due = book.fold_due(3, &[], 30.0, 30.0, true, 1);
        assert_eq!((due.folded.len(), due.superseded, due.expired), (0, 0, 1));
        assert!(book.late.is_empty());
    }

    #[test]
    fn the_models_round_trip_through_arrays_and_refill_in_order() {
        let mut flying = BTreeMap::new();
        for (id, client) in [(4, 7), (2, 8)] {
            flying.insert(
                id,
                Flying {
                    client,
                    delta: vec![id as f32; 2],
                    loss: 0.5,
                    weight: Some(0.25),
                    report: None,
                },
            );
        }
        let book = InFlight {
            late: vec![late(1, 0, 5.0), late(2, 1, 3.0)],
            flights: Vec::new(),
            flying,
            next_flight: 5,
        };
        let arrays: Vec<Vec<f32>> = book.arrays().map(<[f32]>::to_vec).collect();
        assert_eq!(arrays.len(), book.array_count());
        let meta: InFlight = serde_json::from_value(serde_json::to_value(&book).unwrap()).unwrap();
        assert!(meta.late.iter().all(|u| u.params.is_empty()));
        let mut restored = meta;
        let mut it = arrays.into_iter();
        restored.refill(|| it.next().unwrap());
        assert_eq!(restored, book);
    }
}
