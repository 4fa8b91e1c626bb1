//! Offline diagnostics of a finished run: FedCor's learned client embeddings, and
//! HiCS-FL's estimated against true label entropy (HiCS-FL Fig. 9), scored with the
//! statistics of [`fedsel::diagnostics`].
//!
//! The embeddings (`embeddings.csv`, written by the selector) are normalised to unit
//! length, as in FedCor Fig. 7, projected to 2-D with PCA (no maintained t-SNE crate fits
//! here; PCA is deterministic and needs no tuning) and coloured by each client's dominant
//! label from `clients.csv`. The silhouette score of the label groups on the normalised
//! embeddings says how well the embeddings cluster by label (1 = tight, separate
//! clusters; 0 = none).

use std::path::Path;

use fedsel::diagnostics::{high_entropy_group, spearman};
use fedsel::error::{Error, Result};
use nalgebra::DMatrix;

/// Mean silhouette of `labels` groups over `points` (Euclidean). Points in a group of one
/// score 0, as in scikit-learn.
pub fn silhouette(points: &[Vec<f64>], labels: &[usize]) -> f64 {
    let n = points.len();
    let dist = |a: &[f64], b: &[f64]| {
        a.iter()
            .zip(b)
            .map(|(x, y)| (x - y).powi(2))
            .sum::<f64>()
            .sqrt()
    };
    let mut groups: Vec<usize> = labels.to_vec();
    groups.sort_unstable();
    groups.dedup();
    if groups.len() < 2 {
        return 0.0;
    }
    let total: f64 = (0..n)
        .map(|i| {
            let mean_to = |g: usize| {
                let (sum, count) = (0..n)
                    .filter(|&j| j != i && labels[j] == g)
                    .fold((0.0, 0usize), |(s, c), j| {
                        (s + dist(&points[i], &points[j]), c + 1)
                    });
                (count > 0).then(|| sum / count as f64)
            };
            let Some(a) = mean_to(labels[i]) else {
                return 0.0;
            };
            let b = groups
                .iter()
                .filter(|&&g| g != labels[i])
                .filter_map(|&g| mean_to(g))
                .fold(f64::INFINITY, f64::min);
            (b - a) / a.max(b)
        })
        .sum();
    total / n as f64
}

/// The first two principal components of `points`.
pub fn pca_2d(points: &[Vec<f64>]) -> Vec<(f64, f64)> {
    let (n, d) = (points.len(), points.first().map_or(0, Vec::len));
    let mut m = DMatrix::from_fn(n, d, |i, j| points[i][j]);
    for j in 0..d {
        let mean = m.column(j).mean();
        m.column_mut(j).add_scalar_mut(-mean);
    }
    let svd = m.clone().svd(false, true);
    let vt = svd.v_t.expect("v_t was requested");
    // Order components by singular value.
    let mut order: Vec<usize> = (0..svd.singular_values.len()).collect();
    order.sort_by(|&a, &b| svd.singular_values[b].total_cmp(&svd.singular_values[a]));
    let comp = |c: usize| vt.row(order[c]).transpose();
    let (c1, c2) = (
        comp(0),
        if order.len() > 1 {
            comp(1)
        } else {
            comp(0) * 0.0
        },
    );
    (0..n)
        .map(|i| (m.row(i).dot(&c1.transpose()), m.row(i).dot(&c2.transpose())))
        .collect()
}

fn read_rows(path: &Path) -> Result<Vec<Vec<String>>> {
    let bad = |e: &dyn std::fmt::Display| Error::Output {
        path: path.to_path_buf(),
        error: std::io::Error::new(std::io::ErrorKind::InvalidData, e.to_string()),
    };
    let mut r = csv::Reader::from_path(path).map_err(|e| bad(&e))?;
    r.records()
        .map(|row| {
            row.map(|x| x.iter().map(String::from).collect())
                .map_err(|e| bad(&e))
        })
        .collect()
}

/// Silhouette and projection figure for each embeddings file a run wrote
/// (`embeddings_warmup.csv`, `embeddings.csv`): (file stem, silhouette).
pub fn embeddings(run_dir: &Path) -> Result<Vec<(String, f64)>> {
    let mut out = Vec::new();
    for stem in ["embeddings_warmup", "embeddings"] {
        if let Some(s) = embedding_file(run_dir, stem)? {
            out.push((stem.to_string(), s));
        }
    }
    Ok(out)
}

