//! Every client is available in every round (FedGS IDL, F3AST "Always").

use super::Availability;

/// Full availability.
#[derive(Debug, Clone)]
pub struct Always {
    /// Number of clients.
    pub clients: usize,
}

impl Availability for Always {
    fn active(&self, _t: usize) -> Vec<usize> {
        (0..self.clients).collect()
    }
}
