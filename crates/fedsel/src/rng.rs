//! Independent random streams.
//!
//! Every random decision in a run draws from a stream keyed by
//! `(seed, purpose, round, client)`. Because a stream depends on nothing else,
//! results do not depend on the order in which parallel work runs, on the
//! thread count, or on which strategy is being run: availability for a given
//! seed, for example, is the same for every strategy (FedGS App. C).

use rand::SeedableRng;
use rand_chacha::ChaCha8Rng;

/// The generator behind every stream.
pub type Rng = ChaCha8Rng;

/// What a stream is used for; part of its key so that two purposes never share draws.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u64)]
pub enum Purpose {
    /// Generating a synthetic dataset.
    Dataset = 1,
    /// Assigning examples to clients.
    Partition = 2,
    /// Splitting a client's examples into local train and held-out parts.
    HoldoutSplit = 3,
    /// Initial model parameters.
    Init = 4,
    /// Which clients are available in a round.
    Availability = 5,
    /// The selector's own draws in a round.
    Selection = 6,
    /// A client's local training (batch order, dropout masks).
    Training = 7,
    /// Anything else a strategy draws once per run (e.g. embeddings, per-client rates).
    Strategy = 8,
    /// Extra client work a strategy asks for: probe trainings, mini-batch loss reports.
    Probe = 9,
    /// The communication budget K_t of a round.
    Budget = 10,
    /// Each client's device (compute speed, bandwidth), drawn once from the data seed.
    Device = 11,
    /// A client's choice of what to leave out of its upload (update dropout by layer).
    Upload = 12,
}

/// Mixes a 64-bit value (SplitMix64 finaliser); used to spread the key over the seed bytes.
fn mix(mut z: u64) -> u64 {
    z = z.wrapping_add(0x9E37_79B9_7F4A_7C15);
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

/// The stream for `(seed, purpose, round, client)`.
pub fn stream(seed: u64, purpose: Purpose, round: u64, client: u64) -> Rng {
    let mut key = [0u8; 32];
    let mut h = mix(seed);
    for (i, word) in [purpose as u64, round, client, 0x66_65_64_73_65_6c]
        .iter()
        .enumerate()
    {
        h = mix(h ^ word.wrapping_mul(0xA24B_AED4_963E_E407));
        key[i * 8..(i + 1) * 8].copy_from_slice(&h.to_le_bytes());
    }
    Rng::from_seed(key)
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::Rng as _;

    #[test]
    fn streams_are_reproducible_and_distinct() {
        let a: u64 = stream(1, Purpose::Training, 3, 7).random();
        let b: u64 = stream(1, Purpose::Training, 3, 7).random();
        assert_eq!(a, b);
        let others = [
            stream(2, Purpose::Training, 3, 7).random::<u64>(),
            stream(1, Purpose::Selection, 3, 7).random::<u64>(),
            stream(1, Purpose::Training, 4, 7).random::<u64>(),
            stream(1, Purpose::Training, 3, 8).random::<u64>(),
            stream(1, Purpose::Training, 7, 3).random::<u64>(),
        ];
        for o in others {
            assert_ne!(a, o);
        }
    }
}