fn embedding_file(run_dir: &Path, stem: &str) -> Result<Option<f64>> {
    let emb = run_dir.join(format!("{stem}.csv"));
    if !emb.is_file() {
        return Ok(None);
    }
    let parse = |v: &str, p: &Path| {
        v.parse::<f64>().map_err(|e| Error::Output {
            path: p.to_path_buf(),
            error: std::io::Error::new(std::io::ErrorKind::InvalidData, e.to_string()),
        })
    };
    let points: Vec<Vec<f64>> = read_rows(&emb)?
        .iter()
        .map(|r| {
            let x: Vec<f64> = r[1..]
                .iter()
                .map(|v| parse(v, &emb))
                .collect::<Result<_>>()?;
            let norm = x.iter().map(|v| v * v).sum::<f64>().sqrt().max(1e-12);
            Ok(x.into_iter().map(|v| v / norm).collect())
        })
        .collect::<Result<_>>()?;
    let clients = run_dir.join("clients.csv");
    let labels: Vec<usize> = read_rows(&clients)?
        .iter()
        .map(|r| parse(&r[3], &clients).map(|v| v as usize))
        .collect::<Result<_>>()?;
    let s = silhouette(&points, &labels);
    if crate::plot::ensure_font().is_ok() {
        let proj = pca_2d(&points);
        crate::plot::scatter(
            &run_dir.join(format!("{stem}_pca")),
            &format!("{stem} (normalised, PCA), silhouette {s:.3}"),
            &proj,
            &labels,
        )?;
    }
    Ok(Some(s))
}

/// A round and a correlation measured in it.
pub type RoundCorrelation = (usize, f64);

/// How well HiCS-FL's estimates ranked the clients over a run.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct EntropyCorrelation {
    /// ρ in the first logged round (right after warm-up).
    pub first: RoundCorrelation,
    /// ρ in the last logged round.
    pub last: RoundCorrelation,
    /// Mean ρ over every logged round: one lucky round does not make a good estimator.
    pub mean: f64,
    /// How the high-entropy group fared; `None` for files without those columns (runs
    /// before they were added) or without such a group.
    pub group: Option<GroupSeparation>,
}

/// How well Ĥ picked out the high-entropy group ([`high_entropy_group`]) over a run.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct GroupSeparation {
    /// Clients in the group.
    pub size: usize,
    /// All clients.
    pub clients: usize,
    /// The true entropy above which a client is in the group.
    pub threshold: f64,
    /// AUC of Ĥ for the group in the first logged round.
    pub auc_first: RoundCorrelation,
    /// AUC in the last logged round.
    pub auc_last: RoundCorrelation,
    /// Mean AUC over the logged rounds.
    pub auc_mean: f64,
    /// Mean over the logged rounds of the share of each round's selections in the group.
    pub share_mean: f64,
}

/// One round of `entropy.csv`.
#[derive(Default)]
struct EntropyRound {
    truth: Vec<f64>,
    estimate: Vec<f64>,
    auc: Option<f64>,
    share: Option<f64>,
}

