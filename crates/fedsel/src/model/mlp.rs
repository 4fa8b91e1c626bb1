//! The FedCor MLP for Fashion-MNIST: 784-64-30-10.
//!
//! As in the FedCor code, dropout comes before each hidden ReLU:
//! Linear → Dropout → ReLU → Linear → Dropout → ReLU → Linear.
//!
//! Training does not differentiate the burn forward pass: at batch 64 burn's
//! autodiff spends more time recording and replaying its graph of small ops than
//! in the products themselves, and the FedCor round is 100 such steps. The loss and
//! gradient are instead computed by hand on plain slices ([`Mlp::fused`]), five
//! `gemm` calls and a few elementwise passes; the burn pass is the reference they
//! are tested against, and serves evaluation.

use crate::model::matmul::{View, gemm_into};
use burn::tensor::Tensor;
use burn::tensor::activation::relu;

use super::{
    Architecture, Batch, Dropout, FusedLogits, LossGradient, ParamLayout, ParamSpec, dense,
    dense_rows_into, fit,
};
use crate::data::Dataset;

/// Two hidden layers of 64 and 30 units.
#[derive(Debug, Clone)]
pub struct Mlp {
    /// Input features (784 for 28×28 images).
    pub inputs: usize,
    /// Classes.
    pub classes: usize,
    /// Dropout probability (FedCor: 0.5).
    pub dropout: f64,
}

const H1: usize = 64;
const H2: usize = 30;

impl Architecture for Mlp {
    fn name(&self) -> &'static str {
        "mlp"
    }

    fn params(&self) -> Vec<ParamSpec> {
        [
            ParamSpec::linear("fc1", self.inputs, H1),
            ParamSpec::linear("fc2", H1, H2),
            ParamSpec::linear("out", H2, self.classes),
        ]
        .concat()
    }

    fn forward(
        &self,
        p: &[Tensor<1>],
        x: Batch,
        mut dropout: Option<&mut Dropout<'_>>,
    ) -> Tensor<2> {
        let layer = |i: usize, fan_in: usize, fan_out: usize, x: Tensor<2>| {
            x.matmul(p[i].clone().reshape([fan_in, fan_out])) + p[i + 1].clone().unsqueeze::<2>()
        };
        let mut drop = |h: Tensor<2>| match dropout.as_mut() {
            Some(d) => d.apply(h),
            None => h,
        };
        let h = drop(layer(0, self.inputs, H1, dense(x)));
        let h = drop(layer(2, H1, H2, relu(h)));
        layer(4, H2, self.classes, relu(h))
    }

    /// Dropout comes from the client's stream through [`LossGradient::train_loss_and_gradient`],
    /// so the hand-derived gradient is the exact gradient of the training pass.
    fn loss_gradient(&self) -> Option<&dyn LossGradient> {
        Some(self)
    }

    fn exact_logits(&self) -> Option<&dyn FusedLogits> {
        Some(self)
    }
}

/// Burn's forward pass on plain slices, to the bit: each product is the `gemm` call
/// burn-flex makes for it, on the same shapes and strides. burn lets `gemm` spread a
/// product of 192³ multiply-adds or more over its threads, which splits the output and
/// leaves each entry's sum over k in the same order; here every product runs on the
/// calling thread, and evaluation runs batches side by side instead.
impl FusedLogits for Mlp {
    fn logits(&self, params: &[f32], x: &[f32], batch: usize) -> Vec<f32> {
        let [w1, b1, w2, b2, w3, b3] = self.parts(params);
        let (n, c) = (self.inputs, self.classes);
        assert_eq!(x.len(), batch * n, "input size");
        let mut h1 = vec![0.0; batch * H1];
        matmul(&mut h1, View::new(x, batch, n), View::new(w1, n, H1));
        bias_relu(&mut h1, b1);
        let mut h2 = vec![0.0; batch * H2];
        matmul(&mut h2, View::new(&h1, batch, H1), View::new(w2, H1, H2));
        bias_relu(&mut h2, b2);
        let mut z = vec![0.0; batch * c];
        matmul(&mut z, View::new(&h2, batch, H2), View::new(w3, H2, c));
        for row in z.chunks_exact_mut(c) {
            row.iter_mut().zip(b3).for_each(|(v, b)| *v += b);
        }
        z
    }
}

