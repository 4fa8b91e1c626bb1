//! The outcome of a whole run.
//!
//! Kept apart from [`crate::engine`], which produces it, because checkpoints and the
//! output directory store it too: neither should depend on the round loop to name it.

use crate::ledger::Ledger;

impl RunSummary {
    /// Records that the rest of the run goes on with this CPU's kernels and this build: a
    /// resume on another kind of CPU, or by a binary of another commit, appends its name,
    /// so no summary hides a change of kernels or of code.
    pub(crate) fn resumed_on(&mut self, isa: &str, commit: &str) {
        append_once(&mut self.cpu, isa);
        append_once(&mut self.commit, commit);
    }

    /// The commits of the builds that ran the run, in order (one unless it was resumed
    /// by another build).
    pub fn commits(&self) -> Vec<&str> {
        self.commit.split(", ").filter(|c| !c.is_empty()).collect()
    }
}

/// Appends `name` to a comma-separated list that does not hold it yet.
fn append_once(list: &mut String, name: &str) {
    if list.is_empty() {
        *list = name.into();
    } else if !list.split(", ").any(|seen| seen == name) {
        *list = format!("{list}, {name}");
    }
}

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
    /// The instruction sets whose kernels ran the run ([`crate::cpu::Isa::name`]; two,
    /// comma-separated, when a run resumed on another kind of CPU). `gemm` picks its
    /// kernels by instruction set and they round differently, so the same config and seed
    /// give the same bits only on CPUs of the same kind: this says which kind a row came
    /// from. Empty in summaries written before it was recorded, and then left out when
    /// written again, so that a checkpoint written before it keeps its checksum.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub cpu: String,
    /// The commits of the builds that ran the run ([`crate::build_commit`]; several,
    /// comma-separated, when a run resumed under another build), which `fedsel results
    /// collect` records as its rows' commit. Empty in summaries written before it was
    /// recorded, and then left out, as `cpu`.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub commit: String,
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

#[cfg(test)]
mod tests {
    use super::*;

    fn summary(cpu: &str) -> RunSummary {
        RunSummary {
            strategy: "uniform".into(),
            seed: 1,
            rounds: 3,
            final_acc: None,
            final_loss: None,
            best_acc: None,
            best_acc_round: 0,
            best_loss: None,
            rounds_to_target: vec![],
            diverged_at: None,
            wall_s: 0.0,
            cost: Ledger::default(),
            version: crate::VERSION.into(),
            cpu: cpu.into(),
            commit: String::new(),
            clock: None,
        }
    }

    #[test]
    fn a_resume_names_each_kind_of_cpu_once_in_order() {
        let mut s = summary("avx2+fma");
        s.resumed_on("avx2+fma", "a");
        assert_eq!(s.cpu, "avx2+fma");
        s.resumed_on("avx512f", "a");
        assert_eq!(s.cpu, "avx2+fma, avx512f");
        s.resumed_on("avx2+fma", "a");
        assert_eq!(s.cpu, "avx2+fma, avx512f");
        // A checkpoint written before the field existed learns only the resuming CPU.
        let mut old = summary("");
        old.resumed_on("avx512f", "a");
        assert_eq!(old.cpu, "avx512f");
    }

    #[test]
    fn a_resume_by_another_build_names_its_commit_after_the_first() {
        let mut s = summary("avx2+fma");
        s.resumed_on("avx2+fma", "c1");
        s.resumed_on("avx2+fma", "c1");
        assert_eq!(s.commits(), ["c1"]);
        s.resumed_on("avx2+fma", "c2+dirty");
        assert_eq!(s.commits(), ["c1", "c2+dirty"]);
        assert_eq!(summary("").commits(), Vec::<&str>::new());
    }

    #[test]
    fn summaries_written_before_the_cpu_was_recorded_still_read() {
        let mut json = serde_json::to_value(summary("avx512f")).unwrap();
        json.as_object_mut().unwrap().remove("cpu");
        let back: RunSummary = serde_json::from_value(json.clone()).unwrap();
        assert_eq!(back.cpu, "");
        // Written again, it is the same JSON: a checkpoint's checksum over it still holds.
        assert_eq!(serde_json::to_value(&back).unwrap(), json);
    }
}
