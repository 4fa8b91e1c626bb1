//! n shards per client (1SPC / 2SPC; McMahan et al., as run by FedCor).
//!
//! Examples are sorted by label (stable, so ties keep index order), cut into
//! `spc · N` shards of ⌊|D| / (spc·N)⌋ examples, and each client receives
//! `spc` shards drawn without replacement. The few examples past the last
//! whole shard are left out, as in the FedCor code.

use rand::seq::SliceRandom;

use crate::error::PartitionError;
use crate::rng::Rng;

/// Deals `shards_per_client` label-sorted shards to each of `clients`.
pub fn partition(
    labels: &[u32],
    clients: usize,
    shards_per_client: usize,
    rng: &mut Rng,
) -> Result<Vec<Vec<usize>>, PartitionError> {
    let shards = clients * shards_per_client;
    let size = labels.len() / shards;
    if size == 0 {
        return Err(PartitionError {
            kind: "shards",
            reason: format!("{} examples cannot fill {shards} shards", labels.len()),
        });
    }
    let mut sorted: Vec<usize> = (0..labels.len()).collect();
    sorted.sort_by_key(|&i| labels[i]);
    let mut ids: Vec<usize> = (0..shards).collect();
    ids.shuffle(rng);
    Ok(ids
        .chunks(shards_per_client)
        .map(|mine| {
            let mut idx: Vec<usize> = mine
                .iter()
                .flat_map(|&s| sorted[s * size..(s + 1) * size].iter().copied())
                .collect();
            idx.shuffle(rng);
            idx
        })
        .collect())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::partition::testing::{assert_disjoint, labels};
    use crate::rng::{Purpose, stream};

    #[test]
    fn each_client_gets_spc_shards_of_few_labels() {
        let labels = labels(600);
        for spc in [1, 2] {
            let parts =
                partition(&labels, 100, spc, &mut stream(2, Purpose::Partition, 0, 0)).unwrap();
            assert_eq!(assert_disjoint(&parts, labels.len()), 6000);
            for p in &parts {
                assert_eq!(p.len(), 60 / spc * spc);
                let mut ls: Vec<u32> = p.iter().map(|&i| labels[i]).collect();
                ls.dedup_by_key(|l| *l);
                ls.sort();
                ls.dedup();
                // Shards of 60/spc examples never straddle more than one label boundary each.
                assert!(ls.len() <= spc, "{} labels with {spc} shards", ls.len());
            }
        }
    }
}
