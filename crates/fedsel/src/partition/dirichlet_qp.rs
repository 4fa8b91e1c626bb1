//! Per-client Dirichlet label mixes with QP client sizes (FedCor App. C.2).
//!
//! Each client k draws a label mix q_k ~ Dir(α·prior), prior being the class
//! frequencies. Client sizes x solve min ‖x‖² s.t. Σ_k q_kj x_k = c_j for every
//! class j and x ≥ 0 (the minimum-norm non-negative sizes that use every
//! example), solved with Clarabel. Client k then takes ⌊q_kj·x_k⌋ examples of
//! class j (classes outer, clients inner, without replacement), and the
//! leftovers go to clients drawn uniformly with replacement.

use clarabel::algebra::CscMatrix;
use clarabel::solver::{
    DefaultSettingsBuilder, DefaultSolver, IPSolver, SolverStatus, SupportedConeT,
};
use rand::Rng as _;
use rand::seq::SliceRandom;

use super::{by_class, dirichlet};
use crate::error::PartitionError;
use crate::rng::Rng;

fn err(reason: String) -> PartitionError {
    PartitionError {
        kind: "dirichlet_qp",
        reason,
    }
}

/// Minimum-norm non-negative x with `q x = c` (q is classes × clients, row-major).
pub fn min_norm_sizes(q: &[Vec<f64>], c: &[f64]) -> Result<Vec<f64>, PartitionError> {
    let classes = q.len();
    let n = q[0].len();
    // Scale to O(1) so the interior-point tolerances are meaningful.
    let scale = c.iter().cloned().fold(1.0, f64::max);
    let p = CscMatrix::identity(n);
    let zeros = vec![0.0; n];
    // A = [Q; −I] in CSC: column k holds q[·][k] then −1 at row classes + k.
    let mut colptr = vec![0];
    let mut rowval = Vec::new();
    let mut nzval = Vec::new();
    for k in 0..n {
        for (j, row) in q.iter().enumerate() {
            if row[k] != 0.0 {
                rowval.push(j);
                nzval.push(row[k]);
            }
        }
        rowval.push(classes + k);
        nzval.push(-1.0);
        colptr.push(rowval.len());
    }
    let a = CscMatrix::new(classes + n, n, colptr, rowval, nzval);
    let mut b: Vec<f64> = c.iter().map(|x| x / scale).collect();
    b.extend(std::iter::repeat_n(0.0, n));
    let cones = [
        SupportedConeT::ZeroConeT(classes),
        SupportedConeT::NonnegativeConeT(n),
    ];
    let settings = DefaultSettingsBuilder::default()
        .verbose(false)
        .build()
        .map_err(|e| err(format!("solver settings: {e:?}")))?;
    let mut solver = DefaultSolver::new(&p, &zeros, &a, &b, &cones, settings)
        .map_err(|e| err(format!("QP setup failed: {e:?}")))?;
    solver.solve();
    match solver.solution.status {
        SolverStatus::Solved | SolverStatus::AlmostSolved => Ok(solver
            .solution
            .x
            .iter()
            .map(|x| x.max(0.0) * scale)
            .collect()),
        s => Err(err(format!(
            "size QP not solved ({s:?}); the label mixes leave a class unreachable, try a larger alpha"
        ))),
    }
}

/// Partitions `labels` over `clients` with concentration `alpha`.
pub fn partition(
    labels: &[u32],
    classes: usize,
    clients: usize,
    alpha: f64,
    rng: &mut Rng,
) -> Result<Vec<Vec<usize>>, PartitionError> {
    let mut pools = by_class(labels, classes);
    let counts: Vec<f64> = pools.iter().map(|p| p.len() as f64).collect();
    let total: f64 = counts.iter().sum();
    let conc: Vec<f64> = counts
        .iter()
        .map(|c| (alpha * c / total).max(1e-12))
        .collect();
    let mixes: Vec<Vec<f64>> = (0..clients).map(|_| dirichlet(&conc, rng)).collect();
    let q: Vec<Vec<f64>> = (0..classes)
        .map(|j| mixes.iter().map(|m| m[j]).collect())
        .collect();
    let sizes = min_norm_sizes(&q, &counts)?;
    for pool in &mut pools {
        pool.shuffle(rng);
    }
    let mut parts = vec![Vec::new(); clients];
    for (j, pool) in pools.iter_mut().enumerate() {
        for k in 0..clients {
            let want = ((mixes[k][j] * sizes[k]).floor() as usize).min(pool.len());
            parts[k].extend(pool.drain(pool.len() - want..));
        }
    }
    for i in pools.into_iter().flatten() {
        parts[rng.random_range(0..clients)].push(i);
    }
    for p in &mut parts {
        p.shuffle(rng);
    }
    Ok(parts)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::partition::testing::{assert_disjoint, labels};
    use crate::rng::{Purpose, stream};

    #[test]
    fn qp_matches_hand_solution() {
        // x1 + x2 = 2, x2 = 1 → x = (1, 1); with a free choice x1 + x2 = 2 → (1, 1) too.
        let x = min_norm_sizes(&[vec![1.0, 1.0], vec![0.0, 1.0]], &[2.0, 1.0]).unwrap();
        assert!(
            (x[0] - 1.0).abs() < 1e-5 && (x[1] - 1.0).abs() < 1e-5,
            "{x:?}"
        );
        let x = min_norm_sizes(&[vec![1.0, 1.0]], &[2.0]).unwrap();
        assert!(
            (x[0] - 1.0).abs() < 1e-5 && (x[1] - 1.0).abs() < 1e-5,
            "{x:?}"
        );
        // Non-negativity binds: x1 − x2 = 1 alone would give (0.5, −0.5); with x ≥ 0 → (1, 0).
        let x = min_norm_sizes(&[vec![1.0, -1.0]], &[1.0]).unwrap();
        assert!((x[0] - 1.0).abs() < 1e-4 && x[1].abs() < 1e-4, "{x:?}");
    }

    #[test]
    fn conserves_every_sample_and_is_skewed() {
        let labels = labels(600);
        let parts = partition(
            &labels,
            10,
            100,
            0.2,
            &mut stream(4, Purpose::Partition, 0, 0),
        )
        .unwrap();
        assert_eq!(parts.len(), 100);
        assert_eq!(assert_disjoint(&parts, labels.len()), labels.len());
        // Dir(0.02) mixes: most of a typical client's data is one class.
        let dominant: f64 = parts
            .iter()
            .filter(|p| p.len() >= 10)
            .map(|p| {
                let mut h = [0usize; 10];
                p.iter().for_each(|&i| h[labels[i] as usize] += 1);
                *h.iter().max().unwrap() as f64 / p.len() as f64
            })
            .sum::<f64>()
            / parts.iter().filter(|p| p.len() >= 10).count() as f64;
        assert!(dominant > 0.7, "mean dominant share {dominant}");
    }
}
