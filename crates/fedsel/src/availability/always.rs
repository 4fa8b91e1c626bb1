//! Every client is available in every round (FedGS IDL, F3AST "Always").

use super::{Availability, RoundAvailability};

/// Full availability with a constant budget.
#[derive(Debug, Clone)]
pub struct Always {
    /// Number of clients.
    pub clients: usize,
    /// Budget per round.
    pub budget: usize,
}

impl Availability for Always {
    fn name(&self) -> &'static str {
        "always"
    }

    fn round(&mut self, _t: usize) -> RoundAvailability {
        RoundAvailability {
            active: (0..self.clients).collect(),
            budget: self.budget,
        }
    }
}
