//! The Fashion-MNIST CNN of the HiCS-FL authors' code (`cnn.py`, `FMNIST_CNN`), which
//! their FMNIST runs use instead of the paper's two 5×5 conv layers (App. 6.1):
//!
//! - conv3×3(1→32, pad 1, no bias) → PReLU → BatchNorm (28×28)
//! - conv3×3(32→32, pad 1) → PReLU → BatchNorm → max-pool 2 (14×14)
//! - conv3×3(32→64, pad 1) → PReLU → BatchNorm → max-pool 2 (7×7)
//! - FC 3136→64 → ReLU → FC 64→classes
//!
//! PReLU comes before BatchNorm, as in `cnn.py`, and each PReLU has one slope (PyTorch's
//! `nn.PReLU()`, 0.25 at first). The server initialises every conv and linear weight with
//! Xavier-uniform at ReLU gain √2 (`server_hics.py`); biases keep PyTorch's default
//! U(±1/√fan_in), BatchNorm starts at scale 1, shift 0.
//!
//! BatchNorm's running mean and variance are part of the state dict the clients send and
//! the server averages, so they sit in the flat vector as non-trainable entries (after each
//! layer's scale and shift, before the dense layers, so the output layer's weight and bias
//! stay last). Training mode normalises by the batch's mean and biased variance and moves
//! the running statistics by momentum 0.1 towards the batch mean and the *unbiased*
//! variance, as PyTorch does; eval mode normalises by the running statistics.
//!
//! Training and evaluation run [`super::cnn_fused`]'s hand-derived passes, BatchNorm's
//! batch statistics included ([`super::cnn_fused`]'s `norm`); the burn pass below is
//! the reference they are tested against, and the path on a GPU.

use burn::tensor::Tensor;
use burn::tensor::activation::relu;
use burn::tensor::module::{conv2d, max_pool2d};
use burn::tensor::ops::{ConvOptions, MaxPoolOptions};

use super::cnn_fused::{Mode, Net, Stage};
use super::{
    Architecture, Batch, Dropout, FusedLogits, Init, LossGradient, ParamSpec, dense, dense_rows,
};
use crate::data::Dataset;

/// PyTorch's BatchNorm momentum: the weight of the current batch in the running statistics.
pub const BN_MOMENTUM: f64 = 0.1;
/// PyTorch's BatchNorm ε.
pub const BN_EPS: f64 = 1e-5;

/// Three conv blocks with PReLU and BatchNorm, two dense layers.
#[derive(Debug, Clone)]
pub struct CnnHicsCode {
    /// Classes.
    pub classes: usize,
}

const FEATURES: usize = 64 * 7 * 7;
const HIDDEN: usize = 64;
/// ReLU gain of `nn.init.calculate_gain('relu')`.
const GAIN: f32 = std::f32::consts::SQRT_2;

/// One conv block: (input channels, output channels, has a conv bias, max-pools).
const BLOCKS: [(usize, usize, bool, bool); 3] = [
    (1, 32, false, false),
    (32, 32, true, true),
    (32, 64, true, true),
];

/// A 3×3 convolution with padding 1, as [`BLOCKS`] has them.
const fn conv3(cout: usize, bias: bool) -> Stage {
    Stage::Conv {
        cout,
        k: 3,
        pad: 1,
        bias,
    }
}

/// [`BLOCKS`] as [`super::cnn_fused`]'s stages.
const STAGES: [Stage; 11] = [
    conv3(32, false),
    Stage::Prelu,
    Stage::BatchNorm,
    conv3(32, true),
    Stage::Prelu,
    Stage::BatchNorm,
    Stage::Pool,
    conv3(64, true),
    Stage::Prelu,
    Stage::BatchNorm,
    Stage::Pool,
];

/// The new running statistics of one BatchNorm layer in training mode.
pub struct Running {
    /// Running mean.
    pub mean: Tensor<1>,
    /// Running variance.
    pub var: Tensor<1>,
}

