//! The outcome of a whole run.
//!
//! Kept apart from [`crate::engine`], which produces it, because checkpoints and the
//! output directory store it too: neither should depend on the round loop to name it.

use crate::ledger::Ledger;

/// Outcome of a whole run.
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct RunSummary {
    /// Strategy name.
    pub strategy: String,
    /// Seed.
    pub seed: u64,
    /// Rounds run.
    pub rounds: usize,
    /// Test accuracy at the last evaluation (the last round always is one).
    pub final_acc: Option<f64>,
    /// Test loss at the last evaluation.
    pub final_loss: Option<f64>,
    /// Best test accuracy seen.
    pub best_acc: Option<f64>,
    /// Round (0-based) of the best accuracy.
    pub best_acc_round: usize,
    /// Lowest test loss seen.
    pub best_loss: Option<f64>,
    /// For each configured target: rounds needed to first reach it (round index + 1), if reached.
    pub rounds_to_target: Vec<(f64, Option<usize>)>,
    /// The first round whose test loss exceeded ten times ln C, the loss of predicting every
    /// class alike: the run diverged although its parameters stayed finite (a learning rate
    /// far too high).
    #[serde(default)]
    pub diverged_at: Option<usize>,
    /// Wall-clock seconds.
    pub wall_s: f64,
    /// Cost totals.
    pub cost: Ledger,
    /// fedsel version.
    pub version: String,
    /// The virtual clock's totals, when `[system]` runs one; absent otherwise, so that
    /// runs without a clock write the summary they always did.
    #[serde(flatten, default, skip_serializing_if = "Option::is_none")]
    pub clock: Option<ClockSummary>,
}

/// A run's totals on the virtual clock ([`crate::system`]).
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct ClockSummary {
    /// Virtual seconds at the end of the last round run.
    pub clock_s: f64,
    /// For each configured target: virtual seconds at the end of the round that first
    /// reached it (the round counted in `rounds_to_target`), if reached.
    pub time_to_target_s: Vec<(f64, Option<f64>)>,
    /// Local trainings whose every update the round policy discarded (over-commitment's
    /// stragglers, updates past the deadline).
    pub wasted_trainings: u64,
    /// Rounds that selected clients but aggregated none of their updates (every one lost
    /// offline or late): the model stood still while the clock ran. Absent from summaries
    /// written before it was counted, which read as 0.
    #[serde(default)]
    pub rounds_without_updates: usize,
}