/// `a = relu(a + bias)` row by row, with burn-flex's ReLU: NaN passes, and everything
/// else not above zero becomes +0.
fn bias_relu(a: &mut [f32], bias: &[f32]) {
    for row in a.chunks_exact_mut(bias.len()) {
        for (v, b) in row.iter_mut().zip(bias) {
            let z = *v + b;
            *v = if z.is_nan() || z > 0.0 { z } else { 0.0 };
        }
    }
}

/// `out = a·b`, `out` row-major `a.rows × b.cols`.
///
/// Single-threaded: the engine already trains the round's clients in parallel, and a
/// product's bits then cannot depend on the thread count.
fn matmul(out: &mut [f32], a: View<'_>, b: View<'_>) {
    assert_eq!(out.len(), a.rows * b.cols, "output size");
    gemm_into(out, b.cols, a, b, false);
}

/// `out = a·b` for the two products that carry nearly all of a training step's work
/// (`x·W₁` and `xᵀ·δa₁`), cut into pieces that a thread with nothing left to do can take
/// (rayon runs them in place otherwise): the round's 5 clients on 2 cores leave one core
/// idle while the other trains the fifth, a sixth of the training phase.
///
/// The pieces are fixed by the shape, so the bits do not depend on the thread count,
/// and each piece's `gemm` call sums over k in the same blocks as the whole product's:
/// up to k = 512 in one block either way ([`super::matmul::matmul`]'s pieces, none of
/// them a tiny product with its own kernel), and beyond in blocks that depend on whether
/// both sides of the product are at most 64, so the rows are halved only where both
/// halves stay on the whole's side of that rule (pinned by a test).
fn matmul_shared(out: &mut [f32], a: View<'_>, b: View<'_>) {
    assert_eq!(out.len(), a.rows * b.cols, "output size");
    let (m, k) = (a.rows, a.cols);
    if k <= 512 {
        super::matmul::matmul(out, a, b, false);
        return;
    }
    let h = m / 2;
    let same_side = if m <= 64 { h >= 8 } else { h > 64 };
    if !same_side {
        matmul(out, a, b);
        return;
    }
    let (top, bottom) = out.split_at_mut(h * b.cols);
    let upper = View { rows: h, ..a };
    let lower = View {
        data: &a.data[h * a.rs..],
        rows: m - h,
        ..a
    };
    rayon::join(|| matmul(top, upper, b), || matmul(bottom, lower, b));
}

/// `Σ_r m[r, ·]` of row-major `m`, row by row in order.
fn column_sums(out: &mut [f32], m: &[f32]) {
    out.fill(0.0);
    for row in m.chunks_exact(out.len()) {
        for (acc, v) in out.iter_mut().zip(row) {
            *acc += v;
        }
    }
}

/// `a = (a + bias) ⊙ mask` row by row, then ReLU into `r`; `a` keeps the pre-ReLU
/// values (the backward pass needs their signs) and `r` is the activation.
///
/// The mask is matched once, not per entry, so that each arm is one loop the compiler
/// vectorises.
fn bias_dropout_relu(a: &mut [f32], bias: &[f32], mask: Option<&[f32]>, r: &mut Vec<f32>) {
    match mask {
        Some(mask) => {
            for (row, m) in a
                .chunks_exact_mut(bias.len())
                .zip(mask.chunks_exact(bias.len()))
            {
                for ((v, b), m) in row.iter_mut().zip(bias).zip(m) {
                    *v = (*v + b) * m;
                }
            }
        }
        None => {
            for row in a.chunks_exact_mut(bias.len()) {
                row.iter_mut().zip(bias).for_each(|(v, b)| *v += b);
            }
        }
    }
    r.clear();
    r.extend(a.iter().map(|&v| v.max(0.0)));
}

/// The gradient at a layer's pre-activation from the gradient at its activation:
/// ReLU passes it where the unit was positive, then dropout scales it by the mask
/// (matched once, as in [`bias_dropout_relu`]; without one the gradient passes as it is,
/// the bits of its product with 1).
fn relu_dropout_back(d: &mut [f32], pre: &[f32], mask: Option<&[f32]>) {
    match mask {
        Some(mask) => {
            for ((g, &p), &m) in d.iter_mut().zip(pre).zip(mask) {
                // The product taken either way, so that the choice is a select the
                // compiler vectorises, not a branch per entry.
                let scaled = *g * m;
                *g = if p > 0.0 { scaled } else { 0.0 };
            }
        }
        None => {
            for (g, &p) in d.iter_mut().zip(pre) {
                *g = if p > 0.0 { *g } else { 0.0 };
            }
        }
    }
}