/// Spearman correlation of estimated vs true entropy in `entropy.csv` (HiCS-FL), with
/// a scatter of the last round (`entropy.png`), and the AUC and selection share of the
/// high-entropy group the file records per round. `None` when the run wrote no such file.
pub fn entropy(run_dir: &Path) -> Result<Option<EntropyCorrelation>> {
    let path = run_dir.join("entropy.csv");
    if !path.is_file() {
        return Ok(None);
    }
    let bad = |e: String| Error::Output {
        path: path.clone(),
        error: std::io::Error::new(std::io::ErrorKind::InvalidData, e),
    };
    let mut by_round: std::collections::BTreeMap<usize, EntropyRound> =
        std::collections::BTreeMap::new();
    for r in read_rows(&path)? {
        let num = |i: usize| r[i].parse::<f64>().map_err(|e| bad(e.to_string()));
        // The per-round columns are empty where undefined, absent in older files.
        let optional = |i: usize| match r.get(i).map(String::as_str) {
            None | Some("") => Ok(None),
            Some(_) => num(i).map(Some),
        };
        let e = by_round.entry(num(0)? as usize).or_default();
        e.truth.push(num(2)?);
        e.estimate.push(num(3)?);
        e.auc = optional(5)?;
        e.share = optional(6)?;
    }
    let (Some((&first, f)), Some((&last, l))) =
        (by_round.first_key_value(), by_round.last_key_value())
    else {
        return Ok(None);
    };
    let rho = |r: &EntropyRound| spearman(&r.truth, &r.estimate);
    let (rf, rl) = (rho(f), rho(l));
    let mean = by_round.values().map(rho).sum::<f64>() / by_round.len() as f64;
    let group = match (high_entropy_group(&f.truth), f.auc, l.auc) {
        (Some((members, threshold)), Some(af), Some(al)) => {
            let mean_of = |x: Vec<Option<f64>>| {
                let x: Vec<f64> = x.into_iter().flatten().collect();
                x.iter().sum::<f64>() / x.len().max(1) as f64
            };
            Some(GroupSeparation {
                size: members.iter().filter(|&&m| m).count(),
                clients: members.len(),
                threshold,
                auc_first: (first, af),
                auc_last: (last, al),
                auc_mean: mean_of(by_round.values().map(|r| r.auc).collect()),
                share_mean: mean_of(by_round.values().map(|r| r.share).collect()),
            })
        }
        _ => None,
    };
    if crate::plot::ensure_font().is_ok() {
        let pts: Vec<(f64, f64)> = l
            .truth
            .iter()
            .copied()
            .zip(l.estimate.iter().copied())
            .collect();
        crate::plot::scatter(
            &run_dir.join("entropy"),
            &format!("round {last}: estimated (y) vs true (x) label entropy, Spearman {rl:.3}"),
            &pts,
            &vec![0; pts.len()],
        )?;
    }
    Ok(Some(EntropyCorrelation {
        first: (first, rf),
        last: (last, rl),
        mean,
        group,
    }))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn entropy_report_gives_first_last_and_mean_correlation() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(
            dir.path().join("entropy.csv"),
            "round,client,true_entropy,estimated_entropy\n\
             10,0,0.0,0.1\n10,1,1.0,0.5\n10,2,2.0,0.9\n\
             11,0,0.0,0.9\n11,1,1.0,0.5\n11,2,2.0,0.4\n\
             12,0,0.0,0.1\n12,1,1.0,0.5\n12,2,2.0,0.9\n",
        )
        .unwrap();
        let c = entropy(dir.path()).unwrap().unwrap();
        assert_eq!(c.first, (10, 1.0));
        assert_eq!(c.last, (12, 1.0));
        // ρ = 1, −1, 1.
        assert!((c.mean - 1.0 / 3.0).abs() < 1e-12, "{}", c.mean);
        // A file without the group columns has no group report.
        assert_eq!(c.group, None);
        assert!(entropy(&dir.path().join("none")).unwrap().is_none());
    }

    /// The group columns: AUC 1 then 0.5, shares 1 then (none selected) skipped; the
    /// group is client 2 (entropies 0, 0.2, 2: groups {0, 0.2} and {2}, means 0.1 and 2,
    /// midpoint 1.05).
    #[test]
    fn entropy_report_summarises_the_high_entropy_group() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(
            dir.path().join("entropy.csv"),
            "round,client,true_entropy,estimated_entropy,selected,auc_high,share_high\n\
             5,0,0.0,0.1,0,1.0,1.0\n5,1,0.2,0.5,0,1.0,1.0\n5,2,2.0,0.9,1,1.0,1.0\n\
             6,0,0.0,0.9,0,0.5,\n6,1,0.2,0.5,0,0.5,\n6,2,2.0,0.5,0,0.5,\n",
        )
        .unwrap();
        let g = entropy(dir.path()).unwrap().unwrap().group.unwrap();
        assert_eq!((g.size, g.clients), (1, 3));
        assert!((g.threshold - 1.05).abs() < 1e-12);
        assert_eq!((g.auc_first, g.auc_last), ((5, 1.0), (6, 0.5)));
        assert!((g.auc_mean - 0.75).abs() < 1e-12);
        assert_eq!(g.share_mean, 1.0);
    }

    #[test]
    fn silhouette_matches_hand_computation() {
        // Two tight pairs far apart: a = 1, b ≈ 10 for every point → s = 1 − 1/b-ish.
        let pts = vec![vec![0.0], vec![1.0], vec![10.0], vec![11.0]];
        let s = silhouette(&pts, &[0, 0, 1, 1]);
        // Point 0: a = 1, b = (10 + 11)/2 = 10.5 → 1 − 1/10.5; point 1: a = 1, b = 9.5.
        let expected =
            ((1.0 - 1.0 / 10.5) + (1.0 - 1.0 / 9.5) + (1.0 - 1.0 / 9.5) + (1.0 - 1.0 / 10.5)) / 4.0;
        assert!((s - expected).abs() < 1e-12, "{s} vs {expected}");
        // Mixed labels score negative.
        assert!(silhouette(&pts, &[0, 1, 0, 1]) < 0.0);
    }

    #[test]
    fn pca_finds_the_main_direction() {
        let pts: Vec<Vec<f64>> = (0..10)
            .map(|i| vec![i as f64, 2.0 * i as f64, 0.01 * (i % 2) as f64])
            .collect();
        let p = pca_2d(&pts);
        // All variance lies along (1, 2, 0): the first component is monotone in i.
        let first: Vec<f64> = p.iter().map(|x| x.0).collect();
        let increasing = first.windows(2).all(|w| w[1] > w[0]);
        let decreasing = first.windows(2).all(|w| w[1] < w[0]);
        assert!(increasing || decreasing, "{first:?}");
        assert!(p.iter().all(|x| x.1.abs() < 0.1));
    }
}