/// BatchNorm over the channels of `x` (`[batch, channels, h, w]`) with scale `gamma` and
/// shift `beta`. In training mode (`train`) it normalises by the batch statistics and
/// returns the updated running statistics (PyTorch: running ← (1 − 0.1)·running + 0.1·batch,
/// with the unbiased batch variance); otherwise it normalises by `mean` and `var`.
pub fn batch_norm(
    x: Tensor<4>,
    gamma: Tensor<1>,
    beta: Tensor<1>,
    mean: Tensor<1>,
    var: Tensor<1>,
    train: bool,
) -> (Tensor<4>, Option<Running>) {
    let [b, c, h, w] = x.dims();
    let channel = |t: Tensor<1>| t.reshape([1, c, 1, 1]);
    let (centered, spread, running) = if train {
        let batch_mean = x.clone().mean_dims(&[0, 2, 3]);
        let centered = x - batch_mean.clone();
        let batch_var = (centered.clone() * centered.clone()).mean_dims(&[0, 2, 3]);
        let n = (b * h * w) as f64;
        let unbiased = n / (n - 1.0).max(1.0);
        let running = Running {
            mean: mean.inner() * (1.0 - BN_MOMENTUM)
                + batch_mean.inner().reshape([c]) * BN_MOMENTUM,
            var: var.inner() * (1.0 - BN_MOMENTUM)
                + batch_var.clone().inner().reshape([c]) * (unbiased * BN_MOMENTUM),
        };
        (centered, batch_var, Some(running))
    } else {
        (x - channel(mean), channel(var), None)
    };
    let y = centered / (spread + BN_EPS).sqrt() * channel(gamma) + channel(beta);
    (y, running)
}

/// PReLU with one slope `a` for all channels: max(0, x) + a·min(0, x).
fn prelu(x: Tensor<4>, a: Tensor<1>) -> Tensor<4> {
    relu(x.clone()) - relu(x.neg()) * a.reshape([1, 1, 1, 1])
}

impl CnnHicsCode {
    /// The network as [`super::cnn_fused`] runs it.
    pub(super) fn net(&self) -> Net {
        Net {
            input: [1, 28, 28],
            stages: &STAGES,
            dense: vec![HIDDEN, self.classes],
        }
    }

    /// Logits and, in training mode, the new running statistics by parameter index.
    fn run(&self, p: &[Tensor<1>], x: Batch, train: bool) -> (Tensor<2>, Vec<(usize, Tensor<1>)>) {
        let x = dense(x);
        let b = x.dims()[0];
        let mut h = x.reshape([b, 1, 28, 28]);
        let mut at = 0;
        let mut updates = Vec::new();
        for (cin, cout, has_bias, pool) in BLOCKS {
            let weight = p[at].clone().reshape([cout, cin, 3, 3]);
            at += 1;
            let bias = has_bias.then(|| p[at].clone());
            at += usize::from(has_bias);
            let y = conv2d(h, weight, bias, ConvOptions::new([1, 1], [1, 1], [1, 1], 1));
            let y = prelu(y, p[at].clone());
            let (y, running) = batch_norm(
                y,
                p[at + 1].clone(),
                p[at + 2].clone(),
                p[at + 3].clone(),
                p[at + 4].clone(),
                train,
            );
            if let Some(r) = running {
                updates.push((at + 3, r.mean));
                updates.push((at + 4, r.var));
            }
            at += 5;
            h = if pool {
                max_pool2d(y, MaxPoolOptions::new([2, 2]))
            } else {
                y
            };
        }
        let h = h.reshape([b, FEATURES]);
        let h = relu(
            h.matmul(p[at].clone().reshape([FEATURES, HIDDEN]))
                + p[at + 1].clone().unsqueeze::<2>(),
        );
        let logits = h.matmul(p[at + 2].clone().reshape([HIDDEN, self.classes]))
            + p[at + 3].clone().unsqueeze::<2>();
        (logits, updates)
    }
}

impl Architecture for CnnHicsCode {
    fn name(&self) -> &'static str {
        "cnn_hics_code"
    }

    fn params(&self) -> Vec<ParamSpec> {
        let mut p = Vec::new();
        for (i, (cin, cout, has_bias, _)) in BLOCKS.into_iter().enumerate() {
            let name = |what: &str| format!("conv{}.{what}", i + 1);
            let fan_in = cin * 9;
            p.push(ParamSpec::new(
                &name("weight"),
                &[cout, cin, 3, 3],
                Init::xavier(fan_in, cout * 9, GAIN),
            ));
            if has_bias {
                let b = Init::Uniform(1.0 / (fan_in as f32).sqrt());
                p.push(ParamSpec::new(&name("bias"), &[cout], b));
            }
            p.push(ParamSpec::new(&name("prelu"), &[1], Init::Constant(0.25)));
            p.push(ParamSpec::new(
                &name("bn.weight"),
                &[cout],
                Init::Constant(1.0),
            ));
            p.push(ParamSpec::new(
                &name("bn.bias"),
                &[cout],
                Init::Constant(0.0),
            ));
            p.push(ParamSpec::running(&name("bn.running_mean"), cout, 0.0));
            p.push(ParamSpec::running(&name("bn.running_var"), cout, 1.0));
        }
        for (name, fan_in, fan_out) in [("fc1", FEATURES, HIDDEN), ("out", HIDDEN, self.classes)] {
            let [mut weight, bias] = ParamSpec::linear(name, fan_in, fan_out);
            weight.init = Init::xavier(fan_in, fan_out, GAIN);
            p.extend([weight, bias]);
        }
        p
    }

    fn forward(&self, p: &[Tensor<1>], x: Batch, dropout: Option<&mut Dropout<'_>>) -> Tensor<2> {
        self.run(p, x, dropout.is_some()).0
    }

    fn forward_train(
        &self,
        p: &[Tensor<1>],
        x: Batch,
        _: &mut Dropout<'_>,
    ) -> (Tensor<2>, Vec<(usize, Tensor<1>)>) {
        self.run(p, x, true)
    }

    /// The fused pass in training mode is the exact gradient of [`Self::forward_train`]
    /// and returns the running statistics it moves ([`LossGradient`]).
    fn loss_gradient(&self) -> Option<&dyn LossGradient> {
        Some(self)
    }

    fn fused_logits(&self) -> Option<&dyn FusedLogits> {
        Some(self)
    }
}