impl Mlp {
    /// The six parameter blocks of the flat `params`, in the order of [`Mlp::params`].
    fn parts<'a>(&self, params: &'a [f32]) -> [&'a [f32]; 6] {
        let (n, c) = (self.inputs, self.classes);
        let sizes = [n * H1, H1, H1 * H2, H2, H2 * c, c];
        assert_eq!(params.len(), sizes.iter().sum::<usize>(), "parameter count");
        let mut rest = params;
        sizes.map(|len| {
            let (head, tail) = rest.split_at(len);
            rest = tail;
            head
        })
    }

    /// Mean cross-entropy of `labels` and its gradient in the layout of `params`, for
    /// the row-major `batch × inputs` matrix `x`, with the dropout multipliers of the
    /// two hidden layers when training.
    ///
    /// Forward, with `m₁`, `m₂` the dropout masks:
    ///
    /// ```text
    /// a₁ = (x W₁ + b₁) ⊙ m₁   r₁ = relu(a₁)   a₂ = (r₁ W₂ + b₂) ⊙ m₂   r₂ = relu(a₂)
    /// z = r₂ W₃ + b₃          loss = mean_b (logsumexp(z_b) − z_b[y_b])
    /// ```
    ///
    /// Backward: `δz = (softmax(z) − onehot(y)) / B`, `∂W₃ = r₂ᵀ δz`, `∂b₃ = Σ_b δz`,
    /// `δa₂ = (δz W₃ᵀ) ⊙ [a₂ > 0] ⊙ m₂`, `∂W₂ = r₁ᵀ δa₂`, `∂b₂ = Σ_b δa₂`, and the same
    /// again one layer down with `δa₁ = (δa₂ W₂ᵀ) ⊙ [a₁ > 0] ⊙ m₁`.
    ///
    /// The intermediate matrices live in `s`, a thread's buffers kept from step to step:
    /// each product overwrites its output, so they are sized but never cleared.
    fn fused(
        &self,
        params: &[f32],
        x: &[f32],
        labels: &[u32],
        masks: Option<(&[f32], &[f32])>,
        s: &mut Activations,
    ) -> (f32, Vec<f32>) {
        let layout = ParamLayout::of(self);
        assert_eq!(params.len(), layout.total, "parameter count");
        let (n, c) = (self.inputs, self.classes);
        let b = labels.len();
        assert!(b > 0, "an empty batch has no mean loss");
        assert_eq!(x.len(), b * n, "input size");
        let p = |i: usize| &params[layout.range(i)];
        let (m1, m2) = masks.unzip();

        let Activations {
            a1,
            r1,
            a2,
            r2,
            dz,
            d2,
            d1,
        } = s;
        fit(a1, b * H1);
        matmul_shared(a1, View::new(x, b, n), View::new(p(0), n, H1));
        bias_dropout_relu(a1, p(1), m1, r1);
        fit(a2, b * H2);
        matmul(a2, View::new(r1, b, H1), View::new(p(2), H1, H2));
        bias_dropout_relu(a2, p(3), m2, r2);
        fit(dz, b * c);
        matmul(dz, View::new(r2, b, H2), View::new(p(4), H2, c));

        let scale = 1.0 / b as f32;
        let mut loss = 0.0f64;
        for (row, &y) in dz.chunks_exact_mut(c).zip(labels) {
            let y = y as usize;
            assert!(y < c, "label {y} outside the {c} classes");
            for (v, bias) in row.iter_mut().zip(p(5)) {
                *v += bias;
            }
            let max = row.iter().copied().fold(f32::NEG_INFINITY, f32::max);
            let sum: f32 = row.iter().map(|z| (z - max).exp()).sum();
            loss += f64::from(max + sum.ln() - row[y]);
            for z in row.iter_mut() {
                *z = (*z - max).exp() / sum * scale;
            }
            row[y] -= scale;
        }

        let mut grad = vec![0.0; layout.total];
        let [g1, gb1, g2, gb2, g3, gb3] = split(&mut grad, &layout);
        matmul(g3, View::new(r2, b, H2).t(), View::new(dz, b, c));
        column_sums(gb3, dz);
        fit(d2, b * H2);
        matmul(d2, View::new(dz, b, c), View::new(p(4), H2, c).t());
        relu_dropout_back(d2, a2, m2);
        matmul(g2, View::new(r1, b, H1).t(), View::new(d2, b, H2));
        column_sums(gb2, d2);
        fit(d1, b * H1);
        matmul(d1, View::new(d2, b, H2), View::new(p(2), H1, H2).t());
        relu_dropout_back(d1, a1, m1);
        matmul_shared(g1, View::new(x, b, n).t(), View::new(d1, b, H1));
        column_sums(gb1, d1);
        ((loss / b as f64) as f32, grad)
    }

    /// [`Mlp::fused`] on the batch `idx` of `data`, in this thread's [`Scratch`].
    fn step(
        &self,
        params: &[f32],
        data: &Dataset,
        idx: &[usize],
        dropout: Option<&mut Dropout<'_>>,
    ) -> (f32, Vec<f32>) {
        // Taken out and put back rather than borrowed: while a product waits for its
        // stolen half, rayon may run another client's step on this thread, which then
        // finds the slot empty and works in buffers of its own.
        assert_eq!(data.inputs.row_len(), self.inputs, "input width");
        let mut s = SCRATCH.take();
        dense_rows_into(data, idx, &mut s.x, &mut s.labels);
        let b = idx.len();
        let masks = dropout.and_then(|d| {
            if d.p <= 0.0 {
                None
            } else {
                Some((d.mask(b * H1), d.mask(b * H2)))
            }
        });
        let masks = masks.as_ref().map(|(m1, m2)| (&m1[..], &m2[..]));
        let out = self.fused(params, &s.x, &s.labels, masks, &mut s.act);
        SCRATCH.set(s);
        out
    }
}

