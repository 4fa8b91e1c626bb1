//! Helpers shared by the integration tests.

use std::path::PathBuf;

use fedsel::config::Config;
use fedsel::data::locate;
use fedsel::engine::{self, Experiment, Observer, RoundRecord};

/// `../shared/data` beside the repository, if present.
pub fn shared_data() -> Option<PathBuf> {
    let p = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../../shared/data");
    if p.join("fashion-mnist").is_dir() {
        Some(p)
    } else {
        eprintln!(
            "SKIPPED: ../shared/data not found at {}; data-dependent checks skipped",
            p.display()
        );
        None
    }
}

/// Collects every round in memory.
#[derive(Default)]
pub struct Collect(pub Vec<RoundRecord>);

impl Observer for Collect {
    fn on_round(&mut self, r: &RoundRecord) -> fedsel::error::Result<()> {
        self.0.push(r.clone());
        Ok(())
    }
}

/// The built-in synthetic experiment with `overrides` (`key=value`, as `--set` takes them).
pub fn synthetic(overrides: &[&str]) -> Experiment {
    let set: Vec<String> = overrides.iter().map(|s| s.to_string()).collect();
    let config = Config::load(None, &set).unwrap();
    config.validate().unwrap();
    let dir = locate::data_dir(None, None);
    Experiment::prepare(config, &dir).unwrap()
}

/// Every round's record of a run of `exp`.
pub fn run(exp: &Experiment) -> Vec<RoundRecord> {
    let mut c = Collect::default();
    engine::run(exp, &mut c).unwrap();
    c.0
}
