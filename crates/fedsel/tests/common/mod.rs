//! Helpers shared by the integration tests.

use std::path::PathBuf;

use fedsel::engine::{Observer, RoundRecord};

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