/// The matrices of one training step between the input and the gradient
/// ([`Mlp::fused`]'s names).
#[derive(Default)]
struct Activations {
    a1: Vec<f32>,
    r1: Vec<f32>,
    a2: Vec<f32>,
    r2: Vec<f32>,
    dz: Vec<f32>,
    d2: Vec<f32>,
    d1: Vec<f32>,
}

/// A thread's buffers for [`Mlp::step`]: the gathered batch and the step's
/// [`Activations`]. Kept from step to step, they spare a round's 100 steps their
/// allocations, the first touches of fresh pages and the zeroing of outputs that the
/// products overwrite.
#[derive(Default)]
struct Scratch {
    x: Vec<f32>,
    labels: Vec<u32>,
    act: Activations,
}

thread_local! {
    static SCRATCH: std::cell::Cell<Scratch> = std::cell::Cell::new(Scratch::default());
}

/// The six parameter blocks of `grad`, in the order of [`Mlp::params`].
fn split<'a>(grad: &'a mut [f32], layout: &ParamLayout) -> [&'a mut [f32]; 6] {
    let mut rest = grad;
    let mut parts = Vec::with_capacity(6);
    for s in &layout.specs {
        let (head, tail) = rest.split_at_mut(s.numel());
        parts.push(head);
        rest = tail;
    }
    parts
        .try_into()
        .unwrap_or_else(|_| unreachable!("the MLP has six parameters"))
}

impl LossGradient for Mlp {
    fn loss_and_gradient(&self, params: &[f32], data: &Dataset, idx: &[usize]) -> (f32, Vec<f32>) {
        self.step(params, data, idx, None)
    }

    /// Draws the two masks in the order and shape of the burn pass's
    /// [`Dropout::apply`] calls, so the client's stream advances alike on both paths.
    fn train_loss_and_gradient(
        &self,
        params: &[f32],
        data: &Dataset,
        idx: &[usize],
        dropout: &mut Dropout<'_>,
    ) -> (f32, Vec<f32>) {
        self.step(params, data, idx, Some(dropout))
    }
}

#[cfg(test)]
mod tests {
    use burn::tensor::Device;

    use super::*;
    use crate::bench::random_dataset;
    use crate::data::Inputs;
    use crate::model::{batch, cross_entropy};
    use crate::rng::{Purpose, Rng, stream};