impl LossGradient for CnnHicsCode {
    /// Eval mode, as [`Architecture::forward`] without dropout: the gradient of the
    /// model as received (the one-step gradients some selectors ask for).
    fn loss_and_gradient(&self, params: &[f32], data: &Dataset, idx: &[usize]) -> (f32, Vec<f32>) {
        let (x, labels) = dense_rows(data, idx);
        self.net()
            .loss_and_gradient(params, &x, &labels, Mode::Eval)
    }

    /// Training mode: batch statistics, and the six running statistics' new values in
    /// their entries of the returned vector.
    fn train_loss_and_gradient(
        &self,
        params: &[f32],
        data: &Dataset,
        idx: &[usize],
        _: &mut Dropout<'_>,
    ) -> (f32, Vec<f32>) {
        let (x, labels) = dense_rows(data, idx);
        self.net()
            .loss_and_gradient(params, &x, &labels, Mode::Train)
    }
}

impl FusedLogits for CnnHicsCode {
    fn logits(&self, params: &[f32], x: &[f32], batch: usize) -> Vec<f32> {
        self.net().logits(params, x, batch)
    }
}

#[cfg(test)]
mod tests {
    use burn::tensor::{Device, TensorData};

    use super::*;
    use crate::model::ParamLayout;

    fn values<const D: usize>(t: Tensor<D>) -> Vec<f32> {
        t.into_data().try_into_vec::<f32>().unwrap()
    }

    fn close(a: &[f32], b: &[f64], tol: f64) {
        assert_eq!(a.len(), b.len());
        for (x, y) in a.iter().zip(b) {
            assert!((f64::from(*x) - y).abs() < tol, "{a:?} vs {b:?}");
        }
    }

    /// One channel, batch of 2, 1×2 pixels: x = (1, 2 | 3, 6), n = 4 values. Batch mean 3,
    /// biased variance (4 + 1 + 0 + 9)/4 = 3.5, unbiased 14/3. From running (0, 1):
    /// mean 0.9·0 + 0.1·3 = 0.3, variance 0.9·1 + 0.1·14/3 = 1.366667 (PyTorch's
    /// formula). Training mode normalises by (3, 3.5); eval mode by the running values.
    #[test]
    fn batch_norm_updates_running_statistics_as_pytorch_and_eval_uses_them() {
        let d = Device::flex();
        let t1 = |v: Vec<f32>| Tensor::<1>::from_data(TensorData::new(v.clone(), [v.len()]), &d);
        let x = Tensor::<4>::from_data(
            TensorData::new(vec![1.0f32, 2.0, 3.0, 6.0], [2, 1, 1, 2]),
            &d,
        );
        let (gamma, beta) = (t1(vec![2.0]), t1(vec![0.5]));
        let (y, running) = batch_norm(
            x.clone(),
            gamma.clone(),
            beta.clone(),
            t1(vec![0.0]),
            t1(vec![1.0]),
            true,
        );
        let r = running.expect("training mode returns running statistics");
        close(&values(r.mean), &[0.3], 1e-6);
        close(&values(r.var), &[0.9 + 0.1 * 14.0 / 3.0], 1e-6);
        let s = (3.5f64 + BN_EPS).sqrt();
        let train: Vec<f64> = [1.0, 2.0, 3.0, 6.0]
            .iter()
            .map(|v| (v - 3.0) / s * 2.0 + 0.5)
            .collect();
        close(&values(y), &train, 1e-5);
        let (y, running) = batch_norm(x, gamma, beta, t1(vec![1.0]), t1(vec![4.0]), false);
        assert!(running.is_none());
        let s = (4.0f64 + BN_EPS).sqrt();
        let eval: Vec<f64> = [1.0, 2.0, 3.0, 6.0]
            .iter()
            .map(|v| (v - 1.0) / s * 2.0 + 0.5)
            .collect();
        close(&values(y), &eval, 1e-5);
    }

