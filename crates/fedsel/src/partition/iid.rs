//! IID: a random permutation cut into equal parts (sizes differ by at most one).

use rand::seq::SliceRandom;

use crate::rng::Rng;

/// Splits `pool` examples over `clients` uniformly at random.
pub fn partition(pool: usize, clients: usize, rng: &mut Rng) -> Vec<Vec<usize>> {
    let mut idx: Vec<usize> = (0..pool).collect();
    idx.shuffle(rng);
    let (base, extra) = (pool / clients, pool % clients);
    let mut out = Vec::with_capacity(clients);
    let mut at = 0;
    for k in 0..clients {
        let len = base + usize::from(k < extra);
        out.push(idx[at..at + len].to_vec());
        at += len;
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::partition::testing::assert_disjoint;
    use crate::rng::{Purpose, stream};

    #[test]
    fn conserves_and_balances() {
        let parts = partition(1003, 10, &mut stream(1, Purpose::Partition, 0, 0));
        assert_eq!(assert_disjoint(&parts, 1003), 1003);
        assert!(parts.iter().all(|p| p.len() == 100 || p.len() == 101));
    }
}
