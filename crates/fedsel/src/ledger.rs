//! The per-run cost ledger: what a real deployment would pay for a strategy.
//!
//! Every message and client computation the engine performs on a strategy's
//! behalf is booked here, so that "extra communication" and "extra
//! computation" columns compare strategies on what they really cost.

use serde::Serialize;

/// Counts of messages and client computations.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, serde::Deserialize)]
#[serde(default)]
pub struct Ledger {
    /// Global models sent to clients (for training, evaluation or gradients).
    pub broadcasts: u64,
    /// Models or updates sent back by clients.
    pub uploads: u64,
    /// Local training runs of the round's own selection.
    pub trainings: u64,
    /// Local training runs a strategy adds to a round that also fed the global model
    /// (FedGP's uniform K^r on its GP-training rounds).
    pub extra_trainings: u64,
    /// Local training runs whose result was discarded (probes).
    pub probe_trainings: u64,
    /// Mini-batch steps of all local training.
    pub train_steps: u64,
    /// Client evaluations of the global model on their held-out data.
    pub evaluations: u64,
    /// Examples those evaluations passed over.
    pub eval_examples: u64,
    /// Scalar reports (losses) sent by clients.
    pub scalar_reports: u64,
    /// Gradient computations of the global model (DivFL's client gradients).
    pub gradients: u64,
    /// Training examples those gradients passed over: one batch each for a mini-batch
    /// gradient, the client's whole training set for a full one.
    pub gradient_examples: u64,
    /// Messages of privacy protocols (FedGS's secure scalar products), each a vector
    /// or scalar sent to or from a client.
    pub protocol_messages: u64,
    /// Local trainings of the round's own selection none of whose updates the round policy
    /// aggregated (over-commitment's stragglers, updates past a deadline): paid for, their
    /// broadcasts and uploads booked above, and unused. Only a clock drops updates, so
    /// without `[system]` this is 0 and no output shows it: it is not in
    /// [`Ledger::COLUMNS`] but in the clock's columns of `metrics.csv`, and `summary.json`
    /// leaves it out at 0.
    #[serde(skip_serializing_if = "is_zero")]
    pub wasted_trainings: u64,
    /// Local trainings of an earlier round that missed its cut and were folded, late, into
    /// this one (`[system.stale]`): their broadcasts, uploads and steps are booked in their
    /// own round. Like `wasted_trainings`, left out of [`Ledger::COLUMNS`] and of
    /// `summary.json` at 0.
    #[serde(skip_serializing_if = "is_zero")]
    pub stale_trainings: u64,
    /// Training examples the selected clients passed forward for a client-side sample
    /// selection ([`SampleRule`](crate::select::SampleRule), FedBalancer's per-sample
    /// losses) before they trained. Like `wasted_trainings`, left out of
    /// [`Ledger::COLUMNS`] and of `summary.json` at 0, so that runs without a rule keep
    /// their outputs.
    #[serde(skip_serializing_if = "is_zero")]
    pub sample_examples: u64,
    /// Parameters the round's uploads left out, as their selector ordered
    /// ([`UploadDropout`](crate::select::UploadDropout), PyramidFL's update dropout): the
    /// communication saved, which `uploads` (whole models) does not show. Booked, as
    /// `uploads` is, for every upload a client started, including one lost when its client
    /// went offline before it arrived (that training is also in `wasted_trainings`): both
    /// count what the clients were told to send, not what reached the server. Like
    /// `wasted_trainings`, left out of [`Ledger::COLUMNS`] and of `summary.json` at 0.
    #[serde(skip_serializing_if = "is_zero")]
    pub dropped_params: u64,
}

fn is_zero(x: &u64) -> bool {
    *x == 0
}

impl Ledger {
    /// Column names, in the order of [`Ledger::values`].
    pub const COLUMNS: [&'static str; 12] = [
        "broadcasts",
        "uploads",
        "trainings",
        "extra_trainings",
        "probe_trainings",
        "train_steps",
        "evaluations",
        "eval_examples",
        "scalar_reports",
        "gradients",
        "gradient_examples",
        "protocol_messages",
    ];

    /// The counts, in the order of [`Ledger::COLUMNS`].
    pub fn values(&self) -> [u64; 12] {
        [
            self.broadcasts,
            self.uploads,
            self.trainings,
            self.extra_trainings,
            self.probe_trainings,
            self.train_steps,
            self.evaluations,
            self.eval_examples,
            self.scalar_reports,
            self.gradients,
            self.gradient_examples,
            self.protocol_messages,
        ]
    }

    /// Adds another ledger's counts to this one.
    pub fn add(&mut self, other: &Ledger) {
        self.broadcasts += other.broadcasts;
        self.uploads += other.uploads;
        self.trainings += other.trainings;
        self.extra_trainings += other.extra_trainings;
        self.probe_trainings += other.probe_trainings;
        self.train_steps += other.train_steps;
        self.evaluations += other.evaluations;
        self.eval_examples += other.eval_examples;
        self.scalar_reports += other.scalar_reports;
        self.gradients += other.gradients;
        self.gradient_examples += other.gradient_examples;
        self.protocol_messages += other.protocol_messages;
        self.wasted_trainings += other.wasted_trainings;
        self.stale_trainings += other.stale_trainings;
        self.sample_examples += other.sample_examples;
        self.dropped_params += other.dropped_params;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn columns_values_and_add_agree() {
        // Distinct counts per field, so a field out of place or missed shows.
        let a = Ledger {
            broadcasts: 1,
            uploads: 2,
            trainings: 3,
            extra_trainings: 12,
            probe_trainings: 4,
            train_steps: 5,
            evaluations: 6,
            eval_examples: 7,
            scalar_reports: 8,
            gradients: 9,
            gradient_examples: 10,
            protocol_messages: 11,
            wasted_trainings: 13,
            stale_trainings: 14,
            sample_examples: 16,
            dropped_params: 15,
        };
        assert_eq!(a.values(), [1, 2, 3, 12, 4, 5, 6, 7, 8, 9, 10, 11]);
        let json = serde_json::to_value(a).unwrap();
        for (name, v) in Ledger::COLUMNS.iter().zip(a.values()) {
            assert_eq!(json[name], v, "{name}");
        }
        assert_eq!(json["wasted_trainings"], 13);
        let mut b = a;
        b.add(&a);
        assert_eq!(b.values(), a.values().map(|v| 2 * v));
        assert_eq!(b.wasted_trainings, 26);
        assert_eq!(b.sample_examples, 32);
        assert_eq!(json["sample_examples"], 16);
        assert_eq!(b.dropped_params, 30);
        // At 0 (every run without a clock) it is left out, and read back as 0.
        let plain = Ledger {
            wasted_trainings: 0,
            sample_examples: 0,
            ..a
        };
        let json = serde_json::to_value(plain).unwrap();
        assert!(json.get("wasted_trainings").is_none());
        assert!(json.get("sample_examples").is_none());
        assert_eq!(serde_json::from_value::<Ledger>(json).unwrap(), plain);
    }
}
