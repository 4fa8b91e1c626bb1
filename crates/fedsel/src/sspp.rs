//! The secure scalar product protocol of FedGS App. D (Du & Zhan 2002), with
//! the clients' messages relayed through the server.
//!
//! FedGS Alg. 2 lets the server generate the commodity randomness (R_a, r_a,
//! R_b, r_b) and also relay Â = A + R_a, from which that server could recover
//! A = Â − R_a. We keep the paper's message flow but give the commodity role to
//! a separate party, Merlin in Du & Zhan's original protocol, whose draws the
//! relaying server never sees. The server then sees only Â, B̂ (features
//! masked by randomness unknown to it), u (masked by v₂ and r_b), and v₁, v₂,
//! whose sum is the product it is meant to learn.

use rand::Rng as _;
use rand_distr::{Distribution, Normal};

use crate::rng::Rng;

/// Everything the relaying server sees during one run of the protocol.
#[derive(Debug, Clone, PartialEq)]
pub struct ServerView {
    /// Â = A + R_a (Alg. 2 line 3), relayed to B.
    pub a_hat: Vec<f64>,
    /// B̂ = B + R_b (line 3), relayed to A.
    pub b_hat: Vec<f64>,
    /// u = Â·B + r_b − v₂ (line 5), relayed to A.
    pub u: f64,
    /// v₂ (line 5).
    pub v2: f64,
    /// v₁ = u − R_a·B̂ + r_a = A·B − v₂ (line 7).
    pub v1: f64,
}

/// Messages one protocol run sends to or from a client: commodity pairs to A and
/// B, Â and B̂ up and down, u and v₂ up, u down, v₁ up.
pub const MESSAGES_PER_PRODUCT: u64 = 2 + 4 + 2 + 1 + 1;

/// Scale of the commodity masks relative to the features; large masks hide the
/// features' magnitude as well as their direction.
const MASK_STD: f64 = 1e3;

/// Computes A·B by the protocol. `commodity` draws Merlin's randomness, `client_b`
/// the random v₂ of client B. Returns the product and what the server saw.
pub fn scalar_product(
    a: &[f64],
    b: &[f64],
    commodity: &mut Rng,
    client_b: &mut Rng,
) -> (f64, ServerView) {
    assert_eq!(a.len(), b.len(), "feature vectors differ in length");
    let mask = Normal::new(0.0, MASK_STD).expect("valid normal");
    // Line 1 (by the commodity party): R_a, R_b and r_a + r_b = R_a·R_b.
    let ra_vec: Vec<f64> = a.iter().map(|_| mask.sample(commodity)).collect();
    let rb_vec: Vec<f64> = b.iter().map(|_| mask.sample(commodity)).collect();
    let r_a: f64 = mask.sample(commodity);
    let r_b = dot(&ra_vec, &rb_vec) - r_a;
    // Line 3: the clients mask their features.
    let a_hat: Vec<f64> = a.iter().zip(&ra_vec).map(|(x, r)| x + r).collect();
    let b_hat: Vec<f64> = b.iter().zip(&rb_vec).map(|(x, r)| x + r).collect();
    // Line 5: client B.
    let v2: f64 = client_b.random_range(-MASK_STD..MASK_STD);
    let u = dot(&a_hat, b) + r_b - v2;
    // Line 7: client A.
    let v1 = u - dot(&ra_vec, &b_hat) + r_a;
    // Line 8: the server.
    (
        v1 + v2,
        ServerView {
            a_hat,
            b_hat,
            u,
            v2,
            v1,
        },
    )
}

fn dot(x: &[f64], y: &[f64]) -> f64 {
    x.iter().zip(y).map(|(a, b)| a * b).sum()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::rng::{Purpose, stream};

    fn cosine(x: &[f64], y: &[f64]) -> f64 {
        dot(x, y) / (dot(x, x).sqrt() * dot(y, y).sqrt())
    }

    #[test]
    fn the_protocol_computes_the_plain_dot_product() {
        let a = [0.5, 0.0, 0.25, 0.25];
        let b = [0.1, 0.6, 0.0, 0.3];
        for i in 0..20 {
            let (p, _) = scalar_product(
                &a,
                &b,
                &mut stream(1, Purpose::Strategy, i, 0),
                &mut stream(1, Purpose::Strategy, i, 1),
            );
            assert!((p - dot(&a, &b)).abs() < 1e-9, "{p} vs {}", dot(&a, &b));
        }
    }

    /// No relayed message reveals a feature vector: the masked vectors are
    /// uncorrelated with the features (mean |cosine| over many runs is small, and
    /// no single run comes near ±1), and none equals or scales a feature vector.
    #[test]
    fn no_relayed_message_reveals_a_feature_vector() {
        let a: Vec<f64> = (0..10).map(|j| if j < 2 { 0.5 } else { 0.0 }).collect();
        let b: Vec<f64> = (0..10).map(|j| (j as f64 + 1.0) / 55.0).collect();
        let mut sum_abs = 0.0;
        let runs = 200;
        for i in 0..runs {
            let (_, view) = scalar_product(
                &a,
                &b,
                &mut stream(2, Purpose::Strategy, i, 0),
                &mut stream(2, Purpose::Strategy, i, 1),
            );
            let ca = cosine(&view.a_hat, &a);
            let cb = cosine(&view.b_hat, &b);
            assert!(ca.abs() < 0.99 && cb.abs() < 0.99, "run {i}: {ca} {cb}");
            sum_abs += ca.abs() + cb.abs();
            for (hat, x) in [(&view.a_hat, &a), (&view.b_hat, &b)] {
                let err: f64 = hat.iter().zip(x).map(|(h, x)| (h - x).abs()).sum();
                assert!(err > 1.0, "a relayed vector is close to a feature vector");
            }
            // u alone does not give A·B without r_b, which only Merlin and B know.
            assert!((view.u + view.v2 - dot(&a, &b)).abs() > 1e-3);
        }
        // For a random 10-dim direction E|cos| ≈ 0.25; features would give 1.
        let mean = sum_abs / (2.0 * runs as f64);
        assert!(
            mean < 0.35,
            "mean |cosine| of masked vs plain features: {mean}"
        );
    }
}
