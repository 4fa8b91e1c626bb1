//! Client availability: which clients can be reached in a round, and the
//! communication budget K_t.
//!
//! Availability draws come from their own stream keyed by (seed, round,
//! client), so for a given seed every strategy faces the same availability
//! (FedGS App. C).

pub mod always;

use crate::config::AvailabilityConfig;

/// The clients a round can use.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RoundAvailability {
    /// Available clients, ascending.
    pub active: Vec<usize>,
    /// Budget K_t: how many the server may select.
    pub budget: usize,
}

/// An availability model.
pub trait Availability: Send {
    /// Name as used in configs.
    fn name(&self) -> &'static str;
    /// Availability in round `t`.
    fn round(&mut self, t: usize) -> RoundAvailability;
}

/// Builds the model a config names, for `clients` clients and `per_round` selections.
pub fn build(cfg: &AvailabilityConfig, clients: usize, per_round: usize) -> Box<dyn Availability> {
    match cfg {
        AvailabilityConfig::Always => Box::new(always::Always {
            clients,
            budget: per_round,
        }),
    }
}