    /// Loss and flat gradient by burn's autodiff through [`Mlp::forward`], with dropout
    /// drawn from `rng` when `p > 0`.
    fn autodiff(
        net: &Mlp,
        params: &[f32],
        data: &Dataset,
        idx: &[usize],
        p: f64,
        rng: &mut Rng,
    ) -> (f32, Vec<f32>) {
        let device = Device::flex();
        let layout = ParamLayout::of(net);
        let ad: Vec<Tensor<1>> = layout
            .to_tensors(params, &device)
            .into_iter()
            .map(|p| p.autodiff().require_grad())
            .collect();
        let (x, y) = batch(data, idx, &device);
        let mut drop = Dropout { p, rng };
        let loss = cross_entropy(net.forward(&ad, x, (p > 0.0).then_some(&mut drop)), y);
        let grads = loss.backward();
        let g = ad.iter().map(|p| p.grad(&grads).unwrap()).collect();
        (loss.inner().into_scalar::<f32>(), layout.to_flat(g))
    }

    fn relative_error(a: &[f32], b: &[f32]) -> f64 {
        let diff: f64 = a.iter().zip(b).map(|(x, y)| f64::from(x - y).powi(2)).sum();
        let norm: f64 = b.iter().map(|y| f64::from(*y).powi(2)).sum();
        (diff / norm).sqrt()
    }

    /// Every parameter's fused gradient is within 1e-4 (relative, in norm) of autodiff's,
    /// the losses agree to 1e-5, and both paths leave the stream in the same state.
    fn check(net: &Mlp, batch: usize, p: f64, seed: u64) {
        let data = random_dataset(&[net.inputs], None, 2 * batch, net.classes);
        let layout = ParamLayout::of(net);
        let params = layout.init(seed);
        let idx: Vec<usize> = (0..2 * batch).step_by(2).collect();
        let mut rng = stream(seed, Purpose::Training, 0, 0);
        let mut same = rng.clone();
        let (loss, grad) =
            net.train_loss_and_gradient(&params, &data, &idx, &mut Dropout { p, rng: &mut rng });
        let (want_loss, want) = autodiff(net, &params, &data, &idx, p, &mut same);
        assert_eq!(rng, same, "both paths draw the same masks");
        assert!(
            (loss - want_loss).abs() <= 1e-5 * want_loss.abs(),
            "{loss} vs {want_loss}"
        );
        for (i, spec) in layout.specs.iter().enumerate() {
            let r = layout.range(i);
            assert!(want[r.clone()].iter().any(|&g| g != 0.0), "{}", spec.name);
            let err = relative_error(&grad[r.clone()], &want[r]);
            assert!(err < 1e-4, "{}: relative error {err:e}", spec.name);
        }
    }

    /// The exact logits are burn's forward pass to the bit, at batch sizes on both sides
    /// of gemm's small-matrix path (64 rows) and of burn's threaded products (192³
    /// multiply-adds, here from 141 rows on).
    #[test]
    fn the_exact_logits_are_burns_to_the_bit() {
        let net = Mlp {
            inputs: 784,
            classes: 10,
            dropout: 0.5,
        };
        let layout = ParamLayout::of(&net);
        let params = layout.init(7);
        let device = Device::flex();
        let p = layout.to_tensors(&params, &device);
        let data = random_dataset(&[784], None, 1000, 10);
        let exact = net.exact_logits().unwrap();
        for b in [1, 7, 64, 65, 120, 141, 1000] {
            let idx: Vec<usize> = (0..b).map(|i| (i * 7) % 1000).collect();
            let want: Vec<f32> = net
                .forward(&p, batch(&data, &idx, &device).0, None)
                .into_data()
                .try_into_vec()
                .unwrap();
            let got = exact.logits(&params, &crate::model::dense_rows(&data, &idx).0, b);
            let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
            assert_eq!(bits(&got), bits(&want), "batch {b}");
        }
    }