    /// The layout of `cnn.py`: 24 tensors, the six running statistics non-trainable and
    /// right after their layer's scale and shift, the output layer last; Xavier bounds on
    /// the weights and the constant starts of PReLU and BatchNorm.
    #[test]
    fn the_code_cnn_has_the_authors_layout_and_init() {
        let arch = CnnHicsCode { classes: 10 };
        let layout = ParamLayout::of(&arch);
        let names: Vec<&str> = layout.specs.iter().map(|s| s.name.as_str()).collect();
        assert_eq!(layout.specs.len(), 24);
        let frozen: Vec<usize> = (0..24).filter(|&i| !layout.specs[i].trainable).collect();
        assert_eq!(frozen, vec![4, 5, 11, 12, 18, 19]);
        assert_eq!(names[4], "conv1.bn.running_mean");
        assert_eq!(names[19], "conv3.bn.running_var");
        assert_eq!(&names[22..], ["out.weight", "out.bias"]);
        assert_eq!(layout.output_weight().len(), 64 * 10);
        let convs = 32 * 9 + (32 * 32 * 9 + 32) + (64 * 32 * 9 + 64);
        let per_channel = 4 * (32 + 32 + 64) + 3;
        assert_eq!(
            layout.total,
            convs + per_channel + (3136 * 64 + 64) + (64 * 10 + 10)
        );
        let flat = layout.init(7);
        let bound = |i: usize| {
            let r = layout.range(i);
            flat[r].iter().fold(0f32, |m, v| m.max(v.abs()))
        };
        // conv2: fan_in = fan_out = 32·9, b = √2·√(6/576); fc1: √2·√(6/3200).
        let b2 = GAIN * (6.0f32 / 576.0).sqrt();
        assert!(bound(6) <= b2 && bound(6) > 0.9 * b2, "{}", bound(6));
        let b_fc = GAIN * (6.0f32 / 3200.0).sqrt();
        assert!(bound(20) <= b_fc && bound(20) > 0.9 * b_fc);
        let constant = |i: usize, v: f32| flat[layout.range(i)].iter().all(|&x| x == v);
        assert!(constant(1, 0.25) && constant(2, 1.0) && constant(3, 0.0));
        assert!(constant(4, 0.0) && constant(5, 1.0));
    }

    /// Training mode returns the six new running statistics (batch statistics, so the
    /// logits do not depend on the running values); eval mode's logits do.
    #[test]
    fn train_mode_updates_the_running_statistics_and_eval_mode_reads_them() {
        use crate::rng::{Purpose, stream};
        let arch = CnnHicsCode { classes: 10 };
        let layout = ParamLayout::of(&arch);
        let d = Device::flex();
        let flat = layout.init(1);
        let mut shifted = flat.clone();
        for i in [4, 11, 18] {
            shifted[layout.range(i)].iter_mut().for_each(|v| *v = 0.5);
        }
        let x: Vec<f32> = (0..2 * 784)
            .map(|i| ((i * 37) % 101) as f32 / 101.0)
            .collect();
        let batch = || {
            Batch::Dense(Tensor::<2>::from_data(
                TensorData::new(x.clone(), [2, 784]),
                &d,
            ))
        };
        let mut rng = stream(1, Purpose::Training, 0, 0);
        let mut drop = Dropout {
            p: 0.0,
            rng: &mut rng,
        };
        let (train_a, updates) =
            arch.forward_train(&layout.to_tensors(&flat, &d), batch(), &mut drop);
        let (train_b, moved) =
            arch.forward_train(&layout.to_tensors(&shifted, &d), batch(), &mut drop);
        assert_eq!(values(train_a), values(train_b));
        let indices: Vec<usize> = updates.iter().map(|u| u.0).collect();
        assert_eq!(indices, vec![4, 5, 11, 12, 18, 19]);
        // Same batch, running means 0 vs 0.5: the new means differ by 0.9 · 0.5.
        for (a, b) in updates.iter().zip(&moved).step_by(2) {
            for (x, y) in values(a.1.clone()).iter().zip(values(b.1.clone())) {
                assert!((y - x - 0.45).abs() < 1e-5, "{x} {y}");
            }
        }
        let eval = |f: &[f32]| values(arch.forward(&layout.to_tensors(f, &d), batch(), None));
        assert_ne!(eval(&flat), eval(&shifted));
    }
}