    /// The dropout passes by hand: the bias added then the mask applied, ReLU after;
    /// backward, the gradient kept and scaled only where the pre-activation is positive
    /// (zero, negative and NaN give +0), and without a mask passed as it is.
    #[test]
    fn the_dropout_passes_give_the_hand_computed_values() {
        let mut a = vec![1.0, -3.0, 0.5, 2.0];
        // A kept buffer from a larger step: its length and values must not show through.
        let mut r = vec![9.0; 7];
        bias_dropout_relu(&mut a, &[0.5, 1.0], Some(&[2.0, 2.0, 0.0, 2.0]), &mut r);
        assert_eq!(a, [3.0, -4.0, 0.0, 6.0]);
        assert_eq!(r, [3.0, 0.0, 0.0, 6.0]);
        let pre = [1.0, -1.0, 0.0, f32::NAN, 3.0];
        let mut d = vec![2.0, 3.0, 4.0, 5.0, -1.5];
        relu_dropout_back(&mut d, &pre, Some(&[2.0, 2.0, 2.0, 2.0, 0.0]));
        let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
        assert_eq!(bits(&d), bits(&[4.0, 0.0, 0.0, 0.0, -0.0]));
        let mut d = vec![2.0, 3.0, 4.0, 5.0, -1.5];
        relu_dropout_back(&mut d, &pre, None);
        assert_eq!(d, [2.0, 0.0, 0.0, 0.0, -1.5]);
    }

    /// The shared products are the single `gemm` call's, bit for bit, for the first
    /// layer's product and its weight gradient at batch sizes on both sides of every
    /// rule `matmul_shared` follows.
    #[test]
    fn the_shared_products_are_the_whole_products_to_the_bit() {
        let data = random_dataset(&[784], None, 700, 10);
        let Inputs::Dense { values, .. } = &data.inputs else {
            unreachable!()
        };
        let w: Vec<f32> = values[..784 * H1].iter().map(|v| v - 0.5).collect();
        let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
        for b in [1, 7, 15, 16, 17, 32, 63, 64, 65, 100, 129, 130, 200, 600] {
            let x = &values[..b * 784];
            let d: Vec<f32> = values[b * 784..b * 784 + b * H1].to_vec();
            for (a, w) in [
                (View::new(x, b, 784), View::new(&w, 784, H1)),
                (View::new(x, b, 784).t(), View::new(&d, b, H1)),
            ] {
                let mut whole = vec![0.0; a.rows * w.cols];
                matmul(&mut whole, a, w);
                let mut shared = vec![1.0; a.rows * w.cols];
                matmul_shared(&mut shared, a, w);
                assert_eq!(bits(&shared), bits(&whole), "batch {b}, {} rows", a.rows);
            }
        }
    }

    /// A thread's kept buffers change no step: steps of 64, 7 and again 64 examples,
    /// with and without dropout, after others on the same thread, give the bits of each
    /// step run first on a thread of its own.
    #[test]
    fn the_kept_buffers_give_a_fresh_threads_bits() {
        let net = Mlp {
            inputs: 784,
            classes: 10,
            dropout: 0.5,
        };
        let data = random_dataset(&[1, 28, 28], None, 200, 10);
        let params = ParamLayout::of(&net).init(3);
        let step = |idx: &[usize], p: f64| {
            let mut rng = stream(3, Purpose::Training, 0, 0);
            let (loss, grad) =
                net.train_loss_and_gradient(&params, &data, idx, &mut Dropout { p, rng: &mut rng });
            (
                loss.to_bits(),
                grad.iter().map(|g| g.to_bits()).collect::<Vec<_>>(),
            )
        };
        let cases: Vec<(Vec<usize>, f64)> = vec![
            ((0..64).collect(), 0.5),
            ((100..107).collect(), 0.0),
            ((100..107).collect(), 0.5),
            ((130..194).rev().collect(), 0.0),
        ];
        let fresh: Vec<_> = cases
            .iter()
            .map(|(idx, p)| std::thread::scope(|s| s.spawn(|| step(idx, *p)).join().unwrap()))
            .collect();
        let kept: Vec<_> = cases.iter().map(|(idx, p)| step(idx, *p)).collect();
        assert_eq!(kept, fresh);
    }

    #[test]
    fn the_fused_gradient_matches_autodiff_with_and_without_dropout() {
        let net = Mlp {
            inputs: 784,
            classes: 10,
            dropout: 0.5,
        };
        check(&net, 64, 0.0, 1);
        check(&net, 64, 0.5, 2);
        check(&net, 7, 0.5, 3);
        let small = Mlp {
            inputs: 5,
            classes: 3,
            dropout: 0.2,
        };
        check(&small, 9, 0.2, 4);
    }
}
